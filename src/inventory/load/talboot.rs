//! The `talboot.yaml` reader: the top-level sections in the order they are read, the `boot`
//! section and the `roles` mapping. Each larger section has its own module.

use std::path::Path;

use crate::inventory::diag::Diagnostics;
use crate::inventory::model::*;
use crate::inventory::parts::{Parts, count_items};
use crate::inventory::read::{self, missing};
use crate::inventory::yaml::{MapReader, Node as Y, Value};

mod addons;
mod cluster;
mod network;
mod node;
mod storage;

use self::{addons::addons, cluster::cluster, network::network, node::node};

const TOP: &[&str] = &["cluster", "network", "boot", "roles", "nodes", "addons"];

/// Read a `talboot.yaml` document into [`Parts`], section by section.
pub(super) fn read(root: &Y, base: &Path, d: &mut Diagnostics) -> Parts {
    let mut parts = Parts {
        format: Some(SourceFormat::Talboot),
        ..Parts::default()
    };
    let Some(mut r) = MapReader::new(root, "", d) else {
        return parts;
    };
    match r.get("cluster") {
        Some(n) => parts.cluster = cluster(n, base, d),
        None => missing(
            d,
            r.loc(),
            "",
            "cluster",
            "every inventory needs a cluster section",
        ),
    }
    match r.get("network") {
        Some(n) => parts.network = network(n, d),
        None => missing(
            d,
            r.loc(),
            "",
            "network",
            "describe the provisioning network",
        ),
    }
    parts.boot = match r.get("boot") {
        Some(n) => boot(n, d),
        None => Some(Boot::default()),
    };
    if let Some(n) = r.get("roles") {
        let blocks = (
            &mut parts.role_power,
            &mut parts.role_volumes,
            &mut parts.role_secure_boot,
        );
        parts.roles = roles(n, base, blocks, d);
    }
    match r.get("nodes") {
        Some(n) => {
            parts.nodes_loc = Some(n.loc.clone());
            parts.nodes_written = count_items(n);
            let mut refs = Vec::new();
            let mut power = std::collections::BTreeMap::new();
            parts.nodes = read::list(n, "nodes", d, false, |n, p, d| {
                node(n, p, base, &mut refs, &mut power, d)
            });
            parts.node_power = power;
            parts.role_refs = refs;
        }
        None => missing(
            d,
            r.loc(),
            "",
            "nodes",
            "list at least one control-plane node",
        ),
    }
    if let Some(n) = r.get("addons") {
        parts.addons = addons(n, base, d);
    }
    r.finish(TOP, d);
    parts
}

impl Default for Boot {
    fn default() -> Self {
        Self {
            delivery: Delivery::Push,
            unknown_machines: UnknownPolicy::Ignore,
            default_arch: Arch::Amd64,
            kernel_args: Vec::new(),
            local_boot: LocalBoot::Exit,
            http_boot: HttpBoot::Ipxe,
        }
    }
}

fn boot(node: &Y, d: &mut Diagnostics) -> Option<Boot> {
    let mut r = MapReader::new(node, "boot", d)?;
    let defaults = Boot::default();
    let delivery = match r.get("delivery") {
        Some(n) => read::word(n, "boot.delivery", d, Delivery::WORDS, Delivery::parse),
        None => Some(defaults.delivery),
    };
    let unknown = match r.get("unknownMachines") {
        Some(n) => read::word(
            n,
            "boot.unknownMachines",
            d,
            UnknownPolicy::WORDS,
            UnknownPolicy::parse,
        ),
        None => Some(defaults.unknown_machines),
    };
    let arch = match r.get("defaultArch") {
        Some(n) => read::word(n, "boot.defaultArch", d, Arch::WORDS, Arch::parse),
        None => Some(defaults.default_arch),
    };
    let kernel_args = r
        .get("kernelArgs")
        .map(|n| read::kernel_args(n, "boot.kernelArgs", d))
        .unwrap_or_default();
    let local_boot = match r.get("localBoot") {
        Some(n) => read::word(n, "boot.localBoot", d, LocalBoot::WORDS, LocalBoot::parse),
        None => Some(defaults.local_boot),
    };
    let http_boot = match r.get("httpBoot") {
        Some(n) => read::word(n, "boot.httpBoot", d, HttpBoot::WORDS, HttpBoot::parse),
        None => Some(defaults.http_boot),
    };
    r.finish(
        &[
            "delivery",
            "unknownMachines",
            "defaultArch",
            "kernelArgs",
            "localBoot",
            "httpBoot",
        ],
        d,
    );
    Some(Boot {
        delivery: delivery?,
        unknown_machines: unknown?,
        default_arch: arch?,
        kernel_args,
        local_boot: local_boot?,
        http_boot: http_boot?,
    })
}

/// The keys a role may have.
const ROLE_KEYS: &[&str] = &[
    "type",
    "extends",
    "patches",
    "labels",
    "taints",
    "power",
    "systemVolumes",
    "secureBoot",
];

/// Per-role maps of what [`crate::inventory::load`] folds onto the role's nodes later.
type RoleBlocks<'a> = (
    &'a mut std::collections::BTreeMap<String, crate::inventory::power::PowerBlock>,
    &'a mut std::collections::BTreeMap<String, Vec<crate::inventory::SystemVolume>>,
    &'a mut std::collections::BTreeMap<String, Spanned<bool>>,
);

/// A role's `power`, `systemVolumes` and `secureBoot`, kept by role name because they are resolved onto
/// nodes only once roles and nodes are all read.
fn role_blocks(
    r: &mut MapReader<'_>,
    path: &str,
    role: &str,
    (power, volumes, secure_boot): RoleBlocks<'_>,
    d: &mut Diagnostics,
) {
    if let Some(n) = r.get("secureBoot")
        && let Some(b) = read::boolean(n, &format!("{path}.secureBoot"), d)
    {
        secure_boot.insert(role.to_owned(), Spanned::new(b, n.loc.clone()));
    }
    if let Some(b) = r
        .get("power")
        .and_then(|n| crate::inventory::power::PowerBlock::read(n, &format!("{path}.power"), d))
    {
        power.insert(role.to_owned(), b);
    }
    if let Some(n) = r.get("systemVolumes") {
        let v = storage::system_volumes(n, &format!("{path}.systemVolumes"), d);
        volumes.insert(role.to_owned(), v);
    }
}

fn roles(node: &Y, base: &Path, blocks: RoleBlocks<'_>, d: &mut Diagnostics) -> Vec<RoleDef> {
    let Value::Map(entries) = &node.value else {
        d.error_hint(
            &node.loc,
            "roles",
            format!(
                "expected a mapping of role name to role, found {}",
                node.kind()
            ),
            "e.g. roles: {storage: {extends: worker}}",
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, body) in entries {
        let path = format!("roles.{}", key.name);
        if !is_dns_label(&key.name) {
            d.error_hint(
                &key.loc,
                &path,
                format!("`{}` is not a valid role name", key.name),
                "role names are lowercase letters, digits and hyphens",
            );
            continue;
        }
        let Some(mut r) = MapReader::new(body, &path, d) else {
            continue;
        };
        let machine_type = r.get("type").and_then(|n| {
            read::word(
                n,
                &format!("{path}.type"),
                d,
                MachineType::WORDS,
                MachineType::parse,
            )
        });
        let extends = r.get("extends").and_then(|n| {
            read::string(n, &format!("{path}.extends"), d).map(|s| Spanned::new(s, n.loc.clone()))
        });
        let patches = r
            .get("patches")
            .map(|n| read::patches(n, &format!("{path}.patches"), base, d))
            .unwrap_or_default();
        let labels = r
            .get("labels")
            .map(|n| read::labels(n, &format!("{path}.labels"), d))
            .unwrap_or_default();
        let taints = r
            .get("taints")
            .map(|n| read::taints(n, &format!("{path}.taints"), d))
            .unwrap_or_default();
        let (power, volumes, secure_boot) = (&mut *blocks.0, &mut *blocks.1, &mut *blocks.2);
        role_blocks(&mut r, &path, &key.name, (power, volumes, secure_boot), d);
        r.finish(ROLE_KEYS, d);
        out.push(RoleDef {
            name: Spanned::new(key.name.clone(), key.loc.clone()),
            machine_type,
            extends,
            patches,
            labels,
            taints,
        });
    }
    out
}
