//! talboot's provisioning listener, served to the provisioning network: iPXE scripts per
//! machine (`/boot.ipxe`), boot artifacts (`/assets/...`) and machine configs for pull
//! delivery behind one-time tokens (`/config/<token>`). The admin API is
//! [`crate::admin`]'s; it is served with this module's plumbing ([`server`], [`conn`]).
//!
//! A node's script (with its token in pull mode) and its config go only to the address
//! talboot's DHCP bound to the node ([`crate::entitlement`]); anyone else is refused with a
//! `security.refused` event on the node's timeline. Tokens never reach a log: the request span
//! records `/config/<redacted>`.
//!
//! Handlers gather inputs (inventory, store, catalog, the peer address) and hand them to pure
//! functions ([`script::plan`], [`tokens::judge`], [`assets::plan_range`],
//! [`crate::entitlement::judge`]); every boot step is a node event. What the listener learns
//! of a node beyond its events (where it fetched its script) it reports to a
//! [`BootObserver`]; it never writes node records itself.

pub mod assets;
pub mod conn;
pub mod script;
pub mod server;
pub mod tokens;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::artifacts::{Catalog, Kind, SetId};
use crate::events::{EventBus, EventKind, node_key_by_peer, unknown_node_key};
use crate::inventory::{Inventory, Mac};
use crate::store::Store;

use self::script::{BootPlan, ClientFacts, NodeState, PlanInput, Scripts};

/// Where pull delivery gets a node's rendered machine config from.
pub trait ConfigSource: Send + Sync {
    /// The machine config for `node`, or why there is none.
    fn config_for(&self, node: &str) -> Result<Vec<u8>, ConfigError>;
}

/// Why a node's rendered config is not available for pull delivery.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The rendered config file cannot be read.
    #[error(
        "cannot read the rendered config of {node} at {}: {source}; render it with \
         `talboot gen -o {}` (serve --configs points at that directory)",
        path.display(),
        dir.display()
    )]
    Read {
        /// The node.
        node: String,
        /// The file.
        path: PathBuf,
        /// The configs directory.
        dir: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
}

/// Rendered configs in a directory, `<dir>/<node>.yaml` (as `talboot gen -o DIR` writes them).
pub struct ConfigDir(pub PathBuf);

impl ConfigSource for ConfigDir {
    fn config_for(&self, node: &str) -> Result<Vec<u8>, ConfigError> {
        let path = self.0.join(format!("{node}.yaml"));
        std::fs::read(&path).map_err(|source| ConfigError::Read {
            node: node.to_owned(),
            path,
            dir: self.0.clone(),
            source,
        })
    }
}

/// What the script handler saw: an inventory node fetched its script from the address
/// talboot's DHCP bound to it (an entitled request), so it is booting there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The inventory node.
    pub node: String,
    /// The MAC its binding is for.
    pub mac: Mac,
    /// The address it asked from (its binding's).
    pub ip: Ipv4Addr,
    /// When, in Unix seconds (the event bus's clock).
    pub at: u64,
}

/// Hears what the provisioning listener saw of a node. The writer of node records implements
/// it (`provision`); the composition root picks the implementation. The script is answered
/// once [`BootObserver::saw`] returns, so whatever it records is recorded before the node
/// can act on the script.
pub trait BootObserver: Send + Sync {
    /// `seen` happened; failures are the observer's to report (the request is answered
    /// either way).
    fn saw(&self, seen: Seen) -> futures_util::future::BoxFuture<'_, ()>;
}

/// The factory command lines of the catalog's boot sets, read from the artifact cache once per
/// set: the catalog is loaded (and verified) once per process, so the files it names do not
/// change under it, and the script path does no file read per request.
#[derive(Debug, Default)]
pub struct FactoryCmdlines(
    std::sync::RwLock<std::collections::HashMap<SetId, Option<Vec<String>>>>,
);

impl FactoryCmdlines {
    /// The factory command line of `set`, if the catalog has the set and its cmdline file.
    fn get(&self, app: &HttpApp, set: &SetId) -> Option<Vec<String>> {
        if let Some(known) = self.0.read().unwrap_or_else(|e| e.into_inner()).get(set) {
            return known.clone();
        }
        // First request for the set: one small file read.
        let line = app
            .catalog
            .find(set)
            .and_then(|_| {
                std::fs::read_to_string(
                    app.images_dir
                        .join(set.rel_dir())
                        .join(Kind::Cmdline.file_name()),
                )
                .ok()
            })
            .map(|s| crate::artifacts::cmdline::parse(&s));
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(set.clone(), line.clone());
        line
    }
}

/// Everything the handlers share.
pub struct HttpApp {
    /// The validated inventory.
    pub inventory: Arc<Inventory>,
    /// The state store.
    pub store: Arc<dyn Store>,
    /// The in-memory view of node records and DHCP bindings the request paths read (their
    /// writers publish to it; no request path reads the store for them).
    pub view: Arc<crate::view::StateView>,
    /// Event publication.
    pub events: EventBus,
    /// The artifact cache.
    pub images_dir: PathBuf,
    /// Its catalog, loaded (and verified) at start.
    pub catalog: Catalog,
    /// The catalog's factory command lines, read once per set.
    pub cmdlines: FactoryCmdlines,
    /// `http://<advertise>:<port>`, the base of every URL handed to machines.
    pub base_url: String,
    /// Script templates.
    pub scripts: Scripts,
    /// Rendered machine configs for pull delivery.
    pub configs: Arc<dyn ConfigSource>,
    /// Issues and redeems pull-delivery tokens (the token table's one writer, group commit,
    /// durable before the script or the config is sent).
    pub tokens: tokens::Tokens,
    /// Who hears where an entitled node fetched its script (see [`BootObserver`]).
    pub observer: Arc<dyn BootObserver>,
}

/// The request span: method and path, with a config token replaced by `<redacted>` (a token
/// is a bearer credential for the node's config until it is used or expires).
pub(crate) fn request_span<B>(req: &axum::http::Request<B>) -> tracing::Span {
    tracing::info_span!("http", method = %req.method(), path = %redact_path(req.uri().path()))
}

/// `path` as it may be logged: everything after `/config/` is a token and is never written.
pub(crate) fn redact_path(path: &str) -> std::borrow::Cow<'_, str> {
    match path.strip_prefix("/config/") {
        Some(rest) if !rest.is_empty() => "/config/<redacted>".into(),
        _ => path.into(),
    }
}

/// The provisioning router: what machines on the provisioning network may ask for.
pub fn router(app: Arc<HttpApp>) -> Router {
    Router::new()
        .route("/boot.ipxe", get(boot_script))
        .route(
            "/assets/{talos}/{schematic}/{arch}/{file}",
            get(asset).head(asset),
        )
        .route("/config/{token}", get(config))
        .layer(tower_http::trace::TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(app)
}

/// Serve `router` on `listener` with the default [`server::Limits`] until `shutdown` is
/// cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    server::serve(
        listener,
        router,
        server::Limits::default(),
        "http",
        shutdown,
    )
    .await
}

fn peer_v4(addr: &SocketAddr) -> Option<Ipv4Addr> {
    match addr.ip() {
        std::net::IpAddr::V4(v4) => Some(v4),
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    }
}

pub(crate) fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

fn now(app: &HttpApp) -> u64 {
    app.events.clock().now_unix()
}

#[derive(Debug, Deserialize)]
struct BootQuery {
    mac: Option<String>,
    arch: Option<String>,
    platform: Option<String>,
}

/// The node's boot state from its record: no record, or an open window, means provisioning.
fn node_state(app: &HttpApp, node: &str) -> NodeState {
    if app.view.installed(node) {
        NodeState::Installed
    } else {
        NodeState::Provisioning
    }
}

async fn boot_script(
    State(app): State<Arc<HttpApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(q): Query<BootQuery>,
) -> Response {
    let Some(mac_text) = q.mac else {
        return text(StatusCode::OK, app.scripts.chain(&app.base_url));
    };
    let Ok(mac) = mac_text.parse::<Mac>() else {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "#!ipxe\necho talboot: `{}` is not a MAC address\nexit\n",
                mac_text.escape_default()
            ),
        );
    };
    let facts = ClientFacts {
        buildarch: q.arch,
        platform: q.platform,
    };
    let inv = &app.inventory;
    let node = inv.node_by_mac(mac);
    let peer_ip = peer_v4(&peer);
    let state = node
        .map(|n| node_state(&app, n.name.as_str()))
        .unwrap_or(NodeState::Provisioning);

    let factory_cmdline = factory_cmdline(&app, node, &facts);

    // A node being provisioned gets its script (and, in pull mode, a token bound to its
    // address) only at the address talboot's DHCP bound to it; anyone else gets nothing.
    let mut entitled = None;
    if let Some(n) = node {
        match script_entitlement(&app, n, mac, state, peer, peer_ip) {
            Ok(b) => entitled = b,
            Err(Forbidden) => return text(StatusCode::FORBIDDEN, "forbidden\n".into()),
        }
    }
    let mut config_url = None;
    if let (Some(n), Some(bound), NodeState::Provisioning, crate::inventory::Delivery::Pull) =
        (node, entitled, state, inv.boot.delivery)
    {
        config_url = config_url_for(&app, n, mac, bound).await;
    }

    let plan = script::plan(
        inv,
        &PlanInput {
            mac,
            state,
            facts: &facts,
            factory_cmdline,
            config_url,
        },
    );
    publish_script(&app, node, mac, &plan);
    // Only an entitled requester is where the node is; a stranger's address is never
    // reported (the push provisioner must not find it). Reported before the answer: a
    // recording observer has written what it saw by the time the node gets its script.
    if let (Some(n), Some(b)) = (node, entitled) {
        app.observer
            .saw(Seen {
                node: n.name.value.clone(),
                mac: b.mac,
                ip: b.ip,
                at: now(&app),
            })
            .await;
    }
    metrics::counter!("talboot_http_scripts_total").increment(1);
    let status = if plan.is_not_found() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    text(status, app.scripts.plan(&plan, &app.base_url))
}

/// The factory command line of the artifact set the machine boots, stored with the artifacts.
fn factory_cmdline(
    app: &HttpApp,
    node: Option<&crate::inventory::Node>,
    facts: &ClientFacts,
) -> Option<Vec<String>> {
    let inv = &app.inventory;
    let arch = node
        .map(|n| inv.arch_of(n))
        .or_else(|| facts.arch())
        .unwrap_or(inv.boot.default_arch);
    let set = SetId::new(
        &inv.cluster.talos_version.value,
        inv.cluster.installer.schematic_id(),
        arch,
    );
    app.cmdlines.get(app, &set)
}

/// A provisioning node's script asked for from an address not bound to it (answered 403).
struct Forbidden;

/// Whether node `n`'s script may go to `peer`: the binding that entitles it (none for an
/// installed node asked from elsewhere), or refused for a provisioning node's stranger.
fn script_entitlement(
    app: &HttpApp,
    n: &crate::inventory::Node,
    mac: Mac,
    state: NodeState,
    peer: SocketAddr,
    peer_ip: Option<Ipv4Addr>,
) -> Result<Option<crate::entitlement::Bound>, Forbidden> {
    let verdict = entitlement_of(app, n, peer_ip);
    match (&verdict, state) {
        (Ok(b), _) => Ok(Some(*b)),
        (Err(refusal), NodeState::Provisioning) => {
            let who = peer_ip
                .map(|p| p.to_string())
                .unwrap_or_else(|| peer.ip().to_string());
            app.events.publish(
                n.name.as_str(),
                EventKind::EntitlementRefused,
                format!("boot script for {mac} requested from {who}: refused ({refusal})"),
            );
            metrics::counter!("talboot_entitlement_refused_total", "what" => "script").increment(1);
            Err(Forbidden)
        }
        // An installed node's script only sends it to its disk; nothing to protect.
        (Err(_), NodeState::Installed) => Ok(None),
    }
}

/// The pull-mode config URL for node `n`, with a token bound to its address.
async fn config_url_for(
    app: &HttpApp,
    n: &crate::inventory::Node,
    mac: Mac,
    bound: crate::entitlement::Bound,
) -> Option<String> {
    match app
        .tokens
        .issue(n.name.as_str(), mac, bound.ip, now(app))
        .await
    {
        Ok(t) => Some(format!("{}/config/{t}", app.base_url)),
        Err(e) => {
            tracing::error!(error = %e, "cannot issue a config token");
            None
        }
    }
}

/// The events of a script served: what it does, and an unknown machine found.
fn publish_script(app: &HttpApp, node: Option<&crate::inventory::Node>, mac: Mac, plan: &BootPlan) {
    let key = node
        .map(|n| n.name.value.clone())
        .unwrap_or_else(|| unknown_node_key(mac));
    let detail = match plan {
        BootPlan::Talos { set, .. } => format!("Talos {} {} script for {mac}", set.talos, set.arch),
        BootPlan::LocalDisk { .. } => format!("local-disk script for {mac} (installed)"),
        BootPlan::Refuse { reason } => format!("refused {mac}: {reason}"),
    };
    if !(node.is_none() && matches!(plan, BootPlan::Refuse { .. })) {
        app.events.publish(&key, EventKind::Script, detail);
    }
    if node.is_none() && matches!(plan, BootPlan::Talos { .. }) {
        app.events.publish(
            &key,
            EventKind::Discovered,
            format!("{mac} boots into maintenance mode"),
        );
    }
}

/// The entitlement verdict of `requester` for node `n`, from the published bindings (a
/// binding whose commit is in flight entitles nobody).
fn entitlement_of(
    app: &HttpApp,
    n: &crate::inventory::Node,
    requester: Option<Ipv4Addr>,
) -> Result<crate::entitlement::Bound, crate::entitlement::Refusal> {
    let macs: Vec<Mac> = n.macs.iter().map(|m| m.value).collect();
    let bound = app.view.bound(app.inventory.network.mode, &macs, now(app));
    crate::entitlement::judge(bound, requester)
}

async fn asset(
    State(app): State<Arc<HttpApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((talos, schematic, arch, file)): Path<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let id = SetId {
        talos,
        schematic,
        arch,
    };
    // The UKIs are boot media like the kernel (no secrets: the command line in them is the
    // factory's, the config goes by push), served to anyone as the kernel is.
    let kind = Kind::ALL
        .into_iter()
        .chain([Kind::Uki, Kind::SecureBootUki])
        .find(|k| k.file_name() == file);
    let (Some(entry), Some(kind)) = (app.catalog.find(&id), kind) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no such artifact: {id} {file}\n"),
        );
    };
    let Some(rec) = entry.files.get(&kind) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no such artifact: {id} {file}\n"),
        );
    };
    let asset = assets::Asset {
        path: app.images_dir.join(id.rel_dir()).join(kind.file_name()),
        size: rec.size,
        sha256: rec.sha256.clone(),
        content_type: match kind {
            Kind::Cmdline => "text/plain; charset=utf-8",
            // EDK2's HttpBootDxe takes the image type from this header or from the URL's
            // `.efi` (`HttpBootCheckImageType`, NetworkPkg/HttpBootDxe/HttpBootSupport.c at
            // edk2-stable202211); both are given. It asks HEAD first for the size
            // (`HttpBootLoadFile` in HttpBootImpl.c, `HttpBootGetBootFile` with
            // HeaderOnly in HttpBootClient.c), which `assets::respond` answers with
            // Content-Length.
            Kind::Uki | Kind::SecureBootUki => "application/efi",
            _ => "application/octet-stream",
        },
    };
    let (resp, bytes) = assets::respond(&asset, &method, &headers).await;
    metrics::counter!("talboot_http_asset_bytes_total").increment(bytes);
    // A whole kernel or initramfs sent is a boot step of the node that fetched it.
    if bytes == rec.size
        && resp.status() == StatusCode::OK
        && let Some(ip) = peer_v4(&peer)
    {
        let event = match kind {
            Kind::Kernel => Some(EventKind::Kernel),
            Kind::Initramfs => Some(EventKind::Initramfs),
            Kind::Uki | Kind::SecureBootUki => Some(EventKind::Uki),
            Kind::Cmdline => None,
        };
        if let Some(ev) = event {
            let who = node_key_by_peer(&app.view, &app.inventory, ip.into());
            app.events
                .publish(&who, ev, format!("{file} of {id} ({bytes} bytes) to {ip}"));
        }
    }
    resp
}

async fn config(
    State(app): State<Arc<HttpApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(token): Path<String>,
) -> Response {
    let forbidden = || text(StatusCode::FORBIDDEN, "forbidden\n".into());
    let Some(ip) = peer_v4(&peer) else {
        return forbidden();
    };
    // The token names its node; the requester must also be where talboot's DHCP bound that
    // node now (a token does not outlive the binding it was issued for).
    if let Ok(Some(tok)) = app.tokens.get(&token).await
        && let Some(n) = app.inventory.node(&tok.node)
        && let Err(refusal) = entitlement_of(&app, n, Some(ip))
    {
        app.events.publish(
            &tok.node,
            EventKind::EntitlementRefused,
            format!("machine config requested from {ip}: refused ({refusal})"),
        );
        metrics::counter!("talboot_entitlement_refused_total", "what" => "config").increment(1);
        return forbidden();
    }
    // Decided and made durable by the token writer, off the async threads; the window is
    // asked there, at the moment of redemption.
    let viewer = app.clone();
    let window = move |node: &str| viewer.view.window_open(node);
    let outcome = app.tokens.redeem(&token, ip, now(&app), window).await;
    match outcome {
        Ok(Ok(tok)) => match app.configs.config_for(&tok.node) {
            Ok(body) => {
                app.events.publish(
                    &tok.node,
                    EventKind::ConfigReleased,
                    format!("machine config released to {ip}"),
                );
                metrics::counter!("talboot_configs_released_total").increment(1);
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/yaml")],
                    body,
                )
                    .into_response()
            }
            Err(e) => {
                tracing::error!(node = %tok.node, error = %e, "no rendered config");
                app.events.publish(
                    &tok.node,
                    EventKind::ConfigRefused,
                    "no rendered config available; run talboot gen",
                );
                // 503 makes Talos retry, and the token is spent: the next boot gets a new one.
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "config not available\n".into(),
                )
            }
        },
        Ok(Err((refusal, tok))) => {
            let who = tok.map(|t| t.node).unwrap_or_else(|| format!("ip-{ip}"));
            app.events.publish(
                &who,
                EventKind::ConfigRefused,
                format!("config request from {ip} refused: {refusal}"),
            );
            metrics::counter!("talboot_configs_refused_total").increment(1);
            forbidden()
        }
        Err(e) => {
            tracing::error!(error = %e, "token lookup failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redact_path;

    #[test]
    fn a_missing_rendered_config_names_the_file_and_the_fix() {
        use super::{ConfigDir, ConfigError, ConfigSource};
        let dir = tempfile::tempdir().unwrap();
        let e = ConfigDir(dir.path().to_path_buf())
            .config_for("cp-1")
            .unwrap_err();
        let ConfigError::Read { node, path, .. } = &e;
        assert_eq!(
            (node.as_str(), path),
            ("cp-1", &dir.path().join("cp-1.yaml"))
        );
        let msg = e.to_string();
        assert!(msg.contains("cp-1.yaml"), "{msg}");
        assert!(
            msg.contains(&format!("`talboot gen -o {}`", dir.path().display())),
            "{msg}"
        );
    }

    #[test]
    fn config_tokens_are_redacted_from_logged_paths() {
        let token = "a".repeat(64);
        assert_eq!(
            redact_path(&format!("/config/{token}")),
            "/config/<redacted>"
        );
        // Anything after /config/ is redacted, well-formed or not.
        assert_eq!(redact_path("/config/x/y"), "/config/<redacted>");
        assert_eq!(redact_path("/config/"), "/config/");
        assert_eq!(redact_path("/boot.ipxe"), "/boot.ipxe");
        assert_eq!(
            redact_path("/assets/v1.13.9/s/amd64/kernel"),
            "/assets/v1.13.9/s/amd64/kernel"
        );
    }
}
