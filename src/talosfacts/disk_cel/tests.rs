//! Talos's own CEL test cases (siderolabs/talos v1.14.0-rc.1 `pkg/machinery/cel/*_test.go`,
//! `controllers/block/internal/volumes/locate_test.go`, `controllers/runtime/
//! unattended_install_test.go`) carried over as facts, and the facts of the code they test.

use super::*;

const GIB: u64 = 1 << 30;

fn disk(id: &str, size: u64) -> CelDisk {
    CelDisk {
        dev_path: format!("/dev/{id}"),
        size,
        sector_size: 512,
        io_size: 512,
        transport: if id.starts_with("nvme") {
            "nvme"
        } else {
            "sata"
        }
        .into(),
        ..Default::default()
    }
}

fn holds(text: &str, d: &CelDisk, system_disk: Option<bool>) -> bool {
    eval(&compile(text).unwrap(), d, system_disk).unwrap()
}

fn install(text: &str, disks: &[CelDisk]) -> Result<Choice, CelRefusal> {
    choose(
        "UnattendedInstallConfig",
        &compile(text).unwrap(),
        disks,
        &Purpose::Install,
    )
}

/// (i) `celenv_test.go` TestDiskLocator: each parses and checks as bool; the
/// VolumeLocator-only `volume` variable is not declared in the disk environment.
#[test]
fn the_disk_locator_test_expressions_compile() {
    for ok in [
        "system_disk",
        "disk.size > 1000u * GiB && !disk.rotational",
        "glob('sd[a-z]', disk.dev_path)",
    ] {
        compile(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for volume_only in [
        "volume.label == 'EPHEMERAL'",
        "volume.name == 'ext4' && volume.size > 1000u * TB",
        "volume.name == 'ext4' && disk.transport == 'nvme'",
    ] {
        let err = compile(volume_only).unwrap_err();
        assert!(
            matches!(&err, CelError::Check(m) if m.contains("'volume'")),
            "{volume_only}: {err}"
        );
    }
    // go-glob: `[a-z]` is literal, so the celenv test's glob matches no real disk.
    assert!(!holds(
        "glob('sd[a-z]', disk.dev_path)",
        &disk("sda", GIB),
        Some(false)
    ));
    assert!(holds(
        "glob('/dev/sd*', disk.dev_path)",
        &disk("sda", GIB),
        Some(false)
    ));
}

/// (ii) `cel_test.go` TestCELEvalFromYAML with `system_disk = true`, `disk = {size: 1024}`.
#[test]
fn the_eval_test_cases_hold() {
    let d = CelDisk {
        size: 1024,
        ..Default::default()
    };
    assert!(holds("1u * GiB < 2u * GiB", &d, Some(true)));
    assert!(!holds("!system_disk", &d, Some(true)));
    // TestCELMarshal's round-tripping expressions are accepted as written.
    compile("disk.size > 1000u && !disk.rotational").unwrap();
    // build_test.go: `disk.rotational` is a bool expression on its own.
    assert!(holds(
        "disk.rotational",
        &CelDisk {
            rotational: true,
            ..d.clone()
        },
        None
    ));
}

/// The unit constants are `uint` and have Talos's values.
#[test]
fn units_are_uints_with_talos_values() {
    let d = disk("sda", 0);
    for (name, v) in UNITS {
        assert!(holds(&format!("{name} == {v}u"), &d, Some(false)), "{name}");
    }
    assert!(matches!(
        compile("GiB == 1073741824"),
        Err(CelError::Check(_))
    ));
}

/// (v) What cel-go's checker refuses and accepts, which the crate alone would not.
#[test]
fn the_checker_refuses_what_talos_refuses() {
    for bad in [
        "disk.size == 1000",
        "disk.size > 10 * GiB",
        "disk.nosuch == 'x'",
        "true || disk.nosuch == 'x'",
        "false && disk.sizes > 0u",
        "foo == 1",
        "disk.size",
        "disk.model.lowerAscii() == 'x'",
        "disk == 1",
        "1 == 1u",
        "disk.model == 1",
        "disk.symlinks.exists(l, l == 1)",
        "system_disk ? 1 : 'x'",
        "talos.resource.definitions.block.DiskSpec{size: 1u}.size > 0u",
    ] {
        assert!(
            matches!(compile(bad), Err(CelError::Check(_))),
            "{bad} should not check: {:?}",
            compile(bad)
        );
    }
    assert!(matches!(
        compile("disk.?serial == 'x'"),
        Err(CelError::Parse(_))
    ));
    assert!(matches!(compile("disk.size >"), Err(CelError::Parse(_))));
    assert!(matches!(compile(""), Err(CelError::Parse(_))));
    for good in [
        "disk.size > 1000",
        "'x' in disk.symlinks",
        "disk.symlinks.exists(l, l.startsWith('/dev/disk/by-id/nvme-'))",
        "disk.symlinks.all(l, size(l) > 0)",
        "disk.symlinks.exists_one(l, l.contains('wwn'))",
        "disk.symlinks.filter(l, l.endsWith('x')).size() == 0",
        "disk.symlinks.map(l, size(l)).exists(n, n > 3)",
        "disk.model.matches('^Samsung') && has(disk.serial)",
        "disk.transport in ['nvme', 'sata']",
        "disk.size >= uint(500) * GB",
        "double(disk.size) / 1e12 > 0.5",
        "string(disk.size) != ''",
        "disk.secondary_disks.size() == 0 && disk.firmware_version != ''",
        "system_disk ? disk.size > 1u : !disk.cdrom",
    ] {
        compile(good).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

/// (vi) `has()` follows proto3 presence: false for an empty string, zero or empty list.
#[test]
fn has_is_proto3_presence() {
    let blank = disk("sda", GIB);
    let full = CelDisk {
        serial: "S1".into(),
        symlinks: vec!["/dev/disk/by-id/x".into()],
        rotational: true,
        wwid: "naa.1".into(),
        ..blank.clone()
    };
    for (text, on_blank) in [
        ("has(disk.serial)", false),
        ("has(disk.symlinks)", false),
        ("has(disk.rotational)", false),
        ("has(disk.io_size)", true),
        ("has(disk.uuid)", false),
        ("!has(disk.wwid) || disk.wwid.startsWith('naa.')", true),
    ] {
        assert_eq!(
            holds(text, &blank, Some(false)),
            on_blank,
            "{text} on blank"
        );
    }
    assert!(holds(
        "has(disk.serial) && has(disk.symlinks) && has(disk.rotational)",
        &full,
        None
    ));
}

/// (vii) Install: no match waits forever (refused); several matches are refused with Talos's
/// pick, the first by resource ID compared bytewise; `system_disk` is false at install.
#[test]
fn install_refuses_no_match_and_several() {
    let disks = vec![
        disk("sdb", GIB),
        disk("sdaa", GIB),
        disk("nvme0n1", GIB),
        disk("sda", GIB),
    ];
    let r = install("disk.serial == 'NONE'", &disks).unwrap_err();
    assert_eq!(*r.reason, RefusalKind::NoMatch);
    assert_eq!(r.disks.len(), 4);
    assert!(r.disks[0].starts_with("/dev/nvme0n1 "), "{r}");
    let r = install("disk.size == 1073741824u", &disks).unwrap_err();
    assert_eq!(
        *r.reason,
        RefusalKind::Ambiguous {
            matched: vec![
                "/dev/nvme0n1".into(),
                "/dev/sda".into(),
                "/dev/sdaa".into(),
                "/dev/sdb".into()
            ],
            pick: "/dev/nvme0n1".into()
        }
    );
    let r = install("disk.transport == 'sata'", &disks).unwrap_err();
    assert!(
        matches!(&*r.reason, RefusalKind::Ambiguous { pick, .. } if pick == "/dev/sda"),
        "{r}"
    );
    assert_eq!(
        *install("system_disk", &disks).unwrap_err().reason,
        RefusalKind::NoMatch
    );
    let c = install("!system_disk && disk.dev_path == '/dev/sdaa'", &disks).unwrap();
    assert_eq!(c.disk, "/dev/sdaa");
    // gen config's `disk.dev_path == "/dev/sda"` picks exactly that disk.
    assert_eq!(
        install(r#"disk.dev_path == "/dev/sda""#, &disks)
            .unwrap()
            .disk,
        "/dev/sda"
    );
}

/// Install considers every disk (MatchDisks excludes nothing), so a CD-ROM can be the only
/// match; talboot refuses installing to it.
#[test]
fn install_refuses_a_cdrom_as_the_only_match() {
    let cd = CelDisk {
        cdrom: true,
        readonly: true,
        ..disk("sr0", GIB)
    };
    let r = install("disk.dev_path == '/dev/sr0'", &[disk("sda", GIB), cd]).unwrap_err();
    assert!(matches!(*r.reason, RefusalKind::Unusable { .. }), "{r}");
}

fn volume(whole_disk: bool, min_size: u64) -> Purpose {
    Purpose::Volume {
        whole_disk,
        min_size,
        system_disk: "/dev/sda".into(),
    }
}

/// (viii) `locate_test.go`: a serial nothing has, a read-only disk (skipped for volumes),
/// a disk volume over two disks, and a DiskMatch that locates the disk itself.
#[test]
fn the_locate_test_cases_hold() {
    let mut sda = disk("sda", 10 * GIB);
    sda.serial = "ACTUAL".into();
    let e = compile(r#"disk.serial == "NONEXISTENT""#).unwrap();
    let r = choose(
        "VolumeConfig X",
        &e,
        std::slice::from_ref(&sda),
        &volume(false, 0),
    )
    .unwrap_err();
    assert_eq!(*r.reason, RefusalKind::NoMatch);

    let ro = CelDisk {
        readonly: true,
        ..disk("sda", 10 * GIB)
    };
    let e = compile("!disk.readonly").unwrap();
    let r = choose("VolumeConfig X", &e, &[ro], &volume(false, 0)).unwrap_err();
    assert_eq!(*r.reason, RefusalKind::NoMatch);
    // `disk.readonly` itself matches nothing either: the disk is skipped before evaluation.
    let e2 = compile("disk.readonly").unwrap();
    let ro = CelDisk {
        readonly: true,
        ..disk("sdc", GIB)
    };
    assert!(choose("X", &e2, &[ro], &volume(false, 0)).is_err());

    let two = [disk("sda", 10 * GIB), disk("sdb", 20 * GIB)];
    let r = choose("UserVolumeConfig data", &e, &two, &volume(true, 0)).unwrap_err();
    assert!(matches!(*r.reason, RefusalKind::Ambiguous { .. }), "{r}");

    let mut sn = disk("sda", 10 * GIB);
    sn.serial = "SN100".into();
    let e = compile(r#"disk.serial == "SN100""#).unwrap();
    let c = choose("X", &e, &[sn, disk("sdb", GIB)], &volume(true, 0)).unwrap();
    assert_eq!(c.disk, "/dev/sda");
}

/// (ix) The example rack's `garage-data`: `disk.transport == "nvme" && !system_disk` with
/// minSize 1TB is one partition on the first NVMe data disk with room.
#[test]
fn the_example_racks_garage_data_is_refused_over_two_data_disks() {
    let tb = 1_000_000_000_000u64;
    let e = compile(r#"disk.transport == "nvme" && !system_disk"#).unwrap();
    let purpose = Purpose::Volume {
        whole_disk: false,
        min_size: tb,
        system_disk: "/dev/nvme0n1".into(),
    };
    let rack = [
        disk("nvme0n1", 2 * tb),
        disk("nvme1n1", 4 * tb),
        disk("nvme2n1", 4 * tb),
    ];
    let r = choose("UserVolumeConfig garage-data", &e, &rack, &purpose).unwrap_err();
    assert_eq!(
        *r.reason,
        RefusalKind::Ambiguous {
            matched: vec!["/dev/nvme1n1".into(), "/dev/nvme2n1".into()],
            pick: "/dev/nvme1n1".into()
        }
    );
    let text = r.to_string();
    assert!(text.contains("UserVolumeConfig garage-data"), "{text}");
    assert!(text.contains("\n  /dev/nvme2n1 "), "{text}");

    let c = choose("UserVolumeConfig garage-data", &e, &rack[..2], &purpose).unwrap();
    assert_eq!(c.disk, "/dev/nvme1n1");
    // A second data disk too small for the partition is not a rival.
    let small = [rack[0].clone(), rack[1].clone(), disk("nvme2n1", tb)];
    let c = choose("UserVolumeConfig garage-data", &e, &small, &purpose).unwrap();
    assert_eq!(c.disk, "/dev/nvme1n1");
    assert_eq!(c.matched, vec!["/dev/nvme1n1", "/dev/nvme2n1"]);
    // Only small matches: no room.
    let r = choose(
        "UserVolumeConfig garage-data",
        &e,
        &[disk("nvme2n1", tb)],
        &Purpose::Volume {
            whole_disk: false,
            min_size: tb,
            system_disk: "/dev/sda".into(),
        },
    )
    .unwrap_err();
    assert!(matches!(*r.reason, RefusalKind::NoRoom { .. }), "{r}");
}

/// Volumes bind `system_disk` to "is the install disk".
#[test]
fn volumes_see_the_install_disk_as_the_system_disk() {
    let e = compile("system_disk").unwrap();
    let c = choose(
        "VolumeConfig EPHEMERAL",
        &e,
        &[disk("sda", GIB), disk("sdb", GIB)],
        &volume(false, 0),
    )
    .unwrap();
    assert_eq!(c.disk, "/dev/sda");
}

/// (x) An overflow or a bad regular expression fails evaluation, naming the disk.
#[test]
fn evaluation_errors_name_the_disk() {
    let disks = [disk("sdb", GIB), disk("sda", GIB)];
    for text in [
        "disk.size > 20000000u * EiB",
        "disk.model.matches('(')",
        "disk.size - 2000000000u > 0u",
    ] {
        let r = install(text, &disks).unwrap_err();
        assert!(
            matches!(&*r.reason, RefusalKind::EvalError { disk, .. } if disk == "/dev/sda"),
            "{text}: {r}"
        );
    }
    // An unbound `system_disk` (volumes before the system disk exists) is an error.
    let e = compile("system_disk").unwrap();
    assert!(matches!(eval(&e, &disks[0], None), Err(CelError::Eval(_))));
}

/// go-glob: only `*` is special.
#[test]
fn go_glob_only_star_is_special() {
    for (p, s, want) in [
        ("*", "anything", true),
        ("", "", true),
        ("", "x", false),
        ("Samsung*", "Samsung SSD 980", true),
        ("*980", "Samsung SSD 980", true),
        ("S*g*0", "Samsung SSD 980", true),
        ("S*x*0", "Samsung SSD 980", false),
        ("amsung*", "Samsung", false),
        ("sd?", "sda", false),
        ("sd[a-z]", "sd[a-z]", true),
    ] {
        assert_eq!(go_glob(p, s), want, "glob({p:?}, {s:?})");
    }
}
