//! End-to-end tests of the server on loopback: a client socket talking to a running
//! [`TftpServer`], asserting what comes back on the wire and the reported events.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::packet::{ErrorCode, Mode, Options, Packet};
use super::{ServerError, TftpConfig, TftpServer, TransferEvent, TransferOutcome};

/// A server running on a test socket, stopped when dropped.
struct Running {
    addr: SocketAddr,
    cancel: CancellationToken,
    handle: Option<JoinHandle<Result<(), ServerError>>>,
    events: mpsc::Receiver<TransferEvent>,
    _root: tempfile::TempDir,
}

impl Running {
    async fn start(config: TftpConfig, bind: &str, files: &[(&str, Vec<u8>)]) -> Running {
        let root = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            let path = root.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        let (tx, events) = mpsc::channel(64);
        let server = TftpServer::new(config, root.path())
            .unwrap()
            .with_events(tx);
        let socket = TftpServer::bind(bind.parse().unwrap()).await.unwrap();
        let addr = socket.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(server.serve(socket, cancel.clone()));
        Running {
            addr,
            cancel,
            handle: Some(handle),
            events,
            _root: root,
        }
    }

    /// The server's address as seen by a loopback client.
    fn target(&self, ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), self.addr.port())
    }

    async fn next_event(&mut self) -> TransferEvent {
        tokio::time::timeout(Duration::from_secs(30), self.events.recv())
            .await
            .expect("no transfer event within 30 s")
            .expect("event channel closed")
    }

    async fn stop(mut self) {
        self.cancel.cancel();
        let handle = self.handle.take().unwrap();
        handle.await.unwrap().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

async fn client() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.unwrap()
}

fn rrq(name: &str, options: Options) -> Vec<u8> {
    Packet::Rrq {
        filename: name.into(),
        mode: Mode::Octet,
        options,
    }
    .to_bytes()
}

fn ack(block: u16) -> Vec<u8> {
    Packet::Ack { block }.to_bytes()
}

async fn recv(sock: &UdpSocket) -> (Packet, SocketAddr) {
    let mut buf = vec![0u8; 70_000];
    let (n, from) = tokio::time::timeout(Duration::from_secs(10), sock.recv_from(&mut buf))
        .await
        .expect("no reply from the TFTP server within 10 s")
        .unwrap();
    (Packet::parse(&buf[..n]).unwrap(), from)
}

type Fetched = Result<(Vec<u8>, Option<Options>), (ErrorCode, String)>;

/// A minimal windowed client (no loss handling: loopback does not lose packets).
async fn fetch(sock: &UdpSocket, server: SocketAddr, name: &str, options: Options) -> Fetched {
    sock.send_to(&rrq(name, options), server).await.unwrap();
    let (first, tid) = recv(sock).await;
    assert_eq!(
        tid.ip(),
        server.ip(),
        "the reply must come from the address the request was sent to"
    );
    let (mut blksize, mut window, mut oack) = (512usize, 1u16, None);
    let mut pending = None;
    match first {
        Packet::Oack { options } => {
            blksize = options.blksize.map_or(512, usize::from);
            window = options.windowsize.unwrap_or(1);
            oack = Some(options);
            sock.send_to(&ack(0), tid).await.unwrap();
        }
        Packet::Error { code, message } => return Err((code, message)),
        data @ Packet::Data { .. } => pending = Some(data),
        other => panic!("unexpected first reply {other:?}"),
    }
    let (mut file, mut expected, mut in_window) = (Vec::new(), 1u16, 0u16);
    loop {
        let packet = match pending.take() {
            Some(p) => p,
            None => {
                let (p, from) = recv(sock).await;
                assert_eq!(from, tid, "reply from a different transfer ID");
                p
            }
        };
        match packet {
            Packet::Data { block, data } => {
                assert_eq!(block, expected, "out-of-order block on loopback");
                let last = data.len() < blksize;
                file.extend_from_slice(&data);
                expected = expected.wrapping_add(1);
                in_window += 1;
                if last || in_window == window {
                    sock.send_to(&ack(block), tid).await.unwrap();
                    in_window = 0;
                }
                if last {
                    return Ok((file, oack));
                }
            }
            Packet::Error { code, message } => return Err((code, message)),
            other => panic!("unexpected packet {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_fixed_set_is_served_by_name_and_nothing_else() {
    // Debian 12: /usr/lib/ipxe/ipxe.efi -> /boot/ipxe.efi, outside the directory.
    let boot = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let efi = pattern(3000);
    std::fs::write(boot.path().join("ipxe.efi"), &efi).unwrap();
    std::fs::write(boot.path().join("secret"), b"not yours").unwrap();
    std::os::unix::fs::symlink(boot.path().join("ipxe.efi"), dir.path().join("ipxe.efi")).unwrap();
    std::os::unix::fs::symlink(boot.path().join("secret"), dir.path().join("secret")).unwrap();
    std::fs::write(dir.path().join("other.bin"), b"x").unwrap();
    let files = crate::firststage::FirstStage::load(
        dir.path(),
        &std::collections::BTreeSet::from(["ipxe.efi"]),
    )
    .unwrap();
    let (tx, mut events) = mpsc::channel(16);
    let server = TftpServer::with_files(TftpConfig::default(), Arc::new(files))
        .unwrap()
        .with_events(tx);
    let socket = TftpServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = socket.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(server.serve(socket, cancel.clone()));
    let sock = client().await;
    let (got, _) = fetch(&sock, addr, "ipxe.efi", Options::default())
        .await
        .unwrap();
    assert_eq!(got, efi);
    for (name, code) in [
        ("secret", ErrorCode::FileNotFound),
        ("other.bin", ErrorCode::FileNotFound),
        ("snponly.efi", ErrorCode::FileNotFound),
        ("./ipxe.efi", ErrorCode::FileNotFound),
        ("../ipxe.efi", ErrorCode::AccessViolation),
        ("/boot/ipxe.efi", ErrorCode::AccessViolation),
    ] {
        let err = fetch(&sock, addr, name, Options::default())
            .await
            .unwrap_err();
        assert_eq!(err.0, code, "{name}");
    }
    let mut outcomes = Vec::new();
    for _ in 0..7 {
        outcomes.push(events.recv().await.unwrap().outcome.label());
    }
    assert_eq!(outcomes[0], "completed");
    assert!(
        outcomes[1..].iter().all(|o| *o == "refused"),
        "{outcomes:?}"
    );
    cancel.cancel();
    handle.await.unwrap().unwrap();
}

#[test]
fn config_validation_names_the_field() {
    assert!(TftpConfig::default().validate().is_ok());
    let bad = TftpConfig {
        max_blksize: 7,
        ..TftpConfig::default()
    };
    let err = bad.validate().unwrap_err().to_string();
    assert!(err.contains("max_blksize") && err.contains("MTU"), "{err}");
    let bad = TftpConfig {
        max_transfers: 0,
        ..TftpConfig::default()
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("max_transfers")
    );
}

#[test]
fn missing_root_is_an_actionable_error() {
    let err = TftpServer::new(TftpConfig::default(), "/nonexistent/tftp-root")
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/tftp-root"), "{err}");
}

#[tokio::test]
async fn uefi_size_probe_then_real_request_from_the_same_port() {
    let file = pattern(100_000);
    let mut server = Running::start(
        TftpConfig::default(),
        "127.0.0.1:0",
        &[("ipxe.efi", file.clone())],
    )
    .await;
    let sock = client().await;
    // What OVMF sends first: tsize probe with blksize and windowsize.
    let probe = Options {
        tsize: Some(0),
        blksize: Some(1468),
        windowsize: Some(4),
        ..Options::default()
    };
    sock.send_to(&rrq("ipxe.efi", probe), server.addr)
        .await
        .unwrap();
    let (oack, tid) = recv(&sock).await;
    assert_eq!(
        oack,
        Packet::Oack {
            options: Options {
                blksize: Some(1468),
                timeout: None,
                tsize: Some(100_000),
                windowsize: Some(4),
            }
        }
    );
    assert_ne!(tid, server.addr, "transfer must use its own port");
    let abort = Packet::Error {
        code: ErrorCode::OptionNegotiation,
        message: "User aborted the transfer".into(),
    };
    sock.send_to(&abort.to_bytes(), tid).await.unwrap();
    let event = server.next_event().await;
    assert_eq!(
        event.outcome,
        TransferOutcome::PeerAborted {
            code: ErrorCode::OptionNegotiation,
            message: "User aborted the transfer".into()
        }
    );
    assert_eq!(event.bytes, 0);

    // The real request, from the same source port, right away.
    let real = Options {
        blksize: Some(1468),
        windowsize: Some(4),
        ..Options::default()
    };
    let (got, _) = fetch(&sock, server.addr, "ipxe.efi", real).await.unwrap();
    assert_eq!(got, file);
    let event = server.next_event().await;
    assert_eq!(event.outcome, TransferOutcome::Completed);
    assert_eq!(event.bytes, 100_000);
    assert_eq!(event.file, "ipxe.efi");
    assert_eq!(event.peer, sock.local_addr().unwrap());
    server.stop().await;
}

#[tokio::test]
async fn blksize_is_capped_and_files_arrive_intact() {
    let config = TftpConfig {
        max_blksize: 1000,
        ..TftpConfig::default()
    };
    let files = [
        ("big", pattern(50_000)),
        ("exact", pattern(4000)),
        ("empty", Vec::new()),
        ("sub/file", b"nested".to_vec()),
    ];
    let mut server = Running::start(config, "127.0.0.1:0", &files).await;
    let sock = client().await;
    let ask = Options {
        blksize: Some(8192),
        tsize: Some(0),
        ..Options::default()
    };
    let (got, oack) = fetch(&sock, server.addr, "big", ask).await.unwrap();
    assert_eq!(got, files[0].1);
    let oack = oack.unwrap();
    assert_eq!(oack.blksize, Some(1000));
    assert_eq!(oack.tsize, Some(50_000));
    for (name, bytes) in &files[1..] {
        let (got, oack) = fetch(&sock, server.addr, name, Options::default())
            .await
            .unwrap();
        assert_eq!(&got, bytes, "{name}");
        assert_eq!(oack, None, "no options asked, no OACK");
    }
    for _ in 0..files.len() {
        assert_eq!(
            server.next_event().await.outcome,
            TransferOutcome::Completed
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn refusals_get_tftp_errors() {
    let mut server = Running::start(
        TftpConfig::default(),
        "127.0.0.1:0",
        &[("ipxe.efi", pattern(10))],
    )
    .await;
    let sock = client().await;
    for (name, code) in [
        ("../etc/passwd", ErrorCode::AccessViolation),
        ("/etc/passwd", ErrorCode::AccessViolation),
        ("..\\ipxe.efi", ErrorCode::AccessViolation),
        ("nope.efi", ErrorCode::FileNotFound),
    ] {
        let err = fetch(&sock, server.addr, name, Options::default())
            .await
            .unwrap_err();
        assert_eq!(err.0, code, "{name}");
        let event = server.next_event().await;
        assert!(
            matches!(event.outcome, TransferOutcome::Refused { code: c, .. } if c == code),
            "{name}: {:?}",
            event.outcome
        );
    }

    let wrq = Packet::Wrq {
        filename: "ipxe.efi".into(),
        mode: Mode::Octet,
        options: Options::default(),
    };
    sock.send_to(&wrq.to_bytes(), server.addr).await.unwrap();
    let (reply, _) = recv(&sock).await;
    assert!(matches!(
        reply,
        Packet::Error {
            code: ErrorCode::AccessViolation,
            ..
        }
    ));
    assert!(matches!(
        server.next_event().await.outcome,
        TransferOutcome::Refused {
            code: ErrorCode::AccessViolation,
            ..
        }
    ));

    let netascii = Packet::Rrq {
        filename: "ipxe.efi".into(),
        mode: Mode::Netascii,
        options: Options::default(),
    };
    sock.send_to(&netascii.to_bytes(), server.addr)
        .await
        .unwrap();
    let (reply, _) = recv(&sock).await;
    let Packet::Error { code, message } = reply else {
        panic!("expected ERROR, got {reply:?}");
    };
    assert_eq!(code, ErrorCode::NotDefined);
    assert!(message.contains("octet"), "{message}");
    server.stop().await;
}

#[tokio::test]
async fn malformed_and_stray_packets_are_not_answered() {
    let server = Running::start(TftpConfig::default(), "127.0.0.1:0", &[("f", pattern(700))]).await;
    let sock = client().await;
    // Garbage, a stray ACK and a truncated request: all dropped without a reply, so the
    // first packet back is the DATA of the valid request that follows.
    for junk in [&b"\x00\x09zz"[..], &ack(3), b"\x00\x01f"] {
        sock.send_to(junk, server.addr).await.unwrap();
    }
    let (got, _) = fetch(&sock, server.addr, "f", Options::default())
        .await
        .unwrap();
    assert_eq!(got, pattern(700));
    server.stop().await;
}

#[tokio::test]
async fn wildcard_listener_replies_from_the_address_the_client_used() {
    // Needs IP_PKTINFO: without it the transfer socket would bind 0.0.0.0 and the kernel
    // would answer a request to 127.0.0.2 from 127.0.0.1.
    let mut server =
        Running::start(TftpConfig::default(), "0.0.0.0:0", &[("f", pattern(100))]).await;
    for ip in ["127.0.0.2", "127.0.0.1", "127.0.0.3"] {
        let sock = client().await;
        sock.send_to(&rrq("f", Options::default()), server.target(ip))
            .await
            .unwrap();
        let (reply, from) = recv(&sock).await;
        assert_eq!(from.ip().to_string(), ip);
        assert!(matches!(reply, Packet::Data { block: 1, .. }));
        sock.send_to(&ack(1), from).await.unwrap();
        let event = server.next_event().await;
        assert_eq!(event.outcome, TransferOutcome::Completed);
        assert_eq!(event.local.to_string(), ip);
    }
    server.stop().await;
}

#[tokio::test]
async fn dual_stack_listener_serves_ipv4_and_ipv6_from_the_right_address() {
    // An IPv6 wildcard listener also receives IPv4 (as ::ffff:a.b.c.d); IPv4 clients must
    // still be answered from a plain IPv4 socket on the address they asked.
    let mut server = Running::start(TftpConfig::default(), "[::]:0", &[("f", pattern(600))]).await;
    for (bind, ip) in [("127.0.0.1:0", "127.0.0.2"), ("[::1]:0", "::1")] {
        let sock = UdpSocket::bind(bind).await.unwrap();
        let (got, _) = fetch(&sock, server.target(ip), "f", Options::default())
            .await
            .unwrap();
        assert_eq!(got, pattern(600));
        let event = server.next_event().await;
        assert_eq!(event.outcome, TransferOutcome::Completed);
        assert_eq!(event.local.to_string(), ip);
        assert_eq!(event.peer, sock.local_addr().unwrap());
    }
    server.stop().await;
}

#[tokio::test]
async fn over_the_cap_requests_are_dropped_and_reported() {
    let config = TftpConfig {
        max_transfers: 1,
        ..TftpConfig::default()
    };
    let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(3000))]).await;
    let holder = client().await;
    let probe = Options {
        tsize: Some(0),
        ..Options::default()
    };
    holder.send_to(&rrq("f", probe), server.addr).await.unwrap();
    let (_oack, tid) = recv(&holder).await;

    let second = client().await;
    second
        .send_to(&rrq("f", Options::default()), server.addr)
        .await
        .unwrap();
    let event = server.next_event().await;
    assert_eq!(event.outcome, TransferOutcome::Busy);
    assert_eq!(event.peer, second.local_addr().unwrap());

    let abort = Packet::Error {
        code: ErrorCode::OptionNegotiation,
        message: String::new(),
    };
    holder.send_to(&abort.to_bytes(), tid).await.unwrap();
    assert!(matches!(
        server.next_event().await.outcome,
        TransferOutcome::PeerAborted { .. }
    ));
    // The slot is free again: the retried request is served.
    let (got, _) = fetch(&second, server.addr, "f", Options::default())
        .await
        .unwrap();
    assert_eq!(got, pattern(3000));
    server.stop().await;
}

#[tokio::test]
async fn silent_client_is_retried_then_dropped() {
    let config = TftpConfig {
        default_timeout: Duration::from_millis(20),
        max_retries: 2,
        ..TftpConfig::default()
    };
    let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(2000))]).await;
    let sock = client().await;
    sock.send_to(&rrq("f", Options::default()), server.addr)
        .await
        .unwrap();
    // The first block, two retransmissions of it, then ERROR.
    for _ in 0..3 {
        let (p, _) = recv(&sock).await;
        assert!(matches!(p, Packet::Data { block: 1, .. }), "{p:?}");
    }
    let (p, _) = recv(&sock).await;
    assert!(matches!(p, Packet::Error { .. }), "{p:?}");
    assert_eq!(
        server.next_event().await.outcome,
        TransferOutcome::TimedOut { retries: 2 }
    );
    server.stop().await;
}

#[tokio::test]
async fn deadline_ends_a_transfer() {
    // The retransmission timer is far longer than the deadline, so the deadline fires.
    let config = TftpConfig {
        default_timeout: Duration::from_secs(60),
        transfer_deadline: Duration::from_millis(200),
        ..TftpConfig::default()
    };
    let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(2000))]).await;
    let sock = client().await;
    sock.send_to(&rrq("f", Options::default()), server.addr)
        .await
        .unwrap();
    let (p, _) = recv(&sock).await;
    assert!(matches!(p, Packet::Data { block: 1, .. }));
    let (p, _) = recv(&sock).await;
    let Packet::Error { message, .. } = p else {
        panic!("expected ERROR, got {p:?}");
    };
    assert!(message.contains("deadline"), "{message}");
    assert_eq!(
        server.next_event().await.outcome,
        TransferOutcome::DeadlineExceeded
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_ends_transfers_and_returns() {
    let config = TftpConfig {
        default_timeout: Duration::from_secs(60),
        ..TftpConfig::default()
    };
    let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(2000))]).await;
    let sock = client().await;
    sock.send_to(&rrq("f", Options::default()), server.addr)
        .await
        .unwrap();
    let (p, _) = recv(&sock).await;
    assert!(matches!(p, Packet::Data { block: 1, .. }));
    server.cancel.cancel();
    let (p, _) = recv(&sock).await;
    let Packet::Error { message, .. } = p else {
        panic!("expected ERROR, got {p:?}");
    };
    assert!(message.contains("shutting down"), "{message}");
    assert_eq!(
        server.next_event().await.outcome,
        TransferOutcome::Cancelled
    );
    server.stop().await;
}
