//! talboot's own read-only TFTP server (RFC 1350, 2347, 2348, 2349 and 7440).
//!
//! TFTP carries only the first boot stage (`ipxe.efi`, `undionly.kpxe`, `snponly.efi`, loaded
//! once at start by [`crate::firststage`]); iPXE then moves to HTTP. The module is split the sans-I/O way:
//! - [`packet`]: the wire codec, pure and fuzzed (`fuzz/fuzz_targets/tftp_packet.rs`);
//! - [`transfer`]: option negotiation and the windowed sender state machine, pure;
//! - [`admission`]: the transfer table's policy (global and per-client caps, waiting, reclaim
//!   of stalled transfers), pure;
//! - [`listener`]: the tokio adapter's front: the listener loop that classifies requests, asks
//!   [`admission`] and starts one transfer task per admitted request;
//! - [`driver`]: one transfer served to its end on its own socket (timers, deadline, reads);
//! - [`root`]: root confinement (which names may be asked for, where the bytes come from);
//! - [`pktinfo`]: IP_PKTINFO plumbing, so a wildcard listener answers from the right address;
//! - [`config`]: the tunables and start-up errors;
//! - [`report`]: a [`TransferEvent`] per request: metrics, logs and the per-node boot timeline.
//!
//! We do not use async-tftp: it ignores a client's ERROR after the OACK (the tsize probe every
//! EDK2 firmware makes), keeps retransmitting, and blocks the same peer's real request meanwhile.

pub(crate) mod admission;
pub mod config;
mod driver;
pub mod listener;
pub mod packet;
mod pktinfo;
pub mod report;
pub mod root;
pub mod transfer;

#[cfg(test)]
mod tests;

pub use config::{ServerError, TftpConfig};
pub use listener::{BootMedia, TftpServer};
pub use report::{TransferEvent, TransferOutcome};

/// The first-stage iPXE binaries a PXE firmware fetches over TFTP (see [`crate::firststage`]).
pub const IPXE_BINARIES: [&str; 4] = crate::firststage::KNOWN;

/// iPXE binaries missing from `dir`, among `names`.
pub(crate) fn missing_ipxe_binaries<'a>(
    dir: &std::path::Path,
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<&'a str> {
    names
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect()
}
