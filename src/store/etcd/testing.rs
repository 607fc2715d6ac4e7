//! A throwaway etcd for tests, one member or several: Debian's `etcd` binary (`etcd-server`,
//! 3.4, as `scripts/test-deps` installs it) on free loopback ports with temporary data
//! directories, killed and removed when the guard drops (a failing test unwinds through the
//! drop too).
//!
//! Without the binary a test is skipped with a note, except under `CI=true`, where it fails:
//! CI must never pass by not running the etcd tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{EtcdConfig, EtcdStore};

/// Running etcd members of one cluster; dropping it kills them and deletes their data.
pub(crate) struct EtcdServer {
    members: Vec<Member>,
    dir: tempfile::TempDir,
}

struct Member {
    child: Child,
    client: SocketAddr,
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

/// Whether the member at `client` answers `/health` with `true` (it has a leader).
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

impl EtcdServer {
    /// Start one member and wait until `/health` says so.
    pub(crate) fn start() -> Option<Self> {
        Self::start_cluster(1)
    }

    /// Start `n` members of one new cluster and wait until each is healthy (has a leader).
    pub(crate) fn start_cluster(n: usize) -> Option<Self> {
        let bin = binary()?;
        let dir = tempfile::tempdir().expect("temporary directory");
        let ports: Vec<(SocketAddr, SocketAddr)> =
            (0..n).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://{peer}"))
            .collect();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| Member {
                child: spawn_member(&bin, &dir, i, *client, *peer, &initial.join(",")),
                client: *client,
            })
            .collect();
        let server = Self { members, dir };
        for i in 0..n {
            server.wait_healthy(i);
        }
        Some(server)
    }

    fn wait_healthy(&self, i: usize) {
        // Generous: a 3-member cluster elects its first leader in about a second, but on two
        // cores shared with a compiling test suite members have taken over 15 s to start.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if healthy(self.members[i].client) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log =
            std::fs::read_to_string(self.dir.path().join(format!("m{i}.log"))).unwrap_or_default();
        panic!(
            "etcd member {i} on {} not healthy after 60 s; its log:\n{log}",
            self.members[i].client
        );
    }

    fn urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}", m.client))
            .collect()
    }

    /// The client URLs, comma-separated (as errors name them).
    pub(crate) fn url(&self) -> String {
        self.urls().join(",")
    }

    /// A store configuration for `cluster` on these members, with short timeouts.
    pub(crate) fn config(&self, cluster: &str) -> EtcdConfig {
        let mut cfg = EtcdConfig::new(self.urls(), cluster);
        cfg.connect_timeout = Duration::from_secs(2);
        cfg.request_timeout = Duration::from_secs(3);
        cfg
    }

    /// Open a store for `cluster` on these members.
    pub(crate) fn open(&self, cluster: &str) -> EtcdStore {
        EtcdStore::open(&self.config(cluster)).expect("open the etcd store")
    }

    /// Kill every member now (as `kill -9`); the data stays until the guard drops.
    pub(crate) fn kill(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
    }

    /// Kill member `i` now (as `kill -9`).
    pub(crate) fn kill_member(&mut self, i: usize) {
        let _ = self.members[i].child.kill();
        let _ = self.members[i].child.wait();
    }
}

/// Start member `i` of a new cluster `initial`, logging to `m<i>.log` in `dir`.
fn spawn_member(
    bin: &PathBuf,
    dir: &tempfile::TempDir,
    i: usize,
    client: SocketAddr,
    peer: SocketAddr,
    initial: &str,
) -> Child {
    let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).expect("log file");
    Command::new(bin)
        .arg(format!("--name=m{i}"))
        .arg("--data-dir")
        .arg(dir.path().join(format!("m{i}")))
        .arg(format!("--listen-client-urls=http://{client}"))
        .arg(format!("--advertise-client-urls=http://{client}"))
        .arg(format!("--listen-peer-urls=http://{peer}"))
        .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
        .arg(format!("--initial-cluster={initial}"))
        .arg("--initial-cluster-state=new")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .expect("start etcd")
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
