//! Rollouts through a running `serve`: while serve runs it holds the store (redb locks the
//! file), so `talboot apply` and `talboot upgrade` hand their rollout to serve's admin API
//! instead of racing it. This module owns the wire form of such a request
//! ([`RolloutRequest`], one [`RolloutKind`] per operation), the registry of serve's rollouts
//! ([`Rollouts`]: at most one runs at a time, so two operators never roll one rack at once),
//! each run's progress log (what the CLI pages through), and the serve-side [`Job`] of each
//! kind, which runs the same code as the standalone CLI (`daytwo::apply`, the Talos upgrade
//! driver, `daytwo::upgrade_k8s::run`) against serve's store, with serve's inventory and
//! admin credentials.
//!
//! A new kind is one [`RolloutKind`] variant, its [`Job`], and one arm in
//! [`RolloutKind::prepare`].
//!
//! What the CLI may ask is checked against serve's inventory before anything runs: an apply
//! names inventory nodes only, each at most once, and is sent to the address serve's
//! inventory gives the node (never one the request names), so the admin API cannot be used
//! to push a config anywhere else.

pub mod client;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::inventory::{Inventory, MachineType, Version};
use crate::store::Store;
use crate::talos::ClientCreds;
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::view::StateView;

use super::apply::{ApplyOptions, ApplyOutcome};
use super::plan::{Connector, NodeTarget};
use super::rollout::Role;
use super::run::Outcome;
use super::upgrade::{TalosOps, TalosUpgrade, rollout_key};

/// What the CLI asks serve to roll out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RolloutRequest {
    /// Workers changed at once (control planes always go one at a time).
    pub worker_concurrency: usize,
    /// The operation.
    pub kind: RolloutKind,
}

/// The operations serve rolls out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum RolloutKind {
    /// `talboot apply`: the CLI's rendering of each node (from the inventory file as the
    /// operator changed it), applied with `mode`.
    Apply(ApplyRequest),
    /// `talboot upgrade --talos`: serve's inventory nodes upgraded to `version`.
    UpgradeTalos(TalosUpgradeRequest),
    /// `talboot upgrade --kubernetes`: serve's inventory cluster upgraded to Kubernetes
    /// `version`, talosctl's steps one at a time.
    UpgradeKubernetes(K8sUpgradeRequest),
}

/// One node's rendered config, as `talboot gen` renders it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeConfig {
    pub node: String,
    pub rendered: String,
}

impl std::fmt::Debug for NodeConfig {
    // A config carries the cluster's keys: never in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("node", &self.node)
            .field("rendered", &format_args!("<{} bytes>", self.rendered.len()))
            .finish()
    }
}

/// `talboot apply`'s part of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ApplyRequest {
    /// `--mode`: `auto`, `no-reboot`, `reboot`, `staged`, `try`.
    pub mode: String,
    pub try_timeout_secs: Option<u64>,
    pub gate_timeout_secs: u64,
    pub gate_poll_ms: u64,
    pub configs: Vec<NodeConfig>,
}

/// `talboot upgrade --talos`'s part of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TalosUpgradeRequest {
    pub version: String,
    pub stage: bool,
    pub node_timeout_secs: u64,
    pub gate_poll_ms: u64,
}

/// `talboot upgrade --kubernetes`'s part of a request (the worker concurrency is not used:
/// every step goes one at a time, in talosctl's order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct K8sUpgradeRequest {
    pub version: String,
    /// Longest wait for a static pod after its patch.
    pub pod_wait_secs: u64,
    /// Longest wait for a Node's new kubelet version.
    pub node_wait_secs: u64,
    pub gate_poll_ms: u64,
    /// Keep what the bootstrap manifest inventory says is gone (`--no-prune`).
    #[serde(default)]
    pub no_prune: bool,
    /// Do not wait for the bootstrap manifests' workloads (`--skip-manifest-wait`).
    #[serde(default)]
    pub skip_manifest_wait: bool,
}

/// How a rollout through serve ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RemoteOutcome {
    /// Nothing to change.
    NoChanges,
    /// Every node is changed and healthy; `key` is the rollout's record in serve's store.
    Finished { key: String, nodes: Vec<String> },
    /// Stopped at the first failure; the same request resumes it.
    Stopped {
        key: String,
        node: Option<String>,
        reason: String,
    },
    /// It could not run at all (the store, a node that could not be planned).
    Failed { reason: String },
}

/// The answer to a started rollout: where to page its progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Started {
    pub id: u64,
    pub what: String,
}

/// One page of a run's progress: the lines after the asked-for index, the index to ask for
/// next, and the end once every line before it was delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProgressPage {
    pub lines: Vec<String>,
    pub next: usize,
    pub end: Option<RemoteOutcome>,
}

/// Why serve did not start a rollout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StartError {
    /// Another rollout runs (one at a time per rack).
    #[error(
        "another rollout is running on this rack ({0}); wait until it ends (its progress is \
         in the terminal that started it, and in serve's log)"
    )]
    Busy(String),
    /// The request does not fit serve's inventory or is malformed.
    #[error("{0}")]
    Invalid(String),
}

/// A run's progress so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunLog {
    pub lines: Vec<String>,
    pub end: Option<RemoteOutcome>,
}

/// One rollout serve runs.
#[derive(Debug)]
pub struct Run {
    pub id: u64,
    pub what: String,
    log: tokio::sync::watch::Sender<RunLog>,
}

impl Run {
    /// Adds a progress line.
    pub fn say(&self, line: String) {
        tracing::info!(rollout = self.id, "{line}");
        self.log.send_modify(|l| l.lines.push(line));
    }

    /// Records the end (once; a later end is ignored).
    pub fn end(&self, outcome: RemoteOutcome) {
        self.log.send_if_modified(|l| {
            if l.end.is_some() {
                return false;
            }
            l.end = Some(outcome);
            true
        });
    }

    pub(crate) fn is_over(&self) -> bool {
        self.log.borrow().end.is_some()
    }

    /// The lines after `after` (and the end, once they are all delivered), waiting up to
    /// `wait` for something new when there is nothing yet.
    pub async fn page(&self, after: usize, wait: Duration) -> ProgressPage {
        let mut rx = self.log.subscribe();
        let cut = |l: &RunLog| {
            let from = after.min(l.lines.len());
            ProgressPage {
                lines: l.lines[from..].to_vec(),
                next: l.lines.len(),
                end: l.end.clone(),
            }
        };
        let first = cut(&rx.borrow_and_update());
        if !first.lines.is_empty() || first.end.is_some() {
            return first;
        }
        // Nothing new: wait for the next change (or give an empty page back in time, so the
        // connection never sits idle past serve's idle timeout).
        let _ = tokio::time::timeout(wait, rx.changed()).await;
        cut(&rx.borrow())
    }
}

/// serve's rollouts: the one running (or the last one, so its end can still be read).
#[derive(Debug, Default)]
pub(crate) struct Rollouts {
    current: Mutex<Option<Arc<Run>>>,
    next_id: AtomicU64,
}

impl Rollouts {
    /// A new run described by `what`, unless one is still running.
    pub(crate) fn begin(&self, what: String) -> Result<Arc<Run>, StartError> {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(run) = cur.as_ref()
            && !run.is_over()
        {
            return Err(StartError::Busy(run.what.clone()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let run = Arc::new(Run {
            id,
            what,
            log: tokio::sync::watch::channel(RunLog::default()).0,
        });
        *cur = Some(run.clone());
        Ok(run)
    }

    /// The run with this id, while it is the current or last one.
    pub fn get(&self, id: u64) -> Option<Arc<Run>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|r| r.id == id)
            .cloned()
    }
}

/// What a serve-side job runs with: serve's own inventory, store and admin credentials.
#[derive(Clone)]
pub(crate) struct RolloutCtx {
    pub inventory: Arc<Inventory>,
    pub store: Arc<dyn Store>,
    /// The rollout records' one writer: rollouts run through serve are day two's.
    pub rollouts: Arc<crate::store::RolloutWriter>,
    pub creds: ClientCreds,
    pub apid_port: u16,
    /// Where an apply through serve publishes what the nodes now run, so serve's drift
    /// watcher compares against the applied configs rather than serve's start-up rendering.
    pub view: Option<Arc<StateView>>,
    /// serve's event bus: a Talos upgrade's installer pull lands in each node's timeline.
    pub events: Option<crate::events::EventBus>,
}

/// One kind's serve-side work, validated and ready to run.
#[tonic::async_trait]
pub(crate) trait Job: Send + Sync {
    /// What it is, for the operator (`apply apply/3f6a…`, `upgrade-talos/v1.14.0`).
    fn describe(&self) -> String;
    /// Runs it to its end, each progress line to `say`.
    async fn run(
        self: Box<Self>,
        ctx: &RolloutCtx,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> RemoteOutcome;
}

impl RolloutKind {
    /// Checks the request against serve's inventory; the job to run, or why not.
    pub(crate) fn prepare(
        self,
        inv: &Inventory,
        apid_port: u16,
        worker_concurrency: usize,
    ) -> Result<Box<dyn Job>, StartError> {
        if worker_concurrency == 0 {
            return Err(StartError::Invalid(
                "worker concurrency must be at least 1".into(),
            ));
        }
        match self {
            RolloutKind::Apply(req) => Ok(Box::new(ApplyJob::new(
                inv,
                apid_port,
                worker_concurrency,
                req,
            )?)),
            RolloutKind::UpgradeTalos(req) => Ok(Box::new(UpgradeTalosJob::new(
                inv,
                apid_port,
                worker_concurrency,
                req,
            )?)),
            RolloutKind::UpgradeKubernetes(req) => {
                Ok(Box::new(UpgradeK8sJob::new(inv, apid_port, req)?))
            }
        }
    }
}

/// Starts `request` on serve: validated, registered (one at a time), then run on its own
/// task. Returns where to page its progress.
pub fn start(
    rollouts: &Rollouts,
    ctx: RolloutCtx,
    request: RolloutRequest,
) -> Result<Started, StartError> {
    let job = request
        .kind
        .prepare(&ctx.inventory, ctx.apid_port, request.worker_concurrency)?;
    let what = job.describe();
    let run = rollouts.begin(what.clone())?;
    let id = run.id;
    tokio::spawn(async move {
        let say = {
            let run = run.clone();
            move |line: String| run.say(line)
        };
        let outcome = job.run(&ctx, &say).await;
        tracing::info!(rollout = run.id, ?outcome, "rollout ended");
        run.end(outcome);
    });
    Ok(Started { id, what })
}

/// The operator's `--mode` name back to the mode.
pub(crate) fn parse_mode(s: &str) -> Option<Mode> {
    [
        Mode::Auto,
        Mode::NoReboot,
        Mode::Reboot,
        Mode::Staged,
        Mode::Try,
    ]
    .into_iter()
    .find(|m| super::plan::mode_name(*m) == s)
}

fn role(inv: &Inventory, node: &crate::inventory::Node) -> Role {
    if inv.role_of(node).machine_type == MachineType::ControlPlane {
        Role::ControlPlane
    } else {
        Role::Worker
    }
}

/// The apply targets of `configs`: every one an inventory node, at most once, reached at the
/// address the inventory gives it; in the inventory's order.
/// Every control plane of `inv`, for the etcd gate of an apply that may name only some
/// nodes ([`ApplyOptions::control_planes`]); their `rendered` is not used.
fn control_plane_targets(inv: &Inventory, apid_port: u16) -> Vec<NodeTarget> {
    inv.nodes
        .iter()
        .filter(|n| role(inv, n) == Role::ControlPlane)
        .map(|n| {
            let ip = std::net::IpAddr::V4(n.address.value.addr());
            NodeTarget {
                name: n.name.value.clone(),
                role: Role::ControlPlane,
                addr: std::net::SocketAddr::new(ip, apid_port),
                node_ip: ip,
                rendered: String::new(),
            }
        })
        .collect()
}

pub(crate) fn apply_targets(
    inv: &Inventory,
    apid_port: u16,
    configs: Vec<NodeConfig>,
) -> Result<Vec<NodeTarget>, StartError> {
    let mut by_name = std::collections::BTreeMap::new();
    for c in configs {
        if inv.node(&c.node).is_none() {
            return Err(StartError::Invalid(format!(
                "node {:?} is not in serve's inventory; restart serve with the inventory that \
                 names it",
                c.node
            )));
        }
        if by_name.insert(c.node.clone(), c.rendered).is_some() {
            return Err(StartError::Invalid(format!(
                "node {:?} is given twice",
                c.node
            )));
        }
    }
    if by_name.is_empty() {
        return Err(StartError::Invalid("the apply names no node".into()));
    }
    Ok(inv
        .nodes
        .iter()
        .filter_map(|n| {
            let rendered = by_name.remove(n.name.as_str())?;
            let ip = std::net::IpAddr::V4(n.address.value.addr());
            Some(NodeTarget {
                name: n.name.value.clone(),
                role: role(inv, n),
                addr: std::net::SocketAddr::new(ip, apid_port),
                node_ip: ip,
                rendered,
            })
        })
        .collect())
}

/// Control planes relay for nodes that cannot be reached directly.
pub fn connector(creds: &ClientCreds, targets: &[NodeTarget]) -> Connector {
    Connector {
        creds: creds.clone(),
        relays: targets
            .iter()
            .filter(|t| t.role == Role::ControlPlane)
            .map(|t| t.addr)
            .collect(),
        retry: crate::talos::retry::RetryPolicy::default(),
    }
}

struct ApplyJob {
    targets: Vec<NodeTarget>,
    opts: ApplyOptions,
}

impl ApplyJob {
    fn new(
        inv: &Inventory,
        apid_port: u16,
        worker_concurrency: usize,
        req: ApplyRequest,
    ) -> Result<Self, StartError> {
        let mode = parse_mode(&req.mode).ok_or_else(|| {
            StartError::Invalid(format!(
                "mode {:?} is none of auto, no-reboot, reboot, staged, try",
                req.mode
            ))
        })?;
        Ok(Self {
            targets: apply_targets(inv, apid_port, req.configs)?,
            opts: ApplyOptions {
                control_planes: control_plane_targets(inv, apid_port),
                mode,
                try_timeout: req.try_timeout_secs.map(Duration::from_secs),
                worker_concurrency,
                gate_timeout: Duration::from_secs(req.gate_timeout_secs),
                gate_poll: Duration::from_millis(req.gate_poll_ms.max(10)),
            },
        })
    }
}

#[tonic::async_trait]
impl Job for ApplyJob {
    fn describe(&self) -> String {
        format!(
            "apply {}",
            super::apply::plan_key(&self.targets, &self.opts)
        )
    }

    async fn run(
        self: Box<Self>,
        ctx: &RolloutCtx,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> RemoteOutcome {
        let conn = connector(&ctx.creds, &self.targets);
        let out = super::apply::apply(&ctx.rollouts, &conn, &self.targets, &self.opts, |p| {
            say(super::apply::progress_line(p))
        })
        .await;
        match out {
            Ok(ApplyOutcome::NoChanges) => {
                publish_applied(ctx, &self.targets);
                RemoteOutcome::NoChanges
            }
            Ok(ApplyOutcome::Finished { key, nodes }) => {
                publish_applied(ctx, &self.targets);
                RemoteOutcome::Finished { key, nodes }
            }
            Ok(ApplyOutcome::Stopped { key, node, reason }) => {
                RemoteOutcome::Stopped { key, node, reason }
            }
            Err(e) => RemoteOutcome::Failed {
                reason: e.to_string(),
            },
        }
    }
}

/// After an apply every target runs its rendering: that is what drift is measured against
/// from now on.
fn publish_applied(ctx: &RolloutCtx, targets: &[NodeTarget]) {
    if let Some(view) = &ctx.view {
        for t in targets {
            view.drift.set_applied(&t.name, t.rendered.clone());
        }
    }
}

struct UpgradeTalosJob {
    plan: TalosUpgrade,
    worker_concurrency: usize,
    wait: Duration,
    poll: Duration,
}

impl UpgradeTalosJob {
    fn new(
        inv: &Inventory,
        apid_port: u16,
        worker_concurrency: usize,
        req: TalosUpgradeRequest,
    ) -> Result<Self, StartError> {
        let version: Version = req.version.parse().map_err(|e| {
            StartError::Invalid(format!(
                "{:?} is not a Talos version like v1.13.9: {e}",
                req.version
            ))
        })?;
        Ok(Self {
            plan: TalosUpgrade::plan(inv, &version, req.stage, apid_port),
            worker_concurrency,
            wait: Duration::from_secs(req.node_timeout_secs),
            poll: Duration::from_millis(req.gate_poll_ms.max(10)),
        })
    }
}

#[tonic::async_trait]
impl Job for UpgradeTalosJob {
    fn describe(&self) -> String {
        rollout_key(&self.plan.version)
    }

    async fn run(
        self: Box<Self>,
        ctx: &RolloutCtx,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> RemoteOutcome {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        // The installer's output comes from the upgrade's own tasks; it joins the log in the
        // order it arrives.
        let output: super::upgrade::InstallerOutput =
            Arc::new(move |node, line| drop(tx.send(format!("  {node}: {line}"))));
        let mut ops = TalosOps::new(self.plan.clone(), ctx.creds.clone(), output);
        ops.events = ctx.events.clone();
        ops.wait = self.wait;
        ops.poll = self.poll;
        let key = rollout_key(&self.plan.version);
        let nodes = self.plan.nodes.iter().map(|n| n.name.clone()).collect();
        let relay = async {
            while let Some(line) = rx.recv().await {
                say(line);
            }
        };
        let upgrade = super::upgrade_run::upgrade(
            &self.plan,
            Arc::new(ops),
            &ctx.rollouts,
            self.worker_concurrency,
            say,
        );
        // The relay ends when the ops (and with them the sender) are dropped.
        let (result, ()) = tokio::join!(upgrade, relay);
        match result {
            Ok(Outcome::Finished) => RemoteOutcome::Finished { key, nodes },
            Ok(Outcome::Stopped { node, reason }) => RemoteOutcome::Stopped { key, node, reason },
            Err(e) => RemoteOutcome::Failed {
                reason: e.to_string(),
            },
        }
    }
}

struct UpgradeK8sJob {
    plan: super::upgrade_k8s::K8sUpgrade,
    no_prune: bool,
    manifest_wait: Option<Duration>,
    pod_wait: Duration,
    node_wait: Duration,
    poll: Duration,
}

impl UpgradeK8sJob {
    fn new(inv: &Inventory, apid_port: u16, req: K8sUpgradeRequest) -> Result<Self, StartError> {
        let version: Version = req.version.parse().map_err(|e| {
            StartError::Invalid(format!(
                "{:?} is not a Kubernetes version like 1.36.3: {e}",
                req.version
            ))
        })?;
        // Planned against serve's inventory: an unsupported path is refused before anything
        // runs, as the standalone CLI refuses it.
        let plan = super::upgrade_k8s::K8sUpgrade::plan(inv, &version, apid_port)
            .map_err(|e| StartError::Invalid(e.to_string()))?;
        Ok(Self {
            plan,
            no_prune: req.no_prune,
            // talosctl's 5 minutes, no longer than a static pod may take.
            manifest_wait: (!req.skip_manifest_wait)
                .then(|| Duration::from_secs(req.pod_wait_secs.min(300))),
            pod_wait: Duration::from_secs(req.pod_wait_secs),
            node_wait: Duration::from_secs(req.node_wait_secs),
            poll: Duration::from_millis(req.gate_poll_ms.max(10)),
        })
    }
}

#[tonic::async_trait]
impl Job for UpgradeK8sJob {
    fn describe(&self) -> String {
        super::upgrade_k8s::rollout_key(&self.plan.to)
    }

    async fn run(
        self: Box<Self>,
        ctx: &RolloutCtx,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> RemoteOutcome {
        use super::upgrade_k8s::{K8sOps, progress_line, rollout_key};
        let key = rollout_key(&self.plan.to);
        if matches!(ctx.store.rollout(&key), Ok(Some(_))) {
            say(format!("resuming {key} from the store"));
        }
        let mut ops = match K8sOps::connect(self.plan.clone(), ctx.creds.clone()).await {
            Ok(ops) => ops,
            Err(e) => {
                return RemoteOutcome::Failed {
                    reason: e.to_string(),
                };
            }
        };
        ops.pod_wait = self.pod_wait;
        ops.node_wait = self.node_wait;
        ops.poll = self.poll;
        ops.no_prune = self.no_prune;
        ops.manifest_wait = self.manifest_wait;
        let plan = &self.plan;
        let out = super::upgrade_k8s::run(plan, Arc::new(ops), &ctx.rollouts, |p| {
            say(progress_line(plan, p))
        })
        .await;
        match out {
            Ok(Outcome::Finished) => RemoteOutcome::Finished {
                key,
                nodes: plan.nodes.iter().map(|n| n.name.clone()).collect(),
            },
            Ok(Outcome::Stopped { node, reason }) => RemoteOutcome::Stopped { key, node, reason },
            Err(e) => RemoteOutcome::Failed {
                reason: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rack() -> Inventory {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
        crate::inventory::load_with_env(&path, &std::collections::BTreeMap::new())
            .unwrap()
            .inventory
    }

    fn cfg(node: &str) -> NodeConfig {
        NodeConfig {
            node: node.into(),
            rendered: format!("machine: {{}} # {node}\n"),
        }
    }

    #[test]
    fn one_rollout_at_a_time() {
        let r = Rollouts::default();
        let first = r.begin("apply apply/1".into()).unwrap();
        assert_eq!(
            r.begin("upgrade-talos/v1.14.0".into()).unwrap_err(),
            StartError::Busy("apply apply/1".into())
        );
        first.say("rack1-wk-01: applied".into());
        first.end(RemoteOutcome::NoChanges);
        let second = r.begin("upgrade-talos/v1.14.0".into()).unwrap();
        assert_ne!(first.id, second.id);
        assert!(r.get(first.id).is_none(), "only the last run is kept");
        assert_eq!(r.get(second.id).unwrap().what, "upgrade-talos/v1.14.0");
    }

    #[tokio::test]
    async fn pages_deliver_every_line_once_then_the_end() {
        let r = Rollouts::default();
        let run = r.begin("x".into()).unwrap();
        run.say("one".into());
        run.say("two".into());
        let p = run.page(0, Duration::ZERO).await;
        assert_eq!(
            (p.lines.clone(), p.next, p.end.clone()),
            (vec!["one".to_owned(), "two".into()], 2, None)
        );
        // Nothing new: an empty page after the wait, same index.
        let p = run.page(2, Duration::from_millis(1)).await;
        assert_eq!((p.lines.len(), p.next, p.end), (0, 2, None));
        // A line arriving while a page waits is delivered by that page.
        let waiter = {
            let run = run.clone();
            tokio::spawn(async move { run.page(2, Duration::from_secs(3600)).await })
        };
        tokio::task::yield_now().await;
        run.say("three".into());
        assert_eq!(waiter.await.unwrap().lines, vec!["three".to_owned()]);
        run.end(RemoteOutcome::NoChanges);
        run.end(RemoteOutcome::Failed {
            reason: "late".into(),
        });
        let p = run.page(3, Duration::ZERO).await;
        assert_eq!(
            p.end,
            Some(RemoteOutcome::NoChanges),
            "the first end stands"
        );
    }

    #[test]
    fn an_apply_goes_only_to_inventory_nodes_at_their_inventory_address() {
        let inv = rack();
        let t = apply_targets(&inv, 50000, vec![cfg("rack1-wk-01"), cfg("rack1-cp-02")]).unwrap();
        // Inventory order, role and address from serve's inventory.
        assert_eq!(
            t.iter()
                .map(|t| (t.name.as_str(), t.role, t.addr.to_string()))
                .collect::<Vec<_>>(),
            vec![
                (
                    "rack1-cp-02",
                    Role::ControlPlane,
                    "10.20.0.12:50000".to_owned()
                ),
                ("rack1-wk-01", Role::Worker, "10.20.0.21:50000".to_owned()),
            ]
        );
        let unknown = apply_targets(&inv, 50000, vec![cfg("rack9-x")]).unwrap_err();
        assert!(
            unknown.to_string().contains("not in serve's inventory"),
            "{unknown}"
        );
        let twice = apply_targets(&inv, 50000, vec![cfg("rack1-wk-01"), cfg("rack1-wk-01")]);
        assert!(matches!(twice, Err(StartError::Invalid(m)) if m.contains("twice")));
        assert!(apply_targets(&inv, 50000, vec![]).is_err());
    }

    #[test]
    fn requests_are_checked_before_anything_runs() {
        let inv = rack();
        let apply = |mode: &str| {
            RolloutKind::Apply(ApplyRequest {
                mode: mode.into(),
                try_timeout_secs: None,
                gate_timeout_secs: 60,
                gate_poll_ms: 100,
                configs: vec![cfg("rack1-wk-01")],
            })
        };
        assert!(apply("no-reboot").prepare(&inv, 50000, 1).is_ok());
        assert!(matches!(
            apply("sometimes").prepare(&inv, 50000, 1),
            Err(StartError::Invalid(_))
        ));
        assert!(matches!(
            apply("auto").prepare(&inv, 50000, 0),
            Err(StartError::Invalid(_))
        ));
        let up = |v: &str| {
            RolloutKind::UpgradeTalos(TalosUpgradeRequest {
                version: v.into(),
                stage: false,
                node_timeout_secs: 60,
                gate_poll_ms: 100,
            })
        };
        assert_eq!(
            up("v1.14.0").prepare(&inv, 50000, 2).unwrap().describe(),
            "upgrade-talos/v1.14.0"
        );
        assert!(up("latest").prepare(&inv, 50000, 2).is_err());
        let k8s = |v: &str| {
            RolloutKind::UpgradeKubernetes(K8sUpgradeRequest {
                version: v.into(),
                pod_wait_secs: 300,
                node_wait_secs: 180,
                gate_poll_ms: 100,
                no_prune: false,
                skip_manifest_wait: false,
            })
        };
        assert_eq!(
            k8s("1.36.4").prepare(&inv, 50000, 1).unwrap().describe(),
            "upgrade-k8s/v1.36.4"
        );
        // talosctl's path rule, checked against serve's inventory (1.36.3): one minor at most.
        let skip = k8s("1.38.0").prepare(&inv, 50000, 1);
        assert!(
            matches!(&skip, Err(StartError::Invalid(m)) if m.contains("1.36->1.38")),
            "{:?}",
            skip.err()
        );
        assert!(k8s("latest").prepare(&inv, 50000, 1).is_err());
        let json = serde_json::to_string(&RolloutRequest {
            worker_concurrency: 1,
            kind: k8s("1.36.4"),
        })
        .unwrap();
        assert!(json.contains("\"kind\":\"upgrade_kubernetes\""), "{json}");
    }

    #[test]
    fn the_wire_form_round_trips_and_never_debug_prints_a_config() {
        let req = RolloutRequest {
            worker_concurrency: 2,
            kind: RolloutKind::Apply(ApplyRequest {
                mode: "no-reboot".into(),
                try_timeout_secs: Some(30),
                gate_timeout_secs: 600,
                gate_poll_ms: 2000,
                configs: vec![NodeConfig {
                    node: "rack1-wk-01".into(),
                    rendered: "machine: {token: s3cret}\n".into(),
                }],
            }),
        };
        let json = serde_json::to_string(&req).unwrap();
        assert!(json.contains("\"kind\":\"apply\""), "{json}");
        assert_eq!(serde_json::from_str::<RolloutRequest>(&json).unwrap(), req);
        assert!(!format!("{req:?}").contains("s3cret"));
        for m in ["auto", "no-reboot", "reboot", "staged", "try"] {
            assert_eq!(parse_mode(m).map(super::super::plan::mode_name), Some(m));
        }
    }
}
