//! `talboot images`: pull boot sets from the Image Factory into the artifact cache, import
//! them from local files (air-gapped sites), list them with where they came from, and verify
//! their digests.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::artifacts::{self, Boot, Catalog, SetId, factory};
use crate::inventory::{self, Arch, Version};

use super::{EXIT_INVALID, EXIT_USAGE};

/// Arguments of `talboot images`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The artifact cache.
    #[arg(long, env = "TALBOOT_IMAGES", default_value = "images", global = true)]
    pub dir: PathBuf,

    /// What to do.
    #[command(subcommand)]
    pub command: ImagesCommand,
}

/// `images` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ImagesCommand {
    /// Fetch kernel, initramfs and kernel command line (and, for the nodes that boot one, the
    /// UKI) for a Talos version, schematic and architectures (defaults from the inventory
    /// given with -c).
    Pull(PullArgs),
    /// Register a kernel, initramfs and kernel command line from local files, or the ones a
    /// Talos ISO boots (a USB stick at an air-gapped site), as the boot set of a Talos
    /// version, schematic and architecture.
    Import(ImportArgs),
    /// List the boot sets in the cache and where each came from.
    List,
    /// Check every cached file against its recorded size and SHA-256.
    Verify,
}

/// Arguments of `images pull`.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// Take version, schematic, architectures and factory URL from this inventory.
    #[arg(short = 'c', long = "config")]
    pub config: Option<PathBuf>,
    /// Talos version, e.g. v1.13.9.
    #[arg(long)]
    pub talos: Option<String>,
    /// Image Factory schematic ID (default: the inventory's, else vanilla).
    #[arg(long)]
    pub schematic: Option<String>,
    /// Architectures, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// Image Factory base URL (a mirror for air-gapped sites).
    #[arg(long)]
    pub factory: Option<String>,
    /// What to fetch, comma-separated: `pxe` (kernel, initramfs, command line),
    /// `secureboot-uki` (the signed UKI), `uki` (the unsigned UKI, for UEFI HTTP Boot without
    /// Secure Boot). Default: what the inventory's nodes of each architecture boot
    /// (`secureboot-uki` for `secureBoot: true` nodes, `pxe` for the others), else `pxe`.
    #[arg(long, value_delimiter = ',')]
    pub boot: Vec<String>,
}

/// Arguments of `images import`.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// Take version and schematic (and the architecture, if all nodes share one) from this
    /// inventory.
    #[arg(short = 'c', long = "config")]
    pub config: Option<PathBuf>,
    /// Talos version, e.g. v1.13.9.
    #[arg(long)]
    pub talos: Option<String>,
    /// Image Factory schematic ID (default: the inventory's, else vanilla).
    #[arg(long)]
    pub schematic: Option<String>,
    /// Architecture: amd64 or arm64.
    #[arg(long)]
    pub arch: Option<String>,
    /// A Talos ISO (needs xorriso). GRUB or dual-boot: its default boot entry's kernel,
    /// initramfs and command line are imported. Secure Boot (systemd-boot): its UKI,
    /// `/EFI/Linux/Talos-<version>.efi`, into the set's Secure Boot UKI slot (or, unsigned,
    /// its plain UKI slot).
    #[arg(long, conflicts_with_all = ["kernel", "initramfs", "cmdline_file", "cmdline"])]
    pub iso: Option<PathBuf>,
    /// The kernel (the factory's kernel-<arch>, or vmlinuz).
    #[arg(long, required_unless_present = "iso")]
    pub kernel: Option<PathBuf>,
    /// The initramfs, any name, compressed with anything the kernel unpacks.
    #[arg(long, required_unless_present = "iso")]
    pub initramfs: Option<PathBuf>,
    /// A file holding the kernel command line (the factory's cmdline-metal-<arch>).
    #[arg(long, conflicts_with = "cmdline", required_unless_present_any = ["cmdline", "iso"])]
    pub cmdline_file: Option<PathBuf>,
    /// The kernel command line itself.
    #[arg(long)]
    pub cmdline: Option<String>,
    /// Replace a set that is already there with different files.
    #[arg(long)]
    pub force: bool,
}

/// Run the subcommand.
pub fn run(args: &Args) -> ExitCode {
    match &args.command {
        ImagesCommand::Pull(p) => pull(&args.dir, p),
        ImagesCommand::Import(i) => import(&args.dir, i),
        ImagesCommand::List => list(&args.dir),
        ImagesCommand::Verify => verify(&args.dir),
    }
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("talboot images: {msg}");
    ExitCode::from(EXIT_USAGE)
}

/// Why the flags (and inventory) do not say which sets to pull.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// `-c` names an inventory that does not load.
    #[error("{source}; run `talboot check -c {}`", .path.display())]
    Inventory {
        /// The inventory file.
        path: std::path::PathBuf,
        /// Why it does not load.
        source: inventory::LoadError,
    },
    /// `--talos` is not a version.
    #[error("--talos {given}: {source}")]
    Talos {
        /// What was given.
        given: String,
        /// Why it is not a version.
        source: semver::Error,
    },
    /// Neither `--talos` nor an inventory.
    #[error("give --talos vX.Y.Z or -c INVENTORY")]
    NoVersion,
    /// `--schematic` is not a schematic ID.
    #[error("--schematic {0}: expected 64 hex digits")]
    Schematic(String),
    /// `--arch` is not an architecture.
    #[error("--arch {0}: use amd64 or arm64")]
    Arch(String),
    /// `--boot` is not a way to boot.
    #[error("--boot {0}: use pxe, uki or secureboot-uki")]
    Boot(String),
}

/// One set to pull and what of it.
type Wanted = (SetId, BTreeSet<Boot>);

/// Work out which sets to pull, and which of their files, from the flags and the optional
/// inventory.
fn requested_sets(p: &PullArgs) -> Result<(Vec<Wanted>, String), RequestError> {
    let inv = match &p.config {
        Some(path) => match inventory::load(path) {
            Ok(l) => Some(l.inventory),
            Err(source) => {
                return Err(RequestError::Inventory {
                    path: path.clone(),
                    source,
                });
            }
        },
        None => None,
    };
    let talos: Version = match (&p.talos, &inv) {
        (Some(t), _) => t.parse().map_err(|source| RequestError::Talos {
            given: t.clone(),
            source,
        })?,
        (None, Some(inv)) => inv.cluster.talos_version.value.clone(),
        (None, None) => return Err(RequestError::NoVersion),
    };
    let schematic = match (&p.schematic, &inv) {
        (Some(s), _) => {
            if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(RequestError::Schematic(s.clone()));
            }
            s.to_ascii_lowercase()
        }
        (None, Some(inv)) => inv.cluster.installer.schematic_id().to_string(),
        (None, None) => inventory::VANILLA_SCHEMATIC.to_string(),
    };
    let mut arches: BTreeSet<Arch> = BTreeSet::new();
    for a in &p.arch {
        arches.insert(Arch::parse(a).ok_or_else(|| RequestError::Arch(a.clone()))?);
    }
    let mut boots: BTreeSet<Boot> = BTreeSet::new();
    for b in &p.boot {
        boots.insert(Boot::parse(b).ok_or_else(|| RequestError::Boot(b.clone()))?);
    }
    // What `serve` will ask of each architecture's set: the signed UKI for `secureBoot: true`
    // nodes, the PXE files for the others and for discovery of unknown machines.
    let mut by_arch: std::collections::BTreeMap<Arch, BTreeSet<Boot>> = Default::default();
    if let Some(inv) = &inv {
        for r in artifacts::requirements(inv) {
            if let Some(a) = Arch::parse(&r.id.arch) {
                by_arch.insert(a, r.boots);
            }
        }
    }
    if arches.is_empty() {
        match &inv {
            // The nodes' architectures, as before (not the discovery default's alone).
            Some(inv) => arches.extend(inv.nodes.iter().map(|n| inv.arch_of(n))),
            None => {
                arches.insert(Arch::Amd64);
            }
        }
    }
    let factory_url = p
        .factory
        .clone()
        .or_else(|| {
            inv.as_ref()
                .map(|i| i.cluster.installer.factory_url.clone())
        })
        .unwrap_or_else(|| inventory::parts::DEFAULT_FACTORY_URL.to_string());
    let sets = arches
        .into_iter()
        .map(|a| {
            let wanted = match (boots.is_empty(), by_arch.get(&a)) {
                (false, _) => boots.clone(),
                (true, Some(b)) => b.clone(),
                (true, None) => BTreeSet::from([Boot::Pxe]),
            };
            (SetId::new(&talos, &schematic, a), wanted)
        })
        .collect();
    Ok((sets, factory_url))
}

fn pull(dir: &std::path::Path, p: &PullArgs) -> ExitCode {
    let (sets, factory_url) = match requested_sets(p) {
        Ok(v) => v,
        Err(e) => return usage(e),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return usage(format!("cannot start the runtime: {e}")),
    };
    let client = match factory::client() {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let progress = std::io::stderr().is_terminal();
    for (id, boots) in sets {
        let boots: Vec<Boot> = boots.into_iter().collect();
        let names: Vec<&str> = boots.iter().map(|b| b.name()).collect();
        println!(
            "pulling {id} from {factory_url} (boot: {})",
            names.join(", ")
        );
        let req = factory::PullRequest {
            base_url: factory_url.clone(),
            id: id.clone(),
            dir: dir.to_path_buf(),
            progress,
        };
        match rt.block_on(factory::pull_boots(&client, &req, &boots, now_unix())) {
            Ok(entry) => print_files(&entry),
            Err(e) => {
                eprintln!("talboot images pull: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
        }
    }
    ExitCode::SUCCESS
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn import(dir: &std::path::Path, i: &ImportArgs) -> ExitCode {
    let id = match import_set(i) {
        Ok(id) => id,
        Err(c) => return c,
    };
    if let Some(iso) = &i.iso {
        return import_iso(dir, &id, iso, i.force);
    }
    let (Some(kernel), Some(initramfs)) = (&i.kernel, &i.initramfs) else {
        return usage("give --kernel FILE and --initramfs FILE, or --iso FILE");
    };
    let req = artifacts::import::ImportRequest {
        id: id.clone(),
        kernel: kernel.clone(),
        initramfs: initramfs.clone(),
        cmdline: match (&i.cmdline_file, &i.cmdline) {
            (Some(f), _) => artifacts::import::CmdlineSource::File(f.clone()),
            (None, Some(s)) => artifacts::import::CmdlineSource::Inline(s.clone()),
            (None, None) => return usage("give --cmdline-file FILE or --cmdline TEXT"),
        },
        force: i.force,
        iso: None,
    };
    finish_import(dir, &id, artifacts::import::import(dir, &req, now_unix()))
}

fn finish_import(
    dir: &std::path::Path,
    id: &SetId,
    done: Result<(artifacts::Entry, artifacts::import::Outcome), artifacts::import::ImportError>,
) -> ExitCode {
    match done {
        Ok((entry, outcome)) => print_imported(dir, id, &entry, outcome),
        Err(e) => {
            eprintln!("talboot images import: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// `images import --iso`: the default GRUB entry's files, or the UKI of a systemd-boot
/// (Secure Boot) ISO. The files are copied out to a scratch folder first, removed when the
/// extraction drops, after the import has copied them again into the set.
fn import_iso(dir: &std::path::Path, id: &SetId, iso: &std::path::Path, force: bool) -> ExitCode {
    use artifacts::iso::Found;
    let x = match artifacts::iso::extract(iso, dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("talboot images import: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    // The imager names the UKI after `version.Tag` (`v1.13.9`); a name without the `v`
    // is the same version.
    let same = |v: &str| v.trim_start_matches('v') == id.talos.trim_start_matches('v');
    if let Some(v) = x.version.as_deref().filter(|v| !same(v)) {
        eprintln!(
            "talboot images import: {} is Talos {v} (its UKI is /EFI/Linux/Talos-{v}.efi), not {}; import it with --talos {v}, or use the ISO of {}",
            iso.display(),
            id.talos,
            id.talos
        );
        return ExitCode::from(EXIT_INVALID);
    }
    let (kernel, initramfs, entry) = match &x.found {
        Found::Grub {
            kernel,
            initramfs,
            entry,
        } => (kernel, initramfs, entry),
        Found::Uki { uki, inside } => return import_iso_uki(dir, id, iso, uki, inside, force),
    };
    println!(
        "{}: entry `{}` boots {} with {}",
        iso.display(),
        entry.title,
        entry.kernel,
        entry.initramfs
    );
    let req = artifacts::import::ImportRequest {
        id: id.clone(),
        kernel: kernel.clone(),
        initramfs: initramfs.clone(),
        cmdline: artifacts::import::CmdlineSource::Inline(entry.cmdline.clone()),
        force,
        iso: Some(artifacts::import::IsoSource {
            iso: iso.to_path_buf(),
            kernel: entry.kernel.clone(),
            initramfs: entry.initramfs.clone(),
        }),
    };
    finish_import(dir, id, artifacts::import::import(dir, &req, now_unix()))
}

/// The UKI of a systemd-boot ISO: a signed one fills the Secure Boot slot, an unsigned one
/// (the sd-boot ISO without Secure Boot) the plain UKI slot.
fn import_iso_uki(
    dir: &std::path::Path,
    id: &SetId,
    iso: &std::path::Path,
    uki: &std::path::Path,
    inside: &str,
    force: bool,
) -> ExitCode {
    let facts = match artifacts::uki::inspect_file(uki) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("talboot images import: {inside} in {} {e}", iso.display());
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let same = |v: &str| v.trim_start_matches('v') == id.talos.trim_start_matches('v');
    if let Some(v) = facts.version.as_deref().filter(|v| !same(v)) {
        eprintln!(
            "talboot images import: {inside} in {} says (.osrel VERSION_ID) it is Talos {v}, not {}; import it with --talos {v}",
            iso.display(),
            id.talos
        );
        return ExitCode::from(EXIT_INVALID);
    }
    let kind = match facts.signer {
        Some(_) => artifacts::Kind::SecureBootUki,
        None => artifacts::Kind::Uki,
    };
    println!(
        "{}: systemd-boot ISO; {inside} is {} UKI, imported as {}",
        iso.display(),
        if kind == artifacts::Kind::SecureBootUki {
            "a signed"
        } else {
            "an unsigned"
        },
        kind.file_name()
    );
    let req = artifacts::import::UkiImportRequest {
        id: id.clone(),
        uki: uki.to_path_buf(),
        kind,
        force,
        origin: artifacts::Origin::IsoUki {
            iso: iso.to_path_buf(),
            uki: inside.to_string(),
        },
    };
    finish_import(
        dir,
        id,
        artifacts::import::import_uki(dir, &req, now_unix()),
    )
}

/// The one set `import` fills: the same rules as `pull` for version, schematic and
/// architecture; no factory is used.
fn import_set(i: &ImportArgs) -> Result<SetId, ExitCode> {
    let p = PullArgs {
        config: i.config.clone(),
        talos: i.talos.clone(),
        schematic: i.schematic.clone(),
        arch: i.arch.iter().cloned().collect(),
        factory: None,
        boot: Vec::new(),
    };
    match requested_sets(&p) {
        Ok((sets, _)) if sets.len() == 1 => Ok(sets.into_iter().next().expect("one set").0),
        Ok((sets, _)) => {
            let arches: Vec<&str> = sets.iter().map(|s| s.0.arch.as_str()).collect();
            Err(usage(format!(
                "the inventory has nodes of several architectures ({}); import one at a time with --arch",
                arches.join(", ")
            )))
        }
        Err(e) => Err(usage(e)),
    }
}

/// What an import did, and the set's files.
fn print_imported(
    dir: &std::path::Path,
    id: &SetId,
    entry: &artifacts::Entry,
    outcome: artifacts::import::Outcome,
) -> ExitCode {
    use artifacts::import::Outcome;
    match outcome {
        Outcome::Unchanged => {
            println!(
                "{id} is already in {} with these files; nothing to do",
                dir.display()
            );
            return ExitCode::SUCCESS;
        }
        Outcome::Imported => println!("imported {id} into {}", dir.display()),
        Outcome::Repaired => println!(
            "repaired {id} in {}: its files were damaged and have been copied again",
            dir.display()
        ),
        Outcome::Replaced(kinds) => println!(
            "replaced {id} in {} (--force; new {})",
            dir.display(),
            kinds
                .iter()
                .map(|k| kind_name(*k))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    print_files(entry);
    ExitCode::SUCCESS
}

fn print_files(entry: &artifacts::Entry) {
    for (kind, rec) in &entry.files {
        let compression = rec
            .compression
            .map(|c| format!("  ({c})"))
            .unwrap_or_default();
        println!(
            "  {:<18} {:>11} bytes  sha256 {}{compression}",
            kind_name(*kind),
            rec.size,
            rec.sha256
        );
        if let Some(u) = &rec.uki {
            print_uki(&u.facts);
        }
    }
}

/// What a UKI's PE says, for `images pull/import/list`: the Authenticode signer and the
/// `.pcrpkey` fingerprint a Secure Boot node reports as `pcrSigningKeyFingerprint`.
fn print_uki(facts: &artifacts::uki::UkiFacts) {
    match &facts.signer {
        Some(s) => println!(
            "    signed by {}\n    certificate sha256 {}",
            s.subject, s.sha256_fingerprint
        ),
        None => println!("    unsigned"),
    }
    match &facts.pcr_key_fingerprint {
        Some(f) => println!("    .pcrpkey sha256 {f}"),
        None => println!("    no .pcrpkey section"),
    }
    println!(
        "    {} sections {}{}",
        facts.arch,
        facts.sections.join(" "),
        facts
            .version
            .as_deref()
            .map(|v| format!("; .osrel VERSION_ID {v}"))
            .unwrap_or_default()
    );
}

/// `2026-12-01T18:00:00Z` for a Unix time.
fn timestamp(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// Where a set came from, for `images list`.
fn origin(e: &artifacts::Entry) -> String {
    origin_text(&e.origin, &e.source, e.pulled_at)
}

/// Where files came from (`source` and `at` as the catalog records them).
fn origin_text(origin: &artifacts::Origin, source: &str, at: u64) -> String {
    match origin {
        artifacts::Origin::IsoUki { iso, uki } => format!(
            "imported at {} from ISO {} ({uki})",
            timestamp(at),
            iso.display()
        ),
        artifacts::Origin::Pulled => {
            format!("pulled from {source} at {}", timestamp(at))
        }
        artifacts::Origin::Imported {
            kernel,
            initramfs,
            cmdline,
        } => format!(
            "imported at {} from {}, {}, {}",
            timestamp(at),
            kernel.display(),
            initramfs.display(),
            if cmdline == artifacts::import::INLINE {
                "the --cmdline text"
            } else {
                cmdline
            }
        ),
        artifacts::Origin::Iso {
            iso,
            kernel,
            initramfs,
        } => format!(
            "imported at {} from ISO {} ({kernel}, {initramfs}, {})",
            timestamp(at),
            iso.display(),
            artifacts::iso::GRUB_CFG
        ),
    }
}

fn kind_name(k: artifacts::Kind) -> &'static str {
    k.file_name()
}

fn list(dir: &std::path::Path) -> ExitCode {
    let catalog = match Catalog::load(dir) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    if catalog.entries.is_empty() {
        println!("no boot sets in {}", dir.display());
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<9} {:<6} {:<64} {:>12}  {:<6}  {:<24}  ORIGIN",
        "TALOS", "ARCH", "SCHEMATIC", "BYTES", "INITRD", "BOOTS"
    );
    for e in &catalog.entries {
        let bytes: u64 = e.files.values().map(|f| f.size).sum();
        let compression = match e.files.get(&artifacts::Kind::Initramfs) {
            Some(f) => f.compression.map_or("?", |c| c.name()),
            None => "-",
        };
        let boots: Vec<&str> = e.boots().iter().map(|b| b.name()).collect();
        println!(
            "{:<9} {:<6} {:<64} {:>12}  {:<6}  {:<24}  {}",
            e.id.talos,
            e.id.arch,
            e.id.schematic,
            bytes,
            compression,
            boots.join(","),
            origin(e)
        );
        for (kind, rec) in &e.files {
            let Some(u) = &rec.uki else { continue };
            println!(
                "  {}: {}",
                kind_name(*kind),
                origin_text(&u.origin, &u.source, u.at)
            );
            print_uki(&u.facts);
        }
    }
    ExitCode::SUCCESS
}

fn verify(dir: &std::path::Path) -> ExitCode {
    let catalog = match Catalog::load(dir) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let mut bad = 0;
    for e in &catalog.entries {
        match artifacts::verify_recorded(dir, &catalog, &e.id) {
            Ok(boots) => {
                let names: Vec<&str> = boots.iter().map(|b| b.name()).collect();
                println!("ok       {} (boots: {})", e.id, names.join(", "));
            }
            Err(err) => {
                bad += 1;
                println!("DAMAGED  {err}");
            }
        }
    }
    if bad > 0 {
        ExitCode::from(EXIT_INVALID)
    } else {
        ExitCode::SUCCESS
    }
}
