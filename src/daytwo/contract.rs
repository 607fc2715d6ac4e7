//! Day two across the machine-config contract: which contract a running node's config is
//! rendered at for `plan`, `apply` and serve's drift watcher.
//!
//! A running Talos node has no stored contract version: machined never parses one and keeps
//! the applied bytes; behaviour follows only from which documents and fields the config
//! holds, the new document winning over the legacy field (siderolabs/talos v1.14.0-rc.1,
//! `pkg/machinery/config/container/container.go` accessors; `docs/design/
//! talos-v114-items-4-6.md` §5a). So a cluster installed on v1.13 and upgraded to v1.14
//! keeps running v1.13-shaped configs, and its contract stays what it is until the config is
//! changed. talboot follows the node: [`detect`] reads the contract from the running config
//! itself (as upstream's `stdpatches.GuessVersionContract*` helpers do), and day two renders
//! the node at that contract ([`ContractChoice::Running`]), whatever the inventory's
//! `talosVersion` says. Moving a node to a newer contract is an explicit change,
//! `--contract vX.Y` ([`ContractChoice::At`]), refused on a node whose Talos is older than
//! the contract ([`check_runs`]). New nodes (maintenance mode, nothing running) get the
//! inventory's contract from provisioning, as before.
//!
//! [`detect`], [`choose`] and [`summary`] are pure; [`resolve`] is the thin I/O side that
//! reads each node's running config and version.

use std::collections::BTreeMap;
use std::sync::Arc;

use yaml_serde::Value;

use crate::talosfacts::contract::Contract;

use super::plan::{Connector, NodePlan, NodeTarget, PlanError};

/// Document kinds that only the v1.14 contract's switches write and Talos v1.13 does not know
/// (`pkg/machinery/config/contract.go` at v1.14.0-rc.1: `UnattendedInstallConfig`,
/// `MultidocKubernetesConfigSupported`, `DiscoveryServiceMultidocConfig`,
/// `DiscoveryIdentityMultidocConfig`). Any of them makes a config a v1.14-contract one.
///
/// Left out on purpose: `SysctlConfig`, `FilesystemTrimConfig`, `SecurityProfileConfig`
/// (v1.14 contract documents too, but also features an operator may add to a v1.13-shaped
/// config on a v1.14 node without migrating it), and every v1.14 kind no contract switch
/// writes (`RAIDArrayConfig`, `LVM*`, ...).
pub(crate) const V1_14_DOCUMENTS: &[&str] = &[
    "UnattendedInstallConfig",
    "DiscoveryServiceConfig",
    "DiscoveryIdentityConfig",
    "KubeClusterConfig",
    "KubeNodeConfig",
    "KubeletConfig",
    "KubeNetworkConfig",
    "KubeAPIServerCAConfig",
    "KubePrismConfig",
    "KubeAggregatorCAConfig",
    "KubeAdmissionControlConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeEtcdEncryptionConfig",
    "KubeServiceAccountConfig",
    "KubeAPIServerConfig",
    "KubeControllerManagerConfig",
    "KubeSchedulerConfig",
    "KubeProxyConfig",
    "KubeFlannelCNIConfig",
    "KubeCoreDNSConfig",
    "KubeExternalManifestConfig",
];

/// Why a running config's contract could not be read from it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    #[error("the running config is not YAML: {0}")]
    Yaml(String),
    /// Talos refuses such a config on a configured node ("doesn't contain v1alpha1 config").
    #[error("the running config has no v1alpha1 document")]
    NoV1alpha1,
}

/// The contract of a machine config, from what it contains: v1.14 when it holds any of
/// [`V1_14_DOCUMENTS`] (Talos prefers such a document over the legacy field, so a config
/// holding both behaves as v1.14), else v1.13 (the v1alpha1 document carries install,
/// Kubernetes and discovery).
pub(crate) fn detect(config: &str) -> Result<Contract, DetectError> {
    let mut v1alpha1 = false;
    let mut newer = false;
    for doc in yaml_serde::Deserializer::from_str(config) {
        let v = <Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| DetectError::Yaml(e.to_string()))?;
        match v.get("kind").and_then(Value::as_str) {
            Some(kind) => newer |= V1_14_DOCUMENTS.contains(&kind),
            None => {
                v1alpha1 |= ["version", "machine", "cluster"]
                    .iter()
                    .any(|k| v.get(*k).is_some());
            }
        }
    }
    match (v1alpha1, newer) {
        (false, _) => Err(DetectError::NoV1alpha1),
        (true, true) => Ok(Contract::V1_14),
        (true, false) => Ok(Contract::V1_13),
    }
}

/// Which contract `plan` and `apply` render a node at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContractChoice {
    /// The contract of the config the node runs ([`detect`]): no change of contract.
    Running,
    /// `--contract vX.Y`: this contract (a migration when the node runs another).
    At(Contract),
}

/// `--contract` text that names no contract talboot renders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a contract talboot renders; use v1.13 or v1.14")]
pub(crate) struct UnknownContract(String);

/// `v1.14`, `1.14` (a patch level, `v1.14.0`, is accepted and ignored, as upstream's
/// `ParseContractFromVersion` ignores it).
pub(crate) fn parse_contract(s: &str) -> Result<Contract, UnknownContract> {
    let t = s.trim().trim_start_matches('v');
    let mut parts = t.split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return Err(UnknownContract(s.to_owned()));
    };
    Contract::ALL
        .into_iter()
        .find(|c| major == "1" && minor == c.minor().to_string())
        .ok_or_else(|| UnknownContract(s.to_owned()))
}

/// Why a node is not rendered at the contract asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    #[error("cannot tell which contract its running config is in: {0}")]
    Undetected(DetectError),
    /// The node's Talos would refuse the contract's documents.
    #[error(
        "refusing the {contract} contract: the node runs Talos {running}, which does not know \
         the {contract} documents; upgrade it first (`talboot upgrade --talos`)"
    )]
    TooNew { contract: Contract, running: String },
    #[error("refusing the {contract} contract: the node reports Talos {tag:?}, not a version")]
    UnknownRunning { contract: Contract, tag: String },
    #[error("the inventory does not render it at the {contract} contract: {problems}")]
    NotRendered {
        contract: Contract,
        problems: String,
    },
}

/// Whether a node running Talos `tag` takes `contract`'s documents: its minor must be at
/// least the contract's (a v1.14-contract config on a v1.13 node is refused by Talos: the
/// v1.13 config loader does not know `UnattendedInstallConfig`, `Kube*Config`, ...).
pub(crate) fn check_runs(contract: Contract, tag: &str) -> Result<(), ContractError> {
    let version: crate::inventory::Version =
        tag.parse().map_err(|_| ContractError::UnknownRunning {
            contract,
            tag: tag.to_owned(),
        })?;
    let v = &version.0;
    if (v.major, v.minor) < (1, contract.minor()) {
        return Err(ContractError::TooNew {
            contract,
            running: tag.to_owned(),
        });
    }
    Ok(())
}

/// The contract a node is rendered at, from the config it runs and the Talos it reports.
pub(crate) fn choose(
    choice: ContractChoice,
    running: &str,
    tag: &str,
) -> Result<Contract, ContractError> {
    match choice {
        ContractChoice::Running => detect(running).map_err(ContractError::Undetected),
        ContractChoice::At(c) => check_runs(c, tag).map(|()| c),
    }
}

/// Every node's config at every contract talboot renders (a contract the inventory does not
/// render keeps its problems, an error only for a node rendered at it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Renderings {
    by_contract: BTreeMap<Contract, Result<BTreeMap<String, String>, String>>,
}

impl Renderings {
    /// `contract`'s rendering: `(node, config)` pairs, or why the inventory does not render.
    pub(crate) fn insert(
        &mut self,
        contract: Contract,
        rendered: Result<Vec<(String, String)>, String>,
    ) {
        self.by_contract
            .insert(contract, rendered.map(|c| c.into_iter().collect()));
    }

    /// `node`'s config at `contract`.
    pub(crate) fn get(&self, node: &str, contract: Contract) -> Result<&str, ContractError> {
        let not_rendered = |problems: String| ContractError::NotRendered { contract, problems };
        match self.by_contract.get(&contract) {
            None => Err(not_rendered("not rendered".into())),
            Some(Err(problems)) => Err(not_rendered(problems.clone())),
            Some(Ok(nodes)) => nodes
                .get(node)
                .map(String::as_str)
                .ok_or_else(|| not_rendered("the node is not in the inventory".into())),
        }
    }
}

/// How one node's contract was resolved.
#[derive(Debug, Clone)]
pub(crate) enum Resolution {
    /// Rendered at this contract; `running` is the contract of its running config.
    At {
        contract: Contract,
        running: Contract,
    },
    /// Not to be rendered at the contract asked for.
    Refused(ContractError),
    /// Its running config could not be read (what `plan` would report for it).
    Unread(PlanError),
}

/// One node with its rendering at the resolved contract.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// `rendered` is the rendering at the resolved contract (unchanged when not resolved).
    pub target: NodeTarget,
    pub resolution: Resolution,
}

/// Reads every node's running config and Talos version and picks its rendering for
/// `choice`, in order.
pub(crate) async fn resolve(
    conn: &Connector,
    targets: &[NodeTarget],
    renderings: &Renderings,
    choice: ContractChoice,
) -> Vec<Resolved> {
    let mut out = Vec::new();
    for t in targets {
        let mut target = t.clone();
        let resolution = match read_running(conn, t).await {
            Err(e) => Resolution::Unread(e),
            Ok((config, tag)) => match pick(&config, &tag, &t.name, renderings, choice) {
                Ok((contract, running, rendered)) => {
                    target.rendered = rendered.to_owned();
                    Resolution::At { contract, running }
                }
                Err(e) => Resolution::Refused(e),
            },
        };
        out.push(Resolved { target, resolution });
    }
    out
}

/// The contract for `choice`, the running config's own, and the rendering at the former.
fn pick<'a>(
    config: &str,
    tag: &str,
    node: &str,
    renderings: &'a Renderings,
    choice: ContractChoice,
) -> Result<(Contract, Contract, &'a str), ContractError> {
    let running = detect(config).map_err(ContractError::Undetected)?;
    let contract = choose(choice, config, tag)?;
    Ok((contract, running, renderings.get(node, contract)?))
}

/// The node's running config and the Talos tag it reports.
async fn read_running(conn: &Connector, t: &NodeTarget) -> Result<(String, String), PlanError> {
    let client = conn
        .client(t)
        .await
        .map_err(|e| PlanError::Unreachable(Arc::new(e)))?;
    let config = client
        .machine_config()
        .await
        .map_err(|e| PlanError::ReadConfig(Arc::new(e)))?;
    let tag = client
        .version()
        .await
        .map_err(|e| PlanError::Unreachable(Arc::new(e)))?
        .version
        .map(|v| v.tag)
        .unwrap_or_default();
    Ok((config, tag))
}

/// `plan` over resolved nodes: a node refused or unread is an error line, the others are
/// planned against their resolved rendering.
pub(crate) async fn plan_resolved(conn: &Connector, resolved: &[Resolved]) -> Vec<NodePlan> {
    let mut out = Vec::new();
    for r in resolved {
        let failed = |e: PlanError| NodePlan {
            name: r.target.name.clone(),
            role: r.target.role,
            diff: Err(e),
            mode: None,
            dry_run: None,
        };
        out.push(match &r.resolution {
            Resolution::At { .. } => super::plan::plan_node(conn, &r.target).await,
            Resolution::Refused(e) => failed(PlanError::Contract(e.clone())),
            Resolution::Unread(e) => failed(e.clone()),
        });
    }
    out
}

/// The nodes resolved to a contract for which `want(contract, running)` holds.
fn nodes_where(resolved: &[Resolved], want: impl Fn(Contract, Contract) -> bool) -> Vec<&str> {
    resolved
        .iter()
        .filter_map(|r| match r.resolution {
            Resolution::At { contract, running } if want(contract, running) => {
                Some(r.target.name.as_str())
            }
            _ => None,
        })
        .collect()
}

/// What the operator is told about contracts next to a plan (one line each, `contract: `
/// first), or nothing when every node is rendered at the inventory's contract.
pub(crate) fn summary(
    resolved: &[Resolved],
    inventory: Contract,
    choice: ContractChoice,
) -> Vec<String> {
    let mut out = Vec::new();
    match choice {
        ContractChoice::At(c) => {
            let moving = nodes_where(resolved, |contract, running| contract != running);
            if !moving.is_empty() {
                out.push(format!(
                    "contract: {} move from the contract of their running config to {c} \
                     (--contract {c}); shown above as each node's diff",
                    moving.join(", ")
                ));
            }
        }
        ContractChoice::Running => {
            for old in Contract::ALL.into_iter().filter(|c| *c != inventory) {
                let kept = nodes_where(resolved, |contract, _| contract == old);
                if kept.is_empty() {
                    continue;
                }
                out.push(format!(
                    "contract: {} run {old}-contract configs and are rendered at {old} (a \
                     config's contract stays until it is changed; the inventory's \
                     talosVersion renders {inventory} for new nodes); `talboot plan --contract \
                     {inventory}` shows the migration, `talboot apply --contract {inventory}` \
                     rolls it out",
                    kept.join(", ")
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
