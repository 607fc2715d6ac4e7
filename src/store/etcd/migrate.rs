//! `talboot store migrate`: a redb state directory copied into an etcd prefix, checked and
//! resumable (issue 28 item 1).
//!
//! The copy is planned first, purely ([`MigratePlan::from_export`]): the redb store's
//! consistent export (one read transaction) becomes the exact keys and values the etcd
//! backend would hold for the same state (its key layout, the MAC index and each node's
//! event head derived as its writers derive them), in key order. What to do with a prefix
//! that already holds keys is decided purely too ([`decide`]): empty, or holding only keys
//! of this same migration (its marker names the plan's fingerprint), goes on; anything else
//! is refused. The executor ([`migrate`]) is thin: it writes the rows not yet there in
//! transactions of at most `--max-txn-ops` operations, each carrying the marker's progress,
//! then reads the prefix back and compares every table's count and digest, and the two
//! stores' exports.
//!
//! Resuming: every batch is one transaction (all or nothing) whose compares say its keys are
//! still absent and the marker unchanged; a rerun after a kill reads what is there, skips
//! the rows present with identical values, and writes the rest. Event keys are the node and
//! its sequence number, so a row written twice is the same key: nothing is duplicated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::keys::Keys;
use super::{EtcdConfig, EtcdStore};
use crate::store::{Event, Lease, LeaseState, RedbStore, Store, StoreError};

/// The marker's key under the fleet prefix (`migrate/...` is this module's).
fn marker_key(keys: &Keys) -> Vec<u8> {
    format!("{}migrate/state", keys.root()).into_bytes()
}

/// etcd's default `--max-request-bytes` is 1.5 MiB (v3.4.23 `embed/config.go`
/// `DefaultMaxRequestBytes`); a batch stays well under it.
const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// Why a migration stopped; nothing after the last committed batch was written.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// No state file in the source directory.
    #[error("{} holds no talboot.redb; give the --state-dir serve used as --from", .0.display())]
    NoSource(PathBuf),
    /// The source is in use.
    #[error(
        "{} is locked by a running talboot serve: stop it first (migrate copies a state \
         nothing writes), then run migrate again",
        .0.display()
    )]
    SourceInUse(PathBuf),
    /// The etcd prefix holds keys this migration did not write.
    #[error(
        "the etcd prefix {prefix} holds {count} key(s) not from this migration (first: {first}); \
         migrate only into an empty prefix: name another with --etcd-cluster, or remove it \
         (`etcdctl del --prefix {prefix}`) if it is a discarded attempt"
    )]
    ForeignData {
        /// The prefix.
        prefix: String,
        /// How many keys.
        count: usize,
        /// The first of them.
        first: String,
    },
    /// A migration of other data began here (the source changed since, or another one).
    #[error(
        "a migration of different data began under {prefix} (the source changed since, or it \
         came from elsewhere); remove the prefix (`etcdctl del --prefix {prefix}`) and migrate \
         again"
    )]
    SourceChanged {
        /// The prefix.
        prefix: String,
    },
    /// A key changed under the migration (something else writes the prefix).
    #[error(
        "{key} changed in etcd while migrating (is an appliance serving from this prefix?); \
         stop it, remove the prefix and migrate again"
    )]
    Conflict {
        /// The key.
        key: String,
    },
    /// The read-back differs from the source.
    #[error("after copying, etcd's {table} differs from the source: {detail}")]
    Mismatch {
        /// The table.
        table: String,
        /// How.
        detail: String,
    },
    /// The source export cannot be mapped (a row talboot does not write).
    #[error("the source's {table}: {cause}")]
    Source {
        /// The table.
        table: &'static str,
        /// What was wrong.
        cause: String,
    },
    /// A store call failed.
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// One key and value to copy.
type Row = (Vec<u8>, Vec<u8>);

/// A borrowed key and value.
type RowRef<'a> = (&'a [u8], &'a [u8]);

/// Rows by key.
type Rows = BTreeMap<Vec<u8>, Vec<u8>>;

/// A key-value table of the export: its name, its etcd key for an export key, whether its
/// values are opaque (`{"text"|"hex": ..}`) rather than JSON.
type KvTable = (&'static str, fn(&Keys, &str) -> Vec<u8>, bool);

/// Every row the etcd prefix must hold for the source's state, in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigratePlan {
    rows: Vec<Row>,
    fingerprint: String,
}

/// One table's size and content digest (SHA-256 over its keys and values in key order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSummary {
    /// Rows.
    pub count: usize,
    /// Hex SHA-256.
    pub digest: String,
}

/// What the marker records: which plan, how far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Marker {
    /// The plan's fingerprint.
    pub fingerprint: String,
    /// The source directory, for people reading the key.
    pub source: String,
    /// Rows written so far by this migration (all runs).
    pub copied: usize,
    /// The read-back matched.
    pub complete: bool,
}

/// What a migration found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Per table: the source's summary and etcd's after the copy (equal when it returns Ok).
    pub tables: BTreeMap<String, TableSummary>,
    /// Rows written by this run.
    pub written: usize,
    /// Rows already in etcd with the same value (a resumed run).
    pub skipped: usize,
    /// Transactions this run committed.
    pub batches: usize,
    /// It stopped early on purpose (`stop_after`), not complete.
    pub stopped: bool,
}

/// Knobs of [`migrate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateOptions {
    /// Stop after this many batches, as a kill would (tests of resumption).
    pub stop_after: Option<usize>,
}

/// Decode the export's `{"text": ..}` / `{"hex": ..}` opaque value.
fn opaque(v: &Value) -> Option<Vec<u8>> {
    if let Some(t) = v.get("text").and_then(Value::as_str) {
        return Some(t.as_bytes().to_vec());
    }
    let h = v.get("hex").and_then(Value::as_str)?;
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

fn json(table: &'static str, v: &Value) -> Result<Vec<u8>, MigrateError> {
    serde_json::to_vec(v).map_err(|e| MigrateError::Source {
        table,
        cause: e.to_string(),
    })
}

fn typed<T: serde::de::DeserializeOwned>(
    table: &'static str,
    v: &Value,
) -> Result<T, MigrateError> {
    serde_json::from_value(v.clone()).map_err(|e| MigrateError::Source {
        table,
        cause: e.to_string(),
    })
}

fn list<'a>(export: &'a Value, table: &str) -> impl Iterator<Item = &'a Value> {
    export
        .get(table)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn rows<'a>(export: &'a Value, table: &str) -> impl Iterator<Item = (&'a String, &'a Value)> {
    export
        .get(table)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
}

impl MigratePlan {
    /// The rows of a redb [`Store::export_json`] under `cluster`'s prefix, as the etcd
    /// backend lays them out (see the layout in [`super`]). Stored JSON is copied as the
    /// export gives it, so fields this build does not know survive.
    pub fn from_export(export: &Value, cluster: &str) -> Result<Self, MigrateError> {
        let keys = Keys::new(cluster);
        let mut out: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for v in list(export, "leases") {
            let lease: Lease = typed("leases", v)?;
            if lease.state != LeaseState::Declined {
                out.insert(keys.lease_mac(lease.mac), lease.ip.to_string().into_bytes());
            }
            out.insert(keys.lease_ip(lease.ip), json("leases", v)?);
        }
        for v in list(export, "nodes") {
            let name = v
                .get("name")
                .and_then(Value::as_str)
                .ok_or(MigrateError::Source {
                    table: "nodes",
                    cause: "a record without a name".into(),
                })?;
            out.insert(keys.node(name), json("nodes", v)?);
        }
        // Timelines come node by node in sequence order: the last one seen is the head.
        for v in list(export, "events") {
            let e: Event = typed("events", v)?;
            let bytes = json("events", v)?;
            out.insert(keys.event_head(&e.node), bytes.clone());
            out.insert(keys.event(&e.node, e.seq), bytes);
        }
        let tables: [KvTable; 6] = [
            ("cluster_meta", |k, key| k.meta(key), true),
            (
                "cluster_progress",
                |k, key| k.row(crate::store::ClusterTable::Progress, key),
                true,
            ),
            (
                "node_facts",
                |k, key| k.part(crate::store::NodePart::Facts, key),
                false,
            ),
            (
                "node_lifecycle",
                |k, key| k.part(crate::store::NodePart::Lifecycle, key),
                false,
            ),
            (
                "pull_tokens",
                |k, key| k.row(crate::store::ClusterTable::PullTokens, key),
                false,
            ),
            ("rollouts", |k, key| k.rollout(key), false),
        ];
        for (table, key_of, is_opaque) in tables {
            for (key, v) in rows(export, table) {
                let bytes = if is_opaque {
                    opaque(v).ok_or(MigrateError::Source {
                        table,
                        cause: format!("{key}: neither text nor hex"),
                    })?
                } else {
                    json(table, v)?
                };
                out.insert(key_of(&keys, key), bytes);
            }
        }
        let rows: Vec<Row> = out.into_iter().collect();
        let fingerprint = digest(rows.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
        Ok(Self { rows, fingerprint })
    }

    /// Every row, in key order.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// A digest of every row: two plans with the same fingerprint copy the same data.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

/// Hex SHA-256 over `rows` (each key and value length-prefixed, so no two row sets collide
/// by shifting bytes between keys and values).
fn digest<'a>(rows: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> String {
    let mut h = Sha256::new();
    for (k, v) in rows {
        h.update((k.len() as u64).to_be_bytes());
        h.update(k);
        h.update((v.len() as u64).to_be_bytes());
        h.update(v);
    }
    crate::hex::lower(&h.finalize())
}

/// Per table (the key's first segment under the prefix), count and digest of `rows` in key
/// order; keys outside the store's tables (the schema version, `migrate/`) are left out.
pub fn summarize<'a>(
    cluster: &str,
    rows: impl Iterator<Item = (&'a [u8], &'a [u8])>,
) -> BTreeMap<String, TableSummary> {
    let keys = Keys::new(cluster);
    let mut by_table: BTreeMap<String, Vec<RowRef<'a>>> = BTreeMap::new();
    for (k, v) in rows {
        let Ok(name) = std::str::from_utf8(k) else {
            continue;
        };
        let Some((table, _)) = keys.split(name) else {
            continue;
        };
        if table == "schema_version" || table == "migrate" {
            continue;
        }
        by_table.entry(table.to_owned()).or_default().push((k, v));
    }
    by_table
        .into_iter()
        .map(|(t, mut rows)| {
            rows.sort();
            let summary = TableSummary {
                count: rows.len(),
                digest: digest(rows.into_iter()),
            };
            (t, summary)
        })
        .collect()
}

/// Where a migration starts: the rows not yet there (all of them in an empty prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    /// The marker found, if a run began.
    pub marker: Option<Marker>,
    /// Rows to write, in key order.
    pub todo: Vec<Row>,
    /// Rows already there with the same value.
    pub skipped: usize,
}

/// What to do with a prefix holding `existing` (every key under it but the schema version
/// and the marker) and `marker`, for `plan`.
pub(crate) fn decide(
    plan: &MigratePlan,
    prefix: &str,
    existing: &Rows,
    marker: Option<Marker>,
) -> Result<Start, MigrateError> {
    match &marker {
        Some(m) if m.fingerprint != plan.fingerprint => {
            return Err(MigrateError::SourceChanged {
                prefix: prefix.to_owned(),
            });
        }
        None if !existing.is_empty() => {
            return Err(foreign(prefix, existing.keys()));
        }
        _ => {}
    }
    let planned: BTreeMap<&[u8], &[u8]> = plan
        .rows
        .iter()
        .map(|(k, v)| (k.as_slice(), v.as_slice()))
        .collect();
    let strangers: Vec<&Vec<u8>> = existing
        .keys()
        .filter(|k| !planned.contains_key(k.as_slice()))
        .collect();
    if !strangers.is_empty() {
        return Err(foreign(prefix, strangers.into_iter()));
    }
    let mut todo = Vec::new();
    let mut skipped = 0;
    for (k, v) in &plan.rows {
        match existing.get(k) {
            Some(have) if have == v => skipped += 1,
            Some(_) => {
                return Err(MigrateError::Conflict {
                    key: String::from_utf8_lossy(k).into_owned(),
                });
            }
            None => todo.push((k.clone(), v.clone())),
        }
    }
    Ok(Start {
        marker,
        todo,
        skipped,
    })
}

fn foreign<'a>(prefix: &str, keys: impl Iterator<Item = &'a Vec<u8>>) -> MigrateError {
    let keys: Vec<&Vec<u8>> = keys.collect();
    MigrateError::ForeignData {
        prefix: prefix.to_owned(),
        count: keys.len(),
        first: keys
            .first()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .unwrap_or_default(),
    }
}

/// `todo` cut into transactions: at most `max_ops - 1` puts each (one op is the marker's),
/// and at most [`MAX_BATCH_BYTES`] of keys and values.
pub(crate) fn batches(todo: &[Row], max_ops: usize) -> Vec<&[Row]> {
    let per = max_ops.saturating_sub(1).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < todo.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < todo.len() && end - start < per {
            let size = todo[end].0.len() + todo[end].1.len();
            if end > start && bytes + size > MAX_BATCH_BYTES {
                break;
            }
            bytes += size;
            end += 1;
        }
        out.push(&todo[start..end]);
        start = end;
    }
    out
}

/// Copy the redb store in `source` into the etcd `cfg` names, checked and resumable; see
/// the module doc. The source stays open (its lock held) throughout, so no serve can start
/// on it meanwhile.
pub fn migrate(
    source: &Path,
    cfg: &EtcdConfig,
    opts: MigrateOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<MigrateReport, MigrateError> {
    if !crate::store::store_path(source).is_file() {
        return Err(MigrateError::NoSource(source.to_owned()));
    }
    let redb = match RedbStore::open(source) {
        Ok(s) => s,
        Err(StoreError::Locked { .. }) => return Err(MigrateError::SourceInUse(source.into())),
        Err(e) => return Err(e.into()),
    };
    let export = redb.export_json()?;
    let plan = MigratePlan::from_export(&export, &cfg.cluster)?;
    let etcd = EtcdStore::open(cfg)?;
    let (existing, marker, marker_rev) = read_prefix(&etcd)?;
    let Start {
        marker,
        todo,
        skipped,
    } = decide(&plan, &etcd.keys.root(), &existing, marker)?;
    let mut marker = marker.unwrap_or(Marker {
        fingerprint: plan.fingerprint.clone(),
        source: source.display().to_string(),
        copied: 0,
        complete: false,
    });
    let mut rev = marker_rev;
    let mut report = MigrateReport {
        tables: BTreeMap::new(),
        written: 0,
        skipped,
        batches: 0,
        stopped: false,
    };
    let all = batches(&todo, etcd.max_ops);
    for batch in &all {
        if opts.stop_after == Some(report.batches) {
            report.stopped = true;
            return Ok(report);
        }
        marker.copied += batch.len();
        rev = commit_batch(&etcd, batch, &marker, rev)?;
        report.written += batch.len();
        report.batches += 1;
        progress(report.batches, all.len());
    }
    report.tables = verify(&etcd, &cfg.cluster, &plan, &export)?;
    marker.complete = true;
    commit_batch(&etcd, &[], &marker, rev)?;
    Ok(report)
}

/// Every key under the prefix but the schema version and the marker, the marker, and the
/// marker's mod revision (0: none).
fn read_prefix(etcd: &EtcdStore) -> Result<(Rows, Option<Marker>, i64), MigrateError> {
    let root = etcd.keys.root().into_bytes();
    let kvs = etcd.get_prefix("read the prefix", root)?;
    let (marker_key, schema) = (marker_key(&etcd.keys), etcd.keys.schema());
    let mut existing = BTreeMap::new();
    let (mut marker, mut rev) = (None, 0);
    for kv in kvs {
        if kv.key() == marker_key.as_slice() {
            rev = kv.mod_revision();
            marker =
                Some(serde_json::from_slice(kv.value()).map_err(|e| {
                    etcd.data_err(String::from_utf8_lossy(&marker_key), e.to_string())
                })?);
        } else if kv.key() != schema.as_slice() {
            let (k, v) = kv.into_key_value();
            existing.insert(k, v);
        }
    }
    Ok((existing, marker, rev))
}

/// One transaction: if the marker is still at `rev` and every key of `batch` absent, put
/// them and the marker. Returns the marker's new revision.
fn commit_batch(
    etcd: &EtcdStore,
    batch: &[Row],
    marker: &Marker,
    rev: i64,
) -> Result<i64, MigrateError> {
    let key = marker_key(&etcd.keys);
    let value = serde_json::to_vec(marker).map_err(|source| StoreError::Encode {
        what: "the migration marker".into(),
        source,
    })?;
    // A missing key's create/mod revision compares as 0 (v3.4.23 etcdserver/apply.go
    // applyCompare), so "marker at rev" covers "no marker yet" with rev 0.
    let mut compares = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)];
    let mut ops = vec![TxnOp::put(key.clone(), value, None)];
    for (k, v) in batch {
        compares.push(Compare::create_revision(k.clone(), CompareOp::Equal, 0));
        ops.push(TxnOp::put(k.clone(), v.clone(), None));
    }
    let txn = Txn::new().when(compares).and_then(ops);
    let resp = etcd.call("migrate a batch", txn, |mut c, txn| async move {
        c.txn(txn).await
    })?;
    if !resp.succeeded() {
        return Err(MigrateError::Conflict {
            key: String::from_utf8_lossy(&key).into_owned(),
        });
    }
    Ok(resp.header().map_or(0, |h| h.revision()))
}

/// Read the prefix back: every table's count and digest equal the plan's, and the etcd
/// store's export equals the source's.
fn verify(
    etcd: &EtcdStore,
    cluster: &str,
    plan: &MigratePlan,
    export: &Value,
) -> Result<BTreeMap<String, TableSummary>, MigrateError> {
    let want = summarize(
        cluster,
        plan.rows.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
    );
    let kvs = etcd.get_prefix("read back", etcd.keys.root().into_bytes())?;
    let have = summarize(cluster, kvs.iter().map(|kv| (kv.key(), kv.value())));
    for table in want.keys().chain(have.keys()) {
        if want.get(table) != have.get(table) {
            return Err(MigrateError::Mismatch {
                table: table.clone(),
                detail: format!("source {:?}, etcd {:?}", want.get(table), have.get(table)),
            });
        }
    }
    // The same state read through both backends' own readers.
    let theirs = etcd.export_json()?;
    if &theirs != export {
        let differs = ["leases", "nodes", "events", "cluster_meta", "rollouts"]
            .into_iter()
            .find(|t| theirs.get(t) != export.get(t))
            .unwrap_or("export");
        return Err(MigrateError::Mismatch {
            table: differs.to_owned(),
            detail: "the etcd store reads it back differently".into(),
        });
    }
    Ok(have)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_values_decode_from_text_or_hex() {
        assert_eq!(
            opaque(&serde_json::json!({"text": "ab"})),
            Some(b"ab".to_vec())
        );
        assert_eq!(
            opaque(&serde_json::json!({"hex": "00ff"})),
            Some(vec![0, 255])
        );
        assert_eq!(opaque(&serde_json::json!({"hex": "0"})), None);
        assert_eq!(opaque(&serde_json::json!(3)), None);
    }

    #[test]
    fn batches_hold_at_most_max_ops_minus_the_marker_and_keep_order() {
        let todo: Vec<Row> = (0..300u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![1]))
            .collect();
        let b = batches(&todo, 128);
        assert_eq!(
            b.iter().map(|b| b.len()).collect::<Vec<_>>(),
            [127, 127, 46]
        );
        assert_eq!(b.concat(), todo);
        let big: Vec<Row> = (0..3u8).map(|i| (vec![i], vec![0; 600_000])).collect();
        assert_eq!(batches(&big, 128).len(), 3);
    }
}
