//! The first-stage iPXE binaries: the fixed set of file names talboot ever hands to firmware
//! (`undionly.kpxe`, `ipxe.efi`, `snponly.efi`, `ipxe-arm64.efi`), which of them an inventory
//! needs, and the set loaded once at start and served by name over TFTP and (for UEFI HTTP
//! boot) HTTP.
//!
//! Why loaded once rather than looked up per request: on Debian 12 `/usr/lib/ipxe/ipxe.efi`
//! is a symlink to `/boot/ipxe.efi`, both owned by the `ipxe` package (`dpkg -L ipxe`), so a
//! TFTP root confined to `/usr/lib/ipxe` refuses the very file UEFI PXE needs. The names are a
//! fixed, known set, so each one is resolved when `serve` starts (following whatever symlinks
//! the operator or the package put there, as root and before any privilege drop) and its bytes
//! kept; a client-supplied name is only ever looked up in that set, so no request path ever
//! reaches the filesystem. A binary the inventory needs that cannot be read stops `serve`,
//! naming the file. Restart `serve` after upgrading the `ipxe` package.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::inventory::{Arch, Firmware, Inventory, UnknownPolicy};

/// iPXE for legacy BIOS PXE ROMs (chains through the ROM's UNDI stack).
pub const BIOS: &str = "undionly.kpxe";
/// iPXE for x86-64 UEFI, with its own NIC drivers.
pub(crate) const UEFI_X64: &str = "ipxe.efi";
/// iPXE for x86-64 UEFI using the firmware's SNP driver.
pub(crate) const UEFI_X64_SNP: &str = "snponly.efi";
/// iPXE for arm64 UEFI (not in Debian's `ipxe` package; build it or copy it in).
pub(crate) const UEFI_ARM64: &str = "ipxe-arm64.efi";

/// Every name talboot serves; any other requested name is refused.
pub(crate) const KNOWN: [&str; 4] = [BIOS, UEFI_X64, UEFI_X64_SNP, UEFI_ARM64];

/// The EFI binary for an architecture.
pub(crate) fn efi_for(arch: Arch) -> &'static str {
    match arch {
        Arch::Amd64 => UEFI_X64,
        Arch::Arm64 => UEFI_ARM64,
    }
}

/// How the first stage reaches machines: TFTP (PXE firmware) and/or HTTP (UEFI HTTP boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// TFTP runs: every binary a PXE or HTTP-boot machine of the inventory may ask for.
    TftpAndHttp,
    /// `--no-tftp`: only what UEFI HTTP boot fetches over HTTP.
    HttpOnly,
}

fn for_hint(firmware: Option<Firmware>, arch: Arch, out: &mut BTreeSet<&'static str>) {
    match firmware {
        Some(Firmware::Bios) => {
            out.insert(BIOS);
        }
        // `http` nodes may fall back to PXE (EDK2's boot manager tries PXE and HTTP boot
        // options in turn); both fetch the same EFI binary.
        Some(Firmware::Uefi | Firmware::Http) => {
            out.insert(efi_for(arch));
        }
        // No hint: whatever the firmware turns out to be. BIOS exists only on x86.
        None => {
            out.insert(efi_for(arch));
            if arch == Arch::Amd64 {
                out.insert(BIOS);
            }
        }
    }
}

/// The binaries the inventory's machines need, from each node's firmware hint and
/// architecture (and the default architecture when unknown machines are booted too).
pub fn needed(inv: &Inventory, transport: Transport) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    match transport {
        // A Secure Boot node is never offered iPXE (it is unsigned): it needs none.
        Transport::TftpAndHttp => {
            for n in inv.nodes.iter().filter(|n| !n.secure_boot()) {
                for_hint(n.firmware, inv.arch_of(n), &mut out);
            }
            if inv.boot.unknown_machines == UnknownPolicy::Discover {
                for_hint(None, inv.boot.default_arch, &mut out);
            }
        }
        Transport::HttpOnly => {
            for n in &inv.nodes {
                if n.firmware == Some(Firmware::Http) && !n.secure_boot() {
                    out.insert(efi_for(inv.arch_of(n)));
                }
            }
        }
    }
    out
}

/// A binary the inventory needs that cannot be served.
#[derive(Debug, thiserror::Error)]
#[error(
    "iPXE binary {} cannot be served: {cause}; {needed_by}. Install Debian's `ipxe` package \
     (it provides undionly.kpxe, ipxe.efi and snponly.efi in /usr/lib/ipxe), put the file \
     there, or point --ipxe-dir at a directory that has it",
    .path.display()
)]
pub struct Unservable {
    /// The file, as `<ipxe dir>/<name>`.
    pub path: PathBuf,
    /// Why (not found, dangling symlink and its target, not a regular file, unreadable).
    pub cause: Unreadable,
    /// Which machines need it.
    pub(crate) needed_by: String,
}

/// The first-stage binaries as loaded at start: name to contents.
#[derive(Debug, Clone, Default)]
pub struct FirstStage {
    files: BTreeMap<&'static str, Bytes>,
    dir: PathBuf,
}

/// Why a first-stage binary could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    /// Not found or unreadable.
    #[error("{0}")]
    Io(std::io::Error),
    /// Not found or unreadable through a symlink (typically a dangling one).
    #[error("{source} (it is a symlink to {})", .target.display())]
    ViaLink {
        /// What reading it said.
        source: std::io::Error,
        /// Where the link points.
        target: PathBuf,
    },
    /// A directory or a device, say.
    #[error("not a regular file")]
    NotAFile,
}

fn read_one(path: &Path) -> Result<Bytes, Unreadable> {
    let describe = |source: std::io::Error| match std::fs::read_link(path) {
        Ok(target) => Unreadable::ViaLink { source, target },
        Err(_) => Unreadable::Io(source),
    };
    // metadata() and read() follow symlinks: the operator's (and the package's) own links
    // are theirs to make.
    let meta = std::fs::metadata(path).map_err(describe)?;
    if !meta.is_file() {
        return Err(Unreadable::NotAFile);
    }
    std::fs::read(path).map(Bytes::from).map_err(describe)
}

impl FirstStage {
    /// Loads every known binary present in `dir`; fails, naming the file, when one of
    /// `needed` cannot be read. Binaries not needed and absent are simply not served.
    pub fn load(dir: &Path, needed: &BTreeSet<&'static str>) -> Result<Self, Unservable> {
        let mut files = BTreeMap::new();
        for name in KNOWN {
            let path = dir.join(name);
            match read_one(&path) {
                Ok(bytes) => {
                    tracing::debug!(file = %path.display(), bytes = bytes.len(), "iPXE binary loaded");
                    files.insert(name, bytes);
                }
                Err(cause) if needed.contains(name) => {
                    return Err(Unservable {
                        path,
                        cause,
                        needed_by: needed_by(name),
                    });
                }
                Err(cause) => {
                    tracing::debug!(file = %path.display(), %cause, "iPXE binary not served (no machine needs it)");
                }
            }
        }
        Ok(FirstStage {
            files,
            dir: dir.to_owned(),
        })
    }

    /// The contents served under `name`, if it is one of the loaded binaries. `name` is the
    /// client's, untrusted: it is only compared, never joined to a path.
    pub fn get(&self, name: &str) -> Option<Bytes> {
        self.files.get(name).cloned()
    }

    /// The names being served.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.files.keys().copied()
    }

    /// The directory they were loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn needed_by(name: &str) -> String {
    match name {
        BIOS => "legacy BIOS PXE machines need it (firmware: bios, or no firmware hint)".into(),
        UEFI_X64 => "x86-64 UEFI machines need it (firmware: uefi or http, or no hint)".into(),
        UEFI_ARM64 => "arm64 UEFI machines need it".into(),
        other => format!("the inventory's machines need {other}"),
    }
}

/// HTTP routes `/<name>` for the loaded binaries: the URL UEFI HTTP boot is handed
/// (`http://<advertise>:<port>/ipxe.efi`). Unknown names are 404 without touching the disk.
pub fn router(files: Arc<FirstStage>) -> Router {
    Router::new()
        .route("/{file}", get(serve_file).head(serve_file))
        .with_state(files)
}

async fn serve_file(
    State(files): State<Arc<FirstStage>>,
    UrlPath(name): UrlPath<String>,
) -> Response {
    match files.get(&name) {
        Some(bytes) => {
            tracing::info!(file = %name, bytes = bytes.len(), "iPXE binary served over HTTP");
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab() -> Inventory {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
        crate::inventory::load_with_env(&path, &BTreeMap::new())
            .unwrap()
            .inventory
    }

    #[test]
    fn needed_follows_firmware_and_arch() {
        let mut inv = lab();
        // lab.yaml boots unknown machines too (either firmware, default amd64).
        assert_eq!(
            needed(&inv, Transport::TftpAndHttp),
            BTreeSet::from([BIOS, UEFI_X64])
        );
        // Every node `firmware: uefi`, amd64.
        inv.boot.unknown_machines = UnknownPolicy::Ignore;
        assert_eq!(
            needed(&inv, Transport::TftpAndHttp),
            BTreeSet::from([UEFI_X64])
        );
        assert!(needed(&inv, Transport::HttpOnly).is_empty());
        inv.nodes[0].firmware = None;
        assert_eq!(
            needed(&inv, Transport::TftpAndHttp),
            BTreeSet::from([BIOS, UEFI_X64])
        );
        inv.nodes[0].arch = Some(Arch::Arm64);
        assert_eq!(
            needed(&inv, Transport::TftpAndHttp),
            BTreeSet::from([UEFI_X64, UEFI_ARM64])
        );
        inv.nodes[1].firmware = Some(Firmware::Http);
        assert_eq!(
            needed(&inv, Transport::HttpOnly),
            BTreeSet::from([UEFI_X64])
        );
        for n in &mut inv.nodes {
            n.firmware = Some(Firmware::Bios);
            n.arch = None;
        }
        assert_eq!(needed(&inv, Transport::TftpAndHttp), BTreeSet::from([BIOS]));
        // Secure Boot nodes are offered their signed UKI, never iPXE.
        for n in &mut inv.nodes {
            n.secure_boot = Some(crate::inventory::Spanned {
                value: true,
                loc: n.name.loc.clone(),
            });
            n.firmware = Some(Firmware::Http);
        }
        assert!(needed(&inv, Transport::TftpAndHttp).is_empty());
        assert!(needed(&inv, Transport::HttpOnly).is_empty());
    }

    #[test]
    fn load_follows_symlinks_out_of_the_directory_and_names_what_is_missing() {
        // Debian 12's layout: /usr/lib/ipxe/ipxe.efi -> /boot/ipxe.efi.
        let boot = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(boot.path().join("ipxe.efi"), b"efi").unwrap();
        std::os::unix::fs::symlink(boot.path().join("ipxe.efi"), dir.path().join(UEFI_X64))
            .unwrap();
        std::fs::write(dir.path().join(BIOS), b"kpxe").unwrap();
        let got = FirstStage::load(dir.path(), &BTreeSet::from([BIOS, UEFI_X64])).unwrap();
        assert_eq!(got.get(UEFI_X64).as_deref(), Some(&b"efi"[..]));
        assert_eq!(got.get(BIOS).as_deref(), Some(&b"kpxe"[..]));
        assert_eq!(got.names().collect::<Vec<_>>(), vec![UEFI_X64, BIOS]);
        for refused in [
            "../ipxe.efi",
            "/boot/ipxe.efi",
            "snponly.efi",
            "",
            "IPXE.EFI",
        ] {
            assert!(got.get(refused).is_none(), "{refused}");
        }

        // Needed and missing: refused, naming the file.
        let err = FirstStage::load(dir.path(), &BTreeSet::from([UEFI_ARM64]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&dir.path().join(UEFI_ARM64).display().to_string()),
            "{err}"
        );
        assert!(err.contains("arm64"), "{err}");
        // A dangling symlink names its target.
        std::fs::remove_file(boot.path().join("ipxe.efi")).unwrap();
        let err = FirstStage::load(dir.path(), &BTreeSet::from([UEFI_X64]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ipxe.efi cannot be served") && err.contains("symlink to"),
            "{err}"
        );
        // Not needed: absent binaries are simply not served.
        let got = FirstStage::load(dir.path(), &BTreeSet::from([BIOS])).unwrap();
        assert!(got.get(UEFI_X64).is_none());
    }
}
