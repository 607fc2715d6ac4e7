//! talboot's Talos client against the strict fake Talos node (src/sim/talos.rs):
//! maintenance probe and facts, refusals in maintenance, config validation, install into the
//! mTLS API, certificate and role checks, bootstrap exactly once, kubeconfig streaming, the
//! `node` relay and reset. Every fake node listens on its own 127.0.13.x address, port 50000;
//! each test uses its own addresses so tests can run in parallel.

use std::net::IpAddr;

use base64::Engine as _;
use rcgen::ExtendedKeyUsagePurpose;

use talboot::sim::disks::SimDisk;
use talboot::sim::pki::{SimCa, talos_label};
use talboot::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase, TALOS_TAG};
use talboot::talos::api::machine::{apply_configuration_request::Mode, reset_request::WipeMode};
use talboot::talos::api::storage;
use talboot::talos::retry::RetryPolicy;
use talboot::talos::{ClientCreds, TalosClient, TalosError};

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 13, last])
}

/// A maintenance client that fails fast (expected failures must not wait for retries).
fn maintenance(node: &FakeTalosNode) -> TalosClient {
    TalosClient::maintenance(node.addr())
        .unwrap()
        .with_retry(RetryPolicy::NONE)
}

fn secured(node: &FakeTalosNode, creds: &ClientCreds) -> TalosClient {
    TalosClient::secured(node.addr(), creds)
        .unwrap()
        .with_retry(RetryPolicy::NONE)
}

/// Admin credentials as a talosconfig carries them (key under Talos's Ed25519 label).
fn admin_creds(ca: &SimCa) -> ClientCreds {
    let admin = ca.admin().unwrap();
    ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: admin.cert_pem.into_bytes(),
        key_pem: talos_label(&admin.key_pem).into_bytes(),
    }
}

fn creds_with(ca: &SimCa, roles: &[&str], ekus: Vec<ExtendedKeyUsagePurpose>) -> ClientCreds {
    let ck = ca.client(roles, ekus).unwrap();
    ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: ck.cert_pem.into_bytes(),
        key_pem: ck.key_pem.into_bytes(),
    }
}

/// A minimal v1alpha1 machine config plus a HostnameConfig document, with `machine.ca` from
/// `ca` (base64 PEM, key under Talos's label; workers carry the certificate only).
fn machine_config(machine_type: &str, ca: &SimCa, endpoint_ip: IpAddr) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let key = if machine_type == "worker" {
        String::new()
    } else {
        b64(&ca.key_pem_talos_label())
    };
    format!(
        "version: v1alpha1\n\
         debug: false\n\
         persist: true\n\
         machine:\n  \
           type: {machine_type}\n  \
           token: abcdef.0123456789abcdef\n  \
           ca:\n    \
             crt: {crt}\n    \
             key: \"{key}\"\n  \
           install:\n    \
             disk: /dev/sda\n\
         cluster:\n  \
           id: Y2x1c3Rlci1pZA==\n  \
           secret: c2VjcmV0\n  \
           clusterName: lab\n  \
           controlPlane:\n    \
             endpoint: https://{endpoint_ip}:6443\n  \
           token: abcdef.0123456789abcdef\n  \
           ca:\n    \
             crt: {k8s_crt}\n    \
             key: \"{k8s_key}\"\n\
         ---\n\
         apiVersion: v1alpha1\n\
         kind: HostnameConfig\n\
         auto: stable\n",
        crt = b64(&ca.cert_pem),
        k8s_crt = b64(&k8s_ca().cert_pem),
        k8s_key = if machine_type != "worker" {
            b64(&k8s_ca().key_pem_talos_label())
        } else {
            String::new()
        },
    )
}

/// The Kubernetes CA (`cluster.ca`) every config of this test binary carries.
fn k8s_ca() -> &'static SimCa {
    static CA: std::sync::OnceLock<SimCa> = std::sync::OnceLock::new();
    CA.get_or_init(|| SimCa::new_ca("kubernetes").unwrap())
}

#[tokio::test]
async fn maintenance_probe_reads_version_disks_and_hardware() {
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(ip(10), "node-10"), &cluster)
        .await
        .unwrap();
    let client = maintenance(&node);

    let version = client.version().await.unwrap();
    assert_eq!(version.version.unwrap().tag, TALOS_TAG);
    assert_eq!(version.platform.unwrap().name, "metal");

    // storaged: device_name = filepath.Join("/dev", id) (internal/app/storaged/server.go).
    let disks = client.disks().await.unwrap();
    assert_eq!(disks.len(), 1);
    assert_eq!(disks[0].device_name, "/dev/sda");
    assert_eq!(disks[0].size, 120_034_123_776);
    assert_eq!(disks[0].r#type, storage::disk::DiskType::Ssd as i32);

    let sysinfo = client.system_information().await.unwrap().unwrap();
    assert_eq!(
        sysinfo.uuid,
        FakeNodeConfig::new(ip(10), "node-10").system_uuid
    );

    // block.Disk: bare ID, full dev_path, the fields the selector matches on.
    let cosi_disks = client.cosi_disks().await.unwrap();
    assert_eq!(cosi_disks.len(), 1);
    let d = &cosi_disks[0];
    assert_eq!(d.id, "sda");
    assert_eq!(d.spec.dev_path, "/dev/sda");
    assert_eq!(d.spec.transport, "sata");
    assert!(!d.spec.rotational && !d.spec.cdrom && !d.spec.readonly);
    assert_eq!(d.spec.size, 120_034_123_776);
    assert_eq!(d.spec.pretty_size, "120 GB");
    assert_eq!(d.spec.model, "KINGSTON SA400S37120G");
    assert_eq!(d.spec.serial, "SN-node-10");
    assert!(d.spec.wwid.starts_with("naa."), "{:?}", d.spec.wwid);
    assert_eq!(d.spec.sub_system, "/sys/class/block");
    assert_eq!(d.spec.modalias, "scsi:t-0x00");
    assert!(
        d.spec.bus_path.starts_with("/pci0000:00/"),
        "{}",
        d.spec.bus_path
    );
    assert!(
        d.spec
            .symlinks
            .contains(&"/dev/disk/by-id/ata-KINGSTON_SA400S37120G_SN-node-10".to_owned()),
        "{:?}",
        d.spec.symlinks
    );

    let services = client.service_list().await.unwrap();
    assert!(services.iter().any(|s| s.id == "apid"), "{services:?}");

    // Every maintenance caller is os:reader.
    let served = node.served();
    assert_eq!(served.len(), 5, "{served:?}");
    assert!(
        served
            .iter()
            .all(|s| s.roles == ["os:reader"] && !s.relayed)
    );

    // Unknown COSI resources are NotFound, not an empty success.
    let missing = client.cosi_get("hardware", "Nope.talos.dev", "x").await;
    assert!(
        matches!(
            missing,
            Err(TalosError::Remote {
                code: tonic::Code::NotFound,
                ..
            })
        ),
        "{missing:?}"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn admin_calls_in_maintenance_are_refused_with_an_actionable_error() {
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(ip(20), "node-20"), &cluster)
        .await
        .unwrap();
    let client = maintenance(&node);

    let err = client.bootstrap().await.unwrap_err();
    assert!(matches!(err, TalosError::Maintenance { .. }), "{err:?}");
    assert!(
        err.to_string().contains("Apply its machine config first"),
        "{err}"
    );
    assert!(matches!(
        client.kubeconfig().await,
        Err(TalosError::Maintenance { .. })
    ));
    assert!(matches!(
        client.reset(false, true).await,
        Err(TalosError::Maintenance { .. })
    ));
    assert!(matches!(
        client.reboot().await,
        Err(TalosError::Maintenance { .. })
    ));
    assert_eq!(node.bootstrap_calls(), 0);
    assert_eq!(node.reset_calls(), 0);
    assert_eq!(node.phase(), Phase::Maintenance);

    // Maintenance mode ignores the `node` header (routing is disabled): served locally.
    let relayed = client.with_node("127.0.13.99").unwrap();
    assert_eq!(relayed.disks().await.unwrap()[0].device_name, "/dev/sda");

    // The secured client against a maintenance node fails on the throwaway CA: the
    // classic "certificate signed by unknown authority" case, named for what it is.
    let os_ca = SimCa::new_os_ca().unwrap();
    let err = secured(&node, &admin_creds(&os_ca))
        .version()
        .await
        .unwrap_err();
    assert!(matches!(err, TalosError::WrongCa { .. }), "{err:?}");
    assert!(err.to_string().contains("maintenance mode"), "{err}");
    node.shutdown().await;
}

#[tokio::test]
async fn apply_rejects_yaml_that_is_not_a_talos_config() {
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(ip(30), "node-30"), &cluster)
        .await
        .unwrap();
    let client = maintenance(&node);
    let ca = SimCa::new_os_ca().unwrap();

    let not_talos = client
        .apply_configuration(b"hello: world\n")
        .await
        .unwrap_err();
    assert!(
        matches!(&not_talos, TalosError::Remote { code: tonic::Code::InvalidArgument, message, .. } if message.contains("missing kind")),
        "{not_talos:?}"
    );
    let broken = client
        .apply_configuration(b"version: [v1alpha1\n")
        .await
        .unwrap_err();
    assert!(
        matches!(
            broken,
            TalosError::Remote {
                code: tonic::Code::InvalidArgument,
                ..
            }
        ),
        "{broken:?}"
    );
    let bad_type =
        machine_config("controlplane", &ca, ip(30)).replace("type: controlplane", "type: master");
    let err = client
        .apply_configuration(bad_type.as_bytes())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown machine type \"master\""),
        "{err}"
    );
    let no_disk = machine_config("controlplane", &ca, ip(30)).replace("    disk: /dev/sda\n", "");
    let err = client
        .apply_configuration(no_disk.as_bytes())
        .await
        .unwrap_err();
    // `install:` left empty is no install section at all (a nil pointer in Talos).
    assert!(
        err.to_string()
            .contains("install instructions are required in \"metal\" mode"),
        "{err}"
    );

    assert_eq!(node.apply_calls(), 4);
    assert_eq!(node.last_applied_config(), None);
    assert_eq!(node.phase(), Phase::Maintenance);
    // Invalid applies change nothing: the node still answers in maintenance mode.
    client.version().await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn applied_node_installs_and_then_requires_an_admin_certificate() {
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(ip(40), "cp-40"), &cluster)
        .await
        .unwrap();
    let ca = SimCa::new_os_ca().unwrap();
    let config = machine_config("controlplane", &ca, ip(40));

    let outcome = maintenance(&node)
        .apply_configuration(config.as_bytes())
        .await
        .unwrap();
    assert_eq!(outcome.mode, Some(Mode::NoReboot));
    // What went over the wire: mode AUTO (1), never the zero value REBOOT.
    assert_eq!(node.last_apply_mode(), Some(Mode::Auto as i32));
    assert_eq!(node.last_applied_config().as_deref(), Some(config.as_str()));
    node.wait_phase(Phase::Secured).await.unwrap();

    // The maintenance client now meets a node that wants a client certificate.
    let err = maintenance(&node).version().await.unwrap_err();
    assert!(
        matches!(err, TalosError::NotInMaintenance { .. }),
        "{err:?}"
    );

    // Admin mTLS works, verified against the cluster OS CA from machine.ca.
    let admin = secured(&node, &admin_creds(&ca));
    assert_eq!(
        admin.version().await.unwrap().version.unwrap().tag,
        TALOS_TAG
    );
    // Installed to `disk: /dev/sda`: storaged now marks it as the system disk.
    assert_eq!(node.install_disk(), Some(Ok("/dev/sda".to_owned())));
    let disks = admin.disks().await.unwrap();
    assert!(disks[0].system_disk, "{disks:?}");
    assert_eq!(
        node.served().last().unwrap().roles,
        vec!["os:admin".to_owned()]
    );

    // A CA from another cluster: the server does not verify.
    let other = SimCa::new_os_ca().unwrap();
    let mut wrong_ca = admin_creds(&ca);
    wrong_ca.ca_pem = other.cert_pem.clone().into_bytes();
    let err = secured(&node, &wrong_ca).version().await.unwrap_err();
    assert!(matches!(err, TalosError::WrongCa { .. }), "{err:?}");

    // A client certificate from another CA, or with ServerAuth+ClientAuth: refused in the
    // handshake.
    let mut foreign = admin_creds(&other);
    foreign.ca_pem = ca.cert_pem.clone().into_bytes();
    let err = secured(&node, &foreign).version().await.unwrap_err();
    assert!(
        matches!(err, TalosError::ClientCertRejected { .. }),
        "{err:?}"
    );
    let both_ekus = creds_with(
        &ca,
        &["os:admin"],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let err = secured(&node, &both_ekus).version().await.unwrap_err();
    assert!(
        matches!(err, TalosError::ClientCertRejected { .. }),
        "{err:?}"
    );

    // os:reader may read but not bootstrap, and may no longer apply.
    let reader = secured(
        &node,
        &creds_with(
            &ca,
            &["os:reader"],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        ),
    );
    reader.disks().await.unwrap();
    let err = reader.bootstrap().await.unwrap_err();
    assert!(
        matches!(err, TalosError::PermissionDenied { .. }),
        "{err:?}"
    );
    let err = reader
        .apply_configuration(config.as_bytes())
        .await
        .unwrap_err();
    assert!(
        matches!(err, TalosError::PermissionDenied { .. }),
        "{err:?}"
    );
    assert_eq!(node.bootstrap_calls(), 0);

    // Bad credentials are caught before any connection, without echoing the key.
    let mut junk = admin_creds(&ca);
    junk.key_pem = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_vec();
    let err = TalosClient::secured(node.addr(), &junk).unwrap_err();
    assert!(
        matches!(
            err,
            TalosError::Credentials {
                what: "client key",
                ..
            }
        ),
        "{err:?}"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn bootstrap_happens_once_and_kubeconfig_streams_back() {
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(ip(50), "cp-50"), &cluster)
        .await
        .unwrap();
    let ca = SimCa::new_os_ca().unwrap();
    maintenance(&node)
        .apply_configuration(machine_config("init", &ca, ip(50)).as_bytes())
        .await
        .unwrap();
    node.wait_phase(Phase::Secured).await.unwrap();
    let admin = secured(&node, &admin_creds(&ca));

    // No etcd before bootstrap: Talos finds no control-plane endpoints to ask (a plain
    // error, so codes.Unknown).
    let err = admin.etcd_member_list().await.unwrap_err();
    assert!(
        matches!(
            &err,
            TalosError::Remote {
                code: tonic::Code::Unknown,
                message,
                ..
            } if message == "no controlplane endpoints discovered yet"
        ),
        "{err:?}"
    );
    let etcd = |services: &[talboot::talos::api::machine::ServiceInfo]| {
        services
            .iter()
            .find(|s| s.id == "etcd")
            .map(|s| s.state.clone())
    };
    assert_eq!(
        etcd(&admin.service_list().await.unwrap()).as_deref(),
        Some("Preparing")
    );

    admin.bootstrap().await.unwrap();
    let err = admin.bootstrap().await.unwrap_err();
    assert!(
        matches!(err, TalosError::AlreadyBootstrapped { .. }),
        "{err:?}"
    );
    assert_eq!(node.bootstrap_calls(), 2);
    // etcd starts after Bootstrap answered (as after any boot, it serves a few seconds
    // later); the member list needs it to have a leader.
    let mut members = Vec::new();
    for _ in 0..500 {
        if let Ok(m) = admin.etcd_member_list().await {
            members = m;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        etcd(&admin.service_list().await.unwrap()).as_deref(),
        Some("Running")
    );
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].hostname, "cp-50");

    let kubeconfig = admin.kubeconfig().await.unwrap();
    assert_eq!(Some(kubeconfig.clone()), node.last_kubeconfig());
    let text = String::from_utf8(kubeconfig.clone()).unwrap();
    assert!(text.contains("server: https://127.0.13.50:6443"), "{text}");
    assert!(text.contains("admin@lab"), "{text}");
    // Each call mints a new client certificate.
    let again = admin.kubeconfig().await.unwrap();
    assert_ne!(again, kubeconfig);
    assert_eq!(Some(again), node.last_kubeconfig());
    assert_eq!(node.kubeconfig_calls(), 2);

    // A reboot comes back into the secured API with etcd still bootstrapped.
    admin.reboot().await.unwrap();
    node.wait_phase(Phase::Secured).await.unwrap();
    assert_eq!(node.reboot_calls(), 1);
    assert!(matches!(
        admin.bootstrap().await,
        Err(TalosError::AlreadyBootstrapped { .. })
    ));
    node.shutdown().await;
}

#[tokio::test]
async fn worker_behind_control_plane_is_reached_with_the_node_header_and_reset() {
    let cluster = FakeCluster::new();
    let cp = FakeTalosNode::start(FakeNodeConfig::new(ip(60), "cp-60"), &cluster)
        .await
        .unwrap();
    let mut worker_cfg = FakeNodeConfig::new(ip(61), "worker-61");
    worker_cfg.disks = vec![SimDisk::nvme(0, "Samsung SSD 980", "S1", 500_000_000_000)];
    let worker = FakeTalosNode::start(worker_cfg, &cluster).await.unwrap();
    let ca = SimCa::new_os_ca().unwrap();

    maintenance(&cp)
        .apply_configuration(machine_config("controlplane", &ca, ip(60)).as_bytes())
        .await
        .unwrap();
    cp.wait_phase(Phase::Secured).await.unwrap();
    // The worker config holds the OS CA certificate only; its apid certificate comes from
    // the control plane (trustd).
    maintenance(&worker)
        .apply_configuration(machine_config("worker", &ca, ip(60)).as_bytes())
        .await
        .unwrap();
    worker.wait_phase(Phase::Secured).await.unwrap();

    let creds = admin_creds(&ca);
    secured(&worker, &creds).version().await.unwrap();
    // From now on only the control plane may reach the worker.
    worker.restrict_to(Some(cp.ip()));
    let err = secured(&worker, &creds).disks().await.unwrap_err();
    assert!(matches!(err, TalosError::Unreachable { .. }), "{err:?}");

    let via_cp = secured(&cp, &creds).with_node("127.0.13.61").unwrap();
    let disks = via_cp.disks().await.unwrap();
    assert_eq!(disks[0].device_name, "/dev/nvme0n1");
    let last = worker.served().last().cloned().unwrap();
    assert_eq!(last.rpc, "Disks");
    assert!(last.relayed);
    assert_eq!(last.roles, vec!["os:admin".to_owned()]);
    // By hostname too, and streamed calls are relayed as well.
    let by_name = secured(&cp, &creds).with_node("worker-61").unwrap();
    assert_eq!(
        by_name.cosi_disks().await.unwrap()[0].spec.dev_path,
        "/dev/nvme0n1"
    );
    // The worker's own errors come back through the relay.
    let err = by_name.bootstrap().await.unwrap_err();
    assert!(matches!(err, TalosError::Unimplemented { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("worker-61 (via 127.0.13.60:50000)"),
        "{err}"
    );
    assert_eq!(cp.bootstrap_calls(), 0);
    // A node the endpoint cannot reach.
    let err = secured(&cp, &creds)
        .with_node("127.0.13.69")
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert!(matches!(err, TalosError::Unreachable { .. }), "{err:?}");

    // Reset through the relay: STATE + EPHEMERAL only, then the worker is back in
    // maintenance mode.
    via_cp.reset(true, true).await.unwrap();
    let reset = worker.last_reset().unwrap();
    let labels: Vec<_> = reset
        .system_partitions_to_wipe
        .iter()
        .map(|p| (p.label.as_str(), p.wipe))
        .collect();
    assert_eq!(labels, [("STATE", true), ("EPHEMERAL", true)]);
    assert_eq!(reset.mode, WipeMode::SystemDisk as i32);
    assert!(reset.graceful && reset.reboot);
    assert!(reset.user_disks_to_wipe.is_empty());
    worker.wait_phase(Phase::Maintenance).await.unwrap();
    assert_eq!(cp.reset_calls(), 0);
    assert_eq!(worker.reset_calls(), 1);

    worker.restrict_to(None);
    maintenance(&worker).version().await.unwrap();

    worker.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test]
async fn unreachable_node_is_reported_as_unreachable() {
    // Nothing listens on 127.0.13.70:50000.
    let addr = std::net::SocketAddr::new(ip(70), 50000);
    let err = TalosClient::maintenance(addr)
        .unwrap()
        .with_retry(RetryPolicy {
            attempts: 2,
            base: std::time::Duration::ZERO,
            max: std::time::Duration::ZERO,
        })
        .version()
        .await
        .unwrap_err();
    assert!(matches!(err, TalosError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("127.0.13.70:50000"), "{err}");
}

#[tokio::test]
async fn disks_are_listed_in_talos_order_with_full_paths_and_bare_ids() {
    let cluster = FakeCluster::new();
    let mut cfg = FakeNodeConfig::new(ip(11), "node-11");
    // Enumerated out of order, as a kernel may: Talos lists by resource ID either way.
    cfg.disks = vec![
        SimDisk::sata(1, "ST4000NM000A", "ZC1", 4_000_787_030_016, true),
        SimDisk::nvme(1, "Samsung SSD 980 PRO 1TB", "S2", 1_000_204_886_016),
        SimDisk::cdrom(0, "QEMU DVD-ROM", 4_700_000_000),
        SimDisk::nvme(0, "Samsung SSD 980 PRO 500GB", "S1", 500_107_862_016),
    ];
    let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
    let client = maintenance(&node);
    let legacy = client.disks().await.unwrap();
    let names: Vec<&str> = legacy.iter().map(|d| d.device_name.as_str()).collect();
    assert_eq!(
        names,
        ["/dev/nvme0n1", "/dev/nvme1n1", "/dev/sdb", "/dev/sr0"]
    );
    use storage::disk::DiskType as T;
    let kinds: Vec<i32> = legacy.iter().map(|d| d.r#type).collect();
    assert_eq!(
        kinds,
        [T::Nvme as i32, T::Nvme as i32, T::Hdd as i32, T::Cd as i32]
    );
    let cosi = client.cosi_disks().await.unwrap();
    let ids: Vec<&str> = cosi.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["nvme0n1", "nvme1n1", "sdb", "sr0"]);
    for (c, l) in cosi.iter().zip(&legacy) {
        assert_eq!(c.spec.dev_path, l.device_name);
        assert_eq!(c.spec.dev_path, format!("/dev/{}", c.id));
        assert!(
            c.spec.symlinks.iter().all(|s| s.starts_with("/dev/disk/")),
            "{:?}",
            c.spec.symlinks
        );
    }
    assert_eq!(cosi[0].spec.transport, "nvme");
    assert!(cosi[2].spec.rotational);
    assert!(cosi[3].spec.cdrom && cosi[3].spec.readonly);
    node.shutdown().await;
}

#[tokio::test]
async fn a_machine_without_smbios_has_no_system_information() {
    let cluster = FakeCluster::new();
    let mut cfg = FakeNodeConfig::new(ip(12), "node-12");
    cfg.smbios = false;
    let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
    let client = maintenance(&node);
    // COSI answers NotFound for the resource; the client reports it as absent.
    let raw = client
        .cosi_get(
            "hardware",
            "SystemInformations.hardware.talos.dev",
            "systeminformation",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&raw, TalosError::Remote { code, .. } if *code == tonic::Code::NotFound),
        "{raw:?}"
    );
    assert_eq!(client.system_information().await.unwrap(), None);
    assert_eq!(client.disks().await.unwrap().len(), 1);
    node.shutdown().await;
}
