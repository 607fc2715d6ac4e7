//! The etcd [`Store`](super::Store) backend (issue 28 item 1): the same tables as the redb
//! file, kept in etcd under `/talboot/<cluster>/`, so several appliances can share one state.
//!
//! Key layout (schema version 1, the redb schema's; records are the same serde JSON):
//!
//! | key | value |
//! |---|---|
//! | `schema_version` | `1` (decimal), written once with a compare on its absence |
//! | `leases/ip/<8 hex digits of the address>` | JSON [`Lease`](super::Lease); hex so key order is address order |
//! | `leases/mac/<aa:bb:cc:dd:ee:ff>` | the dotted address of that MAC's non-declined lease |
//! | `nodes/<name>` | JSON [`NodeRecord`](super::NodeRecord) |
//! | `node_facts/<name>`, `node_lifecycle/<name>` | the node parts (JSON) |
//! | `events/<node, `%` and `/` escaped>/<seq, 20 digits>` | JSON [`Event`](super::Event) |
//! | `event_head/<node>` | a copy of the node's newest event: what an append numbers from and compares |
//! | `cluster_meta/<key>`, `cluster_progress/<key>`, `pull_tokens/<key>`, `rollouts/<key>` | bytes as given |
//!
//! Transactions. Every write call is one etcd transaction, durable on a quorum when it
//! returns (so `commit_leases`' `durable: false` is as durable as `true` here), except that a
//! call needing more than `--max-txn-ops` (etcd's default 128, [`DEFAULT_MAX_TXN_OPS`])
//! compares or writes is split into several, each atomic:
//! lease commits between groups (a [`LeaseCommit`](super::LeaseCommit) is never split),
//! plain puts between rows. A lease commit compares every lease key it writes against the
//! revision this store last saw (see [`plan`]), so two appliances can never both commit one
//! address; the loser gets [`StoreError::EtcdConflict`] and nothing of its transaction is
//! written. Event numbers come from the node's `event_head`, compared the same way; an
//! append that loses a race is planned again from the new head, so numbers stay gap-free
//! and unique across appliances.
//!
//! The traits are synchronous; the async client runs on one dedicated runtime thread, and
//! every call waits for its answer on a channel with a timeout, so a call from any thread,
//! a tokio worker included, neither panics nor hangs when etcd is gone
//! ([`StoreError::EtcdTimeout`], [`StoreError::Etcd`], naming the endpoints).
//!
//! A lease commit whose answer is lost (a timeout, a connection cut after sending) may
//! still have been applied: its keys are read back, and when they hold exactly what it
//! wrote, at one revision newer than the compared ones, it counts as committed
//! ([`plan::applied`]). Otherwise the error is returned, and this store's view of the lease
//! keys may be stale: its next commit of those keys fails as a conflict until the caller
//! reloads ([`EtcdStore::reload_leases`]) along with its lease book.
//!
//! Selected by `serve --store etcd://...` (and `etcds://` with `--etcd-cacert`,
//! `--etcd-cert`, `--etcd-key`, etcdctl's `--cacert/--cert/--key`); an open whose first
//! request fails says which of those flags to check ([`StoreError::EtcdUnreachable`]).
//!
//! For the DHCP server on a shared store (issue 28 item 2): `watch` (the lease feed: other
//! appliances' lease changes, the compare view kept by them) and `members` (each appliance's
//! `members/<name>` under its own etcd lease, and the live set). The DHCP side's reaction
//! to [`StoreError::EtcdConflict`] is in `dhcp::server::ha`.

mod backend;
mod balance;
pub(crate) mod election;
#[cfg(test)]
mod feed_tests;
pub(crate) mod fence;
mod follow;
pub mod health;
mod keys;
#[cfg(test)]
mod leader_tests;
mod members;
pub mod migrate;
#[cfg(test)]
mod migrate_tests;
mod plan;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
mod watch;

pub use self::members::{DEFAULT_TTL as MEMBER_TTL, Member, Membership};
pub use self::watch::{LeaseEvent, LeaseFilter};

use std::future::Future;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use self::keys::Keys;
use self::plan::View;
use super::{Result, StoreError};

/// etcd's default `--max-txn-ops`: the most compares, and the most operations of each branch,
/// one transaction may carry (etcd-io/etcd v3.4.23 `embed/config.go` `DefaultMaxTxnOps`;
/// enforced by `checkTxnRequest` in `etcdserver/api/v3rpc/key.go`).
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// How to reach etcd, with TLS named as etcdctl names its flags (`--cacert`, `--cert`,
/// `--key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs (`http://10.0.0.2:2379`, `https://...`); a bare `host:port` is
    /// `https://` when TLS is configured, else `http://`.
    pub endpoints: Vec<String>,
    /// Names the key prefix, `/talboot/<cluster>/`: appliances of one fleet share it.
    pub cluster: String,
    /// CA bundle that signed etcd's server certificates (`--cacert`).
    pub cacert: Option<PathBuf>,
    /// Client certificate (`--cert`), with `key`.
    pub cert: Option<PathBuf>,
    /// Client key (`--key`), with `cert`.
    pub key: Option<PathBuf>,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
    /// How long one store call may wait for etcd.
    pub request_timeout: Duration,
    /// The etcd cluster's `--max-txn-ops` (128 unless its operator raised it).
    pub max_txn_ops: usize,
}

impl EtcdConfig {
    /// Plain-HTTP defaults for `endpoints` and `cluster`.
    pub fn new(endpoints: Vec<String>, cluster: &str) -> Self {
        Self {
            endpoints,
            cluster: cluster.to_owned(),
            cacert: None,
            cert: None,
            key: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
        }
    }

    /// The configuration a `--store` value names: `etcd://host:port[,host:port...]`
    /// (`etcds://` for TLS endpoints), for `cluster`.
    pub fn from_url(url: &str, cluster: &str) -> Result<Self> {
        let bad = |why: &str| StoreError::EtcdConfig {
            cause: format!("--store {url}: {why}; expected etcd://host:port[,host:port...]"),
        };
        let (scheme, rest) = match url.split_once("://") {
            Some(("etcd", rest)) => ("http", rest),
            Some(("etcds", rest)) => ("https", rest),
            _ => return Err(bad("not an etcd:// URL")),
        };
        let endpoints: Vec<String> = rest
            .trim_end_matches('/')
            .split(',')
            .map(|host| {
                let port = host.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
                match port {
                    Some(Ok(_)) if !host.contains('/') => Ok(format!("{scheme}://{host}")),
                    _ => Err(bad(&format!("`{host}` is not host:port"))),
                }
            })
            .collect::<Result<_>>()?;
        Ok(Self::new(endpoints, cluster))
    }

    fn tls(&self) -> Result<Option<TlsOptions>> {
        let read = |what: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| StoreError::EtcdConfig {
                cause: format!("cannot read {what} {}: {e}", path.display()),
            })
        };
        let mut tls = None;
        if let Some(ca) = &self.cacert {
            let pem = read("--cacert", ca)?;
            tls = Some(TlsOptions::new().ca_certificate(Certificate::from_pem(pem)));
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let id = Identity::from_pem(read("--cert", cert)?, read("--key", key)?);
                tls = Some(tls.unwrap_or_default().identity(id));
            }
            (None, None) => {}
            _ => {
                return Err(StoreError::EtcdConfig {
                    cause: "--cert and --key go together".into(),
                });
            }
        }
        Ok(tls)
    }

    fn urls(&self, tls: bool) -> Vec<String> {
        let scheme = if tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| {
                if e.contains("://") {
                    e.clone()
                } else {
                    format!("{scheme}://{e}")
                }
            })
            .collect()
    }
}

/// The runtime thread the async client runs on. Dropping it ends the thread, which drops
/// the runtime there (a runtime dropped on a tokio worker would panic).
struct Bridge {
    handle: tokio::runtime::Handle,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Bridge {
    fn start() -> Result<Self> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (tx, rx) = sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("talboot-etcd".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stopped.await;
                });
            });
        let cause = match spawned {
            Ok(_) => match rx.recv() {
                Ok(Ok(handle)) => {
                    return Ok(Self {
                        handle,
                        _stop: stop,
                    });
                }
                Ok(Err(e)) => e,
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        Err(StoreError::EtcdConfig {
            cause: format!("cannot start the etcd client thread: {cause}"),
        })
    }
}

/// [`Store`](super::Store) kept in etcd; see the module doc.
pub struct EtcdStore {
    client: Client,
    /// Which endpoints the client sends requests to ([`balance`]); `None` with one endpoint.
    balanced: Option<balance::Shared>,
    /// Requests refused at connect and sent again ([`Self::call`]): what a dead member left
    /// among the balanced endpoints costs.
    refused: std::sync::Arc<AtomicU64>,
    bridge: Bridge,
    keys: Keys,
    /// The endpoints, for errors.
    named: String,
    timeout: Duration,
    /// How many endpoints the client balances over.
    endpoints: usize,
    max_ops: usize,
    /// Every lease key (records and MAC index) as this store last saw it: loaded on open,
    /// kept by its own commits. Lease commits compare against it.
    leases: Mutex<View>,
    /// How the leader's writes are fenced ([`fence`]).
    fencing: fence::Fencing,
    /// Dropped with the store, resolving its [`Closed`](super::Closed).
    closing: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.named)
            .field("prefix", &self.keys.root())
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connect, check (or write) the schema version, and load the lease keys.
    pub fn open(cfg: &EtcdConfig) -> Result<Self> {
        if cfg.endpoints.is_empty() {
            return Err(StoreError::EtcdConfig {
                cause: "no etcd endpoint given".into(),
            });
        }
        let tls = cfg.tls()?;
        let urls = cfg.urls(tls.is_some());
        let named = urls.join(",");
        let bridge = Bridge::start()?;
        // A member that dies without closing its connections (power loss, a partition; and,
        // measured in tests/ha_netns, a SIGKILLed leader) leaves the HTTP/2 connection open
        // until TCP gives up, some 40 s, and every stream on it (the lease feed, membership
        // keep-alives) silent meanwhile. HTTP/2 pings find it within interval + timeout. etcd
        // refuses pings closer than `--grpc-keepalive-min-time` (5 s) and any ping without an
        // open stream (etcd-io/etcd v3.4.23 `embed/etcd.go`, `KeepaliveEnforcementPolicy`
        // with `PermitWithoutStream: false`), so: every 5 s, only while streams are open.
        // `require_leader` makes a member without a leader fail a watch instead of holding it
        // (clientv3 `WithRequireLeader`, `etcdserver/api/v3rpc/interceptor.go`).
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_require_leader(true);
        if let Some(tls) = tls {
            opts = opts.with_tls(tls);
        }
        let (tx, rx) = sync_channel(1);
        let (connect_urls, connect_opts) = (urls.clone(), opts.clone());
        bridge.handle.spawn(async move {
            let _ = tx.send(Client::connect(connect_urls, Some(connect_opts)).await);
        });
        let client = match rx.recv_timeout(cfg.connect_timeout + Duration::from_secs(1)) {
            Ok(Ok(client)) => client,
            Ok(Err(source)) => {
                return Err(StoreError::Etcd {
                    endpoints: named,
                    op: "connect",
                    source: Box::new(source),
                });
            }
            Err(_) => {
                return Err(StoreError::EtcdTimeout {
                    endpoints: named,
                    op: "connect",
                    after: cfg.connect_timeout,
                });
            }
        };
        // With one endpoint there is nothing to choose between.
        let balanced = (urls.len() > 1)
            .then(|| balance::spawn(&bridge.handle, client.clone(), urls.clone(), opts));
        let store = Self {
            client,
            balanced,
            refused: Default::default(),
            bridge,
            keys: Keys::new(&cfg.cluster),
            named,
            timeout: cfg.request_timeout,
            endpoints: cfg.endpoints.len(),
            max_ops: cfg.max_txn_ops.max(1),
            leases: Mutex::new(View::new()),
            fencing: Default::default(),
            closing: None,
        };
        let tls_on = cfg.cacert.is_some() || cfg.cert.is_some();
        store.check_schema().map_err(|e| explain_open(e, tls_on))?;
        store.reload_leases()?;
        Ok(store)
    }

    /// A future that resolves when this store is dropped (its last reference gone), as
    /// [`RedbStore::on_close`](super::RedbStore) gives for the file.
    pub(crate) fn on_close(&mut self) -> super::Closed {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.closing = Some(tx);
        super::Closed(rx)
    }

    /// The shared reader and the one set of write handles of this store.
    pub fn split(self) -> (std::sync::Arc<Self>, super::Writers) {
        let store = std::sync::Arc::new(self);
        let writers = super::Writers::new(store.clone());
        (store, writers)
    }

    /// Run `f(client, req)` on the runtime thread and wait for it, at most the request
    /// timeout. A request refused at connect (a dead member among the endpoints, which the
    /// client's balancer picks until the probe takes it out, [`balance`]) never reached
    /// etcd, so it is sent again, to the
    /// next endpoint; any other error is returned, since a request that reached etcd may
    /// have been applied.
    fn call<T, R, F, Fut>(&self, op: &'static str, req: R, f: F) -> Result<T>
    where
        T: Send + 'static,
        R: Clone + Send + 'static,
        F: Fn(Client, R) -> Fut + Send + 'static,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send + 'static,
    {
        let (tx, rx) = sync_channel(1);
        let client = self.client.clone();
        let timeout = self.timeout;
        let attempts = self.endpoints * 2;
        let refused = self.refused.clone();
        self.bridge.handle.spawn(async move {
            let fut = async move {
                let mut left = attempts;
                loop {
                    match f(client.clone(), req.clone()).await {
                        Err(e) if left > 1 && refused_at_connect(&e) => {
                            left -= 1;
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        out => return out,
                    }
                }
            };
            let _ = tx.send(tokio::time::timeout(timeout, fut).await);
        });
        let timed_out = || StoreError::EtcdTimeout {
            endpoints: self.named.clone(),
            op,
            after: timeout,
        };
        // The runtime enforces the timeout; the slack covers a runtime thread that is gone.
        match rx.recv_timeout(timeout + Duration::from_secs(1)) {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(source))) => Err(StoreError::Etcd {
                endpoints: self.named.clone(),
                op,
                source: Box::new(source),
            }),
            Ok(Err(_)) | Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                Err(timed_out())
            }
        }
    }

    fn data_err(&self, key: impl Into<String>, cause: impl Into<String>) -> StoreError {
        StoreError::EtcdData {
            endpoints: self.named.clone(),
            key: key.into(),
            cause: cause.into(),
        }
    }

    /// Write the schema version if the prefix has none; refuse one this build does not know.
    fn check_schema(&self) -> Result<()> {
        let key = self.keys.schema();
        let version = super::SCHEMA_VERSION.to_string();
        let txn = etcd_client::Txn::new()
            .when([etcd_client::Compare::create_revision(
                key.clone(),
                etcd_client::CompareOp::Equal,
                0,
            )])
            .and_then([etcd_client::TxnOp::put(key.clone(), version, None)])
            .or_else([etcd_client::TxnOp::get(key.clone(), None)]);
        let resp = self.call("write schema version", txn, |mut c, txn| async move {
            c.txn(txn).await
        })?;
        if resp.succeeded() {
            return Ok(());
        }
        let stored = backend::first_get(&resp).and_then(|kvs| kvs.first().cloned());
        let found = stored
            .as_ref()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok())
            .and_then(|v| v.parse::<u64>().ok());
        let name = String::from_utf8_lossy(&key).into_owned();
        match found {
            Some(v) if v == super::SCHEMA_VERSION => Ok(()),
            Some(v) if v > super::SCHEMA_VERSION => Err(self.data_err(
                name,
                format!(
                    "schema version {v}, but this talboot supports up to {}; upgrade talboot",
                    super::SCHEMA_VERSION
                ),
            )),
            _ => Err(self.data_err(
                name,
                "not a schema version talboot wrote (another program's keys?); name another \
                 prefix with --etcd-cluster",
            )),
        }
    }

    /// Read every lease key afresh into the view lease commits compare against (on open;
    /// after an [`StoreError::EtcdConflict`], once the caller has reloaded its book).
    pub fn reload_leases(&self) -> Result<()> {
        let prefix = self.keys.leases();
        let kvs = self.get_prefix("read leases", prefix)?;
        let view: View = kvs
            .into_iter()
            .map(|kv| {
                let (rev, (k, v)) = (kv.mod_revision(), kv.into_key_value());
                (k, (rev, v))
            })
            .collect();
        *self.leases.lock().unwrap_or_else(|p| p.into_inner()) = view;
        Ok(())
    }

    /// A handle on the client, for the HA parts (membership, election, watches) that hold
    /// long-lived streams of their own; run them on [`EtcdStore::runtime`].
    #[allow(dead_code)] // used by the HA lanes (issue 28) as they land
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The runtime thread the client lives on: spawn keep-alives and watches here, so they
    /// run whatever runtime (or none) the caller has.
    #[allow(dead_code)] // used by the HA lanes (issue 28) as they land
    pub(crate) fn runtime(&self) -> tokio::runtime::Handle {
        self.bridge.handle.clone()
    }

    /// The key prefix of this fleet, `/talboot/<cluster>/`; HA keys (members, election)
    /// live under it.
    #[allow(dead_code)] // used by the HA lanes (issue 28) as they land
    pub(crate) fn root(&self) -> Vec<u8> {
        self.keys.root().into_bytes()
    }

    /// The endpoints, as errors name them.
    #[allow(dead_code)] // used by the HA lanes (issue 28) as they land
    pub(crate) fn endpoints_named(&self) -> &str {
        &self.named
    }

    /// Which configured endpoints requests go to now (all of them with a single endpoint).
    #[allow(dead_code)] // for status (issue 28 item 4) and tests
    pub(crate) fn balanced_endpoints(&self) -> Vec<bool> {
        match &self.balanced {
            Some(b) => b
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .inside()
                .to_vec(),
            None => vec![true; self.endpoints],
        }
    }

    /// How many requests were refused at connect and sent again since the store opened.
    #[allow(dead_code)] // for metrics and tests
    pub(crate) fn refused_requests(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The per-request timeout.
    #[allow(dead_code)] // used by the HA lanes (issue 28) as they land
    pub(crate) fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// Every key under `prefix`, in key order, at one revision.
    fn get_prefix(&self, op: &'static str, prefix: Vec<u8>) -> Result<Vec<etcd_client::KeyValue>> {
        self.call(op, prefix, |mut c, prefix| async move {
            let end = keys::prefix_end(&prefix);
            let opts = etcd_client::GetOptions::new().with_range(end);
            let mut resp = c.get(prefix, Some(opts)).await?;
            Ok(resp.take_kvs())
        })
    }
}

/// Whether `e` is a connection refused before the request was sent: the one failure that is
/// safe to send again (the transport reports it as `Unavailable` carrying the connect error).
fn refused_at_connect(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return false;
    };
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        cause = c.source();
    }
    false
}

/// Why an open's first request failed, as far as the operator's flags go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenFailure {
    /// Nothing accepts connections there.
    Refused,
    /// This client refused the server's certificate (not signed by `--cacert`'s CA, or
    /// another name).
    ServerCertificate,
    /// The server refused this client's certificate, or its absence (`--client-cert-auth`).
    ClientCertificate,
    /// Some other TLS failure: mostly TLS spoken to a plain port or the other way round.
    Tls,
    /// Anything else (left as it is).
    Other,
}

impl OpenFailure {
    fn fix(self) -> &'static str {
        match self {
            Self::Refused => {
                "nothing accepts connections there: check the --store endpoints against etcd's \
                 --advertise-client-urls, and that etcd runs"
            }
            Self::ServerCertificate => {
                "etcd's server certificate is not signed by the CA in --etcd-cacert (etcdctl's \
                 --cacert; etcd's --trusted-ca-file names the usual one), or does not name this \
                 address"
            }
            Self::ClientCertificate => {
                "etcd refused the client certificate: with --client-cert-auth it needs \
                 --etcd-cert and --etcd-key (etcdctl's --cert/--key) signed by its \
                 --trusted-ca-file"
            }
            Self::Tls => {
                "the TLS handshake failed: use etcds:// for an etcd whose client URLs are \
                 https://, etcd:// for http://"
            }
            Self::Other => "",
        }
    }
}

/// Whether `e` is the transport giving up on a connection (closed or cancelled under it),
/// not an answer from etcd.
fn closed_in_transport(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            matches!(status.code(), tonic::Code::Cancelled | tonic::Code::Unknown)
                && std::error::Error::source(status).is_some()
        }
        _ => false,
    }
}

/// What `e` says about the connection: a refused connect, or a TLS alert or certificate
/// error from rustls (which tonic's transport wraps in `io::Error`s of kind `InvalidData`).
fn classify(e: &etcd_client::Error) -> OpenFailure {
    // etcd_client's error names no source; the status and the transport error do.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        etcd_client::Error::TransportError(t) => Some(t),
        other => Some(other),
    };
    while let Some(c) = cause {
        let tls = c.downcast_ref::<rustls::Error>().or_else(|| {
            c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return match tls {
                rustls::Error::InvalidCertificate(_) => OpenFailure::ServerCertificate,
                rustls::Error::AlertReceived(_) => OpenFailure::ClientCertificate,
                _ => OpenFailure::Tls,
            };
        }
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return OpenFailure::Refused;
        }
        cause = c.source();
    }
    OpenFailure::Other
}

/// The first request of an open failed: say which flag to check when the failure says
/// (connection refused, TLS refused) or nothing answered in time (no quorum). Over TLS, a
/// server that refuses the client certificate may close the connection before its alert
/// is read (TLS 1.3 ends the client's handshake first), which reaches us as a cancelled or
/// unknown transport error: that is reported as the client certificate's refusal too.
fn explain_open(e: StoreError, tls: bool) -> StoreError {
    match e {
        StoreError::Etcd {
            endpoints,
            op,
            source,
        } => {
            let mut why = classify(&source);
            if why == OpenFailure::Other && tls && closed_in_transport(&source) {
                why = OpenFailure::ClientCertificate;
            }
            if why == OpenFailure::Other {
                return StoreError::Etcd {
                    endpoints,
                    op,
                    source,
                };
            }
            StoreError::EtcdUnreachable {
                endpoints,
                fix: why.fix(),
                cause: source.to_string(),
            }
        }
        StoreError::EtcdTimeout {
            endpoints, after, ..
        } => StoreError::EtcdUnreachable {
            endpoints,
            cause: format!("no answer within {after:?}"),
            fix: "is etcd up at the --store endpoints, with a quorum of its members \
                  (`etcdctl endpoint health --cluster`)?",
        },
        other => other,
    }
}
