//! The cluster step record: which cluster step (API ready, CNI, nodes Ready, Argo CD,
//! handed off) was last completed, persisted as JSON in the cluster progress table, and the
//! timeline its transitions are announced on.
//!
//! `provision::steps` decides and performs the steps and writes this record; `talboot up`,
//! the demo and the dashboard read it, so the record, its encoding and its loading live here.

use serde::{Deserialize, Serialize};

/// Row (in the store's cluster progress table) of the cluster step record (JSON).
pub const STEP_KEY: &str = "step";
/// Event timeline (node key) of the cluster steps.
pub const CLUSTER_TIMELINE: &str = "cluster";

/// The cluster steps, in order. The record holds the last one completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterStep {
    /// Nothing done yet: waiting for the control planes to be configured.
    WaitingForControlPlanes,
    /// Bootstrapped, healthy, kubeconfig written.
    Bootstrapped,
    /// The Kubernetes API answers with the admin kubeconfig.
    ApiReady,
    /// The CNI is installed (or not talboot's to install).
    CniInstalled,
    /// Every node is Ready.
    NodesReady,
    /// Argo CD is installed (or not enabled).
    ArgoCdInstalled,
    /// Done: the cluster is the operator's (and Argo CD's).
    HandedOff,
}

impl std::fmt::Display for ClusterStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::WaitingForControlPlanes => "waiting-for-control-planes",
            Self::Bootstrapped => "bootstrapped",
            Self::ApiReady => "api-ready",
            Self::CniInstalled => "cni-installed",
            Self::NodesReady => "nodes-ready",
            Self::ArgoCdInstalled => "argocd-installed",
            Self::HandedOff => "handed-off",
        })
    }
}

/// The persisted cluster step record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The last step completed.
    pub step: ClusterStep,
    /// When it was completed (Unix seconds).
    pub since_unix: u64,
    /// Why it counts as completed.
    pub reason: String,
    /// The last failure of the next step, if any.
    pub last_error: Option<String>,
    /// Failed attempts of the next step since `step` was reached.
    pub attempts: u32,
}

/// The persisted step record in `store`, if any (one this version cannot read counts as
/// absent: every step re-checks its own facts).
pub(crate) fn load_step_record(
    store: &dyn crate::store::Store,
) -> Result<Option<StepRecord>, crate::store::StoreError> {
    Ok(store
        .row(crate::store::ClusterTable::Progress, STEP_KEY)?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store an older build wrote has the step record under `cluster_meta`'s
    /// `cluster/step` only: it is still the cluster's progress.
    #[test]
    fn a_step_record_left_in_cluster_meta_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(dir.path()).unwrap();
        let rec = StepRecord {
            step: ClusterStep::HandedOff,
            since_unix: 7,
            reason: "old build".into(),
            last_error: None,
            attempts: 0,
        };
        crate::store::Backend::put_meta(&store, "cluster/step", &serde_json::to_vec(&rec).unwrap())
            .unwrap();
        assert_eq!(load_step_record(&store).unwrap(), Some(rec));
    }
}
