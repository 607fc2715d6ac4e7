//! The provisioning listener's boot observers, and the core's node rules applied without a
//! run loop. While a provisioner runs it is the only writer of node records and the listener
//! only publishes ([`ProvisionerObserves`]); when none runs (pull delivery, no push
//! provisioning) [`OfflineObserver`] is the writer and feeds the same core.

use std::sync::Arc;
use std::time::Duration;

use super::core;
use crate::inventory::{Inventory, Node};
use crate::store::{NodeRecord, NodeWriter, Store, StoreError};
use crate::view;

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

/// Why an offline rebuild was not recorded (its Display is what the admin API answers).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OfflineRebuildError {
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The blocking store task died.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
}

impl OfflineObserver {
    /// An operator's rebuild of `node` at `now`, when no provisioner runs: the core's rules
    /// applied here, by the node records' writer. `Ok(Some(_))` is the core's refusal; `Err`
    /// is a store failure.
    pub(crate) async fn rebuild(
        &self,
        node: String,
        now: u64,
    ) -> Result<Option<core::RebuildRefused>, OfflineRebuildError> {
        let (store, nodes, inv, view) = (
            self.store.clone(),
            self.nodes.clone(),
            self.inventory.clone(),
            self.view.clone(),
        );
        let done = tokio::task::spawn_blocking(move || {
            let rec = store
                .node(&node)?
                .unwrap_or_else(|| NodeRecord::unseen(&node, now));
            if let Err(r) = core::check_rebuild(&rec) {
                return Ok(Some(r));
            }
            observe_offline(
                store.as_ref(),
                &nodes,
                &inv,
                &node,
                vec![core::Observation::RebuildRequested],
                now,
                Some(&view),
            )
            .map(|()| None)
        })
        .await;
        Ok(done??)
    }
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
