//! The tonic client for the Talos API (apid, TCP 50000).
//!
//! Two ways in, matching the two lives of a node:
//! * **maintenance** ([`TalosClient::maintenance`]): TLS with ALPN h2, the server certificate
//!   *not* verified (it comes from a throwaway CA made at boot), no client certificate. The
//!   node treats us as `os:reader`: enough to read hardware facts and apply a config.
//! * **secured** ([`TalosClient::secured`]): mutual TLS with the admin certificate, the
//!   server verified against the cluster's OS CA.
//!
//! [`TalosClient::with_node`] sets the single-valued `node` header, so the endpoint dialled
//! relays the call to another node (`talosctl -e <cp> -n <node>`). The one-to-many `nodes`
//! header is never used: its per-node errors hide in OK replies. Replies are still checked for
//! `metadata.error`, in case a proxy put one there.
//!
//! Every call has a deadline (sent as `grpc-timeout` and enforced locally, including while a
//! stream is read). Idempotent calls are retried with backoff ([`super::retry`]); apply,
//! bootstrap, reset and reboot are made exactly once.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status, Streaming};

use super::api::common;
use super::api::cosi::resource as cosi;
use super::api::machine::{
    self, ApplyConfigurationRequest, BootstrapRequest, EtcdMemberListRequest,
    ImageServicePullProgress, ImageServicePullRequest, InstallArtifactsSource,
    LifecycleServiceUpgradeRequest, RebootRequest, ResetPartitionSpec, ResetRequest,
    apply_configuration_request, image_service_client, lifecycle_service_client,
    machine_service_client, reboot_request, reset_request,
};
use super::api::storage::{self, storage_service_client};
use super::api::talos::resource::definitions::{block, hardware, runtime};
use super::archive;
use super::error::{CallContext, Rpc, TalosError, Target, classify, classify_code};
use super::retry::{RetryPolicy, retry_idempotent};
use super::tls::{MaintenanceVerifier, check_cert_pem, check_key_pem, normalize_key_pem};
use super::{APID_PORT, MAX_MESSAGE_SIZE};

/// How long one `LifecycleService.Upgrade` stream may run (the installer writes a whole
/// system image). Generous on purpose: talosctl sets no deadline, and a stream cancelled
/// mid-install can leave the node's upgrade lock held until it reboots (siderolabs/talos
/// v1.13.9 `internal/app/lifecycle/container.go`, `streamOutput` stops reading the
/// installer's output when sending fails, so the installer can block on a full pipe and
/// `lifecycle.go`'s lock is never released): every later Upgrade is then refused with
/// "another installation/upgrade is already in progress".
const UPGRADE_DEADLINE: Duration = Duration::from_secs(3600);

/// How long one `ImageService.Pull` stream may run (an installer image is a few hundred MB;
/// the node itself retries a pull for up to 20 minutes, `internal/pkg/containers/image/
/// image.go`).
const PULL_DEADLINE: Duration = Duration::from_secs(1800);

/// The installer's output as lines. Upstream streams it in raw chunks of up to 512 bytes,
/// cut anywhere (siderolabs/talos v1.13.9 `internal/app/lifecycle/container.go`,
/// `streamOutput`), so a chunk may end mid-line or hold several lines.
#[derive(Default)]
struct LineBuffer {
    partial: String,
}

impl LineBuffer {
    fn push(&mut self, chunk: &str, out: &mut impl FnMut(&str)) {
        self.partial.push_str(chunk);
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            out(line.trim_end_matches(['\n', '\r']));
        }
    }

    fn finish(&mut self, out: &mut impl FnMut(&str)) {
        if !self.partial.is_empty() {
            out(std::mem::take(&mut self.partial).trim_end_matches('\r'));
        }
    }
}

/// The containerd instance the installer is pulled into and run from: talosctl's default
/// (`--namespace system`: the CRI containerd, namespace `system`; siderolabs/talos v1.13.9
/// `cmd/talosctl/cmd/talos/image.go`, `containerdInstance`). Pull and Upgrade must name the
/// same instance: Upgrade looks the image up only there (`internal/app/lifecycle/
/// container.go`, `installer image %q not found in containerd store`).
pub fn installer_containerd() -> common::ContainerdInstance {
    common::ContainerdInstance {
        driver: common::ContainerDriver::Cri as i32,
        namespace: common::ContainerdNamespace::NsSystem as i32,
    }
}

/// The gRPC metadata key apid reads to relay a call to one other node.
pub(crate) const NODE_HEADER: &str = "node";

/// Admin client credentials: the cluster OS CA certificate (to verify nodes) and a client
/// certificate/key pair signed by it (roles in the Organization, e.g. `os:admin`). All PEM;
/// the key may use Talos's `ED25519 PRIVATE KEY` label.
#[derive(Clone)]
pub struct ClientCreds {
    /// PEM of the cluster OS CA certificate.
    pub ca_pem: Vec<u8>,
    /// PEM of the client certificate.
    pub crt_pem: Vec<u8>,
    /// PEM of the client private key. Never printed.
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for ClientCreds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCreds")
            .field("ca_pem", &format_args!("<{} bytes>", self.ca_pem.len()))
            .field("crt_pem", &format_args!("<{} bytes>", self.crt_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Per-call deadlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// TCP connect plus TLS handshake.
    pub connect: Duration,
    /// Any unary call.
    pub call: Duration,
    /// The Kubeconfig stream, read to the end.
    pub kubeconfig: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            call: Duration::from_secs(30),
            kubeconfig: Duration::from_secs(60),
        }
    }
}

/// Which of the two TLS setups a client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// No verification, no client certificate: a node in maintenance mode.
    Maintenance,
    /// mTLS with the admin certificate, server verified against the OS CA.
    Secured,
}

/// What ApplyConfiguration reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// The mode the node actually used; `None` if it named a mode newer than our protos.
    pub mode: Option<apply_configuration_request::Mode>,
    /// Human-readable explanation from the node.
    pub mode_details: String,
    /// Config validation warnings.
    pub warnings: Vec<String>,
}

/// A runtime sequence that failed on the node (from its `Events` stream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SequenceFailure {
    /// The sequence, e.g. `install`, `reset`, `boot`.
    pub sequence: String,
    /// Talos's message, e.g. `sequence failed: ... error pulling image ...`.
    pub message: String,
}

/// A disk as COSI `Disks.block.talos.dev` describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct CosiDisk {
    /// Resource id: the bare kernel device name (`sda`, `nvme0n1`), never a path; the path
    /// is `spec.dev_path` (`/dev/sda`), which is also what `storage.Disks` calls
    /// `device_name` (siderolabs/talos v1.13.9 `internal/app/machined/pkg/controllers/block/disks.go`,
    /// `internal/app/storaged/server.go`).
    pub id: String,
    /// The typed spec.
    pub spec: block::DiskSpec,
}

/// A connection to one Talos apid endpoint (optionally relaying to another node). Cheap to
/// clone; clones share the HTTP/2 connection.
#[derive(Clone)]
pub struct TalosClient {
    channel: Channel,
    endpoint: SocketAddr,
    security: Security,
    node: Option<(String, MetadataValue<tonic::metadata::Ascii>)>,
    deadlines: Deadlines,
    retry: RetryPolicy,
}

impl fmt::Debug for TalosClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosClient")
            .field("endpoint", &self.endpoint)
            .field("security", &self.security)
            .field("node", &self.node.as_ref().map(|(n, _)| n))
            .field("deadlines", &self.deadlines)
            .finish()
    }
}

/// `ip:50000` for a node address.
pub fn apid_addr(ip: std::net::IpAddr) -> SocketAddr {
    SocketAddr::new(ip, APID_PORT)
}

fn endpoint_for(addr: SocketAddr, deadlines: &Deadlines) -> Result<Endpoint, TalosError> {
    // `https://` plus the TLS config below; the IP literal becomes the TLS server name, so a
    // configured node's certificate must carry that IP as a SAN (Talos adds node addresses).
    let uri = format!("https://{addr}");
    Endpoint::from_shared(uri)
        .map(|e| e.connect_timeout(deadlines.connect))
        .map_err(|_| TalosError::InvalidNode {
            node: addr.to_string(),
            reason: "not usable as an https endpoint address",
        })
}

impl TalosClient {
    /// A client for a node in maintenance mode at `addr` (usually `ip:50000`). No connection
    /// is made until the first call.
    pub fn maintenance(addr: SocketAddr) -> Result<Self, TalosError> {
        let deadlines = Deadlines::default();
        let tls = ClientTlsConfig::new().timeout(deadlines.connect);
        let endpoint = endpoint_for(addr, &deadlines)?
            .tls_config_with_verifier(tls, MaintenanceVerifier::new())
            .map_err(|e| TalosError::TlsHandshake {
                target: Target {
                    endpoint: addr,
                    node: None,
                },
                detail: e.to_string(),
            })?;
        Ok(Self::from_channel(
            endpoint.connect_lazy(),
            addr,
            Security::Maintenance,
            deadlines,
        ))
    }

    /// A client for a configured node at `addr`, authenticated with `creds`.
    pub fn secured(addr: SocketAddr, creds: &ClientCreds) -> Result<Self, TalosError> {
        check_cert_pem("CA certificate", &creds.ca_pem)?;
        check_cert_pem("client certificate", &creds.crt_pem)?;
        let key = normalize_key_pem(&creds.key_pem);
        check_key_pem(&key)?;

        let deadlines = Deadlines::default();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&creds.ca_pem))
            .identity(Identity::from_pem(&creds.crt_pem, key))
            .timeout(deadlines.connect);
        let endpoint = endpoint_for(addr, &deadlines)?
            .tls_config(tls)
            .map_err(|e| TalosError::Credentials {
                what: "client certificate",
                reason: format!("rejected by the TLS stack: {e}"),
            })?;
        Ok(Self::from_channel(
            endpoint.connect_lazy(),
            addr,
            Security::Secured,
            deadlines,
        ))
    }

    fn from_channel(
        channel: Channel,
        endpoint: SocketAddr,
        security: Security,
        deadlines: Deadlines,
    ) -> Self {
        Self {
            channel,
            endpoint,
            security,
            node: None,
            deadlines,
            retry: RetryPolicy::default(),
        }
    }

    /// The same connection, with every call relayed by the endpoint to `node` (a bare IP
    /// address or hostname, as apid wants it). Maintenance-mode nodes ignore the header.
    pub fn with_node(&self, node: &str) -> Result<Self, TalosError> {
        let value = validate_node(node)?;
        Ok(Self {
            node: Some((node.to_owned(), value)),
            ..self.clone()
        })
    }

    /// Replaces the deadlines for calls made from now on (the connect deadline applies to
    /// clients built afterwards, as the endpoint is fixed at construction).
    pub(crate) fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// Replaces the retry policy of idempotent calls.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The endpoint dialled.
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// Which TLS setup this client uses.
    pub fn security(&self) -> Security {
        self.security
    }

    /// Where calls go, for messages.
    pub fn target(&self) -> Target {
        Target {
            endpoint: self.endpoint,
            node: self.node.as_ref().map(|(n, _)| n.clone()),
        }
    }

    fn ctx(&self, rpc: Rpc, deadline: Duration) -> CallContext {
        CallContext {
            target: self.target(),
            rpc,
            maintenance: self.security == Security::Maintenance,
            deadline,
        }
    }

    fn request<T>(&self, msg: T, deadline: Duration) -> Request<T> {
        let mut req = Request::new(msg);
        req.set_timeout(deadline);
        if let Some((_, value)) = &self.node {
            req.metadata_mut().insert(NODE_HEADER, value.clone());
        }
        req
    }

    fn machine(&self) -> machine_service_client::MachineServiceClient<Channel> {
        machine_service_client::MachineServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn storage(&self) -> storage_service_client::StorageServiceClient<Channel> {
        storage_service_client::StorageServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn cosi(&self) -> cosi::state_client::StateClient<Channel> {
        cosi::state_client::StateClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    /// Runs one unary call under the deadline and maps its failure.
    async fn once<T, Fut>(&self, rpc: Rpc, deadline: Duration, fut: Fut) -> Result<T, TalosError>
    where
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let ctx = self.ctx(rpc, deadline);
        match tokio::time::timeout(deadline, fut).await {
            Err(_) => Err(TalosError::Timeout {
                target: ctx.target,
                rpc,
                after: deadline,
            }),
            Ok(Err(status)) => {
                let err = classify(&status, &ctx);
                tracing::debug!(rpc = rpc.path(), target = %ctx.target, code = ?status.code(), error = %err, "talos call failed");
                Err(err)
            }
            Ok(Ok(resp)) => Ok(resp.into_inner()),
        }
    }

    /// Runs an idempotent call with the retry policy.
    async fn idempotent<T, F, Fut>(&self, rpc: Rpc, op: F) -> Result<T, TalosError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TalosError>>,
    {
        debug_assert!(rpc.idempotent());
        retry_idempotent(self.retry, rpc.path(), op).await
    }

    /// One unary call whose reply lists per-node entries: sent with the call deadline and the
    /// `node` header, its failure classified, every entry checked for `metadata.error`, and
    /// exactly one entry expected. Idempotent RPCs are retried with the retry policy; the
    /// others are made exactly once. `call` makes the call on a clone of `client`.
    async fn unary<C, Req, Resp, F, Fut>(
        &self,
        rpc: Rpc,
        client: C,
        req: Req,
        call: F,
    ) -> Result<Resp::Entry, TalosError>
    where
        C: Clone,
        Req: Clone,
        Resp: Reply,
        F: Fn(C, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        if rpc.idempotent() {
            self.idempotent(rpc, || {
                self.unary_attempt(rpc, client.clone(), req.clone(), &call)
            })
            .await
        } else {
            self.unary_attempt(rpc, client, req, &call).await
        }
    }

    async fn unary_attempt<C, Req, Resp, F, Fut>(
        &self,
        rpc: Rpc,
        client: C,
        req: Req,
        call: &F,
    ) -> Result<Resp::Entry, TalosError>
    where
        Resp: Reply,
        F: Fn(C, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let d = self.deadlines.call;
        let resp = self
            .once(rpc, d, call(client, self.request(req, d)))
            .await?;
        resp.into_entry(&self.ctx(rpc, d))
    }

    /// Opens a server stream and reads it to its end, all under one deadline `d`, retried
    /// with the retry policy (every streamed RPC here is a read). `drain` reads the stream.
    async fn streamed<C, Req, Item, Out, F, Fut, D, DFut>(
        &self,
        rpc: Rpc,
        d: Duration,
        client: C,
        req: Req,
        open: F,
        drain: D,
    ) -> Result<Out, TalosError>
    where
        C: Clone,
        Req: Clone,
        F: Fn(C, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Streaming<Item>>, Status>>,
        D: Fn(Streaming<Item>) -> DFut,
        DFut: Future<Output = Result<Out, Status>>,
    {
        self.idempotent(rpc, || async {
            let read = async {
                let stream = open(client.clone(), self.request(req.clone(), d))
                    .await?
                    .into_inner();
                drain(stream).await.map(Response::new)
            };
            self.once(rpc, d, read).await
        })
        .await
    }

    /// `Version`: the Talos version the node runs. Works in maintenance mode, so it doubles as
    /// the maintenance probe.
    pub async fn version(&self) -> Result<machine::Version, TalosError> {
        self.unary(Rpc::Version, self.machine(), (), |mut c, r| async move {
            c.version(r).await
        })
        .await
    }

    /// `storage.Disks`: the node's disks (legacy API, served in maintenance mode too). Each
    /// `device_name` is the full path (`/dev/sda`): storaged sets it to
    /// `filepath.Join("/dev", id)` (siderolabs/talos v1.13.9 `internal/app/storaged/server.go`).
    pub async fn disks(&self) -> Result<Vec<storage::Disk>, TalosError> {
        let entry = self
            .unary(Rpc::Disks, self.storage(), (), |mut c, r| async move {
                c.disks(r).await
            })
            .await?;
        Ok(entry.disks)
    }

    /// COSI `hardware/SystemInformations.hardware.talos.dev/systeminformation`: SMBIOS facts
    /// (the system UUID identifies a machine across reinstalls). `None` when the node has no
    /// such resource: on a machine without SMBIOS tables Talos never creates it
    /// (siderolabs/talos v1.13.9 `internal/app/machined/pkg/controllers/hardware/system.go`:
    /// the controller fails on `GetSMBIOSInfo`), and COSI answers NotFound.
    pub async fn system_information(
        &self,
    ) -> Result<Option<hardware::SystemInformationSpec>, TalosError> {
        let res = match self
            .cosi_get(
                "hardware",
                "SystemInformations.hardware.talos.dev",
                "systeminformation",
            )
            .await
        {
            Ok(r) => r,
            Err(TalosError::Remote {
                code: tonic::Code::NotFound,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let ctx = self.ctx(Rpc::CosiGet, self.deadlines.call);
        decode_spec(&res, &ctx).map(Some)
    }

    /// COSI `runtime/Disks.block.talos.dev`: the disks with the fields the disk selector
    /// matches on (transport, rotational, wwid, ...).
    pub async fn cosi_disks(&self) -> Result<Vec<CosiDisk>, TalosError> {
        let resources = self.cosi_list("runtime", "Disks.block.talos.dev").await?;
        let ctx = self.ctx(Rpc::CosiList, self.deadlines.call);
        resources
            .iter()
            .map(|r| {
                Ok(CosiDisk {
                    id: r
                        .metadata
                        .as_ref()
                        .map(|m| m.id.clone())
                        .unwrap_or_default(),
                    spec: decode_spec(r, &ctx)?,
                })
            })
            .collect()
    }

    /// COSI `runtime/MachineStatuses.runtime.talos.dev/machine`: the machine's stage
    /// (booting, installing, maintenance, running, rebooting, resetting, ...) and readiness,
    /// as Talos's `runtime.MachineStatusController` sets them from its sequence, phase and
    /// task events (siderolabs/talos v1.13.9
    /// `internal/app/machined/pkg/controllers/runtime/machine_status.go`). Served in
    /// maintenance mode and configured alike.
    pub(crate) async fn machine_status(&self) -> Result<runtime::MachineStatusSpec, TalosError> {
        let res = self
            .cosi_get("runtime", "MachineStatuses.runtime.talos.dev", "machine")
            .await?;
        let ctx = self.ctx(Rpc::CosiGet, self.deadlines.call);
        decode_spec(&res, &ctx)
    }

    /// The failed runtime sequences of the node's current boot, oldest first, from `Events`
    /// with every past event (`tail_events = -1`). A failed sequence is published as a
    /// `SequenceEvent` with action NOOP and an error (code FATAL, message `sequence failed:
    /// ...`) by the sequencer (siderolabs/talos v1.13.9
    /// `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_controller.go`, `Run`); LOCKED and
    /// CANCELED errors are not failures (machined ignores them too, `internal/app/machined/main.go`).
    /// The stream never ends by itself (it keeps watching), so it is read until `idle` passes
    /// without a new event, under the call deadline.
    pub(crate) async fn sequence_failures(
        &self,
        idle: Duration,
    ) -> Result<Vec<SequenceFailure>, TalosError> {
        let req = machine::EventsRequest {
            tail_events: -1,
            tail_id: String::new(),
            tail_seconds: 0,
            with_actor_id: String::new(),
        };
        self.streamed(
            Rpc::Events,
            self.deadlines.call,
            self.machine(),
            req,
            |mut c, r| async move { c.events(r).await },
            |mut stream| async move {
                let mut out = Vec::new();
                while let Ok(next) = tokio::time::timeout(idle, stream.message()).await {
                    let Some(ev) = next? else { break };
                    let Some(any) = ev.data else { continue };
                    if any.type_url != "talos/runtime/machine.SequenceEvent" {
                        continue;
                    }
                    let Ok(seq) = machine::SequenceEvent::decode(any.value.as_slice()) else {
                        continue;
                    };
                    if let Some(err) = seq.error
                        && err.code == crate::talos::api::common::Code::Fatal as i32
                    {
                        out.push(SequenceFailure {
                            sequence: seq.sequence,
                            message: err.message,
                        });
                    }
                }
                Ok(out)
            },
        )
        .await
    }

    /// COSI `State.Get` of one resource. `NotFound` comes back as `Remote { code: NotFound }`.
    pub async fn cosi_get(
        &self,
        namespace: &str,
        kind: &str,
        id: &str,
    ) -> Result<cosi::Resource, TalosError> {
        let req = cosi::GetRequest {
            namespace: namespace.to_owned(),
            r#type: kind.to_owned(),
            id: id.to_owned(),
            options: Some(cosi::GetOptions {}),
        };
        self.unary(Rpc::CosiGet, self.cosi(), req, |mut c, r| async move {
            c.get(r).await
        })
        .await
    }

    /// COSI `State.List` of every resource of a type.
    pub(crate) async fn cosi_list(
        &self,
        namespace: &str,
        kind: &str,
    ) -> Result<Vec<cosi::Resource>, TalosError> {
        let req = cosi::ListRequest {
            namespace: namespace.to_owned(),
            r#type: kind.to_owned(),
            options: Some(cosi::ListOptions::default()),
        };
        self.streamed(
            Rpc::CosiList,
            self.deadlines.call,
            self.cosi(),
            req,
            |mut c, r| async move { c.list(r).await },
            |mut stream| async move {
                let mut out = Vec::new();
                while let Some(item) = stream.message().await? {
                    if let Some(r) = item.resource {
                        out.push(r);
                    }
                }
                Ok(out)
            },
        )
        .await
    }

    /// `ApplyConfiguration` with mode AUTO (never the zero value REBOOT, which Talos v1.14
    /// refuses on configured nodes) and no dry run. Made exactly once: a lost reply does not
    /// mean the config was not applied.
    pub async fn apply_configuration(&self, config: &[u8]) -> Result<ApplyOutcome, TalosError> {
        let req = ApplyConfigurationRequest {
            data: config.to_vec(),
            mode: apply_configuration_request::Mode::Auto as i32,
            dry_run: false,
            try_mode_timeout: None,
        };
        let entry = self
            .unary(
                Rpc::ApplyConfiguration,
                self.machine(),
                req,
                |mut c, r| async move { c.apply_configuration(r).await },
            )
            .await?;
        Ok(ApplyOutcome {
            mode: apply_configuration_request::Mode::try_from(entry.mode).ok(),
            mode_details: entry.mode_details,
            warnings: entry.warnings,
        })
    }

    /// `ApplyConfiguration` on a configured node with an explicit mode, optionally as a dry
    /// run (the node answers with its own diff in `mode_details` and changes nothing) and a
    /// `try_mode_timeout` for TRY. Made exactly once, as [`Self::apply_configuration`].
    pub async fn apply_configuration_with(
        &self,
        config: &[u8],
        mode: apply_configuration_request::Mode,
        dry_run: bool,
        try_timeout: Option<Duration>,
    ) -> Result<ApplyOutcome, TalosError> {
        let req = ApplyConfigurationRequest {
            data: config.to_vec(),
            mode: mode as i32,
            dry_run,
            try_mode_timeout: try_timeout.map(|d| prost_types::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }),
        };
        let entry = self
            .unary(
                Rpc::ApplyConfiguration,
                self.machine(),
                req,
                |mut c, r| async move { c.apply_configuration(r).await },
            )
            .await?;
        Ok(ApplyOutcome {
            mode: apply_configuration_request::Mode::try_from(entry.mode).ok(),
            mode_details: entry.mode_details,
            warnings: entry.warnings,
        })
    }

    /// The config the node runs: COSI `MachineConfigs.config.talos.dev` `v1alpha1` in
    /// namespace `config` (siderolabs/talos v1.13.9
    /// `pkg/machinery/resources/config/machine_config.go`), from the spec's
    /// `yaml_marshalled` (field 1), else the YAML spec.
    pub async fn machine_config(&self) -> Result<String, TalosError> {
        self.machine_config_id("v1alpha1").await
    }

    /// One `MachineConfigs.config.talos.dev` resource: `v1alpha1` (active) or `persistent`
    /// (on STATE, loaded at the next boot; differs after a staged apply).
    pub async fn machine_config_id(&self, id: &str) -> Result<String, TalosError> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct MachineConfigSpec {
            #[prost(bytes = "vec", tag = "1")]
            yaml_marshalled: Vec<u8>,
        }
        let r = self
            .cosi_get("config", "MachineConfigs.config.talos.dev", id)
            .await?;
        let spec = r.spec.unwrap_or_default();
        match <MachineConfigSpec as prost::Message>::decode(spec.proto_spec.as_slice()) {
            Ok(s) if !s.yaml_marshalled.is_empty() => {
                Ok(String::from_utf8_lossy(&s.yaml_marshalled).into_owned())
            }
            _ => Ok(spec.yaml_spec),
        }
    }

    /// COSI `config/MachineTypes.config.talos.dev/machine-type` (siderolabs/talos v1.13.9
    /// `pkg/machinery/resources/config/machine_type.go`; not sensitive, so a maintenance
    /// client may read it): `unknown` until the node's active config has a machine section,
    /// then its type. It is the one thing a maintenance client can read that tells whether a
    /// config has landed before apid leaves maintenance mode (the `MachineType` controller
    /// follows the active config). The spec is `MachineTypeSpec { MachineType machine_type =
    /// 1 }` (`api/resource/config/config.proto`); the YAML spec is the type's name.
    pub async fn machine_type(&self) -> Result<String, TalosError> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct MachineTypeSpec {
            #[prost(int32, tag = "1")]
            machine_type: i32,
        }
        let r = self
            .cosi_get("config", "MachineTypes.config.talos.dev", "machine-type")
            .await?;
        let spec = r.spec.unwrap_or_default();
        let by_number = <MachineTypeSpec as prost::Message>::decode(spec.proto_spec.as_slice())
            .ok()
            .and_then(|s| match s.machine_type {
                0 => Some("unknown"),
                1 => Some("init"),
                2 => Some("controlplane"),
                3 => Some("worker"),
                _ => None,
            });
        Ok(match by_number {
            Some(t) if !spec.proto_spec.is_empty() => t.to_owned(),
            _ => spec.yaml_spec.trim().to_owned(),
        })
    }

    /// `Bootstrap`: start etcd on this (first control-plane) node. Made exactly once;
    /// a second call answers [`TalosError::AlreadyBootstrapped`], which callers treat as done.
    pub async fn bootstrap(&self) -> Result<(), TalosError> {
        let req = BootstrapRequest::default();
        self.unary(Rpc::Bootstrap, self.machine(), req, |mut c, r| async move {
            c.bootstrap(r).await
        })
        .await?;
        Ok(())
    }

    /// `Kubeconfig`: reads the stream to the end under one deadline, joins the chunks and
    /// unpacks the `kubeconfig` file from the `.tar.gz` Talos sends. Each call mints a new
    /// client certificate on the node, so repeating it is harmless.
    pub async fn kubeconfig(&self) -> Result<Vec<u8>, TalosError> {
        let rpc = Rpc::Kubeconfig;
        let d = self.deadlines.kubeconfig;
        let chunks = self
            .streamed(
                rpc,
                d,
                self.machine(),
                (),
                |mut c, r| async move { c.kubeconfig(r).await },
                collect_data,
            )
            .await?;
        let ctx = self.ctx(rpc, d);
        let chunks = check_entries(chunks, &ctx)?;
        let bytes: Vec<u8> = chunks.into_iter().flat_map(|c| c.bytes).collect();
        archive::kubeconfig_from_archive(&bytes).map_err(|e| malformed(&ctx, &e.to_string()))
    }

    /// `Reset`: wipe the STATE and EPHEMERAL volumes (config and etcd/kubelet data; the node
    /// comes back in maintenance mode), then reboot (`reboot = true`) or power off.
    /// `graceful` makes the node leave etcd first; use false for a broken or one-node
    /// cluster. Made exactly once.
    pub async fn reset(&self, graceful: bool, reboot: bool) -> Result<(), TalosError> {
        let req = ResetRequest {
            graceful,
            reboot,
            system_partitions_to_wipe: ["STATE", "EPHEMERAL"]
                .into_iter()
                .map(|label| ResetPartitionSpec {
                    label: label.to_owned(),
                    wipe: true,
                })
                .collect(),
            user_disks_to_wipe: Vec::new(),
            // Only the listed system volumes: never touch user disks.
            mode: reset_request::WipeMode::SystemDisk as i32,
        };
        self.unary(Rpc::Reset, self.machine(), req, |mut c, r| async move {
            c.reset(r).await
        })
        .await?;
        Ok(())
    }

    /// `Reboot` (default mode: graceful). Made exactly once.
    pub async fn reboot(&self) -> Result<(), TalosError> {
        let req = RebootRequest {
            mode: reboot_request::Mode::Default as i32,
        };
        self.unary(Rpc::Reboot, self.machine(), req, |mut c, r| async move {
            c.reboot(r).await
        })
        .await?;
        Ok(())
    }

    /// `ImageService.Pull`: the node pulls `image` into the installer's containerd instance
    /// ([`installer_containerd`]) and answers with the pulled name pinned to its digest
    /// (siderolabs/talos v1.13.9 `internal/app/images/images.go`, `Pull`; talosctl does this
    /// before every upgrade, `cmd/talosctl/cmd/talos/upgrade.go`). Each layer progress message
    /// is handed to `on_progress` as it arrives. An image the registry does not have is
    /// NotFound at once (no retries). Made once per call: an image already pulled is not
    /// fetched again by the node (`WithSkipIfAlreadyPulled`), so the caller may call again.
    pub async fn image_pull(
        &self,
        image: &str,
        mut on_progress: impl FnMut(&ImageServicePullProgress) + Send,
    ) -> Result<String, TalosError> {
        use super::api::machine::image_service_pull_response::Response as P;
        let rpc = Rpc::ImagePull;
        let d = PULL_DEADLINE;
        let req = ImageServicePullRequest {
            containerd: Some(installer_containerd()),
            image_ref: image.to_owned(),
        };
        let mut client = image_service_client::ImageServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE);
        let request = self.request(req, d);
        let read = async {
            let mut stream = client.pull(request).await?.into_inner();
            let mut name = None;
            while let Some(msg) = stream.message().await? {
                match msg.response {
                    Some(P::PullProgress(p)) => on_progress(&p),
                    Some(P::Name(n)) => name = Some(n),
                    None => {}
                }
            }
            Ok(Response::new(name))
        };
        let name = self.once(rpc, d, read).await?;
        name.ok_or_else(|| {
            malformed(
                &self.ctx(rpc, d),
                "the stream ended without the pulled image's name",
            )
        })
    }

    /// `LifecycleService.Upgrade`: the node runs `image`'s installer against its system disk;
    /// the new version runs from the next boot (the caller reboots, as talosctl does:
    /// siderolabs/talos v1.13.9 `cmd/talosctl/cmd/talos/upgrade.go`). Reads the progress
    /// stream to its end; each message is handed to `on_message` as it arrives. A non-zero
    /// exit code is no gRPC error upstream, so it is returned, not mapped. Made exactly once.
    pub async fn lifecycle_upgrade(
        &self,
        image: &str,
        mut on_message: impl FnMut(&str) + Send,
    ) -> Result<i32, TalosError> {
        use super::api::machine::lifecycle_service_install_progress::Response as P;
        let rpc = Rpc::Upgrade;
        let d = UPGRADE_DEADLINE;
        let req = LifecycleServiceUpgradeRequest {
            containerd: Some(installer_containerd()),
            source: Some(InstallArtifactsSource {
                image_name: image.to_owned(),
            }),
        };
        let mut client =
            lifecycle_service_client::LifecycleServiceClient::new(self.channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE);
        let request = self.request(req, d);
        let read = async {
            let mut stream = client.upgrade(request).await?.into_inner();
            let mut exit = None;
            let mut lines = LineBuffer::default();
            while let Some(msg) = stream.message().await? {
                match msg.progress.and_then(|p| p.response) {
                    Some(P::Message(m)) => lines.push(&m, &mut on_message),
                    Some(P::ExitCode(code)) => exit = Some(code),
                    None => {}
                }
            }
            lines.finish(&mut on_message);
            Ok(Response::new(exit))
        };
        let exit = self.once(rpc, d, read).await?;
        exit.ok_or_else(|| malformed(&self.ctx(rpc, d), "the stream ended without an exit code"))
    }

    /// `ServiceList`: the node's services and their health.
    pub async fn service_list(&self) -> Result<Vec<machine::ServiceInfo>, TalosError> {
        let entry = self
            .unary(
                Rpc::ServiceList,
                self.machine(),
                (),
                |mut c, r| async move { c.service_list(r).await },
            )
            .await?;
        Ok(entry.services)
    }

    /// `EtcdMemberList` (control planes only): the etcd members this node sees.
    pub async fn etcd_member_list(&self) -> Result<Vec<machine::EtcdMember>, TalosError> {
        let req = EtcdMemberListRequest { query_local: false };
        let entry = self
            .unary(
                Rpc::EtcdMemberList,
                self.machine(),
                req,
                |mut c, r| async move { c.etcd_member_list(r).await },
            )
            .await?;
        Ok(entry.members)
    }
}

/// Reads a `common.Data` stream to its end.
async fn collect_data(mut stream: Streaming<common::Data>) -> Result<Vec<common::Data>, Status> {
    let mut out = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.message().await? {
        total = total.saturating_add(chunk.bytes.len());
        if total > MAX_MESSAGE_SIZE {
            return Err(Status::resource_exhausted(
                "kubeconfig stream larger than 32 MiB",
            ));
        }
        out.push(chunk);
    }
    Ok(out)
}

/// Checks a `node` header value the way apid will: one bare address or hostname, no port.
fn validate_node(node: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, TalosError> {
    let reject = |reason| TalosError::InvalidNode {
        node: node.to_owned(),
        reason,
    };
    if node.is_empty() {
        return Err(reject("empty"));
    }
    if node.parse::<SocketAddr>().is_ok()
        || (node.contains(':') && node.parse::<std::net::IpAddr>().is_err())
    {
        return Err(reject(
            "apid wants a bare address or hostname, without a port (\"invalid target\")",
        ));
    }
    if node.contains(',') || node.chars().any(|c| c.is_whitespace()) {
        return Err(reject(
            "exactly one node per call (the `node` header is single-valued)",
        ));
    }
    MetadataValue::try_from(node).map_err(|_| reject("not printable ASCII"))
}

/// Reply entries that carry `common.Metadata` in field 1.
trait HasMetadata {
    fn metadata(&self) -> Option<&common::Metadata>;
}

macro_rules! has_metadata {
    ($($t:ty),* $(,)?) => {
        $(impl HasMetadata for $t {
            fn metadata(&self) -> Option<&common::Metadata> {
                self.metadata.as_ref()
            }
        })*
    };
}

has_metadata!(
    machine::Version,
    machine::ApplyConfiguration,
    machine::Bootstrap,
    machine::Reset,
    machine::Reboot,
    machine::ServiceList,
    machine::EtcdMembers,
    storage::Disks,
    common::Data,
);

/// A unary reply and the one entry a single-node call takes from it.
trait Reply {
    type Entry;
    fn into_entry(self, ctx: &CallContext) -> Result<Self::Entry, TalosError>;
}

/// Replies that list per-node entries in `messages`: each is checked for `metadata.error`,
/// and a single-node call gets exactly one.
macro_rules! entries_reply {
    ($($resp:ty => $entry:ty),* $(,)?) => {
        $(impl Reply for $resp {
            type Entry = $entry;
            fn into_entry(self, ctx: &CallContext) -> Result<$entry, TalosError> {
                single(check_entries(self.messages, ctx)?, ctx)
            }
        })*
    };
}

entries_reply!(
    machine::VersionResponse => machine::Version,
    machine::ApplyConfigurationResponse => machine::ApplyConfiguration,
    machine::BootstrapResponse => machine::Bootstrap,
    machine::ResetResponse => machine::Reset,
    machine::RebootResponse => machine::Reboot,
    machine::ServiceListResponse => machine::ServiceList,
    machine::EtcdMemberListResponse => machine::EtcdMembers,
    storage::DisksResponse => storage::Disks,
);

impl Reply for cosi::GetResponse {
    type Entry = cosi::Resource;
    fn into_entry(self, ctx: &CallContext) -> Result<cosi::Resource, TalosError> {
        self.resource
            .ok_or_else(|| malformed(ctx, "no resource in reply"))
    }
}

/// Fails if any reply entry carries `metadata.error` (the way apid reports a per-node
/// failure inside an OK reply), mapping it like a real status.
fn check_entries<T: HasMetadata>(entries: Vec<T>, ctx: &CallContext) -> Result<Vec<T>, TalosError> {
    for entry in &entries {
        if let Some(err) = entry_error(entry.metadata(), ctx) {
            return Err(err);
        }
    }
    Ok(entries)
}

fn entry_error(meta: Option<&common::Metadata>, ctx: &CallContext) -> Option<TalosError> {
    let meta = meta?;
    if meta.error.is_empty() && meta.status.as_ref().is_none_or(|s| s.code == 0) {
        return None;
    }
    let code = meta
        .status
        .as_ref()
        .map(|s| tonic::Code::from_i32(s.code))
        .filter(|c| *c != tonic::Code::Ok)
        .unwrap_or(tonic::Code::Unknown);
    let message = if meta.error.is_empty() {
        meta.status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    } else {
        meta.error.clone()
    };
    let mut ctx = ctx.clone();
    if !meta.hostname.is_empty() {
        ctx.target.node = Some(meta.hostname.clone());
    }
    Some(classify_code(code, &message, &ctx))
}

/// Single-node calls get exactly one entry back; anything else is not what Talos sends.
fn single<T>(mut entries: Vec<T>, ctx: &CallContext) -> Result<T, TalosError> {
    match entries.len() {
        1 => Ok(entries.remove(0)),
        0 => Err(malformed(ctx, "the reply holds no entry")),
        n => Err(malformed(
            ctx,
            &format!("the reply holds {n} entries for a single-node call"),
        )),
    }
}

fn malformed(ctx: &CallContext, detail: &str) -> TalosError {
    TalosError::Malformed {
        target: ctx.target.clone(),
        rpc: ctx.rpc,
        detail: detail.to_owned(),
    }
}

/// Decodes a COSI resource's typed spec from `proto_spec`.
fn decode_spec<T: Message + Default>(
    res: &cosi::Resource,
    ctx: &CallContext,
) -> Result<T, TalosError> {
    let spec = res
        .spec
        .as_ref()
        .ok_or_else(|| malformed(ctx, "resource without spec"))?;
    T::decode(spec.proto_spec.as_slice())
        .map_err(|e| malformed(ctx, &format!("cannot decode proto_spec: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::talos::api::google::rpc;

    #[test]
    fn installer_output_chunks_become_lines() {
        let mut got = Vec::new();
        let mut out = |l: &str| got.push(l.to_owned());
        let mut b = LineBuffer::default();
        // 512-byte chunks cut mid-line, several lines in one, CRLF, and a last line without
        // its newline.
        b.push("installing to /dev/s", &mut out);
        b.push("da\nwriting EFI\r\nwriting ", &mut out);
        b.push("STATE\n\ndone", &mut out);
        b.finish(&mut out);
        assert_eq!(
            got,
            [
                "installing to /dev/sda",
                "writing EFI",
                "writing STATE",
                "",
                "done"
            ]
        );
    }

    fn ctx() -> CallContext {
        CallContext {
            target: Target {
                endpoint: "10.0.0.5:50000".parse().unwrap(),
                node: None,
            },
            rpc: Rpc::Bootstrap,
            maintenance: false,
            deadline: Duration::from_secs(1),
        }
    }

    #[test]
    fn node_header_values() {
        assert!(validate_node("10.0.0.7").is_ok());
        assert!(validate_node("fd00::7").is_ok());
        assert!(validate_node("worker-1").is_ok());
        for bad in [
            "",
            "10.0.0.7:50000",
            "[fd00::7]:50000",
            "a,b",
            "a b",
            "host:50000",
        ] {
            assert!(
                matches!(validate_node(bad), Err(TalosError::InvalidNode { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn metadata_error_inside_an_ok_reply_is_an_error() {
        let meta = common::Metadata {
            hostname: "10.0.0.7".into(),
            error: "etcd data directory is not empty".into(),
            status: Some(rpc::Status {
                code: tonic::Code::AlreadyExists as i32,
                message: "etcd data directory is not empty".into(),
                details: vec![],
            }),
        };
        let err = entry_error(Some(&meta), &ctx()).unwrap();
        match err {
            TalosError::AlreadyBootstrapped { target, .. } => {
                assert_eq!(target.node.as_deref(), Some("10.0.0.7"));
            }
            other => panic!("{other:?}"),
        }
        assert!(entry_error(Some(&common::Metadata::default()), &ctx()).is_none());
        assert!(entry_error(None, &ctx()).is_none());
    }

    #[test]
    fn metadata_error_without_status_is_unknown_remote() {
        let meta = common::Metadata {
            hostname: String::new(),
            error: "boom".into(),
            status: None,
        };
        assert!(matches!(
            entry_error(Some(&meta), &ctx()),
            Some(TalosError::Remote {
                code: tonic::Code::Unknown,
                ..
            })
        ));
    }

    #[test]
    fn single_entry_is_required() {
        assert_eq!(single(vec![1], &ctx()).unwrap(), 1);
        assert!(matches!(
            single(Vec::<u8>::new(), &ctx()),
            Err(TalosError::Malformed { .. })
        ));
        assert!(matches!(
            single(vec![1, 2], &ctx()),
            Err(TalosError::Malformed { .. })
        ));
    }

    #[test]
    fn creds_debug_redacts_the_key() {
        let creds = ClientCreds {
            ca_pem: b"ca".to_vec(),
            crt_pem: b"crt".to_vec(),
            key_pem: b"super-secret-key".to_vec(),
        };
        let dbg = format!("{creds:?}");
        assert!(!dbg.contains("super-secret"), "{dbg}");
        assert!(dbg.contains("redacted"), "{dbg}");
    }

    #[test]
    fn apply_request_mode_is_auto_on_the_wire() {
        // The zero value (REBOOT) is omitted on the wire; AUTO must be encoded as field 4 = 1.
        let req = ApplyConfigurationRequest {
            data: b"x".to_vec(),
            mode: apply_configuration_request::Mode::Auto as i32,
            dry_run: false,
            try_mode_timeout: None,
        };
        let bytes = req.encode_to_vec();
        // field 1 (bytes, len 1, "x"), then field 4 varint 1.
        assert_eq!(bytes, vec![0x0a, 0x01, b'x', 0x20, 0x01]);
    }

    #[test]
    fn cosi_spec_decodes_from_proto_spec() {
        let spec = hardware::SystemInformationSpec {
            uuid: "4c4c4544-0033".into(),
            manufacturer: "Dell".into(),
            ..Default::default()
        };
        let res = cosi::Resource {
            metadata: None,
            spec: Some(cosi::Spec {
                proto_spec: spec.encode_to_vec(),
                yaml_spec: String::new(),
            }),
        };
        let mut c = ctx();
        c.rpc = Rpc::CosiGet;
        let back: hardware::SystemInformationSpec = decode_spec(&res, &c).unwrap();
        assert_eq!(back, spec);
        let empty = cosi::Resource::default();
        assert!(matches!(
            decode_spec::<hardware::SystemInformationSpec>(&empty, &c),
            Err(TalosError::Malformed { .. })
        ));
    }
}
