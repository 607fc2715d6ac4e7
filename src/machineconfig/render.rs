//! Rendering: inventory + secrets bundle + node -> the node's multi-document machine config.
//!
//! Pure: no files, no clock, no randomness. Every certificate and key in the output comes from
//! the [`SecretsBundle`], so the same inventory and bundle always render the same bytes.
//!
//! # Order (talhelper's build order, `anchors-config.md` §1.5)
//!
//! 1. **Base document** for the machine type, equivalent to `talosctl gen config
//!    --talos-version` for the cluster's [`Contract`]. For v1.13 (`talos-facts.md` §5.1): the
//!    v1alpha1 document with the bundle's secrets, CLI defaults `install.disk: /dev/sda` and
//!    the ghcr installer, plus `HostnameConfig` `auto: stable`. For v1.14 the documents of
//!    [`v114`] (`UnattendedInstallConfig`, `Kube*Config`, `ResolverConfig.hostDNS`, discovery,
//!    trim, workload isolation), each behind its contract switch. Generation input also carries what talhelper feeds
//!    `generate.Input`: subnets, DNS domain, `allowSchedulingOnControlPlanes` and, when the
//!    Cilium add-on is enabled, `cni: none` (+ `proxy.disabled: true` with kube-proxy
//!    replacement; Cilium without it still needs kube-proxy).
//! 2. **Common patches** (`cluster.patches`).
//! 3. **Role patches**, root ancestor of the `extends` chain first.
//! 4. **Generated per-node patch** ([`node_patch_at`]): hostname (`HostnameConfig` with
//!    `auto: off`), the static address and default route on the boot NIC selected by its MAC
//!    (`LinkAliasConfig` + `LinkConfig`), extra NICs likewise, resolvers, NTP servers
//!    (`TimeSyncConfig`, from `network.ntp`), the VIP on control
//!    planes (`Layer2VIPConfig`), install disk or `diskSelector`, installer image from the
//!    schematic, node labels and taints.
//! 5. **The node's own patches.**
//!
//! Under the v1.14 contract every patch is followed by [`legacy::translate`]: v1.13-style
//! fields a patch set (`.machine.kubelet`, `.machine.sysctls`, `.cluster.network`, ...) move
//! into their v1.14 documents, so Talos does not refuse the mix, and later patches still win.
//!
//! Networking uses the v1.13 multi-document kinds instead of the deprecated
//! `machine.network.interfaces`, which the JSON schema omits; so the output validates. Time
//! sync likewise: `TimeSyncConfig` (siderolabs/talos v1.13.9
//! `pkg/machinery/config/types/network/time_sync.go`) instead of the deprecated
//! `machine.time` (`v1alpha1_types.go`: "Deprecated: Use 'TimeSyncConfig' instead."). Talos
//! refuses a config that sets time servers, a boot timeout or `disabled` in both
//! (`V1Alpha1ConflictValidate`), and so does [`check_structure`].
//!
//! # Taints
//!
//! Kubernetes' NodeRestriction admission stops a kubelet from changing its node's taints after
//! registration, and Talos applies `machine.nodeTaints` with the node's own credentials, so on
//! workers it fails. Control planes get `machine.nodeTaints`; workers get their taints through
//! the kubelet's `registerWithTaints` (`machine.kubelet.extraConfig`), which sets them once when
//! the node registers. [`check_structure`] rejects `machine.nodeTaints` on workers for the same
//! reason.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value as Json, json};
use thiserror::Error;
use yaml_serde::Value;

use super::legacy;
use super::patch::{self, ConfigBundle, PatchError};
use super::pki::PemCertAndKey;
use super::secrets::{EncryptionSecret, SecretsBundle};
use crate::inventory::{
    DiskSelector, EndpointHost, InstallTarget, Inventory, MachineType, Node, PatchBody, Taint,
};
use crate::talosfacts::contract::Contract;

/// KubePrism's default port (`DefaultKubePrismPort`).
pub(crate) const KUBEPRISM_PORT: u16 = 7445;
/// Install disk `talosctl gen config` defaults to (`--install-disk`).
pub(crate) const DEFAULT_INSTALL_DISK: &str = "/dev/sda";
/// Alias the boot NIC gets (`LinkAliasConfig`); extra NICs get `net1`, `net2`, ...
pub(crate) const BOOT_LINK: &str = "net0";

/// Why a node's config could not be rendered.
#[derive(Debug, Error)]
pub enum RenderError {
    /// The cluster's Talos version is outside the contracts we render.
    #[error(
        "cluster.talosVersion {version} is not supported: talboot renders the Talos v1.13 and \
         v1.14 machine-config contracts; set talosVersion to a v1.13.x or v1.14.x release"
    )]
    UnsupportedTalos {
        /// The version in the inventory.
        version: String,
    },
    /// The node's disk selector cannot be written as the CEL expression v1.14 needs.
    #[error("node {node}: diskSelector: {source}")]
    Selector {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: super::contract::SelectorError,
    },
    /// A patch's v1.13-style fields could not be moved into their v1.14 documents.
    #[error("node {node}: {stage} ({origin}): translating to the v1.14 contract: {source}")]
    Translate {
        /// The node being rendered.
        node: String,
        /// Which step of the order.
        stage: String,
        /// Where the patch came from.
        origin: String,
        /// What went wrong.
        #[source]
        source: Box<legacy::TranslateError>,
    },
    /// A patch failed to apply.
    #[error("node {node}: {stage} ({origin}): {source}")]
    Patch {
        /// The node being rendered.
        node: String,
        /// Which step of the order (e.g. "role storage patch").
        stage: String,
        /// Where the patch came from.
        origin: String,
        /// What went wrong.
        #[source]
        source: Box<PatchError>,
    },
    /// No gateway on the node's subnet.
    #[error(
        "node {node}: gateway {gateway} is not inside the node's subnet {subnet}; set \
         `gateway` on the node (or on the relay subnet it sits in)"
    )]
    GatewayOffLink {
        /// The node.
        node: String,
        /// The gateway chosen.
        gateway: Ipv4Addr,
        /// The node's address with prefix.
        subnet: String,
    },
    /// Structural checks failed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Structure(Vec<StructuralError>),
}

/// A structural problem in a rendered config (found without the schema).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("node {node}: {kind} `{field}`: {problem}")]
pub struct StructuralError {
    /// The node.
    pub node: String,
    /// The document kind (`v1alpha1` for the legacy document).
    pub kind: String,
    /// Dotted field path.
    pub field: String,
    /// What is wrong and how to fix it.
    pub(crate) problem: String,
}

/// Convert a JSON value built with `json!` (ordered) to a YAML value.
fn yaml(v: Json) -> Value {
    yaml_serde::to_value(v).expect("JSON values always convert to YAML")
}

/// `{crt, key}` with both as base64 of the PEM text, as Talos stores them in configs.
fn cert_and_key(pair: &PemCertAndKey, with_key: bool) -> Json {
    let key = if with_key {
        STANDARD.encode(&pair.key)
    } else {
        String::new()
    };
    json!({"crt": STANDARD.encode(&pair.crt), "key": key})
}

/// The installer image: the inventory's image, else the Image Factory `metal-installer` for the
/// cluster's schematic, tagged with the Talos version.
pub(crate) fn installer_image(inv: &Inventory) -> String {
    installer_image_at(inv, &inv.cluster.talos_version.value)
}

/// [`installer_image`] at another Talos version (the target of `talboot upgrade --talos`).
pub(crate) fn installer_image_at(inv: &Inventory, talos: &crate::inventory::Version) -> String {
    let installer = &inv.cluster.installer;
    match &installer.image {
        Some(image) => format!("{image}:{talos}"),
        None => {
            let host = installer
                .factory_url
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/');
            format!(
                "{host}/metal-installer/{}:{talos}",
                installer.schematic_id()
            )
        }
    }
}

/// The installer of one node: [`installer_image`], except that a `secureBoot: true` node
/// gets the Image Factory's Secure Boot installer, `metal-installer-secureboot/<schematic>`
/// (its UKI is signed and boots through systemd-boot). Neither `talosctl gen config` nor
/// the v1.14 install controller adds the suffix (siderolabs/talos v1.14.0-rc.1
/// `pkg/images/images.go` `NewInstallerImage` builds `<platform>-installer/<schematic>`, and
/// `internal/app/machined/pkg/controllers/runtime/unattended_install.go`
/// `getInstallerFromBootEntry` passes the platform `metal`), so the config must name it.
pub(crate) fn node_installer_image(inv: &Inventory, node: &Node) -> String {
    node_installer_image_at(inv, node, &inv.cluster.talos_version.value)
}

/// [`node_installer_image`] at another Talos version (`talboot upgrade --talos`). An
/// operator's own `installer.image` that mirrors the factory's layout (a `metal-installer`
/// path segment) gets the same change; any other image is theirs and is used as written.
pub(crate) fn node_installer_image_at(
    inv: &Inventory,
    node: &Node,
    talos: &crate::inventory::Version,
) -> String {
    let image = installer_image_at(inv, talos);
    if !node.secure_boot() {
        return image;
    }
    let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), ""));
    let secure = match name.rsplit_once("/metal-installer/") {
        Some((host, schematic)) => format!("{host}/metal-installer-secureboot/{schematic}"),
        None if name.ends_with("/metal-installer") => format!("{name}-secureboot"),
        None => name.to_owned(),
    };
    format!("{secure}:{tag}")
}

/// The contract the cluster's Talos version renders (`talosctl gen config --talos-version`).
pub(crate) fn contract(inv: &Inventory) -> Result<Contract, RenderError> {
    Contract::for_version(&inv.cluster.talos_version.value.0).ok_or_else(|| {
        RenderError::UnsupportedTalos {
            version: inv.cluster.talos_version.value.to_string(),
        }
    })
}

/// Whether the Cilium add-on is enabled, and whether it replaces kube-proxy.
fn cilium(inv: &Inventory) -> Option<bool> {
    inv.addons
        .cilium
        .as_ref()
        .filter(|c| c.enabled)
        .map(|c| c.kube_proxy_replacement)
}

/// The PodSecurity admission plugin configuration `talosctl gen config` writes.
fn admission_control() -> Json {
    json!([{
        "name": "PodSecurity",
        "configuration": {
            "apiVersion": "pod-security.admission.config.k8s.io/v1alpha1",
            "defaults": {
                "audit": "restricted",
                "audit-version": "latest",
                "enforce": "baseline",
                "enforce-version": "latest",
                "warn": "restricted",
                "warn-version": "latest"
            },
            "exemptions": {
                "namespaces": ["kube-system"],
                "runtimeClasses": [],
                "usernames": []
            },
            "kind": "PodSecurityConfiguration"
        }
    }])
}

/// The base config for `machine_type`: what `talosctl gen config` emits for the cluster's
/// contract with this cluster's name, endpoint, versions, subnets and secrets.
#[cfg(test)]
pub(crate) fn base_config(
    inv: &Inventory,
    secrets: &SecretsBundle,
    machine_type: MachineType,
) -> Result<ConfigBundle, RenderError> {
    base_config_at(inv, secrets, machine_type, contract(inv)?)
}

/// The base config at a chosen contract: day two renders a node at the contract of the
/// config it runs, which may be older than the inventory's Talos version.
fn base_config_at(
    inv: &Inventory,
    secrets: &SecretsBundle,
    machine_type: MachineType,
    contract: Contract,
) -> Result<ConfigBundle, RenderError> {
    match contract {
        Contract::V1_13 => base_config_v1_13(inv, secrets, machine_type),
        Contract::V1_14 => v114::base_config(inv, secrets, machine_type),
    }
}

/// [`base_config_at`] for the v1.13 contract (unchanged since before v1.14 support: the golden
/// files pin it byte for byte).
fn base_config_v1_13(
    inv: &Inventory,
    secrets: &SecretsBundle,
    machine_type: MachineType,
) -> Result<ConfigBundle, RenderError> {
    let main = json!({
        "version": "v1alpha1",
        "debug": false,
        "persist": true,
        "machine": machine_v1_13(inv, secrets, machine_type),
        "cluster": cluster_v1_13(inv, secrets, machine_type == MachineType::ControlPlane),
    });
    let hostname = json!({"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "stable"});
    Ok(ConfigBundle::new(vec![yaml(main), yaml(hostname)]))
}

/// The v1.13 base document's `machine` section: gen config's defaults (install disk, ghcr
/// installer and kubelet images, features) and the OS CA, whose key only a control plane
/// gets.
fn machine_v1_13(inv: &Inventory, secrets: &SecretsBundle, machine_type: MachineType) -> Json {
    let c = &inv.cluster;
    let talos = &c.talos_version.value;
    let k8s = &c.kubernetes_version.value;
    let cp = machine_type == MachineType::ControlPlane;
    let mut machine = json!({
        "type": machine_type.as_str(),
        "token": secrets.trustd_token(),
        "ca": cert_and_key(secrets.os_ca(), cp),
        "certSANs": [],
        "kubelet": {
            "image": format!("ghcr.io/siderolabs/kubelet:{k8s}"),
            "defaultRuntimeSeccompProfileEnabled": true,
            "disableManifestsDirectory": true
        },
        "install": {
            "disk": DEFAULT_INSTALL_DISK,
            "image": format!("ghcr.io/siderolabs/installer:{talos}"),
            "wipe": false,
            "grubUseUKICmdline": true
        },
        "features": {
            "diskQuotaSupport": true,
            "kubePrism": {"enabled": true, "port": KUBEPRISM_PORT},
            "hostDNS": {"enabled": true, "forwardKubeDNSToHost": true}
        }
    });
    if cp {
        machine["nodeLabels"] =
            json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""});
    }
    machine
}

/// The v1.13 base document's `cluster` section: identity, endpoint, network and secrets every
/// node shares; a worker gets the Kubernetes CA without its key and discovery, a control plane
/// everything [`control_plane_v1_13`] adds.
fn cluster_v1_13(inv: &Inventory, secrets: &SecretsBundle, cp: bool) -> Json {
    let c = &inv.cluster;
    let endpoint = &c.endpoint.value;
    let host = match &endpoint.host {
        EndpointHost::Ip(ip) => ip.to_string(),
        EndpointHost::Name(n) => n.clone(),
    };
    let mut network = json!({
        "dnsDomain": c.dns_domain,
        "podSubnets": c.pod_subnets.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "serviceSubnets": c.service_subnets.iter().map(ToString::to_string).collect::<Vec<_>>(),
    });
    let cilium = cilium(inv);
    if cilium.is_some() || c.external_cni {
        network["cni"] = json!({"name": "none"});
    }
    let mut cluster = json!({
        "id": secrets.cluster_id(),
        "secret": secrets.cluster_secret(),
        "controlPlane": {"endpoint": format!("https://{host}:{}", endpoint.port)},
        "clusterName": c.name.value,
        "network": network,
        "token": secrets.bootstrap_token(),
    });
    if cp {
        control_plane_v1_13(&mut cluster, inv, secrets, cilium);
    } else {
        cluster["ca"] = cert_and_key(secrets.k8s_ca(), false);
        cluster["discovery"] = discovery();
    }
    cluster
}

/// What only a control plane's v1.13 `cluster` section holds: the encryption secret and the
/// CA keys, the control-plane component images (kube-proxy disabled when Cilium replaces it),
/// discovery, etcd, and scheduling on control planes when the inventory allows it. Added in
/// gen config's key order, which the golden files pin.
fn control_plane_v1_13(
    cluster: &mut Json,
    inv: &Inventory,
    secrets: &SecretsBundle,
    cilium: Option<bool>,
) {
    let c = &inv.cluster;
    let k8s = &c.kubernetes_version.value;
    match secrets.encryption_secret() {
        EncryptionSecret::Secretbox(s) => cluster["secretboxEncryptionSecret"] = json!(s),
        EncryptionSecret::AesCbc(s) => cluster["aescbcEncryptionSecret"] = json!(s),
    }
    cluster["ca"] = cert_and_key(secrets.k8s_ca(), true);
    cluster["aggregatorCA"] = cert_and_key(secrets.k8s_aggregator_ca(), true);
    cluster["serviceAccount"] = json!({"key": STANDARD.encode(secrets.k8s_service_account_key())});
    cluster["apiServer"] = json!({
        "image": format!("registry.k8s.io/kube-apiserver:{k8s}"),
        "admissionControl": admission_control(),
        "auditPolicy": {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "rules": [{"level": "Metadata"}]
        }
    });
    cluster["controllerManager"] =
        json!({"image": format!("registry.k8s.io/kube-controller-manager:{k8s}")});
    let mut proxy = json!({"image": format!("registry.k8s.io/kube-proxy:{k8s}")});
    if cilium == Some(true) {
        proxy["disabled"] = json!(true);
    }
    cluster["proxy"] = proxy;
    cluster["scheduler"] = json!({"image": format!("registry.k8s.io/kube-scheduler:{k8s}")});
    cluster["discovery"] = discovery();
    cluster["etcd"] = json!({"ca": cert_and_key(secrets.etcd_ca(), true)});
    if c.allow_scheduling_on_control_planes {
        cluster["allowSchedulingOnControlPlanes"] = json!(true);
    }
}

/// Cluster discovery as gen config enables it (service registry only).
fn discovery() -> Json {
    json!({"enabled": true, "registries": {"kubernetes": {"disabled": true}, "service": {}}})
}

/// The default gateway of `node`: its own, else the relay subnet's it sits in, else the
/// provisioning network's. It must be on the node's subnet.
fn gateway(inv: &Inventory, node: &Node) -> Result<Option<Ipv4Addr>, RenderError> {
    let addr = node.address.value;
    let chosen = node.gateway.as_ref().map(|g| g.value).or_else(|| {
        inv.network
            .relays
            .iter()
            .find(|r| r.subnet.value.contains(&addr.addr()))
            .and_then(|r| r.gateway.as_ref().map(|g| g.value))
            .or_else(|| inv.network.gateway.as_ref().map(|g| g.value))
    });
    match chosen {
        Some(gw) if !addr.trunc().contains(&gw) => Err(RenderError::GatewayOffLink {
            node: node.name.value.clone(),
            gateway: gw,
            subnet: addr.to_string(),
        }),
        other => Ok(other),
    }
}

/// DNS servers for `node`: the relay subnet's when it has its own, else the network's.
fn nameservers(inv: &Inventory, node: &Node) -> Vec<Ipv4Addr> {
    let addr = node.address.value.addr();
    inv.network
        .relays
        .iter()
        .find(|r| r.subnet.value.contains(&addr) && !r.dns.is_empty())
        .map(|r| r.dns.clone())
        .unwrap_or_else(|| inv.network.dns.clone())
}

/// The `TimeSyncConfig` document for `network.ntp` (none when the inventory names no NTP
/// server: Talos then keeps its default, `time.cloudflare.com`). Talos reads the servers from
/// `ntp.servers` (`NTPConfig.Servers`, time_sync.go v1.13.9), names or addresses alike.
fn time_sync(inv: &Inventory) -> Option<Json> {
    if inv.network.ntp.is_empty() {
        return None;
    }
    Some(json!({
        "apiVersion": "v1alpha1",
        "kind": "TimeSyncConfig",
        "ntp": {"servers": inv.network.ntp},
    }))
}

/// Talos `InstallDiskSelector` keys for a selector.
fn disk_selector(sel: &DiskSelector) -> Json {
    let mut m = serde_json::Map::new();
    let fields: [(&str, Option<String>); 6] = [
        ("size", sel.size.clone()),
        ("model", sel.model.clone()),
        ("serial", sel.serial.clone()),
        ("type", sel.disk_type.map(|t| t.as_str().to_owned())),
        ("wwid", sel.wwid.clone()),
        ("busPath", sel.bus_path.clone()),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            m.insert(k.to_owned(), json!(v));
        }
    }
    Json::Object(m)
}

/// A `LinkAliasConfig` pinning `alias` to the NIC whose burned-in MAC is `mac`.
///
/// The selector matches `link.permanent_addr`, not `hardware_addr`: a bond or bridge takes
/// over its member's current MAC, and an alias selector must match exactly one link, while
/// only the physical NIC carries the MAC as its permanent address.
fn link_alias(alias: &str, mac: &str) -> Json {
    json!({
        "apiVersion": "v1alpha1",
        "kind": "LinkAliasConfig",
        "name": alias,
        "selector": {"match": format!("mac(link.permanent_addr) == \"{mac}\"")}
    })
}

/// Labels for `node`: role chain's, then the node's own (which win).
fn labels(inv: &Inventory, node: &Node) -> BTreeMap<String, String> {
    let mut labels = inv.role_of(node).labels.clone();
    labels.extend(node.labels.clone());
    labels
}

/// Taints for `node`: role chain's, then the node's own (same key and effect replaces).
fn taints(inv: &Inventory, node: &Node) -> Vec<Taint> {
    let mut out = inv.role_of(node).taints.clone();
    for t in &node.taints {
        out.retain(|o| !(o.key == t.key && o.effect == t.effect));
        out.push(t.clone());
    }
    out
}

/// The generated per-node patch (step 4 of the order) at `contract`: hostname, boot NIC
/// address and route, extra NICs, resolvers, VIP on control planes, install target and image,
/// labels, taints.
fn node_patch_at(
    inv: &Inventory,
    node: &Node,
    contract: Contract,
) -> Result<PatchBody, RenderError> {
    match contract {
        Contract::V1_13 => node_patch_v1_13(inv, node),
        Contract::V1_14 => v114::node_patch(inv, node),
    }
}

/// [`node_patch_at`] for the v1.13 contract.
fn node_patch_v1_13(inv: &Inventory, node: &Node) -> Result<PatchBody, RenderError> {
    let cp = inv.role_of(node).machine_type == MachineType::ControlPlane;
    let mut docs = vec![
        yaml(json!({"machine": machine_patch_v1_13(inv, node, cp)})),
        yaml(json!({
            "apiVersion": "v1alpha1",
            "kind": "HostnameConfig",
            "auto": "off",
            "hostname": node.name.value
        })),
    ];
    docs.extend(links_v1_13(inv, node)?.into_iter().map(yaml));

    let dns = nameservers(inv, node);
    if !dns.is_empty() {
        docs.push(yaml(json!({
            "apiVersion": "v1alpha1",
            "kind": "ResolverConfig",
            "nameservers": dns.iter().map(|a| json!({"address": a.to_string()})).collect::<Vec<_>>(),
        })));
    }

    if let Some(time_sync) = time_sync(inv) {
        docs.push(yaml(time_sync));
    }

    if cp && let Some(vip) = &inv.cluster.vip {
        docs.push(yaml(json!({
            "apiVersion": "v1alpha1",
            "kind": "Layer2VIPConfig",
            "name": vip.value.to_string(),
            "link": BOOT_LINK,
        })));
    }
    Ok(PatchBody::Merge(docs))
}

/// The `machine` part of the v1.13 node patch: install target and installer image, then the
/// role's and node's labels and taints.
fn machine_patch_v1_13(inv: &Inventory, node: &Node, cp: bool) -> Json {
    let mut install = match &node.install {
        InstallTarget::Disk(d) => json!({"disk": d}),
        // gen config's default disk must go, or the node would have two install choices.
        InstallTarget::Selector(s) => {
            json!({"disk": {"$patch": "delete"}, "diskSelector": disk_selector(s)})
        }
    };
    install["image"] = json!(node_installer_image(inv, node));
    let mut machine = json!({"install": install});

    let labels = labels(inv, node);
    if !labels.is_empty() {
        machine["nodeLabels"] = json!(labels);
    }
    let taints = taints(inv, node);
    if !taints.is_empty() {
        if cp {
            machine["nodeTaints"] = node_taints(&taints);
        } else {
            let list = register_with_taints(&taints);
            machine["kubelet"] = json!({"extraConfig": {"registerWithTaints": list}});
        }
    }
    machine
}

/// Taints as `machine.nodeTaints` holds them (`key: value:effect`), which Talos applies with
/// the node's own credentials: only for control planes (see the module docs).
fn node_taints(taints: &[Taint]) -> Json {
    let map: serde_json::Map<String, Json> = taints
        .iter()
        .map(|t| {
            let v = match &t.value {
                Some(v) => format!("{v}:{}", t.effect),
                None => t.effect.to_string(),
            };
            (t.key.clone(), json!(v))
        })
        .collect();
    Json::Object(map)
}

/// Taints as the kubelet's `registerWithTaints` lists them, set once when a worker registers,
/// since NodeRestriction stops it from changing them later (see the module docs).
fn register_with_taints(taints: &[Taint]) -> Json {
    let list: Vec<Json> = taints
        .iter()
        .map(|t| {
            let mut o = json!({"key": t.key, "effect": t.effect.to_string()});
            if let Some(v) = &t.value {
                o["value"] = json!(v);
            }
            o
        })
        .collect();
    Json::Array(list)
}

/// The v1.13 link documents, each NIC selected by its MAC: the boot NIC (the first MAC) with
/// the static address and the default route, then every extra NIC with its own addresses.
fn links_v1_13(inv: &Inventory, node: &Node) -> Result<Vec<Json>, RenderError> {
    let mut docs = Vec::new();
    let boot_mac = node.macs[0].value.to_string();
    docs.push(link_alias(BOOT_LINK, &boot_mac));
    let mut link = json!({
        "apiVersion": "v1alpha1",
        "kind": "LinkConfig",
        "name": BOOT_LINK,
        "up": true,
        "addresses": [{"address": node.address.value.to_string()}],
    });
    if let Some(gw) = gateway(inv, node)? {
        link["routes"] = json!([{"gateway": gw.to_string()}]);
    }
    docs.push(link);

    for (i, extra) in node.interfaces.iter().enumerate() {
        let alias = format!("net{}", i + 1);
        docs.push(link_alias(&alias, &extra.mac.value.to_string()));
        let mut link = json!({
            "apiVersion": "v1alpha1",
            "kind": "LinkConfig",
            "name": alias,
            "up": true,
            "addresses": extra
                .addresses
                .iter()
                .map(|a| json!({"address": a.value.to_string()}))
                .collect::<Vec<_>>(),
        });
        if let Some(mtu) = extra.mtu {
            link["mtu"] = json!(mtu);
        }
        docs.push(link);
    }
    Ok(docs)
}

/// Renders `node`'s complete config at the contract of the cluster's Talos version (see
/// [`render_node_at`]).
pub(crate) fn render_node(
    inv: &Inventory,
    secrets: &SecretsBundle,
    node: &Node,
) -> Result<ConfigBundle, RenderError> {
    render_node_at(inv, secrets, node, contract(inv)?)
}

/// Renders `node`'s complete config at `contract`: base, common patches, role chain patches,
/// the generated node patch, the node's own patches; then runs [`check_structure`]. The
/// contract is the caller's choice, not the inventory's: a running node keeps the contract
/// of the config it runs until that config is changed (`daytwo::contract`).
pub(crate) fn render_node_at(
    inv: &Inventory,
    secrets: &SecretsBundle,
    node: &Node,
    contract: Contract,
) -> Result<ConfigBundle, RenderError> {
    let role = inv.role_of(node);
    let name = node.name.value.clone();
    let mut bundle = base_config_at(inv, secrets, role.machine_type, contract)?;
    let generated = node_patch_at(inv, node, contract)?;
    let stages = inv
        .cluster
        .patches
        .iter()
        .map(|p| ("common patch".to_owned(), p.origin.to_string(), &p.body))
        .chain(role.patches.iter().map(|p| {
            (
                format!("role {} patch", role.name),
                p.origin.to_string(),
                &p.body,
            )
        }))
        .chain(std::iter::once((
            "generated node patch".to_owned(),
            "talboot (hostname, network, install, labels, taints)".to_owned(),
            &generated,
        )))
        .chain(
            node.patches
                .iter()
                .map(|p| ("node patch".to_owned(), p.origin.to_string(), &p.body)),
        );
    for (stage, origin, body) in stages {
        if let Err(source) = patch::apply(&mut bundle, body) {
            return Err(RenderError::Patch {
                node: name,
                stage,
                origin,
                source: Box::new(source),
            });
        }
        if contract >= Contract::V1_14 {
            match legacy::translate(&mut bundle) {
                Ok(moved) if !moved.is_empty() => {
                    tracing::debug!(node = %name, %stage, %origin, ?moved, "moved v1.13 fields into their v1.14 documents");
                }
                Ok(_) => {}
                Err(source) => {
                    return Err(RenderError::Translate {
                        node: name,
                        stage,
                        origin,
                        source: Box::new(source),
                    });
                }
            }
        }
    }
    if contract >= Contract::V1_14 {
        v114::order_like_gen_config(&mut bundle);
    }
    let problems = check_structure(&name, role.machine_type, contract, &bundle);
    if !problems.is_empty() {
        return Err(RenderError::Structure(problems));
    }
    tracing::debug!(node = %name, documents = bundle.docs.len(), %contract, "rendered machine config");
    Ok(bundle)
}

fn lookup<'a>(doc: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |v, k| v.get(*k))
}

mod structure;
pub(crate) use structure::check_structure;

mod v114;
pub(crate) use v114::LABEL_CONTROL_PLANE;

#[cfg(test)]
mod secure_boot_tests;
#[cfg(test)]
mod tests;
