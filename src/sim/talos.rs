//! A strict fake Talos node for `talboot demo` and the integration tests, built from
//! talboot's own protos and behaving as Talos v1.13 does where talboot can observe it.
//!
//! Life of a fake node (each on its own address, port 50000 like apid unless configured
//! otherwise; it may also be known by [`FakeNodeConfig::aliases`], e.g. its address on a
//! simulated rack network, which its certificates and the `node` relay honour):
//! * **Maintenance**: TLS from a throwaway self-signed CA made at every boot, ALPN h2
//!   required, no client certificate asked for, every caller is `os:reader`, `node` headers
//!   ignored. Version, Disks, ServiceList and COSI reads work; Bootstrap, Kubeconfig, Reset and
//!   Reboot are refused with PermissionDenied "not authorized". ApplyConfiguration is allowed
//!   and strict as Talos's config loader and validator are (see [`parse_config`]), with
//!   their wording.
//! * After a full config is applied in maintenance mode the reply goes out first; then, as
//!   Talos v1.13.9 does (see [`install_sequence`]), apid restarts **Installing**: mTLS with a
//!   server certificate from the cluster OS CA in `machine.ca` (workers hold no CA key and get
//!   theirs from a control plane booted from disk, as trustd does), while the install
//!   sequence pulls the installer, installs and kexecs, each taking its [`LifecycleTiming`]
//!   share. Then the listener goes away and, after the optional [`BootHook`] (the simulated
//!   network boot), comes back **Secured**, booted from disk; its boot sequence ends in
//!   machine stage `running` (COSI `MachineStatuses.runtime.talos.dev`), on a control plane
//!   only once its etcd is up: a control plane of a new cluster waits to join in stage
//!   `booting` until Bootstrap, and after a reboot apid answers before etcd serves (see
//!   [`etcd`]). An injected
//!   [`InstallFailure`] is a fatal sequence error in the `Events` stream, and after machined's
//!   countdown the machine comes back in maintenance mode. The handshake of the configured
//!   API requires a client certificate signed by that CA with
//!   ExtKeyUsage exactly clientAuth; roles come from its Organization (`os:admin`, ...).
//!   A `node` header is relayed by a control plane to the named peer (itself included) with
//!   an `os:impersonator` certificate and the caller's roles in `talos-role`, from the node's
//!   own address; a worker serves a `node` naming itself and refuses any other with
//!   PermissionDenied "no request forwarding", as apid's director does (see `NodeApi::route`). Bootstrap works once,
//!   then answers AlreadyExists (EtcdMemberList then lists every member of its etcd cluster,
//!   down ones included, while etcd has a leader; the other control planes join by
//!   themselves); Kubeconfig streams one message holding a `.tar.gz`
//!   whose tar is left unterminated, as Talos writes it (a freshly minted admin kubeconfig, or the one set with
//!   [`FakeCluster::set_kubeconfig`]); Reset answers at once and its sequence runs afterwards
//!   ([`reset_sequence`]): of STATE+EPHEMERAL it sends the node back to maintenance (after
//!   the boot hook, like any reboot); a graceful reset of the last voting etcd member fails
//!   on the node and it reboots configured. The double accepts configs rendered by talboot's
//!   own renderer (see the tests below). Durations are [`LifecycleTiming::realistic`] scaled by
//!   [`DEFAULT_TIME_SCALE`] unless a test sets its own.
//!
//! Start-up failures (address in use, certificates) are returned by
//! [`FakeTalosNode::start`]; a later boot that fails parks the node in [`Phase::Failed`] with
//! the reason. Nothing here is global: nodes find each other through a [`FakeCluster`] handle.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use base64::Engine as _;
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server};
use tonic::{Request, Response, Status};

use crate::talos::api::common;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::machine::{
    self, machine_service_server::MachineService, machine_service_server::MachineServiceServer,
};
use crate::talos::api::storage::{
    self, storage_service_server::StorageService, storage_service_server::StorageServiceServer,
};
use crate::talos::api::talos::resource::definitions::{block, hardware, runtime};
use crate::talos::archive::kubeconfig_archive;

use super::SimError;

#[cfg(test)]
mod apply_e2e;
#[cfg(test)]
mod etcd_e2e;
mod machine_config;
mod manifests;
use super::disks::{InstallDiskError, SimDisk, talos_install_disk, talos_order};
use super::pki::{self, CertKey, PkiError, SimCa};
pub use machine_config::{ApplyRecord, RunningConfig};

/// apid's port; the default port of every fake node.
pub(crate) const APID_PORT: u16 = 50000;

/// Why a simulated machine is booting again (what [`BootHook`] is told).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootReason {
    /// Rebooting after the install that followed the first full config; comes back Secured.
    Installed,
    /// Rebooting after a Reset that wiped STATE; comes back in Maintenance.
    Reset,
    /// A plain reboot of a configured node (Reboot, or a Reset that kept STATE, or a reset
    /// sequence that failed); comes back Secured.
    Reboot,
    /// Rebooting after a failed install: nothing on disk, so it comes back in Maintenance.
    InstallFailed,
}

/// Runs the machine's network boot (DHCP, TFTP, HTTP) between two lives of its Talos API:
/// awaited after the old listener is torn down (phase Booting) and before the next one is
/// bound. Never called for the first boot; the caller boots the machine before
/// [`FakeTalosNode::start`].
pub(crate) type BootHook =
    Arc<dyn Fn(BootReason) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Locks a mutex of the double; a poisoned one means a handler already panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
        .expect("a simulated Talos node's lock is poisoned (a handler panicked)")
}

/// The Talos version the double claims to run.
pub const TALOS_TAG: &str = "v1.13.9";

/// What a fake node looks like from outside.
#[derive(Clone)]
pub struct FakeNodeConfig {
    /// The address it listens on (e.g. a loopback address 127.x.y.z), at [`Self::port`].
    pub ip: IpAddr,
    /// The port it listens on ([`APID_PORT`] unless changed).
    pub port: u16,
    /// Other addresses the machine is known by (e.g. its address on the simulated rack
    /// network while it listens on loopback): they are SANs of every server certificate it
    /// presents, `node` headers naming them are relayed to it, and etcd lists its first
    /// alias as its peer address.
    pub(crate) aliases: Vec<IpAddr>,
    /// Hostname (also registered as a `node` target).
    pub hostname: String,
    /// The machine's disks as `block.Disk` resources; COSI `Disks.block.talos.dev` lists them
    /// and `storage.Disks` is derived from them, both in resource-ID order (see
    /// [`super::disks`]).
    pub disks: Vec<SimDisk>,
    /// SMBIOS system UUID (COSI SystemInformation).
    pub system_uuid: String,
    /// Whether the machine has SMBIOS tables. Without them Talos's SystemInfoController fails
    /// (`pkgSMBIOS.GetSMBIOSInfo` errors, siderolabs/talos v1.13.9
    /// `internal/app/machined/pkg/controllers/hardware/system.go`) and never creates
    /// `SystemInformations.hardware.talos.dev`, so COSI Get answers NotFound.
    pub smbios: bool,
    /// When set, TCP connections from any other source address are reset at once: the node
    /// is only reachable through that peer (e.g. a worker behind its control plane).
    pub accept_only_from: Option<IpAddr>,
    /// The simulated network boot run before every boot but the first.
    pub boot_hook: Option<BootHook>,
    /// How long the install, reboot and reset sequences take.
    pub timing: LifecycleTiming,
    /// Makes every install fail this way (the node then reboots back into maintenance mode).
    pub install_failure: Option<InstallFailure>,
}

/// How long the asynchronous sequences of a Talos node take. [`LifecycleTiming::realistic`]
/// holds durations of the order a real machine shows; [`FakeNodeConfig::new`] uses them
/// scaled by [`DEFAULT_TIME_SCALE`], so tests and the demo keep the real ordering (every
/// RPC answers before its sequence has done anything) without waiting minutes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifecycleTiming {
    /// ApplyConfiguration answered → apid serves mTLS with certificates from the config's CA
    /// (secrets `APICertSANs`/`API` controllers, then `APIServiceConfigController`).
    pub apid_restart: Duration,
    /// Pulling the installer image (inside the `install` phase).
    pub installer_pull: Duration,
    /// Running the installer (partitioning, writing the boot assets).
    pub install: Duration,
    /// `meta`, `saveMeta`, `volumeFinalize`, `stopEverything` and `kexec` phases.
    pub(crate) kexec: Duration,
    /// Booted from disk → the `boot` sequence finished (stage `running`), etcd aside.
    pub boot: Duration,
    /// A control plane's etcd service: started (after apid answers) → serving, i.e. its
    /// conditions, prepare, process start and the health check's 5 s initial delay (see
    /// [`etcd`]).
    pub etcd_start: Duration,
    /// Reset sequence: drain, cleanup, leave etcd, stop services, wipe, then reboot.
    pub reset: Duration,
    /// After a fatal sequence error machined counts down before it reboots
    /// (siderolabs/talos v1.13.9 `internal/app/machined/main.go`, `handle`: 10 s).
    pub fatal_reboot: Duration,
}

/// The scale [`FakeNodeConfig::new`] applies to [`LifecycleTiming::realistic`]: 1/200, so a
/// 75 s install takes under 0.4 s.
pub(crate) const DEFAULT_TIME_SCALE: f64 = 1.0 / 200.0;

impl LifecycleTiming {
    /// Durations of the order a real machine on a lab network shows.
    pub(crate) fn realistic() -> Self {
        Self {
            apid_restart: Duration::from_secs(1),
            installer_pull: Duration::from_secs(30),
            install: Duration::from_secs(25),
            kexec: Duration::from_secs(5),
            boot: Duration::from_secs(15),
            etcd_start: Duration::from_secs(8),
            reset: Duration::from_secs(20),
            fatal_reboot: Duration::from_secs(10),
        }
    }

    /// Every duration multiplied by `factor`.
    pub(crate) fn scaled(self, factor: f64) -> Self {
        let f = |d: Duration| d.mul_f64(factor);
        Self {
            apid_restart: f(self.apid_restart),
            installer_pull: f(self.installer_pull),
            install: f(self.install),
            kexec: f(self.kexec),
            boot: f(self.boot),
            etcd_start: f(self.etcd_start),
            reset: f(self.reset),
            fatal_reboot: f(self.fatal_reboot),
        }
    }
}

/// An install that fails, as the sequencer reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstallFailure {
    /// The installer image cannot be pulled (registry unreachable, wrong reference); the
    /// reason is what containerd said.
    InstallerPull(String),
    /// The installer ran and exited non-zero.
    Install,
}

impl fmt::Debug for FakeNodeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeNodeConfig")
            .field("ip", &self.ip)
            .field("port", &self.port)
            .field("aliases", &self.aliases)
            .field("hostname", &self.hostname)
            .field("disks", &self.disks)
            .field("system_uuid", &self.system_uuid)
            .field("smbios", &self.smbios)
            .field("accept_only_from", &self.accept_only_from)
            .field("boot_hook", &self.boot_hook.as_ref().map(|_| "<hook>"))
            .field("timing", &self.timing)
            .field("install_failure", &self.install_failure)
            .finish()
    }
}

impl FakeNodeConfig {
    /// A node with one 120 GB SATA SSD `sda`, SMBIOS tables and a UUID derived from its
    /// address.
    pub fn new(ip: IpAddr, hostname: &str) -> Self {
        let octets = match ip {
            IpAddr::V4(v4) => v4.octets(),
            IpAddr::V6(_) => [0, 0, 0, 0],
        };
        Self {
            ip,
            port: APID_PORT,
            aliases: Vec::new(),
            hostname: hostname.to_owned(),
            disks: vec![SimDisk::sata(
                0,
                "KINGSTON SA400S37120G",
                &format!("SN-{hostname}"),
                120_034_123_776,
                false,
            )],
            system_uuid: format!(
                "00000000-0000-4000-8000-{:02x}{:02x}{:02x}{:02x}0000",
                octets[0], octets[1], octets[2], octets[3]
            ),
            smbios: true,
            accept_only_from: None,
            boot_hook: None,
            timing: LifecycleTiming::realistic().scaled(DEFAULT_TIME_SCALE),
            install_failure: None,
        }
    }

    /// `ip:port`, where it listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// The address peers see in etcd: the first alias, else the listening address.
    fn public_ip(&self) -> IpAddr {
        self.aliases.first().copied().unwrap_or(self.ip)
    }

    /// The SANs of its server certificates: every address it is known by, and loopback.
    fn san_ips(&self) -> Vec<IpAddr> {
        let mut ips = vec![self.ip];
        ips.extend(self.aliases.iter().copied());
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        if !ips.contains(&loopback) {
            ips.push(loopback);
        }
        ips
    }
}

/// Where a fake node is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Between listeners: starting, installing or rebooting.
    Booting,
    /// Serving the maintenance API.
    Maintenance,
    /// Config applied in maintenance mode: serving the configured (mTLS) API while the
    /// install sequence runs; not booted from disk yet.
    Installing,
    /// Serving the configured (mTLS) API.
    Secured,
    /// Powered off after a reset without reboot.
    Halted,
    /// Could not come up (the reason says why).
    Failed(String),
    /// Shut down by its owner.
    Stopped,
}

/// One call a node served locally (not relayed onwards).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// gRPC method name, e.g. `Disks`.
    pub rpc: &'static str,
    /// The roles the call ran with.
    pub roles: Vec<String>,
    /// Whether it arrived through another node's relay.
    pub relayed: bool,
}

/// The registry fake nodes use to find each other (the `node` header relay, trustd).
#[derive(Clone, Default)]
pub struct FakeCluster {
    inner: Arc<Mutex<ClusterInner>>,
}

#[derive(Default)]
struct ClusterInner {
    /// Hostname, listening address and aliases → the node's listening address.
    names: HashMap<String, SocketAddr>,
    nodes: HashMap<SocketAddr, Weak<Shared>>,
    kubeconfig: Option<String>,
    /// When nodes went down and came back (see [`upgrade`]).
    availability: upgrade::AvailabilityLog,
    /// When etcd members stopped and started serving (see [`etcd`]).
    etcd_log: Vec<etcd::EtcdAvailability>,
}

impl FakeCluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on the Kubeconfig RPC of every control plane of the cluster streams
    /// `kubeconfig` (e.g. one for an in-process Kubernetes API double) instead of minting an
    /// admin kubeconfig for the config's endpoint; `None` goes back to minting.
    pub(crate) fn set_kubeconfig(&self, kubeconfig: Option<String>) {
        lock(&self.inner).kubeconfig = kubeconfig;
    }

    fn kubeconfig(&self) -> Option<String> {
        lock(&self.inner).kubeconfig.clone()
    }

    fn register(&self, shared: &Arc<Shared>) {
        let cfg = &shared.cfg;
        let addr = cfg.addr();
        let mut inner = lock(&self.inner);
        inner.names.insert(cfg.hostname.clone(), addr);
        inner.names.insert(cfg.ip.to_string(), addr);
        for alias in &cfg.aliases {
            inner.names.insert(alias.to_string(), addr);
        }
        inner.nodes.insert(addr, Arc::downgrade(shared));
    }

    fn resolve(&self, target: &str) -> Option<SocketAddr> {
        lock(&self.inner).names.get(target).copied()
    }

    fn live_nodes(&self) -> Vec<Arc<Shared>> {
        lock(&self.inner)
            .nodes
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// trustd: a configured node holding the key of the OS CA `ca_cert_pem` issues an apid
    /// server certificate for a node that holds only the CA certificate (a worker).
    ///
    /// Talos v1.13.9: the worker's `APIController.generateWorker`
    /// (`internal/app/machined/pkg/controllers/secrets/api.go`) sends a CSR to trustd on the
    /// control planes, authenticated with its `machine.token` (`pkg/grpc/gen/remote.go`);
    /// trustd accepts only its own `machine.token` (`internal/app/trustd/main.go`,
    /// `tokenGetter`) and signs a server-only certificate (ExtKeyUsage serverAuth, no
    /// Organization: `internal/app/trustd/internal/reg/reg.go`, `Certificate`). No control
    /// plane, or a token no control plane knows: no certificate, and the worker retries.
    fn trustd_issue(
        &self,
        ca_cert_pem: &str,
        token: &str,
        ips: &[IpAddr],
        names: &[&str],
    ) -> Option<Result<CertKey, PkiError>> {
        self.live_nodes().iter().find_map(|node| {
            let state = lock(&node.state);
            match &*state {
                // trustd runs once booted from disk, and signs only for a worker holding the
                // control planes' `machine.token`.
                NodeState::Installed(inst)
                    if inst.on_disk
                        && inst.ca_cert_pem == ca_cert_pem
                        && inst.config.token == token =>
                {
                    inst.os_ca.as_ref().map(|ca| ca.server(ips, names))
                }
                _ => None,
            }
        })
    }
}

/// A config that passed the double's validation.
#[derive(Clone, Debug)]
struct ParsedConfig {
    machine_type: String,
    /// `machine.token`: what trustd authenticates workers with.
    token: String,
    /// `cluster.ca` (PEM certificate, PEM key if present): the Kubernetes CA the
    /// kubeconfig names.
    cluster_ca: Option<(String, Option<String>)>,
    ca_cert_pem: String,
    ca_key_pem: Option<String>,
    cluster_name: String,
    endpoint: String,
}

impl ParsedConfig {
    fn is_control_plane(&self) -> bool {
        matches!(self.machine_type.as_str(), "init" | "controlplane")
    }
}

#[derive(Clone)]
struct Installed {
    config: ParsedConfig,
    ca_cert_pem: String,
    os_ca: Option<SimCa>,
    /// Booted from the installed disk (false while the install sequence runs).
    on_disk: bool,
}

enum NodeState {
    Maintenance,
    Installed(Box<Installed>),
    Halted,
}

enum Lifecycle {
    /// apid restarts with the TLS setup the node's state now calls for; the machine stays up.
    RestartApi,
    Reboot(BootReason),
    Halt,
}

#[derive(Default)]
struct Stats {
    apply_calls: AtomicUsize,
    bootstrap_calls: AtomicUsize,
    kubeconfig_calls: AtomicUsize,
    reset_calls: AtomicUsize,
    reboot_calls: AtomicUsize,
    upgrade_calls: AtomicUsize,
    last_config: Mutex<Option<String>>,
    last_apply_mode: Mutex<Option<i32>>,
    last_kubeconfig: Mutex<Option<Vec<u8>>>,
    last_reset: Mutex<Option<machine::ResetRequest>>,
    served: Mutex<Vec<Served>>,
}

struct Shared {
    cfg: FakeNodeConfig,
    /// Source address allowed to connect (None = anyone); read for every new connection.
    firewall: Arc<Mutex<Option<IpAddr>>>,
    cluster: FakeCluster,
    state: Mutex<NodeState>,
    phase: watch::Sender<Phase>,
    lifecycle: mpsc::UnboundedSender<Lifecycle>,
    stats: Stats,
    /// The machine stage `runtime.MachineStatus` reports.
    stage: Mutex<runtime::RuntimeMachineStage>,
    /// The runtime events of the current boot (the `Events` RPC's history).
    events: Mutex<Vec<machine::Event>>,
    /// New events for open `Events` streams.
    live_events: tokio::sync::broadcast::Sender<machine::Event>,
    /// Fires when the owner stops the node: running sequences end with it.
    stopped: watch::Receiver<bool>,
    /// The running and persisted machine config (see [`machine_config`]).
    configs: Mutex<machine_config::Configs>,
    /// Running and next-boot versions, upgrade failures (see [`upgrade`]).
    versions: Mutex<upgrade::Versions>,
    /// etcd membership and service (control planes, see [`etcd`]).
    etcd: Mutex<etcd::NodeEtcd>,
}

impl Shared {
    /// Marks the node as going down now (before the reply leaves), so a test waiting for
    /// the next phase never sees the stale one, then tells the supervisor.
    fn go_down(&self, what: Lifecycle) {
        upgrade::on_go_down(self, &what);
        if matches!(what, Lifecycle::Reboot(_) | Lifecycle::Halt) {
            etcd::on_go_down(self);
        }
        self.phase.send_replace(Phase::Booting);
        let _ = self.lifecycle.send(what);
    }

    /// The disk Talos's install task picks for the last applied config (see
    /// [`talos_install_disk`]); `None` before a config was applied.
    fn install_disk(&self) -> Option<Result<String, InstallDiskError>> {
        let text = lock(&self.stats.last_config).clone()?;
        let mut install = yaml_serde::Value::Null;
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let Ok(v) = <yaml_serde::Value as serde::Deserialize>::deserialize(doc) else {
                continue;
            };
            if v.get("version").and_then(yaml_serde::Value::as_str) == Some("v1alpha1") {
                install = v
                    .get("machine")
                    .and_then(|m| m.get("install"))
                    .cloned()
                    .unwrap_or_default();
            }
        }
        Some(talos_install_disk(&install, &self.cfg.disks))
    }

    /// apid restarts (new TLS setup); the machine keeps running.
    fn go_down_api(&self) {
        let _ = self.lifecycle.send(Lifecycle::RestartApi);
    }

    fn installed(&self) -> Option<Installed> {
        match &*lock(&self.state) {
            NodeState::Installed(i) => Some((**i).clone()),
            _ => None,
        }
    }

    /// Installed and booted from disk: etcd, trustd and kubelet run.
    fn on_disk(&self) -> Option<Installed> {
        self.installed().filter(|i| i.on_disk)
    }

    fn set_stage(&self, stage: runtime::RuntimeMachineStage) {
        *lock(&self.stage) = stage;
    }

    /// Records a runtime event as machined publishes it: an `Any` with type URL
    /// `talos/runtime/<message>` (siderolabs/talos v1.13.9
    /// `internal/app/machined/pkg/runtime/events.go`).
    fn publish<M: Message>(&self, name: &str, msg: &M) {
        let n = {
            let mut events = lock(&self.events);
            let ev = machine::Event {
                metadata: None,
                data: Some(prost_types::Any {
                    type_url: format!("talos/runtime/{name}"),
                    value: msg.encode_to_vec(),
                }),
                id: format!("{:020}", events.len() + 1),
                actor_id: String::new(),
            };
            events.push(ev.clone());
            ev
        };
        let _ = self.live_events.send(n);
    }

    fn sequence_event(&self, sequence: &str, action: machine::sequence_event::Action) {
        self.publish(
            "machine.SequenceEvent",
            &machine::SequenceEvent {
                sequence: sequence.into(),
                action: action as i32,
                error: None,
            },
        );
    }

    fn phase_event(&self, phase: &str) {
        self.publish(
            "machine.PhaseEvent",
            &machine::PhaseEvent {
                phase: phase.into(),
                action: machine::phase_event::Action::Start as i32,
            },
        );
    }

    /// A sequence failed: STOP (published by the sequencer's deferred call), then NOOP with
    /// a FATAL error `sequence failed: ...`, which sets the stage to rebooting
    /// (siderolabs/talos v1.13.9 `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_controller.go`
    /// `Run`/`run`; `internal/app/machined/pkg/controllers/runtime/machine_status.go`).
    fn sequence_failed(&self, sequence: &str, err: &str) {
        self.sequence_event(sequence, machine::sequence_event::Action::Stop);
        self.publish(
            "machine.SequenceEvent",
            &machine::SequenceEvent {
                sequence: sequence.into(),
                action: machine::sequence_event::Action::Noop as i32,
                error: Some(common::Error {
                    code: common::Code::Fatal as i32,
                    message: format!("sequence failed: {err}"),
                    details: vec![],
                }),
            },
        );
        self.set_stage(runtime::RuntimeMachineStage::MachineStageRebooting);
    }

    /// Sleeps `d`, or returns false if the node is stopped meanwhile.
    async fn pause(&self, d: Duration) -> bool {
        let mut stopped = self.stopped.clone();
        let slept = tokio::select! {
            () = tokio::time::sleep(d) => true,
            _ = stopped.wait_for(|s| *s) => false,
        };
        slept && !*self.stopped.borrow()
    }
}

/// The install sequence after a config was applied in maintenance mode, as the sequencer
/// runs it (siderolabs/talos v1.13.9 `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go`,
/// `Install`: env, install, meta, saveMeta, volumeFinalize, stopEverything, kexec, reboot).
/// apid restarts with mTLS first (`internal/app/machined/pkg/controllers/secrets/api.go`
/// issues the certificates from `machine.ca`, `controllers/runtime/api_service_config.go`
/// restarts apid), so the configured API answers during the whole install. A failed install
/// is a fatal sequencer error: machined counts down and reboots (`internal/app/machined/main.go`,
/// `handle`), and with no installation on disk the machine network-boots into maintenance
/// mode again, its config gone with the RAM it was held in.
async fn install_sequence(shared: Arc<Shared>, installed: Installed) {
    use runtime::RuntimeMachineStage as Stage;
    let t = shared.cfg.timing;
    // `runningMaintenance` task stops: stage booting (machine_status.go, TaskEvent).
    shared.set_stage(Stage::MachineStageBooting);
    if !shared.pause(t.apid_restart).await {
        return;
    }
    *lock(&shared.state) = NodeState::Installed(Box::new(installed));
    // The installer formats the disk: nothing of an earlier etcd survives.
    etcd::wipe(&shared);
    shared.go_down_api();
    shared.sequence_event("install", machine::sequence_event::Action::Start);
    shared.phase_event("env");
    shared.phase_event("install");
    shared.set_stage(Stage::MachineStageInstalling);
    if !shared.pause(t.installer_pull).await {
        return;
    }
    let failure = match &shared.cfg.install_failure {
        Some(InstallFailure::InstallerPull(reason)) => Some(format!(
            "failed to pull image \"ghcr.io/siderolabs/installer:{TALOS_TAG}\": {reason}"
        )),
        _ => None,
    };
    let failure = match failure {
        Some(f) => Some(f),
        None => {
            if !shared.pause(t.install).await {
                return;
            }
            // The installer runs as containerd task "upgrade" (internal/pkg/install/install.go).
            (shared.cfg.install_failure == Some(InstallFailure::Install))
                .then(|| "task \"upgrade\" failed: exit code 1".to_owned())
        }
    };
    if let Some(err) = failure {
        shared.sequence_failed("install", &err);
        if !shared.pause(t.fatal_reboot).await {
            return;
        }
        *lock(&shared.state) = NodeState::Maintenance;
        shared.go_down(Lifecycle::Reboot(BootReason::InstallFailed));
        return;
    }
    for phase in [
        "meta",
        "saveMeta",
        "volumeFinalize",
        "stopEverything",
        "kexec",
    ] {
        shared.phase_event(phase);
    }
    // The `kexec` phase of the install sequence: stage rebooting.
    shared.set_stage(Stage::MachineStageRebooting);
    if !shared.pause(t.kexec).await {
        return;
    }
    if let NodeState::Installed(inst) = &mut *lock(&shared.state) {
        inst.on_disk = true;
    }
    shared.go_down(Lifecycle::Reboot(BootReason::Installed));
}

/// The boot sequence of a machine booted from disk: stage booting until it finishes, then
/// running (machine_status.go: SequenceEvent STOP of `boot` without error). On a control
/// plane `startAllServices` starts etcd and waits for it to be up (see [`etcd`]): with an
/// empty data directory and no cluster to join that is only after Bootstrap, so a control
/// plane of a new cluster stays in stage booting until then.
async fn boot_sequence(shared: Arc<Shared>) {
    shared.sequence_event("boot", machine::sequence_event::Action::Start);
    let boot = etcd::boot_of(&shared);
    let control_plane = shared
        .on_disk()
        .is_some_and(|i| i.config.is_control_plane());
    if control_plane {
        tokio::spawn(etcd::service(shared.clone(), boot));
    }
    if !shared.pause(shared.cfg.timing.boot).await {
        return;
    }
    if control_plane && !etcd::wait_up(&shared, boot).await {
        return;
    }
    let on_disk = shared.on_disk().is_some();
    let mut stage = lock(&shared.stage);
    // Unless another sequence (a reset started meanwhile) took over, or the machine
    // rebooted meanwhile (that boot runs its own sequence).
    if *stage == runtime::RuntimeMachineStage::MachineStageBooting
        && on_disk
        && etcd::boot_of(&shared) == boot
    {
        *stage = runtime::RuntimeMachineStage::MachineStageRunning;
        drop(stage);
        upgrade::on_running(&shared);
        shared.sequence_event("boot", machine::sequence_event::Action::Stop);
    }
}

/// The reset sequence started by the Reset RPC after it answered (siderolabs/talos v1.13.9
/// `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`, `Reset`: the sequence
/// runs in a goroutine; `v1alpha1_sequencer.go`, `Reset`: drain, cleanup, dbus, leave (graceful,
/// control planes), preReset, stop everything, wipe, reboot). A graceful reset of the last
/// voting etcd member fails in `leave`: etcd refuses to remove the only voter, the sequence
/// error is fatal and machined reboots with STATE untouched, so the node comes back configured.
async fn reset_sequence(
    shared: Arc<Shared>,
    req: machine::ResetRequest,
    wiped_state: bool,
    wiped_ephemeral: bool,
) {
    use runtime::RuntimeMachineStage as Stage;
    shared.sequence_event("reset", machine::sequence_event::Action::Start);
    shared.set_stage(Stage::MachineStageResetting);
    let t = shared.cfg.timing;
    let last_voter = shared
        .installed()
        .is_some_and(|inst| inst.config.is_control_plane())
        && etcd::is_last_voter(&shared);
    if req.graceful && last_voter {
        for phase in ["drain", "cleanup", "dbus", "leave"] {
            shared.phase_event(phase);
        }
        if !shared.pause(t.reset / 2).await {
            return;
        }
        let id = match shared.cfg.public_ip() {
            IpAddr::V4(v4) => u64::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6) as u64,
        };
        // LeaveEtcd → LeaveCluster → RemoveMemberByMemberID (internal/pkg/etcd/etcd.go);
        // etcd's strict reconfiguration check refuses removing the last started voter.
        shared.sequence_failed(
            "reset",
            &format!(
                "failed to leave cluster: failed to remove member {id}: etcdserver: \
                 re-configuration failed due to not enough started members"
            ),
        );
        if !shared.pause(t.fatal_reboot).await {
            return;
        }
        shared.go_down(Lifecycle::Reboot(BootReason::Reboot));
        return;
    }
    for phase in [
        "drain",
        "cleanup",
        "dbus",
        "leave",
        "preReset",
        "stopEverything",
        "resetSpec",
    ] {
        shared.phase_event(phase);
    }
    if req.graceful {
        // `leave`: the member is removed from its cluster (`LeaveEtcd`).
        etcd::leave(&shared);
    }
    if !shared.pause(t.reset).await {
        return;
    }
    {
        let mut state = lock(&shared.state);
        if wiped_state {
            // No config any more: next boot is maintenance mode (or nothing, if halted).
            *state = if req.reboot {
                NodeState::Maintenance
            } else {
                NodeState::Halted
            };
        }
    }
    if wiped_ephemeral {
        // `/var/lib/etcd` lives on EPHEMERAL.
        etcd::wipe(&shared);
    }
    shared.go_down(if req.reboot && wiped_state {
        Lifecycle::Reboot(BootReason::Reset)
    } else if req.reboot {
        Lifecycle::Reboot(BootReason::Reboot)
    } else {
        Lifecycle::Halt
    });
}

/// A running fake Talos node. Dropping it stops it; [`FakeTalosNode::shutdown`] stops it and
/// waits until its listener is closed.
pub struct FakeTalosNode {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    supervisor: Option<JoinHandle<()>>,
}

impl FakeTalosNode {
    /// Starts a node in maintenance mode and returns once it accepts connections on
    /// `cfg.addr()`. Fails if that address cannot be bound (e.g. in use) or the
    /// maintenance certificate cannot be made.
    pub async fn start(cfg: FakeNodeConfig, cluster: &FakeCluster) -> Result<Self, SimError> {
        let (phase, _) = watch::channel(Phase::Booting);
        let (lifecycle, lifecycle_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            stage: Mutex::new(runtime::RuntimeMachineStage::MachineStageMaintenance),
            events: Mutex::new(Vec::new()),
            live_events: tokio::sync::broadcast::channel(256).0,
            stopped: stop_rx.clone(),
            firewall: Arc::new(Mutex::new(cfg.accept_only_from)),
            cfg,
            cluster: cluster.clone(),
            state: Mutex::new(NodeState::Maintenance),
            phase,
            lifecycle,
            stats: Stats::default(),
            configs: Mutex::default(),
            versions: Mutex::new(upgrade::Versions::default()),
            etcd: Mutex::default(),
        });
        // The first boot is set up here, so that its failures reach the caller.
        // A new node starts in maintenance mode, which needs no certificate from anyone.
        let NextBoot::Up(boot) = boot_tls(&shared)? else {
            return Err(SimError::Node {
                ip: shared.cfg.ip,
                reason: "a new node boots into maintenance mode, not halted or configured".into(),
            });
        };
        let addr = shared.cfg.addr();
        let listener = bind(addr)
            .await
            .map_err(|source| SimError::Bind { addr, source })?;
        cluster.register(&shared);
        let supervisor = tokio::spawn(supervise(
            shared.clone(),
            (*boot, listener),
            lifecycle_rx,
            stop_rx,
        ));
        let node = Self {
            shared,
            stop,
            supervisor: Some(supervisor),
        };
        node.wait_phase(Phase::Maintenance).await?;
        Ok(node)
    }

    /// `ip:port`, where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.shared.cfg.addr()
    }

    /// The node's listening IP.
    pub fn ip(&self) -> IpAddr {
        self.shared.cfg.ip
    }

    /// The node's hostname.
    pub fn hostname(&self) -> &str {
        &self.shared.cfg.hostname
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.shared.phase.borrow().clone()
    }

    /// Every phase change from now on (e.g. for a progress display); the receiver holds the
    /// current phase at once.
    pub(crate) fn subscribe_phase(&self) -> watch::Receiver<Phase> {
        self.shared.phase.subscribe()
    }

    /// Waits until the node reaches `want`. Fails if it reaches `Failed` instead (with its
    /// reason), if it stops, or if nothing happens for a minute (a hung double must not hang
    /// a test run; a boot hook that takes longer needs [`Self::subscribe_phase`]).
    pub async fn wait_phase(&self, want: Phase) -> Result<(), SimError> {
        let mut rx = self.shared.phase.subscribe();
        let reached = tokio::time::timeout(
            Duration::from_secs(60),
            rx.wait_for(|p| *p == want || matches!(p, Phase::Failed(_) | Phase::Stopped)),
        )
        .await;
        let fail = |reason: String| {
            Err(SimError::Node {
                ip: self.ip(),
                reason,
            })
        };
        match reached {
            Ok(Ok(p)) if *p == want => Ok(()),
            Ok(Ok(p)) => fail(format!("reached {:?} while waiting for {want:?}", *p)),
            Ok(Err(_)) => fail("its supervisor is gone".into()),
            Err(_) => fail(format!(
                "never reached {want:?} within a minute (now {:?})",
                self.phase()
            )),
        }
    }

    /// From now on, reset every new TCP connection whose source is not `from` (None lifts
    /// the restriction): the node becomes reachable only through that peer.
    pub fn restrict_to(&self, from: Option<IpAddr>) {
        *lock(&self.shared.firewall) = from;
    }

    /// ApplyConfiguration calls that reached the handler.
    pub fn apply_calls(&self) -> usize {
        self.shared.stats.apply_calls.load(Ordering::SeqCst)
    }

    /// Bootstrap calls that reached the handler.
    pub fn bootstrap_calls(&self) -> usize {
        self.shared.stats.bootstrap_calls.load(Ordering::SeqCst)
    }

    /// Kubeconfig calls that reached the handler.
    pub fn kubeconfig_calls(&self) -> usize {
        self.shared.stats.kubeconfig_calls.load(Ordering::SeqCst)
    }

    /// Reset calls that reached the handler.
    pub fn reset_calls(&self) -> usize {
        self.shared.stats.reset_calls.load(Ordering::SeqCst)
    }

    /// Reboot calls that reached the handler.
    pub fn reboot_calls(&self) -> usize {
        self.shared.stats.reboot_calls.load(Ordering::SeqCst)
    }

    /// The disk Talos would install to for the last accepted machine config, as its install
    /// task picks it (first match in ID order for a selector, symlinks resolved for a path), or
    /// why the install would fail; `None` before any config.
    pub fn install_disk(&self) -> Option<Result<String, InstallDiskError>> {
        self.shared.install_disk()
    }

    /// The last accepted machine config (YAML text).
    pub fn last_applied_config(&self) -> Option<String> {
        lock(&self.shared.stats.last_config).clone()
    }

    /// The `mode` field of the last ApplyConfiguration request, as sent.
    pub fn last_apply_mode(&self) -> Option<i32> {
        *lock(&self.shared.stats.last_apply_mode)
    }

    /// The kubeconfig (file contents, before archiving) of the last Kubeconfig call.
    pub fn last_kubeconfig(&self) -> Option<Vec<u8>> {
        lock(&self.shared.stats.last_kubeconfig).clone()
    }

    /// The last Reset request.
    pub fn last_reset(&self) -> Option<machine::ResetRequest> {
        lock(&self.shared.stats.last_reset).clone()
    }

    /// Calls this node served itself, in order.
    pub fn served(&self) -> Vec<Served> {
        lock(&self.shared.stats.served).clone()
    }

    /// Stops the node and waits until its listener is closed.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.supervisor.take() {
            let _ = task.await;
        }
    }
}

impl Drop for FakeTalosNode {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// How often a worker waiting for trustd asks again.
const TRUSTD_RETRY: Duration = Duration::from_millis(250);

/// The listener side of one boot.
struct Boot {
    phase: Phase,
    tls: rustls::ServerConfig,
}

/// Parks a supervisor whose node is down for good until its owner stops it.
async fn park(shared: &Shared, stop: &mut watch::Receiver<bool>, phase: Phase) {
    shared.phase.send_replace(phase);
    let _ = stop.wait_for(|s| *s).await;
}

/// Runs boots until stopped: each boot binds `ip:port` with the TLS setup the node's state
/// calls for, serves until a reboot/halt/stop, then closes everything like a power cycle and
/// runs the boot hook before the next one. The first boot's listener is bound by `start`.
async fn supervise(
    shared: Arc<Shared>,
    first: (Boot, TcpListener),
    mut lifecycle: mpsc::UnboundedReceiver<Lifecycle>,
    mut stop: watch::Receiver<bool>,
) {
    let mut first = Some(first);
    // A fresh boot (not just an apid restart): new event history, stage from the state.
    let mut rebooted = true;
    loop {
        let (boot, listener) = match first.take() {
            Some(first) => first,
            None => {
                let boot = match boot_tls(&shared) {
                    Ok(NextBoot::Up(boot)) => *boot,
                    Ok(NextBoot::AwaitingTrustd) => {
                        tracing::debug!(node = %shared.cfg.ip, "waiting for a control plane to issue the apid certificate");
                        // The machine runs on meanwhile (an install goes on): take its
                        // lifecycle commands too.
                        let cmd = tokio::select! {
                            _ = stop.wait_for(|s| *s) => {
                                shared.phase.send_replace(Phase::Stopped);
                                return;
                            }
                            _ = tokio::time::sleep(TRUSTD_RETRY) => continue,
                            cmd = lifecycle.recv() => cmd,
                        };
                        match cmd {
                            Some(Lifecycle::RestartApi) => continue,
                            Some(Lifecycle::Reboot(reason)) => {
                                rebooted = true;
                                if !run_boot_hook(&shared, &mut stop, reason).await {
                                    return;
                                }
                                continue;
                            }
                            Some(Lifecycle::Halt) => {
                                park(&shared, &mut stop, Phase::Halted).await;
                                shared.phase.send_replace(Phase::Stopped);
                                return;
                            }
                            None => {
                                shared.phase.send_replace(Phase::Stopped);
                                return;
                            }
                        }
                    }
                    Ok(NextBoot::Halted) => {
                        park(&shared, &mut stop, Phase::Halted).await;
                        shared.phase.send_replace(Phase::Stopped);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(node = %shared.cfg.ip, error = %e, "simulated node failed to boot");
                        park(&shared, &mut stop, Phase::Failed(e.to_string())).await;
                        return;
                    }
                };
                let addr = shared.cfg.addr();
                match bind(addr).await {
                    Ok(l) => (boot, l),
                    Err(source) => {
                        let e = SimError::Bind { addr, source };
                        tracing::warn!(node = %shared.cfg.ip, error = %e, "simulated node failed to boot");
                        park(&shared, &mut stop, Phase::Failed(e.to_string())).await;
                        return;
                    }
                }
            }
        };

        let (conn_tx, conn_rx) = mpsc::channel::<Result<TlsStream<TcpStream>, std::io::Error>>(16);
        let accept = tokio::spawn(accept_loop(
            listener,
            TlsAcceptor::from(Arc::new(boot.tls)),
            conn_tx,
            shared.firewall.clone(),
        ));
        let api = NodeApi {
            shared: shared.clone(),
        };
        let (down_tx, down_rx) = oneshot::channel::<()>();
        let mut server = tokio::spawn(
            Server::builder()
                .add_service(
                    MachineServiceServer::new(api.clone())
                        .max_decoding_message_size(32 * 1024 * 1024),
                )
                .add_service(StorageServiceServer::new(api.clone()))
                .add_service(upgrade::service(api.clone()))
                .add_service(upgrade::image_service(api.clone()))
                .add_service(cosi::state_server::StateServer::new(api))
                .serve_with_incoming_shutdown(ReceiverStream::new(conn_rx), async {
                    let _ = down_rx.await;
                }),
        );
        tracing::debug!(node = %shared.cfg.ip, phase = ?boot.phase, "simulated node up");
        if std::mem::take(&mut rebooted) {
            lock(&shared.events).clear();
            lock(&shared.configs).on_boot(matches!(&*lock(&shared.state), NodeState::Maintenance));
            match &*lock(&shared.state) {
                NodeState::Maintenance => {
                    shared.set_stage(runtime::RuntimeMachineStage::MachineStageMaintenance)
                }
                NodeState::Installed(inst) if inst.on_disk => {
                    shared.set_stage(runtime::RuntimeMachineStage::MachineStageBooting);
                    tokio::spawn(boot_sequence(shared.clone()));
                }
                _ => {}
            }
        }
        shared.phase.send_replace(boot.phase);

        let next = tokio::select! {
            cmd = lifecycle.recv() => cmd,
            _ = stop.wait_for(|s| *s) => None,
        };

        // Power cycle: stop accepting (the listener closes), let replies in flight go out,
        // then cut whatever is left.
        accept.abort();
        let _ = accept.await;
        let _ = down_tx.send(());
        if tokio::time::timeout(Duration::from_secs(5), &mut server)
            .await
            .is_err()
        {
            server.abort();
        }

        match next {
            Some(Lifecycle::RestartApi) => {}
            Some(Lifecycle::Reboot(reason)) => {
                rebooted = true;
                if !run_boot_hook(&shared, &mut stop, reason).await {
                    return;
                }
            }
            Some(Lifecycle::Halt) => {
                park(&shared, &mut stop, Phase::Halted).await;
                shared.phase.send_replace(Phase::Stopped);
                return;
            }
            None => {
                shared.phase.send_replace(Phase::Stopped);
                return;
            }
        };
    }
}

/// The machine is down between two lives: runs the boot hook (the simulated network boot).
/// False when the node was stopped meanwhile.
async fn run_boot_hook(
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    reason: BootReason,
) -> bool {
    shared.phase.send_replace(Phase::Booting);
    shared.set_stage(runtime::RuntimeMachineStage::MachineStageBooting);
    upgrade::on_reboot(shared, reason);
    if let Some(hook) = shared.cfg.boot_hook.clone() {
        tracing::debug!(node = %shared.cfg.ip, ?reason, "simulated network boot");
        tokio::select! {
            () = hook(reason) => {}
            _ = stop.wait_for(|s| *s) => {
                shared.phase.send_replace(Phase::Stopped);
                return false;
            }
        }
    }
    true
}

/// Binds `addr` with SO_REUSEADDR so a reboot can rebind while old connections sit in
/// TIME_WAIT.
async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(64)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    conns: mpsc::Sender<Result<TlsStream<TcpStream>, std::io::Error>>,
    firewall: Arc<Mutex<Option<IpAddr>>>,
) {
    loop {
        let (tcp, peer) = match super::accept_like_go(&listener).await {
            Ok(conn) => conn,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::debug!(error = %e, "simulated server: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let only_from = *lock(&firewall);
        if only_from.is_some_and(|allowed| allowed != peer.ip()) {
            // A firewall that rejects: reset the connection at once.
            let _ = tcp.set_zero_linger();
            drop(tcp);
            continue;
        }
        let acceptor = acceptor.clone();
        let conns = conns.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            // grpc-go (hence apid) refuses clients that do not negotiate ALPN h2 (grpc-go
            // `credentials/tls.go` enforces ALPN since v1.67; Talos v1.13.9 builds with a
            // newer grpc-go, see its go.mod).
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return;
            }
            let _ = conns.send(Ok(tls)).await;
        });
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_identity(
    ck: &CertKey,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), PkiError> {
    let parse = |what: &'static str| {
        move |e: rustls::pki_types::pem::Error| PkiError::Parse {
            what,
            reason: e.to_string(),
        }
    };
    let chain = CertificateDer::pem_slice_iter(ck.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(parse("server certificate"))?;
    let key = PrivateKeyDer::from_pem_slice(ck.key_pem.as_bytes()).map_err(parse("server key"))?;
    Ok((chain, key))
}

/// The TLS setup for the node's current state (`None`: halted, nothing to serve).
/// What the next boot can be.
enum NextBoot {
    /// Listen with this TLS setup.
    Up(Box<Boot>),
    /// Halted: no listener until stopped.
    Halted,
    /// A configured worker whose apid certificate must come from trustd on a control plane,
    /// and no control plane of its cluster is configured yet: Talos keeps asking, so the
    /// node stays down and asks again.
    AwaitingTrustd,
}

fn boot_tls(shared: &Shared) -> Result<NextBoot, SimError> {
    let ips = shared.cfg.san_ips();
    let host = shared.cfg.hostname.as_str();
    let installed = match &*lock(&shared.state) {
        NodeState::Halted => return Ok(NextBoot::Halted),
        NodeState::Maintenance => None,
        NodeState::Installed(i) => Some((**i).clone()),
    };
    let tls_err = |e: rustls::Error| SimError::Tls {
        what: format!("simulated Talos node {}", shared.cfg.addr()),
        reason: e.to_string(),
    };

    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?;
    let (mut tls, phase) = match installed {
        None => {
            // Maintenance (siderolabs/talos v1.13.9): a self-signed CA made anew on every
            // boot and kept in memory only (`internal/app/machined/pkg/controllers/secrets/
            // maintenance_root.go`), a server certificate from it
            // (`secrets/api.go`, maintenance branch: ExtKeyUsage serverAuth,
            // `SkipVerifyingClientCert`), and apid's server TLS in `tls.ServerOnly` mode: no
            // client certificate is asked for (`internal/app/apid/pkg/provider/provider.go`,
            // `ServerConfig`).
            let ca = SimCa::new_ca("talos-maintenance")?;
            let (chain, key) = server_identity(&ca.server(&ips, &[host])?)?;
            let tls = builder
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .map_err(tls_err)?;
            (tls, Phase::Maintenance)
        }
        Some(inst) => {
            // Secured: control planes sign apid's server certificate from `machine.ca`
            // themselves (`secrets/api.go`, `generateControlPlane`), workers get theirs from
            // trustd (`FakeCluster::trustd_issue`); apid then requires and verifies a client
            // certificate against the OS CA (`provider.go`, `ServerConfig`: `tls.Mutual`) and
            // checks its ExtKeyUsage (`internal/app/apid/service.go`, `verifyExtKeyUsage`).
            let cert = match &inst.os_ca {
                Some(ca) => ca.server(&ips, &[host])?,
                None => match shared.cluster.trustd_issue(
                    &inst.ca_cert_pem,
                    &inst.config.token,
                    &ips,
                    &[host],
                ) {
                    Some(cert) => cert?,
                    None => return Ok(NextBoot::AwaitingTrustd),
                },
            };
            let (chain, key) = server_identity(&cert)?;
            let verifier =
                TalosClientVerifier::new(&inst.ca_cert_pem).map_err(|e| SimError::Tls {
                    what: format!("client verifier of {}", shared.cfg.addr()),
                    reason: e.to_string(),
                })?;
            let tls = builder
                .with_client_cert_verifier(Arc::new(verifier))
                .with_single_cert(chain, key)
                .map_err(tls_err)?;
            (
                tls,
                if inst.on_disk {
                    Phase::Secured
                } else {
                    Phase::Installing
                },
            )
        }
    };
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(NextBoot::Up(Box::new(Boot { phase, tls })))
}

/// apid's client certificate check: chain to the OS CA (webpki, which also wants clientAuth
/// among the EKUs) and then ExtKeyUsage exactly `[ClientAuth]` on every non-CA certificate of
/// the chain (`internal/app/apid/service.go`, `verifyExtKeyUsage`, siderolabs/talos v1.13.9;
/// the double's chains have no intermediates, so that is the leaf).
#[derive(Debug)]
struct TalosClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl TalosClientVerifier {
    fn new(ca_pem: &str) -> Result<Self, VerifierError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert?)?;
        }
        let inner =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?;
        Ok(Self { inner })
    }
}

/// Why the client verifier cannot be built from the machine config's CA.
#[derive(Debug, thiserror::Error)]
enum VerifierError {
    #[error("{0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("{0}")]
    Root(#[from] rustls::Error),
    #[error("{0}")]
    Build(#[from] rustls::server::VerifierBuilderError),
}

impl ClientCertVerifier for TalosClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        pki::check_client_only_eku(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::InvalidPurpose)
        })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The document kinds `configloader` knows besides v1alpha1, each registered for apiVersion
/// `v1alpha1` only (every `registry.Register` under `pkg/machinery/config/types/`,
/// siderolabs/talos v1.13.9).
const DOCUMENT_KINDS: &[&str] = &[
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DummyLinkConfig",
    "EnvironmentConfig",
    "EthernetConfig",
    "EventSinkConfig",
    "ExistingVolumeConfig",
    "ExtensionServiceConfig",
    "ExternalVolumeConfig",
    "HCloudVIPConfig",
    "HostnameConfig",
    "ImageVerificationConfig",
    "KmsgLogConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "ResolverConfig",
    "RoutingRuleConfig",
    "SideroLinkConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "TCPProbeConfig",
    "TimeSyncConfig",
    "TrustedRootsConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VolumeConfig",
    "WatchdogTimerConfig",
    "WireguardConfig",
    "ZswapConfig",
];

/// hashicorp/go-multierror's default format (`ListFormatFunc`), which Talos's validation
/// errors carry verbatim into the gRPC message.
fn multierror(errors: &[String]) -> String {
    if let [one] = errors {
        return format!("1 error occurred:\n\t* {one}\n\n");
    }
    let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
    format!(
        "{} errors occurred:\n\t{}\n\n",
        errors.len(),
        points.join("\n\t")
    )
}

/// siderolabs/net v0.4.0 `ValidateEndpointURI` on `cluster.controlPlane.endpoint` (after
/// Go's lenient `url.Parse`): a host is required, a port must be numeric and in 1..=65535,
/// an IPv6 host must be bracketed. The scheme is not checked.
/// Why `ValidateEndpointURI` refuses an endpoint, in its wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum EndpointError {
    #[error("IPv6 addresses MUST be enclosed by square brackets")]
    UnbracketedIpv6,
    #[error("hostname must not be blank")]
    BlankHost,
    #[error("port number must be numeric")]
    PortNotNumeric,
    #[error("port number must be between 1 and 65535")]
    PortRange,
}

fn validate_endpoint(ep: &str) -> Result<(), EndpointError> {
    let rest = ep.split_once("://").map_or("", |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.matches(':').count() > 2 && !(host_port.contains('[') && host_port.contains(']')) {
        return Err(EndpointError::UnbracketedIpv6);
    }
    let (host, port) = if let Some(r) = host_port.strip_prefix('[') {
        let (h, tail) = r.split_once(']').unwrap_or((r, ""));
        (h, tail.strip_prefix(':').unwrap_or(""))
    } else {
        match host_port.rsplit_once(':') {
            Some((h, p)) => (h, p),
            None => (host_port, ""),
        }
    };
    if host.is_empty() {
        return Err(EndpointError::BlankHost);
    }
    if !port.is_empty() {
        let n: u64 = port.parse().map_err(|_| EndpointError::PortNotNumeric)?;
        if !(1..=65535).contains(&n) {
            return Err(EndpointError::PortRange);
        }
    }
    Ok(())
}

/// Why the double's config loader and validator refuse a config: the message, in Talos's
/// wording and multierror layout, that Talos puts in its InvalidArgument status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
struct ConfigRefused(String);

impl From<String> for ConfigRefused {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl From<&str> for ConfigRefused {
    fn from(message: &str) -> Self {
        Self(message.to_owned())
    }
}

/// Loads and validates a machine config as `ApplyConfiguration` does before anything is
/// applied (siderolabs/talos v1.13.9): `configloader.NewFromBytes`
/// (`pkg/machinery/config/configloader/configloader.go`,
/// `configloader/internal/decoder/decoder.go`), then `Validate`
/// (`pkg/machinery/config/container/container.go`,
/// `pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go`). The error is the message
/// Talos puts in its InvalidArgument status. `Ok(None)` is a config with no v1alpha1
/// document (the caller decides whether that is allowed). `requires_install` is the
/// platform mode's `RequiresInstall` on a machine not installed yet (metal, first config).
///
/// Modelled: document detection and kinds, duplicate documents, unknown top-level v1alpha1
/// keys, the machine/cluster/install/CA/machine-type/persist rules and the endpoint check,
/// with upstream's wording and multierror layout. Not modelled (deliberately; talboot's own
/// schema validation covers the fields it renders): unknown keys below the top level, the
/// typed documents' own validation, network/disk/CNI rules. Line numbers are those of the
/// document's start. Stricter than Talos, because the double needs them to serve TLS:
/// `machine.ca.crt` must be one PEM certificate (Talos only fails later, at boot).
fn parse_config(
    data: &[u8],
    requires_install: bool,
) -> Result<Option<ParsedConfig>, ConfigRefused> {
    use yaml_serde::Value;
    let text = std::str::from_utf8(data)
        .map_err(|_| "decode error: yaml: invalid leading UTF-8 octet".to_owned())?;
    // The line each document starts at (after a `---` separator), for the messages.
    let mut doc_lines = vec![1];
    doc_lines.extend(
        text.lines()
            .enumerate()
            .filter(|(_, l)| l.starts_with("---"))
            .map(|(i, _)| i + 2),
    );
    let str_at = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut v1alpha1 = None;
    let mut seen = std::collections::HashSet::new();
    for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let line = doc_lines.get(i).copied().unwrap_or(1);
        let value = <Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| format!("decode error: yaml: {e}"))?;
        let map = match &value {
            Value::Null => continue,
            Value::Mapping(m) => m,
            _ => return Err(format!("expected a YAML document at line {line}").into()),
        };
        let api_version = str_at(&value, "apiVersion").unwrap_or_default();
        let kind = str_at(&value, "kind").unwrap_or_default();
        let id = format!(
            "{api_version}/{}/{}",
            if kind.is_empty() { "v1alpha1" } else { &kind },
            str_at(&value, "name").unwrap_or_default()
        );
        if !seen.insert(id.clone()) {
            return Err(format!("duplicate document {id} is not allowed (line {line})").into());
        }
        let fail =
            |e: String| ConfigRefused(format!("error decoding document {id} (line {line}): {e}"));
        // The v1alpha1 document is the one with any of its legacy top-level keys.
        let legacy = ["machine", "cluster", "debug", "persist"]
            .iter()
            .any(|k| map.contains_key(*k));
        let version = if legacy { "v1alpha1" } else { &api_version };
        if version == "v1alpha1" && kind.is_empty() {
            const FIELDS: &[&str] = &["version", "debug", "persist", "machine", "cluster"];
            if let Some(unknown) = map
                .keys()
                .filter_map(Value::as_str)
                .find(|k| !FIELDS.contains(k))
            {
                return Err(fail(format!(
                    "error decoding  to *v1alpha1.Config: yaml: unmarshal errors:\n  line \
                     {line}: field {unknown} not found in type v1alpha1.Config"
                )));
            }
            v1alpha1 = Some(value);
        } else if kind.is_empty() {
            return Err(fail("missing kind".into()));
        } else if version.is_empty() {
            return Err(fail("missing apiVersion".into()));
        } else if version != "v1alpha1" || !DOCUMENT_KINDS.contains(&kind.as_str()) {
            return Err(fail(format!("{kind:?} {version:?}: not registered")));
        }
    }
    if seen.is_empty() {
        return Err("config not found".into());
    }
    let Some(doc) = v1alpha1 else {
        return Ok(None);
    };

    let at = |path: &[&str]| -> Option<&Value> {
        let mut v = &doc;
        for key in path {
            v = v.get(*key)?;
        }
        Some(v)
    };
    let text_at = |path: &[&str]| at(path).and_then(Value::as_str).map(str::to_owned);
    let decode_error = |e: String| {
        format!(
            "error decoding document /v1alpha1/ (line 1): error decoding  to \
             *v1alpha1.Config: {e}"
        )
    };
    let b64 = |field: &str, s: &str| -> Result<String, ConfigRefused> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .map_err(|e| {
                ConfigRefused(decode_error(format!("{field}: illegal base64 data: {e}")))
            })?;
        String::from_utf8(bytes).map_err(|_| ConfigRefused(format!("{field}: not PEM text")))
    };
    let ca_crt = text_at(&["machine", "ca", "crt"]).filter(|c| !c.is_empty());
    let ca_key = text_at(&["machine", "ca", "key"]).filter(|k| !k.is_empty());
    let ca_cert_pem = ca_crt
        .as_deref()
        .map(|c| b64("machine.ca.crt", c))
        .transpose()?;
    let cluster_ca = match text_at(&["cluster", "ca", "crt"]).filter(|c| !c.is_empty()) {
        Some(crt) => Some((
            b64("cluster.ca.crt", &crt)?,
            text_at(&["cluster", "ca", "key"])
                .filter(|k| !k.is_empty())
                .map(|k| b64("cluster.ca.key", &k))
                .transpose()?,
        )),
        None => None,
    };
    let ca_key_pem = ca_key
        .as_deref()
        .map(|k| b64("machine.ca.key", k))
        .transpose()?;

    // `Config.Validate`, in its order.
    let mut errors: Vec<String> = Vec::new();
    let machine = at(&["machine"]).filter(|m| !m.is_null());
    let machine_type = text_at(&["machine", "type"]).unwrap_or_default();
    // `machine.ParseType` (`pkg/machinery/config/machine/machine.go`): "" and the legacy
    // "join" are workers (with a warning, not simulated).
    let machine_type = match machine_type.as_str() {
        "" | "join" => "worker".to_owned(),
        _ => machine_type,
    };
    let is_control_plane = matches!(machine_type.as_str(), "init" | "controlplane");
    if machine.is_none() {
        errors.push("machine instructions are required".into());
    } else {
        // `ClusterConfig.Validate`.
        let endpoint = text_at(&["cluster", "controlPlane", "endpoint"]);
        match (at(&["cluster"]).filter(|c| !c.is_null()), &endpoint) {
            (None, _) => errors.push("cluster instructions are required".into()),
            (Some(_), None) => errors.push("cluster controlplane endpoint is required".into()),
            (Some(_), Some(ep)) => {
                if let Err(e) = validate_endpoint(ep) {
                    errors.push(format!("invalid controlplane endpoint: {e}"));
                }
                let cluster_key = text_at(&["cluster", "ca", "key"]).filter(|k| !k.is_empty());
                if !is_control_plane && cluster_key.is_some() {
                    errors.push(
                        "cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)"
                            .into(),
                    );
                }
            }
        }
        if requires_install {
            match at(&["machine", "install"]).filter(|i| !i.is_null()) {
                None => errors.push("install instructions are required in \"metal\" mode".into()),
                Some(install) => {
                    let disk = install.get("disk").and_then(Value::as_str).unwrap_or("");
                    let selector = install.get("diskSelector").filter(|s| !s.is_null());
                    if disk.is_empty() && selector.is_none() {
                        errors.push("either install disk or diskSelector should be defined".into());
                    }
                }
            }
        }
        let accepted_cas = at(&["machine", "acceptedCAs"])
            .and_then(Value::as_sequence)
            .is_some_and(|s| !s.is_empty());
        let has_ca = at(&["machine", "ca"]).is_some_and(|c| !c.is_null());
        if !has_ca && !accepted_cas {
            errors.push(
                "issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)"
                    .into(),
            );
        }
        match machine_type.as_str() {
            "init" | "controlplane" => {
                if !has_ca {
                    errors.push("issuing CA is required (.machine.ca)".into());
                } else if ca_key_pem.is_none() {
                    errors.push(
                        "issuing CA key is required for controlplane nodes (.machine.ca.key)"
                            .into(),
                    );
                }
            }
            "worker" => {
                if has_ca {
                    if ca_key_pem.is_some() {
                        errors.push(
                            "issuing Talos API CA key is not allowed on non-controlplane \
                             nodes (.machine.ca)"
                                .into(),
                        );
                    }
                    if ca_cert_pem.is_none() && !accepted_cas {
                        errors.push(
                            "trusted CA certificates are required on non-controlplane nodes \
                             (.machine.ca.crt, .machine.acceptedCAs)"
                                .into(),
                        );
                    }
                }
                if text_at(&["cluster", "ca", "key"]).is_some_and(|k| !k.is_empty()) {
                    errors.push(
                        "issuing Kubernetes API CA key is not allowed on non-controlplane \
                         nodes (.cluster.ca)"
                            .into(),
                    );
                }
            }
            other => errors.push(format!("unknown machine type {other:?}")),
        }
        if at(&["persist"]).and_then(Value::as_bool) == Some(false) {
            errors.push(".persist should be enabled".into());
        }
    }
    if !errors.is_empty() {
        // `container.Validate` prefixes the v1alpha1 errors and collects them again.
        return Err(multierror(&[format!("v1alpha1.Config: {}", multierror(&errors))]).into());
    }

    // What the double itself needs to serve TLS with this config.
    let ca_cert_pem = ca_cert_pem
        .ok_or("the test double needs machine.ca.crt (acceptedCAs alone are not simulated)")?;
    if CertificateDer::pem_slice_iter(ca_cert_pem.as_bytes())
        .next()
        .is_none_or(|c| c.is_err())
    {
        return Err("machine.ca.crt: no PEM certificate".into());
    }
    Ok(Some(ParsedConfig {
        cluster_name: text_at(&["cluster", "clusterName"]).unwrap_or_default(),
        endpoint: text_at(&["cluster", "controlPlane", "endpoint"]).unwrap_or_default(),
        token: text_at(&["machine", "token"]).unwrap_or_default(),
        cluster_ca,
        machine_type,
        ca_cert_pem,
        ca_key_pem,
    }))
}

/// Who is calling and where the call goes.
enum Route {
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
const READ: &[&str] = &["os:admin", "os:operator", "os:reader"];
/// `EtcdMemberList` also admits os:etcd:backup (machined.go `rules`).
const READ_ETCD: &[&str] = &["os:admin", "os:operator", "os:reader", "os:etcd:backup"];
const OPERATE: &[&str] = &["os:admin", "os:operator"];
const ADMIN: &[&str] = &["os:admin"];
/// `ApplyConfiguration` admits os:reader at the authorizer ("for maintenance only, verified
/// in the handler": the handler refuses non-admins once the node is configured).
const APPLY: &[&str] = &["os:admin", "os:reader"];

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

type DataStream = Pin<Box<dyn Stream<Item = Result<common::Data, Status>> + Send + 'static>>;
type ListStream = Pin<Box<dyn Stream<Item = Result<cosi::ListResponse, Status>> + Send + 'static>>;

#[derive(Clone)]
struct NodeApi {
    shared: Arc<Shared>,
}

impl NodeApi {
    /// apid in front of machined: who the caller is (the authz injector) and where the call
    /// goes (the director). `method` is the full gRPC method name.
    fn route<T>(&self, req: &Request<T>, method: &str) -> Result<Route, Status> {
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
        // Secured: the injector's `Enabled` mode reads the roles from the leaf certificate's
        // Organization; a caller holding os:impersonator (another apid relaying) is trusted to
        // name the roles in `talos-role` metadata, if it sent any
        // (`pkg/grpc/middleware/authz/injector.go`, `extractRoles`; `metadata.go`).
        let certs = req
            .peer_certs()
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let leaf = certs
            .first()
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let orgs = pki::organizations(leaf).map_err(|e| Status::unauthenticated(e.to_string()))?;
        let mut roles = parse_roles(orgs.iter().map(String::as_str));
        let meta = req.metadata();
        if roles.iter().any(|r| r == "os:impersonator") {
            let claimed: Vec<&str> = meta
                .get_all("talos-role")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            if !claimed.is_empty() {
                roles = parse_roles(claimed);
            }
        }

        // The director (`director.go`, `Router.Director`), in its order.
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
        // Only a control plane's apid holds a client certificate (os:impersonator) to dial
        // other nodes with (`internal/app/machined/pkg/controllers/secrets/api.go`:
        // `generateControlPlane` issues one, `generateWorker` sets `Client = nil`), and
        // without one `service.go` builds the router with no remote backend factory.
        let can_forward = inst.os_ca.is_some();
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
            const ONE_TO_MANY: &[&str] = &[
                "/machine.MachineService/",
                "/cluster.ClusterService/",
                "/inspect.InspectService/",
                "/storage.StorageService/",
                "/time.TimeService/",
            ];
            if !ONE_TO_MANY.iter().any(|p| method.starts_with(p)) {
                return Err(Status::invalid_argument(format!(
                    "one-2-many proxying is not supported for method {method}"
                )));
            }
            if !can_forward {
                return Err(Status::permission_denied("no request forwarding"));
            }
            // Deliberately not simulated: talboot never sends `nodes` (it would get one
            // reply entry per node, aggregated by grpc-proxy).
            return Err(Status::invalid_argument(
                "the test double does not implement one-to-many (`nodes`) proxying",
            ));
        }
        if ok_node {
            if !can_forward {
                return Err(Status::permission_denied("no request forwarding"));
            }
            let target = node[0];
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
            return Ok(Route::Forward { addr, roles });
        }
        Ok(Route::Local {
            roles,
            relayed: false,
        })
    }

    /// apid's `IsLocalTarget`: one of this node's addresses or its hostname.
    fn is_local_target(&self, target: &str) -> bool {
        let cfg = &self.shared.cfg;
        target == cfg.hostname
            || target
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip == cfg.ip || cfg.san_ips().contains(&ip))
    }

    /// machined's `Authorizer` (`pkg/grpc/middleware/authz/authorizer.go`): the caller needs
    /// one of the method's roles, else PermissionDenied "not authorized" (`ErrNotAuthorized`).
    fn allow(
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
    async fn relay_channel(&self, addr: SocketAddr) -> Result<tonic::transport::Channel, Status> {
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
    fn relay_request<T>(&self, req: Request<T>, roles: &[String]) -> Request<T> {
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

    async fn forward_unary<Req, Resp>(
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

    async fn forward_stream<Req, Resp>(
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
    fn service_list(&self) -> Vec<machine::ServiceInfo> {
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
    fn disk_specs(&self) -> Vec<(String, block::DiskSpec)> {
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
    fn machine_status(&self) -> runtime::MachineStatusSpec {
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
    fn kubeconfig_for(&self, inst: &Installed) -> Result<Vec<u8>, Status> {
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
        if req.dry_run {
            return Err(Status::unimplemented(
                "dry run is not simulated by the test double",
            ));
        }
        // Talos hands the loader's and the validator's errors back as InvalidArgument with
        // their message unchanged (`v1alpha1_server.go`, ApplyConfiguration). Install
        // instructions are required only while the machine is not installed yet
        // (`modeWrapper.RequiresInstall`).
        let parsed = parse_config(&req.data, maintenance)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let text = String::from_utf8_lossy(&req.data).into_owned();
        let Some(parsed) = parsed else {
            if !maintenance {
                return Err(Status::invalid_argument(
                    "the applied machine configuration doesn't contain v1alpha1 config, did you \
                     mean to patch the machine config instead?",
                ));
            }
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
        if let Some(inst) = self.shared.installed()
            && inst.config.machine_type != parsed.machine_type
        {
            return Err(Status::invalid_argument("machine type can't be changed"));
        }
        lock(&self.shared.configs).installed(text.clone(), &parsed.machine_type);
        *lock(&stats.last_config) = Some(text);
        let current = self.shared.installed();
        let installed = Installed {
            ca_cert_pem: parsed.ca_cert_pem.clone(),
            config: parsed,
            os_ca,
            on_disk: current.as_ref().is_some_and(|i| i.on_disk),
        };
        if maintenance {
            // The reply goes out first; apid restarts with mTLS and the install sequence
            // runs afterwards, asynchronously (see `install_sequence`).
            tokio::spawn(install_sequence(self.shared.clone(), installed));
        } else {
            *lock(&self.shared.state) = NodeState::Installed(Box::new(installed));
        }
        Ok(Response::new(reply_apply(
            "Applied configuration without a reboot",
        )))
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

fn reply_apply(details: &str) -> machine::ApplyConfigurationResponse {
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

fn resource(
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

mod etcd;
pub use etcd::{EtcdAvailability, max_etcd_down};
mod upgrade;
pub use upgrade::{Availability, UpgradeFailure, max_down};

#[cfg(test)]
mod tests {
    //! The double against talboot's real renderer and talosconfig, and the hooks the demo
    //! needs (aliases, port, boot hook, phase subscription, cluster kubeconfig). Nodes listen
    //! on 127.0.77.x, which no other test uses.

    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::OnceLock;

    use time::OffsetDateTime;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::inventory::{self, Inventory};
    use crate::machineconfig::clients;
    use crate::machineconfig::render::render_node;
    use crate::machineconfig::secrets::{GenerateOptions, SecretsBundle, ServiceAccountKeyKind};
    use crate::talos::retry::RetryPolicy;
    use crate::talos::{ClientCreds, TalosClient};

    pub(super) fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 77, last])
    }

    /// The rack inventory and one freshly generated secrets bundle for all tests here
    /// (P-256 service-account key: RSA-4096 generation would only make the tests slow).
    pub(super) fn rack() -> &'static (Inventory, SecretsBundle) {
        static RACK: OnceLock<(Inventory, SecretsBundle)> = OnceLock::new();
        RACK.get_or_init(|| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
            let inv = inventory::load_with_env(&path, &BTreeMap::new())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .inventory;
            let options = GenerateOptions {
                service_account_key: ServiceAccountKeyKind::EcdsaP256,
            };
            let secrets = SecretsBundle::generate(OffsetDateTime::now_utc(), &options).unwrap();
            (inv, secrets)
        })
    }

    /// `node`'s config as `talboot gen` renders it (YAML).
    pub(super) fn rendered(node: &str) -> String {
        let (inv, secrets) = rack();
        let node = inv.node(node).unwrap_or_else(|| panic!("no node {node}"));
        render_node(inv, secrets, node).unwrap().to_yaml().unwrap()
    }

    /// The rack address of an inventory node.
    pub(super) fn rack_ip(node: &str) -> IpAddr {
        IpAddr::V4(rack().0.node(node).unwrap().address.addr())
    }

    /// Credentials from the admin talosconfig `talboot gen` writes for the bundle.
    pub(super) fn admin_creds() -> ClientCreds {
        let (inv, secrets) = rack();
        let talosconfig = clients::talosconfig(
            inv.cluster.name.as_str(),
            &["10.20.0.11".into()],
            &[],
            secrets,
            time::Duration::hours(1),
            OffsetDateTime::now_utc(),
        )
        .unwrap();
        ClientCreds::from_talosconfig(&talosconfig, None).unwrap()
    }

    pub(super) fn maintenance(addr: SocketAddr) -> TalosClient {
        TalosClient::maintenance(addr)
            .unwrap()
            .with_retry(RetryPolicy::NONE)
    }

    pub(super) fn secured(addr: SocketAddr) -> TalosClient {
        TalosClient::secured(addr, &admin_creds())
            .unwrap()
            .with_retry(RetryPolicy::NONE)
    }

    pub(super) fn node_cfg(last: u8, name: &str) -> FakeNodeConfig {
        let mut cfg = FakeNodeConfig::new(ip(last), name);
        cfg.aliases = vec![rack_ip(name)];
        cfg
    }

    /// The IP SANs of the certificate the node presents now (handshake with any-cert
    /// verification, and the admin client certificate in case the node asks for one).
    async fn presented_ips(addr: SocketAddr) -> Vec<IpAddr> {
        let creds = admin_creds();
        let chain = CertificateDer::pem_slice_iter(&creds.crt_pem)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key =
            PrivateKeyDer::from_pem_slice(&crate::talos::tls::normalize_key_pem(&creds.key_pem))
                .unwrap();
        crate::sim::probe::presented_sans(addr, chain, key, &[b"h2"])
            .await
            .iter()
            .filter_map(|san| san.parse().ok())
            .collect()
    }

    #[tokio::test]
    async fn rendered_configs_install_and_the_generated_talosconfig_works() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let cp = FakeTalosNode::start(node_cfg(1, "rack1-cp-01"), &cluster)
            .await
            .unwrap();
        let st = FakeTalosNode::start(node_cfg(2, "rack1-st-01"), &cluster)
            .await
            .unwrap();
        let cp_alias = rack_ip("rack1-cp-01");
        assert!(presented_ips(cp.addr()).await.contains(&cp_alias));

        for (node, name) in [(&cp, "rack1-cp-01"), (&st, "rack1-st-01")] {
            let config = rendered(name);
            maintenance(node.addr())
                .apply_configuration(config.as_bytes())
                .await
                .unwrap_or_else(|e| panic!("{name}: the double refused talboot's config: {e}"));
            node.wait_phase(Phase::Secured).await.unwrap();
            assert_eq!(node.last_applied_config().as_deref(), Some(config.as_str()));
        }

        // The admin talosconfig from the same bundle is accepted by both, directly...
        let version = secured(cp.addr()).version().await.unwrap();
        assert_eq!(version.version.unwrap().tag, TALOS_TAG);
        secured(st.addr()).version().await.unwrap();
        // ...and through the control plane, naming the worker by its rack address.
        let st_alias = rack_ip("rack1-st-01").to_string();
        let relayed = secured(cp.addr()).with_node(&st_alias).unwrap();
        relayed.version().await.unwrap();
        assert!(st.served().iter().any(|s| s.rpc == "Version" && s.relayed));
        // The secured certificates carry the rack addresses too (the worker's from trustd).
        assert!(presented_ips(cp.addr()).await.contains(&cp_alias));
        let st_ips = presented_ips(st.addr()).await;
        assert!(st_ips.contains(&rack_ip("rack1-st-01")), "{st_ips:?}");
        assert!(st_ips.contains(&ip(2)), "{st_ips:?}");
        cp.shutdown().await;
        st.shutdown().await;
    }

    #[tokio::test]
    async fn boot_hook_runs_between_lives_with_the_reason() {
        crate::install_crypto_provider();
        let (reasons_tx, mut reasons) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let mut cfg = node_cfg(3, "rack1-cp-02");
        let hook_gate = gate.clone();
        cfg.boot_hook = Some(Arc::new(move |reason| {
            let tx = reasons_tx.clone();
            let gate = hook_gate.clone();
            Box::pin(async move {
                let _ = tx.send(reason);
                if let Ok(permit) = gate.acquire().await {
                    permit.forget();
                }
            })
        }));
        let cluster = FakeCluster::new();
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        let mut phases = node.subscribe_phase();
        assert_eq!(*phases.borrow_and_update(), Phase::Maintenance);
        assert!(
            reasons.try_recv().is_err(),
            "the first boot is the caller's"
        );

        // Each life ends, the hook runs while nothing listens, then the next life starts.
        let steps: [(BootReason, Phase); 3] = [
            (BootReason::Installed, Phase::Secured),
            (BootReason::Reboot, Phase::Secured),
            (BootReason::Reset, Phase::Maintenance),
        ];
        for (want, next) in steps {
            match want {
                BootReason::Installed => {
                    maintenance(node.addr())
                        .apply_configuration(rendered("rack1-cp-02").as_bytes())
                        .await
                        .unwrap();
                }
                BootReason::Reboot => secured(node.addr()).reboot().await.unwrap(),
                BootReason::Reset => secured(node.addr()).reset(false, true).await.unwrap(),
                BootReason::InstallFailed => unreachable!("not in this list"),
            }
            assert_eq!(reasons.recv().await, Some(want));
            assert_eq!(node.phase(), Phase::Booting);
            // The subscription saw the machine go down...
            assert_eq!(*phases.borrow_and_update(), Phase::Booting);
            assert!(
                TcpStream::connect(node.addr()).await.is_err(),
                "the API must be down while the machine boots"
            );
            gate.add_permits(1);
            node.wait_phase(next.clone()).await.unwrap();
            // ...and come back.
            phases.changed().await.unwrap();
            assert_eq!(*phases.borrow_and_update(), next);
        }
        node.shutdown().await;
    }

    #[tokio::test]
    async fn a_worker_configured_before_any_control_plane_waits_for_trustd() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let worker = FakeTalosNode::start(node_cfg(5, "rack1-wk-01"), &cluster)
            .await
            .unwrap();
        maintenance(worker.addr())
            .apply_configuration(rendered("rack1-wk-01").as_bytes())
            .await
            .unwrap();
        // No control plane holds the OS CA key yet: the worker stays down, asking.
        tokio::time::sleep(TRUSTD_RETRY * 3).await;
        assert_eq!(worker.phase(), Phase::Booting);
        assert!(TcpStream::connect(worker.addr()).await.is_err());

        let cp = FakeTalosNode::start(node_cfg(6, "rack1-cp-01"), &cluster)
            .await
            .unwrap();
        maintenance(cp.addr())
            .apply_configuration(rendered("rack1-cp-01").as_bytes())
            .await
            .unwrap();
        worker.wait_phase(Phase::Secured).await.unwrap();
        secured(worker.addr()).version().await.unwrap();
        worker.shutdown().await;
        cp.shutdown().await;
    }

    #[tokio::test]
    async fn set_kubeconfig_replaces_the_minted_one_on_any_port() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let mut cfg = node_cfg(4, "rack1-cp-03");
        cfg.port = 50444;
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        assert_eq!(node.addr(), SocketAddr::new(ip(4), 50444));
        maintenance(node.addr())
            .apply_configuration(rendered("rack1-cp-03").as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Secured).await.unwrap();
        let client = secured(node.addr());

        // Minted: for the config's endpoint.
        let minted = String::from_utf8(client.kubeconfig().await.unwrap()).unwrap();
        assert!(
            minted.contains("server: https://10.20.0.10:6443"),
            "{minted}"
        );

        let ours = "apiVersion: v1\nkind: Config\nclusters: []\n# the demo's API double\n";
        cluster.set_kubeconfig(Some(ours.into()));
        assert_eq!(client.kubeconfig().await.unwrap(), ours.as_bytes());
        assert_eq!(node.kubeconfig_calls(), 2);
        assert_eq!(node.last_kubeconfig().as_deref(), Some(ours.as_bytes()));

        cluster.set_kubeconfig(None);
        let again = String::from_utf8(client.kubeconfig().await.unwrap()).unwrap();
        assert!(again.contains("server: https://10.20.0.10:6443"), "{again}");
        node.shutdown().await;
    }

    /// The machine stage the node reports now, over the secured API.
    async fn stage(addr: SocketAddr) -> runtime::RuntimeMachineStage {
        secured(addr).machine_status().await.unwrap().stage()
    }

    #[tokio::test]
    async fn apply_answers_first_and_the_secured_api_answers_while_installing() {
        use runtime::RuntimeMachineStage as Stage;
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let mut cfg = node_cfg(7, "rack1-cp-01");
        cfg.timing.installer_pull = Duration::from_millis(600);
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        let m = maintenance(node.addr());
        assert_eq!(
            m.machine_status().await.unwrap().stage(),
            Stage::MachineStageMaintenance
        );
        m.apply_configuration(rendered("rack1-cp-01").as_bytes())
            .await
            .unwrap();
        // The reply came before anything happened: maintenance still answers for a moment.
        assert_eq!(node.phase(), Phase::Maintenance);
        node.wait_phase(Phase::Installing).await.unwrap();
        // apid runs with mTLS from the config's CA while the installer is pulled: a secured
        // Version answers, but the machine is not installed.
        secured(node.addr()).version().await.unwrap();
        assert_eq!(stage(node.addr()).await, Stage::MachineStageInstalling);
        let status = secured(node.addr()).machine_status().await.unwrap();
        assert!(
            status.status.unwrap().ready,
            "ready says nothing while installing"
        );
        // Bootstrap is not available before it runs from disk.
        assert!(secured(node.addr()).bootstrap().await.is_err());
        node.wait_phase(Phase::Secured).await.unwrap();
        // Booted from disk, a control plane of a new cluster: its etcd waits to join and the
        // boot sequence waits for etcd, so it stays in stage booting, however long.
        tokio::time::sleep(node.shared.cfg.timing.boot * 3).await;
        assert_eq!(stage(node.addr()).await, Stage::MachineStageBooting);
        secured(node.addr()).bootstrap().await.unwrap();
        let mut running = false;
        for _ in 0..100 {
            if stage(node.addr()).await == Stage::MachineStageRunning {
                running = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            running,
            "booted from disk and bootstrapped, the boot sequence ends in stage running"
        );
        assert!(
            secured(node.addr())
                .sequence_failures(Duration::from_millis(100))
                .await
                .unwrap()
                .is_empty()
        );
        node.shutdown().await;
    }

    #[tokio::test]
    async fn a_failed_install_is_a_fatal_sequence_error_then_maintenance_again() {
        use runtime::RuntimeMachineStage as Stage;
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let mut cfg = node_cfg(8, "rack1-cp-01");
        cfg.install_failure = Some(InstallFailure::InstallerPull(
            "dial tcp: lookup ghcr.io: no such host".into(),
        ));
        cfg.timing.fatal_reboot = Duration::from_secs(2);
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        maintenance(node.addr())
            .apply_configuration(rendered("rack1-cp-01").as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Installing).await.unwrap();
        let mut failures = Vec::new();
        for _ in 0..100 {
            failures = secured(node.addr())
                .sequence_failures(Duration::from_millis(50))
                .await
                .unwrap();
            if !failures.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].sequence, "install");
        assert!(
            failures[0]
                .message
                .starts_with("sequence failed: failed to pull image")
                && failures[0].message.contains("no such host"),
            "{failures:?}"
        );
        assert_eq!(stage(node.addr()).await, Stage::MachineStageRebooting);
        // After the countdown it reboots; nothing was installed, so maintenance again.
        node.wait_phase(Phase::Maintenance).await.unwrap();
        node.shutdown().await;
    }

    #[tokio::test]
    async fn reset_answers_at_once_and_the_sequence_runs_afterwards() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let mut cfg = node_cfg(9, "rack1-wk-01");
        cfg.timing.reset = Duration::from_millis(600);
        let cp = FakeTalosNode::start(node_cfg(10, "rack1-cp-01"), &cluster)
            .await
            .unwrap();
        maintenance(cp.addr())
            .apply_configuration(rendered("rack1-cp-01").as_bytes())
            .await
            .unwrap();
        cp.wait_phase(Phase::Secured).await.unwrap();
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        maintenance(node.addr())
            .apply_configuration(rendered("rack1-wk-01").as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Secured).await.unwrap();
        secured(node.addr()).reset(true, true).await.unwrap();
        // The old secured API still answers right after the reply...
        secured(node.addr()).version().await.unwrap();
        assert_eq!(
            stage(node.addr()).await,
            runtime::RuntimeMachineStage::MachineStageResetting
        );
        assert_eq!(node.phase(), Phase::Secured);
        // ...and only later the node goes down and comes back in maintenance mode.
        node.wait_phase(Phase::Maintenance).await.unwrap();
        node.shutdown().await;
        cp.shutdown().await;
    }

    #[tokio::test]
    async fn graceful_reset_of_the_last_etcd_member_fails_after_the_rpc_answered() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let mut cfg = node_cfg(11, "rack1-cp-01");
        cfg.timing.fatal_reboot = Duration::from_secs(2);
        let (reasons_tx, mut reasons) = mpsc::unbounded_channel();
        cfg.boot_hook = Some(Arc::new(move |reason| {
            let _ = reasons_tx.send(reason);
            Box::pin(async {})
        }));
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        maintenance(node.addr())
            .apply_configuration(rendered("rack1-cp-01").as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Secured).await.unwrap();
        let mut bootstrapped = false;
        for _ in 0..100 {
            if secured(node.addr()).bootstrap().await.is_ok() {
                bootstrapped = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(bootstrapped);
        assert_eq!(reasons.recv().await, Some(BootReason::Installed));
        secured(node.addr()).reset(true, true).await.unwrap();
        let mut failures = Vec::new();
        for _ in 0..100 {
            failures = secured(node.addr())
                .sequence_failures(Duration::from_millis(50))
                .await
                .unwrap();
            if !failures.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].sequence, "reset");
        assert!(
            failures[0].message.contains("failed to leave cluster"),
            "{failures:?}"
        );
        // machined reboots after the fatal error, STATE untouched: configured again.
        let reason = tokio::time::timeout(Duration::from_secs(10), reasons.recv())
            .await
            .expect("it reboots after the fatal error");
        assert_eq!(reason, Some(BootReason::Reboot));
        node.wait_phase(Phase::Secured).await.unwrap();
        secured(node.addr()).version().await.unwrap();
        // A reset that does not leave etcd works on the same node.
        secured(node.addr()).reset(false, true).await.unwrap();
        node.wait_phase(Phase::Maintenance).await.unwrap();
        node.shutdown().await;
    }

    #[tokio::test]
    async fn served_connections_have_nagle_off_as_go_servers_do() {
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let node = FakeTalosNode::start(FakeNodeConfig::new(ip(40), "nodelay"), &cluster)
            .await
            .unwrap();
        // A bare TCP connection is enough: the option is set when the connection is
        // accepted, before any TLS.
        let client = TcpStream::connect(node.addr()).await.unwrap();
        let served = crate::sim::probe::served_nodelay(node.addr(), client.local_addr().unwrap())
            .await
            .expect("the double accepts the connection");
        assert!(served, "TCP_NODELAY is off on the served socket");
        drop(client);
        node.shutdown().await;
    }

    #[tokio::test]
    async fn start_names_an_address_in_use() {
        crate::install_crypto_provider();
        let addr = SocketAddr::new(ip(5), APID_PORT);
        let _taken = std::net::TcpListener::bind(addr).unwrap();
        let cluster = FakeCluster::new();
        let err = FakeTalosNode::start(FakeNodeConfig::new(ip(5), "busy"), &cluster)
            .await
            .err()
            .expect("binding a used address must fail");
        assert!(
            matches!(err, SimError::Bind { addr: a, .. } if a == addr),
            "{err:?}"
        );
        assert!(err.to_string().contains("127.0.77.5:50000"), "{err}");
        // A failed start leaves nothing registered under its names.
        assert!(cluster.resolve("busy").is_none());
    }

    #[test]
    fn config_debug_shows_the_hook_only_as_present() {
        let mut cfg = FakeNodeConfig::new(ip(6), "n");
        cfg.boot_hook = Some(Arc::new(|_| Box::pin(async {})));
        let text = format!("{:?}", cfg.clone());
        assert!(text.contains("boot_hook: Some(\"<hook>\")"), "{text}");
        assert!(text.contains("port: 50000"), "{text}");
    }
}
