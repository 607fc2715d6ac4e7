//! Two appliances sharing a 3-member etcd on one Ethernet segment (issue 28), every host its
//! own network namespace (`support::segment`): a `perfdhcp` storm broadcast on the segment
//! while one appliance after another is killed with SIGKILL (three kills) and started again;
//! meanwhile a checker host runs its own DORAs and records every ACK it gets.
//!
//! What must hold, read back from etcd afterwards and from the ACKs themselves:
//! - no address was ever ACKed to two MACs (by the ACKs seen, and by the store);
//! - every ACK the checker received is a bound lease in etcd for that MAC and address
//!   (durable before acknowledged);
//! - after each kill the survivor serves new clients within seconds (the checker's DORAs for
//!   fresh MACs complete; a split without takeover would leave half of them unanswered).
//!
//! Root only; needs etcd (etcd-server), perfdhcp (kea-admin) and iproute2.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Encodable};
use support::images::fake_images;
use support::netns::require_tool;
use support::segment::Segment;
use talboot::store::{EtcdConfig, EtcdStore, LeaseState, Store};

const CLUSTER: &str = "hatest";
const ETCD: [(&str, &str); 3] = [
    ("e1", "10.97.0.11"),
    ("e2", "10.97.0.12"),
    ("e3", "10.97.0.13"),
];
const APPLIANCES: [(&str, &str); 2] = [("a1", "10.97.0.1"), ("a2", "10.97.0.2")];
const CHECKER: (&str, &str) = ("c2", "10.97.0.101");
const STORM: (&str, &str) = ("c1", "10.97.0.100");

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn endpoints() -> String {
    ETCD.iter()
        .map(|(_, ip)| format!("{ip}:2379"))
        .collect::<Vec<_>>()
        .join(",")
}

fn inventory(iface: &str, advertise: &str) -> String {
    format!(
        "cluster:
  name: {CLUSTER}
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://10.97.0.50:6443
network:
  interfaces: [{iface}]
  subnet: 10.97.0.0/16
  pool: {{start: 10.97.1.0, end: 10.97.255.254}}
  leaseTime: 1h
  advertise: {advertise}
boot:
  unknownMachines: discover
nodes:
  - {{name: cp-1, mac: \"02:00:00:00:00:01\", role: controlplane, address: 10.97.0.50/16, installDisk: /dev/sda}}
"
    )
}

/// The etcd members, started in their namespaces with data on the real disk.
fn start_etcd(seg: &Segment, work: &Path) -> Vec<Child> {
    let cluster = ETCD
        .iter()
        .map(|(n, ip)| format!("{n}=http://{ip}:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let members = ETCD
        .iter()
        .map(|(n, ip)| {
            let log = std::fs::File::create(work.join(format!("etcd-{n}.log"))).unwrap();
            seg.on(n, "etcd")
                .args(["--name", n, "--data-dir"])
                .arg(work.join(format!("etcd-{n}")))
                .args(["--listen-client-urls", &format!("http://{ip}:2379")])
                .args(["--advertise-client-urls", &format!("http://{ip}:2379")])
                .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://{ip}:2380"),
                ])
                .args([
                    "--initial-cluster",
                    &cluster,
                    "--initial-cluster-state",
                    "new",
                ])
                .args(["--initial-cluster-token", "talboot-ha-netns"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = seg
            .on(CHECKER.0, "etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &endpoints(), "endpoint", "health"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return members;
        }
        assert!(Instant::now() < deadline, "etcd did not become healthy");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One appliance's files and its process (None while killed).
struct Appliance {
    name: &'static str,
    dir: PathBuf,
    child: Option<Child>,
    starts: usize,
}

impl Appliance {
    fn prepare(work: &Path, name: &'static str, ip: &str) -> Self {
        let dir = work.join(name);
        std::fs::create_dir_all(dir.join("ipxe")).unwrap();
        for f in talboot::tftp::IPXE_BINARIES {
            std::fs::write(dir.join("ipxe").join(f), f).unwrap();
        }
        std::fs::create_dir_all(dir.join("out")).unwrap();
        let config = dir.join("talboot.yaml");
        std::fs::write(&config, inventory(&format!("v-{name}"), ip)).unwrap();
        fake_images(&config, &dir.join("images"));
        Appliance {
            name,
            dir,
            child: None,
            starts: 0,
        }
    }

    fn start(&mut self, seg: &Segment) {
        self.starts += 1;
        let log = self.dir.join(format!("talboot-{}.log", self.starts));
        let child = seg
            .on(self.name, env!("CARGO_BIN_EXE_talboot"))
            .args(["--log", "info", "serve", "-c"])
            .arg(self.dir.join("talboot.yaml"))
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .arg("--images")
            .arg(self.dir.join("images"))
            .arg("--configs")
            .arg(self.dir.join("out"))
            .arg("--ipxe-dir")
            .arg(self.dir.join("ipxe"))
            .args(["--store", &format!("etcd://{}", endpoints())])
            .args(["--name", self.name])
            .args(["--http-port", "8080", "--no-provision", "--no-tftp"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        self.child = Some(child);
        support::netns::wait_for_text(&log, "DHCP serving", Duration::from_secs(60));
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One ACK the checker got.
#[derive(Debug, Clone)]
struct Ack {
    mac: [u8; 6],
    ip: Ipv4Addr,
    server: Ipv4Addr,
}

/// A relay agent on the checker host: one socket on port 67 (replies to giaddr come here),
/// replies routed to the waiting exchange by xid.
struct Relay {
    sock: UdpSocket,
    waiting: Mutex<HashMap<u32, Sender<Message>>>,
}

impl Relay {
    fn recv_loop(self: Arc<Self>, stop: Arc<AtomicBool>) {
        let mut buf = [0u8; 1500];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, _)) = self.sock.recv_from(&mut buf) else {
                continue;
            };
            let Ok(msg) = Message::decode(&mut dhcproto::Decoder::new(&buf[..n])) else {
                continue;
            };
            if let Some(tx) = self.waiting.lock().unwrap().get(&msg.xid()) {
                let _ = tx.send(msg);
            }
        }
    }

    fn send(&self, msg: &Message) {
        let bytes = msg.to_vec().unwrap();
        if let Err(e) = self
            .sock
            .send_to(&bytes, SocketAddrV4::new(Ipv4Addr::BROADCAST, 67))
        {
            eprintln!("checker: send: {e}");
        }
    }

    /// One DORA for `mac`: DISCOVER (broadcast, relayed), the first OFFER, REQUEST for it
    /// naming its server, the ACK. None when no answer came in time (the caller retries).
    fn dora(&self, mac: [u8; 6], xid: u32) -> Option<Ack> {
        let (tx, rx) = channel();
        self.waiting.lock().unwrap().insert(xid, tx);
        let out = self.exchange(mac, xid, &rx);
        self.waiting.lock().unwrap().remove(&xid);
        out
    }

    fn exchange(&self, mac: [u8; 6], xid: u32, rx: &Receiver<Message>) -> Option<Ack> {
        let giaddr: Ipv4Addr = CHECKER.1.parse().unwrap();
        let mut discover = Message::new(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            giaddr,
            &mac,
        );
        discover
            .set_opcode(Opcode::BootRequest)
            .set_xid(xid)
            .set_hops(1)
            .set_flags(Flags::default());
        discover
            .opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        self.send(&discover);
        let offer = wait_for(rx, MessageType::Offer, Duration::from_millis(1500))?;
        let server = match offer.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(ip)) => *ip,
            _ => return None,
        };
        let mut request = discover.clone();
        request
            .opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Request));
        request
            .opts_mut()
            .insert(DhcpOption::ServerIdentifier(server));
        request
            .opts_mut()
            .insert(DhcpOption::RequestedIpAddress(offer.yiaddr()));
        self.send(&request);
        let ack = wait_for(rx, MessageType::Ack, Duration::from_millis(1500))?;
        Some(Ack {
            mac,
            ip: ack.yiaddr(),
            server,
        })
    }
}

fn wait_for(rx: &Receiver<Message>, want: MessageType, limit: Duration) -> Option<Message> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let msg = rx.recv_timeout(left).ok()?;
        match msg.opts().msg_type() {
            Some(t) if t == want => return Some(msg),
            Some(MessageType::Nak) => return None,
            _ => {}
        }
    }
}

/// The checker: `workers` threads doing DORAs for fresh MACs until `stop`, each retrying its
/// MAC until it is ACKed (as a client would), every ACK recorded.
struct Checker {
    acks: Arc<Mutex<Vec<Ack>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Checker {
    fn start(seg: &Segment, workers: usize) -> Self {
        let acks = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicUsize::new(0));
        let relay = seg
            .spawn_on(CHECKER.0, || {
                let sock = UdpSocket::bind("0.0.0.0:67").unwrap();
                sock.set_broadcast(true).unwrap();
                sock.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                Arc::new(Relay {
                    sock,
                    waiting: Mutex::new(HashMap::new()),
                })
            })
            .join()
            .unwrap();
        let mut threads = Vec::new();
        {
            let (relay, stop) = (relay.clone(), stop.clone());
            threads.push(std::thread::spawn(move || relay.recv_loop(stop)));
        }
        for _ in 0..workers {
            let (relay, stop, acks, next) =
                (relay.clone(), stop.clone(), acks.clone(), next.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::SeqCst) as u32;
                    let mac = [0x02, 0xcc, 0, (n >> 16) as u8, (n >> 8) as u8, n as u8];
                    let mut attempt = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        attempt += 1;
                        if let Some(ack) = relay.dora(mac, n.wrapping_mul(977) ^ (attempt << 24)) {
                            acks.lock().unwrap().push(ack);
                            break;
                        }
                    }
                }
            }));
        }
        Checker {
            acks,
            stop,
            threads,
        }
    }

    fn count(&self) -> usize {
        self.acks.lock().unwrap().len()
    }

    /// Waits until `more` ACKs beyond `from` arrived, at most `limit`; how long it took.
    fn wait_more(&self, from: usize, more: usize, limit: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if self.count() >= from + more {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn finish(self) -> Vec<Ack> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.acks.lock().unwrap().clone()
    }
}

/// The last lines of every appliance log under `work`, for a failure message.
fn logs(work: &Path) -> String {
    let mut out = String::new();
    for (name, _) in APPLIANCES {
        let Ok(dir) = std::fs::read_dir(work.join(name)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out.push_str(&format!("--- {}\n{}\n", f.display(), tail.join("\n")));
        }
    }
    out
}

/// Every lease record in etcd, read from the checker host.
fn leases_in_etcd(seg: &Segment) -> Vec<talboot::store::Lease> {
    seg.spawn_on(CHECKER.0, || {
        let cfg = EtcdConfig::from_url(&format!("etcd://{}", endpoints()), CLUSTER).unwrap();
        EtcdStore::open(&cfg).unwrap().leases().unwrap()
    })
    .join()
    .unwrap()
}

#[test]
fn killing_appliances_mid_storm_loses_no_ack_and_duplicates_no_address() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    for (tool, env) in [("etcd", "ETCD"), ("perfdhcp", "PERFDHCP")] {
        if !require_tool(tool, env) {
            return;
        }
    }
    let work = tempfile::Builder::new()
        .prefix("ha-netns-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let mut seg = Segment::new();
    for (n, ip) in ETCD.iter().chain(&APPLIANCES).chain([&CHECKER, &STORM]) {
        seg.add_host(n, &format!("{ip}/16"));
    }
    // The checker sends to 255.255.255.255 from a plain socket: the limited broadcast needs
    // a route out of its interface (perfdhcp binds to its interface instead).
    support::netns::run(seg.on(CHECKER.0, "ip").args([
        "route",
        "add",
        "default",
        "dev",
        &format!("v-{}", CHECKER.0),
    ]));
    let _etcd = start_etcd(&seg, work.path());
    let mut apps: Vec<Appliance> = APPLIANCES
        .iter()
        .map(|(n, ip)| Appliance::prepare(work.path(), n, ip))
        .collect();
    for a in &mut apps {
        a.start(&seg);
    }

    // The storm: perfdhcp broadcasting as a relay for the whole run.
    let storm = seg
        .on(STORM.0, "perfdhcp")
        .args(["-4", "-l", "v-c1", "-r", "300", "-R", "100000", "-p", "40"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let checker = Checker::start(&seg, 4);
    assert!(
        checker.wait_more(0, 20, Duration::from_secs(30)).is_some(),
        "no DORA completed with both appliances up\n{}",
        logs(work.path())
    );

    // Three kills, alternating, each while the storm runs; the killed one comes back after.
    let mut recoveries = Vec::new();
    for (round, victim) in [0usize, 1, 0].into_iter().enumerate() {
        std::thread::sleep(Duration::from_secs(2));
        apps[victim].kill9();
        let from = checker.count();
        let took = checker.wait_more(from, 20, Duration::from_secs(45));
        let took = took.unwrap_or_else(|| {
            panic!(
                "kill {}: the survivor did not serve 20 new clients within 45 s of {} being killed\n{}",
                round + 1,
                apps[victim].name,
                logs(work.path())
            )
        });
        recoveries.push((apps[victim].name, took));
        apps[victim].start(&seg);
    }
    std::thread::sleep(Duration::from_secs(2));
    let acks = checker.finish();
    let storm_out = storm.wait_with_output().unwrap();
    for a in &mut apps {
        a.kill9();
    }
    eprintln!(
        "{} ACKs to the checker; survivor served 20 new clients after each kill in {:?}",
        acks.len(),
        recoveries
    );
    eprintln!("{}", String::from_utf8_lossy(&storm_out.stdout));

    // No address ACKed to two MACs, as the clients saw it.
    let mut by_ip: BTreeMap<Ipv4Addr, [u8; 6]> = BTreeMap::new();
    for a in &acks {
        if let Some(other) = by_ip.insert(a.ip, a.mac) {
            assert_eq!(other, a.mac, "{} was ACKed to two MACs", a.ip);
        }
    }
    // Every ACK is a bound lease in etcd, and the store holds no MAC twice.
    let leases = leases_in_etcd(&seg);
    let mut macs = BTreeMap::new();
    for l in &leases {
        if l.state != LeaseState::Declined
            && let Some(ip) = macs.insert(l.mac, l.ip)
        {
            panic!("{} holds both {ip} and {}", l.mac, l.ip);
        }
    }
    let by_ip_store: HashMap<Ipv4Addr, &talboot::store::Lease> =
        leases.iter().map(|l| (l.ip, l)).collect();
    for a in &acks {
        let l = by_ip_store
            .get(&a.ip)
            .unwrap_or_else(|| panic!("ACKed {} (from {}) is not in etcd", a.ip, a.server));
        assert_eq!(
            l.mac.0, a.mac,
            "ACKed {} belongs to another MAC in etcd",
            a.ip
        );
        assert_eq!(
            l.state,
            LeaseState::Bound,
            "ACKed {} is not bound in etcd",
            a.ip
        );
    }
}
