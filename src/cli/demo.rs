//! `talboot demo`: the whole flow, from the first DHCP packet to a cluster handed off to Argo
//! CD, on a simulated rack on loopback (see [`crate::sim::demo`]). No root, no hardware, no
//! network beyond 127.0.0.0/16.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::{EXIT_INVALID, EXIT_USAGE};
use crate::sim::demo::{self, DemoError, DemoOptions};

/// Arguments of `talboot demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Inventory of the rack to simulate.
    #[arg(short = 'c', long = "config", default_value = "config/rack.yaml")]
    pub config: PathBuf,
    /// Keep everything the run writes (relocated inventory, boot files, state store, admin
    /// talosconfig and kubeconfig) in this new or empty directory; by default a temporary
    /// directory is used and removed.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Give up if the cluster is not handed off within this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// After the hand-off, rebuild this node (reset, re-PXE, re-apply) and show that no other
    /// node is touched.
    #[arg(long, value_name = "NODE")]
    pub rebuild: Option<String>,
    /// Print only the summary, not talboot's events as they happen.
    #[arg(short, long)]
    pub quiet: bool,
    /// How many nodes the provisioner drives at once (Talos calls in flight, one per node).
    #[arg(long, value_name = "N", default_value_t = crate::provision::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// After hand-off, roll a Talos minor-version bump across the rack with
    /// `talboot upgrade`'s rolling engine, then apply a config change without reboot through
    /// talboot's admin API (as `talboot apply` does while serve runs), printing progress per
    /// node.
    #[arg(long)]
    pub upgrade: bool,
    /// Workers upgraded at once by `--upgrade`.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub upgrade_workers: usize,
    /// Milliseconds between two simulated machines' power-on; 0 powers the whole rack on at
    /// once (a storm).
    #[arg(long, value_name = "MS", default_value_t = 40)]
    pub power_on_stagger: u64,
    /// After the summary, keep talboot and the simulated rack running (the dashboard on the
    /// admin address printed at the start stays up) until Ctrl-C or SIGTERM.
    #[arg(long)]
    pub stay: bool,
    /// Keep talboot's state in etcd (`--store etcd://127.0.0.1:2379`, with `--etcd-*` as
    /// serve takes them) instead of the work directory's redb file; the prefix should be
    /// empty (a fresh `--etcd-cluster`), since the run's secrets are new.
    #[command(flatten)]
    pub backend: super::store_flags::StoreBackend,
}

/// The etcd `--store` names, its cluster left empty for the inventory's name unless
/// `--etcd-cluster` gives one.
fn etcd_config(args: &Args) -> Result<Option<crate::store::EtcdConfig>, ExitCode> {
    match args.backend.spec(std::path::Path::new(""), Some("")) {
        Ok(crate::store::StoreSpec::Etcd(cfg)) => Ok(Some(cfg)),
        Ok(crate::store::StoreSpec::Redb(_)) => Ok(None),
        Err(e) => {
            eprintln!("talboot demo: {e}");
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// With `--stay`, what the demo waits for before it stops: Ctrl-C or SIGTERM.
fn hold_until_signal() -> demo::Hold {
    Box::pin(async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    })
}

/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    let etcd = match etcd_config(args) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let (_temp, workdir) = match &args.workdir {
        Some(d) => (None, d.clone()),
        None => match tempfile::Builder::new().prefix("talboot-demo-").tempdir() {
            Ok(t) => {
                let p = t.path().to_owned();
                (Some(t), p)
            }
            Err(e) => {
                eprintln!("talboot demo: cannot create a temporary directory: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talboot demo: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let opts = DemoOptions {
        config: args.config.clone(),
        workdir: workdir.clone(),
        print_events: !args.quiet,
        concurrency: args.concurrency,
        power_on_stagger: Duration::from_millis(args.power_on_stagger),
        etcd,
    };
    let hold: Option<demo::Hold> = args.stay.then(hold_until_signal);
    let result = rt.block_on(demo::run_and_hold(
        opts,
        Duration::from_secs(args.timeout),
        args.rebuild.clone(),
        args.upgrade.then_some(args.upgrade_workers.max(1)),
        hold,
    ));
    match result {
        Ok(summary) => {
            if !summary.is_empty() {
                println!("{summary}");
            }
            if args.workdir.is_some() {
                println!(
                    "kept in {}: state/ (store, kubeconfig), talosconfig, config/ (relocated inventory)",
                    workdir.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("talboot demo: {e}");
            match e {
                DemoError::Inventory(..)
                | DemoError::Relocate(_)
                | DemoError::Unsupported(_)
                | DemoError::UnknownNode(..) => ExitCode::from(EXIT_INVALID),
                DemoError::Timeout { .. } | DemoError::Upgrade(_) | DemoError::DayTwo(_) => {
                    ExitCode::from(EXIT_INVALID)
                }
                _ => ExitCode::from(EXIT_USAGE),
            }
        }
    }
}
