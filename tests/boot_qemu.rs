//! The whole boot chain with real firmware: QEMU (TCG) with the iPXE NIC ROM, under SeaBIOS
//! (legacy BIOS) and OVMF (UEFI), boots through `talboot serve` in a network namespace: DHCP ->
//! iPXE script -> kernel + initramfs over HTTP. The "Talos" is a real Debian kernel with a
//! busybox initramfs built here; it prints its kernel command line and fetches the
//! `talos.config=` URL it was given, and the test checks both on the serial console and
//! talboot's events for the machine's MAC.
//!
//! Real defaults: `serve` runs with its default `--ipxe-dir`, the `/usr/lib/ipxe` of the
//! installed `ipxe` package, as an operator runs it. The UEFI machine has no NIC ROM, so
//! OVMF's own PXE fetches `ipxe.efi` over talboot's TFTP: on Debian 12 that name is a symlink
//! to `/boot/ipxe.efi` (`dpkg -L ipxe`), the layout a root-confined TFTP server refuses.
//!
//! Needs root (namespaces, tap), qemu-system-x86, ipxe-qemu, ovmf, busybox-static, cpio and a
//! Debian kernel package in /var/tmp/talboot-test (all installed by scripts/test-deps).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use talboot::artifacts::{Catalog, Entry, FileRecord, Kind, SetId, hash_file};

const KERNEL_CACHE: &str = "/var/tmp/talboot-test";
const VM_MAC: &str = "52:54:00:7a:1b:01";
/// TCG boots take 15-30 s here; four times the slowest observed run.
const VM_TIMEOUT: Duration = Duration::from_secs(240);

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace with a bridge (talboot's side) and a tap for the VM; deleted on drop
/// together with every process still running in it.
struct Lab {
    ns: String,
    server_ip: String,
    children: Vec<Child>,
}

impl Lab {
    fn new(tag: &str, bridge: &str, server_cidr: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ns = format!("tb-{tag}-{}-{n}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        run(Command::new("ip").args(["netns", "add", &ns]));
        let lab = Lab {
            ns: ns.clone(),
            server_ip: server_cidr.split('/').next().unwrap().to_string(),
            children: Vec::new(),
        };
        let ip = |args: &[&str]| run(Command::new("ip").args(["-n", &ns]).args(args));
        ip(&["link", "set", "lo", "up"]);
        ip(&[
            "link",
            "add",
            bridge,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ]);
        ip(&["addr", "add", server_cidr, "dev", bridge]);
        ip(&["tuntap", "add", "dev", "tap0", "mode", "tap"]);
        ip(&["link", "set", "tap0", "master", bridge]);
        ip(&["link", "set", "tap0", "up"]);
        ip(&["link", "set", bridge, "up"]);
        lab
    }

    fn exec(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Extract vmlinuz and the e1000 driver from the cached Debian kernel package.
fn kernel_files(work: &Path) -> (PathBuf, PathBuf) {
    let deb = std::fs::read_dir(KERNEL_CACHE)
        .unwrap_or_else(|e| panic!("{KERNEL_CACHE}: {e}; run scripts/test-deps"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap_or_else(|| panic!("no kernel package in {KERNEL_CACHE}; run scripts/test-deps"));
    let dir = work.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    run(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*' '*/e1000/e1000.ko'",
        deb.display(),
        dir.display()
    )));
    let find = |pattern: &str| {
        let out = run(Command::new("sh").arg("-c").arg(format!(
            "find '{}' -name '{pattern}' | head -1",
            dir.display()
        )));
        PathBuf::from(out.trim())
    };
    (find("vmlinuz-*"), find("e1000.ko"))
}

/// A busybox initramfs whose /init reports the command line and fetches talos.config=.
fn build_initramfs(work: &Path, e1000: &Path) -> PathBuf {
    let root = work.join("initramfs");
    for d in ["bin", "proc", "sys", "dev", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static is installed");
    std::fs::copy(e1000, root.join("e1000.ko")).unwrap();
    let init = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "TALBOOT-CMDLINE: $(cat /proc/cmdline)"
insmod /e1000.ko
ip link set eth0 up
udhcpc -i eth0 -n -q -t 10 -T 2 -s /udhcpc.sh
url=$(sed -n 's/.*talos\.config=\([^ ]*\).*/\1/p' /proc/cmdline)
if wget -q -O /tmp/config "$url"; then
  echo "TALBOOT-CONFIG-BEGIN"
  cat /tmp/config
  echo "TALBOOT-CONFIG-END"
else
  echo "TALBOOT-CONFIG-FAILED $url"
fi
poweroff -f
"#;
    let udhcpc = r#"#!/bin/sh
case "$1" in
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/$mask" dev "$interface"
    [ -n "$router" ] && ip route add default via "$router"
    echo "TALBOOT-IP: $ip"
    ;;
esac
"#;
    for (name, body) in [("init", init), ("udhcpc.sh", udhcpc)] {
        let p = root.join(name);
        std::fs::write(&p, body).unwrap();
        run(Command::new("chmod").arg("755").arg(&p));
    }
    let out = work.join("initramfs.cpio.gz");
    run(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
        root.display(),
        out.display()
    )));
    out
}

fn inventory(server_ip: &str, firmware: &str) -> String {
    let net = server_ip.rsplit_once('.').unwrap().0;
    format!(
        "cluster:
  name: boot
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{net}.50:6443
network:
  interfaces: [br0]
  subnet: {net}.0/24
  gateway: {server_ip}
  advertise: {server_ip}
boot:
  delivery: pull
nodes:
  - name: vm-1
    mac: {VM_MAC}
    role: controlplane
    address: {net}.50/24
    installDisk: /dev/vda
    firmware: {firmware}
"
    )
}

/// Put the Debian kernel and our initramfs into an artifact cache as the inventory's boot set.
fn images(work: &Path, vmlinuz: &Path, initramfs: &Path, schematic: &str) -> PathBuf {
    let images = work.join("images");
    let id = SetId {
        talos: "v1.13.9".into(),
        schematic: schematic.into(),
        arch: "amd64".into(),
    };
    let dir = images.join(id.rel_dir());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(vmlinuz, dir.join(Kind::Kernel.file_name())).unwrap();
    std::fs::copy(initramfs, dir.join(Kind::Initramfs.file_name())).unwrap();
    // The Talos-required arguments plus a serial console the test can read.
    std::fs::write(
        dir.join(Kind::Cmdline.file_name()),
        "talos.platform=metal console=ttyS0 slab_nomerge pti=on panic=-1\n",
    )
    .unwrap();
    let mut files = std::collections::BTreeMap::new();
    for kind in Kind::ALL {
        let (size, sha256) = hash_file(&dir.join(kind.file_name())).unwrap();
        files.insert(
            kind,
            FileRecord {
                size,
                sha256,
                compression: None,
                uki: None,
            },
        );
    }
    let mut c = Catalog::load(&images).unwrap();
    c.upsert(Entry {
        id,
        source: "test".into(),
        pulled_at: 0,
        files,
        origin: Default::default(),
    });
    c.save(&images).unwrap();
    images
}

/// One boot scenario: which inventory, on which bridge, for which machine.
struct Scenario {
    firmware: &'static str,
    /// The inventory file to serve.
    config: PathBuf,
    bridge: &'static str,
    server_cidr: &'static str,
    /// The VM's NIC, the node's boot MAC.
    mac: &'static str,
    node: &'static str,
    schematic: &'static str,
    /// Pull delivery: the kernel gets talos.config= and fetches its config.
    pull: bool,
    /// `serve --ipv6-ra`.
    ipv6_ra: bool,
}

/// One VM at a time: TCG needs both cores, and the tests of this file would otherwise boot
/// theirs in parallel.
static ONE_VM: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Boot a VM through talboot and check its console and talboot's events. Returns how long
/// iPXE took from its DHCP ACK to its script request (its IPv6 autoconfiguration wait).
fn boot(sc: &Scenario) -> Duration {
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    let (vmlinuz, e1000) = kernel_files(work);
    let initramfs = build_initramfs(work, &e1000);
    let images = images(work, &vmlinuz, &initramfs, sc.schematic);
    let mut lab = Lab::new(sc.firmware, sc.bridge, sc.server_cidr);
    let config = sc.config.clone();
    let configs = work.join("out");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(
        configs.join(format!("{}.yaml", sc.node)),
        format!(
            "version: v1alpha1\nmachine:\n  type: controlplane # {}\n",
            sc.node
        ),
    )
    .unwrap();
    let state = work.join("state");
    let talboot = lab
        .exec(env!("CARGO_BIN_EXE_talboot"))
        .args(["serve", "-c"])
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--images")
        .arg(&images)
        .arg("--configs")
        .arg(&configs)
        // Push delivery would also provision over the Talos API; there is no Talos here.
        // Everything else (the iPXE directory, the ports) is serve's default.
        .arg("--no-provision")
        .args(sc.ipv6_ra.then_some("--ipv6-ra"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(work.join("talboot.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    lab.children.push(talboot);
    std::thread::sleep(Duration::from_secs(1));
    let powered_on = Instant::now();

    let mut qemu = lab.exec("qemu-system-x86_64");
    qemu.args(["-accel", "tcg", "-M", "q35", "-m", "512", "-smp", "1"])
        .args([
            "-nographic",
            "-nodefaults",
            "-serial",
            "stdio",
            "-no-reboot",
        ])
        .args(["-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no"]);
    if sc.firmware == "uefi" {
        // No NIC ROM: OVMF's own PXE (its virtio-net driver) fetches ipxe.efi over TFTP.
        qemu.args([
            "-device",
            &format!(
                "virtio-net-pci,netdev=n0,mac={},bootindex=1,romfile=",
                sc.mac
            ),
        ]);
    } else {
        // SeaBIOS runs the iPXE ROM of Debian's ipxe-qemu package.
        qemu.args([
            "-device",
            &format!("e1000,netdev=n0,mac={},bootindex=1", sc.mac),
        ]);
    }
    if sc.firmware == "uefi" {
        let vars = work.join("OVMF_VARS.fd");
        std::fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars).unwrap();
        qemu.args([
            "-drive",
            "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
        ])
        .arg("-drive")
        .arg(format!(
            "if=pflash,format=raw,unit=1,file={}",
            vars.display()
        ));
    }
    let mut vm = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = vm.stdout.take().unwrap();
    lab.children.push(vm);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + VM_TIMEOUT;
    let mut console = Vec::new();
    let mut done = false;
    while Instant::now() < deadline && !done {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(line) => {
                done =
                    line.contains("TALBOOT-CONFIG-END") || line.contains("TALBOOT-CONFIG-FAILED");
                console.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let console = console.join("\n");
    let booted_after = powered_on.elapsed();
    let log = || std::fs::read_to_string(work.join("talboot.log")).unwrap_or_default();
    let cmdline = console
        .lines()
        .find_map(|l| {
            l.split_once("TALBOOT-CMDLINE: ")
                .map(|(_, c)| c.to_string())
        })
        .unwrap_or_else(|| {
            panic!(
                "the kernel never ran:\n{console}\n--- talboot log ---\n{}",
                log()
            )
        });
    eprintln!(
        "{} boot: power-on to the kernel's command line on the console took {:.1} s",
        sc.firmware,
        booted_after.as_secs_f64()
    );
    assert!(cmdline.contains("talos.platform=metal"), "{cmdline}");
    assert!(cmdline.contains("initrd=initramfs.xz"), "{cmdline}");
    let url = format!("talos.config=http://{}:8080/config/", lab.server_ip);
    if sc.pull {
        assert!(cmdline.contains(&url), "{cmdline}");
        let expected = format!(
            "TALBOOT-CONFIG-BEGIN\nversion: v1alpha1\nmachine:\n  type: controlplane # {}\nTALBOOT-CONFIG-END",
            sc.node
        );
        assert!(
            console.contains(&expected),
            "the initramfs did not get its config:\n{console}\n--- talboot log ---\n{}",
            log()
        );
    } else {
        // Push delivery: the config goes over the Talos API, never on the command line.
        assert!(!cmdline.contains("talos.config="), "{cmdline}");
    }

    // Stop talboot and read the machine's timeline.
    for c in &mut lab.children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }
    lab.children.clear();
    let store = talboot::store::open(&state).unwrap();
    use talboot::store::Store;
    let events = store.events(sc.node, 0, 100).unwrap();
    let kinds: Vec<String> = events.iter().map(|e| e.kind.clone()).collect();
    // iPXE's last DHCP ACK before its script request: in between it waits for IPv6
    // autoconfiguration (ipxe/ipxe src/net/ndp.c, 36a4c85).
    let script_at = events
        .iter()
        .find(|e| e.kind == "http.script")
        .map(|e| e.at_unix_ms);
    let ack_at = events
        .iter()
        .filter(|e| e.kind == "dhcp.ack" && script_at.is_some_and(|s| e.at_unix_ms <= s))
        .map(|e| e.at_unix_ms)
        .max();
    let mut expected = vec!["dhcp.ack", "http.script", "http.kernel", "http.initramfs"];
    if sc.firmware == "uefi" {
        // OVMF fetched Debian's (symlinked) ipxe.efi over TFTP.
        expected.push("tftp.file");
    }
    if sc.pull {
        expected.push("config.released");
    }
    for k in expected {
        assert!(
            kinds.iter().any(|x| x == k),
            "no {k} event for {}: {kinds:?}\n{}",
            sc.node,
            log()
        );
    }
    let wait = Duration::from_millis(script_at.unwrap() - ack_at.unwrap());
    eprintln!(
        "{} boot{}: iPXE's DHCP ACK to its script request took {:.1} s",
        sc.firmware,
        if sc.ipv6_ra { " with --ipv6-ra" } else { "" },
        wait.as_secs_f64()
    );
    wait
}

#[test]
fn bios_and_uefi_boot_through_talboot() {
    assert!(
        std::fs::read_link("/usr/lib/ipxe/ipxe.efi").is_ok(),
        "/usr/lib/ipxe/ipxe.efi is not the Debian 12 symlink to /boot/ipxe.efi; install the \
         ipxe package (scripts/test-deps)"
    );
    // One test runs both firmware variants in turn: TCG needs both cores to itself.
    let tmp = tempfile::tempdir().unwrap();
    let pull_inventory = tmp.path().join("talboot.yaml");
    std::fs::write(&pull_inventory, inventory("10.77.201.1", "bios")).unwrap();
    // Legacy BIOS, pull delivery: the kernel fetches its config through talos.config=.
    boot(&Scenario {
        firmware: "bios",
        config: pull_inventory,
        bridge: "br0",
        server_cidr: "10.77.201.1/24",
        mac: VM_MAC,
        node: "vm-1",
        schematic: talboot::inventory::VANILLA_SCHEMATIC,
        pull: true,
        ipv6_ra: false,
    });
    // UEFI, with the shipped lab inventory unchanged: k8s-ctrl-01's MAC on talboot's vmbr40.
    boot(&Scenario {
        firmware: "uefi",
        config: Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
        bridge: "vmbr40",
        server_cidr: "10.0.40.5/24",
        mac: "bc:24:11:40:00:01",
        node: "k8s-ctrl-01",
        schematic: "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515",
        pull: false,
        ipv6_ra: false,
    });
}

#[test]
fn ipv6_router_advertisements_end_ipxes_ipv6_wait() {
    // Debian's iPXE (2019) waits for IPv6 autoconfiguration until a router advertisement
    // arrives or its solicitation timer gives up (1/4 s doubling past 10 s: about 16 s;
    // src/net/ndp.c, src/net/retry.c). With serve's default flags there are no RAs; with
    // --ipv6-ra the first one ends the wait. TCG timing is noisy, the gap is not: 8 s apart.
    let tmp = tempfile::tempdir().unwrap();
    let inventory_file = tmp.path().join("talboot.yaml");
    std::fs::write(&inventory_file, inventory("10.77.202.1", "bios")).unwrap();
    let scenario = |ipv6_ra| Scenario {
        firmware: "bios",
        config: inventory_file.clone(),
        bridge: "br0",
        server_cidr: "10.77.202.1/24",
        mac: VM_MAC,
        node: "vm-1",
        schematic: talboot::inventory::VANILLA_SCHEMATIC,
        pull: true,
        ipv6_ra,
    };
    let without = boot(&scenario(false));
    let with = boot(&scenario(true));
    assert!(
        without > Duration::from_secs(8),
        "without RAs iPXE went on after {without:?}: did the IPv6 wait go away?"
    );
    assert!(
        with < Duration::from_secs(8),
        "with --ipv6-ra iPXE still waited {with:?}"
    );
}
