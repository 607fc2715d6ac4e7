//! Reads of a raw datagram's header and options before (or without) a full decode: for the
//! spans, counters and queue lanes of datagrams the core may yet drop, and for the proxy-mode
//! bindings the core does not decide. Nothing here trusts the bytes: a short or malformed
//! datagram reads as nothing.

use std::net::Ipv4Addr;

use dhcproto::v4::{Message, MessageType};
use dhcproto::{Decodable, Decoder};

use crate::inventory::Mac;

/// xid of a raw request (0 when too short; such a datagram was dropped anyway).
pub(super) fn peek_xid(b: &[u8]) -> u32 {
    b.get(4..8)
        .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
        .unwrap_or(0)
}

/// chaddr and requested address (option 50) of a DHCPREQUEST that selects another server's
/// offer (option 54 present), the client's choice of address in a proxied exchange.
pub(super) fn selected_address(b: &[u8]) -> Option<(Mac, Ipv4Addr)> {
    use dhcproto::v4::{DhcpOption, OptionCode};
    let msg = Message::decode(&mut Decoder::new(b)).ok()?;
    if msg.opts().msg_type() != Some(MessageType::Request)
        || msg.opts().get(OptionCode::ServerIdentifier).is_none()
    {
        return None;
    }
    let Some(DhcpOption::RequestedIpAddress(ip)) = msg.opts().get(OptionCode::RequestedIpAddress)
    else {
        return None;
    };
    let ip = crate::entitlement::proxy_client_address(
        *ip,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
    )?;
    Some((peek_mac(b)?, ip))
}

/// The client address of a ProxyDHCP request (ciaddr, giaddr read from the raw header; see
/// [`crate::entitlement::proxy_client_address`]).
pub(super) fn proxy_request_address(b: &[u8], source: Ipv4Addr) -> Option<Ipv4Addr> {
    let at = |o: usize| {
        b.get(o..o + 4)
            .map(|x| Ipv4Addr::new(x[0], x[1], x[2], x[3]))
    };
    crate::entitlement::proxy_client_address(at(12)?, at(24)?, source)
}

/// chaddr, when the header is long enough and says 6-byte Ethernet.
pub(super) fn peek_mac(b: &[u8]) -> Option<Mac> {
    if b.len() < 34 || b[1] != 1 || b[2] != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[28..34]);
    Some(Mac(m))
}

/// Option 53 from the raw options, for spans and counters before (or without) a full decode.
pub(super) fn peek_msg_type(b: &[u8]) -> Option<MessageType> {
    if b.len() < 240 || b[236..240] != [99, 130, 83, 99] {
        return None;
    }
    crate::dhcp::wire::option_values(&b[240..])
        .find(|(code, data)| *code == 53 && data.len() == 1)
        .map(|(_, data)| MessageType::from(data[0]))
}

/// The `type` label of a message type in metrics and spans.
pub(super) fn msg_type_label(t: MessageType) -> &'static str {
    match t {
        MessageType::Discover => "discover",
        MessageType::Offer => "offer",
        MessageType::Request => "request",
        MessageType::Decline => "decline",
        MessageType::Ack => "ack",
        MessageType::Nak => "nak",
        MessageType::Release => "release",
        MessageType::Inform => "inform",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discover(mac: [u8; 6], xid: u32) -> Vec<u8> {
        let mut b = vec![0u8; 240];
        b[0] = 1;
        b[1] = 1;
        b[2] = 6;
        b[4..8].copy_from_slice(&xid.to_be_bytes());
        b[28..34].copy_from_slice(&mac);
        b[236..240].copy_from_slice(&[99, 130, 83, 99]);
        b.extend_from_slice(&[0, 0, 53, 1, 1, 255]);
        b
    }

    #[test]
    fn peeks_read_header_and_type_and_refuse_garbage() {
        let b = discover([2, 0, 0, 0, 0, 9], 7);
        assert_eq!(peek_mac(&b), Some(Mac([2, 0, 0, 0, 0, 9])));
        assert_eq!(peek_msg_type(&b), Some(MessageType::Discover));
        assert_eq!(peek_msg_type(&b[..239]), None);
        let mut bad = b.clone();
        bad[2] = 16;
        assert_eq!(peek_mac(&bad), None);
        // An option length running past the end must not panic.
        let mut trunc = b[..240].to_vec();
        trunc.extend_from_slice(&[12, 200, 1]);
        assert_eq!(peek_msg_type(&trunc), None);
    }
}
