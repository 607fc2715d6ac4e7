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
    tls: Option<TlsFiles>,
}

struct Member {
    child: Child,
    client: SocketAddr,
    peer: SocketAddr,
    initial: String,
}

/// The PEM files of a TLS member: its CA, a client certificate that CA signed, and a CA
/// and client certificate it does not trust.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub(crate) ca: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) client_cert: PathBuf,
    pub(crate) client_key: PathBuf,
    pub(crate) other_ca: PathBuf,
    pub(crate) stranger_cert: PathBuf,
    pub(crate) stranger_key: PathBuf,
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
        Some(Self::launch(&bin, dir, n, None))
    }

    /// Start one member serving clients over TLS only, and requiring a client certificate
    /// its CA signed (`--cert-file --key-file --trusted-ca-file --client-cert-auth`), with
    /// certificates made by the `openssl` CLI; `None` (a skip) without etcd or openssl.
    pub(crate) fn start_tls() -> Option<Self> {
        let bin = binary()?;
        let dir = tempfile::tempdir().expect("temporary directory");
        let tls = make_tls(dir.path())?;
        Some(Self::launch(&bin, dir, 1, Some(tls)))
    }

    fn launch(bin: &PathBuf, dir: tempfile::TempDir, n: usize, tls: Option<TlsFiles>) -> Self {
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
                child: spawn_member(
                    bin,
                    &dir,
                    i,
                    (*client, *peer),
                    &initial.join(","),
                    tls.as_ref(),
                ),
                client: *client,
                peer: *peer,
                initial: initial.join(","),
            })
            .collect();
        let server = Self { members, dir, tls };
        for i in 0..n {
            server.wait_healthy(i);
        }
        server
    }

    /// The TLS files of a member started by [`EtcdServer::start_tls`].
    pub(crate) fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Whether member `i` answers `/health` with `true`.
    fn member_healthy(&self, i: usize) -> bool {
        let client = self.members[i].client;
        let Some(tls) = &self.tls else {
            return healthy(client);
        };
        let out = Command::new("curl")
            .args(["-s", "--max-time", "1", "--cacert"])
            .arg(&tls.ca)
            .arg("--cert")
            .arg(&tls.client_cert)
            .arg("--key")
            .arg(&tls.client_key)
            .arg(format!("https://{client}/health"))
            .output();
        out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"health\":\"true\""))
    }

    fn wait_healthy(&self, i: usize) {
        // Generous: a 3-member cluster elects its first leader in about a second, but on two
        // cores shared with a compiling test suite members have taken over 15 s to start.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.member_healthy(i) {
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
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://{}", m.client))
            .collect()
    }

    /// The client URLs, comma-separated (as errors name them).
    pub(crate) fn url(&self) -> String {
        self.urls().join(",")
    }

    /// A store configuration for `cluster` on these members, with short timeouts (and the
    /// right TLS files for a TLS member).
    pub(crate) fn config(&self, cluster: &str) -> EtcdConfig {
        let mut cfg = EtcdConfig::new(self.urls(), cluster);
        if let Some(t) = &self.tls {
            cfg.cacert = Some(t.ca.clone());
            cfg.cert = Some(t.client_cert.clone());
            cfg.key = Some(t.client_key.clone());
        }
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

    /// Start killed member `i` again on its data directory (etcd rejoins with what it has;
    /// the initial-cluster flags are ignored then) and wait until it is healthy.
    pub(crate) fn restart_member(&mut self, i: usize) {
        let bin = binary().expect("etcd ran before");
        let m = &self.members[i];
        let child = spawn_member(
            &bin,
            &self.dir,
            i,
            (m.client, m.peer),
            &m.initial,
            self.tls.as_ref(),
        );
        self.members[i].child = child;
        self.wait_healthy(i);
    }
}

/// Start member `i` of a new cluster `initial` on its `(client, peer)` addresses, logging to
/// `m<i>.log` in `dir`; with `tls`, its clients are served over TLS only and must present a
/// certificate the CA signed (etcd v3.4.23 `etcdmain/help.go`: `--cert-file`, `--key-file`,
/// `--trusted-ca-file`, `--client-cert-auth`).
fn spawn_member(
    bin: &PathBuf,
    dir: &tempfile::TempDir,
    i: usize,
    (client, peer): (SocketAddr, SocketAddr),
    initial: &str,
    tls: Option<&TlsFiles>,
) -> Child {
    let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).expect("log file");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--name=m{i}"))
        .arg("--data-dir")
        .arg(dir.path().join(format!("m{i}")))
        .arg(format!("--listen-client-urls={scheme}://{client}"))
        .arg(format!("--advertise-client-urls={scheme}://{client}"))
        .arg(format!("--listen-peer-urls=http://{peer}"))
        .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
        .arg(format!("--initial-cluster={initial}"))
        .arg("--initial-cluster-state=new");
    if let Some(t) = tls {
        cmd.arg("--cert-file")
            .arg(&t.server_cert)
            .arg("--key-file")
            .arg(&t.server_key)
            .arg("--trusted-ca-file")
            .arg(&t.ca)
            .arg("--client-cert-auth");
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .expect("start etcd")
}

/// Run `openssl args` in `dir`, panicking with its output when it fails.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A new P-256 private key in `dir/key`.
fn p256_key(dir: &std::path::Path, key: &str) {
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            key,
        ],
    );
}

/// A CA `<ca>.pem` and a certificate `<name>.pem` it signs for `subject_alt` (with its key
/// `<name>.key`), all P-256, in `dir`.
fn signed(dir: &std::path::Path, ca: &str, name: &str, subject_alt: &str) {
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!("subjectAltName={subject_alt}\nextendedKeyUsage=serverAuth,clientAuth\n"),
    )
    .expect("extension file");
    p256_key(dir, &key);
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            &key,
            "-subj",
            &format!("/CN={name}"),
            "-out",
            &csr,
        ],
    );
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}

/// A self-signed CA `<name>.pem`/`<name>.key` in `dir`.
fn ca(dir: &std::path::Path, name: &str) {
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    p256_key(dir, &key);
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            &key,
            "-subj",
            &format!("/CN={name}"),
            "-days",
            "2",
            "-out",
            &pem,
        ],
    );
}

/// The CA, server and client certificates of a TLS member, and a stranger CA with its own
/// client certificate; `None` (a skip) without openssl, except under `CI=true`.
fn make_tls(dir: &std::path::Path) -> Option<TlsFiles> {
    if Command::new("openssl").arg("version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "openssl is not installed, and CI=true forbids skipping: run scripts/test-deps"
        );
        eprintln!("skipping: openssl is not installed");
        return None;
    }
    ca(dir, "ca");
    signed(dir, "ca", "server", "IP:127.0.0.1");
    signed(dir, "ca", "client", "DNS:talboot");
    ca(dir, "other-ca");
    signed(dir, "other-ca", "stranger", "DNS:talboot");
    Some(TlsFiles {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
        other_ca: dir.join("other-ca.pem"),
        stranger_cert: dir.join("stranger.pem"),
        stranger_key: dir.join("stranger.key"),
    })
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
