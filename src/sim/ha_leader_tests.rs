//! Two appliances on one real etcd provisioning a simulated rack (the strict Talos doubles of
//! [`crate::sim::talos`]): the leader dies abruptly mid-provisioning (its runtime dropped with
//! every task, nothing resigned, so its session lease has to expire), the follower takes over
//! and finishes, and the doubles' counters show Bootstrap made once and every config applied
//! once.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::appliance::{Plan, ProvisioningPlan};
use crate::artifacts::Catalog;
use crate::events::EventKind;
use crate::inventory::{Inventory, Node};
use crate::sim::pki::{SimCa, talos_label};
use crate::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode};
use crate::store::election::Election;
use crate::store::etcd_testing::EtcdServer;
use crate::store::{self, LeaseState, NodePhase, Store, StoreSpec};

const MACHINES: &[(&str, u8, bool)] = &[("cp-1", 11, true), ("w-1", 21, false), ("w-2", 22, false)];
/// Every machine's name.
const ALL: &[&str] = &["cp-1", "w-1", "w-2"];
/// Bound on the whole run after the failover.
const FINISH: Duration = Duration::from_secs(120);

/// A minimal v1alpha1 config the doubles accept: machine type, the OS CA (key for control
/// planes), install disk, cluster endpoint.
struct Renderer {
    ca: SimCa,
    net: u8,
}

impl crate::machineconfig::renderer::ConfigRenderer for Renderer {
    fn render(&self, node: &Node) -> Result<Vec<u8>, crate::machineconfig::renderer::RenderError> {
        let cp = node.name.as_str().starts_with("cp");
        let key = if cp {
            STANDARD.encode(self.ca.key_pem_talos_label())
        } else {
            String::new()
        };
        Ok(format!(
            "version: v1alpha1\nmachine:\n  type: {ty}\n  token: abcdef.0123456789abcdef\n  \
             ca:\n    crt: {crt}\n    key: \"{key}\"\n  install:\n    disk: /dev/sda\n\
             cluster:\n  clusterName: ha\n  controlPlane:\n    endpoint: https://127.0.{net}.100:6443\n  \
             ca:\n    crt: {crt}\n    key: \"{key}\"\n",
            ty = if cp { "controlplane" } else { "worker" },
            crt = STANDARD.encode(&self.ca.cert_pem),
            net = self.net,
        )
        .into_bytes())
    }
}

fn mac(net: u8, last: u8) -> String {
    format!("02:00:00:{net:02x}:00:{last:02x}")
}

fn inventory(dir: &std::path::Path, net: u8) -> Arc<Inventory> {
    let mut y = format!(
        "cluster:\n  name: ha\n  talosVersion: {}\n  kubernetesVersion: 1.36.3\n  \
         endpoint: https://127.0.{net}.100:6443\n  vip: 127.0.{net}.100\n  secrets:\n    \
         file: secrets.age\nnetwork:\n  interfaces: [lo]\n  mode: authoritative\n  \
         subnet: 127.0.{net}.0/24\nboot:\n  delivery: push\nnodes:\n",
        crate::sim::talos::TALOS_TAG,
        net = net
    );
    for (name, last, cp) in MACHINES {
        y.push_str(&format!(
            "  - name: {name}\n    mac: \"{}\"\n    role: {}\n    address: 127.0.{net}.{last}/24\n    \
             installDisk: /dev/sda\n",
            mac(net, *last),
            if *cp { "controlplane" } else { "worker" },
        ));
    }
    let path = dir.join("talboot.yaml");
    std::fs::write(&path, y).unwrap();
    Arc::new(crate::inventory::load(&path).unwrap().inventory)
}

/// One appliance's plan on the shared etcd: HTTP and admin on loopback, push provisioning.
fn plan(
    inv: &Arc<Inventory>,
    etcd: &EtcdServer,
    ca: &SimCa,
    dir: &std::path::Path,
    net: u8,
) -> Plan {
    let admin = ca.admin().unwrap();
    let creds = crate::talos::ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: admin.cert_pem.into_bytes(),
        key_pem: talos_label(&admin.key_pem).into_bytes(),
    };
    std::fs::create_dir_all(dir).unwrap();
    let mut settings = crate::provision::Settings::new(dir.to_path_buf());
    settings.poll_interval = Duration::from_millis(50);
    settings.health_timeout = Duration::from_secs(60);
    Plan {
        inventory: inv.clone(),
        catalog: Catalog::load(dir).unwrap(),
        images_dir: dir.into(),
        ipxe_dir: dir.into(),
        configs: dir.into(),
        store: StoreSpec::Etcd(etcd.config("ha")),
        name: dir.file_name().unwrap().to_string_lossy().into_owned(),
        advertise: Ipv4Addr::LOCALHOST,
        http: (Ipv4Addr::LOCALHOST, 0).into(),
        admin: (Ipv4Addr::LOCALHOST, 0).into(),
        admin_token: None,
        admin_hosts: Default::default(),
        http_limits: Default::default(),
        tftp: None,
        dhcp: None,
        provisioning: Some(ProvisioningPlan {
            renderer: Arc::new(Renderer {
                ca: ca.clone(),
                net,
            }),
            creds,
            settings,
        }),
        ipv6_ra: None,
        drift: None,
        power_on: None,
    }
}

/// An appliance on a runtime of its own, on its own thread, so that the test can kill it as
/// `kill -9` would: its runtime dropped with every task mid-await, nothing resigned.
struct Process {
    admin_url: String,
    kill: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Process {
    /// Start `plan`; the kernel fetch of each of `boots` is published on its bus, as its
    /// HTTP server would once a machine network-boots Talos from it.
    fn start(plan: Plan, boots: &'static [&'static str]) -> Self {
        let (up, started) = std::sync::mpsc::channel();
        let (kill, killed) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let running = rt.block_on(async { plan.bind().await.unwrap().start().unwrap() });
            for name in boots {
                running
                    .events
                    .publish(name, EventKind::Kernel, "vmlinuz sent");
            }
            up.send(running.admin_url.clone()).unwrap();
            let _ = killed.recv();
            // Tasks are dropped where they stand; the store (and its keep-alive) with them.
            rt.shutdown_background();
            drop(running);
        });
        let admin_url = started.recv().expect("the appliance starts");
        Self {
            admin_url,
            kill,
            thread,
        }
    }

    fn kill(self) {
        let _ = self.kill.send(());
        self.thread.join().unwrap();
    }
}

/// Wait (bounded) until `f` holds.
async fn until(what: &str, bound: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + bound;
    while !f() {
        assert!(Instant::now() < deadline, "not within {bound:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The rack: three doubles with leases in the shared store, and a store to watch it by.
struct Rack {
    dir: tempfile::TempDir,
    inv: Arc<Inventory>,
    ca: SimCa,
    nodes: Vec<FakeTalosNode>,
    probe: Arc<store::EtcdStore>,
    _api: tokio::net::TcpListener,
    _cluster: FakeCluster,
    _seed: store::Opened,
    net: u8,
}

impl Rack {
    async fn start(etcd: &EtcdServer, net: u8) -> Self {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let inv = inventory(dir.path(), net);
        let api = tokio::net::TcpListener::bind(format!("127.0.{net}.100:6443"))
            .await
            .unwrap();
        let cluster = FakeCluster::new();
        let mut nodes = Vec::new();
        for (name, last, _) in MACHINES {
            let cfg = FakeNodeConfig::new(IpAddr::from([127, 0, net, *last]), name);
            nodes.push(FakeTalosNode::start(cfg, &cluster).await.unwrap());
        }
        // The DHCP server's leases, in the shared store.
        let seed = StoreSpec::Etcd(etcd.config("ha")).open().unwrap();
        let now = crate::events::Clock::now_unix(&crate::events::SystemClock);
        for (name, last, _) in MACHINES {
            let lease = store::Lease {
                mac: mac(net, *last).parse().unwrap(),
                ip: Ipv4Addr::new(127, 0, net, *last),
                hostname: Some((*name).into()),
                state: LeaseState::Bound,
                expires_at_unix: now + 3600,
                updated_at_unix: now,
            };
            seed.writers.leases.put_lease(&lease).unwrap();
        }
        Self {
            dir,
            inv,
            ca: SimCa::new_os_ca().unwrap(),
            nodes,
            probe: seed.etcd.clone().unwrap(),
            _api: api,
            _cluster: cluster,
            _seed: seed,
            net,
        }
    }

    fn appliance(&self, etcd: &EtcdServer, name: &str, boots: &'static [&'static str]) -> Process {
        Process::start(
            plan(
                &self.inv,
                etcd,
                &self.ca,
                &self.dir.path().join(name),
                self.net,
            ),
            boots,
        )
    }

    fn applied(&self) -> usize {
        self.nodes.iter().map(|n| n.apply_calls()).sum()
    }

    fn bootstrap_mark(&self) -> Option<Vec<u8>> {
        let key = crate::provision::cluster::BOOTSTRAP_KEY;
        self.probe
            .row(store::ClusterTable::Progress, key)
            .ok()
            .flatten()
    }

    fn all_ready(&self) -> bool {
        let nodes = self.probe.nodes().unwrap_or_default();
        nodes.len() == MACHINES.len() && nodes.iter().all(|r| r.phase == NodePhase::Ready)
    }
}

/// a leads and provisions; it is killed once `kill_when` holds; b takes over and finishes:
/// Bootstrap once, one config per node, every node Ready.
async fn failover(net: u8, members: usize, kill_when: impl Fn(&Rack) -> bool) {
    let Some(etcd) = EtcdServer::start_cluster(members) else {
        return;
    };
    let rack = Rack::start(&etcd, net).await;
    let election = Election::new(&rack.probe, Duration::from_secs(5));
    let a = rack.appliance(&etcd, "a", ALL);
    until_leader(&election, &a.admin_url).await;
    let b = rack.appliance(&etcd, "b", &[]);
    follower_refuses(&b.admin_url, &a.admin_url).await;
    until("the kill point", Duration::from_secs(60), || {
        kill_when(&rack)
    })
    .await;
    let at_kill = (rack.applied(), rack.bootstrap_mark());
    let killed = Instant::now();
    a.kill();
    until_leader(&election, &b.admin_url).await;
    eprintln!("failover: b leads {:?} after a's kill", killed.elapsed());
    until("b finishes", FINISH, || {
        rack.all_ready() && rack.bootstrap_mark().as_deref() == Some(&b"done"[..])
    })
    .await;
    let bootstraps: usize = rack.nodes.iter().map(|n| n.bootstrap_calls()).sum();
    assert_eq!(
        bootstraps, 1,
        "Bootstrap made {bootstraps} times (at the kill: {at_kill:?})"
    );
    for (n, (name, _, _)) in rack.nodes.iter().zip(MACHINES) {
        let applies = n.apply_calls();
        assert_eq!(
            applies, 1,
            "{name} got its config {applies} times (at the kill: {at_kill:?})"
        );
    }
    b.kill();
}

/// A rebuild sent to the follower is refused with 421, naming the leader's admin API.
async fn follower_refuses(follower: &str, leader: &str) {
    let resp = reqwest::Client::new()
        .post(format!("{follower}/api/nodes/w-1/rebuild"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::MISDIRECTED_REQUEST);
    let body = resp.text().await.unwrap();
    assert!(body.contains(leader), "{body}");
    let who = reqwest::get(format!("{follower}/api/leader"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let who: serde_json::Value = serde_json::from_slice(&who).unwrap();
    assert_eq!(who["leading"], false, "{who}");
    assert_eq!(who["leader"]["admin_url"], leader, "{who}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_dies_after_a_config_push_and_the_follower_finishes_without_repeating() {
    failover(77, 1, |r| r.applied() >= 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_dies_at_its_bootstrap_intent_and_the_follower_does_not_bootstrap_again() {
    failover(78, 1, |r| r.bootstrap_mark().is_some()).await;
}

/// Wait (bounded) until the appliance at `admin_url` leads.
async fn until_leader(election: &Election, admin_url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if election
            .leader()
            .await
            .ok()
            .flatten()
            .is_some_and(|l| l.admin_url == admin_url)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{admin_url} does not lead within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The same on a 3-member etcd (the client balances over the members).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_dies_mid_provisioning_on_a_three_member_etcd() {
    failover(80, 3, |r| r.applied() >= 1).await;
}

/// Machines that network-boot from the follower (its HTTP server publishes their kernel
/// fetch on its own bus, so only the shared store has it) are provisioned by the leader
/// (`leader::relay_boots`; without it they wait for the leader's next restart), and only by
/// it (one config each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_booting_from_the_follower_are_provisioned_by_the_leader() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let rack = Rack::start(&etcd, 79).await;
    let election = Election::new(&rack.probe, Duration::from_secs(5));
    let a = rack.appliance(&etcd, "a", &["cp-1"]);
    until_leader(&election, &a.admin_url).await;
    // Once cp-1 has its config, the leader's run loop has had its first look at every node
    // (one pass over the inventory), and found no boot of the workers in the store.
    until("cp-1's config", Duration::from_secs(60), || {
        rack.nodes[0].apply_calls() == 1
    })
    .await;
    let b = rack.appliance(&etcd, "b", &["w-1", "w-2"]);
    until(
        "the leader applies the workers' configs",
        Duration::from_secs(60),
        || rack.nodes.iter().all(|n| n.apply_calls() == 1),
    )
    .await;
    until_leader(&election, &a.admin_url).await;
    b.kill();
    a.kill();
}
