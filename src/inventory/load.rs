//! Loading an inventory file: format detection, the hand-off to the `talboot.yaml` reader
//! ([`talboot`]) or the talhelper one, and the final assembly that runs validation and resolves
//! roles.
//!
//! Decoding never stops at the first problem. Each section is read into typed values; a field
//! that cannot be read is reported and left out, and cross-field validation then runs on what
//! could be read, so one run of `talboot check` shows every problem in the file.

use std::path::{Path, PathBuf};

use super::diag::{Diagnostics, Loc};
use super::model::*;
use super::parts::{Env, Parts, ProcessEnv};
use super::validate;
use super::yaml::{self, Node as Y, Value, index};

mod talboot;

/// Why an inventory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read at all.
    #[error("cannot read inventory {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file was read but is invalid; every problem found is listed.
    #[error("{} has {} error(s)", path.display(), diagnostics.error_count())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// All errors and warnings.
        diagnostics: Diagnostics,
    },
}

/// A successfully loaded inventory and the warnings found on the way.
#[derive(Debug)]
pub struct Loaded {
    /// The validated inventory.
    pub inventory: Inventory,
    /// Warnings (never errors).
    pub warnings: Diagnostics,
}

/// Load and validate the inventory at `path`, detecting talboot or talhelper format, with
/// `${VAR}` values in talhelper files taken from the process environment.
pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    load_with_env(path, &ProcessEnv)
}

/// [`load`] with an explicit environment.
pub fn load_with_env(path: &Path, env: &dyn Env) -> Result<Loaded, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |diagnostics| LoadError::Invalid {
        path: path.to_path_buf(),
        diagnostics,
    };
    let mut d = Diagnostics::new();
    let docs = match yaml::parse_documents(path, &text) {
        Ok(docs) => docs,
        Err(e) => {
            d.error(&e.loc, "", format!("invalid YAML: {}", e.message));
            return Err(invalid(d));
        }
    };
    let root = match docs.as_slice() {
        [root] => root,
        [] => {
            d.error_hint(
                &Loc::file_only(path),
                "",
                "the file is empty",
                "see docs/inventory.md for a complete example",
            );
            return Err(invalid(d));
        }
        [_, second, ..] => {
            d.error(
                &second.loc,
                "",
                "an inventory is one YAML document; remove the extra `---` documents",
            );
            return Err(invalid(d));
        }
    };
    let base = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let parts = if is_talhelper(root) {
        super::talhelper::read(root, &base, env, &mut d)
    } else {
        talboot::read(root, &base, &mut d)
    };
    let inventory = assemble(path, &base, parts, &mut d);
    match inventory {
        Some(inventory) if !d.has_errors() => Ok(Loaded {
            inventory,
            warnings: d,
        }),
        _ => Err(invalid(d)),
    }
}

/// A talhelper file has `clusterName` at the top; ours has `cluster`.
fn is_talhelper(root: &Y) -> bool {
    match &root.value {
        Value::Map(entries) => {
            entries.iter().any(|(k, _)| k.name == "clusterName")
                && !entries.iter().any(|(k, _)| k.name == "cluster")
        }
        _ => false,
    }
}

fn assemble(path: &Path, base: &Path, mut parts: Parts, d: &mut Diagnostics) -> Option<Inventory> {
    let roles = validate::resolve_roles(&parts.roles, d);
    validate::check(&parts, &roles, d);
    super::power::resolve(
        &mut parts.nodes,
        &parts.node_power,
        &parts.role_power,
        &roles,
        base,
        d,
    );
    super::storage::fold_role_volumes(&mut parts.nodes, &parts.role_volumes, &roles);
    fold_role_secure_boot(&mut parts.nodes, &parts.role_secure_boot, &roles);
    Some(Inventory {
        path: path.to_path_buf(),
        format: parts.format.unwrap_or(SourceFormat::Talboot),
        cluster: parts.cluster?,
        network: parts.network?,
        boot: parts.boot?,
        roles,
        nodes: parts.nodes,
        addons: parts.addons,
    })
}

/// Gives each node without its own `secureBoot` the nearest one in its role chain.
fn fold_role_secure_boot(
    nodes: &mut [super::model::Node],
    by_role: &std::collections::BTreeMap<String, super::model::Spanned<bool>>,
    roles: &std::collections::BTreeMap<String, super::model::ResolvedRole>,
) {
    for node in nodes.iter_mut().filter(|n| n.secure_boot.is_none()) {
        node.secure_boot = roles
            .get(node.role.as_str())
            .and_then(|role| role.chain.iter().rev().find_map(|r| by_role.get(r)))
            .cloned();
    }
}

/// Index helper re-exported for the talhelper reader.
pub fn item_path(path: &str, i: usize) -> String {
    index(path, i)
}
