//! TFTP wire format: parse and encode the six packet kinds.
//!
//! This module owns the bytes of RFC 1350 (RRQ, WRQ, DATA, ACK, ERROR), RFC 2347 (OACK and the
//! option list appended to requests) and the option value ranges of RFC 2348 (`blksize`),
//! RFC 2349 (`timeout`, `tsize`) and RFC 7440 (`windowsize`). It is pure: bytes in, typed
//! [`Packet`] out, and back. It never decides anything about a transfer.
//!
//! Options are read the RFC 2347 way: names are case-insensitive, unknown options are ignored,
//! and an option whose value is malformed or out of its RFC range is treated as if the client
//! had not sent it (the transfer then runs without it instead of failing). Of a repeated option
//! the first valid occurrence wins.

use std::fmt;

/// Opcode of a read request.
const OP_RRQ: u16 = 1;
/// Opcode of a write request.
const OP_WRQ: u16 = 2;
/// Opcode of a data block.
const OP_DATA: u16 = 3;
/// Opcode of an acknowledgement.
const OP_ACK: u16 = 4;
/// Opcode of an error.
const OP_ERROR: u16 = 5;
/// Opcode of an option acknowledgement (RFC 2347).
const OP_OACK: u16 = 6;

/// Smallest block size a client may ask for (RFC 2348).
pub(crate) const MIN_BLKSIZE: u16 = 8;
/// Largest block size a client may ask for (RFC 2348): 65535 minus IP and UDP headers.
pub(crate) const MAX_BLKSIZE: u16 = 65464;
/// Block size when no `blksize` option was negotiated (RFC 1350).
pub(crate) const DEFAULT_BLKSIZE: u16 = 512;
/// Length of the DATA header (opcode and block number) in front of every block.
pub(crate) const DATA_HEADER_LEN: usize = 4;

/// Transfer mode named in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Text with CR LF line ends (RFC 1350 `netascii`).
    Netascii,
    /// Raw bytes (RFC 1350 `octet`); what every boot firmware uses.
    Octet,
    /// Obsolete mail delivery mode (RFC 1350 `mail`).
    Mail,
}

impl Mode {
    /// The mode's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Netascii => "netascii",
            Mode::Octet => "octet",
            Mode::Mail => "mail",
        }
    }
}

/// TFTP error codes (RFC 1350 section 5, code 8 from RFC 2347).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 0: not defined, see the message.
    NotDefined,
    /// 1: file not found.
    FileNotFound,
    /// 2: access violation.
    AccessViolation,
    /// 3: disk full or allocation exceeded.
    DiskFull,
    /// 4: illegal TFTP operation.
    IllegalOperation,
    /// 5: unknown transfer ID.
    UnknownTid,
    /// 6: file already exists.
    FileExists,
    /// 7: no such user.
    NoSuchUser,
    /// 8: the client ends the transfer during option negotiation (RFC 2347). UEFI firmware
    /// sends this right after reading `tsize` from the OACK; it is not a failure.
    OptionNegotiation,
    /// Any code outside 0..=8.
    Other(u16),
}

impl ErrorCode {
    /// The numeric code on the wire.
    pub fn code(self) -> u16 {
        match self {
            ErrorCode::NotDefined => 0,
            ErrorCode::FileNotFound => 1,
            ErrorCode::AccessViolation => 2,
            ErrorCode::DiskFull => 3,
            ErrorCode::IllegalOperation => 4,
            ErrorCode::UnknownTid => 5,
            ErrorCode::FileExists => 6,
            ErrorCode::NoSuchUser => 7,
            ErrorCode::OptionNegotiation => 8,
            ErrorCode::Other(n) => n,
        }
    }
}

impl From<u16> for ErrorCode {
    fn from(n: u16) -> Self {
        match n {
            0 => ErrorCode::NotDefined,
            1 => ErrorCode::FileNotFound,
            2 => ErrorCode::AccessViolation,
            3 => ErrorCode::DiskFull,
            4 => ErrorCode::IllegalOperation,
            5 => ErrorCode::UnknownTid,
            6 => ErrorCode::FileExists,
            7 => ErrorCode::NoSuchUser,
            8 => ErrorCode::OptionNegotiation,
            n => ErrorCode::Other(n),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorCode::NotDefined => "not defined",
            ErrorCode::FileNotFound => "file not found",
            ErrorCode::AccessViolation => "access violation",
            ErrorCode::DiskFull => "disk full",
            ErrorCode::IllegalOperation => "illegal operation",
            ErrorCode::UnknownTid => "unknown transfer ID",
            ErrorCode::FileExists => "file exists",
            ErrorCode::NoSuchUser => "no such user",
            ErrorCode::OptionNegotiation => "option negotiation refused",
            ErrorCode::Other(_) => "unknown code",
        };
        write!(f, "{} ({name})", self.code())
    }
}

/// The options this server understands, as carried by a request or an OACK.
///
/// `None` means the option was absent, or present with a value outside its RFC range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `blksize` (RFC 2348), 8..=65464 bytes of data per DATA packet.
    pub blksize: Option<u16>,
    /// `timeout` (RFC 2349), 1..=255 seconds before a retransmission.
    pub timeout: Option<u8>,
    /// `tsize` (RFC 2349): 0 in a read request (the client asks), the file size in an OACK.
    pub tsize: Option<u64>,
    /// `windowsize` (RFC 7440), 1..=65535 blocks sent before waiting for an ACK.
    pub windowsize: Option<u16>,
}

impl Options {
    /// Whether no option is present.
    pub fn is_empty(&self) -> bool {
        *self == Options::default()
    }

    /// Read `name\0value\0` pairs until the bytes run out.
    ///
    /// Trailing bytes that do not form a complete pair, and an empty name (NUL padding that
    /// some ROMs append), end the list without an error: the request itself is still valid.
    fn parse(mut rest: &[u8]) -> Options {
        let mut opts = Options::default();
        while let Some((name, after_name)) = take_cstr(rest) {
            if name.is_empty() {
                break;
            }
            let Some((value, after_value)) = take_cstr(after_name) else {
                break;
            };
            rest = after_value;
            opts.apply(name, value);
        }
        opts
    }

    /// Record one option if it is known, in range, and not already set.
    fn apply(&mut self, name: &[u8], value: &[u8]) {
        let number = parse_decimal(value);
        if name.eq_ignore_ascii_case(b"blksize") {
            if self.blksize.is_none() {
                self.blksize = number
                    .filter(|n| (u64::from(MIN_BLKSIZE)..=u64::from(MAX_BLKSIZE)).contains(n))
                    .map(|n| n as u16);
            }
        } else if name.eq_ignore_ascii_case(b"timeout") {
            if self.timeout.is_none() {
                self.timeout = number.filter(|n| (1..=255).contains(n)).map(|n| n as u8);
            }
        } else if name.eq_ignore_ascii_case(b"tsize") {
            if self.tsize.is_none() {
                self.tsize = number;
            }
        } else if name.eq_ignore_ascii_case(b"windowsize") && self.windowsize.is_none() {
            self.windowsize = number.filter(|n| (1..=65535).contains(n)).map(|n| n as u16);
        }
    }

    /// Append `name\0value\0` for every present option, in a fixed order.
    fn encode(&self, out: &mut Vec<u8>) {
        let mut put = |name: &str, value: u64| {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            out.extend_from_slice(value.to_string().as_bytes());
            out.push(0);
        };
        if let Some(v) = self.blksize {
            put("blksize", u64::from(v));
        }
        if let Some(v) = self.timeout {
            put("timeout", u64::from(v));
        }
        if let Some(v) = self.tsize {
            put("tsize", v);
        }
        if let Some(v) = self.windowsize {
            put("windowsize", u64::from(v));
        }
    }
}

/// One TFTP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// Read request (opcode 1).
    Rrq {
        /// The file asked for, exactly as sent (not yet checked against the root).
        filename: String,
        /// Transfer mode.
        mode: Mode,
        /// Recognised options.
        options: Options,
    },
    /// Write request (opcode 2); this server always refuses it.
    Wrq {
        /// The file the client wants to write.
        filename: String,
        /// Transfer mode.
        mode: Mode,
        /// Recognised options.
        options: Options,
    },
    /// A block of file data (opcode 3).
    Data {
        /// 16-bit block number (wraps past 65535).
        block: u16,
        /// The payload; shorter than the block size only in the last block.
        data: Vec<u8>,
    },
    /// Acknowledgement of a block (opcode 4).
    Ack {
        /// The block acknowledged; 0 acknowledges an OACK.
        block: u16,
    },
    /// Error; ends the transfer (opcode 5).
    Error {
        /// Error code.
        code: ErrorCode,
        /// Human-readable message (bytes that are not UTF-8 are replaced).
        message: String,
    },
    /// Option acknowledgement (opcode 6, RFC 2347).
    Oack {
        /// The options the server accepted, with the values it chose.
        options: Options,
    },
}

/// Why bytes are not a TFTP packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Fewer bytes than the packet kind's fixed header.
    #[error("{kind} packet is {len} bytes, shorter than its {need}-byte header")]
    TooShort {
        /// Which packet kind (or "TFTP" before the opcode is known).
        kind: &'static str,
        /// Bytes received.
        len: usize,
        /// Bytes the header needs.
        need: usize,
    },
    /// The opcode is not 1..=6.
    #[error("unknown TFTP opcode {0}; expected 1 (RRQ) to 6 (OACK)")]
    UnknownOpcode(u16),
    /// A request string is missing its terminating NUL.
    #[error("request {field} is not NUL-terminated")]
    Unterminated {
        /// `filename` or `mode`.
        field: &'static str,
    },
    /// The requested filename is empty.
    #[error("request filename is empty")]
    EmptyFilename,
    /// The requested filename is not valid UTF-8.
    #[error("request filename is not valid UTF-8")]
    FilenameNotUtf8,
    /// The mode is not netascii, octet or mail.
    #[error("unknown transfer mode `{0}`; expected netascii, octet or mail")]
    UnknownMode(String),
}

impl Packet {
    /// Parse one datagram.
    pub fn parse(bytes: &[u8]) -> Result<Packet, PacketError> {
        let opcode = read_u16(bytes, 0).ok_or(PacketError::TooShort {
            kind: "TFTP",
            len: bytes.len(),
            need: 2,
        })?;
        let body = &bytes[2..];
        match opcode {
            OP_RRQ | OP_WRQ => {
                let (filename, mode, options) = parse_request(body)?;
                Ok(if opcode == OP_RRQ {
                    Packet::Rrq {
                        filename,
                        mode,
                        options,
                    }
                } else {
                    Packet::Wrq {
                        filename,
                        mode,
                        options,
                    }
                })
            }
            OP_DATA => {
                let block = read_u16(bytes, 2).ok_or(PacketError::TooShort {
                    kind: "DATA",
                    len: bytes.len(),
                    need: 4,
                })?;
                Ok(Packet::Data {
                    block,
                    data: bytes[4..].to_vec(),
                })
            }
            OP_ACK => {
                // Bytes after the block number are ignored: some ROMs pad short frames.
                let block = read_u16(bytes, 2).ok_or(PacketError::TooShort {
                    kind: "ACK",
                    len: bytes.len(),
                    need: 4,
                })?;
                Ok(Packet::Ack { block })
            }
            OP_ERROR => {
                let code = read_u16(bytes, 2).ok_or(PacketError::TooShort {
                    kind: "ERROR",
                    len: bytes.len(),
                    need: 4,
                })?;
                // A missing NUL after the message is tolerated: the message is informative only,
                // and refusing the packet would hide the client's abort.
                let raw = &bytes[4..];
                let text = match raw.iter().position(|&b| b == 0) {
                    Some(end) => &raw[..end],
                    None => raw,
                };
                Ok(Packet::Error {
                    code: ErrorCode::from(code),
                    message: String::from_utf8_lossy(text).into_owned(),
                })
            }
            OP_OACK => Ok(Packet::Oack {
                options: Options::parse(body),
            }),
            other => Err(PacketError::UnknownOpcode(other)),
        }
    }

    /// Append the packet's wire form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Packet::Rrq {
                filename,
                mode,
                options,
            } => encode_request(OP_RRQ, filename, *mode, options, out),
            Packet::Wrq {
                filename,
                mode,
                options,
            } => encode_request(OP_WRQ, filename, *mode, options, out),
            Packet::Data { block, data } => {
                out.extend_from_slice(&data_header(*block));
                out.extend_from_slice(data);
            }
            Packet::Ack { block } => {
                out.extend_from_slice(&OP_ACK.to_be_bytes());
                out.extend_from_slice(&block.to_be_bytes());
            }
            Packet::Error { code, message } => {
                out.extend_from_slice(&OP_ERROR.to_be_bytes());
                out.extend_from_slice(&code.code().to_be_bytes());
                // An embedded NUL would end the message early on the other side; cut there.
                let text = message.split('\0').next().unwrap_or_default();
                out.extend_from_slice(text.as_bytes());
                out.push(0);
            }
            Packet::Oack { options } => {
                out.extend_from_slice(&OP_OACK.to_be_bytes());
                options.encode(out);
            }
        }
    }

    /// The packet's wire form in a new buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// The 4-byte header of a DATA packet, so a sender can read file bytes straight after it.
pub(crate) fn data_header(block: u16) -> [u8; DATA_HEADER_LEN] {
    let [a, b] = OP_DATA.to_be_bytes();
    let [c, d] = block.to_be_bytes();
    [a, b, c, d]
}

fn encode_request(op: u16, filename: &str, mode: Mode, options: &Options, out: &mut Vec<u8>) {
    out.extend_from_slice(&op.to_be_bytes());
    let name = filename.split('\0').next().unwrap_or_default();
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(mode.as_str().as_bytes());
    out.push(0);
    options.encode(out);
}

fn parse_request(body: &[u8]) -> Result<(String, Mode, Options), PacketError> {
    let (name, rest) = take_cstr(body).ok_or(PacketError::Unterminated { field: "filename" })?;
    let (mode, rest) = take_cstr(rest).ok_or(PacketError::Unterminated { field: "mode" })?;
    if name.is_empty() {
        return Err(PacketError::EmptyFilename);
    }
    let filename = std::str::from_utf8(name)
        .map_err(|_| PacketError::FilenameNotUtf8)?
        .to_owned();
    let mode = if mode.eq_ignore_ascii_case(b"octet") {
        Mode::Octet
    } else if mode.eq_ignore_ascii_case(b"netascii") {
        Mode::Netascii
    } else if mode.eq_ignore_ascii_case(b"mail") {
        Mode::Mail
    } else {
        return Err(PacketError::UnknownMode(
            String::from_utf8_lossy(mode).into_owned(),
        ));
    };
    Ok((filename, mode, Options::parse(rest)))
}

/// Split off a NUL-terminated string; `None` if there is no NUL.
fn take_cstr(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.iter().position(|&b| b == 0)?;
    Some((&bytes[..end], &bytes[end + 1..]))
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let pair = bytes.get(at..at + 2)?;
    Some(u16::from_be_bytes([pair[0], pair[1]]))
}

/// A plain decimal number: ASCII digits only (no sign, no spaces), fitting in a u64.
fn parse_decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrq(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = vec![0, 1];
        for p in parts {
            out.extend_from_slice(p);
            out.push(0);
        }
        out
    }

    #[test]
    fn parses_plain_rrq() {
        let p = Packet::parse(&rrq(&[b"ipxe.efi", b"octet"])).unwrap();
        assert_eq!(
            p,
            Packet::Rrq {
                filename: "ipxe.efi".into(),
                mode: Mode::Octet,
                options: Options::default(),
            }
        );
    }

    #[test]
    fn parses_uefi_rrq_options_case_insensitively() {
        // The request OVMF's native PXE sends for its size probe.
        let bytes = rrq(&[
            b"ipxe.efi",
            b"OCTET",
            b"TSIZE",
            b"0",
            b"BlkSize",
            b"1468",
            b"windowsize",
            b"4",
        ]);
        let Packet::Rrq { mode, options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert_eq!(mode, Mode::Octet);
        assert_eq!(
            options,
            Options {
                blksize: Some(1468),
                timeout: None,
                tsize: Some(0),
                windowsize: Some(4),
            }
        );
    }

    #[test]
    fn unknown_and_out_of_range_options_are_ignored() {
        let bytes = rrq(&[
            b"f",
            b"octet",
            b"multicast",
            b"",
            b"blksize",
            b"7",
            b"timeout",
            b"0",
            b"windowsize",
            b"65536",
            b"tsize",
            b"+5",
        ]);
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert!(options.is_empty(), "{options:?}");

        let bytes = rrq(&[b"f", b"octet", b"blksize", b"65465", b"timeout", b"256"]);
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert!(options.is_empty(), "{options:?}");
    }

    #[test]
    fn range_edges_are_accepted() {
        let bytes = rrq(&[
            b"f",
            b"octet",
            b"blksize",
            b"65464",
            b"timeout",
            b"255",
            b"windowsize",
            b"65535",
            b"tsize",
            b"18446744073709551615",
        ]);
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert_eq!(options.blksize, Some(65464));
        assert_eq!(options.timeout, Some(255));
        assert_eq!(options.windowsize, Some(65535));
        assert_eq!(options.tsize, Some(u64::MAX));

        let bytes = rrq(&[b"f", b"octet", b"blksize", b"8", b"timeout", b"1"]);
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert_eq!(options.blksize, Some(8));
        assert_eq!(options.timeout, Some(1));
        // One digit past u64 is ignored, not wrapped.
        let bytes = rrq(&[b"f", b"octet", b"tsize", b"18446744073709551616"]);
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert_eq!(options.tsize, None);
    }

    #[test]
    fn first_occurrence_of_a_repeated_option_wins() {
        let bytes = rrq(&[b"f", b"octet", b"blksize", b"1024", b"BLKSIZE", b"512"]);
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert_eq!(options.blksize, Some(1024));
    }

    #[test]
    fn trailing_padding_and_half_options_are_tolerated() {
        let mut bytes = rrq(&[b"f", b"octet", b"blksize", b"1024"]);
        bytes.extend_from_slice(&[0, 0, 0]);
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert_eq!(options.blksize, Some(1024));

        let mut bytes = rrq(&[b"f", b"octet", b"blksize", b"1024", b"tsize"]);
        bytes.extend_from_slice(b"0"); // value without its NUL
        let Packet::Rrq { options, .. } = Packet::parse(&bytes).unwrap() else {
            panic!("not an RRQ");
        };
        assert_eq!(options.blksize, Some(1024));
        assert_eq!(options.tsize, None);
    }

    #[test]
    fn malformed_requests_are_errors() {
        assert_eq!(
            Packet::parse(&[0]),
            Err(PacketError::TooShort {
                kind: "TFTP",
                len: 1,
                need: 2
            })
        );
        assert_eq!(Packet::parse(&[0, 9]), Err(PacketError::UnknownOpcode(9)));
        assert_eq!(
            Packet::parse(b"\x00\x01file"),
            Err(PacketError::Unterminated { field: "filename" })
        );
        assert_eq!(
            Packet::parse(b"\x00\x01file\x00octet"),
            Err(PacketError::Unterminated { field: "mode" })
        );
        assert_eq!(
            Packet::parse(&rrq(&[b"", b"octet"])),
            Err(PacketError::EmptyFilename)
        );
        assert_eq!(
            Packet::parse(&rrq(&[b"\xff\xfe", b"octet"])),
            Err(PacketError::FilenameNotUtf8)
        );
        assert_eq!(
            Packet::parse(&rrq(&[b"f", b"binary"])),
            Err(PacketError::UnknownMode("binary".into()))
        );
        assert!(matches!(
            Packet::parse(&[0, 4, 1]),
            Err(PacketError::TooShort { kind: "ACK", .. })
        ));
        assert!(matches!(
            Packet::parse(&[0, 3, 1]),
            Err(PacketError::TooShort { kind: "DATA", .. })
        ));
        assert!(matches!(
            Packet::parse(&[0, 5, 0]),
            Err(PacketError::TooShort { kind: "ERROR", .. })
        ));
    }

    #[test]
    fn parses_ack_data_error() {
        assert_eq!(
            Packet::parse(&[0, 4, 0xff, 0xfe, 0, 0]).unwrap(),
            Packet::Ack { block: 65534 }
        );
        assert_eq!(
            Packet::parse(&[0, 3, 0, 7, 1, 2, 3]).unwrap(),
            Packet::Data {
                block: 7,
                data: vec![1, 2, 3]
            }
        );
        assert_eq!(
            Packet::parse(&[0, 3, 0, 7]).unwrap(),
            Packet::Data {
                block: 7,
                data: vec![]
            }
        );
        // EDK2's abort after reading tsize from the OACK.
        assert_eq!(
            Packet::parse(b"\x00\x05\x00\x08User aborted the transfer\x00").unwrap(),
            Packet::Error {
                code: ErrorCode::OptionNegotiation,
                message: "User aborted the transfer".into()
            }
        );
        // Unterminated message, unknown code.
        assert_eq!(
            Packet::parse(b"\x00\x05\x00\x63bye").unwrap(),
            Packet::Error {
                code: ErrorCode::Other(99),
                message: "bye".into()
            }
        );
    }

    #[test]
    fn encodes_exact_bytes() {
        assert_eq!(Packet::Ack { block: 258 }.to_bytes(), vec![0, 4, 1, 2]);
        assert_eq!(
            Packet::Error {
                code: ErrorCode::FileNotFound,
                message: "no".into()
            }
            .to_bytes(),
            b"\x00\x05\x00\x01no\x00".to_vec()
        );
        assert_eq!(
            Packet::Oack {
                options: Options {
                    blksize: Some(1468),
                    timeout: None,
                    tsize: Some(1048576),
                    windowsize: Some(4),
                }
            }
            .to_bytes(),
            b"\x00\x06blksize\x001468\x00tsize\x001048576\x00windowsize\x004\x00".to_vec()
        );
        assert_eq!(
            Packet::Data {
                block: 1,
                data: vec![9]
            }
            .to_bytes(),
            vec![0, 3, 0, 1, 9]
        );
        assert_eq!(data_header(0xabcd), [0, 3, 0xab, 0xcd]);
    }

    #[test]
    fn round_trips_every_kind() {
        let all = [
            Packet::Rrq {
                filename: "sub/file".into(),
                mode: Mode::Netascii,
                options: Options {
                    blksize: Some(8),
                    timeout: Some(3),
                    tsize: Some(0),
                    windowsize: Some(65535),
                },
            },
            Packet::Wrq {
                filename: "up".into(),
                mode: Mode::Mail,
                options: Options::default(),
            },
            Packet::Data {
                block: 0,
                data: vec![0; 512],
            },
            Packet::Ack { block: 65535 },
            Packet::Error {
                code: ErrorCode::Other(4242),
                message: "strange".into(),
            },
            Packet::Oack {
                options: Options::default(),
            },
        ];
        for p in all {
            assert_eq!(Packet::parse(&p.to_bytes()).unwrap(), p);
        }
    }

    /// A cheap stand-in for the cargo-fuzz target that runs in every `cargo test`: mutate
    /// valid packets at random and check parse never panics and encode/parse is stable.
    #[test]
    fn mutated_packets_parse_and_round_trip() {
        let seeds: Vec<Vec<u8>> = vec![
            rrq(&[b"ipxe.efi", b"octet", b"tsize", b"0", b"blksize", b"1468"]),
            rrq(&[b"a/b", b"NetAscii", b"windowsize", b"64", b"timeout", b"3"]),
            b"\x00\x06blksize\x001468\x00tsize\x0099\x00".to_vec(),
            b"\x00\x05\x00\x08User aborted\x00".to_vec(),
            vec![0, 4, 0, 0],
            vec![0, 3, 0, 1, 1, 2, 3],
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000usize {
            let mut bytes = seeds[i % seeds.len()].clone();
            for _ in 0..(next() % 4 + 1) {
                let r = next();
                let at = (r >> 8) as usize % (bytes.len() + 1);
                match r % 4 {
                    0 if at < bytes.len() => bytes[at] = (r >> 32) as u8,
                    1 => bytes.insert(at, [0u8, b'0', b'x', 0xff][(r >> 40) as usize % 4]),
                    2 if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => bytes.truncate(at),
                }
            }
            if let Ok(first) = Packet::parse(&bytes) {
                let encoded = first.to_bytes();
                let second = Packet::parse(&encoded).expect("re-parse of an encoded packet");
                assert_eq!(first, second, "from {bytes:?}");
                assert_eq!(second.to_bytes(), encoded);
            }
        }
    }

    #[test]
    fn error_codes_round_trip_through_numbers() {
        for n in 0..=20u16 {
            assert_eq!(ErrorCode::from(n).code(), n);
        }
        assert_eq!(ErrorCode::from(8), ErrorCode::OptionNegotiation);
        assert_eq!(
            ErrorCode::AccessViolation.to_string(),
            "2 (access violation)"
        );
    }
}
