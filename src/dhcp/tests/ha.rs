//! Two appliances' DHCP servers sharing one 3-member etcd (issue 28 item 2), in process on
//! loopback: each over its own `EtcdStore`, registered as a member, split by RFC 3074
//! buckets and fed the other's leases. Simulated clients run DORA against both (every
//! datagram sent to both servers, as a broadcast reaches both); then one appliance stops as
//! `kill -9` stops it (no revoke, its keep-alives just end) and the survivor must take its
//! clients over.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::events::{EventBus, SystemClock};
use crate::store::etcd_testing::EtcdServer;
use crate::store::{EtcdStore, Member, Membership, Store};

const CLIENTS: u8 = 48;

fn member(name: &str) -> Member {
    Member {
        name: name.into(),
        admin_url: String::new(),
        http_url: String::new(),
        version: "test".into(),
        started_unix_ms: 0,
    }
}

/// One appliance: its store, its membership, and its server and event tasks.
struct Appliance {
    addr: SocketAddr,
    store: Arc<EtcdStore>,
    membership: Membership,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn appliance(server: &EtcdServer, name: &str, ip: Ipv4Addr, split: bool) -> Appliance {
    let (store, writers) = server.open("ha-dhcp").split();
    let membership = store.join(member(name), Duration::from_secs(2));
    let srv = server::DhcpServer::bind_loopback(SocketAddrV4::new(ip, 0)).unwrap();
    let addr = srv.local_addr().unwrap();
    let feed = store.lease_feed(CancellationToken::new());
    let mut srv = srv.with_etcd(store.clone(), Some(feed));
    if split {
        srv = srv.with_split(name.into(), membership.live());
    }
    let mut c = ctx(NetworkMode::Authoritative, UnknownPolicy::Discover);
    c.server_ip = ip;
    c.subnets[0].pool = Some(Pool {
        start: self::ip("10.0.0.100"),
        end: self::ip("10.0.0.200"),
    });
    let (bus, bus_task) = EventBus::start(writers.events, Arc::new(SystemClock));
    let dhcp_writers = Arc::new(server::DhcpWriters {
        leases: writers.leases,
        bindings: writers.meta,
    });
    let reader: Arc<dyn Store> = store.clone();
    let task = tokio::spawn(async move {
        let _ = srv
            .run(
                c,
                FloodConfig::default(),
                reader,
                dhcp_writers,
                bus,
                CancellationToken::new(),
            )
            .await;
    });
    Appliance {
        addr,
        store,
        membership,
        tasks: vec![task, bus_task],
    }
}

impl Appliance {
    /// Stop as `kill -9` would: tasks gone, the etcd lease left to expire.
    fn kill(self) {
        for t in &self.tasks {
            t.abort();
        }
        std::mem::forget(self.membership);
    }
}

/// What a client got: who offered (server identifiers of every OFFER of its first answered
/// DISCOVER), who acknowledged, and the address.
#[derive(Debug, Clone)]
struct Got {
    offered_by: BTreeSet<Ipv4Addr>,
    acked_by: Ipv4Addr,
    ip: Ipv4Addr,
}

fn client_mac(n: u8) -> Mac {
    Mac([0x02, 0, 0, 0x28, 0, n])
}

async fn recv_reply(sock: &UdpSocket, wait: Duration) -> Option<Message> {
    let mut buf = vec![0u8; 1500];
    let n = tokio::time::timeout(wait, sock.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Message::decode(&mut dhcproto::Decoder::new(&buf[..n])).ok()
}

fn server_id_of(msg: &Message) -> Option<Ipv4Addr> {
    match msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    }
}

/// DISCOVER to every server, then REQUEST the first offer; again (bounded) until ACKed.
async fn dora(mac: Mac, servers: &[SocketAddr], attempts: usize) -> Option<Got> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for attempt in 0..attempts {
        let mut discover = m(MessageType::Discover, mac);
        discover.set_xid(u32::from(mac.0[5]) << 8 | attempt as u32);
        let bytes = discover.to_vec().unwrap();
        for s in servers {
            let _ = sock.send_to(&bytes, s).await;
        }
        let Some(offer) = recv_reply(&sock, Duration::from_millis(800)).await else {
            continue;
        };
        let mut offered_by: BTreeSet<Ipv4Addr> = server_id_of(&offer).into_iter().collect();
        // A second server's OFFER would come within moments of the first.
        while let Some(more) = recv_reply(&sock, Duration::from_millis(200)).await {
            offered_by.extend(server_id_of(&more));
        }
        let (Some(sid), ip) = (server_id_of(&offer), offer.yiaddr()) else {
            continue;
        };
        let mut req = with(
            m(MessageType::Request, mac),
            [
                DhcpOption::ServerIdentifier(sid),
                DhcpOption::RequestedIpAddress(ip),
            ],
        );
        req.set_xid(discover.xid());
        let bytes = req.to_vec().unwrap();
        for s in servers {
            let _ = sock.send_to(&bytes, s).await;
        }
        while let Some(reply) = recv_reply(&sock, Duration::from_millis(800)).await {
            if reply.opts().msg_type() == Some(MessageType::Ack) && reply.yiaddr() == ip {
                return Some(Got {
                    offered_by,
                    acked_by: sid,
                    ip,
                });
            }
        }
    }
    None
}

/// Every client's DORA at once; panics naming a client that got nothing.
async fn storm(clients: &[u8], servers: &[SocketAddr], attempts: usize) -> BTreeMap<u8, Got> {
    let runs: Vec<_> = clients
        .iter()
        .map(|&n| {
            let servers = servers.to_vec();
            tokio::spawn(async move { (n, dora(client_mac(n), &servers, attempts).await) })
        })
        .collect();
    let mut got = BTreeMap::new();
    for r in runs {
        let (n, g) = r.await.unwrap();
        got.insert(n, g.unwrap_or_else(|| panic!("client {n} got no lease")));
    }
    got
}

/// Etcd holds every acknowledged lease, and no address twice.
fn check_store(store: &EtcdStore, got: &BTreeMap<u8, Got>) {
    let mut by_ip = BTreeMap::new();
    for (n, g) in got {
        if let Some(other) = by_ip.insert(g.ip, *n) {
            panic!("{} acknowledged to clients {other} and {n}", g.ip);
        }
        let held = store.lease_by_ip(g.ip).unwrap();
        assert_eq!(
            held.map(|l| l.mac),
            Some(client_mac(*n)),
            "{} in etcd",
            g.ip
        );
        assert_eq!(
            store.lease(client_mac(*n)).unwrap().map(|l| l.ip),
            Some(g.ip)
        );
    }
    let records = store.leases().unwrap();
    let macs: BTreeSet<Mac> = records
        .iter()
        .filter(|l| l.state != LeaseState::Declined)
        .map(|l| l.mac)
        .collect();
    assert_eq!(macs.len(), records.len(), "a MAC holds two records");
}

/// Waits (bounded) until `m` sees exactly `n` members.
async fn wait_members(m: &Membership, n: usize) {
    let mut live = m.live();
    let deadline = Instant::now() + Duration::from_secs(15);
    while live.borrow().len() != n {
        assert!(Instant::now() < deadline, "members: {:?}", *live.borrow());
        let _ = tokio::time::timeout(Duration::from_millis(200), live.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_appliances_split_the_clients_and_the_survivor_takes_over() {
    let Some(etcd) = tokio::task::spawn_blocking(|| EtcdServer::start_cluster(3))
        .await
        .unwrap()
    else {
        return;
    };
    let (ip_a, ip_b) = (ip("127.0.0.2"), ip("127.0.0.3"));
    let a = appliance(&etcd, "a", ip_a, true).await;
    let b = appliance(&etcd, "b", ip_b, true).await;
    wait_members(&a.membership, 2).await;
    wait_members(&b.membership, 2).await;
    let servers = [a.addr, b.addr];
    let clients: Vec<u8> = (1..=CLIENTS).collect();
    let got = storm(&clients, &servers, 10).await;
    // While both live, each client was answered by one server only, and both served.
    for (n, g) in &got {
        assert_eq!(g.offered_by.len(), 1, "client {n}: {g:?}");
    }
    let of_b: Vec<u8> = got
        .iter()
        .filter(|(_, g)| g.acked_by == ip_b)
        .map(|(n, _)| *n)
        .collect();
    assert!(!of_b.is_empty() && of_b.len() < got.len(), "{of_b:?}");
    let a_store = a.store.clone();
    tokio::task::spawn_blocking({
        let (s, g) = (a_store.clone(), got.clone());
        move || check_store(&s, &g)
    })
    .await
    .unwrap();

    // b dies; its etcd lease expires, a takes its buckets and answers its clients, with the
    // addresses they held (a learned them from the feed).
    b.kill();
    wait_members(&a.membership, 1).await;
    let again = storm(&of_b, &servers, 30).await;
    for (n, g) in &again {
        assert_eq!(g.acked_by, ip_a, "client {n}");
        assert_eq!(g.ip, got[n].ip, "client {n} kept its address");
    }
    let mut all = got;
    all.extend(again);
    tokio::task::spawn_blocking(move || check_store(&a_store, &all))
        .await
        .unwrap();
    for t in a.tasks {
        t.abort();
    }
}

/// Without the split both appliances answer every client, so they offer the same free
/// addresses to different clients at once: the commits race in etcd, the losers' replies
/// are dropped (their clients retry), and still no address is acknowledged to two clients
/// and every acknowledged lease is in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_answering_everyone_never_ack_one_address_twice() {
    let Some(etcd) = tokio::task::spawn_blocking(|| EtcdServer::start_cluster(3))
        .await
        .unwrap()
    else {
        return;
    };
    let a = appliance(&etcd, "a", ip("127.0.0.4"), false).await;
    let b = appliance(&etcd, "b", ip("127.0.0.5"), false).await;
    let clients: Vec<u8> = (1..=CLIENTS).collect();
    let got = storm(&clients, &[a.addr, b.addr], 20).await;
    // Both answered: the race was real.
    assert!(got.values().any(|g| g.offered_by.len() == 2), "{got:?}");
    let store = a.store.clone();
    tokio::task::spawn_blocking(move || check_store(&store, &got))
        .await
        .unwrap();
    for t in a.tasks.iter().chain(&b.tasks) {
        t.abort();
    }
}

/// On etcd an OFFER writes nothing (the book holds it), the ACK's lease is in etcd before
/// the ACK arrives, and the exchange's timeline rows still reach etcd, by the event bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_stays_in_memory_and_the_ack_and_timeline_reach_etcd() {
    let Some(etcd) = tokio::task::spawn_blocking(|| EtcdServer::start_cluster(1))
        .await
        .unwrap()
    else {
        return;
    };
    let a = appliance(&etcd, "a", ip("127.0.0.6"), false).await;
    let mac = client_mac(200);
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut discover = m(MessageType::Discover, mac);
    discover.set_xid(0x2800);
    sock.send_to(&discover.to_vec().unwrap(), a.addr)
        .await
        .unwrap();
    let offer = recv_reply(&sock, Duration::from_secs(5))
        .await
        .expect("an OFFER");
    assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
    let offered = offer.yiaddr();
    // Give a commit of the offer every chance to land before looking.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let store = a.store.clone();
    let held = tokio::task::spawn_blocking(move || store.lease_by_ip(offered).unwrap())
        .await
        .unwrap();
    assert_eq!(held, None, "the offer of {offered} was written to etcd");

    let mut req = with(
        m(MessageType::Request, mac),
        [
            DhcpOption::ServerIdentifier(ip("127.0.0.6")),
            DhcpOption::RequestedIpAddress(offered),
        ],
    );
    req.set_xid(0x2800);
    sock.send_to(&req.to_vec().unwrap(), a.addr).await.unwrap();
    let ack = recv_reply(&sock, Duration::from_secs(5))
        .await
        .expect("an ACK");
    assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
    // No wait: durable before acknowledged.
    let store = a.store.clone();
    let held = tokio::task::spawn_blocking(move || store.lease(mac).unwrap())
        .await
        .unwrap()
        .expect("the ACKed lease in etcd");
    assert_eq!((held.ip, held.state), (offered, LeaseState::Bound));

    let key = crate::events::unknown_node_key(mac);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (store, key) = (a.store.clone(), key.clone());
        let kinds: Vec<String> =
            tokio::task::spawn_blocking(move || store.events(&key, 0, 10).unwrap())
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.kind.to_string())
                .collect();
        if kinds.len() >= 2 {
            assert_eq!(kinds, ["dhcp.offer", "dhcp.ack"]);
            break;
        }
        assert!(Instant::now() < deadline, "timeline in etcd: {kinds:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in a.tasks {
        t.abort();
    }
}
