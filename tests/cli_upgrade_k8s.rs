//! `talboot upgrade --kubernetes` as an operator runs it: the real binary, its exit codes and
//! its output, for what needs no cluster (the dry run, refused paths and flags). The apply
//! itself runs against the doubles in `daytwo::upgrade_k8s::tests::rack`.

use std::process::{Command, Output};

fn talboot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_LOG")
        .env_remove("TALBOOT_CONFIG")
        .env_remove("TALBOOT_STATE_DIR")
        .output()
        .expect("run talboot")
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn the_dry_run_lists_every_step_and_changes_nothing() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("state");
    let out = talboot(&[
        "upgrade",
        "-c",
        "config/rack.yaml",
        "--kubernetes",
        "1.37.0",
        "--dry-run",
        "--state-dir",
        dir.to_str().unwrap(),
    ]);
    // The steps are listed; the manifest sync's changes need the cluster, which this rack
    // (no talosconfig, no nodes) does not have: exit 2, saying so.
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // 3 static pods x 3 control planes, kube-proxy x 3, 13 kubelets, the manifests.
    assert!(
        stdout.starts_with("Kubernetes v1.36.3 -> v1.37.0, 26 steps"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  1. rack1-cp-01: patch cluster.apiServer image to v1.37.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains(" 26. sync the bootstrap manifests from the first control plane"),
        "{stdout}"
    );
    assert!(!stdout.contains("talosctl upgrade-k8s"), "{stdout}");
    assert!(
        text(&out.stderr).contains("cannot list the bootstrap manifest changes"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.exists(), "a dry run opens no store");
}

#[test]
fn an_unsupported_path_is_refused_before_anything_is_touched() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("state");
    for dry in [false, true] {
        let mut args = vec![
            "upgrade",
            "-c",
            "config/rack.yaml",
            "--kubernetes",
            "1.38.0",
            "--state-dir",
            dir.to_str().unwrap(),
        ];
        if dry {
            args.push("--dry-run");
        }
        let out = talboot(&args);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("unsupported upgrade path 1.36->1.38"),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(!dir.exists(), "refused before the store is opened");
}

#[test]
fn stage_is_a_talos_only_flag() {
    let out = talboot(&[
        "upgrade",
        "-c",
        "config/rack.yaml",
        "--kubernetes",
        "1.37.0",
        "--stage",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--stage"),
        "{}",
        text(&out.stderr)
    );
}
