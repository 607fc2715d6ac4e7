//! The run loop: the provisioner as the one writer of node records while it runs. Boot
//! events and operator commands become the core's observations here, Talos calls run
//! concurrently (at most one per node) and their results come back here, and the cluster
//! steps run in a task of their own.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::commands::{Command, CommandError, recv_command};
use super::{NodeStep, ProvisionError, Provisioner, StepOutcome, core, node, steps};
use crate::events::EventKind;
use crate::inventory::Node;

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

impl Provisioner {
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
                    Ok(ev) if is_boot_signal(ev.kind) => {
                        self.boot_signal(&mut w, &ev.node, is_talos_boot(ev.kind)).await;
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
        // Joined, not only aborted: an aborted task's future (with its handles on the store)
        // is dropped only when the runtime next polls it, and whoever reopens the state
        // directory after `run` returns must find it closed.
        w.calls.abort_all();
        while w.calls.join_next().await.is_some() {}
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

    /// A boot signal of an inventory node (a Talos boot when `talos`): noted, and the node
    /// stepped when a probe is due.
    async fn boot_signal(&self, w: &mut Writer, name: &str, talos: bool) {
        if self.inner.inventory.node(name).is_none() {
            return;
        }
        self.note_booting_in(w, name).await;
        if talos {
            self.mark_talos_booted(name);
        }
        if self.probe_due(name).await {
            w.enqueue(name);
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
            Command::TalosBootElsewhere { node } => self.boot_signal(w, &node, true).await,
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
        self.chain_ended(&name, state.rec.phase);
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
        EventKind::Script | EventKind::Kernel | EventKind::Initramfs | EventKind::Uki
    )
}

fn is_boot_signal(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::DhcpAck
            | EventKind::Script
            | EventKind::Kernel
            | EventKind::Initramfs
            | EventKind::Uki
    )
}
