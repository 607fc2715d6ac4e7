//! `talboot upgrade --kubernetes`: the steps of a Kubernetes upgrade, in the order talosctl
//! takes them, what is checked between them, and carrying them out through the rolling
//! engine [`super::rollout`] (health-gated, stop at the first failure, resumable from the
//! store). Owns the step plan, the machine-config patch of each step, and the Kubernetes side
//! of each step's gate.
//!
//! From siderolabs/talos v1.13.9 `pkg/cluster/kubernetes/talos_managed.go` (`Upgrade`, called
//! by `cmd/talosctl/cmd/talos/upgrade-k8s.go`): the upgrade path must be supported
//! (`upgrade.Path.IsSupported` of siderolabs/go-kubernetes: the same minor or the next one),
//! then the pre-upgrade checks; for each of kube-apiserver, kube-controller-manager,
//! kube-scheduler in that order, every control plane node one after the other
//! (`upgradeStaticPod`): patch the node's machine config with the new image
//! (`patch.go`, `patchNodeConfig`: read the running `MachineConfig`, patch, ApplyConfiguration
//! mode NO_REBOOT; a node already on the image is skipped, `errUpdateSkipped`), then wait until
//! the static pod (label `k8s-app=<component>`, `status.hostIP` the node) runs the new config
//! and is Ready (`checkPodStatus`, at most 5 minutes); then kube-proxy's image is patched into
//! every control plane's config (`upgradeKubeProxy`, no wait); then the kubelet of every
//! control plane, then of every worker, one after the other (`kubelet.go`, `upgradeKubelet`:
//! patch `machine.kubelet.image`, wait for the kubelet to restart, then until the Node
//! reports the new `kubeletVersion` and is Ready, at most 3 minutes); last, the bootstrap
//! manifests are synced (`PerformManifestsSync`).
//!
//! Each step is one target of the rolling engine, all in the one-at-a-time lane, so the
//! order above is kept and a failed step stops everything after it. Where talboot differs:
//! the static-pod gate compares the pod's image (talosctl compares the
//! `talos.dev/config-version` annotation with the component's COSI config resource version,
//! which talboot does not read); the kubelet gate finds the Node by name (talosctl by
//! address); the pre-upgrade checks are "every node's Talos API answers, its Talos runs the
//! target (`compat.go`, `VerifyVersionCompatibility`) and every Node is Ready" (talosctl also
//! checks for removed APIs in use); images are not pre-pulled. The last step, the bootstrap
//! manifest sync, is [`super::manifest_sync`] (read from the first control plane, applied as
//! `talos` with go-kubernetes' inventory and prune, then the set's workloads waited for).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::store::RolloutWriter;
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::{ClientCreds, TalosClient, TalosError};

use super::k8s_version::{VersionError, path_supported, supported_with};
use super::rollout::{Event, Gate, Role, Rollout, RolloutError, RolloutRecord, Target};
use super::run::{NodeOps, Outcome, Persisted, Progress, RunError};
use crate::inventory::{Inventory, MachineType, Version};

/// One step of a Kubernetes upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum K8sStep {
    /// Patch a control-plane static pod's image on one node, then wait for the pod.
    StaticPod {
        component: &'static str,
        node: String,
    },
    /// Patch kube-proxy's image into one control plane's config (no wait).
    KubeProxy { node: String },
    /// Patch the kubelet image on one node, then wait until the Node reports its version.
    Kubelet { node: String },
    /// Sync the bootstrap manifests Talos renders to the cluster (apply, prune, wait).
    Manifests,
}

/// The static pods, in the order talosctl upgrades them.
pub(crate) const STATIC_PODS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

impl K8sStep {
    /// What the step does and what is checked after it, for the dry run.
    pub fn describe(&self, to: &Version) -> String {
        let v = to.to_string();
        match self {
            Self::StaticPod { component, node } => format!(
                "{node}: patch cluster.{} image to {v}; wait until the {component} static pod \
                 runs the new config and is Ready",
                match *component {
                    "kube-apiserver" => "apiServer",
                    "kube-controller-manager" => "controllerManager",
                    _ => "scheduler",
                }
            ),
            Self::KubeProxy { node } => {
                format!("{node}: patch cluster.proxy image to {v}")
            }
            Self::Kubelet { node } => format!(
                "{node}: patch machine.kubelet image to {v}; wait until the Node reports \
                 kubelet {v} and is Ready"
            ),
            Self::Manifests => "sync the bootstrap manifests from the first control plane \
                 (server-side apply as `talos`, prune what the inventory says is gone); wait \
                 until their Deployments and DaemonSets have rolled out"
                .to_owned(),
        }
    }
}

/// Every step of upgrading the inventory's cluster to Kubernetes `to`, in talosctl's order.
pub fn plan(inv: &Inventory) -> Vec<K8sStep> {
    let cps: Vec<String> = inv
        .nodes
        .iter()
        .filter(|n| inv.role_of(n).machine_type == MachineType::ControlPlane)
        .map(|n| n.name.as_str().to_owned())
        .collect();
    let workers = inv
        .nodes
        .iter()
        .filter(|n| inv.role_of(n).machine_type != MachineType::ControlPlane)
        .map(|n| n.name.as_str().to_owned());
    let mut steps = Vec::new();
    for component in STATIC_PODS {
        for node in &cps {
            steps.push(K8sStep::StaticPod {
                component,
                node: node.clone(),
            });
        }
    }
    for node in &cps {
        steps.push(K8sStep::KubeProxy { node: node.clone() });
    }
    for node in cps.iter().cloned().chain(workers) {
        steps.push(K8sStep::Kubelet { node });
    }
    steps.push(K8sStep::Manifests);
    steps
}

/// The store key of a Kubernetes upgrade's rollout record.
pub(crate) fn rollout_key(to: &Version) -> String {
    format!("upgrade-k8s/{to}")
}

/// talosctl's default images (siderolabs/talos v1.13.9 `pkg/machinery/constants/
/// constants.go`: `KubernetesAPIServerImage`, `KubernetesControllerManagerImage`,
/// `KubernetesSchedulerImage`, `KubeProxyImage`, `KubeletImage`), the same ones `gen` renders.
pub(crate) fn image_repo(component: &str) -> &'static str {
    match component {
        "kube-apiserver" => "registry.k8s.io/kube-apiserver",
        "kube-controller-manager" => "registry.k8s.io/kube-controller-manager",
        "kube-scheduler" => "registry.k8s.io/kube-scheduler",
        "kube-proxy" => "registry.k8s.io/kube-proxy",
        _ => "ghcr.io/siderolabs/kubelet",
    }
}

/// The v1.14 document that holds a step's image, and talosctl's rule for which shape a
/// running config gets patched in: per component, the document's `image` when the config has
/// that document, else the v1alpha1 field (siderolabs/talos v1.14.0-rc.1
/// `pkg/machinery/config/generate/stdpatches/guess.go`, `GuessVersionContractKubelet` and the
/// four like it; `stdpatches.go` `WithKubeletImage` ...; the `image` fields in
/// `pkg/machinery/config/types/k8s/{kubelet,apiserver,controller_manager,scheduler,proxy}.go`).
/// A v1.14-contract config must be patched there: Talos refuses the legacy field next to
/// its document.
fn image_document(step: &K8sStep) -> Option<&'static str> {
    match step {
        K8sStep::StaticPod { component, .. } => Some(match *component {
            "kube-apiserver" => "KubeAPIServerConfig",
            "kube-controller-manager" => "KubeControllerManagerConfig",
            _ => "KubeSchedulerConfig",
        }),
        K8sStep::KubeProxy { .. } => Some("KubeProxyConfig"),
        K8sStep::Kubelet { .. } => Some("KubeletConfig"),
        K8sStep::Manifests => None,
    }
}

/// Which document of a running config holds a step's image, and the path in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageAt {
    /// `None`: the v1alpha1 document; else the document of this kind.
    kind: Option<&'static str>,
    path: &'static [&'static str],
}

/// Where `step`'s image is in `text`, by talosctl's rule ([`image_document`]).
fn image_at(text: &str, step: &K8sStep) -> Result<ImageAt, PatchError> {
    if let Some(kind) = image_document(step) {
        for doc in yaml_serde::Deserializer::from_str(text) {
            let v = <yaml_serde::Value as serde::Deserialize>::deserialize(doc)
                .map_err(|e| PatchError::Yaml(e.to_string()))?;
            if v.get("kind").and_then(|k| k.as_str()) == Some(kind) {
                return Ok(ImageAt {
                    kind: Some(kind),
                    path: &["image"],
                });
            }
        }
    }
    Ok(ImageAt {
        kind: None,
        path: image_path(step),
    })
}

/// Whether `v` is the document `kind` names (`None`: the v1alpha1 one).
fn is_document(v: &yaml_serde::Value, kind: Option<&str>) -> bool {
    match kind {
        None => v.get("version").and_then(|v| v.as_str()) == Some("v1alpha1"),
        Some(k) => v.get("kind").and_then(|v| v.as_str()) == Some(k),
    }
}

/// Where each step's image lives in the v1alpha1 document.
fn image_path(step: &K8sStep) -> &'static [&'static str] {
    match step {
        K8sStep::StaticPod { component, .. } => match *component {
            "kube-apiserver" => &["cluster", "apiServer", "image"],
            "kube-controller-manager" => &["cluster", "controllerManager", "image"],
            _ => &["cluster", "scheduler", "image"],
        },
        K8sStep::KubeProxy { .. } => &["cluster", "proxy", "image"],
        K8sStep::Kubelet { .. } => &["machine", "kubelet", "image"],
        K8sStep::Manifests => &[],
    }
}

impl K8sStep {
    /// The step's name in the rollout record: `<component>/<node>`.
    pub fn id(&self) -> String {
        match self {
            Self::StaticPod { component, node } => format!("{component}/{node}"),
            Self::KubeProxy { node } => format!("kube-proxy/{node}"),
            Self::Kubelet { node } => format!("kubelet/{node}"),
            Self::Manifests => "manifests".into(),
        }
    }

    fn node(&self) -> Option<&str> {
        match self {
            Self::StaticPod { node, .. } | Self::KubeProxy { node } | Self::Kubelet { node } => {
                Some(node)
            }
            Self::Manifests => None,
        }
    }
}

/// One node a Kubernetes upgrade touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sNode {
    pub name: String,
    pub role: Role,
    /// Its apid (`address:50000`).
    pub addr: SocketAddr,
    /// Its address as Kubernetes sees it (a static pod's `status.hostIP`).
    pub ip: IpAddr,
}

/// A Kubernetes upgrade of the whole inventory.
#[derive(Debug, Clone)]
pub struct K8sUpgrade {
    pub from: Version,
    pub to: Version,
    pub nodes: Vec<K8sNode>,
    /// The steps carried out, in order (every step of [`plan`]).
    pub steps: Vec<K8sStep>,
}

impl K8sUpgrade {
    /// The upgrade of the inventory's cluster from its `kubernetesVersion` to `to`; refused
    /// when talosctl would refuse the path.
    pub fn plan(inv: &Inventory, to: &Version, apid_port: u16) -> Result<Self, VersionError> {
        let from = inv.cluster.kubernetes_version.value.clone();
        path_supported(&from, to)?;
        let nodes = inv
            .nodes
            .iter()
            .map(|n| K8sNode {
                name: n.name.as_str().to_owned(),
                role: if inv.role_of(n).machine_type == MachineType::ControlPlane {
                    Role::ControlPlane
                } else {
                    Role::Worker
                },
                addr: SocketAddr::new(n.address.addr().into(), apid_port),
                ip: n.address.addr().into(),
            })
            .collect();
        let steps = plan(inv);
        Ok(Self {
            from,
            to: to.clone(),
            nodes,
            steps,
        })
    }

    /// The engine's targets: every step in the one-at-a-time lane, so talosctl's order holds.
    pub fn targets(&self) -> Vec<Target> {
        self.steps
            .iter()
            .map(|s| Target {
                node: s.id(),
                role: Role::ControlPlane,
            })
            .collect()
    }

    /// A new rollout, or the stored one resumed (its steps must be this plan's).
    pub fn rollout(&self, stored: Option<RolloutRecord>) -> Result<Rollout, RolloutError> {
        match stored {
            Some(mut record) => {
                // A record written before talboot synced the manifests has every step but
                // the last: the sync is added, still to do.
                let targets = self.targets();
                if targets
                    .last()
                    .is_some_and(|t| t.node == K8sStep::Manifests.id())
                    && record.targets[..] == targets[..targets.len() - 1]
                {
                    record.targets = targets;
                    record
                        .status
                        .insert(K8sStep::Manifests.id(), super::rollout::NodeStatus::Pending);
                }
                if record.targets != self.targets() {
                    return Err(RolloutError::Mismatch(
                        "the inventory's nodes changed since this upgrade started".into(),
                    ));
                }
                Rollout::resume(record)
            }
            None => Rollout::new(self.targets(), 1),
        }
    }

    /// The image `step` sets: `<repo>:v<to>`; the kubelet keeps a `-fat`/`-slim` suffix of
    /// its current tag (`kubelet.go`, `extractKubeletVersionSuffix`).
    pub(crate) fn image_for(&self, step: &K8sStep, current: Option<&str>) -> String {
        let repo = match step {
            K8sStep::StaticPod { component, .. } => image_repo(component),
            K8sStep::KubeProxy { .. } => image_repo("kube-proxy"),
            _ => image_repo("kubelet"),
        };
        let suffix = match (step, current) {
            (K8sStep::Kubelet { .. }, Some(cur)) => {
                let cur = cur.split('@').next().unwrap_or(cur);
                ["-fat", "-slim"]
                    .into_iter()
                    .find(|s| cur.ends_with(s))
                    .unwrap_or("")
            }
            _ => "",
        };
        format!("{repo}:{}{suffix}", self.to)
    }
}

/// Errors of reading or patching a node's machine config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("the running config has no v1alpha1 document")]
    NoV1alpha1,
    #[error("the running config is not valid YAML: {0}")]
    Yaml(String),
}

/// The v1alpha1 document's string at `path`.
#[cfg(test)]
fn read_at(text: &str, path: &[&str]) -> Result<Option<String>, PatchError> {
    read_in(text, None, path)
}

/// The image at `at` in `text`.
fn read_image(text: &str, at: ImageAt) -> Result<Option<String>, PatchError> {
    read_in(text, at.kind, at.path)
}

/// The string at `path` in the document `kind` names (`None`: the v1alpha1 one).
fn read_in(text: &str, kind: Option<&str>, path: &[&str]) -> Result<Option<String>, PatchError> {
    for doc in yaml_serde::Deserializer::from_str(text) {
        let v = <yaml_serde::Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| PatchError::Yaml(e.to_string()))?;
        if !is_document(&v, kind) {
            continue;
        }
        let mut cur = &v;
        for key in path {
            match cur.get(*key) {
                Some(next) => cur = next,
                None => return Ok(None),
            }
        }
        return Ok(cur.as_str().map(str::to_owned));
    }
    Err(PatchError::NoV1alpha1)
}

/// `text` with the v1alpha1 document's `path` set to `value` (every other document as it
/// was), as talosctl's `PatchV1Alpha1` does before the NO_REBOOT apply.
#[cfg(test)]
fn patch_at(text: &str, path: &[&str], value: &str) -> Result<String, PatchError> {
    patch_in(text, None, path, value)
}

/// `text` with the image at `at` set to `value`.
fn patch_image(text: &str, at: ImageAt, value: &str) -> Result<String, PatchError> {
    patch_in(text, at.kind, at.path, value)
}

/// `text` with `path` in the document `kind` names (`None`: the v1alpha1 one) set to
/// `value`, every other document as it was.
fn patch_in(
    text: &str,
    kind: Option<&str>,
    path: &[&str],
    value: &str,
) -> Result<String, PatchError> {
    let mut docs = Vec::new();
    let mut found = false;
    for doc in yaml_serde::Deserializer::from_str(text) {
        let mut v = <yaml_serde::Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| PatchError::Yaml(e.to_string()))?;
        if !found && is_document(&v, kind) {
            found = true;
            let mut cur = &mut v;
            for key in path {
                let map = match cur {
                    yaml_serde::Value::Mapping(m) => m,
                    other => {
                        *other = yaml_serde::Value::Mapping(Default::default());
                        match other {
                            yaml_serde::Value::Mapping(m) => m,
                            _ => unreachable!("just made a mapping"),
                        }
                    }
                };
                cur = map
                    .entry(yaml_serde::Value::String((*key).to_owned()))
                    .or_insert(yaml_serde::Value::Null);
            }
            *cur = yaml_serde::Value::String(value.to_owned());
        }
        docs.push(yaml_serde::to_string(&v).map_err(|e| PatchError::Yaml(e.to_string()))?);
    }
    if !found {
        return Err(PatchError::NoV1alpha1);
    }
    Ok(docs.join("---\n"))
}

/// Why a step of a Kubernetes upgrade (or its gate, or reaching the cluster) failed. The
/// text becomes the step's failure reason in the rollout record.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("the inventory has no control plane")]
    NoControlPlane,
    #[error("{0}")]
    Talos(TalosError),
    #[error("admin kubeconfig from {node}: {source}")]
    Kubeconfig { node: String, source: TalosError },
    #[error("{0}")]
    Kube(crate::addons::kube::KubeError),
    #[error("{0} is not a step of this upgrade")]
    UnknownStep(String),
    #[error("{0}: its node is not in the inventory")]
    NoNode(String),
    #[error("reading the running config: {0}")]
    ReadConfig(TalosError),
    #[error("{0}")]
    Patch(#[from] PatchError),
    #[error("{node}: {source}")]
    NodeTalos { node: String, source: TalosError },
    #[error("{node}: {source}")]
    NodeManifests {
        node: String,
        source: Box<super::manifests::ManifestError>,
    },
    #[error("{0}")]
    Manifests(#[from] super::manifests::ManifestError),
    #[error("applying {image} (no reboot): {source}")]
    Apply { image: String, source: TalosError },
    /// Every problem the pre-flight check found.
    #[error("the cluster is not healthy before the upgrade: {}", .0.join("; "))]
    NotHealthy(Vec<String>),
    #[error("listing {component} pods: {source}")]
    ListPods {
        component: &'static str,
        source: Box<kube::Error>,
    },
    #[error("Node {node}: {source}")]
    GetNode {
        node: String,
        source: Box<kube::Error>,
    },
    /// The gate did not pass in time; `last` is what it saw last.
    #[error("not done within {wait:?}: {last}")]
    Timeout { wait: Duration, last: String },
}

/// [`NodeOps`] of a Kubernetes upgrade: each target is one step.
pub(crate) struct K8sOps {
    upgrade: K8sUpgrade,
    steps: HashMap<String, K8sStep>,
    nodes: HashMap<String, K8sNode>,
    creds: ClientCreds,
    kube: kube::Client,
    /// The control plane the bootstrap manifests are read from.
    cp: K8sNode,
    /// Keep objects the manifest inventory has but the set no longer does (`--no-prune`).
    pub no_prune: bool,
    /// How long the manifests' workloads may take to roll out; `None`: not waited for.
    pub manifest_wait: Option<Duration>,
    /// How long a static pod may take to run the new image and be Ready (talosctl: 5 min).
    pub pod_wait: Duration,
    /// How long a Node may take to report the new kubelet and be Ready (talosctl: 3 min).
    pub node_wait: Duration,
    /// How often a gate asks again.
    pub poll: Duration,
}

impl K8sOps {
    /// Ops for `upgrade`, Kubernetes reached with the admin kubeconfig the first control
    /// plane hands out (Talos `Kubeconfig`).
    pub async fn connect(upgrade: K8sUpgrade, creds: ClientCreds) -> Result<Self, StepError> {
        let cp = upgrade
            .nodes
            .iter()
            .find(|n| n.role == Role::ControlPlane)
            .ok_or(StepError::NoControlPlane)?
            .clone();
        let kubeconfig = TalosClient::secured(cp.addr, &creds)
            .map_err(StepError::Talos)?
            .kubeconfig()
            .await
            .map_err(|source| StepError::Kubeconfig {
                node: cp.name.clone(),
                source,
            })?;
        let kube = crate::addons::kube::client_from_kubeconfig(&kubeconfig)
            .await
            .map_err(StepError::Kube)?;
        let steps = upgrade.steps.iter().map(|s| (s.id(), s.clone())).collect();
        let nodes = upgrade
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.clone()))
            .collect();
        Ok(Self {
            upgrade,
            steps,
            nodes,
            creds,
            kube,
            cp,
            no_prune: false,
            manifest_wait: Some(Duration::from_secs(300)),
            pod_wait: Duration::from_secs(300),
            node_wait: Duration::from_secs(180),
            poll: Duration::from_secs(2),
        })
    }

    fn step(&self, id: &str) -> Result<(&K8sStep, &K8sNode), StepError> {
        let step = self
            .steps
            .get(id)
            .ok_or_else(|| StepError::UnknownStep(id.to_owned()))?;
        let node = step
            .node()
            .and_then(|n| self.nodes.get(n))
            .ok_or_else(|| StepError::NoNode(id.to_owned()))?;
        Ok((step, node))
    }

    fn client(&self, node: &K8sNode) -> Result<TalosClient, TalosError> {
        TalosClient::secured(node.addr, &self.creds)
            .map(|c| c.with_retry(crate::talos::retry::RetryPolicy::NONE))
    }

    async fn running(&self, node: &K8sNode) -> Result<String, StepError> {
        self.client(node)
            .map_err(StepError::Talos)?
            .machine_config()
            .await
            .map_err(StepError::ReadConfig)
    }

    /// The step's image on the node now, and the one it should have.
    async fn images(
        &self,
        step: &K8sStep,
        node: &K8sNode,
    ) -> Result<(Option<String>, String), StepError> {
        let text = self.running(node).await?;
        let current = read_image(&text, image_at(&text, step)?)?;
        let want = self.upgrade.image_for(step, current.as_deref());
        Ok((current, want))
    }

    /// The bootstrap manifests the first control plane renders now.
    async fn manifests(&self) -> Result<Vec<serde_json::Value>, StepError> {
        let talos = self
            .client(&self.cp)
            .map_err(|source| StepError::NodeTalos {
                node: self.cp.name.clone(),
                source,
            })?;
        super::manifest_sync::fetch(&talos)
            .await
            .map_err(|e| StepError::NodeManifests {
                node: self.cp.name.clone(),
                source: Box::new(e),
            })
    }

    fn kube_session(&self) -> crate::addons::kube::Kube {
        crate::addons::kube::Kube::new(self.kube.clone(), self.poll)
    }

    /// The manifest sync: read, apply, inventory, prune.
    async fn sync_manifests(&self) -> Result<(), StepError> {
        let objects = self.manifests().await?;
        let changes =
            super::manifest_sync::apply(&self.kube_session(), objects, self.no_prune).await?;
        for line in super::manifests::describe(&changes) {
            tracing::info!("bootstrap manifests: {line}");
        }
        Ok(())
    }

    /// What the manifest sync would change, changing nothing.
    pub(crate) async fn manifests_diff(&self) -> Result<Vec<super::manifests::Change>, StepError> {
        let objects = self.manifests().await?;
        Ok(super::manifest_sync::diff(&self.kube_session(), objects, self.no_prune).await?)
    }

    /// The manifest step's gate: the set's workloads rolled out (unless not waited for).
    async fn manifests_gate(&self) -> Result<(), StepError> {
        let Some(wait) = self.manifest_wait else {
            tracing::info!("skipping waiting for manifest reconciliation");
            return Ok(());
        };
        let objects = self.manifests().await?;
        Ok(super::manifest_sync::wait(&self.kube_session(), &objects, wait).await?)
    }

    async fn change_step(&self, id: &str) -> Result<(), StepError> {
        if id == K8sStep::Manifests.id() {
            return self.sync_manifests().await;
        }
        let (step, node) = self.step(id)?;
        let text = self.running(node).await?;
        let at = image_at(&text, step)?;
        let current = read_image(&text, at)?;
        let want = self.upgrade.image_for(step, current.as_deref());
        if current.as_deref() == Some(want.as_str()) {
            // talosctl's errUpdateSkipped: nothing to apply, only the wait.
            tracing::info!(step = id, image = %want, "already on the image");
            return Ok(());
        }
        let patched = patch_image(&text, at, &want)?;
        self.client(node)
            .map_err(StepError::Talos)?
            .apply_configuration_with(patched.as_bytes(), Mode::NoReboot, false, None)
            .await
            .map_err(|source| StepError::Apply {
                image: want.clone(),
                source,
            })?;
        Ok(())
    }

    /// Every node's Talos API answers with its config and every Node is Ready.
    async fn cluster_gate(&self) -> Result<(), StepError> {
        let mut problems = Vec::new();
        for node in &self.upgrade.nodes {
            if let Err(e) = self.running(node).await {
                problems.push(format!("{}: {e}", node.name));
                continue;
            }
            // talosctl's VerifyVersionCompatibility: every node's Talos runs the target.
            let tag = match self.client(node) {
                Ok(c) => c.version().await.map(|v| v.version.map(|v| v.tag)),
                Err(e) => Err(e),
            };
            match tag {
                Ok(Some(tag)) => {
                    if let Err(e) = supported_with(&self.upgrade.to, &tag) {
                        problems.push(format!("node {}: {e}", node.name));
                    }
                }
                Ok(None) => problems.push(format!("{}: no version reported", node.name)),
                Err(e) => problems.push(format!("{}: version: {e}", node.name)),
            }
        }
        let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.kube.clone());
        match api.list(&Default::default()).await {
            Ok(list) => {
                for node in &self.upgrade.nodes {
                    match list
                        .items
                        .iter()
                        .find(|n| n.metadata.name.as_deref() == Some(node.name.as_str()))
                    {
                        None => problems.push(format!("Node {} is not registered", node.name)),
                        Some(n) if !node_ready(n) => {
                            problems.push(format!("Node {} is not Ready", node.name))
                        }
                        Some(_) => {}
                    }
                }
            }
            Err(e) => problems.push(format!("listing Nodes: {e}")),
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(StepError::NotHealthy(problems))
        }
    }

    /// One look at the step's result; `Ok(None)` when done, `Ok(Some(why))` when not yet.
    async fn look(&self, step: &K8sStep, node: &K8sNode) -> Result<Option<String>, StepError> {
        let want = self.images(step, node).await?.1;
        match step {
            K8sStep::StaticPod { component, .. } => {
                let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
                    kube::Api::namespaced(self.kube.clone(), "kube-system");
                let pods = api
                    .list(&kube::api::ListParams::default().labels(&format!("k8s-app={component}")))
                    .await
                    .map_err(|e| StepError::ListPods {
                        component,
                        source: Box::new(e),
                    })?;
                let ip = node.ip.to_string();
                // The label is matched here too: a server that ignores the selector must not
                // make another component's pod pass.
                let pod = pods.items.iter().find(|p| {
                    p.status.as_ref().and_then(|s| s.host_ip.as_deref()) == Some(ip.as_str())
                        && p.metadata.labels.as_ref().and_then(|l| l.get("k8s-app"))
                            == Some(&component.to_string())
                });
                let Some(pod) = pod else {
                    return Ok(Some(format!("no {component} pod on {ip} yet")));
                };
                let image = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.image.clone())
                    .unwrap_or_default();
                if image != want {
                    return Ok(Some(format!(
                        "the {component} pod runs {image}, not {want}"
                    )));
                }
                let ready = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                Ok((!ready).then(|| format!("the {component} pod is not Ready")))
            }
            K8sStep::KubeProxy { .. } => {
                let (current, want) = self.images(step, node).await?;
                Ok((current.as_deref() != Some(want.as_str()))
                    .then(|| format!("the config does not have {want}")))
            }
            K8sStep::Kubelet { .. } => {
                let api: kube::Api<k8s_openapi::api::core::v1::Node> =
                    kube::Api::all(self.kube.clone());
                let n = api.get(&node.name).await.map_err(|e| StepError::GetNode {
                    node: node.name.clone(),
                    source: Box::new(e),
                })?;
                let version = n
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.kubelet_version.clone())
                    .unwrap_or_default();
                let to = self.upgrade.to.to_string();
                if version != to {
                    return Ok(Some(format!(
                        "node version mismatch: got {version:?}, expected {to:?}"
                    )));
                }
                Ok((!node_ready(&n)).then(|| "node is not ready".to_owned()))
            }
            K8sStep::Manifests => Ok(None),
        }
    }

    async fn step_gate(&self, id: &str) -> Result<(), StepError> {
        if id == K8sStep::Manifests.id() {
            return self.manifests_gate().await;
        }
        let (step, node) = self.step(id)?;
        let wait = match step {
            K8sStep::Kubelet { .. } => self.node_wait,
            _ => self.pod_wait,
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let last = match self.look(step, node).await {
                Ok(None) => return Ok(()),
                Ok(Some(why)) => why,
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(StepError::Timeout { wait, last });
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}

fn node_ready(n: &k8s_openapi::api::core::v1::Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tonic::async_trait]
impl NodeOps for K8sOps {
    async fn change(&self, id: &str) -> Event {
        match self.change_step(id).await {
            Ok(()) => Event::Changed {
                node: id.to_owned(),
            },
            Err(e) => Event::ChangeFailed {
                node: id.to_owned(),
                reason: e.to_string(),
            },
        }
    }

    async fn reconcile(&self, id: &str) -> Event {
        // Took effect when the node's running config already has the step's image. The
        // manifest sync is applied again: server-side apply of the same set is idempotent.
        let done = match self.step(id) {
            Ok((step, node)) => matches!(
                self.images(step, node).await,
                Ok((Some(cur), want)) if cur == want
            ),
            Err(_) => false,
        };
        if done {
            Event::Changed {
                node: id.to_owned(),
            }
        } else {
            Event::NotChanged {
                node: id.to_owned(),
            }
        }
    }

    async fn check(&self, gate: &Gate) -> Event {
        let result = match gate {
            Gate::Cluster => self.cluster_gate().await,
            Gate::Node(id) => self.step_gate(id).await,
        };
        match result {
            Ok(()) => Event::Healthy(gate.clone()),
            Err(e) => Event::Unhealthy {
                gate: gate.clone(),
                reason: e.to_string(),
            },
        }
    }
}

/// One progress line of a Kubernetes upgrade, for the operator (the standalone CLI prints
/// it, a run inside `serve` streams it to the CLI).
pub(crate) fn progress_line(plan: &K8sUpgrade, p: &Progress) -> String {
    let describe = |id: &str| {
        plan.steps
            .iter()
            .find(|s| s.id() == id)
            .map_or_else(|| id.to_owned(), |s| s.describe(&plan.to))
    };
    match p {
        Progress::Checking(Gate::Cluster) => "checking the cluster before upgrading".into(),
        Progress::Checking(Gate::Node(id)) => format!("{id}: waiting"),
        Progress::Changing(id) => describe(id),
        Progress::Reconciling(id) => {
            format!("{id}: an earlier run started this step; checking whether it took effect")
        }
        Progress::Observed(Event::Healthy(Gate::Node(id))) => format!("{id}: done"),
        Progress::Observed(Event::Healthy(Gate::Cluster)) => "cluster healthy".into(),
        Progress::Observed(Event::Changed { node }) if *node == K8sStep::Manifests.id() => {
            format!("{node}: applied and pruned")
        }
        Progress::Observed(Event::Changed { node }) => format!("{node}: config patched"),
        Progress::Observed(Event::NotChanged { node }) => {
            format!("{node}: not applied yet; applying now")
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

/// Errors that end a run before or outside the rollout.
#[derive(Debug, thiserror::Error)]
pub enum K8sUpgradeError {
    /// The upgrade cannot be planned (e.g. an unsupported path).
    #[error("{0}")]
    Plan(VersionError),
    /// Kubernetes or the first control plane could not be reached.
    #[error("{0}")]
    Connect(StepError),
    /// The stored record could not be read or resumed, or the rollout ended without an
    /// outcome.
    #[error("{0}")]
    Run(#[from] RunError),
}

/// How a whole Kubernetes upgrade runs, for callers that start one from the inventory (the
/// CLI, a rollout command inside `serve`).
#[derive(Debug, Clone)]
pub struct K8sOptions {
    /// apid's port on every node.
    pub apid_port: u16,
    /// Longest wait for a static pod (talosctl: 5 min).
    pub pod_wait: Duration,
    /// Longest wait for a Node's new kubelet version (talosctl: 3 min).
    pub node_wait: Duration,
    /// How often a gate looks again.
    pub poll: Duration,
    /// Keep what the manifest inventory says is gone (talosctl `--manifests-no-prune`).
    pub no_prune: bool,
    /// Longest wait for the manifests' workloads; `None`: not waited for (talosctl: 5 min,
    /// `--manifests-reconcile-timeout 0` skips it).
    pub manifest_wait: Option<Duration>,
}

impl Default for K8sOptions {
    fn default() -> Self {
        K8sOptions {
            no_prune: false,
            manifest_wait: Some(Duration::from_secs(300)),
            apid_port: crate::talos::APID_PORT,
            pod_wait: Duration::from_secs(300),
            node_wait: Duration::from_secs(180),
            poll: Duration::from_secs(2),
        }
    }
}

/// Plans, connects and runs (or resumes) the upgrade of `inv`'s cluster to Kubernetes `to`:
/// the standalone CLI's call (a run inside `serve` plans against serve's inventory and calls
/// [`run`], `daytwo::remote`'s `UpgradeKubernetes`).
pub async fn upgrade(
    inv: &Inventory,
    to: &Version,
    creds: ClientCreds,
    store: &RolloutWriter,
    opts: &K8sOptions,
    report: impl FnMut(&Progress),
) -> Result<Outcome, K8sUpgradeError> {
    let plan = K8sUpgrade::plan(inv, to, opts.apid_port).map_err(K8sUpgradeError::Plan)?;
    let mut ops = K8sOps::connect(plan.clone(), creds)
        .await
        .map_err(K8sUpgradeError::Connect)?;
    ops.pod_wait = opts.pod_wait;
    ops.node_wait = opts.node_wait;
    ops.poll = opts.poll;
    ops.no_prune = opts.no_prune;
    ops.manifest_wait = opts.manifest_wait;
    run(&plan, Arc::new(ops), store, report).await
}

/// The dry run's part that needs the cluster: what the manifest sync would change, one line
/// per object (talosctl's dry run prints ` < <action> <object>`), changing nothing.
pub(crate) async fn manifests_dry_run(
    inv: &Inventory,
    to: &Version,
    creds: ClientCreds,
    opts: &K8sOptions,
) -> Result<Vec<String>, K8sUpgradeError> {
    let plan = K8sUpgrade::plan(inv, to, opts.apid_port).map_err(K8sUpgradeError::Plan)?;
    let mut ops = K8sOps::connect(plan, creds)
        .await
        .map_err(K8sUpgradeError::Connect)?;
    ops.no_prune = opts.no_prune;
    let changes = ops
        .manifests_diff()
        .await
        .map_err(K8sUpgradeError::Connect)?;
    Ok(super::manifests::describe(&changes))
}

/// Runs (or resumes) the Kubernetes upgrade `plan` with `ops`, its record in `store` under
/// [`rollout_key`] (written before each step is carried out), reporting progress. The one
/// entry point for the CLI and for a rollout run inside `serve`.
pub async fn run(
    plan: &K8sUpgrade,
    ops: Arc<dyn NodeOps>,
    store: &RolloutWriter,
    report: impl FnMut(&Progress),
) -> Result<Outcome, K8sUpgradeError> {
    let rollout = Persisted::new(store, rollout_key(&plan.to));
    let (engine, resumed) = rollout.resume_or_start(|stored| plan.rollout(stored))?;
    if resumed {
        tracing::info!(key = rollout.key(), "resuming a stored Kubernetes upgrade");
    }
    Ok(rollout.drive(engine, ops, report).await?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    #[test]
    fn a_patch_changes_only_the_one_field() {
        let text = "version: v1alpha1\nmachine:\n  type: worker\n  kubelet:\n    image: \
                    ghcr.io/siderolabs/kubelet:v1.36.3\ncluster:\n  id: x\n---\n\
                    apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n";
        let path = &["machine", "kubelet", "image"];
        let out = patch_at(text, path, "k:v2").unwrap();
        assert_eq!(read_at(&out, path).unwrap().as_deref(), Some("k:v2"));
        assert_eq!(
            read_at(&out, &["machine", "type"]).unwrap().as_deref(),
            Some("worker")
        );
        assert!(out.contains("kind: HostnameConfig"), "{out}");
        // A missing parent is created, as PatchV1Alpha1 does for a nil ProxyConfig.
        let out = patch_at(text, &["cluster", "proxy", "image"], "p:v2").unwrap();
        assert_eq!(
            read_at(&out, &["cluster", "proxy", "image"])
                .unwrap()
                .as_deref(),
            Some("p:v2")
        );
        assert_eq!(
            patch_at("kind: HostnameConfig\n", path, "x"),
            Err(PatchError::NoV1alpha1)
        );
    }

    /// talosctl patches each component where the running config keeps it: the v1.14
    /// document when the config has it, else the v1alpha1 field (`stdpatches/guess.go` at
    /// v1.14.0-rc.1, one guess per component).
    #[test]
    fn a_v1_14_contract_config_is_patched_in_its_documents() {
        let text = "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  id: x\n---\n\
                    apiVersion: v1alpha1\nkind: KubeletConfig\nimage: \
                    ghcr.io/siderolabs/kubelet:v1.36.3\n---\napiVersion: v1alpha1\n\
                    kind: KubeAPIServerConfig\nimage: registry.k8s.io/kube-apiserver:v1.36.3\n";
        let node = || "cp-1".to_string();
        let kubelet = K8sStep::Kubelet { node: node() };
        let at = image_at(text, &kubelet).unwrap();
        assert_eq!(at.kind, Some("KubeletConfig"));
        assert_eq!(
            read_image(text, at).unwrap().as_deref(),
            Some("ghcr.io/siderolabs/kubelet:v1.36.3")
        );
        let out = patch_image(text, at, "ghcr.io/siderolabs/kubelet:v1.36.4").unwrap();
        assert_eq!(
            read_image(&out, image_at(&out, &kubelet).unwrap())
                .unwrap()
                .as_deref(),
            Some("ghcr.io/siderolabs/kubelet:v1.36.4")
        );
        // No legacy field appears next to the document (Talos would refuse the pair).
        assert_eq!(
            read_at(&out, &["machine", "kubelet", "image"]).unwrap(),
            None
        );
        assert!(!out.contains("kubelet:\n"), "{out}");

        let apiserver = K8sStep::StaticPod {
            component: "kube-apiserver",
            node: node(),
        };
        let at = image_at(text, &apiserver).unwrap();
        assert_eq!(at.kind, Some("KubeAPIServerConfig"));
        let out = patch_image(text, at, "registry.k8s.io/kube-apiserver:v1.36.4").unwrap();
        assert!(
            out.contains("image: registry.k8s.io/kube-apiserver:v1.36.4"),
            "{out}"
        );
        assert_eq!(
            read_at(&out, &["cluster", "apiServer", "image"]).unwrap(),
            None
        );

        // A component whose document the config lacks keeps the v1alpha1 field.
        let proxy = K8sStep::KubeProxy { node: node() };
        let at = image_at(text, &proxy).unwrap();
        assert_eq!(at.kind, None);
        assert_eq!(at.path, &["cluster", "proxy", "image"]);
        // A v1.13-contract config is patched in v1alpha1 throughout.
        let v113 = "version: v1alpha1\nmachine:\n  kubelet:\n    image: k:v1\n";
        assert_eq!(
            image_at(v113, &kubelet).unwrap(),
            ImageAt {
                kind: None,
                path: &["machine", "kubelet", "image"],
            }
        );
    }

    #[test]
    fn images_keep_the_kubelet_flavour() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
        let inv = crate::inventory::load_with_env(&path, &BTreeMap::new())
            .unwrap()
            .inventory;
        let up = K8sUpgrade::plan(&inv, &"1.36.4".parse().unwrap(), 50000).unwrap();
        let kubelet = K8sStep::Kubelet { node: "n".into() };
        assert_eq!(
            up.image_for(
                &kubelet,
                Some("ghcr.io/siderolabs/kubelet:v1.36.3-fat@sha256:ab")
            ),
            "ghcr.io/siderolabs/kubelet:v1.36.4-fat"
        );
        let api = K8sStep::StaticPod {
            component: "kube-apiserver",
            node: "n".into(),
        };
        assert_eq!(
            up.image_for(&api, None),
            "registry.k8s.io/kube-apiserver:v1.36.4"
        );
        assert_eq!(up.steps.last(), Some(&K8sStep::Manifests));
        assert!(up.targets().iter().all(|t| t.role == Role::ControlPlane));
        assert!(K8sUpgrade::plan(&inv, &"1.38.0".parse().unwrap(), 50000).is_err());
    }

    #[test]
    fn a_record_from_before_the_manifest_sync_resumes_with_the_sync_to_do() {
        use crate::daytwo::rollout::NodeStatus;
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
        let inv = crate::inventory::load_with_env(&path, &BTreeMap::new())
            .unwrap()
            .inventory;
        let up = K8sUpgrade::plan(&inv, &"1.36.4".parse().unwrap(), 50000).unwrap();
        let mut targets = up.targets();
        targets.pop();
        let old = RolloutRecord {
            status: targets
                .iter()
                .map(|t| (t.node.clone(), NodeStatus::Done))
                .collect(),
            targets,
            worker_concurrency: 1,
        };
        let resumed = up.rollout(Some(old)).unwrap();
        let rec = resumed.record();
        assert_eq!(rec.targets, up.targets());
        assert_eq!(rec.status["manifests"], NodeStatus::Pending);
        assert_eq!(rec.status["kubelet/rack1-wk-01"], NodeStatus::Done);
    }

    #[test]
    fn the_dry_run_lists_talosctls_order() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
        let inv = crate::inventory::load_with_env(&path, &BTreeMap::new())
            .unwrap()
            .inventory;
        let steps = plan(&inv);
        let cps = ["rack1-cp-01", "rack1-cp-02", "rack1-cp-03"];
        // Each static pod across every control plane before the next component.
        let mut want = Vec::new();
        for c in STATIC_PODS {
            for n in cps {
                want.push(K8sStep::StaticPod {
                    component: c,
                    node: n.into(),
                });
            }
        }
        for n in cps {
            want.push(K8sStep::KubeProxy { node: n.into() });
        }
        assert_eq!(steps[..12], want[..]);
        // Then the kubelets: control planes first, then every other node in file order.
        let kubelets: Vec<&str> = steps[12..steps.len() - 1]
            .iter()
            .map(|s| match s {
                K8sStep::Kubelet { node } => node.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        let order: Vec<&str> = cps
            .into_iter()
            .chain(
                inv.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .filter(|n| !n.starts_with("rack1-cp")),
            )
            .collect();
        assert_eq!(kubelets, order);
        assert_eq!(steps.last(), Some(&K8sStep::Manifests));
        let v: Version = "v1.36.4".parse().unwrap();
        assert!(
            steps[0]
                .describe(&v)
                .contains("cluster.apiServer image to v1.36.4")
        );
    }

    /// Against five Talos doubles installed from talboot's rendered configs (127.0.79.x, no
    /// other test uses it), the Kubernetes double, and the simulated kubelets between them.
    mod rack {
        use super::*;
        use crate::daytwo::rollout::NodeStatus;
        use crate::machineconfig::render::render_node;
        use crate::sim::kube::{DoubleOptions, KubeDouble};
        use crate::sim::kubelet::{KubeletNode, KubeletOptions, Kubelets};
        use crate::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase};

        const NODES: [&str; 5] = [
            "rack1-cp-01",
            "rack1-cp-02",
            "rack1-cp-03",
            "rack1-wk-01",
            "rack1-wk-04",
        ];

        use crate::daytwo::upgrade::tests::{creds, rack as inv_secrets};

        struct Rack {
            _cluster: FakeCluster,
            nodes: Vec<FakeTalosNode>,
            kube: Arc<KubeDouble>,
            kubelets: Kubelets,
            upgrade: K8sUpgrade,
        }

        impl Rack {
            fn node(&self, name: &str) -> &FakeTalosNode {
                self.nodes.iter().find(|n| n.hostname() == name).unwrap()
            }

            /// Configured applies each node had (maintenance installs are not counted).
            fn applies(&self, name: &str) -> usize {
                self.node(name).apply_records().len()
            }

            fn kubelet_version(&self, name: &str) -> String {
                self.kube
                    .object("v1", "Node", "", name)
                    .unwrap()["status"]["nodeInfo"]["kubeletVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            }

            fn pod_image(&self, component: &str, node: &str) -> String {
                self.kube
                    .object("v1", "Pod", "kube-system", &format!("{component}-{node}"))
                    .unwrap()["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            }
        }

        /// The rack, planned for an upgrade to Kubernetes `to`.
        async fn rack_up_to(third: u8, to: &str) -> Rack {
            let (inv, _) = inv_secrets();
            rack_of(third, to, inv, crate::sim::talos::TALOS_TAG).await
        }

        /// The rack of inventory `inv` on doubles running Talos `talos`, installed with the
        /// configs `inv` renders, planned for an upgrade to Kubernetes `to`.
        async fn rack_of(third: u8, to: &str, inv: &Inventory, talos: &str) -> Rack {
            crate::install_crypto_provider();
            let (_, secrets) = inv_secrets();
            let cluster = FakeCluster::new();
            let kube = Arc::new(
                KubeDouble::start(DoubleOptions {
                    nodes: NODES.iter().map(|n| (n.to_string(), true)).collect(),
                    ..DoubleOptions::default()
                })
                .await
                .unwrap(),
            );
            cluster.set_kubeconfig(Some(kube.kubeconfig().to_owned()));
            let mut nodes = Vec::new();
            let mut followed = Vec::new();
            for (i, name) in NODES.iter().enumerate() {
                let ip = IpAddr::from([127, 0, 79, third + i as u8]);
                let inv_ip: IpAddr = inv.node(name).unwrap().address.addr().into();
                let mut cfg = FakeNodeConfig::new(ip, name);
                cfg.aliases = vec![inv_ip];
                cfg.talos_version = talos.to_owned();
                // The disks the inventory's install target picks (an unattended v1.14 install
                // waits for a disk its selector matches).
                let node = inv.node(name).unwrap();
                cfg.disks = crate::sim::machine::disks_for(name, &node.install);
                let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
                let config = render_node(inv, secrets, inv.node(name).unwrap())
                    .unwrap()
                    .to_yaml()
                    .unwrap();
                TalosClient::maintenance(node.addr())
                    .unwrap()
                    .apply_configuration(config.as_bytes())
                    .await
                    .unwrap();
                followed.push(KubeletNode {
                    hostname: name.to_string(),
                    ip: inv_ip,
                    config: node.running_config_handle(),
                });
                nodes.push(node);
            }
            for n in &nodes {
                n.wait_phase(Phase::Secured).await.unwrap();
            }
            let kubelets = Kubelets::start(
                followed,
                kube.clone(),
                KubeletOptions {
                    restart: Duration::from_millis(60),
                    poll: Duration::from_millis(10),
                },
            );
            let mut upgrade = K8sUpgrade::plan(inv, &to.parse().unwrap(), 50000).unwrap();
            upgrade.nodes.retain(|n| NODES.contains(&n.name.as_str()));
            upgrade.steps.retain(|s| {
                *s == K8sStep::Manifests || s.node().is_some_and(|n| NODES.contains(&n))
            });
            for n in &mut upgrade.nodes {
                n.addr = nodes
                    .iter()
                    .find(|f| f.hostname() == n.name)
                    .unwrap()
                    .addr();
            }
            Rack {
                _cluster: cluster,
                nodes,
                kube,
                kubelets,
                upgrade,
            }
        }

        /// The rack, planned for 1.36.3 -> 1.36.4 (Talos v1.13 runs Kubernetes up to 1.36).
        async fn rack_up(third: u8) -> Rack {
            rack_up_to(third, "1.36.4").await
        }

        async fn run_once(rack: &Rack, store: &RolloutWriter) -> Outcome {
            run_pruning(rack, store, false).await
        }

        async fn ops(rack: &Rack, no_prune: bool) -> K8sOps {
            let mut ops = K8sOps::connect(rack.upgrade.clone(), creds())
                .await
                .unwrap();
            ops.no_prune = no_prune;
            ops.manifest_wait = Some(Duration::from_secs(3));
            ops
        }

        async fn run_pruning(rack: &Rack, store: &RolloutWriter, no_prune: bool) -> Outcome {
            let mut ops = ops(rack, no_prune).await;
            ops.pod_wait = Duration::from_secs(3);
            ops.node_wait = Duration::from_secs(3);
            ops.poll = Duration::from_millis(20);
            run(&rack.upgrade, Arc::new(ops), store, |_| {})
                .await
                .unwrap()
        }

        fn record(store: &RolloutWriter, rack: &Rack) -> RolloutRecord {
            serde_json::from_slice(
                &store
                    .rollout(&rollout_key(&rack.upgrade.to))
                    .unwrap()
                    .unwrap(),
            )
            .unwrap()
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_step_applies_in_talosctls_order_without_a_reboot() {
            let rack = rack_up(1).await;
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            // The simulated kubelets post their version once they have seen the config.
            for _ in 0..1000 {
                if rack.kubelet_version("rack1-wk-01") == "v1.36.3" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(rack.kubelet_version("rack1-wk-01"), "v1.36.3");
            let boots: Vec<usize> = NODES
                .iter()
                .map(|n| rack.node(n).configured_boots())
                .collect();
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            for cp in &NODES[..3] {
                for (c, _) in crate::sim::kubelet::STATIC_PODS {
                    assert_eq!(rack.pod_image(c, cp), format!("{}:v1.36.4", image_repo(c)));
                }
                let cfg = rack.node(cp).running_config().unwrap();
                assert_eq!(
                    read_at(&cfg, &["cluster", "proxy", "image"])
                        .unwrap()
                        .as_deref(),
                    Some("registry.k8s.io/kube-proxy:v1.36.4")
                );
                // Three static pods, kube-proxy and the kubelet: five no-reboot applies.
                assert_eq!(rack.applies(cp), 5, "{cp}");
            }
            for (i, n) in NODES.into_iter().enumerate() {
                assert_eq!(rack.kubelet_version(n), "v1.36.4", "{n}");
                assert_eq!(rack.node(n).configured_boots(), boots[i], "{n} rebooted");
                for a in rack.node(n).apply_records() {
                    assert_eq!(a.effective, Mode::NoReboot, "{n}");
                }
            }
            assert_eq!(rack.applies("rack1-wk-04"), 1);
            // The order, from the doubles' own apply records: every apiserver before any
            // controller-manager, ..., every control plane's kubelet before any worker's.
            let mut applies: Vec<(std::time::Instant, String, String)> = Vec::new();
            for n in NODES {
                let mut prev: Option<String> = None;
                for a in rack.node(n).apply_records() {
                    let cfg = a.config.clone();
                    let what = ["apiServer", "controllerManager", "scheduler", "proxy"]
                        .into_iter()
                        .find(|k| {
                            read_at(&cfg, &["cluster", k, "image"]).unwrap()
                                != prev
                                    .as_deref()
                                    .and_then(|p| read_at(p, &["cluster", k, "image"]).unwrap())
                        })
                        .unwrap_or("kubelet");
                    applies.push((a.at, what.to_owned(), n.to_owned()));
                    prev = Some(cfg);
                }
            }
            applies.sort();
            let order: Vec<String> = applies.iter().map(|(_, w, n)| format!("{w}/{n}")).collect();
            let want: Vec<String> = rack
                .upgrade
                .steps
                .iter()
                .filter(|s| **s != K8sStep::Manifests)
                .map(|s| match s {
                    K8sStep::StaticPod { component, node } => format!(
                        "{}/{node}",
                        crate::sim::kubelet::STATIC_PODS
                            .iter()
                            .find(|(c, _)| c == component)
                            .unwrap()
                            .1
                    ),
                    K8sStep::KubeProxy { node } => format!("proxy/{node}"),
                    K8sStep::Kubelet { node } => format!("kubelet/{node}"),
                    K8sStep::Manifests => unreachable!(),
                })
                .collect();
            assert_eq!(order, want);
            assert!(
                record(&store, &rack)
                    .status
                    .values()
                    .all(|s| *s == NodeStatus::Done)
            );
        }

        /// Issue 26: a rack installed with the v1.14 contract on v1.14 doubles. The images
        /// live in the `Kube*Config` documents, which the double's kubelets, static pods and
        /// bootstrap manifests read (as Talos's config container resolves them); the upgrade
        /// patches each document, never brings a legacy field back, and every component
        /// comes up on the new version without a reboot.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_v1_14_contract_rack_is_upgraded_in_its_documents() {
            let (inv, _) = inv_secrets();
            let mut inv = inv.clone();
            inv.cluster.talos_version.value = "v1.14.0".parse().unwrap();
            let rack = rack_of(41, "1.37.0", &inv, "v1.14.0").await;
            let before = rack.node("rack1-cp-01").running_config().unwrap();
            assert!(before.contains("kind: KubeAPIServerConfig"), "{before}");
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            for _ in 0..1000 {
                if rack.kubelet_version("rack1-wk-01") == "v1.36.3" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(rack.kubelet_version("rack1-wk-01"), "v1.36.3");
            let boots: Vec<usize> = NODES
                .iter()
                .map(|n| rack.node(n).configured_boots())
                .collect();
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            let kind_image = |cfg: &str, kind: &str| -> Option<String> {
                yaml_serde::Deserializer::from_str(cfg)
                    .filter_map(|d| <yaml_serde::Value as serde::Deserialize>::deserialize(d).ok())
                    .find(|d| d.get("kind").and_then(|k| k.as_str()) == Some(kind))
                    .and_then(|d| d.get("image").and_then(|i| i.as_str()).map(str::to_owned))
            };
            for cp in &NODES[..3] {
                for (c, _) in crate::sim::kubelet::STATIC_PODS {
                    assert_eq!(rack.pod_image(c, cp), format!("{}:v1.37.0", image_repo(c)));
                }
                let cfg = rack.node(cp).running_config().unwrap();
                for (kind, image) in [
                    (
                        "KubeAPIServerConfig",
                        "registry.k8s.io/kube-apiserver:v1.37.0",
                    ),
                    (
                        "KubeControllerManagerConfig",
                        "registry.k8s.io/kube-controller-manager:v1.37.0",
                    ),
                    (
                        "KubeSchedulerConfig",
                        "registry.k8s.io/kube-scheduler:v1.37.0",
                    ),
                    ("KubeProxyConfig", "registry.k8s.io/kube-proxy:v1.37.0"),
                    ("KubeletConfig", "ghcr.io/siderolabs/kubelet:v1.37.0"),
                ] {
                    assert_eq!(
                        kind_image(&cfg, kind).as_deref(),
                        Some(image),
                        "{cp} {kind}"
                    );
                }
                for legacy in ["apiServer", "controllerManager", "scheduler", "proxy"] {
                    assert_eq!(
                        read_at(&cfg, &["cluster", legacy, "image"]).unwrap(),
                        None,
                        "{cp}: no legacy cluster.{legacy} came back"
                    );
                }
                assert_eq!(
                    read_at(&cfg, &["machine", "kubelet", "image"]).unwrap(),
                    None
                );
            }
            for (i, n) in NODES.into_iter().enumerate() {
                assert_eq!(rack.kubelet_version(n), "v1.37.0", "{n}");
                assert_eq!(rack.node(n).configured_boots(), boots[i], "{n} rebooted");
            }
            assert!(
                record(&store, &rack)
                    .status
                    .values()
                    .all(|s| *s == NodeStatus::Done)
            );
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_failing_node_stops_the_upgrade_and_a_restart_resumes_without_repeating() {
            let rack = rack_up(11).await;
            let dir = tempfile::tempdir().unwrap();
            // cp-02's controller-manager never comes back after its change.
            rack.kubelets
                .never_ready("rack1-cp-02", "kube-controller-manager");
            {
                let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
                match run_once(&rack, &store).await {
                    Outcome::Stopped { node, reason } => {
                        assert_eq!(node.as_deref(), Some("kube-controller-manager/rack1-cp-02"));
                        assert!(reason.contains("not Ready"), "{reason}");
                    }
                    other => panic!("{other:?}"),
                }
                let rec = record(&store, &rack);
                assert_eq!(rec.status["kube-apiserver/rack1-cp-03"], NodeStatus::Done);
                assert_eq!(
                    rec.status["kube-controller-manager/rack1-cp-01"],
                    NodeStatus::Done
                );
                assert!(matches!(
                    rec.status["kube-controller-manager/rack1-cp-02"],
                    NodeStatus::Failed { .. }
                ));
                assert_eq!(
                    rec.status["kube-controller-manager/rack1-cp-03"],
                    NodeStatus::Pending
                );
            }
            // Nothing after the failing step was touched.
            assert_eq!(rack.applies("rack1-cp-01"), 2);
            assert_eq!(rack.applies("rack1-cp-02"), 2);
            assert_eq!(rack.applies("rack1-cp-03"), 1);
            assert_eq!(rack.applies("rack1-wk-01"), 0);
            assert_eq!(rack.kubelet_version("rack1-cp-01"), "v1.36.3");

            // Also refuse cp-03's next apply: the resumed run stops there, at the patch.
            rack.kubelets.heal();
            rack.node("rack1-cp-03").refuse_next_apply("disk full");
            {
                let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
                match run_once(&rack, &store).await {
                    Outcome::Stopped { node, reason } => {
                        assert_eq!(node.as_deref(), Some("kube-controller-manager/rack1-cp-03"));
                        assert!(reason.contains("disk full"), "{reason}");
                    }
                    other => panic!("{other:?}"),
                }
            }
            // cp-02's step was reconciled (its config already had the image), not applied again.
            assert_eq!(rack.applies("rack1-cp-02"), 2);

            // Fixed; a new process resumes from the store and finishes.
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            assert_eq!(rack.applies("rack1-cp-01"), 5, "no step applied twice");
            assert_eq!(rack.applies("rack1-cp-02"), 5, "no step applied twice");
            assert_eq!(rack.applies("rack1-wk-01"), 1);
            for n in NODES {
                assert_eq!(rack.kubelet_version(n), "v1.36.4", "{n}");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_kubelet_that_never_reports_the_new_version_fails_its_gate() {
            let rack = rack_up(21).await;
            let dir = tempfile::tempdir().unwrap();
            rack.kubelets
                .never_ready("rack1-wk-01", crate::sim::kubelet::KUBELET);
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            match run_once(&rack, &store).await {
                Outcome::Stopped { node, reason } => {
                    assert_eq!(node.as_deref(), Some("kubelet/rack1-wk-01"));
                    assert!(reason.contains("node version mismatch"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(
                rack.applies("rack1-wk-04"),
                0,
                "the next worker was not touched"
            );
        }

        /// talosctl refuses a Kubernetes its Talos does not run before any change.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_kubernetes_the_nodes_talos_does_not_run_is_refused() {
            let rack = rack_up_to(41, "1.37.0").await;
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            match run_once(&rack, &store).await {
                Outcome::Stopped { node: None, reason } => assert!(
                    reason.contains(
                        "node rack1-cp-01: version of Kubernetes 1.37.0 is too new to be used \
                         with Talos 1.13.9"
                    ),
                    "{reason}"
                ),
                other => panic!("{other:?}"),
            }
            for n in NODES {
                assert_eq!(rack.applies(n), 0, "{n}");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_cluster_with_a_not_ready_node_is_not_upgraded() {
            let rack = rack_up(31).await;
            rack.kube.set_node_ready("rack1-wk-04", false);
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            match run_once(&rack, &store).await {
                Outcome::Stopped { node: None, reason } => {
                    assert!(reason.contains("Node rack1-wk-04 is not Ready"), "{reason}")
                }
                other => panic!("{other:?}"),
            }
            for n in NODES {
                assert_eq!(rack.applies(n), 0, "{n}");
            }
        }

        /// `text` with `cluster.<component>.disabled` set.
        fn with_disabled(text: &str, component: &str, disabled: bool) -> String {
            let mut docs = Vec::new();
            for doc in yaml_serde::Deserializer::from_str(text) {
                let mut v = <yaml_serde::Value as serde::Deserialize>::deserialize(doc).unwrap();
                if v.get("version").and_then(|v| v.as_str()) == Some("v1alpha1") {
                    let cluster = v.get_mut("cluster").unwrap().as_mapping_mut().unwrap();
                    let c = cluster
                        .entry(yaml_serde::Value::from(component))
                        .or_insert(yaml_serde::Value::Mapping(Default::default()));
                    c.as_mapping_mut()
                        .unwrap()
                        .insert("disabled".into(), yaml_serde::Value::Bool(disabled));
                }
                docs.push(yaml_serde::to_string(&v).unwrap());
            }
            docs.join("---\n")
        }

        /// Every control plane runs kube-proxy (the rack's Cilium replaces it, so Talos would
        /// render no kube-proxy DaemonSet otherwise).
        fn enable_kube_proxy(rack: &Rack) {
            for cp in &NODES[..3] {
                let node = rack.node(cp);
                let text = node.running_config().unwrap();
                node.set_running_config(&with_disabled(&text, "proxy", false));
            }
        }

        fn inventory(rack: &Rack) -> Vec<String> {
            let cm = rack
                .kube
                .object(
                    "v1",
                    "ConfigMap",
                    "kube-system",
                    "talos-bootstrap-manifests-inventory",
                )
                .expect("the inventory ConfigMap");
            let mut keys: Vec<String> = cm["data"]
                .as_object()
                .map(|d| d.keys().cloned().collect())
                .unwrap_or_default();
            keys.sort();
            keys
        }

        fn talos_applies(rack: &Rack) -> usize {
            rack.kube
                .applies()
                .iter()
                .filter(|a| a.field_manager == "talos")
                .count()
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_manifest_sync_rolls_kube_proxy_to_the_new_image_as_talos() {
            let rack = rack_up(51).await;
            enable_kube_proxy(&rack);
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            let ds = rack
                .kube
                .object("apps/v1", "DaemonSet", "kube-system", "kube-proxy")
                .expect("kube-proxy applied");
            assert_eq!(
                ds["spec"]["template"]["spec"]["containers"][0]["image"],
                "registry.k8s.io/kube-proxy:v1.36.4"
            );
            assert_eq!(ds["metadata"]["managedFields"][0]["manager"], "talos");
            assert_eq!(ds["metadata"]["managedFields"][0]["operation"], "Apply");
            assert_eq!(
                ds["metadata"]["annotations"]["config.k8s.io/owning-inventory"],
                "talos-bootstrap-manifests-inventory"
            );
            assert!(
                rack.kube
                    .applies()
                    .iter()
                    .filter(|a| a.field_manager == "talos")
                    .all(|a| a.force)
            );
            let coredns = rack
                .kube
                .object("apps/v1", "Deployment", "kube-system", "coredns")
                .unwrap();
            assert_eq!(
                coredns["spec"]["template"]["spec"]["containers"][0]["image"],
                "registry.k8s.io/coredns/coredns:v1.14.6"
            );
            let inv = inventory(&rack);
            for key in [
                "kube-system_kube-proxy_apps_DaemonSet",
                "kube-system_coredns_apps_Deployment",
                "_system__coredns_rbac.authorization.k8s.io_ClusterRole",
                "kube-system_kube-dns__Service",
            ] {
                assert!(inv.contains(&key.to_owned()), "{key}: {inv:?}");
            }
            assert_eq!(record(&store, &rack).status["manifests"], NodeStatus::Done);
            // Run again from the store: the recorded sync is not done again.
            let applied = talos_applies(&rack);
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            assert_eq!(talos_applies(&rack), applied, "the sync ran again");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_manifest_gone_from_the_set_is_pruned_unless_no_prune() {
            let rack = rack_up(61).await;
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            let dns = || {
                rack.kube
                    .object("apps/v1", "Deployment", "kube-system", "coredns")
                    .is_some()
            };
            assert!(dns());
            // CoreDNS disabled on the control plane the manifests are read from: Talos no
            // longer renders 11-core-dns and 11-core-dns-svc.
            let cp = rack.node("rack1-cp-01");
            cp.set_running_config(&with_disabled(
                &cp.running_config().unwrap(),
                "coreDNS",
                true,
            ));
            let ops = ops(&rack, false).await;
            let diff = crate::daytwo::manifests::describe(&ops.manifests_diff().await.unwrap());
            assert!(
                diff.contains(&"pruned Deployment/kube-system/coredns".to_owned()),
                "{diff:?}"
            );
            // --no-prune (a fresh upgrade record: every image step is already done).
            let dir2 = tempfile::tempdir().unwrap();
            let store2 = crate::store::open(dir2.path()).unwrap().split().1.rollouts;
            assert_eq!(run_pruning(&rack, &store2, true).await, Outcome::Finished);
            assert!(dns(), "kept with --no-prune");
            assert!(inventory(&rack).contains(&"kube-system_coredns_apps_Deployment".to_owned()));
            let dir3 = tempfile::tempdir().unwrap();
            let store3 = crate::store::open(dir3.path()).unwrap().split().1.rollouts;
            assert_eq!(run_once(&rack, &store3).await, Outcome::Finished);
            assert!(!dns(), "pruned");
            assert!(
                rack.kube
                    .object("v1", "Service", "kube-system", "kube-dns")
                    .is_none()
            );
            let inv = inventory(&rack);
            assert!(
                !inv.iter()
                    .any(|k| k.contains("coredns") || k.contains("kube-dns")),
                "{inv:?}"
            );
            assert!(inv.contains(
                &"_system__talos-nodes_rbac.authorization.k8s.io_ClusterRole".to_owned()
            ));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_dry_run_lists_the_changes_and_changes_nothing() {
            let rack = rack_up(71).await;
            enable_kube_proxy(&rack);
            let objects = || rack.kube.resource_versions_but_kubelets();
            let before = objects();
            let ops = ops(&rack, false).await;
            let lines = crate::daytwo::manifests::describe(&ops.manifests_diff().await.unwrap());
            for want in [
                "created DaemonSet/kube-system/kube-proxy",
                "created Deployment/kube-system/coredns",
                "created ClusterRole/system:talos-nodes",
                "0 unchanged",
            ] {
                assert!(lines.contains(&want.to_owned()), "{want}: {lines:?}");
            }
            assert_eq!(objects(), before, "the dry run changed the cluster");
            assert!(
                rack.kube
                    .object(
                        "v1",
                        "ConfigMap",
                        "kube-system",
                        "talos-bootstrap-manifests-inventory"
                    )
                    .is_none()
            );
            assert_eq!(talos_applies(&rack), 0);
            // After a sync with the old kube-proxy image, a patched one shows as configured.
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            let cp = rack.node("rack1-cp-01");
            cp.set_running_config(
                &patch_at(
                    &cp.running_config().unwrap(),
                    &["cluster", "proxy", "image"],
                    "registry.k8s.io/kube-proxy:v1.36.5",
                )
                .unwrap(),
            );
            let lines = crate::daytwo::manifests::describe(&ops.manifests_diff().await.unwrap());
            assert_eq!(
                lines[..2],
                [
                    "configured DaemonSet/kube-system/kube-proxy".to_owned(),
                    format!("{} unchanged", inventory(&rack).len() - 1)
                ]
            );
        }

        /// Issue 31 item 5: Talos's bootstrap token Secret sets `stringData`, which the API
        /// server stores as `data` and never returns. After a sync, the dry run (the server's
        /// own dry-run apply, as `talosctl upgrade-k8s`) reports no change, where comparing
        /// the template with the live object reported `configured Secret/...` on every run.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn after_a_sync_the_dry_run_reports_no_change_for_stringdata() {
            use base64::Engine as _;
            let rack = rack_up(101).await;
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            let inv = inventory(&rack);
            let key = inv
                .iter()
                .find(|k| k.starts_with("kube-system_bootstrap-token-"))
                .unwrap_or_else(|| panic!("no bootstrap token Secret synced: {inv:?}"));
            let name = key
                .trim_start_matches("kube-system_")
                .trim_end_matches("__Secret");
            let secret = rack
                .kube
                .object("v1", "Secret", "kube-system", name)
                .expect("the bootstrap token Secret");
            assert!(secret.get("stringData").is_none(), "{secret}");
            let id = base64::engine::general_purpose::STANDARD
                .decode(secret["data"]["token-id"].as_str().unwrap())
                .unwrap();
            assert_eq!(
                format!("bootstrap-token-{}", String::from_utf8(id).unwrap()),
                name
            );
            let before = rack.kube.resource_versions_but_kubelets();
            let ops = ops(&rack, false).await;
            let lines = crate::daytwo::manifests::describe(&ops.manifests_diff().await.unwrap());
            assert_eq!(lines, [format!("{} unchanged", inv.len())]);
            assert_eq!(rack.kube.resource_versions_but_kubelets(), before);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_failing_apply_stops_the_sync_naming_the_object_and_a_resume_finishes() {
            let rack = rack_up(81).await;
            rack.kube.refuse_applies(
                "Deployment",
                "kube-system",
                "coredns",
                Some("spec.replicas: Invalid value: -1"),
            );
            let dir = tempfile::tempdir().unwrap();
            {
                let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
                match run_once(&rack, &store).await {
                    Outcome::Stopped { node, reason } => {
                        assert_eq!(node.as_deref(), Some("manifests"));
                        assert!(
                            reason.contains("Deployment/kube-system/coredns"),
                            "{reason}"
                        );
                        assert!(reason.contains("Invalid value: -1"), "{reason}");
                    }
                    other => panic!("{other:?}"),
                }
                let rec = record(&store, &rack);
                assert_eq!(rec.status["kubelet/rack1-wk-04"], NodeStatus::Done);
                assert!(matches!(rec.status["manifests"], NodeStatus::Failed { .. }));
            }
            // The server refuses the dry run as it would the apply, and go-kubernetes' Apply
            // dry-runs every object before applying any: nothing was applied, the inventory
            // is there and empty.
            assert!(inventory(&rack).is_empty());
            assert_eq!(talos_applies(&rack), 0);
            rack.kube
                .refuse_applies("Deployment", "kube-system", "coredns", None);
            let applies: Vec<usize> = NODES.iter().map(|n| rack.applies(n)).collect();
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            assert_eq!(run_once(&rack, &store).await, Outcome::Finished);
            assert!(
                rack.kube
                    .object("apps/v1", "Deployment", "kube-system", "coredns")
                    .is_some()
            );
            let after: Vec<usize> = NODES.iter().map(|n| rack.applies(n)).collect();
            assert_eq!(after, applies, "no node step ran again");
        }

        /// The manifests are not sensitive: an os:reader client lists them; a worker renders
        /// none (only control planes have the bootstrap manifests config).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_reader_lists_a_control_planes_manifests_and_a_worker_has_none() {
            let rack = rack_up(91).await;
            let (_, secrets) = inv_secrets();
            let os = secrets.os_ca();
            let leaf = crate::sim::pki::SimCa::from_pem(&os.crt, &os.key)
                .unwrap()
                .client(
                    &["os:reader"],
                    vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
                )
                .unwrap();
            let reader = ClientCreds {
                ca_pem: os.crt.clone().into_bytes(),
                crt_pem: leaf.cert_pem.into_bytes(),
                key_pem: leaf.key_pem.into_bytes(),
            };
            let cp = TalosClient::secured(rack.node("rack1-cp-01").addr(), &reader).unwrap();
            let objects = crate::daytwo::manifest_sync::fetch(&cp).await.unwrap();
            assert!(
                objects
                    .iter()
                    .any(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "coredns"),
                "{objects:?}"
            );
            let wk = TalosClient::secured(rack.node("rack1-wk-01").addr(), &reader).unwrap();
            assert!(
                crate::daytwo::manifest_sync::fetch(&wk)
                    .await
                    .unwrap()
                    .is_empty()
            );
        }
    }
}
