//! `talboot serve`: the appliance. Loads and checks everything first (inventory, boot artifacts,
//! iPXE binaries, state store), binds every privileged socket, optionally drops privileges, then
//! runs the network servers until SIGINT or SIGTERM and shuts them down gracefully.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::artifacts::{self, Catalog, SetId};
use crate::crypto::age::{Identities, IdentitySources, Secret};
use crate::dhcp::{self, BootTargets, DecideCtx, FloodConfig, server::DhcpServer};
use crate::events::{Clock, EventBus, EventKind, SystemClock};
use crate::http::{self, ConfigDir, HttpApp, script::Scripts};
use crate::inventory::{self, Inventory, NetworkMode, UnknownPolicy};
use crate::store::{self, Store};
use crate::tftp::{TftpConfig, TftpServer, TransferOutcome};

use super::{EXIT_INVALID, EXIT_USAGE};

/// The first-stage iPXE binaries a PXE firmware fetches over TFTP.
pub const IPXE_BINARIES: [&str; 3] = ["undionly.kpxe", "ipxe.efi", "snponly.efi"];

/// Where Debian's `ipxe` package installs them.
pub const DEFAULT_IPXE_DIR: &str = "/usr/lib/ipxe";

/// Arguments of `talboot serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Inventory file.
    #[arg(
        short = 'c',
        long = "config",
        env = "TALBOOT_CONFIG",
        default_value = "talboot.yaml"
    )]
    pub config: PathBuf,
    /// State directory (leases, node records, events, tokens).
    #[arg(long, env = "TALBOOT_STATE_DIR", default_value = store::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Boot artifact cache (see `talboot images`).
    #[arg(long, env = "TALBOOT_IMAGES", default_value = "images")]
    pub images: PathBuf,
    /// Folder with the iPXE binaries served over TFTP (undionly.kpxe, ipxe.efi, snponly.efi).
    #[arg(long, env = "TALBOOT_IPXE_DIR", default_value = DEFAULT_IPXE_DIR)]
    pub ipxe_dir: PathBuf,
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
    /// HTTP port.
    #[arg(long, default_value_t = 8080)]
    pub http_port: u16,
    /// TFTP port.
    #[arg(long, default_value_t = 69)]
    pub tftp_port: u16,
    /// Do not run the TFTP server (every machine boots iPXE from its NIC ROM or HTTP boot).
    #[arg(long)]
    pub no_tftp: bool,
    /// Do not run the DHCP server (another DHCP server hands out the boot options).
    #[arg(long)]
    pub no_dhcp: bool,
    /// Drop to this user after binding the privileged ports.
    #[arg(long)]
    pub user: Option<String>,
    /// Do not provision nodes over the Talos API (push delivery): serve boot files only.
    #[arg(long)]
    pub no_provision: bool,
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
    /// age identity file for Argo CD's `sops-age` Secret when addons.argocd.ksops is on
    /// (default: the identities that decrypt the secrets bundle).
    #[arg(long, env = "TALBOOT_KSOPS_AGE_IDENTITY")]
    pub ksops_age_identity: Option<PathBuf>,
    /// age identity file that decrypts the secrets bundle (also `SOPS_AGE_KEY_FILE`,
    /// `SOPS_AGE_KEY`, the user's sops keys.txt).
    #[arg(long)]
    pub age_identity: Option<PathBuf>,
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
pub enum StartError {
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
    /// A socket cannot be bound.
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        /// What.
        addr: String,
        /// Why.
        cause: String,
    },
    /// Push provisioning cannot start (secrets bundle or talosconfig).
    #[error("push provisioning: {0}; pass --no-provision to serve boot files only")]
    Provisioning(String),
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

impl StartError {
    fn exit_code(&self) -> ExitCode {
        match self {
            StartError::Inventory(inventory::LoadError::Io { .. }, _) => ExitCode::from(EXIT_USAGE),
            StartError::Bind { .. } | StartError::Privileges { .. } => ExitCode::from(EXIT_USAGE),
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

/// Every boot set the inventory can ask for: each node's architecture, plus the default
/// architecture when unknown machines are booted for discovery.
pub fn required_sets(inv: &Inventory) -> Vec<SetId> {
    let talos = &inv.cluster.talos_version.value;
    let schematic = inv.cluster.installer.schematic_id();
    let mut arches: Vec<inventory::Arch> = inv.nodes.iter().map(|n| inv.arch_of(n)).collect();
    if inv.boot.unknown_machines == UnknownPolicy::Discover {
        arches.push(inv.boot.default_arch);
    }
    arches.sort();
    arches.dedup();
    arches
        .into_iter()
        .map(|a| SetId::new(talos, schematic, a))
        .collect()
}

/// iPXE binaries missing from `dir`.
pub fn missing_ipxe_binaries(dir: &Path) -> Vec<&'static str> {
    IPXE_BINARIES
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect()
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
pub fn max_blksize_for_mtu(mtu: u32) -> u16 {
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
    crate::install_crypto_provider();
    let loaded =
        inventory::load(&args.config).map_err(|e| StartError::Inventory(e, args.config.clone()))?;
    for w in loaded.warnings.sorted() {
        tracing::warn!("{w}");
    }
    let inv = Arc::new(loaded.inventory);

    // Refuse to start rather than boot machines into a missing or damaged kernel.
    let catalog = Catalog::load(&args.images)?;
    for id in required_sets(&inv) {
        artifacts::verify(&args.images, &catalog, &id)?;
    }
    if !args.no_tftp {
        let missing = missing_ipxe_binaries(&args.ipxe_dir);
        if !missing.is_empty() {
            tracing::warn!(
                dir = %args.ipxe_dir.display(),
                missing = %missing.join(", "),
                "iPXE binaries missing: PXE firmware that needs them cannot boot (install Debian's `ipxe` package or set --ipxe-dir)"
            );
        }
    }
    let advertise = advertise_address(&args, &inv)?;
    let push = inv.boot.delivery == inventory::Delivery::Push && !args.no_provision;
    // Everything push provisioning needs is loaded up front, so a missing key or talosconfig
    // stops `serve` now rather than when the first machine boots.
    let provisioning = if push {
        let inputs = provisioning_inputs(&args, &inv)?;
        let mut settings = crate::provision::Settings::new(args.state_dir.clone());
        settings.addon_manifests = args.addon_manifests.clone();
        settings.helm = args.helm.clone();
        settings.ksops_age_identity = inputs.ksops_age_identity;
        Some(ProvisioningPlan {
            renderer: inputs.renderer,
            creds: inputs.creds,
            settings,
        })
    } else {
        None
    };
    let dhcp = if args.no_dhcp {
        None
    } else {
        let iface = serving_interface(&args, &inv).ok_or_else(|| StartError::Bind {
            addr: "udp 0.0.0.0:67".into(),
            cause: "no interface to serve DHCP on; set network.interfaces or pass --interface"
                .into(),
        })?;
        let ports = match inv.network.mode {
            NetworkMode::Proxy => vec![dhcp::server::DHCP_PORT, dhcp::server::PXE_PORT],
            NetworkMode::Authoritative => vec![dhcp::server::DHCP_PORT],
        };
        Some(DhcpPlan::Interface { iface, ports })
    };
    let tftp = (!args.no_tftp).then(|| {
        let max_blksize = serving_interface(&args, &inv)
            .and_then(|i| interface_mtu(&i))
            .map(max_blksize_for_mtu)
            .unwrap_or(TftpConfig::default().max_blksize);
        (
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.tftp_port),
            max_blksize,
        )
    });
    let plan = Plan {
        inventory: inv,
        catalog,
        images_dir: args.images.clone(),
        ipxe_dir: args.ipxe_dir.clone(),
        configs: args.configs.clone(),
        state_dir: args.state_dir.clone(),
        advertise,
        http: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.http_port),
        tftp,
        dhcp,
        provisioning,
    };

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
        cause: e,
    })
}

/// Everything `serve` runs, decided (and checked) before any socket is bound. `talboot demo`
/// builds one for loopback.
pub struct Plan {
    /// The validated inventory.
    pub inventory: Arc<Inventory>,
    /// The verified boot artifact catalog.
    pub catalog: Catalog,
    /// Where the artifacts are.
    pub images_dir: PathBuf,
    /// TFTP root (iPXE binaries).
    pub ipxe_dir: PathBuf,
    /// Rendered configs for pull delivery.
    pub configs: PathBuf,
    /// State directory (the store).
    pub state_dir: PathBuf,
    /// The address machines reach talboot at.
    pub advertise: Ipv4Addr,
    /// HTTP listen address (port 0 picks one).
    pub http: SocketAddr,
    /// TFTP listen address and block size cap, if TFTP runs.
    pub tftp: Option<(SocketAddr, u16)>,
    /// DHCP, if it runs.
    pub dhcp: Option<DhcpPlan>,
    /// Push provisioning, if it runs.
    pub provisioning: Option<ProvisioningPlan>,
}

/// Where DHCP listens.
pub enum DhcpPlan {
    /// A real segment: `0.0.0.0` on these ports, pinned to the interface.
    Interface {
        /// Interface name.
        iface: String,
        /// 67, and 4011 in proxy mode.
        ports: Vec<u16>,
    },
    /// The unprivileged loopback transport of the simulation (replies go to the source).
    Loopback(std::net::SocketAddrV4),
}

/// What push provisioning needs.
pub struct ProvisioningPlan {
    /// Machine config renderer.
    pub renderer: Arc<dyn crate::provision::ConfigRenderer>,
    /// Admin Talos credentials.
    pub creds: crate::talos::ClientCreds,
    /// Provisioner knobs.
    pub settings: crate::provision::Settings,
}

/// A plan whose sockets are bound; [`Bound::start`] runs it.
pub struct Bound {
    plan: Plan,
    store: Arc<dyn Store>,
    http: tokio::net::TcpListener,
    tftp: Option<tokio::net::UdpSocket>,
    dhcp: Option<DhcpServer>,
}

impl Plan {
    /// Opens the store and binds every socket of the plan, all before any privilege drop
    /// (the state directory may be root's to create; ports below 1024 need root or
    /// capabilities).
    pub async fn bind(self) -> Result<Bound, StartError> {
        let store: Arc<dyn Store> = Arc::new(store::open(&self.state_dir)?);
        let http = tokio::net::TcpListener::bind(self.http)
            .await
            .map_err(|e| StartError::Bind {
                addr: format!("tcp {}", self.http),
                cause: e.to_string(),
            })?;
        let tftp = match self.tftp {
            None => None,
            Some((addr, _)) => {
                Some(TftpServer::bind(addr).await.map_err(|e| StartError::Bind {
                    addr: format!("udp {addr}"),
                    cause: e.to_string(),
                })?)
            }
        };
        let dhcp = match &self.dhcp {
            None => None,
            Some(DhcpPlan::Interface { iface, ports }) => {
                Some(DhcpServer::bind(iface, self.advertise, ports).map_err(|e| {
                    StartError::Bind {
                        addr: format!("udp 0.0.0.0:67 on {iface}"),
                        cause: e.to_string(),
                    }
                })?)
            }
            Some(DhcpPlan::Loopback(addr)) => Some(DhcpServer::bind_loopback(*addr).map_err(
                |e| StartError::Bind {
                    addr: format!("udp {addr}"),
                    cause: e.to_string(),
                },
            )?),
        };
        Ok(Bound {
            plan: self,
            store,
            http,
            tftp,
            dhcp,
        })
    }
}

impl Bound {
    /// The bound HTTP address.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.local_addr().ok()
    }

    /// The bound TFTP address.
    pub fn tftp_addr(&self) -> Option<SocketAddr> {
        self.tftp.as_ref().and_then(|s| s.local_addr().ok())
    }

    /// The bound DHCP address (first socket).
    pub fn dhcp_addr(&self) -> Option<SocketAddr> {
        self.dhcp.as_ref().and_then(|d| d.local_addr().ok())
    }

    /// Runs every server (and the provisioner) until [`Running::cancel`] fires.
    pub fn start(self) -> Result<Running, StartError> {
        let Bound {
            plan,
            store,
            http,
            tftp,
            dhcp,
        } = self;
        let inv = plan.inventory.clone();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (events, event_writer) = EventBus::start(store.clone(), clock.clone());
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| tracing::debug!(error = %e, "metrics recorder not installed"))
            .ok();
        let http_port = http.local_addr().map(|a| a.port()).unwrap_or(0);
        let base_url = if http_port == 80 {
            format!("http://{}", plan.advertise)
        } else {
            format!("http://{}:{http_port}", plan.advertise)
        };
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();

        let app = Arc::new(HttpApp {
            inventory: inv.clone(),
            store: store.clone(),
            events: events.clone(),
            images_dir: plan.images_dir.clone(),
            catalog: plan.catalog,
            base_url: base_url.clone(),
            scripts: Scripts::new(),
            configs: Arc::new(ConfigDir(plan.configs.clone())),
            metrics,
        });
        {
            let cancel = cancel.clone();
            tasks.spawn(async move {
                http::serve(http, http::router(app), cancel)
                    .await
                    .map_err(|e| format!("http: {e}"))
            });
        }

        if let (Some(socket), Some((_, max_blksize))) = (tftp, plan.tftp) {
            let (tx, rx) = tokio::sync::mpsc::channel(1024);
            let config = TftpConfig {
                max_blksize,
                ..TftpConfig::default()
            };
            tracing::info!(max_blksize = config.max_blksize, "TFTP block size cap");
            let server = TftpServer::new(config, &plan.ipxe_dir)
                .map_err(|e| StartError::Bind {
                    addr: format!("tftp root {}", plan.ipxe_dir.display()),
                    cause: e.to_string(),
                })?
                .with_events(tx);
            let c = cancel.clone();
            tasks.spawn(async move {
                server
                    .serve(socket, c)
                    .await
                    .map_err(|e| format!("tftp: {e}"))
            });
            tasks.spawn(publish_tftp_events(
                rx,
                store.clone(),
                inv.clone(),
                events.clone(),
            ));
        }

        if let Some(server) = dhcp {
            let ctx = DecideCtx::from_inventory(
                &inv,
                plan.advertise,
                BootTargets::standard(plan.advertise, http_port),
            );
            let (store, events, c) = (store.clone(), events.clone(), cancel.clone());
            tasks.spawn(async move {
                server
                    .run(ctx, FloodConfig::default(), store, events, c)
                    .await
                    .map_err(|e| format!("dhcp: {e}"))
            });
        } else {
            tracing::info!(
                "DHCP disabled (--no-dhcp): another DHCP server must point machines at talboot"
            );
        }

        if let Some(p) = plan.provisioning {
            let provisioner = crate::provision::Provisioner::new(
                inv.clone(),
                store.clone(),
                events.clone(),
                p.renderer,
                p.creds,
                p.settings,
            );
            let c = cancel.clone();
            tasks.spawn(async move {
                provisioner.run(c).await;
                Ok(())
            });
            tracing::info!("push provisioning running");
        }

        tracing::info!(
            advertise = %plan.advertise,
            http = %base_url,
            tftp = plan.tftp.is_some(),
            nodes = inv.nodes.len(),
            "talboot serving"
        );
        Ok(Running {
            cancel,
            tasks,
            events,
            event_writer,
            store,
            base_url,
            node_count: inv.nodes.len(),
        })
    }
}

/// The running appliance.
pub struct Running {
    /// Cancel to shut everything down gracefully.
    pub cancel: CancellationToken,
    /// The event bus (subscribe to watch progress).
    pub events: EventBus,
    /// The state store.
    pub store: Arc<dyn Store>,
    /// `http://advertise:port`.
    pub base_url: String,
    /// Inventory nodes served.
    pub node_count: usize,
    tasks: JoinSet<Result<(), String>>,
    event_writer: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Waits until every server stopped (after [`Running::cancel`], or a server failing,
    /// which cancels the rest), then flushes the event log. The first failure is returned.
    pub async fn wait(self) -> Result<(), String> {
        let Running {
            cancel,
            events,
            mut tasks,
            event_writer,
            store,
            ..
        } = self;
        let mut failure = None;
        while let Some(res) = tasks.join_next().await {
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "server stopped");
                    failure.get_or_insert(e);
                    cancel.cancel();
                }
                Err(e) if e.is_cancelled() => {}
                Err(e) => {
                    failure.get_or_insert(format!("task panicked: {e}"));
                    cancel.cancel();
                }
            }
        }
        drop(events);
        let _ = event_writer.await;
        // A blocking store call started by a task that was aborted mid-await runs to its end
        // and holds the store until then; the file lock goes with the last reference, and a
        // restart must find it released.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while Arc::strong_count(&store) > 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(store);
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Publishes finished TFTP transfers as node events (the node found by its lease address).
async fn publish_tftp_events(
    mut rx: tokio::sync::mpsc::Receiver<crate::tftp::TransferEvent>,
    store: Arc<dyn Store>,
    inv: Arc<Inventory>,
    events: EventBus,
) -> Result<(), String> {
    while let Some(ev) = rx.recv().await {
        let node = crate::events::node_key_by_peer(store.as_ref(), &inv, ev.peer.ip());
        match &ev.outcome {
            TransferOutcome::Completed => events.publish(
                &node,
                EventKind::TftpFile,
                format!("{} ({} bytes) to {}", ev.file, ev.bytes, ev.peer),
            ),
            // The UEFI size probe ends with the client's ERROR 8; not a failure.
            TransferOutcome::PeerAborted { .. } => {}
            other => events.publish(
                &node,
                EventKind::TftpFailed,
                format!("{} to {}: {}", ev.file, ev.peer, other.label()),
            ),
        }
    }
    Ok(())
}

/// Renders machine configs from the inventory and the decrypted secrets bundle.
pub struct BundleRenderer {
    inventory: Arc<Inventory>,
    secrets: crate::machineconfig::secrets::SecretsBundle,
}

impl BundleRenderer {
    /// A renderer for `inventory`'s nodes with `secrets`.
    pub fn new(
        inventory: Arc<Inventory>,
        secrets: crate::machineconfig::secrets::SecretsBundle,
    ) -> Self {
        Self { inventory, secrets }
    }
}

impl crate::provision::ConfigRenderer for BundleRenderer {
    fn render(&self, node: &inventory::Node) -> Result<Vec<u8>, String> {
        let bundle =
            crate::machineconfig::render::render_node(&self.inventory, &self.secrets, node)
                .map_err(|e| e.to_string())?;
        bundle
            .to_yaml()
            .map(String::into_bytes)
            .map_err(|e| e.to_string())
    }
}

/// What push provisioning needs, loaded before anything is served.
struct ProvisioningInputs {
    renderer: Arc<dyn crate::provision::ConfigRenderer>,
    creds: crate::talos::ClientCreds,
    ksops_age_identity: Option<Arc<Secret>>,
}

/// The age identity (keys.txt text) for Argo CD's `sops-age` Secret: the
/// `--ksops-age-identity` file if given, else (when `addons.argocd.ksops` is on) the
/// identities `sources` yield, the ones that decrypt the secrets bundle. `None` when KSOPS is
/// off. The file must hold at least one `AGE-SECRET-KEY-1…` identity; errors name the file or
/// the flag, never key material.
pub fn ksops_identity(
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
) -> Result<ProvisioningInputs, StartError> {
    let sources = IdentitySources::from_process_env(args.age_identity.clone());
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
            args.config.display(),
            args.configs.display()
        ))
    })?;
    let creds = crate::talos::ClientCreds::from_talosconfig(&yaml, Some(inv.cluster.name.as_str()))
        .map_err(|e| StartError::Provisioning(format!("{}: {e}", path.display())))?;
    let renderer = Arc::new(BundleRenderer {
        inventory: inv.clone(),
        secrets,
    });
    Ok(ProvisioningInputs {
        renderer,
        creds,
        ksops_age_identity,
    })
}

async fn wait_for_signal() {
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
fn drop_privileges(user: &str) -> Result<(), StartError> {
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
