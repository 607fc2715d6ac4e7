//! Push provisioning: from "this MAC booted" to a configured Talos node, then the cluster
//! steps (bootstrap once, health, kubeconfig).
//!
//! * [`disks`]: the pure install-disk check (path exists, or the selector matches exactly
//!   one disk; otherwise a refusal that lists every disk).
//! * [`node`]: the per-node state machine over the persisted
//!   [`NodePhase`](crate::store::NodePhase)s
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
//!
//! The rest is the provisioner's plumbing, one job per child: [`Settings`], the run loop
//! (`run`), when a booting node is probed (`probes`), operator [`Command`]s, what is asked
//! of power controllers (`power_actions`), the boot observers for when no provisioner runs
//! ([`OfflineObserver`]), the production config renderer, and [`ProvisionError`].

pub mod cluster;
mod commands;
pub mod core;
pub mod disks;
mod error;
pub mod node;
mod observers;
mod power_actions;
mod probes;
mod renderer;
mod run;
pub mod secure_boot;
mod settings;
pub mod steps;
pub mod up;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use crate::events::{EventBus, EventKind};
use crate::inventory::{Inventory, Node};
use crate::machineconfig::renderer::ConfigRenderer;
use crate::store::{NodeRecord, NodeWriter, ProgressWriter, Store, StoreError};
use crate::talos::{ClientCreds, TalosClient, TalosError};
use crate::view;

pub use cluster::{ClusterProgress, HealthReport};
pub use commands::{Command, CommandError};
pub(crate) use commands::{CommandReceiver, CommandSender, Rebuilds, command_channel};
pub use error::ProvisionError;
pub use node::NodeStep;
pub use observers::{OfflineObserver, ProvisionerObserves};
pub(crate) use renderer::BundleRenderer;
pub use settings::{DEFAULT_CONCURRENCY, Settings};
pub use steps::StepOutcome;

use probes::ProbeState;

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
}
