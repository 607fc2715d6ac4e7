//! The provisioner's power command: from `CommandSender::power` through the node's driver to
//! the reply and the `power.action` event, with a controller that does not answer (the
//! real-peer runs are in tests/power.rs).

use std::sync::Arc;

use crate::events::{EventBus, EventKind, SystemClock};
use crate::inventory::Credential;
use crate::inventory::IpmiTarget;
use crate::power::dispatch::PowerRequest;
use crate::power::{PowerAction, PowerDriver};
use crate::provision::{ConfigRenderer, Provisioner, RenderError, Settings, command_channel};
use crate::talos::ClientCreds;

struct NoRender;

impl ConfigRenderer for NoRender {
    fn render(&self, _: &crate::inventory::Node) -> Result<Vec<u8>, RenderError> {
        Err(RenderError::Config("test renders nothing".into()))
    }
}

const INV: &str = "\
cluster:
  name: t
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://127.0.0.11:6443
network:
  interfaces: [lo]
  subnet: 127.0.0.0/24
nodes:
  - name: cp-1
    mac: aa:00:00:00:00:01
    role: controlplane
    address: 127.0.0.11/24
    installDisk: /dev/sda
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_commands_reach_the_driver_and_leave_an_event() {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("talboot.yaml");
    std::fs::write(&path, INV).unwrap();
    let inv = Arc::new(crate::inventory::load(&path).unwrap().inventory);
    let store: Arc<dyn crate::store::Store> =
        Arc::new(crate::store::open(&dir.path().join("state")).unwrap());
    let (bus, _writer) = EventBus::start(store.clone(), Arc::new(SystemClock));
    let mut events = bus.subscribe();
    let ca = crate::sim::pki::SimCa::new_os_ca().unwrap();
    let admin = ca.admin().unwrap();
    let creds = ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: admin.cert_pem.into_bytes(),
        key_pem: crate::sim::pki::talos_label(&admin.key_pem).into_bytes(),
    };
    let mut settings = Settings::new(dir.path().join("state"));
    // A BMC address where nothing listens: the driver is reached and its error comes back.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = udp.local_addr().unwrap().port();
    drop(udp);
    settings.power = Arc::new(
        [(
            "cp-1".to_owned(),
            PowerDriver::Ipmi(IpmiTarget {
                host: "127.0.0.1".into(),
                port,
                user: "admin".into(),
                password: Credential::new("cmd-test-secret-42"),
                efi_boot: false,
            }),
        )]
        .into_iter()
        .collect(),
    );
    let (commands, rx) = command_channel();
    let prov =
        Provisioner::new(inv, store, bus, Arc::new(NoRender), creds, settings).with_commands(rx);
    let cancel = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(prov.run(cancel.clone()));

    let e = commands
        .power("cp-1", PowerRequest::Set(PowerAction::On))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("ipmi://127.0.0.1:{port}")), "{e}");
    assert!(!e.contains("cmd-test-secret-42"), "{e}");
    let ev = loop {
        let ev = events.recv().await.unwrap();
        if ev.kind == EventKind::Power {
            break ev;
        }
    };
    assert_eq!(ev.node, "cp-1");
    assert!(ev.detail.starts_with("failed: "), "{}", ev.detail);
    assert!(!ev.detail.contains("cmd-test-secret-42"));

    let e = commands
        .power("nobody", PowerRequest::Status)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no usable power controller"), "{e}");
    cancel.cancel();
    let _ = run.await;
}
