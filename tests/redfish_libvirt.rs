//! The real thing: talboot's Redfish driver powers on a QEMU VM behind OpenStack's
//! `sushy-emulator` (its libvirt driver) with a one-time network boot, and the VM then boots
//! through `talboot serve`: DHCP, the iPXE script over HTTP, kernel and initramfs; its serial
//! console shows the test kernel's marker. Then the driver powers it off.
//!
//! Layout: a network namespace with bridge `br0` (talboot's address on it); `virtlogd` and
//! `libvirtd` are started by this test inside that namespace (no systemd here), so the VM's tap
//! lands on `br0`; `sushy-emulator` in the root namespace reaches libvirtd over its unix
//! socket and listens on 127.0.0.1. The domain is diskless TCG (`type='qemu'`) with an e1000
//! NIC (SeaBIOS runs Debian's ipxe-qemu ROM for it) and `<boot dev='hd'/>`: only the Redfish
//! `Pxe` override makes it boot from the network. Everything (domain, daemons, emulator,
//! namespace) is removed on drop, also on failure.
//!
//! Needs root, the packages of scripts/test-deps' Redfish block (libvirt daemon + QEMU driver,
//! python3-libvirt, the sushy-tools venv), qemu-system-x86, ipxe-qemu, busybox-static, cpio and
//! the cached Debian kernel. TALBOOT_SKIP_SUSHY=1 skips it.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::netns::run;
use support::qemu::{self, KERNEL_MARKER};
use support::sushy::{Sushy, SushyOptions};
use talboot::inventory::Credential;
use talboot::power::redfish::{Redfish, RedfishConfig};
use talboot::power::{BootDevice, BootPersistence, PowerAction, PowerState};

const VM_MAC: &str = "52:54:00:7a:1b:31";
const BRIDGE: &str = "br0";
const SERVER: &str = "10.83.0.1";
/// TCG boots through iPXE take 15-30 s here; several times the slowest seen.
const BOOT_LIMIT: Duration = Duration::from_secs(240);

/// Owns everything the test starts; tears it down in reverse on drop.
struct Rig {
    ns: String,
    domain: String,
    domain_defined: bool,
    children: Vec<std::process::Child>,
}

impl Rig {
    fn exec(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }
}

fn virsh(args: &[&str]) -> std::process::Output {
    Command::new("virsh")
        .args(["-c", "qemu:///system"])
        .args(args)
        .output()
        .expect("virsh (libvirt-clients)")
}

impl Drop for Rig {
    fn drop(&mut self) {
        if self.domain_defined {
            let _ = virsh(&["destroy", &self.domain]);
            let _ = virsh(&["undefine", &self.domain]);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // libvirtd and virtlogd daemonized inside the namespace: end them by their pids
        // there (and any QEMU left), then the namespace.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-TERM", pid]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} not within {limit:?}:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn inventory(net: &str) -> String {
    format!(
        "cluster:
  name: rf
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{net}.50:6443
network:
  interfaces: [{BRIDGE}]
  subnet: {net}.0/24
  gateway: {SERVER}
  advertise: {SERVER}
boot:
  delivery: pull
nodes:
  - name: vm-1
    mac: {VM_MAC}
    role: controlplane
    address: {net}.50/24
    installDisk: /dev/vda
    firmware: bios
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_powers_on_a_libvirt_vm_with_a_one_time_network_boot_through_talboot() {
    if !support::sushy::available() {
        return;
    }
    for tool in ["virsh", "libvirtd", "virtlogd", "qemu-system-x86_64"] {
        support::netns::require_tool(tool, "SUSHY");
    }
    let tmp = tempfile::Builder::new()
        .prefix("tb-rf-libvirt-")
        .tempdir()
        .unwrap();
    let work = tmp.path().to_path_buf();
    let mut rig = Rig {
        ns: format!("tb-rfl-{}", std::process::id()),
        domain: format!("tb-rf-{}", std::process::id()),
        domain_defined: false,
        children: Vec::new(),
    };
    let _ = Command::new("ip").args(["netns", "del", &rig.ns]).status();
    run(Command::new("ip").args(["netns", "add", &rig.ns]));
    let ip = |args: &[&str]| run(Command::new("ip").args(["-n", &rig.ns]).args(args));
    ip(&["link", "set", "lo", "up"]);
    ip(&[
        "link",
        "add",
        BRIDGE,
        "type",
        "bridge",
        "stp_state",
        "0",
        "forward_delay",
        "0",
    ]);
    ip(&["addr", "add", &format!("{SERVER}/24"), "dev", BRIDGE]);
    ip(&["link", "set", BRIDGE, "up"]);

    // libvirt's daemons, inside the namespace. They exit silently without these directories.
    for d in [
        "/var/log/libvirt/qemu",
        "/var/lib/libvirt/qemu",
        "/run/libvirt",
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    run(rig.exec("virtlogd").arg("-d"));
    run(rig.exec("libvirtd").arg("-d"));
    wait_until(
        Duration::from_secs(30),
        "libvirtd answering",
        || virsh(&["list", "--all"]).status.success(),
        || String::from_utf8_lossy(&virsh(&["list"]).stderr).into_owned(),
    );

    // The boot artifacts and talboot serve in the namespace.
    let vmlinuz = qemu::vmlinuz(&work);
    let initramfs = qemu::marker_initramfs(&work);
    let net = SERVER.rsplit_once('.').unwrap().0;
    let config = work.join("talboot.yaml");
    std::fs::write(&config, inventory(net)).unwrap();
    let inv = talboot::inventory::load_with_env(&config, &std::collections::BTreeMap::new())
        .unwrap()
        .inventory;
    let images = qemu::images(
        &work,
        &vmlinuz,
        &initramfs,
        inv.cluster.installer.schematic_id(),
    );
    let configs = work.join("out");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(
        configs.join("vm-1.yaml"),
        "version: v1alpha1\nmachine:\n  type: controlplane\n",
    )
    .unwrap();
    let serve_log = work.join("talboot.log");
    let serve = qemu::die_with_parent(
        rig.exec(env!("CARGO_BIN_EXE_talboot"))
            .args(["serve", "-c"])
            .arg(&config)
            .arg("--state-dir")
            .arg(work.join("state"))
            .arg("--images")
            .arg(&images)
            .arg("--configs")
            .arg(&configs)
            .arg("--no-provision")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&serve_log).unwrap())),
    )
    .spawn()
    .unwrap();
    rig.children.push(serve);

    // The domain: diskless TCG, boots from "hd" unless Redfish overrides it.
    let console = work.join("console.log");
    let xml = format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <interface type='bridge'>
      <source bridge='{BRIDGE}'/>
      <mac address='{VM_MAC}'/>
      <model type='e1000'/>
    </interface>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
  </devices>
</domain>
",
        name = rig.domain,
        console = console.display()
    );
    let xml_path = work.join("domain.xml");
    std::fs::write(&xml_path, xml).unwrap();
    let out = virsh(&["define", xml_path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "virsh define: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    rig.domain_defined = true;

    // The BMC.
    let opts = SushyOptions {
        fake: false,
        libvirt_uri: Some("qemu:///system".into()),
        ..Default::default()
    };
    let bmc = Sushy::start(&work.join("sushy"), &opts);
    let mut cfg = RedfishConfig::new(
        &bmc.endpoint,
        &opts.user,
        Credential::new(opts.password.clone()),
    );
    // By name: sushy redirects to the domain's UUID URL (other domains may exist).
    cfg.system_id = Some(rig.domain.clone());
    let rf = Redfish::new(cfg).unwrap();
    assert_eq!(
        rf.power_state().await.unwrap(),
        PowerState::Off,
        "{}",
        bmc.log_text()
    );

    rf.set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    let dumped = String::from_utf8_lossy(&virsh(&["dumpxml", &rig.domain]).stdout).into_owned();
    assert!(
        dumped.contains("<boot order='1'/>"),
        "no network boot order in:\n{dumped}"
    );
    rf.set_power(PowerAction::On).await.unwrap();
    rf.wait_for(PowerState::On, Duration::from_secs(60))
        .await
        .unwrap();

    let logs = || {
        format!(
            "console:\n{}\ntalboot:\n{}\nsushy:\n{}",
            std::fs::read_to_string(&console).unwrap_or_default(),
            std::fs::read_to_string(&serve_log).unwrap_or_default(),
            bmc.log_text()
        )
    };
    let console_has = |needle: &str| {
        std::fs::read_to_string(&console)
            .unwrap_or_default()
            .contains(needle)
    };
    wait_until(
        BOOT_LIMIT,
        "the test kernel's marker on the console",
        || console_has(KERNEL_MARKER),
        logs,
    );
    let text = std::fs::read_to_string(&console).unwrap();
    let line = text.lines().find(|l| l.contains(KERNEL_MARKER)).unwrap();
    assert!(
        line.contains("talos.config=http://"),
        "booted without talboot's command line: {line}"
    );
    let served = std::fs::read_to_string(&serve_log).unwrap_or_default();
    assert!(
        served.to_lowercase().contains(&VM_MAC.to_lowercase()),
        "talboot never saw the VM:\n{served}"
    );

    // The marker kernel powers off by itself; ask for Off anyway (a no-op if already off).
    if let Err(e) = rf.set_power(PowerAction::Off).await {
        // The marker kernel can power off between the driver's state read and its ForceOff
        // (libvirt then answers 500 "domain is not running"): only a VM still on is a failure.
        assert_eq!(
            rf.power_state().await.unwrap(),
            PowerState::Off,
            "power off failed and the VM is still on: {e}"
        );
    }
    rf.wait_for(PowerState::Off, Duration::from_secs(60))
        .await
        .unwrap();
    let _ = Path::new(&work);
}
