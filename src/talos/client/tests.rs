//! The client's pure parts: line buffering, the node header, reply checks, redaction.

use prost::Message;

use super::call::*;
use super::stream::*;
use super::*;
use crate::talos::api::common;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::google::rpc;
use crate::talos::api::machine::ApplyConfigurationRequest;
use crate::talos::api::talos::resource::definitions::hardware;
use crate::talos::error::{CallContext, Rpc};

#[test]
fn installer_output_chunks_become_lines() {
    let mut got = Vec::new();
    let mut out = |l: &str| got.push(l.to_owned());
    let mut b = LineBuffer::default();
    // 512-byte chunks cut mid-line, several lines in one, CRLF, and a last line without
    // its newline.
    b.push("installing to /dev/s", &mut out);
    b.push("da\nwriting EFI\r\nwriting ", &mut out);
    b.push("STATE\n\ndone", &mut out);
    b.finish(&mut out);
    assert_eq!(
        got,
        [
            "installing to /dev/sda",
            "writing EFI",
            "writing STATE",
            "",
            "done"
        ]
    );
}

fn ctx() -> CallContext {
    CallContext {
        target: Target {
            endpoint: "10.0.0.5:50000".parse().unwrap(),
            node: None,
        },
        rpc: Rpc::Bootstrap,
        maintenance: false,
        deadline: Duration::from_secs(1),
    }
}

#[test]
fn node_header_values() {
    assert!(validate_node("10.0.0.7").is_ok());
    assert!(validate_node("fd00::7").is_ok());
    assert!(validate_node("worker-1").is_ok());
    for bad in [
        "",
        "10.0.0.7:50000",
        "[fd00::7]:50000",
        "a,b",
        "a b",
        "host:50000",
    ] {
        assert!(
            matches!(validate_node(bad), Err(TalosError::InvalidNode { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn metadata_error_inside_an_ok_reply_is_an_error() {
    let meta = common::Metadata {
        hostname: "10.0.0.7".into(),
        error: "etcd data directory is not empty".into(),
        status: Some(rpc::Status {
            code: tonic::Code::AlreadyExists as i32,
            message: "etcd data directory is not empty".into(),
            details: vec![],
        }),
    };
    let err = entry_error(Some(&meta), &ctx()).unwrap();
    match err {
        TalosError::AlreadyBootstrapped { target, .. } => {
            assert_eq!(target.node.as_deref(), Some("10.0.0.7"));
        }
        other => panic!("{other:?}"),
    }
    assert!(entry_error(Some(&common::Metadata::default()), &ctx()).is_none());
    assert!(entry_error(None, &ctx()).is_none());
}

#[test]
fn metadata_error_without_status_is_unknown_remote() {
    let meta = common::Metadata {
        hostname: String::new(),
        error: "boom".into(),
        status: None,
    };
    assert!(matches!(
        entry_error(Some(&meta), &ctx()),
        Some(TalosError::Remote {
            code: tonic::Code::Unknown,
            ..
        })
    ));
}

#[test]
fn single_entry_is_required() {
    assert_eq!(single(vec![1], &ctx()).unwrap(), 1);
    assert!(matches!(
        single(Vec::<u8>::new(), &ctx()),
        Err(TalosError::Malformed { .. })
    ));
    assert!(matches!(
        single(vec![1, 2], &ctx()),
        Err(TalosError::Malformed { .. })
    ));
}

#[test]
fn creds_debug_redacts_the_key() {
    let creds = ClientCreds {
        ca_pem: b"ca".to_vec(),
        crt_pem: b"crt".to_vec(),
        key_pem: b"super-secret-key".to_vec(),
    };
    let dbg = format!("{creds:?}");
    assert!(!dbg.contains("super-secret"), "{dbg}");
    assert!(dbg.contains("redacted"), "{dbg}");
}

#[test]
fn apply_request_mode_is_auto_on_the_wire() {
    // The zero value (REBOOT) is omitted on the wire; AUTO must be encoded as field 4 = 1.
    let req = ApplyConfigurationRequest {
        data: b"x".to_vec(),
        mode: apply_configuration_request::Mode::Auto as i32,
        dry_run: false,
        try_mode_timeout: None,
    };
    let bytes = req.encode_to_vec();
    // field 1 (bytes, len 1, "x"), then field 4 varint 1.
    assert_eq!(bytes, vec![0x0a, 0x01, b'x', 0x20, 0x01]);
}

#[test]
fn cosi_spec_decodes_from_proto_spec() {
    let spec = hardware::SystemInformationSpec {
        uuid: "4c4c4544-0033".into(),
        manufacturer: "Dell".into(),
        ..Default::default()
    };
    let res = cosi::Resource {
        metadata: None,
        spec: Some(cosi::Spec {
            proto_spec: spec.encode_to_vec(),
            yaml_spec: String::new(),
        }),
    };
    let mut c = ctx();
    c.rpc = Rpc::CosiGet;
    let back: hardware::SystemInformationSpec = decode_spec(&res, &c).unwrap();
    assert_eq!(back, spec);
    let empty = cosi::Resource::default();
    assert!(matches!(
        decode_spec::<hardware::SystemInformationSpec>(&empty, &c),
        Err(TalosError::Malformed { .. })
    ));
}
