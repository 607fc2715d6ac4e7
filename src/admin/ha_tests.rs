//! `/api/ha` against real etcd members (`store::etcd_testing`): the live appliances, the
//! leader marked, a dead appliance gone after its lease's TTL, and etcd's verdict from
//! healthy to no quorum.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use super::*;
use crate::store::etcd_health::{EndpointHealth, MemberStatus, probe};
use crate::store::etcd_testing::EtcdServer;

fn member(name: &str) -> Member {
    Member {
        name: name.into(),
        admin_url: format!("http://{name}:9090"),
        http_url: format!("http://{name}:8080"),
        version: "test".into(),
        started_unix_ms: 1,
    }
}

fn candidate(name: &str) -> Candidate {
    Candidate {
        name: name.into(),
        admin_url: format!("http://{name}:9090"),
    }
}

#[test]
fn the_leader_is_marked_and_what_cannot_be_read_is_named() {
    let ok: Result<_, String> = Ok(vec![member("b"), member("a")]);
    let lead: Result<_, String> = Ok(Some(candidate("b")));
    let s = assemble(Some("a".into()), ok, lead, None);
    let names: Vec<_> = s
        .appliances
        .iter()
        .map(|a| (a.name.as_str(), a.leader))
        .collect();
    assert_eq!(names, [("a", false), ("b", true)]);
    assert_eq!(s.leader.as_deref(), Some("b"));
    assert_eq!(s.leader_admin_url.as_deref(), Some("http://b:9090"));
    assert!(s.problems.is_empty());

    let down: Result<Vec<Member>, _> = Err("no quorum");
    let unknown: Result<Option<Candidate>, _> = Err("timed out");
    let health = EtcdHealth {
        endpoints: vec![EndpointHealth {
            url: "http://e1:2379".into(),
            status: Err("refused".into()),
        }],
        alarms: vec![],
        quorum: false,
    };
    let s = assemble(None, down, unknown, Some(&health));
    assert!(s.appliances.is_empty() && s.leader.is_none());
    assert_eq!(s.problems.len(), 2, "{:?}", s.problems);
    assert!(s.problems[0].contains("timed out"), "{:?}", s.problems);
    let etcd = s.etcd.unwrap();
    assert_eq!(etcd.verdict, Verdict::NoQuorum);
    assert!(!etcd.endpoints[0].up);
    assert_eq!(etcd.endpoints[0].errors, ["refused"]);
}

#[test]
fn an_endpoint_that_answers_is_shown_with_its_facts() {
    let health = EtcdHealth {
        endpoints: vec![EndpointHealth {
            url: "http://e1:2379".into(),
            status: Ok(MemberStatus {
                member_id: "8e9e05c52164694d".into(),
                version: "3.4.23".into(),
                is_leader: true,
                has_leader: true,
                raft_term: 2,
                raft_index: 9,
                db_size: 20480,
                errors: vec![],
            }),
        }],
        alarms: vec![],
        quorum: true,
    };
    let v = EtcdView::of(&health);
    assert_eq!(v.verdict, Verdict::Healthy);
    let e = &v.endpoints[0];
    assert!(e.up && e.leader);
    assert_eq!(e.db_size, Some(20480));
    assert_eq!(e.version.as_deref(), Some("3.4.23"));
}

/// An admin app on a throwaway redb (the node side is not what this reads) with `ha`.
fn app(dir: &std::path::Path, ha: HaSource, board: Arc<LeaderBoard>) -> Arc<AdminApp> {
    Arc::new(AdminApp {
        leader: Some(board),
        ha: Some(ha),
        ..super::super::test_app::offline_app(dir)
    })
}

async fn get_ha(app: &Arc<AdminApp>) -> Value {
    let mut req = Request::builder()
        .method(Method::GET)
        .uri("/api/ha")
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(ConnectInfo("127.0.0.1:5000".parse::<SocketAddr>().unwrap()));
    let resp = super::super::router(app.clone(), None, Default::default())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// `/api/ha` until `pred` holds, for at most `limit` (etcd's timing is its own).
async fn until(app: &Arc<AdminApp>, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = get_ha(app).await;
        if pred(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn names(v: &Value) -> Vec<(String, bool)> {
    v["appliances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_owned(), a["leader"] == true))
        .collect()
}

/// Two appliances on a 3-member etcd, `a` leading: both listed with `a` marked; `b` killed
/// (its keep-alive stops with its store's runtime) is gone after its TTL; etcd healthy,
/// then without quorum once two of its three members are killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_ha_shows_the_appliances_the_leader_and_etcds_health() {
    let Some(mut etcd) = EtcdServer::start_cluster(3) else {
        return;
    };
    let cfg = etcd.config("ha");
    let a = Arc::new(tokio::task::block_in_place(|| etcd.open("ha")));
    let b = tokio::task::block_in_place(|| etcd.open("ha"));
    let ma = a.join(member("a"), Duration::from_secs(2));
    let mb = b.join(member("b"), Duration::from_secs(2));
    let board = Arc::new(LeaderBoard::new(
        candidate("a"),
        Election::new(&a, SESSION_TTL),
    ));
    let leadership = board.election().campaign(&board.me).await.unwrap();
    board.set_leading(true);
    let (tx, health) = watch::channel(None);
    tx.send_replace(Some(probe(&cfg).await.unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let ha = HaSource {
        etcd: a.clone(),
        health,
    };
    let app = tokio::task::block_in_place(|| app(dir.path(), ha, board));

    let limit = Duration::from_secs(15);
    let v = until(&app, limit, |v| {
        v["appliances"].as_array().unwrap().len() == 2
    })
    .await;
    assert_eq!(
        names(&v),
        [("a".into(), true), ("b".into(), false)],
        "{v:#}"
    );
    assert_eq!(v["me"], "a");
    assert_eq!(v["leader"], "a");
    assert_eq!(v["etcd"]["verdict"], "healthy", "{v:#}");
    let eps = v["etcd"]["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 3);
    assert_eq!(
        eps.iter().filter(|e| e["leader"] == true).count(),
        1,
        "{v:#}"
    );

    // As after kill -9: nothing keeps b's lease alive any more, nothing revokes it.
    std::mem::forget(mb);
    tokio::task::block_in_place(|| drop(b));
    let v = until(&app, limit, |v| {
        v["appliances"].as_array().unwrap().len() == 1
    })
    .await;
    assert_eq!(names(&v), [("a".into(), true)], "{v:#}");

    // Quorum lost: the probe says so, and the reads that need quorum are named as failed.
    tokio::task::block_in_place(|| {
        etcd.kill_member(2);
        etcd.kill_member(1);
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = probe(&cfg).await.unwrap();
        let lost = h.verdict() == Verdict::NoQuorum;
        tx.send_replace(Some(h));
        if lost {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "quorum still reported after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let v = get_ha(&app).await;
    assert_eq!(v["etcd"]["verdict"], "no_quorum", "{v:#}");
    assert!(
        v["problems"].as_array().is_some_and(|p| !p.is_empty()),
        "{v:#}"
    );
    drop((leadership, ma));
}
