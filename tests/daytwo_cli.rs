//! Day two with the `talboot` binary against the full simulated rack (`config/rack.yaml`'s
//! 13 machines, the `demo` machinery in this process, talboot's servers and store held by
//! it exactly as a running `serve` holds them):
//!
//! plan on the unchanged rack shows no changes -> a patch added to the storage role ->
//! plan shows exactly that field on exactly the three storage nodes -> `talboot apply
//! --mode no-reboot` finds the store held and goes through serve's admin API, changing
//! exactly those nodes, none rebooted -> plan is clean -> a node's running config changed
//! behind talboot's back shows in plan and, from serve's drift watcher, in `talboot status`
//! -> `talboot upgrade --kubernetes` goes through serve: it stops at a control plane whose
//! API server never comes back, resumes without repeating a step, no node rebooted ->
//! `talboot upgrade --talos` goes through serve too: it stops at a failing control plane,
//! resumes without upgrading finished nodes again, and a further run upgrades nothing ->
//! the inventory moved to v1.14.0 keeps every node at its v1.13 contract; `--contract v1.14`
//! migrates them (see `across_the_contract`).
//!
//! One test: the rack's loopback addresses allow one simulated rack at a time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use talboot::sim::demo::{Demo, DemoOptions};
use talboot::sim::kubelet::{KubeletNode, KubeletOptions, Kubelets};
use talboot::sim::talos::UpgradeFailure;

const STORAGE: [&str; 3] = ["rack1-st-01", "rack1-st-02", "rack1-st-03"];

fn rack() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml")
}

struct Cli {
    config: PathBuf,
    talosconfig: PathBuf,
    age_identity: PathBuf,
    state_dir: PathBuf,
    admin: String,
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Cli {
    async fn run(&self, sub: &str, extra: &[&str]) -> Ran {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_talboot"));
        cmd.arg(sub).arg("-c").arg(&self.config);
        match sub {
            "plan" | "apply" => {
                cmd.arg("--talosconfig")
                    .arg(&self.talosconfig)
                    .arg("--age-identity")
                    .arg(&self.age_identity);
            }
            _ => {}
        }
        if sub == "upgrade" {
            cmd.arg("--images")
                .arg(self.state_dir.parent().unwrap().join("images"));
        }
        if matches!(sub, "apply" | "status" | "upgrade") {
            cmd.arg("--state-dir")
                .arg(&self.state_dir)
                .args(["--admin", &self.admin]);
        }
        let out = cmd
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("TALOSCONFIG")
            .env_remove("TALBOOT_ADMIN")
            .env("HOME", self.state_dir.parent().unwrap())
            .output()
            .await
            .unwrap();
        Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The plan's first line for `node`.
fn plan_line<'a>(out: &'a Ran, node: &str) -> &'a str {
    out.stdout
        .lines()
        .find(|l| l.starts_with(&format!("{node}: ")))
        .unwrap_or_else(|| panic!("{node} missing from the plan:\n{out}"))
}

/// The status row of `node`.
fn status_row<'a>(out: &'a Ran, node: &str) -> &'a str {
    out.stdout
        .lines()
        .find(|l| l.starts_with(&format!("{node} ")))
        .unwrap_or_else(|| panic!("{node} missing from the status:\n{out}"))
}

/// `config` with the node label `hand-made: "yes"` added to its v1alpha1 document, as
/// someone's `talosctl apply-config` would.
fn with_hand_made_label(config: &str) -> String {
    let docs: Vec<String> = config
        .split("\n---\n")
        .map(|d| {
            let mut v: yaml_serde::Value = yaml_serde::from_str(d).unwrap();
            let Some(machine) = v.get_mut("machine") else {
                return d.to_owned();
            };
            let labels = machine
                .as_mapping_mut()
                .unwrap()
                .entry("nodeLabels".into())
                .or_insert_with(|| yaml_serde::Value::Mapping(Default::default()));
            labels
                .as_mapping_mut()
                .unwrap()
                .insert("hand-made".into(), "yes".into());
            yaml_serde::to_string(&v).unwrap().trim_end().to_owned()
        })
        .collect();
    docs.join("\n---\n") + "\n"
}

async fn day_two(demo: &Demo) {
    demo.wait_handed_off(Duration::from_secs(180))
        .await
        .unwrap();
    demo.watch_drift(Duration::from_millis(300));
    let cli = Cli {
        config: demo.inventory_path.clone(),
        talosconfig: demo.workdir.join("talosconfig"),
        age_identity: demo.age_identity.clone(),
        state_dir: demo.workdir.join("state"),
        admin: demo.admin_url.trim_start_matches("http://").to_owned(),
    };
    let names: Vec<String> = demo.nodes.iter().map(|n| n.machine.name.clone()).collect();
    let talos = |name: &str| demo.node(name).unwrap().talos().unwrap();
    let applies = |name: &str| {
        talos(name)
            .apply_records()
            .iter()
            .filter(|r| !r.dry_run)
            .count()
    };

    // The unchanged rack: no changes anywhere, exit 0.
    let plan = cli.run("plan", &[]).await;
    assert_eq!(plan.code, Some(0), "{plan}");
    for n in &names {
        assert_eq!(plan_line(&plan, n), format!("{n}: no changes"), "{plan}");
    }

    // A patch added to the storage role.
    std::fs::write(
        demo.workdir.join("config/patches/day-two.yaml"),
        "machine:\n  sysctls:\n    fs.inotify.max_user_watches: \"1048576\"\n",
    )
    .unwrap();
    let inventory = std::fs::read_to_string(&cli.config).unwrap();
    let changed = inventory.replace(
        "patches: [patches/storage.yaml]",
        "patches: [patches/storage.yaml, patches/day-two.yaml]",
    );
    assert_ne!(changed, inventory, "the storage role's patch list moved");
    std::fs::write(&cli.config, changed).unwrap();

    // The plan shows exactly that field on exactly the storage nodes, no reboot needed.
    let plan = cli.run("plan", &[]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    for n in &names {
        let line = plan_line(&plan, n);
        if STORAGE.contains(&n.as_str()) {
            assert_eq!(
                line,
                format!("{n}: 1 change(s); needs apply mode no-reboot"),
                "{plan}"
            );
        } else {
            assert_eq!(line, format!("{n}: no changes"), "{plan}");
        }
    }
    assert_eq!(
        plan.stdout
            .lines()
            .filter(|l| l.trim() == "+ machine.sysctls.fs.inotify.max_user_watches: 1048576")
            .count(),
        3,
        "{plan}"
    );

    // Apply while serve holds the store: through its admin API, to exactly those nodes.
    let before: Vec<(usize, usize)> = names
        .iter()
        .map(|n| (applies(n), talos(n).reboot_calls()))
        .collect();
    let apply = cli
        .run(
            "apply",
            &["--mode", "no-reboot", "--worker-concurrency", "2"],
        )
        .await;
    assert_eq!(apply.code, Some(0), "{apply}");
    assert!(
        apply
            .stdout
            .contains("talboot serve holds the store; applying through its admin API"),
        "{apply}"
    );
    for n in STORAGE {
        assert!(
            apply.stdout.contains(&format!("{n}: applied\n")),
            "{n}: {apply}"
        );
    }
    assert!(
        apply.stdout.contains(&format!(
            "applied to 3 node(s): {} (apply/",
            STORAGE.join(", ")
        )),
        "{apply}"
    );
    for (n, (applied, reboots)) in names.iter().zip(before) {
        let want = applied + usize::from(STORAGE.contains(&n.as_str()));
        assert_eq!(applies(n), want, "{n}: {apply}");
        assert_eq!(talos(n).reboot_calls(), reboots, "{n} rebooted");
    }
    for n in STORAGE {
        let last = talos(n).apply_records().into_iter().rfind(|r| !r.dry_run);
        assert!(last.is_some_and(|r| !r.rebooted), "{n}");
    }

    // Now the rack runs what the inventory renders.
    let plan = cli.run("plan", &[]).await;
    assert_eq!(plan.code, Some(0), "{plan}");

    // A node's config changed behind talboot's back: plan shows it ...
    let wk = talos("rack1-wk-01");
    let running = wk.running_config().unwrap();
    let rogue = with_hand_made_label(&running);
    assert_ne!(rogue, running);
    wk.set_running_config(&rogue);
    let plan = cli.run("plan", &[]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    assert!(
        plan_line(&plan, "rack1-wk-01").contains("includes REMOVALS"),
        "{plan}"
    );
    assert!(plan.stdout.contains("REMOVED"), "{plan}");
    assert_eq!(plan_line(&plan, "rack1-st-01"), "rack1-st-01: no changes");

    // ... and serve's drift watcher puts it in `talboot status` (read from the admin API,
    // since serve holds the store). The storage nodes are in sync against what was applied
    // through serve, not against serve's start-up rendering.
    let mut tries = 0;
    let status = loop {
        let status = cli.run("status", &[]).await;
        assert_eq!(status.code, Some(0), "{status}");
        assert!(status.stdout.starts_with("NODE "), "{status}");
        let drift = |n: &str| {
            let row = status_row(&status, n);
            if row.contains(" yes (") {
                Some(true)
            } else if row.contains(" no ") {
                Some(false)
            } else {
                None
            }
        };
        let settled = drift("rack1-wk-01") == Some(true)
            && names
                .iter()
                .filter(|n| *n != "rack1-wk-01")
                .all(|n| drift(n) == Some(false));
        if settled {
            break status;
        }
        tries += 1;
        assert!(tries < 200, "drift never settled:\n{status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let header = status.stdout.lines().next().unwrap();
    assert!(header.contains(" DRIFT "), "{status}");

    // A Kubernetes upgrade while serve holds the store (before the Talos one: Talos v1.14
    // is not in talosctl's compatibility table for Kubernetes 1.36). The kubelets follow
    // each node's running config into the API double, as the real ones do.
    let kubelets = Kubelets::start(
        names
            .iter()
            .map(|n| KubeletNode {
                hostname: n.clone(),
                ip: demo.inventory.node(n).unwrap().address.addr().into(),
                config: talos(n).running_config_handle(),
            })
            .collect(),
        demo.kube.clone(),
        KubeletOptions::default(),
    );
    let before: Vec<(usize, usize)> = names
        .iter()
        .map(|n| (applies(n), talos(n).reboot_calls()))
        .collect();
    let pod_image = |component: &str, node: &str| {
        demo.kube
            .object("v1", "Pod", "kube-system", &format!("{component}-{node}"))
            .and_then(|p| {
                p["spec"]["containers"][0]["image"]
                    .as_str()
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    };
    let kubelet_version = |node: &str| {
        demo.kube.object("v1", "Node", "", node).unwrap()["status"]["nodeInfo"]["kubeletVersion"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    // The dry run (standalone even while serve runs: it opens no store) lists the steps and
    // what the manifest sync would do on this cluster now, and changes nothing.
    let objects = || demo.kube.resource_versions_but_kubelets();
    let untouched = objects();
    let talosconfig = cli.talosconfig.to_str().unwrap().to_owned();
    let dry = cli
        .run(
            "upgrade",
            &[
                "--kubernetes",
                "1.36.4",
                "--dry-run",
                "--talosconfig",
                &talosconfig,
            ],
        )
        .await;
    assert_eq!(dry.code, Some(0), "{dry}");
    for want in [
        "bootstrap manifests (dry run, as of now):",
        "  < created Deployment/kube-system/coredns",
        "  < created ClusterRole/system:talos-nodes",
    ] {
        assert!(dry.stdout.contains(want), "{want}: {dry}");
    }
    assert_eq!(
        objects(),
        untouched,
        "the dry run changed the cluster: {dry}"
    );
    // The second control plane's API server never comes back: serve stops at that step.
    kubelets.never_ready("rack1-cp-02", "kube-apiserver");
    let k8s = |timeout: &'static str| {
        let cli = &cli;
        async move {
            cli.run(
                "upgrade",
                &[
                    "--kubernetes",
                    "1.36.4",
                    "--node-timeout",
                    timeout,
                    "--gate-poll-ms",
                    "50",
                ],
            )
            .await
        }
    };
    let failed = k8s("3").await;
    assert_eq!(failed.code, Some(1), "{failed}");
    for want in [
        "talboot serve holds the store; upgrading Kubernetes through its admin API",
        "serve runs upgrade-k8s/v1.36.4",
        "kube-apiserver/rack1-cp-01: done",
        "kube-apiserver/rack1-cp-02: FAILED: ",
    ] {
        assert!(failed.stdout.contains(want), "{want}: {failed}");
    }
    assert!(
        failed
            .stderr
            .contains("stopped at step kube-apiserver/rack1-cp-02: "),
        "{failed}"
    );
    assert!(pod_image("kube-apiserver", "rack1-cp-01").ends_with(":v1.36.4"));
    assert!(pod_image("kube-apiserver", "rack1-cp-03").ends_with(":v1.36.3"));
    for (n, (applied, _)) in names.iter().zip(&before) {
        // cp-01 and cp-02 got their API server patch; nothing after the failing step ran.
        let want = applied + usize::from(n == "rack1-cp-01" || n == "rack1-cp-02");
        assert_eq!(applies(n), want, "{n}: {failed}");
    }
    kubelets.heal();
    // Healed, the same command resumes through serve and finishes: each step once, no node
    // rebooted, every kubelet on the new version.
    let upgrade = k8s("60").await;
    assert_eq!(upgrade.code, Some(0), "{upgrade}");
    for want in [
        "resuming upgrade-k8s/v1.36.4",
        "kube-apiserver/rack1-cp-02: done",
        "kubelet/rack1-wk-01: done",
        "manifests: applied and pruned",
        "manifests: done",
        "Kubernetes v1.36.4 on every node",
    ] {
        assert!(upgrade.stdout.contains(want), "{want}: {upgrade}");
    }
    // The bootstrap manifests the first control plane renders, applied as Talos applies
    // them, with Talos's inventory (the rack's Cilium replaces kube-proxy: none rendered).
    let coredns = demo
        .kube
        .object("apps/v1", "Deployment", "kube-system", "coredns")
        .expect("CoreDNS synced");
    assert_eq!(coredns["metadata"]["managedFields"][0]["manager"], "talos");
    assert!(
        demo.kube
            .object("apps/v1", "DaemonSet", "kube-system", "kube-proxy")
            .is_none()
    );
    let inventory = demo
        .kube
        .object(
            "v1",
            "ConfigMap",
            "kube-system",
            "talos-bootstrap-manifests-inventory",
        )
        .expect("the manifest inventory");
    assert!(
        inventory["data"]
            .get("kube-system_coredns_apps_Deployment")
            .is_some(),
        "{inventory}"
    );
    for (n, (applied, reboots)) in names.iter().zip(&before) {
        let cp = n.contains("-cp-");
        // A control plane: three static pods, kube-proxy, the kubelet; a worker: the kubelet.
        let want = applied + if cp { 5 } else { 1 };
        assert_eq!(applies(n), want, "{n}: no step applied twice: {upgrade}");
        assert_eq!(talos(n).reboot_calls(), *reboots, "{n} rebooted");
        assert_eq!(kubelet_version(n), "v1.36.4", "{n}");
    }
    drop(kubelets);
    // serve's inventory still says 1.36.3: its drift watcher now reports a node that was in
    // sync (the operator bumps `kubernetesVersion` and restarts serve, as the CLI says).
    assert!(
        upgrade.stdout.contains("set `kubernetesVersion: 1.36.4`"),
        "{upgrade}"
    );
    let mut tries = 0;
    loop {
        let status = cli.run("status", &[]).await;
        if status_row(&status, "rack1-st-01").contains(" yes (") {
            break;
        }
        tries += 1;
        assert!(tries < 200, "no drift after the upgrade:\n{status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A Talos upgrade while serve holds the store: through its admin API as well, the
    // installer's output streamed back, every node upgraded once.
    demo.add_boot_sets(&"v1.14.0".parse().unwrap()).unwrap();
    // The second control plane's installer fails: serve stops there, the CLI says where and
    // exits 1; the first control plane is upgraded, no worker is touched.
    talos("rack1-cp-02").fail_upgrades(Some(UpgradeFailure::Installer));
    let failed = cli
        .run("upgrade", &["--talos", "v1.14.0", "--node-timeout", "120"])
        .await;
    assert_eq!(failed.code, Some(1), "{failed}");
    for want in [
        "talboot serve holds the store; upgrading through its admin API",
        "serve runs upgrade-talos/v1.14.0",
        "rack1-cp-01: upgrading to v1.14.0",
        "rack1-cp-01: pulling the installer",
        "rack1-cp-01: installer layer",
        "rack1-cp-01: pulled the installer as",
        "rack1-cp-01: installed; rebooting into it",
        "rack1-cp-01: done",
        "rack1-cp-02: FAILED: the installer",
    ] {
        assert!(failed.stdout.contains(want), "{want}: {failed}");
    }
    assert!(
        failed
            .stderr
            .contains("stopped at node rack1-cp-02: the installer"),
        "{failed}"
    );
    assert_eq!(talos("rack1-cp-01").upgrade_calls(), 1);
    assert_eq!(talos("rack1-wk-01").upgrade_calls(), 0);
    talos("rack1-cp-02").fail_upgrades(None);
    // Fixed, the same command resumes through serve: finished nodes are not upgraded again.
    let upgrade = cli
        .run(
            "upgrade",
            &[
                "--talos",
                "v1.14.0",
                "--worker-concurrency",
                "4",
                "--node-timeout",
                "120",
            ],
        )
        .await;
    assert_eq!(upgrade.code, Some(0), "{upgrade}");
    for want in [
        "talboot serve holds the store; upgrading through its admin API",
        "serve runs upgrade-talos/v1.14.0",
        "rack1-cp-02: upgrading to v1.14.0",
        "rack1-cp-02: installed; rebooting into it",
        "Talos v1.14.0 running on every node",
    ] {
        assert!(upgrade.stdout.contains(want), "{want}: {upgrade}");
    }
    assert!(
        upgrade
            .stdout
            .lines()
            .any(|l| l.starts_with("  rack1-wk-01: ") && l.contains("v1.14.0")),
        "no installer output: {upgrade}"
    );
    for n in &names {
        let want = if n == "rack1-cp-02" { 2 } else { 1 };
        assert_eq!(talos(n).upgrade_calls(), want, "{n}: {upgrade}");
    }
    assert!(
        upgrade.stdout.contains("resuming upgrade-talos/v1.14.0"),
        "{upgrade}"
    );
    // The installer pull is in the node's timeline too (serve's events, as the dashboard
    // and `talboot status` read them).
    // Asked asynchronously: serve runs on this test's own runtime.
    let dashboard = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{}/api/dashboard", cli.admin))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let dashboard: serde_json::Value = serde_json::from_slice(&dashboard).unwrap();
    let timeline = dashboard["roles"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["nodes"].as_array().unwrap())
        .find(|n| n["name"] == "rack1-cp-02")
        .map(|n| n["timeline"].to_string())
        .unwrap();
    assert!(
        timeline.contains("upgrade: pulling the installer")
            && timeline.contains("upgrade: pulled the installer as"),
        "{timeline}"
    );
    // Run again: the record in serve's store says every node is done; nothing is upgraded
    // a second time.
    let again = cli
        .run("upgrade", &["--talos", "v1.14.0", "--node-timeout", "120"])
        .await;
    assert_eq!(again.code, Some(0), "{again}");
    assert!(
        again.stdout.contains("resuming upgrade-talos/v1.14.0"),
        "{again}"
    );
    for n in &names {
        let want = if n == "rack1-cp-02" { 2 } else { 1 };
        assert_eq!(talos(n).upgrade_calls(), want, "{n}: {again}");
    }
    across_the_contract(&cli, &names, &talos).await;
}

/// Day two across the contract (issue 26 item 5). The rack now runs Talos v1.14.0 with its
/// v1.13-contract configs; the operator moves the inventory to `talosVersion: v1.14.0` (and
/// the Kubernetes version it was upgraded to). The configs keep their contract: the plan
/// shows only the installer image the new version names, no document. Once applied, the
/// plan is clean. `--contract v1.14` shows the migration to the v1.14 documents per node and
/// `apply --contract v1.14` rolls it out; afterwards the plan without the flag is clean, the
/// configs now in the v1.14 contract.
async fn across_the_contract(
    cli: &Cli,
    names: &[String],
    talos: &impl Fn(&str) -> std::sync::Arc<talboot::sim::talos::FakeTalosNode>,
) {
    let inventory = std::fs::read_to_string(&cli.config).unwrap();
    let moved = inventory
        .replace("talosVersion: v1.13.9", "talosVersion: v1.14.0")
        .replace("kubernetesVersion: 1.36.3", "kubernetesVersion: 1.36.4");
    assert_ne!(moved, inventory);
    std::fs::write(&cli.config, moved).unwrap();
    let plan = cli.run("plan", &[]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    assert!(!plan.stdout.contains("document v1alpha1/"), "{plan}");
    for n in names {
        assert!(plan_line(&plan, n).contains(" change(s)"), "{plan}");
    }
    assert_eq!(
        plan.stdout
            .lines()
            .filter(|l| l.contains("~ machine.install.image: ")
                && l.contains(":v1.13.9 -> ")
                && l.ends_with(":v1.14.0"))
            .count(),
        names.len(),
        "{plan}"
    );
    assert!(
        plan.stdout.contains("contract: rack1-cp-01, "),
        "the kept contract is named: {plan}"
    );
    let apply = cli.run("apply", &["--mode", "no-reboot"]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    let plan = cli.run("plan", &[]).await;
    assert_eq!(plan.code, Some(0), "{plan}");
    for n in names {
        assert_eq!(plan_line(&plan, n), format!("{n}: no changes"), "{plan}");
    }

    // The migration, per node.
    let plan = cli.run("plan", &["--contract", "v1.14"]).await;
    assert_eq!(plan.code, Some(1), "{plan}");
    assert_eq!(
        plan.stdout
            .lines()
            .filter(|l| l.trim() == "+ document v1alpha1/UnattendedInstallConfig (added)")
            .count(),
        names.len(),
        "{plan}"
    );
    let apply = cli.run("apply", &["--contract", "v1.14"]).await;
    assert_eq!(apply.code, Some(0), "{apply}");
    let plan = cli.run("plan", &[]).await;
    assert_eq!(plan.code, Some(0), "{plan}");
    for n in names {
        assert_eq!(plan_line(&plan, n), format!("{n}: no changes"), "{plan}");
        let running = talos(n).running_config().unwrap();
        assert!(
            running.contains("kind: UnattendedInstallConfig"),
            "{n} runs a v1.14-contract config"
        );
    }
}

#[test]
fn plan_apply_through_serve_and_drift_with_the_binary() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let demo = Demo::start(DemoOptions {
            config: rack(),
            workdir: dir.path().join("run"),
            print_events: false,
            concurrency: talboot::provision::DEFAULT_CONCURRENCY,
            power_on_stagger: talboot::sim::demo::DEFAULT_POWER_ON_STAGGER,
            etcd: None,
        })
        .await
        .unwrap();
        let result = tokio::spawn({
            // The demo lives until the end of the test either way.
            let demo = std::sync::Arc::new(demo);
            let d = demo.clone();
            async move {
                let r = tokio::spawn(async move { day_two(&d).await }).await;
                (demo, r)
            }
        })
        .await
        .unwrap();
        let (demo, r) = result;
        if let Ok(demo) = std::sync::Arc::try_unwrap(demo) {
            demo.shutdown().await;
        }
        if let Err(e) = r {
            std::panic::resume_unwind(e.into_panic());
        }
    });
}
