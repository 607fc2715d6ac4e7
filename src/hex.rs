//! Hex text of bytes: digests, tokens, schematic IDs, opaque store values, SOPS MACs.
//!
//! One encoder for the whole crate (a dependency is not worth it for this).

const LOWER: &[u8; 16] = b"0123456789abcdef";
const UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn encode(bytes: &[u8], digits: &[u8; 16]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(digits[usize::from(b >> 4)]));
        out.push(char::from(digits[usize::from(b & 0x0f)]));
    }
    out
}

/// Lowercase hex of `bytes`, two digits a byte.
pub fn lower(bytes: &[u8]) -> String {
    encode(bytes, LOWER)
}

/// Uppercase hex of `bytes`, two digits a byte.
pub(crate) fn upper(bytes: &[u8]) -> String {
    encode(bytes, UPPER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_formatter_for_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(lower(&all), expected);
        assert_eq!(upper(&all), expected.to_ascii_uppercase());
        assert_eq!(lower(&[]), "");
        assert_eq!(lower(&[0x00, 0x0f, 0xf0, 0xff]), "000ff0ff");
    }
}
