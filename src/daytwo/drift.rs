//! Drift: whether each node still runs what the inventory renders. [`DriftTracker`] is the
//! pure part (one observation per node in, the transitions to announce out: a node event when
//! drift appears or clears); [`watch`] is serve's periodic adapter, which reads every node's
//! `MachineConfig` as `talboot plan` does, sets the `talboot_node_drift{node}` gauge (1
//! drifted, 0 in sync), publishes the transitions on the event bus and each node's last
//! known state on the [`DriftBoard`] (part of the read view, [`crate::view::drift`]: what
//! `/api/nodes` and `talboot status` show). `talboot plan` is the detail view.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::events::{EventBus, EventKind};
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
        for t in &targets {
            let mut t = t.clone();
            if let Some(applied) = board.applied(&t.name) {
                t.rendered = applied;
            }
            let t = &t;
            let plan = plan_node_readonly(&conn, t).await;
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

/// What the drift watcher compares: every node's rendered config, reached at its inventory
/// address (relayed by the control planes when it cannot be reached directly). A node that
/// does not render is left out (serve refuses to start on one anyway).
pub fn targets(
    inv: &crate::inventory::Inventory,
    renderer: &dyn crate::machineconfig::renderer::ConfigRenderer,
    creds: &crate::talos::ClientCreds,
    apid_port: u16,
) -> (Connector, Vec<NodeTarget>) {
    let mut configs = Vec::new();
    for node in &inv.nodes {
        let Ok(bytes) = renderer.render(node) else {
            continue;
        };
        configs.push(super::remote::NodeConfig {
            node: node.name.value.clone(),
            rendered: String::from_utf8_lossy(&bytes).into_owned(),
        });
    }
    let targets = super::remote::apply_targets(inv, apid_port, configs).unwrap_or_default();
    let mut conn = super::remote::connector(creds, &targets);
    // One look per node per interval: the next interval is the retry.
    conn.retry = crate::talos::retry::RetryPolicy::NONE;
    (conn, targets)
}

/// Reads the node's config and diffs it; never applies or dry-runs anything.
async fn plan_node_readonly(conn: &Connector, t: &NodeTarget) -> Observation {
    let Ok(client) = conn.client(t).await else {
        return Observation::Unknown;
    };
    let Ok(running) = client.machine_config().await else {
        return Observation::Unknown;
    };
    match super::diff::diff(&running, &t.rendered) {
        Ok(d) if d.is_empty() => Observation::InSync,
        Ok(d) => Observation::Drifted(d.len()),
        Err(_) => Observation::Unknown,
    }
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
