//! Helm's own code takes over a release talboot installed (issue 31, item 3), against the
//! Kubernetes API double: the real `helm` 4 CLI (scripts/test-deps) runs the commands
//! docs/addons.md tells an operator to run — `helm upgrade` (which follows the record's
//! `apply_method: csa` into the client-side three-way merge Helm 3 also uses), `helm upgrade
//! --server-side=true` (csaupgrade, then server-side apply as `helm`), and
//! `--server-side=false` — and Helm's Go SDK as PyPI's `helm-python-sdk` wraps it (its
//! `Config.upgrade`, the SDK's defaults: `--server-side=auto`, field manager named after the
//! program).
//!
//! Helm 3 itself cannot be had here (no registry ships its binary, and there is no Go
//! toolchain to build `helm.sh/helm/v3`), so its path is exercised through Helm 4's
//! client-side apply, which is the same algorithm: `createPatch` computes
//! `strategicpatch.CreateThreeWayMergePatch(release manifest object, new render, live
//! object)` and sends it as a strategic merge patch (an Update) in helm/helm v3.19.5 and in
//! v4.1.4 `pkg/kube/client.go`; Helm 3 reads the same release record and ignores
//! `apply_method`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use talboot::addons::helm::{self, ChartMeta};
use talboot::addons::kube::Kube;
use talboot::addons::source::ManifestSource;
use talboot::addons::{AddonSpec, Timeouts, install_addon};
use talboot::sim::kube::{DoubleOptions, KubeDouble};
use time::OffsetDateTime;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/addons")
        .join(name)
}

/// The `helm` binary: `helm` on PATH (scripts/test-deps installs it). Missing helm fails the
/// test unless TALBOOT_SKIP_HELM is set.
fn helm_bin() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("helm"))
            .find(|p| p.is_file())
    });
    if found.is_none() && std::env::var_os("TALBOOT_SKIP_HELM").is_some() {
        eprintln!("helm not found; skipped because TALBOOT_SKIP_HELM is set");
        return None;
    }
    Some(found.expect("helm is not on PATH: run scripts/test-deps (or set TALBOOT_SKIP_HELM)"))
}

/// A chart whose only template is the take-over fixture: what `helm template` renders of it
/// is exactly what talboot installed.
fn chart(dir: &Path) -> PathBuf {
    let chart = dir.join("relay");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: relay\nversion: 0.1.0\nappVersion: 1.18.0\ntype: application\n",
    )
    .unwrap();
    std::fs::copy(
        fixture("takeover").join("objects.yaml"),
        chart.join("templates/objects.yaml"),
    )
    .unwrap();
    chart
}

/// Runs helm with a private home, config and cache, against the double's kubeconfig.
fn run_helm(helm: &Path, dir: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("helm runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or_default().to_owned(),
                e["operation"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn record(double: &KubeDouble, revision: u32) -> Option<Value> {
    double
        .object(
            "v1",
            "Secret",
            "hubble",
            &format!("sh.helm.release.v1.relay.v{revision}"),
        )
        .map(|s| helm::decode_release_secret(&s).unwrap())
}

/// The double with the take-over fixture installed by talboot as release `relay` in
/// `hubble`, and a talboot session on it.
async fn installed() -> (KubeDouble, Kube, AddonSpec) {
    talboot::install_crypto_provider();
    let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
    let kube = Kube::from_kubeconfig(double.kubeconfig().as_bytes(), Duration::from_millis(20))
        .await
        .unwrap();
    let spec = AddonSpec {
        release: "relay".into(),
        namespace: "hubble".into(),
        chart: ChartMeta {
            name: "relay".into(),
            version: "0.1.0".into(),
            app_version: "1.18.0".into(),
            description: String::new(),
        },
        values: json!({}),
        objects: ManifestSource::Dir(fixture("takeover"))
            .objects("relay", "hubble", &json!({}))
            .await
            .unwrap(),
        before: Vec::new(),
        after: Vec::new(),
        wait_nodes_ready: false,
    };
    install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap();
    (double, kube, spec)
}

fn timeouts() -> Timeouts {
    Timeouts {
        crd: Duration::from_secs(20),
        rollout: Duration::from_secs(20),
    }
}

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_takes_over_a_talboot_release_with_the_documented_commands() {
    let Some(helm) = helm_bin() else { return };
    let (double, kube, spec) = installed().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, double.kubeconfig()).unwrap();
    let chart = chart(dir.path());
    let chart = chart.to_str().unwrap();

    // docs/addons.md: `helm upgrade <release> <chart> -n <ns> -f <values>` (no values here).
    let h = |args: &[&str]| run_helm(&helm, dir.path(), &kubeconfig, args);
    let (ok, out) = h(&["upgrade", "relay", chart, "-n", "hubble"]);
    assert!(ok, "helm upgrade failed:\n{out}");
    let r2 = record(&double, 2).expect("revision 2");
    assert_eq!(r2["info"]["status"], "deployed", "{out}");
    assert_eq!(r2["apply_method"], "csa");
    assert_eq!(record(&double, 1).unwrap()["info"]["status"], "superseded");
    let relay = double
        .object("apps/v1", "Deployment", "hubble", "relay")
        .unwrap();
    assert!(
        managers(&relay).iter().all(|(m, _)| m == "helm"),
        "{:?}",
        managers(&relay)
    );

    // Later, server-side: csaupgrade folds Helm's Update entries into its Apply entry, then
    // Helm applies as `helm` without force.
    let (ok, out) = h(&[
        "upgrade",
        "relay",
        chart,
        "-n",
        "hubble",
        "--server-side=true",
    ]);
    assert!(ok, "helm upgrade --server-side=true failed:\n{out}");
    assert_eq!(record(&double, 3).unwrap()["apply_method"], "ssa");
    let (ok, out) = h(&[
        "upgrade",
        "relay",
        chart,
        "-n",
        "hubble",
        "--server-side=false",
    ]);
    assert!(ok, "helm upgrade --server-side=false failed:\n{out}");
    assert_eq!(record(&double, 4).unwrap()["info"]["status"], "deployed");

    // From revision 2 on, talboot leaves the release alone.
    let err = install_addon(&kube, &spec, timeouts(), now())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("helm upgrade"), "{err}");
}

/// Python with `helm_python` importable (scripts/test-deps installs helm-python-sdk). Missing
/// fails the test unless TALBOOT_SKIP_HELM_SDK is set.
fn helm_sdk_python() -> Option<&'static str> {
    let ok = Command::new("python3")
        .args(["-c", "import helm_python"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("TALBOOT_SKIP_HELM_SDK").is_some() {
        eprintln!("helm_python not importable; skipped because TALBOOT_SKIP_HELM_SDK is set");
        return None;
    }
    assert!(
        ok,
        "python3 cannot import helm_python: run scripts/test-deps (or set TALBOOT_SKIP_HELM_SDK)"
    );
    Some("python3")
}

/// Helm's Go SDK (v4.2.3 inside helm-python-sdk) upgrades the release with its defaults: the
/// record's `apply_method: csa` sends it down the three-way merge, whose Update operations
/// do not conflict whatever field-manager name the SDK uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helms_go_sdk_takes_over_a_talboot_release() {
    let Some(python) = helm_sdk_python() else {
        return;
    };
    let (double, _kube, _spec) = installed().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, double.kubeconfig()).unwrap();
    let chart = chart(dir.path());
    let script = "import sys, helm_python as h\n\
        cfg = h.Config(kubeconfig_path=sys.argv[1], namespace='hubble')\n\
        rel = cfg.upgrade(sys.argv[2], 'relay', namespace='hubble')\n\
        print('upgraded', rel)\n";
    let out = Command::new(python)
        .args(["-c", script])
        .arg(&kubeconfig)
        .arg(&chart)
        .env("HOME", dir.path())
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK's upgrade failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r2 = record(&double, 2).expect("revision 2");
    assert_eq!(r2["info"]["status"], "deployed");
    assert_eq!(record(&double, 1).unwrap()["info"]["status"], "superseded");
}
