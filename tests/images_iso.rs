//! `talboot images import --iso`: a Talos-shaped ISO built by the test with the real
//! `xorriso` (the tool Talos' imager builds its ISOs with), laid out as siderolabs/talos
//! v1.13.9 `pkg/imager/iso/grub.go` lays out the GRUB and dual-boot ISOs, imported offline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// The command line Talos would put on the ISO, with characters `grub.Quote` must escape.
const CMDLINE: &str =
    "talos.platform=metal console=tty0 slab_nomerge pti=on talos.config=http://x/?a=1;b=2&c={d}";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Talos' `grub.Quote` (v1.13.9 `internal/app/machined/pkg/runtime/v1alpha1/bootloader/grub/
/// quote.go`).
fn talos_quote(s: &str) -> String {
    let mut s = s.to_string();
    for c in ['\\', '{', '}', '&', '$', '|', ';', '<', '>', '"'] {
        s = s.replace(c, &format!("\\{c}"));
    }
    s
}

/// Build an ISO of `tree` with xorriso (Rock Ridge and Joliet, ISO level 3 as Talos asks).
fn mkiso(tree: &Path, out: &Path) {
    let o = Command::new("xorriso")
        .args([
            "-as",
            "mkisofs",
            "-R",
            "-J",
            "-iso-level",
            "3",
            "-V",
            "TALOS",
            "-o",
        ])
        .arg(out)
        .arg(tree)
        .output()
        .expect("xorriso (scripts/test-deps installs it)");
    assert!(o.status.success(), "xorriso: {}", text(&o.stderr));
}

struct Site {
    tmp: tempfile::TempDir,
    iso: PathBuf,
    kernel: Vec<u8>,
    initramfs: Vec<u8>,
}

impl Site {
    /// A Talos metal ISO: GRUB's config with the default and the reset entries, the kernel,
    /// and a gzip initramfs under Talos' fixed name `initramfs.xz`.
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("boot/grub")).unwrap();
        let kernel: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(
            &mut gz,
            &(0..500_000u32).map(|i| (i % 89) as u8).collect::<Vec<_>>(),
        )
        .unwrap();
        let initramfs = gz.finish().unwrap();
        std::fs::write(tree.join("boot/vmlinuz"), &kernel).unwrap();
        std::fs::write(tree.join("boot/initramfs.xz"), &initramfs).unwrap();
        let q = talos_quote(CMDLINE);
        // v1.13.9 pkg/imager/iso/grub.cfg, rendered.
        let cfg = format!(
            "set default=0\nset timeout=3\n\ninsmod all_video\n\nterminal_input console\nterminal_output console\n\n\
             menuentry \"Talos ISO\" {{\n\tset gfxmode=auto\n\tset gfxpayload=text\n\tlinux /boot/vmlinuz {q}\n\tinitrd /boot/initramfs.xz\n}}\n\n\
             menuentry \"Reset Talos installation\" {{\n\tset gfxmode=auto\n\tset gfxpayload=text\n\tlinux /boot/vmlinuz {q} talos.experimental.wipe=system\n\tinitrd /boot/initramfs.xz\n}}\n"
        );
        std::fs::write(tree.join("boot/grub/grub.cfg"), cfg).unwrap();
        // The dual-boot ISO also carries the UKI tree; the import must ignore it.
        std::fs::create_dir_all(tree.join("EFI/Linux")).unwrap();
        std::fs::write(tree.join("EFI/Linux/Talos-v1.13.9.efi"), b"MZ uki").unwrap();
        let iso = tmp.path().join("usb").join("metal-amd64.iso");
        std::fs::create_dir_all(iso.parent().unwrap()).unwrap();
        mkiso(&tree, &iso);
        Self {
            tmp,
            iso,
            kernel,
            initramfs,
        }
    }

    fn images(&self) -> PathBuf {
        self.tmp.path().join("images")
    }

    fn talboot(&self, args: &[&str]) -> Output {
        // Every proxy at a port nothing listens on: the import must not need the network.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        Command::new(env!("CARGO_BIN_EXE_talboot"))
            .arg("images")
            .arg("--dir")
            .arg(self.images())
            .args(args)
            .env("HTTP_PROXY", &proxy)
            .env("HTTPS_PROXY", &proxy)
            .env("ALL_PROXY", &proxy)
            .output()
            .unwrap()
    }

    fn import(&self, iso: &Path, extra: &[&str]) -> Output {
        let mut args = vec![
            "import",
            "--talos",
            "v1.13.9",
            "--schematic",
            SCHEMATIC,
            "--arch",
            "amd64",
            "--iso",
            iso.to_str().unwrap(),
        ];
        args.extend(extra);
        self.talboot(&args)
    }

    fn set_dir(&self) -> PathBuf {
        self.images().join("v1.13.9").join(SCHEMATIC).join("amd64")
    }
}

#[test]
fn a_talos_iso_is_imported_from_its_default_grub_entry() {
    let s = Site::new();
    let out = s.import(&s.iso, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("entry `Talos ISO` boots /boot/vmlinuz with /boot/initramfs.xz"),
        "{stdout}"
    );
    assert!(stdout.contains("imported Talos v1.13.9 amd64"), "{stdout}");
    assert!(stdout.contains("(gzip)"), "{stdout}");
    assert_eq!(std::fs::read(s.set_dir().join("kernel")).unwrap(), s.kernel);
    assert_eq!(
        std::fs::read(s.set_dir().join("initramfs.xz")).unwrap(),
        s.initramfs
    );
    // The default entry's line, unescaped; not the reset entry's.
    assert_eq!(
        std::fs::read_to_string(s.set_dir().join("cmdline")).unwrap(),
        format!("{CMDLINE}\n")
    );
    // The scratch copies are gone.
    let leftovers: Vec<_> = std::fs::read_dir(s.images())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".iso-import"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let listed = text(&s.talboot(&["list"]).stdout);
    assert!(
        listed.contains(&format!(
            "from ISO {} (/boot/vmlinuz, /boot/initramfs.xz, /boot/grub/grub.cfg)",
            s.iso.display()
        )),
        "{listed}"
    );
    let out = s.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    // The same ISO again: nothing to do.
    let out = s.import(&s.iso, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("nothing to do"),
        "{}",
        text(&out.stdout)
    );

    // Damage on the cache: verify names the ISO import that repairs it, and that command works.
    std::fs::write(s.set_dir().join("kernel"), b"short").unwrap();
    let out = s.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("--iso {} --force", s.iso.display())),
        "{said}"
    );
    let out = s.import(&s.iso, &["--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(s.set_dir().join("kernel")).unwrap(), s.kernel);
}

#[test]
fn isos_without_a_usable_grub_entry_are_refused_and_nothing_is_written() {
    let s = Site::new();
    // A SecureBoot ISO: systemd-boot and a UKI, no GRUB (v1.13.9 pkg/imager/iso/uefi.go).
    let tree = s.tmp.path().join("sb");
    std::fs::create_dir_all(tree.join("EFI/Linux")).unwrap();
    std::fs::create_dir_all(tree.join("EFI/BOOT")).unwrap();
    std::fs::create_dir_all(tree.join("loader")).unwrap();
    std::fs::write(tree.join("EFI/Linux/Talos-v1.13.9.efi"), b"MZ uki").unwrap();
    std::fs::write(tree.join("EFI/BOOT/BOOTX64.EFI"), b"MZ sd-boot").unwrap();
    std::fs::write(tree.join("loader/loader.conf"), "timeout 10\n").unwrap();
    let sb = s.tmp.path().join("secureboot.iso");
    mkiso(&tree, &sb);
    let out = s.import(&sb, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains(&sb.display().to_string()) && err.contains("SecureBoot"),
        "{err}"
    );

    // A GRUB config whose kernel is not on the ISO.
    let tree = s.tmp.path().join("broken");
    std::fs::create_dir_all(tree.join("boot/grub")).unwrap();
    std::fs::write(
        tree.join("boot/grub/grub.cfg"),
        "menuentry \"Talos ISO\" {\n\tlinux /boot/vmlinuz talos.platform=metal\n\tinitrd /boot/initramfs.xz\n}\n",
    )
    .unwrap();
    std::fs::write(tree.join("boot/initramfs.xz"), &s.initramfs).unwrap();
    let broken = s.tmp.path().join("broken.iso");
    mkiso(&tree, &broken);
    let out = s.import(&broken, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cannot read /boot/vmlinuz from"), "{err}");

    // Not an ISO at all.
    let out = s.import(&s.set_dir().with_file_name("nope.iso"), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("check that it is a Talos ISO"),
        "{}",
        text(&out.stderr)
    );

    assert!(!s.set_dir().exists(), "a refused import wrote nothing");
}

#[test]
fn an_iso_of_another_talos_version_is_refused() {
    let s = Site::new();
    // The dual-boot ISO's UKI says v1.13.9; the operator claims v1.13.8.
    let out = s.talboot(&[
        "import",
        "--talos",
        "v1.13.8",
        "--schematic",
        SCHEMATIC,
        "--arch",
        "amd64",
        "--iso",
        s.iso.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("is Talos v1.13.9") && err.contains("--talos v1.13.9"),
        "{err}"
    );
    assert!(!s.images().join("v1.13.8").exists());
}

#[test]
fn iso_and_file_flags_do_not_mix() {
    let s = Site::new();
    let out = s.import(&s.iso, &["--kernel", "/dev/null"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot be used with"),
        "{}",
        text(&out.stderr)
    );
}
