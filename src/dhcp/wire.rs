//! Untrusted bytes to a decoded request, or a counted reason to drop them.
//!
//! dhcproto decodes the fixed header and options, but it is lenient in ways a server must not
//! be (rust-stack §1.3): a malformed option makes it *stop parsing options silently*, an option
//! section without the End (255) marker is accepted, and a few fixed-size options are checked
//! only with `debug_assert!`, so hostile lengths panic in debug builds. This module walks the
//! option section itself first (RFC 2131 §4.1, RFC 2132 §2, RFC 3396 concatenation), rejects
//! what dhcproto would mishandle, decodes, and then checks that every option it saw survived
//! decoding. It also keeps option 82 as raw bytes so the reply can echo it verbatim, as RFC 3046
//! §2.2 requires (dhcproto's typed form drops sub-options it cannot parse).

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddrV4;

use dhcproto::Decodable;
use dhcproto::v4::{self, Message, OptionCode};

use crate::inventory::Mac;

/// Offset of the options field: 236 bytes of BOOTP header plus the 4-byte magic cookie.
const OPTIONS_OFFSET: usize = 240;
/// Option code of the Relay Agent Information option (RFC 3046).
const OPT_RELAY_AGENT: u8 = 82;

/// The UDP port a request arrived on; the PXE boot-server port changes how we answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerPort {
    /// UDP 67, the DHCP server port.
    Dhcp,
    /// UDP 4011, the PXE boot server port (PXE 2.1 §2.2.4); clients already have an address.
    PxeBoot,
}

/// Why a datagram was dropped without an answer. Every variant is a metrics label, so an
/// operator can see *why* a machine is not being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// Shorter than the 240-byte BOOTP header plus magic cookie.
    TooShort,
    /// The magic cookie 99.130.83.99 is missing (plain BOOTP or garbage).
    BadMagic,
    /// The op field is not BOOTREQUEST (e.g. another server's reply seen on broadcast).
    NotBootRequest,
    /// An option's length runs past the end of the datagram.
    OptionOverrun,
    /// The option section is not terminated by End (255).
    MissingEnd,
    /// An option has a length its definition does not allow.
    BadOptionLength,
    /// dhcproto refused the message.
    Undecodable,
    /// dhcproto stopped decoding options early; some options present on the wire were lost.
    OptionsTruncated,
    /// No DHCP message type (option 53): plain BOOTP, which talboot does not serve.
    NoMessageType,
    /// Hardware type/length is not 6-byte Ethernet.
    NotEthernet,
    /// A message type a server never receives or talboot does not serve.
    UnsupportedMessageType,
    /// The per-MAC flood limiter refused the request.
    RateLimited,
    /// Unknown MAC and the unknown-machines policy is `ignore`.
    UnknownMachine,
    /// Proxy mode and the client is not network-booting.
    NotNetbootClient,
    /// The message is addressed to another DHCP server (option 54).
    OtherServer,
    /// giaddr (or the client's address) is in no subnet talboot serves.
    UnknownSubnet,
    /// The node's reserved address is not in the subnet the request came from.
    ReservationOffSubnet,
    /// No address could be offered (no pool, or pool exhausted).
    NoAddress,
    /// A message the current mode/port does not answer (e.g. INFORM in proxy mode).
    NotAnswered,
    /// A REQUEST for an address we have no record of and must not NAK (RFC 2131 §4.3.2).
    NoRecord,
    /// The reply could not be encoded (a talboot bug; the log has the details).
    EncodeFailed,
    /// Another live appliance's share of the clients (RFC 3074 load balancing,
    /// [`super::split`]).
    PeerBucket,
}

impl DropReason {
    /// Stable, snake_case label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::TooShort => "too_short",
            Self::BadMagic => "bad_magic",
            Self::NotBootRequest => "not_boot_request",
            Self::OptionOverrun => "option_overrun",
            Self::MissingEnd => "missing_end",
            Self::BadOptionLength => "bad_option_length",
            Self::Undecodable => "undecodable",
            Self::OptionsTruncated => "options_truncated",
            Self::NoMessageType => "no_message_type",
            Self::NotEthernet => "not_ethernet",
            Self::UnsupportedMessageType => "unsupported_message_type",
            Self::RateLimited => "rate_limited",
            Self::UnknownMachine => "unknown_machine",
            Self::NotNetbootClient => "not_netboot_client",
            Self::OtherServer => "other_server",
            Self::UnknownSubnet => "unknown_subnet",
            Self::ReservationOffSubnet => "reservation_off_subnet",
            Self::NoAddress => "no_address",
            Self::NotAnswered => "not_answered",
            Self::NoRecord => "no_record",
            Self::EncodeFailed => "encode_failed",
            Self::PeerBucket => "peer_bucket",
        }
    }

    /// True for reasons that mean the datagram itself was malformed (as opposed to a
    /// well-formed request we chose not to answer).
    pub fn is_malformed(self) -> bool {
        matches!(
            self,
            Self::TooShort
                | Self::BadMagic
                | Self::OptionOverrun
                | Self::MissingEnd
                | Self::BadOptionLength
                | Self::Undecodable
                | Self::OptionsTruncated
                | Self::NoMessageType
                | Self::NotEthernet
        )
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A decoded, checked DHCP request and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The decoded message.
    pub msg: Message,
    /// The client's hardware address (checked to be 6-byte Ethernet).
    pub mac: Mac,
    /// Raw contents of option 82 (concatenated per RFC 3396), echoed verbatim in replies.
    pub(crate) relay_agent_info: Option<Vec<u8>>,
    /// The port the datagram arrived on.
    pub port: ServerPort,
    /// The datagram's source address (needed to answer on port 4011).
    pub source: SocketAddrV4,
}

impl Request {
    /// Build a request from an already decoded message (tests, simulators). The raw option 82
    /// is taken from the typed option when present.
    pub fn from_message(
        msg: Message,
        port: ServerPort,
        source: SocketAddrV4,
    ) -> Result<Self, DropReason> {
        let mac = ethernet_mac(&msg)?;
        let relay_agent_info = match msg.opts().get(OptionCode::RelayAgentInformation) {
            Some(v4::DhcpOption::RelayAgentInformation(info)) => {
                let mut buf = Vec::new();
                let mut enc = dhcproto::Encoder::new(&mut buf);
                dhcproto::Encodable::encode(info, &mut enc).map_err(|_| DropReason::Undecodable)?;
                Some(buf)
            }
            _ => None,
        };
        Ok(Self {
            msg,
            mac,
            relay_agent_info,
            port,
            source,
        })
    }
}

/// The client MAC from chaddr, if the message says it is 6-byte Ethernet.
pub(crate) fn ethernet_mac(msg: &Message) -> Result<Mac, DropReason> {
    if msg.htype() != v4::HType::Eth || msg.hlen() != 6 {
        return Err(DropReason::NotEthernet);
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&msg.chaddr()[..6]);
    Ok(Mac(mac))
}

/// What the option walk found.
struct OptionScan {
    /// Every option code present (Pad and End excluded).
    codes: BTreeSet<u8>,
    /// Concatenated data of the last run of option 82, if any.
    relay_agent_info: Option<Vec<u8>>,
}

/// One element of an option walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tlv<'a> {
    /// Pad (code 0), one byte without a length.
    Pad,
    /// An option: its code and data.
    Opt(u8, &'a [u8]),
}

/// Why an option walk stopped before End.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlvError {
    /// A length byte is missing or runs past the data.
    Overrun,
    /// The data ended without an End (255).
    NoEnd,
}

/// The one walk over DHCP-style TLVs, for the option area of a message (after the magic
/// cookie) and for encapsulated options (43, 175) alike: no length is trusted, End (255)
/// ends the walk, and after an error nothing more is yielded.
pub fn options(bytes: &[u8]) -> Options<'_> {
    Options {
        bytes,
        at: 0,
        done: false,
    }
}

/// The options (code and data) of `bytes`, Pad skipped, up to End or the first error: what
/// a lenient reader of sub-options wants.
pub(crate) fn option_values(bytes: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    options(bytes)
        .map_while(Result::ok)
        .filter_map(|t| match t {
            Tlv::Opt(code, data) => Some((code, data)),
            Tlv::Pad => None,
        })
}

/// Iterator of [`options`].
#[derive(Debug, Clone)]
pub struct Options<'a> {
    bytes: &'a [u8],
    at: usize,
    done: bool,
}

impl<'a> Iterator for Options<'a> {
    type Item = Result<Tlv<'a>, TlvError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let Some(&code) = self.bytes.get(self.at) else {
            self.done = true;
            return Some(Err(TlvError::NoEnd));
        };
        match code {
            0 => {
                self.at += 1;
                Some(Ok(Tlv::Pad))
            }
            255 => {
                self.done = true;
                None
            }
            _ => {
                let data = self
                    .bytes
                    .get(self.at + 1)
                    .and_then(|&len| self.bytes.get(self.at + 2..self.at + 2 + usize::from(len)));
                match data {
                    Some(data) => {
                        self.at += 2 + data.len();
                        Some(Ok(Tlv::Opt(code, data)))
                    }
                    None => {
                        self.done = true;
                        Some(Err(TlvError::Overrun))
                    }
                }
            }
        }
    }
}

/// Walk the option section of `bytes` (which starts after the magic cookie) without trusting
/// any length, merging adjacent same-code options the way dhcproto does (RFC 3396).
fn scan_options(bytes: &[u8]) -> Result<OptionScan, DropReason> {
    let mut codes = BTreeSet::new();
    let mut relay_agent_info = None;
    // The current run of adjacent same-code options: (code, concatenated length, data).
    let mut run: Option<(u8, usize, Vec<u8>)> = None;
    for item in options(bytes) {
        let item = item.map_err(|e| match e {
            TlvError::NoEnd => DropReason::MissingEnd,
            TlvError::Overrun => DropReason::OptionOverrun,
        })?;
        let (code, data) = match item {
            Tlv::Pad => {
                if let Some((c, len, data)) = run.take() {
                    finish_run(c, len, data, &mut relay_agent_info)?;
                }
                continue;
            }
            Tlv::Opt(code, data) => (code, data),
        };
        let len = data.len();
        codes.insert(code);
        run = match run.take() {
            Some((c, total, mut acc)) if c == code => {
                acc.extend_from_slice(data);
                Some((c, total + len, acc))
            }
            Some((c, total, acc)) => {
                finish_run(c, total, acc, &mut relay_agent_info)?;
                Some((code, len, data.to_vec()))
            }
            None => Some((code, len, data.to_vec())),
        };
    }
    // End.
    if let Some((c, len, data)) = run.take() {
        finish_run(c, len, data, &mut relay_agent_info)?;
    }
    Ok(OptionScan {
        codes,
        relay_agent_info,
    })
}

/// Check one concatenated option against the lengths dhcproto can decode without tripping a
/// `debug_assert!` or an integer underflow, and keep option 82.
fn finish_run(
    code: u8,
    len: usize,
    data: Vec<u8>,
    relay_agent_info: &mut Option<Vec<u8>>,
) -> Result<(), DropReason> {
    let ok = match code {
        // Rapid Commit carries no data.
        80 => len == 0,
        // Client FQDN: flags, rcode1, rcode2, then the name.
        81 => len >= 3,
        // Client Network Interface Identifier: type, major, minor (RFC 4578 §2.2).
        94 => len == 3,
        // Client System Architecture: one or more 16-bit codes (RFC 4578 §2.1).
        93 => len >= 2 && len.is_multiple_of(2),
        // Bulk lease query status code needs its code byte; the time options are 4 bytes.
        151 => len >= 1,
        152..=155 => len == 4,
        // Message type is one byte.
        53 => len == 1,
        _ => true,
    };
    if !ok {
        return Err(DropReason::BadOptionLength);
    }
    if code == OPT_RELAY_AGENT {
        *relay_agent_info = Some(data);
    }
    Ok(())
}

/// Turn a received datagram into a [`Request`], or say why it must be dropped.
pub fn parse(bytes: &[u8], port: ServerPort, source: SocketAddrV4) -> Result<Request, DropReason> {
    if bytes.len() < OPTIONS_OFFSET {
        return Err(DropReason::TooShort);
    }
    if bytes[236..240] != v4::MAGIC {
        return Err(DropReason::BadMagic);
    }
    if bytes[0] != 1 {
        return Err(DropReason::NotBootRequest);
    }
    let scan = scan_options(&bytes[OPTIONS_OFFSET..])?;
    let msg = Message::from_bytes(bytes).map_err(|_| DropReason::Undecodable)?;
    // dhcproto stops at the first option it cannot decode and returns what it had; if any code
    // we saw on the wire is missing now, later options (arch, UUID, ...) may be missing too.
    for code in &scan.codes {
        if !msg.opts().contains(OptionCode::from(*code)) {
            return Err(DropReason::OptionsTruncated);
        }
    }
    if msg.opts().msg_type().is_none() {
        return Err(DropReason::NoMessageType);
    }
    let mac = ethernet_mac(&msg)?;
    Ok(Request {
        msg,
        mac,
        relay_agent_info: scan.relay_agent_info,
        port,
        source,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dhcproto::Encodable;
    use std::net::Ipv4Addr;

    pub(crate) fn src() -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68)
    }

    /// A minimal valid DISCOVER on the wire, with `extra` raw option bytes before End.
    pub(crate) fn raw_discover(extra: &[u8]) -> Vec<u8> {
        let mut msg = Message::new(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &[0xbc, 0x24, 0x11, 0, 0, 1],
        );
        msg.opts_mut()
            .insert(v4::DhcpOption::MessageType(v4::MessageType::Discover));
        let mut buf = msg.to_vec().unwrap();
        assert_eq!(buf.pop(), Some(255));
        buf.extend_from_slice(extra);
        buf.push(255);
        buf
    }

    #[test]
    fn valid_discover_parses() {
        let req = parse(&raw_discover(&[]), ServerPort::Dhcp, src()).unwrap();
        assert_eq!(req.mac.to_string(), "bc:24:11:00:00:01");
        assert_eq!(req.msg.opts().msg_type(), Some(v4::MessageType::Discover));
        assert_eq!(req.relay_agent_info, None);
    }

    #[test]
    fn header_problems_are_named() {
        let good = raw_discover(&[]);
        assert_eq!(
            parse(&good[..239], ServerPort::Dhcp, src()),
            Err(DropReason::TooShort)
        );
        let mut bad = good.clone();
        bad[236] = 0;
        assert_eq!(
            parse(&bad, ServerPort::Dhcp, src()),
            Err(DropReason::BadMagic)
        );
        let mut reply = good.clone();
        reply[0] = 2;
        assert_eq!(
            parse(&reply, ServerPort::Dhcp, src()),
            Err(DropReason::NotBootRequest)
        );
        let mut token_ring = good;
        token_ring[1] = 6;
        assert_eq!(
            parse(&token_ring, ServerPort::Dhcp, src()),
            Err(DropReason::NotEthernet)
        );
    }

    #[test]
    fn missing_end_is_detected() {
        let mut buf = raw_discover(&[]);
        buf.pop();
        assert_eq!(
            parse(&buf, ServerPort::Dhcp, src()),
            Err(DropReason::MissingEnd)
        );
        // Padding after the last option does not count as End either.
        buf.extend_from_slice(&[0, 0, 0]);
        assert_eq!(
            parse(&buf, ServerPort::Dhcp, src()),
            Err(DropReason::MissingEnd)
        );
    }

    #[test]
    fn overrunning_length_is_detected() {
        let mut buf = raw_discover(&[]);
        buf.pop();
        buf.extend_from_slice(&[12, 10, b'a']);
        assert_eq!(
            parse(&buf, ServerPort::Dhcp, src()),
            Err(DropReason::OptionOverrun)
        );
    }

    #[test]
    fn lengths_that_panic_dhcproto_are_rejected() {
        for extra in [
            &[80u8, 1, 0][..],
            &[81, 1, 0],
            &[94, 2, 1, 2],
            &[93, 1, 0],
            &[151, 0],
            &[152, 2, 0, 0],
        ] {
            assert_eq!(
                parse(&raw_discover(extra), ServerPort::Dhcp, src()),
                Err(DropReason::BadOptionLength),
                "{extra:?}"
            );
        }
    }

    #[test]
    fn silently_truncated_options_are_detected() {
        // Hostname (12) with invalid UTF-8 makes dhcproto stop decoding; the arch option after
        // it would be lost without this check.
        let extra = [12, 2, 0xff, 0xfe, 93, 2, 0, 7];
        assert_eq!(
            parse(&raw_discover(&extra), ServerPort::Dhcp, src()),
            Err(DropReason::OptionsTruncated)
        );
    }

    #[test]
    fn no_message_type_is_bootp() {
        let mut buf = raw_discover(&[]);
        // Overwrite option 53 (first option at 240) with a Pad + Pad + Pad.
        assert_eq!(&buf[240..243], &[53, 1, 1]);
        buf[240..243].copy_from_slice(&[0, 0, 0]);
        assert_eq!(
            parse(&buf, ServerPort::Dhcp, src()),
            Err(DropReason::NoMessageType)
        );
    }

    #[test]
    fn option_82_is_kept_verbatim_including_split_runs() {
        // Circuit-id "ab", then an unknown sub-option 0x99 that dhcproto would keep as
        // unknown; split across two adjacent 82 options (RFC 3396).
        let extra = [82, 4, 1, 2, b'a', b'b', 82, 3, 0x99, 1, 7];
        let req = parse(&raw_discover(&extra), ServerPort::Dhcp, src()).unwrap();
        assert_eq!(
            req.relay_agent_info.as_deref(),
            Some(&[1, 2, b'a', b'b', 0x99, 1, 7][..])
        );
    }

    #[test]
    fn the_option_walk_skips_pads_stops_at_end_and_names_truncation() {
        fn walk(b: &[u8]) -> Vec<Result<Tlv<'_>, TlvError>> {
            options(b).collect()
        }
        assert_eq!(
            walk(&[0, 53, 1, 1, 255, 7, 7]),
            [Ok(Tlv::Pad), Ok(Tlv::Opt(53, &[1][..]))]
        );
        assert_eq!(
            walk(&[12, 2, b'a']),
            [Err(TlvError::Overrun)],
            "length past the data"
        );
        assert_eq!(walk(&[12]), [Err(TlvError::Overrun)], "no length byte");
        assert_eq!(
            walk(&[12, 0]),
            [Ok(Tlv::Opt(12, &[][..])), Err(TlvError::NoEnd)]
        );
        // The lenient reader of sub-options keeps what came before a bad tail.
        let subs: Vec<_> = option_values(&[1, 1, 9, 0, 2, 5, 1]).collect();
        assert_eq!(subs, [(1, &[9][..])]);
    }

    #[test]
    fn labels_are_unique() {
        let all = [
            DropReason::TooShort,
            DropReason::BadMagic,
            DropReason::NotBootRequest,
            DropReason::OptionOverrun,
            DropReason::MissingEnd,
            DropReason::BadOptionLength,
            DropReason::Undecodable,
            DropReason::OptionsTruncated,
            DropReason::NoMessageType,
            DropReason::NotEthernet,
            DropReason::UnsupportedMessageType,
            DropReason::RateLimited,
            DropReason::UnknownMachine,
            DropReason::NotNetbootClient,
            DropReason::OtherServer,
            DropReason::UnknownSubnet,
            DropReason::ReservationOffSubnet,
            DropReason::NoAddress,
            DropReason::NotAnswered,
            DropReason::NoRecord,
            DropReason::EncodeFailed,
            DropReason::PeerBucket,
        ];
        let labels: BTreeSet<_> = all.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), all.len());
    }
}
