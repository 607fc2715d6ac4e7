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
//! | Installing | secured `Version` (directly, or relayed through the bootstrap control plane) answers → Ready; past the install timeout → Failed |
//! | Rebuilding | secured API answers → Reset (graceful, wipe STATE+EPHEMERAL, reboot) → Booting; maintenance answers → Maintenance |
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
        self.set_phase(rec, NodePhase::Failed, why).await?;
        Err(err)
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
                // Booted from disk with a config already: nothing to push.
                match self.secured_version(&name, ip).await {
                    Ok(tag) => {
                        rec.talos_version = Some(tag);
                        rec.provisioning_window_open = false;
                        self.advance(
                            rec,
                            NodePhase::Ready,
                            "already configured (secured API answers)",
                        )
                        .await
                    }
                    Err(e) => Ok(NodeStep::Waiting(format!(
                        "configured node, secured API not usable yet: {e}"
                    ))),
                }
            }
            Err(e) => {
                self.event_unless_repeated(
                    &name,
                    EventKind::Talos,
                    format!("Version at {} (maintenance) failed: {e}", client.endpoint()),
                )
                .await;
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
        match self.secured_version(&name, ip).await {
            Ok(tag) => {
                rec.talos_version = Some(tag.clone());
                let why = format!("configured; secured API answers ({tag})");
                self.advance(rec, NodePhase::Ready, &why).await
            }
            Err(e @ TalosError::WrongCa { .. }) => {
                // Either still in maintenance (throwaway CA) or our CA is not the cluster's.
                let probe = self.maintenance_probe(&name, ip)?;
                match probe.version().await {
                    Ok(_) => {
                        self.check_install_deadline(rec, "still in maintenance mode".into())
                            .await
                    }
                    Err(TalosError::NotInMaintenance { .. }) => {
                        self.fail(rec, &e.to_string(), self.talos_err(&name, e))
                            .await
                    }
                    Err(_) => self.check_install_deadline(rec, e.to_string()).await,
                }
            }
            Err(e) => self.check_install_deadline(rec, e.to_string()).await,
        }
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
        let direct = self.secured_client(ip)?;
        let first = self.version_event(name, &direct, "").await;
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
            let tag = self.version_event(name, &relayed, " (relayed)").await?;
            return Ok((relayed, tag));
        }
        Err(err)
    }

    async fn version_event(
        &self,
        name: &str,
        client: &TalosClient,
        via: &str,
    ) -> Result<String, TalosError> {
        let result = client.version().await;
        match &result {
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
                self.event_unless_repeated(
                    name,
                    EventKind::Talos,
                    format!("Version at {}{via} (secured) failed: {e}", client.target()),
                )
                .await
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
        let Some(ip) = self.locate(node, rec).await? else {
            return self
                .advance(
                    rec,
                    NodePhase::Booting,
                    "no address known; waiting for its next boot",
                )
                .await;
        };
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
        match client.reset(true, true).await {
            Ok(()) => {
                self.event(
                    &name,
                    EventKind::Talos,
                    format!(
                        "Reset at {}: graceful, wipe STATE+EPHEMERAL, reboot",
                        client.target()
                    ),
                );
                rec.talos_version = None;
                self.advance(
                    rec,
                    NodePhase::Booting,
                    "reset; waiting for it to boot into maintenance",
                )
                .await
            }
            Err(e) => {
                self.event(
                    &name,
                    EventKind::Talos,
                    format!("Reset at {} failed: {e}", client.target()),
                );
                Err(self.talos_err(&name, e))
            }
        }
    }

    /// `talboot node rebuild NAME`: reopens the node's provisioning window, marks it
    /// Rebuilding (persisted before anything is called) and resets it, so its next boot gets
    /// its config again. Cluster steps already done (bootstrap) are not repeated.
    pub async fn rebuild(&self, name: &str) -> Result<NodeStep, ProvisionError> {
        self.node_def(name)?;
        let mut rec = self.record(name).await?;
        rec.provisioning_window_open = true;
        self.set_phase(
            &mut rec,
            NodePhase::Rebuilding,
            "rebuild requested by the operator",
        )
        .await?;
        self.step_node(name).await
    }
}
