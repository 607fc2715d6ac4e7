//! The lease feed and the compare view against a real etcd ([`super::testing`]): a peer's
//! commits arrive, own echoes are recognised, a compacted start revision is listed afresh.

use std::net::Ipv4Addr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::testing::EtcdServer;
use super::watch::{LeaseEvent, LeaseFilter};
use crate::inventory::Mac;
use crate::store::writers::Backend;
use crate::store::{Lease, LeaseChange, LeaseCommit, LeaseState};

fn lease(mac: u8, last: u8) -> Lease {
    Lease {
        mac: Mac([2, 0, 0, 0, 7, mac]),
        ip: Ipv4Addr::new(10, 7, 0, last),
        hostname: None,
        state: LeaseState::Bound,
        expires_at_unix: 4_000_000_000,
        updated_at_unix: 1,
    }
}

fn upsert(l: Lease) -> LeaseCommit {
    LeaseCommit {
        writes: vec![LeaseChange::Upsert(l)],
        events: Vec::new(),
    }
}

/// Everything the feed delivers until `until` holds for what came so far (bounded).
fn collect(
    rt: &tokio::runtime::Runtime,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<LeaseEvent>>,
    until: impl Fn(&[LeaseEvent]) -> bool,
) -> Vec<LeaseEvent> {
    let mut got = Vec::new();
    rt.block_on(async {
        while !until(&got) {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(batch)) => got.extend(batch),
                _ => panic!("the feed stopped before delivering what was expected: {got:?}"),
            }
        }
    });
    got
}

#[test]
fn a_peers_commits_reach_the_feed_and_own_echoes_are_filtered() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let a = server.open("feed");
    let b = server.open("feed");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cancel = CancellationToken::new();
    let mut rx = b.lease_feed(cancel.clone());
    a.commit_leases(&[upsert(lease(1, 1))], true).unwrap();
    b.commit_leases(&[upsert(lease(2, 2))], true).unwrap();
    let peer_key = b.keys.lease_ip(Ipv4Addr::new(10, 7, 0, 1));
    let own_key = b.keys.lease_ip(Ipv4Addr::new(10, 7, 0, 2));
    let got = collect(&rt, &mut rx, |g| {
        g.iter().any(|e| e.key == peer_key) && g.iter().any(|e| e.key == own_key)
    });
    let mut filter = LeaseFilter::default();
    let fresh = b.fresh(&mut filter, got);
    // The peer's record and index arrive; the own commit is recognised by its revision.
    assert!(fresh.iter().any(|e| e.key == peer_key));
    assert!(fresh.iter().all(|e| e.key != own_key), "{fresh:?}");
    let records: Vec<_> = fresh.iter().filter_map(|e| b.lease_record(e)).collect();
    assert_eq!(records, vec![(lease(1, 1).ip, Some(lease(1, 1)))]);
    // Before b learns it, b's commit of that address conflicts (nothing written); once
    // observed, b's commits compare against the peer's revision (here b takes it over for
    // another MAC, which the book would allow only once a's lease ended).
    let takeover = upsert(Lease {
        mac: Mac([2, 0, 0, 0, 7, 3]),
        ..lease(1, 1)
    });
    let lost = b.commit_leases(std::slice::from_ref(&takeover), true);
    assert!(
        matches!(
            lost,
            Err(crate::store::StoreError::EtcdConflict { committed: 0, .. })
        ),
        "{lost:?}"
    );
    b.observe(&fresh);
    b.commit_leases(&[takeover], true).unwrap();
    // b's change reaches a's feed, past a's own commit of that key.
    let mut arx = a.lease_feed(cancel.clone());
    let got = collect(&rt, &mut arx, |g| g.iter().any(|e| e.key == peer_key));
    let fresh = a.fresh(&mut LeaseFilter::default(), got);
    let records: Vec<_> = fresh.iter().filter_map(|e| a.lease_record(e)).collect();
    // (b's own earlier lease at .2 is news to a too.)
    let at_1 = records.iter().find(|(ip, _)| *ip == lease(1, 1).ip);
    assert_eq!(
        at_1.and_then(|(_, l)| l.as_ref()).map(|l| l.mac),
        Some(Mac([2, 0, 0, 0, 7, 3]))
    );
    assert!(records.iter().any(|(ip, _)| *ip == lease(2, 2).ip));
    cancel.cancel();
}

#[test]
fn a_compacted_start_revision_is_listed_afresh() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let a = server.open("compact");
    let b = server.open("compact");
    a.commit_leases(&[upsert(lease(1, 1))], true).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut client = a.client();
    let root = a.keys.root();
    // Older history gone: a watch from revision 2 is refused with compact_revision.
    let rev = rt.block_on(async {
        let resp = client.get(root.clone(), None).await.unwrap();
        let rev = resp.header().unwrap().revision();
        client.compact(rev, None).await.unwrap();
        rev
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut feed = super::watch::Feed::for_test(&b, tx);
    let outcome = rt.block_on(feed.follow(1));
    assert_eq!(outcome, Ok(None), "a compacted start must be listed afresh");
    // The listing delivers what changed since b opened (a's lease), at or below `rev`.
    let listed = rt.block_on(feed.relist()).unwrap();
    assert!(listed >= rev);
    let got = rt.block_on(rx.recv()).unwrap();
    assert!(got.iter().any(|e| e.key == b.keys.lease_ip(lease(1, 1).ip)));
}
