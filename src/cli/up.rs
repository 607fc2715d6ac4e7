//! `talboot up -c FILE`: the whole first run in one command. In order: the secrets bundle
//! (created if there is none, saying where and for which age recipients), the boot images
//! (pulled from the Image Factory if missing, with progress bars on a terminal), the rendered
//! configs and admin talosconfig (written if missing or different), then `serve` with push
//! provisioning until the cluster is handed off, printing talboot's events per node and per
//! cluster step as `demo` does. Exits 0 at hand-off, or keeps serving with `--stay`. With
//! `--power-on`, serve's power-on round runs once serving, as it does for `serve`.
//!
//! Idempotent and resumable: every step first looks at what is already there and says in one
//! line when it skips; provisioning resumes from the store (node phases and cluster steps are
//! persisted before the calls they lead to), so an interrupted `up` is finished by running it
//! again. Each step's decision is a pure function of the facts read for it, in
//! [`crate::provision::up`] ([`secrets_step`], [`images_step`], [`configs_step`],
//! [`provision_step`]); this module owns the order, the writes and pulls, and the output.
//!
//! The serving step is `serve`'s own ([`super::serve::prepare`]); [`Hooks`] let the simulated
//! rack move its sockets onto loopback and power the machines on once talboot listens, as
//! `demo` does, so the tests run this code path against simulated machines.

use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::serve::{self, StartError};
use super::{EXIT_INVALID, EXIT_USAGE};
use crate::appliance::{Plan, Running};
use crate::artifacts::{self, SetId, factory};
use crate::crypto::age::IdentitySources;
use crate::inventory::{self, Inventory};
use crate::machineconfig::output::{differing, write_all, write_node_configs};
use crate::machineconfig::secrets::GenerateOptions;
pub use crate::provision::up::{Decision, Step, StepLine};
use crate::provision::up::{
    HandOffWait, cached_sets, cluster_state, configs_step, handed_off, images_step, provision_step,
    recipient_list, secrets_step, wait_for_hand_off, where_it_is,
};
use crate::store::{self, NodePhase};

/// Arguments of `talboot up`: `serve`'s, and what the steps before it need.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "up_args")]
pub struct Args {
    /// Everything `serve` takes.
    #[command(flatten)]
    pub serve: serve::Args,
    /// Keep serving after the hand-off (until Ctrl-C or SIGTERM), as `serve` does.
    #[arg(long)]
    pub stay: bool,
    /// Give up if the cluster is not handed off within this many seconds (0: no limit).
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub timeout: u64,
    /// Image Factory base URL to pull missing boot images from (default: the inventory's
    /// cluster.installer.factoryUrl; a mirror for air-gapped sites).
    #[arg(long, conflicts_with = "images_from")]
    pub factory: Option<String>,
    /// Import missing boot images from this folder instead of pulling them (an air-gapped
    /// site's USB stick): for each architecture the factory's file names, `kernel-<arch>`,
    /// `initramfs-<arch>` with any extension and compression, `cmdline-metal-<arch>`.
    #[arg(long, value_name = "DIR")]
    pub images_from: Option<PathBuf>,
    /// Print only the step lines and the summary, not talboot's events as they happen.
    #[arg(short, long)]
    pub quiet: bool,
}

/// How `up` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every step was already done (and `--stay` was not given).
    AlreadyDone,
    /// This run took the cluster to hand-off.
    HandedOff,
    /// Stopped (signal) after the hand-off, with `--stay`.
    Stayed,
    /// Stopped (signal) before the hand-off; running `up` again resumes.
    Interrupted,
}

/// What `up` did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The step lines, in order.
    pub lines: Vec<StepLine>,
    /// How it ended.
    pub outcome: Outcome,
}

/// Why `up` stopped short.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpError {
    /// The inventory does not load.
    #[error("{0}; run `talboot check -c {1}` for every problem")]
    Inventory(inventory::LoadError, PathBuf),
    /// The secrets bundle cannot be created.
    #[error("secrets: {0}")]
    SecretsInit(String),
    /// The secrets bundle cannot be read.
    #[error("secrets: {0}")]
    SecretsLoad(String),
    /// The artifact cache cannot be read or a pull failed.
    #[error(
        "images: {0}; at a site without internet, carry the files over and register them with \
         `talboot images import`, then run `talboot up` again"
    )]
    Images(artifacts::ArtifactError),
    /// A boot set cannot be imported from `--images-from`.
    #[error("images: {0}")]
    Import(String),
    /// The configs do not render or validate.
    #[error("configs: {} problem(s):\n{}", .0.len(), .0.join("\n"))]
    Render(Vec<String>),
    /// The configs cannot be written.
    #[error("configs: {0}")]
    Write(String),
    /// The state store cannot be read (or `serve` holds it).
    #[error("state store: {0}")]
    Store(store::StoreError),
    /// `serve` could not start.
    #[error("serve: {0}")]
    Serve(StartError),
    /// Not handed off in time.
    #[error("not handed off within {after:?}: {state}; run `talboot up` again to resume")]
    Timeout {
        /// The limit.
        after: Duration,
        /// Where it was.
        state: String,
    },
}

impl UpError {
    fn exit_code(&self) -> ExitCode {
        match self {
            UpError::Serve(e) => e.exit_code(),
            UpError::Store(_) | UpError::Write(_) => ExitCode::from(EXIT_USAGE),
            UpError::Inventory(inventory::LoadError::Io { .. }, _) => ExitCode::from(EXIT_USAGE),
            _ => ExitCode::from(EXIT_INVALID),
        }
    }
}

/// talboot's bound addresses, given to [`Hooks::started`] (the CLI has no use for them; the
/// simulated rack wires its machines to them).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Started {
    /// The DHCP socket.
    pub dhcp: Option<SocketAddr>,
    /// The TFTP socket.
    pub tftp: Option<SocketAddr>,
    /// The admin API.
    pub admin: Option<SocketAddr>,
}

/// Where the serving step can be adapted: the CLI leaves the plan as `serve` makes it and
/// stops on a signal; the simulated rack moves sockets onto loopback and powers machines on.
pub(crate) struct Hooks {
    /// Adjusts the plan before it binds.
    pub adjust: Box<dyn FnOnce(&mut Plan) + Send>,
    /// Runs once talboot is serving.
    pub started: Box<dyn FnOnce(Started) + Send>,
    /// Cancelled to stop (the CLI: SIGINT or SIGTERM).
    pub stop: CancellationToken,
    /// The secrets bundle's key choices (the tests' bundle takes an ECDSA service-account
    /// key: milliseconds instead of an RSA-4096 search).
    pub generate: GenerateOptions,
}

/// Prints and records the step lines.
struct Say {
    lines: Vec<StepLine>,
}

impl Say {
    fn line(&mut self, step: Step, decision: &Decision) -> bool {
        let (skipped, text) = match decision {
            Decision::Run(t) => (false, t.clone()),
            Decision::Skip(t) => (true, t.clone()),
        };
        self.done(step, skipped, text);
        !skipped
    }

    fn done(&mut self, step: Step, skipped: bool, text: String) {
        let line = StepLine {
            step,
            skipped,
            text,
        };
        println!("{line}");
        let _ = std::io::stdout().flush();
        self.lines.push(line);
    }
}

/// Runs `up`: every step in order, then serving to hand-off (see the module docs).
pub(crate) async fn up(args: &Args, hooks: Hooks) -> Result<Report, UpError> {
    crate::install_crypto_provider();
    let sa = &args.serve;
    let inv = inventory::load(&sa.inventory.config)
        .map_err(|e| UpError::Inventory(e, sa.inventory.config.clone()))?
        .inventory;
    let mut say = Say { lines: Vec::new() };

    // 1. Secrets.
    let secrets_path = inv.cluster.secrets.file.clone();
    let recipients = &inv.cluster.secrets.age_recipients;
    let decision = secrets_step(&secrets_path, secrets_path.exists(), recipients);
    let new_bundle = say.line(Step::Secrets, &decision);
    if new_bundle {
        super::secrets::init_bundle_with(
            &secrets_path,
            recipients,
            OffsetDateTime::now_utc(),
            &hooks.generate,
        )
        .map_err(|e| UpError::SecretsInit(e.to_string()))?;
        say.done(
            Step::Secrets,
            false,
            format!(
                "wrote {}; only the holders of the age identities for {} can read it: keep one \
                 of them safe, and pass it with --age-identity (or SOPS_AGE_KEY_FILE)",
                secrets_path.display(),
                recipient_list(recipients)
            ),
        );
    }

    // 2. Images.
    images(args, &inv, &mut say).await?;

    // 3. Configs.
    configs(args, &inv, &mut say, new_bundle)?;

    // 4. Serve and provision.
    let (record, ready) = {
        // Closed again before `serve` opens it.
        let spec = sa
            .backend
            .spec(&sa.state_dir, Some(inv.cluster.name.as_str()))
            .map_err(|e| UpError::Serve(e.into()))?;
        let opened = spec.open().map_err(UpError::Store)?;
        cluster_state(&inv, opened.store.as_ref()).map_err(UpError::Store)?
    };
    let decision = provision_step(record.as_ref(), ready, inv.nodes.len(), args.stay);
    if !say.line(Step::Provision, &decision) {
        println!("every step is already done");
        return Ok(Report {
            lines: say.lines,
            outcome: Outcome::AlreadyDone,
        });
    }
    let outcome = provision(args, &inv, hooks).await?;
    Ok(Report {
        lines: say.lines,
        outcome,
    })
}

/// The images step: verify what the cache has, pull what it lacks.
async fn images(args: &Args, inv: &Inventory, say: &mut Say) -> Result<(), UpError> {
    let dir = &args.serve.image_cache.images;
    let (present, missing) = cached_sets(dir, inv).map_err(UpError::Images)?;
    let factory_url = args
        .factory
        .clone()
        .unwrap_or_else(|| inv.cluster.installer.factory_url.clone());
    let source = match &args.images_from {
        Some(d) => d.display().to_string(),
        None => factory_url.clone(),
    };
    let missing_ids: Vec<_> = missing.iter().map(|m| m.id.clone()).collect();
    if !say.line(
        Step::Images,
        &images_step(dir, &present, &missing_ids, &source),
    ) {
        return Ok(());
    }
    let now = crate::events::Clock::now_unix(&crate::events::SystemClock);
    if let Some(from) = &args.images_from {
        // An import folder holds the PXE files of a set (`images import --iso` is the way to a
        // Secure Boot UKI without the factory).
        for id in missing_ids {
            let entry = import_set(dir, from, &id, now)?;
            let bytes: u64 = entry.files.values().map(|f| f.size).sum();
            say.done(
                Step::Images,
                false,
                format!("imported {id} from {} ({bytes} bytes)", from.display()),
            );
        }
        return Ok(());
    }
    let client = factory::client().map_err(UpError::Images)?;
    let progress = std::io::stderr().is_terminal() && !args.quiet;
    for need in missing {
        let id = need.id;
        let req = factory::PullRequest {
            base_url: factory_url.clone(),
            id: id.clone(),
            dir: dir.clone(),
            progress,
        };
        let boots: Vec<_> = need.boots.into_iter().collect();
        let entry = factory::pull_boots(&client, &req, &boots, now)
            .await
            .map_err(UpError::Images)?;
        let bytes: u64 = entry.files.values().map(|f| f.size).sum();
        say.done(
            Step::Images,
            false,
            format!("pulled {id} ({bytes} bytes, digests recorded in the catalog)"),
        );
    }
    Ok(())
}

/// Imports set `id` from the factory-named files in `from` (see [`Args::images_from`]).
fn import_set(dir: &Path, from: &Path, id: &SetId, now: u64) -> Result<artifacts::Entry, UpError> {
    let arch = &id.arch;
    let missing = |name: String| {
        UpError::Import(format!(
            "{} has no {name} for {id}; copy the Image Factory's files for it there (or \
             leave --images-from out to pull them)",
            from.display()
        ))
    };
    let file = |name: String| {
        let p = from.join(&name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(missing(name))
        }
    };
    let kernel = file(format!("kernel-{arch}"))?;
    let cmdline = file(format!("cmdline-metal-{arch}"))?;
    // Any extension: the factory's is `.xz`, a hand-built one may be gzip.
    let prefix = format!("initramfs-{arch}");
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(from)
        .map_err(|e| UpError::Import(format!("cannot read {}: {e}", from.display())))?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == prefix || name.starts_with(&format!("{prefix}."))
        })
        .map(|e| e.path())
        .collect();
    candidates.sort();
    let initramfs = match candidates.as_slice() {
        [one] => one.clone(),
        [] => return Err(missing(format!("{prefix}[.xz|.gz|...]"))),
        many => {
            return Err(UpError::Import(format!(
                "{} has several initramfs files for {id} ({}); keep one",
                from.display(),
                many.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    };
    let req = artifacts::import::ImportRequest {
        id: id.clone(),
        kernel,
        initramfs,
        cmdline: artifacts::import::CmdlineSource::File(cmdline),
        force: false,
        iso: None,
    };
    artifacts::import::import(dir, &req, now)
        .map(|(entry, _)| entry)
        .map_err(|e| UpError::Import(e.to_string()))
}

/// The configs step: render and validate every node, write what is missing or different,
/// and the admin client configs when there is no talosconfig or the bundle is new (an old
/// talosconfig's client certificate would not be trusted by the new cluster CA).
fn configs(args: &Args, inv: &Inventory, say: &mut Say, new_bundle: bool) -> Result<(), UpError> {
    let sa = &args.serve;
    let schema = crate::machineconfig::schema::load_for_inventory(sa.schema.as_deref(), inv)
        .map_err(|e| UpError::Write(e.to_string()))?;
    let sources = IdentitySources::from_process_env(sa.secrets_identity.age_identity.clone());
    let bundle = super::secrets::load_bundle(inv, &sources)
        .map_err(|e| UpError::SecretsLoad(e.to_string()))?;
    let rendered = crate::machineconfig::rendered::render_all(inv, &bundle, &schema)
        .map_err(UpError::Render)?;
    for w in &rendered.warnings {
        eprintln!("{w}");
    }
    let dir = &sa.configs;
    let stale = differing(dir, &rendered.configs);
    let talosconfig = sa
        .talosconfig
        .clone()
        .unwrap_or_else(|| dir.join("talosconfig"));
    let talosconfig_missing = new_bundle || !talosconfig.exists();
    let names: Vec<String> = stale.iter().map(|(n, _)| n.clone()).collect();
    let decision = configs_step(
        dir,
        &names,
        rendered.configs.len(),
        &talosconfig,
        talosconfig_missing,
    );
    if !say.line(Step::Configs, &decision) {
        return Ok(());
    }
    let stale: Vec<(String, String)> = stale.into_iter().cloned().collect();
    let now = OffsetDateTime::now_utc();
    if talosconfig_missing {
        write_all(dir, inv, &bundle, &stale, now)
    } else {
        write_node_configs(dir, &stale)
    }
    .map_err(|e| UpError::Write(e.to_string()))?;
    Ok(())
}

/// The serving step: `serve`'s plan, bound and started, watched until hand-off.
async fn provision(args: &Args, inv: &Inventory, hooks: Hooks) -> Result<Outcome, UpError> {
    let started_at = Instant::now();
    let Hooks {
        adjust,
        started,
        stop,
        ..
    } = hooks;
    let (running, addrs) = start_serving(&args.serve, adjust).await?;
    let printer = (!args.quiet).then(|| print_events(&running, started_at));
    println!(
        "talboot serving {} nodes; boot script {}/boot.ipxe, admin API {}",
        running.node_count, running.base_url, running.admin_url
    );
    started(addrs);
    let result = serve_until_done(args, inv, &running, &stop, started_at).await;
    running.cancel.cancel();
    if let Err(e) = running.wait().await {
        tracing::warn!(error = %e, "a server ended with an error");
    }
    if let Some(p) = printer {
        let _ = p.await;
    }
    result
}

/// `serve`'s plan (its `--power-on` round included), adapted by the hooks, bound and
/// started, with privileges dropped in between as `serve` drops them.
async fn start_serving(
    sa: &serve::Args,
    adjust: Box<dyn FnOnce(&mut Plan) + Send>,
) -> Result<(Running, Started), UpError> {
    let mut plan = serve::prepare(sa).map_err(UpError::Serve)?;
    adjust(&mut plan);
    let bound = plan
        .bind()
        .await
        .map_err(|e| UpError::Serve(StartError::from(e)))?;
    if let Some(user) = &sa.user {
        serve::drop_privileges(user).map_err(UpError::Serve)?;
    }
    let addrs = Started {
        dhcp: bound.dhcp_addr(),
        tftp: bound.tftp_addr(),
        admin: bound.admin_addr(),
    };
    let running = bound
        .start()
        .map_err(|e| UpError::Serve(StartError::from(e)))?;
    Ok((running, addrs))
}

/// Prints talboot's events as they happen (unless `--quiet`), as `demo` does, until serve
/// stops.
fn print_events(running: &Running, started_at: Instant) -> tokio::task::JoinHandle<()> {
    let mut rx = running.events.subscribe();
    let stop = running.cancel.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                ev = rx.recv() => match ev {
                    Ok(ev) => crate::events::print_event(started_at, &ev),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => break,
                }
            }
        }
    })
}

/// Serves until the run is over: the hand-off (then, with `--stay`, a stop), a stop before
/// it, or `--timeout`; how it ended, the lines for the operator printed.
async fn serve_until_done(
    args: &Args,
    inv: &Inventory,
    running: &Running,
    stop: &CancellationToken,
    started_at: Instant,
) -> Result<Outcome, UpError> {
    let store = running.store.as_ref();
    if !handed_off(store) {
        let deadline = (args.timeout > 0).then(|| started_at + Duration::from_secs(args.timeout));
        match wait_for_hand_off(store, deadline, stop).await {
            HandOffWait::HandedOff => {}
            HandOffWait::TimedOut => {
                return Err(UpError::Timeout {
                    after: Duration::from_secs(args.timeout),
                    state: where_it_is(inv, store),
                });
            }
            HandOffWait::Stopped => {
                println!(
                    "\nstopped before hand-off: {}; run `talboot up` again to resume",
                    where_it_is(inv, store)
                );
                return Ok(Outcome::Interrupted);
            }
        }
        let ready = store
            .nodes()
            .unwrap_or_default()
            .iter()
            .filter(|r| r.phase == NodePhase::Ready)
            .count();
        println!(
            "\nhanded off after {:.1}s: {ready} of {} nodes Ready; admin kubeconfig in {}",
            started_at.elapsed().as_secs_f64(),
            inv.nodes.len(),
            args.serve.state_dir.display()
        );
    }
    if args.stay {
        println!(
            "serving until stopped (Ctrl-C); admin API {}",
            running.admin_url
        );
        stop.cancelled().await;
        return Ok(Outcome::Stayed);
    }
    Ok(Outcome::HandedOff)
}
/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talboot up: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    rt.block_on(async {
        let stop = CancellationToken::new();
        {
            let stop = stop.clone();
            tokio::spawn(async move {
                serve::wait_for_signal().await;
                stop.cancel();
            });
        }
        let hooks = Hooks {
            adjust: Box::new(|_| {}),
            started: Box::new(|_| {}),
            stop,
            generate: GenerateOptions::default(),
        };
        match up(args, hooks).await {
            Ok(report) => match report.outcome {
                Outcome::Interrupted => ExitCode::from(EXIT_INVALID),
                _ => ExitCode::SUCCESS,
            },
            Err(e) => {
                eprintln!("talboot up: {e}");
                e.exit_code()
            }
        }
    })
}

#[cfg(test)]
#[path = "up_tests.rs"]
mod tests;
