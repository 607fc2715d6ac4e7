//! The per-node push state machine's adapter: the Talos calls behind the effects of
//! [`super::core`], and the persistence of what the core decides.
//!
//! Phases are persisted in the node's [`NodeRecord`] (with its [`Lifecycle`]);
//! [`Provisioner::step_node`] reads them, asks the core what now, performs the calls and
//! feeds their outcomes back, writing each new state before the next call, so a restart
//! anywhere resumes from the last persisted phase:
//!
//! | phase | step |
//! |---|---|
//! | Unknown / Booting | probe `<lease ip>:50000` without a client cert: answers → Maintenance; asks for a cert → already configured (Ready if the secured API answers) |
//! | Maintenance | read version, disks, system information; record them; check the install disk; render; persist Configuring; ApplyConfiguration (mode AUTO) once; → Installing |
//! | Configuring | the apply's outcome is unknown (restart or lost reply): maintenance still answering with machine type `unknown` → Maintenance (the node has no config, applying again is safe); a machine type, or the maintenance API gone → Installing |
//! | Installing | secured API (directly, or relayed through the bootstrap control plane) reports machine stage `running` → Ready; a failed `install` sequence in its events, a Talos v1.14 `UnattendedInstallStatus` in phase `failed` (see [`unattended`]), or the node back in maintenance mode after its secured API was seen, → Failed with the cause; past the install timeout → Failed |
//! | Rebuilding | secured API answers → Reset (wipe STATE+EPHEMERAL, reboot; graceful unless it is the last voting etcd member) and the time is recorded; then maintenance answers → Maintenance; a failed `reset` sequence or no maintenance API within the reset timeout → Failed |
//!
//! Why the machine stage and not the first secured answer: once a config lands in
//! maintenance mode, Talos issues its API certificates from the config's CA
//! (siderolabs/talos v1.13.9 `internal/app/machined/pkg/controllers/secrets/api.go`) and
//! restarts apid with mutual TLS (`internal/app/machined/pkg/controllers/runtime/api_service_config.go`)
//! while the install sequence (`internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go`,
//! `Install`) is still pulling the installer. `runtime.MachineStatus`
//! (`pkg/machinery/resources/runtime/machine_status.go`) has stage `installing` during the
//! install, `rebooting` at its kexec or after a fatal error, and `running` only once the
//! `boot` sequence of the system booted from disk finished
//! (`internal/app/machined/pkg/controllers/runtime/machine_status.go`). Its `ready` flag is
//! not used: it is true in every stage but booting/running, and in running it waits for the
//! Kubernetes node to be Ready (CNI), which comes after bootstrap.
//!
//! ApplyConfiguration is only made while the node's provisioning window is open (new node,
//! or marked for rebuild), and the window closes once the config is applied.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::core::{self, Binding, Effect, FailCause, NodeCtx, NodeState, Observation, Outcome};
use super::disks;

mod disk_cel;
mod gate;
mod unattended;
use super::{ProvisionError, Provisioner};
use crate::events::EventKind;
use crate::inventory::Node;
use crate::store::{DiskFacts, Lifecycle, NodeFacts, NodePart, NodePhase, NodeWrite};
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::api::talos::resource::definitions::runtime::RuntimeMachineStage as MachineStage;
use crate::talos::{TalosClient, TalosError};

/// What one step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeStep {
    /// The node moved to this phase; step again.
    Advanced(NodePhase),
    /// Nothing to do until something changes (the reason says what).
    Waiting(String),
    /// Ready or Failed: nothing more to do without operator action.
    Settled,
}

/// How long a failed sequence's events are read for (the stream never ends by itself).
const EVENTS_IDLE: Duration = Duration::from_millis(300);

/// The stage as Talos prints it.
pub(super) fn stage_name(stage: MachineStage) -> &'static str {
    match stage {
        MachineStage::MachineStageUnknown => "unknown",
        MachineStage::MachineStageBooting => "booting",
        MachineStage::MachineStageInstalling => "installing",
        MachineStage::MachineStageMaintenance => "maintenance",
        MachineStage::MachineStageRunning => "running",
        MachineStage::MachineStageRebooting => "rebooting",
        MachineStage::MachineStageShuttingDown => "shutting down",
        MachineStage::MachineStageResetting => "resetting",
        MachineStage::MachineStageUpgrading => "upgrading",
    }
}

fn version_tag(v: &crate::talos::api::machine::Version) -> String {
    v.version
        .as_ref()
        .map(|i| i.tag.clone())
        .unwrap_or_else(|| "unknown".into())
}

/// What an I/O call keeps besides its outcome: the error behind a failure (for the typed
/// error), and what the next call of the same chain reuses (the rendered config, the
/// secured client a reset goes through).
#[derive(Default)]
pub(crate) struct Carry {
    /// The Talos error behind a failure outcome.
    pub(crate) talos: Option<TalosError>,
    /// The disk refusal behind [`Outcome::DiskRefused`].
    pub(crate) disk: Option<disks::DiskRefusal>,
    /// The Secure Boot refusal behind [`Outcome::SecureBootRefused`].
    pub(crate) secure_boot: Option<super::secure_boot::Refusal>,
    /// The config rendered after the facts passed (for the Apply that follows).
    pub(crate) config: Option<std::sync::Arc<Vec<u8>>>,
    /// The secured client a reset goes through.
    pub(crate) client: Option<TalosClient>,
}

/// How a chain of effects ended, for [`NodeStep`].
#[derive(Default)]
pub(crate) struct Ending {
    pub(crate) again: bool,
    pub(crate) wait: Option<String>,
    pub(crate) fail: Option<(String, FailCause)>,
    pub(crate) error: Option<String>,
}

impl Provisioner {
    /// The core's view of the node: inventory facts and the settings' deadlines.
    pub(crate) fn node_ctx(&self, node: &Node) -> NodeCtx {
        NodeCtx {
            macs: node.macs.iter().map(|m| m.value).collect(),
            control_plane: self
                .inventory()
                .control_planes()
                .any(|cp| cp.name.as_str() == node.name.as_str()),
            install_timeout: self.settings().install_timeout,
            reset_timeout: self.settings().reset_timeout,
            disk_boot: self
                .settings()
                .power
                .get(node.name.as_str())
                .is_some_and(|d| d.can_set_boot_device()),
        }
    }

    /// The node's persisted state (record and lifecycle), nothing in flight.
    pub(crate) async fn load_state(&self, name: &str) -> Result<NodeState, ProvisionError> {
        let rec = self.record(name).await?;
        let life = self.lifecycle(name).await?;
        Ok(NodeState::from_persisted(rec, life))
    }

    /// The DHCP binding of the node now, as the core sees it.
    pub(crate) async fn binding(&self, node: &Node) -> Result<Option<Binding>, ProvisionError> {
        Ok(self
            .address_of(node)
            .await?
            .and_then(|(ip, mac)| mac.map(|mac| Binding { mac, ip })))
    }

    /// Feeds `obs` to the core; persists the state when its persisted part changed, and the
    /// phase events with it (one blocking task, so a stop cannot separate them); returns the
    /// new state and the remaining effects.
    pub(crate) async fn observe(
        &self,
        node: &Node,
        state: &NodeState,
        obs: Observation,
    ) -> Result<(NodeState, Vec<Effect>), ProvisionError> {
        let mut out = self.observe_many(vec![(node, state, obs)]).await?;
        Ok(out.pop().expect("one observation, one result"))
    }

    /// [`Provisioner::observe`] for several nodes at once: every state that changed is
    /// written in one transaction (group commit: one fsync for the lot), with its phase
    /// events.
    pub(crate) async fn observe_many(
        &self,
        batch: Vec<(&Node, &NodeState, Observation)>,
    ) -> Result<Vec<(NodeState, Vec<Effect>)>, ProvisionError> {
        let now = self.now();
        let mut writes = Vec::new();
        let mut phases = Vec::new();
        let mut out = Vec::with_capacity(batch.len());
        for (node, state, obs) in batch {
            let (mut next, effects) = core::step(state, obs, now, &self.node_ctx(node));
            if next.persisted_differs(state) {
                next.rec.updated_at_unix = now;
                let parts = if next.life != state.life {
                    let json = serde_json::to_vec(&next.life).expect("lifecycle record serialises");
                    vec![(NodePart::Lifecycle, json)]
                } else {
                    Vec::new()
                };
                writes.push(NodeWrite {
                    name: next.rec.name.clone(),
                    record: Some(next.rec.clone()),
                    parts,
                });
                for e in &effects {
                    if let Effect::Phase { from, to, why } = e {
                        phases.push((next.rec.name.clone(), format!("{from} -> {to}: {why}")));
                    }
                }
            }
            out.push((next, effects));
        }
        if !writes.is_empty() {
            let bus = self.inner.bus.clone();
            // Records, lifecycles and their phase events in one blocking task: a stop cannot
            // separate a persisted transition from its timeline line.
            let view = self.inner.view.get().cloned();
            self.write(move |w| {
                // The view hears of the commit before and after it (it fails closed
                // meanwhile: a node with a commit in flight has its window closed).
                if let Some(v) = &view {
                    v.begin_nodes(&writes);
                }
                let done = w.nodes.put_node_states(&writes);
                if let Some(v) = &view {
                    v.end_nodes(&writes, done.is_ok());
                }
                done?;
                for (name, p) in phases {
                    bus.publish(&name, EventKind::Phase, p);
                }
                Ok(())
            })
            .await?;
        }
        Ok(out)
    }

    /// One step of node `name`: its binding, then "what now?" to the core, and the calls
    /// that follow until the core waits (see the module docs).
    pub async fn step_node(&self, name: &str) -> Result<NodeStep, ProvisionError> {
        let node = self.node_def(name)?.clone();
        let state = self.load_state(name).await?;
        let bound = self.binding(&node).await?;
        let (state, _) = self
            .observe(&node, &state, Observation::Binding(bound))
            .await?;
        let (state, effects) = self.observe(&node, &state, Observation::Poll).await?;
        self.drive_effects(&node, state, effects).await
    }

    /// Performs `effects` (and those their results bring) in order, then says how it ended.
    async fn drive_effects(
        &self,
        node: &Node,
        mut state: NodeState,
        effects: Vec<Effect>,
    ) -> Result<NodeStep, ProvisionError> {
        let mut queue: std::collections::VecDeque<Effect> = effects.into();
        let mut ending = Ending::default();
        let mut carry = Carry::default();
        while let Some(e) = queue.pop_front() {
            if let Some(call) = e.call() {
                let prev = std::mem::take(&mut carry);
                let (outcome, c) = self.perform_call(node, &e, prev).await?;
                carry = c;
                let obs = Observation::Result {
                    op: call.op,
                    at: call.ip,
                    outcome,
                };
                let (next, more) = self.observe(node, &state, obs).await?;
                state = next;
                queue.extend(more);
                continue;
            }
            self.note_effect(node.name.as_str(), e, &mut ending).await?;
        }
        self.ending(node.name.as_str(), &state, ending, carry)
    }

    /// The bookkeeping effects (events, the bootstrap reset), and how the chain ends.
    pub(crate) async fn note_effect(
        &self,
        name: &str,
        e: Effect,
        ending: &mut Ending,
    ) -> Result<(), ProvisionError> {
        match e {
            Effect::Event { kind, detail } => self.event(name, kind, detail),
            Effect::ForgetBootstrap => self.forget_bootstrap(name).await?,
            Effect::SetDiskBoot => self.set_disk_boot(name),
            Effect::Again => ending.again = true,
            Effect::Wait { reason } => ending.wait = Some(reason),
            Effect::Fail { reason, cause } => ending.fail = Some((reason, cause)),
            Effect::Error { why } => ending.error = Some(why),
            // Published with the state write.
            Effect::Phase { .. } => {}
            _ => {}
        }
        Ok(())
    }

    /// The step's result from how its chain ended.
    pub(crate) fn ending(
        &self,
        name: &str,
        state: &NodeState,
        ending: Ending,
        carry: Carry,
    ) -> Result<NodeStep, ProvisionError> {
        let node = name.to_owned();
        if let Some((reason, cause)) = ending.fail {
            return Err(match cause {
                FailCause::Disk => match carry.disk {
                    Some(source) => ProvisionError::Disk { node, source },
                    None => ProvisionError::Step { node, why: reason },
                },
                FailCause::SecureBoot => match carry.secure_boot {
                    Some(source) => ProvisionError::SecureBoot { node, source },
                    None => ProvisionError::Step { node, why: reason },
                },
                FailCause::Render => ProvisionError::Render {
                    node,
                    reason: reason
                        .strip_prefix("config not rendered: ")
                        .unwrap_or(&reason)
                        .to_owned(),
                },
                FailCause::Talos => match carry.talos {
                    Some(source) => ProvisionError::Talos { node, source },
                    None => ProvisionError::Step { node, why: reason },
                },
                FailCause::InstallFailed(cause) => ProvisionError::InstallFailed { node, cause },
                FailCause::InstallTimeout => ProvisionError::InstallTimeout {
                    node,
                    after: self.settings().install_timeout,
                },
                FailCause::ResetFailed(cause) => ProvisionError::ResetFailed { node, cause },
            });
        }
        if let Some(why) = ending.error {
            return Err(match carry.talos {
                Some(source) => ProvisionError::Talos { node, source },
                None => ProvisionError::Step { node, why },
            });
        }
        if ending.again {
            return Ok(NodeStep::Advanced(state.rec.phase));
        }
        if let Some(why) = ending.wait {
            return Ok(NodeStep::Waiting(why));
        }
        Ok(NodeStep::Settled)
    }

    pub(super) fn talos_err(&self, node: &str, source: TalosError) -> ProvisionError {
        ProvisionError::Talos {
            node: node.to_owned(),
            source,
        }
    }

    /// A maintenance-mode client for node `name` at `ip`.
    fn maintenance_probe(&self, name: &str, ip: Ipv4Addr) -> Result<TalosClient, ProvisionError> {
        self.maintenance_client(ip)
            .map_err(|e| self.talos_err(name, e))
    }

    /// The node's [`Lifecycle`] record.
    pub(crate) async fn lifecycle(&self, name: &str) -> Result<Lifecycle, ProvisionError> {
        let name = name.to_owned();
        self.db(move |s| Lifecycle::load(s, &name)).await
    }

    /// Performs one call effect of the core: the Talos calls, their events, and what they
    /// found as an [`Outcome`].
    pub(crate) async fn perform_call(
        &self,
        node: &Node,
        effect: &Effect,
        carry: Carry,
    ) -> Result<(Outcome, Carry), ProvisionError> {
        let name = node.name.to_string();
        let mut out = Carry::default();
        let outcome = match *effect {
            Effect::Probe { ip, .. } => self.io_probe(&name, ip).await?,
            Effect::ReadFacts { ip, .. } => self.io_read_facts(node, ip, &mut out).await?,
            Effect::Apply { ip, .. } => self.io_apply(node, ip, carry, &mut out).await?,
            Effect::ResolveApply { ip, .. } => {
                let client = self.maintenance_probe(&name, ip)?;
                match client.version().await {
                    // The maintenance API answering does not mean the config did not land:
                    // apid keeps serving maintenance mode for a moment after the apply
                    // (until the acquire controller tears the maintenance service down),
                    // and a second apply then is refused. The machine type is what tells.
                    Ok(v) => match client.machine_type().await {
                        Ok(t) if t == "unknown" => Outcome::Maintenance {
                            version: version_tag(&v),
                        },
                        Ok(_) => Outcome::LeftMaintenance,
                        Err(TalosError::NotInMaintenance { .. }) => Outcome::LeftMaintenance,
                        Err(e) => Outcome::NoAnswer {
                            why: format!("machine type unreadable in maintenance mode: {e}"),
                        },
                    },
                    Err(TalosError::NotInMaintenance { .. }) => Outcome::LeftMaintenance,
                    Err(e) => Outcome::NoAnswer { why: e.to_string() },
                }
            }
            Effect::WatchInstall { ip, .. } => self.io_watch_install(&name, ip, &mut out).await?,
            Effect::PrepareReset { ip, .. } => self.io_prepare_reset(node, ip, &mut out).await?,
            Effect::Reset { ip, graceful, .. } => {
                self.io_reset(&name, ip, graceful, carry, &mut out).await?
            }
            Effect::WatchReset { ip, .. } => self.io_watch_reset(&name, ip).await?,
            _ => unreachable!("perform_call gets call effects only"),
        };
        Ok((outcome, out))
    }

    async fn io_probe(&self, name: &str, ip: Ipv4Addr) -> Result<Outcome, ProvisionError> {
        let client = self.maintenance_probe(name, ip)?;
        Ok(match client.version().await {
            Ok(v) => {
                let tag = version_tag(&v);
                self.event(
                    name,
                    EventKind::Talos,
                    format!("Version at {} (maintenance): {tag}", client.endpoint()),
                );
                Outcome::Maintenance { version: tag }
            }
            // It holds a config already: nothing to push.
            Err(TalosError::NotInMaintenance { .. }) => {
                match self.secured_version(name, ip).await {
                    Ok(tag) => Outcome::Configured { version: tag },
                    Err(e) => Outcome::ConfiguredUnusable { why: e.to_string() },
                }
            }
            Err(e) => {
                self.event(
                    name,
                    EventKind::Talos,
                    format!("Version at {} (maintenance) failed: {e}", client.endpoint()),
                );
                Outcome::NoAnswer { why: e.to_string() }
            }
        })
    }

    async fn io_read_facts(
        &self,
        node: &Node,
        ip: Ipv4Addr,
        out: &mut Carry,
    ) -> Result<Outcome, ProvisionError> {
        let name = node.name.to_string();
        let client = self.maintenance_probe(&name, ip)?;
        // Before anything else: a secure-boot node that fails the gate gets no config, not
        // even a rendered one.
        if let Some(stop) = self.secure_boot_gate(node, &client, out).await {
            return Ok(stop);
        }
        let facts = match self.read_facts(&name, &client).await {
            Ok(f) => f,
            // It left maintenance behind our back (someone else configured it).
            Err(TalosError::NotInMaintenance { .. }) => return Ok(Outcome::LeftMaintenance),
            Err(e) if e.is_transient() => return Ok(Outcome::NoAnswer { why: e.to_string() }),
            Err(e) => {
                let why = e.to_string();
                out.talos = Some(e);
                return Ok(Outcome::CallFailed { why });
            }
        };
        let (install_disk, how) = match self.pick_install_disk(node, &facts, out) {
            Ok(p) => p,
            Err(stop) => return Ok(stop),
        };
        let chosen = facts
            .disks
            .iter()
            .find(|d| d.dev_path == install_disk)
            .map(disks::describe)
            .unwrap_or_else(|| install_disk.clone());
        self.event(
            &name,
            EventKind::Talos,
            format!(
                "install disk {}: Talos will install to {install_disk} ({how}): {chosen}",
                node.install,
            ),
        );
        let facts = NodeFacts {
            install_disk: install_disk.clone(),
            ..facts
        };
        let json =
            serde_json::to_vec(&facts).map_err(|source| crate::store::StoreError::Encode {
                what: format!("facts of node {name}"),
                source,
            })?;
        let write = NodeWrite {
            name: name.clone(),
            record: None,
            parts: vec![(NodePart::Facts, json)],
        };
        self.write(move |w| w.nodes.put_node_states(&[write]))
            .await?;
        if out.config.is_none() {
            match self.inner.renderer.render(node) {
                Ok(c) => out.config = Some(std::sync::Arc::new(c)),
                Err(e) => return Ok(Outcome::RenderFailed { why: e.to_string() }),
            }
        }
        Ok(Outcome::FactsOk { install_disk })
    }

    /// The disk Talos will install to on this node and how talboot knows (for the event), or
    /// the outcome that stops the step. Below v1.14 that is talboot's reading of the legacy
    /// install rules; from v1.14 on, the config is rendered first and every CEL disk
    /// selector in it (install and volumes) is evaluated against the reported disks, so
    /// what is checked is exactly what the node receives (the config is kept in `out`).
    fn pick_install_disk(
        &self,
        node: &Node,
        facts: &NodeFacts,
        out: &mut Carry,
    ) -> Result<(String, String), Outcome> {
        let cel = crate::talosfacts::contract::Contract::for_version(
            &self.inventory().cluster.talos_version.value.0,
        )
        .is_some_and(|c| c.unattended_install_config());
        if !cel {
            let how = match node.install {
                crate::inventory::InstallTarget::Disk(_) => "the disk with that path or link",
                crate::inventory::InstallTarget::Selector(_) => "the only matching disk",
            };
            return match disks::choose_install_disk(&node.install, &facts.disks) {
                Ok(d) => Ok((d, how.to_owned())),
                Err(refusal) => {
                    let why = refusal.to_string();
                    out.disk = Some(refusal);
                    Err(Outcome::DiskRefused { why })
                }
            };
        }
        let config = match self.inner.renderer.render(node) {
            Ok(c) => c,
            Err(e) => return Err(Outcome::RenderFailed { why: e.to_string() }),
        };
        let picks = disk_cel::check_rendered(&config, &facts.disks)
            .map_err(|e| Outcome::DiskRefused { why: e.to_string() })?;
        for (what, choice) in &picks.volumes {
            self.event(
                node.name.as_str(),
                EventKind::Talos,
                format!(
                    "{what}: Talos will place it on {} (the only disk its selector picks)",
                    choice.disk
                ),
            );
        }
        out.config = Some(std::sync::Arc::new(config));
        Ok((
            picks.install.disk,
            "the only disk the UnattendedInstallConfig selector matches".to_owned(),
        ))
    }

    async fn io_apply(
        &self,
        node: &Node,
        ip: Ipv4Addr,
        carry: Carry,
        out: &mut Carry,
    ) -> Result<Outcome, ProvisionError> {
        let name = node.name.to_string();
        let client = self.maintenance_probe(&name, ip)?;
        let config = match carry.config {
            Some(c) => c,
            None => match self.inner.renderer.render(node) {
                Ok(c) => std::sync::Arc::new(c),
                Err(e) => return Ok(Outcome::RenderFailed { why: e.to_string() }),
            },
        };
        Ok(match client.apply_configuration(&config).await {
            Ok(outcome) => {
                let used = outcome
                    .mode
                    .map(|m| m.as_str_name().to_owned())
                    .unwrap_or_else(|| "unknown".into());
                self.event(
                    &name,
                    EventKind::ConfigReleased,
                    format!(
                        "ApplyConfiguration mode={} to {}: node used {used}: {}",
                        Mode::Auto.as_str_name(),
                        client.endpoint(),
                        outcome.mode_details
                    ),
                );
                for w in &outcome.warnings {
                    self.event(&name, EventKind::Talos, format!("config warning: {w}"));
                }
                Outcome::ApplyAccepted
            }
            Err(e) => {
                self.event(
                    &name,
                    EventKind::Talos,
                    format!("ApplyConfiguration to {} failed: {e}", client.endpoint()),
                );
                match &e {
                    // The node validated and refused the config: nothing will change by itself.
                    TalosError::Remote { code, .. } if *code == tonic::Code::InvalidArgument => {
                        let why = e.to_string();
                        out.talos = Some(e);
                        Outcome::ApplyRefused { why }
                    }
                    // Lost reply or busy node: Configuring resolves it on the next step.
                    _ => Outcome::ApplyLost { why: e.to_string() },
                }
            }
        })
    }

    async fn io_watch_install(
        &self,
        name: &str,
        ip: Ipv4Addr,
        out: &mut Carry,
    ) -> Result<Outcome, ProvisionError> {
        let (client, tag) = match self.secured_route_quiet(name, ip, true).await {
            Ok(route) => route,
            Err(e @ TalosError::WrongCa { .. }) => {
                // Either in maintenance mode (throwaway CA) or our CA is not the cluster's.
                let probe = self.maintenance_probe(name, ip)?;
                return Ok(match probe.version().await {
                    Ok(_) => Outcome::BackInMaintenance,
                    Err(TalosError::NotInMaintenance { .. }) => {
                        // apid may have restarted between the two calls (maintenance → mTLS
                        // right after the apply): only a second secured failure means our CA
                        // is not the cluster's.
                        match self.secured_route_quiet(name, ip, true).await {
                            Err(e @ TalosError::WrongCa { .. }) => {
                                let why = e.to_string();
                                out.talos = Some(e);
                                Outcome::WrongCa { why }
                            }
                            Err(e) => Outcome::NoAnswer { why: e.to_string() },
                            Ok(_) => Outcome::JustRestarted,
                        }
                    }
                    Err(_) => Outcome::NoAnswer { why: e.to_string() },
                });
            }
            Err(e) => return Ok(Outcome::NoAnswer { why: e.to_string() }),
        };
        let status = match client.machine_status().await {
            Ok(s) => s,
            Err(e) => {
                self.event(
                    name,
                    EventKind::Talos,
                    format!("MachineStatus at {} failed: {e}", client.target()),
                );
                return Ok(Outcome::StatusUnknown { why: e.to_string() });
            }
        };
        let stage = status.stage();
        self.event(
            name,
            EventKind::Talos,
            format!(
                "MachineStatus at {}: stage {}",
                client.target(),
                stage_name(stage)
            ),
        );
        if stage == MachineStage::MachineStageRunning {
            return Ok(Outcome::StageRunning { version: tag });
        }
        // A fatal sequence error sets the stage to rebooting (machine_status.go); the error
        // itself is in the node's events until it reboots.
        if stage == MachineStage::MachineStageRebooting {
            match client.sequence_failures(EVENTS_IDLE).await {
                Ok(failures) => {
                    if let Some(f) = failures.iter().rev().find(|f| f.sequence == "install") {
                        return Ok(Outcome::InstallFailed {
                            cause: f.message.clone(),
                        });
                    }
                }
                Err(e) => tracing::debug!(node = %name, error = %e, "Events unavailable"),
            }
        }
        // Talos v1.14's unattended install reports in its own resource, not the stage.
        Ok(unattended::outcome(&client, &tag, stage_name(stage)).await)
    }

    async fn io_prepare_reset(
        &self,
        node: &Node,
        ip: Ipv4Addr,
        out: &mut Carry,
    ) -> Result<Outcome, ProvisionError> {
        let name = node.name.to_string();
        // Secured first: a configured node is what a rebuild normally finds. Only when that
        // fails is the node perhaps already back in maintenance (an earlier reset landed).
        match self.secured_route(&name, ip).await {
            Ok((client, _)) => {
                let last_voter =
                    self.node_ctx(node).control_plane && self.is_last_voter(&client).await;
                out.client = Some(client);
                Ok(Outcome::ResetTarget { last_voter })
            }
            Err(secured_err) => {
                let probe = self.maintenance_probe(&name, ip)?;
                Ok(match probe.version().await {
                    Ok(v) => Outcome::Maintenance {
                        version: version_tag(&v),
                    },
                    Err(_) => Outcome::NoAnswer {
                        why: secured_err.to_string(),
                    },
                })
            }
        }
    }

    async fn io_reset(
        &self,
        name: &str,
        ip: Ipv4Addr,
        graceful: bool,
        carry: Carry,
        out: &mut Carry,
    ) -> Result<Outcome, ProvisionError> {
        let client = match carry.client {
            Some(c) => c,
            None => match self.secured_route(name, ip).await {
                Ok((c, _)) => c,
                Err(e) => {
                    let why = e.to_string();
                    out.talos = Some(e);
                    return Ok(Outcome::ResetRefused { why });
                }
            },
        };
        Ok(match client.reset(graceful, true).await {
            Ok(()) => {
                let how = if graceful {
                    "graceful".to_owned()
                } else {
                    "not graceful (last voting etcd member: it cannot leave etcd; the \
                     cluster's etcd is wiped with it and bootstrapped again)"
                        .to_owned()
                };
                self.event(
                    name,
                    EventKind::Talos,
                    format!(
                        "Reset at {}: {how}, wipe STATE+EPHEMERAL, reboot; waiting for it to \
                         go down and come back in maintenance mode",
                        client.target()
                    ),
                );
                Outcome::ResetAccepted
            }
            Err(e) => {
                self.event(
                    name,
                    EventKind::Talos,
                    format!("Reset at {} failed: {e}", client.target()),
                );
                let why = e.to_string();
                out.talos = Some(e);
                Outcome::ResetRefused { why }
            }
        })
    }

    /// The Reset RPC answered: the sequence runs on the node afterwards. Done only when the
    /// maintenance API answers (the node went down, wiped, and came back without a config);
    /// the old secured API answering means it is still resetting, or the sequence failed and
    /// it rebooted with its config.
    async fn io_watch_reset(&self, name: &str, ip: Ipv4Addr) -> Result<Outcome, ProvisionError> {
        let probe = self.maintenance_probe(name, ip)?;
        Ok(match probe.version().await {
            Ok(v) => Outcome::Maintenance {
                version: version_tag(&v),
            },
            Err(TalosError::NotInMaintenance { .. }) => {
                // Configured still: a failed reset sequence says why in the events.
                if let Ok((client, _)) = self.secured_route_quiet(name, ip, true).await
                    && let Ok(failures) = client.sequence_failures(EVENTS_IDLE).await
                    && let Some(f) = failures.iter().rev().find(|f| f.sequence == "reset")
                {
                    Outcome::ResetSequenceFailed {
                        cause: f.message.clone(),
                    }
                } else {
                    Outcome::StillConfigured
                }
            }
            Err(e) => Outcome::NoAnswer { why: e.to_string() },
        })
    }

    async fn read_facts(&self, name: &str, client: &TalosClient) -> Result<NodeFacts, TalosError> {
        let version = client.version().await?;
        let legacy = client.disks().await?;
        // COSI adds transport and symlinks; an older Talos without it still has the basics.
        let cosi = match client.cosi_disks().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(node = name, error = %e, "COSI disk list unavailable");
                Vec::new()
            }
        };
        // A machine without SMBIOS tables has no SystemInformation resource at all: a fact
        // recorded as absent, not a failure.
        let sys = client.system_information().await?;
        let disks = DiskFacts::collect(&legacy, &cosi);
        let system = match &sys {
            Some(s) => format!(
                "system {} {} uuid={}",
                s.manufacturer, s.product_name, s.uuid
            ),
            None => "no SMBIOS system information".to_owned(),
        };
        self.event(
            name,
            EventKind::Talos,
            format!(
                "maintenance facts from {}: Talos {}, {system}, {} disk(s): {}",
                client.endpoint(),
                version_tag(&version),
                disks.len(),
                disks
                    .iter()
                    .map(disks::describe)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
        Ok(NodeFacts {
            talos_version: version_tag(&version),
            system_uuid: sys.as_ref().map(|s| s.uuid.clone()),
            manufacturer: sys.as_ref().map(|s| s.manufacturer.clone()),
            product_name: sys.as_ref().map(|s| s.product_name.clone()),
            serial_number: sys.map(|s| s.serial_number),
            disks,
            install_disk: String::new(),
        })
    }

    /// Secured `Version` of the node at `ip` (see [`Provisioner::secured_route`]).
    pub(crate) async fn secured_version(
        &self,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<String, TalosError> {
        self.secured_route(name, ip).await.map(|(_, tag)| tag)
    }

    /// A secured client for node `name` at `ip` and the Talos version it reports: direct,
    /// or, when the node cannot be reached from here, relayed by the bootstrap control plane
    /// (`node` header) once that one is Ready. Publishes each call.
    pub(crate) async fn secured_route(
        &self,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<(TalosClient, String), TalosError> {
        self.secured_route_quiet(name, ip, false).await
    }

    /// [`Provisioner::secured_route`]; with `quiet`, a successful `Version` is not published
    /// (the caller publishes what it learns next, so a poll adds one line, not two).
    async fn secured_route_quiet(
        &self,
        name: &str,
        ip: Ipv4Addr,
        quiet: bool,
    ) -> Result<(TalosClient, String), TalosError> {
        let via = |s: &'static str| (s, quiet);
        let direct = self.secured_client(ip)?;
        let first = self.version_event(name, &direct, via("")).await;
        let err = match first {
            Ok(tag) => return Ok((direct, tag)),
            Err(e) => e,
        };
        let unreachable = matches!(
            err,
            TalosError::Unreachable { .. }
                | TalosError::TlsHandshake { .. }
                | TalosError::Timeout { .. }
        );
        if unreachable
            && let Ok(Some((relay_name, relay_ip))) = self.relay_node().await
            && relay_name != name
        {
            let relayed = self.secured_client(relay_ip)?.with_node(&ip.to_string())?;
            let tag = self
                .version_event(name, &relayed, via(" (relayed)"))
                .await?;
            return Ok((relayed, tag));
        }
        Err(err)
    }

    async fn version_event(
        &self,
        name: &str,
        client: &TalosClient,
        (via, quiet): (&str, bool),
    ) -> Result<String, TalosError> {
        let result = client.version().await;
        match &result {
            Ok(_) if quiet => {}
            Ok(v) => self.event(
                name,
                EventKind::Talos,
                format!(
                    "Version at {}{via} (secured): {}",
                    client.target(),
                    version_tag(v)
                ),
            ),
            Err(e) => {
                self.event(
                    name,
                    EventKind::Talos,
                    format!("Version at {}{via} (secured) failed: {e}", client.target()),
                );
            }
        }
        result.map(|v| version_tag(&v))
    }

    /// The bootstrap control plane, if it is Ready with a known address: the node that relays
    /// calls to nodes talboot cannot reach directly.
    async fn relay_node(&self) -> Result<Option<(String, Ipv4Addr)>, ProvisionError> {
        let cp = self.bootstrap_node().await?;
        let rec = self.record(&cp).await?;
        Ok(match (rec.phase, rec.last_seen_addr) {
            (NodePhase::Ready, Some(ip)) => Some((cp, ip)),
            _ => None,
        })
    }

    /// Whether the node `client` talks to is the only voting etcd member.
    async fn is_last_voter(&self, client: &TalosClient) -> bool {
        match client.etcd_member_list().await {
            Ok(members) => members.iter().filter(|m| !m.is_learner).count() <= 1,
            // No etcd (never bootstrapped): nothing to leave, a graceful reset skips `leave`.
            Err(_) => false,
        }
    }

    /// `talboot node rebuild NAME`: reopens the node's provisioning window, marks it
    /// Rebuilding (persisted before anything is called) and resets it, so its next boot gets
    /// its config again. Cluster steps already done (bootstrap) are not repeated. A node that
    /// holds no config from talboot is refused ([`super::core::check_rebuild`]) before
    /// anything is written.
    pub async fn rebuild(&self, name: &str) -> Result<NodeStep, ProvisionError> {
        let node = self.node_def(name)?.clone();
        let state = self.load_state(name).await?;
        super::core::check_rebuild(&state.rec)?;
        self.observe(&node, &state, Observation::RebuildRequested)
            .await?;
        self.step_node(name).await
    }
}
