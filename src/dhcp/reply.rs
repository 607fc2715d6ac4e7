//! Replies on the wire: encoding with the verbatim option 82 echo and BOOTP padding, and where
//! a reply is sent (RFC 2131 §4.1).

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::Encodable;
use dhcproto::v4::{self, Message, MessageType};

use crate::inventory::Mac;

/// A reply ready to encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The message (without option 82).
    pub message: Message,
    /// Option 82 from the request, echoed byte for byte (RFC 3046 §2.2).
    pub(crate) relay_agent_info: Option<Vec<u8>>,
    /// Why the reply names no boot file for a client that asked for one (a Secure Boot node
    /// with nothing signed to boot); published as a `boot.refused` event.
    pub(crate) boot_refused: Option<String>,
}

/// What the socket adapter reports about a reply (events, metrics), taken from the message
/// before it is encoded so that nothing has to decode talboot's own reply again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplySummary {
    /// Option 53 of the reply.
    pub kind: MessageType,
    /// The address leased (unspecified for proxy, 4011, INFORM and NAK replies).
    pub yiaddr: Ipv4Addr,
    /// The `file` field: the boot file named in the reply ("" if none).
    pub(crate) boot_file: String,
    /// [`Reply::boot_refused`].
    pub(crate) boot_refused: Option<String>,
}

impl Reply {
    /// The reply's type, leased address and boot file.
    pub fn summary(&self) -> ReplySummary {
        ReplySummary {
            kind: self
                .message
                .opts()
                .msg_type()
                .unwrap_or(MessageType::Unknown(0)),
            yiaddr: self.message.yiaddr(),
            boot_file: self.boot_file(),
            boot_refused: self.boot_refused.clone(),
        }
    }
}

impl Reply {
    /// The `file` field, or option 67 when the name is too long for the field (a UKI URL).
    fn boot_file(&self) -> String {
        let field = String::from_utf8_lossy(self.message.fname().unwrap_or_default())
            .trim_end_matches('\0')
            .to_string();
        match self
            .message
            .opts()
            .get(dhcproto::v4::OptionCode::BootfileName)
        {
            Some(dhcproto::v4::DhcpOption::BootfileName(v)) if field.is_empty() => {
                String::from_utf8_lossy(v).into_owned()
            }
            _ => field,
        }
    }
}

/// Why a reply could not be encoded.
#[derive(Debug, thiserror::Error)]
#[error("cannot encode DHCP reply: {0}")]
pub struct EncodeError(#[from] dhcproto::error::EncodeError);

/// Encode `reply`, append option 82 just before End (RFC 3046 §2.1 wants it last) and pad with
/// zeros to the 300-byte BOOTP minimum (RFC 1542 §3.1.1): some PXE ROMs and relays drop
/// shorter datagrams, and dhcproto does not pad.
pub fn encode(reply: &Reply) -> Result<Vec<u8>, EncodeError> {
    let mut buf = reply.message.to_vec()?;
    // dhcproto terminates a non-empty option list with End; an empty one is written as
    // nothing at all. Either way, the options end here.
    if buf.last() == Some(&255) && buf.len() > 240 {
        buf.pop();
    }
    if let Some(info) = &reply.relay_agent_info {
        // RFC 3396: split long data into consecutive options of at most 255 bytes.
        if info.is_empty() {
            buf.extend_from_slice(&[82, 0]);
        }
        for chunk in info.chunks(255) {
            buf.push(82);
            buf.push(chunk.len() as u8);
            buf.extend_from_slice(chunk);
        }
    }
    buf.push(255);
    if buf.len() < v4::MIN_PACKET_SIZE {
        buf.resize(v4::MIN_PACKET_SIZE, 0);
    }
    Ok(buf)
}

/// Where to send a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyTarget {
    /// To the relay agent's server port (giaddr:67).
    Relay(SocketAddrV4),
    /// Unicast to an address the client already has (ciaddr:68, or the source on 4011).
    Unicast(SocketAddrV4),
    /// Unicast to the address being offered, which the client cannot yet answer ARP for: the
    /// socket adapter must add an ARP entry `ip -> mac` first (or broadcast if it cannot).
    UnicastToHardware {
        /// yiaddr:68.
        addr: SocketAddrV4,
        /// chaddr.
        mac: Mac,
    },
    /// Limited broadcast 255.255.255.255:68.
    Broadcast,
}

impl ReplyTarget {
    /// The broadcast destination.
    pub(crate) const BROADCAST_ADDR: SocketAddrV4 =
        SocketAddrV4::new(Ipv4Addr::BROADCAST, v4::CLIENT_PORT);

    /// The socket address to send to (ARP handling aside).
    pub fn addr(&self) -> SocketAddrV4 {
        match self {
            Self::Relay(a) | Self::Unicast(a) => *a,
            Self::UnicastToHardware { addr, .. } => *addr,
            Self::Broadcast => Self::BROADCAST_ADDR,
        }
    }
}

/// RFC 2131 §4.1 destination of `reply` to `request` (whose client MAC is `mac`):
/// relayed requests go back to giaddr:67; then a client with ciaddr gets unicast there
/// (except a NAK, which is always broadcast when not relayed, §4.3.2); then the broadcast flag
/// or an empty yiaddr means broadcast; otherwise unicast to yiaddr at the client's MAC.
pub fn reply_target(request: &Message, reply: &Message, mac: Mac) -> ReplyTarget {
    let giaddr = request.giaddr();
    if !giaddr.is_unspecified() {
        return ReplyTarget::Relay(SocketAddrV4::new(giaddr, v4::SERVER_PORT));
    }
    let is_nak = reply.opts().msg_type() == Some(MessageType::Nak);
    let ciaddr = request.ciaddr();
    if !ciaddr.is_unspecified() && !is_nak {
        return ReplyTarget::Unicast(SocketAddrV4::new(ciaddr, v4::CLIENT_PORT));
    }
    let yiaddr = reply.yiaddr();
    if is_nak || request.flags().broadcast() || yiaddr.is_unspecified() {
        return ReplyTarget::Broadcast;
    }
    ReplyTarget::UnicastToHardware {
        addr: SocketAddrV4::new(yiaddr, v4::CLIENT_PORT),
        mac,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::Decodable;
    use dhcproto::v4::{DhcpOption, Flags, OptionCode};

    const MAC: Mac = Mac([0xbc, 0x24, 0x11, 1, 2, 3]);

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn msg(
        kind: MessageType,
        ciaddr: &str,
        yiaddr: &str,
        giaddr: &str,
        broadcast: bool,
    ) -> Message {
        let mut m = Message::new_with_id(
            0x1234,
            ip(ciaddr),
            ip(yiaddr),
            ip("0.0.0.0"),
            ip(giaddr),
            &MAC.0,
        );
        if broadcast {
            m.set_flags(Flags::default().set_broadcast());
        }
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        m
    }

    #[test]
    fn reply_addressing_table() {
        use MessageType::*;
        let z = "0.0.0.0";
        let cases = [
            // (request ciaddr, giaddr, broadcast flag, reply type, reply yiaddr, expected)
            (
                z,
                "10.1.0.1",
                false,
                Offer,
                "10.1.0.5",
                ReplyTarget::Relay("10.1.0.1:67".parse().unwrap()),
            ),
            (
                z,
                "10.1.0.1",
                false,
                Nak,
                z,
                ReplyTarget::Relay("10.1.0.1:67".parse().unwrap()),
            ),
            (
                "10.0.0.5",
                z,
                false,
                Ack,
                "10.0.0.5",
                ReplyTarget::Unicast("10.0.0.5:68".parse().unwrap()),
            ),
            (
                "10.0.0.5",
                z,
                false,
                Ack,
                z,
                ReplyTarget::Unicast("10.0.0.5:68".parse().unwrap()),
            ),
            ("10.0.0.5", z, false, Nak, z, ReplyTarget::Broadcast),
            (z, z, true, Offer, "10.0.0.5", ReplyTarget::Broadcast),
            (z, z, false, Offer, z, ReplyTarget::Broadcast),
            (z, z, false, Nak, z, ReplyTarget::Broadcast),
            (
                z,
                z,
                false,
                Offer,
                "10.0.0.5",
                ReplyTarget::UnicastToHardware {
                    addr: "10.0.0.5:68".parse().unwrap(),
                    mac: MAC,
                },
            ),
        ];
        for (ci, gi, bc, kind, yi, want) in cases {
            let req = msg(MessageType::Request, ci, z, gi, bc);
            let rep = msg(kind, z, yi, gi, bc);
            assert_eq!(
                reply_target(&req, &rep, MAC),
                want,
                "{ci} {gi} {bc} {kind:?} {yi}"
            );
        }
    }

    #[test]
    fn encoding_pads_to_300_and_puts_option_82_last() {
        let mut m = msg(MessageType::Offer, "0.0.0.0", "10.0.0.5", "0.0.0.0", false);
        m.set_opcode(v4::Opcode::BootReply);
        m.opts_mut()
            .insert(DhcpOption::ServerIdentifier(ip("10.0.0.1")));
        let info = vec![1, 2, b'a', b'b', 0x99, 1, 7];
        let bytes = encode(&Reply {
            boot_refused: None,
            message: m,
            relay_agent_info: Some(info.clone()),
        })
        .unwrap();
        assert!(bytes.len() >= 300);
        // Walk the options: 82 must be the last before End, with our bytes.
        let mut i = 240;
        let mut last = None;
        while bytes[i] != 255 {
            if bytes[i] == 0 {
                i += 1;
                continue;
            }
            last = Some((
                bytes[i],
                bytes[i + 2..i + 2 + usize::from(bytes[i + 1])].to_vec(),
            ));
            i += 2 + usize::from(bytes[i + 1]);
        }
        assert_eq!(last, Some((82, info)));
        assert!(bytes[i + 1..].iter().all(|b| *b == 0));
        let back = Message::from_bytes(&bytes).unwrap();
        assert_eq!(
            back.opts().get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(ip("10.0.0.1")))
        );
        assert!(back.opts().get(OptionCode::RelayAgentInformation).is_some());
    }

    #[test]
    fn long_option_82_is_split() {
        let m = msg(MessageType::Ack, "0.0.0.0", "0.0.0.0", "0.0.0.0", false);
        let info = vec![1u8; 300];
        let bytes = encode(&Reply {
            boot_refused: None,
            message: m,
            relay_agent_info: Some(info),
        })
        .unwrap();
        let pos = bytes.windows(2).position(|w| w == [82, 255]).unwrap();
        assert_eq!(&bytes[pos + 257..pos + 259], &[82, 45]);
    }
}
