//! The simulated rack's machines and cluster side: each machine powered on against talboot's
//! sockets (network boot, then the Talos double on its leased address, rebooting through the
//! network again), and the Kubernetes API double with the Talos doubles' registry.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::prepare::{KUBE_API_PORT, cilium_enabled};
use super::{DemoError, SimFailure};
use crate::inventory::Inventory;
use crate::sim::kube::{DoubleOptions, KubeDouble};
use crate::sim::machine::{Booted, Machine, Wire};
use crate::sim::talos::{
    BootHook, BootReason, FakeCluster, FakeNodeConfig, FakeTalosNode, Phase, SimSecurity,
};

/// One simulated machine as the demo tracks it.
pub struct SimNode {
    /// The machine.
    pub machine: Machine,
    /// Its inventory address on the rack network.
    pub(crate) rack_address: Ipv4Addr,
    /// Its role.
    pub role: String,
    /// `secureBoot: true` in the inventory: its firmware enforces Secure Boot and it boots
    /// the boot set's UKI, so its double reports that in `SecurityState`.
    pub secure_boot: bool,
    pub(super) talos: Mutex<Option<Arc<FakeTalosNode>>>,
}

impl SimNode {
    /// Its Talos double, once the machine has booted Talos.
    pub fn talos(&self) -> Option<Arc<FakeTalosNode>> {
        self.talos.lock().expect("sim node lock").clone()
    }
}

/// Starts the Kubernetes API double on the (loopback) cluster endpoint `api_ip` and the Talos
/// doubles' registry that hands out its kubeconfig: the rack's cluster side, as `demo` and
/// `talboot up`'s simulated-rack tests run it.
pub(crate) async fn start_api_double(
    inv: &Inventory,
    api_ip: Ipv4Addr,
) -> Result<(Arc<KubeDouble>, FakeCluster), DemoError> {
    let kube = KubeDouble::start(DoubleOptions {
        bind: SocketAddr::new(IpAddr::V4(api_ip), KUBE_API_PORT),
        // Without talboot's Cilium the operator brings the CNI; the simulation then
        // lets Nodes turn Ready as soon as they register.
        cni_daemonset: cilium_enabled(inv).then(|| ("kube-system".into(), "cilium".into())),
        nodes: Vec::new(),
        crd_delay: Duration::from_millis(200),
        rollout_delay: Duration::from_millis(400),
    })
    .await
    .map_err(SimFailure::from)?;
    let kube = Arc::new(kube);
    let cluster = FakeCluster::new();
    cluster.set_kubeconfig(Some(kube.kubeconfig().to_owned()));
    Ok((kube, cluster))
}

/// Powers on every machine of the (loopback) inventory `inv` against talboot's sockets
/// `wire`, one every `stagger` (all at once when zero), until `stop`; `to_rack` names each
/// machine's address on the real rack.
pub(crate) fn power_on(
    inv: &Inventory,
    to_rack: impl Fn(Ipv4Addr) -> Ipv4Addr,
    wire: Wire,
    cluster: &FakeCluster,
    kube: &Arc<KubeDouble>,
    stop: &CancellationToken,
    stagger: Duration,
) -> (Vec<Arc<SimNode>>, Vec<JoinHandle<()>>) {
    let mut nodes = Vec::new();
    let mut tasks = Vec::new();
    for (i, n) in inv.nodes.iter().enumerate() {
        let address = n.address.value.addr();
        let relay = inv
            .network
            .relays
            .iter()
            .find(|r| r.subnet.value.contains(&address))
            .map(|r| {
                r.gateway
                    .as_ref()
                    .map(|g| g.value)
                    .unwrap_or_else(|| r.subnet.value.hosts().next().unwrap_or(address))
            });
        let node = Arc::new(SimNode {
            machine: Machine::from_inventory(inv, n, relay),
            rack_address: to_rack(address),
            role: n.role.value.clone(),
            secure_boot: n.secure_boot(),
            talos: Mutex::new(None),
        });
        nodes.push(node.clone());
        let (cluster, kube, stop) = (cluster.clone(), kube.clone(), stop.clone());
        // Each machine boots the Talos the inventory names (its doubles behave as that minor).
        let version = inv.cluster.talos_version.value.to_string();
        let delay = stagger.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = async {
                    tokio::time::sleep(delay).await;
                    run_machine(node, wire, cluster, kube, version).await;
                } => {}
            }
        }));
    }
    (nodes, tasks)
}

/// The stand-in boot hook: on every reboot the machine goes through its firmware's network
/// boot again before Talos comes back (to disk after an install, to maintenance after a
/// reset), as a machine whose boot order starts with the network does.
fn boot_hook(node: Arc<SimNode>, wire: Wire) -> BootHook {
    Arc::new(move |reason: BootReason| {
        let node = node.clone();
        Box::pin(async move {
            for attempt in 1..=5 {
                match node.machine.network_boot(wire).await {
                    Ok(booted) => {
                        tracing::debug!(machine = %node.machine.name, ?reason, ?booted, "rebooted");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(machine = %node.machine.name, attempt, error = %e, "network boot failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        })
    })
}

/// Powers on one machine: network boot until a kernel runs, then Talos `version` in
/// maintenance mode on the leased address; registers its Node once Talos runs configured.
async fn run_machine(
    node: Arc<SimNode>,
    wire: Wire,
    cluster: FakeCluster,
    kube: Arc<KubeDouble>,
    version: String,
) {
    let name = node.machine.name.clone();
    let address = loop {
        match node.machine.network_boot(wire).await {
            Ok(Booted::Kernel { address, .. }) => break address,
            Ok(Booted::LocalDisk { .. }) => {
                tracing::warn!(machine = %name, "told to boot an empty disk; retrying the network");
            }
            Err(e) => tracing::warn!(machine = %name, error = %e, "network boot failed; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut cfg = FakeNodeConfig::new(IpAddr::V4(address), &name);
    cfg.disks = node.machine.disks.clone();
    cfg.system_uuid = node.machine.uuid.clone();
    cfg.aliases = vec![IpAddr::V4(node.rack_address)];
    cfg.boot_hook = Some(boot_hook(node.clone(), wire));
    cfg.talos_version = version;
    if node.secure_boot {
        cfg.security = SimSecurity::secure_boot(&crate::sim::assets::sim_pcr_key());
    }
    let talos = match FakeTalosNode::start(cfg, &cluster).await {
        Ok(t) => Arc::new(t),
        Err(e) => {
            eprintln!("simulated Talos on {name} ({address}) could not start: {e}");
            return;
        }
    };
    let mut phases = talos.subscribe_phase();
    *node.talos.lock().expect("sim node lock") = Some(talos);
    let mut registered = false;
    loop {
        if !registered && *phases.borrow_and_update() == Phase::Secured {
            // The kubelet of a configured node registers it with the API server.
            kube.register_node(&name);
            registered = true;
        }
        if phases.changed().await.is_err() {
            return;
        }
    }
}
