//! Validating rendered machine configs against the Talos JSON schema (`config.schema.json`,
//! draft 2020-12), one document at a time.
//!
//! The schema's root is a `oneOf` over every document type; validating a document against that
//! gives one error per alternative, which says nothing useful. So we read which `$defs` entry
//! describes which document (its `kind` enum, or `version` for the legacy v1alpha1 document) and
//! validate each document against exactly that definition. Errors name the node, the document
//! kind (and name) and the field path.
//!
//! # Caveats (`talos-facts.md` §5.5)
//!
//! The schema describes the documented subset of what Talos accepts: it omits `persist` and the
//! deprecated-but-accepted v1alpha1 fields (`machine.network`, `machine.disks`, `machine.env`,
//! `machine.time`, `machine.registries`, `machine.systemDiskEncryption`). Those keys are taken
//! out of a copy of the document before validation and reported back as
//! [`Report::unchecked`], never as errors, so the schema is not a hard gate for them.
//!
//! The v1.14 schema goes further: it drops from the v1alpha1 document everything that moved to
//! the new Kube*/Discovery*/... documents, although Talos v1.14 still accepts those legacy
//! fields (`talos-facts.md` §5.9) and we render them. With a schema whose `$id` says v1.14 or
//! later, "additional property" findings in the v1alpha1 document are therefore reported as
//! unchecked fields too; every other finding (wrong type, bad enum, ...) stays a violation.
//!
//! Error messages never quote a value from the document (configs carry keys and tokens).

use std::collections::HashMap;
use std::fmt;

use serde_json::Value as Json;
use thiserror::Error;
use yaml_serde::Value;

use super::patch::ConfigBundle;

/// Keys of the v1alpha1 document that Talos accepts but the schema omits.
const SCHEMA_OMITTED: &[&[&str]] = &[
    &["persist"],
    &["machine", "network"],
    &["machine", "disks"],
    &["machine", "env"],
    &["machine", "time"],
    &["machine", "registries"],
    &["machine", "systemDiskEncryption"],
];

/// Errors loading the schema itself.
#[derive(Debug, Error)]
pub enum SchemaError {
    /// The schema file cannot be parsed.
    #[error("{source_name}: not a JSON document: {reason}")]
    Parse {
        /// File (or label) the schema came from.
        source_name: String,
        /// Parser message.
        reason: String,
    },
    /// The schema is not shaped like Talos's (`$defs` plus a root `oneOf` of `$ref`s).
    #[error(
        "{source_name}: not a Talos config schema ({reason}); pass config.schema.json from the \
         Talos release (pkg/machinery/config/schemas)"
    )]
    Shape {
        /// File the schema came from.
        source_name: String,
        /// What is missing.
        reason: String,
    },
    /// A definition does not compile.
    #[error("{source_name}: definition {def} does not compile: {reason}")]
    Compile {
        /// File the schema came from.
        source_name: String,
        /// The `$defs` entry.
        def: String,
        /// Compiler message.
        reason: String,
    },
}

/// One schema violation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("node {node}: {document} `{field}`: {message}")]
pub struct Violation {
    /// The node whose config it is.
    pub node: String,
    /// Document kind, with its name for named kinds (e.g. `UserVolumeConfig garage-data`).
    pub document: String,
    /// Dotted field path inside the document (empty for the document itself).
    pub field: String,
    /// What is wrong, without the offending value.
    pub message: String,
}

/// The result of validating one node's config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Schema violations.
    pub violations: Vec<Violation>,
    /// Fields Talos accepts but the schema omits; present, not checked.
    pub unchecked: Vec<String>,
}

/// A loaded Talos config schema with one compiled validator per document type.
pub struct Schema {
    source_name: String,
    /// Definition name of the v1alpha1 document.
    legacy: String,
    /// `kind` -> definition name.
    kinds: HashMap<String, String>,
    /// Definition name -> compiled validator.
    validators: HashMap<String, jsonschema::Validator>,
    /// The schema omits legacy v1alpha1 fields Talos still accepts (v1.14 and later).
    thin_legacy: bool,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schema")
            .field("source", &self.source_name)
            .field("kinds", &self.kinds.len())
            .finish()
    }
}

/// First value of a property's `enum` (or its `const`).
fn enum_value<'a>(def: &'a Json, prop: &str) -> Option<&'a str> {
    let p = def.get("properties")?.get(prop)?;
    p.get("enum")
        .and_then(|e| e.get(0))
        .or_else(|| p.get("const"))
        .and_then(Json::as_str)
}

impl Schema {
    /// Parses schema text (`source_name` is used in messages) and compiles a validator per
    /// document type.
    pub fn from_text(source_name: &str, text: &str) -> Result<Self, SchemaError> {
        let root: Json = serde_json::from_str(text).map_err(|e| SchemaError::Parse {
            source_name: source_name.to_owned(),
            reason: e.to_string(),
        })?;
        let shape = |reason: &str| SchemaError::Shape {
            source_name: source_name.to_owned(),
            reason: reason.to_owned(),
        };
        let defs = root
            .get("$defs")
            .and_then(Json::as_object)
            .ok_or_else(|| shape("no `$defs`"))?;
        let one_of = root
            .get("oneOf")
            .and_then(Json::as_array)
            .ok_or_else(|| shape("no root `oneOf`"))?;
        let mut legacy = None;
        let mut kinds = HashMap::new();
        let mut validators = HashMap::new();
        for alt in one_of {
            let Some(name) = alt
                .get("$ref")
                .and_then(Json::as_str)
                .and_then(|r| r.strip_prefix("#/$defs/"))
            else {
                continue;
            };
            let Some(def) = defs.get(name) else {
                return Err(shape(&format!(
                    "`oneOf` refers to missing definition {name}"
                )));
            };
            if let Some(kind) = enum_value(def, "kind") {
                kinds.insert(kind.to_owned(), name.to_owned());
            } else if enum_value(def, "version") == Some("v1alpha1") {
                legacy = Some(name.to_owned());
            } else {
                continue;
            }
            // A root that is the one definition, with every definition beside it for `$ref`s.
            let mut single = serde_json::Map::new();
            if let Some(draft) = root.get("$schema") {
                single.insert("$schema".into(), draft.clone());
            }
            single.insert("$defs".into(), Json::Object(defs.clone()));
            single.insert("$ref".into(), Json::String(format!("#/$defs/{name}")));
            let validator = jsonschema::validator_for(&Json::Object(single)).map_err(|e| {
                SchemaError::Compile {
                    source_name: source_name.to_owned(),
                    def: name.to_owned(),
                    reason: e.to_string(),
                }
            })?;
            validators.insert(name.to_owned(), validator);
        }
        let legacy = legacy.ok_or_else(|| shape("no v1alpha1 document definition"))?;
        let thin_legacy = root
            .get("$id")
            .and_then(Json::as_str)
            .and_then(schema_minor)
            .is_some_and(|minor| minor >= 14);
        Ok(Schema {
            source_name: source_name.to_owned(),
            legacy,
            kinds,
            validators,
            thin_legacy,
        })
    }

    /// Document kinds this schema knows (excluding the legacy v1alpha1 document).
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }

    /// Validates every document of `node`'s config.
    pub fn validate(&self, node: &str, bundle: &ConfigBundle) -> Report {
        let mut report = Report::default();
        for doc in &bundle.docs {
            self.validate_doc(node, doc, &mut report);
        }
        report
    }

    fn validate_doc(&self, node: &str, doc: &Value, report: &mut Report) {
        let kind = doc.get("kind").and_then(Value::as_str);
        let name = doc.get("name").and_then(Value::as_str);
        let document = match (kind, name) {
            (Some(k), Some(n)) => format!("{k} {n}"),
            (Some(k), None) => k.to_owned(),
            (None, _) => "v1alpha1".to_owned(),
        };
        let violation = |field: String, message: String| Violation {
            node: node.to_owned(),
            document: document.clone(),
            field,
            message,
        };
        let def = match kind {
            None => &self.legacy,
            Some(k) => match self.kinds.get(k) {
                Some(d) => d,
                None => {
                    report.violations.push(violation(
                        "kind".into(),
                        format!("unknown document kind {k} in {}", self.source_name),
                    ));
                    return;
                }
            },
        };
        let mut json = match serde_json::to_value(doc) {
            Ok(j) => j,
            Err(e) => {
                report.violations.push(violation(
                    String::new(),
                    format!("not representable as JSON: {e}"),
                ));
                return;
            }
        };
        if kind.is_none() {
            for path in SCHEMA_OMITTED {
                if remove_path(&mut json, path) {
                    report.unchecked.push(path.join("."));
                }
            }
        }
        let validator = &self.validators[def];
        for error in validator.iter_errors(&json) {
            let field = error
                .instance_path()
                .to_string()
                .trim_start_matches('/')
                .replace('/', ".");
            if let (
                true,
                None,
                jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected },
            ) = (self.thin_legacy, kind, error.kind())
            {
                for key in unexpected {
                    report.unchecked.push(if field.is_empty() {
                        key.clone()
                    } else {
                        format!("{field}.{key}")
                    });
                }
                continue;
            }
            report.violations.push(violation(
                field,
                redact(&error.to_string(), error.instance()),
            ));
        }
    }
}

/// The Talos minor version in a schema `$id` such as
/// `https://talos.dev/v1.13/schemas/config.schema.json`.
fn schema_minor(id: &str) -> Option<u64> {
    let rest = id.split("/v1.").nth(1)?;
    rest.split('/').next()?.parse().ok()
}

/// Removes the key at `path` from a JSON object tree; true when it was there.
fn remove_path(json: &mut Json, path: &[&str]) -> bool {
    let (last, parents) = path.split_last().expect("paths are not empty");
    let mut cur = json;
    for p in parents {
        match cur.get_mut(*p) {
            Some(next) => cur = next,
            None => return false,
        }
    }
    cur.as_object_mut()
        .is_some_and(|o| o.remove(*last).is_some())
}

/// The validator's message with the offending value cut out: configs hold secrets.
fn redact(message: &str, instance: &Json) -> String {
    match instance {
        Json::Object(_) | Json::Array(_) | Json::Null | Json::Bool(_) => message.to_owned(),
        scalar => {
            let text = scalar.to_string();
            if text.len() > 2 {
                message.replace(&text, "<value>")
            } else {
                message.to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machineconfig::patch::ConfigBundle;
    use crate::machineconfig::testutil::talos_schema;

    #[test]
    fn knows_the_v1_13_document_kinds() {
        let Some(schema) = talos_schema() else { return };
        let kinds: Vec<&str> = schema.kinds().collect();
        for k in [
            "HostnameConfig",
            "LinkConfig",
            "LinkAliasConfig",
            "Layer2VIPConfig",
            "VolumeConfig",
            "UserVolumeConfig",
            "ResolverConfig",
        ] {
            assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
        }
    }

    #[test]
    fn names_node_kind_and_field_and_hides_values() {
        let Some(schema) = talos_schema() else { return };
        let bundle = ConfigBundle::parse(
            "version: v1alpha1\npersist: true\nmachine:\n  type: worker\n  time: {servers: [a]}\n  \
             install: {wipe: sekrit-value-123}\n  bogus: 1\n---\n\
             apiVersion: v1alpha1\nkind: HostnameConfig\nauto: sometimes\n---\n\
             apiVersion: v1alpha1\nkind: NoSuchConfig\n",
        )
        .unwrap();
        let report = schema.validate("n1", &bundle);
        assert_eq!(report.unchecked, vec!["persist", "machine.time"]);
        let v = &report.violations;
        assert!(
            v.iter().any(|e| e.document == "v1alpha1"
                && e.field == "machine.install.wipe"
                && e.message.contains("boolean")
                && !e.message.contains("sekrit")),
            "{v:#?}"
        );
        assert!(
            v.iter().any(|e| e.document == "v1alpha1"
                && e.field == "machine"
                && e.message.contains("bogus")),
            "{v:#?}"
        );
        assert!(
            v.iter()
                .any(|e| e.document == "HostnameConfig" && e.field == "auto"),
            "{v:#?}"
        );
        assert!(
            v.iter().any(
                |e| e.document == "NoSuchConfig" && e.message.contains("unknown document kind")
            ),
            "{v:#?}"
        );
        assert!(v.iter().all(|e| e.node == "n1"));
        assert_eq!(
            v.iter()
                .find(|e| e.field == "auto")
                .unwrap()
                .to_string()
                .split(':')
                .next()
                .unwrap(),
            "node n1"
        );
    }

    #[test]
    fn valid_documents_pass() {
        let Some(schema) = talos_schema() else { return };
        let bundle = ConfigBundle::parse(
            "apiVersion: v1alpha1\nkind: LinkConfig\nname: net0\nup: true\naddresses:\n  - address: 10.0.0.2/24\n",
        )
        .unwrap();
        assert_eq!(schema.validate("n", &bundle), Report::default());
    }

    #[test]
    fn v1_14_schema_leaves_legacy_fields_unchecked_but_checks_types() {
        let path = std::env::var_os("TALBOOT_TALOS_SCHEMA")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../shared/reference/talos/config.schema.json")
            })
            .with_file_name("config.v1.14.0-rc.1.schema.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            assert!(
                std::env::var_os("TALBOOT_SKIP_SCHEMA").is_some(),
                "{} is missing (set TALBOOT_SKIP_SCHEMA=1 to skip)",
                path.display()
            );
            return;
        };
        let schema = Schema::from_text("v1.14", &text).unwrap();
        let bundle = ConfigBundle::parse(
            "version: v1alpha1\npersist: true\nmachine:\n  type: worker\n  kubelet: {image: x}\n  \
             features: {diskQuotaSupport: 7, kubePrism: {enabled: true}}\n",
        )
        .unwrap();
        let report = schema.validate("n", &bundle);
        assert_eq!(
            report.unchecked,
            vec!["persist", "machine.features.kubePrism", "machine.kubelet"]
        );
        assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
        assert_eq!(
            report.violations[0].field,
            "machine.features.diskQuotaSupport"
        );
        assert_eq!(
            schema_minor("https://talos.dev/v1.13/schemas/config.schema.json"),
            Some(13)
        );
    }

    #[test]
    fn rejects_text_that_is_not_a_talos_schema() {
        assert!(matches!(
            Schema::from_text("x.json", "{}"),
            Err(SchemaError::Shape { .. })
        ));
        assert!(matches!(
            Schema::from_text("x.json", "nope"),
            Err(SchemaError::Parse { .. })
        ));
    }
}
