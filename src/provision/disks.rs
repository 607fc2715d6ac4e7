//! Install-disk check, pure: the inventory's [`InstallTarget`] against the disks a node
//! reports in maintenance mode, computing the disk **Talos itself will install to**.
//!
//! The facts come from COSI `Disks.block.talos.dev` (resource ID = kernel name `sda`, spec
//! `dev_path` = `/dev/sda`), joined with `storage.Disks`, whose `device_name` is already the
//! full path (siderolabs/talos v1.13.9 `internal/app/storaged/server.go`:
//! `DeviceName: filepath.Join("/dev", d.Metadata().ID())`).
//!
//! Talos's rules (v1.13.9), which [`choose_install_disk`] follows exactly:
//! * A `diskSelector` wins over `disk` and is compiled to a CEL expression over `block.Disk`
//!   (`pkg/machinery/config/types/v1alpha1/v1alpha1_provider.go`, `DiskMatchExpression`): every
//!   non-empty `model`, `serial`, `wwid`, `busPath` is `glob(pattern, field)` with
//!   ryanuber/go-glob v1.0.0, where **only `*`** is special; `size` is `disk.size <op> N`
//!   with N from `humanize.ParseBytes` (dustin/go-humanize v1.0.1; `InstallDiskSizeMatcher`
//!   in `v1alpha1_types.go`); `type: nvme` is `transport == "nvme"`, `sd` is
//!   `transport == "mmc"`, `hdd` is `rotational`, `ssd` is `!rotational` (so NVMe, MMC and
//!   virtio disks that are not rotational are "ssd" too); and always `transport != ""`,
//!   `!readonly`, `!cdrom`.
//! * The install task takes the **first** matching disk (`matchedDisks[0]`,
//!   `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go`, `Install`) of
//!   `MatchDisks`'s list, which is COSI's in-memory List, sorted by resource ID
//!   (cosi-project/runtime v1.14.1 `pkg/state/impl/inmem/collection.go`).
//! * A `disk` path goes through `filepath.EvalSymlinks`, so a `/dev/disk/by-id/...` link names
//!   the disk it points to; the disk's links are `block.Disk.symlinks`
//!   (`internal/app/machined/pkg/controllers/block/symlinks.go`).
//!
//! talboot is stricter than Talos on purpose: a selector must match **exactly one** disk,
//! because Talos silently taking the first of several wipes whichever sorts first. Anything
//! else is refused before a config is applied, with every disk listed (device path, model,
//! serial, size, bus path, transport) and, for several matches, the candidates in Talos's
//! order and the one Talos would take.

use std::fmt;

use crate::inventory::size::{SizeError, SizeExpr, parse_size_expr};
use crate::inventory::{DiskSelector, DiskType, InstallTarget};
use crate::store::DiskFacts;
use crate::talos::api::storage::{self, disk::DiskType as ApiDiskType};
use crate::talos::client::CosiDisk;

/// `/dev/<name>` for a bare kernel name; a path is kept as it is (never `/dev//dev/sda`).
fn full_path(name: &str) -> String {
    if name.starts_with('/') {
        name.to_owned()
    } else {
        format!("/dev/{name}")
    }
}

// The facts are a stored record (`store::DiskFacts`, read by status and the admin API);
// reading them from Talos's answers belongs with the Talos rules here.
impl DiskFacts {
    /// Builds the facts in Talos's list order (by resource ID): from each COSI `block.Disk`,
    /// completed with the `storage.Disks` entry of the same path; a legacy disk COSI does
    /// not list (COSI unreadable) is kept with what `storage.Disks` has.
    pub fn collect(disks: &[storage::Disk], cosi: &[CosiDisk]) -> Vec<DiskFacts> {
        let legacy_kind = |d: &storage::Disk| match ApiDiskType::try_from(d.r#type) {
            Ok(ApiDiskType::Ssd) => Some(DiskType::Ssd),
            Ok(ApiDiskType::Hdd) => Some(DiskType::Hdd),
            Ok(ApiDiskType::Nvme) => Some(DiskType::Nvme),
            Ok(ApiDiskType::Sd) => Some(DiskType::Sd),
            _ => None,
        };
        let mut out: Vec<DiskFacts> = cosi
            .iter()
            .map(|c| {
                let s = &c.spec;
                let path = if s.dev_path.is_empty() {
                    full_path(&c.id)
                } else {
                    s.dev_path.clone()
                };
                let legacy = disks.iter().find(|d| full_path(&d.device_name) == path);
                let mut symlinks = s.symlinks.clone();
                symlinks.sort();
                DiskFacts {
                    dev_path: path,
                    model: s.model.clone(),
                    serial: s.serial.clone(),
                    size: s.size,
                    wwid: s.wwid.clone(),
                    uuid: s.uuid.clone(),
                    modalias: s.modalias.clone(),
                    bus_path: s.bus_path.clone(),
                    transport: s.transport.clone(),
                    rotational: s.rotational,
                    kind: legacy.and_then(legacy_kind),
                    readonly: s.readonly,
                    cdrom: s.cdrom,
                    symlinks,
                    io_size: s.io_size,
                    sector_size: s.sector_size,
                    sub_system: s.sub_system.clone(),
                    pretty_size: s.pretty_size.clone(),
                    secondary_disks: s.secondary_disks.clone(),
                    firmware_version: s.firmware_version.clone(),
                    from_cosi: true,
                }
            })
            .collect();
        for d in disks {
            let path = full_path(&d.device_name);
            if out.iter().any(|f| f.dev_path == path) {
                continue;
            }
            out.push(DiskFacts {
                dev_path: path,
                model: d.model.clone(),
                serial: d.serial.clone(),
                size: d.size,
                wwid: d.wwid.clone(),
                uuid: d.uuid.clone(),
                modalias: d.modalias.clone(),
                bus_path: d.bus_path.clone(),
                transport: String::new(),
                rotational: d.r#type == ApiDiskType::Hdd as i32,
                kind: legacy_kind(d),
                readonly: d.readonly,
                cdrom: d.r#type == ApiDiskType::Cd as i32,
                symlinks: Vec::new(),
                io_size: 0,
                sector_size: 0,
                sub_system: d.subsystem.clone(),
                pretty_size: String::new(),
                secondary_disks: Vec::new(),
                firmware_version: String::new(),
                from_cosi: false,
            });
        }
        talos_order(&mut out);
        out
    }
}

/// Sorts disks as Talos lists them: by resource ID, i.e. by kernel name. Every `dev_path` is
/// `/dev/` + ID, so comparing paths bytewise is comparing IDs (Go compares strings bytewise).
pub(crate) fn talos_order(disks: &mut [DiskFacts]) {
    disks.sort_by(|a, b| a.dev_path.cmp(&b.dev_path));
}

/// Why the install target was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// The device path is neither a disk's path nor one of its `/dev/disk/...` links.
    NoSuchPath,
    /// The path names a disk Talos cannot install to (read-only or a CD-ROM).
    Unusable(String),
    /// The selector matches no disk.
    NoMatch,
    /// The selector matches several disks (their device paths, in Talos's order: Talos would
    /// take the first).
    Ambiguous(Vec<String>),
    /// The selector's size is not a size Talos can read.
    BadSize(String),
    /// The node's COSI `block.Disk` resources could not be read, so transport and rotational
    /// (which every selector matches on) are unknown.
    NoBlockFacts,
}

/// The install target cannot be used on this node; the message lists every disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskRefusal {
    /// The target as the inventory wrote it.
    pub target: String,
    /// Why.
    pub reason: RefusalReason,
    /// Every disk the node reported.
    pub disks: Vec<DiskFacts>,
}

impl fmt::Display for DiskRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            RefusalReason::NoSuchPath => write!(
                f,
                "install disk {} does not exist on this node (neither a disk's device path nor \
                 one of its /dev/disk links)",
                self.target
            )?,
            RefusalReason::Unusable(why) => write!(
                f,
                "install disk {} is {why}: Talos cannot install to it",
                self.target
            )?,
            RefusalReason::NoMatch => write!(f, "install disk {} matches no disk", self.target)?,
            RefusalReason::Ambiguous(paths) => write!(
                f,
                "install disk {} matches {} disks ({}) but must match exactly one; Talos would \
                 install to the first in its order, {}, and wipe it",
                self.target,
                paths.len(),
                paths.join(", "),
                paths[0]
            )?,
            RefusalReason::BadSize(why) => {
                write!(f, "install disk {}: unusable size: {why}", self.target)?
            }
            RefusalReason::NoBlockFacts => write!(
                f,
                "install disk {}: the node did not list its block.Disk resources (COSI), so \
                 the disk Talos would pick cannot be known",
                self.target
            )?,
        }
        write!(
            f,
            "; fix installDisk or installDiskSelector (serial or busPath stay stable when device \
             names change). The node reports {} disk(s):",
            self.disks.len()
        )?;
        for d in &self.disks {
            write!(f, "\n  {}", describe(d))?;
        }
        Ok(())
    }
}

impl std::error::Error for DiskRefusal {}

/// One line describing a disk, for refusals and events.
pub(crate) fn describe(d: &DiskFacts) -> String {
    let or_dash = |s: &str| {
        let s = s.trim();
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    format!(
        "{} model={} serial={} size={} busPath={} transport={}{}{}{}",
        d.dev_path,
        or_dash(&d.model),
        or_dash(&d.serial),
        pretty_size(d.size),
        or_dash(&d.bus_path),
        or_dash(&d.transport),
        if d.rotational { " rotational" } else { "" },
        if d.readonly { " readonly" } else { "" },
        if d.cdrom { " cdrom" } else { "" },
    )
}

/// Bytes in decimal units with one decimal.
pub fn pretty_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Collapses repeated `/` and `.` components, as `filepath.EvalSymlinks` cleans a path
/// before resolving it.
fn clean_path(p: &str) -> String {
    let parts: Vec<&str> = p
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

/// Picks the install disk for `target` among `disks`: the device path Talos will install to,
/// or a refusal. See the module docs for the rules.
pub(crate) fn choose_install_disk(
    target: &InstallTarget,
    disks: &[DiskFacts],
) -> Result<String, DiskRefusal> {
    let mut ordered = disks.to_vec();
    talos_order(&mut ordered);
    let refuse = |reason| DiskRefusal {
        target: target.to_string(),
        reason,
        disks: ordered.clone(),
    };
    match target {
        InstallTarget::Disk(path) => {
            let path = clean_path(path);
            let d = ordered
                .iter()
                .find(|d| d.dev_path == path || d.symlinks.contains(&path))
                .ok_or_else(|| refuse(RefusalReason::NoSuchPath))?;
            if d.cdrom {
                return Err(refuse(RefusalReason::Unusable(format!(
                    "{}, a CD-ROM drive",
                    d.dev_path
                ))));
            }
            if d.readonly {
                return Err(refuse(RefusalReason::Unusable(format!(
                    "{}, read-only",
                    d.dev_path
                ))));
            }
            Ok(d.dev_path.clone())
        }
        InstallTarget::Selector(sel) => {
            let m = Matcher::compile(sel)
                .map_err(|why| refuse(RefusalReason::BadSize(why.to_string())))?;
            if ordered.iter().any(|d| !d.from_cosi) {
                return Err(refuse(RefusalReason::NoBlockFacts));
            }
            let hits: Vec<&DiskFacts> = ordered.iter().filter(|d| m.matches(d)).collect();
            match hits.as_slice() {
                [one] => Ok(one.dev_path.clone()),
                [] => Err(refuse(RefusalReason::NoMatch)),
                many => Err(refuse(RefusalReason::Ambiguous(
                    many.iter().map(|d| d.dev_path.clone()).collect(),
                ))),
            }
        }
    }
}

/// The disks Talos's compiled selector matches, in Talos's order (its pick is the first).
/// `Err`: the selector's size is not one Talos can read.
pub fn talos_matches(sel: &DiskSelector, disks: &[DiskFacts]) -> Result<Vec<String>, SizeError> {
    let m = Matcher::compile(sel)?;
    let mut ordered = disks.to_vec();
    talos_order(&mut ordered);
    Ok(ordered
        .iter()
        .filter(|d| m.matches(d))
        .map(|d| d.dev_path.clone())
        .collect())
}

/// Which field of a disk a glob is matched against.
type Field = fn(&DiskFacts) -> &str;

/// A selector compiled the way `DiskMatchExpression` compiles it.
struct Matcher<'a> {
    size: Option<SizeExpr>,
    globs: Vec<(&'a str, Field)>,
    disk_type: Option<DiskType>,
}

impl<'a> Matcher<'a> {
    /// `Err`: the size is not one Talos can read (the only part that can be wrong).
    fn compile(sel: &'a DiskSelector) -> Result<Self, SizeError> {
        let size = sel.size.as_deref().map(parse_size_expr).transpose()?;
        let mut globs: Vec<(&str, Field)> = Vec::new();
        // Empty strings are not criteria: `if selector.Model != ""`.
        let fields: [(&Option<String>, Field); 4] = [
            (&sel.wwid, |d| &d.wwid),
            (&sel.model, |d| &d.model),
            (&sel.serial, |d| &d.serial),
            (&sel.bus_path, |d| &d.bus_path),
        ];
        for (pat, get) in fields {
            if let Some(p) = pat.as_deref().filter(|p| !p.is_empty()) {
                globs.push((p, get));
            }
        }
        Ok(Matcher {
            size,
            globs,
            disk_type: sel.disk_type,
        })
    }

    fn matches(&self, d: &DiskFacts) -> bool {
        self.size.is_none_or(|s| s.holds(d.size))
            && self.globs.iter().all(|(p, get)| glob(p, get(d)))
            && !d.transport.is_empty()
            && match self.disk_type {
                None => true,
                Some(DiskType::Nvme) => d.transport == "nvme",
                Some(DiskType::Sd) => d.transport == "mmc",
                Some(DiskType::Hdd) => d.rotational,
                Some(DiskType::Ssd) => !d.rotational,
            }
            && !d.readonly
            && !d.cdrom
    }
}

/// ryanuber/go-glob v1.0.0 `Glob`: `*` matches any run of characters, every other character
/// (`?` and `[` included) only itself; an empty pattern matches only the empty string.
pub(crate) fn glob(pattern: &str, subj: &str) -> bool {
    if pattern.is_empty() {
        return subj.is_empty();
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let last = parts.len() - 1;
    if last == 0 {
        return subj == pattern;
    }
    // The first part anchors at the start (unless the pattern starts with `*`); every middle
    // part is taken at its leftmost occurrence; the last must end the rest.
    let Some(mut rest) = subj.strip_prefix(parts[0]) else {
        return false;
    };
    for part in &parts[1..last] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(parts[last])
}

#[cfg(test)]
mod tests;
