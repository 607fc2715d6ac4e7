//! Flags several subcommands share, declared once and flattened into each (`#[command(flatten)]`),
//! so a flag's name, environment variable, default and help read the same everywhere.

use std::net::SocketAddr;
use std::path::PathBuf;

/// The inventory file: every subcommand that reads the operator's inventory.
#[derive(Debug, Clone, clap::Args)]
pub struct InventoryFile {
    /// Inventory file (talboot.yaml, or a talhelper talconfig.yaml).
    #[arg(
        short = 'c',
        long = "config",
        env = "TALBOOT_CONFIG",
        default_value = "talboot.yaml"
    )]
    pub config: PathBuf,
}

/// The state store, and the `talboot serve` that may hold it: a command that reads or writes
/// node state opens the store itself, or goes through serve's admin API while serve runs.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreAccess {
    /// State directory holding talboot.redb (when serve holds it, the command goes to serve).
    #[arg(long, env = "TALBOOT_STATE_DIR", default_value = crate::store::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Admin API address of a running `talboot serve` on this host (its `--admin-listen`),
    /// used when serve holds the state store.
    #[arg(long, env = "TALBOOT_ADMIN", default_value = super::serve::DEFAULT_ADMIN_LISTEN)]
    pub admin: SocketAddr,
}
