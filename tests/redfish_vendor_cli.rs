//! Issue 24 items 5 and 8 through the CLI (`talboot node boot NAME network`), against the
//! vendor-like front over sushy-static (tests/support/redfish_front.rs) serving DMTF's
//! `public-rackmount1` system as shipped in the openstack/sushy 5.14.0 wheel. Only the
//! inventory and the binary are used, so these tests ran unchanged against the code before
//! the fix (and failed there: no `BootSourceOverrideMode` sent; "requires If-Match but sent
//! no ETag" after a stale weak ETag). Needs scripts/test-deps (TALBOOT_SKIP_SUSHY=1 skips).

mod support;

use std::path::Path;
use std::process::Command;

use support::redfish_front::{Front, FrontOptions, put, sample};

const SYSTEM: &str = "/redfish/v1/Systems/437XR1138R2";

fn rackmount1(tree: &Path) {
    put(tree, "/redfish/v1", &sample("unit/json_samples/root.json"));
    put(
        tree,
        "/redfish/v1/Systems",
        &sample("unit/json_samples/system_collection.json"),
    );
    put(tree, SYSTEM, &sample("unit/json_samples/system.json"));
}

/// `talboot node boot n1 network` for a node with `firmware: uefi` behind the front.
async fn boot(
    name: &str,
    opts: FrontOptions,
) -> Option<(std::process::Output, Front, tempfile::TempDir)> {
    if !support::redfish_front::available() {
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix(&format!("tb-rfc-{name}-"))
        .tempdir()
        .unwrap();
    let tree = dir.path().join("tree");
    rackmount1(&tree);
    let front = Front::start(&tree, &dir.path().join("static.log"), opts.clone()).await;
    let inv = dir.path().join("talboot.yaml");
    std::fs::write(
        &inv,
        format!(
            "cluster:\n  name: db\n  talosVersion: v1.13.9\n  kubernetesVersion: 1.36.3\n  \
             endpoint: https://127.0.66.100:6443\n  vip: 127.0.66.100\n  secrets:\n    file: secrets.age\nnetwork:\n  \
             interfaces: [lo]\n  mode: authoritative\n  subnet: 127.0.66.0/24\nboot:\n  delivery: push\nnodes:\n  \
             - name: n1\n    mac: \"02:00:00:42:00:01\"\n    role: controlplane\n    \
             address: 127.0.66.11/24\n    installDisk: /dev/sda\n    firmware: uefi\n    \
             power: {{kind: redfish, endpoint: \"{}\", user: {}, passwordEnv: TB_BMC_PASS}}\n",
            front.endpoint, opts.user
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let out = tokio::task::spawn_blocking({
        let (inv, state, pass) = (inv.clone(), state.clone(), opts.password.clone());
        move || {
            // TALBOOT_BIN runs another build (how these tests were shown failing on the
            // binary from before the fix).
            let bin = std::env::var("TALBOOT_BIN")
                .unwrap_or_else(|_| env!("CARGO_BIN_EXE_talboot").to_string());
            Command::new(bin)
                .args(["node", "boot", "n1", "network", "-c"])
                .arg(&inv)
                .arg("--state-dir")
                .arg(&state)
                .env("TB_BMC_PASS", pass)
                .env("TALBOOT_ADMIN", "127.0.0.1:9")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    Some((out, front, dir))
}

/// Item 5: the BMC's override mode reads Legacy; the node is UEFI; after `node boot network`
/// the BMC holds a one-time PXE override in UEFI mode, and the CLI says so.
#[tokio::test]
async fn node_boot_network_sets_the_uefi_override_mode_on_a_legacy_default_bmc() {
    let Some((out, front, _dir)) = boot("mode", FrontOptions::new(SYSTEM)).await else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    front.state(|s| {
        assert_eq!(s.target, "Pxe", "{:#?}", s.seen);
        assert_eq!(s.mode.as_deref(), Some("UEFI"), "{:#?}", s.seen);
    });
    assert!(stdout.contains("UEFI"), "{stdout}");
}

/// Item 8: the ComputerSystem's weak ETag goes stale on every read. The CLI's error says it
/// went stale, that talboot re-read it and tried again, and how many times; not that the BMC
/// "sent no ETag".
#[tokio::test]
async fn node_boot_after_stale_etags_says_they_went_stale_with_the_count() {
    let mut opts = FrontOptions::new(SYSTEM);
    opts.stale_reads = 1000;
    let Some((out, _front, _dir)) = boot("stale", opts).await else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("sent no ETag"), "{stderr}");
    assert!(
        stderr.contains("went stale") && stderr.contains("re-read") && stderr.contains("4 times"),
        "{stderr}"
    );
}
