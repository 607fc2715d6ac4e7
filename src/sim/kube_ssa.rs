//! Field ownership for the Kubernetes API double, the way the real API server keeps it with
//! structured-merge-diff: per manager and operation, the set of fields it owns
//! (`metadata.managedFields[].fieldsV1`), conflicts when one applier changes a field another
//! manager owns, a manager that owns nothing dropped, and the typed round trip that drops
//! zero values the Go types omit. Also the patch kinds other clients send (strategic merge,
//! JSON merge, JSON patch), the typed refusal of a string where a number belongs, and the
//! PodSecurity warnings the server returns as `Warning` headers.
//!
//! Modelled on kubernetes-sigs/structured-merge-diff v6.3.2 (`merge/update.go`: Apply,
//! Update, prune, and the removal of empty managers; `fieldpath/serialize.go`: the fieldsV1
//! encoding; `fieldpath/element.go`: how a path prints) and kubernetes/kubernetes v1.36.2
//! (`staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/`: `conflict.go` for the
//! 409 message, `skipnonapplied.go` for `before-first-apply`, `stripmeta.go` for the fields
//! nobody owns, `structuredmerge.go` for the typed-patch error). The schema is not modelled:
//! which lists are keyed and which fields Go omits when zero come from small tables of the
//! k8s.io/api types talboot's add-ons use; every other list is atomic, as for a CRD without
//! list annotations.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// The time stamped on managedFields entries (the double's clock for stored metadata).
pub(crate) const ENTRY_TIME: &str = "2026-11-30T00:00:00Z";

/// The manager the server invents for fields set before the first apply
/// (`skipnonapplied.go`, `beforeFirstApplyManager`).
pub(crate) const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Pe {
    /// A struct field or map key (`f:name`).
    Field(String),
    /// An element of a keyed list, by its key fields as compact JSON (`k:{...}`).
    Key(String),
    /// An element of a set, by value as JSON (`v:...`).
    Val(String),
}

/// A field path.
pub(crate) type Path = Vec<Pe>;
/// A set of owned fields: leaves, plus keyed list elements themselves.
pub(crate) type FieldSet = BTreeSet<Path>;

/// One managedFields entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// `manager`.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `apiVersion` the fields are recorded in.
    pub api_version: String,
    /// The fields.
    pub fields: FieldSet,
}

/// A field another manager owns that an apply would change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    /// The printed manager (`"x"`, or `"x" using v1 at <time>` for an Update entry).
    pub manager: String,
    /// The path as structured-merge-diff prints it.
    pub path: String,
}

/// Keys of the keyed lists (`x-kubernetes-list-type: map`) talboot's objects use, from the
/// `patchMergeKey`/`listMapKey` tags of k8s.io/api v0.36 core/v1 and apps/v1 types.go. A
/// list not named here is atomic: it is owned, and replaced, as a whole.
fn list_keys(field: &str, items: &[Value]) -> Option<&'static [&'static str]> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => &["name"],
        "volumeMounts" => &["mountPath"],
        "volumeDevices" => &["devicePath"],
        "hostAliases" => &["ip"],
        "conditions" => &["type"],
        "ownerReferences" => &["uid"],
        "topologySpreadConstraints" => &["topologyKey", "whenUnsatisfiable"],
        // ContainerPort: containerPort+protocol; ServicePort: port+protocol.
        "ports" if items.iter().any(|i| i.get("containerPort").is_some()) => {
            &["containerPort", "protocol"]
        }
        "ports" if items.iter().any(|i| i.get("port").is_some()) => &["port", "protocol"],
        _ => return None,
    })
}

/// The key of one keyed-list element as compact JSON with sorted keys; `protocol` defaults
/// to TCP as the server defaults it before merging.
fn item_key(keys: &[&str], item: &Value) -> String {
    let mut m = BTreeMap::new();
    for k in keys {
        match item.get(*k) {
            Some(v) => {
                m.insert(*k, v.clone());
            }
            None if *k == "protocol" => {
                m.insert(*k, json!("TCP"));
            }
            None => {}
        }
    }
    serde_json::to_string(&m).expect("a map of JSON values serialises")
}

/// Metadata fields nobody owns (`stripmeta.go`).
const STRIPPED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
];

/// The fields an object (an applied configuration, or a whole stored object) sets.
pub(crate) fn field_set(obj: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(m) = obj.as_object() else {
        return out;
    };
    for (k, v) in m {
        if matches!(k.as_str(), "apiVersion" | "kind" | "status") {
            continue;
        }
        let mut path = vec![Pe::Field(k.clone())];
        if k == "metadata" {
            for (mk, mv) in v.as_object().into_iter().flatten() {
                if STRIPPED_META.contains(&mk.as_str()) {
                    continue;
                }
                path.push(Pe::Field(mk.clone()));
                collect(mv, mk, &mut path, &mut out);
                path.pop();
            }
            continue;
        }
        collect(v, k, &mut path, &mut out);
    }
    out
}

/// Structs and maps owned as a whole (`+structType=atomic`, `+mapType=atomic` in k8s.io/api
/// v0.36: ObjectFieldSelector, ResourceFieldSelector, the key selectors, LabelSelector, a
/// Service's selector): a value that differs anywhere inside conflicts as one field.
const ATOMIC: &[&str] = &[
    "fieldRef",
    "resourceFieldRef",
    "secretKeyRef",
    "configMapKeyRef",
    "selector",
    "podSelector",
    "namespaceSelector",
];

fn collect(v: &Value, field: &str, path: &mut Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() && !ATOMIC.contains(&field) => {
            for (k, c) in m {
                path.push(Pe::Field(k.clone()));
                collect(c, k, path, out);
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match list_keys(field, items) {
            Some(keys) => {
                for item in items {
                    path.push(Pe::Key(item_key(keys, item)));
                    out.insert(path.clone());
                    for (k, c) in item.as_object().into_iter().flatten() {
                        path.push(Pe::Field(k.clone()));
                        collect(c, k, path, out);
                        path.pop();
                    }
                    path.pop();
                }
            }
            None => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The name of the field a path ends in (for a keyed list, the list's field).
fn last_field(path: &[Pe]) -> &str {
    path.iter()
        .rev()
        .find_map(|p| match p {
            Pe::Field(f) => Some(f.as_str()),
            _ => None,
        })
        .unwrap_or("")
}

/// The value at `path`, if the object has one.
pub(crate) fn get<'a>(obj: &'a Value, path: &[Pe]) -> Option<&'a Value> {
    let mut cur = obj;
    for (i, pe) in path.iter().enumerate() {
        cur = match pe {
            Pe::Field(f) => cur.as_object()?.get(f)?,
            Pe::Key(k) => {
                let items = cur.as_array()?;
                let keys = list_keys(last_field(&path[..i]), items)?;
                items.iter().find(|it| item_key(keys, it) == *k)?
            }
            Pe::Val(v) => cur
                .as_array()?
                .iter()
                .find(|it| serde_json::to_string(it).ok().as_deref() == Some(v.as_str()))?,
        };
    }
    Some(cur)
}

/// Removes the value at `path` (a keyed element: the element).
fn remove(obj: &mut Value, path: &[Pe]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let field = last_field(parent_path).to_owned();
    let Some(parent) = get_mut(obj, parent_path) else {
        return;
    };
    match (last, parent) {
        (Pe::Field(f), Value::Object(m)) => {
            m.remove(f);
        }
        (Pe::Key(k), Value::Array(items)) => {
            if let Some(keys) = list_keys(&field, items) {
                items.retain(|it| item_key(keys, it) != *k);
            }
        }
        _ => {}
    }
}

fn get_mut<'a>(obj: &'a mut Value, path: &[Pe]) -> Option<&'a mut Value> {
    let mut cur = obj;
    for (i, pe) in path.iter().enumerate() {
        cur = match pe {
            Pe::Field(f) => cur.as_object_mut()?.get_mut(f)?,
            Pe::Key(k) => {
                let field = last_field(&path[..i]).to_owned();
                let items = cur.as_array_mut()?;
                let keys = list_keys(&field, items)?;
                items.iter_mut().find(|it| item_key(keys, it) == *k)?
            }
            Pe::Val(_) => return None,
        };
    }
    Some(cur)
}

/// How structured-merge-diff prints a path (`fieldpath/element.go`, `PathElement.String`):
/// `.spec.containers[name="a"].image`.
pub(crate) fn print_path(path: &[Pe]) -> String {
    let mut s = String::new();
    for pe in path {
        match pe {
            Pe::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Pe::Key(k) => {
                let m: BTreeMap<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                s.push('[');
                s.push_str(&parts.join(","));
                s.push(']');
            }
            Pe::Val(v) => {
                s.push_str("[=");
                s.push_str(v);
                s.push(']');
            }
        }
    }
    s
}

/// The fieldsV1 tree of a set (`fieldpath/serialize.go`): `f:`/`k:`/`v:` keys, `{}` leaves,
/// and `.` marking a keyed element that is itself a member.
pub(crate) fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for pe in path {
            let key = match pe {
                Pe::Field(f) => format!("f:{f}"),
                Pe::Key(k) => format!("k:{k}"),
                Pe::Val(v) => format!("v:{v}"),
            };
            cur = cur
                .entry(key)
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("fieldsV1 nodes are objects");
        }
        if matches!(path.last(), Some(Pe::Key(_) | Pe::Val(_))) {
            cur.insert(".".into(), json!({}));
        }
    }
    Value::Object(root)
}

/// The set a fieldsV1 tree encodes.
pub(crate) fn from_fields_v1(tree: &Value) -> FieldSet {
    fn walk(node: &Map<String, Value>, path: &mut Path, out: &mut FieldSet) {
        for (k, child) in node {
            if k == "." {
                out.insert(path.clone());
                continue;
            }
            let pe = if let Some(f) = k.strip_prefix("f:") {
                Pe::Field(f.to_owned())
            } else if let Some(j) = k.strip_prefix("k:") {
                // Normalise the key JSON to the compact, sorted form used here.
                let m: BTreeMap<String, Value> = serde_json::from_str(j).unwrap_or_default();
                Pe::Key(serde_json::to_string(&m).unwrap_or_default())
            } else if let Some(v) = k.strip_prefix("v:") {
                Pe::Val(v.to_owned())
            } else {
                continue;
            };
            path.push(pe);
            match child.as_object() {
                Some(c) if !c.is_empty() => walk(c, path, out),
                _ => {
                    out.insert(path.clone());
                }
            }
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Some(m) = tree.as_object() {
        walk(m, &mut Vec::new(), &mut out);
    }
    out
}

/// The entries stored in an object's `metadata.managedFields`; `None` when it has none at
/// all (an object written before any field tracking, which `before-first-apply` covers).
pub(crate) fn entries_of(obj: &Value) -> Option<Vec<Entry>> {
    // An empty list counts as none: skipnonapplied.go checks `len(managed.Fields()) == 0`.
    let list = obj["metadata"]["managedFields"]
        .as_array()
        .filter(|l| !l.is_empty())?;
    Some(
        list.iter()
            .map(|e| Entry {
                manager: e["manager"].as_str().unwrap_or_default().to_owned(),
                operation: e["operation"].as_str().unwrap_or("Update").to_owned(),
                api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
                fields: from_fields_v1(&e["fieldsV1"]),
            })
            .collect(),
    )
}

/// Encodes entries as `metadata.managedFields`, Apply entries first then by manager, as
/// the server sorts them (`managedfields.go`, `sortEncodedManagedFields`, by operation then
/// time then manager).
pub(crate) fn encode(entries: &[Entry]) -> Value {
    let mut sorted: Vec<&Entry> = entries.iter().filter(|e| !e.fields.is_empty()).collect();
    sorted.sort_by(|a, b| (&a.operation, &a.manager).cmp(&(&b.operation, &b.manager)));
    Value::Array(
        sorted
            .into_iter()
            .map(|e| {
                json!({"manager": e.manager, "operation": e.operation,
                       "apiVersion": e.api_version, "time": ENTRY_TIME,
                       "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields)})
            })
            .collect(),
    )
}

fn printed_manager(e: &Entry) -> String {
    if e.operation == "Update" {
        format!("{:?} using {} at {ENTRY_TIME}", e.manager, e.api_version)
    } else {
        format!("{:?}", e.manager)
    }
}

/// The 409 message for `conflicts` (`conflict.go`, `ConflictsToString`-style wording the
/// API server builds in `NewConflictError`).
pub(crate) fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.manager, c.path
        );
    }
    let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by.entry(c.manager.as_str())
            .or_default()
            .push(c.path.as_str());
    }
    let mut lines = Vec::new();
    for (m, paths) in by {
        lines.push(format!("conflicts with {m}:"));
        lines.extend(paths.into_iter().map(|p| format!("- {p}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Deep merge of an applied configuration into the live object: maps field by field, keyed
/// lists element by element, everything else replaced (`merge/update.go` merges the typed
/// values this way).
fn merge(live: &Value, applied: &Value, field: &str) -> Value {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            let mut out = l.clone();
            for (k, av) in a {
                let merged = match l.get(k) {
                    Some(lv) => merge(lv, av, k),
                    None => av.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(a)) => match list_keys(field, a).or(list_keys(field, l)) {
            Some(keys) => {
                let mut out: Vec<Value> = Vec::new();
                for ai in a {
                    let k = item_key(keys, ai);
                    out.push(match l.iter().find(|li| item_key(keys, li) == k) {
                        Some(li) => merge(li, ai, field),
                        None => ai.clone(),
                    });
                }
                for li in l {
                    let k = item_key(keys, li);
                    if !a.iter().any(|ai| item_key(keys, ai) == k) {
                        out.push(li.clone());
                    }
                }
                Value::Array(out)
            }
            None => applied.clone(),
        },
        _ => applied.clone(),
    }
}

/// What one server-side apply does to an object and its managers.
pub(crate) struct Applied {
    /// The new object (not yet normalised by the typed round trip).
    pub object: Value,
    /// The new managedFields entries.
    pub entries: Vec<Entry>,
}

/// Server-side apply of `config` by `manager` over `live` (None: a create) with its
/// `entries` (None: an object without managedFields, whose fields then belong to
/// `before-first-apply`). Without `force`, a field another manager owns whose value the
/// apply would change is a conflict; with it, that field moves to `manager`. Fields the
/// manager applied before and no longer does are removed unless another manager owns them.
pub(crate) fn apply(
    live: Option<&Value>,
    entries: Option<Vec<Entry>>,
    config: &Value,
    manager: &str,
    api_version: &str,
    force: bool,
) -> Result<Applied, Vec<Conflict>> {
    let empty = json!({});
    let live_obj = live.unwrap_or(&empty);
    let mut entries = match (live, entries) {
        (Some(l), None) => vec![Entry {
            manager: BEFORE_FIRST_APPLY.into(),
            operation: "Update".into(),
            api_version: api_version.into(),
            fields: field_set(l),
        }],
        (_, e) => e.unwrap_or_default(),
    };
    let applied = field_set(config);
    let mut conflicts = Vec::new();
    let mut taken: Vec<Path> = Vec::new();
    for p in &applied {
        if matches!(p.last(), Some(Pe::Key(_))) {
            continue;
        }
        let (new, old) = (get(config, p), get(live_obj, p));
        if new == old {
            continue;
        }
        for e in &entries {
            let mine = e.manager == manager && e.operation == "Apply";
            if !mine && e.fields.contains(p) {
                conflicts.push(Conflict {
                    manager: printed_manager(e),
                    path: print_path(p),
                });
                taken.push(p.clone());
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    let mut object = merge(live_obj, config, "");
    let previous = entries
        .iter()
        .find(|e| e.manager == manager && e.operation == "Apply")
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    for e in &mut entries {
        for p in &taken {
            e.fields.remove(p);
        }
    }
    entries.retain(|e| !(e.manager == manager && e.operation == "Apply"));
    // Prune: what this manager stopped applying goes unless someone else still owns it.
    for p in previous.difference(&applied) {
        if !entries.iter().any(|e| e.fields.contains(p)) {
            remove(&mut object, p);
        }
    }
    entries.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        api_version: api_version.into(),
        fields: applied,
    });
    // update.go, Apply: managers left owning nothing are removed.
    entries.retain(|e| !e.fields.is_empty());
    Ok(Applied { object, entries })
}

/// An Update (create, replace, or a non-apply patch) by `manager` from `old` to `new`: the
/// fields it set or changed become its own and leave every other manager; fields that
/// disappeared leave everyone (`merge/update.go`, Update). Never a conflict.
pub(crate) fn update(
    old: Option<&Value>,
    entries: Option<Vec<Entry>>,
    new: &Value,
    manager: &str,
    api_version: &str,
) -> Vec<Entry> {
    let mut entries = entries.unwrap_or_default();
    let empty = json!({});
    let old = old.unwrap_or(&empty);
    let now = field_set(new);
    let changed: FieldSet = now
        .iter()
        .filter(|p| match p.last() {
            // A keyed element counts as added only when it is new; changes inside it are
            // reported at its leaves (SMD typed/compare.go).
            Some(Pe::Key(_)) => get(old, p).is_none(),
            _ => get(old, p) != get(new, p),
        })
        .cloned()
        .collect();
    for e in &mut entries {
        e.fields.retain(|p| now.contains(p) && !changed.contains(p));
    }
    match entries
        .iter_mut()
        .find(|e| e.manager == manager && e.operation == "Update")
    {
        Some(e) => e.fields.extend(changed),
        None => entries.push(Entry {
            manager: manager.into(),
            operation: "Update".into(),
            api_version: api_version.into(),
            fields: changed,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    entries
}

/// Fields whose Go type is a non-pointer with `omitempty` (k8s.io/api v0.36 core/v1,
/// apps/v1, networking/v1 types.go): a zero value there does not survive the typed round
/// trip, so the stored object never shows it (`readOnly: false` in a VolumeMount,
/// `initialDelaySeconds: 0`, `priorityClassName: ""`).
const OMITEMPTY_SCALARS: &[&str] = &[
    "readOnly",
    "initialDelaySeconds",
    "priorityClassName",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "stdin",
    "stdinOnce",
    "tty",
    "minReadySeconds",
    "subPath",
    "serviceAccountName",
    "hostname",
    "subdomain",
    "publishNotReadyAddresses",
    "value",
];

/// Maps and lists with `omitempty`: empty, they are dropped. (Empty structs such as
/// `emptyDir: {}` or `podSelector: {}` stay: their fields are not `omitempty` pointers.)
const OMITEMPTY_COLLECTIONS: &[&str] = &[
    "annotations",
    "labels",
    "ingress",
    "egress",
    "volumes",
    "volumeMounts",
    "env",
    "envFrom",
    "args",
    "command",
    "initContainers",
    "tolerations",
    "imagePullSecrets",
    "nodeSelector",
    "matchLabels",
    "matchExpressions",
    "data",
    "stringData",
    "finalizers",
    "policyTypes",
];

/// The typed round trip of a built-in kind: JSON nulls removed (an unset field), and the
/// zero values of `omitempty` fields dropped, as decoding into the Go type and encoding it
/// again does. Custom resources keep what was sent except nulls.
pub(crate) fn normalize(obj: &mut Value, builtin: bool) {
    fn walk(v: &mut Value, builtin: bool, in_map: bool) {
        match v {
            Value::Object(m) => {
                m.retain(|k, c| {
                    if c.is_null() {
                        return false;
                    }
                    if !builtin || in_map {
                        return true;
                    }
                    let zero = match c {
                        Value::Bool(b) => !*b,
                        Value::Number(n) => n.as_f64() == Some(0.0),
                        Value::String(s) => s.is_empty(),
                        _ => false,
                    };
                    let empty = match c {
                        Value::Object(o) => o.is_empty(),
                        Value::Array(a) => a.is_empty(),
                        _ => false,
                    };
                    !(zero && OMITEMPTY_SCALARS.contains(&k.as_str())
                        || empty && OMITEMPTY_COLLECTIONS.contains(&k.as_str()))
                });
                for (k, c) in m.iter_mut() {
                    // Values of string maps are data, not fields: "" stays there.
                    let map = matches!(
                        k.as_str(),
                        "labels"
                            | "annotations"
                            | "data"
                            | "stringData"
                            | "binaryData"
                            | "matchLabels"
                            | "nodeSelector"
                    );
                    walk(c, builtin, map);
                }
            }
            Value::Array(a) => {
                for c in a {
                    walk(c, builtin, false);
                }
            }
            _ => {}
        }
    }
    walk(obj, builtin, false);
    if builtin {
        default_field_refs(obj);
    }
}

/// The server's defaulting of `fieldRef.apiVersion` to `v1` (kubernetes/kubernetes v1.36.2
/// pkg/apis/core/v1/defaults.go, SetDefaults_ObjectFieldSelector).
fn default_field_refs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, c) in m.iter_mut() {
                if k == "fieldRef"
                    && let Some(r) = c.as_object_mut()
                {
                    r.entry("apiVersion").or_insert_with(|| json!("v1"));
                }
                default_field_refs(c);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(default_field_refs),
        _ => {}
    }
}

/// What the server adds to every Namespace it stores: the label
/// `kubernetes.io/metadata.name: <name>` (kubernetes/kubernetes v1.36.2
/// pkg/apis/core/v1/defaults.go, SetDefaults_Namespace, kept in sync by the strategy's
/// Canonicalize) and, on create, the `kubernetes` finalizer (pkg/registry/core/namespace/
/// strategy.go, PrepareForCreate; `spec.finalizers` is in its ResetFieldsFor). Neither is in
/// what the client applied, so nobody owns them.
pub(crate) fn namespace_strategy(ns: &mut Value) {
    let name = ns["metadata"]["name"].clone();
    if let Some(meta) = ns["metadata"].as_object_mut() {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        labels["kubernetes.io/metadata.name"] = name;
    }
    if ns["spec"]["finalizers"].is_null() {
        ns["spec"]["finalizers"] = json!(["kubernetes"]);
    }
}

/// Fields typed as integers in k8s.io/api (int32/int64, not IntOrString) that talboot's
/// add-ons set: a string there cannot be converted to the typed patch object.
const NUMERIC_FIELDS: &[&str] = &[
    "defaultMode",
    "mode",
    "initialDelaySeconds",
    "periodSeconds",
    "timeoutSeconds",
    "successThreshold",
    "failureThreshold",
    "replicas",
    "containerPort",
    "hostPort",
    "nodePort",
    "runAsUser",
    "runAsGroup",
    "fsGroup",
    "terminationGracePeriodSeconds",
    "revisionHistoryLimit",
    "minReadySeconds",
    "progressDeadlineSeconds",
];

/// The first field of a built-in object holding a string where the schema wants a number,
/// with the message structured-merge-diff gives (`typed/validate.go`, "expected numeric (int
/// or float), got string"), the path printed as a field path.
pub(crate) fn numeric_type_error(obj: &Value) -> Option<String> {
    fn walk(v: &Value, field: &str, path: &mut Path) -> Option<String> {
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    if c.is_string() && NUMERIC_FIELDS.contains(&k.as_str()) {
                        path.push(Pe::Field(k.clone()));
                        return Some(format!(
                            "{}: expected numeric (int or float), got string",
                            print_path(path)
                        ));
                    }
                    path.push(Pe::Field(k.clone()));
                    let r = walk(c, k, path);
                    path.pop();
                    if r.is_some() {
                        return r;
                    }
                }
                None
            }
            Value::Array(items) => {
                let keys = list_keys(field, items);
                for (i, c) in items.iter().enumerate() {
                    path.push(match keys {
                        Some(k) => Pe::Key(item_key(k, c)),
                        None => Pe::Val(i.to_string()),
                    });
                    let r = walk(c, field, path);
                    path.pop();
                    if r.is_some() {
                        return r;
                    }
                }
                None
            }
            _ => None,
        }
    }
    walk(obj, "", &mut Vec::new())
}

/// Applies a strategic merge patch (k8s.io/apimachinery pkg/util/strategicpatch/patch.go):
/// maps merge, `null` deletes, keyed lists merge by key (`$patch: delete` removes an
/// element), other lists are replaced; `$setElementOrder/...` and `$retainKeys` directives
/// are honoured for order and retention.
pub(crate) fn strategic_merge(target: &Value, patch: &Value, field: &str) -> Value {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            if p.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut r = p.clone();
                r.remove("$patch");
                return Value::Object(r);
            }
            let mut out = t.clone();
            if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
                out.retain(|k, _| keep.iter().any(|x| x == k));
            }
            for (k, pv) in p {
                if k.starts_with('$') {
                    continue;
                }
                if pv.is_null() {
                    out.remove(k);
                    continue;
                }
                let merged = match t.get(k) {
                    Some(tv) => strategic_merge(tv, pv, k),
                    None => strategic_merge(&Value::Null, pv, k),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, Value::Object(p)) => strategic_merge(&json!({}), &Value::Object(p.clone()), field),
        (Value::Array(t), Value::Array(p)) => match list_keys(field, p).or(list_keys(field, t)) {
            Some(keys) => {
                let mut out = t.clone();
                for pi in p {
                    let k = item_key(keys, pi);
                    let del = pi.get("$patch").and_then(Value::as_str) == Some("delete");
                    match out.iter().position(|ti| item_key(keys, ti) == k) {
                        Some(i) if del => {
                            out.remove(i);
                        }
                        Some(i) => out[i] = strategic_merge(&out[i], pi, field),
                        None if del => {}
                        None => out.push(strategic_merge(&Value::Null, pi, field)),
                    }
                }
                Value::Array(out)
            }
            None => patch.clone(),
        },
        _ => patch.clone(),
    }
}

/// Applies an RFC 7386 JSON merge patch.
pub(crate) fn json_merge(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = target.as_object().cloned().unwrap_or_default();
            for (k, pv) in p {
                if pv.is_null() {
                    out.remove(k);
                } else {
                    let cur = out.get(k).cloned().unwrap_or(Value::Null);
                    out.insert(k.clone(), json_merge(&cur, pv));
                }
            }
            Value::Object(out)
        }
        _ => patch.clone(),
    }
}

/// Applies an RFC 6902 JSON patch (add, replace, remove, test), as client-go's csaupgrade
/// sends one to rewrite `metadata.managedFields`. Errors name the failing operation.
pub(crate) fn json_patch(target: &Value, ops: &Value) -> Result<Value, String> {
    let mut doc = target.clone();
    for op in ops.as_array().ok_or("the JSON patch is not a list")? {
        let path = op["path"]
            .as_str()
            .ok_or("a JSON patch operation has no path")?;
        let ptr: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, parents) = ptr.split_last().ok_or("cannot patch the whole document")?;
        let parent_ptr: String = parents.iter().map(|p| format!("/{p}")).collect();
        let kind = op["op"].as_str().unwrap_or_default();
        if kind == "test" {
            if doc.pointer(path) != Some(&op["value"]) {
                return Err(format!("testing value {path} failed"));
            }
            continue;
        }
        let parent = doc
            .pointer_mut(&parent_ptr)
            .ok_or_else(|| format!("{kind} {path}: the parent does not exist"))?;
        match (kind, parent) {
            ("add" | "replace", Value::Object(m)) => {
                m.insert(last.clone(), op["value"].clone());
            }
            ("remove", Value::Object(m)) => {
                m.remove(last)
                    .ok_or_else(|| format!("remove {path}: no such field"))?;
            }
            ("add", Value::Array(a)) if last == "-" => a.push(op["value"].clone()),
            ("add" | "replace" | "remove", Value::Array(a)) => {
                let i: usize = last.parse().map_err(|_| format!("{path}: not an index"))?;
                if i > a.len() || (kind != "add" && i == a.len()) {
                    return Err(format!("{kind} {path}: index out of range"));
                }
                match kind {
                    "add" => a.insert(i, op["value"].clone()),
                    "replace" => a[i] = op["value"].clone(),
                    _ => {
                        a.remove(i);
                    }
                }
            }
            _ => return Err(format!("unsupported JSON patch operation {kind} at {path}")),
        }
    }
    Ok(doc)
}

/// The PodSecurity `restricted` checks a warn (or enforce) label makes the server report on
/// a workload, as pod-security-admission words them (kubernetes/kubernetes v1.36.2
/// staging/src/k8s.io/pod-security-admission/policy/check_allowPrivilegeEscalation.go,
/// check_capabilities_restricted.go, check_runAsNonRoot.go, check_seccompProfile_restricted.go;
/// admission/admission.go joins them after `would violate PodSecurity "restricted:latest": `).
pub(crate) fn pod_security_warning(namespace: &Value, obj: &Value) -> Option<String> {
    let labels = &namespace["metadata"]["labels"];
    let level = labels["pod-security.kubernetes.io/warn"]
        .as_str()
        .or(labels["pod-security.kubernetes.io/enforce"].as_str())?;
    if level != "restricted" {
        return None;
    }
    let version = labels["pod-security.kubernetes.io/warn-version"]
        .as_str()
        .unwrap_or("latest");
    let pod = match obj["kind"].as_str()? {
        "Pod" => &obj["spec"],
        "Deployment" | "DaemonSet" | "StatefulSet" | "ReplicaSet" | "Job" => {
            &obj["spec"]["template"]["spec"]
        }
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => return None,
    };
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|f| pod[*f].as_array().into_iter().flatten())
        .collect();
    let names = |pred: &dyn Fn(&Value) -> bool| -> Vec<String> {
        containers
            .iter()
            .filter(|c| pred(c))
            .map(|c| format!("{:?}", c["name"].as_str().unwrap_or_default()))
            .collect()
    };
    let which = |n: &[String]| {
        if n.len() == 1 {
            format!("container {}", n[0])
        } else {
            format!("containers {}", n.join(", "))
        }
    };
    let mut out = Vec::new();
    let ape = names(&|c| c["securityContext"]["allowPrivilegeEscalation"] != false);
    if !ape.is_empty() {
        out.push(format!(
            "allowPrivilegeEscalation != false ({} must set securityContext.allowPrivilegeEscalation=false)",
            which(&ape)
        ));
    }
    let caps = names(&|c| {
        !c["securityContext"]["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "ALL"))
    });
    if !caps.is_empty() {
        out.push(format!(
            "unrestricted capabilities ({} must set securityContext.capabilities.drop=[\"ALL\"])",
            which(&caps)
        ));
    }
    let pod_nonroot = pod["securityContext"]["runAsNonRoot"] == true;
    let nonroot = names(&|c| match &c["securityContext"]["runAsNonRoot"] {
        Value::Bool(b) => !b,
        _ => !pod_nonroot,
    });
    if !nonroot.is_empty() {
        out.push(format!(
            "runAsNonRoot != true (pod or {} must set securityContext.runAsNonRoot=true)",
            which(&nonroot)
        ));
    }
    let ok_profile = |p: &Value| matches!(p["type"].as_str(), Some("RuntimeDefault" | "Localhost"));
    let pod_seccomp = ok_profile(&pod["securityContext"]["seccompProfile"]);
    let seccomp = names(&|c| {
        let p = &c["securityContext"]["seccompProfile"];
        if p.is_null() {
            !pod_seccomp
        } else {
            !ok_profile(p)
        }
    });
    if !seccomp.is_empty() {
        out.push(format!(
            "seccompProfile (pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")",
            which(&seccomp)
        ));
    }
    if out.is_empty() {
        return None;
    }
    Some(format!(
        "would violate PodSecurity \"restricted:{version}\": {}",
        out.join(", ")
    ))
}

/// One protobuf field: number and value (varints as numbers, length-delimited as bytes).
enum PbValue<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// Splits a protobuf message into its fields (wire types 0, 1, 2 and 5; 1 and 5 skipped).
fn pb_fields(mut b: &[u8]) -> Result<Vec<(u64, PbValue<'_>)>, String> {
    fn varint(b: &mut &[u8]) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first().ok_or("truncated varint")?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let tag = varint(&mut b)?;
        let (num, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => out.push((num, PbValue::Varint(varint(&mut b)?))),
            2 => {
                let len = usize::try_from(varint(&mut b)?).map_err(|_| "length too large")?;
                if len > b.len() {
                    return Err(format!("field {num}: length {len} beyond the message"));
                }
                let (v, rest) = b.split_at(len);
                out.push((num, PbValue::Bytes(v)));
                b = rest;
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if n > b.len() {
                    return Err("truncated fixed-width field".into());
                }
                b = &b[n..];
            }
            w => return Err(format!("field {num}: unsupported wire type {w}")),
        }
    }
    Ok(out)
}

fn pb_str(v: &PbValue<'_>) -> Result<String, String> {
    match v {
        PbValue::Bytes(b) => String::from_utf8(b.to_vec()).map_err(|e| e.to_string()),
        PbValue::Varint(_) => Err("expected a string".into()),
    }
}

/// A `map<string, X>` entry: key 1, value 2.
fn pb_entry<'a>(v: &PbValue<'a>) -> Result<(String, &'a [u8]), String> {
    let PbValue::Bytes(b) = v else {
        return Err("expected a map entry".into());
    };
    let (mut key, mut value) = (String::new(), &b[..0]);
    for (n, f) in pb_fields(b)? {
        match (n, f) {
            (1, f) => key = pb_str(&f)?,
            (2, PbValue::Bytes(x)) => value = x,
            _ => {}
        }
    }
    Ok((key, value))
}

/// Decodes a Secret sent as Kubernetes protobuf into its JSON form: the `k8s\0` magic and a
/// runtime.Unknown (typeMeta 1, raw 2) around the Secret (metadata 1, data 2, type 3,
/// stringData 4, immutable 5), whose ObjectMeta gives name 1, generateName 2, namespace 3,
/// uid 5, resourceVersion 6, labels 11, annotations 12, finalizers 14 (k8s.io/api v0.36
/// core/v1/generated.proto, k8s.io/apimachinery v0.36.2 pkg/apis/meta/v1/generated.proto
/// and pkg/runtime/generated.proto).
pub(crate) fn protobuf_secret(body: &[u8]) -> Result<Value, String> {
    use base64::Engine as _;
    let unknown = body.strip_prefix(b"k8s\0").ok_or("no k8s protobuf magic")?;
    let mut raw = None;
    for (n, f) in pb_fields(unknown)? {
        if let (2, PbValue::Bytes(b)) = (n, f) {
            raw = Some(b);
        }
    }
    let raw = raw.ok_or("no raw object in the envelope")?;
    let mut obj = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {}});
    for (n, f) in pb_fields(raw)? {
        match n {
            1 => {
                let PbValue::Bytes(meta) = f else {
                    return Err("metadata is not a message".into());
                };
                for (mn, mf) in pb_fields(meta)? {
                    let key = match mn {
                        1 => "name",
                        2 => "generateName",
                        3 => "namespace",
                        5 => "uid",
                        6 => "resourceVersion",
                        11 | 12 => {
                            let (k, v) = pb_entry(&mf)?;
                            let map = if mn == 11 { "labels" } else { "annotations" };
                            obj["metadata"][map][k] =
                                json!(String::from_utf8_lossy(v).into_owned());
                            continue;
                        }
                        14 => {
                            let list = obj["metadata"]
                                .as_object_mut()
                                .expect("metadata is an object")
                                .entry("finalizers")
                                .or_insert_with(|| json!([]));
                            if let Some(a) = list.as_array_mut() {
                                a.push(json!(pb_str(&mf)?));
                            }
                            continue;
                        }
                        _ => continue,
                    };
                    let v = pb_str(&mf)?;
                    if !v.is_empty() {
                        obj["metadata"][key] = json!(v);
                    }
                }
            }
            2 => {
                let (k, v) = pb_entry(&f)?;
                obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(v));
            }
            3 => obj["type"] = json!(pb_str(&f)?),
            4 => {
                let (k, v) = pb_entry(&f)?;
                obj["stringData"][k] = json!(String::from_utf8_lossy(v).into_owned());
            }
            5 => {
                if let PbValue::Varint(b) = f {
                    obj["immutable"] = json!(b != 0);
                }
            }
            _ => {}
        }
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(read_only: Value, delay: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "n", "annotations": {}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
                "readinessProbe": {"initialDelaySeconds": delay},
                "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": read_only}]}]}}}})
    }

    #[test]
    fn fields_v1_round_trips_and_prints_like_smd() {
        let set = field_set(&deploy(json!(false), json!(0)));
        let tree = to_fields_v1(&set);
        assert_eq!(from_fields_v1(&tree), set);
        let c = &tree["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"];
        assert_eq!(c["."], json!({}));
        assert_eq!(
            c["f:volumeMounts"]["k:{\"mountPath\":\"/v\"}"]["f:readOnly"],
            json!({})
        );
        let p = set
            .iter()
            .find(|p| p.last() == Some(&Pe::Field("readOnly".into())))
            .unwrap();
        assert_eq!(
            print_path(p),
            ".spec.template.spec.containers[name=\"c\"].volumeMounts[mountPath=\"/v\"].readOnly"
        );
        assert!(
            !set.iter()
                .any(|p| p.get(1) == Some(&Pe::Field("name".into())))
        );
    }

    /// The Helm take-over failure: a second applier of the same manifest conflicts
    /// on every zero value the typed round trip dropped.
    #[test]
    fn a_second_applier_of_the_same_manifest_conflicts_on_dropped_zero_values() {
        let cfg = deploy(json!(false), json!(0));
        let created = apply(None, None, &cfg, "talboot", "apps/v1", true).unwrap();
        let mut stored = created.object;
        normalize(&mut stored, true);
        assert!(
            get(
                &stored,
                &[
                    Pe::Field("metadata".into()),
                    Pe::Field("annotations".into())
                ]
            )
            .is_none()
        );
        // The same manager again: no conflict, nothing changes.
        let again = apply(
            Some(&stored),
            Some(created.entries.clone()),
            &cfg,
            "talboot",
            "apps/v1",
            false,
        )
        .unwrap();
        let mut again_obj = again.object;
        normalize(&mut again_obj, true);
        assert_eq!(again_obj, stored);
        assert_eq!(again.entries, created.entries);
        // Another manager: three conflicts, named as the server names them.
        let err = apply(
            Some(&stored),
            Some(created.entries.clone()),
            &cfg,
            "helm",
            "apps/v1",
            false,
        )
        .err()
        .expect("conflicts");
        let msg = conflict_message(&err);
        assert!(
            msg.starts_with("Apply failed with 3 conflicts: conflicts with \"talboot\":\n- "),
            "{msg}"
        );
        assert!(msg.contains("- .metadata.annotations"), "{msg}");
        assert!(
            msg.contains("].readinessProbe.initialDelaySeconds"),
            "{msg}"
        );
        // Forced, the fields move; shared ones stay shared.
        let forced = apply(
            Some(&stored),
            Some(created.entries),
            &cfg,
            "helm",
            "apps/v1",
            true,
        )
        .unwrap();
        let talboot = forced
            .entries
            .iter()
            .find(|e| e.manager == "talboot")
            .unwrap();
        assert!(
            !talboot
                .fields
                .iter()
                .any(|p| print_path(p) == ".metadata.annotations")
        );
        assert!(
            talboot
                .fields
                .iter()
                .any(|p| print_path(p).ends_with(".image"))
        );
    }

    #[test]
    fn a_manager_owning_nothing_is_dropped_and_before_first_apply_covers_old_fields() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}});
        let created = apply(None, None, &ns, "talboot", "v1", true).unwrap();
        assert!(created.entries.is_empty());
        let live = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "a", "labels": {"kubernetes.io/metadata.name": "a"}}});
        let second = apply(Some(&live), Some(vec![]), &ns, "talboot", "v1", true).unwrap();
        assert!(second.entries.is_empty());
        let untracked = apply(Some(&live), None, &ns, "talboot", "v1", true).unwrap();
        assert_eq!(untracked.entries.len(), 1);
        assert_eq!(untracked.entries[0].manager, BEFORE_FIRST_APPLY);
    }

    #[test]
    fn update_takes_changed_fields_and_never_conflicts() {
        let old = deploy(json!(true), json!(5));
        let owned = apply(None, None, &old, "talboot", "apps/v1", true)
            .unwrap()
            .entries;
        let new = deploy(json!(true), json!(7));
        let e = update(Some(&old), Some(owned), &new, "helm", "apps/v1");
        let helm = e.iter().find(|e| e.manager == "helm").unwrap();
        assert_eq!(helm.fields.len(), 1);
        assert!(print_path(helm.fields.iter().next().unwrap()).ends_with("initialDelaySeconds"));
    }

    #[test]
    fn patches_and_typed_errors() {
        let t = deploy(json!(true), json!(5));
        let p = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "c"}],
            "containers": [{"name": "c", "image": "j"}, {"name": "x", "$patch": "delete"}]}}}});
        let out = strategic_merge(&t, &p, "");
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "j"
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["initialDelaySeconds"],
            5
        );
        assert_eq!(
            json_merge(&json!({"a": 1, "b": 2}), &json!({"a": null, "c": 3})),
            json!({"b": 2, "c": 3})
        );
        let jp = json!([{"op": "test", "path": "/a", "value": 1}, {"op": "replace", "path": "/a", "value": 2}]);
        assert_eq!(json_patch(&json!({"a": 1}), &jp).unwrap(), json!({"a": 2}));
        assert!(json_patch(&json!({"a": 3}), &jp).is_err());
        let bad = json!({"spec": {"template": {"spec": {"volumes": [{"name": "v",
            "projected": {"defaultMode": "0400"}}]}}}});
        assert_eq!(
            numeric_type_error(&bad).unwrap(),
            ".spec.template.spec.volumes[name=\"v\"].projected.defaultMode: expected numeric (int or float), got string"
        );
    }

    #[test]
    fn pod_security_restricted_warning_wording() {
        let ns = json!({"metadata": {"labels": {"pod-security.kubernetes.io/warn": "restricted"}}});
        let d = deploy(json!(true), json!(1));
        let w = pod_security_warning(&ns, &d).unwrap();
        assert_eq!(
            w,
            "would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false \
             (container \"c\" must set securityContext.allowPrivilegeEscalation=false), \
             unrestricted capabilities (container \"c\" must set \
             securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or \
             container \"c\" must set securityContext.runAsNonRoot=true), seccompProfile (pod \
             or container \"c\" must set securityContext.seccompProfile.type to \
             \"RuntimeDefault\" or \"Localhost\")"
        );
        assert!(pod_security_warning(&json!({}), &d).is_none());
    }

    /// A Secret as client-go's protobuf encoder writes it (hand-assembled wire bytes).
    #[test]
    fn protobuf_secrets_decode() {
        fn field(n: u8, payload: &[u8]) -> Vec<u8> {
            let mut v = vec![(n << 3) | 2, payload.len() as u8];
            v.extend_from_slice(payload);
            v
        }
        let entry = |k: &str, v: &[u8]| [field(1, k.as_bytes()), field(2, v)].concat();
        let meta = [
            field(1, b"sh.helm.release.v1.relay.v2"),
            field(3, b"hubble"),
            field(11, &entry("owner", b"helm")),
        ]
        .concat();
        let secret = [
            field(1, &meta),
            field(2, &entry("release", b"\x00\x01")),
            field(3, b"helm.sh/release.v1"),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"Secret")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &secret)].concat();
        assert_eq!(
            protobuf_secret(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
                "metadata": {"name": "sh.helm.release.v1.relay.v2", "namespace": "hubble",
                    "labels": {"owner": "helm"}},
                "data": {"release": "AAE="}})
        );
        assert!(protobuf_secret(b"{}").is_err());
    }
}
