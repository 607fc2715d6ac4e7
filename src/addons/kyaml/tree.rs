//! The node tree go-yaml's parser builds, from saphyr-parser's events: scalars keep their
//! text, tag and implicitness, so the resolver can apply go-yaml's rules later; aliases point
//! at the latest anchor of their name; only the first document is read.

use std::borrow::Cow;

use saphyr_parser::{Event, Parser, ScalarStyle, Tag};

use super::{DocError, MAX_DEPTH, ValueError};

/// One node's content.
#[derive(Debug)]
pub(super) enum NodeKind {
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

/// A node and the 1-based line it starts on.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) kind: NodeKind,
    pub(super) line: usize,
}

/// The nodes of one document; collections and aliases refer to nodes by index.
pub(super) struct Tree {
    pub(super) nodes: Vec<Node>,
    /// The document's top node; `None` for an empty document.
    pub(super) root: Option<usize>,
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

/// The tree of the first document in `text`.
pub(super) fn build(text: &str) -> Result<Tree, DocError> {
    let mut nodes: Vec<Node> = Vec::new();
    // saphyr numbers anchors itself; a redefined name gets a new number, so an alias finds
    // the latest definition, as go-yaml's `p.doc.anchors[name] = n` does.
    let mut anchors: std::collections::HashMap<usize, usize> = Default::default();
    let mut stack: Vec<Open> = Vec::new();
    let mut root = None;
    for ev in Parser::new_from_str(text) {
        let (ev, span) =
            ev.map_err(|e| ValueError::Syntax(e.info().to_owned()).at(e.marker().line()))?;
        let line = span.start.line();
        let (kind, anchor) = match ev {
            Event::StreamStart | Event::Nothing | Event::DocumentStart(_) => continue,
            // Only the first document counts (go-yaml `unmarshal` parses one node).
            Event::StreamEnd | Event::DocumentEnd => break,
            Event::Alias(id) => {
                let Some(&target) = anchors.get(&id) else {
                    return Err(ValueError::UnknownAnchor.at(line));
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
                    None => return Err(ValueError::Unbalanced.at(line)),
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
                    return Err(ValueError::TooDeep.at(line));
                }
                stack.push(o);
            }
            None => attach(&mut nodes, &mut stack, &mut root, idx),
        }
    }
    Ok(Tree { nodes, root })
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
