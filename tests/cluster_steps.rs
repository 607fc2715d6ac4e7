//! The cluster steps after the kubeconfig (API ready → Cilium → nodes Ready → Argo CD →
//! handed off) against the strict Kubernetes API double (src/sim/kube.rs), with
//! talboot "killed and restarted" (provisioner, bus and store dropped and reopened) before
//! every step. Most tests start the store where the bootstrap steps leave it (bootstrap and
//! kubeconfig recorded done, the double's kubeconfig in the state directory);
//! `from_talos` goes the whole way from a fake Talos node (src/sim/talos.rs).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use talboot::addons::Timeouts;
use talboot::events::{EventBus, SystemClock};
use talboot::inventory::Inventory;
use talboot::machineconfig::renderer::ConfigRenderer;
use talboot::provision::cluster::{BOOTSTRAP_KEY, KUBECONFIG_FILE, KUBECONFIG_KEY};
use talboot::provision::{ProvisionWriters, Provisioner, Settings, StepOutcome};
use talboot::sim::kube::{DoubleOptions, KubeDouble};
use talboot::store::{self, CLUSTER_TIMELINE, ClusterStep, STEP_KEY, StepRecord, Store};
use talboot::talos::ClientCreds;

/// Renders nothing: these tests never configure a node.
struct NoRenderer;

impl ConfigRenderer for NoRenderer {
    fn render(
        &self,
        node: &talboot::inventory::Node,
    ) -> Result<Vec<u8>, talboot::machineconfig::renderer::RenderError> {
        Err(format!("{} is not rendered in this test", node.name.value).into())
    }
}

const INVENTORY: &str = "cluster:\n  name: steps\n  talosVersion: v1.13.9\n  \
    kubernetesVersion: 1.36.3\n  endpoint: https://127.0.61.100:6443\n  vip: 127.0.61.100\n  \
    secrets:\n    file: secrets.age\nnetwork:\n  interfaces: [lo]\n  mode: authoritative\n  \
    subnet: 127.0.61.0/24\nboot:\n  delivery: push\nnodes:\n  - name: cp1\n    \
    mac: \"02:00:00:3d:00:0b\"\n    role: controlplane\n    address: 127.0.61.11/24\n    \
    installDisk: /dev/sda\naddons:\n  cilium:\n    version: 1.18.0\n  argocd:\n    \
    version: 10.1.1\n    domain: cd.lab\n";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/addons")
}

struct World {
    dir: tempfile::TempDir,
    inventory: Arc<Inventory>,
    double: KubeDouble,
}

impl World {
    async fn start() -> Self {
        Self::start_with(INVENTORY).await
    }

    async fn start_with(inventory_text: &str) -> Self {
        talboot::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let inv_path = dir.path().join("talboot.yaml");
        std::fs::write(&inv_path, inventory_text).unwrap();
        let inventory = Arc::new(talboot::inventory::load(&inv_path).unwrap().inventory);
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        // Where the bootstrap steps leave things: both recorded done, kubeconfig written.
        std::fs::write(state.join(KUBECONFIG_FILE), double.kubeconfig()).unwrap();
        let s = store::open(&state).unwrap().split().1.progress;
        s.put_row(BOOTSTRAP_KEY, b"done").unwrap();
        s.put_row(KUBECONFIG_KEY, b"done").unwrap();
        drop(s);
        World {
            dir,
            inventory,
            double,
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn boot(&self, manifests: Option<PathBuf>) -> Talboot {
        self.boot_with(|s| s.addon_manifests = manifests)
    }

    fn boot_with(&self, configure: impl FnOnce(&mut Settings)) -> Talboot {
        let (store, w) = store::open(&self.state_dir()).unwrap().split();
        let (bus, writer) = EventBus::start(w.events, Arc::new(SystemClock));
        let mut settings = Settings::new(self.state_dir());
        settings.poll_interval = Duration::from_millis(20);
        settings.addon_timeouts = Timeouts {
            crd: Duration::from_secs(20),
            rollout: Duration::from_secs(20),
        };
        configure(&mut settings);
        let creds = ClientCreds {
            ca_pem: Vec::new(),
            crt_pem: Vec::new(),
            key_pem: Vec::new(),
        };
        Talboot {
            prov: Some(Provisioner::new(
                self.inventory.clone(),
                store,
                ProvisionWriters {
                    nodes: w.nodes,
                    progress: w.progress,
                },
                bus.clone(),
                Arc::new(NoRenderer),
                creds,
                settings,
            )),
            bus: Some(bus),
            writer,
        }
    }

    /// One step by a freshly started talboot, which is then killed.
    async fn step(&self, manifests: Option<PathBuf>) -> StepOutcome {
        let t = self.boot(manifests);
        let out = t.prov().step_addons().await.unwrap();
        t.kill().await;
        out
    }

    fn record(&self) -> Option<StepRecord> {
        let s = store::open(&self.state_dir()).unwrap();
        s.row(talboot::store::ClusterTable::Progress, STEP_KEY)
            .unwrap()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn put_record(&self, rec: &StepRecord) {
        let s = store::open(&self.state_dir()).unwrap().split().1.progress;
        s.put_row(STEP_KEY, &serde_json::to_vec(rec).unwrap())
            .unwrap();
    }

    fn events(&self) -> Vec<String> {
        let s = store::open(&self.state_dir()).unwrap();
        s.events(CLUSTER_TIMELINE, 0, 10_000)
            .unwrap()
            .into_iter()
            .map(|e| format!("{} {}", e.kind, e.detail))
            .collect()
    }
}

struct Talboot {
    prov: Option<Provisioner>,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_progress_to_handed_off_with_a_restart_before_each_and_never_reapply() {
    let world = World::start().await;
    // The API server warns on one Argo CD workload (as PodSecurity or a webhook would).
    world.double.warn_on(
        "Deployment",
        "argocd",
        "argocd-server",
        Some("would violate PodSecurity \"restricted:latest\": runAsNonRoot != true"),
    );
    let expected = [
        ClusterStep::Bootstrapped,
        ClusterStep::ApiReady,
        ClusterStep::CniInstalled,
        ClusterStep::NodesReady,
        ClusterStep::ArgoCdInstalled,
        ClusterStep::HandedOff,
    ];
    let mut applies_after = Vec::new();
    for want in expected {
        let out = world.step(Some(fixtures())).await;
        assert_eq!(out, StepOutcome::Completed(want));
        let rec = world.record().expect("record persisted");
        assert_eq!(rec.step, want);
        assert_eq!((rec.attempts, rec.last_error.as_deref()), (0, None));
        assert!(rec.since_unix > 0);
        applies_after.push(world.double.applies().len());
    }
    // Cilium applied objects, nodes-ready applied nothing, Argo CD applied objects, and
    // handing off applied nothing.
    let cilium = world.double.applies();
    assert!(
        cilium[..applies_after[2]]
            .iter()
            .any(|a| a.kind == "DaemonSet")
    );
    assert_eq!(applies_after[0], 0);
    assert_eq!(applies_after[1], 0);
    assert!(applies_after[2] > 0);
    assert_eq!(applies_after[3], applies_after[2]);
    assert!(applies_after[4] > applies_after[3]);
    assert!(
        cilium[applies_after[3]..applies_after[4]]
            .iter()
            .any(|a| a.kind == "StatefulSet" && a.namespace == "argocd")
    );
    assert_eq!(applies_after[5], applies_after[4]);
    assert!(
        world
            .double
            .object("v1", "Secret", "argocd", "sh.helm.release.v1.argocd.v1")
            .is_some()
    );

    // More restarts after the hand-off: done, and nothing is applied again.
    let versions = world.double.resource_versions();
    for _ in 0..3 {
        assert_eq!(world.step(Some(fixtures())).await, StepOutcome::Done);
    }
    assert_eq!(world.double.applies().len(), applies_after[5]);
    assert_eq!(world.double.resource_versions(), versions);

    // Each transition is an event on the cluster timeline.
    let events = world.events().join("\n");
    for needle in [
        "cluster.step waiting-for-control-planes -> bootstrapped",
        "cluster.step bootstrapped -> api-ready: the Kubernetes API answers",
        "cluster.step api-ready -> cni-installed: Cilium 1.18.0 installed",
        "cluster.step cni-installed -> nodes-ready: every node is Ready",
        "cluster.step nodes-ready -> argocd-installed: Argo CD 10.1.1 installed",
        "cluster.step argocd-installed -> handed-off",
        // Issue 31, item 4: the server's warning is an event on the cluster timeline.
        "cluster.step Argo CD: the API server warned on Deployment \
         argocd/argocd-server: would violate PodSecurity \"restricted:latest\": runAsNonRoot \
         != true",
    ] {
        assert!(events.contains(needle), "{needle} missing in:\n{events}");
    }

    // A crash after Cilium was applied but before the record said so: the step runs again,
    // and the second apply changes nothing.
    let before = world.double.applies().len();
    world.put_record(&StepRecord {
        step: ClusterStep::ApiReady,
        since_unix: 1,
        reason: "rewound by the test".into(),
        last_error: None,
        attempts: 0,
    });
    assert_eq!(
        world.step(Some(fixtures())).await,
        StepOutcome::Completed(ClusterStep::CniInstalled)
    );
    let again = world.double.applies();
    assert!(again.len() > before);
    assert!(
        again[before..].iter().all(|a| !a.changed),
        "{:?}",
        &again[before..]
    );
    assert_eq!(world.double.resource_versions(), versions);
    let events = world.events().join("\n");
    assert!(
        events.contains("0 object(s) changed"),
        "re-apply should report no changes:\n{events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_manifest_dir_is_an_actionable_error_and_the_step_stays() {
    let world = World::start().await;
    // Bootstrapped, API ready.
    for _ in 0..2 {
        assert!(matches!(world.step(None).await, StepOutcome::Completed(_)));
    }
    assert_eq!(world.record().unwrap().step, ClusterStep::ApiReady);

    // No directory configured at all.
    for attempt in 1..=2 {
        let StepOutcome::Failed { attempts, error } = world.step(None).await else {
            panic!("Cilium without manifests must fail");
        };
        assert_eq!(attempts, attempt);
        assert!(
            error.contains("DIR/cilium/")
                && error.contains("docs/addons.md")
                && error.contains("--helm PATH")
                && error.contains("--addon-manifests DIR"),
            "{error}"
        );
        let rec = world.record().unwrap();
        assert_eq!(rec.step, ClusterStep::ApiReady);
        assert_eq!(rec.attempts, attempt);
        assert_eq!(rec.last_error.as_deref(), Some(error.as_str()));
    }
    // A directory without the cilium subdirectory: the error names the one to create.
    let empty = tempfile::tempdir().unwrap();
    let StepOutcome::Failed { attempts, error } = world.step(Some(empty.path().to_owned())).await
    else {
        panic!("Cilium without its subdirectory must fail");
    };
    assert_eq!(attempts, 3);
    let want = empty.path().join("cilium");
    assert!(error.contains(want.to_str().unwrap()), "{error}");
    assert!(world.double.applies().is_empty());
    assert_eq!(world.record().unwrap().step, ClusterStep::ApiReady);

    let events = world.events().join("\n");
    assert!(
        events.contains("after api-ready: attempt 1 failed: add-on cilium is enabled but talboot has no way to get its manifest"),
        "{events}"
    );
    assert!(events.contains("attempt 3 failed"), "{events}");

    // Once the directory exists the step completes and the failure count is reset.
    assert_eq!(
        world.step(Some(fixtures())).await,
        StepOutcome::Completed(ClusterStep::CniInstalled)
    );
    let rec = world.record().unwrap();
    assert_eq!((rec.attempts, rec.last_error), (0, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioner_run_drives_the_steps_to_handed_off() {
    let world = World::start().await;
    let t = world.boot(Some(fixtures()));
    let mut events = t.bus.as_ref().unwrap().subscribe();
    let cancel = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(t.prov().clone().run(cancel.clone()));
    // A guard against hanging forever, not a timing assertion.
    let handed_off = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let ev = events.recv().await.unwrap();
            if ev.node == CLUSTER_TIMELINE && ev.detail.contains("-> handed-off") {
                return;
            }
        }
    })
    .await;
    cancel.cancel();
    run.await.unwrap();
    t.kill().await;
    handed_off.expect("the run loop never handed the cluster off");
    assert_eq!(world.record().unwrap().step, ClusterStep::HandedOff);
    assert!(
        world
            .double
            .object(
                "v1",
                "Secret",
                "kube-system",
                "sh.helm.release.v1.cilium.v1"
            )
            .is_some()
    );
}

/// The `helm` binary for the real-helm tests: `helm` on PATH (scripts/test-deps installs
/// it). Missing helm fails the test unless TALBOOT_SKIP_HELM is set.
fn helm_bin() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("helm"))
            .find(|p| p.is_file())
    });
    if found.is_none() && std::env::var_os("TALBOOT_SKIP_HELM").is_some() {
        eprintln!("helm not found; skipped because TALBOOT_SKIP_HELM is set");
        return None;
    }
    Some(found.expect("helm is not on PATH: run scripts/test-deps (or set TALBOOT_SKIP_HELM)"))
}

fn charts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/charts")
}

/// Issue 31 item 1: a real `helm template` of a chart that renders `defaultMode: 0400` (as
/// Cilium 1.18's agent DaemonSet does) reads as kubectl and Helm read it, the integer 256
/// (YAML 1.1 octal), not the string the API server refuses.
#[test]
fn real_helm_render_reads_an_octal_default_mode_as_kubectl_does() {
    let Some(helm) = helm_bin() else { return };
    let out = std::process::Command::new(helm)
        .args(["template", "cilium"])
        .arg(charts().join("cilium"))
        .args(["--namespace", "kube-system"])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("defaultMode: 0400"), "{text}");
    let objects = talboot::addons::manifest::parse_documents("helm template", &text).unwrap();
    let ds = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "cilium")
        .expect("the cilium DaemonSet");
    let mode = &ds["spec"]["template"]["spec"]["volumes"][0]["projected"]["defaultMode"];
    assert_eq!(mode, &serde_json::json!(256), "{mode}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_helm_renders_local_charts_with_the_inventory_settings() {
    use base64::Engine as _;
    let Some(helm) = helm_bin() else { return };
    let inventory = INVENTORY
        .replace(
            "  cilium:\n    version: 1.18.0\n",
            &format!(
                "  cilium:\n    version: 1.18.0\n    chart: {}\n",
                charts().join("cilium").display()
            ),
        )
        .replace(
            "    domain: cd.lab\n",
            &format!(
                "    domain: cd.lab\n    insecure: true\n    ksops: true\n    chart: {}\n",
                charts().join("argo-cd").display()
            ),
        );
    let world = World::start_with(&inventory).await;
    let key = {
        use age::secrecy::ExposeSecret;
        age::x25519::Identity::generate()
            .to_string()
            .expose_secret()
            .to_owned()
    };
    let keys_txt = format!("# test identity\n{key}\n");
    let identity = Arc::new(talboot::crypto::age::Secret::new(
        keys_txt.clone().into_bytes(),
    ));

    let mut completed = Vec::new();
    for _ in 0..10 {
        let t = world.boot_with(|s| {
            s.helm = Some(helm.clone());
            s.ksops_age_identity = Some(identity.clone());
        });
        let out = t.prov().step_addons().await.unwrap();
        t.kill().await;
        match out {
            StepOutcome::Completed(step) => completed.push(step),
            StepOutcome::Done => break,
            other => panic!("unexpected step outcome {other:?}"),
        }
    }
    assert_eq!(
        completed.last(),
        Some(&ClusterStep::HandedOff),
        "{completed:?}"
    );

    let data = |ns: &str, name: &str| {
        world
            .double
            .object("v1", "ConfigMap", ns, name)
            .unwrap_or_else(|| panic!("ConfigMap {ns}/{name} not applied"))["data"]
            .clone()
    };
    // talboot's Talos values reached the chart (they override its defaults), rendered for
    // the inventory's Kubernetes version, in the release namespace.
    // Cilium's `defaultMode: 0400` went out as the integer 256, as kubectl sends it.
    let agent = world
        .double
        .object("apps/v1", "DaemonSet", "kube-system", "cilium")
        .expect("the cilium DaemonSet applied");
    assert_eq!(
        agent["spec"]["template"]["spec"]["volumes"][0]["projected"]["defaultMode"],
        256
    );
    let cilium = data("kube-system", "cilium-config");
    assert_eq!(cilium["ipam"], "kubernetes");
    assert_eq!(cilium["kube-proxy-replacement"], "true");
    assert_eq!(cilium["k8s-service-port"], "7445");
    assert_eq!(cilium["rendered-for-kube"], "v1.36.3");
    assert_eq!(cilium["release"], "cilium");
    // The chart's crds/ directory went in too (--include-crds).
    assert!(
        world
            .double
            .object(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                "",
                "ciliumloadbalancerippools.cilium.io"
            )
            .is_some()
    );
    // addons.argocd.insecure reached configs.params; the API versions the cluster serves
    // (Cilium's CRD by then) were passed with --api-versions, and no others.
    let params = data("argocd", "argocd-cmd-params-cm");
    assert_eq!(params["server.insecure"], "true");
    assert_eq!(params["domain"], "cd.lab");
    assert_eq!(params["saw-cilium-api"], "true");
    assert_eq!(params["saw-monitoring-api"], "false");
    assert_eq!(params["rendered-for-kube"], "v1.36.3");
    // KSOPS: the identity became the sops-age Secret.
    let secret = world
        .double
        .object("v1", "Secret", "argocd", "sops-age")
        .expect("sops-age Secret applied");
    let stored = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["keys.txt"].as_str().unwrap())
        .unwrap();
    assert_eq!(stored, keys_txt.as_bytes());
    assert!(
        world
            .double
            .object("v1", "Secret", "argocd", "sh.helm.release.v1.argocd.v1")
            .is_some()
    );
    // The identity is in no event.
    assert!(!world.events().join("\n").contains(&key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_helm_refuses_a_local_chart_of_another_version() {
    let Some(helm) = helm_bin() else { return };
    // The chart directory holds 1.18.0; the inventory pins 1.17.0.
    let inventory = INVENTORY.replace(
        "  cilium:\n    version: 1.18.0\n",
        &format!(
            "  cilium:\n    version: 1.17.0\n    chart: {}\n",
            charts().join("cilium").display()
        ),
    );
    let world = World::start_with(&inventory).await;
    let step = || {
        let t = world.boot_with(|s| s.helm = Some(helm.clone()));
        async move {
            let out = t.prov().step_addons().await.unwrap();
            t.kill().await;
            out
        }
    };
    for _ in 0..2 {
        assert!(matches!(step().await, StepOutcome::Completed(_)));
    }
    let StepOutcome::Failed { attempts, error } = step().await else {
        panic!("a chart of another version must not be installed");
    };
    assert_eq!(attempts, 1);
    assert!(
        error.contains("is version 1.18.0") && error.contains("pins version 1.17.0"),
        "{error}"
    );
    assert!(world.double.applies().is_empty());
}

/// The whole way from an unconfigured control plane: the fake Talos node
/// (src/sim/talos.rs) is provisioned, bootstrapped and hands out its kubeconfig;
/// that kubeconfig names no real API server, so the test swaps in the double's right after
/// the kubeconfig step, as a real cluster's would point at its own API.
mod from_talos {
    use std::net::{IpAddr, Ipv4Addr};

    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    use super::*;
    use talboot::provision::{ClusterProgress, NodeStep};
    use talboot::sim::pki::{SimCa, talos_label};
    use talboot::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase};
    use talboot::store::{Lease, LeaseState};

    const NET: u8 = 63;

    /// A minimal control-plane machine config carrying the test OS CA, enough for the fake
    /// node to accept it and come back secured.
    struct CpRenderer {
        ca: SimCa,
    }

    impl ConfigRenderer for CpRenderer {
        fn render(
            &self,
            _node: &talboot::inventory::Node,
        ) -> Result<Vec<u8>, talboot::machineconfig::renderer::RenderError> {
            Ok(format!(
                "version: v1alpha1\nmachine:\n  type: controlplane\n  token: \
                 abcdef.0123456789abcdef\n  ca:\n    crt: {crt}\n    key: \"{key}\"\n  \
                 install:\n    disk: /dev/sda\ncluster:\n  clusterName: steps\n  \
                 controlPlane:\n    endpoint: https://127.0.{NET}.100:6443\n  ca:\n    \
                 crt: {crt}\n    key: \"{key}\"\n",
                crt = STANDARD.encode(&self.ca.cert_pem),
                key = STANDARD.encode(self.ca.key_pem_talos_label()),
            )
            .into_bytes())
        }
    }

    fn boot(world: &World, ca: &SimCa) -> Talboot {
        let (store, w) = store::open(&world.state_dir()).unwrap().split();
        let (bus, writer) = EventBus::start(w.events, Arc::new(SystemClock));
        let mut settings = Settings::new(world.state_dir());
        settings.poll_interval = Duration::from_millis(50);
        settings.health_timeout = Duration::from_secs(60);
        settings.addon_manifests = Some(fixtures());
        settings.addon_timeouts = Timeouts {
            crd: Duration::from_secs(20),
            rollout: Duration::from_secs(20),
        };
        let admin = ca.admin().unwrap();
        let creds = ClientCreds {
            ca_pem: ca.cert_pem.clone().into_bytes(),
            crt_pem: admin.cert_pem.into_bytes(),
            key_pem: talos_label(&admin.key_pem).into_bytes(),
        };
        Talboot {
            prov: Some(Provisioner::new(
                world.inventory.clone(),
                store,
                ProvisionWriters {
                    nodes: w.nodes,
                    progress: w.progress,
                },
                bus.clone(),
                Arc::new(CpRenderer { ca: ca.clone() }),
                creds,
                settings,
            )),
            bus: Some(bus),
            writer,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_a_fake_talos_node_to_handed_off_with_restarts_at_every_step() {
        talboot::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let inv_path = dir.path().join("talboot.yaml");
        std::fs::write(&inv_path, INVENTORY.replace("127.0.61.", "127.0.63.")).unwrap();
        let inventory = Arc::new(talboot::inventory::load(&inv_path).unwrap().inventory);
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        let world = World {
            dir,
            inventory,
            double,
        };
        let cluster = FakeCluster::new();
        let node_ip = Ipv4Addr::new(127, 0, NET, 11);
        let node = FakeTalosNode::start(FakeNodeConfig::new(IpAddr::V4(node_ip), "cp1"), &cluster)
            .await
            .unwrap();
        // The API endpoint answers TCP for the health wait.
        let _api = tokio::net::TcpListener::bind((Ipv4Addr::new(127, 0, NET, 100), 6443))
            .await
            .unwrap();
        let ca = SimCa::new_os_ca().unwrap();
        {
            let s = store::open(&world.state_dir()).unwrap().split().1.leases;
            let now = talboot::events::Clock::now_unix(&SystemClock);
            s.put_lease(&Lease {
                mac: "02:00:00:3d:00:0b".parse().unwrap(),
                ip: node_ip,
                hostname: Some("cp1".into()),
                state: LeaseState::Bound,
                expires_at_unix: now + 3600,
                updated_at_unix: now,
            })
            .unwrap();
        }

        // Configure the node, a restart before every step. The double installs
        // asynchronously, so a waiting step is retried until the install is done; the
        // iteration cap only guards against a hang.
        let mut settled = false;
        for _ in 0..600 {
            let t = boot(&world, &ca);
            let step = t.prov().step_node("cp1").await.unwrap();
            t.kill().await;
            match step {
                NodeStep::Settled => {
                    settled = true;
                    break;
                }
                NodeStep::Advanced(_) => {}
                NodeStep::Waiting(_) => {
                    for _ in 0..600 {
                        if node.phase() != Phase::Booting {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    // A new cluster's control plane finishes booting only after Bootstrap
                    // (its etcd waits to join), which talboot's run loop does alongside.
                    let mark = store::open(&world.state_dir())
                        .unwrap()
                        .row(store::ClusterTable::Progress, BOOTSTRAP_KEY)
                        .unwrap();
                    if mark.as_deref() != Some(b"done".as_slice()) {
                        let t = boot(&world, &ca);
                        let _ = t.prov().step_cluster().await;
                        t.kill().await;
                    }
                }
            }
        }
        assert!(settled, "cp1 never settled");

        // The cluster steps, a restart before every one.
        let mut completed = Vec::new();
        let mut done = false;
        for _ in 0..20 {
            let t = boot(&world, &ca);
            let out = t.prov().step_addons().await.unwrap();
            t.kill().await;
            match out {
                StepOutcome::Done => {
                    done = true;
                    break;
                }
                StepOutcome::Completed(s) => completed.push(s),
                StepOutcome::Bootstrapping(ClusterProgress::KubeconfigWritten(path)) => {
                    assert_eq!(std::fs::read(&path).ok(), node.last_kubeconfig());
                    std::fs::write(&path, world.double.kubeconfig()).unwrap();
                }
                StepOutcome::Bootstrapping(_) => {}
                StepOutcome::Failed { error, .. } => panic!("step failed: {error}"),
            }
        }
        assert!(done, "never handed off: {completed:?}");
        assert_eq!(
            completed,
            [
                ClusterStep::Bootstrapped,
                ClusterStep::ApiReady,
                ClusterStep::CniInstalled,
                ClusterStep::NodesReady,
                ClusterStep::ArgoCdInstalled,
                ClusterStep::HandedOff,
            ]
        );
        assert_eq!(node.bootstrap_calls(), 1);
        assert_eq!(node.kubeconfig_calls(), 1);
        let applied = world.double.applies().len();
        assert!(applied > 0);

        // Restarts after the hand-off repeat nothing.
        for _ in 0..2 {
            let t = boot(&world, &ca);
            assert_eq!(t.prov().step_addons().await.unwrap(), StepOutcome::Done);
            t.kill().await;
        }
        assert_eq!(node.bootstrap_calls(), 1);
        assert_eq!(node.kubeconfig_calls(), 1);
        assert_eq!(world.double.applies().len(), applied);
    }
}
