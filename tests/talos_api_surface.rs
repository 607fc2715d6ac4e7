//! The Talos API surface of the fake node (src/sim/talos.rs) against what Talos v1.13.9
//! answers, as read in siderolabs/talos at that tag (docs/conformance.md, section "Talos:
//! API surface, roles and relay (double)"): maintenance-mode answers, the config loader's and
//! validator's wording, apid's director (`node`, `nodes`, `proxyfrom`, `talos-role`), the
//! control-plane-only calls, the Kubeconfig stream, Version and ServiceList. Some checks use
//! a raw gRPC channel, because talboot's client never sends what they send. Every node
//! listens on its own 127.0.143.x address, port 50000.

use std::net::{IpAddr, SocketAddr};

use base64::Engine as _;
use rcgen::ExtendedKeyUsagePurpose;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use talboot::sim::pki::{SimCa, talos_label};
use talboot::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase};
use talboot::talos::api::cosi::resource as cosi;
use talboot::talos::api::machine::{self, machine_service_client::MachineServiceClient};
use talboot::talos::retry::RetryPolicy;
use talboot::talos::{ClientCreds, TalosClient, TalosError};

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 143, last])
}

fn maintenance(node: &FakeTalosNode) -> TalosClient {
    TalosClient::maintenance(node.addr())
        .unwrap()
        .with_retry(RetryPolicy::NONE)
}

fn admin_creds(ca: &SimCa) -> ClientCreds {
    let admin = ca.admin().unwrap();
    ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: admin.cert_pem.into_bytes(),
        key_pem: talos_label(&admin.key_pem).into_bytes(),
    }
}

fn secured(addr: SocketAddr, ca: &SimCa) -> TalosClient {
    TalosClient::secured(addr, &admin_creds(ca))
        .unwrap()
        .with_retry(RetryPolicy::NONE)
}

/// A raw mTLS channel with a client certificate carrying `roles`.
async fn raw(addr: SocketAddr, ca: &SimCa, roles: &[&str]) -> Channel {
    let ck = ca
        .client(roles, vec![ExtendedKeyUsagePurpose::ClientAuth])
        .unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.cert_pem))
        .identity(Identity::from_pem(&ck.cert_pem, &ck.key_pem));
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Opens TLS to `addr` (any server certificate, no client certificate), offering ALPN h2 or
/// nothing, and returns how many bytes the server sends first (0: it hung up).
async fn first_bytes(addr: SocketAddr, alpn: bool) -> usize {
    use tokio::io::AsyncReadExt;
    let mut cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        talboot::talos::tls::ring_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(talboot::talos::tls::MaintenanceVerifier::new())
    .with_no_client_auth();
    if alpn {
        cfg.alpn_protocols = vec![b"h2".to_vec()];
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    tokio::time::timeout(std::time::Duration::from_secs(5), tls.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0)
}

/// A request with extra metadata (each pair appended, so a key may repeat).
fn with_meta<T>(msg: T, meta: &[(&'static str, &str)]) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    for (k, v) in meta {
        req.metadata_mut()
            .append(*k, MetadataValue::try_from(*v).unwrap());
    }
    req
}

/// A v1alpha1 machine config plus a HostnameConfig document (as in tests/talos_api.rs).
fn machine_config(machine_type: &str, ca: &SimCa, endpoint_ip: IpAddr, with_key: bool) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let key = if with_key {
        b64(&ca.key_pem_talos_label())
    } else {
        String::new()
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

/// The InvalidArgument message of a refused apply.
async fn refused(client: &TalosClient, config: &str) -> String {
    match client.apply_configuration(config.as_bytes()).await {
        Err(TalosError::Remote {
            code: tonic::Code::InvalidArgument,
            message,
            ..
        }) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// One v1alpha1 validation error as Talos words it (go-multierror, nested by
/// container.Validate), after talboot's client folded it onto one line.
fn validation(errors: &[&str]) -> String {
    let inner = if let [one] = errors {
        format!("1 error occurred: * {one}")
    } else {
        let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
        format!("{} errors occurred: {}", errors.len(), points.join(" "))
    };
    format!("1 error occurred: * v1alpha1.Config: {inner}")
}

#[tokio::test]
async fn maintenance_answers_as_talos_does() {
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(ip(10), "node-10"), &cluster)
        .await
        .unwrap();
    let client = maintenance(&node);

    // Version: no `features` before a machine config is loaded.
    let version = client.version().await.unwrap();
    assert_eq!(version.features, None);
    assert_eq!(version.version.unwrap().sha.len(), 8);

    // ServiceList: the sequencer's early services, sorted, health always present.
    let services = client.service_list().await.unwrap();
    let ids: Vec<&str> = services.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "apid",
            "auditd",
            "containerd",
            "dashboard",
            "machined",
            "syslogd",
            "udevd"
        ]
    );
    assert!(services.iter().all(|s| s.health.is_some()), "{services:?}");

    // grpc-go hangs up on a client that negotiated no ALPN; with h2 the server speaks first
    // (its SETTINGS frame).
    assert_eq!(first_bytes(node.addr(), false).await, 0);
    assert!(first_bytes(node.addr(), true).await > 0);

    // Documents without the v1alpha1 one are accepted in maintenance; the node waits on.
    let outcome = client
        .apply_configuration(b"apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n")
        .await
        .unwrap();
    assert_eq!(
        outcome.mode_details,
        "Applied configuration without a reboot"
    );
    assert_eq!(node.phase(), Phase::Maintenance);

    // EtcdMemberList is a reader call, so it reaches the handler, which has no machine type.
    let err = client.etcd_member_list().await.unwrap_err();
    assert!(
        matches!(&err, TalosError::Unimplemented { message, .. }
            if message == "machine type is not set, cannot use member list API"),
        "{err:?}"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn apply_refusals_carry_the_loader_and_validator_wording() {
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(FakeNodeConfig::new(ip(20), "node-20"), &cluster)
        .await
        .unwrap();
    let client = maintenance(&node);
    let ca = SimCa::new_os_ca().unwrap();
    let cp = machine_config("controlplane", &ca, ip(20), true);

    // configloader: documents, kinds, duplicates, unknown top-level keys.
    assert_eq!(
        refused(&client, "hello: world\n").await,
        "error decoding document /v1alpha1/ (line 1): missing kind"
    );
    // `version: v1alpha1` alone does not make a v1alpha1 document; its top-level keys do.
    assert_eq!(
        refused(&client, "version: v1alpha1\n").await,
        "error decoding document /v1alpha1/ (line 1): missing kind"
    );
    assert_eq!(refused(&client, "").await, "config not found");
    assert_eq!(refused(&client, "---\n").await, "config not found");
    assert_eq!(
        refused(&client, "apiVersion: v1alpha1\nkind: FooConfig\n").await,
        "error decoding document v1alpha1/FooConfig/ (line 1): \"FooConfig\" \"v1alpha1\": not \
         registered"
    );
    let twice = format!("{cp}---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n");
    let msg = refused(&client, &twice).await;
    assert!(
        msg.starts_with("duplicate document v1alpha1/HostnameConfig/ is not allowed (line"),
        "{msg}"
    );
    let msg = refused(&client, &cp.replacen("debug: false\n", "extras: {}\n", 1)).await;
    assert!(
        msg.contains("field extras not found in type v1alpha1.Config"),
        "{msg}"
    );

    // Validate: the rules and their order.
    assert_eq!(
        refused(&client, &machine_config("worker", &ca, ip(20), true)).await,
        validation(&[
            "issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)"
        ])
    );
    assert_eq!(
        refused(&client, &cp.replace("disk: /dev/sda", "wipe: false")).await,
        validation(&["either install disk or diskSelector should be defined"])
    );
    let keyless = machine_config("controlplane", &ca, ip(20), false);
    assert_eq!(
        refused(&client, &keyless.replace("disk: /dev/sda", "wipe: false")).await,
        validation(&[
            "either install disk or diskSelector should be defined",
            "issuing CA key is required for controlplane nodes (.machine.ca.key)",
        ])
    );
    assert_eq!(
        refused(&client, &cp.replace("persist: true", "persist: false")).await,
        validation(&[".persist should be enabled"])
    );
    assert_eq!(
        refused(&client, &cp.replace(":6443", ":99999")).await,
        validation(&["invalid controlplane endpoint: port number must be between 1 and 65535"])
    );
    assert_eq!(node.last_applied_config(), None);
    assert_eq!(node.phase(), Phase::Maintenance);

    // What Talos accepts: no machine.type is a worker; the endpoint's scheme is not checked.
    let worker = machine_config("worker", &ca, ip(20), false)
        .replace("  type: worker\n", "")
        .replace("https://", "http://");
    client.apply_configuration(worker.as_bytes()).await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn the_director_relays_as_apid_does() {
    let cluster = FakeCluster::new();
    let cp = FakeTalosNode::start(FakeNodeConfig::new(ip(30), "cp-30"), &cluster)
        .await
        .unwrap();
    let worker = FakeTalosNode::start(FakeNodeConfig::new(ip(31), "worker-31"), &cluster)
        .await
        .unwrap();
    let ca = SimCa::new_os_ca().unwrap();
    maintenance(&cp)
        .apply_configuration(machine_config("controlplane", &ca, ip(30), true).as_bytes())
        .await
        .unwrap();
    cp.wait_phase(Phase::Secured).await.unwrap();
    maintenance(&worker)
        .apply_configuration(machine_config("worker", &ca, ip(30), false).as_bytes())
        .await
        .unwrap();
    worker.wait_phase(Phase::Secured).await.unwrap();

    // A control plane relays even a `node` naming itself, over the network.
    let to_self = secured(cp.addr(), &ca).with_node("127.0.143.30").unwrap();
    assert!(to_self.version().await.unwrap().features.is_some());
    let last = cp.served().last().cloned().unwrap();
    assert!(last.relayed, "{last:?}");
    assert_eq!(last.roles, ["os:admin"]);

    // A worker's apid has no client certificate: it serves `node` naming itself locally and
    // refuses to forward anywhere else.
    let via_worker = secured(worker.addr(), &ca);
    via_worker
        .with_node("127.0.143.31")
        .unwrap()
        .version()
        .await
        .unwrap();
    via_worker
        .with_node("worker-31")
        .unwrap()
        .version()
        .await
        .unwrap();
    assert!(!worker.served().last().unwrap().relayed);
    let err = via_worker
        .with_node("127.0.143.30")
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert!(matches!(err, TalosError::NoForwarding { .. }), "{err:?}");

    // What talboot's client never sends, on a raw channel to the control plane.
    let mut machine_api = MachineServiceClient::new(raw(cp.addr(), &ca, &["os:admin"]).await);
    let st = machine_api
        .version(with_meta((), &[("node", "127.0.143.31:50000")]))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::Internal, "{st:?}");
    assert_eq!(st.message(), "invalid target \"127.0.143.31:50000\"");
    let st = machine_api
        .version(with_meta(
            (),
            &[("node", "127.0.143.31"), ("node", "127.0.143.30")],
        ))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument, "{st:?}");
    assert_eq!(st.message(), "node metadata must be single-valued");
    let mut state_api =
        cosi::state_client::StateClient::new(raw(cp.addr(), &ca, &["os:admin"]).await);
    let st = state_api
        .get(with_meta(
            cosi::GetRequest::default(),
            &[("nodes", "127.0.143.31")],
        ))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument, "{st:?}");
    assert_eq!(
        st.message(),
        "one-2-many proxying is not supported for method /cosi.resource.State/Get"
    );

    // `talos-role` counts only from an os:impersonator certificate.
    let mut reader = MachineServiceClient::new(raw(cp.addr(), &ca, &["os:reader"]).await);
    let st = reader
        .kubeconfig(with_meta((), &[("talos-role", "os:admin")]))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::PermissionDenied, "{st:?}");
    let mut imp = MachineServiceClient::new(raw(cp.addr(), &ca, &["os:impersonator"]).await);
    let st = imp
        .kubeconfig(with_meta((), &[("talos-role", "os:reader")]))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::PermissionDenied, "{st:?}");
    imp.version(with_meta((), &[("talos-role", " os:reader ")]))
        .await
        .unwrap();
    assert_eq!(cp.served().last().unwrap().roles, ["os:reader"]);

    // Kubeconfig: the whole archive in one message.
    let mut stream = machine_api.kubeconfig(()).await.unwrap().into_inner();
    let mut messages = 0;
    while stream.message().await.unwrap().is_some() {
        messages += 1;
    }
    assert_eq!(messages, 1);
    // ... and the kubeconfig names the Kubernetes CA (cluster.ca), not the OS CA.
    let kubeconfig =
        String::from_utf8(secured(cp.addr(), &ca).kubeconfig().await.unwrap()).unwrap();
    let ca_data = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(ca_data)
            .unwrap(),
        k8s_ca().cert_pem.as_bytes()
    );

    // Control-plane-only calls on a worker; services by machine type.
    let on_worker = secured(worker.addr(), &ca);
    let err = on_worker.etcd_member_list().await.unwrap_err();
    assert!(
        matches!(&err, TalosError::Unimplemented { message, .. }
            if message == "member list is only available on control plane nodes"),
        "{err:?}"
    );
    let ids = |s: Vec<machine::ServiceInfo>| s.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(on_worker.service_list().await.unwrap()),
        [
            "apid",
            "auditd",
            "containerd",
            "cri",
            "dashboard",
            "kubelet",
            "machined",
            "syslogd",
            "udevd"
        ]
    );
    let admin = secured(cp.addr(), &ca);
    let etcd = admin
        .service_list()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.id == "etcd")
        .unwrap();
    assert_eq!(etcd.state, "Preparing");
    assert!(etcd.health.unwrap().unknown);

    // EtcdMemberList after bootstrap: members and their names as legacy members.
    admin.bootstrap().await.unwrap();
    // etcd serves (and has a leader) a moment after Bootstrap answered.
    let mut reply = None;
    for _ in 0..500 {
        if let Ok(r) = machine_api
            .etcd_member_list(machine::EtcdMemberListRequest { query_local: false })
            .await
        {
            reply = Some(r.into_inner());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let reply = reply.expect("etcd never had a leader");
    assert_eq!(reply.messages[0].legacy_members, ["cp-30"]);

    // A configured node refuses a config without the v1alpha1 document.
    let msg = refused(
        &admin,
        "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n",
    )
    .await;
    assert_eq!(
        msg,
        "the applied machine configuration doesn't contain v1alpha1 config, did you mean to \
         patch the machine config instead?"
    );

    worker.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test]
async fn trustd_signs_only_for_a_worker_with_the_control_planes_token() {
    let cluster = FakeCluster::new();
    let cp = FakeTalosNode::start(FakeNodeConfig::new(ip(40), "cp-40"), &cluster)
        .await
        .unwrap();
    let worker = FakeTalosNode::start(FakeNodeConfig::new(ip(41), "worker-41"), &cluster)
        .await
        .unwrap();
    let ca = SimCa::new_os_ca().unwrap();
    maintenance(&cp)
        .apply_configuration(machine_config("controlplane", &ca, ip(40), true).as_bytes())
        .await
        .unwrap();
    cp.wait_phase(Phase::Secured).await.unwrap();
    // Same OS CA, another machine.token (the first `token:` is machine.token).
    let stranger = machine_config("worker", &ca, ip(40), false).replacen(
        "token: abcdef.0123456789abcdef",
        "token: zzzzzz.zzzzzzzzzzzzzzzz",
        1,
    );
    maintenance(&worker)
        .apply_configuration(stranger.as_bytes())
        .await
        .unwrap();
    // trustd refuses the CSR, so apid never gets a certificate (the double retries every
    // 250 ms).
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert_eq!(worker.phase(), Phase::Booting);
    worker.shutdown().await;
    cp.shutdown().await;
}
