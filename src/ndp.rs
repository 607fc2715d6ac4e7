//! IPv6 router advertisements that say "no IPv6 router here" on the provisioning segment
//! (`serve --ipv6-ra`), so an iPXE that autoconfigures IPv6 stops waiting at once.
//!
//! Why: iPXE runs every network configurator (DHCPv4 and IPv6 autoconfiguration) before it
//! continues, and its IPv6 configurator only ends on the first router advertisement or when
//! its router-solicitation retry timer gives up (ipxe/ipxe `src/net/ndp.c` at 36a4c85, the
//! Debian 12 build: `ipv6conf_rx_router_advertisement` stops the timer and calls
//! `ipv6conf_done` unless the RA has the M or O flag set, which would start DHCPv6;
//! `ipv6conf_expired` otherwise retransmits until the timer fails). On a segment without RAs
//! that is about 16 s of every boot.
//!
//! The advertisement carries router lifetime 0 (RFC 4861 §4.2: not a default router), no
//! prefix information (no address is autoconfigured from it), M = O = 0 (no DHCPv6), and our
//! link-layer address. It is sent to all-nodes once at start and in answer to each router
//! solicitation, at most one every [`MIN_DELAY_BETWEEN_RAS`] (RFC 4861 §6.2.6; a
//! solicitation inside that window is answered when it ends). The message itself is built and
//! recognised by pure functions; [`run`] is the raw ICMPv6 socket around them.

use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// ICMPv6 type of a router solicitation.
pub(crate) const ROUTER_SOLICITATION: u8 = 133;
/// ICMPv6 type of a router advertisement.
pub(crate) const ROUTER_ADVERTISEMENT: u8 = 134;
/// RFC 4861 §10: the least time between multicast advertisements.
pub(crate) const MIN_DELAY_BETWEEN_RAS: Duration = Duration::from_secs(3);
/// All-nodes, where the advertisement goes.
pub(crate) const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// All-routers, where solicitations go.
pub(crate) const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// The router advertisement (ICMPv6 message, checksum left 0 for the kernel, RFC 3542 §3.1):
/// hop limit unspecified, M = O = 0, router lifetime 0, reachable and retransmit times
/// unspecified, and a source link-layer address option with `mac`.
pub fn advertisement(mac: [u8; 6]) -> Vec<u8> {
    let mut m = vec![
        ROUTER_ADVERTISEMENT,
        0, // code
        0,
        0, // checksum
        0, // cur hop limit: unspecified
        0, // M = 0, O = 0
        0,
        0, // router lifetime 0: not a default router
        0,
        0,
        0,
        0, // reachable time
        0,
        0,
        0,
        0, // retrans timer
    ];
    // Source link-layer address: type 1, length 1 (8 octets).
    m.extend_from_slice(&[1, 1]);
    m.extend_from_slice(&mac);
    m
}

/// True for a well-formed router solicitation (RFC 4861 §6.1.1: code 0, at least 8 octets).
pub(crate) fn is_solicitation(msg: &[u8]) -> bool {
    msg.len() >= 8 && msg[0] == ROUTER_SOLICITATION && msg[1] == 0
}

/// Why the advertiser cannot start.
#[derive(Debug, thiserror::Error)]
#[error(
    "IPv6 router advertisements on {iface}: {cause}; the interface needs IPv6 enabled (a \
     link-local address), and talboot needs root or CAP_NET_RAW; or leave --ipv6-ra out"
)]
pub struct RaError {
    /// The interface.
    pub iface: String,
    /// Why.
    pub cause: String,
}

/// A bound advertiser: the raw ICMPv6 socket on one interface.
pub(crate) struct Advertiser {
    /// A raw ICMPv6 socket driven through tokio's datagram socket: `sendto`/`recvfrom` are
    /// the same calls for both.
    sock: tokio::net::UdpSocket,
    iface: String,
    mac: [u8; 6],
    ifindex: u32,
}

fn interface_mac(iface: &str) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address")).ok()?;
    let mac: crate::inventory::Mac = text.trim().parse().ok()?;
    Some(mac.0)
}

impl Advertiser {
    /// Opens the raw ICMPv6 socket on `iface` (before any privilege drop): pinned to the
    /// interface, hop limit 255 (RFC 4861 §6.1.2: receivers drop anything else), joined to
    /// all-routers so solicitations arrive.
    pub fn bind(iface: &str) -> Result<Self, RaError> {
        use socket2::{Domain, Protocol, Socket, Type};
        let err = |cause: String| RaError {
            iface: iface.to_owned(),
            cause,
        };
        let ifindex = nix::net::if_::if_nametoindex(iface)
            .map_err(|e| err(format!("no such interface ({e})")))?;
        let mac =
            interface_mac(iface).ok_or_else(|| err("cannot read its hardware address".into()))?;
        let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))
            .map_err(|e| err(format!("raw ICMPv6 socket: {e}")))?;
        sock.bind_device(Some(iface.as_bytes()))
            .map_err(|e| err(format!("SO_BINDTODEVICE: {e}")))?;
        sock.set_multicast_hops_v6(255)
            .and_then(|()| sock.set_unicast_hops_v6(255))
            .and_then(|()| sock.set_multicast_if_v6(ifindex))
            .and_then(|()| sock.set_multicast_loop_v6(false))
            .map_err(|e| err(format!("socket options: {e}")))?;
        sock.join_multicast_v6(&ALL_ROUTERS, ifindex)
            .map_err(|e| err(format!("joining ff02::2: {e}")))?;
        sock.set_nonblocking(true)
            .map_err(|e| err(format!("non-blocking: {e}")))?;
        let sock = tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(sock))
            .map_err(|e| err(e.to_string()))?;
        Ok(Advertiser {
            sock,
            iface: iface.to_owned(),
            mac,
            ifindex,
        })
    }

    async fn send(&self) {
        let msg = advertisement(self.mac);
        // Port 0: on a raw socket the port field would name the protocol.
        let to = SocketAddrV6::new(ALL_NODES, 0, 0, self.ifindex);
        match self.sock.send_to(&msg, to).await {
            Ok(_) => tracing::debug!(iface = %self.iface, "router advertisement sent (lifetime 0)"),
            // E.g. the link-local address is still tentative right after link-up.
            Err(e) => {
                tracing::warn!(iface = %self.iface, error = %e, "router advertisement not sent")
            }
        }
    }

    /// Raw IPv6 sockets deliver the ICMPv6 message without the IPv6 header.
    async fn recv_solicitation(&self, buf: &mut [u8]) -> std::io::Result<bool> {
        let (n, _) = self.sock.recv_from(buf).await?;
        Ok(is_solicitation(&buf[..n]))
    }

    /// Advertises once now, then answers solicitations until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        tracing::info!(
            iface = %self.iface,
            "sending IPv6 router advertisements with lifetime 0 (no IPv6 router, no prefix)"
        );
        self.send().await;
        let mut last = tokio::time::Instant::now();
        let mut pending = false;
        let mut buf = vec![0u8; 1500];
        loop {
            let due = last + MIN_DELAY_BETWEEN_RAS;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(due), if pending => {
                    pending = false;
                    self.send().await;
                    last = tokio::time::Instant::now();
                }
                got = self.recv_solicitation(&mut buf) => match got {
                    Ok(true) => {
                        if tokio::time::Instant::now() >= due {
                            self.send().await;
                            last = tokio::time::Instant::now();
                        } else {
                            pending = true;
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(iface = %self.iface, error = %e, "ICMPv6 receive failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertisement_says_no_router_no_prefix_no_dhcpv6() {
        let ra = advertisement([0x02, 0, 0, 0, 0xaa, 0x01]);
        assert_eq!(ra.len(), 24);
        assert_eq!(ra[0], ROUTER_ADVERTISEMENT);
        assert_eq!(ra[1], 0);
        assert_eq!(ra[5] & 0xc0, 0, "M and O clear: iPXE starts no DHCPv6");
        assert_eq!(&ra[6..8], &[0, 0], "router lifetime 0: no default route");
        // The only option is the source link-layer address: no prefix information (type 3).
        assert_eq!(&ra[16..24], &[1, 1, 0x02, 0, 0, 0, 0xaa, 0x01]);
    }

    #[test]
    fn solicitations_are_recognised() {
        assert!(is_solicitation(&[133, 0, 0, 0, 0, 0, 0, 0]));
        assert!(is_solicitation(&[
            133, 0, 1, 2, 0, 0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 1
        ]));
        assert!(
            !is_solicitation(&[133, 1, 0, 0, 0, 0, 0, 0]),
            "code must be 0"
        );
        assert!(!is_solicitation(&[133, 0, 0, 0]), "too short");
        assert!(!is_solicitation(&[134, 0, 0, 0, 0, 0, 0, 0]));
    }
}
