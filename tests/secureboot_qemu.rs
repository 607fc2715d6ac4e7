//! Secure Boot over the network on real firmware (issue 27 items 2 and 5): QEMU (TCG) with
//! Debian 12's OVMF boots through `talboot serve` in a network namespace, and OVMF, not
//! talboot, decides what runs.
//!
//! The "Talos" is a UKI built here from the Debian kernel and a busybox initramfs (systemd's
//! `linuxx64.efi.stub` with `.osrel`, `.cmdline`, `.linux` and `.initrd` added by objcopy, as
//! bookworm has no ukify), signed with sbsign. Its /init mounts efivarfs and prints the
//! firmware's `SecureBoot` variable on the serial console. The boot set in talboot's artifact
//! cache holds it as `Kind::SecureBootUki` (and a plain copy as `Kind::Uki`).
//!
//! - `OVMF_CODE_4M.secboot.fd` with a per-VM copy of `OVMF_VARS_4M.snakeoil.fd` (Debian's
//!   snakeoil PK/KEK/db enrolled, Secure Boot enforced): the snakeoil-signed UKI over UEFI
//!   HTTP Boot reaches the initramfs, which reads SecureBoot=1; the same UKI unsigned, or
//!   signed with another key, is refused by the firmware's network boot option ("Access
//!   Denied") after talboot served it whole, and the node never gets past `booting`.
//! - UEFI PXE (client arch 7) with Secure Boot on gets the signed UKI over talboot's TFTP and
//!   boots it.
//! - Plain `OVMF_CODE_4M.fd` (no keys): `boot.httpBoot: uki` hands the plain UKI over HTTP
//!   Boot to a node without `secureBoot`, which boots with SecureBoot=0.
//!
//! OVMF creates PXEv4, PXEv6, HTTPv4 and HTTPv6 boot options per NIC in that order; the HTTP
//! Boot cases switch PXE off through fw_cfg (`opt/org.tianocore/IPv4PXESupport` and
//! `IPv6PXESupport`, which tianocore/edk2 `OvmfPkg/Library/PxeBcPcdProducerLib/PxeBcPcd.c` at
//! edk2-stable202211 turns into `PcdIPv4PXESupport`/`PcdIPv6PXESupport`, checked by
//! `NetworkPkg/UefiPxeBcDxe/PxeBcDriver.c`) so HTTPv4 is tried first. Secure Boot applies to a
//! network boot because `SecurityPkg/Library/DxeImageVerificationLib` classes an image whose
//! device path has a MAC node as `IMAGE_FROM_REMOVABLE_MEDIA`, whose policy (0x04,
//! `SecurityPkg.dec`) is DENY_EXECUTE_ON_SECURITY_VIOLATION: `LoadImage` returns
//! EFI_ACCESS_DENIED, the "Access Denied" of BdsDxe's line, for PXE and HTTP Boot alike.
//!
//! Needs root (namespaces, tap), qemu-system-x86, ovmf, ipxe, systemd-boot-efi (the stub),
//! sbsigntool, binutils (objcopy, objdump), openssl, busybox-static, cpio and the Debian
//! kernel package in /var/tmp/talboot-test (all installed by scripts/test-deps). Without them
//! the test says what is missing and passes, except under CI=true, where it fails.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::qemu::{KERNEL_CACHE, die_with_parent, vmlinuz};
use talboot::artifacts::{Catalog, Entry, FileRecord, Kind, SetId, hash_file};

const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
const SNAKEOIL_KEY: &str = "/usr/share/ovmf/PkKek-1-snakeoil.key";
const SNAKEOIL_CERT: &str = "/usr/share/ovmf/PkKek-1-snakeoil.pem";
const CODE_SECBOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
const VARS_SNAKEOIL: &str = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd";
const CODE_PLAIN: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const VARS_PLAIN: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
const MAC: &str = "52:54:00:5b:00:01";
/// The lab's /24: talboot at .1, the node at .50.
const NET: &str = "10.77.211";
const NODE: &str = "sb-1";
/// The initramfs's first line, and the SecureBoot variable's value after it.
const UP: &str = "TALBOOT-INITRAMFS-UP";
const SB: &str = "TALBOOT-SECUREBOOT:";
/// A boot reaches the initramfs in ~15 s under TCG here and a refusal comes at ~9 s; four
/// times that, for a loaded machine.
const VM_TIMEOUT: Duration = Duration::from_secs(120);

fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap_or_else(|e| panic!("sh -c {script}: {e}"));
    assert!(
        out.status.success(),
        "sh -c {script} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What is missing to run this test (root, tools, files), if anything.
fn missing() -> Vec<String> {
    let mut out = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        out.push("root (network namespaces and a tap device)".into());
    }
    for tool in [
        "qemu-system-x86_64",
        "objcopy",
        "objdump",
        "sbsign",
        "sbverify",
        "openssl",
        "cpio",
        "ip",
    ] {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            out.push(format!("the `{tool}` command"));
        }
    }
    for file in [
        STUB,
        SNAKEOIL_KEY,
        SNAKEOIL_CERT,
        CODE_SECBOOT,
        VARS_SNAKEOIL,
        CODE_PLAIN,
        VARS_PLAIN,
        "/bin/busybox",
        "/usr/lib/ipxe/ipxe.efi",
    ] {
        if !Path::new(file).exists() {
            out.push(file.to_string());
        }
    }
    let kernel = std::fs::read_dir(KERNEL_CACHE).is_ok_and(|d| {
        d.filter_map(Result::ok)
            .any(|e| e.path().extension().is_some_and(|x| x == "deb"))
    });
    if !kernel {
        out.push(format!("a Debian kernel package in {KERNEL_CACHE}"));
    }
    out
}

/// The busybox initramfs: prints [`UP`], loads efivarfs (a signed module, so it loads under
/// the lockdown Secure Boot puts the kernel in), prints the SecureBoot variable's value (the
/// byte after its 4-byte attributes) and powers off.
fn initramfs(work: &Path) -> PathBuf {
    let root = work.join("initramfs");
    for d in ["bin", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    let deb = std::fs::read_dir(KERNEL_CACHE)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap();
    let modules = work.join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    sh(&format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards '*/efivarfs.ko*' && \
         cp \"$(find '{}' -name 'efivarfs.ko*' | head -1)\" '{}/efivarfs.ko'",
        deb.display(),
        modules.display(),
        modules.display(),
        root.display()
    ));
    let init = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
echo "{UP}"
mount -t proc proc /proc
mount -t sysfs sys /sys
grep -q efivarfs /proc/filesystems || insmod /efivarfs.ko
mount -t efivarfs efivarfs /sys/firmware/efi/efivars
set -- $(od -An -tu1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c)
echo "{SB} $5"
poweroff -f
"#
    );
    let p = root.join("init");
    std::fs::write(&p, init).unwrap();
    sh(&format!("chmod 755 '{}'", p.display()));
    let out = work.join("initramfs.cpio.gz");
    sh(&format!(
        "cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
        root.display(),
        out.display()
    ));
    out
}

/// A UKI: the stub with `.osrel`, `.cmdline`, `.linux` and `.initrd` appended, each at the
/// next 4 KiB boundary after the last section (what ukify does; bookworm has no ukify).
fn build_uki(work: &Path, kernel: &Path, initrd: &Path) -> PathBuf {
    let osrel = work.join("os-release");
    std::fs::write(
        &osrel,
        "ID=talboot-test\nPRETTY_NAME=\"talboot test UKI\"\n",
    )
    .unwrap();
    let cmdline = work.join("cmdline");
    std::fs::write(&cmdline, "console=ttyS0 panic=-1 quiet\n").unwrap();
    // objdump -h: "Idx Name Size VMA LMA File-off Algn"; the VMAs include the image base.
    let mut end = 0u64;
    for line in sh(&format!("objdump -h '{STUB}'")).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 7 && f[0].parse::<u32>().is_ok() {
            let size = u64::from_str_radix(f[2], 16).unwrap();
            let vma = u64::from_str_radix(f[3], 16).unwrap();
            end = end.max(vma + size);
        }
    }
    let align = |v: u64| v.div_ceil(4096) * 4096;
    let mut args = String::new();
    for (name, file) in [
        (".osrel", osrel.as_path()),
        (".cmdline", cmdline.as_path()),
        (".linux", kernel),
        (".initrd", initrd),
    ] {
        let at = align(end);
        args += &format!(
            " --add-section {name}='{}' --change-section-vma {name}={at:#x}",
            file.display()
        );
        end = at + std::fs::metadata(file).unwrap().len();
    }
    let out = work.join("uki-unsigned.efi");
    sh(&format!("objcopy{args} '{STUB}' '{}'", out.display()));
    out
}

/// `uki` signed with `key`/`cert` (sbsign warns about the gaps between sections; sbverify and
/// the firmware accept the image).
fn sign(work: &Path, uki: &Path, key: &Path, cert: &Path, name: &str) -> PathBuf {
    let out = work.join(name);
    sh(&format!(
        "sbsign --key '{}' --cert '{}' --output '{}' '{}' 2>&1",
        key.display(),
        cert.display(),
        out.display(),
        uki.display()
    ));
    sh(&format!(
        "sbverify --cert '{}' '{}' 2>&1",
        cert.display(),
        out.display()
    ));
    out
}

/// The UKIs of the cases: signed by the snakeoil key the VARS enrol, unsigned, and signed by
/// a key the firmware does not know.
struct Ukis {
    snakeoil: PathBuf,
    unsigned: PathBuf,
    other: PathBuf,
    kernel: PathBuf,
    initramfs: PathBuf,
}

fn ukis(work: &Path) -> Ukis {
    let kernel = vmlinuz(work);
    let initramfs = initramfs(work);
    let unsigned = build_uki(work, &kernel, &initramfs);
    // sbsign takes no passphrase: Debian's snakeoil key is encrypted with `snakeoil`.
    let key = work.join("snakeoil.key");
    sh(&format!(
        "openssl pkey -in '{SNAKEOIL_KEY}' -passin pass:snakeoil -out '{}'",
        key.display()
    ));
    let snakeoil = sign(
        work,
        &unsigned,
        &key,
        Path::new(SNAKEOIL_CERT),
        "uki-snakeoil.efi",
    );
    let (other_key, other_cert) = (work.join("other.key"), work.join("other.pem"));
    sh(&format!(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj '/CN=not enrolled' \
         -keyout '{}' -out '{}' 2>&1",
        other_key.display(),
        other_cert.display()
    ));
    let other = sign(work, &unsigned, &other_key, &other_cert, "uki-other.efi");
    Ukis {
        snakeoil,
        unsigned,
        other,
        kernel,
        initramfs,
    }
}

/// An artifact cache whose amd64 v1.13.9 vanilla set holds `secureboot` as its Secure Boot UKI
/// and `plain` as its plain UKI (with the kernel and initramfs the set always has).
fn images(work: &Path, u: &Ukis, secureboot: &Path, plain: &Path) -> PathBuf {
    let name = secureboot.file_stem().unwrap().to_string_lossy();
    let images = work.join(format!("images-{name}"));
    let id = SetId {
        talos: "v1.13.9".into(),
        schematic: talboot::inventory::VANILLA_SCHEMATIC.into(),
        arch: "amd64".into(),
    };
    let dir = images.join(id.rel_dir());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&u.kernel, dir.join(Kind::Kernel.file_name())).unwrap();
    std::fs::copy(&u.initramfs, dir.join(Kind::Initramfs.file_name())).unwrap();
    std::fs::write(
        dir.join(Kind::Cmdline.file_name()),
        "talos.platform=metal console=ttyS0\n",
    )
    .unwrap();
    std::fs::copy(secureboot, dir.join(Kind::SecureBootUki.file_name())).unwrap();
    std::fs::copy(plain, dir.join(Kind::Uki.file_name())).unwrap();
    let mut files = std::collections::BTreeMap::new();
    for kind in Kind::ALL
        .into_iter()
        .chain([Kind::Uki, Kind::SecureBootUki])
    {
        let path = dir.join(kind.file_name());
        let (size, sha256) = hash_file(&path).unwrap();
        // The UKIs carry what talboot's own reader says of them, as a pull or an import
        // records it (the firmware then decides whether that file boots).
        let uki = matches!(kind, Kind::Uki | Kind::SecureBootUki).then(|| {
            talboot::artifacts::UkiRecord {
                facts: talboot::artifacts::uki::inspect_file(&path).unwrap(),
                source: "test".into(),
                at: 0,
                origin: Default::default(),
            }
        });
        files.insert(
            kind,
            FileRecord {
                size,
                sha256,
                compression: None,
                uki,
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

/// The age key the cases' secrets bundles are encrypted to: push provisioning runs (and
/// records the node's phases), so the test can show where a refused node stopped.
struct AgeKey {
    secret: String,
    recipient: String,
}

fn age_key() -> AgeKey {
    use age::secrecy::ExposeSecret;
    let key = age::x25519::Identity::generate();
    AgeKey {
        secret: key.to_string().expose_secret().to_owned(),
        recipient: key.to_public().to_string(),
    }
}

fn inventory(net: &str, secure_boot: bool, http_boot: &str, age: &AgeKey) -> String {
    format!(
        "cluster:
  name: sb
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://{net}.50:6443
  secrets:
    file: secrets.age
    ageRecipients: [{}]
network:
  interfaces: [br0]
  subnet: {net}.0/24
  gateway: {net}.1
  advertise: {net}.1
boot:
  delivery: push
  httpBoot: {http_boot}
nodes:
  - name: {NODE}
    mac: {MAC}
    role: controlplane
    address: {net}.50/24
    installDisk: /dev/vda
    secureBoot: {secure_boot}
",
        age.recipient
    )
}

/// A network namespace with a bridge (talboot's side) and a tap for the VM; deleted on drop
/// together with every process still running in it.
struct Lab {
    ns: String,
    children: Vec<Child>,
}

impl Lab {
    fn new(tag: &str, server_cidr: &str) -> Self {
        let ns = format!("tb-sb{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        sh(&format!("ip netns add {ns}"));
        let lab = Lab {
            ns: ns.clone(),
            children: Vec::new(),
        };
        sh(&format!(
            "set -e; ip -n {ns} link set lo up; \
             ip -n {ns} link add br0 type bridge stp_state 0 forward_delay 0; \
             ip -n {ns} addr add {server_cidr} dev br0; \
             ip -n {ns} tuntap add dev tap0 mode tap; \
             ip -n {ns} link set tap0 master br0; ip -n {ns} link set tap0 up; \
             ip -n {ns} link set br0 up"
        ));
        lab
    }

    fn exec(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        die_with_parent(&mut c);
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

/// Which firmware and which network boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Boot {
    /// Secure Boot enforced (snakeoil keys), UEFI HTTP Boot (PXE options off).
    SecureHttp,
    /// Secure Boot enforced, UEFI PXE (OVMF's first boot option, client arch 7).
    SecurePxe,
    /// No Secure Boot (OVMF without keys), UEFI HTTP Boot.
    PlainHttp,
}

/// How a case ended on the console.
#[derive(Debug)]
enum Seen {
    /// The initramfs ran and printed the SecureBoot variable.
    Booted {
        secure_boot: String,
        /// From QEMU's start to the initramfs's first line.
        after: Duration,
    },
    /// The network boot option's own refusal line (not the EFI shell's later one).
    Refused { line: String, after: Duration },
}

struct Outcome {
    seen: Seen,
    /// The node's timeline: (kind, detail).
    events: Vec<(String, String)>,
    /// The serial console, then talboot's log (for failure messages).
    console: String,
}

/// One VM boot through a fresh `talboot serve` with `images`, until the initramfs reports
/// or the firmware refuses.
fn boot(tag: &str, work: &Path, images: &Path, (inv, age): (&str, &AgeKey), how: Boot) -> Outcome {
    let net = NET;
    let case = work.join(format!("case-{tag}"));
    std::fs::create_dir_all(&case).unwrap();
    let config = case.join("talboot.yaml");
    std::fs::write(&config, inv).unwrap();
    for args in [&["secrets", "init"][..], &["gen", "-o", "out"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
            .args(args)
            .arg("-c")
            .arg(&config)
            .env("SOPS_AGE_KEY", &age.secret)
            .env_remove("SOPS_AGE_KEY_FILE")
            .current_dir(&case)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "talboot {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut lab = Lab::new(tag, &format!("{net}.1/24"));
    let log = case.join("talboot.log");
    let talboot = lab
        .exec(env!("CARGO_BIN_EXE_talboot"))
        .args(["serve", "-c"])
        .arg(&config)
        .arg("--state-dir")
        .arg(case.join("state"))
        .arg("--images")
        .arg(images)
        .arg("--configs")
        .arg(case.join("out"))
        .env("SOPS_AGE_KEY", &age.secret)
        .env_remove("SOPS_AGE_KEY_FILE")
        .current_dir(&case)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    lab.children.push(talboot);
    std::thread::sleep(Duration::from_secs(1));

    let (code, vars_src) = match how {
        Boot::SecureHttp | Boot::SecurePxe => (CODE_SECBOOT, VARS_SNAKEOIL),
        Boot::PlainHttp => (CODE_PLAIN, VARS_PLAIN),
    };
    let vars = case.join("OVMF_VARS.fd");
    std::fs::copy(vars_src, &vars).unwrap();
    let mut qemu = lab.exec("qemu-system-x86_64");
    qemu.args(["-accel", "tcg", "-m", "512", "-smp", "1"])
        .args([
            "-nographic",
            "-nodefaults",
            "-serial",
            "stdio",
            "-no-reboot",
        ])
        .args(["-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no"])
        // No NIC ROM: OVMF's own network stack (PXE and HTTP Boot) boots.
        .args([
            "-device",
            &format!("virtio-net-pci,netdev=n0,mac={MAC},bootindex=1,romfile="),
        ])
        .arg("-drive")
        .arg(format!(
            "if=pflash,format=raw,unit=0,readonly=on,file={code}"
        ))
        .arg("-drive")
        .arg(format!(
            "if=pflash,format=raw,unit=1,file={}",
            vars.display()
        ));
    if how == Boot::PlainHttp {
        qemu.args(["-machine", "q35"]);
    } else {
        // The secboot build keeps its variables in SMM-protected flash.
        qemu.args(["-machine", "q35,smm=on"])
            .args(["-global", "driver=cfi.pflash01,property=secure,value=on"]);
    }
    if how != Boot::SecurePxe {
        qemu.args(["-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=no"])
            .args(["-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=no"]);
    }
    let started = Instant::now();
    let mut vm = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
    let (seen, console) = watch(&rx, started);
    let talboot_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let Some(seen) = seen else {
        panic!(
            "case {tag}: neither the initramfs nor a refusal within {VM_TIMEOUT:?}:\n{console}\n\
             --- talboot log ---\n{}",
            talboot_log()
        );
    };

    // Stop talboot and read the node's timeline.
    for c in &mut lab.children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }
    lab.children.clear();
    drop(lab);
    let store = talboot::store::open(&case.join("state")).unwrap();
    use talboot::store::Store;
    let events = store
        .events(NODE, 0, 500)
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.detail))
        .collect();
    Outcome {
        seen,
        events,
        console: format!("{console}\n--- talboot log ---\n{}", talboot_log()),
    }
}

/// Read the console until the initramfs reports the SecureBoot variable, or the network boot
/// option is refused. After a failed network boot OVMF tries its built-in EFI shell, which
/// Secure Boot refuses too ("Security Violation"): only the network option's own
/// `BdsDxe: failed to load Boot000N "UEFI HTTPv4 ..."`/`"UEFI PXEv4 ..."` line counts.
fn watch(rx: &mpsc::Receiver<String>, started: Instant) -> (Option<Seen>, String) {
    let deadline = started + VM_TIMEOUT;
    let mut console = Vec::new();
    let mut up = None;
    while Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        if line.contains(UP) && up.is_none() {
            up = Some(started.elapsed());
        }
        let seen = if let Some(v) = line.split_once(SB).map(|(_, v)| v.trim().to_string()) {
            Some(Seen::Booted {
                secure_boot: v,
                after: up.unwrap_or_else(|| started.elapsed()),
            })
        } else if line.contains("BdsDxe: failed to load Boot")
            && (line.contains("UEFI HTTPv4") || line.contains("UEFI PXEv4"))
        {
            Some(Seen::Refused {
                line: line.clone(),
                after: started.elapsed(),
            })
        } else {
            None
        };
        console.push(line);
        if seen.is_some() {
            return (seen, console.join("\n"));
        }
    }
    (None, console.join("\n"))
}

fn kinds(o: &Outcome) -> Vec<&str> {
    o.events.iter().map(|(k, _)| k.as_str()).collect()
}

fn assert_booted(tag: &str, o: &Outcome, want_sb: &str) -> Duration {
    match &o.seen {
        Seen::Booted { secure_boot, after } => {
            assert_eq!(secure_boot, want_sb, "case {tag}:\n{}", o.console);
            *after
        }
        Seen::Refused { line, .. } => panic!("case {tag}: refused: {line}\n{}", o.console),
    }
}

/// The firmware refused the image with "Access Denied" (its Secure Boot verdict), after
/// talboot had served the whole UKI; the node is booting and never reached maintenance.
fn assert_refused(tag: &str, o: &Outcome) -> Duration {
    let (line, after) = match &o.seen {
        Seen::Refused { line, after } => (line, *after),
        Seen::Booted { .. } => panic!("case {tag}: the firmware booted it:\n{}", o.console),
    };
    assert!(line.contains("Access Denied"), "case {tag}: {line}");
    assert!(
        !o.console.contains(UP),
        "case {tag}: the kernel ran:\n{}",
        o.console
    );
    let k = kinds(o);
    assert!(k.contains(&"boot.uki"), "case {tag}: {:?}", o.events);
    assert_phase_never_maintenance(tag, o);
    after
}

fn assert_phase_never_maintenance(tag: &str, o: &Outcome) {
    let phases: Vec<&str> = o
        .events
        .iter()
        .filter(|(k, _)| k == "node.phase")
        .map(|(_, d)| d.as_str())
        .collect();
    assert!(
        phases.iter().any(|d| d.contains("booting")),
        "case {tag}: no booting phase: {:?}",
        o.events
    );
    assert!(
        !phases.iter().any(|d| d.contains("maintenance")),
        "case {tag}: {phases:?}"
    );
}

#[test]
fn ovmf_secure_boot_accepts_only_the_enrolled_key_over_http_boot_and_pxe() {
    let missing = missing();
    if !missing.is_empty() {
        let msg = format!(
            "secureboot_qemu needs {}; run scripts/test-deps as root",
            missing.join(", ")
        );
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("skipped: {msg}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    let u = ukis(work);
    let age = age_key();
    let sb_inv = inventory(NET, true, "ipxe", &age);
    let mut report = Vec::new();

    // (a) The snakeoil-signed UKI over HTTP Boot, Secure Boot enforced: it runs, and the
    // firmware says SecureBoot=1.
    let images_ok = images(work, &u, &u.snakeoil, &u.unsigned);
    let o = boot("a", work, &images_ok, (&sb_inv, &age), Boot::SecureHttp);
    let t = assert_booted("a", &o, "1");
    assert!(kinds(&o).contains(&"boot.uki"), "{:?}", o.events);
    assert!(
        o.events
            .iter()
            .any(|(k, d)| k == "boot.uki" && d.contains("secureboot-uki.efi")),
        "{:?}",
        o.events
    );
    report.push(format!(
        "signed UKI over HTTP Boot, Secure Boot on: initramfs after {:.1} s",
        t.as_secs_f64()
    ));

    // (b) The same UKI unsigned and (c) signed by a key not in db: refused by the firmware.
    for (tag, uki) in [("b", &u.unsigned), ("c", &u.other)] {
        let images_bad = images(work, &u, uki, &u.unsigned);
        let o = boot(tag, work, &images_bad, (&sb_inv, &age), Boot::SecureHttp);
        let t = assert_refused(tag, &o);
        report.push(format!(
            "case {tag}: refused after {:.1} s: {}",
            t.as_secs_f64(),
            match &o.seen {
                Seen::Refused { line, .. } => line.trim(),
                Seen::Booted { .. } => "",
            }
        ));
    }

    // (e) UEFI PXE (arch 7) with Secure Boot on: the signed UKI over talboot's TFTP.
    let o = boot("e", work, &images_ok, (&sb_inv, &age), Boot::SecurePxe);
    let t = assert_booted("e", &o, "1");
    assert!(
        o.events
            .iter()
            .any(|(k, d)| k == "boot.uki" && d.contains("over TFTP")),
        "{:?}",
        o.events
    );
    report.push(format!(
        "signed UKI over PXE/TFTP, Secure Boot on: initramfs after {:.1} s",
        t.as_secs_f64()
    ));

    // (d) No Secure Boot: `boot.httpBoot: uki` gives a plain node the plain UKI over HTTP
    // Boot (here unsigned), and it boots with SecureBoot=0.
    let plain_inv = inventory(NET, false, "uki", &age);
    let o = boot("d", work, &images_ok, (&plain_inv, &age), Boot::PlainHttp);
    let t = assert_booted("d", &o, "0");
    assert!(
        o.events
            .iter()
            .any(|(k, d)| k == "boot.uki" && d.starts_with("uki.efi ")),
        "{:?}",
        o.events
    );
    report.push(format!(
        "plain UKI over HTTP Boot, no Secure Boot: initramfs after {:.1} s",
        t.as_secs_f64()
    ));
    for line in report {
        eprintln!("secureboot_qemu: {line}");
    }
}
