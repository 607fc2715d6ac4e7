//! `talboot images import --iso`: a Talos-shaped ISO built by the test with the real
//! `xorriso` (the tool Talos' imager builds its ISOs with), laid out as siderolabs/talos
//! v1.13.9 `pkg/imager/iso/grub.go` lays out the GRUB and dual-boot ISOs, imported offline.

#[path = "support/uki.rs"]
mod uki;

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
    // A systemd-boot ISO whose "UKI" is not a PE file (v1.13.9 pkg/imager/iso/uefi.go layout).
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
        err.contains(&sb.display().to_string())
            && err.contains("/EFI/Linux/Talos-v1.13.9.efi")
            && err.contains("is not a PE/COFF image"),
        "{err}"
    );
    // Neither GRUB nor a UKI.
    let tree = s.tmp.path().join("empty");
    std::fs::create_dir_all(tree.join("EFI/BOOT")).unwrap();
    std::fs::write(tree.join("EFI/BOOT/BOOTX64.EFI"), b"MZ sd-boot").unwrap();
    let empty = s.tmp.path().join("empty.iso");
    mkiso(&tree, &empty);
    let out = s.import(&empty, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("has neither /boot/grub/grub.cfg nor a UKI"),
        "{}",
        text(&out.stderr)
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

/// A Talos Secure Boot ISO's tree (siderolabs/talos v1.13.9 and v1.14.0-rc.1
/// `pkg/imager/iso/uefi.go` `CreateUEFI`): systemd-boot as the removable-media loader, the UKI
/// as `EFI/Linux/Talos-<version>.efi`, `loader/loader.conf`, the signing certificate in
/// `EFI/keys/uki-signing-cert.der` and the auto-enrolment keys under `loader/keys/auto`.
fn secureboot_iso(s: &Site, name: &str, uki_file: &Path, version: &str) -> PathBuf {
    let tree = s.tmp.path().join(name);
    for d in ["EFI/BOOT", "EFI/Linux", "EFI/keys", "loader/keys/auto"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::copy(uki::SD_BOOT, tree.join("EFI/BOOT/BOOTX64.EFI")).unwrap();
    std::fs::copy(
        uki_file,
        tree.join(format!("EFI/Linux/Talos-{version}.efi")),
    )
    .unwrap();
    std::fs::write(
        tree.join("loader/loader.conf"),
        "timeout 10\nsecure-boot-enroll if-safe\n",
    )
    .unwrap();
    std::fs::write(tree.join("loader/random-seed"), [0u8; 32]).unwrap();
    std::fs::write(tree.join("EFI/keys/uki-signing-cert.der"), b"der").unwrap();
    for k in ["PK.auth", "KEK.auth", "db.auth"] {
        std::fs::write(tree.join("loader/keys/auto").join(k), b"auth").unwrap();
    }
    let iso = s.tmp.path().join(format!("{name}.iso"));
    mkiso(&tree, &iso);
    iso
}

#[test]
fn a_secure_boot_iso_gives_its_signed_uki() {
    if !uki::require() {
        return;
    }
    let s = Site::new();
    let built = uki::build(&s.tmp.path().join("uki"), &uki::Parts::default());
    let key = uki::Key::generate(s.tmp.path(), "talos", "/CN=Talos UKI Signing Key/O=test");
    let signed = built.sign(&key, &s.tmp.path().join("signed.efi"));
    let iso = secureboot_iso(&s, "secureboot", &signed, "v1.13.9");

    let out = s.import(&iso, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(
            "/EFI/Linux/Talos-v1.13.9.efi is a signed UKI, imported as secureboot-uki.efi"
        ),
        "{stdout}"
    );
    assert!(stdout.contains(&key.openssl_fingerprint()), "{stdout}");
    assert_eq!(
        std::fs::read(s.set_dir().join("secureboot-uki.efi")).unwrap(),
        std::fs::read(&signed).unwrap()
    );
    // A set with only the UKI: no kernel, initramfs or command line were made up.
    assert!(!s.set_dir().join("kernel").exists());

    let listed = text(&s.talboot(&["list"]).stdout);
    assert!(listed.contains("secureboot-uki"), "{listed}");
    assert!(
        listed.contains(&format!("certificate sha256 {}", key.openssl_fingerprint())),
        "{listed}"
    );
    assert!(
        listed.contains("signed by CN=Talos UKI Signing Key"),
        "{listed}"
    );
    assert!(
        listed.contains(&format!(".pcrpkey sha256 {}", built.pcr_fingerprint())),
        "{listed}"
    );
    assert!(
        listed.contains(&format!(
            "from ISO {} (/EFI/Linux/Talos-v1.13.9.efi)",
            iso.display()
        )),
        "{listed}"
    );
    let out = s.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("boots: secureboot-uki"),
        "{}",
        text(&out.stdout)
    );
    let catalog = talboot::artifacts::Catalog::load(&s.images()).unwrap();
    let entry = &catalog.entries[0];
    let facts = entry
        .uki_facts(talboot::artifacts::Kind::SecureBootUki)
        .unwrap();
    assert_eq!(
        facts.pcr_key_fingerprint.as_deref(),
        Some(built.pcr_fingerprint().as_str())
    );

    // The GRUB ISO of the same version adds the PXE files; the UKI stays, with its origin.
    let out = s.import(&s.iso, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = s.talboot(&["verify"]);
    assert!(
        text(&out.stdout).contains("boots: pxe, secureboot-uki"),
        "{}",
        text(&out.stdout)
    );

    // Damage on the UKI: verify names the import of its ISO.
    std::fs::write(s.set_dir().join("secureboot-uki.efi"), b"MZ").unwrap();
    let out = s.talboot(&["verify"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains(&format!("--iso {} --force", iso.display())),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn unsigned_and_mislabelled_ukis_from_isos() {
    if !uki::require() {
        return;
    }
    let s = Site::new();
    let built = uki::build(&s.tmp.path().join("uki"), &uki::Parts::default());
    // The sd-boot ISO without Secure Boot: the unsigned UKI goes into the plain slot.
    let iso = secureboot_iso(&s, "sdboot", &built.unsigned, "v1.13.9");
    let out = s.import(&iso, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("an unsigned UKI, imported as uki.efi"),
        "{}",
        text(&out.stdout)
    );
    assert!(s.set_dir().join("uki.efi").exists());
    assert!(!s.set_dir().join("secureboot-uki.efi").exists());

    // A UKI whose .osrel says another version than its file name and the operator.
    let other = uki::build(
        &s.tmp.path().join("other"),
        &uki::Parts {
            version: "v1.13.8".into(),
            ..Default::default()
        },
    );
    let iso = secureboot_iso(&s, "mislabelled", &other.unsigned, "v1.13.9");
    let out = s.import(&iso, &["--force"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(.osrel VERSION_ID) it is Talos v1.13.8"),
        "{}",
        text(&out.stderr)
    );
}
