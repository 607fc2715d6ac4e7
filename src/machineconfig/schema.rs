//! Validating rendered machine configs against the Talos config schema, one document at a
//! time.
//!
//! # Where the schema comes from
//!
//! talboot carries the *facts* of the Talos config schema of every minor it renders in the
//! repository and in the binary ([`embedded_for`]; `talos-v1.13.schema-facts.json` and
//! `talos-v1.14.schema-facts.json` in `src/talosfacts/`, embedded by
//! [`crate::talosfacts::schema`], which the inventory reads too): document names, field
//! names, types, enums, required keys, patterns and `additionalProperties`, derived by
//! `scripts/derive-schema-facts` from siderolabs/talos `pkg/machinery/config/schemas/
//! config.schema.json` at v1.13.9 and at v1.14.0-rc.1 (the newest v1.14 tag), with every piece
//! of upstream prose (titles, descriptions, examples) dropped. `gen`, `check` and `serve`
//! validate against the facts of the cluster's minor ([`load_for`]); `--schema FILE` takes
//! another release's full `config.schema.json` instead.
//!
//! One correction is applied when a schema is loaded: v1.14.0-rc.1's schema gives the
//! `UnattendedInstallConfig` definition `kind: UnattendedInstall` (its `schemaMeta` annotation),
//! while Talos registers and accepts only `UnattendedInstallConfig`
//! (`pkg/machinery/config/types/runtime/unattended_install.go`, `UnattendedInstallConfigKind`).
//! The facts keep upstream's text; [`Schema::from_text`] validates the real kind.
//!
//! The schema's root is a `oneOf` over every document type; validating a document against that
//! gives one error per alternative, which says nothing useful. So we read which `$defs` entry
//! describes which document (its `kind` enum, or `version` for the legacy v1alpha1 document) and
//! validate each document against exactly that definition. Errors name the node, the document
//! kind (and name) and the field path.
//!
//! # Deprecated fields
//!
//! The schema describes the documented subset of what Talos accepts: it omits the v1alpha1
//! fields upstream marks `docgen:nodoc` + `Deprecated:` ([`DEPRECATED`], from
//! `pkg/machinery/config/types/v1alpha1/v1alpha1_types.go` at v1.13.9), which Talos still
//! accepts. Those keys are taken out of a copy of the document before validation and reported
//! back as [`Report::deprecated`] (a warning naming the replacement), never as errors;
//! `persist`, which `talosctl gen config` itself still writes, is only listed in
//! [`Report::unchecked`].
//!
//! The v1.14 schema goes further: it drops from the v1alpha1 document everything that moved to
//! the new Kube*/Discovery*/... documents, although Talos v1.14 still accepts those legacy
//! fields. talboot renders the v1.14 contract without them, so with a schema whose `$id` says
//! v1.14 or later an "additional property" in the v1alpha1 document is a field an operator's
//! patch left there (one with no v1.14 document): it is reported as deprecated, a warning, not a
//! violation. Every other finding (wrong type, bad enum, ...) stays a violation.
//!
//! Error messages never quote a value from the document (configs carry keys and tokens).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use serde_json::Value as Json;
use thiserror::Error;
use yaml_serde::Value;

use super::patch::ConfigBundle;
use crate::talosfacts::contract::Contract;
use crate::talosfacts::schema::{DEPRECATED, EMBEDDED_FACTS, EMBEDDED_FACTS_V1_14};

/// How messages name the embedded facts.
pub(crate) const EMBEDDED_NAME: &str = "talboot's embedded Talos v1.13 schema facts";

/// How messages name the embedded v1.14 facts.
pub(crate) const EMBEDDED_NAME_V1_14: &str = "talboot's embedded Talos v1.14 schema facts";

static EMBEDDED: LazyLock<Arc<Schema>> = LazyLock::new(|| {
    Arc::new(
        Schema::from_text(EMBEDDED_NAME, EMBEDDED_FACTS)
            .expect("the embedded schema facts compile (tested)"),
    )
});

static EMBEDDED_V1_14: LazyLock<Arc<Schema>> = LazyLock::new(|| {
    Arc::new(
        Schema::from_text(EMBEDDED_NAME_V1_14, EMBEDDED_FACTS_V1_14)
            .expect("the embedded schema facts compile (tested)"),
    )
});

/// The embedded Talos v1.13 facts (the schema of the v1.13 contract).
pub fn embedded() -> Arc<Schema> {
    EMBEDDED.clone()
}

/// The embedded facts of `contract`'s Talos minor.
pub(crate) fn embedded_for(contract: Contract) -> Arc<Schema> {
    match contract {
        Contract::V1_13 => EMBEDDED.clone(),
        Contract::V1_14 => EMBEDDED_V1_14.clone(),
    }
}

/// Why `--schema` could not be used.
#[derive(Debug, Error)]
pub enum SchemaLoadError {
    /// The file could not be read.
    #[error(
        "--schema {}: cannot read it: {source}; pass config.schema.json of the Talos release \
         (pkg/machinery/config/schemas), or leave --schema out to use the embedded v1.13 facts",
        path.display()
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a schema talboot can use.
    #[error("--schema: {0}")]
    Invalid(#[from] SchemaError),
}

/// The embedded v1.13 facts, or the full upstream `config.schema.json` at `path` (`--schema`,
/// for another Talos release). The error names the file and says what to pass.
pub fn load(path: Option<&Path>) -> Result<Arc<Schema>, SchemaLoadError> {
    load_for(path, Contract::V1_13)
}

/// The schema `check`, `gen`, `serve`, `up` and `plan` validate `inv`'s configs against: the
/// embedded facts of the cluster's Talos minor (v1.13 for a minor talboot does not render;
/// rendering then refuses it with its own message), or the file at `path`.
pub(crate) fn load_for_inventory(
    path: Option<&Path>,
    inv: &crate::inventory::Inventory,
) -> Result<Arc<Schema>, SchemaLoadError> {
    let contract =
        Contract::for_version(&inv.cluster.talos_version.value.0).unwrap_or(Contract::V1_13);
    load_for(path, contract)
}

/// The embedded facts of `contract` (the cluster's minor), or the file at `path`.
pub(crate) fn load_for(
    path: Option<&Path>,
    contract: Contract,
) -> Result<Arc<Schema>, SchemaLoadError> {
    let Some(path) = path else {
        return Ok(embedded_for(contract));
    };
    let text = std::fs::read_to_string(path).map_err(|source| SchemaLoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Arc::new(Schema::from_text(
        &path.display().to_string(),
        &text,
    )?))
}

/// A deprecated field found in a rendered config.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "node {node}: v1alpha1 `{field}` is deprecated since Talos {since} (not in its config \
     schema); use {replacement} instead"
)]
pub(crate) struct Deprecation {
    /// The node whose config it is.
    pub node: String,
    /// The Talos minor whose schema leaves it out (`v1.13`, `v1.14`).
    pub since: &'static str,
    /// Dotted field path in the v1alpha1 document.
    pub field: String,
    /// What to use instead.
    pub replacement: &'static str,
}

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
pub(crate) struct Violation {
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
pub(crate) struct Report {
    /// Schema violations.
    pub(crate) violations: Vec<Violation>,
    /// Fields Talos accepts but the schema omits; present, not checked.
    pub(crate) unchecked: Vec<String>,
    /// Deprecated fields present (warnings; also not checked).
    pub deprecated: Vec<Deprecation>,
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

/// The kind v1.14.0-rc.1's schema writes for `UnattendedInstallConfig` (see the module docs).
const MISNAMED_UNATTENDED: &str = "UnattendedInstall";

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
    pub(crate) fn from_text(source_name: &str, text: &str) -> Result<Self, SchemaError> {
        let root = parse_root(source_name, text)?;
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
            let def = corrected(def);
            if let Some(kind) = enum_value(&def, "kind") {
                kinds.insert(kind.to_owned(), name.to_owned());
            } else if enum_value(&def, "version") == Some("v1alpha1") {
                legacy = Some(name.to_owned());
            } else {
                continue;
            }
            let validator = compile_definition(source_name, &root, defs, name, &def)?;
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

    /// Where the schema came from (a file, or [`EMBEDDED_NAME`]).
    pub(crate) fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Document kinds this schema knows (excluding the legacy v1alpha1 document).
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }

    /// Validates every document of `node`'s config.
    pub(crate) fn validate(&self, node: &str, bundle: &ConfigBundle) -> Report {
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
            take_deprecated(node, &mut json, report);
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
                let leftovers = unexpected
                    .iter()
                    .map(|key| legacy_leftover(node, &field, key));
                report.deprecated.extend(leftovers);
                continue;
            }
            report.violations.push(violation(
                field,
                redact(&error.to_string(), error.instance()),
            ));
        }
    }
}

/// The schema text as JSON, refusing nesting deep enough to exhaust the parser's stack first
/// (`--schema` takes any file).
fn parse_root(source_name: &str, text: &str) -> Result<Json, SchemaError> {
    let parse = |reason: String| SchemaError::Parse {
        source_name: source_name.to_owned(),
        reason,
    };
    crate::nesting::check_json(text).map_err(|e| parse(e.to_string()))?;
    serde_json::from_str(text).map_err(|e| parse(e.to_string()))
}

/// A document definition with the one upstream mistake talboot corrects on load: the kind
/// v1.14.0-rc.1 writes for `UnattendedInstallConfig` (see the module docs).
fn corrected(def: &Json) -> Json {
    let mut def = def.clone();
    if enum_value(&def, "kind") == Some(MISNAMED_UNATTENDED) {
        def["properties"]["kind"] = serde_json::json!({"enum": ["UnattendedInstallConfig"]});
    }
    def
}

/// A validator for definition `name` alone. The root `oneOf` would answer with one error per
/// alternative, so the compiled root is the one definition, with every definition beside it
/// for `$ref`s (and `def`, corrected, in place of the original).
fn compile_definition(
    source_name: &str,
    root: &Json,
    defs: &serde_json::Map<String, Json>,
    name: &str,
    def: &Json,
) -> Result<jsonschema::Validator, SchemaError> {
    let mut single = serde_json::Map::new();
    if let Some(draft) = root.get("$schema") {
        single.insert("$schema".into(), draft.clone());
    }
    let mut defs = defs.clone();
    defs.insert(name.to_owned(), def.clone());
    single.insert("$defs".into(), Json::Object(defs));
    single.insert("$ref".into(), Json::String(format!("#/$defs/{name}")));
    jsonschema::validator_for(&Json::Object(single)).map_err(|e| SchemaError::Compile {
        source_name: source_name.to_owned(),
        def: name.to_owned(),
        reason: e.to_string(),
    })
}

/// Takes the deprecated v1alpha1 fields Talos still accepts out of `json` (the schema omits
/// them, so they would read as violations) and reports them: as deprecations with their
/// replacement, or as unchecked when `talosctl gen config` itself still writes them.
fn take_deprecated(node: &str, json: &mut Json, report: &mut Report) {
    for d in DEPRECATED {
        if !remove_path(json, d.path) {
            continue;
        }
        if d.warn {
            report.deprecated.push(Deprecation {
                node: node.to_owned(),
                since: "v1.13",
                field: d.path.join("."),
                replacement: d.replacement,
            });
        } else {
            report.unchecked.push(d.path.join("."));
        }
    }
}

/// A field of the v1alpha1 document that a v1.14 schema no longer lists (`key` under
/// `field`): one an operator's patch left there with no v1.14 document to move to, which
/// Talos still accepts, so a warning rather than a violation (see the module docs).
fn legacy_leftover(node: &str, field: &str, key: &str) -> Deprecation {
    Deprecation {
        node: node.to_owned(),
        since: "v1.14",
        field: if field.is_empty() {
            key.to_owned()
        } else {
            format!("{field}.{key}")
        },
        replacement: "its v1.14 document (talboot moves what has one; this \
                      field has none and stays, deprecated)",
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

    /// Upstream prose keywords the derivation drops (scripts/derive-schema-facts).
    const PROSE: &[&str] = &[
        "title",
        "description",
        "markdownDescription",
        "x-intellij-html-description",
        "examples",
        "$comment",
    ];

    /// Every schema keyword in `schema`, walking subschemas only (a property *named*
    /// `description` is a field, not prose).
    fn keywords(schema: &Json, out: &mut Vec<String>) {
        let Json::Object(map) = schema else { return };
        for (k, v) in map {
            out.push(k.clone());
            match (k.as_str(), v) {
                ("properties" | "patternProperties" | "$defs", Json::Object(named)) => {
                    for sub in named.values() {
                        keywords(sub, out);
                    }
                }
                ("oneOf" | "anyOf" | "allOf" | "prefixItems", Json::Array(list)) => {
                    for sub in list {
                        keywords(sub, out);
                    }
                }
                ("items" | "additionalProperties" | "not" | "if" | "then" | "else", sub) => {
                    keywords(sub, out)
                }
                _ => {}
            }
        }
    }

    fn facts() -> Json {
        serde_json::from_str(EMBEDDED_FACTS).unwrap()
    }

    #[test]
    fn embedded_facts_hold_no_upstream_prose() {
        let mut found = Vec::new();
        keywords(&facts(), &mut found);
        found.sort();
        found.dedup();
        for k in &found {
            assert!(
                !PROSE.contains(&k.as_str()),
                "prose keyword {k} in the facts"
            );
        }
        // Only validation keywords remain.
        for k in &found {
            assert!(
                [
                    "$schema",
                    "$id",
                    "$defs",
                    "$ref",
                    "oneOf",
                    "type",
                    "properties",
                    "patternProperties",
                    "additionalProperties",
                    "required",
                    "enum",
                    "pattern",
                    "items",
                    "format",
                ]
                .contains(&k.as_str()),
                "unexpected keyword {k}"
            );
        }
        // And no long free text hides in a value (patterns and enums are short).
        fn longest(v: &Json) -> usize {
            match v {
                Json::String(s) => s.len(),
                Json::Array(a) => a.iter().map(longest).max().unwrap_or(0),
                Json::Object(o) => o.values().map(longest).max().unwrap_or(0),
                _ => 0,
            }
        }
        assert!(longest(&facts()) < 200, "{}", longest(&facts()));
    }

    #[test]
    fn nothing_in_the_build_or_tests_reads_outside_the_repository() {
        // Built from pieces so this file does not match itself.
        let needles = [concat!("..", "/shared"), concat!("shared", "/reference")];
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut stack: Vec<std::path::PathBuf> = ["src", "tests", "scripts", "fuzz", ".ci"]
            .iter()
            .map(|d| root.join(d))
            .chain(["build.rs", "Cargo.toml"].iter().map(|f| root.join(f)))
            .collect();
        let mut scanned = 0;
        let mut offenders = Vec::new();
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                if path
                    .file_name()
                    .is_some_and(|n| n == "target" || n == "corpus")
                {
                    continue;
                }
                for e in std::fs::read_dir(&path).unwrap() {
                    stack.push(e.unwrap().path());
                }
            } else if let Ok(bytes) = std::fs::read(&path) {
                scanned += 1;
                let text = String::from_utf8_lossy(&bytes);
                if needles.iter().any(|n| text.contains(n)) {
                    offenders.push(path.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        assert!(scanned > 100, "scanned only {scanned} files");
        assert!(
            offenders.is_empty(),
            "these read the shared reference outside the repository: {offenders:?}"
        );
    }

    /// Runs scripts/derive-schema-facts on `input`; the output text.
    fn derive(input: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let (src, out) = (dir.path().join("in.json"), dir.path().join("out.json"));
        std::fs::write(&src, input).unwrap();
        let status = std::process::Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/derive-schema-facts"))
            .args([&src, &out])
            .status()
            .expect("python3 (scripts/test-deps installs it)");
        assert!(status.success());
        std::fs::read_to_string(out).unwrap()
    }

    #[test]
    fn the_derivation_drops_prose_keywords_but_keeps_fields_of_that_name() {
        let upstream = r##"{"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://talos.dev/v1.99/schemas/config.schema.json",
            "$defs": {"x.DocV1Alpha1": {"title": "Doc", "description": "Long prose.",
              "markdownDescription": "*prose*", "x-intellij-html-description": "<p>prose</p>",
              "properties": {
                "kind": {"enum": ["DocConfig"], "title": "kind", "description": "k"},
                "description": {"type": "string", "description": "a field named description"},
                "items": {"type": "array", "items": {"type": "string", "examples": ["a"]}},
                "mode": {"oneOf": [{"type": "string", "pattern": "^a$", "title": "t"}]}},
              "required": ["kind"], "additionalProperties": false, "type": "object"}},
            "oneOf": [{"$ref": "#/$defs/x.DocV1Alpha1"}]}"##;
        let facts: Json = serde_json::from_str(&derive(upstream)).unwrap();
        let expected: Json = serde_json::from_str(
            r##"{"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://talos.dev/v1.99/schemas/config.schema.json",
            "$defs": {"x.DocV1Alpha1": {"properties": {
                "kind": {"enum": ["DocConfig"]},
                "description": {"type": "string"},
                "items": {"type": "array", "items": {"type": "string"}},
                "mode": {"oneOf": [{"type": "string", "pattern": "^a$"}]}},
              "required": ["kind"], "additionalProperties": false, "type": "object"}},
            "oneOf": [{"$ref": "#/$defs/x.DocV1Alpha1"}]}"##,
        )
        .unwrap();
        assert_eq!(facts, expected);
        // The committed facts are the script's output: deriving them again changes nothing.
        assert_eq!(derive(EMBEDDED_FACTS), EMBEDDED_FACTS);
    }

    #[test]
    fn embedded_facts_are_the_v1_13_schema() {
        let f = facts();
        assert_eq!(
            f["$id"].as_str(),
            Some("https://talos.dev/v1.13/schemas/config.schema.json")
        );
        // v1.13.9 has 44 document kinds and 125 definitions (SOURCE of the reference copy).
        assert_eq!(f["$defs"].as_object().unwrap().len(), 125);
        assert_eq!(f["oneOf"].as_array().unwrap().len(), 44);
        let schema = embedded();
        assert_eq!(
            schema.kinds().count(),
            43,
            "43 kinds plus the v1alpha1 document"
        );
    }

    #[test]
    fn knows_the_v1_13_document_kinds() {
        let schema = embedded();
        let kinds: Vec<&str> = schema.kinds().collect();
        for k in [
            "HostnameConfig",
            "LinkConfig",
            "LinkAliasConfig",
            "Layer2VIPConfig",
            "VolumeConfig",
            "UserVolumeConfig",
            "ResolverConfig",
            "TimeSyncConfig",
        ] {
            assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
        }
    }

    /// The definition a dotted v1alpha1 path leads to in the facts, following `$ref`s.
    fn resolve<'a>(facts: &'a Json, path: &[&str]) -> Option<&'a Json> {
        let defs = &facts["$defs"];
        let deref = |mut v: &'a Json| {
            while let Some(r) = v.get("$ref").and_then(Json::as_str) {
                v = &defs[r.trim_start_matches("#/$defs/")];
            }
            v
        };
        let mut cur = deref(&defs["v1alpha1.Config"]);
        for p in path {
            cur = deref(cur.get("properties")?.get(*p)?);
        }
        Some(cur)
    }

    #[test]
    fn deprecated_fields_are_exactly_those_the_facts_leave_out() {
        let f = facts();
        assert!(resolve(&f, &["machine", "install", "disk"]).is_some());
        for d in DEPRECATED {
            assert!(
                resolve(&f, d.path).is_none(),
                "{} is in the schema, so it is not deprecated",
                d.path.join(".")
            );
            let (_, parent) = d.path.split_last().unwrap();
            assert!(
                resolve(&f, parent).is_some(),
                "{}: the parent is not in the schema either; wrong path?",
                d.path.join(".")
            );
        }
        // The replacement documents exist.
        let schema = embedded();
        let kinds: Vec<&str> = schema.kinds().collect();
        for k in [
            "TimeSyncConfig",
            "EnvironmentConfig",
            "UserVolumeConfig",
            "RegistryMirrorConfig",
        ] {
            assert!(kinds.contains(&k), "{k}");
        }
        assert!(resolve(&f, &["cluster", "allowSchedulingOnControlPlanes"]).is_some());
        assert!(resolve(&f, &["cluster", "etcd", "advertisedSubnets"]).is_some());
    }

    #[test]
    fn names_node_kind_and_field_and_hides_values() {
        let schema = embedded();
        let bundle = ConfigBundle::parse(
            "version: v1alpha1\npersist: true\nmachine:\n  type: worker\n  time: {servers: [a]}\n  \
             install: {wipe: sekrit-value-123}\n  bogus: 1\n---\n\
             apiVersion: v1alpha1\nkind: HostnameConfig\nauto: sometimes\n---\n\
             apiVersion: v1alpha1\nkind: NoSuchConfig\n",
        )
        .unwrap();
        let report = schema.validate("n1", &bundle);
        assert_eq!(report.unchecked, vec!["persist"]);
        assert_eq!(report.deprecated.len(), 1);
        let dep = report.deprecated[0].to_string();
        assert!(
            dep.starts_with("node n1: v1alpha1 `machine.time` is deprecated")
                && dep.contains("TimeSyncConfig"),
            "{dep}"
        );
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
    fn wrong_field_type_and_enum_are_rejected_with_document_and_path() {
        let schema = embedded();
        let bundle = ConfigBundle::parse(
            "apiVersion: v1alpha1\nkind: TimeSyncConfig\nntp: {servers: time.example.com}\n---\n\
             apiVersion: v1alpha1\nkind: LinkConfig\nname: net0\nup: true\nmtuu: 9000\n---\n\
             apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nfilesystem: {type: zfs}\n",
        )
        .unwrap();
        let messages: Vec<String> = schema
            .validate("n2", &bundle)
            .violations
            .iter()
            .map(ToString::to_string)
            .collect();
        let has = |prefix: &str, word: &str| {
            messages
                .iter()
                .any(|m| m.starts_with(prefix) && m.contains(word))
        };
        assert!(
            has("node n2: TimeSyncConfig `ntp.servers`:", "array"),
            "{messages:#?}"
        );
        assert!(has("node n2: LinkConfig net0 ``:", "mtuu"), "{messages:#?}");
        assert!(
            has("node n2: UserVolumeConfig data `filesystem.type`:", "xfs"),
            "{messages:#?}"
        );
        assert_eq!(messages.len(), 3, "{messages:#?}");
    }

    #[test]
    fn valid_documents_pass() {
        let schema = embedded();
        let bundle = ConfigBundle::parse(
            "apiVersion: v1alpha1\nkind: LinkConfig\nname: net0\nup: true\naddresses:\n  - address: 10.0.0.2/24\n---\n\
             apiVersion: v1alpha1\nkind: TimeSyncConfig\nntp: {servers: [10.0.0.1, pool.ntp.org]}\n",
        )
        .unwrap();
        assert_eq!(schema.validate("n", &bundle), Report::default());
    }

    #[test]
    fn v1_14_schema_reports_legacy_fields_as_deprecated_but_checks_types() {
        // A v1.14 schema thins the v1alpha1 document; what matters here is the `$id`, so the
        // embedded facts with a v1.14 `$id` and without `machine.kubelet` stand in for it.
        let mut f = facts();
        f["$id"] = "https://talos.dev/v1.14/schemas/config.schema.json".into();
        f["$defs"]["v1alpha1.MachineConfig"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("kubelet");
        let schema = Schema::from_text("v1.14", &f.to_string()).unwrap();
        let bundle = ConfigBundle::parse(
            "version: v1alpha1\npersist: true\nmachine:\n  type: worker\n  kubelet: {image: x}\n  \
             features: {diskQuotaSupport: 7}\n",
        )
        .unwrap();
        let report = schema.validate("n", &bundle);
        assert_eq!(report.unchecked, vec!["persist"]);
        let dep: Vec<String> = report.deprecated.iter().map(ToString::to_string).collect();
        assert_eq!(dep.len(), 1);
        assert!(
            dep[0]
                .starts_with("node n: v1alpha1 `machine.kubelet` is deprecated since Talos v1.14"),
            "{dep:?}"
        );
        assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
        assert_eq!(
            report.violations[0].field,
            "machine.features.diskQuotaSupport"
        );
        // The same document against the v1.13 facts: kubelet is known, so nothing unchecked.
        let report = embedded().validate("n", &bundle);
        assert_eq!(report.unchecked, vec!["persist"]);
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

    #[test]
    fn a_deeply_nested_override_is_a_located_error() {
        for depth in [crate::nesting::MAX_DEPTH + 1, 5_000, 50_000] {
            let text = format!("{{\"$defs\": {}{}}}", "[".repeat(depth), "]".repeat(depth));
            let Err(SchemaError::Parse {
                source_name,
                reason,
            }) = Schema::from_text("deep.json", &text)
            else {
                panic!("accepted")
            };
            assert_eq!(source_name, "deep.json");
            assert!(
                reason.starts_with("line 1, column ") && reason.contains("100 levels"),
                "{reason}"
            );
        }
    }

    #[test]
    fn load_falls_back_to_the_embedded_facts_and_names_a_bad_override() {
        assert!(Arc::ptr_eq(&load(None).unwrap(), &embedded()));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.json");
        let err = load(Some(&missing)).unwrap_err().to_string();
        assert!(
            err.contains("none.json") && err.contains("cannot read"),
            "{err}"
        );
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{}").unwrap();
        let err = load(Some(&bad)).unwrap_err().to_string();
        assert!(
            err.contains("bad.json") && err.contains("not a Talos config schema"),
            "{err}"
        );
        let good = dir.path().join("facts.json");
        std::fs::write(&good, EMBEDDED_FACTS).unwrap();
        assert_eq!(load(Some(&good)).unwrap().kinds().count(), 43);
    }

    #[test]
    fn embedded_v1_14_facts_are_v1_14_rc1s_schema_derived_like_v1_13s() {
        let f: Json = serde_json::from_str(EMBEDDED_FACTS_V1_14).unwrap();
        assert_eq!(
            f["$id"].as_str(),
            Some("https://talos.dev/v1.14/schemas/config.schema.json")
        );
        // v1.14.0-rc.1: 89 root alternatives (88 kinds + v1alpha1) and 167 definitions.
        assert_eq!(f["$defs"].as_object().unwrap().len(), 167);
        assert_eq!(f["oneOf"].as_array().unwrap().len(), 89);
        let mut found = Vec::new();
        keywords(&f, &mut found);
        assert!(found.iter().all(|k| !PROSE.contains(&k.as_str())));
        // Deriving them again changes nothing.
        assert_eq!(derive(EMBEDDED_FACTS_V1_14), EMBEDDED_FACTS_V1_14);
        let schema = embedded_for(Contract::V1_14);
        let kinds: Vec<&str> = schema.kinds().collect();
        assert_eq!(kinds.len(), 88);
        for k in [
            "UnattendedInstallConfig",
            "KubeNodeConfig",
            "KubeletConfig",
            "KubeClusterConfig",
            "KubeNetworkConfig",
            "KubePrismConfig",
            "SysctlConfig",
            "DiscoveryServiceConfig",
            "DiscoveryIdentityConfig",
        ] {
            assert!(kinds.contains(&k), "{k}");
        }
        // The misnamed kind of the upstream file is not accepted, the real one is.
        assert!(!kinds.contains(&"UnattendedInstall"));
        let ok = ConfigBundle::parse(
            "apiVersion: v1alpha1\nkind: UnattendedInstallConfig\n\
             provisioning: {diskSelector: {match: 'disk.dev_path == \"/dev/sda\"'}, wipe: false}\n",
        )
        .unwrap();
        assert_eq!(schema.validate("n", &ok), Report::default());
        // v1.13's facts do not know the v1.14 documents.
        let report = embedded_for(Contract::V1_13).validate("n", &ok);
        assert!(
            report.violations[0]
                .message
                .contains("unknown document kind")
        );
    }

    /// The documents an inventory's `installRaid` and `systemVolumes` render, in the shapes of
    /// Talos's own patches (`hack/test/patches/md-boot-array.yaml`,
    /// `dedicated-system-volumes-controlplane.yaml`), pass v1.14's schema; a metadata written
    /// as a YAML float, or a level other than raid1, does not (the enums are strings).
    #[test]
    fn raid_and_dedicated_volume_documents_pass_v1_14s_schema() {
        let schema = embedded_for(Contract::V1_14);
        assert!(schema.kinds().any(|k| k == "RAIDArrayConfig"));
        let ok = ConfigBundle::parse(
            "apiVersion: v1alpha1\nkind: RAIDArrayConfig\nname: boot\nlevel: raid1\n\
             metadata: \"1.0\"\nprovisioning:\n  volumeSelector:\n    \
             match: disk.transport == \"virtio\" && disk.size >= 12u * GiB\n---\n\
             apiVersion: v1alpha1\nkind: VolumeConfig\nname: ETCD\n\
             provisioning: {minSize: 1GB, maxSize: 2GB}\n---\n\
             apiVersion: v1alpha1\nkind: VolumeConfig\nname: LOG\n\
             provisioning: {diskSelector: {match: 'disk.serial == \"S3\"'}, grow: false, \
             maxSize: 1GB}\n",
        )
        .unwrap();
        assert_eq!(schema.validate("n", &ok), Report::default());
        for bad in ["metadata: 1.0", "level: raid5"] {
            let text = format!(
                "apiVersion: v1alpha1\nkind: RAIDArrayConfig\nname: boot\n{bad}\n\
                 provisioning: {{volumeSelector: {{match: 'disk.serial == \"S1\"'}}}}\n"
            );
            let report = schema.validate("n", &ConfigBundle::parse(&text).unwrap());
            assert_eq!(report.violations.len(), 1, "{bad}: {report:?}");
        }
        // v1.13's facts know neither document.
        let v113 = embedded_for(Contract::V1_13);
        assert!(!v113.kinds().any(|k| k == "RAIDArrayConfig"));
    }
}
