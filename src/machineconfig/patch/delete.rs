//! `$patch: delete`: finding the delete markers in a patch document ([`Selector`]s), splitting
//! them from the part left to merge, and applying them to the config.

use yaml_serde::{Mapping, Value};

use super::error::{Absence, PatchProblem};
use super::identity::{DocId, IdFault, identify, scalar_text, shape};
use super::rules::{Path, Seg, key_text};

/// The directive key Talos recognises inside patches.
const DIRECTIVE: &str = "$patch";
/// The only directive value Talos knows.
const DELETE: &str = "delete";
/// Keys that identify a document rather than configure it.
const IDENTITY_KEYS: [&str; 4] = ["version", "apiVersion", "kind", "name"];

/// A delete found in a patch document.
#[derive(Debug)]
pub(super) enum Selector {
    /// Remove the key at this path (keys only).
    Key(Path),
    /// Remove the first element of the list at `list` whose `key` has this text.
    Element {
        list: Path,
        key: Value,
        value: String,
    },
}

impl Selector {
    pub(super) fn path(&self) -> &Path {
        match self {
            Selector::Key(p) => p,
            Selector::Element { list, .. } => list,
        }
    }
}

/// A patch document split into its deletes and the part left to merge.
pub(super) struct DocPatch {
    pub(super) index: usize,
    pub(super) id: DocId,
    /// The whole document is to be removed.
    pub(super) delete_doc: bool,
    pub(super) selectors: Vec<Selector>,
    /// What remains to merge; `None` when nothing but the identity is left.
    pub(super) body: Option<Value>,
}

/// Take the delete markers out of `node`, recording them. Returns whether `node` itself is to
/// be removed from its parent: it was a marker, or removing markers emptied it.
fn strip(
    node: &mut Value,
    in_list: bool,
    path: &mut Path,
    found: &mut Vec<Selector>,
    id: &DocId,
) -> Result<bool, PatchProblem> {
    match node {
        Value::Mapping(map) => {
            if let Some(directive) = map.get(DIRECTIVE) {
                if directive.as_str() != Some(DELETE) {
                    return Err(PatchProblem::UnsupportedDirective {
                        id: Box::new(id.clone()),
                        path: path.to_string(),
                        value: scalar_text(directive)
                            .unwrap_or_else(|| shape(directive).to_owned()),
                    });
                }
                if in_list {
                    let mut list = path.clone();
                    list.pop();
                    if list.has_index() {
                        return Err(PatchProblem::DeleteInNestedList {
                            id: Box::new(id.clone()),
                            path: path.to_string(),
                        });
                    }
                    // Talos selects by the first key:value beside the directive.
                    let selector = map.iter().find(|(k, _)| k.as_str() != Some(DIRECTIVE));
                    let Some((key, value)) =
                        selector.and_then(|(k, v)| Some((k.clone(), scalar_text(v)?)))
                    else {
                        return Err(PatchProblem::DeleteWithoutSelector {
                            id: Box::new(id.clone()),
                            path: path.to_string(),
                        });
                    };
                    found.push(Selector::Element { list, key, value });
                } else {
                    if path.has_index() {
                        return Err(PatchProblem::DeleteInsideListElement {
                            id: Box::new(id.clone()),
                            path: path.to_string(),
                        });
                    }
                    found.push(Selector::Key(path.clone()));
                }
                return Ok(true);
            }
            let had_entries = !map.is_empty();
            strip_entries(map, path, found, id)?;
            Ok(had_entries && map.is_empty())
        }
        Value::Sequence(items) => {
            let had_entries = !items.is_empty();
            let mut kept = Vec::with_capacity(items.len());
            for (i, mut item) in std::mem::take(items).into_iter().enumerate() {
                path.push_index(i);
                let remove = strip(&mut item, true, path, found, id)?;
                path.pop();
                if !remove {
                    kept.push(item);
                }
            }
            *items = kept;
            Ok(had_entries && items.is_empty())
        }
        _ => Ok(false),
    }
}

/// Strip every entry of `map`, dropping entries that were markers or that stripping emptied.
fn strip_entries(
    map: &mut Mapping,
    path: &mut Path,
    found: &mut Vec<Selector>,
    id: &DocId,
) -> Result<(), PatchProblem> {
    let keys: Vec<Value> = map.keys().cloned().collect();
    for key in keys {
        let Some(child) = map.get_mut(&key) else {
            continue;
        };
        path.push_key(&key);
        let remove = strip(child, false, path, found, id)?;
        path.pop();
        if remove {
            map.shift_remove(&key);
        }
    }
    Ok(())
}

/// Identify a patch document and split off its deletes.
pub(super) fn prepare(index: usize, doc: Value) -> Result<DocPatch, PatchProblem> {
    let id = identify(&doc).map_err(|fault| match fault {
        IdFault::NotMapping(found) => PatchProblem::DocNotMapping { doc: index, found },
        IdFault::NotText(field) => PatchProblem::BadIdentity { doc: index, field },
        IdFault::MissingApiVersion(kind) => PatchProblem::MissingApiVersion { doc: index, kind },
    })?;
    let Value::Mapping(mut map) = doc else {
        return Err(PatchProblem::DocNotMapping {
            doc: index,
            found: shape(&doc),
        });
    };
    if let Some(directive) = map.get(DIRECTIVE) {
        if directive.as_str() != Some(DELETE) {
            return Err(PatchProblem::UnsupportedDirective {
                id: Box::new(id),
                path: Path::default().to_string(),
                value: scalar_text(directive).unwrap_or_else(|| shape(directive).to_owned()),
            });
        }
        if id == DocId::V1Alpha1 {
            return Err(PatchProblem::DeleteV1Alpha1);
        }
        return Ok(DocPatch {
            index,
            id,
            delete_doc: true,
            selectors: Vec::new(),
            body: None,
        });
    }
    let mut selectors = Vec::new();
    strip_entries(&mut map, &mut Path::default(), &mut selectors, &id)?;
    // A document that carried only deletes must not be merged (or added) as an empty document.
    let only_identity = map
        .keys()
        .all(|k| k.as_str().is_some_and(|k| IDENTITY_KEYS.contains(&k)));
    let body = (selectors.is_empty() || !only_identity).then_some(Value::Mapping(map));
    Ok(DocPatch {
        index,
        id,
        delete_doc: false,
        selectors,
        body,
    })
}

/// Walk `steps` (keys only) down from `cur`; the error names the first missing or non-mapping
/// step.
fn descend<'v>(mut cur: &'v mut Value, steps: &[Seg]) -> Result<&'v mut Value, Absence> {
    let mut walked = Path::default();
    for seg in steps {
        let Seg::Key(key) = seg else {
            return Err(Absence::ThroughList {
                walked: walked.to_string(),
            });
        };
        walked.push_key(key);
        cur = match cur {
            Value::Mapping(m) => match m.get_mut(key) {
                Some(next) => next,
                None => {
                    return Err(Absence::NotInConfig {
                        path: walked.to_string(),
                    });
                }
            },
            other => {
                return Err(Absence::InsideNonMapping {
                    walked: walked.to_string(),
                    found: shape(other),
                });
            }
        };
    }
    Ok(cur)
}

/// Apply one delete to the config document `doc`.
pub(super) fn apply_selector(
    doc: &mut Value,
    selector: &Selector,
    id: &DocId,
) -> Result<(), PatchProblem> {
    let nothing = |why: Absence| PatchProblem::NothingToDelete {
        id: Box::new(id.clone()),
        path: selector.path().to_string(),
        why,
    };
    match selector {
        Selector::Key(path) => {
            let Some((Seg::Key(last), parents)) = path.0.split_last() else {
                return Err(nothing(Absence::NoKey));
            };
            let parent = descend(doc, parents).map_err(&nothing)?;
            match parent {
                Value::Mapping(m) => m.shift_remove(last).map(|_| ()).ok_or_else(|| {
                    nothing(Absence::NotInConfig {
                        path: path.to_string(),
                    })
                }),
                other => Err(nothing(Absence::ParentNotMapping {
                    path: path.to_string(),
                    found: shape(other),
                })),
            }
        }
        Selector::Element { list, key, value } => {
            let target = descend(doc, &list.0).map_err(&nothing)?;
            let Value::Sequence(items) = target else {
                return Err(nothing(Absence::NotAList {
                    list: list.to_string(),
                    found: shape(target),
                }));
            };
            let hit = items.iter().position(|item| {
                item.get(key).and_then(scalar_text).as_deref() == Some(value.as_str())
            });
            match hit {
                Some(i) => {
                    items.remove(i);
                    Ok(())
                }
                None => Err(nothing(Absence::NoElement {
                    list: list.to_string(),
                    key: key_text(key),
                    value: value.clone(),
                })),
            }
        }
    }
}
