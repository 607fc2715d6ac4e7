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
use talboot::machineconfig::renderer::ConfigRenderer;
use talboot::provision::cluster::{BOOTSTRAP_KEY, KUBECONFIG_FILE};
use talboot::provision::{
    ClusterProgress, NodeStep, ProvisionError, ProvisionWriters, Provisioner, Settings,
};
use talboot::sim::disks::SimDisk;
use talboot::sim::pki::{SimCa, talos_label};
use talboot::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase, TALOS_TAG};
use talboot::store::{self, Lease, LeaseState, NodePhase, Store};
use talboot::talos::api::machine::apply_configuration_request::Mode;
use talboot::talos::{ClientCreds, TalosClient, TalosError};

/// The test renderer: a minimal v1alpha1 config with the OS CA from the test PKI (control
/// planes get the key too), the machine type from the node's role and its install target. The
/// same CA stands in for the Kubernetes CA (`cluster.ca`), which Talos needs for a kubeconfig.
/// For an inventory at Talos v1.14 an install disk path goes into `UnattendedInstallConfig`
/// (as talboot's renderer writes it) instead of `.machine.install`.
struct TestRenderer {
    inventory: Arc<Inventory>,
    ca: SimCa,
}

impl ConfigRenderer for TestRenderer {
    fn render(
        &self,
        node: &Node,
    ) -> Result<Vec<u8>, talboot::machineconfig::renderer::RenderError> {
        let cp = self.inventory.role_of(node).machine_type == MachineType::ControlPlane;
        let key = if cp {
            STANDARD.encode(self.ca.key_pem_talos_label())
        } else {
            String::new()
        };
        let v114 = self.inventory.cluster.talos_version.value.0.minor >= 14;
        let install = match &node.install {
            InstallTarget::Disk(d) if v114 => {
                return Ok(self.render_v114(cp, &key, d).into_bytes());
            }
            InstallTarget::Disk(d) => format!("disk: {d}"),
            InstallTarget::Selector(s) => {
                // Every criterion, as render.rs writes them: the double's install task
                // matches on all of them.
                let mut y = "diskSelector:".to_owned();
                for (k, v) in [
                    ("model", s.model.clone()),
                    ("serial", s.serial.clone()),
                    ("size", s.size.clone()),
                    ("type", s.disk_type.map(|t| t.as_str().to_owned())),
                    ("wwid", s.wwid.clone()),
                    ("busPath", s.bus_path.clone()),
                ] {
                    if let Some(v) = v {
                        y.push_str(&format!("\n      {k}: {v:?}"));
                    }
                }
                y
            }
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

impl TestRenderer {
    /// The v1.14 shape: no `.machine.install`, an `UnattendedInstallConfig` for `disk` with
    /// the installer image named (so the node reboots after the install).
    fn render_v114(&self, cp: bool, key: &str, disk: &str) -> String {
        format!(
            "version: v1alpha1\nmachine:\n  type: {ty}\n  token: abcdef.0123456789abcdef\n  \
             ca:\n    crt: {crt}\n    key: \"{key}\"\n\
             cluster:\n  clusterName: {name}\n  controlPlane:\n    endpoint: {ep}\n  \
             ca:\n    crt: {crt}\n    key: \"{key}\"\n---\napiVersion: v1alpha1\n\
             kind: UnattendedInstallConfig\ninstaller:\n  image: \
             factory.talos.dev/metal-installer/abc:v1.14.0\nprovisioning:\n  diskSelector:\n    \
             match: 'disk.dev_path == \"{disk}\"'\n",
            ty = if cp { "controlplane" } else { "worker" },
            crt = STANDARD.encode(&self.ca.cert_pem),
            name = self.inventory.cluster.name.as_str(),
            ep = format!("https://{}", endpoint_ip_of(&self.inventory)) + ":6443",
        )
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

fn inventory_yaml(net: u8, machines: &[Machine], talos: &str) -> String {
    let mut y = format!(
        "cluster:\n  name: e2e\n  talosVersion: {talos}\n  kubernetesVersion: 1.36.3\n  \
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
    /// Cluster steps [`World::provision`] ran (see there), until [`World::cluster_steps`]
    /// reports them.
    cluster_seen: std::sync::Mutex<Vec<ClusterProgress>>,
}

impl World {
    async fn start(net: u8, machines: &[Machine], tweak: impl Fn(&mut FakeNodeConfig)) -> Self {
        Self::start_at(net, machines, TALOS_TAG, tweak).await
    }

    /// [`Self::start`] with the inventory at Talos `talos` and the nodes running it.
    async fn start_at(
        net: u8,
        machines: &[Machine],
        talos: &str,
        tweak: impl Fn(&mut FakeNodeConfig),
    ) -> Self {
        talboot::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let inv_path = dir.path().join("talboot.yaml");
        std::fs::write(&inv_path, inventory_yaml(net, machines, talos)).unwrap();
        let inventory = Arc::new(talboot::inventory::load(&inv_path).unwrap().inventory);
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let cluster = FakeCluster::new();
        let mut nodes = Vec::new();
        for m in machines {
            let mut cfg = FakeNodeConfig::new(ip(net, m.last), m.name);
            cfg.talos_version = talos.to_owned();
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
            cluster_seen: std::sync::Mutex::default(),
        };
        // The DHCP server's leases, as it would have written them.
        let store = store::open(&world.state_dir()).unwrap().split().1.leases;
        let now = talboot::events::Clock::now_unix(&SystemClock);
        for m in machines {
            let IpAddr::V4(v4) = ip(net, m.last) else {
                unreachable!()
            };
            store
                .put_lease(&Lease {
                    mac: mac(net, m.last).parse().unwrap(),
                    ip: v4,
                    hostname: Some(m.name.into()),
                    state: LeaseState::Bound,
                    expires_at_unix: now + 3600,
                    updated_at_unix: now,
                })
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
        self.boot_tuned(creds, |s| s.health_timeout = health_timeout)
    }

    fn boot_tuned(&self, creds: ClientCreds, tune: impl FnOnce(&mut Settings)) -> Talboot {
        let (store, w) = store::open(&self.state_dir()).unwrap().split();
        let (bus, writer) = EventBus::start(w.events, Arc::new(SystemClock));
        let mut settings = Settings::new(self.state_dir());
        settings.health_timeout = Duration::from_secs(60);
        settings.poll_interval = Duration::from_millis(50);
        tune(&mut settings);
        let renderer = Arc::new(TestRenderer {
            inventory: self.inventory.clone(),
            ca: self.ca.clone(),
        });
        Talboot {
            prov: Some(Provisioner::new(
                self.inventory.clone(),
                store,
                ProvisionWriters {
                    nodes: w.nodes,
                    progress: w.progress,
                },
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
    /// node finish rebooting whenever talboot has to wait. A control plane of a new cluster
    /// becomes Ready only after Bootstrap (its etcd waits to join, so its boot never ends):
    /// while nothing is bootstrapped, a wait also runs the cluster step, as talboot's run loop
    /// does alongside (what it reports is kept for [`Self::cluster_steps`]).
    async fn provision(&self, name: &str) -> Vec<NodeStep> {
        let mut steps = Vec::new();
        for _ in 0..40 {
            let t = self.boot();
            let step = t.prov().step_node(name).await.unwrap();
            t.kill().await;
            steps.push(step.clone());
            match step {
                NodeStep::Settled => return steps,
                NodeStep::Advanced(_) => {}
                NodeStep::Waiting(_) => {
                    settle(self.node(name)).await;
                    if self.bootstrap_mark().is_none_or(|m| m == "rebuilt") {
                        let t = self.boot();
                        if let Ok(p) = t.prov().step_cluster().await {
                            self.cluster_seen.lock().unwrap().push(p);
                        }
                        t.kill().await;
                    }
                }
            }
        }
        panic!("{name} never settled: {steps:?}");
    }

    /// Steps `name` (a control plane of a new cluster) until it waits for Bootstrap:
    /// installed, booted from disk, secured API up, and not Ready.
    async fn provision_to_bootstrap(&self, name: &str) {
        for _ in 0..40 {
            let t = self.boot();
            let step = t.prov().step_node(name).await.unwrap();
            t.kill().await;
            let node = self.node(name);
            if self.phase(name) == NodePhase::Installing && node.phase() == Phase::Secured {
                return;
            }
            if matches!(step, NodeStep::Waiting(_)) {
                settle(node).await;
            }
        }
        panic!("{name} never came to wait for Bootstrap");
    }

    /// The stored bootstrap mark (`intent`, `done`, `rebuilt`), if any.
    fn bootstrap_mark(&self) -> Option<String> {
        self.with_store(|s| {
            s.row(talboot::store::ClusterTable::Progress, BOOTSTRAP_KEY)
                .unwrap()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
    }

    /// Cluster steps with a restart before every step until done (after those
    /// [`Self::provision`] ran).
    async fn cluster_steps(&self) -> Vec<ClusterProgress> {
        let mut seen = std::mem::take(&mut *self.cluster_seen.lock().unwrap());
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

    /// [`Self::with_store`] with the store's writers, as a crashed run left things.
    fn with_writers<T>(&self, f: impl FnOnce(&dyn Store, &store::Writers) -> T) -> T {
        let (store, writers) = store::open(&self.state_dir()).unwrap().split();
        f(&store, &writers)
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

/// Waits until a fake node is not between listeners (rebooting) nor installing, and a
/// little more (its boot sequence, a reset in progress, take time too).
async fn settle(node: &FakeTalosNode) {
    for _ in 0..600 {
        if !matches!(node.phase(), Phase::Booting | Phase::Installing) {
            tokio::time::sleep(Duration::from_millis(30)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fake node {} stuck booting", node.ip());
}

/// Steps `name` (one talboot, no restarts) until `done` accepts a step's outcome, at most
/// for 30 s.
async fn step_until(
    t: &Talboot,
    name: &str,
    done: impl Fn(&Result<NodeStep, ProvisionError>) -> bool,
) -> Result<NodeStep, ProvisionError> {
    for _ in 0..1500 {
        let r = t.prov().step_node(name).await;
        if done(&r) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{name}: no awaited outcome within 30 s");
}

/// The `talboot status` row of `name`.
fn status_row(world: &World, name: &str) -> String {
    let table = world.with_store(|s| {
        talboot::cli::status::table(
            &world.inventory,
            s,
            talboot::events::Clock::now_unix(&SystemClock),
        )
        .unwrap()
    });
    table
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("{name}: {table}"))
        .to_owned()
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
        "MachineStatus at 127.0.31.11:50000: stage running",
        "installed and booted from disk (machine stage running, v1.13.9)",
        "talos.call Bootstrap at 127.0.31.11:50000: ok",
        "cluster.step healthy: etcd has 3 of 3 control-plane members; API server answers",
        "Kubeconfig at 127.0.31.11:50000: written to",
    ] {
        assert!(cp1.contains(needle), "missing {needle:?} in:\n{cp1}");
    }
    let w1 = world.events("w-1").join("\n");
    assert!(w1.contains("Talos will install to /dev/sda"), "{w1}");
    // talboot's recorded install disk is the one the node's own install task took.
    for m in &machines {
        let facts = world
            .with_store(|s| talboot::store::NodeFacts::load(s, m.name))
            .unwrap();
        assert_eq!(
            Some(Ok(facts.install_disk.clone())),
            world.node(m.name).install_disk(),
            "{}",
            m.name
        );
        assert_eq!(facts.install_disk, "/dev/sda", "{}", m.name);
    }

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
        assert!(row.contains("/dev/sda"), "{row}");
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
    // Still Rebuilding: only talboot's next step sees it back in maintenance mode.
    let rec = world.with_store(|s| s.node("w-2").unwrap().unwrap());
    assert_eq!(rec.phase, NodePhase::Rebuilding);
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
        world.provision_to_bootstrap(m.name).await;
    }
    // A run chose cp-1, recorded its intent, made the call, and died before recording "done".
    world.with_writers(|_, w| {
        w.progress
            .put_row(talboot::provision::cluster::BOOTSTRAP_NODE_KEY, b"cp-1")
            .unwrap();
        w.progress.put_row(BOOTSTRAP_KEY, b"intent").unwrap()
    });
    let cp1 = world.node("cp-1");
    TalosClient::secured(cp1.addr(), &world.creds)
        .unwrap()
        .bootstrap()
        .await
        .unwrap();
    assert_eq!(cp1.bootstrap_calls(), 1);
    // Bootstrapped, both finish booting (cp-2 joins by itself) and become Ready.
    for m in &machines {
        world.provision(m.name).await;
        assert_eq!(world.phase(m.name), NodePhase::Ready);
    }

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
        cfg.disks.push(SimDisk::sata(
            1,
            "Other SSD",
            "SN-second",
            100_000_000_000,
            false,
        ));
        cfg.disks.push(SimDisk::sata(
            2,
            "Big HDD",
            "SN-big",
            4_000_000_000_000,
            true,
        ));
    })
    .await;
    let t = world.boot();
    assert_eq!(
        t.prov().step_node("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    let err = t.prov().step_node("w-1").await.unwrap_err();
    assert!(matches!(err, ProvisionError::Disk { .. }), "{err:?}");

    // Its window is still open (nothing was applied): when it boots Talos again (the HTTP
    // server publishes its script fetch), the running provisioner tries again, and refuses
    // again.
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
    bus.publish("w-1", EventKind::Script, "boot script for 127.0.33.21");
    tokio::time::timeout(Duration::from_secs(60), watch)
        .await
        .expect("no second attempt after the boot event");
    cancel.cancel();
    run.await.unwrap();
    // Every bus clone must go for the event writer (and the store) to close.
    drop(bus);
    t.kill().await;
    let last = world
        .with_store(|s| s.last_event("w-1").unwrap().unwrap())
        .detail;
    // Something happens after the failure (a DHCP renewal): status still says why it failed.
    let t = world.boot();
    t.bus
        .as_ref()
        .unwrap()
        .publish("w-1", EventKind::DhcpAck, "acked 127.0.33.21");
    t.kill().await;
    let row = status_row(&world, "w-1");
    assert!(row.contains("failed  "), "{row}");
    assert!(row.contains("failed: install disk refused:"), "{row}");
    assert!(!row.contains("dhcp.ack"), "{row}");
    assert_eq!(world.phase("w-1"), NodePhase::Failed);
    assert_eq!(world.node("w-1").apply_calls(), 0);
    assert!(
        last.contains("matches 2 disks (/dev/sda, /dev/sdb)"),
        "{last}"
    );
    assert!(
        last.contains("Talos would install to the first in its order, /dev/sda"),
        "{last}"
    );
    for needle in [
        "/dev/sda model=KINGSTON SA400S37120G serial=SN-w-1 size=120.0 GB busPath=/pci0000:00/0000:00:17.0/ata1/",
        "/dev/sdb model=Other SSD serial=SN-second",
        "/dev/sdc model=Big HDD serial=SN-big size=4.0 TB busPath=/pci0000:00/0000:00:17.0/ata3/",
        "transport=sata rotational",
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
    step_until(&t, "w-1", |r| {
        matches!(r, Ok(NodeStep::Advanced(NodePhase::Ready)))
    })
    .await
    .unwrap();
    t.kill().await;
    let served = w1.served();
    assert!(
        served.iter().any(|s| s.rpc == "Version" && s.relayed),
        "{served:?}"
    );
    let events = world.events("w-1").join("\n");
    assert!(
        events.contains("MachineStatus at node 127.0.34.21 (via 127.0.34.11:50000): stage running"),
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
    // Both machines network-boot Talos from talboot: the HTTP server publishes the fetch.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let bus = t.bus.clone().unwrap();
    let mut seen = bus.subscribe();
    for m in &machines {
        bus.publish(m.name, EventKind::Kernel, "vmlinuz sent");
    }
    drop(bus);
    let kubeconfig = world.state_dir().join(KUBECONFIG_FILE);
    // The kubeconfig needs the control plane only; the worker may still be booting from disk.
    let mut ready = std::collections::BTreeSet::new();
    let mut done = false;
    for _ in 0..1500 {
        while let Ok(ev) = seen.try_recv() {
            if ev.kind == EventKind::Phase && ev.detail.contains("-> ready") {
                ready.insert(ev.node);
            }
        }
        if kubeconfig.exists() && ready.len() == machines.len() {
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

#[tokio::test]
async fn install_disks_by_link_and_by_selector_are_the_disks_talos_installs_to() {
    let boot_ssd = || SimDisk::sata(0, "INTEL SSDSC2KB480G8", "PHYF1", 480_103_981_056, false);
    let link = boot_ssd()
        .spec
        .symlinks
        .iter()
        .find(|s| s.starts_with("/dev/disk/by-id/ata-"))
        .cloned()
        .unwrap();
    assert_eq!(link, "/dev/disk/by-id/ata-INTEL_SSDSC2KB480G8_PHYF1");
    let machines = [
        Machine {
            name: "cp-1",
            last: 11,
            cp: true,
            install: "installDisk: /dev/disk/by-id/ata-INTEL_SSDSC2KB480G8_PHYF1",
        },
        Machine {
            name: "w-1",
            last: 21,
            cp: false,
            install: "diskSelector: {type: nvme, size: \"<= 600GB\"}",
        },
    ];
    let world = World::start(71, &machines, move |cfg| {
        cfg.disks = if cfg.hostname == "cp-1" {
            vec![
                SimDisk::nvme(0, "SAMSUNG MZQL21T9HCJR-00A07", "S1", 1_920_383_410_176),
                boot_ssd(),
            ]
        } else {
            // The small NVMe enumerates second; the big one and a SATA disk do not match.
            vec![
                SimDisk::nvme(0, "SAMSUNG MZQL21T9HCJR-00A07", "S1", 1_920_383_410_176),
                SimDisk::nvme(1, "Samsung SSD 980 PRO 500GB", "S2", 500_107_862_016),
                boot_ssd(),
            ]
        };
    })
    .await;
    for (name, want) in [("cp-1", "/dev/sda"), ("w-1", "/dev/nvme1n1")] {
        world.provision(name).await;
        assert_eq!(world.phase(name), NodePhase::Ready, "{name}");
        let facts = world
            .with_store(|s| talboot::store::NodeFacts::load(s, name))
            .unwrap();
        assert_eq!(facts.install_disk, want, "{name}");
        // What the node's install task took for the config talboot applied.
        assert_eq!(world.node(name).install_disk(), Some(Ok(want.to_owned())));
        let events = world.events(name).join("\n");
        let why = if name == "cp-1" {
            "the disk with that path or link"
        } else {
            "the only matching disk"
        };
        assert!(
            events.contains(&format!("Talos will install to {want} ({why})")),
            "{events}"
        );
    }
    let table = world.with_store(|s| {
        talboot::cli::status::table(
            &world.inventory,
            s,
            talboot::events::Clock::now_unix(&SystemClock),
        )
        .unwrap()
    });
    let header = table.lines().next().unwrap();
    assert!(header.contains("DISK"), "{table}");
    for (name, want) in [("cp-1", "/dev/sda"), ("w-1", "/dev/nvme1n1")] {
        let row = table.lines().find(|l| l.starts_with(name)).unwrap();
        assert!(row.contains(want), "{row}");
    }
}

#[tokio::test]
async fn ssd_selector_matching_an_nvme_disk_too_is_refused_naming_talos_pick() {
    let machines = [
        cp("cp-1", 11),
        Machine {
            name: "w-1",
            last: 21,
            cp: false,
            install: "diskSelector: {type: ssd}",
        },
    ];
    let world = World::start(72, &machines, |cfg| {
        if cfg.hostname != "w-1" {
            return;
        }
        // The operator means the SATA SSD; Talos's `ssd` is "not rotational", so the NVMe
        // data disk matches too, and it sorts first.
        cfg.disks = vec![
            SimDisk::sata(0, "INTEL SSDSC2KB480G8", "PHYF1", 480_103_981_056, false),
            SimDisk::nvme(0, "SAMSUNG MZQL21T9HCJR-00A07", "S1", 1_920_383_410_176),
        ];
    })
    .await;
    let t = world.boot();
    assert_eq!(
        t.prov().step_node("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    let err = t.prov().step_node("w-1").await.unwrap_err();
    t.kill().await;
    assert!(matches!(err, ProvisionError::Disk { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("matches 2 disks (/dev/nvme0n1, /dev/sda)"),
        "{msg}"
    );
    assert!(
        msg.contains("Talos would install to the first in its order, /dev/nvme0n1"),
        "{msg}"
    );
    assert_eq!(world.phase("w-1"), NodePhase::Failed);
    assert_eq!(world.node("w-1").apply_calls(), 0);
}

#[tokio::test]
async fn a_machine_without_smbios_is_provisioned_with_its_system_facts_absent() {
    let machines = [cp("cp-1", 11)];
    let world = World::start(73, &machines, |cfg| cfg.smbios = false).await;
    world.provision("cp-1").await;
    assert_eq!(world.phase("cp-1"), NodePhase::Ready);
    let facts = world
        .with_store(|s| talboot::store::NodeFacts::load(s, "cp-1"))
        .unwrap();
    assert_eq!(facts.system_uuid, None);
    assert_eq!(facts.manufacturer, None);
    assert_eq!(facts.install_disk, "/dev/sda");
    let events = world.events("cp-1").join("\n");
    assert!(events.contains("no SMBIOS system information"), "{events}");
}

/// Issue 10, item 4: the secured API answers while the installer is still pulled; Ready
/// only once the machine stage is `running` (installed, booted from disk).
#[tokio::test]
async fn ready_only_once_installed_and_running_from_disk() {
    let machines = [cp("cp-1", 11)];
    let world = World::start(37, &machines, |cfg| {
        cfg.timing.installer_pull = Duration::from_millis(1500);
    })
    .await;
    let node = world.node("cp-1");
    let t = world.boot();
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Installing)
    );
    node.wait_phase(Phase::Installing).await.unwrap();
    // The secured API answers now, but the node is pulling its installer.
    TalosClient::secured(node.addr(), &world.creds)
        .unwrap()
        .version()
        .await
        .unwrap();
    let step = t.prov().step_node("cp-1").await.unwrap();
    assert_eq!(
        step,
        NodeStep::Waiting("machine stage installing".into()),
        "Ready before the install finished"
    );
    t.kill().await;
    assert_eq!(world.phase("cp-1"), NodePhase::Installing);
    let t = world.boot();
    // Booted from disk, a control plane of a new cluster waits for Bootstrap in stage
    // booting (its etcd waits to join): still not Ready...
    let booting = step_until(
        &t,
        "cp-1",
        |r| matches!(r, Ok(NodeStep::Waiting(w)) if w == "machine stage booting"),
    )
    .await;
    assert!(booting.is_ok());
    // ...until the cluster step bootstraps it.
    let mut bootstrapped = false;
    for _ in 0..50 {
        if t.prov().step_cluster().await.unwrap() == ClusterProgress::Bootstrapped {
            bootstrapped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(bootstrapped);
    let ready = step_until(&t, "cp-1", |r| {
        matches!(r, Ok(NodeStep::Advanced(NodePhase::Ready)))
    })
    .await;
    assert!(ready.is_ok());
    // Ready means it rebooted from disk and its boot sequence finished.
    assert_eq!(node.phase(), Phase::Secured);
    t.kill().await;
    let events = world.events("cp-1").join("\n");
    assert!(events.contains("stage installing"), "{events}");
    assert!(
        events.contains("installing -> ready: installed and booted from disk"),
        "{events}"
    );
}

/// Issue 10, item 4: a failed install is reported with Talos's own error, whether talboot
/// sees the failed sequence in the node's events before it reboots, or only finds it back in
/// maintenance mode afterwards.
#[tokio::test]
async fn a_failed_install_fails_the_node_with_its_cause() {
    let machines = [cp("cp-1", 11), cp("cp-2", 12)];
    let world = World::start(38, &machines, |cfg| {
        if cfg.hostname == "cp-1" {
            cfg.install_failure = Some(talboot::sim::talos::InstallFailure::InstallerPull(
                "dial tcp: lookup ghcr.io: no such host".into(),
            ));
            // machined's countdown before the reboot: long enough to read the events.
            cfg.timing.fatal_reboot = Duration::from_secs(3);
        } else {
            cfg.install_failure = Some(talboot::sim::talos::InstallFailure::Install);
            cfg.timing.fatal_reboot = Duration::from_millis(1);
        }
    })
    .await;
    let t = world.boot();
    for name in ["cp-1", "cp-2"] {
        t.prov().step_node(name).await.unwrap();
        assert_eq!(
            t.prov().step_node(name).await.unwrap(),
            NodeStep::Advanced(NodePhase::Installing)
        );
    }
    // cp-2 reboots at once after its install failed: talboot sees the failed sequence, or
    // finds it back in maintenance mode without its config.
    let err = step_until(&t, "cp-2", |r| r.is_err()).await.unwrap_err();
    assert!(
        matches!(err, ProvisionError::InstallFailed { .. }),
        "{err:?}"
    );
    let err = step_until(&t, "cp-1", |r| r.is_err()).await.unwrap_err();
    match &err {
        ProvisionError::InstallFailed { cause, .. } => assert!(
            cause.contains("failed to pull image") && cause.contains("no such host"),
            "{cause}"
        ),
        other => panic!("{other:?}"),
    }
    t.kill().await;
    assert_eq!(world.phase("cp-1"), NodePhase::Failed);
    assert_eq!(world.phase("cp-2"), NodePhase::Failed);
    let row = status_row(&world, "cp-1");
    assert!(
        row.contains("failed: install failed: sequence failed: failed to pull image"),
        "{row}"
    );
    let row = status_row(&world, "cp-2");
    assert!(row.contains("failed: install failed"), "{row}");
}

/// Issue 26, item 6: on Talos v1.14 a config with `UnattendedInstallConfig` installs through
/// the unattended install controller (never stage `installing`, no install sequence); the
/// node is Ready once it rebooted into the installed system and runs, as on the legacy path.
#[tokio::test]
async fn a_v114_unattended_install_is_ready_once_running_from_disk() {
    let machines = [cp("cp-1", 11)];
    let world = World::start_at(45, &machines, "v1.14.0", |cfg| {
        cfg.timing.installer_pull = Duration::from_millis(800);
    })
    .await;
    let node = world.node("cp-1");
    let t = world.boot();
    t.prov().step_node("cp-1").await.unwrap();
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Installing)
    );
    assert!(
        node.last_applied_config()
            .unwrap()
            .contains("kind: UnattendedInstallConfig")
    );
    node.wait_phase(Phase::Installing).await.unwrap();
    let step = t.prov().step_node("cp-1").await.unwrap();
    assert_eq!(step, NodeStep::Waiting("machine stage booting".into()));
    let booting = step_until(&t, "cp-1", |r| {
        matches!(r, Ok(NodeStep::Waiting(w)) if w == "machine stage booting")
            && node.phase() == Phase::Secured
    })
    .await;
    assert!(booting.is_ok());
    let mut bootstrapped = false;
    for _ in 0..50 {
        if t.prov().step_cluster().await.unwrap() == ClusterProgress::Bootstrapped {
            bootstrapped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(bootstrapped);
    let ready = step_until(&t, "cp-1", |r| {
        matches!(r, Ok(NodeStep::Advanced(NodePhase::Ready)))
    })
    .await;
    assert!(ready.is_ok());
    t.kill().await;
    let events = world.events("cp-1").join("\n");
    assert!(!events.contains("stage installing"), "{events}");
    assert!(
        events.contains(
            "installing -> ready: installed and booted from disk (machine stage running, v1.14.0)"
        ),
        "{events}"
    );
}

/// Issue 26, item 6: a failed unattended install leaves the machine stage at booting (the
/// controller retries; no fatal sequence error, no reboot), so only its
/// `UnattendedInstallStatus` says so: the node fails with the installer's error, not the
/// install timeout.
#[tokio::test]
async fn a_failed_v114_unattended_install_fails_the_node_with_its_cause() {
    let machines = [cp("cp-1", 11)];
    let world = World::start_at(46, &machines, "v1.14.0", |cfg| {
        cfg.install_failure = Some(talboot::sim::talos::InstallFailure::Install);
        // The controller's retry: long enough for talboot to read the failed status.
        cfg.timing.fatal_reboot = Duration::from_secs(3);
    })
    .await;
    let t = world.boot();
    t.prov().step_node("cp-1").await.unwrap();
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Installing)
    );
    let err = step_until(&t, "cp-1", |r| r.is_err()).await.unwrap_err();
    match &err {
        ProvisionError::InstallFailed { cause, .. } => assert_eq!(
            cause,
            "UnattendedInstallStatus failed: task \"upgrade\" failed: exit code 1"
        ),
        other => panic!("{other:?}"),
    }
    t.kill().await;
    assert_eq!(world.phase("cp-1"), NodePhase::Failed);
}

/// Issue 10, item 5: Reset answers at once and the node resets afterwards; the rebuild waits
/// until it really is back in maintenance mode.
#[tokio::test]
async fn rebuild_waits_until_the_node_is_back_in_maintenance_mode() {
    let machines = [cp("cp-1", 11), worker("w-1", 21)];
    let world = World::start(39, &machines, |cfg| {
        cfg.timing.reset = Duration::from_millis(1500);
    })
    .await;
    world.provision("cp-1").await;
    world.provision("w-1").await;
    let w1 = world.node("w-1");
    let t = world.boot();
    assert_eq!(
        t.prov().rebuild("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Rebuilding)
    );
    assert_eq!(w1.reset_calls(), 1);
    assert!(
        w1.last_reset().unwrap().graceful,
        "a worker leaves gracefully"
    );
    // The old secured API still answers: not Ready, not anything else yet.
    for _ in 0..3 {
        let step = t.prov().step_node("w-1").await.unwrap();
        assert!(matches!(step, NodeStep::Waiting(_)), "{step:?}");
    }
    assert_eq!(w1.phase(), Phase::Secured);
    w1.wait_phase(Phase::Maintenance).await.unwrap();
    assert_eq!(
        t.prov().step_node("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    t.kill().await;
    world.provision("w-1").await;
    assert_eq!(world.phase("w-1"), NodePhase::Ready);
    assert_eq!(w1.apply_calls(), 2);
    assert_eq!(w1.reset_calls(), 1);
}

/// Issue 10, item 6: rebuilding the only control plane (last voting etcd member) resets it
/// without leaving etcd, and the new cluster is bootstrapped again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuilding_the_only_control_plane_works() {
    let machines = [cp("cp-1", 11)];
    let world = World::start(40, &machines, |_| {}).await;
    let _api = tokio::net::TcpListener::bind("127.0.40.100:6443")
        .await
        .unwrap();
    world.provision("cp-1").await;
    assert!(
        world
            .cluster_steps()
            .await
            .contains(&ClusterProgress::Bootstrapped)
    );
    let cp1 = world.node("cp-1");
    assert_eq!(cp1.bootstrap_calls(), 1);
    let t = world.boot();
    assert_eq!(
        t.prov().rebuild("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Rebuilding)
    );
    t.kill().await;
    let reset = cp1.last_reset().unwrap();
    assert!(
        !reset.graceful,
        "a graceful reset of the last etcd member fails"
    );
    cp1.wait_phase(Phase::Maintenance).await.unwrap();
    world.provision("cp-1").await;
    assert_eq!(world.phase("cp-1"), NodePhase::Ready);
    assert!(
        world
            .cluster_steps()
            .await
            .contains(&ClusterProgress::Bootstrapped)
    );
    assert_eq!(
        cp1.bootstrap_calls(),
        2,
        "its etcd was wiped: bootstrapped again"
    );
    let events = world.events("cp-1").join("\n");
    assert!(events.contains("last voting etcd member"), "{events}");
}

/// Issue 10, item 6: a rebuild whose reset never happens is reported failed.
#[tokio::test]
async fn a_reset_that_does_not_happen_fails_the_rebuild() {
    let machines = [cp("cp-1", 11), worker("w-1", 21)];
    let world = World::start(41, &machines, |cfg| {
        if cfg.hostname == "w-1" {
            cfg.timing.reset = Duration::from_secs(600);
        }
    })
    .await;
    world.provision("cp-1").await;
    world.provision("w-1").await;
    let t = world.boot_tuned(world.creds.clone(), |s| {
        s.reset_timeout = Duration::from_secs(1)
    });
    assert_eq!(
        t.prov().rebuild("w-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Rebuilding)
    );
    let err = step_until(&t, "w-1", |r| r.is_err()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::ResetFailed { .. }), "{err:?}");
    t.kill().await;
    assert_eq!(world.phase("w-1"), NodePhase::Failed);
    let row = status_row(&world, "w-1");
    assert!(
        row.contains("failed: rebuild failed: the node did not come back in maintenance mode"),
        "{row}"
    );
}

/// Issue 10, item 7: a failed control plane does not stay the bootstrap node.
#[tokio::test]
async fn bootstrap_node_is_chosen_among_healthy_control_planes() {
    let machines = [cp("cp-1", 11), cp("cp-2", 12)];
    let world = World::start(42, &machines, |cfg| {
        if cfg.hostname == "cp-1" {
            // No /dev/sda: its install disk is refused.
            cfg.disks = vec![SimDisk::virtio(0, "V1", 120_034_123_776)];
        }
    })
    .await;
    // An earlier run had chosen cp-1 (the first control plane) before it failed.
    world.with_writers(|_, w| {
        w.progress
            .put_row(talboot::provision::cluster::BOOTSTRAP_NODE_KEY, b"cp-1")
            .unwrap()
    });
    let t = world.boot();
    t.prov().step_node("cp-1").await.unwrap();
    assert!(t.prov().step_node("cp-1").await.is_err());
    t.kill().await;
    assert_eq!(world.phase("cp-1"), NodePhase::Failed);
    world.provision_to_bootstrap("cp-2").await;
    let t = world.boot();
    assert_eq!(t.prov().bootstrap_node().await.unwrap(), "cp-2");
    let mut bootstrapped = false;
    for _ in 0..50 {
        if t.prov().step_cluster().await.unwrap() == ClusterProgress::Bootstrapped {
            bootstrapped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.kill().await;
    assert!(bootstrapped);
    assert_eq!(world.node("cp-2").bootstrap_calls(), 1);
    assert_eq!(world.node("cp-1").bootstrap_calls(), 0);
    world.provision("cp-2").await;
    assert_eq!(world.phase("cp-2"), NodePhase::Ready);
}

/// Issue 24 item 0: on Talos a new cluster's control planes never reach machine stage
/// `running` (talboot's Ready) before Bootstrap: their etcd waits to join and the boot
/// sequence waits for etcd. talboot bootstraps the first one ready for Bootstrap (installed,
/// booted from disk, secured API answering, etcd started), as `talosctl cluster create`
/// does, and only then do they become Ready. (With the old Ready-only choice the cluster
/// step waited forever.)
#[tokio::test]
async fn a_new_cluster_is_bootstrapped_before_any_control_plane_is_ready() {
    let machines = [cp("cp-1", 11), cp("cp-2", 12), cp("cp-3", 13)];
    let world = World::start(44, &machines, |_| {}).await;
    for m in &machines {
        world.provision_to_bootstrap(m.name).await;
    }
    // However long talboot waits, none of them becomes Ready by itself.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for m in &machines {
        let t = world.boot();
        let step = t.prov().step_node(m.name).await.unwrap();
        t.kill().await;
        assert!(matches!(step, NodeStep::Waiting(_)), "{}: {step:?}", m.name);
        assert_eq!(world.phase(m.name), NodePhase::Installing);
        assert!(!world.node(m.name).etcd_member(), "{}", m.name);
    }
    let mut progress = Vec::new();
    for _ in 0..50 {
        let t = world.boot();
        let p = t.prov().step_cluster().await.unwrap();
        t.kill().await;
        progress.push(p.clone());
        if p == ClusterProgress::Bootstrapped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        progress.last(),
        Some(&ClusterProgress::Bootstrapped),
        "{progress:?}"
    );
    assert_eq!(world.node("cp-1").bootstrap_calls(), 1);
    let events = world.events("cp-1").join("\n");
    assert!(
        events.contains("ready for Bootstrap: installed, booted from disk"),
        "{events}"
    );
    // Then each finishes booting (the others by joining) and is Ready.
    for m in &machines {
        world.provision(m.name).await;
        assert_eq!(world.phase(m.name), NodePhase::Ready, "{}", m.name);
        assert!(world.node(m.name).etcd_member(), "{}", m.name);
    }
    for other in ["cp-2", "cp-3"] {
        assert_eq!(world.node(other).bootstrap_calls(), 0, "{other}");
    }
    assert_eq!(world.node("cp-1").etcd_clusters(), 1);
}

/// Issue 10, item 8: the run loop probes only machines that booted Talos from talboot, backs
/// off while one does not answer, and its timeline folds the repeated failure into one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_loop_probes_only_talos_boots_and_backs_off() {
    let machines = [cp("cp-1", 11), worker("w-1", 21)];
    let world = World::start(43, &machines, |cfg| {
        if cfg.hostname == "w-1" {
            // Booted Talos but its API is not up on 50000 (yet): every probe is refused.
            cfg.port = 50999;
        }
    })
    .await;
    let t = world.boot();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(t.prov().clone().run(cancel.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let bus = t.bus.clone().unwrap();
    // cp-1 is a plain DHCP client for now (another OS on it): never probed.
    bus.publish("cp-1", EventKind::DhcpAck, "acked 127.0.43.11");
    bus.publish("w-1", EventKind::Script, "boot script for 127.0.43.21");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(
        world.node("cp-1").served().is_empty(),
        "a plain DHCP client was probed: {:?}",
        world.node("cp-1").served()
    );
    // Now it boots Talos: probed at once.
    bus.publish("cp-1", EventKind::Script, "boot script for 127.0.43.11");
    let mut probed = false;
    for _ in 0..250 {
        if !world.node("cp-1").served().is_empty() {
            probed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    task.await.unwrap();
    drop(bus);
    t.kill().await;
    assert!(probed, "cp-1 not probed after its Talos boot");
    let refused: Vec<_> = world.with_store(|s| {
        s.events("w-1", 0, 1000)
            .unwrap()
            .into_iter()
            .filter(|e| e.detail.contains("(maintenance) failed"))
            .collect()
    });
    assert_eq!(refused.len(), 1, "not folded: {refused:#?}");
    // 1.6 s at a 50 ms poll is 32 probes without backoff; doubling pauses make it ~5.
    let n = refused[0].count;
    assert!((2..=8).contains(&n), "{n} probes: {refused:#?}");
}

/// Talos keeps serving maintenance mode for a moment after an ApplyConfiguration (until the
/// acquire controller tears the maintenance service down), and a second apply then is
/// refused. A talboot that died after the apply's reply but before it recorded Installing
/// must see from the node that the config landed, not apply it again: at most one apply per
/// boot. (Seen in the demo's restart test; the window is stretched here to make it certain.)
#[tokio::test]
async fn a_restart_right_after_the_apply_does_not_apply_twice() {
    let machines = [cp("cp-1", 11)];
    let world = World::start(38, &machines, |cfg| {
        cfg.timing.apid_restart = Duration::from_secs(30);
    })
    .await;
    let node = world.node("cp-1");
    let t = world.boot();
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Maintenance)
    );
    assert_eq!(
        t.prov().step_node("cp-1").await.unwrap(),
        NodeStep::Advanced(NodePhase::Installing)
    );
    t.kill().await;
    assert_eq!(node.apply_calls(), 1);
    // The crash: the Installing commit never happened, the intent (Configuring) is what the
    // store holds.
    world.with_writers(|s, w| {
        let mut rec = s.node("cp-1").unwrap().unwrap();
        rec.phase = NodePhase::Configuring;
        rec.provisioning_window_open = true;
        w.nodes.put_node(&rec).unwrap();
    });
    // Still the maintenance API (the window is open) ...
    TalosClient::maintenance(node.addr())
        .unwrap()
        .version()
        .await
        .expect("maintenance API still answers after the apply");
    // ... and a second apply there is refused, as Talos refuses it.
    let again = TalosClient::maintenance(node.addr())
        .unwrap()
        .apply_configuration(b"version: v1alpha1\nmachine:\n  type: controlplane\n")
        .await;
    assert!(
        matches!(&again, Err(TalosError::ConfigAlreadyApplied { .. })),
        "{again:?}"
    );
    let t = world.boot();
    let step = t.prov().step_node("cp-1").await.unwrap();
    assert_eq!(step, NodeStep::Advanced(NodePhase::Installing), "{step:?}");
    for _ in 0..3 {
        t.prov().step_node("cp-1").await.unwrap();
    }
    t.kill().await;
    assert_eq!(node.apply_calls(), 1, "applied twice in one boot");
    assert_eq!(world.phase("cp-1"), NodePhase::Installing);
}

#[path = "provision_e2e/secure_boot.rs"]
mod secure_boot;
