//! Boot files for the simulation: stand-ins for the Talos kernel and initramfs of every boot
//! set the inventory needs (recorded in a real `catalog.json`, so `serve` verifies them as it
//! verifies pulled ones), and stand-ins for the iPXE first-stage binaries in a TFTP root.
//!
//! The contents are deterministic pseudo-random bytes behind a one-line header saying what
//! they are, sized down from the real files (a 2 MiB "kernel", an 8 MiB "initramfs") so
//! thirteen machines boot in seconds; the bytes are never executed, only moved, hashed and
//! counted, which is what the boot chain does with them.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::artifacts::{self, Catalog, Entry, FileRecord, Kind, SetId};
use crate::fsutil::write_atomic;
use crate::inventory::Inventory;
use crate::tftp::IPXE_BINARIES;

/// Size of a simulated kernel.
pub(crate) const KERNEL_BYTES: usize = 2 << 20;
/// Size of a simulated initramfs.
pub(crate) const INITRAMFS_BYTES: usize = 8 << 20;
/// Size of a simulated iPXE binary.
pub(crate) const IPXE_BYTES: usize = 96 << 10;

/// Why the simulated boot files could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write simulated boot files to {}: {cause}", path.display())]
pub(crate) struct AssetError {
    /// The file or directory.
    pub path: PathBuf,
    /// What failed.
    pub cause: String,
}

/// `len` bytes: `header`, a newline, then an xorshift stream seeded from the header.
pub(crate) fn filler(header: &str, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(header.as_bytes());
    out.push(b'\n');
    let seed = Sha256::digest(header.as_bytes());
    let mut x = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn write(path: &Path, bytes: &[u8]) -> Result<FileRecord, AssetError> {
    let err = |cause: String| AssetError {
        path: path.to_owned(),
        cause,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
    }
    write_atomic(path, bytes, 0o644).map_err(|e| err(e.to_string()))?;
    Ok(FileRecord {
        size: bytes.len() as u64,
        sha256: crate::hex::lower(&Sha256::digest(bytes)),
        compression: None,
        uki: None,
    })
}

/// Writes a boot set for every set `inv` needs under `images` and records them in its
/// catalog, with the default Talos kernel command line as the `cmdline` file.
pub(crate) fn write_boot_sets(
    images: &Path,
    inv: &Inventory,
    now_unix: u64,
) -> Result<(), AssetError> {
    let mut catalog = Catalog::load(images).map_err(|e| AssetError {
        path: images.to_owned(),
        cause: e.to_string(),
    })?;
    for need in artifacts::requirements(inv) {
        let id = need.id;
        let dir = images.join(id.rel_dir());
        let mut files = std::collections::BTreeMap::new();
        let label = |what: &str| format!("talboot simulation: not a real {what} ({id})");
        files.insert(
            Kind::Kernel,
            write(
                &dir.join(Kind::Kernel.file_name()),
                &filler(&label("Linux kernel"), KERNEL_BYTES),
            )?,
        );
        files.insert(
            Kind::Initramfs,
            write(
                &dir.join(Kind::Initramfs.file_name()),
                &filler(&label("Talos initramfs"), INITRAMFS_BYTES),
            )?,
        );
        let cmdline = cmdline_for(inv, &id);
        files.insert(
            Kind::Cmdline,
            write(&dir.join(Kind::Cmdline.file_name()), cmdline.as_bytes())?,
        );
        if need.boots.contains(&artifacts::Boot::SecureBootUki) {
            let mut rec = write(
                &dir.join(Kind::SecureBootUki.file_name()),
                &filler(&label("signed Talos UKI"), KERNEL_BYTES + INITRAMFS_BYTES),
            )?;
            rec.uki = Some(sim_uki_record(&id, inv, now_unix));
            files.insert(Kind::SecureBootUki, rec);
        }
        catalog.upsert(Entry {
            id,
            source: "talboot demo (simulated)".into(),
            pulled_at: now_unix,
            files,
            origin: Default::default(),
        });
    }
    catalog.save(images).map_err(|e| AssetError {
        path: images.to_owned(),
        cause: e.to_string(),
    })
}

/// The `.pcrpkey` fingerprint (Talos's format) of the simulated boot sets' signed UKI; the
/// Talos doubles of secure-boot machines report it in `SecurityState`, as a node that booted
/// that UKI would.
pub(crate) fn sim_pcr_key() -> String {
    crate::provision::secure_boot::talos_fingerprint(
        &Sha256::digest(b"talboot demo boot set .pcrpkey").into(),
    )
}

/// What a pull would have recorded of the simulated signed UKI (the stand-in file is no PE,
/// so the facts are written, not read).
fn sim_uki_record(id: &SetId, inv: &Inventory, now_unix: u64) -> artifacts::UkiRecord {
    let fingerprint = |what: &[u8]| {
        crate::provision::secure_boot::talos_fingerprint(&Sha256::digest(what).into())
    };
    artifacts::UkiRecord {
        facts: artifacts::uki::UkiFacts {
            arch: id.arch.clone(),
            sections: [".osrel", ".cmdline", ".linux", ".initrd", ".pcrpkey"]
                .map(str::to_owned)
                .to_vec(),
            signer: Some(artifacts::uki::Signer {
                subject: "CN=talboot simulation UKI signing key".into(),
                sha256_fingerprint: fingerprint(b"talboot simulation signing certificate"),
            }),
            pcr_key_fingerprint: Some(sim_pcr_key()),
            version: Some(inv.cluster.talos_version.value.to_string()),
        },
        source: "talboot demo (simulated)".into(),
        at: now_unix,
        origin: Default::default(),
    }
}

fn cmdline_for(inv: &Inventory, id: &SetId) -> String {
    let arch = inv
        .nodes
        .iter()
        .map(|n| inv.arch_of(n))
        .find(|a| a.as_str() == id.arch)
        .unwrap_or(inv.boot.default_arch);
    artifacts::cmdline::default_cmdline(&inv.cluster.talos_version.value, arch).join(" ")
}

/// Writes stand-ins for the iPXE binaries into `dir` (the simulation's TFTP root).
pub(crate) fn write_ipxe_binaries(dir: &Path) -> Result<(), AssetError> {
    for name in IPXE_BINARIES {
        write(
            &dir.join(name),
            &filler(
                &format!("talboot simulation: not a real {name}"),
                IPXE_BYTES,
            ),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_is_deterministic_sized_and_labelled() {
        let a = filler("x", 1001);
        assert_eq!(a.len(), 1001);
        assert_eq!(a, filler("x", 1001));
        assert_ne!(a, filler("y", 1001));
        assert!(a.starts_with(b"x\n"));
    }

    #[test]
    fn written_sets_pass_the_same_verification_serve_does() {
        let dir = tempfile::tempdir().unwrap();
        let inv_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
        let inv = crate::inventory::load(&inv_path).unwrap().inventory;
        write_boot_sets(dir.path(), &inv, 1).unwrap();
        let catalog = Catalog::load(dir.path()).unwrap();
        for id in crate::artifacts::required_sets(&inv) {
            artifacts::verify(dir.path(), &catalog, &id).unwrap();
        }
        write_ipxe_binaries(&dir.path().join("tftp")).unwrap();
        assert!(
            crate::tftp::missing_ipxe_binaries(&dir.path().join("tftp"), IPXE_BINARIES).is_empty()
        );
    }
}
