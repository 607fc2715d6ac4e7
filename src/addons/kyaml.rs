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

use std::borrow::Cow;

use base64::Engine as _;
use saphyr_parser::{Event, Parser, ScalarStyle, Tag};
use serde_json::{Map, Number, Value};

/// How deeply collections may nest (after aliases are expanded). Charts' CRDs need a few
/// dozen levels; the YAML reader used before this one stopped at 128 as well.
pub(crate) const MAX_DEPTH: usize = 128;

const STR_TAG: &str = "tag:yaml.org,2002:str";
const BOOL_TAG: &str = "tag:yaml.org,2002:bool";
const INT_TAG: &str = "tag:yaml.org,2002:int";
const FLOAT_TAG: &str = "tag:yaml.org,2002:float";
const NULL_TAG: &str = "tag:yaml.org,2002:null";
const TIMESTAMP_TAG: &str = "tag:yaml.org,2002:timestamp";
const BINARY_TAG: &str = "tag:yaml.org,2002:binary";
const MERGE_TAG: &str = "tag:yaml.org,2002:merge";

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
    #[error("line {line}: {message}")]
    Invalid {
        /// 1-based line (of the whole text) where the problem is, as near as known.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// One document of a manifest stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// 1-based line of the whole text where the document starts.
    pub line: usize,
    /// The document as JSON; `Null` for a document with nothing in it.
    pub value: Value,
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
    values.into_iter().map(|v| client_numbers(v).ok()).collect()
}

/// JSON numbers as apimachinery's decoder keeps them and Go's encoder writes them back
/// (see [`float_json`]): an integer that fits int64 stays one, anything else is a float64.
fn client_numbers(v: Value) -> Result<Value, String> {
    Ok(match v {
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::Number(i.into()),
            (None, Some(f)) => float_json(f)?,
            (None, None) => Value::Number(n),
        },
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(client_numbers)
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| Ok((k, client_numbers(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other,
    })
}

/// Every document of a manifest stream, as `YAMLOrJSONDecoder` yields them.
pub fn load_all(text: &str) -> Result<Vec<Document>, LoadError> {
    split(text)?
        .into_iter()
        .map(|(line, doc)| {
            let value = to_json(&doc).map_err(|(l, message)| LoadError::Invalid {
                line: line + l.saturating_sub(1),
                message,
            })?;
            Ok(Document { line, value })
        })
        .collect()
}

/// One document's text as sigs.k8s.io/yaml `YAMLToJSON` turns it into JSON, then decoded as
/// apimachinery's JSON decoder does. Only the first YAML document in `text` counts, as
/// go-yaml's `Unmarshal` reads only that one. Errors carry the 1-based line within `text`.
pub(crate) fn to_json(text: &str) -> Result<Value, (usize, String)> {
    let tree = build(text)?;
    let Some(root) = tree.root else {
        return Ok(Value::Null);
    };
    let mut d = Decoder {
        tree: &tree,
        active_aliases: Vec::new(),
        decode_count: 0,
        alias_count: 0,
        alias_depth: 0,
    };
    let v = d.decode(root, 0)?;
    json_of(v).map_err(|m| (tree.nodes[root].line, m))
}

// ---------------------------------------------------------------------------------------
// The node tree (go-yaml's `parser`: scalars keep their text, tag and implicitness).

#[derive(Debug)]
enum NodeKind {
    Scalar {
        value: String,
        /// The resolved tag (`tag:yaml.org,2002:int`, `!foo`, `!`); `None` when untagged.
        tag: Option<String>,
        /// go-yaml's `implicit` (libyaml's `plain_implicit`): an untagged plain scalar, or
        /// one tagged with the non-specific `!` (`parserc.go`, `yaml_parser_parse_node`).
        implicit: bool,
    },
    Seq(Vec<usize>),
    Map(Vec<(usize, usize)>),
    Alias(usize),
}

#[derive(Debug)]
struct Node {
    kind: NodeKind,
    line: usize,
}

struct Tree {
    nodes: Vec<Node>,
    root: Option<usize>,
}

fn tag_string(tag: &Tag) -> String {
    // saphyr splits a resolved tag into the prefix its handle stands for and the suffix
    // (`!!int` -> "tag:yaml.org,2002:" + "int"; `!foo` -> "!" + "foo"; `!` -> "" + "!"),
    // so the whole tag is the two joined, as go-yaml's parser reports it.
    format!("{}{}", tag.handle, tag.suffix)
}

/// A collection being built from the event stream.
enum Open {
    Seq(usize),
    /// A mapping, with the key read but not yet paired with its value.
    Map(usize, Option<usize>),
}

fn build(text: &str) -> Result<Tree, (usize, String)> {
    let mut nodes: Vec<Node> = Vec::new();
    // saphyr numbers anchors itself; a redefined name gets a new number, so an alias finds
    // the latest definition, as go-yaml's `p.doc.anchors[name] = n` does.
    let mut anchors: std::collections::HashMap<usize, usize> = Default::default();
    let mut stack: Vec<Open> = Vec::new();
    let mut root = None;
    for ev in Parser::new_from_str(text) {
        let (ev, span) = ev.map_err(|e| (e.marker().line(), format!("yaml: {}", e.info())))?;
        let line = span.start.line();
        let (kind, anchor) = match ev {
            Event::StreamStart | Event::Nothing | Event::DocumentStart(_) => continue,
            // Only the first document counts (go-yaml `unmarshal` parses one node).
            Event::StreamEnd | Event::DocumentEnd => break,
            Event::Alias(id) => {
                let Some(&target) = anchors.get(&id) else {
                    return Err((line, "yaml: unknown anchor referenced".into()));
                };
                (NodeKind::Alias(target), 0)
            }
            Event::Scalar(value, style, anchor, tag) => {
                let tag = tag.map(|t| tag_string(&t));
                let implicit = match &tag {
                    None => style == ScalarStyle::Plain,
                    Some(t) => t == "!",
                };
                let value = match value {
                    Cow::Borrowed(s) => s.to_owned(),
                    Cow::Owned(s) => s,
                };
                (
                    NodeKind::Scalar {
                        value,
                        tag,
                        implicit,
                    },
                    anchor,
                )
            }
            Event::SequenceStart(anchor, _) => (NodeKind::Seq(Vec::new()), anchor),
            Event::MappingStart(anchor, _) => (NodeKind::Map(Vec::new()), anchor),
            Event::SequenceEnd | Event::MappingEnd => {
                let done = match stack.pop() {
                    Some(Open::Seq(i) | Open::Map(i, _)) => i,
                    None => return Err((line, "yaml: unbalanced collection end".into())),
                };
                attach(&mut nodes, &mut stack, &mut root, done);
                continue;
            }
        };
        let idx = nodes.len();
        let opens = match kind {
            NodeKind::Seq(_) => Some(Open::Seq(idx)),
            NodeKind::Map(_) => Some(Open::Map(idx, None)),
            _ => None,
        };
        nodes.push(Node { kind, line });
        if anchor != 0 {
            anchors.insert(anchor, idx);
        }
        match opens {
            Some(o) => {
                if stack.len() >= MAX_DEPTH {
                    return Err((line, too_deep()));
                }
                stack.push(o);
            }
            None => attach(&mut nodes, &mut stack, &mut root, idx),
        }
    }
    Ok(Tree { nodes, root })
}

fn too_deep() -> String {
    format!(
        "nested more than {MAX_DEPTH} levels deep (mappings and lists inside one another, \
         aliases expanded); talboot refuses deeper manifests so that a hostile file cannot \
         crash it: flatten this structure"
    )
}

/// Hangs a finished node under the collection being built, or makes it the root.
fn attach(nodes: &mut [Node], stack: &mut [Open], root: &mut Option<usize>, idx: usize) {
    match stack.last_mut() {
        None => {
            if root.is_none() {
                *root = Some(idx);
            }
        }
        Some(Open::Seq(s)) => {
            if let NodeKind::Seq(items) = &mut nodes[*s].kind {
                items.push(idx);
            }
        }
        Some(Open::Map(m, pending)) => match pending.take() {
            None => *pending = Some(idx),
            Some(k) => {
                if let NodeKind::Map(pairs) = &mut nodes[*m].kind {
                    pairs.push((k, idx));
                }
            }
        },
    }
}

// ---------------------------------------------------------------------------------------
// Decoding into Go's `interface{}` values (go-yaml `decoder`).

/// A value as go-yaml leaves it in an `interface{}`: `int`, `uint64` (beyond int64),
/// `float64`, `bool`, `string`, `nil`, `[]interface{}`, `map[interface{}]interface{}`.
#[derive(Debug, Clone, PartialEq)]
enum Y {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Y>),
    Map(Vec<(Y, Y)>),
}

/// go-yaml `decode.go` alias-expansion budget (`allowedAliasRatio` and its constants).
fn allowed_alias_ratio(decode_count: usize) -> f64 {
    const LOW: usize = 400_000;
    const HIGH: usize = 4_000_000;
    if decode_count <= LOW {
        0.99
    } else if decode_count >= HIGH {
        0.10
    } else {
        0.99 - 0.89 * ((decode_count - LOW) as f64 / (HIGH - LOW) as f64)
    }
}

struct Decoder<'a> {
    tree: &'a Tree,
    /// Alias nodes being expanded (go-yaml `d.aliases`): one met again is a cycle.
    active_aliases: Vec<usize>,
    decode_count: usize,
    alias_count: usize,
    alias_depth: usize,
}

type Fail = (usize, String);

const WANT_MAP: &str = "yaml: map merge requires map or sequence of maps as the value";

impl Decoder<'_> {
    fn count(&mut self, line: usize) -> Result<(), Fail> {
        self.decode_count += 1;
        if self.alias_depth > 0 {
            self.alias_count += 1;
        }
        if self.alias_count > 100
            && self.decode_count > 1000
            && self.alias_count as f64 / self.decode_count as f64
                > allowed_alias_ratio(self.decode_count)
        {
            return Err((line, "yaml: document contains excessive aliasing".into()));
        }
        Ok(())
    }

    fn decode(&mut self, idx: usize, depth: usize) -> Result<Y, Fail> {
        let tree = self.tree;
        let node = &tree.nodes[idx];
        self.count(node.line)?;
        match &node.kind {
            NodeKind::Alias(target) => {
                self.alias(idx, *target, depth, |d, t, depth| d.decode(t, depth))
            }
            NodeKind::Scalar {
                value,
                tag,
                implicit,
            } => scalar(value, tag.as_deref(), *implicit).map_err(|m| (node.line, m)),
            NodeKind::Seq(items) => {
                if depth >= MAX_DEPTH {
                    return Err((node.line, too_deep()));
                }
                let mut out = Vec::with_capacity(items.len());
                for &i in items {
                    out.push(self.decode(i, depth + 1)?);
                }
                Ok(Y::Seq(out))
            }
            NodeKind::Map(_) => {
                if depth >= MAX_DEPTH {
                    return Err((node.line, too_deep()));
                }
                let mut out = Vec::new();
                self.map_into(idx, &mut out, depth + 1)?;
                Ok(Y::Map(out))
            }
        }
    }

    fn alias<T>(
        &mut self,
        alias_idx: usize,
        target: usize,
        depth: usize,
        f: impl FnOnce(&mut Self, usize, usize) -> Result<T, Fail>,
    ) -> Result<T, Fail> {
        if self.active_aliases.contains(&alias_idx) {
            return Err((
                self.tree.nodes[alias_idx].line,
                "yaml: anchor value contains itself".into(),
            ));
        }
        self.active_aliases.push(alias_idx);
        self.alias_depth += 1;
        let r = f(self, target, depth);
        self.alias_depth -= 1;
        self.active_aliases.pop();
        r
    }

    /// The pairs of mapping `idx` set into `out` in order (go-yaml `mapping`): `<<` merges,
    /// a later key replaces an equal earlier one, a collection as a key is an error.
    fn map_into(&mut self, idx: usize, out: &mut Vec<(Y, Y)>, depth: usize) -> Result<(), Fail> {
        let tree = self.tree;
        let NodeKind::Map(pairs) = &tree.nodes[idx].kind else {
            return Err((tree.nodes[idx].line, WANT_MAP.into()));
        };
        for &(k, v) in pairs {
            if is_merge(&tree.nodes[k]) {
                self.merge(v, out, depth)?;
                continue;
            }
            let key = self.decode(k, depth)?;
            if matches!(key, Y::Seq(_) | Y::Map(_)) {
                return Err((
                    tree.nodes[k].line,
                    "yaml: invalid map key: a mapping or sequence cannot be a key".into(),
                ));
            }
            let value = self.decode(v, depth)?;
            set_index(out, key, value);
        }
        Ok(())
    }

    /// go-yaml `merge`: a mapping, an alias of one, or a sequence of those (the earlier
    /// ones win, so they are set last). Keys set before the `<<` are overwritten by it and
    /// keys after it overwrite it, since go-yaml v2 sets them in document order.
    fn merge(&mut self, v: usize, out: &mut Vec<(Y, Y)>, depth: usize) -> Result<(), Fail> {
        let tree = self.tree;
        let node = &tree.nodes[v];
        match &node.kind {
            NodeKind::Map(_) | NodeKind::Alias(_) => self.merge_one(v, out, depth),
            NodeKind::Seq(items) => {
                for &i in items.iter().rev() {
                    self.merge_one(i, out, depth)?;
                }
                Ok(())
            }
            NodeKind::Scalar { .. } => Err((node.line, WANT_MAP.into())),
        }
    }

    fn merge_one(&mut self, v: usize, out: &mut Vec<(Y, Y)>, depth: usize) -> Result<(), Fail> {
        let tree = self.tree;
        let node = &tree.nodes[v];
        self.count(node.line)?;
        match &node.kind {
            NodeKind::Map(_) => self.map_into(v, out, depth),
            NodeKind::Alias(t) if matches!(tree.nodes[*t].kind, NodeKind::Map(_)) => {
                self.alias(v, *t, depth, |d, t, depth| {
                    d.count(tree.nodes[t].line)?;
                    d.map_into(t, out, depth)
                })
            }
            _ => Err((node.line, WANT_MAP.into())),
        }
    }
}

/// go-yaml `isMerge`: a `<<` key that is implicit or tagged `!!merge`.
fn is_merge(n: &Node) -> bool {
    matches!(&n.kind, NodeKind::Scalar { value, tag, implicit }
        if value == "<<" && (*implicit || tag.as_deref() == Some(MERGE_TAG)))
}

/// Go map assignment: an equal key (same type and value) is replaced in place.
fn set_index(out: &mut Vec<(Y, Y)>, key: Y, value: Y) {
    match out.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => out.push((key, value)),
    }
}

/// One scalar as go-yaml `decoder.scalar` leaves it in an `interface{}`.
fn scalar(value: &str, tag: Option<&str>, implicit: bool) -> Result<Y, String> {
    // A quoted or block scalar without a tag is a string, whatever it looks like.
    let Some(tag) = tag.or(if implicit { Some("") } else { None }) else {
        return Ok(Y::Str(value.to_owned()));
    };
    if tag == BINARY_TAG {
        // Go's StdEncoding ignores line breaks; anything else must be padded base64.
        let clean: String = value.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(clean.as_bytes())
            .map_err(|_| "yaml: !!binary value contains invalid base64 data".to_owned())?;
        return Ok(Y::Str(go_json_string(&bytes)));
    }
    Ok(match resolve(tag, value)? {
        Resolved::Null => Y::Null,
        Resolved::Bool(b) => Y::Bool(b),
        Resolved::Int(i) => Y::Int(i),
        Resolved::Uint(u) => Y::Uint(u),
        Resolved::Float(f) => Y::Float(f),
        // "for backward compatibility reasons we set it as a string" (decode.go, scalar).
        Resolved::Timestamp | Resolved::Str => Y::Str(value.to_owned()),
    })
}

/// What go-yaml's `resolve` makes of a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Resolved {
    /// `nil`.
    Null,
    /// `bool`.
    Bool(bool),
    /// `int` (64-bit).
    Int(i64),
    /// `uint64`: an integer above the int64 range.
    Uint(u64),
    /// `float64`.
    Float(f64),
    /// A timestamp (kept as its text when decoded into `interface{}`).
    Timestamp,
    /// The text itself.
    Str,
}

impl Resolved {
    fn tag(self) -> &'static str {
        match self {
            Resolved::Null => NULL_TAG,
            Resolved::Bool(_) => BOOL_TAG,
            Resolved::Int(_) | Resolved::Uint(_) => INT_TAG,
            Resolved::Float(_) => FLOAT_TAG,
            Resolved::Timestamp => TIMESTAMP_TAG,
            Resolved::Str => STR_TAG,
        }
    }
}

fn short_tag(tag: &str) -> String {
    match tag.strip_prefix("tag:yaml.org,2002:") {
        Some(s) => format!("!!{s}"),
        None => tag.to_owned(),
    }
}

/// go-yaml v2 `resolve(tag, in)`: `tag` is the scalar's full tag, `""` for an implicit
/// one. A tag outside the core set (`!foo`, `!`) leaves the text a string; an explicit core
/// tag must agree with what the text resolves to (an `!!int` tag on `1.5` is an error), except
/// that an integer may be tagged `!!float`.
pub(crate) fn resolve(tag: &str, input: &str) -> Result<Resolved, String> {
    if !matches!(
        tag,
        "" | STR_TAG | BOOL_TAG | INT_TAG | FLOAT_TAG | NULL_TAG | TIMESTAMP_TAG
    ) {
        return Ok(Resolved::Str);
    }
    let out = resolve_text(tag, input);
    let rtag = out.tag();
    if tag.is_empty() || tag == rtag || tag == STR_TAG {
        return Ok(out);
    }
    if tag == FLOAT_TAG
        && let Resolved::Int(i) = out
    {
        return Ok(Resolved::Float(i as f64));
    }
    Err(format!(
        "yaml: cannot decode {} `{input}` as a {}",
        short_tag(rtag),
        short_tag(tag)
    ))
}

fn resolve_text(tag: &str, input: &str) -> Resolved {
    // The first byte hints at what the text might be (`resolveTable`).
    let hint = match input.as_bytes().first() {
        None => b'N',
        Some(b'+' | b'-') => b'S',
        Some(b'0'..=b'9') => b'D',
        Some(b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~') => b'M',
        Some(b'.') => b'.',
        Some(_) => 0,
    };
    if hint == 0 || tag == STR_TAG {
        return Resolved::Str;
    }
    if let Some(r) = resolve_map(input) {
        return r;
    }
    // No base 60 ("190:20:30"): go-yaml leaves sexagesimal numbers strings on purpose.
    match hint {
        b'.' => {
            if let Some(f) = go_parse_float(input) {
                return Resolved::Float(f);
            }
        }
        b'D' | b'S' => {
            if (tag.is_empty() || tag == TIMESTAMP_TAG) && parse_timestamp(input) {
                return Resolved::Timestamp;
            }
            let plain = input.replace('_', "");
            if let Ok(i) = go_parse_int(&plain) {
                return Resolved::Int(i);
            }
            if let Ok(u) = go_parse_uint(&plain) {
                return Resolved::Uint(u);
            }
            if yaml_style_float(&plain)
                && let Some(f) = go_parse_float(&plain)
            {
                return Resolved::Float(f);
            }
            // resolve.go then retries `0b`/`-0b` with base 2, which base-0 ParseInt above
            // has already covered (Go reads the 0b, 0o and 0x prefixes since 1.13).
        }
        _ => {}
    }
    Resolved::Str
}

/// go-yaml's `resolveMap`: the YAML 1.1 booleans, nulls and special floats it knows, in
/// exactly these spellings (so `yES` or `nULL` stay strings).
fn resolve_map(input: &str) -> Option<Resolved> {
    Some(match input {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            Resolved::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            Resolved::Bool(false)
        }
        "" | "~" | "null" | "Null" | "NULL" => Resolved::Null,
        ".nan" | ".NaN" | ".NAN" => Resolved::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => Resolved::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => Resolved::Float(f64::NEG_INFINITY),
        _ => return None,
    })
}

/// resolve.go's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// Why a Go `strconv` integer parse failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumError {
    Syntax,
    Range,
}

/// Go's `strconv.ParseUint(s, 0, 64)` (no underscores: resolve.go removed them): `0x`, `0o`,
/// `0b` prefixes (either case) and a bare leading `0` for octal; no sign.
pub(crate) fn go_parse_uint(s: &str) -> Result<u64, NumError> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(NumError::Syntax);
    }
    let (base, digits): (u64, &[u8]) = if b[0] == b'0' {
        match b.get(1).map(u8::to_ascii_lowercase) {
            Some(b'b') if b.len() >= 3 => (2, &b[2..]),
            Some(b'o') if b.len() >= 3 => (8, &b[2..]),
            Some(b'x') if b.len() >= 3 => (16, &b[2..]),
            _ => (8, &b[1..]),
        }
    } else {
        (10, b)
    };
    let mut n: u64 = 0;
    for &c in digits {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'z' | b'A'..=b'Z' => c.to_ascii_lowercase() - b'a' + 10,
            _ => return Err(NumError::Syntax),
        } as u64;
        if d >= base {
            return Err(NumError::Syntax);
        }
        n = n
            .checked_mul(base)
            .and_then(|n| n.checked_add(d))
            .ok_or(NumError::Range)?;
    }
    Ok(n)
}

/// Go's `strconv.ParseInt(s, 0, 64)`: an optional sign, then [`go_parse_uint`], in range.
pub(crate) fn go_parse_int(s: &str) -> Result<i64, NumError> {
    let (neg, rest) = match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    let un = go_parse_uint(rest)?;
    const CUTOFF: u64 = 1 << 63;
    match (neg, un) {
        (false, u) if u >= CUTOFF => Err(NumError::Range),
        (true, u) if u > CUTOFF => Err(NumError::Range),
        (true, u) => Ok((u as i64).wrapping_neg()),
        (false, u) => Ok(u as i64),
    }
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal text (the only kind resolve.go hands it:
/// text starting with `.`, or text its float pattern matched): digits with at most one `.`,
/// an optional exponent, underscores only between digits; `None` on a syntax error or when
/// the value overflows (ErrRange; an underflow to zero is no error in Go).
pub(crate) fn go_parse_float(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let (mut saw_dot, mut saw_digits, mut underscores) = (false, false, false);
    while i < b.len() {
        match b[i] {
            b'_' => underscores = true,
            b'.' if !saw_dot => saw_dot = true,
            b'0'..=b'9' => saw_digits = true,
            _ => break,
        }
        i += 1;
    }
    if !saw_digits {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
            underscores |= b[i] == b'_';
            i += 1;
        }
    }
    if i != b.len() || (underscores && !go_underscore_ok(s)) {
        return None;
    }
    let f: f64 = s.replace('_', "").parse().ok()?;
    f.is_finite().then_some(f)
}

/// Go's `strconv.underscoreOK`: underscores only between digits (or after a base prefix).
fn go_underscore_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let b = match b.first() {
        Some(b'+' | b'-') => &b[1..],
        _ => b,
    };
    let mut saw = b'^';
    let mut i = 0;
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
            continue;
        }
        if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
            continue;
        }
        if saw == b'_' {
            return false;
        }
        saw = b'!';
    }
    saw != b'_'
}

/// resolve.go `parseTimestamp`: four digits and `-` first, then one of go-yaml's layouts
/// (`2006-1-2T15:4:5.999999999Z07:00`, the same with `t`, `2006-1-2 15:4:5.999999999`,
/// `2006-1-2`) as Go's `time.Parse` reads them (1- or 2-digit fields, ranges checked).
pub(crate) fn parse_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let lead = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if lead != 4 || b.get(4) != Some(&b'-') {
        return false;
    }
    let year: u32 = s[..4].parse().unwrap_or(0);
    let mut rest = &b[5..];
    let Some(month) = getnum(&mut rest).filter(|m| (1..=12).contains(m)) else {
        return false;
    };
    if !eat(&mut rest, b'-') {
        return false;
    }
    let Some(day) = getnum(&mut rest) else {
        return false;
    };
    let leap = year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400));
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if day < 1 || day > days {
        return false;
    }
    if rest.is_empty() {
        return true;
    }
    let zoned = match rest[0] {
        b'T' | b't' => true,
        b' ' => false,
        _ => return false,
    };
    rest = &rest[1..];
    let clock = getnum(&mut rest).is_some_and(|h| h < 24)
        && eat(&mut rest, b':')
        && getnum(&mut rest).is_some_and(|m| m < 60)
        && eat(&mut rest, b':')
        && getnum(&mut rest).is_some_and(|s| s < 60);
    if !clock {
        return false;
    }
    // ".999999999": an optional fraction (`.` or `,` then digits).
    if rest.len() >= 2 && matches!(rest[0], b'.' | b',') && rest[1].is_ascii_digit() {
        let n = 1 + rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        rest = &rest[n..];
    }
    if !zoned {
        return rest.is_empty();
    }
    // "Z07:00": `Z`, or a sign, two digits, `:`, two digits (hours up to 24, minutes to 60).
    if rest == b"Z" {
        return true;
    }
    rest.len() == 6
        && matches!(rest[0], b'+' | b'-')
        && rest[3] == b':'
        && [1, 2, 4, 5].iter().all(|&i| rest[i].is_ascii_digit())
        && (rest[1] - b'0') * 10 + (rest[2] - b'0') <= 24
        && (rest[4] - b'0') * 10 + (rest[5] - b'0') <= 60
}

/// Go's `getnum(s, false)`: one digit, or two when the second is a digit too.
fn getnum(s: &mut &[u8]) -> Option<u32> {
    let first = *s.first().filter(|c| c.is_ascii_digit())?;
    match s.get(1).filter(|c| c.is_ascii_digit()) {
        Some(&second) => {
            *s = &s[2..];
            Some(u32::from(first - b'0') * 10 + u32::from(second - b'0'))
        }
        None => {
            *s = &s[1..];
            Some(u32::from(first - b'0'))
        }
    }
}

fn eat(s: &mut &[u8], c: u8) -> bool {
    if s.first() == Some(&c) {
        *s = &s[1..];
        true
    } else {
        false
    }
}

/// Bytes as Go's `json.Marshal` writes a string: each byte of an invalid UTF-8 sequence
/// becomes U+FFFD.
fn go_json_string(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                let n = e.error_len().unwrap_or(bad.len());
                out.extend(std::iter::repeat_n('\u{fffd}', n));
                rest = &bad[n..];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// To JSON (sigs.k8s.io/yaml `convertToJSONableObject`, Go `json.Marshal`) and back into a
// client's object (apimachinery `pkg/util/json`: int64 when the text is an integer that
// fits, float64 otherwise).

fn json_of(v: Y) -> Result<Value, String> {
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Str(s) => Value::String(s),
        Y::Int(i) => Value::Number(i.into()),
        // Written as an integer beyond int64; read back as float64.
        Y::Uint(u) => Number::from_f64(u as f64).map_or(Value::Null, Value::Number),
        Y::Float(f) => float_json(f)?,
        Y::Seq(items) => Value::Array(items.into_iter().map(json_of).collect::<Result<_, _>>()?),
        Y::Map(pairs) => {
            let mut m = Map::new();
            for (k, v) in pairs {
                m.insert(key_string(&k)?, json_of(v)?);
            }
            Value::Object(m)
        }
    })
}

/// A float64 as the client ends up holding it: Go's encoder writes an integral value below
/// 1e21 without a fraction (`1e3` -> `1000`), which reads back as an int64 when it fits;
/// NaN and the infinities cannot be encoded at all.
fn float_json(f: f64) -> Result<Value, String> {
    if !f.is_finite() {
        let name = if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "+Inf"
        } else {
            "-Inf"
        };
        return Err(format!(
            "json: unsupported value: {name} (JSON has no NaN or infinity; quote it if a \
             string is meant)"
        ));
    }
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f.fract() == 0.0 && f.abs() < 1e21 && (-TWO_63..TWO_63).contains(&f) {
        return Ok(Value::Number((f as i64).into()));
    }
    Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
}

/// A map key as `convertToJSONableObject` writes it: strings as they are, ints in decimal,
/// floats as Go's `FormatFloat(k, 'g', -1, 32)` (with `.inf`, `-.inf`, `.nan`), booleans as
/// `true`/`false`; a null or a uint64 key is an error there.
fn key_string(k: &Y) -> Result<String, String> {
    match k {
        Y::Str(s) => Ok(s.clone()),
        Y::Int(i) => Ok(i.to_string()),
        Y::Bool(b) => Ok(b.to_string()),
        Y::Float(f) => Ok(go_format_g32(*f)),
        Y::Null => Err("unsupported map key of type: <nil> (a null key; quote it)".into()),
        Y::Uint(u) => Err(format!(
            "unsupported map key of type: uint64, key: {u} (an integer key beyond int64; quote it)"
        )),
        Y::Seq(_) | Y::Map(_) => Err("yaml: invalid map key".into()),
    }
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)`: the shortest digits that read back as the same
/// float32, in `%e` form when the exponent is below -4 or at least 6 (the precision Go uses for
/// shortest `g`), else in `%f` form.
pub(crate) fn go_format_g32(f: f64) -> String {
    let x = f as f32;
    if x.is_nan() {
        return ".nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0");
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "1.2345e-7".
    let e = format!("{:e}", x.abs());
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let nd = digits.len() as i32;
    if !(-4..6).contains(&exp) {
        let mut out = format!("{sign}{}", &digits[..1]);
        if nd > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let (es, ea) = if exp < 0 { ('-', -exp) } else { ('+', exp) };
        out.push_str(&format!("e{es}{ea:02}"));
        return out;
    }
    let dp = exp + 1;
    let digit = |i: i32| -> char {
        if i >= 0 && i < nd {
            digits.as_bytes()[i as usize] as char
        } else {
            '0'
        }
    };
    let mut out = sign.to_owned();
    if dp > 0 {
        for i in 0..dp {
            out.push(digit(i));
        }
    } else {
        out.push('0');
    }
    let frac = (nd - dp).max(0);
    if frac > 0 {
        out.push('.');
        for i in 0..frac {
            out.push(digit(dp + i));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! The loader's answers, carried over as facts from its source and its own tests:
    //! go.yaml.in/yaml/v2 v2.4.3 `decode_test.go` (`unmarshalTests`) and `resolve.go`, and
    //! sigs.k8s.io/yaml v1.6.0 `yaml_test.go` (`TestYAMLToJSON`).

    use super::*;
    use serde_json::json;

    fn one(doc: &str) -> Result<Value, String> {
        to_json(doc).map_err(|(_, m)| m)
    }

    /// `v: <text>` through the loader, the value of `v`.
    fn v(text: &str) -> Value {
        one(&format!("v: {text}\n")).unwrap_or_else(|e| panic!("{text}: {e}"))["v"].clone()
    }

    #[test]
    fn go_yaml_decode_test_scalars() {
        // decode_test.go, unmarshalTests (into interface{}), then through JSON.
        let cases: &[(&str, Value)] = &[
            ("hi", json!("hi")),
            ("true", json!(true)),
            ("10", json!(10)),
            ("0b10", json!(2)),
            ("0xA", json!(10)),
            ("4294967296", json!(4294967296i64)),
            ("0.1", json!(0.1)),
            (".1", json!(0.1)),
            ("-10", json!(-10)),
            ("-.1", json!(-0.1)),
            // Floats from the spec.
            ("6.8523e+5", json!(685230)),
            ("685.230_15e+03", json!(685230.15)),
            ("685_230.15", json!(685230.15)),
            // Booleans from the spec.
            ("y", json!(true)),
            ("NO", json!(false)),
            ("True", json!(true)),
            ("on", json!(true)),
            // Integers from the spec.
            ("685230", json!(685230)),
            ("+685_230", json!(685230)),
            ("02472256", json!(685230)),
            ("0x_0A_74_AE", json!(685230)),
            ("0b1010_0111_0100_1010_1110", json!(685230)),
            ("-0b101010", json!(-42)),
            (
                "-0b1000000000000000000000000000000000000000000000000000000000000000",
                json!(i64::MIN),
            ),
            // Nulls from the spec.
            ("", Value::Null),
            ("~", Value::Null),
            ("null", Value::Null),
            // "Unsupported": base 60 stays a string.
            ("190:20:30", json!("190:20:30")),
            ("190:20:30.15", json!("190:20:30.15")),
            // Not numbers.
            ("-b_c", json!("-b_c")),
            ("+b_c", json!("+b_c")),
            ("50cent_of_dollar", json!("50cent_of_dollar")),
            // Beyond int64: uint64, which the client reads back as float64.
            ("9223372036854775808", json!(9223372036854775808u64 as f64)),
            (
                "18446744073709551615",
                json!(18446744073709551615u64 as f64),
            ),
            ("18446744073709551616", json!(18446744073709551616f64)),
            ("9223372036854775807", json!(i64::MAX)),
            ("-9223372036854775808", json!(i64::MIN)),
        ];
        for (text, want) in cases {
            assert_eq!(&v(text), want, "{text:?}");
        }
    }

    #[test]
    fn resolve_go_rules_beyond_the_spec_examples() {
        // resolve.go: strconv.ParseInt(plain, 0, 64) after removing underscores, so Go's
        // base prefixes (either case, and 0o) and a bare leading 0 for octal.
        let cases: &[(&str, Value)] = &[
            ("0400", json!(256)),
            ("-0400", json!(-256)),
            ("+0400", json!(256)),
            ("0_400", json!(256)),
            ("0o400", json!(256)),
            ("0O17", json!(15)),
            ("0X1f", json!(31)),
            ("0B11", json!(3)),
            ("0", json!(0)),
            ("-0", json!(0)),
            ("00", json!(0)),
            // Not octal: ParseInt fails, the float pattern matches.
            ("08", json!(8)),
            ("09.5", json!(9.5)),
            ("0400.0", json!(400)),
            ("1e3", json!(1000)),
            ("1.0e+3", json!(1000)),
            ("1.5e3", json!(1500)),
            ("1.0", json!(1)),
            ("1.", json!(1)),
            ("+.5", json!(0.5)),
            ("-1e-7", json!(-1e-7)),
            (".5_0", json!(0.5)),
            ("1_000", json!(1000)),
            ("1__0", json!(10)),
            // Not numbers at all.
            ("_1", json!("_1")),
            ("0x", json!("0x")),
            ("0b", json!("0b")),
            ("0b2", json!("0b2")),
            ("0x10000000000000000", json!("0x10000000000000000")),
            ("+", json!("+")),
            ("+-1", json!("+-1")),
            ("1e400", json!("1e400")),
            ("1e", json!("1e")),
            (".", json!(".")),
            ("1.2.3", json!("1.2.3")),
            ("1,000", json!("1,000")),
            ("0x1p3", json!("0x1p3")),
            ("inf", json!("inf")),
            ("nan", json!("nan")),
            (".nAn", json!(".nAn")),
            ("-.nan", json!("-.nan")),
            ("Infinity", json!("Infinity")),
            // YAML 1.1 booleans, exactly go-yaml's spellings.
            ("yes", json!(true)),
            ("Yes", json!(true)),
            ("YES", json!(true)),
            ("Y", json!(true)),
            ("On", json!(true)),
            ("ON", json!(true)),
            ("TRUE", json!(true)),
            ("no", json!(false)),
            ("No", json!(false)),
            ("n", json!(false)),
            ("N", json!(false)),
            ("off", json!(false)),
            ("Off", json!(false)),
            ("OFF", json!(false)),
            ("False", json!(false)),
            ("FALSE", json!(false)),
            ("yES", json!("yES")),
            ("tRUE", json!("tRUE")),
            ("oN", json!("oN")),
            ("nO", json!("nO")),
            ("t", json!("t")),
            ("f", json!("f")),
            ("Null", Value::Null),
            ("NULL", Value::Null),
            ("nULL", json!("nULL")),
            ("none", json!("none")),
            ("<<", json!("<<")),
            // Timestamps stay their text (decode.go, "for backward compatibility").
            ("2001-12-14", json!("2001-12-14")),
            (
                "2001-12-14t21:59:43.10-05:00",
                json!("2001-12-14t21:59:43.10-05:00"),
            ),
            ("2001-12-14 21:59:43.10", json!("2001-12-14 21:59:43.10")),
            // Version-like text.
            ("1.18.0", json!("1.18.0")),
            ("v1.36.2", json!("v1.36.2")),
            ("1.18", json!(1.18)),
        ];
        for (text, want) in cases {
            assert_eq!(&v(text), want, "{text:?}");
        }
    }

    #[test]
    fn special_floats_resolve_but_cannot_become_json() {
        for (text, want) in [
            (".inf", f64::INFINITY),
            (".Inf", f64::INFINITY),
            (".INF", f64::INFINITY),
            ("+.inf", f64::INFINITY),
            ("+.Inf", f64::INFINITY),
            ("-.inf", f64::NEG_INFINITY),
            ("-.INF", f64::NEG_INFINITY),
        ] {
            assert_eq!(resolve("", text), Ok(Resolved::Float(want)), "{text}");
            let err = one(&format!("v: {text}")).unwrap_err();
            assert!(err.contains("json: unsupported value"), "{text}: {err}");
        }
        for text in [".nan", ".NaN", ".NAN"] {
            assert!(matches!(resolve("", text), Ok(Resolved::Float(f)) if f.is_nan()));
            assert!(one(&format!("v: {text}")).is_err());
        }
    }

    #[test]
    fn quoting_block_scalars_and_tags() {
        let doc = one(concat!(
            "a: '0400'\n",
            "b: \"yes\"\n",
            "c: |\n  0400\n",
            "d: !!str 0400\n",
            "e: !!int \"0400\"\n",
            "f: !!float 1\n",
            "g: !foo 0400\n",
            "h: ! 0400\n",
            "i: !!bool 'on'\n",
            "j: !!null ''\n",
            "k: !<tag:yaml.org,2002:int> 0x10\n",
            "l: !!timestamp 2001-12-14\n",
            "m: !!binary gIGC\n",
            "bin: !!binary aGk=\n",
            "o: !!str\n",
        ))
        .unwrap();
        assert_eq!(
            doc,
            json!({"a": "0400", "b": "yes", "c": "0400\n", "d": "0400", "e": 256, "f": 1,
                   "g": "0400", "h": "0400", "i": true, "j": null, "k": 16,
                   "l": "2001-12-14", "m": "\u{fffd}\u{fffd}\u{fffd}", "bin": "hi", "o": ""})
        );
        for (doc, want) in [
            ("v: !!int 1.5", "cannot decode !!float `1.5` as a !!int"),
            ("v: !!int abc", "cannot decode !!str `abc` as a !!int"),
            ("v: !!bool 1", "cannot decode !!int `1` as a !!bool"),
            ("v: !!null 0", "cannot decode !!int `0` as a !!null"),
            ("v: !!timestamp 2001-13-01", "as a !!timestamp"),
            (
                "v: !!float 18446744073709551615",
                "cannot decode !!int `18446744073709551615` as a !!float",
            ),
            ("v: !!binary '*'", "invalid base64"),
        ] {
            let err = one(doc).unwrap_err();
            assert!(err.contains(want), "{doc}: {err}");
        }
    }

    #[test]
    fn map_keys_become_json_strings_as_sigs_yaml_writes_them() {
        // yaml_test.go, TestYAMLToJSON.
        assert_eq!(one("True: a").unwrap(), json!({"true": "a"}));
        assert_eq!(one("no: a").unwrap(), json!({"false": "a"}));
        assert_eq!(one("1: a").unwrap(), json!({"1": "a"}));
        assert_eq!(one("1.2: a").unwrap(), json!({"1.2": "a"}));
        assert_eq!(
            one("1000000000000000000000000000000000000: a").unwrap(),
            json!({"1e+36": "a"})
        );
        assert_eq!(one("1e+36: a").unwrap(), json!({"1e+36": "a"}));
        assert_eq!(one("\"1e+36\": a").unwrap(), json!({"1e+36": "a"}));
        assert_eq!(one("0400: a").unwrap(), json!({"256": "a"}));
        // Keys resolve like values: `y` and `n` are booleans.
        assert_eq!(one("y: 1\nn: 2\n").unwrap(), json!({"true": 1, "false": 2}));
        // A lone `-` is a string to the resolver (as a plain value it is YAML syntax).
        assert_eq!(resolve("", "-"), Ok(Resolved::Str));
        assert_eq!(one("foo: bar\nfoo: baz\n").unwrap(), json!({"foo": "baz"}));
        assert_eq!(
            one("t: 9007199254740993").unwrap(),
            json!({"t": 9007199254740993i64})
        );
        assert_eq!(
            one("t: 1000000000000000000000000000000000000").unwrap(),
            json!({"t": 1e36})
        );
        assert_eq!(one("t: ").unwrap(), json!({"t": null}));
        assert_eq!(
            one("t: this is very long line\n  that it must be longer\n").unwrap(),
            json!({"t": "this is very long line that it must be longer"})
        );
        // Errors there: a null key, and (not a case of that file) a uint64 key.
        for doc in ["~: a", "null: a", ": a", "18446744073709551615: a"] {
            assert!(
                one(doc).unwrap_err().contains("unsupported map key"),
                "{doc}"
            );
        }
        assert!(one("? [a]\n: b\n").unwrap_err().contains("invalid map key"));
        // Go's FormatFloat(k, 'g', -1, 32).
        for (f, want) in [
            (0.1, "0.1"),
            (1000.0, "1000"),
            (100000.0, "100000"),
            (1e6, "1e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (std::f64::consts::PI, "3.1415927"),
            (-2.5, "-2.5"),
            (-0.0, "-0"),
            (f64::INFINITY, ".inf"),
            (f64::NEG_INFINITY, "-.inf"),
            (f64::NAN, ".nan"),
        ] {
            assert_eq!(go_format_g32(f), want, "{f}");
        }
    }

    #[test]
    fn anchors_aliases_and_merge_keys_as_go_yaml_v2() {
        let doc = one(concat!(
            "base: &b {p: 1, q: 2}\n",
            "other: &o {q: 3, r: 4}\n",
            "copy: *b\n",
            "merged:\n  <<: *b\n  q: 9\n",
            // go-yaml v2 sets in document order: the merge overwrites a key before it.
            "before:\n  q: 9\n  <<: *b\n",
            // A list: the earlier maps win.
            "many:\n  <<: [*b, *o]\n",
            "quoted:\n  '<<': *b\n",
        ))
        .unwrap();
        assert_eq!(doc["copy"], json!({"p": 1, "q": 2}));
        assert_eq!(doc["merged"], json!({"p": 1, "q": 9}));
        assert_eq!(doc["before"], json!({"q": 2, "p": 1}));
        assert_eq!(doc["many"], json!({"q": 2, "r": 4, "p": 1}));
        assert_eq!(doc["quoted"], json!({"<<": {"p": 1, "q": 2}}));
        assert!(one("a: &a [*a]").unwrap_err().contains("contains itself"));
        assert!(
            one("a: {<<: 1}")
                .unwrap_err()
                .contains("map merge requires")
        );
        assert!(one("a: *nope").is_err());
        // A billion laughs is stopped by go-yaml's alias budget.
        let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..8 {
            let prev = (b'a' + i) as char;
            let next = (b'a' + i + 1) as char;
            laughs.push_str(&format!(
                "{next}: &{next} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
        }
        assert!(one(&laughs).unwrap_err().contains("excessive aliasing"));
    }

    #[test]
    fn documents_split_on_separator_lines_as_yaml_reader() {
        let docs = load_all(
            "a: 1\n---\n---   # comment\n\nb: 0400\r\n...\nignored: [\n---\n# only a comment\n",
        )
        .unwrap();
        let values: Vec<_> = docs.iter().map(|d| d.value.clone()).collect();
        // The empty chunk between the separators is dropped; `...` ends the document and
        // what follows it in the same chunk is never read; a comment-only chunk is null.
        assert_eq!(values, [json!({"a": 1}), json!({"b": 256}), Value::Null]);
        assert_eq!(docs[1].line, 4);
        for (text, line) in [("a: 1\n--- b: 2\n", 2), ("a: 1\n----\n", 2)] {
            match load_all(text) {
                Err(LoadError::Separator { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let err = load_all("a: 1\n---\nb: [\n").unwrap_err();
        assert!(
            matches!(err, LoadError::Invalid { line: 3 | 4, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn json_documents_read_the_same() {
        let doc =
            one(r#"{"a": 1.0, "b": 1e3, "c": "0400", "d": [true, null, -0], "e": "\u00e9\/"}"#)
                .unwrap();
        assert_eq!(
            doc,
            json!({"a": 1, "b": 1000, "c": "0400", "d": [true, null, 0], "e": "é/"})
        );
    }

    #[test]
    fn a_json_stream_is_read_as_the_json_decoder_reads_it() {
        // Concatenated objects are documents of a JSON stream (YAMLOrJSONDecoder), which the
        // YAML path would refuse.
        let docs =
            json_stream("  {\"a\": 1.0, \"b\": 1e3}\n{\"c\": 9223372036854775808, \"d\": 1.5}")
                .unwrap();
        assert_eq!(
            docs,
            [
                json!({"a": 1, "b": 1000}),
                json!({"c": 9223372036854775808u64 as f64, "d": 1.5})
            ]
        );
        assert!(json_stream("a: 1").is_none());
        assert!(json_stream("{a: 1}").is_none(), "not JSON: read as YAML");
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(one(&deep).unwrap_err().contains("levels deep"));
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        assert!(one(&ok).is_ok());
    }

    #[test]
    fn timestamps_follow_go_time_parse() {
        for ok in [
            "2001-12-14",
            "2001-1-2",
            "2000-02-29",
            "2001-12-14T21:59:43.10Z",
            "2001-12-14t21:59:43.10-05:00",
            "2001-12-14T1:2:3+24:00",
            "2001-12-14 21:59:43",
            "2001-12-14 21:59:43,5",
        ] {
            assert!(parse_timestamp(ok), "{ok}");
        }
        for bad in [
            "2001-13-14",
            "2001-02-29",
            "2001-12-14 21:59:43.10 -5",
            "2001-12-14T21:59:43",
            "2001-12-14T24:00:00Z",
            "01-12-14",
            "2001-12-14x",
            "20011-12-14",
        ] {
            assert!(!parse_timestamp(bad), "{bad}");
        }
    }
}
