//! The Kubernetes API server's `Warning` response headers, which kube-rs drops: a tower
//! layer around kube-rs's HTTP stack ([`WarningLayer`]) reads them from every response, logs
//! each, and keeps them in a [`WarningLog`] the caller drains after its request, so the
//! add-on install can report them per object and publish them as events.
//!
//! The header is RFC 7234's `warn-code SP warn-agent SP warn-text [SP warn-date]`, several
//! per header value separated by commas; kube-apiserver sends code 299, agent `-` and the
//! text as a quoted-string with `\` escapes (k8s.io/apimachinery v0.36 pkg/util/net/http.go,
//! NewWarningHeader and ParseWarningHeaders). Parsing is pure and unit-tested here.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::http::{self, Request, Response};
use tower::{Layer, Service};

/// One warning the server sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerWarning {
    /// The request it answered (`PATCH /apis/apps/v1/...`).
    pub request: String,
    /// The warning text, unquoted.
    pub text: String,
}

/// Warnings seen on a client's responses, oldest first, until drained.
#[derive(Clone, Debug, Default)]
pub(crate) struct WarningLog(Arc<Mutex<Vec<ServerWarning>>>);

impl WarningLog {
    /// Takes every warning recorded so far.
    pub fn drain(&self) -> Vec<ServerWarning> {
        std::mem::take(&mut *self.0.lock().expect("warning log"))
    }

    fn push(&self, w: ServerWarning) {
        self.0.lock().expect("warning log").push(w);
    }
}

/// Parses the warning texts out of one `Warning` header value. Entries that are not
/// `<3 digits> <agent> "<text>"` are skipped (RFC 7234 says to ignore malformed ones).
pub(crate) fn parse_warning_header(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = value.trim_start();
    while !rest.is_empty() {
        let Some(parsed) = parse_one(rest) else {
            break;
        };
        let (text, after) = parsed;
        out.push(text);
        rest = after.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    out
}

/// One `code agent "text" [date]` entry and what follows it.
fn parse_one(s: &str) -> Option<(String, &str)> {
    let (code, rest) = s.split_once(' ')?;
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (_agent, rest) = rest.trim_start().split_once(' ')?;
    let rest = rest.trim_start().strip_prefix('"')?;
    let mut text = String::new();
    let mut chars = rest.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => text.push(chars.next()?.1),
            '"' => {
                let mut after = &rest[i + 1..];
                // An optional quoted warn-date.
                let trimmed = after.trim_start();
                if let Some(d) = trimmed.strip_prefix('"') {
                    after = &d[d.find('"')? + 1..];
                }
                return Some((text, after));
            }
            c => text.push(c),
        }
    }
    None
}

/// The tower layer: wrap kube-rs's service stack with it
/// (`ClientBuilder::with_layer`).
#[derive(Clone, Debug)]
pub(crate) struct WarningLayer {
    log: WarningLog,
}

impl WarningLayer {
    /// A layer recording into `log`.
    pub fn new(log: WarningLog) -> Self {
        WarningLayer { log }
    }
}

impl<S> Layer<S> for WarningLayer {
    type Service = WarningService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WarningService {
            inner,
            log: self.log.clone(),
        }
    }
}

/// The service [`WarningLayer`] makes.
#[derive(Clone, Debug)]
pub(crate) struct WarningService<S> {
    inner: S,
    log: WarningLog,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for WarningService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Future: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let request = format!("{} {}", req.method(), req.uri().path());
        let log = self.log.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            for value in resp.headers().get_all(http::header::WARNING) {
                // The server writes UTF-8 as is inside the quoted text (k8s.io/apimachinery
                // v0.36 pkg/util/net/http.go, makeQuotedString escapes only `"` and `\`), which
                // `to_str` refuses as not visible ASCII.
                let value = String::from_utf8_lossy(value.as_bytes());
                for text in parse_warning_header(&value) {
                    tracing::warn!(request = %request, warning = %text, "the Kubernetes API server warned");
                    log.push(ServerWarning {
                        request: request.clone(),
                        text,
                    });
                }
            }
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_apiservers_format() {
        assert_eq!(
            parse_warning_header(r#"299 - "would violate PodSecurity \"restricted:latest\": x""#),
            vec![r#"would violate PodSecurity "restricted:latest": x"#.to_owned()]
        );
        assert_eq!(
            parse_warning_header(r#"299 - "a\\b", 299 - "c" "Sat, 01 Jan 2000 00:00:00 GMT""#),
            vec![r"a\b".to_owned(), "c".to_owned()]
        );
        assert!(parse_warning_header("garbage").is_empty());
        assert!(parse_warning_header(r#"299 - "unterminated"#).is_empty());
    }
}
