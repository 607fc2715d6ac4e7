//! One Ethernet segment of many hosts, each its own network namespace: a bridge in a namespace
//! of its own, and per host a veth whose far end hangs off that bridge, so broadcasts, ARP and
//! `kill -9` behave as between machines. For the HA tests: etcd members, appliances and
//! clients as separate hosts. [`Segment`]'s `Drop` kills every process left in its namespaces
//! and deletes them, also on panic.
//!
//! Needs root (namespaces, veth) and `ip` from iproute2.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::netns::run;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A bridge and the hosts on it.
pub struct Segment {
    /// Prefix of every namespace name.
    base: String,
    /// Host names added, whose namespaces `Drop` removes.
    hosts: Vec<String>,
}

impl Segment {
    /// An empty segment (the bridge only).
    pub fn new() -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let seg = Segment {
            base: format!("tbs-{}-{n}", std::process::id()),
            hosts: Vec::new(),
        };
        let br = seg.ns("br");
        let _ = Command::new("ip").args(["netns", "del", &br]).output();
        run(Command::new("ip").args(["netns", "add", &br]));
        run(Command::new("ip").args(["-n", &br, "link", "set", "lo", "up"]));
        run(Command::new("ip").args([
            "-n",
            &br,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ]));
        run(Command::new("ip").args(["-n", &br, "link", "set", "br0", "up"]));
        seg
    }

    /// The namespace name of host `name`.
    pub fn ns(&self, name: &str) -> String {
        format!("{}-{name}", self.base)
    }

    /// Add host `name` with interface `v-<name>` at `cidr` (e.g. `10.97.0.1/16`).
    pub fn add_host(&mut self, name: &str, cidr: &str) {
        let ns = self.ns(name);
        let br = self.ns("br");
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        run(Command::new("ip").args(["netns", "add", &ns]));
        self.hosts.push(name.to_owned());
        let ifname = format!("v-{name}");
        let peer = format!("p-{name}");
        run(Command::new("ip").args([
            "link", "add", &ifname, "netns", &ns, "type", "veth", "peer", "name", &peer, "netns",
            &br,
        ]));
        run(Command::new("ip").args(["-n", &br, "link", "set", &peer, "master", "br0"]));
        run(Command::new("ip").args(["-n", &br, "link", "set", &peer, "up"]));
        run(Command::new("ip").args(["-n", &ns, "addr", "add", cidr, "dev", &ifname]));
        run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]));
        run(Command::new("ip").args(["-n", &ns, "link", "set", &ifname, "up"]));
    }

    /// A command running `program` on host `name`.
    pub fn on(&self, name: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(name)]).arg(program);
        c
    }

    /// Run `f` on a thread that has joined host `name`'s namespace.
    pub fn spawn_on<T: Send + 'static>(
        &self,
        name: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = PathBuf::from("/run/netns").join(self.ns(name));
        std::thread::spawn(move || {
            let ns = File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // SAFETY: setns on a valid namespace fd changes only this thread's namespace.
            let rc = unsafe { nix::libc::setns(ns.as_raw_fd(), nix::libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let mut all: Vec<String> = self.hosts.iter().map(|h| self.ns(h)).collect();
        all.push(self.ns("br"));
        for ns in &all {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).output();
                }
            }
        }
        for ns in &all {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
