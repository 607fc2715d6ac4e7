//! `installRaid` (a node's) and `systemVolumes` (a role's or a node's) in `talboot.yaml`.
//!
//! Each refusal names what Talos would do with the value (not boot from the array, starve
//! EPHEMERAL) and the fix; the rules come from siderolabs/talos v1.14.0-rc.1 (see
//! [`crate::inventory::storage`]).

use crate::inventory::diag::Diagnostics;
use crate::inventory::model::Spanned;
use crate::inventory::read::{self, missing};
use crate::inventory::storage::{
    MIN_RAID_MEMBERS, RaidInstall, SystemVolume, SystemVolumeName, is_raid_name,
};
use crate::inventory::yaml::{MapReader, Node as Y, Value, join};

/// The array name when none is written: the one Talos's own RAID-boot test uses.
const DEFAULT_RAID_NAME: &str = "boot";

/// A node's `installRaid`: a RAID1 array, metadata 1.0, of at least two member disks.
pub(super) fn install_raid(n: &Y, path: &str, d: &mut Diagnostics) -> Option<RaidInstall> {
    let mut r = MapReader::new(n, path, d)?;
    let name = raid_name(&mut r, d);
    let level_ok = fixed_word(&mut r, "level", "raid1", d, LEVEL_HINT);
    let metadata_ok = fixed_word(&mut r, "metadata", "1.0", d, METADATA_HINT);
    let members = match r.get("members") {
        Some(m) => raid_members(m, &r.field("members"), d),
        None => {
            missing(
                d,
                r.loc(),
                path,
                "members",
                "list one CEL expression per member disk, e.g. members: \
                 ['disk.serial == \"S1\"', 'disk.serial == \"S2\"']",
            );
            None
        }
    };
    r.finish(&["name", "level", "metadata", "members"], d);
    if !(level_ok && metadata_ok) {
        return None;
    }
    Some(RaidInstall {
        name: name?,
        members: members?,
    })
}

const LEVEL_HINT: &str = "Talos boots only from raid1 (the only level RAIDArrayConfig has); \
                          write level: raid1 or leave it out";
const METADATA_HINT: &str = "a boot array needs metadata 1.0, whose superblock sits at the end \
                             of each member so the firmware reads the EFI partition as on a \
                             plain disk; Talos does not check this itself. Write \
                             metadata: \"1.0\" or leave it out";

/// `name`, defaulting to `boot`, refused unless Talos's `RAIDArrayConfig.Validate` accepts it.
fn raid_name(r: &mut MapReader<'_>, d: &mut Diagnostics) -> Option<Spanned<String>> {
    let Some(n) = r.get("name") else {
        return Some(Spanned::new(DEFAULT_RAID_NAME.to_owned(), r.loc().clone()));
    };
    let p = r.field("name");
    let s = read::string(n, &p, d)?;
    if is_raid_name(&s) {
        return Some(Spanned::new(s, n.loc.clone()));
    }
    d.error_hint(
        &n.loc,
        p,
        format!("`{s}` is not a RAID array name Talos accepts"),
        "1 to 32 ASCII letters, digits, hyphens and underscores, e.g. name: boot",
    );
    None
}

/// A key whose only bootable value is `want`: absent or `want` is fine, anything else is
/// refused with `hint`. False when refused.
fn fixed_word(
    r: &mut MapReader<'_>,
    key: &str,
    want: &str,
    d: &mut Diagnostics,
    hint: &str,
) -> bool {
    let Some(n) = r.get(key) else { return true };
    let p = r.field(key);
    let Some(s) = n.scalar_text() else {
        d.error_hint(
            &n.loc,
            p,
            format!("expected {want}, found {}", n.kind()),
            hint,
        );
        return false;
    };
    if s == want {
        return true;
    }
    d.error_hint(
        &n.loc,
        p,
        format!("{key} `{s}` cannot boot: the install array must be {key} {want}"),
        hint,
    );
    false
}

/// The member expressions: at least two, no two alike, each one Talos's `VolumeLocator`
/// environment accepts (talboot allows only `disk` in them).
fn raid_members(n: &Y, path: &str, d: &mut Diagnostics) -> Option<Vec<Spanned<String>>> {
    let errors = d.error_count();
    let members = read::list(n, path, d, false, |m, p, d| {
        let text = read::string(m, p, d)?;
        match crate::talosfacts::disk_cel::compile_member(&text) {
            Ok(_) => Some(Spanned::new(text, m.loc.clone())),
            Err(e) => {
                d.error_hint(
                    &m.loc,
                    p,
                    format!("not a RAID member expression talboot can check: {e}"),
                    "match one disk by what stays put, e.g. disk.serial == \"S1\" or \
                     \"/dev/disk/by-id/<link>\" in disk.symlinks; sizes are uint (500u * GB)",
                );
                None
            }
        }
    });
    if d.error_count() > errors {
        return None;
    }
    if members.len() < MIN_RAID_MEMBERS {
        d.error_hint(
            &n.loc,
            path,
            format!(
                "{} member(s): Talos waits for at least {MIN_RAID_MEMBERS} before it creates \
                 the array (\"waiting for enough member disks\"), so the node would never \
                 install",
                members.len()
            ),
            "list two or more member disks, one expression each",
        );
        return None;
    }
    for (i, m) in members.iter().enumerate() {
        if let Some(j) = members[..i].iter().position(|o| o.value == m.value) {
            d.error_hint(
                &m.loc,
                read_index(path, i),
                format!("the same expression as members[{j}]: both would match the same disk"),
                "each member expression must match its own disk",
            );
            return None;
        }
    }
    Some(members)
}

fn read_index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// `systemVolumes`: a mapping from `ETCD`/`LOG` to the partition Talos gives it.
pub(crate) fn system_volumes(n: &Y, path: &str, d: &mut Diagnostics) -> Vec<SystemVolume> {
    let Value::Map(entries) = &n.value else {
        d.error_hint(
            &n.loc,
            path,
            format!(
                "expected a mapping of volume name to volume, found {}",
                n.kind()
            ),
            "e.g. systemVolumes: {ETCD: {minSize: 2GB, maxSize: 8GB}}",
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, body) in entries {
        let p = join(path, &key.name);
        let Some(name) = SystemVolumeName::parse(&key.name) else {
            d.error_hint(
                &key.loc,
                &p,
                format!("`{}` is not a system volume talboot places", key.name),
                format!(
                    "valid names: {} (Talos's volume IDs, upper case)",
                    SystemVolumeName::WORDS.join(", ")
                ),
            );
            continue;
        };
        out.extend(system_volume(name, body, &p, d));
    }
    out
}

/// One dedicated volume: `diskSelector.match`, `minSize`, `maxSize` (required), `grow`.
fn system_volume(
    name: SystemVolumeName,
    n: &Y,
    path: &str,
    d: &mut Diagnostics,
) -> Option<SystemVolume> {
    let mut r = MapReader::new(n, path, d)?;
    let errors = d.error_count();
    let selector = r
        .get("diskSelector")
        .and_then(|s| volume_selector(s, &r.field("diskSelector"), d));
    let min = r
        .get("minSize")
        .and_then(|s| size(s, &r.field("minSize"), d));
    let max = match r.get("maxSize") {
        Some(s) => size(s, &r.field("maxSize"), d),
        None => {
            missing(
                d,
                r.loc(),
                path,
                "maxSize",
                &format!(
                    "without maxSize Talos gives {name} all the free space of its disk: it \
                     places volumes that do not grow before EPHEMERAL, so EPHEMERAL would not \
                     fit on the system disk; write e.g. maxSize: 8GB"
                ),
            );
            None
        }
    };
    let grow = r
        .get("grow")
        .and_then(|g| read::boolean(g, &r.field("grow"), d));
    r.finish(&["diskSelector", "minSize", "maxSize", "grow"], d);
    let max = max?;
    if let Some((min_text, min_bytes)) = &min
        && *min_bytes > max.1
    {
        d.error_hint(
            &n.loc,
            path,
            format!(
                "minSize {min_text} is greater than maxSize {}: Talos refuses the VolumeConfig \
                 (\"min size is greater than max size\")",
                max.0
            ),
            "make minSize at most maxSize",
        );
    }
    (d.error_count() == errors).then(|| SystemVolume {
        name,
        selector,
        min_size: min.map(|m| m.0),
        max_size: max.0,
        grow,
        loc: n.loc.clone(),
    })
}

/// A size Talos's `ByteSize` reads (`1GB`, `2.5GiB`), with its bytes. Percentages and
/// negative sizes, which Talos also reads for `maxSize`, are not offered: talboot checks
/// the partition against the disk's size before it exists.
fn size(n: &Y, path: &str, d: &mut Diagnostics) -> Option<(String, u64)> {
    read::parsed(n, path, d, "a size", "8GB", |s| {
        crate::inventory::size::parse_bytes(s).map(|b| (s.to_owned(), b))
    })
    .map(|s| s.value)
}

/// `diskSelector: {match: <CEL>}`: Talos's `DiskLocator` environment, checked now.
fn volume_selector(n: &Y, path: &str, d: &mut Diagnostics) -> Option<Spanned<String>> {
    let mut r = MapReader::new(n, path, d)?;
    let m = r.get("match");
    let p = r.field("match");
    r.finish(&["match"], d);
    let Some(m) = m else {
        missing(
            d,
            n_loc(n),
            path,
            "match",
            "a CEL expression for the volume's disk, e.g. match: disk.serial == \"S3\"; \
             leave diskSelector out to keep the volume on the system disk",
        );
        return None;
    };
    let text = read::string(m, &p, d)?;
    match crate::talosfacts::disk_cel::compile(&text) {
        Ok(_) => Some(Spanned::new(text, m.loc.clone())),
        Err(e) => {
            d.error_hint(
                &m.loc,
                p,
                format!("not a disk expression Talos v1.14 accepts: {e}"),
                "the variables are disk (disk.serial, disk.size, disk.transport, \
                 disk.symlinks) and system_disk; sizes are uint, so write 500u * GB",
            );
            None
        }
    }
}

fn n_loc(n: &Y) -> &crate::inventory::diag::Loc {
    &n.loc
}
