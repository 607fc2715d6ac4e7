//! Authentication of the admin listener off loopback: the operator's bearer token (read from
//! a file only its owner can read, [`AdminToken::load`]), the pure admission rule
//! ([`judge`]) and the middleware applying it ([`guard`]).
//!
//! A request from a loopback peer passes as before (whoever can reach loopback is on this
//! host). Any other peer must show the token: `Authorization: Bearer <token>` (the CLI), or
//! the `talboot_admin` cookie the dashboard gets once by opening `/?token=<token>` (answered
//! with a redirect to `/` that sets the cookie `HttpOnly; SameSite=Strict`, so the token
//! leaves the address bar and page scripts never see it). Without it: 401. The comparison is
//! constant-time; the token never reaches a log, an error or a response (the request span
//! records the path only, never the query or headers).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq as _;

/// The cookie the dashboard carries the token in.
pub(crate) const COOKIE: &str = "talboot_admin";
/// The shortest token accepted: guessing must not be an option.
pub(crate) const MIN_LEN: usize = 16;

/// The admin token. Its `Debug` never shows it.
#[derive(Clone)]
pub(crate) struct AdminToken(String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Why a token (file) cannot be used. No variant carries the token or a part of it.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file cannot be read.
    #[error("cannot read the admin token file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Others than its owner may read or write it.
    #[error(
        "the admin token file {} has mode {mode:04o}: group and others must have no access; \
         run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The token is too short or has characters that cannot go in a header, cookie or URL
    /// unescaped.
    #[error(
        "the admin token {origin} must be at least {MIN_LEN} characters of A-Z a-z 0-9 - . _ ~ \
         (one line); make one with `openssl rand -hex 32`"
    )]
    Malformed {
        /// Where it came from (`file X`, `TALBOOT_ADMIN_TOKEN`).
        origin: String,
    },
}

impl AdminToken {
    /// Reads the token from `path`, refusing a file that group or others can access.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        use std::os::unix::fs::PermissionsExt as _;
        let read = |source| TokenError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(TokenError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        Self::parse(&text, &format!("in file {}", path.display()))
    }

    /// The token in `text` (surrounding whitespace, such as the file's final newline, is not
    /// part of it); `origin` names where it came from for the error.
    pub fn parse(text: &str, origin: &str) -> Result<Self, TokenError> {
        let t = text.trim();
        let ok = t.len() >= MIN_LEN
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
        if ok {
            Ok(Self(t.to_owned()))
        } else {
            Err(TokenError::Malformed {
                origin: origin.to_owned(),
            })
        }
    }

    /// Whether `candidate` is the token, in time independent of where they differ (a
    /// candidate of another length is refused at once: the length is no secret).
    pub fn matches(&self, candidate: &[u8]) -> bool {
        bool::from(self.0.as_bytes().ct_eq(candidate))
    }

    /// The token, for the one place that sends it (the CLI's `Authorization` header).
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

/// What the admin listener does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve it.
    Pass,
    /// `GET /?token=` with the right token: set the cookie and redirect to `/`.
    Exchange,
    /// 401.
    Unauthorized,
}

/// The request facts [`judge`] decides on. No `Debug`: it holds credentials.
#[derive(Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// The peer is a loopback address.
    pub loopback: bool,
    /// The request method.
    pub method: &'a Method,
    /// The request path.
    pub path: &'a str,
    /// The query string, if any.
    pub query: Option<&'a str>,
    /// `Authorization` header values.
    pub authorization: &'a [&'a str],
    /// `Cookie` header values.
    pub cookies: &'a [&'a str],
}

/// The admission rule. Loopback passes; anyone else needs `token` (with none configured,
/// nothing off loopback passes) as a bearer header or the cookie, or exchanges it on the
/// dashboard page's `?token=`.
pub(crate) fn judge(token: Option<&AdminToken>, f: &Facts<'_>) -> Verdict {
    if f.loopback {
        return Verdict::Pass;
    }
    let Some(token) = token else {
        return Verdict::Unauthorized;
    };
    let bearer = f.authorization.iter().any(|v| {
        v.split_once(' ').is_some_and(|(scheme, cred)| {
            scheme.eq_ignore_ascii_case("bearer") && token.matches(cred.trim().as_bytes())
        })
    });
    let cookie = f.cookies.iter().flat_map(|v| v.split(';')).any(|pair| {
        pair.trim()
            .split_once('=')
            .is_some_and(|(name, value)| name == COOKIE && token.matches(value.as_bytes()))
    });
    if bearer || cookie {
        return Verdict::Pass;
    }
    let offered = f
        .query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter_map(|pair| pair.strip_prefix("token="))
        .any(|value| token.matches(value.as_bytes()));
    if offered && *f.method == Method::GET && f.path == "/" {
        Verdict::Exchange
    } else {
        Verdict::Unauthorized
    }
}

/// Marks a request [`guard`] admitted (the handlers of state-changing routes check it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted;

/// Whether a handler may act for `peer`: loopback, or admitted by [`guard`].
pub(crate) fn permitted(peer: &SocketAddr, admitted: Option<&axum::Extension<Admitted>>) -> bool {
    admitted.is_some() || peer.ip().is_loopback()
}

fn header_values<'a>(h: &'a HeaderMap, name: &header::HeaderName) -> Vec<&'a str> {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect()
}

/// The admin router's middleware applying [`judge`] with the listener's token.
pub(crate) async fn guard(
    State(token): State<Option<Arc<AdminToken>>>,
    mut req: Request,
    next: Next,
) -> Response {
    let loopback = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback());
    let h = req.headers();
    let (authorization, cookies) = (
        header_values(h, &header::AUTHORIZATION),
        header_values(h, &header::COOKIE),
    );
    let verdict = judge(
        token.as_deref(),
        &Facts {
            loopback,
            method: req.method(),
            path: req.uri().path(),
            query: req.uri().query(),
            authorization: &authorization,
            cookies: &cookies,
        },
    );
    match (verdict, token) {
        (Verdict::Pass, _) => {
            req.extensions_mut().insert(Admitted);
            next.run(req).await
        }
        (Verdict::Exchange, Some(token)) => {
            let cookie = format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", token.0);
            let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        _ => {
            // Path only: a wrong token in a header or the query is never written.
            tracing::warn!(path = %crate::http::redact_path(req.uri().path()), "admin request without a valid token refused");
            let mut r = super::text(
                StatusCode::UNAUTHORIZED,
                "unauthorized: the admin API needs the admin token off loopback: send \
                 `Authorization: Bearer <token>` (the CLI reads TALBOOT_ADMIN_TOKEN or \
                 --admin-token-file), or open the dashboard once as /?token=<token>\n"
                    .into(),
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"talboot admin\""),
            );
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: &str = "0123456789abcdef0123456789abcdef";

    fn token() -> AdminToken {
        AdminToken::parse(T, "test").unwrap()
    }

    fn facts<'a>(
        loopback: bool,
        path: &'a str,
        query: Option<&'a str>,
        authorization: &'a [&'a str],
        cookies: &'a [&'a str],
    ) -> Facts<'a> {
        Facts {
            loopback,
            method: &Method::GET,
            path,
            query,
            authorization,
            cookies,
        }
    }

    #[test]
    fn loopback_passes_without_a_token() {
        assert_eq!(
            judge(None, &facts(true, "/api/nodes", None, &[], &[])),
            Verdict::Pass
        );
        assert_eq!(
            judge(Some(&token()), &facts(true, "/api/nodes", None, &[], &[])),
            Verdict::Pass
        );
    }

    #[test]
    fn off_loopback_needs_the_token() {
        let t = token();
        let bearer = format!("Bearer {T}");
        let lower = format!("bearer {T}");
        let cookie = format!("a=b; {COOKIE}={T}");
        let q = format!("token={T}");
        for (f, want) in [
            (
                facts(false, "/api/nodes", None, &[], &[]),
                Verdict::Unauthorized,
            ),
            (
                facts(false, "/api/nodes", None, &[&bearer], &[]),
                Verdict::Pass,
            ),
            (
                facts(false, "/api/nodes", None, &[&lower], &[]),
                Verdict::Pass,
            ),
            (
                facts(false, "/api/nodes", None, &[], &[&cookie]),
                Verdict::Pass,
            ),
            (
                facts(
                    false,
                    "/api/nodes",
                    None,
                    &["Bearer nope-nope-nope-nope"],
                    &[],
                ),
                Verdict::Unauthorized,
            ),
            (
                facts(false, "/api/nodes", None, &[&format!("Basic {T}")], &[]),
                Verdict::Unauthorized,
            ),
            (facts(false, "/", Some(&q), &[], &[]), Verdict::Exchange),
            // The query token is for the page only: an API URL with it is refused.
            (
                facts(false, "/api/nodes", Some(&q), &[], &[]),
                Verdict::Unauthorized,
            ),
            (
                facts(false, "/", Some("token=wrong"), &[], &[]),
                Verdict::Unauthorized,
            ),
        ] {
            assert_eq!(
                judge(Some(&t), &f),
                want,
                "{} {:?}",
                f.path,
                f.query.is_some()
            );
        }
        // No token configured: nothing off loopback passes, whatever it carries.
        assert_eq!(
            judge(None, &facts(false, "/api/nodes", None, &[&bearer], &[])),
            Verdict::Unauthorized
        );
        // Exchange is for GET only.
        let post = Facts {
            method: &Method::POST,
            ..facts(false, "/", Some(&q), &[], &[])
        };
        assert_eq!(judge(Some(&t), &post), Verdict::Unauthorized);
    }

    #[test]
    fn token_text_is_checked_and_never_shown() {
        assert!(AdminToken::parse("short", "x").is_err());
        assert!(AdminToken::parse("0123456789abcdef;x", "x").is_err());
        assert!(AdminToken::parse("0123456789abcdef 0123", "x").is_err());
        let t = AdminToken::parse(&format!("{T}\n"), "x").unwrap();
        assert_eq!(t.expose(), T);
        assert!(!format!("{t:?}").contains(T));
        let e = AdminToken::parse("0123456789abcdef;secretpart", "in file f")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secretpart"), "{e}");
    }

    #[test]
    fn token_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-token");
        std::fs::write(&path, format!("{T}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = AdminToken::load(&path).unwrap_err();
        assert!(
            matches!(e, TokenError::Permissions { mode: 0o644, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(AdminToken::load(&path).unwrap().expose(), T);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(AdminToken::load(&path).is_ok());
    }

    proptest! {
        /// Off loopback, no credential but the token itself passes.
        #[test]
        fn only_the_token_passes(cand in "[A-Za-z0-9._~-]{0,40}") {
            let t = token();
            let bearer = format!("Bearer {cand}");
            let cookie = format!("{COOKIE}={cand}");
            let v = judge(Some(&t), &facts(false, "/api/nodes", None, &[&bearer], &[&cookie]));
            prop_assert_eq!(v == Verdict::Pass, cand == T);
        }
    }
}
