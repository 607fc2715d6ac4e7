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

use crate::daytwo::remote::RemoteOutcome;
use crate::daytwo::run::Outcome;
use crate::daytwo::upgrade::{TalosOps, TalosUpgrade};
use crate::daytwo::upgrade_run::{K8sUpgradeSettings, ensure_boot_sets, talos_request, upgrade};
use crate::inventory::{self, Inventory, Version};
use crate::store;

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

/// Why a standalone upgrade could not get going.
#[derive(Debug, thiserror::Error)]
enum SetupError {
    /// The admin talosconfig did not load.
    #[error("{0}")]
    Talosconfig(#[from] super::TalosconfigError),
    /// No async runtime.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

fn try_creds_and_runtime(
    args: &Args,
) -> Result<(crate::talos::ClientCreds, tokio::runtime::Runtime), SetupError> {
    let creds = super::talosconfig_creds(
        args.talosconfig.as_deref(),
        &args.store.state_dir,
        args.context.as_deref(),
    )?;
    crate::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(SetupError::Runtime)?;
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
    // This command owns the store while it runs: the rollout records' writer is its.
    let reach =
        super::store_flags::open_to_write(&args.store, inv.cluster.name.as_str(), "upgrade");
    let store: Option<store::RolloutWriter> = match reach {
        Ok(super::store_flags::Reach::Local(opened)) => Some(opened.writers.rollouts),
        // serve holds the store: the upgrade goes through its admin API.
        Ok(super::store_flags::Reach::Serve) => None,
        Err(code) => return code,
    };
    let Some(store) = store else {
        return upgrade_through_serve(args, &inv, &version);
    };
    let (creds, rt) = match creds_and_runtime(args) {
        Ok(v) => v,
        Err(code) => return code,
    };
    if let Err(e) = rt.block_on(ensure_boot_sets(
        &inv,
        &version,
        &args.image_cache.images,
        |l| println!("{l}"),
    )) {
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
        &store,
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
    if let Err(e) = rt.block_on(ensure_boot_sets(
        inv,
        version,
        &args.image_cache.images,
        |l| println!("{l}"),
    )) {
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
    let base = crate::daytwo::remote::client::base_url(args.store.admin);
    match rt.block_on(super::remote::follow(&base, &request, |l| println!("{l}"))) {
        Ok(RemoteOutcome::Finished { .. } | RemoteOutcome::NoChanges) => {
            finished(args, inv, version)
        }
        Ok(RemoteOutcome::Stopped { node, reason, .. }) => stopped(node, &reason),
        Ok(RemoteOutcome::Failed { reason }) => fail(EXIT_USAGE, reason),
        Err(e) => fail(EXIT_USAGE, e),
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
        return kubernetes_dry_run(inv, &to, args);
    }
    let plan = match K8sUpgrade::plan(inv, &to, args.apid_port) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let reach =
        super::store_flags::open_to_write(&args.store, inv.cluster.name.as_str(), "upgrade");
    let store = match reach {
        Ok(super::store_flags::Reach::Local(opened)) => opened.writers.rollouts,
        // serve holds the store: the upgrade goes through its admin API.
        Ok(super::store_flags::Reach::Serve) => return kubernetes_through_serve(args, &to),
        Err(code) => return code,
    };
    let (creds, rt) = match creds_and_runtime(args) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let opts = k8s_settings(args).options();
    if matches!(store.rollout(&upgrade_k8s::rollout_key(&to)), Ok(Some(_))) {
        println!("resuming {} from the store", upgrade_k8s::rollout_key(&to));
    }
    let outcome = rt
        .block_on(upgrade_k8s::upgrade(inv, &to, creds, &store, &opts, |p| {
            println!("{}", upgrade_k8s::progress_line(&plan, p))
        }))
        .map_err(|e| e.to_string());
    match outcome {
        Ok(Outcome::Finished) => k8s_finished(args, &to),
        Ok(Outcome::Stopped { node, reason }) => k8s_stopped(node, &reason),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

/// `--kubernetes V --dry-run`: the steps in order, and what the bootstrap manifest sync
/// would change now (read from the cluster), nothing changed.
fn kubernetes_dry_run(inv: &Inventory, to: &Version, args: &Args) -> ExitCode {
    use crate::daytwo::upgrade_k8s;
    let steps = upgrade_k8s::plan(inv);
    if let Err(e) =
        crate::daytwo::k8s_version::path_supported(&inv.cluster.kubernetes_version.value, to)
    {
        return fail(EXIT_USAGE, e);
    }
    println!(
        "Kubernetes {} -> {to}, {} steps (talosctl's order; nothing is changed):",
        inv.cluster.kubernetes_version.value,
        steps.len()
    );
    for (i, step) in steps.iter().enumerate() {
        println!("{:>3}. {}", i + 1, step.describe(to));
    }
    // The manifest sync's changes come from the cluster: what the first control plane
    // renders now against what the API server has (before the patches above, so the
    // images it lists are the current ones).
    let opts = k8s_settings(args).options();
    let listed = try_creds_and_runtime(args)
        .map_err(|e| e.to_string())
        .and_then(|(creds, rt)| {
            rt.block_on(upgrade_k8s::manifests_dry_run(inv, to, creds, &opts))
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
    ExitCode::SUCCESS
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
    let request = k8s_settings(args).request(to, args.worker_concurrency);
    let base = crate::daytwo::remote::client::base_url(args.store.admin);
    match rt.block_on(super::remote::follow(&base, &request, |l| println!("{l}"))) {
        Ok(RemoteOutcome::Finished { .. } | RemoteOutcome::NoChanges) => k8s_finished(args, to),
        Ok(RemoteOutcome::Stopped { node, reason, .. }) => k8s_stopped(node, &reason),
        Ok(RemoteOutcome::Failed { reason }) => fail(EXIT_USAGE, reason),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

/// The Kubernetes upgrade flags, as daytwo takes them.
fn k8s_settings(args: &Args) -> K8sUpgradeSettings {
    K8sUpgradeSettings {
        apid_port: args.apid_port,
        node_timeout: args.node_timeout,
        gate_poll_ms: args.gate_poll_ms,
        no_prune: args.no_prune,
        skip_manifest_wait: args.skip_manifest_wait,
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
