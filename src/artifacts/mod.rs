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
//!
//! A set also holds, when a node boots one, the unified kernel images (`uki.efi`,
//! `secureboot-uki.efi`), each recorded with what its PE says ([`uki::UkiFacts`]: signer,
//! `.pcrpkey` fingerprint) and where it came from. A set may hold only a UKI (a Secure Boot
//! ISO has no separate kernel): what a set can boot is [`Entry::boots`], and the checks ask
//! for what a node needs ([`Boot`], [`requirements`], [`verify_for`]).

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

    /// Every kind a set may hold.
    pub const EVERY: [Kind; 5] = [
        Kind::Kernel,
        Kind::Initramfs,
        Kind::Cmdline,
        Kind::Uki,
        Kind::SecureBootUki,
    ];

    /// The kind stored under `name` in a set's folder.
    pub fn from_file_name(name: &str) -> Option<Kind> {
        Kind::EVERY.into_iter().find(|k| k.file_name() == name)
    }

    /// Whether this is one of the UKIs (recorded with their [`UkiRecord`]).
    pub fn is_uki(self) -> bool {
        matches!(self, Kind::Uki | Kind::SecureBootUki)
    }

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

/// A way a node boots from a set, and so which of its files it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Boot {
    /// iPXE loads kernel, initramfs and command line ([`Kind::ALL`]).
    Pxe,
    /// UEFI HTTP Boot of the unsigned UKI, without Secure Boot.
    Uki,
    /// The signed UKI, for `secureBoot: true` nodes.
    SecureBootUki,
}

impl Boot {
    /// Every way, in the order `images list` shows them.
    pub const ALL: [Boot; 3] = [Boot::Pxe, Boot::Uki, Boot::SecureBootUki];

    /// The files this way needs.
    pub fn kinds(self) -> &'static [Kind] {
        match self {
            Boot::Pxe => &Kind::ALL,
            Boot::Uki => &[Kind::Uki],
            Boot::SecureBootUki => &[Kind::SecureBootUki],
        }
    }

    /// The name `--boot` takes and `images list` shows.
    pub fn name(self) -> &'static str {
        match self {
            Boot::Pxe => "pxe",
            Boot::Uki => "uki",
            Boot::SecureBootUki => "secureboot-uki",
        }
    }

    /// The way named `name` ([`Boot::name`]).
    pub fn parse(name: &str) -> Option<Boot> {
        Boot::ALL.into_iter().find(|b| b.name() == name)
    }
}

impl std::fmt::Display for Boot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
    /// For a UKI: what its PE says and where it came from (absent for the other files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uki: Option<UkiRecord>,
}

/// What the catalog keeps about a UKI beyond its size and digest. Each UKI carries its own
/// origin: it may come from elsewhere than the set's kernel and initramfs (pulled beside an
/// imported set, or read out of a Secure Boot ISO).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UkiRecord {
    /// What its PE says: signer, `.pcrpkey` fingerprint, sections.
    pub facts: uki::UkiFacts,
    /// The factory URL it was pulled from, or the ISO it was read out of.
    pub source: String,
    /// Unix time of the pull or import.
    pub at: u64,
    /// Pulled, or read out of an ISO.
    pub origin: Origin,
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
    /// A UKI read out of a Talos ISO that boots one with systemd-boot (the Secure Boot ISO)
    /// by `talboot images import --iso`.
    IsoUki {
        /// The ISO file.
        iso: PathBuf,
        /// The UKI's path inside the ISO (`/EFI/Linux/Talos-<version>.efi`).
        uki: String,
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
    /// Pulled or imported (and from which files): the origin of the kernel, initramfs and
    /// command line, or of the first UKI in a set without them.
    #[serde(default, skip_serializing_if = "Origin::is_pulled")]
    pub origin: Origin,
}

impl Entry {
    /// The ways this set can boot a node: those whose files are all recorded.
    pub fn boots(&self) -> Vec<Boot> {
        Boot::ALL
            .into_iter()
            .filter(|b| self.can_boot(*b))
            .collect()
    }

    /// Whether every file `boot` needs is recorded.
    pub fn can_boot(&self, boot: Boot) -> bool {
        boot.kinds().iter().all(|k| self.files.contains_key(k))
    }

    /// What the PE of the set's UKI of `kind` says (signer, `.pcrpkey` fingerprint), as
    /// recorded when it was pulled or imported; `None` when the set has no such UKI.
    pub fn uki_facts(&self, kind: Kind) -> Option<&uki::UkiFacts> {
        self.files.get(&kind)?.uki.as_ref().map(|r| &r.facts)
    }

    /// Where the file of `kind` came from: its own origin for a UKI, else the set's.
    pub fn origin_of(&self, kind: Kind) -> &Origin {
        self.files
            .get(&kind)
            .and_then(|r| r.uki.as_ref())
            .map_or(&self.origin, |u| &u.origin)
    }
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
    /// The set is there but lacks a file a node boots from.
    #[error("{id} has no {} ({}), which {} boot needs; {fix}", kind.file_name(), import::what(*kind), boot)]
    Incomplete {
        /// The set (boxed: a large variant).
        id: Box<SetId>,
        /// How the node boots.
        boot: Boot,
        /// The missing file.
        kind: Kind,
        /// How to get it.
        fix: String,
    },
    /// A downloaded UKI that cannot fill its slot; nothing was written.
    #[error(
        "{url}: {problem}; it was not kept and the catalog is unchanged (check the factory URL and schematic, then pull again)"
    )]
    BadUki {
        /// What was fetched.
        url: String,
        /// What is wrong with it.
        problem: UkiProblem,
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

/// Why a UKI file is not taken: it does not read as one, or it does not fit its slot.
#[derive(Debug, thiserror::Error)]
pub enum UkiProblem {
    /// Not a readable UKI.
    #[error("the file {0}")]
    Unreadable(#[from] uki::UkiError),
    /// Readable, but not for this slot.
    #[error("the file {0}")]
    Refused(#[from] uki::Refusal),
}

/// Read the UKI at `path` and check it may fill `kind` of a set of `arch` (signed for
/// [`Kind::SecureBootUki`]).
pub fn check_uki(path: &Path, kind: Kind, arch: &str) -> Result<uki::UkiFacts, UkiProblem> {
    let facts = uki::inspect_file(path)?;
    uki::check(&facts, kind == Kind::SecureBootUki, arch)?;
    Ok(facts)
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

/// A boot set the inventory asks for, and the ways its nodes boot from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The set.
    pub id: SetId,
    /// How the nodes of that architecture boot: [`Boot::SecureBootUki`] for `secureBoot: true`
    /// nodes, [`Boot::Pxe`] for the others and for discovery of unknown machines.
    pub boots: std::collections::BTreeSet<Boot>,
}

/// Every boot set the inventory can ask for, with what each must hold: each node's
/// architecture, plus the default architecture when unknown machines are booted for discovery.
pub fn requirements(inv: &crate::inventory::Inventory) -> Vec<Requirement> {
    let talos = &inv.cluster.talos_version.value;
    let schematic = inv.cluster.installer.schematic_id();
    let mut needs: BTreeMap<crate::inventory::Arch, std::collections::BTreeSet<Boot>> =
        BTreeMap::new();
    for n in &inv.nodes {
        let boot = if n.secure_boot() {
            Boot::SecureBootUki
        } else {
            Boot::Pxe
        };
        needs.entry(inv.arch_of(n)).or_default().insert(boot);
    }
    if inv.boot.unknown_machines == crate::inventory::UnknownPolicy::Discover {
        needs
            .entry(inv.boot.default_arch)
            .or_default()
            .insert(Boot::Pxe);
    }
    needs
        .into_iter()
        .map(|(a, boots)| Requirement {
            id: SetId::new(talos, schematic, a),
            boots,
        })
        .collect()
}

/// The sets of [`requirements`], without what they must hold.
pub fn required_sets(inv: &crate::inventory::Inventory) -> Vec<SetId> {
    requirements(inv).into_iter().map(|r| r.id).collect()
}

/// The command an operator runs to (re)fetch a set.
pub(crate) fn pull_command(id: &SetId) -> String {
    format!(
        "talboot images pull --talos {} --schematic {} --arch {}",
        id.talos, id.schematic, id.arch
    )
}

/// The command that (re)fetches the files `boot` needs of set `id`.
pub(crate) fn pull_command_for(id: &SetId, boot: Boot) -> String {
    match boot {
        Boot::Pxe => pull_command(id),
        b => format!("{} --boot {b}", pull_command(id)),
    }
}

/// How to get a good copy of `kind` back, from where it came from.
fn fix_for(id: &SetId, kind: Kind, origin: &Origin) -> String {
    let boot = match kind {
        Kind::Uki => Boot::Uki,
        Kind::SecureBootUki => Boot::SecureBootUki,
        _ => Boot::Pxe,
    };
    match origin {
        Origin::Pulled => format!("pull it again: {}", pull_command_for(id, boot)),
        Origin::Imported { .. } | Origin::Iso { .. } | Origin::IsoUki { .. } => {
            format!("import it again: {}", import::import_command(id, origin))
        }
    }
}

/// Check that the set `id` has every file a PXE boot needs, each with its recorded size and
/// digest (what `serve` needs of a set before [`verify_for`] knew other ways to boot).
pub fn verify(dir: &Path, catalog: &Catalog, id: &SetId) -> Result<(), ArtifactError> {
    verify_for(dir, catalog, id, [Boot::Pxe])
}

/// Check that the set `id` has every file the ways `boots` need, each with its recorded size
/// and digest.
pub fn verify_for(
    dir: &Path,
    catalog: &Catalog,
    id: &SetId,
    boots: impl IntoIterator<Item = Boot>,
) -> Result<(), ArtifactError> {
    let entry = find_entry(dir, catalog, id)?;
    for boot in boots {
        for &kind in boot.kinds() {
            if !entry.files.contains_key(&kind) {
                let fix = match boot {
                    Boot::SecureBootUki => format!(
                        "run: {} (or import a Secure Boot ISO with --iso)",
                        pull_command_for(id, boot)
                    ),
                    _ => format!("run: {}", pull_command_for(id, boot)),
                };
                return Err(ArtifactError::Incomplete {
                    id: Box::new(id.clone()),
                    boot,
                    kind,
                    fix,
                });
            }
            verify_file(dir, entry, kind)?;
        }
    }
    Ok(())
}

/// Check every file the set `id` records, whatever it boots; returns the ways it can boot.
pub fn verify_recorded(
    dir: &Path,
    catalog: &Catalog,
    id: &SetId,
) -> Result<Vec<Boot>, ArtifactError> {
    let entry = find_entry(dir, catalog, id)?;
    for &kind in entry.files.keys() {
        verify_file(dir, entry, kind)?;
    }
    Ok(entry.boots())
}

fn find_entry<'c>(
    dir: &Path,
    catalog: &'c Catalog,
    id: &SetId,
) -> Result<&'c Entry, ArtifactError> {
    catalog.find(id).ok_or_else(|| ArtifactError::Missing {
        id: id.clone(),
        dir: dir.to_path_buf(),
    })
}

/// The entry after writing `new`'s files into a set `old` already records: `old`'s other
/// files stay. The set's own origin is the new one when the PXE files were written (or the
/// set is new), else the old one (a UKI carries its own).
pub(crate) fn merge(old: Option<&Entry>, mut new: Entry) -> Entry {
    let Some(old) = old else {
        return new;
    };
    let wrote_pxe = Kind::ALL.iter().any(|k| new.files.contains_key(k));
    let had_pxe = Kind::ALL.iter().any(|k| old.files.contains_key(k));
    for (kind, rec) in &old.files {
        new.files.entry(*kind).or_insert_with(|| rec.clone());
    }
    if !wrote_pxe && had_pxe {
        new.source = old.source.clone();
        new.pulled_at = old.pulled_at;
        new.origin = old.origin.clone();
    }
    new
}

/// The recorded file `kind` of `entry` is there with its size and digest.
pub(crate) fn verify_file(dir: &Path, entry: &Entry, kind: Kind) -> Result<(), ArtifactError> {
    let id = &entry.id;
    let path = dir.join(id.rel_dir()).join(kind.file_name());
    let damaged = |problem: String| ArtifactError::Damaged {
        id: Box::new(id.clone()),
        path: path.clone(),
        problem,
        fix: fix_for(id, kind, entry.origin_of(kind)),
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
#[path = "tests.rs"]
mod tests;
