//! `${VAR}` substitution in a talhelper document: the variables come from the process
//! environment first, then from a plain `talenv.yaml` next to the config.

use std::collections::BTreeMap;
use std::path::Path;

use crate::inventory::diag::{Diagnostics, Loc};
use crate::inventory::parts::Env;
use crate::inventory::yaml::{Node as Y, Value, index, join};

/// Values from `talenv.yaml` (plain `KEY: value` lines) next to the config; the process
/// environment wins, as with dotenv loading.
pub(super) fn load_talenv(base: &Path, d: &mut Diagnostics) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for name in ["talenv.yaml", "talenv.yml"] {
        let path = base.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match crate::inventory::yaml::parse_documents(&path, &text) {
            Ok(docs) => {
                for doc in docs {
                    if let Value::Map(entries) = &doc.value {
                        for (k, v) in entries {
                            if let Some(s) = v.scalar_text() {
                                out.insert(k.name.clone(), s);
                            }
                        }
                    } else if doc.value != Value::Null {
                        d.error(&doc.loc, "", "talenv file must be a mapping of NAME: value");
                    }
                }
            }
            Err(e) => d.error(
                &e.loc,
                "",
                format!("invalid YAML in talenv file: {}", e.message),
            ),
        }
        if text.contains("\nsops:") || text.starts_with("sops:") {
            d.warning(
                &Loc::file_only(&path),
                "",
                "this talenv file is SOPS-encrypted; talboot reads only plain talenv files",
                Some("export the variables in the environment instead".into()),
            );
        }
    }
    out
}

pub(super) struct ChainEnv<'a> {
    pub(super) first: &'a dyn Env,
    pub(super) second: &'a BTreeMap<String, String>,
}

impl Env for ChainEnv<'_> {
    fn var(&self, name: &str) -> Option<String> {
        self.first
            .var(name)
            .or_else(|| self.second.get(name).cloned())
    }
}

/// Replace `${VAR}`, `${VAR:-default}`, `${VAR-default}` and `$VAR` in every string value; `$$`
/// is a literal `$`.
pub(super) fn substitute(node: &mut Y, path: &str, env: &dyn Env, d: &mut Diagnostics) {
    match &mut node.value {
        Value::Str(s) if s.contains('$') => match expand(s, env) {
            Ok(v) => *s = v,
            Err(UnsetVariable(name)) => d.error_hint(
                &node.loc,
                path,
                format!("environment variable `{name}` is unset or empty"),
                format!("export {name}=..., or set it in talenv.yaml next to the config"),
            ),
        },
        Value::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                substitute(item, &index(path, i), env, d);
            }
        }
        Value::Map(entries) => {
            for (k, v) in entries.iter_mut() {
                let p = join(path, &k.name);
                substitute(v, &p, env, d);
            }
        }
        _ => {}
    }
}

/// A `${VAR}` whose variable is unset or empty (talhelper's rule: that is an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable `{0}` is unset or empty")]
pub(crate) struct UnsetVariable(pub String);

/// Expand one string; on failure names the variable that was unset or empty.
pub(crate) fn expand(s: &str, env: &dyn Env) -> Result<String, UnsetVariable> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('{') {
            let Some(end) = r.find('}') else {
                out.push('$');
                rest = after;
                continue;
            };
            let inner = &r[..end];
            let (name, default) = match inner.find([':', '-']) {
                Some(j) if inner[j..].starts_with(":-") => (&inner[..j], Some(&inner[j + 2..])),
                Some(j) if inner[j..].starts_with('-') => (&inner[..j], Some(&inner[j + 1..])),
                _ => (inner, None),
            };
            match (env.var(name).filter(|v| !v.is_empty()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(def)) => out.push_str(def),
                (None, None) => return Err(UnsetVariable(name.to_string())),
            }
            rest = &r[end + 1..];
        } else {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if len == 0 || after.as_bytes()[0].is_ascii_digit() {
                out.push('$');
                rest = after;
                continue;
            }
            let name = &after[..len];
            match env.var(name).filter(|v| !v.is_empty()) {
                Some(v) => out.push_str(&v),
                None => return Err(UnsetVariable(name.to_string())),
            }
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expand_forms() {
        let e = env(&[("A", "1"), ("EMPTY", "")]);
        assert_eq!(expand("x${A}y", &e).unwrap(), "x1y");
        assert_eq!(expand("$A-$A", &e).unwrap(), "1-1");
        assert_eq!(expand("${B:-def}", &e).unwrap(), "def");
        assert_eq!(expand("${B-def}", &e).unwrap(), "def");
        assert_eq!(expand("$$A", &e).unwrap(), "$A");
        assert_eq!(expand("${B}", &e).unwrap_err(), UnsetVariable("B".into()));
        assert_eq!(
            expand("${EMPTY}", &e).unwrap_err(),
            UnsetVariable("EMPTY".into())
        );
        assert_eq!(expand("cost: 5$", &e).unwrap(), "cost: 5$");
    }
}
