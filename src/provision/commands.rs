//! Operator commands for the running provisioner (today: rebuild), the channel that carries
//! them from the admin API to the run loop, and who takes a rebuild when no provisioner runs.

use std::sync::Arc;

use super::OfflineObserver;
use super::core;

/// Why an operator command did not reach the running provisioner, or was refused by it.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// No provisioner takes commands.
    #[error("the provisioner is not running")]
    NotRunning,
    /// It stopped before it answered.
    #[error("the provisioner stopped before it answered")]
    Stopped,
    /// It refused the command (unknown node, store failure).
    #[error("{0}")]
    Refused(String),
    /// A rebuild of a node that holds no config from talboot (never provisioned, or waiting
    /// for its config): nothing to reset, and the node is provisioned anyway.
    #[error(transparent)]
    NothingToReset(core::RebuildRefused),
}

/// An operator action for the running provisioner, which applies it as the writer of node
/// records.
#[derive(Debug)]
pub enum Command {
    /// `talboot node rebuild NAME`: reopen the window, mark Rebuilding, reset the node.
    Rebuild {
        /// The node.
        node: String,
        /// Once persisted (or why not).
        reply: tokio::sync::oneshot::Sender<Result<(), CommandError>>,
    },
    /// `node` network-booted Talos from another appliance of the fleet (its boot event is
    /// in the shared store, not on this appliance's bus): as if this bus had carried it.
    TalosBootElsewhere {
        /// The node.
        node: String,
    },
}

/// Sends [`Command`]s to a running provisioner.
#[derive(Clone, Debug)]
pub(crate) struct CommandSender(tokio::sync::mpsc::Sender<Command>);

/// The provisioner's end of [`command_channel`].
#[derive(Debug)]
pub(crate) struct CommandReceiver(pub(crate) tokio::sync::mpsc::Receiver<Command>);

/// A channel for operator commands: the sender goes to the admin API, the receiver to
/// [`Provisioner::with_commands`](super::Provisioner::with_commands).
pub(crate) fn command_channel() -> (CommandSender, CommandReceiver) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    (CommandSender(tx), CommandReceiver(rx))
}

impl CommandSender {
    /// Asks the provisioner to rebuild `node`; returns once it persisted the request.
    pub async fn rebuild(&self, node: &str) -> Result<(), CommandError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.0
            .send(Command::Rebuild {
                node: node.to_owned(),
                reply,
            })
            .await
            .map_err(|_| CommandError::NotRunning)?;
        answer.await.map_err(|_| CommandError::Stopped)?
    }
}

impl CommandSender {
    /// Tells the provisioner that `node` booted Talos from another appliance; `false` once
    /// the provisioner is gone.
    pub async fn talos_boot_elsewhere(&self, node: &str) -> bool {
        let node = node.to_owned();
        self.0
            .send(Command::TalosBootElsewhere { node })
            .await
            .is_ok()
    }
}

/// The next command, or never when this provisioner takes none (a `select!` arm that
/// stays quiet instead of ending the loop).
pub(super) async fn recv_command(
    rx: &mut Option<tokio::sync::mpsc::Receiver<Command>>,
) -> Option<Command> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Who takes an operator's rebuild: the node records' one writer, which is the running
/// provisioner (asked through its commands) or, when none runs, the offline observer.
pub(crate) enum Rebuilds {
    /// The running provisioner's commands.
    Provisioner(CommandSender),
    /// The offline observer (no push provisioning).
    Offline(Arc<OfflineObserver>),
}
