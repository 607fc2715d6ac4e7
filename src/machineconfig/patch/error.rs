//! The errors of applying a patch: [`PatchError`] (which patch) and [`PatchProblem`] (what is
//! wrong with it, naming the document and path, never a config value).

use thiserror::Error;

use super::identity::DocId;

/// A patch that could not be applied: which patch (`index` in the list given to [`apply_all`],
/// 0 for [`apply`]) and what is wrong with it. The bundle is left unchanged.
#[derive(Debug, Error)]
#[error("patches[{index}]: {problem}")]
pub struct PatchError {
    /// Position of the failing patch in the list, counting from 0.
    pub index: usize,
    /// What is wrong.
    pub(crate) problem: PatchProblem,
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
        why: Absence,
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

/// Why a `$patch: delete` found nothing to delete. Paths are the patch's own, as in
/// [`PatchProblem`].
#[derive(Debug, Error)]
pub enum Absence {
    /// The config has no document with the patch document's identity.
    #[error("the config has no such document")]
    NoDocument,
    /// The delete names no key.
    #[error("the delete has no key")]
    NoKey,
    /// A step on the way is a list position.
    #[error("`{walked}` is reached through a list")]
    ThroughList {
        /// The path walked so far.
        walked: String,
    },
    /// A key on the way, or the key to delete, is not there.
    #[error("`{path}` is not in the config")]
    NotInConfig {
        /// The missing path.
        path: String,
    },
    /// A step on the way is inside something other than a mapping.
    #[error("`{walked}` is inside a {found}, not a mapping")]
    InsideNonMapping {
        /// The path walked so far.
        walked: String,
        /// What holds it.
        found: &'static str,
    },
    /// The parent of the key to delete is not a mapping.
    #[error("the parent of `{path}` is a {found}, not a mapping")]
    ParentNotMapping {
        /// The key to delete.
        path: String,
        /// What its parent is.
        found: &'static str,
    },
    /// The list of an element delete is not a list.
    #[error("`{list}` is a {found}, not a list")]
    NotAList {
        /// The path of the list.
        list: String,
        /// What it is.
        found: &'static str,
    },
    /// No element of the list matches the selector.
    #[error("no element of `{list}` has `{key}: {value}`")]
    NoElement {
        /// The path of the list.
        list: String,
        /// The selector's key.
        key: String,
        /// The selector's value.
        value: String,
    },
}
