//! Install-disk check, pure: the inventory's [`InstallTarget`] against the disks a node
//! reports in maintenance mode.
//!
//! A device path must name a disk the node has; a [`DiskSelector`] must match **exactly one**
//! disk. Anything else is refused before a config is applied, with every disk listed (device
//! path, model, serial, size, bus path, transport), because the classic failure is an install
//! disk that names the wrong device after NVMe enumeration changed, and the operator needs the
//! stable facts (serial, bus path) to write a selector that survives it.
//!
//! Matching follows Talos's `InstallDiskSelector`: `model`, `serial`, `wwid` and `busPath`
//! are globs (`*`, `?`), `size` is a byte size with an optional comparison (`<= 600GB`,
//! `>= 1TB`; decimal and binary units), `type` is ssd, hdd, nvme or sd. Read-only disks and
//! CD-ROMs are never candidates.

use std::fmt;

use crate::inventory::{DiskSelector, DiskType, InstallTarget};
use crate::talos::api::storage::{self, disk::DiskType as ApiDiskType};
use crate::talos::client::CosiDisk;

/// What talboot knows about one disk of a node (from `storage.Disks`, completed by COSI
/// `Disks.block.talos.dev` where that has more).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskFacts {
    /// `/dev/<name>`.
    pub dev_path: String,
    /// Model string.
    pub model: String,
    /// Serial number.
    pub serial: String,
    /// Size in bytes.
    pub size: u64,
    /// World-wide identifier.
    pub wwid: String,
    /// Kernel bus path (stable across NVMe renumbering).
    pub bus_path: String,
    /// Transport (`nvme`, `sata`, `virtio`, ...), from COSI; empty when unknown.
    pub transport: String,
    /// Kind of disk, as Talos classifies it; `None` for unknown or CD.
    #[serde(with = "kind_name")]
    pub kind: Option<DiskType>,
    /// Read-only device.
    pub readonly: bool,
    /// CD-ROM drive.
    pub cdrom: bool,
    /// Other names of the device (`/dev/disk/by-id/...`), from COSI.
    pub symlinks: Vec<String>,
}

impl DiskFacts {
    /// Builds the facts from the legacy disk list, adding transport and symlinks from the COSI
    /// list where a COSI disk has the same device name.
    pub fn collect(disks: &[storage::Disk], cosi: &[CosiDisk]) -> Vec<DiskFacts> {
        disks
            .iter()
            .map(|d| {
                let extra = cosi.iter().find(|c| c.id == d.device_name);
                let kind = match ApiDiskType::try_from(d.r#type) {
                    Ok(ApiDiskType::Ssd) => Some(DiskType::Ssd),
                    Ok(ApiDiskType::Hdd) => Some(DiskType::Hdd),
                    Ok(ApiDiskType::Nvme) => Some(DiskType::Nvme),
                    Ok(ApiDiskType::Sd) => Some(DiskType::Sd),
                    _ => None,
                };
                DiskFacts {
                    dev_path: format!("/dev/{}", d.device_name),
                    model: d.model.trim().to_owned(),
                    serial: d.serial.trim().to_owned(),
                    size: d.size,
                    wwid: d.wwid.clone(),
                    bus_path: d.bus_path.clone(),
                    transport: extra.map(|c| c.spec.transport.clone()).unwrap_or_default(),
                    kind,
                    readonly: d.readonly,
                    cdrom: d.r#type == ApiDiskType::Cd as i32
                        || extra.is_some_and(|c| c.spec.cdrom),
                    symlinks: extra.map(|c| c.spec.symlinks.clone()).unwrap_or_default(),
                }
            })
            .collect()
    }
}

/// `DiskType` by its inventory word (`ssd`, `nvme`, ...) in stored facts.
mod kind_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::inventory::DiskType;

    pub fn serialize<S: Serializer>(k: &Option<DiskType>, s: S) -> Result<S::Ok, S::Error> {
        match k {
            Some(k) => s.serialize_some(k.as_str()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DiskType>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.and_then(|w| DiskType::parse(&w)))
    }
}

/// Why the install target was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// The device path is not one of the node's disks.
    NoSuchPath,
    /// The selector matches no disk.
    NoMatch,
    /// The selector matches several disks (their device paths).
    Ambiguous(Vec<String>),
    /// The selector's size is not a size talboot (or Talos) can read.
    BadSize(String),
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
                "install disk {} does not exist on this node",
                self.target
            )?,
            RefusalReason::NoMatch => write!(f, "install disk {} matches no disk", self.target)?,
            RefusalReason::Ambiguous(paths) => write!(
                f,
                "install disk {} matches {} disks ({}) but must match exactly one",
                self.target,
                paths.len(),
                paths.join(", ")
            )?,
            RefusalReason::BadSize(why) => {
                write!(f, "install disk {}: unusable size: {why}", self.target)?
            }
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
pub fn describe(d: &DiskFacts) -> String {
    let or_dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    format!(
        "{} model={} serial={} size={} busPath={} transport={}{}{}",
        d.dev_path,
        or_dash(&d.model),
        or_dash(&d.serial),
        pretty_size(d.size),
        or_dash(&d.bus_path),
        or_dash(&d.transport),
        if d.readonly { " readonly" } else { "" },
        if d.cdrom { " cdrom" } else { "" },
    )
}

/// Bytes in decimal units with one decimal, as Talos's `pretty_size` shows them.
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

/// Picks the install disk for `target` among `disks`: its device path, or a refusal.
pub fn choose_install_disk(
    target: &InstallTarget,
    disks: &[DiskFacts],
) -> Result<String, DiskRefusal> {
    let refuse = |reason| DiskRefusal {
        target: target.to_string(),
        reason,
        disks: disks.to_vec(),
    };
    match target {
        InstallTarget::Disk(path) => disks
            .iter()
            .find(|d| d.dev_path == *path || d.symlinks.iter().any(|s| s == path))
            .map(|d| d.dev_path.clone())
            .ok_or_else(|| refuse(RefusalReason::NoSuchPath)),
        InstallTarget::Selector(sel) => {
            let size = match sel.size.as_deref().map(parse_size_expr).transpose() {
                Ok(s) => s,
                Err(why) => return Err(refuse(RefusalReason::BadSize(why))),
            };
            let hits: Vec<&DiskFacts> = disks
                .iter()
                .filter(|d| !d.readonly && !d.cdrom)
                .filter(|d| matches_selector(sel, size, d))
                .collect();
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

fn matches_selector(sel: &DiskSelector, size: Option<SizeExpr>, d: &DiskFacts) -> bool {
    let glob_ok = |pat: &Option<String>, value: &str| pat.as_deref().is_none_or(|p| glob(p, value));
    glob_ok(&sel.model, &d.model)
        && glob_ok(&sel.serial, &d.serial)
        && glob_ok(&sel.wwid, &d.wwid)
        && glob_ok(&sel.bus_path, &d.bus_path)
        && sel.disk_type.is_none_or(|t| d.kind == Some(t))
        && size.is_none_or(|s| s.holds(d.size))
}

/// A size comparison from a selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeExpr {
    /// The comparison.
    pub op: SizeOp,
    /// The size in bytes.
    pub bytes: u64,
}

/// Comparison operators a selector size may start with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeOp {
    /// `==` or no operator.
    Eq,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

impl SizeExpr {
    /// Whether a disk of `size` bytes satisfies the comparison.
    pub fn holds(self, size: u64) -> bool {
        match self.op {
            SizeOp::Eq => size == self.bytes,
            SizeOp::Lt => size < self.bytes,
            SizeOp::Le => size <= self.bytes,
            SizeOp::Gt => size > self.bytes,
            SizeOp::Ge => size >= self.bytes,
        }
    }
}

/// Parses `<= 600GB`, `>=1TiB`, `500 GB`, `1.5TB`, `1024` (bytes).
pub fn parse_size_expr(s: &str) -> Result<SizeExpr, String> {
    let s = s.trim();
    let (op, rest) = [
        ("<=", SizeOp::Le),
        (">=", SizeOp::Ge),
        ("==", SizeOp::Eq),
        ("<", SizeOp::Lt),
        (">", SizeOp::Gt),
    ]
    .iter()
    .find_map(|(p, op)| s.strip_prefix(p).map(|r| (*op, r)))
    .unwrap_or((SizeOp::Eq, s));
    let rest = rest.trim();
    let split = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (num, unit) = rest.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} does not start with a number (e.g. `<= 600GB`)"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "p" | "pb" => 1_000_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        "pi" | "pib" => 1 << 50,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}; use B, kB, MB, GB, TB (powers of 1000) or \
                 KiB, MiB, GiB, TiB (powers of 1024)"
            ));
        }
    };
    Ok(SizeExpr {
        op,
        bytes: (value * mult as f64).round() as u64,
    })
}

/// Shell-style glob: `*` any run of characters, `?` one character, everything else literal.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with one backtrack point (the last `*`), linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str, model: &str, serial: &str, size: u64, kind: DiskType) -> DiskFacts {
        DiskFacts {
            dev_path: format!("/dev/{name}"),
            model: model.into(),
            serial: serial.into(),
            size,
            wwid: format!("eui.{serial}"),
            bus_path: format!("/pci0000:00/0000:00:{serial}.0/nvme"),
            transport: if kind == DiskType::Nvme {
                "nvme"
            } else {
                "sata"
            }
            .into(),
            kind: Some(kind),
            readonly: false,
            cdrom: false,
            symlinks: vec![format!("/dev/disk/by-id/ata-{serial}")],
        }
    }

    fn rack() -> Vec<DiskFacts> {
        vec![
            disk(
                "nvme0n1",
                "Samsung SSD 980",
                "S1",
                500_107_862_016,
                DiskType::Nvme,
            ),
            disk(
                "nvme1n1",
                "Samsung SSD 980",
                "S2",
                1_000_204_886_016,
                DiskType::Nvme,
            ),
            disk("sda", "ST4000NM", "H1", 4_000_787_030_016, DiskType::Hdd),
        ]
    }

    fn sel(f: impl FnOnce(&mut DiskSelector)) -> InstallTarget {
        let mut s = DiskSelector::default();
        f(&mut s);
        InstallTarget::Selector(s)
    }

    #[test]
    fn path_must_exist() {
        let disks = rack();
        assert_eq!(
            choose_install_disk(&InstallTarget::Disk("/dev/sda".into()), &disks).unwrap(),
            "/dev/sda"
        );
        assert_eq!(
            choose_install_disk(
                &InstallTarget::Disk("/dev/disk/by-id/ata-S2".into()),
                &disks
            )
            .unwrap(),
            "/dev/nvme1n1"
        );
        let err = choose_install_disk(&InstallTarget::Disk("/dev/vda".into()), &disks).unwrap_err();
        assert_eq!(err.reason, RefusalReason::NoSuchPath);
    }

    #[test]
    fn selector_picks_exactly_one() {
        let disks = rack();
        let t = sel(|s| {
            s.disk_type = Some(DiskType::Nvme);
            s.size = Some("<= 600GB".into());
        });
        assert_eq!(choose_install_disk(&t, &disks).unwrap(), "/dev/nvme0n1");
        let t = sel(|s| s.serial = Some("S?".into()));
        let err = choose_install_disk(&t, &disks).unwrap_err();
        assert_eq!(
            err.reason,
            RefusalReason::Ambiguous(vec!["/dev/nvme0n1".into(), "/dev/nvme1n1".into()])
        );
        let t = sel(|s| s.model = Some("Samsung*".into()));
        assert!(matches!(
            choose_install_disk(&t, &disks).unwrap_err().reason,
            RefusalReason::Ambiguous(_)
        ));
        let t = sel(|s| s.bus_path = Some("/pci0000:00/0000:00:S2.0/*".into()));
        assert_eq!(choose_install_disk(&t, &disks).unwrap(), "/dev/nvme1n1");
        let t = sel(|s| s.disk_type = Some(DiskType::Sd));
        assert_eq!(
            choose_install_disk(&t, &disks).unwrap_err().reason,
            RefusalReason::NoMatch
        );
    }

    #[test]
    fn readonly_and_cdrom_are_never_candidates() {
        let mut disks = rack();
        disks[2].readonly = true;
        let t = sel(|s| s.size = Some(">= 4TB".into()));
        assert_eq!(
            choose_install_disk(&t, &disks).unwrap_err().reason,
            RefusalReason::NoMatch
        );
    }

    #[test]
    fn refusal_lists_every_disk_with_stable_facts() {
        let disks = rack();
        let t = sel(|s| s.disk_type = Some(DiskType::Nvme));
        let msg = choose_install_disk(&t, &disks).unwrap_err().to_string();
        assert!(msg.contains("matches 2 disks"), "{msg}");
        for d in &disks {
            assert!(msg.contains(&d.dev_path), "{msg}");
            assert!(msg.contains(&format!("serial={}", d.serial)), "{msg}");
            assert!(msg.contains(&d.bus_path), "{msg}");
            assert!(msg.contains(&format!("model={}", d.model)), "{msg}");
            assert!(msg.contains(&format!("transport={}", d.transport)), "{msg}");
        }
        assert!(msg.contains("size=500.1 GB"), "{msg}");
    }

    #[test]
    fn size_expressions() {
        let e = parse_size_expr("<= 600GB").unwrap();
        assert_eq!((e.op, e.bytes), (SizeOp::Le, 600_000_000_000));
        let e = parse_size_expr(">=1TiB").unwrap();
        assert_eq!((e.op, e.bytes), (SizeOp::Ge, 1 << 40));
        let e = parse_size_expr("1.5 TB").unwrap();
        assert_eq!((e.op, e.bytes), (SizeOp::Eq, 1_500_000_000_000));
        assert_eq!(parse_size_expr("512").unwrap().bytes, 512);
        assert!(parse_size_expr("big").is_err());
        assert!(parse_size_expr("10 XB").is_err());
        assert!(e.holds(1_500_000_000_000) && !e.holds(1));
        let t = sel(|s| s.size = Some("lots".into()));
        assert!(matches!(
            choose_install_disk(&t, &rack()).unwrap_err().reason,
            RefusalReason::BadSize(_)
        ));
    }

    #[test]
    fn globs() {
        assert!(glob("Samsung*", "Samsung SSD 980"));
        assert!(glob("*980", "Samsung SSD 980"));
        assert!(glob("S?", "S1"));
        assert!(!glob("S?", "S12"));
        assert!(glob("*a*b*", "xxaxxbxx"));
        assert!(!glob("*a*b", "xxaxxbxxc"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(glob("*", ""));
    }
}
