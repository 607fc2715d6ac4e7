//! The appliance: talboot's network servers (HTTP, TFTP, DHCP), the event bus and the push
//! provisioner wired together over one store, as `talboot serve` runs them and `talboot demo`
//! reuses them. A [`Plan`] says what runs where (decided and checked by the caller);
//! [`Plan::bind`] opens the store and binds every socket (before any privilege drop);
//! [`Bound::start`] spawns every long-running task (servers, provisioner, drift watcher,
//! power-on round) into one set; [`Running::wait`] joins them after [`Running::cancel`] fires
//! or a task fails, and returns once the store is released, so nothing the appliance started
//! outlives it.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admin::ha::HaSource;
use crate::artifacts::{Catalog, Kind};
use crate::dhcp::server::DhcpServer;
use crate::events::{Clock, EventBus, SystemClock};
use crate::firststage::{self, FirstStage, Transport};
use crate::http::{self, ConfigDir, HttpApp, script::Scripts};
use crate::inventory::Inventory;
use crate::store::{self, Store};
use crate::tftp::{TftpConfig, TftpServer};
use spawn::{BootServers, Workers, spawn_admin, spawn_boot_servers, spawn_http};

mod etcd_health;
mod leader;
mod spawn;

/// How long the servers get to drain after shutdown begins before they are aborted.
pub(crate) const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Why the appliance could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApplianceError {
    /// The store cannot be opened.
    #[error("{0}")]
    Store(#[from] store::StoreError),
    /// An iPXE binary the inventory needs cannot be served.
    #[error("{0}")]
    Ipxe(#[from] crate::firststage::Unservable),
    /// A socket cannot be bound (or the TFTP root cannot be used).
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        /// What.
        addr: String,
        /// Why.
        #[source]
        cause: BindCause,
    },
}

/// Why a socket of the plan cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum BindCause {
    /// The admin API was asked for on a non-loopback address without a token.
    #[error(
        "the admin API lists every node and can wipe one, so off loopback it needs a token: \
         pass --admin-token-file FILE (a file of mode 0600 holding e.g. `openssl rand -hex 32`), \
         or give --admin-listen a 127.0.0.0/8 or ::1 address and reach it through SSH"
    )]
    AdminNotLoopback,
    /// The OS refused a TCP listener.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The TFTP socket or configuration.
    #[error(transparent)]
    Tftp(#[from] crate::tftp::ServerError),
    /// The DHCP sockets.
    #[error(transparent)]
    Dhcp(#[from] crate::dhcp::server::ServerError),
    /// The ICMPv6 socket for router advertisements.
    #[error(transparent)]
    Ra(#[from] crate::ndp::RaError),
}

/// Why a server stopped on its own (which stops the others): what [`Running::wait`] returns.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServerFailure {
    /// The provisioning HTTP server.
    #[error("http: {0}")]
    Http(#[source] std::io::Error),
    /// The admin HTTP server.
    #[error("admin http: {0}")]
    Admin(#[source] std::io::Error),
    /// The TFTP server.
    #[error("tftp: {0}")]
    Tftp(#[source] crate::tftp::ServerError),
    /// The DHCP server.
    #[error("dhcp: {0}")]
    Dhcp(#[source] crate::dhcp::server::ServerError),
    /// A task panicked.
    #[error("task panicked: {0}")]
    Panicked(#[source] tokio::task::JoinError),
    /// This appliance led the fleet and no longer does ([`leader`]): it stops, to be
    /// restarted as a follower.
    #[error("leadership lost: {0}")]
    LeadershipLost(#[source] store::election::Lost),
    /// Newly elected, this appliance could not read the store to start its workers.
    #[error("cannot start leading: {0}")]
    Leading(#[source] Box<ApplianceError>),
}

/// Everything the appliance runs, decided (and checked) before any socket is bound. `serve`
/// builds one from its flags, `talboot demo` one for loopback.
pub(crate) struct Plan {
    /// The validated inventory.
    pub inventory: Arc<Inventory>,
    /// The verified boot artifact catalog.
    pub catalog: Catalog,
    /// Where the artifacts are.
    pub images_dir: PathBuf,
    /// The iPXE binaries' directory, read once by [`Plan::bind`] (see [`crate::firststage`]).
    pub(crate) ipxe_dir: PathBuf,
    /// Rendered configs for pull delivery.
    pub configs: PathBuf,
    /// Where the state is kept: the redb file in the state directory, or a shared etcd.
    pub store: store::StoreSpec,
    /// This appliance's name among those sharing one etcd store (`serve --name`, default
    /// the host name): its `members/<name>` key and what status shows.
    #[allow(dead_code)] // read by the HA lanes (issue 28) as they land
    pub name: String,
    /// The address machines reach talboot at.
    pub advertise: Ipv4Addr,
    /// HTTP listen address of the provisioning side (port 0 picks one).
    pub http: SocketAddr,
    /// Listen address of the admin API (`/api/*`, `/metrics`): loopback, or another address
    /// only with [`Plan::admin_token`] (checked by [`Plan::bind`]).
    pub admin: SocketAddr,
    /// The token every admin request from off loopback must carry
    /// ([`crate::admin::auth`]).
    pub admin_token: Option<Arc<crate::admin::auth::AdminToken>>,
    /// Host names the admin listener answers to besides addresses (`serve --admin-host`).
    pub(crate) admin_hosts: Arc<crate::admin::dashboard::AdminHosts>,
    /// Timeouts and connection cap of both HTTP listeners (`serve --http-*`).
    pub(crate) http_limits: http::server::Limits,
    /// TFTP listen address and settings, if TFTP runs.
    pub tftp: Option<(SocketAddr, TftpConfig)>,
    /// DHCP, if it runs.
    pub dhcp: Option<DhcpPlan>,
    /// Push provisioning, if it runs.
    pub provisioning: Option<ProvisioningPlan>,
    /// The interface to send "no IPv6 router" advertisements on (`serve --ipv6-ra`).
    pub ipv6_ra: Option<String>,
    /// The drift watcher, if it runs (`serve --drift-interval`, with push provisioning).
    pub drift: Option<DriftPlan>,
    /// One power-on round once serving, if asked for (`serve --power-on`).
    pub power_on: Option<PowerOnPlan>,
}

/// What the drift watcher checks, and how often ([`crate::daytwo::drift::watch`]).
pub(crate) struct DriftPlan {
    /// How to reach the nodes.
    pub connector: crate::daytwo::plan::Connector,
    /// What each node should run.
    pub targets: Vec<crate::daytwo::plan::NodeTarget>,
    /// Time between two checks (the first one interval after start).
    pub interval: Duration,
}

/// A power-on round ([`crate::power::round`]), planned by [`Bound::start`] from the store as
/// it finds it, so a node that boots meanwhile is not powered on again.
pub(crate) struct PowerOnPlan {
    /// The power drivers (credentials resolved once), shared with the provisioner.
    pub drivers: Arc<BTreeMap<String, crate::power::PowerDriver>>,
    /// Pause between two nodes' power-on (inrush current).
    pub stagger: Duration,
}

/// Where DHCP listens.
pub(crate) enum DhcpPlan {
    /// A real segment: `0.0.0.0` on these ports, pinned to the interface.
    Interface {
        /// Interface name.
        iface: String,
        /// 67, and 4011 in proxy mode.
        ports: Vec<u16>,
    },
    /// The unprivileged loopback transport of the simulation (replies go to the source).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    Loopback(std::net::SocketAddrV4),
}

/// What push provisioning needs.
pub(crate) struct ProvisioningPlan {
    /// Machine config renderer.
    pub renderer: Arc<dyn crate::machineconfig::renderer::ConfigRenderer>,
    /// Admin Talos credentials.
    pub creds: crate::talos::ClientCreds,
    /// Provisioner knobs.
    pub settings: crate::provision::Settings,
}

/// A plan whose sockets are bound; [`Bound::start`] runs it.
pub struct Bound {
    plan: Plan,
    ipxe: Arc<FirstStage>,
    store: Arc<dyn Store>,
    writers: store::Writers,
    /// The etcd backend when the state is shared (HA), for membership, election, watches.
    etcd: Option<Arc<store::EtcdStore>>,
    view: Arc<crate::view::StateView>,
    store_closed: store::Closed,
    http: tokio::net::TcpListener,
    admin: tokio::net::TcpListener,
    tftp: Option<tokio::net::UdpSocket>,
    dhcp: Option<DhcpServer>,
    ra: Option<crate::ndp::Advertiser>,
}

impl Plan {
    /// Opens the store and binds every socket of the plan, all before any privilege drop
    /// (the state directory may be root's to create; ports below 1024 need root or
    /// capabilities).
    pub async fn bind(self) -> Result<Bound, ApplianceError> {
        if !self.admin.ip().is_loopback() && self.admin_token.is_none() {
            // Without a token, refuse rather than serve node MACs and rebuilds to a network.
            return Err(ApplianceError::Bind {
                addr: format!("tcp {} (admin API)", self.admin),
                cause: BindCause::AdminNotLoopback,
            });
        }
        let ipxe = Arc::new(self.load_first_stage()?);
        let store::Opened {
            store,
            writers,
            closed: store_closed,
            etcd,
        } = self.store.open()?;
        // The request paths' read view, loaded before any writer starts.
        let view = Arc::new(crate::view::StateView::load(
            store.as_ref(),
            &self.inventory,
        )?);
        let admin = bind_tcp(self.admin, format!("tcp {} (admin API)", self.admin)).await?;
        let http = bind_tcp(self.http, format!("tcp {}", self.http)).await?;
        let tftp = match self.tftp {
            None => None,
            Some((addr, _)) => Some(bind_tftp(addr).await?),
        };
        let dhcp = match &self.dhcp {
            None => None,
            Some(dhcp) => Some(bind_dhcp(dhcp, self.advertise)?),
        };
        let ra = match &self.ipv6_ra {
            None => None,
            Some(iface) => Some(bind_ra(iface)?),
        };
        Ok(Bound {
            ra,
            plan: self,
            ipxe,
            store,
            writers,
            etcd,
            view,
            store_closed,
            http,
            admin,
            tftp,
            dhcp,
        })
    }

    /// The first-stage binaries are read now, as the user that can read them, and a
    /// missing one that machines need stops the start naming the file.
    fn load_first_stage(&self) -> Result<FirstStage, ApplianceError> {
        let transport = match self.tftp {
            Some(_) => Transport::TftpAndHttp,
            None => Transport::HttpOnly,
        };
        Ok(FirstStage::load(
            &self.ipxe_dir,
            &firststage::needed(&self.inventory, transport),
        )?)
    }
}

/// A TCP listener on `addr`, `what` naming it if it cannot be had.
async fn bind_tcp(
    addr: SocketAddr,
    what: String,
) -> Result<tokio::net::TcpListener, ApplianceError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ApplianceError::Bind {
            addr: what,
            cause: e.into(),
        })
}

/// The TFTP socket.
async fn bind_tftp(addr: SocketAddr) -> Result<tokio::net::UdpSocket, ApplianceError> {
    TftpServer::bind(addr)
        .await
        .map_err(|e| ApplianceError::Bind {
            addr: format!("udp {addr}"),
            cause: e.into(),
        })
}

/// The DHCP sockets, on the interface or the loopback transport.
fn bind_dhcp(dhcp: &DhcpPlan, advertise: Ipv4Addr) -> Result<DhcpServer, ApplianceError> {
    match dhcp {
        DhcpPlan::Interface { iface, ports } => {
            DhcpServer::bind(iface, advertise, ports).map_err(|e| ApplianceError::Bind {
                addr: format!("udp 0.0.0.0:67 on {iface}"),
                cause: e.into(),
            })
        }
        DhcpPlan::Loopback(addr) => {
            DhcpServer::bind_loopback(*addr).map_err(|e| ApplianceError::Bind {
                addr: format!("udp {addr}"),
                cause: e.into(),
            })
        }
    }
}

/// The ICMPv6 socket for router advertisements on `iface`.
fn bind_ra(iface: &str) -> Result<crate::ndp::Advertiser, ApplianceError> {
    crate::ndp::Advertiser::bind(iface).map_err(|e| ApplianceError::Bind {
        addr: format!("icmpv6 on {iface}"),
        cause: e.into(),
    })
}

impl Bound {
    /// The bound HTTP address.
    #[cfg(feature = "sim")]
    pub(crate) fn http_addr(&self) -> Option<SocketAddr> {
        self.http.local_addr().ok()
    }

    /// The bound admin API address.
    pub(crate) fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.local_addr().ok()
    }

    /// The bound TFTP address.
    pub(crate) fn tftp_addr(&self) -> Option<SocketAddr> {
        self.tftp.as_ref().and_then(|s| s.local_addr().ok())
    }

    /// The bound DHCP address (first socket).
    pub fn dhcp_addr(&self) -> Option<SocketAddr> {
        self.dhcp.as_ref().and_then(|d| d.local_addr().ok())
    }

    /// Runs every server (and the provisioner, the drift watcher and the power-on round, as
    /// planned) until [`Running::cancel`] fires.
    pub fn start(self) -> Result<Running, ApplianceError> {
        let plan = self.plan;
        // Each table's writer goes to its one owner.
        let w = self.writers;
        let rollouts = Arc::new(w.rollouts);
        // Planned before any task starts, so a store that cannot be read starts nothing.
        let power_on = (plan.power_on)
            .map(|p| plan_power_on(&plan.inventory, self.store.as_ref(), p))
            .transpose()?;
        let (s, event_writer) = Shared::start(plan.inventory, self.store, self.view, w.events);
        let metrics = install_metrics();
        let http_port = self.http.local_addr().map(|a| a.port()).unwrap_or(0);
        let base_url = base_url(plan.advertise, http_port);
        let admin_url = listener_url(&self.admin);
        let mut tasks = JoinSet::new();
        let ha = spawn_etcd_health(&mut tasks, &plan.store, self.etcd.clone(), &s.cancel);

        // The node records' writer, and with it the admin API's rebuilds, go to the provisioner
        // when one runs, else to the offline observer ([`node_writer_owner`]).
        let (commands, command_rx) = crate::provision::command_channel();
        let gate = leader::Gate::new(self.etcd.clone(), (&plan.name, &admin_url), &commands);
        let (observer, rebuilds, provision_writers) = node_writer_owner(
            &s,
            plan.provisioning.is_some(),
            commands,
            w.nodes,
            w.progress,
        );
        let desks = (rebuilds, gate.board(), ha);
        let admin_app = admin_app(&s, plan.provisioning.as_ref(), metrics, desks, &rollouts);
        let app = http_app(
            &s,
            plan.catalog.clone(),
            plan.images_dir.clone(),
            plan.configs,
            base_url.clone(),
            w.tokens,
            observer,
        );
        let limits = plan.http_limits;
        spawn_http(&mut tasks, &s, self.http, app, self.ipxe.clone(), limits);
        let auth = (plan.admin_token, plan.admin_hosts);
        spawn_admin(&mut tasks, &s, self.admin, admin_app, auth, limits);
        let tftp_on = plan.tftp.is_some();
        let boot = BootServers {
            tftp: self.tftp,
            tftp_plan: plan.tftp,
            ipxe: self.ipxe,
            ipxe_dir: &plan.ipxe_dir,
            dhcp: self.dhcp,
            leases: w.leases,
            bindings: w.meta,
            ra: self.ra,
            ha: (self.etcd.clone()).map(|e| (e, spawn::member(&plan.name, &admin_url, &base_url))),
            advertise: plan.advertise,
            http_port,
            ukis: uki_media(&s.inv, &plan.catalog, &plan.images_dir),
        };
        spawn_boot_servers(&mut tasks, &s, boot)?;
        let workers = Workers {
            provisioning: plan.provisioning.zip(provision_writers),
            command_rx,
            drift: plan.drift,
            power_on,
        };
        gate.spawn(&mut tasks, &s, workers);
        tracing::info!(
            advertise = %plan.advertise,
            http = %base_url,
            admin = %admin_url,
            tftp = tftp_on,
            nodes = s.inv.nodes.len(),
            "talboot serving"
        );
        Ok(s.running(
            tasks,
            event_writer,
            rollouts,
            self.store_closed,
            base_url,
            admin_url,
        ))
    }
}

/// What every task [`Bound::start`] spawns shares.
#[derive(Clone)]
struct Shared {
    inv: Arc<Inventory>,
    store: Arc<dyn Store>,
    view: Arc<crate::view::StateView>,
    events: EventBus,
    cancel: CancellationToken,
}

impl Shared {
    /// What the tasks share, with the event bus started on the timelines' writer; the bus's
    /// writer task is returned for [`Running::wait`] to join once every publisher is gone.
    fn start(
        inv: Arc<Inventory>,
        store: Arc<dyn Store>,
        view: Arc<crate::view::StateView>,
        timelines: store::EventWriter,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (events, event_writer) = EventBus::start(timelines, clock);
        let shared = Self {
            inv,
            store,
            view,
            events,
            cancel: CancellationToken::new(),
        };
        (shared, event_writer)
    }

    /// The handle on the started tasks.
    fn running(
        self,
        tasks: Tasks,
        event_writer: tokio::task::JoinHandle<()>,
        rollouts: Arc<store::RolloutWriter>,
        store_closed: store::Closed,
        base_url: String,
        admin_url: String,
    ) -> Running {
        Running {
            cancel: self.cancel,
            tasks: Mutex::new(tasks),
            events: self.events,
            event_writer,
            store: self.store,
            rollouts,
            view: self.view,
            store_closed,
            base_url,
            admin_url,
            node_count: self.inv.nodes.len(),
        }
    }
}

/// The power-on round, planned from the store as it is now.
fn plan_power_on(
    inv: &Inventory,
    store: &dyn Store,
    p: PowerOnPlan,
) -> Result<(Vec<crate::power::round::PowerOnStep>, PowerOnPlan), ApplianceError> {
    let phases = store
        .nodes()?
        .into_iter()
        .map(|r| (r.name, r.phase))
        .collect();
    let kinds = p
        .drivers
        .iter()
        .map(|(name, d)| (name.clone(), d.kind()))
        .collect();
    Ok((crate::power::round::power_on_plan(inv, &phases, &kinds), p))
}

/// On etcd, the health probe ([`etcd_health`]): gauges and a log line per change of verdict;
/// its latest result, with the store, goes to the admin API's `/api/ha`.
fn spawn_etcd_health(
    tasks: &mut Tasks,
    spec: &store::StoreSpec,
    etcd: Option<Arc<store::EtcdStore>>,
    cancel: &CancellationToken,
) -> Option<HaSource> {
    let (store::StoreSpec::Etcd(cfg), Some(etcd)) = (spec, etcd) else {
        return None;
    };
    let (health, probe) = etcd_health::spawn(cfg.clone(), etcd.clone(), cancel.clone());
    tasks.spawn(async move {
        let _ = probe.await;
        Ok(())
    });
    Some(HaSource { etcd, health })
}

/// `http://` and the address `listener` is bound to (empty when the OS cannot say), for the
/// log line and the demo's printout.
fn listener_url(listener: &tokio::net::TcpListener) -> String {
    listener
        .local_addr()
        .map(|a| format!("http://{a}"))
        .unwrap_or_default()
}

/// `http://advertise[:port]`, the port left out when it is 80.
fn base_url(advertise: Ipv4Addr, http_port: u16) -> String {
    if http_port == 80 {
        format!("http://{advertise}")
    } else {
        format!("http://{advertise}:{http_port}")
    }
}

/// The Prometheus recorder behind `/metrics` (one per process: a second start in the same
/// process goes without).
fn install_metrics() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| tracing::debug!(error = %e, "metrics recorder not installed"))
        .ok()
}

/// The boot sets' UKIs (for DHCP), and the same by their TFTP name (the path they have over
/// HTTP) to their files in the artifact cache at `images_dir`.
fn uki_media(
    inv: &Inventory,
    catalog: &Catalog,
    images_dir: &std::path::Path,
) -> (
    std::collections::BTreeMap<crate::inventory::Arch, crate::dhcp::UkiSet>,
    crate::tftp::BootMedia,
) {
    let ukis = crate::dhcp::uki_sets(inv, catalog);
    let mut media = crate::tftp::BootMedia::new();
    for set in ukis.values() {
        for (kind, has) in [(Kind::Uki, set.plain), (Kind::SecureBootUki, set.signed)] {
            if has {
                let name = set.path(kind);
                let file = name.strip_prefix("assets/").unwrap_or(&name);
                media.insert(name.clone(), images_dir.join(file));
            }
        }
    }
    (ukis, media)
}

/// The provisioning listener's state.
fn http_app(
    s: &Shared,
    catalog: Catalog,
    images_dir: PathBuf,
    configs: PathBuf,
    base_url: String,
    tokens: store::TokenWriter,
    observer: Arc<dyn http::BootObserver>,
) -> Arc<HttpApp> {
    Arc::new(HttpApp {
        inventory: s.inv.clone(),
        store: s.store.clone(),
        view: s.view.clone(),
        events: s.events.clone(),
        images_dir,
        catalog,
        cmdlines: Default::default(),
        base_url,
        scripts: Scripts::new(),
        configs: Arc::new(ConfigDir(configs)),
        tokens: http::tokens::Tokens::start(s.store.clone(), tokens).0,
        observer,
    })
}

/// Who owns the node records' writer, and so records what the provisioning listener sees
/// machines do and carries out the admin API's rebuilds: the provisioner when one runs (it
/// learns of a boot from the script event), otherwise the offline observer.
fn node_writer_owner(
    s: &Shared,
    provisioning: bool,
    commands: crate::provision::CommandSender,
    nodes: store::NodeWriter,
    progress: store::ProgressWriter,
) -> (
    Arc<dyn http::BootObserver>,
    crate::provision::Rebuilds,
    Option<crate::provision::ProvisionWriters>,
) {
    if provisioning {
        (
            Arc::new(crate::provision::ProvisionerObserves),
            crate::provision::Rebuilds::Provisioner(commands),
            Some(crate::provision::ProvisionWriters { nodes, progress }),
        )
    } else {
        let offline = Arc::new(crate::provision::OfflineObserver {
            inventory: s.inv.clone(),
            store: s.store.clone(),
            nodes: Arc::new(nodes),
            view: s.view.clone(),
        });
        (
            offline.clone(),
            crate::provision::Rebuilds::Offline(offline),
            None,
        )
    }
}

/// The admin API's state.
fn admin_app(
    s: &Shared,
    provisioning: Option<&ProvisioningPlan>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    (rebuilds, leader, ha): (
        crate::provision::Rebuilds,
        Option<Arc<store::election::LeaderBoard>>,
        Option<HaSource>,
    ),
    rollout_writer: &Arc<store::RolloutWriter>,
) -> Arc<crate::admin::AdminApp> {
    // Rollouts and power requests run with the provisioning side's credentials and
    // drivers, so only when serve provisions.
    let (rollouts, power) = match provisioning {
        Some(p) => {
            let ctx = crate::daytwo::remote::RolloutCtx {
                inventory: s.inv.clone(),
                store: s.store.clone(),
                rollouts: rollout_writer.clone(),
                creds: p.creds.clone(),
                apid_port: p.settings.apid_port,
                view: Some(s.view.clone()),
                events: Some(s.events.clone()),
            };
            let rollouts: Arc<dyn crate::admin::rollouts::RolloutHost> =
                Arc::new(crate::admin::rollouts::ServeRollouts::new(ctx));
            let power =
                crate::admin::power::PowerDesk::new(p.settings.power.clone(), s.events.clone());
            (Some(rollouts), Some(power))
        }
        None => (None, None),
    };
    Arc::new(crate::admin::AdminApp {
        inventory: s.inv.clone(),
        store: s.store.clone(),
        view: s.view.clone(),
        events: s.events.clone(),
        metrics,
        commands: rebuilds,
        rollouts,
        power,
        leader,
        ha,
    })
}

/// Every long-running task of the appliance: a server's error (or a panic) stops the rest.
type Tasks = JoinSet<Result<(), ServerFailure>>;

/// The running appliance.
pub struct Running {
    /// Cancel to shut everything down gracefully.
    pub cancel: CancellationToken,
    /// The event bus (subscribe to watch progress).
    pub events: EventBus,
    /// The state store.
    pub store: Arc<dyn Store>,
    /// Day two's writer of rollout records (shared with the admin API's rollouts; the demo
    /// runs day two in-process with it).
    pub(crate) rollouts: Arc<store::RolloutWriter>,
    /// The read view the request paths and the admin API read (drift included).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub view: Arc<crate::view::StateView>,
    /// `http://advertise:port`.
    pub base_url: String,
    /// `http://<admin listen address>`, where `/api/*` and `/metrics` are served.
    pub(crate) admin_url: String,
    /// Inventory nodes served.
    pub(crate) node_count: usize,
    tasks: Mutex<Tasks>,
    event_writer: tokio::task::JoinHandle<()>,
    store_closed: store::Closed,
}

impl Running {
    /// Starts the drift watcher on the running appliance, one of its tasks like those
    /// [`Bound::start`] spawned (the demo's day two turns it on once the cluster is up).
    #[cfg(feature = "sim")]
    pub(crate) fn watch_drift(&self, drift: DriftPlan) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        spawn::spawn_drift(&mut tasks, drift, &self.events, &self.view, &self.cancel);
    }

    /// Waits until every task stopped (after [`Running::cancel`], or a server failing or a
    /// task panicking, which cancels the rest; a task that simply ends, as the power-on
    /// round does, stops nothing), then flushes the event log. The first failure is returned.
    pub async fn wait(self) -> Result<(), ServerFailure> {
        let Running {
            cancel,
            events,
            tasks,
            event_writer,
            store,
            rollouts,
            store_closed,
            ..
        } = self;
        let mut tasks = tasks.into_inner().unwrap_or_else(PoisonError::into_inner);
        let mut failure = None;
        // Once shutdown begins, the servers get SHUTDOWN_GRACE to drain (an HTTP download
        // in flight, a DHCP reply being committed); whatever is still running then is
        // aborted, so the process always exits within a bounded time.
        let grace = async {
            cancel.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::pin!(grace);
        loop {
            let res = tokio::select! {
                res = tasks.join_next() => match res {
                    Some(res) => res,
                    None => break,
                },
                _ = &mut grace, if !tasks.is_empty() => {
                    tracing::warn!(
                        tasks = tasks.len(),
                        grace_s = SHUTDOWN_GRACE.as_secs(),
                        "shutdown grace over; aborting what is still running"
                    );
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
            };
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "server stopped");
                    failure.get_or_insert(e);
                    cancel.cancel();
                }
                Err(e) if e.is_cancelled() => {}
                Err(e) => {
                    failure.get_or_insert(ServerFailure::Panicked(e));
                    cancel.cancel();
                }
            }
        }
        drop(events);
        let _ = event_writer.await;
        // A blocking store call started by a task that was aborted mid-await runs to its end
        // and holds the store until then (so do the token writer's last commit and the
        // handlers' state); the file lock goes with the last reference, and a restart must
        // find it released. Store calls are short: this returns the moment the last one ends.
        drop(store);
        drop(rollouts);
        if tokio::time::timeout(SHUTDOWN_GRACE, store_closed)
            .await
            .is_err()
        {
            tracing::warn!(
                grace_s = SHUTDOWN_GRACE.as_secs(),
                "the state store is still in use after the shutdown grace; returning anyway"
            );
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INV: &str = "cluster:
  name: t
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://10.0.40.11:6443
network:
  interfaces: [br0]
  subnet: 10.0.40.0/24
nodes:
  - name: cp-1
    mac: bc:24:11:00:00:01
    role: controlplane
    address: 10.0.40.11/24
    installDisk: /dev/sda
";

    /// HTTP and the admin API on loopback over a store in `dir`, nothing else.
    fn loopback_plan(dir: &std::path::Path) -> Plan {
        let path = dir.join("talboot.yaml");
        std::fs::write(&path, INV).unwrap();
        let inventory = crate::inventory::load_with_env(&path, &BTreeMap::<String, String>::new())
            .unwrap()
            .inventory;
        Plan {
            inventory: Arc::new(inventory),
            catalog: Catalog::load(dir).unwrap(),
            images_dir: dir.into(),
            ipxe_dir: dir.into(),
            configs: dir.into(),
            store: store::StoreSpec::Redb(dir.join("state")),
            name: "test".into(),
            advertise: Ipv4Addr::LOCALHOST,
            http: (Ipv4Addr::LOCALHOST, 0).into(),
            admin: (Ipv4Addr::LOCALHOST, 0).into(),
            admin_token: None,
            admin_hosts: Default::default(),
            http_limits: Default::default(),
            tftp: None,
            dhcp: None,
            provisioning: None,
            ipv6_ra: None,
            drift: None,
            power_on: None,
        }
    }

    /// Shutting down joins every task the appliance started, the drift watcher (its check
    /// in flight on a node that never answers) and the power-on round included: nothing
    /// keeps running past [`Running::wait`], and the round ending on its own is no failure.
    #[tokio::test]
    async fn shutdown_joins_the_drift_watcher_and_the_power_on_round() {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        // Accepts the connection (the kernel does) and never answers the TLS handshake.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let drift = DriftPlan {
            connector: crate::daytwo::plan::Connector {
                creds: crate::daytwo::upgrade::tests::creds(),
                relays: Vec::new(),
                retry: crate::talos::retry::RetryPolicy::NONE,
            },
            targets: vec![crate::daytwo::plan::NodeTarget {
                name: "cp-1".into(),
                role: crate::daytwo::rollout::Role::ControlPlane,
                addr: silent.local_addr().unwrap(),
                node_ip: silent.local_addr().unwrap().ip(),
                rendered: String::new(),
            }],
            interval: Duration::from_millis(10),
        };
        // Nothing to power on: the round ends at once.
        let drivers = Arc::new(BTreeMap::new());
        let plan = Plan {
            drift: Some(drift),
            power_on: Some(PowerOnPlan {
                drivers: drivers.clone(),
                stagger: Duration::ZERO,
            }),
            ..loopback_plan(dir.path())
        };
        let running = plan.bind().await.unwrap().start().unwrap();
        let board = running.view.drift.clone();
        let cancel = running.cancel.clone();
        let waiting = tokio::spawn(running.wait());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !cancel.is_cancelled(),
            "the power-on round ending stopped the appliance"
        );
        cancel.cancel();
        let result = tokio::time::timeout(SHUTDOWN_GRACE - Duration::from_secs(1), waiting)
            .await
            .expect("shutdown waits for a task that ignores it")
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(Arc::strong_count(&board), 1, "the drift watcher still runs");
        assert_eq!(
            Arc::strong_count(&drivers),
            1,
            "the power-on round still runs"
        );
        drop(silent);
    }

    /// A task of the set that panics is reported by [`Running::wait`], and stops the rest.
    #[tokio::test]
    async fn a_panicking_task_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let running = loopback_plan(dir.path())
            .bind()
            .await
            .unwrap()
            .start()
            .unwrap();
        running
            .tasks
            .lock()
            .unwrap()
            .spawn(async { panic!("a task fails") });
        let result = tokio::time::timeout(SHUTDOWN_GRACE, running.wait())
            .await
            .expect("a panic stops the appliance");
        assert!(
            matches!(result, Err(ServerFailure::Panicked(_))),
            "{result:?}"
        );
    }
}
