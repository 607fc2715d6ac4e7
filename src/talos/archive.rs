//! Reads the kubeconfig out of the bytes the Kubeconfig RPC streams back.
//!
//! Talos sends the kubeconfig "wrapped in .tar.gz to match the Copy protocol": the
//! concatenated `common.Data.bytes` of the stream are a gzip-compressed tar holding one
//! regular file named `kubeconfig`. This module is pure: bytes in, file contents out.

use std::io::Read;

/// The largest kubeconfig we accept once decompressed; a real one is a few KiB, and a limit
/// keeps a broken or hostile stream from exhausting memory.
pub(crate) const MAX_KUBECONFIG: u64 = 4 * 1024 * 1024;

/// Why the archive could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ArchiveError {
    /// The stream was empty.
    #[error("the kubeconfig stream carried no bytes")]
    Empty,
    /// Not gzip.
    #[error("the kubeconfig stream is not gzip data (Talos sends a .tar.gz)")]
    NotGzip,
    /// gzip or tar structure broken.
    #[error("the kubeconfig archive is corrupt: {0}")]
    Corrupt(String),
    /// No `kubeconfig` regular file in the archive.
    #[error("the kubeconfig archive holds no regular file named `kubeconfig`")]
    Missing,
    /// The file exceeds [`MAX_KUBECONFIG`].
    #[error("the kubeconfig in the archive is larger than {MAX_KUBECONFIG} bytes")]
    TooLarge,
}

/// Extracts the `kubeconfig` file from a Talos kubeconfig archive (`.tar.gz`).
pub(crate) fn kubeconfig_from_archive(archive: &[u8]) -> Result<Vec<u8>, ArchiveError> {
    if archive.is_empty() {
        return Err(ArchiveError::Empty);
    }
    if !archive.starts_with(&[0x1f, 0x8b]) {
        return Err(ArchiveError::NotGzip);
    }
    let gz = flate2::read::GzDecoder::new(archive);
    let mut tar = tar::Archive::new(gz);
    let entries = tar
        .entries()
        .map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
    for entry in entries {
        let entry = entry.map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
        let path = entry
            .path()
            .map_err(|e| ArchiveError::Corrupt(e.to_string()))?
            .into_owned();
        // Accept `kubeconfig` and `./kubeconfig`; anything else in the archive is ignored.
        let is_kubeconfig = path.components().filter(|c| c.as_os_str() != ".").count() == 1
            && path.file_name().is_some_and(|n| n == "kubeconfig");
        if !is_kubeconfig || !entry.header().entry_type().is_file() {
            continue;
        }
        if entry.size() > MAX_KUBECONFIG {
            return Err(ArchiveError::TooLarge);
        }
        let mut out = Vec::with_capacity(entry.size() as usize);
        entry
            .take(MAX_KUBECONFIG + 1)
            .read_to_end(&mut out)
            .map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
        if out.len() as u64 > MAX_KUBECONFIG {
            return Err(ArchiveError::TooLarge);
        }
        return Ok(out);
    }
    Err(ArchiveError::Missing)
}

/// Builds a kubeconfig archive laid out byte for byte as Talos v1.13.9 builds it
/// (`internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`, Kubeconfig): a
/// gzip stream holding one USTAR header for the regular file `kubeconfig` (mode 0600, size,
/// modification time in whole seconds, as Go's `tar.Writer` picks USTAR for such a header),
/// then the file's bytes, and nothing after them: Talos closes the gzip writer but never the
/// tar writer, so the last block is not padded to 512 bytes and there is no end-of-archive
/// marker. Used by the simulated node and the tests.
#[cfg(any(test, feature = "sim"))]
pub(crate) fn kubeconfig_archive(kubeconfig: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut header = tar::Header::new_ustar();
    header.set_path("kubeconfig")?;
    header.set_size(kubeconfig.len() as u64);
    header.set_mode(0o600);
    header.set_entry_type(tar::EntryType::Regular);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    header.set_mtime(now);
    header.set_cksum();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(header.as_bytes())?;
    gz.write_all(kubeconfig)?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &[u8] = b"apiVersion: v1\nkind: Config\nclusters: []\n";

    #[test]
    fn round_trip() {
        let archive = kubeconfig_archive(KUBECONFIG).unwrap();
        assert_eq!(kubeconfig_from_archive(&archive).unwrap(), KUBECONFIG);
    }

    #[test]
    fn the_archive_ends_where_talos_stops_writing() {
        // Talos never closes its tar writer: one 512-byte header, the file, nothing more
        // (no padding, no two zero blocks). The reader must not insist on either.
        let archive = kubeconfig_archive(KUBECONFIG).unwrap();
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(&archive[..])
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(tar.len(), 512 + KUBECONFIG.len());
        assert_eq!(&tar[512..], KUBECONFIG);
        let header = tar::Header::from_byte_slice(&tar[..512]);
        assert_eq!(header.path().unwrap().to_str(), Some("kubeconfig"));
        assert_eq!(header.mode().unwrap(), 0o600);
        assert!(header.as_ustar().is_some());
        assert_eq!(kubeconfig_from_archive(&archive).unwrap(), KUBECONFIG);
    }

    #[test]
    fn other_files_are_skipped() {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (name, data) in [("README", &b"x"[..]), ("./kubeconfig", KUBECONFIG)] {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        let archive = b.into_inner().unwrap().finish().unwrap();
        assert_eq!(kubeconfig_from_archive(&archive).unwrap(), KUBECONFIG);
    }

    #[test]
    fn plain_yaml_is_not_accepted_as_an_archive() {
        assert_eq!(
            kubeconfig_from_archive(KUBECONFIG),
            Err(ArchiveError::NotGzip)
        );
        assert_eq!(kubeconfig_from_archive(b""), Err(ArchiveError::Empty));
    }

    #[test]
    fn truncated_archive_is_corrupt_not_missing() {
        let archive = kubeconfig_archive(KUBECONFIG).unwrap();
        let err = kubeconfig_from_archive(&archive[..archive.len() / 2]).unwrap_err();
        assert!(matches!(err, ArchiveError::Corrupt(_)), "{err:?}");
    }

    #[test]
    fn archive_without_kubeconfig_is_missing() {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        let mut h = tar::Header::new_ustar();
        h.set_size(1);
        h.set_cksum();
        b.append_data(&mut h, "other", &b"x"[..]).unwrap();
        let archive = b.into_inner().unwrap().finish().unwrap();
        assert_eq!(
            kubeconfig_from_archive(&archive),
            Err(ArchiveError::Missing)
        );
    }
}
