//! The Talos double's etcd: which etcd cluster each control plane's data directory belongs
//! to (membership, which outlives a reboot), the etcd service of the current boot (which does
//! not), quorum, and the cluster-wide record of when each member stopped and started serving.
//!
//! As siderolabs/talos v1.13.9 runs it:
//! - The boot sequence's `startAllServices` starts etcd on a control plane and waits until
//!   every service is up (running and healthy), etcd included, before the boot sequence ends
//!   (`internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go`,
//!   `StartAllServices`; `internal/app/machined/pkg/system/service_runner.go`,
//!   `inStateLocked(StateEventUp)`), and only the end of the boot sequence sets stage `running`
//!   (`internal/app/machined/pkg/controllers/runtime/machine_status.go`).
//! - With an empty data directory etcd's `PreFunc` loops in `buildInitialCluster` (service
//!   state `Preparing`), logging "etcd is waiting to join the cluster, if this node is the
//!   first node in the cluster, please run `talosctl bootstrap`", until it can add itself to
//!   an existing cluster as a learner (`MemberAddAsLearner`, promoted once it runs)
//!   (`internal/app/machined/pkg/system/services/etcd.go`, `argsForControlPlane`,
//!   `buildInitialCluster`, `addMember`, `promoteMember`). So a control plane of a new
//!   cluster stays in stage `booting` until Bootstrap.
//! - `Bootstrap` refuses a non-empty data directory (AlreadyExists "etcd data directory is not
//!   empty"), else stops the waiting etcd, marks it `Finished` so the boot sequence's wait
//!   ends (upstream calls it a hack), and starts etcd in bootstrap mode: a new cluster
//!   (`v1alpha1_server.go`, `Bootstrap`; `etcd.go`, `BootstrapEtcd`).
//! - After a reboot apid answers first; etcd waits for its conditions, prepares, runs, and is
//!   health-checked only after `InitialDelay` 5 s, every 20 s, with `ValidateQuorum`
//!   (`etcd.go`, `HealthFunc`, `HealthSettings`): it is healthy only while a quorum of the
//!   voting members serves. A member that is down is still listed by `EtcdMemberList`
//!   (etcd's membership), which itself needs a leader (`v1alpha1_server.go`, `EtcdMemberList`:
//!   `clientv3.WithRequireLeader`).
//! - A graceful reset leaves etcd (the member is removed); a wipe of EPHEMERAL empties the
//!   data directory (`/var/lib/etcd`).
//!
//! Not modelled: the 30-minute join timeout and 70-minute boot timeout
//! (`pkg/machinery/constants/constants.go`, `EtcdJoinTimeout`, `BootTimeout`); `init`
//! machine types are treated as `controlplane` (they start etcd in bootstrap mode upstream).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tonic::Status;

use super::{FakeCluster, FakeTalosNode, NodeState, Shared, lock};
use crate::talos::api::machine;

/// How often a waiting etcd service (or the boot sequence waiting for it) looks again.
const POLL: Duration = Duration::from_millis(10);

/// Where the etcd service of a control plane is in this boot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Service {
    /// Not started in this boot (down, installing, or a worker).
    #[default]
    Stopped,
    /// Empty data directory and no cluster to join: `Preparing`, waiting to join.
    WaitingToJoin,
    /// Starting (conditions, prepare, process, the health check's initial delay), since then.
    Starting(Instant),
    /// Running; healthy while a quorum of the voting members serves.
    Started,
}

/// One control plane's etcd.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeEtcd {
    /// The cluster the data directory belongs to; `None`: empty data directory.
    cluster: Option<u64>,
    /// Added as a learner and not promoted yet.
    learner: bool,
    service: Service,
    /// Bootstrap marked the waiting service finished, which ends the boot sequence's wait.
    bootstrap_finished: bool,
    /// This boot (a reboot ends the service task of the previous one).
    boot: u64,
}

/// Cluster ids: every Bootstrap makes a new etcd cluster.
static NEXT_CLUSTER: AtomicU64 = AtomicU64::new(1);

/// A member of an etcd cluster as the double sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Member {
    pub ip: IpAddr,
    pub hostname: String,
    pub learner: bool,
    /// Its etcd process serves (state Running past the health check's initial delay).
    pub serving: bool,
}

/// When an etcd member stopped or started serving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdAvailability {
    pub hostname: String,
    pub ip: IpAddr,
    /// True: stopped serving (its machine went down); false: serving again.
    pub down: bool,
    pub at: Instant,
}

/// The largest number of etcd members not serving at the same moment among `events` at or
/// after `since` (a member down at `since` counts from the start). Two of three means the
/// cluster had no quorum.
pub fn max_etcd_down(events: &[EtcdAvailability], since: Instant) -> usize {
    let mut down = BTreeSet::new();
    let mut max = 0;
    for e in events {
        if e.down {
            down.insert(e.ip);
        } else {
            down.remove(&e.ip);
        }
        if e.at >= since {
            max = max.max(down.len());
        }
    }
    max
}

fn record(shared: &Shared, down: bool) {
    lock(&shared.cluster.inner).etcd_log.push(EtcdAvailability {
        hostname: shared.cfg.hostname.clone(),
        ip: shared.cfg.ip,
        down,
        at: Instant::now(),
    });
}

impl FakeCluster {
    /// Every time an etcd member of this cluster stopped or started serving, in order.
    pub fn etcd_availability(&self) -> Vec<EtcdAvailability> {
        lock(&self.inner).etcd_log.clone()
    }

    /// The members of etcd cluster `id` among the nodes with OS CA `ca`, by address (down
    /// ones included: membership is etcd's, not who runs).
    fn members(&self, ca: &str, id: u64) -> Vec<Member> {
        let mut out = Vec::new();
        for node in self.live_nodes() {
            let same_ca = matches!(&*lock(&node.state),
                NodeState::Installed(inst) if inst.ca_cert_pem == ca);
            if !same_ca {
                continue;
            }
            let e = lock(&node.etcd).clone();
            if e.cluster == Some(id) {
                out.push(Member {
                    ip: node.cfg.public_ip(),
                    hostname: node.cfg.hostname.clone(),
                    learner: e.learner,
                    serving: e.service == Service::Started,
                });
            }
        }
        out.sort();
        out
    }

    /// Every etcd cluster of the nodes with OS CA `ca` (more than one only after a second
    /// Bootstrap split them).
    fn clusters(&self, ca: &str) -> BTreeSet<u64> {
        self.live_nodes()
            .iter()
            .filter(|n| {
                matches!(&*lock(&n.state),
                NodeState::Installed(inst) if inst.ca_cert_pem == ca)
            })
            .filter_map(|n| lock(&n.etcd).cluster)
            .collect()
    }

    /// Whether cluster `id` has a leader: more than half of its voting members serve.
    fn quorum(&self, ca: &str, id: u64) -> bool {
        let members = self.members(ca, id);
        let voting = members.iter().filter(|m| !m.learner).count();
        let serving = members.iter().filter(|m| !m.learner && m.serving).count();
        voting > 0 && serving * 2 > voting
    }

    /// A cluster a waiting member can join (its `MemberAddAsLearner` needs a leader).
    fn joinable(&self, ca: &str) -> Option<u64> {
        self.clusters(ca)
            .into_iter()
            .find(|id| self.quorum(ca, *id))
    }
}

impl FakeTalosNode {
    /// Whether this node's etcd data directory holds a cluster (bootstrapped or joined).
    pub fn etcd_member(&self) -> bool {
        lock(&self.shared.etcd).cluster.is_some()
    }

    /// How many etcd clusters the nodes sharing this node's OS CA hold: 1 once
    /// bootstrapped, 2 after a second Bootstrap on an empty data directory split it.
    pub fn etcd_clusters(&self) -> usize {
        ca_of(&self.shared).map_or(0, |ca| self.shared.cluster.clusters(&ca).len())
    }
}

/// The OS CA of an installed node.
fn ca_of(shared: &Shared) -> Option<String> {
    shared.installed().map(|i| i.ca_cert_pem)
}

/// The current boot, for the boot sequence and the etcd service it starts.
pub(super) fn boot_of(shared: &Shared) -> u64 {
    lock(&shared.etcd).boot
}

/// The machine goes down (reboot, halt): etcd stops with it; the data directory stays.
pub(super) fn on_go_down(shared: &Shared) {
    let was_serving = {
        let mut e = lock(&shared.etcd);
        e.boot += 1;
        e.bootstrap_finished = false;
        std::mem::replace(&mut e.service, Service::Stopped) == Service::Started
    };
    if was_serving {
        record(shared, true);
    }
}

/// A new install formats the disk, and a wipe of EPHEMERAL empties `/var/lib/etcd`.
pub(super) fn wipe(shared: &Shared) {
    let mut e = lock(&shared.etcd);
    e.cluster = None;
    e.learner = false;
}

/// A graceful reset's `leave`: the member is removed from its cluster (`LeaveCluster`).
pub(super) fn leave(shared: &Shared) {
    wipe(shared);
}

/// Whether this node is the only voting member of its cluster.
pub(super) fn is_last_voter(shared: &Shared) -> bool {
    let (Some(ca), Some(id)) = (ca_of(shared), lock(&shared.etcd).cluster) else {
        return false;
    };
    shared
        .cluster
        .members(&ca, id)
        .iter()
        .filter(|m| !m.learner)
        .count()
        == 1
}

/// Whether the node's etcd is healthy (`ValidateQuorum` passes).
fn healthy(shared: &Shared) -> bool {
    let (service, cluster) = {
        let e = lock(&shared.etcd);
        (e.service, e.cluster)
    };
    match (service, cluster, ca_of(shared)) {
        (Service::Started, Some(id), Some(ca)) => shared.cluster.quorum(&ca, id),
        _ => false,
    }
}

/// The etcd service of one boot of a control plane, started by the boot sequence's
/// `startAllServices`: join or wait with an empty data directory, then start.
pub(super) async fn service(shared: Arc<Shared>, boot: u64) {
    let mut stopped = shared.stopped.clone();
    loop {
        let Some(ca) = ca_of(&shared) else { return };
        {
            let e = lock(&shared.etcd);
            if e.boot != boot {
                return;
            }
            if e.cluster.is_some() {
                break;
            }
        }
        let join = shared.cluster.joinable(&ca);
        {
            let mut e = lock(&shared.etcd);
            if e.boot != boot {
                return;
            }
            match join {
                // Bootstrap may have filled the data directory meanwhile: that wins.
                Some(id) if e.cluster.is_none() => {
                    e.cluster = Some(id);
                    e.learner = true;
                }
                Some(_) => {}
                None => {
                    if e.service != Service::WaitingToJoin {
                        e.service = Service::WaitingToJoin;
                        tracing::debug!(node = %shared.cfg.hostname, "etcd is waiting to join the cluster");
                    }
                }
            }
            if e.cluster.is_some() {
                break;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
    {
        let mut e = lock(&shared.etcd);
        if e.boot != boot {
            return;
        }
        e.service = Service::Starting(Instant::now());
    }
    if !shared.pause(shared.cfg.timing.etcd_start).await {
        return;
    }
    {
        let mut e = lock(&shared.etcd);
        if e.boot != boot {
            return;
        }
        e.service = Service::Started;
        // `promoteMember`: a learner is promoted once it runs.
        e.learner = false;
    }
    record(&shared, false);
}

/// `startAllServices`' wait for etcd: running and healthy, or finished by Bootstrap. False
/// when the machine rebooted or stopped meanwhile.
pub(super) async fn wait_up(shared: &Shared, boot: u64) -> bool {
    let mut stopped = shared.stopped.clone();
    loop {
        {
            let e = lock(&shared.etcd);
            if e.boot != boot {
                return false;
            }
            if e.bootstrap_finished {
                return true;
            }
        }
        if healthy(shared) {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            _ = stopped.wait_for(|s| *s) => return false,
        }
    }
}

/// `Bootstrap` after its preconditions (CRI up, control plane, time in sync): refuses a
/// non-empty data directory, else creates a new cluster on this node.
pub(super) fn bootstrap(shared: &Shared) -> Result<(), Status> {
    let mut e = lock(&shared.etcd);
    if e.cluster.is_some() {
        return Err(Status::already_exists("etcd data directory is not empty"));
    }
    e.cluster = Some(NEXT_CLUSTER.fetch_add(1, Ordering::Relaxed));
    e.learner = false;
    e.bootstrap_finished = true;
    Ok(())
}

/// `EtcdMemberList` on a control plane booted from disk: the members of its cluster (or of
/// the cluster it would join), down ones included, once etcd has a leader.
pub(super) fn member_list(shared: &Shared) -> Result<Vec<Member>, Status> {
    let no_endpoints = || Status::unknown("no controlplane endpoints discovered yet");
    let ca = ca_of(shared).ok_or_else(no_endpoints)?;
    let own = lock(&shared.etcd).cluster;
    let id = own
        .or_else(|| shared.cluster.clusters(&ca).into_iter().next())
        .ok_or_else(no_endpoints)?;
    if !shared.cluster.quorum(&ca, id) {
        // The request runs with `WithRequireLeader`; etcd answers rpctypes.ErrNoLeader.
        return Err(Status::unavailable("etcdserver: no leader"));
    }
    Ok(shared.cluster.members(&ca, id))
}

/// The `etcd` entry of `ServiceList` on a control plane booted from disk, as
/// `ServiceRunner.AsProto` reports it: state, the last event, health (unknown until the first
/// check after the initial delay).
pub(super) fn service_info(shared: &Shared) -> machine::ServiceInfo {
    let service = lock(&shared.etcd).service;
    let (state, msg, health) = match service {
        Service::Stopped => ("Waiting", "Waiting for service \"cri\" to be \"up\"", None),
        Service::WaitingToJoin => ("Preparing", "Running pre state", None),
        Service::Starting(since) if since.elapsed() < shared.cfg.timing.etcd_start / 2 => {
            ("Preparing", "Running pre state", None)
        }
        Service::Starting(_) => (
            "Running",
            "Started task etcd (PID 2417) for container etcd",
            None,
        ),
        Service::Started if healthy(shared) => {
            ("Running", "Health check successful", Some((true, "")))
        }
        Service::Started => (
            "Running",
            "Health check failed: context deadline exceeded",
            Some((false, "context deadline exceeded")),
        ),
    };
    machine::ServiceInfo {
        id: "etcd".into(),
        state: state.into(),
        events: Some(machine::ServiceEvents {
            events: vec![machine::ServiceEvent {
                msg: msg.into(),
                state: state.into(),
                ts: None,
            }],
        }),
        health: Some(machine::ServiceHealth {
            unknown: health.is_none(),
            healthy: health.is_some_and(|(h, _)| h),
            last_message: health.map(|(_, m)| m.to_owned()).unwrap_or_default(),
            last_change: None,
        }),
    }
}

/// MachineStatus' `services` readiness check for etcd (`machine_status.go`,
/// `servicesCheck`): the `Service` resource exists only while the service runs
/// (`internal/app/machined/pkg/controllers/v1alpha1/service.go`); a running service with
/// unknown health passes, one known unhealthy does not.
pub(super) fn readiness_problem(shared: &Shared) -> Option<&'static str> {
    match lock(&shared.etcd).service {
        Service::Stopped | Service::WaitingToJoin => return Some("etcd not running"),
        Service::Starting(since) if since.elapsed() < shared.cfg.timing.etcd_start / 2 => {
            return Some("etcd not running");
        }
        Service::Starting(_) => return None,
        Service::Started => {}
    }
    (!healthy(shared)).then_some("etcd not healthy")
}
