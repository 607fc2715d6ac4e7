//! `talboot plan`'s I/O side: for every inventory node, read the config it runs (COSI
//! `MachineConfigs.config.talos.dev/v1alpha1` over the mTLS API with the admin talosconfig,
//! relayed by a control plane with the `node` header when the node cannot be reached
//! directly) and ask the node's own dry run which apply mode the rendered config needs
//! (Talos is the authority on what needs a reboot: `CanApplyImmediate`). The diff itself is
//! the pure [`super::diff`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::{ClientCreds, TalosClient, TalosError};

use super::diff::{self, ConfigDiff};
use super::rollout::Role;

/// One node to plan for.
#[derive(Clone, Debug)]
pub struct NodeTarget {
    pub name: String,
    pub role: Role,
    /// The node's own apid address.
    pub addr: SocketAddr,
    /// The address a control plane's `node` relay knows it by (its inventory address).
    pub node_ip: IpAddr,
    /// What the inventory renders for it.
    pub rendered: String,
}

/// Why a node could not be planned (shared, so a plan can be cloned).
#[derive(Clone, Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot reach the node: {0}")]
    Unreachable(Arc<TalosError>),
    #[error("cannot read its MachineConfig: {0}")]
    ReadConfig(Arc<TalosError>),
    #[error("{0}")]
    Diff(diff::DiffError),
    #[error("the node's dry run failed: {0}")]
    DryRun(Arc<TalosError>),
    #[error("cannot read its config for the next boot: {0}")]
    NextBoot(Arc<TalosError>),
    /// Not rendered at the contract asked for (`--contract`, [`super::contract`]).
    #[error("{0}")]
    Contract(super::contract::ContractError),
}

/// The plan of one node.
#[derive(Clone, Debug)]
pub struct NodePlan {
    pub name: String,
    pub role: Role,
    /// The diff running -> rendered, or why it could not be had.
    pub diff: Result<ConfigDiff, PlanError>,
    /// The mode Talos's dry run (AUTO) resolved to, when there are changes.
    pub mode: Option<Mode>,
    /// Talos's dry-run text (its own diff), for the detail view.
    pub dry_run: Option<String>,
}

impl NodePlan {
    pub fn changed(&self) -> bool {
        matches!(&self.diff, Ok(d) if !d.is_empty())
    }
}

/// Connects to a node: directly, else through the first control plane that answers.
#[derive(Clone)]
pub struct Connector {
    pub creds: ClientCreds,
    /// Control plane apid addresses that may relay.
    pub relays: Vec<SocketAddr>,
    pub retry: crate::talos::retry::RetryPolicy,
}

impl Connector {
    /// A client for `t` that answers Version, and whether it is relayed.
    pub async fn client(&self, t: &NodeTarget) -> Result<TalosClient, TalosError> {
        let direct = TalosClient::secured(t.addr, &self.creds)?.with_retry(self.retry);
        let err = match direct.version().await {
            Ok(_) => return Ok(direct),
            Err(e) => e,
        };
        for relay in &self.relays {
            if *relay == t.addr {
                continue;
            }
            let Ok(c) = TalosClient::secured(*relay, &self.creds) else {
                continue;
            };
            let Ok(c) = c.with_retry(self.retry).with_node(&t.node_ip.to_string()) else {
                continue;
            };
            if c.version().await.is_ok() {
                return Ok(c);
            }
        }
        Err(err)
    }
}

/// Plans one node.
pub(crate) async fn plan_node(conn: &Connector, t: &NodeTarget) -> NodePlan {
    let mut plan = NodePlan {
        name: t.name.clone(),
        role: t.role,
        diff: Ok(ConfigDiff::default()),
        mode: None,
        dry_run: None,
    };
    let client = match conn.client(t).await {
        Ok(c) => c,
        Err(e) => {
            plan.diff = Err(PlanError::Unreachable(Arc::new(e)));
            return plan;
        }
    };
    let running = match client.machine_config().await {
        Ok(r) => r,
        Err(e) => {
            plan.diff = Err(PlanError::ReadConfig(Arc::new(e)));
            return plan;
        }
    };
    plan.diff = diff::diff(&running, &t.rendered).map_err(PlanError::Diff);
    if plan.changed() {
        match client
            .apply_configuration_with(t.rendered.as_bytes(), Mode::Auto, true, None)
            .await
        {
            Ok(out) => {
                plan.mode = out.mode;
                plan.dry_run = Some(out.mode_details);
            }
            Err(e) => plan.diff = Err(PlanError::DryRun(Arc::new(e))),
        }
    }
    plan
}

/// Plans every node, in order.
pub(crate) async fn plan_all(conn: &Connector, targets: &[NodeTarget]) -> Vec<NodePlan> {
    let mut out = Vec::new();
    for t in targets {
        out.push(plan_node(conn, t).await);
    }
    out
}

/// The operator's name of a mode (`--mode` values).
pub(crate) fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Reboot => "reboot",
        Mode::Auto => "auto",
        Mode::NoReboot => "no-reboot",
        Mode::Staged => "staged",
        Mode::Try => "try",
    }
}

/// The plan as text: a block per node with changes, a line per unchanged node.
pub fn render(plans: &[NodePlan]) -> String {
    let mut s = String::new();
    for p in plans {
        match &p.diff {
            Err(e) => s.push_str(&format!("{}: ERROR {e}\n", p.name)),
            Ok(d) if d.is_empty() => s.push_str(&format!("{}: no changes\n", p.name)),
            Ok(d) => {
                let mode = p.mode.map(mode_name).unwrap_or("unknown");
                let removals = if d.has_removals() {
                    ", includes REMOVALS"
                } else {
                    ""
                };
                s.push_str(&format!(
                    "{}: {} change(s){removals}; needs apply mode {mode}\n{d}",
                    p.name,
                    d.len()
                ));
            }
        }
    }
    s
}

/// `plan`'s exit code: 0 no changes, 1 changes, 2 any error.
pub(crate) fn exit_code(plans: &[NodePlan]) -> u8 {
    if plans.iter().any(|p| p.diff.is_err()) {
        2
    } else if plans.iter().any(NodePlan::changed) {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str, running: &str, rendered: &str) -> NodePlan {
        NodePlan {
            name: name.into(),
            role: Role::Worker,
            diff: diff::diff(running, rendered).map_err(PlanError::Diff),
            mode: Some(Mode::NoReboot),
            dry_run: None,
        }
    }

    #[test]
    fn exit_codes_and_text() {
        let a = "machine:\n  nodeLabels: {x: a}\n";
        let b = "machine:\n  nodeLabels: {x: b}\n";
        let same = [plan("n1", a, a)];
        assert_eq!(exit_code(&same), 0);
        assert_eq!(render(&same), "n1: no changes\n");
        let changed = [plan("n1", a, a), plan("n2", a, b)];
        assert_eq!(exit_code(&changed), 1);
        assert_eq!(
            render(&changed),
            "n1: no changes\nn2: 1 change(s); needs apply mode no-reboot\n  document \
             v1alpha1:\n    ~ machine.nodeLabels.x: a -> b\n"
        );
        let removed = [plan("n3", b, "machine: {}\n")];
        assert!(render(&removed).contains("includes REMOVALS"));
        let broken = [plan("n1", a, b), plan("n4", a, "x: [")];
        assert_eq!(exit_code(&broken), 2);
        assert!(render(&broken).contains("n4: ERROR rendered config:"));
    }
}
