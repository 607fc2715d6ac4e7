//! Fuzz the TFTP codec: any datagram must parse without panicking, and whatever parses must
//! survive encode -> parse unchanged (the encoder writes the canonical form of the parsed
//! value, so a second parse has to yield the same value).
#![no_main]

use libfuzzer_sys::fuzz_target;
use talboot::tftp::packet::Packet;

fuzz_target!(|data: &[u8]| {
    let Ok(first) = Packet::parse(data) else {
        return;
    };
    let encoded = first.to_bytes();
    let second = Packet::parse(&encoded)
        .unwrap_or_else(|e| panic!("re-parse of {encoded:?} (from {first:?}) failed: {e}"));
    assert_eq!(first, second, "round trip changed the packet");
    // The canonical form is a fixed point.
    assert_eq!(second.to_bytes(), encoded);
});
