//! Fencing of the leader's writes (issue 28 item 3): while this appliance leads, every write
//! of a table only the leader writes carries `compare(create_revision(leader key) == fence
//! revision)`, so a write made after its leadership ended (its session lease expired and the
//! key with it, or another appliance won) is refused by etcd itself and writes nothing, however
//! late the old leader's task runs. The leader key's create revision is unique to one
//! leadership: a key deleted and put again gets a new one (etcd-io/etcd v3.4.23
//! `mvcc/kvstore_txn.go`, `storeTxnWrite.put`: `c := rev` when the key is new), which is why
//! etcd's own `Election.Proclaim` and `Resign` compare it (`clientv3/concurrency/election.go`).
//!
//! Fenced tables: node records and parts, cluster progress (bootstrap intent and marks, the
//! step record) and rollouts: what the provisioner and day two write, whose writes record the
//! intent and outcome of the non-repeatable Talos calls. Not fenced: leases, ProxyDHCP
//! bindings and events (every appliance's DHCP server and event bus write them), and pull
//! tokens (issued and redeemed by whichever appliance serves the node's HTTP request).
//!
//! A store starts [`FenceState::Off`] (one appliance, or a tool: no election, nothing
//! compared). The appliance's supervisor sets it to [`FenceState::NotLeader`] before it
//! campaigns (fenced writes refused outright), [`FenceState::Held`] once it wins, and back to
//! `NotLeader` when it loses.

use std::sync::RwLock;

use etcd_client::{Compare, CompareOp};

use super::EtcdStore;
use crate::store::{Result, StoreError};

/// One leadership: the leader key and the revision it was created at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The leader key, `/talboot/<cluster>/election/<lease id in hex>`.
    pub key: Vec<u8>,
    /// Its create revision.
    pub revision: i64,
}

impl Fence {
    /// The compare a fenced write carries.
    pub(super) fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.revision)
    }
}

/// Whether and how fenced writes are guarded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FenceState {
    /// No election runs: fenced tables are written as any other.
    #[default]
    Off,
    /// An election runs and this store's appliance does not lead: fenced writes are refused.
    NotLeader,
    /// This appliance leads: fenced writes compare the fence.
    Held(Fence),
}

/// The store's fence, behind a lock the writers read once per transaction.
#[derive(Debug, Default)]
pub(super) struct Fencing(RwLock<FenceState>);

impl Fencing {
    fn get(&self) -> FenceState {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, state: FenceState) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = state;
    }
}

impl EtcdStore {
    /// Set how fenced writes are guarded from now on (see the module doc).
    pub fn set_fence(&self, state: FenceState) {
        self.fencing.set(state);
    }

    /// The fence as it is now.
    pub fn fence(&self) -> FenceState {
        self.fencing.get()
    }

    /// The compare a fenced write `op` must carry now: `None` when fencing is off, an error
    /// (nothing written) when this appliance does not lead.
    pub(super) fn fence_compare(&self, op: &'static str) -> Result<Option<Fence>> {
        match self.fencing.get() {
            FenceState::Off => Ok(None),
            FenceState::Held(f) => Ok(Some(f)),
            FenceState::NotLeader => Err(self.fenced(op)),
        }
    }

    /// The error of a fenced write refused (by this store, or by etcd's compare).
    pub(super) fn fenced(&self, op: &'static str) -> StoreError {
        StoreError::Fenced {
            endpoints: self.named.clone(),
            op,
        }
    }
}
