//! The drift board: each node's drift as serve's drift watcher last saw it, and the configs
//! applied through serve. It is part of the read view (not of `daytwo`) so that the request
//! paths can read it next to the node records without naming the day-two layer; its writers,
//! the watcher and the apply rollout, are day-two tasks that hold an `Arc` of it.

use std::collections::BTreeMap;
use std::sync::RwLock;

/// A node's last known drift, as the admin API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DriftState {
    pub drifted: bool,
    /// Differences (fields and documents) at the last check; 0 in sync.
    pub changes: usize,
}

/// What serve knows about drift, shared with the admin API: each node's last known state
/// (one writer, the watcher) and the configs applied through serve since it started (one
/// writer, the apply rollout), which replace serve's start-up rendering as the baseline.
#[derive(Debug, Default)]
pub struct DriftBoard {
    inner: RwLock<BoardInner>,
}

#[derive(Debug, Default)]
struct BoardInner {
    state: BTreeMap<String, DriftState>,
    applied: BTreeMap<String, String>,
}

impl DriftBoard {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BoardInner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BoardInner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The node's last known drift (`None`: never read, not configured yet or unreachable).
    pub fn get(&self, node: &str) -> Option<DriftState> {
        self.read().state.get(node).copied()
    }

    pub fn publish(&self, node: &str, state: DriftState) {
        self.write().state.insert(node.to_owned(), state);
    }

    /// `node` was applied `rendered` through serve: drift is measured against it from now on.
    pub(crate) fn set_applied(&self, node: &str, rendered: String) {
        self.write().applied.insert(node.to_owned(), rendered);
    }

    /// The config applied to `node` through serve, if any.
    pub fn applied(&self, node: &str) -> Option<String> {
        self.read().applied.get(node).cloned()
    }
}
