//! The kubelets of a simulated rack as the Kubernetes API double sees them: each node's
//! control-plane static pods (mirror Pods in `kube-system`) and its Node's kubelet version,
//! following the config the Talos double runs. Owns the per-node component state (image,
//! config version, when a restart finishes) and the fault hooks; the Talos double owns the
//! config, the Kubernetes double owns the objects.
//!
//! What it models, from siderolabs/talos v1.13.9:
//! - `internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go`: each static pod
//!   carries label `k8s-app: <component>` and annotation `talos.dev/config-version` (the
//!   version of the component's config resource, which changes with every config change of
//!   it; `pkg/machinery/constants/constants.go` `AnnotationStaticPodConfigVersion`), and the
//!   image from `cluster.<apiServer|controllerManager|scheduler>.image`;
//! - `pkg/cluster/kubernetes/kubelet.go`: the kubelet restarts when `machine.kubelet.image`
//!   changes and then posts the Node's `status.nodeInfo.kubeletVersion` (the image tag).
//!
//! On a v1.14-contract config the images come from `KubeAPIServerConfig`,
//! `KubeControllerManagerConfig`, `KubeSchedulerConfig` and `KubeletConfig` instead
//! ([`super::talos::config_view`], after v1.14.0-rc.1's `container.go`).
//!
//! A changed component is NotReady for [`KubeletOptions::restart`] and then Ready, unless a
//! test marked it never ready ([`Kubelets::never_ready`]): that is the fault a health gate
//! must catch.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::kube::KubeDouble;
use super::talos::RunningConfig;
use super::talos::config_view::ConfigView;

/// The static pods of a control plane, with the `cluster` key holding each one's image.
pub(crate) const STATIC_PODS: [(&str, &str); 3] = [
    ("kube-apiserver", "apiServer"),
    ("kube-controller-manager", "controllerManager"),
    ("kube-scheduler", "scheduler"),
];

/// The component name [`Kubelets::never_ready`] uses for the kubelet itself.
pub(crate) const KUBELET: &str = "kubelet";

/// Knobs.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// How long a component takes to come back after its image changed.
    pub restart: Duration,
    /// How often the running configs are looked at.
    pub poll: Duration,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            restart: Duration::from_millis(100),
            poll: Duration::from_millis(20),
        }
    }
}

/// One node the kubelets follow.
pub struct KubeletNode {
    pub hostname: String,
    pub ip: IpAddr,
    pub config: RunningConfig,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Component {
    image: String,
    config_version: u64,
    ready_at: Instant,
    /// What was last written to the double (image, version, ready), to write only changes.
    written: Option<(String, u64, bool)>,
}

/// The running simulation; dropping it stops it.
pub struct Kubelets {
    faults: Arc<Mutex<HashSet<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tag of an image reference (`registry/name:tag[@digest]`).
pub(crate) fn image_tag(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((_, tag)) if !tag.contains('/') => tag,
        _ => "",
    }
}

impl Kubelets {
    /// Follows `nodes`' running configs into `kube` until dropped.
    pub fn start(nodes: Vec<KubeletNode>, kube: Arc<KubeDouble>, opts: KubeletOptions) -> Self {
        let faults: Arc<Mutex<HashSet<(String, String)>>> = Arc::default();
        let f = faults.clone();
        let task = tokio::spawn(async move {
            let mut state: BTreeMap<(String, String), Component> = BTreeMap::new();
            loop {
                let now = Instant::now();
                let faulty = f.lock().map(|g| g.clone()).unwrap_or_default();
                for node in &nodes {
                    let Some(text) = node.config.get() else {
                        continue;
                    };
                    let view = ConfigView::new(&text);
                    let mut images: Vec<(&str, Option<String>)> = STATIC_PODS
                        .iter()
                        .map(|(c, key)| (*c, view.image(key)))
                        .collect();
                    images.push((KUBELET, view.image("kubelet")));
                    for (component, image) in images {
                        let Some(image) = image else { continue };
                        let key = (node.hostname.clone(), component.to_owned());
                        let c = state.entry(key.clone()).or_insert_with(|| Component {
                            image: image.clone(),
                            config_version: 1,
                            ready_at: now,
                            written: None,
                        });
                        if c.image != image {
                            c.image = image;
                            c.config_version += 1;
                            c.ready_at = now + opts.restart;
                        }
                        // A fault bites at the first change, not on the version it started on.
                        let stuck = faulty.contains(&key) && c.config_version > 1;
                        let ready = now >= c.ready_at && !stuck;
                        let want = (c.image.clone(), c.config_version, ready);
                        if c.written.as_ref() == Some(&want) {
                            continue;
                        }
                        if component == KUBELET {
                            // The restarted kubelet posts its version once it is up again.
                            if ready {
                                kube.set_kubelet_version(&node.hostname, image_tag(&c.image));
                            }
                        } else {
                            let name = format!("{component}-{}", node.hostname);
                            kube.put_object(
                                "",
                                "pods",
                                "kube-system",
                                &name,
                                mirror_pod(component, &name, node, c, ready),
                            );
                        }
                        c.written = Some(want);
                    }
                }
                tokio::time::sleep(opts.poll).await;
            }
        });
        Kubelets { faults, task }
    }

    /// `component` (a static pod name, or [`KUBELET`]) on `node` never comes back after its
    /// next change (a pod that stays NotReady; a kubelet that never posts the new version).
    pub fn never_ready(&self, node: &str, component: &str) {
        if let Ok(mut f) = self.faults.lock() {
            f.insert((node.to_owned(), component.to_owned()));
        }
    }

    /// Clears every fault.
    pub fn heal(&self) {
        if let Ok(mut f) = self.faults.lock() {
            f.clear();
        }
    }
}

/// The mirror Pod the kubelet creates for a static pod (named `<pod>-<node name>`, as the
/// kubelet names mirror pods: kubernetes/kubernetes `pkg/kubelet/config/common.go`,
/// `generatePodName`).
fn mirror_pod(
    component: &str,
    name: &str,
    node: &KubeletNode,
    c: &Component,
    ready: bool,
) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "kube-system",
            "uid": format!("uid-pod-{name}"),
            "labels": {"k8s-app": component, "tier": "control-plane"},
            "annotations": {"talos.dev/config-version": c.config_version.to_string()},
        },
        "spec": {
            "nodeName": node.hostname,
            "containers": [{"name": component, "image": c.image}],
        },
        "status": {
            "hostIP": node.ip.to_string(),
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags() {
        assert_eq!(
            image_tag("registry.k8s.io/kube-apiserver:v1.36.3"),
            "v1.36.3"
        );
        assert_eq!(
            image_tag("localhost:5000/kubelet:v1.36.3@sha256:ab"),
            "v1.36.3"
        );
        assert_eq!(image_tag("localhost:5000/kubelet"), "");
    }

    #[test]
    fn images_come_from_the_v1alpha1_document() {
        let text = "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n---\n\
                    version: v1alpha1\nmachine:\n  kubelet:\n    image: k:v1\ncluster:\n  \
                    apiServer:\n    image: a:v2\n";
        let view = ConfigView::new(text);
        assert_eq!(view.image("kubelet").as_deref(), Some("k:v1"));
        assert_eq!(view.image("apiServer").as_deref(), Some("a:v2"));
        assert_eq!(view.image("scheduler"), None);
    }
}
