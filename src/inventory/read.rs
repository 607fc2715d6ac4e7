//! Typed readers over the located YAML tree, shared by the talboot and talhelper loaders.
//!
//! Each reader takes a node and its field path, reports a located diagnostic when the value is
//! not what the field needs (saying what would be valid), and returns `None` in that case so
//! loading can go on and collect every other problem too.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::diag::{Diagnostics, Loc};
use super::model::*;
use super::yaml::{self, MapReader, Node, Value, index, join};

/// A string field.
pub fn string(node: &Node, path: &str, d: &mut Diagnostics) -> Option<String> {
    match &node.value {
        Value::Str(s) => Some(s.clone()),
        _ => match node.scalar_text() {
            Some(s) => Some(s),
            None => {
                d.error(
                    &node.loc,
                    path,
                    format!("expected a string, found {}", node.kind()),
                );
                None
            }
        },
    }
}

/// A boolean field.
pub(crate) fn boolean(node: &Node, path: &str, d: &mut Diagnostics) -> Option<bool> {
    match &node.value {
        Value::Bool(b) => Some(*b),
        _ => {
            d.error_hint(
                &node.loc,
                path,
                format!("expected true or false, found {}", node.kind()),
                "write true or false",
            );
            None
        }
    }
}

/// A string parsed by `parse`, with `what` naming the expected form and `example` a valid value.
pub fn parsed<T, E: std::fmt::Display>(
    node: &Node,
    path: &str,
    d: &mut Diagnostics,
    what: &str,
    example: &str,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Option<Spanned<T>> {
    let s = string(node, path, d)?;
    match parse(s.trim()) {
        Ok(v) => Some(Spanned::new(v, node.loc.clone())),
        Err(e) => {
            d.error_hint(
                &node.loc,
                path,
                format!("`{s}` is not {what} ({e})"),
                format!("write {what}, e.g. {example}"),
            );
            None
        }
    }
}

/// A MAC address.
pub fn mac(node: &Node, path: &str, d: &mut Diagnostics) -> Option<Spanned<Mac>> {
    parsed(node, path, d, "a MAC address", "bc:24:11:4e:00:01", |s| {
        s.parse::<Mac>()
    })
}

/// An IPv4 address.
pub(crate) fn ipv4(node: &Node, path: &str, d: &mut Diagnostics) -> Option<Spanned<Ipv4Addr>> {
    parsed(node, path, d, "an IPv4 address", "10.0.40.1", |s| {
        s.parse::<Ipv4Addr>()
    })
}

/// An address with prefix length, e.g. `10.0.40.11/24` (host bits allowed).
pub(crate) fn ipv4_net(node: &Node, path: &str, d: &mut Diagnostics) -> Option<Spanned<Ipv4Net>> {
    parsed(
        node,
        path,
        d,
        "an IPv4 address with prefix length",
        "10.0.40.11/24",
        |s| s.parse::<Ipv4Net>(),
    )
}

/// A network in CIDR form whose host bits are zero, e.g. `10.0.40.0/24`.
pub(crate) fn ipv4_subnet(
    node: &Node,
    path: &str,
    d: &mut Diagnostics,
) -> Option<Spanned<Ipv4Net>> {
    let net = ipv4_net(node, path, d)?;
    if net.value != net.value.trunc() {
        d.error_hint(
            &node.loc,
            path,
            format!("`{}` has host bits set", net.value),
            format!("write the network address: {}", net.value.trunc()),
        );
        return None;
    }
    Some(net)
}

/// A Talos or Kubernetes version.
pub fn version(node: &Node, path: &str, d: &mut Diagnostics) -> Option<Spanned<Version>> {
    parsed(node, path, d, "a version", "v1.13.9", |s| {
        s.parse::<Version>()
    })
}

/// One of a closed set of words.
pub fn word<T>(
    node: &Node,
    path: &str,
    d: &mut Diagnostics,
    words: &[&str],
    parse: impl FnOnce(&str) -> Option<T>,
) -> Option<T> {
    let s = string(node, path, d)?;
    match parse(&s) {
        Some(v) => Some(v),
        None => {
            let hint = match super::diag::did_you_mean(&s, words) {
                Some(w) => format!("did you mean `{w}`? valid values: {}", words.join(", ")),
                None => format!("valid values: {}", words.join(", ")),
            };
            d.error_hint(&node.loc, path, format!("`{s}` is not a valid value"), hint);
            None
        }
    }
}

/// A duration: whole seconds, or a number followed by `s`, `m`, `h` or `d`.
pub(crate) fn duration(node: &Node, path: &str, d: &mut Diagnostics) -> Option<Duration> {
    parsed(node, path, d, "a duration", "12h", parse_duration).map(|s| s.value)
}

/// What is wrong with a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DurationError {
    /// No digits before the unit.
    #[error("expected a number")]
    NotANumber,
    /// A unit other than s, m, h, d.
    #[error("unknown unit `{0}`; use s, m, h or d")]
    UnknownUnit(String),
    /// Zero.
    #[error("must be greater than zero")]
    Zero,
    /// More seconds than a u64 holds.
    #[error("too large")]
    TooLarge,
}

/// Parses `3600`, `90s`, `30m`, `12h`, `7d`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| DurationError::NotANumber)?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(DurationError::UnknownUnit(unit.to_string())),
    };
    if n == 0 {
        return Err(DurationError::Zero);
    }
    n.checked_mul(mult)
        .map(Duration::from_secs)
        .ok_or(DurationError::TooLarge)
}

/// A list whose items are each read by `item`; a single scalar is accepted as a one-item list
/// only when `allow_single` (for fields like `dns` that people often write as one value).
pub fn list<T>(
    node: &Node,
    path: &str,
    d: &mut Diagnostics,
    allow_single: bool,
    mut item: impl FnMut(&Node, &str, &mut Diagnostics) -> Option<T>,
) -> Vec<T> {
    match &node.value {
        Value::Seq(items) => items
            .iter()
            .enumerate()
            .filter_map(|(i, n)| item(n, &index(path, i), d))
            .collect(),
        Value::Map(_) | Value::Null => {
            d.error(
                &node.loc,
                path,
                format!("expected a list, found {}", node.kind()),
            );
            Vec::new()
        }
        _ if allow_single => item(node, path, d).into_iter().collect(),
        _ => {
            d.error_hint(
                &node.loc,
                path,
                format!("expected a list, found {}", node.kind()),
                "write a YAML list, one `- item` per line or `[a, b]`",
            );
            Vec::new()
        }
    }
}

/// Kubernetes node labels: a mapping of label key to string value.
pub fn labels(node: &Node, path: &str, d: &mut Diagnostics) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Value::Map(entries) = &node.value else {
        d.error(
            &node.loc,
            path,
            format!("expected a mapping of labels, found {}", node.kind()),
        );
        return out;
    };
    for (k, v) in entries {
        let p = join(path, &k.name);
        if !is_label_key(&k.name) {
            d.error_hint(
                &k.loc,
                &p,
                format!("`{}` is not a valid label key", k.name),
                "label keys are [prefix/]name, name up to 63 alphanumerics, '-', '_' or '.'",
            );
            continue;
        }
        let Some(val) = string(v, &p, d) else {
            continue;
        };
        if !is_label_value(&val) {
            d.error_hint(
                &v.loc,
                &p,
                format!("`{val}` is not a valid label value"),
                "label values are empty or up to 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric",
            );
            continue;
        }
        out.insert(k.name.clone(), val);
    }
    out
}

fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric())
}

/// Kubernetes taints in kubectl syntax: a list of `key[=value]:Effect`.
pub(crate) fn taints(node: &Node, path: &str, d: &mut Diagnostics) -> Vec<Taint> {
    list(node, path, d, false, |n, p, d| {
        parsed(
            n,
            p,
            d,
            "a taint",
            "dedicated=monitoring:NoSchedule",
            Taint::parse,
        )
        .map(|s| s.value)
    })
}

/// A hostname (one RFC 1123 label, as Talos and Kubernetes node names need).
pub fn hostname(node: &Node, path: &str, d: &mut Diagnostics) -> Option<Spanned<String>> {
    let s = string(node, path, d)?;
    if is_dns_label(&s) && s.to_ascii_lowercase() == s {
        Some(Spanned::new(s, node.loc.clone()))
    } else {
        d.error_hint(
            &node.loc,
            path,
            format!("`{s}` is not a valid hostname"),
            "use lowercase letters, digits and inner hyphens, at most 63 characters (e.g. k8s-ctrl-01)",
        );
        None
    }
}

/// Kernel arguments: a list of strings, or one space-separated string.
pub(crate) fn kernel_args(node: &Node, path: &str, d: &mut Diagnostics) -> Vec<String> {
    let args: Vec<String> = match &node.value {
        Value::Str(s) => s.split_whitespace().map(str::to_string).collect(),
        _ => list(node, path, d, false, string),
    };
    for a in &args {
        if a.chars().any(|c| c.is_whitespace() || c.is_control()) {
            d.error(
                &node.loc,
                path,
                format!("kernel argument `{a}` contains whitespace"),
            );
        }
    }
    args
}

/// An install disk selector.
pub(crate) fn disk_selector(node: &Node, path: &str, d: &mut Diagnostics) -> Option<DiskSelector> {
    let mut r = MapReader::new(node, path, d)?;
    let mut sel = DiskSelector::default();
    let text = |r: &mut MapReader<'_>, key: &str, d: &mut Diagnostics| {
        let p = r.field(key);
        r.get(key).and_then(|n| string(n, &p, d))
    };
    sel.model = text(&mut r, "model", d);
    sel.serial = text(&mut r, "serial", d);
    sel.wwid = text(&mut r, "wwid", d);
    sel.bus_path = text(&mut r, "busPath", d);
    if let Some(n) = r.get("name") {
        d.error_hint(
            &n.loc,
            r.field("name"),
            "Talos rejects install disk selectors on `name`",
            "device names are what changes between boots; select by model, serial, wwid or busPath",
        );
    }
    if let Some(n) = r.get("size") {
        let p = r.field("size");
        sel.size = parsed(n, &p, d, "a disk size", ">= 500GB", check_size).map(|s| s.value);
    }
    if let Some(n) = r.get("type") {
        let p = r.field("type");
        sel.disk_type = word(n, &p, d, DiskType::WORDS, DiskType::parse);
    }
    let cel = r.get("match").map(|n| (n, r.field("match")));
    let loc = r.loc().clone();
    r.finish(
        &[
            "model", "serial", "size", "type", "wwid", "busPath", "match",
        ],
        d,
    );
    if let Some((n, p)) = cel {
        return disk_match(n, &p, &sel, d).map(|expr| DiskSelector {
            expr: Some(expr),
            ..DiskSelector::default()
        });
    }
    if sel.is_empty() {
        d.error_hint(
            &loc,
            path,
            "disk selector has no criteria and would match every disk",
            "set at least one of model, serial, size, type, wwid, busPath",
        );
        return None;
    }
    Some(sel)
}

/// A selector's `match`: the operator's CEL expression, compiled and checked in Talos's
/// `DiskLocator` environment now, so a typo or a type error (`disk.size > 10 * GiB`) fails
/// `talboot check` with the file and line instead of leaving the node waiting. It replaces
/// the other selector fields rather than joining them (Talos's document has one `match`).
fn disk_match(
    n: &Node,
    path: &str,
    fields: &DiskSelector,
    d: &mut Diagnostics,
) -> Option<Spanned<String>> {
    if !fields.is_empty() {
        d.error_hint(
            &n.loc,
            path,
            "match replaces the other selector fields; both are set",
            "put every condition into the expression, e.g. match: disk.transport == \"nvme\" && \
             disk.size >= 1000u * GB",
        );
        return None;
    }
    let text = string(n, path, d)?;
    match crate::talosfacts::disk_cel::compile(&text) {
        Ok(_) => Some(Spanned::new(text, n.loc.clone())),
        Err(e) => {
            d.error_hint(
                &n.loc,
                path,
                format!("not a disk expression Talos v1.14 accepts: {e}"),
                "the variables are disk (fields such as disk.serial, disk.size, disk.transport, \
                 disk.symlinks) and system_disk; sizes are uint, so write 500u * GB or 1000u, \
                 never 500 * GB; strings use glob(), matches(), startsWith() or in",
            );
            None
        }
    }
}

/// Talos size matchers, read exactly as Talos reads them (`InstallDiskSizeMatcher`, see
/// [`super::size::parse_size_expr`]): an optional comparison, then a size that
/// `humanize.ParseBytes` accepts.
fn check_size(s: &str) -> Result<String, super::size::SizeError> {
    super::size::parse_size_expr(s).map(|_| s.to_string())
}

/// Patches: each list item is an inline mapping (strategic merge), an inline list (JSON patch),
/// a multi-line string holding YAML (talhelper style), or a file path relative to `base`
/// (a leading `@` is accepted, as talhelper writes it).
pub fn patches(node: &Node, path: &str, base: &Path, d: &mut Diagnostics) -> Vec<Patch> {
    list(node, path, d, false, |n, p, d| patch(n, p, base, d))
}

fn patch(node: &Node, path: &str, base: &Path, d: &mut Diagnostics) -> Option<Patch> {
    let origin = PatchOrigin::Inline(node.loc.clone());
    match &node.value {
        Value::Map(_) | Value::Seq(_) => {
            let body = classify_patch(std::slice::from_ref(node), path, d)?;
            let keys = patch_keys(std::slice::from_ref(node), path);
            Some(Patch { origin, body, keys })
        }
        Value::Str(s) if s.contains('\n') => {
            // Inline YAML text: positions inside it are reported relative to the string.
            let docs = match yaml::parse_documents(node.loc.file.as_path(), s) {
                Ok(docs) => docs,
                Err(e) => {
                    d.error(
                        &node.loc,
                        path,
                        format!("inline patch is not valid YAML: {}", e.message),
                    );
                    return None;
                }
            };
            let body = classify_patch(&docs, path, d)?;
            let keys = patch_keys(&docs, path);
            Some(Patch { origin, body, keys })
        }
        Value::Str(s) => {
            let rel = s.strip_prefix('@').unwrap_or(s);
            let file = base.join(rel);
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    d.error_hint(
                        &node.loc,
                        path,
                        format!("cannot read patch file {}: {e}", file.display()),
                        format!(
                            "patch paths are relative to the inventory's folder ({})",
                            base.display()
                        ),
                    );
                    return None;
                }
            };
            let docs = match yaml::parse_documents(&file, &text) {
                Ok(docs) => docs,
                Err(e) => {
                    d.error(
                        &e.loc,
                        path,
                        format!("invalid YAML in patch: {}", e.message),
                    );
                    return None;
                }
            };
            let body = classify_patch(&docs, path, d)?;
            let keys = patch_keys(&docs, path);
            Some(Patch {
                origin: PatchOrigin::File(file),
                body,
                keys,
            })
        }
        _ => {
            d.error_hint(
                &node.loc,
                path,
                format!("a patch cannot be {}", node.kind()),
                "write an inline mapping, a JSON-patch list, or a file path",
            );
            None
        }
    }
}

/// Where each v1alpha1 field and typed document of a patch is written ([`PatchKeys`]).
fn patch_keys(docs: &[Node], path: &str) -> PatchKeys {
    fn walk(entries: &[(super::yaml::Key, Node)], prefix: &mut Vec<String>, out: &mut PatchKeys) {
        for (k, v) in entries {
            prefix.push(k.name.clone());
            out.fields.push((prefix.clone(), k.loc.clone()));
            if let Value::Map(inner) = &v.value {
                walk(inner, prefix, out);
            }
            prefix.pop();
        }
    }
    let mut out = PatchKeys {
        at: path.to_owned(),
        ..PatchKeys::default()
    };
    for doc in docs {
        match &doc.value {
            Value::Map(entries) => match entries.iter().find(|(k, _)| k.name == "kind") {
                Some((_, kind)) => {
                    if let Value::Str(kind) = &kind.value {
                        out.kinds.push((kind.clone(), doc.loc.clone()));
                    }
                }
                None => walk(entries, &mut Vec::new(), &mut out),
            },
            Value::Seq(ops) => {
                for op in ops {
                    let Value::Map(fields) = &op.value else {
                        continue;
                    };
                    if let Some((_, target)) = fields.iter().find(|(k, _)| k.name == "path")
                        && let Value::Str(target) = &target.value
                    {
                        let segments: Vec<String> = target
                            .split('/')
                            .skip(1)
                            .map(|s| s.replace("~1", "/").replace("~0", "~"))
                            .collect();
                        if !segments.is_empty() {
                            out.ops.push((segments.clone(), op.loc.clone()));
                            out.fields.push((segments, op.loc.clone()));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

const JSON_PATCH_OPS: &[&str] = &["add", "remove", "replace", "move", "copy", "test"];

/// Decide whether `docs` are a strategic-merge patch (all mappings) or an RFC 6902 patch (one
/// list of operations), checking each operation's shape.
fn classify_patch(docs: &[Node], path: &str, d: &mut Diagnostics) -> Option<PatchBody> {
    let docs: Vec<&Node> = docs.iter().filter(|n| n.value != Value::Null).collect();
    if docs.is_empty() {
        return None;
    }
    warn_deprecated(&docs, path, d);
    if docs.iter().all(|n| matches!(n.value, Value::Map(_))) {
        return Some(PatchBody::Merge(docs.iter().map(|n| n.to_yaml()).collect()));
    }
    if let [only] = docs.as_slice()
        && let Value::Seq(ops) = &only.value
    {
        let mut ok = true;
        for (i, op) in ops.iter().enumerate() {
            ok &= check_json_op(op, &index(path, i), d);
        }
        return ok.then(|| PatchBody::Json(ops.iter().map(Node::to_yaml).collect()));
    }
    d.error_hint(
        &docs[0].loc,
        path,
        "patch is neither a YAML mapping (strategic merge) nor a JSON-patch list",
        "write a mapping such as `machine: {...}`, or a list of `{op, path, value}` operations",
    );
    None
}

/// Warns, at the key, about every v1alpha1 field a patch sets that Talos v1.13 deprecated
/// ([`crate::talosfacts::schema::DEPRECATED`]), naming the replacement. Strategic-merge
/// documents without `kind` are v1alpha1; JSON-patch operations are matched by `path`.
fn warn_deprecated(docs: &[&Node], path: &str, d: &mut Diagnostics) {
    use crate::talosfacts::schema::DEPRECATED;
    let warn = |d: &mut Diagnostics, loc: &super::diag::Loc, field: &str, replacement: &str| {
        d.warning(
            loc,
            path,
            format!(
                "the patch sets `{field}`, which Talos v1.13 deprecated (its config schema no \
                 longer lists it)"
            ),
            Some(format!("use {replacement} instead")),
        );
    };
    for doc in docs {
        match &doc.value {
            Value::Map(entries) if !entries.iter().any(|(k, _)| k.name == "kind") => {
                for dep in DEPRECATED.iter().filter(|f| f.warn) {
                    let mut cur = entries.as_slice();
                    let mut found = None;
                    for (i, step) in dep.path.iter().enumerate() {
                        let Some((key, value)) = cur.iter().find(|(k, _)| k.name == *step) else {
                            break;
                        };
                        if i + 1 == dep.path.len() {
                            found = Some(key);
                        } else if let Value::Map(inner) = &value.value {
                            cur = inner;
                        } else {
                            break;
                        }
                    }
                    if let Some(key) = found {
                        warn(d, &key.loc, &dep.path.join("."), dep.replacement);
                    }
                }
            }
            Value::Seq(ops) => {
                for op in ops {
                    let Value::Map(fields) = &op.value else {
                        continue;
                    };
                    let Some((_, target)) = fields.iter().find(|(k, _)| k.name == "path") else {
                        continue;
                    };
                    let Value::Str(target) = &target.value else {
                        continue;
                    };
                    for dep in DEPRECATED.iter().filter(|f| f.warn) {
                        let pointer = format!("/{}", dep.path.join("/"));
                        if target == &pointer || target.starts_with(&format!("{pointer}/")) {
                            warn(d, &op.loc, &dep.path.join("."), dep.replacement);
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

fn check_json_op(op: &Node, path: &str, d: &mut Diagnostics) -> bool {
    let errors_before = d.error_count();
    let Some(mut r) = MapReader::new(op, path, d) else {
        return false;
    };
    let kind = r.get("op").and_then(|n| {
        let p = r.field("op");
        word(n, &p, d, JSON_PATCH_OPS, |s| {
            JSON_PATCH_OPS.contains(&s).then(|| s.to_string())
        })
    });
    match r.get("path") {
        Some(n) => {
            let p = r.field("path");
            if let Some(s) = string(n, &p, d)
                && !(s.is_empty() || s.starts_with('/'))
            {
                d.error_hint(
                    &n.loc,
                    &p,
                    format!("JSON pointer `{s}` must start with /"),
                    "e.g. /machine/install/disk",
                );
            }
        }
        None => d.error(r.loc(), path, "JSON-patch operation has no `path`"),
    }
    let has_value = r.has("value");
    let has_from = r.get("from").is_some();
    r.get("value");
    if let Some(kind) = &kind {
        if matches!(kind.as_str(), "add" | "replace" | "test") && !has_value {
            d.error(r.loc(), path, format!("`{kind}` operation needs a `value`"));
        }
        if matches!(kind.as_str(), "move" | "copy") && !has_from {
            d.error(r.loc(), path, format!("`{kind}` operation needs a `from`"));
        }
    } else if !r.has("op") {
        d.error_hint(
            r.loc(),
            path,
            "JSON-patch operation has no `op`",
            format!("use one of {}", JSON_PATCH_OPS.join(", ")),
        );
    }
    r.finish(&["op", "path", "value", "from"], d);
    d.error_count() == errors_before
}

/// Resolve a path written in the inventory against the inventory's folder.
pub(crate) fn relative_path(base: &Path, s: &str) -> PathBuf {
    base.join(s)
}

/// Location used for problems that concern a missing field of a mapping.
pub fn missing(d: &mut Diagnostics, loc: &Loc, path: &str, field: &str, hint: &str) {
    d.error_hint(
        loc,
        join(path, field),
        format!("required field `{field}` is missing"),
        hint,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3600").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("12h").unwrap(), Duration::from_secs(43200));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604800));
        assert!(parse_duration("12x").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn sizes() {
        for ok in [">= 500GB", "<=2TB", "4GB", "1.5TiB", "== 960 GB"] {
            assert!(check_size(ok).is_ok(), "{ok}");
        }
        for bad in ["big", ">= GB", "=> 5GB", "5XB"] {
            assert!(check_size(bad).is_err(), "{bad}");
        }
        use crate::inventory::size::SizeError;
        let e = check_size(">= 5XB").unwrap_err();
        assert_eq!(
            e,
            SizeError::UnknownUnit {
                text: "5XB".into(),
                unit: "xb".into()
            }
        );
        assert!(
            e.to_string()
                .starts_with("failed to parse disk size \"5XB\": unknown unit \"xb\"; use B, kB"),
            "{e}"
        );
        assert!(matches!(
            check_size(">= GB"),
            Err(SizeError::NotANumber { .. })
        ));
    }

    #[test]
    fn label_values() {
        assert!(is_label_value("monitoring"));
        assert!(is_label_value(""));
        assert!(!is_label_value("-x"));
        assert!(!is_label_value("a b"));
    }
}
