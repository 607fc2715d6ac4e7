//! The admin API, served on the admin listener only (`serve --admin-listen`, loopback by
//! default; off loopback behind the operator's token, [`auth`]): node status as JSON
//! (`/api/nodes`), the fleet on a shared etcd (`/api/ha`, [`ha`]), rebuild requests, power requests ([`power`]), day-two rollouts while serve
//! runs ([`rollouts`]), Prometheus metrics (`/metrics`) and the dashboard with its snapshot
//! and event stream ([`dashboard`], [`events_stream`]).
//!
//! It owns what only the operator's side needs: the rollout registry and the power drivers.
//! Node records stay the provisioner's to write: a rebuild goes to it as a command while it
//! runs. The listener itself is [`crate::http`]'s plumbing ([`crate::http::server`]).

pub mod auth;
pub mod dashboard;
pub(crate) mod events_stream;
pub(crate) mod ha;
pub(crate) mod power;
#[cfg(test)]
mod power_tests;
pub(crate) mod rollouts;
#[cfg(test)]
mod test_app;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::events::{EventBus, EventKind};
use crate::http::text;
use crate::inventory::Inventory;
use crate::store::Store;

/// Everything the admin handlers share.
pub(crate) struct AdminApp {
    /// The validated inventory.
    pub inventory: Arc<Inventory>,
    /// The state store.
    pub store: Arc<dyn Store>,
    /// The in-memory view of node records the provisioning side publishes (drift included).
    pub view: Arc<crate::view::StateView>,
    /// Event publication.
    pub events: EventBus,
    /// Prometheus rendering, when metrics are installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Who takes a rebuild: the node records' one writer (the running provisioner, or
    /// without push provisioning the offline observer, which applies the core's rules).
    pub commands: crate::provision::Rebuilds,
    /// Rollouts through serve, with its Talos admin credentials (only when serve provisions:
    /// without push provisioning it has none).
    pub rollouts: Option<Arc<dyn rollouts::RolloutHost>>,
    /// The nodes' power controllers (only when serve provisions, which resolves their
    /// credentials at start).
    pub power: Option<power::PowerDesk>,
    /// The fleet's election on a shared etcd (`None` on redb: this appliance always leads).
    pub leader: Option<Arc<crate::store::election::LeaderBoard>>,
    /// On a shared etcd: the store and the health probe, for `/api/ha` (`None` on redb).
    pub ha: Option<ha::HaSource>,
}

/// Who leads the fleet, as `{"me": {name, admin_url}, "leading": bool, "leader": {..} or
/// null}`; on redb (no election) `{"leading": true}`: the one appliance always leads.
async fn api_leader(State(app): State<Arc<AdminApp>>) -> Response {
    let Some(board) = &app.leader else {
        return Json(serde_json::json!({ "leading": true })).into_response();
    };
    Json(serde_json::json!({
        "me": board.me,
        "leading": board.leading(),
        "leader": board.leader().await,
    }))
    .into_response()
}

/// The answer to a rebuild or rollout sent to a follower: 421 Misdirected Request, naming
/// the leader and its admin API (`None`: this appliance leads, or there is no election).
pub(crate) async fn not_leader(app: &AdminApp) -> Option<Response> {
    let board = app.leader.as_ref()?;
    if board.leading() {
        return None;
    }
    let body = match board.leader().await {
        Some(l) => format!(
            "this appliance ({}) is not the leader: send this request to {} at {}\n",
            board.me.name, l.name, l.admin_url
        ),
        None => format!(
            "this appliance ({}) is not the leader, and no appliance leads right now; try again\n",
            board.me.name
        ),
    };
    Some(text(StatusCode::MISDIRECTED_REQUEST, body))
}

fn now(app: &AdminApp) -> u64 {
    app.events.clock().now_unix()
}

/// The admin router (`serve --admin-listen`, loopback by default): status, rebuild and
/// metrics. Never served to the provisioning network: `/api/nodes` lists every node's MAC, and
/// a rebuild wipes a machine. Off loopback every request needs `token` ([`auth`]).
pub(crate) fn router(
    app: Arc<AdminApp>,
    token: Option<Arc<auth::AdminToken>>,
    names: Arc<dashboard::AdminHosts>,
) -> Router {
    Router::new()
        .route("/api/nodes", get(api_nodes))
        .route(
            "/api/nodes/{name}/rebuild",
            axum::routing::post(api_rebuild),
        )
        .route(
            "/api/nodes/{name}/power/{op}",
            axum::routing::post(power::api_power),
        )
        .route(
            "/api/nodes/{name}/boot/{device}",
            axum::routing::post(power::api_boot),
        )
        .route("/api/rollouts", axum::routing::post(rollouts::api_start))
        .route("/api/rollouts/{id}", get(rollouts::api_progress))
        .route("/api/leader", get(api_leader))
        .route("/api/ha", get(ha::api_ha))
        .route("/metrics", get(metrics))
        .merge(dashboard::routes())
        .layer(axum::middleware::from_fn_with_state(
            names,
            dashboard::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(token, auth::guard))
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(crate::http::request_span),
        )
        .with_state(app)
}

#[derive(serde::Serialize)]
struct NodeStatus {
    name: String,
    role: String,
    macs: Vec<String>,
    address: String,
    phase: String,
    last_seen: Option<String>,
    talos_version: Option<String>,
    /// The disk Talos installs to, as talboot computed it (`talboot status` shows it).
    install_disk: Option<String>,
    last_event: Option<String>,
    /// Why the node failed, when its phase is `failed`.
    failure: Option<String>,
    /// Whether it runs what the inventory renders, as serve's drift watcher last saw it
    /// (absent: not checked yet, not configured, or unreachable).
    drift: Option<crate::view::drift::DriftState>,
}

async fn api_nodes(State(app): State<Arc<AdminApp>>) -> Response {
    // Every store read off the async threads.
    match tokio::task::spawn_blocking(move || node_statuses(&app)).await {
        Ok(out) => Json(out).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

fn node_statuses(app: &AdminApp) -> Vec<NodeStatus> {
    let mut out = Vec::new();
    for n in &app.inventory.nodes {
        let rec = app.store.node(n.name.as_str()).ok().flatten();
        let last = app.store.last_event(n.name.as_str()).ok().flatten();
        let failure = if rec
            .as_ref()
            .is_some_and(|r| r.phase == crate::store::NodePhase::Failed)
        {
            crate::store::Lifecycle::load(app.store.as_ref(), n.name.as_str())
                .ok()
                .and_then(|l| l.failure)
        } else {
            None
        };
        out.push(NodeStatus {
            name: n.name.value.clone(),
            role: n.role.value.clone(),
            macs: n.macs.iter().map(|m| m.value.to_string()).collect(),
            address: n.address.value.to_string(),
            phase: rec
                .as_ref()
                .map(|r| r.phase.to_string())
                .unwrap_or_else(|| "unknown".into()),
            last_seen: rec
                .as_ref()
                .and_then(|r| r.last_seen_addr)
                .map(|a| a.to_string()),
            talos_version: rec.and_then(|r| r.talos_version),
            install_disk: crate::store::NodeFacts::load(app.store.as_ref(), n.name.as_str())
                .map(|f| f.install_disk)
                .filter(|d| !d.is_empty()),
            last_event: last.map(|e| format!("{}: {}", e.kind, e.display_detail())),
            failure,
            drift: app.view.drift.get(n.name.as_str()),
        });
    }
    out
}

/// Mark a node for rebuild while `serve` runs (the store is locked to this process, so
/// `talboot node rebuild` asks here). The provisioner resets the node on its next pass. This
/// wipes a machine, so only requests from this host itself are accepted: the provisioning
/// network cannot reach it. A node that holds no config from talboot (never provisioned, or
/// waiting for its config) has nothing to reset: 409 Conflict with the reason and what
/// happens instead.
async fn api_rebuild(
    State(app): State<Arc<AdminApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    admitted: Option<axum::Extension<auth::Admitted>>,
    Path(name): Path<String>,
) -> Response {
    if !auth::permitted(&peer, admitted.as_ref()) {
        return text(StatusCode::FORBIDDEN, "forbidden\n".into());
    }
    if app.inventory.node(&name).is_none() {
        return text(
            StatusCode::NOT_FOUND,
            format!("node {name:?} is not in the inventory\n"),
        );
    }
    if let Some(refused) = not_leader(&app).await {
        return refused;
    }
    match &app.commands {
        crate::provision::Rebuilds::Provisioner(commands) => {
            // The provisioner persists the request before it answers.
            match commands.rebuild(&name).await {
                Ok(()) => {}
                // Nothing to reset: the node's state says no, not serve's availability.
                Err(crate::provision::CommandError::NothingToReset(r)) => {
                    return text(StatusCode::CONFLICT, format!("{r}\n"));
                }
                Err(e) => return text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
            }
        }
        crate::provision::Rebuilds::Offline(offline) => {
            match offline.rebuild(name.clone(), now(&app)).await {
                Ok(None) => {}
                Ok(Some(refused)) => {
                    return text(StatusCode::CONFLICT, format!("{refused}\n"));
                }
                Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            }
            app.events.publish(
                &name,
                EventKind::Phase,
                "rebuilding: rebuild requested by the operator",
            );
        }
    }
    text(
        StatusCode::ACCEPTED,
        format!(
            "{name}: marked for rebuild; talboot resets it and provisions it again on its next boot\n"
        ),
    )
}

async fn metrics(State(app): State<Arc<AdminApp>>) -> Response {
    match &app.metrics {
        Some(h) => text(StatusCode::OK, h.render()),
        None => text(StatusCode::NOT_FOUND, "metrics are not enabled\n".into()),
    }
}
