//! The HTTP side on loopback: per-MAC scripts, artifacts with Range/HEAD/ETag, and pull-mode
//! config release behind one-time tokens (reuse, wrong source address, unknown, closed window).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use talboot::artifacts::{Catalog, Entry, FileRecord, Kind, SetId, hash_file};
use talboot::events::{EventBus, SystemClock};
use talboot::http::{ConfigDir, HttpApp, router, script::Scripts, tokens::Tokens};
use talboot::inventory::{Delivery, load_with_env};
use talboot::store::{NodePhase, NodeRecord, Store};
use tokio_util::sync::CancellationToken;

struct Env {
    _tmp: tempfile::TempDir,
    base: String,
    store: Arc<dyn Store>,
    /// The leases' writer: the test acts as the DHCP server.
    leases: talboot::store::LeaseWriter,
    /// The node records' writer, shared with the offline observer when no provisioner runs
    /// (the test acts as the provisioner, or as the observer's other caller).
    nodes: Arc<talboot::store::NodeWriter>,
    /// The read view the HTTP side reads: a test that writes the store directly is the
    /// writer, and republishes.
    view: Arc<talboot::view::StateView>,
    inv: Arc<talboot::inventory::Inventory>,
    shutdown: CancellationToken,
    kernel: Vec<u8>,
    schematic: String,
}

impl Env {
    /// Publish what the test wrote to the store, as the store's writers do after a commit.
    fn publish(&self) {
        self.view.reload(self.store.as_ref(), &self.inv).unwrap();
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start(delivery: Delivery) -> Env {
    start_with(delivery, talboot::http::server::Limits::default(), false).await
}

async fn start_with(
    delivery: Delivery,
    limits: talboot::http::server::Limits,
    provisioner: bool,
) -> Env {
    start_edited(delivery, limits, provisioner, |_| {}).await
}

async fn start_edited(
    delivery: Delivery,
    limits: talboot::http::server::Limits,
    provisioner: bool,
    edit: fn(&mut talboot::inventory::Inventory),
) -> Env {
    talboot::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let mut inv = load_with_env(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml"),
        &BTreeMap::new(),
    )
    .unwrap()
    .inventory;
    inv.boot.delivery = delivery;
    let before = inv.cluster.talos_version.value.clone();
    edit(&mut inv);
    let schematic = inv.cluster.installer.schematic_id().to_string();
    let images = tmp.path().join("images");
    let kernel: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let mut catalog = Catalog::load(&images).unwrap();
    let mut sets = vec![(
        inv.cluster.talos_version.value.clone(),
        kernel.clone(),
        vec![7u8; 50_000],
    )];
    // An edit that changed the version leaves the cache as `talboot upgrade --talos` does:
    // the new version's set pulled next to the old one (whose kernel differs).
    if before != inv.cluster.talos_version.value {
        sets.push((before, vec![1u8; 100_000], vec![2u8; 50_000]));
    }
    for (version, kernel, initramfs) in sets {
        let id = SetId::new(&version, &schematic, talboot::inventory::Arch::Amd64);
        let mut files = BTreeMap::new();
        for (kind, bytes) in [
            (Kind::Kernel, kernel),
            (Kind::Initramfs, initramfs),
            (
                Kind::Cmdline,
                b"talos.platform=metal console=tty0 slab_nomerge pti=on".to_vec(),
            ),
            (Kind::Uki, b"MZ plain UKI".to_vec()),
            (Kind::SecureBootUki, b"MZ signed UKI".to_vec()),
        ] {
            let p = images.join(id.rel_dir()).join(kind.file_name());
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, bytes).unwrap();
            let (size, sha256) = hash_file(&p).unwrap();
            files.insert(
                kind,
                FileRecord {
                    size,
                    sha256,
                    compression: None,
                    uki: None,
                },
            );
        }
        catalog.upsert(Entry {
            id,
            source: "test".into(),
            pulled_at: 0,
            files,
            origin: Default::default(),
        });
    }
    let configs = tmp.path().join("configs");
    std::fs::create_dir_all(&configs).unwrap();
    for n in &inv.nodes {
        std::fs::write(
            configs.join(format!("{}.yaml", n.name.as_str())),
            format!("version: v1alpha1\n# {}\n", n.name.as_str()),
        )
        .unwrap();
    }
    let (store, writers) = talboot::store::open(&tmp.path().join("state"))
        .unwrap()
        .split();
    let store: Arc<dyn Store> = store;
    let nodes = Arc::new(writers.nodes);
    let (events, _writer) = EventBus::start(writers.events, Arc::new(SystemClock));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let inv = Arc::new(inv);
    let view = Arc::new(talboot::view::StateView::new());
    let app = Arc::new(HttpApp {
        inventory: inv.clone(),
        store: store.clone(),
        view: view.clone(),
        events,
        images_dir: images,
        catalog,
        cmdlines: Default::default(),
        base_url: base.clone(),
        scripts: Scripts::new(),
        configs: Arc::new(ConfigDir(configs)),
        tokens: Tokens::start(store.clone(), writers.tokens).0,
        observer: if provisioner {
            Arc::new(talboot::provision::ProvisionerObserves)
        } else {
            Arc::new(talboot::provision::OfflineObserver {
                inventory: inv.clone(),
                store: store.clone(),
                nodes: nodes.clone(),
                view: view.clone(),
            })
        },
    });
    let shutdown = CancellationToken::new();
    tokio::spawn(talboot::http::server::serve(
        listener,
        router(app),
        limits,
        "provisioning",
        shutdown.clone(),
    ));
    Env {
        _tmp: tmp,
        base,
        store,
        leases: writers.leases,
        nodes,
        view,
        inv,
        shutdown,
        kernel,
        schematic,
    }
}

/// The UKIs are what EDK2's HTTP Boot fetches (NetworkPkg/HttpBootDxe at edk2-stable202211):
/// HEAD first for the size (`HttpBootGetBootFile` with HeaderOnly), then GET; the image type
/// from `Content-Type: application/efi` or the `.efi` of the URL (`HttpBootCheckImageType`).
/// Boot media, not secrets: any address may fetch them, as the kernel.
#[tokio::test]
async fn ukis_answer_head_with_their_length_and_application_efi() {
    let env = start(Delivery::Push).await;
    let c = reqwest::Client::new();
    for (file, body) in [
        ("uki.efi", &b"MZ plain UKI"[..]),
        ("secureboot-uki.efi", b"MZ signed UKI"),
    ] {
        let url = format!("{}/assets/v1.13.9/{}/amd64/{file}", env.base, env.schematic);
        assert!(url.ends_with(".efi"));
        let head = c.head(&url).send().await.unwrap();
        assert_eq!(head.status(), 200, "{url}");
        assert_eq!(head.headers()["content-type"], "application/efi");
        assert_eq!(head.headers()["content-length"], body.len().to_string());
        let get = c.get(&url).send().await.unwrap();
        assert_eq!(get.status(), 200);
        assert_eq!(get.headers()["content-type"], "application/efi");
        assert_eq!(get.bytes().await.unwrap().as_ref(), body);
    }
}

/// The lease talboot's DHCP would have bound for `mac` (scripts and configs go only there).
fn lease(env: &Env, mac: &str, ip: &str) {
    env.leases
        .put_lease(&talboot::store::Lease {
            mac: mac.parse().unwrap(),
            ip: ip.parse().unwrap(),
            hostname: None,
            state: talboot::store::LeaseState::Bound,
            expires_at_unix: u64::MAX / 2,
            updated_at_unix: 0,
        })
        .unwrap();
    env.publish();
}

fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// Issue 11: while a provisioner runs it is the only writer of node records; the script
/// handler only publishes what it saw (it used to write back a record it had read before
/// publishing, losing the provisioner's update in between).
#[tokio::test]
async fn with_a_provisioner_running_the_script_handler_writes_no_record() {
    let env = start_with(
        Delivery::Push,
        talboot::http::server::Limits::default(),
        true,
    )
    .await;
    lease(&env, "bc:24:11:40:00:01", "127.0.0.1");
    let s = reqwest::Client::new()
        .get(format!(
            "{}/boot.ipxe?mac=bc-24-11-40-00-01&arch=x86_64&platform=efi",
            env.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(s.contains("/amd64/kernel"), "{s}");
    assert_eq!(env.store.node("k8s-ctrl-01").unwrap(), None);
    // What it saw is on the node's timeline, for the provisioner.
    loop {
        let events = env.store.events("k8s-ctrl-01", 0, 100).unwrap();
        if events.iter().any(|e| e.kind == "http.script") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn scripts_chain_then_boot_talos() {
    let env = start(Delivery::Push).await;
    lease(&env, "bc:24:11:40:00:01", "127.0.0.1");
    let c = reqwest::Client::new();
    let chain = c
        .get(format!("{}/boot.ipxe", env.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        chain.contains("boot.ipxe?mac=${netX/mac:hexhyp}"),
        "{chain}"
    );
    let s = c
        .get(format!(
            "{}/boot.ipxe?mac=bc-24-11-40-00-01&arch=x86_64&platform=efi",
            env.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(s.contains(&format!("kernel {}/assets/v1.13.9/{}/amd64/kernel talos.platform=metal console=tty0 slab_nomerge pti=on initrd=initramfs.xz", env.base, env.schematic)), "{s}");
    assert!(!s.contains("talos.config="), "push mode: {s}");
    let rec = env.store.node("k8s-ctrl-01").unwrap().unwrap();
    assert_eq!(rec.phase, NodePhase::Booting);
    assert_eq!(rec.last_seen_addr, Some("127.0.0.1".parse().unwrap()));

    // Once installed (window closed), the same machine is sent to its disk.
    env.nodes
        .put_node(&NodeRecord {
            phase: NodePhase::Ready,
            provisioning_window_open: false,
            ..rec
        })
        .unwrap();
    env.publish();
    let s = c
        .get(format!("{}/boot.ipxe?mac=bc:24:11:40:00:01", env.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        s.contains("booting from local disk") && s.contains("\nexit\n"),
        "{s}"
    );
}

/// After a Talos upgrade (the new version's boot set pulled next to the old one, and
/// `talosVersion` bumped in the inventory as `talboot upgrade --talos` asks), a node that
/// network-boots (a rebuild, a replaced disk) gets the new version's kernel and initramfs.
#[tokio::test]
async fn a_node_that_network_boots_after_a_talos_upgrade_gets_the_new_version() {
    let env = start_edited(
        Delivery::Push,
        talboot::http::server::Limits::default(),
        false,
        |inv| inv.cluster.talos_version.value = "v1.14.0".parse().unwrap(),
    )
    .await;
    lease(&env, "bc:24:11:40:00:01", "127.0.0.1");
    let c = reqwest::Client::new();
    let s = c
        .get(format!(
            "{}/boot.ipxe?mac=bc-24-11-40-00-01&arch=x86_64&platform=efi",
            env.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let assets = format!("{}/assets/v1.14.0/{}/amd64", env.base, env.schematic);
    assert!(s.contains(&format!("kernel {assets}/kernel ")), "{s}");
    assert!(
        s.contains(&format!("initrd --name initramfs.xz {assets}/initramfs.xz")),
        "{s}"
    );
    assert!(!s.contains("v1.13.9"), "{s}");
    let get = |url: String| {
        let c = c.clone();
        async move {
            c.get(url)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
                .to_vec()
        }
    };
    assert!(get(format!("{assets}/kernel")).await == env.kernel);
    assert!(get(format!("{assets}/initramfs.xz")).await == vec![7u8; 50_000]);
    // The old set is still there, and different: the script's choice is what decides.
    let old = get(format!(
        "{}/assets/v1.13.9/{}/amd64/kernel",
        env.base, env.schematic
    ))
    .await;
    assert!(old == vec![1u8; 100_000], "the old set is served too");
}

/// The `http404` local-boot method: an installed node's per-MAC script is a 404 (so iPXE's
/// chain fails and it exits to the firmware), while a node being provisioned still gets Talos.
#[tokio::test]
async fn an_installed_node_with_http404_local_boot_gets_a_404() {
    let env = start_edited(
        Delivery::Push,
        talboot::http::server::Limits::default(),
        false,
        |inv| inv.boot.local_boot = talboot::inventory::LocalBoot::Http404,
    )
    .await;
    lease(&env, "bc:24:11:40:00:01", "127.0.0.1");
    let c = reqwest::Client::new();
    let url = format!("{}/boot.ipxe?mac=bc-24-11-40-00-01&arch=x86_64", env.base);
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let rec = env.store.node("k8s-ctrl-01").unwrap().unwrap();
    env.nodes
        .put_node(&NodeRecord {
            phase: NodePhase::Ready,
            provisioning_window_open: false,
            ..rec
        })
        .unwrap();
    // Written behind the provisioner's back: publish it to the read view, as it would.
    env.publish();
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let body = r.text().await.unwrap();
    assert!(
        !body.starts_with("#!ipxe") && body.contains("k8s-ctrl-01"),
        "{body}"
    );
}

#[tokio::test]
async fn assets_support_range_head_and_etag() {
    let env = start(Delivery::Push).await;
    let c = reqwest::Client::new();
    let url = format!("{}/assets/v1.13.9/{}/amd64/kernel", env.base, env.schematic);
    let full = c.get(&url).send().await.unwrap();
    assert_eq!(full.status(), 200);
    assert_eq!(full.headers()["content-length"], "200000");
    let etag = full.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(full.bytes().await.unwrap().as_ref(), env.kernel.as_slice());

    let part = c
        .get(&url)
        .header("range", "bytes=1000-1999")
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 1000-1999/200000");
    assert_eq!(
        part.bytes().await.unwrap().as_ref(),
        &env.kernel[1000..2000]
    );

    let head = c.head(&url).send().await.unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["content-length"], "200000");

    let cached = c
        .get(&url)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(cached.status(), 304);
    let bad = c
        .get(&url)
        .header("range", "bytes=300000-")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 416);
    let missing = c
        .get(format!(
            "{}/assets/v1.13.9/{}/amd64/../../etc/passwd",
            env.base, env.schematic
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

async fn script_token(env: &Env, from: &str, mac: &str) -> Option<String> {
    let s = client_from(from)
        .get(format!("{}/boot.ipxe?mac={mac}&arch=x86_64", env.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let i = s.find("talos.config=")?;
    let url = s[i + "talos.config=".len()..]
        .split_whitespace()
        .next()
        .unwrap();
    Some(url.to_string())
}

#[tokio::test]
async fn pull_configs_are_released_once_to_the_entitled_node() {
    let env = start(Delivery::Pull).await;
    lease(&env, "bc:24:11:40:00:01", "127.0.0.11");
    lease(&env, "bc:24:11:40:00:02", "127.0.0.12");
    let url = script_token(&env, "127.0.0.11", "bc:24:11:40:00:01")
        .await
        .expect("pull mode puts talos.config= in the script");
    assert!(url.starts_with(&format!("{}/config/", env.base)), "{url}");

    // Wrong source address: refused, and the token stays usable by the right node.
    let r = client_from("127.0.0.12").get(&url).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.text().await.unwrap(), "forbidden\n");

    let r = client_from("127.0.0.11").get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.text().await.unwrap(),
        "version: v1alpha1\n# k8s-ctrl-01\n"
    );

    // Reuse: refused.
    let r = client_from("127.0.0.11").get(&url).send().await.unwrap();
    assert_eq!(r.status(), 403);

    // Unknown and malformed tokens: refused.
    for t in ["0".repeat(64), "../../etc/passwd".into(), "x".into()] {
        let r = client_from("127.0.0.11")
            .get(format!("{}/config/{t}", env.base))
            .send()
            .await
            .unwrap();
        assert!(
            r.status() == 403 || r.status() == 404,
            "{t}: {}",
            r.status()
        );
    }

    // Closed window: a token issued before the node was marked installed no longer works.
    let url2 = script_token(&env, "127.0.0.12", "bc:24:11:40:00:02")
        .await
        .unwrap();
    let mut rec = env.store.node("k8s-ctrl-02").unwrap().unwrap();
    rec.provisioning_window_open = false;
    env.nodes.put_node(&rec).unwrap();
    env.publish();
    let r = client_from("127.0.0.12").get(&url2).send().await.unwrap();
    assert_eq!(r.status(), 403);

    // Every refusal and release is on the node's timeline.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let kinds: Vec<String> = env
        .store
        .events("k8s-ctrl-01", 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.kind, e.detail))
        .collect();
    assert!(
        kinds.iter().any(|k| k.starts_with("config.released")),
        "{kinds:?}"
    );
    // The wrong address is a refusal of entitlement, naming the requester; the reuse a
    // refusal of the token.
    assert!(
        kinds
            .iter()
            .any(|k| k.starts_with("security.refused") && k.contains("127.0.0.12")),
        "{kinds:?}"
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| k.starts_with("config.refused"))
            .count(),
        1,
        "{kinds:?}"
    );
    assert!(
        env.store
            .events("k8s-ctrl-02", 0, 100)
            .unwrap()
            .iter()
            .any(|e| e.detail.contains("window"))
    );
}

#[tokio::test]
async fn a_script_from_another_address_than_the_lease_gets_no_token() {
    let env = start(Delivery::Pull).await;
    lease(&env, "bc:24:11:40:00:03", "127.0.0.13");
    assert!(
        script_token(&env, "127.0.0.14", "bc:24:11:40:00:03")
            .await
            .is_none()
    );
    assert!(
        script_token(&env, "127.0.0.13", "bc:24:11:40:00:03")
            .await
            .is_some()
    );
}

/// `curl` from a blocking thread; stdout, panicking when curl fails.
async fn curl(args: Vec<String>) -> Vec<u8> {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "20"])
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "curl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn artifact_bodies_are_byte_identical_full_and_ranged_across_sendfile_chunks() {
    // The 200,000-byte kernel takes 13 sendfile calls of at most 16 KiB.
    let env = start_with(
        Delivery::Push,
        talboot::http::server::Limits {
            sendfile_chunk: 16 * 1024,
            ..Default::default()
        },
        false,
    )
    .await;
    let url = format!("{}/assets/v1.13.9/{}/amd64/kernel", env.base, env.schematic);
    let k = &env.kernel;
    let n = k.len();
    assert_eq!(curl(vec![url.clone()]).await, *k);
    let cases: Vec<(&str, std::ops::Range<usize>)> = vec![
        ("bytes=0-0", 0..1),
        ("bytes=16383-16384", 16383..16385),
        ("bytes=1000-", 1000..n),
        ("bytes=-1", n - 1..n),
        ("bytes=199999-199999", n - 1..n),
        ("bytes=150000-900000", 150_000..n),
        ("bytes=-200000", 0..n),
        ("bytes=-300000", 0..n),
    ];
    for (range, want) in cases {
        let out = curl(vec![
            "-H".into(),
            format!("range: {range}"),
            "-D".into(),
            "-".into(),
            url.clone(),
        ])
        .await;
        let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&out[..split]).to_lowercase();
        assert!(head.starts_with("http/1.1 206"), "{range}: {head}");
        assert!(
            head.contains(&format!(
                "content-range: bytes {}-{}/{n}\r\n",
                want.start,
                want.end - 1
            )),
            "{range}: {head}"
        );
        assert!(
            head.contains(&format!("content-length: {}\r\n", want.len())),
            "{range}: {head}"
        );
        assert_eq!(&out[split..], &k[want.clone()], "{range}");
    }
}

#[tokio::test]
async fn ipxe_fetches_kernel_then_initramfs_on_one_connection() {
    let env = start(Delivery::Push).await;
    lease(&env, "bc:24:11:40:00:01", "127.0.0.1");
    let dir = tempfile::tempdir().unwrap();
    let base = format!("{}/assets/v1.13.9/{}/amd64", env.base, env.schematic);
    let (k, i) = (dir.path().join("k"), dir.path().join("i"));
    // One curl, two URLs: curl reuses the connection when the server keeps it open, and
    // `num_connects` says how many connections each transfer opened.
    let out = curl(vec![
        "-w".into(),
        "%{num_connects}\n".into(),
        "-o".into(),
        k.display().to_string(),
        format!("{base}/kernel"),
        "-o".into(),
        i.display().to_string(),
        format!("{base}/initramfs.xz"),
    ])
    .await;
    assert_eq!(String::from_utf8(out).unwrap(), "1\n0\n");
    assert_eq!(std::fs::read(k).unwrap(), env.kernel);
    assert_eq!(std::fs::read(i).unwrap(), vec![7u8; 50_000]);
    // Both whole artifacts are boot steps on the node's timeline, as before.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let kinds: Vec<String> = env
            .store
            .events("k8s-ctrl-01", 0, 50)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        if kinds.iter().any(|k| k == "http.kernel") && kinds.iter().any(|k| k == "http.initramfs") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{kinds:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Issue 11 (read view): the HTTP side reads bindings from the view the DHCP server
/// publishes to, and a view that lags the store fails closed. When the node's binding moves,
/// its old address is refused from the moment the DHCP commit begins (script and config),
/// the new one only once the commit is published.
#[tokio::test]
async fn when_the_binding_moves_the_old_address_is_refused_before_the_commit_lands() {
    use talboot::store::{Lease, LeaseChange, LeaseCommit, LeaseState};
    let env = start(Delivery::Pull).await;
    lease(&env, "bc:24:11:40:00:01", "127.0.0.21");
    let url = script_token(&env, "127.0.0.21", "bc:24:11:40:00:01")
        .await
        .expect("entitled at the first address");

    // The DHCP server's commit of the move, step by step as its commit loop does it.
    let moved = [LeaseCommit {
        writes: vec![LeaseChange::Upsert(Lease {
            mac: "bc:24:11:40:00:01".parse().unwrap(),
            ip: "127.0.0.22".parse().unwrap(),
            hostname: None,
            state: LeaseState::Bound,
            expires_at_unix: u64::MAX / 2,
            updated_at_unix: 0,
        })],
        events: vec![],
    }];
    let script_status = |from: &'static str| {
        let base = env.base.clone();
        async move {
            client_from(from)
                .get(format!(
                    "{base}/boot.ipxe?mac=bc-24-11-40-00-01&arch=x86_64"
                ))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let touch = env.view.begin_leases(&moved);
    // In flight, and committed but not yet published: nobody is entitled.
    assert_eq!(
        script_status("127.0.0.21").await,
        403,
        "old address, in flight"
    );
    assert_eq!(
        script_status("127.0.0.22").await,
        403,
        "new address, in flight"
    );
    env.leases.commit_leases(&moved, true).unwrap();
    assert_eq!(
        script_status("127.0.0.21").await,
        403,
        "old address, unpublished"
    );
    assert_eq!(
        script_status("127.0.0.22").await,
        403,
        "new address, unpublished"
    );
    touch.refresh(&env.view, env.store.as_ref());
    assert_eq!(
        script_status("127.0.0.21").await,
        403,
        "old address, published"
    );
    assert_eq!(
        script_status("127.0.0.22").await,
        200,
        "new address, published"
    );
    // The token issued at the old address does not outlive its binding.
    let r = client_from("127.0.0.21").get(&url).send().await.unwrap();
    assert_eq!(r.status(), 403);
}
