//! Recognising an initramfs's compression from its first bytes, the way the Linux kernel does
//! when it unpacks one: so `images import` accepts whatever compression a site's initramfs
//! uses, records it, and refuses a file the kernel could not unpack, before any machine boots.
//!
//! The magic numbers are the kernel's own table, `compressed_formats` in torvalds/linux
//! `lib/decompress.c` (v6.12): two bytes each. An uncompressed initramfs is a `newc` cpio
//! archive, whose headers start `070701` (or `070702` with checksums); `unpack_to_rootfs` in
//! `init/initramfs.c` (v6.12) takes a leading `0` as cpio and only the `newc` forms as valid.

use serde::{Deserialize, Serialize};

/// How an initramfs is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// `1f 8b` (or the old `1f 9e`).
    Gzip,
    /// `42 5a` (`BZ`).
    Bzip2,
    /// `5d 00`.
    Lzma,
    /// `fd 37` (`\xfd7zXZ`); what the Image Factory ships.
    Xz,
    /// `89 4c` (`\x89LZO`).
    Lzo,
    /// `02 21` (the legacy lz4 frame the kernel reads).
    Lz4,
    /// `28 b5` (`28 b5 2f fd`).
    Zstd,
    /// An uncompressed `newc` cpio archive.
    #[serde(rename = "none")]
    Uncompressed,
}

impl Compression {
    /// The name shown to operators and stored in the catalog.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Lzma => "lzma",
            Compression::Xz => "xz",
            Compression::Lzo => "lzo",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Uncompressed => "none",
        }
    }

    /// The compression of a file starting with `head` (its first bytes; 6 are enough), or
    /// `None` when the kernel would not recognise it as an initramfs.
    pub(crate) fn detect(head: &[u8]) -> Option<Compression> {
        if head.starts_with(b"070701") || head.starts_with(b"070702") {
            return Some(Compression::Uncompressed);
        }
        let magic: [u8; 2] = head.get(..2)?.try_into().ok()?;
        Some(match magic {
            [0x1f, 0x8b] | [0x1f, 0x9e] => Compression::Gzip,
            [0x42, 0x5a] => Compression::Bzip2,
            [0x5d, 0x00] => Compression::Lzma,
            [0xfd, 0x37] => Compression::Xz,
            [0x89, 0x4c] => Compression::Lzo,
            [0x02, 0x21] => Compression::Lz4,
            [0x28, 0xb5] => Compression::Zstd,
            _ => return None,
        })
    }
}

/// The compression of the file at `path`, if it can be read and is recognised.
pub(crate) fn sniff(path: &std::path::Path) -> Option<Compression> {
    use std::io::Read;
    let mut head = Vec::with_capacity(8);
    std::fs::File::open(path)
        .ok()?
        .take(8)
        .read_to_end(&mut head)
        .ok()?;
    Compression::detect(&head)
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn real_headers_are_recognised() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b"070701").unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(Compression::detect(&gz), Some(Compression::Gzip));
        assert_eq!(
            Compression::detect(b"\xfd7zXZ\0\0\x04"),
            Some(Compression::Xz)
        );
        assert_eq!(
            Compression::detect(&[0x28, 0xb5, 0x2f, 0xfd, 0x04]),
            Some(Compression::Zstd)
        );
        assert_eq!(
            Compression::detect(&[0x02, 0x21, 0x4c, 0x18]),
            Some(Compression::Lz4)
        );
        assert_eq!(
            Compression::detect(b"070701000000"),
            Some(Compression::Uncompressed)
        );
        assert_eq!(Compression::detect(b"BZh91AY"), Some(Compression::Bzip2));
    }

    #[test]
    fn what_the_kernel_would_reject_is_rejected() {
        assert_eq!(Compression::detect(b""), None);
        assert_eq!(Compression::detect(b"\x1f"), None);
        // The old binary cpio format and odc (`070707`) are not what the kernel unpacks.
        assert_eq!(Compression::detect(b"070707"), None);
        assert_eq!(Compression::detect(b"<html>"), None);
        assert_eq!(Compression::detect(b"MZ\x90\0"), None);
    }

    proptest! {
        /// Only the first bytes matter, and a recognised head stays recognised whatever follows.
        #[test]
        fn detection_depends_on_the_head_only(head in proptest::collection::vec(any::<u8>(), 6), tail in proptest::collection::vec(any::<u8>(), 0..32)) {
            let mut whole = head.clone();
            whole.extend(&tail);
            prop_assert_eq!(Compression::detect(&head), Compression::detect(&whole));
        }
    }
}
