//! A Kubernetes API server double over HTTPS (rustls, ring; client certificates required),
//! strict where the real API server is strict, for `talboot demo` and the add-on tests:
//!
//! - discovery: `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`; kinds defined by a
//!   CRD are served only once that CRD is Established (a short, configurable delay after it
//!   is applied), and an unknown group/version/resource is 404;
//! - GET of one object or a list (a `labelSelector` of equality terms filters it), `/version`,
//!   and the OpenAPI v3 discovery clients read to leave field validation to the server;
//! - PATCH as server-side apply (`application/apply-patch+yaml`, a `fieldManager` else 422;
//!   body kind/name/namespace must match the URL) or as a strategic-merge, JSON-merge or JSON
//!   patch (anything else 415); field ownership as structured-merge-diff keeps it, with
//!   per-field conflicts (409) between managers, managers that own nothing dropped,
//!   `before-first-apply`, and the typed round trip (see [`super::kube_ssa`]); a string where
//!   a built-in type has a number is refused as the real server refuses it (500);
//! - create and replace bodies in JSON, or Kubernetes protobuf for Secrets (Helm's release
//!   storage sends that);
//! - `Warning` response headers: PodSecurity `restricted` findings for workloads in a
//!   Namespace labelled to warn or enforce, and any a test sets ([`KubeDouble::warn_on`]);
//! - a namespaced object in a missing Namespace is 404 NotFound, as the real server answers;
//! - Secret `data` values must be base64 (else 400, as the body cannot be decoded);
//! - resourceVersion changes only when the stored content really changes;
//! - Deployments, DaemonSets and StatefulSets report ready a short delay after each change, unless
//!   marked never-ready (a DaemonSet counts a node's pod available only once that node can
//!   run pods); Nodes carry a configurable Ready condition;
//! - Nodes can also register while it runs, as kubelets do when configured machines boot
//!   ([`KubeDouble::register_node`]); with [`DoubleOptions::cni_daemonset`] set, such a Node
//!   is NotReady ("container runtime network not ready ... cni plugin not initialized") until
//!   that DaemonSet exists and has rolled out, as on a real cluster where nodes become Ready
//!   only once the CNI runs.
//!
//! - POST (create), PUT (replace) and DELETE of one object, as client-go sends them for the
//!   bootstrap manifests' inventory ConfigMap and their prune; writers are recorded in
//!   `metadata.managedFields` as Update operations;
//! - a test may make the applies of one object fail ([`KubeDouble::refuse_applies`]).
//!
//! Every apply is logged (what, manager, force, whether it changed) for assertions.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rcgen::ExtendedKeyUsagePurpose;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::SimError;
use super::kube_ssa;
use super::pki::{PkiError, SimCa};

/// The Ready condition message of a kubelet whose node has no CNI yet.
pub(crate) const CNI_NOT_READY: &str = "container runtime network not ready: NetworkReady=false \
     reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

/// Locks the double's state; a poisoned lock means a handler already panicked.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock()
        .expect("the Kubernetes API double's lock is poisoned (a handler panicked)")
}

/// Knobs of the double.
#[derive(Clone, Debug)]
pub struct DoubleOptions {
    /// Where to listen (port 0: any free port). The server certificate carries this IP, and
    /// the kubeconfig points at the address really bound.
    pub bind: SocketAddr,
    /// How long after being applied a CRD becomes Established.
    pub crd_delay: Duration,
    /// How long after a change a Deployment, DaemonSet or StatefulSet reports ready.
    pub rollout_delay: Duration,
    /// Nodes and whether each is Ready.
    pub nodes: Vec<(String, bool)>,
    /// The CNI DaemonSet (namespace, name): Nodes added by [`KubeDouble::register_node`]
    /// stay NotReady until it exists and has rolled out. `None`: they are Ready at once.
    pub cni_daemonset: Option<(String, String)>,
}

impl Default for DoubleOptions {
    fn default() -> Self {
        DoubleOptions {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            crd_delay: Duration::from_millis(150),
            rollout_delay: Duration::from_millis(150),
            nodes: vec![("cp1".into(), true), ("w1".into(), true)],
            cni_daemonset: None,
        }
    }
}

/// One PATCH (apply) the double accepted.
#[derive(Clone, Debug)]
pub struct ApplyRecord {
    /// apiVersion.
    pub api_version: String,
    /// kind.
    pub kind: String,
    /// Namespace (empty for cluster scope).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The fieldManager query parameter.
    pub field_manager: String,
    /// Whether force was set.
    pub force: bool,
    /// Whether the stored object changed.
    pub changed: bool,
    /// When it was accepted.
    pub at: Instant,
}

#[derive(Clone, Debug)]
struct Res {
    group: String,
    version: String,
    kind: String,
    plural: String,
    namespaced: bool,
}

impl Res {
    fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Res {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
        }
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

fn builtins() -> Vec<Res> {
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
type Key = (String, String, String, String);

#[derive(Clone)]
struct Stored {
    obj: Value,
    manager: String,
    /// How the manager last wrote it: `Apply` (server-side apply) or `Update` (create,
    /// replace, or a kubelet's status write).
    operation: &'static str,
    ready_at: Instant,
}

struct Cluster {
    opts: DoubleOptions,
    objects: BTreeMap<Key, Stored>,
    rv: u64,
    uid: u64,
    never_ready: HashSet<(String, String)>,
    /// Applies refused with 422 Invalid: (kind, namespace, name) -> reason.
    refused: BTreeMap<(String, String, String), String>,
    /// Nodes registered by a (simulated) kubelet: Ready only once the CNI runs and their
    /// `ready_at` has passed.
    kubelet_nodes: HashSet<String>,
    log: Vec<ApplyRecord>,
    /// Extra `Warning` headers on writes of (kind, namespace, name), as a webhook or a
    /// deprecation would add them ([`KubeDouble::warn_on`]).
    warnings: BTreeMap<(String, String, String), String>,
}

type Shared = Arc<Mutex<Cluster>>;

impl Cluster {
    /// Kinds of CRDs that are Established, one per served version: discovery lists a CRD's
    /// versions only once its Established condition is True and only the served ones
    /// (kubernetes/kubernetes staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/
    /// customresource_discovery_controller.go, sync).
    fn established_crds(&self, now: Instant) -> Vec<Res> {
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

    fn served(&self, now: Instant) -> Vec<Res> {
        let mut all = builtins();
        all.extend(self.established_crds(now));
        all
    }

    fn node_count(&self) -> i64 {
        self.nodes().count() as i64
    }

    fn nodes(&self) -> impl Iterator<Item = (&str, &Stored)> {
        self.objects
            .iter()
            .filter(|((g, p, _, _), _)| g.is_empty() && p == "nodes")
            .map(|((_, _, _, name), s)| (name.as_str(), s))
    }

    /// Whether the configured CNI DaemonSet exists and has rolled out (true when none is
    /// configured).
    fn cni_running(&self, now: Instant) -> bool {
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
    fn node_runs_pods(&self, name: &str, s: &Stored, now: Instant) -> bool {
        !self.kubelet_nodes.contains(name) || (self.cni_running(now) && now >= s.ready_at)
    }

    /// The object as a client reads it: stored content plus a status computed from time.
    fn view(&self, key: &Key, s: &Stored, now: Instant) -> Value {
        let mut obj = s.obj.clone();
        // Objects written through apply, create, replace or patch keep their managedFields as
        // structured-merge-diff computes them (see `kube_ssa`); an empty list is left out, as
        // the API encodes it (`omitempty`). Objects the simulated kubelets or the server wrote
        // directly show their last writer without fieldsV1.
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
        let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
        let ready =
            now >= s.ready_at && !self.never_ready.contains(&(key.2.clone(), key.3.clone()));
        match (key.0.as_str(), key.1.as_str()) {
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let established = if now >= s.ready_at { "True" } else { "False" };
                obj["status"] = json!({
                    "acceptedNames": obj["spec"]["names"].clone(),
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True"},
                        {"type": "Established", "status": established},
                    ],
                });
            }
            // Workload status fields as their controllers write them and as `kubectl rollout
            // status` reads them (kubernetes/kubernetes staging/src/k8s.io/kubectl/pkg/
            // polymorphichelpers/rollout_status.go): observedGeneration catches up with
            // generation, then the updated/available counts reach the desired count.
            ("apps", "deployments") => {
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
            ("apps", "daemonsets") => {
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
            // The kubelet reports NotReady while the runtime's NetworkReady condition is false
            // (kubernetes/kubernetes pkg/kubelet/kubelet.go, updateRuntimeUp: "container
            // runtime network not ready: ..."; the tail is containerd's CRI status,
            // "Network plugin returns error: cni plugin not initialized").
            ("", "nodes") if self.kubelet_nodes.contains(&key.3) => {
                let ready = self.node_runs_pods(&key.3, s, now);
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
            ("apps", "statefulsets") => {
                let want = obj["spec"]["replicas"].as_i64().unwrap_or(1);
                let revision = format!("{}-{generation}", key.3);
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
            ("", "namespaces") => obj["status"] = json!({"phase": "Active"}),
            _ => {}
        }
        obj
    }
}

/// A running double; dropping it stops the server.
pub struct KubeDouble {
    /// The address it listens on (the port really bound).
    pub addr: SocketAddr,
    kubeconfig: String,
    state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KubeDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, peer) = match super::accept_like_go(&self.tcp).await {
                Ok(conn) => conn,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::debug!(error = %e, "simulated server: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // A failed handshake (e.g. no client certificate) just drops that connection.
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The server's TLS setup: its certificate, client certificates required (signed by `ca`).
fn server_tls(ca: &SimCa, cert_pem: &str, key_pem: &str) -> Result<rustls::ServerConfig, SimError> {
    let tls = |reason: String| SimError::Tls {
        what: "Kubernetes API double".into(),
        reason,
    };
    let parse = |what: &'static str| {
        move |e: rustls::pki_types::pem::Error| PkiError::Parse {
            what,
            reason: e.to_string(),
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(
            CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())
                .map_err(parse("CA certificate"))?,
        )
        .map_err(|e| tls(e.to_string()))?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| tls(e.to_string()))?;
    let chain = vec![
        CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(parse("server certificate"))?,
    ];
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(parse("server key"))?;
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| tls(e.to_string()))
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

fn not_found_resource() -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource".into(),
    )
}

impl KubeDouble {
    /// Starts a double on `opts.bind` with `kube-system` and `default` Namespaces and the
    /// configured Nodes. Fails if the address cannot be bound or the certificates or TLS
    /// setup cannot be made.
    pub async fn start(opts: DoubleOptions) -> Result<KubeDouble, SimError> {
        let ca = SimCa::new_ca("kubernetes")?;
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut ips = vec![opts.bind.ip()];
        if !ips.contains(&loopback) {
            ips.push(loopback);
        }
        let server = ca.server(&ips, &["kubernetes", "localhost"])?;
        let client = ca.client(
            &["system:masters"],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let tls = server_tls(&ca, &server.cert_pem, &server.key_pem)?;

        let tcp = TcpListener::bind(opts.bind)
            .await
            .map_err(|source| SimError::Bind {
                addr: opts.bind,
                source,
            })?;
        let addr = tcp.local_addr().map_err(|source| SimError::Bind {
            addr: opts.bind,
            source,
        })?;
        // A wildcard bind is reached through loopback.
        let server_addr = if addr.ip().is_unspecified() {
            SocketAddr::new(loopback, addr.port())
        } else {
            addr
        };
        let now = Instant::now();
        let mut cluster = Cluster {
            opts: opts.clone(),
            objects: BTreeMap::new(),
            rv: 100,
            uid: 0,
            never_ready: HashSet::new(),
            refused: BTreeMap::new(),
            kubelet_nodes: HashSet::new(),
            log: Vec::new(),
            warnings: BTreeMap::new(),
        };
        for ns in ["kube-system", "default"] {
            cluster.rv += 1;
            cluster.objects.insert(
                (String::new(), "namespaces".into(), String::new(), ns.into()),
                Stored {
                    obj: json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": ns, "resourceVersion": cluster.rv.to_string(),
                                     "uid": format!("uid-ns-{ns}")}}),
                    manager: "kube-apiserver".into(),
                    operation: "Update",
                    ready_at: now,
                },
            );
        }
        let state: Shared = Arc::new(Mutex::new(cluster));
        for (name, ready) in &opts.nodes {
            set_node(&state, name, *ready);
        }

        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(Arc::new(tls)),
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });

        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    \
             server: https://{server_addr}\n    certificate-authority-data: {ca}\nusers:\n\
             - name: admin\n  user:\n    client-certificate-data: {crt}\n    \
             client-key-data: {key}\ncontexts:\n- name: admin@double\n  context:\n    \
             cluster: double\n    user: admin\ncurrent-context: admin@double\n",
            ca = STANDARD.encode(&ca.cert_pem),
            crt = STANDARD.encode(&client.cert_pem),
            key = STANDARD.encode(&client.key_pem),
        );
        tracing::debug!(%addr, "Kubernetes API double listening");
        Ok(KubeDouble {
            addr,
            kubeconfig,
            state,
            task,
        })
    }

    /// Kubeconfig YAML for an admin of this double.
    pub fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    /// An object as a client would read it, by apiVersion/kind/namespace/name.
    pub fn object(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let c = lock(&self.state);
        let now = Instant::now();
        let res = c
            .served(now)
            .into_iter()
            .chain(c.all_crd_kinds())
            .find(|r| r.api_version() == api_version && r.kind == kind)?;
        let key = object_key(&res, ns.to_owned(), name.to_owned());
        c.objects.get(&key).map(|s| c.view(&key, s, now))
    }

    /// [`Self::resource_versions`] without the objects the simulated kubelets keep writing
    /// (mirror Pods, Node status): what a client's own writes would change.
    pub fn resource_versions_but_kubelets(&self) -> BTreeMap<String, String> {
        self.resource_versions()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("/pods/") && !k.starts_with("/nodes/"))
            .collect()
    }

    /// resourceVersion of every stored object, keyed `group/plural/ns/name`.
    pub fn resource_versions(&self) -> BTreeMap<String, String> {
        let c = lock(&self.state);
        c.objects
            .iter()
            .map(|((g, p, ns, n), s)| {
                (
                    format!("{g}/{p}/{ns}/{n}"),
                    s.obj["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                )
            })
            .collect()
    }

    /// Every accepted apply, in order.
    pub fn applies(&self) -> Vec<ApplyRecord> {
        lock(&self.state).log.clone()
    }

    /// Refuses every apply of the object `kind` `ns`/`name` with 422 Invalid and `reason`
    /// (as an admission webhook or validation would); `None` accepts them again.
    pub fn refuse_applies(&self, kind: &str, ns: &str, name: &str, reason: Option<&str>) {
        let key = (kind.to_owned(), ns.to_owned(), name.to_owned());
        let mut c = lock(&self.state);
        match reason {
            Some(r) => c.refused.insert(key, r.to_owned()),
            None => c.refused.remove(&key),
        };
    }

    /// Answers every write of the object `kind` `ns`/`name` with `warning` as an extra
    /// `Warning` header (`None` stops), as an admission webhook's warnings reach a client.
    pub fn warn_on(&self, kind: &str, ns: &str, name: &str, warning: Option<&str>) {
        let key = (kind.to_owned(), ns.to_owned(), name.to_owned());
        let mut c = lock(&self.state);
        match warning {
            Some(w) => c.warnings.insert(key, w.to_owned()),
            None => c.warnings.remove(&key),
        };
    }

    /// Makes a Deployment, DaemonSet or StatefulSet never report ready.
    pub fn never_ready(&self, ns: &str, name: &str) {
        lock(&self.state)
            .never_ready
            .insert((ns.into(), name.into()));
    }

    /// Sets (or adds) a Node with the given Ready condition (fixed from now on, even for a
    /// Node added by [`Self::register_node`]).
    pub fn set_node_ready(&self, name: &str, ready: bool) {
        set_node(&self.state, name, ready);
    }

    /// Adds a Node as a kubelet does when a configured machine boots. Without
    /// [`DoubleOptions::cni_daemonset`] it is Ready at once; with it, it reports Ready=False
    /// ([`CNI_NOT_READY`]) until that DaemonSet exists and has rolled out, and its pod has
    /// started on this node (the rollout delay after registration). Registering a name again
    /// restarts that node's start-up.
    pub(crate) fn register_node(&self, name: &str) {
        let mut c = lock(&self.state);
        if c.opts.cni_daemonset.is_none() {
            drop(c);
            set_node(&self.state, name, true);
            return;
        }
        c.rv += 1;
        let rv = c.rv.to_string();
        let ready_at = Instant::now() + c.opts.rollout_delay;
        c.objects.insert(
            (String::new(), "nodes".into(), String::new(), name.into()),
            Stored {
                obj: json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "resourceVersion": rv,
                                 "uid": format!("uid-node-{name}"),
                                 "labels": {"kubernetes.io/hostname": name}}}),
                manager: "kubelet".into(),
                operation: "Update",
                ready_at,
            },
        );
        c.kubelet_nodes.insert(name.into());
    }

    /// Stores `obj` (e.g. a static pod's mirror Pod, as the kubelet creates it) under
    /// `group`/`plural`/`ns`/`name` with a fresh resourceVersion, replacing what was there.
    pub(crate) fn put_object(&self, group: &str, plural: &str, ns: &str, name: &str, obj: Value) {
        let mut c = lock(&self.state);
        c.rv += 1;
        let mut obj = obj;
        obj["metadata"]["resourceVersion"] = json!(c.rv.to_string());
        c.objects.insert(
            (group.into(), plural.into(), ns.into(), name.into()),
            Stored {
                obj,
                manager: "kubelet".into(),
                operation: "Update",
                ready_at: Instant::now(),
            },
        );
    }

    /// The kubelet on Node `name` reports `version` in `status.nodeInfo.kubeletVersion` (as
    /// a restarted kubelet does when it posts its node status; k8s.io/api core/v1
    /// `NodeSystemInfo.KubeletVersion`). No-op for a Node that does not exist.
    pub(crate) fn set_kubelet_version(&self, name: &str, version: &str) {
        let mut c = lock(&self.state);
        c.rv += 1;
        let rv = c.rv.to_string();
        let key = (
            String::new(),
            "nodes".into(),
            String::new(),
            name.to_owned(),
        );
        if let Some(s) = c.objects.get_mut(&key) {
            s.obj["status"]["nodeInfo"]["kubeletVersion"] = json!(version);
            s.obj["metadata"]["resourceVersion"] = json!(rv);
        }
    }

    /// When the CRD `name` became (or becomes) Established.
    pub fn crd_established_at(&self, name: &str) -> Option<Instant> {
        let c = lock(&self.state);
        c.objects
            .get(&(
                "apiextensions.k8s.io".into(),
                "customresourcedefinitions".into(),
                String::new(),
                name.into(),
            ))
            .map(|s| s.ready_at)
    }
}

impl Cluster {
    /// CRD-defined kinds whether Established or not (for test inspection only).
    fn all_crd_kinds(&self) -> Vec<Res> {
        let far = Instant::now() + Duration::from_secs(3600 * 24);
        self.established_crds(far)
    }
}

fn set_node(state: &Shared, name: &str, ready: bool) {
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

/// What a request path addresses.
enum Target {
    CoreVersions,
    GroupList,
    ResourceList {
        group: String,
        version: String,
    },
    Object {
        res: Res,
        ns: Option<String>,
        name: Option<String>,
    },
}

fn parse_path(c: &Cluster, path: &str, now: Instant) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Some(Target::CoreVersions),
        ["apis"] => return Some(Target::GroupList),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let served = c.served(now);
    if !served
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        return None;
    }
    let find = |plural: &str| {
        served
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    };
    match rest {
        [] => Some(Target::ResourceList {
            group: group.into(),
            version: version.into(),
        }),
        ["namespaces", ns, plural] => {
            let res = find(plural).filter(|r| r.namespaced)?;
            Some(Target::Object {
                res,
                ns: Some((*ns).into()),
                name: None,
            })
        }
        ["namespaces", ns, plural, name] => {
            let res = find(plural).filter(|r| r.namespaced)?;
            Some(Target::Object {
                res,
                ns: Some((*ns).into()),
                name: Some((*name).into()),
            })
        }
        [plural] => Some(Target::Object {
            res: find(plural)?,
            ns: None,
            name: None,
        }),
        [plural, name] => {
            let res = find(plural).filter(|r| !r.namespaced)?;
            Some(Target::Object {
                res,
                ns: None,
                name: Some((*name).into()),
            })
        }
        _ => None,
    }
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = Instant::now();
    let mut c = lock(&state);
    if method == Method::GET && uri.path() == "/version" {
        // What Helm reads for `.Capabilities.KubeVersion` (k8s.io/apimachinery pkg/version
        // Info); the version modelled here.
        return axum::Json(json!({"major": "1", "minor": "36", "gitVersion": "v1.36.2",
            "platform": "linux/amd64"}))
        .into_response();
    }
    if method == Method::GET
        && let Some(doc) = openapi_v3(&c, uri.path(), now)
    {
        return doc;
    }
    let Some(target) = parse_path(&c, uri.path(), now) else {
        return not_found_resource();
    };
    match (method, target) {
        (Method::GET, Target::CoreVersions) => {
            axum::Json(json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": []}))
            .into_response()
        }
        (Method::GET, Target::GroupList) => {
            let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for r in c.served(now).into_iter().filter(|r| !r.group.is_empty()) {
                let vs = groups.entry(r.group.clone()).or_default();
                if !vs.contains(&r.version) {
                    vs.push(r.version.clone());
                }
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(g, vs)| {
                    let versions: Vec<Value> = vs
                        .iter()
                        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                        .collect();
                    json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
                })
                .collect();
            axum::Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
                .into_response()
        }
        (Method::GET, Target::ResourceList { group, version }) => {
            let resources: Vec<Value> = c
                .served(now)
                .into_iter()
                .filter(|r| r.group == group && r.version == version)
                .map(|r| {
                    json!({"name": r.plural, "singularName": r.kind.to_lowercase(),
                        "namespaced": r.namespaced, "kind": r.kind,
                        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
                })
                .collect();
            let gv = if group.is_empty() {
                version
            } else {
                format!("{group}/{version}")
            };
            axum::Json(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": gv, "resources": resources}))
            .into_response()
        }
        (
            Method::GET,
            Target::Object {
                res,
                ns,
                name: Some(name),
            },
        ) => {
            let key = object_key(&res, ns.unwrap_or_default(), name);
            match c.objects.get(&key) {
                Some(s) => axum::Json(c.view(&key, s, now)).into_response(),
                None => not_found(&res, &key.3),
            }
        }
        (
            Method::GET,
            Target::Object {
                res,
                ns,
                name: None,
            },
        ) => {
            let items: Vec<Value> = c
                .objects
                .iter()
                .filter(|(k, s)| {
                    k.0 == res.group
                        && k.1 == res.plural
                        && ns.as_ref().is_none_or(|n| &k.2 == n)
                        && labels_match(&s.obj, query.get("labelSelector"))
                })
                .map(|(k, s)| c.view(k, s, now))
                .collect();
            axum::Json(json!({"kind": format!("{}List", res.kind),
                "apiVersion": res.api_version(),
                "metadata": {"resourceVersion": c.rv.to_string()}, "items": items}))
            .into_response()
        }
        (
            Method::PATCH,
            Target::Object {
                res,
                ns,
                name: Some(name),
            },
        ) if query.contains_key("dryRun") => {
            dry_run_apply(&mut c, res, ns, name, &query, &headers, &body, now)
        }
        (
            Method::PATCH,
            Target::Object {
                res,
                ns,
                name: Some(name),
            },
        ) => match patch_kind(&headers) {
            Some(kind) => patch_update(&mut c, kind, res, ns, name, &query, &headers, &body, now),
            None => apply(&mut c, res, ns, name, &query, &headers, &body, now),
        },
        (
            Method::POST,
            Target::Object {
                res,
                ns,
                name: None,
            },
        ) => match wire_body(&res, &headers, &body) {
            Ok(body) => write(&mut c, res, ns, None, &query, &body, now),
            Err(refused) => *refused,
        },
        (
            Method::PUT,
            Target::Object {
                res,
                ns,
                name: Some(name),
            },
        ) => match wire_body(&res, &headers, &body) {
            Ok(body) => write(&mut c, res, ns, Some(name), &query, &body, now),
            Err(refused) => *refused,
        },
        (
            Method::DELETE,
            Target::Object {
                res,
                ns,
                name: Some(name),
            },
        ) => {
            let key = object_key(&res, ns.unwrap_or_default(), name);
            // Deleted at once (background propagation: the dependents go later; the double
            // models no finalizers), the object as it was in the reply (kubernetes/kubernetes
            // staging/src/k8s.io/apiserver/pkg/endpoints/handlers/delete.go at 02e16cb253f0, DeleteResource:
            // 200 with the deleted object when there is nothing left to wait for).
            match c.objects.remove(&key) {
                Some(s) => {
                    c.rv += 1;
                    axum::Json(c.view(&key, &s, now)).into_response()
                }
                None => not_found(&res, &key.3),
            }
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
        ),
    }
}

/// Where an object of `res` named `name` in `ns` ("" for cluster-scoped) is stored.
fn object_key(res: &Res, ns: String, name: String) -> Key {
    (res.group.clone(), res.plural.clone(), ns, name)
}

/// The API server's 404 for a missing object (`NotFound`, "<resource> \"<name>\" not found").
fn not_found(res: &Res, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", qualified(res)),
    )
}

fn qualified(res: &Res) -> String {
    if res.group.is_empty() {
        res.plural.clone()
    } else {
        format!("{}.{}", res.plural, res.group)
    }
}

/// Metadata fields the server owns; they never count as content.
const SERVER_META: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
];

fn content(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        for k in SERVER_META {
            m.remove(*k);
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    v
}

/// Create (POST, `name` None) or replace (PUT) of a whole object, as client-go's `Create`
/// and `Update` send them (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/
/// handlers/create.go and update.go): an existing name is 409 AlreadyExists on create, a
/// missing one 404 NotFound on replace (ConfigMaps and the other built-ins do not allow
/// create on update), a stale `resourceVersion` 409 Conflict; the manager is the
/// `fieldManager` parameter (the real default derives one from the user agent).
fn write(
    c: &mut Cluster,
    res: Res,
    ns: Option<String>,
    name: Option<String>,
    query: &BTreeMap<String, String>,
    body: &[u8],
    now: Instant,
) -> Response {
    let mut obj: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "body is not an object".into(),
            );
        }
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    fold_string_data(&res, &mut obj);
    let Some(body_name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                res.kind
            ),
        );
    };
    if name.as_ref().is_some_and(|n| *n != body_name) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                name.unwrap_or_default()
            ),
        );
    }
    let ns = ns.unwrap_or_default();
    if res.namespaced {
        let ns_key = (
            String::new(),
            "namespaces".to_owned(),
            String::new(),
            ns.clone(),
        );
        if !c.objects.contains_key(&ns_key) {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("namespaces \"{ns}\" not found"),
            );
        }
        obj["metadata"]["namespace"] = Value::String(ns.clone());
    }
    let key = (res.group.clone(), res.plural.clone(), ns, body_name.clone());
    let existing = c.objects.get(&key);
    let (uid, generation, created) = match (name.is_some(), existing) {
        (false, Some(_)) => {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{body_name}\" already exists", qualified(&res)),
            );
        }
        (true, None) => {
            return not_found(&res, &body_name);
        }
        (true, Some(s)) => {
            if let Some(rv) = obj["metadata"]["resourceVersion"].as_str()
                && rv != s.obj["metadata"]["resourceVersion"].as_str().unwrap_or("")
            {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{body_name}\": the object has been modified; please apply your changes to the latest version and try again",
                        qualified(&res)
                    ),
                );
            }
            if content(&s.obj) == content(&obj) {
                let view = c.view(&key, s, now);
                return (StatusCode::OK, axum::Json(view)).into_response();
            }
            let generation = s.obj["metadata"]["generation"].as_i64().unwrap_or(1);
            (s.obj["metadata"]["uid"].clone(), generation, false)
        }
        (false, None) => {
            c.uid += 1;
            (json!(format!("uid-{}", c.uid)), 1, true)
        }
    };
    c.rv += 1;
    let mut stored = content(&obj);
    if let Some(meta) = stored["metadata"].as_object_mut() {
        meta.insert("uid".into(), uid);
        meta.insert("resourceVersion".into(), json!(c.rv.to_string()));
        meta.insert("generation".into(), json!(generation));
        meta.insert("creationTimestamp".into(), json!("2026-11-30T00:00:00Z"));
    }
    let manager = query
        .get("fieldManager")
        .cloned()
        .unwrap_or_else(|| "kube-rs".into());
    // The writer takes the fields it set or changed (an Update: never a conflict).
    let builtin = is_builtin(&res);
    kube_ssa::normalize(&mut stored, builtin);
    if res.group.is_empty() && res.kind == "Namespace" {
        kube_ssa::namespace_strategy(&mut stored);
    }
    let old = c
        .objects
        .get(&key)
        .map(|s| (content(&s.obj), kube_ssa::entries_of(&s.obj)));
    let entries = match old {
        Some((o, e)) => {
            kube_ssa::update(Some(&o), e, &content(&stored), &manager, &res.api_version())
        }
        None => kube_ssa::update(None, None, &content(&stored), &manager, &res.api_version()),
    };
    stored["metadata"]["managedFields"] = kube_ssa::encode(&entries);
    c.objects.insert(
        key.clone(),
        Stored {
            obj: stored,
            manager,
            operation: "Update",
            ready_at: now,
        },
    );
    let view = c.view(&key, &c.objects[&key], now);
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (code, axum::Json(view)).into_response()
}

#[allow(clippy::too_many_arguments)]
fn apply(
    c: &mut Cluster,
    res: Res,
    ns: Option<String>,
    name: String,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Response {
    let ctype = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The real server checks the patch content type first (415 for one it does not
    // support), then PatchOptions (fieldManager required for apply: 422 Invalid), in
    // kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go
    // (PatchResource) and staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/
    // validation.go (ValidatePatchOptions). Deliberately narrower: the real server also takes
    // JSON, merge and strategic-merge patches; talboot sends only server-side apply, so any
    // other patch here means a client regression and is refused the way an unsupported type is.
    if ctype.split(';').next().unwrap_or("").trim() != "application/apply-patch+yaml" {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({ctype}); this double accepts only application/apply-patch+yaml"
            ),
        );
    }
    let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()).cloned() else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
        );
    };
    let force = query.get("force").is_some_and(|f| f == "true");
    // JSON first; a YAML body's error is the one reported, as the API server's YAML decoder.
    let parsed = serde_json::from_slice::<Value>(body).or_else(|_| yaml_serde::from_slice(body));
    let mut obj = match parsed {
        Ok(v) if v.is_object() => v,
        Ok(_) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "body is not an object".into(),
            );
        }
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    if obj["apiVersion"] != res.api_version().as_str() || obj["kind"] != res.kind.as_str() {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the body is {} {}, the URL addresses {} {}",
                obj["apiVersion"],
                obj["kind"],
                res.api_version(),
                res.kind
            ),
        );
    }
    // Name and namespace checks and their wording: kubernetes/kubernetes
    // staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go, checkName (400 BadRequest).
    if obj["metadata"]["name"] != name.as_str() {
        let body_name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            ),
        );
    }
    let ns = ns.unwrap_or_default();
    if let Some(reason) = c.refused.get(&(res.kind.clone(), ns.clone(), name.clone())) {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{}.{} \"{name}\" is invalid: {reason}", res.kind, res.group),
        );
    }
    if res.namespaced {
        if let Some(body_ns) = obj["metadata"]["namespace"].as_str()
            && body_ns != ns
        {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "the namespace of the object ({body_ns}) does not match the namespace on the request ({ns})"
                ),
            );
        }
        let ns_key = (
            String::new(),
            "namespaces".to_owned(),
            String::new(),
            ns.clone(),
        );
        // The NamespaceLifecycle admission plugin answers the Namespace lookup's NotFound
        // (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/
        // lifecycle/admission.go, Admit: "refuse to operate on non-existent namespaces").
        if !c.objects.contains_key(&ns_key) {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("namespaces \"{ns}\" not found"),
            );
        }
        obj["metadata"]["namespace"] = Value::String(ns.clone());
    } else if let Some(meta) = obj["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    if res.kind == "Secret" && res.group.is_empty() {
        // `data` is `map[string][]byte`; Go's JSON decoder reads []byte as base64, so a bad
        // value fails decoding the body, before validation: 400 BadRequest "Secret in version
        // \"v1\" cannot be handled as a Secret: ... illegal base64 data at input byte N"
        // (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go,
        // transformDecodeError; encoding/base64 CorruptInputError for the wording).
        for (k, v) in obj["data"].as_object().into_iter().flatten() {
            let bad_at = match v.as_str().map(|s| STANDARD.decode(s)) {
                Some(Ok(_)) => continue,
                Some(Err(base64::DecodeError::InvalidByte(at, _)))
                | Some(Err(base64::DecodeError::InvalidLastSymbol(at, _))) => at,
                Some(Err(_)) => v.as_str().map_or(0, str::len),
                None => 0,
            };
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: v1.Secret.Data: \
                     decode base64: illegal base64 data at input byte {bad_at} (key {k})"
                ),
            );
        }
    }

    let key = (
        res.group.clone(),
        res.plural.clone(),
        ns.clone(),
        name.clone(),
    );
    let (new_content, created, changed) = match ssa_merge(c, &res, &key, &obj, &manager, force) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    // A no-op apply writes nothing, so resourceVersion stays: the etcd3 store skips the write
    // when the encoded object is unchanged (kubernetes/kubernetes
    // staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go, GuaranteedUpdate). generation
    // moves only with spec (pkg/registry/apps/deployment/strategy.go, PrepareForUpdate, and the
    // same rule in the other workload strategies).
    if changed {
        c.rv += 1;
        let rv = c.rv.to_string();
        let (uid, generation) = match c.objects.get(&key) {
            Some(s) => {
                let old_gen = s.obj["metadata"]["generation"].as_i64().unwrap_or(1);
                let spec_changed = s.obj.get("spec") != new_content.get("spec");
                (
                    s.obj["metadata"]["uid"].clone(),
                    if spec_changed { old_gen + 1 } else { old_gen },
                )
            }
            None => {
                c.uid += 1;
                (json!(format!("uid-{}", c.uid)), 1)
            }
        };
        let mut stored = new_content;
        // The name check above made `metadata` an object.
        if let Some(meta) = stored["metadata"].as_object_mut() {
            meta.insert("uid".into(), uid);
            meta.insert("resourceVersion".into(), json!(rv));
            meta.insert("generation".into(), json!(generation));
            meta.insert("creationTimestamp".into(), json!("2026-11-30T00:00:00Z"));
        }
        let delay = match res.kind.as_str() {
            "CustomResourceDefinition" => c.opts.crd_delay,
            "Deployment" | "DaemonSet" | "StatefulSet" => c.opts.rollout_delay,
            _ => Duration::ZERO,
        };
        c.objects.insert(
            key.clone(),
            Stored {
                obj: stored,
                manager: manager.clone(),
                operation: "Apply",
                ready_at: now + delay,
            },
        );
    }
    c.log.push(ApplyRecord {
        api_version: res.api_version(),
        kind: res.kind.clone(),
        namespace: ns,
        name,
        field_manager: manager,
        force,
        changed,
        at: now,
    });
    let Some(s) = c.objects.get(&key) else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the applied object vanished".into(),
        );
    };
    let view = c.view(&key, s, now);
    // 201 when the apply created the object, else 200 (patch.go, PatchResource).
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let warnings = admission_warnings(c, &key.2, &view);
    with_warnings((code, axum::Json(view)).into_response(), &warnings)
}

/// Whether `res` is a built-in kind (typed on the real server), not a custom resource.
fn is_builtin(res: &Res) -> bool {
    builtins()
        .iter()
        .any(|b| b.group == res.group && b.kind == res.kind)
}

/// `<group>/<version>, Kind=<kind>` as Go prints a GroupVersionKind (core: `/v1`).
fn gvk_string(res: &Res) -> String {
    format!("{}/{}, Kind={}", res.group, res.version, res.kind)
}

/// A Status with `details.causes`, as the apiserver sends for apply conflicts
/// (k8s.io/apimachinery pkg/api/errors/errors.go, NewApplyConflict: 409 Conflict, one
/// `FieldManagerConflict` cause per field).
fn conflict_status(res: &Res, name: &str, conflicts: &[kube_ssa::Conflict]) -> Response {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({"reason": "FieldManagerConflict",
                   "message": format!("conflict with {}", c.manager), "field": c.path})
        })
        .collect();
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": kube_ssa::conflict_message(conflicts), "reason": "Conflict",
        "details": {"name": name, "group": res.group, "kind": res.plural, "causes": causes},
        "code": 409,
    });
    (StatusCode::CONFLICT, axum::Json(body)).into_response()
}

/// Server-side apply of `obj` by `manager` over the stored object at `key`, as
/// structured-merge-diff does it (`kube_ssa::apply`): the typed conversion of the patch
/// first (a string where the schema has a number is refused as the real server refuses it:
/// status 500 with no reason, kubernetes/kubernetes v1.36.2 staging/src/k8s.io/apimachinery/
/// pkg/util/managedfields/internal/structuredmerge.go, Apply, "failed to create typed patch
/// object (%v): %v", which ErrorToAPIStatus turns into a 500), then conflicts (409), the
/// merge, the typed round trip, and the new managedFields. Returns the new content (with
/// `metadata.managedFields`), whether it is a create, and whether anything changed —
/// content or managedFields, both of which a real write would bump resourceVersion for.
fn ssa_merge(
    c: &Cluster,
    res: &Res,
    key: &Key,
    obj: &Value,
    manager: &str,
    force: bool,
) -> Result<(Value, bool, bool), Box<Response>> {
    let builtin = is_builtin(res);
    if builtin && let Some(e) = kube_ssa::numeric_type_error(obj) {
        let message = format!(
            "failed to create typed patch object ({}/{}; {}): {e}",
            key.2,
            key.3,
            gvk_string(res)
        );
        return Err(Box::new(status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
            message,
        )));
    }
    let existing = c.objects.get(key);
    let live = existing.map(|s| content(&s.obj));
    let entries = existing.and_then(|s| kube_ssa::entries_of(&s.obj));
    let merged = kube_ssa::apply(
        live.as_ref(),
        entries,
        &content(obj),
        manager,
        &res.api_version(),
        force,
    )
    .map_err(|conflicts| Box::new(conflict_status(res, &key.3, &conflicts)))?;
    let mut new = merged.object;
    kube_ssa::normalize(&mut new, builtin);
    // The merge runs on the versioned object, so the writer owns `f:stringData`; the
    // conversion to the internal type then folds it into `data`, which is what is stored and
    // compared (see [`fold_string_data`]).
    fold_string_data(res, &mut new);
    if res.group.is_empty() && res.kind == "Namespace" {
        kube_ssa::namespace_strategy(&mut new);
    }
    let managed = kube_ssa::encode(&merged.entries);
    let changed = match existing {
        None => true,
        Some(s) => live.as_ref() != Some(&new) || s.obj["metadata"]["managedFields"] != managed,
    };
    new["metadata"]["managedFields"] = managed;
    Ok((new, existing.is_none(), changed))
}

/// The `Warning` headers admission adds to a write: PodSecurity's `restricted` findings for
/// a workload in a Namespace labelled to warn (or enforce) at that level
/// (`kube_ssa::pod_security_warning`), plus any a test set with
/// [`KubeDouble::warn_on`].
fn admission_warnings(c: &Cluster, ns: &str, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if !ns.is_empty() {
        let ns_key = (
            String::new(),
            "namespaces".to_owned(),
            String::new(),
            ns.to_owned(),
        );
        if let Some(n) = c.objects.get(&ns_key)
            && let Some(w) = kube_ssa::pod_security_warning(&n.obj, obj)
        {
            out.push(w);
        }
    }
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(w) = c
        .warnings
        .get(&(kind.to_owned(), ns.to_owned(), name.to_owned()))
    {
        out.push(w.clone());
    }
    out
}

/// Adds each warning as a `Warning: 299 - "<text>"` header, the text a quoted-string with
/// `"` and `\` escaped (k8s.io/apimachinery v0.36 pkg/util/net/http.go, NewWarningHeader;
/// the apiserver's warning recorder sends code 299 and agent `-`).
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let quoted = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

/// The patch types other than apply, by content type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PatchKind {
    Strategic,
    Merge,
    Json,
}

fn patch_kind(headers: &HeaderMap) -> Option<PatchKind> {
    let ctype = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match ctype.split(';').next().unwrap_or("").trim() {
        "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
        "application/merge-patch+json" => Some(PatchKind::Merge),
        "application/json-patch+json" => Some(PatchKind::Json),
        _ => None,
    }
}

/// A strategic-merge, JSON-merge or JSON patch of one object, as client-side `kubectl
/// apply` and Helm's three-way merge (and client-go's csaupgrade) send them
/// (kubernetes/kubernetes v1.36.2 staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
/// patch.go): the patch is applied to the stored object; a strategic merge patch of a custom
/// resource is 415; a `resourceVersion` in the result other than the stored one is 409; the
/// result goes through the typed round trip; the manager (`fieldManager`, else the
/// client's user agent's program name, as the apiserver defaults it) takes the fields it
/// changed, an Update that never conflicts; a patch that rewrites `metadata.managedFields`
/// itself sets them as given (managedfields/internal/fieldmanager.go: a request that
/// changes managedFields resets them).
#[allow(clippy::too_many_arguments)]
fn patch_update(
    c: &mut Cluster,
    kind: PatchKind,
    res: Res,
    ns: Option<String>,
    name: String,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Response {
    let builtin = is_builtin(&res);
    if kind == PatchKind::Strategic && !builtin {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                .into(),
        );
    }
    let patch: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let key = object_key(&res, ns.clone().unwrap_or_default(), name.clone());
    let Some(existing) = c.objects.get(&key) else {
        return not_found(&res, &name);
    };
    let mut current = existing.obj.clone();
    if let Some(Value::Array(a)) = current["metadata"].get("managedFields")
        && a.is_empty()
    {
        current["metadata"]
            .as_object_mut()
            .map(|m| m.remove("managedFields"));
    }
    let patched = match kind {
        PatchKind::Strategic => kube_ssa::strategic_merge(&current, &patch, ""),
        PatchKind::Merge => kube_ssa::json_merge(&current, &patch),
        PatchKind::Json => match kube_ssa::json_patch(&current, &patch) {
            Ok(v) => v,
            Err(e) => {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                );
            }
        },
    };
    let stored_rv = existing.obj["metadata"]["resourceVersion"].clone();
    if !patched["metadata"]["resourceVersion"].is_null()
        && patched["metadata"]["resourceVersion"] != stored_rv
    {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(&res)
            ),
        );
    }
    if builtin && let Some(e) = kube_ssa::numeric_type_error(&patched) {
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e);
    }
    let manager = query
        .get("fieldManager")
        .cloned()
        .or_else(|| {
            headers
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into());
    let old = content(&existing.obj);
    let mut new = content(&patched);
    kube_ssa::normalize(&mut new, builtin);
    // The merge runs on the versioned object, so the writer owns `f:stringData`; the
    // conversion to the internal type then folds it into `data`, which is what is stored and
    // compared (see [`fold_string_data`]).
    fold_string_data(&res, &mut new);
    if res.group.is_empty() && res.kind == "Namespace" {
        kube_ssa::namespace_strategy(&mut new);
    }
    let given = patched["metadata"]["managedFields"].clone();
    let entries = if !given.is_null() && given != current["metadata"]["managedFields"] {
        kube_ssa::entries_of(&patched).unwrap_or_default()
    } else {
        kube_ssa::update(
            Some(&old),
            kube_ssa::entries_of(&existing.obj),
            &new,
            &manager,
            &res.api_version(),
        )
    };
    let managed = kube_ssa::encode(&entries);
    let changed = old != new || existing.obj["metadata"]["managedFields"] != managed;
    if changed {
        let spec_changed = old.get("spec") != new.get("spec");
        let generation = existing.obj["metadata"]["generation"].as_i64().unwrap_or(1);
        let uid = existing.obj["metadata"]["uid"].clone();
        let ready_at = if spec_changed {
            match res.kind.as_str() {
                "Deployment" | "DaemonSet" | "StatefulSet" => now + c.opts.rollout_delay,
                _ => existing.ready_at,
            }
        } else {
            existing.ready_at
        };
        c.rv += 1;
        if let Some(meta) = new["metadata"].as_object_mut() {
            meta.insert("uid".into(), uid);
            meta.insert("resourceVersion".into(), json!(c.rv.to_string()));
            meta.insert(
                "generation".into(),
                json!(if spec_changed {
                    generation + 1
                } else {
                    generation
                }),
            );
            meta.insert("creationTimestamp".into(), json!("2026-11-30T00:00:00Z"));
            meta.insert("managedFields".into(), managed);
        }
        c.objects.insert(
            key.clone(),
            Stored {
                obj: new,
                manager,
                operation: "Update",
                ready_at,
            },
        );
    }
    let s = &c.objects[&key];
    let view = c.view(&key, s, now);
    let warnings = admission_warnings(c, &key.2, &view);
    with_warnings(
        (StatusCode::OK, axum::Json(view)).into_response(),
        &warnings,
    )
}

/// The OpenAPI v3 discovery kubectl's and Helm's field validation read
/// (kubernetes/kubernetes v1.36.2 staging/src/k8s.io/kube-openapi handler3; read by
/// kubernetes/cli-runtime v0.35.6 pkg/resource/query_param_verifier_v3.go, HasSupport):
/// `/openapi/v3` lists one document per served group/version, and each document's PATCH
/// operations carry `x-kubernetes-group-version-kind` and the `fieldValidation` query
/// parameter, so clients leave field validation to the server instead of downloading the
/// OpenAPI v2 schema. Only that much of the documents is modelled (no schemas), and the
/// double does not itself refuse unknown fields.
fn openapi_v3(c: &Cluster, path: &str, now: Instant) -> Option<Response> {
    let served = c.served(now);
    let gv_path = |r: &Res| {
        if r.group.is_empty() {
            format!("api/{}", r.version)
        } else {
            format!("apis/{}/{}", r.group, r.version)
        }
    };
    if path == "/openapi/v3" {
        let mut paths = serde_json::Map::new();
        for r in &served {
            let p = gv_path(r);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=0")}),
            );
        }
        return Some(axum::Json(json!({"paths": paths})).into_response());
    }
    let wanted = path.strip_prefix("/openapi/v3/")?;
    let mut paths = serde_json::Map::new();
    for r in served.iter().filter(|r| gv_path(r) == wanted) {
        let scope = if r.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        paths.insert(
            format!("/{wanted}/{scope}{}/{{name}}", r.plural),
            json!({"patch": {
                "x-kubernetes-group-version-kind":
                    {"group": r.group, "version": r.version, "kind": r.kind},
                "parameters": [
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "force", "in": "query", "schema": {"type": "boolean"}},
                ],
                "responses": {}}}),
        );
    }
    if paths.is_empty() {
        return Some(not_found_resource());
    }
    Some(
        axum::Json(
            json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.36.2"},
            "paths": paths}),
        )
        .into_response(),
    )
}

/// A create or replace body as JSON. client-go's typed clients (Helm's release storage among
/// them) send built-in kinds as Kubernetes protobuf (`application/vnd.kubernetes.protobuf`:
/// the `k8s\0` magic, then a runtime.Unknown wrapping the object; k8s.io/apimachinery
/// v0.36.2 pkg/runtime/serializer/protobuf/protobuf.go). The double reads that for Secrets,
/// the one kind such clients write here (k8s.io/api v0.36 core/v1/generated.proto: Secret,
/// ObjectMeta); any other protobuf body is 415.
fn wire_body(res: &Res, headers: &HeaderMap, body: &[u8]) -> Result<Vec<u8>, Box<Response>> {
    let ctype = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ctype.starts_with("application/vnd.kubernetes.protobuf") {
        return Ok(body.to_vec());
    }
    let refuse = |why: String| {
        status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the double reads protobuf only for v1 Secrets: {why}"),
        )
    };
    if !(res.group.is_empty() && res.kind == "Secret") {
        return Err(Box::new(refuse(format!("not {}", res.kind))));
    }
    let secret = kube_ssa::protobuf_secret(body).map_err(|e| {
        Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("cannot decode the protobuf body: {e}"),
        ))
    })?;
    Ok(serde_json::to_vec(&secret).expect("JSON values serialise"))
}

/// Whether an object's labels match a `labelSelector` of equality terms (`a=b`, `a==b`,
/// `a!=b`, `a`, `!a`), as client-go's label selectors that Helm's release storage sends
/// (`owner=helm,name=<release>`) are read (k8s.io/apimachinery pkg/labels/selector.go).
fn labels_match(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &obj["metadata"]["labels"];
    sel.split(',').all(|term| {
        let term = term.trim();
        if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels[k.trim()].as_str() == Some(v.trim())
        } else if let Some(k) = term.strip_prefix('!') {
            labels[k.trim()].is_null()
        } else {
            !labels[term].is_null()
        }
    })
}

/// A Secret's `stringData` folded into `data`, as the API server converts every v1 Secret it
/// decodes (kubernetes/kubernetes pkg/apis/core/v1/conversion.go at 0158de93ea1c,
/// `Convert_v1_Secret_To_core_Secret`: "StringData overwrites Data", each value's bytes
/// base64-encoded on the wire). The internal type has no `stringData`, so the server stores
/// and returns only `data`.
fn fold_string_data(res: &Res, obj: &mut Value) {
    if res.kind != "Secret" || !res.group.is_empty() {
        return;
    }
    let Some(string_data) = obj.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let Value::Object(string_data) = string_data else {
        return;
    };
    if string_data.is_empty() {
        return;
    }
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    for (k, v) in string_data {
        let text = v.as_str().unwrap_or_default();
        obj["data"][k] = Value::String(STANDARD.encode(text.as_bytes()));
    }
}

/// A server-side apply with `dryRun=All`: everything [`apply`] checks and answers, nothing
/// stored (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/registry/generic/registry/
/// dryrun.go at 04791b490660, `DryRunnableStorage`: a dry-run update returns the updated object
/// with the stored `resourceVersion`, a dry-run create one without any). The only value
/// PatchOptions accepts is `All` (kubernetes/apimachinery v0.36.3 pkg/apis/meta/v1/validation/
/// validation.go, `ValidatePatchOptions` -> `ValidateDryRun`).
#[allow(clippy::too_many_arguments)]
fn dry_run_apply(
    c: &mut Cluster,
    res: Res,
    ns: Option<String>,
    name: String,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Response {
    let dry_run = query.get("dryRun").map(String::as_str).unwrap_or("");
    if dry_run != "All" {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "PatchOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{{\"{dry_run}\"}}: supported values: \"All\""
            ),
        );
    }
    let key = object_key(&res, ns.clone().unwrap_or_default(), name.clone());
    let saved = c.objects.get(&key).cloned();
    let (rv, uid, logged) = (c.rv, c.uid, c.log.len());
    let reply = apply(c, res, ns, name, query, headers, body, now);
    let result = c.objects.get(&key).map(|s| c.view(&key, s, now));
    match &saved {
        Some(s) => {
            c.objects.insert(key.clone(), s.clone());
        }
        None => {
            c.objects.remove(&key);
        }
    }
    (c.rv, c.uid) = (rv, uid);
    c.log.truncate(logged);
    if !reply.status().is_success() {
        return reply;
    }
    let Some(mut obj) = result else {
        return reply;
    };
    if let Some(meta) = obj["metadata"].as_object_mut() {
        match &saved {
            Some(s) => {
                meta.insert(
                    "resourceVersion".into(),
                    s.obj["metadata"]["resourceVersion"].clone(),
                );
            }
            None => {
                meta.remove("resourceVersion");
            }
        }
    }
    (reply.status(), axum::Json(obj)).into_response()
}

#[cfg(test)]
mod tests {
    //! The double through talboot's own Kubernetes client: where it binds, what its
    //! certificate names, and kubelet-registered Nodes that wait for the CNI.

    use std::time::Duration;

    use super::*;
    use crate::addons::kube::{Kube, client_from_kubeconfig};

    async fn session(double: &KubeDouble) -> Kube {
        crate::install_crypto_provider();
        let client = client_from_kubeconfig(double.kubeconfig().as_bytes())
            .await
            .unwrap();
        Kube::new(client, Duration::from_millis(10))
    }

    fn node_ready(double: &KubeDouble, name: &str) -> (String, String) {
        let node = double
            .object("v1", "Node", "", name)
            .unwrap_or_else(|| panic!("no Node {name}"));
        let c = &node["status"]["conditions"][0];
        assert_eq!(c["type"], "Ready");
        (
            c["status"].as_str().unwrap_or("").to_owned(),
            c["message"].as_str().unwrap_or("").to_owned(),
        )
    }

    fn daemonset(ns: &str, name: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                                     "spec": {"containers": [{"name": name, "image": "x"}]}}}})
    }

    /// The SANs (IPs and DNS names, as text) of the server certificate the double presents.
    async fn presented_sans(double: &KubeDouble) -> Vec<String> {
        let kc: Value = yaml_serde::from_str(double.kubeconfig()).unwrap();
        let user = &kc["users"][0]["user"];
        let pem = |field: &str| STANDARD.decode(user[field].as_str().unwrap()).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(&pem("client-certificate-data")).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(&pem("client-key-data")).unwrap();
        crate::sim::probe::presented_sans(double.addr, chain, key, &[]).await
    }

    #[tokio::test]
    async fn binds_where_asked_and_its_kubeconfig_reaches_it() {
        let bind: SocketAddr = "127.0.77.20:0".parse().unwrap();
        let double = KubeDouble::start(DoubleOptions {
            bind,
            ..DoubleOptions::default()
        })
        .await
        .unwrap();
        assert_eq!(double.addr.ip(), bind.ip());
        assert_ne!(double.addr.port(), 0);
        let server = format!("server: https://{}\n", double.addr);
        assert!(
            double.kubeconfig().contains(&server),
            "{}",
            double.kubeconfig()
        );
        // talboot's client verifies the certificate against the address it dials.
        let kube = session(&double).await;
        kube.wait_nodes_ready(Duration::from_secs(30))
            .await
            .unwrap();
        let mut sans = presented_sans(&double).await;
        sans.sort();
        assert_eq!(
            sans,
            ["127.0.0.1", "127.0.77.20", "kubernetes", "localhost"],
            "{sans:?}"
        );
    }

    #[tokio::test]
    async fn served_connections_have_nagle_off_as_go_servers_do() {
        let double = KubeDouble::start(DoubleOptions {
            bind: "127.0.77.22:0".parse().unwrap(),
            ..DoubleOptions::default()
        })
        .await
        .unwrap();
        let client = TcpStream::connect(double.addr).await.unwrap();
        let served = crate::sim::probe::served_nodelay(double.addr, client.local_addr().unwrap())
            .await
            .expect("the double accepts the connection");
        assert!(served, "TCP_NODELAY is off on the served socket");
    }

    #[tokio::test]
    async fn an_address_in_use_is_named() {
        let taken = std::net::TcpListener::bind("127.0.77.21:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = KubeDouble::start(DoubleOptions {
            bind: addr,
            ..DoubleOptions::default()
        })
        .await
        .err()
        .expect("binding a used address must fail");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }

    #[tokio::test]
    async fn registered_nodes_become_ready_only_once_the_cni_runs() {
        let rollout = Duration::from_millis(20);
        let double = KubeDouble::start(DoubleOptions {
            nodes: vec![],
            rollout_delay: rollout,
            cni_daemonset: Some(("kube-system".into(), "cilium".into())),
            ..DoubleOptions::default()
        })
        .await
        .unwrap();
        let kube = session(&double).await;
        double.register_node("cp1");
        let (status, message) = node_ready(&double, "cp1");
        assert_eq!(status, "False");
        assert!(message.contains("cni plugin not initialized"), "{message}");

        // Another DaemonSet is no CNI: its pod cannot become available on the node either.
        kube.apply(&daemonset("kube-system", "other"), "kube-system")
            .await
            .unwrap();
        tokio::time::sleep(rollout * 3).await;
        let other = double
            .object("apps/v1", "DaemonSet", "kube-system", "other")
            .unwrap();
        assert_eq!(other["status"]["desiredNumberScheduled"], 1);
        assert_eq!(other["status"]["numberAvailable"], 0);
        assert_eq!(node_ready(&double, "cp1").0, "False");

        // The CNI rolls out; the node turns Ready, and so does one registered afterwards.
        kube.apply(&daemonset("kube-system", "cilium"), "kube-system")
            .await
            .unwrap();
        kube.wait_daemonset("kube-system", "cilium", Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(node_ready(&double, "cp1").0, "True");
        double.register_node("w1");
        kube.wait_nodes_ready(Duration::from_secs(30))
            .await
            .unwrap();
        kube.wait_daemonset("kube-system", "other", Duration::from_secs(30))
            .await
            .unwrap();
        let ds = double
            .object("apps/v1", "DaemonSet", "kube-system", "cilium")
            .unwrap();
        assert_eq!(ds["status"]["numberAvailable"], 2);

        // set_node_ready still overrides, for registered nodes too.
        double.set_node_ready("w1", false);
        assert_eq!(node_ready(&double, "w1").0, "False");
    }

    #[tokio::test]
    async fn static_nodes_and_registration_without_a_cni_gate() {
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        assert_eq!(node_ready(&double, "cp1").0, "True");
        double.set_node_ready("w1", false);
        assert_eq!(node_ready(&double, "w1").0, "False");
        double.register_node("w2");
        assert_eq!(node_ready(&double, "w2").0, "True");
        let ns = double.object("v1", "Namespace", "", "kube-system").unwrap();
        assert_eq!(ns["status"]["phase"], "Active");
    }

    /// Create, replace and delete as client-go sends them, the last writer in managedFields,
    /// and a refused apply.
    #[tokio::test]
    async fn create_replace_delete_and_refused_applies() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, DeleteParams, PostParams};
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        let kube = session(&double).await;
        let api: Api<ConfigMap> = Api::namespaced(kube.client().clone(), "kube-system");
        let pp = PostParams {
            dry_run: false,
            field_manager: Some("talos".into()),
        };
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("inv".into());
        api.create(&pp, &cm).await.unwrap();
        let again = api.create(&pp, &cm).await.unwrap_err();
        assert!(
            matches!(&again, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
            "{again}"
        );
        cm.data = Some([("a".to_owned(), String::new())].into_iter().collect());
        api.replace("inv", &pp, &cm).await.unwrap();
        let got = double
            .object("v1", "ConfigMap", "kube-system", "inv")
            .unwrap();
        assert_eq!(got["data"]["a"], "");
        assert_eq!(got["metadata"]["managedFields"][0]["manager"], "talos");
        assert_eq!(got["metadata"]["managedFields"][0]["operation"], "Update");
        // A stale resourceVersion conflicts; a missing object is not created by a replace.
        cm.metadata.resource_version = Some("1".into());
        let stale = api.replace("inv", &pp, &cm).await.unwrap_err();
        assert!(
            matches!(&stale, kube::Error::Api(s) if s.code == 409),
            "{stale}"
        );
        cm.metadata.resource_version = None;
        cm.metadata.name = Some("other".into());
        let missing = api.replace("other", &pp, &cm).await.unwrap_err();
        assert!(
            matches!(&missing, kube::Error::Api(s) if s.code == 404),
            "{missing}"
        );
        api.delete("inv", &DeleteParams::background())
            .await
            .unwrap();
        assert!(
            double
                .object("v1", "ConfigMap", "kube-system", "inv")
                .is_none()
        );
        let gone = api
            .delete("inv", &DeleteParams::background())
            .await
            .unwrap_err();
        assert!(
            matches!(&gone, kube::Error::Api(s) if s.code == 404),
            "{gone}"
        );

        let ds = daemonset("kube-system", "x");
        double.refuse_applies("DaemonSet", "kube-system", "x", Some("spec: Invalid value"));
        let err = kube.apply(&ds, "default").await.unwrap_err().to_string();
        assert!(
            err.contains("is invalid: spec: Invalid value (422)"),
            "{err}"
        );
        double.refuse_applies("DaemonSet", "kube-system", "x", None);
        kube.apply(&ds, "default").await.unwrap();
        let got = double
            .object("apps/v1", "DaemonSet", "kube-system", "x")
            .unwrap();
        assert_eq!(got["metadata"]["managedFields"][0]["manager"], "talboot");
        assert_eq!(got["metadata"]["managedFields"][0]["operation"], "Apply");
    }

    /// Issue 31: a typed server-side apply with a string where the schema wants a number is
    /// refused as the real server refuses it (500, structuredmerge.go's message).
    #[tokio::test]
    async fn a_string_where_a_number_belongs_is_refused_like_the_server() {
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        let kube = session(&double).await;
        let mut ds = daemonset("kube-system", "cilium");
        ds["spec"]["template"]["spec"]["volumes"] =
            json!([{"name": "clustermesh-secrets", "projected": {"defaultMode": "0400"}}]);
        let err = kube.apply(&ds, "default").await.unwrap_err().to_string();
        assert!(
            err.ends_with(
                "failed to create typed patch object (kube-system/cilium; apps/v1, \
                 Kind=DaemonSet): .spec.template.spec.volumes[name=\"clustermesh-secrets\"]\
                 .projected.defaultMode: expected numeric (int or float), got string (500)"
            ),
            "{err}"
        );
        ds["spec"]["template"]["spec"]["volumes"][0]["projected"]["defaultMode"] = json!(256);
        kube.apply(&ds, "default").await.unwrap();
    }

    /// Issue 31: managedFields as structured-merge-diff keeps them. A manager that owns
    /// nothing is dropped, and the next apply to an object without managedFields records
    /// `before-first-apply` — a write, so resourceVersion moves.
    #[tokio::test]
    async fn a_bare_namespace_owns_nothing_and_its_second_apply_moves_it() {
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        let kube = session(&double).await;
        let bare = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "argocd"}});
        assert!(kube.apply(&bare, "argocd").await.unwrap().changed);
        let ns = double.object("v1", "Namespace", "", "argocd").unwrap();
        assert!(ns["metadata"].get("managedFields").is_none(), "{ns}");
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "argocd"
        );
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert!(kube.apply(&bare, "argocd").await.unwrap().changed);
        let ns = double.object("v1", "Namespace", "", "argocd").unwrap();
        assert_eq!(
            ns["metadata"]["managedFields"][0]["manager"],
            "before-first-apply"
        );
        assert!(!kube.apply(&bare, "argocd").await.unwrap().changed);
        // With a label talboot owns it, and re-applying changes nothing.
        let labelled = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "cd", "labels": {"name": "cd"}}});
        assert!(kube.apply(&labelled, "cd").await.unwrap().changed);
        for _ in 0..2 {
            assert!(!kube.apply(&labelled, "cd").await.unwrap().changed);
        }
        let ns = double.object("v1", "Namespace", "", "cd").unwrap();
        assert_eq!(
            ns["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:name": {}}}})
        );
    }

    /// Issue 31: conflicts only where another manager owns a field the apply would change,
    /// worded and coded as the server does (409, one cause per field); force moves the field,
    /// and a manager left owning nothing disappears.
    #[tokio::test]
    async fn conflicts_are_per_field_and_force_moves_ownership() {
        use kube::api::{Api, Patch, PatchParams};
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        let kube = session(&double).await;
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            kube.client().clone(),
            "default",
            &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        let cm = |v: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"}, "data": {"k": v}})
        };
        api.patch("c", &PatchParams::apply("a"), &Patch::Apply(cm("1")))
            .await
            .unwrap();
        api.patch("c", &PatchParams::apply("b"), &Patch::Apply(cm("1")))
            .await
            .unwrap();
        let err = api
            .patch("c", &PatchParams::apply("b"), &Patch::Apply(cm("2")))
            .await
            .unwrap_err();
        match err {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 409);
                assert_eq!(s.reason, "Conflict");
                assert_eq!(
                    s.message,
                    "Apply failed with 1 conflict: conflict with \"a\": .data.k"
                );
            }
            other => panic!("{other}"),
        }
        api.patch(
            "c",
            &PatchParams::apply("b").force(),
            &Patch::Apply(cm("2")),
        )
        .await
        .unwrap();
        let got = double.object("v1", "ConfigMap", "default", "c").unwrap();
        assert_eq!(got["data"]["k"], "2");
        let managers: Vec<&str> = got["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, ["b"]);
    }

    /// Issue 31: the server's warnings travel as `Warning: 299 - "<text>"` headers and
    /// talboot's client reads them back.
    #[tokio::test]
    async fn warnings_are_sent_as_headers_and_read_back() {
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        crate::install_crypto_provider();
        let kube = Kube::from_kubeconfig(double.kubeconfig().as_bytes(), Duration::from_millis(10))
            .await
            .unwrap();
        double.warn_on(
            "DaemonSet",
            "kube-system",
            "x",
            Some("deprecated \\ \"thing\""),
        );
        let a = kube
            .apply(&daemonset("kube-system", "x"), "default")
            .await
            .unwrap();
        assert_eq!(a.warnings, ["deprecated \\ \"thing\""]);
        double.warn_on("DaemonSet", "kube-system", "x", None);
        let a = kube
            .apply(&daemonset("kube-system", "x"), "default")
            .await
            .unwrap();
        assert!(a.warnings.is_empty());
    }
}
