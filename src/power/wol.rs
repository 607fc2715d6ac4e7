//! Wake-on-LAN: the magic packet (six 0xFF bytes, then the target MAC sixteen times; AMD's
//! "Magic Packet Technology" white paper, 1995) sent as one UDP datagram to a broadcast
//! address. Send-only: the protocol has no answer, so power state reads `Unknown`, power off
//! and boot-device selection are unsupported, and `cycle` of a machine that is off is `on`.
//!
//! A NIC armed with a SecureOn password (`ethtool -s IF wol s sopass xx:xx:xx:xx:xx:xx`)
//! wakes only for a magic packet followed by that password: 4 or 6 bytes right after the
//! sixteenth MAC. It is written as etherwake's `-p` takes it (BusyBox
//! `networking/ether-wake.c`, `get_wol_pw`): six hex bytes `aa:bb:cc:dd:ee:ff`, or four
//! decimal bytes `192.168.1.10`. The password is a secret: it travels as a [`Credential`]
//! and no log line, error or event shows it.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use zeroize::Zeroizing;

use crate::inventory::{Mac, WolTarget};

use futures_util::future::BoxFuture;

use super::{
    BootDevice, BootPersistence, BootSet, PowerAction, PowerError, PowerState, ProbeAnswer,
};
use crate::inventory::Credential;

/// Length of a magic packet without a SecureOn password.
pub(crate) const MAGIC_LEN: usize = 6 + 16 * 6;

/// The magic packet that wakes the NIC `mac`.
pub fn magic_packet(mac: Mac) -> [u8; MAGIC_LEN] {
    let mut p = [0xffu8; MAGIC_LEN];
    for chunk in p[6..].chunks_exact_mut(6) {
        chunk.copy_from_slice(&mac.0);
    }
    p
}

/// A SecureOn password: 4 or 6 bytes. `Debug` never shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct SecureOn(Zeroizing<Vec<u8>>);

impl fmt::Debug for SecureOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecureOn(<{} bytes redacted>)", self.0.len())
    }
}

/// Why a SecureOn password does not parse. Never carries any part of the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "is not a SecureOn password (the value is not shown): write six hex bytes like aa:bb:cc:dd:ee:ff, or four decimal bytes like 192.168.1.10, as `etherwake -p` takes it"
)]
pub struct SecureOnError;

impl SecureOn {
    /// Parses `aa:bb:cc:dd:ee:ff` (six hex bytes) or `a.b.c.d` (four decimal bytes, 0-255).
    pub fn parse(s: &str) -> Result<Self, SecureOnError> {
        let s = s.trim();
        let bytes: Option<Vec<u8>> = if s.contains(':') {
            let parts: Vec<&str> = s.split(':').collect();
            (parts.len() == 6)
                .then(|| {
                    parts
                        .iter()
                        .map(|p| {
                            let ok = (1..=2).contains(&p.len())
                                && p.bytes().all(|b| b.is_ascii_hexdigit());
                            ok.then(|| u8::from_str_radix(p, 16).ok()).flatten()
                        })
                        .collect()
                })
                .flatten()
        } else {
            let parts: Vec<&str> = s.split('.').collect();
            (parts.len() == 4)
                .then(|| {
                    parts
                        .iter()
                        .map(|p| {
                            let ok =
                                (1..=3).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
                            ok.then(|| p.parse::<u8>().ok()).flatten()
                        })
                        .collect()
                })
                .flatten()
        };
        bytes.map(|b| Self(Zeroizing::new(b))).ok_or(SecureOnError)
    }

    /// The password as a [`Credential`] holds it.
    pub(crate) fn from_credential(c: &Credential) -> Result<Self, SecureOnError> {
        Self::parse(c.expose())
    }

    /// The bytes that follow the magic packet.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The datagram that wakes `mac`: the magic packet, then the SecureOn password if any.
pub(crate) fn wake_datagram(mac: Mac, secure_on: Option<&SecureOn>) -> Zeroizing<Vec<u8>> {
    let mut p = Zeroizing::new(magic_packet(mac).to_vec());
    if let Some(pw) = secure_on {
        p.extend_from_slice(pw.bytes());
    }
    p
}

/// The controller name for messages.
pub fn describe(t: &WolTarget) -> String {
    format!("wol {} via {}:{}", t.mac, t.broadcast, t.port)
}

/// Sends the magic packet for `t`. The socket may broadcast (SO_BROADCAST) so directed and
/// limited broadcast addresses both work.
pub(crate) async fn wake(t: &WolTarget) -> Result<(), PowerError> {
    let target = describe(t);
    let unreachable = |e: std::io::Error| PowerError::Unreachable {
        target: target.clone(),
        reason: e.to_string(),
    };
    let sock = tokio::net::UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
        .await
        .map_err(unreachable)?;
    sock.set_broadcast(true).map_err(unreachable)?;
    let secure_on = t
        .secure_on
        .as_ref()
        .map(SecureOn::from_credential)
        .transpose()
        .map_err(|e| PowerError::Invalid {
            target: target.clone(),
            reason: format!("power.secureOn {e}"),
        })?;
    let packet = wake_datagram(t.mac, secure_on.as_ref());
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
    tracing::info!(
        mac = %t.mac,
        to = %t.broadcast,
        port = t.port,
        secure_on = secure_on.is_some(),
        "sent a Wake-on-LAN magic packet"
    );
    Ok(())
}

/// The Wake-on-LAN driver: send-only, so it can power on (a cycle is all it can do of one)
/// and nothing else.
impl super::Driver for WolTarget {
    fn set_power(&self, action: PowerAction) -> BoxFuture<'_, Result<(), PowerError>> {
        Box::pin(async move {
            match action {
                // A machine woken while on ignores the packet; one that is off starts, which
                // is all a cycle can do without a way to turn it off.
                PowerAction::On | PowerAction::Cycle => wake(self).await,
                PowerAction::Off => Err(PowerError::Unsupported {
                    target: describe(self),
                    what: "power off".into(),
                }),
            }
        })
    }

    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, PowerError>> {
        Box::pin(async { Ok(PowerState::Unknown) })
    }

    fn set_boot_device(
        &self,
        _device: BootDevice,
        _persistence: BootPersistence,
    ) -> BoxFuture<'_, Result<BootSet, PowerError>> {
        Box::pin(async move {
            Err(PowerError::Unsupported {
                target: describe(self),
                what: "choosing the boot device".into(),
            })
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<ProbeAnswer, PowerError>> {
        Box::pin(async { Ok(ProbeAnswer::SendOnly) })
    }

    fn secure_boot(&self) -> BoxFuture<'_, Result<super::secureboot::SecureBootProbe, PowerError>> {
        Box::pin(async {
            Ok(super::secureboot::SecureBootProbe::Unknown(
                "Wake-on-LAN only sends; nothing can be read".into(),
            ))
        })
    }
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

        #[test]
        fn a_secureon_password_follows_the_sixteenth_mac(mac in any::<[u8; 6]>(), pw in any::<[u8; 6]>()) {
            let text = pw.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
            let so = SecureOn::parse(&text).unwrap();
            let p = wake_datagram(Mac(mac), Some(&so));
            prop_assert_eq!(p.len(), 108);
            prop_assert_eq!(&p[..102], &magic_packet(Mac(mac))[..]);
            prop_assert_eq!(&p[102..], &pw[..]);
        }
    }

    #[test]
    fn secureon_takes_six_hex_or_four_dotted_bytes() {
        let six = SecureOn::parse("5E:c2:07:0a:1:ff").unwrap();
        assert_eq!(six.bytes(), [0x5e, 0xc2, 0x07, 0x0a, 0x01, 0xff]);
        let four = SecureOn::parse("192.168.1.10").unwrap();
        assert_eq!(four.bytes(), [192, 168, 1, 10]);
        let p = wake_datagram(Mac([0xaa, 0, 0, 0, 0, 0x21]), Some(&four));
        assert_eq!(&p[102..], [192, 168, 1, 10]);
        assert_eq!(wake_datagram(Mac([1; 6]), None).len(), MAGIC_LEN);
        for bad in [
            "",
            "aa:bb:cc:dd:ee",
            "aa:bb:cc:dd:ee:ff:00",
            "aa:bb:cc:dd:ee:fg",
            "aa:bb:cc:dd:ee:100",
            "1.2.3",
            "1.2.3.256",
            "1.2.3.-4",
            "1.2.3.4.5",
            "hunter2",
        ] {
            assert_eq!(SecureOn::parse(bad), Err(SecureOnError), "{bad:?}");
        }
        let msg = SecureOnError.to_string();
        assert!(
            msg.contains("aa:bb:cc:dd:ee:ff") && msg.contains("not shown"),
            "{msg}"
        );
        assert!(!format!("{six:?}").contains("5e"), "{six:?}");
    }
}
