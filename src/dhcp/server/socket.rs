//! The socket side of the server: binding the UDP sockets to the serving interface, reading
//! datagrams into the bounded receive queue without ever waiting for the core, and the ARP
//! entry a unicast reply to a client without an address needs.

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::counter;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info_span, warn};

use super::ServerError;
use super::peek::{msg_type_label, peek_mac, peek_msg_type, peek_xid};
use crate::dhcp::ServerPort;
use crate::dhcp::queue::{Lane, RxQueue};
use crate::inventory::Mac;

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

/// One socket of [`super::DhcpServer::bind`], configured before it is bound so that the
/// options hold from its first datagram.
pub(super) fn bind_one(iface: &str, port: u16) -> Result<UdpSocket, ServerError> {
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
pub(super) struct Datagram {
    /// The port it arrived on.
    pub(super) port: ServerPort,
    /// Its bytes, as received.
    pub(super) bytes: Vec<u8>,
    /// Who sent it (a client, or a relay agent).
    pub(super) source: SocketAddrV4,
    /// When the reader took it off the socket: a reply's delay, for admission, counts from
    /// here ([`crate::dhcp::sojourn`]).
    pub(super) received: Instant,
}

impl Datagram {
    /// A span naming the transaction: xid, chaddr and message type, read from the raw bytes
    /// without trusting them (a malformed datagram still gets a span, with what could be read).
    pub(super) fn span(&self) -> tracing::Span {
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

/// One socket's reader: it only moves datagrams into the receive queue, so the kernel buffer
/// drains at once however long the core takes, and overload is shed by the queue's rules.
pub(super) async fn read_loop(
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

/// Add a complete ARP entry `ip -> mac` on `iface` (ioctl `SIOCSARP` on the socket), so that
/// a unicast to an address the client does not answer ARP for yet reaches it.
pub(super) fn add_arp_entry(
    sock: &UdpSocket,
    iface: &str,
    ip: Ipv4Addr,
    mac: Mac,
) -> io::Result<()> {
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
}
