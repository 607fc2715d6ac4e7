//! `talboot serve`: the appliance. Loads and checks everything first (inventory, boot artifacts,
//! iPXE binaries, state store), binds every privileged socket, optionally drops privileges, then
//! runs the network servers until SIGINT or SIGTERM and shuts them down gracefully.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::artifacts::{self, Catalog};
use crate::crypto::age::{Identities, IdentitySources, Secret};
use crate::dhcp;
use crate::http;
use crate::inventory::{self, Inventory, NetworkMode};
use crate::store;
use crate::tftp::TftpConfig;

use super::{EXIT_INVALID, EXIT_USAGE};
use crate::appliance::{ApplianceError, DhcpPlan, DriftPlan, Plan, PowerOnPlan, ProvisioningPlan};

/// Default admin API address (`serve --admin-listen`, `status --admin`, `node rebuild --admin`).
pub(crate) const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";

/// Where Debian's `ipxe` package installs them.
pub(crate) const DEFAULT_IPXE_DIR: &str = "/usr/lib/ipxe";

/// Arguments of `talboot serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    /// State directory (leases, node records, events, tokens in talboot.redb unless --store
    /// names etcd; the admin kubeconfig either way).
    #[arg(long, env = "TALBOOT_STATE_DIR", default_value = store::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    #[command(flatten)]
    pub backend: super::store_flags::StoreBackend,
    /// This appliance's name among those serving one fleet from etcd (default: the host
    /// name); each must have its own.
    #[arg(long, env = "TALBOOT_NAME", value_name = "NAME")]
    pub name: Option<String>,
    #[command(flatten)]
    pub image_cache: super::args::ImageCache,
    /// Folder with the iPXE binaries served over TFTP and HTTP (undionly.kpxe, ipxe.efi,
    /// snponly.efi, ipxe-arm64.efi), read once at start; symlinks are followed. `serve` refuses
    /// to start when one the inventory's machines need cannot be read.
    #[arg(long, env = "TALBOOT_IPXE_DIR", default_value = DEFAULT_IPXE_DIR)]
    pub(crate) ipxe_dir: PathBuf,
    /// Rendered machine configs (`talboot gen -o DIR`), released to nodes in pull mode.
    #[arg(long, env = "TALBOOT_CONFIGS", default_value = "out")]
    pub configs: PathBuf,
    /// The address machines reach talboot at (default: network.advertise, else the first IPv4
    /// address of the first network interface).
    #[arg(long)]
    pub advertise: Option<Ipv4Addr>,
    /// Interface to serve on (default: the inventory's network.interfaces).
    #[arg(long)]
    pub interface: Option<String>,
    /// HTTP port of the provisioning side (scripts, artifacts, pull configs).
    #[arg(long, default_value_t = 8080)]
    pub(crate) http_port: u16,
    /// Where the admin API listens (`/api/nodes`, rebuilds, `/metrics`; used by `talboot
    /// status` and `talboot node rebuild`). Loopback by default; any other address needs
    /// --admin-token-file, and then every request from off loopback must carry the token.
    #[arg(long, env = "TALBOOT_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,
    /// A DNS name the admin listener is reached by (repeatable), e.g. the name in the
    /// dashboard's URL. Without it only addresses and `localhost` are answered, so a web page
    /// whose name was rebound to the admin address gets nothing.
    #[arg(long = "admin-host", value_name = "NAME")]
    pub(crate) admin_hosts: Vec<String>,
    /// Seconds an HTTP client gets to send a whole request head (from connecting, or from the
    /// first byte of a further request on a kept-alive connection); then it is cut.
    #[arg(long, value_name = "SECONDS", default_value_t = http::server::DEFAULT_HEADER_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) http_header_timeout: u64,
    /// Seconds a kept-alive HTTP connection may sit idle between requests, and a response
    /// may go unread, before it is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = http::server::DEFAULT_IDLE_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) http_idle_timeout: u64,
    /// HTTP connections served at once per listener; further ones wait (counted in
    /// `talboot_http_connections_over_cap_total`).
    #[arg(long, value_name = "N", default_value_t = http::server::DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) http_max_connections: u64,
    /// TFTP port.
    #[arg(long, default_value_t = 69)]
    pub(crate) tftp_port: u16,
    /// Do not run the TFTP server (every machine boots iPXE from its NIC ROM or HTTP boot).
    #[arg(long)]
    pub(crate) no_tftp: bool,
    /// TFTP transfers served at once; further requests wait for a slot. Default: sized from
    /// memory (1/32 of RAM at 256 KiB per transfer, at most half the open-file limit, 64..=4096).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub(crate) tftp_max_transfers: Option<u64>,
    /// TFTP transfers running or waiting at once for one client address (a UEFI boot needs 2);
    /// further requests from it are dropped unanswered, so one host cannot hold every slot.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub(crate) tftp_max_per_client: u64,
    /// Do not run the DHCP server (another DHCP server hands out the boot options).
    #[arg(long)]
    pub(crate) no_dhcp: bool,
    /// Send IPv6 router advertisements with router lifetime 0 and no prefix on the serving
    /// interface, so iPXE's IPv6 autoconfiguration ends at once instead of waiting about 16 s
    /// on a segment without IPv6 routers (nothing gets an address or a default route from
    /// them). Leave it off where a real IPv6 router serves the segment.
    #[arg(long)]
    pub ipv6_ra: bool,
    /// Drop to this user after binding the privileged ports.
    #[arg(long)]
    pub user: Option<String>,
    /// Do not provision nodes over the Talos API (push delivery): serve boot files only.
    #[arg(long)]
    pub(crate) no_provision: bool,
    /// Once serving, power on every inventory node with a power controller that is not
    /// provisioned yet (never seen, or failed), each with a one-time network boot first,
    /// one after another: what `talboot rack up` does, recorded on each node's timeline.
    #[arg(long)]
    pub(crate) power_on: bool,
    /// Pause between two nodes' power-on with --power-on (`2s`, `500ms`, `0`), to limit
    /// inrush current.
    #[arg(long, default_value = "2s", value_parser = super::power::parse_pause)]
    pub(crate) power_on_stagger: std::time::Duration,
    /// Seconds between drift checks (each node's running MachineConfig against what the
    /// inventory renders; `talboot_node_drift` gauge and `node.drift` events); 0 disables.
    #[arg(long = "drift-interval", default_value_t = 300)]
    pub drift_interval: u64,
    /// Admin talosconfig for secured Talos API calls (default: `<configs>/talosconfig`, as
    /// `talboot gen -o` writes it).
    #[arg(long, env = "TALOSCONFIG")]
    pub talosconfig: Option<PathBuf>,
    /// Rendered add-on manifests, `<dir>/cilium/` and `<dir>/argocd/` (see docs/addons.md),
    /// installed by the cluster steps after bootstrap.
    #[arg(long, env = "TALBOOT_ADDON_MANIFESTS")]
    pub addon_manifests: Option<PathBuf>,
    /// A helm binary: the cluster steps then render each enabled add-on with `helm template`
    /// (pinned chart from the inventory) instead of reading --addon-manifests.
    #[arg(long, env = "TALBOOT_HELM")]
    pub helm: Option<PathBuf>,
    /// How many nodes push provisioning drives at once (Talos calls in flight, at most one
    /// per node).
    #[arg(long, value_name = "N", default_value_t = crate::provision::DEFAULT_CONCURRENCY)]
    pub(crate) provision_concurrency: usize,
    /// age identity file for Argo CD's `sops-age` Secret when addons.argocd.ksops is on
    /// (default: the identities that decrypt the secrets bundle).
    #[arg(long, env = "TALBOOT_KSOPS_AGE_IDENTITY")]
    pub ksops_age_identity: Option<PathBuf>,
    /// Talos config schema (config.schema.json of another Talos release) to validate every
    /// config against before serving, instead of the embedded Talos v1.13 schema facts.
    #[arg(long = "schema")]
    pub schema: Option<PathBuf>,
    #[command(flatten)]
    pub secrets_identity: super::args::SecretsIdentity,
}

/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talboot serve: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    rt.block_on(serve(args.clone()))
}

/// Problems that stop `serve` before it starts, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// The inventory is invalid or unreadable.
    #[error("{0}; run `talboot check -c {1}` for every problem")]
    Inventory(inventory::LoadError, PathBuf),
    /// Boot artifacts are missing or damaged.
    #[error("{0}")]
    Artifacts(#[from] artifacts::ArtifactError),
    /// No address to advertise.
    #[error(
        "cannot tell which address machines reach talboot at: {0}; set network.advertise or pass --advertise"
    )]
    Advertise(String),
    /// The store cannot be opened.
    #[error("{0}")]
    Store(#[from] store::StoreError),
    /// The `--store`/`--etcd-*` flags cannot be used.
    #[error("{0}")]
    StoreFlags(#[from] super::store_flags::StoreFlagError),
    /// An iPXE binary the inventory needs cannot be served.
    #[error("{0}")]
    Ipxe(#[from] crate::firststage::Unservable),
    /// A socket cannot be bound.
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        /// What.
        addr: String,
        /// Why.
        cause: String,
    },
    /// The admin token file cannot be used.
    #[error("{0}")]
    AdminToken(#[from] crate::admin::auth::TokenError),
    /// A `--admin-host` is not a host name.
    #[error("{0}")]
    AdminHost(#[from] crate::admin::dashboard::BadAdminHost),
    /// Push provisioning cannot start (secrets bundle or talosconfig).
    #[error("push provisioning: {0}; pass --no-provision to serve boot files only")]
    Provisioning(String),
    /// The `--schema` file cannot be used.
    #[error("{0}")]
    Schema(crate::machineconfig::schema::SchemaLoadError),
    /// A machine config to be served fails the Talos config schema.
    #[error(
        "machine configs fail the Talos config schema ({schema}):\n{}\nfix the inventory or \
         its patches (and re-run `talboot gen` for pull delivery)",
        .problems.join("\n")
    )]
    Configs {
        /// The schema validated against.
        schema: String,
        /// Every violation, one per line.
        problems: Vec<String>,
    },
    /// The age identity for Argo CD's KSOPS cannot be had.
    #[error("Argo CD KSOPS: {0}")]
    KsopsIdentity(String),
    /// The `--helm` binary cannot be run.
    #[error(
        "--helm {}: {cause}; give the path of a working helm binary, or leave --helm out and \
         use --addon-manifests",
        .path.display()
    )]
    Helm {
        /// The binary given.
        path: PathBuf,
        /// Why it cannot be used.
        cause: String,
    },
    /// Dropping privileges failed.
    #[error("cannot drop privileges to {user}: {cause}")]
    Privileges {
        /// Target user.
        user: String,
        /// Why.
        cause: String,
    },
}

impl From<ApplianceError> for StartError {
    fn from(e: ApplianceError) -> Self {
        match e {
            ApplianceError::Store(e) => StartError::Store(e),
            ApplianceError::Ipxe(e) => StartError::Ipxe(e),
            ApplianceError::Bind { addr, cause } => StartError::Bind {
                addr,
                cause: cause.to_string(),
            },
        }
    }
}

impl StartError {
    pub(crate) fn exit_code(&self) -> ExitCode {
        match self {
            StartError::Inventory(inventory::LoadError::Io { .. }, _) => ExitCode::from(EXIT_USAGE),
            StartError::Bind { .. }
            | StartError::Privileges { .. }
            | StartError::Schema(_)
            | StartError::StoreFlags(_) => ExitCode::from(EXIT_USAGE),
            _ => ExitCode::from(EXIT_INVALID),
        }
    }
}

async fn serve(args: Args) -> ExitCode {
    match start_and_run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("talboot serve: {e}");
            e.exit_code()
        }
    }
}

fn serving_interface(args: &Args, inv: &Inventory) -> Option<String> {
    args.interface
        .clone()
        .or_else(|| inv.network.interfaces.first().cloned())
}

/// The MTU of `iface`, from sysfs.
fn interface_mtu(iface: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The largest TFTP block that fits one Ethernet frame: MTU minus IPv4 (20), UDP (8) and TFTP
/// (4) headers, within RFC 2348's 512..=65464.
pub(crate) fn max_blksize_for_mtu(mtu: u32) -> u16 {
    mtu.saturating_sub(32).clamp(512, 65464) as u16
}

fn advertise_address(args: &Args, inv: &Inventory) -> Result<Ipv4Addr, StartError> {
    if let Some(a) = args.advertise {
        return Ok(a);
    }
    if let Some(a) = &inv.network.advertise {
        return Ok(a.value);
    }
    let iface = serving_interface(args, inv)
        .ok_or_else(|| StartError::Advertise("no interface is configured".into()))?;
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| StartError::Advertise(e.to_string()))?;
    addrs
        .filter(|a| a.interface_name == iface)
        .filter_map(|a| a.address.and_then(|s| s.as_sockaddr_in().map(|v4| v4.ip())))
        .next()
        .ok_or_else(|| StartError::Advertise(format!("interface {iface} has no IPv4 address")))
}

async fn start_and_run(args: Args) -> Result<(), StartError> {
    let plan = prepare(&args)?;
    // Bind every privileged socket before dropping privileges.
    let bound = plan.bind().await?;
    if let Some(user) = &args.user {
        drop_privileges(user)?;
    }
    let running = bound.start()?;
    println!(
        "talboot serving {} nodes; boot script {}/boot.ipxe",
        running.node_count, running.base_url
    );
    let shutdown = running.cancel.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    running.wait().await.map_err(|e| StartError::Bind {
        addr: "server".into(),
        cause: e.to_string(),
    })
}

/// Loads and checks everything `serve` needs (inventory, boot artifacts, configs, secrets,
/// talosconfig) and plans the appliance (drift watcher and `--power-on` round included);
/// nothing is bound yet.
pub(crate) fn prepare(args: &Args) -> Result<Plan, StartError> {
    crate::install_crypto_provider();
    let inv = load_inventory(args)?;
    // Refuse to start rather than boot machines into a missing or damaged kernel.
    let catalog = Catalog::load(&args.image_cache.images)?;
    for r in artifacts::requirements(&inv) {
        artifacts::verify_for(&args.image_cache.images, &catalog, &r.id, r.boots)?;
    }
    let schema = crate::machineconfig::schema::load_for_inventory(args.schema.as_deref(), &inv)
        .map_err(StartError::Schema)?;
    let advertise = advertise_address(args, &inv)?;
    let push = inv.boot.delivery == inventory::Delivery::Push && !args.no_provision;
    if inv.boot.delivery == inventory::Delivery::Pull {
        validate_pull_configs(&args.configs, &inv, &schema)?;
    }
    // One driver set (credentials resolved once) for the provisioner and --power-on.
    let power = if push || args.power_on {
        Arc::new(crate::power::dispatch::serve_drivers(
            &inv,
            args.secrets_identity.age_identity.clone(),
        ))
    } else {
        Arc::default()
    };
    // Everything push provisioning needs is loaded up front, so a missing key or talosconfig
    // stops `serve` now rather than when the first machine boots.
    let (provisioning, drift) = if push {
        let (p, drift) = provisioning_plan(args, &inv, &schema, power.clone())?;
        (Some(p), drift)
    } else {
        (None, None)
    };
    let dhcp = if args.no_dhcp {
        None
    } else {
        Some(dhcp_plan(args, &inv)?)
    };
    let tftp = (!args.no_tftp).then(|| tftp_plan(args, &inv));
    let ipv6_ra = if args.ipv6_ra {
        Some(ra_interface(args, &inv)?)
    } else {
        None
    };
    let power_on = args.power_on.then(|| PowerOnPlan {
        drivers: power,
        stagger: args.power_on_stagger,
    });
    let store = args
        .backend
        .spec(&args.state_dir, Some(&inv.cluster.name))?;
    Ok(Plan {
        ipv6_ra,
        inventory: inv,
        catalog,
        images_dir: args.image_cache.images.clone(),
        ipxe_dir: args.ipxe_dir.clone(),
        configs: args.configs.clone(),
        store,
        name: appliance_name(args),
        advertise,
        http: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.http_port),
        admin: args.admin_listen,
        // Read now, before any privilege drop, as the user that owns it.
        admin_token: match super::admin_client::token_file() {
            Some(path) => Some(std::sync::Arc::new(crate::admin::auth::AdminToken::load(
                path,
            )?)),
            None => None,
        },
        admin_hosts: std::sync::Arc::new(crate::admin::dashboard::AdminHosts::new(
            &args.admin_hosts,
        )?),
        http_limits: http_limits(args),
        tftp,
        dhcp,
        provisioning,
        drift,
        power_on,
    })
}

/// `--name`, else the host name.
fn appliance_name(args: &Args) -> String {
    args.name
        .clone()
        .unwrap_or_else(super::store_flags::host_name)
}

/// The inventory, its problems printed as `check` prints them and its warnings logged.
fn load_inventory(args: &Args) -> Result<Arc<Inventory>, StartError> {
    let loaded = inventory::load(&args.inventory.config).map_err(|e| {
        // Each problem with its file:line:column, as `check` prints them.
        if let inventory::LoadError::Invalid { diagnostics, .. } = &e {
            for d in diagnostics.sorted() {
                eprintln!("{d}");
            }
        }
        StartError::Inventory(e, args.inventory.config.clone())
    })?;
    for w in loaded.warnings.sorted() {
        tracing::warn!("{w}");
    }
    Ok(Arc::new(loaded.inventory))
}

/// Push provisioning's plan, and the drift watcher's if `--drift-interval` asks for one.
fn provisioning_plan(
    args: &Args,
    inv: &Arc<Inventory>,
    schema: &crate::machineconfig::schema::Schema,
    power: Arc<std::collections::BTreeMap<String, crate::power::PowerDriver>>,
) -> Result<(ProvisioningPlan, Option<DriftPlan>), StartError> {
    let inputs = provisioning_inputs(args, inv, schema)?;
    let mut settings = crate::provision::Settings::new(args.state_dir.clone());
    settings.addon_manifests = args.addon_manifests.clone();
    settings.helm = args.helm.clone();
    settings.concurrency = args.provision_concurrency.max(1);
    settings.ksops_age_identity = inputs.ksops_age_identity;
    settings.power = power;
    // The Secure Boot gate compares each secure-boot node's PCR key with its boot set's.
    let catalog = Catalog::load(&args.image_cache.images)?;
    settings.secure_boot_keys = Arc::new(crate::provision::secure_boot::expected_pcr_fingerprints(
        inv, &catalog,
    ));
    let mut drift = None;
    if args.drift_interval > 0 {
        let (connector, targets) = crate::daytwo::drift::targets(
            inv,
            inputs.renderer.as_ref(),
            &inputs.creds,
            settings.apid_port,
        );
        drift = Some(DriftPlan {
            connector,
            targets,
            interval: std::time::Duration::from_secs(args.drift_interval),
        });
    }
    let plan = ProvisioningPlan {
        renderer: inputs.renderer,
        creds: inputs.creds,
        settings,
    };
    Ok((plan, drift))
}

/// DHCP on the serving interface: port 67, and 4011 in proxy mode.
fn dhcp_plan(args: &Args, inv: &Inventory) -> Result<DhcpPlan, StartError> {
    let iface = serving_interface(args, inv).ok_or_else(|| StartError::Bind {
        addr: "udp 0.0.0.0:67".into(),
        cause: "no interface to serve DHCP on; set network.interfaces or pass --interface".into(),
    })?;
    let ports = match inv.network.mode {
        NetworkMode::Proxy => vec![dhcp::server::DHCP_PORT, dhcp::server::PXE_PORT],
        NetworkMode::Authoritative => vec![dhcp::server::DHCP_PORT],
    };
    Ok(DhcpPlan::Interface { iface, ports })
}

/// TFTP's address and settings, the block size capped by the serving interface's MTU.
fn tftp_plan(args: &Args, inv: &Inventory) -> (SocketAddr, TftpConfig) {
    let max_blksize = serving_interface(args, inv)
        .and_then(|i| interface_mtu(&i))
        .map(max_blksize_for_mtu)
        .unwrap_or(TftpConfig::default().max_blksize);
    let defaults = TftpConfig::default();
    (
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.tftp_port),
        TftpConfig {
            max_blksize,
            max_transfers: args
                .tftp_max_transfers
                .map_or(defaults.max_transfers, |n| n as usize),
            max_per_client: args.tftp_max_per_client as usize,
            ..defaults
        },
    )
}

/// The interface `--ipv6-ra` advertises on.
fn ra_interface(args: &Args, inv: &Inventory) -> Result<String, StartError> {
    serving_interface(args, inv).ok_or_else(|| StartError::Bind {
        addr: "icmpv6".into(),
        cause: "--ipv6-ra needs an interface; set network.interfaces or pass --interface".into(),
    })
}

/// Both HTTP listeners' timeouts and connection cap (`--http-*`).
fn http_limits(args: &Args) -> http::server::Limits {
    http::server::Limits {
        timeouts: http::conn::Timeouts {
            header: std::time::Duration::from_secs(args.http_header_timeout),
            idle: std::time::Duration::from_secs(args.http_idle_timeout),
        },
        max_connections: usize::try_from(args.http_max_connections).unwrap_or(usize::MAX),
        ..http::server::Limits::default()
    }
}

/// What push provisioning needs, loaded before anything is served.
struct ProvisioningInputs {
    renderer: Arc<dyn crate::machineconfig::renderer::ConfigRenderer>,
    creds: crate::talos::ClientCreds,
    ksops_age_identity: Option<Arc<Secret>>,
}

/// The age identity (keys.txt text) for Argo CD's `sops-age` Secret: the
/// `--ksops-age-identity` file if given, else (when `addons.argocd.ksops` is on) the
/// identities `sources` yield, the ones that decrypt the secrets bundle. `None` when KSOPS is
/// off. The file must hold at least one `AGE-SECRET-KEY-1…` identity; errors name the file or
/// the flag, never key material.
pub(crate) fn ksops_identity(
    inv: &Inventory,
    flag: Option<&Path>,
    sources: &IdentitySources,
) -> Result<Option<Arc<Secret>>, StartError> {
    let ksops = inv
        .addons
        .argocd
        .as_ref()
        .is_some_and(|a| a.enabled && a.ksops);
    if let Some(path) = flag {
        let bad = |why: String| {
            StartError::KsopsIdentity(format!(
                "the age identity file {} given with --ksops-age-identity {why}",
                path.display()
            ))
        };
        let text = std::fs::read_to_string(path)
            .map(zeroize::Zeroizing::new)
            .map_err(|e| bad(format!("cannot be read: {e}")))?;
        let ids = Identities::from_text(&path.display().to_string(), &text)
            .map_err(|e| bad(format!("is not an age identity file: {e}")))?;
        if ids.is_empty() {
            return Err(bad(
                "holds no AGE-SECRET-KEY-1… identity; make one with age-keygen".into(),
            ));
        }
        if !ksops {
            tracing::warn!(
                file = %path.display(),
                "--ksops-age-identity is given but addons.argocd.ksops is off; not used"
            );
            return Ok(None);
        }
        return Ok(Some(Arc::new(Secret::new(text.as_bytes().to_vec()))));
    }
    if !ksops {
        return Ok(None);
    }
    let ids = Identities::load(sources).map_err(|e| StartError::KsopsIdentity(e.to_string()))?;
    if ids.is_empty() {
        return Err(StartError::KsopsIdentity(format!(
            "addons.argocd.ksops is on but there is no age identity for the sops-age Secret; \
             pass --ksops-age-identity FILE (an age-keygen identity file) or set \
             addons.argocd.ksops: false (tried: {})",
            ids.describe_tried()
        )));
    }
    tracing::info!(
        identities = ids.recipients().len(),
        "KSOPS uses the age identities that decrypt the secrets bundle (--ksops-age-identity not given)"
    );
    Ok(Some(Arc::new(ids.to_keys_text())))
}

/// Checks that `helm` runs (`helm version`), so a wrong `--helm` stops `serve` now rather
/// than at the first add-on step.
fn check_helm(helm: &Path) -> Result<(), StartError> {
    let err = |cause: String| StartError::Helm {
        path: helm.to_owned(),
        cause,
    };
    let out = std::process::Command::new(helm)
        .args(["version", "--short"])
        .output()
        .map_err(|e| err(format!("cannot run it: {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "`helm version` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    tracing::info!(
        helm = %helm.display(),
        version = %String::from_utf8_lossy(&out.stdout).trim(),
        "add-ons are rendered with helm template"
    );
    Ok(())
}

fn provisioning_inputs(
    args: &Args,
    inv: &Arc<Inventory>,
    schema: &crate::machineconfig::schema::Schema,
) -> Result<ProvisioningInputs, StartError> {
    let sources = IdentitySources::from_process_env(args.secrets_identity.age_identity.clone());
    let ksops_age_identity = ksops_identity(inv, args.ksops_age_identity.as_deref(), &sources)?;
    if let Some(helm) = &args.helm {
        check_helm(helm)?;
    }
    let secrets = super::secrets::load_bundle(inv, &sources)
        .map_err(|e| StartError::Provisioning(e.to_string()))?;
    let path = args
        .talosconfig
        .clone()
        .unwrap_or_else(|| args.configs.join("talosconfig"));
    let yaml = std::fs::read_to_string(&path).map_err(|e| {
        StartError::Provisioning(format!(
            "cannot read talosconfig {}: {e}; write it with `talboot gen -c {} -o {}`",
            path.display(),
            args.inventory.config.display(),
            args.configs.display()
        ))
    })?;
    let creds = crate::talos::ClientCreds::from_talosconfig(&yaml, Some(inv.cluster.name.as_str()))
        .map_err(|e| StartError::Provisioning(format!("{}: {e}", path.display())))?;
    // Every config push delivery will send, rendered and validated now: a config Talos would
    // refuse stops serve before any machine boots.
    let rendered =
        crate::machineconfig::rendered::render_all(inv, &secrets, schema).map_err(|problems| {
            StartError::Configs {
                schema: schema.source_name().to_owned(),
                problems,
            }
        })?;
    for w in &rendered.warnings {
        tracing::warn!("{w}");
    }
    let renderer = Arc::new(crate::provision::BundleRenderer::new(inv.clone(), secrets));
    Ok(ProvisioningInputs {
        renderer,
        creds,
        ksops_age_identity,
    })
}

/// Pull delivery releases the files `talboot gen -o` wrote: validate each one that is there
/// (a node whose file is missing cannot be provisioned, which the HTTP side reports).
fn validate_pull_configs(
    dir: &Path,
    inv: &Inventory,
    schema: &crate::machineconfig::schema::Schema,
) -> Result<(), StartError> {
    let mut problems = Vec::new();
    let mut deprecated = Vec::new();
    for node in &inv.nodes {
        let name = &node.name.value;
        let path = dir.join(format!("{name}.yaml"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            tracing::warn!(file = %path.display(), node = %name, "no rendered config for this node; run `talboot gen -o`");
            continue;
        };
        match crate::machineconfig::patch::ConfigBundle::parse(&text) {
            Ok(bundle) => {
                let report = schema.validate(name, &bundle);
                problems.extend(
                    report
                        .violations
                        .iter()
                        .map(|v| format!("{}: {v}", path.display())),
                );
                deprecated.extend(report.deprecated);
            }
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    for w in crate::machineconfig::rendered::deprecation_warnings(&deprecated) {
        tracing::warn!("{w}");
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(StartError::Configs {
            schema: schema.source_name().to_owned(),
            problems,
        })
    }
}

pub(crate) async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
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
}

/// Switch to `user` (and its primary group, with no supplementary groups).
pub(crate) fn drop_privileges(user: &str) -> Result<(), StartError> {
    use nix::unistd::{User, setgid, setgroups, setuid};
    let err = |cause: String| StartError::Privileges {
        user: user.to_string(),
        cause,
    };
    let u = User::from_name(user)
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err("no such user".into()))?;
    setgroups(&[]).map_err(|e| err(format!("setgroups: {e}")))?;
    setgid(u.gid).map_err(|e| err(format!("setgid: {e}")))?;
    setuid(u.uid).map_err(|e| err(format!("setuid: {e}")))?;
    tracing::info!(user, uid = u.uid.as_raw(), "dropped privileges");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_configs_are_validated_before_serving() {
        let inv = inventory::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"))
            .unwrap()
            .inventory;
        let schema = crate::machineconfig::schema::embedded();
        let dir = tempfile::tempdir().unwrap();
        // No files yet: nothing to validate (the HTTP side refuses missing configs).
        assert!(validate_pull_configs(dir.path(), &inv, &schema).is_ok());
        std::fs::write(
            dir.path().join("k8s-ctrl-01.yaml"),
            "version: v1alpha1\nmachine:\n  type: controlplane\n---\n\
             apiVersion: v1alpha1\nkind: TimeSyncConfig\nntp: {servers: [10.0.40.1]}\n",
        )
        .unwrap();
        assert!(validate_pull_configs(dir.path(), &inv, &schema).is_ok());
        std::fs::write(
            dir.path().join("k8s-ctrl-02.yaml"),
            "version: v1alpha1\nmachine:\n  type: controlplane\n  install: {wipe: sometimes}\n",
        )
        .unwrap();
        let err = validate_pull_configs(dir.path(), &inv, &schema).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StartError::Configs { .. }), "{msg}");
        assert!(
            msg.contains("k8s-ctrl-02.yaml: node k8s-ctrl-02: v1alpha1 `machine.install.wipe`:"),
            "{msg}"
        );
        assert!(
            !msg.contains("sometimes") && !msg.contains("k8s-ctrl-01"),
            "{msg}"
        );
    }

    #[test]
    fn block_size_fits_the_mtu() {
        assert_eq!(max_blksize_for_mtu(1500), 1468);
        assert_eq!(max_blksize_for_mtu(9000), 8968);
        assert_eq!(max_blksize_for_mtu(65536), 65464);
        assert_eq!(max_blksize_for_mtu(100), 512);
    }

    fn lab(ksops: bool) -> Inventory {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
        let mut inv = inventory::load_with_env(&path, &std::collections::BTreeMap::new())
            .unwrap()
            .inventory;
        inv.addons.argocd.as_mut().unwrap().ksops = ksops;
        inv
    }

    fn new_key() -> String {
        use ::age::secrecy::ExposeSecret;
        ::age::x25519::Identity::generate()
            .to_string()
            .expose_secret()
            .to_owned()
    }

    #[test]
    fn ksops_identity_from_the_flag_is_checked_and_passed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let none = IdentitySources::default();
        let key = new_key();
        let good = dir.path().join("ksops.txt");
        let text = format!("# created: today\n{key}\n");
        std::fs::write(&good, &text).unwrap();
        let got = ksops_identity(&lab(true), Some(&good), &none)
            .unwrap()
            .expect("KSOPS is on");
        assert_eq!(got.expose(), text.as_bytes());
        assert!(!format!("{got:?}").contains(&key));
        // Off: checked, but not carried.
        assert!(
            ksops_identity(&lab(false), Some(&good), &none)
                .unwrap()
                .is_none()
        );

        for (name, content, why) in [
            (
                "comments.txt",
                "# nothing here\n".to_owned(),
                "holds no AGE-SECRET-KEY-1",
            ),
            (
                "public.txt",
                "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p\n".to_owned(),
                "line 1 is not an X25519 age identity",
            ),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            let err = ksops_identity(&lab(true), Some(&p), &none)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&p.display().to_string())
                    && err.contains("--ksops-age-identity")
                    && err.contains(why),
                "{err}"
            );
        }
        let missing = dir.path().join("absent.txt");
        let err = ksops_identity(&lab(true), Some(&missing), &none)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("absent.txt") && err.contains("cannot be read"),
            "{err}"
        );
    }

    #[test]
    fn ksops_identity_falls_back_to_the_bundle_identities_or_refuses() {
        let none = IdentitySources::default();
        assert!(ksops_identity(&lab(false), None, &none).unwrap().is_none());
        let err = ksops_identity(&lab(true), None, &none)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--ksops-age-identity FILE") && err.contains("addons.argocd.ksops"),
            "{err}"
        );

        let key = new_key();
        let sources = IdentitySources {
            sops_age_key: Some(zeroize::Zeroizing::new(key.clone())),
            ..IdentitySources::default()
        };
        let got = ksops_identity(&lab(true), None, &sources)
            .unwrap()
            .expect("identity from SOPS_AGE_KEY");
        assert_eq!(got.expose(), format!("{key}\n").as_bytes());
        let mut settings = crate::provision::Settings::new("/tmp".into());
        settings.ksops_age_identity = Some(got);
        assert!(!format!("{settings:?}").contains(&key));
    }
}
