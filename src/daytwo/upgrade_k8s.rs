//! `talboot upgrade --kubernetes`: the steps of a Kubernetes upgrade, in the order talosctl
//! takes them, and what it checks between them. Pure: the plan is computed from the
//! inventory and printed by `--dry-run`.
//!
//! From siderolabs/talos v1.13.9 `pkg/cluster/kubernetes/talos_managed.go` (`Upgrade`, called
//! by `cmd/talosctl/cmd/talos/upgrade-k8s.go`): after the version-compatibility and
//! pre-upgrade checks (and the optional image pre-pull), for each of kube-apiserver,
//! kube-controller-manager, kube-scheduler in that order, every control plane node one after
//! the other (`upgradeStaticPod`): patch the node's machine config with the new image, then
//! wait until the static pod's config-version annotation matches and the pod is Ready
//! (`checkPodStatus`); then kube-proxy's image is patched into every control plane's config
//! (`upgradeKubeProxy`, no wait); then the kubelet of every control plane, then of every
//! worker (`kubelet.go`, `upgradeKubelet`: patch, wait for the kubelet service to restart,
//! wait until the Node reports the new kubelet version); last, the bootstrap manifests are
//! synced (`PerformManifestsSync`).
//!
//! Applying the steps needs the configured-node ApplyConfiguration of the Talos double (the
//! apply helper's part); until that is merged, only the dry run exists.

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
    /// Patch the kubelet image on one node, then wait for the restart and the Node version.
    Kubelet { node: String },
    /// Sync the bootstrap manifests.
    Manifests,
}

/// The static pods, in the order talosctl upgrades them.
pub const STATIC_PODS: [&str; 3] = [
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
                "{node}: patch machine.kubelet image to {v}; wait for the kubelet to restart \
                 and the Node to report {v}"
            ),
            Self::Manifests => "sync the bootstrap manifests".to_owned(),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

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
}
