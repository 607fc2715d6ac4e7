//! The bootstrap manifest sync's decisions, pure (objects in, plan out): which objects are
//! applied and in what order, what each would do (created, configured, unchanged), what the
//! inventory says is gone and is pruned, what the inventory holds afterwards, and which
//! workloads are waited for. The I/O around it (Talos, Kubernetes) is
//! [`super::manifest_sync`].
//!
//! Upstream: siderolabs/talos v1.13.9 `pkg/cluster/kubernetes/talos_managed.go`
//! (`PerformManifestsSync`, `syncManifestsSSA`: field manager, inventory namespace and name
//! from `pkg/machinery/constants/constants.go`, `KubernetesFieldManagerName`,
//! `KubernetesInventoryNamespace`, `KubernetesBootstrapManifestsInventoryName`), and
//! siderolabs/go-kubernetes v0.2.38 (the version talos v1.13.9's go.mod pins)
//! `kubernetes/ssa`: `apply.go` (`Apply`: every object annotated with the owning inventory
//! (`prepareObjects`), applied, the inventory extended with every applied object and written,
//! then, unless `NoPrune`, every inventory entry not in the set (`calculatePruneObjects`) read,
//! checked against the inventory policy, deleted (background propagation) and removed from
//! the inventory, which is written again), `diff.go` (`Diff`: pruned entries first, then one
//! created/configured/unchanged per object), `inventory_policy.go` (`checkInventoryPolicy`;
//! talosctl's default policy is `AdoptIfNoInventory`, `cmd/talosctl/cmd/talos/upgrade-k8s.go`),
//! `inventory.go` (`InventoryAnnotationKey`), `internal/inventory/configmap/inventory.go` (a
//! ConfigMap whose `data` keys are the objects, values empty), and fluxcd/cli-utils v1.2.0
//! `pkg/object/objmetadata.go` (the key: `namespace_name_group_kind`, `:` in a name as `__`).
//!
//! Created/configured/unchanged is decided as go-kubernetes does, from the server's dry-run
//! apply compared with the live object ([`drifted`]). Where talboot differs: only the
//! `AdoptIfNoInventory` policy is implemented, and `Force` (recreate on immutable field
//! changes) is not.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// Talos's field manager (`constants.KubernetesFieldManagerName`).
pub(crate) const FIELD_MANAGER: &str = "talos";
/// Where the inventory ConfigMap lives (`constants.KubernetesInventoryNamespace`).
pub(crate) const INVENTORY_NAMESPACE: &str = "kube-system";
/// The inventory ConfigMap's name, also the inventory's ID
/// (`constants.KubernetesBootstrapManifestsInventoryName`; `configmap.Inventory.ID`).
pub(crate) const INVENTORY_NAME: &str = "talos-bootstrap-manifests-inventory";
/// The annotation naming the inventory an object belongs to (`ssa.InventoryAnnotationKey`).
pub(crate) const INVENTORY_ANNOTATION: &str = "config.k8s.io/owning-inventory";
/// The COSI resource type and namespace of Talos's rendered bootstrap manifests
/// (siderolabs/talos v1.13.9 `pkg/machinery/resources/k8s/manifest.go`, `ManifestType`;
/// `ControlPlaneNamespaceName`).
pub(crate) const MANIFEST_TYPE: &str = "Manifests.kubernetes.talos.dev";
pub(crate) const MANIFEST_NAMESPACE: &str = "controlplane";

/// One object's identity as an inventory tracks it: group, kind, namespace, name (no
/// version, as cli-utils' `ObjMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjMeta {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjMeta {
    /// The identity of a Kubernetes object; `None` without kind or name.
    pub fn of(obj: &Value) -> Option<Self> {
        let api_version = obj["apiVersion"].as_str()?;
        let group = api_version
            .rsplit_once('/')
            .map_or("", |(g, _)| g)
            .to_owned();
        Some(ObjMeta {
            group,
            kind: obj["kind"].as_str()?.to_owned(),
            namespace: obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            name: obj["metadata"]["name"].as_str()?.to_owned(),
        })
    }

    /// The inventory ConfigMap's key (`ObjMetadata.String`): `:` in a name is written `__`
    /// only for the RBAC kinds (`RBACGroupKind`: Role, ClusterRole, RoleBinding and
    /// ClusterRoleBinding of rbac.authorization.k8s.io), whose names such as
    /// `system:coredns` may hold one; any other name goes in as it is.
    pub(crate) fn inventory_key(&self) -> String {
        let rbac = self.group == "rbac.authorization.k8s.io"
            && matches!(
                self.kind.as_str(),
                "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding"
            );
        let name = if rbac {
            self.name.replace(':', "__")
        } else {
            self.name.clone()
        };
        format!("{}_{}_{}_{}", self.namespace, name, self.group, self.kind)
    }

    /// Parses an inventory key (`ParseObjMetadata`: namespace up to the first `_`, kind after
    /// the last, group before that, the rest the name with `__` back to `:`).
    pub(crate) fn parse_key(key: &str) -> Result<Self, ManifestError> {
        let bad = || ManifestError::BadKey(key.to_owned());
        let (namespace, rest) = key.split_once('_').ok_or_else(bad)?;
        let (rest, kind) = rest.rsplit_once('_').ok_or_else(bad)?;
        let (name, group) = rest.rsplit_once('_').ok_or_else(bad)?;
        let name = name.replace("__", ":");
        if name.contains('_') {
            return Err(ManifestError::TooManyFields(key.to_owned()));
        }
        Ok(ObjMeta {
            group: group.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name,
        })
    }

    /// Whether this inventory entry is the object `o` (`calculatePruneObjects`: a
    /// cluster-scoped entry has no namespace, whatever the manifest says).
    fn matches(&self, o: &ObjMeta) -> bool {
        self.group == o.group
            && self.kind == o.kind
            && self.name == o.name
            && (self.namespace == o.namespace || self.namespace.is_empty())
    }

    /// A Deployment, DaemonSet or StatefulSet: what the sync waits for.
    pub(crate) fn is_workload(&self) -> bool {
        self.group == "apps"
            && matches!(
                self.kind.as_str(),
                "Deployment" | "DaemonSet" | "StatefulSet"
            )
    }
}

impl fmt::Display for ObjMeta {
    /// `Kind/namespace/name` (`Kind/name` for cluster scope), as fluxcd ssa's subjects.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Why the bootstrap manifests cannot be synced: a decision of this module, or (from
/// [`super::manifest_sync`]) a read or write of Talos or Kubernetes. The texts are
/// go-kubernetes' where it has one.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("unable to parse stored object metadata: {0}")]
    BadKey(String),
    #[error("too many fields within: {0}")]
    TooManyFields(String),
    #[error("failed to parse object metadata: {0}")]
    Entry(Box<ManifestError>),
    #[error("a bootstrap manifest has no apiVersion, kind or metadata.name")]
    NoMetadata,
    #[error("object {0} already has an inventory annotation")]
    OtherInventory(ObjMeta),
    #[error(
        "inventory policy check failure for object {object}, inventory policy prevented \
         actuation (status: NoMatch, policy: AdoptIfNoInventory): it belongs to inventory \
         {inventory:?}"
    )]
    Policy { object: ObjMeta, inventory: String },
    #[error("reading the bootstrap manifests ({MANIFEST_TYPE}): {0}")]
    Read(Box<crate::talos::TalosError>),
    #[error("bootstrap manifest {id}: undecodable spec: {source}")]
    Undecodable {
        id: String,
        source: prost::DecodeError,
    },
    #[error("discovering {object}: {source}")]
    Discover {
        object: ObjMeta,
        source: Box<kube::Error>,
    },
    #[error("{0}: not an object")]
    NotAnObject(ObjMeta),
    #[error("{0}")]
    Kube(Box<crate::addons::kube::KubeError>),
    #[error("apply dry run failed for {object}: {source}")]
    DryRun {
        object: ObjMeta,
        source: Box<crate::addons::kube::KubeError>,
    },
    #[error("failed to fetch the inventory configmap: {0}")]
    FetchInventory(Box<kube::Error>),
    #[error("reading namespace {INVENTORY_NAMESPACE}: {0}")]
    ReadNamespace(Box<kube::Error>),
    #[error("failed to create inventory namespace: {0}")]
    CreateNamespace(Box<kube::Error>),
    #[error("failed to create the inventory configmap: {0}")]
    CreateInventory(Box<kube::Error>),
    #[error("failed to update the inventory: {0}")]
    UpdateInventory(Box<kube::Error>),
    /// An object's apply failed; `inventory` is why the inventory could not be written after
    /// it, if it could not.
    #[error(
        "error applying manifests: {object}: {source}{}",
        inventory.as_ref().map(|w| format!("; {w}")).unwrap_or_default()
    )]
    Apply {
        object: ObjMeta,
        source: Box<crate::addons::kube::KubeError>,
        inventory: Option<Box<ManifestError>>,
    },
    /// `object: error` of every prune that failed.
    #[error("error pruning: {}", .0.join("; "))]
    Prune(Vec<String>),
}

/// What the sync does to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Created,
    Configured,
    Unchanged,
    Pruned,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Created => "created",
            Action::Configured => "configured",
            Action::Unchanged => "unchanged",
            Action::Pruned => "pruned",
        })
    }
}

/// One object's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub object: ObjMeta,
    pub action: Action,
}

/// The manifests from Talos, decoded, annotated and ordered for apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub objects: Vec<(ObjMeta, Value)>,
}

/// Kinds applied before the rest (go-kubernetes `Apply`, by fluxcd ssa `ApplyAllStaged`:
/// "CRDs, ClusterRoles, and Namespaces and Class definitions are applied first").
fn first_stage(m: &ObjMeta) -> bool {
    matches!(
        (m.group.as_str(), m.kind.as_str()),
        ("apiextensions.k8s.io", "CustomResourceDefinition")
            | ("", "Namespace")
            | ("rbac.authorization.k8s.io", "ClusterRole")
    ) || m.kind.ends_with("Class")
}

impl Desired {
    /// The manifests in the order Talos lists them (COSI List: by resource ID, then each
    /// resource's items in order), each annotated with the inventory (`prepareObjects`: an
    /// object already naming another inventory is an error), then stably split into the first
    /// stage and the rest.
    pub(crate) fn prepare(objects: Vec<Value>) -> Result<Self, ManifestError> {
        let mut first = Vec::new();
        let mut rest = Vec::new();
        for mut obj in objects {
            let meta = ObjMeta::of(&obj).ok_or(ManifestError::NoMetadata)?;
            if !obj["metadata"]["annotations"].is_object() {
                obj["metadata"]["annotations"] = Value::Object(Default::default());
            }
            let ann = &mut obj["metadata"]["annotations"][INVENTORY_ANNOTATION];
            match ann.as_str() {
                Some(id) if id != INVENTORY_NAME => {
                    return Err(ManifestError::OtherInventory(meta));
                }
                _ => *ann = Value::String(INVENTORY_NAME.to_owned()),
            }
            if first_stage(&meta) {
                first.push((meta, obj));
            } else {
                rest.push((meta, obj));
            }
        }
        first.extend(rest);
        Ok(Desired { objects: first })
    }

    fn contains(&self, entry: &ObjMeta) -> bool {
        self.objects.iter().any(|(m, _)| entry.matches(m))
    }
}

/// Whether a forced apply would change `live`, judged from the server's dry run of it
/// (fluxcd/pkg ssa v0.73.0 `manager_diff.go`, `hasDrifted`): a dry run without a
/// `resourceVersion` would create the object; otherwise the labels, the annotations, or
/// anything outside `metadata` and `status` differ. Comparing the dry run rather than the
/// manifest is what makes fields the server rewrites count right: a Secret's `stringData`
/// comes back folded into `data`, defaults come back filled in.
pub(crate) fn drifted(live: &Value, dry_run: &Value) -> bool {
    if dry_run["metadata"]["resourceVersion"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        return true;
    }
    // apimachinery's Semantic.DeepEqual counts a missing map and an empty one as equal.
    let map = |v: &Value, k: &str| match &v["metadata"][k] {
        Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    if map(live, "labels") != map(dry_run, "labels")
        || map(live, "annotations") != map(dry_run, "annotations")
    {
        return true;
    }
    let rest = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
            o.remove("status");
        }
        v
    };
    rest(live) != rest(dry_run)
}

/// `checkInventoryPolicy` with `AdoptIfNoInventory`: an object without the annotation or with
/// this inventory's may be taken over or pruned, one of another inventory may not.
pub(crate) fn check_policy(meta: &ObjMeta, live: &Value) -> Result<(), ManifestError> {
    match live["metadata"]["annotations"][INVENTORY_ANNOTATION].as_str() {
        None => Ok(()),
        Some(id) if id == INVENTORY_NAME => Ok(()),
        Some(other) => Err(ManifestError::Policy {
            object: meta.clone(),
            inventory: other.to_owned(),
        }),
    }
}

/// What applying an object would do, from the live object (`None`: not found) and the
/// server's dry run of the apply (`None`: refused as not found, e.g. a kind or namespace the
/// same set creates first), as go-kubernetes v0.2.38 `ssa/diff.go` (`Manager.diff`) decides.
pub(crate) fn action_for(live: Option<&Value>, dry_run: Option<&Value>) -> Action {
    let (Some(live), Some(dry_run)) = (live, dry_run) else {
        return Action::Created;
    };
    if dry_run["metadata"]["resourceVersion"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        Action::Created
    } else if drifted(live, dry_run) {
        Action::Configured
    } else {
        Action::Unchanged
    }
}

/// The inventory entries that are no longer in the set (`calculatePruneObjects`).
pub(crate) fn to_prune(inventory: &[ObjMeta], desired: &Desired) -> Vec<ObjMeta> {
    inventory
        .iter()
        .filter(|e| !desired.contains(e))
        .cloned()
        .collect()
}

/// The whole sync as a dry run lists it (`Diff`): the pruned objects first (those that still
/// exist; unless `no_prune`), then each object's action. `live` holds every object of the
/// set and of the inventory that exists; `dry_runs` the server's dry-run apply of each object
/// of the set that it could try. Refused when the policy refuses an object.
pub fn plan(
    desired: &Desired,
    live: &BTreeMap<ObjMeta, Value>,
    dry_runs: &BTreeMap<ObjMeta, Value>,
    inventory: &[ObjMeta],
    no_prune: bool,
) -> Result<Vec<Change>, ManifestError> {
    let mut out = Vec::new();
    if !no_prune {
        for entry in to_prune(inventory, desired) {
            if let Some(obj) = live.get(&entry) {
                check_policy(&entry, obj)?;
                out.push(Change {
                    object: entry,
                    action: Action::Pruned,
                });
            }
        }
    }
    for (meta, _) in &desired.objects {
        let action = action_for(live.get(meta), dry_runs.get(meta));
        if action == Action::Configured
            && let Some(l) = live.get(meta)
        {
            check_policy(meta, l)?;
        }
        out.push(Change {
            object: meta.clone(),
            action,
        });
    }
    Ok(out)
}

/// The inventory after the apply: every earlier entry, then every applied object not in it
/// yet (`Apply`: `inventoryObjRefs = append(...)` when not `Contains`).
pub(crate) fn inventory_after_apply(inventory: &[ObjMeta], applied: &[ObjMeta]) -> Vec<ObjMeta> {
    let mut out = inventory.to_vec();
    for m in applied {
        if !out.contains(m) {
            out.push(m.clone());
        }
    }
    out
}

/// The inventory ConfigMap's `data` for `entries` (each key with an empty value).
pub(crate) fn inventory_data(entries: &[ObjMeta]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|e| (e.inventory_key(), String::new()))
        .collect()
}

/// The entries of an inventory ConfigMap's `data` (its keys).
pub(crate) fn inventory_entries(
    data: &BTreeMap<String, String>,
) -> Result<Vec<ObjMeta>, ManifestError> {
    data.keys()
        .map(|k| ObjMeta::parse_key(k).map_err(|e| ManifestError::Entry(Box::new(e))))
        .collect()
}

/// One line per change the dry run prints, as talosctl's ` < <action> <subject>`; unchanged
/// objects are counted, not listed.
pub fn describe(changes: &[Change]) -> Vec<String> {
    let unchanged = changes
        .iter()
        .filter(|c| c.action == Action::Unchanged)
        .count();
    let mut lines: Vec<String> = changes
        .iter()
        .filter(|c| c.action != Action::Unchanged)
        .map(|c| format!("{} {}", c.action, c.object))
        .collect();
    lines.push(format!("{unchanged} unchanged"));
    lines
}

/// A `google.protobuf.Struct` (a Talos `SingleManifest.object`) as JSON.
pub(crate) fn struct_to_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), pvalue_to_json(v)))
            .collect(),
    )
}

fn pvalue_to_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        // Struct numbers are doubles; whole ones go back to integers, as Go's structpb
        // AsMap and the Kubernetes decoder see them.
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                Value::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(pvalue_to_json).collect()),
        Some(Kind::StructValue(s)) => struct_to_json(s),
    }
}

/// JSON as a `google.protobuf.Struct` (`None` for a non-object), as Talos encodes a manifest.
pub fn json_to_struct(v: &Value) -> Option<prost_types::Struct> {
    match json_to_pvalue(v).kind {
        Some(prost_types::value::Kind::StructValue(s)) => Some(s),
        _ => None,
    }
}

fn json_to_pvalue(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_pvalue).collect(),
        }),
        Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_pvalue(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn ds(image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            "spec": {"template": {"spec": {"containers": [{"name": "kube-proxy", "image": image}]}}}})
    }

    fn cr(name: &str) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": []})
    }

    #[test]
    fn inventory_keys_are_cli_utils_keys() {
        let m = ObjMeta::of(&cr("system:coredns")).unwrap();
        assert_eq!(
            m.inventory_key(),
            "_system__coredns_rbac.authorization.k8s.io_ClusterRole"
        );
        assert_eq!(ObjMeta::parse_key(&m.inventory_key()).unwrap(), m);
        let d = ObjMeta::of(&ds("x")).unwrap();
        assert_eq!(d.inventory_key(), "kube-system_kube-proxy_apps_DaemonSet");
        assert_eq!(d.to_string(), "DaemonSet/kube-system/kube-proxy");
        // Only RBAC kinds transcode a colon (cli-utils RBACGroupKind); parsing always does.
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a:b", "namespace": "ns"}});
        assert_eq!(
            ObjMeta::of(&cm).unwrap().inventory_key(),
            "ns_a:b__ConfigMap"
        );
        cm["kind"] = json!("Role");
        cm["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
        assert_eq!(
            ObjMeta::of(&cm).unwrap().inventory_key(),
            "ns_a__b_rbac.authorization.k8s.io_Role"
        );
        for kind in ["RoleBinding", "ClusterRoleBinding"] {
            let m = ObjMeta {
                group: "rbac.authorization.k8s.io".into(),
                kind: kind.into(),
                namespace: String::new(),
                name: "system:x".into(),
            };
            assert!(m.inventory_key().starts_with("_system__x_"), "{kind}");
        }
        let other_group = ObjMeta {
            group: "example.com".into(),
            kind: "ClusterRole".into(),
            namespace: String::new(),
            name: "system:x".into(),
        };
        assert_eq!(
            other_group.inventory_key(),
            "_system:x_example.com_ClusterRole"
        );
        assert_eq!(
            ObjMeta::parse_key("_system:x_example.com_ClusterRole").unwrap(),
            other_group
        );
        assert!(ObjMeta::parse_key("nounderscore").is_err());
        assert!(ObjMeta::parse_key("ns_a_b_apps_Deployment").is_err());
    }

    proptest! {
        #[test]
        fn inventory_keys_round_trip(ns in "[a-z0-9-]{0,8}", name in "[a-z0-9:.-]{1,12}",
                                     group in "[a-z.]{0,10}", kind in "[A-Z][a-zA-Z]{0,8}") {
            let m = ObjMeta { group, kind, namespace: ns, name };
            prop_assert_eq!(ObjMeta::parse_key(&m.inventory_key()).unwrap(), m);
        }

        #[test]
        fn structs_round_trip(n in -1_000_000i64..1_000_000, s in ".{0,10}", b: bool) {
            let v = json!({"a": n, "b": [s, b, null], "c": {"d": 1.5}});
            prop_assert_eq!(struct_to_json(&json_to_struct(&v).unwrap()), v);
        }
    }

    #[test]
    fn objects_are_annotated_and_cluster_roles_go_first() {
        let d = Desired::prepare(vec![ds("a"), cr("r")]).unwrap();
        let kinds: Vec<&str> = d.objects.iter().map(|(m, _)| m.kind.as_str()).collect();
        assert_eq!(kinds, ["ClusterRole", "DaemonSet"]);
        assert_eq!(
            d.objects[1].1["metadata"]["annotations"][INVENTORY_ANNOTATION],
            INVENTORY_NAME
        );
        let mut other = ds("a");
        other["metadata"]["annotations"] = json!({INVENTORY_ANNOTATION: "someone-else"});
        let err = Desired::prepare(vec![other]).unwrap_err().to_string();
        assert!(err.contains("already has an inventory annotation"), "{err}");
    }

    /// `obj` as the server holds it: with a resourceVersion and a uid.
    fn served(obj: &Value, rv: &str) -> Value {
        let mut o = obj.clone();
        o["metadata"]["resourceVersion"] = json!(rv);
        o["metadata"]["uid"] = json!("u");
        o
    }

    #[test]
    fn the_plan_prunes_what_left_the_set_and_diffs_the_rest() {
        let desired = Desired::prepare(vec![ds("proxy:v2"), cr("kept")]).unwrap();
        let d = desired.objects[1].0.clone();
        let kept = desired.objects[0].0.clone();
        let gone = ObjMeta::of(&cr("gone")).unwrap();
        let vanished = ObjMeta::of(&cr("vanished")).unwrap();
        let mut live = BTreeMap::new();
        let mut dry = BTreeMap::new();
        // The live DaemonSet has the old image and a field the server added; the dry run
        // has the new image and the same default.
        let mut old = desired.objects[1].1.clone();
        old["spec"]["template"]["spec"]["containers"][0]["image"] = json!("proxy:v1");
        old["spec"]["revisionHistoryLimit"] = json!(10);
        live.insert(d.clone(), served(&old, "7"));
        let mut new = desired.objects[1].1.clone();
        new["spec"]["revisionHistoryLimit"] = json!(10);
        dry.insert(d.clone(), served(&new, "7"));
        live.insert(kept.clone(), served(&desired.objects[0].1, "3"));
        dry.insert(kept.clone(), served(&desired.objects[0].1, "3"));
        live.insert(gone.clone(), served(&cr("gone"), "2"));
        let inventory = vec![kept.clone(), gone.clone(), vanished.clone(), d.clone()];
        let changes = plan(&desired, &live, &dry, &inventory, false).unwrap();
        assert_eq!(
            changes,
            vec![
                Change {
                    object: gone.clone(),
                    action: Action::Pruned
                },
                Change {
                    object: kept.clone(),
                    action: Action::Unchanged
                },
                Change {
                    object: d.clone(),
                    action: Action::Configured
                },
            ]
        );
        assert_eq!(
            describe(&changes),
            [
                "pruned ClusterRole/gone",
                "configured DaemonSet/kube-system/kube-proxy",
                "1 unchanged"
            ]
        );
        // --no-prune: nothing is pruned.
        let changes = plan(&desired, &live, &dry, &inventory, true).unwrap();
        assert!(changes.iter().all(|c| c.action != Action::Pruned));
        // Gone from the cluster: the dry run creates it (no resourceVersion).
        live.remove(&d);
        dry.insert(d.clone(), desired.objects[1].1.clone());
        let changes = plan(&desired, &live, &dry, &inventory, false).unwrap();
        assert_eq!(changes.last().unwrap().action, Action::Created);
        // A dry run refused as not found (a namespace or kind of the same set): created.
        dry.remove(&d);
        let changes = plan(&desired, &live, &dry, &inventory, false).unwrap();
        assert_eq!(changes.last().unwrap().action, Action::Created);
        assert_eq!(to_prune(&inventory, &desired), vec![gone.clone(), vanished]);
    }

    #[test]
    fn drift_is_what_the_dry_run_changes_not_what_the_manifest_says() {
        // Issue 31 item 5: Talos's bootstrap token Secret sets stringData; the server stores
        // data and never returns stringData, so the manifest never matches the live object,
        // while the server's dry run of the apply equals it.
        let manifest = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {"token-id": "abcdef"}});
        let mut stored = manifest.clone();
        stored.as_object_mut().unwrap().remove("stringData");
        stored["data"] = json!({"token-id": "YWJjZGVm"});
        let live = served(&stored, "41");
        let mut dry_run = live.clone();
        dry_run["metadata"]["managedFields"] = json!([{"manager": "talos"}]);
        assert_eq!(action_for(Some(&live), Some(&dry_run)), Action::Unchanged);
        // A changed token shows.
        let mut rotated = dry_run.clone();
        rotated["data"]["token-id"] = json!("eHh4eHh4");
        assert_eq!(action_for(Some(&live), Some(&rotated)), Action::Configured);
        // Labels and annotations count; an absent map equals an empty one.
        let mut labelled = dry_run.clone();
        labelled["metadata"]["labels"] = json!({"a": "b"});
        assert_eq!(action_for(Some(&live), Some(&labelled)), Action::Configured);
        labelled["metadata"]["labels"] = json!({});
        assert_eq!(action_for(Some(&live), Some(&labelled)), Action::Unchanged);
        // Status and other metadata do not.
        let mut other = dry_run.clone();
        other["status"] = json!({"x": 1});
        other["metadata"]["generation"] = json!(9);
        assert_eq!(action_for(Some(&live), Some(&other)), Action::Unchanged);
        assert_eq!(action_for(None, Some(&dry_run)), Action::Created);
    }

    #[test]
    fn another_inventorys_object_is_not_taken_over_or_pruned() {
        let desired = Desired::prepare(vec![ds("v2")]).unwrap();
        let d = desired.objects[0].0.clone();
        let mut theirs = ds("v1");
        theirs["metadata"]["annotations"] = json!({INVENTORY_ANNOTATION: "flux"});
        let dry = BTreeMap::from([(d.clone(), served(&desired.objects[0].1, "1"))]);
        let live = BTreeMap::from([(d.clone(), served(&theirs, "1"))]);
        let err = plan(&desired, &live, &dry, &[], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("NoMatch"), "{err}");
        // Unannotated: adopted (AdoptIfNoInventory).
        let live = BTreeMap::from([(d.clone(), served(&ds("v1"), "1"))]);
        assert_eq!(
            plan(&desired, &live, &dry, &[], false).unwrap()[0].action,
            Action::Configured
        );
        // An inventory entry now owned by another inventory is not pruned.
        let empty = Desired::prepare(vec![]).unwrap();
        let live = BTreeMap::from([(d.clone(), theirs)]);
        assert!(plan(&empty, &live, &BTreeMap::new(), &[d], false).is_err());
    }

    #[test]
    fn a_cluster_scoped_entry_matches_a_manifest_with_a_namespace() {
        let mut role = cr("r");
        role["metadata"]["namespace"] = json!("kube-system");
        let desired = Desired::prepare(vec![role]).unwrap();
        let entry = ObjMeta::of(&cr("r")).unwrap();
        assert!(to_prune(&[entry], &desired).is_empty());
    }

    #[test]
    fn the_inventory_grows_with_the_applied_objects_and_reads_back() {
        let a = ObjMeta::of(&cr("a")).unwrap();
        let b = ObjMeta::of(&ds("x")).unwrap();
        let inv = inventory_after_apply(std::slice::from_ref(&a), &[b.clone(), a.clone()]);
        assert_eq!(inv, vec![a.clone(), b.clone()]);
        let data = inventory_data(&inv);
        assert_eq!(data["_a_rbac.authorization.k8s.io_ClusterRole"], "");
        let mut back = inventory_entries(&data).unwrap();
        back.sort();
        let mut want = inv;
        want.sort();
        assert_eq!(back, want);
    }
}
