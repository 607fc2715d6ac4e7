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
