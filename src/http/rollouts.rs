//! The admin API's rollouts (`talboot apply` and `talboot upgrade` while serve runs, see
//! [`crate::daytwo::remote`]): `POST /api/rollouts` hands a rollout to the provisioner, which
//! starts it unless one is running (409); `GET /api/rollouts/{id}?after=N` pages its progress,
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

use super::{HttpApp, text};
use crate::daytwo::remote::{RolloutRequest, StartError};

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
    State(app): State<Arc<HttpApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Bytes,
) -> Response {
    if !peer.ip().is_loopback() {
        return text(StatusCode::FORBIDDEN, "forbidden\n".into());
    }
    let Some(commands) = &app.commands else {
        return no_provisioner();
    };
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
    match commands.rollout(request).await {
        Ok(Ok(started)) => (StatusCode::ACCEPTED, Json(started)).into_response(),
        Ok(Err(e @ StartError::Busy(_))) => text(StatusCode::CONFLICT, format!("{e}\n")),
        Ok(Err(e @ StartError::Invalid(_))) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct PageQuery {
    #[serde(default)]
    after: usize,
}

pub(crate) async fn api_progress(
    State(app): State<Arc<HttpApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<u64>,
    Query(q): Query<PageQuery>,
) -> Response {
    if !peer.ip().is_loopback() {
        return text(StatusCode::FORBIDDEN, "forbidden\n".into());
    }
    let Some(commands) = &app.commands else {
        return no_provisioner();
    };
    match commands.rollout_run(id).await {
        Ok(Some(run)) => Json(run.page(q.after, PAGE_WAIT).await).into_response(),
        Ok(None) => text(
            StatusCode::NOT_FOUND,
            format!("no rollout {id} (serve keeps the current and the last one)\n"),
        ),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}
