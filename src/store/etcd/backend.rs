//! [`Store`] and [`Backend`] over etcd: reads are linearizable gets, writes the transactions
//! the parent module's doc describes.

use std::net::Ipv4Addr;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use serde_json::{Map, Value};

use super::EtcdStore;
use super::keys::{self, Keys};
use super::plan::{self, Plan, PlanError, Planner, View};
use crate::inventory::Mac;
use crate::store::writers::Backend;
use crate::store::{
    CasOutcome, ClusterTable, Event, Lease, LeaseCommit, LeaseState, NewEvent, NodePart,
    NodeRecord, NodeWrite, Result, Store, StoreError,
};

/// How often an append re-plans after another writer moved an event head under it.
const HEAD_RETRIES: usize = 16;

/// The key-values of the first get of a transaction's responses.
pub(super) fn first_get(resp: &etcd_client::TxnResponse) -> Option<Vec<KeyValue>> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
        _ => None,
    })
}

impl EtcdStore {
    /// The address a MAC index entry names.
    fn indexed_ip(&self, kv: &KeyValue) -> Result<Ipv4Addr> {
        std::str::from_utf8(kv.value())
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.data_err(String::from_utf8_lossy(kv.key()), "not an address"))
    }

    fn get(&self, op: &'static str, key: Vec<u8>) -> Result<Option<KeyValue>> {
        self.call(op, key, |mut c, key| async move {
            let mut resp = c.get(key, None).await?;
            Ok(resp.take_kvs().into_iter().next())
        })
    }

    fn value(&self, op: &'static str, key: Vec<u8>) -> Result<Option<Vec<u8>>> {
        Ok(self.get(op, key)?.map(|kv| kv.into_key_value().1))
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, key: &[u8], bytes: &[u8]) -> Result<T> {
        plan::decode(key, bytes).map_err(|e| self.plan_err(e))
    }

    fn plan_err(&self, e: PlanError) -> StoreError {
        match e {
            PlanError::Corrupt { key, cause } => self.data_err(key, cause),
            PlanError::Encode { what, source } => StoreError::Encode { what, source },
            e @ PlanError::TooLarge { .. } => self.data_err(self.keys.root(), e.to_string()),
        }
    }

    /// Puts (`None`: delete) in transactions of at most `max_ops` operations, each atomic;
    /// when `fenced`, each carries the leader's fence ([`super::fence`]) and one refused
    /// ends the call with [`StoreError::Fenced`], that transaction written in nothing.
    fn put_all(
        &self,
        op: &'static str,
        writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        fenced: bool,
    ) -> Result<()> {
        for chunk in writes.chunks(self.max_ops) {
            // Read per transaction: a fence dropped between two chunks stops the rest.
            let fence = if fenced {
                self.fence_compare(op)?
            } else {
                None
            };
            let compares: Vec<Compare> = fence.iter().map(|f| f.compare()).collect();
            let ops: Vec<TxnOp> = chunk.iter().map(|(k, v)| txn_op(k, v)).collect();
            let txn = Txn::new().when(compares).and_then(ops);
            let resp = self.call(op, txn, |mut c, txn| async move { c.txn(txn).await })?;
            // Without compares a transaction always succeeds; with the fence, failing means
            // the leader key is gone or was created again: another leadership.
            if !resp.succeeded() {
                return Err(self.fenced(op));
            }
        }
        Ok(())
    }

    /// The event heads of every node `groups` append to, as etcd has them now.
    fn read_heads(&self, groups: &[LeaseCommit]) -> Result<View> {
        let mut nodes: Vec<&str> = groups
            .iter()
            .flat_map(|g| g.events.iter().map(|e| e.node.as_str()))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        let mut heads = View::new();
        for chunk in nodes.chunks(self.max_ops) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|n| TxnOp::get(self.keys.event_head(n), None))
                .collect();
            let resp = self.call("read event heads", ops, |mut c, ops| async move {
                c.txn(Txn::new().and_then(ops)).await
            })?;
            for r in resp.op_responses() {
                if let TxnOpResponse::Get(g) = r {
                    for kv in g.kvs() {
                        heads.insert(kv.key().to_vec(), (kv.mod_revision(), kv.value().to_vec()));
                    }
                }
            }
        }
        Ok(heads)
    }

    /// Commit `groups` (lease changes and events) in as few transactions as the op limit
    /// allows; returns the events' sequence numbers.
    fn commit_groups(&self, mut groups: &[LeaseCommit]) -> Result<Vec<u64>> {
        let total = groups.len();
        let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        let mut seqs = Vec::new();
        while !groups.is_empty() {
            let mut attempt = 0;
            let (plan, revision) = loop {
                let heads = self.read_heads(groups)?;
                let planner = Planner {
                    keys: &self.keys,
                    leases: &leases,
                    heads: &heads,
                    max_ops: self.max_ops,
                };
                let plan = planner.plan(groups).map_err(|e| self.plan_err(e))?;
                match self.run_plan(&plan)? {
                    Ok(revision) => break (plan, revision),
                    Err(moved) => {
                        if let Some(key) = moved.iter().find(|k| !is_head(&self.keys, k)) {
                            return Err(StoreError::EtcdConflict {
                                endpoints: self.named.clone(),
                                key: String::from_utf8_lossy(key).into_owned(),
                                committed: total - groups.len(),
                            });
                        }
                        attempt += 1;
                        if attempt >= HEAD_RETRIES {
                            return Err(self.data_err(
                                String::from_utf8_lossy(&moved[0]).into_owned(),
                                "event head kept moving under this appender; gave up",
                            ));
                        }
                    }
                }
            };
            for (key, value) in &plan.writes {
                if key.starts_with(&self.keys.leases()) {
                    match value {
                        Some(v) => leases.insert(key.clone(), (revision, v.clone())),
                        None => leases.remove(key),
                    };
                }
            }
            seqs.extend(&plan.seqs);
            groups = &groups[plan.groups..];
        }
        Ok(seqs)
    }

    /// One plan as one transaction: `Ok(revision)` once committed, `Err(keys)` naming the
    /// compared keys that moved when the compare failed (nothing written).
    fn run_plan(&self, plan: &Plan) -> Result<std::result::Result<i64, Vec<Vec<u8>>>> {
        let compares: Vec<Compare> = plan
            .expect
            .iter()
            .map(|(k, rev)| Compare::mod_revision(k.clone(), CompareOp::Equal, *rev))
            .collect();
        let ops: Vec<TxnOp> = plan.writes.iter().map(|(k, v)| txn_op(k, v)).collect();
        let reads: Vec<TxnOp> = plan
            .expect
            .keys()
            .map(|k| TxnOp::get(k.clone(), Some(GetOptions::new().with_keys_only())))
            .collect();
        let txn = Txn::new().when(compares).and_then(ops).or_else(reads);
        let resp = match self.call("commit", txn, |mut c, txn| async move { c.txn(txn).await }) {
            Ok(resp) => resp,
            // A timeout or a lost answer may hide a commit etcd applied: read the keys
            // back, and take it as committed only when they show exactly this plan.
            Err(e) => return self.applied_anyway(plan).map(Ok).ok_or(e),
        };
        if resp.succeeded() {
            // Every key a transaction writes gets its one revision, the header's
            // (`storeTxnWrite.put`, `mvcc/kvstore_txn.go` at v3.4.23).
            return Ok(Ok(resp.header().map_or(0, |h| h.revision())));
        }
        let now: Vec<i64> = resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().first().map_or(0, |kv| kv.mod_revision()),
                _ => 0,
            })
            .collect();
        let moved = plan
            .expect
            .iter()
            .zip(now)
            .filter(|((_, want), now)| *want != now)
            .map(|((k, _), _)| k.clone())
            .collect();
        Ok(Err(moved))
    }

    /// The revision `plan` was applied at, when its keys read back show it applied after
    /// its commit errored (see [`plan::applied`]); `None` when they do not, or cannot be read.
    fn applied_anyway(&self, plan: &Plan) -> Option<i64> {
        let ops: Vec<TxnOp> = plan
            .writes
            .keys()
            .map(|k| TxnOp::get(k.clone(), None))
            .collect();
        let resp = self
            .call("read back a commit", ops, |mut c, ops| async move {
                c.txn(Txn::new().and_then(ops)).await
            })
            .ok()?;
        let now: Vec<Option<(i64, Vec<u8>)>> = resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| (kv.mod_revision(), kv.value().to_vec())),
                _ => None,
            })
            .collect();
        plan::applied(plan, &now)
    }

    /// Compare-and-set of one key; when `fenced`, the leader's fence is compared too, and a
    /// fence that no longer holds is [`StoreError::Fenced`] whatever the value.
    fn cas(
        &self,
        key: Vec<u8>,
        expected: Option<&[u8]>,
        new: &[u8],
        fenced: bool,
    ) -> Result<CasOutcome> {
        const OP: &str = "compare and set";
        let fence = if fenced {
            self.fence_compare(OP)?
        } else {
            None
        };
        let mut compares = vec![match expected {
            Some(v) => Compare::value(key.clone(), CompareOp::Equal, v.to_vec()),
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
        }];
        let mut reads = vec![TxnOp::get(key.clone(), None)];
        if let Some(f) = &fence {
            compares.push(f.compare());
            reads.push(TxnOp::get(f.key.clone(), None));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::put(key, new.to_vec(), None)])
            .or_else(reads);
        let resp = self.call(OP, txn, |mut c, txn| async move { c.txn(txn).await })?;
        if resp.succeeded() {
            return Ok(CasOutcome::Swapped);
        }
        let gets: Vec<Option<KeyValue>> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
                _ => None,
            })
            .collect();
        if let Some(f) = &fence {
            let now = gets
                .get(1)
                .cloned()
                .flatten()
                .map(|kv| kv.create_revision());
            if now != Some(f.revision) {
                return Err(self.fenced(OP));
            }
        }
        let current = gets
            .first()
            .cloned()
            .flatten()
            .map(|kv| kv.value().to_vec());
        Ok(CasOutcome::Mismatch { current })
    }

    fn json_rows(&self, kvs: &[(String, &KeyValue)]) -> Result<Map<String, Value>> {
        let mut rows = Map::new();
        for (name, kv) in kvs {
            rows.insert(name.clone(), self.decode(kv.key(), kv.value())?);
        }
        Ok(rows)
    }
}

fn txn_op(key: &[u8], value: &Option<Vec<u8>>) -> TxnOp {
    match value {
        Some(v) => TxnOp::put(key.to_vec(), v.clone(), None),
        None => TxnOp::delete(key.to_vec(), None),
    }
}

/// Whether `table` is the leader's to write ([`super::fence`]): cluster progress is, pull
/// tokens are every appliance's.
fn fenced_table(table: ClusterTable) -> bool {
    match table {
        ClusterTable::Progress => true,
        ClusterTable::PullTokens => false,
    }
}

fn is_head(keys: &Keys, key: &[u8]) -> bool {
    key.starts_with(&keys.event_head(""))
}

impl Store for EtcdStore {
    /// From the lease keys this store keeps ([`View`]): its commits put every key they
    /// write there at the commit's revision before returning, and the lease feed adds the
    /// peers' changes, so right after a commit they hold what etcd holds for its keys (up to
    /// a peer's change the feed has not delivered yet, which the next commit touching the key
    /// learns by conflict). Reading etcd instead cost two round trips per MAC and one per
    /// address, serially: more than the commit.
    fn settled_leases(
        &self,
        macs: &[Mac],
        ips: &[Ipv4Addr],
    ) -> Result<crate::store::SettledLeases> {
        let view = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        let record = |ip: Ipv4Addr| -> Result<Option<Lease>> {
            let key = self.keys.lease_ip(ip);
            view.get(&key)
                .map(|(_, v)| self.decode::<Lease>(&key, v))
                .transpose()
        };
        let mut settled = crate::store::SettledLeases::default();
        for &mac in macs {
            let Some((_, ip)) = view.get(&self.keys.lease_mac(mac)) else {
                continue;
            };
            let ip = std::str::from_utf8(ip)
                .ok()
                .and_then(|s| s.parse::<Ipv4Addr>().ok())
                .ok_or_else(|| {
                    self.data_err(
                        String::from_utf8_lossy(&self.keys.lease_mac(mac)),
                        "not an address",
                    )
                })?;
            // The index and the record disagree in this view only while a peer's change is
            // half-delivered; nothing is published for it until the next commit.
            if let Some(l) = record(ip)?.filter(|l| l.mac == mac && l.state != LeaseState::Declined)
            {
                settled.leases.push(l);
            }
        }
        for &ip in ips {
            if let Some(l) = record(ip)? {
                settled.holders.push((ip, l.mac));
            }
        }
        Ok(settled)
    }

    fn lease(&self, mac: Mac) -> Result<Option<Lease>> {
        let index = self.keys.lease_mac(mac);
        // The index, then index and record together in one transaction (one revision),
        // again if the index moved in between: never a record the index did not name, and
        // no read at an old revision, which compaction may have removed.
        for _ in 0..HEAD_RETRIES {
            let Some(kv) = self.get("read lease", index.clone())? else {
                return Ok(None);
            };
            let ip = self.indexed_ip(&kv)?;
            let record = self.keys.lease_ip(ip);
            let ops = [
                TxnOp::get(index.clone(), None),
                TxnOp::get(record.clone(), None),
            ];
            let resp = self.call("read lease", ops.to_vec(), |mut c, ops| async move {
                c.txn(Txn::new().and_then(ops)).await
            })?;
            let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
                _ => None,
            });
            let (now_index, now_record) = (gets.next().flatten(), gets.next().flatten());
            let Some(now_index) = now_index else {
                return Ok(None);
            };
            if now_index.value() != kv.value() {
                continue;
            }
            return match now_record {
                Some(r) => self.decode(&record, r.value()).map(Some),
                None => Err(self.data_err(
                    String::from_utf8_lossy(&index),
                    format!("names {ip}, but no lease record exists there"),
                )),
            };
        }
        Err(self.data_err(
            String::from_utf8_lossy(&index),
            "kept moving while it was read; gave up",
        ))
    }

    fn lease_by_ip(&self, ip: Ipv4Addr) -> Result<Option<Lease>> {
        let key = self.keys.lease_ip(ip);
        match self.value("read lease", key.clone())? {
            Some(v) => self.decode(&key, &v).map(Some),
            None => Ok(None),
        }
    }

    fn leases(&self) -> Result<Vec<Lease>> {
        let kvs = self.get_prefix("read leases", self.keys.lease_ips())?;
        kvs.iter()
            .map(|kv| self.decode(kv.key(), kv.value()))
            .collect()
    }

    fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        let key = self.keys.node(name);
        match self.value("read node", key.clone())? {
            Some(v) => self.decode(&key, &v).map(Some),
            None => Ok(None),
        }
    }

    fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let kvs = self.get_prefix("read nodes", self.keys.nodes())?;
        kvs.iter()
            .map(|kv| self.decode(kv.key(), kv.value()))
            .collect()
    }

    fn node_part(&self, name: &str, part: NodePart) -> Result<Option<Vec<u8>>> {
        self.value("read node part", self.keys.part(part, name))
    }

    fn events(&self, node: &str, since_seq: u64, limit: usize) -> Result<Vec<Event>> {
        let Some(first) = since_seq.checked_add(1) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let from = self.keys.event(node, first);
        let end = keys::prefix_end(&self.keys.events_of(node));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let kvs = self.call(
            "read events",
            (from, end),
            move |mut c, (from, end)| async move {
                let opts = GetOptions::new().with_range(end).with_limit(limit);
                let mut resp = c.get(from, Some(opts)).await?;
                Ok(resp.take_kvs())
            },
        )?;
        kvs.iter()
            .map(|kv| self.decode(kv.key(), kv.value()))
            .collect()
    }

    fn last_event(&self, node: &str) -> Result<Option<Event>> {
        let key = self.keys.event_head(node);
        match self.value("read events", key.clone())? {
            Some(v) => self.decode(&key, &v).map(Some),
            None => Ok(None),
        }
    }

    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.value("read cluster_meta", self.keys.meta(key))
    }

    fn row(&self, table: ClusterTable, key: &str) -> Result<Option<Vec<u8>>> {
        self.value("read row", self.keys.row(table, key))
    }

    fn rollout(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.value("read rollout", self.keys.rollout(key))
    }

    fn rollout_keys(&self) -> Result<Vec<String>> {
        let prefix = self.keys.rollouts();
        let kvs = self.call("read rollouts", prefix, |mut c, prefix| async move {
            let end = keys::prefix_end(&prefix);
            let opts = GetOptions::new().with_range(end).with_keys_only();
            let mut resp = c.get(prefix, Some(opts)).await?;
            Ok(resp.take_kvs())
        })?;
        let root = String::from_utf8_lossy(&self.keys.rollouts()).into_owned();
        Ok(kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key())[root.len()..].to_owned())
            .collect())
    }

    fn export_json(&self) -> Result<Value> {
        // One range read: a snapshot at one revision, as redb's one read transaction.
        let kvs = self.get_prefix("export", self.keys.root().into_bytes())?;
        let mut tables: std::collections::BTreeMap<&str, Vec<(String, &KeyValue)>> =
            Default::default();
        let names: Vec<String> = kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        for (name, kv) in names.iter().zip(&kvs) {
            if let Some((table, rest)) = self.keys.split(name) {
                tables.entry(table).or_default().push((rest.to_owned(), kv));
            }
        }
        let table = |t: &str| tables.get(t).cloned().unwrap_or_default();
        let schema = table("schema_version")
            .first()
            .and_then(|(_, kv)| std::str::from_utf8(kv.value()).ok()?.parse::<u64>().ok());
        let list = |rows: Vec<(String, &KeyValue)>| -> Result<Vec<Value>> {
            rows.iter()
                .map(|(_, kv)| self.decode(kv.key(), kv.value()))
                .collect()
        };
        let leases = list(
            table("leases")
                .into_iter()
                .filter(|(rest, _)| rest.starts_with("ip/"))
                .collect(),
        )?;
        Ok(serde_json::json!({
            "schema_version": schema,
            "leases": leases,
            "nodes": list(table("nodes"))?,
            "events": list(table("events"))?,
            "cluster_meta": opaque(&table("cluster_meta")),
            "node_facts": self.json_rows(&table("node_facts"))?,
            "node_lifecycle": self.json_rows(&table("node_lifecycle"))?,
            "cluster_progress": opaque(&table("cluster_progress")),
            "pull_tokens": self.json_rows(&table("pull_tokens"))?,
            "rollouts": self.json_rows(&table("rollouts"))?,
        }))
    }
}

/// Opaque bytes by key, exported as redb's export does: text when UTF-8, else tagged hex.
fn opaque(rows: &[(String, &KeyValue)]) -> Map<String, Value> {
    rows.iter()
        .map(|(k, kv)| {
            let v = match std::str::from_utf8(kv.value()) {
                Ok(text) => serde_json::json!({ "text": text }),
                Err(_) => serde_json::json!({ "hex": crate::hex::lower(kv.value()) }),
            };
            (k.clone(), v)
        })
        .collect()
}

impl Backend for EtcdStore {
    /// `durable` is moot: every etcd commit is on a quorum's disks when it returns.
    fn commit_leases(&self, groups: &[LeaseCommit], _durable: bool) -> Result<()> {
        self.commit_groups(groups).map(|_| ())
    }

    fn put_node_states(&self, writes: &[NodeWrite]) -> Result<()> {
        let mut puts = Vec::new();
        for w in writes {
            if let Some(r) = &w.record {
                let bytes = serde_json::to_vec(r).map_err(|source| StoreError::Encode {
                    what: format!("node record {}", r.name),
                    source,
                })?;
                puts.push((self.keys.node(&w.name), Some(bytes)));
            }
            for (part, value) in &w.parts {
                puts.push((self.keys.part(*part, &w.name), Some(value.clone())));
            }
        }
        self.put_all("write nodes", puts, true)
    }

    fn append_events(&self, events: &[NewEvent]) -> Result<Vec<u64>> {
        let group = LeaseCommit {
            writes: Vec::new(),
            events: events.to_vec(),
        };
        // One group may not be split; a burst of events may, one event per group.
        let groups: Vec<LeaseCommit> = if events.len() * 2 > self.max_ops {
            events
                .iter()
                .map(|e| LeaseCommit {
                    writes: Vec::new(),
                    events: vec![e.clone()],
                })
                .collect()
        } else {
            vec![group]
        };
        self.commit_groups(&groups)
    }

    fn put_metas(&self, entries: &[(String, Vec<u8>)]) -> Result<()> {
        let puts = entries
            .iter()
            .map(|(k, v)| (self.keys.meta(k), Some(v.clone())))
            .collect();
        self.put_all("write cluster_meta", puts, false)
    }

    #[cfg(test)]
    fn compare_and_set_meta(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<CasOutcome> {
        self.cas(self.keys.meta(key), expected, new, false)
    }

    fn put_rows(&self, table: ClusterTable, entries: &[(String, Vec<u8>)]) -> Result<()> {
        let puts = entries
            .iter()
            .map(|(k, v)| (self.keys.row(table, k), Some(v.clone())))
            .collect();
        self.put_all("write rows", puts, fenced_table(table))
    }

    fn compare_and_set_row(
        &self,
        table: ClusterTable,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<CasOutcome> {
        self.cas(
            self.keys.row(table, key),
            expected,
            new,
            fenced_table(table),
        )
    }

    fn put_rollout(&self, key: &str, value: &[u8]) -> Result<()> {
        self.put_all(
            "write rollout",
            vec![(self.keys.rollout(key), Some(value.to_vec()))],
            true,
        )
    }
}
