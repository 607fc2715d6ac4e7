//! Spawning each long-running task of the appliance into the one set [`super::Running`]
//! joins: the HTTP and admin listeners, the network-boot servers (TFTP, DHCP, router
//! advertisements) and the background work (provisioner, drift watcher, power-on round).
//! [`super::Bound::start`] decides what runs and with what; each function here only starts
//! one task and says what its failure is.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{
    ApplianceError, DriftPlan, PowerOnPlan, ProvisioningPlan, ServerFailure, Shared, Tasks,
};
use crate::dhcp::{BootTargets, DecideCtx, FloodConfig, server::DhcpServer};
use crate::events::EventBus;
use crate::firststage::{self, FirstStage};
use crate::http::{self, HttpApp};
use crate::store;
use crate::tftp::{TftpConfig, TftpServer};

/// The largest request body the admin listener reads: a rollout of a few hundred nodes'
/// rendered configs (`POST /api/rollouts`). Loopback, or off loopback behind the admin token
/// (a stranger's body is read, within the connection cap, before the 401).
const ADMIN_MAX_BODY: u64 = 32 * 1024 * 1024;

/// The network-boot servers of [`Bound::start`]: TFTP, DHCP and the IPv6 router
/// advertiser, each present only when planned, and what they are started with.
pub(super) struct BootServers<'a> {
    /// The bound TFTP socket.
    pub(super) tftp: Option<tokio::net::UdpSocket>,
    /// TFTP's address and settings, when it runs.
    pub(super) tftp_plan: Option<(SocketAddr, TftpConfig)>,
    /// The first-stage binaries TFTP serves.
    pub(super) ipxe: Arc<FirstStage>,
    /// Where they were read from (named when TFTP cannot serve them).
    pub(super) ipxe_dir: &'a std::path::Path,
    /// The bound DHCP sockets.
    pub(super) dhcp: Option<DhcpServer>,
    /// The lease table's writer, DHCP's (dropped when it does not run).
    pub(super) leases: store::LeaseWriter,
    /// The writer of the ProxyDHCP bindings, DHCP's too.
    pub(super) bindings: store::MetaWriter,
    /// The bound ICMPv6 socket.
    pub(super) ra: Option<crate::ndp::Advertiser>,
    /// On a shared etcd store: the store and this appliance's membership record, for the
    /// DHCP split among the live appliances and the peers' lease feed (issue 28 item 2).
    pub(super) ha: Option<(Arc<store::EtcdStore>, store::Member)>,
    /// The address machines reach talboot at.
    pub(super) advertise: Ipv4Addr,
    /// The provisioning HTTP port DHCP's boot targets name.
    pub(super) http_port: u16,
    /// The boot sets' UKIs, which DHCP offers to UEFI clients that may boot them, and the
    /// same by TFTP name, for PXE clients in Secure Boot.
    pub(super) ukis: (
        std::collections::BTreeMap<crate::inventory::Arch, crate::dhcp::UkiSet>,
        crate::tftp::BootMedia,
    ),
}

/// Spawns the network-boot servers that are planned (and says that DHCP is not, when not).
pub(super) fn spawn_boot_servers(
    tasks: &mut Tasks,
    s: &Shared,
    boot: BootServers<'_>,
) -> Result<(), ApplianceError> {
    if let (Some(socket), Some((_, config))) = (boot.tftp, boot.tftp_plan) {
        let files = (boot.ipxe, boot.ukis.1);
        spawn_tftp(tasks, s, socket, config, files, boot.ipxe_dir)?;
    }
    spawn_dhcp(
        tasks,
        s,
        (boot.dhcp, boot.ha),
        crate::dhcp::server::DhcpWriters {
            leases: boot.leases,
            bindings: boot.bindings,
        },
        boot.advertise,
        boot.http_port,
        boot.ukis.0,
    );
    if let Some(ra) = boot.ra {
        spawn_ra(tasks, s, ra);
    }
    Ok(())
}

/// The background work of [`Bound::start`] besides the servers, each present only when
/// planned.
pub(super) struct Workers {
    /// Push provisioning and the node writers it owns.
    pub(super) provisioning: Option<(ProvisioningPlan, crate::provision::ProvisionWriters)>,
    /// The admin API's commands to the provisioner.
    pub(super) command_rx: crate::provision::CommandReceiver,
    /// The drift watcher.
    pub(super) drift: Option<DriftPlan>,
    /// The power-on round, planned from the store.
    pub(super) power_on: Option<(Vec<crate::power::round::PowerOnStep>, PowerOnPlan)>,
}

/// Spawns the provisioner, the drift watcher and the power-on round, as planned.
pub(super) fn spawn_workers(tasks: &mut Tasks, s: &Shared, workers: Workers) {
    if let Some((p, writers)) = workers.provisioning {
        spawn_provisioner(tasks, s, p, writers, workers.command_rx);
    }
    if let Some(drift) = workers.drift {
        spawn_drift(tasks, drift, &s.events, &s.view, &s.cancel);
    }
    if let Some((round, p)) = workers.power_on {
        spawn_power_on(tasks, s, round, p);
    }
}

/// Spawns the provisioning HTTP server.
pub(super) fn spawn_http(
    tasks: &mut Tasks,
    s: &Shared,
    listener: tokio::net::TcpListener,
    app: Arc<HttpApp>,
    ipxe: Arc<FirstStage>,
    limits: http::server::Limits,
) {
    let cancel = s.cancel.clone();
    tasks.spawn(async move {
        // UEFI HTTP boot fetches `<base>/ipxe.efi`: the same loaded binaries as TFTP.
        let router = http::router(app).merge(firststage::router(ipxe));
        http::server::serve(listener, router, limits, "provisioning", cancel)
            .await
            .map_err(ServerFailure::Http)
    });
}

/// The admin token and host names the admin router checks requests against.
pub(super) type AdminAuth = (
    Option<Arc<crate::admin::auth::AdminToken>>,
    Arc<crate::admin::dashboard::AdminHosts>,
);

/// Spawns the admin HTTP server.
pub(super) fn spawn_admin(
    tasks: &mut Tasks,
    s: &Shared,
    listener: tokio::net::TcpListener,
    app: Arc<crate::admin::AdminApp>,
    (token, hosts): AdminAuth,
    http_limits: http::server::Limits,
) {
    let cancel = s.cancel.clone();
    // A rollout request carries every node's rendered config (tens of KiB each).
    let admin_limits = http::server::Limits {
        head: http::conn::HeadLimits {
            max_body_bytes: ADMIN_MAX_BODY,
            ..http_limits.head
        },
        ..http_limits
    };
    tasks.spawn(async move {
        http::server::serve(
            listener,
            crate::admin::router(app, token, hosts),
            admin_limits,
            "admin",
            cancel,
        )
        .await
        .map_err(ServerFailure::Admin)
    });
}

/// Spawns the TFTP server and the task that publishes its transfers as events.
fn spawn_tftp(
    tasks: &mut Tasks,
    s: &Shared,
    socket: tokio::net::UdpSocket,
    config: TftpConfig,
    (ipxe, media): (Arc<FirstStage>, crate::tftp::BootMedia),
    ipxe_dir: &std::path::Path,
) -> Result<(), ApplianceError> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    tracing::info!(max_blksize = config.max_blksize, "TFTP block size cap");
    let server = TftpServer::with_files(config, ipxe)
        .map_err(|e| ApplianceError::Bind {
            addr: format!("tftp {}", ipxe_dir.display()),
            cause: e.into(),
        })?
        .with_boot_media(media)
        .with_events(tx);
    let c = s.cancel.clone();
    tasks.spawn(async move { server.serve(socket, c).await.map_err(ServerFailure::Tftp) });
    let report =
        crate::tftp::report::publish_events(rx, s.view.clone(), s.inv.clone(), s.events.clone());
    tasks.spawn(async move {
        report.await;
        Ok(())
    });
    Ok(())
}

/// Spawns the DHCP server, or says that it does not run.
fn spawn_dhcp(
    tasks: &mut Tasks,
    s: &Shared,
    (dhcp, ha): (
        Option<DhcpServer>,
        Option<(Arc<store::EtcdStore>, store::Member)>,
    ),
    writers: crate::dhcp::server::DhcpWriters,
    advertise: Ipv4Addr,
    http_port: u16,
    ukis: std::collections::BTreeMap<crate::inventory::Arch, crate::dhcp::UkiSet>,
) {
    let Some(server) = dhcp else {
        tracing::info!(
            "DHCP disabled (--no-dhcp): another DHCP server must point machines at talboot"
        );
        return;
    };
    let mut ctx = DecideCtx::from_inventory(
        &s.inv,
        advertise,
        BootTargets::standard(advertise, http_port),
    );
    ctx.ukis = ukis;
    let (store, events, c, view) = (
        s.store.clone(),
        s.events.clone(),
        s.cancel.clone(),
        s.view.clone(),
    );
    // On etcd: registered as a member (under a lease kept alive while this task runs, revoked
    // when it ends), answering this appliance's share of the clients, learning the peers'
    // leases. On redb nothing changes.
    let (server, membership) = match ha {
        Some((etcd, me)) => {
            let membership = etcd.join(me.clone(), store::MEMBER_TTL);
            let feed = etcd.lease_feed(s.cancel.child_token());
            let server = server
                .with_etcd(etcd, Some(feed))
                .with_split(me.name, membership.live());
            (server, Some(membership))
        }
        None => (server, None),
    };
    tasks.spawn(async move {
        let _membership = membership;
        server
            .with_view(view)
            .run(
                ctx,
                FloodConfig::default(),
                store,
                Arc::new(writers),
                events,
                c,
            )
            .await
            .map_err(ServerFailure::Dhcp)
    });
}

/// Spawns the "no IPv6 router" advertiser.
fn spawn_ra(tasks: &mut Tasks, s: &Shared, ra: crate::ndp::Advertiser) {
    let c = s.cancel.clone();
    tasks.spawn(async move {
        ra.run(c).await;
        Ok(())
    });
}

/// Spawns the power-on round.
fn spawn_power_on(
    tasks: &mut Tasks,
    s: &Shared,
    round: Vec<crate::power::round::PowerOnStep>,
    p: PowerOnPlan,
) {
    let (events, c) = (s.events.clone(), s.cancel.clone());
    tasks.spawn(async move {
        // The round ending is not a failure: the other tasks keep running.
        crate::power::round::power_on_round(round, p.drivers, p.stagger, events, c).await;
        Ok(())
    });
}

/// Spawns the push provisioner, fed the admin API's commands.
fn spawn_provisioner(
    tasks: &mut Tasks,
    s: &Shared,
    p: ProvisioningPlan,
    writers: crate::provision::ProvisionWriters,
    command_rx: crate::provision::CommandReceiver,
) {
    let provisioner = crate::provision::Provisioner::new(
        s.inv.clone(),
        s.store.clone(),
        writers,
        s.events.clone(),
        p.renderer,
        p.creds,
        p.settings,
    )
    .with_commands(command_rx)
    .with_view(s.view.clone());
    let c = s.cancel.clone();
    tasks.spawn(async move {
        // On shutdown the provisioner is dropped where it stands, in-flight Talos call
        // included, so nothing new starts after the signal: each phase is persisted
        // before the call it leads to, and the next start resumes from it.
        tokio::select! {
            _ = provisioner.run(c.clone()) => {}
            _ = c.cancelled() => {
                tracing::info!("provisioning stopped");
            }
        }
        Ok(())
    });
    tracing::info!("push provisioning running");
}

/// Spawns the drift watcher into `tasks`.
pub(super) fn spawn_drift(
    tasks: &mut Tasks,
    drift: DriftPlan,
    events: &EventBus,
    view: &crate::view::StateView,
    cancel: &CancellationToken,
) {
    let watch = crate::daytwo::drift::watch(
        drift.connector,
        drift.targets,
        events.clone(),
        view.drift.clone(),
        drift.interval,
        cancel.clone(),
    );
    let cancel = cancel.clone();
    tasks.spawn(async move {
        // The watcher only reads the nodes: a check in flight is dropped on shutdown, so a
        // node that does not answer cannot hold the shutdown (or the event log) up.
        tokio::select! {
            () = watch => {}
            () = cancel.cancelled() => {}
        }
        Ok(())
    });
}

/// This appliance's membership record for a shared etcd store: `name` (`Plan.name`, from
/// `serve --name`), where its admin API and boot HTTP listen, this
/// build's version, and now as its start.
pub(super) fn member_record(name: &str, admin_url: &str, http_url: &str) -> store::Member {
    store::Member {
        name: name.to_owned(),
        admin_url: admin_url.to_owned(),
        http_url: http_url.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}
