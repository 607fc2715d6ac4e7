//! Drift: whether each node still runs what the inventory renders. [`DriftTracker`] is the
//! pure part (one observation per node in, the transitions to announce out: a node event when
//! drift appears or clears); [`watch`] is serve's periodic adapter, which reads every node's
//! `MachineConfig` as `talboot plan` does, sets the `talboot_node_drift{node}` gauge (1
//! drifted, 0 in sync), publishes the transitions on the event bus and each node's last
//! known state on the [`DriftBoard`] (part of the read view, [`crate::view::drift`]: what
//! `/api/nodes` and `talboot status` show). `talboot plan` is the detail view. A node is
//! compared against its rendering at the machine-config contract of the config it runs
//! ([`super::contract`]), so moving the inventory's `talosVersion` past an upgrade is no drift.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::events::{EventBus, EventKind};
use crate::talosfacts::contract::Contract;
use crate::view::drift::{DriftBoard, DriftState};

use super::plan::{Connector, NodeTarget};

/// What one check found for a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    InSync,
    /// Differs: this many changes (fields and documents).
    Drifted(usize),
    /// Could not tell (unreachable, not configured yet): the last known state stands.
    Unknown,
}

/// A change worth announcing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Appeared { node: String, changes: usize },
    Cleared { node: String },
}

/// The last known drift state of every node. One owner: the watcher.
#[derive(Debug, Default, Clone)]
pub struct DriftTracker {
    drifted: BTreeMap<String, bool>,
}

impl DriftTracker {
    /// Records one observation; returns the transition, if any. The first observation of an
    /// in-sync node is not announced (nothing cleared).
    pub fn observe(&mut self, node: &str, obs: &Observation) -> Option<Transition> {
        let now = match obs {
            Observation::InSync => false,
            Observation::Drifted(_) => true,
            Observation::Unknown => return None,
        };
        let before = self.drifted.insert(node.to_owned(), now).unwrap_or(false);
        match (before, now, obs) {
            (false, true, Observation::Drifted(changes)) => Some(Transition::Appeared {
                node: node.to_owned(),
                changes: *changes,
            }),
            (true, false, _) => Some(Transition::Cleared {
                node: node.to_owned(),
            }),
            _ => None,
        }
    }

    /// Whether `node` is known to drift.
    pub fn is_drifted(&self, node: &str) -> Option<bool> {
        self.drifted.get(node).copied()
    }
}

/// Checks every node each `interval` until `cancel` fires.
pub async fn watch(
    conn: Connector,
    targets: Vec<NodeTarget>,
    events: EventBus,
    board: Arc<DriftBoard>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut tracker = DriftTracker::default();
    // The first check one interval after start: the nodes are still being provisioned then.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        for candidates in by_node(&targets) {
            let t = candidates[0];
            let plan = observe(&conn, &board, &candidates).await;
            match plan {
                Observation::InSync => board.publish(
                    &t.name,
                    DriftState {
                        drifted: false,
                        changes: 0,
                    },
                ),
                Observation::Drifted(changes) => board.publish(
                    &t.name,
                    DriftState {
                        drifted: true,
                        changes,
                    },
                ),
                Observation::Unknown => {}
            }
            if let Some(drifted) = match &plan {
                Observation::InSync => Some(0.0),
                Observation::Drifted(_) => Some(1.0),
                Observation::Unknown => None,
            } {
                metrics::gauge!("talboot_node_drift", "node" => t.name.clone()).set(drifted);
            }
            match tracker.observe(&t.name, &plan) {
                Some(Transition::Appeared { node, changes }) => events.publish(
                    &node,
                    EventKind::Drift,
                    format!(
                        "drift: the running config differs from the inventory in {changes} \
                         place(s); see `talboot plan`"
                    ),
                ),
                Some(Transition::Cleared { node }) => events.publish(
                    &node,
                    EventKind::Drift,
                    "drift cleared: the node runs what the inventory renders",
                ),
                None => {}
            }
        }
    }
}

/// `targets` grouped by node, in order: [`targets`] names a node once per contract it
/// renders at.
fn by_node(targets: &[NodeTarget]) -> Vec<Vec<&NodeTarget>> {
    let mut out: Vec<Vec<&NodeTarget>> = Vec::new();
    for t in targets {
        match out.iter_mut().find(|g| g[0].name == t.name) {
            Some(g) => g.push(t),
            None => out.push(vec![t]),
        }
    }
    out
}

/// One node's observation: its running config against what was applied to it through
/// serve, else against its rendering at the contract the running config is in (a config's
/// contract stays until it is changed, [`super::contract`]), so a cluster upgraded to a
/// newer Talos does not drift because the inventory's version moved.
async fn observe(conn: &Connector, board: &DriftBoard, candidates: &[&NodeTarget]) -> Observation {
    let t = candidates[0];
    let Ok(client) = conn.client(t).await else {
        return Observation::Unknown;
    };
    let Ok(running) = client.machine_config().await else {
        return Observation::Unknown;
    };
    let rendered = match board.applied(&t.name) {
        Some(applied) => applied,
        None => pick_rendering(&running, candidates).to_owned(),
    };
    match super::diff::diff(&running, &rendered) {
        Ok(d) if d.is_empty() => Observation::InSync,
        Ok(d) => Observation::Drifted(d.len()),
        Err(_) => Observation::Unknown,
    }
}

/// The candidate rendered at the contract of `running` (the first one when the running
/// config's contract cannot be told or none is rendered at it).
fn pick_rendering<'a>(running: &str, candidates: &[&'a NodeTarget]) -> &'a str {
    let first = candidates[0].rendered.as_str();
    let Ok(contract) = super::contract::detect(running) else {
        return first;
    };
    candidates
        .iter()
        .find(|c| super::contract::detect(&c.rendered) == Ok(contract))
        .map_or(first, |c| c.rendered.as_str())
}

/// What the drift watcher compares: every node's rendered config, reached at its inventory
/// address (relayed by the control planes when it cannot be reached directly). A node is
/// named once per contract the renderer renders it at, the inventory's first; the watcher
/// compares the one its running config's contract picks. A node that does not render is
/// left out (serve refuses to start on one anyway).
pub fn targets(
    inv: &crate::inventory::Inventory,
    renderer: &dyn crate::machineconfig::renderer::ConfigRenderer,
    creds: &crate::talos::ClientCreds,
    apid_port: u16,
) -> (Connector, Vec<NodeTarget>) {
    let config = |node: &crate::inventory::Node, bytes: Vec<u8>| super::remote::NodeConfig {
        node: node.name.value.clone(),
        rendered: String::from_utf8_lossy(&bytes).into_owned(),
    };
    let inventory = crate::machineconfig::render::contract(inv).ok();
    let mut at_inventory = Vec::new();
    let mut others: BTreeMap<Contract, Vec<super::remote::NodeConfig>> = BTreeMap::new();
    for node in &inv.nodes {
        let Ok(bytes) = renderer.render(node) else {
            continue;
        };
        at_inventory.push(config(node, bytes));
        for c in Contract::ALL.into_iter().filter(|c| Some(*c) != inventory) {
            if let Some(Ok(bytes)) = renderer.render_at(node, c) {
                others.entry(c).or_default().push(config(node, bytes));
            }
        }
    }
    let mut targets =
        super::remote::apply_targets(inv, apid_port, at_inventory).unwrap_or_default();
    let mut conn = super::remote::connector(creds, &targets);
    for set in others.into_values() {
        targets.extend(super::remote::apply_targets(inv, apid_port, set).unwrap_or_default());
    }
    // One look per node per interval: the next interval is the retry.
    conn.retry = crate::talos::retry::RetryPolicy::NONE;
    (conn, targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn appears_once_clears_once_unknown_keeps_state() {
        let mut t = DriftTracker::default();
        assert_eq!(t.observe("n", &Observation::InSync), None);
        assert_eq!(
            t.observe("n", &Observation::Drifted(2)),
            Some(Transition::Appeared {
                node: "n".into(),
                changes: 2
            })
        );
        assert_eq!(t.observe("n", &Observation::Drifted(3)), None);
        assert_eq!(t.observe("n", &Observation::Unknown), None);
        assert_eq!(t.is_drifted("n"), Some(true));
        assert_eq!(
            t.observe("n", &Observation::InSync),
            Some(Transition::Cleared { node: "n".into() })
        );
        assert_eq!(t.observe("n", &Observation::InSync), None);
    }

    fn target(name: &str, rendered: &str) -> NodeTarget {
        NodeTarget {
            name: name.into(),
            role: super::super::rollout::Role::Worker,
            addr: "127.0.0.1:1".parse().unwrap(),
            node_ip: "127.0.0.1".parse().unwrap(),
            rendered: rendered.into(),
        }
    }

    /// The watcher compares a node against its rendering at the contract of the config it
    /// runs, whichever the inventory's is; one candidate is compared as it is.
    #[test]
    fn the_running_contract_picks_the_rendering() {
        let v113 = "machine:\n  install: {disk: /dev/sda}\n";
        let v114 = "version: v1alpha1\nmachine: {}\n---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\n";
        let (a, b) = (target("n", v114), target("n", v113));
        let other = target("m", v114);
        let targets = [a.clone(), other.clone(), b.clone()];
        let groups = by_node(&targets);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].len(), 2);
        assert_eq!(pick_rendering(v113, &groups[0]), v113);
        assert_eq!(pick_rendering(v114, &groups[0]), v114);
        assert_eq!(pick_rendering("not: [yaml", &groups[0]), v114);
        assert_eq!(pick_rendering(v113, &groups[1]), v114);
    }

    proptest! {
        /// Announcements alternate appeared/cleared, starting with appeared, and the last
        /// one matches the last known state.
        #[test]
        fn transitions_alternate(obs in proptest::collection::vec(0u8..3, 0..40)) {
            let mut t = DriftTracker::default();
            let mut last: Option<bool> = None;
            for o in obs {
                let o = match o { 0 => Observation::InSync, 1 => Observation::Drifted(1), _ => Observation::Unknown };
                match t.observe("n", &o) {
                    Some(Transition::Appeared { .. }) => { prop_assert_ne!(last, Some(true)); last = Some(true); }
                    Some(Transition::Cleared { .. }) => { prop_assert_eq!(last, Some(true)); last = Some(false); }
                    None => {}
                }
            }
            prop_assert_eq!(t.is_drifted("n").unwrap_or(false), last.unwrap_or(false));
        }
    }
}
