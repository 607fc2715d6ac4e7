//! ProxyDHCP with real firmware beside a real router (issue 10 item 19).
//!
//! One Ethernet segment (a bridge in talboot's namespace) joins three hosts:
//! - the site's router, its own namespace: Debian's dnsmasq with its default configuration
//!   (`/etc/dnsmasq.conf` as the package ships it) plus only the flags that name its interface
//!   and address range and keep its files in the test's scratch directory. It hands out
//!   addresses and nothing about booting;
//! - talboot `serve` with `network.mode: proxy` and serve's default boot flags, serving the
//!   installed /usr/lib/ipxe;
//! - QEMU (TCG) guests, one after another: SeaBIOS with the iPXE ROM, OVMF with the iPXE ROM,
//!   and OVMF's own PXE (no ROM), which fetches ipxe.efi over TFTP and then runs iPXE.
//!
//! Each guest must reach its per-MAC script and boot the kernel and initramfs talboot serves:
//! the initramfs prints a marker on the serial console, and talboot's events for the node show
//! the proxy answer, the script and both downloads. A plain `dhclient` in a fourth namespace
//! still gets its address from dnsmasq, untouched by talboot.
//!
//! Two tests, run one after the other: the iPXE ROMs (and dhclient), and OVMF's own PXE. The
//! second also needs talboot to serve Debian's `/usr/lib/ipxe/ipxe.efi`, a symlink to
//! `/boot/ipxe.efi` (issue 10 item 9); its failure message says so when that is what stopped it.
//!
//! Set `TALBOOT_TEST_PCAP_DIR` to keep a tcpdump capture of the segment (needs tcpdump).
//! Root only; every namespace and process is removed on drop, also when the test fails.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::netns::{require_tool, run, wait_for_text};
use support::qemu::{self, Firmware, KERNEL_MARKER, Vm, die_with_parent};

const NET: &str = "10.77.210";
/// talboot's address on the segment.
const TALBOOT: &str = "10.77.210.5";
/// The router's address (dnsmasq).
const ROUTER: &str = "10.77.210.1";
const DHCLIENT_MAC: &str = "02:00:00:7a:2c:09";
/// One boot of any variant, power-on to marker, takes 15-45 s here under TCG (without IPv6
/// router advertisements Debian's iPXE waits ~16 s more); four times that.
const VM_TIMEOUT: Duration = Duration::from_secs(200);

/// The guests: firmware, NIC MAC (= inventory node), node name.
const GUESTS: [(Firmware, &str, &str); 3] = [
    (Firmware::BiosIpxeRom, "52:54:00:7a:2c:01", "vm-bios"),
    (Firmware::UefiIpxeRom, "52:54:00:7a:2c:02", "vm-uefi"),
    (Firmware::UefiNativePxe, "52:54:00:7a:2c:03", "vm-pxe"),
];

/// Three namespaces on one bridge: talboot's (bridge, tap for the VMs), the router's and a
/// plain client's. Drop kills every process in them and deletes them.
struct Segment {
    srv: String,
    rtr: String,
    cli: String,
    children: Vec<Child>,
}

impl Segment {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let base = format!("tb-px-{}-{n}", std::process::id());
        let seg = Segment {
            srv: format!("{base}-s"),
            rtr: format!("{base}-r"),
            cli: format!("{base}-c"),
            children: Vec::new(),
        };
        for ns in seg.namespaces() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            run(Command::new("ip").args(["netns", "add", ns]));
            run(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]));
        }
        let srv = |args: &[&str]| run(Command::new("ip").args(["-n", &seg.srv]).args(args));
        srv(&[
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
        srv(&["addr", "add", &format!("{TALBOOT}/24"), "dev", "br0"]);
        srv(&["link", "set", "br0", "up"]);
        srv(&["tuntap", "add", "dev", "tap0", "mode", "tap"]);
        srv(&["link", "set", "tap0", "master", "br0"]);
        srv(&["link", "set", "tap0", "up"]);
        for (i, (ns, mac)) in [(&seg.rtr, "02:00:00:7a:2c:fe"), (&seg.cli, DHCLIENT_MAC)]
            .into_iter()
            .enumerate()
        {
            let port = format!("vp{i}");
            run(Command::new("ip").args([
                "link", "add", &port, "netns", &seg.srv, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ]));
            srv(&["link", "set", &port, "master", "br0"]);
            srv(&["link", "set", &port, "up"]);
            run(Command::new("ip").args(["-n", ns, "link", "set", "eth0", "address", mac]));
            run(Command::new("ip").args(["-n", ns, "link", "set", "eth0", "up"]));
        }
        run(Command::new("ip").args([
            "-n",
            &seg.rtr,
            "addr",
            "add",
            &format!("{ROUTER}/24"),
            "dev",
            "eth0",
        ]));
        seg
    }

    fn namespaces(&self) -> [&String; 3] {
        [&self.srv, &self.rtr, &self.cli]
    }

    /// `ip netns exec NS` as a command to append a program to.
    fn exec(ns: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        c
    }

    fn spawn(&mut self, mut cmd: Command) {
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        self.children.push(child);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces() {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).output();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

fn inventory() -> String {
    let mut nodes = String::new();
    for (i, (_, mac, name)) in GUESTS.iter().enumerate() {
        nodes.push_str(&format!(
            "  - name: {name}\n    mac: {mac}\n    role: {}\n    address: {NET}.{}/24\n    installDisk: /dev/vda\n",
            if i == 0 { "controlplane" } else { "worker" },
            50 + i
        ));
    }
    format!(
        "cluster:
  name: proxy
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{NET}.50:6443
network:
  interfaces: [br0]
  mode: proxy
  subnet: {NET}.0/24
  gateway: {ROUTER}
  advertise: {TALBOOT}
boot:
  unknownMachines: discover
nodes:
{nodes}"
    )
}

/// The site's router: dnsmasq as Debian configures it by default, plus only its interface,
/// its range and files kept in `dir` (the lease file, pid file and log).
fn start_router(seg: &mut Segment, dir: &Path) -> PathBuf {
    let log = dir.join("dnsmasq.log");
    let mut cmd = Segment::exec(&seg.rtr);
    cmd.arg("dnsmasq")
        .arg("--keep-in-foreground")
        .arg("--interface=eth0")
        .arg("--bind-interfaces")
        .arg(format!("--dhcp-range={NET}.100,{NET}.199,255.255.255.0,1h"))
        .arg(format!(
            "--dhcp-leasefile={}",
            dir.join("dnsmasq.leases").display()
        ))
        .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .arg("--log-dhcp")
        .arg(format!("--log-facility={}", log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    seg.spawn(cmd);
    wait_for_text(&log, "DHCP, IP range", Duration::from_secs(20));
    log
}

/// The plain client: ISC dhclient with its own hook and lease files (never the host's).
/// Returns the hook's record of the binding: `reason ip server-id`.
fn dhclient(seg: &Segment, dir: &Path) -> String {
    let record = dir.join("dhclient.record");
    let hook = dir.join("dhclient-hook.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\ncase \"$reason\" in BOUND|RENEW|REBOOT) echo \"$reason $new_ip_address \
             $new_dhcp_server_identifier\" >> '{}' ;; esac\n",
            record.display()
        ),
    )
    .unwrap();
    run(Command::new("chmod").arg("755").arg(&hook));
    let mut cmd = Segment::exec(&seg.cli);
    cmd.args(["timeout", "60", "dhclient", "-1", "-v", "-sf"])
        .arg(&hook)
        .arg("-lf")
        .arg(dir.join("dhclient.leases"))
        .arg("-pf")
        .arg(dir.join("dhclient.pid"))
        .arg("eth0");
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "dhclient failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // dhclient -1 stays in the background after BOUND; release nothing, just stop it.
    let _ = Segment::exec(&seg.cli)
        .args(["dhclient", "-x", "-sf"])
        .arg(&hook)
        .arg("-lf")
        .arg(dir.join("dhclient.leases"))
        .arg("-pf")
        .arg(dir.join("dhclient.pid"))
        .output();
    std::fs::read_to_string(&record).unwrap_or_default()
}

/// The router's lease for `mac` (dnsmasq's lease file: `expiry mac ip host client-id`).
fn leased_address(router_dir: &Path, mac: &str) -> Option<String> {
    std::fs::read_to_string(router_dir.join("dnsmasq.leases"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&mac)).then(|| f.get(2).map(|s| s.to_string()))?
        })
}

/// A running segment: router, talboot in proxy mode, and the files to read afterwards.
struct Rig {
    seg: Segment,
    work: tempfile::TempDir,
    router_dir: PathBuf,
    state: PathBuf,
    talboot_log: PathBuf,
    dnsmasq_log: PathBuf,
}

impl Rig {
    /// Build the guest's boot set, start the router and `talboot serve` in proxy mode.
    fn start() -> Option<Rig> {
        for (tool, env) in [
            ("dnsmasq", "DNSMASQ"),
            ("dhclient", "DHCLIENT"),
            ("qemu-system-x86_64", "QEMU"),
        ] {
            if !require_tool(tool, env) {
                return None;
            }
        }
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().to_path_buf();
        // dnsmasq drops to its own user and must reach its log and lease files.
        run(Command::new("chmod").arg("755").arg(&work));
        let router_dir = work.join("router");
        std::fs::create_dir_all(&router_dir).unwrap();
        run(Command::new("chmod").arg("777").arg(&router_dir));

        let vmlinuz = qemu::vmlinuz(&work);
        let initramfs = qemu::marker_initramfs(&work);
        let images = qemu::images(
            &work,
            &vmlinuz,
            &initramfs,
            talboot::inventory::VANILLA_SCHEMATIC,
        );
        let config = work.join("talboot.yaml");
        std::fs::write(&config, inventory()).unwrap();
        let configs = work.join("out");
        std::fs::create_dir_all(&configs).unwrap();
        let state = work.join("state");

        let mut seg = Segment::new();
        if let Some(dir) = std::env::var_os("TALBOOT_TEST_PCAP_DIR") {
            let pcap = PathBuf::from(dir).join(format!("{}.pcap", seg.srv));
            let mut cmd = Segment::exec(&seg.srv);
            cmd.args(["tcpdump", "-i", "br0", "-U", "-n", "-w"])
                .arg(&pcap)
                .args(["udp or arp"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            seg.spawn(cmd);
        }
        let dnsmasq_log = start_router(&mut seg, &router_dir);

        let talboot_log = work.join("talboot.log");
        let mut cmd = Segment::exec(&seg.srv);
        // serve's defaults for everything that boots: --ipxe-dir /usr/lib/ipxe, HTTP 8080,
        // TFTP 69. There is no Talos API to provision (push delivery): --no-provision.
        cmd.arg(env!("CARGO_BIN_EXE_talboot"))
            .args(["--log", "talboot=debug", "serve", "-c"])
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .arg("--images")
            .arg(&images)
            .arg("--configs")
            .arg(&configs)
            .arg("--no-provision")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&talboot_log).unwrap()));
        seg.spawn(cmd);
        wait_for_text(&talboot_log, "DHCP serving", Duration::from_secs(30));
        Some(Rig {
            seg,
            work: tmp,
            router_dir,
            state,
            talboot_log,
            dnsmasq_log,
        })
    }

    fn logs(&self) -> String {
        format!(
            "--- talboot log ---\n{}\n--- dnsmasq log ---\n{}",
            std::fs::read_to_string(&self.talboot_log).unwrap_or_default(),
            std::fs::read_to_string(&self.dnsmasq_log).unwrap_or_default()
        )
    }

    /// Boot each guest in turn (TCG needs both cores), stop talboot, and check every guest
    /// reached the marker with the proxy answer, its script, kernel and initramfs (and, for
    /// OVMF's own PXE, ipxe.efi over TFTP) in talboot's events.
    fn boot_all(mut self, guests: &[(Firmware, &'static str, &'static str)]) {
        let mut outcomes = Vec::new();
        for &(fw, mac, node) in guests {
            let mut vm = Vm::start(
                Segment::exec(&self.seg.srv),
                self.work.path(),
                "tap0",
                mac,
                fw,
            );
            let booted = vm.wait_for(KERNEL_MARKER, VM_TIMEOUT);
            outcomes.push((fw, mac, node, booted, vm.console_text()));
        }
        let logs = self.logs();
        for c in &mut self.seg.children {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        for c in &mut self.seg.children {
            let _ = c.wait();
        }
        self.seg.children.clear();
        let store = talboot::store::open(&self.state).unwrap();
        use talboot::store::Store;
        let kinds = |key: &str| -> Vec<String> {
            store
                .events(key, 0, 200)
                .unwrap()
                .into_iter()
                .map(|e| e.kind)
                .collect()
        };
        let mut failures = Vec::new();
        for (fw, mac, node, booted, console) in outcomes {
            let mut got = kinds(node);
            // Without a lease of its own, talboot may file the TFTP fetch under the address.
            if let Some(addr) = leased_address(&self.router_dir, mac) {
                got.extend(kinds(&format!("ip-{addr}")));
            }
            let mut want = vec!["dhcp.proxy", "http.script", "http.kernel", "http.initramfs"];
            if fw == Firmware::UefiNativePxe {
                want.push("tftp.file");
            }
            let missing: Vec<_> = want
                .iter()
                .filter(|k| !got.iter().any(|x| x == *k))
                .collect();
            if !booted || !missing.is_empty() {
                let blocked = if logs.contains("symlink escape") {
                    "\nNOTE: talboot refused a symlinked iPXE binary in /usr/lib/ipxe \
                     (issue 10 item 9: Debian's ipxe.efi -> /boot/ipxe.efi)"
                } else {
                    ""
                };
                failures.push(format!(
                    "{} ({node}): marker seen: {booted}, missing events: {missing:?}, events: \
                     {got:?}{blocked}\n--- console ---\n{console}",
                    fw.label()
                ));
            }
        }
        assert!(failures.is_empty(), "{}\n{logs}", failures.join("\n\n"));
    }
}

/// One VM test at a time: TCG needs the cores, and the namespaces carry the process id.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn proxy_dhcp_boots_ipxe_roms_beside_dnsmasq_and_leaves_plain_clients_alone() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(rig) = Rig::start() else { return };

    // A plain DHCP client still gets its address, and only from the router.
    let record = dhclient(&rig.seg, rig.work.path());
    let mut fields = record.lines().last().unwrap_or_default().split_whitespace();
    let (_, addr, server) = (fields.next(), fields.next(), fields.next());
    let addr: std::net::Ipv4Addr = addr
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("dhclient bound nothing: {record:?}\n{}", rig.logs()));
    assert!(
        addr.to_string().starts_with(&format!("{NET}.")) && (100..=199).contains(&addr.octets()[3]),
        "dhclient got {addr}, not an address from dnsmasq's range\n{}",
        rig.logs()
    );
    assert_eq!(server, Some(ROUTER), "{record}\n{}", rig.logs());
    // Its MAC is not in the inventory and it is no netboot client: talboot never answered.
    let stranger = talboot::events::unknown_node_key(DHCLIENT_MAC.parse().unwrap());
    let log = std::fs::read_to_string(&rig.talboot_log).unwrap_or_default();
    assert!(
        !log.contains(&stranger),
        "talboot recorded an event for the plain client:\n{log}"
    );

    rig.boot_all(&GUESTS[..2]);
}

#[test]
fn proxy_dhcp_boots_ovmf_native_pxe_then_ipxe_beside_dnsmasq() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(rig) = Rig::start() else { return };
    rig.boot_all(&GUESTS[2..]);
}
