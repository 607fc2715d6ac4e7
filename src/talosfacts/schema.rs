//! The facts of the Talos config schema of every minor talboot renders, embedded in the
//! binary (`talos-v1.13.schema-facts.json` and `talos-v1.14.schema-facts.json` beside this
//! file, derived by `scripts/derive-schema-facts`; `machineconfig::schema` explains the
//! derivation and validates documents against them), the question the inventory asks of them
//! (is this v1alpha1 field in a minor's schema, [`v1alpha1_has`]), and the v1alpha1 fields
//! Talos v1.13 deprecated ([`DEPRECATED`]).

use std::sync::LazyLock;

use serde_json::Value as Json;

use super::contract::Contract;

/// The committed Talos v1.13 schema facts (see the module docs; regenerate with
/// `scripts/derive-schema-facts <config.schema.json> src/talosfacts/talos-v1.13.schema-facts.json`).
pub(crate) const EMBEDDED_FACTS: &str = include_str!("talos-v1.13.schema-facts.json");

/// The committed Talos v1.14 schema facts, from v1.14.0-rc.1 (git blob `84b4959f`), derived
/// the same way into `talos-v1.14.schema-facts.json`.
pub(crate) const EMBEDDED_FACTS_V1_14: &str = include_str!("talos-v1.14.schema-facts.json");

/// The facts JSON of `contract` (for path look-ups outside validation).
pub(crate) fn facts_text(contract: Contract) -> &'static str {
    match contract {
        Contract::V1_13 => EMBEDDED_FACTS,
        Contract::V1_14 => EMBEDDED_FACTS_V1_14,
    }
}

/// Whether the v1alpha1 document of `contract`'s schema has the field at `path` (following
/// `$ref`s); false for a field the schema leaves out (deprecated).
pub(crate) fn v1alpha1_has(contract: Contract, path: &[&str]) -> bool {
    static PARSED: LazyLock<Vec<(Contract, Json)>> = LazyLock::new(|| {
        Contract::ALL
            .iter()
            .map(|c| {
                (
                    *c,
                    serde_json::from_str(facts_text(*c)).expect("embedded facts parse (tested)"),
                )
            })
            .collect()
    });
    let Some((_, facts)) = PARSED.iter().find(|(c, _)| *c == contract) else {
        return false;
    };
    let defs = &facts["$defs"];
    let deref = |mut v: &Json| {
        while let Some(r) = v.get("$ref").and_then(Json::as_str) {
            v = &defs[r.trim_start_matches("#/$defs/")];
        }
        v.clone()
    };
    let mut cur = deref(&defs["v1alpha1.Config"]);
    for p in path {
        let next = match cur.get("properties").and_then(|ps| ps.get(*p)) {
            Some(n) => n.clone(),
            // A map of free keys (extraArgs, labels...): any key is in the schema.
            None => match cur
                .get("patternProperties")
                .and_then(Json::as_object)
                .and_then(|o| o.values().next())
                .or_else(|| cur.get("additionalProperties").filter(|a| a.is_object()))
            {
                Some(n) => n.clone(),
                None if cur.get("type").and_then(Json::as_str) == Some("object")
                    && cur.get("properties").is_none() =>
                {
                    return true;
                }
                None => return false,
            },
        };
        cur = deref(&next);
    }
    true
}

/// A v1alpha1 field Talos v1.13 still accepts but has deprecated, and what replaces it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeprecatedField {
    /// Key path inside the v1alpha1 document.
    pub path: &'static [&'static str],
    /// What to use instead (our words).
    pub replacement: &'static str,
    /// Warn about it (false for `persist`, which upstream's own generator still writes).
    pub(crate) warn: bool,
}

/// Every v1alpha1 field marked `docgen:nodoc` and `Deprecated:` in siderolabs/talos v1.13.9
/// `pkg/machinery/config/types/v1alpha1/v1alpha1_types.go` (line of the field in brackets).
/// None of them is in the v1.13 schema (tested against the embedded facts).
pub(crate) const DEPRECATED: &[DeprecatedField] = &[
    // [189] "Deprecated: Not supported anymore." Still written by talosctl gen config
    // (pkg/machinery/config/generate/init.go:22, worker.go:24), so no warning.
    DeprecatedField {
        path: &["persist"],
        replacement: "nothing (Talos ignores it)",
        warn: false,
    },
    // [294] "All fields within NetworkConfig are deprecated."
    DeprecatedField {
        path: &["machine", "network"],
        replacement: "the HostnameConfig, LinkConfig/BondConfig/VLANConfig, ResolverConfig, \
                      StaticHostConfig and KubeSpanConfig documents (talboot renders the \
                      hostname, addresses, routes and resolvers from the inventory)",
        warn: true,
    },
    // [298]
    DeprecatedField {
        path: &["machine", "disks"],
        replacement: "a UserVolumeConfig document",
        warn: true,
    },
    // [322]
    DeprecatedField {
        path: &["machine", "env"],
        replacement: "an EnvironmentConfig document",
        warn: true,
    },
    // [326]
    DeprecatedField {
        path: &["machine", "time"],
        replacement: "a TimeSyncConfig document (talboot renders one from the inventory's \
                      network.ntp)",
        warn: true,
    },
    // [342]
    DeprecatedField {
        path: &["machine", "registries"],
        replacement: "RegistryMirrorConfig, RegistryAuthConfig and RegistryTLSConfig documents",
        warn: true,
    },
    // [346]
    DeprecatedField {
        path: &["machine", "systemDiskEncryption"],
        replacement: "the `encryption` of VolumeConfig documents (STATE, EPHEMERAL)",
        warn: true,
    },
    // [898]
    DeprecatedField {
        path: &["machine", "install", "extraKernelArgs"],
        replacement: "an installer image built with the arguments (Image Factory schematic, \
                      cluster.installer in the inventory)",
        warn: true,
    },
    // [909]
    DeprecatedField {
        path: &["machine", "install", "extensions"],
        replacement: "an installer image with the extensions (Image Factory schematic)",
        warn: true,
    },
    // [913] "Deprecated: It never worked."
    DeprecatedField {
        path: &["machine", "install", "bootloader"],
        replacement: "nothing: remove it",
        warn: true,
    },
    // [2377]
    DeprecatedField {
        path: &["machine", "features", "stableHostname"],
        replacement: "a HostnameConfig document (`auto: stable`)",
        warn: true,
    },
    // [607]
    DeprecatedField {
        path: &["cluster", "allowSchedulingOnMasters"],
        replacement: "cluster.allowSchedulingOnControlPlanes",
        warn: true,
    },
    // [1485]
    DeprecatedField {
        path: &["cluster", "etcd", "subnet"],
        replacement: "cluster.etcd.advertisedSubnets",
        warn: true,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1alpha1_has_follows_the_minors_schema() {
        assert!(v1alpha1_has(
            Contract::V1_13,
            &["machine", "kubelet", "extraArgs", "x"]
        ));
        assert!(!v1alpha1_has(Contract::V1_14, &["machine", "kubelet"]));
        assert!(v1alpha1_has(
            Contract::V1_14,
            &["cluster", "etcd", "extraArgs", "x"]
        ));
        assert!(v1alpha1_has(
            Contract::V1_14,
            &["machine", "features", "diskQuotaSupport"]
        ));
        assert!(!v1alpha1_has(Contract::V1_14, &["machine", "sysctls"]));
        assert!(!v1alpha1_has(Contract::V1_13, &["machine", "network"]));
    }
}
