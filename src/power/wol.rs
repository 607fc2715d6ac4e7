//! Wake-on-LAN: the magic packet (six 0xFF bytes, then the target MAC sixteen times; AMD's
//! "Magic Packet Technology" white paper, 1995) sent as one UDP datagram to a broadcast
//! address. Send-only: the protocol has no answer, so power state reads `Unknown`, power off
//! and boot-device selection are unsupported, and `cycle` of a machine that is off is `on`.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::inventory::{Mac, WolTarget};

use super::PowerError;

/// Length of a magic packet without a SecureOn password.
pub const MAGIC_LEN: usize = 6 + 16 * 6;

/// The magic packet that wakes the NIC `mac`.
pub fn magic_packet(mac: Mac) -> [u8; MAGIC_LEN] {
    let mut p = [0xffu8; MAGIC_LEN];
    for chunk in p[6..].chunks_exact_mut(6) {
        chunk.copy_from_slice(&mac.0);
    }
    p
}

/// The controller name for messages.
pub fn describe(t: &WolTarget) -> String {
    format!("wol {} via {}:{}", t.mac, t.broadcast, t.port)
}

/// Sends the magic packet for `t`. The socket may broadcast (SO_BROADCAST) so directed and
/// limited broadcast addresses both work.
pub async fn wake(t: &WolTarget) -> Result<(), PowerError> {
    let target = describe(t);
    let unreachable = |e: std::io::Error| PowerError::Unreachable {
        target: target.clone(),
        reason: e.to_string(),
    };
    let sock = tokio::net::UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
        .await
        .map_err(unreachable)?;
    sock.set_broadcast(true).map_err(unreachable)?;
    let packet = magic_packet(t.mac);
    let sent = sock
        .send_to(&packet, SocketAddrV4::new(t.broadcast, t.port))
        .await
        .map_err(unreachable)?;
    if sent != packet.len() {
        return Err(PowerError::Protocol {
            target,
            reason: format!("sent {sent} of {} bytes", packet.len()),
        });
    }
    tracing::info!(mac = %t.mac, to = %t.broadcast, port = t.port, "sent a Wake-on-LAN magic packet");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_magic_packet_is_six_ff_then_sixteen_macs(mac in any::<[u8; 6]>()) {
            let p = magic_packet(Mac(mac));
            prop_assert_eq!(p.len(), 102);
            prop_assert!(p[..6].iter().all(|b| *b == 0xff));
            for i in 0..16 {
                prop_assert_eq!(&p[6 + 6 * i..12 + 6 * i], &mac[..]);
            }
        }
    }
}
