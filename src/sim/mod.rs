//! Simulated machines and API servers for `talboot demo` and the integration tests: a small
//! PKI ([`pki`]), a strict fake Talos node that goes through maintenance, install, reboot and
//! reset as Talos v1.13 does ([`talos`]), and a strict Kubernetes API server double
//! ([`kube`]). They speak the real protocols (gRPC over mTLS, HTTPS with client
//! certificates) on addresses the caller picks, so talboot's real clients talk to them
//! unchanged. Nothing here is global: every piece is owned by the handle that started it.

use std::net::{IpAddr, SocketAddr};

pub mod kube;
pub mod pki;
pub mod talos;

/// Why a simulated machine or server could not start or did not behave.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The listening address could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (another process, demo or test holds that address; \
         stop it or pick other addresses; 127.x.y.z addresses need no setup on Linux)"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Certificates could not be made.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// The TLS server configuration was refused (a certificate or key the TLS library rejects).
    #[error("TLS setup for {what}: {reason}")]
    Tls {
        /// Which server.
        what: String,
        /// What rustls said.
        reason: String,
    },
    /// A simulated node failed, stopped or timed out instead of reaching a phase.
    #[error("simulated node {ip}: {reason}")]
    Node {
        /// The node's address.
        ip: IpAddr,
        /// What happened instead.
        reason: String,
    },
}
