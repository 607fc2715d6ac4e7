//! What talboot does with the power controllers of an inventory's nodes, whoever asks (the
//! CLI's `check --probe` and `node rebuild` today; serve's admin API could ask the same):
//! probe every configured controller, and the power-control fallback of a rebuild whose
//! node's Talos API is silent. Credentials are resolved here and never part of a message.

use std::time::Duration;

use crate::crypto::age::IdentitySources;
use crate::inventory::Inventory;

use super::PowerError;
use super::credentials::{CredentialError, Resolver};
use super::dispatch::{PowerDriver, ProbeAnswer, drivers, tcp_answers};
use super::secureboot::SecureBootProbe;

/// What probing one node's controller found.
#[derive(Debug)]
pub(crate) struct Probe {
    /// The node.
    pub node: String,
    /// What came of it.
    pub outcome: ProbeOutcome,
    /// The inventory marks the node `secureBoot: true`.
    pub wants_secure_boot: bool,
    /// What the controller said of the firmware's Secure Boot (`None`: not asked, because
    /// the controller did not answer).
    pub secure_boot: Option<Result<SecureBootProbe, PowerError>>,
}

/// How one controller's probe ended.
#[derive(Debug)]
pub(crate) enum ProbeOutcome {
    /// Its credentials did not resolve, so it was not asked.
    NotProbed(CredentialError),
    /// It was asked; `kind` and `target` name the controller.
    Asked {
        /// The driver kind.
        kind: &'static str,
        /// The controller's address.
        target: String,
        /// Its answer, or why there was none.
        answer: Result<ProbeAnswer, PowerError>,
    },
}

impl Probe {
    /// Why a `secureBoot: true` node's firmware will not enforce Secure Boot, by what its
    /// controller said.
    pub(crate) fn secure_boot_problem(&self) -> Option<String> {
        if !self.wants_secure_boot {
            return None;
        }
        match &self.secure_boot {
            Some(Ok(sb)) => sb.not_enforcing(),
            _ => None,
        }
    }

    /// The `secure boot` line `check --probe` prints under the power line, if it asked.
    pub(crate) fn secure_boot_line(&self) -> Option<String> {
        let name = &self.node;
        let sb = self.secure_boot.as_ref()?;
        let text = match sb {
            Ok(p) => p.to_string(),
            Err(e) => format!("unknown: {e}"),
        };
        let unknown = matches!(sb, Err(_) | Ok(SecureBootProbe::Unknown(_)));
        let flag = match self.secure_boot_problem() {
            Some(why) => format!(
                "\n  NOT ENFORCED on a `secureBoot: true` node: {why}; enrol the signing key and \
                 enable Secure Boot (`talboot node secureboot enroll {name} --cert FILE --enable`, \
                 or docs/operations.md \"Secure Boot key enrolment\")"
            ),
            None if self.wants_secure_boot && unknown => {
                " (the node is `secureBoot: true`: check its firmware by hand)".to_string()
            }
            None => String::new(),
        };
        Some(format!("probe {name}: secure boot: {text}{flag}"))
    }

    /// Whether the controller could not be reached (or not even asked).
    pub(crate) fn failed(&self) -> bool {
        matches!(
            self.outcome,
            ProbeOutcome::NotProbed(_) | ProbeOutcome::Asked { answer: Err(_), .. }
        )
    }
}

/// The line `check --probe` prints for the probe.
impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = &self.node;
        match &self.outcome {
            ProbeOutcome::NotProbed(e) => write!(f, "probe {name}: not probed: {e}"),
            ProbeOutcome::Asked {
                kind,
                target,
                answer,
            } => match answer {
                Ok(ProbeAnswer::Answered(state)) => write!(
                    f,
                    "probe {name}: {kind} {target} answered: power {}",
                    state.as_str()
                ),
                Ok(ProbeAnswer::SendOnly) => {
                    write!(
                        f,
                        "probe {name}: {kind} {target}: send-only (nothing to ask)"
                    )
                }
                Err(e) => write!(f, "probe {name}: {kind} did not answer: {e}"),
            },
        }
    }
}

/// Probes every node's configured controller, one after another in node-name order; empty
/// when no node has a `power:` block.
pub(crate) async fn probe_all(inv: &Inventory, sources: IdentitySources) -> Vec<Probe> {
    let mut out = Vec::new();
    for (node, d) in drivers(inv, sources) {
        let wants_secure_boot = inv.node(&node).is_some_and(|n| n.secure_boot());
        let (outcome, secure_boot) = match d {
            Err(e) => (ProbeOutcome::NotProbed(e), None),
            Ok(d) => {
                let answer = d.probe().await;
                // A controller that did not answer is not asked again.
                let sb = match answer {
                    Ok(_) => Some(d.secure_boot().await),
                    Err(_) => None,
                };
                let outcome = ProbeOutcome::Asked {
                    kind: d.kind(),
                    target: d.target(),
                    answer,
                };
                (outcome, sb)
            }
        };
        out.push(Probe {
            node,
            outcome,
            wants_secure_boot,
            secure_boot,
        });
    }
    out
}

/// Whether a rebuild of node `name` should use power control: the node has a controller and
/// its Talos API at `apid_port` does not accept a connection within `wait`. Asked before the
/// rebuild, so a node that resets itself is never power-cycled as well.
pub(crate) async fn rebuild_needs_power(
    inv: &Inventory,
    name: &str,
    apid_port: u16,
    wait: Duration,
) -> bool {
    let Some(node) = inv.node(name).filter(|n| n.power.is_some()) else {
        return false;
    };
    let addr = std::net::SocketAddr::new(node.address.value.addr().into(), apid_port);
    !tcp_answers(addr, wait).await
}

/// Why [`rebuild_by_power`] could not send a node to network boot.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RebuildByPowerError {
    /// The node has no `power:` block.
    #[error("node {node} has no power controller")]
    NoController {
        /// The node.
        node: String,
    },
    /// Its power credentials did not resolve.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// The controller did not do it.
    #[error(transparent)]
    Power(#[from] PowerError),
}

/// The rebuild of a node whose Talos API does not answer: a one-time network boot and a
/// power cycle send it to talboot, which provisions it again (the rebuild reopened its
/// window). What was done, or why it failed.
pub(crate) async fn rebuild_by_power(
    inv: &Inventory,
    name: &str,
    sources: IdentitySources,
) -> Result<String, RebuildByPowerError> {
    let config = inv
        .node(name)
        .and_then(|n| n.power.as_ref())
        .ok_or_else(|| RebuildByPowerError::NoController {
            node: name.to_string(),
        })?;
    let env = |v: &str| std::env::var(v).ok();
    let mut r = Resolver::new(&env, sources);
    let driver: PowerDriver = r.config(name, config)?;
    let set = driver.reboot_into_network().await?;
    Ok(format!(
        "its Talos API did not answer: set a one-time network boot and power-cycled it through {}{set}",
        driver.target()
    ))
}
