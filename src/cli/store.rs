//! `talboot store`: operations on the state store itself. `store migrate` copies a redb
//! state directory into an etcd prefix (see [`crate::store::migrate`]): checked (a running
//! serve or foreign keys stop it; the copy is read back and compared, table by table) and
//! resumable (a rerun after a kill writes only what is missing).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::store::migrate::{self, MigrateError, MigrateOptions, MigrateReport};

use super::store_flags::StoreBackend;
use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot store`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: StoreCommand,
}

/// `talboot store` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// Copy a redb state directory (serve stopped) into an empty etcd prefix, then read it
    /// back and compare; a rerun resumes an interrupted copy.
    Migrate(MigrateArgs),
}

/// Arguments of `talboot store migrate`.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    /// The state directory serve used (`--state-dir`), holding talboot.redb; serve must be
    /// stopped.
    #[arg(long, value_name = "DIR")]
    pub from: PathBuf,
    /// The etcd to copy into: `etcd://host:2379[,host:2379...]`, or `etcds://` for TLS.
    #[arg(long, value_name = "URL")]
    pub to: String,
    // etcd's TLS files and the fleet's prefix (default: the inventory's cluster.name), as
    // serve --store will be given them.
    #[command(flatten)]
    pub etcd: super::store_flags::EtcdFlags,
    /// Stop after this many transactions, as a kill would (for testing resumption).
    #[arg(long, hide = true)]
    pub stop_after_batches: Option<usize>,
}

/// Run `talboot store`.
pub fn run(args: &Args) -> ExitCode {
    match &args.command {
        StoreCommand::Migrate(a) => run_migrate(a),
    }
}

/// The inventory's cluster name, needed only without --etcd-cluster.
fn inventory_cluster(a: &MigrateArgs) -> Result<Option<String>, ExitCode> {
    if a.etcd.etcd_cluster.is_some() {
        return Ok(None);
    }
    match crate::inventory::load(&a.inventory.config) {
        Ok(l) => Ok(Some(l.inventory.cluster.name.value)),
        Err(e) => {
            eprintln!("talboot store migrate: {e}; or name the prefix with --etcd-cluster");
            Err(ExitCode::from(EXIT_INVALID))
        }
    }
}

fn run_migrate(a: &MigrateArgs) -> ExitCode {
    let cluster = match inventory_cluster(a) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let flags = StoreBackend {
        store: Some(a.to.clone()),
        etcd: a.etcd.clone(),
    };
    // `store` is set, so the spec is etcd's or an error.
    let cfg = match flags.spec(&a.from, cluster.as_deref()) {
        Ok(crate::store::StoreSpec::Etcd(cfg)) => cfg,
        other => {
            let why = other.err().map(|e| e.to_string()).unwrap_or_default();
            eprintln!("talboot store migrate: {}", why.replace("--store", "--to"));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let opts = MigrateOptions {
        stop_after: a.stop_after_batches,
    };
    let result = migrate::migrate(&a.from, &cfg, opts, |done, all| {
        if done % 50 == 0 || done == all {
            eprintln!("copied {done} of {all} transactions");
        }
    });
    match result {
        Ok(report) => {
            print!("{}", render(&report, &a.to, &cfg.cluster));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("talboot store migrate: {e}");
            match e {
                MigrateError::Store(_) => ExitCode::from(EXIT_USAGE),
                _ => ExitCode::from(EXIT_INVALID),
            }
        }
    }
}

/// The report: per table its rows and digest, what this run wrote, and what to do next.
fn render(r: &MigrateReport, to: &str, cluster: &str) -> String {
    if r.stopped {
        return format!(
            "stopped after {} transaction(s) ({} rows written); run migrate again to resume\n",
            r.batches, r.written
        );
    }
    let mut out = String::from("TABLE              ROWS  SHA-256 (source = etcd)\n");
    for (table, s) in &r.tables {
        out.push_str(&format!("{table:<16} {:>6}  {}\n", s.count, s.digest));
    }
    out.push_str(&format!(
        "copied and checked: {} rows written in {} transaction(s), {} already there; \
         start serve with --store {to} --etcd-cluster {cluster}\n",
        r.written, r.batches, r.skipped
    ));
    out
}
