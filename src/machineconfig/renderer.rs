//! The seam through which a node's machine config is asked for by those that deliver or
//! compare it (the provisioner, serve's drift watcher): [`ConfigRenderer`] and why it may
//! not render, [`RenderError`]. The real renderer renders with [`super::render`] from the
//! inventory and the secrets bundle; tests and commands that never deliver a config provide
//! their own.

use crate::inventory::Node;
use crate::talosfacts::contract::Contract;

/// Turns an inventory node into its machine config (multi-document YAML). The real renderer
/// is `machineconfig::render`; tests provide their own.
pub trait ConfigRenderer: Send + Sync {
    /// The complete machine config for `node`, or why it cannot be made (shown to the
    /// operator as is).
    fn render(&self, node: &Node) -> Result<Vec<u8>, RenderError>;

    /// `node`'s config at `contract` rather than the inventory's (what serve's drift watcher
    /// compares a node against when the config it runs is at an older contract); `None` when
    /// this renderer renders only the inventory's contract.
    fn render_at(&self, node: &Node, contract: Contract) -> Option<Result<Vec<u8>, RenderError>> {
        let _ = (node, contract);
        None
    }
}

/// Why a machine config was not rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The inventory and secrets do not make a config for the node (the renderer's error,
    /// which names the field to fix).
    #[error(transparent)]
    Config(Box<dyn std::error::Error + Send + Sync>),
    /// This renderer does not render configs (a command that never delivers one).
    #[error("{0}")]
    Unavailable(String),
    /// A command that never delivers a config was asked for one.
    #[error("`{command}` does not deliver configs; {instead}")]
    NotDelivered {
        /// The command (`talboot node rebuild`).
        command: &'static str,
        /// What delivers the config instead.
        instead: &'static str,
    },
}

impl From<String> for RenderError {
    fn from(why: String) -> Self {
        Self::Unavailable(why)
    }
}

impl From<&str> for RenderError {
    fn from(why: &str) -> Self {
        Self::Unavailable(why.to_owned())
    }
}
