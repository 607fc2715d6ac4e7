//! What a node asks of its disks beyond the install target (Talos v1.14 and later): a RAID1
//! array to install onto, and ETCD/LOG volumes on partitions of their own.
//!
//! The rules that make a request safe to boot are facts of siderolabs/talos v1.14.0-rc.1
//! that Talos itself does not enforce (see `docs/design/talos-v114-items-4-6.md` §4): a boot
//! array must be raid1 with metadata 1.0, and a dedicated volume needs a `maxSize` or it
//! swallows the free space EPHEMERAL needs. The inventory reader refuses what breaks them,
//! so the values here are always ones talboot can render.

use std::fmt;

use super::diag::Loc;
use super::model::Spanned;

/// `minMembers` of Talos's `MDArrayReconcileController`: fewer matched disks leave the
/// array `waiting` forever.
pub const MIN_RAID_MEMBERS: usize = 2;

/// `maxRAIDArrayNameLength`: mdadm stamps the name into the metadata.
pub const MAX_RAID_NAME: usize = 32;

/// The by-id link udev publishes for an array Talos created (`md.DevicePath`: homehost
/// `talos`, so `md-name-talos:<name>`, not the `md-name-<name>` the field doc says).
pub fn md_device_path(name: &str) -> String {
    format!("/dev/disk/by-id/md-name-talos:{name}")
}

/// True for a name Talos's `RAIDArrayConfig.Validate` accepts: 1 to 32 ASCII letters,
/// digits, `-` and `_`.
pub fn is_raid_name(name: &str) -> bool {
    (1..=MAX_RAID_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A RAID1 array (`RAIDArrayConfig`, level raid1, metadata 1.0) that Talos is installed onto.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaidInstall {
    /// The array's name (`md-name-talos:<name>`).
    pub name: Spanned<String>,
    /// One CEL expression per member disk, each meant to match exactly one disk (checked
    /// against the disks the node reports before the config is applied). Checked at load in
    /// the `VolumeLocator` environment, restricted to `disk` (no `volume`, `system_disk` or
    /// `glob`).
    pub members: Vec<Spanned<String>>,
}

impl RaidInstall {
    /// The array's stable device link.
    pub fn device_path(&self) -> String {
        md_device_path(&self.name.value)
    }

    /// The `UnattendedInstallConfig` selector that targets the array, as Talos's RAID-boot
    /// CI patch writes it (`hack/test/patches/md-boot-array.yaml`).
    pub fn install_match(&self) -> String {
        format!("\"{}\" in disk.symlinks", self.device_path())
    }

    /// The array's one `provisioning.volumeSelector.match`: the members joined with `||`,
    /// each in parentheses, so the disks Talos takes are exactly the members' disks. The
    /// provisioner's check splits it back at the top-level `||`.
    pub fn volume_match(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("({})", m.value))
            .collect::<Vec<_>>()
            .join(" || ")
    }
}

/// The system volumes Talos v1.14 can move onto a partition of their own and talboot
/// offers (`PromotableSystemVolumeNames` also lists CRI and KUBELET).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SystemVolumeName {
    /// etcd's data (`/var/lib/etcd`).
    Etcd,
    /// Logs (`/var/log`).
    Log,
}

impl SystemVolumeName {
    /// Every accepted spelling (Talos's volume IDs).
    pub const WORDS: &'static [&'static str] = &["ETCD", "LOG"];

    /// Talos's volume ID.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Etcd => "ETCD",
            Self::Log => "LOG",
        }
    }

    /// The volume called `s`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ETCD" => Some(Self::Etcd),
            "LOG" => Some(Self::Log),
            _ => None,
        }
    }
}

impl fmt::Display for SystemVolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dedicated ETCD or LOG partition (`VolumeConfig` with provisioning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemVolume {
    /// Which volume.
    pub name: SystemVolumeName,
    /// The disk, as a CEL expression in Talos's `DiskLocator` environment; `None` leaves
    /// Talos's default, the system disk.
    pub selector: Option<Spanned<String>>,
    /// `provisioning.minSize` as written (Talos's default is 2 GiB).
    pub min_size: Option<String>,
    /// `provisioning.maxSize` as written; required (see the module docs).
    pub max_size: String,
    /// `provisioning.grow` (Talos's default for these volumes is false).
    pub grow: Option<bool>,
    /// Where the volume is written.
    pub(crate) loc: Loc,
}

/// A node's storage requests; empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Storage {
    /// The RAID1 array Talos is installed onto (then the install target selects it).
    pub raid: Option<RaidInstall>,
    /// Dedicated system volumes, by name, the node's own over its roles'.
    pub volumes: Vec<SystemVolume>,
}

impl Storage {
    /// True when nothing is asked for.
    pub fn is_empty(&self) -> bool {
        self.raid.is_none() && self.volumes.is_empty()
    }
}

/// Gives each node the system volumes of its role chain (root ancestor first, a later role's
/// volume replacing an earlier one of the same name), its own replacing theirs.
pub(crate) fn fold_role_volumes(
    nodes: &mut [super::model::Node],
    role_volumes: &std::collections::BTreeMap<String, Vec<SystemVolume>>,
    roles: &std::collections::BTreeMap<String, super::model::ResolvedRole>,
) {
    for node in nodes {
        let Some(role) = roles.get(node.role.as_str()) else {
            continue;
        };
        let mut folded: Vec<SystemVolume> = Vec::new();
        let layers = role
            .chain
            .iter()
            .filter_map(|r| role_volumes.get(r))
            .chain(std::iter::once(&node.storage.volumes));
        for layer in layers {
            for v in layer {
                folded.retain(|f| f.name != v.name);
                folded.push(v.clone());
            }
        }
        folded.sort_by_key(|v| v.name);
        node.storage.volumes = folded;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raid(members: &[&str]) -> RaidInstall {
        let loc = Loc::file_only(std::path::Path::new("t.yaml"));
        RaidInstall {
            name: Spanned::new("boot".into(), loc.clone()),
            members: members
                .iter()
                .map(|m| Spanned::new((*m).to_owned(), loc.clone()))
                .collect(),
        }
    }

    /// The install selector and device are exactly those of Talos's RAID-boot CI patch.
    #[test]
    fn the_install_selector_is_talos_ci_patchs() {
        let r = raid(&["disk.serial == \"A\"", "disk.serial == \"B\""]);
        assert_eq!(r.device_path(), "/dev/disk/by-id/md-name-talos:boot");
        assert_eq!(
            r.install_match(),
            "\"/dev/disk/by-id/md-name-talos:boot\" in disk.symlinks"
        );
        assert_eq!(
            r.volume_match(),
            "(disk.serial == \"A\") || (disk.serial == \"B\")"
        );
    }

    /// `RAIDArrayConfig.Validate`: 1-32 characters, ASCII letters, digits, `-`, `_`.
    #[test]
    fn raid_names_follow_talos() {
        for ok in ["boot", "md_0", "A-b", &"x".repeat(32)] {
            assert!(is_raid_name(ok), "{ok}");
        }
        for bad in ["", "a b", "boot:1", "ü", &"x".repeat(33)] {
            assert!(!is_raid_name(bad), "{bad}");
        }
    }
}
