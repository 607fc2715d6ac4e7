//! Fetching boot sets from the Talos Image Factory (or a mirror with the same URL shape):
//! `<base>/image/<schematic>/<version>/{kernel-<arch>, initramfs-<arch>.xz, cmdline-metal-<arch>}`,
//! and for the nodes that boot one the UKIs `metal-<arch>-uki.efi` and
//! `metal-<arch>-secureboot-uki.efi` (siderolabs/image-factory `README.md`, "GET
//! /image/:schematic/:version/:path": `<platform>-<arch>[-secureboot]-uki.efi`).
//!
//! Downloads go to `<file>.part` and resume with an HTTP Range request when a partial file is
//! there; a finished file is hashed, renamed into place, and recorded in the catalog only after
//! every file asked for is complete, so the catalog never names a half-pulled set. A UKI is
//! read ([`super::uki`]) while still `.part`: one that does not parse as a UKI of the set's
//! architecture (or, for the Secure Boot slot, is unsigned) is deleted, never renamed into
//! place. Files of the set that were not asked for stay as the catalog has them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::io::AsyncWriteExt;

use super::{ArtifactError, Catalog, Entry, FileRecord, Kind, SetId, hash_file};

/// The factory-side file name of `kind` for `arch`.
pub(crate) fn remote_name(kind: Kind, arch: &str) -> String {
    match kind {
        Kind::Kernel => format!("kernel-{arch}"),
        Kind::Initramfs => format!("initramfs-{arch}.xz"),
        Kind::Cmdline => format!("cmdline-metal-{arch}"),
        Kind::Uki => format!("metal-{arch}-uki.efi"),
        Kind::SecureBootUki => format!("metal-{arch}-secureboot-uki.efi"),
    }
}

/// The URL of `kind` of set `id` under `base` (e.g. `https://factory.talos.dev`).
pub fn url(base: &str, id: &SetId, kind: Kind) -> String {
    format!(
        "{}/image/{}/{}/{}",
        base.trim_end_matches('/'),
        id.schematic,
        id.talos,
        remote_name(kind, &id.arch)
    )
}

/// What to pull and where.
#[derive(Debug, Clone)]
pub struct PullRequest {
    /// Image Factory base URL.
    pub base_url: String,
    /// The set.
    pub id: SetId,
    /// The images directory.
    pub dir: PathBuf,
    /// Show progress bars (only when stderr is a terminal).
    pub progress: bool,
}

/// Build the HTTP client: rustls with the ring provider and the system's root certificates.
pub fn client() -> Result<reqwest::Client, ArtifactError> {
    crate::install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(20))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("talboot/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ArtifactError::Download {
            url: String::new(),
            cause: e.to_string(),
        })
}

/// Pull the PXE files of a set (kernel, initramfs, command line), resuming partial
/// downloads, then record it in the catalog.
pub async fn pull(
    client: &reqwest::Client,
    req: &PullRequest,
    now_unix: u64,
) -> Result<Entry, ArtifactError> {
    pull_kinds(client, req, &Kind::ALL, now_unix).await
}

/// Pull the files of a set that the ways `boots` need.
pub async fn pull_boots(
    client: &reqwest::Client,
    req: &PullRequest,
    boots: &[super::Boot],
    now_unix: u64,
) -> Result<Entry, ArtifactError> {
    let kinds: Vec<Kind> = Kind::EVERY
        .into_iter()
        .filter(|k| boots.iter().any(|b| b.kinds().contains(k)))
        .collect();
    pull_kinds(client, req, &kinds, now_unix).await
}

/// Pull `kinds` of a set, then record them in the catalog beside the files of the set it
/// already records.
pub async fn pull_kinds(
    client: &reqwest::Client,
    req: &PullRequest,
    kinds: &[Kind],
    now_unix: u64,
) -> Result<Entry, ArtifactError> {
    let set_dir = req.dir.join(req.id.rel_dir());
    tokio::fs::create_dir_all(&set_dir)
        .await
        .map_err(|source| ArtifactError::Io {
            path: set_dir.clone(),
            source,
        })?;
    let mut files = std::collections::BTreeMap::new();
    for &kind in kinds {
        let target = set_dir.join(kind.file_name());
        let u = url(&req.base_url, &req.id, kind);
        let part = download(client, &u, &target, req.progress).await?;
        let uki = match kind.is_uki() {
            true => Some(super::UkiRecord {
                facts: check_part(&part, &u, kind, &req.id.arch).await?,
                source: req.base_url.clone(),
                at: now_unix,
                origin: super::Origin::Pulled,
            }),
            false => None,
        };
        tokio::fs::rename(&part, &target)
            .await
            .map_err(io_err(&target))?;
        let (size, sha256) = hash_file(&target).map_err(|source| ArtifactError::Io {
            path: target.clone(),
            source,
        })?;
        tracing::info!(url = %u, size, sha256 = %sha256, "pulled");
        // Recorded for `images list`; a pulled initramfs the kernel would not recognise is
        // not refused here (the factory is the reference), it just shows no compression.
        let compression = match kind {
            Kind::Initramfs => super::compression::sniff(&target),
            _ => None,
        };
        files.insert(
            kind,
            FileRecord {
                size,
                sha256,
                compression,
                uki,
            },
        );
    }
    let mut catalog = Catalog::load(&req.dir)?;
    let entry = super::merge(
        catalog.find(&req.id),
        Entry {
            id: req.id.clone(),
            source: req.base_url.clone(),
            pulled_at: now_unix,
            files,
            origin: super::Origin::Pulled,
        },
    );
    catalog.upsert(entry.clone());
    catalog.save(&req.dir)?;
    Ok(entry)
}

/// Read a downloaded UKI before it is renamed into place; a file that is not a UKI for its
/// slot is deleted (a fresh pull starts over rather than resuming into it).
async fn check_part(
    part: &Path,
    url: &str,
    kind: Kind,
    arch: &str,
) -> Result<super::uki::UkiFacts, ArtifactError> {
    let path = part.to_path_buf();
    let arch = arch.to_string();
    let checked = tokio::task::spawn_blocking(move || super::check_uki(&path, kind, &arch))
        .await
        .map_err(|e| download_err(url, e.to_string()))?;
    match checked {
        Ok(facts) => Ok(facts),
        Err(problem) => {
            let _ = tokio::fs::remove_file(part).await;
            Err(ArtifactError::BadUki {
                url: url.to_string(),
                problem,
            })
        }
    }
}

fn part_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    target.with_file_name(name)
}

/// A failed download of `url`, with why.
fn download_err(url: &str, cause: String) -> ArtifactError {
    ArtifactError::Download {
        url: url.to_string(),
        cause,
    }
}

/// An I/O error on `path`, as the artifact cache reports it.
fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ArtifactError {
    let path = path.to_path_buf();
    move |source| ArtifactError::Io { path, source }
}

/// Fetches `url` into `<target>.part`, asking only for the missing tail when a partial file
/// is there, so an interrupted pull resumes where it stopped. Returns the complete `.part`
/// file; the caller renames it into place.
async fn download(
    client: &reqwest::Client,
    url: &str,
    target: &Path,
    progress: bool,
) -> Result<PathBuf, ArtifactError> {
    let part = part_path(target);
    let have = tokio::fs::metadata(&part)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    let mut request = client.get(url);
    if have > 0 {
        request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
    }
    let resp = request
        .send()
        .await
        .map_err(|e| download_err(url, e.to_string()))?;
    let Some((mut file, start)) = open_part(url, resp.status(), have, &part).await? else {
        return Ok(part);
    };
    let total = resp.content_length().map(|len| len + start);
    let bar = progress_bar(progress, total, start, target);
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| download_err(url, format!("{e}; run the same command again to resume")))?;
        file.write_all(&chunk).await.map_err(io_err(&part))?;
        bar.inc(chunk.len() as u64);
    }
    file.flush().await.map_err(io_err(&part))?;
    file.sync_all().await.map_err(io_err(&part))?;
    drop(file);
    bar.finish_and_clear();
    if let Some(total) = total {
        let got = tokio::fs::metadata(&part)
            .await
            .map_err(io_err(&part))?
            .len();
        if got != total {
            return Err(download_err(
                url,
                format!("got {got} of {total} bytes; run the same command again to resume"),
            ));
        }
    }
    Ok(part)
}

/// Where the response body goes, decided by the status: appended to the partial file when
/// the server honoured the Range request, written from the start when it sent the whole file.
/// `None` when the server says the range is past the end: the partial file is complete.
async fn open_part(
    url: &str,
    status: reqwest::StatusCode,
    have: u64,
    part: &Path,
) -> Result<Option<(tokio::fs::File, u64)>, ArtifactError> {
    Ok(Some(match status {
        reqwest::StatusCode::PARTIAL_CONTENT if have > 0 => {
            let f = tokio::fs::OpenOptions::new()
                .append(true)
                .open(part)
                .await
                .map_err(io_err(part))?;
            (f, have)
        }
        reqwest::StatusCode::RANGE_NOT_SATISFIABLE if have > 0 => return Ok(None),
        s if s.is_success() => {
            // A server that ignores Range sends the whole file again: start over.
            let f = tokio::fs::File::create(part).await.map_err(io_err(part))?;
            (f, 0)
        }
        s => return Err(download_err(url, format!("HTTP {s}"))),
    }))
}

/// The progress bar for one file on stderr (hidden unless the operator's terminal shows it),
/// starting at the bytes a resumed download already has.
fn progress_bar(progress: bool, total: Option<u64>, start: u64, target: &Path) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:30} {bytes:>10}/{total_bytes:10} {bar:30} {bytes_per_sec}",
        )
        .expect("static template"),
    );
    bar.set_message(
        target
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned(),
    );
    bar.set_position(start);
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_have_the_factory_shape() {
        let id = SetId {
            talos: "v1.13.9".into(),
            schematic: "abc".into(),
            arch: "arm64".into(),
        };
        assert_eq!(
            url("https://factory.talos.dev/", &id, Kind::Initramfs),
            "https://factory.talos.dev/image/abc/v1.13.9/initramfs-arm64.xz"
        );
        assert_eq!(
            url("http://mirror:8080", &id, Kind::Cmdline),
            "http://mirror:8080/image/abc/v1.13.9/cmdline-metal-arm64"
        );
    }
}
