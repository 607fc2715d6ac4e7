//! A simulated machine's disks as Talos v1.13.9 sees them, and what the double derives from
//! them: the COSI `Disks.block.talos.dev` resources, the legacy `storage.Disks` reply, and the
//! disk Talos's install task would write to.
//!
//! The source of truth is the `block.Disk` resource (ID = kernel name, spec = [`block::DiskSpec`]),
//! because that is what Talos itself builds first and derives everything else from
//! (siderolabs/talos v1.13.9 `internal/app/machined/pkg/controllers/block/disks.go`); the
//! constructors shape the spec as the kernel and go-blockdevice fill it for each bus, so a
//! test's disk looks like a real one (full `dev_path`, bare ID, transport, bus path, sorted
//! `/dev/disk/...` symlinks).
//!
//! The install pick here is written from Talos's install task on purpose separately from
//! talboot's own [`crate::provision::disks`], so the two can disagree and a test can see it.

use crate::talos::api::storage;
use crate::talos::api::talos::resource::definitions::block;

/// One disk of a simulated machine: the `block.Disk` resource Talos would hold for it.
#[derive(Clone, Debug, PartialEq)]
pub struct SimDisk {
    /// Resource ID: the kernel device name (`sda`, `nvme0n1`), never a path.
    pub id: String,
    /// The spec, field for field as `pkg/machinery/resources/block/disk.go` names it.
    pub spec: block::DiskSpec,
}

/// `humanize.Bytes` (dustin/go-humanize v1.0.1 `bytes.go`, pinned by Talos v1.13.9's
/// go.mod), which `DiskSpec.SetSize` uses for `pretty_size`: SI units, one decimal below 10.
pub(crate) fn humanize_bytes(size: u64) -> String {
    const SIZES: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if size < 10 {
        return format!("{size} B");
    }
    let e = (size as f64).log(1000.0).floor();
    let val = (size as f64 / 1000f64.powf(e) * 10.0 + 0.5).floor() / 10.0;
    let suffix = SIZES[e as usize];
    if val < 10.0 {
        format!("{val:.1} {suffix}")
    } else {
        format!("{val:.0} {suffix}")
    }
}

/// A model or serial as udev puts it into `/dev/disk/by-id` names (spaces become `_`).
fn by_id_part(s: &str) -> String {
    s.trim().replace(' ', "_")
}

fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl SimDisk {
    /// The common part: `dev_path = filepath.Join("/dev", id)` and `SetSize` (disks.go).
    fn base(id: &str, size: u64) -> block::DiskSpec {
        block::DiskSpec {
            dev_path: format!("/dev/{id}"),
            size,
            pretty_size: humanize_bytes(size),
            io_size: 512,
            sector_size: 512,
            sub_system: "/sys/class/block".into(),
            ..Default::default()
        }
    }

    fn finish(id: &str, mut spec: block::DiskSpec) -> Self {
        // SymlinksController keeps each device's paths sorted (`slices.Sort`, symlinks.go).
        spec.symlinks.sort();
        SimDisk {
            id: id.to_owned(),
            spec,
        }
    }

    /// An NVMe namespace `nvme<index>n1` on PCI: transport `nvme` from the device name
    /// (go-blockdevice `getTransport`), bus path two levels above the block device's sysfs
    /// node (`GetProperties`: `.../<pci fn>/nvme`), `eui.` WWID, udev's `nvme-<model>_<serial>`
    /// and `nvme-eui.` links.
    pub fn nvme(index: u8, model: &str, serial: &str, size: u64) -> Self {
        let id = format!("nvme{index}n1");
        let pci = format!("0000:{:02x}:00.0", 0x3d + index);
        let eui = format!("eui.{:016x}", hash(serial));
        let mut spec = Self::base(&id, size);
        spec.model = model.to_owned();
        spec.serial = serial.to_owned();
        spec.wwid = eui.clone();
        spec.modalias = "nvme:v144Dd0000A80Ds144Dm00000000".into();
        spec.bus_path = format!("/pci0000:00/0000:00:1d.0/{pci}/nvme");
        spec.transport = "nvme".into();
        spec.symlinks = vec![
            format!(
                "/dev/disk/by-id/nvme-{}_{}",
                by_id_part(model),
                by_id_part(serial)
            ),
            format!("/dev/disk/by-id/nvme-{eui}"),
            format!("/dev/disk/by-path/pci-{pci}-nvme-1"),
        ];
        Self::finish(&id, spec)
    }

    /// A SATA disk `sd<letter>` behind AHCI (transport `sata`: SCSI host whose `proc_name` is
    /// `ahci`), port `index`; `rotational` for a spinning disk. udev's `ata-<model>_<serial>`
    /// and `wwn-0x...` links.
    pub fn sata(index: u8, model: &str, serial: &str, size: u64, rotational: bool) -> Self {
        let id = format!("sd{}", char::from(b'a' + index));
        let wwn = format!("0x5000c500{:08x}", hash(serial) as u32);
        let mut spec = Self::base(&id, size);
        spec.model = model.to_owned();
        spec.serial = serial.to_owned();
        spec.wwid = format!("naa.{}", wwn.trim_start_matches("0x"));
        spec.modalias = "scsi:t-0x00".into();
        spec.bus_path = format!(
            "/pci0000:00/0000:00:17.0/ata{n}/host{index}/target{index}:0:0/{index}:0:0:0",
            n = index + 1
        );
        spec.transport = "sata".into();
        spec.rotational = rotational;
        spec.symlinks = vec![
            format!(
                "/dev/disk/by-id/ata-{}_{}",
                by_id_part(model),
                by_id_part(serial)
            ),
            format!("/dev/disk/by-id/wwn-{wwn}"),
            format!("/dev/disk/by-path/pci-0000:00:17.0-ata-{}", index + 1),
        ];
        Self::finish(&id, spec)
    }

    /// A virtio-blk disk `vd<letter>` (transport `virtio` from the name); virtio-blk has no
    /// model, the serial is whatever the hypervisor passed (`virtio-<serial>` link).
    pub fn virtio(index: u8, serial: &str, size: u64) -> Self {
        let id = format!("vd{}", char::from(b'a' + index));
        let slot = 4 + index;
        let mut spec = Self::base(&id, size);
        spec.serial = serial.to_owned();
        spec.modalias = "virtio:d00000002v00001AF4".into();
        spec.bus_path = format!("/pci0000:00/0000:00:{slot:02x}.0/virtio{slot}");
        spec.transport = "virtio".into();
        // QEMU's virtio-blk reports rotational=1 unless told otherwise.
        spec.rotational = true;
        let mut links = vec![format!("/dev/disk/by-path/pci-0000:00:{slot:02x}.0")];
        if !serial.is_empty() {
            links.push(format!("/dev/disk/by-id/virtio-{}", by_id_part(serial)));
        }
        spec.symlinks = links;
        Self::finish(&id, spec)
    }

    /// An SD card / eMMC `mmcblk<index>` (transport `mmc` from the name); no model file.
    pub(crate) fn mmc(index: u8, serial: &str, size: u64) -> Self {
        let id = format!("mmcblk{index}");
        let mut spec = Self::base(&id, size);
        spec.serial = serial.to_owned();
        spec.modalias = "mmc:block".into();
        spec.bus_path = format!("/platform/fe330000.mmc/mmc_host/mmc{index}/mmc{index}:0001");
        spec.transport = "mmc".into();
        spec.symlinks = vec![
            format!("/dev/disk/by-id/mmc-SC64G_{}", by_id_part(serial)),
            "/dev/disk/by-path/platform-fe330000.mmc".into(),
        ];
        Self::finish(&id, spec)
    }

    /// A SATA CD-ROM `sr<index>` with media: `cdrom` and `readonly` set; Talos lists it as a
    /// disk (disks.go keeps CDs, reporting size 0 when there is no media).
    pub fn cdrom(index: u8, model: &str, size: u64) -> Self {
        let id = format!("sr{index}");
        let port = 5 + index;
        let mut spec = Self::base(&id, size);
        spec.model = model.to_owned();
        spec.serial = format!("QM0000{index}");
        spec.modalias = "scsi:t-0x05".into();
        spec.bus_path =
            format!("/pci0000:00/0000:00:1f.2/ata{port}/host{port}/target{port}:0:0/{port}:0:0:0");
        spec.transport = "sata".into();
        spec.readonly = true;
        spec.cdrom = true;
        spec.symlinks = vec![
            format!("/dev/disk/by-id/ata-{}_QM0000{index}", by_id_part(model)),
            format!("/dev/disk/by-path/pci-0000:00:1f.2-ata-{port}"),
        ];
        Self::finish(&id, spec)
    }

    /// The same disk under another kernel name (enumeration changed): ID and `dev_path`.
    pub(crate) fn renamed(mut self, id: &str) -> Self {
        self.spec.dev_path = format!("/dev/{id}");
        self.id = id.to_owned();
        self
    }

    /// `storage.Disks` entry for this disk, as storaged derives it (siderolabs/talos v1.13.9
    /// `internal/app/storaged/server.go`, `diskConv`): `device_name` is the **full path**
    /// `filepath.Join("/dev", id)`; the type is CD if cdrom, else NVME for transport nvme,
    /// SD for mmc, HDD if rotational, SSD for any other non-empty transport, else UNKNOWN.
    pub fn legacy(&self, system_disk: bool) -> storage::Disk {
        use storage::disk::DiskType as T;
        let s = &self.spec;
        let kind = if s.cdrom {
            T::Cd
        } else if s.transport == "nvme" {
            T::Nvme
        } else if s.transport == "mmc" {
            T::Sd
        } else if s.rotational {
            T::Hdd
        } else if !s.transport.is_empty() {
            T::Ssd
        } else {
            T::Unknown
        };
        storage::Disk {
            device_name: format!("/dev/{}", self.id),
            model: s.model.clone(),
            size: s.size,
            serial: s.serial.clone(),
            modalias: s.modalias.clone(),
            wwid: s.wwid.clone(),
            uuid: s.uuid.clone(),
            r#type: kind as i32,
            bus_path: s.bus_path.clone(),
            system_disk,
            subsystem: s.sub_system.clone(),
            readonly: s.readonly,
            ..Default::default()
        }
    }
}

/// The disks in the order Talos lists them: COSI's in-memory state returns a List sorted by
/// resource ID (cosi-project/runtime v1.14.1 `pkg/state/impl/inmem/collection.go`, `List`),
/// and both `storage.Disks` and the install task's `MatchDisks` iterate that list.
pub(crate) fn talos_order(disks: &[SimDisk]) -> Vec<SimDisk> {
    let mut v = disks.to_vec();
    v.sort_by(|a, b| a.id.cmp(&b.id));
    v
}

/// ryanuber/go-glob v1.0.0 `Glob`, the `glob()` of Talos's disk CEL environment
/// (`pkg/machinery/cel/celenv/celenv.go`): only `*` is special.
fn go_glob(pattern: &str, subj: &str) -> bool {
    if pattern.is_empty() {
        return subj.is_empty();
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return subj == pattern;
    }
    let mut rest = subj;
    let last = parts.len() - 1;
    for (i, part) in parts[..last].iter().enumerate() {
        let Some(idx) = rest.find(part) else {
            return false;
        };
        if i == 0 && !pattern.starts_with('*') && idx != 0 {
            return false;
        }
        rest = &rest[idx + part.len()..];
    }
    pattern.ends_with('*') || rest.ends_with(parts[last])
}

/// `humanize.ParseBytes` (go-humanize v1.0.1) behind the `size` matcher.
fn parse_bytes(s: &str) -> Option<u64> {
    let digits = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(s.len());
    let f: f64 = s[..digits].replace(',', "").parse().ok()?;
    let mult: u64 = match s[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "ki" | "kib" => 1 << 10,
        "m" | "mb" => 1000u64.pow(2),
        "mi" | "mib" => 1 << 20,
        "g" | "gb" => 1000u64.pow(3),
        "gi" | "gib" => 1 << 30,
        "t" | "tb" => 1000u64.pow(4),
        "ti" | "tib" => 1 << 40,
        "p" | "pb" => 1000u64.pow(5),
        "pi" | "pib" => 1 << 50,
        "e" | "eb" => 1000u64.pow(6),
        "ei" | "eib" => 1 << 60,
        _ => return None,
    };
    let v = f * mult as f64;
    (v < u64::MAX as f64).then_some(v as u64)
}

/// Why Talos's install task finds no disk, in its own words (the sources are those of
/// [`talos_install_disk`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallDiskError {
    /// `diskSelector.name` (`DiskMatchExpression` refuses it).
    #[error("failed to get disk match expression: selector on name is not supported")]
    NameSelector,
    /// `diskSelector.size` that `InstallDiskSizeMatcher` cannot parse.
    #[error("failed to parse disk size {0}")]
    Size(String),
    /// `diskSelector.type` outside nvme, sd, hdd, ssd.
    #[error("unsupported disk type {0:?}")]
    Type(String),
    /// The selector matches no disk.
    #[error("no disks matched the expression")]
    NoMatch,
    /// Neither `disk` nor `diskSelector`.
    #[error("either install disk or diskSelector should be defined")]
    Unset,
    /// `disk` names a path the node does not have (`filepath.EvalSymlinks`).
    #[error("lstat {0}: no such file or directory")]
    NoSuchPath(String),
}

/// The disk Talos's install task writes to for the applied `machine.install` section
/// (siderolabs/talos v1.13.9 `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go`,
/// `Install`): a `diskSelector` wins over `disk`; it is compiled to the CEL expression of
/// `pkg/machinery/config/types/v1alpha1/v1alpha1_provider.go` `DiskMatchExpression` and
/// evaluated over every disk in list order, the first match (`matchedDisks[0].DevPath`) is
/// taken, none is an error; a `disk` path goes through `filepath.EvalSymlinks`, which on the
/// node resolves a `/dev/disk/...` link to its device (and fails for a path that is not there).
pub(crate) fn talos_install_disk(
    install: &yaml_serde::Value,
    disks: &[SimDisk],
) -> Result<String, InstallDiskError> {
    let disks = talos_order(disks);
    if let Some(sel) = install.get("diskSelector").filter(|v| !v.is_null()) {
        let selector = LegacySelector::read(sel)?;
        return disks
            .iter()
            .find(|d| selector.matches(&d.spec))
            .map(|d| d.spec.dev_path.clone())
            .ok_or(InstallDiskError::NoMatch);
    }
    install_disk_by_path(install, &disks)
}

/// A `machine.install.diskSelector` as Talos reads it: the parts `DiskMatchExpression`
/// turns into CEL terms, read once so that matching is only comparisons.
struct LegacySelector {
    /// `size` as operator and bytes (`InstallDiskSizeMatcher`).
    size: Option<(&'static str, u64)>,
    /// `type` (empty when not given).
    kind: String,
    /// The glob fields by selector key, empty patterns included (they match anything).
    globs: [(&'static str, String); 6],
}

impl LegacySelector {
    /// Reads the selector, refusing what Talos refuses, in its order: `name`, then a size
    /// it cannot parse, then an unknown `type`.
    fn read(sel: &yaml_serde::Value) -> Result<Self, InstallDiskError> {
        use yaml_serde::Value;
        let text = |k: &str| -> String {
            match sel.get(k) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            }
        };
        if !text("name").is_empty() {
            return Err(InstallDiskError::NameSelector);
        }
        let size = match sel.get("size") {
            None | Some(Value::Null) => None,
            Some(_) => Some(size_condition(&text("size"))?),
        };
        let kind = text("type");
        if !matches!(kind.as_str(), "" | "nvme" | "sd" | "hdd" | "ssd") {
            return Err(InstallDiskError::Type(kind));
        }
        let globs = [
            ("uuid", text("uuid")),
            ("wwid", text("wwid")),
            ("model", text("model")),
            ("serial", text("serial")),
            ("modalias", text("modalias")),
            ("busPath", text("busPath")),
        ];
        Ok(Self { size, kind, globs })
    }

    /// `DiskMatchExpression`'s terms: size, the globs, a transport, the type, and never a
    /// read-only disk or a CD-ROM.
    fn matches(&self, d: &block::DiskSpec) -> bool {
        let size_ok = self.size.is_none_or(|(op, n)| match op {
            ">=" => d.size >= n,
            "<=" => d.size <= n,
            ">" => d.size > n,
            "<" => d.size < n,
            _ => d.size == n,
        });
        let globs_ok = self.globs.iter().all(|(field, pat)| {
            let value = match *field {
                "uuid" => &d.uuid,
                "wwid" => &d.wwid,
                "model" => &d.model,
                "serial" => &d.serial,
                "modalias" => &d.modalias,
                _ => &d.bus_path,
            };
            pat.is_empty() || go_glob(pat, value)
        });
        let type_ok = match self.kind.as_str() {
            "nvme" => d.transport == "nvme",
            "sd" => d.transport == "mmc",
            "hdd" => d.rotational,
            "ssd" => !d.rotational,
            _ => true,
        };
        size_ok && globs_ok && !d.transport.is_empty() && type_ok && !d.readonly && !d.cdrom
    }
}

/// `InstallDiskSizeMatcher.UnmarshalYAML`: an optional operator (`==` when none), then
/// `humanize.ParseBytes`.
fn size_condition(text: &str) -> Result<(&'static str, u64), InstallDiskError> {
    let cond = text.trim();
    let (op, rest) = [">=", "<=", ">", "<", "=="]
        .iter()
        .find_map(|op| cond.strip_prefix(op).map(|r| (*op, r)))
        .unwrap_or(("==", cond));
    let n = parse_bytes(rest.trim()).ok_or_else(|| InstallDiskError::Size(rest.to_owned()))?;
    Ok((op, n))
}

/// `disk` through `filepath.EvalSymlinks`: the disk whose path, or one of whose
/// `/dev/disk/...` links, it names.
fn install_disk_by_path(
    install: &yaml_serde::Value,
    disks: &[SimDisk],
) -> Result<String, InstallDiskError> {
    let path = install
        .get("disk")
        .and_then(yaml_serde::Value::as_str)
        .filter(|p| !p.is_empty())
        .ok_or(InstallDiskError::Unset)?;
    disks
        .iter()
        .find(|d| d.spec.dev_path == path || d.spec.symlinks.iter().any(|s| s == path))
        .map(|d| d.spec.dev_path.clone())
        .ok_or_else(|| InstallDiskError::NoSuchPath(path.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_size_is_humanize_bytes() {
        assert_eq!(humanize_bytes(5), "5 B");
        assert_eq!(humanize_bytes(100_000_000_000), "100 GB");
        assert_eq!(humanize_bytes(512_110_190_592), "512 GB");
        assert_eq!(humanize_bytes(4_000_787_030_016), "4.0 TB");
        assert_eq!(humanize_bytes(1_500_000_000), "1.5 GB");
    }

    #[test]
    fn legacy_reply_is_derived_as_storaged_does() {
        use storage::disk::DiskType as T;
        let nvme = SimDisk::nvme(0, "Samsung SSD 980 PRO 500GB", "S1", 500_000_000_000);
        let l = nvme.legacy(false);
        assert_eq!(l.device_name, "/dev/nvme0n1");
        assert_eq!(l.r#type, T::Nvme as i32);
        assert_eq!(nvme.id, "nvme0n1");
        assert_eq!(nvme.spec.dev_path, "/dev/nvme0n1");
        let hdd = SimDisk::sata(0, "ST4000NM000A", "ZC1", 4_000_000_000_000, true);
        assert_eq!(hdd.legacy(false).r#type, T::Hdd as i32);
        let ssd = SimDisk::sata(1, "INTEL SSDSC2KB480G8", "PHYF1", 480_000_000_000, false);
        assert_eq!(ssd.legacy(false).r#type, T::Ssd as i32);
        assert_eq!(ssd.legacy(false).device_name, "/dev/sdb");
        assert_eq!(
            SimDisk::mmc(0, "0x1", 64_000_000_000).legacy(false).r#type,
            T::Sd as i32
        );
        assert_eq!(
            SimDisk::cdrom(0, "QEMU DVD-ROM", 1).legacy(false).r#type,
            T::Cd as i32
        );
        let mut dm = SimDisk::virtio(0, "x", 1);
        dm.spec.transport.clear();
        dm.spec.rotational = false;
        assert_eq!(dm.legacy(false).r#type, T::Unknown as i32);
        assert!(ssd.spec.symlinks.windows(2).all(|w| w[0] <= w[1]));
    }

    fn install(yaml: &str) -> yaml_serde::Value {
        yaml_serde::from_str(yaml).unwrap()
    }

    #[test]
    fn talos_takes_the_first_match_in_id_order() {
        let disks = vec![
            SimDisk::sata(0, "INTEL SSDSC2KB480G8", "PHYF1", 480_000_000_000, false),
            SimDisk::nvme(1, "Samsung SSD 980", "S2", 1_000_000_000_000),
            SimDisk::nvme(0, "Samsung SSD 980", "S1", 500_000_000_000),
        ];
        // `type: ssd` is "not rotational": the NVMe disks match and sort first.
        assert_eq!(
            talos_install_disk(&install("diskSelector: {type: ssd}"), &disks).unwrap(),
            "/dev/nvme0n1"
        );
        assert_eq!(
            talos_install_disk(&install("diskSelector: {model: 'INTEL*'}"), &disks).unwrap(),
            "/dev/sda"
        );
        // `?` is literal for go-glob.
        assert!(talos_install_disk(&install("diskSelector: {serial: 'S?'}"), &disks).is_err());
        assert_eq!(
            talos_install_disk(&install("diskSelector: {size: '>= 1TB'}"), &disks).unwrap(),
            "/dev/nvme1n1"
        );
        let link = &disks[1].spec.symlinks[0];
        assert_eq!(
            talos_install_disk(&install(&format!("disk: {link}")), &disks).unwrap(),
            "/dev/nvme1n1"
        );
        assert!(talos_install_disk(&install("disk: /dev/vda"), &disks).is_err());
    }

    #[test]
    fn go_glob_only_star_is_special() {
        assert!(go_glob("*", ""));
        assert!(go_glob("a*b*c", "aXbYc"));
        assert!(!go_glob("a*b", "aXbY"));
        assert!(go_glob("*a*a", "aa"));
        assert!(!go_glob("ab*ab", "ab"));
        assert!(!go_glob("S?", "S1"));
        assert!(go_glob("S?", "S?"));
        assert!(!go_glob("", "x"));
    }
}
