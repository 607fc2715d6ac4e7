//! The DHCP server on a shared etcd store (issue 28 item 2): commits that lose a race to
//! another appliance, and the peers' lease changes the book must learn.
//!
//! Two appliances may decide the same free address at once; etcd lets one commit win (every
//! lease key is compared at the revision this store last saw, `store::etcd` `plan`) and the
//! other gets [`StoreError::EtcdConflict`] with nothing of its transaction written. A flat
//! etcd transaction is all-or-nothing (measured against etcd 3.4.23 in namespaces; etcd applies a txn's
//! compares as one, `etcdserver/apply.go` `applyTxn` at v3.4.23), so one conflicting group
//! would drop every group of the burst sharing its transaction: [`commit_split`] commits the
//! batch again in halves around the conflict until only the conflicting groups are left.
//! Their jobs get no reply (the client retries and is decided afresh), and their keys are
//! read back so the book learns the winner's records at once.
//!
//! Ordering: a peer's change reaches the book (the handling half) first, and the store's
//! compare view only when the committer reaches a marker job the handling half queued after
//! learning it. Every job queued before the marker was decided on the old book, so its
//! commit still compares against the old revisions and fails if it touches what the peer
//! changed; every job after it was decided knowing the peer's record.

use std::net::Ipv4Addr;
use std::sync::Arc;

use metrics::counter;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::store::{EtcdStore, Lease, LeaseCommit, LeaseEvent, LeaseFilter, StoreError};

/// What became of one group of a commit.
#[derive(Debug, Clone)]
pub(super) enum GroupOutcome {
    /// Written.
    Committed,
    /// Another appliance changed a key it compares; nothing of it written.
    Conflict,
    /// The store failed (not a conflict); it may or may not be written.
    Failed(Arc<StoreError>),
}

/// Commit `groups` with `commit` (one call commits a slice of groups, in as few
/// transactions as it needs): on a conflict, the groups before the conflicting transaction
/// are committed, and the rest is committed again in halves, down to the single groups that
/// conflict. With `k` conflicting groups of `n` this costs about `2k log2 n` more commits,
/// and none when nothing conflicts.
pub(super) fn commit_split(
    groups: &[LeaseCommit],
    commit: &mut dyn FnMut(&[LeaseCommit]) -> Result<(), StoreError>,
) -> Vec<GroupOutcome> {
    let mut out = vec![GroupOutcome::Committed; groups.len()];
    split_into(groups, 0, groups.len(), commit, &mut out);
    out
}

fn split_into(
    groups: &[LeaseCommit],
    lo: usize,
    hi: usize,
    commit: &mut dyn FnMut(&[LeaseCommit]) -> Result<(), StoreError>,
    out: &mut [GroupOutcome],
) {
    if lo >= hi {
        return;
    }
    match commit(&groups[lo..hi]) {
        Ok(()) => {}
        Err(StoreError::EtcdConflict { committed, .. }) => {
            let first = lo + committed.min(hi - lo - 1);
            if hi - first == 1 {
                out[first] = GroupOutcome::Conflict;
            } else {
                let mid = first + (hi - first) / 2;
                split_into(groups, first, mid, commit, out);
                split_into(groups, mid, hi, commit, out);
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for o in &mut out[lo..hi] {
                *o = GroupOutcome::Failed(e.clone());
            }
        }
    }
}

/// What the committer tells the handling half about the book.
#[derive(Debug)]
pub(super) enum Note {
    /// The write of this address failed: the book must write it again.
    NotDurable(Ipv4Addr),
    /// Peers changed these records: learn them, then queue a marker carrying `events` so
    /// the store compares against them from then on.
    Learn {
        /// The raw changes, for the store's compare view.
        events: Vec<LeaseEvent>,
        /// The lease records among them, by address (`None`: removed).
        records: Vec<(Ipv4Addr, Option<Lease>)>,
    },
}

/// The committer's link to etcd: the store, the lease feed, and what was passed on.
pub(crate) struct HaLink {
    pub(super) etcd: Arc<EtcdStore>,
    pub(super) feed: Option<mpsc::UnboundedReceiver<Vec<LeaseEvent>>>,
    pub(super) filter: LeaseFilter,
}

impl std::fmt::Debug for HaLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaLink").finish_non_exhaustive()
    }
}

impl HaLink {
    /// The link over `etcd`, fed by `feed` (the store's [`EtcdStore::lease_feed`]).
    pub(crate) fn new(
        etcd: Arc<EtcdStore>,
        feed: Option<mpsc::UnboundedReceiver<Vec<LeaseEvent>>>,
    ) -> Self {
        Self {
            etcd,
            feed,
            filter: LeaseFilter::default(),
        }
    }

    /// The next batch of the feed; never, without one (or once it ended).
    pub(super) async fn next_batch(&mut self) -> Vec<LeaseEvent> {
        match &mut self.feed {
            Some(feed) => match feed.recv().await {
                Some(batch) => batch,
                None => {
                    warn!("the lease feed ended; peers' leases are learned only from conflicts");
                    self.feed = None;
                    std::future::pending().await
                }
            },
            None => std::future::pending().await,
        }
    }

    /// Pass the news among `events` to the handling half. Called between commits, so every
    /// own commit is already in the store's view and its echo is recognised.
    pub(super) fn forward(&mut self, events: Vec<LeaseEvent>, notes: &mpsc::UnboundedSender<Note>) {
        let events = self.etcd.fresh(&mut self.filter, events);
        if events.is_empty() {
            return;
        }
        let records: Vec<_> = events
            .iter()
            .filter_map(|e| self.etcd.lease_record(e))
            .collect();
        counter!("dhcp_peer_lease_changes_total").increment(records.len() as u64);
        debug!(
            changes = events.len(),
            records = records.len(),
            "learning peers' leases"
        );
        let _ = notes.send(Note::Learn { events, records });
    }

    /// Read back the keys of the groups that lost a race, and pass the winners' records on.
    pub(super) async fn learn_conflicts(
        &mut self,
        lost: Vec<LeaseCommit>,
        notes: &mpsc::UnboundedSender<Note>,
    ) {
        let etcd = self.etcd.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut keys: Vec<Vec<u8>> = lost.iter().flat_map(|g| etcd.lease_keys_of(g)).collect();
            keys.sort();
            keys.dedup();
            etcd.read_lease_keys(keys)
        })
        .await;
        match read {
            Ok(Ok(events)) => self.forward(events, notes),
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read back the leases a peer won; the feed will bring them")
            }
            Err(e) => warn!(error = %e, "cannot read back the leases a peer won"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LeaseChange;

    fn group(n: u8) -> LeaseCommit {
        LeaseCommit {
            writes: vec![LeaseChange::Remove(Ipv4Addr::new(10, 0, 0, n))],
            events: Vec::new(),
        }
    }

    fn id(g: &LeaseCommit) -> u8 {
        match g.writes[0] {
            LeaseChange::Remove(ip) => ip.octets()[3],
            LeaseChange::Upsert(_) => unreachable!(),
        }
    }

    /// A fake etcd: transactions of at most `per_txn` groups, a transaction holding a group
    /// in `bad` conflicts; returns the outcomes and every group id written (in order).
    fn run(n: u8, bad: &[u8], per_txn: usize) -> (Vec<GroupOutcome>, Vec<u8>, usize) {
        let groups: Vec<_> = (0..n).map(group).collect();
        let mut written = Vec::new();
        let mut calls = 0;
        let out = commit_split(&groups, &mut |gs: &[LeaseCommit]| {
            calls += 1;
            for (i, chunk) in gs.chunks(per_txn).enumerate() {
                if chunk.iter().any(|g| bad.contains(&id(g))) {
                    return Err(StoreError::EtcdConflict {
                        endpoints: String::new(),
                        key: String::new(),
                        committed: i * per_txn,
                    });
                }
                written.extend(chunk.iter().map(id));
            }
            Ok(())
        });
        (out, written, calls)
    }

    #[test]
    fn only_the_conflicting_groups_are_left_out() {
        for per_txn in [1, 3, 64] {
            let (out, mut written, _) = run(40, &[7, 8, 31], per_txn);
            for (i, o) in out.iter().enumerate() {
                let conflicting = [7, 8, 31].contains(&(i as u8));
                assert_eq!(
                    matches!(o, GroupOutcome::Conflict),
                    conflicting,
                    "group {i}"
                );
                assert_eq!(
                    matches!(o, GroupOutcome::Committed),
                    !conflicting,
                    "group {i}"
                );
            }
            // Each other group written exactly once, the conflicting ones never.
            written.sort_unstable();
            let want: Vec<u8> = (0..40).filter(|i| ![7, 8, 31].contains(i)).collect();
            assert_eq!(written, want, "per_txn {per_txn}");
        }
    }

    #[test]
    fn no_conflict_is_one_commit_and_other_failures_fail_the_rest() {
        let (out, written, calls) = run(10, &[], 4);
        assert_eq!((written.len(), calls), (10, 1));
        assert!(out.iter().all(|o| matches!(o, GroupOutcome::Committed)));
        let groups: Vec<_> = (0..4).map(group).collect();
        let out = commit_split(&groups, &mut |_| {
            Err(StoreError::EtcdConfig {
                cause: "down".into(),
            })
        });
        assert!(out.iter().all(|o| matches!(o, GroupOutcome::Failed(_))));
    }

    /// Two stores over one real etcd: `a` commits two addresses first; `b`, which has not
    /// seen them, commits a burst of 300 groups (three transactions at etcd's 128 ops) with
    /// those two among them: exactly those two are left out, every other one is in etcd.
    #[test]
    fn a_burst_racing_a_peer_on_real_etcd_loses_only_the_contested_groups() {
        use crate::store::etcd_testing::EtcdServer;
        use crate::store::{Lease, LeaseState, Store};
        let Some(server) = EtcdServer::start() else {
            return;
        };
        let (a, a_writers) = server.open("split").split();
        let (_b, b_writers) = server.open("split").split();
        let lease = |mac: u8, n: u16| Lease {
            mac: crate::inventory::Mac([2, 0, 0, mac, (n >> 8) as u8, n as u8]),
            ip: Ipv4Addr::new(10, 9, (n >> 8) as u8, n as u8),
            hostname: None,
            state: LeaseState::Bound,
            expires_at_unix: 4_000_000_000,
            updated_at_unix: 1,
        };
        let one = |l: Lease| LeaseCommit {
            writes: vec![LeaseChange::Upsert(l)],
            events: Vec::new(),
        };
        a_writers
            .leases
            .commit_leases(&[one(lease(1, 40)), one(lease(1, 250))], true)
            .unwrap();
        let groups: Vec<_> = (0..300).map(|n| one(lease(2, n))).collect();
        let out = commit_split(&groups, &mut |gs| b_writers.leases.commit_leases(gs, true));
        for (n, o) in out.iter().enumerate() {
            let contested = n == 40 || n == 250;
            assert_eq!(
                matches!(o, GroupOutcome::Conflict),
                contested,
                "group {n}: {o:?}"
            );
            assert_eq!(
                matches!(o, GroupOutcome::Committed),
                !contested,
                "group {n}: {o:?}"
            );
        }
        let held = a.leases().unwrap();
        assert_eq!(held.len(), 300);
        for l in held {
            let n = u16::from(l.ip.octets()[2]) << 8 | u16::from(l.ip.octets()[3]);
            let winner = if n == 40 || n == 250 { 1 } else { 2 };
            assert_eq!(l.mac.0[3], winner, "{}", l.ip);
        }
    }
}
