//! The production [`ConfigRenderer`]: machine configs rendered from the inventory and the
//! decrypted secrets bundle.

use std::sync::Arc;

use crate::inventory::{Inventory, Node};
use crate::machineconfig::renderer::{ConfigRenderer, RenderError};
use crate::talosfacts::contract::Contract;

/// Renders machine configs from the inventory and the decrypted secrets bundle.
pub(crate) struct BundleRenderer {
    inventory: Arc<Inventory>,
    secrets: crate::machineconfig::secrets::SecretsBundle,
}

impl BundleRenderer {
    /// A renderer for `inventory`'s nodes with `secrets`.
    pub fn new(
        inventory: Arc<Inventory>,
        secrets: crate::machineconfig::secrets::SecretsBundle,
    ) -> Self {
        Self { inventory, secrets }
    }
}

impl ConfigRenderer for BundleRenderer {
    fn render(&self, node: &Node) -> Result<Vec<u8>, RenderError> {
        let bundle =
            crate::machineconfig::render::render_node(&self.inventory, &self.secrets, node)
                .map_err(|e| RenderError::Config(Box::new(e)))?;
        bundle
            .to_yaml()
            .map(String::into_bytes)
            .map_err(|e| RenderError::Config(Box::new(e)))
    }

    fn render_at(&self, node: &Node, contract: Contract) -> Option<Result<Vec<u8>, RenderError>> {
        let bundle = crate::machineconfig::render::render_node_at(
            &self.inventory,
            &self.secrets,
            node,
            contract,
        );
        Some(
            bundle
                .map_err(|e| RenderError::Config(Box::new(e)))
                .and_then(|b| {
                    b.to_yaml()
                        .map(String::into_bytes)
                        .map_err(|e| RenderError::Config(Box::new(e)))
                }),
        )
    }
}
