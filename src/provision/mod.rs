//! Push provisioning: from "this MAC booted" to a configured Talos node, then the cluster
//! steps (bootstrap once, health, kubeconfig).
//!
//! * [`disks`]: the pure install-disk check (path exists, or the selector matches exactly
//!   one disk; otherwise a refusal that lists every disk).
//! * [`node`]: the per-node state machine over the persisted [`NodePhase`]s
//!   Booting → Maintenance → Configuring → Installing → Ready (or Failed), and rebuild.
//! * [`cluster`]: bootstrap exactly once on the persisted bootstrap node, the health wait whose
//!   deadline holds, and the kubeconfig written 0600 only once the API answers.
//! * [`steps`]: the persisted cluster steps after that (API ready, Cilium, nodes Ready,
//!   Argo CD, handed off), resumed from the store and retried with backoff.
//!
//! Every step reads the store, makes at most one non-repeatable Talos call, and records the
//! intent *before* that call, so a restart at any point resumes without repeating it. Every
//! call and outcome is published on the [`EventBus`] as a node event. [`Provisioner::run`]
//! drives all of it from bus events (`dhcp.ack`, `http.initramfs`, ...) and a poll timer.

pub mod cluster;
pub mod core;
pub mod disks;
pub mod node;
pub mod steps;
pub mod up;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::events::{EventBus, EventKind};
use crate::inventory::{Inventory, Node};
use crate::store::{NodePhase, NodeRecord, NodeWriter, ProgressWriter, Store, StoreError};
use crate::talos::retry::RetryPolicy;
use crate::talos::{ClientCreds, Deadlines, TalosClient, TalosError};
use crate::view;

pub use cluster::{ClusterProgress, HealthReport};
pub use node::NodeStep;
pub use steps::StepOutcome;

use crate::machineconfig::renderer::{ConfigRenderer, RenderError};

/// Why an operator command did not reach the running provisioner, or was refused by it.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// No provisioner takes commands.
    #[error("the provisioner is not running")]
    NotRunning,
    /// It stopped before it answered.
    #[error("the provisioner stopped before it answered")]
    Stopped,
    /// It refused the command (unknown node, store failure).
    #[error("{0}")]
    Refused(String),
    /// A rebuild of a node that holds no config from talboot (never provisioned, or waiting
    /// for its config): nothing to reset, and the node is provisioned anyway.
    #[error(transparent)]
    NothingToReset(core::RebuildRefused),
}

/// Renders machine configs from the inventory and the decrypted secrets bundle.
pub(crate) struct BundleRenderer {
    inventory: Arc<Inventory>,
    secrets: crate::machineconfig::secrets::SecretsBundle,
}

impl BundleRenderer {
    /// A renderer for `inventory`'s nodes with `secrets`.
    pub fn new(
        inventory: Arc<Inventory>,
        secrets: crate::machineconfig::secrets::SecretsBundle,
    ) -> Self {
        Self { inventory, secrets }
    }
}

impl ConfigRenderer for BundleRenderer {
    fn render(&self, node: &Node) -> Result<Vec<u8>, RenderError> {
        let bundle =
            crate::machineconfig::render::render_node(&self.inventory, &self.secrets, node)
                .map_err(|e| RenderError::Config(Box::new(e)))?;
        bundle
            .to_yaml()
            .map(String::into_bytes)
            .map_err(|e| RenderError::Config(Box::new(e)))
    }
}

/// Default of [`Settings::concurrency`]: a rack's worth of nodes in flight at once.
pub const DEFAULT_CONCURRENCY: usize = 64;

/// An operator action for the running provisioner, which applies it as the writer of node
/// records.
#[derive(Debug)]
pub enum Command {
    /// `talboot node rebuild NAME`: reopen the window, mark Rebuilding, reset the node.
    Rebuild {
        /// The node.
        node: String,
        /// Once persisted (or why not).
        reply: tokio::sync::oneshot::Sender<Result<(), CommandError>>,
    },
}

/// Sends [`Command`]s to a running provisioner.
#[derive(Clone, Debug)]
pub(crate) struct CommandSender(tokio::sync::mpsc::Sender<Command>);

/// The provisioner's end of [`command_channel`].
#[derive(Debug)]
pub(crate) struct CommandReceiver(pub(crate) tokio::sync::mpsc::Receiver<Command>);

/// A channel for operator commands: the sender goes to the admin API, the receiver to
/// [`Provisioner::with_commands`].
pub(crate) fn command_channel() -> (CommandSender, CommandReceiver) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    (CommandSender(tx), CommandReceiver(rx))
}

impl CommandSender {
    /// Asks the provisioner to rebuild `node`; returns once it persisted the request.
    pub async fn rebuild(&self, node: &str) -> Result<(), CommandError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.0
            .send(Command::Rebuild {
                node: node.to_owned(),
                reply,
            })
            .await
            .map_err(|_| CommandError::NotRunning)?;
        answer.await.map_err(|_| CommandError::Stopped)?
    }
}

async fn recv_command(rx: &mut Option<tokio::sync::mpsc::Receiver<Command>>) -> Option<Command> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// What a call task hands back to the writer.
type CallResult = (
    String,
    core::Effect,
    Result<(core::Outcome, node::Carry), ProvisionError>,
);

/// The run loop's own state: nodes with a call in flight (their in-memory state is the
/// truth until the result is back), what the next call of a chain reuses, the nodes due.
#[derive(Default)]
struct Writer {
    in_flight: std::collections::HashMap<String, core::NodeState>,
    carries: std::collections::HashMap<String, node::Carry>,
    calls: tokio::task::JoinSet<CallResult>,
    due: std::collections::VecDeque<String>,
    queued: std::collections::HashSet<String>,
}

impl Writer {
    fn enqueue(&mut self, name: &str) {
        if self.queued.insert(name.to_owned()) {
            self.due.push_back(name.to_owned());
        }
    }

    fn enqueue_front(&mut self, name: &str) {
        if self.queued.insert(name.to_owned()) {
            self.due.push_front(name.to_owned());
        }
    }
}

/// Feeds `observations` to the core for node `name` and persists the result: for the HTTP
/// handlers when no provisioner runs (pull delivery, no push provisioning), so the rules
/// are the core's either way. Synchronous; call it off the async threads.
pub(crate) fn observe_offline(
    store: &dyn Store,
    nodes: &NodeWriter,
    inventory: &Inventory,
    name: &str,
    observations: Vec<core::Observation>,
    now: u64,
    view: Option<&view::StateView>,
) -> Result<(), StoreError> {
    let Some(node) = inventory.node(name) else {
        return Ok(());
    };
    let ctx = offline_ctx(inventory, node);
    let rec = store.node(name)?;
    let fresh = rec.is_none();
    let life = crate::store::Lifecycle::load(store, name)?;
    let start = match rec {
        Some(r) => core::NodeState::from_persisted(r, life),
        None => core::NodeState::fresh(name, now),
    };
    let mut state = start.clone();
    for obs in observations {
        state = core::step(&state, obs, now, &ctx).0;
    }
    if fresh || state.persisted_differs(&start) {
        state.rec.updated_at_unix = now;
        let mut parts = Vec::new();
        if state.life != start.life {
            let json = serde_json::to_vec(&state.life).expect("lifecycle record serialises");
            parts.push((crate::store::NodePart::Lifecycle, json));
        }
        let writes = [crate::store::NodeWrite {
            name: name.to_owned(),
            record: Some(state.rec.clone()),
            parts,
        }];
        // The view hears of the commit before and after it (it fails closed meanwhile).
        if let Some(v) = view {
            v.begin_nodes(&writes);
        }
        let done = nodes.put_node_states(&writes);
        if let Some(v) = view {
            v.end_nodes(&writes, done.is_ok());
        }
        done?;
    }
    Ok(())
}

/// The core's context for `node` when no provisioner runs (no timeouts: nothing waits).
fn offline_ctx(inventory: &Inventory, node: &Node) -> core::NodeCtx {
    core::NodeCtx {
        macs: node.macs.iter().map(|m| m.value).collect(),
        control_plane: inventory
            .control_planes()
            .any(|cp| cp.name.as_str() == node.name.as_str()),
        install_timeout: Duration::MAX,
        reset_timeout: Duration::MAX,
        // No provisioner, no power drivers: serve's provisioner sets disk boot.
        disk_boot: false,
    }
}

/// Pure: whether [`observe_offline`] of `observations` would write anything for `node`,
/// whose committed record and lifecycle are `rec` and `life`. The HTTP handler asks this of
/// the read view first, so a request that changes nothing touches no store.
pub(crate) fn changes_offline(
    inventory: &Inventory,
    node: &Node,
    rec: NodeRecord,
    life: crate::store::Lifecycle,
    observations: &[core::Observation],
    now: u64,
) -> bool {
    let ctx = offline_ctx(inventory, node);
    let start = core::NodeState::from_persisted(rec, life);
    let mut state = start.clone();
    for obs in observations {
        state = core::step(&state, obs.clone(), now, &ctx).0;
    }
    state.persisted_differs(&start)
}

/// The provisioning listener's [`crate::http::BootObserver`] while a provisioner runs: the
/// provisioner is then the only writer of node records, and the script event the handler
/// published is its observation (a boot signal of its run loop), so nothing more is done.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProvisionerObserves;

impl crate::http::BootObserver for ProvisionerObserves {
    fn saw(&self, _: crate::http::Seen) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// The provisioning listener's [`crate::http::BootObserver`] when no provisioner runs (pull
/// delivery, no push provisioning): the core's binding and boot rules, applied by
/// [`observe_offline`], so the rules are the core's either way.
pub struct OfflineObserver {
    /// The validated inventory.
    pub inventory: Arc<Inventory>,
    /// The state store.
    pub store: Arc<dyn Store>,
    /// The node records' writer: the observer owns it when no provisioner runs.
    pub nodes: Arc<NodeWriter>,
    /// The read view the request paths read; every write is published to it.
    pub view: Arc<view::StateView>,
}

impl OfflineObserver {
    /// An operator's rebuild of `node` at `now`, when no provisioner runs: the core's rules
    /// applied here, by the node records' writer. `Ok(Some(_))` is the core's refusal; `Err`
    /// is a store failure, said in words.
    pub(crate) async fn rebuild(
        &self,
        node: String,
        now: u64,
    ) -> Result<Option<core::RebuildRefused>, String> {
        let (store, nodes, inv, view) = (
            self.store.clone(),
            self.nodes.clone(),
            self.inventory.clone(),
            self.view.clone(),
        );
        let done = tokio::task::spawn_blocking(move || {
            let rec = store
                .node(&node)
                .map_err(|e| e.to_string())?
                .unwrap_or_else(|| crate::store::NodeRecord::unseen(&node, now));
            if let Err(r) = crate::provision::core::check_rebuild(&rec) {
                return Ok(Some(r));
            }
            crate::provision::observe_offline(
                store.as_ref(),
                &nodes,
                &inv,
                &node,
                vec![crate::provision::core::Observation::RebuildRequested],
                now,
                Some(&view),
            )
            .map(|()| None)
            .map_err(|e| e.to_string())
        })
        .await;
        done.map_err(|e| e.to_string())?
    }
}

/// Who takes an operator's rebuild: the node records' one writer, which is the running
/// provisioner (asked through its commands) or, when none runs, the offline observer.
pub(crate) enum Rebuilds {
    /// The running provisioner's commands.
    Provisioner(CommandSender),
    /// The offline observer (no push provisioning).
    Offline(Arc<OfflineObserver>),
}

impl crate::http::BootObserver for OfflineObserver {
    fn saw(&self, seen: crate::http::Seen) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(remember_address(self, seen))
    }
}

/// Record where a node was last seen, creating its record on first sight: the core's
/// binding and boot rules, applied here only when no provisioner runs (which would otherwise
/// be the writer). The core is asked first over the published record; only a change goes to
/// the store (off the async threads, read and written in one go, published to the view).
async fn remember_address(observer: &OfflineObserver, seen: crate::http::Seen) {
    let crate::http::Seen {
        node,
        mac,
        ip,
        at: now,
    } = seen;
    let node = node.as_str();
    let observations = vec![
        core::Observation::Binding(Some(core::Binding { mac, ip })),
        core::Observation::BootSeen,
    ];
    if let (Some(n), (Some((rec, life)), false)) =
        (observer.inventory.node(node), observer.view.node(node))
        && !changes_offline(&observer.inventory, n, rec, life, &observations, now)
    {
        return;
    }
    let (store, nodes, inv, name, view) = (
        observer.store.clone(),
        observer.nodes.clone(),
        observer.inventory.clone(),
        node.to_owned(),
        observer.view.clone(),
    );
    let done = tokio::task::spawn_blocking(move || {
        observe_offline(
            store.as_ref(),
            &nodes,
            &inv,
            &name,
            observations,
            now,
            Some(&view),
        )
    })
    .await;
    if let Ok(Err(e)) = done {
        tracing::error!(node, error = %e, "cannot record node address");
    }
}

/// Knobs of the provisioner; [`Settings::new`] gives production defaults.
#[derive(Clone, Debug)]
pub struct Settings {
    /// TCP port of apid on every node (50000; tests may move it).
    pub(crate) apid_port: u16,
    /// Where the kubeconfig is written.
    pub state_dir: PathBuf,
    /// How long a node may take from ApplyConfiguration until it runs installed from disk
    /// (machine stage `running`).
    pub(crate) install_timeout: Duration,
    /// How long a rebuilt node may take from the Reset reply until its maintenance API
    /// answers; past it the rebuild is Failed (the reset did not happen).
    pub reset_timeout: Duration,
    /// Longest pause between maintenance probes of a node that booted Talos but does not
    /// answer yet (the pause doubles from `poll_interval` up to this).
    pub(crate) probe_backoff_max: Duration,
    /// How long the health wait may take, in total.
    pub health_timeout: Duration,
    /// Pause between polls of nodes and between health checks.
    pub poll_interval: Duration,
    /// Retry policy of idempotent Talos calls (none by default: the next poll is the retry,
    /// and a step never blocks the loop on one slow node).
    pub retry: RetryPolicy,
    /// Per-call deadlines.
    pub(crate) deadlines: Deadlines,
    /// Directory of rendered add-on manifests, with subdirectories `cilium/` and `argocd/`
    /// (see docs/addons.md); used when no `helm` binary is configured.
    pub addon_manifests: Option<PathBuf>,
    /// The `helm` binary that renders each enabled add-on with `helm template` (pinned chart
    /// version, the inventory's Kubernetes version, the API versions the cluster serves).
    /// Takes precedence over `addon_manifests`; one of the two is required when an add-on is
    /// enabled.
    pub helm: Option<PathBuf>,
    /// The age identity (keys.txt text) for Argo CD's `sops-age` Secret; required when
    /// `addons.argocd.ksops` is on. Its `Debug` is redacted.
    pub ksops_age_identity: Option<Arc<crate::crypto::age::Secret>>,
    /// Timeouts of the add-on waits (CRDs, rollouts, nodes Ready).
    pub addon_timeouts: crate::addons::Timeouts,
    /// How many nodes' Talos calls run at once (each node has at most one in flight).
    pub concurrency: usize,
    /// Each node's power driver, credentials resolved (nodes without `power:` are absent).
    pub power: Arc<std::collections::BTreeMap<String, crate::power::PowerDriver>>,
}

impl Settings {
    /// Defaults: port 50000, 20 minutes to install, 10 minutes for health, 5 s polls.
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            apid_port: crate::talos::APID_PORT,
            state_dir,
            install_timeout: Duration::from_secs(20 * 60),
            // A graceful leave retries for up to 5 minutes (internal/pkg/etcd/etcd.go,
            // LeaveCluster), then the wipe and a network boot.
            reset_timeout: Duration::from_secs(15 * 60),
            probe_backoff_max: Duration::from_secs(60),
            health_timeout: Duration::from_secs(10 * 60),
            poll_interval: Duration::from_secs(5),
            retry: RetryPolicy::NONE,
            deadlines: Deadlines::default(),
            addon_manifests: None,
            helm: None,
            ksops_age_identity: None,
            addon_timeouts: crate::addons::Timeouts::default(),
            concurrency: DEFAULT_CONCURRENCY,
            power: Arc::default(),
        }
    }
}

/// Why a provisioning step failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A Talos call failed.
    #[error("node {node}: {source}")]
    Talos {
        /// The node.
        node: String,
        /// The classified call failure.
        #[source]
        source: TalosError,
    },
    /// The install disk cannot be used on this node.
    #[error("node {node}: {source}")]
    Disk {
        /// The node.
        node: String,
        /// The refusal, listing the disks.
        #[source]
        source: disks::DiskRefusal,
    },
    /// The machine config could not be rendered.
    #[error("node {node}: cannot render its machine config: {reason}")]
    Render {
        /// The node.
        node: String,
        /// The renderer's message.
        reason: String,
    },
    /// The name is not in the inventory.
    #[error("node {0:?} is not in the inventory; `talboot check` lists the node names")]
    UnknownNode(String),
    /// A rebuild of a node that holds no config from talboot: nothing to reset.
    #[error(transparent)]
    RebuildRefused(#[from] core::RebuildRefused),
    /// The inventory has no control plane to bootstrap.
    #[error("the inventory has no control-plane node; give at least one node a controlplane role")]
    NoControlPlane,
    /// The install sequence failed on the node.
    #[error("node {node}: install failed: {cause}")]
    InstallFailed {
        /// The node.
        node: String,
        /// What Talos reported (the failed sequence's error), or what was observed.
        cause: String,
    },
    /// A rebuild's reset did not happen.
    #[error("node {node}: rebuild failed: {cause}")]
    ResetFailed {
        /// The node.
        node: String,
        /// What Talos reported, or that the node never came back in maintenance mode.
        cause: String,
    },
    /// The node did not come back configured in time.
    #[error(
        "node {node} did not come back installed (machine stage running) within {after:?} \
         after its config was applied; check its console (install disk, installer image pull) \
         and `talboot status`"
    )]
    InstallTimeout {
        /// The node.
        node: String,
        /// The timeout.
        after: Duration,
    },
    /// The health wait ran out of time.
    #[error("cluster not healthy within {after:?}: {last}")]
    HealthTimeout {
        /// The timeout that expired.
        after: Duration,
        /// What the last check found.
        last: String,
    },
    /// The kubeconfig could not be written.
    #[error(transparent)]
    Write(#[from] crate::fsutil::AtomicWriteError),
    /// A blocking store task died.
    #[error("internal: store task failed: {0}")]
    Join(String),
    /// A step failed without a more specific error.
    #[error("node {node}: {why}")]
    Step {
        /// The node.
        node: String,
        /// Why.
        why: String,
    },
}

/// What the run loop knows about probing one node in Unknown/Booting.
#[derive(Clone, Debug)]
struct ProbeState {
    /// The node fetched a Talos boot script, kernel or initramfs from talboot (seen on the
    /// bus or in its timeline): only such a machine can answer on port 50000.
    talos_booted: bool,
    /// Probes that found nothing since the last boot signal.
    misses: u32,
    /// No probe before this.
    next_at: tokio::time::Instant,
}

/// The pause after `misses` unanswered probes: the poll interval doubled per miss, at most
/// `max`.
pub(crate) fn probe_backoff(poll: Duration, misses: u32, max: Duration) -> Duration {
    poll.saturating_mul(1u32 << misses.min(16))
        .min(max.max(poll))
}

/// The store tables the provisioner is the one writer of while it runs.
#[derive(Debug)]
pub struct ProvisionWriters {
    /// Node records and parts.
    pub nodes: NodeWriter,
    /// Cluster progress (bootstrap, kubeconfig, cluster steps).
    pub progress: ProgressWriter,
}

/// The provisioner: inventory, store, bus, renderer and admin credentials. Cheap to clone.
#[derive(Clone)]
pub struct Provisioner {
    inner: Arc<Inner>,
}

struct Inner {
    /// Which nodes booted Talos and when each may be probed next (run loop only).
    probes: std::sync::Mutex<std::collections::HashMap<String, ProbeState>>,
    /// Operator commands for the running writer (taken by [`Provisioner::run`]).
    commands: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Command>>>,
    inventory: Arc<Inventory>,
    store: Arc<dyn Store>,
    writers: Arc<ProvisionWriters>,
    bus: EventBus,
    renderer: Arc<dyn ConfigRenderer>,
    creds: ClientCreds,
    settings: Settings,
    /// The read view this provisioner publishes its commits to (when serve reads one).
    view: std::sync::OnceLock<Arc<view::StateView>>,
}

impl Provisioner {
    /// A provisioner over `store`, writing with `writers`; nothing happens until a step or
    /// [`Provisioner::run`].
    pub fn new(
        inventory: Arc<Inventory>,
        store: Arc<dyn Store>,
        writers: ProvisionWriters,
        bus: EventBus,
        renderer: Arc<dyn ConfigRenderer>,
        creds: ClientCreds,
        settings: Settings,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                probes: Default::default(),
                commands: Default::default(),
                inventory,
                store,
                writers: Arc::new(writers),
                bus,
                renderer,
                creds,
                settings,
                view: Default::default(),
            }),
        }
    }

    /// Publish every committed node record and lifecycle to `view` (the HTTP and TFTP
    /// request paths read it instead of the store).
    pub fn with_view(self, view: Arc<view::StateView>) -> Self {
        // Set once, before the provisioner runs; a second call keeps the first view.
        let _ = self.inner.view.set(view);
        self
    }

    /// The provisioner takes its operator commands from `commands` (see [`command_channel`]).
    pub(crate) fn with_commands(self, commands: CommandReceiver) -> Self {
        *self.inner.commands.lock().expect("command lock") = Some(commands.0);
        self
    }

    /// The inventory this provisioner works from.
    pub fn inventory(&self) -> &Inventory {
        &self.inner.inventory
    }

    fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    fn now(&self) -> u64 {
        self.inner.bus.clock().now_unix()
    }

    fn event(&self, node: &str, kind: EventKind, detail: impl Into<String>) {
        self.inner.bus.publish(node, kind, detail);
    }

    /// Runs a synchronous store call off the async threads.
    async fn db<T, F>(&self, f: F) -> Result<T, ProvisionError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    {
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || f(store.as_ref()))
            .await
            .map_err(|e| ProvisionError::Join(e.to_string()))?
            .map_err(ProvisionError::from)
    }

    /// Runs a synchronous store write off the async threads.
    async fn write<T, F>(&self, f: F) -> Result<T, ProvisionError>
    where
        T: Send + 'static,
        F: FnOnce(&ProvisionWriters) -> Result<T, StoreError> + Send + 'static,
    {
        let writers = self.inner.writers.clone();
        tokio::task::spawn_blocking(move || f(&writers))
            .await
            .map_err(|e| ProvisionError::Join(e.to_string()))?
            .map_err(ProvisionError::from)
    }

    /// Runs a store write and, once it succeeded, publishes its event, both inside the
    /// blocking task: that task runs to its end even when the caller is cancelled (talboot
    /// stopping mid-step), so a persisted transition always reaches the timeline too.
    async fn db_then_event<F>(
        &self,
        f: F,
        node: String,
        kind: EventKind,
        detail: String,
    ) -> Result<(), ProvisionError>
    where
        F: FnOnce(&ProvisionWriters) -> Result<(), StoreError> + Send + 'static,
    {
        let bus = self.inner.bus.clone();
        self.write(move |w| {
            f(w)?;
            bus.publish(&node, kind, detail);
            Ok(())
        })
        .await
    }

    fn node_def(&self, name: &str) -> Result<&Node, ProvisionError> {
        self.inner
            .inventory
            .node(name)
            .ok_or_else(|| ProvisionError::UnknownNode(name.to_owned()))
    }

    /// The node's record, or a fresh one: a node never seen before is new, so its
    /// provisioning window is open.
    async fn record(&self, name: &str) -> Result<NodeRecord, ProvisionError> {
        let owned = name.to_owned();
        let now = self.now();
        self.db(move |s| {
            Ok(s.node(&owned)?
                .unwrap_or_else(|| NodeRecord::unseen(&owned, now)))
        })
        .await
    }

    /// Where the node is: the address talboot's own DHCP bound to one of its MACs (its lease
    /// in authoritative mode, its ProxyDHCP binding in proxy mode; see
    /// [`crate::entitlement`]), with that MAC. Nothing else: not where a script was last
    /// asked for, which any host on the segment can claim. A config is only ever pushed here.
    async fn address_of(
        &self,
        node: &Node,
    ) -> Result<Option<(Ipv4Addr, Option<crate::inventory::Mac>)>, ProvisionError> {
        let macs: Vec<_> = node.macs.iter().map(|m| m.value).collect();
        let now = self.now();
        let mode = self.inner.inventory.network.mode;
        let bound = self
            .db(move |s| crate::entitlement::bound_address(s, mode, &macs, now))
            .await?;
        Ok(bound.map(|b| (b.ip, Some(b.mac))))
    }

    fn apid(&self, ip: Ipv4Addr) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(ip), self.settings().apid_port)
    }

    fn tune(&self, client: TalosClient) -> TalosClient {
        client
            .with_deadlines(self.settings().deadlines)
            .with_retry(self.settings().retry)
    }

    fn maintenance_client(&self, ip: Ipv4Addr) -> Result<TalosClient, TalosError> {
        Ok(self.tune(TalosClient::maintenance(self.apid(ip))?))
    }

    fn secured_client(&self, ip: Ipv4Addr) -> Result<TalosClient, TalosError> {
        Ok(self.tune(TalosClient::secured(self.apid(ip), &self.inner.creds)?))
    }

    /// The writer: drives every node that is not settled through the pure core, with up to
    /// `concurrency` Talos calls in flight at once (each node has at most one), and the
    /// cluster steps in their own task (they include the health wait). This task is the only
    /// writer of node records while it runs: boot events of inventory nodes (`dhcp.ack`,
    /// `http.*`) and operator [`Command`]s become observations here, call results come back
    /// here. Nodes are also polled every `poll_interval`; when the bus overflows, what was
    /// missed is re-derived from the store (leases and timelines). Returns when `cancel`
    /// fires.
    pub async fn run(self, cancel: CancellationToken) {
        // Aborted when `run` is dropped too (serve's shutdown drops it mid-step), so no
        // cluster step outlives the provisioner.
        let cluster = {
            let me = self.clone();
            let cancel = cancel.clone();
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                me.run_cluster(cancel).await
            }))
        };
        let mut commands = self.inner.commands.lock().expect("command lock").take();
        let mut events = self.inner.bus.subscribe();
        let mut tick = tokio::time::interval(self.settings().poll_interval);
        let mut w = Writer::default();
        let limit = self.settings().concurrency.max(1);
        loop {
            while w.calls.len() < limit {
                let Some(name) = w.due.pop_front() else { break };
                w.queued.remove(&name);
                if w.in_flight.contains_key(&name) {
                    continue;
                }
                self.start_node(&mut w, &name).await;
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(done) = w.calls.join_next(), if !w.calls.is_empty() => {
                    // Every result that is ready now goes into one group commit.
                    let mut ready = vec![done];
                    while let Some(more) = w.calls.try_join_next() {
                        ready.push(more);
                    }
                    let mut results = Vec::with_capacity(ready.len());
                    for done in ready {
                        match done {
                            Ok(r) => results.push(r),
                            Err(e) => tracing::error!(error = %e, "a provisioning call task failed"),
                        }
                    }
                    self.finish_calls(&mut w, results).await;
                }
                Some(cmd) = recv_command(&mut commands) => self.command(&mut w, cmd).await,
                ev = events.recv() => match ev {
                    Ok(ev) if is_boot_signal(ev.kind) && self.inner.inventory.node(&ev.node).is_some() => {
                        self.note_booting_in(&mut w, &ev.node).await;
                        if is_talos_boot(ev.kind) {
                            self.mark_talos_booted(&ev.node);
                        }
                        if self.probe_due(&ev.node).await {
                            w.enqueue(&ev.node);
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        // The missed boot events are in the store: forget what the probe table
                        // learnt from the bus, so each node's next look re-reads its timeline
                        // (and its lease), and look at every node now.
                        tracing::warn!(missed = n, "provisioner fell behind the event bus; re-deriving from the store");
                        self.inner.probes.lock().expect("probe table lock").clear();
                        self.enqueue_due(&mut w).await;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                _ = tick.tick() => self.enqueue_due(&mut w).await,
            }
        }
        w.calls.abort_all();
        cluster.abort();
        let _ = cluster.await;
    }

    async fn enqueue_due(&self, w: &mut Writer) {
        let names: Vec<String> = self
            .inner
            .inventory
            .nodes
            .iter()
            .map(|n| n.name.to_string())
            .collect();
        for name in names {
            if !w.in_flight.contains_key(&name) && self.probe_due(&name).await {
                w.enqueue(&name);
            }
        }
    }

    /// A boot signal, into the node's in-memory state when a call is in flight.
    async fn note_booting_in(&self, w: &mut Writer, name: &str) {
        let Some(state) = w.in_flight.get(name).cloned() else {
            return self.note_booting(name).await;
        };
        let Ok(node) = self.node_def(name).cloned() else {
            return;
        };
        if let Ok((next, _)) = self
            .observe(&node, &state, core::Observation::BootSeen)
            .await
        {
            w.in_flight.insert(name.to_owned(), next);
        }
    }

    /// An operator command, applied by the writer (and so persisted before the reply).
    async fn command(&self, w: &mut Writer, cmd: Command) {
        match cmd {
            Command::Rebuild { node, reply } => {
                let result = async {
                    let def = self.node_def(&node)?.clone();
                    let state = match w.in_flight.get(&node) {
                        Some(s) => s.clone(),
                        None => self.load_state(&node).await?,
                    };
                    core::check_rebuild(&state.rec)?;
                    let (next, _) = self
                        .observe(&def, &state, core::Observation::RebuildRequested)
                        .await?;
                    if next.pending.is_some() {
                        w.in_flight.insert(node.clone(), next);
                    }
                    Ok::<_, ProvisionError>(())
                }
                .await;
                if result.is_ok() {
                    w.enqueue(&node);
                    self.rebuild_by_power(&node);
                }
                let _ = reply.send(result.map_err(|e| match e {
                    ProvisionError::RebuildRefused(r) => CommandError::NothingToReset(r),
                    e => CommandError::Refused(e.to_string()),
                }));
            }
        }
    }

    /// [`core::Effect::SetDiskBoot`]: the persistent boot device of an installed node becomes
    /// its disk. Off the writer loop (a BMC may take seconds); the outcome is a `power.action`
    /// event, and a failure is only that: the node is installed either way.
    fn set_disk_boot(&self, name: &str) {
        let Some(driver) = self.settings().power.get(name).cloned() else {
            return;
        };
        let (bus, name) = (self.inner.bus.clone(), name.to_owned());
        tokio::spawn(async move {
            let detail = match driver
                .set_boot_device(
                    crate::power::BootDevice::Disk,
                    crate::power::BootPersistence::Persistent,
                )
                .await
            {
                Ok(set) => format!(
                    "installed: persistent boot device set to disk through {}{set}",
                    driver.target()
                ),
                Err(e) => {
                    tracing::warn!(node = %name, "setting the disk boot device failed: {e}");
                    format!("installed; setting the persistent disk boot device failed: {e}")
                }
            };
            bus.publish(&name, EventKind::Power, detail);
        });
    }

    /// A rebuilt node whose Talos API does not answer cannot be reset over it: with a power
    /// controller, a one-time network boot and a power cycle send it to talboot, and the
    /// reopened window provisions it again (the core's normal rebuild path then sees it in
    /// maintenance mode). Off the writer loop: the check waits for a TCP answer.
    fn rebuild_by_power(&self, name: &str) {
        let (Some(driver), Ok(node)) = (
            self.settings().power.get(name).cloned(),
            self.node_def(name),
        ) else {
            return;
        };
        let addr = SocketAddr::new(
            IpAddr::V4(node.address.value.addr()),
            self.settings().apid_port,
        );
        let (bus, name) = (self.inner.bus.clone(), name.to_owned());
        tokio::spawn(async move {
            if crate::power::dispatch::tcp_answers(addr, Duration::from_secs(3)).await {
                return;
            }
            let detail = match driver.reboot_into_network().await {
                Ok(set) => format!(
                    "Talos API at {addr} did not answer: one-time network boot and power cycle through {}{set}",
                    driver.target()
                ),
                Err(e) => format!("Talos API at {addr} did not answer; power control failed: {e}"),
            };
            bus.publish(&name, EventKind::Power, detail);
        });
    }

    /// Starts node `name`: its binding, then "what now?" to the core.
    async fn start_node(&self, w: &mut Writer, name: &str) {
        let result = async {
            let node = self.node_def(name)?.clone();
            let state = self.load_state(name).await?;
            let bound = self.binding(&node).await?;
            let (state, _) = self
                .observe(&node, &state, core::Observation::Binding(bound))
                .await?;
            let (state, effects) = self.observe(&node, &state, core::Observation::Poll).await?;
            Ok::<_, ProvisionError>((node, state, effects))
        }
        .await;
        match result {
            Ok((node, state, effects)) => self.dispatch(w, node, state, effects).await,
            Err(e) => tracing::warn!(node = name, error = %e, "provisioning step failed"),
        }
    }

    /// Calls' results back in the writer: fed to the core, the new states committed
    /// together, and what follows dispatched.
    async fn finish_calls(&self, w: &mut Writer, results: Vec<CallResult>) {
        let mut inputs = Vec::new();
        for (name, effect, result) in results {
            let Some(state) = w.in_flight.remove(&name) else {
                continue;
            };
            let (Ok(node), Some(call)) = (self.node_def(&name).cloned(), effect.call()) else {
                continue;
            };
            let outcome = match result {
                Ok((o, carry)) => {
                    w.carries.insert(name.clone(), carry);
                    o
                }
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "provisioning call failed");
                    core::Outcome::NoAnswer { why: e.to_string() }
                }
            };
            let obs = core::Observation::Result {
                op: call.op,
                at: call.ip,
                outcome,
            };
            inputs.push((node, state, obs));
        }
        let batch = inputs
            .iter()
            .map(|(n, s, o)| (n, s, o.clone()))
            .collect::<Vec<_>>();
        match self.observe_many(batch).await {
            Ok(outs) => {
                for ((node, _, _), (next, effects)) in inputs.into_iter().zip(outs) {
                    self.dispatch(w, node, next, effects).await;
                }
            }
            Err(e) => {
                // Nothing was written: the nodes are looked at again from the store.
                tracing::warn!(error = %e, "provisioning state not written");
                for (node, _, _) in inputs {
                    w.enqueue(node.name.as_str());
                }
            }
        }
    }

    /// Performs the bookkeeping effects and starts the call, if the core asked for one
    /// (bounded by the writer's concurrency: it is counted in `calls`). Without a call the
    /// chain ended: the node is looked at again at once when it advanced, else after its
    /// probe backoff or the next tick.
    async fn dispatch(
        &self,
        w: &mut Writer,
        node: Node,
        state: core::NodeState,
        effects: Vec<core::Effect>,
    ) {
        let name = node.name.to_string();
        let mut ending = node::Ending::default();
        let mut call = None;
        for e in effects {
            if e.call().is_some() {
                call = Some(e);
                continue;
            }
            if let Err(err) = self.note_effect(&name, e, &mut ending).await {
                tracing::warn!(node = %name, error = %err, "provisioning step failed");
            }
        }
        if let Some(effect) = call {
            let carry = w.carries.remove(&name).unwrap_or_default();
            w.in_flight.insert(name.clone(), state);
            let me = self.clone();
            w.calls.spawn(async move {
                let result = me.perform_call(&node, &effect, carry).await;
                (node.name.to_string(), effect, result)
            });
            return;
        }
        w.carries.remove(&name);
        if let Some((reason, _)) = &ending.fail {
            tracing::warn!(node = %name, error = %reason, "provisioning step failed");
        } else if let Some(why) = &ending.error {
            tracing::warn!(node = %name, error = %why, "provisioning step failed");
        }
        if ending.again {
            w.enqueue_front(&name);
            return;
        }
        // Still Unknown/Booting afterwards: it did not answer, so its next probe waits longer.
        let mut probes = self.inner.probes.lock().expect("probe table lock");
        if let Some(p) = probes.get_mut(&name) {
            if matches!(state.rec.phase, NodePhase::Unknown | NodePhase::Booting) {
                p.misses = p.misses.saturating_add(1);
                p.next_at = tokio::time::Instant::now()
                    + probe_backoff(
                        self.settings().poll_interval,
                        p.misses,
                        self.settings().probe_backoff_max,
                    );
            } else {
                p.misses = 0;
            }
        }
    }

    /// The cluster steps until handed off: bootstrap, health and kubeconfig, then the
    /// persisted steps of [`steps`]; a failed step is retried after a growing pause.
    async fn run_cluster(&self, cancel: CancellationToken) {
        let poll = self.settings().poll_interval;
        let mut pause = poll;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = poll;
            match self.step_addons().await {
                // Nothing to do; a rebuild of the last etcd member can undo "done", so keep
                // looking (two store reads per check).
                Ok(StepOutcome::Done) => pause = poll.saturating_mul(4),
                Ok(StepOutcome::Completed(_)) => pause = Duration::ZERO,
                Ok(StepOutcome::Bootstrapping(_)) => {}
                Ok(StepOutcome::Failed { attempts, error }) => {
                    pause = steps::retry_after(poll, attempts);
                    tracing::warn!(attempts, %error, retry_in = ?pause, "cluster step failed; will retry");
                }
                Err(e) => tracing::warn!(error = %e, "cluster step failed; will retry"),
            }
        }
    }

    /// A boot signal for a node that is not being provisioned (yet, or any more) moves it to
    /// Booting (the core decides).
    async fn note_booting(&self, name: &str) {
        let Ok(node) = self.node_def(name).cloned() else {
            return;
        };
        let Ok(state) = self.load_state(name).await else {
            return;
        };
        let Ok(bound) = self.binding(&node).await else {
            return;
        };
        let Ok((state, _)) = self
            .observe(&node, &state, core::Observation::Binding(bound))
            .await
        else {
            return;
        };
        let _ = self
            .observe(&node, &state, core::Observation::BootSeen)
            .await;
    }

    /// Whether the run loop should step `name` now. Nodes past Booting are always stepped
    /// (their phase says talboot configured them); a node in Unknown/Booting only once it
    /// booted Talos from talboot (a plain DHCP client never answers on 50000) and its backoff
    /// has passed.
    async fn probe_due(&self, name: &str) -> bool {
        let phase = match self.record(name).await {
            Ok(r) => r.phase,
            Err(_) => return false,
        };
        if !matches!(phase, NodePhase::Unknown | NodePhase::Booting) {
            return true;
        }
        let known = {
            let probes = self.inner.probes.lock().expect("probe table lock");
            probes.get(name).cloned()
        };
        let state = match known {
            Some(s) => s,
            None => {
                // First look since start: the timeline remembers earlier boots.
                let owned = name.to_owned();
                let booted = self
                    .db(move |s| {
                        let mut since = 0;
                        loop {
                            let page = s.events(&owned, since, 512)?;
                            let Some(last) = page.last() else {
                                return Ok(false);
                            };
                            since = last.seq;
                            if page.iter().any(|e| {
                                [EventKind::Script, EventKind::Kernel, EventKind::Initramfs]
                                    .iter()
                                    .any(|k| k.as_str() == e.kind)
                            }) {
                                return Ok(true);
                            }
                        }
                    })
                    .await
                    .unwrap_or(false);
                let s = ProbeState {
                    talos_booted: booted,
                    misses: 0,
                    next_at: tokio::time::Instant::now(),
                };
                self.inner
                    .probes
                    .lock()
                    .expect("probe table lock")
                    .insert(name.to_owned(), s.clone());
                s
            }
        };
        state.talos_booted && tokio::time::Instant::now() >= state.next_at
    }

    /// A Talos boot of `name` was seen: probe it now, and from the shortest pause again.
    fn mark_talos_booted(&self, name: &str) {
        self.inner.probes.lock().expect("probe table lock").insert(
            name.to_owned(),
            ProbeState {
                talos_booted: true,
                misses: 0,
                next_at: tokio::time::Instant::now(),
            },
        );
    }

    /// Steps one node until it has to wait for something (or fails).
    pub async fn drive_node(&self, name: &str) {
        for _ in 0..8 {
            match self.step_node(name).await {
                Ok(NodeStep::Advanced(_)) => continue,
                Ok(NodeStep::Waiting(_) | NodeStep::Settled) => return,
                Err(e) => {
                    tracing::warn!(node = name, error = %e, "provisioning step failed");
                    return;
                }
            }
        }
    }
}

/// The node fetched something only a Talos network boot fetches from talboot.
fn is_talos_boot(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Script | EventKind::Kernel | EventKind::Initramfs
    )
}

fn is_boot_signal(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::DhcpAck | EventKind::Script | EventKind::Kernel | EventKind::Initramfs
    )
}
