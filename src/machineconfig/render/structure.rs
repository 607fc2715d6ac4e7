//! The structural checks on a rendered node config that need no schema: the install disk,
//! `machine.type`, legacy fields next to their documents, and what only control planes may
//! carry.

use yaml_serde::Value;

use super::super::legacy;
use super::super::patch::ConfigBundle;
use super::{StructuralError, lookup};
use crate::inventory::MachineType;
use crate::talosfacts::contract::Contract;

/// Fields of the v1alpha1 document only control planes may carry (they hold control-plane
/// secrets or configure control-plane components).
const CONTROL_PLANE_ONLY: &[&[&str]] = &[
    &["cluster", "aggregatorCA"],
    &["cluster", "serviceAccount"],
    &["cluster", "secretboxEncryptionSecret"],
    &["cluster", "aescbcEncryptionSecret"],
    &["cluster", "apiServer"],
    &["cluster", "controllerManager"],
    &["cluster", "scheduler"],
    &["cluster", "proxy"],
    &["cluster", "etcd"],
    &["cluster", "coreDNS"],
    &["cluster", "inlineManifests"],
    &["cluster", "extraManifests"],
    &["cluster", "allowSchedulingOnControlPlanes"],
    &["machine", "controlPlane"],
];

/// Document kinds that implement `container.ControlplaneOnlyConfig` (siderolabs/talos
/// v1.14.0-rc.1 `pkg/machinery/config/types/k8s/*.go`).
const CONTROL_PLANE_ONLY_KINDS: &[&str] = &[
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAPIServerConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeEtcdEncryptionConfig",
    "KubeFlannelCNIConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeTalosAPIAccessConfig",
];

/// True for a value that Talos treats as unset (null, empty string, empty mapping or list).
fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Mapping(m) => m.is_empty(),
        Value::Sequence(s) => s.is_empty(),
        _ => false,
    }
}

/// Labels outside the kubernetes.io/k8s.io namespaces, or ones the NodeRestriction admission
/// plugin explicitly allows a kubelet to set on its own node (`kubeletapis.IsKubeletLabel`).
fn kubelet_may_set_label(key: &str) -> bool {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    let Some((prefix, _)) = key.rsplit_once('/') else {
        return true;
    };
    let in_namespace = |ns: &str| prefix == ns || prefix.ends_with(&format!(".{ns}"));
    if !in_namespace("kubernetes.io") && !in_namespace("k8s.io") {
        return true;
    }
    ALLOWED.contains(&key)
        || in_namespace("kubelet.kubernetes.io")
        || in_namespace("node.kubernetes.io")
}

/// Checks that need no schema: exactly one install disk choice; control-plane-only fields,
/// CA keys, `nodeTaints` and the VIP only on control planes; worker labels NodeRestriction
/// allows.
pub(crate) fn check_structure(
    node: &str,
    machine_type: MachineType,
    contract: Contract,
    bundle: &ConfigBundle,
) -> Vec<StructuralError> {
    let mut out = Vec::new();
    let err = |kind: &str, field: &str, problem: String| StructuralError {
        node: node.to_owned(),
        kind: kind.to_owned(),
        field: field.to_owned(),
        problem,
    };
    let cp = machine_type == MachineType::ControlPlane;
    let Some(main) = bundle.v1alpha1() else {
        out.push(err(
            "v1alpha1",
            "",
            "the config has no v1alpha1 document; a patch must not remove it".into(),
        ));
        return out;
    };
    install_rules(contract, bundle, main, &mut out, &err);
    machine_type_rule(machine_type, main, &mut out, &err);
    time_sync_rules(bundle, main, &mut out, &err);
    conflict_rules(contract, bundle, &mut out, &err);
    if !cp {
        worker_document_rules(bundle, &mut out, &err);
        worker_v1alpha1_rules(main, &mut out, &err);
        worker_vip_rule(bundle, &mut out, &err);
    }
    out
}

/// Builds a [`StructuralError`] for the node being checked: kind, field, problem.
type Err<'a> = dyn Fn(&str, &str, String) -> StructuralError + 'a;

/// Exactly one install disk choice: the v1.14 document's selector, or one of v1.13's `disk`
/// and `diskSelector`.
fn install_rules(
    contract: Contract,
    bundle: &ConfigBundle,
    main: &Value,
    out: &mut Vec<StructuralError>,
    err: &Err<'_>,
) {
    if contract.unattended_install_config() {
        // UnattendedInstallConfigV1Alpha1.Validate (runtime/unattended_install.go): the disk
        // selector is required.
        let matcher = bundle
            .typed("UnattendedInstallConfig", None)
            .and_then(|d| lookup(d, &["provisioning", "diskSelector", "match"]))
            .filter(|v| !is_unset(v));
        if matcher.is_none() {
            out.push(err(
                "UnattendedInstallConfig",
                "provisioning.diskSelector.match",
                "no install disk: Talos v1.14 needs the document's disk selector; set \
                 installDisk or diskSelector on the node and do not delete the document"
                    .into(),
            ));
        }
    }
    let disk = lookup(main, &["machine", "install", "disk"]).filter(|v| !is_unset(v));
    let selector = lookup(main, &["machine", "install", "diskSelector"]).filter(|v| !is_unset(v));
    match (disk, selector) {
        _ if contract.unattended_install_config() => {}
        (Some(_), Some(_)) => out.push(err(
            "v1alpha1",
            "machine.install",
            "both `disk` and `diskSelector` are set; keep exactly one install disk choice".into(),
        )),
        (None, None) => out.push(err(
            "v1alpha1",
            "machine.install",
            "neither `disk` nor `diskSelector` is set; Talos needs one to install".into(),
        )),
        _ => {}
    }
}

/// `machine.type` matches the node's role.
fn machine_type_rule(
    machine_type: MachineType,
    main: &Value,
    out: &mut Vec<StructuralError>,
    err: &Err<'_>,
) {
    let declared = lookup(main, &["machine", "type"]).and_then(Value::as_str);
    if declared != Some(machine_type.as_str()) {
        out.push(err(
            "v1alpha1",
            "machine.type",
            format!(
                "is {:?} but the node's role is a {}; do not patch machine.type",
                declared.unwrap_or(""),
                machine_type.as_str()
            ),
        ));
    }
}

/// `machine.time` next to a TimeSyncConfig document.
fn time_sync_rules(
    bundle: &ConfigBundle,
    main: &Value,
    out: &mut Vec<StructuralError>,
    err: &Err<'_>,
) {
    // TimeSyncConfigV1Alpha1.V1Alpha1ConflictValidate (network/time_sync.go, v1.13.9).
    let new_style = bundle
        .docs
        .iter()
        .any(|d| d.get("kind").and_then(Value::as_str) == Some("TimeSyncConfig"));
    if new_style {
        for (key, what) in [
            ("servers", "time servers"),
            ("bootTimeout", "a boot timeout"),
            ("disabled", "disabled time sync"),
        ] {
            let set = match lookup(main, &["machine", "time", key]) {
                Some(Value::Bool(b)) => *b,
                Some(v) => !is_unset(v),
                None => false,
            };
            if set {
                out.push(err(
                    "v1alpha1",
                    &format!("machine.time.{key}"),
                    format!(
                        "{what} in both the deprecated machine.time and a TimeSyncConfig \
                         document, which Talos refuses; remove machine.time from the patch \
                         (talboot renders TimeSyncConfig from network.ntp)"
                    ),
                ));
            }
        }
    }
}

/// Every other legacy field set next to the document that replaced it.
fn conflict_rules(
    contract: Contract,
    bundle: &ConfigBundle,
    out: &mut Vec<StructuralError>,
    err: &Err<'_>,
) {
    // Every other V1Alpha1ConflictValidate rule of the contract (legacy::CONFLICTS).
    for found in legacy::conflicts(contract, bundle) {
        if found.kind == "TimeSyncConfig" {
            continue; // reported above, with its own fix
        }
        out.push(err(
            "v1alpha1",
            &found.field,
            format!(
                "set next to a {kind} document, which Talos refuses ({source} in \
                 siderolabs/talos pkg/machinery/config/types, V1Alpha1ConflictValidate); \
                 write the setting in the {kind} document of the patch instead and remove \
                 `{field}`",
                kind = found.kind,
                source = found.source,
                field = found.field,
            ),
        ));
    }
}

/// On a worker: no control-plane-only documents, no CA key in KubeAPIServerCAConfig, no
/// KubeNodeConfig label NodeRestriction forbids.
fn worker_document_rules(bundle: &ConfigBundle, out: &mut Vec<StructuralError>, err: &Err<'_>) {
    // Kinds implementing container.ControlplaneOnlyConfig (v1.14.0-rc.1
    // pkg/machinery/config/container/validate.go refuses them on other machines).
    for doc in &bundle.docs {
        let Some(kind) = doc.get("kind").and_then(Value::as_str) else {
            continue;
        };
        if CONTROL_PLANE_ONLY_KINDS.contains(&kind) {
            out.push(err(
                kind,
                "",
                "only control-plane nodes may carry this document; move it to a \
                 control-plane role patch"
                    .into(),
            ));
        }
    }
    if bundle
        .typed("KubeAPIServerCAConfig", None)
        .and_then(|d| lookup(d, &["issuingCA", "key"]))
        .is_some_and(|v| !is_unset(v))
    {
        out.push(err(
            "KubeAPIServerCAConfig",
            "issuingCA.key",
            "a CA private key on a worker; only control planes carry CA keys".into(),
        ));
    }
    if let Some(Value::Mapping(labels)) = bundle
        .typed("KubeNodeConfig", None)
        .and_then(|d| d.get("labels"))
    {
        for key in labels.keys().filter_map(Value::as_str) {
            if !kubelet_may_set_label(key) {
                out.push(err(
                    "KubeNodeConfig",
                    &format!("labels.{key}"),
                    "NodeRestriction forbids a worker's kubelet to set labels under \
                     kubernetes.io/ or k8s.io/ (except node.kubernetes.io/ and \
                     kubelet.kubernetes.io/); pick a label under your own prefix"
                        .into(),
                ));
            }
        }
    }
}

/// On a worker: no control-plane-only v1alpha1 fields, CA keys, taints or labels
/// NodeRestriction forbids.
fn worker_v1alpha1_rules(main: &Value, out: &mut Vec<StructuralError>, err: &Err<'_>) {
    for path in CONTROL_PLANE_ONLY {
        if lookup(main, path).is_some_and(|v| !is_unset(v)) {
            out.push(err(
                "v1alpha1",
                &path.join("."),
                "only control-plane nodes may set this; move it to a control-plane role patch"
                    .into(),
            ));
        }
    }
    for path in [&["machine", "ca", "key"][..], &["cluster", "ca", "key"][..]] {
        if lookup(main, path).is_some_and(|v| !is_unset(v)) {
            out.push(err(
                "v1alpha1",
                &path.join("."),
                "a CA private key on a worker; only control planes carry CA keys".into(),
            ));
        }
    }
    if lookup(main, &["machine", "nodeTaints"]).is_some_and(|v| !is_unset(v)) {
        out.push(err(
            "v1alpha1",
            "machine.nodeTaints",
            "workers cannot set taints (NodeRestriction); use role/node `taints`, which \
             talboot renders as kubelet registerWithTaints"
                .into(),
        ));
    }
    if let Some(Value::Mapping(labels)) = lookup(main, &["machine", "nodeLabels"]) {
        for key in labels.keys().filter_map(Value::as_str) {
            if !kubelet_may_set_label(key) {
                out.push(err(
                    "v1alpha1",
                    &format!("machine.nodeLabels.{key}"),
                    "NodeRestriction forbids a worker's kubelet to set labels under \
                     kubernetes.io/ or k8s.io/ (except node.kubernetes.io/ and \
                     kubelet.kubernetes.io/); pick a label under your own prefix"
                        .into(),
                ));
            }
        }
    }
}

/// On a worker: no VIP document (checked last, as it always was).
fn worker_vip_rule(bundle: &ConfigBundle, out: &mut Vec<StructuralError>, err: &Err<'_>) {
    for doc in &bundle.docs {
        if doc.get("kind").and_then(Value::as_str) == Some("Layer2VIPConfig") {
            out.push(err(
                "Layer2VIPConfig",
                "name",
                "a VIP on a worker; only control planes may hold the API server VIP".into(),
            ));
        }
    }
}
