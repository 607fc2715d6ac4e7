//! Streaming boot artifacts (kernel, initramfs, command line) from the images directory with
//! `Range`, `HEAD`, a strong `ETag` and an exact `Content-Length`.
//!
//! Only files recorded in the artifact catalog are served, and their paths are built from the
//! catalog entry, never from the request, so there is nothing to traverse. The ETag is the
//! recorded SHA-256, which is what a cache or a resuming firmware needs. A body is never read
//! whole into memory (an initramfs is ~100 MB per concurrent client): the response carries the
//! open file as a [`FileBody`], which talboot's server sends with `sendfile(2)`, beside a
//! streaming body of the same bytes for anything that reads the response itself.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use super::server::FileBody;

/// What to send for a request's `Range` header against a file of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangePlan {
    /// The whole file (no Range, or one we choose not to honour such as several ranges).
    Full,
    /// `206 Partial Content` for bytes `start..=end`.
    Partial {
        /// First byte.
        start: u64,
        /// Last byte (inclusive).
        end: u64,
    },
    /// `416 Range Not Satisfiable`.
    Unsatisfiable,
}

/// Decide how to answer `range` (RFC 9110 §14): one `bytes=` range is honoured; several ranges
/// are answered with the full file, which the RFC allows; syntax errors are ignored (full file).
pub(crate) fn plan_range(range: Option<&str>, size: u64) -> RangePlan {
    let Some(spec) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else {
        return RangePlan::Full;
    };
    if spec.contains(',') {
        return RangePlan::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangePlan::Full;
    };
    let (a, b) = (a.trim(), b.trim());
    match (a.is_empty(), b.is_empty()) {
        // bytes=-N: the last N bytes.
        (true, false) => match b.parse::<u64>() {
            Ok(0) => RangePlan::Unsatisfiable,
            Ok(_) if size == 0 => RangePlan::Unsatisfiable,
            Ok(n) => RangePlan::Partial {
                start: size.saturating_sub(n),
                end: size - 1,
            },
            Err(_) => RangePlan::Full,
        },
        // bytes=A- : from A to the end.
        (false, true) => match a.parse::<u64>() {
            Ok(start) if start < size => RangePlan::Partial {
                start,
                end: size - 1,
            },
            Ok(_) => RangePlan::Unsatisfiable,
            Err(_) => RangePlan::Full,
        },
        // bytes=A-B
        (false, false) => match (a.parse::<u64>(), b.parse::<u64>()) {
            (Ok(start), Ok(end)) if start <= end && start < size => RangePlan::Partial {
                start,
                end: end.min(size - 1),
            },
            (Ok(start), Ok(end)) if start <= end => RangePlan::Unsatisfiable,
            _ => RangePlan::Full,
        },
        (true, true) => RangePlan::Full,
    }
}

/// A file to send, with what the catalog knows about it.
#[derive(Debug, Clone)]
pub struct Asset {
    /// Where it is.
    pub path: std::path::PathBuf,
    /// Recorded size.
    pub size: u64,
    /// Recorded SHA-256 (lowercase hex).
    pub sha256: String,
    /// Content type.
    pub content_type: &'static str,
}

/// Build the response for `asset` to a GET or HEAD with `headers`. Returns the response and the
/// number of body bytes it will carry (for boot events and metrics).
pub async fn respond(asset: &Asset, method: &Method, headers: &HeaderMap) -> (Response, u64) {
    let etag = format!("\"sha256:{}\"", asset.sha256);
    let if_none_match = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok());
    if if_none_match.is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*")) {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        r.headers_mut().insert(header::ETAG, hv(&etag));
        return (r, 0);
    }
    // A Range is only honoured when If-Range (if any) names the current version.
    let if_range_ok = headers
        .get(header::IF_RANGE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.trim() == etag);
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .filter(|_| if_range_ok);
    let plan = plan_range(range, asset.size);
    let (status, start, len) = match plan {
        RangePlan::Full => (StatusCode::OK, 0, asset.size),
        RangePlan::Partial { start, end } => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        RangePlan::Unsatisfiable => {
            let mut r = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
            r.headers_mut().insert(
                header::CONTENT_RANGE,
                hv(&format!("bytes */{}", asset.size)),
            );
            return (r, 0);
        }
    };
    let mut file_body = None;
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        match open_at(&asset.path, start, len) {
            Ok((file, body)) => {
                file_body = Some(file);
                body
            }
            Err(e) => {
                tracing::error!(path = %asset.path.display(), error = %e, "cannot open artifact");
                return (StatusCode::INTERNAL_SERVER_ERROR.into_response(), 0);
            }
        }
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_LENGTH, hv(&len.to_string()));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::ETAG, hv(&etag));
    if status == StatusCode::PARTIAL_CONTENT {
        h.insert(
            header::CONTENT_RANGE,
            hv(&format!("bytes {start}-{}/{}", start + len - 1, asset.size)),
        );
    }
    if let Some(f) = file_body {
        r.extensions_mut().insert(f);
    }
    let sent = if method == Method::HEAD { 0 } else { len };
    (r, sent)
}

/// The file at `path` as the [`FileBody`] `start..start + len`, and a body of the same bytes
/// for readers other than talboot's server. The open is a plain `open(2)` (an artifact's
/// directory entry is cached; nginx opens in its event loop too); the body's own descriptor
/// and seek are made only if something reads it, and never move the offsets `sendfile(2)` is
/// given.
fn open_at(path: &std::path::Path, start: u64, len: u64) -> std::io::Result<(FileBody, Body)> {
    use futures_util::TryStreamExt;
    let file = std::sync::Arc::new(std::fs::File::open(path)?);
    let reader = file.clone();
    let open = async move {
        let mut f = tokio::fs::File::from_std(reader.try_clone()?);
        f.seek(std::io::SeekFrom::Start(start)).await?;
        Ok::<_, std::io::Error>(ReaderStream::with_capacity(f.take(len), 64 * 1024))
    };
    let body = Body::from_stream(futures_util::stream::once(open).try_flatten());
    Ok((
        FileBody {
            file,
            offset: start,
            len,
        },
        body,
    ))
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).expect("header values built from digits, hex and ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_forms() {
        use RangePlan::*;
        let p = |r: &str| plan_range(Some(r), 100);
        assert_eq!(plan_range(None, 100), Full);
        assert_eq!(p("bytes=0-9"), Partial { start: 0, end: 9 });
        assert_eq!(p("bytes=90-"), Partial { start: 90, end: 99 });
        assert_eq!(p("bytes=-10"), Partial { start: 90, end: 99 });
        assert_eq!(p("bytes=-1000"), Partial { start: 0, end: 99 });
        assert_eq!(p("bytes=50-1000"), Partial { start: 50, end: 99 });
        assert_eq!(p("bytes=100-"), Unsatisfiable);
        assert_eq!(p("bytes=100-200"), Unsatisfiable);
        assert_eq!(p("bytes=-0"), Unsatisfiable);
        assert_eq!(p("bytes=0-1,5-6"), Full);
        assert_eq!(p("bytes=9-0"), Full);
        assert_eq!(p("items=0-1"), Full);
        assert_eq!(p("bytes=x-1"), Full);
        assert_eq!(plan_range(Some("bytes=0-"), 0), Unsatisfiable);
    }

    #[tokio::test]
    async fn file_responses_carry_the_file_slice_for_sendfile_and_the_same_bytes_as_a_body() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kernel");
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let asset = Asset {
            path,
            size: 5000,
            sha256: "ab".into(),
            content_type: "application/octet-stream",
        };
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, HeaderValue::from_static("bytes=4990-"));
        let (r, sent) = respond(&asset, &Method::GET, &h).await;
        assert_eq!((r.status(), sent), (StatusCode::PARTIAL_CONTENT, 10));
        let f = r.extensions().get::<FileBody>().expect("a file slice");
        assert_eq!((f.offset, f.len), (4990, 10));
        let body = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(body.as_ref(), &bytes[4990..]);

        let (r, sent) = respond(&asset, &Method::HEAD, &HeaderMap::new()).await;
        assert_eq!((r.status(), sent), (StatusCode::OK, 0));
        assert!(r.extensions().get::<FileBody>().is_none());
        assert_eq!(r.headers()[header::CONTENT_LENGTH], "5000");
    }
}
