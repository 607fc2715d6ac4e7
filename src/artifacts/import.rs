//! `images import`: registering a boot set from local files (a USB stick at an air-gapped
//! site) into the same cache and catalog `images pull` fills, so `serve`, `check` and
//! `images verify` treat it exactly like a pulled set.
//!
//! Each source is read twice: once to validate and hash it (nothing is written if any file is
//! bad, or if the set is already there with the same bytes), then again while copying it to a
//! temporary file beside its final place, whose digest must match the first pass (a file that
//! changed in between is refused). Only when all three copies are complete and fsynced are they
//! renamed into place and the catalog saved, so an error while reading or copying leaves the
//! cache as it was. A UKI ([`import_uki`], read out of a Secure Boot ISO) goes the same way,
//! alone, after its PE has been read ([`super::check_uki`]); files of the set that are not
//! being imported stay as the catalog has them. (The three renames are not one atomic step: should one of them fail, the
//! files no longer match the catalog and `images verify` and `serve` say so.) Whether to write
//! at all is the pure [`decide`].

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{
    ArtifactError, Catalog, Compression, Entry, FileRecord, Kind, Origin, SetId, UkiProblem,
    UkiRecord,
};

/// Where the kernel command line comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmdlineSource {
    /// A file holding it (the factory's `cmdline-metal-<arch>`).
    File(PathBuf),
    /// Given on the command line.
    Inline(String),
}

/// What to import.
#[derive(Debug, Clone)]
pub struct ImportRequest {
    /// The set to register the files as.
    pub id: SetId,
    /// The kernel file.
    pub kernel: PathBuf,
    /// The initramfs file, any name and any compression the kernel unpacks.
    pub initramfs: PathBuf,
    /// The kernel command line.
    pub cmdline: CmdlineSource,
    /// Replace a set that is already there with different files.
    pub force: bool,
    /// Where the files really came from when they were copied out of an ISO first (the
    /// request's paths are then scratch copies); `None` records the request's paths.
    pub iso: Option<IsoSource>,
}

/// A UKI to import into a set's UKI slot.
#[derive(Debug, Clone)]
pub struct UkiImportRequest {
    /// The set.
    pub id: SetId,
    /// The UKI file (a scratch copy when read out of an ISO).
    pub uki: PathBuf,
    /// The slot: [`Kind::SecureBootUki`] (must be signed) or [`Kind::Uki`].
    pub kind: Kind,
    /// Replace a UKI that is already there with a different one.
    pub force: bool,
    /// Where it came from, for the catalog: the ISO and the UKI's path inside it.
    pub origin: Origin,
}

/// The ISO an import's files were read from, for the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoSource {
    /// The ISO file.
    pub iso: PathBuf,
    /// The kernel's path inside it.
    pub kernel: String,
    /// The initramfs's path inside it.
    pub initramfs: String,
}

/// What [`import`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The set was new and is now in the cache.
    Imported,
    /// The set was there with the same bytes; nothing was written.
    Unchanged,
    /// The set was there with the same digests but damaged files, which were rewritten.
    Repaired,
    /// The set was there with these files different, and `--force` replaced it.
    Replaced(Vec<Kind>),
}

/// Whether to write, from what the catalog holds and what is being imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Copy the files in (the outcome it will be).
    Write(Outcome),
    /// Nothing to do.
    Unchanged,
    /// Refused: these files differ from the recorded set and `--force` was not given.
    Conflict(Vec<Kind>),
}

/// Decide what an import does. `store_intact` says whether the recorded set's files verify.
pub fn decide(
    existing: Option<&BTreeMap<Kind, FileRecord>>,
    incoming: &BTreeMap<Kind, FileRecord>,
    store_intact: bool,
    force: bool,
) -> Decision {
    let Some(existing) = existing else {
        return Decision::Write(Outcome::Imported);
    };
    let differing: Vec<Kind> = incoming
        .keys()
        .copied()
        .filter(|k| {
            let (a, b) = (existing.get(k), incoming.get(k));
            a.map(|r| (r.size, &r.sha256)) != b.map(|r| (r.size, &r.sha256))
        })
        .collect();
    match (differing.is_empty(), store_intact, force) {
        (true, true, _) => Decision::Unchanged,
        (true, false, _) => Decision::Write(Outcome::Repaired),
        (false, _, true) => Decision::Write(Outcome::Replaced(differing)),
        (false, _, false) => Decision::Conflict(differing),
    }
}

/// Why an import was refused or failed; each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A source file cannot be read.
    #[error("cannot read the {what} {}: {source}; check the path (and that the stick is mounted)", path.display())]
    Read {
        /// Which file of the set.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A source file is empty.
    #[error("the {what} {} is empty; copy it again from a good source", path.display())]
    Empty {
        /// Which file of the set.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The initramfs is nothing the kernel unpacks.
    #[error("{} is not an initramfs the kernel can unpack (it starts with {head}); give the Talos initramfs (xz, zstd, gzip, lz4, bzip2, lzma, lzo, or an uncompressed newc cpio)", path.display())]
    NotInitramfs {
        /// The file.
        path: PathBuf,
        /// Its first bytes, in hex.
        head: String,
    },
    /// The command line is not one line of text.
    #[error(
        "the kernel command line {origin} {problem}; give the factory's cmdline-metal-<arch> file or the line itself with --cmdline"
    )]
    Cmdline {
        /// The file, or `--cmdline`.
        origin: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A source changed between hashing and copying.
    #[error("the {what} {} changed while it was being imported; make sure nothing is writing it and run the import again", path.display())]
    Changed {
        /// Which file of the set.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The set is there with different files.
    #[error("{id} is already in {} with a different {}; to replace it run the same command with --force (or import under another version/schematic)", dir.display(), names(kinds))]
    Conflict {
        /// The set.
        id: SetId,
        /// The images directory.
        dir: PathBuf,
        /// Which files differ.
        kinds: Vec<Kind>,
    },
    /// A UKI that cannot fill its slot.
    #[error("cannot import {}: {problem}", path.display())]
    Uki {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: UkiProblem,
    },
    /// Writing into the cache failed.
    #[error(transparent)]
    Store(#[from] ArtifactError),
}

fn names(kinds: &[Kind]) -> String {
    kinds
        .iter()
        .map(|k| what(*k))
        .collect::<Vec<_>>()
        .join(" and ")
}

pub(crate) fn what(kind: Kind) -> &'static str {
    match kind {
        Kind::Kernel => "kernel",
        Kind::Initramfs => "initramfs",
        Kind::Cmdline => "command line",
        Kind::Uki => "UKI",
        Kind::SecureBootUki => "Secure Boot UKI",
    }
}

/// The command that imports the set again from where it came from (for damage reports).
pub(crate) fn import_command(id: &SetId, origin: &Origin) -> String {
    let mut cmd = format!(
        "talboot images import --talos {} --schematic {} --arch {}",
        id.talos, id.schematic, id.arch
    );
    if let Origin::Iso { iso, .. } | Origin::IsoUki { iso, .. } = origin {
        cmd.push_str(&format!(" --iso {} --force", iso.display()));
    }
    if let Origin::Imported {
        kernel,
        initramfs,
        cmdline,
    } = origin
    {
        cmd.push_str(&format!(
            " --kernel {} --initramfs {}",
            kernel.display(),
            initramfs.display()
        ));
        if cmdline == INLINE {
            cmd.push_str(" --cmdline TEXT --force");
        } else {
            cmd.push_str(&format!(" --cmdline-file {cmdline} --force"));
        }
    }
    cmd
}

/// What [`Origin::Imported::cmdline`] holds when the line was given with `--cmdline`.
pub(crate) const INLINE: &str = "--cmdline";

/// Opens a source file; a parameter so tests can make a source fail or change mid-import.
pub(crate) type Opener<'a> = &'a dyn Fn(&Path) -> std::io::Result<Box<dyn Read>>;

fn open_file(path: &Path) -> std::io::Result<Box<dyn Read>> {
    Ok(Box::new(std::fs::File::open(path)?))
}

/// Import a set from local files (see the module doc). `now_unix` is recorded as its time.
pub fn import(
    dir: &Path,
    req: &ImportRequest,
    now_unix: u64,
) -> Result<(Entry, Outcome), ImportError> {
    import_with(dir, req, now_unix, &open_file)
}

/// One source: where it is read from (a path, or the inline command line).
enum Source<'a> {
    Path(&'a Path),
    Bytes(Vec<u8>),
}

impl Source<'_> {
    fn open(&self, open: Opener<'_>) -> std::io::Result<Box<dyn Read + '_>> {
        match self {
            Source::Path(p) => open(p),
            Source::Bytes(b) => Ok(Box::new(b.as_slice())),
        }
    }

    fn path(&self) -> PathBuf {
        match self {
            Source::Path(p) => p.to_path_buf(),
            Source::Bytes(_) => PathBuf::from(INLINE),
        }
    }
}

/// The request's three sources, in the order they are checked and copied. An inline command
/// line is stored as a file would hold it: trimmed, with one line end.
fn sources(req: &ImportRequest) -> [(Kind, Source<'_>); 3] {
    [
        (Kind::Kernel, Source::Path(&req.kernel)),
        (Kind::Initramfs, Source::Path(&req.initramfs)),
        (
            Kind::Cmdline,
            match &req.cmdline {
                CmdlineSource::File(p) => Source::Path(p),
                CmdlineSource::Inline(s) => Source::Bytes(format!("{}\n", s.trim()).into_bytes()),
            },
        ),
    ]
}

/// An I/O error on `path`, as the artifact cache reports it.
fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ArtifactError {
    let path = path.to_path_buf();
    move |source| ArtifactError::Io { path, source }
}

/// [`import`] with the way sources are opened given.
pub(crate) fn import_with(
    dir: &Path,
    req: &ImportRequest,
    now_unix: u64,
    open: Opener<'_>,
) -> Result<(Entry, Outcome), ImportError> {
    let (source, origin) = origin(req);
    let plan = Plan {
        id: &req.id,
        sources: sources(req).into(),
        force: req.force,
        source,
        origin,
        uki: None,
    };
    import_plan(dir, plan, now_unix, open)
}

/// Import a UKI into its slot of a set (see the module doc). Refused, with nothing written,
/// when it is not a UKI for the set's architecture, or unsigned for the Secure Boot slot.
pub fn import_uki(
    dir: &Path,
    req: &UkiImportRequest,
    now_unix: u64,
) -> Result<(Entry, Outcome), ImportError> {
    let facts =
        super::check_uki(&req.uki, req.kind, &req.id.arch).map_err(|problem| ImportError::Uki {
            path: req.uki.clone(),
            problem,
        })?;
    let source = match &req.origin {
        Origin::IsoUki { iso, .. } | Origin::Iso { iso, .. } => iso.display().to_string(),
        _ => req.uki.display().to_string(),
    };
    let plan = Plan {
        id: &req.id,
        sources: vec![(req.kind, Source::Path(&req.uki))],
        force: req.force,
        source,
        origin: req.origin.clone(),
        uki: Some(facts),
    };
    import_plan(dir, plan, now_unix, &open_file)
}

/// What one import writes: files of one set, and the catalog's record of where they came from.
struct Plan<'a> {
    id: &'a SetId,
    sources: Vec<(Kind, Source<'a>)>,
    force: bool,
    /// The entry's `source` and `origin` (a UKI's own, too).
    source: String,
    origin: Origin,
    /// What the UKI among the sources says, read before.
    uki: Option<super::uki::UkiFacts>,
}

fn import_plan(
    dir: &Path,
    plan: Plan<'_>,
    now_unix: u64,
    open: Opener<'_>,
) -> Result<(Entry, Outcome), ImportError> {
    // Pass 1: validate and hash; nothing is written yet.
    let mut incoming = BTreeMap::new();
    for (kind, src) in &plan.sources {
        let rec = hash_and_check(*kind, src, open)?;
        incoming.insert(*kind, rec);
    }

    let mut catalog = Catalog::load(dir)?;
    let existing = catalog.find(plan.id);
    // Only the files being imported are compared: a set holding just a UKI takes a kernel
    // and initramfs without --force, and the other way round.
    let holding = existing.filter(|e| incoming.keys().any(|k| e.files.contains_key(k)));
    let intact = holding.is_some_and(|e| {
        incoming
            .keys()
            .all(|k| super::verify_file(dir, e, *k).is_ok())
    });
    let outcome = match decide(holding.map(|e| &e.files), &incoming, intact, plan.force) {
        Decision::Unchanged => {
            let entry = existing.cloned().expect("unchanged implies an entry");
            return Ok((entry, Outcome::Unchanged));
        }
        Decision::Conflict(kinds) => {
            return Err(ImportError::Conflict {
                id: plan.id.clone(),
                dir: dir.to_path_buf(),
                kinds,
            });
        }
        Decision::Write(outcome) => outcome,
    };

    write_set(&dir.join(plan.id.rel_dir()), &plan.sources, &incoming, open)?;
    for (kind, rec) in incoming.iter_mut() {
        if kind.is_uki() {
            rec.uki = plan.uki.clone().map(|facts| UkiRecord {
                facts,
                source: plan.source.clone(),
                at: now_unix,
                origin: plan.origin.clone(),
            });
        }
    }
    let entry = super::merge(
        existing,
        Entry {
            id: plan.id.clone(),
            source: plan.source,
            pulled_at: now_unix,
            files: incoming,
            origin: plan.origin,
        },
    );
    catalog.upsert(entry.clone());
    catalog.save(dir)?;
    tracing::info!(set = %plan.id, ?outcome, "imported");
    Ok((entry, outcome))
}

/// Pass 2: copies every source beside its final place in `set_dir`, checking each copy is
/// what pass 1 validated (`incoming`), and renames them into place only once all are
/// complete, so a failed read or copy leaves the cache as it was.
fn write_set(
    set_dir: &Path,
    sources: &[(Kind, Source<'_>)],
    incoming: &BTreeMap<Kind, FileRecord>,
    open: Opener<'_>,
) -> Result<(), ImportError> {
    std::fs::create_dir_all(set_dir).map_err(io_err(set_dir))?;
    let mut staged = Vec::new();
    for (kind, src) in sources {
        let tmp = copy_to_temp(*kind, src, set_dir, &incoming[kind], open)?;
        staged.push((*kind, tmp));
    }
    for (kind, tmp) in staged {
        let target = set_dir.join(kind.file_name());
        tmp.persist(&target).map_err(|e| io_err(&target)(e.error))?;
    }
    std::fs::File::open(set_dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(set_dir))?;
    Ok(())
}

/// Where the catalog says the set came from: the ISO when the files were copied out of one,
/// else the paths the operator gave (and how the command line was given).
fn origin(req: &ImportRequest) -> (String, Origin) {
    match &req.iso {
        Some(iso) => (
            iso.iso.display().to_string(),
            Origin::Iso {
                iso: iso.iso.clone(),
                kernel: iso.kernel.clone(),
                initramfs: iso.initramfs.clone(),
            },
        ),
        None => (
            req.initramfs.display().to_string(),
            Origin::Imported {
                kernel: req.kernel.clone(),
                initramfs: req.initramfs.clone(),
                cmdline: match &req.cmdline {
                    CmdlineSource::File(p) => p.display().to_string(),
                    CmdlineSource::Inline(_) => INLINE.to_string(),
                },
            },
        ),
    }
}

fn read_err(kind: Kind, src: &Source<'_>) -> impl FnOnce(std::io::Error) -> ImportError {
    let path = src.path();
    move |source| ImportError::Read {
        what: what(kind),
        path,
        source,
    }
}

/// Pass 1 for one file: hash it and check it is plausible for its kind.
fn hash_and_check(
    kind: Kind,
    src: &Source<'_>,
    open: Opener<'_>,
) -> Result<FileRecord, ImportError> {
    let mut r = src.open(open).map_err(read_err(kind, src))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut head = Vec::new();
    let mut size = 0u64;
    // The whole command line is kept to check it; it is small (refused past 64 KiB).
    let mut text = Vec::new();
    loop {
        let n = r.read(&mut buf).map_err(read_err(kind, src))?;
        if n == 0 {
            break;
        }
        if head.len() < 8 {
            head.extend(&buf[..n.min(8 - head.len())]);
        }
        if kind == Kind::Cmdline {
            text.extend(&buf[..n]);
            if text.len() > 1 << 16 {
                return Err(cmdline_err(src, "is longer than 64 KiB"));
            }
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    if size == 0 {
        return Err(match kind {
            Kind::Cmdline => cmdline_err(src, "is empty"),
            _ => ImportError::Empty {
                what: what(kind),
                path: src.path(),
            },
        });
    }
    let mut compression = None;
    match kind {
        Kind::Initramfs => match Compression::detect(&head) {
            Some(c) => compression = Some(c),
            None => {
                return Err(ImportError::NotInitramfs {
                    path: src.path(),
                    head: super::hex(&head),
                });
            }
        },
        Kind::Cmdline => {
            let Ok(s) = std::str::from_utf8(&text) else {
                return Err(cmdline_err(src, "is not UTF-8 text"));
            };
            if s.trim().is_empty() {
                return Err(cmdline_err(src, "is empty"));
            }
            if s.trim_end().contains('\n') {
                return Err(cmdline_err(src, "has more than one line"));
            }
        }
        // A UKI's PE signature is read where it is imported (`images import --iso`).
        Kind::Kernel | Kind::Uki | Kind::SecureBootUki => {}
    }
    Ok(FileRecord {
        size,
        sha256: super::hex(&hasher.finalize()),
        compression,
        uki: None,
    })
}

fn cmdline_err(src: &Source<'_>, problem: &'static str) -> ImportError {
    ImportError::Cmdline {
        origin: match src {
            Source::Path(p) => p.display().to_string(),
            Source::Bytes(_) => "given with --cmdline".into(),
        },
        problem,
    }
}

/// Pass 2 for one file: copy it to a temporary file in `set_dir` and check its digest. The
/// temporary file is deleted when dropped, so an error here leaves nothing behind.
fn copy_to_temp(
    kind: Kind,
    src: &Source<'_>,
    set_dir: &Path,
    expect: &FileRecord,
    open: Opener<'_>,
) -> Result<tempfile::NamedTempFile, ImportError> {
    let io = |source| {
        ImportError::Store(ArtifactError::Io {
            path: set_dir.to_path_buf(),
            source,
        })
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".import-")
        .suffix(".tmp")
        .tempfile_in(set_dir)
        .map_err(io)?;
    let mut r = src.open(open).map_err(read_err(kind, src))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = r.read(&mut buf).map_err(read_err(kind, src))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(io)?;
        size += n as u64;
    }
    if size != expect.size || super::hex(&hasher.finalize()) != expect.sha256 {
        return Err(ImportError::Changed {
            what: what(kind),
            path: src.path(),
        });
    }
    tmp.as_file().sync_all().map_err(io)?;
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io)?;
    }
    Ok(tmp)
}

#[cfg(test)]
#[path = "import_tests.rs"]
mod tests;
