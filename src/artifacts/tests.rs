//! Unit tests of the artifact cache.

use super::*;

fn set() -> SetId {
    SetId {
        talos: "v1.13.9".into(),
        schematic: "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".into(),
        arch: "amd64".into(),
    }
}

fn record(dir: &Path, id: &SetId) -> Catalog {
    let mut files = BTreeMap::new();
    for kind in Kind::ALL {
        let p = dir.join(id.rel_dir()).join(kind.file_name());
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("{kind:?} bytes")).unwrap();
        let (size, sha256) = hash_file(&p).unwrap();
        files.insert(
            kind,
            FileRecord {
                size,
                sha256,
                compression: None,
                uki: None,
            },
        );
    }
    let mut c = Catalog::load(dir).unwrap();
    c.upsert(Entry {
        id: id.clone(),
        source: "test".into(),
        pulled_at: 0,
        files,
        origin: Origin::Pulled,
    });
    c.save(dir).unwrap();
    c
}

#[test]
fn verify_accepts_intact_and_names_the_fix_for_damage() {
    let dir = tempfile::tempdir().unwrap();
    let id = set();
    let c = record(dir.path(), &id);
    assert_eq!(Catalog::load(dir.path()).unwrap(), c);
    verify(dir.path(), &c, &id).unwrap();

    let kernel = dir.path().join(id.rel_dir()).join("kernel");
    std::fs::write(&kernel, "Kernel bytez").unwrap();
    let err = verify(dir.path(), &c, &id).unwrap_err().to_string();
    assert!(err.contains("sha256"), "{err}");
    assert!(err.contains("talboot images pull --talos v1.13.9 --schematic 376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba --arch amd64"), "{err}");

    std::fs::remove_file(&kernel).unwrap();
    assert!(matches!(
        verify(dir.path(), &c, &id),
        Err(ArtifactError::Damaged { .. })
    ));
}

#[test]
fn missing_set_gives_the_pull_command() {
    let dir = tempfile::tempdir().unwrap();
    let c = Catalog::load(dir.path()).unwrap();
    let err = verify(dir.path(), &c, &set()).unwrap_err();
    assert!(matches!(err, ArtifactError::Missing { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("run: talboot images pull --talos v1.13.9 --schematic 376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba --arch amd64 (without internet: talboot images import --talos v1.13.9"),
        "{msg}"
    );
}

/// A catalog written before UKIs existed still loads, and its sets boot PXE.
#[test]
fn old_catalogs_load_and_a_uki_only_set_says_what_it_boots() {
    let old = r#"{"version":1,"entries":[{"talos":"v1.13.9","schematic":"s","arch":"amd64","source":"https://factory.talos.dev","pulled_at":1,"files":{"kernel":{"size":1,"sha256":"a"},"initramfs":{"size":2,"sha256":"b","compression":"xz"},"cmdline":{"size":3,"sha256":"c"}}}]}"#;
    let c: Catalog = serde_json::from_str(old).unwrap();
    assert_eq!(c.entries[0].boots(), [Boot::Pxe]);
    assert_eq!(c.entries[0].uki_facts(Kind::SecureBootUki), None);
    // Written back, nothing new appears in it.
    let again = serde_json::to_string(&c).unwrap();
    assert!(!again.contains("uki"), "{again}");

    let dir = tempfile::tempdir().unwrap();
    let id = set();
    let path = dir
        .path()
        .join(id.rel_dir())
        .join(Kind::SecureBootUki.file_name());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"MZ uki").unwrap();
    let (size, sha256) = hash_file(&path).unwrap();
    let facts = uki::UkiFacts {
        arch: "amd64".into(),
        sections: vec![".linux".into()],
        signer: None,
        pcr_key_fingerprint: Some("AB:CD".into()),
        version: None,
    };
    let origin = Origin::IsoUki {
        iso: "/usb/sb.iso".into(),
        uki: "/EFI/Linux/Talos-v1.13.9.efi".into(),
    };
    let rec = FileRecord {
        size,
        sha256,
        compression: None,
        uki: Some(UkiRecord {
            facts: facts.clone(),
            source: "/usb/sb.iso".into(),
            at: 5,
            origin: origin.clone(),
        }),
    };
    let entry = Entry {
        id: id.clone(),
        source: "/usb/sb.iso".into(),
        pulled_at: 5,
        files: BTreeMap::from([(Kind::SecureBootUki, rec)]),
        origin,
    };
    let mut c = Catalog::default();
    c.upsert(entry.clone());
    assert_eq!(entry.boots(), [Boot::SecureBootUki]);
    assert_eq!(entry.uki_facts(Kind::SecureBootUki), Some(&facts));
    verify_for(dir.path(), &c, &id, [Boot::SecureBootUki]).unwrap();
    assert_eq!(
        verify_recorded(dir.path(), &c, &id).unwrap(),
        [Boot::SecureBootUki]
    );
    let err = verify(dir.path(), &c, &id).unwrap_err();
    assert!(
        matches!(
            err,
            ArtifactError::Incomplete {
                kind: Kind::Kernel,
                ..
            }
        ),
        "{err}"
    );
    let err = verify_for(dir.path(), &c, &id, [Boot::Uki])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("has no uki.efi") && err.contains("--boot uki"),
        "{err}"
    );
    // Damage on the UKI names its own origin's fix.
    std::fs::write(&path, b"MZ ukj").unwrap();
    let err = verify_recorded(dir.path(), &c, &id)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--iso /usb/sb.iso --force"), "{err}");

    // PXE files written later join the set; the UKI stays, with its own origin.
    let other = tempfile::tempdir().unwrap();
    let pxe = record(other.path(), &id).entries[0].clone();
    let merged = merge(Some(&entry), pxe);
    assert_eq!(merged.boots(), [Boot::Pxe, Boot::SecureBootUki]);
    assert_eq!(merged.origin, Origin::Pulled);
    assert!(matches!(
        merged.origin_of(Kind::SecureBootUki),
        Origin::IsoUki { .. }
    ));
}

/// Secure Boot nodes need the signed UKI of their architecture, the others and the
/// discovery of unknown machines the PXE files.
#[test]
fn requirements_follow_secure_boot_per_architecture() {
    let text = "cluster:\n  name: t\n  talosVersion: v1.13.9\n  kubernetesVersion: 1.36.3\n  \
        endpoint: https://10.0.40.100:6443\n  vip: 10.0.40.100\nnetwork:\n  interfaces: [eth0]\n  \
        subnet: 10.0.40.0/24\n  gateway: 10.0.40.1\n  pool: {start: 10.0.40.200, end: 10.0.40.250}\n\
        boot:\n  unknownMachines: UNKNOWN\nnodes:\n\
        \x20 - {name: cp-1, mac: 'aa:00:00:00:00:01', role: controlplane, address: 10.0.40.11/24, installDisk: /dev/sda, secureBoot: true}\n\
        \x20 - {name: cp-2, mac: 'aa:00:00:00:00:02', role: controlplane, address: 10.0.40.12/24, installDisk: /dev/sda, secureBoot: true}\n\
        \x20 - {name: cp-3, mac: 'aa:00:00:00:00:03', role: controlplane, address: 10.0.40.13/24, installDisk: /dev/sda, secureBoot: true}\n\
        \x20 - {name: wk-1, mac: 'aa:00:00:00:00:04', role: worker, address: 10.0.40.21/24, installDisk: /dev/sda, arch: arm64}\n";
    let dir = tempfile::tempdir().unwrap();
    let load = |unknown: &str| {
        let p = dir.path().join("talboot.yaml");
        std::fs::write(&p, text.replace("UNKNOWN", unknown)).unwrap();
        crate::inventory::load_with_env(&p, &BTreeMap::new())
            .unwrap()
            .inventory
    };
    let needs = |inv| -> Vec<(String, Vec<Boot>)> {
        requirements(&inv)
            .into_iter()
            .map(|r| (r.id.arch, r.boots.into_iter().collect()))
            .collect()
    };
    assert_eq!(
        needs(load("ignore")),
        [
            ("amd64".to_string(), vec![Boot::SecureBootUki]),
            ("arm64".to_string(), vec![Boot::Pxe]),
        ]
    );
    assert_eq!(
        needs(load("discover")),
        [
            ("amd64".to_string(), vec![Boot::Pxe, Boot::SecureBootUki]),
            ("arm64".to_string(), vec![Boot::Pxe]),
        ]
    );
}

#[test]
fn corrupt_catalog_is_an_error_not_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CATALOG_FILE), "{not json").unwrap();
    assert!(matches!(
        Catalog::load(dir.path()),
        Err(ArtifactError::Catalog { .. })
    ));
}
