//! `talboot gen`: render every node's machine config from the inventory and the secrets bundle.
//!
//! `-o DIR` writes `DIR/<node>.yaml` for every node plus an admin `talosconfig` and
//! `kubeconfig`, all mode 0600 (configs carry CA keys). Node configs are deterministic for the
//! same inventory and bundle; the client configs hold freshly issued client certificates (one
//! year), so they differ on every run.
//!
//! `--check DIR` renders without writing and compares with `DIR/<node>.yaml`: it prints a line
//! diff per node that differs (or is missing), names `*.yaml` files of nodes no longer in the
//! inventory, and exits 1, for GitOps review. The client configs are not compared (see above).
//!
//! Structural checks and validation of every document against the Talos config schema always
//! run: the schema facts embedded in talboot (Talos v1.13), or `--schema PATH`, another
//! release's full `config.schema.json`. Deprecated fields are warnings naming the replacement.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use time::OffsetDateTime;

use crate::crypto::age::IdentitySources;
use crate::machineconfig::output::write_all;
use crate::machineconfig::rendered::render_all;
use crate::machineconfig::schema;
use crate::machineconfig::text_diff::line_diff;

use super::secrets::{load_bundle, load_inventory};
use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot gen`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["out", "check"]))]
pub struct Args {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    /// Write `<node>.yaml`, `talosconfig` and `kubeconfig` into this directory.
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Compare what would be rendered with the node configs in this directory; exit 1 and
    /// print a diff per node when they differ.
    #[arg(long = "check")]
    pub check: Option<PathBuf>,
    /// Talos config schema (config.schema.json of another Talos release) to validate every
    /// document against, instead of the embedded Talos v1.13 schema facts.
    #[arg(long = "schema")]
    pub schema: Option<PathBuf>,
    #[command(flatten)]
    pub secrets_identity: super::args::SecretsIdentity,
}

/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    let inv = match load_inventory(&args.inventory.config) {
        Ok(inv) => inv,
        Err(code) => return code,
    };
    let schema = match schema::load_for_inventory(args.schema.as_deref(), &inv) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let sources = IdentitySources::from_process_env(args.secrets_identity.age_identity.clone());
    let secrets = match load_bundle(&inv, &sources) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("talboot: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rendered = match render_all(&inv, &secrets, &schema) {
        Ok(r) => {
            for w in &r.warnings {
                eprintln!("{w}");
            }
            r.configs
        }
        Err(problems) => {
            for p in &problems {
                eprintln!("{p}");
            }
            eprintln!("talboot: {} problem(s); nothing written", problems.len());
            return ExitCode::from(EXIT_INVALID);
        }
    };
    if let Some(dir) = &args.check {
        return check(dir, &rendered);
    }
    let dir = args.out.as_ref().expect("clap requires --out or --check");
    match write_all(dir, &inv, &secrets, &rendered, OffsetDateTime::now_utc()) {
        Ok(()) => {
            println!(
                "wrote {} node configs, talosconfig and kubeconfig to {}",
                rendered.len(),
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("talboot: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// `--check`: compare with `dir`, print diffs, exit 1 on any difference.
fn check(dir: &Path, rendered: &[(String, String)]) -> ExitCode {
    let mut differ = 0;
    for (name, text) in rendered {
        let path = dir.join(format!("{name}.yaml"));
        match std::fs::read_to_string(&path) {
            Ok(old) if old == *text => {}
            Ok(old) => {
                differ += 1;
                println!("--- {}\n+++ {name} (rendered)", path.display());
                print!("{}", line_diff(&old, text));
            }
            Err(e) => {
                differ += 1;
                println!("{}: {e}; it would be written", path.display());
            }
        }
    }
    // Configs of nodes that left the inventory would linger in a GitOps repository.
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut stale: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| {
                f.strip_suffix(".yaml")
                    .is_some_and(|stem| !rendered.iter().any(|(n, _)| n == stem))
            })
            .collect();
        stale.sort();
        for f in stale {
            differ += 1;
            println!(
                "{}: no node of that name in the inventory; remove it",
                dir.join(f).display()
            );
        }
    }
    if differ == 0 {
        println!(
            "{}: all {} node configs are up to date",
            dir.display(),
            rendered.len()
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "{differ} difference(s) across {} node configs",
            rendered.len()
        );
        ExitCode::from(EXIT_INVALID)
    }
}
