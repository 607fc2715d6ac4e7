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
