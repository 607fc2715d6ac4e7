//! The HTTP/1.1 connection protocol, pure (bytes and clocks in, decisions out): parsing a
//! request head (with `httparse`), the keep-alive decision, which timeout governs the wait for
//! the next request, and the bytes of a response head. [`super::server`] is the socket
//! adapter around it.
//!
//! The rules follow RFC 9112: HTTP/1.1 connections persist unless `Connection: close`
//! (§9.3); HTTP/1.0 ones only with `Connection: keep-alive` (§9.3, appendix C.2.2); a request
//! body is framed by `Content-Length` (§6.3); several differing `Content-Length` values are an
//! error (§6.3 item 5). Requests with `Transfer-Encoding` are refused with 411: talboot's
//! routes take no chunked bodies, and refusing them closes the request-smuggling door that
//! chunked parsing opens.

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version, header};

/// At most this many request headers (hyper's default is 100 as well).
pub(crate) const MAX_HEADERS: usize = 100;

/// Size limits on what a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// The request line and headers together (nginx allows 4 x 8 KiB).
    pub(crate) max_head_bytes: usize,
    /// A request body (only the admin API's POSTs carry one, and they carry nothing).
    pub(crate) max_body_bytes: u64,
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits {
            max_head_bytes: 32 * 1024,
            max_body_bytes: 64 * 1024,
        }
    }
}

/// A parsed request head.
#[derive(Debug, Clone)]
pub(crate) struct RequestHead {
    /// Method.
    pub method: Method,
    /// Request target as sent (origin form: path and query).
    pub target: String,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Headers.
    pub headers: HeaderMap,
    /// Length of the body that follows the head (`Content-Length`, else 0).
    pub(crate) body_len: u64,
}

impl RequestHead {
    /// Whether the client asked for `100 Continue` before it sends the body.
    pub(crate) fn expects_continue(&self) -> bool {
        self.version == Version::HTTP_11
            && self.body_len > 0
            && self
                .headers
                .get(header::EXPECT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"))
    }

    /// Whether the client lets the connection persist after this request.
    pub(crate) fn keep_alive(&self) -> bool {
        keep_alive(self.version, &self.headers)
    }
}

/// What [`parse_head`] found in the buffer.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// Not a whole head yet: read more.
    Partial,
    /// A whole head of `len` bytes.
    Complete {
        /// The head.
        head: RequestHead,
        /// Bytes it took in the buffer.
        len: usize,
    },
}

/// Why a request head is refused; every one of these ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    /// The head is longer than [`HeadLimits::max_head_bytes`] or has too many headers.
    #[error("request head too large")]
    TooLarge,
    /// Not HTTP/1.x.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// A body framed other than by `Content-Length`.
    #[error("request body without Content-Length")]
    LengthRequired,
    /// A body longer than [`HeadLimits::max_body_bytes`].
    #[error("request body too large")]
    BodyTooLarge,
}

impl HeadError {
    /// The status to answer with before closing.
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::Malformed(_) => StatusCode::BAD_REQUEST,
            HeadError::LengthRequired => StatusCode::LENGTH_REQUIRED,
            HeadError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

/// Parse the request head at the start of `buf`.
pub(crate) fn parse_head(buf: &[u8], limits: &HeadLimits) -> Result<Parsed, HeadError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > limits.max_head_bytes => {
            return Err(HeadError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed("not an HTTP/1.x request head")),
    };
    if len > limits.max_head_bytes {
        return Err(HeadError::TooLarge);
    }
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Malformed("bad method"))?;
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        Some(1) => Version::HTTP_11,
        _ => return Err(HeadError::Malformed("unsupported HTTP version")),
    };
    let target = req.path.unwrap_or_default().to_string();
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| HeadError::Malformed("bad header name"))?;
        let value =
            HeaderValue::from_bytes(h.value).map_err(|_| HeadError::Malformed("bad header"))?;
        headers.append(name, value);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return Err(HeadError::LengthRequired);
    }
    let mut body_len = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        // RFC 9112 §6.3: a list of identical values is the value; anything else is an error.
        for part in v.to_str().unwrap_or("x").split(',') {
            let n = part
                .trim()
                .parse::<u64>()
                .map_err(|_| HeadError::Malformed("bad Content-Length"))?;
            if body_len.is_some_and(|b| b != n) {
                return Err(HeadError::Malformed("conflicting Content-Length"));
            }
            body_len = Some(n);
        }
    }
    let body_len = body_len.unwrap_or(0);
    if body_len > limits.max_body_bytes {
        return Err(HeadError::BodyTooLarge);
    }
    Ok(Parsed::Complete {
        head: RequestHead {
            method,
            target,
            version,
            headers,
            body_len,
        },
        len,
    })
}

/// Whether the connection may persist after a request with `version` and `headers`.
pub(crate) fn keep_alive(version: Version, headers: &HeaderMap) -> bool {
    let mut close = false;
    let mut keep = false;
    for v in headers.get_all(header::CONNECTION) {
        for token in v.to_str().unwrap_or("").split(',') {
            let t = token.trim();
            close |= t.eq_ignore_ascii_case("close");
            keep |= t.eq_ignore_ascii_case("keep-alive");
        }
    }
    match version {
        _ if close => false,
        Version::HTTP_11 => true,
        _ => keep,
    }
}

/// Which limit a wait for request bytes is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeoutKind {
    /// Between requests on a persistent connection, before the next request's first byte.
    Idle,
    /// From a connection's start, or the next request's first byte, to the end of its head
    /// and body: a client trickling a head byte by byte is cut when this runs out.
    Header,
}

/// The two timeouts of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// See [`TimeoutKind::Header`].
    pub header: Duration,
    /// See [`TimeoutKind::Idle`]; also the longest a response write may make no progress.
    pub idle: Duration,
}

/// When the wait for the current request runs out, and under which limit. Deadlines are
/// totals, not per read, so sending one byte at a time does not extend them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadClock {
    /// When the wait ends.
    pub deadline: Instant,
    /// Which limit that is.
    pub kind: TimeoutKind,
}

impl ReadClock {
    /// A new connection: its first request head is due within the header timeout.
    pub fn fresh(now: Instant, t: &Timeouts) -> Self {
        ReadClock {
            deadline: now + t.header,
            kind: TimeoutKind::Header,
        }
    }

    /// After a response on a persistent connection; `buffered` says whether bytes of the next
    /// request (pipelined) are already there.
    pub(crate) fn next_request(now: Instant, t: &Timeouts, buffered: bool) -> Self {
        if buffered {
            Self::fresh(now, t)
        } else {
            ReadClock {
                deadline: now + t.idle,
                kind: TimeoutKind::Idle,
            }
        }
    }

    /// Bytes arrived at `now`: an idle wait becomes a header wait from here.
    pub(crate) fn bytes_arrived(&mut self, now: Instant, t: &Timeouts) {
        if self.kind == TimeoutKind::Idle {
            *self = Self::fresh(now, t);
        }
    }
}

/// How the response's `Connection` header is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persistence {
    /// The connection stays open (HTTP/1.1 default; no header).
    KeepAlive,
    /// Open for an HTTP/1.0 client that asked (`Connection: keep-alive`).
    KeepAlive10,
    /// Closed after this response (`Connection: close`).
    Close,
}

impl Persistence {
    /// For a request of `version` whose client does (`keep`) or does not want persistence.
    pub fn of(version: Version, keep: bool) -> Self {
        match (keep, version) {
            (false, _) => Persistence::Close,
            (true, Version::HTTP_10) => Persistence::KeepAlive10,
            (true, _) => Persistence::KeepAlive,
        }
    }
}

/// Whether a response to `method` with `status` carries a body, and the `Content-Length` to
/// write: `declared` is what the handler set, `body` the length of the body it produced.
/// RFC 9110 §8.6 and §9.3.2: a HEAD response carries the length the GET would have and no
/// body; 1xx, 204 and 304 carry neither.
pub(crate) fn framing(
    method: &Method,
    status: StatusCode,
    declared: Option<u64>,
    body: Option<u64>,
) -> (Option<u64>, bool) {
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if bodiless {
        (None, false)
    } else if method == Method::HEAD {
        (declared.or(body), false)
    } else {
        (body.or(declared), true)
    }
}

/// The bytes of a response head. `headers` are the handler's; framing and persistence headers
/// in it are replaced by `content_length` and `persistence`.
pub(crate) fn response_head(
    status: StatusCode,
    headers: &HeaderMap,
    date: &str,
    content_length: Option<u64>,
    persistence: Persistence,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        let skip = name == header::CONNECTION
            || name == header::TRANSFER_ENCODING
            || name == "keep-alive"
            || name == header::CONTENT_LENGTH
            || name == header::DATE;
        if !skip {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(n) = content_length {
        out.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
    }
    match persistence {
        Persistence::KeepAlive => {}
        Persistence::KeepAlive10 => out.extend_from_slice(b"connection: keep-alive\r\n"),
        Persistence::Close => out.extend_from_slice(b"connection: close\r\n"),
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(date.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out
}

/// A bare response for a request that never reached the router (bad head, timeout).
pub(crate) fn error_response(status: StatusCode, date: &str) -> Vec<u8> {
    let body = format!("{}\n", status.canonical_reason().unwrap_or("error"));
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let mut out = response_head(
        status,
        &h,
        date,
        Some(body.len() as u64),
        Persistence::Close,
    );
    out.extend_from_slice(body.as_bytes());
    out
}

/// `t` as an IMF-fixdate (RFC 9110 §5.6.7), the `Date` header's form.
pub(crate) fn http_date(t: time::OffsetDateTime) -> String {
    const FMT: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    t.to_offset(time::UtcOffset::UTC)
        .format(FMT)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn complete(buf: &[u8]) -> (RequestHead, usize) {
        match parse_head(buf, &HeadLimits::default()) {
            Ok(Parsed::Complete { head, len }) => (head, len),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_an_ipxe_request_and_leaves_a_pipelined_one() {
        let req = b"GET /assets/v1/s/amd64/kernel HTTP/1.1\r\nConnection: keep-alive\r\nUser-Agent: iPXE/1.21\r\nHost: 10.0.0.1\r\n\r\nGET /x HTTP/1.1\r\n";
        let (head, len) = complete(req);
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.target, "/assets/v1/s/amd64/kernel");
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.headers["host"], "10.0.0.1");
        assert_eq!(head.body_len, 0);
        assert!(head.keep_alive());
        assert_eq!(&req[len..], b"GET /x HTTP/1.1\r\n");
    }

    #[test]
    fn refusals_name_their_status() {
        let l = HeadLimits::default();
        let p = |b: &[u8]| parse_head(b, &l).map(|_| ()).unwrap_err();
        assert_eq!(p(b"\x16\x03\x01 hello\r\n\r\n").status(), 400);
        assert_eq!(p(b"GET / HTTP/2.0\r\n\r\n").status(), 400);
        assert_eq!(
            p(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").status(),
            411
        );
        assert_eq!(
            p(b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n").status(),
            400
        );
        assert_eq!(
            p(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n").status(),
            400
        );
        assert_eq!(
            p(b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n").status(),
            413
        );
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(40_000));
        assert_eq!(p(long.as_bytes()).status(), 431);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X{i}: y\r\n")).collect();
        assert_eq!(
            p(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()).status(),
            431
        );
        // The same value repeated is one value.
        let (h, _) = complete(b"POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\nab");
        assert_eq!(h.body_len, 2);
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_header() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::CONNECTION, HeaderValue::from_str(v).unwrap());
            m
        };
        let none = HeaderMap::new();
        assert!(keep_alive(Version::HTTP_11, &none));
        assert!(!keep_alive(Version::HTTP_11, &h("close")));
        assert!(!keep_alive(Version::HTTP_11, &h("Keep-Alive, Close")));
        assert!(!keep_alive(Version::HTTP_10, &none));
        assert!(keep_alive(Version::HTTP_10, &h("Keep-Alive")));
        assert_eq!(
            Persistence::of(Version::HTTP_10, true),
            Persistence::KeepAlive10
        );
        assert_eq!(
            Persistence::of(Version::HTTP_11, true),
            Persistence::KeepAlive
        );
        assert_eq!(Persistence::of(Version::HTTP_11, false), Persistence::Close);
    }

    #[test]
    fn expect_continue_only_for_a_body() {
        let (h, _) =
            complete(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
        assert!(h.expects_continue());
        let (h, _) = complete(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n");
        assert!(!h.expects_continue());
    }

    #[test]
    fn the_header_clock_is_a_total_and_idle_turns_into_header_at_the_first_byte() {
        let t = Timeouts {
            header: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        };
        let t0 = Instant::now();
        let mut c = ReadClock::fresh(t0, &t);
        // More bytes of the same head do not move the deadline.
        c.bytes_arrived(t0 + Duration::from_secs(9), &t);
        assert_eq!(c.deadline, t0 + Duration::from_secs(10));
        assert_eq!(c.kind, TimeoutKind::Header);

        let mut c = ReadClock::next_request(t0, &t, false);
        assert_eq!((c.kind, c.deadline), (TimeoutKind::Idle, t0 + t.idle));
        c.bytes_arrived(t0 + Duration::from_secs(30), &t);
        assert_eq!(
            (c.kind, c.deadline),
            (TimeoutKind::Header, t0 + Duration::from_secs(40))
        );
        let c = ReadClock::next_request(t0, &t, true);
        assert_eq!((c.kind, c.deadline), (TimeoutKind::Header, t0 + t.header));
    }

    #[test]
    fn framing_of_head_304_and_bodies() {
        let ok = StatusCode::OK;
        assert_eq!(framing(&Method::GET, ok, Some(9), Some(9)), (Some(9), true));
        assert_eq!(framing(&Method::GET, ok, None, Some(3)), (Some(3), true));
        assert_eq!(
            framing(&Method::HEAD, ok, Some(9), Some(0)),
            (Some(9), false)
        );
        assert_eq!(framing(&Method::HEAD, ok, None, Some(5)), (Some(5), false));
        assert_eq!(
            framing(&Method::GET, StatusCode::NOT_MODIFIED, None, Some(0)),
            (None, false)
        );
        assert_eq!(
            framing(&Method::GET, StatusCode::NO_CONTENT, None, Some(0)),
            (None, false)
        );
    }

    #[test]
    fn response_heads_replace_framing_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("1"));
        h.insert(header::ETAG, HeaderValue::from_static("\"x\""));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        let d = "Tue, 01 Dec 2026 14:00:00 GMT";
        let out = response_head(
            StatusCode::PARTIAL_CONTENT,
            &h,
            d,
            Some(7),
            Persistence::Close,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 206 Partial Content\r\netag: \"x\"\r\ncontent-length: 7\r\nconnection: close\r\ndate: Tue, 01 Dec 2026 14:00:00 GMT\r\n\r\n"
        );
        let t = time::OffsetDateTime::from_unix_timestamp(1_796_133_600).unwrap();
        assert_eq!(http_date(t), "Tue, 01 Dec 2026 14:00:00 GMT");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_head(&buf, &HeadLimits::default());
        }

        #[test]
        fn a_head_split_anywhere_is_partial_until_whole(cut in 0usize..90) {
            let req = b"GET /boot.ipxe?mac=bc:24:11:40:00:01 HTTP/1.1\r\nHost: a\r\nRange: bytes=0-9\r\n\r\n";
            let cut = cut.min(req.len() - 1);
            prop_assert!(matches!(parse_head(&req[..cut], &HeadLimits::default()), Ok(Parsed::Partial)));
            let (head, len) = complete(req);
            prop_assert_eq!(len, req.len());
            prop_assert_eq!(&head.headers["range"], "bytes=0-9");
        }
    }
}
