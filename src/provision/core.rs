//! The pure provisioning core: what to do next for one node, and for the cluster's
//! bootstrap, given what was observed. No I/O, no clock: time comes in as an argument, in
//! the shape of [`crate::tftp::transfer`].
//!
//! This module owns the *decisions* of provisioning; [`super::node`] and [`super::cluster`]
//! are the adapters that perform the [`Effect`]s (Talos calls, store writes, events) and feed
//! what came back in as [`Observation`]s.
//!
//! **Node machine.** [`step`]`(&NodeState, Observation, now) -> (NodeState, Vec<Effect>)`.
//! The adapter persists the returned state *before* it performs the effects, so every
//! non-repeatable call has its intent on disk first (Configuring before ApplyConfiguration,
//! `reset_at_unix` before Reset). Every call effect carries an operation number and the
//! address it goes to; a result is accepted only for the operation in flight and from that
//! address, so a late, duplicated or reordered reply (the concurrent driver makes those
//! possible) never moves the node twice.
//!
//! **Entitlement, once.** Every call effect goes to the address talboot's DHCP bound to one
//! of the node's MACs ([`Observation::Binding`], derived from the lease or ProxyDHCP binding
//! by [`crate::entitlement::bound_address`]); a binding for a MAC that is not the node's is
//! ignored, and without a binding nothing is called. A config therefore never goes anywhere
//! else.
//!
//! **Cluster machine** (child module `bootstrap`, re-exported here). [`ClusterState`] folds
//! the bootstrap marks (`cluster/bootstrap-node`, `cluster/bootstrap`, `cluster/kubeconfig`)
//! and the step record of [`super::steps`] into one value; [`choose_bootstrap_node`] and
//! [`bootstrap_step`] decide the one non-repeatable cluster call, and
//! [`ClusterState::kubeconfig_written`] is the one place that says whether the bootstrap part
//! is over.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::events::EventKind;
use crate::inventory::Mac;
use crate::store::{Lifecycle, NodePhase, NodeRecord};

mod bootstrap;
pub(crate) use bootstrap::{
    BootstrapEffect, BootstrapMark, BootstrapObs, BootstrapProbe, Choice, ClusterState,
    ForBootstrap, NotReadyForBootstrap, bootstrap_readiness, bootstrap_step, choose_bootstrap_node,
    forget_bootstrap,
};

/// The address DHCP bound to one of the node's MACs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The MAC.
    pub mac: Mac,
    /// The address bound to it.
    pub ip: Ipv4Addr,
}

/// What the node machine needs from the inventory and the settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCtx {
    /// The node's MACs (a binding of any other MAC is ignored).
    pub macs: Vec<Mac>,
    /// The node is a control plane (a reset may have to skip leaving etcd).
    pub(crate) control_plane: bool,
    /// From ApplyConfiguration until machine stage running.
    pub(crate) install_timeout: Duration,
    /// From the Reset reply until the maintenance API answers.
    pub reset_timeout: Duration,
    /// The node has a power controller that sets boot devices (Redfish, IPMI, Proxmox; not
    /// Wake-on-LAN): once installed, its persistent boot device becomes the disk.
    pub disk_boot: bool,
}

/// Which call is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// [`Effect::Probe`].
    Probe,
    /// [`Effect::ReadFacts`].
    ReadFacts,
    /// [`Effect::Apply`].
    Apply,
    /// [`Effect::ResolveApply`].
    ResolveApply,
    /// [`Effect::WatchInstall`].
    WatchInstall,
    /// [`Effect::PrepareReset`].
    PrepareReset,
    /// [`Effect::Reset`].
    Reset,
    /// [`Effect::WatchReset`].
    WatchReset,
}

/// The call in flight: its number, kind and address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Operation number.
    pub op: u64,
    /// Which call.
    pub kind: CallKind,
    /// Where it went.
    pub ip: Ipv4Addr,
    /// The phase it was made in: a result that comes back after the phase changed (a
    /// rebuild command arrived meanwhile) is dropped.
    pub phase: NodePhase,
    /// A reset that leaves etcd first.
    pub graceful: bool,
}

/// A node's state: the persisted record and lifecycle, and (not persisted) the binding and
/// the call in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// The persisted record (phase, address, window).
    pub rec: NodeRecord,
    /// The persisted lifecycle (failure, install evidence, reset time).
    pub life: Lifecycle,
    /// The current DHCP binding (re-derived from the store after a restart).
    pub bound: Option<Binding>,
    /// The call in flight, if any.
    pub(crate) pending: Option<Pending>,
    /// The next operation number.
    pub(crate) next_op: u64,
}

impl NodeState {
    /// The state of a node read from the store (or new: `rec` fresh), nothing in flight.
    pub(crate) fn from_persisted(rec: NodeRecord, life: Lifecycle) -> Self {
        Self {
            rec,
            life,
            bound: None,
            pending: None,
            next_op: 1,
        }
    }

    /// A node never seen: Unknown with its provisioning window open.
    pub fn fresh(name: &str, now: u64) -> Self {
        Self::from_persisted(NodeRecord::unseen(name, now), Lifecycle::default())
    }

    /// Whether the persisted part differs from `other`'s (the adapter writes only then).
    pub(crate) fn persisted_differs(&self, other: &NodeState) -> bool {
        self.rec != other.rec || self.life != other.life
    }
}

/// Why a rebuild was refused: talboot applied no config to the node (or the config it
/// applied is gone and the node waits for it again), so there is nothing to reset, and the
/// node gets its config anyway, on its next network boot or now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RebuildRefused {
    /// Never seen booting.
    #[error(
        "node {node} was never provisioned (talboot has not seen it boot), so there is nothing \
         to reset: it is provisioned on its first network boot; power it on (`talboot node \
         power {node} on`) or network-boot it, and `talboot status` shows its progress"
    )]
    NeverSeen {
        /// The node.
        node: String,
    },
    /// Booting with its provisioning window open: no config applied yet.
    #[error(
        "node {node} is booting and holds no config from talboot yet, so there is nothing to \
         reset: talboot provisions it once its maintenance API answers (`talboot status` \
         shows its progress)"
    )]
    Booting {
        /// The node.
        node: String,
    },
    /// In maintenance mode with its window open: talboot is applying its config.
    #[error(
        "node {node} is in maintenance mode without a config, so there is nothing to reset: \
         talboot applies its config now (`talboot status` shows its progress)"
    )]
    AwaitingConfig {
        /// The node.
        node: String,
    },
}

/// Whether `node_rec` (the committed record; a node never seen has
/// [`NodeRecord::unseen`]) may be rebuilt. A rebuild resets a node that holds a config
/// talboot applied; a node whose provisioning window is still open and that is not past
/// the apply (never seen, booting, waiting in maintenance mode) holds none, so the request
/// is refused with what happens instead. Failed nodes may always be rebuilt (that is how an
/// operator retries after fixing the cause), as may nodes configured, installing, ready or
/// already rebuilding.
pub(crate) fn check_rebuild(rec: &NodeRecord) -> Result<(), RebuildRefused> {
    if !rec.provisioning_window_open {
        return Ok(());
    }
    let node = rec.name.clone();
    match rec.phase {
        NodePhase::Unknown => Err(RebuildRefused::NeverSeen { node }),
        NodePhase::Booting => Err(RebuildRefused::Booting { node }),
        NodePhase::Maintenance => Err(RebuildRefused::AwaitingConfig { node }),
        NodePhase::Configuring
        | NodePhase::Installing
        | NodePhase::Ready
        | NodePhase::Rebuilding
        | NodePhase::Failed => Ok(()),
    }
}

/// What the secured side of a probe found (the maintenance API refused: the node holds a
/// config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    // Probe and ResolveApply.
    /// The maintenance API answered, with this Talos version.
    Maintenance {
        /// Version tag.
        version: String,
    },
    /// The maintenance API refused (a config is installed) and the secured API answered.
    Configured {
        /// Version tag.
        version: String,
    },
    /// The maintenance API refused and the secured API is not usable yet.
    ConfiguredUnusable {
        /// Why.
        why: String,
    },
    /// The maintenance API refused (a config is installed); the secured API was not asked.
    LeftMaintenance,
    /// Nothing usable answered (down, booting, timeout).
    NoAnswer {
        /// Why.
        why: String,
    },
    // ReadFacts.
    /// Facts read; the install disk check passed.
    FactsOk {
        /// The disk Talos will install to.
        install_disk: String,
    },
    /// The Secure Boot gate refused the node (see [`super::secure_boot`]): it gets no config.
    SecureBootRefused {
        /// The refusal, naming what the node reported.
        why: String,
    },
    /// The install disk check refused the node's disks.
    DiskRefused {
        /// The refusal, listing the disks.
        why: String,
    },
    /// A call failed in a way the next poll will not change by itself, without a phase
    /// change (the step reports the error).
    CallFailed {
        /// Why.
        why: String,
    },
    // Apply.
    /// The machine config could not be rendered.
    RenderFailed {
        /// The renderer's message.
        why: String,
    },
    /// ApplyConfiguration answered.
    ApplyAccepted,
    /// The node validated and refused the config.
    ApplyRefused {
        /// Talos's message.
        why: String,
    },
    /// No reply, or a busy node: the outcome is unknown.
    ApplyLost {
        /// Why.
        why: String,
    },
    // WatchInstall.
    /// Secured API answered, machine stage running (installed, booted from disk).
    StageRunning {
        /// Version tag.
        version: String,
    },
    /// Secured API answered with another stage.
    Stage {
        /// The stage as Talos prints it.
        name: String,
    },
    /// Secured API answered, but the status could not be read.
    StatusUnknown {
        /// Why.
        why: String,
    },
    /// The install sequence failed (from the node's events).
    InstallFailed {
        /// Talos's message.
        cause: String,
    },
    /// The secured API refused our CA and the maintenance API answers: back in maintenance
    /// mode without its config.
    BackInMaintenance,
    /// Our CA is not the node's (the secured API refused it twice, no maintenance API).
    WrongCa {
        /// Why.
        why: String,
    },
    /// The secured API just restarted with mutual TLS (maintenance refused, secured answers).
    JustRestarted,
    // PrepareReset, Reset, WatchReset.
    /// The secured API answered; `last_voter`: it is the only voting etcd member.
    ResetTarget {
        /// Only voting etcd member.
        last_voter: bool,
    },
    /// The Reset RPC answered.
    ResetAccepted,
    /// The Reset RPC failed.
    ResetRefused {
        /// Why.
        why: String,
    },
    /// The reset sequence failed on the node (from its events).
    ResetSequenceFailed {
        /// Talos's message.
        cause: String,
    },
    /// Still configured: resetting.
    StillConfigured,
}

/// What the servers, the Talos clients and the operator saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// The DHCP binding of the node now (`None`: no bound, unexpired lease / binding).
    Binding(Option<Binding>),
    /// The node was seen booting on the network (DHCP ack, script, kernel, initramfs).
    BootSeen,
    /// The operator asked for a rebuild.
    RebuildRequested,
    /// What now? (the driver's poll): starts the call the phase needs.
    Poll,
    /// A call's result: operation number, where it went, what it found.
    Result {
        /// The operation number of the effect.
        op: u64,
        /// The address it went to.
        at: Ipv4Addr,
        /// What it found.
        outcome: Outcome,
    },
}

/// Why the node failed, for the adapter's typed error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailCause {
    /// The install disk was refused.
    Disk,
    /// The Secure Boot gate refused the node.
    SecureBoot,
    /// The config could not be rendered.
    Render,
    /// A Talos call failed (the adapter holds the error).
    Talos,
    /// The install failed on the node.
    InstallFailed(String),
    /// The install did not finish in time.
    InstallTimeout,
    /// The reset failed.
    ResetFailed(String),
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Maintenance `Version` at `ip`; when it refuses, secured `Version`.
    Probe {
        /// Operation number.
        op: u64,
        /// The bound address.
        ip: Ipv4Addr,
    },
    /// Read version, disks and system information in maintenance mode, record them, check
    /// the install disk.
    ReadFacts {
        /// Operation number.
        op: u64,
        /// The bound address.
        ip: Ipv4Addr,
    },
    /// Render the config and ApplyConfiguration (mode AUTO). Its intent (Configuring) is
    /// in the state this effect comes with.
    Apply {
        /// Operation number.
        op: u64,
        /// The bound address: the only one a config goes to.
        ip: Ipv4Addr,
    },
    /// Maintenance `Version` only: did the config land?
    ResolveApply {
        /// Operation number.
        op: u64,
        /// The bound address.
        ip: Ipv4Addr,
    },
    /// Secured `Version` and `MachineStatus` (and the install sequence's failure).
    WatchInstall {
        /// Operation number.
        op: u64,
        /// The bound address.
        ip: Ipv4Addr,
    },
    /// Find the node's secured API (and whether it is the last etcd voter), or that it is in
    /// maintenance mode already.
    PrepareReset {
        /// Operation number.
        op: u64,
        /// The bound address.
        ip: Ipv4Addr,
    },
    /// Reset (wipe STATE+EPHEMERAL, reboot). Its intent (`reset_at_unix`) is in the state.
    Reset {
        /// Operation number.
        op: u64,
        /// The bound address.
        ip: Ipv4Addr,
        /// Leave etcd first (not for the last voter).
        graceful: bool,
    },
    /// Maintenance `Version` (done), else the reset sequence's failure.
    WatchReset {
        /// Operation number.
        op: u64,
        /// The bound address.
        ip: Ipv4Addr,
    },
    /// The last voting etcd member was reset: the cluster is bootstrapped again.
    ForgetBootstrap,
    /// The node is installed: set its persistent boot device to the disk through its power
    /// controller (issue 14: no boot loop after install without touching the BIOS order).
    /// Emitted once per install; its intent (`disk_boot_set`) is in the state, so a restart
    /// does not repeat it. A failure is the adapter's event, not the node's.
    SetDiskBoot,
    /// A phase change, for the timeline (`from -> to: why`).
    Phase {
        /// Before.
        from: NodePhase,
        /// After.
        to: NodePhase,
        /// Why.
        why: String,
    },
    /// An event for the node's timeline.
    Event {
        /// Kind.
        kind: EventKind,
        /// Detail.
        detail: String,
    },
    /// Progress was made: step again.
    Again,
    /// Nothing to do until something changes.
    Wait {
        /// What it waits for.
        reason: String,
    },
    /// The node failed; the state holds the reason too.
    Fail {
        /// Why (what `talboot status` shows).
        reason: String,
        /// For the adapter's typed error.
        cause: FailCause,
    },
    /// A call failed without a phase change (the adapter reports its error).
    Error {
        /// Why.
        why: String,
    },
}

impl Effect {
    /// The call this effect makes, with its number and address.
    pub fn call(&self) -> Option<Pending> {
        let mut graceful = false;
        let (op, kind, ip) = match *self {
            Effect::Probe { op, ip } => (op, CallKind::Probe, ip),
            Effect::ReadFacts { op, ip } => (op, CallKind::ReadFacts, ip),
            Effect::Apply { op, ip } => (op, CallKind::Apply, ip),
            Effect::ResolveApply { op, ip } => (op, CallKind::ResolveApply, ip),
            Effect::WatchInstall { op, ip } => (op, CallKind::WatchInstall, ip),
            Effect::PrepareReset { op, ip } => (op, CallKind::PrepareReset, ip),
            Effect::Reset {
                op,
                ip,
                graceful: g,
            } => {
                graceful = g;
                (op, CallKind::Reset, ip)
            }
            Effect::WatchReset { op, ip } => (op, CallKind::WatchReset, ip),
            _ => return None,
        };
        Some(Pending {
            op,
            kind,
            ip,
            phase: NodePhase::Unknown,
            graceful,
        })
    }
}

/// Working copy of one step.
struct Step {
    s: NodeState,
    out: Vec<Effect>,
    now: u64,
}

impl Step {
    fn set_phase(&mut self, to: NodePhase, why: impl Into<String>) {
        let from = self.s.rec.phase;
        if from == NodePhase::Failed && to != NodePhase::Failed {
            self.s.life.failure = None;
        }
        self.s.rec.phase = to;
        self.s.rec.phase_since_unix = self.now;
        self.out.push(Effect::Phase {
            from,
            to,
            why: why.into(),
        });
    }

    fn advance(&mut self, to: NodePhase, why: impl Into<String>) {
        self.set_phase(to, why);
        self.out.push(Effect::Again);
    }

    fn fail(&mut self, reason: String, cause: FailCause) {
        self.s.life.failure = Some(reason.clone());
        self.set_phase(NodePhase::Failed, reason.clone());
        self.out.push(Effect::Fail { reason, cause });
    }

    fn wait(&mut self, reason: impl Into<String>) {
        self.out.push(Effect::Wait {
            reason: reason.into(),
        });
    }

    fn call(&mut self, kind: CallKind, ip: Ipv4Addr, graceful: bool) {
        let op = self.s.next_op;
        self.s.next_op += 1;
        let phase = self.s.rec.phase;
        self.s.pending = Some(Pending {
            op,
            kind,
            ip,
            phase,
            graceful,
        });
        self.out.push(match kind {
            CallKind::Probe => Effect::Probe { op, ip },
            CallKind::ReadFacts => Effect::ReadFacts { op, ip },
            CallKind::Apply => Effect::Apply { op, ip },
            CallKind::ResolveApply => Effect::ResolveApply { op, ip },
            CallKind::WatchInstall => Effect::WatchInstall { op, ip },
            CallKind::PrepareReset => Effect::PrepareReset { op, ip },
            CallKind::Reset => Effect::Reset { op, ip, graceful },
            CallKind::WatchReset => Effect::WatchReset { op, ip },
        });
    }

    /// The install deadline (from the phase's start): past it the node Failed.
    fn install_deadline(&mut self, ctx: &NodeCtx, waiting_for: String) {
        let limit = ctx.install_timeout;
        let elapsed = Duration::from_secs(self.now.saturating_sub(self.s.rec.phase_since_unix));
        if elapsed >= limit {
            let msg = format!(
                "node {} did not come back installed (machine stage running) within {limit:?} \
                 after its config was applied; check its console (install disk, installer \
                 image pull) and `talboot status`",
                self.s.rec.name
            );
            self.fail(
                format!("{msg} (last: {waiting_for})"),
                FailCause::InstallTimeout,
            );
        } else {
            self.wait(waiting_for);
        }
    }

    /// The reset deadline (from the Reset reply): past it the rebuild Failed, because the
    /// node never came back in maintenance mode, so the reset did not happen.
    fn reset_deadline(&mut self, ctx: &NodeCtx, still: String) {
        let limit = ctx.reset_timeout;
        let at = self.s.life.reset_at_unix.unwrap_or(self.now);
        let elapsed = Duration::from_secs(self.now.saturating_sub(at));
        if elapsed >= limit {
            self.s.life.reset_at_unix = None;
            let cause = format!(
                "the node did not come back in maintenance mode within {limit:?} after \
                 Reset answered (last: {still}); the reset did not happen"
            );
            self.fail(
                format!("rebuild failed: {cause}"),
                FailCause::ResetFailed(cause),
            );
        } else {
            self.wait(format!(
                "reset requested; waiting for maintenance mode: {still}"
            ));
        }
    }
}

/// One step of the node machine; see the module docs.
pub fn step(
    state: &NodeState,
    obs: Observation,
    now: u64,
    ctx: &NodeCtx,
) -> (NodeState, Vec<Effect>) {
    let mut st = Step {
        s: state.clone(),
        out: Vec::new(),
        now,
    };
    match obs {
        // A binding of a MAC that is not the node's says nothing about the node.
        Observation::Binding(Some(b)) if !ctx.macs.contains(&b.mac) => {}
        Observation::Binding(b) => {
            st.s.bound = b;
            if let Some(b) = b
                && (st.s.rec.last_seen_addr != Some(b.ip) || st.s.rec.mac != Some(b.mac))
            {
                st.s.rec.last_seen_addr = Some(b.ip);
                st.s.rec.mac = Some(b.mac);
            }
        }
        Observation::BootSeen => {
            // A failed node whose window is still open (disk refused, render failed) gets a
            // new attempt when it boots again, e.g. after the operator fixed the inventory.
            if matches!(st.s.rec.phase, NodePhase::Unknown | NodePhase::Failed)
                && st.s.rec.provisioning_window_open
            {
                st.set_phase(NodePhase::Booting, "boot seen on the network");
            }
        }
        Observation::RebuildRequested => {
            st.s.rec.provisioning_window_open = true;
            // A new rebuild: forget an earlier reset that never finished.
            st.s.life.reset_at_unix = None;
            st.s.life.install_seen = false;
            // The reinstall sets the disk boot device again (a one-time network boot may
            // have replaced it).
            st.s.life.disk_boot_set = false;
            st.set_phase(NodePhase::Rebuilding, "rebuild requested by the operator");
        }
        Observation::Poll => poll(&mut st),
        Observation::Result { op, at, outcome } => {
            let Some(p) = st.s.pending else {
                return (st.s, st.out);
            };
            // Only the call in flight, from where it went; anything else is late or forged.
            if p.op != op || p.ip != at {
                return (state.clone(), Vec::new());
            }
            st.s.pending = None;
            // A call in flight when a command changed the phase: its answer is about a
            // question nobody asks any more (the call itself may have landed; the new phase
            // finds out what the machine does now).
            let same = |a: NodePhase| match a {
                NodePhase::Unknown => NodePhase::Booting,
                p => p,
            };
            if same(p.phase) != same(st.s.rec.phase) {
                return (st.s, st.out);
            }
            result(&mut st, p, outcome, ctx);
        }
    }
    (st.s, st.out)
}

fn poll(st: &mut Step) {
    let phase = st.s.rec.phase;
    if matches!(phase, NodePhase::Ready | NodePhase::Failed) {
        return;
    }
    if st.s.pending.is_some() {
        st.wait("a call is in flight");
        return;
    }
    if phase == NodePhase::Maintenance && !st.s.rec.provisioning_window_open {
        st.out.push(Effect::Event {
            kind: EventKind::ConfigRefused,
            detail: "node is in maintenance mode but its provisioning window is closed; run \
                     `talboot node rebuild` to reprovision it"
                .into(),
        });
        st.wait("provisioning window closed");
        return;
    }
    let Some(b) = st.s.bound else {
        match phase {
            NodePhase::Unknown | NodePhase::Booting => st.wait("no DHCP lease or address seen yet"),
            NodePhase::Rebuilding if st.s.life.reset_at_unix.is_some() => {
                st.wait("reset requested; no address known to watch it come back")
            }
            NodePhase::Rebuilding => st.advance(
                NodePhase::Booting,
                "no address known; waiting for its next boot",
            ),
            _ => st.wait("no address known"),
        }
        return;
    };
    match phase {
        NodePhase::Unknown | NodePhase::Booting => st.call(CallKind::Probe, b.ip, false),
        NodePhase::Maintenance => st.call(CallKind::ReadFacts, b.ip, false),
        NodePhase::Configuring => st.call(CallKind::ResolveApply, b.ip, false),
        NodePhase::Installing => st.call(CallKind::WatchInstall, b.ip, false),
        NodePhase::Rebuilding if st.s.life.reset_at_unix.is_some() => {
            st.call(CallKind::WatchReset, b.ip, false)
        }
        NodePhase::Rebuilding => st.call(CallKind::PrepareReset, b.ip, false),
        NodePhase::Ready | NodePhase::Failed => {}
    }
}

/// A call's result, read by the call it answers: the same outcome means different things to
/// different calls (a maintenance answer is progress to a probe, a failed apply to
/// ResolveApply, the end of a reset to WatchReset). Whatever a call does not claim goes to
/// [`any_call_result`].
fn result(st: &mut Step, p: Pending, outcome: Outcome, ctx: &NodeCtx) {
    match p.kind {
        CallKind::Probe => probe_answered(st, outcome),
        CallKind::ReadFacts => facts_read(st, p, outcome),
        CallKind::Apply => apply_answered(st, p, outcome),
        CallKind::ResolveApply => apply_resolved(st, p, outcome, ctx),
        CallKind::WatchInstall => install_watched(st, p, outcome, ctx),
        CallKind::PrepareReset => reset_prepared(st, p, outcome, ctx),
        CallKind::Reset => reset_answered(st, p, outcome),
        CallKind::WatchReset => reset_watched(st, p, outcome, ctx),
    }
}

/// [`CallKind::Probe`]: whether a booting node is in maintenance mode (talboot configures
/// it) or holds a config already (nothing to push).
fn probe_answered(st: &mut Step, outcome: Outcome) {
    use Outcome as O;
    match outcome {
        O::Maintenance { version } => {
            st.s.rec.talos_version = Some(version);
            st.advance(NodePhase::Maintenance, "maintenance API answers");
        }
        O::Configured { version } => {
            // It holds a config already: nothing to push. Whether it is installed (or still
            // installing) is the Installing phase's question.
            st.s.rec.talos_version = Some(version);
            st.s.rec.provisioning_window_open = false;
            st.s.life.install_seen = true;
            st.advance(
                NodePhase::Installing,
                "already configured (secured API answers); waiting for machine stage running",
            );
        }
        O::ConfiguredUnusable { why } => st.wait(format!(
            "configured node, secured API not usable yet: {why}"
        )),
        other => any_call_result(st, CallKind::Probe, other),
    }
}

/// [`CallKind::ReadFacts`]: the facts passed the install-disk check, so the config is
/// applied now (intent first), or the node cannot be installed as the inventory says.
fn facts_read(st: &mut Step, p: Pending, outcome: Outcome) {
    use Outcome as O;
    match outcome {
        O::FactsOk { .. } => {
            if !st.s.rec.provisioning_window_open {
                st.wait("provisioning window closed");
                return;
            }
            // A new install starts: only a secured answer after this apply counts as "left
            // maintenance mode".
            st.s.life.install_seen = false;
            // Intent first: the adapter persists Configuring before it makes the call.
            st.set_phase(
                NodePhase::Configuring,
                "applying machine config (mode AUTO)",
            );
            st.call(CallKind::Apply, p.ip, false);
        }
        O::LeftMaintenance => {
            // It left maintenance behind our back (someone else configured it).
            st.advance(NodePhase::Booting, "maintenance API gone; probing again")
        }
        O::DiskRefused { why } => st.fail(format!("install disk refused: {why}"), FailCause::Disk),
        // The refusal already says no config was sent; the window stays as it is, so a
        // fixed machine booting again is judged again.
        O::SecureBootRefused { why } => st.fail(why, FailCause::SecureBoot),
        O::RenderFailed { why } => not_rendered(st, why),
        other => any_call_result(st, p.kind, other),
    }
}

/// [`CallKind::Apply`]: the config landed (the window closes), was refused, or its reply was
/// lost (Configuring finds out which on the next step).
fn apply_answered(st: &mut Step, p: Pending, outcome: Outcome) {
    use Outcome as O;
    match outcome {
        O::RenderFailed { why } => not_rendered(st, why),
        O::ApplyAccepted => {
            st.s.rec.provisioning_window_open = false;
            st.advance(
                NodePhase::Installing,
                "config applied; installing and rebooting",
            );
        }
        O::ApplyRefused { why } => st.fail(format!("config refused: {why}"), FailCause::Talos),
        // Lost reply or busy node: Configuring resolves it on the next step.
        O::ApplyLost { why } => st.wait(why),
        other => any_call_result(st, p.kind, other),
    }
}

/// The config could not be rendered: the node fails with the renderer's reason (fixing the
/// inventory and booting again retries it).
fn not_rendered(st: &mut Step, why: String) {
    st.fail(format!("config not rendered: {why}"), FailCause::Render)
}

/// [`CallKind::ResolveApply`]: after a lost apply reply, whether the config landed (the
/// node left maintenance mode) or applying it again is safe (still in maintenance mode).
fn apply_resolved(st: &mut Step, p: Pending, outcome: Outcome, ctx: &NodeCtx) {
    use Outcome as O;
    match outcome {
        O::Maintenance { .. } => {
            // Still in maintenance: the config did not land, so applying it is safe.
            st.advance(NodePhase::Maintenance, "config not taken; applying again")
        }
        O::LeftMaintenance | O::Configured { .. } => {
            st.s.rec.provisioning_window_open = false;
            st.advance(
                NodePhase::Installing,
                "node left maintenance: config applied",
            );
        }
        O::NoAnswer { why } | O::ConfiguredUnusable { why } => st.install_deadline(ctx, why),
        other => any_call_result(st, p.kind, other),
    }
}

/// [`CallKind::WatchInstall`]: how far the install is. Running from disk is Ready (and the
/// disk becomes the boot device); anything short of it waits against the install deadline,
/// unless the install visibly failed.
fn install_watched(st: &mut Step, p: Pending, outcome: Outcome, ctx: &NodeCtx) {
    use Outcome as O;
    match outcome {
        O::StageRunning { version } => {
            st.s.life.install_seen = true;
            let why = format!("installed and booted from disk (machine stage running, {version})");
            st.s.rec.talos_version = Some(version);
            st.advance(NodePhase::Ready, why);
            if ctx.disk_boot && !st.s.life.disk_boot_set {
                st.s.life.disk_boot_set = true;
                st.out.push(Effect::SetDiskBoot);
            }
        }
        O::Stage { name } => {
            st.s.life.install_seen = true;
            st.install_deadline(ctx, format!("machine stage {name}"));
        }
        O::StatusUnknown { why } => {
            st.s.life.install_seen = true;
            st.install_deadline(ctx, why);
        }
        O::InstallFailed { cause } => {
            st.s.life.install_seen = true;
            st.fail(
                format!("install failed: {cause}"),
                FailCause::InstallFailed(cause),
            );
        }
        O::BackInMaintenance if st.s.life.install_seen => {
            // It had left maintenance mode with our config and is back there without it:
            // the install sequence failed and machined rebooted (siderolabs/talos v1.13.9
            // internal/app/machined/main.go, handle).
            let why = "install failed: the node rebooted back into maintenance mode without \
                       its config (its console or `talosctl dmesg` shows the install error); \
                       run `talboot node rebuild` once fixed";
            st.fail(why.into(), FailCause::InstallFailed(why.into()));
        }
        O::BackInMaintenance => st.install_deadline(ctx, "still in maintenance mode".into()),
        O::WrongCa { why } => st.fail(why, FailCause::Talos),
        O::JustRestarted => st.wait("its API just restarted with mutual TLS"),
        O::NoAnswer { why } => st.install_deadline(ctx, why),
        other => any_call_result(st, p.kind, other),
    }
}

/// [`CallKind::PrepareReset`]: the node to rebuild is found on its secured API, so the reset
/// is called (intent first), or it is in maintenance mode already (nothing to reset).
fn reset_prepared(st: &mut Step, p: Pending, outcome: Outcome, ctx: &NodeCtx) {
    use Outcome as O;
    match outcome {
        O::Maintenance { .. } => st.advance(NodePhase::Maintenance, "already in maintenance mode"),
        O::NoAnswer { why } => st.wait(format!("cannot reach its secured API to reset it: {why}")),
        O::ResetTarget { last_voter } => {
            // A graceful reset leaves etcd first; etcd refuses to remove its last voting
            // member (siderolabs/talos v1.13.9 v1alpha1_sequencer.go, Reset: `leave`;
            // internal/pkg/etcd/etcd.go, LeaveCluster), so the last voter is reset without
            // leaving, and its cluster bootstrapped again.
            let graceful = !(ctx.control_plane && last_voter);
            // Intent first: a restart after the call must wait for the reset, not call again.
            st.s.life.reset_at_unix = Some(st.now);
            st.call(CallKind::Reset, p.ip, graceful);
        }
        other => any_call_result(st, p.kind, other),
    }
}

/// [`CallKind::Reset`]: the reset was taken (the node comes back in maintenance mode; the
/// last etcd voter takes its cluster's bootstrap with it) or refused (its intent is undone).
fn reset_answered(st: &mut Step, p: Pending, outcome: Outcome) {
    use Outcome as O;
    match outcome {
        O::ResetAccepted => {
            if !p.graceful {
                // The last voting etcd member is wiped: its cluster's etcd with it.
                st.out.push(Effect::ForgetBootstrap);
            }
            st.s.rec.talos_version = None;
            st.out.push(Effect::Again);
        }
        O::ResetRefused { why } => {
            st.s.life.reset_at_unix = None;
            st.out.push(Effect::Error { why });
        }
        other => any_call_result(st, p.kind, other),
    }
}

/// [`CallKind::WatchReset`]: the reset node is back in maintenance mode (the rebuild
/// provisions it again), its reset failed, or it is still on its way against the reset
/// deadline.
fn reset_watched(st: &mut Step, p: Pending, outcome: Outcome, ctx: &NodeCtx) {
    use Outcome as O;
    match outcome {
        O::Maintenance { .. } => {
            st.s.life.reset_at_unix = None;
            st.s.life.install_seen = false;
            st.advance(
                NodePhase::Maintenance,
                "reset done: back in maintenance mode",
            );
        }
        O::ResetSequenceFailed { cause } => {
            st.s.life.reset_at_unix = None;
            st.fail(
                format!("reset failed on the node: {cause}"),
                FailCause::ResetFailed(cause),
            );
        }
        O::StillConfigured => st.reset_deadline(ctx, "still configured (resetting)".to_owned()),
        O::NoAnswer { why } => st.reset_deadline(ctx, format!("down ({why})")),
        other => any_call_result(st, p.kind, other),
    }
}

/// Outcomes no call kind gives a meaning of its own: a transient failure waits, a hard one
/// is reported without a phase change, and an outcome the call cannot produce is the
/// adapter's bug, reported, never acted on.
fn any_call_result(st: &mut Step, kind: CallKind, outcome: Outcome) {
    match outcome {
        Outcome::NoAnswer { why } => st.wait(why),
        Outcome::CallFailed { why } => st.out.push(Effect::Error { why }),
        other => st.out.push(Effect::Error {
            why: format!("internal: unexpected outcome {other:?} of {kind:?}"),
        }),
    }
}

#[cfg(test)]
mod model;
