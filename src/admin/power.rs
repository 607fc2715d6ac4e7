//! Admin API for power requests while `serve` runs: `POST /api/nodes/{name}/power/{op}`
//! (`on`, `off`, `cycle`, `status`) and `POST /api/nodes/{name}/boot/{device}` (`network`,
//! `disk`, `?persistent=true`). The request runs on the node's driver ([`PowerDesk`], the
//! drivers serve resolved at start) and is recorded as a `power.action` event; only this host
//! may ask, like rebuild.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use crate::events::{EventBus, EventKind};
use crate::power::dispatch::{PowerReply, PowerRequest};
use crate::power::{BootDevice, BootPersistence, PowerAction, PowerDriver};

use super::{AdminApp, text};

/// Each node's power driver, credentials resolved when serve started (nodes without
/// `power:` are absent), and where the outcome of a request is recorded.
#[derive(Clone)]
pub(crate) struct PowerDesk {
    drivers: Arc<std::collections::BTreeMap<String, PowerDriver>>,
    bus: EventBus,
}

/// Why a power request has no answer from the node's controller.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PowerRefused {
    /// The node has no driver.
    #[error(
        "node {0} has no usable power controller (no `power:` block, or its credentials did not resolve when serve started)"
    )]
    NoController(String),
    /// The controller failed or refused (its error names the target, never a credential).
    #[error(transparent)]
    Driver(#[from] crate::power::PowerError),
    /// The request's task ended before it answered.
    #[error("the power request stopped before it answered")]
    Stopped,
}

impl PowerDesk {
    /// The desk over `drivers`, recording on `bus`.
    pub(crate) fn new(
        drivers: Arc<std::collections::BTreeMap<String, PowerDriver>>,
        bus: EventBus,
    ) -> Self {
        Self { drivers, bus }
    }

    /// Runs `request` on `node`'s driver and returns the controller's answer; the outcome
    /// becomes a `power.action` event. The request runs on its own task (a BMC may take
    /// seconds), which finishes and records even when the caller goes away.
    pub(crate) async fn run(
        &self,
        node: &str,
        request: PowerRequest,
    ) -> Result<PowerReply, PowerRefused> {
        let Some(driver) = self.drivers.get(node).cloned() else {
            return Err(PowerRefused::NoController(node.to_owned()));
        };
        let (bus, node) = (self.bus.clone(), node.to_owned());
        let (reply, answer) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let result = driver.run(request).await;
            let detail = match &result {
                Ok(r) => r.to_string(),
                Err(e) => format!("failed: {e}"),
            };
            bus.publish(&node, EventKind::Power, detail);
            let _ = reply.send(result.map_err(PowerRefused::Driver));
        });
        answer.await.map_err(|_| PowerRefused::Stopped)?
    }
}

/// `?persistent=true` of the boot route.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct BootQuery {
    #[serde(default)]
    persistent: bool,
}

/// `POST /api/nodes/{name}/power/{op}`.
pub(crate) async fn api_power(
    State(app): State<Arc<AdminApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    admitted: Option<axum::Extension<super::auth::Admitted>>,
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
        super::auth::permitted(&peer, admitted.as_ref()),
        &name,
        request,
    )
    .await
}

/// `POST /api/nodes/{name}/boot/{device}`.
pub(crate) async fn api_boot(
    State(app): State<Arc<AdminApp>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    admitted: Option<axum::Extension<super::auth::Admitted>>,
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
        super::auth::permitted(&peer, admitted.as_ref()),
        &name,
        PowerRequest::Boot(device, persistence),
    )
    .await
}

/// `permitted`: the caller is on loopback or showed the admin token.
async fn send(app: &AdminApp, permitted: bool, name: &str, request: PowerRequest) -> Response {
    if !permitted {
        return text(StatusCode::FORBIDDEN, "forbidden\n".into());
    }
    if app.inventory.node(name).is_none() {
        return text(
            StatusCode::NOT_FOUND,
            format!("node {name:?} is not in the inventory\n"),
        );
    }
    let Some(desk) = &app.power else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this serve runs no provisioner, so it takes no power commands\n".into(),
        );
    };
    match desk.run(name, request).await {
        Ok(reply) => text(StatusCode::OK, format!("{reply}\n")),
        Err(e) => text(StatusCode::BAD_GATEWAY, format!("{e}\n")),
    }
}
