//! Real TFTP clients against talboot's TFTP server on loopback.
//!
//! tftp-hpa, atftp and curl (Debian packages, installed by `scripts/test-deps`) fetch a
//! generated `ipxe.efi` with default and large block sizes, windowed, and across the 16-bit
//! block-number wrap; traversal and missing paths must come back as TFTP errors. A missing
//! client fails the test unless `TALBOOT_SKIP_TFTP`, `TALBOOT_SKIP_ATFTP` or
//! `TALBOOT_SKIP_CURL` is set.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use talboot::tftp::packet::ErrorCode;
use talboot::tftp::{TftpConfig, TftpServer, TransferEvent, TransferOutcome};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Size of the generated `ipxe.efi`: about the size of a real one.
const IPXE_SIZE: usize = 1_048_576 + 123;
// The atftp OACK check spells the size out.
const _: () = assert!(IPXE_SIZE == 1_048_699);

/// A TFTP server on 127.0.0.1 with its own runtime and temp root; stopped when dropped.
struct Server {
    port: u16,
    root: tempfile::TempDir,
    out: tempfile::TempDir,
    events: mpsc::Receiver<TransferEvent>,
    cancel: CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Server {
    fn start() -> Server {
        Server::start_with(TftpConfig::default())
    }

    fn start_with(config: TftpConfig) -> Server {
        let root = tempfile::tempdir().unwrap();
        fs::write(
            root.path().join("ipxe.efi"),
            pseudo_random(IPXE_SIZE, 0x1badb002),
        )
        .unwrap();
        fs::create_dir(root.path().join("sub")).unwrap();
        fs::write(root.path().join("sub/file"), b"a file in a subdirectory\n").unwrap();
        // 75,000 blocks of 8 bytes: fetching it with blksize 8 crosses block number 65535.
        fs::write(
            root.path().join("wrap.bin"),
            pseudo_random(75_000 * 8 + 3, 7),
        )
        .unwrap();

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (tx, events) = mpsc::channel(256);
        let server = TftpServer::new(config, root.path())
            .unwrap()
            .with_events(tx);
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let socket = runtime.block_on(TftpServer::bind(addr)).unwrap();
        let port = socket.local_addr().unwrap().port();
        let cancel = CancellationToken::new();
        let _serving = runtime.spawn(server.serve(socket, cancel.clone()));
        Server {
            port,
            root,
            out: tempfile::tempdir().unwrap(),
            events,
            cancel,
            runtime: Some(runtime),
        }
    }

    fn file(&self, name: &str) -> Vec<u8> {
        fs::read(self.root.path().join(name)).unwrap()
    }

    fn out_path(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }

    /// The next transfer event, waiting at most 30 s (a safety net, not a timing check).
    fn next_event(&mut self) -> TransferEvent {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.events.try_recv() {
                Ok(event) => return event,
                Err(mpsc::error::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("no transfer event: {e}"),
            }
        }
    }

    /// The first event from `ip` matching `want`, skipping others (a safety net of 200 events).
    fn expect_event_from(
        &mut self,
        ip: &str,
        want: impl Fn(&TransferOutcome) -> bool,
    ) -> TransferEvent {
        for _ in 0..200 {
            let event = self.next_event();
            if event.peer.ip().to_string() == ip && want(&event.outcome) {
                return event;
            }
        }
        panic!("no matching transfer event from {ip}");
    }

    /// Skip events of the given outcome kind (curl and atftp may probe or retry).
    fn expect_event(
        &mut self,
        file: &str,
        want: impl Fn(&TransferOutcome) -> bool,
    ) -> TransferEvent {
        for _ in 0..10 {
            let event = self.next_event();
            if event.file == file && want(&event.outcome) {
                return event;
            }
        }
        panic!("no matching transfer event for {file}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Whether `tool` is installed; a missing tool fails the test unless `skip_var` is set.
fn require(tool: &str, package: &str, skip_var: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        return true;
    }
    if std::env::var_os(skip_var).is_some() {
        eprintln!("skipping: `{tool}` is not installed and {skip_var} is set");
        return false;
    }
    panic!(
        "`{tool}` (Debian package {package}) is not installed; run scripts/test-deps, or set \
         {skip_var}=1 to skip this test deliberately"
    );
}

struct Run {
    status: std::process::ExitStatus,
    output: String,
}

/// Run a client with a 120 s safety limit; stdout and stderr are combined for assertions.
fn run(cmd: &mut Command, scratch: &Path) -> Run {
    let log_path = scratch.join(format!("client-{}.log", rand_suffix()));
    let log = fs::File::create(&log_path).unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let limit = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = fs::read_to_string(&log_path).unwrap_or_default();
    Run { status, output }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn assert_same(got: &Path, want: &[u8], what: &str) {
    let got = fs::read(got).unwrap_or_else(|e| panic!("{what}: no output file: {e}"));
    assert_eq!(got.len(), want.len(), "{what}: size differs");
    assert!(got == want, "{what}: content differs");
}

fn completed(o: &TransferOutcome) -> bool {
    *o == TransferOutcome::Completed
}

fn refused(code: ErrorCode) -> impl Fn(&TransferOutcome) -> bool {
    move |o| matches!(o, TransferOutcome::Refused { code: c, .. } if *c == code)
}

#[test]
fn tftp_hpa_fetches_files() {
    if !require("tftp", "tftp-hpa", "TALBOOT_SKIP_TFTP") {
        return;
    }
    let mut server = Server::start();
    let port = server.port.to_string();
    // tftp-hpa's client sends no options: lockstep, 512-byte blocks.
    for (name, out) in [("ipxe.efi", "hpa-ipxe.efi"), ("sub/file", "hpa-file")] {
        let dest = server.out_path(out);
        let r = run(
            Command::new("tftp")
                .args(["-m", "binary", "127.0.0.1", &port, "-c", "get", name])
                .arg(&dest),
            server.out.path(),
        );
        assert!(r.status.success(), "tftp get {name}: {}", r.output);
        assert_same(&dest, &server.file(name), name);
        let event = server.expect_event(name, completed);
        assert_eq!(event.bytes, server.file(name).len() as u64);
    }
}

#[test]
fn tftp_hpa_gets_errors_for_traversal_and_missing_files() {
    if !require("tftp", "tftp-hpa", "TALBOOT_SKIP_TFTP") {
        return;
    }
    let mut server = Server::start();
    let port = server.port.to_string();
    for (name, code, text) in [
        ("../etc/passwd", ErrorCode::AccessViolation, "Error code 2"),
        (
            "sub/../../etc/passwd",
            ErrorCode::AccessViolation,
            "Error code 2",
        ),
        ("nope.efi", ErrorCode::FileNotFound, "Error code 1"),
    ] {
        let dest = server.out_path("hpa-refused");
        let r = run(
            Command::new("tftp")
                .args(["-m", "binary", "127.0.0.1", &port, "-c", "get", name])
                .arg(&dest),
            server.out.path(),
        );
        assert!(r.output.contains(text), "tftp get {name}: {}", r.output);
        let got = fs::read(&dest).unwrap_or_default();
        assert!(got.is_empty(), "{name}: client received data");
        server.expect_event(name, refused(code));
    }
}

#[test]
fn atftp_fetches_with_default_and_negotiated_options() {
    if !require("atftp", "atftp", "TALBOOT_SKIP_ATFTP") {
        return;
    }
    let mut server = Server::start();
    let port = server.port.to_string();
    let want = server.file("ipxe.efi");
    // (what, options, what the OACK must say). `--trace` prints the OACK the client received.
    // atftp's documented `tsize enable` sends the literal word "enable", which is not a number
    // and is ignored (RFC 2349 asks for 0), so the test asks with `tsize 0` like firmware does.
    let cases: [(&str, &[&str], &[&str]); 4] = [
        ("default", &[], &[]),
        (
            "blksize 1468 tsize 0",
            &["--option", "blksize 1468", "--option", "tsize 0"],
            &["blksize: 1468", "tsize: 1048699"],
        ),
        (
            "blksize 1468 windowsize 8",
            &["--option", "blksize 1468", "--option", "windowsize 8"],
            &["blksize: 1468", "windowsize: 8"],
        ),
        (
            "blksize 8192 (capped to 1468)",
            &["--option", "blksize 8192"],
            &["blksize: 1468"],
        ),
    ];
    for (i, (what, options, oack)) in cases.iter().enumerate() {
        let dest = server.out_path(&format!("atftp-{i}"));
        let mut cmd = Command::new("atftp");
        if !oack.is_empty() {
            cmd.arg("--trace");
        }
        let r = run(
            cmd.args(*options)
                .args(["--get", "-r", "ipxe.efi", "-l"])
                .arg(&dest)
                .args(["127.0.0.1", &port]),
            server.out.path(),
        );
        assert!(r.status.success(), "atftp {what}: {}", r.output);
        assert_same(&dest, &want, what);
        if !oack.is_empty() {
            let line = r
                .output
                .lines()
                .find(|l| l.contains("received OACK"))
                .unwrap_or_else(|| panic!("atftp {what}: no OACK in the trace"));
            for item in *oack {
                assert!(line.contains(item), "atftp {what}: `{line}` lacks `{item}`");
            }
        }
        let event = server.expect_event("ipxe.efi", completed);
        assert_eq!(event.bytes, want.len() as u64, "{what}");
    }
}

#[test]
fn atftp_gets_errors_for_traversal_and_missing_files() {
    if !require("atftp", "atftp", "TALBOOT_SKIP_ATFTP") {
        return;
    }
    let mut server = Server::start();
    let port = server.port.to_string();
    for (name, code) in [
        ("../etc/passwd", ErrorCode::AccessViolation),
        ("/etc/passwd", ErrorCode::AccessViolation),
        ("nope.efi", ErrorCode::FileNotFound),
    ] {
        let dest = server.out_path("atftp-refused");
        let r = run(
            Command::new("atftp")
                .args(["--get", "-r", name, "-l"])
                .arg(&dest)
                .args(["127.0.0.1", &port]),
            server.out.path(),
        );
        assert!(!r.status.success(), "atftp {name} succeeded: {}", r.output);
        let got = fs::read(&dest).unwrap_or_default();
        assert!(got.is_empty(), "{name}: client received data");
        server.expect_event(name, refused(code));
    }
}

#[test]
fn curl_fetches_with_default_large_and_capped_blksize() {
    if !require("curl", "curl", "TALBOOT_SKIP_CURL") {
        return;
    }
    let mut server = Server::start();
    let want = server.file("ipxe.efi");
    let url = format!("tftp://127.0.0.1:{}/ipxe.efi", server.port);
    // curl always sends blksize (512 by default) and tsize; `-v` shows what the OACK granted.
    for (i, asked, granted) in [
        (0, None, 512),
        (1, Some("1468"), 1468),
        (2, Some("8192"), 1468),
    ] {
        let dest = server.out_path(&format!("curl-{i}"));
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-v", "--max-time", "100", "-o"])
            .arg(&dest);
        if let Some(b) = asked {
            cmd.args(["--tftp-blksize", b]);
        }
        let r = run(cmd.arg(&url), server.out.path());
        assert!(r.status.success(), "curl blksize {asked:?}: {}", r.output);
        assert_same(&dest, &want, &format!("curl blksize {asked:?}"));
        let wanted = format!("blksize parsed from OACK ({granted})");
        assert!(
            r.output.contains(&wanted),
            "curl blksize {asked:?}: {}",
            r.output
        );
        assert!(
            r.output
                .contains(&format!("tsize parsed from OACK ({IPXE_SIZE})")),
            "curl: {}",
            r.output
        );
        server.expect_event("ipxe.efi", completed);
    }
}

#[test]
fn curl_fetches_across_the_block_number_wrap() {
    if !require("curl", "curl", "TALBOOT_SKIP_CURL") {
        return;
    }
    let mut server = Server::start();
    let want = server.file("wrap.bin");
    let dest = server.out_path("curl-wrap");
    let url = format!("tftp://127.0.0.1:{}/wrap.bin", server.port);
    let r = run(
        Command::new("curl")
            .args(["-sS", "--max-time", "110", "--tftp-blksize", "8", "-o"])
            .arg(&dest)
            .arg(&url),
        server.out.path(),
    );
    assert!(r.status.success(), "curl blksize 8: {}", r.output);
    assert_same(&dest, &want, "75,000 blocks of 8 bytes");
    let event = server.expect_event("wrap.bin", completed);
    assert_eq!(event.bytes, want.len() as u64);
}

#[test]
fn curl_gets_errors_for_traversal_and_missing_files() {
    if !require("curl", "curl", "TALBOOT_SKIP_CURL") {
        return;
    }
    let mut server = Server::start();
    // curl exits 69 for a TFTP access violation and 68 for file not found. `--path-as-is`
    // stops curl from resolving `..` itself; curl drops the URL's leading slash.
    for (path, code, exit) in [
        ("../etc/passwd", ErrorCode::AccessViolation, 69),
        ("sub/..\\..\\x", ErrorCode::AccessViolation, 69),
        ("nope.efi", ErrorCode::FileNotFound, 68),
    ] {
        let dest = server.out_path("curl-refused");
        let url = format!("tftp://127.0.0.1:{}/{path}", server.port);
        let r = run(
            Command::new("curl")
                .args(["-sS", "--path-as-is", "--max-time", "30", "-o"])
                .arg(&dest)
                .arg(&url),
            server.out.path(),
        );
        assert_eq!(r.status.code(), Some(exit), "curl {path}: {}", r.output);
        server.expect_event(path, refused(code));
    }
}

#[test]
fn curl_fetches_while_another_host_floods_requests_it_never_acknowledges() {
    // Issue 12's starving host: 80 RRQs with timeout=255 from one address, never acknowledged,
    // against the old fixed table of 64; then another machine fetches ipxe.efi.
    if !require("curl", "curl", "TALBOOT_SKIP_CURL") {
        return;
    }
    let mut server = Server::start_with(TftpConfig {
        max_transfers: 64,
        ..TftpConfig::default()
    });
    let hostile = std::net::UdpSocket::bind("127.0.0.66:0").unwrap();
    let rrq = b"\x00\x01ipxe.efi\x00octet\x00timeout\x00255\x00tsize\x000\x00blksize\x001468\x00";
    for _ in 0..80 {
        hostile.send_to(rrq, ("127.0.0.1", server.port)).unwrap();
    }
    let want = server.file("ipxe.efi");
    let dest = server.out_path("curl-victim");
    let url = format!("tftp://127.0.0.1:{}/ipxe.efi", server.port);
    let r = run(
        Command::new("curl")
            .args(["-sS", "--max-time", "60", "--interface", "127.0.0.2"])
            .args(["--tftp-blksize", "1468", "-o"])
            .arg(&dest)
            .arg(&url),
        server.out.path(),
    );
    assert!(r.status.success(), "curl beside the flood: {}", r.output);
    assert_same(&dest, &want, "ipxe.efi beside the flood");
    let event = server.expect_event_from("127.0.0.2", completed);
    assert_eq!(event.bytes, want.len() as u64);
    drop(hostile);
}

#[test]
fn curl_clients_beyond_a_full_table_wait_and_all_complete() {
    if !require("curl", "curl", "TALBOOT_SKIP_CURL") {
        return;
    }
    // Twelve machines, three slots: nine requests wait for a slot instead of being dropped.
    let mut server = Server::start_with(TftpConfig {
        max_transfers: 3,
        ..TftpConfig::default()
    });
    let want = server.file("ipxe.efi");
    let url = format!("tftp://127.0.0.1:{}/ipxe.efi", server.port);
    let children: Vec<_> = (1..=12)
        .map(|i| {
            let dest = server.out_path(&format!("curl-many-{i}"));
            let child = Command::new("curl")
                .args(["-sS", "--max-time", "100", "--interface"])
                .arg(format!("127.0.3.{i}"))
                .args(["--tftp-blksize", "1468", "-o"])
                .arg(&dest)
                .arg(&url)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (child, dest)
        })
        .collect();
    for (mut child, dest) in children {
        let status = child.wait().unwrap();
        assert!(status.success(), "curl to {}: {status}", dest.display());
        assert_same(&dest, &want, &dest.display().to_string());
    }
    let mut completed_count = 0;
    while completed_count < 12 {
        let event = server.next_event();
        assert_eq!(event.outcome, TransferOutcome::Completed, "{event:?}");
        completed_count += 1;
    }
}
