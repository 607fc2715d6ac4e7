//! The dashboard on the admin listener: one page, its script and its style sheet (compiled
//! into the binary from `src/admin/dashboard/`; nothing is fetched from anywhere else, and the
//! page's Content-Security-Policy forbids it), the snapshot it renders (`GET /api/dashboard`)
//! and the live event stream it follows (`GET /api/events`, server-sent events).
//!
//! The page shows the rack by role with each node's phase and how far its provisioning got
//! ([`MILESTONES`]), the cluster steps, every node's timeline with timestamps and failure
//! reasons, and offers rebuild and power actions behind a confirmation; the actions are the
//! admin API's existing POST routes. What the page shows is decided here, in pure functions
//! over the store's records ([`progress`], [`cluster_steps`], [`is_failure`]); the script
//! only draws it and re-reads the snapshot when an event arrives. On a shared etcd the page
//! also shows the appliances, the leader and etcd's health, as `/api/ha` ([`super::ha`])
//! says them.
//!
//! The admin listener is loopback by default (off loopback it needs the token,
//! [`super::auth`]), but a browser on that host also runs other sites'
//! pages: [`admit`] refuses requests whose `Host` is a name other than `localhost` or one the
//! operator listed (`serve --admin-host`; DNS rebinding) and cross-origin POSTs (a page
//! elsewhere submitting a rebuild).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::AdminApp;
use crate::events::NodeEvent;
use crate::store::{CLUSTER_TIMELINE, ClusterStep, Event, NodePhase, StepRecord};

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const STYLE_CSS: &str = include_str!("dashboard/style.css");

/// The page may load and connect to its own origin only: no CDN, no inline script.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Events of a node's timeline in the snapshot (the newest ones).
const TIMELINE_LEN: usize = 40;
/// Events read from the store per node to find the current attempt (a boot is ~20 events).
const SCAN_LEN: usize = 2_000;
/// A comment line on the event stream this often, so a vanished browser is noticed (the
/// write fails) and the idle timeout never ends a quiet stream.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// The routes of the dashboard, merged into the admin router.
pub(crate) fn routes() -> Router<Arc<AdminApp>> {
    Router::new()
        .route("/", get(index))
        .route("/dashboard/app.js", get(app_js))
        .route("/dashboard/style.css", get(style_css))
        // Browsers ask for it unprompted; the page has no icon, and a 404 would be an error.
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/api/dashboard", get(snapshot))
        .route("/api/events", get(events))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    let mut r = asset("text/html; charset=utf-8", INDEX_HTML);
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    r
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

/// Why a request to the admin listener is refused, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `Host` names something other than an IP address, `localhost` or a listed name: a page
    /// reached through a DNS name that was rebound to the admin address.
    ForeignHost,
    /// A state-changing request from a page of another origin.
    CrossOrigin,
}

/// The pure admission rule of the admin listener. Clients other than browsers (the CLI, curl)
/// send no `Origin` and an address as `Host`, and pass. `Sec-Fetch-Site` is the browser's own
/// statement of where the request comes from (Fetch Metadata); `Origin` is checked against
/// `Host` for browsers that do not send it. `names` are the host names the operator reaches
/// the listener by (`serve --admin-host`): a rebinding page cannot send them, because a
/// browser's `Host` is the name in the page's own URL.
pub(crate) fn admit(
    method: &Method,
    host: Option<&str>,
    origin: Option<&str>,
    fetch_site: Option<&str>,
    names: &AdminHosts,
) -> Result<(), Refusal> {
    if let Some(host) = host
        && !host_is_local(host)
        && !names.contains(host_name(host))
    {
        return Err(Refusal::ForeignHost);
    }
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if safe {
        return Ok(());
    }
    if let Some(site) = fetch_site
        && !matches!(site, "same-origin" | "none")
    {
        return Err(Refusal::CrossOrigin);
    }
    match (origin, host) {
        (None, _) => Ok(()),
        (Some(o), Some(h)) if o.strip_prefix("http://") == Some(h) => Ok(()),
        _ => Err(Refusal::CrossOrigin),
    }
}

/// The name part of a `Host` value (`name[:port]`).
fn host_name(host: &str) -> &str {
    host.rsplit_once(':').map_or(host, |(n, _)| n)
}

/// A `serve --admin-host` value that is not a host name.
#[derive(Debug, thiserror::Error)]
#[error("--admin-host {0:?} is not a DNS host name (letters, digits, '-' and '.'; no port)")]
pub(crate) struct BadAdminHost(String);

/// Host names the admin listener answers to besides addresses and `localhost`
/// (`serve --admin-host`), lowercased.
#[derive(Debug, Clone, Default)]
pub(crate) struct AdminHosts(Vec<String>);

impl AdminHosts {
    /// Checks each name is a DNS host name (RFC 1123 labels: letters, digits and inner
    /// hyphens, 1-63 characters each, 253 in all); the error names the bad one.
    pub fn new(names: &[String]) -> Result<Self, BadAdminHost> {
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            let ok = !n.is_empty()
                && n.len() <= 253
                && n.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                });
            if !ok {
                return Err(BadAdminHost(n.clone()));
            }
            out.push(n.to_ascii_lowercase());
        }
        Ok(Self(out))
    }

    fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// `host[:port]` is an IP literal or `localhost`.
fn host_is_local(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host_name(host)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// The admin router's middleware applying [`admit`].
pub(crate) async fn guard(
    State(names): State<Arc<AdminHosts>>,
    req: Request,
    next: Next,
) -> Response {
    let h = req.headers();
    let get = |name: header::HeaderName| h.get(name).and_then(|v| v.to_str().ok());
    let verdict = admit(
        req.method(),
        get(header::HOST),
        get(header::ORIGIN),
        h.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
        &names,
    );
    match verdict {
        Ok(()) => next.run(req).await,
        Err(r) => {
            tracing::warn!(refusal = ?r, method = %req.method(), "admin request refused");
            super::text(
                StatusCode::FORBIDDEN,
                match r {
                    Refusal::ForeignHost => {
                        "forbidden: the admin API answers to an address, localhost or a name given by serve --admin-host only\n"
                    }
                    Refusal::CrossOrigin => "forbidden: cross-origin request\n",
                }
                .into(),
            )
        }
    }
}

/// How far a node's provisioning goes, in order. `joined` is the Kubernetes side: the node is
/// Ready in talboot's record and the cluster step `nodes-ready` (every node Ready in the
/// Kubernetes API) is done.
pub(crate) const MILESTONES: [&str; 8] = [
    "DHCP",
    "iPXE",
    "kernel",
    "maintenance",
    "config applied",
    "installing",
    "ready",
    "joined",
];

/// One milestone of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Milestone {
    /// Its name ([`MILESTONES`]).
    pub name: &'static str,
    /// The node got this far.
    pub reached: bool,
    /// When the current attempt first reached it, if the timeline says.
    pub at_unix_ms: Option<u64>,
}

/// The phase a `node.phase` event moves to. The detail is `"{from} -> {to}: {why}"`, as
/// `provision::node` writes it.
fn phase_target(detail: &str) -> Option<&str> {
    let (_, rest) = detail.split_once(" -> ")?;
    Some(rest.split_once(':').map_or(rest, |(to, _)| to).trim())
}

/// The milestone an event shows, by index in [`MILESTONES`].
fn milestone_of(kind: &str, detail: &str) -> Option<usize> {
    match kind {
        "dhcp.ack" | "dhcp.proxy" => Some(0),
        "tftp.file" | "http.script" => Some(1),
        "http.kernel" | "http.initramfs" | "boot.uki" => Some(2),
        "config.released" => Some(4),
        "node.phase" => match phase_target(detail)? {
            "maintenance" | "configuring" => Some(3),
            "installing" => Some(5),
            "ready" => Some(6),
            _ => None,
        },
        _ => None,
    }
}

/// How far the node got in its current attempt (since its last rebuild), from its phase, its
/// timeline (oldest first) and whether the cluster step `nodes-ready` is done. The phase
/// counts even without events (a store from before timelines, or events trimmed): a Ready
/// node got through everything before `ready`.
pub fn progress(phase: NodePhase, timeline: &[Event], nodes_ready: bool) -> Vec<Milestone> {
    let start = timeline
        .iter()
        .rposition(|e| e.kind == "node.phase" && phase_target(&e.detail) == Some("rebuilding"))
        .map_or(0, |i| i + 1);
    let mut at = [None; MILESTONES.len()];
    for e in &timeline[start..] {
        if let Some(i) = milestone_of(&e.kind, &e.detail) {
            at[i].get_or_insert(e.at_unix_ms);
        }
    }
    let by_phase = match phase {
        NodePhase::Booting => Some(0),
        NodePhase::Maintenance | NodePhase::Configuring => Some(3),
        NodePhase::Installing => Some(5),
        NodePhase::Ready if nodes_ready => Some(7),
        NodePhase::Ready => Some(6),
        NodePhase::Unknown | NodePhase::Rebuilding | NodePhase::Failed => None,
    };
    let by_events = at.iter().rposition(Option::is_some);
    let furthest = by_phase.max(by_events);
    MILESTONES
        .iter()
        .enumerate()
        .map(|(i, name)| Milestone {
            name,
            reached: furthest.is_some_and(|f| i <= f),
            at_unix_ms: at[i],
        })
        .collect()
}

/// Whether an event reports a failure (drawn as one, with its detail as the reason).
pub(crate) fn is_failure(kind: &str, detail: &str) -> bool {
    match kind {
        "dhcp.nak" | "dhcp.decline" | "tftp.failed" | "config.refused" | "security.refused" => true,
        "node.phase" => phase_target(detail) == Some("failed"),
        "cluster.step" | "talos.call" | "power.action" => {
            let d = detail.to_ascii_lowercase();
            d.contains("failed") || d.contains("error") || d.contains("refused")
        }
        _ => false,
    }
}

/// One cluster step as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepView {
    /// The step's name.
    pub name: String,
    /// `done`, `current` (the next one to do), `failing` (the next one, whose last attempt
    /// failed) or `pending`.
    pub state: &'static str,
    /// For the last one done: why it counts as done.
    pub reason: Option<String>,
    /// For the next one: its last error and the failed attempts.
    pub error: Option<String>,
    /// Failed attempts of the next step.
    pub attempts: u32,
}

/// Every step after the initial wait, in order, with where the record says the cluster is.
pub fn cluster_steps(record: Option<&StepRecord>) -> Vec<StepView> {
    use ClusterStep as S;
    const AFTER_WAIT: [ClusterStep; 6] = [
        S::Bootstrapped,
        S::ApiReady,
        S::CniInstalled,
        S::NodesReady,
        S::ArgoCdInstalled,
        S::HandedOff,
    ];
    let done_up_to = record.map_or(S::WaitingForControlPlanes, |r| r.step);
    let mut next_seen = false;
    AFTER_WAIT
        .iter()
        .map(|&step| {
            let done = step <= done_up_to;
            let is_next = !done && !next_seen;
            next_seen |= is_next;
            let error = record
                .filter(|_| is_next)
                .and_then(|r| r.last_error.clone());
            StepView {
                name: step.to_string(),
                state: if done {
                    "done"
                } else if is_next && error.is_some() {
                    "failing"
                } else if is_next {
                    "current"
                } else {
                    "pending"
                },
                reason: record.filter(|r| r.step == step).map(|r| r.reason.clone()),
                error,
                attempts: record.filter(|_| is_next).map_or(0, |r| r.attempts),
            }
        })
        .collect()
}

/// One timeline row.
#[derive(Debug, Clone, Serialize)]
struct EventView {
    at_unix_ms: u64,
    kind: String,
    detail: String,
    failure: bool,
}

impl EventView {
    fn of(e: &Event) -> Self {
        EventView {
            at_unix_ms: e.at_unix_ms,
            kind: e.kind.clone(),
            detail: e.display_detail(),
            failure: is_failure(&e.kind, &e.detail),
        }
    }
}

#[derive(Debug, Serialize)]
struct NodeView {
    name: String,
    address: String,
    phase: String,
    progress: Vec<Milestone>,
    failure: Option<String>,
    /// The node has a power controller in the inventory (the page offers power actions).
    power: bool,
    timeline: Vec<EventView>,
}

#[derive(Debug, Serialize)]
struct RoleView {
    name: String,
    machine_type: String,
    nodes: Vec<NodeView>,
}

#[derive(Debug, Serialize)]
struct ClusterView {
    name: String,
    talos_version: String,
    kubernetes_version: String,
    steps: Vec<StepView>,
    timeline: Vec<EventView>,
}

#[derive(Debug, Serialize)]
struct Snapshot {
    cluster: ClusterView,
    roles: Vec<RoleView>,
}

fn tail(events: &[Event]) -> Vec<EventView> {
    let from = events.len().saturating_sub(TIMELINE_LEN);
    events[from..].iter().map(EventView::of).collect()
}

fn build_snapshot(app: &AdminApp) -> Result<Snapshot, crate::store::StoreError> {
    let store = app.store.as_ref();
    let inv = &app.inventory;
    let record = crate::store::load_step_record(store)?;
    let nodes_ready = record
        .as_ref()
        .is_some_and(|r| r.step >= ClusterStep::NodesReady);
    let mut roles: Vec<RoleView> = Vec::new();
    for n in &inv.nodes {
        let name = n.name.as_str();
        let rec = store.node(name)?;
        let phase = rec.as_ref().map_or(NodePhase::Unknown, |r| r.phase);
        let events = store.events(name, 0, SCAN_LEN)?;
        let failure = if phase == NodePhase::Failed {
            crate::store::Lifecycle::load(store, name)
                .ok()
                .and_then(|l| l.failure)
        } else {
            None
        };
        let view = NodeView {
            name: name.to_owned(),
            address: n.address.value.addr().to_string(),
            phase: phase.to_string(),
            progress: progress(phase, &events, nodes_ready),
            failure,
            power: n.power.is_some(),
            timeline: tail(&events),
        };
        let role = n.role.value.as_str();
        match roles.iter_mut().find(|r| r.name == role) {
            Some(r) => r.nodes.push(view),
            None => roles.push(RoleView {
                name: role.to_owned(),
                machine_type: inv
                    .roles
                    .get(role)
                    .map(|r| format!("{:?}", r.machine_type).to_lowercase())
                    .unwrap_or_default(),
                nodes: vec![view],
            }),
        }
    }
    let cluster_events = store.events(CLUSTER_TIMELINE, 0, SCAN_LEN)?;
    Ok(Snapshot {
        cluster: ClusterView {
            name: inv.cluster.name.as_str().to_owned(),
            talos_version: inv.cluster.talos_version.value.to_string(),
            kubernetes_version: inv.cluster.kubernetes_version.value.to_string(),
            steps: cluster_steps(record.as_ref()),
            timeline: tail(&cluster_events),
        },
        roles,
    })
}

async fn snapshot(State(app): State<Arc<AdminApp>>) -> Response {
    // Store reads off the async threads.
    match tokio::task::spawn_blocking(move || build_snapshot(&app)).await {
        Ok(Ok(s)) => {
            let mut r = Json(s).into_response();
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Ok(Err(e)) => super::text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        Err(e) => super::text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// One event as a server-sent event (`event: node`, the JSON on one `data:` line).
pub(crate) fn sse_frame(ev: &NodeEvent) -> String {
    let data = serde_json::json!({
        "node": ev.node,
        "kind": ev.kind.as_str(),
        "detail": ev.detail,
        "at_unix_ms": ev.at_unix_ms,
        "failure": is_failure(ev.kind.as_str(), &ev.detail),
    });
    // serde_json escapes newlines inside strings, so the frame is one data line.
    format!("event: node\ndata: {data}\n\n")
}

/// `GET /api/events`: every event as it is published (after it is persisted). A listener
/// that falls behind the bus is told to re-read the snapshot (`event: resync`) instead of
/// getting a gap silently.
async fn events(State(app): State<Arc<AdminApp>>) -> Response {
    use tokio::sync::broadcast::error::RecvError;
    let rx = app.events.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let frame = match tokio::time::timeout(KEEPALIVE, rx.recv()).await {
            Err(_) => ": keepalive\n\n".to_owned(),
            Ok(Ok(ev)) => sse_frame(&ev),
            Ok(Err(RecvError::Lagged(_))) => "event: resync\ndata: {}\n\n".to_owned(),
            Ok(Err(RecvError::Closed)) => return None,
        };
        Some((Ok::<_, Infallible>(frame), rx))
    });
    // The first bytes tell the browser the stream is open before any event happens.
    let hello = futures_util::stream::once(async {
        Ok::<_, Infallible>("retry: 1000\n: talboot events\n\n".to_owned())
    });
    let mut r = Response::new(Body::from_stream(futures_util::StreamExt::chain(
        hello, stream,
    )));
    let h: &mut HeaderMap = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.extensions_mut().insert(crate::http::server::Streamed);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(kind: &str, detail: &str, at: u64) -> Event {
        Event {
            seq: at,
            at_unix_ms: at,
            node: "n".into(),
            kind: kind.into(),
            detail: detail.into(),
            count: 1,
            last_at_unix_ms: None,
        }
    }

    fn reached(p: &[Milestone]) -> Vec<&'static str> {
        p.iter().filter(|m| m.reached).map(|m| m.name).collect()
    }

    /// The events of one network boot into maintenance and an applied config, as the demo's
    /// talboot publishes them.
    fn first_boot() -> Vec<Event> {
        vec![
            ev("dhcp.ack", "127.0.0.11 (boot file `ipxe.efi`)", 1),
            ev("tftp.file", "ipxe.efi (98304 bytes) to 127.0.0.11:1", 2),
            ev(
                "node.phase",
                "unknown -> booting: boot seen on the network",
                3,
            ),
            ev("http.script", "Talos v1.13.9 amd64 script", 4),
            ev("http.kernel", "kernel of Talos", 5),
            ev(
                "node.phase",
                "booting -> maintenance: maintenance API answers",
                6,
            ),
            ev("node.phase", "maintenance -> configuring: applying", 7),
            ev("config.released", "ApplyConfiguration mode=AUTO", 8),
        ]
    }

    #[test]
    fn a_booting_node_got_as_far_as_its_events_say_with_when() {
        let p = progress(NodePhase::Configuring, &first_boot(), false);
        assert_eq!(
            reached(&p),
            ["DHCP", "iPXE", "kernel", "maintenance", "config applied"]
        );
        let at: Vec<Option<u64>> = p.iter().map(|m| m.at_unix_ms).collect();
        assert_eq!(
            at,
            [
                Some(1),
                Some(2),
                Some(5),
                Some(6),
                Some(8),
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn joined_needs_the_nodes_ready_step() {
        let mut tl = first_boot();
        tl.push(ev(
            "node.phase",
            "configuring -> installing: config applied",
            9,
        ));
        tl.push(ev("node.phase", "installing -> ready: installed", 10));
        assert_eq!(reached(&progress(NodePhase::Ready, &tl, false)).len(), 7);
        assert_eq!(reached(&progress(NodePhase::Ready, &tl, true)).len(), 8);
    }

    #[test]
    fn a_rebuild_starts_the_progress_over() {
        let mut tl = first_boot();
        tl.push(ev(
            "node.phase",
            "ready -> rebuilding: rebuild requested by the operator",
            20,
        ));
        tl.push(ev("dhcp.ack", "127.0.0.11", 21));
        let p = progress(NodePhase::Rebuilding, &tl, true);
        assert_eq!(reached(&p), ["DHCP"]);
        assert_eq!(p[0].at_unix_ms, Some(21));
    }

    #[test]
    fn the_phase_counts_without_events() {
        assert_eq!(reached(&progress(NodePhase::Ready, &[], false)).len(), 7);
        assert!(reached(&progress(NodePhase::Unknown, &[], true)).is_empty());
    }

    #[test]
    fn failures_are_recognised() {
        assert!(is_failure(
            "node.phase",
            "installing -> failed: install timed out"
        ));
        assert!(!is_failure(
            "node.phase",
            "booting -> maintenance: failed? no"
        ));
        assert!(is_failure("tftp.failed", "x"));
        assert!(is_failure(
            "cluster.step",
            "cni-installed failed (attempt 2): no CRD"
        ));
        assert!(!is_failure("dhcp.ack", "failed"));
    }

    #[test]
    fn cluster_steps_mark_done_next_and_failing() {
        let fresh = cluster_steps(None);
        assert_eq!(fresh[0].state, "current");
        assert!(fresh[1..].iter().all(|s| s.state == "pending"));
        let rec = StepRecord {
            step: ClusterStep::ApiReady,
            since_unix: 1,
            reason: "the Kubernetes API answers".into(),
            last_error: Some("Cilium: CRD not established".into()),
            attempts: 3,
        };
        let s = cluster_steps(Some(&rec));
        let states: Vec<&str> = s.iter().map(|s| s.state).collect();
        assert_eq!(
            states,
            ["done", "done", "failing", "pending", "pending", "pending"]
        );
        assert_eq!(s[1].reason.as_deref(), Some("the Kubernetes API answers"));
        assert_eq!(s[2].attempts, 3);
        assert_eq!(s[2].name, "cni-installed");
    }

    #[test]
    fn admission_refuses_rebound_names_and_cross_origin_posts() {
        let post = Method::POST;
        let none = AdminHosts::default();
        let ok = |h, o, s| admit(&post, h, o, s, &none);
        // The CLI: an address as Host, no Origin.
        assert_eq!(ok(Some("127.0.0.1:8081"), None, None), Ok(()));
        assert_eq!(ok(Some("[::1]:8081"), None, None), Ok(()));
        assert_eq!(ok(None, None, None), Ok(()));
        // The page itself.
        assert_eq!(
            ok(
                Some("localhost:8081"),
                Some("http://localhost:8081"),
                Some("same-origin")
            ),
            Ok(())
        );
        // Another site's page.
        assert_eq!(
            ok(Some("127.0.0.1:8081"), Some("https://evil.example"), None),
            Err(Refusal::CrossOrigin)
        );
        assert_eq!(
            ok(Some("127.0.0.1:8081"), None, Some("cross-site")),
            Err(Refusal::CrossOrigin)
        );
        // A name rebound to loopback, even for reads.
        assert_eq!(
            admit(&Method::GET, Some("evil.example:8081"), None, None, &none),
            Err(Refusal::ForeignHost)
        );
        assert_eq!(
            admit(
                &Method::GET,
                Some("127.0.0.1:8081"),
                None,
                Some("cross-site"),
                &none
            ),
            Ok(())
        );
    }

    #[test]
    fn listed_names_pass_and_others_stay_refused() {
        let names = AdminHosts::new(&["Talboot.Lab.Example".into()]).unwrap();
        let get = |h| admit(&Method::GET, Some(h), None, None, &names);
        assert_eq!(get("talboot.lab.example:8081"), Ok(()));
        assert_eq!(get("TALBOOT.lab.example"), Ok(()));
        assert_eq!(get("lab.example:8081"), Err(Refusal::ForeignHost));
        assert_eq!(
            get("talboot.lab.example.evil:8081"),
            Err(Refusal::ForeignHost)
        );
        // The page served under the listed name may still post to itself, and only itself.
        let post = |h, o| admit(&Method::POST, Some(h), Some(o), None, &names);
        assert_eq!(
            post(
                "talboot.lab.example:8081",
                "http://talboot.lab.example:8081"
            ),
            Ok(())
        );
        assert_eq!(
            post("talboot.lab.example:8081", "http://evil.example"),
            Err(Refusal::CrossOrigin)
        );
    }

    #[test]
    fn admin_host_names_are_checked() {
        let long = "a".repeat(64);
        for bad in [
            "",
            "a:8081",
            "-a.example",
            "a..b",
            "a_b",
            "http://a",
            long.as_str(),
        ] {
            let e = AdminHosts::new(&[bad.to_owned()]).unwrap_err().to_string();
            assert!(e.contains("--admin-host"), "{e}");
        }
        assert!(AdminHosts::new(&["talboot-1.lab".into(), "x".into()]).is_ok());
    }

    #[test]
    fn an_event_is_one_sse_frame() {
        let e = NodeEvent {
            node: "cp-1".into(),
            kind: crate::events::EventKind::Phase,
            detail: "a\nb -> failed: x".into(),
            at_unix_ms: 5,
        };
        let f = sse_frame(&e);
        assert!(f.starts_with("event: node\ndata: {"), "{f}");
        assert!(f.ends_with("}\n\n"), "{f}");
        assert_eq!(f.matches('\n').count(), 3, "{f}");
    }

    proptest! {
        /// Milestones are a prefix: a node never shows a later step reached and an earlier
        /// one not, whatever its timeline, and a recorded time is only on a reached one.
        #[test]
        fn progress_is_a_prefix(
            phase in prop::sample::select(vec![
                NodePhase::Unknown, NodePhase::Booting, NodePhase::Maintenance,
                NodePhase::Configuring, NodePhase::Installing, NodePhase::Ready,
                NodePhase::Rebuilding, NodePhase::Failed,
            ]),
            kinds in prop::collection::vec(0usize..10, 0..30),
            ready in any::<bool>(),
        ) {
            let table = [
                ("dhcp.ack", "x"), ("tftp.file", "x"), ("http.kernel", "x"),
                ("config.released", "x"), ("node.phase", "a -> maintenance: x"),
                ("node.phase", "a -> installing: x"), ("node.phase", "a -> ready: x"),
                ("node.phase", "a -> rebuilding: x"), ("node.phase", "a -> failed: x"),
                ("talos.call", "x"),
            ];
            let tl: Vec<Event> = kinds.iter().enumerate()
                .map(|(i, &k)| ev(table[k].0, table[k].1, i as u64)).collect();
            let p = progress(phase, &tl, ready);
            prop_assert_eq!(p.len(), MILESTONES.len());
            let n = p.iter().filter(|m| m.reached).count();
            prop_assert!(p.iter().take(n).all(|m| m.reached));
            prop_assert!(p.iter().all(|m| m.reached || m.at_unix_ms.is_none()));
        }
    }
}
