//! Running a rollout: the driver that carries out what the rolling engine
//! ([`super::rollout`]) asks for through an operation's [`NodeOps`], and [`Persisted`], the
//! one wrapper that loads a rollout's record from the store, resumes it or starts a new one,
//! and writes the record back before every action it leads to. `apply`, `upgrade --talos`
//! and `upgrade --kubernetes` are each a plan (which targets, in which order) and a
//! [`NodeOps`] on top of this, whether the CLI, serve's rollout jobs or the demo runs them.
//!
//! The record is written in one place only ([`Persisted::save`]), so how a rollout record
//! reaches the store is decided there.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::store::{RolloutWriter, StoreError};

use super::rollout::{Action, Event, Gate, Rollout, RolloutError, RolloutRecord};

/// Why a persisted rollout could not be loaded, resumed or driven to an end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be read.
    #[error("store: {0}")]
    Store(StoreError),
    /// The stored record is not a rollout record.
    #[error("stored rollout {key}: unreadable: {source}")]
    Unreadable {
        key: String,
        source: serde_json::Error,
    },
    /// The stored record does not fit this plan (or the plan is not a valid rollout).
    #[error("stored rollout {key}: {source}")]
    Resume { key: String, source: RolloutError },
    /// The rollout ended without an outcome (its record not persisted, a task lost).
    #[error("{0}")]
    Drive(#[from] DriveError<PersistError>),
}

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error("{0}")]
    Store(StoreError),
}

/// A rollout whose record lives in the store under `key`.
pub(crate) struct Persisted<'a> {
    store: &'a RolloutWriter,
    key: String,
}

impl<'a> Persisted<'a> {
    pub fn new(store: &'a RolloutWriter, key: impl Into<String>) -> Self {
        Self {
            store,
            key: key.into(),
        }
    }

    /// The record's store key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The stored record, if there is one.
    pub fn load(&self) -> Result<Option<RolloutRecord>, RunError> {
        let Some(bytes) = self.store.rollout(&self.key).map_err(RunError::Store)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| RunError::Unreadable {
                key: self.key.clone(),
                source,
            })
    }

    /// The engine `make` builds from the stored record (`None`: there is none, start anew),
    /// and whether a stored record was resumed.
    pub(crate) fn resume_or_start(
        &self,
        make: impl FnOnce(Option<RolloutRecord>) -> Result<Rollout, RolloutError>,
    ) -> Result<(Rollout, bool), RunError> {
        let stored = self.load()?;
        let resumed = stored.is_some();
        let rollout = self.engine(make(stored))?;
        Ok((rollout, resumed))
    }

    /// An engine built for this record, or why it could not be.
    pub fn engine(&self, made: Result<Rollout, RolloutError>) -> Result<Rollout, RunError> {
        made.map_err(|source| RunError::Resume {
            key: self.key.clone(),
            source,
        })
    }

    /// Drives `rollout` to its end with `ops`, the record saved before every action.
    pub async fn drive(
        &self,
        rollout: Rollout,
        ops: Arc<dyn NodeOps>,
        report: impl FnMut(&Progress),
    ) -> Result<Outcome, RunError> {
        Ok(drive(rollout, ops, |r| self.save(r), report).await?)
    }

    /// The one place a rollout record is written.
    fn save(&self, record: &RolloutRecord) -> Result<(), PersistError> {
        let bytes = serde_json::to_vec(record).map_err(PersistError::Encode)?;
        self.store
            .put_rollout(&self.key, &bytes)
            .map_err(PersistError::Store)
    }
}

/// What upgrading one node means; the driver calls these from its own tasks.
#[tonic::async_trait]
pub trait NodeOps: Send + Sync + 'static {
    /// Carry out the change: [`Event::Changed`] or [`Event::ChangeFailed`].
    async fn change(&self, node: &str) -> Event;
    /// Without changing anything: did an earlier run's change take effect?
    async fn reconcile(&self, node: &str) -> Event;
    /// The health gate: [`Event::Healthy`] or [`Event::Unhealthy`].
    async fn check(&self, gate: &Gate) -> Event;
}

/// What the driver reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Checking(Gate),
    Changing(String),
    Reconciling(String),
    Observed(Event),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Finished,
    Stopped {
        node: Option<String>,
        reason: String,
    },
}

/// Why [`drive`] ended without an [`Outcome`]. `E` is the persist callback's error.
#[derive(Debug, thiserror::Error)]
pub enum DriveError<E: std::fmt::Display> {
    /// The record could not be persisted; nothing after it was carried out.
    #[error("{0}")]
    Persist(E),
    /// A node task panicked or was cancelled.
    #[error("a rollout task failed: {0}")]
    Task(tokio::task::JoinError),
    /// The machine asked for nothing more and gave no end (a bug of the engine).
    #[error("the rollout engine stopped without an end")]
    NoEnd,
}

/// For callers that report the run's failure as text.
impl<E: std::fmt::Display> From<DriveError<E>> for String {
    fn from(e: DriveError<E>) -> Self {
        e.to_string()
    }
}

/// Drives `rollout` to its end. The record is handed to `persist` before any action it
/// led to is carried out (the write-ahead rule of [`super::rollout`]); a failed persist ends
/// the run before anything else is changed.
pub async fn drive<P, R, E>(
    mut rollout: Rollout,
    ops: Arc<dyn NodeOps>,
    mut persist: P,
    mut report: R,
) -> Result<Outcome, DriveError<E>>
where
    P: FnMut(&RolloutRecord) -> Result<(), E>,
    R: FnMut(&Progress),
    E: std::fmt::Display,
{
    let mut actions: VecDeque<Action> = rollout.start().into();
    persist(rollout.record()).map_err(DriveError::Persist)?;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        while let Some(action) = actions.pop_front() {
            let ops = ops.clone();
            match action {
                Action::CheckHealth(gate) => {
                    report(&Progress::Checking(gate.clone()));
                    tasks.spawn(async move { ops.check(&gate).await });
                }
                Action::Change { node } => {
                    report(&Progress::Changing(node.clone()));
                    tasks.spawn(async move { ops.change(&node).await });
                }
                Action::Reconcile { node } => {
                    report(&Progress::Reconciling(node.clone()));
                    tasks.spawn(async move { ops.reconcile(&node).await });
                }
                Action::Finished => return Ok(Outcome::Finished),
                Action::Stopped { node, reason } => return Ok(Outcome::Stopped { node, reason }),
            }
        }
        let event = match tasks.join_next().await {
            Some(Ok(event)) => event,
            Some(Err(e)) => return Err(DriveError::Task(e)),
            None => return Err(DriveError::NoEnd),
        };
        report(&Progress::Observed(event.clone()));
        let next = rollout.on(event);
        persist(rollout.record()).map_err(DriveError::Persist)?;
        actions.extend(next);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::daytwo::rollout::{Role, Target};

    /// Ops that record what they were asked, so the driver's persist-before-act rule can be
    /// checked without a network.
    struct Ops(Arc<Mutex<Vec<String>>>);
    #[tonic::async_trait]
    impl NodeOps for Ops {
        async fn change(&self, node: &str) -> Event {
            self.0.lock().unwrap().push(format!("change {node}"));
            Event::Changed { node: node.into() }
        }
        async fn reconcile(&self, node: &str) -> Event {
            Event::NotChanged { node: node.into() }
        }
        async fn check(&self, gate: &Gate) -> Event {
            Event::Healthy(gate.clone())
        }
    }

    #[tokio::test]
    async fn the_record_is_persisted_before_each_change() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let targets = vec![
            Target {
                node: "a".into(),
                role: Role::ControlPlane,
            },
            Target {
                node: "b".into(),
                role: Role::Worker,
            },
        ];
        let persisted = log.clone();
        let out = drive(
            Rollout::new(targets, 1).unwrap(),
            Arc::new(Ops(log.clone())),
            move |r| {
                let s: Vec<_> = r.status.iter().map(|(n, s)| format!("{n}={s:?}")).collect();
                persisted.lock().unwrap().push(s.join(","));
                Ok::<(), String>(())
            },
            |_| {},
        )
        .await
        .unwrap();
        assert_eq!(out, Outcome::Finished);
        let log = log.lock().unwrap();
        let i = log.iter().position(|l| l == "change a").unwrap();
        assert!(log[i - 1].contains("a=Changing"), "{log:?}");
        let j = log.iter().position(|l| l == "change b").unwrap();
        assert!(log[j - 1].contains("b=Changing"), "{log:?}");
    }

    /// A record that cannot be persisted ends the run before anything is done, as the
    /// persist callback's own error (typed, not text).
    #[tokio::test]
    async fn a_failed_persist_stops_before_any_action_with_its_own_error() {
        #[derive(Debug, PartialEq)]
        struct DiskFull;
        impl std::fmt::Display for DiskFull {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("disk full")
            }
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        let targets = vec![Target {
            node: "a".into(),
            role: Role::Worker,
        }];
        let err = drive(
            Rollout::new(targets, 1).unwrap(),
            Arc::new(Ops(log.clone())),
            |_| Err(DiskFull),
            |_| {},
        )
        .await
        .unwrap_err();
        assert!(matches!(err, DriveError::Persist(DiskFull)));
        assert_eq!(String::from(err), "disk full");
        assert!(log.lock().unwrap().is_empty());
    }
}
