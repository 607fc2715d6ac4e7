//! The typed round trip of a built-in kind as the API server does it on every write: nulls
//! and the zero values of `omitempty` fields dropped, the defaults the server fills in
//! (`fieldRef.apiVersion`, a Namespace's name label and finalizer), and the refusal of a
//! string where the Go type holds a number. Which fields are `omitempty` or numeric comes
//! from small tables of the k8s.io/api types talboot's add-ons use.

use serde_json::{Value, json};

use super::fieldpath::{Path, Pe, item_key, list_keys, print_path};

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
