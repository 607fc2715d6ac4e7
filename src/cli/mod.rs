//! Command-line entry: argument parsing (clap derive), logging set-up, and dispatch to one
//! module per subcommand. Subcommands return an [`ExitCode`]: 0 success, 1 the input is invalid
//! (or the checked condition does not hold), 2 usage or I/O errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

pub(crate) mod admin_client;
pub mod args;
pub mod check;
#[cfg(feature = "sim")]
pub mod demo;
pub mod r#gen;
pub mod generate;
pub mod images;
pub mod node;
pub mod node_secureboot;
pub mod plan;
pub mod power;
pub mod proxmox;
pub(crate) mod remote;
pub mod secrets;
pub mod serve;
pub mod status;
pub mod store;
pub mod store_flags;
pub mod up;
pub mod upgrade;
pub(crate) mod watch;

/// talboot: from power-on to a running Talos Linux cluster.
#[derive(Debug, Parser)]
#[command(name = "talboot", version, about, propagate_version = true)]
pub struct Cli {
    /// Log output format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,

    /// Log filter in RUST_LOG syntax (e.g. `info`, `talboot=debug,tower_http=warn`).
    #[arg(long = "log", global = true, env = "RUST_LOG", default_value = "info")]
    pub(crate) log_filter: String,

    /// The admin token file (mode 0600): `serve` requires it for an --admin-listen off
    /// loopback and then asks every admin request from off loopback for it; the commands that
    /// talk to a running serve (`--admin`) send it (else `TALBOOT_ADMIN_TOKEN`).
    #[arg(
        long,
        global = true,
        env = "TALBOOT_ADMIN_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub(crate) admin_token_file: Option<std::path::PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate an inventory (talboot.yaml or talhelper talconfig.yaml) and print a summary.
    Check(check::Args),
    /// Manage the boot artifact cache (Talos kernels and initramfs images).
    Images(images::Args),
    /// Run the appliance: DHCP, TFTP and HTTP on the provisioning network.
    Serve(Box<serve::Args>),
    /// Render every node's Talos machine config (and admin talosconfig/kubeconfig), or check
    /// a directory of rendered configs for drift.
    Gen(r#gen::Args),
    /// Manage the cluster secrets bundle (age-encrypted).
    Secrets(secrets::Args),
    /// Show each node's phase, address, Talos version and last event.
    Status(status::Args),
    /// Operate on the state store itself (`store migrate --from DIR --to etcd://...`).
    Store(store::Args),
    /// Act on one node (rebuild, power, next boot device).
    Node(node::Args),
    /// Act on the whole rack (`rack up`: power on every node not provisioned yet).
    Rack(power::RackArgs),
    /// Run the whole flow on a simulated rack on loopback (no root, no hardware).
    #[cfg(feature = "sim")]
    Demo(demo::Args),
    /// Create or destroy the inventory's Proxmox VE VMs (home labs).
    Proxmox(proxmox::Args),
    /// Diff what each running node has against what the inventory renders (exit 0 no
    /// changes, 1 changes, 2 errors).
    Plan(plan::PlanArgs),
    /// Apply the plan to the running nodes, one control plane at a time (resumable).
    Apply(plan::ApplyArgs),
    /// Upgrade Talos (`--talos`, one node at a time behind the etcd health gate) or
    /// Kubernetes (`--kubernetes`) on the running nodes (resumable).
    Upgrade(upgrade::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(generate::CompletionsArgs),
    /// Write the man pages (talboot.1 and one per subcommand) into a directory.
    Man(generate::ManArgs),

    /// The whole first run in one command: secrets, boot images, configs, then serve and
    /// provision to hand-off (idempotent: what is done is skipped; resumable).
    Up(Box<up::Args>),
}

/// Exit code for invalid input.
pub(crate) const EXIT_INVALID: u8 = 1;
/// Exit code for usage and I/O errors.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Parse arguments, set up logging and run the subcommand.
pub fn run() -> ExitCode {
    #[cfg_attr(not(feature = "sim"), allow(unused_mut))]
    let mut cli = Cli::parse();
    // The demo's output is talboot's event stream; its servers' info logs would bury it.
    #[cfg(feature = "sim")]
    if matches!(cli.command, Command::Demo(_))
        && cli.log_filter == "info"
        && std::env::var_os("RUST_LOG").is_none()
    {
        cli.log_filter = "warn".into();
    }
    if let Err(e) = init_logging(cli.log_format, &cli.log_filter) {
        eprintln!("talboot: invalid --log filter `{}`: {e}", cli.log_filter);
        return ExitCode::from(EXIT_USAGE);
    }
    admin_client::set_token_file(cli.admin_token_file.clone());
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Images(args) => images::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Gen(args) => r#gen::run(&args),
        Command::Secrets(args) => secrets::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Store(args) => store::run(&args),
        Command::Node(args) => node::run(&args),
        Command::Rack(args) => power::run_rack(&args),
        #[cfg(feature = "sim")]
        Command::Demo(args) => demo::run(&args),
        Command::Proxmox(args) => proxmox::run(&args),
        Command::Plan(args) => plan::run_plan(&args),
        Command::Apply(args) => plan::run_apply(&args),
        Command::Upgrade(args) => upgrade::run(&args),
        Command::Completions(args) => generate::completions(&args),
        Command::Man(args) => generate::man(&args),

        Command::Up(args) => up::run(&args),
    }
}

/// Why [`talosconfig_creds`] found no usable credentials; the message names the file and
/// the fix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TalosconfigError {
    /// The file could not be read.
    #[error("cannot use talosconfig {}: {source}; pass --talosconfig", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a usable talosconfig (its message never carries key material).
    #[error("cannot use talosconfig {}: {source}; pass --talosconfig", path.display())]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What is missing or wrong.
        source: crate::talos::TalosError,
    },
}

/// The admin client credentials for `node`/`upgrade`: `--talosconfig`, else the one `gen`
/// wrote into the state directory.
pub(crate) fn talosconfig_creds(
    talosconfig: Option<&std::path::Path>,
    state_dir: &std::path::Path,
    context: Option<&str>,
) -> Result<crate::talos::ClientCreds, TalosconfigError> {
    let path = talosconfig.map_or_else(|| state_dir.join("talosconfig"), |p| p.to_path_buf());
    let yaml = match std::fs::read_to_string(&path) {
        Ok(y) => y,
        Err(source) => return Err(TalosconfigError::Read { path, source }),
    };
    crate::talos::ClientCreds::from_talosconfig(&yaml, context)
        .map_err(|source| TalosconfigError::Invalid { path, source })
}

/// Whether log lines may carry ANSI colour: only when they go to a terminal, and never when
/// `NO_COLOR` is set to a non-empty value (<https://no-color.org>). A file, a pipe or the
/// journal gets plain text.
pub(crate) fn use_colour(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
enum LoggingError {
    /// `--log` is not a tracing filter.
    #[error("{0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    /// A global subscriber was already installed.
    #[error("{0}")]
    Init(Box<dyn std::error::Error + Send + Sync>),
}

fn init_logging(format: LogFormat, filter: &str) -> Result<(), LoggingError> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(filter)?;
    // Logs go to stderr, so stderr is what must be a terminal for colour.
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(LoggingError::Init)
}

#[cfg(test)]
mod tests {
    use super::use_colour;
    use std::ffi::OsStr;

    #[test]
    fn every_subcommand_has_a_help_line() {
        use clap::CommandFactory as _;
        fn missing(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            for sub in cmd.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                if sub.get_name() != "help" && sub.get_about().is_none() {
                    out.push(path.clone());
                }
                missing(sub, &path, out);
            }
        }
        let mut out = Vec::new();
        missing(&super::Cli::command(), "talboot", &mut out);
        assert!(out.is_empty(), "subcommands without a help line: {out:?}");
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        // clap checks ids, groups and conflicts only when a command is built: `up` flattens
        // `serve`'s arguments, and two structs named `Args` once made `talboot up` panic.
        use clap::CommandFactory as _;
        super::Cli::command().debug_assert();
        let cli = <super::Cli as clap::Parser>::try_parse_from([
            "talboot",
            "up",
            "-c",
            "rack.yaml",
            "--stay",
            "--images-from",
            "usb",
        ])
        .unwrap();
        let super::Command::Up(up) = cli.command else {
            panic!("not up");
        };
        assert!(up.stay && up.serve.inventory.config == std::path::Path::new("rack.yaml"));
        assert!(
            <super::Cli as clap::Parser>::try_parse_from([
                "talboot",
                "up",
                "--images-from",
                "usb",
                "--factory",
                "http://x",
            ])
            .is_err(),
            "--images-from and --factory exclude each other"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(
            use_colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new("1"))));
    }

    /// The loader's errors say which file and which part, as a type the callers can match.
    #[test]
    fn talosconfig_errors_are_typed_and_name_the_file() {
        use super::{TalosconfigError, talosconfig_creds};
        let dir = tempfile::tempdir().unwrap();
        let err = talosconfig_creds(None, dir.path(), None).unwrap_err();
        let want = dir.path().join("talosconfig");
        assert!(matches!(&err, TalosconfigError::Read { path, .. } if *path == want));
        assert!(err.to_string().contains("pass --talosconfig"), "{err}");
        let file = dir.path().join("tc.yaml");
        std::fs::write(&file, "context: x\ncontexts: {}\n").unwrap();
        let err = talosconfig_creds(Some(&file), dir.path(), None).unwrap_err();
        assert!(matches!(&err, TalosconfigError::Invalid { path, .. } if *path == file));
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{err}"
        );
    }
}
