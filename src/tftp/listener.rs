//! The listener: the front of the tokio adapter around [`super::transfer`].
//!
//! This module owns [`TftpServer`], the listener loop, request classification and the start of
//! one transfer task per accepted request. The other adapter pieces are its siblings: the
//! transfer driver ([`super::driver`]), root confinement ([`super::root`]), IP_PKTINFO
//! ([`super::pktinfo`]) and reporting ([`super::report`]). Protocol decisions stay in the pure
//! modules; here we only move bytes. The adapter as a whole:
//!
//! - **Listener.** One UDP socket (pre-bound by the caller, or bound by [`TftpServer::bind`])
//!   with IP_PKTINFO / IPV6_RECVPKTINFO enabled, so a `0.0.0.0` listener learns which local
//!   address each request was sent to. Only RRQ and WRQ are accepted there; anything else is
//!   counted and dropped, and we never answer malformed packets (no reflection).
//! - **Transfers.** Each request gets a task and its own socket bound to that local address
//!   (the reply must come from the address the client talked to, or a multi-homed appliance
//!   answers from the wrong IP) and connected to the client, so stray packets from other ports
//!   never reach it. The pure [`super::admission`] table decides which request runs, which
//!   waits for a slot (a full table holds requests rather than answering ERROR, which boot
//!   firmware treats as final), which is dropped unanswered and reported as
//!   [`TransferOutcome::Busy`] (over its client's cap, or waited out), and which stalled
//!   transfer gives its slot to a waiting request ([`TransferOutcome::Reclaimed`]). Transfer
//!   tasks report progress through an atomic the listener copies into the table before it
//!   decides. Every transfer has a deadline. A retransmitted RRQ (the client gave up waiting for our first reply) starts a
//!   second transfer; the client keeps the first reply's port and answers the other one with
//!   ERROR 5, which ends it quietly. We keep no per-peer table, so a stuck transfer can never
//!   block the same client's next request (the async-tftp failure).
//! - **Read-only, a fixed set or root-confined.** WRQ gets ERROR 2. File names with `..`, a
//!   leading `/` or a backslash get ERROR 2. The appliance serves a fixed set of named files
//!   loaded at start ([`TftpServer::with_files`], `crate::firststage`): the name is only
//!   looked up in that set, never joined to a path, and anything else gets ERROR 1. The
//!   general root mode ([`TftpServer::new`]) canonicalizes the path (following symlinks) and
//!   requires it to stay under the canonical root, so a symlink cannot escape it.
//!   Only `octet` mode is served: boot firmware never asks for anything else, and netascii
//!   conversion would make `tsize` wrong.
//! - **Reporting.** Each request ends in one [`TransferEvent`] sent with `try_send` (a slow
//!   consumer never stalls a transfer; drops are counted), a tracing span per transfer, and
//!   `metrics` counters: `tftp_transfers_total{outcome}`, `tftp_bytes_delivered_total` (bytes
//!   acknowledged by clients), `tftp_malformed_packets_total`, `tftp_unexpected_packets_total`,
//!   `tftp_requests_dropped_total{reason}` (`per_client`, `queue_full`, `wait_expired`),
//!   `tftp_transfers_reclaimed_total` and `tftp_events_dropped_total`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::counter;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::admission::{Admission, Id, Refusal, Step};
use super::config::{ServerError, TftpConfig};
use super::driver::run_request;
use super::packet::{Mode, Options, Packet};
use super::pktinfo::{enable_packet_info, normalize, recv_request};
use super::report::{TransferEvent, TransferOutcome, report};
use super::root::Source;
use super::transfer::Limits;

/// Largest request we read on the listener; a real RRQ is well under 600 bytes.
const REQUEST_BUF: usize = 4096;

/// A read-only TFTP server over one root directory or a fixed set of named files.
#[derive(Debug)]
pub struct TftpServer {
    config: TftpConfig,
    source: Source,
    events: Option<mpsc::Sender<TransferEvent>>,
    boot_media: Arc<BootMedia>,
}

/// Boot media served beside the fixed set, by exact name: the boot sets' UKIs, as
/// `assets/<talos>/<schematic>/<arch>/<file>` (the same path as over HTTP) to the file in the
/// artifact cache. Names are matched exactly, never joined to a path.
pub type BootMedia = std::collections::BTreeMap<String, std::path::PathBuf>;

/// State shared by the listener and every transfer task.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) config: TftpConfig,
    pub(super) limits: Limits,
    pub(super) source: Source,
    pub(super) events: Option<mpsc::Sender<TransferEvent>>,
    /// [`BootMedia`].
    pub(super) boot_media: Arc<BootMedia>,
    /// When the server started; admission times are offsets from it.
    pub(super) epoch: Instant,
}

impl TftpServer {
    /// A server for files under `root`. The root is canonicalized now, so later symlink checks
    /// compare against its real location.
    pub fn new(config: TftpConfig, root: impl AsRef<Path>) -> Result<Self, ServerError> {
        config.validate()?;
        let given = root.as_ref();
        let root = std::fs::canonicalize(given).map_err(|source| ServerError::Root {
            path: given.to_path_buf(),
            source,
        })?;
        if !root.is_dir() {
            return Err(ServerError::RootNotDir {
                path: given.to_path_buf(),
            });
        }
        Ok(TftpServer {
            config,
            source: Source::Root(root),
            events: None,
            boot_media: Arc::default(),
        })
    }

    /// A server for exactly the files in `files`, by name. No request ever reaches the
    /// filesystem.
    pub(crate) fn with_files(
        config: TftpConfig,
        files: Arc<crate::firststage::FirstStage>,
    ) -> Result<Self, ServerError> {
        config.validate()?;
        Ok(TftpServer {
            config,
            source: Source::Files(files),
            events: None,
            boot_media: Arc::default(),
        })
    }

    /// Also serve `media` ([`BootMedia`]) by exact name.
    pub fn with_boot_media(mut self, media: BootMedia) -> Self {
        self.boot_media = Arc::new(media);
        self
    }

    /// Send a [`TransferEvent`] for every request to `events`. Delivery uses `try_send`: when
    /// the channel is full the event is dropped and counted, never waited for.
    pub fn with_events(mut self, events: mpsc::Sender<TransferEvent>) -> Self {
        self.events = Some(events);
        self
    }

    /// The canonical root directory files are served from (none for a fixed set).
    pub fn root(&self) -> Option<&Path> {
        match &self.source {
            Source::Root(root) => Some(root),
            Source::Files(_) => None,
        }
    }

    /// Bind a listener socket on `addr` (normally `0.0.0.0:69`).
    pub async fn bind(addr: SocketAddr) -> Result<UdpSocket, ServerError> {
        UdpSocket::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })
    }

    /// Serve requests arriving on `socket` until `cancel` fires; then stop every transfer
    /// (each sends the client an ERROR) and return once they have all ended.
    pub async fn serve(
        self,
        socket: UdpSocket,
        cancel: CancellationToken,
    ) -> Result<(), ServerError> {
        let listen_addr = socket.local_addr().map_err(ServerError::Socket)?;
        enable_packet_info(&socket, listen_addr).map_err(ServerError::Socket)?;
        let mut l = Listener::new(self.into_shared(), cancel);
        let epoch = l.shared.epoch;
        let mut buf = vec![0u8; REQUEST_BUF];
        let mut cmsg = nix::cmsg_space!(nix::libc::in_pktinfo, nix::libc::in6_pktinfo);
        info!(
            %listen_addr,
            files = %l.shared.source.describe(),
            max_transfers = l.shared.config.max_transfers,
            max_per_client = l.shared.config.max_per_client,
            "TFTP server listening"
        );
        loop {
            let wake = l.table.next_wakeup().map(|at| epoch + at);
            tokio::select! {
                _ = l.cancel.cancelled() => break,
                Some(joined) = l.tasks.join_next_with_id(), if !l.tasks.is_empty() => {
                    l.joined(joined);
                }
                _ = sleep_until_opt(wake), if wake.is_some() => l.tick(),
                received = recv_request(&socket, &mut buf, &mut cmsg) => match received {
                    Ok(r) => {
                        let Some(request) = classify(&buf[..r.len], r.truncated, r.peer) else {
                            continue;
                        };
                        let (peer, local) = normalize(r.peer, r.local, listen_addr);
                        l.admit(request, peer, local);
                    }
                    Err(e) => {
                        // Nothing the listener can do about a failed receive except not spin.
                        warn!(error = %e, "TFTP listener receive failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
            l.apply_steps();
        }
        while l.tasks.join_next().await.is_some() {}
        info!(%listen_addr, "TFTP server stopped");
        Ok(())
    }

    /// The state every transfer task shares, the server's clock starting now.
    fn into_shared(self) -> Arc<Shared> {
        Arc::new(Shared {
            limits: Limits {
                max_blksize: self.config.max_blksize,
                max_windowsize: self.config.max_windowsize,
                default_timeout: self.config.default_timeout,
                max_timeout: self.config.max_timeout,
            },
            epoch: Instant::now(),
            config: self.config,
            source: self.source,
            events: self.events,
            boot_media: self.boot_media,
        })
    }
}

/// The listener loop's state: the admission table, the running transfers and their tasks.
struct Listener {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    table: Admission<Pending>,
    running: HashMap<Id, Running>,
    task_ids: HashMap<tokio::task::Id, Id>,
    /// What the table last decided, carried out by [`Listener::apply_steps`].
    steps: Vec<Step<Pending>>,
    tasks: JoinSet<()>,
}

impl Listener {
    fn new(shared: Arc<Shared>, cancel: CancellationToken) -> Self {
        Listener {
            table: Admission::new(shared.config.admission()),
            shared,
            cancel,
            running: HashMap::new(),
            task_ids: HashMap::new(),
            steps: Vec::new(),
            tasks: JoinSet::new(),
        }
    }

    /// A transfer task ended: its slot is free.
    fn joined(&mut self, joined: Result<(tokio::task::Id, ()), tokio::task::JoinError>) {
        let task = match joined {
            Ok((task, ())) => task,
            Err(e) => {
                warn!(error = %e, "TFTP transfer task failed");
                e.id()
            }
        };
        if let Some(id) = self.task_ids.remove(&task) {
            self.running.remove(&id);
            self.table
                .finished(id, self.shared.epoch.elapsed(), &mut self.steps);
        }
    }

    /// The table's next deadline passed (a wait expired, a transfer may have stalled).
    fn tick(&mut self) {
        sync_progress(&mut self.table, &self.running);
        self.table
            .tick(self.shared.epoch.elapsed(), &mut self.steps);
    }

    /// Hands a request to the table.
    fn admit(&mut self, request: Request, peer: SocketAddr, local: SocketAddr) {
        if self.table.waiting() > 0 || self.table.active() >= self.shared.config.max_transfers {
            sync_progress(&mut self.table, &self.running);
        }
        let file = request.filename().to_owned();
        let pending = Pending {
            request,
            peer,
            local,
        };
        let now = self.shared.epoch.elapsed();
        self.table
            .request(now, peer, &file, pending, &mut self.steps);
    }

    /// Carries out what the table decided.
    fn apply_steps(&mut self) {
        // Taken and put back, so the buffer is reused.
        let mut steps = std::mem::take(&mut self.steps);
        for step in steps.drain(..) {
            match step {
                Step::Start { id, request } => self.start(id, request),
                Step::Reclaim { id } => {
                    if let Some(r) = self.running.remove(&id) {
                        counter!("tftp_transfers_reclaimed_total").increment(1);
                        r.reclaim.cancel();
                    }
                }
                Step::Refuse { request, why } => self.refuse(&request, why),
            }
        }
        self.steps = steps;
    }

    /// Starts transfer `id` in its own task.
    fn start(&mut self, id: Id, request: Pending) {
        let ctl = TransferCtl {
            shutdown: self.cancel.child_token(),
            reclaim: CancellationToken::new(),
            progress: Arc::new(AtomicU64::new(millis(self.shared.epoch.elapsed()))),
        };
        self.running.insert(
            id,
            Running {
                reclaim: ctl.reclaim.clone(),
                progress: Arc::clone(&ctl.progress),
            },
        );
        let span = info_span!(
            "tftp_transfer",
            peer = %request.peer,
            file = ?request.request.filename(),
            blksize = tracing::field::Empty,
            windowsize = tracing::field::Empty,
            tsize = tracing::field::Empty,
        );
        let shared = Arc::clone(&self.shared);
        let Pending {
            request,
            peer,
            local,
        } = request;
        let handle = self.tasks.spawn(
            async move { run_request(&shared, request, peer, local, ctl).await }.instrument(span),
        );
        self.task_ids.insert(handle.id(), id);
    }

    /// Drops `request` unanswered and reports it busy.
    fn refuse(&self, request: &Pending, why: Refusal) {
        counter!("tftp_requests_dropped_total", "reason" => why.label()).increment(1);
        debug!(
            peer = %request.peer,
            reason = why.label(),
            "TFTP request dropped without an answer (the client resends)"
        );
        report(
            &self.shared,
            TransferEvent {
                peer: request.peer,
                local: request.local.ip(),
                file: request.request.filename().to_owned(),
                bytes: 0,
                elapsed: Duration::ZERO,
                outcome: TransferOutcome::Busy,
            },
        );
    }
}

/// A request admitted to the table, not yet started.
#[derive(Debug)]
struct Pending {
    request: Request,
    peer: SocketAddr,
    local: SocketAddr,
}

/// The listener's handles on one running transfer.
#[derive(Debug)]
struct Running {
    reclaim: CancellationToken,
    progress: Arc<AtomicU64>,
}

/// What a transfer task gets from the listener: how it is stopped and where it reports
/// progress (milliseconds since the server started, written by the task, read by the listener).
#[derive(Debug)]
pub(super) struct TransferCtl {
    /// The server is shutting down.
    pub(super) shutdown: CancellationToken,
    /// The admission table gave this transfer's slot to a waiting request.
    pub(super) reclaim: CancellationToken,
    /// Time of the last ACK that moved the transfer forward.
    pub(super) progress: Arc<AtomicU64>,
}

/// Milliseconds in `d`, as stored in [`TransferCtl::progress`].
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Copy each running transfer's last progress into the table before it decides on reclaims.
fn sync_progress(table: &mut Admission<Pending>, running: &HashMap<Id, Running>) {
    for (id, r) in running {
        let at = Duration::from_millis(r.progress.load(Ordering::Relaxed));
        table.progress(*id, at);
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A request accepted from the listener.
#[derive(Debug)]
pub(super) enum Request {
    Read {
        filename: String,
        mode: Mode,
        options: Options,
    },
    Write {
        filename: String,
    },
}

impl Request {
    pub(super) fn filename(&self) -> &str {
        match self {
            Request::Read { filename, .. } | Request::Write { filename } => filename,
        }
    }
}

/// Keep requests; count and drop everything else.
fn classify(bytes: &[u8], truncated: bool, peer: SocketAddr) -> Option<Request> {
    if truncated {
        counter!("tftp_malformed_packets_total").increment(1);
        debug!(%peer, "dropped an oversized datagram on the TFTP listener");
        return None;
    }
    match Packet::parse(bytes) {
        Ok(Packet::Rrq {
            filename,
            mode,
            options,
        }) => Some(Request::Read {
            filename,
            mode,
            options,
        }),
        Ok(Packet::Wrq { filename, .. }) => Some(Request::Write { filename }),
        Ok(other) => {
            counter!("tftp_unexpected_packets_total").increment(1);
            debug!(
                %peer,
                packet = kind(&other),
                "ignored a non-request packet on the TFTP listener"
            );
            None
        }
        Err(e) => {
            counter!("tftp_malformed_packets_total").increment(1);
            debug!(%peer, error = %e, "ignored a malformed TFTP packet");
            None
        }
    }
}

pub(super) fn kind(packet: &Packet) -> &'static str {
    match packet {
        Packet::Rrq { .. } => "RRQ",
        Packet::Wrq { .. } => "WRQ",
        Packet::Data { .. } => "DATA",
        Packet::Ack { .. } => "ACK",
        Packet::Error { .. } => "ERROR",
        Packet::Oack { .. } => "OACK",
    }
}
