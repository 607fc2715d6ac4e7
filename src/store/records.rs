//! Record types the state store persists: leases, node records and timeline events.
//!
//! Values are stored as JSON so that a later talboot can add fields (with serde defaults)
//! without a schema bump, and unknown fields written by a newer build of the same schema
//! version are ignored rather than rejected. Keys are typed by the backend, not here.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::inventory::Mac;

/// State of one address record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Offered in a DHCPOFFER and held for the client until it expires.
    Offered,
    /// Bound by a DHCPACK until it expires.
    Bound,
    /// Given back (RELEASE) or lapsed; kept so the same MAC gets the same address again.
    Released,
    /// Declined (address conflict on the wire): quarantined, nobody gets it until it expires.
    Declined,
}

impl LeaseState {
    /// Stable lowercase name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Offered => "offered",
            Self::Bound => "bound",
            Self::Released => "released",
            Self::Declined => "declined",
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One address record: the one lease type, decided by the DHCP lease book
/// (`dhcp::leases::LeaseBook`) and persisted here as it is (its JSON shape is the stored one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The client it was (or is) leased to; for a declined address, the client that
    /// declined it.
    pub mac: Mac,
    /// The address.
    pub ip: Ipv4Addr,
    /// The inventory name of the client, when it has one.
    pub hostname: Option<String>,
    /// Current state.
    pub state: LeaseState,
    /// When the offer, binding or quarantine ends (for `Released`, when it was released),
    /// seconds since the Unix epoch.
    pub expires_at_unix: u64,
    /// When the book last changed this record, seconds since the Unix epoch.
    pub updated_at_unix: u64,
}

impl Lease {
    /// When the offer, binding or quarantine ends.
    pub(crate) fn expires(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.expires_at_unix)
    }

    /// Offered or bound and not yet expired at `now`.
    pub(crate) fn is_held(&self, now: SystemTime) -> bool {
        matches!(self.state, LeaseState::Offered | LeaseState::Bound) && self.expires() > now
    }

    /// Quarantined and the quarantine has not ended at `now`.
    pub(crate) fn is_quarantined(&self, now: SystemTime) -> bool {
        self.state == LeaseState::Declined && self.expires() > now
    }

    /// Whether this record keeps its address from being given to another client at
    /// `now_unix`: any state but released, until it expires (for `Declined` that is the end
    /// of the quarantine).
    pub(crate) fn holds_address(&self, now_unix: u64) -> bool {
        self.state != LeaseState::Released && self.expires_at_unix > now_unix
    }
}

/// One record change: what the DHCP lease book decided, and what the store writes as it is
/// (the store's [`LeaseCommit`](crate::store::LeaseCommit) carries these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseChange {
    /// Insert or replace the record for `lease.ip`.
    Upsert(Lease),
    /// Delete the record for this address.
    Remove(Ipv4Addr),
}

/// Provisioning phase of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodePhase {
    /// Known from the inventory, nothing observed yet.
    Unknown,
    /// Seen on the network, fetching boot artifacts.
    Booting,
    /// Talos is up in maintenance mode, waiting for a config.
    Maintenance,
    /// A machine config is being delivered.
    Configuring,
    /// Talos is installing to disk.
    Installing,
    /// Installed and running with its config.
    Ready,
    /// Marked for rebuild; will be reset and provisioned again.
    Rebuilding,
    /// A step failed; see the node's events.
    Failed,
}

impl NodePhase {
    /// Lower-case name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Booting => "booting",
            Self::Maintenance => "maintenance",
            Self::Configuring => "configuring",
            Self::Installing => "installing",
            Self::Ready => "ready",
            Self::Rebuilding => "rebuilding",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for NodePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What talboot last knew about one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Node name from the inventory (the key).
    pub name: String,
    /// Current phase.
    pub phase: NodePhase,
    /// When the node entered `phase`, seconds since the Unix epoch.
    pub phase_since_unix: u64,
    /// The address the node was last seen at (DHCP lease, HTTP fetch, API probe).
    pub last_seen_addr: Option<Ipv4Addr>,
    /// The MAC the node booted with, when observed.
    pub mac: Option<Mac>,
    /// Talos version reported by the node.
    pub talos_version: Option<String>,
    /// Whether the node may receive its machine config (new, or marked for rebuild).
    pub provisioning_window_open: bool,
    /// When this record was last written, seconds since the Unix epoch.
    pub updated_at_unix: u64,
}

impl NodeRecord {
    /// A node never seen before: Unknown, with its provisioning window open (a new node may
    /// receive its config).
    pub fn unseen(name: &str, now_unix: u64) -> Self {
        Self {
            name: name.to_owned(),
            phase: NodePhase::Unknown,
            phase_since_unix: now_unix,
            last_seen_addr: None,
            mac: None,
            talos_version: None,
            provisioning_window_open: true,
            updated_at_unix: now_unix,
        }
    }
}

/// One entry of a node's append-only timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the node's timeline: 1 for the first event, then +1, never reused.
    pub(crate) seq: u64,
    /// When it happened, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Node name the event belongs to.
    pub node: String,
    /// Short machine-readable kind, e.g. `dhcp.offer`.
    pub kind: String,
    /// Human-readable detail.
    pub detail: String,
    /// How many times it happened in a row: the same kind and detail appended again right
    /// after it is folded into it (a node that is off fails the same probe on every poll).
    /// Absent in rows written before folding existed, which count once.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u32,
    /// When the last folded repeat happened (milliseconds since the Unix epoch); absent
    /// while `count` is 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_at_unix_ms: Option<u64>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Event {
    /// The detail with the repeat count, as timelines show it: `detail (x3, last at ...)`.
    pub(crate) fn display_detail(&self) -> String {
        if self.count > 1 {
            format!("{} (x{})", self.detail, self.count)
        } else {
            self.detail.clone()
        }
    }
}

/// Result of a compare-and-set ([`ProgressWriter::compare_and_set_row`](super::ProgressWriter::compare_and_set_row)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    /// The stored value matched and was replaced.
    Swapped,
    /// The stored value did not match; nothing was written. Carries what is stored.
    Mismatch {
        /// The value found (None when the key is absent).
        current: Option<Vec<u8>>,
    },
}

impl CasOutcome {
    /// True when the write happened.
    pub(crate) fn is_swapped(&self) -> bool {
        matches!(self, Self::Swapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_json_shape_and_round_trip() {
        let lease = Lease {
            mac: "aa:bb:cc:dd:ee:01".parse().unwrap(),
            ip: Ipv4Addr::new(10, 0, 0, 5),
            hostname: Some("cp1".into()),
            state: LeaseState::Bound,
            expires_at_unix: 2000,
            updated_at_unix: 1000,
        };
        let v = serde_json::to_value(&lease).unwrap();
        assert_eq!(v["mac"], "aa:bb:cc:dd:ee:01");
        assert_eq!(v["ip"], "10.0.0.5");
        assert_eq!(v["state"], "bound");
        let back: Lease = serde_json::from_value(v).unwrap();
        assert_eq!(back, lease);
    }

    #[test]
    fn records_tolerate_unknown_and_missing_optional_fields() {
        // A record written by a build that added a field, and without the optional ones.
        let json = r#"{"name":"w1","phase":"installing","phase_since_unix":5,
            "provisioning_window_open":true,"updated_at_unix":6,"added_later":42}"#;
        let rec: NodeRecord = serde_json::from_str(json).unwrap();
        assert_eq!(rec.phase, NodePhase::Installing);
        assert_eq!(rec.last_seen_addr, None);
        assert_eq!(rec.mac, None);
        assert!(rec.provisioning_window_open);
    }

    #[test]
    fn holds_address_by_state_and_expiry() {
        let mut lease = Lease {
            mac: Mac([2, 0, 0, 0, 0, 1]),
            ip: Ipv4Addr::new(10, 0, 0, 9),
            hostname: None,
            state: LeaseState::Declined,
            expires_at_unix: 100,
            updated_at_unix: 0,
        };
        assert!(lease.holds_address(99));
        assert!(!lease.holds_address(100));
        lease.state = LeaseState::Released;
        assert!(!lease.holds_address(0));
        lease.state = LeaseState::Offered;
        assert!(lease.holds_address(0));
    }

    #[test]
    fn phase_names_match_serde() {
        for p in [
            NodePhase::Unknown,
            NodePhase::Booting,
            NodePhase::Maintenance,
            NodePhase::Configuring,
            NodePhase::Installing,
            NodePhase::Ready,
            NodePhase::Rebuilding,
            NodePhase::Failed,
        ] {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        for s in [
            LeaseState::Offered,
            LeaseState::Bound,
            LeaseState::Released,
            LeaseState::Declined,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }
}
