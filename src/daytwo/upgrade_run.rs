//! Running a rolling upgrade, for every front end that starts one (`talboot upgrade`, serve's
//! rollout jobs, `talboot demo`): the Talos upgrade driven to its end with its record in the
//! store ([`upgrade`]), its progress as operator lines ([`progress_line`]), the boot sets of
//! the new version made ready before it starts ([`ensure_boot_sets`]), and the requests serve
//! runs for `talboot upgrade --talos` and `--kubernetes` ([`talos_request`],
//! [`K8sUpgradeSettings::request`]). The caller parses its flags and prints; nothing here
//! does either.

use std::sync::Arc;
use std::time::Duration;

use crate::artifacts::{self, ArtifactError, Catalog, factory};
use crate::inventory::{Inventory, Version};
use crate::store::RolloutWriter;

use super::remote::{K8sUpgradeRequest, RolloutKind, RolloutRequest, TalosUpgradeRequest};
use super::rollout::{Event, Gate};
use super::run::{NodeOps, Outcome, Persisted, Progress, RunError};
use super::upgrade::{TalosUpgrade, rollout_key};
use super::upgrade_k8s::K8sOptions;

/// Runs (or resumes) the rollout of `plan`, its record in the store, each progress line to
/// `say`.
pub(crate) async fn upgrade(
    plan: &TalosUpgrade,
    ops: Arc<dyn NodeOps>,
    store: &RolloutWriter,
    worker_concurrency: usize,
    say: &(dyn Fn(String) + Send + Sync),
) -> Result<Outcome, RunError> {
    let rollout = Persisted::new(store, rollout_key(&plan.version));
    let (engine, resumed) =
        rollout.resume_or_start(|stored| plan.rollout(stored, worker_concurrency))?;
    if resumed {
        say(format!("resuming {} from the store", rollout.key()));
    }
    rollout
        .drive(engine, ops, |p| say(progress_line(&plan.version, p)))
        .await
}

/// One progress line of a Talos upgrade, for the operator.
pub(crate) fn progress_line(version: &Version, p: &Progress) -> String {
    match p {
        Progress::Checking(Gate::Cluster) => "checking the cluster before upgrading".into(),
        Progress::Checking(Gate::Node(n)) => {
            format!("{n}: waiting until it is back on {version} and healthy")
        }
        Progress::Changing(n) => format!("{n}: upgrading to {version}"),
        Progress::Reconciling(n) => {
            format!("{n}: an earlier run started its upgrade; checking whether it took effect")
        }
        Progress::Observed(Event::Healthy(Gate::Node(n))) => format!("{n}: done"),
        Progress::Observed(Event::Healthy(Gate::Cluster)) => "cluster healthy".into(),
        Progress::Observed(Event::Changed { node }) => {
            format!("{node}: installed; rebooting into it")
        }
        Progress::Observed(Event::NotChanged { node }) => {
            format!("{node}: not upgraded yet; upgrading now")
        }
        Progress::Observed(Event::ChangeFailed { node, reason }) => {
            format!("{node}: FAILED: {reason}")
        }
        Progress::Observed(Event::Unhealthy { gate, reason }) => match gate {
            Gate::Node(n) => format!("{n}: FAILED: {reason}"),
            Gate::Cluster => format!("cluster not healthy: {reason}"),
        },
    }
}

/// Every boot set of `version` the inventory's nodes need, holding what they boot (the PXE
/// files, or for `secureBoot` nodes the signed UKI: [`artifacts::requirements`]): verified,
/// or pulled from the inventory's Image Factory and then verified; each pull is announced
/// through `say`.
pub(crate) async fn ensure_boot_sets(
    inv: &Inventory,
    version: &Version,
    dir: &std::path::Path,
    say: impl Fn(String),
) -> Result<(), ArtifactError> {
    let mut at_version = inv.clone();
    at_version.cluster.talos_version.value = version.clone();
    let mut catalog = Catalog::load(dir)?;
    for need in artifacts::requirements(&at_version) {
        let (id, boots) = (need.id, need.boots);
        match artifacts::verify_for(dir, &catalog, &id, boots.iter().copied()) {
            Ok(()) => continue,
            Err(ArtifactError::Missing { .. } | ArtifactError::Incomplete { .. }) => {}
            Err(e) => return Err(e),
        }
        say(format!(
            "pulling {id} from {}",
            inv.cluster.installer.factory_url.as_str()
        ));
        let req = factory::PullRequest {
            base_url: inv.cluster.installer.factory_url.clone(),
            id: id.clone(),
            dir: dir.to_path_buf(),
            progress: false,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let boots: Vec<artifacts::Boot> = boots.into_iter().collect();
        // The pull records the set in the catalog file itself.
        factory::pull_boots(&factory::client()?, &req, &boots, now).await?;
        catalog = Catalog::load(dir)?;
        artifacts::verify_for(dir, &catalog, &id, boots)?;
    }
    Ok(())
}

/// The request serve runs for `talboot upgrade --talos`.
pub(crate) fn talos_request(
    version: &Version,
    stage: bool,
    worker_concurrency: usize,
    node_timeout: u64,
) -> RolloutRequest {
    RolloutRequest {
        worker_concurrency,
        kind: RolloutKind::UpgradeTalos(TalosUpgradeRequest {
            version: version.to_string(),
            stage,
            node_timeout_secs: node_timeout,
            gate_poll_ms: 2000,
        }),
    }
}

/// What the operator chose for a Kubernetes upgrade (`talboot upgrade --kubernetes`'s
/// flags), from which both the standalone run's [`K8sOptions`] and serve's request are made,
/// so the two wait alike.
#[derive(Debug, Clone, Copy)]
pub(crate) struct K8sUpgradeSettings {
    /// apid's port on every node.
    pub apid_port: u16,
    /// How long a node may take, in seconds (caps talosctl's waits).
    pub node_timeout: u64,
    /// How often a step's gate looks again, in milliseconds.
    pub gate_poll_ms: u64,
    /// Keep bootstrap manifest objects Talos no longer renders.
    pub no_prune: bool,
    /// Do not wait for the bootstrap manifests' workloads.
    pub skip_manifest_wait: bool,
}

impl K8sUpgradeSettings {
    /// The options of a standalone run.
    pub(crate) fn options(&self) -> K8sOptions {
        K8sOptions {
            apid_port: self.apid_port,
            pod_wait: self.pod_wait(),
            node_wait: self.node_wait(),
            poll: Duration::from_millis(self.gate_poll_ms.max(10)),
            no_prune: self.no_prune,
            // talosctl's 5 minutes (`--manifests-reconcile-timeout`), shorter with --node-timeout.
            manifest_wait: (!self.skip_manifest_wait).then(|| self.pod_wait()),
        }
    }

    /// talosctl's waits (5 min for a static pod, 3 for a kubelet), shorter with `--node-timeout`.
    fn pod_wait(&self) -> Duration {
        Duration::from_secs(self.node_timeout.min(300))
    }

    fn node_wait(&self) -> Duration {
        Duration::from_secs(self.node_timeout.min(180))
    }

    /// The request serve runs for `talboot upgrade --kubernetes`.
    pub(crate) fn request(&self, to: &Version, worker_concurrency: usize) -> RolloutRequest {
        RolloutRequest {
            worker_concurrency: worker_concurrency.max(1),
            kind: RolloutKind::UpgradeKubernetes(K8sUpgradeRequest {
                version: to.to_string(),
                pod_wait_secs: self.pod_wait().as_secs(),
                node_wait_secs: self.node_wait().as_secs(),
                gate_poll_ms: self.gate_poll_ms,
                no_prune: self.no_prune,
                skip_manifest_wait: self.skip_manifest_wait,
            }),
        }
    }
}
