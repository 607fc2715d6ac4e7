//! The rolling engine every rack-wide change goes through (`talboot apply`, `talboot upgrade
//! --talos`, `--kubernetes`): which node changes next, when a health gate must pass, where to
//! stop, and how a restarted run resumes. Pure: events in, actions out, no I/O and no clock,
//! in the shape of `tftp::Transfer`.
//!
//! The rules, from how talosctl and the peers roll a cluster (siderolabs/talos v1.13.9
//! `cmd/talosctl/cmd/talos/upgrade.go` upgrades one node per call; `pkg/cluster/kubernetes/
//! upgrade.go` walks control planes one by one before the kubelets):
//! - a cluster health check passes before the first change (a rollout never starts on a
//!   cluster that is already degraded);
//! - control planes change one at a time, each followed by its health gate (etcd members and
//!   the API), so at most one control plane is ever unavailable;
//! - workers change only after every control plane is done, at most `worker_concurrency` at
//!   once, each followed by its own gate;
//! - the first failure stops the rollout: nothing new starts, what is in flight finishes, and
//!   the stop names the node and the reason;
//! - the record is written ahead: a node is marked `Changing` before its change is carried
//!   out, so a run that stops in between finds `Changing` and asks the operation whether the
//!   change took effect (`Reconcile`) instead of applying it a second time.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A node's part in the cluster, which decides its place in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    ControlPlane,
    Worker,
}

/// One node the rollout changes, in the order the operator's inventory lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub node: String,
    pub role: Role,
}

/// Where one node is in the rollout. This is what is persisted and resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum NodeStatus {
    /// Not started.
    Pending,
    /// The change was handed to the operation; whether it took effect is not known yet.
    Changing,
    /// The change took effect; the health gate after it has not passed yet.
    Verifying,
    /// Changed and healthy.
    Done,
    /// The change or its gate failed (the rollout stopped here).
    Failed { reason: String },
}

/// A health check the caller runs and reports back with [`Event::Healthy`] or
/// [`Event::Unhealthy`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Gate {
    /// The whole cluster, before anything changes.
    Cluster,
    /// One node after its change: back, running what was asked, and (for a control plane)
    /// etcd and the API healthy.
    Node(String),
}

/// What the caller does next. Persist [`Rollout::record`] before carrying out the actions of
/// a call: the record is the write-ahead log that makes a restart safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run the health check.
    CheckHealth(Gate),
    /// Change this node.
    Change { node: String },
    /// An earlier run started this node's change and stopped before it was known to take
    /// effect: check (without changing anything) whether it did, and report
    /// [`Event::Changed`] or [`Event::NotChanged`].
    Reconcile { node: String },
    /// Every node is changed and healthy.
    Finished,
    /// The rollout stopped at a failure and nothing is in flight any more. `node` is `None`
    /// when the cluster pre-flight check failed.
    Stopped {
        node: Option<String>,
        reason: String,
    },
}

/// What the caller observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Healthy(Gate),
    Unhealthy {
        gate: Gate,
        reason: String,
    },
    /// The node's change took effect (after `Change`, or found by `Reconcile`).
    Changed {
        node: String,
    },
    /// `Reconcile` found the change did not take effect; it is started now.
    NotChanged {
        node: String,
    },
    /// The change was refused or did not take effect.
    ChangeFailed {
        node: String,
        reason: String,
    },
}

/// Invalid rollout input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    #[error("node `{0}` is listed twice in the rollout")]
    Duplicate(String),
    #[error("worker concurrency must be at least 1")]
    ZeroConcurrency,
    #[error("the stored rollout record does not match this rollout's nodes: {0}")]
    Mismatch(String),
}

/// The persisted form of a rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub targets: Vec<Target>,
    pub worker_concurrency: usize,
    pub status: BTreeMap<String, NodeStatus>,
}

/// The engine. One per rollout; the caller owns it and is the only one feeding it events.
#[derive(Debug, Clone)]
pub struct Rollout {
    record: RolloutRecord,
    /// Gates and node operations asked for and not yet answered. An event for anything not in
    /// here is stale or duplicated and is ignored.
    outstanding: BTreeSet<Outstanding>,
    preflight: Preflight,
    /// The first failure; once set nothing new starts.
    stop: Option<(Option<String>, String)>,
    /// `Finished` or `Stopped` has been returned; the engine says nothing more.
    ended: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preflight {
    NotAsked,
    Asked,
    Passed,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Outstanding {
    Gate(Gate),
    Change(String),
    Reconcile(String),
}

impl Rollout {
    /// A new rollout of `targets` (every node `Pending`).
    pub fn new(targets: Vec<Target>, worker_concurrency: usize) -> Result<Self, RolloutError> {
        let status = targets
            .iter()
            .map(|t| (t.node.clone(), NodeStatus::Pending))
            .collect();
        Self::resume(RolloutRecord {
            targets,
            worker_concurrency,
            status,
        })
    }

    /// Continue a stored rollout. Nodes that were `Changing` or `Failed` are reconciled before
    /// anything else happens to them; `Verifying` nodes are checked again; the cluster
    /// pre-flight runs again (the cluster may have changed while nobody watched).
    pub fn resume(record: RolloutRecord) -> Result<Self, RolloutError> {
        if record.worker_concurrency == 0 {
            return Err(RolloutError::ZeroConcurrency);
        }
        let mut seen = BTreeSet::new();
        for t in &record.targets {
            if !seen.insert(t.node.as_str()) {
                return Err(RolloutError::Duplicate(t.node.clone()));
            }
            if !record.status.contains_key(&t.node) {
                return Err(RolloutError::Mismatch(format!(
                    "no status for `{}`",
                    t.node
                )));
            }
        }
        if let Some(extra) = record.status.keys().find(|n| !seen.contains(n.as_str())) {
            return Err(RolloutError::Mismatch(format!(
                "status for `{extra}`, which is not a target"
            )));
        }
        Ok(Self {
            record,
            outstanding: BTreeSet::new(),
            preflight: Preflight::NotAsked,
            stop: None,
            ended: false,
        })
    }

    /// The record to persist.
    pub fn record(&self) -> &RolloutRecord {
        &self.record
    }

    /// The status of `node`.
    pub fn status(&self, node: &str) -> Option<&NodeStatus> {
        self.record.status.get(node)
    }

    /// The first actions of this run.
    pub fn start(&mut self) -> Vec<Action> {
        self.advance()
    }

    /// Feed one observation; returns what to do next. Events that answer nothing outstanding
    /// (late, duplicated, or about another node) change nothing.
    pub fn on(&mut self, event: Event) -> Vec<Action> {
        if self.ended {
            return Vec::new();
        }
        match event {
            Event::Healthy(gate) => {
                if !self.outstanding.remove(&Outstanding::Gate(gate.clone())) {
                    return Vec::new();
                }
                match gate {
                    Gate::Cluster => self.preflight = Preflight::Passed,
                    Gate::Node(node) => self.set(&node, NodeStatus::Done),
                }
            }
            Event::Unhealthy { gate, reason } => {
                if !self.outstanding.remove(&Outstanding::Gate(gate.clone())) {
                    return Vec::new();
                }
                match gate {
                    Gate::Cluster => self.fail(None, reason),
                    Gate::Node(node) => {
                        self.set(
                            &node,
                            NodeStatus::Failed {
                                reason: reason.clone(),
                            },
                        );
                        self.fail(Some(node), reason);
                    }
                }
            }
            Event::Changed { node } => {
                if !self.take_node_op(&node) {
                    return Vec::new();
                }
                self.set(&node, NodeStatus::Verifying);
                self.outstanding
                    .insert(Outstanding::Gate(Gate::Node(node.clone())));
                let mut out = vec![Action::CheckHealth(Gate::Node(node))];
                out.extend(self.advance());
                return out;
            }
            Event::NotChanged { node } => {
                // Only an answer to a Reconcile: a duplicate must not start a second change.
                if !self
                    .outstanding
                    .remove(&Outstanding::Reconcile(node.clone()))
                {
                    return Vec::new();
                }
                // Still this node's turn: start the change now, unless the rollout stopped
                // meanwhile (the node stays Changing and the next run reconciles it again).
                if self.stop.is_none() {
                    self.outstanding.insert(Outstanding::Change(node.clone()));
                    return vec![Action::Change { node }];
                }
            }
            Event::ChangeFailed { node, reason } => {
                if !self.take_node_op(&node) {
                    return Vec::new();
                }
                self.set(
                    &node,
                    NodeStatus::Failed {
                        reason: reason.clone(),
                    },
                );
                self.fail(Some(node), reason);
            }
        }
        self.advance()
    }

    /// Removes the outstanding Change or Reconcile of `node`; false when there was none.
    fn take_node_op(&mut self, node: &str) -> bool {
        self.outstanding
            .remove(&Outstanding::Change(node.to_string()))
            || self
                .outstanding
                .remove(&Outstanding::Reconcile(node.to_string()))
    }

    fn set(&mut self, node: &str, status: NodeStatus) {
        if let Some(s) = self.record.status.get_mut(node) {
            *s = status;
        }
    }

    fn fail(&mut self, node: Option<String>, reason: String) {
        if self.stop.is_none() {
            self.stop = Some((node, reason));
        }
    }

    /// Number of nodes of `role` whose turn has begun and is not over.
    fn in_turn(&self, role: Role) -> usize {
        self.record
            .targets
            .iter()
            .filter(|t| t.role == role && self.is_in_turn(&t.node))
            .count()
    }

    fn is_in_turn(&self, node: &str) -> bool {
        self.outstanding
            .contains(&Outstanding::Change(node.to_string()))
            || self
                .outstanding
                .contains(&Outstanding::Reconcile(node.to_string()))
            || self
                .outstanding
                .contains(&Outstanding::Gate(Gate::Node(node.to_string())))
    }

    fn advance(&mut self) -> Vec<Action> {
        if self.ended {
            return Vec::new();
        }
        let mut out = Vec::new();
        if let Some((node, reason)) = &self.stop {
            if self.outstanding.is_empty() {
                self.ended = true;
                out.push(Action::Stopped {
                    node: node.clone(),
                    reason: reason.clone(),
                });
            }
            return out;
        }
        match self.preflight {
            Preflight::NotAsked => {
                self.preflight = Preflight::Asked;
                self.outstanding.insert(Outstanding::Gate(Gate::Cluster));
                return vec![Action::CheckHealth(Gate::Cluster)];
            }
            Preflight::Asked => return out,
            Preflight::Passed => {}
        }

        let cp_left = self.record.targets.iter().any(|t| {
            t.role == Role::ControlPlane && self.status(&t.node) != Some(&NodeStatus::Done)
        });
        let (role, limit) = if cp_left {
            (Role::ControlPlane, 1)
        } else {
            (Role::Worker, self.record.worker_concurrency)
        };
        let mut free = limit.saturating_sub(self.in_turn(role));
        let candidates: Vec<String> = self
            .record
            .targets
            .iter()
            .filter(|t| t.role == role)
            .map(|t| t.node.clone())
            .collect();
        for node in candidates {
            if free == 0 {
                break;
            }
            if self.is_in_turn(&node) {
                continue;
            }
            let action = match self.status(&node) {
                Some(NodeStatus::Done) | None => continue,
                Some(NodeStatus::Pending) => {
                    self.set(&node, NodeStatus::Changing);
                    self.outstanding.insert(Outstanding::Change(node.clone()));
                    Action::Change { node }
                }
                Some(NodeStatus::Changing) | Some(NodeStatus::Failed { .. }) => {
                    self.set(&node, NodeStatus::Changing);
                    self.outstanding
                        .insert(Outstanding::Reconcile(node.clone()));
                    Action::Reconcile { node }
                }
                Some(NodeStatus::Verifying) => {
                    self.outstanding
                        .insert(Outstanding::Gate(Gate::Node(node.clone())));
                    Action::CheckHealth(Gate::Node(node))
                }
            };
            out.push(action);
            free -= 1;
        }
        if self.outstanding.is_empty()
            && self.record.status.values().all(|s| *s == NodeStatus::Done)
        {
            self.ended = true;
            out.push(Action::Finished);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn targets(cps: usize, workers: usize) -> Vec<Target> {
        let mut t: Vec<Target> = (0..cps)
            .map(|i| Target {
                node: format!("cp{i}"),
                role: Role::ControlPlane,
            })
            .collect();
        t.extend((0..workers).map(|i| Target {
            node: format!("w{i}"),
            role: Role::Worker,
        }));
        t
    }

    fn change(node: &str) -> Action {
        Action::Change { node: node.into() }
    }

    fn gate(node: &str) -> Gate {
        Gate::Node(node.into())
    }

    #[test]
    fn preflight_first_then_control_planes_one_by_one_then_workers_in_parallel() {
        let mut r = Rollout::new(targets(2, 3), 2).unwrap();
        assert_eq!(r.start(), vec![Action::CheckHealth(Gate::Cluster)]);
        assert_eq!(r.on(Event::Healthy(Gate::Cluster)), vec![change("cp0")]);
        assert_eq!(
            r.on(Event::Changed { node: "cp0".into() }),
            vec![Action::CheckHealth(gate("cp0"))],
            "the next control plane waits for this one's gate"
        );
        assert_eq!(r.on(Event::Healthy(gate("cp0"))), vec![change("cp1")]);
        r.on(Event::Changed { node: "cp1".into() });
        assert_eq!(
            r.on(Event::Healthy(gate("cp1"))),
            vec![change("w0"), change("w1")]
        );
        // A worker's change finishing frees no slot until its gate passes.
        assert_eq!(
            r.on(Event::Changed { node: "w0".into() }),
            vec![Action::CheckHealth(gate("w0"))]
        );
        assert_eq!(r.on(Event::Healthy(gate("w0"))), vec![change("w2")]);
        for n in ["w1", "w2"] {
            r.on(Event::Changed { node: n.into() });
        }
        assert_eq!(r.on(Event::Healthy(gate("w1"))), vec![]);
        assert_eq!(r.on(Event::Healthy(gate("w2"))), vec![Action::Finished]);
        assert_eq!(r.on(Event::Healthy(gate("w2"))), vec![], "ended");
    }

    #[test]
    fn a_failure_stops_new_changes_and_waits_for_in_flight_ones() {
        let mut r = Rollout::new(targets(0, 3), 2).unwrap();
        r.start();
        assert_eq!(
            r.on(Event::Healthy(Gate::Cluster)),
            vec![change("w0"), change("w1")]
        );
        assert_eq!(
            r.on(Event::ChangeFailed {
                node: "w0".into(),
                reason: "apply refused".into()
            }),
            vec![],
            "w1 is still in flight"
        );
        r.on(Event::Changed { node: "w1".into() });
        assert_eq!(
            r.on(Event::Healthy(gate("w1"))),
            vec![Action::Stopped {
                node: Some("w0".into()),
                reason: "apply refused".into()
            }]
        );
        assert_eq!(r.status("w2"), Some(&NodeStatus::Pending));
        assert_eq!(r.status("w1"), Some(&NodeStatus::Done));
    }

    #[test]
    fn a_degraded_cluster_is_never_touched() {
        let mut r = Rollout::new(targets(3, 1), 1).unwrap();
        r.start();
        assert_eq!(
            r.on(Event::Unhealthy {
                gate: Gate::Cluster,
                reason: "etcd member cp2 unhealthy".into()
            }),
            vec![Action::Stopped {
                node: None,
                reason: "etcd member cp2 unhealthy".into()
            }]
        );
        assert!(
            r.record()
                .status
                .values()
                .all(|s| *s == NodeStatus::Pending)
        );
    }

    #[test]
    fn a_resumed_run_reconciles_instead_of_changing_again() {
        let mut r = Rollout::new(targets(2, 0), 1).unwrap();
        r.start();
        r.on(Event::Healthy(Gate::Cluster));
        // The process dies here: cp0 is recorded Changing.
        let stored = serde_json::to_vec(r.record()).unwrap();
        let mut r = Rollout::resume(serde_json::from_slice(&stored).unwrap()).unwrap();
        assert_eq!(r.start(), vec![Action::CheckHealth(Gate::Cluster)]);
        assert_eq!(
            r.on(Event::Healthy(Gate::Cluster)),
            vec![Action::Reconcile { node: "cp0".into() }]
        );
        assert_eq!(
            r.on(Event::Changed { node: "cp0".into() }),
            vec![Action::CheckHealth(gate("cp0"))]
        );
    }

    #[test]
    fn reconcile_that_finds_nothing_done_starts_the_change() {
        let mut rec = Rollout::new(targets(1, 0), 1).unwrap().record().clone();
        rec.status.insert("cp0".into(), NodeStatus::Changing);
        let mut r = Rollout::resume(rec).unwrap();
        r.start();
        r.on(Event::Healthy(Gate::Cluster));
        assert_eq!(
            r.on(Event::NotChanged { node: "cp0".into() }),
            vec![change("cp0")]
        );
    }

    #[test]
    fn stale_and_foreign_events_change_nothing() {
        let mut r = Rollout::new(targets(1, 1), 1).unwrap();
        r.start();
        assert_eq!(r.on(Event::Changed { node: "cp0".into() }), vec![]);
        assert_eq!(r.on(Event::Healthy(gate("w0"))), vec![]);
        r.on(Event::Healthy(Gate::Cluster));
        assert_eq!(r.on(Event::Healthy(Gate::Cluster)), vec![], "duplicate");
        assert_eq!(r.on(Event::Changed { node: "w0".into() }), vec![]);
        assert_eq!(r.status("cp0"), Some(&NodeStatus::Changing));
        assert_eq!(r.status("w0"), Some(&NodeStatus::Pending));
    }

    #[test]
    fn bad_input_is_refused() {
        let mut t = targets(1, 1);
        t.push(t[0].clone());
        assert_eq!(
            Rollout::new(t, 1).unwrap_err(),
            RolloutError::Duplicate("cp0".into())
        );
        assert_eq!(
            Rollout::new(targets(1, 1), 0).unwrap_err(),
            RolloutError::ZeroConcurrency
        );
        let mut rec = Rollout::new(targets(1, 1), 1).unwrap().record().clone();
        rec.status.remove("w0");
        assert!(matches!(
            Rollout::resume(rec),
            Err(RolloutError::Mismatch(_))
        ));
    }

    /// A simulated rack the property test drives the engine against: each node remembers
    /// whether its change took effect, so a second change of one node is visible.
    #[derive(Debug, Clone, Copy)]
    enum Fate {
        Ok,
        /// The change is refused before it takes effect.
        Refused,
        /// The change takes effect but the node's gate fails.
        Sick,
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Answer the pending request with this index (modulo the number pending).
        Answer(usize),
        /// Deliver a duplicate of an already-delivered event.
        Duplicate(usize),
        /// The process dies: persist, rebuild from the record, start again.
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => any::<usize>().prop_map(Step::Answer),
            1 => any::<usize>().prop_map(Step::Duplicate),
            1 => Just(Step::Restart),
        ]
    }

    fn fate() -> impl Strategy<Value = Fate> {
        prop_oneof![8 => Just(Fate::Ok), 1 => Just(Fate::Refused), 1 => Just(Fate::Sick)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn rollout_invariants_hold_under_any_interleaving(
            cps in 0usize..4,
            workers in 0usize..6,
            conc in 1usize..4,
            fates in proptest::collection::vec(fate(), 10),
            cluster_ok in proptest::bool::weighted(0.9),
            steps in proptest::collection::vec(step(), 0..120),
        ) {
            let t = targets(cps, workers);
            let role: BTreeMap<String, Role> =
                t.iter().map(|x| (x.node.clone(), x.role)).collect();
            let fate_of = |n: &str| {
                let i = t.iter().position(|x| x.node == n).unwrap();
                fates[i]
            };
            let mut r = Rollout::new(t.clone(), conc).unwrap();
            // The world: whether each node's change took effect, and how often it was changed.
            let mut applied: BTreeMap<String, bool> = BTreeMap::new();
            let mut changes: BTreeMap<String, usize> = BTreeMap::new();
            let mut unavailable: BTreeSet<String> = BTreeSet::new();
            let mut pending: Vec<Action> = r.start();
            let mut delivered: Vec<Event> = Vec::new();
            let mut ended: Option<Action> = None;
            let mut had_restart = false;

            let mut steps = steps.into_iter();
            // After the random steps, keep answering in order until the engine ends, so every
            // run reaches an end (bounded: each node needs a handful of answers).
            let mut drain = 0usize;
            loop {
                let s = match steps.next() {
                    Some(s) => s,
                    None => {
                        drain += 1;
                        prop_assert!(drain < 1000, "the rollout never ended");
                        Step::Answer(0)
                    }
                };
                // Collect terminal actions from what the engine said.
                let mut i = 0;
                while i < pending.len() {
                    if matches!(pending[i], Action::Finished | Action::Stopped { .. }) {
                        prop_assert!(ended.is_none(), "ended twice");
                        ended = Some(pending.remove(i));
                    } else {
                        i += 1;
                    }
                }
                if ended.is_some() && pending.is_empty() {
                    break;
                }
                if ended.is_some() {
                    prop_assert!(false, "actions left after the end: {pending:?}");
                }
                let event = match s {
                    Step::Restart => {
                        had_restart = true;
                        let stored = serde_json::to_vec(r.record()).unwrap();
                        r = Rollout::resume(serde_json::from_slice(&stored).unwrap()).unwrap();
                        // What was in flight is lost with the process (answers to it never
                        // reach the new one); a change already carried out stays carried out.
                        pending = r.start();
                        delivered.clear();
                        continue;
                    }
                    Step::Duplicate(i) => {
                        if delivered.is_empty() { continue; }
                        delivered[i % delivered.len()].clone()
                    }
                    Step::Answer(i) => {
                        if pending.is_empty() {
                            prop_assert!(ended.is_some(), "engine stalled with nothing pending");
                            continue;
                        }
                        let a = pending.remove(i % pending.len());
                        match a {
                            Action::CheckHealth(Gate::Cluster) => {
                                if cluster_ok { Event::Healthy(Gate::Cluster) } else {
                                    Event::Unhealthy { gate: Gate::Cluster, reason: "degraded".into() }
                                }
                            }
                            Action::CheckHealth(Gate::Node(n)) => {
                                if matches!(fate_of(&n), Fate::Sick) {
                                    Event::Unhealthy { gate: Gate::Node(n), reason: "sick".into() }
                                } else {
                                    unavailable.remove(&n);
                                    Event::Healthy(Gate::Node(n))
                                }
                            }
                            Action::Change { node } => {
                                prop_assert!(!applied.get(&node).copied().unwrap_or(false),
                                    "{node} changed a second time");
                                *changes.entry(node.clone()).or_default() += 1;
                                if role[&node] == Role::ControlPlane {
                                    unavailable.insert(node.clone());
                                    let cps_down = unavailable.iter()
                                        .filter(|n| role[*n] == Role::ControlPlane).count();
                                    prop_assert!(cps_down <= 1, "two control planes down");
                                } else {
                                    prop_assert!(t.iter().filter(|x| x.role == Role::ControlPlane)
                                        .all(|x| r.status(&x.node) == Some(&NodeStatus::Done)),
                                        "a worker changed before every control plane was done");
                                }
                                match fate_of(&node) {
                                    Fate::Refused => {
                                        unavailable.remove(&node);
                                        Event::ChangeFailed { node, reason: "refused".into() }
                                    }
                                    _ => {
                                        applied.insert(node.clone(), true);
                                        Event::Changed { node }
                                    }
                                }
                            }
                            Action::Reconcile { node } => {
                                if applied.get(&node).copied().unwrap_or(false) {
                                    Event::Changed { node }
                                } else {
                                    Event::NotChanged { node }
                                }
                            }
                            Action::Finished | Action::Stopped { .. } => unreachable!(),
                        }
                    }
                };
                delivered.push(event.clone());
                let workers_in_turn = t.iter()
                    .filter(|x| x.role == Role::Worker && r.is_in_turn(&x.node)).count();
                prop_assert!(workers_in_turn <= conc);
                let out = r.on(event);
                pending.extend(out);
                let cps_in_turn = t.iter()
                    .filter(|x| x.role == Role::ControlPlane && r.is_in_turn(&x.node)).count();
                prop_assert!(cps_in_turn <= 1, "two control planes in their turn");
            }
            match ended.unwrap() {
                Action::Finished => {
                    prop_assert!(cluster_ok);
                    prop_assert!(r.record().status.values().all(|s| *s == NodeStatus::Done));
                    let all_fine = t.iter().all(|x| matches!(fate_of(&x.node), Fate::Ok));
                    prop_assert!(all_fine, "finished although a node was meant to fail");
                }
                Action::Stopped { node, reason } => {
                    prop_assert!(!reason.is_empty());
                    if let Some(n) = node {
                        let failed = matches!(r.status(&n), Some(NodeStatus::Failed { .. }));
                        prop_assert!(failed, "stopped at {n}, which is not failed");
                    } else {
                        prop_assert!(!cluster_ok);
                    }
                }
                _ => unreachable!(),
            }
            // A refused change may be retried by a later run; one that took effect never is
            // (asserted at each Change above). Without restarts, nothing is retried at all.
            if !had_restart {
                for (n, c) in changes {
                    prop_assert!(c <= 1, "{n} changed {c} times without a restart");
                }
            }
        }
    }
}
