//! talboot with its state in a real etcd (`--store etcd://...`, issue 28 item 1): the whole
//! simulated rack provisioned by `talboot demo --store`, its records and leases then in etcd
//! (read back with `talboot status --store` and etcdctl); and `talboot serve --store` as an
//! operator's process, read by `talboot status --store` while it runs (no file lock: the
//! status comes from etcd, not from serve's admin API).
//!
//! And `talboot store migrate`: a demo run's redb state copied into etcd (stopped midway,
//! then resumed), read back by `status --store`.
//!
//! One etcd member per test on loopback ports (`support::etcd`). The demo uses the rack's
//! loopback addresses (127.0.0.x), as `tests/demo.rs` does, so the demo runs take turns.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::etcd::Etcd;
use support::images::fake_images;

/// The demo binds the rack's fixed loopback addresses: one run at a time.
static DEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `talboot demo -q` of config/rack.yaml into `workdir` with `args`, one demo at a time.
fn demo(workdir: &Path, args: &[&str]) -> std::process::Output {
    let _turn = DEMO.lock().unwrap_or_else(|p| p.into_inner());
    talboot()
        .args(["demo", "-q", "-c"])
        .arg(repo("config/rack.yaml"))
        .arg("--workdir")
        .arg(workdir)
        .args(args)
        .output()
        .unwrap()
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn talboot() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talboot"));
    c.env_remove("RUST_LOG")
        .env_remove("TALBOOT_STORE")
        .env_remove("TALBOOT_STATE_DIR");
    c
}

/// `talboot status -c config --store url --admin <nothing listens>`: its stdout, asserting
/// success (the table must come from etcd, since the admin address answers nothing).
fn status_from_etcd(config: &Path, url: &str) -> String {
    let out = talboot()
        .arg("status")
        .arg("-c")
        .arg(config)
        .args(["--store", url, "--admin", "127.0.0.1:1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "status: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_demo_rack_is_provisioned_with_its_state_in_etcd() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let workdir = dir.path().join("run");
    let out = demo(
        &workdir,
        &["--timeout", "180", "--store", &etcd.store_url()],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("handed off after"), "{stdout}");

    // Nothing went to a redb file: the state is in etcd, under the inventory's cluster.
    assert!(!workdir.join("state").join("talboot.redb").exists());
    assert_eq!(
        etcd.get("/talboot/rack1/schema_version").as_deref(),
        Some("1")
    );
    let nodes = etcd.keys("/talboot/rack1/nodes/");
    assert_eq!(nodes.len(), 13, "{nodes:?}");
    let leases = etcd.keys("/talboot/rack1/leases/ip/");
    assert!(leases.len() >= 13, "{leases:?}");
    let progress = etcd.keys("/talboot/rack1/cluster_progress/");
    assert!(!progress.is_empty());

    // talboot status reads the same from etcd: every node Ready, with an address.
    let table = status_from_etcd(&repo("config/rack.yaml"), &etcd.store_url());
    // The node table ends at the first blank line; the Appliances section follows (on etcd).
    let rows: Vec<&str> = table
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(rows.len(), 13, "{table}");
    assert!(table.contains("\nAppliances\n"), "{table}");
    for row in rows {
        assert!(row.contains(" ready "), "{table}");
    }

    // A second demo on the same prefix is refused (its new secrets would not match).
    let again = dir.path().join("again");
    let out = demo(&again, &["--timeout", "60", "--store", &etcd.store_url()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("/talboot/rack1/ already holds 13 node record(s)"),
        "{stderr}"
    );
}

/// Kills the child on drop, so a failed assertion leaves no process behind.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_on_etcd_runs_and_status_reads_etcd_while_it_does() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = repo("config/lab.yaml");
    fake_images(&config, &tmp.path().join("images"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = talboot()
        .arg("serve")
        .arg("-c")
        .arg(&config)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .arg("--images")
        .arg(tmp.path().join("images"))
        .args(["--store", &etcd.store_url(), "--name", "appliance-a"])
        .args(["--advertise", "127.0.0.1", "--http-port", &port.to_string()])
        .args(["--admin-listen", "127.0.0.1:0", "--no-dhcp", "--no-tftp"])
        .arg("--no-provision")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let served = Served(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("talboot serving") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("serve on etcd did not come up within 30 s");
    assert!(line.contains("boot script"), "{line}");

    // The store serve opened is etcd's: it wrote the schema there, and no redb file.
    assert_eq!(
        etcd.get("/talboot/lab/schema_version").as_deref(),
        Some("1")
    );
    assert!(!tmp.path().join("state").join("talboot.redb").exists());
    // While serve runs, status opens etcd itself (with redb it would be locked out).
    let table = status_from_etcd(&config, &etcd.store_url());
    assert!(table.starts_with("NODE"), "{table}");
    assert!(table.lines().count() > 1, "{table}");
    // A command that writes goes through the appliance on etcd, and says so.
    let out = talboot()
        .args(["node", "rebuild", "-c"])
        .arg(&config)
        .args(["--store", &etcd.store_url(), "--admin", "127.0.0.1:1"])
        .arg(first_node(&config))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("going through the appliance at --admin 127.0.0.1:1"),
        "{stderr}"
    );
    drop(served);
}

/// The first node name of `config`.
fn first_node(config: &Path) -> String {
    let inv = talboot::inventory::load_with_env(config, &std::collections::BTreeMap::new())
        .unwrap()
        .inventory;
    inv.nodes[0].name.value.clone()
}

/// `talboot store migrate` with `args` after `--from dir --to url`: (success, stdout, stderr).
fn migrate(dir: &Path, url: &str, args: &[&str]) -> (bool, String, String) {
    let out = talboot()
        .args(["store", "migrate", "-c"])
        .arg(repo("config/rack.yaml"))
        .arg("--from")
        .arg(dir)
        .args(["--to", url])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_demo_runs_redb_state_is_migrated_to_etcd_resumed_after_a_stop() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let workdir = dir.path().join("run");
    let out = demo(&workdir, &["--timeout", "180"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = workdir.join("state");
    assert!(state.join("talboot.redb").exists());

    // Stopped after two transactions, as a kill would leave it.
    let (ok, stdout, stderr) = migrate(&state, &etcd.store_url(), &["--stop-after-batches", "2"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("stopped after 2 transaction(s)"),
        "{stdout}"
    );
    let partial = etcd.keys("/talboot/rack1/").len();
    // Resumed: everything, checked, nothing twice.
    let (ok, stdout, stderr) = migrate(&state, &etcd.store_url(), &[]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("copied and checked"), "{stdout}");
    let skipped: usize = stdout
        .split("transaction(s), ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no skipped count:\n{stdout}"));
    // Two batches of 127 rows were there already (the marker and schema are not rows).
    assert_eq!(skipped, 2 * 127, "{stdout}");
    assert_eq!(partial, 2 * 127 + 2, "{partial}");
    for table in [
        "events",
        "event_head",
        "leases",
        "nodes",
        "cluster_progress",
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(table)),
            "{table}:\n{stdout}"
        );
    }
    let events = etcd.keys("/talboot/rack1/events/");
    let unique: std::collections::BTreeSet<&String> = events.iter().collect();
    assert_eq!(unique.len(), events.len());

    // The copy reads as the demo left it: every node Ready.
    let table = status_from_etcd(&repo("config/rack.yaml"), &etcd.store_url());
    assert_eq!(
        table
            .lines()
            .skip(1)
            .filter(|r| r.contains(" ready "))
            .count(),
        13,
        "{table}"
    );

    // An appliance writes to the prefix: a rerun refuses (foreign data), naming the prefix.
    let (ok, _, stderr) = migrate(&state, &etcd.store_url(), &["--etcd-cluster", "rack1"]);
    assert!(ok, "a rerun of a complete copy only checks it: {stderr}");
    let put = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{}", etcd.client))
        .args(["put", "/talboot/rack1/cluster_meta/stranger", "x"])
        .output()
        .unwrap();
    assert!(put.status.success());
    let (ok, _, stderr) = migrate(&state, &etcd.store_url(), &[]);
    assert!(!ok);
    assert!(
        stderr.contains("not from this migration") && stderr.contains("/talboot/rack1/"),
        "{stderr}"
    );
}
