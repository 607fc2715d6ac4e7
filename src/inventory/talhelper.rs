//! Reading a talhelper `talconfig.yaml` into talboot's inventory.
//!
//! Operators who already keep a talhelper file should not have to rewrite it. The mapping:
//! `clusterName`, versions, `endpoint`, `domain`, pod/service nets and `patches` become the
//! cluster section; each node's `networkInterfaces[].deviceSelector.hardwareAddr` gives its MACs
//! (the interface carrying `ipAddress` is the boot NIC), `controlPlane` picks the role, and
//! `installDisk`/`installDiskSelector`, `nodeLabels`, `nodeTaints`, `patches` and `schematic`
//! carry over. `controlPlane:`/`worker:` group settings become the two roles. talhelper has no
//! notion of the provisioning network, so talboot derives it from the nodes' addresses and
//! routes and says so in a warning.
//!
//! `${VAR}` substitution happens on string values after parsing (so comments never need their
//! variables), with talhelper's rule that an unset or empty variable is an error.
//! Every talhelper field talboot does not carry over is named in a warning: nothing is dropped
//! silently.

use std::collections::BTreeMap;
use std::path::Path;

use super::diag::Diagnostics;
use super::model::*;
use super::parts::{Env, Parts};
use super::yaml::{MapReader, Node as Y, Value, join};

mod cluster;
mod env;
mod images;
mod nic;
mod nodes;

use self::cluster::{cluster, network};
use self::env::{ChainEnv, load_talenv, substitute};
use self::images::group_images;
use self::nodes::{nodes, roles};

/// Read a talhelper document.
pub fn read(root: &Y, base: &Path, env: &dyn Env, d: &mut Diagnostics) -> Parts {
    let env_file = load_talenv(base, d);
    let chained = ChainEnv {
        first: env,
        second: &env_file,
    };
    let mut root = root.clone();
    substitute(&mut root, "", &chained, d);
    translate(&root, base, d)
}

/// Top-level talhelper fields that carry over.
const TOP_SUPPORTED: &[&str] = &[
    "clusterName",
    "talosVersion",
    "kubernetesVersion",
    "endpoint",
    "domain",
    "allowSchedulingOnMasters",
    "allowSchedulingOnControlPlanes",
    "clusterPodNets",
    "clusterSvcNets",
    "patches",
    "cniConfig",
    "imageFactory",
    "controlPlane",
    "worker",
    "nodes",
];

/// Per-node (and group) fields that carry over.
const NODE_SUPPORTED: &[&str] = &[
    "hostname",
    "ipAddress",
    "controlPlane",
    "installDisk",
    "installDiskSelector",
    "networkInterfaces",
    "nodeLabels",
    "nodeTaints",
    "patches",
    "schematic",
    "talosImageURL",
    "kernelModules",
    "nameservers",
];

fn unsupported(d: &mut Diagnostics, r: &MapReader<'_>, node: &Y, supported: &[&str]) {
    if let Value::Map(entries) = &node.value {
        for (k, _) in entries {
            if !supported.contains(&k.name.as_str()) {
                d.warning(
                    &k.loc,
                    join(&r.path, &k.name),
                    format!(
                        "talhelper field `{}` is not supported by talboot and is ignored",
                        k.name
                    ),
                    Some("express it as a patch if the machine config needs it".into()),
                );
            }
        }
    }
}

/// Translate a (substituted) talhelper document section by section, in the order `load` reads
/// a talboot file: the cluster's own fields, the group settings as roles, the nodes, then what
/// the nodes imply (the provisioning network, the cluster's VIP and installer).
fn translate(root: &Y, base: &Path, d: &mut Diagnostics) -> Parts {
    let mut parts = Parts {
        format: Some(SourceFormat::Talhelper),
        ..Parts::default()
    };
    let Some(mut r) = MapReader::new(root, "", d) else {
        return parts;
    };
    unsupported(d, &r, root, TOP_SUPPORTED);
    let loc = r.loc().clone();
    let top = cluster(&mut r, &loc, base, d);
    parts.roles = roles(&mut r, base, d);
    let groups: BTreeMap<&str, &Y> = ["controlPlane", "worker"]
        .iter()
        .filter_map(|k| r.get(k).map(|n| (*k, n)))
        .collect();
    let mut found = nodes(&mut r, &loc, base, &groups, &mut parts, d);
    group_images(&groups, &mut found, d);
    parts.network = network(&parts.nodes, &found.gateways, &loc, d);
    parts.boot = Some(Boot::default());
    parts.cluster = top.assemble(found, base);
    parts
}
