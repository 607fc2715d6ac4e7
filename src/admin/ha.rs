//! The fleet as an operator sees it on a shared etcd (issue 28 item 4): which appliances are
//! live (their `members/<name>` keys, [`crate::store::Member`]), which one leads the election,
//! and etcd's own health ([`crate::store::etcd_health`]), as one JSON document ([`HaStatus`])
//! served at `GET /api/ha` and printed by `talboot status` on an etcd store.
//!
//! The document is assembled by a pure function ([`assemble`]) from the three facts, each
//! read on its own: a fact etcd could not give (no quorum: the member list and the leader
//! are linearizable reads, and fail) is named in `problems` instead of hiding the others.
//! On redb there is one appliance and no election: `/api/ha` answers `{"store": "redb"}`.
//!
//! What "live" means follows etcd: a member key is kept under its appliance's lease, so a
//! dead appliance is gone once its lease's TTL runs out (`lease/lessor.go`
//! `revokeExpiredLeases`, etcd-io/etcd v3.4.23; see [`crate::store::Member`]'s module).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::watch;

use super::AdminApp;
use crate::store::election::{Candidate, Election, LeaderBoard, SESSION_TTL};
use crate::store::etcd_health::{EtcdHealth, Verdict};
use crate::store::{EtcdStore, Member};

/// The latest etcd health probe the appliance made (None until the first one).
pub(crate) type HealthView = watch::Receiver<Option<EtcdHealth>>;

/// What the admin API needs to answer `/api/ha` on an etcd store.
pub(crate) struct HaSource {
    /// The shared store (members and election are read from it).
    pub etcd: Arc<EtcdStore>,
    /// The appliance's periodic health probe (`appliance::etcd_health`).
    pub health: HealthView,
}

/// The fleet on etcd, as `/api/ha` answers and `status --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HaStatus {
    /// Always `"etcd"` here (redb answers `{"store": "redb"}`).
    pub store: &'static str,
    /// The appliance that answered (absent when the CLI read etcd itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub me: Option<String>,
    /// The leading appliance's name (None: nobody leads now, or etcd could not say).
    pub leader: Option<String>,
    /// The leader's admin API (where rebuilds and rollouts go).
    pub leader_admin_url: Option<String>,
    /// The live appliances, sorted by name.
    pub appliances: Vec<ApplianceView>,
    /// etcd's health (None: not probed yet).
    pub etcd: Option<EtcdView>,
    /// Facts that could not be read, and why.
    pub problems: Vec<String>,
}

/// One live appliance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplianceView {
    /// Its name (`serve --name`).
    pub name: String,
    /// Whether it leads the fleet's election.
    pub leader: bool,
    /// Its admin API.
    pub admin_url: String,
    /// Its boot HTTP server.
    pub http_url: String,
    /// talboot's version there.
    pub version: String,
    /// When it started serving (Unix milliseconds).
    pub started_unix_ms: u64,
}

/// etcd's health, flattened for JSON readers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EtcdView {
    /// The one-word state, worst first: `no_quorum`, `alarm`, `degraded`, `healthy`.
    pub verdict: Verdict,
    /// The one line the log and `status` print.
    pub summary: String,
    /// Whether a linearizable read completed.
    pub quorum: bool,
    /// Raised alarms.
    pub alarms: Vec<String>,
    /// Every configured endpoint.
    pub endpoints: Vec<EndpointView>,
}

/// One etcd endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointView {
    /// Its client URL.
    pub url: String,
    /// Whether it answered its status.
    pub up: bool,
    /// Whether it is raft's leader.
    pub leader: bool,
    /// Its member ID (hex), when up.
    pub member_id: Option<String>,
    /// The etcd version it runs, when up.
    pub version: Option<String>,
    /// Its backend database size in bytes, when up.
    pub db_size: Option<i64>,
    /// Errors it reports (an alarm shows here), or why it could not be asked.
    pub errors: Vec<String>,
}

impl EtcdView {
    /// The view of one probe.
    pub fn of(h: &EtcdHealth) -> Self {
        let endpoints = h
            .endpoints
            .iter()
            .map(|e| match &e.status {
                Ok(s) => EndpointView {
                    url: e.url.clone(),
                    up: true,
                    leader: s.is_leader,
                    member_id: Some(s.member_id.clone()),
                    version: Some(s.version.clone()),
                    db_size: Some(s.db_size),
                    errors: s.errors.clone(),
                },
                Err(why) => EndpointView {
                    url: e.url.clone(),
                    up: false,
                    leader: false,
                    member_id: None,
                    version: None,
                    db_size: None,
                    errors: vec![why.clone()],
                },
            })
            .collect();
        Self {
            verdict: h.verdict(),
            summary: h.summary(),
            quorum: h.quorum,
            alarms: h.alarms.clone(),
            endpoints,
        }
    }
}

/// The status from what was read: the members, the election's leader, the latest probe.
pub fn assemble<E: std::fmt::Display, F: std::fmt::Display>(
    me: Option<String>,
    members: Result<Vec<Member>, E>,
    leader: Result<Option<Candidate>, F>,
    health: Option<&EtcdHealth>,
) -> HaStatus {
    let mut problems = Vec::new();
    let leader = leader.unwrap_or_else(|e| {
        problems.push(format!("the election's leader cannot be read: {e}"));
        None
    });
    let mut appliances: Vec<ApplianceView> = members
        .unwrap_or_else(|e| {
            problems.push(format!("the appliances cannot be listed: {e}"));
            Vec::new()
        })
        .into_iter()
        .map(|m| ApplianceView {
            leader: leader.as_ref().is_some_and(|l| l.name == m.name),
            name: m.name,
            admin_url: m.admin_url,
            http_url: m.http_url,
            version: m.version,
            started_unix_ms: m.started_unix_ms,
        })
        .collect();
    appliances.sort_by(|a, b| a.name.cmp(&b.name));
    HaStatus {
        store: "etcd",
        me,
        leader: leader.as_ref().map(|l| l.name.clone()),
        leader_admin_url: leader.map(|l| l.admin_url),
        appliances,
        etcd: health.map(EtcdView::of),
        problems,
    }
}

/// Read the members and the leader from `etcd` now (`board`: the appliance's own election,
/// else a reader of the fleet's), with `health` as the latest probe.
pub async fn gather(
    etcd: Arc<EtcdStore>,
    board: Option<&LeaderBoard>,
    me: Option<String>,
    health: Option<EtcdHealth>,
) -> HaStatus {
    let leader = match board {
        Some(b) => b.election().leader().await,
        None => Election::new(&etcd, SESSION_TTL).leader().await,
    };
    // The member list is a blocking read through the store's own runtime thread.
    let members = match tokio::task::spawn_blocking(move || etcd.members()).await {
        Ok(read) => read.map_err(ReadError::Store),
        Err(e) => Err(ReadError::Stopped(e)),
    };
    assemble(me, members, leader, health.as_ref())
}

/// Why the member list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// etcd refused or did not answer (no quorum, unreachable).
    #[error(transparent)]
    Store(crate::store::StoreError),
    /// The blocking read was cancelled or panicked (the runtime is shutting down).
    #[error("the read stopped before it answered: {0}")]
    Stopped(tokio::task::JoinError),
}

/// `GET /api/ha`: the appliances, the leader and etcd's health ([`HaStatus`]); on redb
/// `{"store": "redb"}`.
pub(crate) async fn api_ha(State(app): State<Arc<AdminApp>>) -> Response {
    let Some(src) = &app.ha else {
        return Json(serde_json::json!({ "store": "redb" })).into_response();
    };
    let health = src.health.borrow().clone();
    let board = app.leader.as_deref();
    let me = board.map(|b| b.me.name.clone());
    let status = gather(src.etcd.clone(), board, me, health).await;
    (StatusCode::OK, Json(status)).into_response()
}

#[cfg(test)]
#[path = "ha_tests.rs"]
mod tests;
