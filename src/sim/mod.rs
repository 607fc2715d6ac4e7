//! Simulated machines and API servers for `talboot demo` and the integration tests. They
//! speak the real protocols (DHCP, TFTP and HTTP on the wire; gRPC over mTLS; HTTPS with
//! client certificates) on addresses the caller picks, so talboot's real servers and
//! clients talk to them unchanged. Nothing here is global: every piece is owned by the
//! handle that started it.
//!
//! * [`relocate`]: moves the rack's subnets onto loopback (127.0.x.y) so an unprivileged
//!   process can give every machine its own address.
//! * [`assets`]: stand-in boot files (catalogued kernel/initramfs sets, iPXE binaries).
//! * [`ipxe`]: the slice of iPXE's script language talboot's scripts use.
//! * [`machine`]: one machine's network boot on the wire (DHCP, TFTP, HTTP).
//! * [`pki`]: a small PKI for the doubles.
//! * [`disks`]: a machine's disks as Talos's `block.Disk` resources, and what Talos derives
//!   from them (`storage.Disks`, the install disk it picks).
//! * [`talos`]: a strict fake Talos node (maintenance, install, reboot, reset, as v1.13).
//! * [`kube`]: a strict Kubernetes API server double.
//! * [`demo`]: `talboot demo`, all of the above around a real talboot.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};

pub mod assets;
pub mod demo;
pub mod disks;
#[cfg(test)]
mod ha_leader_tests;
pub mod ipxe;
pub mod kube;
pub(crate) mod kube_ssa;
pub mod kubelet;
pub mod machine;
pub mod pki;
#[cfg(test)]
mod probe;
pub mod proxmox;
pub(crate) mod relocate;
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

/// Accepts the next connection on `listener` the way the servers the doubles stand for do:
/// with Nagle's algorithm off.
///
/// apid (siderolabs/talos v1.13.9, `internal/app/apid/service.go`: `net.ListenConfig.Listen(
/// ctx, "tcp", ...)` served by `grpc.NewServer` from `pkg/grpc/factory/factory.go`) and
/// kube-apiserver are Go servers, and Go's `net.TCPListener.Accept` sets TCP_NODELAY on every
/// connection it returns (golang/go `src/net/tcpsock_posix.go` `TCPListener.accept` ->
/// `newTCPConn` -> `setNoDelay(fd, true)` in `src/net/tcpsock.go`, the setsockopt in
/// `src/net/tcpsockopt_posix.go`; `TCPConn.SetNoDelay`'s doc: "The default is true (no
/// delay)"; Talos v1.13.9 builds with Go 1.26, see its `go.mod`). A tokio socket keeps the
/// kernel default, Nagle on, so each small gRPC reply written in two pieces would wait for
/// the client's delayed ACK (about 40 ms on Linux), a cost real Talos does not have.
pub(crate) async fn accept_like_go(
    listener: &TcpListener,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    let (tcp, peer) = listener.accept().await?;
    // Go ignores this error too (`newTCPConn`): a connection already reset fails on its own.
    let _ = tcp.set_nodelay(true);
    Ok((tcp, peer))
}
