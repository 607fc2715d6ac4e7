//! `talboot check` as an operator runs it: the real binary, its exit codes and its output.

use std::path::Path;
use std::process::{Command, Output};

fn talboot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_LOG")
        .env_remove("TALBOOT_CONFIG")
        .output()
        .expect("run talboot")
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn rack_example_lists_13_nodes_in_four_roles() {
    let out = talboot(&["check", "-c", "config/rack.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("valid: 13 nodes in 4 roles, 0 warnings"),
        "{stdout}"
    );
    for role in ["controlplane", "worker", "storage", "monitoring"] {
        assert!(
            stdout.contains(&format!("\nrole {role} (")),
            "{role}: {stdout}"
        );
    }
    assert!(
        stdout.contains("rack1-wk-02  3c:ec:ef:20:00:02  10.20.0.22/24  /dev/sda"),
        "{stdout}"
    );
}

#[test]
fn lab_and_talconfig_examples_pass() {
    for file in ["config/lab.yaml", "config/talconfig.yaml"] {
        let out = talboot(&["check", "-c", file]);
        assert_eq!(out.status.code(), Some(0), "{file}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("valid: 3 nodes in 1 role"),
            "{file}"
        );
    }
}

#[test]
fn invalid_inventory_exits_1_with_located_messages() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    let rack =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml"))
            .unwrap();
    // Three mistakes: a copied MAC, an address in no served subnet, a misspelled field.
    let bad = rack
        .replacen(
            "mac: \"3c:ec:ef:20:00:04\"",
            "mac: \"3c:ec:ef:20:00:01\"",
            1,
        )
        .replacen("address: 10.20.0.24/24", "address: 10.30.0.24/24", 1)
        .replacen(
            "    installDisk: /dev/sda\n    firmware: bios",
            "    instalDisk: /dev/sda\n    installDisk: /dev/sda\n    firmware: bios",
            1,
        );
    std::fs::write(&file, bad).unwrap();
    // The patch files are relative to the inventory's folder.
    let patches = dir.path().join("patches");
    std::fs::create_dir(&patches).unwrap();
    for p in ["rack-common.yaml", "controlplane.yaml", "storage.yaml"] {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("config/patches")
                .join(p),
            patches.join(p),
        )
        .unwrap();
    }
    let out = talboot(&["check", "-c", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains(": error: ")).collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    let f = file.display().to_string();
    // Positions are computed from the text so the test does not depend on the example's layout.
    let bad = std::fs::read_to_string(&file).unwrap();
    let at = |needle: &str, nth: usize| -> (usize, usize) {
        let (i, line) = bad
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .nth(nth)
            .unwrap_or_else(|| panic!("{needle}"));
        (i + 1, line.find(needle).unwrap() + 1)
    };
    let (l, c) = at("instalDisk", 0);
    assert!(
        errors[0].starts_with(&format!(
            "{f}:{l}:{c}: error: nodes[4].instalDisk: unknown field `instalDisk`"
        )),
        "{stderr}"
    );
    let (l, c) = at("\"3c:ec:ef:20:00:01\"", 1);
    let (fl, fc) = at("\"3c:ec:ef:20:00:01\"", 0);
    assert!(errors[1].starts_with(&format!("{f}:{l}:{c}: error: nodes[6].macs[0]: duplicate MAC 3c:ec:ef:20:00:01 (also nodes[3].macs[0] at {f}:{fl}:{fc})")), "{stderr}");
    let (l, c) = at("10.30.0.24/24", 0);
    assert!(errors[2].starts_with(&format!("{f}:{l}:{c}: error: nodes[6].address: address 10.30.0.24 is outside every served subnet (10.20.0.0/24, 10.20.1.0/24)")), "{stderr}");
    assert!(stderr.contains("hint: did you mean `installDisk`?"));
    assert!(
        stderr.trim_end().ends_with("invalid: 3 errors, 0 warnings"),
        "{stderr}"
    );
}

#[test]
fn missing_file_and_bad_usage_exit_2() {
    let out = talboot(&["check", "-c", "/nonexistent/talboot.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read inventory /nonexistent/talboot.yaml"));
    let out = talboot(&["check", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    let out = talboot(&["--log-format", "xml", "check"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn json_logs_are_accepted() {
    let out = talboot(&[
        "--log-format",
        "json",
        "--log",
        "debug",
        "check",
        "-c",
        "config/lab.yaml",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// Deep YAML of every shape: block and flow, mappings and sequences. Block mappings grow by
/// one column per level, so they stop at 5,000 levels (12 MB).
fn deep_shapes(depth: usize) -> Vec<(&'static str, String)> {
    let mut block_maps = String::new();
    for i in 0..depth.min(5_000) {
        block_maps.push_str(&" ".repeat(i));
        block_maps.push_str("a:\n");
    }
    vec![
        ("block mappings", block_maps),
        ("block sequences", format!("{}x\n", "- ".repeat(depth))),
        (
            "flow mappings",
            format!("{}1{}\n", "{a: ".repeat(depth), "}".repeat(depth)),
        ),
        (
            "flow sequences",
            format!("{}{}\n", "[".repeat(depth), "]".repeat(depth)),
        ),
    ]
}

fn talboot_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("TALBOOT_CONFIG")
        .env_remove("SOPS_AGE_KEY")
        .env_remove("SOPS_AGE_KEY_FILE")
        .env("HOME", dir)
        .output()
        .expect("run talboot")
}

/// Exit status 1 (not a signal: the stack overflow was SIGABRT, exit 134) and a message naming
/// the file, a line, the limit and the fix.
fn assert_refused(out: &Output, file: &str, what: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(
        stderr.lines().any(|l| l.contains(&format!("{file}:"))
            && l.contains("nested more than 100 levels deep")
            && l.contains("flatten")),
        "{what}: {stderr}"
    );
}

#[test]
fn deeply_nested_inventories_and_patches_are_located_errors_not_crashes() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for depth in [5_000, 50_000] {
        for (shape, deep) in deep_shapes(depth) {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            // The inventory itself.
            std::fs::write(dir.join("deep.yaml"), &deep).unwrap();
            for cmd in [
                &["check", "-c", "deep.yaml"][..],
                &["gen", "-c", "deep.yaml", "-o", "out"],
                &["secrets", "init", "-c", "deep.yaml"],
                &["serve", "-c", "deep.yaml"],
            ] {
                let what = format!("{cmd:?} on {depth} levels of {shape}");
                assert_refused(&talboot_in(dir, cmd), "deep.yaml", &what);
            }
            // A patch file of the lab example.
            std::fs::create_dir_all(dir.join("patches")).unwrap();
            for e in std::fs::read_dir(repo.join("config/patches")).unwrap() {
                let e = e.unwrap();
                std::fs::copy(e.path(), dir.join("patches").join(e.file_name())).unwrap();
            }
            std::fs::copy(repo.join("config/lab.yaml"), dir.join("lab.yaml")).unwrap();
            std::fs::write(
                dir.join("patches/common.yaml"),
                format!("machine:\n  x:\n{}", {
                    deep.lines()
                        .map(|l| format!("    {l}\n"))
                        .collect::<String>()
                }),
            )
            .unwrap();
            for cmd in [
                &["check", "-c", "lab.yaml"][..],
                &["gen", "-c", "lab.yaml", "-o", "out"],
            ] {
                let what = format!("{cmd:?} with a patch of {depth} levels of {shape}");
                assert_refused(&talboot_in(dir, cmd), "patches/common.yaml", &what);
            }
        }
    }
}

#[test]
fn check_validates_the_rendered_configs_against_the_schema() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("patches")).unwrap();
    for e in std::fs::read_dir(repo.join("config/patches")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join("patches").join(e.file_name())).unwrap();
    }
    std::fs::copy(repo.join("config/lab.yaml"), dir.join("lab.yaml")).unwrap();
    let out = talboot_in(dir, &["check", "-c", "lab.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A wrong type and a wrong enum only the Talos schema knows about: check renders every
    // node (no keys needed) and names node, document and field.
    std::fs::write(
        dir.join("patches/common.yaml"),
        "machine:\n  install:\n    wipe: sometimes\n---\napiVersion: v1alpha1\nkind: VolumeConfig\nname: EPHEMERAL\nprovisioning:\n  grow: maybe\n",
    )
    .unwrap();
    let out = talboot_in(dir, &["check", "-c", "lab.yaml"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for n in ["k8s-ctrl-01", "k8s-ctrl-02", "k8s-ctrl-03"] {
        assert!(
            stderr.contains(&format!("node {n}: v1alpha1 `machine.install.wipe`:")),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "node {n}: VolumeConfig EPHEMERAL `provisioning.grow`:"
            )),
            "{stderr}"
        );
    }
    assert!(
        !stderr.contains("sometimes") && !stderr.contains("maybe"),
        "{stderr}"
    );
    assert!(
        stderr.contains("lab.yaml: invalid: 6 problems in the rendered machine configs"),
        "{stderr}"
    );
    // A deprecated field is a warning naming the patch file, the field and the replacement.
    std::fs::write(
        dir.join("patches/common.yaml"),
        "machine:\n  time:\n    bootTimeout: 2m\n",
    )
    .unwrap();
    let out = talboot_in(dir, &["check", "-c", "lab.yaml"]);
    let stderr = text(&out.stderr);
    // Talos refuses the legacy boot timeout beside the TimeSyncConfig rendered from
    // network.ntp; the deprecation is a warning at the key.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "patches/common.yaml:2:3: warning: cluster.patches[0]: the patch sets `machine.time`"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("TimeSyncConfig"), "{stderr}");
    assert!(
        stderr.contains("v1alpha1 `machine.time.bootTimeout`: a boot timeout in both"),
        "{stderr}"
    );
}

/// `check` validates against the schema of the cluster's Talos minor: the 13-node rack with
/// nothing but `talosVersion` moved to v1.14.0 renders the v1.14 documents with no problem and
/// no warning, and a v1.14 document in a v1.13 cluster is still refused.
#[test]
fn check_renders_and_validates_the_v1_14_contract_for_a_v1_14_cluster() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("patches")).unwrap();
    for e in std::fs::read_dir(repo.join("config/patches")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join("patches").join(e.file_name())).unwrap();
    }
    let rack = std::fs::read_to_string(repo.join("config/rack.yaml")).unwrap();
    std::fs::write(
        dir.join("rack.yaml"),
        rack.replace("talosVersion: v1.13.9", "talosVersion: v1.14.0"),
    )
    .unwrap();
    let out = talboot_in(dir, &["check", "-c", "rack.yaml"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    // A v1.14 document in a v1.13 cluster: refused by v1.13's schema.
    std::fs::write(
        dir.join("patches/rack-common.yaml"),
        "apiVersion: v1alpha1\nkind: SysctlConfig\nparams: {vm.max_map_count: '262144'}\n",
    )
    .unwrap();
    std::fs::write(dir.join("rack.yaml"), &rack).unwrap();
    let out = talboot_in(dir, &["check", "-c", "rack.yaml"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr
            .contains("node rack1-cp-01: SysctlConfig `kind`: unknown document kind SysctlConfig"),
        "{stderr}"
    );
}

/// A `secureBoot: true` node whose boot set has no signed UKI in the cache is named at its
/// `secureBoot` line, with the fix: its DHCP answer would carry no boot file.
#[test]
fn check_notes_a_secure_boot_node_without_a_signed_uki_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    std::fs::create_dir(dir.path().join("patches")).unwrap();
    for e in std::fs::read_dir(root.join("patches")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join("patches").join(e.file_name())).unwrap();
    }
    let lab = std::fs::read_to_string(root.join("lab.yaml")).unwrap();
    let marked = lab.replacen(
        "    firmware: uefi\n",
        "    firmware: uefi\n    secureBoot: true\n",
        1,
    );
    let line = marked
        .lines()
        .position(|l| l.trim() == "secureBoot: true")
        .unwrap()
        + 1;
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, marked).unwrap();
    let images = dir.path().join("images");
    let out = talboot(&[
        "check",
        "-c",
        file.to_str().unwrap(),
        "--images",
        images.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let want = format!(
        "note: {}:{line}: secureBoot: k8s-ctrl-01 boots with Secure Boot but the amd64 boot set",
        file.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert!(stderr.contains("talboot images pull"), "{stderr}");
    assert_eq!(
        stderr.matches("secureBoot: k8s-ctrl").count(),
        1,
        "{stderr}"
    );
}
