//! The election and the fence against a real etcd ([`super::testing`]): a fenced write
//! lands while its appliance leads and is refused, writing nothing, once another leads.

use std::time::Duration;

use super::EtcdStore;
use super::election::{Candidate, Election, Leadership, Lost};
use super::fence::FenceState;
use super::testing::EtcdServer;
use crate::store::writers::Backend;
use crate::store::{CasOutcome, ClusterTable, NodeRecord, Store, StoreError};

const TTL: Duration = Duration::from_secs(2);
/// Bound on every wait for an election outcome.
const WAIT: Duration = Duration::from_secs(15);

fn me(name: &str) -> Candidate {
    Candidate {
        name: name.into(),
        admin_url: format!("http://{name}:8081"),
    }
}

fn node(name: &str, addr: &str) -> NodeRecord {
    NodeRecord {
        last_seen_addr: Some(addr.parse().unwrap()),
        ..NodeRecord::unseen(name, 1)
    }
}

async fn win(store: &EtcdStore, name: &str) -> Leadership {
    let l = tokio::time::timeout(WAIT, Election::new(store, TTL).campaign(&me(name)))
        .await
        .expect("campaign within the bound")
        .expect("campaign");
    store.set_fence(FenceState::Held(l.fence()));
    l
}

/// Revoke `lease` as an outside actor would (an operator, or etcd expiring it): the
/// leader's process keeps running and still believes it leads until it notices.
async fn revoke(store: &EtcdStore, lease: i64) {
    let mut c = store.client();
    store
        .runtime()
        .spawn(async move { c.lease_revoke(lease).await })
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_fenced_write_lands_while_leading_and_is_refused_once_another_leads() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let (a, b) = (etcd.open("fleet"), etcd.open("fleet"));
    let la = win(&a, "a").await;
    a.put_node(&node("cp-1", "10.0.0.1"))
        .expect("the leader writes");
    let progress = |s: &EtcdStore, v: &[u8], old: Option<&[u8]>| {
        s.compare_and_set_row(ClusterTable::Progress, "bootstrap", old, v)
    };
    assert_eq!(progress(&a, b"intent", None).unwrap(), CasOutcome::Swapped);

    // b campaigns behind a; a's session is revoked under it; b wins.
    let election_b = Election::new(&b, TTL);
    let (cb, bb) = (me("b"), election_b.clone());
    let campaign_b = tokio::spawn(async move { bb.campaign(&cb).await });
    revoke(&a, la.lease()).await;
    let lb = tokio::time::timeout(WAIT, campaign_b)
        .await
        .expect("b wins within the bound")
        .unwrap()
        .expect("b's campaign");
    b.set_fence(FenceState::Held(lb.fence()));
    let lost = tokio::time::timeout(WAIT, la.lost())
        .await
        .expect("a learns it lost");
    assert!(matches!(lost, Lost::KeyGone { .. }), "{lost}");
    assert_ne!(la.fence(), lb.fence());

    // a's writes, still carrying its old fence, are refused and write nothing.
    let late = a.put_node(&node("cp-1", "10.0.0.99"));
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    let late = progress(&a, b"done", Some(b"intent"));
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    let late = a.put_rollout("apply/x", b"{}");
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    let rec = b.node("cp-1").unwrap().unwrap();
    assert_eq!(rec.last_seen_addr, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(
        b.row(ClusterTable::Progress, "bootstrap")
            .unwrap()
            .as_deref(),
        Some(&b"intent"[..])
    );
    assert!(b.rollout("apply/x").unwrap().is_none());

    // The new leader writes; a mismatch under a held fence is a mismatch, not a refusal.
    b.put_node(&node("cp-1", "10.0.0.2")).expect("b writes");
    assert_eq!(
        progress(&b, b"done", Some(b"other")).unwrap(),
        CasOutcome::Mismatch {
            current: Some(b"intent".to_vec())
        }
    );
    // Leases, tokens and bindings are every appliance's: not fenced.
    a.put_row(ClusterTable::PullTokens, "t", b"{}")
        .expect("tokens are not fenced");
    a.put_meta("proxy/x", b"1")
        .expect("bindings are not fenced");
}

#[tokio::test]
async fn a_follower_writes_nothing_and_fencing_off_writes_as_before() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let s = etcd.open("fleet");
    s.put_node(&node("w-1", "10.0.0.5"))
        .expect("no election: written");
    s.set_fence(FenceState::NotLeader);
    let refused = s.put_node(&node("w-1", "10.0.0.6"));
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let refused = s.compare_and_set_row(ClusterTable::Progress, "k", None, b"v");
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(
        s.node("w-1").unwrap().unwrap().last_seen_addr,
        Some("10.0.0.5".parse().unwrap())
    );
    assert!(s.row(ClusterTable::Progress, "k").unwrap().is_none());
}

#[tokio::test]
async fn followers_see_the_leader_and_a_resignation_hands_over_at_once() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let (a, b) = (etcd.open("fleet"), etcd.open("fleet"));
    let eb = Election::new(&b, Duration::from_secs(30));
    assert_eq!(eb.leader().await.unwrap(), None);
    let la = win(&a, "a").await;
    assert_eq!(eb.leader().await.unwrap(), Some(me("a")));
    let (cb, bb) = (me("b"), eb.clone());
    let campaign_b = tokio::spawn(async move { bb.campaign(&cb).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!campaign_b.is_finished(), "b won while a leads");
    // a's TTL is 2 s, b's 30 s: b must not need a's TTL to pass, only the revocation.
    la.resign().await;
    let lb = tokio::time::timeout(WAIT, campaign_b)
        .await
        .expect("b wins within the bound")
        .unwrap()
        .unwrap();
    assert!(!lb.is_lost());
    assert_eq!(eb.leader().await.unwrap(), Some(me("b")));
}

/// A leader whose keep-alive stops (its etcd gone) learns it lost within its TTL, and so
/// stops before another could have won.
#[tokio::test]
async fn a_leader_cut_off_from_etcd_learns_it_lost() {
    let Some(mut etcd) = EtcdServer::start() else {
        return;
    };
    let a = etcd.open("fleet");
    let la = win(&a, "a").await;
    etcd.kill();
    let lost = tokio::time::timeout(TTL * 3, la.lost())
        .await
        .expect("loss noticed within the bound");
    assert!(matches!(lost, Lost::SessionExpired { .. }), "{lost}");
}

/// A follower's view, reloaded on each notice of its watch, shows what the leader wrote.
#[tokio::test]
async fn a_follower_view_follows_the_leaders_writes() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let (leader, follower) = (etcd.open("fleet"), etcd.open("fleet"));
    let view = crate::view::StateView::new();
    let mut changes = follower.watch_tables(&["nodes", "node_lifecycle"]);
    tokio::time::timeout(WAIT, changes.recv())
        .await
        .expect("the watches are in place within the bound");
    leader.put_node(&node("cp-1", "10.0.0.7")).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        tokio::time::timeout_at(deadline, changes.recv())
            .await
            .expect("a notice of the write within the bound");
        view.reload_nodes(&follower).unwrap();
        if let (Some((rec, _)), _) = view.node("cp-1") {
            assert_eq!(rec.last_seen_addr, Some("10.0.0.7".parse().unwrap()));
            break;
        }
    }
}
