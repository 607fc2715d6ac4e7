//! How each request ended, for metrics, logs and the per-node boot timeline.
//!
//! This module owns [`TransferOutcome`] and [`TransferEvent`], the reporting of each one
//! (metrics counters, a log line at the right level, a `try_send` to the caller's channel) and
//! the mapping from a finished transfer to the node event the appliance publishes.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use tracing::{debug, info, warn};

use super::listener::Shared;
use super::packet::ErrorCode;
use crate::events::{EventBus, EventKind};
use crate::inventory::Inventory;

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
    /// The transfer made no progress and its slot went to a waiting request.
    Reclaimed,
    /// The request was answered with an ERROR packet (write request, bad path, missing file,
    /// unsupported mode).
    Refused {
        /// The error code sent.
        code: ErrorCode,
        /// Why, for the operator.
        reason: String,
    },
    /// No slot: the client's own cap was reached, or the request waited for a free slot
    /// without one coming and without a retransmission, or too many already waited. It was
    /// dropped unanswered (boot firmware resends a request that got no answer; an ERROR
    /// would end its boot attempt).
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
            TransferOutcome::Reclaimed => "reclaimed",
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

/// Count, log and publish one request's outcome.
pub(super) fn report(shared: &Shared, event: TransferEvent) {
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
        // Info, not warn: a host flooding requests would otherwise flood the log.
        TransferOutcome::Busy => info!(
            %peer, ?file,
            max_transfers = shared.config.max_transfers,
            max_per_client = shared.config.max_per_client,
            "TFTP request dropped: no free transfer slot (the client will resend)"
        ),
        TransferOutcome::Reclaimed => warn!(
            %peer, ?file, bytes,
            reclaim_after_s = shared.config.reclaim_after.as_secs(),
            "TFTP transfer reclaimed: no acknowledgement while other requests waited"
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

/// The node event a finished request becomes on the per-node boot timeline, if any: a
/// completed file, or a failure naming how it ended. The UEFI size probe ends with the
/// client's ERROR 8 and every client abort is the client's own choice, so neither is a failure.
pub(crate) fn node_event(event: &TransferEvent) -> Option<(EventKind, String)> {
    match &event.outcome {
        // A boot set's UKI (see `BootMedia`) is the whole Talos boot, as the kernel is over HTTP.
        TransferOutcome::Completed
            if event.file.starts_with("assets/") && event.file.ends_with("uki.efi") =>
        {
            Some((
                EventKind::Uki,
                format!(
                    "{} ({} bytes) to {} over TFTP",
                    event.file, event.bytes, event.peer
                ),
            ))
        }
        TransferOutcome::Completed => Some((
            EventKind::TftpFile,
            format!("{} ({} bytes) to {}", event.file, event.bytes, event.peer),
        )),
        TransferOutcome::PeerAborted { .. } => None,
        other => Some((
            EventKind::TftpFailed,
            format!("{} to {}: {}", event.file, event.peer, other.label()),
        )),
    }
}

/// Publishes finished TFTP transfers as node events (the node found by its lease address,
/// in the read view: no store read per transfer).
pub(crate) async fn publish_events(
    mut rx: tokio::sync::mpsc::Receiver<TransferEvent>,
    view: Arc<crate::view::StateView>,
    inv: Arc<Inventory>,
    events: EventBus,
) {
    while let Some(ev) = rx.recv().await {
        if let Some((kind, detail)) = node_event(&ev) {
            let node = crate::events::node_key_by_peer(&view, &inv, ev.peer.ip());
            events.publish(&node, kind, detail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(outcome: TransferOutcome) -> TransferEvent {
        TransferEvent {
            peer: "10.0.0.7:2070".parse().unwrap(),
            local: "10.0.0.1".parse().unwrap(),
            file: "ipxe.efi".into(),
            bytes: 1024,
            elapsed: Duration::from_millis(5),
            outcome,
        }
    }

    #[test]
    fn a_boot_sets_uki_sent_is_a_uki_event_and_other_files_are_tftp_files() {
        let mut uki = event(TransferOutcome::Completed);
        uki.file = "assets/v1.13.9/s/amd64/secureboot-uki.efi".into();
        assert_eq!(
            node_event(&uki),
            Some((
                EventKind::Uki,
                "assets/v1.13.9/s/amd64/secureboot-uki.efi (1024 bytes) to 10.0.0.7:2070 over TFTP"
                    .into()
            ))
        );
        uki.file = "uki.efi".into();
        assert_eq!(node_event(&uki).unwrap().0, EventKind::TftpFile);
    }

    #[test]
    fn completed_and_failed_transfers_become_node_events_and_probes_do_not() {
        assert_eq!(
            node_event(&event(TransferOutcome::Completed)),
            Some((
                EventKind::TftpFile,
                "ipxe.efi (1024 bytes) to 10.0.0.7:2070".into()
            ))
        );
        let probe = TransferOutcome::PeerAborted {
            code: ErrorCode::OptionNegotiation,
            message: "User aborted the transfer".into(),
        };
        assert_eq!(node_event(&event(probe)), None);
        assert_eq!(
            node_event(&event(TransferOutcome::TimedOut { retries: 5 })),
            Some((
                EventKind::TftpFailed,
                "ipxe.efi to 10.0.0.7:2070: timed_out".into()
            ))
        );
    }
}
