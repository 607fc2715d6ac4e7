//! A throwaway single-member etcd for tests: Debian's `etcd` binary (`etcd-server`, 3.4, as
//! `scripts/test-deps` installs it) on free loopback ports with a temporary data directory,
//! killed and removed when the guard drops (a failing test unwinds through the drop too).
//!
//! Without the binary a test is skipped with a note, except under `CI=true`, where it fails:
//! CI must never pass by not running the etcd tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{EtcdConfig, EtcdStore};

/// A running etcd member; dropping it kills the process and deletes its data.
pub(crate) struct EtcdServer {
    child: Child,
    client: SocketAddr,
    dir: tempfile::TempDir,
}

/// `etcd` on the PATH, or `None` (a skip), or a panic under `CI=true`.
fn binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("etcd"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "etcd is not installed, and CI=true forbids skipping: run scripts/test-deps"
        );
        eprintln!("skipping: etcd is not installed (scripts/test-deps installs etcd-server)");
    }
    found
}

/// A loopback port nothing listens on right now.
fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("its address")
}

impl EtcdServer {
    /// Start one member and wait until `/health` says so (10 s at most).
    pub(crate) fn start() -> Option<Self> {
        let bin = binary()?;
        let dir = tempfile::tempdir().expect("temporary directory");
        let (client, peer) = (free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
        let child = Command::new(bin)
            .args(["--name", "t"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg(format!("--listen-client-urls=http://{client}"))
            .arg(format!("--advertise-client-urls=http://{client}"))
            .arg(format!("--listen-peer-urls=http://{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
            .arg(format!("--initial-cluster=t=http://{peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let server = Self { child, client, dir };
        server.wait_healthy();
        Some(server)
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.healthy() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        panic!(
            "etcd on {} not healthy after 10 s; its log:\n{log}",
            self.client
        );
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.client, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let req = format!("GET /health HTTP/1.0\r\nHost: {}\r\n\r\n", self.client);
        let mut body = String::new();
        s.write_all(req.as_bytes()).is_ok()
            && s.read_to_string(&mut body).is_ok()
            && body.contains("\"health\":\"true\"")
    }

    /// The client URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.client)
    }

    /// A store configuration for `cluster` on this member, with short timeouts.
    pub(crate) fn config(&self, cluster: &str) -> EtcdConfig {
        let mut cfg = EtcdConfig::new(vec![self.url()], cluster);
        cfg.connect_timeout = Duration::from_secs(2);
        cfg.request_timeout = Duration::from_secs(3);
        cfg
    }

    /// Open a store for `cluster` on this member.
    pub(crate) fn open(&self, cluster: &str) -> EtcdStore {
        EtcdStore::open(&self.config(cluster)).expect("open the etcd store")
    }

    /// Kill the member now (as `kill -9`); the data directory stays until the guard drops.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
