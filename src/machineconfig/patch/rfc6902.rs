//! RFC 6902 JSON patches (via the `json-patch` crate) on the v1alpha1 document: the YAML <-> JSON
//! conversion and the checks that give each bad operation a message naming it.

use yaml_serde::{Mapping, Value};

use super::error::PatchProblem;
use super::identity::{DocId, position, scalar_text, shape};
use super::rules::Path;

fn yaml_to_json(v: &Value, path: &mut Path) -> Result<serde_json::Value, PatchProblem> {
    let not_json = |path: &Path, reason| PatchProblem::NotJson {
        path: path.to_string(),
        reason,
    };
    Ok(match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                serde_json::Value::from(i)
            } else if let Some(u) = n.as_u64() {
                serde_json::Value::from(u)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(f)
                    .map(serde_json::Value::Number)
                    .ok_or_else(|| not_json(path, "a NaN or infinite number"))?
            }
        }
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                path.push_index(i);
                out.push(yaml_to_json(item, path)?);
                path.pop();
            }
            serde_json::Value::Array(out)
        }
        Value::Mapping(map) => {
            let mut out = serde_json::Map::with_capacity(map.len());
            for (k, item) in map {
                // JSON keys are strings; scalar YAML keys become their text, as ghodss/yaml does.
                let key = scalar_text(k)
                    .ok_or_else(|| not_json(path, "a mapping key that is not a scalar"))?;
                path.push_key(k);
                out.insert(key, yaml_to_json(item, path)?);
                path.pop();
            }
            serde_json::Value::Object(out)
        }
        // JSON has no tags; Talos's YAMLToJSON drops them too.
        Value::Tagged(t) => yaml_to_json(&t.value, path)?,
    })
}

fn json_to_yaml(v: serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Number(i.into())
            } else if let Some(u) = n.as_u64() {
                Value::Number(u.into())
            } else {
                Value::Number(n.as_f64().unwrap_or(f64::NAN).into())
            }
        }
        serde_json::Value::String(s) => Value::String(s),
        serde_json::Value::Array(items) => {
            Value::Sequence(items.into_iter().map(json_to_yaml).collect())
        }
        serde_json::Value::Object(map) => {
            let mut out = Mapping::with_capacity(map.len());
            for (k, item) in map {
                out.insert(Value::String(k), json_to_yaml(item));
            }
            Value::Mapping(out)
        }
    }
}

/// The RFC 6902 name of an operation.
fn op_name(op: &json_patch::PatchOperation) -> &'static str {
    use json_patch::PatchOperation as Op;
    match op {
        Op::Add(_) => "add",
        Op::Remove(_) => "remove",
        Op::Replace(_) => "replace",
        Op::Move(_) => "move",
        Op::Copy(_) => "copy",
        Op::Test(_) => "test",
    }
}

/// Check and decode the operations, with messages that name the operation and never echo a
/// value (a patch may carry a token).
fn json_operations(ops: &[Value]) -> Result<Vec<json_patch::PatchOperation>, PatchProblem> {
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let bad = |reason: String| PatchProblem::JsonBadOperation { op: i, reason };
        let json = yaml_to_json(op, &mut Path::default()).map_err(|e| bad(e.to_string()))?;
        let Some(obj) = json.as_object() else {
            return Err(bad(format!(
                "is a {}, not a mapping with `op` and `path`",
                shape(op)
            )));
        };
        let name = obj
            .get("op")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(
                || bad("has no `op` (add, remove, replace, move, copy or test)".to_owned()),
            )?
            .to_owned();
        let needs: &[&str] = match name.as_str() {
            "add" | "replace" | "test" => &["path", "value"],
            "remove" => &["path"],
            "move" | "copy" => &["path", "from"],
            _ => {
                return Err(bad(format!(
                    "`op: {name}` is not an RFC 6902 operation (add, remove, replace, move, copy or test)"
                )));
            }
        };
        for field in needs {
            if !obj.contains_key(*field) {
                return Err(bad(format!("`{name}` needs `{field}`")));
            }
        }
        for field in ["path", "from"] {
            if let Some(ptr) = obj.get(field)
                && !ptr
                    .as_str()
                    .is_some_and(|p| p.is_empty() || p.starts_with('/'))
            {
                return Err(bad(format!(
                    "`{field}` must be a JSON pointer such as `/machine/network/hostname`"
                )));
            }
        }
        let decoded = serde_json::from_value(json)
            .map_err(|_| bad(format!("is not a valid `{name}` operation (check `path` and `from` escaping: `~0` for `~`, `~1` for `/`)")))?;
        out.push(decoded);
    }
    Ok(out)
}

/// Apply RFC 6902 operations to the v1alpha1 document of `docs`.
pub(super) fn apply_json(docs: &mut [Value], ops: &[Value]) -> Result<(), PatchProblem> {
    let ops = json_operations(ops)?;
    let at = position(docs, &DocId::V1Alpha1).ok_or(PatchProblem::JsonWithoutV1Alpha1)?;
    let mut json = yaml_to_json(&docs[at], &mut Path::default())?;
    // json_patch::patch undoes every operation when one fails, so the document stays whole.
    json_patch::patch(&mut json, &ops).map_err(|e| PatchProblem::JsonFailed {
        op: e.operation,
        name: ops.get(e.operation).map_or("?", op_name),
        path: e.path.to_string(),
        reason: e.kind.to_string(),
    })?;
    let patched = json_to_yaml(json);
    if !matches!(patched, Value::Mapping(_)) {
        return Err(PatchProblem::JsonResultNotMapping {
            found: shape(&patched),
        });
    }
    docs[at] = patched;
    Ok(())
}
