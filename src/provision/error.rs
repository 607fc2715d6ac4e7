//! Why a provisioning step failed: the one error type of the provisioner's steps.

use std::time::Duration;

use super::{core, disks};
use crate::store::StoreError;
use crate::talos::TalosError;

/// Why a provisioning step failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A Talos call failed.
    #[error("node {node}: {source}")]
    Talos {
        /// The node.
        node: String,
        /// The classified call failure.
        #[source]
        source: TalosError,
    },
    /// The install disk cannot be used on this node.
    #[error("node {node}: {source}")]
    Disk {
        /// The node.
        node: String,
        /// The refusal, listing the disks.
        #[source]
        source: disks::DiskRefusal,
    },
    /// The Secure Boot gate refused the node: nothing was sent to it.
    #[error("node {node}: {source}")]
    SecureBoot {
        /// The node.
        node: String,
        /// Every reason, and what the node reported.
        #[source]
        source: super::secure_boot::Refusal,
    },
    /// The machine config could not be rendered.
    #[error("node {node}: cannot render its machine config: {reason}")]
    Render {
        /// The node.
        node: String,
        /// The renderer's message.
        reason: String,
    },
    /// The name is not in the inventory.
    #[error("node {0:?} is not in the inventory; `talboot check` lists the node names")]
    UnknownNode(String),
    /// A rebuild of a node that holds no config from talboot: nothing to reset.
    #[error(transparent)]
    RebuildRefused(#[from] core::RebuildRefused),
    /// The inventory has no control plane to bootstrap.
    #[error("the inventory has no control-plane node; give at least one node a controlplane role")]
    NoControlPlane,
    /// The install sequence failed on the node.
    #[error("node {node}: install failed: {cause}")]
    InstallFailed {
        /// The node.
        node: String,
        /// What Talos reported (the failed sequence's error), or what was observed.
        cause: String,
    },
    /// A rebuild's reset did not happen.
    #[error("node {node}: rebuild failed: {cause}")]
    ResetFailed {
        /// The node.
        node: String,
        /// What Talos reported, or that the node never came back in maintenance mode.
        cause: String,
    },
    /// The node did not come back configured in time.
    #[error(
        "node {node} did not come back installed (machine stage running) within {after:?} \
         after its config was applied; check its console (install disk, installer image pull) \
         and `talboot status`"
    )]
    InstallTimeout {
        /// The node.
        node: String,
        /// The timeout.
        after: Duration,
    },
    /// The health wait ran out of time.
    #[error("cluster not healthy within {after:?}: {last}")]
    HealthTimeout {
        /// The timeout that expired.
        after: Duration,
        /// What the last check found.
        last: String,
    },
    /// The kubeconfig could not be written.
    #[error(transparent)]
    Write(#[from] crate::fsutil::AtomicWriteError),
    /// A blocking store task died.
    #[error("internal: store task failed: {0}")]
    Join(String),
    /// A step failed without a more specific error.
    #[error("node {node}: {why}")]
    Step {
        /// The node.
        node: String,
        /// Why.
        why: String,
    },
}
