//! `talboot upgrade --talos vX.Y.Z`: a rolling Talos upgrade of every inventory node through
//! [`crate::daytwo::upgrade`] (one control plane at a time, workers with bounded concurrency,
//! stop at the first failure, resumable from the store). The boot sets of the new version are
//! pulled and verified first, so a node that network-boots during or after the upgrade finds
//! them. `--kubernetes vX.Y.Z` runs [`crate::daytwo::upgrade_k8s`] the same way (one step at
//! a time, in talosctl's order, record `upgrade-k8s/<version>` in the store). Both go through
//! a running `serve`'s admin API when serve holds the store.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::artifacts::{self, ArtifactError, Catalog, SetId, factory};
use crate::daytwo::remote::{
    K8sUpgradeRequest, RemoteOutcome, RolloutKind, RolloutRequest, TalosUpgradeRequest,
};
use crate::daytwo::rollout::{Event, Gate, RolloutRecord};
use crate::daytwo::upgrade::{Outcome, Progress, TalosOps, TalosUpgrade, drive, rollout_key};
use crate::inventory::{self, Inventory, Version};
use crate::store::{self, Store};

use super::{EXIT_INVALID, EXIT_USAGE};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The Talos version to upgrade to (default: the inventory's `cluster.talosVersion`, for
    /// when it was bumped there).
    #[arg(long, conflicts_with = "kubernetes")]
    pub talos: Option<String>,
    /// Upgrade Kubernetes to this version instead: talosctl's steps one at a time, each
    /// machine-config patch (no reboot) followed by its gate; resumable (with --dry-run: list
    /// the steps).
    #[arg(long)]
    pub kubernetes: Option<String>,
    /// With --kubernetes: list every step and what is checked after it, and what the
    /// bootstrap manifest sync would create, configure and prune (read from the cluster);
    /// change nothing.
    #[arg(long, requires = "kubernetes")]
    pub dry_run: bool,
    /// With --kubernetes: keep bootstrap manifest objects that Talos no longer renders
    /// (talosctl's `--manifests-no-prune`).
    #[arg(long, alias = "manifests-no-prune", requires = "kubernetes")]
    pub no_prune: bool,
    /// With --kubernetes: do not wait for the bootstrap manifests' Deployments and
    /// DaemonSets to roll out (talosctl's `--manifests-reconcile-timeout 0`).
    #[arg(long, requires = "kubernetes")]
    pub skip_manifest_wait: bool,
    /// Write the new version for the next boot without rebooting now (Talos only).
    #[arg(long, conflicts_with = "kubernetes")]
    pub stage: bool,
    /// Workers upgraded at once (control planes are always one at a time).
    #[arg(long, default_value_t = 1)]
    pub worker_concurrency: usize,
    /// How long a node may take to come back healthy after its upgrade, in seconds.
    #[arg(long, default_value_t = 900)]
    pub node_timeout: u64,
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    #[command(flatten)]
    pub store: super::args::StoreAccess,
    #[command(flatten)]
    pub image_cache: super::args::ImageCache,
    #[arg(long, env = "TALOSCONFIG")]
    pub talosconfig: Option<PathBuf>,
    #[arg(long)]
    pub context: Option<String>,
    /// apid's port on every node.
    #[arg(long, default_value_t = crate::talos::APID_PORT, hide = true)]
    pub apid_port: u16,
    /// With --kubernetes: how often a step's gate looks again, in milliseconds (tests on
    /// the simulated rack shorten it).
    #[arg(long, default_value_t = 2000, hide = true)]
    pub gate_poll_ms: u64,
}

fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("talboot upgrade: {msg}");
    ExitCode::from(code)
}

/// The admin credentials and the async runtime both standalone upgrades run with.
fn creds_and_runtime(
    args: &Args,
) -> Result<(crate::talos::ClientCreds, tokio::runtime::Runtime), ExitCode> {
    try_creds_and_runtime(args).map_err(|e| fail(EXIT_USAGE, e))
}

fn try_creds_and_runtime(
    args: &Args,
) -> Result<(crate::talos::ClientCreds, tokio::runtime::Runtime), String> {
    let creds = super::talosconfig_creds(
        args.talosconfig.as_deref(),
        &args.store.state_dir,
        args.context.as_deref(),
    )
    .map_err(|e| e.to_string())?;
    crate::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    Ok((creds, rt))
}

pub fn run(args: &Args) -> ExitCode {
    let inv = match inventory::load(&args.inventory.config) {
        Ok(l) => l.inventory,
        Err(e) => return fail(EXIT_INVALID, e),
    };
    if let Some(k) = &args.kubernetes {
        return kubernetes(&inv, k, args);
    }
    let version: Version = match &args.talos {
        Some(t) => match t.parse() {
            Ok(v) => v,
            Err(e) => {
                return fail(
                    EXIT_USAGE,
                    format!("--talos {t:?} is not a version like v1.13.9: {e}"),
                );
            }
        },
        None => inv.cluster.talos_version.value.clone(),
    };
    if args.worker_concurrency == 0 {
        return fail(EXIT_USAGE, "--worker-concurrency must be at least 1");
    }
    let store: Option<Arc<dyn Store>> = match store::open(&args.store.state_dir) {
        Ok(s) => Some(Arc::new(s)),
        // serve holds the store: the upgrade goes through its admin API.
        Err(store::StoreError::Locked { .. }) => None,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let Some(store) = store else {
        return upgrade_through_serve(args, &inv, &version);
    };
    let (creds, rt) = match creds_and_runtime(args) {
        Ok(v) => v,
        Err(code) => return code,
    };
    if let Err(e) = rt.block_on(ensure_boot_sets(&inv, &version, &args.image_cache.images)) {
        return fail(
            EXIT_INVALID,
            format!("boot artifacts of {version} are not ready, nothing was upgraded: {e}"),
        );
    }
    let plan = TalosUpgrade::plan(&inv, &version, args.stage, args.apid_port);
    let mut ops = TalosOps::new(
        plan.clone(),
        creds,
        Arc::new(|node, line| println!("  {node}: {line}")),
    );
    ops.wait = std::time::Duration::from_secs(args.node_timeout);
    match rt.block_on(upgrade(
        &plan,
        Arc::new(ops),
        store.as_ref(),
        args.worker_concurrency,
        &|line| println!("{line}"),
    )) {
        Ok(Outcome::Finished) => finished(args, &inv, &version),
        Ok(Outcome::Stopped { node, reason }) => stopped(node, &reason),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

/// `run` while serve holds the store: the boot sets are made ready here (the image cache is
/// not the store), then serve rolls the upgrade with its inventory and credentials and the
/// progress is printed as it comes.
fn upgrade_through_serve(args: &Args, inv: &Inventory, version: &Version) -> ExitCode {
    println!(
        "talboot serve holds the store; upgrading through its admin API at {}",
        args.store.admin
    );
    crate::install_crypto_provider();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_USAGE, format!("cannot start the async runtime: {e}")),
    };
    if let Err(e) = rt.block_on(ensure_boot_sets(inv, version, &args.image_cache.images)) {
        return fail(
            EXIT_INVALID,
            format!("boot artifacts of {version} are not ready, nothing was upgraded: {e}"),
        );
    }
    let request = talos_request(
        version,
        args.stage,
        args.worker_concurrency,
        args.node_timeout,
    );
    let base = super::remote::base_url(args.store.admin);
    match rt.block_on(super::remote::follow(&base, &request, |l| println!("{l}"))) {
        Ok(RemoteOutcome::Finished { .. } | RemoteOutcome::NoChanges) => {
            finished(args, inv, version)
        }
        Ok(RemoteOutcome::Stopped { node, reason, .. }) => stopped(node, &reason),
        Ok(RemoteOutcome::Failed { reason }) => fail(EXIT_USAGE, reason),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

/// The request serve runs for `talboot upgrade --talos`.
pub(crate) fn talos_request(
    version: &Version,
    stage: bool,
    worker_concurrency: usize,
    node_timeout: u64,
) -> RolloutRequest {
    RolloutRequest {
        worker_concurrency,
        kind: RolloutKind::UpgradeTalos(TalosUpgradeRequest {
            version: version.to_string(),
            stage,
            node_timeout_secs: node_timeout,
            gate_poll_ms: 2000,
        }),
    }
}

fn finished(args: &Args, inv: &Inventory, version: &Version) -> ExitCode {
    let verb = if args.stage {
        "staged on"
    } else {
        "running on"
    };
    println!("Talos {version} {verb} every node");
    if *version != inv.cluster.talos_version.value {
        println!(
            "set `talosVersion: {version}` in {} so that network boots serve {version} \
             (serve boots the inventory's version)",
            args.inventory.config.display()
        );
    }
    ExitCode::SUCCESS
}

fn stopped(node: Option<String>, reason: &str) -> ExitCode {
    let at = node.map_or("the pre-flight check".to_owned(), |n| format!("node {n}"));
    fail(
        EXIT_INVALID,
        format!(
            "stopped at {at}: {reason}\nfix it and run the same command again: finished \
             nodes are not upgraded again"
        ),
    )
}

/// Runs (or resumes) the rollout of `plan`, its record in the store, printing progress.
pub(crate) async fn upgrade(
    plan: &TalosUpgrade,
    ops: Arc<dyn crate::daytwo::upgrade::NodeOps>,
    store: &dyn Store,
    worker_concurrency: usize,
    say: &(dyn Fn(String) + Send + Sync),
) -> Result<Outcome, String> {
    let key = rollout_key(&plan.version);
    let stored: Option<RolloutRecord> = match store.rollout(&key).map_err(|e| e.to_string())? {
        Some(bytes) => Some(
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("stored rollout {key} is unreadable: {e}"))?,
        ),
        None => None,
    };
    if stored.is_some() {
        say(format!("resuming {key} from the store"));
    }
    let rollout = plan
        .rollout(stored, worker_concurrency)
        .map_err(|e| e.to_string())?;
    drive(
        rollout,
        ops,
        |r| {
            let json = serde_json::to_vec(r).map_err(|e| e.to_string())?;
            store.put_rollout(&key, &json).map_err(|e| e.to_string())
        },
        |p| say(progress_line(&plan.version, p)),
    )
    .await
    .map_err(String::from)
}

/// One progress line of a Talos upgrade, for the operator.
pub(crate) fn progress_line(version: &Version, p: &Progress) -> String {
    match p {
        Progress::Checking(Gate::Cluster) => "checking the cluster before upgrading".into(),
        Progress::Checking(Gate::Node(n)) => {
            format!("{n}: waiting until it is back on {version} and healthy")
        }
        Progress::Changing(n) => format!("{n}: upgrading to {version}"),
        Progress::Reconciling(n) => {
            format!("{n}: an earlier run started its upgrade; checking whether it took effect")
        }
        Progress::Observed(Event::Healthy(Gate::Node(n))) => format!("{n}: done"),
        Progress::Observed(Event::Healthy(Gate::Cluster)) => "cluster healthy".into(),
        Progress::Observed(Event::Changed { node }) => {
            format!("{node}: installed; rebooting into it")
        }
        Progress::Observed(Event::NotChanged { node }) => {
            format!("{node}: not upgraded yet; upgrading now")
        }
        Progress::Observed(Event::ChangeFailed { node, reason }) => {
            format!("{node}: FAILED: {reason}")
        }
        Progress::Observed(Event::Unhealthy { gate, reason }) => match gate {
            Gate::Node(n) => format!("{n}: FAILED: {reason}"),
            Gate::Cluster => format!("cluster not healthy: {reason}"),
        },
    }
}

/// Every boot set of `version` the inventory's nodes need: verified, or pulled from the
/// inventory's Image Factory and then verified.
async fn ensure_boot_sets(
    inv: &Inventory,
    version: &Version,
    dir: &std::path::Path,
) -> Result<(), ArtifactError> {
    let schematic = inv.cluster.installer.schematic_id();
    let mut arches: Vec<_> = inv.nodes.iter().map(|n| inv.arch_of(n)).collect();
    arches.sort();
    arches.dedup();
    let mut catalog = Catalog::load(dir)?;
    for arch in arches {
        let id = SetId::new(version, schematic, arch);
        match artifacts::verify(dir, &catalog, &id) {
            Ok(()) => continue,
            Err(ArtifactError::Missing { .. }) => {}
            Err(e) => return Err(e),
        }
        println!(
            "pulling {id} from {}",
            inv.cluster.installer.factory_url.as_str()
        );
        let req = factory::PullRequest {
            base_url: inv.cluster.installer.factory_url.clone(),
            id: id.clone(),
            dir: dir.to_path_buf(),
            progress: false,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // `pull` records the set in the catalog file itself.
        factory::pull(&factory::client()?, &req, now).await?;
        catalog = Catalog::load(dir)?;
        artifacts::verify(dir, &catalog, &id)?;
    }
    Ok(())
}

/// `--kubernetes`: the steps in talosctl's order ([`crate::daytwo::upgrade_k8s`]); with
/// `--dry-run` only listed, else carried out one at a time, health-gated and resumable.
fn kubernetes(inv: &Inventory, to: &str, args: &Args) -> ExitCode {
    use crate::daytwo::upgrade_k8s::{self, K8sUpgrade};
    let to: Version = match to.parse() {
        Ok(v) => v,
        Err(e) => {
            return fail(
                EXIT_USAGE,
                format!("--kubernetes {to:?} is not a version like 1.36.3: {e}"),
            );
        }
    };
    if args.dry_run {
        let steps = upgrade_k8s::plan(inv);
        if let Err(e) = upgrade_k8s::path_supported(&inv.cluster.kubernetes_version.value, &to) {
            return fail(EXIT_USAGE, e);
        }
        println!(
            "Kubernetes {} -> {to}, {} steps (talosctl's order; nothing is changed):",
            inv.cluster.kubernetes_version.value,
            steps.len()
        );
        for (i, step) in steps.iter().enumerate() {
            println!("{:>3}. {}", i + 1, step.describe(&to));
        }
        // The manifest sync's changes come from the cluster: what the first control plane
        // renders now against what the API server has (before the patches above, so the
        // images it lists are the current ones).
        let opts = k8s_options(args);
        let listed = try_creds_and_runtime(args).and_then(|(creds, rt)| {
            rt.block_on(upgrade_k8s::manifests_dry_run(inv, &to, creds, &opts))
                .map_err(|e| e.to_string())
        });
        match listed {
            Ok(lines) => {
                println!("bootstrap manifests (dry run, as of now):");
                for l in lines {
                    println!("  < {l}");
                }
            }
            Err(e) => {
                return fail(
                    EXIT_USAGE,
                    format!("cannot list the bootstrap manifest changes: {e}"),
                );
            }
        }
        return ExitCode::SUCCESS;
    }
    let plan = match K8sUpgrade::plan(inv, &to, args.apid_port) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let store: Arc<dyn Store> = match store::open(&args.store.state_dir) {
        Ok(s) => Arc::new(s),
        // serve holds the store: the upgrade goes through its admin API.
        Err(store::StoreError::Locked { .. }) => return kubernetes_through_serve(args, &to),
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let (creds, rt) = match creds_and_runtime(args) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let opts = k8s_options(args);
    if matches!(store.rollout(&upgrade_k8s::rollout_key(&to)), Ok(Some(_))) {
        println!("resuming {} from the store", upgrade_k8s::rollout_key(&to));
    }
    let outcome = rt
        .block_on(upgrade_k8s::upgrade(
            inv,
            &to,
            creds,
            store.as_ref(),
            &opts,
            |p| println!("{}", upgrade_k8s::progress_line(&plan, p)),
        ))
        .map_err(|e| e.to_string());
    match outcome {
        Ok(Outcome::Finished) => k8s_finished(args, &to),
        Ok(Outcome::Stopped { node, reason }) => k8s_stopped(node, &reason),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

fn k8s_options(args: &Args) -> crate::daytwo::upgrade_k8s::K8sOptions {
    crate::daytwo::upgrade_k8s::K8sOptions {
        apid_port: args.apid_port,
        pod_wait: k8s_pod_wait(args),
        node_wait: k8s_node_wait(args),
        poll: std::time::Duration::from_millis(args.gate_poll_ms.max(10)),
        no_prune: args.no_prune,
        // talosctl's 5 minutes (`--manifests-reconcile-timeout`), shorter with --node-timeout.
        manifest_wait: (!args.skip_manifest_wait).then(|| k8s_pod_wait(args)),
    }
}

/// talosctl's waits (5 min for a static pod, 3 for a kubelet), shorter with `--node-timeout`.
fn k8s_pod_wait(args: &Args) -> std::time::Duration {
    std::time::Duration::from_secs(args.node_timeout.min(300))
}

fn k8s_node_wait(args: &Args) -> std::time::Duration {
    std::time::Duration::from_secs(args.node_timeout.min(180))
}

/// `kubernetes` while serve holds the store: serve plans the upgrade against its inventory
/// and runs it with its credentials and store; the progress is printed as it comes.
fn kubernetes_through_serve(args: &Args, to: &Version) -> ExitCode {
    println!(
        "talboot serve holds the store; upgrading Kubernetes through its admin API at {}",
        args.store.admin
    );
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_USAGE, format!("cannot start the async runtime: {e}")),
    };
    let request = k8s_request(to, args);
    let base = super::remote::base_url(args.store.admin);
    match rt.block_on(super::remote::follow(&base, &request, |l| println!("{l}"))) {
        Ok(RemoteOutcome::Finished { .. } | RemoteOutcome::NoChanges) => k8s_finished(args, to),
        Ok(RemoteOutcome::Stopped { node, reason, .. }) => k8s_stopped(node, &reason),
        Ok(RemoteOutcome::Failed { reason }) => fail(EXIT_USAGE, reason),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

/// The request serve runs for `talboot upgrade --kubernetes`.
pub(crate) fn k8s_request(to: &Version, args: &Args) -> RolloutRequest {
    RolloutRequest {
        worker_concurrency: args.worker_concurrency.max(1),
        kind: RolloutKind::UpgradeKubernetes(K8sUpgradeRequest {
            version: to.to_string(),
            pod_wait_secs: k8s_pod_wait(args).as_secs(),
            node_wait_secs: k8s_node_wait(args).as_secs(),
            gate_poll_ms: args.gate_poll_ms,
            no_prune: args.no_prune,
            skip_manifest_wait: args.skip_manifest_wait,
        }),
    }
}

fn k8s_finished(args: &Args, to: &Version) -> ExitCode {
    println!("Kubernetes {to} on every node");
    println!(
        "set `kubernetesVersion: {}` in {} so that configs rendered from now on \
         carry it",
        to.0,
        args.inventory.config.display()
    );
    ExitCode::SUCCESS
}

fn k8s_stopped(node: Option<String>, reason: &str) -> ExitCode {
    let at = node.map_or("the pre-flight check".to_owned(), |n| format!("step {n}"));
    fail(
        EXIT_INVALID,
        format!(
            "stopped at {at}: {reason}\nfix it and run the same command again: finished \
             steps are not applied again"
        ),
    )
}
