//! Every node of the inventory rendered at once, as `talboot gen`, `plan`, `check`, `up` and
//! serve render them: each document validated against the Talos config schema, all problems
//! across all nodes collected (so the operator fixes them in one pass), and the deprecated
//! fields turned into one warning per field.

use crate::inventory::Inventory;
use crate::talosfacts::contract::Contract;

use super::patch::ConfigBundle;
use super::render;
use super::schema::{Deprecation, Schema};
use super::secrets::SecretsBundle;

/// What [`render_all`] produced.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    /// `(node name, YAML text)` in inventory order.
    pub configs: Vec<(String, String)>,
    /// Warnings for the operator (deprecated fields, one line per field), `warning: ...`.
    pub warnings: Vec<String>,
}

/// Renders every node and validates each document against `schema`: the configs with
/// warnings, or every problem found across all nodes (structure and schema violations).
pub(crate) fn render_all(
    inv: &Inventory,
    secrets: &SecretsBundle,
    schema: &Schema,
) -> Result<Rendered, Vec<String>> {
    render_each(inv, schema, |node| render::render_node(inv, secrets, node))
}

/// [`render_all`] at a chosen contract instead of the cluster's (day two renders a node at
/// the contract of the config it runs); `schema` should be that contract's.
pub(crate) fn render_all_at(
    inv: &Inventory,
    secrets: &SecretsBundle,
    schema: &Schema,
    contract: Contract,
) -> Result<Rendered, Vec<String>> {
    render_each(inv, schema, |node| {
        render::render_node_at(inv, secrets, node, contract)
    })
}

/// Renders every node with `render_node`, validates it and collects the problems.
fn render_each(
    inv: &Inventory,
    schema: &Schema,
    render_node: impl Fn(&crate::inventory::Node) -> Result<ConfigBundle, render::RenderError>,
) -> Result<Rendered, Vec<String>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut unchecked: Vec<String> = Vec::new();
    let mut deprecated: Vec<Deprecation> = Vec::new();
    for node in &inv.nodes {
        let name = node.name.value.clone();
        let bundle = match render_node(node) {
            Ok(b) => b,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        let report = schema.validate(&name, &bundle);
        problems.extend(report.violations.iter().map(ToString::to_string));
        deprecated.extend(report.deprecated);
        for u in report.unchecked {
            if !unchecked.contains(&u) {
                unchecked.push(u);
            }
        }
        match bundle.to_yaml() {
            Ok(text) => out.push((name, text)),
            Err(e) => problems.push(format!("node {name}: {e}")),
        }
    }
    if !unchecked.is_empty() {
        tracing::debug!(
            fields = %unchecked.join(", "),
            "fields Talos accepts but its config schema omits; not schema-checked"
        );
    }
    if problems.is_empty() {
        Ok(Rendered {
            configs: out,
            warnings: deprecation_warnings(&deprecated),
        })
    } else {
        Err(problems)
    }
}

/// One warning per deprecated field, naming every node whose config carries it.
pub(crate) fn deprecation_warnings(found: &[Deprecation]) -> Vec<String> {
    let mut fields: Vec<(&str, &str, &str, Vec<&str>)> = Vec::new();
    for d in found {
        match fields.iter_mut().find(|(f, _, _, _)| *f == d.field) {
            Some((_, _, _, nodes)) => nodes.push(&d.node),
            None => fields.push((&d.field, d.since, d.replacement, vec![&d.node])),
        }
    }
    fields
        .into_iter()
        .map(|(field, since, replacement, nodes)| {
            format!(
                "warning: v1alpha1 `{field}` (in the rendered config of {} {}) is deprecated \
                 since Talos {since} and not in its config schema; use {replacement} instead",
                if nodes.len() == 1 { "node" } else { "nodes" },
                nodes.join(", ")
            )
        })
        .collect()
}
