//! Role resolution: each role's `extends` chain folded into one [`ResolvedRole`], with
//! unknown parents, cycles and machine-type changes reported.

use std::collections::{BTreeMap, HashMap};

use super::unknown_role;
use crate::inventory::diag::Diagnostics;
use crate::inventory::model::*;

/// The roles that exist without being written: `controlplane` and `worker`.
fn builtin(name: &str) -> Option<MachineType> {
    MachineType::parse(name)
}

/// Fold every role's `extends` chain. Unknown parents and cycles are reported; roles that
/// cannot be resolved are left out of the result.
pub(crate) fn resolve_roles(
    defs: &[RoleDef],
    d: &mut Diagnostics,
) -> BTreeMap<String, ResolvedRole> {
    let by_name: HashMap<&str, &RoleDef> = defs.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut out = builtin_roles(&by_name);
    let known: Vec<&str> = defs
        .iter()
        .map(|r| r.name.as_str())
        .chain(MachineType::WORDS.iter().copied())
        .collect();
    for def in defs {
        let Some(mut chain) = ancestry(def, &by_name, &known, d) else {
            continue;
        };
        chain.reverse(); // root ancestor first
        let Some(machine_type) = machine_type(def, &chain, d) else {
            continue;
        };
        out.insert(def.name.value.clone(), fold(def, &chain, machine_type));
    }
    out
}

/// The built-in roles not redefined in the file, each a chain of itself.
fn builtin_roles(by_name: &HashMap<&str, &RoleDef>) -> BTreeMap<String, ResolvedRole> {
    let mut out = BTreeMap::new();
    for word in MachineType::WORDS {
        if !by_name.contains_key(word) {
            out.insert(
                word.to_string(),
                ResolvedRole {
                    name: word.to_string(),
                    machine_type: MachineType::parse(word).expect("builtin role"),
                    chain: vec![word.to_string()],
                    patches: Vec::new(),
                    labels: BTreeMap::new(),
                    taints: Vec::new(),
                },
            );
        }
    }
    out
}

/// `def` and its ancestors, `def` first, up to a role that extends nothing or a built-in;
/// `None` (reported) on a cycle or an unknown parent.
fn ancestry<'a>(
    def: &'a RoleDef,
    by_name: &HashMap<&str, &'a RoleDef>,
    known: &[&str],
    d: &mut Diagnostics,
) -> Option<Vec<&'a RoleDef>> {
    // Walk up the chain, collecting ancestors until a root (no extends).
    let mut chain: Vec<&RoleDef> = vec![def];
    loop {
        let cur = *chain.last().expect("non-empty");
        let Some(parent) = &cur.extends else { break };
        if parent.as_str() == cur.name.as_str()
            || chain.iter().any(|r| r.name.as_str() == parent.as_str())
        {
            if std::ptr::eq(cur, def) || chain.len() > 1 {
                let names: Vec<&str> = chain.iter().map(|r| r.name.as_str()).collect();
                // Report a cycle once, on the role where the walk started.
                d.error_hint(
                    &parent.loc,
                    format!("roles.{}.extends", cur.name.as_str()),
                    format!(
                        "role `{}` is part of an extends cycle: {} -> {}",
                        def.name.as_str(),
                        names.join(" -> "),
                        parent.as_str()
                    ),
                    "remove one `extends` so the chain ends at a role with a `type`",
                );
            }
            return None;
        }
        match by_name.get(parent.as_str()) {
            Some(p) => chain.push(p),
            None if builtin(parent.as_str()).is_some() => break,
            None => {
                if std::ptr::eq(cur, def) {
                    unknown_role(
                        d,
                        &parent.loc,
                        &format!("roles.{}.extends", cur.name.as_str()),
                        parent.as_str(),
                        known,
                    );
                }
                return None;
            }
        }
    }
    Some(chain)
}

/// The machine type of `def` from its chain (root ancestor first); `None` (reported) when
/// there is none or `def`'s own type differs from the one it inherits.
fn machine_type(def: &RoleDef, chain: &[&RoleDef], d: &mut Diagnostics) -> Option<MachineType> {
    let root_extends_builtin = chain[0].extends.as_ref().and_then(|p| builtin(p.as_str()));
    let machine_type = chain
        .iter()
        .rev()
        .find_map(|r| r.machine_type)
        .or(root_extends_builtin)
        .or_else(|| builtin(def.name.as_str()));
    let Some(machine_type) = machine_type else {
        d.error_hint(
            &def.name.loc,
            format!("roles.{}", def.name.as_str()),
            format!("role `{}` has no machine type", def.name.as_str()),
            "set `type: controlplane` or `type: worker`, or `extends` another role",
        );
        return None;
    };
    if let Some(t) = def.machine_type
        && let Some(parent_t) = chain[..chain.len() - 1]
            .iter()
            .rev()
            .find_map(|r| r.machine_type)
            .or(root_extends_builtin)
        && t != parent_t
    {
        d.error_hint(
            &def.name.loc,
            format!("roles.{}.type", def.name.as_str()),
            format!(
                "role `{}` is a {t} but extends a {parent_t} role",
                def.name.as_str()
            ),
            "a role must keep the machine type of the role it extends",
        );
        return None;
    }
    Some(machine_type)
}

/// `def` resolved: its chain's names, and the labels, taints and patches of its ancestors
/// merged root first (a later taint replaces an earlier one with the same key and effect).
fn fold(def: &RoleDef, chain: &[&RoleDef], machine_type: MachineType) -> ResolvedRole {
    let mut names: Vec<String> = Vec::new();
    if let Some(b) = &chain[0].extends {
        names.push(b.value.clone());
    }
    let mut labels = BTreeMap::new();
    let mut taints: Vec<Taint> = Vec::new();
    let mut patches = Vec::new();
    for r in chain {
        names.push(r.name.value.clone());
        labels.extend(r.labels.clone());
        for t in &r.taints {
            taints.retain(|x| !(x.key == t.key && x.effect == t.effect));
            taints.push(t.clone());
        }
        patches.extend(r.patches.iter().cloned());
    }
    ResolvedRole {
        name: def.name.value.clone(),
        machine_type,
        chain: names,
        patches,
        labels,
        taints,
    }
}
