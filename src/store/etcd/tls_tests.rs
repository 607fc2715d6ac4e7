//! The etcd store over TLS against a real etcd member that requires client certificates
//! (`--client-cert-auth`), with certificates the `openssl` CLI made: the right files open
//! it; a wrong CA, no client certificate, or one from another CA are refused with an error
//! that names the endpoint and the flag to fix.

use super::EtcdStore;
use super::testing::EtcdServer;
use crate::store::Store;

#[test]
fn the_right_ca_and_client_certificate_open_the_store() {
    let Some(server) = EtcdServer::start_tls() else {
        return;
    };
    let store = EtcdStore::open(&server.config("tls")).expect("open over TLS");
    assert_eq!(store.nodes().unwrap(), vec![]);
    assert!(server.url().starts_with("https://127.0.0.1:"));
}

#[test]
fn a_wrong_ca_or_a_missing_or_foreign_client_certificate_is_refused_clearly() {
    let Some(server) = EtcdServer::start_tls() else {
        return;
    };
    let tls = server.tls().expect("a TLS member").clone();
    let mut wrong_ca = server.config("tls");
    wrong_ca.cacert = Some(tls.other_ca.clone());
    let mut no_client = server.config("tls");
    no_client.cert = None;
    no_client.key = None;
    let mut stranger = server.config("tls");
    stranger.cert = Some(tls.stranger_cert.clone());
    stranger.key = Some(tls.stranger_key.clone());
    let mut plain = server.config("tls");
    plain.endpoints = vec![server.url().replace("https://", "http://")];
    let cases = [
        ("wrong CA", wrong_ca, "--etcd-cacert"),
        ("no client cert", no_client, "--etcd-cert and --etcd-key"),
        (
            "foreign client cert",
            stranger,
            "--etcd-cert and --etcd-key",
        ),
    ];
    for (case, cfg, flag) in cases {
        let e = EtcdStore::open(&cfg).expect_err(case).to_string();
        assert!(e.contains(&server.url()), "{case}: {e}");
        assert!(e.contains(flag), "{case}: {e}");
    }
    // Plain HTTP/2 to a TLS port: the server answers garbage, the open fails (no hang).
    assert!(EtcdStore::open(&plain).is_err());
}

#[test]
fn nothing_listening_names_the_store_flag() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let cfg = super::EtcdConfig::new(vec![format!("http://{port}")], "x");
    let e = EtcdStore::open(&cfg)
        .expect_err("nothing listens")
        .to_string();
    assert!(e.contains(&format!("http://{port}")), "{e}");
    assert!(e.contains("--store endpoints"), "{e}");
}
