//! Manifest sets, pure: parsing multi-document YAML into Kubernetes objects, the apply order
//! (Namespaces, then CustomResourceDefinitions, then everything else), Helm's three ownership
//! markers, keeping live TLS material across re-renders, and the manifest text and digest
//! recorded in the Helm release.
//!
//! Objects are kept as JSON values: talboot applies arbitrary kinds (including custom
//! resources it has no Rust types for), and server-side apply takes exactly the fields given.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Label Helm requires on every object it adopts.
pub(crate) const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Annotation naming the owning Helm release.
pub(crate) const RELEASE_NAME_ANNOTATION: &str = "meta.helm.sh/release-name";
/// Annotation naming the owning Helm release's namespace.
pub(crate) const RELEASE_NAMESPACE_ANNOTATION: &str = "meta.helm.sh/release-namespace";

/// Errors from reading a manifest set.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A document is not valid YAML.
    #[error("{source_name}: document {doc} is not valid YAML: {message}")]
    Yaml {
        /// File or source the text came from.
        source_name: String,
        /// 0-based document index.
        doc: usize,
        /// Parser message.
        message: String,
    },
    /// A document is not a Kubernetes object.
    #[error(
        "{source_name}: document {doc} is not a Kubernetes object: {reason} \
         (every document needs apiVersion, kind and metadata.name)"
    )]
    NotAnObject {
        /// File or source the text came from.
        source_name: String,
        /// 0-based document index.
        doc: usize,
        /// What is missing.
        reason: String,
    },
}

/// What identifies one object: its API version, kind, namespace (if given) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// `apiVersion`, e.g. `apps/v1`.
    pub api_version: String,
    /// `kind`, e.g. `DaemonSet`.
    pub kind: String,
    /// `metadata.namespace`, if the object names one.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectRef {
    /// Reads the reference out of an object; `None` if a required field is missing.
    pub fn of(obj: &Value) -> Option<ObjectRef> {
        let api_version = obj.get("apiVersion")?.as_str()?.to_owned();
        let kind = obj.get("kind")?.as_str()?.to_owned();
        let meta = obj.get("metadata")?;
        let name = meta.get("name")?.as_str()?.to_owned();
        let namespace = meta
            .get("namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if api_version.is_empty() || kind.is_empty() || name.is_empty() {
            return None;
        }
        Some(ObjectRef {
            api_version,
            kind,
            namespace,
            name,
        })
    }

    /// API group (`""` for the core group).
    pub fn group(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map(|(g, _)| g)
            .unwrap_or("")
    }

    /// API version within the group.
    pub fn version(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map(|(_, v)| v)
            .unwrap_or(&self.api_version)
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Parses multi-document YAML into objects, skipping empty documents. `source_name` names the
/// text in errors. A `kind: List` document is expanded into its items, as kubectl does.
///
/// The text is read as kubectl and Helm read it ([`super::kyaml`]): documents split on `---`
/// lines, scalars resolved by YAML 1.1 rules (`defaultMode: 0400` is the integer 256), numbers
/// as a Go client sends them.
pub fn parse_documents(source_name: &str, text: &str) -> Result<Vec<Value>, ManifestError> {
    let values = match super::kyaml::json_stream(text) {
        Some(values) => values,
        None => yaml_documents(source_name, text)?,
    };
    let mut out = Vec::new();
    for (doc, value) in values.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        let items = match value.get("kind").and_then(Value::as_str) {
            Some(k) if k.ends_with("List") && value.get("items").is_some() => value
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            _ => vec![value],
        };
        for item in items {
            if !item.is_object() {
                return Err(ManifestError::NotAnObject {
                    source_name: source_name.to_owned(),
                    doc,
                    reason: "it is not a mapping".into(),
                });
            }
            if ObjectRef::of(&item).is_none() {
                return Err(ManifestError::NotAnObject {
                    source_name: source_name.to_owned(),
                    doc,
                    reason: "apiVersion, kind or metadata.name is missing or empty".into(),
                });
            }
            out.push(item);
        }
    }
    Ok(out)
}

/// Every YAML document of `text` as JSON (null for an empty one), in order.
fn yaml_documents(source_name: &str, text: &str) -> Result<Vec<Value>, ManifestError> {
    let chunks = super::kyaml::split(text).map_err(|e| ManifestError::Yaml {
        source_name: source_name.to_owned(),
        doc: match e {
            super::kyaml::LoadError::Separator { doc, .. } => doc,
            super::kyaml::LoadError::Invalid { .. } => 0,
        },
        message: e.to_string(),
    })?;
    chunks
        .into_iter()
        .enumerate()
        .map(|(doc, (first_line, chunk))| {
            super::kyaml::to_json(&chunk).map_err(|e| ManifestError::Yaml {
                source_name: source_name.to_owned(),
                doc,
                message: format!(
                    "line {}: {}",
                    first_line + e.line.saturating_sub(1),
                    e.reason
                ),
            })
        })
        .collect()
}

/// Which apply phase an object belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Namespaces: everything namespaced needs them.
    Namespace,
    /// CustomResourceDefinitions: custom resources need them Established.
    Crd,
    /// Everything else.
    Rest,
}

/// The phase of one object.
pub fn phase(obj: &Value) -> Phase {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let api = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    match (api, kind) {
        ("v1", "Namespace") => Phase::Namespace,
        (a, "CustomResourceDefinition") if a.starts_with("apiextensions.k8s.io/") => Phase::Crd,
        _ => Phase::Rest,
    }
}

/// Orders objects for applying: Namespaces, then CRDs, then the rest, each group keeping the
/// order it was given in (a stable sort, so renders that list objects deliberately stay so).
pub(crate) fn apply_order(mut objects: Vec<Value>) -> Vec<Value> {
    objects.sort_by_key(phase);
    objects
}

/// Stamps Helm's ownership markers onto an object: label `app.kubernetes.io/managed-by=Helm`,
/// annotations `meta.helm.sh/release-name` and `meta.helm.sh/release-namespace`. Without them
/// `helm upgrade` refuses to adopt the object ("invalid ownership metadata").
pub(crate) fn stamp_markers(obj: &mut Value, release: &str, release_namespace: &str) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let labels = sub_map(meta, "labels");
    labels.insert(MANAGED_BY_LABEL.into(), Value::String("Helm".into()));
    let annotations = sub_map(meta, "annotations");
    annotations.insert(
        RELEASE_NAME_ANNOTATION.into(),
        Value::String(release.into()),
    );
    annotations.insert(
        RELEASE_NAMESPACE_ANNOTATION.into(),
        Value::String(release_namespace.into()),
    );
}

/// Whether an object carries all three markers for this release.
pub fn has_markers(obj: &Value, release: &str, release_namespace: &str) -> bool {
    let meta = &obj["metadata"];
    meta["labels"][MANAGED_BY_LABEL] == "Helm"
        && meta["annotations"][RELEASE_NAME_ANNOTATION] == release
        && meta["annotations"][RELEASE_NAMESPACE_ANNOTATION] == release_namespace
}

fn sub_map<'a>(meta: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = meta
        .entry(key.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().expect("just made an object")
}

/// Data keys that hold TLS material (a `kubernetes.io/tls` Secret or a CA bundle).
const TLS_KEYS: &[&str] = &["ca.crt", "ca.key", "tls.crt", "tls.key"];

/// Whether a rendered object is a Secret holding only TLS material: the kind of Secret that
/// Cilium's chart mints afresh on every offline render (Hubble and ClusterMesh CAs and
/// leaves, because `lookup` cannot see the cluster during `helm template`).
pub(crate) fn is_tls_secret(obj: &Value) -> bool {
    if obj["apiVersion"] != "v1" || obj["kind"] != "Secret" {
        return false;
    }
    if obj["type"] == "kubernetes.io/tls" {
        return true;
    }
    match obj.get("data").and_then(Value::as_object) {
        Some(data) if !data.is_empty() => data.keys().all(|k| TLS_KEYS.contains(&k.as_str())),
        _ => false,
    }
}

/// Keeps certificate material stable across re-renders: if a rendered TLS Secret (see
/// [`is_tls_secret`]) already exists in the cluster as an object of this release, the live
/// `data` replaces the freshly minted one. Without this every re-render would rotate the
/// Hubble CA and churn the cluster. Returns whether the live material was kept.
pub(crate) fn carry_tls_material(
    rendered: &mut Value,
    live: &Value,
    release: &str,
    ns: &str,
) -> bool {
    if !is_tls_secret(rendered) || !has_markers(live, release, ns) {
        return false;
    }
    let Some(live_data) = live.get("data").filter(|d| d.is_object()) else {
        return false;
    };
    let same_keys = match (rendered["data"].as_object(), live_data.as_object()) {
        (Some(r), Some(l)) => r.keys().eq(l.keys()),
        _ => false,
    };
    if !same_keys {
        return false;
    }
    rendered["data"] = live_data.clone();
    true
}

/// The manifest text recorded in the Helm release: every applied object as YAML, in apply
/// order, each document preceded by `---`, as Helm joins rendered templates.
///
/// Helm reads this text back with Kubernetes' YAML 1.1 loader ([`super::kyaml`]), while
/// yaml_serde writes YAML 1.2 and leaves strings such as `on`, `yes` or `0o17` unquoted, which
/// that loader would read as `true` or 15. A document that does not read back as the object
/// it came from is written as JSON instead (JSON is YAML, and reads back exactly).
pub(crate) fn manifest_text(objects: &[Value]) -> String {
    let mut out = String::new();
    for obj in objects {
        out.push_str("---\n");
        // A JSON object always serialises to YAML.
        let mut yaml = yaml_serde::to_string(obj).unwrap_or_default();
        if super::kyaml::to_json(&yaml).ok().as_ref() != Some(obj) {
            yaml = serde_json::to_string(obj).unwrap_or_default();
        }
        out.push_str(&yaml);
        if !yaml.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// A stable digest (SHA-256, hex) of a manifest text: equal texts, equal digests.
pub(crate) fn digest(manifest: &str) -> String {
    crate::hex::lower(&Sha256::digest(manifest.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SET: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
---
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
---
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: demo}}
";

    #[test]
    fn parses_and_orders_namespaces_crds_rest() {
        let objs = parse_documents("set.yaml", SET).unwrap();
        assert_eq!(objs.len(), 4);
        let ordered = apply_order(objs);
        let kinds: Vec<_> = ordered
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "CustomResourceDefinition",
                "Deployment",
                "ConfigMap"
            ]
        );
    }

    #[test]
    fn rejects_documents_without_identity() {
        let err = parse_documents("bad.yaml", "kind: ConfigMap\nmetadata: {name: x}\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bad.yaml") && err.contains("apiVersion"),
            "{err}"
        );
        let err = parse_documents("bad.yaml", "a: [\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not valid YAML"), "{err}");
    }

    #[test]
    fn object_ref_splits_group_and_version() {
        let r = ObjectRef::of(&json!({"apiVersion":"apps/v1","kind":"DaemonSet",
            "metadata":{"name":"cilium","namespace":"kube-system"}}))
        .unwrap();
        assert_eq!((r.group(), r.version()), ("apps", "v1"));
        assert_eq!(r.to_string(), "DaemonSet kube-system/cilium");
        let core = ObjectRef::of(&json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}))
            .unwrap();
        assert_eq!((core.group(), core.version()), ("", "v1"));
    }

    #[test]
    fn markers_are_stamped_without_losing_labels() {
        let mut obj = json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"name":"c","labels":{"app":"x"}}});
        assert!(!has_markers(&obj, "cilium", "kube-system"));
        stamp_markers(&mut obj, "cilium", "kube-system");
        assert!(has_markers(&obj, "cilium", "kube-system"));
        assert!(!has_markers(&obj, "cilium", "default"));
        assert_eq!(obj["metadata"]["labels"]["app"], "x");
    }

    #[test]
    fn tls_material_is_carried_only_for_own_tls_secrets() {
        let mut rendered = json!({"apiVersion":"v1","kind":"Secret","type":"kubernetes.io/tls",
            "metadata":{"name":"hubble-server-certs"},
            "data":{"ca.crt":"TkVX","tls.crt":"TkVX","tls.key":"TkVX"}});
        let mut live = rendered.clone();
        live["data"] = json!({"ca.crt":"T0xE","tls.crt":"T0xE","tls.key":"T0xE"});
        // Not ours: keep the render.
        assert!(!carry_tls_material(
            &mut rendered,
            &live,
            "cilium",
            "kube-system"
        ));
        stamp_markers(&mut live, "cilium", "kube-system");
        assert!(carry_tls_material(
            &mut rendered,
            &live,
            "cilium",
            "kube-system"
        ));
        assert_eq!(rendered["data"]["ca.crt"], "T0xE");
        // A non-TLS Secret is never overridden.
        let mut plain = json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"p"},
            "data":{"password":"TkVX"}});
        assert!(!carry_tls_material(
            &mut plain,
            &live,
            "cilium",
            "kube-system"
        ));
    }

    #[test]
    fn manifest_text_round_trips_and_digest_is_stable() {
        let objs = apply_order(parse_documents("set.yaml", SET).unwrap());
        let text = manifest_text(&objs);
        assert!(text.starts_with("---\n"));
        assert_eq!(parse_documents("manifest", &text).unwrap(), objs);
        assert_eq!(digest(&text), digest(&manifest_text(&objs)));
        assert_ne!(digest(&text), digest(&manifest_text(&objs[1..])));
        assert_eq!(digest("").len(), 64);
    }

    #[test]
    fn rendered_octal_modes_are_integers_as_kubectl_reads_them() {
        // Issue 31 item 1: Cilium 1.18's DaemonSets render `defaultMode: 0400`.
        let text = "\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: cilium, namespace: kube-system}
spec:
  template:
    spec:
      volumes:
      - name: hubble-tls
        projected:
          # note: the leading zero means this number is in octal representation
          defaultMode: 0400
          sources: [{secret: {name: hubble-server-certs, optional: yes}}]
      - name: quoted
        secret: {secretName: x, defaultMode: '0400'}
";
        let objs = parse_documents("cilium.yaml", text).unwrap();
        let volumes = &objs[0]["spec"]["template"]["spec"]["volumes"];
        assert_eq!(volumes[0]["projected"]["defaultMode"], json!(256));
        assert_eq!(
            volumes[0]["projected"]["sources"][0]["secret"]["optional"],
            json!(true)
        );
        assert_eq!(volumes[1]["secret"]["defaultMode"], json!("0400"));
    }

    #[test]
    fn a_bad_document_separator_names_the_line() {
        let err = parse_documents("set.yaml", "a: 1\n--- b: 2\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("set.yaml") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn manifest_text_reads_back_the_same_under_yaml_1_1() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "demo"},
            "data": {"a": "on", "b": "yes", "c": "0o17", "d": "1_000", "e": "y", "f": "0400",
                     "g": "plain"}});
        let plain = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "p"}, "data": {"k": "v"}});
        let objs = vec![obj, plain];
        let text = manifest_text(&objs);
        assert_eq!(parse_documents("manifest", &text).unwrap(), objs);
        // Objects without such strings keep the YAML form.
        assert!(text.contains("name: p"), "{text}");
    }

    #[test]
    fn a_json_stream_gives_one_object_per_value() {
        let text = r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}
{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"n": "0400"}}"#;
        let objs = parse_documents("set.json", text).unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[1]["data"]["n"], "0400");
    }
}
