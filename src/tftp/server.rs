//! The tokio adapter around [`super::transfer`]: sockets, files, timers and bookkeeping.
//!
//! This module owns the listener loop, one task per transfer, path resolution under the TFTP
//! root, and reporting. Protocol decisions stay in the pure modules; here we only move bytes.
//!
//! - **Listener.** One UDP socket (pre-bound by the caller, or bound by [`TftpServer::bind`])
//!   with IP_PKTINFO / IPV6_RECVPKTINFO enabled, so a `0.0.0.0` listener learns which local
//!   address each request was sent to. Only RRQ and WRQ are accepted there; anything else is
//!   counted and dropped, and we never answer malformed packets (no reflection).
//! - **Transfers.** Each request gets a task and its own socket bound to that local address
//!   (the reply must come from the address the client talked to, or a multi-homed appliance
//!   answers from the wrong IP) and connected to the client, so stray packets from other ports
//!   never reach it. A semaphore caps concurrent transfers; a request over the cap is dropped
//!   (the client retries its RRQ) and reported as [`TransferOutcome::Busy`]. Every transfer has
//!   a deadline. A retransmitted RRQ (the client gave up waiting for our first reply) starts a
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
//!   `tftp_requests_dropped_total{reason}` and `tftp_events_dropped_total`.

use std::io::{self, IoSliceMut, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, setsockopt, sockopt,
};
use tokio::io::{AsyncReadExt, AsyncSeekExt, BufReader, Interest};
use tokio::net::UdpSocket;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::packet::{DATA_HEADER_LEN, ErrorCode, MAX_BLKSIZE, MIN_BLKSIZE, Mode, Options, Packet};
use super::transfer::{AbortReason, Action, Event, Limits, Transfer, negotiate};

/// Largest request we read on the listener; a real RRQ is well under 600 bytes.
const REQUEST_BUF: usize = 4096;
/// Largest packet we read from a client during a transfer (ACK or ERROR).
const REPLY_BUF: usize = 1500;
/// Read-ahead for file data, so sequential blocks cost one blocking read per 64 KiB.
const FILE_BUF: usize = 64 * 1024;

/// Tunables of the TFTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TftpConfig {
    /// Largest `blksize` granted. Set it to the serving interface's MTU minus 32 (20 IPv4 +
    /// 8 UDP + 4 TFTP header bytes) so blocks are never fragmented; 1468 fits a 1500 MTU.
    pub max_blksize: u16,
    /// Largest `windowsize` granted (RFC 7440). Measurements level off around 64.
    pub max_windowsize: u16,
    /// Retransmission timeout when the client does not negotiate `timeout`.
    pub default_timeout: Duration,
    /// Retransmissions in a row without progress before a transfer is abandoned.
    pub max_retries: u32,
    /// Upper bound on one transfer's total time, from request to last ACK.
    pub transfer_deadline: Duration,
    /// Transfers served at once; requests beyond this are dropped (clients retry).
    pub max_transfers: usize,
}

impl Default for TftpConfig {
    fn default() -> Self {
        TftpConfig {
            max_blksize: 1468,
            max_windowsize: 64,
            default_timeout: Duration::from_secs(1),
            max_retries: 5,
            transfer_deadline: Duration::from_secs(300),
            max_transfers: 64,
        }
    }
}

impl TftpConfig {
    /// Check every field is usable, naming the first that is not.
    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |field, value: String, hint| Err(ServerError::Config { field, value, hint });
        if !(MIN_BLKSIZE..=MAX_BLKSIZE).contains(&self.max_blksize) {
            return bad(
                "max_blksize",
                self.max_blksize.to_string(),
                "use 8..=65464; normally the interface MTU minus 32 (1468 for MTU 1500)",
            );
        }
        if self.max_windowsize == 0 {
            return bad("max_windowsize", "0".into(), "use 1 (no windowing) or more");
        }
        if self.default_timeout.is_zero() {
            return bad(
                "default_timeout",
                "0s".into(),
                "use a positive duration such as 1s",
            );
        }
        if self.transfer_deadline.is_zero() {
            return bad(
                "transfer_deadline",
                "0s".into(),
                "use a positive duration such as 300s",
            );
        }
        if self.max_transfers == 0 {
            return bad("max_transfers", "0".into(), "allow at least 1 transfer");
        }
        Ok(())
    }
}

/// Why the TFTP server cannot start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The root directory cannot be resolved.
    #[error("TFTP root {path}: {source}; create the directory or point the TFTP root elsewhere")]
    Root {
        /// The root as configured.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The root exists but is not a directory.
    #[error("TFTP root {path} is not a directory; point the TFTP root at a directory")]
    RootNotDir {
        /// The root as configured.
        path: PathBuf,
    },
    /// A configuration value is out of range.
    #[error("TFTP setting `{field}` = {value} is invalid: {hint}")]
    Config {
        /// The field name.
        field: &'static str,
        /// The value given.
        value: String,
        /// What would be valid.
        hint: &'static str,
    },
    /// The listener socket cannot be bound.
    #[error(
        "cannot bind the TFTP listener on {addr}: {source}; port 69 needs root or \
         CAP_NET_BIND_SERVICE, and no other TFTP server may hold it"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The listener socket is unusable.
    #[error("TFTP listener socket: {0}")]
    Socket(#[source] io::Error),
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferOutcome {
    /// The client acknowledged the whole file.
    Completed,
    /// The client sent ERROR. Code 8 right after the OACK is the UEFI size probe, which is
    /// normal and followed by the real request.
    PeerAborted {
        /// The client's error code.
        code: ErrorCode,
        /// The client's message.
        message: String,
    },
    /// The client stopped acknowledging.
    TimedOut {
        /// Retransmissions made without progress.
        retries: u32,
    },
    /// The per-transfer deadline passed.
    DeadlineExceeded,
    /// The client's host reported its port closed (ICMP port unreachable).
    PeerGone,
    /// The server shut down mid-transfer.
    Cancelled,
    /// The request was answered with an ERROR packet (write request, bad path, missing file,
    /// unsupported mode).
    Refused {
        /// The error code sent.
        code: ErrorCode,
        /// Why, for the operator.
        reason: String,
    },
    /// The concurrency cap was reached; the request was dropped unanswered.
    Busy,
    /// A local error (socket or file read) ended the transfer.
    Failed {
        /// What went wrong.
        reason: String,
    },
}

impl TransferOutcome {
    /// A short stable name, used as the metrics label.
    pub fn label(&self) -> &'static str {
        match self {
            TransferOutcome::Completed => "completed",
            TransferOutcome::PeerAborted { .. } => "peer_aborted",
            TransferOutcome::TimedOut { .. } => "timed_out",
            TransferOutcome::DeadlineExceeded => "deadline_exceeded",
            TransferOutcome::PeerGone => "peer_gone",
            TransferOutcome::Cancelled => "cancelled",
            TransferOutcome::Refused { .. } => "refused",
            TransferOutcome::Busy => "busy",
            TransferOutcome::Failed { .. } => "failed",
        }
    }
}

/// What happened to one request, for the caller's per-node boot timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferEvent {
    /// The client's address and port.
    pub peer: SocketAddr,
    /// The local address the request arrived on (and the transfer was served from).
    pub local: IpAddr,
    /// The file name exactly as requested (untrusted: print it with `{:?}`).
    pub file: String,
    /// Bytes the client acknowledged.
    pub bytes: u64,
    /// Time from request to outcome.
    pub elapsed: Duration,
    /// How it ended.
    pub outcome: TransferOutcome,
}

/// A read-only TFTP server over one root directory or a fixed set of named files.
#[derive(Debug)]
pub struct TftpServer {
    config: TftpConfig,
    source: Source,
    events: Option<mpsc::Sender<TransferEvent>>,
}

/// Where served files come from.
#[derive(Debug, Clone)]
enum Source {
    /// Files under a canonical root directory, looked up per request.
    Root(PathBuf),
    /// A fixed set of files loaded at start, looked up by exact name.
    Files(Arc<crate::firststage::FirstStage>),
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Root(root) => root.display().to_string(),
            Source::Files(f) => format!(
                "{} ({})",
                f.dir().display(),
                f.names().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// State shared by the listener and every transfer task.
#[derive(Debug)]
struct Shared {
    config: TftpConfig,
    limits: Limits,
    source: Source,
    events: Option<mpsc::Sender<TransferEvent>>,
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
        })
    }

    /// A server for exactly the files in `files`, by name. No request ever reaches the
    /// filesystem.
    pub fn with_files(
        config: TftpConfig,
        files: Arc<crate::firststage::FirstStage>,
    ) -> Result<Self, ServerError> {
        config.validate()?;
        Ok(TftpServer {
            config,
            source: Source::Files(files),
            events: None,
        })
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
        let shared = Arc::new(Shared {
            limits: Limits {
                max_blksize: self.config.max_blksize,
                max_windowsize: self.config.max_windowsize,
                default_timeout: self.config.default_timeout,
            },
            config: self.config,
            source: self.source,
            events: self.events,
        });
        let permits = Arc::new(Semaphore::new(shared.config.max_transfers));
        let mut tasks = JoinSet::new();
        let mut buf = vec![0u8; REQUEST_BUF];
        let mut cmsg = nix::cmsg_space!(nix::libc::in_pktinfo, nix::libc::in6_pktinfo);
        info!(%listen_addr, files = %shared.source.describe(), "TFTP server listening");
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = joined {
                        warn!(error = %e, "TFTP transfer task failed");
                    }
                }
                received = recv_request(&socket, &mut buf, &mut cmsg) => match received {
                    Ok(r) => {
                        let Some(request) = classify(&buf[..r.len], r.truncated, r.peer) else {
                            continue;
                        };
                        let (peer, local) = normalize(r.peer, r.local, listen_addr);
                        match permits.clone().try_acquire_owned() {
                            Ok(permit) => {
                                let span = info_span!(
                                    "tftp_transfer",
                                    %peer,
                                    file = ?request.filename(),
                                    blksize = tracing::field::Empty,
                                    windowsize = tracing::field::Empty,
                                    tsize = tracing::field::Empty,
                                );
                                let shared = Arc::clone(&shared);
                                let cancel = cancel.child_token();
                                tasks.spawn(
                                    async move {
                                        run_request(&shared, request, peer, local, cancel).await;
                                        drop(permit);
                                    }
                                    .instrument(span),
                                );
                            }
                            Err(_) => {
                                counter!("tftp_requests_dropped_total", "reason" => "busy")
                                    .increment(1);
                                report(
                                    &shared,
                                    TransferEvent {
                                        peer,
                                        local: local.ip(),
                                        file: request.filename().to_owned(),
                                        bytes: 0,
                                        elapsed: Duration::ZERO,
                                        outcome: TransferOutcome::Busy,
                                    },
                                );
                            }
                        }
                    }
                    Err(e) => {
                        // Nothing the listener can do about a failed receive except not spin.
                        warn!(error = %e, "TFTP listener receive failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        while tasks.join_next().await.is_some() {}
        info!(%listen_addr, "TFTP server stopped");
        Ok(())
    }
}

/// A request accepted from the listener.
#[derive(Debug)]
enum Request {
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
    fn filename(&self) -> &str {
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

fn kind(packet: &Packet) -> &'static str {
    match packet {
        Packet::Rrq { .. } => "RRQ",
        Packet::Wrq { .. } => "WRQ",
        Packet::Data { .. } => "DATA",
        Packet::Ack { .. } => "ACK",
        Packet::Error { .. } => "ERROR",
        Packet::Oack { .. } => "OACK",
    }
}

/// Serve one request to its end and report it.
async fn run_request(
    shared: &Shared,
    request: Request,
    peer: SocketAddr,
    local: SocketAddr,
    cancel: CancellationToken,
) {
    let started = Instant::now();
    let deadline = started + shared.config.transfer_deadline;
    let (outcome, bytes) = match open_transfer_socket(local, peer).await {
        Ok(sock) => serve_request(shared, &request, &sock, deadline, &cancel).await,
        Err(e) => (
            TransferOutcome::Failed {
                reason: format!("cannot open a transfer socket on {local} towards {peer}: {e}"),
            },
            0,
        ),
    };
    report(
        shared,
        TransferEvent {
            peer,
            local: local.ip(),
            file: request.filename().to_owned(),
            bytes,
            elapsed: started.elapsed(),
            outcome,
        },
    );
}

async fn open_transfer_socket(local: SocketAddr, peer: SocketAddr) -> io::Result<UdpSocket> {
    let sock = UdpSocket::bind(local).await?;
    sock.connect(peer).await?;
    Ok(sock)
}

/// Answer the request on its transfer socket; returns the outcome and bytes acknowledged.
async fn serve_request(
    shared: &Shared,
    request: &Request,
    sock: &UdpSocket,
    deadline: Instant,
    cancel: &CancellationToken,
) -> (TransferOutcome, u64) {
    let (filename, mode, options) = match request {
        Request::Write { .. } => {
            return refuse(
                sock,
                ErrorCode::AccessViolation,
                "this TFTP server is read-only",
                "write request refused (the server is read-only)".into(),
            )
            .await;
        }
        Request::Read {
            filename,
            mode,
            options,
        } => (filename, *mode, options),
    };
    if mode != Mode::Octet {
        return refuse(
            sock,
            ErrorCode::NotDefined,
            "only octet (binary) mode is supported",
            format!("{} mode requested; only octet is served", mode.as_str()),
        )
        .await;
    }
    let (path, data) = match &shared.source {
        Source::Files(files) => match lookup(files, filename) {
            Ok(bytes) => (PathBuf::from(filename), Data::Memory(bytes)),
            Err(e) => {
                let (code, client_msg) = e.reply();
                return refuse(sock, code, client_msg, e.to_string()).await;
            }
        },
        Source::Root(root) => {
            let path = match resolve(root, filename).await {
                Ok(path) => path,
                Err(e) => {
                    let (code, client_msg) = e.reply();
                    return refuse(sock, code, client_msg, e.to_string()).await;
                }
            };
            match tokio::fs::File::open(&path).await {
                Ok(f) => (path, Data::File(BufReader::with_capacity(FILE_BUF, f))),
                Err(e) => {
                    let e = ResolveError::from_io(e);
                    let (code, client_msg) = e.reply();
                    return refuse(sock, code, client_msg, e.to_string()).await;
                }
            }
        }
    };
    let size = match &data {
        Data::Memory(bytes) => bytes.len() as u64,
        Data::File(file) => match file.get_ref().metadata().await {
            Ok(meta) => meta.len(),
            Err(e) => {
                return fail(sock, format!("cannot stat {}: {e}", path.display())).await;
            }
        },
    };

    let negotiated = negotiate(options, size, &shared.limits);
    let span = tracing::Span::current();
    span.record("blksize", negotiated.blksize);
    span.record("windowsize", negotiated.windowsize);
    span.record("tsize", size);
    let mut transfer = Transfer::new(&negotiated, size, shared.config.max_retries);
    let mut reader = BlockReader { data, pos: 0 };
    let outcome = tokio::select! {
        result = drive(sock, &mut transfer, &mut reader, &path) => match result {
            Ok(outcome) => outcome,
            Err(DriveError::PeerGone) => TransferOutcome::PeerGone,
            Err(DriveError::Network(e)) => TransferOutcome::Failed {
                reason: format!("transfer socket: {e}"),
            },
            Err(DriveError::File(reason)) => {
                send_error(sock, ErrorCode::NotDefined, "server could not read the file").await;
                TransferOutcome::Failed { reason }
            }
        },
        _ = cancel.cancelled() => {
            send_error(sock, ErrorCode::NotDefined, "server shutting down").await;
            TransferOutcome::Cancelled
        }
        _ = tokio::time::sleep_until(deadline) => {
            send_error(sock, ErrorCode::NotDefined, "transfer deadline exceeded").await;
            TransferOutcome::DeadlineExceeded
        }
    };
    (outcome, transfer.bytes_acknowledged())
}

async fn refuse(
    sock: &UdpSocket,
    code: ErrorCode,
    client_msg: &str,
    reason: String,
) -> (TransferOutcome, u64) {
    send_error(sock, code, client_msg).await;
    (TransferOutcome::Refused { code, reason }, 0)
}

async fn fail(sock: &UdpSocket, reason: String) -> (TransferOutcome, u64) {
    send_error(
        sock,
        ErrorCode::NotDefined,
        "server could not read the file",
    )
    .await;
    (TransferOutcome::Failed { reason }, 0)
}

/// Best effort: the client may already be gone, and an ERROR is never retransmitted.
async fn send_error(sock: &UdpSocket, code: ErrorCode, message: &str) {
    let packet = Packet::Error {
        code,
        message: message.to_owned(),
    };
    if let Err(e) = sock.send(&packet.to_bytes()).await {
        debug!(error = %e, "could not send TFTP ERROR to the client");
    }
}

#[derive(Debug)]
enum DriveError {
    /// ICMP port unreachable came back: the client closed its port.
    PeerGone,
    /// Any other socket error.
    Network(io::Error),
    /// Reading the file failed (message names the file).
    File(String),
}

impl From<io::Error> for DriveError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::ConnectionRefused {
            DriveError::PeerGone
        } else {
            DriveError::Network(e)
        }
    }
}

/// Run the state machine over the transfer socket until it completes or aborts.
async fn drive(
    sock: &UdpSocket,
    transfer: &mut Transfer,
    reader: &mut BlockReader,
    path: &Path,
) -> Result<TransferOutcome, DriveError> {
    let mut actions = Vec::new();
    let mut packet = Vec::new();
    let mut reply = vec![0u8; REPLY_BUF];
    transfer.start(&mut actions);
    let mut retransmit_at = Instant::now();
    loop {
        let mut sent = false;
        for action in actions.drain(..) {
            match action {
                Action::SendOack(options) => {
                    packet.clear();
                    Packet::Oack { options }.encode(&mut packet);
                    sock.send(&packet).await?;
                    sent = true;
                }
                Action::SendData(block) => {
                    packet.clear();
                    packet.extend_from_slice(&super::packet::data_header(block.block));
                    packet.resize(DATA_HEADER_LEN + block.len, 0);
                    reader
                        .read_at(block.offset, &mut packet[DATA_HEADER_LEN..])
                        .await
                        .map_err(|e| {
                            DriveError::File(format!(
                                "reading {} bytes at offset {} of {}: {e} (did the file change \
                                 during the transfer?)",
                                block.len,
                                block.offset,
                                path.display()
                            ))
                        })?;
                    sock.send(&packet).await?;
                    sent = true;
                }
                Action::Done => return Ok(TransferOutcome::Completed),
                Action::Abort(AbortReason::PeerError { code, message }) => {
                    return Ok(TransferOutcome::PeerAborted { code, message });
                }
                Action::Abort(AbortReason::RetriesExhausted { retries }) => {
                    send_error(sock, ErrorCode::NotDefined, "timed out waiting for ACK").await;
                    return Ok(TransferOutcome::TimedOut { retries });
                }
            }
        }
        // The timer restarts only when something was sent; ignored packets (duplicate ACKs)
        // must not keep a dead transfer alive.
        if sent {
            retransmit_at = Instant::now() + transfer.retransmit_timeout();
        }
        let event = match tokio::time::timeout_at(retransmit_at, sock.recv(&mut reply)).await {
            Err(_elapsed) => Event::Timeout,
            Ok(received) => match Packet::parse(&reply[..received?]) {
                Ok(Packet::Ack { block }) => Event::Ack(block),
                Ok(Packet::Error { code, message }) => Event::Error { code, message },
                Ok(other) => {
                    counter!("tftp_unexpected_packets_total").increment(1);
                    debug!(
                        packet = kind(&other),
                        "ignored a non-ACK packet during a transfer"
                    );
                    continue;
                }
                Err(e) => {
                    counter!("tftp_malformed_packets_total").increment(1);
                    debug!(error = %e, "ignored a malformed TFTP packet during a transfer");
                    continue;
                }
            },
        };
        transfer.handle(event, &mut actions);
    }
}

/// What a transfer reads from.
enum Data {
    /// A file opened for this transfer.
    File(BufReader<tokio::fs::File>),
    /// Contents loaded at start.
    Memory(axum::body::Bytes),
}

/// Sequential reads through a buffer; seeks only when go-back-N rewinds.
struct BlockReader {
    data: Data,
    pos: u64,
}

impl BlockReader {
    async fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let file = match &mut self.data {
            Data::Memory(bytes) => {
                let slice = usize::try_from(offset)
                    .ok()
                    .and_then(|start| bytes.get(start..start.checked_add(buf.len())?))
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(slice);
                return Ok(());
            }
            Data::File(file) => file,
        };
        if offset != self.pos {
            file.seek(SeekFrom::Start(offset)).await?;
            self.pos = offset;
        }
        match file.read_exact(buf).await {
            Ok(_) => {
                self.pos += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Position unknown after a failed read; force a seek next time.
                self.pos = u64::MAX;
                Err(e)
            }
        }
    }
}

/// Count, log and publish one request's outcome.
fn report(shared: &Shared, event: TransferEvent) {
    counter!("tftp_transfers_total", "outcome" => event.outcome.label()).increment(1);
    counter!("tftp_bytes_delivered_total").increment(event.bytes);
    let (peer, file, bytes) = (event.peer, &event.file, event.bytes);
    let elapsed_ms = event.elapsed.as_millis() as u64;
    match &event.outcome {
        TransferOutcome::Completed => {
            info!(%peer, ?file, bytes, elapsed_ms, "TFTP transfer completed")
        }
        TransferOutcome::PeerAborted {
            code: ErrorCode::OptionNegotiation,
            message,
        } => debug!(
            %peer, ?file, ?message,
            "client ended the transfer after option negotiation (firmware size probe)"
        ),
        TransferOutcome::PeerAborted { code, message } => {
            info!(%peer, ?file, %code, ?message, bytes, "client aborted the TFTP transfer")
        }
        TransferOutcome::Refused { code, reason } => {
            if *code == ErrorCode::AccessViolation {
                warn!(%peer, ?file, %code, %reason, "TFTP request refused")
            } else {
                info!(%peer, ?file, %code, %reason, "TFTP request refused")
            }
        }
        TransferOutcome::Cancelled => debug!(%peer, ?file, bytes, "TFTP transfer cancelled"),
        TransferOutcome::Busy => warn!(
            %peer, ?file,
            max_transfers = shared.config.max_transfers,
            "TFTP request dropped: too many transfers in progress (the client will retry)"
        ),
        TransferOutcome::TimedOut { retries } => {
            warn!(%peer, ?file, bytes, retries, "TFTP client stopped acknowledging")
        }
        TransferOutcome::DeadlineExceeded => warn!(
            %peer, ?file, bytes,
            deadline_s = shared.config.transfer_deadline.as_secs(),
            "TFTP transfer exceeded its deadline"
        ),
        TransferOutcome::PeerGone => {
            warn!(%peer, ?file, bytes, "TFTP client port closed mid-transfer")
        }
        TransferOutcome::Failed { reason } => {
            warn!(%peer, ?file, bytes, %reason, "TFTP transfer failed")
        }
    }
    if let Some(events) = &shared.events
        && events.try_send(event).is_err()
    {
        counter!("tftp_events_dropped_total").increment(1);
    }
}

/// Why a requested file cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The name itself is refused before touching the filesystem.
    #[error("refused file name: {0}")]
    Name(#[from] NameError),
    /// The name resolves (through a symlink) outside the root.
    #[error("`{0}` resolves outside the TFTP root (symlink escape)")]
    Escapes(PathBuf),
    /// Nothing at that path.
    #[error("no such file among those served")]
    NotFound,
    /// The path names a directory or special file.
    #[error("not a regular file")]
    NotAFile,
    /// The server may not read the file.
    #[error("permission denied: {0}")]
    Denied(io::Error),
    /// Any other filesystem error.
    #[error("cannot open the file: {0}")]
    Io(io::Error),
}

impl ResolveError {
    fn from_io(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => ResolveError::NotFound,
            io::ErrorKind::PermissionDenied => ResolveError::Denied(e),
            _ => ResolveError::Io(e),
        }
    }

    /// The ERROR code and message the client gets (no server paths in it).
    fn reply(&self) -> (ErrorCode, &'static str) {
        match self {
            ResolveError::Name(_) | ResolveError::Escapes(_) | ResolveError::Denied(_) => {
                (ErrorCode::AccessViolation, "access violation")
            }
            ResolveError::NotFound | ResolveError::NotAFile => {
                (ErrorCode::FileNotFound, "file not found")
            }
            ResolveError::Io(_) => (ErrorCode::NotDefined, "server could not open the file"),
        }
    }
}

/// Why a requested file name is refused outright.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Starts with `/`.
    #[error("absolute paths are refused; ask for a path relative to the TFTP root")]
    Absolute,
    /// Contains `\` (a Windows-style path, or an attempt to smuggle `..\`).
    #[error("backslashes are refused in TFTP file names")]
    Backslash,
    /// Contains a `..` component.
    #[error("`..` components are refused in TFTP file names")]
    ParentDir,
    /// Names no file (empty, or only `.` and `/`).
    #[error("the file name names no file")]
    Empty,
}

/// Check a requested name and turn it into a relative path, without touching the filesystem.
pub fn check_name(name: &str) -> Result<PathBuf, NameError> {
    if name.contains('\\') {
        return Err(NameError::Backslash);
    }
    if name.starts_with('/') {
        return Err(NameError::Absolute);
    }
    let mut rel = PathBuf::new();
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(NameError::ParentDir),
            Component::RootDir | Component::Prefix(_) => return Err(NameError::Absolute),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(NameError::Empty);
    }
    Ok(rel)
}

/// Look a requested name up in the fixed set: `..`, absolute and backslash names are access
/// violations, any other name outside the set is not found.
pub fn lookup(
    files: &crate::firststage::FirstStage,
    name: &str,
) -> Result<axum::body::Bytes, ResolveError> {
    check_name(name)?;
    files.get(name).ok_or(ResolveError::NotFound)
}

/// Resolve a requested name to a regular file under the canonical `root`.
pub async fn resolve(root: &Path, name: &str) -> Result<PathBuf, ResolveError> {
    let rel = check_name(name)?;
    let canonical = tokio::fs::canonicalize(root.join(&rel))
        .await
        .map_err(ResolveError::from_io)?;
    if !canonical.starts_with(root) {
        return Err(ResolveError::Escapes(rel));
    }
    let meta = tokio::fs::metadata(&canonical)
        .await
        .map_err(ResolveError::from_io)?;
    if !meta.is_file() {
        return Err(ResolveError::NotAFile);
    }
    Ok(canonical)
}

/// Ask the kernel to tell us each datagram's local destination address.
fn enable_packet_info(sock: &UdpSocket, addr: SocketAddr) -> io::Result<()> {
    match addr {
        SocketAddr::V4(_) => setsockopt(sock, sockopt::Ipv4PacketInfo, &true)?,
        SocketAddr::V6(_) => {
            setsockopt(sock, sockopt::Ipv6RecvPacketInfo, &true)?;
            // IPv4 clients of a dual-stack socket report through IP_PKTINFO; on a v6-only
            // socket this option is refused, which is fine.
            let _ = setsockopt(sock, sockopt::Ipv4PacketInfo, &true);
        }
    }
    Ok(())
}

/// One datagram read from the listener.
#[derive(Debug)]
struct Received {
    len: usize,
    peer: SocketAddr,
    /// The local address it was sent to, when the kernel told us.
    local: Option<SocketAddr>,
    truncated: bool,
}

/// `recvmsg` on the tokio socket, collecting the packet-info control message.
async fn recv_request(sock: &UdpSocket, buf: &mut [u8], cmsg: &mut [u8]) -> io::Result<Received> {
    sock.async_io(Interest::READABLE, || {
        let mut iov = [IoSliceMut::new(&mut *buf)];
        let msg = recvmsg::<SockaddrStorage>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut *cmsg),
            MsgFlags::empty(),
        )?;
        let peer = msg
            .address
            .as_ref()
            .and_then(std_addr)
            .ok_or_else(|| io::Error::other("datagram without an IP source address"))?;
        let mut local = None;
        // A truncated control buffer (ENOBUFS) only loses the local address; fall back.
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                match c {
                    ControlMessageOwned::Ipv4PacketInfo(info) => {
                        // ipi_spec_dst is the local address the kernel would answer from; for
                        // a unicast request it is the address the client sent to.
                        let spec = u32::from_be(info.ipi_spec_dst.s_addr);
                        let dst = u32::from_be(info.ipi_addr.s_addr);
                        let ip = Ipv4Addr::from(if spec != 0 { spec } else { dst });
                        local = Some(SocketAddr::new(IpAddr::V4(ip), 0));
                    }
                    ControlMessageOwned::Ipv6PacketInfo(info) => {
                        let ip = Ipv6Addr::from(info.ipi6_addr.s6_addr);
                        // Link-local addresses are only meaningful with their interface.
                        let scope = if ip.is_unicast_link_local() {
                            info.ipi6_ifindex
                        } else {
                            0
                        };
                        local = Some(SocketAddr::V6(SocketAddrV6::new(ip, 0, 0, scope)));
                    }
                    _ => {}
                }
            }
        }
        Ok(Received {
            len: msg.bytes,
            peer,
            local,
            truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
        })
    })
    .await
}

fn std_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::from(*v4));
    }
    addr.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6))
}

/// Pick the transfer socket's local address (port 0) and the peer in the same family.
///
/// IPv4 clients of a dual-stack listener appear as `::ffff:a.b.c.d`; they are served from a
/// plain IPv4 socket. Without packet info the listener's own address is used, and an
/// unspecified one lets the kernel choose.
fn normalize(
    peer: SocketAddr,
    local: Option<SocketAddr>,
    listen: SocketAddr,
) -> (SocketAddr, SocketAddr) {
    let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
    let local = match local {
        Some(SocketAddr::V6(v6)) if v6.ip().to_ipv4_mapped().is_some() => {
            SocketAddr::new(v6.ip().to_canonical(), 0)
        }
        Some(addr) => addr,
        None => SocketAddr::new(listen.ip().to_canonical(), 0),
    };
    let local = match (peer, local) {
        (SocketAddr::V4(_), SocketAddr::V6(_)) => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        (SocketAddr::V6(_), SocketAddr::V4(_)) => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0),
        _ => local,
    };
    (peer, local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::task::JoinHandle;

    /// A server running on a test socket, stopped when dropped.
    struct Running {
        addr: SocketAddr,
        cancel: CancellationToken,
        handle: Option<JoinHandle<Result<(), ServerError>>>,
        events: mpsc::Receiver<TransferEvent>,
        _root: tempfile::TempDir,
    }

    impl Running {
        async fn start(config: TftpConfig, bind: &str, files: &[(&str, Vec<u8>)]) -> Running {
            let root = tempfile::tempdir().unwrap();
            for (name, bytes) in files {
                let path = root.path().join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, bytes).unwrap();
            }
            let (tx, events) = mpsc::channel(64);
            let server = TftpServer::new(config, root.path())
                .unwrap()
                .with_events(tx);
            let socket = TftpServer::bind(bind.parse().unwrap()).await.unwrap();
            let addr = socket.local_addr().unwrap();
            let cancel = CancellationToken::new();
            let handle = tokio::spawn(server.serve(socket, cancel.clone()));
            Running {
                addr,
                cancel,
                handle: Some(handle),
                events,
                _root: root,
            }
        }

        /// The server's address as seen by a loopback client.
        fn target(&self, ip: &str) -> SocketAddr {
            SocketAddr::new(ip.parse().unwrap(), self.addr.port())
        }

        async fn next_event(&mut self) -> TransferEvent {
            tokio::time::timeout(Duration::from_secs(30), self.events.recv())
                .await
                .expect("no transfer event within 30 s")
                .expect("event channel closed")
        }

        async fn stop(mut self) {
            self.cancel.cancel();
            let handle = self.handle.take().unwrap();
            handle.await.unwrap().unwrap();
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.cancel.cancel();
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    async fn client() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").await.unwrap()
    }

    fn rrq(name: &str, options: Options) -> Vec<u8> {
        Packet::Rrq {
            filename: name.into(),
            mode: Mode::Octet,
            options,
        }
        .to_bytes()
    }

    fn ack(block: u16) -> Vec<u8> {
        Packet::Ack { block }.to_bytes()
    }

    async fn recv(sock: &UdpSocket) -> (Packet, SocketAddr) {
        let mut buf = vec![0u8; 70_000];
        let (n, from) = tokio::time::timeout(Duration::from_secs(10), sock.recv_from(&mut buf))
            .await
            .expect("no reply from the TFTP server within 10 s")
            .unwrap();
        (Packet::parse(&buf[..n]).unwrap(), from)
    }

    type Fetched = Result<(Vec<u8>, Option<Options>), (ErrorCode, String)>;

    /// A minimal windowed client (no loss handling: loopback does not lose packets).
    async fn fetch(sock: &UdpSocket, server: SocketAddr, name: &str, options: Options) -> Fetched {
        sock.send_to(&rrq(name, options), server).await.unwrap();
        let (first, tid) = recv(sock).await;
        assert_eq!(
            tid.ip(),
            server.ip(),
            "the reply must come from the address the request was sent to"
        );
        let (mut blksize, mut window, mut oack) = (512usize, 1u16, None);
        let mut pending = None;
        match first {
            Packet::Oack { options } => {
                blksize = options.blksize.map_or(512, usize::from);
                window = options.windowsize.unwrap_or(1);
                oack = Some(options);
                sock.send_to(&ack(0), tid).await.unwrap();
            }
            Packet::Error { code, message } => return Err((code, message)),
            data @ Packet::Data { .. } => pending = Some(data),
            other => panic!("unexpected first reply {other:?}"),
        }
        let (mut file, mut expected, mut in_window) = (Vec::new(), 1u16, 0u16);
        loop {
            let packet = match pending.take() {
                Some(p) => p,
                None => {
                    let (p, from) = recv(sock).await;
                    assert_eq!(from, tid, "reply from a different transfer ID");
                    p
                }
            };
            match packet {
                Packet::Data { block, data } => {
                    assert_eq!(block, expected, "out-of-order block on loopback");
                    let last = data.len() < blksize;
                    file.extend_from_slice(&data);
                    expected = expected.wrapping_add(1);
                    in_window += 1;
                    if last || in_window == window {
                        sock.send_to(&ack(block), tid).await.unwrap();
                        in_window = 0;
                    }
                    if last {
                        return Ok((file, oack));
                    }
                }
                Packet::Error { code, message } => return Err((code, message)),
                other => panic!("unexpected packet {other:?}"),
            }
        }
    }

    #[test]
    fn name_checks() {
        assert_eq!(check_name("ipxe.efi").unwrap(), PathBuf::from("ipxe.efi"));
        assert_eq!(check_name("sub/file").unwrap(), PathBuf::from("sub/file"));
        assert_eq!(
            check_name("./sub//file").unwrap(),
            PathBuf::from("sub/file")
        );
        assert_eq!(check_name("../etc/passwd"), Err(NameError::ParentDir));
        assert_eq!(check_name("sub/../../x"), Err(NameError::ParentDir));
        assert_eq!(check_name("sub/.."), Err(NameError::ParentDir));
        assert_eq!(check_name("/etc/passwd"), Err(NameError::Absolute));
        assert_eq!(check_name("a\\b"), Err(NameError::Backslash));
        assert_eq!(check_name("..\\..\\x"), Err(NameError::Backslash));
        assert_eq!(check_name("."), Err(NameError::Empty));
        assert_eq!(check_name(""), Err(NameError::Empty));
    }

    #[tokio::test]
    async fn resolve_confines_to_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("ipxe.efi"), b"ok").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("escape-dir")).unwrap();
        std::os::unix::fs::symlink("ipxe.efi", root.join("alias")).unwrap();
        std::os::unix::fs::symlink("missing", root.join("dangling")).unwrap();

        assert_eq!(
            resolve(&root, "ipxe.efi").await.unwrap(),
            root.join("ipxe.efi")
        );
        assert_eq!(
            resolve(&root, "alias").await.unwrap(),
            root.join("ipxe.efi")
        );
        assert!(matches!(
            resolve(&root, "escape").await,
            Err(ResolveError::Escapes(_))
        ));
        assert!(matches!(
            resolve(&root, "escape-dir/secret").await,
            Err(ResolveError::Escapes(_))
        ));
        assert!(matches!(
            resolve(&root, "sub").await,
            Err(ResolveError::NotAFile)
        ));
        assert!(matches!(
            resolve(&root, "nope").await,
            Err(ResolveError::NotFound)
        ));
        assert!(matches!(
            resolve(&root, "ipxe.efi/x").await,
            Err(ResolveError::NotFound)
        ));
        assert!(matches!(
            resolve(&root, "dangling").await,
            Err(ResolveError::NotFound)
        ));
        assert!(matches!(
            resolve(&root, "../secret").await,
            Err(ResolveError::Name(NameError::ParentDir))
        ));
    }

    #[tokio::test]
    async fn a_fixed_set_is_served_by_name_and_nothing_else() {
        // Debian 12: /usr/lib/ipxe/ipxe.efi -> /boot/ipxe.efi, outside the directory.
        let boot = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let efi = pattern(3000);
        std::fs::write(boot.path().join("ipxe.efi"), &efi).unwrap();
        std::fs::write(boot.path().join("secret"), b"not yours").unwrap();
        std::os::unix::fs::symlink(boot.path().join("ipxe.efi"), dir.path().join("ipxe.efi"))
            .unwrap();
        std::os::unix::fs::symlink(boot.path().join("secret"), dir.path().join("secret")).unwrap();
        std::fs::write(dir.path().join("other.bin"), b"x").unwrap();
        let files = crate::firststage::FirstStage::load(
            dir.path(),
            &std::collections::BTreeSet::from(["ipxe.efi"]),
        )
        .unwrap();
        let (tx, mut events) = mpsc::channel(16);
        let server = TftpServer::with_files(TftpConfig::default(), Arc::new(files))
            .unwrap()
            .with_events(tx);
        let socket = TftpServer::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(server.serve(socket, cancel.clone()));
        let sock = client().await;
        let (got, _) = fetch(&sock, addr, "ipxe.efi", Options::default())
            .await
            .unwrap();
        assert_eq!(got, efi);
        for (name, code) in [
            ("secret", ErrorCode::FileNotFound),
            ("other.bin", ErrorCode::FileNotFound),
            ("snponly.efi", ErrorCode::FileNotFound),
            ("./ipxe.efi", ErrorCode::FileNotFound),
            ("../ipxe.efi", ErrorCode::AccessViolation),
            ("/boot/ipxe.efi", ErrorCode::AccessViolation),
        ] {
            let err = fetch(&sock, addr, name, Options::default())
                .await
                .unwrap_err();
            assert_eq!(err.0, code, "{name}");
        }
        let mut outcomes = Vec::new();
        for _ in 0..7 {
            outcomes.push(events.recv().await.unwrap().outcome.label());
        }
        assert_eq!(outcomes[0], "completed");
        assert!(
            outcomes[1..].iter().all(|o| *o == "refused"),
            "{outcomes:?}"
        );
        cancel.cancel();
        handle.await.unwrap().unwrap();
    }

    #[test]
    fn config_validation_names_the_field() {
        assert!(TftpConfig::default().validate().is_ok());
        let bad = TftpConfig {
            max_blksize: 7,
            ..TftpConfig::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("max_blksize") && err.contains("MTU"), "{err}");
        let bad = TftpConfig {
            max_transfers: 0,
            ..TftpConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("max_transfers")
        );
    }

    #[test]
    fn missing_root_is_an_actionable_error() {
        let err = TftpServer::new(TftpConfig::default(), "/nonexistent/tftp-root")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/tftp-root"), "{err}");
    }

    #[tokio::test]
    async fn uefi_size_probe_then_real_request_from_the_same_port() {
        let file = pattern(100_000);
        let mut server = Running::start(
            TftpConfig::default(),
            "127.0.0.1:0",
            &[("ipxe.efi", file.clone())],
        )
        .await;
        let sock = client().await;
        // What OVMF sends first: tsize probe with blksize and windowsize.
        let probe = Options {
            tsize: Some(0),
            blksize: Some(1468),
            windowsize: Some(4),
            ..Options::default()
        };
        sock.send_to(&rrq("ipxe.efi", probe), server.addr)
            .await
            .unwrap();
        let (oack, tid) = recv(&sock).await;
        assert_eq!(
            oack,
            Packet::Oack {
                options: Options {
                    blksize: Some(1468),
                    timeout: None,
                    tsize: Some(100_000),
                    windowsize: Some(4),
                }
            }
        );
        assert_ne!(tid, server.addr, "transfer must use its own port");
        let abort = Packet::Error {
            code: ErrorCode::OptionNegotiation,
            message: "User aborted the transfer".into(),
        };
        sock.send_to(&abort.to_bytes(), tid).await.unwrap();
        let event = server.next_event().await;
        assert_eq!(
            event.outcome,
            TransferOutcome::PeerAborted {
                code: ErrorCode::OptionNegotiation,
                message: "User aborted the transfer".into()
            }
        );
        assert_eq!(event.bytes, 0);

        // The real request, from the same source port, right away.
        let real = Options {
            blksize: Some(1468),
            windowsize: Some(4),
            ..Options::default()
        };
        let (got, _) = fetch(&sock, server.addr, "ipxe.efi", real).await.unwrap();
        assert_eq!(got, file);
        let event = server.next_event().await;
        assert_eq!(event.outcome, TransferOutcome::Completed);
        assert_eq!(event.bytes, 100_000);
        assert_eq!(event.file, "ipxe.efi");
        assert_eq!(event.peer, sock.local_addr().unwrap());
        server.stop().await;
    }

    #[tokio::test]
    async fn blksize_is_capped_and_files_arrive_intact() {
        let config = TftpConfig {
            max_blksize: 1000,
            ..TftpConfig::default()
        };
        let files = [
            ("big", pattern(50_000)),
            ("exact", pattern(4000)),
            ("empty", Vec::new()),
            ("sub/file", b"nested".to_vec()),
        ];
        let mut server = Running::start(config, "127.0.0.1:0", &files).await;
        let sock = client().await;
        let ask = Options {
            blksize: Some(8192),
            tsize: Some(0),
            ..Options::default()
        };
        let (got, oack) = fetch(&sock, server.addr, "big", ask).await.unwrap();
        assert_eq!(got, files[0].1);
        let oack = oack.unwrap();
        assert_eq!(oack.blksize, Some(1000));
        assert_eq!(oack.tsize, Some(50_000));
        for (name, bytes) in &files[1..] {
            let (got, oack) = fetch(&sock, server.addr, name, Options::default())
                .await
                .unwrap();
            assert_eq!(&got, bytes, "{name}");
            assert_eq!(oack, None, "no options asked, no OACK");
        }
        for _ in 0..files.len() {
            assert_eq!(
                server.next_event().await.outcome,
                TransferOutcome::Completed
            );
        }
        server.stop().await;
    }

    #[tokio::test]
    async fn refusals_get_tftp_errors() {
        let mut server = Running::start(
            TftpConfig::default(),
            "127.0.0.1:0",
            &[("ipxe.efi", pattern(10))],
        )
        .await;
        let sock = client().await;
        for (name, code) in [
            ("../etc/passwd", ErrorCode::AccessViolation),
            ("/etc/passwd", ErrorCode::AccessViolation),
            ("..\\ipxe.efi", ErrorCode::AccessViolation),
            ("nope.efi", ErrorCode::FileNotFound),
        ] {
            let err = fetch(&sock, server.addr, name, Options::default())
                .await
                .unwrap_err();
            assert_eq!(err.0, code, "{name}");
            let event = server.next_event().await;
            assert!(
                matches!(event.outcome, TransferOutcome::Refused { code: c, .. } if c == code),
                "{name}: {:?}",
                event.outcome
            );
        }

        let wrq = Packet::Wrq {
            filename: "ipxe.efi".into(),
            mode: Mode::Octet,
            options: Options::default(),
        };
        sock.send_to(&wrq.to_bytes(), server.addr).await.unwrap();
        let (reply, _) = recv(&sock).await;
        assert!(matches!(
            reply,
            Packet::Error {
                code: ErrorCode::AccessViolation,
                ..
            }
        ));
        assert!(matches!(
            server.next_event().await.outcome,
            TransferOutcome::Refused {
                code: ErrorCode::AccessViolation,
                ..
            }
        ));

        let netascii = Packet::Rrq {
            filename: "ipxe.efi".into(),
            mode: Mode::Netascii,
            options: Options::default(),
        };
        sock.send_to(&netascii.to_bytes(), server.addr)
            .await
            .unwrap();
        let (reply, _) = recv(&sock).await;
        let Packet::Error { code, message } = reply else {
            panic!("expected ERROR, got {reply:?}");
        };
        assert_eq!(code, ErrorCode::NotDefined);
        assert!(message.contains("octet"), "{message}");
        server.stop().await;
    }

    #[tokio::test]
    async fn malformed_and_stray_packets_are_not_answered() {
        let server =
            Running::start(TftpConfig::default(), "127.0.0.1:0", &[("f", pattern(700))]).await;
        let sock = client().await;
        // Garbage, a stray ACK and a truncated request: all dropped without a reply, so the
        // first packet back is the DATA of the valid request that follows.
        for junk in [&b"\x00\x09zz"[..], &ack(3), b"\x00\x01f"] {
            sock.send_to(junk, server.addr).await.unwrap();
        }
        let (got, _) = fetch(&sock, server.addr, "f", Options::default())
            .await
            .unwrap();
        assert_eq!(got, pattern(700));
        server.stop().await;
    }

    #[tokio::test]
    async fn wildcard_listener_replies_from_the_address_the_client_used() {
        // Needs IP_PKTINFO: without it the transfer socket would bind 0.0.0.0 and the kernel
        // would answer a request to 127.0.0.2 from 127.0.0.1.
        let mut server =
            Running::start(TftpConfig::default(), "0.0.0.0:0", &[("f", pattern(100))]).await;
        for ip in ["127.0.0.2", "127.0.0.1", "127.0.0.3"] {
            let sock = client().await;
            sock.send_to(&rrq("f", Options::default()), server.target(ip))
                .await
                .unwrap();
            let (reply, from) = recv(&sock).await;
            assert_eq!(from.ip().to_string(), ip);
            assert!(matches!(reply, Packet::Data { block: 1, .. }));
            sock.send_to(&ack(1), from).await.unwrap();
            let event = server.next_event().await;
            assert_eq!(event.outcome, TransferOutcome::Completed);
            assert_eq!(event.local.to_string(), ip);
        }
        server.stop().await;
    }

    #[tokio::test]
    async fn dual_stack_listener_serves_ipv4_and_ipv6_from_the_right_address() {
        // An IPv6 wildcard listener also receives IPv4 (as ::ffff:a.b.c.d); IPv4 clients must
        // still be answered from a plain IPv4 socket on the address they asked.
        let mut server =
            Running::start(TftpConfig::default(), "[::]:0", &[("f", pattern(600))]).await;
        for (bind, ip) in [("127.0.0.1:0", "127.0.0.2"), ("[::1]:0", "::1")] {
            let sock = UdpSocket::bind(bind).await.unwrap();
            let (got, _) = fetch(&sock, server.target(ip), "f", Options::default())
                .await
                .unwrap();
            assert_eq!(got, pattern(600));
            let event = server.next_event().await;
            assert_eq!(event.outcome, TransferOutcome::Completed);
            assert_eq!(event.local.to_string(), ip);
            assert_eq!(event.peer, sock.local_addr().unwrap());
        }
        server.stop().await;
    }

    #[tokio::test]
    async fn over_the_cap_requests_are_dropped_and_reported() {
        let config = TftpConfig {
            max_transfers: 1,
            ..TftpConfig::default()
        };
        let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(3000))]).await;
        let holder = client().await;
        let probe = Options {
            tsize: Some(0),
            ..Options::default()
        };
        holder.send_to(&rrq("f", probe), server.addr).await.unwrap();
        let (_oack, tid) = recv(&holder).await;

        let second = client().await;
        second
            .send_to(&rrq("f", Options::default()), server.addr)
            .await
            .unwrap();
        let event = server.next_event().await;
        assert_eq!(event.outcome, TransferOutcome::Busy);
        assert_eq!(event.peer, second.local_addr().unwrap());

        let abort = Packet::Error {
            code: ErrorCode::OptionNegotiation,
            message: String::new(),
        };
        holder.send_to(&abort.to_bytes(), tid).await.unwrap();
        assert!(matches!(
            server.next_event().await.outcome,
            TransferOutcome::PeerAborted { .. }
        ));
        // The slot is free again: the retried request is served.
        let (got, _) = fetch(&second, server.addr, "f", Options::default())
            .await
            .unwrap();
        assert_eq!(got, pattern(3000));
        server.stop().await;
    }

    #[tokio::test]
    async fn silent_client_is_retried_then_dropped() {
        let config = TftpConfig {
            default_timeout: Duration::from_millis(20),
            max_retries: 2,
            ..TftpConfig::default()
        };
        let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(2000))]).await;
        let sock = client().await;
        sock.send_to(&rrq("f", Options::default()), server.addr)
            .await
            .unwrap();
        // The first block, two retransmissions of it, then ERROR.
        for _ in 0..3 {
            let (p, _) = recv(&sock).await;
            assert!(matches!(p, Packet::Data { block: 1, .. }), "{p:?}");
        }
        let (p, _) = recv(&sock).await;
        assert!(matches!(p, Packet::Error { .. }), "{p:?}");
        assert_eq!(
            server.next_event().await.outcome,
            TransferOutcome::TimedOut { retries: 2 }
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn deadline_ends_a_transfer() {
        // The retransmission timer is far longer than the deadline, so the deadline fires.
        let config = TftpConfig {
            default_timeout: Duration::from_secs(60),
            transfer_deadline: Duration::from_millis(200),
            ..TftpConfig::default()
        };
        let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(2000))]).await;
        let sock = client().await;
        sock.send_to(&rrq("f", Options::default()), server.addr)
            .await
            .unwrap();
        let (p, _) = recv(&sock).await;
        assert!(matches!(p, Packet::Data { block: 1, .. }));
        let (p, _) = recv(&sock).await;
        let Packet::Error { message, .. } = p else {
            panic!("expected ERROR, got {p:?}");
        };
        assert!(message.contains("deadline"), "{message}");
        assert_eq!(
            server.next_event().await.outcome,
            TransferOutcome::DeadlineExceeded
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn shutdown_ends_transfers_and_returns() {
        let config = TftpConfig {
            default_timeout: Duration::from_secs(60),
            ..TftpConfig::default()
        };
        let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(2000))]).await;
        let sock = client().await;
        sock.send_to(&rrq("f", Options::default()), server.addr)
            .await
            .unwrap();
        let (p, _) = recv(&sock).await;
        assert!(matches!(p, Packet::Data { block: 1, .. }));
        server.cancel.cancel();
        let (p, _) = recv(&sock).await;
        let Packet::Error { message, .. } = p else {
            panic!("expected ERROR, got {p:?}");
        };
        assert!(message.contains("shutting down"), "{message}");
        assert_eq!(
            server.next_event().await.outcome,
            TransferOutcome::Cancelled
        );
        server.stop().await;
    }
}
