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
    /// Admin API address of a running `talboot serve` (its `--admin-listen`), used when
    /// serve holds the redb state file, and on an etcd store by every command that writes.
    #[arg(long, env = "TALBOOT_ADMIN", default_value = super::serve::DEFAULT_ADMIN_LISTEN)]
    pub admin: SocketAddr,
    #[command(flatten)]
    pub backend: super::store_flags::StoreBackend,
}

/// The age identity that decrypts the power credentials file (the inventory's `power:`
/// secrets): every subcommand that reaches a power controller itself.
#[derive(Debug, Clone, clap::Args)]
pub struct PowerIdentity {
    /// age identity file that decrypts the power credentials file (default: SOPS_AGE_KEY_FILE,
    /// SOPS_AGE_KEY, then sops's keys.txt).
    #[arg(long, env = "TALBOOT_AGE_IDENTITY")]
    pub age_identity: Option<PathBuf>,
}

/// The age identity that decrypts the cluster secrets bundle: every subcommand that renders
/// machine configs.
#[derive(Debug, Clone, clap::Args)]
pub struct SecretsIdentity {
    /// age identity file that decrypts the secrets bundle (else SOPS_AGE_KEY_FILE,
    /// SOPS_AGE_KEY, or sops's default keys.txt).
    #[arg(long = "age-identity")]
    pub age_identity: Option<PathBuf>,
}

/// The boot artifact cache `talboot images` fills.
#[derive(Debug, Clone, clap::Args)]
pub struct ImageCache {
    /// Boot artifact cache (see `talboot images`).
    #[arg(long, env = "TALBOOT_IMAGES", default_value = "images")]
    pub images: PathBuf,
}
