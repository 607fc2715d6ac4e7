//! One entry of `nodes` in `talboot.yaml`, with its extra interfaces.

use std::path::Path;

use crate::inventory::diag::Diagnostics;
use crate::inventory::model::*;
use crate::inventory::read::{self, missing};
use crate::inventory::yaml::{MapReader, Node as Y};

const NODE: &[&str] = &[
    "name",
    "mac",
    "macs",
    "role",
    "address",
    "gateway",
    "installDisk",
    "diskSelector",
    "installRaid",
    "systemVolumes",
    "arch",
    "firmware",
    "kernelArgs",
    "localBoot",
    "patches",
    "labels",
    "taints",
    "interfaces",
    "power",
    "secureBoot",
];

pub(super) fn node(
    n: &Y,
    path: &str,
    base: &Path,
    role_refs: &mut Vec<(String, Spanned<String>)>,
    power: &mut std::collections::BTreeMap<String, crate::inventory::power::PowerBlock>,
    d: &mut Diagnostics,
) -> Option<Node> {
    let mut r = MapReader::new(n, path, d)?;
    let f = |k: &str| format!("{path}.{k}");
    let (name, macs, role, address) = identity(&mut r, path, role_refs, d);
    let gateway = r
        .get("gateway")
        .and_then(|n| read::ipv4(n, &f("gateway"), d));
    let placement = placement(&mut r, path, d);
    let arch = r
        .get("arch")
        .and_then(|n| read::word(n, &f("arch"), d, Arch::WORDS, Arch::parse));
    let firmware = r
        .get("firmware")
        .and_then(|n| read::word(n, &f("firmware"), d, Firmware::WORDS, Firmware::parse));
    let secure_boot = r.get("secureBoot").and_then(|n| {
        read::boolean(n, &f("secureBoot"), d).map(|b| Spanned::new(b, n.loc.clone()))
    });
    let kernel_args = r
        .get("kernelArgs")
        .map(|n| read::kernel_args(n, &f("kernelArgs"), d))
        .unwrap_or_default();
    let local_boot = r
        .get("localBoot")
        .and_then(|n| read::word(n, &f("localBoot"), d, LocalBoot::WORDS, LocalBoot::parse));
    let patches = r
        .get("patches")
        .map(|n| read::patches(n, &f("patches"), base, d))
        .unwrap_or_default();
    let labels = r
        .get("labels")
        .map(|n| read::labels(n, &f("labels"), d))
        .unwrap_or_default();
    let taints = r
        .get("taints")
        .map(|n| read::taints(n, &f("taints"), d))
        .unwrap_or_default();
    let interfaces = r
        .get("interfaces")
        .map(|n| read::list(n, &f("interfaces"), d, false, extra_interface))
        .unwrap_or_default();
    if let (Some(b), Some(name)) = (
        r.get("power")
            .and_then(|n| crate::inventory::power::PowerBlock::read(n, &f("power"), d)),
        &name,
    ) {
        power.insert(name.value.clone(), b);
    }
    r.finish(NODE, d);
    if macs.is_empty() {
        return None;
    }
    let (install, storage) = placement?;
    Some(Node {
        name: name?,
        macs,
        role: role?,
        address: address?,
        gateway,
        install,
        arch,
        firmware,
        kernel_args,
        local_boot,
        patches,
        labels,
        taints,
        interfaces,
        power: None,
        storage,
        secure_boot,
    })
}

/// Where Talos installs and what else the node asks of its disks: `installRaid` (which
/// makes the install target the array's link) or `installDisk`/`diskSelector`, and
/// `systemVolumes`. `None` when the install target or the array could not be read (reported).
fn placement(
    r: &mut MapReader<'_>,
    path: &str,
    d: &mut Diagnostics,
) -> Option<(InstallTarget, crate::inventory::storage::Storage)> {
    let f = |k: &str| format!("{path}.{k}");
    let raid = r
        .get("installRaid")
        .map(|n| super::storage::install_raid(n, &f("installRaid"), d));
    let install = install_target(r, path, raid.is_some(), d);
    let volumes = r
        .get("systemVolumes")
        .map(|n| super::storage::system_volumes(n, &f("systemVolumes"), d))
        .unwrap_or_default();
    let (install, raid) = match raid {
        Some(raid) => {
            let raid = raid?;
            let link = Spanned::new(raid.install_match(), raid.name.loc.clone());
            let selector = DiskSelector {
                expr: Some(link),
                ..DiskSelector::default()
            };
            (InstallTarget::Selector(selector), Some(raid))
        }
        None => (install?, None),
    };
    Some((
        install,
        crate::inventory::storage::Storage { raid, volumes },
    ))
}

/// Name, MACs, role and address; each `None` (or no MAC) when missing or unreadable
/// (already reported).
type Identity = (
    Option<Spanned<String>>,
    Vec<Spanned<Mac>>,
    Option<Spanned<String>>,
    Option<Spanned<Ipv4Net>>,
);

/// The required fields that say which machine this is and where it lives, read in this
/// order; the role is also recorded in `role_refs` for the check that it names a role.
fn identity(
    r: &mut MapReader<'_>,
    path: &str,
    role_refs: &mut Vec<(String, Spanned<String>)>,
    d: &mut Diagnostics,
) -> Identity {
    let loc = r.loc().clone();
    let f = |k: &str| format!("{path}.{k}");
    let name = match r.get("name") {
        Some(n) => read::hostname(n, &f("name"), d),
        None => {
            missing(
                d,
                &loc,
                path,
                "name",
                "the node's hostname, e.g. name: k8s-ctrl-01",
            );
            None
        }
    };
    let macs = macs(r, path, d);
    let role = match r.get("role") {
        Some(n) => read::string(n, &f("role"), d).map(|s| Spanned::new(s, n.loc.clone())),
        None => {
            missing(d, &loc, path, "role", "e.g. role: controlplane");
            None
        }
    };
    if let Some(role) = &role {
        role_refs.push((f("role"), role.clone()));
    }
    let address = match r.get("address") {
        Some(n) => read::ipv4_net(n, &f("address"), d),
        None => {
            missing(
                d,
                &loc,
                path,
                "address",
                "the node's static address, e.g. address: 10.0.40.11/24",
            );
            None
        }
    };
    (name, macs, role, address)
}

/// `mac` and `macs` together: the node's NICs, at least one of them written.
fn macs(r: &mut MapReader<'_>, path: &str, d: &mut Diagnostics) -> Vec<Spanned<Mac>> {
    let loc = r.loc().clone();
    let f = |k: &str| format!("{path}.{k}");
    let mut macs = Vec::new();
    let mut mac_written = false;
    if let Some(m) = r.get("mac") {
        mac_written = true;
        macs.extend(read::mac(m, &f("mac"), d));
    }
    if let Some(m) = r.get("macs") {
        mac_written = true;
        macs.extend(read::list(m, &f("macs"), d, true, read::mac));
    }
    if !mac_written {
        missing(
            d,
            &loc,
            path,
            "mac",
            "the boot NIC's hardware address, e.g. mac: bc:24:11:4e:00:01",
        );
    }
    macs
}

/// Where Talos installs: `installDisk` or `diskSelector`, exactly one of them, unless the
/// node installs onto a RAID array (`installRaid`, read by the caller), which excludes both.
fn install_target(
    r: &mut MapReader<'_>,
    path: &str,
    raid: bool,
    d: &mut Diagnostics,
) -> Option<InstallTarget> {
    let loc = r.loc().clone();
    let f = |k: &str| format!("{path}.{k}");
    let disk = r.get("installDisk");
    let selector = r.get("diskSelector");
    if raid {
        if let Some(other) = disk.or(selector) {
            d.error_hint(
                &other.loc,
                path,
                "installRaid and installDisk/diskSelector are both set",
                "keep installRaid to install onto the array (Talos selects it by its \
                 md-name link), or drop it to install onto one disk",
            );
        }
        return None;
    }
    match (disk, selector) {
        (Some(_), Some(s)) => {
            d.error_hint(
                &s.loc,
                f("diskSelector"),
                "both installDisk and diskSelector are set",
                "keep one: installDisk for a fixed path, diskSelector when device names are not stable (NVMe)",
            );
            None
        }
        (Some(n), None) => {
            read::parsed(n, &f("installDisk"), d, "a device path", "/dev/sda", |s| {
                if s.starts_with("/dev/") && s.len() > 5 {
                    Ok(s.to_string())
                } else {
                    Err("must start with /dev/")
                }
            })
            .map(|s| InstallTarget::Disk(s.value))
        }
        (None, Some(s)) => {
            read::disk_selector(s, &f("diskSelector"), d).map(InstallTarget::Selector)
        }
        (None, None) => {
            d.error_hint(
                &loc,
                path,
                "no install disk: set installDisk or diskSelector",
                "e.g. installDisk: /dev/sda, or diskSelector: {model: \"Samsung SSD 980*\"}; from \
                 Talos v1.14 on, installRaid installs onto a RAID1 array",
            );
            None
        }
    }
}

fn extra_interface(n: &Y, path: &str, d: &mut Diagnostics) -> Option<ExtraInterface> {
    let mut r = MapReader::new(n, path, d)?;
    let mac = match r.get("mac") {
        Some(m) => read::mac(m, &format!("{path}.mac"), d),
        None => {
            missing(d, r.loc(), path, "mac", "the NIC's hardware address");
            None
        }
    };
    let addresses = r
        .get("addresses")
        .map(|a| read::list(a, &format!("{path}.addresses"), d, true, read::ipv4_net))
        .unwrap_or_default();
    let mtu = r.get("mtu").and_then(|m| {
        read::parsed(m, &format!("{path}.mtu"), d, "an MTU", "9000", |s| {
            s.parse::<u32>()
                .ok()
                .filter(|v| (576..=65535).contains(v))
                .ok_or("expected a number from 576 to 65535")
        })
        .map(|s| s.value)
    });
    r.finish(&["mac", "addresses", "mtu"], d);
    Some(ExtraInterface {
        mac: mac?,
        addresses,
        mtu,
    })
}
