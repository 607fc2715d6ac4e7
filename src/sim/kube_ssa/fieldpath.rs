//! Field paths and field sets as structured-merge-diff keeps them: which fields an object
//! sets (keyed lists element by element, atomic lists and structs whole), how a path prints
//! in a conflict, and the `fieldsV1` encoding of a set in `metadata.managedFields`.
//!
//! Modelled on kubernetes-sigs/structured-merge-diff v6.3.2 (`fieldpath/serialize.go`: the
//! fieldsV1 encoding; `fieldpath/element.go`: how a path prints) and kubernetes/kubernetes
//! v1.36.2 (`staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/stripmeta.go`
//! for the fields nobody owns). The schema is not modelled: which lists are keyed comes from
//! a small table of the k8s.io/api types talboot's add-ons use; every other list is atomic,
//! as for a CRD without list annotations.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

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

/// Keys of the keyed lists (`x-kubernetes-list-type: map`) talboot's objects use, from the
/// `patchMergeKey`/`listMapKey` tags of k8s.io/api v0.36 core/v1 and apps/v1 types.go. A
/// list not named here is atomic: it is owned, and replaced, as a whole.
pub(super) fn list_keys(field: &str, items: &[Value]) -> Option<&'static [&'static str]> {
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
pub(super) fn item_key(keys: &[&str], item: &Value) -> String {
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
pub(super) fn remove(obj: &mut Value, path: &[Pe]) {
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
