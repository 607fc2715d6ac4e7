//! Admin API for power requests while `serve` runs: `POST /api/nodes/{name}/power/{op}`
//! (`on`, `off`, `cycle`, `status`) and `POST /api/nodes/{name}/boot/{device}` (`network`,
//! `disk`, `?persistent=true`). The request goes to the provisioner as a command (it owns
//! the node's state and records the event); only this host may ask, like rebuild.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use crate::power::dispatch::PowerRequest;
use crate::power::{BootDevice, BootPersistence, PowerAction};

use super::{HttpApp, text};

/// `?persistent=true` of the boot route.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct BootQuery {
    #[serde(default)]
    persistent: bool,
}

/// `POST /api/nodes/{name}/power/{op}`.
pub(crate) async fn api_power(
    State(app): State<Arc<HttpApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    admitted: Option<axum::Extension<super::admin_auth::Admitted>>,
    Path((name, op)): Path<(String, String)>,
) -> Response {
    let request = match op.as_str() {
        "on" => PowerRequest::Set(PowerAction::On),
        "off" => PowerRequest::Set(PowerAction::Off),
        "cycle" => PowerRequest::Set(PowerAction::Cycle),
        "status" => PowerRequest::Status,
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                format!("unknown power operation {op:?}; use on, off, cycle or status\n"),
            );
        }
    };
    send(
        &app,
        super::admin_auth::permitted(&peer, admitted.as_ref()),
        &name,
        request,
    )
    .await
}

/// `POST /api/nodes/{name}/boot/{device}`.
pub(crate) async fn api_boot(
    State(app): State<Arc<HttpApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    admitted: Option<axum::Extension<super::admin_auth::Admitted>>,
    Path((name, device)): Path<(String, String)>,
    Query(q): Query<BootQuery>,
) -> Response {
    let device = match device.as_str() {
        "network" => BootDevice::Network,
        "disk" => BootDevice::Disk,
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                format!("unknown boot device {device:?}; use network or disk\n"),
            );
        }
    };
    let persistence = if q.persistent {
        BootPersistence::Persistent
    } else {
        BootPersistence::Once
    };
    send(
        &app,
        super::admin_auth::permitted(&peer, admitted.as_ref()),
        &name,
        PowerRequest::Boot(device, persistence),
    )
    .await
}

/// `permitted`: the caller is on loopback or showed the admin token.
async fn send(app: &HttpApp, permitted: bool, name: &str, request: PowerRequest) -> Response {
    if !permitted {
        return text(StatusCode::FORBIDDEN, "forbidden\n".into());
    }
    if app.inventory.node(name).is_none() {
        return text(
            StatusCode::NOT_FOUND,
            format!("node {name:?} is not in the inventory\n"),
        );
    }
    let Some(commands) = &app.commands else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this serve runs no provisioner, so it takes no power commands\n".into(),
        );
    };
    match commands.power(name, request).await {
        Ok(reply) => text(StatusCode::OK, format!("{reply}\n")),
        Err(e) => text(StatusCode::BAD_GATEWAY, format!("{e}\n")),
    }
}
