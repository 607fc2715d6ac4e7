//! The etcd key layout of [`super::EtcdStore`] (see the parent module's doc for the table):
//! pure functions from a record's identity to its key under the store's prefix.

use std::net::Ipv4Addr;

use crate::inventory::Mac;
use crate::store::{ClusterTable, NodePart};

/// Width of an event sequence number in its key: zero-padded so key order is number order.
const SEQ_WIDTH: usize = 20;

/// Keys of one store, all under `prefix` (`/talboot/<cluster>`, no trailing slash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    /// The layout under `/talboot/<cluster>`.
    pub(crate) fn new(cluster: &str) -> Self {
        Self {
            prefix: format!("/talboot/{}", escape(cluster)),
        }
    }

    /// The prefix every key of this store starts with (with its trailing `/`).
    pub(crate) fn root(&self) -> String {
        format!("{}/", self.prefix)
    }

    fn key(&self, rest: std::fmt::Arguments<'_>) -> Vec<u8> {
        format!("{}/{rest}", self.prefix).into_bytes()
    }

    /// The schema version (decimal).
    pub(crate) fn schema(&self) -> Vec<u8> {
        self.key(format_args!("schema_version"))
    }

    /// The record occupying `ip`. Hex of the address, so key order is address order.
    pub(crate) fn lease_ip(&self, ip: Ipv4Addr) -> Vec<u8> {
        self.key(format_args!("leases/ip/{:08x}", u32::from(ip)))
    }

    /// Prefix of every lease record.
    pub(crate) fn lease_ips(&self) -> Vec<u8> {
        self.key(format_args!("leases/ip/"))
    }

    /// The by-MAC index entry of `mac` (value: the dotted address).
    pub(crate) fn lease_mac(&self, mac: Mac) -> Vec<u8> {
        self.key(format_args!("leases/mac/{mac}"))
    }

    /// Prefix of both lease tables.
    pub(crate) fn leases(&self) -> Vec<u8> {
        self.key(format_args!("leases/"))
    }

    /// Node `name`'s record.
    pub(crate) fn node(&self, name: &str) -> Vec<u8> {
        self.key(format_args!("nodes/{name}"))
    }

    /// Prefix of every node record.
    pub(crate) fn nodes(&self) -> Vec<u8> {
        self.key(format_args!("nodes/"))
    }

    /// Node `name`'s `part`.
    pub(crate) fn part(&self, part: NodePart, name: &str) -> Vec<u8> {
        match part {
            NodePart::Facts => self.key(format_args!("node_facts/{name}")),
            NodePart::Lifecycle => self.key(format_args!("node_lifecycle/{name}")),
        }
    }

    /// Event `seq` of `node`'s timeline.
    pub(crate) fn event(&self, node: &str, seq: u64) -> Vec<u8> {
        self.key(format_args!("events/{}/{seq:0SEQ_WIDTH$}", escape(node)))
    }

    /// Prefix of `node`'s timeline. The node name is escaped so that no name's timeline is
    /// a prefix of another's (`cp1/` and `cp1/x/`).
    pub(crate) fn events_of(&self, node: &str) -> Vec<u8> {
        self.key(format_args!("events/{}/", escape(node)))
    }

    /// The newest event of `node` (a copy of its row): what an append compares and
    /// numbers from.
    pub(crate) fn event_head(&self, node: &str) -> Vec<u8> {
        self.key(format_args!("event_head/{node}"))
    }

    /// `cluster_meta`'s `key`.
    pub(crate) fn meta(&self, key: &str) -> Vec<u8> {
        self.key(format_args!("cluster_meta/{key}"))
    }

    /// Row `key` of `table`.
    pub(crate) fn row(&self, table: ClusterTable, key: &str) -> Vec<u8> {
        self.key(format_args!("{}/{key}", table_name(table)))
    }

    /// Rollout `key`.
    pub(crate) fn rollout(&self, key: &str) -> Vec<u8> {
        self.key(format_args!("rollouts/{key}"))
    }

    /// Prefix of every rollout.
    pub(crate) fn rollouts(&self) -> Vec<u8> {
        self.key(format_args!("rollouts/"))
    }

    /// The table and the rest of a key under this prefix (`("nodes", "cp1")`), for exports.
    pub(crate) fn split<'a>(&self, key: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = key.strip_prefix(&self.root())?;
        Some(rest.split_once('/').unwrap_or((rest, "")))
    }
}

/// The table name of `table` in keys and exports (redb's table names).
pub(crate) fn table_name(table: ClusterTable) -> &'static str {
    match table {
        ClusterTable::Progress => "cluster_progress",
        ClusterTable::PullTokens => "pull_tokens",
    }
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (never one of ours): etcd reads "\0" as "to the end of the keyspace".
    vec![0]
}

/// A key segment with `%` and `/` percent-encoded, so it cannot end early or run into the
/// next segment.
fn escape(segment: &str) -> String {
    segment.replace('%', "%25").replace('/', "%2F")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_keys_sort_by_address_and_timelines_do_not_overlap() {
        let k = Keys::new("lab");
        let a = k.lease_ip(Ipv4Addr::new(10, 0, 0, 9));
        let b = k.lease_ip(Ipv4Addr::new(10, 0, 0, 10));
        assert!(a < b);
        assert!(a.starts_with(&k.lease_ips()));
        assert_eq!(
            String::from_utf8(b).unwrap(),
            "/talboot/lab/leases/ip/0a00000a"
        );
        let e = k.event("cp1/x", 3);
        assert!(!e.starts_with(&k.events_of("cp1")));
        assert!(e.starts_with(&k.events_of("cp1/x")));
        assert!(k.event("n", 9) < k.event("n", 10));
    }

    #[test]
    fn prefix_end_is_the_first_key_after_the_prefix() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        let k = Keys::new("c");
        assert_eq!(k.split("/talboot/c/nodes/cp1"), Some(("nodes", "cp1")));
        assert_eq!(
            k.split("/talboot/c/schema_version"),
            Some(("schema_version", ""))
        );
        assert_eq!(k.split("/talboot/d/nodes/cp1"), None);
    }
}
