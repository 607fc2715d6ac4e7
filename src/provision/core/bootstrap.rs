//! The pure cluster machine: [`ClusterState`] folds the bootstrap marks
//! (`cluster/bootstrap-node`, `cluster/bootstrap`, `cluster/kubeconfig`) and the step record
//! of [`crate::provision::steps`] into one value; [`choose_bootstrap_node`] and
//! [`bootstrap_step`] decide the one non-repeatable cluster call (Bootstrap, exactly once, on
//! one node), and [`ClusterState::kubeconfig_written`] is the one place that says whether the
//! bootstrap part is over. Like the node machine beside it: no I/O, no clock.

use crate::store::{ClusterStep, NodePhase, StepRecord};

/// Where the bootstrap is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BootstrapMark {
    /// Not started.
    None,
    /// Intent recorded: the call may have been made.
    Intent,
    /// Done.
    Done,
    /// The last etcd member was rebuilt: bootstrap again.
    Rebuilt,
}

/// The cluster's progress, one value: the bootstrap node, the bootstrap mark, whether the
/// kubeconfig was written, and the step record of the later steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClusterState {
    /// The chosen bootstrap node.
    pub bootstrap_node: Option<String>,
    /// The bootstrap mark.
    pub bootstrap: BootstrapMark,
    /// The kubeconfig was written (and not undone by a rebuild of the last etcd member).
    pub(crate) kubeconfig_done: bool,
    /// The later steps' record.
    pub step: Option<StepRecord>,
}

impl ClusterState {
    /// Bootstrap, health wait and kubeconfig are over: the one place that says so.
    pub(crate) fn kubeconfig_written(&self) -> bool {
        self.kubeconfig_done
            || self
                .step
                .as_ref()
                .is_some_and(|s| s.step > ClusterStep::WaitingForControlPlanes)
    }
}

/// The bootstrap node choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Keep (or report) this node; nothing to persist.
    Keep(String),
    /// Persist this node (it replaces `replaces`, which failed).
    Persist {
        /// The node.
        name: String,
        /// The earlier choice, if any.
        replaces: Option<String>,
    },
}

/// A control plane as the bootstrap choice sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ForBootstrap {
    /// Failed: not chosen (and a choice that failed before any intent is replaced).
    Failed,
    /// Not ready for Bootstrap (yet).
    NotReady,
    /// Ready for Bootstrap: Ready, or installed, booted from disk with its config, its
    /// secured API answering and its etcd started (see [`bootstrap_readiness`]).
    Ready,
}

impl ForBootstrap {
    /// From the node's phase alone: Ready nodes are, Failed ones never; any other needs a
    /// probe ([`bootstrap_readiness`]).
    pub(crate) fn of_phase(phase: NodePhase) -> Self {
        match phase {
            NodePhase::Ready => Self::Ready,
            NodePhase::Failed => Self::Failed,
            _ => Self::NotReady,
        }
    }
}

/// What a probe of a control plane found, for [`bootstrap_readiness`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BootstrapProbe {
    /// Its machine stage, as `talosctl get machinestatus` names it (`booting`, `running`, ...).
    pub stage: String,
    /// The `etcd` entry of its `ServiceList`: the service's state, if it is listed.
    pub etcd: Option<String>,
}

/// Whether a control plane whose secured API answered can take Bootstrap, the way upstream
/// tools decide it (siderolabs/talos v1.13.9 `pkg/cluster/bootstrap.go`,
/// `APIBootstrapper.Bootstrap`: `Version` answers and `MachineStatus` is in stage `booting` or
/// `running`, then Bootstrap, retried while FailedPrecondition). talboot also wants the etcd
/// service listed, which `startAllServices` loads only in the boot sequence of the system
/// booted from disk (`internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go`):
/// stage `booting` also shows, briefly, between maintenance mode and the install. A control
/// plane of a new cluster never reaches stage `running` before Bootstrap: its etcd waits to
/// join (`internal/app/machined/pkg/system/services/etcd.go`, `buildInitialCluster`), and
/// the boot sequence waits for etcd. `Err` says what is missing.
pub(crate) fn bootstrap_readiness(probe: &BootstrapProbe) -> Result<(), NotReadyForBootstrap> {
    match probe.stage.as_str() {
        "booting" | "running" => {}
        other => {
            return Err(NotReadyForBootstrap::Stage {
                stage: other.to_owned(),
            });
        }
    }
    match &probe.etcd {
        Some(_) => Ok(()),
        None => Err(NotReadyForBootstrap::EtcdNotStarted {
            stage: probe.stage.clone(),
        }),
    }
}

/// Why a control plane whose secured API answered cannot take Bootstrap yet
/// ([`bootstrap_readiness`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotReadyForBootstrap {
    /// Its machine stage is neither `booting` nor `running` (installing, rebooting, ...).
    #[error("machine stage {stage}")]
    Stage {
        /// The stage as `talosctl get machinestatus` names it.
        stage: String,
    },
    /// No etcd service listed: the system booted from disk has not started its services
    /// (the brief stage `booting` between maintenance mode and the install).
    #[error("machine stage {stage}, etcd not started yet (not booted from disk)")]
    EtcdNotStarted {
        /// The stage as `talosctl get machinestatus` names it.
        stage: String,
    },
}

/// Choose the bootstrap node: the persisted one, unless it Failed before any intent; else the
/// first control plane ready for Bootstrap in inventory order (persisted); until one is, the
/// first control plane that did not fail (not persisted). `None`: no control plane at all.
pub(crate) fn choose_bootstrap_node(
    state: &ClusterState,
    control_planes: &[(String, ForBootstrap)],
) -> Option<Choice> {
    let status_of = |n: &str| {
        control_planes
            .iter()
            .find(|(c, _)| c == n)
            .map(|(_, p)| *p)
            .unwrap_or(ForBootstrap::NotReady)
    };
    if let Some(name) = &state.bootstrap_node {
        let intent = !matches!(
            state.bootstrap,
            BootstrapMark::None | BootstrapMark::Rebuilt
        );
        if intent || status_of(name) != ForBootstrap::Failed {
            return Some(Choice::Keep(name.clone()));
        }
    }
    if let Some((ready, _)) = control_planes
        .iter()
        .find(|(_, p)| *p == ForBootstrap::Ready)
    {
        return Some(Choice::Persist {
            name: ready.clone(),
            replaces: state.bootstrap_node.clone(),
        });
    }
    if let Some((f, _)) = control_planes
        .iter()
        .find(|(_, p)| *p != ForBootstrap::Failed)
    {
        return Some(Choice::Keep(f.clone()));
    }
    state
        .bootstrap_node
        .clone()
        .or_else(|| control_planes.first().map(|(n, _)| n.clone()))
        .map(Choice::Keep)
}

/// What the bootstrap part of the cluster machine saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BootstrapObs {
    /// What now? `ready`: the bootstrap node `node` is ready for Bootstrap (see
    /// [`bootstrap_readiness`]) with a known address.
    Poll {
        /// The bootstrap node.
        node: String,
        /// It is Ready.
        ready: bool,
    },
    /// `EtcdMemberList` on the bootstrap node: this many members (0: none or no etcd).
    EtcdMembers(usize),
    /// `Bootstrap` answered, or said it already is.
    Bootstrapped,
    /// `Bootstrap` failed; `retry`: not yet possible, try later.
    BootstrapFailed {
        /// Retry later (FailedPrecondition, transient).
        retry: bool,
        /// Why.
        why: String,
    },
}

/// What the bootstrap part of the cluster machine does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BootstrapEffect {
    /// Wait.
    Wait(String),
    /// Ask etcd on the bootstrap node whether it has members (after the intent is persisted).
    CheckEtcd,
    /// Call Bootstrap on the bootstrap node.
    Bootstrap,
    /// Done (persist).
    Done,
    /// Failed; the call is reported.
    Fail(String),
}

/// One step of the bootstrap: intent before the call, etcd checked before calling, done
/// after; `AlreadyBootstrapped` counts as done.
pub(crate) fn bootstrap_step(
    state: &ClusterState,
    obs: BootstrapObs,
) -> (ClusterState, BootstrapEffect) {
    let mut s = state.clone();
    let effect = match obs {
        _ if s.bootstrap == BootstrapMark::Done => BootstrapEffect::Done,
        BootstrapObs::Poll { node, ready: false } => BootstrapEffect::Wait(format!(
            "bootstrap node {node} is not ready for Bootstrap yet (installed, booted from \
                 disk, etcd started)"
        )),
        BootstrapObs::Poll { ready: true, .. } => {
            s.bootstrap = BootstrapMark::Intent;
            BootstrapEffect::CheckEtcd
        }
        BootstrapObs::EtcdMembers(n) if n > 0 => {
            s.bootstrap = BootstrapMark::Done;
            BootstrapEffect::Done
        }
        BootstrapObs::EtcdMembers(_) if s.bootstrap == BootstrapMark::Intent => {
            BootstrapEffect::Bootstrap
        }
        BootstrapObs::EtcdMembers(_) => BootstrapEffect::Wait("no bootstrap intent".into()),
        BootstrapObs::Bootstrapped => {
            s.bootstrap = BootstrapMark::Done;
            BootstrapEffect::Done
        }
        BootstrapObs::BootstrapFailed { retry: true, why } => BootstrapEffect::Wait(why),
        BootstrapObs::BootstrapFailed { retry: false, why } => BootstrapEffect::Fail(why),
    };
    (s, effect)
}

/// The last voting etcd member was reset: bootstrap, kubeconfig and later steps no longer
/// hold (the bootstrap node stays: it is the node that comes back).
pub(crate) fn forget_bootstrap(state: &ClusterState, node: &str, now: u64) -> ClusterState {
    ClusterState {
        bootstrap_node: state.bootstrap_node.clone(),
        bootstrap: BootstrapMark::Rebuilt,
        kubeconfig_done: false,
        step: Some(StepRecord {
            step: ClusterStep::WaitingForControlPlanes,
            since_unix: now,
            reason: format!("{node}, the last etcd member, was rebuilt; bootstrapping again"),
            last_error: None,
            attempts: 0,
        }),
    }
}
