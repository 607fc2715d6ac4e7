//! The boot artifact cache under `images/`: Talos kernels, initramfs images and kernel command
//! lines per Talos version, Image Factory schematic and architecture, each recorded in a catalog
//! with its size and SHA-256 so `serve` can refuse to boot machines from missing or damaged
//! files.
//!
//! Layout: `images/<version>/<schematic>/<arch>/{kernel,initramfs.xz,cmdline}` and
//! `images/catalog.json`. The Image Factory publishes no digests, so the digest recorded at pull
//! time is the reference from then on (trust on first use; pull over HTTPS). Sets can also be
//! imported from local files ([`import`]) for sites without internet; the catalog records where
//! each set came from ([`Origin`]).
//!
//! `initramfs.xz` is the fixed name of the initramfs slot, not a claim about its compression:
//! the kernel finds the compression from the file's magic bytes ([`compression`]), so an
//! imported gzip or zstd initramfs is stored and served byte for byte under the same name.

pub mod cmdline;
pub mod compression;
pub mod factory;
pub mod import;
pub mod iso;
pub mod uki;

pub use compression::Compression;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::inventory::{Arch, Version};

/// File name of the catalog inside the images directory.
pub(crate) const CATALOG_FILE: &str = "catalog.json";

/// The three files of a boot set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The Linux kernel (`kernel-<arch>` at the factory).
    Kernel,
    /// The Talos initramfs (`initramfs-<arch>.xz`).
    Initramfs,
    /// The kernel command line the factory generates for metal (`cmdline-metal-<arch>`).
    Cmdline,
    /// The unified kernel image (kernel, initramfs and command line sealed in one EFI
    /// binary), unsigned (`metal-<arch>-uki.efi`): UEFI HTTP Boot without Secure Boot.
    Uki,
    /// The UKI signed for Secure Boot (`metal-<arch>-secureboot-uki.efi`): the only thing a
    /// `secureBoot: true` node is offered.
    SecureBootUki,
}

impl Kind {
    /// The kinds of a PXE boot set, in download order (the UKIs are fetched only for nodes
    /// that boot them).
    pub const ALL: [Kind; 3] = [Kind::Kernel, Kind::Initramfs, Kind::Cmdline];

    /// File name inside a boot set's folder.
    pub fn file_name(self) -> &'static str {
        match self {
            Kind::Kernel => "kernel",
            Kind::Initramfs => "initramfs.xz",
            Kind::Cmdline => "cmdline",
            Kind::Uki => "uki.efi",
            Kind::SecureBootUki => "secureboot-uki.efi",
        }
    }
}

/// Identifies one boot set.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SetId {
    /// Talos version with its `v`, e.g. `v1.13.9`.
    pub talos: String,
    /// Image Factory schematic ID.
    pub schematic: String,
    /// `amd64` or `arm64`.
    pub arch: String,
}

impl SetId {
    /// Build from typed values.
    pub fn new(talos: &Version, schematic: &str, arch: Arch) -> Self {
        Self {
            talos: talos.to_string(),
            schematic: schematic.to_string(),
            arch: arch.to_string(),
        }
    }

    /// The set's folder relative to the images directory.
    pub fn rel_dir(&self) -> PathBuf {
        PathBuf::from(&self.talos)
            .join(&self.schematic)
            .join(&self.arch)
    }
}

impl std::fmt::Display for SetId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Talos {} {} schematic {}",
            self.talos, self.arch, self.schematic
        )
    }
}

/// One recorded file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256.
    pub sha256: String,
    /// The initramfs's compression as detected from its magic bytes (absent for other files
    /// and in catalogs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
}

/// How a boot set came into the cache.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "lowercase")]
pub enum Origin {
    /// Downloaded from the Image Factory (or a mirror) named in [`Entry::source`]; catalogs
    /// written before imports existed hold only pulls, hence the default.
    #[default]
    Pulled,
    /// Copied from local files by `talboot images import`.
    Imported {
        /// The kernel file it was copied from.
        kernel: PathBuf,
        /// The initramfs file it was copied from.
        initramfs: PathBuf,
        /// The command line file it was copied from, or `--cmdline` when given inline.
        cmdline: String,
    },
    /// Read out of a Talos ISO by `talboot images import --iso`.
    Iso {
        /// The ISO file.
        iso: PathBuf,
        /// The kernel's path inside the ISO.
        kernel: String,
        /// The initramfs's path inside the ISO.
        initramfs: String,
    },
}

impl Origin {
    fn is_pulled(&self) -> bool {
        matches!(self, Origin::Pulled)
    }
}

/// One boot set in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Which set.
    #[serde(flatten)]
    pub id: SetId,
    /// Where it was pulled from (the factory URL), or for an import the initramfs file.
    pub source: String,
    /// Unix time of the pull or import.
    pub pulled_at: u64,
    /// The files.
    pub files: BTreeMap<Kind, FileRecord>,
    /// Pulled or imported (and from which files).
    #[serde(default, skip_serializing_if = "Origin::is_pulled")]
    pub origin: Origin,
}

/// The catalog file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// Format version of the file.
    pub version: u32,
    /// Every set pulled so far.
    pub entries: Vec<Entry>,
}

/// Problems with the cache.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The catalog could not be read or parsed.
    #[error("cannot read artifact catalog {}: {cause}", path.display())]
    Catalog {
        /// The catalog file.
        path: PathBuf,
        /// What went wrong.
        cause: String,
    },
    /// A set the inventory needs was never pulled.
    #[error("{id} is not in {}; run: {} (without internet: {} --kernel FILE --initramfs FILE --cmdline-file FILE)", dir.display(), pull_command(id), import::import_command(id, &Origin::Pulled))]
    Missing {
        /// The set.
        id: SetId,
        /// The images directory.
        dir: PathBuf,
    },
    /// A file is missing, has the wrong size, or the wrong digest.
    #[error("{} of {id} is damaged ({problem}); {fix}", path.display())]
    Damaged {
        /// The set (boxed: this is the largest variant).
        id: Box<SetId>,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
        /// How to get a good copy: pull it again, or import it again from where it came from.
        fix: String,
    },
    /// I/O error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Download failure.
    #[error("download of {url} failed: {cause}")]
    Download {
        /// What was fetched.
        url: String,
        /// Why it failed.
        cause: String,
    },
}

impl Catalog {
    /// Load `dir/catalog.json`; a missing file is an empty catalog.
    pub fn load(dir: &Path) -> Result<Self, ArtifactError> {
        let path = dir.join(CATALOG_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ArtifactError::Catalog {
                path,
                cause: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self {
                version: 1,
                entries: Vec::new(),
            }),
            Err(e) => Err(ArtifactError::Catalog {
                path,
                cause: e.to_string(),
            }),
        }
    }

    /// Write the catalog atomically (temporary file, fsync, rename).
    pub fn save(&self, dir: &Path) -> Result<(), ArtifactError> {
        let path = dir.join(CATALOG_FILE);
        let mut json = serde_json::to_vec_pretty(self).expect("catalog serializes");
        json.push(b'\n');
        crate::fsutil::write_atomic(&path, &json, 0o644).map_err(|e| ArtifactError::Io {
            path,
            source: e.source,
        })
    }

    /// The entry for `id`.
    pub fn find(&self, id: &SetId) -> Option<&Entry> {
        self.entries.iter().find(|e| &e.id == id)
    }

    /// Insert or replace the entry for its set.
    pub fn upsert(&mut self, entry: Entry) {
        self.entries.retain(|e| e.id != entry.id);
        self.entries.push(entry);
        self.entries.sort_by(|a, b| a.id.cmp(&b.id));
    }
}

/// Every boot set the inventory can ask for: each node's architecture, plus the default
/// architecture when unknown machines are booted for discovery.
pub fn required_sets(inv: &crate::inventory::Inventory) -> Vec<SetId> {
    let talos = &inv.cluster.talos_version.value;
    let schematic = inv.cluster.installer.schematic_id();
    let mut arches: Vec<crate::inventory::Arch> =
        inv.nodes.iter().map(|n| inv.arch_of(n)).collect();
    if inv.boot.unknown_machines == crate::inventory::UnknownPolicy::Discover {
        arches.push(inv.boot.default_arch);
    }
    arches.sort();
    arches.dedup();
    arches
        .into_iter()
        .map(|a| SetId::new(talos, schematic, a))
        .collect()
}

/// The command an operator runs to (re)fetch a set.
pub(crate) fn pull_command(id: &SetId) -> String {
    format!(
        "talboot images pull --talos {} --schematic {} --arch {}",
        id.talos, id.schematic, id.arch
    )
}

/// Check that every file of `id` exists with its recorded size and digest.
pub fn verify(dir: &Path, catalog: &Catalog, id: &SetId) -> Result<(), ArtifactError> {
    let entry = catalog.find(id).ok_or_else(|| ArtifactError::Missing {
        id: id.clone(),
        dir: dir.to_path_buf(),
    })?;
    let fix = match &entry.origin {
        Origin::Pulled => format!("pull it again: {}", pull_command(id)),
        Origin::Imported { .. } | Origin::Iso { .. } => format!(
            "import it again: {}",
            import::import_command(id, &entry.origin)
        ),
    };
    for kind in Kind::ALL {
        let path = dir.join(id.rel_dir()).join(kind.file_name());
        let damaged = |problem: String| ArtifactError::Damaged {
            id: Box::new(id.clone()),
            path: path.clone(),
            problem,
            fix: fix.clone(),
        };
        let Some(rec) = entry.files.get(&kind) else {
            return Err(damaged("not recorded in the catalog".into()));
        };
        let (size, digest) = match hash_file(&path) {
            Ok(v) => v,
            Err(e) => return Err(damaged(e.to_string())),
        };
        if size != rec.size {
            return Err(damaged(format!("size {size}, expected {}", rec.size)));
        }
        if digest != rec.sha256 {
            return Err(damaged(format!("sha256 {digest}, expected {}", rec.sha256)));
        }
    }
    Ok(())
}

/// Size and lowercase hex SHA-256 of a file, read in chunks.
pub fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

/// Lowercase hex of bytes (kept here for callers of `artifacts::hex`; see [`crate::hex`]).
pub use crate::hex::lower as hex;

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> SetId {
        SetId {
            talos: "v1.13.9".into(),
            schematic: "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".into(),
            arch: "amd64".into(),
        }
    }

    fn record(dir: &Path, id: &SetId) -> Catalog {
        let mut files = BTreeMap::new();
        for kind in Kind::ALL {
            let p = dir.join(id.rel_dir()).join(kind.file_name());
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, format!("{kind:?} bytes")).unwrap();
            let (size, sha256) = hash_file(&p).unwrap();
            files.insert(
                kind,
                FileRecord {
                    size,
                    sha256,
                    compression: None,
                },
            );
        }
        let mut c = Catalog::load(dir).unwrap();
        c.upsert(Entry {
            id: id.clone(),
            source: "test".into(),
            pulled_at: 0,
            files,
            origin: Origin::Pulled,
        });
        c.save(dir).unwrap();
        c
    }

    #[test]
    fn verify_accepts_intact_and_names_the_fix_for_damage() {
        let dir = tempfile::tempdir().unwrap();
        let id = set();
        let c = record(dir.path(), &id);
        assert_eq!(Catalog::load(dir.path()).unwrap(), c);
        verify(dir.path(), &c, &id).unwrap();

        let kernel = dir.path().join(id.rel_dir()).join("kernel");
        std::fs::write(&kernel, "Kernel bytez").unwrap();
        let err = verify(dir.path(), &c, &id).unwrap_err().to_string();
        assert!(err.contains("sha256"), "{err}");
        assert!(err.contains("talboot images pull --talos v1.13.9 --schematic 376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba --arch amd64"), "{err}");

        std::fs::remove_file(&kernel).unwrap();
        assert!(matches!(
            verify(dir.path(), &c, &id),
            Err(ArtifactError::Damaged { .. })
        ));
    }

    #[test]
    fn missing_set_gives_the_pull_command() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::load(dir.path()).unwrap();
        let err = verify(dir.path(), &c, &set()).unwrap_err();
        assert!(matches!(err, ArtifactError::Missing { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("run: talboot images pull --talos v1.13.9 --schematic 376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba --arch amd64 (without internet: talboot images import --talos v1.13.9"),
            "{msg}"
        );
    }

    #[test]
    fn corrupt_catalog_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CATALOG_FILE), "{not json").unwrap();
        assert!(matches!(
            Catalog::load(dir.path()),
            Err(ArtifactError::Catalog { .. })
        ));
    }
}
