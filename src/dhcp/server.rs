//! The DHCP socket adapter: UDP sockets bound to one interface, the receive loop around the
//! pure [`DhcpCore`], lease persistence, events, metrics and reply delivery.
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

use crate::view::StateView;
use std::collections::{BTreeMap, HashSet};
use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dhcproto::v4::{Message, MessageType};
use dhcproto::{Decodable, Decoder};
use metrics::{counter, gauge, histogram};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::admission::{self, Backlog};
use super::decide::Silence;
use super::pace::Pace;
use super::queue::{self, Lane, RxQueue};
use super::{
    DecideCtx, DhcpCore, FloodConfig, LeaseBook, Now, Outcome, ReplySummary, ReplyTarget,
    ServerPort,
};
use crate::events::{EventBus, EventKind, NodeEvent, unknown_node_key};
use crate::inventory::{Mac, NetworkMode};
use crate::store::LeaseChange;
use crate::store::{LeaseCommit, LeaseWriter, MetaWriter, Store, StoreError};

/// Standard DHCP server port.
pub(crate) const DHCP_PORT: u16 = 67;
/// PXE boot server port (PXE 2.1 §2.2.5).
pub(crate) const PXE_PORT: u16 = 4011;
/// How often expired offers and leases are swept out of the book.
const EXPIRY_SWEEP: Duration = Duration::from_secs(30);
/// Largest datagram read; DHCP messages are far smaller, jumbo frames aside.
const RECV_BUF: usize = 4096;
/// The kernel receive buffer asked for each DHCP socket: what a boot storm can queue while
/// the reader waits for a CPU. Linux charges a datagram's `truesize` (1,280 bytes for a DHCP
/// request) and drops what does not fit (`RcvbufErrors`); the default 212,992 bytes hold ~166
/// requests, 6 ms at 27,000 datagrams a second (15,000 DISCOVERs and their REQUESTs), and
/// talboot's sockets lost 7,305 requests in 5 s that way at 15,000/s on this 2-core machine
/// (docs/benchmarks.md) -- requests the admission rules never saw. 4 MiB holds ~3,200, about
/// 120 ms; the memory is charged only while datagrams wait.
const SOCKET_RCVBUF: usize = 4 << 20;

/// Ask for [`SOCKET_RCVBUF`]: `SO_RCVBUF` is capped by `net.core.rmem_max` (212,992 bytes by
/// default), so past it `SO_RCVBUFFORCE`, which root (CAP_NET_ADMIN, which serving port 67
/// needs in practice anyway) may use; without it the capped size is kept and said once.
fn grow_receive_buffer(sock: &socket2::Socket, port: u16) {
    let _ = sock.set_recv_buffer_size(SOCKET_RCVBUF);
    // Linux reports twice what was set (its bookkeeping overhead, socket(7)).
    if sock.recv_buffer_size().unwrap_or(0) >= SOCKET_RCVBUF {
        return;
    }
    use nix::sys::socket::{setsockopt, sockopt::RcvBufForce};
    if let Err(e) = setsockopt(sock, RcvBufForce, &SOCKET_RCVBUF) {
        debug!(port, error = %e, got = sock.recv_buffer_size().unwrap_or(0), "DHCP socket receive buffer kept at net.core.rmem_max");
    }
}

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
}

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
            commit: COMMIT_QUEUE,
            ack_backlog: ACK_BACKLOG,
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
        self,
        ctx: DecideCtx,
        flood: FloodConfig,
        store: Arc<dyn Store>,
        writers: Arc<DhcpWriters>,
        events: EventBus,
        cancel: CancellationToken,
    ) -> Result<(), ServerError> {
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
        let replier = Arc::new(Replier {
            iface: self.iface.clone(),
            transport: self.transport,
            mode: ctx.mode,
            hosts: ctx
                .hosts
                .iter()
                .map(|(m, h)| (*m, h.name.clone()))
                .collect(),
            events,
            view: self.view.clone(),
        });
        let (jobs, job_rx) = mpsc::channel::<Job>(self.queues.commit.max(1));
        let (not_durable_tx, not_durable) = mpsc::unbounded_channel();
        let backlog = Arc::new(Backlog::with_delay(
            self.queues.admission,
            self.queues.delay,
        ));
        let committer = tokio::spawn(commit_loop(
            job_rx,
            store,
            writers,
            replier.clone(),
            not_durable_tx,
            backlog.clone(),
        ));
        let mut adapter = Adapter {
            core: DhcpCore::new(ctx, book, flood),
            jobs,
            replier,
            not_durable,
            proxied: std::collections::VecDeque::new(),
            backlog,
            ack_backlog: self.queues.ack_backlog,
        };
        info!(restored = count - removed, iface = %self.iface, server_ip = %self.server_ip, "DHCP serving");

        let rx = Arc::new(RxQueue::<Datagram>::new(self.queues.rx));
        let mut readers = Vec::new();
        for (port, sock) in &self.sockets {
            readers.push(tokio::spawn(read_loop(
                *port,
                sock.clone(),
                rx.clone(),
                cancel.clone(),
            )));
        }
        let mut sweep = tokio::time::interval(EXPIRY_SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = sweep.tick() => {
                    let changes = adapter.core.book.expire(SystemTime::now());
                    if !changes.is_empty() {
                        adapter.enqueue(changes, Vec::new(), false, None, After::Nothing).await;
                    }
                }
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
        for r in readers {
            r.abort();
        }
        // Let queued replies whose leases are being committed go out before stopping.
        drop(adapter);
        let _ = committer.await;
        info!(iface = %self.iface, "DHCP stopped");
        Ok(())
    }
}

fn bind_one(iface: &str, port: u16) -> Result<UdpSocket, ServerError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let err = |step, source| ServerError::Bind {
        iface: iface.to_string(),
        port,
        step,
        source,
    };
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .map_err(|e| err("socket", e))?;
    sock.set_reuse_address(true)
        .map_err(|e| err("SO_REUSEADDR", e))?;
    sock.set_broadcast(true)
        .map_err(|e| err("SO_BROADCAST", e))?;
    sock.bind_device(Some(iface.as_bytes()))
        .map_err(|e| err("SO_BINDTODEVICE", e))?;
    sock.set_nonblocking(true)
        .map_err(|e| err("O_NONBLOCK", e))?;
    grow_receive_buffer(&sock, port);
    let addr = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
    sock.bind(&addr.into()).map_err(|e| err("bind", e))?;
    UdpSocket::from_std(sock.into()).map_err(|e| err("register with tokio", e))
}

/// One received datagram.
struct Datagram {
    port: ServerPort,
    bytes: Vec<u8>,
    source: SocketAddrV4,
    /// When the reader took it off the socket: a reply's delay, for admission, counts from
    /// here ([`super::sojourn`]).
    received: Instant,
}

impl Datagram {
    /// A span naming the transaction: xid, chaddr and message type, read from the raw bytes
    /// without trusting them (a malformed datagram still gets a span, with what could be read).
    fn span(&self) -> tracing::Span {
        let b = &self.bytes;
        let xid = b
            .get(4..8)
            .map(|x| format!("{:08x}", u32::from_be_bytes([x[0], x[1], x[2], x[3]])))
            .unwrap_or_default();
        let chaddr = peek_mac(b).map(|m| m.to_string()).unwrap_or_default();
        let kind = peek_msg_type(b).map(msg_type_label).unwrap_or("none");
        info_span!("dhcp", %xid, %chaddr, msg = kind, port = ?self.port, src = %self.source)
    }
}

async fn read_loop(
    port: ServerPort,
    sock: Arc<UdpSocket>,
    queue: Arc<RxQueue<Datagram>>,
    cancel: CancellationToken,
) {
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        let got = tokio::select! {
            _ = cancel.cancelled() => return,
            got = sock.recv_from(&mut buf) => got,
        };
        match got {
            Ok((n, SocketAddr::V4(source))) => {
                let dgram = Datagram {
                    port,
                    bytes: buf[..n].to_vec(),
                    source,
                    received: Instant::now(),
                };
                // Never wait for the core: a full queue sheds the oldest DISCOVER.
                let lane = Lane::of(peek_msg_type(&dgram.bytes));
                if let Some((old, lane)) = queue.push(dgram, lane) {
                    let lane = match lane {
                        Lane::Finish => "finish",
                        Lane::Start => "start",
                    };
                    counter!("dhcp_dropped_total", "reason" => "queue_full", "lane" => lane)
                        .increment(1);
                    debug!(xid = format_args!("{:08x}", peek_xid(&old.bytes)), src = %old.source, lane, "receive queue full: datagram dropped");
                }
            }
            Ok((_, SocketAddr::V6(_))) => {}
            Err(e) => {
                // ICMP errors from earlier sends surface here on Linux; keep serving.
                warn!(?port, error = %e, "DHCP receive error");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Replies (and events) wait here while their lease writes are committed; bounded so a flood
/// that outruns the disk stops the handling loop, and the receive queue then sheds the oldest
/// DISCOVERs, instead of growing memory. Sized to ride out one slow fsync at 15,000 decisions
/// a second: this VM's disk was measured at up to 180 ms for one `fdatasync` while other
/// processes wrote (docs/benchmarks.md), which filled the 1,024 of before.
const COMMIT_QUEUE: usize = 4096;
/// Replies waiting for their commit above which DISCOVERs are shed whatever their age: a
/// memory bound only. Load is shed earlier by the age of the oldest waiting ACK against the
/// measured commit time ([`admission`]); a count is the wrong brake (on a fast disk 512 ACKs
/// never wait long, on a slow one they are a second of waiting).
const ACK_BACKLOG: usize = 512;
/// Most rows (lease writes and events) committed in one transaction: a whole backlog, so that
/// after a slow fsync the queue drains with one more sync instead of one per 512 rows.
const COMMIT_BATCH: usize = 8192;

/// The handling half: the core, deciding one datagram at a time, and the queue to the
/// committer. Decisions are made in order and never wait for the disk; the committer makes
/// each decision's lease changes durable (many per transaction) before its reply is sent.
struct Adapter {
    core: DhcpCore,
    jobs: mpsc::Sender<Job>,
    replier: Arc<Replier>,
    /// Addresses whose write the committer could not make; the book must write them again.
    not_durable: mpsc::UnboundedReceiver<Ipv4Addr>,
    /// Proxy mode: the recent exchanges (chaddr, xid) talboot answered with boot
    /// information, so the client's REQUEST of the site server's offer in the same exchange
    /// can be recorded as its ProxyDHCP binding.
    proxied: std::collections::VecDeque<(Mac, u32)>,
    /// Replies queued behind a commit and not sent yet, and the admission target from the
    /// measured commit times (shared with the committer).
    backlog: Arc<Backlog>,
    /// Above this many waiting replies, DISCOVERs are shed ([`ACK_BACKLOG`]).
    ack_backlog: usize,
}

/// How many answered proxy exchanges are remembered (a rack boots a few hundred machines).
const PROXIED_REMEMBERED: usize = 4096;

/// The store tables the DHCP server is the one writer of.
#[derive(Debug)]
pub struct DhcpWriters {
    /// Leases (and the events announcing them, in the same commit).
    pub leases: LeaseWriter,
    /// ProxyDHCP bindings.
    pub bindings: MetaWriter,
}

/// One decision's store rows and what to do once they are committed.
struct Job {
    /// Lease writes and the timeline rows announcing them, committed together.
    commit: LeaseCommit,
    /// The same events, broadcast once committed.
    events: Vec<NodeEvent>,
    /// The batch holding this job must be synced before its reply leaves (an ACK's binding,
    /// a release or decline). Offers and expiry sweeps need not: Kea does not store a lease
    /// for a DHCPOFFER at all (`fake_allocation_` in isc-projects/kea
    /// `src/lib/dhcpsrv/alloc_engine.cc` at Kea-2.2.0).
    durable: bool,
    /// A reused binding (retransmitted REQUEST) this reply announces without writing it:
    /// sent only if that address's last write did not fail.
    relies_on: Option<Ipv4Addr>,
    after: After,
    span: tracing::Span,
}

/// What follows a committed job.
enum After {
    /// Send this reply.
    Reply {
        sock: Arc<UdpSocket>,
        bytes: Vec<u8>,
        to: ReplyTarget,
        /// The request's source (where a loopback simulation replies).
        source: SocketAddrV4,
        kind: MessageType,
        /// Proxy mode: the client address of this exchange, persisted as the MAC's
        /// ProxyDHCP binding before the reply leaves ([`crate::entitlement`]).
        bind: Option<(Mac, Ipv4Addr)>,
        /// When the request was received ([`Datagram::received`]).
        received: Instant,
    },
    /// Proxy mode: persist the MAC's ProxyDHCP binding ([`crate::entitlement`]).
    Bind { mac: Mac, ip: Ipv4Addr },
    /// Nothing (expiry sweeps, releases, declines).
    Nothing,
}

impl Adapter {
    async fn handle(&mut self, dgram: Datagram, sock: &Arc<UdpSocket>) {
        while let Ok(ip) = self.not_durable.try_recv() {
            self.core.book.mark_not_durable(ip);
        }
        let request_type = peek_msg_type(&dgram.bytes);
        counter!("dhcp_packets_total", "type" => request_type.map(msg_type_label).unwrap_or("none"))
            .increment(1);
        // Admission control: when the durable path is behind, a new exchange would only
        // produce a REQUEST it cannot answer in time. Kea gets this for free by answering
        // one datagram at a time; here OFFERs leave without waiting for the disk, so it has
        // to be said ([`admission`]; only DISCOVERs are ever refused).
        if let Some(shed) =
            self.backlog
                .decide(Lane::of(request_type), Instant::now(), self.ack_backlog)
        {
            let reason = shed.label();
            counter!("dhcp_dropped_total", "reason" => reason).increment(1);
            debug!(reason, "ACKs waiting for the disk: DISCOVER not answered");
            return;
        }
        let mac = peek_mac(&dgram.bytes);
        let now = Now {
            wall: SystemTime::now(),
            mono: Instant::now(),
        };
        match self
            .core
            .handle(&dgram.bytes, dgram.port, dgram.source, now)
        {
            Outcome::Dropped(reason) => {
                counter!("dhcp_dropped_total", "reason" => reason.label()).increment(1);
                debug!(%reason, "dropped");
                // Proxy mode: the client takes its address from the site's server with a
                // broadcast REQUEST (option 50) in the exchange talboot answered; when it never
                // asks talboot on 4011 (iPXE skips that when the proxy offer already carries a
                // boot file), that REQUEST is the only binding talboot sees.
                if self.replier.mode == NetworkMode::Proxy
                    && let Some((mac, ip)) = selected_address(&dgram.bytes)
                    && self.proxied.contains(&(mac, peek_xid(&dgram.bytes)))
                {
                    self.enqueue(Vec::new(), Vec::new(), false, None, After::Bind { mac, ip })
                        .await;
                }
            }
            Outcome::Silent {
                reason,
                lease_changes,
            } => {
                let writes = lease_changes;
                let event = match (mac, reason) {
                    (Some(mac), Silence::Released) => {
                        Some((mac, EventKind::DhcpRelease, "released its address"))
                    }
                    (Some(mac), Silence::Declined) => Some((
                        mac,
                        EventKind::DhcpDecline,
                        "declined its address (conflict); quarantined",
                    )),
                    _ => None,
                };
                let durable = event.is_some();
                let events = event
                    .map(|(mac, kind, detail)| {
                        self.replier
                            .events
                            .stamp(&self.replier.node_key(mac), kind, detail)
                    })
                    .into_iter()
                    .collect();
                self.enqueue(writes, events, durable, None, After::Nothing)
                    .await;
            }
            Outcome::Send {
                bytes,
                to,
                lease_changes,
                client,
                summary,
            } => {
                let writes = lease_changes;
                // In proxy mode talboot hands out no lease: the address the client speaks from
                // in the PXE exchange it answered is the only binding of its MAC it ever sees.
                let bind = (self.replier.mode == NetworkMode::Proxy)
                    .then(|| proxy_request_address(&dgram.bytes, *dgram.source.ip()))
                    .flatten()
                    .map(|ip| (client.mac, ip));
                if self.replier.mode == NetworkMode::Proxy {
                    if self.proxied.len() >= PROXIED_REMEMBERED {
                        self.proxied.pop_front();
                    }
                    self.proxied.push_back((client.mac, peek_xid(&dgram.bytes)));
                }
                let ack = summary.kind == MessageType::Ack;
                let durable = ack && !writes.is_empty();
                let relies_on = (ack && writes.is_empty() && !summary.yiaddr.is_unspecified())
                    .then_some(summary.yiaddr);
                let events = self
                    .replier
                    .reply_event(client.mac, dgram.port, &summary, to)
                    .into_iter()
                    .collect();
                if !durable && relies_on.is_none() && bind.is_none() {
                    // Nothing this reply says needs to be on disk (an OFFER: Kea does not even
                    // store one; a NAK; an INFORM's ACK): it leaves now, and its record and
                    // event ride in the next commit. So a slow fsync delays only the ACKs that
                    // must wait for it, never the DISCOVERs behind them (the stall at
                    // 3,000/s, docs/benchmarks.md).
                    self.replier.send(sock, &bytes, to, dgram.source).await;
                    counter!("dhcp_replies_total", "type" => msg_type_label(summary.kind))
                        .increment(1);
                    self.enqueue(writes, events, false, None, After::Nothing)
                        .await;
                    return;
                }
                let after = After::Reply {
                    sock: sock.clone(),
                    bytes,
                    to,
                    source: dgram.source,
                    kind: summary.kind,
                    bind,
                    received: dgram.received,
                };
                self.enqueue(writes, events, durable, relies_on, after)
                    .await;
            }
        }
    }

    async fn enqueue(
        &self,
        writes: Vec<LeaseChange>,
        events: Vec<NodeEvent>,
        durable: bool,
        relies_on: Option<Ipv4Addr>,
        after: After,
    ) {
        if matches!(after, After::Reply { .. }) {
            self.backlog.queued(Instant::now());
        }
        let job = Job {
            commit: LeaseCommit {
                writes,
                events: events.iter().map(NodeEvent::row).collect(),
            },
            events,
            durable,
            relies_on,
            after,
            span: tracing::Span::current(),
        };
        let waited = Instant::now();
        if self.jobs.send(job).await.is_err() {
            error!("DHCP committer has stopped; reply dropped");
        }
        let waited = waited.elapsed();
        if waited > Duration::from_millis(5) {
            // The committer is behind: datagrams now pile up in the receive queue.
            debug!(target: "talboot::dhcp::commit", waited_us = waited.as_micros() as u64, "handler waited for the committer");
        }
    }
}

/// The address a lease write is about.
fn write_ip(w: &LeaseChange) -> Ipv4Addr {
    match w {
        LeaseChange::Upsert(l) => l.ip,
        LeaseChange::Remove(ip) => *ip,
    }
}

/// Group commit: take every job waiting, write all their lease changes and events in one
/// transaction (synced when any of them needs it), then hand the jobs whose writes all
/// succeeded, in order, to the sender ([`send_loop`]), which paces their replies. One commit
/// is shared by a whole burst of requests, the timeline rows ride in it instead of taking
/// redb's write slot again, and no reply leaves before the lease it announces is on disk
/// (durable before acknowledged): the sender only sees a job once its commit returned, while
/// the committer goes on to the next batch.
async fn commit_loop(
    mut rx: mpsc::Receiver<Job>,
    store: Arc<dyn Store>,
    writers: Arc<DhcpWriters>,
    replier: Arc<Replier>,
    not_durable_tx: mpsc::UnboundedSender<Ipv4Addr>,
    backlog: Arc<Backlog>,
) {
    // Unbounded: the sender sends at least `Pace::burst` replies per `Pace::min_gap`, faster
    // than decisions are made, so it never holds more than a few groups.
    let (released_tx, released_rx) = mpsc::unbounded_channel::<Released>();
    let sender = tokio::spawn(send_loop(
        released_rx,
        writers.clone(),
        replier.clone(),
        Pace::default(),
        backlog.clone(),
    ));
    // Addresses whose latest write failed; a reused binding on one of them is not announced.
    let mut not_durable: HashSet<Ipv4Addr> = HashSet::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let size = |j: &Job| j.commit.writes.len() + j.commit.events.len();
        let mut count = size(&batch[0]);
        while count < COMMIT_BATCH {
            match rx.try_recv() {
                Ok(job) => {
                    count += size(&job);
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        batch.retain(|job| match job.relies_on {
            Some(ip) if not_durable.contains(&ip) => {
                let _enter = job.span.enter();
                if matches!(job.after, After::Reply { .. }) {
                    backlog.left();
                }
                counter!("dhcp_dropped_total", "reason" => "store_failed").increment(1);
                error!(%ip, "binding is not on disk (its write failed); reply not sent");
                let _ = not_durable_tx.send(ip);
                false
            }
            _ => true,
        });
        let durable = batch.iter().any(|j| j.durable);
        let replies = batch
            .iter()
            .filter(|j| matches!(j.after, After::Reply { .. }))
            .count();
        backlog.taken(replies);
        let ips: Vec<Vec<Ipv4Addr>> = batch
            .iter()
            .map(|j| j.commit.writes.iter().map(write_ip).collect())
            .collect();
        let groups: Vec<LeaseCommit> = batch
            .iter_mut()
            .map(|j| std::mem::take(&mut j.commit))
            .collect();
        let mut took = None;
        let results = if groups
            .iter()
            .all(|g| g.writes.is_empty() && g.events.is_empty())
        {
            Ok(())
        } else {
            let (store, writers) = (store.clone(), writers.clone());
            // The view retracts what the commit touches now and publishes the result after.
            let view = replier.view.clone();
            let publish = view.as_ref().map(|v| v.begin_leases(&groups));
            let (jobs, rows) = (groups.len(), count);
            let queued = Instant::now();
            let done = tokio::task::spawn_blocking(move || {
                let started = Instant::now();
                let r = writers.leases.commit_leases(&groups, durable);
                let committed = Instant::now();
                if let (Some(v), Some(p)) = (view, publish) {
                    p.refresh(&v, store.as_ref());
                }
                (r, started, committed, committed.elapsed())
            })
            .await;
            let total = queued.elapsed();
            match done {
                Ok((r, started, committed, refresh)) => {
                    let wait = started.duration_since(queued);
                    // Where a slow reply's time goes: the wait for a blocking thread, the
                    // commit itself (redb's write slot, page writes, the fsync when durable),
                    // and re-reading the committed leases into the view before the replies.
                    histogram!("dhcp_commit_seconds", "durable" => if durable { "yes" } else { "no" })
                        .record(total.as_secs_f64());
                    histogram!("dhcp_commit_jobs").record(jobs as f64);
                    if durable {
                        took = Some(total);
                    }
                    debug!(target: "talboot::dhcp::commit", jobs, rows, durable,
                        wait_us = wait.as_micros() as u64,
                        commit_us = committed.duration_since(started).as_micros() as u64,
                        refresh_us = refresh.as_micros() as u64, "lease commit");
                    r
                }
                Err(e) => Err(join_error(e)),
            }
        };
        // Its commit is done: these replies no longer wait for the disk, sent or not.
        backlog.committed(replies, took, Instant::now());
        let mut group = Vec::with_capacity(batch.len());
        for (job, ips) in batch.into_iter().zip(ips) {
            // A job with nothing to write still gets its reply when the commit failed; its
            // events are then persisted by the bus instead.
            if let (Err(e), false) = (&results, ips.is_empty()) {
                let _enter = job.span.enter();
                // The client retries; the next attempt is decided and written again.
                counter!("dhcp_dropped_total", "reason" => "store_failed").increment(1);
                error!(error = %e, "cannot persist lease; reply not sent");
                for ip in ips {
                    not_durable.insert(ip);
                    let _ = not_durable_tx.send(ip);
                }
                continue;
            }
            for ip in &ips {
                not_durable.remove(ip);
            }
            group.push((job, results.is_ok()));
        }
        if !group.is_empty() {
            let _ = released_tx.send(Released {
                jobs: group,
                window: backlog.commit_time(),
                at: Instant::now(),
            });
        }
    }
    // Let the replies already released go out before stopping.
    drop(released_tx);
    let _ = sender.await;
}

/// Jobs whose commit returned, in order, each with whether its events are in the store.
struct Released {
    jobs: Vec<(Job, bool)>,
    /// When the next commit is expected to release its group (the smoothed commit time).
    window: Duration,
    /// When the commit released it: its pacing counts from here.
    at: Instant,
}

/// The sending half of the committer: the replies (and bindings, and events) of each
/// released group, in order, paced by [`Pace`] so that a large group does not leave back to
/// back and overflow the receiver's socket buffer.
async fn send_loop(
    mut rx: mpsc::UnboundedReceiver<Released>,
    writers: Arc<DhcpWriters>,
    replier: Arc<Replier>,
    pace: Pace,
    backlog: Arc<Backlog>,
) {
    while let Some(group) = rx.recv().await {
        let n = group
            .jobs
            .iter()
            .filter(|(j, _)| matches!(j.after, After::Reply { .. }))
            .count();
        // From its release, not from when its turn comes: groups are released about one
        // commit apart and each is spread over about one commit, so a sender that started
        // each group's schedule on its turn fell behind by every timer overshoot (a sleep of
        // 1 ms takes up to 2) and never caught up -- at 13,000 ACKs a second on one core the
        // replies waited 18-23 ms in all while commits took 1.6 ms (docs/benchmarks.md). A
        // late sender now sends what is already due at once: the lag is bounded by one window.
        let start = group.at;
        let mut sent = 0;
        if n > pace.burst {
            counter!("dhcp_paced_groups_total").increment(1);
        }
        gauge!("dhcp_discover_shed_probability").set(backlog.delay_probability());
        for (job, stored) in group.jobs {
            let _enter = job.span.enter();
            match job.after {
                After::Reply {
                    sock,
                    bytes,
                    to,
                    source,
                    kind,
                    bind,
                    received,
                } => {
                    let at = pace.offset(sent, n, group.window);
                    sent += 1;
                    if !at.is_zero() {
                        tokio::time::sleep_until((start + at).into()).await;
                    }
                    if let Some((mac, ip)) = bind {
                        record_binding(&writers, replier.view.as_deref(), mac, ip).await;
                    }
                    replier.send(&sock, &bytes, to, source).await;
                    let delay = received.elapsed();
                    backlog.sent(delay);
                    histogram!("dhcp_reply_delay_seconds").record(delay.as_secs_f64());
                    counter!("dhcp_replies_total", "type" => msg_type_label(kind)).increment(1);
                }
                After::Bind { mac, ip } => {
                    record_binding(&writers, replier.view.as_deref(), mac, ip).await
                }
                After::Nothing => {}
            }
            for ev in job.events {
                if stored {
                    replier.events.announce(ev);
                } else {
                    replier.events.publish(&ev.node, ev.kind, ev.detail);
                }
            }
        }
    }
}

/// What sending and reporting a reply needs: the interface (for ARP entries), the mode, and
/// node names by MAC.
struct Replier {
    iface: String,
    transport: Transport,
    mode: NetworkMode,
    hosts: BTreeMap<Mac, String>,
    events: EventBus,
    view: Option<Arc<StateView>>,
}

impl Replier {
    /// Send `bytes` per the RFC 2131 §4.1 target.
    async fn send(&self, sock: &UdpSocket, bytes: &[u8], to: ReplyTarget, source: SocketAddrV4) {
        let dest = match to {
            _ if self.transport == Transport::ReplyToSource => {
                debug!(rfc2131 = %to.addr(), to = %source, "loopback simulation: replying to the request's source");
                source
            }
            ReplyTarget::UnicastToHardware { addr, mac } => {
                match add_arp_entry(sock, &self.iface, *addr.ip(), mac) {
                    Ok(()) => {
                        counter!("dhcp_arp_injected_total").increment(1);
                        addr
                    }
                    Err(e) => {
                        counter!("dhcp_arp_fallback_total").increment(1);
                        debug!(error = %e, ip = %addr.ip(), "cannot add ARP entry; broadcasting");
                        ReplyTarget::BROADCAST_ADDR
                    }
                }
            }
            other => other.addr(),
        };
        match sock.send_to(bytes, SocketAddr::V4(dest)).await {
            Ok(_) => debug!(to = %dest, "reply sent"),
            Err(e) => {
                counter!("dhcp_send_errors_total").increment(1);
                warn!(to = %dest, error = %e, "cannot send DHCP reply");
            }
        }
    }

    /// The timeline event of a reply about to be sent.
    fn reply_event(
        &self,
        mac: Mac,
        port: ServerPort,
        reply: &ReplySummary,
        to: ReplyTarget,
    ) -> Option<NodeEvent> {
        let proxy = self.mode == NetworkMode::Proxy || port == ServerPort::PxeBoot;
        let file = &reply.boot_file;
        let kind = match reply.kind {
            MessageType::Offer | MessageType::Ack if proxy => EventKind::ProxyOffer,
            MessageType::Offer => EventKind::DhcpOffer,
            MessageType::Ack => EventKind::DhcpAck,
            MessageType::Nak => EventKind::DhcpNak,
            _ => return None,
        };
        let detail = match kind {
            EventKind::ProxyOffer => format!("boot file `{file}` via {to:?}"),
            EventKind::DhcpNak => "request refused (NAK)".to_string(),
            _ => format!("{} (boot file `{file}`)", reply.yiaddr),
        };
        Some(self.events.stamp(&self.node_key(mac), kind, detail))
    }

    fn node_key(&self, mac: Mac) -> String {
        match self.hosts.get(&mac) {
            Some(name) => name.clone(),
            None => unknown_node_key(mac),
        }
    }
}

fn join_error(e: tokio::task::JoinError) -> StoreError {
    StoreError::Io {
        file: std::path::PathBuf::from("<state store>"),
        source: io::Error::other(format!("store task failed: {e}")),
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Persist the ProxyDHCP binding of `mac` to `ip`.
async fn record_binding(
    writers: &Arc<DhcpWriters>,
    view: Option<&StateView>,
    mac: Mac,
    ip: Ipv4Addr,
) {
    let writers = writers.clone();
    let now = unix(SystemTime::now());
    if let Some(v) = view {
        v.retract_proxy(mac);
    }
    let done = tokio::task::spawn_blocking(move || {
        crate::entitlement::record_proxy_binding(&writers.bindings, mac, ip, now)
    })
    .await;
    match done {
        Ok(Ok(binding)) => {
            if let Some(v) = view {
                v.publish_proxy(binding);
            }
            debug!(%mac, %ip, "ProxyDHCP binding recorded")
        }
        Ok(Err(e)) => error!(%mac, error = %e, "cannot record ProxyDHCP binding"),
        Err(e) => error!(%mac, error = %e, "cannot record ProxyDHCP binding"),
    }
}

/// xid of a raw request (0 when too short; such a datagram was dropped anyway).
fn peek_xid(b: &[u8]) -> u32 {
    b.get(4..8)
        .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
        .unwrap_or(0)
}

/// chaddr and requested address (option 50) of a DHCPREQUEST that selects another server's
/// offer (option 54 present), the client's choice of address in a proxied exchange.
fn selected_address(b: &[u8]) -> Option<(Mac, Ipv4Addr)> {
    use dhcproto::v4::{DhcpOption, OptionCode};
    let msg = Message::decode(&mut Decoder::new(b)).ok()?;
    if msg.opts().msg_type() != Some(MessageType::Request)
        || msg.opts().get(OptionCode::ServerIdentifier).is_none()
    {
        return None;
    }
    let Some(DhcpOption::RequestedIpAddress(ip)) = msg.opts().get(OptionCode::RequestedIpAddress)
    else {
        return None;
    };
    let ip = crate::entitlement::proxy_client_address(
        *ip,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
    )?;
    Some((peek_mac(b)?, ip))
}

/// The client address of a ProxyDHCP request (ciaddr, giaddr read from the raw header; see
/// [`crate::entitlement::proxy_client_address`]).
fn proxy_request_address(b: &[u8], source: Ipv4Addr) -> Option<Ipv4Addr> {
    let at = |o: usize| {
        b.get(o..o + 4)
            .map(|x| Ipv4Addr::new(x[0], x[1], x[2], x[3]))
    };
    crate::entitlement::proxy_client_address(at(12)?, at(24)?, source)
}

/// chaddr, when the header is long enough and says 6-byte Ethernet.
fn peek_mac(b: &[u8]) -> Option<Mac> {
    if b.len() < 34 || b[1] != 1 || b[2] != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[28..34]);
    Some(Mac(m))
}

/// Option 53 from the raw options, for spans and counters before (or without) a full decode.
fn peek_msg_type(b: &[u8]) -> Option<MessageType> {
    if b.len() < 240 || b[236..240] != [99, 130, 83, 99] {
        return None;
    }
    super::wire::option_values(&b[240..])
        .find(|(code, data)| *code == 53 && data.len() == 1)
        .map(|(_, data)| MessageType::from(data[0]))
}

fn msg_type_label(t: MessageType) -> &'static str {
    match t {
        MessageType::Discover => "discover",
        MessageType::Offer => "offer",
        MessageType::Request => "request",
        MessageType::Decline => "decline",
        MessageType::Ack => "ack",
        MessageType::Nak => "nak",
        MessageType::Release => "release",
        MessageType::Inform => "inform",
        _ => "other",
    }
}

/// Add a complete ARP entry `ip -> mac` on `iface` (ioctl `SIOCSARP` on the socket), so that
/// a unicast to an address the client does not answer ARP for yet reaches it.
fn add_arp_entry(sock: &UdpSocket, iface: &str, ip: Ipv4Addr, mac: Mac) -> io::Result<()> {
    use nix::libc;
    let dev = CString::new(iface).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: arpreq is a plain C struct for which all-zero bytes are a valid value.
    let mut req: libc::arpreq = unsafe { std::mem::zeroed() };
    let pa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in (16 bytes) fits exactly in the sockaddr arp_pa; both are C structs.
    unsafe {
        std::ptr::write_unaligned(
            (&mut req.arp_pa as *mut libc::sockaddr).cast::<libc::sockaddr_in>(),
            pa,
        );
    }
    req.arp_ha.sa_family = libc::ARPHRD_ETHER;
    for (d, s) in req.arp_ha.sa_data.iter_mut().zip(mac.0) {
        *d = s as libc::c_char;
    }
    req.arp_flags = libc::ATF_COM;
    for (d, s) in req.arp_dev.iter_mut().zip(dev.as_bytes_with_nul()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCSARP reads one arpreq through the pointer, which outlives the call; the
    // file descriptor is the socket's and stays open for the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSARP as _, &req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discover(mac: [u8; 6], xid: u32) -> Vec<u8> {
        let mut b = vec![0u8; 240];
        b[0] = 1;
        b[1] = 1;
        b[2] = 6;
        b[4..8].copy_from_slice(&xid.to_be_bytes());
        b[28..34].copy_from_slice(&mac);
        b[236..240].copy_from_slice(&[99, 130, 83, 99]);
        b.extend_from_slice(&[0, 0, 53, 1, 1, 255]);
        b
    }

    #[test]
    fn a_dhcp_socket_asks_for_a_receive_buffer_that_rides_out_a_storm() {
        use socket2::{Domain, Protocol, Socket, Type};
        let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        let default = sock.recv_buffer_size().unwrap();
        grow_receive_buffer(&sock, 67);
        let got = sock.recv_buffer_size().unwrap();
        if nix::unistd::geteuid().is_root() {
            // Root may pass net.core.rmem_max (Linux reports twice what was set).
            assert!(got >= SOCKET_RCVBUF, "{got} < {SOCKET_RCVBUF}");
        } else {
            assert!(got >= default, "{got} < {default}");
        }
    }

    #[test]
    fn peeks_read_header_and_type_and_refuse_garbage() {
        let b = discover([2, 0, 0, 0, 0, 9], 7);
        assert_eq!(peek_mac(&b), Some(Mac([2, 0, 0, 0, 0, 9])));
        assert_eq!(peek_msg_type(&b), Some(MessageType::Discover));
        assert_eq!(peek_msg_type(&b[..239]), None);
        let mut bad = b.clone();
        bad[2] = 16;
        assert_eq!(peek_mac(&bad), None);
        // An option length running past the end must not panic.
        let mut trunc = b[..240].to_vec();
        trunc.extend_from_slice(&[12, 200, 1]);
        assert_eq!(peek_msg_type(&trunc), None);
    }

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
