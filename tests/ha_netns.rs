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
/// DISCOVERs a second in the etcd-leader test's storm.
const STORM_RATE_LEADER: u32 = 100;

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

/// etcd member `i` of [`ETCD`], started in its namespace with data on the real disk (a
/// restart finds its data directory and rejoins).
fn start_member(seg: &Segment, work: &Path, i: usize) -> Child {
    let cluster = ETCD
        .iter()
        .map(|(n, ip)| format!("{n}=http://{ip}:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let (n, ip) = ETCD[i];
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(work.join(format!("etcd-{n}.log")))
        .unwrap();
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
}

/// The etcd members, once `etcdctl endpoint health` passes on all of them.
fn start_etcd(seg: &Segment, work: &Path) -> Vec<Child> {
    let members = (0..ETCD.len())
        .map(|i| start_member(seg, work, i))
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

/// The appliances' log filter: `info`, or `TALBOOT_HA_LOG` when set.
fn log_filter() -> String {
    std::env::var("TALBOOT_HA_LOG").unwrap_or_else(|_| "info".into())
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
            // TALBOOT_HA_LOG (a tracing filter) overrides `info` for a closer look.
            .args(["--log", &log_filter(), "serve", "-c"])
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

/// Whether any log of appliance `name` under `work` contains `needle`.
fn log_contains(work: &Path, name: &str, needle: &str) -> bool {
    std::fs::read_dir(work.join(name))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .any(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(needle)))
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

/// The whole lab: the segment, etcd, two appliances serving, the storm running.
struct Fleet {
    apps: Vec<Appliance>,
    etcd: Vec<Option<Child>>,
    storm: Option<Child>,
    seg: Segment,
    work: tempfile::TempDir,
}

impl Fleet {
    /// None when this machine cannot run it (not root, or a waived tool). One fleet at a
    /// time: two would share two cores with six etcd members and four appliances.
    fn start(
        storm_secs: u32,
        storm_rate: u32,
    ) -> Option<(Self, std::sync::MutexGuard<'static, ()>)> {
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !is_root() {
            eprintln!("skipped: needs root (network namespaces)");
            return None;
        }
        for (tool, env) in [("etcd", "ETCD"), ("perfdhcp", "PERFDHCP")] {
            if !require_tool(tool, env) {
                return None;
            }
        }
        // TALBOOT_HA_KEEP=1 keeps the logs and etcd data for a look afterwards.
        let work = tempfile::Builder::new()
            .prefix("ha-netns-")
            .disable_cleanup(std::env::var_os("TALBOOT_HA_KEEP").is_some())
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let mut seg = Segment::new();
        for (n, ip) in ETCD.iter().chain(&APPLIANCES).chain([&CHECKER, &STORM]) {
            seg.add_host(n, &format!("{ip}/16"));
        }
        // The checker sends to 255.255.255.255 from a plain socket: the limited broadcast
        // needs a route out of its interface (perfdhcp binds to its interface instead).
        support::netns::run(seg.on(CHECKER.0, "ip").args([
            "route",
            "add",
            "default",
            "dev",
            &format!("v-{}", CHECKER.0),
        ]));
        let etcd = start_etcd(&seg, work.path())
            .into_iter()
            .map(Some)
            .collect();
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
            .args(["-4", "-l", "v-c1", "-r", &storm_rate.to_string()])
            .args(["-R", "100000", "-p"])
            .arg(storm_secs.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let fleet = Fleet {
            apps,
            etcd,
            storm: Some(storm),
            seg,
            work,
        };
        Some((fleet, serial))
    }

    /// The checker, once its first 20 DORAs completed with both appliances up.
    fn checker(&self) -> Checker {
        let checker = Checker::start(&self.seg, 4);
        assert!(
            checker.wait_more(0, 20, Duration::from_secs(30)).is_some(),
            "no DORA completed with both appliances up\n{}",
            logs(self.work.path())
        );
        checker
    }

    fn kill_member(&mut self, i: usize) {
        if let Some(mut c) = self.etcd[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn restart_member(&mut self, i: usize) {
        self.etcd[i] = Some(start_member(&self.seg, self.work.path(), i));
    }

    /// The index in [`ETCD`] of the member that leads, as etcdctl reads it.
    fn etcd_leader(&self) -> usize {
        let out = self
            .seg
            .on(CHECKER.0, "etcdctl")
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &endpoints(),
                "endpoint",
                "status",
                "-w",
                "json",
            ])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("etcdctl endpoint status: {e}: {out:?}"));
        let rows = v.as_array().expect("a list of endpoints");
        rows.iter()
            .position(|r| {
                let st = &r["Status"];
                st["leader"].as_u64().is_some()
                    && st["leader"].as_u64() == st["header"]["member_id"].as_u64()
            })
            .unwrap_or_else(|| panic!("no leader in {v}"))
    }

    /// Stop the storm and the appliances; the storm's report.
    fn stop(&mut self) -> String {
        let out = self
            .storm
            .take()
            .and_then(|s| s.wait_with_output().ok())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for a in &mut self.apps {
            a.kill9();
        }
        out
    }

    /// What must hold at the end of every run, from the ACKs and from etcd.
    fn check(&self, acks: &[Ack]) {
        // No address ACKed to two MACs, as the clients saw it.
        let mut by_ip: BTreeMap<Ipv4Addr, [u8; 6]> = BTreeMap::new();
        for a in acks {
            if let Some(other) = by_ip.insert(a.ip, a.mac) {
                assert_eq!(other, a.mac, "{} was ACKed to two MACs", a.ip);
            }
        }
        // Every ACK is a bound lease in etcd, and the store holds no MAC twice.
        let leases = leases_in_etcd(&self.seg);
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
        for a in acks {
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
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(mut s) = self.storm.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        for i in 0..self.etcd.len() {
            self.kill_member(i);
        }
    }
}

#[test]
fn killing_appliances_mid_storm_loses_no_ack_and_duplicates_no_address() {
    let Some((mut fleet, _serial)) = Fleet::start(40, 300) else {
        return;
    };
    let checker = fleet.checker();

    // Three kills, alternating, each while the storm runs; the killed one comes back after.
    let mut recoveries = Vec::new();
    for (round, victim) in [0usize, 1, 0].into_iter().enumerate() {
        std::thread::sleep(Duration::from_secs(2));
        fleet.apps[victim].kill9();
        let from = checker.count();
        let took = checker.wait_more(from, 20, Duration::from_secs(45));
        let took = took.unwrap_or_else(|| {
            panic!(
                "kill {}: the survivor did not serve 20 new clients within 45 s of {} being killed\n{}",
                round + 1,
                fleet.apps[victim].name,
                logs(fleet.work.path())
            )
        });
        recoveries.push((fleet.apps[victim].name, took));
        let seg = &fleet.seg;
        fleet.apps[victim].start(seg);
    }
    std::thread::sleep(Duration::from_secs(2));
    let acks = checker.finish();
    let storm = fleet.stop();
    eprintln!(
        "{} ACKs to the checker; survivor served 20 new clients after each kill in {recoveries:?}\n{storm}",
        acks.len()
    );
    fleet.check(&acks);
}

/// The etcd leader killed under load: no ACKed lease lost. Then two of three members gone:
/// no new lease at all (none is durable without a quorum), the appliances say why, and
/// leases flow again once a member is back.
#[test]
fn the_etcd_leader_killed_loses_no_ack_and_without_quorum_no_lease_is_handed_out() {
    // A storm the appliances keep up with (a debug build on two shared cores sheds most of a
    // 300/s one's DISCOVERs, the checker's too), so what is measured is the recovery.
    let Some((mut fleet, _serial)) = Fleet::start(60, STORM_RATE_LEADER) else {
        return;
    };
    let checker = fleet.checker();
    // The pace of new leases with every member up, under this storm and this machine's load.
    let base = checker
        .wait_more(checker.count(), 10, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("10 leases took over 30 s\n{}", logs(fleet.work.path())));
    let leader = fleet.etcd_leader();
    fleet.kill_member(leader);
    let from = checker.count();
    // etcd elects a new leader in about a second and the client stops sending to the dead
    // member within a probe (src/store/etcd/balance.rs). Measured on two shared cores: 10 new
    // leases in 3.2-6.0 s after the kill (5 runs; 3.1-10.8 s with every member up), 6.1-7.4 s
    // merged with main's commit path of 9fc7420 (2 runs; 3.0-4.6 s up); without the probe
    // 12 s (4.5 s up), and with a 300/s storm new leases came at a tenth of their pace until
    // the storm ended. The bound is twice the pace with every member up, at least 16 s (twice
    // the slowest measured): a machine under load slows both alike.
    let bound = base.max(Duration::from_secs(8)) * 2;
    let took = checker.wait_more(from, 10, bound).unwrap_or_else(|| {
        panic!(
            "not 10 new leases within {bound:?} of the etcd leader's death (with it alive: \
             {base:?})\n{}",
            logs(fleet.work.path())
        )
    });
    eprintln!(
        "etcd leader {} killed: 10 new leases within {took:?} (before: {base:?})",
        ETCD[leader].0
    );
    fleet.restart_member(leader);
    std::thread::sleep(Duration::from_secs(3));

    // Quorum lost: two of the three members gone.
    let (x, y) = ((leader + 1) % 3, (leader + 2) % 3);
    fleet.kill_member(x);
    fleet.kill_member(y);
    // An ACK committed just before the kill may still be on its way out.
    std::thread::sleep(Duration::from_secs(2));
    let frozen = checker.count();
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(
        checker.count(),
        frozen,
        "leases were acknowledged while etcd had no quorum\n{}",
        logs(fleet.work.path())
    );
    // The health probe runs every 5 s: within a bound, each appliance says it; the one that
    // provisioned loses its election session with the quorum and stops (fail-stop, for its
    // service manager to restart) saying that instead.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !APPLIANCES.iter().all(|(n, _)| {
        log_contains(fleet.work.path(), n, "etcd has no quorum")
            || log_contains(fleet.work.path(), n, "leadership lost")
    }) {
        assert!(
            Instant::now() < deadline,
            "the appliances did not say that etcd lost quorum:\n{}",
            logs(fleet.work.path())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    fleet.restart_member(x);
    let back = checker.wait_more(frozen, 20, Duration::from_secs(60));
    assert!(
        back.is_some(),
        "no lease after quorum came back\n{}",
        logs(fleet.work.path())
    );
    let acks = checker.finish();
    let storm = fleet.stop();
    eprintln!(
        "quorum back: 20 new leases within {back:?}; {} ACKs\n{storm}",
        acks.len()
    );
    fleet.check(&acks);
}
