//! Push provisioning end to end on loopback, against the strict fake Talos node
//! (src/sim/talos.rs): leases in the store → maintenance probe → disk check →
//! ApplyConfiguration (mode AUTO) → secured API → Bootstrap once → health → kubeconfig 0600,
//! with talboot "killed and restarted" (provisioner, event bus and store dropped and reopened)
//! between every single step. Also: disk-selector refusal, relay through the first control
//! plane, wrong CA, bootstrap intent after a crash, health timeout, `talboot status` and
//! `talboot node rebuild`. Each test uses its own 127.0.N.0/24, port 50000 like apid.

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use talboot::events::{EventBus, EventKind, SystemClock};
use talboot::inventory::{InstallTarget, Inventory, MachineType, Node};
use talboot::provision::cluster::{BOOTSTRAP_KEY, KUBECONFIG_FILE};
use talboot::provision::{
    ClusterProgress, ConfigRenderer, NodeStep, ProvisionError, Provisioner, Settings,
};
use talboot::sim::pki::{SimCa, talos_label};
use talboot::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase, TALOS_TAG};
use talboot::store::{self, Lease, LeaseState, NodePhase, Store};
use talboot::talos::api::machine::apply_configuration_request::Mode;
use talboot::talos::api::storage;
use talboot::talos::{ClientCreds, TalosClient, TalosError};

/// The test renderer: a minimal v1alpha1 config with the OS CA from the test PKI (control
/// planes get the key too), the machine type from the node's role and its install target. The
/// same CA stands in for the Kubernetes CA (`cluster.ca`), which Talos needs for a kubeconfig.
struct TestRenderer {
    inventory: Arc<Inventory>,
    ca: SimCa,
}

impl ConfigRenderer for TestRenderer {
    fn render(&self, node: &Node) -> Result<Vec<u8>, String> {
        let cp = self.inventory.role_of(node).machine_type == MachineType::ControlPlane;
        let key = if cp {
            STANDARD.encode(self.ca.key_pem_talos_label())
        } else {
            String::new()
        };
        let install = match &node.install {
            InstallTarget::Disk(d) => format!("disk: {d}"),
            InstallTarget::Selector(s) => format!(
                "diskSelector:\n      type: {}",
                s.disk_type.map(|t| t.as_str()).unwrap_or("ssd")
            ),
        };
        Ok(format!(
            "version: v1alpha1\nmachine:\n  type: {ty}\n  token: abcdef.0123456789abcdef\n  \
             ca:\n    crt: {crt}\n    key: \"{key}\"\n  install:\n    {install}\n\
             cluster:\n  clusterName: {name}\n  controlPlane:\n    endpoint: {ep}\n  \
             ca:\n    crt: {crt}\n    key: \"{key}\"\n",
            ty = if cp { "controlplane" } else { "worker" },
            crt = STANDARD.encode(&self.ca.cert_pem),
            name = self.inventory.cluster.name.as_str(),
            ep = format!("https://{}", endpoint_ip_of(&self.inventory)) + ":6443",
        )
        .into_bytes())
    }
}

fn endpoint_ip_of(inv: &Inventory) -> Ipv4Addr {
    inv.cluster.vip.as_ref().unwrap().value
}

fn ip(net: u8, last: u8) -> IpAddr {
    IpAddr::from([127, 0, net, last])
}

fn mac(net: u8, last: u8) -> String {
    format!("02:00:00:{net:02x}:00:{last:02x}")
}

/// One machine of a test: name, last octet, control plane or not, install YAML lines.
struct Machine {
    name: &'static str,
    last: u8,
    cp: bool,
    install: &'static str,
}

fn cp(name: &'static str, last: u8) -> Machine {
    Machine {
        name,
        last,
        cp: true,
        install: "installDisk: /dev/sda",
    }
}

fn worker(name: &'static str, last: u8) -> Machine {
    Machine {
        name,
        last,
        cp: false,
        install: "diskSelector: {type: ssd, size: \"<= 200GB\"}",
    }
}

fn inventory_yaml(net: u8, machines: &[Machine]) -> String {
    let mut y = format!(
        "cluster:\n  name: e2e\n  talosVersion: v1.13.9\n  kubernetesVersion: 1.36.3\n  \
         endpoint: https://127.0.{net}.100:6443\n  vip: 127.0.{net}.100\n  secrets:\n    \
         file: secrets.age\nnetwork:\n  interfaces: [lo]\n  mode: authoritative\n  \
         subnet: 127.0.{net}.0/24\nboot:\n  delivery: push\nnodes:\n"
    );
    for m in machines {
        y.push_str(&format!(
            "  - name: {}\n    mac: \"{}\"\n    role: {}\n    address: 127.0.{net}.{}/24\n    {}\n",
            m.name,
            mac(net, m.last),
            if m.cp { "controlplane" } else { "worker" },
            m.last,
            m.install
        ));
    }
    y
}

fn admin_creds(ca: &SimCa) -> ClientCreds {
    let admin = ca.admin().unwrap();
    ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: admin.cert_pem.into_bytes(),
        key_pem: talos_label(&admin.key_pem).into_bytes(),
    }
}

fn talosconfig(creds: &ClientCreds) -> String {
    format!(
        "context: e2e\ncontexts:\n  e2e:\n    endpoints: []\n    ca: {}\n    crt: {}\n    key: {}\n",
        STANDARD.encode(&creds.ca_pem),
        STANDARD.encode(&creds.crt_pem),
        STANDARD.encode(&creds.key_pem)
    )
}

/// A test world: inventory file, state dir, fake nodes with leases in the store.
struct World {
    dir: tempfile::TempDir,
    inventory: Arc<Inventory>,
    ca: SimCa,
    creds: ClientCreds,
    nodes: Vec<(String, FakeTalosNode)>,
    _cluster: FakeCluster,
}

impl World {
    async fn start(net: u8, machines: &[Machine], tweak: impl Fn(&mut FakeNodeConfig)) -> Self {
        talboot::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let inv_path = dir.path().join("talboot.yaml");
        std::fs::write(&inv_path, inventory_yaml(net, machines)).unwrap();
        let inventory = Arc::new(talboot::inventory::load(&inv_path).unwrap().inventory);
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let cluster = FakeCluster::new();
        let mut nodes = Vec::new();
        for m in machines {
            let mut cfg = FakeNodeConfig::new(ip(net, m.last), m.name);
            tweak(&mut cfg);
            nodes.push((
                m.name.to_owned(),
                FakeTalosNode::start(cfg, &cluster).await.unwrap(),
            ));
        }
        let ca = SimCa::new_os_ca().unwrap();
        let creds = admin_creds(&ca);
        let world = Self {
            dir,
            inventory,
            ca,
            creds,
            nodes,
            _cluster: cluster,
        };
        // The DHCP server's leases, as it would have written them.
        let store = store::open(&world.state_dir()).unwrap();
        let now = talboot::events::Clock::now_unix(&SystemClock);
        for m in machines {
            let IpAddr::V4(v4) = ip(net, m.last) else {
                unreachable!()
            };
            store
                .put_lease(
                    &Lease {
                        mac: mac(net, m.last).parse().unwrap(),
                        ip: v4,
                        hostname: Some(m.name.into()),
                        state: LeaseState::Bound,
                        expires_at_unix: now + 3600,
                        updated_at_unix: now,
                    },
                    now,
                )
                .unwrap();
        }
        world
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn inv_path(&self) -> PathBuf {
        self.dir.path().join("talboot.yaml")
    }

    fn node(&self, name: &str) -> &FakeTalosNode {
        &self.nodes.iter().find(|(n, _)| n == name).unwrap().1
    }

    /// A fresh talboot: store opened, bus started, provisioner built.
    fn boot(&self) -> Talboot {
        self.boot_with(self.creds.clone(), Duration::from_secs(60))
    }

    fn boot_with(&self, creds: ClientCreds, health_timeout: Duration) -> Talboot {
        let store: Arc<dyn Store> = Arc::new(store::open(&self.state_dir()).unwrap());
        let (bus, writer) = EventBus::start(store.clone(), Arc::new(SystemClock));
        let mut settings = Settings::new(self.state_dir());
        settings.health_timeout = health_timeout;
        settings.poll_interval = Duration::from_millis(50);
        let renderer = Arc::new(TestRenderer {
            inventory: self.inventory.clone(),
            ca: self.ca.clone(),
        });
        Talboot {
            prov: Some(Provisioner::new(
                self.inventory.clone(),
                store,
                bus.clone(),
                renderer,
                creds,
                settings,
            )),
            bus: Some(bus),
            writer,
        }
    }

    /// Steps `name` with a restart before every step until it settles, letting the fake
    /// node finish rebooting whenever talboot has to wait.
    async fn provision(&self, name: &str) -> Vec<NodeStep> {
        let mut steps = Vec::new();
        for _ in 0..20 {
            let t = self.boot();
            let step = t.prov().step_node(name).await.unwrap();
            t.kill().await;
            steps.push(step.clone());
            match step {
                NodeStep::Settled => return steps,
                NodeStep::Advanced(_) => {}
                NodeStep::Waiting(_) => settle(self.node(name)).await,
            }
        }
        panic!("{name} never settled: {steps:?}");
    }

    /// Cluster steps with a restart before every step until done.
    async fn cluster_steps(&self) -> Vec<ClusterProgress> {
        let mut seen = Vec::new();
        for _ in 0..10 {
            let t = self.boot();
            let p = t.prov().step_cluster().await.unwrap();
            t.kill().await;
            seen.push(p.clone());
            if p == ClusterProgress::Done {
                return seen;
            }
        }
        panic!("cluster never done: {seen:?}");
    }

    fn with_store<T>(&self, f: impl FnOnce(&dyn Store) -> T) -> T {
        let store = store::open(&self.state_dir()).unwrap();
        f(&store)
    }

    fn events(&self, node: &str) -> Vec<String> {
        self.with_store(|s| {
            s.events(node, 0, 10_000)
                .unwrap()
                .into_iter()
                .map(|e| format!("{} {}", e.kind, e.detail))
                .collect()
        })
    }

    fn phase(&self, node: &str) -> NodePhase {
        self.with_store(|s| s.node(node).unwrap().unwrap().phase)
    }
}

/// Waits until a fake node is not between listeners (rebooting).
async fn settle(node: &FakeTalosNode) {
    for _ in 0..600 {
        if node.phase() != Phase::Booting {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fake node {} stuck booting", node.ip());
}

/// One running talboot; [`Talboot::kill`] drops everything and waits until its events are
/// on disk and the store file is closed.
struct Talboot {
    prov: Option<Provisioner>,
    /// The bus, as the network servers hold it (they publish boot events on it).
    bus: Option<EventBus>,
    writer: tokio::task::JoinHandle<()>,
}

impl Talboot {
    fn prov(&self) -> &Provisioner {
        self.prov.as_ref().unwrap()
    }

    async fn kill(mut self) {
        drop(self.prov.take());
        drop(self.bus.take());
        (&mut self.writer).await.unwrap();
    }
}

fn cli_args(args: &[&str]) -> talboot::cli::Cli {
    use clap::Parser as _;
    talboot::cli::Cli::try_parse_from(std::iter::once("talboot").chain(args.iter().copied()))
        .unwrap()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_control_planes_two_workers_with_restarts_between_every_step() {
    let machines = [
        cp("cp-1", 11),
        cp("cp-2", 12),
        cp("cp-3", 13),
        worker("w-1", 21),
        worker("w-2", 22),
    ];
    let world = World::start(31, &machines, |_| {}).await;
    // The Kubernetes API endpoint (VIP) answers once the cluster is up.
    let _api = tokio::net::TcpListener::bind("127.0.31.100:6443")
        .await
        .unwrap();

    for m in &machines {
        let steps = world.provision(m.name).await;
        assert!(
            steps.contains(&NodeStep::Advanced(NodePhase::Ready)),
            "{}: {steps:?}",
            m.name
        );
        assert_eq!(world.phase(m.name), NodePhase::Ready);
        let node = world.node(m.name);
        assert_eq!(node.phase(), Phase::Secured, "{}", m.name);
        assert_eq!(node.apply_calls(), 1, "{}", m.name);
        assert_eq!(
            node.last_apply_mode(),
            Some(Mode::Auto as i32),
            "{}",
            m.name
        );
    }

    let progress = world.cluster_steps().await;
    assert!(
        progress.contains(&ClusterProgress::Bootstrapped),
        "{progress:?}"
    );
    let kubeconfig_path = world.state_dir().join(KUBECONFIG_FILE);
    assert!(
        progress.contains(&ClusterProgress::KubeconfigWritten(kubeconfig_path.clone())),
        "{progress:?}"
    );
    assert_eq!(world.node("cp-1").bootstrap_calls(), 1);
    for other in ["cp-2", "cp-3", "w-1", "w-2"] {
        assert_eq!(world.node(other).bootstrap_calls(), 0, "{other}");
    }
    let meta = std::fs::metadata(&kubeconfig_path).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(
        Some(std::fs::read(&kubeconfig_path).unwrap()),
        world.node("cp-1").last_kubeconfig()
    );

    // Another restart and a full round: nothing that must not repeat does.
    let t = world.boot();
    for m in &machines {
        assert_eq!(t.prov().step_node(m.name).await.unwrap(), NodeStep::Settled);
    }
    assert_eq!(
        t.prov().step_cluster().await.unwrap(),
        ClusterProgress::Done
    );
    t.kill().await;
    assert_eq!(world.node("cp-1").bootstrap_calls(), 1);
    assert_eq!(world.node("cp-1").kubeconfig_calls(), 1);
    for m in &machines {
        assert_eq!(world.node(m.name).apply_calls(), 1, "{}", m.name);
    }

    // Every call and outcome is a node event.
    let cp1 = world.events("cp-1").join("\n");
    for needle in [
        "talos.call Version at 127.0.31.11:50000 (maintenance): v1.13.9",
        "maintenance facts from 127.0.31.11:50000",
        "serial=SN-cp-1",
        "config.released ApplyConfiguration mode=AUTO",
        "node.phase configuring -> installing",
        "(secured): v1.13.9",
        "talos.call Bootstrap at 127.0.31.11:50000: ok",
        "cluster.step healthy: etcd has 3 of 3 control-plane members; API server answers",
        "Kubeconfig at 127.0.31.11:50000: written to",
    ] {
        assert!(cp1.contains(needle), "missing {needle:?} in:\n{cp1}");
    }
    let w1 = world.events("w-1").join("\n");
    assert!(w1.contains("resolves to /dev/sda"), "{w1}");

    // `talboot status` and `talboot node rebuild` through the CLI layer, in process: the
    // test binary must not depend on a `talboot` executable another build may replace.
    let status_args = cli_args(&[
        "status",
        "-c",
        path_str(&world.inv_path()),
        "--state-dir",
        path_str(&world.state_dir()),
    ]);
    assert!(matches!(
        status_args.command,
        talboot::cli::Command::Status(_)
    ));
    let table = world.with_store(|s| {
        talboot::cli::status::table(
            &world.inventory,
            s,
            talboot::events::Clock::now_unix(&SystemClock),
        )
        .unwrap()
    });
    assert!(table.starts_with("NODE"), "{table}");
    for m in &machines {
        let row = table
            .lines()
            .find(|l| l.starts_with(m.name))
            .unwrap_or_else(|| panic!("{}: {table}", m.name));
        assert!(row.contains("ready"), "{row}");
        assert!(row.contains(&format!("127.0.31.{}", m.last)), "{row}");
        assert!(row.contains(TALOS_TAG), "{row}");
        assert!(row.contains(".call: ") || row.contains(".phase: "), "{row}");
    }

    // `talboot node rebuild w-2`: reset over the API, window reopened, config applied again
    // on the next boot, bootstrap untouched.
    std::fs::write(
        world.state_dir().join("talosconfig"),
        talosconfig(&world.creds),
    )
    .unwrap();
    let rebuild = cli_args(&[
        "node",
        "rebuild",
        "w-2",
        "-c",
        path_str(&world.inv_path()),
        "--state-dir",
        path_str(&world.state_dir()),
    ]);
    let talboot::cli::Command::Node(node_args) = rebuild.command else {
        panic!("not parsed as `node`");
    };
    // The subcommand runs its own runtime, as from main: give it a plain thread.
    let code = std::thread::spawn(move || talboot::cli::node::run(&node_args))
        .join()
        .unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let w2 = world.node("w-2");
    assert_eq!(w2.reset_calls(), 1);
    let reset = w2.last_reset().unwrap();
    assert!(reset.graceful && reset.reboot);
    let labels: Vec<_> = reset
        .system_partitions_to_wipe
        .iter()
        .map(|p| p.label.as_str())
        .collect();
    assert_eq!(labels, ["STATE", "EPHEMERAL"]);
    w2.wait_phase(Phase::Maintenance).await.unwrap();
    let rec = world.with_store(|s| s.node("w-2").unwrap().unwrap());
    assert_eq!(rec.phase, NodePhase::Booting);
    assert!(rec.provisioning_window_open);

    world.provision("w-2").await;
    assert_eq!(world.phase("w-2"), NodePhase::Ready);
    assert_eq!(w2.apply_calls(), 2);
    assert_eq!(w2.last_apply_mode(), Some(Mode::Auto as i32));
    assert_eq!(world.cluster_steps().await, [ClusterProgress::Done]);
    assert_eq!(world.node("cp-1").bootstrap_calls(), 1);
}

#[tokio::test]
async fn bootstrap_intent_from_a_crashed_run_is_not_repeated_and_health_timeout_holds() {
    let machines = [cp("cp-1", 11), cp("cp-2", 12)];
    let world = World::start(32, &machines, |_| {}).await;
    for m in &machines {
        world.provision(m.name).await;
    }
    // A run recorded its intent, made the call, and died before recording "done".
    world.with_store(|s| s.put_meta(BOOTSTRAP_KEY, b"intent").unwrap());
    let cp1 = world.node("cp-1");
    TalosClient::secured(cp1.addr(), &world.creds)
        .unwrap()
        .bootstrap()
        .await
        .unwrap();
    assert_eq!(cp1.bootstrap_calls(), 1);

    // No API server listens on the endpoint: the health wait must give up at its deadline.
    let t = world.boot_with(world.creds.clone(), Duration::from_millis(300));
    assert_eq!(
        t.prov().step_cluster().await.unwrap(),
        ClusterProgress::Bootstrapped
    );
    let err = t.prov().step_cluster().await.unwrap_err();
    match &err {
        ProvisionError::HealthTimeout { after, last } => {
            assert_eq!(*after, Duration::from_millis(300));
            assert!(last.contains("API server does not answer"), "{last}");
        }
        other => panic!("{other:?}"),
    }
    t.kill().await;
    assert_eq!(cp1.bootstrap_calls(), 1);
    assert_eq!(world.node("cp-2").bootstrap_calls(), 0);
    let events = world.events("cp-1").join("\n");
    assert!(
        events.contains("bootstrap intent found from an earlier run"),
        "{events}"
    );
    assert!(events.contains("bootstrap not called again"), "{events}");
    assert!(events.contains("health wait failed"), "{events}");
    assert!(!world.state_dir().join(KUBECONFIG_FILE).exists());
}

#[tokio::test]
async fn ambiguous_disk_selector_is_refused_with_every_disk_listed() {
    let machines = [cp("cp-1", 11), worker("w-1", 21)];
    let world = World::start(33, &machines, |cfg| {
        if cfg.hostname != "w-1" {
            return;
        }
        // Two small SSDs: the selector `type: ssd, size <= 200GB` matches both.
        let mut second = cfg.disks[0].clone();
        second.device_name = "sdb".into();
        second.serial = "SN-second".into();
        second.bus_path = "/pci0000:00/0000:00:06.0/virtio3/host3/target3:0:0/3:0:0:0".into();
        second.model = "Other SSD".into();
        cfg.disks.push(second);
        cfg.disks.push(storage::Disk {
            size: 4_000_000_000_000,
            model: "Big HDD".into(),
            device_name: "sdc".into(),
            serial: "SN-big".into(),
            r#type: storage::disk::DiskType::Hdd as i32,
            bus_path: "/pci0000:00/0000:00:07.0/ata1".into(),
            ..Default::default()
        });
    })
    .await;
    let t = world.boot();
    assert_eq!(
        t.prov().step_node("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    let err = t.prov().step_node("w-1").await.unwrap_err();
    assert!(matches!(err, ProvisionError::Disk { .. }), "{err:?}");

    // Its window is still open (nothing was applied): when it boots again (the DHCP server
    // publishes the ack), the running provisioner tries again, and refuses again.
    let bus = t.bus.clone().unwrap();
    let mut seen = bus.subscribe();
    let cancel = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(t.prov().clone().run(cancel.clone()));
    let watch = async {
        let mut retried = false;
        loop {
            let ev = seen.recv().await.unwrap();
            if ev.node == "w-1" && ev.kind == EventKind::Phase {
                retried |= ev.detail.starts_with("failed -> booting: boot seen");
                if retried && ev.detail.contains("-> failed: install disk refused") {
                    return;
                }
            }
        }
    };
    tokio::task::yield_now().await;
    bus.publish("w-1", EventKind::DhcpAck, "acked 127.0.33.21");
    tokio::time::timeout(Duration::from_secs(60), watch)
        .await
        .expect("no second attempt after the boot event");
    cancel.cancel();
    run.await.unwrap();
    // Every bus clone must go for the event writer (and the store) to close.
    drop(bus);
    t.kill().await;
    assert_eq!(world.phase("w-1"), NodePhase::Failed);
    assert_eq!(world.node("w-1").apply_calls(), 0);
    let last = world
        .with_store(|s| s.last_event("w-1").unwrap().unwrap())
        .detail;
    assert!(
        last.contains("matches 2 disks (/dev/sda, /dev/sdb)"),
        "{last}"
    );
    for needle in [
        "/dev/sda model=QEMU HARDDISK serial=SN-w-1 size=100.0 GB busPath=/pci0000:00/0000:00:05.0",
        "/dev/sdb model=Other SSD serial=SN-second",
        "/dev/sdc model=Big HDD serial=SN-big size=4.0 TB busPath=/pci0000:00/0000:00:07.0/ata1",
        "transport=virtio",
    ] {
        assert!(last.contains(needle), "missing {needle:?} in {last}");
    }
}

#[tokio::test]
async fn worker_reachable_only_through_the_first_control_plane() {
    let machines = [cp("cp-1", 11), worker("w-1", 21)];
    let world = World::start(34, &machines, |_| {}).await;
    world.provision("cp-1").await;

    let w1 = world.node("w-1");
    let t = world.boot();
    assert_eq!(
        t.prov().step_node("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    assert_eq!(
        t.prov().step_node("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Installing)
    );
    t.kill().await;
    // From now on only the control plane may connect to the worker.
    w1.restrict_to(Some(world.node("cp-1").ip()));
    w1.wait_phase(Phase::Secured).await.unwrap();

    let t = world.boot();
    assert_eq!(
        t.prov().step_node("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Ready)
    );
    t.kill().await;
    let served = w1.served();
    assert!(
        served.iter().any(|s| s.rpc == "Version" && s.relayed),
        "{served:?}"
    );
    let events = world.events("w-1").join("\n");
    assert!(
        events.contains(
            "Version at node 127.0.34.21 (via 127.0.34.11:50000) (relayed) (secured): v1.13.9"
        ),
        "{events}"
    );
}

#[tokio::test]
async fn wrong_ca_is_reported_and_fails_the_node() {
    let machines = [cp("cp-1", 11)];
    let world = World::start(35, &machines, |_| {}).await;
    let other = admin_creds(&SimCa::new_os_ca().unwrap());
    let node = world.node("cp-1");
    let t = world.boot_with(other.clone(), Duration::from_secs(1));
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Installing)
    );
    node.wait_phase(Phase::Secured).await.unwrap();
    let err = t.prov().step_node("cp-1").await.unwrap_err();
    assert!(
        matches!(
            err,
            ProvisionError::Talos {
                source: TalosError::WrongCa { .. },
                ..
            }
        ),
        "{err:?}"
    );
    t.kill().await;
    assert_eq!(world.phase("cp-1"), NodePhase::Failed);
    let events = world.events("cp-1").join("\n");
    assert!(
        events.contains("does not verify against the cluster's OS CA"),
        "{events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_loop_polls_nodes_and_cluster_to_a_kubeconfig() {
    let machines = [cp("cp-1", 11), worker("w-1", 21)];
    let world = World::start(36, &machines, |_| {}).await;
    let _api = tokio::net::TcpListener::bind("127.0.36.100:6443")
        .await
        .unwrap();
    let t = world.boot();
    let prov = t.prov().clone();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(prov.run(cancel.clone()));
    let kubeconfig = world.state_dir().join(KUBECONFIG_FILE);
    let mut done = false;
    for _ in 0..1500 {
        if kubeconfig.exists() {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    task.await.unwrap();
    t.kill().await;
    assert!(
        done,
        "no kubeconfig; cp-1 events: {:#?}",
        world.events("cp-1")
    );
    assert_eq!(world.phase("cp-1"), NodePhase::Ready);
    assert_eq!(world.phase("w-1"), NodePhase::Ready);
    assert_eq!(world.node("cp-1").bootstrap_calls(), 1);
    assert_eq!(world.node("w-1").apply_calls(), 1);
}
