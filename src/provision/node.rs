//! The per-node push state machine.
//!
//! Phases are persisted in the node's [`NodeRecord`]; [`Provisioner::step_node`] reads the
//! record, does one step and writes the result, so a restart anywhere resumes from the last
//! persisted phase:
//!
//! | phase | step |
//! |---|---|
//! | Unknown / Booting | probe `<lease ip>:50000` without a client cert: answers → Maintenance; asks for a cert → already configured (Ready if the secured API answers) |
//! | Maintenance | read version, disks, system information; record them; check the install disk; render; persist Configuring; ApplyConfiguration (mode AUTO) once; → Installing |
//! | Configuring | the apply's outcome is unknown (restart or lost reply): maintenance still answering → Maintenance (the node has no config, applying again is safe); else → Installing |
//! | Installing | secured API (directly, or relayed through the bootstrap control plane) reports machine stage `running` → Ready; a failed `install` sequence in its events, or the node back in maintenance mode after its secured API was seen, → Failed with the cause; past the install timeout → Failed |
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

use super::disks::{self, DiskFacts};
use super::{ProvisionError, Provisioner};
use crate::events::EventKind;
use crate::inventory::Node;
use crate::store::{NodePhase, NodeRecord};
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

/// Hardware facts read in maintenance mode, stored under `node/<name>/facts`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeFacts {
    /// Talos version of the maintenance system.
    pub talos_version: String,
    /// SMBIOS system UUID; `None` on a machine without SMBIOS tables (Talos then has no
    /// `SystemInformations.hardware.talos.dev` resource).
    pub system_uuid: Option<String>,
    /// SMBIOS manufacturer (`None` without SMBIOS).
    pub manufacturer: Option<String>,
    /// SMBIOS product name (`None` without SMBIOS).
    pub product_name: Option<String>,
    /// SMBIOS serial number (`None` without SMBIOS).
    pub serial_number: Option<String>,
    /// The disks, in Talos's list order.
    pub disks: Vec<DiskFacts>,
    /// The disk Talos will install to, as talboot computed it (`/dev/...`).
    pub install_disk: String,
}

impl NodeFacts {
    /// The facts stored for `node`, if any.
    pub fn load(store: &dyn crate::store::Store, node: &str) -> Option<NodeFacts> {
        let raw = store.get_meta(&facts_key(node)).ok().flatten()?;
        serde_json::from_slice(&raw).ok()
    }
}

/// Store key of a node's hardware facts.
pub fn facts_key(node: &str) -> String {
    format!("node/{node}/facts")
}

/// Store key of a node's [`Lifecycle`] record.
pub fn lifecycle_key(node: &str) -> String {
    format!("node/{node}/lifecycle")
}

/// What the node state machine remembers across restarts besides the phase, stored as JSON
/// under [`lifecycle_key`] (fields may be added; absent ones take their defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lifecycle {
    /// Why the node is Failed (what `talboot status` shows); cleared when it leaves Failed.
    #[serde(default)]
    pub failure: Option<String>,
    /// The secured API answered since the config was applied: the node left maintenance
    /// mode, so finding it in maintenance again means the install failed.
    #[serde(default)]
    pub install_seen: bool,
    /// When the Reset RPC answered (Unix seconds); the rebuild waits for the node to come
    /// back in maintenance mode until the reset timeout after it.
    #[serde(default)]
    pub reset_at_unix: Option<u64>,
}

/// Decodes a stored [`Lifecycle`]; an unreadable one counts as empty (it only refines
/// what the phase already says).
pub fn decode_lifecycle(raw: Option<&[u8]>) -> Lifecycle {
    raw.and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default()
}

/// How long a failed sequence's events are read for (the stream never ends by itself).
const EVENTS_IDLE: Duration = Duration::from_millis(300);

/// The stage as Talos prints it.
fn stage_name(stage: MachineStage) -> &'static str {
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

impl Provisioner {
    /// One step of node `name`'s state machine (see the module docs).
    pub async fn step_node(&self, name: &str) -> Result<NodeStep, ProvisionError> {
        let node = self.node_def(name)?.clone();
        let mut rec = self.record(name).await?;
        match rec.phase {
            NodePhase::Ready | NodePhase::Failed => Ok(NodeStep::Settled),
            NodePhase::Unknown | NodePhase::Booting => self.step_probe(&node, &mut rec).await,
            NodePhase::Maintenance => self.step_apply(&node, &mut rec).await,
            NodePhase::Configuring => self.step_resolve_apply(&node, &mut rec).await,
            NodePhase::Installing => self.step_wait_configured(&node, &mut rec).await,
            NodePhase::Rebuilding => self.step_reset(&node, &mut rec).await,
        }
    }

    /// The node's address, remembering it (and the MAC) in the record.
    async fn locate(
        &self,
        node: &Node,
        rec: &mut NodeRecord,
    ) -> Result<Option<Ipv4Addr>, ProvisionError> {
        let Some((ip, mac)) = self.address_of(node, rec).await? else {
            return Ok(None);
        };
        if rec.last_seen_addr != Some(ip) || (mac.is_some() && rec.mac != mac) {
            rec.last_seen_addr = Some(ip);
            if mac.is_some() {
                rec.mac = mac;
            }
            self.save(rec).await?;
        }
        Ok(Some(ip))
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

    /// Moves `rec` to `phase` (persisted and published) and tells the caller to step again.
    async fn advance(
        &self,
        rec: &mut NodeRecord,
        phase: NodePhase,
        why: &str,
    ) -> Result<NodeStep, ProvisionError> {
        self.set_phase(rec, phase, why).await?;
        Ok(NodeStep::Advanced(phase))
    }

    /// Marks `rec` Failed (persisted and published, `why` in the timeline) and returns `err`:
    /// the node needs an operator now.
    async fn fail(
        &self,
        rec: &mut NodeRecord,
        why: &str,
        err: ProvisionError,
    ) -> Result<NodeStep, ProvisionError> {
        let reason = why.to_owned();
        self.update_lifecycle(&rec.name, move |l| l.failure = Some(reason))
            .await?;
        self.set_phase(rec, NodePhase::Failed, why).await?;
        Err(err)
    }

    /// The node's [`Lifecycle`] record.
    pub(crate) async fn lifecycle(&self, name: &str) -> Result<Lifecycle, ProvisionError> {
        let key = lifecycle_key(name);
        let raw = self.db(move |s| s.get_meta(&key)).await?;
        Ok(decode_lifecycle(raw.as_deref()))
    }

    /// Changes the node's [`Lifecycle`] record with `f` and persists it.
    async fn update_lifecycle(
        &self,
        name: &str,
        f: impl FnOnce(&mut Lifecycle) + Send + 'static,
    ) -> Result<(), ProvisionError> {
        let key = lifecycle_key(name);
        self.db(move |s| {
            let mut l = decode_lifecycle(s.get_meta(&key)?.as_deref());
            f(&mut l);
            let json = serde_json::to_vec(&l).expect("lifecycle record serialises");
            s.put_meta(&key, &json)
        })
        .await
    }

    async fn step_probe(
        &self,
        node: &Node,
        rec: &mut NodeRecord,
    ) -> Result<NodeStep, ProvisionError> {
        let name = rec.name.clone();
        let Some(ip) = self.locate(node, rec).await? else {
            return Ok(NodeStep::Waiting(
                "no DHCP lease or address seen yet".into(),
            ));
        };
        let client = self.maintenance_probe(&name, ip)?;
        match client.version().await {
            Ok(v) => {
                let tag = version_tag(&v);
                self.event(
                    &name,
                    EventKind::Talos,
                    format!("Version at {} (maintenance): {tag}", client.endpoint()),
                );
                rec.talos_version = Some(tag);
                self.advance(rec, NodePhase::Maintenance, "maintenance API answers")
                    .await
            }
            Err(TalosError::NotInMaintenance { .. }) => {
                // It holds a config already: nothing to push. Whether it is installed (or
                // still installing) is the Installing phase's question.
                match self.secured_version(&name, ip).await {
                    Ok(tag) => {
                        rec.talos_version = Some(tag);
                        rec.provisioning_window_open = false;
                        self.update_lifecycle(&name, |l| l.install_seen = true)
                            .await?;
                        self.advance(
                            rec,
                            NodePhase::Installing,
                            "already configured (secured API answers); waiting for machine \
                             stage running",
                        )
                        .await
                    }
                    Err(e) => Ok(NodeStep::Waiting(format!(
                        "configured node, secured API not usable yet: {e}"
                    ))),
                }
            }
            Err(e) => {
                self.event(
                    &name,
                    EventKind::Talos,
                    format!("Version at {} (maintenance) failed: {e}", client.endpoint()),
                );
                Ok(NodeStep::Waiting(e.to_string()))
            }
        }
    }

    async fn step_apply(
        &self,
        node: &Node,
        rec: &mut NodeRecord,
    ) -> Result<NodeStep, ProvisionError> {
        let name = rec.name.clone();
        if !rec.provisioning_window_open {
            self.event(
                &name,
                EventKind::ConfigRefused,
                "node is in maintenance mode but its provisioning window is closed; run \
                 `talboot node rebuild` to reprovision it",
            );
            return Ok(NodeStep::Waiting("provisioning window closed".into()));
        }
        let Some(ip) = self.locate(node, rec).await? else {
            return Ok(NodeStep::Waiting("no address known".into()));
        };
        let client = self.maintenance_probe(&name, ip)?;

        let facts = match self.read_facts(&name, &client).await {
            Ok(f) => f,
            Err(TalosError::NotInMaintenance { .. }) => {
                // It left maintenance behind our back (someone else configured it).
                return self
                    .advance(
                        rec,
                        NodePhase::Booting,
                        "maintenance API gone; probing again",
                    )
                    .await;
            }
            Err(e) if e.is_transient() => return Ok(NodeStep::Waiting(e.to_string())),
            Err(e) => return Err(self.talos_err(&name, e)),
        };

        let install_disk = match disks::choose_install_disk(&node.install, &facts.disks) {
            Ok(d) => d,
            Err(refusal) => {
                return self
                    .fail(
                        rec,
                        &format!("install disk refused: {refusal}"),
                        ProvisionError::Disk {
                            node: name,
                            source: refusal,
                        },
                    )
                    .await;
            }
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
                "install disk {}: Talos will install to {install_disk} ({}): {chosen}",
                node.install,
                match node.install {
                    crate::inventory::InstallTarget::Disk(_) => "the disk with that path or link",
                    crate::inventory::InstallTarget::Selector(_) => "the only matching disk",
                }
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
        let key = super::node::facts_key(&name);
        self.db(move |s| s.put_meta(&key, &json)).await?;

        let config = match self.inner.renderer.render(node) {
            Ok(c) => c,
            Err(reason) => {
                return self
                    .fail(
                        rec,
                        &format!("config not rendered: {reason}"),
                        ProvisionError::Render { node: name, reason },
                    )
                    .await;
            }
        };

        // A new install starts: only a secured answer after this apply counts as "left
        // maintenance mode" (a rebuild that found the node in maintenance already kept the
        // mark of the previous install).
        self.update_lifecycle(&name, |l| l.install_seen = false)
            .await?;
        // Intent first: if we die during the call, the next run resolves it (Configuring).
        self.set_phase(
            rec,
            NodePhase::Configuring,
            "applying machine config (mode AUTO)",
        )
        .await?;
        match client.apply_configuration(&config).await {
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
                rec.provisioning_window_open = false;
                self.advance(
                    rec,
                    NodePhase::Installing,
                    "config applied; installing and rebooting",
                )
                .await
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
                        self.fail(
                            rec,
                            &format!("config refused: {e}"),
                            self.talos_err(&name, e),
                        )
                        .await
                    }
                    // Lost reply or busy node: Configuring resolves it on the next step.
                    _ => Ok(NodeStep::Waiting(e.to_string())),
                }
            }
        }
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

    async fn step_resolve_apply(
        &self,
        node: &Node,
        rec: &mut NodeRecord,
    ) -> Result<NodeStep, ProvisionError> {
        let name = rec.name.clone();
        let Some(ip) = self.locate(node, rec).await? else {
            return Ok(NodeStep::Waiting("no address known".into()));
        };
        let client = self.maintenance_probe(&name, ip)?;
        match client.version().await {
            Ok(_) => {
                // Still in maintenance: the config did not land, so applying it is safe.
                self.advance(
                    rec,
                    NodePhase::Maintenance,
                    "config not taken; applying again",
                )
                .await
            }
            Err(TalosError::NotInMaintenance { .. }) => {
                rec.provisioning_window_open = false;
                self.advance(
                    rec,
                    NodePhase::Installing,
                    "node left maintenance: config applied",
                )
                .await
            }
            Err(e) => self.check_install_deadline(rec, e.to_string()).await,
        }
    }

    async fn check_install_deadline(
        &self,
        rec: &mut NodeRecord,
        waiting_for: String,
    ) -> Result<NodeStep, ProvisionError> {
        let limit = self.settings().install_timeout;
        let elapsed = Duration::from_secs(self.now().saturating_sub(rec.phase_since_unix));
        if elapsed >= limit {
            let err = ProvisionError::InstallTimeout {
                node: rec.name.clone(),
                after: limit,
            };
            return self
                .fail(rec, &format!("{err} (last: {waiting_for})"), err)
                .await;
        }
        Ok(NodeStep::Waiting(waiting_for))
    }

    async fn step_wait_configured(
        &self,
        node: &Node,
        rec: &mut NodeRecord,
    ) -> Result<NodeStep, ProvisionError> {
        let name = rec.name.clone();
        let Some(ip) = self.locate(node, rec).await? else {
            return Ok(NodeStep::Waiting("no address known".into()));
        };
        let (client, tag) = match self.secured_route_quiet(&name, ip, true).await {
            Ok(route) => route,
            Err(e @ TalosError::WrongCa { .. }) => {
                // Either in maintenance mode (throwaway CA) or our CA is not the cluster's.
                let probe = self.maintenance_probe(&name, ip)?;
                return match probe.version().await {
                    Ok(_) if self.lifecycle(&name).await?.install_seen => {
                        // It had left maintenance mode with our config and is back there
                        // without it: the install sequence failed and machined rebooted
                        // (siderolabs/talos v1.13.9 internal/app/machined/main.go, handle).
                        let why = "install failed: the node rebooted back into maintenance \
                                   mode without its config (its console or `talosctl dmesg` \
                                   shows the install error); run `talboot node rebuild` once \
                                   fixed";
                        let err = ProvisionError::InstallFailed {
                            node: name.clone(),
                            cause: why.into(),
                        };
                        self.fail(rec, why, err).await
                    }
                    Ok(_) => {
                        self.check_install_deadline(rec, "still in maintenance mode".into())
                            .await
                    }
                    Err(TalosError::NotInMaintenance { .. }) => {
                        // apid may have restarted between the two calls (maintenance → mTLS
                        // right after the apply): only a second secured failure means our CA
                        // is not the cluster's.
                        match self.secured_route_quiet(&name, ip, true).await {
                            Err(e @ TalosError::WrongCa { .. }) => {
                                self.fail(rec, &e.to_string(), self.talos_err(&name, e))
                                    .await
                            }
                            Err(e) => self.check_install_deadline(rec, e.to_string()).await,
                            Ok(_) => Ok(NodeStep::Waiting(
                                "its API just restarted with mutual TLS".into(),
                            )),
                        }
                    }
                    Err(_) => self.check_install_deadline(rec, e.to_string()).await,
                };
            }
            Err(e) => return self.check_install_deadline(rec, e.to_string()).await,
        };
        if !self.lifecycle(&name).await?.install_seen {
            self.update_lifecycle(&name, |l| l.install_seen = true)
                .await?;
        }
        let status = match client.machine_status().await {
            Ok(s) => s,
            Err(e) => {
                self.event(
                    &name,
                    EventKind::Talos,
                    format!("MachineStatus at {} failed: {e}", client.target()),
                );
                return self.check_install_deadline(rec, e.to_string()).await;
            }
        };
        let stage = status.stage();
        self.event(
            &name,
            EventKind::Talos,
            format!(
                "MachineStatus at {}: stage {}",
                client.target(),
                stage_name(stage)
            ),
        );
        if stage == MachineStage::MachineStageRunning {
            rec.talos_version = Some(tag.clone());
            let why = format!("installed and booted from disk (machine stage running, {tag})");
            return self.advance(rec, NodePhase::Ready, &why).await;
        }
        // A fatal sequence error sets the stage to rebooting (machine_status.go); the error
        // itself is in the node's events until it reboots.
        if stage == MachineStage::MachineStageRebooting {
            match client.sequence_failures(EVENTS_IDLE).await {
                Ok(failures) => {
                    if let Some(f) = failures.iter().rev().find(|f| f.sequence == "install") {
                        let why = format!("install failed: {}", f.message);
                        let err = ProvisionError::InstallFailed {
                            node: name.clone(),
                            cause: f.message.clone(),
                        };
                        return self.fail(rec, &why, err).await;
                    }
                }
                Err(e) => tracing::debug!(node = %name, error = %e, "Events unavailable"),
            }
        }
        self.check_install_deadline(rec, format!("machine stage {}", stage_name(stage)))
            .await
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

    async fn step_reset(
        &self,
        node: &Node,
        rec: &mut NodeRecord,
    ) -> Result<NodeStep, ProvisionError> {
        let name = rec.name.clone();
        let lifecycle = self.lifecycle(&name).await?;
        let Some(ip) = self.locate(node, rec).await? else {
            if lifecycle.reset_at_unix.is_some() {
                return Ok(NodeStep::Waiting(
                    "reset requested; no address known to watch it come back".into(),
                ));
            }
            return self
                .advance(
                    rec,
                    NodePhase::Booting,
                    "no address known; waiting for its next boot",
                )
                .await;
        };
        if let Some(at) = lifecycle.reset_at_unix {
            return self.step_await_reset(rec, ip, at).await;
        }
        // Secured first: a configured node is what a rebuild normally finds. Only when that
        // fails is the node perhaps already back in maintenance (an earlier reset landed).
        let client = match self.secured_route(&name, ip).await {
            Ok((client, _)) => client,
            Err(secured_err) => {
                let probe = self.maintenance_probe(&name, ip)?;
                if probe.version().await.is_ok() {
                    return self
                        .advance(rec, NodePhase::Maintenance, "already in maintenance mode")
                        .await;
                }
                return Ok(NodeStep::Waiting(format!(
                    "cannot reach its secured API to reset it: {secured_err}"
                )));
            }
        };
        let control_plane = self
            .inventory()
            .control_planes()
            .any(|cp| cp.name.as_str() == name);
        let last_voter = control_plane && self.is_last_voter(&client).await;
        // A graceful reset leaves etcd first; etcd refuses to remove its last voting member,
        // so on a single control plane the reset sequence would fail on the node after the
        // RPC answered (siderolabs/talos v1.13.9 v1alpha1_sequencer.go, Reset: `leave`;
        // internal/pkg/etcd/etcd.go, LeaveCluster). Rebuilding the only control plane means
        // starting its cluster over, so it is reset without leaving, and bootstrapped again.
        let graceful = !last_voter;
        let now = self.now();
        // Intent first: a restart after the call must wait for the reset, not call it again.
        self.update_lifecycle(&name, move |l| l.reset_at_unix = Some(now))
            .await?;
        match client.reset(graceful, true).await {
            Ok(()) => {
                let how = if graceful {
                    "graceful".to_owned()
                } else {
                    "not graceful (last voting etcd member: it cannot leave etcd; the \
                     cluster's etcd is wiped with it and bootstrapped again)"
                        .to_owned()
                };
                self.event(
                    &name,
                    EventKind::Talos,
                    format!(
                        "Reset at {}: {how}, wipe STATE+EPHEMERAL, reboot; waiting for it to \
                         go down and come back in maintenance mode",
                        client.target()
                    ),
                );
                if last_voter {
                    self.forget_bootstrap(&name).await?;
                }
                rec.talos_version = None;
                self.save(rec).await?;
                Ok(NodeStep::Advanced(NodePhase::Rebuilding))
            }
            Err(e) => {
                self.update_lifecycle(&name, |l| l.reset_at_unix = None)
                    .await?;
                self.event(
                    &name,
                    EventKind::Talos,
                    format!("Reset at {} failed: {e}", client.target()),
                );
                Err(self.talos_err(&name, e))
            }
        }
    }

    /// Whether the node `client` talks to is the only voting etcd member.
    async fn is_last_voter(&self, client: &TalosClient) -> bool {
        match client.etcd_member_list().await {
            Ok(members) => members.iter().filter(|m| !m.is_learner).count() <= 1,
            // No etcd (never bootstrapped): nothing to leave, a graceful reset skips `leave`.
            Err(_) => false,
        }
    }

    /// The Reset RPC answered at `reset_at`: the sequence runs on the node afterwards. Done
    /// only when the maintenance API answers (the node went down, wiped, and came back
    /// without a config); the old secured API answering means it is still resetting, or
    /// the sequence failed and it rebooted with its config.
    async fn step_await_reset(
        &self,
        rec: &mut NodeRecord,
        ip: Ipv4Addr,
        reset_at: u64,
    ) -> Result<NodeStep, ProvisionError> {
        let name = rec.name.clone();
        let probe = self.maintenance_probe(&name, ip)?;
        let still = match probe.version().await {
            Ok(_) => {
                self.update_lifecycle(&name, |l| {
                    l.reset_at_unix = None;
                    l.install_seen = false;
                })
                .await?;
                return self
                    .advance(
                        rec,
                        NodePhase::Maintenance,
                        "reset done: back in maintenance mode",
                    )
                    .await;
            }
            Err(TalosError::NotInMaintenance { .. }) => {
                // Configured still: a failed reset sequence says why in the events.
                if let Ok((client, _)) = self.secured_route_quiet(&name, ip, true).await
                    && let Ok(failures) = client.sequence_failures(EVENTS_IDLE).await
                    && let Some(f) = failures.iter().rev().find(|f| f.sequence == "reset")
                {
                    let why = format!("reset failed on the node: {}", f.message);
                    self.update_lifecycle(&name, |l| l.reset_at_unix = None)
                        .await?;
                    let err = ProvisionError::ResetFailed {
                        node: name.clone(),
                        cause: f.message.clone(),
                    };
                    return self.fail(rec, &why, err).await;
                }
                "still configured (resetting)".to_owned()
            }
            Err(e) => format!("down ({e})"),
        };
        let limit = self.settings().reset_timeout;
        let elapsed = Duration::from_secs(self.now().saturating_sub(reset_at));
        if elapsed >= limit {
            self.update_lifecycle(&name, |l| l.reset_at_unix = None)
                .await?;
            let cause = format!(
                "the node did not come back in maintenance mode within {limit:?} after Reset \
                 answered (last: {still}); the reset did not happen"
            );
            let err = ProvisionError::ResetFailed {
                node: name.clone(),
                cause: cause.clone(),
            };
            return self
                .fail(rec, &format!("rebuild failed: {cause}"), err)
                .await;
        }
        Ok(NodeStep::Waiting(format!(
            "reset requested; waiting for maintenance mode: {still}"
        )))
    }

    /// `talboot node rebuild NAME`: reopens the node's provisioning window, marks it
    /// Rebuilding (persisted before anything is called) and resets it, so its next boot gets
    /// its config again. Cluster steps already done (bootstrap) are not repeated.
    pub async fn rebuild(&self, name: &str) -> Result<NodeStep, ProvisionError> {
        self.node_def(name)?;
        let mut rec = self.record(name).await?;
        rec.provisioning_window_open = true;
        // A new rebuild: forget an earlier reset that never finished.
        self.update_lifecycle(name, |l| {
            l.reset_at_unix = None;
            l.install_seen = false;
        })
        .await?;
        self.set_phase(
            &mut rec,
            NodePhase::Rebuilding,
            "rebuild requested by the operator",
        )
        .await?;
        self.step_node(name).await
    }
}
