//! `talboot plan` and `talboot apply`: the day-two config change of a running rack.
//!
//! `plan` renders every node as `gen` does, reads what each node runs (its `MachineConfig`
//! resource over mTLS with the admin talosconfig, relayed by a control plane when the node is
//! not reachable directly) and prints the per-node diff with the apply mode the node's own
//! dry run says the change needs. Exit 0 no changes, 1 changes, 2 errors.
//!
//! Each node is rendered at the machine-config contract of the config it runs, not the
//! inventory's (a config's contract stays until it is changed, [`crate::daytwo::contract`]);
//! `--contract vX.Y` renders at that contract instead: the migration, rolled out by `apply`
//! like any other change.
//!
//! `apply` carries the plan out through the rolling engine (`daytwo::apply`). Standalone it
//! runs against the state directory's store, which records progress so a second run
//! resumes. While `serve` runs it holds the store (redb locks the file), so apply hands the
//! rollout to serve's admin API instead (`--admin`, see [`crate::daytwo::remote`]): serve
//! runs it with its own store and credentials, one rollout at a time, and the progress comes
//! back here line by line. Two processes never roll one rack.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::crypto::age::IdentitySources;
use crate::daytwo::apply::{ApplyOptions, ApplyOutcome};
use crate::daytwo::contract::{ContractChoice, Renderings, Resolution, Resolved};
use crate::daytwo::plan::{Connector, NodeTarget};
use crate::daytwo::remote::{ApplyRequest, NodeConfig, RemoteOutcome, RolloutKind, RolloutRequest};
use crate::daytwo::rollout::Role;
use crate::machineconfig::rendered::render_all_at;
use crate::machineconfig::schema;
use crate::talos::ClientCreds;
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::retry::RetryPolicy;
use crate::talosfacts::contract::Contract;

use super::EXIT_USAGE;
use super::secrets::{load_bundle, load_inventory};

/// Arguments shared by `plan` and `apply`.
#[derive(Debug, clap::Args)]
pub struct Common {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    /// Admin talosconfig (as `talboot gen -o DIR` writes it to `DIR/talosconfig`).
    #[arg(long, env = "TALOSCONFIG", default_value = "out/talosconfig")]
    pub talosconfig: PathBuf,
    #[command(flatten)]
    pub secrets_identity: super::args::SecretsIdentity,
    /// apid port of the nodes.
    #[arg(long, default_value_t = crate::talos::APID_PORT, hide = true)]
    pub apid_port: u16,
    /// Render every node at this machine-config contract (`v1.13`, `v1.14`) instead of the
    /// one its running config is in: the migration to the new documents. Refused on a node
    /// whose Talos is older than the contract.
    #[arg(long, value_parser = parse_contract_arg)]
    pub contract: Option<Contract>,
}

/// `--contract`'s value parser.
fn parse_contract_arg(s: &str) -> Result<Contract, crate::daytwo::contract::UnknownContract> {
    crate::daytwo::contract::parse_contract(s)
}

/// What `--contract` asks for.
fn choice(c: &Common) -> ContractChoice {
    c.contract
        .map_or(ContractChoice::Running, ContractChoice::At)
}

/// Arguments of `talboot plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub common: Common,
    /// Also print each node's own dry-run text (Talos's diff).
    #[arg(long)]
    pub talos_diff: bool,
}

/// `--mode` of `talboot apply`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    Auto,
    NoReboot,
    Reboot,
    Staged,
    Try,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Auto => Mode::Auto,
            ModeArg::NoReboot => Mode::NoReboot,
            ModeArg::Reboot => Mode::Reboot,
            ModeArg::Staged => Mode::Staged,
            ModeArg::Try => Mode::Try,
        }
    }
}

/// Arguments of `talboot apply`.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub common: Common,
    /// How nodes take the change (`auto`: without a reboot where Talos can, else reboot).
    #[arg(long, value_enum, default_value = "auto")]
    pub mode: ModeArg,
    /// For `--mode try`: Talos rolls the config back after this long unless confirmed
    /// (Talos's default: 1m). Seconds.
    #[arg(long = "try-timeout")]
    pub try_timeout: Option<u64>,
    /// Workers changed at once (control planes always go one at a time).
    #[arg(long = "worker-concurrency", default_value_t = 1)]
    pub worker_concurrency: usize,
    #[command(flatten)]
    pub store: super::args::StoreAccess,
    /// How long a node may take to come back healthy with the new config. Seconds.
    #[arg(long = "gate-timeout", default_value_t = 600)]
    pub gate_timeout: u64,
}

/// Everything the plan needs, or the exit code of why not.
struct Loaded {
    conn: Connector,
    /// Every node, rendered at the inventory's contract until [`resolve`] picks its own.
    targets: Vec<NodeTarget>,
    renderings: Renderings,
    /// The contract of the inventory's `talosVersion`.
    contract: Contract,
    /// The inventory's cluster name (the default etcd key prefix).
    cluster: String,
}

fn usage(m: String) -> ExitCode {
    eprintln!("talboot: {m}");
    ExitCode::from(EXIT_USAGE)
}

/// Every node at every contract talboot renders, each validated against its contract's
/// schema: the inventory's contract must render, another is an error only for a node
/// rendered at it.
fn render_every_contract(
    inv: &crate::inventory::Inventory,
    secrets: &crate::machineconfig::secrets::SecretsBundle,
) -> Result<(Contract, Renderings), ExitCode> {
    let does_not_render = |problems: Vec<String>| {
        format!(
            "the inventory does not render:\n  {}",
            problems.join("\n  ")
        )
    };
    let inventory = crate::machineconfig::render::contract(inv)
        .map_err(|e| usage(does_not_render(vec![e.to_string()])))?;
    let mut renderings = Renderings::default();
    for contract in Contract::ALL {
        let schema = schema::embedded_for(contract);
        let rendered = render_all_at(inv, secrets, &schema, contract);
        let rendered = match rendered {
            Ok(r) => Ok(r.configs),
            Err(problems) if contract == inventory => return Err(usage(does_not_render(problems))),
            Err(problems) => Err(problems.join("; ")),
        };
        renderings.insert(contract, rendered);
    }
    Ok((inventory, renderings))
}

fn load(c: &Common) -> Result<Loaded, ExitCode> {
    let inv = load_inventory(&c.inventory.config)?;
    let sources = IdentitySources::from_process_env(c.secrets_identity.age_identity.clone());
    let secrets = load_bundle(&inv, &sources).map_err(|e| usage(e.to_string()))?;
    let (contract, renderings) = render_every_contract(&inv, &secrets)?;
    let yaml = std::fs::read_to_string(&c.talosconfig).map_err(|e| {
        usage(format!(
            "cannot read talosconfig {}: {e}; write it with `talboot gen -c {} -o out`",
            c.talosconfig.display(),
            c.inventory.config.display()
        ))
    })?;
    let creds = ClientCreds::from_talosconfig(&yaml, Some(inv.cluster.name.as_str()))
        .map_err(|e| usage(format!("{}: {e}", c.talosconfig.display())))?;
    let mut targets = Vec::new();
    for node in &inv.nodes {
        let name = node.name.value.clone();
        let ip = IpAddr::V4(node.address.value.addr());
        let role = if node.role.value == "controlplane" {
            Role::ControlPlane
        } else {
            Role::Worker
        };
        let rendered = renderings
            .get(&name, contract)
            .map_err(|e| usage(e.to_string()))?
            .to_owned();
        targets.push(NodeTarget {
            name,
            role,
            addr: SocketAddr::new(ip, c.apid_port),
            node_ip: ip,
            rendered,
        });
    }
    let relays = targets
        .iter()
        .filter(|t| t.role == Role::ControlPlane)
        .map(|t| t.addr)
        .collect();
    Ok(Loaded {
        conn: Connector {
            creds,
            relays,
            retry: RetryPolicy::default(),
        },
        targets,
        renderings,
        contract,
        cluster: inv.cluster.name.value.clone(),
    })
}

/// Every node with its rendering at the contract `--contract` names, else at the one its
/// running config is in (read from the node).
fn resolve(rt: &tokio::runtime::Runtime, loaded: &Loaded, c: &Common) -> Vec<Resolved> {
    rt.block_on(crate::daytwo::contract::resolve(
        &loaded.conn,
        &loaded.targets,
        &loaded.renderings,
        choice(c),
    ))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Run `talboot plan`.
pub(crate) fn run_plan(args: &PlanArgs) -> ExitCode {
    crate::install_crypto_provider();
    let loaded = match load(&args.common) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let rt = runtime();
    let resolved = resolve(&rt, &loaded, &args.common);
    let plans = rt.block_on(crate::daytwo::contract::plan_resolved(
        &loaded.conn,
        &resolved,
    ));
    print!("{}", crate::daytwo::plan::render(&plans));
    for line in crate::daytwo::contract::summary(&resolved, loaded.contract, choice(&args.common)) {
        println!("{line}");
    }
    if args.talos_diff {
        for p in &plans {
            if let Some(d) = &p.dry_run {
                println!("--- {} (Talos dry run)\n{d}", p.name);
            }
        }
    }
    ExitCode::from(crate::daytwo::plan::exit_code(&plans))
}

/// The targets at their resolved contracts, or (having said why) the exit code: apply
/// changes nothing unless every node's contract is known and allowed.
fn resolved_targets(loaded: &Loaded, c: &Common) -> Result<Vec<NodeTarget>, ExitCode> {
    let resolved = resolve(&runtime(), loaded, c);
    let mut refused = false;
    for r in &resolved {
        let why = match &r.resolution {
            Resolution::At { .. } => continue,
            Resolution::Refused(e) => e.to_string(),
            Resolution::Unread(e) => e.to_string(),
        };
        eprintln!("talboot: node {}: {why}", r.target.name);
        refused = true;
    }
    if refused {
        return Err(usage("nothing was applied".into()));
    }
    for line in crate::daytwo::contract::summary(&resolved, loaded.contract, choice(c)) {
        println!("{line}");
    }
    Ok(resolved.into_iter().map(|r| r.target).collect())
}

/// Run `talboot apply`.
pub(crate) fn run_apply(args: &ApplyArgs) -> ExitCode {
    crate::install_crypto_provider();
    let loaded = match load(&args.common) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if args.worker_concurrency == 0 {
        eprintln!("talboot: --worker-concurrency must be at least 1");
        return ExitCode::from(EXIT_USAGE);
    }
    let targets = match resolved_targets(&loaded, &args.common) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let conn = loaded.conn;
    let opts = ApplyOptions {
        mode: args.mode.into(),
        try_timeout: args.try_timeout.map(Duration::from_secs),
        worker_concurrency: args.worker_concurrency,
        gate_timeout: Duration::from_secs(args.gate_timeout),
        gate_poll: Duration::from_secs(2),
        control_planes: Vec::new(),
    };
    // This command owns the store while it runs: the rollout records' writer is its.
    let store = match super::store_flags::open_to_write(&args.store, &loaded.cluster, "apply") {
        Ok(super::store_flags::Reach::Local(opened)) => opened.writers.rollouts,
        Ok(super::store_flags::Reach::Serve) => {
            return apply_through_serve(args.store.admin, &targets, &opts);
        }
        Err(code) => return code,
    };
    let out = runtime().block_on(crate::daytwo::apply::apply(
        &store,
        &conn,
        &targets,
        &opts,
        |p| println!("{}", crate::daytwo::apply::progress_line(p)),
    ));
    match out {
        Ok(ApplyOutcome::NoChanges) => report(RemoteOutcome::NoChanges),
        Ok(ApplyOutcome::Finished { key, nodes }) => report(RemoteOutcome::Finished { key, nodes }),
        Ok(ApplyOutcome::Stopped { key, node, reason }) => {
            report(RemoteOutcome::Stopped { key, node, reason })
        }
        Err(e) => report(RemoteOutcome::Failed {
            reason: e.to_string(),
        }),
    }
}

/// The request serve runs for this apply: every node's rendering and the options.
pub(crate) fn apply_request(targets: &[NodeTarget], opts: &ApplyOptions) -> RolloutRequest {
    RolloutRequest {
        worker_concurrency: opts.worker_concurrency,
        kind: RolloutKind::Apply(ApplyRequest {
            mode: crate::daytwo::plan::mode_name(opts.mode).to_owned(),
            try_timeout_secs: opts.try_timeout.map(|d| d.as_secs()),
            gate_timeout_secs: opts.gate_timeout.as_secs(),
            gate_poll_ms: u64::try_from(opts.gate_poll.as_millis()).unwrap_or(u64::MAX),
            configs: targets
                .iter()
                .map(|t| NodeConfig {
                    node: t.name.clone(),
                    rendered: t.rendered.clone(),
                })
                .collect(),
        }),
    }
}

/// serve holds the store: hand the apply to it and print its progress as it comes.
fn apply_through_serve(admin: SocketAddr, targets: &[NodeTarget], opts: &ApplyOptions) -> ExitCode {
    println!("talboot serve holds the store; applying through its admin API at {admin}");
    let request = apply_request(targets, opts);
    let base = crate::daytwo::remote::client::base_url(admin);
    match runtime().block_on(super::remote::follow(&base, &request, |l| println!("{l}"))) {
        Ok(outcome) => report(outcome),
        Err(e) => {
            eprintln!("talboot: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// How an apply ended, for the operator, and its exit code.
fn report(outcome: RemoteOutcome) -> ExitCode {
    match outcome {
        RemoteOutcome::NoChanges => {
            println!("no changes: every node runs what the inventory renders");
            ExitCode::SUCCESS
        }
        RemoteOutcome::Finished { key, nodes } => {
            println!(
                "applied to {} node(s): {} ({key})",
                nodes.len(),
                nodes.join(", ")
            );
            ExitCode::SUCCESS
        }
        RemoteOutcome::Stopped { key, node, reason } => {
            let at = node.map_or("before any node (cluster check)".to_owned(), |n| {
                format!("at node {n}")
            });
            eprintln!(
                "talboot: apply stopped {at}: {reason}\n  fix the cause and run the same \
                 `talboot apply` again: it resumes {key} and does not re-apply finished nodes"
            );
            ExitCode::from(1)
        }
        RemoteOutcome::Failed { reason } => {
            eprintln!("talboot: {reason}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

#[cfg(test)]
mod tests {
    /// What keeps a standalone apply from racing a running serve: the store of a state
    /// directory opens once (serve holds it for its lifetime).
    #[test]
    fn a_second_opener_of_the_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _serve = crate::store::open(dir.path()).unwrap();
        assert!(crate::store::open(dir.path()).is_err());
    }
}
