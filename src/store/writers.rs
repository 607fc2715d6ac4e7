//! The write side of the store: one typed handle per table, each made once, when an opened
//! store is split ([`super::RedbStore::split`]), and moved to the one component that owns the
//! table. Nothing else can write: the backend trait the handles call is private to `store`
//! (test builds excepted, so a test can put a double behind a handle), no handle is `Clone`,
//! and a state file opens once at a time (its lock), so it has one [`Writers`].
//!
//! | table | handle | owner |
//! |---|---|---|
//! | leases, lease_by_mac (+ the events announcing them) | [`LeaseWriter`] | the DHCP server |
//! | cluster_meta (ProxyDHCP bindings) | [`MetaWriter`] | the DHCP server (proxy path) |
//! | nodes, node_facts, node_lifecycle | [`NodeWriter`] | the provisioner, or the offline boot observer |
//! | events | [`EventWriter`] | the event bus |
//! | cluster_progress | [`ProgressWriter`] | the provisioner (cluster steps) |
//! | pull_tokens | [`TokenWriter`] | the pull-token writer (`http::tokens`) |
//! | rollouts | [`RolloutWriter`] | day two |

use std::sync::Arc;

use super::{
    CasOutcome, ClusterTable, Lease, LeaseChange, LeaseCommit, NewEvent, NodeRecord, NodeWrite,
    Result, Store,
};

/// What a backend does for the handles: every write, each one transaction. Implemented by
/// [`super::RedbStore`]; reachable from outside `store` only in test builds.
pub(crate) trait Backend: Store {
    /// See [`LeaseWriter::commit_leases`].
    fn commit_leases(&self, groups: &[LeaseCommit], durable: bool) -> Result<()>;

    /// Persist one lease record as it is, durably.
    fn put_lease(&self, lease: &Lease) -> Result<()> {
        self.commit_leases(
            &[LeaseCommit {
                writes: vec![LeaseChange::Upsert(lease.clone())],
                events: Vec::new(),
            }],
            true,
        )
    }

    /// See [`NodeWriter::put_node_states`].
    fn put_node_states(&self, writes: &[NodeWrite]) -> Result<()>;

    /// Insert or replace the record of `node.name`.
    fn put_node(&self, node: &NodeRecord) -> Result<()> {
        self.put_node_states(&[NodeWrite {
            name: node.name.clone(),
            record: Some(node.clone()),
            parts: Vec::new(),
        }])
    }

    /// See [`EventWriter::append_events`].
    fn append_events(&self, events: &[NewEvent]) -> Result<Vec<u64>>;

    /// See [`EventWriter::append_event`].
    fn append_event(&self, node: &str, kind: &str, detail: &str, at_unix_ms: u64) -> Result<u64> {
        let seqs = self.append_events(&[NewEvent {
            node: node.to_owned(),
            kind: kind.to_owned(),
            detail: detail.to_owned(),
            at_unix_ms,
        }])?;
        Ok(seqs.first().copied().unwrap_or(0))
    }

    /// Store every `(key, value)` in `cluster_meta`, all in one transaction.
    fn put_metas(&self, entries: &[(String, Vec<u8>)]) -> Result<()>;

    /// Store `value` under `key` in `cluster_meta`.
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<()> {
        self.put_metas(&[(key.to_owned(), value.to_vec())])
    }

    /// Atomically store `new` under `key` in `cluster_meta` only if the current value equals
    /// `expected` (`None`: only if the key is absent). Nothing owns `cluster_meta` CAS
    /// today; the store's own tests keep its semantics pinned.
    #[cfg(test)]
    fn compare_and_set_meta(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<CasOutcome>;

    /// Store every `(key, value)` in `table`, all in one durable transaction (an older
    /// build's row under the same key is removed with it).
    fn put_rows(&self, table: ClusterTable, entries: &[(String, Vec<u8>)]) -> Result<()>;

    /// [`Backend::put_rows`] of one row.
    fn put_row(&self, table: ClusterTable, key: &str, value: &[u8]) -> Result<()> {
        self.put_rows(table, &[(key.to_owned(), value.to_vec())])
    }

    /// Atomically store `new` as row `key` of `table` only if its current value (an older
    /// build's row counts) equals `expected` (`None`: only if there is none).
    fn compare_and_set_row(
        &self,
        table: ClusterTable,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<CasOutcome>;

    /// Replace the record of a rollout, durably.
    fn put_rollout(&self, key: &str, value: &[u8]) -> Result<()>;
}

/// Every write handle of one opened store, to be moved to their owners (see the module doc).
pub struct Writers {
    /// Leases, for the DHCP server.
    pub leases: LeaseWriter,
    /// ProxyDHCP bindings in `cluster_meta`, for the DHCP server's proxy path.
    pub meta: MetaWriter,
    /// Node records and parts, for the provisioner or (without one) the offline observer.
    pub nodes: NodeWriter,
    /// Node timelines, for the event bus.
    pub events: EventWriter,
    /// Cluster progress, for the provisioner.
    pub progress: ProgressWriter,
    /// Pull-delivery tokens, for the token writer.
    pub tokens: TokenWriter,
    /// Day-two rollout records, for day two.
    pub rollouts: RolloutWriter,
}

impl Writers {
    /// The one set of handles over `backend` (called once per opened store).
    pub(super) fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            leases: LeaseWriter(backend.clone()),
            meta: MetaWriter(backend.clone()),
            nodes: NodeWriter(backend.clone()),
            events: EventWriter(backend.clone()),
            progress: ProgressWriter(backend.clone()),
            tokens: TokenWriter(backend.clone()),
            rollouts: RolloutWriter(backend),
        }
    }

    /// Handles over a test double of the backend.
    #[cfg(test)]
    pub(crate) fn over(backend: Arc<dyn Backend>) -> Self {
        Self::new(backend)
    }
}

impl std::fmt::Debug for Writers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writers").finish_non_exhaustive()
    }
}

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name(Arc<dyn Backend>);

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($name))
            }
        }
    };
}

handle!(
    /// The one writer of the lease tables (the DHCP server).
    LeaseWriter
);

impl LeaseWriter {
    /// Persist the lease book's changes and their events in one transaction: the DHCP
    /// server's group commit, so a lease change and the timeline rows that announce it are
    /// written together and the DHCP path takes redb's single write slot once per burst
    /// instead of twice. The changes are written as they are: the lease rules (who may hold
    /// which address, one lease per MAC) belong to [`crate::dhcp::LeaseBook`], which decided
    /// them; the store checks none and keeps its by-MAC lookup equal to the records.
    ///
    /// With `durable` false the commit is not synced to disk (the one exception to the
    /// store's durability rule): it becomes durable with the next durable commit, and a crash
    /// before that loses it. The DHCP server uses this only for changes no reply promises to
    /// be durable (offers, expiry sweeps), as Kea does not store a lease for a DHCPOFFER.
    pub fn commit_leases(&self, groups: &[LeaseCommit], durable: bool) -> Result<()> {
        self.0.commit_leases(groups, durable)
    }

    /// Persist one record as it is, durably (tests and tools that seed a state directory;
    /// the DHCP server restores it through its book, which drops what the rules forbid).
    pub fn put_lease(&self, lease: &Lease) -> Result<()> {
        self.0.put_lease(lease)
    }
}

handle!(
    /// The one writer of node records and parts: the provisioner, or the offline boot
    /// observer when no provisioner runs (the composition root picks one).
    NodeWriter
);

impl NodeWriter {
    /// Writes several nodes' records and parts in one durable transaction (one fsync for
    /// the lot: the provisioner commits a burst of state changes together).
    pub(crate) fn put_node_states(&self, writes: &[NodeWrite]) -> Result<()> {
        self.0.put_node_states(writes)
    }

    /// Insert or replace the record of `node.name`.
    pub fn put_node(&self, node: &NodeRecord) -> Result<()> {
        self.0.put_node(node)
    }
}

handle!(
    /// The one writer of node timelines besides the lease commit's events (the event bus).
    EventWriter
);

impl EventWriter {
    /// Append an event to `node`'s timeline and return its sequence number.
    ///
    /// The number is assigned inside the write transaction: 1 for a node's first event, then
    /// one more than the last, so numbers are gap-free and survive restarts.
    pub fn append_event(
        &self,
        node: &str,
        kind: &str,
        detail: &str,
        at_unix_ms: u64,
    ) -> Result<u64> {
        self.0.append_event(node, kind, detail, at_unix_ms)
    }

    /// Append several events in one durable transaction (in order); returns their sequence
    /// numbers. Used by the event bus to write a burst with one fsync.
    pub(crate) fn append_events(&self, events: &[NewEvent]) -> Result<Vec<u64>> {
        self.0.append_events(events)
    }
}

handle!(
    /// The one writer of `cluster_meta`'s own keys: ProxyDHCP bindings (the DHCP server).
    MetaWriter
);

impl MetaWriter {
    /// Store `value` under `key`, replacing any previous value, durably.
    pub(crate) fn put_meta(&self, key: &str, value: &[u8]) -> Result<()> {
        self.0.put_meta(key, value)
    }
}

handle!(
    /// The one writer of cluster progress ([`ClusterTable::Progress`]): the provisioner.
    ProgressWriter
);

impl ProgressWriter {
    /// Store every `(key, value)`, all in one durable transaction.
    pub(crate) fn put_rows(&self, entries: &[(String, Vec<u8>)]) -> Result<()> {
        self.0.put_rows(ClusterTable::Progress, entries)
    }

    /// [`ProgressWriter::put_rows`] of one row.
    pub fn put_row(&self, key: &str, value: &[u8]) -> Result<()> {
        self.0.put_row(ClusterTable::Progress, key, value)
    }

    /// Atomically store `new` as row `key` only if its current value (an older build's row
    /// counts) equals `expected` (`None`: only if there is none). This is how a
    /// non-repeatable step records its intent exactly once.
    pub(crate) fn compare_and_set_row(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<CasOutcome> {
        self.0
            .compare_and_set_row(ClusterTable::Progress, key, expected, new)
    }
}

handle!(
    /// The one writer of pull-delivery tokens ([`ClusterTable::PullTokens`]): the token
    /// writer of `http::tokens`.
    TokenWriter
);

impl TokenWriter {
    /// Store every `(key, value)`, all in one durable transaction.
    pub(crate) fn put_rows(&self, entries: &[(String, Vec<u8>)]) -> Result<()> {
        self.0.put_rows(ClusterTable::PullTokens, entries)
    }
}

handle!(
    /// The one writer of day-two rollout records (day two).
    RolloutWriter
);

impl RolloutWriter {
    /// The stored record of rollout `key`: a run resumes from what it wrote (the same read
    /// as [`Store::rollout`], so a run needs only its writer).
    pub fn rollout(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.0.rollout(key)
    }

    /// Replace the record of a rollout, durably (a resumed run trusts it).
    pub(crate) fn put_rollout(&self, key: &str, value: &[u8]) -> Result<()> {
        self.0.put_rollout(key, value)
    }
}
