//! A throwaway etcd member for integration tests (which cannot see the library's
//! `#[cfg(test)]` harness): Debian's `etcd` 3.4 on free loopback ports with a temporary data
//! directory, waited on until `/health` says it has a leader, killed and removed on drop
//! (a failing test unwinds through the drop too).
//!
//! Without the binary a test is skipped with a note, except under `CI=true`, where it fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One running member; dropping it kills it and deletes its data.
pub struct Etcd {
    child: Child,
    /// The client address (`http://` + this).
    pub client: SocketAddr,
    dir: tempfile::TempDir,
}

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("its address")
}

fn binary() -> Option<PathBuf> {
    let found = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "etcd is not installed, and CI=true forbids skipping: run scripts/test-deps"
        );
        eprintln!("skipping: etcd is not installed (scripts/test-deps installs etcd-server)");
    }
    found
}

/// `/health` answers `"health":"true"` (etcd v3.4.23 `etcdserver/api/etcdhttp/metrics.go`).
fn healthy(client: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&client, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = format!("GET /health HTTP/1.0\r\nHost: {client}\r\n\r\n");
    let mut body = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut body).is_ok()
        && body.contains("\"health\":\"true\"")
}

impl Etcd {
    /// Start one member and wait (at most 15 s) until it is healthy; `None` is a skip.
    pub fn start() -> Option<Self> {
        let bin = binary()?;
        let dir = tempfile::tempdir().expect("temporary directory");
        let (client, peer) = (free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
        let child = Command::new(bin)
            .arg("--name=m0")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg(format!("--listen-client-urls=http://{client}"))
            .arg(format!("--advertise-client-urls=http://{client}"))
            .arg(format!("--listen-peer-urls=http://{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
            .arg(format!("--initial-cluster=m0=http://{peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let etcd = Self { child, client, dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !healthy(client) {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(etcd.dir.path().join("etcd.log"));
                panic!(
                    "etcd on {client} not healthy after 15 s:\n{}",
                    log.unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(etcd)
    }

    /// The `--store` value for talboot.
    pub fn store_url(&self) -> String {
        format!("etcd://{}", self.client)
    }

    /// The keys under `prefix` (etcdctl v3 `get --prefix --keys-only`).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://{}", self.client))
            .args(["get", "--prefix", "--keys-only", prefix])
            .output()
            .expect("run etcdctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://{}", self.client))
            .args(["get", "--print-value-only", key])
            .output()
            .expect("run etcdctl");
        let text = String::from_utf8_lossy(&out.stdout).trim_end().to_owned();
        (!text.is_empty()).then_some(text)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
