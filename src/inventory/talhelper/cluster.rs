//! What a talhelper file says about the cluster as a whole: its top-level fields, and the
//! provisioning network derived from the nodes' addresses.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::inventory::diag::{Diagnostics, Loc};
use crate::inventory::model::*;
use crate::inventory::parts::{
    DEFAULT_FACTORY_URL, DEFAULT_LEASE, DEFAULT_POD_SUBNET, DEFAULT_SERVICE_SUBNET,
};
use crate::inventory::read::{self, missing};
use crate::inventory::yaml::{MapReader, Node as Y, Value, join};

use super::unsupported;

/// The cluster fields talhelper writes at the top level; the rest of [`Cluster`] comes from
/// the nodes ([`FromNodes`]).
pub(super) struct ClusterTop {
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
pub(super) struct FromNodes {
    pub(super) vip: Option<Spanned<Ipv4Addr>>,
    pub(super) gateways: Vec<Spanned<Ipv4Addr>>,
    pub(super) schematic: Option<String>,
    pub(super) installer_image: Option<String>,
}

pub(super) fn cluster(
    r: &mut MapReader<'_>,
    loc: &Loc,
    base: &Path,
    d: &mut Diagnostics,
) -> ClusterTop {
    let (name, talos_version, kubernetes_version, endpoint) = identity(r, loc, d);
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

/// Name, Talos version, Kubernetes version and endpoint; each `None` when missing or
/// unreadable (already reported).
type Identity = (
    Option<Spanned<String>>,
    Option<Spanned<Version>>,
    Option<Spanned<Version>>,
    Option<Spanned<Endpoint>>,
);

/// The required top-level fields that name the cluster and its versions, read in this order.
fn identity(r: &mut MapReader<'_>, loc: &Loc, d: &mut Diagnostics) -> Identity {
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
    (name, talos_version, kubernetes_version, endpoint)
}

impl ClusterTop {
    /// The cluster section, once the nodes have been read; `None` when a required top-level
    /// field was missing or wrong (already reported).
    pub(super) fn assemble(self, found: FromNodes, base: &Path) -> Option<Cluster> {
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
pub(super) fn secrets_file(base: &Path) -> PathBuf {
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
pub(super) fn subnets(
    r: &mut MapReader<'_>,
    key: &str,
    default: &str,
    d: &mut Diagnostics,
) -> Vec<Ipv4Net> {
    match r.get(key) {
        Some(n) => read::list(n, key, d, true, |n, p, d| {
            read::ipv4_subnet(n, p, d).map(|s| s.value)
        }),
        None => vec![default.parse().expect("default subnet")],
    }
}

/// Whether `cniConfig` says `name: none` (an external CNI); everything else in it is named in a
/// warning.
pub(super) fn cni(cni: &Y, d: &mut Diagnostics) -> bool {
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

pub(super) fn image_factory(n: &Y, d: &mut Diagnostics) -> String {
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

/// The provisioning network, derived from the boot NICs' addresses (talhelper has none): the
/// first subnet served directly, the others as relays. `None` when no node was read.
pub(super) fn network(
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
