//! A YAML tree that remembers where every node came from.
//!
//! Operator-facing errors must name file, line and column, and report every problem at once.
//! serde stops at the first error and forgets positions, so the inventory is parsed with saphyr
//! into this small located tree, and typed values are read from it by hand (`load.rs`), with
//! [`MapReader`] catching unknown fields. Values that talboot passes through untouched (patches,
//! Helm values) are converted to `yaml_serde::Value`, the YAML type the rest of the program uses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use super::diag::{Diagnostics, Loc, did_you_mean};

/// A located YAML node.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Where the node starts.
    pub(crate) loc: Loc,
    /// What it holds.
    pub value: Value,
}

/// The content of a [`Node`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `~`, `null` or an empty value.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float; `raw` keeps the source text so `1.10` is not read back as `1.1`.
    Float(f64, String),
    /// A string scalar.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order.
    Map(Vec<(Key, Node)>),
}

/// A mapping key with its location.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The key's text.
    pub name: String,
    /// Where the key is written.
    pub(crate) loc: Loc,
}

impl Node {
    /// A short name for the node's type, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(..) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// The scalar as text, whatever its YAML type (so `version: 1.10` reads as "1.10").
    pub(crate) fn scalar_text(&self) -> Option<String> {
        match &self.value {
            Value::Str(s) => Some(s.clone()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(_, raw) => Some(raw.clone()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// Convert to a plain `yaml_serde::Value` (positions dropped, key order kept).
    pub(crate) fn to_yaml(&self) -> yaml_serde::Value {
        use yaml_serde::Value as Y;
        match &self.value {
            Value::Null => Y::Null,
            Value::Bool(b) => Y::Bool(*b),
            Value::Int(i) => Y::Number((*i).into()),
            Value::Float(f, _) => Y::Number((*f).into()),
            Value::Str(s) => Y::String(s.clone()),
            Value::Seq(items) => Y::Sequence(items.iter().map(Node::to_yaml).collect()),
            Value::Map(entries) => {
                let mut m = yaml_serde::Mapping::new();
                for (k, v) in entries {
                    m.insert(Y::String(k.name.clone()), v.to_yaml());
                }
                Y::Mapping(m)
            }
        }
    }
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{loc}: error: invalid YAML: {message}")]
pub struct SyntaxError {
    /// Where the parser stopped.
    pub(crate) loc: Loc,
    /// The parser's description.
    pub message: String,
}

/// Parse every document of `text`, read from `file`.
pub fn parse_documents(file: &Path, text: &str) -> Result<Vec<Node>, SyntaxError> {
    let file = Arc::new(file.to_path_buf());
    // saphyr's loader recurses per nesting level: bound the depth before it runs.
    crate::nesting::check_yaml(text).map_err(|e| SyntaxError {
        loc: Loc::new(file.clone(), e.line, e.column),
        message: e.reason(),
    })?;
    let docs = MarkedYaml::load_from_str(text).map_err(|e| SyntaxError {
        loc: Loc::new(file.clone(), e.marker().line(), e.marker().col() + 1),
        message: e.info().to_string(),
    })?;
    let chars: Vec<char> = text.chars().collect();
    docs.iter().map(|d| convert(d, &file, &chars)).collect()
}

fn convert(y: &MarkedYaml<'_>, file: &Arc<PathBuf>, src: &[char]) -> Result<Node, SyntaxError> {
    let loc = Loc::new(file.clone(), y.span.start.line(), y.span.start.col() + 1);
    let value = match &y.data {
        YamlData::Value(s) => scalar(s, y, src),
        YamlData::Representation(text, _, _) => Value::Str(text.to_string()),
        YamlData::Sequence(items) => Value::Seq(
            items
                .iter()
                .map(|i| convert(i, file, src))
                .collect::<Result<_, _>>()?,
        ),
        YamlData::Mapping(map) => {
            let mut entries = Vec::with_capacity(map.len());
            for (k, v) in map {
                let key_node = convert(k, file, src)?;
                let Some(name) = key_node.scalar_text() else {
                    return Err(SyntaxError {
                        loc: key_node.loc,
                        message: "mapping keys must be plain scalars".into(),
                    });
                };
                entries.push((
                    Key {
                        name,
                        loc: key_node.loc,
                    },
                    convert(v, file, src)?,
                ));
            }
            Value::Map(entries)
        }
        YamlData::Tagged(_, inner) => return convert(inner, file, src),
        YamlData::Alias(_) | YamlData::BadValue => {
            return Err(SyntaxError {
                loc,
                message: "unsupported or malformed value (aliases and bad tags are not accepted)"
                    .into(),
            });
        }
    };
    Ok(Node { loc, value })
}

fn scalar(s: &Scalar<'_>, y: &MarkedYaml<'_>, src: &[char]) -> Value {
    match s {
        Scalar::Null => Value::Null,
        Scalar::Boolean(b) => Value::Bool(*b),
        Scalar::Integer(i) => Value::Int(*i),
        Scalar::FloatingPoint(f) => {
            let (a, b) = (y.span.start.index(), y.span.end.index());
            let raw: String = if a < b && b <= src.len() {
                src[a..b].iter().collect::<String>().trim().to_string()
            } else {
                f.to_string()
            };
            Value::Float(f.into_inner(), raw)
        }
        Scalar::String(s) => Value::Str(s.to_string()),
    }
}

/// Builds the dotted field path used in diagnostics (`nodes[2].macs[0]`).
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `path[index]`.
pub fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// Reads the fields of one mapping, remembering which were read so that the rest can be
/// reported as unknown (with a "did you mean" suggestion from the fields that exist).
pub(crate) struct MapReader<'a> {
    node: &'a Node,
    entries: &'a [(Key, Node)],
    used: Vec<bool>,
    /// The mapping's own path.
    pub path: String,
}

impl<'a> MapReader<'a> {
    /// Start reading `node` as a mapping; reports an error and returns `None` when it is not.
    pub fn new(node: &'a Node, path: &str, diags: &mut Diagnostics) -> Option<Self> {
        match &node.value {
            Value::Map(entries) => Some(Self {
                node,
                entries,
                used: vec![false; entries.len()],
                path: path.to_string(),
            }),
            _ => {
                diags.error(
                    &node.loc,
                    path,
                    format!("expected a mapping, found {}", node.kind()),
                );
                None
            }
        }
    }

    /// Where the mapping starts.
    pub(crate) fn loc(&self) -> &Loc {
        &self.node.loc
    }

    /// The value of `key`, if present (a `null` value counts as absent).
    pub fn get(&mut self, key: &str) -> Option<&'a Node> {
        let i = self.entries.iter().position(|(k, _)| k.name == key)?;
        self.used[i] = true;
        let node = &self.entries[i].1;
        (node.value != Value::Null).then_some(node)
    }

    /// True when `key` is written (even with a null value).
    pub fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|(k, _)| k.name == key)
    }

    /// Path of a field of this mapping.
    pub fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Report every key that was never read as an unknown field.
    pub fn finish(self, known: &[&str], diags: &mut Diagnostics) {
        for ((key, _), used) in self.entries.iter().zip(&self.used) {
            if *used || known.contains(&key.name.as_str()) {
                continue;
            }
            let hint = match did_you_mean(&key.name, known) {
                Some(s) => format!(
                    "did you mean `{s}`? valid fields here: {}",
                    known.join(", ")
                ),
                None => format!("valid fields here: {}", known.join(", ")),
            };
            diags.error_hint(
                &key.loc,
                join(&self.path, &key.name),
                format!("unknown field `{}`", key.name),
                hint,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Node {
        parse_documents(Path::new("t.yaml"), text)
            .unwrap()
            .remove(0)
    }

    #[test]
    fn locations_are_one_based() {
        let n = parse("a: 1\nb:\n  c: x\n");
        let Value::Map(entries) = &n.value else {
            panic!()
        };
        assert_eq!((entries[1].0.loc.line, entries[1].0.loc.column), (2, 1));
        let Value::Map(inner) = &entries[1].1.value else {
            panic!()
        };
        assert_eq!((inner[0].0.loc.line, inner[0].0.loc.column), (3, 3));
        assert_eq!((inner[0].1.loc.line, inner[0].1.loc.column), (3, 6));
    }

    #[test]
    fn floats_keep_their_text() {
        let n = parse("v: 1.10\n");
        let Value::Map(e) = &n.value else { panic!() };
        assert_eq!(e[0].1.scalar_text().as_deref(), Some("1.10"));
    }

    #[test]
    fn duplicate_keys_are_a_syntax_error() {
        let err = parse_documents(Path::new("t.yaml"), "a: 1\na: 2\n").unwrap_err();
        assert_eq!(err.loc.line, 2);
    }

    #[test]
    fn unknown_fields_get_suggestions() {
        let n = parse("name: x\nadress: y\n");
        let mut d = Diagnostics::new();
        let mut r = MapReader::new(&n, "nodes[0]", &mut d).unwrap();
        r.get("name");
        r.finish(&["name", "address"], &mut d);
        let msg = d.iter().next().unwrap().to_string();
        assert!(msg.starts_with("t.yaml:2:1: error: nodes[0].adress: unknown field `adress`"));
        assert!(msg.contains("did you mean `address`?"));
    }

    #[test]
    fn deep_nesting_is_a_located_error() {
        use crate::nesting::tests::{block_maps, block_seqs, flow_maps, flow_seqs};
        for make in [block_maps, block_seqs, flow_maps, flow_seqs] {
            for depth in [crate::nesting::MAX_DEPTH + 1, 5_000, 50_000] {
                let text = format!("top:\n  {}", make(depth).replace('\n', "\n  "));
                let err = parse_documents(Path::new("deep.yaml"), &text).unwrap_err();
                assert_eq!(err.loc.file.as_path(), Path::new("deep.yaml"));
                assert!(err.loc.line >= 2, "{err}");
                let msg = err.to_string();
                assert!(
                    msg.contains("more than 100 levels") && msg.contains("flatten"),
                    "{msg}"
                );
            }
        }
        let ok = format!("top:\n  {}", flow_maps(50));
        assert!(parse_documents(Path::new("ok.yaml"), &ok).is_ok());
    }

    #[test]
    fn converts_to_yaml_serde_in_order() {
        let n = parse("z: 1\na: [x, {b: true}]\n");
        let y = n.to_yaml();
        let s = yaml_serde::to_string(&y).unwrap();
        assert_eq!(s, "z: 1\na:\n- x\n- b: true\n");
    }
}
