//! `installRaid` and `systemVolumes`: what loads, what is refused (with the exact text an
//! operator reads), and how role and node volumes fold.

use super::{diags, with};
use crate::inventory::*;

/// BASE at Talos v1.14 with the worker's `installDisk` line replaced by `node` (indented
/// four spaces) and `roles` added when given.
fn v114(node: &str, roles: &str) -> String {
    let mut text = with(
        "    address: 10.0.40.21/24\n    installDisk: /dev/sda",
        &format!("    address: 10.0.40.21/24\n{node}"),
    )
    .replacen("talosVersion: v1.13.9", "talosVersion: v1.14.0", 1);
    if !roles.is_empty() {
        text = text.replacen("nodes:\n", &format!("roles:\n{roles}nodes:\n"), 1);
    }
    text
}

const RAID: &str = "    installRaid:\n      members:\n        - disk.serial == \"S1\"\n        \
                    - disk.serial == \"S2\"";

fn load_ok(text: &str) -> Inventory {
    let case = super::Case::new();
    match case.load(text) {
        Ok(l) => l.inventory,
        Err(LoadError::Invalid { diagnostics, .. }) => panic!("{:?}", diagnostics.sorted()),
        Err(e) => panic!("{e}"),
    }
}

fn errors(text: &str) -> Vec<String> {
    diags(text)
        .into_iter()
        .filter(|m| !m.contains("warning: "))
        .collect()
}

/// A RAID install targets the array by the link Talos gives it (`md-name-talos:<name>`).
#[test]
fn a_raid_install_loads_and_targets_the_array_link() {
    let inv = load_ok(&v114(RAID, ""));
    let wk = inv.node("wk-1").unwrap();
    let raid = wk.storage.raid.as_ref().unwrap();
    assert_eq!(raid.name.value, "boot");
    assert_eq!(raid.members.len(), 2);
    let InstallTarget::Selector(DiskSelector { expr: Some(e), .. }) = &wk.install else {
        panic!("{:?}", wk.install)
    };
    assert_eq!(
        e.value,
        "\"/dev/disk/by-id/md-name-talos:boot\" in disk.symlinks"
    );
    // Written out, level and metadata are accepted at the one value that boots.
    let explicit = RAID.replace(
        "    installRaid:\n",
        "    installRaid:\n      name: md_boot\n      level: raid1\n      metadata: \"1.0\"\n",
    );
    let inv = load_ok(&v114(&explicit, ""));
    let raid = inv.node("wk-1").unwrap().storage.raid.clone().unwrap();
    assert_eq!(raid.device_path(), "/dev/disk/by-id/md-name-talos:md_boot");
}

/// The exact refusal for metadata 1.2, which Talos accepts but the firmware cannot boot.
#[test]
fn what_talos_would_not_boot_from_is_refused() {
    let meta = RAID.replace(
        "    installRaid:\n",
        "    installRaid:\n      metadata: \"1.2\"\n",
    );
    assert_eq!(
        errors(&v114(&meta, "")),
        [
            "33:17: nodes[3].installRaid.metadata: metadata `1.2` cannot boot: the install array \
          must be metadata 1.0"
        ]
    );
    let case = super::Case::new();
    let Err(LoadError::Invalid { diagnostics, .. }) = case.load(&v114(&meta, "")) else {
        panic!("loaded")
    };
    let text: Vec<String> = diagnostics.sorted().iter().map(|d| d.to_string()).collect();
    assert!(text[0].contains("superblock sits at the end"), "{text:?}");

    let level = RAID.replace(
        "    installRaid:\n",
        "    installRaid:\n      level: raid5\n",
    );
    let e = errors(&v114(&level, ""));
    assert!(
        e.iter()
            .any(|m| m.contains("installRaid.level: level `raid5` cannot boot")),
        "{e:?}"
    );
    let one = "    installRaid:\n      members: ['disk.serial == \"S1\"']";
    let e = errors(&v114(one, ""));
    assert!(
        e.iter().any(|m| m.contains(
            "installRaid.members: 1 member(s): Talos waits for at least 2 before it creates \
             the array"
        )),
        "{e:?}"
    );
    let twice =
        "    installRaid:\n      members: ['disk.serial == \"S1\"', 'disk.serial == \"S1\"']";
    let e = errors(&v114(twice, ""));
    assert!(
        e.iter()
            .any(|m| m.contains("members[1]: the same expression as members[0]")),
        "{e:?}"
    );
}

#[test]
fn raid_members_are_volume_locator_expressions_and_exclude_a_single_disk() {
    let glob = RAID.replace("disk.serial == \"S2\"", "glob(\"S*\", disk.serial)");
    let e = errors(&v114(&glob, ""));
    assert!(
        e.iter().any(
            |m| m.contains("members[1]: not a RAID member expression") && m.contains("no glob")
        ),
        "{e:?}"
    );
    let sys = RAID.replace("- disk.serial == \"S2\"", "- '!system_disk'");
    let e = errors(&v114(&sys, ""));
    assert!(e.iter().any(|m| m.contains("'system_disk'")), "{e:?}");
    let both = format!("    installDisk: /dev/sda\n{RAID}");
    let e = errors(&v114(&both, ""));
    assert!(
        e.iter()
            .any(|m| m.contains("installRaid and installDisk/diskSelector are both set")),
        "{e:?}"
    );
    let name = RAID.replace(
        "    installRaid:\n",
        "    installRaid:\n      name: boot:0\n",
    );
    let e = errors(&v114(&name, ""));
    assert!(
        e.iter()
            .any(|m| m.contains("`boot:0` is not a RAID array name Talos accepts")),
        "{e:?}"
    );
}

const ROLE_ETCD: &str = "  controlplane:\n    type: controlplane\n    systemVolumes:\n      \
                         ETCD: {minSize: 2GB, maxSize: 8GB}\n  worker:\n    type: worker\n    \
                         systemVolumes:\n      LOG: {maxSize: 1GB}\n";

/// Role volumes reach every node of the role; a node's own volume of the same name wins.
#[test]
fn system_volumes_fold_from_roles_and_nodes() {
    let node = "    installDisk: /dev/sda\n    systemVolumes:\n      LOG:\n        \
                diskSelector: {match: 'disk.serial == \"L1\"'}\n        maxSize: 4GB\n        \
                grow: false";
    let inv = load_ok(&v114(node, ROLE_ETCD));
    let cp = &inv.node("cp-1").unwrap().storage.volumes;
    assert_eq!(cp.len(), 1);
    assert_eq!(cp[0].name, SystemVolumeName::Etcd);
    assert_eq!(cp[0].min_size.as_deref(), Some("2GB"));
    assert_eq!(cp[0].max_size, "8GB");
    let wk = &inv.node("wk-1").unwrap().storage.volumes;
    assert_eq!(wk.len(), 1);
    assert_eq!(wk[0].max_size, "4GB");
    assert_eq!(wk[0].grow, Some(false));
    assert_eq!(
        wk[0].selector.as_ref().map(|s| s.value.as_str()),
        Some("disk.serial == \"L1\"")
    );
}

/// Without `maxSize` the partition would take all free space before EPHEMERAL is placed.
#[test]
fn a_volume_without_max_size_or_with_min_over_max_is_refused() {
    let roles =
        "  controlplane:\n    type: controlplane\n    systemVolumes:\n      ETCD: {minSize: 2GB}\n";
    let e = errors(&v114("    installDisk: /dev/sda", roles));
    assert!(
        e.iter().any(|m| m.contains(
            "roles.controlplane.systemVolumes.ETCD.maxSize: required field `maxSize` is missing"
        )),
        "{e:?}"
    );
    let roles = "  controlplane:\n    type: controlplane\n    systemVolumes:\n      \
                 ETCD: {minSize: 8GB, maxSize: 2GB}\n";
    let e = errors(&v114("    installDisk: /dev/sda", roles));
    assert!(
        e.iter()
            .any(|m| m.contains("minSize 8GB is greater than maxSize 2GB")),
        "{e:?}"
    );
    let roles = "  controlplane:\n    type: controlplane\n    systemVolumes:\n      \
                 CRI: {maxSize: 2GB}\n      LOG: {maxSize: 2GB, diskSelector: {match: 'disk.size > 10 * GiB'}}\n";
    let e = errors(&v114("    installDisk: /dev/sda", roles));
    assert!(
        e.iter()
            .any(|m| m.contains("`CRI` is not a system volume talboot places")),
        "{e:?}"
    );
    assert!(
        e.iter().any(
            |m| m.contains("LOG.diskSelector.match: not a disk expression Talos v1.14 accepts")
        ),
        "{e:?}"
    );
}

/// Below v1.14 neither document exists: both requests are refused at their line.
#[test]
fn raid_and_system_volumes_need_v1_14() {
    let v113 = |node: &str, roles: &str| {
        v114(node, roles).replacen("talosVersion: v1.14.0", "talosVersion: v1.13.9", 1)
    };
    let e = errors(&v113(RAID, ""));
    assert!(
        e.iter().any(|m| m.contains(
            "installing onto a RAID array needs Talos v1.14 or later (RAIDArrayConfig); this \
             cluster runs v1.13.9"
        )),
        "{e:?}"
    );
    assert!(
        !e.iter().any(|m| m.contains("a CEL disk expression")),
        "{e:?}"
    );
    let e = errors(&v113("    installDisk: /dev/sda", ROLE_ETCD));
    assert!(
        e.iter().any(|m| m.contains(
            "role controlplane: systemVolumes.ETCD: a dedicated ETCD partition needs Talos \
             v1.14 or later"
        )),
        "{e:?}"
    );
}
