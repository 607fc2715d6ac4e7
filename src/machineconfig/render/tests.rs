//! Render tests: golden files per role (rack and lab), schema validation of every rendered
//! config, and the behaviours the issue names (storage volumes, monitoring labels/taints, SATA
//! install disk, VIP only on control planes, Cilium settings, patch order, structural checks).
//!
//! Goldens are rendered with the committed test-only secrets bundle
//! (`tests/fixtures/test-only-secrets.yaml`); `TALBOOT_UPDATE_GOLDEN=1` rewrites them (and
//! creates the fixture when it is missing).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::inventory::{self, Inventory, Patch, PatchOrigin};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn update() -> bool {
    std::env::var_os("TALBOOT_UPDATE_GOLDEN").is_some()
}

/// The committed test-only bundle (generated once with `SecretsBundle::generate`).
pub(crate) fn fixture_secrets() -> SecretsBundle {
    let path = repo("tests/fixtures/test-only-secrets.yaml");
    if !path.exists() && update() {
        let b = SecretsBundle::generate(
            time::OffsetDateTime::now_utc(),
            &crate::machineconfig::secrets::GenerateOptions::default(),
        )
        .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let header = "# TEST ONLY: a fixed cluster secrets bundle for the golden-file tests (tests/golden/).\n\
                      # Generated once with SecretsBundle::generate; it is public, so never use it for a real cluster.\n";
        std::fs::write(&path, format!("{header}{}", b.to_yaml())).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    SecretsBundle::from_yaml(&text).unwrap()
}

pub(super) fn load(name: &str) -> Inventory {
    inventory::load_with_env(&repo(&format!("config/{name}")), &BTreeMap::new())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .inventory
}

fn render(inv: &Inventory, node: &str) -> ConfigBundle {
    let secrets = fixture_secrets();
    render_node(inv, &secrets, inv.node(node).unwrap()).unwrap()
}

fn doc<'a>(b: &'a ConfigBundle, kind: &str, name: Option<&str>) -> &'a Value {
    b.typed(kind, name)
        .unwrap_or_else(|| panic!("no {kind} {name:?} in {b:?}"))
}

fn at<'a>(b: &'a ConfigBundle, path: &[&str]) -> Option<&'a Value> {
    lookup(b.v1alpha1().unwrap(), path)
}

fn golden(file: &str, bundle: &ConfigBundle) {
    let path = repo(&format!("tests/golden/{file}"));
    let text = bundle.to_yaml().unwrap();
    if update() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with TALBOOT_UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    assert!(
        want == text,
        "{} differs from the rendered config; review and rerun with TALBOOT_UPDATE_GOLDEN=1\n{}",
        path.display(),
        crate::machineconfig::text_diff::line_diff(&want, &text)
    );
}

#[test]
fn goldens_per_role() {
    let rack = load("rack.yaml");
    golden("rack-controlplane.yaml", &render(&rack, "rack1-cp-01"));
    golden("rack-worker.yaml", &render(&rack, "rack1-wk-02"));
    golden("rack-storage.yaml", &render(&rack, "rack1-st-01"));
    golden("rack-monitoring.yaml", &render(&rack, "rack1-mon-01"));
    let lab = load("lab.yaml");
    golden("lab-controlplane.yaml", &render(&lab, "k8s-ctrl-01"));
}

#[test]
fn every_rendered_config_is_schema_valid() {
    let schema = crate::machineconfig::schema::embedded();
    let mut count = 0;
    let mut roles = std::collections::BTreeSet::new();
    for file in ["rack.yaml", "lab.yaml"] {
        let inv = load(file);
        for node in &inv.nodes {
            let b = render(&inv, &node.name.value);
            let report = schema.validate(&node.name.value, &b);
            assert!(
                report.violations.is_empty(),
                "{file}: {:#?}",
                report.violations
            );
            // Only `persist`, which talosctl gen config writes too; no deprecated field.
            assert_eq!(report.unchecked, vec!["persist"]);
            assert_eq!(report.deprecated, vec![], "{file}");
            roles.insert(node.role.as_str().to_owned());
            count += 1;
        }
    }
    assert_eq!(count, 16);
    // Every role of the examples.
    assert_eq!(
        roles.into_iter().collect::<Vec<_>>(),
        ["controlplane", "monitoring", "storage", "worker"]
    );
}

#[test]
fn ntp_servers_render_as_a_time_sync_document() {
    for (file, node, servers) in [
        ("rack.yaml", "rack1-wk-02", ["10.20.0.1"]),
        ("lab.yaml", "k8s-ctrl-01", ["10.0.40.1"]),
    ] {
        let inv = load(file);
        let b = render(&inv, node);
        let doc = doc(&b, "TimeSyncConfig", None);
        assert_eq!(doc["apiVersion"].as_str(), Some("v1alpha1"));
        let got: Vec<&str> = doc["ntp"]["servers"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(got, servers, "{file}");
        assert!(at(&b, &["machine", "time"]).is_none(), "{file}");
    }
    // No network.ntp: no document, Talos keeps its default.
    let mut inv = load("lab.yaml");
    inv.network.ntp.clear();
    assert!(
        render(&inv, "k8s-ctrl-01")
            .typed("TimeSyncConfig", None)
            .is_none()
    );
}

#[test]
fn machine_time_beside_time_sync_config_is_refused_as_talos_does() {
    let mut inv = load("lab.yaml");
    let patch = |text: &str| Patch {
        origin: PatchOrigin::File(PathBuf::from("legacy-time.yaml")),
        body: PatchBody::Merge(vec![yaml_serde::from_str(text).unwrap()]),
        keys: Default::default(),
    };
    inv.cluster
        .patches
        .push(patch("machine: {time: {servers: [10.0.40.1]}}"));
    let node = inv.node("k8s-ctrl-01").unwrap().clone();
    let err = render_node(&inv, &fixture_secrets(), &node).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("v1alpha1 `machine.time.servers`") && msg.contains("Talos refuses"),
        "{msg}"
    );
    // Without network.ntp the legacy field alone still renders (with a deprecation warning
    // from validation).
    inv.network.ntp.clear();
    let b = render_node(&inv, &fixture_secrets(), &node).unwrap();
    let report = crate::machineconfig::schema::embedded().validate("k8s-ctrl-01", &b);
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.deprecated.len(), 1);
    assert_eq!(report.deprecated[0].field, "machine.time");
}

#[test]
fn rendering_is_deterministic() {
    let rack = load("rack.yaml");
    let a = render(&rack, "rack1-st-02").to_yaml().unwrap();
    let b = render(&rack, "rack1-st-02").to_yaml().unwrap();
    assert_eq!(a, b);
}

#[test]
fn storage_nodes_carry_the_ephemeral_cap_and_garage_volume() {
    let rack = load("rack.yaml");
    for n in ["rack1-st-01", "rack1-st-02", "rack1-st-03"] {
        let b = render(&rack, n);
        let eph = doc(&b, "VolumeConfig", Some("EPHEMERAL"));
        assert_eq!(eph["provisioning"]["maxSize"], Value::from("50GiB"));
        let garage = doc(&b, "UserVolumeConfig", Some("garage-data"));
        assert_eq!(garage["filesystem"]["type"], Value::from("xfs"));
        assert_eq!(
            at(&b, &["machine", "install", "disk"]),
            Some(&Value::from("/dev/sda"))
        );
        assert_eq!(
            at(&b, &["machine", "nodeLabels", "talboot.dev/pool"]),
            Some(&Value::from("storage"))
        );
        // The boot NIC is the first MAC only.
        let alias = doc(&b, "LinkAliasConfig", Some(BOOT_LINK));
        let want = format!("3c:ec:ef:30:00:0{}", &n[n.len() - 1..]);
        assert!(alias["selector"]["match"].as_str().unwrap().contains(&want));
    }
    let worker = render(&rack, "rack1-wk-01");
    assert!(
        worker
            .typed("UserVolumeConfig", Some("garage-data"))
            .is_none()
    );
}

#[test]
fn monitoring_nodes_get_label_taint_and_relay_gateway() {
    let rack = load("rack.yaml");
    let b = render(&rack, "rack1-mon-02");
    assert_eq!(
        at(&b, &["machine", "nodeLabels", "pool"]),
        Some(&Value::from("monitoring"))
    );
    assert!(at(&b, &["machine", "nodeTaints"]).is_none());
    let taints = at(
        &b,
        &["machine", "kubelet", "extraConfig", "registerWithTaints"],
    )
    .unwrap();
    let want: Value =
        yaml_serde::from_str("- {key: dedicated, effect: NoSchedule, value: monitoring}").unwrap();
    assert_eq!(taints, &want);
    let link = doc(&b, "LinkConfig", Some(BOOT_LINK));
    assert_eq!(link["routes"][0]["gateway"], Value::from("10.20.1.1"));
    assert_eq!(
        link["addresses"][0]["address"],
        Value::from("10.20.1.42/24")
    );
}

#[test]
fn install_disk_or_selector() {
    let rack = load("rack.yaml");
    let sata = render(&rack, "rack1-wk-02");
    assert_eq!(
        at(&sata, &["machine", "install", "disk"]),
        Some(&Value::from("/dev/sda"))
    );
    let sel = render(&rack, "rack1-wk-03");
    assert!(at(&sel, &["machine", "install", "disk"]).is_none());
    let s = at(&sel, &["machine", "install", "diskSelector"]).unwrap();
    assert_eq!(s["model"], Value::from("Samsung SSD 980 PRO*"));
    assert_eq!(s["size"], Value::from("<= 600GB"));
    assert_eq!(s["type"], Value::from("nvme"));
    let cp = render(&rack, "rack1-cp-01");
    assert_eq!(
        at(&cp, &["machine", "install", "disk"]),
        Some(&Value::from("/dev/nvme0n1"))
    );
    assert_eq!(
        at(&cp, &["machine", "install", "image"]),
        Some(&Value::from(format!(
            "factory.talos.dev/metal-installer/{}:v1.13.9",
            crate::inventory::VANILLA_SCHEMATIC
        )))
    );
    let lab = load("lab.yaml");
    let l = render(&lab, "k8s-ctrl-02");
    assert_eq!(
        at(&l, &["machine", "install", "image"]),
        Some(&Value::from(
            "factory.talos.dev/metal-installer/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515:v1.13.9"
        ))
    );
}

#[test]
fn vip_hostname_and_cilium_on_control_planes_only() {
    let rack = load("rack.yaml");
    let cp = render(&rack, "rack1-cp-02");
    let vip = doc(&cp, "Layer2VIPConfig", Some("10.20.0.10"));
    assert_eq!(vip["link"], Value::from(BOOT_LINK));
    let host = doc(&cp, "HostnameConfig", None);
    assert_eq!(host["auto"], Value::from("off"));
    assert_eq!(host["hostname"], Value::from("rack1-cp-02"));
    assert_eq!(
        at(&cp, &["cluster", "network", "cni", "name"]),
        Some(&Value::from("none"))
    );
    assert_eq!(
        at(&cp, &["cluster", "proxy", "disabled"]),
        Some(&Value::Bool(true))
    );
    // The role patch for control planes.
    assert!(
        at(
            &cp,
            &["cluster", "etcd", "extraArgs", "listen-metrics-urls"]
        )
        .is_some()
    );

    let wk = render(&rack, "rack1-wk-04");
    assert!(wk.typed("Layer2VIPConfig", None).is_none());
    assert!(
        !wk.docs
            .iter()
            .any(|d| d.get("kind") == Some(&Value::from("Layer2VIPConfig")))
    );
    assert_eq!(
        at(&wk, &["cluster", "network", "cni", "name"]),
        Some(&Value::from("none"))
    );
    assert!(at(&wk, &["cluster", "apiServer"]).is_none());
    assert_eq!(at(&wk, &["machine", "ca", "key"]), Some(&Value::from("")));
    assert_eq!(at(&wk, &["cluster", "ca", "key"]), Some(&Value::from("")));
    assert!(at(&wk, &["cluster", "etcd"]).is_none());

    // Without Cilium, Talos's defaults (flannel, kube-proxy) stay.
    let mut plain = rack.clone();
    plain.addons.cilium = None;
    let b = render(&plain, "rack1-cp-01");
    assert!(at(&b, &["cluster", "network", "cni"]).is_none());
    assert!(at(&b, &["cluster", "proxy", "disabled"]).is_none());
}

#[test]
fn talhelper_cni_none_carries_over_without_the_cilium_addon() {
    // config/talconfig.yaml says `cniConfig: {name: none}`: its operator brings the CNI.
    let lab = load("talconfig.yaml");
    assert!(lab.cluster.external_cni);
    assert!(lab.addons.cilium.is_none());
    let name = lab.nodes[0].name.value.clone();
    let b = render(&lab, &name);
    assert_eq!(
        at(&b, &["cluster", "network", "cni", "name"]),
        Some(&Value::from("none"))
    );
    let mut flannel = lab.clone();
    flannel.cluster.external_cni = false;
    assert!(at(&render(&flannel, &name), &["cluster", "network", "cni"]).is_none());
}

#[test]
fn lab_extra_nic_and_scheduling_on_control_planes() {
    let lab = load("lab.yaml");
    let b = render(&lab, "k8s-ctrl-03");
    let alias = doc(&b, "LinkAliasConfig", Some("net1"));
    assert_eq!(
        alias["selector"]["match"],
        Value::from("mac(link.permanent_addr) == \"bc:24:11:70:00:03\"")
    );
    let link = doc(&b, "LinkConfig", Some("net1"));
    assert_eq!(link["mtu"], Value::from(9000));
    assert!(link.get("routes").is_none());
    assert_eq!(
        at(&b, &["cluster", "allowSchedulingOnControlPlanes"]),
        Some(&Value::Bool(true))
    );
    let resolver = doc(&b, "ResolverConfig", None);
    assert_eq!(
        resolver["nameservers"][0]["address"],
        Value::from("10.0.40.1")
    );
}

fn inline(text: &str) -> Patch {
    Patch {
        origin: PatchOrigin::File(PathBuf::from("test-inline.yaml")),
        body: crate::machineconfig::patch::parse_patch(text).unwrap(),
        keys: Default::default(),
    }
}

#[test]
fn patch_order_common_role_generated_node() {
    let mut rack = load("rack.yaml");
    // Common sets a sysctl; the role overrides it; the node overrides the role.
    rack.cluster
        .patches
        .push(inline("machine:\n  sysctls:\n    test.order: common\n"));
    rack.roles
        .get_mut("storage")
        .unwrap()
        .patches
        .push(inline("machine:\n  sysctls:\n    test.order: role\n"));
    let idx = rack
        .nodes
        .iter()
        .position(|n| n.name.value == "rack1-st-01")
        .unwrap();
    rack.nodes[idx].patches.push(inline(
        "machine:\n  sysctls:\n    test.order: node\n  install:\n    wipe: true\n",
    ));
    // A role patch cannot override the generated install disk; a node patch can.
    rack.roles
        .get_mut("storage")
        .unwrap()
        .patches
        .push(inline("machine:\n  install:\n    disk: /dev/vdz\n"));
    let b = render(&rack, "rack1-st-01");
    assert_eq!(
        at(&b, &["machine", "sysctls", "test.order"]),
        Some(&Value::from("node"))
    );
    assert_eq!(
        at(&b, &["machine", "install", "disk"]),
        Some(&Value::from("/dev/sda"))
    );
    assert_eq!(
        at(&b, &["machine", "install", "wipe"]),
        Some(&Value::Bool(true))
    );
    let st2 = render(&rack, "rack1-st-02");
    assert_eq!(
        at(&st2, &["machine", "sysctls", "test.order"]),
        Some(&Value::from("role"))
    );
    let wk = render(&rack, "rack1-wk-01");
    assert_eq!(
        at(&wk, &["machine", "sysctls", "test.order"]),
        Some(&Value::from("common"))
    );
}

#[test]
fn structural_checks_name_node_kind_and_field() {
    let mut rack = load("rack.yaml");
    let secrets = fixture_secrets();
    let idx = rack
        .nodes
        .iter()
        .position(|n| n.name.value == "rack1-wk-01")
        .unwrap();
    rack.nodes[idx].patches.push(inline(
        "machine:\n  nodeTaints:\n    a: b:NoSchedule\n  install:\n    diskSelector:\n      model: X*\n\
         cluster:\n  etcd:\n    extraArgs: {a: b}\n---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.20.0.99\nlink: net0\n",
    ));
    let err = render_node(&rack, &secrets, &rack.nodes[idx]).unwrap_err();
    let RenderError::Structure(problems) = &err else {
        panic!("{err}")
    };
    let fields: Vec<(&str, &str)> = problems
        .iter()
        .map(|p| (p.kind.as_str(), p.field.as_str()))
        .collect();
    assert_eq!(
        fields,
        vec![
            ("v1alpha1", "machine.install"),
            ("v1alpha1", "cluster.etcd"),
            ("v1alpha1", "machine.nodeTaints"),
            ("Layer2VIPConfig", "name"),
        ]
    );
    assert!(problems.iter().all(|p| p.node == "rack1-wk-01"));
    assert!(
        err.to_string()
            .contains("node rack1-wk-01: v1alpha1 `machine.install`: both")
    );

    // Worker labels in the kubernetes.io namespace are refused, except allowed ones.
    let mut rack = load("rack.yaml");
    let idx = rack
        .nodes
        .iter()
        .position(|n| n.name.value == "rack1-wk-04")
        .unwrap();
    rack.nodes[idx]
        .labels
        .insert("node-role.kubernetes.io/worker".into(), "".into());
    rack.nodes[idx]
        .labels
        .insert("node.kubernetes.io/pool".into(), "x".into());
    rack.nodes[idx]
        .labels
        .insert("topology.kubernetes.io/zone".into(), "a".into());
    let err = render_node(&rack, &secrets, &rack.nodes[idx]).unwrap_err();
    let RenderError::Structure(problems) = &err else {
        panic!("{err}")
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(
        problems[0].field,
        "machine.nodeLabels.node-role.kubernetes.io/worker"
    );
    // Control planes are not restricted that way (Talos labels them with admin credentials).
    let cp = rack
        .nodes
        .iter()
        .position(|n| n.name.value == "rack1-cp-01")
        .unwrap();
    rack.nodes[cp]
        .labels
        .insert("node-role.kubernetes.io/infra".into(), "".into());
    render_node(&rack, &secrets, &rack.nodes[cp]).unwrap();

    // Removing the install disk altogether is caught too.
    let mut rack = load("rack.yaml");
    let idx = rack
        .nodes
        .iter()
        .position(|n| n.name.value == "rack1-cp-01")
        .unwrap();
    rack.nodes[idx].patches.push(inline(
        "machine:\n  install:\n    disk:\n      $patch: delete\n",
    ));
    let err = render_node(&rack, &secrets, &rack.nodes[idx]).unwrap_err();
    assert!(
        err.to_string()
            .contains("neither `disk` nor `diskSelector`"),
        "{err}"
    );
}

#[test]
fn talos_contracts_v1_13_and_v1_14_only() {
    let secrets = fixture_secrets();
    let mut rack = load("rack.yaml");
    rack.cluster.talos_version.value = "v1.14.0".parse().unwrap();
    let b = render_node(&rack, &secrets, &rack.nodes[0]).unwrap();
    assert_eq!(
        doc(&b, "UnattendedInstallConfig", None)["installer"]["image"].as_str(),
        Some(
            format!(
                "factory.talos.dev/metal-installer/{}:v1.14.0",
                crate::inventory::VANILLA_SCHEMATIC
            )
            .as_str()
        )
    );
    rack.cluster.talos_version.value = "v1.15.0".parse().unwrap();
    let err = render_node(&rack, &secrets, &rack.nodes[0]).unwrap_err();
    assert!(matches!(err, RenderError::UnsupportedTalos { .. }), "{err}");
    rack.cluster.talos_version.value = "v1.12.4".parse().unwrap();
    assert!(render_node(&rack, &secrets, &rack.nodes[0]).is_err());
}

#[test]
fn base_matches_gen_config_shape_and_secrets() {
    let rack = load("rack.yaml");
    let secrets = fixture_secrets();
    let b = base_config(&rack, &secrets, MachineType::ControlPlane).unwrap();
    let main = b.v1alpha1().unwrap();
    let keys: Vec<&str> = main
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, ["version", "debug", "persist", "machine", "cluster"]);
    let decode =
        |v: &Value| String::from_utf8(STANDARD.decode(v.as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(decode(&main["machine"]["ca"]["crt"]), secrets.os_ca().crt);
    assert_eq!(decode(&main["machine"]["ca"]["key"]), secrets.os_ca().key);
    assert_eq!(
        decode(&main["cluster"]["etcd"]["ca"]["key"]),
        secrets.etcd_ca().key
    );
    assert_eq!(
        decode(&main["cluster"]["serviceAccount"]["key"]),
        secrets.k8s_service_account_key()
    );
    assert_eq!(
        main["cluster"]["token"],
        Value::from(secrets.bootstrap_token())
    );
    assert_eq!(
        main["machine"]["token"],
        Value::from(secrets.trustd_token())
    );
    assert_eq!(
        main["cluster"]["controlPlane"]["endpoint"],
        Value::from("https://10.20.0.10:6443")
    );
    assert_eq!(
        main["machine"]["kubelet"]["image"],
        Value::from("ghcr.io/siderolabs/kubelet:v1.36.3")
    );
    assert_eq!(b.docs.len(), 2);
    assert_eq!(
        doc(&b, "HostnameConfig", None)["auto"],
        Value::from("stable")
    );
}

/// Every node of both example inventories, rendered at their v1.13 `talosVersion`, is byte for
/// byte what talboot rendered before the v1.14 contract existed: the digests in
/// `tests/golden/v1.13-digests.txt` were written by the code at the commit before it.
#[test]
fn v1_13_output_is_unchanged_byte_for_byte() {
    use sha2::{Digest, Sha256};
    let mut lines = String::new();
    for file in ["rack.yaml", "lab.yaml"] {
        let inv = load(file);
        for node in &inv.nodes {
            let text = render(&inv, &node.name.value).to_yaml().unwrap();
            let digest = Sha256::digest(text.as_bytes());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            lines.push_str(&format!("{file} {} {hex}\n", node.name.value));
        }
    }
    let path = repo("tests/golden/v1.13-digests.txt");
    if update() && !path.exists() {
        std::fs::write(&path, &lines).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap();
    assert_eq!(lines.lines().count(), 16);
    assert!(
        want == lines,
        "{}",
        crate::machineconfig::text_diff::line_diff(&want, &lines)
    );
}

/// The rack and the lab with nothing but `talosVersion` changed to v1.14.0.
fn at_v1_14(file: &str) -> Inventory {
    let mut inv = load(file);
    inv.cluster.talos_version.value = "v1.14.0".parse().unwrap();
    inv
}

#[test]
fn the_13_node_rack_at_v1_14_passes_v1_14s_schema_with_no_deprecated_field() {
    use crate::talosfacts::contract::Contract;
    let schema = crate::machineconfig::schema::embedded_for(Contract::V1_14);
    let mut count = 0;
    for file in ["rack.yaml", "lab.yaml"] {
        let inv = at_v1_14(file);
        for node in &inv.nodes {
            let b = render(&inv, &node.name.value);
            let report = schema.validate(&node.name.value, &b);
            assert_eq!(report.violations, vec![], "{file} {}", node.name.value);
            assert_eq!(report.deprecated, vec![], "{file} {}", node.name.value);
            assert_eq!(report.unchecked, vec!["persist"], "{file}");
            // The v1alpha1 document keeps only what v1.14 gen config writes there.
            let main = b.v1alpha1().unwrap();
            let keys = |v: &Value| -> Vec<String> {
                v.as_mapping()
                    .unwrap()
                    .keys()
                    .map(|k| k.as_str().unwrap().to_owned())
                    .collect()
            };
            assert_eq!(
                keys(&main["machine"]),
                ["type", "token", "ca", "certSANs", "features"]
            );
            assert_eq!(keys(&main["machine"]["features"]), ["diskQuotaSupport"]);
            let cluster = keys(&main["cluster"]);
            assert!(
                cluster == ["token", "etcd"] || cluster == ["token"],
                "{cluster:?}"
            );
            count += 1;
        }
    }
    assert_eq!(count, 16);
}

#[test]
fn the_rack_at_v1_14_keeps_its_role_facts_in_the_v1_14_documents() {
    let rack = at_v1_14("rack.yaml");
    let installer = format!(
        "factory.talos.dev/metal-installer/{}:v1.14.0",
        crate::inventory::VANILLA_SCHEMATIC
    );

    // Control plane: gen config's labels and taint, the VIP, Cilium without kube-proxy.
    let cp = render(&rack, "rack1-cp-01");
    let kinds: Vec<&str> = cp
        .docs
        .iter()
        .filter_map(|d| d.get("kind").and_then(Value::as_str))
        .collect();
    // Upstream's order for the documents gen config writes (generate/init.go, kubernetes.go),
    // the translated SysctlConfig in its place; talboot's own documents after them.
    assert_eq!(
        kinds[..11],
        [
            "DiscoveryServiceConfig",
            "DiscoveryIdentityConfig",
            "UnattendedInstallConfig",
            "ResolverConfig",
            "SysctlConfig",
            "VolumeConfig",
            "FilesystemTrimConfig",
            "SecurityProfileConfig",
            "HostnameConfig",
            "KubeClusterConfig",
            "KubeNodeConfig",
        ]
    );
    assert_eq!(
        kinds[kinds.len() - 5..],
        [
            "KubeCoreDNSConfig",
            "LinkAliasConfig",
            "LinkConfig",
            "TimeSyncConfig",
            "Layer2VIPConfig",
        ]
    );
    let node = doc(&cp, "KubeNodeConfig", None);
    assert_eq!(
        node["labels"]["node-role.kubernetes.io/control-plane"].as_str(),
        Some("")
    );
    assert_eq!(
        node["taints"]["node-role.kubernetes.io/control-plane"].as_str(),
        Some("NoSchedule")
    );
    assert_eq!(
        doc(&cp, "Layer2VIPConfig", Some("10.20.0.10"))["link"].as_str(),
        Some("net0")
    );
    assert!(
        cp.typed("KubeFlannelCNIConfig", None).is_none(),
        "Cilium: no CNI"
    );
    assert_eq!(
        doc(&cp, "KubeProxyConfig", None)["enabled"],
        Value::Bool(false)
    );
    assert_eq!(
        doc(&cp, "KubeClusterConfig", None)["endpoint"].as_str(),
        Some("https://10.20.0.10:6443")
    );
    let ui = doc(&cp, "UnattendedInstallConfig", None);
    assert_eq!(
        ui["provisioning"]["diskSelector"]["match"].as_str(),
        Some("disk.dev_path == \"/dev/nvme0n1\"")
    );
    assert_eq!(ui["installer"]["image"].as_str(), Some(installer.as_str()));
    // The rack's common patch (`machine.sysctls`) lands in SysctlConfig on every node.
    assert_eq!(
        doc(&cp, "SysctlConfig", None)["params"]["vm.max_map_count"].as_str(),
        Some("262144")
    );
    // The control-plane patch's etcd arguments stay in v1alpha1 (still in v1.14's schema).
    assert!(
        at(
            &cp,
            &["cluster", "etcd", "extraArgs", "listen-metrics-urls"]
        )
        .is_some()
    );
    // Host DNS and the inventory's resolvers share one ResolverConfig.
    let resolver = doc(&cp, "ResolverConfig", None);
    assert_eq!(
        resolver["hostDNS"]["forwardKubeDNSToHost"],
        Value::Bool(true)
    );
    assert_eq!(
        resolver["nameservers"][0]["address"].as_str(),
        Some("10.20.0.1")
    );
    assert_eq!(
        doc(&cp, "TimeSyncConfig", None)["ntp"]["servers"][0].as_str(),
        Some("10.20.0.1")
    );

    // Monitoring worker: its label and taint in KubeNodeConfig, no VIP, no control-plane kinds.
    let mon = render(&rack, "rack1-mon-01");
    let node = doc(&mon, "KubeNodeConfig", None);
    assert_eq!(node["labels"]["pool"].as_str(), Some("monitoring"));
    assert_eq!(
        node["taints"]["dedicated"].as_str(),
        Some("monitoring:NoSchedule")
    );
    assert!(mon.typed("Layer2VIPConfig", Some("10.20.0.10")).is_none());
    assert!(mon.typed("KubeAPIServerConfig", None).is_none());
    assert!(
        doc(&mon, "KubeAPIServerCAConfig", None)
            .get("issuingCA")
            .is_none()
    );

    // Storage: the EPHEMERAL cap merges into gen config's EPHEMERAL document.
    let st = render(&rack, "rack1-st-01");
    let eph = doc(&st, "VolumeConfig", Some("EPHEMERAL"));
    assert_eq!(eph["provisioning"]["maxSize"].as_str(), Some("50GiB"));
    assert_eq!(eph["mount"]["secure"], Value::Bool(true));
    assert!(st.typed("UserVolumeConfig", Some("garage-data")).is_some());
    assert_eq!(
        doc(&st, "KubeNodeConfig", None)["labels"]["talboot.dev/pool"].as_str(),
        Some("storage")
    );

    // The selector node: Talos's own CEL form of the legacy selector.
    let wk3 = render(&rack, "rack1-wk-03");
    assert_eq!(
        doc(&wk3, "UnattendedInstallConfig", None)["provisioning"]["diskSelector"]["match"]
            .as_str(),
        Some(
            "disk.size <= 600000000000u && glob(\"Samsung SSD 980 PRO*\", disk.model) && \
             disk.transport != \"\" &&\ndisk.transport == \"nvme\" && !disk.readonly && !disk.cdrom"
        )
    );
}

#[test]
fn lab_at_v1_14_moves_the_kubelet_patch_and_allows_scheduling() {
    let lab = at_v1_14("lab.yaml");
    let b = render(&lab, "k8s-ctrl-01");
    // patches/common.yaml sets machine.kubelet.extraArgs.
    assert_eq!(
        doc(&b, "KubeletConfig", None)["extraArgs"]["rotate-server-certificates"].as_str(),
        Some("true")
    );
    assert!(at(&b, &["machine", "kubelet"]).is_none());
    // allowSchedulingOnControlPlanes: no control-plane taint (generate/kubernetes.go).
    assert!(doc(&b, "KubeNodeConfig", None).get("taints").is_none());
    // Cilium with kube-proxy replacement: no Flannel, kube-proxy off.
    assert!(b.typed("KubeFlannelCNIConfig", None).is_none());
    // Without the add-on, gen config's Flannel.
    let mut lab = lab;
    lab.addons.cilium = None;
    let b = render(&lab, "k8s-ctrl-01");
    assert_eq!(
        doc(&b, "KubeFlannelCNIConfig", None)["backendType"].as_str(),
        Some("vxlan")
    );
    assert!(doc(&b, "KubeProxyConfig", None).get("enabled").is_none());
}

#[test]
fn a_legacy_field_with_no_v1_14_document_next_to_its_document_is_refused() {
    let mut lab = at_v1_14("lab.yaml");
    lab.cluster.patches.push(Patch {
        origin: PatchOrigin::File(PathBuf::from("mounts.yaml")),
        body: PatchBody::Merge(vec![
            yaml_serde::from_str("machine: {kubelet: {extraMounts: [{destination: /var/x, type: bind, source: /var/x}]}}")
                .unwrap(),
        ]),
        keys: Default::default(),
    });
    let node = lab.node("k8s-ctrl-01").unwrap().clone();
    let msg = render_node(&lab, &fixture_secrets(), &node)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`machine.kubelet`")
            && msg.contains("KubeletConfig")
            && msg.contains("k8s/kubelet.go"),
        "{msg}"
    );
}
