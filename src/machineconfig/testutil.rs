//! Test helpers shared by the machineconfig tests: the real `openssl` CLI as an independent
//! checker and fixture maker, and one generated bundle reused across tests (RSA-4096 generation
//! is slow).

use std::path::Path;
use std::process::{Command, Output};
use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use time::OffsetDateTime;

use super::secrets::{GenerateOptions, SecretsBundle};

/// True when the `openssl` CLI can be used. Missing openssl fails the test unless
/// `TALBOOT_SKIP_OPENSSL` is set, so CI cannot pass silently without the checks.
pub(crate) fn have_openssl() -> bool {
    let found = Command::new("openssl")
        .arg("version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if found {
        return true;
    }
    if std::env::var_os("TALBOOT_SKIP_OPENSSL").is_some() {
        eprintln!("openssl not found; skipping because TALBOOT_SKIP_OPENSSL is set");
        return false;
    }
    panic!(
        "the `openssl` CLI is required by this test: run scripts/test-deps or set TALBOOT_SKIP_OPENSSL=1"
    );
}

/// Runs openssl with `args` in `dir`.
pub(crate) fn openssl(dir: &Path, args: &[&str]) -> Output {
    Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl")
}

/// Runs openssl, asserts success, returns stdout and stderr together.
pub(crate) fn openssl_ok(dir: &Path, args: &[&str]) -> String {
    let out = openssl(dir, args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "openssl {args:?} failed:\n{text}");
    text
}

/// Writes `pem` to `dir/name` and returns `openssl x509 -noout -text` of it.
pub(crate) fn cert_text(dir: &Path, name: &str, pem: &str) -> String {
    std::fs::write(dir.join(name), pem).unwrap();
    openssl_ok(dir, &["x509", "-in", name, "-noout", "-text"])
}

/// Asserts with openssl's own clock that the certificate in `dir/name` is valid for at least
/// `secs - 120` more seconds and expires within `secs + 120`.
pub(crate) fn assert_expires_in(dir: &Path, name: &str, secs: i64) {
    let before = (secs - 120).to_string();
    let after = (secs + 120).to_string();
    let still = openssl(dir, &["x509", "-in", name, "-noout", "-checkend", &before]);
    assert!(
        still.status.success(),
        "{name} expires earlier than {secs}s from now"
    );
    let gone = openssl(dir, &["x509", "-in", name, "-noout", "-checkend", &after]);
    assert!(
        !gone.status.success(),
        "{name} is still valid {secs}s from now"
    );
}

/// One bundle generated with Talos v1.13 defaults, shared by all tests in this process.
pub(crate) fn shared_bundle() -> &'static SecretsBundle {
    static BUNDLE: OnceLock<SecretsBundle> = OnceLock::new();
    BUNDLE.get_or_init(|| {
        SecretsBundle::generate(OffsetDateTime::now_utc(), &GenerateOptions::default())
            .expect("generate bundle")
    })
}

/// Makes a self-signed CA with openssl in `dir`: `<name>.key` from `keygen` args and
/// `<name>.crt` with the given subject line (`O = x` / `CN = x`).
pub(crate) fn openssl_ca(dir: &Path, name: &str, keygen: &[&str], subject: &str) {
    let key = format!("{name}.key");
    // `-out` right after the subcommand: genrsa wants the bit count last.
    let mut args = vec![keygen[0], "-out", &key];
    args.extend(&keygen[1..]);
    openssl_ok(dir, &args);
    let cfg = format!("{name}.cnf");
    std::fs::write(
        dir.join(&cfg),
        format!(
            "[req]\ndistinguished_name = dn\nx509_extensions = ca_ext\nprompt = no\n\
             [dn]\n{subject}\n\
             [ca_ext]\nbasicConstraints = critical,CA:TRUE\n\
             keyUsage = critical,digitalSignature,keyCertSign\n\
             extendedKeyUsage = serverAuth,clientAuth\nsubjectKeyIdentifier = hash\n"
        ),
    )
    .unwrap();
    let crt = format!("{name}.crt");
    openssl_ok(
        dir,
        &[
            "req", "-x509", "-new", "-key", &key, "-config", &cfg, "-days", "3650", "-out", &crt,
        ],
    );
}

/// A secrets bundle made entirely by openssl (an independent implementation), laid out the
/// way `talosctl gen secrets` writes it (go-yaml, 4-space indent). Returns the YAML text.
pub(crate) fn openssl_bundle_yaml(dir: &Path) -> String {
    let ec = ["ecparam", "-name", "prime256v1", "-genkey", "-noout"];
    openssl_ca(dir, "etcd", &ec, "O = etcd");
    openssl_ca(dir, "k8s", &ec, "O = kubernetes");
    openssl_ca(dir, "agg", &ec, "CN = front-proxy");
    openssl_ca(
        dir,
        "os",
        &["genpkey", "-algorithm", "ed25519"],
        "O = talos",
    );
    openssl_ok(dir, &["genrsa", "-traditional", "-out", "sa.key", "2048"]);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    // Talos labels Ed25519 PKCS#8 keys `ED25519 PRIVATE KEY`; openssl writes `PRIVATE KEY`.
    let os_key = read("os.key").replace("PRIVATE KEY", "ED25519 PRIVATE KEY");
    let b = |s: &str| STANDARD.encode(s);
    format!(
        "cluster:\n    id: {id}\n    secret: {secret}\n\
         secrets:\n    bootstraptoken: q1w2e3.r4t5y6u7i8o9p0as\n    secretboxencryptionsecret: {sb}\n\
         trustdinfo:\n    token: zx9cv8.bn7m6l5k4j3h2g1f\n\
         certs:\n\
         \x20   etcd:\n        crt: {etcd_crt}\n        key: {etcd_key}\n\
         \x20   k8s:\n        crt: {k8s_crt}\n        key: {k8s_key}\n\
         \x20   k8saggregator:\n        crt: {agg_crt}\n        key: {agg_key}\n\
         \x20   k8sserviceaccount:\n        key: {sa}\n\
         \x20   os:\n        crt: {os_crt}\n        key: {os_key}\n",
        id = URL_SAFE.encode([0xfbu8; 32]),
        secret = STANDARD.encode([0x5au8; 32]),
        sb = STANDARD.encode([0xa5u8; 32]),
        etcd_crt = b(&read("etcd.crt")),
        etcd_key = b(&read("etcd.key")),
        k8s_crt = b(&read("k8s.crt")),
        k8s_key = b(&read("k8s.key")),
        agg_crt = b(&read("agg.crt")),
        agg_key = b(&read("agg.key")),
        sa = b(&read("sa.key")),
        os_crt = b(&read("os.crt")),
        os_key = b(&os_key),
    )
}
