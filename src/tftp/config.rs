//! The server's tunables ([`TftpConfig`]) and why it cannot start ([`ServerError`]).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::packet::{MAX_BLKSIZE, MIN_BLKSIZE};

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
    /// Transfers served at once; requests beyond this wait for a slot (see
    /// [`super::admission`]). The default is sized from memory by [`max_transfers_for`].
    pub max_transfers: usize,
    /// Transfers running or waiting at once for one client address; requests beyond this are
    /// dropped unanswered (the client resends).
    pub max_per_client: usize,
    /// Largest retransmission interval a client may negotiate with the `timeout` option
    /// ([`super::transfer::Limits::max_timeout`]).
    pub max_timeout: Duration,
    /// How long a request waits for a slot after its last retransmission.
    pub queue_wait: Duration,
    /// How long a transfer may go without progress before a waiting request takes its slot.
    pub reclaim_after: Duration,
}

/// Memory one transfer may cost at worst, for sizing [`TftpConfig::max_transfers`]: its share
/// of the kernel's UDP send buffer (`net.core.wmem_default` is 212,992 bytes on Linux; a
/// window of 64 blocks of 1468 bytes keeps about 94 KB of it queued), the 64 KiB read-ahead of
/// a file served from the root, one packet buffer (blksize + 4) and the task itself, rounded up.
/// Files served from memory (the appliance's fixed set) are shared, not copied per transfer.
pub(crate) const TRANSFER_COST_BYTES: u64 = 256 * 1024;

/// The concurrency cap for a host with `mem_total` bytes of memory and an open-file limit of
/// `nofile`: TFTP may use 1/32 of memory at [`TRANSFER_COST_BYTES`] per transfer (the appliance
/// also runs HTTP, DHCP, the store and the provisioner, and first-stage TFTP is the smallest
/// part of a boot), and at most half the open files (one socket per transfer). Never below 64
/// (the fixed cap before it was sized) nor above 4096 (a rack boots in waves far smaller; the
/// admission table is scanned when full). A 2 GiB host gets 256, 8 GiB 1024; the
/// 24 GB benchmark machine (23.5 GiB) 3013.
pub(crate) fn max_transfers_for(mem_total: u64, nofile: u64) -> usize {
    let by_memory = mem_total / 32 / TRANSFER_COST_BYTES;
    let by_files = nofile / 2;
    by_memory.min(by_files).clamp(64, 4096) as usize
}

/// [`max_transfers_for`] this host (`MemTotal` of /proc/meminfo, `RLIMIT_NOFILE`), read once.
/// Unknown values count as 2 GiB and 1024 files.
pub(crate) fn host_max_transfers() -> usize {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let mem = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
                let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                Some(kib * 1024)
            })
            .unwrap_or(2 << 30);
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        max_transfers_for(mem, nofile)
    })
}

impl Default for TftpConfig {
    fn default() -> Self {
        TftpConfig {
            max_blksize: 1468,
            max_windowsize: 64,
            default_timeout: Duration::from_secs(1),
            max_retries: 5,
            transfer_deadline: Duration::from_secs(300),
            max_transfers: host_max_transfers(),
            // A booting machine needs one transfer, two with the UEFI size probe; four leaves
            // room for a resent RRQ whose first transfer has not ended yet.
            max_per_client: 4,
            // RFC 2349 allows 1..=255 s. No boot client waits that long between its own
            // retransmissions: iPXE backs off to at most 10 s (`DEFAULT_MAX_TIMEOUT`,
            // ipxe/ipxe src/include/ipxe/retry.h) and EDK2's PXE uses 4 s
            // (`PXEBC_MTFTP_TIMEOUT`); curl asks for 5-6 s. A 255 s timeout would let a client
            // that never acknowledges hold a slot for 255 s x (max_retries + 1) = 25 minutes.
            max_timeout: Duration::from_secs(10),
            // iPXE's longest interval between RRQ retransmissions (10 s, above), so a waiting
            // iPXE or EDK2 client keeps its place until its next resend refreshes it.
            queue_wait: Duration::from_secs(10),
            // Two retransmission intervals at the default timeout without a single ACK.
            reclaim_after: Duration::from_secs(2),
        }
    }
}

impl TftpConfig {
    /// The admission limits these settings make (see [`super::admission`]).
    pub(crate) fn admission(&self) -> super::admission::Policy {
        super::admission::Policy {
            max_transfers: self.max_transfers,
            max_per_client: self.max_per_client,
            // A waiting entry is a few hundred bytes (the parsed request); a rack powering on at
            // once can have several times the running transfers waiting.
            max_waiting: self.max_transfers.saturating_mul(4).max(1024),
            wait: self.queue_wait,
            reclaim_after: self.reclaim_after,
        }
    }

    /// Check every field is usable, naming the first that is not.
    pub(crate) fn validate(&self) -> Result<(), ServerError> {
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
        if self.max_per_client == 0 {
            return bad(
                "max_per_client",
                "0".into(),
                "allow at least 1 transfer per client (a UEFI boot needs 2)",
            );
        }
        if self.max_timeout < Duration::from_secs(1) {
            return bad(
                "max_timeout",
                format!("{:?}", self.max_timeout),
                "use at least 1s (RFC 2349 timeouts are whole seconds, 1..=255)",
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_sized_from_memory_and_open_files() {
        const GIB: u64 = 1 << 30;
        assert_eq!(max_transfers_for(2 * GIB, 65536), 256);
        assert_eq!(max_transfers_for(8 * GIB, 65536), 1024);
        // The open-file limit wins when it is the tighter one.
        assert_eq!(max_transfers_for(8 * GIB, 1024), 512);
        // Bounds: never below the old fixed 64, never above 4096.
        assert_eq!(max_transfers_for(GIB / 4, 65536), 64);
        assert_eq!(max_transfers_for(1024 * GIB, 1 << 20), 4096);
    }
}
