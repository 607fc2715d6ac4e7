//! `talboot apply`'s I/O side: carries out the actions of the rolling engine
//! ([`super::rollout`]) for a config apply. A change is one ApplyConfiguration with the
//! operator's mode; a node's gate is "back (Version answers), running (or, staged, holding)
//! the rendered config, and for a control plane [`super::gate`]: the node running and
//! ready, etcd healthy on every control plane" (the same gate as `upgrade --talos`); a
//! reconcile asks the node which config it has instead of applying twice. The engine is
//! driven by the same persisted driver as the upgrades ([`super::run::Persisted`]), which
//! writes the record to the store (`apply/<plan digest>`) before any action it leads to is
//! carried out, so a restarted run resumes an unfinished rollout of the same plan and never
//! applies it twice to one node. Which nodes need a change is always read from the nodes
//! (what they run against the rendering), never from a finished record, so an apply
//! repairs drift. The same function runs in the CLI (standalone) and in serve (an apply through its
//! admin API, [`super::remote`]); each step is reported as a progress line.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::store::RolloutWriter;
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::{TalosClient, TalosError};

use super::plan::{Connector, NodeTarget};
use super::rollout::{Action, Event, Gate, NodeStatus, Role, Rollout, RolloutRecord, Target};
use super::run::{NodeOps, Outcome, Persisted, Progress, RunError};

/// How an apply runs.
#[derive(Clone, Debug)]
pub struct ApplyOptions {
    pub mode: Mode,
    pub try_timeout: Option<Duration>,
    pub worker_concurrency: usize,
    /// How long a node gate waits for the node to come back with the new config.
    pub gate_timeout: Duration,
    /// How often a gate asks again.
    pub gate_poll: Duration,
    /// Every control plane of the cluster, which the etcd gate reads (all members must be
    /// healthy, not only the targeted ones). Empty means the targets' own control planes,
    /// which is right when the targets are the whole inventory; an apply of some nodes
    /// (serve's admin API takes a subset) must name them all, or every member it does not
    /// target looks like a stranger to the gate.
    pub control_planes: Vec<NodeTarget>,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// Nothing to apply.
    NoChanges,
    /// Every changed node has the config and is healthy.
    Finished { key: String, nodes: Vec<String> },
    /// Stopped at a failure; run `talboot apply` again (same inventory) to resume.
    Stopped {
        key: String,
        node: Option<String>,
        reason: String,
    },
}

/// Errors before or outside the rollout.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The stored record could not be read or resumed, or the rollout ended without an
    /// outcome (its record not persisted, a task lost).
    #[error("{0}")]
    Run(#[from] RunError),
    #[error("node {node}: {reason}")]
    Plan {
        node: String,
        reason: super::plan::PlanError,
    },
}

/// The store key of a plan: every node's rendered config and the mode, so the same
/// inventory and mode resume the same unfinished rollout and any change to them starts a
/// new one.
pub(crate) fn plan_key(targets: &[NodeTarget], opts: &ApplyOptions) -> String {
    let mut h = Sha256::new();
    for t in targets {
        h.update(t.name.as_bytes());
        h.update([0]);
        h.update(t.rendered.as_bytes());
        h.update([0]);
    }
    h.update(super::plan::mode_name(opts.mode).as_bytes());
    format!("apply/{}", crate::hex::lower(&h.finalize()[..8]))
}

/// Runs the apply of `targets`' rendered configs until every node holds its rendering,
/// reporting each step of the rollout to `report` (the CLI prints it; serve streams it to
/// the CLI that asked).
///
/// A stored rollout under this plan's key that did not finish is resumed first (its nodes
/// reconciled, never applied twice). What is left to do is then read from the nodes
/// themselves, not from any record: every node whose config differs from its rendering
/// (for `staged`, whose config for the next boot differs) is changed by a new rollout, so
/// a change made behind talboot's back after a finished apply is repaired by the next one.
pub async fn apply(
    store: &RolloutWriter,
    conn: &Connector,
    targets: &[NodeTarget],
    opts: &ApplyOptions,
    mut report: impl FnMut(&Progress),
) -> Result<ApplyOutcome, ApplyError> {
    let rollout = Persisted::new(store, plan_key(targets, opts));
    let key = rollout.key().to_owned();
    let mut changed_nodes: Vec<String> = Vec::new();
    if let Some(record) = rollout.load()? {
        if finished(&record) {
            tracing::info!(
                %key,
                "the stored apply finished; planning again from what the nodes run"
            );
        } else {
            tracing::info!(%key, "resuming an unfinished apply");
            let engine = rollout.engine(Rollout::resume(record))?;
            match run(&rollout, conn, targets, opts, engine, &mut report).await? {
                (Outcome::Finished, nodes) => changed_nodes.extend(nodes),
                (Outcome::Stopped { node, reason }, _) => {
                    return Ok(ApplyOutcome::Stopped { key, node, reason });
                }
            }
        }
    }
    let pending = pending(conn, targets, opts.mode).await?;
    if pending.is_empty() {
        return Ok(if changed_nodes.is_empty() {
            ApplyOutcome::NoChanges
        } else {
            ApplyOutcome::Finished {
                key,
                nodes: changed_nodes,
            }
        });
    }
    let engine = rollout.engine(Rollout::new(pending, opts.worker_concurrency))?;
    Ok(
        match run(&rollout, conn, targets, opts, engine, &mut report).await? {
            (Outcome::Finished, nodes) => {
                for n in nodes {
                    if !changed_nodes.contains(&n) {
                        changed_nodes.push(n);
                    }
                }
                ApplyOutcome::Finished {
                    key,
                    nodes: changed_nodes,
                }
            }
            (Outcome::Stopped { node, reason }, _) => ApplyOutcome::Stopped { key, node, reason },
        },
    )
}

/// Whether a stored rollout ended with every node changed and healthy (then there is
/// nothing of it to resume; a stopped one has a node that is not `Done`).
fn finished(record: &RolloutRecord) -> bool {
    record.status.values().all(|s| *s == NodeStatus::Done)
}

/// The nodes whose config differs from their rendering, read from the nodes now: the
/// running config, or for `staged` the config on STATE for the next boot (COSI id
/// `persistent`), so a staged change is not staged again on every run.
async fn pending(
    conn: &Connector,
    targets: &[NodeTarget],
    mode: Mode,
) -> Result<Vec<Target>, ApplyError> {
    let plans = super::plan::plan_all(conn, targets).await;
    let mut changed = Vec::new();
    for (p, t) in plans.into_iter().zip(targets) {
        let d = p.diff.map_err(|reason| ApplyError::Plan {
            node: p.name.clone(),
            reason,
        })?;
        if d.is_empty() {
            continue;
        }
        if mode == Mode::Staged && staged_already(conn, t).await? {
            continue;
        }
        changed.push(Target {
            node: p.name,
            role: p.role,
        });
    }
    Ok(changed)
}

/// Whether the node's config for the next boot is already its rendering.
async fn staged_already(conn: &Connector, t: &NodeTarget) -> Result<bool, ApplyError> {
    let plan_err = |e: TalosError| ApplyError::Plan {
        node: t.name.clone(),
        reason: super::plan::PlanError::NextBoot(Arc::new(e)),
    };
    let c = conn.client(t).await.map_err(plan_err)?;
    let persistent = c.machine_config_id("persistent").await.map_err(plan_err)?;
    Ok(matches!(super::diff::diff(&persistent, &t.rendered), Ok(d) if d.is_empty()))
}

/// Drives one rollout to its end, its record persisted before every action. Returns how it
/// ended and the nodes it changed.
async fn run(
    rollout: &Persisted<'_>,
    conn: &Connector,
    targets: &[NodeTarget],
    opts: &ApplyOptions,
    engine: Rollout,
    report: &mut impl FnMut(&Progress),
) -> Result<(Outcome, Vec<String>), ApplyError> {
    let nodes: Vec<String> = engine
        .record()
        .targets
        .iter()
        .map(|t| t.node.clone())
        .collect();
    let ops = Arc::new(ApplyOps {
        conn: conn.clone(),
        targets: targets.to_vec(),
        opts: opts.clone(),
    });
    let outcome = rollout.drive(engine, ops, report).await?;
    Ok((outcome, nodes))
}

/// The apply's half of the rollout: one node's change is one ApplyConfiguration.
struct ApplyOps {
    conn: Connector,
    targets: Vec<NodeTarget>,
    opts: ApplyOptions,
}

#[tonic::async_trait]
impl NodeOps for ApplyOps {
    async fn change(&self, node: &str) -> Event {
        act(
            &self.conn,
            &self.targets,
            &self.opts,
            Action::Change {
                node: node.to_owned(),
            },
        )
        .await
    }

    async fn reconcile(&self, node: &str) -> Event {
        act(
            &self.conn,
            &self.targets,
            &self.opts,
            Action::Reconcile {
                node: node.to_owned(),
            },
        )
        .await
    }

    async fn check(&self, gate: &Gate) -> Event {
        act(
            &self.conn,
            &self.targets,
            &self.opts,
            Action::CheckHealth(gate.clone()),
        )
        .await
    }
}

/// One progress line of an apply, for the operator.
pub(crate) fn progress_line(p: &Progress) -> String {
    match p {
        Progress::Checking(Gate::Cluster) => "checking the cluster before applying".into(),
        Progress::Checking(Gate::Node(n)) => {
            format!("{n}: waiting until it holds the new config and is healthy")
        }
        Progress::Changing(n) => format!("{n}: applying the new config"),
        Progress::Reconciling(n) => {
            format!("{n}: an earlier run started its apply; asking which config it holds")
        }
        Progress::Observed(Event::Healthy(Gate::Cluster)) => "cluster healthy".into(),
        Progress::Observed(Event::Healthy(Gate::Node(n))) => format!("{n}: done"),
        Progress::Observed(Event::Changed { node }) => format!("{node}: applied"),
        Progress::Observed(Event::NotChanged { node }) => {
            format!("{node}: not applied yet; applying now")
        }
        Progress::Observed(Event::ChangeFailed { node, reason }) => {
            format!("{node}: FAILED: {reason}")
        }
        Progress::Observed(Event::Unhealthy { gate, reason }) => match gate {
            Gate::Node(n) => format!("{n}: FAILED: {reason}"),
            Gate::Cluster => format!("cluster not healthy: {reason}"),
        },
    }
}

fn target<'a>(targets: &'a [NodeTarget], node: &str) -> Option<&'a NodeTarget> {
    targets.iter().find(|t| t.name == node)
}

async fn act(conn: &Connector, targets: &[NodeTarget], opts: &ApplyOptions, a: Action) -> Event {
    match a {
        Action::CheckHealth(Gate::Cluster) => match cluster_healthy(conn, targets, opts).await {
            Ok(()) => Event::Healthy(Gate::Cluster),
            Err(e) => Event::Unhealthy {
                gate: Gate::Cluster,
                reason: e.to_string(),
            },
        },
        Action::CheckHealth(Gate::Node(node)) => {
            let gate = Gate::Node(node.clone());
            match node_gate(conn, targets, opts, &node).await {
                Ok(()) => Event::Healthy(gate),
                Err(e) => Event::Unhealthy {
                    gate,
                    reason: e.to_string(),
                },
            }
        }
        Action::Change { node } => {
            let Some(t) = target(targets, &node) else {
                return Event::ChangeFailed {
                    reason: "no longer in the inventory".into(),
                    node,
                };
            };
            let result = match conn.client(t).await {
                Ok(c) => c
                    .apply_configuration_with(
                        t.rendered.as_bytes(),
                        opts.mode,
                        false,
                        opts.try_timeout,
                    )
                    .await
                    .map(|out| {
                        tracing::info!(node = %node, details = %out.mode_details, "applied");
                    }),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => Event::Changed { node },
                Err(e) => Event::ChangeFailed {
                    reason: format!("ApplyConfiguration failed: {e}"),
                    node,
                },
            }
        }
        Action::Reconcile { node } => {
            let Some(t) = target(targets, &node) else {
                return Event::ChangeFailed {
                    reason: "no longer in the inventory".into(),
                    node,
                };
            };
            match has_config(conn, t, opts.mode).await {
                Ok(true) => Event::Changed { node },
                Ok(false) => Event::NotChanged { node },
                Err(e) => Event::ChangeFailed {
                    reason: format!("cannot tell whether the earlier apply took effect: {e}"),
                    node,
                },
            }
        }
        Action::Finished | Action::Stopped { .. } => unreachable!("handled by the caller"),
    }
}

/// Whether the node holds the rendered config: running it, or for STAGED on STATE for the
/// next boot (COSI id `persistent`).
async fn has_config(conn: &Connector, t: &NodeTarget, mode: Mode) -> Result<bool, TalosError> {
    let c = conn.client(t).await?;
    let id = if mode == Mode::Staged {
        "persistent"
    } else {
        "v1alpha1"
    };
    Ok(c.machine_config_id(id).await? == t.rendered)
}

/// Why an apply's health gate (or its pre-flight check) did not pass. The text becomes the
/// node's failure reason in the rollout record.
#[derive(Debug, thiserror::Error)]
enum GateFailure {
    #[error("{0}")]
    Etcd(#[from] super::gate::GateError),
    #[error("node {node} does not answer: {source}")]
    NoAnswer { node: String, source: TalosError },
    #[error("no longer in the inventory")]
    NotInInventory,
    /// Not healthy in time; `last` is what the gate saw last.
    #[error("health gate: {last}")]
    Timeout { last: String },
}

/// [`super::gate::check`] over every control plane of the cluster
/// ([`ApplyOptions::control_planes`], else those of `targets`), `changed` first.
async fn etcd_gate(
    conn: &Connector,
    targets: &[NodeTarget],
    opts: &ApplyOptions,
    changed: Option<(&str, &TalosClient)>,
) -> Result<(), GateFailure> {
    let all = if opts.control_planes.is_empty() {
        targets
    } else {
        &opts.control_planes[..]
    };
    let mut cps = Vec::new();
    for t in all.iter().filter(|t| t.role == Role::ControlPlane) {
        cps.push((t.name.clone(), conn.client(t).await));
    }
    Ok(super::gate::check(changed, &cps).await?)
}

/// Before anything changes: every node answers and etcd is healthy ([`super::gate`]).
async fn cluster_healthy(
    conn: &Connector,
    targets: &[NodeTarget],
    opts: &ApplyOptions,
) -> Result<(), GateFailure> {
    for t in targets {
        conn.client(t)
            .await
            .map_err(|source| GateFailure::NoAnswer {
                node: t.name.clone(),
                source,
            })?;
    }
    if targets.iter().any(|t| t.role == Role::ControlPlane) {
        etcd_gate(conn, targets, opts, None).await?;
    }
    Ok(())
}

/// After a node's change: back, holding the config, and for a control plane the etcd gate
/// ([`super::gate`]: it runs and is ready, etcd healthy everywhere; a member listed is not
/// enough, after a reboot apid answers before etcd serves). Asks again every `gate_poll` (a
/// REBOOT apply takes the node down first) up to `gate_timeout`.
async fn node_gate(
    conn: &Connector,
    targets: &[NodeTarget],
    opts: &ApplyOptions,
    node: &str,
) -> Result<(), GateFailure> {
    let Some(t) = target(targets, node) else {
        return Err(GateFailure::NotInInventory);
    };
    let deadline = tokio::time::Instant::now() + opts.gate_timeout;
    let mut last;
    loop {
        last = match conn.client(t).await {
            Err(e) => format!("not back: {e}"),
            Ok(c) => match has_config(conn, t, opts.mode).await {
                Ok(true) if t.role == Role::ControlPlane => {
                    match etcd_gate(conn, targets, opts, Some((node, &c))).await {
                        Ok(()) => return Ok(()),
                        Err(e) => e.to_string(),
                    }
                }
                Ok(true) => return Ok(()),
                Ok(false) => "does not run the applied config".into(),
                Err(e) => format!("cannot read its config: {e}"),
            },
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(GateFailure::Timeout { last });
        }
        tokio::time::sleep(opts.gate_poll).await;
    }
}
