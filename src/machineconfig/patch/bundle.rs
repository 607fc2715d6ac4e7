//! The config bundle model: [`ConfigBundle`] (a multi-document machine config) and its parser,
//! with the identity checks Talos's loader makes, and [`parse_patch`], which reads a patch file
//! as `talosctl` does. Writing YAML is [`super::emit`]'s.

use std::fmt;

use serde::Deserialize;
use thiserror::Error;
use yaml_serde::Value;

use super::emit::{EmitError, emit_document};
use super::identity::{DocId, IdFault, V1ALPHA1, identify, position, shape};
use crate::inventory::PatchBody;

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
    #[error("cannot write the machine config as YAML: {0}")]
    Emit(#[from] EmitError),
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
    pub(crate) fn to_yaml(&self) -> Result<String, BundleError> {
        let mut out = String::new();
        for (i, doc) in self.docs.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            emit_document(&mut out, doc)?;
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
