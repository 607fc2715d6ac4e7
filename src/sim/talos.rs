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
//!   and strict as Talos's config loader and validator are (see [`loader::parse_config`]), with
//!   their wording.
//! * After a full config is applied in maintenance mode the reply goes out first; then, as
//!   Talos v1.13.9 does (see [`sequences::install_sequence`]), apid restarts **Installing**: mTLS with a
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
//!   ([`sequences::reset_sequence`]): of STATE+EPHEMERAL it sends the node back to maintenance (after
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

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::talos::api::common;
use crate::talos::api::machine;
use crate::talos::api::talos::resource::definitions::runtime;

use super::SimError;
use super::disks::{InstallDiskError, SimDisk, talos_install_disk};
use super::pki::{CertKey, PkiError, SimCa};

mod apid;
#[cfg(test)]
mod apply_e2e;
pub(crate) mod config_view;
#[cfg(test)]
mod etcd_e2e;
mod loader;
mod machine_config;
mod manifests;
mod security;
mod sequences;
// Its `route_or_forward!` serves `upgrade`'s RPCs too (declared after it, below).
#[macro_use]
mod services;
mod supervisor;
mod tls;
mod unattended;
mod v114;
#[cfg(test)]
mod v114_e2e;

use apid::{ADMIN, NodeApi, OPERATE, Route};
use loader::{ParsedConfig, parse_config};
pub use machine_config::{ApplyRecord, RunningConfig};
pub use security::SimSecurity;
use services::{reply_apply, resource};
use supervisor::{bind, supervise};
use tls::{NextBoot, boot_tls};
pub use unattended::{UnattendedPhase, UnattendedStatus};
pub use v114::TALOS_V114_TAG;
use v114::TalosRules;

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

/// The Talos version a new double claims to run unless [`FakeNodeConfig::talos_version`] says
/// otherwise.
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
    /// The Talos version it boots first ([`TALOS_TAG`] unless set): `Version` reports it
    /// until an upgrade, and it decides whether the node behaves as v1.13 or v1.14 (see
    /// [`v114`]).
    pub talos_version: String,
    /// Its firmware's Secure Boot state and boot media, reported as `SecurityState`
    /// (see [`security`]); a plain network boot unless set.
    pub security: SimSecurity,
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
            .field("talos_version", &self.talos_version)
            .field("security", &self.security)
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
            talos_version: TALOS_TAG.to_owned(),
            security: SimSecurity::default(),
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
    security_state_reads: AtomicUsize,
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
    /// The `UnattendedInstallStatus` resource (v1.14, see [`unattended`]); None: NotFound.
    unattended: Mutex<Option<UnattendedStatus>>,
}

impl Shared {
    /// Which Talos minor's rules the node follows: its running version's.
    fn rules(&self) -> TalosRules {
        TalosRules::of(&upgrade::running(self))
    }

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
            if v.get("kind").and_then(yaml_serde::Value::as_str) == Some("UnattendedInstallConfig")
            {
                // v1.14's unattended install: the selector's first match (see [`unattended`]).
                let selector = v
                    .get("provisioning")
                    .and_then(|p| p.get("diskSelector"))
                    .and_then(|s| s.get("match"))
                    .and_then(yaml_serde::Value::as_str)
                    .unwrap_or_default();
                return Some(
                    unattended::matched_disk(selector, &self.cfg.disks)
                        .ok_or(InstallDiskError::NoMatch),
                );
            }
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
        let first_version = cfg.talos_version.clone();
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
            versions: Mutex::new(upgrade::Versions::booted(&first_version)),
            etcd: Mutex::default(),
            unattended: Mutex::default(),
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

    /// COSI Gets of `SecurityState` that reached the handler (found or not).
    pub fn security_state_reads(&self) -> usize {
        self.shared
            .stats
            .security_state_reads
            .load(Ordering::SeqCst)
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

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use time::OffsetDateTime;
    use tokio::net::TcpStream;
    use tokio::sync::Semaphore;

    use super::supervisor::TRUSTD_RETRY;
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
