//! The patch kinds clients other than server-side apply send: strategic merge (kubectl,
//! Helm), RFC 7386 JSON merge and RFC 6902 JSON patch (client-go's csaupgrade).

use serde_json::{Value, json};

use super::fieldpath::{item_key, list_keys};

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
pub(crate) fn json_patch(target: &Value, ops: &Value) -> Result<Value, JsonPatchError> {
    let mut doc = target.clone();
    for op in ops.as_array().ok_or(JsonPatchError::NotAList)? {
        let path = op["path"].as_str().ok_or(JsonPatchError::NoPath)?;
        let ptr: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, parents) = ptr.split_last().ok_or(JsonPatchError::WholeDocument)?;
        let parent_ptr: String = parents.iter().map(|p| format!("/{p}")).collect();
        let kind = op["op"].as_str().unwrap_or_default();
        let at = || (kind.to_owned(), path.to_owned());
        if kind == "test" {
            if doc.pointer(path) != Some(&op["value"]) {
                return Err(JsonPatchError::TestFailed(path.to_owned()));
            }
            continue;
        }
        let parent = doc.pointer_mut(&parent_ptr).ok_or_else(|| {
            let (kind, path) = at();
            JsonPatchError::NoParent { kind, path }
        })?;
        match (kind, parent) {
            ("add" | "replace", Value::Object(m)) => {
                m.insert(last.clone(), op["value"].clone());
            }
            ("remove", Value::Object(m)) => {
                m.remove(last)
                    .ok_or_else(|| JsonPatchError::NoSuchField(path.to_owned()))?;
            }
            ("add", Value::Array(a)) if last == "-" => a.push(op["value"].clone()),
            ("add" | "replace" | "remove", Value::Array(a)) => {
                let i: usize = last
                    .parse()
                    .map_err(|_| JsonPatchError::NotAnIndex(path.to_owned()))?;
                if i > a.len() || (kind != "add" && i == a.len()) {
                    let (kind, path) = at();
                    return Err(JsonPatchError::OutOfRange { kind, path });
                }
                match kind {
                    "add" => a.insert(i, op["value"].clone()),
                    "replace" => a[i] = op["value"].clone(),
                    _ => {
                        a.remove(i);
                    }
                }
            }
            _ => {
                let (kind, path) = at();
                return Err(JsonPatchError::Unsupported { kind, path });
            }
        }
    }
    Ok(doc)
}

/// Why a JSON patch was refused; the API server returns it as a 422 `Invalid`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JsonPatchError {
    /// The body is not a JSON array of operations.
    #[error("the JSON patch is not a list")]
    NotAList,
    /// An operation lacks `path`.
    #[error("a JSON patch operation has no path")]
    NoPath,
    /// The path is the document root, which this double does not patch.
    #[error("cannot patch the whole document")]
    WholeDocument,
    /// A `test` operation found another value (the path).
    #[error("testing value {0} failed")]
    TestFailed(String),
    /// The container the operation writes into is missing.
    #[error("{kind} {path}: the parent does not exist")]
    NoParent {
        /// The operation.
        kind: String,
        /// Its path.
        path: String,
    },
    /// A `remove` of a field the object does not have (the path).
    #[error("remove {0}: no such field")]
    NoSuchField(String),
    /// An array step that is not a number (the path).
    #[error("{0}: not an index")]
    NotAnIndex(String),
    /// An array index past the end.
    #[error("{kind} {path}: index out of range")]
    OutOfRange {
        /// The operation.
        kind: String,
        /// Its path.
        path: String,
    },
    /// An operation this double does not model (`move`, `copy`) or one that does not fit
    /// its target.
    #[error("unsupported JSON patch operation {kind} at {path}")]
    Unsupported {
        /// The operation.
        kind: String,
        /// Its path.
        path: String,
    },
}
