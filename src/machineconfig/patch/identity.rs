//! Which document of a multi-document config a YAML value is ([`DocId`]), and the small value
//! helpers every part of the engine shares (a value's shape and a scalar's text, for messages
//! that never quote config values).

use std::fmt;

use yaml_serde::Value;

/// `kind` under which the rule table files the legacy document.
pub(super) const V1ALPHA1: &str = "v1alpha1";

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
    pub(super) fn rule_kind(&self) -> &str {
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
pub(super) enum IdFault {
    NotMapping(&'static str),
    NotText(&'static str),
    MissingApiVersion(String),
}

/// Identify a document by its `apiVersion`/`kind`/`name`; no `kind` means the v1alpha1 document.
pub(super) fn identify(doc: &Value) -> Result<DocId, IdFault> {
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
pub(super) fn position(docs: &[Value], id: &DocId) -> Option<usize> {
    docs.iter()
        .position(|d| identify(d).ok().as_ref() == Some(id))
}

/// A word for the shape of a value, for error messages (never the value itself: configs hold
/// keys and tokens).
pub(super) fn shape(v: &Value) -> &'static str {
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
pub(super) fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
