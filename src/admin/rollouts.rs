//! The admin API's rollouts (`talboot apply` and `talboot upgrade` while serve runs, see
//! [`crate::daytwo::remote`]): `POST /api/rollouts` starts a rollout ([`RolloutHost`]) unless
//! one is running (409); `GET /api/rollouts/{id}?after=N` pages its progress,
//! holding the request up to [`PAGE_WAIT`] while there is nothing new, so the CLI follows a
//! rollout line by line without a streaming response. Loopback peers only, as rebuilds: a
//! request carries every node's rendered config.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{AdminApp, text};
use crate::daytwo::remote::{RolloutCtx, RolloutRequest, Rollouts, Run, StartError, Started};

/// Starts rollouts and finds them again by id. serve's is [`ServeRollouts`]; the handler tests
/// stand one in that registers rollouts but runs no job.
pub(crate) trait RolloutHost: Send + Sync {
    /// Validates, registers (one at a time) and starts `request`; where to page it, or why
    /// it did not start.
    fn start(&self, request: RolloutRequest) -> Result<Started, StartError>;
    /// The run with `id`, while it is the current or the last one.
    fn run(&self, id: u64) -> Option<Arc<Run>>;
}

/// serve's rollouts: its store, inventory and Talos admin credentials, at most one rollout
/// at a time.
pub(crate) struct ServeRollouts {
    ctx: RolloutCtx,
    runs: Rollouts,
}

impl ServeRollouts {
    /// Rollouts that run with `ctx`.
    pub(crate) fn new(ctx: RolloutCtx) -> Self {
        Self {
            ctx,
            runs: Rollouts::default(),
        }
    }
}

impl RolloutHost for ServeRollouts {
    fn start(&self, request: RolloutRequest) -> Result<Started, StartError> {
        // Registered here, run on its own task: the request never waits on it.
        crate::daytwo::remote::start(&self.runs, self.ctx.clone(), request)
    }

    fn run(&self, id: u64) -> Option<Arc<Run>> {
        self.runs.get(id)
    }
}

/// How long a progress page waits for a new line before it answers empty.
pub(crate) const PAGE_WAIT: Duration = Duration::from_secs(15);

fn no_provisioner() -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "this serve does not provision nodes (pull delivery or --no-provision), so it has no \
         Talos admin credentials to roll out with; run the command with serve stopped\n"
            .into(),
    )
}

pub(crate) async fn api_start(
    State(app): State<Arc<AdminApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    admitted: Option<axum::Extension<super::auth::Admitted>>,
    body: Bytes,
) -> Response {
    if !super::auth::permitted(&peer, admitted.as_ref()) {
        return text(StatusCode::FORBIDDEN, "forbidden\n".into());
    }
    let Some(host) = &app.rollouts else {
        return no_provisioner();
    };
    if let Some(refused) = super::not_leader(&app).await {
        return refused;
    }
    let request: RolloutRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        // serde's message names the field, never a value of it.
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("not a rollout request: {e}\n"),
            );
        }
    };
    match host.start(request) {
        Ok(started) => (StatusCode::ACCEPTED, Json(started)).into_response(),
        Err(e @ StartError::Busy(_)) => text(StatusCode::CONFLICT, format!("{e}\n")),
        Err(e @ StartError::Invalid(_)) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct PageQuery {
    #[serde(default)]
    after: usize,
}

pub(crate) async fn api_progress(
    State(app): State<Arc<AdminApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    admitted: Option<axum::Extension<super::auth::Admitted>>,
    Path(id): Path<u64>,
    Query(q): Query<PageQuery>,
) -> Response {
    if !super::auth::permitted(&peer, admitted.as_ref()) {
        return text(StatusCode::FORBIDDEN, "forbidden\n".into());
    }
    let Some(host) = &app.rollouts else {
        return no_provisioner();
    };
    match host.run(id) {
        Some(run) => Json(run.page(q.after, PAGE_WAIT).await).into_response(),
        None => text(
            StatusCode::NOT_FOUND,
            format!("no rollout {id} (serve keeps the current and the last one)\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    //! The handlers against the admin router, with a stand-in host that registers rollouts
    //! as serve's does but runs no job (no Talos node is contacted).

    use axum::body::Body;
    use axum::http::{Method, Request};
    use tower::ServiceExt;

    use super::*;
    use crate::daytwo::remote::{ApplyRequest, NodeConfig, ProgressPage, RolloutKind};

    /// Registers rollouts as serve's host does, but runs no job.
    struct StandIn {
        inventory: Arc<crate::inventory::Inventory>,
        rollouts: Rollouts,
    }

    impl RolloutHost for StandIn {
        fn start(&self, request: RolloutRequest) -> Result<Started, StartError> {
            request
                .kind
                .prepare(&self.inventory, 50000, request.worker_concurrency)
                .and_then(|job| self.rollouts.begin(job.describe()))
                .map(|run| {
                    run.say("checking the cluster before applying".into());
                    Started {
                        id: run.id,
                        what: run.what.clone(),
                    }
                })
        }

        fn run(&self, id: u64) -> Option<Arc<Run>> {
            self.rollouts.get(id)
        }
    }

    async fn app(dir: &std::path::Path) -> Arc<AdminApp> {
        let app = super::super::test_app::offline_app(dir);
        Arc::new(AdminApp {
            rollouts: Some(Arc::new(StandIn {
                inventory: app.inventory.clone(),
                rollouts: Rollouts::default(),
            })),
            ..app
        })
    }

    async fn call(
        app: &Arc<AdminApp>,
        method: Method,
        uri: &str,
        body: Vec<u8>,
        peer: &str,
    ) -> (StatusCode, Vec<u8>) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body))
            .unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        let resp = super::super::router(app.clone(), None, Default::default())
            .oneshot(req)
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, bytes.to_vec())
    }

    fn apply(node: &str) -> Vec<u8> {
        serde_json::to_vec(&RolloutRequest {
            worker_concurrency: 1,
            kind: RolloutKind::Apply(ApplyRequest {
                mode: "no-reboot".into(),
                try_timeout_secs: None,
                gate_timeout_secs: 60,
                gate_poll_ms: 100,
                configs: vec![NodeConfig {
                    node: node.into(),
                    rendered: "machine: {}\n".into(),
                }],
            }),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn start_page_refuse_a_second_and_check_the_request() {
        let dir = tempfile::tempdir().unwrap();
        let app = app(dir.path()).await;
        let local = "127.0.0.1:40000";

        // Only from this host: off loopback, with no admin token configured, the admin
        // router's guard answers 401 before the handler.
        let (status, _) = call(
            &app,
            Method::POST,
            "/api/rollouts",
            apply("rack1-wk-01"),
            "10.20.0.99:40000",
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = call(
            &app,
            Method::GET,
            "/api/rollouts/1",
            vec![],
            "10.20.0.99:40000",
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);

        // Malformed, or not fitting serve's inventory: 400 with the reason.
        let (status, body) = call(&app, Method::POST, "/api/rollouts", b"{".to_vec(), local).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&body).starts_with("not a rollout request"));
        let (status, body) =
            call(&app, Method::POST, "/api/rollouts", apply("rack9-x"), local).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&body).contains("not in serve's inventory"));

        // Started: where to page it; its first page.
        let (status, body) = call(
            &app,
            Method::POST,
            "/api/rollouts",
            apply("rack1-wk-01"),
            local,
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let started: Started = serde_json::from_slice(&body).unwrap();
        assert!(started.what.starts_with("apply apply/"), "{started:?}");
        let (status, body) = call(
            &app,
            Method::GET,
            &format!("/api/rollouts/{}?after=0", started.id),
            vec![],
            local,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let page: ProgressPage = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            page.lines,
            vec!["checking the cluster before applying".to_owned()]
        );
        assert_eq!((page.next, page.end), (1, None));
        let (status, _) = call(&app, Method::GET, "/api/rollouts/99", vec![], local).await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // One at a time: a second rollout while the first runs is refused, naming it.
        let (status, body) = call(
            &app,
            Method::POST,
            "/api/rollouts",
            apply("rack1-wk-02"),
            local,
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT);
        let msg = String::from_utf8_lossy(&body).into_owned();
        assert!(
            msg.contains("another rollout is running") && msg.contains(&started.what),
            "{msg}"
        );
    }
}
