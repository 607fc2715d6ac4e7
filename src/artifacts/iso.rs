//! Reading a boot set out of a Talos ISO for `images import --iso`: which kernel, initramfs
//! and kernel command line the ISO's default boot entry uses, and copying those two files out.
//!
//! Layout (siderolabs/talos v1.13.9, `pkg/imager/iso/grub.go` and `grub.cfg`): the GRUB and
//! dual-boot ISOs carry `/boot/vmlinuz`, `/boot/initramfs.xz` and `/boot/grub/grub.cfg`, whose
//! first `menuentry` (`set default=0`) reads `linux /boot/vmlinuz <cmdline>` with the command
//! line escaped by `grub.Quote` (`internal/app/machined/pkg/runtime/v1alpha1/bootloader/grub/
//! quote.go`: a backslash before each of `\{}&$|;<>"`). The SecureBoot ISO (and the
//! sd-boot-only ISO) has no GRUB: `CreateUEFI` (`pkg/imager/iso/uefi.go`, v1.13.9 and
//! v1.14.0-rc.1) copies systemd-boot to `/EFI/BOOT/BOOTX64.EFI` (`BOOTAA64.EFI` on arm64) and
//! the UKI to `/EFI/Linux/Talos-<version>.efi` in the scratch tree that `xorrisofs` turns into
//! the ISO 9660 filesystem (and into the appended EFI partition), with `/loader/loader.conf`
//! and, for Secure Boot, `/EFI/keys/uki-signing-cert.der` and `/loader/keys/auto/*`. From such
//! an ISO the UKI is what is imported ([`Found::Uki`]); its PE says whether it is signed.
//!
//! Which entry and what it boots is the pure [`parse_grub_cfg`]; the ISO 9660 / Rock Ridge
//! filesystem itself is read by the real tool Talos builds its ISOs with, `xorriso`
//! (`osirrox` extraction), into a scratch folder beside the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the GRUB configuration sits on a Talos ISO.
pub(crate) const GRUB_CFG: &str = "/boot/grub/grub.cfg";

/// What the default GRUB entry boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootEntry {
    /// The entry's title (`Talos ISO`).
    pub title: String,
    /// Path of the kernel inside the ISO.
    pub kernel: String,
    /// Path of the initramfs inside the ISO.
    pub initramfs: String,
    /// The kernel command line, unescaped.
    pub cmdline: String,
}

/// Why a `grub.cfg` does not name a boot set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrubError {
    /// No `menuentry` at the default index.
    #[error("has no menu entry number {0} (its `set default`)")]
    NoEntry(usize),
    /// The entry has no `linux` line.
    #[error("entry `{0}` has no `linux` line")]
    NoLinux(String),
    /// The entry has no `initrd` line.
    #[error("entry `{0}` has no `initrd` line")]
    NoInitrd(String),
    /// The command line expands a GRUB variable, whose value is only known at boot.
    #[error("entry `{0}` builds its command line from GRUB variables (`$`)")]
    Variable(String),
    /// A quote is not closed.
    #[error("entry `{0}` has an unterminated quote on its `linux` line")]
    Quote(String),
}

/// Split a GRUB command's arguments into words, with GRUB's shell-like quoting (the GRUB
/// manual, "Shell-like scripting", as cited by Talos' `quote.go`): outside quotes a backslash
/// keeps the next character; `'...'` is literal; inside `"..."` a backslash escapes `"`, `\`
/// and `$`. `None` when a quote is unterminated, `Err(())` on an unescaped `$`.
fn grub_words(s: &str) -> Option<Result<Vec<String>, ()>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => cur.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\' | '$') => cur.push(c),
                            c => {
                                cur.push('\\');
                                cur.push(c);
                            }
                        },
                        '$' => return Some(Err(())),
                        c => cur.push(c),
                    }
                }
            }
            '$' => return Some(Err(())),
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Some(Ok(words))
}

/// The boot set of the default entry of a Talos ISO's `grub.cfg`.
pub(crate) fn parse_grub_cfg(text: &str) -> Result<BootEntry, GrubError> {
    let mut default = 0usize;
    // (title, linux line args, initrd path) per menu entry, in order.
    let mut entries: Vec<(String, Option<String>, Option<String>)> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("set default=") {
            default = rest.trim_matches('"').parse().unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("menuentry") {
            let title = rest
                .trim()
                .trim_end_matches('{')
                .trim()
                .trim_matches(['"', '\''])
                .to_string();
            entries.push((title, None, None));
            inside = true;
        } else if line == "}" {
            inside = false;
        } else if inside {
            let entry = entries.last_mut().expect("inside an entry");
            if let Some(rest) = line.strip_prefix("linux ") {
                entry.1 = Some(rest.trim().to_string());
            } else if let Some(rest) = line.strip_prefix("initrd ") {
                entry.2 = rest.split_whitespace().next().map(str::to_string);
            }
        }
    }
    let (title, linux, initrd) = entries
        .into_iter()
        .nth(default)
        .ok_or(GrubError::NoEntry(default))?;
    let linux = linux.ok_or_else(|| GrubError::NoLinux(title.clone()))?;
    let initramfs = initrd.ok_or_else(|| GrubError::NoInitrd(title.clone()))?;
    let words = match grub_words(&linux) {
        None => return Err(GrubError::Quote(title)),
        Some(Err(())) => return Err(GrubError::Variable(title)),
        Some(Ok(w)) => w,
    };
    let mut words = words.into_iter();
    let kernel = words
        .next()
        .ok_or_else(|| GrubError::NoLinux(title.clone()))?;
    Ok(BootEntry {
        title,
        kernel,
        initramfs,
        cmdline: words.collect::<Vec<_>>().join(" "),
    })
}

/// The Talos version an ISO names in its UKI's file name, `EFI/Linux/Talos-<version>.efi`
/// (v1.13.9 `pkg/imager/iso/uefi.go`, present on dual-boot and SecureBoot ISOs), from
/// `xorriso -find` output (one quoted path a line). `None` for a GRUB-only ISO, or when the
/// names disagree.
pub(crate) fn uki_version(find_output: &str) -> Option<String> {
    let mut versions = find_output.lines().filter_map(|l| {
        let name = l.trim().trim_matches('\'').rsplit('/').next()?;
        let v = name.strip_prefix("Talos-")?.strip_suffix(".efi")?;
        (!v.is_empty()).then(|| v.to_string())
    });
    let first = versions.next()?;
    versions.all(|v| v == first).then_some(first)
}

/// The UKI paths of `xorriso -find` output (one quoted path a line) named
/// `Talos-<version>.efi`, without repeats.
pub(crate) fn uki_paths(find_output: &str) -> Vec<String> {
    let mut paths: Vec<String> = find_output
        .lines()
        .map(|l| l.trim().trim_matches('\'').to_string())
        .filter(|p| {
            let name = p.rsplit('/').next().unwrap_or_default();
            name.starts_with("Talos-") && name.ends_with(".efi") && name.len() > 10
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// Why an ISO could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IsoError {
    /// `xorriso` is not installed.
    #[error("reading an ISO needs xorriso, which is not installed ({source}); install it (`apt install xorriso`), or mount {} and give --kernel, --initramfs and --cmdline-file", iso.display())]
    NoXorriso {
        /// The ISO.
        iso: PathBuf,
        /// Why it could not be started.
        source: std::io::Error,
    },
    /// xorriso could not read the file out of the ISO.
    #[error("cannot read {inside} from {}: {detail}; check that it is a Talos ISO (and that the stick is mounted)", iso.display())]
    Extract {
        /// The ISO.
        iso: PathBuf,
        /// The path inside the ISO.
        inside: String,
        /// xorriso's own complaint.
        detail: String,
    },
    /// Neither GRUB nor a UKI.
    #[error("{} has neither {GRUB_CFG} nor a UKI under /EFI/Linux (Talos-<version>.efi); check that it is a Talos ISO", iso.display())]
    NoBootSet {
        /// The ISO.
        iso: PathBuf,
    },
    /// Several UKIs, and nothing says which one boots.
    #[error("{} has several UKIs ({}); import the one you want from a mounted copy", iso.display(), paths.join(", "))]
    SeveralUkis {
        /// The ISO.
        iso: PathBuf,
        /// Their paths.
        paths: Vec<String>,
    },
    /// The GRUB configuration names no usable boot set.
    #[error("{GRUB_CFG} in {}: {source}; import the kernel, initramfs and cmdline with --kernel, --initramfs and --cmdline instead", iso.display())]
    Grub {
        /// The ISO.
        iso: PathBuf,
        /// What is wrong with it.
        source: GrubError,
    },
    /// The scratch folder could not be made.
    #[error("cannot make a scratch folder in {}: {source}", dir.display())]
    Scratch {
        /// Where.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What an ISO boots, copied out into a scratch folder that is removed when this is dropped.
#[derive(Debug)]
pub struct Extracted {
    _scratch: tempfile::TempDir,
    /// The files.
    pub found: Found,
    /// The Talos version the ISO's UKI is named for, if it has one ([`uki_version`]).
    pub version: Option<String>,
}

/// The boot set an ISO carries.
#[derive(Debug)]
pub enum Found {
    /// A GRUB (or dual-boot) ISO: its default entry's kernel and initramfs.
    Grub {
        /// The copied kernel.
        kernel: PathBuf,
        /// The copied initramfs.
        initramfs: PathBuf,
        /// What the entry boots.
        entry: BootEntry,
    },
    /// A systemd-boot ISO (Secure Boot): its UKI.
    Uki {
        /// The copied UKI.
        uki: PathBuf,
        /// Its path inside the ISO.
        inside: String,
    },
}

/// Copy `inside` (a path in the ISO) to `to` with xorriso.
fn xorriso_extract(iso: &Path, inside: &str, to: &Path) -> Result<bool, IsoError> {
    let out = Command::new("xorriso")
        .args(["-osirrox", "on", "-indev"])
        .arg(iso)
        .args(["-extract", inside])
        .arg(to)
        .output()
        .map_err(|source| IsoError::NoXorriso {
            iso: iso.to_path_buf(),
            source,
        })?;
    if out.status.success() && to.is_file() {
        return Ok(true);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No such file or directory") && stderr.contains(inside) {
        return Ok(false);
    }
    // xorriso explains itself in its FAILURE/SORRY lines; the rest is its banner.
    let detail = stderr
        .lines()
        .filter(|l| l.contains("FAILURE") || l.contains("SORRY"))
        .map(|l| l.trim_start_matches("xorriso : ").trim())
        .collect::<Vec<_>>()
        .join("; ");
    Err(IsoError::Extract {
        iso: iso.to_path_buf(),
        inside: inside.to_string(),
        detail: if detail.is_empty() {
            format!("xorriso exited with {}", out.status)
        } else {
            detail
        },
    })
}

/// Read the default boot entry of `iso` and copy its kernel and initramfs into a scratch
/// folder under `scratch_in` (the cache, so large files stay on its filesystem).
pub fn extract(iso: &Path, scratch_in: &Path) -> Result<Extracted, IsoError> {
    let scratch_err = |source| IsoError::Scratch {
        dir: scratch_in.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(scratch_in).map_err(scratch_err)?;
    let scratch = tempfile::Builder::new()
        .prefix(".iso-import-")
        .tempdir_in(scratch_in)
        .map_err(scratch_err)?;
    let cfg_path = scratch.path().join("grub.cfg");
    // A GRUB-only ISO has no /EFI/Linux: xorriso then fails, which only means no UKI.
    let find = Command::new("xorriso")
        .arg("-indev")
        .arg(iso)
        .args(["-find", "/EFI/Linux", "-name", "Talos-*.efi"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let version = uki_version(&find);
    if !xorriso_extract(iso, GRUB_CFG, &cfg_path)? {
        let found = extract_uki(iso, &uki_paths(&find), scratch.path())?;
        return Ok(Extracted {
            _scratch: scratch,
            found,
            version,
        });
    }
    let cfg = std::fs::read_to_string(&cfg_path).map_err(|e| IsoError::Extract {
        iso: iso.to_path_buf(),
        inside: GRUB_CFG.into(),
        detail: e.to_string(),
    })?;
    let entry = parse_grub_cfg(&cfg).map_err(|source| IsoError::Grub {
        iso: iso.to_path_buf(),
        source,
    })?;
    let kernel = scratch.path().join("kernel");
    let initramfs = scratch.path().join("initramfs");
    for (inside, to) in [(&entry.kernel, &kernel), (&entry.initramfs, &initramfs)] {
        if !xorriso_extract(iso, inside, to)? {
            return Err(IsoError::Extract {
                iso: iso.to_path_buf(),
                inside: inside.clone(),
                detail: format!("{GRUB_CFG} boots it but it is not on the ISO"),
            });
        }
    }
    tracing::debug!(iso = %iso.display(), kernel = %entry.kernel, initramfs = %entry.initramfs, ?version, "read the ISO's default boot entry");
    Ok(Extracted {
        _scratch: scratch,
        found: Found::Grub {
            kernel,
            initramfs,
            entry,
        },
        version,
    })
}

/// Copy the one UKI of a systemd-boot ISO (`paths`, from [`uki_paths`]) into `scratch`.
fn extract_uki(iso: &Path, paths: &[String], scratch: &Path) -> Result<Found, IsoError> {
    let inside = match paths {
        [one] => one.clone(),
        [] => {
            return Err(IsoError::NoBootSet {
                iso: iso.to_path_buf(),
            });
        }
        many => {
            return Err(IsoError::SeveralUkis {
                iso: iso.to_path_buf(),
                paths: many.to_vec(),
            });
        }
    };
    let uki = scratch.join("uki.efi");
    if !xorriso_extract(iso, &inside, &uki)? {
        return Err(IsoError::Extract {
            iso: iso.to_path_buf(),
            inside,
            detail: "xorriso lists it but cannot copy it".into(),
        });
    }
    tracing::debug!(iso = %iso.display(), uki = %inside, "read the ISO's UKI");
    Ok(Found::Uki { uki, inside })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Talos' `grub.Quote` (v1.13.9 `bootloader/grub/quote.go`): a backslash before each of
    /// `\{}&$|;<>"`, in that order (the backslash first, so it is not doubled twice).
    fn talos_quote(s: &str) -> String {
        let mut s = s.to_string();
        for c in ['\\', '{', '}', '&', '$', '|', ';', '<', '>', '"'] {
            s = s.replace(c, &format!("\\{c}"));
        }
        s
    }

    /// Talos v1.13.9 `pkg/imager/iso/grub.cfg` with `AddResetOption`.
    fn talos_grub_cfg(cmdline: &str) -> String {
        let q = talos_quote(cmdline);
        format!(
            "set default=0\nset timeout=3\n\ninsmod all_video\n\nterminal_input console\nterminal_output console\n\n\
             menuentry \"Talos ISO\" {{\n\tset gfxmode=auto\n\tset gfxpayload=text\n\tlinux /boot/vmlinuz {q}\n\tinitrd /boot/initramfs.xz\n}}\n\n\
             menuentry \"Reset Talos installation\" {{\n\tset gfxmode=auto\n\tset gfxpayload=text\n\tlinux /boot/vmlinuz {q} talos.experimental.wipe=system\n\tinitrd /boot/initramfs.xz\n}}\n"
        )
    }

    #[test]
    fn the_default_entry_of_a_talos_grub_cfg() {
        let cmdline = "talos.platform=metal console=ttyS0 init_on_alloc=1 slab_nomerge pti=on";
        let e = parse_grub_cfg(&talos_grub_cfg(cmdline)).unwrap();
        assert_eq!(
            e,
            BootEntry {
                title: "Talos ISO".into(),
                kernel: "/boot/vmlinuz".into(),
                initramfs: "/boot/initramfs.xz".into(),
                cmdline: cmdline.into(),
            }
        );
    }

    #[test]
    fn set_default_picks_the_entry() {
        let mut cfg = talos_grub_cfg("talos.platform=metal");
        cfg = cfg.replace("set default=0", "set default=1");
        let e = parse_grub_cfg(&cfg).unwrap();
        assert_eq!(e.title, "Reset Talos installation");
        assert_eq!(
            e.cmdline,
            "talos.platform=metal talos.experimental.wipe=system"
        );
        cfg = cfg.replace("set default=1", "set default=2");
        assert_eq!(parse_grub_cfg(&cfg), Err(GrubError::NoEntry(2)));
    }

    #[test]
    fn broken_entries_are_named() {
        let no_initrd = "menuentry \"x\" {\n linux /boot/vmlinuz a=b\n}\n";
        assert_eq!(
            parse_grub_cfg(no_initrd),
            Err(GrubError::NoInitrd("x".into()))
        );
        let no_linux = "menuentry \"x\" {\n initrd /boot/initramfs.xz\n}\n";
        assert_eq!(
            parse_grub_cfg(no_linux),
            Err(GrubError::NoLinux("x".into()))
        );
        let var = "menuentry \"x\" {\n linux /boot/vmlinuz $extra\n initrd /i\n}\n";
        assert_eq!(parse_grub_cfg(var), Err(GrubError::Variable("x".into())));
        let quote = "menuentry \"x\" {\n linux /boot/vmlinuz 'a\n initrd /i\n}\n";
        assert_eq!(parse_grub_cfg(quote), Err(GrubError::Quote("x".into())));
        assert_eq!(parse_grub_cfg(""), Err(GrubError::NoEntry(0)));
    }

    #[test]
    fn grub_quotes_and_escapes() {
        let cfg = "menuentry 'y' {\n linux /k a\\;b 'c d' \"e\\\"f\" g\\\\h\n initrd /i\n}\n";
        let e = parse_grub_cfg(cfg).unwrap();
        assert_eq!(e.cmdline, "a;b c d e\"f g\\h");
    }

    #[test]
    fn uki_paths_from_xorriso_find() {
        let out =
            "'/EFI/Linux/Talos-v1.13.9.efi'\n'/EFI/Linux/Talos-v1.13.9.efi'\n'/EFI/Linux/x.efi'\n";
        assert_eq!(uki_paths(out), ["/EFI/Linux/Talos-v1.13.9.efi"]);
        assert!(uki_paths("").is_empty());
    }

    #[test]
    fn the_version_comes_from_the_uki_name() {
        assert_eq!(
            uki_version("'/EFI/Linux/Talos-v1.13.9.efi'\n").as_deref(),
            Some("v1.13.9")
        );
        assert_eq!(uki_version(""), None);
        assert_eq!(uki_version("'/EFI/Linux/other.efi'\n"), None);
        assert_eq!(
            uki_version("'/EFI/Linux/Talos-v1.13.9.efi'\n'/EFI/Linux/Talos-v1.13.8.efi'\n"),
            None
        );
    }

    proptest! {
        /// Whatever command line Talos writes (printable words, no single quote, which
        /// Talos' Quote leaves unescaped and GRUB would take as a quote), the default entry
        /// gives it back unchanged.
        #[test]
        fn a_quoted_talos_cmdline_round_trips(words in prop::collection::vec("[!-&(-~]{1,12}", 1..12)) {
            let cmdline = words.join(" ");
            let e = parse_grub_cfg(&talos_grub_cfg(&cmdline)).unwrap();
            prop_assert_eq!(e.cmdline, cmdline);
        }
    }
}
