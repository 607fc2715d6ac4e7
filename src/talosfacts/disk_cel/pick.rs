//! Which disk Talos picks for a checked expression, by purpose (install or volume), and
//! the refusal talboot gives when that pick would be chance, no disk, or an error.

use std::fmt;

use super::{CelDisk, CelError, DiskExpr, compile, eval};

/// What a selector chooses a disk for, which decides Talos's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// `UnattendedInstallConfig` (and a legacy `machine.install` selector): every disk,
    /// `system_disk` false, the first match.
    Install,
    /// A `VolumeConfig`/`UserVolumeConfig`/`RawVolumeConfig`/`SwapVolumeConfig` selector.
    Volume {
        /// `volumeType: disk` takes the whole disk; anything else is a partition.
        whole_disk: bool,
        /// `provisioning.minSize` in bytes (0 when not given).
        min_size: u64,
        /// The install disk's `dev_path`, which `system_disk` is true for.
        system_disk: String,
    },
}

/// The disk an expression chose, and every disk it matched (in Talos's order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The `dev_path` Talos will use.
    pub disk: String,
    /// Every disk that matched, in Talos's order.
    pub matched: Vec<String>,
}

/// Why talboot refuses a selector on this node; the message names every candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CelRefusal {
    /// Which document's selector (`UnattendedInstallConfig`, `UserVolumeConfig garage-data`).
    pub what: String,
    /// The expression.
    pub expr: String,
    /// Why (boxed: the refusal travels in `Result`s).
    pub reason: Box<RefusalKind>,
    /// Every disk the node reported, in Talos's order, one line each.
    pub disks: Vec<String>,
}

/// The refusal reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// Talos would refuse the expression itself.
    Invalid(CelError),
    /// Evaluating it failed on this disk (Talos fails the whole reconcile).
    EvalError { disk: String, error: CelError },
    /// No disk matches: Talos would wait forever (install) or fail the volume.
    NoMatch,
    /// Several disks match and Talos's pick is the first in its order, not a choice.
    Ambiguous { matched: Vec<String>, pick: String },
    /// Disks match but none has room for the partition.
    NoRoom { matched: Vec<String>, min_size: u64 },
    /// The one disk matched cannot be installed to (read-only or a CD-ROM).
    Unusable { disk: String, why: &'static str },
    /// A RAID array's selector matches fewer disks than Talos needs to create it.
    TooFewMembers { matched: Vec<String> },
    /// A RAID member matches the disk another member (`other`) already matched.
    SharedMember { disk: String, other: String },
}

impl fmt::Display for CelRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, expr) = (&self.what, &self.expr);
        match self.reason.as_ref() {
            RefusalKind::Invalid(e) => write!(f, "{what} selector `{expr}`: {e}")?,
            RefusalKind::EvalError { disk, error } => write!(
                f,
                "{what} selector `{expr}` on {disk}: {error}; Talos would fail the same way"
            )?,
            RefusalKind::NoMatch => write!(
                f,
                "{what} selector `{expr}` matches no disk: Talos would wait for one forever"
            )?,
            RefusalKind::Ambiguous { matched, pick } => write!(
                f,
                "{what} selector `{expr}` matches {} disks ({}) but must match exactly one; \
                 Talos would take the first in its order, {pick}",
                matched.len(),
                matched.join(", ")
            )?,
            RefusalKind::NoRoom { matched, min_size } => write!(
                f,
                "{what} selector `{expr}` matches {} but none has room for minSize {min_size} bytes",
                matched.join(", ")
            )?,
            RefusalKind::TooFewMembers { matched } => write!(
                f,
                "{what} selector `{expr}` matches {} disk(s){}: Talos waits for at least 2 \
                 members before it creates the array (\"waiting for enough member disks\"), \
                 so the node would never install",
                matched.len(),
                if matched.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", matched.join(", "))
                }
            )?,
            RefusalKind::SharedMember { disk, other } => write!(
                f,
                "{what} selector `{expr}` matches {disk}, which {other} already matches: one \
                 disk cannot be two members of the array"
            )?,
            RefusalKind::Unusable { disk, why } => write!(
                f,
                "{what} selector `{expr}` matches only {disk}, which is {why}: Talos cannot \
                 install to it"
            )?,
        }
        let fix = match self.reason.as_ref() {
            RefusalKind::TooFewMembers { .. } => "match every member disk",
            _ => "narrow the expression",
        };
        write!(
            f,
            "; {fix} (disk.serial, disk.wwid or \"<link>\" in disk.symlinks stay \
             stable when device names change). The node reports {} disk(s):",
            self.disks.len()
        )?;
        for d in &self.disks {
            write!(f, "\n  {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CelRefusal {}

/// One line describing a disk, with the fields selectors usually test.
pub fn describe(d: &CelDisk) -> String {
    let or_dash = |s: &str| {
        if s.trim().is_empty() {
            "-".to_owned()
        } else {
            s.trim().to_owned()
        }
    };
    format!(
        "{} model={} serial={} size={}u busPath={} transport={}{}{}{}",
        d.dev_path,
        or_dash(&d.model),
        or_dash(&d.serial),
        d.size,
        or_dash(&d.bus_path),
        or_dash(&d.transport),
        if d.rotational { " rotational" } else { "" },
        if d.readonly { " readonly" } else { "" },
        if d.cdrom { " cdrom" } else { "" },
    )
}

/// Talos's list order: by resource ID, the kernel name; `dev_path` is `/dev/` + ID, so
/// comparing paths bytewise compares IDs.
pub fn talos_order(disks: &[CelDisk]) -> Vec<&CelDisk> {
    let mut v: Vec<&CelDisk> = disks.iter().collect();
    v.sort_by(|a, b| a.dev_path.cmp(&b.dev_path));
    v
}

/// The partition overhead Talos adds to `minSize` on a blank disk (`CheckDiskForProvisioning`:
/// the GPT headers, 67 sectors).
const GPT_SECTORS: u64 = 67;

/// The disk Talos picks for `expr` among `disks`, or why talboot refuses: no match, an
/// evaluation error, or several matches where Talos's pick (the first by ID) is chance.
/// A partition volume whose other matches lack room is not ambiguous. Free space on a disk
/// that already holds partitions is not known here; such a disk counts as having room.
pub fn choose(
    what: &str,
    expr: &DiskExpr,
    disks: &[CelDisk],
    purpose: &Purpose,
) -> Result<Choice, CelRefusal> {
    let ordered = talos_order(disks);
    let refuse = |reason| CelRefusal {
        what: what.to_owned(),
        expr: expr.text().to_owned(),
        reason: Box::new(reason),
        disks: ordered.iter().map(|d| describe(d)).collect(),
    };
    let matched = matching(expr, &ordered, purpose).map_err(refuse)?;
    let all = paths(&matched);
    let candidates = match purpose {
        Purpose::Volume {
            whole_disk: false,
            min_size,
            ..
        } => {
            let room = with_room(&matched, *min_size);
            if room.is_empty() && !matched.is_empty() {
                return Err(refuse(RefusalKind::NoRoom {
                    matched: all,
                    min_size: *min_size,
                }));
            }
            room
        }
        _ => matched,
    };
    match candidates.as_slice() {
        [] => Err(refuse(RefusalKind::NoMatch)),
        [one] if *purpose == Purpose::Install && (one.readonly || one.cdrom) => {
            Err(refuse(RefusalKind::Unusable {
                disk: one.dev_path.clone(),
                why: if one.cdrom {
                    "a CD-ROM drive"
                } else {
                    "read-only"
                },
            }))
        }
        [one] => Ok(Choice {
            disk: one.dev_path.clone(),
            matched: all,
        }),
        many => Err(refuse(RefusalKind::Ambiguous {
            matched: paths(many),
            pick: many[0].dev_path.clone(),
        })),
    }
}

fn paths(v: &[&CelDisk]) -> Vec<String> {
    v.iter().map(|d| d.dev_path.clone()).collect()
}

/// The disks `expr` matches, in Talos's order, with the variables Talos binds for the
/// purpose: `system_disk` false at install; for volumes, read-only disks are skipped before
/// evaluation and `system_disk` is "is the install disk". The first evaluation error stops
/// everything, as it fails Talos's whole reconcile.
fn matching<'d>(
    expr: &DiskExpr,
    ordered: &[&'d CelDisk],
    purpose: &Purpose,
) -> Result<Vec<&'d CelDisk>, RefusalKind> {
    let mut matched = Vec::new();
    for &d in ordered {
        let system = match purpose {
            Purpose::Install => false,
            Purpose::Volume { .. } if d.readonly => continue,
            Purpose::Volume { system_disk, .. } => d.dev_path == *system_disk,
        };
        match eval(expr, d, Some(system)) {
            Ok(true) => matched.push(d),
            Ok(false) => {}
            Err(error) => {
                return Err(RefusalKind::EvalError {
                    disk: d.dev_path.clone(),
                    error,
                });
            }
        }
    }
    Ok(matched)
}

/// The matches a blank-disk partition of `min_size` fits on (`CheckDiskForProvisioning`).
fn with_room<'d>(matched: &[&'d CelDisk], min_size: u64) -> Vec<&'d CelDisk> {
    matched
        .iter()
        .copied()
        .filter(|d| {
            let sector = if d.sector_size == 0 {
                512
            } else {
                d.sector_size
            };
            d.size >= min_size.saturating_add(GPT_SECTORS.saturating_mul(sector))
        })
        .collect()
}

/// [`compile`], refusing with the same shape as [`choose`] (for the node's event path).
pub fn compile_for(what: &str, text: &str, disks: &[CelDisk]) -> Result<DiskExpr, CelRefusal> {
    compile(text).map_err(|e| CelRefusal {
        what: what.to_owned(),
        expr: text.to_owned(),
        reason: Box::new(RefusalKind::Invalid(e)),
        disks: talos_order(disks).iter().map(|d| describe(d)).collect(),
    })
}
