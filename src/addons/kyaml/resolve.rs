//! go-yaml v2's scalar rules (`resolve.go`): what a plain or tagged scalar's text is, by
//! YAML 1.1 (`0400` an octal integer, `yes` a boolean, `1e3` a number), and whether an explicit
//! core tag agrees with it.

use super::ValueError;
use super::gostd::{go_parse_float, go_parse_int, go_parse_uint, parse_timestamp};

const STR_TAG: &str = "tag:yaml.org,2002:str";
const BOOL_TAG: &str = "tag:yaml.org,2002:bool";
const INT_TAG: &str = "tag:yaml.org,2002:int";
const FLOAT_TAG: &str = "tag:yaml.org,2002:float";
const NULL_TAG: &str = "tag:yaml.org,2002:null";
const TIMESTAMP_TAG: &str = "tag:yaml.org,2002:timestamp";
/// `!!binary`: base64 text, decoded to a string.
pub(super) const BINARY_TAG: &str = "tag:yaml.org,2002:binary";
/// `!!merge`: the `<<` key.
pub(super) const MERGE_TAG: &str = "tag:yaml.org,2002:merge";

/// What go-yaml's `resolve` makes of a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Resolved {
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
pub(super) fn resolve(tag: &str, input: &str) -> Result<Resolved, ValueError> {
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
    Err(ValueError::TagMismatch {
        found: short_tag(rtag),
        input: input.to_owned(),
        wanted: short_tag(tag),
    })
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
