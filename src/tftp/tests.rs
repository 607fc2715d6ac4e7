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
        let (tx, events) = mpsc::channel(256);
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
async fn a_full_table_makes_a_request_wait_and_serves_it_when_a_slot_frees() {
    // Before: the request over the cap was dropped and reported Busy, so the client had to
    // wait for its own retransmission timer.
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

    // The table is full: this request waits, and is sent only once.
    let second = client().await;
    second
        .send_to(&rrq("f", Options::default()), server.addr)
        .await
        .unwrap();
    let abort = Packet::Error {
        code: ErrorCode::OptionNegotiation,
        message: String::new(),
    };
    holder.send_to(&abort.to_bytes(), tid).await.unwrap();
    assert!(matches!(
        server.next_event().await.outcome,
        TransferOutcome::PeerAborted { .. }
    ));
    // The slot is free again and the waiting request is served without a resend.
    let (first, tid) = recv(&second).await;
    let Packet::Data { block: 1, data } = first else {
        panic!("expected DATA 1, got {first:?}");
    };
    assert_eq!(data, pattern(3000)[..512]);
    let mut got = data;
    let mut block = 1u16;
    loop {
        second.send_to(&ack(block), tid).await.unwrap();
        if got.len() == 3000 {
            break;
        }
        let (p, _) = recv(&second).await;
        let Packet::Data { block: b, data } = p else {
            panic!("expected DATA, got {p:?}");
        };
        block = b;
        got.extend_from_slice(&data);
    }
    assert_eq!(got, pattern(3000));
    let event = server.next_event().await;
    assert_eq!(event.outcome, TransferOutcome::Completed);
    assert_eq!(event.peer, second.local_addr().unwrap());
    server.stop().await;
}

/// A client on loopback address `ip` (any 127.0.0.0/8 address works on Linux).
async fn client_at(ip: &str) -> UdpSocket {
    UdpSocket::bind((ip, 0)).await.unwrap()
}

#[tokio::test]
async fn a_host_flooding_requests_with_timeout_255_cannot_starve_another_machine() {
    // Issue 12: one host sends 80 read requests with timeout=255 and never acknowledges; with
    // the old fixed 64 slots it held all of them for about 5 minutes and another machine's
    // ipxe.efi request got no answer. The table is the old 64 here, to show the per-client cap
    // and the timeout clamp are what protect the other machine, not a bigger table.
    let config = TftpConfig {
        max_transfers: 64,
        ..TftpConfig::default()
    };
    let efi = pattern(20_000);
    let mut server = Running::start(config, "0.0.0.0:0", &[("ipxe.efi", efi.clone())]).await;
    let hostile = client_at("127.0.0.66").await;
    let greedy = Options {
        timeout: Some(255),
        tsize: Some(0),
        blksize: Some(1468),
        ..Options::default()
    };
    for _ in 0..80 {
        hostile
            .send_to(&rrq("ipxe.efi", greedy), server.target("127.0.0.1"))
            .await
            .unwrap();
    }
    // The host's requests beyond its cap are dropped (and reported) at once.
    let cap = TftpConfig::default().max_per_client;
    for _ in 0..80 - cap {
        let event = server.next_event().await;
        assert_eq!(event.outcome, TransferOutcome::Busy);
        assert_eq!(event.peer, hostile.local_addr().unwrap());
    }
    // The hostile host got OACKs, without the timeout it asked for (RFC 2349: echo it or
    // leave it out; it is clamped to 10 s).
    let (oack, _) = recv(&hostile).await;
    let Packet::Oack { options } = oack else {
        panic!("expected OACK, got {oack:?}");
    };
    assert_eq!(options.timeout, None);
    // Another machine boots.
    let machine = client_at("127.0.0.2").await;
    let real = Options {
        blksize: Some(1468),
        tsize: Some(0),
        ..Options::default()
    };
    let (got, _) = fetch(&machine, server.target("127.0.0.1"), "ipxe.efi", real)
        .await
        .unwrap();
    assert_eq!(got, efi);
    let event = server.next_event().await;
    assert_eq!(event.outcome, TransferOutcome::Completed);
    assert_eq!(event.peer, machine.local_addr().unwrap());
    server.stop().await;
}

#[tokio::test]
async fn stalled_transfers_give_their_slots_to_a_waiting_machine() {
    // The same flood from 80 different addresses (a host can take many on its segment): the
    // per-client cap does not help, the table fills, and the other machine's request waits
    // until the stalled transfers are reclaimed.
    let config = TftpConfig {
        max_transfers: 64,
        reclaim_after: Duration::from_millis(300),
        ..TftpConfig::default()
    };
    let efi = pattern(20_000);
    let mut server = Running::start(config, "0.0.0.0:0", &[("ipxe.efi", efi.clone())]).await;
    let greedy = Options {
        timeout: Some(255),
        tsize: Some(0),
        ..Options::default()
    };
    let mut hosts = Vec::new();
    for i in 1..=80 {
        let host = client_at(&format!("127.0.1.{i}")).await;
        host.send_to(&rrq("ipxe.efi", greedy), server.target("127.0.0.1"))
            .await
            .unwrap();
        hosts.push(host);
    }
    let machine = client_at("127.0.0.2").await;
    let (got, _) = fetch(
        &machine,
        server.target("127.0.0.1"),
        "ipxe.efi",
        Options::default(),
    )
    .await
    .unwrap();
    assert_eq!(got, efi);
    // Among the events: reclaimed hostile transfers, and the machine's completed one.
    let mut reclaimed = 0;
    loop {
        let event = server.next_event().await;
        if event.peer == machine.local_addr().unwrap() {
            assert_eq!(event.outcome, TransferOutcome::Completed);
            break;
        }
        assert_eq!(event.outcome, TransferOutcome::Reclaimed, "{event:?}");
        reclaimed += 1;
    }
    assert!(reclaimed >= 1, "no stalled transfer was reclaimed");
    // A reclaimed client is told so.
    let mut saw_error = false;
    for _ in 0..3 {
        if let (Packet::Error { message, .. }, _) = recv(&hosts[0]).await {
            assert!(message.contains("reclaimed"), "{message}");
            saw_error = true;
            break;
        }
    }
    assert!(saw_error, "the first flooding host got no ERROR");
    server.stop().await;
}

#[tokio::test]
async fn the_per_client_cap_drops_one_hosts_extra_requests_only() {
    let config = TftpConfig {
        max_per_client: 2,
        ..TftpConfig::default()
    };
    let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(3000))]).await;
    let probe = Options {
        tsize: Some(0),
        ..Options::default()
    };
    // Three sockets of the same host: two transfers, the third request is dropped.
    let mut socks = Vec::new();
    for _ in 0..3 {
        let sock = client_at("127.0.0.1").await;
        sock.send_to(&rrq("f", probe), server.addr).await.unwrap();
        socks.push(sock);
    }
    let event = server.next_event().await;
    assert_eq!(event.outcome, TransferOutcome::Busy);
    assert_eq!(event.peer, socks[2].local_addr().unwrap());
    for sock in &socks[..2] {
        let (p, _) = recv(sock).await;
        assert!(matches!(p, Packet::Oack { .. }), "{p:?}");
    }
    // Another host is served meanwhile.
    let other = client_at("127.0.0.2").await;
    let (got, _) = fetch(&other, server.addr, "f", Options::default())
        .await
        .unwrap();
    assert_eq!(got, pattern(3000));
    server.stop().await;
}

#[tokio::test]
async fn a_long_negotiated_timeout_is_clamped() {
    // The client asks for 255 s between retransmissions; the server's limit is 1 s, so the
    // OACK leaves the option out and is resent after 1 s, not 255 s.
    let config = TftpConfig {
        max_timeout: Duration::from_secs(1),
        max_retries: 1,
        ..TftpConfig::default()
    };
    let mut server = Running::start(config, "127.0.0.1:0", &[("f", pattern(2000))]).await;
    let sock = client().await;
    let asked = Options {
        timeout: Some(255),
        tsize: Some(0),
        ..Options::default()
    };
    sock.send_to(&rrq("f", asked), server.addr).await.unwrap();
    for _ in 0..2 {
        let (p, _) = recv(&sock).await;
        let Packet::Oack { options } = p else {
            panic!("expected OACK, got {p:?}");
        };
        assert_eq!(options.timeout, None);
        assert_eq!(options.tsize, Some(2000));
    }
    let (p, _) = recv(&sock).await;
    assert!(matches!(p, Packet::Error { .. }), "{p:?}");
    assert_eq!(
        server.next_event().await.outcome,
        TransferOutcome::TimedOut { retries: 1 }
    );
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
