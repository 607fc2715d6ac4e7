//! The Kubernetes API adapter (kube-rs): a client from the admin kubeconfig, server-side apply
//! of arbitrary objects with field manager `talboot` (or `helm` for a release's objects), the
//! API server's `Warning` headers kept per apply (a tower layer, [`super::warnings`]), kind
//! resolution through discovery
//! (cached, and refreshed once new CRDs are Established), and readiness waits — CRD
//! Established, Deployment available, DaemonSet and StatefulSet rolled out, all Nodes
//! Ready — each bounded
//! by one `tokio::time::timeout` around the whole wait, requests included.
//!
//! The readiness rules themselves are pure functions over the object JSON, so they are unit
//! tested without a server.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{ApiCapabilities, Scope};
use kube::{Client, Config};
use serde_json::Value;

use super::manifest::ObjectRef;
use super::warnings::{WarningLayer, WarningLog};

/// The field manager talboot applies with.
pub(crate) const FIELD_MANAGER: &str = "talboot";

/// The field manager of a Helm release's objects: the name the `helm` CLI gives its own
/// writes (helm/helm v4.1.4 cmd/helm/helm.go sets `kube.ManagedFieldsManager = "helm"`), so
/// what talboot applies for a release is owned exactly as a `helm install` leaves it and a
/// later `helm upgrade` applies as the same manager: no conflicts.
pub(crate) const HELM_FIELD_MANAGER: &str = "helm";

/// Errors talking to the Kubernetes API.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig could not be used.
    #[error(
        "cannot use the admin kubeconfig: {0} (it must be a kubeconfig with a server URL, CA data and client credentials)"
    )]
    Kubeconfig(String),
    /// The API server does not serve a kind.
    #[error(
        "the API server does not serve {kind} in {api_version}: {reason} \
         (is the CRD that defines it part of the manifest set and Established?)"
    )]
    UnknownKind {
        /// apiVersion of the object.
        api_version: String,
        /// kind of the object.
        kind: String,
        /// What discovery said.
        reason: String,
    },
    /// A request about one object failed.
    #[error("{action} {object} failed: {reason}")]
    Request {
        /// `apply`, `get`, `list`.
        action: &'static str,
        /// The object.
        object: String,
        /// The API server's answer.
        reason: String,
    },
    /// A wait ran out of time.
    #[error("timed out after {after:?} waiting for {what}; last seen: {last}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout.
        after: Duration,
        /// The last state observed, to tell the operator where it stuck.
        last: String,
    },
}

/// Builds a client from kubeconfig YAML (its current context). The API server's `Warning`
/// headers are logged (kube-rs itself drops them); [`Kube::from_kubeconfig`] also keeps them.
pub async fn client_from_kubeconfig(yaml: &[u8]) -> Result<Client, KubeError> {
    client_with_warnings(yaml, WarningLog::default()).await
}

/// [`client_from_kubeconfig`], recording the server's warnings into `log`.
async fn client_with_warnings(yaml: &[u8], log: WarningLog) -> Result<Client, KubeError> {
    let text = std::str::from_utf8(yaml)
        .map_err(|_| KubeError::Kubeconfig("it is not UTF-8 text".into()))?;
    let kc = Kubeconfig::from_yaml(text).map_err(|e| KubeError::Kubeconfig(e.to_string()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| KubeError::Kubeconfig(e.to_string()))?;
    Ok(ClientBuilder::try_from(config)
        .map_err(|e| KubeError::Kubeconfig(e.to_string()))?
        .with_layer(&WarningLayer::new(log))
        .build())
}

/// The outcome of applying one object. `Debug` shows the reference only: the body may be a
/// Secret.
#[derive(Clone)]
pub struct Applied {
    /// The object, namespace resolved.
    pub reference: ObjectRef,
    /// The body sent (namespace filled in for namespaced kinds, removed for cluster ones).
    pub body: Value,
    /// Whether the server changed the object (created it or bumped its resourceVersion).
    pub changed: bool,
    /// The server's `Warning`s on the apply (e.g. PodSecurity findings), when the session
    /// keeps them ([`Kube::from_kubeconfig`]).
    pub warnings: Vec<String>,
}

/// Resolved kinds by (group, version, kind).
type KindCache = HashMap<(String, String, String), (ApiResource, ApiCapabilities)>;

impl std::fmt::Debug for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applied")
            .field("reference", &self.reference)
            .field("changed", &self.changed)
            .finish_non_exhaustive()
    }
}

/// A Kubernetes API session: client plus a discovery cache.
pub struct Kube {
    client: Client,
    warnings: WarningLog,
    kinds: Mutex<KindCache>,
    /// How often waits poll.
    pub poll_interval: Duration,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube")
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

fn request_err(action: &'static str, object: &impl std::fmt::Display, e: kube::Error) -> KubeError {
    let reason = match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    };
    KubeError::Request {
        action,
        object: object.to_string(),
        reason,
    }
}

impl Kube {
    /// A session over `client`, polling waits every `poll_interval`.
    pub fn new(client: Client, poll_interval: Duration) -> Self {
        Kube {
            client,
            warnings: WarningLog::default(),
            kinds: Mutex::new(HashMap::new()),
            poll_interval,
        }
    }

    /// A session from kubeconfig YAML whose applies report the server's warnings
    /// ([`Applied::warnings`]).
    pub async fn from_kubeconfig(yaml: &[u8], poll_interval: Duration) -> Result<Self, KubeError> {
        let warnings = WarningLog::default();
        let client = client_with_warnings(yaml, warnings.clone()).await?;
        Ok(Kube {
            warnings,
            ..Kube::new(client, poll_interval)
        })
    }

    /// Forgets every resolved kind, so the next lookups see kinds added since (new CRDs).
    pub(crate) fn refresh_discovery(&self) {
        self.kinds.lock().expect("discovery cache").clear();
    }

    async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, ApiCapabilities), KubeError> {
        let (group, version) = match api_version.rsplit_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let key = (group.to_owned(), version.to_owned(), kind.to_owned());
        if let Some(hit) = self.kinds.lock().expect("discovery cache").get(&key) {
            return Ok(hit.clone());
        }
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let found = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| KubeError::UnknownKind {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                reason: match e {
                    kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
                    other => other.to_string(),
                },
            })?;
        self.kinds
            .lock()
            .expect("discovery cache")
            .insert(key, found.clone());
        Ok(found)
    }

    fn api(&self, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
        match ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    /// Server-side applies `obj` with field manager `talboot`, forcing ownership of
    /// conflicting fields. Namespaced objects without a namespace go to `default_ns`.
    pub async fn apply(&self, obj: &Value, default_ns: &str) -> Result<Applied, KubeError> {
        self.apply_as(obj, default_ns, FIELD_MANAGER).await
    }

    /// The client, for typed requests the generic calls here do not cover.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// [`Self::apply`] with another field manager (the bootstrap manifest sync applies as
    /// Talos does, `talos`).
    pub(crate) async fn apply_as(
        &self,
        obj: &Value,
        default_ns: &str,
        manager: &str,
    ) -> Result<Applied, KubeError> {
        let mut reference = ObjectRef::of(obj).ok_or_else(|| KubeError::Request {
            action: "apply",
            object: "an object without apiVersion/kind/metadata.name".into(),
            reason: "not a Kubernetes object".into(),
        })?;
        let (ar, caps) = self
            .resolve(&reference.api_version, &reference.kind)
            .await?;
        let mut body = obj.clone();
        match caps.scope {
            Scope::Namespaced => {
                let ns = reference
                    .namespace
                    .clone()
                    .unwrap_or_else(|| default_ns.to_owned());
                body["metadata"]["namespace"] = Value::String(ns.clone());
                reference.namespace = Some(ns);
            }
            Scope::Cluster => {
                if let Some(meta) = body["metadata"].as_object_mut() {
                    meta.remove("namespace");
                }
                reference.namespace = None;
            }
        }
        let api = self.api(&ar, reference.namespace.as_deref());
        let before = api
            .get_opt(&reference.name)
            .await
            .map_err(|e| request_err("get", &reference, e))?
            .and_then(|o| o.metadata.resource_version);
        let params = PatchParams::apply(manager).force();
        // Only this apply's warnings: drop what earlier requests of the session left.
        self.warnings.drain();
        let after = api
            .patch(&reference.name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| request_err("apply", &reference, e))?
            .metadata
            .resource_version;
        let warnings = self.warnings.drain().into_iter().map(|w| w.text).collect();
        // resourceVersion moves exactly when the server wrote the object: its content or its
        // managedFields changed (an unchanged apply is not written, etcd3 store.go
        // GuaranteedUpdate), which is the no-op rule docs/addons.md promises.
        let changed = before.is_none() || before != after;
        tracing::debug!(object = %reference, changed, "applied");
        Ok(Applied {
            reference,
            body,
            changed,
            warnings,
        })
    }

    /// Deletes one object with background propagation; `false` if it was already gone.
    pub(crate) async fn delete(&self, r: &ObjectRef) -> Result<bool, KubeError> {
        let (ar, caps) = self.resolve(&r.api_version, &r.kind).await?;
        let ns = match caps.scope {
            Scope::Namespaced => r.namespace.as_deref(),
            Scope::Cluster => None,
        };
        match self
            .api(&ar, ns)
            .delete(&r.name, &kube::api::DeleteParams::background())
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(request_err("delete", r, e)),
        }
    }

    /// Reads one object, `None` if it does not exist.
    pub async fn get(&self, r: &ObjectRef) -> Result<Option<Value>, KubeError> {
        let (ar, caps) = self.resolve(&r.api_version, &r.kind).await?;
        let ns = match caps.scope {
            Scope::Namespaced => r.namespace.as_deref(),
            Scope::Cluster => None,
        };
        let got = self
            .api(&ar, ns)
            .get_opt(&r.name)
            .await
            .map_err(|e| request_err("get", r, e))?;
        Ok(got.map(|o| serde_json::to_value(o).expect("objects serialise")))
    }

    /// What a forced server-side apply of `obj` by `manager` would leave, changing nothing
    /// (`dryRun=All`, as fluxcd/pkg ssa v0.73.0 `manager_apply.go` `dryRunApply`, which
    /// go-kubernetes' `Diff` and `Apply` use). `None` when the apply would create the object
    /// or cannot be tried yet: a kind not served (its CRD comes with the same set) or a 404
    /// such as a missing namespace, which go-kubernetes v0.2.38 `ssa/diff.go` counts as
    /// created. A created object has no `resourceVersion` in the answer, so that also gives
    /// `Some` without one.
    pub(crate) async fn dry_run_apply_as(
        &self,
        obj: &Value,
        default_ns: &str,
        manager: &str,
    ) -> Result<Option<Value>, KubeError> {
        let mut reference = ObjectRef::of(obj).ok_or_else(|| KubeError::Request {
            action: "dry-run apply",
            object: "an object without apiVersion/kind/metadata.name".into(),
            reason: "not a Kubernetes object".into(),
        })?;
        let (ar, caps) = match self.resolve(&reference.api_version, &reference.kind).await {
            Ok(found) => found,
            Err(KubeError::UnknownKind { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut body = obj.clone();
        match caps.scope {
            Scope::Namespaced => {
                let ns = reference
                    .namespace
                    .clone()
                    .unwrap_or_else(|| default_ns.to_owned());
                body["metadata"]["namespace"] = Value::String(ns.clone());
                reference.namespace = Some(ns);
            }
            Scope::Cluster => {
                if let Some(meta) = body["metadata"].as_object_mut() {
                    meta.remove("namespace");
                }
                reference.namespace = None;
            }
        }
        let mut params = PatchParams::apply(manager).force();
        params.dry_run = true;
        match self
            .api(&ar, reference.namespace.as_deref())
            .patch(&reference.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(o) => Ok(Some(serde_json::to_value(o).expect("objects serialise"))),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(request_err("dry-run apply", &reference, e)),
        }
    }

    /// Every `group/version` the API server serves (core `v1` included), sorted: what
    /// `helm install` would see as `.Capabilities.APIVersions`, for `helm template
    /// --api-versions`. CRD-provided APIs (e.g. `cilium.io/v2` once Cilium is in) count.
    pub(crate) async fn api_versions(&self) -> Result<Vec<String>, KubeError> {
        let err = |e| request_err("discover", &"the served API versions", e);
        let mut out: Vec<String> = self
            .client
            .list_core_api_versions()
            .await
            .map_err(err)?
            .versions;
        for group in self.client.list_api_groups().await.map_err(err)?.groups {
            out.extend(group.versions.into_iter().map(|v| v.group_version));
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    async fn get_typed<K>(&self, ns: Option<&str>, name: &str) -> Result<Value, NotReady>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let ar = ApiResource::erase::<K>(&());
        match self.api(&ar, ns).get_opt(name).await {
            Ok(Some(o)) => Ok(serde_json::to_value(o).expect("objects serialise")),
            Ok(None) => Err(NotReady::NotFound),
            Err(e) => Err(NotReady::Request(e)),
        }
    }

    /// Polls the object `name` of kind `K` (in `ns`, or cluster-wide) until `ready` accepts it.
    async fn wait_object<K>(
        &self,
        ns: Option<&str>,
        name: &str,
        what: &str,
        timeout: Duration,
        ready: fn(&Value) -> Result<(), NotReady>,
    ) -> Result<(), KubeError>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        poll_until(what, timeout, self.poll_interval, || async {
            ready(&self.get_typed::<K>(ns, name).await?)
        })
        .await
    }

    /// Every Node, as JSON values.
    async fn list_nodes(&self) -> Result<Vec<Value>, NotReady> {
        let ar = ApiResource::erase::<Node>(&());
        let list = self
            .api(&ar, None)
            .list(&ListParams::default())
            .await
            .map_err(NotReady::Request)?;
        Ok(list
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).expect("objects serialise"))
            .collect())
    }

    /// Polls the Node list until `ready` accepts it.
    async fn wait_nodes<F>(&self, what: &str, timeout: Duration, ready: F) -> Result<(), KubeError>
    where
        F: Fn(&[Value]) -> Result<(), NotReady>,
    {
        poll_until(what, timeout, self.poll_interval, || async {
            ready(&self.list_nodes().await?)
        })
        .await
    }

    /// Waits until the CRD `name` is Established.
    pub async fn wait_crd_established(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let what = format!("CustomResourceDefinition {name} to be Established");
        self.wait_object::<CustomResourceDefinition>(None, name, &what, timeout, crd_established)
            .await
    }

    /// Waits until the Deployment is available at its current generation.
    pub(crate) async fn wait_deployment(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let what = format!("Deployment {ns}/{name} to be available");
        self.wait_object::<Deployment>(Some(ns), name, &what, timeout, deployment_available)
            .await
    }

    /// Waits until the DaemonSet has rolled out its current generation to every node.
    pub(crate) async fn wait_daemonset(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let what = format!("DaemonSet {ns}/{name} to roll out");
        self.wait_object::<DaemonSet>(Some(ns), name, &what, timeout, daemonset_rolled_out)
            .await
    }

    /// Waits until the StatefulSet has every replica updated and ready.
    pub(crate) async fn wait_statefulset(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let what = format!("StatefulSet {ns}/{name} to roll out");
        self.wait_object::<StatefulSet>(Some(ns), name, &what, timeout, statefulset_rolled_out)
            .await
    }

    /// Waits until there is at least one Node and every Node is Ready (the CNI is what makes
    /// nodes Ready, so this is the real "Cilium works" signal).
    pub async fn wait_nodes_ready(&self, timeout: Duration) -> Result<(), KubeError> {
        self.wait_nodes("all Nodes to be Ready", timeout, nodes_ready)
            .await
    }

    /// Waits until every Node named in `names` is registered and Ready: the inventory's
    /// machines, so a node still installing keeps the cluster from being called ready.
    pub(crate) async fn wait_named_nodes_ready(
        &self,
        names: &[String],
        timeout: Duration,
    ) -> Result<(), KubeError> {
        self.wait_nodes(
            "every inventory node to register and be Ready",
            timeout,
            |nodes| named_nodes_ready(nodes, names),
        )
        .await
    }
}

/// Polls `probe` every `interval` until it says ready, all inside one `timeout`: a request
/// that hangs cannot stretch the wait. Probe errors count as "not yet" (the API server may
/// blip while the CNI comes up) and are reported as the last state on timeout.
async fn poll_until<F, Fut, E>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<(), KubeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let last = Mutex::new(String::from("nothing yet"));
    let attempt = async {
        loop {
            match probe().await {
                Ok(()) => return,
                Err(state) => *last.lock().expect("last state") = state.to_string(),
            }
            tokio::time::sleep(interval).await;
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(()) => {
            tracing::info!(what, "ready");
            Ok(())
        }
        Err(_) => Err(KubeError::Timeout {
            what: what.to_owned(),
            after: timeout,
            last: last.into_inner().expect("last state"),
        }),
    }
}

/// Why an object (or the Node list) is not ready yet: what a wait reports as the last state
/// seen when it times out.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotReady {
    /// The object does not exist (yet).
    #[error("not found")]
    NotFound,
    /// The API server did not answer the probe (it may blip while the CNI comes up).
    #[error("{0}")]
    Request(kube::Error),
    /// The controller has not seen the current generation.
    #[error("observedGeneration {observed} behind generation {generation}")]
    GenerationBehind {
        /// `status.observedGeneration`.
        observed: i64,
        /// `metadata.generation`.
        generation: i64,
    },
    /// The CRD's `Established` condition is not `True`.
    #[error("Established={0}")]
    NotEstablished(String),
    /// The CRD has no `Established` condition.
    #[error("no Established condition yet")]
    NoEstablishedCondition,
    /// A Deployment's replicas are not all updated and available.
    #[error("{updated} updated, {available} available of {want} replicas")]
    Replicas {
        /// Updated replicas.
        updated: i64,
        /// Available replicas.
        available: i64,
        /// Desired replicas.
        want: i64,
    },
    /// A Deployment's `Available` condition is not `True`.
    #[error("condition Available is not True")]
    NotAvailable,
    /// A DaemonSet is not on every node it is scheduled to.
    #[error("{updated} updated, {available} available of {desired} scheduled")]
    Scheduled {
        /// Updated pods.
        updated: i64,
        /// Available pods.
        available: i64,
        /// Scheduled pods.
        desired: i64,
    },
    /// A StatefulSet's replicas are not all updated and ready.
    #[error("{updated} updated, {ready} ready of {want} replicas")]
    ReadyReplicas {
        /// Updated replicas.
        updated: i64,
        /// Ready replicas.
        ready: i64,
        /// Desired replicas.
        want: i64,
    },
    /// A StatefulSet's current revision is not the update revision.
    #[error("revision {current} not yet updated to {update}")]
    Revision {
        /// `status.currentRevision`.
        current: String,
        /// `status.updateRevision`.
        update: String,
    },
    /// No Node has registered.
    #[error("no Nodes registered")]
    NoNodes,
    /// Nodes missing or not Ready.
    #[error("{}", node_problems(.missing, .not_ready))]
    Nodes {
        /// Named Nodes that have not registered.
        missing: Vec<String>,
        /// Nodes that are not Ready.
        not_ready: Vec<String>,
    },
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn generation_observed(obj: &Value) -> Result<(), NotReady> {
    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(0);
    let observed = obj["status"]["observedGeneration"].as_i64().unwrap_or(-1);
    if observed < generation {
        return Err(NotReady::GenerationBehind {
            observed,
            generation,
        });
    }
    Ok(())
}

/// A CRD is usable once its `Established` condition is `True`.
pub(crate) fn crd_established(crd: &Value) -> Result<(), NotReady> {
    match condition(crd, "Established") {
        Some(c) if c["status"] == "True" => Ok(()),
        Some(c) => Err(NotReady::NotEstablished(c["status"].to_string())),
        None => Err(NotReady::NoEstablishedCondition),
    }
}

/// A Deployment is available when the controller has seen its generation, every desired
/// replica is updated and available, and its `Available` condition is `True`.
pub(crate) fn deployment_available(d: &Value) -> Result<(), NotReady> {
    generation_observed(d)?;
    let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &d["status"];
    let updated = status["updatedReplicas"].as_i64().unwrap_or(0);
    let available = status["availableReplicas"].as_i64().unwrap_or(0);
    if updated < want || available < want {
        return Err(NotReady::Replicas {
            updated,
            available,
            want,
        });
    }
    match condition(d, "Available") {
        Some(c) if c["status"] == "True" => Ok(()),
        _ => Err(NotReady::NotAvailable),
    }
}

/// A DaemonSet has rolled out when the controller has seen its generation and
/// `updatedNumberScheduled == desiredNumberScheduled == numberAvailable` (kube-runtime has no
/// such condition; this is what `kubectl rollout status` checks).
pub(crate) fn daemonset_rolled_out(ds: &Value) -> Result<(), NotReady> {
    generation_observed(ds)?;
    let s = &ds["status"];
    let desired = s["desiredNumberScheduled"].as_i64().unwrap_or(0);
    let updated = s["updatedNumberScheduled"].as_i64().unwrap_or(0);
    let available = s["numberAvailable"].as_i64().unwrap_or(0);
    if updated == desired && available == desired {
        Ok(())
    } else {
        Err(NotReady::Scheduled {
            updated,
            available,
            desired,
        })
    }
}

/// A StatefulSet has rolled out when the controller has seen its generation, every desired
/// replica is updated and ready, and (when reported) the current revision is the update
/// revision, as `kubectl rollout status` checks for the RollingUpdate strategy.
pub(crate) fn statefulset_rolled_out(sts: &Value) -> Result<(), NotReady> {
    generation_observed(sts)?;
    let want = sts["spec"]["replicas"].as_i64().unwrap_or(1);
    let s = &sts["status"];
    let ready = s["readyReplicas"].as_i64().unwrap_or(0);
    let updated = s["updatedReplicas"].as_i64().unwrap_or(0);
    if ready < want || updated < want {
        return Err(NotReady::ReadyReplicas {
            updated,
            ready,
            want,
        });
    }
    match (s["currentRevision"].as_str(), s["updateRevision"].as_str()) {
        (Some(c), Some(u)) if c != u => Err(NotReady::Revision {
            current: c.to_owned(),
            update: u.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// All Nodes are Ready (and there is at least one).
pub(crate) fn nodes_ready(nodes: &[Value]) -> Result<(), NotReady> {
    if nodes.is_empty() {
        return Err(NotReady::NoNodes);
    }
    let not_ready: Vec<String> = nodes
        .iter()
        .filter(|n| !matches!(condition(n, "Ready"), Some(c) if c["status"] == "True"))
        .map(|n| n["metadata"]["name"].as_str().unwrap_or("?").to_owned())
        .collect();
    if not_ready.is_empty() {
        Ok(())
    } else {
        Err(NotReady::Nodes {
            missing: Vec::new(),
            not_ready,
        })
    }
}

/// Every Node in `names` is registered and Ready (other Nodes do not matter).
pub(crate) fn named_nodes_ready(nodes: &[Value], names: &[String]) -> Result<(), NotReady> {
    let mut missing = Vec::new();
    let mut not_ready = Vec::new();
    for name in names {
        match nodes
            .iter()
            .find(|n| n["metadata"]["name"].as_str() == Some(name.as_str()))
        {
            None => missing.push(name.clone()),
            Some(n) if !matches!(condition(n, "Ready"), Some(c) if c["status"] == "True") => {
                not_ready.push(name.clone())
            }
            Some(_) => {}
        }
    }
    if missing.is_empty() && not_ready.is_empty() {
        Ok(())
    } else {
        Err(NotReady::Nodes { missing, not_ready })
    }
}

/// `not registered: a, b; not Ready: c`, leaving out an empty half.
fn node_problems(missing: &[String], not_ready: &[String]) -> String {
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("not registered: {}", missing.join(", ")));
    }
    if !not_ready.is_empty() {
        problems.push(format!("not Ready: {}", not_ready.join(", ")));
    }
    problems.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn crd_established_reads_the_condition() {
        assert!(crd_established(&json!({})).is_err());
        let no = json!({"status":{"conditions":[{"type":"Established","status":"False"}]}});
        assert!(crd_established(&no).is_err());
        let yes = json!({"status":{"conditions":[
            {"type":"NamesAccepted","status":"True"},{"type":"Established","status":"True"}]}});
        assert!(crd_established(&yes).is_ok());
    }

    #[test]
    fn deployment_needs_generation_replicas_and_condition() {
        let mut d = json!({"metadata":{"generation":2},"spec":{"replicas":2},
            "status":{"observedGeneration":1,"updatedReplicas":2,"availableReplicas":2,
            "conditions":[{"type":"Available","status":"True"}]}});
        assert!(
            deployment_available(&d)
                .unwrap_err()
                .to_string()
                .contains("observedGeneration")
        );
        d["status"]["observedGeneration"] = json!(2);
        assert!(deployment_available(&d).is_ok());
        d["status"]["availableReplicas"] = json!(1);
        assert!(
            deployment_available(&d)
                .unwrap_err()
                .to_string()
                .contains("1 available of 2")
        );
        d["status"]["availableReplicas"] = json!(2);
        d["status"]["conditions"][0]["status"] = json!("False");
        assert!(deployment_available(&d).is_err());
    }

    #[test]
    fn daemonset_rollout_rule() {
        let mut ds = json!({"metadata":{"generation":1},"status":{"observedGeneration":1,
            "desiredNumberScheduled":3,"updatedNumberScheduled":3,"numberAvailable":2}});
        assert!(daemonset_rolled_out(&ds).is_err());
        ds["status"]["numberAvailable"] = json!(3);
        assert!(daemonset_rolled_out(&ds).is_ok());
        ds["metadata"]["generation"] = json!(2);
        assert!(daemonset_rolled_out(&ds).is_err());
    }

    #[test]
    fn statefulset_rollout_rule() {
        let mut sts = json!({"metadata":{"generation":3},"spec":{"replicas":2},
            "status":{"observedGeneration":3,"readyReplicas":2,"updatedReplicas":2,
            "currentRevision":"a","updateRevision":"b"}});
        assert!(
            statefulset_rolled_out(&sts)
                .unwrap_err()
                .to_string()
                .contains("revision a")
        );
        sts["status"]["currentRevision"] = json!("b");
        assert!(statefulset_rolled_out(&sts).is_ok());
        sts["status"]["readyReplicas"] = json!(1);
        assert!(statefulset_rolled_out(&sts).is_err());
    }

    #[test]
    fn nodes_ready_needs_all_and_some() {
        assert!(nodes_ready(&[]).is_err());
        let ready = json!({"metadata":{"name":"a"},
            "status":{"conditions":[{"type":"Ready","status":"True"}]}});
        let not = json!({"metadata":{"name":"b"},
            "status":{"conditions":[{"type":"Ready","status":"False"}]}});
        assert!(nodes_ready(std::slice::from_ref(&ready)).is_ok());
        assert_eq!(
            nodes_ready(&[ready.clone(), not.clone()])
                .unwrap_err()
                .to_string(),
            "not Ready: b"
        );
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(named_nodes_ready(std::slice::from_ref(&ready), &names(&["a"])).is_ok());
        assert_eq!(
            named_nodes_ready(&[ready.clone(), not.clone()], &names(&["a", "b", "c"]))
                .unwrap_err()
                .to_string(),
            "not registered: c; not Ready: b"
        );
        assert!(named_nodes_ready(&[ready, not], &names(&[])).is_ok());
    }

    #[tokio::test]
    async fn poll_until_times_out_with_the_last_state() {
        let mut n = 0;
        let err = poll_until(
            "x",
            Duration::from_millis(50),
            Duration::from_millis(5),
            || {
                n += 1;
                let state = format!("try {n}");
                async move { Err(state) }
            },
        )
        .await
        .unwrap_err();
        match err {
            KubeError::Timeout { last, .. } => assert!(last.starts_with("try ")),
            other => panic!("{other}"),
        }
        // A probe that never returns is still bounded by the timeout.
        let err = poll_until(
            "hang",
            Duration::from_millis(20),
            Duration::from_millis(5),
            std::future::pending::<Result<(), NotReady>>,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("nothing yet"), "{err}");
    }
}
