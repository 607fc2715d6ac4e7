//! The Talos machine-config patch engine: strategic merge and RFC 6902 JSON patches over a
//! multi-document config, pure and sans-I/O.
//!
//! A machine config is a [`ConfigBundle`]: one legacy `version: v1alpha1` document (`machine`,
//! `cluster`) plus typed documents (`apiVersion: v1alpha1`, `kind: X`, and `name: Y` for named
//! kinds such as `VolumeConfig` or `UserVolumeConfig`). Patches come from the inventory as
//! [`PatchBody`] values and are applied in order with [`apply`] / [`apply_all`]: common patches,
//! then role patches, then per-node patches, so the later patch wins.
//!
//! # Rules, as Talos applies them
//!
//! Talos merges Go structs (`pkg/machinery/config/merge/merge.go`,
//! `configpatcher/strategic.go`); we merge YAML values, so the type-driven parts of its rules are
//! reproduced with a path table (`RULES` below) built from the struct tags and custom `Merge`
//! methods in the Talos sources (`types/v1alpha1/v1alpha1_types.go`, `types/k8s/*.go`,
//! `types/runtime/extensions/service_config.go`, `types/meta/args.go`).
//!
//! * **Documents.** A patch document with `kind` targets the config document with the same
//!   `apiVersion`, `kind` and `name`; a patch document without `kind` targets the v1alpha1
//!   document. A target that does not exist yet is added (a new v1alpha1 document goes first,
//!   typed documents last). One patch may touch a document only once.
//! * **Mappings** merge key by key, recursively.
//! * **Scalars**: the patch value replaces the config value, except that an empty string `""`
//!   and the number `0` are Go zero values, which `merge.go` skips ("merged into the left unless
//!   it's zero value"). Booleans always replace, so an explicit `false` wins ("boolean false is
//!   always merged"). A zero value is still written where the config has no value yet, which is
//!   what Talos ends up with too (the field is simply zero there). `null` in a patch changes
//!   nothing (a nil pointer, slice or map is skipped by `merge.go`).
//! * **Lists** are appended, except:
//!   - *replace* paths (`merge:"replace"`): the patch list or mapping replaces the old one
//!     wholesale, even when it is empty;
//!   - *keyed* lists (custom `Merge` methods): an element whose key matches an existing element
//!     is merged into it, others are appended.
//! * **`extraArgs` of the v1.14 Kube\*Config documents** (`meta.Args`): each patched argument
//!   replaces the old value outright (Go `maps.Copy`), lists included.
//! * **`$patch: delete`** (`configloader/internal/decoder/delete.go`, `selector.go`):
//!   - on a mapping value (`mtu: {$patch: delete}`) it removes that key;
//!   - as a list element it removes the first element of the config list whose field equals the
//!     first other `key: value` of the marker (`- interface: eth0` + `$patch: delete`);
//!   - at the top of a typed document it removes that whole document; the v1alpha1 document
//!     cannot be removed.
//!
//!   Talos applies all deletes of a patch before merging the rest of it, so a patch can delete an
//!   element and add a fresh one with the same key. It refuses a delete of an inner key inside a
//!   list element, and an element delete in a list nested inside another list; so do we.
//! * **JSON patches** (RFC 6902, via the `json-patch` crate) edit the v1alpha1 document only.
//!
//! # Where we knowingly differ from Talos
//!
//! * Talos refuses JSON patches on every multi-document config ("JSON6902 patches are not
//!   supported for multi-document machine configuration", `configpatcher/json6902.go`). Every
//!   config we render is multi-document (gen config adds a `HostnameConfig`), so we apply JSON
//!   patches to the v1alpha1 document, which is what their paths (`/machine/...`) address, and
//!   refuse them only when the config has no v1alpha1 document.
//! * A `$patch: delete` that finds nothing is an error (it names the path). Talos errors for an
//!   absent map key, a misspelt field and a missing parent, but not for a known struct field
//!   that is merely unset; we cannot tell those apart without the schema, and an error is the
//!   safer reading of "delete something that is not there".
//! * `deviceSelector` keys are compared by value. Talos compares the Go struct, in which
//!   `physical` is a pointer, so selectors with `physical` never match there.
//! * Element deletes compare the selector as text, so numeric selectors match too; Talos only
//!   matches string fields.
//! * A scalar may replace a scalar of another YAML type (`"7445"` by `7445`): Go would have
//!   decoded both into the field's type. Mapping versus list versus scalar is an error, as in
//!   Talos ("merge type mismatch").

use std::fmt;

use serde::Deserialize;
use thiserror::Error;
use yaml_serde::{Mapping, Value};

use crate::inventory::PatchBody;

/// `kind` under which the rule table files the legacy document.
const V1ALPHA1: &str = "v1alpha1";
/// The directive key Talos recognises inside patches.
const DIRECTIVE: &str = "$patch";
/// The only directive value Talos knows.
const DELETE: &str = "delete";
/// Keys that identify a document rather than configure it.
const IDENTITY_KEYS: [&str; 4] = ["version", "apiVersion", "kind", "name"];

// ---------------------------------------------------------------------------------------------
// Document identity
// ---------------------------------------------------------------------------------------------

/// Which document of a multi-document config a YAML document is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocId {
    /// The legacy `version: v1alpha1` document (`machine`, `cluster`).
    V1Alpha1,
    /// A typed document.
    Typed {
        /// `apiVersion` (always `v1alpha1` in Talos 1.13/1.14).
        api_version: String,
        /// `kind`, e.g. `VolumeConfig`.
        kind: String,
        /// `name` for named kinds (`EPHEMERAL`, a link name, ...), `None` for singletons.
        name: Option<String>,
    },
}

impl DocId {
    /// The kind under which `RULES` files this document's paths.
    fn rule_kind(&self) -> &str {
        match self {
            DocId::V1Alpha1 => V1ALPHA1,
            DocId::Typed { kind, .. } => kind,
        }
    }
}

impl fmt::Display for DocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DocId::V1Alpha1 => f.write_str("the v1alpha1 document"),
            DocId::Typed {
                kind,
                name: Some(name),
                ..
            } => write!(f, "the {kind} document `{name}`"),
            DocId::Typed {
                kind, name: None, ..
            } => write!(f, "the {kind} document"),
        }
    }
}

/// Why a YAML document could not be identified.
enum IdFault {
    NotMapping(&'static str),
    NotText(&'static str),
    MissingApiVersion(String),
}

/// Identify a document by its `apiVersion`/`kind`/`name`; no `kind` means the v1alpha1 document.
fn identify(doc: &Value) -> Result<DocId, IdFault> {
    let Value::Mapping(map) = doc else {
        return Err(IdFault::NotMapping(shape(doc)));
    };
    let Some(kind) = map.get("kind") else {
        return Ok(DocId::V1Alpha1);
    };
    let kind = kind.as_str().ok_or(IdFault::NotText("kind"))?.to_owned();
    let api_version = match map.get("apiVersion") {
        None | Some(Value::Null) => return Err(IdFault::MissingApiVersion(kind)),
        Some(v) => v.as_str().ok_or(IdFault::NotText("apiVersion"))?.to_owned(),
    };
    let name = match map.get("name") {
        None | Some(Value::Null) => None,
        Some(v) => Some(scalar_text(v).ok_or(IdFault::NotText("name"))?),
    };
    Ok(DocId::Typed {
        api_version,
        kind,
        name,
    })
}

/// Index of the document with this identity.
fn position(docs: &[Value], id: &DocId) -> Option<usize> {
    docs.iter()
        .position(|d| identify(d).ok().as_ref() == Some(id))
}

/// A word for the shape of a value, for error messages (never the value itself: configs hold
/// keys and tokens).
fn shape(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "list",
        Value::Mapping(_) => "mapping",
        Value::Tagged(_) => "tagged value",
    }
}

/// The text of a scalar, as Talos's selectors compare them.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// The bundle
// ---------------------------------------------------------------------------------------------

/// A multi-document Talos machine config, documents in output order.
///
/// `Debug` lists only the documents' identities: the values carry CA keys and tokens.
#[derive(Clone, PartialEq, Default)]
pub struct ConfigBundle {
    /// The documents: at most one v1alpha1 document and typed documents, each a mapping.
    pub docs: Vec<Value>,
}

impl fmt::Debug for ConfigBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<String> = self
            .docs
            .iter()
            .map(|d| match identify(d) {
                Ok(id) => id.to_string(),
                Err(_) => format!("<unidentified {}>", shape(d)),
            })
            .collect();
        f.debug_struct("ConfigBundle").field("docs", &ids).finish()
    }
}

/// Errors reading or writing a [`ConfigBundle`] (documents are counted from 0 in file order).
#[derive(Debug, Error)]
pub enum BundleError {
    /// The text is not YAML.
    #[error("documents[{doc}] is not valid YAML: {message}")]
    Yaml {
        /// Which document.
        doc: usize,
        /// The parser's description and position.
        message: String,
    },
    /// A document is not a mapping.
    #[error("documents[{doc}] is a {found}; every machine-config document must be a mapping")]
    NotMapping {
        /// Which document.
        doc: usize,
        /// What it is instead.
        found: &'static str,
    },
    /// A document has neither `kind` nor `version: v1alpha1`.
    #[error(
        "documents[{doc}] has neither `kind` (a typed document) nor `version: v1alpha1`; \
         Talos cannot tell what it is"
    )]
    Unidentified {
        /// Which document.
        doc: usize,
    },
    /// An identity field is not text.
    #[error("documents[{doc}]: `{field}` must be a string")]
    BadField {
        /// Which document.
        doc: usize,
        /// `kind`, `apiVersion` or `name`.
        field: &'static str,
    },
    /// A typed document without `apiVersion`.
    #[error("documents[{doc}] has `kind: {kind}` but no `apiVersion`; add `apiVersion: v1alpha1`")]
    MissingApiVersion {
        /// Which document.
        doc: usize,
        /// Its kind.
        kind: String,
    },
    /// Two documents with the same identity (Talos rejects these).
    #[error("documents[{first}] and documents[{second}] are both {id}; merge them into one")]
    Duplicate {
        /// The earlier document.
        first: usize,
        /// The later document.
        second: usize,
        /// Their identity.
        id: DocId,
    },
    /// The text nests deeper than talboot parses.
    #[error("{0}")]
    TooDeep(#[from] crate::nesting::TooDeep),
    /// The YAML emitter failed.
    #[error("cannot write the machine config as YAML: {message}")]
    Emit {
        /// The emitter's description.
        message: String,
    },
}

/// Split multi-document YAML text into values, skipping empty documents (a leading or
/// trailing `---`).
fn parse_documents(text: &str) -> Result<Vec<(usize, Value)>, BundleError> {
    crate::nesting::check_yaml(text)?;
    let mut docs = Vec::new();
    for (doc, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).map_err(|e| BundleError::Yaml {
            doc,
            message: e.to_string(),
        })?;
        if !value.is_null() {
            docs.push((doc, value));
        }
    }
    Ok(docs)
}

impl ConfigBundle {
    /// A bundle of these documents, as given.
    pub fn new(docs: Vec<Value>) -> Self {
        ConfigBundle { docs }
    }

    /// Parse multi-document YAML, checking what Talos's loader checks about document identity:
    /// every document is a mapping, typed documents have `apiVersion` and `kind`, the legacy
    /// document says `version: v1alpha1`, and no identity appears twice.
    pub fn parse(text: &str) -> Result<Self, BundleError> {
        let mut seen: Vec<(usize, DocId)> = Vec::new();
        let mut docs = Vec::new();
        for (doc, value) in parse_documents(text)? {
            let id = identify(&value).map_err(|fault| match fault {
                IdFault::NotMapping(found) => BundleError::NotMapping { doc, found },
                IdFault::NotText(field) => BundleError::BadField { doc, field },
                IdFault::MissingApiVersion(kind) => BundleError::MissingApiVersion { doc, kind },
            })?;
            if id == DocId::V1Alpha1
                && value.get("version").and_then(Value::as_str) != Some(V1ALPHA1)
            {
                return Err(BundleError::Unidentified { doc });
            }
            if let Some((first, _)) = seen.iter().find(|(_, other)| *other == id) {
                return Err(BundleError::Duplicate {
                    first: *first,
                    second: doc,
                    id,
                });
            }
            seen.push((doc, id));
            docs.push(value);
        }
        Ok(ConfigBundle { docs })
    }

    /// Multi-document YAML: documents separated by `---`, two-space indentation (lists indented
    /// under their key, as `talosctl` and talhelper write them), keys in the order they were
    /// written.
    pub fn to_yaml(&self) -> Result<String, BundleError> {
        let mut out = String::new();
        for (i, doc) in self.docs.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            emit_document(&mut out, doc).map_err(|message| BundleError::Emit { message })?;
        }
        Ok(out)
    }

    /// The document with this identity.
    pub fn get(&self, id: &DocId) -> Option<&Value> {
        position(&self.docs, id).map(|i| &self.docs[i])
    }

    /// The v1alpha1 document, if there is one.
    pub fn v1alpha1(&self) -> Option<&Value> {
        self.get(&DocId::V1Alpha1)
    }

    /// The typed document of this kind (and name, for named kinds), whatever its `apiVersion`.
    pub fn typed(&self, kind: &str, name: Option<&str>) -> Option<&Value> {
        self.docs.iter().find(|d| match identify(d) {
            Ok(DocId::Typed {
                kind: k, name: n, ..
            }) => k == kind && n.as_deref() == name,
            _ => false,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Emitting
// ---------------------------------------------------------------------------------------------
//
// libyaml (under yaml_serde) always writes lists flush with their key. We lay out the block
// structure ourselves and let yaml_serde render each scalar, so quoting stays libyaml's.

fn indent_to(out: &mut String, column: usize) {
    out.extend(std::iter::repeat_n(' ', column));
}

/// A non-empty mapping or list, seen through a tag.
fn block_container(v: &Value) -> Option<(&Value, Option<String>)> {
    match v {
        Value::Mapping(m) if !m.is_empty() => Some((v, None)),
        Value::Sequence(s) if !s.is_empty() => Some((v, None)),
        Value::Tagged(t) => {
            block_container(&t.value).map(|(inner, _)| (inner, Some(t.tag.to_string())))
        }
        _ => None,
    }
}

fn emit_document(out: &mut String, doc: &Value) -> Result<(), String> {
    match block_container(doc) {
        Some((inner, tag)) => {
            if let Some(tag) = tag {
                out.push_str(&tag);
                out.push('\n');
            }
            emit_block(out, inner, 0, false)
        }
        None => emit_scalar(out, doc, 0),
    }
}

/// Write a non-empty mapping or list whose entries sit at `column`. With `inline_first` the
/// first entry continues the current line (after `- `).
fn emit_block(
    out: &mut String,
    v: &Value,
    column: usize,
    inline_first: bool,
) -> Result<(), String> {
    match v {
        Value::Mapping(map) => {
            for (i, (key, value)) in map.iter().enumerate() {
                if i > 0 || !inline_first {
                    indent_to(out, column);
                }
                out.push_str(&render_key(key)?);
                out.push(':');
                match block_container(value) {
                    Some((inner, tag)) => {
                        if let Some(tag) = tag {
                            out.push(' ');
                            out.push_str(&tag);
                        }
                        out.push('\n');
                        emit_block(out, inner, column + 2, false)?;
                    }
                    None => {
                        out.push(' ');
                        emit_scalar(out, value, column)?;
                    }
                }
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 || !inline_first {
                    indent_to(out, column);
                }
                out.push_str("- ");
                match block_container(item) {
                    Some((inner, Some(tag))) => {
                        out.push_str(&tag);
                        out.push('\n');
                        emit_block(out, inner, column + 2, false)?;
                    }
                    Some((inner, None)) => emit_block(out, inner, column + 2, true)?,
                    None => emit_scalar(out, item, column)?,
                }
            }
            Ok(())
        }
        other => emit_scalar(out, other, column),
    }
}

/// Write a scalar (or empty container) that continues the current line. Block scalars (`|`)
/// come back from libyaml with content two columns in; shifting every later line by the
/// parent's `column` keeps that relation, indentation indicators included.
fn emit_scalar(out: &mut String, v: &Value, column: usize) -> Result<(), String> {
    let text = yaml_serde::to_string(v).map_err(|e| e.to_string())?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 && !line.is_empty() {
            indent_to(out, column);
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

fn render_key(key: &Value) -> Result<String, String> {
    let plain = matches!(
        key,
        Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null
    );
    let text = yaml_serde::to_string(key).map_err(|e| e.to_string())?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    if !plain || text.contains('\n') {
        return Err(format!(
            "a mapping key must be a one-line scalar, found a {}",
            shape(key)
        ));
    }
    Ok(text.to_owned())
}

/// Read a patch as `talosctl` does: a single YAML document that is a list is an RFC 6902 JSON
/// patch; anything else is a (possibly multi-document) strategic merge patch.
pub fn parse_patch(text: &str) -> Result<PatchBody, BundleError> {
    let mut docs: Vec<Value> = parse_documents(text)?.into_iter().map(|(_, v)| v).collect();
    if docs.len() == 1
        && let Some(Value::Sequence(_)) = docs.first()
        && let Some(Value::Sequence(ops)) = docs.pop()
    {
        return Ok(PatchBody::Json(ops));
    }
    Ok(PatchBody::Merge(docs))
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// A patch that could not be applied: which patch (`index` in the list given to [`apply_all`],
/// 0 for [`apply`]) and what is wrong with it. The bundle is left unchanged.
#[derive(Debug, Error)]
#[error("patches[{index}]: {problem}")]
pub struct PatchError {
    /// Position of the failing patch in the list, counting from 0.
    pub index: usize,
    /// What is wrong.
    pub problem: PatchProblem,
}

/// What is wrong with a patch. Paths are the patch's own (`machine.network.interfaces[0]`,
/// list positions counting from 0); messages never quote config values.
#[derive(Debug, Error)]
pub enum PatchProblem {
    /// A merge-patch document is not a mapping.
    #[error("documents[{doc}] is a {found}; each merge-patch document must be a YAML mapping")]
    DocNotMapping {
        /// Which patch document.
        doc: usize,
        /// What it is instead.
        found: &'static str,
    },
    /// An identity field of a patch document is not text.
    #[error("documents[{doc}]: `{field}` must be a string")]
    BadIdentity {
        /// Which patch document.
        doc: usize,
        /// `kind`, `apiVersion` or `name`.
        field: &'static str,
    },
    /// A typed patch document without `apiVersion`.
    #[error(
        "documents[{doc}] has `kind: {kind}` but no `apiVersion`; typed documents need both \
         (add `apiVersion: v1alpha1`)"
    )]
    MissingApiVersion {
        /// Which patch document.
        doc: usize,
        /// Its kind.
        kind: String,
    },
    /// Two documents of one patch target the same config document.
    #[error(
        "documents[{first}] and documents[{second}] both patch {id}; a patch may touch a \
         document only once, so merge them into one"
    )]
    DuplicateDocument {
        /// The earlier patch document.
        first: usize,
        /// The later patch document.
        second: usize,
        /// The document both target.
        id: Box<DocId>,
    },
    /// The patch and the config disagree on the shape of a value.
    #[error(
        "{id}, at `{path}`: the config has a {base} but the patch has a {patch}; write the \
         patch value in the same shape as the config"
    )]
    TypeMismatch {
        /// The document.
        id: Box<DocId>,
        /// Where.
        path: String,
        /// Shape in the config.
        base: &'static str,
        /// Shape in the patch.
        patch: &'static str,
    },
    /// An element of a keyed list (interfaces, vlans, ...) is not a mapping.
    #[error(
        "{id}, at `{path}`: elements of this list merge by `{key}` and must be mappings, found a {found}"
    )]
    KeyedElementNotMapping {
        /// The document.
        id: Box<DocId>,
        /// Where.
        path: String,
        /// The merge key.
        key: &'static str,
        /// What the element is.
        found: &'static str,
    },
    /// `$patch` with a value other than `delete`.
    #[error(
        "{id}, at `{path}`: `$patch: {value}` is not supported; Talos only understands `$patch: delete`"
    )]
    UnsupportedDirective {
        /// The document.
        id: Box<DocId>,
        /// Where.
        path: String,
        /// The directive's value (or its shape when not a scalar).
        value: String,
    },
    /// `$patch: delete` on a key inside a list element.
    #[error(
        "{id}, at `{path}`: Talos cannot delete a key inside a list element; delete the whole \
         element instead (`- <key>: <value>` plus `$patch: delete`) and add it back as it should be"
    )]
    DeleteInsideListElement {
        /// The document.
        id: Box<DocId>,
        /// Where.
        path: String,
    },
    /// A list-element delete marker without a `key: value` to select the element.
    #[error(
        "{id}, at `{path}`: a list element marked `$patch: delete` needs one other scalar \
         `key: value` that selects the element to remove, e.g. `- interface: eth0`"
    )]
    DeleteWithoutSelector {
        /// The document.
        id: Box<DocId>,
        /// Where.
        path: String,
    },
    /// A list-element delete in a list that is itself inside a list.
    #[error(
        "{id}, at `{path}`: Talos cannot delete an element of a list nested in another list; \
         delete the outer element and add it back as it should be"
    )]
    DeleteInNestedList {
        /// The document.
        id: Box<DocId>,
        /// Where.
        path: String,
    },
    /// `$patch: delete` at the top of the v1alpha1 document.
    #[error(
        "the v1alpha1 document cannot be deleted; delete the sections you do not want instead \
         (e.g. `machine: {{network: {{$patch: delete}}}}`)"
    )]
    DeleteV1Alpha1,
    /// A delete found nothing to delete.
    #[error(
        "{id}, at `{path}`: `$patch: delete` found nothing to delete ({why}); fix the path or drop the delete"
    )]
    NothingToDelete {
        /// The document.
        id: Box<DocId>,
        /// The path of the delete.
        path: String,
        /// What was missing.
        why: String,
    },
    /// A whole-document delete whose document is not in the config.
    #[error(
        "{id} is not in the config, so `$patch: delete` has nothing to remove; drop the delete"
    )]
    DocumentToDeleteMissing {
        /// The document.
        id: Box<DocId>,
    },
    /// A JSON patch on a config without a v1alpha1 document.
    #[error(
        "a JSON patch edits the v1alpha1 document and this config has none; use a strategic \
         merge patch on the typed documents instead"
    )]
    JsonWithoutV1Alpha1,
    /// A JSON patch operation is malformed.
    #[error("JSON patch operations[{op}]: {reason}")]
    JsonBadOperation {
        /// Which operation, counting from 0.
        op: usize,
        /// What is wrong.
        reason: String,
    },
    /// A JSON patch operation failed against the config.
    #[error("JSON patch operations[{op}] (`{name}` at `{path}`) failed: {reason}")]
    JsonFailed {
        /// Which operation, counting from 0.
        op: usize,
        /// `add`, `remove`, ...
        name: &'static str,
        /// The JSON pointer the operation failed at.
        path: String,
        /// Why (`value did not match`, `path is invalid`, ...).
        reason: String,
    },
    /// The JSON patch left a v1alpha1 document that is not a mapping.
    #[error("the JSON patch turned the v1alpha1 document into a {found}; it must stay a mapping")]
    JsonResultNotMapping {
        /// What it became.
        found: &'static str,
    },
    /// The v1alpha1 document has something JSON cannot hold.
    #[error(
        "the v1alpha1 document cannot be converted to JSON for the JSON patch: {reason} at `{path}`"
    )]
    NotJson {
        /// Where.
        path: String,
        /// What.
        reason: &'static str,
    },
}

// ---------------------------------------------------------------------------------------------
// Paths and the rule table
// ---------------------------------------------------------------------------------------------

/// One step into a document.
#[derive(Debug, Clone)]
enum Seg {
    Key(Value),
    Index(usize),
}

/// A position inside a document, for rule lookup and error messages.
#[derive(Debug, Clone, Default)]
struct Path(Vec<Seg>);

impl Path {
    fn push_key(&mut self, key: &Value) {
        self.0.push(Seg::Key(key.clone()));
    }

    fn push_index(&mut self, i: usize) {
        self.0.push(Seg::Index(i));
    }

    fn pop(&mut self) {
        self.0.pop();
    }

    fn has_index(&self) -> bool {
        self.0.iter().any(|s| matches!(s, Seg::Index(_)))
    }

    /// The path with list positions written `[]`, as `RULES` spells paths.
    fn pattern(&self) -> String {
        let mut out = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(&key_text(k));
                }
                Seg::Index(_) => out.push_str("[]"),
            }
        }
        out
    }
}

fn key_text(k: &Value) -> String {
    scalar_text(k).unwrap_or_else(|| format!("<{} key>", shape(k)))
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(document root)");
        }
        let mut first = true;
        for seg in &self.0 {
            match seg {
                Seg::Key(k) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    f.write_str(&key_text(k))?;
                }
                Seg::Index(i) => write!(f, "[{i}]")?,
            }
            first = false;
        }
        Ok(())
    }
}

/// How the value at a path merges when it differs from the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Maps merge, lists append, scalars replace unless zero.
    Default,
    /// `merge:"replace"`: the patch value replaces the config value wholesale.
    Replace,
    /// A list with a custom `Merge`: elements with the same key merge.
    Keyed(ListKey),
    /// `meta.Args`: each patched key replaces its value outright.
    Args,
}

/// How elements of a keyed list are matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListKey {
    /// `NetworkDeviceList.Merge`: by `interface` when the patch element names one, else by an
    /// equal `deviceSelector`.
    Device,
    /// By equal values of one field.
    Field(&'static str),
}

impl ListKey {
    fn label(self) -> &'static str {
        match self {
            ListKey::Device => "interface or deviceSelector",
            ListKey::Field(f) => f,
        }
    }

    /// Whether config element `base` is the one patch element `patch` merges into.
    fn matches(self, base: &Value, patch: &Value) -> bool {
        let field_text =
            |v: &Value, f: &str| v.get(f).filter(|x| !x.is_null()).and_then(scalar_text);
        match self {
            ListKey::Device => {
                if let Some(name) = field_text(patch, "interface").filter(|n| !n.is_empty()) {
                    return field_text(base, "interface").as_deref() == Some(name.as_str());
                }
                match patch.get("deviceSelector").filter(|s| !s.is_null()) {
                    Some(selector) => base.get("deviceSelector") == Some(selector),
                    None => false,
                }
            }
            ListKey::Field(f) => field_text(base, f) == field_text(patch, f),
        }
    }
}

/// One row of the rule table.
struct RuleRow {
    /// Document kind (`v1alpha1` for the legacy document).
    kind: &'static str,
    /// Dotted path, `[]` for "any list element".
    path: &'static str,
    rule: Rule,
}

/// Every path whose merge differs from the default, from the Talos sources (v1.13/v1.14).
///
/// Checked and deliberately *not* here: `machine.certSANs`, `machine.network.nameservers`,
/// `machine.install.extraKernelArgs`, `cluster.apiServer.certSANs` and every other list carry no
/// `merge` tag, so they append; v1alpha1 `extraArgs` are plain `map[string]string` and merge
/// key by key; `cluster.inlineManifests` has no custom `Merge`, so it appends.
const RULES: &[RuleRow] = &[
    // v1alpha1_types.go: ClusterNetworkConfig.PodSubnet/ServiceSubnet `merge:"replace"`.
    RuleRow {
        kind: V1ALPHA1,
        path: "cluster.network.podSubnets",
        rule: Rule::Replace,
    },
    RuleRow {
        kind: V1ALPHA1,
        path: "cluster.network.serviceSubnets",
        rule: Rule::Replace,
    },
    // v1alpha1_types.go: APIServerConfig.AuditPolicyConfig `merge:"replace"`.
    RuleRow {
        kind: V1ALPHA1,
        path: "cluster.apiServer.auditPolicy",
        rule: Rule::Replace,
    },
    // v1alpha1_types.go: NetworkDeviceList.Merge.
    RuleRow {
        kind: V1ALPHA1,
        path: "machine.network.interfaces",
        rule: Rule::Keyed(ListKey::Device),
    },
    // v1alpha1_types.go: VlanList.Merge (by VlanID).
    RuleRow {
        kind: V1ALPHA1,
        path: "machine.network.interfaces[].vlans",
        rule: Rule::Keyed(ListKey::Field("vlanId")),
    },
    // v1alpha1_types.go: AdmissionPluginConfigList.Merge (by PluginName).
    RuleRow {
        kind: V1ALPHA1,
        path: "cluster.apiServer.admissionControl",
        rule: Rule::Keyed(ListKey::Field("name")),
    },
    // extensions/service_config.go: ConfigFileList.Merge (by mountPath).
    RuleRow {
        kind: "ExtensionServiceConfig",
        path: "configFiles",
        rule: Rule::Keyed(ListKey::Field("mountPath")),
    },
    // k8s/network.go (v1.14): NetworkPodSubnets/NetworkServiceSubnets `merge:"replace"`.
    RuleRow {
        kind: "KubeNetworkConfig",
        path: "podSubnets",
        rule: Rule::Replace,
    },
    RuleRow {
        kind: "KubeNetworkConfig",
        path: "serviceSubnets",
        rule: Rule::Replace,
    },
    // k8s/audit_policy.go, k8s/authentication.go (v1.14): `configuration` `merge:"replace"`.
    RuleRow {
        kind: "KubeAuditPolicyConfig",
        path: "configuration",
        rule: Rule::Replace,
    },
    RuleRow {
        kind: "KubeAuthenticationConfig",
        path: "configuration",
        rule: Rule::Replace,
    },
    // k8s/*.go (v1.14): `extraArgs` is meta.Args, whose Merge is maps.Copy.
    RuleRow {
        kind: "KubeletConfig",
        path: "extraArgs",
        rule: Rule::Args,
    },
    RuleRow {
        kind: "KubeAPIServerConfig",
        path: "extraArgs",
        rule: Rule::Args,
    },
    RuleRow {
        kind: "KubeControllerManagerConfig",
        path: "extraArgs",
        rule: Rule::Args,
    },
    RuleRow {
        kind: "KubeSchedulerConfig",
        path: "extraArgs",
        rule: Rule::Args,
    },
    RuleRow {
        kind: "KubeProxyConfig",
        path: "extraArgs",
        rule: Rule::Args,
    },
];

fn rule_for(kind: &str, pattern: &str) -> Rule {
    RULES
        .iter()
        .find(|row| row.kind == kind && row.path == pattern)
        .map_or(Rule::Default, |row| row.rule)
}

// ---------------------------------------------------------------------------------------------
// Strategic merge
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// `$patch: delete`
// ---------------------------------------------------------------------------------------------

/// A delete found in a patch document.
#[derive(Debug)]
enum Selector {
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
    fn path(&self) -> &Path {
        match self {
            Selector::Key(p) => p,
            Selector::Element { list, .. } => list,
        }
    }
}

/// A patch document split into its deletes and the part left to merge.
struct DocPatch {
    index: usize,
    id: DocId,
    /// The whole document is to be removed.
    delete_doc: bool,
    selectors: Vec<Selector>,
    /// What remains to merge; `None` when nothing but the identity is left.
    body: Option<Value>,
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
fn prepare(index: usize, doc: Value) -> Result<DocPatch, PatchProblem> {
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
fn descend<'v>(mut cur: &'v mut Value, steps: &[Seg]) -> Result<&'v mut Value, String> {
    let mut walked = Path::default();
    for seg in steps {
        let Seg::Key(key) = seg else {
            return Err(format!("`{walked}` is reached through a list"));
        };
        walked.push_key(key);
        cur = match cur {
            Value::Mapping(m) => match m.get_mut(key) {
                Some(next) => next,
                None => return Err(format!("`{walked}` is not in the config")),
            },
            other => {
                return Err(format!(
                    "`{walked}` is inside a {}, not a mapping",
                    shape(other)
                ));
            }
        };
    }
    Ok(cur)
}

/// Apply one delete to the config document `doc`.
fn apply_selector(doc: &mut Value, selector: &Selector, id: &DocId) -> Result<(), PatchProblem> {
    let nothing = |why: String| PatchProblem::NothingToDelete {
        id: Box::new(id.clone()),
        path: selector.path().to_string(),
        why,
    };
    match selector {
        Selector::Key(path) => {
            let Some((Seg::Key(last), parents)) = path.0.split_last() else {
                return Err(nothing("the delete has no key".to_owned()));
            };
            let parent = descend(doc, parents).map_err(&nothing)?;
            match parent {
                Value::Mapping(m) => m
                    .shift_remove(last)
                    .map(|_| ())
                    .ok_or_else(|| nothing(format!("`{path}` is not in the config"))),
                other => Err(nothing(format!(
                    "the parent of `{path}` is a {}, not a mapping",
                    shape(other)
                ))),
            }
        }
        Selector::Element { list, key, value } => {
            let target = descend(doc, &list.0).map_err(&nothing)?;
            let Value::Sequence(items) = target else {
                return Err(nothing(format!(
                    "`{list}` is a {}, not a list",
                    shape(target)
                )));
            };
            let hit = items.iter().position(|item| {
                item.get(key).and_then(scalar_text).as_deref() == Some(value.as_str())
            });
            match hit {
                Some(i) => {
                    items.remove(i);
                    Ok(())
                }
                None => Err(nothing(format!(
                    "no element of `{list}` has `{}: {value}`",
                    key_text(key)
                ))),
            }
        }
    }
}

/// Apply a strategic merge patch (its documents) to `docs`.
fn apply_merge(docs: &mut Vec<Value>, patch: &[Value]) -> Result<(), PatchProblem> {
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
                why: "the config has no such document".to_owned(),
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

// ---------------------------------------------------------------------------------------------
// RFC 6902
// ---------------------------------------------------------------------------------------------

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
fn apply_json(docs: &mut [Value], ops: &[Value]) -> Result<(), PatchProblem> {
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

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

fn apply_body(docs: &mut Vec<Value>, patch: &PatchBody) -> Result<(), PatchProblem> {
    match patch {
        PatchBody::Merge(patch_docs) => apply_merge(docs, patch_docs),
        PatchBody::Json(ops) => apply_json(docs, ops),
    }
}

/// Apply one patch. On error the bundle is unchanged and the error's `index` is 0.
pub fn apply(bundle: &mut ConfigBundle, patch: &PatchBody) -> Result<(), PatchError> {
    apply_all(bundle, std::iter::once(patch))
}

/// Apply patches in order (common, then role, then node: later patches win). All or nothing:
/// on error the bundle is unchanged and the error names the failing patch's position.
pub fn apply_all<'a, I>(bundle: &mut ConfigBundle, patches: I) -> Result<(), PatchError>
where
    I: IntoIterator<Item = &'a PatchBody>,
{
    let mut docs = bundle.docs.clone();
    let mut applied = 0usize;
    for (index, patch) in patches.into_iter().enumerate() {
        apply_body(&mut docs, patch).map_err(|problem| PatchError { index, problem })?;
        applied += 1;
    }
    tracing::debug!(
        patches = applied,
        documents = docs.len(),
        "applied machine-config patches"
    );
    bundle.docs = docs;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(text: &str) -> ConfigBundle {
        ConfigBundle::parse(text).unwrap_or_else(|e| panic!("test YAML must parse: {e}\n{text}"))
    }

    fn patch(text: &str) -> PatchBody {
        parse_patch(text).unwrap_or_else(|e| panic!("test patch must parse: {e}\n{text}"))
    }

    /// One row of the rule table: `patches` applied in order to `base` give `expected`
    /// (compared as YAML values, so key order does not matter but list order does).
    struct Case {
        name: &'static str,
        base: &'static str,
        patches: &'static [&'static str],
        expected: &'static str,
    }

    const CP: &str = "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install:
    disk: /dev/sda
    wipe: true
  features:
    kubePrism: {enabled: true, port: 7445}
  network:
    hostname: old
    nameservers: [1.1.1.1]
  nodeLabels:
    node.kubernetes.io/exclude-from-external-load-balancers: \"\"
cluster:
  clusterName: lab
  network:
    dnsDomain: cluster.local
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
  apiServer:
    certSANs: [api.lab]
    admissionControl:
      - name: PodSecurity
        configuration: {defaults: {enforce: baseline}}
    auditPolicy:
      apiVersion: audit.k8s.io/v1
      kind: Policy
      rules: [{level: Metadata}]
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
";

    const CASES: &[Case] = &[
        Case {
            name: "maps merge key by key",
            base: "version: v1alpha1
machine:
  kubelet: {image: k:1, extraArgs: {a: '1'}}
",
            patches: &["machine:
  kubelet: {extraArgs: {b: '2'}}
  nodeLabels: {rack: r1}
"],
            expected: "version: v1alpha1
machine:
  kubelet: {image: k:1, extraArgs: {a: '1', b: '2'}}
  nodeLabels: {rack: r1}
",
        },
        Case {
            name: "scalar override",
            base: "version: v1alpha1
machine: {install: {disk: /dev/sda, image: i:1}}
",
            patches: &["machine: {install: {disk: /dev/nvme0n1}}"],
            expected: "version: v1alpha1
machine: {install: {disk: /dev/nvme0n1, image: i:1}}
",
        },
        Case {
            name: "false always wins",
            base: "version: v1alpha1
machine: {install: {wipe: true}, features: {kubePrism: {enabled: true, port: 7445}}}
cluster: {proxy: {disabled: true}}
",
            patches: &["machine: {install: {wipe: false}, features: {kubePrism: {enabled: false}}}
cluster: {proxy: {disabled: false}}
"],
            expected: "version: v1alpha1
machine: {install: {wipe: false}, features: {kubePrism: {enabled: false, port: 7445}}}
cluster: {proxy: {disabled: false}}
",
        },
        Case {
            name: "empty string, zero and null keep the old value; absent keys still get them",
            base: "version: v1alpha1
machine: {install: {disk: /dev/sda}, features: {kubePrism: {port: 7445}}, network: {hostname: n1}}
",
            patches: &["machine:
  install: {disk: ''}
  features: {kubePrism: {port: 0}}
  network: {hostname: null}
  nodeLabels: {empty: ''}
"],
            expected: "version: v1alpha1
machine:
  install: {disk: /dev/sda}
  features: {kubePrism: {port: 7445}}
  network: {hostname: n1}
  nodeLabels: {empty: ''}
",
        },
        Case {
            name: "lists append, including nameservers, certSANs and extraKernelArgs",
            base: "version: v1alpha1
machine:
  certSANs: [10.0.0.1]
  network: {nameservers: [1.1.1.1]}
  install: {extraKernelArgs: [console=ttyS0]}
cluster: {apiServer: {certSANs: [api.lab]}}
",
            patches: &["machine:
  certSANs: [10.0.0.2]
  network: {nameservers: [9.9.9.9]}
  install: {extraKernelArgs: [net.ifnames=0]}
cluster: {apiServer: {certSANs: [vip.lab]}}
"],
            expected: "version: v1alpha1
machine:
  certSANs: [10.0.0.1, 10.0.0.2]
  network: {nameservers: [1.1.1.1, 9.9.9.9]}
  install: {extraKernelArgs: [console=ttyS0, net.ifnames=0]}
cluster: {apiServer: {certSANs: [api.lab, vip.lab]}}
",
        },
        Case {
            name: "merge:replace paths replace the list or mapping wholesale",
            base: CP,
            patches: &["cluster:
  network: {podSubnets: [10.200.0.0/16], serviceSubnets: []}
  apiServer:
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: None}]}
"],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install: {disk: /dev/sda, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: old, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: ''}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.200.0.0/16], serviceSubnets: []}
  apiServer:
    certSANs: [api.lab]
    admissionControl: [{name: PodSecurity, configuration: {defaults: {enforce: baseline}}}]
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: None}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
        Case {
            name: "interfaces merge by `interface`",
            base: "version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth0, dhcp: true, addresses: [10.0.0.5/24]}
      - {interface: eth1, dhcp: false}
",
            patches: &["machine:
  network:
    interfaces:
      - {interface: eth0, mtu: 9000, addresses: [10.0.1.5/24]}
      - {interface: eth2, dhcp: true}
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth0, dhcp: true, addresses: [10.0.0.5/24, 10.0.1.5/24], mtu: 9000}
      - {interface: eth1, dhcp: false}
      - {interface: eth2, dhcp: true}
",
        },
        Case {
            name: "interfaces merge by equal deviceSelector",
            base: "version: v1alpha1
machine:
  network:
    interfaces:
      - {deviceSelector: {hardwareAddr: '52:54:00:aa:bb:01', driver: virtio_net}, dhcp: true}
",
            patches: &["machine:
  network:
    interfaces:
      - deviceSelector: {driver: virtio_net, hardwareAddr: '52:54:00:aa:bb:01'}
        vip: {ip: 10.0.0.50}
      - {deviceSelector: {hardwareAddr: '52:54:00:aa:bb:02'}, dhcp: true}
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - deviceSelector: {hardwareAddr: '52:54:00:aa:bb:01', driver: virtio_net}
        dhcp: true
        vip: {ip: 10.0.0.50}
      - {deviceSelector: {hardwareAddr: '52:54:00:aa:bb:02'}, dhcp: true}
",
        },
        Case {
            name: "vlans merge by vlanId inside a merged interface",
            base: "version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        vlans: [{vlanId: 10, dhcp: true}, {vlanId: 20, addresses: [10.20.0.2/24]}]
",
            patches: &["machine:
  network:
    interfaces:
      - interface: bond0
        vlans: [{vlanId: 20, mtu: 1400}, {vlanId: 30, dhcp: true}]
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        vlans:
          - {vlanId: 10, dhcp: true}
          - {vlanId: 20, addresses: [10.20.0.2/24], mtu: 1400}
          - {vlanId: 30, dhcp: true}
",
        },
        Case {
            name: "keyed list given where the config has none still merges its own duplicates",
            base: "version: v1alpha1
machine: {}
",
            patches: &["machine:
  network:
    interfaces: [{interface: eth0, dhcp: true}, {interface: eth0, mtu: 1500}]
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces: [{interface: eth0, dhcp: true, mtu: 1500}]
",
        },
        Case {
            name: "admission plugins merge by name",
            base: CP,
            patches: &["cluster:
  apiServer:
    admissionControl:
      - {name: PodSecurity, configuration: {defaults: {audit: restricted}}}
      - {name: EventRateLimit, configuration: {kind: Configuration}}
"],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install: {disk: /dev/sda, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: old, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: ''}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.244.0.0/16], serviceSubnets: [10.96.0.0/12]}
  apiServer:
    certSANs: [api.lab]
    admissionControl:
      - {name: PodSecurity, configuration: {defaults: {enforce: baseline, audit: restricted}}}
      - {name: EventRateLimit, configuration: {kind: Configuration}}
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: Metadata}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
        Case {
            name: "extension service config files merge by mountPath",
            base: "apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: nut-client
configFiles: [{content: old, mountPath: /etc/a}, {content: b, mountPath: /etc/b}]
environment: [A=1]
",
            patches: &["apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: nut-client
configFiles: [{content: new, mountPath: /etc/a}, {content: c, mountPath: /etc/c}]
environment: [B=2]
"],
            expected: "apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: nut-client
configFiles: [{content: new, mountPath: /etc/a}, {content: b, mountPath: /etc/b}, {content: c, mountPath: /etc/c}]
environment: [A=1, B=2]
",
        },
        Case {
            name: "$patch: delete removes a key, and the emptied parents stay untouched",
            base: "version: v1alpha1
machine:
  network: {hostname: old, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: '', rack: r1}
",
            patches: &["machine:
  network:
    hostname: {$patch: delete}
  nodeLabels:
    node.kubernetes.io/exclude-from-external-load-balancers: {$patch: delete}
"],
            expected: "version: v1alpha1
machine:
  network: {nameservers: [1.1.1.1]}
  nodeLabels: {rack: r1}
",
        },
        Case {
            name: "$patch: delete removes a list element, then the rest of the patch re-adds it",
            base: "version: v1alpha1
machine:
  network:
    interfaces: [{interface: eth0, dhcp: true}, {interface: eth1, addresses: [10.3.5.4/32]}]
",
            patches: &["machine:
  network:
    interfaces:
      - {interface: eth0, $patch: delete}
      - {interface: eth1, addresses: [10.3.5.5/32]}
      - {interface: eth0, dummy: true}
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth1, addresses: [10.3.5.4/32, 10.3.5.5/32]}
      - {interface: eth0, dummy: true}
",
        },
        Case {
            name: "$patch: delete removes a whole typed document, named or not",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
mount: {secure: true}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
",
            patches: &["apiVersion: v1alpha1
kind: HostnameConfig
$patch: delete
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
$patch: delete
"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
",
        },
        Case {
            name: "a UserVolumeConfig is added as a new document",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
            patches: &["apiVersion: v1alpha1
kind: UserVolumeConfig
name: data
provisioning:
  diskSelector: {match: '!system_disk'}
  minSize: 100GiB
filesystem: {type: xfs}
"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
---
apiVersion: v1alpha1
kind: UserVolumeConfig
name: data
provisioning:
  diskSelector: {match: '!system_disk'}
  minSize: 100GiB
filesystem: {type: xfs}
",
        },
        Case {
            name: "VolumeConfig EPHEMERAL maxSize merges into the existing document of that name",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
mount: {secure: true}
",
            patches: &["apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
provisioning:
  maxSize: 50GiB
"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
mount: {secure: true}
provisioning: {maxSize: 50GiB}
",
        },
        Case {
            name: "one patch, several documents: each goes to its own target",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth0
mtu: 1500
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth1
mtu: 1500
",
            patches: &["machine: {install: {disk: /dev/vda}}
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth1
mtu: 9000
addresses: [{address: 10.9.0.2/24}]
"],
            expected: "version: v1alpha1
machine: {type: worker, install: {disk: /dev/vda}}
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth0
mtu: 1500
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth1
mtu: 9000
addresses: [{address: 10.9.0.2/24}]
",
        },
        Case {
            name: "a v1alpha1 fragment on a config without one becomes the first document",
            base: "apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
            patches: &["machine: {type: worker}"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
        Case {
            name: "v1.14 extraArgs (meta.Args) replace each argument, lists included",
            base: "apiVersion: v1alpha1
kind: KubeAPIServerConfig
image: registry.k8s.io/kube-apiserver:v1.35.0
extraArgs:
  feature-gates: A=true
  admission-plugins: [NodeRestriction, PodSecurity]
",
            patches: &["apiVersion: v1alpha1
kind: KubeAPIServerConfig
extraArgs:
  admission-plugins: [EventRateLimit]
  audit-log-maxage: '30'
"],
            expected: "apiVersion: v1alpha1
kind: KubeAPIServerConfig
image: registry.k8s.io/kube-apiserver:v1.35.0
extraArgs:
  feature-gates: A=true
  admission-plugins: [EventRateLimit]
  audit-log-maxage: '30'
",
        },
        Case {
            name: "v1.14 KubeNetworkConfig subnets are replaced",
            base: "apiVersion: v1alpha1
kind: KubeNetworkConfig
dnsDomain: cluster.local
podSubnets: [10.244.0.0/16]
serviceSubnets: [10.96.0.0/12]
",
            patches: &["apiVersion: v1alpha1
kind: KubeNetworkConfig
podSubnets: [10.42.0.0/16]
"],
            expected: "apiVersion: v1alpha1
kind: KubeNetworkConfig
dnsDomain: cluster.local
podSubnets: [10.42.0.0/16]
serviceSubnets: [10.96.0.0/12]
",
        },
        Case {
            name: "common, then role, then node: the later patch wins",
            base: CP,
            patches: &[
                "machine: {install: {disk: /dev/sdb}, network: {hostname: common}, nodeLabels: {tier: common}}",
                "machine: {install: {disk: /dev/nvme0n1}, nodeLabels: {tier: role}}",
                "machine: {network: {hostname: cp1}}\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: 'off'\nhostname: cp1\n",
            ],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install: {disk: /dev/nvme0n1, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: cp1, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: '', tier: role}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.244.0.0/16], serviceSubnets: [10.96.0.0/12]}
  apiServer:
    certSANs: [api.lab]
    admissionControl: [{name: PodSecurity, configuration: {defaults: {enforce: baseline}}}]
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: Metadata}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: 'off'
hostname: cp1
",
        },
        Case {
            name: "JSON patch add, replace and remove on the v1alpha1 document of a multi-doc config",
            base: CP,
            patches: &["- {op: add, path: /machine/network/interfaces, value: [{interface: eth0, dhcp: true}]}
- {op: replace, path: /machine/install/disk, value: /dev/vda}
- {op: remove, path: /machine/nodeLabels}
- {op: test, path: /cluster/clusterName, value: lab}
- {op: add, path: /machine/certSANs/-, value: 10.0.0.9}
"],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1, 10.0.0.9]
  install: {disk: /dev/vda, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: old, nameservers: [1.1.1.1], interfaces: [{interface: eth0, dhcp: true}]}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.244.0.0/16], serviceSubnets: [10.96.0.0/12]}
  apiServer:
    certSANs: [api.lab]
    admissionControl: [{name: PodSecurity, configuration: {defaults: {enforce: baseline}}}]
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: Metadata}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
    ];

    #[test]
    fn patch_rule_table() {
        for case in CASES {
            let mut got = bundle(case.base);
            let patches: Vec<PatchBody> = case.patches.iter().map(|p| patch(p)).collect();
            apply_all(&mut got, &patches).unwrap_or_else(|e| panic!("case `{}`: {e}", case.name));
            let want = bundle(case.expected);
            assert_eq!(
                got.docs,
                want.docs,
                "case `{}` produced:\n{}",
                case.name,
                got.to_yaml().expect("emit")
            );
        }
    }

    /// A patch that must fail: which patch, and a check on the problem.
    struct Bad {
        name: &'static str,
        base: &'static str,
        patches: &'static [&'static str],
        index: usize,
        check: fn(&PatchProblem) -> bool,
        message: &'static str,
    }

    const BAD: &[Bad] = &[
        Bad {
            name: "mapping patched with a list",
            base: CP,
            patches: &["machine: {network: [1.1.1.1]}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::TypeMismatch { path, base: "mapping", patch: "list", .. } if path == "machine.network"),
            message: "at `machine.network`: the config has a mapping but the patch has a list",
        },
        Bad {
            name: "scalar patched with a mapping",
            base: CP,
            patches: &["machine: {install: {disk: {path: /dev/sda}}}"],
            index: 0,
            check: |p| {
                matches!(
                    p,
                    PatchProblem::TypeMismatch {
                        base: "string",
                        patch: "mapping",
                        ..
                    }
                )
            },
            message: "machine.install.disk",
        },
        Bad {
            name: "delete of a key that is not there",
            base: CP,
            patches: &["machine: {kubelet: {extraArgs: {$patch: delete}}}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::NothingToDelete { path, .. } if path == "machine.kubelet.extraArgs"),
            message: "`machine.kubelet` is not in the config",
        },
        Bad {
            name: "delete of a list element that is not there",
            base: CP,
            patches: &["cluster: {apiServer: {admissionControl: [{name: Nope, $patch: delete}]}}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::NothingToDelete { .. }),
            message: "no element of `cluster.apiServer.admissionControl` has `name: Nope`",
        },
        Bad {
            name: "delete of an inner key of a list element",
            base: CP,
            patches: &[
                "machine: {network: {interfaces: [{interface: eth0, mtu: {$patch: delete}}]}}",
            ],
            index: 0,
            check: |p| matches!(p, PatchProblem::DeleteInsideListElement { path, .. } if path == "machine.network.interfaces[0].mtu"),
            message: "cannot delete a key inside a list element",
        },
        Bad {
            name: "delete of an element in a nested list",
            base: CP,
            patches: &[
                "machine: {network: {interfaces: [{interface: eth0, vlans: [{vlanId: 5, $patch: delete}]}]}}",
            ],
            index: 0,
            check: |p| matches!(p, PatchProblem::DeleteInNestedList { .. }),
            message: "nested in another list",
        },
        Bad {
            name: "element delete without a selector",
            base: CP,
            patches: &["cluster: {apiServer: {admissionControl: [{$patch: delete}]}}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::DeleteWithoutSelector { .. }),
            message: "needs one other scalar",
        },
        Bad {
            name: "the v1alpha1 document cannot be deleted",
            base: CP,
            patches: &["version: v1alpha1\n$patch: delete\n"],
            index: 0,
            check: |p| matches!(p, PatchProblem::DeleteV1Alpha1),
            message: "cannot be deleted",
        },
        Bad {
            name: "deleting a document that is not there",
            base: CP,
            patches: &[
                "apiVersion: v1alpha1\nkind: VolumeConfig\nname: EPHEMERAL\n$patch: delete\n",
            ],
            index: 0,
            check: |p| matches!(p, PatchProblem::DocumentToDeleteMissing { .. }),
            message: "the VolumeConfig document `EPHEMERAL` is not in the config",
        },
        Bad {
            name: "only `$patch: delete` exists",
            base: CP,
            patches: &["cluster: {network: {podSubnets: {$patch: replace}}}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::UnsupportedDirective { value, .. } if value == "replace"),
            message: "`$patch: replace` is not supported",
        },
        Bad {
            name: "one patch touching one document twice",
            base: CP,
            patches: &[
                "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: 'off'\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: x\n",
            ],
            index: 0,
            check: |p| {
                matches!(
                    p,
                    PatchProblem::DuplicateDocument {
                        first: 0,
                        second: 1,
                        ..
                    }
                )
            },
            message: "both patch the HostnameConfig document",
        },
        Bad {
            name: "typed patch document without apiVersion",
            base: CP,
            patches: &["kind: UserVolumeConfig\nname: data\n"],
            index: 0,
            check: |p| matches!(p, PatchProblem::MissingApiVersion { doc: 0, .. }),
            message: "add `apiVersion: v1alpha1`",
        },
        Bad {
            name: "keyed list element that is not a mapping",
            base: CP,
            patches: &["machine: {network: {interfaces: [eth0]}}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::KeyedElementNotMapping { .. }),
            message: "must be mappings",
        },
        Bad {
            name: "JSON test failure names the patch and the operation",
            base: CP,
            patches: &[
                "machine: {install: {disk: /dev/vda}}",
                "- {op: replace, path: /machine/network/hostname, value: n1}\n- {op: test, path: /machine/install/disk, value: /dev/sda}\n",
            ],
            index: 1,
            check: |p| matches!(p, PatchProblem::JsonFailed { op: 1, name: "test", path, .. } if path == "/machine/install/disk"),
            message: "patches[1]: JSON patch operations[1] (`test` at `/machine/install/disk`) failed: value did not match",
        },
        Bad {
            name: "JSON remove of a missing path",
            base: CP,
            patches: &["- {op: remove, path: /machine/kubelet}"],
            index: 0,
            check: |p| {
                matches!(
                    p,
                    PatchProblem::JsonFailed {
                        op: 0,
                        name: "remove",
                        ..
                    }
                )
            },
            message: "path is invalid",
        },
        Bad {
            name: "JSON operation that is not RFC 6902",
            base: CP,
            patches: &["- {op: add, path: /a, value: 1}\n- {op: merge, path: /machine}\n"],
            index: 0,
            check: |p| matches!(p, PatchProblem::JsonBadOperation { op: 1, .. }),
            message: "`op: merge` is not an RFC 6902 operation",
        },
        Bad {
            name: "JSON operation missing its value",
            base: CP,
            patches: &["- {op: replace, path: /machine/type}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::JsonBadOperation { op: 0, .. }),
            message: "`replace` needs `value`",
        },
        Bad {
            name: "JSON path that is not a pointer",
            base: CP,
            patches: &["- {op: remove, path: machine.type}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::JsonBadOperation { op: 0, .. }),
            message: "must be a JSON pointer",
        },
        Bad {
            name: "JSON patch on a config without a v1alpha1 document",
            base: "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n",
            patches: &["- {op: add, path: /machine, value: {}}"],
            index: 0,
            check: |p| matches!(p, PatchProblem::JsonWithoutV1Alpha1),
            message: "has none",
        },
    ];

    #[test]
    fn bad_patches_are_refused_and_leave_the_config_alone() {
        for case in BAD {
            let mut got = bundle(case.base);
            let before = got.clone();
            let patches: Vec<PatchBody> = case.patches.iter().map(|p| patch(p)).collect();
            let err = match apply_all(&mut got, &patches) {
                Ok(()) => panic!("case `{}` applied but must fail", case.name),
                Err(e) => e,
            };
            assert_eq!(err.index, case.index, "case `{}`: {err}", case.name);
            assert!(
                (case.check)(&err.problem),
                "case `{}`: unexpected problem {err}",
                case.name
            );
            let text = err.to_string();
            assert!(
                text.contains(case.message),
                "case `{}`: message `{text}` lacks `{}`",
                case.name,
                case.message
            );
            assert_eq!(
                got, before,
                "case `{}` changed the config despite failing",
                case.name
            );
        }
    }

    #[test]
    fn errors_never_quote_config_values() {
        let mut b = bundle(CP);
        let err = apply(&mut b, &patch("machine: {token: [not, a, scalar]}"))
            .expect_err("shape mismatch");
        assert!(!err.to_string().contains("t0ken"), "{err}");
        assert!(
            !format!("{b:?}").contains("t0ken"),
            "Debug must not show values: {b:?}"
        );
        assert!(format!("{b:?}").contains("the HostnameConfig document"));
    }

    #[test]
    fn single_apply_reports_index_zero() {
        let mut b = bundle(CP);
        let err = apply(&mut b, &patch("- {op: remove, path: /nope}")).expect_err("missing path");
        assert_eq!(err.index, 0);
        assert!(err.to_string().starts_with("patches[0]: "), "{err}");
    }

    #[test]
    fn patch_detection_follows_talosctl() {
        assert!(
            matches!(patch("- {op: remove, path: /machine/network}"), PatchBody::Json(ops) if ops.len() == 1)
        );
        assert!(
            matches!(patch("machine: {}\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n"), PatchBody::Merge(d) if d.len() == 2)
        );
        assert!(matches!(patch("---\nmachine: {}\n---\n"), PatchBody::Merge(d) if d.len() == 1));
    }

    #[test]
    fn round_trip_parse_emit_parse() {
        let multiline = "version: v1alpha1
machine:
  type: controlplane
  files:
    - content: |
        line one
        line two
      path: /var/etc/x
      permissions: 0o644
      op: create
cluster:
  inlineManifests:
    - name: cilium
      contents: \"---\\napiVersion: v1\\nkind: Namespace\\n\"
";
        // Block scalars with an indentation indicator and with kept trailing lines, tags,
        // nested and empty containers.
        let awkward = "version: v1alpha1
machine:
  files:
    - content: \"  leading spaces\\nx\\n\"
      op: create
  nested: [[a, b], [], {}, [{k: v}], !t {a: 1}, !t [1], !t x]
  keep: \"a\\n\\n\"
  quoted: ['', 'true', '0o644', 'a: b', '- x', '#c', \"tab\\there\"]
";
        for text in [CP, multiline, awkward] {
            let first = bundle(text);
            let emitted = first.to_yaml().expect("emit");
            let second = bundle(&emitted);
            assert_eq!(first, second, "round trip changed the config:\n{emitted}");
            assert_eq!(
                emitted,
                second.to_yaml().expect("emit"),
                "emission is not stable"
            );
        }
        let emitted = bundle(CP).to_yaml().expect("emit");
        assert!(
            emitted.starts_with("version: v1alpha1\nmachine:\n  type: controlplane\n"),
            "{emitted}"
        );
        assert!(
            emitted.contains("\n---\napiVersion: v1alpha1\nkind: HostnameConfig\n"),
            "{emitted}"
        );
        // Key order is preserved as written.
        let machine = emitted.find("machine:").expect("machine");
        let cluster = emitted.find("cluster:").expect("cluster");
        assert!(machine < cluster);
    }

    #[test]
    fn bundle_parse_checks_document_identity() {
        let dup = "version: v1alpha1\nmachine: {}\n---\nversion: v1alpha1\ncluster: {}\n";
        assert!(matches!(
            ConfigBundle::parse(dup),
            Err(BundleError::Duplicate {
                first: 0,
                second: 1,
                id: DocId::V1Alpha1
            })
        ));
        let dup_named = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\n";
        assert!(matches!(
            ConfigBundle::parse(dup_named),
            Err(BundleError::Duplicate { .. })
        ));
        let distinct = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth1\n";
        assert_eq!(
            ConfigBundle::parse(distinct).expect("two links").docs.len(),
            2
        );
        assert!(matches!(
            ConfigBundle::parse("machine: {}\n"),
            Err(BundleError::Unidentified { doc: 0 })
        ));
        assert!(matches!(
            ConfigBundle::parse("kind: HostnameConfig\n"),
            Err(BundleError::MissingApiVersion { .. })
        ));
        assert!(matches!(
            ConfigBundle::parse("- a\n"),
            Err(BundleError::NotMapping { found: "list", .. })
        ));
        assert!(matches!(
            ConfigBundle::parse("a: [\n"),
            Err(BundleError::Yaml { doc: 0, .. })
        ));
    }

    #[test]
    fn lookups_find_documents_by_identity() {
        let b = bundle(CP);
        assert_eq!(
            b.v1alpha1()
                .and_then(|d| d.get("machine"))
                .and_then(|m| m.get("type")),
            Some(&Value::from("controlplane"))
        );
        assert!(b.typed("HostnameConfig", None).is_some());
        assert!(b.typed("HostnameConfig", Some("x")).is_none());
        assert!(b.typed("VolumeConfig", Some("EPHEMERAL")).is_none());
    }

    #[test]
    fn rule_table_paths_are_unique_and_well_formed() {
        for (i, row) in RULES.iter().enumerate() {
            assert!(
                !row.path.starts_with('.') && !row.path.ends_with('.'),
                "{}",
                row.path
            );
            assert!(
                RULES[..i]
                    .iter()
                    .all(|r| r.kind != row.kind || r.path != row.path),
                "duplicate rule {} {}",
                row.kind,
                row.path
            );
        }
        assert_eq!(rule_for(V1ALPHA1, "machine.certSANs"), Rule::Default);
        assert_eq!(
            rule_for("KubeNetworkConfig", "cluster.network.podSubnets"),
            Rule::Default
        );
    }
}
