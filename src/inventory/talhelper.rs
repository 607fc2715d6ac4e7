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
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::diag::{Diagnostics, Loc};
use super::model::*;
use super::parts::{
    DEFAULT_FACTORY_URL, DEFAULT_LEASE, DEFAULT_POD_SUBNET, DEFAULT_SERVICE_SUBNET, Env, Parts,
    count_items,
};
use super::read::{self, missing};
use super::schematic::Schematic;
use super::yaml::{MapReader, Node as Y, Value, index, join};

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

/// Values from `talenv.yaml` (plain `KEY: value` lines) next to the config; the process
/// environment wins, as with dotenv loading.
fn load_talenv(base: &Path, d: &mut Diagnostics) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for name in ["talenv.yaml", "talenv.yml"] {
        let path = base.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match super::yaml::parse_documents(&path, &text) {
            Ok(docs) => {
                for doc in docs {
                    if let Value::Map(entries) = &doc.value {
                        for (k, v) in entries {
                            if let Some(s) = v.scalar_text() {
                                out.insert(k.name.clone(), s);
                            }
                        }
                    } else if doc.value != Value::Null {
                        d.error(&doc.loc, "", "talenv file must be a mapping of NAME: value");
                    }
                }
            }
            Err(e) => d.error(
                &e.loc,
                "",
                format!("invalid YAML in talenv file: {}", e.message),
            ),
        }
        if text.contains("\nsops:") || text.starts_with("sops:") {
            d.warning(
                &Loc::file_only(&path),
                "",
                "this talenv file is SOPS-encrypted; talboot reads only plain talenv files",
                Some("export the variables in the environment instead".into()),
            );
        }
    }
    out
}

struct ChainEnv<'a> {
    first: &'a dyn Env,
    second: &'a BTreeMap<String, String>,
}

impl Env for ChainEnv<'_> {
    fn var(&self, name: &str) -> Option<String> {
        self.first
            .var(name)
            .or_else(|| self.second.get(name).cloned())
    }
}

/// Replace `${VAR}`, `${VAR:-default}`, `${VAR-default}` and `$VAR` in every string value; `$$`
/// is a literal `$`.
fn substitute(node: &mut Y, path: &str, env: &dyn Env, d: &mut Diagnostics) {
    match &mut node.value {
        Value::Str(s) if s.contains('$') => match expand(s, env) {
            Ok(v) => *s = v,
            Err(UnsetVariable(name)) => d.error_hint(
                &node.loc,
                path,
                format!("environment variable `{name}` is unset or empty"),
                format!("export {name}=..., or set it in talenv.yaml next to the config"),
            ),
        },
        Value::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                substitute(item, &index(path, i), env, d);
            }
        }
        Value::Map(entries) => {
            for (k, v) in entries.iter_mut() {
                let p = join(path, &k.name);
                substitute(v, &p, env, d);
            }
        }
        _ => {}
    }
}

/// A `${VAR}` whose variable is unset or empty (talhelper's rule: that is an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable `{0}` is unset or empty")]
pub(crate) struct UnsetVariable(pub String);

/// Expand one string; on failure names the variable that was unset or empty.
pub(crate) fn expand(s: &str, env: &dyn Env) -> Result<String, UnsetVariable> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('{') {
            let Some(end) = r.find('}') else {
                out.push('$');
                rest = after;
                continue;
            };
            let inner = &r[..end];
            let (name, default) = match inner.find([':', '-']) {
                Some(j) if inner[j..].starts_with(":-") => (&inner[..j], Some(&inner[j + 2..])),
                Some(j) if inner[j..].starts_with('-') => (&inner[..j], Some(&inner[j + 1..])),
                _ => (inner, None),
            };
            match (env.var(name).filter(|v| !v.is_empty()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(def)) => out.push_str(def),
                (None, None) => return Err(UnsetVariable(name.to_string())),
            }
            rest = &r[end + 1..];
        } else {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if len == 0 || after.as_bytes()[0].is_ascii_digit() {
                out.push('$');
                rest = after;
                continue;
            }
            let name = &after[..len];
            match env.var(name).filter(|v| !v.is_empty()) {
                Some(v) => out.push_str(&v),
                None => return Err(UnsetVariable(name.to_string())),
            }
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    Ok(out)
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

/// The cluster fields talhelper writes at the top level; the rest of [`Cluster`] comes from
/// the nodes ([`FromNodes`]).
struct ClusterTop {
    name: Option<Spanned<String>>,
    talos_version: Option<Spanned<Version>>,
    kubernetes_version: Option<Spanned<Version>>,
    endpoint: Option<Spanned<Endpoint>>,
    dns_domain: String,
    allow_scheduling_on_control_planes: bool,
    pod_subnets: Vec<Ipv4Net>,
    service_subnets: Vec<Ipv4Net>,
    patches: Vec<Patch>,
    external_cni: bool,
    factory_url: String,
}

/// What talhelper keeps per node that talboot keeps per cluster or network: the first VIP,
/// schematic and installer image found, and every node's gateway.
#[derive(Default)]
struct FromNodes {
    vip: Option<Spanned<Ipv4Addr>>,
    gateways: Vec<Spanned<Ipv4Addr>>,
    schematic: Option<String>,
    installer_image: Option<String>,
}

fn cluster(r: &mut MapReader<'_>, loc: &Loc, base: &Path, d: &mut Diagnostics) -> ClusterTop {
    let name = match r.get("clusterName") {
        Some(n) => read::hostname(n, "clusterName", d),
        None => {
            missing(d, loc, "", "clusterName", "e.g. clusterName: homelab");
            None
        }
    };
    let talos_version = match r.get("talosVersion") {
        Some(n) => read::version(n, "talosVersion", d),
        None => {
            missing(
                d,
                loc,
                "",
                "talosVersion",
                "talboot needs it to pick boot artifacts, e.g. talosVersion: v1.13.9",
            );
            None
        }
    };
    let kubernetes_version = match r.get("kubernetesVersion") {
        Some(n) => read::version(n, "kubernetesVersion", d),
        None => {
            missing(
                d,
                loc,
                "",
                "kubernetesVersion",
                "e.g. kubernetesVersion: v1.36.3",
            );
            None
        }
    };
    let endpoint = match r.get("endpoint") {
        Some(n) => read::parsed(
            n,
            "endpoint",
            d,
            "an https endpoint",
            "https://10.0.40.101:6443",
            Endpoint::parse,
        ),
        None => {
            missing(
                d,
                loc,
                "",
                "endpoint",
                "e.g. endpoint: https://10.0.40.101:6443",
            );
            None
        }
    };
    let dns_domain = r
        .get("domain")
        .and_then(|n| read::string(n, "domain", d))
        .unwrap_or_else(|| "cluster.local".into());
    let allow_scheduling_on_control_planes =
        ["allowSchedulingOnControlPlanes", "allowSchedulingOnMasters"]
            .iter()
            .filter_map(|k| r.get(k).and_then(|n| read::boolean(n, k, d)))
            .any(|b| b);
    let pod_subnets = subnets(r, "clusterPodNets", DEFAULT_POD_SUBNET, d);
    let service_subnets = subnets(r, "clusterSvcNets", DEFAULT_SERVICE_SUBNET, d);
    let patches = r
        .get("patches")
        .map(|n| read::patches(n, "patches", base, d))
        .unwrap_or_default();
    let external_cni = r.get("cniConfig").is_some_and(|n| cni(n, d));
    let factory_url = r
        .get("imageFactory")
        .map(|n| image_factory(n, d))
        .unwrap_or_else(|| DEFAULT_FACTORY_URL.to_string());
    ClusterTop {
        name,
        talos_version,
        kubernetes_version,
        endpoint,
        dns_domain,
        allow_scheduling_on_control_planes,
        pod_subnets,
        service_subnets,
        patches,
        external_cni,
        factory_url,
    }
}

impl ClusterTop {
    /// The cluster section, once the nodes have been read; `None` when a required top-level
    /// field was missing or wrong (already reported).
    fn assemble(self, found: FromNodes, base: &Path) -> Option<Cluster> {
        Some(Cluster {
            name: self.name?,
            talos_version: self.talos_version?,
            kubernetes_version: self.kubernetes_version?,
            endpoint: self.endpoint?,
            vip: found.vip,
            pod_subnets: self.pod_subnets,
            service_subnets: self.service_subnets,
            dns_domain: self.dns_domain,
            allow_scheduling_on_control_planes: self.allow_scheduling_on_control_planes,
            secrets: Secrets {
                file: secrets_file(base),
                age_recipients: Vec::new(),
            },
            patches: self.patches,
            installer: Installer {
                schematic: found.schematic,
                image: found.installer_image,
                factory_url: self.factory_url,
            },
            external_cni: self.external_cni,
        })
    }
}

/// The secrets file next to the config.
fn secrets_file(base: &Path) -> PathBuf {
    [
        // talhelper's search order; its loop keeps the last file that exists.
        "talsecret.yaml",
        "talsecret.sops.yaml",
        "talsecret.yml",
        "talsecret.sops.yml",
    ]
    .iter()
    .map(|f| base.join(f))
    .rfind(|p| p.exists())
    .unwrap_or_else(|| base.join("talsecret.sops.yaml"))
}

/// `clusterPodNets` / `clusterSvcNets`, or Talos's default.
fn subnets(r: &mut MapReader<'_>, key: &str, default: &str, d: &mut Diagnostics) -> Vec<Ipv4Net> {
    match r.get(key) {
        Some(n) => read::list(n, key, d, true, |n, p, d| {
            read::ipv4_subnet(n, p, d).map(|s| s.value)
        }),
        None => vec![default.parse().expect("default subnet")],
    }
}

/// Whether `cniConfig` says `name: none` (an external CNI); everything else in it is named in a
/// warning.
fn cni(cni: &Y, d: &mut Diagnostics) -> bool {
    let mut external_cni = false;
    if let Value::Map(entries) = &cni.value {
        for (k, v) in entries {
            let is_none = k.name == "name" && v.scalar_text().as_deref() == Some("none");
            external_cni |= is_none;
            if !is_none {
                d.warning(
                    &k.loc,
                    join("cniConfig", &k.name),
                    "only `cniConfig: {name: none}` carries over; talboot installs the CNI as an add-on",
                    Some("configure Cilium under addons in a talboot.yaml, or use a patch".into()),
                );
            }
        }
    }
    external_cni
}

/// The `controlPlane:` and `worker:` group settings, as the two roles.
fn roles(r: &mut MapReader<'_>, base: &Path, d: &mut Diagnostics) -> Vec<RoleDef> {
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
fn nodes(
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

/// The groups' schematic and installer image, where no node gave one.
fn group_images(groups: &BTreeMap<&str, &Y>, found: &mut FromNodes, d: &mut Diagnostics) {
    for g in groups.values() {
        if let Some((s, img)) = group_image(g, d) {
            if let Some(s) = s {
                found.schematic.get_or_insert(s);
            }
            if let Some(img) = img {
                found.installer_image.get_or_insert(img);
            }
        }
    }
}

/// The provisioning network, derived from the boot NICs' addresses (talhelper has none): the
/// first subnet served directly, the others as relays. `None` when no node was read.
fn network(
    nodes: &[Node],
    gateways: &[Spanned<Ipv4Addr>],
    loc: &Loc,
    d: &mut Diagnostics,
) -> Option<Network> {
    let mut subnets: Vec<Ipv4Net> = nodes.iter().map(|n| n.address.value.trunc()).collect();
    subnets.sort();
    subnets.dedup();
    let first = subnets.first()?;
    let gateway = gateways.iter().find(|g| first.contains(&g.value)).cloned();
    d.warning(
        loc,
        "",
        format!(
            "talhelper files do not describe the provisioning network; talboot derived subnet {first}{} from the nodes (authoritative DHCP, no pool, push delivery)",
            gateway.as_ref().map(|g| format!(", gateway {}", g.value)).unwrap_or_default()
        ),
        Some("run `talboot serve --interface IFACE`, or move to a talboot.yaml to set the network and boot sections".into()),
    );
    let relays = subnets[1..]
        .iter()
        .map(|s| RelaySubnet {
            subnet: Spanned::new(*s, loc.clone()),
            gateway: gateways.iter().find(|g| s.contains(&g.value)).cloned(),
            pool: None,
            dns: Vec::new(),
        })
        .collect();
    Some(Network {
        interfaces: Vec::new(),
        mode: NetworkMode::Authoritative,
        subnet: Spanned::new(*first, loc.clone()),
        gateway,
        dns: Vec::new(),
        ntp: Vec::new(),
        domain: None,
        pool: None,
        lease_time: DEFAULT_LEASE,
        advertise: None,
        relays,
    })
}

fn image_factory(n: &Y, d: &mut Diagnostics) -> String {
    let Some(mut r) = MapReader::new(n, "imageFactory", d) else {
        return DEFAULT_FACTORY_URL.into();
    };
    let registry = r
        .get("registryURL")
        .and_then(|n| read::string(n, "imageFactory.registryURL", d));
    let protocol = r
        .get("protocol")
        .and_then(|n| read::string(n, "imageFactory.protocol", d));
    unsupported(d, &r, n, &["registryURL", "protocol"]);
    match registry {
        Some(reg) => format!(
            "{}://{}",
            protocol.as_deref().unwrap_or("https"),
            reg.trim_end_matches('/')
        ),
        None => DEFAULT_FACTORY_URL.into(),
    }
}

/// talhelper taints are a map `key: value:Effect`.
fn taint_map(n: &Y, path: &str, d: &mut Diagnostics) -> Vec<Taint> {
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

struct TalNode {
    node: Node,
    vip: Option<Spanned<Ipv4Addr>>,
    gateway: Option<Spanned<Ipv4Addr>>,
    schematic: Option<String>,
    image: Option<String>,
}

fn node(
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
    let ip = match r.get("ipAddress") {
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
    };
    let cp = r
        .get("controlPlane")
        .and_then(|v| read::boolean(v, &f("controlPlane"), d))
        .unwrap_or(false);
    let group_key = if cp { "controlPlane" } else { "worker" };
    let group = groups.get(group_key).copied();

    // Install disk: the node's own, else the group's.
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
    let install = match (disk, selector) {
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
    };

    // NICs: the interface whose addresses hold ipAddress (or the first with a MAC) boots.
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
    let address = ip.as_ref().map(|ip| {
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
    });

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

fn group_key_role(cp: bool) -> &'static str {
    if cp { "controlplane" } else { "worker" }
}

fn group_image(g: &Y, d: &mut Diagnostics) -> Option<(Option<String>, Option<String>)> {
    let mut r = MapReader::new(g, "group", &mut Diagnostics::new())?;
    Some(image_fields(&mut r, "group", d))
}

/// `schematic` (a body, hashed to its ID) and `talosImageURL` (an installer repository, whose
/// last path element is the schematic ID when it points at the Image Factory).
fn image_fields(
    r: &mut MapReader<'_>,
    path: &str,
    d: &mut Diagnostics,
) -> (Option<String>, Option<String>) {
    let mut schematic = None;
    let mut image = None;
    if let Some(s) = r.get("schematic") {
        schematic = schematic_body(s, &join(path, "schematic"), d).map(|s| s.id());
    }
    if let Some(u) = r.get("talosImageURL")
        && let Some(url) = read::string(u, &join(path, "talosImageURL"), d)
    {
        let last = url.rsplit('/').next().unwrap_or("");
        if last.len() == 64 && last.bytes().all(|b| b.is_ascii_hexdigit()) {
            schematic.get_or_insert(last.to_ascii_lowercase());
        } else {
            image = Some(url);
        }
    }
    (schematic, image)
}

fn schematic_body(n: &Y, path: &str, d: &mut Diagnostics) -> Option<Schematic> {
    let mut r = MapReader::new(n, path, d)?;
    let mut s = Schematic::default();
    if let Some(c) = r.get("customization") {
        let cp = join(path, "customization");
        let mut c = MapReader::new(c, &cp, d)?;
        if let Some(a) = c.get("extraKernelArgs") {
            s.extra_kernel_args =
                read::list(a, &join(&cp, "extraKernelArgs"), d, false, read::string);
        }
        if let Some(se) = c.get("systemExtensions") {
            let sp = join(&cp, "systemExtensions");
            if let Some(mut se) = MapReader::new(se, &sp, d) {
                if let Some(o) = se.get("officialExtensions") {
                    s.official_extensions =
                        read::list(o, &join(&sp, "officialExtensions"), d, false, read::string);
                }
                se.finish(&["officialExtensions"], d);
            }
        }
        if let Some(sb) = c.get("secureboot") {
            let sp = join(&cp, "secureboot");
            if let Some(mut sb) = MapReader::new(sb, &sp, d) {
                s.include_well_known_certificates = sb
                    .get("includeWellKnownCertificates")
                    .and_then(|b| read::boolean(b, &join(&sp, "includeWellKnownCertificates"), d))
                    .unwrap_or(false);
                sb.finish(&["includeWellKnownCertificates"], d);
            }
        }
        if let Some(m) = c.get("meta") {
            s.meta = read::list(m, &join(&cp, "meta"), d, false, |n, p, d| {
                let mut r = MapReader::new(n, p, d)?;
                let key = r.get("key").and_then(|k| {
                    read::parsed(k, &join(p, "key"), d, "a META key (0-255)", "10", |s| {
                        s.parse::<u8>()
                    })
                    .map(|s| s.value)
                });
                let value = r
                    .get("value")
                    .and_then(|v| read::string(v, &join(p, "value"), d));
                r.finish(&["key", "value"], d);
                Some((key?, value?))
            });
        }
        c.finish(
            &["extraKernelArgs", "systemExtensions", "secureboot", "meta"],
            d,
        );
    }
    if let Some(o) = r.get("overlay") {
        let op = join(path, "overlay");
        if let Some(mut o) = MapReader::new(o, &op, d) {
            let image = o
                .get("image")
                .and_then(|v| read::string(v, &join(&op, "image"), d));
            let name = o
                .get("name")
                .and_then(|v| read::string(v, &join(&op, "name"), d));
            if o.has("options") {
                d.warning(
                    o.loc(),
                    join(&op, "options"),
                    "overlay options are not supported; the schematic ID would differ",
                    Some(
                        "set talosImageURL to the factory installer URL with the ID instead".into(),
                    ),
                );
                o.get("options");
            }
            o.finish(&["image", "name", "options"], d);
            if let (Some(i), Some(n)) = (image, name) {
                s.overlay = Some((i, n));
            }
        }
    }
    r.finish(&["customization", "overlay"], d);
    Some(s)
}

struct Nic {
    mac: Option<Spanned<Mac>>,
    addresses: Vec<Spanned<Ipv4Net>>,
    gateway: Option<Spanned<Ipv4Addr>>,
    vip: Option<Spanned<Ipv4Addr>>,
    mtu: Option<u32>,
}

fn nic(n: &Y, path: &str, d: &mut Diagnostics) -> Option<Nic> {
    let mut r = MapReader::new(n, path, d)?;
    let mut out = Nic {
        mac: None,
        addresses: Vec::new(),
        gateway: None,
        vip: None,
        mtu: None,
    };
    if let Some(sel) = r.get("deviceSelector") {
        let sp = join(path, "deviceSelector");
        if let Some(mut s) = MapReader::new(sel, &sp, d) {
            out.mac = s
                .get("hardwareAddr")
                .and_then(|m| read::mac(m, &join(&sp, "hardwareAddr"), d));
            if let Value::Map(es) = &sel.value {
                for (k, _) in es {
                    if k.name != "hardwareAddr" {
                        d.warning(&k.loc, join(&sp, &k.name), format!("deviceSelector field `{}` is ignored; talboot selects NICs by hardwareAddr", k.name), None);
                        s.get(&k.name);
                    }
                }
            }
        }
    }
    if let Some(a) = r.get("addresses") {
        out.addresses = read::list(a, &join(path, "addresses"), d, true, read::ipv4_net);
    }
    if let Some(routes) = r.get("routes")
        && let Value::Seq(items) = &routes.value
    {
        for (i, route) in items.iter().enumerate() {
            let rp = index(&join(path, "routes"), i);
            let Some(mut rr) = MapReader::new(route, &rp, d) else {
                continue;
            };
            let net = rr.get("network").and_then(|v| v.scalar_text());
            let gw = rr
                .get("gateway")
                .and_then(|v| read::ipv4(v, &join(&rp, "gateway"), d));
            if matches!(net.as_deref(), Some("0.0.0.0/0") | None) {
                out.gateway = out.gateway.or(gw);
            } else {
                d.warning(
                    &route.loc,
                    rp.clone(),
                    "only default routes carry over; other routes are ignored",
                    Some("add them with a node patch".into()),
                );
            }
            rr.get("metric");
            rr.finish(&["network", "gateway", "metric"], d);
        }
    }
    if let Some(v) = r.get("vip") {
        let vp = join(path, "vip");
        if let Some(mut vr) = MapReader::new(v, &vp, d) {
            out.vip = vr
                .get("ip")
                .and_then(|ip| read::ipv4(ip, &join(&vp, "ip"), d));
            vr.finish(&["ip"], d);
        }
    }
    if let Some(m) = r.get("mtu") {
        out.mtu = read::parsed(m, &join(path, "mtu"), d, "an MTU", "1500", |s| {
            s.parse::<u32>()
        })
        .map(|s| s.value);
    }
    // The NIC name and DHCP switch are superseded by talboot's static boot-NIC config.
    r.get("interface");
    r.get("dhcp");
    if let Value::Map(es) = &n.value {
        for (k, _) in es {
            if ![
                "deviceSelector",
                "addresses",
                "routes",
                "vip",
                "mtu",
                "interface",
                "dhcp",
            ]
            .contains(&k.name.as_str())
            {
                d.warning(
                    &k.loc,
                    join(path, &k.name),
                    format!(
                        "talhelper field `{}` is not supported by talboot and is ignored",
                        k.name
                    ),
                    Some("express it as a node patch".into()),
                );
                r.get(&k.name);
            }
        }
    }
    Some(out)
}

fn tal_disk_selector(n: &Y, path: &str, d: &mut Diagnostics) -> Option<DiskSelector> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expand_forms() {
        let e = env(&[("A", "1"), ("EMPTY", "")]);
        assert_eq!(expand("x${A}y", &e).unwrap(), "x1y");
        assert_eq!(expand("$A-$A", &e).unwrap(), "1-1");
        assert_eq!(expand("${B:-def}", &e).unwrap(), "def");
        assert_eq!(expand("${B-def}", &e).unwrap(), "def");
        assert_eq!(expand("$$A", &e).unwrap(), "$A");
        assert_eq!(expand("${B}", &e).unwrap_err(), UnsetVariable("B".into()));
        assert_eq!(
            expand("${EMPTY}", &e).unwrap_err(),
            UnsetVariable("EMPTY".into())
        );
        assert_eq!(expand("cost: 5$", &e).unwrap(), "cost: 5$");
    }
}
