//! OpenStack's Redfish emulator `sushy-emulator` (sushy-tools, from PyPI, in the venv that
//! scripts/test-deps builds) as a BMC for tests: its fake driver for protocol tests, or its
//! libvirt driver for a real VM. Each [`Sushy`] has its own config, state directory and port
//! on 127.0.0.1, and is killed on drop (and with the test thread, by PDEATHSIG).
//!
//! The emulator's settings are the documented `SUSHY_EMULATOR_*` config variables
//! (openstack/sushy-tools, doc/source/admin/emulator.conf, 2.2.0): `AUTH_FILE` (bcrypt
//! htpasswd; HTTP Basic is its only auth), `STATE_DIR` (where the fake driver keeps its
//! systems), `FAKE_SYSTEMS`, `LIBVIRT_URI`.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::qemu::die_with_parent;

/// Where scripts/test-deps builds the sushy-tools venv.
pub const VENV: &str = "/var/tmp/talboot-test/sushy-venv";

/// True when the emulator is installed; otherwise panics unless TALBOOT_SKIP_SUSHY is set.
pub fn available() -> bool {
    if Path::new(VENV).join("bin/sushy-emulator").exists() {
        return true;
    }
    if std::env::var_os("TALBOOT_SKIP_SUSHY").is_some() {
        eprintln!("sushy-emulator missing; skipped (TALBOOT_SKIP_SUSHY is set)");
        return false;
    }
    panic!(
        "{VENV}/bin/sushy-emulator is missing: run scripts/test-deps (or set TALBOOT_SKIP_SUSHY=1)"
    );
}

/// A bcrypt htpasswd line for `user:password` (the emulator accepts bcrypt only).
pub fn htpasswd(user: &str, password: &str) -> String {
    let out = Command::new(Path::new(VENV).join("bin/python"))
        .args([
            "-c",
            "import bcrypt,sys; print(sys.argv[1] + ':' + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(4)).decode())",
            user,
            password,
        ])
        .output()
        .expect("venv python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How to start one emulator.
pub struct SushyOptions {
    /// Extra lines of the Python config file (`SUSHY_EMULATOR_FAKE_SYSTEMS = [...]`, ...).
    pub config: String,
    /// `--fake` (no libvirt) or `--libvirt-uri URI`.
    pub fake: bool,
    pub libvirt_uri: Option<String>,
    /// (certificate PEM, key PEM) to serve HTTPS.
    pub tls: Option<(String, String)>,
    /// Basic-auth user and password.
    pub user: String,
    pub password: String,
}

impl Default for SushyOptions {
    fn default() -> Self {
        Self {
            config: String::new(),
            fake: true,
            libvirt_uri: None,
            tls: None,
            user: "admin".into(),
            password: "bmc-pass-Xq7".into(),
        }
    }
}

pub struct Sushy {
    child: Child,
    pub port: u16,
    pub endpoint: String,
    pub log: PathBuf,
}

impl Sushy {
    pub fn start(work: &Path, opts: &SushyOptions) -> Sushy {
        std::fs::create_dir_all(work).unwrap();
        let state = work.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let auth = work.join("htpasswd");
        std::fs::write(&auth, htpasswd(&opts.user, &opts.password)).unwrap();
        let mut conf = format!(
            "SUSHY_EMULATOR_STATE_DIR = {state:?}\nSUSHY_EMULATOR_AUTH_FILE = {auth:?}\n{}\n",
            opts.config
        );
        let port = free_port();
        let mut cmd = Command::new(Path::new(VENV).join("bin/sushy-emulator"));
        cmd.args(["-i", "127.0.0.1", "-p", &port.to_string()]);
        let scheme = if let Some((cert, key)) = &opts.tls {
            let (c, k) = (work.join("bmc.crt"), work.join("bmc.key"));
            std::fs::write(&c, cert).unwrap();
            std::fs::write(&k, key).unwrap();
            cmd.arg("--ssl-certificate")
                .arg(&c)
                .arg("--ssl-key")
                .arg(&k);
            "https"
        } else {
            "http"
        };
        if opts.fake {
            cmd.arg("--fake");
        } else if let Some(uri) = &opts.libvirt_uri {
            cmd.args(["--libvirt-uri", uri]);
            conf.push_str(&format!("SUSHY_EMULATOR_LIBVIRT_URI = {uri:?}\n"));
        }
        let conf_path = work.join("emulator.conf");
        std::fs::write(&conf_path, conf).unwrap();
        cmd.arg("--config").arg(&conf_path);
        let log = work.join("sushy.log");
        let f = std::fs::File::create(&log).unwrap();
        cmd.stdout(Stdio::from(f.try_clone().unwrap()))
            .stderr(Stdio::from(f))
            .stdin(Stdio::null());
        let child = die_with_parent(&mut cmd)
            .spawn()
            .expect("spawn sushy-emulator");
        let mut s = Sushy {
            child,
            port,
            endpoint: format!("{scheme}://127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("sushy-emulator exited {st}: {}", s.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "sushy-emulator not listening: {}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
