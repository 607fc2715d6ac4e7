//! Turning lease commits and event appends into etcd transactions: pure (what this store last
//! saw in, a transaction's compares and writes out), so the rules are tested without etcd.
//!
//! Every key a plan writes is compared in the same transaction against the mod revision this
//! store last saw it at (0: absent; etcd compares a missing key's revisions as 0,
//! `server/etcdserver/apply.go` `applyCompare` at v3.4.23). A lease record, the MAC index and
//! an event head changed by anyone else since then fail the whole transaction: two appliances
//! can never both commit the same address, nor the same MAC to two addresses, nor the same
//! event number. etcd refuses a transaction that writes one key twice ("duplicate key given
//! in txn request", `checkIntervals` in `etcdserver/api/v3rpc/key.go`), so a plan keeps each
//! key's final value once.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use super::keys::Keys;
use crate::store::{Event, Lease, LeaseChange, LeaseCommit, LeaseState, NewEvent};

/// Keys as this store last saw them: mod revision and value.
pub(crate) type View = HashMap<Vec<u8>, (i64, Vec<u8>)>;

/// One transaction: the compares and the writes (`None`: delete).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Mod revision each compared key must still have (0: absent).
    pub expect: BTreeMap<Vec<u8>, i64>,
    /// Each key's final value.
    pub writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The sequence number of each event planned, in order.
    pub seqs: Vec<u64>,
    /// How many of the groups given the plan covers (the rest go in the next transaction).
    pub groups: usize,
}

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlanError {
    /// A stored value does not decode.
    #[error("record {key}: {cause}")]
    Corrupt {
        /// The key.
        key: String,
        /// What was wrong.
        cause: String,
    },
    /// A record does not encode.
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// Which record.
        what: String,
        /// Underlying error.
        source: serde_json::Error,
    },
    /// One group alone needs more operations than a transaction may carry.
    #[error("one lease commit needs {ops} operations, more than etcd's --max-txn-ops {max}")]
    TooLarge {
        /// Operations needed.
        ops: usize,
        /// The limit.
        max: usize,
    },
}

/// Plans transactions over what this store saw: `leases` (the lease keys, kept by the store)
/// and `heads` (the event heads read for this attempt).
pub(crate) struct Planner<'a> {
    pub keys: &'a Keys,
    pub leases: &'a View,
    pub heads: &'a View,
    /// etcd's `--max-txn-ops` (compares and writes are each limited to it).
    pub max_ops: usize,
}

impl Planner<'_> {
    /// The longest prefix of `groups` (at least one) that fits one transaction.
    pub(crate) fn plan(&self, groups: &[LeaseCommit]) -> Result<Plan, PlanError> {
        let mut plan = Plan::default();
        for group in groups {
            let before = plan.clone();
            for change in &group.writes {
                self.change(&mut plan, change)?;
            }
            for event in &group.events {
                let seq = self.event(&mut plan, event)?;
                plan.seqs.push(seq);
            }
            let ops = plan.writes.len().max(plan.expect.len());
            if ops > self.max_ops {
                if before.groups == 0 {
                    return Err(PlanError::TooLarge {
                        ops,
                        max: self.max_ops,
                    });
                }
                return Ok(before);
            }
            plan.groups += 1;
        }
        Ok(plan)
    }

    /// The value of `key` as the plan leaves it so far, over `base`.
    fn current<'p>(&self, plan: &'p Plan, base: &'p View, key: &[u8]) -> Option<&'p [u8]> {
        match plan.writes.get(key) {
            Some(v) => v.as_deref(),
            None => base.get(key).map(|(_, v)| v.as_slice()),
        }
    }

    /// Write `value` to `key`, compared against its revision in `base`.
    fn write(plan: &mut Plan, base: &View, key: Vec<u8>, value: Option<Vec<u8>>) {
        let rev = base.get(&key).map_or(0, |(rev, _)| *rev);
        plan.expect.entry(key.clone()).or_insert(rev);
        plan.writes.insert(key, value);
    }

    /// The lease at `ip` as the plan leaves it so far.
    fn lease_at(&self, plan: &Plan, ip: Ipv4Addr) -> Result<Option<Lease>, PlanError> {
        let key = self.keys.lease_ip(ip);
        self.current(plan, self.leases, &key)
            .map(|bytes| decode(&key, bytes))
            .transpose()
    }

    /// Drop `mac`'s index entry if it names `ip`.
    fn unindex(&self, plan: &mut Plan, mac: crate::inventory::Mac, ip: Ipv4Addr) {
        let key = self.keys.lease_mac(mac);
        let names_ip = self.current(plan, self.leases, &key) == Some(ip.to_string().as_bytes());
        if names_ip {
            Self::write(plan, self.leases, key, None);
        }
    }

    /// One of the book's changes, as redb applies it (`RedbStore::apply_lease_change_in`):
    /// the record as it is, and the MAC index kept equal to the records.
    fn change(&self, plan: &mut Plan, change: &LeaseChange) -> Result<(), PlanError> {
        let lease = match change {
            LeaseChange::Upsert(lease) => lease,
            LeaseChange::Remove(ip) => {
                if let Some(old) = self.lease_at(plan, *ip)? {
                    Self::write(plan, self.leases, self.keys.lease_ip(*ip), None);
                    self.unindex(plan, old.mac, *ip);
                }
                return Ok(());
            }
        };
        let bytes = serde_json::to_vec(lease).map_err(|source| PlanError::Encode {
            what: format!("lease for {}", lease.ip),
            source,
        })?;
        let replaced = self.lease_at(plan, lease.ip)?.map(|l| l.mac);
        for mac in replaced.into_iter().chain([lease.mac]) {
            self.unindex(plan, mac, lease.ip);
        }
        if lease.state != LeaseState::Declined {
            let key = self.keys.lease_mac(lease.mac);
            Self::write(
                plan,
                self.leases,
                key,
                Some(lease.ip.to_string().into_bytes()),
            );
        }
        Self::write(plan, self.leases, self.keys.lease_ip(lease.ip), Some(bytes));
        Ok(())
    }

    /// Append `e` as redb does (`RedbStore::append_event_in`): folded into the node's newest
    /// event when kind and detail repeat, else numbered one more than it. Returns its number.
    fn event(&self, plan: &mut Plan, e: &NewEvent) -> Result<u64, PlanError> {
        let head_key = self.keys.event_head(&e.node);
        let head: Option<Event> = self
            .current(plan, self.heads, &head_key)
            .map(|bytes| decode(&head_key, bytes))
            .transpose()?;
        let event = match head {
            Some(mut prev) if prev.kind == e.kind && prev.detail == e.detail => {
                prev.count = prev.count.saturating_add(1);
                prev.last_at_unix_ms = Some(e.at_unix_ms);
                prev
            }
            prev => Event {
                seq: prev.map_or(0, |p| p.seq) + 1,
                at_unix_ms: e.at_unix_ms,
                node: e.node.clone(),
                kind: e.kind.clone(),
                detail: e.detail.clone(),
                count: 1,
                last_at_unix_ms: None,
            },
        };
        let bytes = serde_json::to_vec(&event).map_err(|source| PlanError::Encode {
            what: format!("event {} of node {}", event.seq, e.node),
            source,
        })?;
        let row = self.keys.event(&e.node, event.seq);
        // The row itself is not compared: its number comes from the head, which is.
        plan.writes.insert(row, Some(bytes.clone()));
        Self::write(plan, self.heads, head_key, Some(bytes));
        Ok(event.seq)
    }
}

/// Whether `now` (each written key of `plan` as etcd has it after an errored commit, in
/// `plan.writes` order; `None`: absent) shows the plan applied after all: every put there
/// with its value, all at one revision newer than every compared one, every delete gone.
/// Returns that revision. A plan of deletes only leaves no revision to tell by: `None`.
pub(crate) fn applied(plan: &Plan, now: &[Option<(i64, Vec<u8>)>]) -> Option<i64> {
    if now.len() != plan.writes.len() {
        return None;
    }
    let mut rev = None;
    for (want, got) in plan.writes.values().zip(now) {
        match (want, got) {
            (Some(v), Some((r, g))) if v == g => {
                if *rev.get_or_insert(*r) != *r {
                    return None;
                }
            }
            (None, None) => {}
            _ => return None,
        }
    }
    let rev = rev?;
    plan.expect.values().all(|e| *e < rev).then_some(rev)
}

/// Decode a stored JSON value at `key`.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    key: &[u8],
    bytes: &[u8],
) -> Result<T, PlanError> {
    serde_json::from_slice(bytes).map_err(|e| PlanError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        cause: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Mac;

    fn lease(m: u8, a: u8) -> Lease {
        Lease {
            mac: Mac([2, 0, 0, 0, 0, m]),
            ip: Ipv4Addr::new(10, 0, 0, a),
            hostname: None,
            state: LeaseState::Bound,
            expires_at_unix: 10,
            updated_at_unix: 1,
        }
    }

    fn group(changes: Vec<LeaseChange>, events: &[(&str, &str)]) -> LeaseCommit {
        LeaseCommit {
            writes: changes,
            events: events
                .iter()
                .map(|(node, kind)| NewEvent {
                    node: (*node).into(),
                    kind: (*kind).into(),
                    detail: String::new(),
                    at_unix_ms: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn an_address_seen_taken_is_compared_at_its_revision_and_its_mac_unindexed() {
        let keys = Keys::new("t");
        let old = lease(1, 5);
        let leases: View = [
            (
                keys.lease_ip(old.ip),
                (7, serde_json::to_vec(&old).unwrap()),
            ),
            (keys.lease_mac(old.mac), (7, b"10.0.0.5".to_vec())),
        ]
        .into_iter()
        .collect();
        let heads = View::new();
        let p = Planner {
            keys: &keys,
            leases: &leases,
            heads: &heads,
            max_ops: 128,
        };
        let plan = p
            .plan(&[group(
                vec![LeaseChange::Upsert(lease(2, 5))],
                &[("n", "a"), ("n", "a")],
            )])
            .unwrap();
        assert_eq!(plan.expect[&keys.lease_ip(old.ip)], 7);
        assert_eq!(plan.expect[&keys.lease_mac(old.mac)], 7);
        assert_eq!(plan.expect[&keys.lease_mac(lease(2, 5).mac)], 0);
        assert_eq!(plan.writes[&keys.lease_mac(old.mac)], None);
        // The repeated event folds into seq 1; its row and head are written once each.
        assert_eq!(plan.seqs, [1, 1]);
        assert_eq!(plan.expect[&keys.event_head("n")], 0);
        assert_eq!(plan.writes.len(), 5);
    }

    #[test]
    fn an_errored_commit_is_recognised_as_applied_only_by_all_of_its_writes() {
        let mut plan = Plan::default();
        plan.expect.insert(b"a".to_vec(), 5);
        plan.writes.insert(b"a".to_vec(), Some(b"1".to_vec()));
        plan.writes.insert(b"b".to_vec(), None);
        plan.writes.insert(b"c".to_vec(), Some(b"2".to_vec()));
        let now = |a: Option<(i64, &[u8])>, b, c: Option<(i64, &[u8])>| {
            let own = |x: Option<(i64, &[u8])>| x.map(|(r, v)| (r, v.to_vec()));
            vec![own(a), b, own(c)]
        };
        assert_eq!(
            applied(&plan, &now(Some((9, b"1")), None, Some((9, b"2")))),
            Some(9)
        );
        // Not written: the old value, a key still there, revisions that differ.
        assert_eq!(applied(&plan, &now(Some((5, b"0")), None, None)), None);
        let left = Some((3, b"x".to_vec()));
        assert_eq!(
            applied(&plan, &now(Some((9, b"1")), left, Some((9, b"2")))),
            None
        );
        assert_eq!(
            applied(&plan, &now(Some((9, b"1")), None, Some((8, b"2")))),
            None
        );
        // The same values at a revision not newer than the compared one: not this commit.
        assert_eq!(
            applied(&plan, &now(Some((5, b"1")), None, Some((5, b"2")))),
            None
        );
        let deletes_only = Plan {
            writes: [(b"b".to_vec(), None)].into_iter().collect(),
            ..Plan::default()
        };
        assert_eq!(applied(&deletes_only, &[None]), None);
    }

    #[test]
    fn groups_beyond_the_op_limit_go_to_the_next_transaction_whole() {
        let keys = Keys::new("t");
        let empty = View::new();
        let p = Planner {
            keys: &keys,
            leases: &empty,
            heads: &empty,
            max_ops: 5,
        };
        // Each group writes two keys (record and index): two groups fit, not three.
        let groups: Vec<_> = (1..=3)
            .map(|i| group(vec![LeaseChange::Upsert(lease(i, i))], &[]))
            .collect();
        let plan = p.plan(&groups).unwrap();
        assert_eq!((plan.groups, plan.writes.len()), (2, 4));
        let big = group(
            (1..=3).map(|i| LeaseChange::Upsert(lease(i, i))).collect(),
            &[],
        );
        assert!(matches!(
            p.plan(&[big]),
            Err(PlanError::TooLarge { ops: 6, max: 5 })
        ));
    }
}
