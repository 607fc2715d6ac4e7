//! The lease feed (issue 28 item 2): every change other appliances make under `leases/`,
//! delivered in revision order, so this appliance's compare view and its DHCP lease book
//! learn addresses a peer holds before offering them.
//!
//! etcd semantics relied on (etcd-io/etcd at v3.4.23):
//! - a watch created with `start_revision` replays every event from that revision on, in
//!   revision order, then follows live ones (`mvcc/watchable_store.go`, `watch`: `minRev`
//!   is the start revision; unsynced watchers catch up from the history in `syncWatchers`);
//! - a start revision already compacted cancels the watch with `compact_revision` set
//!   (`etcdserver/api/v3rpc/watch.go`: `canceled := wresp.CompactRevision != 0`): the feed
//!   then lists the prefix afresh at one revision and watches again from the one after it,
//!   turning the difference from what it knew into events (keys gone become deletes);
//! - a broken stream (an etcd member restarting, the connection cut) ends the watch; the
//!   feed watches again from the revision after the last one it delivered, so nothing is
//!   skipped or delivered twice;
//! - every key one transaction writes carries that transaction's revision
//!   (`mvcc/kvstore_txn.go`, `storeTxnWrite.put`), so this store's own commits echo back
//!   at exactly the revisions its view recorded for them: [`LeaseFilter`] drops an event
//!   whose key this store (or an earlier event) already holds at that revision or newer.
//!
//! The filter and the view merge are pure; the feed task is the adapter around the
//! client's watch stream, running on the store's runtime thread.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::EtcdStore;
use super::plan::View;
use crate::store::Lease;

/// Longest pause between attempts to watch again while etcd cannot be reached.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// One change of one lease key (a record or a MAC index entry) at a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEvent {
    /// The full key.
    pub(crate) key: Vec<u8>,
    /// The revision of the change (for a delete: the revision that deleted it).
    pub(crate) revision: i64,
    /// The new value; `None`: deleted.
    pub(crate) value: Option<Vec<u8>>,
}

/// What a lease key was last known as: its revision and whether it exists.
type Known = HashMap<Vec<u8>, (i64, bool)>;

/// Which events are news to this appliance: not its own commits echoed back, not changes
/// it already learned. Kept by the one lease committer; see the module doc.
#[derive(Debug, Default)]
pub struct LeaseFilter {
    forwarded: Known,
}

impl LeaseFilter {
    /// The events of `events` newer than what `view` (this store's compare view) and every
    /// event passed before hold for their key; a delete only for a key known to exist (a
    /// read that finds a key absent says nothing about a record being written right now).
    pub(crate) fn fresh(&mut self, view: &View, events: Vec<LeaseEvent>) -> Vec<LeaseEvent> {
        let mut out = Vec::new();
        for ev in events {
            let seen = self.forwarded.get(&ev.key).copied();
            let in_view = view.get(&ev.key).map(|(rev, _)| *rev);
            let newest = seen.map_or(0, |(r, _)| r).max(in_view.unwrap_or(0));
            if ev.revision <= newest {
                continue;
            }
            let exists = match seen {
                Some((r, present)) if r >= in_view.unwrap_or(0) => present,
                _ => in_view.is_some(),
            };
            if ev.value.is_none() && !exists {
                continue;
            }
            self.forwarded
                .insert(ev.key.clone(), (ev.revision, ev.value.is_some()));
            out.push(ev);
        }
        out
    }
}

/// Apply `events` to `view`, each only where it is newer than what the view holds.
pub(crate) fn merge(view: &mut View, events: &[LeaseEvent]) {
    for ev in events {
        let older = view.get(&ev.key).is_none_or(|(rev, _)| *rev < ev.revision);
        if !older {
            continue;
        }
        match &ev.value {
            Some(v) => {
                view.insert(ev.key.clone(), (ev.revision, v.clone()));
            }
            None => {
                view.remove(&ev.key);
            }
        }
    }
}

/// The events that turn `known` into a fresh listing (`kvs` at `revision`), and `known`
/// updated to it: keys new or changed become puts, keys gone become deletes at `revision`.
fn relist_diff(
    known: &mut Known,
    kvs: Vec<(Vec<u8>, i64, Vec<u8>)>,
    revision: i64,
) -> Vec<LeaseEvent> {
    let mut out = Vec::new();
    let mut present = std::collections::HashSet::new();
    for (key, rev, value) in kvs {
        present.insert(key.clone());
        if known.get(&key) != Some(&(rev, true)) {
            known.insert(key.clone(), (rev, true));
            out.push(LeaseEvent {
                key,
                revision: rev,
                value: Some(value),
            });
        }
    }
    for (key, (rev, exists)) in known.iter_mut() {
        if *exists && !present.contains(key) {
            *rev = revision;
            *exists = false;
            out.push(LeaseEvent {
                key: key.clone(),
                revision,
                value: None,
            });
        }
    }
    out
}

impl EtcdStore {
    /// The lease record an event is about: its address and new record (`None`: removed).
    /// `None` for MAC index keys, and for a record that does not decode (logged).
    pub(crate) fn lease_record(&self, ev: &LeaseEvent) -> Option<(Ipv4Addr, Option<Lease>)> {
        let prefix = self.keys.lease_ips();
        let hex = std::str::from_utf8(ev.key.strip_prefix(prefix.as_slice())?).ok()?;
        let ip = Ipv4Addr::from(u32::from_str_radix(hex, 16).ok()?);
        let Some(bytes) = &ev.value else {
            return Some((ip, None));
        };
        match serde_json::from_slice::<Lease>(bytes) {
            Ok(lease) if lease.ip == ip => Some((ip, Some(lease))),
            Ok(_) | Err(_) => {
                warn!(%ip, "a peer's lease record does not decode; ignored");
                None
            }
        }
    }

    /// The events of `events` that are news to this store (see [`LeaseFilter::fresh`]).
    pub(crate) fn fresh(
        &self,
        filter: &mut LeaseFilter,
        events: Vec<LeaseEvent>,
    ) -> Vec<LeaseEvent> {
        let view = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        filter.fresh(&view, events)
    }

    /// Let lease commits compare against `events` (peers' changes the caller's book has
    /// learned): from now on a commit of those keys is checked against the peer's revision.
    pub(crate) fn observe(&self, events: &[LeaseEvent]) {
        let mut view = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        merge(&mut view, events);
    }

    /// The lease keys `keys` as etcd has them now, as events at their revisions (absent
    /// keys as deletes at the read's revision): what a commit that conflicted on them
    /// learns without waiting for the feed.
    pub(crate) fn read_lease_keys(
        &self,
        keys: Vec<Vec<u8>>,
    ) -> crate::store::Result<Vec<LeaseEvent>> {
        use etcd_client::{Txn, TxnOp, TxnOpResponse};
        let mut out = Vec::new();
        for chunk in keys.chunks(self.max_ops) {
            let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let resp = self.call("read conflicting leases", ops, |mut c, ops| async move {
                c.txn(Txn::new().and_then(ops)).await
            })?;
            let revision = resp.header().map_or(0, |h| h.revision());
            for (key, r) in chunk.iter().zip(resp.op_responses()) {
                let kv = match r {
                    TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                    _ => None,
                };
                out.push(match kv {
                    Some(kv) => LeaseEvent {
                        key: key.clone(),
                        revision: kv.mod_revision(),
                        value: Some(kv.value().to_vec()),
                    },
                    None => LeaseEvent {
                        key: key.clone(),
                        revision,
                        value: None,
                    },
                });
            }
        }
        Ok(out)
    }

    /// The lease keys a commit group writes (record and MAC index), for
    /// [`Self::read_lease_keys`].
    pub(crate) fn lease_keys_of(&self, group: &crate::store::LeaseCommit) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        for w in &group.writes {
            match w {
                crate::store::LeaseChange::Upsert(l) => {
                    keys.push(self.keys.lease_ip(l.ip));
                    keys.push(self.keys.lease_mac(l.mac));
                }
                crate::store::LeaseChange::Remove(ip) => keys.push(self.keys.lease_ip(*ip)),
            }
        }
        keys
    }

    /// Start the lease feed on the store's runtime: batches of changes under `leases/`, in
    /// revision order, from a listing taken now (compared against this store's view) on,
    /// until `cancel` fires or the receiver is dropped. Pass each batch through
    /// [`Self::fresh`] before use: it also carries this store's own commits.
    pub fn lease_feed(
        &self,
        cancel: CancellationToken,
    ) -> mpsc::UnboundedReceiver<Vec<LeaseEvent>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let known: Known = {
            let view = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            view.iter()
                .map(|(k, (rev, _))| (k.clone(), (*rev, true)))
                .collect()
        };
        let feed = Feed {
            client: self.client.clone(),
            prefix: self.keys.leases(),
            known,
            tx,
            cancel,
        };
        self.bridge.handle.spawn(feed.run());
        rx
    }
}

/// The feed task's state: what it has delivered, and where to.
pub(super) struct Feed {
    client: Client,
    prefix: Vec<u8>,
    known: Known,
    tx: mpsc::UnboundedSender<Vec<LeaseEvent>>,
    cancel: CancellationToken,
}

impl Feed {
    /// A feed over `store` sending to `tx`, not started (tests drive its steps).
    #[cfg(test)]
    pub(super) fn for_test(store: &EtcdStore, tx: mpsc::UnboundedSender<Vec<LeaseEvent>>) -> Self {
        let known = {
            let view = store.leases.lock().unwrap_or_else(|p| p.into_inner());
            view.iter()
                .map(|(k, (rev, _))| (k.clone(), (*rev, true)))
                .collect()
        };
        Self {
            client: store.client.clone(),
            prefix: store.keys.leases(),
            known,
            tx,
            cancel: CancellationToken::new(),
        }
    }

    async fn run(mut self) {
        let mut backoff = Duration::from_millis(50);
        let mut rev = None;
        while !self.cancel.is_cancelled() && !self.tx.is_closed() {
            let from = match rev {
                Some(r) => r,
                None => match self.relist().await {
                    Ok(r) => r,
                    Err(e) => {
                        warn!(error = %e, "lease feed: cannot list leases; retrying");
                        self.pause(&mut backoff).await;
                        continue;
                    }
                },
            };
            match self.follow(from).await {
                Ok(Some(next)) => {
                    rev = Some(next);
                    backoff = Duration::from_millis(50);
                }
                Ok(None) => rev = None,
                Err(next) => {
                    rev = Some(next);
                    self.pause(&mut backoff).await;
                }
            }
        }
    }

    async fn pause(&self, backoff: &mut Duration) {
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            _ = tokio::time::sleep(*backoff) => {}
        }
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
    }

    /// List the prefix at one revision, deliver the difference from what is known, and
    /// return that revision.
    pub(super) async fn relist(&mut self) -> Result<i64, etcd_client::Error> {
        let end = super::keys::prefix_end(&self.prefix);
        let resp = self
            .client
            .get(self.prefix.clone(), Some(GetOptions::new().with_range(end)))
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let kvs = resp
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.mod_revision(), kv.value().to_vec()))
            .collect();
        let events = relist_diff(&mut self.known, kvs, revision);
        if !events.is_empty() {
            let _ = self.tx.send(events);
        }
        Ok(revision)
    }

    /// Watch from `from + 1` until the stream ends: `Ok(Some(rev))` when it ended cleanly
    /// (watch again after `rev`), `Ok(None)` when `from` was compacted (list again),
    /// `Err(rev)` when etcd could not be reached (pause, then watch again after `rev`).
    pub(super) async fn follow(&mut self, mut from: i64) -> Result<Option<i64>, i64> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from + 1)
            .with_progress_notify();
        let mut stream = match self.client.watch(self.prefix.clone(), Some(opts)).await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "lease feed: cannot watch; retrying");
                return Err(from);
            }
        };
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => return Ok(Some(from)),
                _ = self.tx.closed() => return Ok(Some(from)),
                m = stream.message() => m,
            };
            let resp = match msg {
                Ok(Some(resp)) => resp,
                Ok(None) => return Err(from),
                Err(e) => {
                    warn!(error = %e, "lease feed: watch stream broke; watching again");
                    return Err(from);
                }
            };
            if resp.compact_revision() > 0 {
                info!(
                    from,
                    compacted = resp.compact_revision(),
                    "lease feed: history compacted; listing afresh"
                );
                return Ok(None);
            }
            if resp.canceled() {
                return Err(from);
            }
            let mut events = Vec::new();
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let value = (ev.event_type() == EventType::Put).then(|| kv.value().to_vec());
                let revision = kv.mod_revision();
                self.known
                    .insert(kv.key().to_vec(), (revision, value.is_some()));
                from = from.max(revision);
                events.push(LeaseEvent {
                    key: kv.key().to_vec(),
                    revision,
                    value,
                });
            }
            if !events.is_empty() && self.tx.send(events).is_err() {
                return Ok(Some(from));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(key: &str, revision: i64, value: Option<&str>) -> LeaseEvent {
        LeaseEvent {
            key: key.as_bytes().to_vec(),
            revision,
            value: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    #[test]
    fn own_echoes_and_repeats_are_dropped_and_peers_changes_kept() {
        let mut view = View::new();
        view.insert(b"a".to_vec(), (10, b"own".to_vec()));
        let mut f = LeaseFilter::default();
        // Own commit at 10 echoed; a peer's change of b at 11; b again at 11 (re-listed).
        let out = f.fresh(
            &view,
            vec![ev("a", 10, Some("own")), ev("b", 11, Some("p"))],
        );
        assert_eq!(out, vec![ev("b", 11, Some("p"))]);
        assert!(f.fresh(&view, vec![ev("b", 11, Some("p"))]).is_empty());
        // A delete of a key never known to exist says nothing; of a known one, it is news.
        assert!(f.fresh(&view, vec![ev("c", 12, None)]).is_empty());
        assert_eq!(
            f.fresh(&view, vec![ev("b", 13, None)]),
            vec![ev("b", 13, None)]
        );
        assert_eq!(
            f.fresh(&view, vec![ev("a", 14, None)]),
            vec![ev("a", 14, None)]
        );
    }

    #[test]
    fn the_view_takes_only_newer_changes() {
        let mut view = View::new();
        view.insert(b"a".to_vec(), (10, b"own".to_vec()));
        merge(&mut view, &[ev("a", 9, Some("old")), ev("b", 3, Some("p"))]);
        assert_eq!(view[b"a".as_slice()], (10, b"own".to_vec()));
        assert_eq!(view[b"b".as_slice()], (3, b"p".to_vec()));
        merge(&mut view, &[ev("a", 11, None)]);
        assert!(!view.contains_key(b"a".as_slice()));
    }

    #[test]
    fn a_relisting_turns_what_changed_into_events() {
        let mut known: Known = [
            (b"a".to_vec(), (5, true)),
            (b"b".to_vec(), (6, true)),
            (b"gone".to_vec(), (7, true)),
        ]
        .into_iter()
        .collect();
        let kvs = vec![
            (b"a".to_vec(), 5, b"same".to_vec()),
            (b"b".to_vec(), 9, b"new".to_vec()),
            (b"c".to_vec(), 10, b"added".to_vec()),
        ];
        let mut out = relist_diff(&mut known, kvs, 12);
        out.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(
            out,
            vec![
                ev("b", 9, Some("new")),
                ev("c", 10, Some("added")),
                ev("gone", 12, None)
            ]
        );
        assert_eq!(known[b"gone".as_slice()], (12, false));
    }
}
