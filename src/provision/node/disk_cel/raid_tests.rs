//! The check of a RAID install and of dedicated ETCD/LOG volumes, from Talos facts: the
//! RAID-boot CI patch (`hack/test/patches/md-boot-array.yaml`: two virtio disks of 12 GiB,
//! array `boot`, install selector `"/dev/disk/by-id/md-name-talos:boot" in disk.symlinks`),
//! `minMembers = 2`, and the dedicated-volume patches' `VolumeConfig` shape.

use super::*;
use crate::talosfacts::disk_cel::RefusalKind;

const GIB: u64 = 1 << 30;

fn fact(id: &str, serial: &str, transport: &str, size: u64) -> DiskFacts {
    DiskFacts {
        dev_path: format!("/dev/{id}"),
        model: String::new(),
        serial: serial.into(),
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
        symlinks: Vec::new(),
        io_size: 512,
        sector_size: 512,
        sub_system: "/sys/class/block".into(),
        pretty_size: String::new(),
        secondary_disks: Vec::new(),
        firmware_version: String::new(),
        from_cosi: true,
    }
}

/// QEMU_SYSTEM_DISKS=2 of the CI job, plus a SATA disk for volumes.
fn disks() -> Vec<DiskFacts> {
    vec![
        fact("vdb", "B", "virtio", 12 * GIB),
        fact("vda", "A", "virtio", 12 * GIB),
        fact("sda", "C", "sata", 100 * GIB),
    ]
}

/// `md-boot-array.yaml` as Talos ships it.
const CI_ARRAY: &str = "apiVersion: v1alpha1\nkind: RAIDArrayConfig\nname: boot\nlevel: raid1\n\
    metadata: \"1.0\"\nprovisioning:\n    volumeSelector:\n        \
    match: disk.transport == \"virtio\" && disk.size >= 12u * GiB\n";
const CI_INSTALL: &str = "apiVersion: v1alpha1\nkind: UnattendedInstallConfig\nprovisioning:\n    \
    diskSelector:\n        match: '\"/dev/disk/by-id/md-name-talos:boot\" in disk.symlinks'\n";

fn config(docs: &[&str]) -> Vec<u8> {
    docs.join("---\n").into_bytes()
}

fn members_array(members: &str) -> String {
    CI_ARRAY.replace(
        "disk.transport == \"virtio\" && disk.size >= 12u * GiB",
        members,
    )
}

/// The array does not exist before the config is applied, so the install selector matches
/// no reported disk; the array's members are checked instead.
#[test]
fn talos_ci_raid_boot_config_installs_onto_both_virtio_disks() {
    let picks = check_rendered(&config(&[CI_ARRAY, CI_INSTALL]), &disks()).unwrap();
    assert_eq!(picks.install.disk, "/dev/disk/by-id/md-name-talos:boot");
    assert_eq!(picks.install.matched, ["/dev/vda", "/dev/vdb"]);
    assert_eq!(
        picks.arrays,
        [(
            "boot".to_owned(),
            vec!["/dev/vda".to_owned(), "/dev/vdb".to_owned()]
        )]
    );
    // Without the array the same install selector matches nothing: Talos would wait.
    let err = check_rendered(&config(&[CI_INSTALL]), &disks()).unwrap_err();
    assert!(
        matches!(&err, DiskCheckError::Refused(r) if *r.reason == RefusalKind::NoMatch),
        "{err}"
    );
}

/// talboot's rendering: one expression per member, joined by `||`.
#[test]
fn each_member_selector_must_match_one_disk_of_its_own() {
    let ok = members_array("(disk.serial == \"A\") || (disk.serial == \"C\")");
    let picks = check_rendered(&config(&[&ok, CI_INSTALL]), &disks()).unwrap();
    assert_eq!(picks.install.matched, ["/dev/sda", "/dev/vda"]);

    let broad = members_array("(disk.serial == \"C\") || (disk.transport == \"virtio\")");
    let err = check_rendered(&config(&[&broad, CI_INSTALL]), &disks()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "RAIDArrayConfig boot member 2 selector `disk.transport == \"virtio\"` matches 2 \
             disks (/dev/vda, /dev/vdb) but must match exactly one"
        ),
        "{text}"
    );
    let shared = members_array("(disk.serial == \"A\") || (disk.dev_path == \"/dev/vda\")");
    let err = check_rendered(&config(&[&shared, CI_INSTALL]), &disks()).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "RAIDArrayConfig boot member 2 selector `disk.dev_path == \"/dev/vda\"` matches \
             /dev/vda, which RAIDArrayConfig boot member 1 already matches: one disk cannot be \
             two members of the array"
        ),
        "{err}"
    );
}

/// `minMembers = 2`: one matching disk leaves the array `waiting` forever.
#[test]
fn one_matching_disk_is_too_few_for_the_array() {
    let mut d = disks();
    d[0].size = 8 * GIB;
    let err = check_rendered(&config(&[CI_ARRAY, CI_INSTALL]), &d).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "RAIDArrayConfig boot selector `disk.transport == \"virtio\" && disk.size >= 12u * \
             GiB` matches 1 disk(s) (/dev/vda): Talos waits for at least 2 members before it \
             creates the array (\"waiting for enough member disks\"), so the node would never \
             install; match every member disk"
        ),
        "{err}"
    );
}

/// Talos accepts metadata 1.2 and does not tie the array to the install; talboot refuses to
/// install onto it (a patch could have written it).
#[test]
fn an_install_onto_a_metadata_1_2_array_is_refused() {
    let v12 = CI_ARRAY.replace("metadata: \"1.0\"", "metadata: \"1.2\"");
    let err = check_rendered(&config(&[&v12, CI_INSTALL]), &disks()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the install disk is RAID array boot (/dev/disk/by-id/md-name-talos:boot), which the \
         firmware cannot boot from: metadata 1.2; a boot array needs metadata 1.0, whose \
         superblock sits at the end of each member so the firmware reads it as a plain disk"
    );
    // Level and metadata left out are Talos's zero values, raid1 and 1.0.
    let bare = CI_ARRAY.replace("level: raid1\nmetadata: \"1.0\"\n", "");
    assert!(check_rendered(&config(&[&bare, CI_INSTALL]), &disks()).is_ok());
    let no_match = CI_ARRAY.replace("provisioning:", "x:");
    assert!(matches!(
        check_rendered(&config(&[&no_match, CI_INSTALL]), &disks()),
        Err(DiskCheckError::ArrayWithoutSelector(n)) if n == "boot"
    ));
}

const ETCD_ON_SYSTEM: &str = "apiVersion: v1alpha1\nkind: VolumeConfig\nname: ETCD\nprovisioning: {minSize: 1GB, maxSize: 2GB}\n";

fn log_on(selector: &str, min: &str) -> String {
    format!(
        "apiVersion: v1alpha1\nkind: VolumeConfig\nname: LOG\nprovisioning:\n  diskSelector:\n    \
         match: '{selector}'\n  minSize: {min}\n  maxSize: 2GB\n"
    )
}

/// Dedicated ETCD/LOG are `VolumeConfig` selectors, so item 3's volume rule applies; a disk
/// the array takes as a member is refused, a volume without selector stays on the system
/// disk (Talos's default `system_disk`) and is not evaluated.
#[test]
fn dedicated_volumes_follow_the_volume_rule_and_stay_off_array_members() {
    let log = log_on("disk.serial == \"C\"", "1GB");
    let picks = check_rendered(
        &config(&[CI_ARRAY, CI_INSTALL, ETCD_ON_SYSTEM, &log]),
        &disks(),
    )
    .unwrap();
    assert_eq!(picks.volumes.len(), 1);
    assert_eq!(picks.volumes[0].0, "VolumeConfig LOG");
    assert_eq!(picks.volumes[0].1.disk, "/dev/sda");

    let on_member = log_on("disk.serial == \"A\"", "1GB");
    let err = check_rendered(&config(&[CI_ARRAY, CI_INSTALL, &on_member]), &disks()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "VolumeConfig LOG would be placed on /dev/vda, which RAID array boot takes as a member; \
         select a disk outside the array, or leave diskSelector out to place it on the system disk"
    );

    let too_big = log_on("disk.serial == \"C\"", "200GB");
    let err = check_rendered(&config(&[CI_ARRAY, CI_INSTALL, &too_big]), &disks()).unwrap_err();
    assert!(
        matches!(&err, DiskCheckError::Refused(r) if matches!(*r.reason, RefusalKind::NoRoom { .. })),
        "{err}"
    );

    // On a plain install, ETCD on two candidate disks is item 3's ambiguity.
    let install = "apiVersion: v1alpha1\nkind: UnattendedInstallConfig\nprovisioning:\n  \
                   diskSelector:\n    match: disk.dev_path == \"/dev/sda\"\n";
    let etcd = log_on("disk.transport == \"virtio\"", "1GB").replace("LOG", "ETCD");
    let err = check_rendered(&config(&[install, &etcd]), &disks()).unwrap_err();
    assert!(
        matches!(&err, DiskCheckError::Refused(r) if r.what == "VolumeConfig ETCD"
            && matches!(&*r.reason, RefusalKind::Ambiguous { pick, .. } if pick == "/dev/vda")),
        "{err}"
    );
}
