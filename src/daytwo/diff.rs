//! The per-node config diff `talboot plan` prints and drift detection compares: what the
//! inventory renders against what the node runs (its `MachineConfig` resource), as documents
//! and fields added, changed and removed. Pure: two YAML texts in, a [`ConfigDiff`] out.
//!
//! Documents are keyed as Talos keys them (`configloader`: the v1alpha1 document, else
//! `apiVersion/kind/name`); fields are flattened to dotted paths with `[i]` for list items.
//! Secrets (keys, tokens, certificates, passwords) never appear: such a value is shown as
//! `<redacted sha256:XXXXXXXX>`, a digest prefix, so a changed secret is still visible as a
//! change without showing either side.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};
use yaml_serde::Value;

/// One field difference. Values are already redacted where they are secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldChange {
    Added {
        path: String,
        value: String,
    },
    Changed {
        path: String,
        old: String,
        new: String,
    },
    Removed {
        path: String,
        old: String,
    },
}

/// The difference of one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocChange {
    /// In the rendered config only.
    Added { doc: String },
    /// On the node only.
    Removed { doc: String },
    /// In both, with these field differences (never empty).
    Changed {
        doc: String,
        fields: Vec<FieldChange>,
    },
}

/// Everything that differs between a node's running config and the rendered one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigDiff {
    pub docs: Vec<DocChange>,
}

/// A config text that is not the YAML a Talos config is made of.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{side} config: {reason}")]
pub struct DiffError {
    pub side: &'static str,
    pub reason: String,
}

impl ConfigDiff {
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Number of field changes plus added/removed documents.
    pub fn len(&self) -> usize {
        self.docs
            .iter()
            .map(|d| match d {
                DocChange::Changed { fields, .. } => fields.len(),
                _ => 1,
            })
            .sum()
    }

    /// Whether anything is removed (a document or a field): the operator must see it.
    pub(crate) fn has_removals(&self) -> bool {
        self.docs.iter().any(|d| match d {
            DocChange::Removed { .. } => true,
            DocChange::Changed { fields, .. } => fields
                .iter()
                .any(|f| matches!(f, FieldChange::Removed { .. })),
            DocChange::Added { .. } => false,
        })
    }
}

impl fmt::Display for ConfigDiff {
    /// `+` added, `~` changed, `-` removed; removals carry `REMOVED` so they stand out even
    /// without colour.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.docs {
            match d {
                DocChange::Added { doc } => writeln!(f, "  + document {doc} (added)")?,
                DocChange::Removed { doc } => {
                    writeln!(f, "  - document {doc} REMOVED (on the node, not rendered)")?
                }
                DocChange::Changed { doc, fields } => {
                    writeln!(f, "  document {doc}:")?;
                    for c in fields {
                        match c {
                            FieldChange::Added { path, value } => {
                                writeln!(f, "    + {path}: {value}")?
                            }
                            FieldChange::Changed { path, old, new } => {
                                writeln!(f, "    ~ {path}: {old} -> {new}")?
                            }
                            FieldChange::Removed { path, old } => {
                                writeln!(f, "    - {path}: {old}   REMOVED")?
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Field names whose values are secret (matched on the last path segment, case-insensitive,
/// as a suffix): private keys, bootstrap and trustd tokens, encryption secrets, certificates.
const SECRET_SUFFIXES: &[&str] = &["key", "token", "secret", "crt", "password", "cert"];

fn is_secret(path: &str) -> bool {
    let last = path
        .rsplit('.')
        .next()
        .unwrap_or(path)
        .split('[')
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    SECRET_SUFFIXES.iter().any(|s| last.ends_with(s))
}

/// The value as shown: itself, or a digest prefix when secret.
fn shown(path: &str, value: &str) -> String {
    if is_secret(path) {
        let digest = Sha256::digest(value.as_bytes());
        format!("<redacted sha256:{}>", crate::hex::lower(&digest[..4]))
    } else {
        value.to_owned()
    }
}

/// The documents of a config text keyed as Talos keys them, in text order.
fn documents(text: &str, side: &'static str) -> Result<Vec<(String, Value)>, DiffError> {
    let mut out: Vec<(String, Value)> = Vec::new();
    for doc in yaml_serde::Deserializer::from_str(text) {
        let v = <Value as serde::Deserialize>::deserialize(doc).map_err(|e| DiffError {
            side,
            reason: e.to_string(),
        })?;
        if v.is_null() {
            continue;
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let key =
            if v.get("machine").is_some() || v.get("cluster").is_some() || s("kind").is_empty() {
                "v1alpha1".to_owned()
            } else if s("name").is_empty() {
                format!("{}/{}", s("apiVersion"), s("kind"))
            } else {
                format!("{}/{}/{}", s("apiVersion"), s("kind"), s("name"))
            };
        if out.iter().any(|(k, _)| *k == key) {
            return Err(DiffError {
                side,
                reason: format!("duplicate document {key}"),
            });
        }
        out.push((key, v));
    }
    Ok(out)
}

/// Leaves of a document as `path -> scalar text` (empty maps and lists are leaves too).
fn flatten(v: &Value, path: &str, out: &mut BTreeMap<String, String>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, v) in m {
                let k = match k {
                    Value::String(s) => s.clone(),
                    other => scalar(other),
                };
                flatten(v, &join(&k), out);
            }
        }
        Value::Sequence(s) if !s.is_empty() => {
            for (i, v) in s.iter().enumerate() {
                flatten(v, &format!("{path}[{i}]"), out);
            }
        }
        Value::Tagged(t) => flatten(&t.value, path, out),
        other => {
            out.insert(path.to_owned(), scalar(other));
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Mapping(m) if m.is_empty() => "{}".into(),
        Value::Sequence(s) if s.is_empty() => "[]".into(),
        other => yaml_serde::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

/// The difference from `running` (what the node has) to `rendered` (what it should have).
pub fn diff(running: &str, rendered: &str) -> Result<ConfigDiff, DiffError> {
    let old = documents(running, "running")?;
    let new = documents(rendered, "rendered")?;
    let mut docs = Vec::new();
    for (key, nv) in &new {
        match old.iter().find(|(k, _)| k == key) {
            None => docs.push(DocChange::Added { doc: key.clone() }),
            Some((_, ov)) => {
                let fields = diff_fields(ov, nv);
                if !fields.is_empty() {
                    docs.push(DocChange::Changed {
                        doc: key.clone(),
                        fields,
                    });
                }
            }
        }
    }
    for (key, _) in &old {
        if !new.iter().any(|(k, _)| k == key) {
            docs.push(DocChange::Removed { doc: key.clone() });
        }
    }
    Ok(ConfigDiff { docs })
}

fn diff_fields(old: &Value, new: &Value) -> Vec<FieldChange> {
    let (mut o, mut n) = (BTreeMap::new(), BTreeMap::new());
    flatten(old, "", &mut o);
    flatten(new, "", &mut n);
    let mut out = Vec::new();
    for (path, nv) in &n {
        match o.get(path) {
            None => out.push(FieldChange::Added {
                path: path.clone(),
                value: shown(path, nv),
            }),
            Some(ov) if ov != nv => out.push(FieldChange::Changed {
                path: path.clone(),
                old: shown(path, ov),
                new: shown(path, nv),
            }),
            Some(_) => {}
        }
    }
    for (path, ov) in &o {
        if !n.contains_key(path) {
            out.push(FieldChange::Removed {
                path: path.clone(),
                old: shown(path, ov),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RUNNING: &str = "version: v1alpha1\nmachine:\n  type: worker\n  token: abc.def\n  \
                           nodeLabels:\n    zone: a\n  sysctls:\n    vm.x: \"1\"\ncluster:\n  \
                           secretboxEncryptionSecret: s3cret\n---\napiVersion: v1alpha1\nkind: \
                           HostnameConfig\nhostname: n1\n";

    #[test]
    fn unchanged_is_empty() {
        assert!(diff(RUNNING, RUNNING).unwrap().is_empty());
    }

    #[test]
    fn a_label_change_is_exactly_that_field() {
        let new = RUNNING.replace("zone: a", "zone: b");
        let d = diff(RUNNING, &new).unwrap();
        assert_eq!(
            d.docs,
            vec![DocChange::Changed {
                doc: "v1alpha1".into(),
                fields: vec![FieldChange::Changed {
                    path: "machine.nodeLabels.zone".into(),
                    old: "a".into(),
                    new: "b".into()
                }]
            }]
        );
        assert!(!d.has_removals());
    }

    #[test]
    fn removals_are_marked_and_documents_keyed() {
        let new = RUNNING
            .replace("  sysctls:\n    vm.x: \"1\"\n", "")
            .replace(
                "HostnameConfig\nhostname: n1",
                "HostnameConfig\nhostname: n2",
            );
        let new = format!("{new}---\napiVersion: v1alpha1\nkind: KmsgLogConfig\nname: remote\n");
        let d = diff(RUNNING, &new).unwrap();
        assert!(d.has_removals());
        let text = d.to_string();
        assert!(
            text.contains("- machine.sysctls.vm.x: 1   REMOVED"),
            "{text}"
        );
        assert!(text.contains("document v1alpha1/HostnameConfig:"), "{text}");
        assert!(
            text.contains("+ document v1alpha1/KmsgLogConfig/remote (added)"),
            "{text}"
        );
        let back = diff(&new, RUNNING).unwrap().to_string();
        assert!(
            back.contains("document v1alpha1/KmsgLogConfig/remote REMOVED"),
            "{back}"
        );
    }

    #[test]
    fn secrets_are_redacted_but_their_change_shows() {
        let new = RUNNING
            .replace("abc.def", "xyz.uvw")
            .replace("s3cret", "other");
        let text = diff(RUNNING, &new).unwrap().to_string();
        for secret in ["abc.def", "xyz.uvw", "s3cret", "other"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert!(
            text.contains("~ machine.token: <redacted sha256:"),
            "{text}"
        );
        assert!(
            text.contains("~ cluster.secretboxEncryptionSecret: <redacted"),
            "{text}"
        );
    }

    #[test]
    fn bad_yaml_names_the_side() {
        let e = diff(RUNNING, "a: [").unwrap_err();
        assert_eq!(e.side, "rendered");
    }

    proptest! {
        /// Every label added, changed or removed shows up as exactly one field change of
        /// that kind, and nothing else changes.
        #[test]
        fn label_maps_diff_exactly(
            // Keys end in `x`, so none is a secret name (those are redacted, tested below).
            old in proptest::collection::btree_map("[a-z]{1,4}x", "[a-z]{1,4}", 0..6),
            new in proptest::collection::btree_map("[a-z]{1,4}x", "[a-z]{1,4}", 0..6),
        ) {
            let render = |m: &BTreeMap<String, String>| {
                let mut s = String::from("version: v1alpha1\nmachine:\n  type: worker\n  nodeLabels:");
                if m.is_empty() { s.push_str(" {}\n"); } else {
                    s.push('\n');
                    for (k, v) in m { s.push_str(&format!("    {k}: {v}\n")); }
                }
                s
            };
            let d = diff(&render(&old), &render(&new)).unwrap();
            let fields: Vec<FieldChange> = d.docs.into_iter().flat_map(|c| match c {
                DocChange::Changed { fields, .. } => fields,
                _ => vec![],
            }).collect();
            let mut want = 0;
            for (k, v) in &new {
                let path = format!("machine.nodeLabels.{k}");
                match old.get(k) {
                    None => { want += 1; let c = FieldChange::Added { path, value: v.clone() }; prop_assert!(fields.contains(&c)); }
                    Some(o) if o != v => { want += 1; let c = FieldChange::Changed { path, old: o.clone(), new: v.clone() }; prop_assert!(fields.contains(&c)); }
                    _ => {}
                }
            }
            for (k, o) in &old {
                if !new.contains_key(k) {
                    want += 1;
                    let path = format!("machine.nodeLabels.{k}");
                    let c = FieldChange::Removed { path, old: o.clone() }; prop_assert!(fields.contains(&c));
                }
            }
            // An empty map on one side is a leaf `{}` of its own.
            let empty_leaf = usize::from(old.is_empty() != new.is_empty());
            prop_assert_eq!(fields.len(), want + empty_leaf);
        }

        /// A secret's value never appears in the output, whatever it is.
        #[test]
        fn secret_values_never_leak(a in "[A-Za-z0-9]{6,20}", b in "[A-Za-z0-9]{6,20}") {
            prop_assume!(a != b);
            let t = |s: &str| format!("version: v1alpha1\nmachine:\n  type: worker\n  token: {s}\n");
            let text = diff(&t(&a), &t(&b)).unwrap().to_string();
            prop_assert!(!text.contains(&a) && !text.contains(&b));
        }
    }
}
