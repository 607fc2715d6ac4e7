//! talboot's DHCP server against real clients, all traffic inside network namespaces:
//! - authoritative: `dhclient`, busybox `udhcpc` (with and without the broadcast flag) and
//!   `dhcpcd` each get the address reserved for their MAC; an unknown MAC gets a pool address
//!   under `unknownMachines: discover` and nothing under `ignore`; malformed datagrams are
//!   dropped and counted; leases are in the state store after the server stops;
//! - proxy: beside a real dnsmasq that hands out the addresses, a plain client gets its
//!   address from dnsmasq while a PXE client gets its boot file from talboot;
//! - relay: a relayed DISCOVER (giaddr + option 82) is answered to giaddr:67 with option 82
//!   echoed, and perfdhcp (which always behaves as a relay agent) completes its exchanges.
//!
//! Root only. The tests share one lock: they create namespaces and start servers, and are
//! cheap enough to run one after another.

mod support;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use dhcproto::v4::{
    self, DhcpOption, Flags, Message, MessageType, OptionCode, relay::RelayAgentInformation,
    relay::RelayInfo,
};
use dhcproto::{Decodable, Encodable};
use support::images::fake_images;
use talboot::store::{LeaseState, Store};

use support::netns::{Lab, require_tool, run, wait_for_text};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const MAC_DHCLIENT: &str = "02:00:00:00:c1:01";
const MAC_UDHCPC: &str = "02:00:00:00:c1:02";
const MAC_DHCPCD: &str = "02:00:00:00:c1:03";
const MAC_UDHCPC_BCAST: &str = "02:00:00:00:c1:04";
const MAC_UNKNOWN: &str = "02:00:00:00:c9:01";
const MAC_PXE: &str = "02:00:00:00:c1:05";

fn inventory(net: &str, mode: &str, unknown: &str) -> String {
    let node = |name: &str, mac: &str, host: u8| {
        format!(
            "  - name: {name}\n    mac: {mac}\n    role: controlplane\n    address: {net}.{host}/24\n    installDisk: /dev/vda\n"
        )
    };
    format!(
        "cluster:
  name: dhcp
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{net}.21:6443
network:
  interfaces: [br0]
  mode: {mode}
  subnet: {net}.0/24
  gateway: {net}.1
  pool: {{start: {net}.100, end: {net}.150}}
  advertise: {net}.1
boot:
  unknownMachines: {unknown}
nodes:
{}{}{}{}{}",
        node("n-dhclient", MAC_DHCLIENT, 21),
        node("n-udhcpc", MAC_UDHCPC, 22),
        node("n-dhcpcd", MAC_DHCPCD, 23),
        node("n-bcast", MAC_UDHCPC_BCAST, 24),
        node("n-pxe", MAC_PXE, 25),
    )
}

/// The binary under test, pinned when the test process starts: a hard link (a copy if that
/// fails) under cargo's test scratch directory, so another build writing to a shared target
/// directory while these tests run cannot swap it.
fn talboot_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let pinned = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dhcp-netns-talboot");
        let _ = std::fs::remove_file(&pinned);
        let built = env!("CARGO_BIN_EXE_talboot");
        if std::fs::hard_link(built, &pinned).is_err() {
            std::fs::copy(built, &pinned).unwrap();
        }
        pinned
    })
}

/// A running `talboot serve` in the lab's server namespace.
struct Server {
    state: PathBuf,
    log: PathBuf,
    index: usize,
}

fn start_server(
    lab: &mut Lab,
    work: &Path,
    tag: &str,
    inventory_text: &str,
    extra: &[&str],
) -> Server {
    let dir = work.join(tag);
    std::fs::create_dir_all(dir.join("ipxe")).unwrap();
    // serve refuses to start without the iPXE binaries its machines need.
    for name in talboot::tftp::IPXE_BINARIES {
        std::fs::write(dir.join("ipxe").join(name), name).unwrap();
    }
    std::fs::create_dir_all(dir.join("out")).unwrap();
    let config = dir.join("talboot.yaml");
    std::fs::write(&config, inventory_text).unwrap();
    fake_images(&config, &dir.join("images"));
    let log = dir.join("talboot.log");
    let state = dir.join("state");
    let child = lab
        .in_srv(talboot_bin())
        .arg("serve")
        .arg("-c")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--images")
        .arg(dir.join("images"))
        .arg("--configs")
        .arg(dir.join("out"))
        .arg("--ipxe-dir")
        .arg(dir.join("ipxe"))
        // These tests are about DHCP; provisioning over the Talos API has its own tests.
        .args([
            "--http-port",
            "8080",
            "--log",
            "talboot=debug",
            "--no-provision",
        ])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    lab.children.push(child);
    wait_for_text(&log, "DHCP serving", Duration::from_secs(30));
    Server {
        state,
        log,
        index: lab.children.len() - 1,
    }
}

/// SIGTERM the server and wait for it, so its store can be opened.
fn stop_server(lab: &mut Lab, server: &Server) {
    let child = &mut lab.children[server.index];
    run(Command::new("kill").args(["-TERM", &child.id().to_string()]));
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "serve exited with {status}:\n{}",
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
}

/// A client hook for all three clients: record the bound address in `<dir>/<interface>.ip`.
/// Own script because the distribution hooks rewrite the host's /etc/resolv.conf.
fn hook(dir: &Path) -> PathBuf {
    let p = dir.join("hook.sh");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\n\
             # udhcpc passes the event as $1 and the address as $ip; dhclient and dhcpcd set\n\
             # $reason and $new_ip_address. All three set $interface.\n\
             case \"${{1:-}}${{reason:-}}\" in\n\
             bound|renew|BOUND|RENEW|REBOOT|REBIND) echo \"${{ip:-$new_ip_address}}\" > '{}'/\"$interface\".ip ;;\n\
             esac\n\
             exit 0\n",
            dir.display()
        ),
    )
    .unwrap();
    run(Command::new("chmod").arg("755").arg(&p));
    p
}

fn bound_ip(dir: &Path, iface: &str) -> Option<Ipv4Addr> {
    std::fs::read_to_string(dir.join(format!("{iface}.ip")))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn udhcpc(lab: &Lab, dir: &Path, iface: &str, extra: &[&str], tries: &str) -> bool {
    lab.in_cli("timeout")
        .args([
            "60", "udhcpc", "-i", iface, "-n", "-q", "-f", "-t", tries, "-T", "2", "-s",
        ])
        .arg(hook(dir))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn dhclient(lab: &Lab, dir: &Path, iface: &str) -> bool {
    let cf = dir.join("dhclient.conf");
    std::fs::write(&cf, "timeout 30;\n").unwrap();
    let files = |c: &mut Command| {
        c.arg("-cf")
            .arg(&cf)
            .arg("-sf")
            .arg(hook(dir))
            .arg("-lf")
            .arg(dir.join(format!("dhclient.{iface}.leases")))
            .arg("-pf")
            .arg(dir.join(format!("dhclient.{iface}.pid")));
    };
    // A kept lease file would make it skip DISCOVER (INIT-REBOOT): start fresh every time.
    let _ = std::fs::remove_file(dir.join(format!("dhclient.{iface}.leases")));
    let mut c = lab.in_cli("timeout");
    c.args(["60", "dhclient", "-1", "-v"]);
    files(&mut c);
    let ok = c
        .arg(iface)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    // -1 still daemonizes after BOUND; -x stops it without releasing.
    let mut x = lab.in_cli("dhclient");
    x.arg("-x");
    files(&mut x);
    let _ = x.arg(iface).output();
    ok
}

fn dhcpcd(lab: &Lab, dir: &Path, iface: &str) -> bool {
    let conf = dir.join("dhcpcd.conf");
    std::fs::write(&conf, "nohook resolv.conf\n").unwrap();
    // dhcpcd keeps leases in /var/lib/dhcpcd and state in /run/dhcpcd on the host: give it
    // private, empty ones so runs do not affect each other or the host.
    lab.in_cli("timeout")
        .args([
            "60",
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mkdir -p /var/lib/dhcpcd /run/dhcpcd && mount -t tmpfs tmpfs /var/lib/dhcpcd && \
             mount -t tmpfs tmpfs /run/dhcpcd && exec \"$@\"",
            "sh",
            "dhcpcd",
            "-1",
            "-4",
            "-A",
            "-L",
            "-t",
            "30",
            "-f",
        ])
        .arg(&conf)
        .arg("-c")
        .arg(hook(dir))
        .arg(iface)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn metrics(lab: &Lab) -> String {
    let out = lab
        .in_srv("curl")
        .args(["-sf", "http://127.0.0.1:8081/metrics"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mac_bytes(mac: &str) -> [u8; 6] {
    let mut m = [0u8; 6];
    for (i, p) in mac.split(':').enumerate() {
        m[i] = u8::from_str_radix(p, 16).unwrap();
    }
    m
}

#[test]
fn authoritative_real_clients_get_their_reservations() {
    let _guard = serial();
    for (tool, env) in [
        ("dhclient", "DHCLIENT"),
        ("udhcpc", "UDHCPC"),
        ("dhcpcd", "DHCPCD"),
        ("curl", "CURL"),
    ] {
        if !require_tool(tool, env) {
            return;
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    let mut lab = Lab::new("10.81.0");
    for (i, mac) in [
        MAC_DHCLIENT,
        MAC_UDHCPC,
        MAC_DHCPCD,
        MAC_UDHCPC_BCAST,
        MAC_UNKNOWN,
    ]
    .iter()
    .enumerate()
    {
        lab.add_client(&format!("c{i}"), mac);
    }
    let inv = inventory(&lab.net, "authoritative", "discover");
    let server = start_server(&mut lab, work, "discover", &inv, &[]);
    let cdir = work.join("clients");
    std::fs::create_dir_all(&cdir).unwrap();

    // One after another (they share the segment); -B asks for broadcast replies, the others
    // get unicast after ARP injection.
    let results = vec![
        ("dhclient", dhclient(&lab, &cdir, "c0"), "c0", 21),
        ("udhcpc", udhcpc(&lab, &cdir, "c1", &[], "5"), "c1", 22),
        ("dhcpcd", dhcpcd(&lab, &cdir, "c2"), "c2", 23),
        (
            "udhcpc -B",
            udhcpc(&lab, &cdir, "c3", &["-B"], "5"),
            "c3",
            24,
        ),
    ];
    let log = || std::fs::read_to_string(&server.log).unwrap_or_default();
    for (client, ok, iface, host) in &results {
        let want: Ipv4Addr = format!("{}.{host}", lab.net).parse().unwrap();
        assert!(*ok, "{client} did not get a lease\n{}", log());
        assert_eq!(bound_ip(&cdir, iface), Some(want), "{client}\n{}", log());
    }
    // An unknown MAC under `discover`: a pool address.
    assert!(udhcpc(&lab, &cdir, "c4", &[], "5"), "{}", log());
    let pool_ip = bound_ip(&cdir, "c4").expect("unknown machine bound");
    let last = pool_ip.octets()[3];
    assert!(
        pool_ip.to_string().starts_with(&lab.net) && (100..=150).contains(&last),
        "{pool_ip}"
    );

    // Malformed datagrams are dropped and counted.
    let target = SocketAddrV4::new(Ipv4Addr::BROADCAST, 67);
    lab.with_cli_netns(move || {
        let s = bind_client_socket(68, "c4");
        s.send_to(&[1, 1, 6, 0, 9, 9], target).unwrap();
        let mut bad_magic = vec![0u8; 300];
        bad_magic[0] = 1;
        bad_magic[1] = 1;
        bad_magic[2] = 6;
        s.send_to(&bad_magic, target).unwrap();
    });
    let mut m = String::new();
    for _ in 0..100 {
        m = metrics(&lab);
        if m.contains("dhcp_dropped_total{reason=\"too_short\"} 1")
            && m.contains("dhcp_dropped_total{reason=\"bad_magic\"} 1")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        m.contains("dhcp_dropped_total{reason=\"too_short\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("dhcp_dropped_total{reason=\"bad_magic\"} 1"),
        "{m}"
    );
    assert!(m.contains("dhcp_replies_total{type=\"ack\"}"), "{m}");
    // Clients without the broadcast flag were answered by unicast after ARP injection.
    assert!(m.contains("dhcp_arp_injected_total"), "{m}");
    assert!(!m.contains("dhcp_arp_fallback_total"), "{m}");

    stop_server(&mut lab, &server);
    let store = talboot::store::open(&server.state).unwrap();
    let leases = store.leases().unwrap();
    for (mac, host, name) in [
        (MAC_DHCLIENT, 21, Some("n-dhclient")),
        (MAC_UDHCPC, 22, Some("n-udhcpc")),
        (MAC_DHCPCD, 23, Some("n-dhcpcd")),
        (MAC_UDHCPC_BCAST, 24, Some("n-bcast")),
        (MAC_UNKNOWN, last, None),
    ] {
        let l = leases
            .iter()
            .find(|l| l.mac.0 == mac_bytes(mac))
            .unwrap_or_else(|| panic!("no lease for {mac}: {leases:?}"));
        assert_eq!(l.ip.to_string(), format!("{}.{host}", lab.net));
        assert_eq!(l.state, LeaseState::Bound, "{l:?}");
        assert_eq!(l.hostname.as_deref(), name);
    }
    let kinds: Vec<String> = store
        .events("n-udhcpc", 0, 50)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&"dhcp.offer".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"dhcp.ack".to_string()), "{kinds:?}");
    drop(store);

    // Under `ignore`, the unknown machine gets no answer and its client gives up.
    let inv = inventory(&lab.net, "authoritative", "ignore");
    let server = start_server(&mut lab, work, "ignore", &inv, &[]);
    std::fs::remove_file(cdir.join("c4.ip")).unwrap();
    assert!(!udhcpc(&lab, &cdir, "c4", &[], "2"), "{}", log());
    assert_eq!(bound_ip(&cdir, "c4"), None);
    // ...while a known one still does.
    assert!(udhcpc(&lab, &cdir, "c1", &[], "5"));
    stop_server(&mut lab, &server);
    let ignored_log = std::fs::read_to_string(&server.log).unwrap();

    // Without CAP_NET_ADMIN (privileges dropped to nobody) the ARP entry cannot be added:
    // the reply is broadcast instead, and a client that did not ask for that still binds.
    let server = start_server(&mut lab, work, "nobody", &inv, &["--user", "nobody"]);
    for f in ["c0.ip", "c1.ip"] {
        let _ = std::fs::remove_file(cdir.join(f));
    }
    let log = || std::fs::read_to_string(&server.log).unwrap_or_default();
    assert!(udhcpc(&lab, &cdir, "c1", &[], "5"), "{}", log());
    assert_eq!(
        bound_ip(&cdir, "c1"),
        Some(format!("{}.22", lab.net).parse().unwrap())
    );
    assert!(dhclient(&lab, &cdir, "c0"), "{}", log());
    assert_eq!(
        bound_ip(&cdir, "c0"),
        Some(format!("{}.21", lab.net).parse().unwrap())
    );
    let m = metrics(&lab);
    assert!(m.contains("dhcp_arp_fallback_total"), "{m}");
    stop_server(&mut lab, &server);
    assert!(
        ignored_log.contains("unknown_machine"),
        "the ignored request should be logged as dropped"
    );
}

/// A UDP socket on `port`, pinned to `iface`, able to broadcast.
fn bind_client_socket(port: u16, iface: &str) -> UdpSocket {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.set_broadcast(true).unwrap();
    s.bind_device(Some(iface.as_bytes())).unwrap();
    s.bind(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port).into())
        .unwrap();
    let s: UdpSocket = s.into();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s
}

/// Collect the DHCP messages arriving on `s` for `xid` within about `secs` seconds.
fn collect(s: &UdpSocket, xid: u32, secs: u32) -> Vec<(std::net::SocketAddr, Message)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    for _ in 0..secs * 2 {
        if let Ok((n, from)) = s.recv_from(&mut buf)
            && let Ok(m) = Message::from_bytes(&buf[..n])
            && m.xid() == xid
            && m.opcode() == v4::Opcode::BootReply
        {
            got.push((from, m));
        }
    }
    got
}

#[test]
fn proxy_mode_beside_dnsmasq() {
    let _guard = serial();
    if !require_tool("dnsmasq", "DNSMASQ") || !require_tool("udhcpc", "UDHCPC") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    let mut lab = Lab::new("10.82.0");
    lab.add_client("c0", MAC_UDHCPC);
    lab.add_client("c1", MAC_PXE);
    let net = lab.net.clone();
    // The site's DHCP server: addresses only, no boot options, no DNS.
    let dnsmasq_log = work.join("dnsmasq.log");
    let dnsmasq = lab
        .in_srv("dnsmasq")
        .arg("--conf-file=/dev/null")
        .arg("--keep-in-foreground")
        .arg("--port=0")
        .arg("--interface=br0")
        .arg("--bind-interfaces")
        .arg(format!("--dhcp-range={net}.160,{net}.199,255.255.255.0,1h"))
        .arg("--no-ping")
        .arg("--user=root")
        .arg("--log-dhcp")
        .arg(format!(
            "--dhcp-leasefile={}",
            work.join("dnsmasq.leases").display()
        ))
        .arg(format!("--pid-file={}", work.join("dnsmasq.pid").display()))
        .arg(format!("--log-facility={}", dnsmasq_log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    lab.children.push(dnsmasq);
    wait_for_text(&dnsmasq_log, "DHCP, IP range", Duration::from_secs(20));
    let server = start_server(
        &mut lab,
        work,
        "proxy",
        &inventory(&net, "proxy", "discover"),
        &[],
    );
    let log = || std::fs::read_to_string(&server.log).unwrap_or_default();

    // A plain client: its address comes from dnsmasq's range; talboot stays silent.
    let cdir = work.join("clients");
    std::fs::create_dir_all(&cdir).unwrap();
    assert!(udhcpc(&lab, &cdir, "c0", &[], "5"), "{}", log());
    let plain = bound_ip(&cdir, "c0").unwrap();
    assert!((160..=199).contains(&plain.octets()[3]), "{plain}");

    // A PXE client (BIOS, option 60 PXEClient + option 93): dnsmasq offers an address,
    // talboot offers the boot file and no address.
    let server_ip: Ipv4Addr = lab.server_ip().parse().unwrap();
    let xid = 0x7e57_0001;
    let replies = lab.with_cli_netns(move || {
        let s = bind_client_socket(68, "c1");
        let mut m = Message::new_with_id(
            xid,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &mac_bytes(MAC_PXE),
        );
        m.set_flags(Flags::default().set_broadcast());
        let o = m.opts_mut();
        o.insert(DhcpOption::MessageType(MessageType::Discover));
        o.insert(DhcpOption::ClassIdentifier(
            b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
        ));
        o.insert(DhcpOption::ClientSystemArchitecture(
            v4::Architecture::from(0u16),
        ));
        o.insert(DhcpOption::ClientNetworkInterface(1, 2, 1));
        let bytes = m.to_vec().unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            s.send_to(&bytes, SocketAddrV4::new(Ipv4Addr::BROADCAST, 67))
                .unwrap();
            got = collect(&s, xid, 2);
            let has_both = got.iter().any(|(_, m)| !m.yiaddr().is_unspecified())
                && got.iter().any(|(_, m)| m.siaddr() == server_ip);
            if has_both {
                break;
            }
        }
        got
    });
    let address_offer = replies
        .iter()
        .find(|(_, m)| !m.yiaddr().is_unspecified())
        .unwrap_or_else(|| panic!("no address offer from dnsmasq: {replies:?}"));
    assert!((160..=199).contains(&address_offer.1.yiaddr().octets()[3]));
    let boot = replies
        .iter()
        .find(|(_, m)| {
            m.opts().get(OptionCode::ServerIdentifier)
                == Some(&DhcpOption::ServerIdentifier(server_ip))
                && m.yiaddr().is_unspecified()
        })
        .unwrap_or_else(|| panic!("no proxy offer from talboot: {replies:?}\n{}", log()));
    assert_eq!(boot.1.siaddr(), server_ip);
    // The file field is NUL-padded on the wire.
    let file = boot
        .1
        .fname()
        .map(|f| f.split(|b| *b == 0).next().unwrap_or_default());
    assert_eq!(file, Some(&b"undionly.kpxe"[..]));
    assert_eq!(
        boot.1.opts().get(OptionCode::ClassIdentifier),
        Some(&DhcpOption::ClassIdentifier(b"PXEClient".to_vec()))
    );
    stop_server(&mut lab, &server);
    let store = talboot::store::open(&server.state).unwrap();
    // Proxy mode hands out no addresses, so it stores no leases.
    assert!(store.leases().unwrap().is_empty());
    let kinds: Vec<String> = store
        .events("n-pxe", 0, 50)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&"dhcp.proxy".to_string()), "{kinds:?}");
}

#[test]
fn relayed_requests_are_answered_to_the_relay() {
    let _guard = serial();
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    let mut lab = Lab::new("10.83.0");
    lab.add_client("r0", "02:00:00:00:aa:01");
    let net = lab.net.clone();
    let relay_ip: Ipv4Addr = format!("{net}.2").parse().unwrap();
    lab.ip_cli(&["addr", "add", &format!("{relay_ip}/24"), "dev", "r0"]);
    let server = start_server(
        &mut lab,
        work,
        "relay",
        &inventory(&net, "authoritative", "discover"),
        &[],
    );
    let log = || std::fs::read_to_string(&server.log).unwrap_or_default();
    let server_ip: Ipv4Addr = lab.server_ip().parse().unwrap();

    // A relay agent on r0 forwards a DISCOVER for the dhclient node with option 82.
    let xid = 0x7e57_0082;
    let mut info = RelayAgentInformation::default();
    info.insert(RelayInfo::AgentCircuitId(b"port-7".to_vec()));
    info.insert(RelayInfo::AgentRemoteId(b"sw1".to_vec()));
    let mut m = Message::new_with_id(
        xid,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        relay_ip,
        &mac_bytes(MAC_DHCLIENT),
    );
    m.set_hops(1);
    m.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Discover));
    m.opts_mut()
        .insert(DhcpOption::RelayAgentInformation(info.clone()));
    let bytes = m.to_vec().unwrap();
    let replies = lab.with_cli_netns(move || {
        let s = bind_client_socket(67, "r0");
        let mut got = Vec::new();
        for _ in 0..3 {
            s.send_to(&bytes, SocketAddrV4::new(server_ip, 67)).unwrap();
            got = collect(&s, xid, 2);
            if !got.is_empty() {
                break;
            }
        }
        got
    });
    let (from, offer) = replies
        .first()
        .unwrap_or_else(|| panic!("no reply at the relay\n{}", log()));
    // It reached the relay's server port (that is where this socket listens), from ours.
    assert_eq!(from.port(), 67);
    assert_eq!(from.ip(), std::net::IpAddr::V4(server_ip));
    assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(offer.giaddr(), relay_ip);
    assert_eq!(offer.yiaddr().to_string(), format!("{net}.21"));
    assert_eq!(
        offer.opts().get(OptionCode::RelayAgentInformation),
        Some(&DhcpOption::RelayAgentInformation(info))
    );

    // perfdhcp acts as a relay agent (giaddr = its address): its DORA exchanges complete.
    if require_tool("perfdhcp", "PERFDHCP") {
        let out = lab
            .in_cli("timeout")
            .args([
                "60", "perfdhcp", "-4", "-l", "r0", "-n", "10", "-r", "10", "-R", "10",
            ])
            // Wait for the answers to the last requests instead of exiting after sending.
            .args(["-W", "2000000"])
            .arg(server_ip.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // Both exchanges: 10 DISCOVER-OFFER and 10 REQUEST-ACK.
        let received: Vec<u32> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("received packets: "))
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        assert_eq!(
            received,
            vec![10, 10],
            "{text}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            log()
        );
    }
    stop_server(&mut lab, &server);
    let store = talboot::store::open(&server.state).unwrap();
    let leases = store.leases().unwrap();
    // The relayed node's offer, and perfdhcp's ten pool leases.
    assert!(
        leases
            .iter()
            .any(|l| l.mac.0 == mac_bytes(MAC_DHCLIENT) && l.state == LeaseState::Offered),
        "{leases:?}"
    );
    let bound = leases
        .iter()
        .filter(|l| l.state == LeaseState::Bound && (100..=150).contains(&l.ip.octets()[3]))
        .count();
    if which_perfdhcp() {
        assert_eq!(bound, 10, "{leases:?}");
    }
}

fn which_perfdhcp() -> bool {
    Command::new("sh")
        .args(["-c", "command -v perfdhcp"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
