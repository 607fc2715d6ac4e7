//! `talboot upgrade --talos`: which nodes get which installer, and what upgrading one node
//! means (the operation the rolling engine [`super::rollout`] drives through
//! [`super::run`]). Owns the per-node upgrade plan and the Talos side of one node's change,
//! reconcile and health gate.
//!
//! One node's upgrade is what talosctl does at siderolabs/talos v1.13.9
//! (`cmd/talosctl/cmd/talos/upgrade.go`, `upgradeViaLifecycleService`): `ImageService.Pull`
//! of the installer image into containerd (`imagePullInternal`; layer progress, then the
//! pinned name), `LifecycleService.Upgrade` with it (streamed installer output, then an
//! exit code; non-zero is a failure but no gRPC error), then `Reboot` unless staged. The gate
//! after it waits until the node answers again, reports the new version (`Version` tag), its
//! boot finished (`MachineStatus` stage `running`) and, for a control plane, passes the etcd
//! gate [`super::gate`] that `apply` uses too (ready, etcd healthy on every control plane).
//! Reconcile after a restart: the node already reports the target version.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::inventory::{Inventory, MachineType, Version};
use crate::talos::{ClientCreds, TalosClient, TalosError};

use super::rollout::{Event, Gate, Role, Rollout, RolloutError, RolloutRecord, Target};
use super::run::NodeOps;

/// The store key of a Talos upgrade's rollout record.
pub(crate) fn rollout_key(version: &Version) -> String {
    format!("upgrade-talos/{version}")
}

/// One node to upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpgradeNode {
    pub name: String,
    pub role: Role,
    /// Its apid (`address:50000`).
    pub addr: SocketAddr,
    /// The installer for its schematic and architecture at the target version.
    pub image: String,
    pub arch: crate::inventory::Arch,
}

/// A Talos upgrade of the whole inventory.
#[derive(Debug, Clone)]
pub(crate) struct TalosUpgrade {
    pub version: Version,
    /// Write the new version for the next boot, no reboot now.
    pub stage: bool,
    pub nodes: Vec<UpgradeNode>,
    /// The cluster's Kubernetes version (the inventory's), which the target must run.
    pub kubernetes: Version,
}

impl TalosUpgrade {
    /// Every inventory node, in file order, with its installer at `version`. The installer
    /// is the inventory's (`cluster.installer.image`) or the Image Factory `metal-installer`
    /// of the cluster's schematic, as `gen` renders it into `machine.install.image`; the
    /// factory serves one multi-architecture image per schematic and version, so each
    /// node's architecture (recorded here, and the boot sets checked for it) picks its
    /// platform from it. A `secureBoot: true` node gets `metal-installer-secureboot`, as
    /// its config names it (`machineconfig::render::node_installer_image_at`): upgrading it
    /// with the plain installer would write an unsigned boot path its firmware refuses.
    pub fn plan(inv: &Inventory, version: &Version, stage: bool, apid_port: u16) -> Self {
        let nodes = inv
            .nodes
            .iter()
            .map(|n| UpgradeNode {
                name: n.name.as_str().to_owned(),
                role: if inv.role_of(n).machine_type == MachineType::ControlPlane {
                    Role::ControlPlane
                } else {
                    Role::Worker
                },
                addr: SocketAddr::new(n.address.addr().into(), apid_port),
                image: crate::machineconfig::render::node_installer_image_at(inv, n, version),
                arch: inv.arch_of(n),
            })
            .collect();
        Self {
            version: version.clone(),
            stage,
            nodes,
            kubernetes: inv.cluster.kubernetes_version.value.clone(),
        }
    }

    /// What would make the target refuse this cluster, checked before any node changes: the
    /// cluster's Kubernetes version must run on the target (talosctl's table, as
    /// `upgrade-k8s` reads it), and each node's running Talos (`hosts`: node and the tag it
    /// reports) must be one the target's installer upgrades. The installer checks the
    /// latter only on the node itself, after the pull and with the upgrade under way.
    pub(crate) fn refusals(&self, hosts: &[(String, String)]) -> Vec<String> {
        let target = self.version.to_string();
        let mut out = Vec::new();
        if let Err(e) = super::k8s_version::supported_with(&self.kubernetes, &target) {
            out.push(format!(
                "{e} (upgrade Kubernetes first with `talboot upgrade --kubernetes`)"
            ));
        }
        for (node, tag) in hosts {
            if let Err(e) = super::k8s_version::upgradeable_from(&target, tag) {
                out.push(format!("{node}: {e}"));
            }
        }
        out
    }

    /// The engine's targets, in order.
    pub fn targets(&self) -> Vec<Target> {
        self.nodes
            .iter()
            .map(|n| Target {
                node: n.name.clone(),
                role: n.role,
            })
            .collect()
    }

    /// A new rollout, or the stored one resumed (its nodes must be this plan's).
    pub fn rollout(
        &self,
        stored: Option<RolloutRecord>,
        worker_concurrency: usize,
    ) -> Result<Rollout, RolloutError> {
        match stored {
            Some(mut record) => {
                if record.targets != self.targets() {
                    return Err(RolloutError::Mismatch(
                        "the inventory's nodes changed since this upgrade started".into(),
                    ));
                }
                record.worker_concurrency = worker_concurrency;
                Rollout::resume(record)
            }
            None => Rollout::new(self.targets(), worker_concurrency),
        }
    }
}

/// Why a node's upgrade gate (or the pre-flight check) did not pass. The text becomes the
/// node's failure reason in the rollout record.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpgradeError {
    #[error("{0} is not in the upgrade plan")]
    NotInPlan(String),
    /// Booted to the end on another version: the A-B scheme fell back.
    #[error(
        "it booted {tag}, not {target}: the new version did not boot and Talos rolled back \
         to the previous one"
    )]
    RolledBack { tag: String, target: String },
    /// Not healthy in time; `last` is what the gate saw last.
    #[error("not back and healthy within {wait:?}: {last}")]
    Timeout { wait: Duration, last: String },
    #[error("{node}: {source}")]
    Client { node: String, source: TalosError },
    #[error("{0}")]
    Gate(#[from] super::gate::GateError),
    /// Every problem the pre-flight check found.
    #[error("the cluster is not healthy before the upgrade: {}", .0.join("; "))]
    NotHealthy(Vec<String>),
    /// The target Talos would refuse the cluster (see [`TalosUpgrade::refusals`]).
    #[error("Talos {target} cannot upgrade this cluster: {}", .problems.join("; "))]
    Unsupported {
        target: String,
        problems: Vec<String>,
    },
}

/// Per-node progress lines from the installer.
pub(crate) type InstallerOutput = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// [`NodeOps`] over the Talos API, each node reached directly at its apid.
pub(crate) struct TalosOps {
    upgrade: TalosUpgrade,
    by_name: HashMap<String, usize>,
    creds: ClientCreds,
    /// How long a node may take to come back healthy after its change.
    pub wait: Duration,
    /// How often a gate asks again.
    pub poll: Duration,
    output: InstallerOutput,
    /// serve's event bus, when serve runs the upgrade: the installer pull (start, pinned
    /// name, failure) is recorded in each node's timeline.
    pub events: Option<crate::events::EventBus>,
}

impl TalosOps {
    pub fn new(upgrade: TalosUpgrade, creds: ClientCreds, output: InstallerOutput) -> Self {
        let by_name = upgrade
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        Self {
            upgrade,
            by_name,
            creds,
            wait: Duration::from_secs(900),
            poll: Duration::from_secs(2),
            output,
            events: None,
        }
    }

    fn node(&self, name: &str) -> Result<&UpgradeNode, UpgradeError> {
        self.by_name
            .get(name)
            .map(|&i| &self.upgrade.nodes[i])
            .ok_or_else(|| UpgradeError::NotInPlan(name.to_owned()))
    }

    fn client(&self, node: &UpgradeNode) -> Result<TalosClient, TalosError> {
        TalosClient::secured(node.addr, &self.creds)
            .map(|c| c.with_retry(crate::talos::retry::RetryPolicy::NONE))
    }

    fn target_tag(&self) -> String {
        self.upgrade.version.to_string()
    }

    /// One look at the node: its version tag and whether its boot finished.
    async fn look(&self, node: &UpgradeNode) -> Result<(String, bool), TalosError> {
        let client = self.client(node)?;
        let tag = client
            .version()
            .await?
            .version
            .map(|v| v.tag)
            .unwrap_or_default();
        let running = client.machine_status().await?.stage
            == crate::talos::api::talos::resource::definitions::runtime::RuntimeMachineStage::MachineStageRunning
                as i32;
        Ok((tag, running))
    }

    /// The node is up, booted, on the version the gate wants, and (control plane) in etcd.
    async fn node_gate(&self, node: &UpgradeNode) -> Result<(), UpgradeError> {
        let want = (!self.upgrade.stage).then(|| self.target_tag());
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut wrong = 0;
        let mut last: String;
        loop {
            match self.look(node).await {
                Ok((tag, true)) if want.as_ref().is_none_or(|w| *w == tag) => {
                    if node.role == Role::Worker {
                        return Ok(());
                    }
                    match self.etcd_gate(Some(node)).await {
                        Ok(()) => return Ok(()),
                        Err(e) => last = e.to_string(),
                    }
                }
                Ok((tag, true)) => {
                    // Booted to the end on another version: the new one did not boot and
                    // the A-B scheme fell back. Seen on a few polls in a row, not one.
                    wrong += 1;
                    let rolled_back = UpgradeError::RolledBack {
                        tag,
                        target: self.target_tag(),
                    };
                    if wrong >= 3 {
                        return Err(rolled_back);
                    }
                    last = rolled_back.to_string();
                }
                Ok((tag, false)) => {
                    wrong = 0;
                    last = format!("{tag} is still booting");
                }
                Err(e) => {
                    wrong = 0;
                    last = e.to_string();
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(UpgradeError::Timeout {
                    wait: self.wait,
                    last,
                });
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// [`super::gate::check`] over every control plane of the plan, `changed` first.
    async fn etcd_gate(&self, changed: Option<&UpgradeNode>) -> Result<(), UpgradeError> {
        let cps: Vec<(String, Result<TalosClient, TalosError>)> = self
            .upgrade
            .nodes
            .iter()
            .filter(|n| n.role == Role::ControlPlane)
            .map(|n| (n.name.clone(), self.client(n)))
            .collect();
        let changed = match changed {
            Some(n) => Some((
                n.name.as_str(),
                self.client(n).map_err(|source| UpgradeError::Client {
                    node: n.name.clone(),
                    source,
                })?,
            )),
            None => None,
        };
        Ok(super::gate::check(changed.as_ref().map(|(n, c)| (*n, c)), &cps).await?)
    }

    async fn cluster_gate(&self) -> Result<(), UpgradeError> {
        let mut problems = Vec::new();
        let mut hosts = Vec::new();
        for node in &self.upgrade.nodes {
            match self.look(node).await {
                Ok((tag, true)) => hosts.push((node.name.clone(), tag)),
                Ok((tag, false)) => problems.push(format!("{} ({tag}) is not running", node.name)),
                Err(e) => problems.push(format!("{}: {e}", node.name)),
            }
        }
        let refused = self.upgrade.refusals(&hosts);
        if !refused.is_empty() {
            return Err(UpgradeError::Unsupported {
                target: self.target_tag(),
                problems: refused,
            });
        }
        let control_planes = self
            .upgrade
            .nodes
            .iter()
            .any(|n| n.role == Role::ControlPlane);
        if problems.is_empty()
            && control_planes
            && let Err(e) = self.etcd_gate(None).await
        {
            problems.push(e.to_string());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(UpgradeError::NotHealthy(problems))
        }
    }
}

#[tonic::async_trait]
impl NodeOps for TalosOps {
    async fn change(&self, name: &str) -> Event {
        let failed = |reason: String| Event::ChangeFailed {
            node: name.to_owned(),
            reason,
        };
        let node = match self.node(name) {
            Ok(n) => n,
            Err(e) => return failed(e.to_string()),
        };
        let client = match self.client(node) {
            Ok(c) => c,
            Err(e) => return failed(e.to_string()),
        };
        let output = self.output.clone();
        // The installer is pulled first: Upgrade only runs an image already in the node's
        // containerd store (siderolabs/talos v1.13.9 internal/app/lifecycle/container.go),
        // and talosctl pulls it the same way (`imagePullInternal` before `upgradeInternal`).
        let event = |detail: String| {
            if let Some(bus) = &self.events {
                bus.publish(name, crate::events::EventKind::Talos, detail);
            }
        };
        output(name, &format!("pulling the installer {}", node.image));
        event(format!("upgrade: pulling the installer {}", node.image));
        let mut report = super::installer_pull::PullReport::default();
        let pulled = match client
            .image_pull(&node.image, |p| {
                if let Some(line) = report.line(p) {
                    output(name, &line);
                }
            })
            .await
        {
            Ok(pulled) => pulled,
            Err(e) => {
                let why = format!("pull of the installer {}: {e}", node.image);
                event(format!("upgrade: {why}"));
                return failed(why);
            }
        };
        output(name, &format!("pulled the installer as {pulled}"));
        event(format!(
            "upgrade: pulled the installer as {pulled} ({} layer(s) fetched)",
            report.layers()
        ));
        let code = match client
            .lifecycle_upgrade(&node.image, |m| output(name, m.trim_end()))
            .await
        {
            Ok(code) => code,
            Err(e) => return failed(format!("upgrade with {}: {e}", node.image)),
        };
        if code != 0 {
            return failed(format!(
                "the installer {} exited with code {code}",
                node.image
            ));
        }
        if !self.upgrade.stage
            && let Err(e) = client.reboot().await
        {
            return failed(format!("reboot into {}: {e}", self.target_tag()));
        }
        Event::Changed {
            node: name.to_owned(),
        }
    }

    async fn reconcile(&self, name: &str) -> Event {
        // A staged version cannot be read back over the API: stage it again (harmless).
        let done = match self.node(name) {
            Ok(node) if !self.upgrade.stage => {
                matches!(self.look(node).await, Ok((tag, _)) if tag == self.target_tag())
            }
            _ => false,
        };
        if done {
            Event::Changed {
                node: name.to_owned(),
            }
        } else {
            Event::NotChanged {
                node: name.to_owned(),
            }
        }
    }

    async fn check(&self, gate: &Gate) -> Event {
        let result = match gate {
            Gate::Cluster => self.cluster_gate().await,
            Gate::Node(name) => match self.node(name) {
                Ok(node) => self.node_gate(node).await,
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) => Event::Healthy(gate.clone()),
            Err(e) => Event::Unhealthy {
                gate: gate.clone(),
                reason: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Against a rack of fake Talos nodes installed from talboot's rendered configs, on
    //! 127.0.78.x (no other test uses it). The double's own availability record is the
    //! witness of how many nodes were down at once.

    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    use time::OffsetDateTime;

    use super::*;
    use crate::daytwo::rollout::NodeStatus;
    use crate::daytwo::run::{Outcome, Persisted};
    use crate::inventory;
    use crate::machineconfig::clients;
    use crate::machineconfig::render::render_node;
    use crate::machineconfig::secrets::{GenerateOptions, SecretsBundle, ServiceAccountKeyKind};
    use crate::sim::talos::{
        FakeCluster, FakeNodeConfig, FakeTalosNode, Phase, TALOS_TAG, UpgradeFailure, max_down,
    };
    use crate::store::RolloutWriter;

    const NODES: [&str; 5] = [
        "rack1-cp-01",
        "rack1-cp-02",
        "rack1-cp-03",
        "rack1-wk-01",
        "rack1-wk-04",
    ];

    /// `config/rack.yaml` and a secrets bundle for it, made once per test binary.
    pub(crate) fn rack() -> &'static (Inventory, SecretsBundle) {
        static RACK: OnceLock<(Inventory, SecretsBundle)> = OnceLock::new();
        RACK.get_or_init(|| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml");
            let inv = inventory::load_with_env(&path, &BTreeMap::new())
                .unwrap()
                .inventory;
            let options = GenerateOptions {
                service_account_key: ServiceAccountKeyKind::EcdsaP256,
            };
            let secrets = SecretsBundle::generate(OffsetDateTime::now_utc(), &options).unwrap();
            (inv, secrets)
        })
    }

    /// An admin talosconfig's credentials for [`rack`].
    pub(crate) fn creds() -> ClientCreds {
        let (inv, secrets) = rack();
        let tc = clients::talosconfig(
            inv.cluster.name.as_str(),
            &["10.20.0.11".into()],
            &[],
            secrets,
            time::Duration::hours(1),
            OffsetDateTime::now_utc(),
        )
        .unwrap();
        ClientCreds::from_talosconfig(&tc, None).unwrap()
    }

    struct Rack {
        cluster: FakeCluster,
        nodes: Vec<FakeTalosNode>,
        upgrade: TalosUpgrade,
    }

    impl Rack {
        fn node(&self, name: &str) -> &FakeTalosNode {
            self.nodes.iter().find(|n| n.hostname() == name).unwrap()
        }
    }

    /// Five nodes installed and running, etcd bootstrapped, and the upgrade plan to
    /// `v1.14.0` pointed at their loopback addresses.
    async fn rack_up(third: u8) -> Rack {
        crate::install_crypto_provider();
        let (inv, secrets) = rack();
        let cluster = FakeCluster::new();
        let mut nodes = Vec::new();
        for (i, name) in NODES.iter().enumerate() {
            let ip = std::net::IpAddr::from([127, 0, 78, third + i as u8]);
            let mut cfg = FakeNodeConfig::new(ip, name);
            cfg.aliases = vec![std::net::IpAddr::V4(inv.node(name).unwrap().address.addr())];
            let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
            let config = render_node(inv, secrets, inv.node(name).unwrap())
                .unwrap()
                .to_yaml()
                .unwrap();
            TalosClient::maintenance(node.addr())
                .unwrap()
                .apply_configuration(config.as_bytes())
                .await
                .unwrap();
            nodes.push(node);
        }
        for n in &nodes {
            n.wait_phase(Phase::Secured).await.unwrap();
        }
        // A new cluster's control planes wait for Bootstrap in stage booting.
        TalosClient::secured(nodes[0].addr(), &creds())
            .unwrap()
            .bootstrap()
            .await
            .unwrap();
        // ... then every boot sequence finishes (stage running: on control planes, etcd
        // joined and healthy), as the double records it.
        for _ in 0..3000 {
            let up = cluster.availability().iter().filter(|a| !a.down).count();
            if up >= nodes.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let version: Version = "v1.14.0".parse().unwrap();
        let mut upgrade = TalosUpgrade::plan(inv, &version, false, 50000);
        upgrade.nodes.retain(|n| NODES.contains(&n.name.as_str()));
        for n in &mut upgrade.nodes {
            n.addr = nodes
                .iter()
                .find(|f| f.hostname() == n.name)
                .unwrap()
                .addr();
        }
        Rack {
            cluster,
            nodes,
            upgrade,
        }
    }

    fn ops(rack: &Rack) -> Arc<dyn NodeOps> {
        ops_with(rack, Arc::new(|_, _| {}))
    }

    fn ops_with(rack: &Rack, output: InstallerOutput) -> Arc<dyn NodeOps> {
        let mut ops = TalosOps::new(rack.upgrade.clone(), creds(), output);
        ops.wait = Duration::from_secs(60);
        ops.poll = Duration::from_millis(20);
        Arc::new(ops)
    }

    async fn run(rack: &Rack, store: &RolloutWriter, concurrency: usize) -> Outcome {
        run_with(rack, store, concurrency, ops(rack)).await
    }

    async fn run_with(
        rack: &Rack,
        store: &RolloutWriter,
        concurrency: usize,
        ops: Arc<dyn NodeOps>,
    ) -> Outcome {
        let rollout = Persisted::new(store, rollout_key(&rack.upgrade.version));
        let (engine, _) = rollout
            .resume_or_start(|stored| rack.upgrade.rollout(stored, concurrency))
            .unwrap();
        rollout.drive(engine, ops, |_| {}).await.unwrap()
    }

    #[test]
    fn the_plan_has_every_node_with_the_installer_at_the_target_version() {
        let (inv, _) = rack();
        let v: Version = "v1.14.0".parse().unwrap();
        let plan = TalosUpgrade::plan(inv, &v, false, 50000);
        assert_eq!(plan.nodes.len(), inv.nodes.len());
        let cp = &plan.nodes[0];
        assert_eq!(cp.role, Role::ControlPlane);
        assert_eq!(cp.addr.to_string(), "10.20.0.11:50000");
        assert!(cp.image.ends_with(":v1.14.0"), "{}", cp.image);
        assert!(
            cp.image.contains(inv.cluster.installer.schematic_id()),
            "{}",
            cp.image
        );
        assert_eq!(rollout_key(&v), "upgrade-talos/v1.14.0");
        // A secure-boot node upgrades with the Secure Boot installer, the others do not.
        let mut inv = inv.clone();
        let sb = inv.nodes.len() - 1;
        inv.nodes[sb].secure_boot = Some(crate::inventory::Spanned::new(
            true,
            inv.nodes[sb].name.loc.clone(),
        ));
        let plan = TalosUpgrade::plan(&inv, &v, false, 50000);
        let schematic = inv.cluster.installer.schematic_id();
        assert!(
            plan.nodes[sb]
                .image
                .ends_with(&format!("/metal-installer-secureboot/{schematic}:v1.14.0")),
            "{}",
            plan.nodes[sb].image
        );
        assert!(plan.nodes[0].image.contains("/metal-installer/"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rolling_upgrade_never_has_two_control_planes_down() {
        let rack = rack_up(1).await;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
        let since = Instant::now();
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let output: InstallerOutput = {
            let lines = lines.clone();
            Arc::new(move |node, line| lines.lock().unwrap().push(format!("{node}: {line}")))
        };
        // A real node runs only an installer already in containerd (the double refuses any
        // other as siderolabs/talos v1.13.9 internal/app/lifecycle/container.go does), so
        // without the pull this stops at the first node.
        assert_eq!(
            run_with(&rack, &store, 2, ops_with(&rack, output)).await,
            Outcome::Finished
        );
        let lines = lines.lock().unwrap().clone();
        for n in &rack.nodes {
            assert_eq!(n.running_version(), "v1.14.0", "{}", n.hostname());
            assert_eq!(n.upgrade_calls(), 1, "{}", n.hostname());
            assert_eq!(n.pull_calls(), 1, "{}", n.hostname());
            // talosctl's order: pull, upgrade, reboot.
            let calls: Vec<&str> = n
                .served()
                .iter()
                .map(|s| s.rpc)
                .filter(|r| ["Pull", "Upgrade", "Reboot"].contains(r))
                .collect();
            assert_eq!(calls, ["Pull", "Upgrade", "Reboot"], "{}", n.hostname());
            // The pull's progress reaches the operator.
            let name = n.hostname();
            for want in [
                "pulling the installer",
                "installer layer",
                "pulled the installer as",
            ] {
                assert!(
                    lines
                        .iter()
                        .any(|l| l.starts_with(&format!("{name}: {want}"))),
                    "{name}: no {want:?} line in {lines:#?}"
                );
            }
        }
        let log = rack.cluster.availability();
        assert_eq!(max_down(&log, since, true), 1, "{log:#?}");
        let etcd = rack.cluster.etcd_availability();
        assert_eq!(
            crate::sim::talos::max_etcd_down(&etcd, since),
            1,
            "{etcd:#?}"
        );
        assert!(max_down(&log, since, false) <= 2, "{log:#?}");
        // Every control plane went down (and came back) before any worker went down.
        let first_worker_down = log
            .iter()
            .position(|a| a.at >= since && a.down && !a.control_plane)
            .unwrap();
        let last_cp_up = log
            .iter()
            .rposition(|a| a.at >= since && !a.down && a.control_plane)
            .unwrap();
        assert!(last_cp_up < first_worker_down, "{log:#?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_node_stops_the_upgrade_and_a_restart_resumes_without_repeating() {
        let rack = rack_up(11).await;
        let dir = tempfile::tempdir().unwrap();
        let since = Instant::now();
        rack.node("rack1-cp-02")
            .fail_upgrades(Some(UpgradeFailure::Installer));
        {
            let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
            match run(&rack, &store, 2).await {
                Outcome::Stopped { node, reason } => {
                    assert_eq!(node.as_deref(), Some("rack1-cp-02"));
                    assert!(reason.contains("exited with code 1"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
            let record: RolloutRecord = serde_json::from_slice(
                &store
                    .rollout(&rollout_key(&rack.upgrade.version))
                    .unwrap()
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(record.status["rack1-cp-01"], NodeStatus::Done);
            assert!(matches!(
                record.status["rack1-cp-02"],
                NodeStatus::Failed { .. }
            ));
            assert_eq!(record.status["rack1-cp-03"], NodeStatus::Pending);
        }
        assert_eq!(rack.node("rack1-cp-01").running_version(), "v1.14.0");
        assert_eq!(rack.node("rack1-cp-02").running_version(), TALOS_TAG);
        assert_eq!(rack.node("rack1-cp-03").upgrade_calls(), 0);

        // The operator fixes the node; talboot starts again from the store.
        rack.node("rack1-cp-02").fail_upgrades(None);
        let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
        assert_eq!(run(&rack, &store, 2).await, Outcome::Finished);
        assert_eq!(
            rack.node("rack1-cp-01").upgrade_calls(),
            1,
            "not upgraded again"
        );
        assert_eq!(rack.node("rack1-cp-02").upgrade_calls(), 2);
        for n in &rack.nodes {
            assert_eq!(n.running_version(), "v1.14.0", "{}", n.hostname());
        }
        assert_eq!(max_down(&rack.cluster.availability(), since, true), 1);
    }

    /// talosctl's tables (v1.14.0-rc.1 `pkg/machinery/compatibility`): Talos v1.14 runs
    /// Kubernetes 1.32 to 1.37 and upgrades hosts from v1.12.0 on.
    #[test]
    fn the_target_must_run_the_clusters_kubernetes_and_upgrade_its_hosts() {
        let (inv, _) = rack();
        let mut plan = TalosUpgrade::plan(inv, &"v1.14.0".parse().unwrap(), false, 50000);
        let hosts = |tags: &[(&str, &str)]| -> Vec<(String, String)> {
            tags.iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect()
        };
        plan.kubernetes = "1.36.3".parse().unwrap();
        assert_eq!(
            plan.refusals(&hosts(&[("cp-1", "v1.13.9"), ("wk-1", "v1.12.4")])),
            Vec::<String>::new()
        );
        plan.kubernetes = "1.31.4".parse().unwrap();
        assert_eq!(
            plan.refusals(&hosts(&[("cp-1", "v1.13.9"), ("wk-1", "v1.11.2")])),
            vec![
                "version of Kubernetes 1.31.4 is too old to be used with Talos 1.14.0 \
                 (upgrade Kubernetes first with `talboot upgrade --kubernetes`)"
                    .to_string(),
                "wk-1: host version 1.11.2 is too old to upgrade to Talos 1.14.0".to_string(),
            ]
        );
    }

    /// A cluster the target would refuse is refused at the cluster gate: no node is pulled
    /// or upgraded (the installer's own check would fire only on the first node, mid-way).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unsupported_kubernetes_version_stops_the_upgrade_before_any_node() {
        let mut rack = rack_up(31).await;
        rack.upgrade.kubernetes = "1.31.4".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
        match run(&rack, &store, 2).await {
            Outcome::Stopped { node, reason } => {
                assert_eq!(node, None);
                assert!(
                    reason.contains("Talos v1.14.0 cannot upgrade this cluster")
                        && reason.contains("too old to be used with Talos 1.14.0"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        for n in &rack.nodes {
            assert_eq!(n.upgrade_calls(), 0, "{}", n.hostname());
            assert_eq!(n.running_version(), TALOS_TAG, "{}", n.hostname());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rolled_back_node_fails_its_gate() {
        let rack = rack_up(21).await;
        let dir = tempfile::tempdir().unwrap();
        rack.node("rack1-cp-01")
            .fail_upgrades(Some(UpgradeFailure::BootRollback));
        let store = crate::store::open(dir.path()).unwrap().split().1.rollouts;
        match run(&rack, &store, 1).await {
            Outcome::Stopped { node, reason } => {
                assert_eq!(node.as_deref(), Some("rack1-cp-01"));
                assert!(reason.contains("rolled back"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rack.node("rack1-cp-02").upgrade_calls(), 0);
    }
}
