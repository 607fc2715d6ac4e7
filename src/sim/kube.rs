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
use axum::http::StatusCode;
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
use super::pki::{CertKey, PkiError, SimCa};

mod cluster;
mod routes;
mod writes;

use cluster::{Cluster, Shared, Stored, set_node};
use routes::{handle, object_key};

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

/// A fresh cluster as an API server starts it: the `kube-system` and `default` Namespaces,
/// resourceVersions counting from 100.
fn seeded_cluster(opts: &DoubleOptions, now: Instant) -> Cluster {
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
    cluster
}

/// A kubeconfig for `system:masters` on this double at `server_addr`, every certificate
/// inline.
fn admin_kubeconfig(server_addr: SocketAddr, ca: &SimCa, client: &CertKey) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    \
         server: https://{server_addr}\n    certificate-authority-data: {ca}\nusers:\n\
         - name: admin\n  user:\n    client-certificate-data: {crt}\n    \
         client-key-data: {key}\ncontexts:\n- name: admin@double\n  context:\n    \
         cluster: double\n    user: admin\ncurrent-context: admin@double\n",
        ca = STANDARD.encode(&ca.cert_pem),
        crt = STANDARD.encode(&client.cert_pem),
        key = STANDARD.encode(&client.key_pem),
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
        let cluster = seeded_cluster(&opts, Instant::now());
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

        let kubeconfig = admin_kubeconfig(server_addr, &ca, &client);
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
