//! The one etcd health gate of day two: what must hold before a rollout starts, and after a
//! control plane's change before the next control plane may be taken down. `talboot apply`
//! (every mode, reboot included) and `talboot upgrade --talos` both use it, so at most one
//! etcd member is ever down.
//!
//! etcd's membership is not its health: `EtcdMemberList` keeps listing a member that is
//! down, and after a reboot apid answers seconds before etcd serves (siderolabs/talos
//! v1.13.9 `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`,
//! `EtcdMemberList`; `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go`,
//! `v1alpha1_sequencer_tasks.go`). So the gate reads etcd the way talosctl's cluster health
//! checks do (`pkg/cluster/check/default.go`, `PreBootSequenceChecks`):
//! - "etcd to be healthy": on every control plane, `ServiceList`'s `etcd` entry: its last
//!   event in state `Running` and its health `healthy` (unknown health is not healthy)
//!   (`pkg/cluster/check/service.go`, `ServiceHealthAssertion`);
//! - "etcd members to be consistent across nodes": `EtcdMemberList` through every control
//!   plane lists the same members (hostname, id, learner) (`pkg/cluster/check/etcd.go`,
//!   `EtcdConsistentAssertion`);
//! - "etcd members to be control plane nodes" (`EtcdControlPlaneNodesAssertion`): here,
//!   exactly the inventory's control planes, by hostname, and none still a learner;
//!
//! and, on the control plane that was just changed, COSI `MachineStatus` in stage `running`
//! with `status.ready`, which on a control plane needs the etcd service running and not
//! unhealthy (`internal/app/machined/pkg/controllers/runtime/machine_status.go`,
//! `servicesCheck`); stage `running` alone is not enough.
//!
//! The decisions ([`etcd_healthy`], [`node_ready`]) are pure; [`read_control_plane`] and
//! [`read_status`] are the reads, [`check`] puts them together.

use std::collections::BTreeSet;

use crate::talos::api::machine;
use crate::talos::api::talos::resource::definitions::runtime::{
    MachineStatusSpec, RuntimeMachineStage,
};
use crate::talos::{TalosClient, TalosError};

/// The `etcd` entry of a node's `ServiceList`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EtcdService {
    /// The state of its last event (the service's state when there are no events).
    pub state: String,
    /// Its last event's message.
    pub message: String,
    /// Health `healthy` (false when unknown).
    pub healthy: bool,
}

impl EtcdService {
    /// As talosctl's `ServiceHealthAssertion` reads a `ServiceInfo`.
    pub(crate) fn from_info(info: &machine::ServiceInfo) -> Self {
        let last = info.events.as_ref().and_then(|e| e.events.last());
        Self {
            state: last.map_or_else(|| info.state.clone(), |e| e.state.clone()),
            message: last.map(|e| e.msg.clone()).unwrap_or_default(),
            healthy: info.health.as_ref().is_some_and(|h| h.healthy),
        }
    }
}

/// One etcd member as `EtcdMemberList` reports it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Member {
    pub hostname: String,
    pub id: u64,
    pub learner: bool,
}

/// What one control plane told the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControlPlaneReport {
    pub node: String,
    /// Its `etcd` service (`None`: not listed), or why `ServiceList` failed.
    pub etcd: Result<Option<EtcdService>, String>,
    /// `EtcdMemberList` through it, or why it failed.
    pub members: Result<Vec<Member>, String>,
}

/// The changed node's `MachineStatus`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub running: bool,
    /// The stage as Talos names it, for the message.
    pub stage: String,
    pub ready: bool,
    /// `name: reason` of every unmet condition.
    pub unmet: Vec<String>,
}

impl NodeStatus {
    pub(crate) fn from_spec(spec: &MachineStatusSpec) -> Self {
        let stage = spec.stage();
        let status = spec.status.as_ref();
        Self {
            running: stage == RuntimeMachineStage::MachineStageRunning,
            stage: stage
                .as_str_name()
                .trim_start_matches("MACHINE_STAGE_")
                .to_lowercase()
                .replace('_', " "),
            ready: status.is_some_and(|s| s.ready),
            unmet: status
                .map(|s| {
                    s.unmet_conditions
                        .iter()
                        .map(|c| format!("{}: {}", c.name, c.reason))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// Why the gate does not pass (yet). Each says which node and what it reported.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("no control plane to read etcd from")]
    NoControlPlane,
    #[error("{node}: cannot read its etcd service: {reason}")]
    ServiceUnreadable { node: String, reason: String },
    #[error("{node}: etcd is not running (service state {state}: {message})")]
    EtcdNotRunning {
        node: String,
        state: String,
        message: String,
    },
    #[error("{node}: etcd is running but not healthy ({message})")]
    EtcdUnhealthy { node: String, message: String },
    #[error("{node}: etcd member list: {reason}")]
    MembersUnreadable { node: String, reason: String },
    #[error("{node}: etcd lists members {got:?}, {first} lists {want:?}")]
    Inconsistent {
        node: String,
        first: String,
        got: Vec<String>,
        want: Vec<String>,
    },
    #[error("etcd does not list control plane {0} as a member")]
    NotAMember(String),
    #[error("etcd member {0} is not one of the inventory's control planes")]
    Stranger(String),
    #[error("etcd member {0} is still a learner (joining)")]
    Learner(String),
    #[error("{node}: machine stage {stage}, not running")]
    NotRunning { node: String, stage: String },
    #[error("{node}: machine status not ready ({unmet})")]
    NotReady { node: String, unmet: String },
    #[error("{node}: cannot read its machine status: {reason}")]
    StatusUnreadable { node: String, reason: String },
}

/// talosctl's etcd checks over `reports`, one per inventory control plane (all of them):
/// every etcd service running and healthy, every member list the same, the members exactly
/// the control planes, none a learner. The first failure, in that order.
pub(crate) fn etcd_healthy(reports: &[ControlPlaneReport]) -> Result<(), GateError> {
    if reports.is_empty() {
        return Err(GateError::NoControlPlane);
    }
    for r in reports {
        let node = r.node.clone();
        match &r.etcd {
            Err(reason) => {
                return Err(GateError::ServiceUnreadable {
                    node,
                    reason: reason.clone(),
                });
            }
            Ok(None) => {
                return Err(GateError::EtcdNotRunning {
                    node,
                    state: "not listed".into(),
                    message: "no etcd service on this node".into(),
                });
            }
            Ok(Some(s)) if s.state != "Running" => {
                return Err(GateError::EtcdNotRunning {
                    node,
                    state: s.state.clone(),
                    message: s.message.clone(),
                });
            }
            Ok(Some(s)) if !s.healthy => {
                return Err(GateError::EtcdUnhealthy {
                    node,
                    message: s.message.clone(),
                });
            }
            Ok(Some(_)) => {}
        }
    }
    let mut first: Option<(&str, BTreeSet<&Member>)> = None;
    for r in reports {
        let members = r
            .members
            .as_ref()
            .map_err(|reason| GateError::MembersUnreadable {
                node: r.node.clone(),
                reason: reason.clone(),
            })?;
        let set: BTreeSet<&Member> = members.iter().collect();
        match &first {
            None => first = Some((&r.node, set)),
            Some((name, want)) if *want != set => {
                let names = |s: &BTreeSet<&Member>| s.iter().map(|m| m.hostname.clone()).collect();
                return Err(GateError::Inconsistent {
                    node: r.node.clone(),
                    first: (*name).to_owned(),
                    got: names(&set),
                    want: names(want),
                });
            }
            Some(_) => {}
        }
    }
    let members = first.map(|(_, s)| s).unwrap_or_default();
    let control_planes: BTreeSet<&str> = reports.iter().map(|r| r.node.as_str()).collect();
    for cp in &control_planes {
        if !members.iter().any(|m| m.hostname == *cp) {
            return Err(GateError::NotAMember((*cp).to_owned()));
        }
    }
    for m in &members {
        if !control_planes.contains(m.hostname.as_str()) {
            return Err(GateError::Stranger(m.hostname.clone()));
        }
        if m.learner {
            return Err(GateError::Learner(m.hostname.clone()));
        }
    }
    Ok(())
}

/// The changed node is back: stage `running` and `ready`.
pub(crate) fn node_ready(node: &str, status: &NodeStatus) -> Result<(), GateError> {
    if !status.running {
        return Err(GateError::NotRunning {
            node: node.to_owned(),
            stage: status.stage.clone(),
        });
    }
    if !status.ready {
        return Err(GateError::NotReady {
            node: node.to_owned(),
            unmet: status.unmet.join("; "),
        });
    }
    Ok(())
}

/// Reads one control plane: its etcd service and the member list through it.
pub(crate) async fn read_control_plane(node: &str, client: &TalosClient) -> ControlPlaneReport {
    let etcd = client
        .service_list()
        .await
        .map(|list| {
            list.iter()
                .find(|s| s.id == "etcd")
                .map(EtcdService::from_info)
        })
        .map_err(|e| e.to_string());
    let members = client
        .etcd_member_list()
        .await
        .map(|list| {
            list.into_iter()
                .map(|m| Member {
                    hostname: m.hostname,
                    id: m.id,
                    learner: m.is_learner,
                })
                .collect()
        })
        .map_err(|e| e.to_string());
    ControlPlaneReport {
        node: node.to_owned(),
        etcd,
        members,
    }
}

/// Reads a node's `MachineStatus`.
pub(crate) async fn read_status(node: &str, client: &TalosClient) -> Result<NodeStatus, GateError> {
    client
        .machine_status()
        .await
        .map(|s| NodeStatus::from_spec(&s))
        .map_err(|e| GateError::StatusUnreadable {
            node: node.to_owned(),
            reason: e.to_string(),
        })
}

/// The gate: `changed` (a control plane just changed, with a client to it) running and
/// ready, then etcd healthy across `control_planes` (every inventory control plane, each
/// with a client or why none could be had).
pub async fn check(
    changed: Option<(&str, &TalosClient)>,
    control_planes: &[(String, Result<TalosClient, TalosError>)],
) -> Result<(), GateError> {
    if let Some((node, client)) = changed {
        node_ready(node, &read_status(node, client).await?)?;
    }
    let mut reports = Vec::with_capacity(control_planes.len());
    for (node, client) in control_planes {
        reports.push(match client {
            Ok(c) => read_control_plane(node, c).await,
            Err(reason) => ControlPlaneReport {
                node: node.clone(),
                etcd: Err(reason.to_string()),
                members: Err(reason.to_string()),
            },
        });
    }
    etcd_healthy(&reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(h: &str, id: u64) -> Member {
        Member {
            hostname: h.into(),
            id,
            learner: false,
        }
    }

    fn healthy_service() -> Option<EtcdService> {
        Some(EtcdService {
            state: "Running".into(),
            message: "Health check successful".into(),
            healthy: true,
        })
    }

    fn report(node: &str) -> ControlPlaneReport {
        ControlPlaneReport {
            node: node.into(),
            etcd: Ok(healthy_service()),
            members: Ok(vec![member("cp1", 1), member("cp2", 2), member("cp3", 3)]),
        }
    }

    fn three() -> Vec<ControlPlaneReport> {
        vec![report("cp1"), report("cp2"), report("cp3")]
    }

    #[test]
    fn a_healthy_cluster_passes() {
        assert_eq!(etcd_healthy(&three()), Ok(()));
    }

    /// The defect of issue 24 item 2: the member list is complete while cp1's etcd is down
    /// (apid answered first); the old gate passed on that.
    #[test]
    fn a_listed_member_whose_etcd_is_not_serving_fails() {
        let mut r = three();
        r[0].etcd = Ok(Some(EtcdService {
            state: "Preparing".into(),
            message: "Running pre state".into(),
            healthy: false,
        }));
        assert!(matches!(
            etcd_healthy(&r),
            Err(GateError::EtcdNotRunning { node, state, .. }) if node == "cp1" && state == "Preparing"
        ));
        // Running, health not checked yet (unknown): not healthy for talosctl either.
        r[0].etcd = Ok(Some(EtcdService {
            state: "Running".into(),
            message: "Started task etcd".into(),
            healthy: false,
        }));
        assert!(matches!(
            etcd_healthy(&r),
            Err(GateError::EtcdUnhealthy { node, .. }) if node == "cp1"
        ));
        r[0].etcd = Err("connection refused".into());
        assert!(matches!(
            etcd_healthy(&r),
            Err(GateError::ServiceUnreadable { .. })
        ));
    }

    #[test]
    fn the_last_event_state_is_what_counts() {
        let info = machine::ServiceInfo {
            id: "etcd".into(),
            state: "Running".into(),
            events: Some(machine::ServiceEvents {
                events: vec![
                    machine::ServiceEvent {
                        msg: "Running pre state".into(),
                        state: "Preparing".into(),
                        ts: None,
                    },
                    machine::ServiceEvent {
                        msg: "Health check successful".into(),
                        state: "Running".into(),
                        ts: None,
                    },
                ],
            }),
            health: Some(machine::ServiceHealth {
                unknown: false,
                healthy: true,
                last_message: String::new(),
                last_change: None,
            }),
        };
        let s = EtcdService::from_info(&info);
        assert_eq!((s.state.as_str(), s.healthy), ("Running", true));
        let unknown = machine::ServiceInfo {
            health: Some(machine::ServiceHealth {
                unknown: true,
                healthy: false,
                last_message: String::new(),
                last_change: None,
            }),
            events: None,
            ..info
        };
        assert!(!EtcdService::from_info(&unknown).healthy);
    }

    #[test]
    fn membership_must_agree_and_be_the_control_planes() {
        let mut r = three();
        r[2].members = Ok(vec![member("cp1", 1), member("cp2", 2)]);
        assert!(matches!(
            etcd_healthy(&r),
            Err(GateError::Inconsistent { node, .. }) if node == "cp3"
        ));
        let two = |r: &mut Vec<ControlPlaneReport>| {
            for x in r.iter_mut() {
                x.members = Ok(vec![member("cp1", 1), member("cp2", 2)]);
            }
        };
        let mut r = three();
        two(&mut r);
        assert_eq!(etcd_healthy(&r), Err(GateError::NotAMember("cp3".into())));
        let mut r = three();
        for x in r.iter_mut() {
            x.members = Ok(vec![
                member("cp1", 1),
                member("cp2", 2),
                member("cp3", 3),
                member("old", 9),
            ]);
        }
        assert_eq!(etcd_healthy(&r), Err(GateError::Stranger("old".into())));
        let mut r = three();
        for x in r.iter_mut() {
            let mut m = vec![member("cp1", 1), member("cp2", 2), member("cp3", 3)];
            m[2].learner = true;
            x.members = Ok(m);
        }
        assert_eq!(etcd_healthy(&r), Err(GateError::Learner("cp3".into())));
        let mut r = three();
        r[1].members = Err("etcdserver: no leader".into());
        assert!(matches!(
            etcd_healthy(&r),
            Err(GateError::MembersUnreadable { node, .. }) if node == "cp2"
        ));
        assert_eq!(etcd_healthy(&[]), Err(GateError::NoControlPlane));
    }

    #[test]
    fn the_changed_node_needs_stage_running_and_ready() {
        let spec = |stage: RuntimeMachineStage, ready: bool| MachineStatusSpec {
            stage: stage as i32,
            status: Some(
                crate::talos::api::talos::resource::definitions::runtime::MachineStatusStatus {
                    ready,
                    unmet_conditions: if ready {
                        vec![]
                    } else {
                        vec![
                            crate::talos::api::talos::resource::definitions::runtime::UnmetCondition {
                                name: "services".into(),
                                reason: "etcd not running".into(),
                            },
                        ]
                    },
                },
            ),
        };
        let s = NodeStatus::from_spec(&spec(RuntimeMachineStage::MachineStageRunning, true));
        assert_eq!(node_ready("cp1", &s), Ok(()));
        // Stage running alone is not enough.
        let s = NodeStatus::from_spec(&spec(RuntimeMachineStage::MachineStageRunning, false));
        assert_eq!(
            node_ready("cp1", &s),
            Err(GateError::NotReady {
                node: "cp1".into(),
                unmet: "services: etcd not running".into()
            })
        );
        let s = NodeStatus::from_spec(&spec(RuntimeMachineStage::MachineStageBooting, false));
        assert_eq!(
            node_ready("cp1", &s),
            Err(GateError::NotRunning {
                node: "cp1".into(),
                stage: "booting".into()
            })
        );
    }
}
