//! The per-node `localBoot` method ends the reinstall loop, with real firmware: a QEMU VM
//! (TCG, SeaBIOS + the iPXE NIC ROM) whose boot order is network first, then its disk, boots
//! through `talboot serve` in a network namespace.
//!
//! - Before talboot has the node installed, the network boot wins: the test kernel's marker
//!   appears on the serial console (so, with this boot order, every reboot would reinstall).
//! - Once the store says installed (phase Ready, provisioning window closed, as the
//!   provisioner leaves a node after its install), each method hands the machine to its
//!   disk: `exit` (iPXE returns to SeaBIOS, which tries the next boot entry), `sanboot
//!   --drive 0x80` (iPXE boots the BIOS disk itself) and `http404` (the per-MAC script is
//!   not found, the chain script gives up, SeaBIOS moves on). The disk holds a 512-byte boot
//!   sector of this test's that writes [`DISK_MARKER`] to COM1: that line on the console is
//!   the proof the VM booted its disk, and the test kernel's marker must not appear.
//!
//! Needs root (namespaces, tap), qemu-system-x86, ipxe-qemu, busybox-static, cpio and the
//! cached Debian kernel (scripts/test-deps). TALBOOT_SKIP_QEMU=1 skips it.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::netns::{Lab, require_tool, run};
use support::qemu::{self, Firmware, KERNEL_MARKER, Vm};
use talboot::store::{NodePhase, NodeRecord, Store};

/// What the test's boot sector prints on COM1.
const DISK_MARKER: &str = "TALBOOT-LOCAL-DISK-BOOTED";
/// TCG boots through iPXE take 15-40 s here; several times the slowest seen.
const BOOT_LIMIT: Duration = Duration::from_secs(240);

/// The three nodes: name, MAC, local-boot method.
const NODES: [(&str, &str, &str); 3] = [
    ("vm-exit", "52:54:00:7a:2c:01", "exit"),
    ("vm-sanboot", "52:54:00:7a:2c:02", "sanboot"),
    ("vm-404", "52:54:00:7a:2c:03", "http404"),
];

/// A real-mode MBR: write [`DISK_MARKER`] and CR LF to the 16550 at 0x3f8 (QEMU sends what
/// lands in its transmit register whatever the line settings), then halt. Hand-assembled:
///
/// ```text
/// 7c00 fa          cli
/// 7c01 fc          cld
/// 7c02 31 c0       xor ax, ax
/// 7c04 8e d8       mov ds, ax
/// 7c06 be 17 7c    mov si, msg        ; 7c17
/// 7c09 ba f8 03    mov dx, 0x3f8
/// 7c0c ac          next: lodsb
/// 7c0d 84 c0       test al, al
/// 7c0f 74 03       jz done            ; 7c14
/// 7c11 ee          out dx, al
/// 7c12 eb f8       jmp next
/// 7c14 f4          done: hlt
/// 7c15 eb fd       jmp done
/// 7c17 msg: DISK_MARKER, 13, 10, 0
/// 7dfe 55 aa       boot signature
/// ```
fn boot_sector() -> Vec<u8> {
    let mut s = vec![
        0xfa, 0xfc, 0x31, 0xc0, 0x8e, 0xd8, 0xbe, 0x17, 0x7c, 0xba, 0xf8, 0x03, 0xac, 0x84, 0xc0,
        0x74, 0x03, 0xee, 0xeb, 0xf8, 0xf4, 0xeb, 0xfd,
    ];
    assert_eq!(s.len(), 0x17);
    s.extend_from_slice(DISK_MARKER.as_bytes());
    s.extend_from_slice(b"\r\n\0");
    s.resize(510, 0);
    s.extend_from_slice(&[0x55, 0xaa]);
    s
}

fn inventory(net: &str) -> String {
    let mut nodes = String::new();
    for (i, (name, mac, method)) in NODES.iter().enumerate() {
        nodes.push_str(&format!(
            "  - name: {name}
    mac: {mac}
    role: {role}
    address: {net}.{addr}/24
    installDisk: /dev/sda
    firmware: bios
    localBoot: {method}
",
            role = if i == 0 { "controlplane" } else { "worker" },
            addr = 50 + i
        ));
    }
    format!(
        "cluster:
  name: lb
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{net}.50:6443
network:
  interfaces: [br0]
  subnet: {net}.0/24
  gateway: {net}.1
  advertise: {net}.1
boot:
  delivery: pull
nodes:
{nodes}"
    )
}

/// `talboot serve` in the lab's server namespace, its log in `log`.
fn serve(lab: &mut Lab, config: &Path, state: &Path, images: &Path, configs: &Path, log: &Path) {
    let child = qemu::die_with_parent(
        lab.in_srv(env!("CARGO_BIN_EXE_talboot"))
            .args(["serve", "-c"])
            .arg(config)
            .arg("--state-dir")
            .arg(state)
            .arg("--images")
            .arg(images)
            .arg("--configs")
            .arg(configs)
            .arg("--no-provision")
            .args(["--admin-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(log).unwrap())),
    )
    .spawn()
    .unwrap();
    lab.children.push(child);
    // Until serve answers HTTP on its boot port.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = lab
            .in_srv("curl")
            .args(["-s", "-o", "/dev/null", "http://127.0.0.1:8080/boot.ipxe"])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
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

fn stop_serve(lab: &mut Lab) {
    for c in &mut lab.children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }
    lab.children.clear();
}

/// A VM with NIC `mac` (boot entry 1) and `disk` (boot entry 2) on a new tap of the lab.
fn vm(lab: &Lab, work: &Path, tap: &str, mac: &str, disk: &Path) -> Vm {
    for args in [
        vec!["tuntap", "add", "dev", tap, "mode", "tap"],
        vec!["link", "set", tap, "master", "br0"],
        vec!["link", "set", tap, "up"],
    ] {
        run(Command::new("ip").args(["-n", &lab.srv]).args(&args));
    }
    let drive = format!("file={},format=raw,if=none,id=d0", disk.display());
    let mut launcher = Command::new("ip");
    launcher.args(["netns", "exec", &lab.srv]);
    Vm::start_with(
        launcher,
        work,
        tap,
        mac,
        Firmware::BiosIpxeRom,
        &["-drive", &drive, "-device", "ide-hd,drive=d0,bootindex=2"],
    )
}

#[test]
fn local_boot_methods_end_the_reinstall_loop_with_network_first_boot_order() {
    if !require_tool("ip", "NETNS")
        || !require_tool("qemu-system-x86_64", "QEMU")
        || !require_tool("curl", "QEMU")
    {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("tb-localboot-")
        .tempdir()
        .unwrap();
    let work = tmp.path();
    let net = "10.86.0";
    let mut lab = Lab::new(net);
    let config = work.join("talboot.yaml");
    std::fs::write(&config, inventory(net)).unwrap();
    let inv = talboot::inventory::load_with_env(&config, &std::collections::BTreeMap::new())
        .unwrap()
        .inventory;
    let vmlinuz = qemu::vmlinuz(work);
    let initramfs = qemu::marker_initramfs(work);
    let images = qemu::images(
        work,
        &vmlinuz,
        &initramfs,
        inv.cluster.installer.schematic_id(),
    );
    let configs = work.join("out");
    std::fs::create_dir_all(&configs).unwrap();
    for (name, ..) in NODES {
        std::fs::write(
            configs.join(format!("{name}.yaml")),
            "version: v1alpha1\nmachine:\n  type: worker\n",
        )
        .unwrap();
    }
    let state = work.join("state");
    let mut disks = Vec::new();
    for (name, ..) in NODES {
        let p = work.join(format!("{name}.img"));
        let mut img = boot_sector();
        img.resize(1 << 20, 0);
        std::fs::write(&p, img).unwrap();
        disks.push(p);
    }

    // Not installed yet: the network boot wins, the machine would reinstall.
    let log1 = work.join("serve-1.log");
    serve(&mut lab, &config, &state, &images, &configs, &log1);
    {
        let mut vm = vm(&lab, work, "tap0", NODES[0].1, &disks[0]);
        assert!(
            vm.wait_for(KERNEL_MARKER, BOOT_LIMIT),
            "a node not yet installed did not boot from the network:\n{}\n--- talboot ---\n{}",
            vm.console_text(),
            std::fs::read_to_string(&log1).unwrap_or_default()
        );
        assert!(!vm.console_text().contains(DISK_MARKER));
    }
    stop_serve(&mut lab);

    // What the provisioner records once a node is installed and booted from disk.
    {
        let (store, w) = talboot::store::open(&state).unwrap().split();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        for (name, ..) in NODES {
            let mut r = store
                .node(name)
                .unwrap()
                .unwrap_or_else(|| NodeRecord::unseen(name, now));
            r.phase = NodePhase::Ready;
            r.provisioning_window_open = false;
            r.updated_at_unix = now;
            w.nodes.put_node(&r).unwrap();
        }
    }

    let log2 = work.join("serve-2.log");
    serve(&mut lab, &config, &state, &images, &configs, &log2);
    for (i, (name, mac, method)) in NODES.iter().enumerate() {
        let tap = format!("tap{}", i + 1);
        let mut vm = vm(&lab, work, &tap, mac, &disks[i]);
        let booted = vm.wait_for(DISK_MARKER, BOOT_LIMIT);
        let console = vm.console_text();
        drop(vm);
        assert!(
            booted,
            "{name} (localBoot {method}) did not boot its disk:\n{console}\n--- talboot ---\n{}",
            std::fs::read_to_string(&log2).unwrap_or_default()
        );
        assert!(
            !console.contains(KERNEL_MARKER),
            "{name} (localBoot {method}) booted the network kernel again:\n{console}"
        );
    }
    stop_serve(&mut lab);

    // talboot answered each installed node's script request itself (the disk boot was not a
    // network failure): the timeline has the request, and the http404 node got its 404.
    let store = talboot::store::open(&state).unwrap();
    for (name, _, method) in NODES {
        let events = store.events(name, 0, 200).unwrap();
        let scripts: Vec<&str> = events
            .iter()
            .filter(|e| e.kind == "http.script")
            .map(|e| e.detail.as_str())
            .collect();
        assert!(
            scripts.iter().any(|d| d.contains("local-disk script")),
            "{name} (localBoot {method}): no local-disk script answer on its timeline: {scripts:?}"
        );
    }
}
