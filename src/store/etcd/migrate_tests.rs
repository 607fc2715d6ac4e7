//! `store migrate` against a real etcd ([`super::testing`]): a redb store holding every
//! table copied whole and read back equal; a copy stopped after some batches resumed
//! without duplicating anything; refusals (a running serve's locked file, foreign keys,
//! a changed source).

use std::path::Path;

use super::migrate::{MigrateError, MigrateOptions, MigratePlan, migrate};
use super::testing::EtcdServer;
use crate::inventory::Mac;
use crate::store::writers::Backend;
use crate::store::{
    ClusterTable, Lease, LeaseState, NodePart, NodePhase, NodeRecord, NodeWrite, RedbStore, Store,
};

/// A redb store in `dir` holding rows in every table: `nodes` nodes, each with a lease, a
/// record, facts and lifecycle parts and `events` events; a declined lease; meta (text and
/// binary), progress, a pull token, a rollout.
fn fill(dir: &Path, nodes: u8, events: u32) {
    let s = RedbStore::open(dir).unwrap();
    for n in 0..nodes {
        let name = format!("node-{n:03}");
        let ip = std::net::Ipv4Addr::new(10, 0, 1, n);
        s.put_lease(&Lease {
            mac: Mac([2, 0, 0, 0, 1, n]),
            ip,
            hostname: Some(name.clone()),
            state: LeaseState::Bound,
            expires_at_unix: 4_000_000_000,
            updated_at_unix: 1,
        })
        .unwrap();
        s.put_node_states(&[NodeWrite {
            name: name.clone(),
            record: Some(NodeRecord {
                name: name.clone(),
                phase: NodePhase::Ready,
                phase_since_unix: 5,
                last_seen_addr: Some(ip),
                mac: Some(Mac([2, 0, 0, 0, 1, n])),
                talos_version: Some("v1.13.9".into()),
                provisioning_window_open: false,
                updated_at_unix: 6,
            }),
            parts: vec![
                (NodePart::Facts, br#"{"disks":[]}"#.to_vec()),
                (NodePart::Lifecycle, br#"{"install_seen":true}"#.to_vec()),
            ],
        }])
        .unwrap();
        for e in 0..events {
            s.append_event(&name, "test.step", &format!("step {e}"), u64::from(e))
                .unwrap();
        }
    }
    s.put_lease(&Lease {
        mac: Mac([2, 0, 0, 0, 9, 9]),
        ip: std::net::Ipv4Addr::new(10, 0, 9, 9),
        hostname: None,
        state: LeaseState::Declined,
        expires_at_unix: 4_000_000_000,
        updated_at_unix: 1,
    })
    .unwrap();
    s.put_meta("text", b"bootstrap-done").unwrap();
    s.put_meta("bin", &[0xff, 0, 0x10]).unwrap();
    s.put_row(ClusterTable::Progress, "bootstrap_node", b"node-000")
        .unwrap();
    s.put_row(ClusterTable::PullTokens, "abc", br#"{"node":"node-001"}"#)
        .unwrap();
    s.put_rollout("apply/1", br#"{"nodes":["node-000"]}"#)
        .unwrap();
}

fn export_of(dir: &Path) -> serde_json::Value {
    RedbStore::open(dir).unwrap().export_json().unwrap()
}

const WHOLE: MigrateOptions = MigrateOptions { stop_after: None };

#[test]
fn a_whole_store_is_copied_read_back_equal_and_a_rerun_writes_nothing() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 40, 5);
    let cfg = server.config("fleet");
    let report = migrate(dir.path(), &cfg, WHOLE, |_, _| {}).unwrap();
    let plan = MigratePlan::from_export(&export_of(dir.path()), "fleet").unwrap();
    assert_eq!(report.written, plan.rows().len());
    assert_eq!(report.skipped, 0);
    // 40 nodes x (lease + MAC index + record + 2 parts + 5 events + head) + declined lease
    // + 2 meta + progress + token + rollout: more than one transaction.
    assert_eq!(report.tables["events"].count, 200);
    assert_eq!(report.tables["event_head"].count, 40);
    assert_eq!(report.tables["leases"].count, 40 * 2 + 1);
    assert!(report.batches > 1, "{report:?}");

    // The etcd store answers as the redb one did.
    let etcd = server.open("fleet");
    assert_eq!(etcd.export_json().unwrap(), export_of(dir.path()));
    let mac = Mac([2, 0, 0, 0, 1, 7]);
    assert_eq!(etcd.lease(mac).unwrap().map(|l| l.ip.octets()[3]), Some(7));
    assert_eq!(etcd.events("node-003", 0, 100).unwrap().len(), 5);
    // Event numbering continues from the copied head, not from 1.
    let seq = etcd
        .append_event("node-003", "after", "migrated", 99)
        .unwrap();
    assert_eq!(seq, 6);
    drop(etcd);

    let again = migrate(dir.path(), &cfg, WHOLE, |_, _| {});
    // The appended event is not the source's: the prefix no longer holds only this copy.
    assert!(
        matches!(again, Err(MigrateError::ForeignData { .. })),
        "{again:?}"
    );
}

#[test]
fn a_copy_stopped_midway_resumes_and_duplicates_nothing() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 60, 4);
    let cfg = server.config("fleet");
    let first = migrate(
        dir.path(),
        &cfg,
        MigrateOptions {
            stop_after: Some(2),
        },
        |_, _| {},
    )
    .unwrap();
    assert!(first.stopped);
    assert_eq!(first.batches, 2);
    let partial = server.open("fleet");
    let copied = partial.export_json().unwrap();
    assert_ne!(copied, export_of(dir.path()));
    drop(partial);

    let second = migrate(dir.path(), &cfg, WHOLE, |_, _| {}).unwrap();
    assert!(!second.stopped);
    assert_eq!(second.skipped, first.written);
    let plan = MigratePlan::from_export(&export_of(dir.path()), "fleet").unwrap();
    assert_eq!(first.written + second.written, plan.rows().len());
    let etcd = server.open("fleet");
    assert_eq!(etcd.export_json().unwrap(), export_of(dir.path()));
    assert_eq!(etcd.events("node-010", 0, 100).unwrap().len(), 4);

    // A third run finds the copy complete: nothing written, everything skipped.
    drop(etcd);
    let third = migrate(dir.path(), &cfg, WHOLE, |_, _| {}).unwrap();
    assert_eq!((third.written, third.skipped), (0, plan.rows().len()));
}

#[test]
fn refusals_a_locked_source_foreign_keys_and_a_changed_source() {
    let Some(server) = EtcdServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 3, 2);
    let cfg = server.config("fleet");

    // A running serve holds the file.
    let serving = RedbStore::open(dir.path()).unwrap();
    let e = migrate(dir.path(), &cfg, WHOLE, |_, _| {}).unwrap_err();
    assert!(matches!(e, MigrateError::SourceInUse(_)), "{e}");
    assert!(e.to_string().contains("stop it first"), "{e}");
    drop(serving);

    // No state file at all.
    let empty = tempfile::tempdir().unwrap();
    let e = migrate(empty.path(), &cfg, WHOLE, |_, _| {}).unwrap_err();
    assert!(matches!(e, MigrateError::NoSource(_)), "{e}");

    // A prefix an appliance already wrote to.
    let other = server.open("busy");
    other.put_meta("x", b"y").unwrap();
    drop(other);
    let e = migrate(dir.path(), &server.config("busy"), WHOLE, |_, _| {}).unwrap_err();
    assert!(
        matches!(e, MigrateError::ForeignData { count: 1, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("/talboot/busy/"), "{e}");

    // A copy begun, then the source changed (serve ran again on redb): refused.
    let first = migrate(
        dir.path(),
        &cfg,
        MigrateOptions {
            stop_after: Some(0),
        },
        |_, _| {},
    );
    assert!(first.unwrap().stopped);
    let stopped = migrate(
        dir.path(),
        &cfg,
        MigrateOptions {
            stop_after: Some(1),
        },
        |_, _| {},
    );
    assert!(stopped.is_ok());
    RedbStore::open(dir.path())
        .unwrap()
        .append_event("node-000", "later", "serve ran again", 9)
        .unwrap();
    let e = migrate(dir.path(), &cfg, WHOLE, |_, _| {}).unwrap_err();
    assert!(matches!(e, MigrateError::SourceChanged { .. }), "{e}");
}
