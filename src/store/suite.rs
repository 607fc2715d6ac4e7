//! The store test suite every backend passes: each test is a function over a [`Fixture`]
//! (how a backend opens fresh and reopened stores), and [`store_suite!`] turns the whole list
//! into `#[test]`s for one backend: redb here, etcd in `etcd::tests`.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::thread;

use super::writers::Backend;
use super::{
    CasOutcome, Event, Lease, LeaseChange, LeaseCommit, LeaseState, NewEvent, NodePart, NodePhase,
    NodeRecord, NodeWrite, RedbStore, SCHEMA_VERSION, Store,
};
use crate::inventory::Mac;

/// How one backend opens stores for the suite.
pub(crate) trait Fixture {
    /// A store over new, empty storage.
    fn fresh(&mut self) -> Box<dyn Backend>;
    /// The storage of the last [`Fixture::fresh`] opened again (its store dropped first).
    fn reopen(&mut self) -> Box<dyn Backend>;
}

/// Every test of the suite, as `#[test]`s over the fixture `$fixture` makes (an
/// `Option`: `None` skips, for a backend whose server is missing outside CI).
macro_rules! store_suite {
    ($fixture:expr) => {
        $crate::store::suite::store_suite!(@tests $fixture;
            lease_round_trip_by_mac_and_ip,
            a_lease_commit_writes_changes_and_events_together_in_order,
            the_by_mac_lookup_follows_the_records,
            settled_leases_are_what_the_reads_return,
            the_store_holds_exactly_what_the_book_decided,
            node_records_round_trip_and_list_by_name,
            events_are_numbered_per_node_and_paged,
            repeated_identical_events_fold_into_one_with_a_count,
            compare_and_set_semantics,
            compare_and_set_from_many_threads_swaps_once,
            export_contains_every_table,
            rollout_records_survive_a_reopen_and_are_exported,
            reopen_keeps_data_and_continues_event_numbering
        );
    };
    (@tests $fixture:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let Some(mut fixture) = $fixture else { return };
                $crate::store::suite::$name(&mut fixture);
            }
        )*
    };
}
pub(crate) use store_suite;

/// redb stores in a temporary state directory.
struct RedbFixture {
    dirs: Vec<tempfile::TempDir>,
}

impl Fixture for RedbFixture {
    fn fresh(&mut self) -> Box<dyn Backend> {
        self.dirs.push(tempfile::tempdir().unwrap());
        self.reopen()
    }

    fn reopen(&mut self) -> Box<dyn Backend> {
        let dir = self.dirs.last().expect("fresh first").path().join("state");
        Box::new(RedbStore::open(&dir).unwrap())
    }
}

mod redb {
    super::store_suite!(Some(super::RedbFixture { dirs: Vec::new() }));
}

fn mac(last: u8) -> Mac {
    Mac([0x52, 0x54, 0, 0, 0, last])
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, last)
}

fn lease(m: u8, a: u8, state: LeaseState, expires: u64) -> Lease {
    Lease {
        mac: mac(m),
        ip: ip(a),
        hostname: Some(format!("host{m}")),
        state,
        expires_at_unix: expires,
        updated_at_unix: 100,
    }
}

fn node(name: &str, phase: NodePhase, at: u64) -> NodeRecord {
    NodeRecord {
        name: name.to_string(),
        phase,
        phase_since_unix: at,
        last_seen_addr: Some(ip(7)),
        mac: Some(mac(7)),
        talos_version: Some("v1.11.0".into()),
        provisioning_window_open: phase != NodePhase::Ready,
        updated_at_unix: at + 1,
    }
}

fn book_config() -> crate::dhcp::LeaseBookConfig {
    use crate::inventory::Pool;
    use std::time::Duration;
    crate::dhcp::LeaseBookConfig {
        reservations: [(mac(0), ip(12)), (mac(1), ip(50)), (mac(2), ip(50))]
            .into_iter()
            .collect(),
        hostnames: [(mac(1), "cp-1".to_string())].into_iter().collect(),
        pools: vec![Pool {
            start: ip(10),
            end: ip(13),
        }],
        offer_hold: Duration::from_secs(60),
        quarantine: Duration::from_secs(600),
    }
}

/// The store persists the book: after every operation's changes are committed, the store's
/// records and its by-MAC lookup are the book's, and a book restored from the store is the
/// same book.
pub(crate) fn the_store_holds_exactly_what_the_book_decided(f: &mut dyn Fixture) {
    use crate::dhcp::LeaseBook;
    use crate::inventory::Ipv4Net;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use std::time::{Duration, SystemTime};

    let f = std::cell::RefCell::new(f);
    let ops = proptest::collection::vec(
        (0u8..6, 0u8..7, prop_oneof![9u8..=14, 50u8..=51], 0u64..2000),
        1..40,
    );
    let mut runner = TestRunner::new(Config::with_cases(48));
    let result = runner.run(&ops, |ops| {
        let s = f.borrow_mut().fresh();
        let net: Ipv4Net = "10.0.0.0/24".parse().unwrap();
        let pool = book_config().pools[0];
        let mut book = LeaseBook::new(book_config());
        let mut now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for (kind, m, a, secs) in ops {
            let (m, a) = (mac(m), ip(a));
            let changes = match kind {
                0 => book
                    .offer(m, net, Some(pool), Some(a), now)
                    .map(|(_, c)| c)
                    .unwrap_or_default(),
                1 => book
                    .bind(m, a, Duration::from_secs(3600), now)
                    .unwrap_or_default(),
                2 => book.release(m, a, now).unwrap_or_default(),
                3 => book.decline(m, a, now).unwrap_or_default(),
                4 => book.expire(now),
                _ => {
                    now += Duration::from_secs(secs);
                    Vec::new()
                }
            };
            let commit = LeaseCommit {
                writes: changes,
                events: Vec::new(),
            };
            s.commit_leases(&[commit], false).unwrap();
            let want: Vec<Lease> = book.iter().cloned().collect();
            prop_assert_eq!(s.leases().unwrap(), want);
            for n in 0..7 {
                let stored = s.lease(mac(n)).unwrap();
                prop_assert_eq!(stored.as_ref(), book.lease_of(mac(n)));
            }
        }
        let (restored, removals) = LeaseBook::restore(book_config(), s.leases().unwrap());
        prop_assert!(removals.is_empty());
        prop_assert_eq!(
            restored.iter().collect::<Vec<_>>(),
            book.iter().collect::<Vec<_>>()
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

pub(crate) fn lease_round_trip_by_mac_and_ip(f: &mut dyn Fixture) {
    let s = f.fresh();
    let l = lease(1, 10, LeaseState::Bound, 1000);
    s.put_lease(&l).unwrap();
    assert_eq!(s.lease(mac(1)).unwrap(), Some(l.clone()));
    assert_eq!(s.lease_by_ip(ip(10)).unwrap(), Some(l.clone()));
    assert_eq!(s.lease(mac(2)).unwrap(), None);
    assert_eq!(s.lease_by_ip(ip(11)).unwrap(), None);

    let l2 = lease(2, 3, LeaseState::Offered, 1000);
    s.put_lease(&l2).unwrap();
    // Ordered by address.
    assert_eq!(s.leases().unwrap(), vec![l2, l]);
}

pub(crate) fn a_lease_commit_writes_changes_and_events_together_in_order(f: &mut dyn Fixture) {
    let s = f.fresh();
    s.put_lease(&lease(1, 10, LeaseState::Bound, 1000)).unwrap();
    s.put_lease(&lease(5, 50, LeaseState::Bound, 1000)).unwrap();
    let ev = |node: &str, kind: &str| NewEvent {
        node: node.into(),
        kind: kind.into(),
        detail: "d".into(),
        at_unix_ms: 5,
    };
    s.commit_leases(
        &[
            LeaseCommit {
                writes: vec![LeaseChange::Upsert(lease(2, 20, LeaseState::Bound, 1000))],
                events: vec![ev("n2", "dhcp.ack")],
            },
            // Client 1 moves from .10 to .30 (the book removes its old record first), and
            // .50 is removed.
            LeaseCommit {
                writes: vec![
                    LeaseChange::Remove(ip(10)),
                    LeaseChange::Upsert(lease(1, 30, LeaseState::Bound, 1000)),
                    LeaseChange::Remove(ip(50)),
                ],
                events: vec![ev("n1", "dhcp.ack")],
            },
            LeaseCommit {
                writes: Vec::new(),
                events: vec![ev("n4", "dhcp.ack")],
            },
        ],
        true,
    )
    .unwrap();
    let ips: Vec<Ipv4Addr> = s.leases().unwrap().into_iter().map(|l| l.ip).collect();
    assert_eq!(ips, [ip(20), ip(30)]);
    assert_eq!(s.lease(mac(1)).unwrap().unwrap().ip, ip(30));
    assert_eq!(s.lease(mac(5)).unwrap(), None);
    for n in ["n1", "n2", "n4"] {
        assert_eq!(s.events(n, 0, 10).unwrap().len(), 1, "{n}");
    }
    // A non-durable commit is visible at once and lasts once a durable one follows.
    s.commit_leases(
        &[LeaseCommit {
            writes: vec![LeaseChange::Upsert(lease(5, 50, LeaseState::Offered, 1000))],
            events: Vec::new(),
        }],
        false,
    )
    .unwrap();
    assert_eq!(s.lease(mac(5)).unwrap().unwrap().ip, ip(50));
}

/// A declined record only blocks its address: it is nobody's lease, and the by-MAC
/// lookup forgets it; a record written over another MAC's takes the address from it.
pub(crate) fn the_by_mac_lookup_follows_the_records(f: &mut dyn Fixture) {
    let s = f.fresh();
    s.put_lease(&lease(1, 10, LeaseState::Bound, 200)).unwrap();
    s.put_lease(&lease(1, 10, LeaseState::Declined, 1000))
        .unwrap();
    assert_eq!(s.lease(mac(1)).unwrap(), None);
    assert_eq!(
        s.lease_by_ip(ip(10)).unwrap().unwrap().state,
        LeaseState::Declined
    );
    s.put_lease(&lease(2, 11, LeaseState::Bound, 200)).unwrap();
    s.put_lease(&lease(3, 11, LeaseState::Offered, 900))
        .unwrap();
    assert_eq!(s.lease(mac(2)).unwrap(), None);
    assert_eq!(s.lease(mac(3)).unwrap().unwrap().ip, ip(11));
}

/// After commits that move, replace, decline and remove: what `settled_leases` answers (a
/// networked store answers from its own record of its commits) is what reading each MAC and
/// address answers, for MACs and addresses with and without a record.
pub(crate) fn settled_leases_are_what_the_reads_return(f: &mut dyn Fixture) {
    let s = f.fresh();
    let commit = |writes: Vec<LeaseChange>| {
        s.commit_leases(
            &[LeaseCommit {
                writes,
                events: Vec::new(),
            }],
            true,
        )
        .unwrap()
    };
    commit(vec![
        LeaseChange::Upsert(lease(1, 10, LeaseState::Bound, 200)),
        LeaseChange::Upsert(lease(2, 11, LeaseState::Bound, 200)),
        LeaseChange::Upsert(lease(3, 12, LeaseState::Bound, 200)),
    ]);
    // 1 moves to .13, 3 takes .11 over from 2, .12 is declined, 4 comes and goes.
    commit(vec![
        LeaseChange::Upsert(lease(1, 13, LeaseState::Bound, 300)),
        LeaseChange::Upsert(lease(3, 11, LeaseState::Offered, 300)),
    ]);
    commit(vec![
        LeaseChange::Upsert(lease(5, 12, LeaseState::Declined, 900)),
        LeaseChange::Upsert(lease(4, 14, LeaseState::Bound, 300)),
    ]);
    commit(vec![LeaseChange::Remove(ip(14))]);
    let macs: Vec<Mac> = (1..=6).map(mac).collect();
    let ips: Vec<Ipv4Addr> = (9..=15).map(ip).collect();
    let settled = s.settled_leases(&macs, &ips).unwrap();
    let want_leases: Vec<Lease> = macs.iter().filter_map(|&m| s.lease(m).unwrap()).collect();
    let want_holders: Vec<(Ipv4Addr, Mac)> = ips
        .iter()
        .filter_map(|&a| s.lease_by_ip(a).unwrap().map(|l| (a, l.mac)))
        .collect();
    assert_eq!(settled.leases, want_leases);
    assert_eq!(settled.holders, want_holders);
    // And the reads say what the commits meant (so the comparison is not of two empties).
    let held: Vec<(u8, Ipv4Addr)> = want_leases.iter().map(|l| (l.mac.0[5], l.ip)).collect();
    assert_eq!(held, vec![(1, ip(13)), (3, ip(11))]);
    assert_eq!(want_holders.len(), 4, "{want_holders:?}");
}

pub(crate) fn node_records_round_trip_and_list_by_name(f: &mut dyn Fixture) {
    let s = f.fresh();
    assert_eq!(s.node("cp1").unwrap(), None);
    let w = node("worker1", NodePhase::Booting, 10);
    let mut cp = node("cp1", NodePhase::Installing, 20);
    s.put_node(&w).unwrap();
    s.put_node(&cp).unwrap();
    assert_eq!(s.node("cp1").unwrap(), Some(cp.clone()));

    cp.phase = NodePhase::Ready;
    cp.last_seen_addr = None;
    cp.talos_version = None;
    cp.provisioning_window_open = false;
    s.put_node(&cp).unwrap();
    assert_eq!(s.nodes().unwrap(), vec![cp, w]);
}

pub(crate) fn events_are_numbered_per_node_and_paged(f: &mut dyn Fixture) {
    let s = f.fresh();
    assert_eq!(s.last_event("cp1").unwrap(), None);
    for i in 1..=5u64 {
        assert_eq!(
            s.append_event("cp1", "dhcp.offer", &format!("d{i}"), 1000 + i)
                .unwrap(),
            i
        );
    }
    // Another node (including one whose name extends the first) has its own sequence.
    assert_eq!(s.append_event("cp10", "boot", "x", 5).unwrap(), 1);
    assert_eq!(s.append_event("cp", "boot", "x", 5).unwrap(), 1);

    let all = s.events("cp1", 0, usize::MAX).unwrap();
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert!(
        all.iter()
            .all(|e| e.node == "cp1" && e.kind == "dhcp.offer")
    );
    assert_eq!(all[2].detail, "d3");
    assert_eq!(all[2].at_unix_ms, 1003);

    let page = s.events("cp1", 2, 2).unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    assert!(s.events("cp1", 5, 10).unwrap().is_empty());
    assert!(s.events("cp1", u64::MAX, 10).unwrap().is_empty());
    assert!(s.events("nobody", 0, 10).unwrap().is_empty());
    assert_eq!(s.last_event("cp1").unwrap().unwrap().detail, "d5");
    assert_eq!(s.last_event("cp10").unwrap().unwrap().seq, 1);
}

pub(crate) fn repeated_identical_events_fold_into_one_with_a_count(f: &mut dyn Fixture) {
    let s = f.fresh();
    let refused = "Version at 10.0.0.5:50000 (maintenance) failed: connection refused";
    for at in 1..=40u64 {
        assert_eq!(s.append_event("w1", "talos.call", refused, at).unwrap(), 1);
    }
    // Something else in between starts a new row; the same text after it is new again.
    assert_eq!(
        s.append_event("w1", "dhcp.ack", "acked 10.0.0.5", 50)
            .unwrap(),
        2
    );
    assert_eq!(s.append_event("w1", "talos.call", refused, 60).unwrap(), 3);
    // Same detail, other kind: not folded.
    assert_eq!(s.append_event("w1", "node.phase", refused, 70).unwrap(), 4);
    let all = s.events("w1", 0, 100).unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!((all[0].count, all[0].at_unix_ms), (40, 1));
    assert_eq!(all[0].last_at_unix_ms, Some(40));
    assert_eq!(all[0].display_detail(), format!("{refused} (x40)"));
    assert_eq!((all[1].count, all[1].last_at_unix_ms), (1, None));
    assert_eq!(all[2].display_detail(), refused);
    // A row written before folding existed (no count field) reads as one occurrence.
    let old: Event =
        serde_json::from_str(r#"{"seq":1,"at_unix_ms":5,"node":"n","kind":"k","detail":"d"}"#)
            .unwrap();
    assert_eq!((old.count, old.last_at_unix_ms), (1, None));
}

pub(crate) fn compare_and_set_semantics(f: &mut dyn Fixture) {
    let s = f.fresh();
    assert_eq!(s.get_meta("k").unwrap(), None);
    // Absent expected, absent stored: swaps.
    assert_eq!(
        s.compare_and_set_meta("k", None, b"v1").unwrap(),
        CasOutcome::Swapped
    );
    // Absent expected, present stored: refuses and reports the stored value.
    assert_eq!(
        s.compare_and_set_meta("k", None, b"v2").unwrap(),
        CasOutcome::Mismatch {
            current: Some(b"v1".to_vec())
        }
    );
    // Wrong expected value: refuses.
    let out = s.compare_and_set_meta("k", Some(b"v0"), b"v2").unwrap();
    assert!(!out.is_swapped());
    assert_eq!(s.get_meta("k").unwrap(), Some(b"v1".to_vec()));
    // Right expected value: swaps.
    assert!(
        s.compare_and_set_meta("k", Some(b"v1"), b"v2")
            .unwrap()
            .is_swapped()
    );
    assert_eq!(s.get_meta("k").unwrap(), Some(b"v2".to_vec()));
    // Expected value for an absent key: refuses, key stays absent.
    assert_eq!(
        s.compare_and_set_meta("other", Some(b""), b"x").unwrap(),
        CasOutcome::Mismatch { current: None }
    );
    assert_eq!(s.get_meta("other").unwrap(), None);
    // put_meta overwrites unconditionally.
    s.put_meta("k", b"v3").unwrap();
    assert_eq!(s.get_meta("k").unwrap(), Some(b"v3".to_vec()));
}

pub(crate) fn compare_and_set_from_many_threads_swaps_once(f: &mut dyn Fixture) {
    let s = f.fresh();
    // Through the trait object, as the write handles hold it.
    let s: Arc<dyn Backend> = Arc::from(s);
    let winners: Vec<bool> = (0..8u8)
        .map(|i| {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                s.compare_and_set_meta("bootstrap", None, &[i])
                    .unwrap()
                    .is_swapped()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(winners.iter().filter(|w| **w).count(), 1);
    let winner = winners.iter().position(|w| *w).unwrap() as u8;
    assert_eq!(s.get_meta("bootstrap").unwrap(), Some(vec![winner]));
}

pub(crate) fn export_contains_every_table(f: &mut dyn Fixture) {
    let s = f.fresh();
    s.put_lease(&lease(1, 10, LeaseState::Bound, 1000)).unwrap();
    s.put_node(&node("cp1", NodePhase::Ready, 1)).unwrap();
    s.append_event("cp1", "ready", "node is ready", 42).unwrap();
    s.put_meta("text", b"bootstrap-done").unwrap();
    s.put_meta("bin", &[0xff, 0x00, 0x10]).unwrap();
    s.put_node_states(&[NodeWrite {
        name: "cp1".into(),
        record: None,
        parts: vec![(NodePart::Lifecycle, br#"{"install_seen":true}"#.to_vec())],
    }])
    .unwrap();

    let v = s.export_json().unwrap();
    assert_eq!(v["node_lifecycle"]["cp1"]["install_seen"], true);
    assert_eq!(v["schema_version"], SCHEMA_VERSION);
    assert_eq!(v["leases"][0]["mac"], "52:54:00:00:00:01");
    assert_eq!(v["leases"][0]["state"], "bound");
    assert_eq!(v["nodes"][0]["name"], "cp1");
    assert_eq!(v["nodes"][0]["phase"], "ready");
    assert_eq!(v["events"][0]["seq"], 1);
    assert_eq!(v["events"][0]["detail"], "node is ready");
    assert_eq!(
        v["cluster_meta"]["text"],
        serde_json::json!({"text": "bootstrap-done"})
    );
    assert_eq!(
        v["cluster_meta"]["bin"],
        serde_json::json!({"hex": "ff0010"})
    );
}

pub(crate) fn rollout_records_survive_a_reopen_and_are_exported(f: &mut dyn Fixture) {
    let store = f.fresh();
    assert_eq!(store.rollout("apply/abc").unwrap(), None);
    store.put_rollout("apply/abc", b"{\"v\":1}").unwrap();
    store.put_rollout("apply/abc", b"{\"v\":2}").unwrap();
    store.put_rollout("upgrade-talos/v1.13.9", b"{}").unwrap();
    drop(store);
    let store = f.reopen();
    assert_eq!(
        store.rollout("apply/abc").unwrap().as_deref(),
        Some(&b"{\"v\":2}"[..])
    );
    assert_eq!(
        store.rollout_keys().unwrap(),
        vec!["apply/abc".to_string(), "upgrade-talos/v1.13.9".to_string()]
    );
    let export = store.export_json().unwrap();
    assert_eq!(export["rollouts"]["apply/abc"]["v"], 2);
}

pub(crate) fn reopen_keeps_data_and_continues_event_numbering(f: &mut dyn Fixture) {
    let l = lease(1, 10, LeaseState::Bound, 1000);
    let n = node("cp1", NodePhase::Configuring, 10);
    {
        let s = f.fresh();
        s.put_lease(&l).unwrap();
        s.put_node(&n).unwrap();
        s.put_meta("cluster.bootstrap", b"done").unwrap();
        assert_eq!(s.append_event("cp1", "a", "", 1).unwrap(), 1);
        assert_eq!(s.append_event("cp1", "b", "", 2).unwrap(), 2);
    }
    let s = f.reopen();
    assert_eq!(s.lease(mac(1)).unwrap(), Some(l));
    assert_eq!(s.node("cp1").unwrap(), Some(n));
    assert_eq!(
        s.get_meta("cluster.bootstrap").unwrap().as_deref(),
        Some(&b"done"[..])
    );
    assert_eq!(s.append_event("cp1", "c", "", 3).unwrap(), 3);
    let kinds: Vec<_> = s
        .events("cp1", 0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["a", "b", "c"]);
}
