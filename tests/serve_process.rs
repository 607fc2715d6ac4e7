//! `talboot serve` as an operator's process: what it writes to a pipe or a file (no ANSI
//! colour off a terminal), and how it stops on SIGTERM while its provisioner is mid-work
//! against the strict Talos double (`talboot::sim::talos`): it exits within a bounded time
//! and opens no Talos API connection after the signal.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::images::fake_images;

/// Kills the child on drop, so a failed assertion leaves no process behind.
struct Served(Option<Child>);

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
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

/// Boot-files-only serve of `config/lab.yaml` on loopback (no DHCP, TFTP or provisioning).
fn boot_files_only(tmp: &Path) -> Command {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
    fake_images(&config, &tmp.join("images"));
    let mut c = Command::new(env!("CARGO_BIN_EXE_talboot"));
    c.arg("serve")
        .arg("-c")
        .arg(&config)
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .arg("--images")
        .arg(tmp.join("images"))
        .args(["--advertise", "127.0.0.1", "--http-port"])
        .arg(free_port().to_string())
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--no-dhcp",
            "--no-tftp",
            "--no-provision",
        ])
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info");
    c
}

/// Reads `stderr` until `marker` appears; returns what was read.
fn read_until(stderr: impl Read + Send + 'static, marker: &'static str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(marker) {
                break;
            }
        }
        let _ = tx.send(seen);
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("serve wrote nothing within 30 s")
}

fn sigterm(child: &Child) {
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn logs_to_a_pipe_or_a_file_carry_no_colour() {
    // A pipe.
    let tmp = tempfile::tempdir().unwrap();
    let mut child = boot_files_only(tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let served = Served(Some(child));
    let piped = read_until(stderr, "talboot serving");
    assert!(piped.contains("talboot serving"), "{piped}");
    assert!(
        !piped.contains('\u{1b}'),
        "ANSI escapes in piped logs:\n{piped:?}"
    );
    sigterm(served.0.as_ref().unwrap());
    drop(served);

    // A file.
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("serve.log");
    let child = boot_files_only(tmp.path())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let served = Served(Some(child));
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("talboot serving") {
            break text;
        }
        assert!(Instant::now() < deadline, "serve did not come up:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escapes in the log file:\n{text:?}"
    );
    sigterm(served.0.as_ref().unwrap());
    drop(served);

    // The control: on a terminal (util-linux `script` gives it a pty) there is colour, and
    // NO_COLOR takes it away again, so the two checks above can fail.
    for (no_color, want_colour) in [(None, true), (Some("1"), false)] {
        let tmp = tempfile::tempdir().unwrap();
        let cmd = boot_files_only(tmp.path());
        let mut line = format!("exec {}", env!("CARGO_BIN_EXE_talboot"));
        for a in cmd.get_args() {
            line.push_str(&format!(" '{}'", a.to_string_lossy()));
        }
        let mut script = Command::new("script");
        script
            .args(["-qfec", &line, "/dev/null"])
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(v) = no_color {
            script.env("NO_COLOR", v);
        }
        let mut child = script.spawn().expect("`script` (util-linux) is installed");
        let out = child.stdout.take().unwrap();
        let served = Served(Some(child));
        let tty = read_until(out, "talboot serving");
        assert!(tty.contains("talboot serving"), "{tty}");
        assert_eq!(
            tty.contains("\u{1b}["),
            want_colour,
            "NO_COLOR={no_color:?}:\n{tty:?}"
        );
        // Killing `script` closes the pty; serve gets SIGHUP and ends with it.
        drop(served);
    }
}

/// Counts the Talos API connections talboot opens (each accepted at this proxy in front of
/// the double, with the time it was accepted); while `stall` is set, connections are held
/// open without a byte forwarded, so a call is in flight for as long as the test likes.
#[derive(Clone, Default)]
struct ApidProxy {
    accepted: Arc<Mutex<Vec<Instant>>>,
    stall: Arc<std::sync::atomic::AtomicBool>,
}

impl ApidProxy {
    async fn run(self, listen: SocketAddr, upstream: SocketAddr) {
        let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            self.accepted.lock().unwrap().push(Instant::now());
            let stall = self.stall.load(std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                if stall {
                    tokio::time::sleep(Duration::from_secs(120)).await;
                    return;
                }
                if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
            });
        }
    }

    fn count(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }
}

#[test]
fn sigterm_mid_provisioning_exits_promptly_and_opens_no_new_talos_connection() {
    use age::secrecy::ExposeSecret;
    use talboot::store::{Lease, LeaseState, NodePhase, NodeRecord};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let node_ip = Ipv4Addr::new(127, 0, 93, 11);
    let mac = "02:00:00:93:00:11";
    let key = age::x25519::Identity::generate();
    let secret_key = key.to_string().expose_secret().to_owned();
    let inventory = dir.join("talboot.yaml");
    std::fs::write(
        &inventory,
        format!(
            "cluster:
  name: sigterm
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{node_ip}:6443
  secrets:
    file: secrets.age
    ageRecipients: [{}]
network:
  interfaces: [lo]
  subnet: 127.0.93.0/24
  advertise: 127.0.93.1
boot:
  delivery: push
nodes:
  - name: cp-1
    mac: {mac}
    role: controlplane
    address: {node_ip}/24
    installDisk: /dev/sda
    firmware: uefi
",
            key.to_public()
        ),
    )
    .unwrap();
    let talboot = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
            .args(args)
            .arg("-c")
            .arg(&inventory)
            .env("SOPS_AGE_KEY", &secret_key)
            .env_remove("SOPS_AGE_KEY_FILE")
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "talboot {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    talboot(&["secrets", "init"]);
    talboot(&["gen", "-o", dir.join("out").to_str().unwrap()]);
    fake_images(&inventory, &dir.join("images"));

    // The node has booted and holds its lease: the provisioner starts probing it at once.
    let state = dir.join("state");
    {
        let w = talboot::store::open(&state).unwrap().split().1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        w.leases
            .put_lease(&Lease {
                mac: mac.parse().unwrap(),
                ip: node_ip,
                hostname: Some("cp-1".into()),
                state: LeaseState::Bound,
                expires_at_unix: now + 3600,
                updated_at_unix: now,
            })
            .unwrap();
        w.nodes
            .put_node(&NodeRecord {
                name: "cp-1".into(),
                phase: NodePhase::Booting,
                phase_since_unix: now,
                last_seen_addr: Some(node_ip),
                mac: Some(mac.parse().unwrap()),
                talos_version: None,
                provisioning_window_open: true,
                updated_at_unix: now,
            })
            .unwrap();
        // It fetched its Talos boot script from talboot (what the HTTP server records): only
        // machines that network-booted Talos are probed.
        w.events
            .append_event(
                "cp-1",
                talboot::events::EventKind::Script.as_str(),
                "talos script",
                now * 1000,
            )
            .unwrap();
    }

    // The strict Talos double on :50001, behind the counting proxy on apid's :50000.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = talboot::sim::talos::FakeCluster::new();
    let mut cfg = talboot::sim::talos::FakeNodeConfig::new(node_ip.into(), "cp-1");
    cfg.port = 50001;
    let double = rt
        .block_on(talboot::sim::talos::FakeTalosNode::start(cfg, &cluster))
        .unwrap();
    let proxy = ApidProxy::default();
    rt.spawn(proxy.clone().run(
        SocketAddr::new(node_ip.into(), 50000),
        SocketAddr::new(node_ip.into(), 50001),
    ));

    let log = dir.join("serve.log");
    let child = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .arg("serve")
        .arg("-c")
        .arg(&inventory)
        .arg("--state-dir")
        .arg(&state)
        .arg("--images")
        .arg(dir.join("images"))
        .arg("--configs")
        .arg(dir.join("out"))
        .args(["--http-port", &free_port().to_string()])
        .args(["--admin-listen", "127.0.0.1:0", "--no-dhcp", "--no-tftp"])
        .env("SOPS_AGE_KEY", &secret_key)
        .env_remove("SOPS_AGE_KEY_FILE")
        .env("RUST_LOG", "info")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut served = Served(Some(child));
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // Mid-work: the double has its config and is installing; from now on every connection
    // talboot opens hangs, as a node busy installing or rebooting would leave a call hanging.
    let deadline = Instant::now() + Duration::from_secs(60);
    while double.apply_calls() == 0 {
        assert!(
            Instant::now() < deadline,
            "the config was never applied:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    proxy.stall.store(true, std::sync::atomic::Ordering::SeqCst);
    let before = proxy.count();
    while proxy.count() == before {
        assert!(
            Instant::now() < deadline,
            "talboot made no call after the apply:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));

    let child = served.0.as_mut().unwrap();
    let signalled = Instant::now();
    sigterm(child);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(30),
            "serve still running 30 s after SIGTERM:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = signalled.elapsed();
    served.0 = None;
    eprintln!(
        "serve exited {took:?} after SIGTERM; {} Talos connections in all",
        proxy.count()
    );
    assert_eq!(status.code(), Some(0), "{}", log_text());
    // A few seconds: talboot's shutdown grace (3 s) bounds it, and an idle or mid-call
    // provisioner stops at once.
    assert!(
        took < Duration::from_secs(5),
        "serve took {took:?} to exit after SIGTERM:\n{}",
        log_text()
    );
    let late: Vec<Duration> = proxy
        .accepted
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t > signalled)
        .map(|t| t.duration_since(signalled))
        .collect();
    assert!(
        late.is_empty(),
        "Talos API connections opened after SIGTERM (at +{late:?}):\n{}",
        log_text()
    );
    rt.block_on(double.shutdown());
}

/// serve of `config/lab.yaml` (UEFI nodes, unknown machines booted too) with TFTP and HTTP on
/// loopback and the given iPXE directory.
fn serve_with_ipxe(tmp: &Path, ipxe: &Path, http: u16, tftp: u16) -> Command {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
    fake_images(&config, &tmp.join("images"));
    let mut c = Command::new(env!("CARGO_BIN_EXE_talboot"));
    c.arg("serve")
        .arg("-c")
        .arg(&config)
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .arg("--images")
        .arg(tmp.join("images"))
        .arg("--ipxe-dir")
        .arg(ipxe)
        .args(["--advertise", "127.0.0.1"])
        .args([
            "--http-port",
            &http.to_string(),
            "--tftp-port",
            &tftp.to_string(),
        ])
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--no-dhcp",
            "--no-provision",
        ]);
    c
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn debian_symlinked_ipxe_efi_is_served_and_nothing_outside_the_set() {
    // Debian 12: /usr/lib/ipxe/ipxe.efi -> /boot/ipxe.efi, both from the ipxe package.
    let tmp = tempfile::tempdir().unwrap();
    let boot = tmp.path().join("boot");
    let ipxe = tmp.path().join("usr-lib-ipxe");
    std::fs::create_dir_all(&boot).unwrap();
    std::fs::create_dir_all(&ipxe).unwrap();
    let efi: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(boot.join("ipxe.efi"), &efi).unwrap();
    std::fs::write(boot.join("secret"), b"not a boot file").unwrap();
    std::os::unix::fs::symlink(boot.join("ipxe.efi"), ipxe.join("ipxe.efi")).unwrap();
    std::os::unix::fs::symlink(boot.join("secret"), ipxe.join("secret")).unwrap();
    std::fs::write(ipxe.join("undionly.kpxe"), b"kpxe").unwrap();
    let (http, tftp) = (free_port(), free_udp_port());
    let log = tmp.path().join("serve.log");
    let child = serve_with_ipxe(tmp.path(), &ipxe, http, tftp)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let served = Served(Some(child));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("talboot serving")
    {
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let curl = |url: String, out: &Path| {
        Command::new("curl")
            .args(["-sf", "--tftp-blksize", "1468", "-o"])
            .arg(out)
            .arg(url)
            .output()
            .expect("curl is installed by scripts/test-deps")
    };
    // TFTP, as UEFI PXE fetches it, and HTTP, as UEFI HTTP boot does.
    let got = tmp.path().join("got.efi");
    let out = curl(format!("tftp://127.0.0.1:{tftp}/ipxe.efi"), &got);
    assert!(
        out.status.success(),
        "TFTP ipxe.efi: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(std::fs::read(&got).unwrap(), efi);
    let got = tmp.path().join("got-http.efi");
    let out = curl(format!("http://127.0.0.1:{http}/ipxe.efi"), &got);
    assert!(out.status.success(), "HTTP ipxe.efi");
    assert_eq!(std::fs::read(&got).unwrap(), efi);
    // Every other name is refused, symlink or not.
    for name in ["secret", "snponly.efi", "../boot/ipxe.efi"] {
        let got = tmp.path().join("refused");
        let out = curl(format!("tftp://127.0.0.1:{tftp}/{name}"), &got);
        assert!(!out.status.success(), "TFTP {name} was served");
    }
    let out = curl(
        format!("http://127.0.0.1:{http}/secret"),
        &tmp.path().join("x"),
    );
    assert!(!out.status.success(), "HTTP /secret was served");
    sigterm(served.0.as_ref().unwrap());
    drop(served);
}

#[test]
fn serve_refuses_to_start_naming_the_ipxe_binary_it_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let ipxe = tmp.path().join("ipxe");
    std::fs::create_dir_all(&ipxe).unwrap();
    // lab.yaml's nodes are UEFI (ipxe.efi) and unknown machines may be BIOS (undionly.kpxe).
    std::fs::write(ipxe.join("undionly.kpxe"), b"kpxe").unwrap();
    // A dangling symlink, as a removed /boot/ipxe.efi leaves behind.
    std::os::unix::fs::symlink(tmp.path().join("gone/ipxe.efi"), ipxe.join("ipxe.efi")).unwrap();
    let out = serve_with_ipxe(tmp.path(), &ipxe, free_port(), free_udp_port())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "iPXE binary {} cannot be served",
            ipxe.join("ipxe.efi").display()
        )) && stderr.contains("symlink to")
            && stderr.contains("--ipxe-dir"),
        "{stderr}"
    );
}
