//! `talboot serve` as a process: it refuses to start without its boot artifacts (printing the
//! exact pull command), serves HTTP and TFTP on loopback, records boot events, and exits cleanly
//! on SIGTERM.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::images::fake_images;

struct Served {
    child: Option<Child>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A lease for k8s-ctrl-01 at 127.0.0.1, as talboot's DHCP would have bound it (serve runs
/// with --no-dhcp here): a node's script goes only to its bound address.
fn lease_ctrl_01_at_loopback(tmp: &Path) {
    let store = talboot::store::open(&tmp.join("state"))
        .unwrap()
        .split()
        .1
        .leases;
    store
        .put_lease(&talboot::store::Lease {
            mac: "bc:24:11:40:00:01".parse().unwrap(),
            ip: "127.0.0.1".parse().unwrap(),
            hostname: None,
            state: talboot::store::LeaseState::Bound,
            expires_at_unix: u64::MAX / 2,
            updated_at_unix: 0,
        })
        .unwrap();
}

/// serve's arguments, its admin API on a free loopback port.
fn base_args(tmp: &Path, http: u16, tftp: u16) -> Vec<String> {
    with_admin(tmp, http, tftp, free_port())
}

/// serve's arguments, its admin API (`/api/*`, `/metrics`) on 127.0.0.1:`admin`.
fn with_admin(tmp: &Path, http: u16, tftp: u16, admin: u16) -> Vec<String> {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
    vec![
        "serve".into(),
        "-c".into(),
        config.display().to_string(),
        "--state-dir".into(),
        tmp.join("state").display().to_string(),
        "--images".into(),
        tmp.join("images").display().to_string(),
        "--ipxe-dir".into(),
        tmp.join("ipxe").display().to_string(),
        "--advertise".into(),
        "127.0.0.1".into(),
        "--http-port".into(),
        http.to_string(),
        "--tftp-port".into(),
        tftp.to_string(),
        "--admin-listen".into(),
        format!("127.0.0.1:{admin}"),
        "--no-dhcp".into(),
        "--no-provision".into(),
    ]
}

#[test]
fn refuses_to_start_without_artifacts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(base_args(tmp.path(), free_port(), free_udp_port()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("run: talboot images pull --talos v1.13.9 --schematic ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515 --arch amd64"),
        "{stderr}"
    );
}

#[test]
fn serves_http_and_tftp_then_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    fake_images(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
        &tmp.path().join("images"),
    );
    let ipxe: PathBuf = tmp.path().join("ipxe");
    std::fs::create_dir_all(&ipxe).unwrap();
    let efi: Vec<u8> = (0..100_000u32).map(|i| (i % 249) as u8).collect();
    std::fs::write(ipxe.join("ipxe.efi"), &efi).unwrap();
    // lab.yaml also boots unknown machines, which may be legacy BIOS.
    std::fs::write(ipxe.join("undionly.kpxe"), b"kpxe").unwrap();
    lease_ctrl_01_at_loopback(tmp.path());
    let (http, tftp, admin) = (free_port(), free_udp_port(), free_port());
    // serve's own words, for the failure message if it never comes up.
    let log = tmp.path().join("serve.err");
    let child = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(with_admin(tmp.path(), http, tftp, admin))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut served = Served { child: Some(child) };

    // Wait for the HTTP side to answer.
    let deadline = Instant::now() + Duration::from_secs(20);
    let script = loop {
        let out = Command::new("curl")
            .args([
                "-sf",
                &format!("http://127.0.0.1:{http}/boot.ipxe?mac=bc:24:11:40:00:01&arch=x86_64"),
            ])
            .output()
            .expect("curl is installed by scripts/test-deps");
        if out.status.success() {
            break String::from_utf8(out.stdout).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(script.contains("kernel http://127.0.0.1:"), "{script}");

    // TFTP: a real client fetches the EFI binary.
    let out_file = tmp.path().join("got.efi");
    let out = Command::new("curl")
        .args(["-sf", "--tftp-blksize", "1468", "-o"])
        .arg(&out_file)
        .arg(format!("tftp://127.0.0.1:{tftp}/ipxe.efi"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&out_file).unwrap(), efi);

    // Prometheus counters for what just happened.
    let metrics = Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{admin}/metrics")])
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.contains("talboot_http_scripts_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tftp"), "{metrics}");

    // SIGTERM: a clean, prompt exit.
    let mut child = served.child.take().unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));

    // The boot steps are on the node's timeline.
    let store = talboot::store::open(&tmp.path().join("state")).unwrap();
    use talboot::store::Store;
    let kinds: Vec<String> = store
        .events("k8s-ctrl-01", 0, 50)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&"http.script".to_string()), "{kinds:?}");
    // The lease names the node at 127.0.0.1, so the TFTP transfer from that address lands on
    // its timeline too.
    let tftp_events: Vec<String> = store
        .events("k8s-ctrl-01", 0, 50)
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.kind, e.detail))
        .collect();
    assert!(
        tftp_events
            .iter()
            .any(|e| e.starts_with("tftp.file ipxe.efi (100000 bytes)")),
        "{tftp_events:?}"
    );
}

#[test]
fn push_mode_refuses_to_start_without_its_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    fake_images(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
        &tmp.path().join("images"),
    );
    let mut args: Vec<String> = base_args(tmp.path(), free_port(), free_udp_port())
        .into_iter()
        .filter(|a| a != "--no-provision")
        .collect();
    // KSOPS (on in lab.yaml) has its own identity, so the secrets bundle is what is missing.
    let ksops = tmp.path().join("ksops.txt");
    {
        use age::secrecy::ExposeSecret;
        let key = age::x25519::Identity::generate();
        std::fs::write(&ksops, format!("{}\n", key.to_string().expose_secret())).unwrap();
    }
    args.extend(["--ksops-age-identity".into(), ksops.display().to_string()]);
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(args)
        .env_remove("SOPS_AGE_KEY")
        .env_remove("SOPS_AGE_KEY_FILE")
        .env("HOME", tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("push provisioning: "), "{stderr}");
    assert!(!stderr.contains("KSOPS"), "{stderr}");
    assert!(
        stderr.contains("pass --no-provision to serve boot files only"),
        "{stderr}"
    );
}

#[test]
fn ksops_without_an_age_identity_refuses_to_start_naming_the_flag() {
    // config/lab.yaml has addons.argocd.ksops: true.
    let tmp = tempfile::tempdir().unwrap();
    fake_images(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
        &tmp.path().join("images"),
    );
    let push: Vec<String> = base_args(tmp.path(), free_port(), free_udp_port())
        .into_iter()
        .filter(|a| a != "--no-provision")
        .collect();
    let run = |extra: &[String]| {
        let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
            .args(&push)
            .args(extra)
            .env_remove("SOPS_AGE_KEY")
            .env_remove("SOPS_AGE_KEY_FILE")
            .env_remove("TALBOOT_KSOPS_AGE_IDENTITY")
            .env("HOME", tmp.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&[]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("Argo CD KSOPS: ") && stderr.contains("--ksops-age-identity FILE"),
        "{stderr}"
    );

    // A file that holds no identity is refused by name.
    let bad = tmp.path().join("not-a-key.txt");
    std::fs::write(&bad, "# only a comment\n").unwrap();
    let (code, stderr) = run(&["--ksops-age-identity".into(), bad.display().to_string()]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(&bad.display().to_string()) && stderr.contains("AGE-SECRET-KEY-1"),
        "{stderr}"
    );
}

#[test]
fn node_rebuild_goes_through_a_running_serve() {
    let tmp = tempfile::tempdir().unwrap();
    fake_images(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
        &tmp.path().join("images"),
    );
    std::fs::create_dir_all(tmp.path().join("ipxe")).unwrap();
    for name in ["ipxe.efi", "undionly.kpxe"] {
        std::fs::write(tmp.path().join("ipxe").join(name), name).unwrap();
    }
    {
        // k8s-ctrl-02 was installed in an earlier run (a rebuild resets a provisioned node).
        use talboot::store::{NodePhase, NodeRecord};
        let store = talboot::store::open(&tmp.path().join("state"))
            .unwrap()
            .split()
            .1
            .nodes;
        let mut r = NodeRecord::unseen("k8s-ctrl-02", 1);
        r.phase = NodePhase::Ready;
        r.provisioning_window_open = false;
        store.put_node(&r).unwrap();
    }
    let (http, tftp, admin) = (free_port(), free_udp_port(), free_port());
    // serve's own words, for the failure message if it never comes up.
    let log = tmp.path().join("serve.err");
    let child = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(with_admin(tmp.path(), http, tftp, admin))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _served = Served { child: Some(child) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Command::new("curl")
        .args([
            "-sf",
            "-o",
            "/dev/null",
            &format!("http://127.0.0.1:{admin}/api/nodes"),
        ])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(["node", "rebuild", "k8s-ctrl-02", "-c"])
        .arg(&config)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("k8s-ctrl-02: marked for rebuild"));
    let nodes = Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{admin}/api/nodes")])
        .output()
        .unwrap();
    let nodes: serde_json::Value = serde_json::from_slice(&nodes.stdout).unwrap();
    let phase = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "k8s-ctrl-02")
        .map(|n| n["phase"].as_str().unwrap().to_string());
    assert_eq!(phase.as_deref(), Some("rebuilding"));

    // Issue 24 item 4: k8s-ctrl-03 was never provisioned: nothing to reset. serve's admin
    // API answers 409 with the reason, the CLI exits non-zero with it, nothing is marked.
    let (code, body) = {
        let out = Command::new("curl")
            .args(["-s", "-X", "POST", "-w", "\n%{http_code}"])
            .arg(format!(
                "http://127.0.0.1:{admin}/api/nodes/k8s-ctrl-03/rebuild"
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.trim_end().rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    assert_eq!(code, "409", "{body}");
    assert!(
        body.contains("k8s-ctrl-03 was never provisioned") && body.contains("first network boot"),
        "{body}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(["node", "rebuild", "k8s-ctrl-03", "-c"])
        .arg(&config)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("409") && stderr.contains("k8s-ctrl-03 was never provisioned"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("marked for rebuild"));
    let nodes = Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{admin}/api/nodes")])
        .output()
        .unwrap();
    let nodes: serde_json::Value = serde_json::from_slice(&nodes.stdout).unwrap();
    let phase = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "k8s-ctrl-03")
        .map(|n| n["phase"].as_str().unwrap_or_default().to_string());
    assert_ne!(phase.as_deref(), Some("rebuilding"));

    // `status` also works while serve holds the store. The phase is the record's (committed
    // before the command answered); the last-event column comes from the timeline, which the
    // event writer appends asynchronously, so it may lag a moment behind on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
            .args(["status", "-c"])
            .arg(&config)
            .arg("--state-dir")
            .arg(tmp.path().join("state"))
            .args(["--admin", &format!("127.0.0.1:{admin}")])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let table = String::from_utf8_lossy(&out.stdout).into_owned();
        let row = table
            .lines()
            .find(|l| l.starts_with("k8s-ctrl-02"))
            .unwrap_or_else(|| panic!("{table}"))
            .to_owned();
        assert!(row.contains("rebuilding"), "{table}");
        if row.contains("node.phase: rebuilding") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no rebuild event in status:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Issue 24 item 4, standalone (no serve): `talboot node rebuild` of a node talboot never
/// provisioned exits non-zero with the reason and what happens instead, before it asks for
/// credentials, probes the node or touches its power, and writes nothing.
#[test]
fn node_rebuild_of_a_node_never_provisioned_is_refused() {
    use base64::Engine as _;
    let tmp = tempfile::tempdir().unwrap();
    // The lab inventory moved to loopback addresses (so nothing leaves the machine, whatever
    // the command tries), with an admin talosconfig: everything a rebuild needs is there.
    let lab = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let text = std::fs::read_to_string(lab.join("lab.yaml"))
        .unwrap()
        .replace("10.0.40.", "127.0.40.")
        .replace("10.0.70.", "127.0.70.");
    let config = tmp.path().join("lab.yaml");
    std::fs::write(&config, text).unwrap();
    std::fs::create_dir_all(tmp.path().join("patches")).unwrap();
    std::fs::copy(
        lab.join("patches/common.yaml"),
        tmp.path().join("patches/common.yaml"),
    )
    .unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = talboot::sim::pki::SimCa::new_os_ca().unwrap();
    let admin = ca.admin().unwrap();
    let talosconfig = tmp.path().join("talosconfig");
    std::fs::write(
        &talosconfig,
        format!(
            "context: t\ncontexts:\n  t:\n    endpoints: []\n    ca: {}\n    crt: {}\n    key: {}\n",
            b64(&ca.cert_pem),
            b64(&admin.cert_pem),
            b64(&talboot::sim::pki::talos_label(&admin.key_pem))
        ),
    )
    .unwrap();
    let state = tmp.path().join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(["node", "rebuild", "k8s-ctrl-03", "-c"])
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--talosconfig")
        .arg(&talosconfig)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("node k8s-ctrl-03 was never provisioned")
            && stderr.contains("nothing to reset")
            && stderr.contains("first network boot"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
    use talboot::store::Store;
    let store = talboot::store::open(&state).unwrap();
    assert!(store.node("k8s-ctrl-03").unwrap().is_none());
}

/// `--http-max-connections`: the connection over the cap is held (not answered, not dropped),
/// counted in `talboot_http_connections_over_cap_total`, logged, and answered once a slot frees.
#[test]
fn the_http_connection_over_the_cap_waits_and_is_counted() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    fake_images(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
        &tmp.path().join("images"),
    );
    let ipxe: PathBuf = tmp.path().join("ipxe");
    std::fs::create_dir_all(&ipxe).unwrap();
    std::fs::write(ipxe.join("ipxe.efi"), b"efi").unwrap();
    std::fs::write(ipxe.join("undionly.kpxe"), b"kpxe").unwrap();
    let (http, tftp, admin) = (free_port(), free_udp_port(), free_port());
    let log = tmp.path().join("serve.err");
    let mut args = with_admin(tmp.path(), http, tftp, admin);
    args.extend(["--no-tftp", "--http-max-connections", "1"].map(String::from));
    let child = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _served = Served { child: Some(child) };
    let get = b"GET /boot.ipxe HTTP/1.1\r\nHost: t\r\n\r\n";
    let connect = || {
        let s = std::net::TcpStream::connect(("127.0.0.1", http))?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok::<_, std::io::Error>(s)
    };
    let answered = |s: &mut std::net::TcpStream| {
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).map(|_| buf.to_vec())
    };

    // The one slot, taken by a kept-alive connection (once serve answers on it). A debug
    // build on a loaded machine can take long to start; the deadline is only a hang guard.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first = loop {
        if let Ok(mut s) = connect()
            && s.write_all(get).is_ok()
            && answered(&mut s).is_ok_and(|b| b == b"HTTP/1.1 200")
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut drain = [0u8; 4096];
    first
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while first.read(&mut drain).is_ok_and(|n| n > 0) {}

    let mut second = connect().unwrap();
    second.write_all(get).unwrap();
    let metric = "talboot_http_connections_over_cap_total{listener=\"provisioning\"} 1";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{admin}/metrics")])
            .output()
            .unwrap();
        let m = String::from_utf8_lossy(&m.stdout);
        if m.contains(metric) {
            break;
        }
        assert!(Instant::now() < deadline, "no {metric}:\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Counted, and not answered while the slot is taken...
    second
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        answered(&mut second).is_err(),
        "answered beside the connection holding the only slot"
    );
    // ...then answered once it frees.
    drop(first);
    second
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(answered(&mut second).unwrap(), b"HTTP/1.1 200");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("HTTP connection cap reached"), "{log}");
}
