//! The install-disk rules against hand-made disks, Talos's own selector test cases, and
//! property tests of the glob and of the selection order against reference models.

use proptest::prelude::*;

use super::*;
use crate::sim::disks::SimDisk;

/// Facts exactly as a v1.13.9 node reports these disks (COSI + storage.Disks).
fn facts(disks: &[SimDisk]) -> Vec<DiskFacts> {
    let legacy: Vec<storage::Disk> = disks.iter().map(|d| d.legacy(false)).collect();
    let cosi: Vec<CosiDisk> = disks
        .iter()
        .map(|d| CosiDisk {
            id: d.id.clone(),
            spec: d.spec.clone(),
        })
        .collect();
    DiskFacts::collect(&legacy, &cosi)
}

/// Enumerated as a kernel would: nvme1n1 listed before nvme0n1, SATA last.
fn rack() -> Vec<SimDisk> {
    vec![
        SimDisk::nvme(1, "Samsung SSD 980", "S2", 1_000_204_886_016),
        SimDisk::nvme(0, "Samsung SSD 980", "S1", 500_107_862_016),
        SimDisk::sata(0, "ST4000NM000A", "H1", 4_000_787_030_016, true),
    ]
}

fn sel(f: impl FnOnce(&mut DiskSelector)) -> InstallTarget {
    let mut s = DiskSelector::default();
    f(&mut s);
    InstallTarget::Selector(s)
}

fn path(p: &str) -> InstallTarget {
    InstallTarget::Disk(p.into())
}

#[test]
fn storage_disks_full_path_is_not_prefixed_again() {
    // storaged: DeviceName = filepath.Join("/dev", id); COSI id is the bare name.
    let f = facts(&rack());
    let paths: Vec<&str> = f.iter().map(|d| d.dev_path.as_str()).collect();
    assert_eq!(paths, ["/dev/nvme0n1", "/dev/nvme1n1", "/dev/sda"]);
    // The COSI join found every disk: transport and links are there.
    assert!(f.iter().all(|d| d.from_cosi && !d.transport.is_empty()));
    assert_eq!(f[2].transport, "sata");
    assert!(f[2].rotational);
    assert!(
        f[0].symlinks
            .iter()
            .any(|s| s.starts_with("/dev/disk/by-id/nvme-"))
    );
    assert_eq!(f[0].kind, Some(DiskType::Nvme));
    assert_eq!(f[2].kind, Some(DiskType::Hdd));
}

#[test]
fn legacy_only_facts_keep_the_path_and_refuse_selectors() {
    let legacy: Vec<storage::Disk> = rack().iter().map(|d| d.legacy(false)).collect();
    let f = DiskFacts::collect(&legacy, &[]);
    assert_eq!(f[0].dev_path, "/dev/nvme0n1");
    assert!(f.iter().all(|d| !d.from_cosi));
    assert_eq!(
        choose_install_disk(&path("/dev/sda"), &f).unwrap(),
        "/dev/sda"
    );
    let t = sel(|s| s.disk_type = Some(DiskType::Nvme));
    assert_eq!(
        choose_install_disk(&t, &f).unwrap_err().reason,
        RefusalReason::NoBlockFacts
    );
}

#[test]
fn paths_and_links_resolve_to_their_disk() {
    let disks = rack();
    let f = facts(&disks);
    assert_eq!(
        choose_install_disk(&path("/dev/sda"), &f).unwrap(),
        "/dev/sda"
    );
    assert_eq!(
        choose_install_disk(&path("/dev//sda"), &f).unwrap(),
        "/dev/sda"
    );
    for link in &disks[0].spec.symlinks {
        assert_eq!(
            choose_install_disk(&path(link), &f).unwrap(),
            "/dev/nvme1n1"
        );
    }
    let err = choose_install_disk(&path("/dev/vda"), &f).unwrap_err();
    assert_eq!(err.reason, RefusalReason::NoSuchPath);
    let err = choose_install_disk(&path("/dev/disk/by-id/ata-nothing"), &f).unwrap_err();
    assert_eq!(err.reason, RefusalReason::NoSuchPath);
}

#[test]
fn cdrom_and_readonly_paths_are_refused() {
    let mut disks = rack();
    disks.push(SimDisk::cdrom(0, "QEMU DVD-ROM", 4_700_000_000));
    let f = facts(&disks);
    assert!(matches!(
        choose_install_disk(&path("/dev/sr0"), &f)
            .unwrap_err()
            .reason,
        RefusalReason::Unusable(_)
    ));
    disks[2].spec.readonly = true;
    let f = facts(&disks);
    assert!(matches!(
        choose_install_disk(&path("/dev/sda"), &f)
            .unwrap_err()
            .reason,
        RefusalReason::Unusable(_)
    ));
}

#[test]
fn ssd_means_not_rotational_so_nvme_matches_it() {
    // The case: one SATA SSD and one NVMe; `type: ssd` matches both, and Talos
    // would take nvme0n1 (it sorts first), not the SATA SSD the operator meant.
    let disks = vec![
        SimDisk::sata(0, "INTEL SSDSC2KB480G8", "PHYF1", 480_103_981_056, false),
        SimDisk::nvme(0, "SAMSUNG MZQL21T9HCJR-00A07", "S1", 1_920_383_410_176),
    ];
    let f = facts(&disks);
    let t = sel(|s| s.disk_type = Some(DiskType::Ssd));
    let err = choose_install_disk(&t, &f).unwrap_err();
    assert_eq!(
        err.reason,
        RefusalReason::Ambiguous(vec!["/dev/nvme0n1".into(), "/dev/sda".into()])
    );
    assert!(
        err.to_string()
            .contains("Talos would install to the first in its order, /dev/nvme0n1"),
        "{err}"
    );
    // MMC is "ssd" too; a rotational disk is not.
    let mmc = facts(&[SimDisk::mmc(0, "0x1", 64_000_000_000)]);
    assert_eq!(choose_install_disk(&t, &mmc).unwrap(), "/dev/mmcblk0");
    let hdd = facts(&[SimDisk::sata(
        0,
        "ST4000NM000A",
        "H1",
        4_000_787_030_016,
        true,
    )]);
    assert_eq!(
        choose_install_disk(&t, &hdd).unwrap_err().reason,
        RefusalReason::NoMatch
    );
}

#[test]
fn every_selector_requires_a_transport() {
    // A device-mapper disk has no transport: no selector ever picks it.
    let mut dm = SimDisk::virtio(0, "", 100_000_000_000).renamed("dm-0");
    dm.spec.transport.clear();
    dm.spec.rotational = false;
    let f = facts(&[dm]);
    for t in [
        sel(|s| s.size = Some(">= 1GB".into())),
        sel(|s| s.disk_type = Some(DiskType::Ssd)),
        sel(|s| s.model = Some("*".into())),
    ] {
        assert_eq!(
            choose_install_disk(&t, &f).unwrap_err().reason,
            RefusalReason::NoMatch,
            "{t}"
        );
    }
}

#[test]
fn selector_types_are_transports_or_rotational() {
    let mut disks = rack();
    disks.push(SimDisk::mmc(0, "0x1", 64_000_000_000));
    let f = facts(&disks);
    let t = sel(|s| {
        s.disk_type = Some(DiskType::Nvme);
        s.size = Some("<= 600GB".into());
    });
    assert_eq!(choose_install_disk(&t, &f).unwrap(), "/dev/nvme0n1");
    let t = sel(|s| s.disk_type = Some(DiskType::Hdd));
    assert_eq!(choose_install_disk(&t, &f).unwrap(), "/dev/sda");
    let t = sel(|s| s.disk_type = Some(DiskType::Sd));
    assert_eq!(choose_install_disk(&t, &f).unwrap(), "/dev/mmcblk0");
    let t = sel(|s| s.bus_path = Some(disks[0].spec.bus_path.clone()));
    assert_eq!(choose_install_disk(&t, &f).unwrap(), "/dev/nvme1n1");
}

#[test]
fn question_mark_is_literal() {
    let f = facts(&rack());
    // go-glob: `S?` is the two characters S and ?, so it matches no serial here.
    let t = sel(|s| s.serial = Some("S?".into()));
    assert_eq!(
        choose_install_disk(&t, &f).unwrap_err().reason,
        RefusalReason::NoMatch
    );
    let t = sel(|s| s.serial = Some("S*".into()));
    assert_eq!(
        choose_install_disk(&t, &f).unwrap_err().reason,
        RefusalReason::Ambiguous(vec!["/dev/nvme0n1".into(), "/dev/nvme1n1".into()])
    );
    // An empty pattern is no criterion (Talos: `if selector.Model != ""`).
    let t = sel(|s| {
        s.model = Some(String::new());
        s.disk_type = Some(DiskType::Hdd);
    });
    assert_eq!(choose_install_disk(&t, &f).unwrap(), "/dev/sda");
}

#[test]
fn readonly_and_cdrom_are_never_candidates() {
    let mut disks = rack();
    disks[2].spec.readonly = true;
    disks.push(SimDisk::cdrom(0, "QEMU DVD-ROM", 5_000_000_000_000));
    let f = facts(&disks);
    let t = sel(|s| s.size = Some(">= 4TB".into()));
    assert_eq!(
        choose_install_disk(&t, &f).unwrap_err().reason,
        RefusalReason::NoMatch
    );
}

#[test]
fn refusal_lists_every_disk_with_stable_facts() {
    let f = facts(&rack());
    let t = sel(|s| s.disk_type = Some(DiskType::Nvme));
    let msg = choose_install_disk(&t, &f).unwrap_err().to_string();
    assert!(
        msg.contains("matches 2 disks (/dev/nvme0n1, /dev/nvme1n1)"),
        "{msg}"
    );
    for d in &f {
        assert!(msg.contains(&d.dev_path), "{msg}");
        assert!(msg.contains(&format!("serial={}", d.serial)), "{msg}");
        assert!(msg.contains(&d.bus_path), "{msg}");
        assert!(msg.contains(&format!("model={}", d.model)), "{msg}");
        assert!(msg.contains(&format!("transport={}", d.transport)), "{msg}");
    }
    assert!(msg.contains("size=500.1 GB"), "{msg}");
}

#[test]
fn an_unreadable_size_is_refused() {
    let t = sel(|s| s.size = Some("lots".into()));
    assert!(matches!(
        choose_install_disk(&t, &facts(&rack())).unwrap_err().reason,
        RefusalReason::BadSize(_)
    ));
}

#[test]
fn globs() {
    assert!(glob("Samsung*", "Samsung SSD 980"));
    assert!(glob("*980", "Samsung SSD 980"));
    assert!(!glob("S?", "S1"));
    assert!(glob("S?", "S?"));
    assert!(glob("[ab]", "[ab]"));
    assert!(glob("*a*b*", "xxaxxbxx"));
    assert!(!glob("*a*b", "xxaxxbxxc"));
    assert!(glob("exact", "exact"));
    assert!(!glob("exact", "exactly"));
    assert!(glob("*", ""));
    assert!(!glob("", "x"));
    assert!(glob("", ""));
    assert!(glob("a*a", "aa"));
    assert!(!glob("ab*ab", "ab"));
}

/// Reference model of a `*`-only glob: dynamic programming over (pattern, text) prefixes.
fn glob_model(p: &[char], t: &[char]) -> bool {
    let mut m = vec![vec![false; t.len() + 1]; p.len() + 1];
    m[0][0] = true;
    for i in 1..=p.len() {
        for j in 0..=t.len() {
            m[i][j] = if p[i - 1] == '*' {
                m[i - 1][j] || (j > 0 && m[i][j - 1])
            } else {
                j > 0 && m[i - 1][j - 1] && p[i - 1] == t[j - 1]
            };
        }
    }
    m[p.len()][t.len()]
}

proptest! {
    #[test]
    fn glob_agrees_with_the_reference_model(
        p in "[ab?*]{0,8}",
        t in "[ab?]{0,10}",
    ) {
        let pc: Vec<char> = p.chars().collect();
        let tc: Vec<char> = t.chars().collect();
        prop_assert_eq!(glob(&p, &t), glob_model(&pc, &tc), "pattern {:?} text {:?}", p, t);
    }

    /// Whatever order the node lists its disks in, the candidates come in Talos's order (by
    /// kernel name), the pick is the only match, and a refusal's first candidate is the disk
    /// Talos would take.
    #[test]
    fn selection_follows_talos_order(
        spec in proptest::collection::vec((0u8..4, 0u8..3, 1u64..6, any::<bool>()), 1..6),
        want in (0u8..5, 0u64..6),
        shuffle in any::<u64>(),
    ) {
        let mut disks = Vec::new();
        for (i, (bus, n, tb, rot)) in spec.iter().enumerate() {
            let serial = format!("S{i}");
            let d = match bus {
                0 => SimDisk::nvme(*n, "M", &serial, tb * 1_000_000_000_000),
                1 => SimDisk::sata(*n, "M", &serial, tb * 1_000_000_000_000, *rot),
                2 => SimDisk::mmc(*n, &serial, tb * 1_000_000_000_000),
                _ => SimDisk::virtio(*n, &serial, tb * 1_000_000_000_000),
            };
            if !disks.iter().any(|x: &SimDisk| x.id == d.id) {
                disks.push(d);
            }
        }
        let mut shuffled = disks.clone();
        let len = shuffled.len();
        shuffled.rotate_left((shuffle as usize) % len);
        if shuffle % 2 == 1 {
            shuffled.reverse();
        }
        let target = sel(|s| {
            s.disk_type = match want.0 {
                0 => Some(DiskType::Ssd),
                1 => Some(DiskType::Hdd),
                2 => Some(DiskType::Nvme),
                3 => Some(DiskType::Sd),
                _ => None,
            };
            if want.1 > 0 {
                s.size = Some(format!(">= {}TB", want.1));
            }
        });
        let InstallTarget::Selector(s) = &target else { unreachable!() };
        let f = facts(&shuffled);
        let expected = talos_matches(s, &f).unwrap();
        let mut sorted = expected.clone();
        sorted.sort();
        prop_assert_eq!(&expected, &sorted);
        // Reference: the sim's own reading of Talos's install task.
        let mut install = yaml_serde::Mapping::new();
        let mut sel_yaml = yaml_serde::Mapping::new();
        if let Some(t) = s.disk_type {
            sel_yaml.insert("type".into(), t.as_str().into());
        }
        if let Some(sz) = &s.size {
            sel_yaml.insert("size".into(), sz.as_str().into());
        }
        install.insert("diskSelector".into(), yaml_serde::Value::Mapping(sel_yaml));
        let talos = crate::sim::disks::talos_install_disk(
            &yaml_serde::Value::Mapping(install),
            &shuffled,
        );
        match choose_install_disk(&target, &f) {
            Ok(p) => {
                prop_assert_eq!(expected.len(), 1);
                prop_assert_eq!(Some(&p), talos.as_ref().ok());
            }
            Err(e) => match e.reason {
                RefusalReason::Ambiguous(c) => {
                    prop_assert!(c.len() > 1);
                    prop_assert_eq!(&c, &expected);
                    prop_assert_eq!(Some(&c[0]), talos.as_ref().ok());
                }
                RefusalReason::NoMatch => {
                    prop_assert!(expected.is_empty());
                    prop_assert!(talos.is_err());
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            },
        }
    }
}
