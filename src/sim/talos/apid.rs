//! The Talos double's apid front: who is calling (roles from the client certificate), where
//! the call goes (this node, or relayed to the peer a `node` header names) and whether the
//! caller may make it, plus the node facts the services read.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use prost::Message;
use tokio_stream::Stream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status};

use super::etcd;
use super::{Installed, Served, Shared, lock};
use crate::sim::disks::talos_order;
use crate::sim::pki::{self, SimCa};
use crate::talos::api::common;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::machine::{self};
use crate::talos::api::talos::resource::definitions::{block, runtime};

/// Who is calling and where the call goes.
pub(super) enum Route {
    Local {
        roles: Vec<String>,
        relayed: bool,
    },
    Forward {
        addr: SocketAddr,
        roles: Vec<String>,
    },
}

// The authorization rules machined applies to every call (the double models the ones talboot
// makes): `internal/app/machined/pkg/system/services/machined.go` (`rules`, siderolabs/talos
// v1.13.9). A method without a rule falls back to os:admin.
pub(super) const READ: &[&str] = &["os:admin", "os:operator", "os:reader"];
/// `EtcdMemberList` also admits os:etcd:backup (machined.go `rules`).
pub(super) const READ_ETCD: &[&str] = &["os:admin", "os:operator", "os:reader", "os:etcd:backup"];
pub(super) const OPERATE: &[&str] = &["os:admin", "os:operator"];
pub(super) const ADMIN: &[&str] = &["os:admin"];
/// `ApplyConfiguration` admits os:reader at the authorizer ("for maintenance only, verified
/// in the handler": the handler refuses non-admins once the node is configured).
pub(super) const APPLY: &[&str] = &["os:admin", "os:reader"];

/// `role.Parse` (`pkg/machinery/role/role.go`, v1.13.9): each Organization / `talos-role`
/// value trimmed, empty ones dropped, unknown ones kept (they match no rule).
fn parse_roles<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut roles: Vec<String> = values
        .into_iter()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
        .collect();
    roles.sort();
    roles.dedup();
    roles
}

/// siderolabs/net v0.4.0 `AddressContainsPort` (the `net` module Talos v1.13.9 pins), which
/// apid's `NewAPID` uses to refuse a `node` target with a port: Go's `net.SplitHostPort`
/// succeeds, and a bracketed host with a colon is an IP address.
fn address_contains_port(addr: &str) -> bool {
    let host = if let Some(rest) = addr.strip_prefix('[') {
        // "[host]:port" (Go also accepts an empty port).
        match rest.split_once(']') {
            Some((host, tail)) if tail.starts_with(':') && !tail[1..].contains(':') => host,
            _ => return false,
        }
    } else {
        match addr.split_once(':') {
            Some((host, port)) if !port.contains(':') && !host.contains(['[', ']']) => host,
            _ => return false,
        }
    };
    !host.contains(':') || host.parse::<IpAddr>().is_ok()
}

/// The roles of a caller of a configured node. The injector's `Enabled` mode reads them from
/// the leaf certificate's Organization; a caller holding os:impersonator (another apid
/// relaying) is trusted to name the roles in `talos-role` metadata, if it sent any
/// (`pkg/grpc/middleware/authz/injector.go`, `extractRoles`; `metadata.go`).
fn caller_roles<T>(req: &Request<T>) -> Result<Vec<String>, Status> {
    let certs = req
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let orgs = pki::organizations(leaf).map_err(|e| Status::unauthenticated(e.to_string()))?;
    let mut roles = parse_roles(orgs.iter().map(String::as_str));
    if roles.iter().any(|r| r == "os:impersonator") {
        let claimed: Vec<&str> = req
            .metadata()
            .get_all("talos-role")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if !claimed.is_empty() {
            roles = parse_roles(claimed);
        }
    }
    Ok(roles)
}

/// The director's refusal of a call with `nodes` (one-to-many): a method grpc-proxy cannot
/// aggregate, no forwarding on this node, or (what talboot never sends) one it could.
fn one_to_many(method: &str, can_forward: bool) -> Status {
    const ONE_TO_MANY: &[&str] = &[
        "/machine.MachineService/",
        "/cluster.ClusterService/",
        "/inspect.InspectService/",
        "/storage.StorageService/",
        "/time.TimeService/",
    ];
    if !ONE_TO_MANY.iter().any(|p| method.starts_with(p)) {
        return Status::invalid_argument(format!(
            "one-2-many proxying is not supported for method {method}"
        ));
    }
    if !can_forward {
        return Status::permission_denied("no request forwarding");
    }
    // Deliberately not simulated: talboot never sends `nodes` (it would get one
    // reply entry per node, aggregated by grpc-proxy).
    Status::invalid_argument("the test double does not implement one-to-many (`nodes`) proxying")
}

pub(super) type DataStream =
    Pin<Box<dyn Stream<Item = Result<common::Data, Status>> + Send + 'static>>;
pub(super) type ListStream =
    Pin<Box<dyn Stream<Item = Result<cosi::ListResponse, Status>> + Send + 'static>>;

#[derive(Clone)]
pub(super) struct NodeApi {
    pub(super) shared: Arc<Shared>,
}

impl NodeApi {
    /// apid in front of machined: who the caller is (the authz injector) and where the call
    /// goes (the director). `method` is the full gRPC method name.
    pub(super) fn route<T>(&self, req: &Request<T>, method: &str) -> Result<Route, Status> {
        let Some(inst) = self.shared.installed() else {
            // Maintenance: `APIServiceConfigController` starts apid with NodeRoutingDisabled,
            // ReadonlyRoleMode and SkipVerifyingClientCert
            // (`internal/app/machined/pkg/controllers/runtime/api_service_config.go`); the
            // director then sends everything to the local machined whatever `node` says
            // (`internal/app/apid/pkg/director/director.go`, `skipRouting`), and the injector
            // in `ReadOnlyWithAdminOnSiderolink` mode makes every non-SideroLink peer os:reader
            // (`pkg/grpc/middleware/authz/injector.go`). SideroLink is not simulated.
            return Ok(Route::Local {
                roles: vec!["os:reader".into()],
                relayed: false,
            });
        };
        let roles = caller_roles(req)?;
        self.direct(req.metadata(), method, roles, inst.os_ca.is_some())
    }

    /// The director (`director.go`, `Router.Director`), in its order: a relayed call is
    /// served here; `nodes` (one-to-many) is refused; `node` is forwarded, unless this node
    /// cannot forward and the target is itself. `can_forward`: only a control plane's apid
    /// holds a client certificate (os:impersonator) to dial other nodes with
    /// (`internal/app/machined/pkg/controllers/secrets/api.go`: `generateControlPlane` issues
    /// one, `generateWorker` sets `Client = nil`), and without one `service.go` builds the
    /// router with no remote backend factory.
    fn direct(
        &self,
        meta: &tonic::metadata::MetadataMap,
        method: &str,
        roles: Vec<String>,
        can_forward: bool,
    ) -> Result<Route, Status> {
        if meta.get("proxyfrom").is_some() {
            // Already relayed once: always served here.
            return Ok(Route::Local {
                roles,
                relayed: true,
            });
        }
        let node: Vec<&str> = meta
            .get_all("node")
            .iter()
            .map(|v| v.to_str().unwrap_or(""))
            .collect();
        let nodes: Vec<&str> = meta
            .get_all("nodes")
            .iter()
            .map(|v| v.to_str().unwrap_or(""))
            .collect();
        if node.len() > 1 {
            return Err(Status::invalid_argument(
                "node metadata must be single-valued",
            ));
        }
        let mut ok_node = !node.is_empty();
        let mut ok_nodes = !nodes.is_empty();
        if !can_forward {
            // Without forwarding, a single target naming this node is served here
            // (`IsLocalTarget`: its addresses and hostname, `director/local_address.go`).
            if ok_node && self.is_local_target(node[0]) {
                ok_node = false;
            }
            if ok_nodes && nodes.len() == 1 && self.is_local_target(nodes[0]) {
                ok_nodes = false;
            }
        }
        if ok_nodes {
            return Err(one_to_many(method, can_forward));
        }
        if ok_node {
            return self.forward(node[0], roles, can_forward);
        }
        Ok(Route::Local {
            roles,
            relayed: false,
        })
    }

    /// A call with `node` set to another node: forwarded there over the network.
    fn forward(
        &self,
        target: &str,
        roles: Vec<String>,
        can_forward: bool,
    ) -> Result<Route, Status> {
        if !can_forward {
            return Err(Status::permission_denied("no request forwarding"));
        }
        // `internal/app/apid/pkg/backend/apid.go`, `NewAPID`; the director wraps the
        // factory's error in codes.Internal (`singleDirector`).
        if target.is_empty() || address_contains_port(target) {
            return Err(Status::internal(format!("invalid target {target:?}")));
        }
        let addr = self.shared.cluster.resolve(target).ok_or_else(|| {
            Status::unavailable(format!(
                "connection error: desc = \"transport: Error while dialing: dial tcp: \
                 lookup {target}: no such host\""
            ))
        })?;
        // Even a target naming this very node is dialled over the network (with the
        // forwarding factory present, `Director` has no local shortcut).
        Ok(Route::Forward { addr, roles })
    }

    /// apid's `IsLocalTarget`: one of this node's addresses or its hostname.
    pub(super) fn is_local_target(&self, target: &str) -> bool {
        let cfg = &self.shared.cfg;
        target == cfg.hostname
            || target
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip == cfg.ip || cfg.san_ips().contains(&ip))
    }

    /// machined's `Authorizer` (`pkg/grpc/middleware/authz/authorizer.go`): the caller needs
    /// one of the method's roles, else PermissionDenied "not authorized" (`ErrNotAuthorized`).
    pub(super) fn allow(
        &self,
        rpc: &'static str,
        roles: &[String],
        relayed: bool,
        allowed: &[&str],
    ) -> Result<(), Status> {
        if !roles.iter().any(|r| allowed.contains(&r.as_str())) {
            return Err(Status::permission_denied("not authorized"));
        }
        lock(&self.shared.stats.served).push(Served {
            rpc,
            roles: roles.to_vec(),
            relayed,
        });
        Ok(())
    }

    /// A channel to a peer's apid as this node's apid dials it
    /// (`internal/app/apid/pkg/backend/apid.go`, `GetConnection`): OS CA verified, the
    /// control plane's `os:impersonator` client certificate (`secrets/api.go`,
    /// `generateControlPlane`), port 50000 of the target, from this node's own address.
    pub(super) async fn relay_channel(
        &self,
        addr: SocketAddr,
    ) -> Result<tonic::transport::Channel, Status> {
        let inst = self
            .shared
            .installed()
            .ok_or_else(|| Status::unavailable("relay from a node in maintenance"))?;
        let ca = inst
            .os_ca
            .as_ref()
            .ok_or_else(|| Status::permission_denied("no request forwarding"))?;
        let imp = ca
            .client(
                &["os:impersonator"],
                vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
            )
            .map_err(|e| Status::internal(e.to_string()))?;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&inst.ca_cert_pem))
            .identity(Identity::from_pem(&imp.cert_pem, &imp.key_pem));
        Endpoint::from_shared(format!("https://{addr}"))
            .map_err(|e| Status::internal(e.to_string()))?
            .local_address(Some(self.shared.cfg.ip))
            .connect_timeout(Duration::from_secs(5))
            .tls_config(tls)
            .map_err(|e| Status::internal(e.to_string()))?
            .connect()
            .await
            .map_err(|e| Status::unavailable(format!("connection error: {addr}: {e}")))
    }

    /// The relayed request (`GetConnection`): the caller's metadata minus `node` and
    /// `nodes`, the caller's roles in `talos-role` (`authz.SetMetadata`, replacing any the
    /// caller sent), and `proxyfrom` set to the `:authority` the caller dialled (tonic does
    /// not expose `:authority`; the listener's own address is what talboot dials).
    pub(super) fn relay_request<T>(&self, req: Request<T>, roles: &[String]) -> Request<T> {
        let authority = req
            .local_addr()
            .unwrap_or_else(|| self.shared.cfg.addr())
            .to_string();
        let (mut meta, _, msg) = req.into_parts();
        meta.remove("node");
        meta.remove("nodes");
        meta.remove("talos-role");
        for role in roles {
            if let Ok(v) = MetadataValue::try_from(role.as_str()) {
                meta.append("talos-role", v);
            }
        }
        if let Ok(v) = MetadataValue::try_from(authority) {
            meta.insert("proxyfrom", v);
        }
        Request::from_parts(meta, tonic::Extensions::default(), msg)
    }

    pub(super) async fn forward_unary<Req, Resp>(
        &self,
        addr: SocketAddr,
        roles: &[String],
        path: &'static str,
        req: Request<Req>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Message + Send + Sync + 'static,
        Resp: Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.relay_channel(addr).await?);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("connection error: {e}")))?;
        grpc.unary(
            self.relay_request(req, roles),
            PathAndQuery::from_static(path),
            tonic_prost::ProstCodec::default(),
        )
        .await
    }

    pub(super) async fn forward_stream<Req, Resp>(
        &self,
        addr: SocketAddr,
        roles: &[String],
        path: &'static str,
        req: Request<Req>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<Resp, Status>> + Send + 'static>>>, Status>
    where
        Req: Message + Send + Sync + 'static,
        Resp: Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.relay_channel(addr).await?);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("connection error: {e}")))?;
        let resp = grpc
            .server_streaming(
                self.relay_request(req, roles),
                PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::<Req, Resp>::default(),
            )
            .await?;
        let stream: Pin<Box<dyn Stream<Item = Result<Resp, Status>> + Send>> =
            Box::pin(resp.into_inner());
        Ok(Response::new(stream))
    }

    /// `ServiceList` (`v1alpha1_server.go`): every loaded service as
    /// `ServiceRunner.AsProto` (`internal/app/machined/pkg/system/service_runner.go`), sorted
    /// by id (`system.go`, `List`), health always present (`health/status.go`, `AsProto`:
    /// `unknown` until a check ran, or for services without one). Maintenance runs the
    /// sequencer's early services (`v1alpha1_sequencer.go`, Initialize: udevd, machined,
    /// apid, auditd, syslogd, containerd, and the dashboard unless disabled on the kernel
    /// command line); a configured node adds cri and kubelet, and trustd and etcd on control
    /// planes (`v1alpha1_sequencer_tasks.go`, `StartAllServices`, which runs in the boot
    /// sequence of the system booted from disk: etcd is listed from then on, with its state,
    /// health and last event as [`etcd::service_info`] derives them). Other services' events
    /// are not simulated.
    pub(super) fn service_list(&self) -> Vec<machine::ServiceInfo> {
        let health = |unknown: bool| machine::ServiceHealth {
            unknown,
            healthy: !unknown,
            last_message: String::new(),
            last_change: None,
        };
        let running = |id: &str| machine::ServiceInfo {
            id: id.into(),
            state: "Running".into(),
            events: None,
            // The dashboard has no health check.
            health: Some(health(id == "dashboard")),
        };
        const EARLY: [&str; 7] = [
            "apid",
            "auditd",
            "containerd",
            "dashboard",
            "machined",
            "syslogd",
            "udevd",
        ];
        let mut list: Vec<_> = EARLY.map(running).to_vec();
        if let Some(inst) = self.shared.installed() {
            list.extend(["cri", "kubelet"].map(running));
            if inst.config.is_control_plane() {
                if inst.on_disk {
                    list.push(etcd::service_info(&self.shared));
                }
                list.push(running("trustd"));
            }
        }
        list.sort_by(|a, b| a.id.cmp(&b.id));
        list
    }

    /// The `block.Disk` resources in COSI List order (sorted by ID).
    pub(super) fn disk_specs(&self) -> Vec<(String, block::DiskSpec)> {
        talos_order(&self.shared.cfg.disks)
            .into_iter()
            .map(|d| (d.id, d.spec))
            .collect()
    }

    /// `runtime.MachineStatus` as `MachineStatusController` computes it
    /// (siderolabs/talos v1.13.9 `internal/app/machined/pkg/controllers/runtime/machine_status.go`):
    /// readiness checks (time, network, services, static pods, node Ready) only apply in the
    /// booting and running stages; in every other stage (installing, rebooting, resetting,
    /// maintenance) `ready` is true with no unmet conditions, so `ready` alone never says
    /// "installed". The double models the services check only (a control plane's etcd must
    /// run and not be known unhealthy, see [`etcd::readiness_problem`]), and stands in for
    /// the static pods while the boot sequence runs.
    pub(super) fn machine_status(&self) -> runtime::MachineStatusSpec {
        use runtime::RuntimeMachineStage as Stage;
        let stage = *lock(&self.shared.stage);
        let mut unmet = Vec::new();
        if matches!(
            stage,
            Stage::MachineStageBooting | Stage::MachineStageRunning
        ) {
            match self.shared.on_disk() {
                Some(inst) if inst.config.is_control_plane() => {
                    if let Some(reason) = etcd::readiness_problem(&self.shared) {
                        unmet.push(runtime::UnmetCondition {
                            name: "services".into(),
                            reason: reason.into(),
                        });
                    }
                }
                Some(_) => {}
                None => unmet.push(runtime::UnmetCondition {
                    name: "services".into(),
                    reason: "kubelet not running".into(),
                }),
            }
            if stage == Stage::MachineStageBooting {
                unmet.push(runtime::UnmetCondition {
                    name: "staticPods".into(),
                    reason: "boot sequence running".into(),
                });
            }
        }
        runtime::MachineStatusSpec {
            stage: stage as i32,
            status: Some(runtime::MachineStatusStatus {
                ready: unmet.is_empty(),
                unmet_conditions: unmet,
            }),
        }
    }

    /// `pkg/kubeconfig/generate.go`, `GenerateAdmin` (siderolabs/talos v1.13.9): cluster
    /// `cluster.clusterName`, server `cluster.controlPlane.endpoint`, CA data the Kubernetes
    /// CA (`cluster.ca.crt`, not the OS CA), user and context `admin@<cluster>`, namespace
    /// `default`, and a client certificate minted on every call from `cluster.ca` (Talos:
    /// CN=admin, O=system:masters, clientAuth). Without `cluster.ca` Talos cannot build the
    /// CA and the call fails. The double signs with `cluster.ca` when it can load the key and
    /// falls back to a self-signed admin certificate otherwise (nothing in talboot verifies
    /// that signature); its CN is not Talos's.
    pub(super) fn kubeconfig_for(&self, inst: &Installed) -> Result<Vec<u8>, Status> {
        use base64::engine::general_purpose::STANDARD;
        let (k8s_ca, k8s_key) =
            inst.config.cluster_ca.as_ref().ok_or_else(|| {
                Status::unknown("error getting Kubernetes CA: cluster.ca is not set")
            })?;
        let signed = k8s_key.as_deref().and_then(|key| {
            let key =
                String::from_utf8(crate::talos::tls::normalize_key_pem(key.as_bytes())).ok()?;
            let ca = SimCa::from_pem(k8s_ca, &key).ok()?;
            ca.client(
                &["system:masters"],
                vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
            )
            .ok()
        });
        let admin = match signed {
            Some(admin) => admin,
            None => pki::kube_admin_cert().map_err(|e| Status::internal(e.to_string()))?,
        };
        let cluster = &inst.config.cluster_name;
        Ok(format!(
            "apiVersion: v1\nkind: Config\nclusters:\n  - name: {cluster}\n    cluster:\n      \
             server: {endpoint}\n      certificate-authority-data: {ca}\nusers:\n  - name: \
             admin@{cluster}\n    user:\n      client-certificate-data: {crt}\n      \
             client-key-data: {key}\ncontexts:\n  - context:\n      cluster: {cluster}\n      \
             namespace: default\n      user: admin@{cluster}\n    name: admin@{cluster}\n\
             current-context: admin@{cluster}\n",
            endpoint = inst.config.endpoint,
            ca = STANDARD.encode(k8s_ca),
            crt = STANDARD.encode(&admin.cert_pem),
            key = STANDARD.encode(&admin.key_pem),
        )
        .into_bytes())
    }
}
