//! Hostile neighbours (issue 10, items 15-17): a host on the provisioning segment that is not
//! the node asks for the node's script, its token and its config, or makes talboot push the
//! config to it. It gets nothing, in pull and push mode, with and without a binding, in
//! authoritative mode (the binding is a DHCP lease) and proxy mode (the binding is the one the
//! ProxyDHCP exchange recorded); the token never reaches the log; `/api/*` is not on the
//! provisioning listener.
//!
//! Real clients against the real servers: reqwest (bound to the node's or the stranger's
//! loopback address) against talboot's HTTP router on loopback, the provisioner against the
//! Talos double (`talboot::sim::talos`, which counts who received ApplyConfiguration), and
//! curl against the `talboot serve` binary. Each test uses its own 127.0.N.0/24.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};
use talboot::artifacts::Catalog;
use talboot::view::StateView;

use support::images::fake_images;
use talboot::dhcp::server::DhcpWriters;
use talboot::events::{Clock, EventBus, SystemClock};
use talboot::http::{ConfigDir, HttpApp, router, script::Scripts, serve, tokens::Tokens};
use talboot::inventory::{Inventory, Mac, Node};
use talboot::machineconfig::renderer::ConfigRenderer;
use talboot::provision::{ProvisionWriters, Provisioner, Settings};
use talboot::sim::pki::{SimCa, talos_label};
use talboot::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode};
use talboot::store::{Lease, LeaseState, Store};
use talboot::talos::ClientCreds;
use tokio_util::sync::CancellationToken;

/// The secret every rendered config carries in these tests: finding it anywhere but in the
/// node's hands is the failure.
const SECRET: &str = "CLUSTER-CA-KEY-do-not-leak";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Authoritative,
    Proxy,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Delivery {
    Pull,
    Push,
}

fn node_ip(net: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, net, 11)
}

fn stranger_ip(net: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, net, 99)
}

fn node_mac(net: u8) -> Mac {
    Mac([0x02, 0, 0, net, 0, 0x0b])
}

fn inventory_yaml(net: u8, mode: Mode, delivery: Delivery) -> String {
    format!(
        "cluster:\n  name: hostile\n  talosVersion: v1.13.9\n  kubernetesVersion: 1.36.3\n  \
         endpoint: https://127.0.{net}.100:6443\n  vip: 127.0.{net}.100\n  secrets:\n    \
         file: secrets.age\nnetwork:\n  interfaces: [lo]\n  mode: {mode}\n  \
         subnet: 127.0.{net}.0/24\nboot:\n  delivery: {delivery}\nnodes:\n  - name: cp-1\n    \
         mac: \"{mac}\"\n    role: controlplane\n    address: 127.0.{net}.11/24\n    \
         installDisk: /dev/sda\n",
        mode = match mode {
            Mode::Authoritative => "authoritative",
            Mode::Proxy => "proxy",
        },
        delivery = match delivery {
            Delivery::Pull => "pull",
            Delivery::Push => "push",
        },
        mac = node_mac(net),
    )
}

/// Record the node's binding as talboot's DHCP server does: a bound lease (authoritative) or
/// the ProxyDHCP binding (proxy).
fn bind(store: &DhcpWriters, mode: Mode, mac: Mac, ip: Ipv4Addr) {
    let now = SystemClock.now_unix();
    match mode {
        Mode::Authoritative => store
            .leases
            .put_lease(&Lease {
                mac,
                ip,
                hostname: Some("cp-1".into()),
                state: LeaseState::Bound,
                expires_at_unix: now + 3600,
                updated_at_unix: now,
            })
            .unwrap(),
        Mode::Proxy => {
            talboot::entitlement::record_proxy_binding(&store.bindings, mac, ip, now).unwrap();
        }
    }
}

/// talboot's HTTP side on 127.0.N.1 with a store, an event bus and configs holding [`SECRET`].
struct World {
    tmp: tempfile::TempDir,
    inventory: Arc<Inventory>,
    base: String,
    store: Arc<dyn Store>,
    /// The DHCP server's writers: the test acts as the DHCP server ([`World::bind`]) or
    /// hands them to one.
    dhcp: Arc<DhcpWriters>,
    /// The provisioner's writers (push delivery: as in serve, the provisioner then owns the
    /// node records and the HTTP side only publishes events).
    provision: std::sync::Mutex<Option<ProvisionWriters>>,
    /// The read view the HTTP side reads; a test that writes the store directly acts as the
    /// writer and republishes it.
    view: Arc<StateView>,
    bus: EventBus,
    shutdown: CancellationToken,
}

impl Drop for World {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl World {
    async fn start(net: u8, mode: Mode, delivery: Delivery) -> Self {
        talboot::install_crypto_provider();
        let tmp = tempfile::tempdir().unwrap();
        let inv_path = tmp.path().join("talboot.yaml");
        std::fs::write(&inv_path, inventory_yaml(net, mode, delivery)).unwrap();
        let inventory = Arc::new(talboot::inventory::load(&inv_path).unwrap().inventory);
        let configs = tmp.path().join("configs");
        std::fs::create_dir_all(&configs).unwrap();
        std::fs::write(
            configs.join("cp-1.yaml"),
            format!("version: v1alpha1\n# {SECRET}\n"),
        )
        .unwrap();
        let images = tmp.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        let (store, writers) = talboot::store::open(&tmp.path().join("state"))
            .unwrap()
            .split();
        let store: Arc<dyn Store> = store;
        let (bus, _writer) = EventBus::start(writers.events, Arc::new(SystemClock));
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::new(127, 0, net, 1), 0))
            .await
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let view = Arc::new(StateView::new());
        let (observer, provision): (Arc<dyn talboot::http::BootObserver>, _) = match delivery {
            Delivery::Push => (
                Arc::new(talboot::provision::ProvisionerObserves),
                Some(ProvisionWriters {
                    nodes: writers.nodes,
                    progress: writers.progress,
                }),
            ),
            Delivery::Pull => (
                Arc::new(talboot::provision::OfflineObserver {
                    inventory: inventory.clone(),
                    store: store.clone(),
                    nodes: Arc::new(writers.nodes),
                    view: view.clone(),
                }),
                None,
            ),
        };
        let app = Arc::new(HttpApp {
            inventory: inventory.clone(),
            store: store.clone(),
            view: view.clone(),
            events: bus.clone(),
            images_dir: images.clone(),
            catalog: Catalog::load(&images).unwrap(),
            cmdlines: Default::default(),
            base_url: base.clone(),
            scripts: Scripts::new(),
            configs: Arc::new(ConfigDir(configs)),
            tokens: Tokens::start(store.clone(), writers.tokens).0,
            observer,
        });
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(listener, router(app), shutdown.clone()));
        Self {
            tmp,
            inventory,
            base,
            store,
            dhcp: Arc::new(DhcpWriters {
                leases: writers.leases,
                bindings: writers.meta,
            }),
            provision: std::sync::Mutex::new(provision),
            view,
            bus,
            shutdown,
        }
    }

    /// [`bind`], then publish it to the view as talboot's DHCP server does after its commit.
    fn bind(&self, mode: Mode, mac: Mac, ip: Ipv4Addr) {
        bind(&self.dhcp, mode, mac, ip);
        self.view
            .reload(self.store.as_ref(), &self.inventory)
            .unwrap();
    }

    /// GET `path` from `from`: status and body.
    async fn get(&self, from: Ipv4Addr, path: &str) -> (u16, String) {
        let r = reqwest::Client::builder()
            .no_proxy()
            .local_address(IpAddr::V4(from))
            .build()
            .unwrap()
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn script(&self, from: Ipv4Addr, mac: Mac) -> (u16, String) {
        self.get(from, &format!("/boot.ipxe?mac={mac}&arch=x86_64"))
            .await
    }

    /// Tokens in the store (rows of its `pull_tokens` table, or `token/...` keys of an older
    /// build's `cluster_meta`).
    fn tokens(&self) -> usize {
        let dump = self.store.export_json().unwrap();
        let typed = dump["pull_tokens"].as_object().map_or(0, |t| t.len());
        typed + dump["cluster_meta"].to_string().matches("token/").count()
    }

    async fn events(&self) -> Vec<String> {
        // The bus writes on its own task.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.store
            .events("cp-1", 0, 1000)
            .unwrap()
            .into_iter()
            .map(|e| format!("{} {}", e.kind, e.detail))
            .collect()
    }
}

fn token_path(script: &str) -> Option<String> {
    let i = script.find("talos.config=")?;
    let url = script[i + "talos.config=".len()..]
        .split_whitespace()
        .next()?;
    Some(url[url.find("/config/")?..].to_string())
}

/// Pull mode: the stranger gets no script, no token and no config, and each try is a
/// `security.refused` event naming it; with a binding, the node itself still gets its config
/// (and the stranger cannot redeem the node's token either).
async fn pull_case(net: u8, mode: Mode, with_binding: bool) {
    let w = World::start(net, mode, Delivery::Pull).await;
    let (node, stranger, mac) = (node_ip(net), stranger_ip(net), node_mac(net));
    if with_binding {
        w.bind(mode, mac, node);
    }

    let (status, body) = w.script(stranger, mac).await;
    assert_eq!(status, 403, "{mode:?}: stranger's script: {body}");
    assert!(!body.contains("talos.config="), "{body}");
    assert_eq!(
        w.tokens(),
        0,
        "{mode:?}: a token was issued to the stranger"
    );

    // A guessed token is refused like any other.
    let (status, body) = w
        .get(stranger, &format!("/config/{}", "a".repeat(64)))
        .await;
    assert_eq!(status, 403);
    assert!(!body.contains(SECRET));

    if with_binding {
        let (status, script) = w.script(node, mac).await;
        assert_eq!(status, 200, "{script}");
        let path = token_path(&script).expect("the bound node gets its token");
        // The stranger knows the token (say, from the node's console): still nothing.
        let (status, body) = w.get(stranger, &path).await;
        assert_eq!(status, 403);
        assert!(!body.contains(SECRET), "{body}");
        let (status, body) = w.get(node, &path).await;
        assert_eq!(status, 200);
        assert!(body.contains(SECRET));
        let events = w.events().await;
        assert!(
            events.iter().all(|e| !e.contains(&path[8..])),
            "a token is on the timeline: {events:?}"
        );
    } else {
        // Without a binding nobody is entitled, not even a requester at the node's address.
        let (status, _) = w.script(node, mac).await;
        assert_eq!(status, 403);
        assert_eq!(w.tokens(), 0);
    }
    let events = w.events().await;
    let refused: Vec<_> = events
        .iter()
        .filter(|e| e.starts_with("security.refused") && e.contains(&stranger.to_string()))
        .collect();
    assert!(
        !refused.is_empty(),
        "{mode:?}: no refusal event: {events:?}"
    );
    // The stranger's address is never remembered as the node's.
    let rec = w.store.node("cp-1").unwrap();
    assert!(
        rec.as_ref().and_then(|r| r.last_seen_addr) != Some(stranger),
        "{rec:?}"
    );
}

#[tokio::test]
async fn pull_authoritative_without_lease_gives_the_stranger_nothing() {
    pull_case(201, Mode::Authoritative, false).await;
}

#[tokio::test]
async fn pull_authoritative_with_lease_gives_the_stranger_nothing() {
    pull_case(202, Mode::Authoritative, true).await;
}

#[tokio::test]
async fn pull_proxy_without_binding_gives_the_stranger_nothing() {
    pull_case(203, Mode::Proxy, false).await;
}

#[tokio::test]
async fn pull_proxy_with_binding_gives_the_stranger_nothing() {
    pull_case(204, Mode::Proxy, true).await;
}

/// A renderer whose configs carry [`SECRET`] and the test CA, so the node double accepts them.
struct SecretRenderer {
    ca: SimCa,
}

impl ConfigRenderer for SecretRenderer {
    fn render(
        &self,
        _node: &Node,
    ) -> Result<Vec<u8>, talboot::machineconfig::renderer::RenderError> {
        use base64::Engine as _;
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        Ok(format!(
            "version: v1alpha1\n# {SECRET}\nmachine:\n  type: controlplane\n  token: \
             abcdef.0123456789abcdef\n  ca:\n    crt: {crt}\n    key: \"{key}\"\n  install:\n    \
             disk: /dev/sda\ncluster:\n  clusterName: hostile\n  controlPlane:\n    endpoint: \
             https://127.0.0.100:6443\n",
            crt = b64(self.ca.cert_pem.as_bytes()),
            key = b64(self.ca.key_pem_talos_label().as_bytes()),
        )
        .into_bytes())
    }
}

/// Push mode: the stranger runs a Talos double in maintenance mode (it would take any
/// config) and asks for the node's script; the provisioner never sends it the config. With a
/// binding, the node's own double is the one talboot talks to.
async fn push_case(net: u8, mode: Mode, with_binding: bool) {
    let w = World::start(net, mode, Delivery::Push).await;
    let (node, stranger, mac) = (node_ip(net), stranger_ip(net), node_mac(net));
    let cluster = FakeCluster::new();
    let real = FakeTalosNode::start(FakeNodeConfig::new(IpAddr::V4(node), "cp-1"), &cluster)
        .await
        .unwrap();
    let evil = FakeTalosNode::start(
        FakeNodeConfig::new(IpAddr::V4(stranger), "stranger"),
        &cluster,
    )
    .await
    .unwrap();
    if with_binding {
        w.bind(mode, mac, node);
    }

    let (status, body) = w.script(stranger, mac).await;
    assert_eq!(status, 403, "{mode:?}: stranger's script: {body}");

    let ca = SimCa::new_os_ca().unwrap();
    let admin = ca.admin().unwrap();
    let creds = ClientCreds {
        ca_pem: ca.cert_pem.clone().into_bytes(),
        crt_pem: admin.cert_pem.into_bytes(),
        key_pem: talos_label(&admin.key_pem).into_bytes(),
    };
    let mut settings = Settings::new(w.tmp.path().join("state"));
    settings.poll_interval = Duration::from_millis(50);
    let prov = Provisioner::new(
        w.inventory.clone(),
        w.store.clone(),
        w.provision.lock().unwrap().take().expect("push delivery"),
        w.bus.clone(),
        Arc::new(SecretRenderer { ca }),
        creds,
        settings,
    );
    for _ in 0..3 {
        prov.drive_node("cp-1").await;
    }

    assert_eq!(
        evil.apply_calls(),
        0,
        "{mode:?}: the config was pushed to the stranger"
    );
    assert!(evil.last_applied_config().is_none());
    assert!(
        evil.served().is_empty(),
        "{mode:?}: talboot talked to the stranger: {:?}",
        evil.served().iter().map(|s| s.rpc).collect::<Vec<_>>()
    );
    if with_binding {
        assert!(
            real.served().iter().any(|s| s.rpc == "Version"),
            "{mode:?}: the bound node was never probed"
        );
    } else {
        assert!(real.served().is_empty(), "{mode:?}: no binding, no calls");
    }
    let events = w.events().await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("security.refused") && e.contains(&stranger.to_string())),
        "{events:?}"
    );
    real.shutdown().await;
    evil.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_authoritative_without_lease_never_reaches_the_stranger() {
    push_case(205, Mode::Authoritative, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_authoritative_with_lease_never_reaches_the_stranger() {
    push_case(206, Mode::Authoritative, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_proxy_without_binding_never_reaches_the_stranger() {
    push_case(207, Mode::Proxy, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_proxy_with_binding_never_reaches_the_stranger() {
    push_case(208, Mode::Proxy, true).await;
}

/// Proxy mode end to end on the DHCP side: the client's REQUEST of the router's offer in an
/// exchange talboot answered, and a ProxyDHCP REQUEST to talboot (ciaddr set), each leave a
/// binding of the chaddr to the client's address, which is then the only address the node's
/// script goes to.
#[tokio::test]
async fn proxy_exchange_records_the_binding_the_http_side_honours() {
    use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
    use dhcproto::{Decodable, Decoder, Encodable, Encoder};
    let net = 209;
    let w = World::start(net, Mode::Proxy, Delivery::Pull).await;
    let server_ip = Ipv4Addr::new(127, 0, net, 1);
    let ctx = talboot::dhcp::DecideCtx::from_inventory(
        &w.inventory,
        server_ip,
        talboot::dhcp::BootTargets::standard(server_ip, 8080),
    );
    let dhcp =
        talboot::dhcp::server::DhcpServer::bind_loopback(std::net::SocketAddrV4::new(server_ip, 0))
            .unwrap();
    let dhcp_addr = dhcp.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(dhcp.with_view(w.view.clone()).run(
        ctx,
        talboot::dhcp::FloodConfig::default(),
        w.store.clone(),
        w.dhcp.clone(),
        w.bus.clone(),
        cancel.clone(),
    ));

    let (node, mac) = (node_ip(net), node_mac(net));
    let pxe = |kind: MessageType, xid: u32, ciaddr: Ipv4Addr, sid: Ipv4Addr| {
        let mut m = Message::default();
        m.set_opcode(Opcode::BootRequest)
            .set_xid(xid)
            .set_ciaddr(ciaddr)
            .set_chaddr(&mac.0);
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        m.opts_mut().insert(DhcpOption::ServerIdentifier(sid));
        m.opts_mut().insert(DhcpOption::ClassIdentifier(
            b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
        ));
        m.opts_mut().insert(DhcpOption::ClientSystemArchitecture(
            dhcproto::v4::Architecture::X86_Bios,
        ));
        m
    };
    let encode = |m: &Message| {
        let mut bytes = Vec::new();
        m.encode(&mut Encoder::new(&mut bytes)).unwrap();
        bytes
    };
    let router = Ipv4Addr::new(127, 0, net, 254);

    // 1. iPXE/EDK2 on port 67: DISCOVER (talboot answers with a proxy OFFER), then the
    //    broadcast REQUEST of the router's offer (option 50): that address is the binding.
    //    (On loopback the DISCOVER comes from a real source address, not 0.0.0.0.)
    let elsewhere = tokio::net::UdpSocket::bind((Ipv4Addr::new(127, 0, net, 50), 0))
        .await
        .unwrap();
    let mut discover = pxe(
        MessageType::Discover,
        0x5ec0_0000,
        Ipv4Addr::UNSPECIFIED,
        router,
    );
    discover.opts_mut().remove(OptionCode::ServerIdentifier);
    let mut buf = vec![0u8; 1500];
    let mut offered = false;
    for _ in 0..20 {
        elsewhere
            .send_to(&encode(&discover), dhcp_addr)
            .await
            .unwrap();
        if let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_millis(250), elsewhere.recv_from(&mut buf)).await
        {
            let reply = Message::decode(&mut Decoder::new(&buf[..n])).unwrap();
            assert_eq!(reply.opts().msg_type(), Some(MessageType::Offer));
            offered = true;
            break;
        }
    }
    assert!(offered, "no proxy OFFER");
    let mut select = pxe(
        MessageType::Request,
        0x5ec0_0000,
        Ipv4Addr::UNSPECIFIED,
        router,
    );
    select
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(node));
    elsewhere
        .send_to(&encode(&select), dhcp_addr)
        .await
        .unwrap();
    let mut bound = None;
    for _ in 0..50 {
        bound = talboot::entitlement::proxy_binding(w.store.as_ref(), mac).unwrap();
        if bound.as_ref().is_some_and(|b| b.ip == node) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(bound.map(|b| b.ip), Some(node), "REQUEST did not bind");
    // A REQUEST in an exchange talboot never answered binds nothing.
    let mut stray = pxe(
        MessageType::Request,
        0x5ec0_0777,
        Ipv4Addr::UNSPECIFIED,
        router,
    );
    stray
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(stranger_ip(net)));
    elsewhere.send_to(&encode(&stray), dhcp_addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        talboot::entitlement::proxy_binding(w.store.as_ref(), mac)
            .unwrap()
            .map(|b| b.ip),
        Some(node)
    );
    talboot::entitlement::record_proxy_binding(
        &w.dhcp.bindings,
        mac,
        Ipv4Addr::new(127, 0, net, 60),
        0,
    )
    .unwrap();

    // 2. The ProxyDHCP REQUEST to talboot (iPXE's, to port 4011; ciaddr set).
    let mut req = Message::default();
    req.set_opcode(Opcode::BootRequest)
        .set_xid(0x5ec0_0001)
        .set_ciaddr(node)
        .set_chaddr(&mac.0);
    req.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Request));
    req.opts_mut()
        .insert(DhcpOption::ServerIdentifier(server_ip));
    req.opts_mut().insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00007:UNDI:003016".to_vec(),
    ));
    req.opts_mut().insert(DhcpOption::ClientSystemArchitecture(
        dhcproto::v4::Architecture::X86_Bios,
    ));
    let mut bytes = Vec::new();
    req.encode(&mut Encoder::new(&mut bytes)).unwrap();
    let sock = tokio::net::UdpSocket::bind((node, 0)).await.unwrap();
    let mut buf = vec![0u8; 1500];
    let mut answered = false;
    for _ in 0..20 {
        sock.send_to(&bytes, dhcp_addr).await.unwrap();
        if let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_millis(250), sock.recv_from(&mut buf)).await
        {
            let reply = Message::decode(&mut Decoder::new(&buf[..n])).unwrap();
            assert_eq!(reply.opts().msg_type(), Some(MessageType::Ack));
            answered = true;
            break;
        }
    }
    assert!(answered, "no ProxyDHCP ACK");
    let bound = talboot::entitlement::proxy_binding(w.store.as_ref(), mac)
        .unwrap()
        .expect("the exchange left a binding");
    assert_eq!(bound.ip, node);

    let (status, body) = w.script(stranger_ip(net), mac).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = w.script(node, mac).await;
    assert_eq!(status, 200, "{body}");
    assert!(token_path(&body).is_some(), "{body}");
    cancel.cancel();
    let _ = task.await;
}

struct Served(Option<Child>);

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-s", "--noproxy", "*", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl is installed by scripts/test-deps");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_string(), body.to_string())
}

/// The `serve` binary, pull mode, debug logs on: the node fetches its script and config, a
/// stranger tries the token; the token appears nowhere in serve's output, the redacted path
/// does; `/api/nodes` and `/metrics` answer on the admin listener only; a non-loopback admin
/// listener is refused.
#[test]
fn serve_never_logs_a_token_and_keeps_the_api_off_the_provisioning_listener() {
    let tmp = tempfile::tempdir().unwrap();
    let net = 0;
    let inv = tmp.path().join("talboot.yaml");
    std::fs::write(
        &inv,
        inventory_yaml(net, Mode::Authoritative, Delivery::Pull),
    )
    .unwrap();
    fake_images(&inv, &tmp.path().join("images"));
    std::fs::create_dir_all(tmp.path().join("ipxe")).unwrap();
    let configs = tmp.path().join("configs");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(
        configs.join("cp-1.yaml"),
        format!("version: v1alpha1\n# {SECRET}\n"),
    )
    .unwrap();
    // The lease talboot's DHCP would have written (serve runs with --no-dhcp here).
    {
        let w = talboot::store::open(&tmp.path().join("state"))
            .unwrap()
            .split()
            .1;
        let dhcp = DhcpWriters {
            leases: w.leases,
            bindings: w.meta,
        };
        bind(&dhcp, Mode::Authoritative, node_mac(net), node_ip(net));
    }
    let (mut http, mut admin) = (free_port(), free_port());
    let args = |http: u16, admin_listen: String| -> Vec<String> {
        vec![
            "serve".into(),
            "-c".into(),
            inv.display().to_string(),
            "--state-dir".into(),
            tmp.path().join("state").display().to_string(),
            "--images".into(),
            tmp.path().join("images").display().to_string(),
            "--ipxe-dir".into(),
            tmp.path().join("ipxe").display().to_string(),
            "--configs".into(),
            configs.display().to_string(),
            "--advertise".into(),
            "127.0.0.1".into(),
            "--http-port".into(),
            http.to_string(),
            "--admin-listen".into(),
            admin_listen,
            "--no-tftp".into(),
            "--no-dhcp".into(),
            "--log".into(),
            "debug".into(),
        ]
    };

    // A non-loopback admin listener without the admin token is refused before anything is
    // served (with the token: tests/admin_token.rs).
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(args(http, format!("0.0.0.0:{admin}")))
        .env_remove("RUST_LOG")
        .env_remove("TALBOOT_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("off loopback it needs a token: pass --admin-token-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let log = tmp.path().join("serve.log");
    let node = node_ip(net).to_string();
    let stranger = stranger_ip(net).to_string();
    // A port free_port() saw free can be taken before serve binds it (the other tests of this
    // file run beside it and connect from ephemeral ports): then pick new ones and start again.
    let mut attempts = 0;
    let (mut served, script_url, script) = 'start: loop {
        attempts += 1;
        let child = Command::new(env!("CARGO_BIN_EXE_talboot"))
            .args(args(http, format!("127.0.0.1:{admin}")))
            .env_remove("RUST_LOG")
            .stdout(std::fs::File::create(tmp.path().join("serve.out")).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut served = Served(Some(child));
        let script_url = format!(
            "http://127.0.0.1:{http}/boot.ipxe?mac={}&arch=x86_64",
            node_mac(net)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, body) = curl(&["--interface", &node, &script_url]);
            if code == "200" {
                break 'start (served, script_url, body);
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let exited = served.0.as_mut().unwrap().try_wait().unwrap().is_some();
            if exited && text.contains("Address already in use") && attempts < 5 {
                (http, admin) = (free_port(), free_port());
                continue 'start;
            }
            assert!(
                !exited && Instant::now() < deadline,
                "serve did not come up ({code}):\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let path = token_path(&script).unwrap_or_else(|| panic!("no token: {script}"));
    let token = path.trim_start_matches("/config/").to_string();
    let config_url = format!("http://127.0.0.1:{http}{path}");

    let (code, _) = curl(&["--interface", &stranger, &script_url]);
    assert_eq!(code, "403");
    let (code, body) = curl(&["--interface", &stranger, &config_url]);
    assert_eq!(code, "403");
    assert!(!body.contains(SECRET));
    let (code, body) = curl(&["--interface", &node, &config_url]);
    assert_eq!(code, "200");
    assert!(body.contains(SECRET));

    // The API is not on the provisioning listener, from any address; it is on the admin one.
    for from in [&node, &stranger, &"127.0.0.1".to_string()] {
        for p in [
            "/api/nodes",
            "/metrics",
            "/api/nodes/cp-1/rebuild",
            "/api/rollouts",
            "/api/rollouts/1",
        ] {
            let (code, body) = curl(&["--interface", from, &format!("http://127.0.0.1:{http}{p}")]);
            assert_eq!(code, "404", "{p} from {from}: {body}");
            assert!(!body.contains(&node_mac(net).to_string()), "{body}");
        }
    }
    let (code, body) = curl(&[&format!("http://127.0.0.1:{admin}/api/nodes")]);
    assert_eq!(code, "200");
    assert!(body.contains(&node_mac(net).to_string()), "{body}");
    // A pull-mode serve has no admin Talos credentials: it refuses rollouts (`talboot
    // apply`/`upgrade` through serve) with the reason, before reading the request.
    let (code, body) = curl(&[
        "-X",
        "POST",
        "--data",
        "{}",
        &format!("http://127.0.0.1:{admin}/api/rollouts"),
    ]);
    assert_eq!(code, "503", "{body}");
    assert!(body.contains("does not provision nodes"), "{body}");

    // `status` reads the admin listener while serve holds the store.
    let out = Command::new(env!("CARGO_BIN_EXE_talboot"))
        .args(["status", "-c"])
        .arg(&inv)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("cp-1"));

    let mut child = served.0.take().unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.wait();
    let mut logged = std::fs::read_to_string(&log).unwrap();
    logged.push_str(&std::fs::read_to_string(tmp.path().join("serve.out")).unwrap());
    assert!(
        !logged.contains(&token),
        "the token is in the log:\n{logged}"
    );
    assert!(
        logged.contains("/config/<redacted>"),
        "the config requests were not logged at all:\n{logged}"
    );
    assert!(!logged.contains(SECRET), "the config is in the log");
    // Nor on any timeline.
    let store = talboot::store::open(&tmp.path().join("state")).unwrap();
    let dump = store.export_json().unwrap().to_string();
    assert!(!dump.contains(&token), "the token is in the store");
    assert!(dump.contains("security.refused"), "{dump}");
}
