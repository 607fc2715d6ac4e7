//! IP_PKTINFO plumbing: learning the local address each request was sent to.
//!
//! A listener bound to `0.0.0.0` (or `[::]`) does not know which of the host's addresses a
//! client used; the reply must come from that address or a multi-homed appliance answers from
//! the wrong IP. This module owns enabling IP_PKTINFO / IPV6_RECVPKTINFO on the listener, the
//! `recvmsg` that reads the control message, and the choice of the transfer socket's local
//! address and family ([`normalize`]).

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, setsockopt, sockopt,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Ask the kernel to tell us each datagram's local destination address.
pub(super) fn enable_packet_info(sock: &UdpSocket, addr: SocketAddr) -> io::Result<()> {
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
pub(super) struct Received {
    pub(super) len: usize,
    pub(super) peer: SocketAddr,
    /// The local address it was sent to, when the kernel told us.
    pub(super) local: Option<SocketAddr>,
    pub(super) truncated: bool,
}

/// `recvmsg` on the tokio socket, collecting the packet-info control message.
pub(super) async fn recv_request(
    sock: &UdpSocket,
    buf: &mut [u8],
    cmsg: &mut [u8],
) -> io::Result<Received> {
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
pub(super) fn normalize(
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
