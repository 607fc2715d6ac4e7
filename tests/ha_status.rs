//! `talboot status --store etcd://...` shows the fleet (issue 28 item 4): the appliances that
//! `members/` holds, the election's leader starred, and etcd's health; `--json` the same as
//! data. The appliances here are stand-ins written with etcdctl the way an appliance writes
//! them (`members/<name>` under a lease kept alive; the election's key under
//! `/talboot/<cluster>/election/`, whose oldest key leads: `Election.Leader` in etcd-io/etcd
//! v3.4.23 `clientv3/concurrency/election.go`), so the CLI's reading is tested on its own:
//! a stand-in whose keep-alive is killed is gone from `status` once its lease's TTL runs out.
//!
//! And a real `serve --store` process: its `/api/ha` names it as the leader and carries its
//! own etcd health probe (the view `appliance::spawn_etcd_health` hands to the admin API).
//!
//! One etcd member on loopback ports (`support::etcd`).

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::etcd::Etcd;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn etcdctl(etcd: &Etcd) -> Command {
    let mut c = Command::new("etcdctl");
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{}", etcd.client));
    c
}

fn run(c: &mut Command) -> String {
    let out = c.output().expect("run etcdctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A lease of `ttl` seconds, its ID in hex as etcdctl prints and takes it.
fn lease_grant(etcd: &Etcd, ttl: u32) -> String {
    let out = run(etcdctl(etcd).args(["lease", "grant", &ttl.to_string()]));
    // "lease 694d7a8c5e8d2c0a granted with TTL(3s)"
    out.split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("lease grant said {out:?}"))
        .to_owned()
}

fn put(etcd: &Etcd, key: &str, value: &str, lease: Option<&str>) {
    let mut c = etcdctl(etcd);
    c.arg("put");
    if let Some(l) = lease {
        c.arg(format!("--lease={l}"));
    }
    run(c.args([key, value]));
}

fn member(name: &str) -> String {
    format!(
        r#"{{"name":"{name}","admin_url":"http://{name}:9090","http_url":"http://{name}:8080","version":"9.9.9","started_unix_ms":1}}"#
    )
}

/// A child process (etcdctl keeping a lease alive, or an appliance), killed on drop.
struct KeepAlive(Child);

impl Drop for KeepAlive {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `talboot status -c lab.yaml --store <etcd> [extra]`: its stdout, asserting success.
fn status(etcd: &Etcd, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .env_remove("RUST_LOG")
        .env_remove("TALBOOT_STORE")
        .arg("status")
        .arg("-c")
        .arg(repo("config/lab.yaml"))
        .args(["--store", &etcd.store_url(), "--admin", "127.0.0.1:1"])
        .args(extra)
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

/// The Appliances rows of `status`' text: (name, starred).
fn appliances(text: &str) -> Vec<(String, bool)> {
    text.lines()
        .skip_while(|l| *l != "Appliances")
        .skip(2)
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with("leader:") && !l.starts_with("no appliance"))
        .map(|l| {
            let mut cells = l.split_whitespace();
            let name = cells.next().unwrap_or_default().to_owned();
            (name, cells.next() == Some("*"))
        })
        .collect()
}

#[test]
fn status_on_etcd_shows_the_appliances_the_leader_and_etcds_health() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    put(&etcd, "/talboot/lab/members/a", &member("a"), None);
    let lease = lease_grant(&etcd, 3);
    put(&etcd, "/talboot/lab/members/b", &member("b"), Some(&lease));
    let b_alive = KeepAlive(
        etcdctl(&etcd)
            .args(["lease", "keep-alive", &lease])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl lease keep-alive"),
    );
    let leader = r#"{"name":"b","admin_url":"http://b:9090"}"#;
    put(&etcd, "/talboot/lab/election/1", leader, None);

    let text = status(&etcd, &[]);
    assert_eq!(
        appliances(&text),
        [("a".to_owned(), false), ("b".to_owned(), true)],
        "{text}"
    );
    assert!(
        text.contains("etcd healthy; 1 of 1 endpoint(s) up"),
        "{text}"
    );
    assert!(text.contains(&format!("http://{}", etcd.client)), "{text}");
    assert!(!text.contains("problem:"), "{text}");

    let json: serde_json::Value = serde_json::from_str(&status(&etcd, &["--json"])).unwrap();
    assert_eq!(json["ha"]["leader"], "b", "{json:#}");
    assert_eq!(json["ha"]["appliances"].as_array().unwrap().len(), 2);
    assert_eq!(json["ha"]["etcd"]["verdict"], "healthy", "{json:#}");
    assert_eq!(json["ha"]["etcd"]["endpoints"][0]["up"], true);
    assert!(json["nodes"].as_array().is_some_and(|n| !n.is_empty()));

    // b's keep-alive dies as with kill -9: b is gone once its 3 s lease runs out (etcd
    // revokes expired leases and deletes their keys: `lease/lessor.go`
    // `revokeExpiredLeases`), while the leader key, which is not b's member key, stays.
    drop(b_alive);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = status(&etcd, &[]);
        if appliances(&text) == [("a".to_owned(), false)] {
            assert!(
                text.contains("leader: b (not among the live appliances)"),
                "{text}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b still listed after 20 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// On redb nothing of the fleet is shown: the table alone, and `ha` null in JSON.
#[test]
fn status_on_redb_has_no_appliances_section() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .env_remove("TALBOOT_STORE")
        .arg("status")
        .arg("-c")
        .arg(repo("config/lab.yaml"))
        .arg("--state-dir")
        .arg(tmp.path())
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ha"], serde_json::Value::Null);
    assert!(json["nodes"].as_array().is_some_and(|n| !n.is_empty()));
}

/// The body of `GET path` on `addr`, asserting 200 (HTTP/1.0: the body runs to the close).
fn get_text(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    body.to_owned()
}

/// The JSON body of `GET path` on `addr`.
fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let body = get_text(addr, path);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// `serve --store <etcd> --name appliance-a` without DHCP, TFTP or provisioning, in `tmp`:
/// the process (killed on drop) and its admin API's address.
fn serve_on(etcd: &Etcd, tmp: &Path) -> (KeepAlive, SocketAddr) {
    let config = repo("config/lab.yaml");
    support::images::fake_images(&config, &tmp.join("images"));
    let http_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .env_remove("TALBOOT_STORE")
        .arg("serve")
        .arg("-c")
        .arg(&config)
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .arg("--images")
        .arg(tmp.join("images"))
        .args(["--store", &etcd.store_url(), "--name", "appliance-a"])
        .args([
            "--advertise",
            "127.0.0.1",
            "--http-port",
            &http_port.to_string(),
        ])
        .args(["--admin-listen", "127.0.0.1:0", "--no-dhcp", "--no-tftp"])
        .arg("--no-provision")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let served = KeepAlive(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split(" admin=http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let admin: SocketAddr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("serve on etcd did not say where its admin API listens within 60 s")
        .parse()
        .unwrap();
    (served, admin)
}

/// A `serve --store etcd://...` started without DHCP (so it keeps no member key: only
/// appliances that take a share of the clients do) leads the election, and its `/api/ha`
/// says so, with etcd's health from its own probe.
#[test]
fn a_serving_appliance_answers_api_ha_with_its_leadership_and_etcds_health() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (served, admin) = serve_on(&etcd, tmp.path());
    // The election and the first probe take a moment after the listener is up.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ha = loop {
        let ha = get_json(admin, "/api/ha");
        if ha["leader"] == "appliance-a" && ha["etcd"]["verdict"] == "healthy" {
            break ha;
        }
        assert!(
            Instant::now() < deadline,
            "not leading and healthy after 30 s: {ha:#}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(ha["store"], "etcd");
    assert_eq!(ha["me"], "appliance-a");
    assert_eq!(
        ha["leader_admin_url"],
        format!("http://{admin}").as_str(),
        "{ha:#}"
    );
    assert_eq!(
        ha["etcd"]["endpoints"][0]["url"],
        format!("http://{}", etcd.client).as_str()
    );
    assert_eq!(ha["etcd"]["endpoints"][0]["leader"], true, "{ha:#}");
    // Without DHCP it takes no share of the clients, so it keeps no member key.
    assert_eq!(ha["appliances"], serde_json::json!([]), "{ha:#}");
    // /metrics names the leader too, once a probe round with quorum has run.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = get_text(admin, "/metrics");
        if metrics.contains("talboot_fleet_leader{name=\"appliance-a\"} 1") {
            assert!(metrics.contains("talboot_appliances_live 0"), "{metrics}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no leader gauge after 30 s:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(served);
}

/// The dashboard of an appliance on etcd draws `/api/ha` in Debian's chromium
/// (`tests/browser/ha.mjs`): the Appliances section shown, the leader named, etcd healthy with
/// its one endpoint.
#[test]
fn the_dashboard_on_etcd_shows_the_leader_and_etcds_health() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let browser_dir = support::browser::tools();
    let tmp = tempfile::tempdir().unwrap();
    let (served, admin) = serve_on(&etcd, tmp.path());
    let out = Command::new("node")
        .current_dir(&browser_dir)
        .arg("ha.mjs")
        .arg(format!("http://{admin}/"))
        .arg("appliance-a")
        .arg(format!("http://{}", etcd.client))
        .output()
        .expect("node runs (scripts/test-deps installs it)");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("ok: the leader (appliance-a) is named"),
        "{log}"
    );
    drop(served);
}
