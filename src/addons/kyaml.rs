//! Rendered manifests read exactly as Kubernetes' own manifest loader reads them, pure (text
//! in, JSON objects out). kubectl and Helm (v3 and v4) hand a manifest stream to k8s.io/
//! apimachinery's `YAMLOrJSONDecoder`, which splits it into documents on `---` lines and turns
//! each into JSON with sigs.k8s.io/yaml's `YAMLToJSON`; that parses with go-yaml v2, whose
//! scalars follow YAML 1.1: `0400` is the integer 256, `yes`/`on` are `true`, `1e3` is a
//! number. The client then decodes that JSON keeping integers (int64) apart from floats, and
//! sends the object re-encoded with Go's `encoding/json`. A YAML 1.2 reader (saphyr,
//! yaml_serde) reads `0400` as the string `"0400"`, which the API server refuses for an
//! integer field (`expected numeric (int or float), got string`), so talboot must not.
//!
//! Upstream, as modelled here (each rule's source is named where it is applied):
//! - kubernetes/apimachinery v0.36.3 `pkg/util/yaml/decoder.go` (`YAMLReader.Read`: the
//!   document split; `YAMLToJSONDecoder.Decode`), `pkg/util/json/json.go` (numbers: int64
//!   when the JSON text is an integer that fits, else float64); its go.mod pins
//!   sigs.k8s.io/yaml v1.6.0 and go.yaml.in/yaml/v2 v2.4.3;
//! - sigs.k8s.io/yaml v1.6.0 `yaml.go` (`yamlToJSONTarget`, `convertToJSONableObject`: map
//!   keys to strings, Go's `json.Marshal` for the rest);
//! - go.yaml.in/yaml/v2 v2.4.3 (github.com/yaml/go-yaml tag v2.4.3; the same code as
//!   sigs.k8s.io/yaml v1.4.0 `goyaml.v2`): `resolve.go` (`resolve`, `parseTimestamp`),
//!   `decode.go` (`scalar`, `mapping`, `merge`, aliases), `parserc.go` (which scalars are
//!   implicit).
//!
//! saphyr-parser supplies the events (structure, styles, tags, anchors); the scalar rules
//! are ours. Where talboot is deliberately narrower: nesting beyond [`MAX_DEPTH`] levels is
//! refused (go-yaml allows 10000) so a hostile file cannot exhaust the stack; where Go leaves
//! an order undefined (two keys that become the same JSON key, such as `1` and `"1"`), the
//! later one wins. A text that starts with `{` and is a stream of JSON values is read as JSON,
//! one document per value, as the decoder's JSON path does (`GuessJSONStream`), with the same
//! number rules; anything else goes through the YAML path.
//!
//! Submodules: `tree` (saphyr's events into go-yaml's node tree), `decode` (the tree into
//! Go's `interface{}` values: aliases, merges, scalars), `resolve` (go-yaml's scalar rules),
//! `gostd` (the Go standard library's number and time parsing those rules call), `json` (the
//! values as `json.Marshal` writes them and a client reads them back).

mod decode;
mod gostd;
mod json;
mod resolve;
mod tree;

use serde_json::Value;

/// How deeply collections may nest (after aliases are expanded). Charts' CRDs need a few
/// dozen levels; the YAML reader used before this one stopped at 128 as well.
pub(crate) const MAX_DEPTH: usize = 128;

/// Why a manifest text cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadError {
    /// A line starting with `---` carries more than a comment (`YAMLReader.Read`).
    #[error(
        "line {line}: invalid YAML document separator: {rest:?} (after `---` only a comment \
         may follow on the same line; put the document on the next line)"
    )]
    Separator {
        /// 0-based index of the document the separator would end.
        doc: usize,
        /// 1-based line of the separator.
        line: usize,
        /// What follows the `---`.
        rest: String,
    },
    /// The YAML itself is malformed, or a value cannot be converted to JSON.
    #[error("line {line}: {reason}")]
    Invalid {
        /// 1-based line (of the whole text) where the problem is, as near as known.
        line: usize,
        /// What is wrong.
        reason: ValueError,
    },
}

/// Why one document cannot be read as JSON. The texts are go-yaml's, sigs.k8s.io/yaml's and
/// `encoding/json`'s, so they match what kubectl or Helm would say, plus talboot's hint on
/// what to change where theirs has none.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    /// The YAML is malformed (the parser's message).
    #[error("yaml: {0}")]
    Syntax(String),
    /// An alias names an anchor not defined before it.
    #[error("yaml: unknown anchor referenced")]
    UnknownAnchor,
    /// A collection ends that was never opened.
    #[error("yaml: unbalanced collection end")]
    Unbalanced,
    /// Nesting beyond [`MAX_DEPTH`].
    #[error(
        "nested more than {max} levels deep (mappings and lists inside one another, \
         aliases expanded); talboot refuses deeper manifests so that a hostile file cannot \
         crash it: flatten this structure",
        max = MAX_DEPTH
    )]
    TooDeep,
    /// go-yaml's alias budget (a "billion laughs") is spent.
    #[error("yaml: document contains excessive aliasing")]
    ExcessiveAliasing,
    /// An alias is expanded inside its own anchor.
    #[error("yaml: anchor value contains itself")]
    AliasCycle,
    /// A `<<` merge key's value is not a mapping or a list of mappings.
    #[error("yaml: map merge requires map or sequence of maps as the value")]
    MergeNotMap,
    /// A mapping or sequence is used as a mapping key.
    #[error("yaml: invalid map key: a mapping or sequence cannot be a key")]
    CollectionKey,
    /// A `!!binary` scalar is not padded base64.
    #[error("yaml: !!binary value contains invalid base64 data")]
    Base64,
    /// An explicit core tag disagrees with what the text resolves to.
    #[error("yaml: cannot decode {found} `{input}` as a {wanted}")]
    TagMismatch {
        /// The tag the text resolves to (`!!float`).
        found: String,
        /// The scalar's text.
        input: String,
        /// The tag it carries (`!!int`).
        wanted: String,
    },
    /// NaN or an infinity, which JSON cannot hold (Go's name for it).
    #[error(
        "json: unsupported value: {0} (JSON has no NaN or infinity; quote it if a \
         string is meant)"
    )]
    NotFinite(&'static str),
    /// A null mapping key.
    #[error("unsupported map key of type: <nil> (a null key; quote it)")]
    NullKey,
    /// An integer mapping key beyond int64.
    #[error(
        "unsupported map key of type: uint64, key: {0} (an integer key beyond int64; quote it)"
    )]
    UintKey(u64),
    /// A collection reached JSON as a mapping key.
    #[error("yaml: invalid map key")]
    InvalidKey,
}

/// A [`ValueError`] at a line of one document's text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DocError {
    /// 1-based line within the document's text.
    pub(crate) line: usize,
    /// What is wrong.
    pub(crate) reason: ValueError,
}

impl ValueError {
    /// This error at `line` of the document.
    fn at(self, line: usize) -> DocError {
        DocError { line, reason: self }
    }
}

/// Splits `text` into documents as apimachinery's `YAMLReader.Read` does: a line beginning
/// with `---` ends a document (only spaces and a `#` comment may follow it, anything else is
/// an error), empty documents are dropped, and line ends are normalised to `\n` (Go's
/// `bufio.Reader.ReadLine` strips `\r\n`). Returns each document's first line and text.
pub(crate) fn split(text: &str) -> Result<Vec<(usize, String)>, LoadError> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut start = 1;
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        let line_no = i + 1;
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(rest) = line.strip_prefix("---") {
            let trimmed = rest.trim();
            if !trimmed.is_empty() && !trimmed.starts_with('#') {
                return Err(LoadError::Separator {
                    doc: out.len(),
                    line: line_no,
                    rest: trimmed.to_owned(),
                });
            }
            if !buf.is_empty() {
                out.push((start, std::mem::take(&mut buf)));
            }
            continue;
        }
        if buf.is_empty() {
            start = line_no;
        }
        buf.push_str(line);
        buf.push('\n');
    }
    if !buf.is_empty() {
        out.push((start, buf));
    }
    Ok(out)
}

/// A stream that `YAMLOrJSONDecoder` reads as JSON: it starts (after white space) with `{`
/// (`GuessJSONStream`) and is a sequence of JSON values. Their numbers become what the client
/// holds and sends, as for YAML. `None` when the text is not such a stream: the decoder then
/// falls back to YAML (it does so when the first value fails), and so does the caller.
pub(crate) fn json_stream(text: &str) -> Option<Vec<Value>> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    let values = serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    values
        .into_iter()
        .map(|v| json::client_numbers(v).ok())
        .collect()
}

/// One document of a manifest stream.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Document {
    /// 1-based line of the whole text where the document starts.
    pub(crate) line: usize,
    /// The document as JSON; `Null` for a document with nothing in it.
    pub(crate) value: Value,
}

/// Every document of a manifest stream, as `YAMLOrJSONDecoder` yields them (the tests' view;
/// `addons::manifest` reads a stream itself, naming the document in its errors).
#[cfg(test)]
pub(crate) fn load_all(text: &str) -> Result<Vec<Document>, LoadError> {
    split(text)?
        .into_iter()
        .map(|(line, doc)| {
            let value = to_json(&doc).map_err(|e| LoadError::Invalid {
                line: line + e.line.saturating_sub(1),
                reason: e.reason,
            })?;
            Ok(Document { line, value })
        })
        .collect()
}

/// One document's text as sigs.k8s.io/yaml `YAMLToJSON` turns it into JSON, then decoded as
/// apimachinery's JSON decoder does. Only the first YAML document in `text` counts, as
/// go-yaml's `Unmarshal` reads only that one. Errors carry the 1-based line within `text`.
pub(crate) fn to_json(text: &str) -> Result<Value, DocError> {
    let tree = tree::build(text)?;
    let Some(root) = tree.root else {
        return Ok(Value::Null);
    };
    let v = decode::Decoder::new(&tree).decode(root, 0)?;
    json::json_of(v).map_err(|e| e.at(tree.nodes[root].line))
}

#[cfg(test)]
mod tests;
