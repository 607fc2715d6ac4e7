//! The node tree decoded into the values go-yaml v2 leaves in an `interface{}` (`decode.go`):
//! aliases expanded within go-yaml's budget, `<<` merges applied in document order, and each
//! scalar resolved by go-yaml's rules.

use base64::Engine as _;

use super::gostd::go_json_string;
use super::resolve::{BINARY_TAG, MERGE_TAG, Resolved, resolve};
use super::tree::{Node, NodeKind, Tree};
use super::{DocError, MAX_DEPTH, ValueError};

/// A value as go-yaml leaves it in an `interface{}`: `int`, `uint64` (beyond int64),
/// `float64`, `bool`, `string`, `nil`, `[]interface{}`, `map[interface{}]interface{}`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Y {
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

/// Decodes one tree, counting what go-yaml counts to stop alias bombs.
pub(super) struct Decoder<'a> {
    tree: &'a Tree,
    /// Alias nodes being expanded (go-yaml `d.aliases`): one met again is a cycle.
    active_aliases: Vec<usize>,
    decode_count: usize,
    alias_count: usize,
    alias_depth: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder for `tree` with nothing counted yet.
    pub(super) fn new(tree: &'a Tree) -> Self {
        Decoder {
            tree,
            active_aliases: Vec::new(),
            decode_count: 0,
            alias_count: 0,
            alias_depth: 0,
        }
    }

    fn count(&mut self, line: usize) -> Result<(), DocError> {
        self.decode_count += 1;
        if self.alias_depth > 0 {
            self.alias_count += 1;
        }
        if self.alias_count > 100
            && self.decode_count > 1000
            && self.alias_count as f64 / self.decode_count as f64
                > allowed_alias_ratio(self.decode_count)
        {
            return Err(ValueError::ExcessiveAliasing.at(line));
        }
        Ok(())
    }

    /// Node `idx`, nested `depth` collections deep, as go-yaml's `interface{}` value.
    pub(super) fn decode(&mut self, idx: usize, depth: usize) -> Result<Y, DocError> {
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
            } => scalar(value, tag.as_deref(), *implicit).map_err(|e| e.at(node.line)),
            NodeKind::Seq(items) => {
                if depth >= MAX_DEPTH {
                    return Err(ValueError::TooDeep.at(node.line));
                }
                let mut out = Vec::with_capacity(items.len());
                for &i in items {
                    out.push(self.decode(i, depth + 1)?);
                }
                Ok(Y::Seq(out))
            }
            NodeKind::Map(_) => {
                if depth >= MAX_DEPTH {
                    return Err(ValueError::TooDeep.at(node.line));
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
        f: impl FnOnce(&mut Self, usize, usize) -> Result<T, DocError>,
    ) -> Result<T, DocError> {
        if self.active_aliases.contains(&alias_idx) {
            return Err(ValueError::AliasCycle.at(self.tree.nodes[alias_idx].line));
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
    fn map_into(
        &mut self,
        idx: usize,
        out: &mut Vec<(Y, Y)>,
        depth: usize,
    ) -> Result<(), DocError> {
        let tree = self.tree;
        let NodeKind::Map(pairs) = &tree.nodes[idx].kind else {
            return Err(ValueError::MergeNotMap.at(tree.nodes[idx].line));
        };
        for &(k, v) in pairs {
            if is_merge(&tree.nodes[k]) {
                self.merge(v, out, depth)?;
                continue;
            }
            let key = self.decode(k, depth)?;
            if matches!(key, Y::Seq(_) | Y::Map(_)) {
                return Err(ValueError::CollectionKey.at(tree.nodes[k].line));
            }
            let value = self.decode(v, depth)?;
            set_index(out, key, value);
        }
        Ok(())
    }

    /// go-yaml `merge`: a mapping, an alias of one, or a sequence of those (the earlier
    /// ones win, so they are set last). Keys set before the `<<` are overwritten by it and
    /// keys after it overwrite it, since go-yaml v2 sets them in document order.
    fn merge(&mut self, v: usize, out: &mut Vec<(Y, Y)>, depth: usize) -> Result<(), DocError> {
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
            NodeKind::Scalar { .. } => Err(ValueError::MergeNotMap.at(node.line)),
        }
    }

    fn merge_one(&mut self, v: usize, out: &mut Vec<(Y, Y)>, depth: usize) -> Result<(), DocError> {
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
            _ => Err(ValueError::MergeNotMap.at(node.line)),
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
fn scalar(value: &str, tag: Option<&str>, implicit: bool) -> Result<Y, ValueError> {
    // A quoted or block scalar without a tag is a string, whatever it looks like.
    let Some(tag) = tag.or(if implicit { Some("") } else { None }) else {
        return Ok(Y::Str(value.to_owned()));
    };
    if tag == BINARY_TAG {
        // Go's StdEncoding ignores line breaks; anything else must be padded base64.
        let clean: String = value.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(clean.as_bytes())
            .map_err(|_| ValueError::Base64)?;
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
