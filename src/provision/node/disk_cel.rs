//! The v1.14 disk check before a config is applied: every CEL disk selector in the rendered
//! config (the `UnattendedInstallConfig` install disk, then every volume document's
//! `provisioning.diskSelector.match`) evaluated against the disks the node reported in
//! maintenance mode, with Talos's rules from [`crate::talosfacts::disk_cel`]. Pure: rendered
//! bytes and facts in, the install disk or a refusal out.
//!
//! The expressions are read back from the rendered documents rather than from the inventory,
//! so what is evaluated is exactly what the node receives, operator patches included.
//!
//! An install selector that targets a `RAIDArrayConfig` array by its `md-name-talos:<name>`
//! link cannot match a reported disk (the array is created only once the config is
//! applied), so for it the array's member selector is checked instead, and the array must
//! be one Talos can boot from (raid1, metadata 1.0).

use crate::inventory::storage::md_device_path;
use crate::store::DiskFacts;
use crate::talosfacts::disk_cel::{
    CelDisk, CelRefusal, Choice, Purpose, choose, choose_members, compile_for,
};

/// The COSI `DiskSpec` a stored disk fact stands for: what the CEL `disk` variable holds.
pub(crate) fn cel_disk(d: &DiskFacts) -> CelDisk {
    CelDisk {
        size: d.size,
        io_size: d.io_size,
        sector_size: d.sector_size,
        readonly: d.readonly,
        model: d.model.clone(),
        serial: d.serial.clone(),
        modalias: d.modalias.clone(),
        wwid: d.wwid.clone(),
        bus_path: d.bus_path.clone(),
        sub_system: d.sub_system.clone(),
        transport: d.transport.clone(),
        rotational: d.rotational,
        cdrom: d.cdrom,
        dev_path: d.dev_path.clone(),
        pretty_size: d.pretty_size.clone(),
        secondary_disks: d.secondary_disks.clone(),
        uuid: d.uuid.clone(),
        symlinks: d.symlinks.clone(),
        firmware_version: d.firmware_version.clone(),
    }
}

/// The volume documents whose `provisioning.diskSelector.match` Talos evaluates in the
/// `DiskLocator` environment (`pkg/machinery/config/types/block`).
const VOLUME_KINDS: [&str; 4] = [
    "VolumeConfig",
    "UserVolumeConfig",
    "RawVolumeConfig",
    "SwapVolumeConfig",
];

/// What the check found: the install disk and each volume's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Picks {
    /// The install disk's `dev_path`.
    pub(crate) install: Choice,
    /// Each volume selector (`<kind> <name>`) and its disk.
    pub(crate) volumes: Vec<(String, Choice)>,
    /// Each `RAIDArrayConfig` array by name, with its member disks.
    pub(crate) arrays: Vec<(String, Vec<String>)>,
}

/// Why the check could not run or refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiskCheckError {
    /// A selector picks no disk, several, or cannot be evaluated.
    #[error(transparent)]
    Refused(#[from] CelRefusal),
    /// The rendered config has no `UnattendedInstallConfig` selector to evaluate.
    #[error(
        "the rendered config has no UnattendedInstallConfig provisioning.diskSelector.match \
         (a patch removed it?), so the install disk Talos picks cannot be known"
    )]
    NoInstallSelector,
    /// The node's COSI `block.Disk` resources could not be read, so the fields the
    /// expressions test (transport, rotational, symlinks) are unknown.
    #[error(
        "the node did not list its block.Disk resources (COSI), so what its disk selectors \
         match cannot be known"
    )]
    NoBlockFacts,
    /// The rendered config is not the YAML talboot wrote (never expected).
    #[error("the rendered config does not read back as YAML: {0}")]
    Unreadable(String),
    /// The install selector targets an array Talos cannot boot from (Talos does not check).
    #[error(
        "the install disk is RAID array {name} ({device}), which the firmware cannot boot \
         from: {why}"
    )]
    BootArray {
        /// The array.
        name: String,
        /// Its device link.
        device: String,
        /// What is wrong.
        why: String,
    },
    /// A `RAIDArrayConfig` without `provisioning.volumeSelector.match` (Talos refuses it).
    #[error(
        "RAIDArrayConfig {0} has no provisioning.volumeSelector.match (Talos refuses it: \
         \"provisioning.volumeSelector.match is required\")"
    )]
    ArrayWithoutSelector(String),
    /// A volume selector picks a disk that a RAID array takes as a member.
    #[error(
        "{what} would be placed on {disk}, which RAID array {array} takes as a member; \
         select a disk outside the array, or leave diskSelector out to place it on the \
         system disk"
    )]
    OnRaidMember {
        /// The volume document.
        what: String,
        /// The disk.
        disk: String,
        /// The array.
        array: String,
    },
    /// A volume's `minSize` is not a size Talos reads.
    #[error("{what}: provisioning.minSize {text:?} is not a size Talos reads")]
    MinSize {
        /// The document.
        what: String,
        /// The value.
        text: String,
    },
}

fn str_at<'a>(doc: &'a yaml_serde::Value, path: &[&str]) -> Option<&'a str> {
    let mut v = doc;
    for key in path {
        v = v.get(*key)?;
    }
    v.as_str()
}

/// A document's `provisioning.diskSelector.match`.
fn selector_of(doc: &yaml_serde::Value) -> Option<&str> {
    str_at(doc, &["provisioning", "diskSelector", "match"])
}

/// A document's `kind` (empty for the v1alpha1 document).
fn kind_of(doc: &yaml_serde::Value) -> &str {
    str_at(doc, &["kind"]).unwrap_or_default()
}

/// A `RAIDArrayConfig` of the rendered config.
struct Array<'a> {
    name: &'a str,
    level: Option<&'a str>,
    /// `metadata` as text (`1.0` written without quotes reads as a float).
    metadata: Option<String>,
    selector: Option<&'a str>,
}

fn arrays_of(docs: &[yaml_serde::Value]) -> Vec<Array<'_>> {
    docs.iter()
        .filter(|d| kind_of(d) == "RAIDArrayConfig")
        .map(|d| Array {
            name: str_at(d, &["name"]).unwrap_or_default(),
            level: str_at(d, &["level"]),
            metadata: d.get("metadata").map(|m| match (m.as_str(), m.as_f64()) {
                (Some(s), _) => s.to_owned(),
                (None, Some(f)) => format!("{f:.1}"),
                _ => format!("{m:?}"),
            }),
            selector: str_at(d, &["provisioning", "volumeSelector", "match"]),
        })
        .collect()
}

/// The array the install selector targets by its link, as Talos's RAID-boot test writes it.
fn boot_array<'a>(install: &str, arrays: &'a [Array<'a>]) -> Option<&'a Array<'a>> {
    arrays
        .iter()
        .find(|a| install.trim() == format!("\"{}\" in disk.symlinks", md_device_path(a.name)))
}

/// What the firmware needs of an array it boots from and Talos does not check: raid1 (the
/// default level) and metadata 1.0 (the default), whose superblock at the end of each member
/// leaves the partition table where the firmware looks.
fn bootable(a: &Array<'_>) -> Result<(), DiskCheckError> {
    let why = match (a.level, a.metadata.as_deref()) {
        (Some(l), _) if l != "raid1" => format!("level {l}; only raid1 mirrors boot"),
        (_, Some(m)) if m != "1.0" => format!(
            "metadata {m}; a boot array needs metadata 1.0, whose superblock sits at the end \
             of each member so the firmware reads it as a plain disk"
        ),
        _ => return Ok(()),
    };
    Err(DiskCheckError::BootArray {
        name: a.name.to_owned(),
        device: md_device_path(a.name),
        why,
    })
}

/// Evaluates every disk selector of the rendered `config` against `disks`: the install
/// selector first (its pick is the system disk the volume selectors see; for an install onto
/// a RAID array, the array's members), then every array's members, then each volume selector
/// in document order.
pub(crate) fn check_rendered(config: &[u8], disks: &[DiskFacts]) -> Result<Picks, DiskCheckError> {
    let docs = read_docs(config)?;
    if disks.iter().any(|d| !d.from_cosi) {
        return Err(DiskCheckError::NoBlockFacts);
    }
    let facts: Vec<CelDisk> = disks.iter().map(cel_disk).collect();
    let arrays = arrays_of(&docs);
    let mut members = Vec::new();
    for a in &arrays {
        let text = a
            .selector
            .ok_or_else(|| DiskCheckError::ArrayWithoutSelector(a.name.to_owned()))?;
        members.push((a.name.to_owned(), choose_members(a.name, text, &facts)?));
    }

    let install_text = docs
        .iter()
        .filter(|d| kind_of(d) == "UnattendedInstallConfig")
        .find_map(selector_of)
        .ok_or(DiskCheckError::NoInstallSelector)?;
    let install = match boot_array(install_text, &arrays) {
        Some(a) => {
            bootable(a)?;
            let matched = members
                .iter()
                .find(|(n, _)| n == a.name)
                .map(|(_, m)| m.clone())
                .unwrap_or_default();
            Choice {
                disk: md_device_path(a.name),
                matched,
            }
        }
        None => {
            let what = "UnattendedInstallConfig";
            let expr = compile_for(what, install_text, &facts)?;
            choose(what, &expr, &facts, &Purpose::Install)?
        }
    };
    let volumes = volume_picks(&docs, &facts, &install, &members)?;
    Ok(Picks {
        install,
        volumes,
        arrays: members,
    })
}

/// The rendered config as YAML documents.
fn read_docs(config: &[u8]) -> Result<Vec<yaml_serde::Value>, DiskCheckError> {
    use serde::Deserialize;
    let text =
        std::str::from_utf8(config).map_err(|e| DiskCheckError::Unreadable(e.to_string()))?;
    let mut docs = Vec::new();
    for de in yaml_serde::Deserializer::from_str(text) {
        docs.push(
            yaml_serde::Value::deserialize(de)
                .map_err(|e| DiskCheckError::Unreadable(e.to_string()))?,
        );
    }
    Ok(docs)
}

/// Each volume document's disk, in document order; a disk a RAID array takes is refused.
fn volume_picks(
    docs: &[yaml_serde::Value],
    facts: &[CelDisk],
    install: &Choice,
    arrays: &[(String, Vec<String>)],
) -> Result<Vec<(String, Choice)>, DiskCheckError> {
    let mut volumes = Vec::new();
    for d in docs {
        let k = kind_of(d);
        if !VOLUME_KINDS.contains(&k) {
            continue;
        }
        // Without a selector a system volume stays on the system disk (default `system_disk`).
        let Some(text) = selector_of(d) else { continue };
        let what = format!("{k} {}", str_at(d, &["name"]).unwrap_or("?"));
        let min_size = match str_at(d, &["provisioning", "minSize"]) {
            None => 0,
            Some(s) => {
                crate::inventory::size::parse_bytes(s).map_err(|_| DiskCheckError::MinSize {
                    what: what.clone(),
                    text: s.to_owned(),
                })?
            }
        };
        let purpose = Purpose::Volume {
            whole_disk: str_at(d, &["volumeType"]) == Some("disk"),
            min_size,
            system_disk: install.disk.clone(),
        };
        let expr = compile_for(&what, text, facts)?;
        let choice = choose(&what, &expr, facts, &purpose)?;
        if let Some((array, _)) = arrays.iter().find(|(_, m)| m.contains(&choice.disk)) {
            return Err(DiskCheckError::OnRaidMember {
                what,
                disk: choice.disk,
                array: array.clone(),
            });
        }
        volumes.push((what, choice));
    }
    Ok(volumes)
}

#[cfg(test)]
mod raid_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machineconfig::contract::{
        LegacySelector, install_disk_expression, selector_expression,
    };
    use crate::talosfacts::disk_cel::{RefusalKind, compile, eval};

    fn refusal_kind(e: &DiskCheckError) -> Option<&RefusalKind> {
        match e {
            DiskCheckError::Refused(r) => Some(r.reason.as_ref()),
            _ => None,
        }
    }

    fn fact(id: &str, size: u64, transport: &str) -> DiskFacts {
        DiskFacts {
            dev_path: format!("/dev/{id}"),
            model: String::new(),
            serial: format!("SN-{id}"),
            size,
            wwid: String::new(),
            uuid: String::new(),
            modalias: String::new(),
            bus_path: String::new(),
            transport: transport.into(),
            rotational: false,
            kind: None,
            readonly: false,
            cdrom: false,
            symlinks: vec![format!("/dev/disk/by-id/x-{id}")],
            io_size: 512,
            sector_size: 512,
            sub_system: "/sys/class/block".into(),
            pretty_size: String::new(),
            secondary_disks: Vec::new(),
            firmware_version: String::new(),
            from_cosi: true,
        }
    }

    const TB: u64 = 1_000_000_000_000;

    fn rack() -> Vec<DiskFacts> {
        vec![
            fact("nvme2n1", 4 * TB, "nvme"),
            fact("nvme0n1", 2 * TB, "nvme"),
            fact("nvme1n1", 4 * TB, "nvme"),
        ]
    }

    const INSTALL: &str = "apiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller: {}\n\
        provisioning:\n  diskSelector:\n    match: disk.dev_path == \"/dev/nvme0n1\"\n  wipe: false\n";
    const GARAGE: &str = "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: garage-data\n\
        provisioning:\n  diskSelector:\n    match: disk.transport == \"nvme\" && !system_disk\n  \
        minSize: 1TB\nfilesystem:\n  type: xfs\n";
    const EPHEMERAL: &str = "apiVersion: v1alpha1\nkind: VolumeConfig\nname: EPHEMERAL\n\
        provisioning:\n  maxSize: 50GiB\n";

    fn config(docs: &[&str]) -> Vec<u8> {
        docs.join("---\n").into_bytes()
    }

    /// (iii, iv) What the renderer writes compiles in Talos's environment and picks the disk
    /// the path or selector names.
    #[test]
    fn rendered_install_expressions_compile_and_pick_their_disk() {
        let disks: Vec<CelDisk> = rack().iter().map(cel_disk).collect();
        let by_path = compile(&install_disk_expression("/dev/nvme1n1")).unwrap();
        let by_link = compile(&install_disk_expression("/dev/disk/by-id/x-nvme1n1")).unwrap();
        for e in [by_path, by_link] {
            let hits: Vec<_> = disks
                .iter()
                .filter(|d| eval(&e, d, Some(false)).unwrap())
                .map(|d| d.dev_path.as_str())
                .collect();
            assert_eq!(hits, ["/dev/nvme1n1"], "{e}");
        }
        let sel = selector_expression(&LegacySelector {
            size: Some("<= 3TB".into()),
            disk_type: Some("nvme".into()),
            ..Default::default()
        })
        .unwrap();
        let c = choose("X", &compile(&sel).unwrap(), &disks, &Purpose::Install).unwrap();
        assert_eq!(c.disk, "/dev/nvme0n1");
    }

    #[test]
    fn the_example_rack_is_refused_over_two_data_disks() {
        let err = check_rendered(&config(&[INSTALL, EPHEMERAL, GARAGE]), &rack()).unwrap_err();
        let DiskCheckError::Refused(r) = &err else {
            panic!("{err}")
        };
        assert_eq!(r.what, "UserVolumeConfig garage-data");
        assert!(
            matches!(r.reason.as_ref(), RefusalKind::Ambiguous { pick, .. } if pick == "/dev/nvme1n1"),
            "{err}"
        );
        let picks = check_rendered(&config(&[INSTALL, EPHEMERAL, GARAGE]), &rack()[1..]).unwrap();
        assert_eq!(picks.install.disk, "/dev/nvme0n1");
        assert_eq!(
            picks.volumes,
            vec![(
                "UserVolumeConfig garage-data".to_owned(),
                Choice {
                    disk: "/dev/nvme1n1".into(),
                    matched: vec!["/dev/nvme1n1".into()]
                }
            )]
        );
    }

    /// The refusal as the operator reads it (`talboot status`, the node's event).
    #[test]
    fn the_refusal_names_the_document_the_expression_talos_pick_and_every_disk() {
        let err = check_rendered(&config(&[INSTALL, EPHEMERAL, GARAGE]), &rack()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "UserVolumeConfig garage-data selector `disk.transport == \"nvme\" && !system_disk` \
             matches 2 disks (/dev/nvme1n1, /dev/nvme2n1) but must match exactly one; Talos \
             would take the first in its order, /dev/nvme1n1; narrow the expression \
             (disk.serial, disk.wwid or \"<link>\" in disk.symlinks stay stable when device \
             names change). The node reports 3 disk(s):\n  \
             /dev/nvme0n1 model=- serial=SN-nvme0n1 size=2000000000000u busPath=- transport=nvme\n  \
             /dev/nvme1n1 model=- serial=SN-nvme1n1 size=4000000000000u busPath=- transport=nvme\n  \
             /dev/nvme2n1 model=- serial=SN-nvme2n1 size=4000000000000u busPath=- transport=nvme"
        );
    }

    #[test]
    fn an_install_selector_matching_nothing_is_refused_with_every_disk() {
        let cfg = config(&[&INSTALL.replace("/dev/nvme0n1", "/dev/sda")]);
        let err = check_rendered(&cfg, &rack()).unwrap_err();
        assert!(
            matches!(refusal_kind(&err), Some(RefusalKind::NoMatch)),
            "{err}"
        );
        let text = err.to_string();
        for d in ["/dev/nvme0n1", "/dev/nvme1n1", "/dev/nvme2n1"] {
            assert!(text.contains(&format!("\n  {d} ")), "{text}");
        }
        assert!(matches!(
            check_rendered(&config(&[EPHEMERAL]), &rack()),
            Err(DiskCheckError::NoInstallSelector)
        ));
        let mut legacy_only = rack();
        legacy_only[1].from_cosi = false;
        assert!(matches!(
            check_rendered(&config(&[INSTALL]), &legacy_only),
            Err(DiskCheckError::NoBlockFacts)
        ));
    }

    #[test]
    fn an_invalid_volume_selector_is_refused() {
        let bad = GARAGE.replace("!system_disk", "disk.size > 10 * GiB");
        let err = check_rendered(&config(&[INSTALL, &bad]), &rack()).unwrap_err();
        assert!(
            matches!(refusal_kind(&err), Some(RefusalKind::Invalid(_))),
            "{err}"
        );
    }

    /// (xi) talboot's CEL evaluation of the expression Talos builds from a legacy selector
    /// picks the same disk (first match in Talos's order) as the Talos double's install task,
    /// which is written from the legacy matcher, not from CEL.
    #[cfg(feature = "sim")]
    mod against_the_double {
        use super::*;
        use crate::sim::disks::{SimDisk, talos_install_disk};
        use proptest::prelude::*;

        const T: u64 = 1_000_000_000_000;

        proptest! {
            #[test]
            fn cel_picks_what_the_install_task_picks(
                spec in proptest::collection::vec((0u8..5, 0u8..3, 1u64..6, any::<bool>()), 1..6),
                kind in 0u8..5,
                size in (0u8..6, 0u64..6),
                model in 0u8..4,
            ) {
                let mut disks: Vec<SimDisk> = Vec::new();
                for (i, (bus, n, tb, rot)) in spec.iter().enumerate() {
                    let serial = format!("S{i}");
                    let m = if *rot { "WD Red" } else { "Samsung SSD 980" };
                    let d = match bus {
                        0 => SimDisk::nvme(*n, m, &serial, tb * T),
                        1 => SimDisk::sata(*n, m, &serial, tb * T, *rot),
                        2 => SimDisk::mmc(*n, &serial, tb * T),
                        3 => SimDisk::cdrom(*n, "DVD", tb * T),
                        _ => SimDisk::virtio(*n, &serial, tb * T),
                    };
                    if !disks.iter().any(|x| x.id == d.id) {
                        disks.push(d);
                    }
                }
                let disk_type = ["ssd", "hdd", "nvme", "sd", ""][kind as usize];
                let ops = ["", ">= ", "<= ", "> ", "< ", "== "];
                let size_text = (size.1 > 0).then(|| format!("{}{}TB", ops[size.0 as usize], size.1));
                let model_pat = ["", "Samsung*", "*Red", "WD*Red"][model as usize];
                let sel = LegacySelector {
                    size: size_text.clone(),
                    model: (!model_pat.is_empty()).then(|| model_pat.to_owned()),
                    disk_type: (!disk_type.is_empty()).then(|| disk_type.to_owned()),
                    ..Default::default()
                };
                let expr = compile(&selector_expression(&sel).unwrap()).unwrap();
                let cel: Vec<CelDisk> = disks
                    .iter()
                    .map(|d| CelDisk {
                        size: d.spec.size,
                        readonly: d.spec.readonly,
                        model: d.spec.model.clone(),
                        serial: d.spec.serial.clone(),
                        transport: d.spec.transport.clone(),
                        rotational: d.spec.rotational,
                        cdrom: d.spec.cdrom,
                        dev_path: d.spec.dev_path.clone(),
                        ..Default::default()
                    })
                    .collect();
                let ours = crate::talosfacts::disk_cel::talos_order(&cel)
                    .into_iter()
                    .find(|d| eval(&expr, d, Some(false)).unwrap())
                    .map(|d| d.dev_path.clone());
                let mut yaml = String::from("diskSelector:\n");
                if let Some(s) = &size_text {
                    yaml.push_str(&format!("  size: \"{s}\"\n"));
                }
                if !model_pat.is_empty() {
                    yaml.push_str(&format!("  model: \"{model_pat}\"\n"));
                }
                if !disk_type.is_empty() {
                    yaml.push_str(&format!("  type: {disk_type}\n"));
                }
                if yaml.ends_with(":\n") {
                    yaml.push_str("  busPath: \"*\"\n");
                }
                let talos = talos_install_disk(&yaml_serde::from_str(&yaml).unwrap(), &disks).ok();
                prop_assert_eq!(ours, talos, "{:?}", sel);
            }
        }
    }
}
