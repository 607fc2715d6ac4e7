//! The Kubernetes API double's state: the resources it serves (built-ins and established
//! CRDs), the stored objects, and how an object reads back (status the double derives, such as
//! node readiness once the CNI runs).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{ApplyRecord, CNI_NOT_READY, DoubleOptions, lock};

#[derive(Clone, Debug)]
pub(super) struct Res {
    pub(super) group: String,
    pub(super) version: String,
    pub(super) kind: String,
    pub(super) plural: String,
    pub(super) namespaced: bool,
}

impl Res {
    pub(super) fn new(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
    ) -> Self {
        Res {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
        }
    }

    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub(super) fn builtins() -> Vec<Res> {
    vec![
        Res::new("", "v1", "Namespace", "namespaces", false),
        Res::new("", "v1", "Node", "nodes", false),
        Res::new("", "v1", "Pod", "pods", true),
        Res::new("", "v1", "Secret", "secrets", true),
        Res::new("", "v1", "ConfigMap", "configmaps", true),
        Res::new("", "v1", "Service", "services", true),
        Res::new("", "v1", "ServiceAccount", "serviceaccounts", true),
        Res::new("apps", "v1", "Deployment", "deployments", true),
        Res::new("apps", "v1", "DaemonSet", "daemonsets", true),
        Res::new("apps", "v1", "StatefulSet", "statefulsets", true),
        Res::new(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
            true,
        ),
        Res::new(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
        ),
        Res::new(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
        ),
        Res::new("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
        Res::new(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
        ),
        Res::new(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        ),
    ]
}

/// (group, plural, namespace or "", name)
pub(super) type Key = (String, String, String, String);

#[derive(Clone)]
pub(super) struct Stored {
    pub(super) obj: Value,
    pub(super) manager: String,
    /// How the manager last wrote it: `Apply` (server-side apply) or `Update` (create,
    /// replace, or a kubelet's status write).
    pub(super) operation: &'static str,
    pub(super) ready_at: Instant,
}

pub(super) struct Cluster {
    pub(super) opts: DoubleOptions,
    pub(super) objects: BTreeMap<Key, Stored>,
    pub(super) rv: u64,
    pub(super) uid: u64,
    pub(super) never_ready: HashSet<(String, String)>,
    /// Applies refused with 422 Invalid: (kind, namespace, name) -> reason.
    pub(super) refused: BTreeMap<(String, String, String), String>,
    /// Nodes registered by a (simulated) kubelet: Ready only once the CNI runs and their
    /// `ready_at` has passed.
    pub(super) kubelet_nodes: HashSet<String>,
    pub(super) log: Vec<ApplyRecord>,
    /// Extra `Warning` headers on writes of (kind, namespace, name), as a webhook or a
    /// deprecation would add them ([`KubeDouble::warn_on`]).
    pub(super) warnings: BTreeMap<(String, String, String), String>,
}

pub(super) type Shared = Arc<Mutex<Cluster>>;

impl Cluster {
    /// Kinds of CRDs that are Established, one per served version: discovery lists a CRD's
    /// versions only once its Established condition is True and only the served ones
    /// (kubernetes/kubernetes staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/
    /// customresource_discovery_controller.go, sync).
    pub(super) fn established_crds(&self, now: Instant) -> Vec<Res> {
        let mut out = Vec::new();
        for ((group, plural, _, _), s) in &self.objects {
            if group != "apiextensions.k8s.io" || plural != "customresourcedefinitions" {
                continue;
            }
            if now < s.ready_at {
                continue;
            }
            let spec = &s.obj["spec"];
            let namespaced = spec["scope"] == "Namespaced";
            for v in spec["versions"].as_array().into_iter().flatten() {
                if v["served"] == false {
                    continue;
                }
                out.push(Res::new(
                    spec["group"].as_str().unwrap_or(""),
                    v["name"].as_str().unwrap_or(""),
                    spec["names"]["kind"].as_str().unwrap_or(""),
                    spec["names"]["plural"].as_str().unwrap_or(""),
                    namespaced,
                ));
            }
        }
        out
    }

    pub(super) fn served(&self, now: Instant) -> Vec<Res> {
        let mut all = builtins();
        all.extend(self.established_crds(now));
        all
    }

    pub(super) fn node_count(&self) -> i64 {
        self.nodes().count() as i64
    }

    pub(super) fn nodes(&self) -> impl Iterator<Item = (&str, &Stored)> {
        self.objects
            .iter()
            .filter(|((g, p, _, _), _)| g.is_empty() && p == "nodes")
            .map(|((_, _, _, name), s)| (name.as_str(), s))
    }

    /// Whether the configured CNI DaemonSet exists and has rolled out (true when none is
    /// configured).
    pub(super) fn cni_running(&self, now: Instant) -> bool {
        let Some((ns, name)) = &self.opts.cni_daemonset else {
            return true;
        };
        let key = ("apps".into(), "daemonsets".into(), ns.clone(), name.clone());
        self.objects.get(&key).is_some_and(|s| {
            now >= s.ready_at && !self.never_ready.contains(&(ns.clone(), name.clone()))
        })
    }

    /// Whether pods can run on a node: always for the static ones; for kubelet-registered
    /// ones once the CNI runs and the node's own start-up delay has passed.
    pub(super) fn node_runs_pods(&self, name: &str, s: &Stored, now: Instant) -> bool {
        !self.kubelet_nodes.contains(name) || (self.cni_running(now) && now >= s.ready_at)
    }

    /// The object as a client reads it: stored content plus a status computed from time.
    pub(super) fn view(&self, key: &Key, s: &Stored, now: Instant) -> Value {
        let mut obj = s.obj.clone();
        show_managed_fields(&mut obj, s);
        let ready =
            now >= s.ready_at && !self.never_ready.contains(&(key.2.clone(), key.3.clone()));
        // One arm per kind whose status the double computes; kept whole as the table of them.
        match (key.0.as_str(), key.1.as_str()) {
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                crd_status(&mut obj, now >= s.ready_at)
            }
            ("apps", "deployments") => deployment_status(&mut obj, ready),
            ("apps", "daemonsets") => self.daemonset_status(&mut obj, ready, now),
            ("", "nodes") if self.kubelet_nodes.contains(&key.3) => {
                self.node_status(&mut obj, &key.3, s, now)
            }
            ("apps", "statefulsets") => statefulset_status(&mut obj, &key.3, ready),
            ("", "namespaces") => obj["status"] = json!({"phase": "Active"}),
            _ => {}
        }
        obj
    }

    /// A DaemonSet's status: scheduled on every node, running (once rolled out) on the nodes
    /// that run pods.
    fn daemonset_status(&self, obj: &mut Value, ready: bool, now: Instant) {
        let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
        let desired = self.node_count();
        let running = if ready {
            self.nodes()
                .filter(|(name, n)| self.node_runs_pods(name, n, now))
                .count() as i64
        } else {
            0
        };
        obj["status"] = json!({
            "observedGeneration": generation,
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": desired,
            "updatedNumberScheduled": desired,
            "numberReady": running,
            "numberAvailable": running,
        });
    }

    /// A kubelet-registered Node's Ready condition. The kubelet reports NotReady while the
    /// runtime's NetworkReady condition is false (kubernetes/kubernetes pkg/kubelet/kubelet.go,
    /// updateRuntimeUp: "container runtime network not ready: ..."; the tail is containerd's
    /// CRI status, "Network plugin returns error: cni plugin not initialized").
    fn node_status(&self, obj: &mut Value, name: &str, s: &Stored, now: Instant) {
        let ready = self.node_runs_pods(name, s, now);
        let condition = if ready {
            json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
                   "message": "kubelet is posting ready status"})
        } else {
            json!({"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                   "message": CNI_NOT_READY})
        };
        // Only the condition is computed; what the kubelet posted besides it
        // (nodeInfo, see [`KubeDouble::set_kubelet_version`]) stays.
        obj["status"]["conditions"] = json!([condition]);
    }
}

/// Objects written through apply, create, replace or patch keep their managedFields as
/// structured-merge-diff computes them (see `kube_ssa`); an empty list is left out, as the
/// API encodes it (`omitempty`). Objects the simulated kubelets or the server wrote directly
/// show their last writer without fieldsV1.
fn show_managed_fields(obj: &mut Value, s: &Stored) {
    if let Some(meta) = obj["metadata"].as_object_mut() {
        match meta.get("managedFields") {
            Some(Value::Array(a)) if a.is_empty() => {
                meta.remove("managedFields");
            }
            Some(_) => {}
            None => {
                meta.insert(
                    "managedFields".into(),
                    json!([{"manager": s.manager, "operation": s.operation,
                            "apiVersion": s.obj["apiVersion"], "fieldsType": "FieldsV1"}]),
                );
            }
        }
    }
}

/// A CRD's status: its names accepted at once, Established once its delay has passed.
fn crd_status(obj: &mut Value, established: bool) {
    let established = if established { "True" } else { "False" };
    obj["status"] = json!({
        "acceptedNames": obj["spec"]["names"].clone(),
        "conditions": [
            {"type": "NamesAccepted", "status": "True"},
            {"type": "Established", "status": established},
        ],
    });
}

/// Workload status fields as their controllers write them and as `kubectl rollout status`
/// reads them (kubernetes/kubernetes staging/src/k8s.io/kubectl/pkg/polymorphichelpers/
/// rollout_status.go): observedGeneration catches up with generation, then the
/// updated/available counts reach the desired count. This is a Deployment's.
fn deployment_status(obj: &mut Value, ready: bool) {
    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
    let want = obj["spec"]["replicas"].as_i64().unwrap_or(1);
    let avail = if ready { want } else { 0 };
    obj["status"] = json!({
        "observedGeneration": generation,
        "replicas": want,
        "updatedReplicas": want,
        "readyReplicas": avail,
        "availableReplicas": avail,
        "conditions": [{"type": "Available",
                        "status": if ready { "True" } else { "False" }}],
    });
}

/// A StatefulSet's status (see [`deployment_status`] for the fields `kubectl rollout status`
/// reads), with the revision named after the generation.
fn statefulset_status(obj: &mut Value, name: &str, ready: bool) {
    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
    let want = obj["spec"]["replicas"].as_i64().unwrap_or(1);
    let revision = format!("{name}-{generation}");
    obj["status"] = json!({
        "observedGeneration": generation,
        "replicas": want,
        "updatedReplicas": want,
        "readyReplicas": if ready { want } else { 0 },
        "availableReplicas": if ready { want } else { 0 },
        "currentRevision": revision,
        "updateRevision": revision,
    });
}

impl Cluster {
    /// CRD-defined kinds whether Established or not (for test inspection only).
    pub(super) fn all_crd_kinds(&self) -> Vec<Res> {
        let far = Instant::now() + Duration::from_secs(3600 * 24);
        self.established_crds(far)
    }
}

pub(super) fn set_node(state: &Shared, name: &str, ready: bool) {
    let mut c = lock(state);
    c.kubelet_nodes.remove(name);
    c.rv += 1;
    let rv = c.rv.to_string();
    c.objects.insert(
        (String::new(), "nodes".into(), String::new(), name.into()),
        Stored {
            obj: json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "resourceVersion": rv, "uid": format!("uid-node-{name}")},
                "status": {"conditions": [{"type": "Ready",
                    "status": if ready { "True" } else { "False" }}]}}),
            manager: "kubelet".into(),
            operation: "Update",
            ready_at: Instant::now(),
        },
    );
}
