//! The per-node parts the store persists besides the node record ([`super::NodePart`]): the
//! hardware facts read in maintenance mode ([`NodeFacts`], with each disk's [`DiskFacts`])
//! and what the node state machine remembers besides the phase ([`Lifecycle`]).
//!
//! The provisioner (`provision::node`) decides and writes them; the read view, the admin
//! API and `talboot status` read them, so their types, encoding and loading live here, below
//! all of those. Talos's install-disk rules over these facts stay in `provision::disks`.

use crate::inventory::DiskType;

use super::NodePart;

/// Hardware facts read in maintenance mode, stored under `node/<name>/facts`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeFacts {
    /// Talos version of the maintenance system.
    pub talos_version: String,
    /// SMBIOS system UUID; `None` on a machine without SMBIOS tables (Talos then has no
    /// `SystemInformations.hardware.talos.dev` resource).
    pub system_uuid: Option<String>,
    /// SMBIOS manufacturer (`None` without SMBIOS).
    pub manufacturer: Option<String>,
    /// SMBIOS product name (`None` without SMBIOS).
    pub(crate) product_name: Option<String>,
    /// SMBIOS serial number (`None` without SMBIOS).
    pub serial_number: Option<String>,
    /// The disks, in Talos's list order.
    pub disks: Vec<DiskFacts>,
    /// The disk Talos will install to, as talboot computed it (`/dev/...`).
    pub install_disk: String,
}

impl NodeFacts {
    /// The facts stored for `node`, if any.
    pub fn load(store: &dyn crate::store::Store, node: &str) -> Option<NodeFacts> {
        let raw = store.node_part(node, NodePart::Facts).ok().flatten()?;
        serde_json::from_slice(&raw).ok()
    }
}

impl Lifecycle {
    /// The lifecycle stored for `node` (empty when there is none, or it is unreadable).
    pub fn load(
        store: &dyn crate::store::Store,
        node: &str,
    ) -> Result<Lifecycle, crate::store::StoreError> {
        Ok(decode_lifecycle(
            store.node_part(node, NodePart::Lifecycle)?.as_deref(),
        ))
    }
}

/// What the node state machine remembers across restarts besides the phase, stored as JSON
/// in the store's `node_lifecycle` table (fields may be added; absent ones take their
/// defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lifecycle {
    /// Why the node is Failed (what `talboot status` shows); cleared when it leaves Failed.
    #[serde(default)]
    pub failure: Option<String>,
    /// The secured API answered since the config was applied: the node left maintenance
    /// mode, so finding it in maintenance again means the install failed.
    #[serde(default)]
    pub(crate) install_seen: bool,
    /// When the Reset RPC answered (Unix seconds); the rebuild waits for the node to come
    /// back in maintenance mode until the reset timeout after it.
    #[serde(default)]
    pub(crate) reset_at_unix: Option<u64>,
    /// The persistent disk boot device was asked for after this install
    /// (`provision::core::Effect::SetDiskBoot`); cleared by a rebuild.
    #[serde(default)]
    pub(crate) disk_boot_set: bool,
}

/// Decodes a stored [`Lifecycle`]; an unreadable one counts as empty (it only refines
/// what the phase already says).
pub(crate) fn decode_lifecycle(raw: Option<&[u8]>) -> Lifecycle {
    raw.and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default()
}

/// What talboot knows about one disk of a node: the COSI `block.Disk` spec fields the
/// selector matches on (every field of v1.14's `DiskSpec`, which the CEL `disk` variable
/// holds), completed by `storage.Disks`. Fields added later load as empty from old records.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskFacts {
    /// Full device path, `/dev/<kernel name>` (`dev_path`; `storage.Disks` `device_name`).
    pub dev_path: String,
    /// Model string.
    pub model: String,
    /// Serial number.
    pub serial: String,
    /// Size in bytes.
    pub size: u64,
    /// World-wide identifier.
    pub wwid: String,
    /// Disk UUID (`/sys/block/<dev>/uuid`).
    #[serde(default)]
    pub uuid: String,
    /// Kernel modalias.
    #[serde(default)]
    pub modalias: String,
    /// Kernel bus path (stable across NVMe renumbering).
    pub bus_path: String,
    /// Transport (`nvme`, `sata`, `virtio`, `mmc`, ...) from COSI; empty for device-mapper
    /// and other virtual disks, and when COSI was not read.
    pub transport: String,
    /// Rotational (`/sys/block/<dev>/queue/rotational`), from COSI.
    #[serde(default)]
    pub rotational: bool,
    /// storaged's classification (CD, NVME, SD, HDD, SSD, unknown); shown, never matched on.
    #[serde(with = "kind_name")]
    pub kind: Option<DiskType>,
    /// Read-only device.
    pub readonly: bool,
    /// CD-ROM drive.
    pub cdrom: bool,
    /// Other names of the device (`/dev/disk/by-id/...`), from COSI, sorted.
    pub symlinks: Vec<String>,
    /// Preferred I/O size in bytes (`io_size`), from COSI; 0 when unknown.
    #[serde(default)]
    pub io_size: u64,
    /// Logical sector size in bytes (`sector_size`), from COSI; 0 when unknown.
    #[serde(default)]
    pub sector_size: u64,
    /// Kernel subsystem (`sub_system`, e.g. `/sys/class/block`), from COSI.
    #[serde(default)]
    pub sub_system: String,
    /// Talos's own rendering of the size (`pretty_size`, go-humanize), from COSI.
    #[serde(default)]
    pub pretty_size: String,
    /// Device-mapper and similar disks stacked on this one (`secondary_disks`), from COSI.
    #[serde(default)]
    pub secondary_disks: Vec<String>,
    /// Firmware revision (`firmware_version`, Talos v1.14 and later), from COSI.
    #[serde(default)]
    pub firmware_version: String,
    /// Whether these facts come from the COSI `block.Disk` resource (transport, rotational
    /// and links known), not only from `storage.Disks`.
    #[serde(default)]
    pub(crate) from_cosi: bool,
}

/// `DiskType` by its inventory word (`ssd`, `nvme`, ...) in stored facts.
mod kind_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::inventory::DiskType;

    pub(crate) fn serialize<S: Serializer>(k: &Option<DiskType>, s: S) -> Result<S::Ok, S::Error> {
        match k {
            Some(k) => s.serialize_some(k.as_str()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DiskType>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.and_then(|w| DiskType::parse(&w)))
    }
}
