//! The DHCP socket adapter: UDP sockets bound to one interface, the receive loop around the
//! pure [`DhcpCore`], lease persistence, events, metrics and reply delivery.
//!
//! This file owns the server's lifetime (binding, restoring the lease book, the serving
//! loop); the pipeline a datagram goes through lives in its children: `socket` (binding and
//! reading), `handle` (admission and the core's decision), `commit` (group commit), `send`
//! (paced delivery) and `peek` (raw header reads).
//!
//! Everything protocol-shaped is decided by the core; this module only owns I/O:
//! - sockets on `0.0.0.0:67` (and `:4011` for PXE boot-server requests) pinned to the serving
//!   interface with `SO_BINDTODEVICE`, so a multi-homed host neither hears nor answers other
//!   segments, and a limited broadcast leaves through that interface;
//! - a bounded receive queue ([`super::queue`]): the socket readers never wait, and under
//!   overload the oldest DISCOVER is dropped (a REQUEST only when nothing but REQUESTs
//!   waits) and counted; REQUESTs are handled first;
//! - the store: the lease book is rebuilt from it at start, and every lease change a decision
//!   makes is committed, with the timeline events that announce it, before the reply is sent
//!   (group commit, one transaction per burst). A binding is synced to disk before its ACK
//!   leaves (durable before acknowledged; an ACK whose lease could not be stored is not sent);
//!   offers are committed without a sync, since no reply promises them. A retransmitted
//!   REQUEST is answered from the book without a new write (see [`super::leases`]);
//! - reply pacing: the committer hands each committed group to a sender task, which sends a
//!   large group's replies in small chunks spread until the next commit is due
//!   ([`super::pace`]), so a group commit does not overflow a client's or relay's receive
//!   buffer; the committer meanwhile starts the next commit;
//! - the RFC 2131 §4.1 destination chosen by [`reply_target`](super::reply_target): to the
//!   relay, to ciaddr, broadcast, or unicast to the offered address after adding an ARP entry
//!   for it (`SIOCSARP`, which needs `CAP_NET_ADMIN`; if the kernel refuses, the reply is
//!   broadcast instead, which every client accepts).
//!
//! [`DhcpServer::bind_loopback`] is the unprivileged transport of `talboot demo`: one socket on
//! a loopback address and port, no interface pinning, and every reply goes back to the
//! socket the request came from. Loopback has no broadcast domain and no ARP, so "where the
//! client can hear us" is the request's source: the simulated machine's own socket, or the
//! simulated relay agent's for relayed requests (giaddr set, as a top-of-rack relay does).
//! The RFC 2131 destination is still decided by the core and logged.

mod commit;
mod ha;
mod handle;
mod peek;
mod send;
mod socket;

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info};

use super::admission::{self, Backlog};
use super::queue::{self, RxQueue};
use super::{DecideCtx, DhcpCore, FloodConfig, LeaseBook, ServerPort};
use crate::events::EventBus;
use crate::store::{LeaseChange, LeaseCommit, LeaseWriter, MetaWriter, Store, StoreError};
use crate::view::StateView;
use commit::Committer;
use handle::{Adapter, Job};
use send::Replier;
use socket::{Datagram, bind_one, read_loop};

/// Standard DHCP server port.
pub(crate) const DHCP_PORT: u16 = 67;
/// PXE boot server port (PXE 2.1 §2.2.5).
pub(crate) const PXE_PORT: u16 = 4011;
/// How often expired offers and leases are swept out of the book.
const EXPIRY_SWEEP: Duration = Duration::from_secs(30);

/// Why the DHCP server could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A socket could not be created, configured or bound.
    #[error(
        "cannot listen for DHCP on {iface} port {port} ({step}): {source}; talboot needs root \
         (or CAP_NET_BIND_SERVICE and CAP_NET_RAW), the interface must exist, and no other DHCP \
         server (dnsmasq, isc-dhcp-server, kea) may hold the port on it"
    )]
    Bind {
        /// Interface name.
        iface: String,
        /// UDP port.
        port: u16,
        /// What failed.
        step: &'static str,
        /// Underlying error.
        source: io::Error,
    },
    /// The interface name cannot be used.
    #[error("interface name `{0}` is not valid: Linux names are 1-15 bytes without NUL")]
    BadInterface(String),
    /// No ports were asked for.
    #[error("no DHCP ports to listen on")]
    NoPorts,
    /// The persisted leases could not be read.
    #[error("cannot restore DHCP leases from the state store: {0}")]
    Restore(#[source] StoreError),
}

/// The DHCP server: sockets bound to one interface, ready to [`run`](Self::run).
#[derive(Debug)]
pub struct DhcpServer {
    iface: String,
    server_ip: Ipv4Addr,
    sockets: Vec<(ServerPort, Arc<UdpSocket>)>,
    transport: Transport,
    /// Where committed bindings are published for the request paths.
    view: Option<Arc<StateView>>,
    queues: Queues,
    /// On etcd: the link to the shared store (conflicts, the peers' lease feed).
    ha: Option<ha::HaLink>,
    /// On etcd: this appliance's name and the live appliances, for the split.
    members: Option<Members>,
}

/// This appliance's name and the live appliances it shares the clients with.
pub(crate) type Members = (
    String,
    tokio::sync::watch::Receiver<Vec<crate::store::Member>>,
);

/// Sizes of the two bounded queues of the pipeline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queues {
    /// Datagrams received and not yet decided ([`RxQueue`]).
    pub(crate) rx: usize,
    /// Decisions waiting for their commit.
    pub(crate) commit: usize,
    /// Replies waiting for a durable commit (ACKs) above which DISCOVERs are not answered,
    /// however fresh they are: the memory bound behind [`Queues::admission`].
    pub(crate) ack_backlog: usize,
    /// How long the oldest ACK may wait for its commit before DISCOVERs are not answered
    /// (bounds of the target derived from measured commit times, [`admission`]).
    pub(crate) admission: admission::Limits,
    /// The REQUEST-delay controller's constants ([`super::sojourn`]).
    pub(crate) delay: super::sojourn::Params,
}

impl Default for Queues {
    fn default() -> Self {
        Self {
            rx: queue::DEFAULT_CAPACITY,
            commit: commit::COMMIT_QUEUE,
            ack_backlog: handle::ACK_BACKLOG,
            admission: admission::Limits::default(),
            delay: super::sojourn::Params::default(),
        }
    }
}

/// How replies reach clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// A real segment: the RFC 2131 §4.1 destination (relay, ciaddr, broadcast, ARP unicast).
    Segment,
    /// Loopback simulation: back to the request's source address.
    ReplyToSource,
}

impl DhcpServer {
    /// Bind one UDP socket per port in `ports` (67, and 4011 for PXE boot-server requests) on
    /// `0.0.0.0`, pinned to `iface` with `SO_BINDTODEVICE`, with `SO_BROADCAST` and
    /// `SO_REUSEADDR` (so a restart does not wait for the old sockets). `server_ip` is this
    /// host's address on `iface`, logged and used for nothing else here (the core puts it in
    /// replies). Must be called inside a tokio runtime.
    pub fn bind(iface: &str, server_ip: Ipv4Addr, ports: &[u16]) -> Result<Self, ServerError> {
        if iface.is_empty() || iface.len() > 15 || iface.contains('\0') {
            return Err(ServerError::BadInterface(iface.to_string()));
        }
        if ports.is_empty() {
            return Err(ServerError::NoPorts);
        }
        let mut sockets = Vec::new();
        for &port in ports {
            let sock = bind_one(iface, port)?;
            let kind = if port == PXE_PORT {
                ServerPort::PxeBoot
            } else {
                ServerPort::Dhcp
            };
            sockets.push((kind, Arc::new(sock)));
        }
        info!(%iface, %server_ip, ?ports, "DHCP listening");
        Ok(Self {
            iface: iface.to_string(),
            server_ip,
            sockets,
            transport: Transport::Segment,
            view: None,
            queues: Queues::default(),
            ha: None,
            members: None,
        })
    }

    /// Bind one unprivileged UDP socket on `addr` (a loopback address, any port) for a
    /// simulated segment: no `SO_BINDTODEVICE`, no broadcast, and replies go back to the
    /// source of each request (see the module docs). Must be called inside a tokio runtime.
    pub fn bind_loopback(addr: SocketAddrV4) -> Result<Self, ServerError> {
        let err = |step, source| ServerError::Bind {
            iface: "lo".into(),
            port: addr.port(),
            step,
            source,
        };
        if !addr.ip().is_loopback() {
            return Err(err(
                "bind",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a loopback address", addr.ip()),
                ),
            ));
        }
        let sock = std::net::UdpSocket::bind(addr).map_err(|e| err("bind", e))?;
        sock.set_nonblocking(true)
            .map_err(|e| err("O_NONBLOCK", e))?;
        let sock = UdpSocket::from_std(sock).map_err(|e| err("register with tokio", e))?;
        info!(addr = %sock.local_addr().map_err(|e| err("getsockname", e))?, "DHCP listening on loopback (simulation)");
        Ok(Self {
            iface: "lo".into(),
            server_ip: *addr.ip(),
            sockets: vec![(ServerPort::Dhcp, Arc::new(sock))],
            transport: Transport::ReplyToSource,
            view: None,
            queues: Queues::default(),
            ha: None,
            members: None,
        })
    }

    /// Use queues of these sizes instead of the defaults (tests overflow them on purpose).
    #[cfg(test)]
    pub(crate) fn with_queues(mut self, queues: Queues) -> Self {
        self.queues = queues;
        self
    }

    /// The address of the first socket (its port is the real one when bound to port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self.sockets.first() {
            Some((_, s)) => s.local_addr(),
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "no sockets")),
        }
    }

    /// Serve on a store shared with other appliances in etcd: a commit that loses a race
    /// to a peer is split so only the conflicting leases are dropped (their clients retry),
    /// and the peers' lease changes, from `feed` (`EtcdStore::lease_feed`) and from the
    /// conflicts, are learned by the lease book (issue 28 item 2).
    pub fn with_etcd(
        mut self,
        etcd: Arc<crate::store::EtcdStore>,
        feed: Option<mpsc::UnboundedReceiver<Vec<crate::store::LeaseEvent>>>,
    ) -> Self {
        self.ha = Some(ha::HaLink::new(etcd, feed));
        self
    }

    /// Answer only this appliance's share of the clients among the live appliances
    /// (`live`, from `EtcdStore::join`), as RFC 3074 load balancing splits them
    /// ([`super::split`]); the share follows the live set as appliances come and go.
    pub fn with_split(
        mut self,
        me: String,
        live: tokio::sync::watch::Receiver<Vec<crate::store::Member>>,
    ) -> Self {
        self.members = Some((me, live));
        self
    }

    /// Publish every lease commit and ProxyDHCP binding to `view` (see
    /// [`crate::view`]).
    pub fn with_view(mut self, view: Arc<StateView>) -> Self {
        self.view = Some(view);
        self
    }

    /// Serve until `cancel` fires. The lease book is restored from `store` first (records the
    /// current inventory no longer allows are deleted from the store), then every datagram is
    /// handled by a [`DhcpCore`] over `ctx`; its changes are written with `writers`, which
    /// the server's tasks share (and which the caller may hold too, to act as the server).
    pub async fn run(
        mut self,
        ctx: DecideCtx,
        flood: FloodConfig,
        store: Arc<dyn Store>,
        writers: Arc<DhcpWriters>,
        events: EventBus,
        cancel: CancellationToken,
    ) -> Result<(), ServerError> {
        let (book, restored) = self.restore_book(&ctx, &store, &writers).await?;
        let replier = Replier::new(&self.iface, self.transport, &ctx, events, self.view.clone());
        let core = DhcpCore::new(ctx, book, flood);
        let (mut adapter, committer) = self.start_pipeline(core, Arc::new(replier), store, writers);
        info!(restored, iface = %self.iface, server_ip = %self.server_ip, "DHCP serving");

        let rx = Arc::new(RxQueue::<Datagram>::new(self.queues.rx));
        let readers: Vec<_> = self
            .sockets
            .iter()
            .map(|(port, sock)| {
                tokio::spawn(read_loop(*port, sock.clone(), rx.clone(), cancel.clone()))
            })
            .collect();
        self.serve(&mut adapter, &rx, &cancel).await;
        for r in readers {
            r.abort();
        }
        // Let queued replies whose leases are being committed go out before stopping.
        drop(adapter);
        let _ = committer.await;
        info!(iface = %self.iface, "DHCP stopped");
        Ok(())
    }

    /// The lease book as the store holds it, less the records the inventory no longer allows
    /// (deleted from the store too, so a restart does not meet them again); returns the book
    /// and how many records it kept.
    async fn restore_book(
        &self,
        ctx: &DecideCtx,
        store: &Arc<dyn Store>,
        writers: &Arc<DhcpWriters>,
    ) -> Result<(LeaseBook, usize), ServerError> {
        let records = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || store.leases())
                .await
                .map_err(|e| ServerError::Restore(join_error(e)))?
                .map_err(ServerError::Restore)?
        };
        let count = records.len();
        let (book, removals) = LeaseBook::restore(ctx.lease_book_config(), records);
        let removed = removals.len();
        if !removals.is_empty() {
            info!(
                removed = removals.len(),
                "dropping persisted leases the inventory no longer allows"
            );
            self.remove_stale(removals, store, writers).await;
        }
        Ok((book, count - removed))
    }

    /// Delete the stale records [`LeaseBook::restore`] left out (durably, and from the view).
    /// A failure is logged, not fatal: the book already ignores them.
    async fn remove_stale(
        &self,
        removals: Vec<LeaseChange>,
        store: &Arc<dyn Store>,
        writers: &Arc<DhcpWriters>,
    ) {
        let store = store.clone();
        let writers = writers.clone();
        let view = self.view.clone();
        let publish = view.as_ref().map(|v| v.begin_lease_writes(removals.iter()));
        match tokio::task::spawn_blocking(move || {
            let group = LeaseCommit {
                writes: removals,
                events: Vec::new(),
            };
            let r = writers.leases.commit_leases(&[group], true);
            if let (Some(v), Some(p)) = (view, publish) {
                p.refresh(&v, store.as_ref());
            }
            r
        })
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => error!(error = %e, "cannot remove stale leases from the state store"),
            Err(e) => error!(error = %e, "cannot remove stale leases from the state store"),
        }
    }

    /// The committer task and the handling half that feeds it, sharing the admission state
    /// and the channel of addresses whose write failed.
    fn start_pipeline(
        &mut self,
        core: DhcpCore,
        replier: Arc<Replier>,
        store: Arc<dyn Store>,
        writers: Arc<DhcpWriters>,
    ) -> (Adapter, JoinHandle<()>) {
        let (jobs, job_rx) = mpsc::channel::<Job>(self.queues.commit.max(1));
        let (notes_tx, notes) = mpsc::unbounded_channel();
        let backlog = Arc::new(Backlog::with_delay(
            self.queues.admission,
            self.queues.delay,
        ));
        let committer = Committer {
            store,
            writers,
            replier: replier.clone(),
            notes: notes_tx,
            backlog: backlog.clone(),
            not_durable: Default::default(),
            ha: self.ha.take(),
        };
        let committer = tokio::spawn(committer.run(job_rx));
        let adapter = Adapter {
            core,
            jobs,
            replier,
            notes,
            proxied: VecDeque::new(),
            backlog,
            ack_backlog: self.queues.ack_backlog,
            members: self.members.take(),
        };
        (adapter, committer)
    }

    /// The serving loop: one datagram at a time from the receive queue, and the expiry sweep,
    /// until `cancel` fires.
    async fn serve(
        &self,
        adapter: &mut Adapter,
        rx: &RxQueue<Datagram>,
        cancel: &CancellationToken,
    ) {
        let mut sweep = tokio::time::interval(EXPIRY_SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = sweep.tick() => adapter.sweep_expired().await,
                dgram = rx.pop() => {
                    let sock = self
                        .sockets
                        .iter()
                        .find(|(p, _)| *p == dgram.port)
                        .map(|(_, s)| s.clone());
                    if let Some(sock) = sock {
                        let span = dgram.span();
                        adapter.handle(dgram, &sock).instrument(span).await;
                    }
                }
            }
        }
    }
}

/// The store tables the DHCP server is the one writer of.
#[derive(Debug)]
pub struct DhcpWriters {
    /// Leases (and the events announcing them, in the same commit).
    pub leases: LeaseWriter,
    /// ProxyDHCP bindings.
    pub bindings: MetaWriter,
}

fn join_error(e: tokio::task::JoinError) -> StoreError {
    StoreError::Io {
        file: std::path::PathBuf::from("<state store>"),
        source: io::Error::other(format!("store task failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_refuses_bad_names_and_empty_ports() {
        assert!(matches!(
            DhcpServer::bind("a-name-that-is-far-too-long", Ipv4Addr::LOCALHOST, &[67]),
            Err(ServerError::BadInterface(_))
        ));
        assert!(matches!(
            DhcpServer::bind("lo", Ipv4Addr::LOCALHOST, &[]),
            Err(ServerError::NoPorts)
        ));
    }
}
