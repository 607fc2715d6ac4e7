//! The transfer driver: one request served to its end on its own socket.
//!
//! This module owns everything between an accepted request and its [`TransferOutcome`]: the
//! transfer socket (bound to the local address the client used, connected to the client, so
//! stray packets from other ports never reach it), refusals as TFTP ERROR packets, opening the
//! file, running the pure [`Transfer`] machine over the socket with its retransmission timer,
//! the per-transfer deadline and cancellation, and block reads.

use std::io::{self, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use metrics::counter;
use tokio::io::{AsyncReadExt, AsyncSeekExt, BufReader};
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tracing::debug;

use super::listener::{Request, Shared, TransferCtl, kind, millis};
use super::packet::{DATA_HEADER_LEN, ErrorCode, Mode, Options, Packet};
use super::report::{TransferEvent, TransferOutcome, report};
use super::root::{ResolveError, Source, check_name, lookup, resolve};
use super::transfer::{AbortReason, Action, DataBlock, Event, Transfer, negotiate};

/// Largest packet we read from a client during a transfer (ACK or ERROR).
const REPLY_BUF: usize = 1500;
/// Read-ahead for file data, so sequential blocks cost one blocking read per 64 KiB.
const FILE_BUF: usize = 64 * 1024;

/// Serve one request to its end and report it.
pub(super) async fn run_request(
    shared: &Shared,
    request: Request,
    peer: SocketAddr,
    local: SocketAddr,
    ctl: TransferCtl,
) {
    let started = Instant::now();
    let deadline = started + shared.config.transfer_deadline;
    let (outcome, bytes) = match open_transfer_socket(local, peer).await {
        Ok(sock) => serve_request(shared, &request, &sock, deadline, &ctl).await,
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
    ctl: &TransferCtl,
) -> (TransferOutcome, u64) {
    let (filename, options) = match readable(request) {
        Ok(read) => read,
        Err(r) => return refuse(sock, r.code, r.client_msg, r.reason).await,
    };
    let (path, data) = match open(shared, filename).await {
        Ok(opened) => opened,
        Err(r) => return refuse(sock, r.code, r.client_msg, r.reason).await,
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
    let opened = Opened { path, data, size };
    let (outcome, transfer) = transfer(shared, options, sock, deadline, ctl, opened).await;
    (outcome, transfer.bytes_acknowledged())
}

/// Why a request is answered with an ERROR before any data moves.
struct Refusal {
    code: ErrorCode,
    client_msg: &'static str,
    reason: String,
}

impl From<ResolveError> for Refusal {
    fn from(e: ResolveError) -> Self {
        let (code, client_msg) = e.reply();
        Refusal {
            code,
            client_msg,
            reason: e.to_string(),
        }
    }
}

/// The file name and options of a request this server serves: an octet-mode read.
fn readable(request: &Request) -> Result<(&str, &Options), Refusal> {
    let (filename, mode, options) = match request {
        Request::Write { .. } => {
            return Err(Refusal {
                code: ErrorCode::AccessViolation,
                client_msg: "this TFTP server is read-only",
                reason: "write request refused (the server is read-only)".into(),
            });
        }
        Request::Read {
            filename,
            mode,
            options,
        } => (filename, *mode, options),
    };
    if mode != Mode::Octet {
        return Err(Refusal {
            code: ErrorCode::NotDefined,
            client_msg: "only octet (binary) mode is supported",
            reason: format!("{} mode requested; only octet is served", mode.as_str()),
        });
    }
    Ok((filename, options))
}

/// The requested file: looked up in the fixed set, or resolved under the root and opened.
async fn open(shared: &Shared, filename: &str) -> Result<(PathBuf, Data), Refusal> {
    if let Some(path) = shared.boot_media.get(filename) {
        check_name(filename).map_err(ResolveError::from)?;
        return match tokio::fs::File::open(path).await {
            Ok(f) => Ok((
                PathBuf::from(filename),
                Data::File(BufReader::with_capacity(FILE_BUF, f)),
            )),
            Err(e) => Err(ResolveError::from_io(e).into()),
        };
    }
    match &shared.source {
        Source::Files(files) => match lookup(files, filename) {
            Ok(bytes) => Ok((PathBuf::from(filename), Data::Memory(bytes))),
            Err(e) => Err(e.into()),
        },
        Source::Root(root) => {
            let path = resolve(root, filename).await?;
            match tokio::fs::File::open(&path).await {
                Ok(f) => Ok((path, Data::File(BufReader::with_capacity(FILE_BUF, f)))),
                Err(e) => Err(ResolveError::from_io(e).into()),
            }
        }
    }
}

/// An opened file about to be sent.
struct Opened {
    path: PathBuf,
    data: Data,
    size: u64,
}

/// Runs the negotiated transfer until it ends, is stopped or runs out of time.
async fn transfer(
    shared: &Shared,
    options: &Options,
    sock: &UdpSocket,
    deadline: Instant,
    ctl: &TransferCtl,
    opened: Opened,
) -> (TransferOutcome, Transfer) {
    let Opened { path, data, size } = opened;
    let negotiated = negotiate(options, size, &shared.limits);
    let span = tracing::Span::current();
    span.record("blksize", negotiated.blksize);
    span.record("windowsize", negotiated.windowsize);
    span.record("tsize", size);
    let mut transfer = Transfer::new(&negotiated, size, shared.config.max_retries);
    let mut reader = BlockReader { data, pos: 0 };
    let mut progressed = |at: Instant| {
        ctl.progress
            .store(millis(at - shared.epoch), Ordering::Relaxed);
    };
    let outcome = tokio::select! {
        result = drive(sock, &mut transfer, &mut reader, &path, &mut progressed) => match result {
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
        _ = ctl.shutdown.cancelled() => {
            send_error(sock, ErrorCode::NotDefined, "server shutting down").await;
            TransferOutcome::Cancelled
        }
        _ = ctl.reclaim.cancelled() => {
            send_error(
                sock,
                ErrorCode::NotDefined,
                "transfer reclaimed: no acknowledgement while other clients wait",
            )
            .await;
            TransferOutcome::Reclaimed
        }
        _ = tokio::time::sleep_until(deadline) => {
            send_error(sock, ErrorCode::NotDefined, "transfer deadline exceeded").await;
            TransferOutcome::DeadlineExceeded
        }
    };
    (outcome, transfer)
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
    progressed: &mut impl FnMut(Instant),
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
                    send_data(sock, &mut packet, reader, &block, path).await?;
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
            Ok(received) => match reply_event(&reply[..received?]) {
                Some(event) => event,
                None => continue,
            },
        };
        let is_ack = matches!(event, Event::Ack(_));
        transfer.handle(event, &mut actions);
        // An ACK that produced something to do moved the transfer forward (duplicates and
        // stale ACKs produce nothing).
        if is_ack && !actions.is_empty() {
            progressed(Instant::now());
        }
    }
}

/// Sends data block `block`, read into `packet` (the reused send buffer).
async fn send_data(
    sock: &UdpSocket,
    packet: &mut Vec<u8>,
    reader: &mut BlockReader,
    block: &DataBlock,
    path: &Path,
) -> Result<(), DriveError> {
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
    sock.send(packet).await?;
    Ok(())
}

/// The event a client's packet is to the transfer; anything but an ACK or an ERROR is
/// counted and ignored.
fn reply_event(bytes: &[u8]) -> Option<Event> {
    match Packet::parse(bytes) {
        Ok(Packet::Ack { block }) => Some(Event::Ack(block)),
        Ok(Packet::Error { code, message }) => Some(Event::Error { code, message }),
        Ok(other) => {
            counter!("tftp_unexpected_packets_total").increment(1);
            debug!(
                packet = kind(&other),
                "ignored a non-ACK packet during a transfer"
            );
            None
        }
        Err(e) => {
            counter!("tftp_malformed_packets_total").increment(1);
            debug!(error = %e, "ignored a malformed TFTP packet during a transfer");
            None
        }
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
