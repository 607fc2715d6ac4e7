//! The Talos double's gRPC services as talboot calls them: MachineService, StorageService and
//! the COSI State, each call routed through [`NodeApi::route`] first.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::apid::{ADMIN, APPLY, DataStream, ListStream, NodeApi, OPERATE, READ, READ_ETCD, Route};
use super::etcd;
use super::loader::{LoadRules, parse_config};
use super::machine_config;
use super::manifests;
use super::sequences::{install_sequence, reset_sequence};
use super::unattended;
use super::upgrade;
use super::v114::TalosRules;
use super::{BootReason, Installed, Lifecycle, Shared, lock};
use crate::sim::disks::talos_order;
use crate::sim::pki::SimCa;
use crate::talos::api::common;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::machine::{self, machine_service_server::MachineService};
use crate::talos::api::storage::{self, storage_service_server::StorageService};
use crate::talos::api::talos::resource::definitions::{hardware, runtime};
use crate::talos::archive::kubeconfig_archive;

/// Routes the call to gRPC method `$path`: one for another node is relayed there (as a
/// `unary` or `stream` call) and its answer returned; one for this node goes on only if the
/// caller's roles are among `$allowed`, and is recorded as served under the method's name.
macro_rules! route_or_forward {
    ($self:ident, $req:ident, unary, $path:literal, $allowed:expr) => {
        route_or_forward!(@route $self, $req, forward_unary, $path, $allowed)
    };
    ($self:ident, $req:ident, stream, $path:literal, $allowed:expr) => {
        route_or_forward!(@route $self, $req, forward_stream, $path, $allowed)
    };
    (@route $self:ident, $req:ident, $forward:ident, $path:literal, $allowed:expr) => {
        match $self.route(&$req, $path)? {
            Route::Forward { addr, roles } => {
                return $self.$forward(addr, &roles, $path, $req).await;
            }
            Route::Local { roles, relayed } => {
                let rpc = $path.rsplit('/').next().unwrap_or($path);
                $self.allow(rpc, &roles, relayed, $allowed)?
            }
        }
    };
}

/// ApplyConfiguration in maintenance mode: the config is loaded and validated (as the machine
/// is not installed yet: `modeWrapper.RequiresInstall`, which v1.13 turns into "install
/// instructions required") and the install starts after the reply: v1.13's install sequence,
/// or on a v1.14 node the unattended install when the config has `UnattendedInstallConfig`,
/// the legacy sequence for `.machine.install`, no install at all for neither (see
/// [`unattended`]). Any mode, REBOOT included, is applied without a reboot (v1.14:
/// `v1alpha1_server.go` turns REBOOT into NO_REBOOT in maintenance).
fn apply_in_maintenance(
    shared: &Arc<Shared>,
    req: machine::ApplyConfigurationRequest,
) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
    let stats = &shared.stats;
    if req.dry_run {
        return Err(Status::unimplemented(
            "dry run is not simulated by the test double",
        ));
    }
    // Talos hands the loader's and the validator's errors back as InvalidArgument with
    // their message unchanged (`v1alpha1_server.go`, ApplyConfiguration).
    let version = shared.rules();
    let rules = LoadRules {
        version,
        requires_install: true,
    };
    let parsed =
        parse_config(&req.data, rules).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let text = String::from_utf8_lossy(&req.data).into_owned();
    let Some(parsed) = parsed else {
        // Maintenance accepts documents without a machine config and keeps waiting;
        // the reply is the plain no-reboot one.
        *lock(&stats.last_config) = Some(text);
        return Ok(Response::new(reply_apply(
            "Applied configuration without a reboot",
        )));
    };
    let os_ca = match &parsed.ca_key_pem {
        Some(key) => Some(
            SimCa::from_pem(&parsed.ca_cert_pem, key)
                .map_err(|e| Status::invalid_argument(format!("machine.ca: {e}")))?,
        ),
        None => None,
    };
    if let Some(inst) = shared.installed()
        && inst.config.machine_type != parsed.machine_type
    {
        return Err(Status::invalid_argument("machine type can't be changed"));
    }
    lock(&shared.configs).installed(text.clone(), &parsed.machine_type);
    *lock(&stats.last_config) = Some(text);
    let current = shared.installed();
    let mut reply = reply_apply("Applied configuration without a reboot");
    reply.messages[0].warnings = parsed.warnings.clone();
    let (document, legacy) = (parsed.unattended.clone(), parsed.legacy_install);
    let installed = Installed {
        ca_cert_pem: parsed.ca_cert_pem.clone(),
        config: parsed,
        os_ca,
        on_disk: current.as_ref().is_some_and(|i| i.on_disk),
    };
    // The reply goes out first; apid restarts with mTLS and the install runs afterwards,
    // asynchronously.
    match (version, document) {
        (TalosRules::V114, Some(spec)) => {
            tokio::spawn(unattended::install(shared.clone(), installed, spec));
        }
        (TalosRules::V114, None) if !legacy => {
            tokio::spawn(unattended::boot_without_install(shared.clone(), installed));
        }
        _ => {
            tokio::spawn(install_sequence(shared.clone(), installed));
        }
    }
    Ok(Response::new(reply))
}

#[tonic::async_trait]
impl MachineService for NodeApi {
    async fn apply_configuration(
        &self,
        req: Request<machine::ApplyConfigurationRequest>,
    ) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
        // `inMaintenance := !ConfigCompleteForBoot()`: false from the moment an earlier
        // maintenance apply's SetConfig returned, though apid still serves maintenance
        // mode (reader role) until the acquire controller tears the maintenance service
        // down (`internal/app/machined/pkg/controllers/config/acquire.go`,
        // stateMaintenanceLeave). A second apply in that window is refused.
        let maintenance =
            self.shared.installed().is_none() && !lock(&self.shared.configs).complete_for_boot();
        // The rule admits os:admin and os:reader; the handler then refuses anyone but
        // os:admin once the node is configured (`v1alpha1_server.go`, ApplyConfiguration:
        // `!inMaintenance && !roles.Includes(role.Admin)` -> ErrNotAuthorized), which is the
        // same as checking ADMIN up front.
        route_or_forward!(
            self,
            req,
            unary,
            "/machine.MachineService/ApplyConfiguration",
            if maintenance { APPLY } else { ADMIN }
        );
        let stats = &self.shared.stats;
        stats.apply_calls.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        *lock(&stats.last_apply_mode) = Some(req.mode);
        if !maintenance {
            return machine_config::apply_configured(&self.shared, req);
        }
        apply_in_maintenance(&self.shared, req)
    }

    async fn bootstrap(
        &self,
        req: Request<machine::BootstrapRequest>,
    ) -> Result<Response<machine::BootstrapResponse>, Status> {
        route_or_forward!(self, req, unary, "/machine.MachineService/Bootstrap", ADMIN);
        self.shared
            .stats
            .bootstrap_calls
            .fetch_add(1, Ordering::SeqCst);
        // `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`, Bootstrap
        // (v1.13.9), in its order: CRI up (`IsBootstrapAllowed`, FailedPrecondition "bootstrap
        // is not available yet"; CRI is up as soon as the double's secured API is),
        // `machinehelper.CheckControlplane(.., "bootstrap")`
        // (`internal/app/internal/machinehelper/machinehelper.go`: Unimplemented), time in
        // sync (FailedPrecondition "time is not in sync yet"; always in sync here), then
        // AlreadyExists while the etcd data directory is not empty (see [`etcd::bootstrap`]).
        let Some(inst) = self.shared.installed() else {
            return Err(Status::unimplemented(
                "machine type is not set, cannot use bootstrap API",
            ));
        };
        if !inst.config.is_control_plane() {
            return Err(Status::unimplemented(
                "bootstrap is only available on control plane nodes",
            ));
        }
        if !inst.on_disk {
            // etcd only runs once booted from disk (the install sequence stops everything).
            return Err(Status::failed_precondition(
                "bootstrap is not available yet",
            ));
        }
        etcd::bootstrap(&self.shared)?;
        Ok(Response::new(machine::BootstrapResponse {
            messages: vec![machine::Bootstrap { metadata: None }],
        }))
    }

    async fn etcd_member_list(
        &self,
        req: Request<machine::EtcdMemberListRequest>,
    ) -> Result<Response<machine::EtcdMemberListResponse>, Status> {
        route_or_forward!(
            self,
            req,
            unary,
            "/machine.MachineService/EtcdMemberList",
            READ_ETCD
        );
        // `v1alpha1_server.go`, EtcdMemberList (v1.13.9): `CheckControlplane(.., "member
        // list")` first (Unimplemented, `machinehelper.go`), then an etcd client over the
        // control-plane endpoints (`internal/pkg/etcd/etcd.go`,
        // `NewClientFromControlPlaneIPs`), which are learnt from the Kubernetes API server's
        // EndpointSlice (`internal/app/machined/pkg/controllers/k8s/endpoint.go`): before
        // bootstrap there are none, and `GetEndpoints` (`internal/pkg/etcd/endpoints.go`)
        // fails with a plain error, i.e. codes.Unknown.
        let Some(inst) = self.shared.installed() else {
            return Err(Status::unimplemented(
                "machine type is not set, cannot use member list API",
            ));
        };
        if !inst.config.is_control_plane() {
            return Err(Status::unimplemented(
                "member list is only available on control plane nodes",
            ));
        }
        // Still installing: etcd has not started, so no endpoint is known either.
        if !inst.on_disk {
            return Err(Status::unknown("no controlplane endpoints discovered yet"));
        }
        // The members of its etcd cluster (the control planes that bootstrapped or joined
        // it), a member that is down included, once etcd has a leader (see [`etcd`]).
        let members = etcd::member_list(&self.shared)?;
        Ok(Response::new(machine::EtcdMemberListResponse {
            messages: vec![machine::EtcdMembers {
                metadata: None,
                // `LegacyMembers` are the members' names (`v1alpha1_server.go`).
                legacy_members: members.iter().map(|m| m.hostname.clone()).collect(),
                members: members
                    .into_iter()
                    .map(|m| machine::EtcdMember {
                        id: match m.ip {
                            IpAddr::V4(v4) => u64::from(u32::from(v4)),
                            IpAddr::V6(v6) => u128::from(v6) as u64,
                        },
                        hostname: m.hostname,
                        peer_urls: vec![format!("https://{}:2380", m.ip)],
                        client_urls: vec![format!("https://{}:2379", m.ip)],
                        is_learner: m.learner,
                    })
                    .collect(),
            }],
        }))
    }

    type EventsStream =
        Pin<Box<dyn Stream<Item = Result<machine::Event, Status>> + Send + 'static>>;

    /// The runtime events of this boot (the history Talos keeps in memory), then every new
    /// one until the caller hangs up (siderolabs/talos v1.13.9
    /// `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`, `Events`;
    /// `tail_events` < 0 means all past events, `internal/app/machined/pkg/runtime/events.go`).
    async fn events(
        &self,
        req: Request<machine::EventsRequest>,
    ) -> Result<Response<Self::EventsStream>, Status> {
        route_or_forward!(self, req, stream, "/machine.MachineService/Events", READ);
        let tail = req.into_inner().tail_events;
        let live = self.shared.live_events.subscribe();
        let past: Vec<machine::Event> = {
            let events = lock(&self.shared.events);
            let keep = match usize::try_from(tail) {
                Ok(n) => n.min(events.len()),
                Err(_) => events.len(),
            };
            events[events.len() - keep..].to_vec()
        };
        let (tx, rx) = mpsc::channel(64);
        let mut live = live;
        tokio::spawn(async move {
            for ev in past {
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            loop {
                let ev = tokio::select! {
                    () = tx.closed() => return,
                    ev = live.recv() => ev,
                };
                match ev {
                    Ok(ev) => {
                        if tx.send(Ok(ev)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        let stream: Self::EventsStream = Box::pin(ReceiverStream::new(rx));
        Ok(Response::new(stream))
    }

    type KubeconfigStream = DataStream;

    async fn kubeconfig(
        &self,
        req: Request<()>,
    ) -> Result<Response<Self::KubeconfigStream>, Status> {
        route_or_forward!(
            self,
            req,
            stream,
            "/machine.MachineService/Kubeconfig",
            ADMIN
        );
        self.shared
            .stats
            .kubeconfig_calls
            .fetch_add(1, Ordering::SeqCst);
        // `v1alpha1_server.go`, Kubeconfig (v1.13.9): `CheckControlplane(.., "kubeconfig")`
        // (`machinehelper.go`, Unimplemented), then a freshly generated admin kubeconfig.
        let inst = self.shared.installed().ok_or_else(|| {
            Status::unimplemented("machine type is not set, cannot use kubeconfig API")
        })?;
        if !inst.config.is_control_plane() {
            return Err(Status::unimplemented(
                "kubeconfig is only available on control plane nodes",
            ));
        }
        let kubeconfig = match self.shared.cluster.kubeconfig() {
            Some(set) => set.into_bytes(),
            None => self.kubeconfig_for(&inst)?,
        };
        let archive =
            kubeconfig_archive(&kubeconfig).map_err(|e| Status::internal(e.to_string()))?;
        *lock(&self.shared.stats.last_kubeconfig) = Some(kubeconfig);
        // Talos sends the whole archive in one `common.Data` message (`obj.Send` once);
        // talboot's client joins any number of chunks anyway.
        let chunks: Vec<Result<common::Data, Status>> = vec![Ok(common::Data {
            metadata: None,
            bytes: archive,
        })];
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn reboot(
        &self,
        req: Request<machine::RebootRequest>,
    ) -> Result<Response<machine::RebootResponse>, Status> {
        route_or_forward!(self, req, unary, "/machine.MachineService/Reboot", OPERATE);
        self.shared
            .stats
            .reboot_calls
            .fetch_add(1, Ordering::SeqCst);
        self.shared.go_down(Lifecycle::Reboot(BootReason::Reboot));
        Ok(Response::new(machine::RebootResponse {
            messages: vec![machine::Reboot {
                metadata: None,
                actor_id: format!("reboot-{}", self.shared.cfg.hostname),
            }],
        }))
    }

    async fn reset(
        &self,
        req: Request<machine::ResetRequest>,
    ) -> Result<Response<machine::ResetResponse>, Status> {
        route_or_forward!(self, req, unary, "/machine.MachineService/Reset", ADMIN);
        self.shared.stats.reset_calls.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        *lock(&self.shared.stats.last_reset) = Some(req.clone());
        for spec in &req.system_partitions_to_wipe {
            if !matches!(spec.label.as_str(), "STATE" | "EPHEMERAL" | "META") {
                return Err(Status::failed_precondition(format!(
                    "volume {:?} is not located",
                    spec.label
                )));
            }
        }
        if !req.user_disks_to_wipe.is_empty()
            && req.mode == machine::reset_request::WipeMode::SystemDisk as i32
        {
            return Err(Status::invalid_argument(
                "user disks can't be wiped in system disk mode",
            ));
        }
        let wipes = |label: &str| {
            req.system_partitions_to_wipe.is_empty()
                || req
                    .system_partitions_to_wipe
                    .iter()
                    .any(|s| s.label == label && s.wipe)
        };
        let wiped_state = wipes("STATE");
        // The RPC answers at once; the sequence runs afterwards (see `reset_sequence`).
        let wiped_ephemeral = wipes("EPHEMERAL");
        tokio::spawn(reset_sequence(
            self.shared.clone(),
            req,
            wiped_state,
            wiped_ephemeral,
        ));
        Ok(Response::new(machine::ResetResponse {
            messages: vec![machine::Reset {
                metadata: None,
                actor_id: format!("reset-{}", self.shared.cfg.hostname),
            }],
        }))
    }

    async fn service_list(
        &self,
        req: Request<()>,
    ) -> Result<Response<machine::ServiceListResponse>, Status> {
        route_or_forward!(
            self,
            req,
            unary,
            "/machine.MachineService/ServiceList",
            READ
        );
        Ok(Response::new(machine::ServiceListResponse {
            messages: vec![machine::ServiceList {
                metadata: None,
                services: self.service_list(),
            }],
        }))
    }

    async fn version(
        &self,
        req: Request<()>,
    ) -> Result<Response<machine::VersionResponse>, Status> {
        route_or_forward!(self, req, unary, "/machine.MachineService/Version", READ);
        // `v1alpha1_server.go`, Version (v1.13.9): `version.NewVersion()`
        // (`pkg/machinery/version/version.go`: tag and SHA from the build, `Built` never set,
        // Go's runtime version, GOOS, GOARCH); the platform's name and mode (`metal`, from
        // `internal/app/machined/pkg/runtime/mode.go`); `features` only once a machine config
        // is loaded (absent in maintenance mode).
        let configured = self.shared.installed().is_some();
        Ok(Response::new(machine::VersionResponse {
            messages: vec![machine::Version {
                metadata: None,
                version: Some(machine::VersionInfo {
                    // The version the running system booted (after an upgrade and a
                    // reboot, the new one: see [`upgrade`]).
                    tag: upgrade::running(&self.shared),
                    // The Makefile's `git describe --always --abbrev=8` of the tag's commit.
                    sha: "3ebd10a7".into(),
                    built: String::new(),
                    // The Makefile's GO_VERSION is 1.26; the patch release is not recorded
                    // in the tree and talboot never reads this field.
                    go_version: "go1.26.0".into(),
                    os: "linux".into(),
                    arch: "amd64".into(),
                }),
                platform: Some(machine::PlatformInfo {
                    name: "metal".into(),
                    mode: "metal".into(),
                }),
                features: configured.then_some(machine::FeaturesInfo { rbac: true }),
            }],
        }))
    }
}

/// The stage as `talosctl get machinestatus` prints it (pkg/machinery/resources/runtime/machinestage.go).
fn stage_name(stage: runtime::RuntimeMachineStage) -> &'static str {
    use runtime::RuntimeMachineStage as Stage;
    match stage {
        Stage::MachineStageUnknown => "unknown",
        Stage::MachineStageBooting => "booting",
        Stage::MachineStageInstalling => "installing",
        Stage::MachineStageMaintenance => "maintenance",
        Stage::MachineStageRunning => "running",
        Stage::MachineStageRebooting => "rebooting",
        Stage::MachineStageShuttingDown => "shutting down",
        Stage::MachineStageResetting => "resetting",
        Stage::MachineStageUpgrading => "upgrading",
    }
}

pub(super) fn reply_apply(details: &str) -> machine::ApplyConfigurationResponse {
    machine::ApplyConfigurationResponse {
        messages: vec![machine::ApplyConfiguration {
            metadata: None,
            warnings: vec![],
            mode: machine::apply_configuration_request::Mode::NoReboot as i32,
            mode_details: details.into(),
        }],
    }
}

#[tonic::async_trait]
impl StorageService for NodeApi {
    async fn disks(&self, req: Request<()>) -> Result<Response<storage::DisksResponse>, Status> {
        route_or_forward!(self, req, unary, "/storage.StorageService/Disks", READ);
        // storaged lists every block.Disk (ID order) and marks the SystemDisk's one; that
        // resource exists once Talos runs from the disk it installed to (server.go, Disks).
        let system = self
            .shared
            .installed()
            .and_then(|_| self.shared.install_disk())
            .and_then(Result::ok);
        Ok(Response::new(storage::DisksResponse {
            messages: vec![storage::Disks {
                metadata: None,
                disks: talos_order(&self.shared.cfg.disks)
                    .iter()
                    .map(|d| d.legacy(system.as_deref() == Some(d.spec.dev_path.as_str())))
                    .collect(),
            }],
        }))
    }
}

pub(super) fn resource(
    namespace: &str,
    kind: &str,
    id: &str,
    proto_spec: Vec<u8>,
    yaml_spec: String,
) -> cosi::Resource {
    cosi::Resource {
        metadata: Some(cosi::Metadata {
            namespace: namespace.into(),
            r#type: kind.into(),
            id: id.into(),
            version: "1".into(),
            phase: "running".into(),
            ..Default::default()
        }),
        spec: Some(cosi::Spec {
            proto_spec,
            yaml_spec,
        }),
    }
}

#[tonic::async_trait]
impl cosi::state_server::State for NodeApi {
    async fn get(
        &self,
        req: Request<cosi::GetRequest>,
    ) -> Result<Response<cosi::GetResponse>, Status> {
        route_or_forward!(self, req, unary, "/cosi.resource.State/Get", READ);
        let r = req.into_inner();
        if let Some(reply) = machine_config::cosi_get(&self.shared, &r) {
            return reply.map(Response::new);
        }
        if let Some(reply) = manifests::cosi_get(&self.shared, &r) {
            return reply.map(Response::new);
        }
        if let Some(reply) = unattended::cosi_get(&self.shared, &r) {
            return reply.map(Response::new);
        }
        if let Some(reply) = super::security::cosi_get(&self.shared, &r) {
            return reply.map(Response::new);
        }
        if (r.namespace.as_str(), r.r#type.as_str(), r.id.as_str())
            == ("runtime", "MachineStatuses.runtime.talos.dev", "machine")
        {
            let spec = self.machine_status();
            let yaml = format!(
                "stage: {}\nstatus:\n  ready: {}\n",
                stage_name(spec.stage()),
                spec.status.as_ref().is_some_and(|s| s.ready)
            );
            return Ok(Response::new(cosi::GetResponse {
                resource: Some(resource(
                    &r.namespace,
                    &r.r#type,
                    &r.id,
                    spec.encode_to_vec(),
                    yaml,
                )),
            }));
        }
        let known = (r.namespace.as_str(), r.r#type.as_str(), r.id.as_str())
            == (
                "hardware",
                "SystemInformations.hardware.talos.dev",
                "systeminformation",
            );
        if !known || !self.shared.cfg.smbios {
            // cosi-project/runtime v1.14.1: ErrNotFound "resource <type>(<ns>/<id>@undefined)
            // doesn't exist" (pkg/resource/metadata.go String), sent as codes.NotFound.
            return Err(Status::not_found(format!(
                "resource {}({}/{}@undefined) doesn't exist",
                r.r#type, r.namespace, r.id
            )));
        }
        let spec = hardware::SystemInformationSpec {
            manufacturer: "QEMU".into(),
            product_name: "Standard PC (Q35 + ICH9, 2009)".into(),
            version: "pc-q35-8.2".into(),
            serial_number: format!("SER-{}", self.shared.cfg.hostname),
            uuid: self.shared.cfg.system_uuid.clone(),
            wake_up_type: "Power Switch".into(),
            sku_number: String::new(),
        };
        let yaml = format!(
            "manufacturer: {}\nproductName: {}\nuuid: {}\n",
            spec.manufacturer, spec.product_name, spec.uuid
        );
        Ok(Response::new(cosi::GetResponse {
            resource: Some(resource(
                &r.namespace,
                &r.r#type,
                &r.id,
                spec.encode_to_vec(),
                yaml,
            )),
        }))
    }

    type ListStream = ListStream;

    async fn list(
        &self,
        req: Request<cosi::ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        route_or_forward!(self, req, stream, "/cosi.resource.State/List", READ);
        let r = req.into_inner();
        if let Some(items) = manifests::cosi_list(&self.shared, &r) {
            let items: Vec<Result<cosi::ListResponse, Status>> = items
                .into_iter()
                .map(|resource| {
                    Ok(cosi::ListResponse {
                        resource: Some(resource),
                    })
                })
                .collect();
            return Ok(Response::new(Box::pin(tokio_stream::iter(items))));
        }
        if (r.namespace.as_str(), r.r#type.as_str()) != ("runtime", "Disks.block.talos.dev") {
            return Err(Status::not_found(format!(
                "resource type {}/{} is not registered in the test double",
                r.namespace, r.r#type
            )));
        }
        let items: Vec<Result<cosi::ListResponse, Status>> = self
            .disk_specs()
            .into_iter()
            .map(|(id, spec)| {
                let yaml = format!("dev_path: {}\nsize: {}\n", spec.dev_path, spec.size);
                Ok(cosi::ListResponse {
                    resource: Some(resource(
                        &r.namespace,
                        &r.r#type,
                        &id,
                        spec.encode_to_vec(),
                        yaml,
                    )),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}
