//! The state store: everything talboot must remember across restarts.
//!
//! Leases, node records, each node's append-only event timeline and a small key/value space for
//! cluster progress are read through the [`Store`] trait, which every component may hold, and
//! written through [`Writers`]: one typed handle per table, each moved to the table's one owner
//! when the store is opened ([`RedbStore::split`]), so a second writer of a table does not
//! compile. The default backend, [`RedbStore`], keeps them in one redb file, `talboot.redb`,
//! under the state directory.
//!
//! Guarantees every backend gives:
//! - every mutating call is one transaction, durable when the call returns, so a caller may
//!   acknowledge the side effect it records right after;
//! - the store never resets or overwrites a file it cannot read: a newer schema, a foreign or
//!   damaged file, or a file locked by another process are refused with an error that names the
//!   file and says what to do;
//! - timestamps are arguments; the store never reads a clock.
//!
//! Reads and writes are synchronous (redb is); async callers wrap calls in `spawn_blocking`.

mod etcd;
mod node_parts;
mod records;
mod redb;
mod steps;
#[cfg(test)]
mod suite;
mod writers;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

pub use self::etcd::health as etcd_health;
#[cfg(test)]
pub(crate) use self::etcd::testing as etcd_testing;
pub use self::etcd::{
    EtcdConfig, EtcdStore, LeaseEvent, LeaseFilter, MEMBER_TTL, Member, Membership, migrate,
};
pub(crate) use self::etcd::{election, fence};
pub(crate) use self::node_parts::decode_lifecycle;
pub use self::node_parts::{DiskFacts, Lifecycle, NodeFacts};
pub use self::records::{CasOutcome, Event, Lease, LeaseChange, LeaseState, NodePhase, NodeRecord};
pub use self::redb::{Closed, RedbStore};
pub(crate) use self::steps::load_step_record;
pub use self::steps::{CLUSTER_TIMELINE, ClusterStep, STEP_KEY, StepRecord};
#[cfg(test)]
pub(crate) use self::writers::Backend;
pub use self::writers::{
    EventWriter, LeaseWriter, MetaWriter, NodeWriter, ProgressWriter, RolloutWriter, TokenWriter,
    Writers,
};

/// An event to append, for [`EventWriter::append_events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Timeline (node) it belongs to.
    pub node: String,
    /// Machine-readable kind.
    pub kind: String,
    /// Human-readable detail.
    pub detail: String,
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// A typed per-node table besides the node record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodePart {
    /// Hardware facts read in maintenance mode ([`NodeFacts`]).
    Facts,
    /// What the node machine remembers besides the phase ([`Lifecycle`]).
    Lifecycle,
}

impl NodePart {
    /// Where a build before the typed tables kept it in `cluster_meta`.
    pub(crate) fn legacy_key(self, node: &str) -> String {
        match self {
            Self::Facts => format!("node/{node}/facts"),
            Self::Lifecycle => format!("node/{node}/lifecycle"),
        }
    }
}

/// A typed cluster-wide table (rows by key) besides the node tables: what used to be bytes
/// under prefixed keys in `cluster_meta`. Rows an older build left there are still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterTable {
    /// Cluster progress (`provision::cluster`, `provision::steps`): the bootstrap node, the
    /// bootstrap and kubeconfig marks, the step record ([`StepRecord`]).
    Progress,
    /// Pull-delivery tokens (`http::tokens`), by the SHA-256 of the token.
    PullTokens,
}

impl ClusterTable {
    /// Where a build before the typed tables kept row `key` in `cluster_meta`.
    pub(crate) fn legacy_key(self, key: &str) -> String {
        match self {
            Self::Progress => format!("cluster/{key}"),
            Self::PullTokens => format!("token/{key}"),
        }
    }
}

/// One node's state change, for [`NodeWriter::put_node_states`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeWrite {
    /// The node.
    pub name: String,
    /// Its record, when it changed.
    pub record: Option<NodeRecord>,
    /// Its parts that changed (JSON).
    pub(crate) parts: Vec<(NodePart, Vec<u8>)>,
}

/// One DHCP decision's lease changes (as the lease book decided them) and the timeline
/// events that announce it, for [`LeaseWriter::commit_leases`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseCommit {
    /// The book's changes, applied in order.
    pub writes: Vec<LeaseChange>,
    /// Events appended with them.
    pub events: Vec<NewEvent>,
}

use crate::inventory::Mac;

/// Default state directory (`--state-dir`).
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/talboot";

/// File name of the redb database inside the state directory.
pub(crate) const STORE_FILE_NAME: &str = "talboot.redb";

/// Schema version this build writes and understands.
pub(crate) const SCHEMA_VERSION: u64 = 1;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The state directory could not be created or inspected.
    #[error(
        "cannot create state directory {}: {source}; create it (mode 0700) or pass another --state-dir",
        dir.display()
    )]
    StateDir {
        /// The directory.
        dir: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },

    /// The database file could not be opened or created.
    #[error(
        "cannot open state file {}: {source}; check that it is readable and writable by the user talboot runs as",
        file.display()
    )]
    Io {
        /// The file.
        file: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },

    /// Another process holds the database lock.
    #[error(
        "state file {} is locked by another process; is another talboot running? \
         stop it, or point this one at a different --state-dir",
        file.display()
    )]
    Locked {
        /// The file.
        file: PathBuf,
    },

    /// The file was written by a newer talboot with a schema this build does not know.
    #[error(
        "state file {} has schema version {found}, but this talboot supports up to {supported}; \
         upgrade talboot to a release that supports schema {found} (its contents were not changed)",
        file.display()
    )]
    SchemaTooNew {
        /// The file.
        file: PathBuf,
        /// Version stored in the file.
        found: u64,
        /// Highest version this build supports.
        supported: u64,
    },

    /// The file is not a talboot state database, or it is damaged.
    #[error(
        "state file {} is not a valid talboot state database ({cause}); it was left untouched. \
         Restore it from a backup, or move it aside to start with an empty state",
        file.display()
    )]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// What was wrong.
        cause: String,
    },

    /// A record could not be encoded for storage.
    #[error("cannot encode {what} for the state store: {source}")]
    Encode {
        /// Which record.
        what: String,
        /// Underlying error.
        source: serde_json::Error,
    },

    /// An etcd request failed (connection refused, TLS refused, an error status, ...).
    #[error(
        "etcd at {endpoints}: {op} failed: {source}; check that etcd runs there and is reachable"
    )]
    Etcd {
        /// The endpoints the store talks to.
        endpoints: String,
        /// What the store was doing.
        op: &'static str,
        /// Underlying client error.
        source: Box<etcd_client::Error>,
    },

    /// An etcd request did not complete in time (no quorum, or nothing answers).
    #[error(
        "etcd at {endpoints}: {op} did not complete within {after:?}; is etcd up and does it have quorum?"
    )]
    EtcdTimeout {
        /// The endpoints the store talks to.
        endpoints: String,
        /// What the store was doing.
        op: &'static str,
        /// The timeout.
        after: std::time::Duration,
    },

    /// A lease key changed in etcd since this store last saw it (another appliance wrote
    /// it): nothing of the commit was written.
    #[error(
        "etcd at {endpoints}: {key} was changed by another writer since this appliance read it; \
         the lease commit was not written"
    )]
    EtcdConflict {
        /// The endpoints the store talks to.
        endpoints: String,
        /// The first key that changed.
        key: String,
        /// How many of the commit's groups, from the first, were committed in earlier
        /// transactions before the one that conflicted (a commit too large for one
        /// transaction is split between groups); none of the rest were.
        committed: usize,
    },

    /// A value under the store's prefix is not what talboot writes, or a write needs more
    /// than one transaction may carry.
    #[error("etcd at {endpoints}: {key}: {cause}; it was left untouched")]
    EtcdData {
        /// The endpoints the store talks to.
        endpoints: String,
        /// The key (or prefix).
        key: String,
        /// What was wrong.
        cause: String,
    },

    /// The etcd store's configuration cannot be used (a TLS file unreadable, no endpoint).
    #[error("etcd store configuration: {cause}")]
    EtcdConfig {
        /// What was wrong.
        cause: String,
    },

    /// Any other failure of the storage engine (disk full, I/O error during a commit, ...).
    #[error("state file {}: storage error: {source}", file.display())]
    Backend {
        /// The file.
        file: PathBuf,
        /// Underlying redb error.
        source: Box<::redb::Error>,
    },

    /// Opening the etcd store failed before any data was read: nothing listens, TLS was
    /// refused either way, or no quorum answered; `fix` names the flag to look at.
    #[error("etcd at {endpoints}: {cause}; {fix}")]
    EtcdUnreachable {
        /// The endpoints the store talks to.
        endpoints: String,
        /// What happened.
        cause: String,
        /// What to check, naming the flags.
        fix: &'static str,
    },

    /// A write only the leader may make, refused because this appliance does not lead (never
    /// won, or its leadership ended): nothing was written.
    #[error(
        "etcd at {endpoints}: {op} refused: this appliance is not the leader \
         (its leadership was never won or has ended); nothing was written"
    )]
    Fenced {
        /// The endpoints the store talks to.
        endpoints: String,
        /// What the store was doing.
        op: &'static str,
    },
}

/// Shorthand for store results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Persistent state of a talboot instance, read side: what every component but a table's
/// owner holds (as `Arc<dyn Store>`). Writes go through the typed handles of [`Writers`], one
/// per table, each held by the table's one owner; every write is one transaction, durable when
/// it returns.
pub trait Store: Send + Sync {
    /// The current lease of `mac` (never a `Declined` quarantine record).
    fn lease(&self, mac: Mac) -> Result<Option<Lease>>;

    /// The record occupying `ip`, whatever its state (including `Declined` quarantine).
    fn lease_by_ip(&self, ip: Ipv4Addr) -> Result<Option<Lease>>;

    /// Every lease record, ordered by address.
    fn leases(&self) -> Result<Vec<Lease>>;

    /// The record of node `name`.
    fn node(&self, name: &str) -> Result<Option<NodeRecord>>;

    /// Every node record, ordered by name.
    fn nodes(&self) -> Result<Vec<NodeRecord>>;

    /// Node `name`'s `part` (JSON), from its own table (or where an older build kept it).
    fn node_part(&self, name: &str, part: NodePart) -> Result<Option<Vec<u8>>>;

    /// Up to `limit` events of `node` with `seq > since_seq`, oldest first. Pass the last seen
    /// `seq` to poll for new events; 0 for the whole timeline.
    fn events(&self, node: &str, since_seq: u64, limit: usize) -> Result<Vec<Event>>;

    /// The newest event of `node`.
    fn last_event(&self, node: &str) -> Result<Option<Event>>;

    /// Value stored under `key` in the cluster progress space.
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Row `key` of `table` (or where an older build kept it in `cluster_meta`).
    fn row(&self, table: ClusterTable, key: &str) -> Result<Option<Vec<u8>>>;

    /// The stored record of a day-two rollout (`apply/<plan>`, `upgrade-talos/<version>`, ...).
    fn rollout(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Keys of every stored rollout, in key order.
    fn rollout_keys(&self) -> Result<Vec<String>>;

    /// A consistent JSON snapshot of everything stored, for backups and debugging.
    fn export_json(&self) -> Result<serde_json::Value>;

    /// Right after this store committed lease changes: the lease of each of `macs` and the
    /// MAC occupying each of `ips`, for the in-memory view's refresh. The embedded store reads
    /// them (a read is a memory lookup); a networked store answers from the lease keys its
    /// own commits and its lease feed keep ([`EtcdStore`]), which hold every key its last
    /// commit wrote: a round trip per key there cost more than the commit itself.
    fn settled_leases(&self, macs: &[Mac], ips: &[Ipv4Addr]) -> Result<SettledLeases> {
        let mut settled = SettledLeases::default();
        for &mac in macs {
            if let Some(l) = self.lease(mac)? {
                settled.leases.push(l);
            }
        }
        for &ip in ips {
            if let Some(l) = self.lease_by_ip(ip)? {
                settled.holders.push((ip, l.mac));
            }
        }
        Ok(settled)
    }
}

/// What [`Store::settled_leases`] answers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SettledLeases {
    /// The current lease of each MAC asked about that has one.
    pub leases: Vec<Lease>,
    /// The MAC of the record occupying each address asked about that is occupied.
    pub holders: Vec<(Ipv4Addr, Mac)>,
}

/// A shared reader reads as what it shares.
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn lease(&self, mac: Mac) -> Result<Option<Lease>> {
        (**self).lease(mac)
    }

    fn lease_by_ip(&self, ip: Ipv4Addr) -> Result<Option<Lease>> {
        (**self).lease_by_ip(ip)
    }

    fn leases(&self) -> Result<Vec<Lease>> {
        (**self).leases()
    }

    fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        (**self).node(name)
    }

    fn nodes(&self) -> Result<Vec<NodeRecord>> {
        (**self).nodes()
    }

    fn node_part(&self, name: &str, part: NodePart) -> Result<Option<Vec<u8>>> {
        (**self).node_part(name, part)
    }

    fn events(&self, node: &str, since_seq: u64, limit: usize) -> Result<Vec<Event>> {
        (**self).events(node, since_seq, limit)
    }

    fn last_event(&self, node: &str) -> Result<Option<Event>> {
        (**self).last_event(node)
    }

    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        (**self).get_meta(key)
    }

    fn row(&self, table: ClusterTable, key: &str) -> Result<Option<Vec<u8>>> {
        (**self).row(table, key)
    }

    fn rollout(&self, key: &str) -> Result<Option<Vec<u8>>> {
        (**self).rollout(key)
    }

    fn rollout_keys(&self) -> Result<Vec<String>> {
        (**self).rollout_keys()
    }

    fn export_json(&self) -> Result<serde_json::Value> {
        (**self).export_json()
    }
}

/// Path of the database file inside `state_dir`.
pub(crate) fn store_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STORE_FILE_NAME)
}

/// Which backend holds the state: the embedded redb file (the default) or a shared etcd
/// (`serve --store etcd://...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// `talboot.redb` in this state directory.
    Redb(PathBuf),
    /// The keys under `/talboot/<cluster>/` in this etcd.
    Etcd(EtcdConfig),
}

/// An opened store, split into its shared reader and its one set of writers.
pub struct Opened {
    /// The read side every component may hold.
    pub store: std::sync::Arc<dyn Store>,
    /// One writer per table, to be moved to each table's owner.
    pub writers: Writers,
    /// Resolves once the store is closed (the redb file lock released).
    pub closed: Closed,
    /// The etcd backend itself, for the HA parts that need more than the store traits
    /// (membership, election, watches); `None` on redb.
    pub etcd: Option<std::sync::Arc<EtcdStore>>,
}

impl StoreSpec {
    /// Open the store this names (see [`open`] and [`EtcdStore::open`]).
    pub fn open(&self) -> Result<Opened> {
        match self {
            Self::Redb(dir) => {
                let mut opened = open(dir)?;
                let closed = opened.on_close();
                let (store, writers) = opened.split();
                Ok(Opened {
                    store,
                    writers,
                    closed,
                    etcd: None,
                })
            }
            Self::Etcd(cfg) => {
                let mut opened = EtcdStore::open(cfg)?;
                let closed = opened.on_close();
                let (store, writers) = opened.split();
                Ok(Opened {
                    store: store.clone(),
                    writers,
                    closed,
                    etcd: Some(store),
                })
            }
        }
    }
}

/// Open (or create) the default store in `state_dir`.
///
/// Creates the directory with mode 0700 if it is missing and initialises a new database if
/// the file is missing or empty. Refuses, without modifying it, a file it cannot use.
/// [`RedbStore::split`] turns it into the shared reader and the one set of [`Writers`].
pub fn open(state_dir: &Path) -> Result<RedbStore> {
    RedbStore::open(state_dir)
}
