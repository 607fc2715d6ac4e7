//! The machine-config contract rules over patches: what a patch may set under the cluster's
//! contract (fields the v1.14 contract moves, conflicts Talos refuses, deprecations).

use crate::inventory::diag::{Diagnostics, Loc};
use crate::inventory::model::*;
use crate::inventory::parts::Parts;

/// What the cluster's machine-config contract makes of each patch, at the patch's file and
/// line: under v1.14, a v1.13 field with no v1.14 document stays with a deprecation warning,
/// or is refused when Talos refuses it next to a document talboot renders; under any contract,
/// a patch that sets a legacy field and the document Talos refuses it next to
/// (`V1Alpha1ConflictValidate`, [`crate::talosfacts::legacy::CONFLICTS`]) is refused.
pub(super) fn contract_rules(cluster: &Cluster, parts: &Parts, d: &mut Diagnostics) {
    use crate::talosfacts::contract::Contract;
    let Some(contract) = Contract::for_version(&cluster.talos_version.value.0) else {
        return; // rendering refuses the version with its own message
    };
    let patches = cluster
        .patches
        .iter()
        .chain(parts.roles.iter().flat_map(|r| r.patches.iter()))
        .chain(parts.nodes.iter().flat_map(|n| n.patches.iter()));
    for patch in patches {
        patch_contract_rules(contract, patch, d);
    }
    if contract < Contract::V1_14 {
        refuse_disk_match(cluster, parts, d);
        refuse_storage(cluster, parts, d);
    }
}

/// `installRaid` and `systemVolumes` need the v1.14 contract: `RAIDArrayConfig` and a
/// `VolumeConfig` for ETCD or LOG are v1.14 documents (v1.13's schema has neither kind and
/// v1.13 keeps ETCD and LOG as directories of EPHEMERAL).
fn refuse_storage(cluster: &Cluster, parts: &Parts, d: &mut Diagnostics) {
    let version = &cluster.talos_version.value;
    for node in &parts.nodes {
        if let Some(raid) = &node.storage.raid {
            d.error_hint(
                &raid.name.loc,
                format!("node {}: installRaid", node.name.value),
                format!(
                    "installing onto a RAID array needs Talos v1.14 or later (RAIDArrayConfig); \
                     this cluster runs {version}"
                ),
                "install onto one disk with installDisk or diskSelector, or raise talosVersion",
            );
        }
    }
    let volumes = parts
        .nodes
        .iter()
        .map(|n| (format!("node {}", n.name.value), &n.storage.volumes))
        .chain(
            parts
                .role_volumes
                .iter()
                .map(|(r, v)| (format!("role {r}"), v)),
        );
    for (owner, list) in volumes {
        for v in list {
            d.error_hint(
                &v.loc,
                format!("{owner}: systemVolumes.{}", v.name),
                format!(
                    "a dedicated {} partition needs Talos v1.14 or later (VolumeConfig for \
                     system volumes); this cluster runs {version}",
                    v.name
                ),
                "remove systemVolumes (the volume stays a directory of EPHEMERAL), or raise \
                 talosVersion",
            );
        }
    }
}

/// A CEL `diskSelector.match` needs the v1.14 contract: below it the install disk is
/// `machine.install`, whose selector has no expression field.
fn refuse_disk_match(cluster: &Cluster, parts: &Parts, d: &mut Diagnostics) {
    for node in parts.nodes.iter().filter(|n| n.storage.raid.is_none()) {
        let InstallTarget::Selector(DiskSelector { expr: Some(e), .. }) = &node.install else {
            continue;
        };
        d.error_hint(
            &e.loc,
            format!("node {}: diskSelector.match", node.name.value),
            format!(
                "a CEL disk expression needs Talos v1.14 or later; this cluster runs {}",
                cluster.talos_version.value
            ),
            "select with model, serial, size, type, wwid or busPath, or raise talosVersion",
        );
    }
}

/// The contract rules for one patch's keys: JSON-patch operations below a section the
/// contract moved, then each field (legacy fields next to their conflicting document, fields
/// talboot translates, refused and deprecated ones). A key under one already reported is not
/// reported again.
fn patch_contract_rules(
    contract: crate::talosfacts::contract::Contract,
    patch: &Patch,
    d: &mut Diagnostics,
) {
    use crate::talosfacts::contract::Contract;
    let keys = &patch.keys;
    let mut reported: Vec<&[String]> = Vec::new();
    // A JSON-patch operation below a v1.13 section the v1.14 v1alpha1 document no longer has
    // (`/machine/kubelet/extraArgs/x`) cannot apply: the section is not there to patch.
    if contract >= Contract::V1_14 {
        reported = ops_below_moved_sections(contract, keys, d);
    }
    for (path, loc) in &keys.fields {
        if reported
            .iter()
            .any(|r| starts(path, &r.iter().map(String::as_str).collect::<Vec<_>>()))
        {
            continue;
        }
        if field_contract_rule(contract, keys, path, loc, d) {
            reported.push(path);
        }
    }
}

/// Whether `p` begins with `prefix`.
fn starts(p: &[String], prefix: &[&str]) -> bool {
    p.len() >= prefix.len() && p.iter().zip(prefix).all(|(a, b)| a == b)
}

/// Whether `longer` lies strictly below `prefix`.
fn strictly_under(prefix: &[String], longer: &[&str]) -> bool {
    longer.len() > prefix.len() && prefix.iter().zip(longer).all(|(a, b)| a == b)
}

/// The JSON-patch operations whose parent the v1.14 v1alpha1 document no longer has,
/// reported; their paths are returned.
fn ops_below_moved_sections<'a>(
    contract: crate::talosfacts::contract::Contract,
    keys: &'a PatchKeys,
    d: &mut Diagnostics,
) -> Vec<&'a [String]> {
    use crate::talosfacts::legacy::TRANSLATED;
    use crate::talosfacts::schema::v1alpha1_has;
    let mut reported: Vec<&[String]> = Vec::new();
    for (path, loc) in &keys.ops {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let Some((_, parent)) = refs.split_last() else {
            continue;
        };
        let translated = TRANSLATED.iter().find(|(p, _)| starts(path, p));
        if let Some((_, kind)) = translated
            && !parent.is_empty()
            && !v1alpha1_has(contract, parent)
        {
            d.error_hint(
                loc,
                &keys.at,
                format!(
                    "the JSON-patch operation on `/{}` needs `/{}` in the v1alpha1 \
                     document, which the v1.14 contract moved to the {kind} document",
                    path.join("/"),
                    parent.join("/")
                ),
                format!(
                    "write a strategic-merge patch (a {kind} document, or the v1.13 \
                     field, which talboot moves into {kind})"
                ),
            );
            reported.push(path);
        }
    }
    reported
}

/// The rule for one v1alpha1 field of a patch; true when it was reported (or is translated,
/// refused or deprecated), so that the keys under it are not looked at again.
fn field_contract_rule(
    contract: crate::talosfacts::contract::Contract,
    keys: &PatchKeys,
    path: &[String],
    loc: &Loc,
    d: &mut Diagnostics,
) -> bool {
    use crate::talosfacts::contract::Contract;
    use crate::talosfacts::legacy::{CONFLICTS, TRANSLATED};

    let has_kind = |kind: &str| keys.kinds.iter().any(|(k, _)| k == kind);
    let field = path.join(".");
    // The same patch sets the legacy field and the document Talos refuses it next to.
    if let Some(c) = CONFLICTS
        .iter()
        .find(|c| c.since <= contract && starts(path, c.path) && has_kind(c.kind))
    {
        d.error_hint(
            loc,
            &keys.at,
            format!(
                "the patch sets `{field}` and a {kind} document; Talos refuses `{legacy}` \
                 next to {kind} ({source} in siderolabs/talos \
                 pkg/machinery/config/types, V1Alpha1ConflictValidate)",
                kind = c.kind,
                legacy = c.path.join("."),
                source = c.source
            ),
            format!("write the setting only in the {} document", c.kind),
        );
        return true;
    }
    if contract >= Contract::V1_14
        && let Some((_, kind)) = TRANSLATED
            .iter()
            .find(|(p, k)| starts(path, p) && has_kind(k))
    {
        d.error_hint(
            loc,
            &keys.at,
            format!(
                "the patch sets `{field}` and a {kind} document; under the v1.14 contract \
                 talboot moves `{field}` into {kind}, so one patch must not set both"
            ),
            format!("write the setting only in the {kind} document"),
        );
        return true;
    }
    // Intermediate keys of fields that are translated or conflict further down.
    let intermediate = (contract >= Contract::V1_14
        && TRANSLATED.iter().any(|(p, _)| strictly_under(path, p)))
        || CONFLICTS
            .iter()
            .any(|c| c.since <= contract && strictly_under(path, c.path));
    if intermediate {
        return false;
    }
    classified_rule(contract, keys, path, loc, &field, d)
}

/// The rule for a field by what the contract makes of it ([`crate::talosfacts::legacy::classify`]): refused ones are
/// errors, deprecated ones without a new home warnings; true unless the field is current.
fn classified_rule(
    contract: crate::talosfacts::contract::Contract,
    keys: &PatchKeys,
    path: &[String],
    loc: &Loc,
    field: &str,
    d: &mut Diagnostics,
) -> bool {
    use crate::talosfacts::contract::Contract;
    use crate::talosfacts::legacy::{Fate, classify};
    use crate::talosfacts::schema::{DEPRECATED, v1alpha1_has};
    let refs: Vec<&str> = path.iter().map(String::as_str).collect();
    match classify(contract, &refs, v1alpha1_has(contract, &refs)) {
        Fate::Current => return false,
        Fate::Translated(_) => {}
        Fate::Refused(c) => {
            d.error_hint(
                loc,
                &keys.at,
                format!(
                    "`{field}` has no {contract} document talboot can move it into, and Talos \
                     refuses `{legacy}` next to the {kind} document talboot renders for \
                     the {contract} contract ({source} in siderolabs/talos \
                     pkg/machinery/config/types, V1Alpha1ConflictValidate)",
                    legacy = c.path.join("."),
                    kind = c.kind,
                    source = c.source
                ),
                format!(
                    "write it as a field of a {} document in the patch, or remove it",
                    c.kind
                ),
            );
        }
        Fate::Deprecated => {
            // v1.13's own deprecations are warned about where the patch is read.
            let v1_13_deprecated = DEPRECATED.iter().any(|dep| starts(path, dep.path));
            if contract >= Contract::V1_14 && !v1_13_deprecated {
                d.warning(
                    loc,
                    &keys.at,
                    format!(
                        "the patch sets `{field}`, which Talos {contract} deprecated (its \
                         config schema leaves it out) and which has no {contract} document; \
                         it stays in the v1alpha1 document"
                    ),
                    Some(
                        "move it to its replacement document when one exists (see the \
                         Talos release notes), or remove it"
                            .into(),
                    ),
                );
            }
        }
    }
    true
}
