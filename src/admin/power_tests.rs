//! The admin API's power requests: from [`PowerDesk::run`] through the node's driver to the
//! reply and the `power.action` event, with a controller that does not answer (the
//! real-peer runs are in tests/power.rs).

use std::sync::Arc;

use crate::events::{EventBus, EventKind, SystemClock};
use crate::inventory::Credential;
use crate::inventory::IpmiTarget;
use crate::power::dispatch::PowerRequest;
use crate::power::{PowerAction, PowerDriver};

use super::power::PowerDesk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_commands_reach_the_driver_and_leave_an_event() {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let (_store, w) = crate::store::open(&dir.path().join("state"))
        .unwrap()
        .split();
    let (bus, _writer) = EventBus::start(w.events, Arc::new(SystemClock));
    let mut events = bus.subscribe();
    // A BMC address where nothing listens: the driver is reached and its error comes back.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = udp.local_addr().unwrap().port();
    drop(udp);
    let drivers = Arc::new(
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
    let desk = PowerDesk::new(drivers, bus);

    let e = desk
        .run("cp-1", PowerRequest::Set(PowerAction::On))
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

    let e = desk
        .run("nobody", PowerRequest::Status)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no usable power controller"), "{e}");
}
