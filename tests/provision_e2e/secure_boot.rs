//! Issue 27 item 3: a `secureBoot: true` node is configured only when its maintenance API
//! reports Secure Boot enforced, a Talos UKI and the boot set's PCR signing key
//! (`runtime/SecurityStates.talos.dev/securitystate`, served by the Talos double as
//! siderolabs/talos v1.14.0-rc.1 `internal/app/machined/pkg/controllers/runtime/security_state.go`
//! fills it). Anything else: no ApplyConfiguration at all, a `security.refused` event naming
//! what the node reported, and the node Failed with the reason.

use sha2::Digest;
use talboot::provision::secure_boot::talos_fingerprint;
use talboot::sim::talos::SimSecurity;

use super::*;

/// The `.pcrpkey` fingerprint of the boot set's UKI (Talos's format).
fn boot_set_key() -> String {
    talos_fingerprint(&sha2::Sha256::digest(b"boot set pcr key").into())
}

fn sb_cp(name: &'static str, last: u8) -> Machine {
    Machine {
        name,
        last,
        cp: true,
        install: "installDisk: /dev/sda\n    secureBoot: true",
    }
}

/// Steps `name` with the boot set's key known for every secure-boot node, until it is
/// refused, starts installing, or settles.
async fn gate(world: &World, name: &str) -> Result<NodeStep, ProvisionError> {
    let keys: std::collections::BTreeMap<String, String> = world
        .inventory
        .nodes
        .iter()
        .filter(|n| n.secure_boot())
        .map(|n| (n.name.to_string(), boot_set_key()))
        .collect();
    let t = world.boot_tuned(world.creds.clone(), |s| s.secure_boot_keys = Arc::new(keys));
    let r = step_until(&t, name, |r| {
        matches!(
            r,
            Err(_) | Ok(NodeStep::Advanced(NodePhase::Installing)) | Ok(NodeStep::Settled)
        )
    })
    .await;
    t.kill().await;
    r
}

/// A refused node: nothing ever sent, the refusal event carries `reported`, the phase says why.
async fn assert_refused(world: &World, name: &str, reported: &[&str]) {
    let r = gate(world, name).await;
    assert!(
        matches!(r, Err(ProvisionError::SecureBoot { .. })),
        "{name}: {r:?}"
    );
    let node = world.node(name);
    assert_eq!(node.apply_calls(), 0, "{name} was sent a config");
    assert!(
        node.served()
            .iter()
            .all(|s| !s.rpc.contains("ApplyConfiguration")),
        "{name}: {:?}",
        node.served()
    );
    assert_eq!(world.phase(name), NodePhase::Failed);
    let events = world.events(name);
    let refused: Vec<&String> = events
        .iter()
        .filter(|e| e.starts_with("security.refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{events:#?}");
    for want in reported {
        assert!(refused[0].contains(want), "{want} not in {}", refused[0]);
    }
    // No secret of the cluster in any event: the CA key, the bootstrap token.
    let key = STANDARD.encode(world.ca.key_pem_talos_label());
    let all = events.join("\n");
    assert!(
        !all.contains(&key) && !all.contains("0123456789abcdef"),
        "{all}"
    );
    // Stepping again sends nothing either: Failed waits for the operator.
    let t = world.boot();
    assert_eq!(t.prov().step_node(name).await.unwrap(), NodeStep::Settled);
    t.kill().await;
    assert_eq!(node.apply_calls(), 0);
    // `talboot status` shows the phase and why.
    let row = status_row(world, name);
    assert!(
        row.contains("failed") && row.contains("secureBoot node refused, no config sent"),
        "{row}"
    );
}

#[tokio::test]
async fn a_secure_boot_node_that_booted_the_boot_sets_uki_is_configured() {
    let machines = [sb_cp("sb-1", 11)];
    let world = World::start(90, &machines, |cfg| {
        cfg.security = SimSecurity::secure_boot(&boot_set_key())
    })
    .await;
    let r = gate(&world, "sb-1").await;
    assert_eq!(r.unwrap(), NodeStep::Advanced(NodePhase::Installing));
    assert_eq!(world.node("sb-1").apply_calls(), 1);
    assert_eq!(world.node("sb-1").security_state_reads(), 1);
    let events = world.events("sb-1").join("\n");
    assert!(
        events.contains(
            "SecurityState passed the Secure Boot gate: secureBoot=true bootedWithUKI=true"
        ),
        "{events}"
    );
    assert!(!events.contains("security.refused"), "{events}");
}

#[tokio::test]
async fn a_secure_boot_node_reporting_secure_boot_off_gets_no_config() {
    let machines = [sb_cp("sb-off", 11), sb_cp("sb-setup", 12)];
    let world = World::start(91, &machines, |cfg| {
        cfg.security = SimSecurity {
            // Off in the firmware; or on but in setup mode (no PK: nothing enforced).
            firmware_secure_boot: cfg.hostname == "sb-setup",
            setup_mode: cfg.hostname == "sb-setup",
            ..SimSecurity::secure_boot(&boot_set_key())
        }
    })
    .await;
    let key = boot_set_key();
    let reported = [
        "Secure Boot is not enforced",
        "secureBoot=false",
        "bootedWithUKI=true",
        &format!("pcrSigningKeyFingerprint={key}"),
        "ukiSigningKeyFingerprint=(none)",
        "selinuxState=\"disabled\"",
        "fipsState=\"disabled\"",
        "moduleSignatureEnforced=false",
    ];
    assert_refused(&world, "sb-off", &reported).await;
    assert_refused(&world, "sb-setup", &reported).await;
}

#[tokio::test]
async fn a_uki_with_another_pcr_key_or_no_uki_gets_no_config() {
    let machines = [sb_cp("sb-key", 11), sb_cp("sb-pxe", 12)];
    let other = talos_fingerprint(&sha2::Sha256::digest(b"someone else's key").into());
    let world = World::start(92, &machines, |cfg| {
        cfg.security = if cfg.hostname == "sb-key" {
            SimSecurity::secure_boot(&other)
        } else {
            // Secure Boot on, but a kernel and initramfs, not a UKI: no PCR key either.
            SimSecurity {
                booted_with_uki: false,
                pcr_signing_key_fingerprint: None,
                ..SimSecurity::secure_boot("")
            }
        }
    })
    .await;
    let expected = format!("expected {}", boot_set_key());
    let reported = format!("pcrSigningKeyFingerprint={other}");
    assert_refused(
        &world,
        "sb-key",
        &[
            "PCR signing key is not the boot set's",
            &expected,
            &reported,
        ],
    )
    .await;
    assert_refused(
        &world,
        "sb-pxe",
        &[
            "did not boot from a Talos UKI",
            "bootedWithUKI=false",
            "pcrSigningKeyFingerprint=(none)",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_secure_boot_node_without_security_state_gets_no_config() {
    let machines = [sb_cp("sb-1", 11)];
    let world = World::start(93, &machines, |cfg| {
        cfg.security = SimSecurity {
            filled: false,
            ..SimSecurity::secure_boot(&boot_set_key())
        }
    })
    .await;
    assert_refused(&world, "sb-1", &["SecurityState resource does not exist"]).await;
}

#[tokio::test]
async fn a_boot_set_without_a_recorded_key_configures_no_secure_boot_node() {
    let machines = [sb_cp("sb-1", 11)];
    let world = World::start(94, &machines, |cfg| {
        cfg.security = SimSecurity::secure_boot(&boot_set_key())
    })
    .await;
    // No key for it in the settings, as with a catalog that records none.
    let t = world.boot();
    let r = step_until(&t, "sb-1", |r| r.is_err()).await;
    t.kill().await;
    let text = r.unwrap_err().to_string();
    assert!(
        text.contains("records no UKI .pcrpkey fingerprint"),
        "{text}"
    );
    assert_eq!(world.node("sb-1").apply_calls(), 0);
}

#[tokio::test]
async fn a_node_without_secure_boot_is_not_asked() {
    let machines = [sb_cp("sb-1", 11), worker("plain", 12)];
    // The plain node's firmware has no Secure Boot and it did not boot a UKI: no matter.
    let world = World::start(95, &machines, |cfg| {
        if cfg.hostname == "sb-1" {
            cfg.security = SimSecurity::secure_boot(&boot_set_key())
        }
    })
    .await;
    let r = gate(&world, "plain").await;
    assert_eq!(r.unwrap(), NodeStep::Advanced(NodePhase::Installing));
    let plain = world.node("plain");
    assert_eq!(plain.apply_calls(), 1);
    assert_eq!(plain.security_state_reads(), 0);
    assert!(
        !world
            .events("plain")
            .iter()
            .any(|e| e.contains("SecurityState") || e.starts_with("security.refused"))
    );
}

/// Firmware that refuses the signed UKI says nothing on the network (real OVMF: "Access
/// Denied" on its console after the whole file was served, `tests/secureboot_qemu.rs`). The
/// run loop keeps probing such a node, and once it has been silent for `boot_stall_after`
/// since its boot, one `boot.stalled` event says so, naming the Secure Boot cause for a
/// secure-boot node; a new boot from talboot starts the clock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_silent_after_its_uki_was_served_is_reported_stalled_once_per_boot() {
    let machines = [sb_cp("sb-1", 11)];
    let world = World::start(94, &machines, |cfg| {
        // The firmware refused the UKI: nothing ever listens on the Talos port.
        cfg.port = 50999;
        cfg.security = SimSecurity::secure_boot(&boot_set_key());
    })
    .await;
    let t = world.boot_tuned(world.creds.clone(), |s| {
        s.boot_stall_after = Duration::from_millis(600);
    });
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(t.prov().clone().run(cancel.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let bus = t.bus.clone().unwrap();
    // Every report as it goes out on the bus (the store's timeline is the running talboot's).
    let mut rx = bus.subscribe();
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let collector = tokio::spawn({
        let reports = reports.clone();
        async move {
            while let Ok(e) = rx.recv().await {
                if e.node == "sb-1" && e.kind == EventKind::BootStalled {
                    reports.lock().unwrap().push(e.detail);
                }
            }
        }
    });
    let stalled = || reports.lock().unwrap().clone();
    bus.publish("sb-1", EventKind::Uki, "secureboot-uki.efi to 127.0.94.11");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(stalled().is_empty(), "reported before its time");
    let mut seen = Vec::new();
    for _ in 0..150 {
        seen = stalled();
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert!(
        seen[0].contains("has not answered on the Talos maintenance API")
            && seen[0].contains("Access Denied")
            && seen[0].contains("talboot node secureboot status sb-1"),
        "{}",
        seen[0]
    );
    // Still silent: no second report for the same boot.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(stalled().len(), 1, "{:#?}", stalled());
    // The node boots again (power cycle): a new boot, a new clock, a new report.
    bus.publish("sb-1", EventKind::Uki, "secureboot-uki.efi to 127.0.94.11");
    let mut again = 0;
    for _ in 0..150 {
        again = stalled().len();
        if again == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    task.await.unwrap();
    collector.abort();
    drop(bus);
    t.kill().await;
    assert_eq!(again, 2, "{:#?}", stalled());
    assert_eq!(world.node("sb-1").apply_calls(), 0);
}
