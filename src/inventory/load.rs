//! Loading an inventory file: format detection, the `talboot.yaml` reader, and the final
//! assembly that runs validation and resolves roles.
//!
//! Decoding never stops at the first problem. Each section is read into typed values; a field
//! that cannot be read is reported and left out, and cross-field validation then runs on what
//! could be read, so one run of `talboot check` shows every problem in the file.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::diag::{Diagnostics, Loc};
use super::model::*;
use super::parts::{
    DEFAULT_FACTORY_URL, DEFAULT_LEASE, DEFAULT_POD_SUBNET, DEFAULT_SERVICE_SUBNET, Env, Parts,
    ProcessEnv, count_items,
};
use super::read::{self, missing};
use super::validate;
use super::yaml::{self, MapReader, Node as Y, Value, index};

/// Why an inventory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read at all.
    #[error("cannot read inventory {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file was read but is invalid; every problem found is listed.
    #[error("{} has {} error(s)", path.display(), diagnostics.error_count())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// All errors and warnings.
        diagnostics: Diagnostics,
    },
}

/// A successfully loaded inventory and the warnings found on the way.
#[derive(Debug)]
pub struct Loaded {
    /// The validated inventory.
    pub inventory: Inventory,
    /// Warnings (never errors).
    pub warnings: Diagnostics,
}

/// Load and validate the inventory at `path`, detecting talboot or talhelper format, with
/// `${VAR}` values in talhelper files taken from the process environment.
pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    load_with_env(path, &ProcessEnv)
}

/// [`load`] with an explicit environment.
pub fn load_with_env(path: &Path, env: &dyn Env) -> Result<Loaded, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |diagnostics| LoadError::Invalid {
        path: path.to_path_buf(),
        diagnostics,
    };
    let mut d = Diagnostics::new();
    let docs = match yaml::parse_documents(path, &text) {
        Ok(docs) => docs,
        Err(e) => {
            d.error(&e.loc, "", format!("invalid YAML: {}", e.message));
            return Err(invalid(d));
        }
    };
    let root = match docs.as_slice() {
        [root] => root,
        [] => {
            d.error_hint(
                &Loc::file_only(path),
                "",
                "the file is empty",
                "see docs/inventory.md for a complete example",
            );
            return Err(invalid(d));
        }
        [_, second, ..] => {
            d.error(
                &second.loc,
                "",
                "an inventory is one YAML document; remove the extra `---` documents",
            );
            return Err(invalid(d));
        }
    };
    let base = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let parts = if is_talhelper(root) {
        super::talhelper::read(root, &base, env, &mut d)
    } else {
        read_talboot(root, &base, &mut d)
    };
    let inventory = assemble(path, &base, parts, &mut d);
    match inventory {
        Some(inventory) if !d.has_errors() => Ok(Loaded {
            inventory,
            warnings: d,
        }),
        _ => Err(invalid(d)),
    }
}

/// A talhelper file has `clusterName` at the top; ours has `cluster`.
fn is_talhelper(root: &Y) -> bool {
    match &root.value {
        Value::Map(entries) => {
            entries.iter().any(|(k, _)| k.name == "clusterName")
                && !entries.iter().any(|(k, _)| k.name == "cluster")
        }
        _ => false,
    }
}

fn assemble(path: &Path, base: &Path, mut parts: Parts, d: &mut Diagnostics) -> Option<Inventory> {
    let roles = validate::resolve_roles(&parts.roles, d);
    validate::check(&parts, &roles, d);
    super::power::resolve(
        &mut parts.nodes,
        &parts.node_power,
        &parts.role_power,
        &roles,
        base,
        d,
    );
    Some(Inventory {
        path: path.to_path_buf(),
        format: parts.format.unwrap_or(SourceFormat::Talboot),
        cluster: parts.cluster?,
        network: parts.network?,
        boot: parts.boot?,
        roles,
        nodes: parts.nodes,
        addons: parts.addons,
    })
}

const TOP: &[&str] = &["cluster", "network", "boot", "roles", "nodes", "addons"];

fn read_talboot(root: &Y, base: &Path, d: &mut Diagnostics) -> Parts {
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
        parts.roles = roles(n, base, &mut parts.role_power, d);
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
        }
    }
}

const CLUSTER: &[&str] = &[
    "name",
    "talosVersion",
    "kubernetesVersion",
    "endpoint",
    "vip",
    "podSubnets",
    "serviceSubnets",
    "dnsDomain",
    "allowSchedulingOnControlPlanes",
    "secrets",
    "patches",
    "installer",
];

fn cluster(node: &Y, base: &Path, d: &mut Diagnostics) -> Option<Cluster> {
    let mut r = MapReader::new(node, "cluster", d)?;
    let p = |k: &str| format!("cluster.{k}");
    let loc = r.loc().clone();
    let name = match r.get("name") {
        Some(n) => read::hostname(n, &p("name"), d),
        None => {
            missing(d, &loc, "cluster", "name", "e.g. name: homelab");
            None
        }
    };
    let talos_version = match r.get("talosVersion") {
        Some(n) => read::version(n, &p("talosVersion"), d),
        None => {
            missing(
                d,
                &loc,
                "cluster",
                "talosVersion",
                "e.g. talosVersion: v1.13.9",
            );
            None
        }
    };
    let kubernetes_version = match r.get("kubernetesVersion") {
        Some(n) => read::version(n, &p("kubernetesVersion"), d),
        None => {
            missing(
                d,
                &loc,
                "cluster",
                "kubernetesVersion",
                "e.g. kubernetesVersion: 1.36.3",
            );
            None
        }
    };
    let endpoint = match r.get("endpoint") {
        Some(n) => read::parsed(
            n,
            &p("endpoint"),
            d,
            "an https endpoint",
            "https://10.0.40.101:6443",
            Endpoint::parse,
        ),
        None => {
            missing(
                d,
                &loc,
                "cluster",
                "endpoint",
                "e.g. endpoint: https://10.0.40.101:6443",
            );
            None
        }
    };
    let vip = r.get("vip").and_then(|n| read::ipv4(n, &p("vip"), d));
    let subnets =
        |r: &mut MapReader<'_>, key: &str, default: &str, d: &mut Diagnostics| match r.get(key) {
            Some(n) => read::list(n, &p(key), d, true, |n, p, d| {
                read::ipv4_subnet(n, p, d).map(|s| s.value)
            }),
            None => vec![default.parse().expect("default subnet parses")],
        };
    let pod_subnets = subnets(&mut r, "podSubnets", DEFAULT_POD_SUBNET, d);
    let service_subnets = subnets(&mut r, "serviceSubnets", DEFAULT_SERVICE_SUBNET, d);
    let dns_domain = match r.get("dnsDomain") {
        Some(n) => read::parsed(
            n,
            &p("dnsDomain"),
            d,
            "a DNS domain",
            "cluster.local",
            |s| {
                if is_dns_name(s) {
                    Ok(s.to_string())
                } else {
                    Err("not a DNS name")
                }
            },
        )
        .map(|s| s.value),
        None => Some("cluster.local".into()),
    };
    let allow_sched = r
        .get("allowSchedulingOnControlPlanes")
        .map(|n| read::boolean(n, &p("allowSchedulingOnControlPlanes"), d).unwrap_or(false))
        .unwrap_or(false);
    let secrets = match r.get("secrets") {
        Some(n) => secrets(n, base, d),
        None => Some(Secrets {
            file: base.join("secrets.age"),
            age_recipients: Vec::new(),
        }),
    };
    let patches = r
        .get("patches")
        .map(|n| read::patches(n, &p("patches"), base, d))
        .unwrap_or_default();
    let installer = match r.get("installer") {
        Some(n) => installer(n, d),
        None => Some(Installer {
            schematic: None,
            image: None,
            factory_url: DEFAULT_FACTORY_URL.into(),
        }),
    };
    r.finish(CLUSTER, d);
    Some(Cluster {
        name: name?,
        talos_version: talos_version?,
        kubernetes_version: kubernetes_version?,
        endpoint: endpoint?,
        vip,
        pod_subnets,
        service_subnets,
        dns_domain: dns_domain?,
        allow_scheduling_on_control_planes: allow_sched,
        secrets: secrets?,
        patches,
        installer: installer?,
        external_cni: false,
    })
}

fn secrets(node: &Y, base: &Path, d: &mut Diagnostics) -> Option<Secrets> {
    if let Value::Str(s) = &node.value {
        return Some(Secrets {
            file: base.join(s),
            age_recipients: Vec::new(),
        });
    }
    let mut r = MapReader::new(node, "cluster.secrets", d)?;
    let file = match r.get("file") {
        Some(n) => read::string(n, "cluster.secrets.file", d).map(|s| base.join(s)),
        None => {
            missing(
                d,
                r.loc(),
                "cluster.secrets",
                "file",
                "e.g. file: secrets.age",
            );
            None
        }
    };
    let age_recipients = r
        .get("ageRecipients")
        .map(|n| {
            read::list(n, "cluster.secrets.ageRecipients", d, true, |n, p, d| {
                read::parsed(n, p, d, "an age recipient", "age1…", |s| {
                    if s.starts_with("age1") && s.len() > 10 {
                        Ok(s.to_string())
                    } else {
                        Err("age recipients start with age1")
                    }
                })
                .map(|s| s.value)
            })
        })
        .unwrap_or_default();
    r.finish(&["file", "ageRecipients"], d);
    Some(Secrets {
        file: file?,
        age_recipients,
    })
}

fn installer(node: &Y, d: &mut Diagnostics) -> Option<Installer> {
    let mut r = MapReader::new(node, "cluster.installer", d)?;
    let schematic = r.get("schematic").and_then(|n| {
        read::parsed(
            n,
            "cluster.installer.schematic",
            d,
            "an Image Factory schematic ID (64 hex digits)",
            VANILLA_SCHEMATIC,
            |s| {
                if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                    Ok(s.to_ascii_lowercase())
                } else {
                    Err("expected 64 hex digits")
                }
            },
        )
        .map(|s| s.value)
    });
    let image = r
        .get("image")
        .and_then(|n| read::string(n, "cluster.installer.image", d));
    if let Some(img) = &image
        && img
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
    {
        d.error_hint(
            &node.loc,
            "cluster.installer.image",
            format!("`{img}` has a tag"),
            "write the image without a tag; talboot appends the cluster's talosVersion",
        );
    }
    let factory_url = match r.get("factoryUrl") {
        Some(n) => read::parsed(
            n,
            "cluster.installer.factoryUrl",
            d,
            "an http(s) URL",
            DEFAULT_FACTORY_URL,
            |s| {
                if s.starts_with("https://") || s.starts_with("http://") {
                    Ok(s.trim_end_matches('/').to_string())
                } else {
                    Err("must start with https:// or http://")
                }
            },
        )
        .map(|s| s.value),
        None => Some(DEFAULT_FACTORY_URL.into()),
    };
    r.finish(&["schematic", "image", "factoryUrl"], d);
    Some(Installer {
        schematic,
        image,
        factory_url: factory_url?,
    })
}

const NETWORK: &[&str] = &[
    "interfaces",
    "mode",
    "subnet",
    "gateway",
    "dns",
    "ntp",
    "domain",
    "pool",
    "leaseTime",
    "advertise",
    "relays",
];

fn network(node: &Y, d: &mut Diagnostics) -> Option<Network> {
    let mut r = MapReader::new(node, "network", d)?;
    let p = |k: &str| format!("network.{k}");
    let loc = r.loc().clone();
    let interfaces = match r.get("interfaces") {
        Some(n) => read::list(n, &p("interfaces"), d, true, |n, p, d| {
            read::parsed(n, p, d, "an interface name", "eth0", |s| {
                if !s.is_empty()
                    && s.len() <= 15
                    && !s.contains(['/', ' ', '\t'])
                    && s != "."
                    && s != ".."
                {
                    Ok(s.to_string())
                } else {
                    Err("Linux interface names are 1-15 characters without '/' or spaces")
                }
            })
            .map(|s| s.value)
        }),
        None => {
            missing(d, &loc, "network", "interfaces", "e.g. interfaces: [eth0]");
            Vec::new()
        }
    };
    let mode = match r.get("mode") {
        Some(n) => read::word(n, &p("mode"), d, NetworkMode::WORDS, NetworkMode::parse),
        None => Some(NetworkMode::Authoritative),
    };
    let subnet = match r.get("subnet") {
        Some(n) => read::ipv4_subnet(n, &p("subnet"), d),
        None => {
            missing(d, &loc, "network", "subnet", "e.g. subnet: 10.0.40.0/24");
            None
        }
    };
    let gateway = r
        .get("gateway")
        .and_then(|n| read::ipv4(n, &p("gateway"), d));
    let dns = r
        .get("dns")
        .map(|n| {
            read::list(n, &p("dns"), d, true, |n, p, d| {
                read::ipv4(n, p, d).map(|s| s.value)
            })
        })
        .unwrap_or_default();
    let ntp = r
        .get("ntp")
        .map(|n| {
            read::list(n, &p("ntp"), d, true, |n, p, d| {
                read::parsed(
                    n,
                    p,
                    d,
                    "an NTP server address or name",
                    "pool.ntp.org",
                    |s| {
                        if s.parse::<Ipv4Addr>().is_ok() || is_dns_name(s) {
                            Ok(s.to_string())
                        } else {
                            Err("neither an IPv4 address nor a DNS name")
                        }
                    },
                )
                .map(|s| s.value)
            })
        })
        .unwrap_or_default();
    let domain = r.get("domain").and_then(|n| {
        read::parsed(n, &p("domain"), d, "a DNS domain", "lab.example.com", |s| {
            if is_dns_name(s) {
                Ok(s.to_string())
            } else {
                Err("not a DNS name")
            }
        })
        .map(|s| s.value)
    });
    let pool = r.get("pool").and_then(|n| pool(n, &p("pool"), d));
    let lease_time = match r.get("leaseTime") {
        Some(n) => read::duration(n, &p("leaseTime"), d),
        None => Some(DEFAULT_LEASE),
    };
    let advertise = r
        .get("advertise")
        .and_then(|n| read::ipv4(n, &p("advertise"), d));
    let relays = r
        .get("relays")
        .map(|n| read::list(n, &p("relays"), d, false, relay))
        .unwrap_or_default();
    r.finish(NETWORK, d);
    Some(Network {
        interfaces,
        mode: mode?,
        subnet: subnet?,
        gateway,
        dns,
        ntp,
        domain,
        pool,
        lease_time: lease_time?,
        advertise,
        relays,
    })
}

fn pool(node: &Y, path: &str, d: &mut Diagnostics) -> Option<Spanned<Pool>> {
    let mut r = MapReader::new(node, path, d)?;
    let start = match r.get("start") {
        Some(n) => read::ipv4(n, &format!("{path}.start"), d),
        None => {
            missing(d, r.loc(), path, "start", "e.g. start: 10.0.40.200");
            None
        }
    };
    let end = match r.get("end") {
        Some(n) => read::ipv4(n, &format!("{path}.end"), d),
        None => {
            missing(d, r.loc(), path, "end", "e.g. end: 10.0.40.250");
            None
        }
    };
    r.finish(&["start", "end"], d);
    let (start, end) = (start?, end?);
    if start.value > end.value {
        d.error_hint(
            &node.loc,
            path,
            format!("pool start {} is after its end {}", start.value, end.value),
            "swap start and end",
        );
        return None;
    }
    Some(Spanned::new(
        Pool {
            start: start.value,
            end: end.value,
        },
        node.loc.clone(),
    ))
}

fn relay(node: &Y, path: &str, d: &mut Diagnostics) -> Option<RelaySubnet> {
    let mut r = MapReader::new(node, path, d)?;
    let subnet = match r.get("subnet") {
        Some(n) => read::ipv4_subnet(n, &format!("{path}.subnet"), d),
        None => {
            missing(d, r.loc(), path, "subnet", "e.g. subnet: 10.0.50.0/24");
            None
        }
    };
    let gateway = r
        .get("gateway")
        .and_then(|n| read::ipv4(n, &format!("{path}.gateway"), d));
    let pool = r
        .get("pool")
        .and_then(|n| pool(n, &format!("{path}.pool"), d));
    let dns = r
        .get("dns")
        .map(|n| {
            read::list(n, &format!("{path}.dns"), d, true, |n, p, d| {
                read::ipv4(n, p, d).map(|s| s.value)
            })
        })
        .unwrap_or_default();
    r.finish(&["subnet", "gateway", "pool", "dns"], d);
    Some(RelaySubnet {
        subnet: subnet?,
        gateway,
        pool,
        dns,
    })
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
    r.finish(
        &[
            "delivery",
            "unknownMachines",
            "defaultArch",
            "kernelArgs",
            "localBoot",
        ],
        d,
    );
    Some(Boot {
        delivery: delivery?,
        unknown_machines: unknown?,
        default_arch: arch?,
        kernel_args,
        local_boot: local_boot?,
    })
}

fn roles(
    node: &Y,
    base: &Path,
    power: &mut std::collections::BTreeMap<String, super::power::PowerBlock>,
    d: &mut Diagnostics,
) -> Vec<RoleDef> {
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
        if let Some(b) = r
            .get("power")
            .and_then(|n| super::power::PowerBlock::read(n, &format!("{path}.power"), d))
        {
            power.insert(key.name.clone(), b);
        }
        r.finish(
            &["type", "extends", "patches", "labels", "taints", "power"],
            d,
        );
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

const NODE: &[&str] = &[
    "name",
    "mac",
    "macs",
    "role",
    "address",
    "gateway",
    "installDisk",
    "diskSelector",
    "arch",
    "firmware",
    "kernelArgs",
    "localBoot",
    "patches",
    "labels",
    "taints",
    "interfaces",
    "power",
];

fn node(
    n: &Y,
    path: &str,
    base: &Path,
    role_refs: &mut Vec<(String, Spanned<String>)>,
    power: &mut std::collections::BTreeMap<String, super::power::PowerBlock>,
    d: &mut Diagnostics,
) -> Option<Node> {
    let mut r = MapReader::new(n, path, d)?;
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
    let gateway = r
        .get("gateway")
        .and_then(|n| read::ipv4(n, &f("gateway"), d));
    let disk = r.get("installDisk");
    let selector = r.get("diskSelector");
    let install = match (disk, selector) {
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
                "e.g. installDisk: /dev/sda, or diskSelector: {model: \"Samsung SSD 980*\"}",
            );
            None
        }
    };
    let arch = r
        .get("arch")
        .and_then(|n| read::word(n, &f("arch"), d, Arch::WORDS, Arch::parse));
    let firmware = r
        .get("firmware")
        .and_then(|n| read::word(n, &f("firmware"), d, Firmware::WORDS, Firmware::parse));
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
            .and_then(|n| super::power::PowerBlock::read(n, &f("power"), d)),
        &name,
    ) {
        power.insert(name.value.clone(), b);
    }
    r.finish(NODE, d);
    if macs.is_empty() {
        return None;
    }
    Some(Node {
        name: name?,
        macs,
        role: role?,
        address: address?,
        gateway,
        install: install?,
        arch,
        firmware,
        kernel_args,
        local_boot,
        patches,
        labels,
        taints,
        interfaces,
        power: None,
    })
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

fn addons(node: &Y, base: &Path, d: &mut Diagnostics) -> Addons {
    let mut out = Addons::default();
    let Some(mut r) = MapReader::new(node, "addons", d) else {
        return out;
    };
    if let Some(n) = r.get("cilium")
        && let Some(mut c) = MapReader::new(n, "addons.cilium", d)
    {
        let enabled = c
            .get("enabled")
            .and_then(|n| read::boolean(n, "addons.cilium.enabled", d))
            .unwrap_or(true);
        let version = match c.get("version") {
            Some(n) => read::version(n, "addons.cilium.version", d),
            None => {
                missing(
                    d,
                    c.loc(),
                    "addons.cilium",
                    "version",
                    "the chart version, e.g. version: 1.18.0",
                );
                None
            }
        };
        let values = c
            .get("values")
            .map(|n| values(n, "addons.cilium.values", d))
            .unwrap_or(yaml_serde::Value::Mapping(Default::default()));
        let kpr = c
            .get("kubeProxyReplacement")
            .and_then(|n| read::boolean(n, "addons.cilium.kubeProxyReplacement", d))
            .unwrap_or(true);
        let chart = c
            .get("chart")
            .and_then(|n| chart_ref(n, "addons.cilium.chart", base, d));
        c.finish(
            &[
                "enabled",
                "version",
                "values",
                "kubeProxyReplacement",
                "chart",
            ],
            d,
        );
        if let Some(version) = version {
            out.cilium = Some(CiliumAddon {
                enabled,
                version,
                values,
                kube_proxy_replacement: kpr,
                chart,
            });
        }
    }
    if let Some(n) = r.get("argocd")
        && let Some(mut a) = MapReader::new(n, "addons.argocd", d)
    {
        let enabled = a
            .get("enabled")
            .and_then(|n| read::boolean(n, "addons.argocd.enabled", d))
            .unwrap_or(true);
        let version = match a.get("version") {
            Some(n) => read::version(n, "addons.argocd.version", d),
            None => {
                missing(
                    d,
                    a.loc(),
                    "addons.argocd",
                    "version",
                    "the argo-cd chart version, e.g. version: 10.1.1",
                );
                None
            }
        };
        let values = a
            .get("values")
            .map(|n| values(n, "addons.argocd.values", d))
            .unwrap_or(yaml_serde::Value::Mapping(Default::default()));
        let domain = a.get("domain").and_then(|n| {
            read::parsed(
                n,
                "addons.argocd.domain",
                d,
                "a DNS name",
                "argocd.lab.example.com",
                |s| {
                    if is_dns_name(s) {
                        Ok(s.to_string())
                    } else {
                        Err("not a DNS name")
                    }
                },
            )
            .map(|s| s.value)
        });
        let ksops = a
            .get("ksops")
            .and_then(|n| read::boolean(n, "addons.argocd.ksops", d))
            .unwrap_or(false);
        let insecure = a
            .get("insecure")
            .and_then(|n| read::boolean(n, "addons.argocd.insecure", d))
            .unwrap_or(false);
        let root_app = a.get("rootApp").and_then(|n| root_app(n, d));
        let chart = a
            .get("chart")
            .and_then(|n| chart_ref(n, "addons.argocd.chart", base, d));
        a.finish(
            &[
                "enabled", "version", "values", "domain", "ksops", "insecure", "rootApp", "chart",
            ],
            d,
        );
        if let Some(version) = version {
            out.argocd = Some(ArgoCdAddon {
                enabled,
                version,
                values,
                domain,
                ksops,
                insecure,
                root_app,
                chart,
            });
        }
    }
    r.finish(&["cilium", "argocd"], d);
    out
}

/// `addons.<name>.chart`: an `https://` (or `http://`) repository URL, an `oci://` chart
/// reference, or a local chart directory or `.tgz` relative to the inventory's folder. A
/// local chart that is not there (yet) is a warning: `talboot check` may run on another
/// machine than `serve`, and only `helm template` needs it.
fn chart_ref(n: &Y, path: &str, base: &Path, d: &mut Diagnostics) -> Option<ChartRef> {
    let s = read::string(n, path, d)?;
    let s = s.trim();
    let example = "write a chart repository URL (https://helm.cilium.io), an OCI reference \
                   (oci://quay.io/cilium/charts/cilium) or a local chart directory or .tgz";
    if s.is_empty() {
        d.error_hint(&n.loc, path, "the chart is empty", example);
        return None;
    }
    if let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .or_else(|| s.strip_prefix("oci://"))
    {
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        if host.is_empty() || !is_dns_name(host) && host.parse::<Ipv4Addr>().is_err() {
            d.error_hint(
                &n.loc,
                path,
                format!("`{s}` has no valid host name"),
                example,
            );
            return None;
        }
        return Some(if s.starts_with("oci://") {
            ChartRef::Oci(s.to_owned())
        } else {
            ChartRef::Repo(s.to_owned())
        });
    }
    if s.contains("://") {
        d.error_hint(
            &n.loc,
            path,
            format!("`{s}` uses a scheme helm cannot fetch charts from"),
            example,
        );
        return None;
    }
    let p = read::relative_path(base, s);
    if !p.exists() {
        d.warning(
            &n.loc,
            path,
            format!("local chart {} does not exist", p.display()),
            Some("`helm template` needs it on the machine running `talboot serve`".into()),
        );
    }
    Some(ChartRef::Local(p))
}

fn values(n: &Y, path: &str, d: &mut Diagnostics) -> yaml_serde::Value {
    if !matches!(n.value, Value::Map(_)) {
        d.error(
            &n.loc,
            path,
            format!("Helm values must be a mapping, found {}", n.kind()),
        );
    }
    n.to_yaml()
}

fn root_app(n: &Y, d: &mut Diagnostics) -> Option<RootApp> {
    let path = "addons.argocd.rootApp";
    let mut r = MapReader::new(n, path, d)?;
    let field = |r: &mut MapReader<'_>, key: &str, hint: &str, d: &mut Diagnostics| match r.get(key)
    {
        Some(v) => read::string(v, &format!("{path}.{key}"), d),
        None => {
            missing(d, r.loc(), path, key, hint);
            None
        }
    };
    let repo_url = field(
        &mut r,
        "repoUrl",
        "e.g. repoUrl: https://git.example.com/infra.git",
        d,
    );
    let p = field(&mut r, "path", "e.g. path: clusters/lab", d);
    let revision = r
        .get("revision")
        .and_then(|v| read::string(v, &format!("{path}.revision"), d))
        .unwrap_or_else(|| "HEAD".into());
    r.finish(&["repoUrl", "path", "revision"], d);
    Some(RootApp {
        repo_url: repo_url?,
        path: p?,
        revision,
    })
}

/// Index helper re-exported for the talhelper reader.
pub fn item_path(path: &str, i: usize) -> String {
    index(path, i)
}
