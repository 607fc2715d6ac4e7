//! Network-namespace lab for DHCP tests: a server namespace with a bridge (`br0`, the
//! server's address on it) and a client namespace whose veth interfaces hang off that bridge,
//! so broadcasts behave as on one Ethernet segment. Everything runs inside the namespaces;
//! [`Lab`]'s `Drop` kills every process left in them and deletes them, also on panic.
//!
//! Needs root (namespaces, veth) and `ip` from iproute2.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Run `cmd`, panicking with its output when it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A server and a client namespace joined by a bridge in the server namespace.
pub struct Lab {
    /// Server namespace name.
    pub srv: String,
    /// Client namespace name.
    pub cli: String,
    /// First three octets of the /24, e.g. `10.81.0`.
    pub net: String,
    /// Processes to kill first on drop.
    pub children: Vec<Child>,
    links: u32,
}

impl Lab {
    /// Create the namespaces; the server gets `<net>.1/24` on `br0`.
    pub fn new(net: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let base = format!("tb-{}-{n}", std::process::id());
        let lab = Lab {
            srv: format!("{base}-s"),
            cli: format!("{base}-c"),
            net: net.to_string(),
            children: Vec::new(),
            links: 0,
        };
        for ns in [&lab.srv, &lab.cli] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            run(Command::new("ip").args(["netns", "add", ns]));
            run(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]));
        }
        lab.ip_srv(&[
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ]);
        lab.ip_srv(&["addr", "add", &format!("{}.1/24", lab.net), "dev", "br0"]);
        lab.ip_srv(&["link", "set", "br0", "up"]);
        lab
    }

    /// The server's address.
    pub fn server_ip(&self) -> String {
        format!("{}.1", self.net)
    }

    fn ip_srv(&self, args: &[&str]) {
        run(Command::new("ip").args(["-n", &self.srv]).args(args));
    }

    /// `ip -n <client ns> ARGS`.
    pub fn ip_cli(&self, args: &[&str]) {
        run(Command::new("ip").args(["-n", &self.cli]).args(args));
    }

    /// Add a client interface `name` with hardware address `mac`, bridged to the server.
    pub fn add_client(&mut self, name: &str, mac: &str) {
        let peer = format!("vs{}", self.links);
        self.links += 1;
        run(Command::new("ip").args([
            "link", "add", &peer, "netns", &self.srv, "type", "veth", "peer", "name", name,
            "netns", &self.cli,
        ]));
        self.ip_srv(&["link", "set", &peer, "master", "br0"]);
        self.ip_srv(&["link", "set", &peer, "up"]);
        self.ip_cli(&["link", "set", name, "address", mac]);
        self.ip_cli(&["link", "set", name, "up"]);
    }

    /// A command that runs `program` inside the server namespace.
    pub fn in_srv(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.srv]).arg(program);
        c
    }

    /// A command that runs `program` inside the client namespace.
    pub fn in_cli(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.cli]).arg(program);
        c
    }

    /// Run `f` on a thread that has joined the client namespace (sockets it opens live there).
    pub fn with_cli_netns<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = PathBuf::from("/run/netns").join(&self.cli);
        std::thread::spawn(move || {
            let ns = File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // SAFETY: setns on a valid namespace fd changes only this thread's namespace.
            let rc = unsafe { nix::libc::setns(ns.as_raw_fd(), nix::libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("client-namespace thread panicked")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.srv, &self.cli] {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).output();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Wait until `file` contains `needle` (a log line), panicking with the file after `limit`.
pub fn wait_for_text(file: &Path, needle: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`{needle}` not in {} after {limit:?}:\n{text}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Panic unless the tool `name` (whose presence can be waived with `TALBOOT_SKIP_<ENV>`) is
/// on PATH; returns false when waived, so the caller skips that part.
pub fn require_tool(name: &str, env: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if found {
        return true;
    }
    if std::env::var_os(format!("TALBOOT_SKIP_{env}")).is_some() {
        eprintln!("{name} missing; skipped (TALBOOT_SKIP_{env} is set)");
        return false;
    }
    panic!("{name} is missing: run scripts/test-deps (or set TALBOOT_SKIP_{env}=1)");
}
