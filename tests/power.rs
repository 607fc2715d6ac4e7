//! Power control against real peers, all inside network namespaces the tests create:
//! Wake-on-LAN captured with a raw socket on the segment and checked byte by byte (with and
//! without a SecureOn password); IPMI 2.0 LAN (RMCP+, cipher suite 3) against OpenIPMI's
//! `ipmi_sim` whose chassis-control program records every power and boot-device change, and
//! against a second BMC built on pyghmi (the library virtualbmc uses), which never answers
//! the RMCP presence ping and records the raw boot flags (EFI bit included) it receives,
//! checked against what `ipmitool` sends; `rack up` over both; `check --probe`; and no
//! credential in any output of a failing or succeeding run.
//!
//! Needs root, iproute2, `ipmi_sim` and `rmcp_ping` (Debian `openipmi`), `ipmitool`, and the
//! pyghmi venv, all from scripts/test-deps.

mod support;

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::netns::{Lab, require_tool};

const BMC_PASS: &str = "bmc-Pass-7c1e9";
const BMC_USER: &str = "admin";
const WOL_MAC: [u8; 6] = [0xaa, 0x00, 0x00, 0x00, 0x00, 0x21];
/// A SecureOn password in each form etherwake's `-p` takes (six hex, four dotted bytes).
const WOL_SOPASS6: &str = "5e:C2:07:0a:b1:9f";
const WOL_SOPASS4: &str = "203.0.113.77";

fn inventory(dir: &Path, net: &str, nodes: &str) -> PathBuf {
    let text = format!(
        "cluster:
  name: t
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{net}.11:6443
network:
  interfaces: [br0]
  subnet: {net}.0/24
nodes:
  - name: cp-1
    mac: aa:00:00:00:00:01
    role: controlplane
    address: {net}.11/24
    installDisk: /dev/sda
{nodes}"
    );
    let p = dir.join("talboot.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

fn wol_node(net: &str) -> String {
    format!(
        "  - name: wk-wol
    mac: aa:00:00:00:00:21
    role: worker
    address: {net}.21/24
    installDisk: /dev/sda
    power: {{kind: wol}}
"
    )
}

fn ipmi_node(net: &str, port: u16) -> String {
    format!(
        "  - name: wk-ipmi
    mac: aa:00:00:00:00:22
    role: worker
    address: {net}.22/24
    installDisk: /dev/sda
    power: {{kind: ipmi, host: 127.0.0.1, port: {port}, user: {BMC_USER}, passwordEnv: TB_TEST_BMC_PASS}}
"
    )
}

/// `talboot ARGS` inside the lab's server namespace, with the BMC password in its
/// environment (as an operator would export it).
fn talboot(lab: &Lab, inv: &Path, state: &Path, pass: &str, args: &[&str]) -> Output {
    let out = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .args(["--log", "debug"])
        .args(args)
        .arg("-c")
        .arg(inv)
        .arg("--state-dir")
        .arg(state)
        .env("TB_TEST_BMC_PASS", pass)
        .env("TB_TEST_WOL_SOPASS6", WOL_SOPASS6)
        .env("TB_TEST_WOL_SOPASS4", WOL_SOPASS4)
        .env("TB_TEST_WOL_SOPASS_BAD", "hunter2-sopass")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run talboot");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Whatever the outcome, the secret is in no line talboot printed or logged.
    assert!(
        !all.contains(pass),
        "talboot {args:?} printed the BMC password:\n{all}"
    );
    for secret in [
        WOL_SOPASS6,
        &WOL_SOPASS6.to_lowercase(),
        WOL_SOPASS4,
        "hunter2",
    ] {
        assert!(
            !all.contains(secret),
            "talboot {args:?} printed a SecureOn password:\n{all}"
        );
    }
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn describe(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A raw UDP socket in the lab's client namespace, ready before this returns; the thread
/// hands back the first datagram to UDP port `port` (IP header included).
fn capture_udp(lab: &Lab, port: u16) -> mpsc::Receiver<Vec<u8>> {
    let path = PathBuf::from("/run/netns").join(&lab.cli);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on a valid namespace fd changes only this thread's namespace.
        let rc = unsafe { nix::libc::setns(ns.as_raw_fd(), nix::libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        let sock = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::RAW,
            Some(socket2::Protocol::UDP),
        )
        .expect("raw UDP socket");
        sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        ready_tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 2048];
        while Instant::now() < deadline {
            let Ok(n) = sock.recv(&mut buf) else { continue };
            // SAFETY: recv initialised the first n bytes.
            let pkt: Vec<u8> = buf[..n]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            if pkt.len() >= ihl + 8 && u16::from_be_bytes([pkt[ihl + 2], pkt[ihl + 3]]) == port {
                let _ = tx.send(pkt);
                return;
            }
        }
    });
    ready_rx.recv().unwrap();
    rx
}

fn wol_lab(net: &str) -> Lab {
    let mut lab = Lab::new(net);
    lab.add_client("eth0", "aa:00:00:00:00:21");
    lab.ip_cli(&["addr", "add", &format!("{net}.21/24"), "dev", "eth0"]);
    lab
}

/// Checks a captured IPv4+UDP datagram is the magic packet for [`WOL_MAC`] to the subnet
/// broadcast, port 9.
fn assert_magic_packet(pkt: &[u8], net: &str) {
    assert_magic_packet_with(pkt, net, &[]);
}

/// Checks a captured IPv4+UDP datagram is the magic packet for [`WOL_MAC`] to the subnet
/// broadcast, port 9, followed by exactly the SecureOn password `sopass` (AMD's Magic Packet
/// white paper: the password follows the sixteenth copy of the MAC).
fn assert_magic_packet_with(pkt: &[u8], net: &str, sopass: &[u8]) {
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let dst = Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
    assert_eq!(dst, format!("{net}.255").parse::<Ipv4Addr>().unwrap());
    let udp = &pkt[ihl..];
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 9, "UDP port");
    assert_eq!(
        usize::from(u16::from_be_bytes([udp[4], udp[5]])),
        8 + 102 + sopass.len(),
        "UDP length"
    );
    let payload = &udp[8..];
    assert_eq!(payload.len(), 102 + sopass.len());
    assert_eq!(&payload[102..], sopass, "SecureOn password bytes");
    for (i, b) in payload[..6].iter().enumerate() {
        assert_eq!(*b, 0xff, "sync byte {i}");
    }
    for rep in 0..16 {
        for (j, want) in WOL_MAC.iter().enumerate() {
            assert_eq!(payload[6 + rep * 6 + j], *want, "MAC copy {rep} byte {j}");
        }
    }
}

#[test]
fn wake_on_lan_sends_the_magic_packet_to_the_segment() {
    if !require_tool("ip", "NETNS") {
        return;
    }
    let net = "10.94.0";
    let lab = wol_lab(net);
    let dir = tempfile::tempdir().unwrap();
    let inv = inventory(dir.path(), net, &wol_node(net));
    let state = dir.path().join("state");

    let rx = capture_udp(&lab, 9);
    let o = talboot(
        &lab,
        &inv,
        &state,
        BMC_PASS,
        &["node", "power", "wk-wol", "on"],
    );
    assert!(o.status.success(), "{}", describe(&o));
    assert!(
        stdout(&o).contains("wk-wol: power on sent"),
        "{}",
        describe(&o)
    );
    let pkt = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("no magic packet captured");
    assert_magic_packet(&pkt, net);

    // Send-only: no state to read, no way to power off or pick a boot device.
    let o = talboot(
        &lab,
        &inv,
        &state,
        BMC_PASS,
        &["node", "power", "wk-wol", "status"],
    );
    assert!(o.status.success(), "{}", describe(&o));
    assert!(stdout(&o).contains("power unknown"), "{}", describe(&o));
    for args in [
        &["node", "power", "wk-wol", "off"][..],
        &["node", "boot", "wk-wol", "network"][..],
    ] {
        let o = talboot(&lab, &inv, &state, BMC_PASS, args);
        assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("not supported"),
            "{}",
            describe(&o)
        );
    }
}

#[test]
fn wake_on_lan_appends_the_secureon_password() {
    if !require_tool("ip", "NETNS") {
        return;
    }
    let net = "10.94.1";
    let lab = wol_lab(net);
    let dir = tempfile::tempdir().unwrap();
    // Three nodes whose NIC is the one the lab's client has (`mac:` in the block).
    let node = |name: &str, n: u8, var: &str| {
        format!(
            "  - name: {name}
    mac: aa:00:00:00:00:3{n}
    role: worker
    address: {net}.3{n}/24
    installDisk: /dev/sda
    power: {{kind: wol, mac: aa:00:00:00:00:21, secureOnEnv: {var}}}
"
        )
    };
    let nodes = format!(
        "{}{}{}",
        node("wk-six", 1, "TB_TEST_WOL_SOPASS6"),
        node("wk-four", 2, "TB_TEST_WOL_SOPASS4"),
        node("wk-broken", 3, "TB_TEST_WOL_SOPASS_BAD"),
    );
    let inv = inventory(dir.path(), net, &nodes);
    let state = dir.path().join("state");

    for (name, want) in [
        ("wk-six", &[0x5e, 0xc2, 0x07, 0x0a, 0xb1, 0x9f][..]),
        ("wk-four", &[203, 0, 113, 77][..]),
    ] {
        let rx = capture_udp(&lab, 9);
        let o = talboot(&lab, &inv, &state, BMC_PASS, &["node", "power", name, "on"]);
        assert!(o.status.success(), "{}", describe(&o));
        let pkt = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("no magic packet captured");
        assert_magic_packet_with(&pkt, net, want);
    }

    // A password that is neither form: refused before anything is sent, naming the field
    // and the variable, not the value (the helper checks no output shows it).
    let o = talboot(
        &lab,
        &inv,
        &state,
        BMC_PASS,
        &["node", "power", "wk-broken", "on"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("power.secureOnEnv (environment variable TB_TEST_WOL_SOPASS_BAD) is not a SecureOn password")
            && err.contains("aa:bb:cc:dd:ee:ff"),
        "{}",
        describe(&o)
    );
}

/// `ipmi_sim` in the lab's server namespace on 127.0.0.1:`port`, with a chassis-control
/// program that keeps the power and boot device in files and appends every `set` to `log`.
struct Bmc {
    dir: tempfile::TempDir,
    port: u16,
}

impl Bmc {
    fn start(lab: &mut Lab, port: u16) -> Self {
        Self::start_with(lab, port, None)
    }

    /// The BMC of a QEMU VM (see [`Bmc::start_vm`]) with 64 MiB and no devices.
    fn start_with(lab: &mut Lab, port: u16, vm_port: Option<u16>) -> Self {
        Self::start_vm(lab, port, vm_port.map(|p| (p, 64, String::new())))
    }

    /// `vm_port`: the BMC is the BMC of a QEMU VM (TCG, `ipmi-bmc-extern` connecting back to
    /// ipmi_sim's system interface on that port): power 1 starts it with the recorded boot
    /// device (`pxe`: `-boot once=n`, `default`: `-boot order=c`), power 0 kills it, and
    /// `get power` is whether it runs. `vm`: that port, the VM's memory in MiB and more QEMU
    /// arguments (a NIC, a serial console).
    fn start_vm(lab: &mut Lab, port: u16, vm: Option<(u16, u32, String)>) -> Self {
        let vm_port = vm.as_ref().map(|v| v.0);
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let cc = d.join("chassis-control");
        // Called as `chassis-control DIR get power boot` / `... set power 1 boot pxe`
        // (OpenIPMI lanserv/bmc_chassis.c chassis_prog; lanserv/ipmi_sim_chassiscontrol).
        let script = match vm {
            None => "#!/bin/sh\n\
             dir=$1; op=$2; shift 2\n\
             case $op in\n\
             get) for p in \"$@\"; do case $p in\n\
               power) echo \"power:$(cat $dir/power 2>/dev/null || echo 0)\";;\n\
               boot) echo \"boot:$(cat $dir/boot 2>/dev/null || echo none)\";;\n\
               esac; done;;\n\
             set) while [ $# -gt 0 ]; do echo \"$1 $2\" >> $dir/log; case $1 in\n\
               power) echo $2 > $dir/power;; boot) echo $2 > $dir/boot;; esac; shift 2; done;;\n\
             esac\n"
                .to_owned(),
            Some((vm, mem, extra)) => format!(
                "#!/bin/sh\n\
                 dir=$1; op=$2; shift 2\n\
                 running() {{ [ -f $dir/qemu.pid ] && kill -0 $(cat $dir/qemu.pid) 2>/dev/null; }}\n\
                 case $op in\n\
                 get) for p in \"$@\"; do case $p in\n\
                   power) if running; then echo power:1; else echo power:0; fi;;\n\
                   boot) echo \"boot:$(cat $dir/boot 2>/dev/null || echo none)\";;\n\
                   esac; done;;\n\
                 set) while [ $# -gt 0 ]; do echo \"$1 $2\" >> $dir/log; case $1 in\n\
                   boot) echo $2 > $dir/boot;;\n\
                   power) if [ $2 = 1 ]; then\n\
                       running && {{ shift 2; continue; }}\n\
                       case $(cat $dir/boot 2>/dev/null) in pxe) b=once=n;; *) b=order=c;; esac\n\
                       qemu-system-x86_64 -machine pc,accel=tcg -m {mem} -display none -nodefaults {extra} \\\n\
                         -boot $b -chardev socket,id=ipmi0,host=127.0.0.1,port={vm},reconnect=10 \\\n\
                         -device ipmi-bmc-extern,id=bmc0,chardev=ipmi0 -device isa-ipmi-kcs,bmc=bmc0 \\\n\
                         -daemonize -pidfile $dir/qemu.pid\n\
                     else\n\
                       running && kill $(cat $dir/qemu.pid)\n\
                       while running; do sleep 0.05; done\n\
                     fi;;\n\
                   esac; shift 2; done;;\n\
                 esac\n"
            ),
        };
        std::fs::write(&cc, script).unwrap();
        run_ok(Command::new("chmod").arg("+x").arg(&cc));
        std::fs::write(
            d.join("lan.conf"),
            format!(
                "name \"tb\"\n\
                 set_working_mc 0x20\n\
                 \x20 startlan 1\n\
                 \x20   addr 127.0.0.1 {port}\n\
                 \x20   priv_limit admin\n\
                 \x20   allowed_auths_callback none md2 md5 straight\n\
                 \x20   allowed_auths_user none md2 md5 straight\n\
                 \x20   allowed_auths_operator none md2 md5 straight\n\
                 \x20   allowed_auths_admin none md2 md5 straight\n\
                 \x20   guid a123456789abcdefa123456789abcdef\n\
                 \x20 endlan\n\
                 \x20 chassis_control \"{} {}\"\n\
                 {}\
                 \x20 user 2 true \"{BMC_USER}\" \"{BMC_PASS}\" admin 10 none md2 md5 straight\n",
                cc.display(),
                d.display(),
                vm_port
                    .map(|p| format!("  serial 15 127.0.0.1 {p} codec VM\n"))
                    .unwrap_or_default()
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("bmc.emu"),
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.join("state")).unwrap();
        let log = std::fs::File::create(d.join("ipmi_sim.log")).unwrap();
        let child = lab
            .in_srv("ipmi_sim")
            .arg("-c")
            .arg(d.join("lan.conf"))
            .arg("-f")
            .arg(d.join("bmc.emu"))
            .arg("-s")
            .arg(d.join("state"))
            .args(["-n", "-d"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start ipmi_sim");
        lab.children.push(child);
        let bmc = Self { dir, port };
        bmc.wait_listening(lab);
        bmc
    }

    /// Until the simulator's UDP port is bound in the namespace.
    fn wait_listening(&self, lab: &Lab) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let needle = format!("127.0.0.1:{}", self.port);
        loop {
            let out = lab.in_srv("ss").args(["-Hnul"]).output().unwrap();
            if String::from_utf8_lossy(&out.stdout).contains(&needle) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ipmi_sim did not listen:\n{}",
                std::fs::read_to_string(self.dir.path().join("ipmi_sim.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every `set` the chassis-control program received, in order.
    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn wait_log(&self, want: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.log() != want {
            assert!(
                Instant::now() < deadline,
                "chassis control log {:?}, want {want:?}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn run_ok(c: &mut Command) {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {}", describe(&o));
}

#[test]
fn ipmi_power_and_one_time_boot_reach_the_bmc() {
    if !require_tool("ipmi_sim", "IPMI_SIM") || !require_tool("ip", "NETNS") {
        return;
    }
    let net = "10.95.0";
    let mut lab = Lab::new(net);
    let bmc = Bmc::start(&mut lab, 16230);
    let dir = tempfile::tempdir().unwrap();
    let inv = inventory(dir.path(), net, &ipmi_node(net, bmc.port));
    let state = dir.path().join("state");
    let tb = |args: &[&str]| {
        let o = talboot(&lab, &inv, &state, BMC_PASS, args);
        assert!(o.status.success(), "talboot {args:?}: {}", describe(&o));
        stdout(&o)
    };

    assert!(tb(&["node", "power", "wk-ipmi", "status"]).contains("wk-ipmi: power off"));
    assert!(tb(&["node", "boot", "wk-ipmi", "network"]).contains("next boot: network (once)"));
    bmc.wait_log(&["boot pxe"]);
    assert!(tb(&["node", "power", "wk-ipmi", "on"]).contains("power on sent"));
    bmc.wait_log(&["boot pxe", "power 1"]);
    assert!(tb(&["node", "power", "wk-ipmi", "status"]).contains("power on"));
    // A cycle is off now and on again once the BMC sees it off (ipmi_sim's 1 s timer).
    tb(&["node", "power", "wk-ipmi", "cycle"]);
    bmc.wait_log(&["boot pxe", "power 1", "power 0", "power 1"]);
    tb(&["node", "power", "wk-ipmi", "off"]);
    assert!(tb(&["node", "power", "wk-ipmi", "status"]).contains("power off"));
    tb(&["node", "boot", "wk-ipmi", "disk", "--persistent"]);
    bmc.wait_log(&[
        "boot pxe",
        "power 1",
        "power 0",
        "power 1",
        "power 0",
        "boot default",
    ]);

    // `check --probe` reaches the BMC without changing it.
    let o = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .args(["check", "--probe", "-c"])
        .arg(&inv)
        .env("TB_TEST_BMC_PASS", BMC_PASS)
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains("probe wk-ipmi: ipmi ipmi://127.0.0.1:16230 answered: power off"),
        "{}",
        describe(&o)
    );
    assert!(!describe(&o).contains(BMC_PASS));
    assert_eq!(bmc.log().len(), 6, "probe changed the chassis");
}

#[test]
fn a_wrong_or_missing_bmc_password_fails_without_showing_it() {
    if !require_tool("ipmi_sim", "IPMI_SIM") || !require_tool("ip", "NETNS") {
        return;
    }
    let net = "10.96.0";
    let mut lab = Lab::new(net);
    let bmc = Bmc::start(&mut lab, 16231);
    let dir = tempfile::tempdir().unwrap();
    let inv = inventory(dir.path(), net, &ipmi_node(net, bmc.port));
    let state = dir.path().join("state");
    // A wrong password: refused by RAKP, reported as refused credentials; `talboot` (the
    // helper) asserts neither the wrong nor the right password is in any output line.
    let wrong = "wrong-Pass-31337";
    let o = talboot(
        &lab,
        &inv,
        &state,
        wrong,
        &["node", "power", "wk-ipmi", "on"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    assert!(
        describe(&o).contains("refused the credentials"),
        "{}",
        describe(&o)
    );
    assert!(!describe(&o).contains(BMC_PASS));
    assert!(
        bmc.log().is_empty(),
        "a refused session changed the chassis"
    );
    // No variable at all: the error names the variable.
    let o = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .args(["node", "power", "wk-ipmi", "status", "-c"])
        .arg(&inv)
        .arg("--state-dir")
        .arg(&state)
        .env_remove("TB_TEST_BMC_PASS")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    assert!(
        describe(&o)
            .contains("environment variable TB_TEST_BMC_PASS (its power secret) is not set"),
        "{}",
        describe(&o)
    );
}

#[test]
fn rack_up_boots_each_node_from_the_network_once_and_powers_it_on() {
    if !require_tool("ipmi_sim", "IPMI_SIM") || !require_tool("ip", "NETNS") {
        return;
    }
    let net = "10.97.0";
    let mut lab = wol_lab(net);
    let bmc = Bmc::start(&mut lab, 16232);
    let dir = tempfile::tempdir().unwrap();
    let nodes = format!("{}{}", ipmi_node(net, bmc.port), wol_node(net));
    let inv = inventory(dir.path(), net, &nodes);
    let state = dir.path().join("state");
    let rx = capture_udp(&lab, 9);
    let o = talboot(
        &lab,
        &inv,
        &state,
        BMC_PASS,
        &["rack", "up", "--stagger", "100ms"],
    );
    assert!(o.status.success(), "{}", describe(&o));
    let out = stdout(&o);
    for line in [
        "cp-1: skipped (no power controller in the inventory)",
        "wk-ipmi: next boot: network (once)",
        "wk-ipmi: power on sent",
        "wk-wol: power on sent",
    ] {
        assert!(out.contains(line), "missing {line:?}:\n{out}");
    }
    bmc.wait_log(&["boot pxe", "power 1"]);
    assert_magic_packet(
        &rx.recv_timeout(Duration::from_secs(30))
            .expect("no magic packet"),
        net,
    );
}

/// A talosconfig for a throwaway CA (the node never answers, so it is never used on the
/// wire; `node rebuild` only needs one to build its client).
fn talosconfig(dir: &Path) -> PathBuf {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = talboot::sim::pki::SimCa::new_os_ca().unwrap();
    let admin = ca.admin().unwrap();
    let p = dir.join("talosconfig");
    std::fs::write(
        &p,
        format!(
            "context: t\ncontexts:\n  t:\n    endpoints: []\n    ca: {}\n    crt: {}\n    key: {}\n",
            b64(&ca.cert_pem),
            b64(&admin.cert_pem),
            b64(&talboot::sim::pki::talos_label(&admin.key_pem))
        ),
    )
    .unwrap();
    p
}

#[test]
fn rebuild_of_a_node_whose_talos_api_is_silent_goes_through_power_control() {
    if !require_tool("ipmi_sim", "IPMI_SIM") || !require_tool("ip", "NETNS") {
        return;
    }
    talboot::install_crypto_provider();
    let net = "10.98.0";
    let mut lab = Lab::new(net);
    let bmc = Bmc::start(&mut lab, 16233);
    let dir = tempfile::tempdir().unwrap();
    let inv = inventory(dir.path(), net, &ipmi_node(net, bmc.port));
    let state = dir.path().join("state");
    {
        // wk-ipmi was installed in an earlier run (a rebuild resets a provisioned node).
        use talboot::store::{NodePhase, NodeRecord};
        let store = talboot::store::open(&state).unwrap().split().1.nodes;
        let mut r = NodeRecord::unseen("wk-ipmi", 1);
        r.phase = NodePhase::Ready;
        r.provisioning_window_open = false;
        store.put_node(&r).unwrap();
    }
    let tc = talosconfig(dir.path());
    // Nothing listens at 10.98.0.22:50000 (no such host on the segment).
    let o = talboot(
        &lab,
        &inv,
        &state,
        BMC_PASS,
        &[
            "node",
            "rebuild",
            "wk-ipmi",
            "--talosconfig",
            tc.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", describe(&o));
    assert!(
        stdout(&o).contains("set a one-time network boot and power-cycled it"),
        "{}",
        describe(&o)
    );
    // PXE first, then the cycle (off; on again once the BMC sees it off).
    bmc.wait_log(&["boot pxe", "power 0", "power 1"]);
}

/// `talboot node power|boot` while push-mode `serve` holds the store: the command goes to
/// serve's admin API, which runs it on the node's driver (credentials resolved at serve's
/// start) and records a `power.action` event.
#[test]
fn power_commands_go_through_a_running_serve() {
    if !require_tool("ipmi_sim", "IPMI_SIM")
        || !require_tool("ip", "NETNS")
        || !require_tool("age-keygen", "AGE")
    {
        return;
    }
    let net = "10.99.0";
    let mut lab = Lab::new(net);
    let bmc = Bmc::start(&mut lab, 16234);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (inv, key) = push_inventory(d, net, &ipmi_node(net, bmc.port));
    support::images::fake_images(&inv, &d.join("images"));
    std::fs::create_dir_all(d.join("ipxe")).unwrap();
    for name in ["ipxe.efi", "undionly.kpxe", "snponly.efi"] {
        std::fs::write(d.join("ipxe").join(name), name).unwrap();
    }
    let state = d.join("state");
    let log = d.join("serve.log");
    let admin = "127.0.0.1:16299";
    let child = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .arg("serve")
        .arg("-c")
        .arg(&inv)
        .arg("--state-dir")
        .arg(&state)
        .arg("--images")
        .arg(d.join("images"))
        .arg("--ipxe-dir")
        .arg(d.join("ipxe"))
        .arg("--configs")
        .arg(d.join("out"))
        .args(["--advertise", &lab.server_ip(), "--no-dhcp"])
        .args(["--http-port", "18080", "--tftp-port", "16969"])
        .args(["--admin-listen", admin])
        .env("SOPS_AGE_KEY_FILE", &key)
        .env("TB_TEST_BMC_PASS", BMC_PASS)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    lab.children.push(child);
    wait_for_admin(&lab, admin, &log);
    // The CLI has no password in its environment: serve holds the driver.
    let via = |args: &[&str]| {
        let o = lab
            .in_srv(env!("CARGO_BIN_EXE_talboot"))
            .args(args)
            .arg("-c")
            .arg(&inv)
            .arg("--state-dir")
            .arg(&state)
            .args(["--admin", admin])
            .env_remove("TB_TEST_BMC_PASS")
            .output()
            .unwrap();
        assert!(o.status.success(), "talboot {args:?}: {}", describe(&o));
        assert!(!describe(&o).contains(BMC_PASS));
        stdout(&o)
    };
    assert!(
        via(&["node", "boot", "wk-ipmi", "network"]).contains("wk-ipmi: next boot: network (once)")
    );
    assert!(via(&["node", "power", "wk-ipmi", "on"]).contains("wk-ipmi: power on sent"));
    assert!(via(&["node", "power", "wk-ipmi", "status"]).contains("wk-ipmi: power on"));
    bmc.wait_log(&["boot pxe", "power 1"]);
    // `rack up` through serve: wk-ipmi is not provisioned (phase unknown), so it gets the
    // one-time network boot and power on again; cp-1 has no controller.
    let out = via(&["rack", "up", "--stagger", "0"]);
    for line in [
        "cp-1: skipped (no power controller in the inventory)",
        "wk-ipmi: next boot: network (once)",
        "wk-ipmi: power on sent",
    ] {
        assert!(out.contains(line), "missing {line:?}:\n{out}");
    }
    bmc.wait_log(&["boot pxe", "power 1", "boot pxe", "power 1"]);
    // The provisioner recorded each request on the node's timeline.
    let nodes = lab
        .in_srv("curl")
        .args(["-sf", &format!("http://{admin}/api/nodes")])
        .output()
        .unwrap();
    let nodes: serde_json::Value = serde_json::from_slice(&nodes.stdout).unwrap();
    let last = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "wk-ipmi")
        .map(|n| n["last_event"].as_str().unwrap_or_default().to_owned());
    assert_eq!(last.as_deref(), Some("power.action: power on sent"));
    let serve_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!serve_log.contains(BMC_PASS), "serve logged the password");
}

/// The pid of the VM the BMC runs, once its QEMU process is up.
fn vm_cmdline(bmc: &Bmc) -> Option<String> {
    let pid = std::fs::read_to_string(bmc.dir.path().join("qemu.pid")).ok()?;
    std::fs::read(format!("/proc/{}/cmdline", pid.trim()))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ipmi_sim_as_the_bmc_of_a_qemu_vm_powers_it_and_picks_its_boot_device() {
    if !require_tool("ipmi_sim", "IPMI_SIM")
        || !require_tool("ip", "NETNS")
        || !require_tool("qemu-system-x86_64", "QEMU")
    {
        return;
    }
    let net = "10.100.0";
    let mut lab = Lab::new(net);
    let bmc = Bmc::start_with(&mut lab, 16235, Some(16236));
    let dir = tempfile::tempdir().unwrap();
    let inv = inventory(dir.path(), net, &ipmi_node(net, bmc.port));
    let state = dir.path().join("state");
    let tb = |args: &[&str]| {
        let o = talboot(&lab, &inv, &state, BMC_PASS, args);
        assert!(o.status.success(), "talboot {args:?}: {}", describe(&o));
        stdout(&o)
    };
    assert!(tb(&["node", "power", "wk-ipmi", "status"]).contains("power off"));
    tb(&["node", "boot", "wk-ipmi", "network"]);
    tb(&["node", "power", "wk-ipmi", "on"]);
    wait_until("the VM starting", || vm_cmdline(&bmc).is_some());
    let cmd = vm_cmdline(&bmc).unwrap();
    assert!(
        cmd.contains("-boot once=n") && cmd.contains("ipmi-bmc-extern"),
        "{cmd}"
    );
    assert!(tb(&["node", "power", "wk-ipmi", "status"]).contains("power on"));
    tb(&["node", "power", "wk-ipmi", "off"]);
    wait_until("the VM stopping", || vm_cmdline(&bmc).is_none());
    assert!(tb(&["node", "power", "wk-ipmi", "status"]).contains("power off"));
    tb(&["node", "boot", "wk-ipmi", "disk"]);
    tb(&["node", "power", "wk-ipmi", "on"]);
    wait_until("the VM starting from disk", || {
        vm_cmdline(&bmc).is_some_and(|c| c.contains("-boot order=c"))
    });
    tb(&["node", "power", "wk-ipmi", "off"]);
    wait_until("the VM stopping", || vm_cmdline(&bmc).is_none());
}

/// An IPMI node `name` (MAC suffix and address `.{n}`) behind the BMC on `port`.
fn ipmi_node_named(net: &str, name: &str, n: u8, port: u16) -> String {
    format!(
        "  - name: {name}
    mac: aa:00:00:00:00:{n:02x}
    role: worker
    address: {net}.{n}/24
    installDisk: /dev/sda
    power: {{kind: ipmi, host: 127.0.0.1, port: {port}, user: {BMC_USER}, passwordEnv: TB_TEST_BMC_PASS}}
"
    )
}

/// `serve --power-on`: once serving, every node not provisioned yet gets a one-time network
/// boot and power on, one after another with the stagger between them; a node the store
/// has as installed is left alone; each answer is on the node's timeline.
#[test]
fn serve_power_on_boots_unprovisioned_nodes_from_the_network_once_staggered() {
    if !require_tool("ipmi_sim", "IPMI_SIM") || !require_tool("ip", "NETNS") {
        return;
    }
    use talboot::store::{NodePhase, NodeRecord, Store};
    let net = "10.101.0";
    let mut lab = Lab::new(net);
    let first = Bmc::start(&mut lab, 16240);
    let done = Bmc::start(&mut lab, 16241);
    let second = Bmc::start(&mut lab, 16242);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let nodes = format!(
        "{}{}{}",
        ipmi_node_named(net, "wk-a", 0x31, first.port),
        ipmi_node_named(net, "wk-done", 0x32, done.port),
        ipmi_node_named(net, "wk-b", 0x33, second.port)
    );
    let inv = inventory(d, net, &nodes);
    support::images::fake_images(&inv, &d.join("images"));
    std::fs::create_dir_all(d.join("ipxe")).unwrap();
    for name in ["ipxe.efi", "undionly.kpxe", "snponly.efi"] {
        std::fs::write(d.join("ipxe").join(name), name).unwrap();
    }
    let state = d.join("state");
    {
        // wk-done was installed in an earlier run.
        let store = talboot::store::open(&state).unwrap().split().1.nodes;
        let mut r = NodeRecord::unseen("wk-done", 1);
        r.phase = NodePhase::Ready;
        r.provisioning_window_open = false;
        store.put_node(&r).unwrap();
    }
    let stagger = Duration::from_millis(1500);
    let log = d.join("serve.log");
    let child = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .args(["--log", "debug", "serve", "-c"])
        .arg(&inv)
        .arg("--state-dir")
        .arg(&state)
        .arg("--images")
        .arg(d.join("images"))
        .arg("--ipxe-dir")
        .arg(d.join("ipxe"))
        .args([
            "--advertise",
            &lab.server_ip(),
            "--no-dhcp",
            "--no-provision",
        ])
        .args(["--http-port", "18081", "--tftp-port", "16970"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--power-on", "--power-on-stagger", "1500ms"])
        .env("TB_TEST_BMC_PASS", BMC_PASS)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    lab.children.push(child);
    support::netns::wait_for_text(&log, "power-on: round done", Duration::from_secs(60));
    first.wait_log(&["boot pxe", "power 1"]);
    second.wait_log(&["boot pxe", "power 1"]);
    assert!(done.log().is_empty(), "an installed node was powered on");
    for c in &mut lab.children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }
    lab.children.clear();
    let serve_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!serve_log.contains(BMC_PASS), "serve logged the password");
    assert!(
        serve_log.contains("power-on: skipped (ready)"),
        "{serve_log}"
    );

    let store = talboot::store::open(&state).unwrap();
    let power = |node: &str| -> Vec<(u64, String)> {
        store
            .events(node, 0, 100)
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "power.action")
            .map(|e| (e.at_unix_ms, e.detail))
            .collect()
    };
    let (a, b) = (power("wk-a"), power("wk-b"));
    let details = |v: &[(u64, String)]| v.iter().map(|e| e.1.clone()).collect::<Vec<_>>();
    let want = ["next boot: network (once)", "power on sent"];
    assert_eq!(details(&a), want, "{serve_log}");
    assert_eq!(details(&b), want, "{serve_log}");
    assert!(power("wk-done").is_empty());
    // Staggered: the second node's first request came at least the pause after the first
    // node's power-on was answered (a lower bound the sleep guarantees, not a speed).
    let gap = Duration::from_millis(b[0].0.saturating_sub(a[1].0));
    assert!(gap >= stagger - Duration::from_millis(5), "gap {gap:?}");
}

/// `rack up` with a real machine behind the BMC: `ipmi_sim` is the BMC of a QEMU VM (TCG,
/// SeaBIOS + the iPXE NIC ROM, a NIC on the lab's bridge, no disk) and push-mode `serve`
/// holds the store, so `rack up` goes through serve's provisioner. The BMC starts QEMU with
/// `-boot once=n` only because of the one-time network boot `rack up` set (otherwise
/// `order=c`, a disk it does not have); the VM then boots through talboot's DHCP and HTTP to
/// the test kernel, whose marker and command line appear on its serial console.
#[test]
fn rack_up_boots_a_vm_behind_ipmi_through_talboot() {
    boot_vm_behind_ipmi(false);
}

/// The same machine powered on by `serve --power-on` itself (pull delivery, no
/// provisioner: serve's power-on round holds the driver).
#[test]
fn serve_power_on_boots_a_vm_behind_ipmi_through_talboot() {
    boot_vm_behind_ipmi(true);
}

fn boot_vm_behind_ipmi(power_on: bool) {
    if !require_tool("ipmi_sim", "IPMI_SIM")
        || !require_tool("ip", "NETNS")
        || !require_tool("qemu-system-x86_64", "QEMU")
        || !require_tool("age-keygen", "AGE")
    {
        return;
    }
    let (net, bmc_port, admin) = if power_on {
        ("10.103.0", 16245, "127.0.0.1:16296")
    } else {
        ("10.102.0", 16243, "127.0.0.1:16297")
    };
    let mut lab = Lab::new(net);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for args in [
        &["tuntap", "add", "dev", "tap0", "mode", "tap"][..],
        &["link", "set", "tap0", "master", "br0"],
        &["link", "set", "tap0", "up"],
    ] {
        run_ok(Command::new("ip").args(["-n", &lab.srv]).args(args));
    }
    let console = d.join("console.log");
    let extra = format!(
        "-netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
         -device e1000,netdev=n0,mac=aa:00:00:00:00:22 -serial file:{}",
        console.display()
    );
    let bmc = Bmc::start_vm(&mut lab, bmc_port, Some((bmc_port + 1, 512, extra)));
    let (inv, key) = push_inventory(d, net, &ipmi_node(net, bmc.port));
    if power_on {
        // Pull delivery of the rendered config: serve runs no provisioner.
        let text = std::fs::read_to_string(&inv).unwrap();
        std::fs::write(&inv, format!("{text}boot:\n  delivery: pull\n")).unwrap();
    }
    let loaded = talboot::inventory::load_with_env(&inv, &std::collections::BTreeMap::new())
        .unwrap()
        .inventory;
    let vmlinuz = support::qemu::vmlinuz(d);
    let initramfs = support::qemu::marker_initramfs(d);
    let images = support::qemu::images(
        d,
        &vmlinuz,
        &initramfs,
        loaded.cluster.installer.schematic_id(),
    );
    let state = d.join("state");
    let log = d.join("serve.log");
    let mut serve = lab.in_srv(env!("CARGO_BIN_EXE_talboot"));
    serve
        .args(["--log", "debug", "serve", "-c"])
        .arg(&inv)
        .arg("--state-dir")
        .arg(&state)
        .arg("--images")
        .arg(&images)
        .arg("--configs")
        .arg(d.join("out"))
        .args(["--advertise", &lab.server_ip()])
        .args(["--admin-listen", admin])
        .env("SOPS_AGE_KEY_FILE", &key)
        .env("TB_TEST_BMC_PASS", BMC_PASS)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if power_on {
        serve.args(["--no-provision", "--power-on"]);
    }
    let child = support::qemu::die_with_parent(&mut serve).spawn().unwrap();
    lab.children.push(child);
    wait_for_admin(&lab, admin, &log);

    if power_on {
        support::netns::wait_for_text(&log, "power-on: round done", Duration::from_secs(60));
        bmc.wait_log(&["boot pxe", "power 1"]);
    } else {
        rack_up_through(&lab, &inv, &state, admin);
    }
    wait_until("the VM starting", || vm_cmdline(&bmc).is_some());
    let cmd = vm_cmdline(&bmc).unwrap_or_default();
    assert!(cmd.contains("-boot once=n"), "{cmd}");
    wait_for_marker(&console, &log);
}

/// `talboot rack up` while serve holds the store (so through its admin API).
fn rack_up_through(lab: &Lab, inv: &Path, state: &Path, admin: &str) {
    let o = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .args(["rack", "up", "--stagger", "0", "-c"])
        .arg(inv)
        .arg("--state-dir")
        .arg(state)
        .args(["--admin", admin])
        .env_remove("TB_TEST_BMC_PASS")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    assert!(!describe(&o).contains(BMC_PASS));
    for line in [
        "wk-ipmi: next boot: network (once)",
        "wk-ipmi: power on sent",
    ] {
        assert!(
            stdout(&o).contains(line),
            "missing {line:?}: {}",
            describe(&o)
        );
    }
}

/// Until the test kernel's marker is on the VM's console; then checks it booted with
/// talboot's command line, that talboot saw the VM, and that serve logged no password.
fn wait_for_marker(console: &Path, log: &Path) {
    // TCG boots through iPXE take 15-40 s here; several times the slowest seen.
    let deadline = Instant::now() + Duration::from_secs(240);
    let text = loop {
        let text = std::fs::read_to_string(console).unwrap_or_default();
        if text.contains(support::qemu::KERNEL_MARKER) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the VM did not boot the test kernel through talboot:\nconsole:\n{text}\nserve:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let line = text
        .lines()
        .find(|l| l.contains(support::qemu::KERNEL_MARKER))
        .unwrap();
    assert!(line.contains("talos.platform=metal"), "{line}");
    let serve_log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!serve_log.contains(BMC_PASS), "serve logged the password");
    assert!(
        serve_log.contains("aa:00:00:00:00:22"),
        "talboot never saw the VM:\n{serve_log}"
    );
}

/// Until serve's admin API answers.
fn wait_for_admin(lab: &Lab, admin: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = lab
            .in_srv("curl")
            .args([
                "-sf",
                "-o",
                "/dev/null",
                &format!("http://{admin}/api/nodes"),
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if up {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not come up:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An inventory of cp-1 and `nodes` with an age-encrypted secrets bundle and rendered
/// configs (`out/`), as push-mode `serve` needs; returns it and the age key file.
fn push_inventory(d: &Path, net: &str, nodes: &str) -> (PathBuf, PathBuf) {
    let key = d.join("key.txt");
    run_ok(Command::new("age-keygen").arg("-o").arg(&key));
    let recipient = String::from_utf8(
        Command::new("age-keygen")
            .arg("-y")
            .arg(&key)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let inv = inventory(d, net, nodes);
    let text = std::fs::read_to_string(&inv).unwrap().replace(
        "  endpoint:",
        &format!(
            "  secrets: {{file: secrets.age, ageRecipients: [{}]}}\n  endpoint:",
            recipient.trim()
        ),
    );
    std::fs::write(&inv, text).unwrap();
    for args in [
        vec!["secrets".to_owned(), "init".to_owned()],
        vec![
            "gen".to_owned(),
            "-o".to_owned(),
            d.join("out").display().to_string(),
        ],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_talboot"))
            .args(&args)
            .arg("-c")
            .arg(&inv)
            .env("SOPS_AGE_KEY_FILE", &key)
            .output()
            .unwrap();
        assert!(o.status.success(), "talboot {args:?}: {}", describe(&o));
    }
    (inv, key)
}

/// Where scripts/test-deps builds the pyghmi venv.
const PYGHMI_VENV: &str = "/var/tmp/talboot-test/pyghmi-venv";

/// A BMC on pyghmi's server side (`tests/support/pyghmi_bmc.py`, pyghmi pinned by
/// scripts/test-deps) in the lab's server namespace on 127.0.0.1:`port`. Like virtualbmc, it
/// never answers the RMCP presence ping; it appends `power on|off|cycle` and the raw Set
/// System Boot Options parameter-5 bytes (`bootflags 05 a0 04 00 00 00`) to its log.
struct PyghmiBmc {
    dir: tempfile::TempDir,
    port: u16,
}

impl PyghmiBmc {
    /// True when the venv is there; otherwise panics unless TALBOOT_SKIP_PYGHMI is set.
    fn available() -> bool {
        if Path::new(PYGHMI_VENV).join("bin/python").exists() {
            return true;
        }
        if std::env::var_os("TALBOOT_SKIP_PYGHMI").is_some() {
            eprintln!("pyghmi venv missing; skipped (TALBOOT_SKIP_PYGHMI is set)");
            return false;
        }
        panic!("{PYGHMI_VENV} is missing: run scripts/test-deps (or set TALBOOT_SKIP_PYGHMI=1)");
    }

    fn start(lab: &mut Lab, port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("bmc.out")).unwrap();
        let child = lab
            .in_srv(Path::new(PYGHMI_VENV).join("bin/python"))
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/support/pyghmi_bmc.py"
            ))
            .args(["127.0.0.1", &port.to_string(), BMC_USER, BMC_PASS])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the pyghmi BMC");
        // The lab kills it on drop, also when an assertion fails.
        lab.children.push(child);
        let bmc = Self { dir, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        let needle = format!("127.0.0.1:{port}");
        loop {
            let out = lab.in_srv("ss").args(["-Hnul"]).output().unwrap();
            if bmc.dir.path().join("ready").exists()
                && String::from_utf8_lossy(&out.stdout).contains(&needle)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the pyghmi BMC did not listen:\n{}",
                std::fs::read_to_string(bmc.dir.path().join("bmc.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        bmc
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn pyghmi_node(net: &str, name: &str, n: u8, port: u16, firmware: &str) -> String {
    format!(
        "  - name: {name}
    mac: aa:00:00:00:00:{n:02x}
    role: worker
    address: {net}.{n}/24
    installDisk: /dev/sda
{firmware}    power: {{kind: ipmi, host: 127.0.0.1, port: {port}, user: {BMC_USER}, passwordEnv: TB_TEST_BMC_PASS}}
"
    )
}

#[test]
fn ipmi_against_a_pyghmi_bmc_without_the_rmcp_pong_powers_and_asks_for_an_efi_boot() {
    if !require_tool("ip", "NETNS")
        || !require_tool("rmcp_ping", "IPMI_SIM")
        || !require_tool("ipmitool", "IPMITOOL")
        || !PyghmiBmc::available()
    {
        return;
    }
    let net = "10.98.0";
    let mut lab = Lab::new(net);
    let bmc = PyghmiBmc::start(&mut lab, 16240);

    // The peer is what the defect needs: no answer to the RMCP presence ping (OpenIPMI's
    // rmcp_ping prints each pong it gets), while ipmitool's lanplus, which never pings,
    // reads the power state.
    let ping = lab
        .in_srv("rmcp_ping")
        .args(["-p", &bmc.port.to_string(), "-t", "1", "127.0.0.1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ping.stdout).trim().is_empty(),
        "the pyghmi BMC answered the presence ping: {}",
        describe(&ping)
    );
    let ipmitool = |args: &[&str]| {
        let o = lab
            .in_srv("ipmitool")
            .args(["-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p"])
            .arg(bmc.port.to_string())
            .args(["-U", BMC_USER, "-P", BMC_PASS])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "ipmitool {args:?}: {}", describe(&o));
        stdout(&o)
    };
    assert!(ipmitool(&["chassis", "power", "status"]).contains("Chassis Power is off"));
    // ipmitool's bytes for a UEFI PXE boot, once and persistent: the reference for talboot's.
    ipmitool(&["chassis", "bootdev", "pxe", "options=efiboot"]);
    ipmitool(&["chassis", "bootdev", "pxe", "options=efiboot,persistent"]);
    let reference = bmc.log();
    assert_eq!(
        reference,
        ["bootflags 05 a0 04 00 00 00", "bootflags 05 e0 04 00 00 00"],
        "ipmitool's EFI boot flags as the pyghmi BMC recorded them"
    );

    let dir = tempfile::tempdir().unwrap();
    let nodes = format!(
        "{}{}",
        pyghmi_node(net, "wk-uefi", 0x41, bmc.port, "    firmware: uefi\n"),
        pyghmi_node(net, "wk-bios", 0x42, bmc.port, "    firmware: bios\n"),
    );
    let inv = inventory(dir.path(), net, &nodes);
    let state = dir.path().join("state");
    let tb = |args: &[&str]| {
        let o = talboot(&lab, &inv, &state, BMC_PASS, args);
        assert!(o.status.success(), "talboot {args:?}: {}", describe(&o));
        stdout(&o)
    };
    let since = |n: usize| bmc.log()[n..].to_vec();

    // Power on, status, off: a session is opened although no pong ever comes.
    assert!(tb(&["node", "power", "wk-uefi", "status"]).contains("wk-uefi: power off"));
    assert!(tb(&["node", "power", "wk-uefi", "on"]).contains("power on sent"));
    assert!(tb(&["node", "power", "wk-uefi", "status"]).contains("wk-uefi: power on"));
    assert!(tb(&["node", "power", "wk-uefi", "off"]).contains("power off sent"));
    assert!(tb(&["node", "power", "wk-uefi", "status"]).contains("wk-uefi: power off"));
    assert_eq!(since(2), ["power on", "power off"]);

    // A UEFI node: the same bytes as ipmitool's `options=efiboot`, once and persistent.
    let n = bmc.log().len();
    assert!(tb(&["node", "boot", "wk-uefi", "network"]).contains("next boot: network (once)"));
    tb(&["node", "boot", "wk-uefi", "network", "--persistent"]);
    tb(&["node", "boot", "wk-uefi", "disk", "--persistent"]);
    assert_eq!(
        since(n),
        [
            reference[0].as_str(),
            reference[1].as_str(),
            "bootflags 05 e0 08 00 00 00"
        ]
    );

    // A BIOS node: a legacy (PC compatible) boot, bit 5 clear.
    let n = bmc.log().len();
    tb(&["node", "boot", "wk-bios", "network"]);
    assert_eq!(since(n), ["bootflags 05 80 04 00 00 00"]);

    // `check --probe` reaches it too.
    let o = lab
        .in_srv(env!("CARGO_BIN_EXE_talboot"))
        .args(["check", "--probe", "-c"])
        .arg(&inv)
        .env("TB_TEST_BMC_PASS", BMC_PASS)
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains(&format!(
            "probe wk-uefi: ipmi ipmi://127.0.0.1:{} answered: power off",
            bmc.port
        )),
        "{}",
        describe(&o)
    );
}
