//! The socket adapter under retransmission and store failure, through a real (loopback)
//! socket and a store double that records every commit: a lease is on disk before its ACK
//! leaves, its timeline event is in the same transaction, and a retransmitted REQUEST is
//! answered from the book without a second write, unless that write had failed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::*;
use crate::events::{EventBus, SystemClock};
use crate::store::{
    self, Backend, CasOutcome, Event, LeaseChange, LeaseCommit, NewEvent, NodeRecord, Store,
    StoreError,
};

/// One call of [`Backend::commit_leases`] that returned Ok, as the double saw it.
#[derive(Debug, Clone)]
struct Commit {
    durable: bool,
    bound: Vec<Ipv4Addr>,
    events: Vec<String>,
}

/// A redb store that records successful lease commits (after a pause, so that a reply sent
/// before its commit returned would reach the client before the record exists) and can be
/// told to fail the next durable one.
struct Recorder {
    inner: store::RedbStore,
    log: Mutex<Vec<Commit>>,
    appended: Mutex<Vec<String>>,
    fail_next_durable: AtomicBool,
    failed: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    /// When set, the next commit says it has started (first) and then waits for the second
    /// to be signalled: the test holds the pipeline still while it fills the receive queue.
    gate: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
}

impl Recorder {
    fn commits(&self) -> Vec<Commit> {
        self.log.lock().unwrap().clone()
    }
}

impl Backend for Recorder {
    fn commit_leases(&self, groups: &[LeaseCommit], durable: bool) -> store::Result<()> {
        let gate = self.gate.lock().unwrap().take();
        if let Some((entered, open)) = gate {
            let _ = entered.send(());
            let _ = open.recv();
        }
        if durable && self.fail_next_durable.swap(false, Ordering::SeqCst) {
            if let Some(tx) = self.failed.lock().unwrap().take() {
                let _ = tx.send(());
            }
            return Err(StoreError::Io {
                file: "recorder".into(),
                source: std::io::Error::other("injected commit failure"),
            });
        }
        self.inner.commit_leases(groups, durable)?;
        std::thread::sleep(Duration::from_millis(100));
        let bound = groups
            .iter()
            .flat_map(|g| &g.writes)
            .filter_map(|w| match w {
                LeaseChange::Upsert(l) if l.state == store::LeaseState::Bound => Some(l.ip),
                _ => None,
            })
            .collect();
        let events = groups
            .iter()
            .flat_map(|g| &g.events)
            .map(|e| e.kind.clone())
            .collect();
        self.log.lock().unwrap().push(Commit {
            durable,
            bound,
            events,
        });
        Ok(())
    }
    fn append_events(&self, events: &[NewEvent]) -> store::Result<Vec<u64>> {
        self.appended
            .lock()
            .unwrap()
            .extend(events.iter().map(|e| e.kind.clone()));
        self.inner.append_events(events)
    }
    fn put_node_states(&self, writes: &[store::NodeWrite]) -> store::Result<()> {
        self.inner.put_node_states(writes)
    }
    fn put_metas(&self, entries: &[(String, Vec<u8>)]) -> store::Result<()> {
        self.inner.put_metas(entries)
    }
    fn put_rows(
        &self,
        table: store::ClusterTable,
        entries: &[(String, Vec<u8>)],
    ) -> store::Result<()> {
        self.inner.put_rows(table, entries)
    }
    fn compare_and_set_row(
        &self,
        table: store::ClusterTable,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> store::Result<store::CasOutcome> {
        self.inner.compare_and_set_row(table, key, expected, new)
    }
    fn compare_and_set_meta(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> store::Result<CasOutcome> {
        self.inner.compare_and_set_meta(key, expected, new)
    }
    fn put_rollout(&self, key: &str, value: &[u8]) -> store::Result<()> {
        self.inner.put_rollout(key, value)
    }
}

impl Store for Recorder {
    fn lease(&self, mac: Mac) -> store::Result<Option<store::Lease>> {
        self.inner.lease(mac)
    }
    fn lease_by_ip(&self, ip: Ipv4Addr) -> store::Result<Option<store::Lease>> {
        self.inner.lease_by_ip(ip)
    }
    fn leases(&self) -> store::Result<Vec<store::Lease>> {
        self.inner.leases()
    }
    fn node(&self, name: &str) -> store::Result<Option<NodeRecord>> {
        self.inner.node(name)
    }
    fn nodes(&self) -> store::Result<Vec<NodeRecord>> {
        self.inner.nodes()
    }
    fn node_part(&self, name: &str, part: store::NodePart) -> store::Result<Option<Vec<u8>>> {
        self.inner.node_part(name, part)
    }
    fn events(&self, node: &str, since_seq: u64, limit: usize) -> store::Result<Vec<Event>> {
        self.inner.events(node, since_seq, limit)
    }
    fn last_event(&self, node: &str) -> store::Result<Option<Event>> {
        self.inner.last_event(node)
    }
    fn row(&self, table: store::ClusterTable, key: &str) -> store::Result<Option<Vec<u8>>> {
        self.inner.row(table, key)
    }
    fn get_meta(&self, key: &str) -> store::Result<Option<Vec<u8>>> {
        self.inner.get_meta(key)
    }
    fn rollout(&self, key: &str) -> store::Result<Option<Vec<u8>>> {
        self.inner.rollout(key)
    }
    fn rollout_keys(&self) -> store::Result<Vec<String>> {
        self.inner.rollout_keys()
    }
    fn export_json(&self) -> store::Result<serde_json::Value> {
        self.inner.export_json()
    }
}

struct Running {
    _dir: tempfile::TempDir,
    store: Arc<Recorder>,
    server: SocketAddr,
    client: tokio::net::UdpSocket,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start() -> Running {
    start_with(server::Queues::default()).await
}

async fn start_with(queues: server::Queues) -> Running {
    start_ctx(
        queues,
        ctx(NetworkMode::Authoritative, UnknownPolicy::Discover),
    )
    .await
}

async fn start_ctx(queues: server::Queues, ctx: DecideCtx) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Recorder {
        inner: store::open(dir.path()).unwrap(),
        log: Mutex::new(Vec::new()),
        appended: Mutex::new(Vec::new()),
        fail_next_durable: AtomicBool::new(false),
        failed: Mutex::new(None),
        gate: Mutex::new(None),
    });
    let srv = server::DhcpServer::bind_loopback(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .with_queues(queues);
    let addr = srv.local_addr().unwrap();
    let writers = store::Writers::over(store.clone());
    let (bus, _writer) = EventBus::start(writers.events, Arc::new(SystemClock));
    let dhcp_writers = Arc::new(server::DhcpWriters {
        leases: writers.leases,
        bindings: writers.meta,
    });
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (store, cancel): (Arc<dyn Store>, _) = (store.clone(), cancel.clone());
        async move {
            srv.run(
                ctx,
                FloodConfig::default(),
                store,
                dhcp_writers,
                bus,
                cancel,
            )
            .await
            .unwrap();
        }
    });
    let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    Running {
        _dir: dir,
        store,
        server: addr,
        client,
        cancel,
        task,
    }
}

impl Running {
    async fn send(&self, bytes: &[u8]) {
        self.client.send_to(bytes, self.server).await.unwrap();
    }

    /// Send `bytes` and hold the commit it causes (as a slow fsync holds it) until the
    /// returned sender is signalled; returns once that commit has started.
    async fn hold_commit_of(&self, bytes: &[u8]) -> std::sync::mpsc::Sender<()> {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (open, open_rx) = std::sync::mpsc::channel();
        *self.store.gate.lock().unwrap() = Some((entered_tx, open_rx));
        self.send(bytes).await;
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        open
    }

    /// The next datagram, or None after `wait` (a client's retransmission timer).
    async fn recv(&self, wait: Duration) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 1500];
        match tokio::time::timeout(wait, self.client.recv(&mut buf)).await {
            Ok(Ok(n)) => Some(buf[..n].to_vec()),
            _ => None,
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

fn request_cp1() -> Vec<u8> {
    with(
        m(MessageType::Request, CP1),
        [sid(SERVER), want("10.0.0.11")],
    )
    .to_vec()
    .unwrap()
}

fn decoded(b: &[u8]) -> Message {
    Message::decode(&mut dhcproto::Decoder::new(b)).unwrap()
}

/// Safety net for a reply that must come (a broken server fails the test instead of hanging).
const MUST_ARRIVE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retransmitted_request_gets_the_same_ack_without_a_second_durable_write() {
    let r = start().await;
    let req = request_cp1();
    r.send(&req).await;
    let first = r.recv(MUST_ARRIVE).await.expect("ACK");
    assert_eq!(decoded(&first).opts().msg_type(), Some(MessageType::Ack));
    // On disk before it left: the double records a commit only after a pause once the commit
    // returned, so an ACK sent any earlier would be here before the record.
    let commits = r.store.commits();
    let binding: Vec<&Commit> = commits
        .iter()
        .filter(|c| c.bound.contains(&ip("10.0.0.11")))
        .collect();
    assert_eq!(binding.len(), 1, "{commits:?}");
    assert!(binding[0].durable);
    // Its timeline event went in the same transaction, not through the bus's own writer.
    assert!(binding[0].events.contains(&"dhcp.ack".to_string()));

    let sent_first = std::time::Instant::now();
    r.send(&req).await;
    let again = r.recv(MUST_ARRIVE).await.expect("second ACK");
    // The same ACK, but its times count down from the same expiry: the lease, T1 and T2 it
    // states are what is left of them, so a second boundary crossed between the two answers
    // (a loaded machine, or a plain second tick) lowers each by the seconds that passed.
    let times = |b: &[u8]| {
        let mut msg = decoded(b);
        let secs = |code| match msg.opts().get(code) {
            Some(dhcproto::v4::DhcpOption::AddressLeaseTime(s))
            | Some(dhcproto::v4::DhcpOption::Renewal(s))
            | Some(dhcproto::v4::DhcpOption::Rebinding(s)) => *s,
            other => panic!("{code:?}: {other:?}"),
        };
        let t = [
            secs(dhcproto::v4::OptionCode::AddressLeaseTime),
            secs(dhcproto::v4::OptionCode::Renewal),
            secs(dhcproto::v4::OptionCode::Rebinding),
        ];
        for code in [
            dhcproto::v4::OptionCode::AddressLeaseTime,
            dhcproto::v4::OptionCode::Renewal,
            dhcproto::v4::OptionCode::Rebinding,
        ] {
            msg.opts_mut().remove(code);
        }
        (msg, t)
    };
    let (first_rest, first_t) = times(&first);
    let (again_rest, again_t) = times(&again);
    assert_eq!(
        again_rest, first_rest,
        "the retransmission gets the same ACK"
    );
    let passed = u32::try_from(sent_first.elapsed().as_secs()).unwrap() + 1;
    for (a, f) in again_t.iter().zip(first_t) {
        assert!(
            *a <= f && f - a <= passed,
            "times {again_t:?} after {first_t:?}"
        );
    }
    let commits = r.store.commits();
    assert_eq!(
        commits
            .iter()
            .filter(|c| c.bound.contains(&ip("10.0.0.11")))
            .count(),
        1,
        "no second write of the binding: {commits:?}"
    );
    assert!(
        commits.iter().filter(|c| c.durable).count() == 1,
        "no second durable commit: {commits:?}"
    );
    assert!(
        !r.store
            .appended
            .lock()
            .unwrap()
            .iter()
            .any(|k| k == "dhcp.ack")
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_whose_write_failed_is_written_again_before_any_ack() {
    let r = start().await;
    let (tx, failed) = std::sync::mpsc::channel();
    *r.store.failed.lock().unwrap() = Some(tx);
    r.store.fail_next_durable.store(true, Ordering::SeqCst);
    let req = request_cp1();
    r.send(&req).await;
    tokio::task::spawn_blocking(move || failed.recv().unwrap())
        .await
        .unwrap();
    // The client retransmits until answered; whichever attempt is answered, its binding must
    // have been written (durably) by then, never answered from the book alone.
    let mut ack = None;
    for _ in 0..20 {
        r.send(&req).await;
        if let Some(b) = r.recv(Duration::from_millis(500)).await {
            ack = Some(b);
            break;
        }
    }
    let ack = ack.expect("an ACK once the store works again");
    assert_eq!(decoded(&ack).opts().msg_type(), Some(MessageType::Ack));
    assert!(
        r.store
            .commits()
            .iter()
            .any(|c| c.durable && c.bound.contains(&ip("10.0.0.11"))),
        "ACK sent for a binding that is not on disk: {:?}",
        r.store.commits()
    );
    r.stop().await;
}

/// Until the kernel holds no unread datagram for the server's socket (`rx_queue` of its row in
/// /proc/net/udp is 0): every datagram sent so far has reached the server's receive queue.
async fn drained(port: u16) {
    let local = format!("0100007F:{port:04X}");
    for _ in 0..400 {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap();
        let rx_queue = table.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str())).then(|| f[4].split(':').nth(1).map(str::to_owned))
        });
        match rx_queue.flatten() {
            Some(q) if u64::from_str_radix(&q, 16).unwrap() == 0 => break,
            Some(_) => {}
            None => panic!("no /proc/net/udp row for {local}"),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The reader pushes what it read before its next receive.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn discover_from(n: u8) -> Vec<u8> {
    let mut msg = m(MessageType::Discover, Mac([0x02, 0, 0, 0, 1, n]));
    msg.set_xid(0x1000 + u32::from(n));
    msg.to_vec().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_queue_overflow_sheds_discovers_and_answers_every_request() {
    // A receive queue of 3 and room for one decision before the committer: while the first
    // commit is held, the handler takes at most two more datagrams, and the rest overflow.
    let r = start_with(server::Queues {
        rx: 3,
        commit: 1,
        ..server::Queues::default()
    })
    .await;
    let port = r.server.port();
    let open = r.hold_commit_of(&discover_from(0)).await;
    // Two more to stall the handler, then three REQUESTs (reserved machines, SELECTING)
    // followed by eight DISCOVERs: an oldest-first ring keeps the last three DISCOVERs and
    // loses every REQUEST the handler had not taken yet.
    r.send(&discover_from(1)).await;
    r.send(&discover_from(2)).await;
    let requests = [
        (CP1, "10.0.0.11"),
        (ARM, "10.0.0.13"),
        (HTTPNODE, "10.0.0.14"),
    ];
    for (mac, addr) in requests {
        r.send(
            &with(m(MessageType::Request, mac), [sid(SERVER), want(addr)])
                .to_vec()
                .unwrap(),
        )
        .await;
    }
    for n in 3..11 {
        r.send(&discover_from(n)).await;
    }
    drained(port).await;
    open.send(()).unwrap();

    let (mut acks, mut offers) = (Vec::new(), Vec::new());
    while acks.len() < requests.len() {
        let Some(b) = r.recv(MUST_ARRIVE).await else {
            break;
        };
        let msg = decoded(&b);
        match msg.opts().msg_type() {
            Some(MessageType::Ack) => {
                acks.push((Mac(msg.chaddr()[..6].try_into().unwrap()), msg.yiaddr()))
            }
            Some(MessageType::Offer) => offers.push(msg.chaddr()[5]),
            other => panic!("unexpected reply {other:?}"),
        }
    }
    while let Some(b) = r.recv(Duration::from_millis(500)).await {
        let msg = decoded(&b);
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Offer));
        offers.push(msg.chaddr()[5]);
    }
    acks.sort();
    let mut want: Vec<(Mac, Ipv4Addr)> = requests.iter().map(|(m, a)| (*m, ip(a))).collect();
    want.sort();
    assert_eq!(acks, want, "every REQUEST is answered");
    // The handler took at most two datagrams while held; whatever room REQUESTs it took left
    // in the queue went to the newest DISCOVERs: at most two of the eight burst DISCOVERs.
    let burst = offers.iter().filter(|n| **n >= 3).count();
    assert!(burst <= 2, "offers to the burst: {offers:?}");
    assert!(
        offers.contains(&0),
        "the held DISCOVER is answered: {offers:?}"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_does_not_wait_for_a_slow_durable_commit() {
    // Admission is pinned open: this is about the OFFER not queueing behind the commit, not
    // about shedding it once the held ACK is late (the tests below).
    let r = start_with(server::Queues {
        admission: crate::dhcp::admission::Limits {
            floor: Duration::from_secs(60),
            ceiling: Duration::from_secs(60),
        },
        ..server::Queues::default()
    })
    .await;
    // The ACK's binding commit is held, as a slow fsync holds it.
    let open = r.hold_commit_of(&request_cp1()).await;
    r.send(&discover_from(7)).await;
    let offer = r
        .recv(MUST_ARRIVE)
        .await
        .expect("an OFFER while the commit is held");
    let offer = decoded(&offer);
    assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(offer.chaddr()[5], 7);
    open.send(()).unwrap();
    let ack = r
        .recv(MUST_ARRIVE)
        .await
        .expect("the ACK once its commit returns");
    assert_eq!(decoded(&ack).opts().msg_type(), Some(MessageType::Ack));
    // Still durable before acknowledged, and the offer's record and event were committed too.
    let commits = r.store.commits();
    assert!(
        commits
            .iter()
            .any(|c| c.durable && c.bound.contains(&ip("10.0.0.11"))),
        "{commits:?}"
    );
    // Stopping lets the committer finish what was queued behind the ACK.
    let store = r.store.clone();
    r.stop().await;
    let commits = store.commits();
    assert!(
        commits
            .iter()
            .any(|c| !c.durable && c.events.iter().any(|e| e == "dhcp.offer")),
        "the OFFER's record and event are committed (without a sync): {commits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_are_not_answered_while_acks_wait_for_the_disk() {
    // Admission control: with one ACK waiting for its durable commit (the limit here), a new
    // exchange is not started, so OFFERs cannot outrun what the disk can acknowledge.
    let r = start_with(server::Queues {
        ack_backlog: 1,
        ..server::Queues::default()
    })
    .await;
    let open = r.hold_commit_of(&request_cp1()).await;
    r.send(&discover_from(20)).await;
    drained(r.server.port()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    open.send(()).unwrap();
    // An OFFER to the first DISCOVER would have left at once, before this ACK.
    let first = decoded(&r.recv(MUST_ARRIVE).await.expect("the ACK"));
    assert_eq!(first.opts().msg_type(), Some(MessageType::Ack));
    // With nothing waiting any more, the next DISCOVER is answered.
    r.send(&discover_from(21)).await;
    let next = decoded(&r.recv(MUST_ARRIVE).await.expect("an OFFER"));
    assert_eq!(next.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(next.chaddr()[5], 21, "the shed DISCOVER stays unanswered");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_are_not_answered_while_the_oldest_ack_waits_longer_than_commits_take() {
    // One ACK waiting, far below the count limit (512): the count alone would answer the
    // DISCOVER. But that ACK has waited longer than the admission target (pinned to 50 ms
    // here; derived from measured commit times in service), so the durable path is behind and
    // no new exchange is started until it catches up.
    let r = start_with(server::Queues {
        admission: crate::dhcp::admission::Limits {
            floor: Duration::from_millis(50),
            ceiling: Duration::from_millis(50),
        },
        ..server::Queues::default()
    })
    .await;
    let open = r.hold_commit_of(&request_cp1()).await;
    // Let the held ACK grow older than the target, then start a new exchange.
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.send(&discover_from(30)).await;
    drained(r.server.port()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    open.send(()).unwrap();
    // An OFFER to that DISCOVER would have left at once, before this ACK.
    let first = decoded(&r.recv(MUST_ARRIVE).await.expect("the ACK"));
    assert_eq!(first.opts().msg_type(), Some(MessageType::Ack));
    // With nothing waiting any more, the next DISCOVER is answered.
    r.send(&discover_from(31)).await;
    let next = decoded(&r.recv(MUST_ARRIVE).await.expect("an OFFER"));
    assert_eq!(next.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(next.chaddr()[5], 31, "the shed DISCOVER stays unanswered");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_are_not_answered_while_requests_are_answered_later_than_the_delay_target() {
    // The REQUEST-delay rule alone (the growth rule's limits pinned out of reach, the burst
    // allowance off): a REQUEST whose ACK has not left 400 ms after it arrived is a delay far
    // past the 20 ms target, so new exchanges are refused until REQUESTs are answered in time
    // again ([`crate::dhcp::sojourn`]).
    let r = start_with(server::Queues {
        admission: crate::dhcp::admission::Limits {
            floor: Duration::from_secs(60),
            ceiling: Duration::from_secs(60),
        },
        delay: crate::dhcp::sojourn::Params {
            floor: Duration::from_millis(20),
            burst: Duration::ZERO,
            ..Default::default()
        },
        ..server::Queues::default()
    })
    .await;
    let open = r.hold_commit_of(&request_cp1()).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.send(&discover_from(30)).await;
    r.send(&discover_from(33)).await;
    drained(r.server.port()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    open.send(()).unwrap();
    // An OFFER to either DISCOVER would have left at once, before this ACK.
    let first = decoded(&r.recv(MUST_ARRIVE).await.expect("the ACK"));
    assert_eq!(first.opts().msg_type(), Some(MessageType::Ack));
    // Nothing waits any more and the last 100 ms answered nothing late: answered again.
    tokio::time::sleep(Duration::from_millis(150)).await;
    r.send(&discover_from(31)).await;
    let next = decoded(&r.recv(MUST_ARRIVE).await.expect("an OFFER"));
    assert_eq!(next.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(next.chaddr()[5], 31, "the shed DISCOVERs stay unanswered");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_waiting_less_than_the_target_does_not_stop_new_exchanges() {
    // The other side of the rule: a held ACK younger than the target (pinned high here) does
    // not shed DISCOVERs, so a commit in progress alone never costs an exchange (the
    // REQUEST-delay rule's target is pinned high too: this is the growth rule's test).
    let r = start_with(server::Queues {
        admission: crate::dhcp::admission::Limits {
            floor: Duration::from_secs(60),
            ceiling: Duration::from_secs(60),
        },
        delay: crate::dhcp::sojourn::Params {
            floor: Duration::from_secs(60),
            ..Default::default()
        },
        ..server::Queues::default()
    })
    .await;
    let open = r.hold_commit_of(&request_cp1()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.send(&discover_from(32)).await;
    let offer = decoded(
        &r.recv(MUST_ARRIVE)
            .await
            .expect("an OFFER while the ACK waits"),
    );
    assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(offer.chaddr()[5], 32);
    open.send(()).unwrap();
    let ack = decoded(&r.recv(MUST_ARRIVE).await.expect("the ACK"));
    assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_group_larger_than_one_burst_is_acked_whole_in_order_and_after_its_commit() {
    // 24 exchanges whose REQUESTs all land in one held commit: the group is more than one
    // burst (16), so the sender paces it; every ACK must still come, in the REQUESTs' order,
    // and only after the commit that made its binding durable.
    let mut c = ctx(NetworkMode::Authoritative, UnknownPolicy::Discover);
    c.subnets[0].pool = Some(Pool {
        start: ip("10.0.0.100"),
        end: ip("10.0.0.199"),
    });
    let r = start_ctx(server::Queues::default(), c).await;
    let n: u8 = 24;
    let mut offered = Vec::new();
    for i in 0..n {
        r.send(&discover_from(100 + i)).await;
        let offer = decoded(&r.recv(MUST_ARRIVE).await.expect("an OFFER"));
        assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
        offered.push((offer.chaddr()[5], offer.yiaddr()));
    }
    let request = |(last, addr): (u8, Ipv4Addr)| {
        let mut msg = with(
            m(MessageType::Request, Mac([0x02, 0, 0, 0, 1, last])),
            [sid(SERVER), DhcpOption::RequestedIpAddress(addr)],
        );
        msg.set_xid(0x1000 + u32::from(last));
        msg.to_vec().unwrap()
    };
    // Let the OFFERs' own (unsynced) commits finish, then hold the next commit.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let open = r.hold_commit_of(&request(offered[0])).await;
    for o in &offered[1..] {
        r.send(&request(*o)).await;
    }
    drained(r.server.port()).await;
    open.send(()).unwrap();
    let mut acked = Vec::new();
    while acked.len() < offered.len() {
        let Some(b) = r.recv(MUST_ARRIVE).await else {
            break;
        };
        let ack = decoded(&b);
        assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
        // On disk before it left (the double records a commit only after a pause).
        let commits = r.store.commits();
        assert!(
            commits
                .iter()
                .any(|c| c.durable && c.bound.contains(&ack.yiaddr())),
            "ACK for {} before its durable commit: {commits:?}",
            ack.yiaddr()
        );
        acked.push((ack.chaddr()[5], ack.yiaddr()));
    }
    assert_eq!(acked, offered, "every ACK, in the REQUESTs' order");
    r.stop().await;
}

/// A Secure Boot node with nothing signed to boot: the OFFER names no boot file, and the
/// node's timeline gets a `boot.refused` event saying why (issue 27 item 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_boot_is_a_boot_refused_event_on_the_nodes_timeline() {
    let mut c = ctx(NetworkMode::Authoritative, UnknownPolicy::Discover);
    c.hosts.get_mut(&CP1).unwrap().secure_boot = true;
    let r = start_ctx(server::Queues::default(), c).await;
    let discover = with(m(MessageType::Discover, CP1), pxe(7))
        .to_vec()
        .unwrap();
    r.send(&discover).await;
    let offer = decoded(&r.recv(MUST_ARRIVE).await.expect("OFFER"));
    assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
    assert!(offer.opts().get(OptionCode::BootfileName).is_none());
    let deadline = Instant::now() + MUST_ARRIVE;
    let refused = loop {
        let events = r.store.inner.events("cp1", 0, 50).unwrap();
        if let Some(e) = events.into_iter().find(|e| e.kind == "boot.refused") {
            break e;
        }
        assert!(Instant::now() < deadline, "no boot.refused event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        refused.detail.contains("cp1") && refused.detail.contains("no Secure Boot UKI"),
        "{}",
        refused.detail
    );
    r.stop().await;
}
