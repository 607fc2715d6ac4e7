//! The etcd backend against a real etcd (see [`super::testing`]): the store suite, and what
//! only a shared store must get right (racing appliances, batches past `--max-txn-ops`,
//! etcd gone).

use std::net::Ipv4Addr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::testing::EtcdServer;
use super::{EtcdConfig, EtcdStore};
use crate::inventory::Mac;
use crate::store::suite::{Fixture, store_suite};
use crate::store::writers::Backend;
use crate::store::{Lease, LeaseChange, LeaseCommit, LeaseState, NewEvent, Store, StoreError};

/// Stores on one member, each `fresh` under a new cluster prefix.
struct EtcdFixture {
    server: EtcdServer,
    clusters: usize,
}

impl EtcdFixture {
    fn start() -> Option<Self> {
        Some(Self {
            server: EtcdServer::start()?,
            clusters: 0,
        })
    }
}

impl Fixture for EtcdFixture {
    fn fresh(&mut self) -> Box<dyn Backend> {
        self.clusters += 1;
        self.reopen()
    }

    fn reopen(&mut self) -> Box<dyn Backend> {
        Box::new(self.server.open(&format!("c{}", self.clusters)))
    }
}

mod suite {
    super::store_suite!(super::EtcdFixture::start());
}

fn lease(mac: u8, ip: Ipv4Addr) -> Lease {
    Lease {
        mac: Mac([2, 0, 0, 0, ip.octets()[3], mac]),
        ip,
        hostname: None,
        state: LeaseState::Bound,
        expires_at_unix: 4_000_000_000,
        updated_at_unix: 1,
    }
}

fn upsert(l: Lease, node: &str) -> LeaseCommit {
    LeaseCommit {
        events: vec![NewEvent {
            node: node.into(),
            kind: "dhcp.ack".into(),
            detail: format!("{} to {}", l.ip, l.mac),
            at_unix_ms: 1,
        }],
        writes: vec![LeaseChange::Upsert(l)],
    }
}

/// Two appliances (two stores, each having loaded the same empty state) commit the same
/// address for different MACs at the same moment, 20 times over: exactly one wins each
/// time, the other is told so and writes nothing.
#[test]
fn two_stores_racing_for_one_address_commit_it_once() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let a = Arc::new(server.open("race"));
    let b = Arc::new(server.open("race"));
    for i in 1..=20u8 {
        let ip = Ipv4Addr::new(10, 1, 0, i);
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [(a.clone(), 1u8), (b.clone(), 2u8)]
            .into_iter()
            .map(|(store, m)| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    store.commit_leases(&[upsert(lease(m, ip), "n")], true)
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        let won: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
        assert_eq!(won.len(), 1, "round {i}: {results:?}");
        let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            matches!(lost, StoreError::EtcdConflict { key, .. } if key.contains("/leases/")),
            "{lost}"
        );
        // One record at the address, one index entry naming it, no stray one.
        let holder = a.lease_by_ip(ip).unwrap().unwrap();
        assert_eq!(b.lease(holder.mac).unwrap().unwrap().ip, ip);
        let other = Mac([2, 0, 0, 0, i, 3 - holder.mac.0[5]]);
        assert_eq!(a.lease(other).unwrap(), None);
    }
    // Each round appended one event for the winner only: numbers 1..=20, no gap, no twin.
    let seqs: Vec<u64> = a
        .events("n", 0, 100)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<_>>());
}

const MAC9: Mac = Mac([2, 0, 0, 0, 9, 9]);

/// The same MAC given two addresses by two appliances: the MAC index makes one lose.
#[test]
fn two_stores_cannot_give_one_mac_two_addresses() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let a = server.open("mac");
    let b = server.open("mac");
    a.commit_leases(
        &[upsert(
            Lease {
                mac: MAC9,
                ..lease(9, Ipv4Addr::new(10, 2, 0, 1))
            },
            "n",
        )],
        true,
    )
    .unwrap();
    let err = b
        .commit_leases(
            &[upsert(
                Lease {
                    mac: MAC9,
                    ..lease(9, Ipv4Addr::new(10, 2, 0, 2))
                },
                "n",
            )],
            true,
        )
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::EtcdConflict { key, .. } if key.contains("/leases/mac/")),
        "{err}"
    );
    assert_eq!(b.lease_by_ip(Ipv4Addr::new(10, 2, 0, 2)).unwrap(), None);
    // Once it has read the state again, the same store commits on top of it.
    // The book moves a client by removing its old record first.
    b.reload_leases().unwrap();
    let mut moving = upsert(
        Lease {
            mac: MAC9,
            ..lease(9, Ipv4Addr::new(10, 2, 0, 2))
        },
        "n",
    );
    moving
        .writes
        .insert(0, LeaseChange::Remove(Ipv4Addr::new(10, 2, 0, 1)));
    b.commit_leases(&[moving], true).unwrap();
    assert_eq!(
        a.lease(MAC9).unwrap().unwrap().ip,
        Ipv4Addr::new(10, 2, 0, 2)
    );
    assert_eq!(a.lease_by_ip(Ipv4Addr::new(10, 2, 0, 1)).unwrap(), None);
}

/// 300 lease groups (900 writes with their events' rows and heads) and 300 events in one
/// call each: past etcd's default `--max-txn-ops` 128, split into transactions that etcd
/// accepts, all of it stored, and a reopened store sees it all.
#[test]
fn batches_past_max_txn_ops_commit_and_a_reopened_store_sees_them() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let s = server.open("big");
    let groups: Vec<LeaseCommit> = (0..300u32)
        .map(|i| {
            let ip = Ipv4Addr::from(0x0a03_0000 + i);
            let mut l = lease(0, ip);
            l.mac = Mac([2, 1, 0, 0, (i >> 8) as u8, i as u8]);
            upsert(l, &format!("n{i}"))
        })
        .collect();
    s.commit_leases(&groups, true).unwrap();
    let events: Vec<NewEvent> = (0..300u64)
        .map(|i| NewEvent {
            node: "bulk".into(),
            kind: "k".into(),
            detail: format!("d{i}"),
            at_unix_ms: i,
        })
        .collect();
    let seqs = s.append_events(&events).unwrap();
    assert_eq!(seqs, (1..=300).collect::<Vec<_>>());
    let before = s.export_json().unwrap();
    drop(s);

    let s = server.open("big");
    assert_eq!(s.leases().unwrap().len(), 300);
    assert_eq!(s.events("bulk", 0, 1000).unwrap().len(), 300);
    assert_eq!(s.last_event("n299").unwrap().unwrap().seq, 1);
    assert_eq!(s.export_json().unwrap(), before);
    // The reopened store compares against what it loaded: it can move a lease on.
    let mut moved = s.lease_by_ip(Ipv4Addr::from(0x0a03_0000)).unwrap().unwrap();
    moved.state = LeaseState::Released;
    s.commit_leases(&[upsert(moved.clone(), "n0")], true)
        .unwrap();
    assert_eq!(s.lease(moved.mac).unwrap(), Some(moved));
}

/// etcd killed under an open store: reads and writes fail with a typed error naming the
/// endpoint within the timeout (also when called on a tokio worker), and opening a store
/// against nothing fails the same way. Nothing hangs or panics.
#[test]
fn etcd_down_is_a_typed_error_not_a_hang() {
    let Some(mut server) = EtcdServer::start() else {
        return;
    };
    let mut cfg = server.config("down");
    cfg.request_timeout = Duration::from_secs(1);
    let s = Arc::new(EtcdStore::open(&cfg).unwrap());
    s.put_meta("k", b"v").unwrap();
    server.kill();

    let started = Instant::now();
    let err = s.put_meta("k", b"w").unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    let named = |e: &StoreError| {
        matches!(
            e,
            StoreError::Etcd { .. }
                | StoreError::EtcdTimeout { .. }
                | StoreError::EtcdUnreachable { .. }
        ) && e.to_string().contains(&server.url())
    };
    assert!(named(&err), "{err}");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let reader = s.clone();
    let err = rt
        .block_on(async move { reader.get_meta("k") })
        .unwrap_err();
    assert!(named(&err), "{err}");
    // Dropped on a tokio worker: the client's runtime thread ends without a panic.
    rt.block_on(async move { drop(s) });

    let started = Instant::now();
    let err = EtcdStore::open(&cfg).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(named(&err), "{err}");
}

/// A prefix written by a newer schema is refused, left as it is.
#[test]
fn a_newer_schema_is_refused_and_left_untouched() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let s = server.open("future");
    let key = s.keys.schema();
    s.call("test", key, |mut c, key| async move {
        c.put(key, "2", None).await
    })
    .unwrap();
    let err = EtcdStore::open(&server.config("future")).unwrap_err();
    assert!(
        matches!(&err, StoreError::EtcdData { cause, .. } if cause.contains("schema version 2")),
        "{err}"
    );
    let key = s.keys.schema();
    let kv = s
        .call(
            "test",
            key,
            |mut c, key| async move { c.get(key, None).await },
        )
        .unwrap();
    assert_eq!(kv.kvs()[0].value(), b"2");
}

#[test]
fn store_urls_name_the_endpoints() {
    let cfg = EtcdConfig::from_url("etcd://10.0.0.2:2379,etcd-b:2379", "lab").unwrap();
    assert_eq!(
        cfg.endpoints,
        ["http://10.0.0.2:2379", "http://etcd-b:2379"]
    );
    assert_eq!(cfg.cluster, "lab");
    let cfg = EtcdConfig::from_url("etcds://[fd00::2]:2379/", "lab").unwrap();
    assert_eq!(cfg.endpoints, ["https://[fd00::2]:2379"]);
    for bad in [
        "http://h:2379",
        "etcd://h",
        "etcd://h:2379,",
        "etcd://h:x",
        "etcd://h:1/p",
    ] {
        let err = EtcdConfig::from_url(bad, "lab").unwrap_err();
        assert!(err.to_string().contains("expected etcd://"), "{bad}: {err}");
    }
}

#[test]
fn configuration_errors_name_the_flag() {
    let mut cfg = EtcdConfig::new(vec!["127.0.0.1:1".into()], "c");
    cfg.cert = Some("/nonexistent/cert.pem".into());
    let err = EtcdStore::open(&cfg).unwrap_err();
    assert!(err.to_string().contains("--cert and --key"), "{err}");
    cfg.key = Some("/nonexistent/key.pem".into());
    let err = EtcdStore::open(&cfg).unwrap_err();
    assert!(
        err.to_string().contains("--cert /nonexistent/cert.pem"),
        "{err}"
    );
    assert_eq!(cfg.urls(true), ["https://127.0.0.1:1"]);
    let err = EtcdStore::open(&EtcdConfig::new(Vec::new(), "c")).unwrap_err();
    assert!(matches!(err, StoreError::EtcdConfig { .. }), "{err}");
}

/// A 3-member etcd: a store over all three endpoints keeps committing with one member
/// killed (a quorum remains) and the commits are there; with two killed (no quorum) a write
/// fails with a typed error naming the endpoints, within its timeout, and writes nothing.
#[test]
fn three_members_survive_one_loss_and_refuse_writes_without_quorum() {
    let Some(mut server) = EtcdServer::start_cluster(3) else {
        return;
    };
    let mut cfg = server.config("quorum");
    cfg.request_timeout = Duration::from_secs(2);
    let s = EtcdStore::open(&cfg).unwrap();
    s.commit_leases(&[upsert(lease(1, Ipv4Addr::new(10, 4, 0, 1)), "n")], true)
        .unwrap();
    server.kill_member(0);
    // The client may first try the dead member; a write lands within a few attempts.
    let ip = Ipv4Addr::new(10, 4, 0, 2);
    let landed = (0..5).any(|_| s.commit_leases(&[upsert(lease(2, ip), "n")], true).is_ok());
    assert!(landed, "no write landed with 2 of 3 members up");
    assert_eq!(s.lease_by_ip(ip).unwrap().unwrap().ip, ip);
    assert_eq!(s.leases().unwrap().len(), 2);

    server.kill_member(1);
    let started = Instant::now();
    let err = s.put_meta("k", b"v").unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            err,
            StoreError::Etcd { .. } | StoreError::EtcdTimeout { .. }
        ) && err.to_string().contains(&server.url()),
        "{err}"
    );
}
