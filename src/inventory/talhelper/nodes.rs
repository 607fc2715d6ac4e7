//! The `nodes` list and the `controlPlane:`/`worker:` group settings: each node's identity,
//! install disk, boot NIC and labels, and the groups as the two roles.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use crate::inventory::diag::{Diagnostics, Loc};
use crate::inventory::model::*;
use crate::inventory::parts::{Parts, count_items};
use crate::inventory::read::{self, missing};
use crate::inventory::yaml::{MapReader, Node as Y, Value, index, join};

use super::cluster::FromNodes;
use super::images::image_fields;
use super::nic::nic;
use super::{NODE_SUPPORTED, unsupported};

/// The `controlPlane:` and `worker:` group settings, as the two roles.
pub(super) fn roles(r: &mut MapReader<'_>, base: &Path, d: &mut Diagnostics) -> Vec<RoleDef> {
    let mut roles = Vec::new();
    for (key, ty) in [
        ("controlPlane", MachineType::ControlPlane),
        ("worker", MachineType::Worker),
    ] {
        let Some(group) = r.get(key) else { continue };
        let Some(mut g) = MapReader::new(group, key, d) else {
            continue;
        };
        unsupported(
            d,
            &g,
            group,
            &[
                "patches",
                "nodeLabels",
                "nodeTaints",
                "schematic",
                "talosImageURL",
                "installDiskSelector",
                "installDisk",
            ],
        );
        let patches = g
            .get("patches")
            .map(|n| read::patches(n, &format!("{key}.patches"), base, d))
            .unwrap_or_default();
        let labels = g
            .get("nodeLabels")
            .map(|n| read::labels(n, &format!("{key}.nodeLabels"), d))
            .unwrap_or_default();
        let taints = g
            .get("nodeTaints")
            .map(|n| taint_map(n, &format!("{key}.nodeTaints"), d))
            .unwrap_or_default();
        roles.push(RoleDef {
            name: Spanned::new(ty.as_str().to_string(), group.loc.clone()),
            machine_type: Some(ty),
            extends: None,
            patches,
            labels,
            taints,
        });
    }
    roles
}

/// The `nodes` list into `parts`, collecting what the nodes say about the cluster.
pub(super) fn nodes(
    r: &mut MapReader<'_>,
    loc: &Loc,
    base: &Path,
    groups: &BTreeMap<&str, &Y>,
    parts: &mut Parts,
    d: &mut Diagnostics,
) -> FromNodes {
    let mut found = FromNodes::default();
    let Some(nodes) = r.get("nodes") else {
        missing(d, loc, "", "nodes", "list the cluster's nodes");
        return found;
    };
    parts.nodes_loc = Some(nodes.loc.clone());
    parts.nodes_written = count_items(nodes);
    parts.nodes = read::list(nodes, "nodes", d, false, |n, p, d| {
        let out = node(n, p, base, groups, d)?;
        if let Some(v) = out.vip {
            found.vip.get_or_insert(v);
        }
        found.gateways.extend(out.gateway.clone());
        if let Some(s) = out.schematic {
            found.schematic.get_or_insert(s);
        }
        if let Some(img) = out.image {
            found.installer_image.get_or_insert(img);
        }
        Some(out.node)
    });
    found
}

pub(super) struct TalNode {
    pub(super) node: Node,
    pub(super) vip: Option<Spanned<Ipv4Addr>>,
    pub(super) gateway: Option<Spanned<Ipv4Addr>>,
    pub(super) schematic: Option<String>,
    pub(super) image: Option<String>,
}

pub(super) fn node(
    n: &Y,
    path: &str,
    base: &Path,
    groups: &BTreeMap<&str, &Y>,
    d: &mut Diagnostics,
) -> Option<TalNode> {
    let mut r = MapReader::new(n, path, d)?;
    unsupported(d, &r, n, NODE_SUPPORTED);
    let loc = r.loc().clone();
    let f = |k: &str| format!("{path}.{k}");
    let name = match r.get("hostname") {
        Some(v) => read::hostname(v, &f("hostname"), d),
        None => {
            missing(d, &loc, path, "hostname", "e.g. hostname: k8s-ctrl-01");
            None
        }
    };
    let ip = boot_ip(&mut r, path, d)?;
    let cp = r
        .get("controlPlane")
        .and_then(|v| read::boolean(v, &f("controlPlane"), d))
        .unwrap_or(false);
    let group_key = if cp { "controlPlane" } else { "worker" };
    let group = groups.get(group_key).copied();

    let install = install_target(&mut r, group, path, d);

    let BootNic {
        macs,
        prefix,
        gateway,
        vip,
        extras,
    } = boot_nic(&mut r, path, ip.as_ref(), d)?;
    let address = address(ip.as_ref(), prefix, path, d);

    let labels = r
        .get("nodeLabels")
        .map(|v| read::labels(v, &f("nodeLabels"), d))
        .unwrap_or_default();
    let taints = r
        .get("nodeTaints")
        .map(|v| taint_map(v, &f("nodeTaints"), d))
        .unwrap_or_default();
    let patches = r
        .get("patches")
        .map(|v| read::patches(v, &f("patches"), base, d))
        .unwrap_or_default();
    let (schematic, image) = image_fields(&mut r, path, d);
    ignored_fields(&mut r, path, d);
    let node = Node {
        name: name?,
        macs,
        role: Spanned::new(group_key_role(cp).into(), loc.clone()),
        address: address?,
        gateway: None,
        install: install?,
        arch: None,
        firmware: None,
        kernel_args: Vec::new(),
        local_boot: None,
        patches,
        labels,
        taints,
        interfaces: extras,
        power: None,
        storage: Default::default(),
        secure_boot: None,
    };
    if node.macs.is_empty() {
        return None;
    }
    Some(TalNode {
        node,
        vip,
        gateway,
        schematic,
        image,
    })
}

/// `ipAddress`: the first of its comma-separated addresses, the one talboot reserves for the
/// node. The outer `None` stops reading the node (the value was not a string at all).
fn boot_ip(
    r: &mut MapReader<'_>,
    path: &str,
    d: &mut Diagnostics,
) -> Option<Option<Spanned<Ipv4Addr>>> {
    let loc = r.loc().clone();
    let f = |k: &str| format!("{path}.{k}");
    Some(match r.get("ipAddress") {
        Some(v) => {
            let text = read::string(v, &f("ipAddress"), d)?;
            let first = text.split(',').next().unwrap_or("").trim().to_string();
            match first.parse::<Ipv4Addr>() {
                Ok(ip) => Some(Spanned::new(ip, v.loc.clone())),
                Err(_) => {
                    d.error_hint(
                        &v.loc,
                        f("ipAddress"),
                        format!("`{first}` is not an IPv4 address"),
                        "e.g. ipAddress: 10.0.40.11",
                    );
                    None
                }
            }
        }
        None => {
            missing(
                d,
                &loc,
                path,
                "ipAddress",
                "talboot reserves this address for the node, e.g. ipAddress: 10.0.40.11",
            );
            None
        }
    })
}

/// Install disk: the node's own, else the group's.
fn install_target(
    r: &mut MapReader<'_>,
    group: Option<&Y>,
    path: &str,
    d: &mut Diagnostics,
) -> Option<InstallTarget> {
    let loc = r.loc().clone();
    let f = |k: &str| format!("{path}.{k}");
    let group_field = |key: &str| -> Option<&Y> {
        group.and_then(|g| match &g.value {
            Value::Map(es) => es.iter().find(|(k, _)| k.name == key).map(|(_, v)| v),
            _ => None,
        })
    };
    let disk = r.get("installDisk").or_else(|| group_field("installDisk"));
    let selector = r
        .get("installDiskSelector")
        .or_else(|| group_field("installDiskSelector"));
    match (disk, selector) {
        (Some(dk), None) => read::string(dk, &f("installDisk"), d).map(InstallTarget::Disk),
        (None, Some(s)) => {
            tal_disk_selector(s, &f("installDiskSelector"), d).map(InstallTarget::Selector)
        }
        (Some(_), Some(s)) => {
            d.error_hint(
                &s.loc,
                f("installDiskSelector"),
                "both installDisk and installDiskSelector are set",
                "keep one",
            );
            None
        }
        (None, None) => {
            d.error_hint(
                &loc,
                path,
                "no install disk: set installDisk or installDiskSelector",
                "e.g. installDisk: /dev/sda",
            );
            None
        }
    }
}

/// What the node's `networkInterfaces` give: the boot NIC's MAC, prefix length, default
/// gateway and VIP, and the other NICs as extra interfaces.
pub(super) struct BootNic {
    macs: Vec<Spanned<Mac>>,
    prefix: Option<u8>,
    gateway: Option<Spanned<Ipv4Addr>>,
    vip: Option<Spanned<Ipv4Addr>>,
    extras: Vec<ExtraInterface>,
}

/// NICs: the interface whose addresses hold ipAddress (or the first with a MAC) boots. The
/// outer `None` stops reading the node (`networkInterfaces` is not a list).
fn boot_nic(
    r: &mut MapReader<'_>,
    path: &str,
    ip: Option<&Spanned<Ipv4Addr>>,
    d: &mut Diagnostics,
) -> Option<BootNic> {
    let loc = r.loc().clone();
    let f = |k: &str| format!("{path}.{k}");
    let mut macs = Vec::new();
    let mut prefix: Option<u8> = None;
    let mut gateway = None;
    let mut vip = None;
    let mut extras = Vec::new();
    if let Some(list) = r.get("networkInterfaces") {
        let Value::Seq(items) = &list.value else {
            d.error(&list.loc, f("networkInterfaces"), "expected a list");
            return None;
        };
        for (i, item) in items.iter().enumerate() {
            let ip_path = index(&f("networkInterfaces"), i);
            let Some(nic) = nic(item, &ip_path, d) else {
                continue;
            };
            let holds_ip = ip
                .as_ref()
                .is_some_and(|ip| nic.addresses.iter().any(|a| a.value.addr() == ip.value));
            let boots =
                holds_ip || (macs.is_empty() && nic.addresses.is_empty() && nic.mac.is_some());
            match (nic.mac, boots && macs.is_empty()) {
                (Some(m), true) => {
                    macs.push(m);
                    prefix = nic
                        .addresses
                        .iter()
                        .find(|a| ip.as_ref().is_some_and(|ip| a.value.addr() == ip.value))
                        .map(|a| a.value.prefix_len());
                    gateway = nic.gateway;
                    vip = nic.vip;
                }
                (Some(m), false) => extras.push(ExtraInterface {
                    mac: m,
                    addresses: nic.addresses,
                    mtu: nic.mtu,
                }),
                (None, _) => d.error_hint(
                    &item.loc,
                    ip_path,
                    "interface has no deviceSelector.hardwareAddr",
                    "talboot recognises nodes on the wire by MAC: add deviceSelector: {hardwareAddr: \"aa:bb:cc:dd:ee:ff\"}",
                ),
            }
        }
    }
    if macs.is_empty() {
        d.error_hint(
            &loc,
            path,
            "node has no boot NIC with a hardware address",
            "add networkInterfaces: [{deviceSelector: {hardwareAddr: \"aa:bb:cc:dd:ee:ff\"}, addresses: [IP/24]}]",
        );
    }
    Some(BootNic {
        macs,
        prefix,
        gateway,
        vip,
        extras,
    })
}

/// The node's address: `ipAddress` with the prefix length of the boot NIC's address that
/// holds it, /24 (with a warning) when none does.
fn address(
    ip: Option<&Spanned<Ipv4Addr>>,
    prefix: Option<u8>,
    path: &str,
    d: &mut Diagnostics,
) -> Option<Spanned<Ipv4Net>> {
    let f = |k: &str| format!("{path}.{k}");
    ip.map(|ip| {
        let p = prefix.unwrap_or_else(|| {
            d.warning(
                &ip.loc,
                f("ipAddress"),
                "no interface address gives this IP's prefix length; assuming /24",
                Some("list the address with its prefix under the boot NIC's addresses".into()),
            );
            24
        });
        Spanned::new(
            Ipv4Net::new(ip.value, p).expect("prefix <= 32"),
            ip.loc.clone(),
        )
    })
}

/// talhelper node fields talboot has no place for, named in a warning each.
fn ignored_fields(r: &mut MapReader<'_>, path: &str, d: &mut Diagnostics) {
    let f = |k: &str| format!("{path}.{k}");
    for k in ["kernelModules", "nameservers"] {
        if let Some(v) = r.get(k) {
            d.warning(
                &v.loc,
                f(k),
                format!("talhelper field `{k}` is not supported by talboot and is ignored"),
                Some("express it as a node patch".into()),
            );
        }
    }
}

pub(super) fn group_key_role(cp: bool) -> &'static str {
    if cp { "controlplane" } else { "worker" }
}

pub(super) fn tal_disk_selector(n: &Y, path: &str, d: &mut Diagnostics) -> Option<DiskSelector> {
    // talhelper's selector has two more fields than ours; warn about them and read the rest.
    let mut kept = n.clone();
    if let Value::Map(es) = &mut kept.value {
        es.retain(|(k, _)| {
            let drop = matches!(k.name.as_str(), "modalias" | "uuid");
            if drop {
                d.warning(
                    &k.loc,
                    join(path, &k.name),
                    format!(
                        "installDiskSelector field `{}` is not supported by talboot and is ignored",
                        k.name
                    ),
                    Some("select by model, serial, wwid or busPath instead".into()),
                );
            }
            !drop
        });
    }
    read::disk_selector(&kept, path, d)
}

/// talhelper taints are a map `key: value:Effect`.
pub(super) fn taint_map(n: &Y, path: &str, d: &mut Diagnostics) -> Vec<Taint> {
    let Value::Map(entries) = &n.value else {
        d.error(
            &n.loc,
            path,
            format!("expected a mapping of taints, found {}", n.kind()),
        );
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|(k, v)| {
            let p = join(path, &k.name);
            let val = read::string(v, &p, d)?;
            let text = if val.starts_with(':') || !val.contains(':') {
                format!(
                    "{}{}",
                    k.name,
                    if val.contains(':') {
                        val.clone()
                    } else {
                        format!(":{val}")
                    }
                )
            } else {
                format!("{}={val}", k.name)
            };
            match Taint::parse(&text) {
                Ok(t) => Some(t),
                Err(e) => {
                    d.error_hint(&v.loc, p, e.to_string(), "write key: value:NoSchedule");
                    None
                }
            }
        })
        .collect()
}
