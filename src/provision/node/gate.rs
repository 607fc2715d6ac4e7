//! The Secure Boot gate's adapter: for a `secureBoot: true` node, read `SecurityState` over
//! the maintenance API and let [`crate::provision::secure_boot::judge`] decide, before any
//! config is rendered or applied. Other nodes are not asked (no extra call).

use super::super::Provisioner;
use super::super::secure_boot::{self, Expected, Read, Reported};
use super::{Carry, Outcome};
use crate::events::EventKind;
use crate::inventory::Node;
use crate::talos::{TalosClient, TalosError};

impl Provisioner {
    /// `None` when the node may be configured (not a secure-boot node, or it passed);
    /// otherwise the outcome that stops it (refused, or a transient failure to retry).
    pub(super) async fn secure_boot_gate(
        &self,
        node: &Node,
        client: &TalosClient,
        out: &mut Carry,
    ) -> Option<Outcome> {
        if !node.secure_boot() {
            return None;
        }
        let name = node.name.as_str();
        let read = match client.security_state().await {
            Ok(Some(spec)) => Read::Found(Reported::from(&spec)),
            Ok(None) => Read::NotFound,
            Err(TalosError::NotInMaintenance { .. }) => return Some(Outcome::LeftMaintenance),
            // Unreachable for a moment: nothing was sent, the next poll asks again.
            Err(e) if e.is_transient() => return Some(Outcome::NoAnswer { why: e.to_string() }),
            Err(e) => Read::Failed(e.to_string()),
        };
        let expected = Expected {
            pcr_signing_key_fingerprint: self.settings().secure_boot_keys.get(name).cloned(),
        };
        match secure_boot::judge(&read, &expected) {
            Ok(rep) => {
                self.event(
                    name,
                    EventKind::Talos,
                    format!("SecurityState passed the Secure Boot gate: {rep}"),
                );
                None
            }
            Err(refusal) => {
                let why = refusal.to_string();
                self.event(name, EventKind::EntitlementRefused, why.clone());
                out.secure_boot = Some(refusal);
                Some(Outcome::SecureBootRefused { why })
            }
        }
    }
}
