//! The Talos v1.14 contract: the base documents `talosctl gen config --talos-version v1.14`
//! writes, and the generated per-node patch in v1.14 documents.
//!
//! Order and shapes follow siderolabs/talos v1.14.0-rc.1 `pkg/machinery/config/generate/
//! {init,worker,kubernetes,block,security_profile,network}.go` and its golden files
//! `pkg/machinery/config/types/v1alpha1/testdata/stability/v1.14/*.yaml`. Each block names the
//! [`Contract`] switch that turns it on. talboot's own inputs (Cilium's `cni: none` and
//! kube-proxy replacement, `allowSchedulingOnControlPlanes`, the Image Factory installer)
//! change the same documents the v1.13 renderer changes in v1alpha1.

use serde_json::{Value as Json, json};

use super::{
    BOOT_LINK, DEFAULT_INSTALL_DISK, KUBEPRISM_PORT, RenderError, cert_and_key, cilium, gateway,
    installer_image, labels, link_alias, nameservers, taints, time_sync, yaml,
};
use crate::inventory::{
    DiskSelector, EndpointHost, InstallTarget, Inventory, MachineType, Node, PatchBody,
};
use crate::machineconfig::contract::{
    LegacySelector, install_disk_expression, selector_expression,
};
use crate::machineconfig::patch::ConfigBundle;
use crate::machineconfig::secrets::{EncryptionSecret, SecretsBundle};
use crate::talosfacts::contract::Contract;

/// `constants.DefaultDiscoveryServiceEndpoint`.
const DISCOVERY_ENDPOINT: &str = "https://discovery.talos.dev/";
/// `constants.DefaultFilesystemTrimInterval` as the document prints it.
const TRIM_INTERVAL: &str = "168h0m0s";
/// `constants.LabelNodeRoleControlPlane`.
pub(crate) const LABEL_CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";
/// `constants.LabelExcludeFromExternalLB`.
const LABEL_EXCLUDE_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

fn doc(kind: &str, body: Json) -> Json {
    let mut out = json!({"apiVersion": "v1alpha1", "kind": kind});
    if let Json::Object(fields) = body {
        out.as_object_mut().expect("an object").extend(fields);
    }
    out
}

/// A CA as the `Kube*CAConfig` documents carry it: PEM text, not base64.
fn pem_issuing(pair: &crate::machineconfig::pki::PemCertAndKey) -> Json {
    json!({"cert": pair.crt, "key": pair.key})
}

/// The kinds `gen config` writes, in its order (`generate/init.go`: discovery, install,
/// resolver, sysctls, block, security profile, registries, network; then
/// `generate/kubernetes.go`).
const GEN_CONFIG_ORDER: &[&str] = &[
    "DiscoveryServiceConfig",
    "DiscoveryIdentityConfig",
    "UnattendedInstallConfig",
    "ResolverConfig",
    "SysctlConfig",
    "VolumeConfig",
    "FilesystemTrimConfig",
    "SecurityProfileConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "HostnameConfig",
    "KubeSpanConfig",
    "KubeClusterConfig",
    "KubeNodeConfig",
    "KubeletConfig",
    "KubeNetworkConfig",
    "KubeAPIServerCAConfig",
    "KubePrismConfig",
    "KubeAggregatorCAConfig",
    "KubeAdmissionControlConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeEtcdEncryptionConfig",
    "KubeServiceAccountConfig",
    "KubeAPIServerConfig",
    "KubeControllerManagerConfig",
    "KubeSchedulerConfig",
    "KubeProxyConfig",
    "KubeFlannelCNIConfig",
    "KubeCoreDNSConfig",
    "KubeExternalManifestConfig",
];

/// Puts the documents `gen config` writes in its order (a translated `SysctlConfig` is
/// appended by the patch engine, upstream writes it after `ResolverConfig`); the v1alpha1
/// document stays first and everything else keeps its order after them.
pub(super) fn order_like_gen_config(bundle: &mut ConfigBundle) {
    let rank = |d: &yaml_serde::Value| match d.get("kind").and_then(|k| k.as_str()) {
        None => 0,
        Some(kind) => GEN_CONFIG_ORDER
            .iter()
            .position(|k| *k == kind)
            .map_or(GEN_CONFIG_ORDER.len() + 1, |i| i + 1),
    };
    bundle.docs.sort_by_key(rank);
}

/// The base config `gen config` writes for the v1.14 contract.
pub(super) fn base_config(
    inv: &Inventory,
    secrets: &SecretsBundle,
    machine_type: MachineType,
) -> Result<ConfigBundle, RenderError> {
    let contract = Contract::V1_14;
    let c = &inv.cluster;
    let cp = machine_type == MachineType::ControlPlane;
    let endpoint = &c.endpoint.value;
    let host = match &endpoint.host {
        EndpointHost::Ip(ip) => ip.to_string(),
        EndpointHost::Name(n) => n.clone(),
    };
    let endpoint_url = format!("https://{host}:{}", endpoint.port);

    let mut docs = vec![v1alpha1_document(secrets, machine_type)];

    if contract.discovery_service_multidoc_config() {
        docs.push(doc(
            "DiscoveryServiceConfig",
            json!({"name": "default", "endpoint": DISCOVERY_ENDPOINT}),
        ));
    }
    if contract.discovery_identity_multidoc_config() {
        docs.push(doc(
            "DiscoveryIdentityConfig",
            json!({"clusterID": secrets.cluster_id(), "clusterSecret": secrets.cluster_secret()}),
        ));
    }
    if contract.unattended_install_config() {
        // gen config's `--install-disk` default; the node patch sets the node's own target.
        docs.push(doc(
            "UnattendedInstallConfig",
            json!({
                "installer": {"image": installer_image(inv)},
                "provisioning": {
                    "diskSelector": {"match": install_disk_expression(DEFAULT_INSTALL_DISK)},
                    "wipe": false
                }
            }),
        ));
    }
    if contract.host_dns_multidoc_config() {
        docs.push(doc(
            "ResolverConfig",
            json!({"hostDNS": {"enabled": true, "forwardKubeDNSToHost": true}}),
        ));
    }
    // `SysctlConfig` (MultidocSysctlConfigSupported) only when sysctls are given; talboot's
    // base has none, patches' `.machine.sysctls` are translated into it.
    if contract.filesystem_trim_enabled_by_default() {
        docs.push(doc(
            "VolumeConfig",
            json!({"name": "EPHEMERAL", "mount": {"secure": true}}),
        ));
        docs.push(doc(
            "FilesystemTrimConfig",
            json!({"interval": TRIM_INTERVAL}),
        ));
    }
    if contract.workload_isolation_enabled_by_default() {
        docs.push(doc(
            "SecurityProfileConfig",
            json!({"workloadIsolation": true}),
        ));
    }
    docs.push(doc("HostnameConfig", json!({"auto": "stable"})));

    if contract.multidoc_kubernetes_config_supported() {
        docs.extend(kubernetes_universal(inv, secrets, cp, &endpoint_url));
        if cp {
            docs.extend(kubernetes_controlplane(inv, secrets, &endpoint_url));
        }
    }
    Ok(ConfigBundle::new(docs.into_iter().map(yaml).collect()))
}

/// The v1alpha1 document, which under the v1.14 contract keeps only what has no document of
/// its own (`init.go`, `worker.go`: every other field is `nilIf(<switch>, ...)`).
fn v1alpha1_document(secrets: &SecretsBundle, machine_type: MachineType) -> Json {
    let cp = machine_type == MachineType::ControlPlane;
    let mut cluster = json!({"token": secrets.bootstrap_token()});
    if cp {
        cluster["etcd"] = json!({"ca": cert_and_key(secrets.etcd_ca(), true)});
    }
    json!({
        "version": "v1alpha1",
        "debug": false,
        "persist": true,
        "machine": {
            "type": machine_type.as_str(),
            "token": secrets.trustd_token(),
            "ca": cert_and_key(secrets.os_ca(), cp),
            "certSANs": [],
            "features": {"diskQuotaSupport": true}
        },
        "cluster": cluster,
    })
}

/// `generateKubernetesUniversalConfigs` (`generate/kubernetes.go`).
fn kubernetes_universal(
    inv: &Inventory,
    secrets: &SecretsBundle,
    cp: bool,
    endpoint_url: &str,
) -> Vec<Json> {
    let c = &inv.cluster;
    let k8s = &c.kubernetes_version.value;
    let mut node = json!({"nodeIP": {}});
    if cp {
        node["labels"] = json!({LABEL_CONTROL_PLANE: "", LABEL_EXCLUDE_LB: ""});
        if !c.allow_scheduling_on_control_planes {
            node["taints"] = json!({LABEL_CONTROL_PLANE: "NoSchedule"});
        }
    }
    let ca = if cp {
        json!({"issuingCA": pem_issuing(secrets.k8s_ca())})
    } else {
        json!({"acceptedCAs": [secrets.k8s_ca().crt]})
    };
    vec![
        doc(
            "KubeClusterConfig",
            json!({"clusterName": c.name.value, "endpoint": endpoint_url}),
        ),
        doc("KubeNodeConfig", node),
        doc(
            "KubeletConfig",
            json!({
                "image": format!("ghcr.io/siderolabs/kubelet:{k8s}"),
                "config": {},
                "defaultRuntimeSeccompProfileEnabled": true
            }),
        ),
        doc(
            "KubeNetworkConfig",
            json!({
                "dnsDomain": c.dns_domain,
                "podSubnets": c.pod_subnets.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "serviceSubnets": c.service_subnets.iter().map(ToString::to_string).collect::<Vec<_>>(),
            }),
        ),
        doc("KubeAPIServerCAConfig", ca),
        doc("KubePrismConfig", json!({"port": KUBEPRISM_PORT})),
    ]
}

/// `generateKubernetesControlplaneConfigs` (`generate/kubernetes.go`), with the defaults of
/// `pkg/machinery/config/types/k8s/{admission_control,audit_policy,authentication,
/// authorization}.go`.
fn kubernetes_controlplane(
    inv: &Inventory,
    secrets: &SecretsBundle,
    endpoint_url: &str,
) -> Vec<Json> {
    let c = &inv.cluster;
    let k8s = &c.kubernetes_version.value;
    let admission = super::admission_control();
    let plugin = &admission[0];
    let provider = encryption_provider(secrets);
    let mut proxy = json!({
        "image": format!("registry.k8s.io/kube-proxy:{k8s}"),
        "config": {}
    });
    let cilium = cilium(inv);
    if cilium == Some(true) {
        // KubeProxyConfig `enabled` (types/k8s/proxy.go): Cilium replaces kube-proxy.
        proxy = json!({"enabled": false, "image": proxy["image"].clone(), "config": {}});
    }
    let mut out = vec![
        doc(
            "KubeAggregatorCAConfig",
            json!({"issuingCA": pem_issuing(secrets.k8s_aggregator_ca())}),
        ),
        doc(
            "KubeAdmissionControlConfig",
            json!({"name": plugin["name"], "configuration": plugin["configuration"]}),
        ),
    ];
    out.extend(kube_auth_defaults());
    out.extend([
        doc(
            "KubeEtcdEncryptionConfig",
            json!({"config": {"resources": [{"providers": [provider], "resources": ["secrets"]}]}}),
        ),
        doc(
            "KubeServiceAccountConfig",
            json!({"issuer": {
                "privateKey": secrets.k8s_service_account_key(),
                "issuerURL": endpoint_url
            }}),
        ),
        doc(
            "KubeAPIServerConfig",
            json!({"image": format!("registry.k8s.io/kube-apiserver:{k8s}")}),
        ),
        doc(
            "KubeControllerManagerConfig",
            json!({"image": format!("registry.k8s.io/kube-controller-manager:{k8s}")}),
        ),
        doc(
            "KubeSchedulerConfig",
            json!({"image": format!("registry.k8s.io/kube-scheduler:{k8s}"), "config": {}}),
        ),
        doc("KubeProxyConfig", proxy),
    ]);
    // No KubeFlannelCNIConfig means no CNI (`controllers/k8s/control_plane.go`: CNIName
    // `none` without the document); that is what Cilium or an external CNI needs.
    if cilium.is_none() && !c.external_cni {
        out.push(doc(
            "KubeFlannelCNIConfig",
            json!({"backendType": "vxlan", "backendPort": 4789}),
        ));
    }
    out.push(doc("KubeCoreDNSConfig", json!({"enabled": true})));
    out
}

/// The audit policy, authentication and authorizer documents with the defaults of
/// `pkg/machinery/config/types/k8s/{audit_policy,authentication,authorization}.go`.
fn kube_auth_defaults() -> [Json; 4] {
    [
        doc(
            "KubeAuditPolicyConfig",
            json!({"configuration": {
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "rules": [{"level": "Metadata"}]
            }}),
        ),
        doc(
            "KubeAuthenticationConfig",
            json!({"configuration": {
                "anonymous": {
                    "conditions": [{"path": "/livez"}, {"path": "/readyz"}, {"path": "/healthz"}],
                    "enabled": true
                },
                "jwt": []
            }}),
        ),
        doc(
            "KubeAuthorizerConfig",
            json!({"name": "node", "type": "Node"}),
        ),
        doc(
            "KubeAuthorizerConfig",
            json!({"name": "rbac", "type": "RBAC"}),
        ),
    ]
}

/// The etcd encryption provider, with the provider names and order of the legacy
/// kube-apiserver template (`k8stemplates/apiserver.go`: secretbox `key2`, aescbc `key1`), so
/// existing secrets still decrypt. rc.1's generator writes an old AES-CBC secret as a second
/// *secretbox* provider, which would not decrypt what the template encrypted; talboot keeps
/// the template's form.
fn encryption_provider(secrets: &SecretsBundle) -> Json {
    match secrets.encryption_secret() {
        EncryptionSecret::Secretbox(s) => {
            json!({"secretbox": {"keys": [{"name": "key2", "secret": s}]}})
        }
        EncryptionSecret::AesCbc(s) => json!({"aescbc": {"keys": [{"name": "key1", "secret": s}]}}),
    }
}

/// The generated per-node patch in v1.14 documents: the same facts as the v1.13 node patch
/// (hostname, addresses, resolvers, NTP, VIP), with the install target in
/// `UnattendedInstallConfig` and labels and taints in `KubeNodeConfig`.
///
/// Taints go to `KubeNodeConfig.taints` on every node: v1.14's kubelet registers with them
/// (`controllers/k8s/kubelet_config.go`: `RegisterWithTaints = K8sNodeConfig().Taints()`), so
/// a worker gets them at registration, which NodeRestriction allows.
pub(super) fn node_patch(inv: &Inventory, node: &Node) -> Result<PatchBody, RenderError> {
    let role = inv.role_of(node);
    let cp = role.machine_type == MachineType::ControlPlane;

    let mut docs = vec![unattended_install(inv, node)?];
    docs.extend(storage_documents(&node.storage));
    if let Some(kn) = kube_node_config(inv, node) {
        docs.push(kn);
    }

    docs.push(doc(
        "HostnameConfig",
        json!({"auto": "off", "hostname": node.name.value}),
    ));
    let boot_mac = node.macs[0].value.to_string();
    docs.push(link_alias(BOOT_LINK, &boot_mac));
    let mut link = doc(
        "LinkConfig",
        json!({
            "name": BOOT_LINK,
            "up": true,
            "addresses": [{"address": node.address.value.to_string()}],
        }),
    );
    if let Some(gw) = gateway(inv, node)? {
        link["routes"] = json!([{"gateway": gw.to_string()}]);
    }
    docs.push(link);
    for (i, extra) in node.interfaces.iter().enumerate() {
        let alias = format!("net{}", i + 1);
        docs.push(link_alias(&alias, &extra.mac.value.to_string()));
        let mut link = doc(
            "LinkConfig",
            json!({
                "name": alias,
                "up": true,
                "addresses": extra
                    .addresses
                    .iter()
                    .map(|a| json!({"address": a.value.to_string()}))
                    .collect::<Vec<_>>(),
            }),
        );
        if let Some(mtu) = extra.mtu {
            link["mtu"] = json!(mtu);
        }
        docs.push(link);
    }
    let dns = nameservers(inv, node);
    if !dns.is_empty() {
        docs.push(doc(
            "ResolverConfig",
            json!({"nameservers": dns.iter().map(|a| json!({"address": a.to_string()})).collect::<Vec<_>>()}),
        ));
    }
    if let Some(t) = time_sync(inv) {
        docs.push(t);
    }
    if cp && let Some(vip) = &inv.cluster.vip {
        docs.push(doc(
            "Layer2VIPConfig",
            json!({"name": vip.value.to_string(), "link": BOOT_LINK}),
        ));
    }
    Ok(PatchBody::Merge(docs.into_iter().map(yaml).collect()))
}

/// The node's `UnattendedInstallConfig`: its install disk as the CEL expression Talos
/// evaluates (`installDisk` as gen config writes it, a legacy selector as
/// `DiskMatchExpression` writes it, an operator's own `match` as written).
fn unattended_install(inv: &Inventory, node: &Node) -> Result<Json, RenderError> {
    let matcher = match &node.install {
        InstallTarget::Disk(d) => install_disk_expression(d),
        // The operator's own expression, checked when the inventory loaded, goes as written.
        InstallTarget::Selector(DiskSelector { expr: Some(e), .. }) => e.value.clone(),
        InstallTarget::Selector(s) => {
            selector_expression(&LegacySelector::from(s)).map_err(|e| RenderError::Selector {
                node: node.name.value.clone(),
                source: e,
            })?
        }
    };
    Ok(doc(
        "UnattendedInstallConfig",
        json!({
            "installer": {"image": super::node_installer_image(inv, node)},
            "provisioning": {"diskSelector": {"match": matcher}}
        }),
    ))
}

/// The node's RAID install array (`RAIDArrayConfig`, the shape of Talos's RAID-boot CI patch
/// `hack/test/patches/md-boot-array.yaml`) and its dedicated system volumes (`VolumeConfig`
/// with provisioning, as `hack/test/patches/dedicated-system-volumes-*.yaml`). `metadata`
/// is written although 1.0 is Talos's default, so the reader sees the boot requirement.
fn storage_documents(storage: &crate::inventory::Storage) -> Vec<Json> {
    let mut docs = Vec::new();
    if let Some(raid) = &storage.raid {
        docs.push(doc(
            "RAIDArrayConfig",
            json!({
                "name": raid.name.value,
                "level": "raid1",
                "metadata": "1.0",
                "provisioning": {"volumeSelector": {"match": raid.volume_match()}}
            }),
        ));
    }
    for v in &storage.volumes {
        let mut provisioning = serde_json::Map::new();
        if let Some(sel) = &v.selector {
            provisioning.insert("diskSelector".into(), json!({"match": sel.value}));
        }
        if let Some(grow) = v.grow {
            provisioning.insert("grow".into(), json!(grow));
        }
        if let Some(min) = &v.min_size {
            provisioning.insert("minSize".into(), json!(min));
        }
        provisioning.insert("maxSize".into(), json!(v.max_size));
        docs.push(doc(
            "VolumeConfig",
            json!({"name": v.name.as_str(), "provisioning": provisioning}),
        ));
    }
    docs
}

/// The node's labels and taints as a `KubeNodeConfig` (taints as `value:effect` or
/// `effect`), or nothing when it has neither.
fn kube_node_config(inv: &Inventory, node: &Node) -> Option<Json> {
    let labels = labels(inv, node);
    let taints = taints(inv, node);
    if labels.is_empty() && taints.is_empty() {
        return None;
    }
    let mut kn = json!({});
    if !labels.is_empty() {
        kn["labels"] = json!(labels);
    }
    if !taints.is_empty() {
        kn["taints"] = super::node_taints(&taints);
    }
    Some(doc("KubeNodeConfig", kn))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use yaml_serde::Value;

    use crate::inventory::{
        self, DiskSelector, InstallTarget, Inventory, Loc, RaidInstall, Spanned, Storage,
        SystemVolume, SystemVolumeName,
    };
    use crate::machineconfig::render::render_node;
    use crate::talosfacts::contract::Contract;

    /// The lab at v1.14.0, its first control plane installing onto a two-disk RAID1 array
    /// with ETCD and LOG on partitions of their own.
    fn lab_with_storage() -> Inventory {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
        let mut inv = inventory::load_with_env(&file, &BTreeMap::new())
            .unwrap()
            .inventory;
        inv.cluster.talos_version.value = "v1.14.0".parse().unwrap();
        let loc = Loc::file_only(&file);
        let at = |s: &str| Spanned::new(s.to_owned(), loc.clone());
        let raid = RaidInstall {
            name: at("boot"),
            members: vec![at("disk.serial == \"S1\""), at("disk.serial == \"S2\"")],
        };
        let node = &mut inv.nodes[0];
        node.install = InstallTarget::Selector(DiskSelector {
            expr: Some(at(&raid.install_match())),
            ..DiskSelector::default()
        });
        node.storage = Storage {
            raid: Some(raid),
            volumes: vec![
                SystemVolume {
                    name: SystemVolumeName::Etcd,
                    selector: None,
                    min_size: Some("1GB".into()),
                    max_size: "2GB".into(),
                    grow: None,
                    loc: loc.clone(),
                },
                SystemVolume {
                    name: SystemVolumeName::Log,
                    selector: Some(at("disk.serial == \"S3\"")),
                    min_size: None,
                    max_size: "1GB".into(),
                    grow: Some(false),
                    loc,
                },
            ],
        };
        inv
    }

    fn yaml(text: &str) -> Value {
        yaml_serde::from_str(text).unwrap()
    }

    /// The documents are exactly Talos's RAID-boot CI patch (`md-boot-array.yaml`, with
    /// talboot's members) and the dedicated-volume patches' shape, and pass v1.14's schema.
    #[test]
    fn raid_install_and_system_volumes_render_in_talos_shapes_and_pass_the_schema() {
        let inv = lab_with_storage();
        let secrets = super::super::tests::fixture_secrets();
        let node = &inv.nodes[0];
        let b = render_node(&inv, &secrets, node).unwrap();
        assert_eq!(
            b.typed("RAIDArrayConfig", Some("boot")).unwrap(),
            &yaml(
                "apiVersion: v1alpha1\nkind: RAIDArrayConfig\nname: boot\nlevel: raid1\n\
                 metadata: \"1.0\"\nprovisioning:\n  volumeSelector:\n    \
                 match: (disk.serial == \"S1\") || (disk.serial == \"S2\")\n"
            )
        );
        let install = b.typed("UnattendedInstallConfig", None).unwrap();
        assert_eq!(
            install["provisioning"]["diskSelector"]["match"],
            Value::from("\"/dev/disk/by-id/md-name-talos:boot\" in disk.symlinks")
        );
        assert_eq!(install["provisioning"]["wipe"], Value::from(false));
        assert_eq!(
            b.typed("VolumeConfig", Some("ETCD")).unwrap(),
            &yaml(
                "apiVersion: v1alpha1\nkind: VolumeConfig\nname: ETCD\n\
                 provisioning: {minSize: 1GB, maxSize: 2GB}\n"
            )
        );
        assert_eq!(
            b.typed("VolumeConfig", Some("LOG")).unwrap(),
            &yaml(
                "apiVersion: v1alpha1\nkind: VolumeConfig\nname: LOG\nprovisioning:\n  \
                 diskSelector: {match: disk.serial == \"S3\"}\n  grow: false\n  maxSize: 1GB\n"
            )
        );
        // gen config's EPHEMERAL document stays.
        assert!(b.typed("VolumeConfig", Some("EPHEMERAL")).is_some());
        let report = crate::machineconfig::schema::embedded_for(Contract::V1_14)
            .validate(&node.name.value, &b);
        assert_eq!(report.violations, vec![]);
        assert_eq!(report.deprecated, vec![]);
        // A node without storage gets none of these documents.
        let other = render_node(&inv, &secrets, &inv.nodes[1]).unwrap();
        assert!(other.typed("RAIDArrayConfig", Some("boot")).is_none());
        assert!(other.typed("VolumeConfig", Some("ETCD")).is_none());
    }
}
