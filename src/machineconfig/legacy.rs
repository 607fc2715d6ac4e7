//! Legacy v1alpha1 fields under the v1.14 contract: translating them into their v1.14
//! documents, and the mutual exclusions Talos enforces between a legacy field and its document.
//!
//! Talos v1.14 still accepts the v1.13 fields, but refuses a config that sets one next to the
//! document that replaced it: every new document implements `V1Alpha1ConflictValidate`
//! (siderolabs/talos v1.14.0-rc.1 `pkg/machinery/config/types/*`, run by
//! `pkg/machinery/config/container/validate.go` whenever a v1alpha1 document exists). talboot
//! renders those documents for a v1.14 cluster, so an operator's patch written for v1.13 would
//! be refused. [`translate`] moves each legacy field with a v1.14 home into that document
//! (after each patch, so later patches still win); what has no home stays, and if it sits under
//! a field that conflicts with a rendered document, [`conflicts`] names it with the fix.
//! The tables both act on ([`CONFLICTS`], the upstream one, and which fields move where) are
//! [`crate::talosfacts::legacy`], which the inventory checker also reads.

use serde_json::{Map, Value as Json, json};

use super::contract::{LegacySelector, SelectorError, install_disk_expression};
use super::patch::{self, ConfigBundle, PatchError};
use crate::inventory::PatchBody;
use crate::talosfacts::contract::Contract;
use crate::talosfacts::legacy::CONFLICTS;

/// Why a legacy field could not be translated.
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    /// A legacy install disk selector Talos cannot express.
    #[error("machine.install.diskSelector: {0}")]
    Selector(#[from] SelectorError),
    /// A legacy field has a shape Talos would not accept either.
    #[error("{field}: {problem}")]
    Shape {
        /// Dotted path.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// Merging the translated documents failed.
    #[error("merging the translated documents: {0}")]
    Merge(#[from] PatchError),
}

/// True for a value Talos treats as unset (absent, null, empty text).
fn is_set(v: Option<&Json>) -> bool {
    match v {
        None | Some(Json::Null) => false,
        Some(Json::String(s)) => !s.is_empty(),
        Some(Json::Bool(b)) => *b,
        Some(_) => true,
    }
}

fn get<'a>(doc: &'a Json, path: &[&str]) -> Option<&'a Json> {
    path.iter().try_fold(doc, |v, k| v.get(*k))
}

/// Removes and returns `path`; then drops parents the removal left empty (an empty
/// `machine.kubelet: {}` is still "set" for Talos's conflict checks).
fn take(doc: &mut Json, path: &[&str]) -> Option<Json> {
    let (last, parents) = path.split_last()?;
    let mut cur = &mut *doc;
    for p in parents {
        cur = cur.get_mut(*p)?;
    }
    let out = cur.as_object_mut()?.remove(*last)?;
    for depth in (1..path.len()).rev() {
        let parent = &path[..depth];
        let empty = get(doc, parent).is_some_and(|v| v.as_object().is_some_and(Map::is_empty));
        if !empty || parent.len() == 1 {
            break;
        }
        let (k, pp) = parent.split_last().expect("non-empty");
        let mut cur = &mut *doc;
        for p in pp {
            cur = cur.get_mut(*p).expect("walked above");
        }
        cur.as_object_mut().expect("walked above").remove(*k);
    }
    Some(out)
}

fn doc(kind: &str, body: Json) -> Json {
    let mut out = json!({"apiVersion": "v1alpha1", "kind": kind});
    if let Json::Object(fields) = body {
        out.as_object_mut().expect("object").extend(fields);
    }
    out
}

fn text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Number(n) => Some(n.to_string()),
        Json::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Moves every [`TRANSLATED`](crate::talosfacts::legacy::TRANSLATED) field of the v1alpha1 document into its v1.14 document,
/// merging into what is there (strategic merge, as a patch would). Returns the dotted fields
/// moved. A no-op for a bundle without those fields.
pub(crate) fn translate(bundle: &mut ConfigBundle) -> Result<Vec<String>, TranslateError> {
    let Some(idx) = bundle
        .docs
        .iter()
        .position(|d| d.get("kind").is_none() && d.as_mapping().is_some())
    else {
        return Ok(Vec::new());
    };
    let main: Json =
        serde_json::to_value(&bundle.docs[idx]).map_err(|e| TranslateError::Shape {
            field: String::new(),
            problem: e.to_string(),
        })?;
    let mut t = Translation {
        main,
        moved: Vec::new(),
        docs: Vec::new(),
        remove: Vec::new(),
        untaint_control_plane: false,
    };
    unattended_install(&mut t)?;
    kubelet(&mut t);
    kernel(&mut t);
    features(&mut t);
    kube_network(&mut t);
    kube_cluster(&mut t);
    api_server(&mut t);
    components(&mut t);
    apply(bundle, idx, t)
}

/// The translation under way: the v1alpha1 document being emptied, the dotted fields moved
/// out of it, and the documents they went to.
struct Translation {
    main: Json,
    moved: Vec<String>,
    docs: Vec<Json>,
    /// (kind, name) documents to remove.
    remove: Vec<(&'static str, Option<&'static str>)>,
    /// Whether the control-plane taint comes off (`allowSchedulingOnControlPlanes: true`).
    untaint_control_plane: bool,
}

impl Translation {
    /// Takes `path` out of the v1alpha1 document, noting it as moved when it was there.
    fn mv(&mut self, path: &[&str]) -> Option<Json> {
        let v = take(&mut self.main, path);
        if v.is_some() {
            self.moved.push(path.join("."));
        }
        v
    }
}

/// `machine.install` into UnattendedInstallConfig.
fn unattended_install(t: &mut Translation) -> Result<(), TranslateError> {
    // UnattendedInstallConfig (runtime/unattended_install.go): disk -> CEL, image, wipe.
    // grubUseUKICmdline is dropped: with the document the installer forces it on
    // (cmd/installer/cmd/installer/install.go).
    let mut ui = json!({});
    if let Some(sel) = t.mv(&["machine", "install", "diskSelector"]) {
        let field = |k: &str| sel.get(k).and_then(text);
        let legacy = LegacySelector {
            size: field("size"),
            name: field("name"),
            model: field("model"),
            serial: field("serial"),
            modalias: field("modalias"),
            uuid: field("uuid"),
            wwid: field("wwid"),
            disk_type: field("type"),
            bus_path: field("busPath"),
        };
        ui["provisioning"] =
            json!({"diskSelector": {"match": super::contract::selector_expression(&legacy)?}});
        t.mv(&["machine", "install", "disk"]);
    } else if let Some(disk) = t.mv(&["machine", "install", "disk"]) {
        let disk = text(&disk).ok_or_else(|| TranslateError::Shape {
            field: "machine.install.disk".into(),
            problem: "is not a path".into(),
        })?;
        ui["provisioning"] = json!({"diskSelector": {"match": install_disk_expression(&disk)}});
    }
    if let Some(image) = t.mv(&["machine", "install", "image"]) {
        ui["installer"] = json!({"image": image});
    }
    if let Some(wipe) = t.mv(&["machine", "install", "wipe"]) {
        if ui.get("provisioning").is_none() {
            ui["provisioning"] = json!({});
        }
        ui["provisioning"]["wipe"] = wipe;
    }
    t.mv(&["machine", "install", "grubUseUKICmdline"]);
    if ui.as_object().is_some_and(|o| !o.is_empty()) {
        t.docs.push(doc("UnattendedInstallConfig", ui));
    }
    Ok(())
}

/// `machine.kubelet`, the node labels, annotations and taints, and the scheduling switch
/// into KubeletConfig and KubeNodeConfig.
fn kubelet(t: &mut Translation) {
    // KubeletConfig / KubeNodeConfig (k8s/kubelet.go, k8s/node.go).
    let mut kubelet = json!({});
    for (from, to) in [
        ("image", "image"),
        ("extraArgs", "extraArgs"),
        ("extraConfig", "config"),
        ("clusterDNS", "clusterDNS"),
        (
            "defaultRuntimeSeccompProfileEnabled",
            "defaultRuntimeSeccompProfileEnabled",
        ),
    ] {
        if let Some(v) = t.mv(&["machine", "kubelet", from]) {
            kubelet[to] = v;
        }
    }
    // KubeletConfigV1Alpha1.DisableManifestsDirectory() is always true; only `true` moves.
    if get(
        &t.main,
        &["machine", "kubelet", "disableManifestsDirectory"],
    ) == Some(&Json::Bool(true))
    {
        t.mv(&["machine", "kubelet", "disableManifestsDirectory"]);
    }
    if kubelet.as_object().is_some_and(|o| !o.is_empty()) {
        t.docs.push(doc("KubeletConfig", kubelet));
    }
    let mut node = json!({});
    for (path, to) in [
        (&["machine", "kubelet", "nodeIP"][..], "nodeIP"),
        (
            &["machine", "kubelet", "skipNodeRegistration"][..],
            "skipNodeRegistration",
        ),
        (
            &["machine", "kubelet", "registerWithFQDN"][..],
            "registerWithFQDN",
        ),
        (&["machine", "nodeLabels"][..], "labels"),
        (&["machine", "nodeAnnotations"][..], "annotations"),
        (&["machine", "nodeTaints"][..], "taints"),
    ] {
        if let Some(v) = t.mv(path) {
            node[to] = v;
        }
    }
    for key in ["allowSchedulingOnControlPlanes", "allowSchedulingOnMasters"] {
        if let Some(v) = t.mv(&["cluster", key]) {
            t.untaint_control_plane |= v == Json::Bool(true);
        }
    }
    if node.as_object().is_some_and(|o| !o.is_empty()) {
        t.docs.push(doc("KubeNodeConfig", node));
    }
}

/// `machine.sysctls`, `machine.sysfs` and `machine.kernel.modules` into their documents.
fn kernel(t: &mut Translation) {
    // SysctlConfig / SysfsConfig / KernelModuleConfig (runtime/*.go).
    if let Some(v) = t.mv(&["machine", "sysctls"]) {
        t.docs.push(doc("SysctlConfig", json!({"params": v})));
    }
    if let Some(v) = t.mv(&["machine", "sysfs"]) {
        t.docs.push(doc("SysfsConfig", json!({"params": v})));
    }
    if let Some(Json::Array(mods)) = t.mv(&["machine", "kernel", "modules"]) {
        for m in mods {
            let mut d = json!({"name": m.get("name").cloned().unwrap_or(Json::Null)});
            if let Some(p) = m.get("parameters") {
                d["parameters"] = p.clone();
            }
            t.docs.push(doc("KernelModuleConfig", d));
        }
    }
}

/// `machine.features.kubePrism` and `.hostDNS` into their documents.
fn features(t: &mut Translation) {
    // KubePrismConfig (k8s/kubeprism.go), ResolverConfig.hostDNS (network/resolver.go).
    if let Some(kp) = t.mv(&["machine", "features", "kubePrism"]) {
        if kp.get("enabled") == Some(&Json::Bool(false)) {
            t.remove.push(("KubePrismConfig", None));
        } else if let Some(port) = kp.get("port") {
            t.docs.push(doc("KubePrismConfig", json!({"port": port})));
        }
    }
    if let Some(h) = t.mv(&["machine", "features", "hostDNS"]) {
        t.docs.push(doc("ResolverConfig", json!({"hostDNS": h})));
    }
}

/// `cluster.network` into KubeNetworkConfig and the CNI documents.
fn kube_network(t: &mut Translation) {
    // KubeNetworkConfig / KubeFlannelCNIConfig / KubeExternalManifestConfig (k8s/network.go,
    // flannel.go; no KubeFlannelCNIConfig = no CNI, controllers/k8s/control_plane.go).
    let mut net = json!({});
    for k in ["dnsDomain", "podSubnets", "serviceSubnets"] {
        if let Some(v) = t.mv(&["cluster", "network", k]) {
            net[k] = v;
        }
    }
    if net.as_object().is_some_and(|o| !o.is_empty()) {
        t.docs.push(doc("KubeNetworkConfig", net));
    }
    if let Some(cni) = t.mv(&["cluster", "network", "cni"]) {
        match cni.get("name").and_then(Json::as_str) {
            Some("none") => t.remove.push(("KubeFlannelCNIConfig", None)),
            Some("custom") => {
                t.remove.push(("KubeFlannelCNIConfig", None));
                let urls = cni
                    .get("urls")
                    .and_then(Json::as_array)
                    .cloned()
                    .unwrap_or_default();
                for (i, url) in urls.into_iter().enumerate() {
                    let name = if i == 0 {
                        "custom-cni".to_owned()
                    } else {
                        format!("custom-cni-{i}")
                    };
                    t.docs.push(doc(
                        "KubeExternalManifestConfig",
                        json!({"name": name, "url": url}),
                    ));
                }
            }
            _ => {
                let mut f = json!({});
                if let Some(fl) = cni.get("flannel") {
                    for k in ["extraArgs", "kubeNetworkPoliciesEnabled"] {
                        if let Some(v) = fl.get(k) {
                            f[k] = v.clone();
                        }
                    }
                }
                t.docs.push(doc("KubeFlannelCNIConfig", f));
            }
        }
    }
}

/// The cluster's name, endpoint, API port, identity and discovery into their documents.
fn kube_cluster(t: &mut Translation) {
    // KubeClusterConfig (k8s/cluster.go), DiscoveryIdentityConfig, DiscoveryServiceConfig.
    let mut kc = json!({});
    if let Some(v) = t.mv(&["cluster", "clusterName"]) {
        kc["clusterName"] = v;
    }
    if let Some(v) = t.mv(&["cluster", "controlPlane", "endpoint"]) {
        kc["endpoint"] = v;
    }
    if kc.as_object().is_some_and(|o| !o.is_empty()) {
        t.docs.push(doc("KubeClusterConfig", kc));
    }
    if let Some(v) = t.mv(&["cluster", "controlPlane", "localAPIServerPort"]) {
        t.docs
            .push(doc("KubeAPIServerConfig", json!({"apiPort": v})));
    }
    let mut id = json!({});
    if let Some(v) = t.mv(&["cluster", "id"]) {
        id["clusterID"] = v;
    }
    if let Some(v) = t.mv(&["cluster", "secret"]) {
        id["clusterSecret"] = v;
    }
    if id.as_object().is_some_and(|o| !o.is_empty()) {
        t.docs.push(doc("DiscoveryIdentityConfig", id));
    }
    let enabled = t.mv(&["cluster", "discovery", "enabled"]);
    let service = t.mv(&["cluster", "discovery", "registries", "service"]);
    // v1.14 has no Kubernetes registry document; gen config always disabled it.
    t.mv(&["cluster", "discovery", "registries", "kubernetes"]);
    let service_off = service
        .as_ref()
        .and_then(|s| s.get("disabled"))
        .is_some_and(|d| d == &Json::Bool(true));
    if enabled == Some(Json::Bool(false)) || service_off {
        t.remove.push(("DiscoveryServiceConfig", Some("default")));
    } else if let Some(ep) = service.as_ref().and_then(|s| s.get("endpoint")) {
        t.docs.push(doc(
            "DiscoveryServiceConfig",
            json!({"name": "default", "endpoint": ep}),
        ));
    }
}

/// `cluster.apiServer` into KubeAPIServerConfig, KubeAdmissionControlConfig and
/// KubeAuditPolicyConfig.
fn api_server(t: &mut Translation) {
    // Control-plane components (k8s/apiserver.go, admission_control.go, audit_policy.go,
    // controller_manager.go, scheduler.go, proxy.go, coredns.go).
    let mut api = json!({});
    for (from, to) in [
        ("image", "image"),
        ("extraArgs", "extraArgs"),
        ("env", "env"),
        ("resources", "resources"),
        ("certSANs", "certExtraSANs"),
    ] {
        if let Some(v) = t.mv(&["cluster", "apiServer", from]) {
            api[to] = v;
        }
    }
    // Hidden since v1.12 (HideDisablePSP); Kubernetes has no PSP any more.
    t.mv(&["cluster", "apiServer", "disablePodSecurityPolicy"]);
    if api.as_object().is_some_and(|o| !o.is_empty()) {
        t.docs.push(doc("KubeAPIServerConfig", api));
    }
    if let Some(Json::Array(plugins)) = t.mv(&["cluster", "apiServer", "admissionControl"]) {
        for p in plugins {
            t.docs.push(doc(
                "KubeAdmissionControlConfig",
                json!({"name": p.get("name").cloned().unwrap_or(Json::Null),
                       "configuration": p.get("configuration").cloned().unwrap_or(json!({}))}),
            ));
        }
    }
    if let Some(v) = t.mv(&["cluster", "apiServer", "auditPolicy"]) {
        t.docs
            .push(doc("KubeAuditPolicyConfig", json!({"configuration": v})));
    }
}

/// The other control-plane components and the proxy and CoreDNS into their documents.
fn components(t: &mut Translation) {
    for (section, kind, keys) in [
        (
            "controllerManager",
            "KubeControllerManagerConfig",
            &["image", "extraArgs", "env", "resources"][..],
        ),
        (
            "scheduler",
            "KubeSchedulerConfig",
            &["image", "extraArgs", "env", "resources", "config"][..],
        ),
        (
            "proxy",
            "KubeProxyConfig",
            &["image", "mode", "extraArgs"][..],
        ),
        ("coreDNS", "KubeCoreDNSConfig", &["image"][..]),
    ] {
        let mut d = json!({});
        for k in keys {
            if let Some(v) = t.mv(&["cluster", section, k]) {
                d[*k] = v;
            }
        }
        if let Some(v) = t.mv(&["cluster", section, "disabled"]) {
            d["enabled"] = Json::Bool(v != Json::Bool(true));
        }
        if d.as_object().is_some_and(|o| !o.is_empty()) {
            t.docs.push(doc(kind, d));
        }
    }
}

/// Writes the emptied v1alpha1 document back, merges the translated documents in, removes
/// the documents the legacy fields switched off, and takes the control-plane taint off.
fn apply(
    bundle: &mut ConfigBundle,
    idx: usize,
    t: Translation,
) -> Result<Vec<String>, TranslateError> {
    let Translation {
        main,
        moved,
        docs,
        remove,
        untaint_control_plane,
    } = t;
    if moved.is_empty() {
        return Ok(moved);
    }
    bundle.docs[idx] = yaml_serde::to_value(&main).expect("JSON converts to YAML");
    // A translated document merges into the rendered one; a fresh one is added.
    if !docs.is_empty() {
        let body = PatchBody::Merge(
            docs.into_iter()
                .map(|d| yaml_serde::to_value(d).expect("JSON converts to YAML"))
                .collect(),
        );
        patch::apply(bundle, &body)?;
    }
    for (kind, name) in remove {
        bundle.docs.retain(|d| {
            !(d.get("kind").and_then(|k| k.as_str()) == Some(kind)
                && (name.is_none() || d.get("name").and_then(|n| n.as_str()) == name))
        });
    }
    if untaint_control_plane {
        for d in &mut bundle.docs {
            if d.get("kind").and_then(|k| k.as_str()) == Some("KubeNodeConfig")
                && let Some(yaml_serde::Value::Mapping(t)) = d.get_mut("taints")
            {
                t.remove(super::render::LABEL_CONTROL_PLANE);
                if t.is_empty() {
                    d.as_mapping_mut().expect("a mapping").remove("taints");
                }
            }
        }
    }
    Ok(moved)
}

/// A legacy field set next to its document in a rendered bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// The conflict rule.
    pub kind: &'static str,
    /// Dotted v1alpha1 path.
    pub field: String,
    /// Upstream file.
    pub source: &'static str,
}

/// Every [`CONFLICTS`] rule of `contract` the bundle breaks.
pub(crate) fn conflicts(contract: Contract, bundle: &ConfigBundle) -> Vec<Found> {
    let Some(main) = bundle.v1alpha1().and_then(|v| serde_json::to_value(v).ok()) else {
        return Vec::new();
    };
    let kinds: Vec<&str> = bundle
        .docs
        .iter()
        .filter_map(|d| d.get("kind").and_then(|k| k.as_str()))
        .collect();
    CONFLICTS
        .iter()
        .filter(|c| c.since <= contract && kinds.contains(&c.kind))
        .filter(|c| {
            let v = get(&main, c.path);
            match v {
                // A mapping Talos reads as a pointer: set once present, even empty.
                Some(Json::Object(_)) => true,
                other => is_set(other),
            }
        })
        .map(|c| Found {
            kind: c.kind,
            field: c.path.join("."),
            source: c.source,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(text: &str) -> ConfigBundle {
        ConfigBundle::parse(text).unwrap()
    }

    #[test]
    fn legacy_fields_move_into_their_documents_and_empty_parents_go() {
        let mut b = bundle(
            "version: v1alpha1\nmachine:\n  type: worker\n  kubelet:\n    extraArgs: {rotate-server-certificates: 'true'}\n    \
             extraConfig: {maxPods: 50}\n    nodeIP: {validSubnets: [10.0.0.0/8]}\n  \
             sysctls: {vm.max_map_count: '262144'}\n  nodeLabels: {pool: a}\n  \
             install: {disk: /dev/nvme0n1, image: x/y:z, grubUseUKICmdline: true}\n  \
             features: {diskQuotaSupport: true, kubePrism: {enabled: true, port: 7446}}\n\
             cluster:\n  network: {podSubnets: [10.1.0.0/16], cni: {name: none}}\n  proxy: {disabled: true}\n\
             ---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: k\nconfig: {}\n\
             ---\napiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\nbackendType: vxlan\n",
        );
        let moved = translate(&mut b).unwrap();
        assert!(moved.contains(&"machine.sysctls".to_owned()), "{moved:?}");
        let main = b.v1alpha1().unwrap();
        assert!(main["machine"].get("kubelet").is_none(), "{main:?}");
        assert!(main["machine"].get("install").is_none());
        assert!(main["machine"].get("sysctls").is_none());
        assert!(main["machine"]["features"].get("kubePrism").is_none());
        assert_eq!(
            main["machine"]["features"]["diskQuotaSupport"],
            yaml_serde::Value::Bool(true)
        );
        assert!(
            main.get("cluster")
                .is_none_or(|c| c.get("network").is_none())
        );
        let k = b.typed("KubeletConfig", None).unwrap();
        assert_eq!(k["image"].as_str(), Some("k"));
        assert_eq!(
            k["extraArgs"]["rotate-server-certificates"].as_str(),
            Some("true")
        );
        assert_eq!(k["config"]["maxPods"].as_u64(), Some(50));
        let n = b.typed("KubeNodeConfig", None).unwrap();
        assert_eq!(n["labels"]["pool"].as_str(), Some("a"));
        assert!(n["nodeIP"]["validSubnets"].is_sequence());
        assert_eq!(
            b.typed("SysctlConfig", None).unwrap()["params"]["vm.max_map_count"].as_str(),
            Some("262144")
        );
        let ui = b.typed("UnattendedInstallConfig", None).unwrap();
        assert_eq!(
            ui["provisioning"]["diskSelector"]["match"].as_str(),
            Some("disk.dev_path == \"/dev/nvme0n1\"")
        );
        assert_eq!(ui["installer"]["image"].as_str(), Some("x/y:z"));
        assert_eq!(
            b.typed("KubePrismConfig", None).unwrap()["port"].as_u64(),
            Some(7446)
        );
        assert!(
            b.typed("KubeFlannelCNIConfig", None).is_none(),
            "cni none drops flannel"
        );
        assert_eq!(
            b.typed("KubeProxyConfig", None).unwrap()["enabled"],
            yaml_serde::Value::Bool(false)
        );
        assert_eq!(
            b.typed("KubeNetworkConfig", None).unwrap()["podSubnets"][0].as_str(),
            Some("10.1.0.0/16")
        );
        assert!(
            conflicts(Contract::V1_14, &b).is_empty(),
            "{:?}",
            conflicts(Contract::V1_14, &b)
        );
        // Translating again changes nothing.
        assert!(translate(&mut b).unwrap().is_empty());
    }

    #[test]
    fn what_has_no_document_stays_and_is_reported_as_a_conflict() {
        let mut b = bundle(
            "version: v1alpha1\nmachine:\n  type: worker\n  kubelet:\n    image: a\n    extraMounts: [{destination: /x}]\n  \
             install: {extraKernelArgs: [a=b]}\n---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: k\n\
             ---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\nprovisioning: {diskSelector: {match: 'true'}}\n",
        );
        translate(&mut b).unwrap();
        let found = conflicts(Contract::V1_14, &b);
        let fields: Vec<&str> = found.iter().map(|f| f.field.as_str()).collect();
        assert!(fields.contains(&"machine.kubelet"), "{found:?}");
        assert!(fields.contains(&"machine.install"), "{found:?}");
        // v1.13 has none of these rules.
        assert!(conflicts(Contract::V1_13, &b).is_empty());
    }

    #[test]
    fn allow_scheduling_drops_the_control_plane_taint_and_selectors_become_cel() {
        let mut b = bundle(
            "version: v1alpha1\nmachine:\n  type: controlplane\n  install:\n    diskSelector: {type: ssd}\n\
             cluster:\n  allowSchedulingOnControlPlanes: true\n\
             ---\napiVersion: v1alpha1\nkind: KubeNodeConfig\ntaints: {node-role.kubernetes.io/control-plane: NoSchedule}\n",
        );
        translate(&mut b).unwrap();
        assert!(
            b.typed("KubeNodeConfig", None)
                .unwrap()
                .get("taints")
                .is_none()
        );
        assert_eq!(
            b.typed("UnattendedInstallConfig", None).unwrap()["provisioning"]["diskSelector"]["match"].as_str(),
            Some("disk.transport != \"\" && !disk.rotational && !disk.readonly && !disk.cdrom")
        );
    }
}
