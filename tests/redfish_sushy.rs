//! The Redfish driver against a real Redfish service: OpenStack's `sushy-emulator` with its
//! fake driver (no libvirt). Proves discovery (the one member, and the 307 from a system's
//! name to its UUID URL), `ComputerSystem.Reset` for on/off/cycle until the state follows,
//! the boot-source override as the service stores it, HTTP Basic auth (a wrong secret is
//! refused and never shows in the error or in any log line), and TLS verification (on by
//! default; a CA option; explicit opt-out).
//!
//! Needs the sushy-tools venv that scripts/test-deps builds (TALBOOT_SKIP_SUSHY=1 skips).

mod support;

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::sushy::{Sushy, SushyOptions};
use talboot::inventory::Credential;
use talboot::power::redfish::{Redfish, RedfishConfig};
use talboot::power::{BootDevice, BootPersistence, PowerAction, PowerError, PowerState};

const UUID_A: &str = "9c8e7b43-1b7a-4bd3-9a1e-000000000a01";
const UUID_B: &str = "9c8e7b43-1b7a-4bd3-9a1e-000000000b02";
/// The fake driver applies a power change 1-11 s after the request.
const SETTLE: Duration = Duration::from_secs(60);

fn systems(list: &[(&str, &str, &str)]) -> String {
    let items: Vec<String> = list
        .iter()
        .map(|(uuid, name, state)| {
            format!(
                "{{'uuid': '{uuid}', 'name': '{name}', 'power_state': '{state}', 'external_notifier': False, 'nics': [{{'mac': '52:54:00:00:00:01', 'ip': '192.0.2.1'}}]}}"
            )
        })
        .collect();
    format!("SUSHY_EMULATOR_FAKE_SYSTEMS = [{}]", items.join(", "))
}

fn config(s: &Sushy, opts: &SushyOptions) -> RedfishConfig {
    RedfishConfig::new(
        &s.endpoint,
        &opts.user,
        Credential::new(opts.password.clone()),
    )
}

/// GET a resource straight from the emulator (to check what it stored, not what we think).
async fn raw_get(s: &Sushy, opts: &SushyOptions, path: &str) -> Value {
    talboot::install_crypto_provider();
    let c = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let r = c
        .get(format!("{}{path}", s.endpoint))
        .basic_auth(&opts.user, Some(&opts.password))
        .send()
        .await
        .unwrap();
    serde_json::from_str(&r.text().await.unwrap()).unwrap()
}

fn work(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tb-rf-{name}-"))
        .tempdir()
        .unwrap()
}

#[tokio::test]
async fn discovers_the_system_resets_it_and_sets_a_one_time_network_boot() {
    if !support::sushy::available() {
        return;
    }
    let dir = work("flow");
    let opts = SushyOptions {
        config: systems(&[(UUID_A, "node-a", "Off")]),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);

    // Discovery: the one member of /redfish/v1/Systems.
    let rf = Redfish::new(config(&bmc, &opts)).unwrap();
    assert_eq!(
        rf.system_path().await.unwrap(),
        format!("/redfish/v1/Systems/{UUID_A}")
    );
    // By name: the emulator answers 307 to the UUID URL, which becomes the system's path.
    let mut by_name = config(&bmc, &opts);
    by_name.system_id = Some("node-a".into());
    let rf_named = Redfish::new(by_name).unwrap();
    assert_eq!(
        rf_named.system_path().await.unwrap(),
        format!("/redfish/v1/Systems/{UUID_A}")
    );

    assert_eq!(rf.power_state().await.unwrap(), PowerState::Off);
    rf.set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    let sys = raw_get(&bmc, &opts, &format!("/redfish/v1/Systems/{UUID_A}")).await;
    assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Pxe", "{sys}");

    rf_named.set_power(PowerAction::On).await.unwrap();
    rf.wait_for(PowerState::On, SETTLE).await.unwrap();
    // Already on: nothing is sent, the state stays.
    rf.set_power(PowerAction::On).await.unwrap();
    assert_eq!(rf.power_state().await.unwrap(), PowerState::On);

    // Cycle: the fake driver's ForceRestart reads Off at once and On once applied.
    rf.set_power(PowerAction::Cycle).await.unwrap();
    rf.wait_for(PowerState::On, SETTLE).await.unwrap();

    rf.set_power(PowerAction::Off).await.unwrap();
    rf.wait_for(PowerState::Off, SETTLE).await.unwrap();

    // After install: a persistent boot from disk.
    rf.boot_from_disk_after_install().await.unwrap();
    let sys = raw_get(&bmc, &opts, &format!("/redfish/v1/Systems/{UUID_A}")).await;
    assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Hdd", "{sys}");
    // (BootSourceOverrideEnabled always reads back Continuous on sushy, whatever was sent, so
    // it proves nothing here; the body sent is checked in power::redfish::tests.)
}

#[tokio::test]
async fn several_systems_need_a_system_id_and_an_unknown_one_is_an_error() {
    if !support::sushy::available() {
        return;
    }
    let dir = work("multi");
    let opts = SushyOptions {
        config: systems(&[(UUID_A, "node-a", "Off"), (UUID_B, "node-b", "On")]),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    let err = Redfish::new(config(&bmc, &opts))
        .unwrap()
        .power_state()
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(UUID_A) && msg.contains(UUID_B) && msg.contains("system:"),
        "{msg}"
    );

    let mut b = config(&bmc, &opts);
    b.system_id = Some(UUID_B.into());
    assert_eq!(
        Redfish::new(b).unwrap().power_state().await.unwrap(),
        PowerState::On
    );

    let mut missing = config(&bmc, &opts);
    missing.system_id = Some("no-such-node".into());
    let err = Redfish::new(missing)
        .unwrap()
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(err, PowerError::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains("404"), "{err}");
}

/// Issue 24 item 5 against sushy-tools' own fake driver: a system whose boot mode is Legacy
/// (`boot_mode` in `SUSHY_EMULATOR_FAKE_SYSTEMS`; the emulator's PATCH handler stores
/// `BootSourceOverrideMode` through `set_boot_mode`, openstack/sushy-tools 2.2.0
/// `sushy_tools/emulator/main.py`) and a UEFI node: the one-time PXE override leaves it in UEFI.
#[tokio::test]
async fn a_uefi_node_on_a_legacy_sushy_system_is_set_to_uefi() {
    if !support::sushy::available() {
        return;
    }
    let dir = work("mode");
    let opts = SushyOptions {
        config: format!(
            "SUSHY_EMULATOR_FAKE_SYSTEMS = [{{'uuid': '{UUID_A}', 'name': 'node-a', 'power_state': 'Off', 'boot_mode': 'Legacy', 'external_notifier': False, 'nics': [{{'mac': '52:54:00:00:00:01', 'ip': '192.0.2.1'}}]}}]"
        ),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    let path = format!("/redfish/v1/Systems/{UUID_A}");
    let before = raw_get(&bmc, &opts, &path).await;
    assert_eq!(
        before["Boot"]["BootSourceOverrideMode"], "Legacy",
        "{before}"
    );
    let mut cfg = config(&bmc, &opts);
    cfg.boot_mode = Some(talboot::inventory::BootMode::Uefi);
    let set = Redfish::new(cfg)
        .unwrap()
        .set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    let sys = raw_get(&bmc, &opts, &path).await;
    assert_eq!(sys["Boot"]["BootSourceOverrideMode"], "UEFI", "{sys}");
    assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Pxe", "{sys}");
    assert_eq!(set.mode.as_deref(), Some("UEFI"));
    assert!(set.notes.is_empty(), "{set:?}");
}

/// Collects every log line (all targets, trace level) written while a test runs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_wrong_secret_is_refused_and_no_secret_reaches_errors_or_logs() {
    if !support::sushy::available() {
        return;
    }
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    // Process-wide: a thread-local default can miss callsites whose interest the other
    // tests of this binary, running in parallel, already cached without a subscriber. Only
    // this test installs one; the other tests' lines land here too, which is harmless.
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let dir = work("auth");
    let opts = SushyOptions {
        config: systems(&[(UUID_A, "node-a", "Off")]),
        password: "right-Secret-81z".into(),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    let wrong = "wrong-Secret-4kq";
    let cfg = RedfishConfig::new(&bmc.endpoint, &opts.user, Credential::new(wrong));
    assert!(!format!("{cfg:?}").contains(wrong));
    let rf = Redfish::new(cfg).unwrap();
    for err in [
        rf.power_state().await.unwrap_err(),
        rf.set_power(PowerAction::On).await.unwrap_err(),
        rf.set_boot_device(BootDevice::Network, BootPersistence::Once)
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(err, PowerError::Unauthorized { .. }), "{err:?}");
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(
                !text.contains(wrong) && !text.contains("right-Secret"),
                "{text}"
            );
        }
    }
    // The right secret works, with every log line captured at trace level.
    let rf = Redfish::new(config(&bmc, &opts)).unwrap();
    assert_eq!(rf.power_state().await.unwrap(), PowerState::Off);
    rf.set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    rf.set_power(PowerAction::On).await.unwrap();
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("redfish"),
        "the driver logged nothing: {logged}"
    );
    use base64::Engine;
    for secret in [wrong.to_string(), opts.password.clone()] {
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{secret}", opts.user));
        assert!(
            !logged.contains(&secret) && !logged.contains(&basic),
            "secret logged:\n{logged}"
        );
    }
}

/// A CA and a BMC certificate it signed for 127.0.0.1.
fn bmc_certs() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    (ca_cert.pem(), leaf.pem(), leaf_key.serialize_pem())
}

#[tokio::test]
async fn tls_is_verified_by_default_and_a_ca_option_trusts_the_bmc() {
    if !support::sushy::available() {
        return;
    }
    let dir = work("tls");
    let (ca, cert, key) = bmc_certs();
    let opts = SushyOptions {
        config: systems(&[(UUID_A, "node-a", "Off")]),
        tls: Some((cert, key)),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    assert!(bmc.endpoint.starts_with("https://"));

    // Default: verification on, and the BMC's CA is not a system root.
    let err = Redfish::new(config(&bmc, &opts))
        .unwrap()
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(err, PowerError::Unreachable { .. }), "{err:?}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // The CA option.
    let mut with_ca = config(&bmc, &opts);
    with_ca.ca_pem = Some(ca.into_bytes());
    assert_eq!(
        Redfish::new(with_ca).unwrap().power_state().await.unwrap(),
        PowerState::Off
    );

    // A CA that did not sign it is refused too.
    let (other_ca, _, _) = bmc_certs();
    let mut wrong_ca = config(&bmc, &opts);
    wrong_ca.ca_pem = Some(other_ca.into_bytes());
    let err = Redfish::new(wrong_ca)
        .unwrap()
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(err, PowerError::Unreachable { .. }), "{err:?}");

    // Explicit opt-out.
    let mut insecure = config(&bmc, &opts);
    insecure.verify_tls = false;
    assert_eq!(
        Redfish::new(insecure).unwrap().power_state().await.unwrap(),
        PowerState::Off
    );
    let _ = Path::new(&bmc.log);
}

/// Renders the minimal control-plane config the fake Talos node accepts (its OS CA).
struct CpRenderer {
    ca: talboot::sim::pki::SimCa,
}

impl talboot::machineconfig::renderer::ConfigRenderer for CpRenderer {
    fn render(
        &self,
        _node: &talboot::inventory::Node,
    ) -> Result<Vec<u8>, talboot::machineconfig::renderer::RenderError> {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        Ok(format!(
            "version: v1alpha1\nmachine:\n  type: controlplane\n  token: \
             abcdef.0123456789abcdef\n  ca:\n    crt: {crt}\n    key: \"{key}\"\n  \
             install:\n    disk: /dev/sda\ncluster:\n  clusterName: db\n  \
             controlPlane:\n    endpoint: https://127.0.65.100:6443\n  ca:\n    \
             crt: {crt}\n    key: \"{key}\"\n",
            crt = b64(self.ca.cert_pem.as_bytes()),
            key = b64(self.ca.key_pem_talos_label().as_bytes()),
        )
        .into_bytes())
    }
}

/// Issue 14 (local boot): once the provisioner sees a node installed (machine stage running,
/// from the fake Talos node), it sets the node's persistent boot device to the disk through
/// its Redfish BMC (sushy) and records it as a `power.action` event on the node's timeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_node_is_set_to_boot_from_disk_through_its_bmc() {
    use std::net::{IpAddr, Ipv4Addr};
    use talboot::events::{EventBus, SystemClock};
    use talboot::inventory::RedfishTarget;
    use talboot::power::PowerDriver;
    use talboot::provision::{NodeStep, ProvisionWriters, Provisioner, Settings};
    use talboot::sim::pki::{SimCa, talos_label};
    use talboot::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase};
    use talboot::store::{self, Lease, LeaseState, Store};

    if !support::sushy::available() {
        return;
    }
    talboot::install_crypto_provider();
    let dir = work("diskboot");
    let opts = SushyOptions {
        config: systems(&[(UUID_A, "cp1", "On")]),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    let sys_path = format!("/redfish/v1/Systems/{UUID_A}");
    // As `rack up` leaves it: a one-time network boot (the emulator starts at Hdd).
    Redfish::new(config(&bmc, &opts))
        .unwrap()
        .set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    let before = raw_get(&bmc, &opts, &sys_path).await;
    assert_eq!(
        before["Boot"]["BootSourceOverrideTarget"], "Pxe",
        "{before}"
    );

    let inv_path = dir.path().join("talboot.yaml");
    std::fs::write(
        &inv_path,
        "cluster:\n  name: db\n  talosVersion: v1.13.9\n  kubernetesVersion: 1.36.3\n  \
         endpoint: https://127.0.65.100:6443\n  vip: 127.0.65.100\n  secrets:\n    file: secrets.age\nnetwork:\n  \
         interfaces: [lo]\n  mode: authoritative\n  subnet: 127.0.65.0/24\nboot:\n  \
         delivery: push\nnodes:\n  - name: cp1\n    mac: \"02:00:00:41:00:0b\"\n    \
         role: controlplane\n    address: 127.0.65.11/24\n    installDisk: /dev/sda\n",
    )
    .unwrap();
    let inventory = Arc::new(talboot::inventory::load(&inv_path).unwrap().inventory);
    let state_dir = dir.path().join("talboot-state");
    std::fs::create_dir(&state_dir).unwrap();
    let node_ip = Ipv4Addr::new(127, 0, 65, 11);
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(IpAddr::V4(node_ip), "cp1"), &cluster)
        .await
        .unwrap();
    {
        let s = store::open(&state_dir).unwrap().split().1.leases;
        let now = talboot::events::Clock::now_unix(&SystemClock);
        s.put_lease(&Lease {
            mac: "02:00:00:41:00:0b".parse().unwrap(),
            ip: node_ip,
            hostname: Some("cp1".into()),
            state: LeaseState::Bound,
            expires_at_unix: now + 3600,
            updated_at_unix: now,
        })
        .unwrap();
    }
    let ca = SimCa::new_os_ca().unwrap();
    let admin = ca.admin().unwrap();
    let creds = talboot::talos::ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: admin.cert_pem.into_bytes(),
        key_pem: talos_label(&admin.key_pem).into_bytes(),
    };
    let (store, w) = store::open(&state_dir).unwrap().split();
    let store: Arc<dyn Store> = store;
    let (bus, writer) = EventBus::start(w.events, Arc::new(SystemClock));
    let mut settings = Settings::new(state_dir.clone());
    settings.poll_interval = Duration::from_millis(50);
    settings.power = Arc::new(std::collections::BTreeMap::from([(
        "cp1".to_string(),
        PowerDriver::Redfish(RedfishTarget {
            endpoint: bmc.endpoint.clone(),
            system_id: None,
            verify_tls: true,
            ca: None,
            user: opts.user.clone(),
            password: Credential::new(opts.password.clone()),
            auth: Default::default(),
            boot_mode: None,
        }),
    )]));
    let events_of = {
        let store = store.clone();
        move || -> Vec<String> {
            store
                .events("cp1", 0, 1000)
                .unwrap()
                .into_iter()
                .map(|e| format!("{} {}", e.kind, e.detail))
                .collect()
        }
    };
    let marks = store.clone();
    let prov = Provisioner::new(
        inventory,
        store,
        ProvisionWriters {
            nodes: w.nodes,
            progress: w.progress,
        },
        bus.clone(),
        Arc::new(CpRenderer { ca: ca.clone() }),
        creds,
        settings,
    );
    // Step until the node is Ready; the double installs asynchronously. The cap only guards
    // against a hang.
    let mut settled = false;
    for _ in 0..600 {
        match prov.step_node("cp1").await.unwrap() {
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
                // A new cluster's control plane finishes booting only after Bootstrap (its
                // etcd waits to join), which talboot's run loop does alongside.
                let mark = marks
                    .row(
                        talboot::store::ClusterTable::Progress,
                        talboot::provision::cluster::BOOTSTRAP_KEY,
                    )
                    .unwrap();
                if mark.as_deref() != Some(b"done".as_slice()) {
                    let _ = prov.step_cluster().await;
                }
            }
        }
    }
    assert!(settled, "cp1 never settled");
    // Off the writer loop: wait for the BMC to hold the disk boot device.
    let mut sys = Value::Null;
    for _ in 0..300 {
        sys = raw_get(&bmc, &opts, &sys_path).await;
        if sys["Boot"]["BootSourceOverrideTarget"] == "Hdd" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Hdd", "{sys}");
    // The event is published after the BMC answered; give the bus its turn, then flush it.
    let mut events = Vec::new();
    for _ in 0..100 {
        events = events_of();
        if events
            .iter()
            .any(|e| e.starts_with("power.action installed: persistent boot device set to disk"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(prov);
    drop(bus);
    writer.await.unwrap();
    let disk: Vec<_> = events
        .iter()
        .filter(|e| e.contains("boot device set to disk"))
        .collect();
    assert_eq!(disk.len(), 1, "{events:#?}");
    assert!(!events.iter().any(|e| e.contains(&opts.password)));
}
