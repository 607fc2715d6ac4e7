//! Strategic merge: merging a patch value into a config value under the rules of
//! [`super::rules`], and applying a whole strategic merge patch (its deletes first, through
//! [`super::delete`], then the rest, adding documents the config does not have yet).

use yaml_serde::{Mapping, Value};

use super::delete::{apply_selector, prepare};
use super::error::{Absence, PatchProblem};
use super::identity::{DocId, V1ALPHA1, position, shape};
use super::rules::{ListKey, Path, Rule, rule_for};

/// Where the merge is, for rule lookup and errors.
struct Cx<'a> {
    id: &'a DocId,
    path: Path,
}

impl Cx<'_> {
    fn mismatch(&self, base: &Value, patch: &Value) -> PatchProblem {
        PatchProblem::TypeMismatch {
            id: Box::new(self.id.clone()),
            path: self.path.to_string(),
            base: shape(base),
            patch: shape(patch),
        }
    }
}

/// `""` and `0` are Go zero values: `merge.go` does not copy them over a set value.
fn is_zero_scalar(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn is_container(v: &Value) -> bool {
    matches!(v, Value::Mapping(_) | Value::Sequence(_))
}

/// Merge `patch` into `base` under `rule`.
fn merge_value(
    base: &mut Value,
    patch: Value,
    rule: Rule,
    cx: &mut Cx<'_>,
) -> Result<(), PatchProblem> {
    if patch.is_null() {
        return Ok(());
    }
    if rule == Rule::Replace {
        *base = patch;
        return Ok(());
    }
    if base.is_null() {
        // Nothing to merge with: merge into an empty container of the patch's shape, so the
        // rules of nested paths still apply (a keyed list merges its own duplicates, as Talos
        // merges each element into the growing list).
        match &patch {
            Value::Mapping(_) => *base = Value::Mapping(Mapping::new()),
            Value::Sequence(_) => *base = Value::Sequence(Vec::new()),
            _ => {
                *base = patch;
                return Ok(());
            }
        }
    }
    match patch {
        Value::Mapping(pm) => match base {
            Value::Mapping(bm) if rule == Rule::Args => {
                // meta.Args.Merge is maps.Copy: each argument's value is replaced outright.
                for (k, v) in pm {
                    if !v.is_null() {
                        bm.insert(k, v);
                    }
                }
                Ok(())
            }
            Value::Mapping(bm) => merge_mapping(bm, pm, cx),
            other => Err(cx.mismatch(other, &Value::Mapping(Mapping::new()))),
        },
        Value::Sequence(ps) => match base {
            Value::Sequence(bs) => match rule {
                Rule::Keyed(key) => merge_keyed(bs, ps, key, cx),
                _ => {
                    bs.extend(ps);
                    Ok(())
                }
            },
            other => Err(cx.mismatch(other, &Value::Sequence(Vec::new()))),
        },
        scalar => {
            if is_container(base) {
                return Err(cx.mismatch(base, &scalar));
            }
            if !is_zero_scalar(&scalar) {
                *base = scalar;
            }
            Ok(())
        }
    }
}

fn merge_mapping(base: &mut Mapping, patch: Mapping, cx: &mut Cx<'_>) -> Result<(), PatchProblem> {
    for (key, value) in patch {
        cx.path.push_key(&key);
        let rule = rule_for(cx.id.rule_kind(), &cx.path.pattern());
        match base.get_mut(&key) {
            Some(existing) => merge_value(existing, value, rule, cx)?,
            None if value.is_null() => {}
            None => {
                let mut fresh = Value::Null;
                merge_value(&mut fresh, value, rule, cx)?;
                base.insert(key, fresh);
            }
        }
        cx.path.pop();
    }
    Ok(())
}

fn merge_keyed(
    base: &mut Vec<Value>,
    patch: Vec<Value>,
    key: ListKey,
    cx: &mut Cx<'_>,
) -> Result<(), PatchProblem> {
    for (i, element) in patch.into_iter().enumerate() {
        cx.path.push_index(i);
        if !matches!(element, Value::Mapping(_)) {
            return Err(PatchProblem::KeyedElementNotMapping {
                id: Box::new(cx.id.clone()),
                path: cx.path.to_string(),
                key: key.label(),
                found: shape(&element),
            });
        }
        match base
            .iter()
            .position(|existing| key.matches(existing, &element))
        {
            Some(j) => merge_value(&mut base[j], element, Rule::Default, cx)?,
            None => {
                let mut fresh = Value::Null;
                merge_value(&mut fresh, element, Rule::Default, cx)?;
                base.push(fresh);
            }
        }
        cx.path.pop();
    }
    Ok(())
}

/// Apply a strategic merge patch (its documents) to `docs`.
pub(super) fn apply_merge(docs: &mut Vec<Value>, patch: &[Value]) -> Result<(), PatchProblem> {
    let prepared = patch
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, d)| prepare(i, d))
        .collect::<Result<Vec<_>, _>>()?;

    for (j, later) in prepared.iter().enumerate() {
        let clash = prepared[..j].iter().find(|earlier| {
            earlier.id == later.id
                && earlier.delete_doc == later.delete_doc
                && (earlier.delete_doc || (earlier.body.is_some() && later.body.is_some()))
        });
        if let Some(earlier) = clash {
            return Err(PatchProblem::DuplicateDocument {
                first: earlier.index,
                second: later.index,
                id: Box::new(later.id.clone()),
            });
        }
    }

    // Talos applies every delete of a patch before merging the rest of it.
    for p in &prepared {
        if p.delete_doc {
            let at =
                position(docs, &p.id).ok_or_else(|| PatchProblem::DocumentToDeleteMissing {
                    id: Box::new(p.id.clone()),
                })?;
            docs.remove(at);
            continue;
        }
        if let Some(first) = p.selectors.first() {
            let at = position(docs, &p.id).ok_or_else(|| PatchProblem::NothingToDelete {
                id: Box::new(p.id.clone()),
                path: first.path().to_string(),
                why: Absence::NoDocument,
            })?;
            for selector in &p.selectors {
                apply_selector(&mut docs[at], selector, &p.id)?;
            }
        }
    }

    for p in prepared {
        let Some(body) = p.body else { continue };
        let mut cx = Cx {
            id: &p.id,
            path: Path::default(),
        };
        match position(docs, &p.id) {
            Some(at) => merge_value(&mut docs[at], body, Rule::Default, &mut cx)?,
            None => {
                let mut fresh = Value::Null;
                merge_value(&mut fresh, body, Rule::Default, &mut cx)?;
                if p.id == DocId::V1Alpha1 {
                    // A v1alpha1 fragment rarely says `version`; the loader needs it.
                    if let Value::Mapping(m) = &mut fresh
                        && !m.contains_key("version")
                    {
                        let mut with_version = Mapping::new();
                        with_version.insert(Value::from("version"), Value::from(V1ALPHA1));
                        with_version.extend(std::mem::take(m));
                        *m = with_version;
                    }
                    docs.insert(0, fresh);
                } else {
                    docs.push(fresh);
                }
            }
        }
    }
    Ok(())
}
