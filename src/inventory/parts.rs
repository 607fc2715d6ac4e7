//! What the format readers share: [`Parts`], the sections one reader (`load` for
//! `talboot.yaml`, `talhelper` for `talconfig.yaml`) produced before validation and assembly,
//! the defaults both formats fill in, and the [`Env`] that `${VAR}` values come from. It sits
//! below the readers and `validate`, so none of them imports another.

use std::collections::BTreeMap;
use std::time::Duration;

use super::diag::Loc;
use super::model::*;
use super::yaml::{Node as Y, Value};

/// Where environment variables come from when a talhelper file uses `${VAR}`; a trait so tests
/// need not change the process environment.
pub trait Env {
    /// The value of `name`, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub(crate) struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// What a format reader produced: every section that could be read.
#[derive(Debug, Default)]
pub struct Parts {
    /// Which format.
    pub format: Option<SourceFormat>,
    /// Cluster section.
    pub cluster: Option<Cluster>,
    /// Network section.
    pub network: Option<Network>,
    /// Boot section.
    pub boot: Option<Boot>,
    /// Role definitions as written.
    pub roles: Vec<RoleDef>,
    /// Nodes that could be read.
    pub nodes: Vec<Node>,
    /// Where the `nodes` list is (for "no control plane" and similar).
    pub(crate) nodes_loc: Option<Loc>,
    /// How many entries the `nodes` list has, including ones that could not be read; counts
    /// that depend on every node (control-plane parity) are only judged when all were read.
    pub(crate) nodes_written: usize,
    /// Every node's `role` reference with its field path, including nodes that could not be
    /// read completely, so a misspelled role is reported alongside the node's other problems.
    pub(crate) role_refs: Vec<(String, Spanned<String>)>,
    /// Add-ons.
    pub addons: Addons,
    /// Each node's own `power:` block, by node name (resolved over its role's at assembly).
    pub(crate) node_power: BTreeMap<String, super::power::PowerBlock>,
    /// Each role's `power:` default, by role name.
    pub(crate) role_power: BTreeMap<String, super::power::PowerBlock>,
    /// Each role's `systemVolumes`, by role name (folded over the `extends` chain and under
    /// the node's own at assembly).
    pub(crate) role_volumes: BTreeMap<String, Vec<super::storage::SystemVolume>>,
    /// Each role's `secureBoot`, by role name (the nearest in a node's chain applies unless
    /// the node sets its own).
    pub(crate) role_secure_boot: BTreeMap<String, super::model::Spanned<bool>>,
}

/// Kubernetes defaults Talos itself uses.
pub(crate) const DEFAULT_POD_SUBNET: &str = "10.244.0.0/16";
/// Default service network.
pub(crate) const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";
/// Default Image Factory.
pub(crate) const DEFAULT_FACTORY_URL: &str = "https://factory.talos.dev";

/// Default lease time when the inventory gives none.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(3600);

/// Number of items in a list node (0 for anything else).
pub(crate) fn count_items(n: &Y) -> usize {
    match &n.value {
        Value::Seq(items) => items.len(),
        _ => 0,
    }
}
