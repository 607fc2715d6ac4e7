//! Paths inside a document and the rule table: which paths merge differently from the default
//! (replace, keyed lists, `meta.Args`), read from the Talos sources.

use std::fmt;

use yaml_serde::Value;

use super::identity::{V1ALPHA1, scalar_text, shape};

/// One step into a document.
#[derive(Debug, Clone)]
pub(super) enum Seg {
    Key(Value),
    Index(usize),
}

/// A position inside a document, for rule lookup and error messages.
#[derive(Debug, Clone, Default)]
pub(super) struct Path(pub(super) Vec<Seg>);

impl Path {
    pub(super) fn push_key(&mut self, key: &Value) {
        self.0.push(Seg::Key(key.clone()));
    }

    pub(super) fn push_index(&mut self, i: usize) {
        self.0.push(Seg::Index(i));
    }

    pub(super) fn pop(&mut self) {
        self.0.pop();
    }

    pub(super) fn has_index(&self) -> bool {
        self.0.iter().any(|s| matches!(s, Seg::Index(_)))
    }

    /// The path with list positions written `[]`, as `RULES` spells paths.
    pub(super) fn pattern(&self) -> String {
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

pub(super) fn key_text(k: &Value) -> String {
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
pub(super) enum Rule {
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
pub(super) enum ListKey {
    /// `NetworkDeviceList.Merge`: by `interface` when the patch element names one, else by an
    /// equal `deviceSelector`.
    Device,
    /// By equal values of one field.
    Field(&'static str),
}

impl ListKey {
    pub(super) fn label(self) -> &'static str {
        match self {
            ListKey::Device => "interface or deviceSelector",
            ListKey::Field(f) => f,
        }
    }

    /// Whether config element `base` is the one patch element `patch` merges into.
    pub(super) fn matches(self, base: &Value, patch: &Value) -> bool {
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

pub(super) fn rule_for(kind: &str, pattern: &str) -> Rule {
    RULES
        .iter()
        .find(|row| row.kind == kind && row.path == pattern)
        .map_or(Rule::Default, |row| row.rule)
}

#[cfg(test)]
mod tests {
    use super::*;

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
