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

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::events::{EventBus, EventKind};
use crate::inventory::{Inventory, Node};
use crate::store::{NodePhase, NodeRecord, Store, StoreError};
use crate::talos::retry::RetryPolicy;
use crate::talos::{ClientCreds, Deadlines, TalosClient, TalosError};

pub use cluster::{ClusterProgress, HealthReport};
pub use node::NodeStep;
pub use steps::{ClusterStep, StepOutcome};

/// Turns an inventory node into its machine config (multi-document YAML). The real renderer
/// is `machineconfig::render`; tests provide their own.
pub trait ConfigRenderer: Send + Sync {
    /// The complete machine config for `node`, or why it cannot be made (shown to the
    /// operator as is).
    fn render(&self, node: &Node) -> Result<Vec<u8>, String>;
}

/// Renders machine configs from the inventory and the decrypted secrets bundle.
pub struct BundleRenderer {
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
    fn render(&self, node: &Node) -> Result<Vec<u8>, String> {
        let bundle =
            crate::machineconfig::render::render_node(&self.inventory, &self.secrets, node)
                .map_err(|e| e.to_string())?;
        bundle
            .to_yaml()
            .map(String::into_bytes)
            .map_err(|e| e.to_string())
    }
}

/// Knobs of the provisioner; [`Settings::new`] gives production defaults.
#[derive(Clone, Debug)]
pub struct Settings {
    /// TCP port of apid on every node (50000; tests may move it).
    pub apid_port: u16,
    /// Where the kubeconfig is written.
    pub state_dir: PathBuf,
    /// How long a node may take from ApplyConfiguration until it runs installed from disk
    /// (machine stage `running`).
    pub install_timeout: Duration,
    /// How long a rebuilt node may take from the Reset reply until its maintenance API
    /// answers; past it the rebuild is Failed (the reset did not happen).
    pub reset_timeout: Duration,
    /// Longest pause between maintenance probes of a node that booted Talos but does not
    /// answer yet (the pause doubles from `poll_interval` up to this).
    pub probe_backoff_max: Duration,
    /// How long the health wait may take, in total.
    pub health_timeout: Duration,
    /// Pause between polls of nodes and between health checks.
    pub poll_interval: Duration,
    /// Retry policy of idempotent Talos calls (none by default: the next poll is the retry,
    /// and a step never blocks the loop on one slow node).
    pub retry: RetryPolicy,
    /// Per-call deadlines.
    pub deadlines: Deadlines,
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
pub fn probe_backoff(poll: Duration, misses: u32, max: Duration) -> Duration {
    poll.saturating_mul(1u32 << misses.min(16))
        .min(max.max(poll))
}

/// The provisioner: inventory, store, bus, renderer and admin credentials. Cheap to clone.
#[derive(Clone)]
pub struct Provisioner {
    inner: Arc<Inner>,
}

struct Inner {
    /// Which nodes booted Talos and when each may be probed next (run loop only).
    probes: std::sync::Mutex<std::collections::HashMap<String, ProbeState>>,
    inventory: Arc<Inventory>,
    store: Arc<dyn Store>,
    bus: EventBus,
    renderer: Arc<dyn ConfigRenderer>,
    creds: ClientCreds,
    settings: Settings,
}

impl Provisioner {
    /// A provisioner over `store`; nothing happens until a step or [`Provisioner::run`].
    pub fn new(
        inventory: Arc<Inventory>,
        store: Arc<dyn Store>,
        bus: EventBus,
        renderer: Arc<dyn ConfigRenderer>,
        creds: ClientCreds,
        settings: Settings,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                probes: Default::default(),
                inventory,
                store,
                bus,
                renderer,
                creds,
                settings,
            }),
        }
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
        F: FnOnce(&dyn Store) -> Result<(), StoreError> + Send + 'static,
    {
        let bus = self.inner.bus.clone();
        self.db(move |s| {
            f(s)?;
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
            Ok(s.node(&owned)?.unwrap_or(NodeRecord {
                name: owned.clone(),
                phase: NodePhase::Unknown,
                phase_since_unix: now,
                last_seen_addr: None,
                mac: None,
                talos_version: None,
                provisioning_window_open: true,
                updated_at_unix: now,
            }))
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
        _rec: &NodeRecord,
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

    /// Drives every node that is not settled, one step at a time until it waits, then the
    /// cluster steps (which include the health wait, so they run in their own task).
    /// Reacts at once to boot events of inventory nodes (`dhcp.ack`, `http.*`) and polls the
    /// rest every `poll_interval`. Returns when `cancel` fires.
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
        let mut events = self.inner.bus.subscribe();
        let mut tick = tokio::time::interval(self.settings().poll_interval);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                ev = events.recv() => match ev {
                    Ok(ev) if is_boot_signal(ev.kind) && self.inner.inventory.node(&ev.node).is_some() => {
                        self.note_booting(&ev.node).await;
                        if is_talos_boot(ev.kind) {
                            self.mark_talos_booted(&ev.node);
                        }
                        if self.probe_due(&ev.node).await {
                            self.drive_polled(&ev.node).await;
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "provisioner fell behind the event bus; polling catches up");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                _ = tick.tick() => {
                    let names: Vec<String> = self.inner.inventory.nodes.iter().map(|n| n.name.to_string()).collect();
                    for name in names {
                        if cancel.is_cancelled() { break; }
                        if self.probe_due(&name).await {
                            self.drive_polled(&name).await;
                        }
                    }
                }
            }
        }
        cluster.abort();
        let _ = cluster.await;
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
        let _ = self.observe(&node, &state, core::Observation::BootSeen).await;
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

    /// [`Provisioner::drive_node`], then the backoff: a node still Unknown/Booting afterwards
    /// did not answer, so its next probe waits longer.
    async fn drive_polled(&self, name: &str) {
        self.drive_node(name).await;
        let phase = self.record(name).await.map(|r| r.phase);
        let mut probes = self.inner.probes.lock().expect("probe table lock");
        let Some(state) = probes.get_mut(name) else {
            return;
        };
        if matches!(phase, Ok(NodePhase::Unknown | NodePhase::Booting)) {
            state.misses = state.misses.saturating_add(1);
            state.next_at = tokio::time::Instant::now()
                + probe_backoff(
                    self.settings().poll_interval,
                    state.misses,
                    self.settings().probe_backoff_max,
                );
        } else {
            state.misses = 0;
        }
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
