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
//! reproduced with a path table (`rules::RULES`) built from the struct tags and custom `Merge`
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
//!
//! # Layout
//!
//! `identity` tells documents apart, `bundle` parses a config or patch file and `emit` writes
//! one back; applying a patch is `delete` (the `$patch: delete` markers, applied first), `merge`
//! (the strategic merge under the table in `rules`) or `rfc6902` (JSON patches); `error` holds
//! what can go wrong with a patch. The entry points, [`apply`] and [`apply_all`], are here.

mod bundle;
mod delete;
mod emit;
mod error;
mod identity;
mod merge;
mod rfc6902;
mod rules;

pub use bundle::{BundleError, ConfigBundle, parse_patch};
pub use emit::EmitError;
pub use error::{Absence, PatchError, PatchProblem};
pub use identity::DocId;

use yaml_serde::Value;

use crate::inventory::PatchBody;

fn apply_body(docs: &mut Vec<Value>, patch: &PatchBody) -> Result<(), PatchProblem> {
    match patch {
        PatchBody::Merge(patch_docs) => merge::apply_merge(docs, patch_docs),
        PatchBody::Json(ops) => rfc6902::apply_json(docs, ops),
    }
}

/// Apply one patch. On error the bundle is unchanged and the error's `index` is 0.
pub fn apply(bundle: &mut ConfigBundle, patch: &PatchBody) -> Result<(), PatchError> {
    apply_all(bundle, std::iter::once(patch))
}

/// Apply patches in order (common, then role, then node: later patches win). All or nothing:
/// on error the bundle is unchanged and the error names the failing patch's position.
pub(crate) fn apply_all<'a, I>(bundle: &mut ConfigBundle, patches: I) -> Result<(), PatchError>
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
mod tests;
