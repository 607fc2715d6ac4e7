//! Rule-by-rule tests of inventory loading: each rule's exact message and location, the three
//! shipped examples, and the talhelper mapping.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;

mod storage;

const BASE: &str = "\
cluster:
  name: t
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://10.0.40.100:6443
  vip: 10.0.40.100
network:
  interfaces: [eth0]
  subnet: 10.0.40.0/24
  gateway: 10.0.40.1
  pool: {start: 10.0.40.200, end: 10.0.40.250}
nodes:
  - name: cp-1
    mac: aa:00:00:00:00:01
    role: controlplane
    address: 10.0.40.11/24
    installDisk: /dev/sda
  - name: cp-2
    mac: aa:00:00:00:00:02
    role: controlplane
    address: 10.0.40.12/24
    installDisk: /dev/sda
  - name: cp-3
    mac: aa:00:00:00:00:03
    role: controlplane
    address: 10.0.40.13/24
    installDisk: /dev/sda
  - name: wk-1
    mac: aa:00:00:00:00:04
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
";

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    fn load(&self, text: &str) -> Result<Loaded, LoadError> {
        let p = self.file("talboot.yaml", text);
        load_with_env(&p, &BTreeMap::new())
    }
}

/// Load `text` and return every diagnostic as `line:col: path: message`.
fn diags(text: &str) -> Vec<String> {
    let case = Case::new();
    let list = match case.load(text) {
        Ok(l) => l.warnings,
        Err(LoadError::Invalid { diagnostics, .. }) => diagnostics,
        Err(e) => panic!("{e}"),
    };
    list.sorted()
        .iter()
        .map(|d| {
            format!(
                "{}:{}: {}{}: {}",
                d.loc.line,
                d.loc.column,
                if d.severity == Severity::Warning {
                    "warning: "
                } else {
                    ""
                },
                d.path,
                d.message
            )
        })
        .collect()
}

fn with(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE lacks {from:?}");
    BASE.replacen(from, to, 1)
}

#[test]
fn base_is_valid() {
    let case = Case::new();
    let loaded = case.load(BASE).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let inv = loaded.inventory;
    assert_eq!(inv.nodes.len(), 4);
    assert_eq!(inv.control_planes().count(), 3);
    assert_eq!(
        inv.node_by_mac("aa:00:00:00:00:04".parse().unwrap())
            .unwrap()
            .name
            .as_str(),
        "wk-1"
    );
    assert_eq!(inv.cluster.pod_subnets[0].to_string(), "10.244.0.0/16");
    assert_eq!(inv.network.lease_time.as_secs(), 3600);
}

#[test]
fn unknown_field_with_suggestion() {
    let d = diags(&with(
        "    address: 10.0.40.21/24",
        "    address: 10.0.40.21/24\n    instalDisk: /dev/sdb",
    ));
    assert_eq!(d, ["32:5: nodes[3].instalDisk: unknown field `instalDisk`"]);
    let case = Case::new();
    let Err(LoadError::Invalid { diagnostics, .. }) = case.load(&with(
        "  gateway: 10.0.40.1\n",
        "  gateway: 10.0.40.1\n  gatway: 10.0.40.1\n",
    )) else {
        panic!()
    };
    let hint = diagnostics.iter().next().unwrap().hint.clone().unwrap();
    assert!(hint.starts_with("did you mean `gateway`?"), "{hint}");
}

#[test]
fn duplicate_mac() {
    let d = diags(&with("aa:00:00:00:00:04", "aa:00:00:00:00:01"));
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].starts_with(
        "29:10: nodes[3].macs[0]: duplicate MAC aa:00:00:00:00:01 (also nodes[0].macs[0] at "
    ));
    assert!(d[0].ends_with("talboot.yaml:14:10)"));
}

#[test]
fn duplicate_hostname_and_address() {
    let text = with("name: wk-1", "name: cp-1").replacen("10.0.40.21/24", "10.0.40.11/24", 1);
    let d = diags(&text);
    assert_eq!(d.len(), 2, "{d:?}");
    assert!(
        d[0].starts_with("28:11: nodes[3].name: duplicate hostname `cp-1` (also nodes[0] at "),
        "{d:?}"
    );
    assert!(
        d[1].starts_with(
            "31:14: nodes[3].address: duplicate address 10.0.40.11 (also nodes[0].address at "
        ),
        "{d:?}"
    );
}

#[test]
fn address_outside_subnet_and_inside_pool() {
    let d = diags(&with("10.0.40.21/24", "10.0.50.21/24"));
    assert_eq!(
        d,
        ["31:14: nodes[3].address: address 10.0.50.21 is outside the subnet 10.0.40.0/24"]
    );
    let d = diags(&with("10.0.40.21/24", "10.0.40.210/24"));
    assert_eq!(d.len(), 1);
    assert!(d[0].starts_with("31:14: nodes[3].address: address 10.0.40.210 is inside the dynamic pool 10.0.40.200-10.0.40.250 (at "), "{d:?}");
}

#[test]
fn gateway_outside_subnet() {
    let d = diags(&with("  gateway: 10.0.40.1", "  gateway: 10.0.41.1"));
    assert_eq!(
        d,
        ["10:12: network.gateway: gateway 10.0.41.1 is outside the subnet 10.0.40.0/24"]
    );
    let d = diags(&with(
        "    address: 10.0.40.21/24",
        "    address: 10.0.40.21/24\n    gateway: 192.168.1.1",
    ));
    assert_eq!(
        d,
        ["32:14: nodes[3].gateway: gateway 192.168.1.1 is outside the node's subnet 10.0.40.0/24"]
    );
}

#[test]
fn vip_rules() {
    let text = with("  vip: 10.0.40.100", "  vip: 10.0.41.100")
        .replace("https://10.0.40.100", "https://10.0.40.11");
    assert_eq!(
        diags(&text),
        ["6:8: cluster.vip: VIP 10.0.41.100 is not in the subnet 10.0.40.0/24"]
    );
    let text = with("  vip: 10.0.40.100", "  vip: 10.0.40.21")
        .replace("https://10.0.40.100", "https://10.0.40.21");
    let d = diags(&text);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        d[0].starts_with(
            "6:8: cluster.vip: VIP 10.0.40.21 is also the address of nodes[3].address (at "
        ),
        "{d:?}"
    );
}

#[test]
fn endpoint_must_be_vip_or_control_plane() {
    let d = diags(&with("https://10.0.40.100:6443", "https://10.0.40.21:6443"));
    assert_eq!(
        d,
        [
            "5:13: cluster.endpoint: endpoint host 10.0.40.21 is neither the VIP nor a control-plane address"
        ]
    );
    // A DNS name cannot be checked offline and is accepted.
    assert!(
        diags(&with(
            "https://10.0.40.100:6443",
            "https://k8s.example.com:6443"
        ))
        .is_empty()
    );
}

#[test]
fn control_plane_counts() {
    let text = BASE.replace("role: controlplane", "role: worker");
    assert_eq!(
        diags(&text),
        ["13:3: nodes: no control-plane node: a cluster needs at least one"]
    );
    let text = with("    role: worker", "    role: controlplane");
    assert_eq!(
        diags(&text),
        [
            "13:3: warning: nodes: 4 control-plane nodes: an even number adds no etcd fault tolerance over 3"
        ]
    );
}

#[test]
fn unknown_role_and_extends_cycle() {
    let d = diags(&with("role: worker", "role: wroker"));
    assert_eq!(d, ["30:11: nodes[3].role: unknown role `wroker`"]);
    let text = format!("{BASE}roles:\n  a:\n    extends: b\n  b:\n    extends: a\n")
        .replace("role: worker", "role: a");
    let d = diags(&text);
    assert!(
        d.iter()
            .any(|m| m
                == "37:14: roles.b.extends: role `a` is part of an extends cycle: a -> b -> a"),
        "{d:?}"
    );
    let text = format!("{BASE}roles:\n  big:\n    extends: nothere\n")
        .replace("role: worker", "role: big");
    assert_eq!(
        diags(&text),
        ["35:14: roles.big.extends: unknown role `nothere`"]
    );
}

#[test]
fn role_chains_compose() {
    let case = Case::new();
    case.file("p/worker.yaml", "machine:\n  sysctls:\n    a: \"1\"\n");
    case.file("p/mon.yaml", "machine:\n  sysctls:\n    b: \"2\"\n");
    let text = format!(
        "{BASE}roles:\n  worker:\n    type: worker\n    patches: [p/worker.yaml]\n    labels: {{tier: general}}\n  monitoring:\n    extends: worker\n    patches: [p/mon.yaml]\n    labels: {{pool: monitoring}}\n    taints: [dedicated=monitoring:NoSchedule]\n"
    )
    .replace("role: worker", "role: monitoring");
    let inv = case.load(&text).unwrap().inventory;
    let r = &inv.roles["monitoring"];
    assert_eq!(r.machine_type, MachineType::Worker);
    assert_eq!(r.chain, ["worker", "monitoring"]);
    assert_eq!(r.labels.get("tier").map(String::as_str), Some("general"));
    assert_eq!(r.labels.get("pool").map(String::as_str), Some("monitoring"));
    assert_eq!(r.taints[0].to_string(), "dedicated=monitoring:NoSchedule");
    let files: Vec<String> = r
        .patches
        .iter()
        .map(|p| match &p.origin {
            PatchOrigin::File(f) => f.file_name().unwrap().to_string_lossy().into_owned(),
            PatchOrigin::Inline(_) => "inline".into(),
        })
        .collect();
    assert_eq!(files, ["worker.yaml", "mon.yaml"]);
}

/// `secureBoot` on a role reaches its nodes and those of roles extending it; a node's own
/// value wins; a node neither sets is off; a non-boolean is refused at its line.
#[test]
fn secure_boot_folds_from_the_role_chain_and_the_node_wins() {
    let case = Case::new();
    let nodes = BASE.replace(
        "    address: 10.0.40.21/24\n",
        "    address: 10.0.40.21/24\n    secureBoot: false\n",
    );
    let text = format!(
        "{nodes}  - name: mon-1\n    mac: aa:00:00:00:00:05\n    role: monitoring\n    \
         address: 10.0.40.31/24\n    installDisk: /dev/sda\nroles:\n  worker:\n    type: \
         worker\n    secureBoot: true\n  monitoring:\n    extends: worker\n"
    );
    let inv = case.load(&text).unwrap().inventory;
    let on = |n: &str| inv.node(n).unwrap().secure_boot();
    assert!(!on("cp-1"), "never set: off");
    assert!(
        !on("wk-1"),
        "the node's own false wins over its role's true"
    );
    assert!(on("mon-1"), "inherited through extends");
    let set_at = inv.node("mon-1").unwrap().secure_boot.as_ref().unwrap();
    assert!(set_at.loc.line > 40, "the role's line: {:?}", set_at.loc);
    let d = diags(&with(
        "    installDisk: /dev/sda\n",
        "    installDisk: /dev/sda\n    secureBoot: yes please\n",
    ));
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].contains("nodes[0].secureBoot"), "{d:?}");
}

#[test]
fn install_disk_choice() {
    let d = diags(&with(
        "    address: 10.0.40.21/24\n    installDisk: /dev/sda",
        "    address: 10.0.40.21/24\n    installDisk: /dev/sda\n    diskSelector: {model: X}",
    ));
    assert_eq!(
        d,
        ["33:19: nodes[3].diskSelector: both installDisk and diskSelector are set"]
    );
    let d = diags(&with(
        "    address: 10.0.40.21/24\n    installDisk: /dev/sda",
        "    address: 10.0.40.21/24",
    ));
    assert_eq!(
        d,
        ["28:5: nodes[3]: no install disk: set installDisk or diskSelector"]
    );
    let d = diags(&with(
        "    address: 10.0.40.21/24\n    installDisk: /dev/sda",
        "    address: 10.0.40.21/24\n    diskSelector: {name: nvme0n1}",
    ));
    assert!(
        d.iter()
            .any(|m| m.contains("Talos rejects install disk selectors on `name`")),
        "{d:?}"
    );
}

#[test]
fn patch_files_and_shapes() {
    let d = diags(&with(
        "  vip: 10.0.40.100\n",
        "  vip: 10.0.40.100\n  patches: [missing.yaml]\n",
    ));
    assert_eq!(d.len(), 1);
    assert!(
        d[0].starts_with("7:13: cluster.patches[0]: cannot read patch file "),
        "{d:?}"
    );

    let case = Case::new();
    case.file("scalar.yaml", "just a string\n");
    case.file(
        "ops.yaml",
        "- op: add\n  path: /machine/install/wipe\n  value: true\n",
    );
    case.file(
        "multi.yaml",
        "machine: {}\n---\napiVersion: v1alpha1\nkind: VolumeConfig\nname: EPHEMERAL\n",
    );
    case.file("badop.yaml", "- op: ad\n  path: machine\n");
    let text = with(
        "  vip: 10.0.40.100\n",
        "  vip: 10.0.40.100\n  patches: [scalar.yaml, ops.yaml, multi.yaml, badop.yaml, {machine: {install: {wipe: true}}}]\n",
    );
    let Err(LoadError::Invalid { diagnostics, .. }) = case.load(&text) else {
        panic!("expected errors")
    };
    let msgs: Vec<String> = diagnostics
        .sorted()
        .iter()
        .map(|d| {
            format!(
                "{}:{}: {}: {}",
                d.loc.file.file_name().unwrap().to_string_lossy(),
                d.loc.line,
                d.path,
                d.message
            )
        })
        .collect();
    assert_eq!(
        msgs,
        [
            "badop.yaml:1: cluster.patches[3][0].op: `ad` is not a valid value",
            "badop.yaml:2: cluster.patches[3][0].path: JSON pointer `machine` must start with /",
            "scalar.yaml:1: cluster.patches[0]: patch is neither a YAML mapping (strategic merge) nor a JSON-patch list",
        ]
    );
}

#[test]
fn patch_kinds_are_classified() {
    let case = Case::new();
    case.file(
        "ops.yaml",
        "- op: add\n  path: /machine/install/wipe\n  value: true\n",
    );
    case.file(
        "multi.yaml",
        "machine: {}\n---\napiVersion: v1alpha1\nkind: VolumeConfig\nname: EPHEMERAL\n",
    );
    let text = with(
        "  vip: 10.0.40.100\n",
        "  vip: 10.0.40.100\n  patches:\n    - \"@ops.yaml\"\n    - multi.yaml\n    - {machine: {install: {wipe: true}}}\n    - |\n      cluster:\n        proxy:\n          disabled: true\n",
    );
    let inv = case.load(&text).unwrap().inventory;
    let kinds: Vec<(bool, usize)> = inv
        .cluster
        .patches
        .iter()
        .map(|p| match &p.body {
            PatchBody::Json(ops) => (true, ops.len()),
            PatchBody::Merge(docs) => (false, docs.len()),
        })
        .collect();
    assert_eq!(kinds, [(true, 1), (false, 2), (false, 1), (false, 1)]);
}

#[test]
fn invalid_strings() {
    let text = BASE
        .replacen("aa:00:00:00:00:04", "aa:00:00:00:04", 1)
        .replacen("10.0.40.0/24", "10.0.40.0/33", 1)
        .replacen("v1.13.9", "v1.13", 1);
    let d = diags(&text);
    assert_eq!(
        d,
        [
            "3:17: cluster.talosVersion: `v1.13` is not a version (unexpected end of input while parsing minor version number)",
            "9:11: network.subnet: `10.0.40.0/33` is not an IPv4 address with prefix length (invalid IP address syntax)",
            "29:10: nodes[3].mac: `aa:00:00:00:04` is not a MAC address (`aa:00:00:00:04` is not a MAC address)",
        ]
    );
    let d = diags(&with("  subnet: 10.0.40.0/24", "  subnet: 10.0.40.5/24"));
    assert_eq!(
        d,
        ["9:11: network.subnet: `10.0.40.5/24` has host bits set"]
    );
}

#[test]
fn discover_needs_a_pool() {
    let text = with("  pool: {start: 10.0.40.200, end: 10.0.40.250}\n", "")
        + "boot:\n  unknownMachines: discover\n";
    assert_eq!(
        diags(&text),
        [
            "9:11: network.pool: boot.unknownMachines is `discover` but there is no dynamic pool to give unknown machines an address"
        ]
    );
}

#[test]
fn pool_rules() {
    let d = diags(&with(
        "start: 10.0.40.200, end: 10.0.40.250",
        "start: 10.0.40.250, end: 10.0.40.200",
    ));
    assert_eq!(
        d,
        ["11:9: network.pool: pool start 10.0.40.250 is after its end 10.0.40.200"]
    );
    let d = diags(&with("end: 10.0.40.250", "end: 10.0.41.250"));
    assert_eq!(
        d,
        ["11:9: network.pool: pool 10.0.40.200-10.0.41.250 is not inside the subnet 10.0.40.0/24"]
    );
}

#[test]
fn relayed_nodes_are_in_a_served_subnet() {
    let text = with(
        "  pool:",
        "  relays:\n    - subnet: 10.0.50.0/24\n      gateway: 10.0.50.1\n  pool:",
    )
    .replacen("10.0.40.21/24", "10.0.50.21/24", 1);
    assert!(diags(&text).is_empty());
    let text = with(
        "  pool:",
        "  relays:\n    - subnet: 10.0.40.128/25\n  pool:",
    );
    let d = diags(&text);
    assert!(
        d.iter()
            .any(|m| m.contains("relayed subnet 10.0.40.128/25 overlaps 10.0.40.0/24")),
        "{d:?}"
    );
}

#[test]
fn syntax_errors_are_located() {
    let d = diags("cluster:\n  name: [unclosed\n");
    assert_eq!(d.len(), 1);
    assert!(d[0].contains(": invalid YAML: "), "{d:?}");
    let d = diags("a: 1\na: 2\n");
    assert!(d[0].starts_with("2:"), "{d:?}");
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name)
}

#[test]
fn example_rack_has_13_nodes_in_4_roles() {
    let loaded = load_with_env(&example("rack.yaml"), &BTreeMap::new()).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let inv = loaded.inventory;
    assert_eq!(inv.nodes.len(), 13);
    let mut by_role: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &inv.nodes {
        *by_role.entry(n.role.as_str()).or_default() += 1;
    }
    assert_eq!(
        by_role.into_iter().collect::<Vec<_>>(),
        [
            ("controlplane", 3),
            ("monitoring", 3),
            ("storage", 3),
            ("worker", 4)
        ]
    );
    let mon = inv.node("rack1-mon-01").unwrap();
    let role = inv.role_of(mon);
    assert_eq!(role.labels["pool"], "monitoring");
    assert_eq!(
        role.taints[0].to_string(),
        "dedicated=monitoring:NoSchedule"
    );
    assert_eq!(
        inv.node("rack1-wk-02").unwrap().install,
        InstallTarget::Disk("/dev/sda".into())
    );
    assert!(matches!(
        inv.node("rack1-wk-03").unwrap().install,
        InstallTarget::Selector(_)
    ));
    let storage = inv.role_of(inv.node("rack1-st-01").unwrap());
    let PatchBody::Merge(docs) = &storage.patches[0].body else {
        panic!()
    };
    let kinds: Vec<&str> = docs
        .iter()
        .filter_map(|d| d.get("kind").and_then(|k| k.as_str()))
        .collect();
    assert_eq!(kinds, ["VolumeConfig", "UserVolumeConfig"]);
}

#[test]
fn example_lab_and_talconfig_agree() {
    let lab = load_with_env(&example("lab.yaml"), &BTreeMap::new())
        .unwrap()
        .inventory;
    let tal = load_with_env(&example("talconfig.yaml"), &BTreeMap::new()).unwrap();
    assert_eq!(
        tal.warnings.len(),
        1,
        "only the derived-network note: {:?}",
        tal.warnings
    );
    let tal = tal.inventory;
    assert_eq!(tal.format, SourceFormat::Talhelper);
    assert_eq!(lab.nodes.len(), tal.nodes.len());
    for (a, b) in lab.nodes.iter().zip(&tal.nodes) {
        assert_eq!(a.name.value, b.name.value);
        assert_eq!(a.macs[0].value, b.macs[0].value);
        assert_eq!(a.address.value, b.address.value);
        assert_eq!(a.install, b.install);
        assert_eq!(a.interfaces[0].mac.value, b.interfaces[0].mac.value);
        assert_eq!(a.interfaces[0].mtu, b.interfaces[0].mtu);
        assert_eq!(lab.role_of(a).machine_type, tal.role_of(b).machine_type);
    }
    assert_eq!(
        lab.cluster.vip.as_ref().unwrap().value,
        tal.cluster.vip.as_ref().unwrap().value
    );
    assert_eq!(
        lab.cluster.installer.schematic_id(),
        tal.cluster.installer.schematic_id()
    );
    assert_eq!(
        tal.network.gateway.as_ref().unwrap().value.to_string(),
        "10.0.40.1"
    );
}

const TAL: &str = "\
clusterName: tal
talosVersion: v1.13.9
kubernetesVersion: v1.36.3
endpoint: https://${VIP}:6443
additionalApiServerCertSans: [api.example.com]
worker:
  nodeLabels:
    pool: general
  nodeTaints:
    dedicated: monitoring:NoSchedule
  patches:
    - |-
      machine:
        install:
          wipe: true
nodes:
  - hostname: cp-1
    ipAddress: 10.0.40.11
    controlPlane: true
    installDiskSelector:
      model: \"WD*\"
      modalias: x
    networkInterfaces:
      - deviceSelector: {hardwareAddr: aa:00:00:00:00:01}
        addresses: [10.0.40.11/24]
        vip: {ip: 10.0.40.100}
  - hostname: wk-1
    ipAddress: 10.0.40.21
    installDisk: /dev/sdb
    kernelModules: [{name: br_netfilter}]
    networkInterfaces:
      - deviceSelector: {hardwareAddr: aa:00:00:00:00:02}
        addresses: [10.0.40.21/24]
";

#[test]
fn talhelper_mapping() {
    let case = Case::new();
    let p = case.file("talconfig.yaml", TAL);
    let env: BTreeMap<String, String> = [("VIP".to_string(), "10.0.40.100".to_string())].into();
    let loaded = load_with_env(&p, &env).unwrap();
    let inv = &loaded.inventory;
    assert_eq!(
        inv.cluster.endpoint.value.to_string(),
        "https://10.0.40.100:6443"
    );
    let cp = inv.node("cp-1").unwrap();
    assert_eq!(inv.role_of(cp).machine_type, MachineType::ControlPlane);
    let InstallTarget::Selector(sel) = &cp.install else {
        panic!()
    };
    assert_eq!(sel.model.as_deref(), Some("WD*"));
    let wk = inv.node("wk-1").unwrap();
    let role = inv.role_of(wk);
    assert_eq!(role.labels["pool"], "general");
    assert_eq!(
        role.taints[0].to_string(),
        "dedicated=monitoring:NoSchedule"
    );
    assert_eq!(role.patches.len(), 1);
    let warned: Vec<String> = loaded.warnings.iter().map(|d| d.path.clone()).collect();
    for field in [
        "additionalApiServerCertSans",
        "nodes[0].installDiskSelector.modalias",
        "nodes[1].kernelModules",
    ] {
        assert!(
            warned.iter().any(|w| w == field),
            "{field} not warned: {warned:?}"
        );
    }
}

#[test]
fn talhelper_unset_variable() {
    let case = Case::new();
    let p = case.file("talconfig.yaml", TAL);
    let Err(LoadError::Invalid { diagnostics, .. }) = load_with_env(&p, &BTreeMap::new()) else {
        panic!()
    };
    let all: Vec<String> = diagnostics.iter().map(|d| d.to_string()).collect();
    assert!(
        all.iter().any(|m| m.contains(
            "talconfig.yaml:4:11: error: endpoint: environment variable `VIP` is unset or empty"
        )),
        "{all:?}"
    );
}

#[test]
fn talhelper_talenv_file() {
    let case = Case::new();
    case.file("talenv.yaml", "VIP: 10.0.40.100\n");
    let p = case.file("talconfig.yaml", TAL);
    assert!(load_with_env(&p, &BTreeMap::new()).is_ok());
}

#[test]
fn talhelper_node_without_mac() {
    let case = Case::new();
    let text = TAL.replace("      - deviceSelector: {hardwareAddr: aa:00:00:00:00:02}\n        addresses: [10.0.40.21/24]\n", "      - interface: eth0\n        addresses: [10.0.40.21/24]\n");
    let p = case.file("talconfig.yaml", &text);
    let env: BTreeMap<String, String> = [("VIP".to_string(), "10.0.40.100".to_string())].into();
    let Err(LoadError::Invalid { diagnostics, .. }) = load_with_env(&p, &env) else {
        panic!()
    };
    let msgs: Vec<String> = diagnostics.iter().map(|d| d.message.clone()).collect();
    assert!(
        msgs.iter()
            .any(|m| m == "interface has no deviceSelector.hardwareAddr"),
        "{msgs:?}"
    );
}

#[test]
fn worker_labels_respect_node_restriction() {
    let text = format!(
        "{BASE}roles:\n  worker:\n    type: worker\n    labels: {{node-role.kubernetes.io/storage: \"\"}}\n"
    );
    let d = diags(&text);
    assert_eq!(
        d,
        [
            "30:11: nodes[3].labels: label `node-role.kubernetes.io/storage` on worker `wk-1` would be refused by Kubernetes' NodeRestriction admission"
        ]
    );
    let text = format!(
        "{BASE}roles:\n  worker:\n    type: worker\n    labels: {{node.kubernetes.io/pool: storage}}\n"
    );
    assert!(diags(&text).is_empty());
}

const ADDONS: &str = "\
addons:
  cilium:
    version: 1.18.0
    chart: https://charts.example.com/cilium
  argocd:
    version: 10.1.1
    insecure: true
    chart: charts/argo-cd
";

#[test]
fn addon_insecure_and_chart_sources() {
    let case = Case::new();
    case.file("charts/argo-cd/Chart.yaml", "name: argo-cd\n");
    let inv = case.load(&format!("{BASE}{ADDONS}")).unwrap().inventory;
    let argocd = inv.addons.argocd.unwrap();
    assert!(argocd.insecure);
    assert_eq!(
        argocd.chart,
        Some(ChartRef::Local(case.dir.path().join("charts/argo-cd")))
    );
    assert_eq!(
        inv.addons.cilium.unwrap().chart,
        Some(ChartRef::Repo("https://charts.example.com/cilium".into()))
    );

    // Defaults: a server behind no proxy keeps TLS; the upstream chart repository.
    let plain = ADDONS
        .replace("    insecure: true\n", "")
        .replace("    chart: charts/argo-cd\n", "")
        .replace(
            "https://charts.example.com/cilium",
            "oci://quay.io/cilium/charts/cilium",
        );
    let inv = Case::new()
        .load(&format!("{BASE}{plain}"))
        .unwrap()
        .inventory;
    let argocd = inv.addons.argocd.unwrap();
    assert!(!argocd.insecure);
    assert_eq!(argocd.chart, None);
    assert_eq!(
        inv.addons.cilium.unwrap().chart,
        Some(ChartRef::Oci("oci://quay.io/cilium/charts/cilium".into()))
    );
}

#[test]
fn addon_field_errors_are_located() {
    // Line numbers: BASE has 32 lines, so `addons:` is line 33.
    let typo = ADDONS.replace("insecure: true", "insecur: true");
    let case = Case::new();
    let Err(LoadError::Invalid { diagnostics, .. }) = case.load(&format!("{BASE}{typo}")) else {
        panic!("a misspelt field must be refused")
    };
    let d = diagnostics.sorted();
    let unknown = d
        .iter()
        .find(|d| d.path == "addons.argocd.insecur")
        .expect("unknown field reported");
    assert_eq!(unknown.loc.line, 39);
    assert!(
        unknown
            .hint
            .as_deref()
            .unwrap()
            .starts_with("did you mean `insecure`?"),
        "{unknown:?}"
    );

    let not_bool = ADDONS.replace("insecure: true", "insecure: 3");
    assert!(
        diags(&format!("{BASE}{not_bool}")).contains(
            &"39:15: addons.argocd.insecure: expected true or false, found an integer".into()
        ),
        "{:?}",
        diags(&format!("{BASE}{not_bool}"))
    );

    let ftp = ADDONS.replace(
        "https://charts.example.com/cilium",
        "ftp://charts.example.com",
    );
    let d = diags(&format!("{BASE}{ftp}"));
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(
        d[0],
        "36:12: addons.cilium.chart: `ftp://charts.example.com` uses a scheme helm cannot fetch charts from"
    );
    assert!(
        d[1].starts_with("40:12: warning: addons.argocd.chart: local chart ")
            && d[1].ends_with("charts/argo-cd does not exist"),
        "{d:?}"
    );
}

#[test]
fn patches_setting_deprecated_fields_warn_at_the_key_with_the_replacement() {
    let case = Case::new();
    case.file(
        "old.yaml",
        "machine:\n  time:\n    servers: [10.0.40.1]\ncluster:\n  allowSchedulingOnMasters: true\n",
    );
    case.file(
        "ops.yaml",
        "- op: add\n  path: /machine/env/HTTP_PROXY\n  value: http://proxy\n",
    );
    // A typed document with the same key names is not the v1alpha1 document.
    case.file(
        "typed.yaml",
        "apiVersion: v1alpha1\nkind: TimeSyncConfig\nntp: {servers: [10.0.40.1]}\n",
    );
    let text = with(
        "  vip: 10.0.40.100\n",
        "  vip: 10.0.40.100\n  patches: [old.yaml, ops.yaml, typed.yaml]\n",
    );
    let loaded = case.load(&text).unwrap();
    let w: Vec<String> = loaded
        .warnings
        .sorted()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(w.len(), 3, "{w:#?}");
    let dir = case.dir.path().display().to_string();
    let find = |needle: &str| {
        w.iter()
            .find(|m| m.contains(needle))
            .unwrap_or_else(|| panic!("{needle}: {w:#?}"))
            .clone()
    };
    let time = find("`machine.time`");
    assert!(
        time.starts_with(&format!("{dir}/old.yaml:2:3: warning: cluster.patches[0]:")),
        "{time}"
    );
    assert!(
        time.contains("Talos v1.13 deprecated") && time.contains("TimeSyncConfig"),
        "{time}"
    );
    let masters = find("`cluster.allowSchedulingOnMasters`");
    assert!(
        masters.starts_with(&format!("{dir}/old.yaml:5:3:")),
        "{masters}"
    );
    assert!(
        masters.contains("cluster.allowSchedulingOnControlPlanes"),
        "{masters}"
    );
    let env = find("`machine.env`");
    assert!(
        env.starts_with(&format!("{dir}/ops.yaml:1:3: warning: cluster.patches[1]:")),
        "{env}"
    );
    assert!(env.contains("EnvironmentConfig"), "{env}");
}

#[test]
fn the_examples_use_no_deprecated_field() {
    for f in ["lab.yaml", "rack.yaml", "talconfig.yaml"] {
        let loaded = load_with_env(&example(f), &BTreeMap::new()).unwrap();
        assert!(
            !loaded
                .warnings
                .iter()
                .any(|w| w.message.contains("deprecated")),
            "{f}: {:?}",
            loaded.warnings
        );
    }
}

/// Deep YAML of every shape: block and flow, mappings and sequences. Block mappings need one
/// more column of indentation per level (quadratic size), so they stop at 3,000 levels.
fn deep_shapes(depth: usize) -> [String; 4] {
    let mut block_maps = String::new();
    for i in 0..depth.min(3_000) {
        block_maps.push_str(&" ".repeat(i));
        block_maps.push_str("a:\n");
    }
    [
        block_maps,
        format!("{}x\n", "- ".repeat(depth)),
        format!("{}1{}\n", "{a: ".repeat(depth), "}".repeat(depth)),
        format!("{}{}\n", "[".repeat(depth), "]".repeat(depth)),
    ]
}

fn assert_too_deep(result: Result<Loaded, LoadError>, file: &Path) {
    let Err(LoadError::Invalid { diagnostics, .. }) = result else {
        panic!("{} accepted", file.display())
    };
    let msgs: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with(&format!("{}:", file.display()))
                && m.contains("nested more than 100 levels deep")
                && m.contains("flatten")),
        "{msgs:#?}"
    );
}

#[test]
fn deep_inventory_patch_and_talenv_are_located_errors() {
    for depth in [101, 5_000, 50_000] {
        for shape in deep_shapes(depth) {
            // The inventory itself.
            let case = Case::new();
            let p = case.dir.path().join("talboot.yaml");
            assert_too_deep(case.load(&shape), &p);
            // A patch file.
            let patch = case.file("deep.yaml", &format!("machine:\n  x:\n{}", indent(&shape)));
            let text = with(
                "  vip: 10.0.40.100\n",
                "  vip: 10.0.40.100\n  patches: [deep.yaml]\n",
            );
            assert_too_deep(case.load(&text), &patch);
            // An inline patch text.
            let inline = format!(
                "  vip: 10.0.40.100\n  patches:\n    - |\n{}",
                shape
                    .lines()
                    .map(|l| format!("      {l}\n"))
                    .collect::<String>()
            );
            assert_too_deep(case.load(&with("  vip: 10.0.40.100\n", &inline)), &p);
            // talhelper's talenv.yaml beside a talconfig.
            let talenv = case.file("talenv.yaml", &shape);
            let tal = case.file("talconfig.yaml", TAL);
            assert_too_deep(load_with_env(&tal, &BTreeMap::new()), &talenv);
        }
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

#[test]
fn local_boot_defaults_to_exit_and_a_node_may_override_it() {
    let case = Case::new();
    let inv = case.load(BASE).unwrap().inventory;
    assert_eq!(inv.boot.local_boot, LocalBoot::Exit);
    assert_eq!(inv.local_boot_of(&inv.nodes[0]), LocalBoot::Exit);

    let text = with(
        "    address: 10.0.40.21/24\n",
        "    address: 10.0.40.21/24\n    localBoot: http404\n",
    ) + "boot:\n  localBoot: sanboot\n";
    let inv = case.load(&text).unwrap().inventory;
    assert_eq!(inv.local_boot_of(&inv.nodes[0]), LocalBoot::Sanboot);
    assert_eq!(inv.local_boot_of(&inv.nodes[3]), LocalBoot::Http404);

    let bad = diags(&(BASE.to_string() + "boot:\n  localBoot: grub\n"));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("boot.localBoot") && bad[0].contains("`grub` is not a valid value"),
        "{bad:?}"
    );
}

#[test]
fn patches_under_the_v1_14_contract_are_checked_at_file_and_line() {
    let case = Case::new();
    // Translated into v1.14 documents: no message.
    case.file(
        "legacy.yaml",
        "machine:\n  sysctls: {vm.max_map_count: '262144'}\n  kubelet:\n    extraArgs: {a: b}\n  nodeLabels: {pool: x}\ncluster:\n  network: {podSubnets: [10.244.0.0/16]}\n",
    );
    // No v1.14 document: stays, with a warning at the key.
    case.file("files.yaml", "machine:\n  pods:\n    - {kind: Pod}\n");
    // No v1.14 document, under a field Talos refuses next to KubeletConfig.
    case.file(
        "mounts.yaml",
        "machine:\n  kubelet:\n    extraMounts:\n      - {destination: /x, source: /x, type: bind}\n",
    );
    // The legacy field and its document in one patch.
    case.file(
        "both.yaml",
        "machine:\n  sysctls: {a: '1'}\n---\napiVersion: v1alpha1\nkind: SysctlConfig\nparams: {b: '2'}\n",
    );
    // A JSON patch into a section v1.14 moved out of v1alpha1.
    case.file(
        "ops.yaml",
        "- op: add\n  path: /machine/kubelet/extraArgs/feature-gates\n  value: X=true\n",
    );
    let patches = "  patches: [legacy.yaml, files.yaml, mounts.yaml, both.yaml, ops.yaml]\n";
    let text = with(
        "  vip: 10.0.40.100\n",
        &format!("  vip: 10.0.40.100\n{patches}"),
    )
    .replace("talosVersion: v1.13.9", "talosVersion: v1.14.0");
    let Err(LoadError::Invalid { diagnostics, .. }) = case.load(&text) else {
        panic!("loaded")
    };
    let all: Vec<String> = diagnostics
        .sorted()
        .iter()
        .map(ToString::to_string)
        .collect();
    let dir = case.dir.path().display().to_string();
    assert_eq!(all.len(), 4, "{all:#?}");
    let find = |file: &str| {
        all.iter()
            .find(|m| m.starts_with(&format!("{dir}/{file}:")))
            .unwrap_or_else(|| panic!("{file}: {all:#?}"))
            .clone()
    };
    let pods = find("files.yaml");
    assert!(
        pods.starts_with(&format!(
            "{dir}/files.yaml:2:3: warning: cluster.patches[1]:"
        )) && pods.contains("`machine.pods`")
            && pods.contains("Talos v1.14 deprecated"),
        "{pods}"
    );
    let mounts = find("mounts.yaml");
    assert!(
        mounts.starts_with(&format!(
            "{dir}/mounts.yaml:3:5: error: cluster.patches[2]:"
        )) && mounts.contains("`machine.kubelet.extraMounts`")
            && mounts.contains("KubeletConfig")
            && mounts.contains("k8s/kubelet.go"),
        "{mounts}"
    );
    let both = find("both.yaml");
    assert!(
        both.starts_with(&format!("{dir}/both.yaml:2:3: error: cluster.patches[3]:"))
            && both.contains("`machine.sysctls` and a SysctlConfig document")
            && both.contains("only in the SysctlConfig document"),
        "{both}"
    );
    let ops = find("ops.yaml");
    assert!(
        ops.starts_with(&format!("{dir}/ops.yaml:1:3: error: cluster.patches[4]:"))
            && ops.contains("`/machine/kubelet/extraArgs/feature-gates`")
            && ops.contains("KubeletConfig"),
        "{ops}"
    );

    // The same patches under v1.13: the legacy fields are current there; only the v1.13
    // conflict of a patch setting machine.time beside TimeSyncConfig is refused.
    case.file(
        "time.yaml",
        "machine:\n  time:\n    servers: [10.0.40.1]\n---\napiVersion: v1alpha1\nkind: TimeSyncConfig\nntp: {servers: [10.0.40.1]}\n",
    );
    let text = with(
        "  vip: 10.0.40.100\n",
        "  vip: 10.0.40.100\n  patches: [legacy.yaml, mounts.yaml, time.yaml]\n",
    );
    let Err(LoadError::Invalid { diagnostics, .. }) = case.load(&text) else {
        panic!("loaded")
    };
    let errors: Vec<String> = diagnostics
        .sorted()
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(ToString::to_string)
        .collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with(&format!("{dir}/time.yaml:3:5: error: cluster.patches[2]:"))
            && errors[0].contains("network/time_sync.go"),
        "{errors:#?}"
    );
}

#[test]
fn the_examples_at_v1_14_load_without_contract_messages() {
    let case = Case::new();
    let src = example("rack.yaml").parent().unwrap().to_path_buf();
    for e in std::fs::read_dir(src.join("patches")).unwrap() {
        let e = e.unwrap();
        let text = std::fs::read_to_string(e.path()).unwrap();
        case.file(
            &format!("patches/{}", e.file_name().to_string_lossy()),
            &text,
        );
    }
    for f in ["lab.yaml", "rack.yaml"] {
        let text = std::fs::read_to_string(src.join(f))
            .unwrap()
            .replace("talosVersion: v1.13.9", "talosVersion: v1.14.0");
        assert!(text.contains("v1.14.0"), "{f}");
        let loaded = load_with_env(&case.file(f, &text), &BTreeMap::new()).unwrap();
        assert!(loaded.warnings.is_empty(), "{f}: {:?}", loaded.warnings);
    }
}

/// An operator's own CEL `diskSelector.match` is compiled in Talos's disk environment when
/// the inventory loads: a type error Talos would refuse at apply time fails here, at its
/// line; it cannot be mixed with the other fields; it needs the v1.14 contract.
#[test]
fn disk_selector_match_is_checked_when_the_inventory_loads() {
    let v114 = |node: &str| {
        with(
            "    address: 10.0.40.21/24\n    installDisk: /dev/sda",
            &format!("    address: 10.0.40.21/24\n{node}"),
        )
        .replacen("talosVersion: v1.13.9", "talosVersion: v1.14.0", 1)
    };
    let ok =
        v114("    diskSelector:\n      match: disk.transport == \"nvme\" && disk.size > 500u * GB");
    let d = diags(&ok);
    assert!(!d.iter().any(|m| m.contains("diskSelector")), "{d:?}");
    let d = diags(&v114(
        "    diskSelector:\n      match: disk.size > 500 * GB",
    ));
    assert!(
        d.iter().any(|m| m
            .contains("nodes[3].diskSelector.match: not a disk expression Talos v1.14 accepts")
            && m.contains("found no matching overload for '_*_' applied to '(int, uint)'")),
        "{d:?}"
    );
    let d = diags(&v114("    diskSelector:\n      match: disk.serail == 'S1'"));
    assert!(
        d.iter().any(|m| m.contains("undefined field 'serail'")),
        "{d:?}"
    );
    let d = diags(&v114(
        "    diskSelector:\n      model: X\n      match: disk.serial == 'S1'",
    ));
    assert!(
        d.iter()
            .any(|m| m.contains("match replaces the other selector fields")),
        "{d:?}"
    );
    let d = diags(&with(
        "    address: 10.0.40.21/24\n    installDisk: /dev/sda",
        "    address: 10.0.40.21/24\n    diskSelector:\n      match: disk.serial == 'S1'",
    ));
    assert!(
        d.iter()
            .any(|m| m.contains("a CEL disk expression needs Talos v1.14 or later")),
        "{d:?}"
    );
}

/// `secureBoot: true` with pull delivery or BIOS firmware is refused at the node's
/// `secureBoot` line, naming the node, the reason and the fix; push with UEFI passes.
#[test]
fn secure_boot_refuses_pull_delivery_and_bios_firmware() {
    let sb = with(
        "    address: 10.0.40.21/24\n",
        "    address: 10.0.40.21/24\n    secureBoot: true\n",
    );
    assert!(diags(&sb).is_empty(), "{:?}", diags(&sb));
    let pull = diags(&(sb.clone() + "boot:\n  delivery: pull\n"));
    assert_eq!(pull.len(), 1, "{pull:?}");
    assert!(
        pull[0].contains(".secureBoot: ")
            && pull[0].contains("boot.delivery is pull")
            && pull[0].contains("sealed"),
        "{pull:?}"
    );
    let bios = diags(&sb.replacen(
        "    secureBoot: true\n",
        "    secureBoot: true\n    firmware: bios\n",
        1,
    ));
    assert_eq!(bios.len(), 1, "{bios:?}");
    assert!(
        bios[0].contains("firmware is `bios`") && bios[0].contains("no Secure Boot"),
        "{bios:?}"
    );
    let line: usize = bios[0].split(':').next().unwrap().parse().unwrap();
    assert_eq!(
        sb.lines().nth(line - 1).map(str::trim),
        Some("secureBoot: true")
    );
}

#[test]
fn http_boot_is_ipxe_unless_the_boot_section_says_uki() {
    let case = Case::new();
    assert_eq!(
        case.load(BASE).unwrap().inventory.boot.http_boot,
        HttpBoot::Ipxe
    );
    let inv = case
        .load(&(BASE.to_string() + "boot:\n  httpBoot: uki\n"))
        .unwrap()
        .inventory;
    assert_eq!(inv.boot.http_boot, HttpBoot::Uki);
    let bad = diags(&(BASE.to_string() + "boot:\n  httpBoot: grub\n"));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("boot.httpBoot") && bad[0].contains("`grub` is not a valid value"),
        "{bad:?}"
    );
}
