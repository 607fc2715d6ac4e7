//! The YAML emitter for [`super::ConfigBundle::to_yaml`].
//!
//! libyaml (under yaml_serde) always writes lists flush with their key. We lay out the block
//! structure ourselves and let yaml_serde render each scalar, so quoting stays libyaml's.

use thiserror::Error;
use yaml_serde::Value;

use super::identity::shape;

/// Why a document could not be written as YAML.
#[derive(Debug, Error)]
pub enum EmitError {
    /// yaml_serde could not render a scalar.
    #[error("{0}")]
    Scalar(#[from] yaml_serde::Error),
    /// A mapping key that block style cannot write on one line.
    #[error("a mapping key must be a one-line scalar, found a {found}")]
    Key {
        /// What the key is.
        found: &'static str,
    },
}

fn indent_to(out: &mut String, column: usize) {
    out.extend(std::iter::repeat_n(' ', column));
}

/// A non-empty mapping or list, seen through a tag.
fn block_container(v: &Value) -> Option<(&Value, Option<String>)> {
    match v {
        Value::Mapping(m) if !m.is_empty() => Some((v, None)),
        Value::Sequence(s) if !s.is_empty() => Some((v, None)),
        Value::Tagged(t) => {
            block_container(&t.value).map(|(inner, _)| (inner, Some(t.tag.to_string())))
        }
        _ => None,
    }
}

pub(super) fn emit_document(out: &mut String, doc: &Value) -> Result<(), EmitError> {
    match block_container(doc) {
        Some((inner, tag)) => {
            if let Some(tag) = tag {
                out.push_str(&tag);
                out.push('\n');
            }
            emit_block(out, inner, 0, false)
        }
        None => emit_scalar(out, doc, 0),
    }
}

/// Write a non-empty mapping or list whose entries sit at `column`. With `inline_first` the
/// first entry continues the current line (after `- `).
fn emit_block(
    out: &mut String,
    v: &Value,
    column: usize,
    inline_first: bool,
) -> Result<(), EmitError> {
    match v {
        Value::Mapping(map) => {
            for (i, (key, value)) in map.iter().enumerate() {
                if i > 0 || !inline_first {
                    indent_to(out, column);
                }
                out.push_str(&render_key(key)?);
                out.push(':');
                match block_container(value) {
                    Some((inner, tag)) => {
                        if let Some(tag) = tag {
                            out.push(' ');
                            out.push_str(&tag);
                        }
                        out.push('\n');
                        emit_block(out, inner, column + 2, false)?;
                    }
                    None => {
                        out.push(' ');
                        emit_scalar(out, value, column)?;
                    }
                }
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 || !inline_first {
                    indent_to(out, column);
                }
                out.push_str("- ");
                match block_container(item) {
                    Some((inner, Some(tag))) => {
                        out.push_str(&tag);
                        out.push('\n');
                        emit_block(out, inner, column + 2, false)?;
                    }
                    Some((inner, None)) => emit_block(out, inner, column + 2, true)?,
                    None => emit_scalar(out, item, column)?,
                }
            }
            Ok(())
        }
        other => emit_scalar(out, other, column),
    }
}

/// Write a scalar (or empty container) that continues the current line. Block scalars (`|`)
/// come back from libyaml with content two columns in; shifting every later line by the
/// parent's `column` keeps that relation, indentation indicators included.
fn emit_scalar(out: &mut String, v: &Value, column: usize) -> Result<(), EmitError> {
    let text = yaml_serde::to_string(v)?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 && !line.is_empty() {
            indent_to(out, column);
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

fn render_key(key: &Value) -> Result<String, EmitError> {
    let plain = matches!(
        key,
        Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null
    );
    let text = yaml_serde::to_string(key)?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    if !plain || text.contains('\n') {
        return Err(EmitError::Key { found: shape(key) });
    }
    Ok(text.to_owned())
}
