//! talboot's HTTP/1.1 server: the socket adapter around [`super::conn`]. It owns the accept
//! loop (the connection cap), every connection's timeouts, and how a response's bytes reach
//! the socket; what to answer is the axum [`Router`]'s business, called per request.
//!
//! hyper cannot hand a body to `sendfile(2)`, and boot artifacts are most of the bytes talboot
//! sends, so talboot parses request heads itself (`httparse`, the parser hyper uses) and writes
//! responses itself. A response that carries a [`FileBody`] extension (see
//! [`super::assets::respond`]) is sent with `sendfile(2)` from the file to the socket, without
//! a userspace copy; a response marked [`Streamed`] (the admin listener's server-sent events)
//! is written as its body produces bytes, until the body ends, the client goes or shutdown;
//! every other response body is small (scripts, configs, JSON, metrics, the iPXE binaries)
//! and is collected and written with its head.
//!
//! Limits, all from `serve`'s flags ([`Limits`]): a connection must deliver each request head
//! within the header timeout (a total, so trickling bytes does not help), may sit idle between
//! requests for the idle timeout, and a response write that makes no progress for the idle
//! timeout ends the connection. At most `max_connections` are served at once; the next one is
//! accepted, counted (`talboot_http_connections_over_cap_total`), logged, and held unread
//! until a slot frees, and the ones after it wait in the kernel's listen backlog.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, Response, StatusCode, header};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::conn::{
    self, HeadLimits, Parsed, Persistence, ReadClock, RequestHead, TimeoutKind, Timeouts,
};

/// The largest body collected in memory for a non-file response (the iPXE binaries are the
/// largest, about 1 MiB).
const MAX_COLLECTED_BODY: usize = 64 * 1024 * 1024;

/// A response body that is a slice of an open file, sent with `sendfile(2)`. Put in the
/// response's extensions by the handler, beside an ordinary streaming body of the same bytes
/// (which servers other than this one, and tests calling the router directly, read instead).
#[derive(Debug, Clone)]
pub(crate) struct FileBody {
    /// The open file.
    pub file: Arc<std::fs::File>,
    /// First byte.
    pub(crate) offset: u64,
    /// Number of bytes.
    pub len: u64,
}

/// Marks a response whose body is a live stream (server-sent events): it is sent as the body
/// produces it, framed by closing the connection (RFC 9112 §6.3, the last rule), and it ends
/// at shutdown so a watching browser does not hold `serve` open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Streamed;

/// Connection limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Header and idle timeouts.
    pub timeouts: Timeouts,
    /// Connections served at once.
    pub max_connections: usize,
    /// Request size limits.
    pub head: HeadLimits,
    /// The most one `sendfile(2)` call is asked to send, so one fast client does not hold a
    /// worker thread for a whole initramfs.
    pub sendfile_chunk: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeouts: Timeouts {
                header: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS),
                idle: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS),
            },
            max_connections: DEFAULT_MAX_CONNECTIONS,
            head: HeadLimits::default(),
            sendfile_chunk: 1024 * 1024,
        }
    }
}

/// Default header timeout (nginx's `client_header_timeout` is 60 s; a boot request head is one
/// packet).
pub(crate) const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;
/// Default idle timeout (nginx's `keepalive_timeout` is 75 s).
pub(crate) const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 60;
/// Default connection cap (nginx's `worker_connections` is 512 per worker). A connection
/// costs a task and a 4 KiB read buffer; artifact bodies take no userspace memory.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Serve `router` on `listener` with `limits` until `shutdown` is cancelled, then finish the
/// responses in progress and return. `name` labels the metrics and logs (`provisioning`,
/// `admin`).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    name: &'static str,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let tracker = TaskTracker::new();
    let mut last_cap_log: Option<Instant> = None;
    let mut over_cap_since_log = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning on the error.
                tracing::warn!(listener = name, error = %e, "cannot accept an HTTP connection");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                metrics::counter!("talboot_http_connections_over_cap_total", "listener" => name)
                    .increment(1);
                over_cap_since_log += 1;
                if last_cap_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!(
                        listener = name,
                        max_connections = limits.max_connections,
                        over_cap = over_cap_since_log,
                        "HTTP connection cap reached; new connections wait until one closes \
                         (raise --http-max-connections)"
                    );
                    last_cap_log = Some(Instant::now());
                    over_cap_since_log = 0;
                }
                // Hold this one unread; the next ones stay in the listen backlog meanwhile.
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                }
            }
        };
        let router = router.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            metrics::gauge!("talboot_http_connections_open", "listener" => name).increment(1.0);
            metrics::counter!("talboot_http_connections_total", "listener" => name).increment(1);
            if let Err(e) = connection(stream, peer, router, limits, name, shutdown).await {
                tracing::debug!(listener = name, %peer, error = %e, "HTTP connection ended");
            }
            metrics::gauge!("talboot_http_connections_open", "listener" => name).decrement(1.0);
            drop(permit);
        });
    }
    tracker.close();
    tracker.wait().await;
    Ok(())
}

fn now_date() -> String {
    conn::http_date(time::OffsetDateTime::now_utc())
}

fn timed_out(name: &'static str, kind: TimeoutKind) {
    let phase = match kind {
        TimeoutKind::Header => "header",
        TimeoutKind::Idle => "idle",
    };
    metrics::counter!("talboot_http_timeouts_total", "listener" => name, "phase" => phase)
        .increment(1);
}

/// Serve one connection until the client closes it, a limit ends it, or shutdown.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: Limits,
    name: &'static str,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let t = limits.timeouts;
    let c = Conn {
        peer,
        limits: &limits,
        name,
        shutdown: &shutdown,
    };
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut clock = ReadClock::fresh(Instant::now(), &t);
    loop {
        let Some(head) = read_head(&c, &mut stream, &mut buf, &mut clock).await? else {
            return Ok(());
        };
        // Its body (only the admin API's POSTs have one), under the same clock.
        let body_len = head.body_len as usize;
        if buf.len() < body_len && head.expects_continue() {
            write_timed(&mut stream, b"HTTP/1.1 100 Continue\r\n\r\n", t.idle).await?;
        }
        if !read_body(&c, &mut stream, &mut buf, &clock, body_len).await? {
            return Ok(());
        }
        let body: Vec<u8> = buf.drain(..body_len).collect();
        let keep = head.keep_alive() && !shutdown.is_cancelled();
        let persistence = Persistence::of(head.version, keep);
        let method = head.method.clone();
        let response = match request(head, body, peer) {
            Ok(req) => match router.clone().oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            },
            Err(status) => {
                write_timed(
                    &mut stream,
                    &conn::error_response(status, &now_date()),
                    t.idle,
                )
                .await?;
                return Ok(());
            }
        };
        let persistence = persistence_after(&response, persistence);
        write_response(
            &mut stream,
            &method,
            response,
            persistence,
            &limits,
            &shutdown,
        )
        .await?;
        if persistence == Persistence::Close {
            let _ = stream.shutdown().await;
            return Ok(());
        }
        clock = ReadClock::next_request(Instant::now(), &t, !buf.is_empty());
    }
}

/// What every step of one connection reads.
struct Conn<'a> {
    peer: SocketAddr,
    limits: &'a Limits,
    name: &'static str,
    shutdown: &'a CancellationToken,
}

/// The next request head, read into `buf` and taken off it; `None` once the connection is
/// over (closed, timed out, or a bad request answered).
async fn read_head(
    c: &Conn<'_>,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    clock: &mut ReadClock,
) -> std::io::Result<Option<RequestHead>> {
    let t = &c.limits.timeouts;
    loop {
        match conn::parse_head(buf, &c.limits.head) {
            Ok(Parsed::Complete { head, len }) => {
                buf.drain(..len);
                return Ok(Some(head));
            }
            Ok(Parsed::Partial) => {}
            Err(e) => {
                tracing::debug!(listener = c.name, peer = %c.peer, error = %e, "bad HTTP request");
                let _ = write_timed(
                    stream,
                    &conn::error_response(e.status(), &now_date()),
                    t.idle,
                )
                .await;
                return Ok(None);
            }
        }
        match read_more(stream, buf, clock, c.shutdown).await? {
            Read::Bytes => clock.bytes_arrived(Instant::now(), t),
            Read::Closed => return Ok(None),
            Read::Timeout => {
                timed_out(c.name, clock.kind);
                if clock.kind == TimeoutKind::Header && !buf.is_empty() {
                    // A half-sent request gets told why (RFC 9110 §15.5.9).
                    let out = conn::error_response(StatusCode::REQUEST_TIMEOUT, &now_date());
                    let _ = stream.try_write(&out);
                }
                return Ok(None);
            }
        }
    }
}

/// Reads until `buf` holds `body_len` bytes; false once the connection is over.
async fn read_body(
    c: &Conn<'_>,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    clock: &ReadClock,
    body_len: usize,
) -> std::io::Result<bool> {
    while buf.len() < body_len {
        match read_more(stream, buf, clock, c.shutdown).await? {
            Read::Bytes => {}
            Read::Closed => return Ok(false),
            Read::Timeout => {
                timed_out(c.name, clock.kind);
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// A response that says `Connection: close`, or streams, ends the connection.
fn persistence_after(response: &Response<Body>, persistence: Persistence) -> Persistence {
    if response
        .headers()
        .get(header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
        || response.extensions().get::<Streamed>().is_some()
    {
        Persistence::Close
    } else {
        persistence
    }
}

/// The router's request for `head`, or the status to refuse it with.
fn request(
    head: RequestHead,
    body: Vec<u8>,
    peer: SocketAddr,
) -> Result<Request<Body>, StatusCode> {
    let uri: axum::http::Uri = head.target.parse().map_err(|_| StatusCode::BAD_REQUEST)?;
    let mut req = Request::new(Body::from(body));
    *req.method_mut() = head.method;
    *req.uri_mut() = uri;
    *req.version_mut() = head.version;
    *req.headers_mut() = head.headers;
    req.extensions_mut().insert(ConnectInfo(peer));
    Ok(req)
}

enum Read {
    Bytes,
    Closed,
    Timeout,
}

/// Read what is there into `buf`, until `clock` runs out. Shutdown ends a connection only
/// between requests (nothing buffered); a request in progress is finished.
async fn read_more(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    clock: &ReadClock,
    shutdown: &CancellationToken,
) -> std::io::Result<Read> {
    let between_requests = buf.is_empty();
    let read = async {
        match tokio::time::timeout_at(clock.deadline.into(), stream.read_buf(buf)).await {
            Ok(Ok(0)) => Ok(Read::Closed),
            Ok(Ok(_)) => Ok(Read::Bytes),
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(Read::Timeout),
        }
    };
    if between_requests {
        tokio::select! {
            r = read => r,
            _ = shutdown.cancelled() => Ok(Read::Closed),
        }
    } else {
        read.await
    }
}

/// Write all of `bytes`, failing when a write makes no progress for `stall`.
async fn write_timed(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    stall: Duration,
) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let n = tokio::time::timeout(stall, stream.write(bytes))
            .await
            .map_err(|_| stalled())??;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
    }
    Ok(())
}

fn stalled() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the client took nothing for the idle timeout",
    )
}

async fn write_response(
    stream: &mut TcpStream,
    method: &Method,
    response: Response<Body>,
    persistence: Persistence,
    limits: &Limits,
    shutdown: &CancellationToken,
) -> std::io::Result<()> {
    let stall = limits.timeouts.idle;
    let (parts, body) = response.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let date = now_date();
    if let Some(file) = parts.extensions.get::<FileBody>() {
        drop(body);
        let (length, send) = conn::framing(method, parts.status, declared, Some(file.len));
        let head = conn::response_head(parts.status, &parts.headers, &date, length, persistence);
        if !send || file.len == 0 {
            return write_timed(stream, &head, stall).await;
        }
        // The head goes with MSG_MORE so it leaves in one segment with the file's first bytes.
        send_more(stream, &head, stall).await?;
        return send_file(stream, file, limits.sendfile_chunk, stall).await;
    }
    if parts.extensions.get::<Streamed>().is_some() {
        let head = conn::response_head(parts.status, &parts.headers, &date, None, persistence);
        write_timed(stream, &head, stall).await?;
        if *method == Method::HEAD {
            return Ok(());
        }
        use futures_util::StreamExt;
        let mut data = body.into_data_stream();
        loop {
            let chunk = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                c = data.next() => c,
            };
            match chunk {
                Some(Ok(bytes)) => write_timed(stream, &bytes, stall).await?,
                Some(Err(e)) => return Err(std::io::Error::other(format!("response body: {e}"))),
                None => return Ok(()),
            }
        }
    }
    let size_hint = axum::body::HttpBody::size_hint(&body).exact();
    let bytes = if *method == Method::HEAD {
        drop(body);
        Vec::new()
    } else {
        axum::body::to_bytes(body, MAX_COLLECTED_BODY)
            .await
            .map_err(|e| std::io::Error::other(format!("response body: {e}")))?
            .to_vec()
    };
    let body_len = if *method == Method::HEAD {
        size_hint
    } else {
        Some(bytes.len() as u64)
    };
    let (length, send) = conn::framing(method, parts.status, declared, body_len);
    let mut out = conn::response_head(parts.status, &parts.headers, &date, length, persistence);
    if send {
        out.extend_from_slice(&bytes);
    }
    write_timed(stream, &out, stall).await
}

/// `send(2)` with `MSG_MORE`: the kernel holds the bytes for the `sendfile(2)` that follows.
async fn send_more(stream: &TcpStream, mut bytes: &[u8], stall: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    while !bytes.is_empty() {
        let n = tokio::time::timeout(stall, async {
            loop {
                stream.writable().await?;
                match stream.try_io(Interest::WRITABLE, || {
                    nix::sys::socket::send(
                        stream.as_raw_fd(),
                        bytes,
                        nix::sys::socket::MsgFlags::from_bits_retain(
                            nix::libc::MSG_MORE | nix::libc::MSG_NOSIGNAL,
                        ),
                    )
                    .map_err(std::io::Error::from)
                }) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    r => return r,
                }
            }
        })
        .await
        .map_err(|_| stalled())??;
        bytes = &bytes[n..];
    }
    Ok(())
}

/// `sendfile(2)` `body` to the socket, `chunk` bytes at most per call, waiting for the socket
/// to become writable between calls (tokio's readiness, so other connections run meanwhile).
async fn send_file(
    stream: &TcpStream,
    body: &FileBody,
    chunk: usize,
    stall: Duration,
) -> std::io::Result<()> {
    let mut offset = i64::try_from(body.offset).map_err(std::io::Error::other)?;
    let mut left = body.len;
    while left > 0 {
        let want = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(chunk.max(1));
        let n = tokio::time::timeout(stall, async {
            loop {
                stream.writable().await?;
                match stream.try_io(Interest::WRITABLE, || {
                    nix::sys::sendfile::sendfile64(
                        stream.as_fd(),
                        body.file.as_fd(),
                        Some(&mut offset),
                        want,
                    )
                    .map_err(std::io::Error::from)
                }) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    r => return r,
                }
            }
        })
        .await
        .map_err(|_| stalled())??;
        if n == 0 {
            // The file is shorter than the catalog says: the promised length cannot be kept,
            // so the connection ends (the client sees a short body, never wrong bytes).
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "artifact shorter than its recorded size",
            ));
        }
        left -= n as u64;
    }
    metrics::counter!("talboot_http_sendfile_bytes_total").increment(body.len);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use axum::routing::get;
    use std::io::{Read as _, Write as _};

    /// A bound on any wait in these tests, so a server that never acts fails instead of hanging.
    const LONG: Duration = Duration::from_secs(20);

    fn limits(header_ms: u64, idle_ms: u64, max: usize) -> Limits {
        Limits {
            timeouts: Timeouts {
                header: Duration::from_millis(header_ms),
                idle: Duration::from_millis(idle_ms),
            },
            max_connections: max,
            sendfile_chunk: 4096,
            ..Limits::default()
        }
    }

    struct Running {
        addr: SocketAddr,
        stop: CancellationToken,
        _dir: tempfile::TempDir,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    /// `/hello` answers "hello"; `/file` answers with a [`FileBody`] of bytes 10..20010 of a
    /// file and a different ordinary body, so only the sendfile path gives the right bytes.
    async fn start(limits: Limits) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, file_bytes()).unwrap();
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        let router = Router::new()
            .route("/hello", get(|| async { "hello" }))
            .route(
                "/file",
                get(move || {
                    let file = file.clone();
                    async move {
                        let mut r = "not the file".into_response();
                        r.headers_mut()
                            .insert(header::CONTENT_LENGTH, "20000".parse().unwrap());
                        r.extensions_mut().insert(FileBody {
                            file,
                            offset: 10,
                            len: 20_000,
                        });
                        r
                    }
                }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, router, limits, "test", stop.clone()));
        Running {
            addr,
            stop,
            _dir: dir,
        }
    }

    fn file_bytes() -> Vec<u8> {
        (0..30_000u32).map(|i| (i % 251) as u8).collect()
    }

    fn connect(addr: SocketAddr) -> std::net::TcpStream {
        let s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        s
    }

    /// Everything until the server closes the connection.
    fn read_to_close(s: &mut std::net::TcpStream) -> Vec<u8> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 65536];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
                Err(e) => panic!("the server did not close the connection: {e}"),
            }
        }
    }

    /// One response: its head and `content-length` bytes of body.
    fn read_response(s: &mut std::net::TcpStream) -> (String, Vec<u8>) {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut byte).unwrap(), 1, "closed mid-head: {buf:?}");
            buf.push(byte[0]);
        }
        let head = String::from_utf8(buf).unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        (head, body)
    }

    async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        tokio::task::spawn_blocking(f).await.unwrap()
    }

    #[tokio::test]
    async fn a_slow_header_client_is_cut_at_the_header_timeout_however_it_trickles() {
        let srv = start(limits(300, 60_000, 8)).await;
        let addr = srv.addr;
        let got = blocking(move || {
            let mut s = connect(addr);
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n").unwrap();
            // One more header line every 50 ms, for longer than the header timeout: a
            // per-read timeout would never fire.
            let mut w = s.try_clone().unwrap();
            let trickle = std::thread::spawn(move || {
                for _ in 0..400 {
                    if w.write_all(b"X: y\r\n").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
            let got = read_to_close(&mut s);
            drop(s);
            trickle.join().unwrap();
            got
        })
        .await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{got}");
    }

    /// A streamed response's first bytes arrive while its body is still open (a collected
    /// body would never be sent), the connection closes after it, and shutdown ends it.
    #[tokio::test]
    async fn a_streamed_body_is_sent_as_produced_and_ends_at_shutdown() {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<&'static str, std::convert::Infallible>>(4);
        let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
        let router = Router::new().route(
            "/events",
            get(move || {
                let rx = rx.lock().unwrap().take().expect("one request");
                async move {
                    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
                    let mut r = Response::new(body);
                    r.extensions_mut().insert(Streamed);
                    r
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve(
            listener,
            router,
            limits(5_000, 5_000, 8),
            "test",
            stop.clone(),
        ));
        tx.send(Ok("data: one\n\n")).await.unwrap();
        let (head, first, mut s) = blocking(move || {
            let mut s = connect(addr);
            s.write_all(b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            let (head, _) = read_response(&mut s);
            let mut first = vec![0u8; "data: one\n\n".len()];
            s.read_exact(&mut first).unwrap();
            (head, first, s)
        })
        .await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("connection: close\r\n"), "{head}");
        assert!(!head.contains("content-length"), "{head}");
        assert_eq!(first, b"data: one\n\n");
        // The body is still open (tx lives); shutdown ends the stream and the server.
        stop.cancel();
        let rest = blocking(move || read_to_close(&mut s)).await;
        assert!(rest.is_empty(), "{rest:?}");
        served.await.unwrap().unwrap();
        drop(tx);
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed() {
        let srv = start(limits(300, 60_000, 8)).await;
        let addr = srv.addr;
        let got = blocking(move || read_to_close(&mut connect(addr))).await;
        assert!(got.is_empty(), "{got:?}");
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed_after_serving() {
        let srv = start(limits(60_000, 300, 8)).await;
        let addr = srv.addr;
        let (head, body, rest) = blocking(move || {
            let mut s = connect(addr);
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            let (head, body) = read_response(&mut s);
            (head, body, read_to_close(&mut s))
        })
        .await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        assert_eq!(body, b"hello");
        assert!(rest.is_empty(), "{rest:?}");
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order_and_http10_closes() {
        let srv = start(limits(5_000, 5_000, 8)).await;
        let addr = srv.addr;
        let (a, b, tail) = blocking(move || {
            let mut s = connect(addr);
            s.write_all(
                b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\nHEAD /file HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.0\r\n\r\n",
            )
            .unwrap();
            let a = read_response(&mut s);
            // HEAD: the GET's length, no body (read_response would read it otherwise, so
            // read the head alone).
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).unwrap();
                head.push(byte[0]);
            }
            (a, String::from_utf8(head).unwrap(), read_to_close(&mut s))
        })
        .await;
        assert_eq!(a.1, b"hello");
        assert!(b.starts_with("HTTP/1.1 200 OK\r\n"), "{b}");
        assert!(b.contains("content-length: 20000\r\n"), "{b}");
        let tail = String::from_utf8(tail).unwrap();
        assert!(tail.starts_with("HTTP/1.1 200 OK\r\n"), "{tail}");
        assert!(tail.contains("connection: close\r\n"), "{tail}");
        assert!(tail.ends_with("\r\n\r\nhello"), "{tail}");
    }

    #[tokio::test]
    async fn a_file_body_is_sent_from_the_file_across_several_sendfile_calls() {
        // 20000 bytes with a 4096-byte chunk: five sendfile calls.
        let srv = start(limits(5_000, 5_000, 8)).await;
        let addr = srv.addr;
        let (head, body) = blocking(move || {
            let mut s = connect(addr);
            s.write_all(b"GET /file HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            let r = read_response(&mut s);
            // The connection is still usable after a sendfile body.
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            assert_eq!(read_response(&mut s).1, b"hello");
            r
        })
        .await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert_eq!(body, &file_bytes()[10..20_010]);
    }

    #[tokio::test]
    async fn garbage_gets_400_and_a_close() {
        let srv = start(limits(5_000, 5_000, 8)).await;
        let addr = srv.addr;
        let got = blocking(move || {
            let mut s = connect(addr);
            s.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
                .unwrap();
            read_to_close(&mut s)
        })
        .await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
    }

    #[tokio::test]
    async fn the_connection_over_the_cap_waits_until_one_closes() {
        let srv = start(limits(30_000, 30_000, 2)).await;
        let addr = srv.addr;
        let (waited, got) = blocking(move || {
            let mut a = connect(addr);
            let mut b = connect(addr);
            // Both are being served (each answers), and stay open.
            for s in [&mut a, &mut b] {
                s.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
                assert_eq!(read_response(s).1, b"hello");
            }
            let mut c = connect(addr);
            c.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            // The third is not answered while the two are open...
            c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let mut byte = [0u8; 1];
            let waited = matches!(
                c.read(&mut byte),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
            );
            // ...and is once one closes.
            drop(a);
            c.set_read_timeout(Some(LONG)).unwrap();
            (waited, read_response(&mut c))
        })
        .await;
        assert!(
            waited,
            "the third connection was served beside two at a cap of 2"
        );
        assert_eq!(got.1, b"hello");
    }

    #[tokio::test]
    async fn shutdown_closes_idle_connections_and_returns() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let router = Router::new().route("/hello", get(|| async { "hello" }));
        let server = tokio::spawn(serve(
            listener,
            router,
            limits(60_000, 60_000, 8),
            "test",
            stop.clone(),
        ));
        let s = blocking(move || {
            let mut s = connect(addr);
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            read_response(&mut s);
            s
        })
        .await;
        stop.cancel();
        tokio::time::timeout(LONG, server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let rest = blocking(move || read_to_close(&mut { s })).await;
        assert!(rest.is_empty());
        drop(dir);
    }
}
