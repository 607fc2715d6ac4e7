//! The embedded [`Store`] backend: one redb file, `talboot.redb`, in the state directory.
//!
//! Layout (schema version 1):
//! - `meta`: `&str -> u64`, holds `schema_version`; written once when the file is created;
//! - `leases`: IPv4 address (`u32`) -> JSON [`Lease`]. Keyed by address so that one address
//!   has exactly one record and a `Declined` quarantine blocks it whoever declined it;
//! - `lease_by_mac`: MAC -> address of that MAC's current (non-declined) lease: the lease
//!   book's index written down, following the records it is given (no rule of its own);
//! - `nodes`: node name -> JSON [`NodeRecord`];
//! - `events`: `(node, seq)` -> JSON [`Event`], so one node's timeline is one key range;
//! - `cluster_meta`: `&str -> bytes`, the small key/value space behind `get_meta`.
//!
//! Every mutating method is exactly one write transaction committed with
//! [`Durability::Immediate`], so the change is on disk when the method returns; the one
//! exception is [`LeaseWriter::commit_leases`](super::LeaseWriter::commit_leases) called with `durable: false` (see there).
//!
//! The file is opened with redb's integrity check: every page checksum is verified before the
//! store is used, so damage done outside redb is refused as [`StoreError::Corrupt`] (the file
//! left as it was) instead of being trusted, and an unclean shutdown is recovered by redb's
//! normal repair. The check reads the whole file, which is cheap at the sizes talboot keeps.

use std::fmt;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::redb::{
    Builder, Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable,
    TableDefinition, TableHandle, WriteTransaction,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tracing::{info, warn};

use super::writers::Backend;
use super::{
    CasOutcome, ClusterTable, Event, Lease, LeaseChange, LeaseCommit, LeaseState, NewEvent,
    NodePart, NodeRecord, NodeWrite, Result, SCHEMA_VERSION, Store, StoreError, Writers,
    store_path,
};
use crate::inventory::Mac;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LEASES: TableDefinition<u32, &[u8]> = TableDefinition::new("leases");
const LEASE_BY_MAC: TableDefinition<[u8; 6], u32> = TableDefinition::new("lease_by_mac");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");
const CLUSTER_META: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster_meta");
/// Node hardware facts (JSON), by node name. Added within schema 1: a file without it gets
/// it on open, and rows still under `cluster_meta`'s `node/<name>/facts` are read from there.
const NODE_FACTS: TableDefinition<&str, &[u8]> = TableDefinition::new("node_facts");
/// Node lifecycle (JSON), by node name; like [`NODE_FACTS`].
const NODE_LIFECYCLE: TableDefinition<&str, &[u8]> = TableDefinition::new("node_lifecycle");
/// Day-two rollouts (`talboot apply`, `talboot upgrade`): key `kind/id`, value the JSON of a
/// `daytwo::rollout::RolloutRecord`, so a restarted run resumes where it stopped.
const ROLLOUTS: TableDefinition<&str, &[u8]> = TableDefinition::new("rollouts");

/// Cluster progress rows, by key ([`ClusterTable::Progress`]); added within schema 1 like
/// [`NODE_FACTS`], with older rows read from `cluster_meta`'s `cluster/<key>`.
const CLUSTER_PROGRESS: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster_progress");
/// Pull-delivery tokens (JSON) by the hex SHA-256 of the token ([`ClusterTable::PullTokens`]);
/// older rows are read from `cluster_meta`'s `token/<sha256>`.
const PULL_TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("pull_tokens");

fn cluster_table(table: ClusterTable) -> TableDefinition<'static, &'static str, &'static [u8]> {
    match table {
        ClusterTable::Progress => CLUSTER_PROGRESS,
        ClusterTable::PullTokens => PULL_TOKENS,
    }
}

fn part_table(part: NodePart) -> TableDefinition<'static, &'static str, &'static [u8]> {
    match part {
        NodePart::Facts => NODE_FACTS,
        NodePart::Lifecycle => NODE_LIFECYCLE,
    }
}

/// Key of the schema version in the `meta` table.
const SCHEMA_KEY: &str = "schema_version";

/// Every table of schema version 1; a file of that version missing one is damaged.
const TABLE_NAMES: [&str; 6] = [
    "meta",
    "leases",
    "lease_by_mac",
    "nodes",
    "events",
    "cluster_meta",
];

/// Page cache limit. The state is kilobytes to a few megabytes; redb's 1 GiB default is far
/// more than it can use.
const CACHE_BYTES: usize = 32 * 1024 * 1024;

/// [`Store`] backed by a redb database file.
pub struct RedbStore {
    db: Database,
    path: PathBuf,
    /// Dropped after `db` (fields drop in declaration order), so its receiver, a
    /// [`Closed`], resolves only once the file and its lock are released.
    closing: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Resolves once the store it came from ([`RedbStore::on_close`]) is closed: the last
/// reference is gone and the file lock released, so the state directory can be opened again.
#[derive(Debug)]
pub struct Closed(pub(super) tokio::sync::oneshot::Receiver<()>);

impl std::future::Future for Closed {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        // Nothing is ever sent: the sender going away with the store is the signal.
        std::pin::Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RedbStore {
    /// A future that resolves when this store is closed (see [`Closed`]). Asking again
    /// replaces the earlier one, which then resolves at once.
    pub(crate) fn on_close(&mut self) -> Closed {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.closing = Some(tx);
        Closed(rx)
    }

    /// Open (or create) `talboot.redb` in `state_dir`; see [`super::open`].
    pub fn open(state_dir: &Path) -> Result<Self> {
        ensure_state_dir(state_dir)?;
        let path = store_path(state_dir);

        // Create the file ourselves so that it starts 0600; redb would create it with the
        // umask default. An existing file is not touched here.
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(StoreError::Io { file: path, source }),
        }

        // `create` initialises an empty file and opens a redb file; anything else fails the
        // magic-number check before a byte is written. The integrity check verifies every
        // page's checksum on open, so a file damaged outside redb is reported as corrupt
        // instead of being trusted.
        let db = Builder::new()
            .set_cache_size(CACHE_BYTES)
            .set_check_integrity_on_open(true)
            .create(&path)
            .map_err(|e| classify(&path, e.into()))?;

        let store = Self {
            db,
            path,
            closing: None,
        };
        store.check_schema()?;
        Ok(store)
    }

    /// The shared reader and the one set of write handles of this store (the only way to
    /// write it: see [`Writers`]). The file stays open until the reader and every handle are
    /// gone.
    pub fn split(self) -> (Arc<Self>, Writers) {
        let store = Arc::new(self);
        let writers = Writers::new(store.clone());
        (store, writers)
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Verify the schema of an existing file, or initialise a new one.
    fn check_schema(&self) -> Result<()> {
        let txn = self.read_txn()?;
        let tables: Vec<String> = txn
            .list_tables()
            .map_err(|e| self.err(e))?
            .map(|t| t.name().to_string())
            .collect();

        if tables.is_empty() {
            drop(txn);
            return self.create_schema();
        }
        let found = self.schema_version(&txn, &tables)?;
        // Tables added within schema 1 are created when missing (older files lack them).
        if [
            "node_facts",
            "node_lifecycle",
            "cluster_progress",
            "pull_tokens",
            "rollouts",
        ]
        .iter()
        .any(|n| !tables.iter().any(|t| t == *n))
        {
            drop(txn);
            self.add_tables_of_schema_1()?;
        }
        info!(file = %self.path.display(), schema = found, "opened state store");
        Ok(())
    }

    /// A new file gets the schema version and every table at once, so that readers never
    /// meet a missing table.
    fn create_schema(&self) -> Result<()> {
        self.write(|txn| {
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            meta.insert(SCHEMA_KEY, SCHEMA_VERSION)
                .map_err(|e| self.err(e))?;
            // Create every table now so that readers never meet a missing one.
            txn.open_table(LEASES).map_err(|e| self.err(e))?;
            txn.open_table(LEASE_BY_MAC).map_err(|e| self.err(e))?;
            txn.open_table(NODES).map_err(|e| self.err(e))?;
            txn.open_table(EVENTS).map_err(|e| self.err(e))?;
            txn.open_table(CLUSTER_META).map_err(|e| self.err(e))?;
            txn.open_table(NODE_FACTS).map_err(|e| self.err(e))?;
            txn.open_table(NODE_LIFECYCLE).map_err(|e| self.err(e))?;
            txn.open_table(CLUSTER_PROGRESS).map_err(|e| self.err(e))?;
            txn.open_table(PULL_TOKENS).map_err(|e| self.err(e))?;
            txn.open_table(ROLLOUTS).map_err(|e| self.err(e))?;
            Ok(())
        })?;
        info!(file = %self.path.display(), schema = SCHEMA_VERSION, "created state store");
        Ok(())
    }

    /// The schema version of an existing file with `tables`, refusing a file talboot did not
    /// write, one newer than this build, and one missing a table its version requires: such a
    /// file is left as it is rather than written by rules it does not follow.
    fn schema_version(&self, txn: &ReadTransaction, tables: &[String]) -> Result<u64> {
        if !tables.iter().any(|t| t == "meta") {
            return Err(self.corrupt(format!(
                "it has tables {tables:?} but no `meta` table, so it was not written by talboot"
            )));
        }
        let found = txn
            .open_table(META)
            .map_err(|e| self.err(e))?
            .get(SCHEMA_KEY)
            .map_err(|e| self.err(e))?
            .map(|g| g.value())
            .ok_or_else(|| self.corrupt("the `meta` table has no schema_version".into()))?;

        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                file: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        // Version 1 is the first; when version 2 exists, its migration from 1 runs here.
        if found < SCHEMA_VERSION {
            return Err(self.corrupt(format!("schema version {found} does not exist")));
        }
        if let Some(missing) = TABLE_NAMES.iter().find(|n| !tables.iter().any(|t| t == *n)) {
            return Err(self.corrupt(format!(
                "schema version {found} requires table `{missing}`, which is missing"
            )));
        }
        Ok(found)
    }

    /// Files written before these tables existed get them (empty) on open, so readers never
    /// meet a missing one; creating a table that exists changes nothing.
    fn add_tables_of_schema_1(&self) -> Result<()> {
        self.write(|txn| {
            txn.open_table(NODE_FACTS).map_err(|e| self.err(e))?;
            txn.open_table(NODE_LIFECYCLE).map_err(|e| self.err(e))?;
            txn.open_table(CLUSTER_PROGRESS).map_err(|e| self.err(e))?;
            txn.open_table(PULL_TOKENS).map_err(|e| self.err(e))?;
            txn.open_table(ROLLOUTS).map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    /// Value of `key` in the `&str -> bytes` table `def`, inside a read transaction.
    fn get_in(
        &self,
        txn: &ReadTransaction,
        def: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<Vec<u8>>> {
        let table = txn.open_table(def).map_err(|e| self.err(e))?;
        let value = table
            .get(key)
            .map_err(|e| self.err(e))?
            .map(|g| g.value().to_vec());
        Ok(value)
    }

    /// [`Self::get_in`] with its own read transaction.
    fn get(&self, def: TableDefinition<&str, &[u8]>, key: &str) -> Result<Option<Vec<u8>>> {
        self.get_in(&self.read_txn()?, def, key)
    }

    /// Value of `key` in the typed table `def`, else of `legacy_key` in `cluster_meta`, where
    /// a build before the typed tables kept it (one read transaction for both).
    fn get_or_legacy(
        &self,
        def: TableDefinition<&str, &[u8]>,
        key: &str,
        legacy_key: &str,
    ) -> Result<Option<Vec<u8>>> {
        let txn = self.read_txn()?;
        match self.get_in(&txn, def, key)? {
            Some(v) => Ok(Some(v)),
            None => self.get_in(&txn, CLUSTER_META, legacy_key),
        }
    }

    /// Store every `(key, value)` in the `&str -> bytes` table `def`, in one durable commit.
    fn put(&self, def: TableDefinition<&str, &[u8]>, entries: &[(&str, &[u8])]) -> Result<()> {
        self.write(|txn| {
            let mut table = txn.open_table(def).map_err(|e| self.err(e))?;
            for (key, value) in entries {
                table.insert(*key, *value).map_err(|e| self.err(e))?;
            }
            Ok(())
        })
    }

    fn read_txn(&self) -> Result<ReadTransaction> {
        self.db.begin_read().map_err(|e| self.err(e))
    }

    /// Run `f` in one write transaction and commit it durably. An error from `f` drops the
    /// transaction, which aborts it: nothing of a failed call is written.
    fn write<T>(&self, f: impl FnOnce(&WriteTransaction) -> Result<T>) -> Result<T> {
        self.write_with(Durability::Immediate, f)
    }

    /// [`Self::write`] with the durability asked for ([`LeaseWriter::commit_leases`](super::LeaseWriter::commit_leases) only).
    fn write_with<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&WriteTransaction) -> Result<T>,
    ) -> Result<T> {
        let mut txn = self.db.begin_write().map_err(|e| self.err(e))?;
        // Immediate is redb's default; set it so that the guarantee does not hinge on a default.
        txn.set_durability(durability).map_err(|e| self.err(e))?;
        let out = f(&txn)?;
        txn.commit().map_err(|e| self.err(e))?;
        Ok(out)
    }

    fn err(&self, e: impl Into<::redb::Error>) -> StoreError {
        classify(&self.path, e.into())
    }

    fn corrupt(&self, cause: String) -> StoreError {
        StoreError::Corrupt {
            file: self.path.clone(),
            cause,
        }
    }

    fn encode<T: Serialize>(&self, what: impl fmt::Display, value: &T) -> Result<Vec<u8>> {
        serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            what: what.to_string(),
            source,
        })
    }

    /// Decode a stored JSON value. A record that does not parse is damage, not a bug of the
    /// caller, so it is reported as a corrupt file naming the record.
    fn decode<T: DeserializeOwned>(
        &self,
        table: &str,
        key: impl fmt::Display,
        bytes: &[u8],
    ) -> Result<T> {
        serde_json::from_slice(bytes)
            .map_err(|e| self.corrupt(format!("record `{key}` in table `{table}`: {e}")))
    }

    fn decode_lease(&self, ip: u32, bytes: &[u8]) -> Result<Lease> {
        self.decode("leases", Ipv4Addr::from(ip), bytes)
    }
}

/// Create the state directory (mode 0700) if missing; warn when an existing one is open to
/// other users, since the state names machines, addresses and, later, tokens.
fn ensure_state_dir(dir: &Path) -> Result<()> {
    let state_dir_err = |source| StoreError::StateDir {
        dir: dir.to_path_buf(),
        source,
    };
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                warn!(
                    dir = %dir.display(),
                    mode = format!("{mode:o}"),
                    "state directory is accessible to other users; chmod 700 it"
                );
            }
            Ok(())
        }
        Ok(_) => Err(state_dir_err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "exists but is not a directory",
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(state_dir_err)?;
            // The umask may have removed bits we need; set the mode exactly.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(state_dir_err)?;
            info!(dir = %dir.display(), "created state directory");
            Ok(())
        }
        Err(e) => Err(state_dir_err(e)),
    }
}

/// Turn a redb error into the operator-facing error for `file`.
fn classify(file: &Path, e: ::redb::Error) -> StoreError {
    use ::redb::Error as E;
    let file = file.to_path_buf();
    match e {
        E::DatabaseAlreadyOpen | E::LockProtocolMismatch => StoreError::Locked { file },
        E::Corrupted(cause) => StoreError::Corrupt { file, cause },
        E::UpgradeRequired(v) => StoreError::Corrupt {
            file,
            cause: format!("it uses storage format {v}, which talboot never wrote"),
        },
        // redb reports a file without its magic number as InvalidData.
        E::Io(source) if source.kind() == io::ErrorKind::InvalidData => StoreError::Corrupt {
            file,
            cause: source.to_string(),
        },
        E::Io(source) => StoreError::Io { file, source },
        e @ (E::TableTypeMismatch { .. }
        | E::TableIsMultimap(_)
        | E::TableIsNotMultimap(_)
        | E::TypeDefinitionChanged { .. }) => StoreError::Corrupt {
            file,
            cause: format!("its tables do not have talboot's layout: {e}"),
        },
        other => StoreError::Backend {
            file,
            source: Box::new(other),
        },
    }
}

impl Store for RedbStore {
    fn lease(&self, mac: Mac) -> Result<Option<Lease>> {
        let txn = self.read_txn()?;
        let by_mac = txn.open_table(LEASE_BY_MAC).map_err(|e| self.err(e))?;
        let Some(ip) = by_mac
            .get(mac.0)
            .map_err(|e| self.err(e))?
            .map(|g| g.value())
        else {
            return Ok(None);
        };
        let leases = txn.open_table(LEASES).map_err(|e| self.err(e))?;
        let guard = leases.get(ip).map_err(|e| self.err(e))?;
        match guard {
            Some(g) => Ok(Some(self.decode_lease(ip, g.value())?)),
            None => Err(self.corrupt(format!(
                "lease index names {} for {mac}, but no lease record exists there",
                Ipv4Addr::from(ip)
            ))),
        }
    }

    fn lease_by_ip(&self, ip: Ipv4Addr) -> Result<Option<Lease>> {
        let key = u32::from(ip);
        let txn = self.read_txn()?;
        let leases = txn.open_table(LEASES).map_err(|e| self.err(e))?;
        let guard = leases.get(key).map_err(|e| self.err(e))?;
        guard.map(|g| self.decode_lease(key, g.value())).transpose()
    }

    fn leases(&self) -> Result<Vec<Lease>> {
        let txn = self.read_txn()?;
        let leases = txn.open_table(LEASES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in leases.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            out.push(self.decode_lease(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        let txn = self.read_txn()?;
        let nodes = txn.open_table(NODES).map_err(|e| self.err(e))?;
        let guard = nodes.get(name).map_err(|e| self.err(e))?;
        guard
            .map(|g| self.decode("nodes", name, g.value()))
            .transpose()
    }

    fn node_part(&self, name: &str, part: NodePart) -> Result<Option<Vec<u8>>> {
        self.get_or_legacy(part_table(part), name, &part.legacy_key(name))
    }

    fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let txn = self.read_txn()?;
        let nodes = txn.open_table(NODES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in nodes.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            out.push(self.decode("nodes", k.value(), v.value())?);
        }
        Ok(out)
    }

    fn events(&self, node: &str, since_seq: u64, limit: usize) -> Result<Vec<Event>> {
        let Some(first) = since_seq.checked_add(1) else {
            return Ok(Vec::new());
        };
        let txn = self.read_txn()?;
        let events = txn.open_table(EVENTS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in events
            .range((node, first)..=(node, u64::MAX))
            .map_err(|e| self.err(e))?
            .take(limit)
        {
            let (k, v) = row.map_err(|e| self.err(e))?;
            let (n, seq) = k.value();
            out.push(self.decode("events", format_args!("{n}#{seq}"), v.value())?);
        }
        Ok(out)
    }

    fn last_event(&self, node: &str) -> Result<Option<Event>> {
        let txn = self.read_txn()?;
        let events = txn.open_table(EVENTS).map_err(|e| self.err(e))?;
        let last = events
            .range((node, 0u64)..=(node, u64::MAX))
            .map_err(|e| self.err(e))?
            .next_back()
            .transpose()
            .map_err(|e| self.err(e))?;
        last.map(|(k, v)| {
            let (n, seq) = k.value();
            self.decode("events", format_args!("{n}#{seq}"), v.value())
        })
        .transpose()
    }

    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.get(CLUSTER_META, key)
    }

    fn row(&self, table: ClusterTable, key: &str) -> Result<Option<Vec<u8>>> {
        self.get_or_legacy(cluster_table(table), key, &table.legacy_key(key))
    }

    fn rollout(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.get(ROLLOUTS, key)
    }

    fn rollout_keys(&self) -> Result<Vec<String>> {
        let txn = self.read_txn()?;
        let table = txn.open_table(ROLLOUTS).map_err(|e| self.err(e))?;
        let mut keys = Vec::new();
        for row in table.iter().map_err(|e| self.err(e))? {
            let (k, _) = row.map_err(|e| self.err(e))?;
            keys.push(k.value().to_string());
        }
        Ok(keys)
    }

    fn export_json(&self) -> Result<Value> {
        // One read transaction: the export is a consistent snapshot even while writers run.
        let txn = self.read_txn()?;
        let schema = txn
            .open_table(META)
            .map_err(|e| self.err(e))?
            .get(SCHEMA_KEY)
            .map_err(|e| self.err(e))?
            .map(|g| g.value());
        let leases = self.export_leases(&txn)?;
        let nodes = self.export_nodes(&txn)?;
        let events = self.export_events(&txn)?;
        let meta = self.export_opaque(&txn, CLUSTER_META)?;
        // Progress rows are short marks or JSON: exported like `cluster_meta`'s bytes.
        let progress = self.export_opaque(&txn, CLUSTER_PROGRESS)?;
        let mut parts = Map::new();
        for (label, def) in [
            ("node_facts", NODE_FACTS),
            ("node_lifecycle", NODE_LIFECYCLE),
            ("pull_tokens", PULL_TOKENS),
            ("rollouts", ROLLOUTS),
        ] {
            let rows = self.export_json_rows(&txn, label, def)?;
            parts.insert(label.to_owned(), Value::Object(rows));
        }

        Ok(serde_json::json!({
            "schema_version": schema,
            "leases": leases,
            "nodes": nodes,
            "events": events,
            "cluster_meta": meta,
            "node_facts": parts["node_facts"],
            "node_lifecycle": parts["node_lifecycle"],
            "cluster_progress": progress,
            "pull_tokens": parts["pull_tokens"],
            "rollouts": parts["rollouts"],
        }))
    }
}

/// The tables of [`Store::export_json`], each read inside the export's one transaction.
/// Stored JSON is exported as is, so fields this build does not know survive.
impl RedbStore {
    /// Every lease record, in address order.
    fn export_leases(&self, txn: &ReadTransaction) -> Result<Vec<Value>> {
        let mut leases = Vec::new();
        let table = txn.open_table(LEASES).map_err(|e| self.err(e))?;
        for row in table.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            leases.push(self.decode::<Value>("leases", Ipv4Addr::from(k.value()), v.value())?);
        }
        Ok(leases)
    }

    /// Every node record, in name order.
    fn export_nodes(&self, txn: &ReadTransaction) -> Result<Vec<Value>> {
        let mut nodes = Vec::new();
        let table = txn.open_table(NODES).map_err(|e| self.err(e))?;
        for row in table.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            nodes.push(self.decode::<Value>("nodes", k.value(), v.value())?);
        }
        Ok(nodes)
    }

    /// Every timeline event, node by node, each node's in sequence order.
    fn export_events(&self, txn: &ReadTransaction) -> Result<Vec<Value>> {
        let mut events = Vec::new();
        let table = txn.open_table(EVENTS).map_err(|e| self.err(e))?;
        for row in table.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            let (n, seq) = k.value();
            events.push(self.decode::<Value>("events", format_args!("{n}#{seq}"), v.value())?);
        }
        Ok(events)
    }

    /// A table of opaque bytes by key. Values are text when they are UTF-8, hex otherwise,
    /// tagged so that the two cannot be confused.
    fn export_opaque(
        &self,
        txn: &ReadTransaction,
        def: TableDefinition<&str, &[u8]>,
    ) -> Result<Map<String, Value>> {
        let mut out = Map::new();
        let table = txn.open_table(def).map_err(|e| self.err(e))?;
        for row in table.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            let bytes = v.value();
            let encoded = match std::str::from_utf8(bytes) {
                Ok(text) => serde_json::json!({ "text": text }),
                Err(_) => serde_json::json!({ "hex": crate::hex::lower(bytes) }),
            };
            out.insert(k.value().to_string(), encoded);
        }
        Ok(out)
    }

    /// A table of JSON values by key, `label` naming it when a row does not decode.
    fn export_json_rows(
        &self,
        txn: &ReadTransaction,
        label: &str,
        def: TableDefinition<&str, &[u8]>,
    ) -> Result<Map<String, Value>> {
        let mut rows = Map::new();
        let table = txn.open_table(def).map_err(|e| self.err(e))?;
        for row in table.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            rows.insert(
                k.value().to_string(),
                self.decode::<Value>(label, k.value(), v.value())?,
            );
        }
        Ok(rows)
    }
}

impl Backend for RedbStore {
    fn put_node_states(&self, writes: &[NodeWrite]) -> Result<()> {
        let mut encoded = Vec::with_capacity(writes.len());
        for w in writes {
            let rec = match &w.record {
                Some(r) => Some(self.encode(format_args!("node record {}", r.name), r)?),
                None => None,
            };
            encoded.push(rec);
        }
        self.write(|txn| {
            let mut nodes = txn.open_table(NODES).map_err(|e| self.err(e))?;
            let mut facts = txn.open_table(NODE_FACTS).map_err(|e| self.err(e))?;
            let mut life = txn.open_table(NODE_LIFECYCLE).map_err(|e| self.err(e))?;
            for (w, rec) in writes.iter().zip(&encoded) {
                if let Some(bytes) = rec {
                    nodes
                        .insert(w.name.as_str(), bytes.as_slice())
                        .map_err(|e| self.err(e))?;
                }
                for (part, value) in &w.parts {
                    let table = match part {
                        NodePart::Facts => &mut facts,
                        NodePart::Lifecycle => &mut life,
                    };
                    table
                        .insert(w.name.as_str(), value.as_slice())
                        .map_err(|e| self.err(e))?;
                }
            }
            Ok(())
        })
    }

    fn commit_leases(&self, groups: &[LeaseCommit], durable: bool) -> Result<()> {
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        self.write_with(durability, |txn| {
            for group in groups {
                for change in &group.writes {
                    self.apply_lease_change_in(txn, change)?;
                }
                for e in &group.events {
                    self.append_event_in(txn, &e.node, &e.kind, &e.detail, e.at_unix_ms)?;
                }
            }
            Ok(())
        })
    }

    fn append_events(&self, events: &[NewEvent]) -> Result<Vec<u64>> {
        self.write(|txn| {
            events
                .iter()
                .map(|e| self.append_event_in(txn, &e.node, &e.kind, &e.detail, e.at_unix_ms))
                .collect()
        })
    }

    fn put_metas(&self, entries: &[(String, Vec<u8>)]) -> Result<()> {
        let entries: Vec<(&str, &[u8])> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        self.put(CLUSTER_META, &entries)
    }

    #[cfg(test)]
    fn compare_and_set_meta(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<CasOutcome> {
        self.write(|txn| {
            let mut table = txn.open_table(CLUSTER_META).map_err(|e| self.err(e))?;
            let current = table
                .get(key)
                .map_err(|e| self.err(e))?
                .map(|g| g.value().to_vec());
            if current.as_deref() != expected {
                // Nothing is written; committing the empty transaction is harmless.
                return Ok(CasOutcome::Mismatch { current });
            }
            table.insert(key, new).map_err(|e| self.err(e))?;
            Ok(CasOutcome::Swapped)
        })
    }

    fn put_rows(&self, table: ClusterTable, entries: &[(String, Vec<u8>)]) -> Result<()> {
        self.write(|txn| {
            let mut typed = txn
                .open_table(cluster_table(table))
                .map_err(|e| self.err(e))?;
            let mut legacy = txn.open_table(CLUSTER_META).map_err(|e| self.err(e))?;
            for (key, value) in entries {
                typed
                    .insert(key.as_str(), value.as_slice())
                    .map_err(|e| self.err(e))?;
                // The older row is superseded: gone with the same commit.
                legacy
                    .remove(table.legacy_key(key).as_str())
                    .map_err(|e| self.err(e))?;
            }
            Ok(())
        })
    }

    fn compare_and_set_row(
        &self,
        table: ClusterTable,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<CasOutcome> {
        self.write(|txn| {
            let mut typed = txn
                .open_table(cluster_table(table))
                .map_err(|e| self.err(e))?;
            let mut legacy = txn.open_table(CLUSTER_META).map_err(|e| self.err(e))?;
            let legacy_key = table.legacy_key(key);
            let mut current = typed
                .get(key)
                .map_err(|e| self.err(e))?
                .map(|g| g.value().to_vec());
            if current.is_none() {
                current = legacy
                    .get(legacy_key.as_str())
                    .map_err(|e| self.err(e))?
                    .map(|g| g.value().to_vec());
            }
            if current.as_deref() != expected {
                return Ok(CasOutcome::Mismatch { current });
            }
            typed.insert(key, new).map_err(|e| self.err(e))?;
            legacy
                .remove(legacy_key.as_str())
                .map_err(|e| self.err(e))?;
            Ok(CasOutcome::Swapped)
        })
    }

    fn put_rollout(&self, key: &str, value: &[u8]) -> Result<()> {
        self.put(ROLLOUTS, &[(key, value)])
    }
}

impl RedbStore {
    /// One of the book's changes, inside an open write transaction: the record written as it
    /// is, and the by-MAC table kept equal to the records (a MAC maps to the address of its
    /// non-declined record). The rules (who may hold what) are the book's; none is checked
    /// here.
    fn apply_lease_change_in(&self, txn: &WriteTransaction, change: &LeaseChange) -> Result<()> {
        let lease = match change {
            LeaseChange::Upsert(lease) => lease,
            LeaseChange::Remove(ip) => return self.delete_ip_in(txn, *ip).map(|_| ()),
        };
        let ip = u32::from(lease.ip);
        let bytes = self.encode(format_args!("lease for {}", lease.ip), lease)?;
        let mut leases = txn.open_table(LEASES).map_err(|e| self.err(e))?;
        let mut by_mac = txn.open_table(LEASE_BY_MAC).map_err(|e| self.err(e))?;
        // The record replaced may be another MAC's (a lapsed one the book displaced): its
        // index entry goes with it.
        let replaced = match leases.get(ip).map_err(|e| self.err(e))? {
            Some(g) => Some(self.decode_lease(ip, g.value())?.mac),
            None => None,
        };
        for mac in replaced.into_iter().chain([lease.mac]) {
            let indexed = by_mac
                .get(mac.0)
                .map_err(|e| self.err(e))?
                .map(|g| g.value());
            if indexed == Some(ip) {
                by_mac.remove(mac.0).map_err(|e| self.err(e))?;
            }
        }
        if lease.state != LeaseState::Declined {
            by_mac.insert(lease.mac.0, ip).map_err(|e| self.err(e))?;
        }
        leases
            .insert(ip, bytes.as_slice())
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// [`LeaseChange::Remove`] inside an open write transaction.
    fn delete_ip_in(&self, txn: &WriteTransaction, ip: Ipv4Addr) -> Result<Option<Lease>> {
        let key = u32::from(ip);

        let mut leases = txn.open_table(LEASES).map_err(|e| self.err(e))?;
        let mut by_mac = txn.open_table(LEASE_BY_MAC).map_err(|e| self.err(e))?;
        let record = match leases.remove(key).map_err(|e| self.err(e))? {
            Some(g) => self.decode_lease(key, g.value())?,
            None => return Ok(None),
        };
        let indexed = by_mac
            .get(record.mac.0)
            .map_err(|e| self.err(e))?
            .map(|g| g.value());
        if indexed == Some(key) {
            by_mac.remove(record.mac.0).map_err(|e| self.err(e))?;
        }
        Ok(Some(record))
    }
}

impl RedbStore {
    /// [`EventWriter::append_event`](super::EventWriter::append_event) inside an open write transaction.
    fn append_event_in(
        &self,
        txn: &WriteTransaction,
        node: &str,
        kind: &str,
        detail: &str,
        at_unix_ms: u64,
    ) -> Result<u64> {
        let mut events = txn.open_table(EVENTS).map_err(|e| self.err(e))?;
        // The number comes from the last stored key inside this transaction, so two
        // appends can never get the same one and a restart continues the sequence.
        let last = events
            .range((node, 0u64)..=(node, u64::MAX))
            .map_err(|e| self.err(e))?
            .next_back()
            .transpose()
            .map_err(|e| self.err(e))?
            .map(|(k, v)| (k.value().1, v.value().to_vec()));
        // The same kind and detail right after itself is folded into the last row (its
        // count grows), so a timeline says "refused (x40)" once instead of forty times.
        // Older rows decode with count 1 (serde default): no schema bump is needed.
        if let Some((seq, bytes)) = &last {
            let mut prev: Event = self.decode("events", format_args!("{node}#{seq}"), bytes)?;
            if prev.kind == kind && prev.detail == detail {
                prev.count = prev.count.saturating_add(1);
                prev.last_at_unix_ms = Some(at_unix_ms);
                let bytes = self.encode(format_args!("event {seq} of node {node}"), &prev)?;
                events
                    .insert((node, *seq), bytes.as_slice())
                    .map_err(|e| self.err(e))?;
                return Ok(*seq);
            }
        }
        let seq = last.map(|(s, _)| s).unwrap_or(0) + 1;
        let event = Event {
            seq,
            at_unix_ms,
            node: node.to_string(),
            kind: kind.to_string(),
            detail: detail.to_string(),
            count: 1,
            last_at_unix_ms: None,
        };
        let bytes = self.encode(format_args!("event {seq} of node {node}"), &event)?;
        events
            .insert((node, seq), bytes.as_slice())
            .map_err(|e| self.err(e))?;
        Ok(seq)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread;

    use super::*;
    use crate::store::{NodePhase, open};

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

    /// A fresh store in a temporary state directory (kept alive by the returned guard).
    fn fresh() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("state")).unwrap();
        (dir, store)
    }

    #[test]
    fn schema_too_new_is_refused_and_data_kept() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        {
            let s = open(&state).unwrap();
            s.put_node(&node("cp1", NodePhase::Ready, 1)).unwrap();
        }
        let file = store_path(&state);
        {
            let db = Database::create(&file).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(SCHEMA_KEY, SCHEMA_VERSION + 1)
                .unwrap();
            txn.commit().unwrap();
        }

        let err = open(&state).unwrap_err();
        match &err {
            StoreError::SchemaTooNew {
                file: f,
                found,
                supported,
            } => {
                assert_eq!(f, &file);
                assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
            }
            e => panic!("unexpected error {e:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&file.display().to_string()), "{msg}");
        assert!(
            msg.contains("schema version 2, but this talboot supports up to 1"),
            "{msg}"
        );
        assert!(msg.contains("upgrade talboot"), "{msg}");

        // The refusal changed nothing: the version and the data are still there.
        let db = Database::open(&file).unwrap();
        let txn = db.begin_read().unwrap();
        let version = txn
            .open_table(META)
            .unwrap()
            .get(SCHEMA_KEY)
            .unwrap()
            .unwrap()
            .value();
        assert_eq!(version, SCHEMA_VERSION + 1);
        assert!(txn.open_table(NODES).unwrap().get("cp1").unwrap().is_some());
    }

    #[test]
    fn garbage_file_is_corrupt_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::create_dir(&state).unwrap();
        let file = store_path(&state);
        let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        fs::write(&file, &garbage).unwrap();

        let err = open(&state).unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { file: f, .. } if f == &file),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&file.display().to_string()), "{msg}");
        assert!(
            msg.contains("Restore it from a backup, or move it aside"),
            "{msg}"
        );
        assert_eq!(fs::read(&file).unwrap(), garbage);
    }

    #[test]
    fn damaged_pages_are_refused_or_harmless_never_silently_lost() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        {
            let s = open(&state).unwrap();
            for i in 1..=40u64 {
                // Distinct details: identical ones would fold into one row.
                s.append_event("cp1", "k", &format!("{i:03}{}", "x".repeat(200)), i)
                    .unwrap();
            }
            s.put_meta("step", b"bootstrapped").unwrap();
        }
        let file = store_path(&state);
        let pristine = fs::read(&file).unwrap();

        // Damage one page at a time. Each open must either refuse the file, leaving it as it
        // was, or (damage in a free page) open with every record intact.
        let mut refused = 0;
        for page in (4096..pristine.len()).step_by(4096) {
            let mut damaged = pristine.clone();
            for b in &mut damaged[page + 100..page + 140] {
                *b ^= 0x5a;
            }
            fs::write(&file, &damaged).unwrap();
            match open(&state) {
                Err(StoreError::Corrupt { .. }) => {
                    refused += 1;
                    assert_eq!(fs::read(&file).unwrap(), damaged, "page {page}");
                }
                Err(e) => panic!("page {page}: unexpected error {e}"),
                Ok(s) => {
                    assert_eq!(
                        s.events("cp1", 0, usize::MAX).unwrap().len(),
                        40,
                        "page {page}"
                    );
                    assert_eq!(
                        s.get_meta("step").unwrap().as_deref(),
                        Some(&b"bootstrapped"[..])
                    );
                }
            }
        }
        assert!(refused > 0, "no damaged page was detected");
    }

    #[test]
    fn foreign_redb_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::create_dir(&state).unwrap();
        let file = store_path(&state);
        {
            let db = Database::create(&file).unwrap();
            let txn = db.begin_write().unwrap();
            let def: TableDefinition<&str, &str> = TableDefinition::new("something_else");
            txn.open_table(def).unwrap().insert("a", "b").unwrap();
            txn.commit().unwrap();
        }
        let err = open(&state).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("no `meta` table"), "{err}");
    }

    #[test]
    fn second_open_reports_lock() {
        let (dir, _s) = fresh();
        let err = open(&dir.path().join("state")).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("talboot.redb"), "{msg}");
        assert!(msg.contains("another talboot running"), "{msg}");
    }

    #[tokio::test]
    async fn closed_fires_when_the_last_reference_goes_and_the_lock_with_it() {
        use futures_util::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let mut store = open(&state).unwrap();
        let mut closed = store.on_close();
        let store: Arc<dyn Backend> = Arc::new(store);
        let user = store.clone();
        drop(store);
        // A user is left (a blocking call still running, say): not closed, still locked.
        assert!((&mut closed).now_or_never().is_none());
        assert!(matches!(open(&state), Err(StoreError::Locked { .. })));
        let last = std::thread::spawn(move || {
            user.put_meta("k", b"v").unwrap();
            drop(user);
        });
        closed.await;
        // Once it has fired, the state directory opens again, with what was written.
        let again = open(&state).unwrap();
        assert_eq!(again.get_meta("k").unwrap().as_deref(), Some(&b"v"[..]));
        last.join().unwrap();
    }

    #[test]
    fn state_dir_created_0700_and_file_0600() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a").join("state");
        let _s = open(&state).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&store_path(&state)), 0o600);
    }

    #[test]
    fn state_dir_that_is_a_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::write(&state, b"").unwrap();
        let err = open(&state).unwrap_err();
        assert!(matches!(err, StoreError::StateDir { .. }), "{err:?}");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn node_parts_have_their_own_tables_and_read_legacy_rows() {
        let (_d, s) = fresh();
        // A row an older build kept under cluster_meta is still found ...
        s.put_meta("node/w1/facts", br#"{"old":1}"#).unwrap();
        assert_eq!(
            s.node_part("w1", NodePart::Facts).unwrap().as_deref(),
            Some(&br#"{"old":1}"#[..])
        );
        // ... and the typed table wins once written; the record and its parts commit together.
        s.put_node_states(&[NodeWrite {
            name: "w1".into(),
            record: Some(node("w1", NodePhase::Maintenance, 3)),
            parts: vec![(NodePart::Facts, br#"{"new":2}"#.to_vec())],
        }])
        .unwrap();
        assert_eq!(
            s.node_part("w1", NodePart::Facts).unwrap().as_deref(),
            Some(&br#"{"new":2}"#[..])
        );
        assert_eq!(s.node("w1").unwrap().unwrap().phase, NodePhase::Maintenance);
        assert_eq!(s.node_part("w1", NodePart::Lifecycle).unwrap(), None);
    }

    /// Issue 11: cluster progress and pull tokens have their own tables; a store that has
    /// only the rows an older build wrote under `cluster_meta` is still read, compared and
    /// superseded (the old row goes with the commit that replaces it).
    #[test]
    fn cluster_rows_have_their_own_tables_and_read_legacy_rows() {
        let (_d, s) = fresh();
        s.put_meta("cluster/bootstrap", b"intent").unwrap();
        s.put_meta("token/abc", br#"{"old":1}"#).unwrap();
        assert_eq!(
            s.row(ClusterTable::Progress, "bootstrap")
                .unwrap()
                .as_deref(),
            Some(&b"intent"[..])
        );
        assert_eq!(
            s.row(ClusterTable::PullTokens, "abc").unwrap().as_deref(),
            Some(&br#"{"old":1}"#[..])
        );
        // Tables do not mix: a progress key is no token.
        assert_eq!(s.row(ClusterTable::PullTokens, "bootstrap").unwrap(), None);
        // Compare-and-set sees the old row ...
        assert_eq!(
            s.compare_and_set_row(ClusterTable::Progress, "bootstrap", None, b"done")
                .unwrap(),
            CasOutcome::Mismatch {
                current: Some(b"intent".to_vec())
            }
        );
        assert_eq!(
            s.compare_and_set_row(
                ClusterTable::Progress,
                "bootstrap",
                Some(b"intent"),
                b"done"
            )
            .unwrap(),
            CasOutcome::Swapped
        );
        // ... and the typed row replaces it, in the table and in the export.
        assert_eq!(s.get_meta("cluster/bootstrap").unwrap(), None);
        s.put_row(ClusterTable::PullTokens, "abc", br#"{"new":2}"#)
            .unwrap();
        assert_eq!(s.get_meta("token/abc").unwrap(), None);
        let dump = s.export_json().unwrap();
        assert_eq!(dump["cluster_progress"]["bootstrap"]["text"], "done");
        assert_eq!(dump["pull_tokens"]["abc"]["new"], 2);
        assert_eq!(dump["cluster_meta"], serde_json::json!({}));
    }

    #[test]
    fn concurrent_readers_see_consistent_snapshots() {
        const WRITES: u64 = 150;
        let (_d, s) = fresh();
        let s = Arc::new(s);
        let done = Arc::new(AtomicBool::new(false));

        let readers: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&s);
                let done = Arc::clone(&done);
                thread::spawn(move || {
                    let mut last_seen = 0u64;
                    let mut last_events = 0usize;
                    loop {
                        // Read `done` first: a read after it is set sees every write.
                        let finished = done.load(Ordering::Acquire);
                        if let Some(l) = s.lease(mac(1)).unwrap() {
                            // Index and record come from one snapshot: the address always
                            // matches the write that produced it.
                            assert_eq!(l.ip, ip((l.updated_at_unix % 10) as u8 + 1));
                            assert!(l.updated_at_unix >= last_seen, "went back in time");
                            last_seen = l.updated_at_unix;
                        }
                        // A move is one transaction: never zero or two records for the MAC.
                        let leases = s.leases().unwrap();
                        assert!(leases.len() <= 1, "{leases:?}");
                        let events = s.events("n", 0, usize::MAX).unwrap();
                        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
                        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
                        assert!(events.len() >= last_events);
                        last_events = events.len();
                        if finished {
                            return (last_seen, last_events);
                        }
                    }
                })
            })
            .collect();

        let mut prev: Option<Ipv4Addr> = None;
        for i in 1..=WRITES {
            let mut l = lease(1, (i % 10) as u8 + 1, LeaseState::Bound, 10_000);
            l.updated_at_unix = i;
            // A move as the lease book decides it: the old record removed, the new written,
            // in one commit.
            let mut writes: Vec<LeaseChange> = prev
                .filter(|p| *p != l.ip)
                .map(LeaseChange::Remove)
                .into_iter()
                .collect();
            prev = Some(l.ip);
            writes.push(LeaseChange::Upsert(l));
            s.commit_leases(
                &[LeaseCommit {
                    writes,
                    events: Vec::new(),
                }],
                true,
            )
            .unwrap();
            assert_eq!(s.append_event("n", "tick", &i.to_string(), i).unwrap(), i);
        }
        done.store(true, Ordering::Release);

        for r in readers {
            assert_eq!(r.join().unwrap(), (WRITES, WRITES as usize));
        }
        let ips: BTreeSet<_> = s.leases().unwrap().iter().map(|l| l.ip).collect();
        assert_eq!(ips.len(), 1);
    }
}
