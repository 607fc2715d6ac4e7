//! `talboot gen` and `talboot secrets init` as an operator runs them: the real binary against
//! copies of `config/`, with secrets encrypted by the real `age` and `sops` CLIs at test time
//! (keys from `age-keygen`). Missing tools fail the tests unless TALBOOT_SKIP_AGE /
//! TALBOOT_SKIP_SOPS is set. Every `gen` validates against the Talos schema facts embedded in the
//! binary; nothing outside the repository is read.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

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

/// Runs a tool in `dir` with sops/age variables cleared; panics with stderr on failure.
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

/// A fresh age key from `age-keygen`: (key file, recipient).
fn keygen(dir: &Path) -> (PathBuf, String) {
    let path = dir.join("key.txt");
    run(dir, "age-keygen", &["-o", path.to_str().unwrap()]);
    let public = run(dir, "age-keygen", &["-y", path.to_str().unwrap()]);
    (path, String::from_utf8(public).unwrap().trim().to_owned())
}

/// Runs talboot in `dir` with a clean identity environment plus `env`.
fn talboot(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_talboot"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("TALBOOT_CONFIG")
        .env_remove("SOPS_AGE_KEY")
        .env_remove("SOPS_AGE_KEY_FILE")
        .env_remove("XDG_CONFIG_HOME")
        .env("HOME", dir.join("home"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run talboot")
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// Copies `config/<file>` and `config/patches/` into `dir`.
fn copy_config(dir: &Path, file: &str) {
    std::fs::copy(repo(&format!("config/{file}")), dir.join(file)).unwrap();
    std::fs::create_dir_all(dir.join("patches")).unwrap();
    for e in std::fs::read_dir(repo("config/patches")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join("patches").join(e.file_name())).unwrap();
    }
}

fn fixture() -> PathBuf {
    repo("tests/fixtures/test-only-secrets.yaml")
}

#[test]
fn gen_rack_writes_13_valid_configs_and_check_finds_drift() {
    if !have("age", "TALBOOT_SKIP_AGE") || !have("age-keygen", "TALBOOT_SKIP_AGE") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    copy_config(dir, "rack.yaml");
    let (key, recipient) = keygen(dir);
    std::fs::create_dir_all(dir.join("secrets")).unwrap();
    run(
        dir,
        "age",
        &[
            "-r",
            &recipient,
            "-a",
            "-o",
            "secrets/rack1.age",
            fixture().to_str().unwrap(),
        ],
    );

    let key = key.to_str().unwrap();
    let out = talboot(
        dir,
        &["gen", "-c", "rack.yaml", "-o", "out", "--age-identity", key],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut files: Vec<String> = std::fs::read_dir(dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 15, "{files:?}");
    assert!(files.contains(&"talosconfig".to_owned()) && files.contains(&"kubeconfig".to_owned()));
    assert_eq!(files.iter().filter(|f| f.ends_with(".yaml")).count(), 13);
    for f in &files {
        let mode = std::fs::metadata(dir.join("out").join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    // The CLI writes exactly what the reviewed goldens hold.
    for (node, golden) in [
        ("rack1-cp-01", "rack-controlplane.yaml"),
        ("rack1-wk-02", "rack-worker.yaml"),
        ("rack1-st-01", "rack-storage.yaml"),
        ("rack1-mon-01", "rack-monitoring.yaml"),
    ] {
        assert_eq!(
            std::fs::read_to_string(dir.join("out").join(format!("{node}.yaml"))).unwrap(),
            std::fs::read_to_string(repo(&format!("tests/golden/{golden}"))).unwrap(),
            "{node}"
        );
    }
    let talosconfig = std::fs::read_to_string(dir.join("out/talosconfig")).unwrap();
    assert!(talosconfig.contains("context: rack1") && talosconfig.contains("10.20.0.11"));
    let kubeconfig = std::fs::read_to_string(dir.join("out/kubeconfig")).unwrap();
    assert!(kubeconfig.contains("server: https://10.20.0.10:6443"));

    // Up to date: exit 0. The identity may also come from SOPS_AGE_KEY_FILE.
    let check = talboot(
        dir,
        &["gen", "-c", "rack.yaml", "--check", "out"],
        &[("SOPS_AGE_KEY_FILE", key)],
    );
    assert_eq!(check.status.code(), Some(0), "{}", text(&check.stderr));
    assert!(text(&check.stdout).contains("all 13 node configs are up to date"));

    // Drift in one node: exit 1 with a diff naming the node.
    let wk = dir.join("out/rack1-wk-02.yaml");
    let edited = std::fs::read_to_string(&wk)
        .unwrap()
        .replace("disk: /dev/sda", "disk: /dev/sdb");
    std::fs::write(&wk, edited).unwrap();
    std::fs::remove_file(dir.join("out/rack1-mon-03.yaml")).unwrap();
    std::fs::write(dir.join("out/rack1-old-01.yaml"), "version: v1alpha1\n").unwrap();
    let check = talboot(
        dir,
        &[
            "gen",
            "-c",
            "rack.yaml",
            "--check",
            "out",
            "--age-identity",
            key,
        ],
        &[],
    );
    assert_eq!(check.status.code(), Some(1), "{}", text(&check.stderr));
    let stdout = text(&check.stdout);
    assert!(stdout.contains("+++ rack1-wk-02 (rendered)"), "{stdout}");
    assert!(
        stdout.contains("-    disk: /dev/sdb\n+    disk: /dev/sda\n"),
        "{stdout}"
    );
    assert!(stdout.contains("rack1-mon-03.yaml"), "{stdout}");
    assert!(
        stdout.contains("rack1-old-01.yaml: no node of that name in the inventory"),
        "{stdout}"
    );
    assert!(
        stdout.contains("3 difference(s) across 13 node configs"),
        "{stdout}"
    );

    // Without any identity: exit 2, naming the file, the recipients and where it looked.
    let out = talboot(dir, &["gen", "-c", "rack.yaml", "-o", "out2"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("secrets/rack1.age"), "{stderr}");
    assert!(
        stderr.contains("age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"),
        "{stderr}"
    );
    assert!(stderr.contains("--age-identity"), "{stderr}");
    assert!(!dir.join("out2").exists());
}

#[test]
fn secrets_init_then_gen_and_no_overwrite() {
    if !have("age", "TALBOOT_SKIP_AGE") || !have("age-keygen", "TALBOOT_SKIP_AGE") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    copy_config(dir, "lab.yaml");
    let (key, recipient) = keygen(dir);
    let inv = std::fs::read_to_string(dir.join("lab.yaml"))
        .unwrap()
        .replace(
            "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p",
            &recipient,
        );
    std::fs::write(dir.join("lab.yaml"), inv).unwrap();

    let out = talboot(dir, &["secrets", "init", "-c", "lab.yaml"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let bundle = dir.join("secrets/lab.age");
    let bytes = std::fs::read(&bundle).unwrap();
    assert!(bytes.starts_with(b"-----BEGIN AGE ENCRYPTED FILE-----"));
    // The real age CLI decrypts it to a talosctl-layout bundle.
    let plain = run(
        dir,
        "age",
        &["-d", "-i", key.to_str().unwrap(), bundle.to_str().unwrap()],
    );
    let plain = text(&plain);
    assert!(plain.contains("bootstraptoken:") && plain.contains("k8sserviceaccount:"));

    let again = talboot(dir, &["secrets", "init", "-c", "lab.yaml"], &[]);
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again.stderr).contains("already exists"));
    assert_eq!(std::fs::read(&bundle).unwrap(), bytes);

    let out = talboot(
        dir,
        &["gen", "-c", "lab.yaml", "-o", "out"],
        &[("SOPS_AGE_KEY", &std::fs::read_to_string(&key).unwrap())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(dir.join("out/k8s-ctrl-03.yaml").is_file());
}

#[test]
fn gen_from_talconfig_with_a_real_sops_talsecret() {
    if !have("age-keygen", "TALBOOT_SKIP_AGE") || !have("sops", "TALBOOT_SKIP_SOPS") {
        return;
    }
    // `--schema` overrides the embedded facts (here with the committed facts file itself).
    let schema = repo("src/talosfacts/talos-v1.13.schema-facts.json");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    copy_config(dir, "talconfig.yaml");
    let (key, recipient) = keygen(dir);
    let plain = dir.join("talsecret.yaml.plain");
    std::fs::copy(fixture(), &plain).unwrap();
    let enc = run(
        dir,
        "sops",
        &[
            "encrypt",
            "--age",
            &recipient,
            "--input-type",
            "yaml",
            "--output-type",
            "yaml",
            plain.to_str().unwrap(),
        ],
    );
    std::fs::remove_file(&plain).unwrap();
    std::fs::write(dir.join("talsecret.sops.yaml"), &enc).unwrap();
    assert!(text(&enc).contains("ENC[AES256_GCM"));

    let out = talboot(
        dir,
        &[
            "gen",
            "-c",
            "talconfig.yaml",
            "-o",
            "out",
            "--schema",
            schema.to_str().unwrap(),
        ],
        &[("SOPS_AGE_KEY_FILE", key.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A --schema file that is not a Talos schema is a usage error naming the file.
    std::fs::write(dir.join("not-a-schema.json"), "{}").unwrap();
    let bad = talboot(
        dir,
        &[
            "gen",
            "-c",
            "talconfig.yaml",
            "-o",
            "out2",
            "--schema",
            "not-a-schema.json",
        ],
        &[("SOPS_AGE_KEY_FILE", key.to_str().unwrap())],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("not-a-schema.json: not a Talos config schema"),
        "{}",
        text(&bad.stderr)
    );
    for n in ["k8s-ctrl-01", "k8s-ctrl-02", "k8s-ctrl-03"] {
        let cfg = std::fs::read_to_string(dir.join(format!("out/{n}.yaml"))).unwrap();
        assert!(
            cfg.contains("kind: TimeSyncConfig\nntp:\n  servers:\n    - 10.0.40.1\n"),
            "{n}"
        );
        assert!(!cfg.contains("\n  time:\n"), "{n}");
        assert!(cfg.contains(&format!("hostname: {n}")), "{n}");
        assert!(
            cfg.contains("kind: Layer2VIPConfig\nname: 10.0.40.101\n"),
            "{n}"
        );
    }
    // The bundle's cluster id came through the SOPS decryption unchanged.
    let fixture_text = std::fs::read_to_string(fixture()).unwrap();
    let id = fixture_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("id: "))
        .unwrap();
    let cfg = std::fs::read_to_string(dir.join("out/k8s-ctrl-01.yaml")).unwrap();
    assert!(cfg.contains(&format!("  id: {id}\n")));

    // A plaintext bundle is refused (plaintext secrets never stay on disk).
    std::fs::copy(fixture(), dir.join("talsecret.sops.yaml")).unwrap();
    let out = talboot(
        dir,
        &["gen", "-c", "talconfig.yaml", "-o", "out3"],
        &[("SOPS_AGE_KEY_FILE", key.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("plaintext"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn gen_reports_schema_and_structure_problems_by_node_kind_and_field() {
    if !have("age", "TALBOOT_SKIP_AGE") || !have("age-keygen", "TALBOOT_SKIP_AGE") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    copy_config(dir, "lab.yaml");
    let inv = std::fs::read_to_string(dir.join("lab.yaml"))
        .unwrap()
        .replace(
            "  - name: k8s-ctrl-02\n",
            "  - name: k8s-ctrl-02\n    patches: [patches/bad.yaml]\n",
        );
    std::fs::write(dir.join("lab.yaml"), inv).unwrap();
    std::fs::write(
        dir.join("patches/bad.yaml"),
        "machine:\n  install:\n    wipe: sometimes\n    diskSelector:\n      model: QEMU*\n",
    )
    .unwrap();
    let (key, recipient) = keygen(dir);
    std::fs::create_dir_all(dir.join("secrets")).unwrap();
    run(
        dir,
        "age",
        &[
            "-r",
            &recipient,
            "-o",
            "secrets/lab.age",
            fixture().to_str().unwrap(),
        ],
    );
    let out = talboot(
        dir,
        &[
            "gen",
            "-c",
            "lab.yaml",
            "-o",
            "out",
            "--age-identity",
            key.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "node k8s-ctrl-02: v1alpha1 `machine.install`: both `disk` and `diskSelector`"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("k8s-ctrl-01:"), "{stderr}");
    assert!(
        !dir.join("out").exists(),
        "nothing is written when a node fails"
    );

    // Structure fixed, the schema still finds the bad type, naming node, kind and field.
    std::fs::write(
        dir.join("patches/bad.yaml"),
        "machine:\n  install:\n    wipe: sometimes\n",
    )
    .unwrap();
    let out = talboot(
        dir,
        &[
            "gen",
            "-c",
            "lab.yaml",
            "-o",
            "out",
            "--age-identity",
            key.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("node k8s-ctrl-02: v1alpha1 `machine.install.wipe`:"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("sometimes"),
        "values are not echoed: {stderr}"
    );
}
