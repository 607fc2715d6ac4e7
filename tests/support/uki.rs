//! Real unified kernel images for tests, built the way a distribution without ukify does on
//! Debian 12: systemd's EFI stub (`systemd-boot-efi`), `objcopy` (binutils) appending
//! `.osrel`, `.cmdline`, `.pcrpkey`, `.initrd` and `.linux` each after the last section at the
//! next 4 KiB boundary, and `sbsign` (sbsigntool) with a key made by `openssl` or Debian's
//! snakeoil key (`ovmf`). Included with `#[path = "support/uki.rs"] mod uki;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// systemd's x86-64 EFI stub (Debian package systemd-boot-efi).
pub const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
/// systemd-boot itself, for ISO trees.
pub const SD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";
/// Debian's snakeoil key (encrypted, passphrase `snakeoil`) and certificate (package ovmf),
/// enrolled in `OVMF_VARS_4M.snakeoil.fd`.
pub const SNAKEOIL_KEY: &str = "/usr/share/ovmf/PkKek-1-snakeoil.key";
/// See [`SNAKEOIL_KEY`].
pub const SNAKEOIL_CERT: &str = "/usr/share/ovmf/PkKek-1-snakeoil.pem";

/// Fail loudly when a tool or file the UKI tests need is missing: always under `CI=true`,
/// and elsewhere unless `TALBOOT_SKIP_UKI` is set (then returns false and the caller skips).
pub fn require() -> bool {
    let tools = [
        "objcopy",
        "objdump",
        "sbsign",
        "sbverify",
        "openssl",
        "sha256sum",
    ];
    let mut missing: Vec<String> = tools
        .iter()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|t| t.to_string())
        .collect();
    for f in [STUB, SD_BOOT, SNAKEOIL_KEY, SNAKEOIL_CERT] {
        if !Path::new(f).exists() {
            missing.push(f.to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !ci && std::env::var_os("TALBOOT_SKIP_UKI").is_some() {
        eprintln!("missing {missing:?}; skipped (TALBOOT_SKIP_UKI is set)");
        return false;
    }
    panic!(
        "the UKI tests need {missing:?}: run scripts/test-deps (packages systemd-boot-efi, binutils, sbsigntool, ovmf, openssl)"
    );
}

/// Run a command, panicking with its stderr when it fails; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A signing key and certificate.
pub struct Key {
    /// The unencrypted private key (PEM).
    pub key: PathBuf,
    /// The certificate (PEM).
    pub cert: PathBuf,
}

impl Key {
    /// A new self-signed RSA key whose certificate's subject is `subject` (`/CN=.../O=...`).
    pub fn generate(dir: &Path, name: &str, subject: &str) -> Key {
        let key = dir.join(format!("{name}.key"));
        let cert = dir.join(format!("{name}.pem"));
        run(Command::new("openssl")
            .args([
                "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
            ])
            .arg("-subj")
            .arg(subject)
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert));
        Key { key, cert }
    }

    /// Debian's snakeoil key, decrypted into `dir` (sbsign takes no passphrase).
    pub fn snakeoil(dir: &Path) -> Key {
        let key = dir.join("snakeoil.key");
        run(Command::new("openssl")
            .args([
                "pkey",
                "-passin",
                "pass:snakeoil",
                "-in",
                SNAKEOIL_KEY,
                "-out",
            ])
            .arg(&key));
        Key {
            key,
            cert: PathBuf::from(SNAKEOIL_CERT),
        }
    }

    /// `openssl x509 -fingerprint -sha256` of the certificate: `AB:CD:...`.
    pub fn openssl_fingerprint(&self) -> String {
        let out = run(Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(&self.cert));
        out.trim()
            .split_once('=')
            .expect("Fingerprint=")
            .1
            .to_string()
    }
}

/// What goes into a test UKI.
pub struct Parts {
    /// `.osrel`'s VERSION_ID.
    pub version: String,
    /// `.cmdline`.
    pub cmdline: String,
    /// `.linux` and `.initrd` payload sizes (their bytes are a pattern: nothing boots them here).
    pub payload: usize,
}

impl Default for Parts {
    fn default() -> Self {
        Parts {
            version: "v1.13.9".into(),
            cmdline: "talos.platform=metal console=ttyS0".into(),
            payload: 200_000,
        }
    }
}

/// A built UKI and what went into it.
pub struct Built {
    /// The unsigned UKI.
    pub unsigned: PathBuf,
    /// The PEM public key in `.pcrpkey`.
    pub pcr_pem: PathBuf,
}

impl Built {
    /// `openssl pkey -pubin -outform DER | sha256sum` of `.pcrpkey`, in Talos's notation.
    pub fn pcr_fingerprint(&self) -> String {
        let out = run(Command::new("sh").arg("-c").arg(format!(
            "openssl pkey -pubin -in '{}' -outform DER | sha256sum",
            self.pcr_pem.display()
        )));
        let hex = out.split_whitespace().next().unwrap().to_ascii_uppercase();
        hex.as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Sign the UKI with `key` into `out`.
    pub fn sign(&self, key: &Key, out: &Path) -> PathBuf {
        run(Command::new("sbsign")
            .arg("--key")
            .arg(&key.key)
            .arg("--cert")
            .arg(&key.cert)
            .arg("--output")
            .arg(out)
            .arg(&self.unsigned));
        out.to_path_buf()
    }
}

/// The end of the stub's last section (VMA + size), from `objdump -h`.
fn stub_end() -> u64 {
    let out = run(Command::new("objdump").args(["-h", STUB]));
    let mut end = 0;
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 7 && f[0].parse::<u32>().is_ok() {
            let size = u64::from_str_radix(f[2], 16).unwrap();
            let vma = u64::from_str_radix(f[3], 16).unwrap();
            end = end.max(vma + size);
        }
    }
    assert!(end > 0, "no sections in {out}");
    end
}

/// Build an unsigned UKI in `dir` from the stub, with a fresh RSA `.pcrpkey`.
pub fn build(dir: &Path, parts: &Parts) -> Built {
    std::fs::create_dir_all(dir).unwrap();
    let pcr_key = dir.join("pcr.key");
    let pcr_pem = dir.join("pcr.pem");
    run(Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&pcr_key));
    run(Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&pcr_key)
        .arg("-out")
        .arg(&pcr_pem));
    let files: Vec<(&str, PathBuf, Vec<u8>)> = vec![
        (
            ".osrel",
            dir.join("os-release"),
            format!(
                "NAME=\"Talos\"\nID=talos\nVERSION_ID={}\nPRETTY_NAME=\"Talos ({})\"\n",
                parts.version, parts.version
            )
            .into_bytes(),
        ),
        (
            ".cmdline",
            dir.join("cmdline"),
            parts.cmdline.clone().into_bytes(),
        ),
        (
            ".pcrpkey",
            pcr_pem.clone(),
            std::fs::read(&pcr_pem).unwrap(),
        ),
        (
            ".initrd",
            dir.join("initrd"),
            (0..parts.payload).map(|i| (i % 241) as u8).collect(),
        ),
        (
            ".linux",
            dir.join("linux"),
            (0..parts.payload).map(|i| (i % 239) as u8).collect(),
        ),
    ];
    let mut objcopy = Command::new("objcopy");
    let mut at = stub_end();
    for (name, path, bytes) in &files {
        std::fs::write(path, bytes).unwrap();
        at = at.div_ceil(4096) * 4096;
        objcopy
            .arg("--add-section")
            .arg(format!("{name}={}", path.display()))
            .arg("--change-section-vma")
            .arg(format!("{name}=0x{at:x}"));
        at += bytes.len() as u64;
    }
    let unsigned = dir.join("uki.unsigned.efi");
    run(objcopy.arg(STUB).arg(&unsigned));
    Built { unsigned, pcr_pem }
}

/// `sbverify --list`'s subjects of the signing certificates (`/CN=.../O=...`).
pub fn sbverify_subjects(file: &Path) -> Vec<String> {
    let out = run(Command::new("sbverify").arg("--list").arg(file));
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("- subject:"))
        .map(|s| s.trim().to_string())
        .collect()
}

/// Whether `subject` (x509-parser's `CN=a, O=b`) has every part of an OpenSSL one-line
/// subject (`/CN=a/O=b`).
pub fn same_subject(ours: &str, openssl: &str) -> bool {
    let parts: Vec<&str> = openssl.split('/').filter(|p| !p.is_empty()).collect();
    !parts.is_empty() && parts.iter().all(|p| ours.split(", ").any(|o| o == *p))
}
