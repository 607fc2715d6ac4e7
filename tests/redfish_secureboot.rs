//! Issue 27 item 4: Secure Boot key enrolment over Redfish, against two independent peers.
//!
//! - DMTF's `public-rackmount1` mockup (`Systems/437XR1138R2/SecureBoot`, its
//!   `SecureBootDatabases` and the `db` database; DSP2043, as the openstack/sushy 5.14.0
//!   wheel ships them in `sushy/tests/unit/json_samples/secure_boot.json`,
//!   `secure_boot_database_collection.json`, `secure_boot_database.json`, and its DMTF
//!   `certificate.json`/`certificate_collection.json`), served read-only by sushy-tools'
//!   `sushy-static` behind the vendor-like front (tests/support/redfish_front.rs). The mockup
//!   has only the `db` database file: the seven others its collection lists (`PK`, `KEK`,
//!   `dbx`, the `*Default`s) are written here from it with their names substituted, and each
//!   database's `Certificates` collection from the sample collection's shape (empty, `PEM`
//!   supported; `KEK` holds the sample certificate). A mockup server cannot store a POST, so
//!   the certificate POST, the enable PATCH, `ResetKeys` and the 405/501 refusals are the
//!   front's (its module comment cites each rule).
//! - OpenStack's `sushy-emulator` 2.2.0 with its fake driver: a real Redfish service whose
//!   `SecureBoot` (`sushy_tools/emulator/main.py` `secure_boot`, template
//!   `templates/secure_boot.json`) reads `SecureBootEnable`/`SecureBootCurrentBoot` from the
//!   driver and takes a PATCH of `SecureBootEnable`, with `SecureBootMode` always
//!   `DeployedMode`, no `SecureBootDatabases` and no `ResetKeys`: so enable is proven there
//!   and enrolment is refused there (no databases), as on a real BMC of that shape; the
//!   `minimum` feature set has no SecureBoot at all (404). Its libvirt driver, on libvirt's
//!   in-process `test:///default` driver, takes the enable into the domain's `<loader
//!   secure='yes'>` and reads it back from there.
//!
//! Needs scripts/test-deps (TALBOOT_SKIP_SUSHY=1 skips).

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use support::redfish_front::{Front, FrontOptions, put, sample};
use support::sushy::{Sushy, SushyOptions};
use talboot::inventory::Credential;
use talboot::power::redfish::{Redfish, RedfishConfig, SecureBootError, SecureBootRefusal};
use talboot::power::secureboot::{EnrolCertificate, SecureBootProbe, enrol_certificate};

const SYSTEM: &str = "/redfish/v1/Systems/437XR1138R2";
const SB: &str = "/redfish/v1/Systems/437XR1138R2/SecureBoot";
const DATABASES: [&str; 8] = [
    "PK",
    "KEK",
    "db",
    "dbx",
    "PKDefault",
    "KEKDefault",
    "dbDefault",
    "dbxDefault",
];

/// public-rackmount1 with its Secure Boot resources (see the module comment).
fn rackmount1(tree: &Path) {
    put(tree, "/redfish/v1", &sample("unit/json_samples/root.json"));
    put(
        tree,
        "/redfish/v1/Systems",
        &sample("unit/json_samples/system_collection.json"),
    );
    put(tree, SYSTEM, &sample("unit/json_samples/system.json"));
    put(tree, SB, &sample("unit/json_samples/secure_boot.json"));
    put(
        tree,
        &format!("{SB}/SecureBootDatabases"),
        &sample("unit/json_samples/secure_boot_database_collection.json"),
    );
    let db_text =
        serde_json::to_string(&sample("unit/json_samples/secure_boot_database.json")).unwrap();
    let coll = sample("unit/json_samples/certificate_collection.json");
    for id in DATABASES {
        let mut db: Value = serde_json::from_str(&db_text.replace(
            "SecureBootDatabases/db",
            &format!("SecureBootDatabases/{id}"),
        ))
        .unwrap();
        db["Id"] = json!(id);
        db["DatabaseId"] = json!(id);
        let base = format!("{SB}/SecureBootDatabases/{id}");
        put(tree, &base, &db);
        let mut c = coll.clone();
        c["@odata.id"] = json!(format!("{base}/Certificates"));
        c["Members"] = json!([]);
        c["Members@odata.count"] = json!(0);
        if id == "KEK" {
            let mut cert = sample("unit/json_samples/certificate.json");
            let uri = format!("{base}/Certificates/1");
            cert["@odata.id"] = json!(uri);
            put(tree, &uri, &cert);
            c["Members"] = json!([{"@odata.id": uri}]);
            c["Members@odata.count"] = json!(1);
        }
        put(tree, &format!("{base}/Certificates"), &c);
    }
}

/// The Dell iDRAC capture: its system links a SecureBoot resource the tree does not have.
fn idrac_without_secure_boot(tree: &Path) {
    let sys = "/redfish/v1/Systems/System.Embedded.1";
    put(
        tree,
        "/redfish/v1",
        &sample("oem/dell/unit/json_samples/root.json"),
    );
    put(
        tree,
        "/redfish/v1/Systems",
        &json!({"@odata.id": "/redfish/v1/Systems", "Members@odata.count": 1,
                "Members": [{"@odata.id": sys}]}),
    );
    put(tree, sys, &sample("oem/dell/unit/json_samples/system.json"));
}

struct Rig {
    dir: tempfile::TempDir,
    front: Front,
    opts: FrontOptions,
}

async fn rig(name: &str, build: impl FnOnce(&Path), opts: FrontOptions) -> Option<Rig> {
    if !support::redfish_front::available() {
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix(&format!("tb-rfsb-{name}-"))
        .tempdir()
        .unwrap();
    let tree = dir.path().join("tree");
    build(&tree);
    let front = Front::start(&tree, &dir.path().join("static.log"), opts.clone()).await;
    Some(Rig { dir, front, opts })
}

impl Rig {
    fn client(&self) -> Redfish {
        Redfish::new(RedfishConfig::new(
            &self.front.endpoint,
            &self.opts.user,
            Credential::new(self.opts.password.clone()),
        ))
        .unwrap()
    }

    fn requests(&self, method: &str) -> Vec<support::redfish_front::Seen> {
        self.front.state(|s| {
            s.seen
                .iter()
                .filter(|r| r.method == method)
                .cloned()
                .collect()
        })
    }
}

fn test_cert(cn: &str) -> (String, EnrolCertificate) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    let c = enrol_certificate(&pem).unwrap();
    (pem, c)
}

#[tokio::test]
async fn status_reads_rackmount1_secure_boot_its_databases_and_certificates() {
    let Some(r) = rig("status", rackmount1, FrontOptions::new(SYSTEM)).await else {
        return;
    };
    let s = r.client().secure_boot_status().await.unwrap();
    assert_eq!(s.view.path, SB);
    assert_eq!(
        s.view.probe(),
        SecureBootProbe::Redfish {
            enable: Some(false),
            current_boot: Some("Disabled".into()),
            mode: Some("DeployedMode".into())
        }
    );
    assert_eq!(
        s.view
            .reset_keys
            .as_ref()
            .unwrap()
            .allowed
            .as_deref()
            .unwrap(),
        ["ResetAllKeysToDefault", "DeleteAllKeys", "DeletePK"]
    );
    let ids: Vec<&str> = s.databases.iter().map(|d| d.view.id.as_str()).collect();
    assert_eq!(ids, DATABASES);
    let kek = s.databases.iter().find(|d| d.view.id == "KEK").unwrap();
    let certs = kek.certificates.as_ref().unwrap();
    assert_eq!(certs.len(), 1);
    assert!(
        certs[0]
            .subject
            .as_deref()
            .unwrap()
            .starts_with("CN=manager.contoso.org"),
        "{certs:?}"
    );
    // The BMC's own fingerprint as given, and the SHA-256 computed from the returned PEM.
    let pem_text = sample("unit/json_samples/certificate.json")["CertificateString"]
        .as_str()
        .unwrap()
        .to_string();
    let ours =
        talboot::power::secureboot::sha256_fingerprint(pem::parse(&pem_text).unwrap().contents());
    assert_eq!(certs[0].sha256.as_deref(), Some(ours.as_str()));
    assert_eq!(
        certs[0].fingerprint.as_ref().map(|(a, _)| a.as_str()),
        Some("TPM_ALG_SHA1")
    );
    let db = s.databases.iter().find(|d| d.view.id == "db").unwrap();
    assert!(db.certificates.as_ref().unwrap().is_empty());
}

#[tokio::test]
async fn enroll_posts_the_pem_into_db_reads_it_back_and_enables_with_if_match() {
    let Some(r) = rig("enroll", rackmount1, FrontOptions::new(SYSTEM)).await else {
        return;
    };
    let (_, cert) = test_cert("talboot site UKI signing");
    let done = r.client().enroll("db", &cert, true).await.unwrap();
    let coll = format!("{SB}/SecureBootDatabases/db/Certificates");
    assert_eq!(
        done.location.as_deref(),
        Some(format!("{coll}/100").as_str())
    );
    assert_eq!(done.database, "db");
    assert_eq!(
        done.stored.as_ref().and_then(|c| c.sha256.as_deref()),
        Some(cert.sha256.as_str())
    );
    assert!(done.enabled);
    // What went on the wire: the two properties the Certificate schema requires on create.
    let posts = r.requests("POST");
    let post = posts
        .iter()
        .find(|p| p.path.contains("Certificates"))
        .unwrap();
    assert_eq!(
        post.body.as_ref().unwrap(),
        &json!({"CertificateString": cert.pem, "CertificateType": "PEM"})
    );
    assert_eq!(post.status, 201);
    // What the peer stored.
    r.front.state(|s| {
        let stored = &s.certs[&coll];
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0]["CertificateString"], cert.pem.as_str());
        assert_eq!(s.sb_enable, Some(true));
    });
    // The enable PATCH carried the SecureBoot resource's (weak) ETag.
    let patches = r.requests("PATCH");
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0].path, SB);
    assert_eq!(patches[0].if_match.as_deref(), Some("W/\"sb0\""));
    assert_eq!(patches[0].body, Some(json!({"SecureBootEnable": true})));
    // Read back through status: enabled, and db lists the certificate.
    let s = r.client().secure_boot_status().await.unwrap();
    assert_eq!(s.view.enable, Some(true));
    let db = s.databases.iter().find(|d| d.view.id == "db").unwrap();
    let certs = db.certificates.as_ref().unwrap();
    assert_eq!(certs.len(), 1);
    assert_eq!(certs[0].sha256.as_deref(), Some(cert.sha256.as_str()));
}

#[tokio::test]
async fn a_read_only_certificates_collection_is_refused_naming_the_fix() {
    for status in [405u16, 501] {
        let mut opts = FrontOptions::new(SYSTEM);
        opts.cert_post_status = status;
        let Some(r) = rig("ro", rackmount1, opts).await else {
            return;
        };
        let (_, cert) = test_cert("x");
        let e = r.client().enroll("db", &cert, true).await.unwrap_err();
        assert!(
            matches!(
                &e,
                SecureBootError::Refused {
                    refusal: SecureBootRefusal::ReadOnly { status: s, .. },
                    ..
                } if *s == status
            ),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("read-only")
                && text.contains(&status.to_string())
                && text.contains("docs/operations.md"),
            "{text}"
        );
        // Nothing enabled after a refused enrolment.
        assert!(r.requests("PATCH").is_empty());
        r.front.state(|s| assert!(s.certs.is_empty()));
    }
}

#[tokio::test]
async fn a_database_the_bmc_lacks_is_refused_before_any_post() {
    let Some(r) = rig("nodb", rackmount1, FrontOptions::new(SYSTEM)).await else {
        return;
    };
    let (_, cert) = test_cert("x");
    let e = r.client().enroll("DB", &cert, false).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("\"DB\"") && text.contains("--database"),
        "{text}"
    );
    assert!(
        r.requests("POST")
            .iter()
            .all(|p| !p.path.contains("Certificates"))
    );
}

#[tokio::test]
async fn a_system_whose_secure_boot_resource_is_missing_is_refused() {
    let Some(r) = rig(
        "nosb",
        idrac_without_secure_boot,
        FrontOptions::new("/redfish/v1/Systems/System.Embedded.1"),
    )
    .await
    else {
        return;
    };
    let (_, cert) = test_cert("x");
    let e = r.client().enroll("db", &cert, true).await.unwrap_err();
    assert!(
        matches!(
            &e,
            SecureBootError::Refused {
                refusal: SecureBootRefusal::NoSecureBoot { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("firmware setup UI"), "{e}");
    // The probe says unknown rather than failing.
    let p = r.client().secure_boot_probe().await.unwrap();
    assert!(matches!(p, SecureBootProbe::Unknown(_)), "{p:?}");
}

#[tokio::test]
async fn reset_keys_puts_the_firmware_in_setup_mode_and_takes_only_listed_types() {
    let Some(r) = rig("reset", rackmount1, FrontOptions::new(SYSTEM)).await else {
        return;
    };
    let rf = r.client();
    rf.reset_keys("DeleteAllKeys").await.unwrap();
    let posts = r.requests("POST");
    let post = posts
        .iter()
        .find(|p| p.path.ends_with("SecureBoot.ResetKeys"))
        .unwrap();
    assert_eq!(post.path, format!("{SB}/Actions/SecureBoot.ResetKeys"));
    assert_eq!(post.body, Some(json!({"ResetKeysType": "DeleteAllKeys"})));
    assert_eq!(post.status, 204);
    let v = rf.secure_boot().await.unwrap();
    assert_eq!(v.mode.as_deref(), Some("SetupMode"));
    // (The mockup's SecureBootEnable is false, which is named first; the CLI test below
    // shows the SetupMode flag on an enabled system.)
    assert!(v.probe().not_enforcing().is_some());
    // Not in the action's list: refused here, nothing sent.
    let before = r.requests("POST").len();
    let e = rf.reset_keys("DeleteKEK").await.unwrap_err();
    assert!(
        matches!(
            &e,
            SecureBootError::Refused {
                refusal: SecureBootRefusal::ResetKeysType { .. },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(r.requests("POST").len(), before);
}

// ---- sushy-emulator (fake driver) ----

fn sushy_systems(secure_boot: bool) -> String {
    format!(
        "SUSHY_EMULATOR_FAKE_SYSTEMS = [{{'uuid': '9c8e7b43-1b7a-4bd3-9a1e-000000000c03', \
         'name': 'sb-node', 'power_state': 'Off', 'secure_boot': {}, 'boot_mode': 'UEFI', \
         'external_notifier': False, 'nics': [{{'mac': '52:54:00:00:00:03', 'ip': '192.0.2.3'}}]}}]",
        if secure_boot { "True" } else { "False" }
    )
}

fn sushy_client(s: &Sushy, o: &SushyOptions) -> Redfish {
    Redfish::new(RedfishConfig::new(
        &s.endpoint,
        &o.user,
        Credential::new(o.password.clone()),
    ))
    .unwrap()
}

#[tokio::test]
async fn sushy_reads_secure_boot_enables_it_and_refuses_enrolment_without_databases() {
    if !support::sushy::available() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("tb-rfsb-sushy-")
        .tempdir()
        .unwrap();
    let opts = SushyOptions {
        config: sushy_systems(false),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    let rf = sushy_client(&bmc, &opts);
    let v = rf.secure_boot().await.unwrap();
    assert_eq!(v.enable, Some(false), "{}", bmc.log_text());
    assert_eq!(v.current_boot.as_deref(), Some("Disabled"));
    assert_eq!(v.mode.as_deref(), Some("DeployedMode"));
    assert_eq!(v.databases, None);
    assert!(v.probe().not_enforcing().unwrap().contains("disabled"));

    rf.enable_secure_boot().await.unwrap();
    let v = rf.secure_boot().await.unwrap();
    assert_eq!(
        (v.enable, v.current_boot.as_deref()),
        (Some(true), Some("Enabled")),
        "{}",
        bmc.log_text()
    );
    assert_eq!(v.probe().not_enforcing(), None);

    let (_, cert) = test_cert("x");
    let e = rf.enroll("db", &cert, false).await.unwrap_err();
    assert!(
        matches!(
            &e,
            SecureBootError::Refused {
                refusal: SecureBootRefusal::NoDatabases { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("SecureBootDatabases"), "{e}");
    // sushy's template lists no ResetKeys action.
    let e = rf.reset_keys("DeleteAllKeys").await.unwrap_err();
    assert!(
        matches!(
            &e,
            SecureBootError::Refused {
                refusal: SecureBootRefusal::NoResetKeys { .. },
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn sushy_without_the_secure_boot_feature_is_refused_and_probed_as_unknown() {
    if !support::sushy::available() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("tb-rfsb-min-")
        .tempdir()
        .unwrap();
    let opts = SushyOptions {
        config: format!(
            "{}\nSUSHY_EMULATOR_FEATURE_SET = 'minimum'",
            sushy_systems(true)
        ),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    let rf = sushy_client(&bmc, &opts);
    let e = rf.secure_boot().await.unwrap_err();
    assert!(
        matches!(
            &e,
            SecureBootError::Refused {
                refusal: SecureBootRefusal::NoSecureBoot { .. },
                ..
            }
        ),
        "{e}: {}",
        bmc.log_text()
    );
    assert!(matches!(
        rf.secure_boot_probe().await.unwrap(),
        SecureBootProbe::Unknown(_)
    ));
}

/// sushy-emulator's libvirt driver (`sushy_tools/emulator/resources/systems/libvirtdriver.py`
/// 2.2.0: `set_secure_boot` rewrites the domain's `<loader secure=...>` and its NVRAM
/// template, `get_secure_boot` reads them back; a Legacy domain has no Secure Boot) on
/// libvirt's in-process `test:///default` driver (no daemon, its one `i686` domain `test`):
/// talboot switches the domain to UEFI with its boot override's `BootSourceOverrideMode`,
/// then enables Secure Boot, and the driver reads it back from the domain XML.
#[tokio::test]
async fn sushy_libvirt_driver_takes_secure_boot_enable_into_the_domain() {
    if !support::sushy::available() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("tb-rfsb-virt-")
        .tempdir()
        .unwrap();
    let code = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
    let opts = SushyOptions {
        fake: false,
        libvirt_uri: Some("test:///default".into()),
        config: format!(
            "SUSHY_EMULATOR_BOOT_LOADER_MAP = {{'UEFI': {{'x86_64': '{code}', 'i686': '{code}'}}, \
             'Legacy': {{'x86_64': None, 'i686': None}}}}\n\
             SUSHY_EMULATOR_SECURE_BOOT_ENABLED_NVRAM = '/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd'\n\
             SUSHY_EMULATOR_SECURE_BOOT_DISABLED_NVRAM = '/usr/share/OVMF/OVMF_VARS_4M.fd'"
        ),
        ..Default::default()
    };
    let bmc = Sushy::start(dir.path(), &opts);
    let mut cfg = RedfishConfig::new(
        &bmc.endpoint,
        &opts.user,
        Credential::new(opts.password.clone()),
    );
    cfg.boot_mode = Some(talboot::inventory::BootMode::Uefi);
    let rf = Redfish::new(cfg).unwrap();
    rf.set_boot_device(
        talboot::power::BootDevice::Disk,
        talboot::power::BootPersistence::Persistent,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", bmc.log_text()));
    let v = rf.secure_boot().await.unwrap();
    assert_eq!(
        (v.enable, v.current_boot.as_deref()),
        (Some(false), Some("Disabled")),
        "{}",
        bmc.log_text()
    );
    rf.enable_secure_boot().await.unwrap();
    let v = rf.secure_boot().await.unwrap();
    assert_eq!(
        (v.enable, v.current_boot.as_deref()),
        (Some(true), Some("Enabled")),
        "{}",
        bmc.log_text()
    );
}

// ---- the CLI ----

/// An inventory with one `secureBoot: true` node `n1` on the front.
fn inventory(dir: &Path, endpoint: &str, user: &str) -> std::path::PathBuf {
    let inv = dir.join("talboot.yaml");
    std::fs::write(
        &inv,
        format!(
            "cluster:\n  name: sb\n  talosVersion: v1.13.9\n  kubernetesVersion: 1.36.3\n  \
             endpoint: https://127.0.67.100:6443\n  vip: 127.0.67.100\n  secrets:\n    file: secrets.age\nnetwork:\n  \
             interfaces: [lo]\n  mode: authoritative\n  subnet: 127.0.67.0/24\nboot:\n  delivery: push\nnodes:\n  \
             - name: n1\n    mac: \"02:00:00:43:00:01\"\n    role: controlplane\n    \
             address: 127.0.67.11/24\n    installDisk: /dev/sda\n    firmware: uefi\n    secureBoot: true\n    \
             power: {{kind: redfish, endpoint: \"{endpoint}\", user: {user}, passwordEnv: TB_BMC_PASS}}\n"
        ),
    )
    .unwrap();
    inv
}

async fn talboot(args: Vec<String>, pass: String) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_talboot"))
            .args(&args)
            .env("TB_BMC_PASS", pass)
            .env("TALBOOT_ADMIN", "127.0.0.1:9")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn cli_status_enroll_and_check_probe_on_the_mockup() {
    let Some(r) = rig("cli", rackmount1, FrontOptions::new(SYSTEM)).await else {
        return;
    };
    let inv = inventory(r.dir.path(), &r.front.endpoint, &r.opts.user);
    let inv_s = inv.display().to_string();
    let pass = r.opts.password.clone();
    let run = |a: &[&str]| {
        let mut v: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        v.extend(["-c".to_string(), inv_s.clone()]);
        talboot(v, pass.clone())
    };

    let o = run(&["node", "secureboot", "status", "n1"]).await;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{out}");
    assert!(
        out.contains(
            "n1: secure boot: disabled (SecureBootEnable), current boot Disabled, mode DeployedMode"
        ),
        "{out}"
    );
    assert!(out.contains("NOT ENFORCED"), "{out}");
    assert!(
        out.contains("KEK: 1 certificate") && out.contains("CN=manager.contoso.org"),
        "{out}"
    );

    // check --probe flags the secureBoot node whose BMC says disabled.
    let o = run(&["check", "--probe"]).await;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    println!("{out}{err}");
    assert!(
        out.contains("probe n1: secure boot: disabled"),
        "{out}{err}"
    );
    assert!(
        out.contains("NOT ENFORCED") && err.contains("will not enforce"),
        "{out}{err}"
    );
    assert!(!o.status.success());

    let (pem_text, cert) = test_cert("talboot CLI site key");
    let pem_file = r.dir.path().join("site.pem");
    std::fs::write(&pem_file, &pem_text).unwrap();
    let o = run(&[
        "node",
        "secureboot",
        "enroll",
        "n1",
        "--cert",
        &pem_file.display().to_string(),
        "--enable",
    ])
    .await;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains(&format!(
            "enrolled CN=talboot CLI site key (sha256 {}) into db",
            cert.sha256
        )),
        "{out}"
    );
    assert!(
        out.contains("the BMC reads it back") && out.contains("SecureBootEnable set to true"),
        "{out}"
    );

    let o = run(&["check", "--probe"]).await;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("probe n1: secure boot: enabled"), "{out}");
    assert!(!out.contains("NOT ENFORCED"), "{out}");

    // reset-keys needs --yes, then puts the firmware in Setup Mode: flagged again.
    let o = run(&[
        "node",
        "secureboot",
        "reset-keys",
        "n1",
        "--type",
        "delete-pk",
    ])
    .await;
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--yes"));
    let o = run(&[
        "node",
        "secureboot",
        "reset-keys",
        "n1",
        "--type",
        "delete-pk",
        "--yes",
    ])
    .await;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("ResetKeys DeletePK sent"), "{out}");
    let o = run(&["check", "--probe"]).await;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("mode SetupMode") && out.contains("NOT ENFORCED"),
        "{out}"
    );

    // A key next to the certificate is refused before the BMC is asked.
    let key_file = r.dir.path().join("with-key.pem");
    std::fs::write(
        &key_file,
        format!("{pem_text}-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let o = run(&[
        "node",
        "secureboot",
        "enroll",
        "n1",
        "--cert",
        &key_file.display().to_string(),
    ])
    .await;
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("private key"));
}

#[tokio::test]
async fn cli_enroll_refusal_on_a_read_only_database_names_the_node_and_the_fix() {
    let mut opts = FrontOptions::new(SYSTEM);
    opts.cert_post_status = 405;
    let Some(r) = rig("cli405", rackmount1, opts).await else {
        return;
    };
    let inv = inventory(r.dir.path(), &r.front.endpoint, &r.opts.user);
    let (pem_text, _) = test_cert("x");
    let pem_file = r.dir.path().join("site.pem");
    std::fs::write(&pem_file, &pem_text).unwrap();
    let o = talboot(
        [
            "node",
            "secureboot",
            "enroll",
            "n1",
            "--cert",
            &pem_file.display().to_string(),
            "-c",
            &inv.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        r.opts.password.clone(),
    )
    .await;
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success());
    assert!(
        err.lines().any(|l| l.starts_with("talboot: n1: ")
            && l.contains("405")
            && l.contains("read-only")
            && l.contains("Secure Boot key enrolment")),
        "{err}"
    );
}
