//! The Secure Boot decisions of [`super::secureboot`], on resources shaped as DMTF's
//! public-rackmount1 mockup publishes them (`Systems/437XR1138R2/SecureBoot`, its
//! `SecureBootDatabases/db`; the same files ship in the openstack/sushy 5.14.0 wheel's
//! `sushy/tests/unit/json_samples/secure_boot*.json`).

use serde_json::json;

use super::*;
use crate::power::secureboot::{SecureBootProbe, enrol_certificate};

const SB: &str = "/redfish/v1/Systems/437XR1138R2/SecureBoot";

fn rackmount1_secure_boot() -> serde_json::Value {
    json!({
        "@odata.id": SB, "@odata.type": "#SecureBoot.v1_1_0.SecureBoot",
        "Actions": {"#SecureBoot.ResetKeys": {
            "target": format!("{SB}/Actions/SecureBoot.ResetKeys"),
            "ResetKeysType@Redfish.AllowableValues": ["ResetAllKeysToDefault", "DeleteAllKeys", "DeletePK"]}},
        "SecureBootEnable": false, "SecureBootCurrentBoot": "Disabled", "SecureBootMode": "DeployedMode",
        "SecureBootDatabases": {"@odata.id": format!("{SB}/SecureBootDatabases")}
    })
}

#[test]
fn the_secure_boot_resource_reads_as_the_schema_names_it() {
    let sys = json!({"SecureBoot": {"@odata.id": SB}});
    assert_eq!(secure_boot_link(&sys).as_deref(), Some(SB));
    assert_eq!(secure_boot_link(&json!({"Id": "1"})), None);
    let v = secure_boot_view(&rackmount1_secure_boot(), SB);
    assert_eq!(v.enable, Some(false));
    assert_eq!(v.current_boot.as_deref(), Some("Disabled"));
    assert_eq!(v.mode.as_deref(), Some("DeployedMode"));
    assert_eq!(v.databases, Some(format!("{SB}/SecureBootDatabases")));
    let k = v.reset_keys.clone().unwrap();
    assert_eq!(k.target, format!("{SB}/Actions/SecureBoot.ResetKeys"));
    assert_eq!(k.allowed.unwrap().len(), 3);
    assert!(
        v.probe()
            .not_enforcing()
            .unwrap()
            .contains("SecureBootEnable: false")
    );
    // sushy-tools 2.2.0's template: v1_1_0 type, no databases, no action.
    let sushy = json!({"SecureBootEnable": true, "SecureBootCurrentBoot": "Enabled",
                       "SecureBootMode": "DeployedMode", "Actions": {}});
    let v = secure_boot_view(&sushy, "/x/SecureBoot");
    assert_eq!((&v.databases, &v.reset_keys), (&None, &None));
    assert_eq!(v.probe().not_enforcing(), None);
    assert!(matches!(
        v.probe(),
        SecureBootProbe::Redfish {
            enable: Some(true),
            ..
        }
    ));
}

#[test]
fn databases_are_named_by_database_id_exactly() {
    let db = database_view(
        &json!({"Id": "db", "DatabaseId": "db",
                "Certificates": {"@odata.id": format!("{SB}/SecureBootDatabases/db/Certificates/")},
                "Actions": {"#SecureBootDatabase.ResetKeys": {"target": "/t",
                    "ResetKeysType@Redfish.AllowableValues": ["ResetAllKeysToDefault", "DeleteAllKeys"]}}}),
        &format!("{SB}/SecureBootDatabases/db"),
    );
    assert_eq!(db.id, "db");
    assert!(
        db.certificates
            .as_deref()
            .unwrap()
            .ends_with("/db/Certificates/")
    );
    // No DatabaseId or Id: the path's last segment.
    let kek = database_view(&json!({}), &format!("{SB}/SecureBootDatabases/KEK/"));
    assert_eq!((kek.id.as_str(), &kek.certificates), ("KEK", &None));
    let default = database_view(&json!({"DatabaseId": "dbDefault"}), "/d");
    let dbs = vec![default, db.clone(), kek];
    assert_eq!(pick_database(&dbs, "db").unwrap(), &db);
    assert_eq!(
        pick_database(&dbs, "DB"),
        Err(SecureBootRefusal::NoDatabase {
            want: "DB".into(),
            have: vec!["dbDefault".into(), "db".into(), "KEK".into()]
        })
    );
}

#[test]
fn certificates_show_subject_and_both_fingerprints() {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Site UKI signing");
    let key = rcgen::KeyPair::generate().unwrap();
    let pem_text = params.self_signed(&key).unwrap().pem();
    let ours = enrol_certificate(&pem_text).unwrap();
    let c = certificate_view(
        &json!({"CertificateString": pem_text, "CertificateType": "PEM",
                "Subject": {"CommonName": "Site UKI signing", "Organization": "Example"},
                "Fingerprint": "A6:E9", "FingerprintHashAlgorithm": "TPM_ALG_SHA1"}),
        "/c/1",
    );
    assert_eq!(c.subject.as_deref(), Some("CN=Site UKI signing, O=Example"));
    assert_eq!(c.sha256.as_deref(), Some(ours.sha256.as_str()));
    assert_eq!(c.fingerprint, Some(("TPM_ALG_SHA1".into(), "A6:E9".into())));
    let bare = certificate_view(&json!({"Id": "1"}), "/c/2");
    assert_eq!(
        (bare.subject, bare.fingerprint, bare.sha256),
        (None, None, None)
    );
}

#[test]
fn the_post_body_is_what_the_certificate_schema_requires_on_create() {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "x");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = enrol_certificate(&params.self_signed(&key).unwrap().pem()).unwrap();
    let body = enroll_body(&cert);
    assert_eq!(body["CertificateType"], "PEM");
    assert_eq!(body["CertificateString"], cert.pem.as_str());
    assert_eq!(body.as_object().unwrap().len(), 2);
    assert_eq!(enable_patch(), json!({"SecureBootEnable": true}));
}

#[test]
fn a_405_or_501_to_the_post_is_a_read_only_database() {
    let body = r#"{"error":{"code":"Base.1.8.OperationNotAllowed","message":"x",
        "@Message.ExtendedInfo":[{"Message":"The HTTP method is not allowed on this resource."}]}}"#;
    let r = post_refusal("db", "/c", 405, body).unwrap();
    let text = r.to_string();
    assert!(
        text.contains("405")
            && text.contains("read-only")
            && text.contains("not allowed on this resource"),
        "{text}"
    );
    assert!(text.contains("docs/operations.md"), "{text}");
    assert!(post_refusal("db", "/c", 501, "").is_some());
    assert_eq!(post_refusal("db", "/c", 400, body), None);
    assert_eq!(post_refusal("db", "/c", 500, ""), None);
}

#[test]
fn reset_keys_takes_only_listed_values() {
    let a = KeysAction {
        target: "/t".into(),
        allowed: Some(vec!["ResetAllKeysToDefault".into(), "DeleteAllKeys".into()]),
    };
    assert_eq!(
        reset_keys_body(&a, "DeleteAllKeys").unwrap(),
        json!({"ResetKeysType": "DeleteAllKeys"})
    );
    assert!(matches!(
        reset_keys_body(&a, "DeletePK"),
        Err(SecureBootRefusal::ResetKeysType { .. })
    ));
    let open = KeysAction {
        target: "/t".into(),
        allowed: None,
    };
    assert!(reset_keys_body(&open, "DeletePK").is_ok());
}
