//! Real firmware in QEMU (TCG) for boot tests: the guest's "Talos" (a Debian kernel and a
//! busybox initramfs that prints a marker and powers off), the artifact cache that serves
//! them as a boot set, and a VM runner that reads the serial console line by line.
//!
//! Every process started here gets `PR_SET_PDEATHSIG(SIGKILL)`, so a test thread that dies
//! (panic, timeout, a killed test binary) takes its QEMU, dnsmasq and talboot with it; the
//! namespace labs' `Drop` does the rest.
//!
//! Needs qemu-system-x86, ipxe-qemu, ovmf, busybox-static, cpio and a Debian kernel package in
//! /var/tmp/talboot-test (all installed by scripts/test-deps).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use talboot::artifacts::{Catalog, Entry, FileRecord, Kind, SetId, hash_file};

/// Where scripts/test-deps caches the Debian kernel package.
pub const KERNEL_CACHE: &str = "/var/tmp/talboot-test";
/// The initramfs prints this, then the kernel command line, on the serial console.
pub const KERNEL_MARKER: &str = "TALBOOT-GUEST-KERNEL:";

/// Make `cmd`'s process die with the thread that spawned it (SIGKILL on parent death).
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        cmd.pre_exec(|| {
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

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

/// Extract vmlinuz from the cached Debian kernel package into `work`.
pub fn vmlinuz(work: &Path) -> PathBuf {
    let deb = std::fs::read_dir(KERNEL_CACHE)
        .unwrap_or_else(|e| panic!("{KERNEL_CACHE}: {e}; run scripts/test-deps"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap_or_else(|| panic!("no kernel package in {KERNEL_CACHE}; run scripts/test-deps"));
    let dir = work.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    sh(&format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*'",
        deb.display(),
        dir.display()
    ));
    let found = sh(&format!(
        "find '{}' -name 'vmlinuz-*' | head -1",
        dir.display()
    ));
    PathBuf::from(found.trim())
}

/// A busybox initramfs whose /init prints [`KERNEL_MARKER`] and the command line, then
/// powers off: proof that the firmware fetched and started this kernel with this initramfs.
pub fn marker_initramfs(work: &Path) -> PathBuf {
    let root = work.join("initramfs");
    for d in ["bin", "proc"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static is installed");
    let init = format!(
        "#!/bin/busybox sh\n/bin/busybox mount -t proc proc /proc\n\
         echo \"{KERNEL_MARKER} $(/bin/busybox cat /proc/cmdline)\"\n/bin/busybox poweroff -f\n"
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

/// An artifact cache under `work` holding `vmlinuz` and `initramfs` as the amd64 boot set of
/// Talos v1.13.9 with `schematic`, with a serial console on the kernel command line.
pub fn images(work: &Path, vmlinuz: &Path, initramfs: &Path, schematic: &str) -> PathBuf {
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
    std::fs::write(
        dir.join(Kind::Cmdline.file_name()),
        "talos.platform=metal console=ttyS0 panic=-1\n",
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

/// Which firmware boots the VM, and from what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS with the iPXE option ROM QEMU ships for the NIC (ipxe-qemu).
    BiosIpxeRom,
    /// OVMF with the iPXE option ROM (its EFI driver).
    UefiIpxeRom,
    /// OVMF with no option ROM: OVMF's own virtio-net driver and PXE base code.
    UefiNativePxe,
}

impl Firmware {
    /// Short label for logs and namespace names.
    pub fn label(self) -> &'static str {
        match self {
            Self::BiosIpxeRom => "bios-ipxe",
            Self::UefiIpxeRom => "uefi-ipxe",
            Self::UefiNativePxe => "uefi-pxe",
        }
    }
}

/// A running VM: its process and the serial console, line by line.
pub struct Vm {
    /// The QEMU process (also kill it through the lab that owns the namespace).
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Every console line read so far.
    pub console: Vec<String>,
}

impl Vm {
    /// Start QEMU through `launcher` (e.g. `ip netns exec NS`), on the tap `tap`, with a
    /// virtio NIC `mac` booted by `fw`. `work` holds the UEFI variable store copy.
    pub fn start(launcher: Command, work: &Path, tap: &str, mac: &str, fw: Firmware) -> Vm {
        Self::start_with(launcher, work, tap, mac, fw, &[])
    }

    /// [`Vm::start`] with more QEMU arguments (a disk, say) after the NIC.
    pub fn start_with(
        mut launcher: Command,
        work: &Path,
        tap: &str,
        mac: &str,
        fw: Firmware,
        extra: &[&str],
    ) -> Vm {
        let qemu = &mut launcher;
        qemu.arg("qemu-system-x86_64")
            .args(["-accel", "tcg", "-M", "q35", "-m", "512", "-smp", "1"])
            .args([
                "-nographic",
                "-nodefaults",
                "-serial",
                "stdio",
                "-no-reboot",
            ])
            .args([
                "-netdev",
                &format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
            ]);
        // Debian's QEMU loads efi-virtio.rom from /usr/lib/ipxe/qemu (ipxe-qemu: iPXE
        // 1.0.0+git-20190125.36a4c85, legacy and EFI images in one ROM) for virtio-net-pci by
        // default; `romfile=` leaves the NIC without a ROM.
        let rom = if fw == Firmware::UefiNativePxe {
            ",romfile="
        } else {
            ""
        };
        qemu.args([
            "-device",
            &format!("virtio-net-pci,netdev=n0,mac={mac},bootindex=1{rom}"),
        ]);
        if fw != Firmware::BiosIpxeRom {
            let vars = work.join(format!("OVMF_VARS-{}.fd", fw.label()));
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
        qemu.args(extra);
        die_with_parent(qemu);
        let mut child = qemu
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start qemu: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Vm {
            child,
            lines,
            console: Vec::new(),
        }
    }

    /// Read the console until a line contains `needle` (true) or `limit` passes or QEMU
    /// exits (false).
    pub fn wait_for(&mut self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        if self.console.iter().any(|l| l.contains(needle)) {
            return true;
        }
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.console.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
        false
    }

    /// The console so far, one string.
    pub fn console_text(&self) -> String {
        self.console.join("\n")
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
