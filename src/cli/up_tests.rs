//! `talboot up` on the simulated lab (`config/lab.yaml`'s three machines, moved onto loopback
//! as `demo` moves a rack): the same serving code path as the CLI, with the machines powered
//! on by [`Hooks::started`] as `demo` powers them on. One rack per test function (the
//! machines' loopback addresses are fixed by the inventory).

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use clap::Parser as _;

use super::*;
use crate::appliance::DhcpPlan;
use crate::artifacts::Catalog;
use crate::sim::demo::{self as sim, SimNode};
use crate::sim::kube::KubeDouble;
use crate::sim::machine::Wire;
use crate::sim::relocate::Relocation;
use crate::sim::talos::FakeCluster;
use crate::store::{ClusterStep, Store};

/// The recipient in `config/lab.yaml`, whose identity nobody here has.
const LAB_RECIPIENT: &str = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p";

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Everything a run needs on disk, and the stand-in Image Factory.
struct Lab {
    dir: tempfile::TempDir,
    inventory: PathBuf,
    inv: Inventory,
    relocation: Relocation,
    identity: PathBuf,
    factory_url: String,
    factory_stop: CancellationToken,
}

impl Lab {
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.factory_stop.cancel();
    }
}

/// The lab on loopback with its own age recipient; the boot sets are only on a stand-in
/// factory (same URL layout as factory.talos.dev), so the first run has to pull them.
async fn lab() -> Lab {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let src = repo("config/lab.yaml");
    let original = inventory::load(&src).unwrap().inventory;
    let relocation = Relocation::for_inventory(&original).unwrap();
    let inventory = sim::mirror_config(&src, &relocation, &dir.path().join("config")).unwrap();
    let id = ::age::x25519::Identity::generate();
    let identity = dir.path().join("key.txt");
    {
        use ::age::secrecy::ExposeSecret;
        std::fs::write(&identity, format!("{}\n", id.to_string().expose_secret())).unwrap();
    }
    let text = std::fs::read_to_string(&inventory).unwrap();
    assert!(text.contains(LAB_RECIPIENT));
    std::fs::write(
        &inventory,
        text.replace(LAB_RECIPIENT, &id.to_public().to_string()),
    )
    .unwrap();
    let inv = inventory::load(&inventory).unwrap().inventory;
    crate::sim::assets::write_ipxe_binaries(&dir.path().join("tftp")).unwrap();
    sim::write_addon_manifests(&dir.path().join("addons")).unwrap();
    let published = dir.path().join("factory");
    crate::sim::assets::write_boot_sets(&published, &inv, 0).unwrap();
    let (factory_url, factory_stop) = stand_in_factory(published).await;
    Lab {
        dir,
        inventory,
        inv,
        relocation,
        identity,
        factory_url,
        factory_stop,
    }
}

/// Serves `dir`'s boot sets at the Image Factory's paths
/// (`/image/<schematic>/<version>/kernel-<arch>`, ...), see [`factory::url`].
async fn stand_in_factory(dir: PathBuf) -> (String, CancellationToken) {
    use axum::extract::Path as UrlPath;
    use axum::http::StatusCode;
    let router = axum::Router::new().route(
        "/image/{schematic}/{version}/{file}",
        axum::routing::get(
            move |UrlPath((schematic, version, file)): UrlPath<(String, String, String)>| {
                let dir = dir.clone();
                async move {
                    let (kind, arch) = if let Some(a) = file.strip_prefix("kernel-") {
                        (artifacts::Kind::Kernel, a.to_owned())
                    } else if let Some(a) = file
                        .strip_prefix("initramfs-")
                        .and_then(|a| a.strip_suffix(".xz"))
                    {
                        (artifacts::Kind::Initramfs, a.to_owned())
                    } else if let Some(a) = file.strip_prefix("cmdline-metal-") {
                        (artifacts::Kind::Cmdline, a.to_owned())
                    } else {
                        return Err(StatusCode::NOT_FOUND);
                    };
                    let (Ok(v), Some(arch)) = (
                        version.parse::<inventory::Version>(),
                        inventory::Arch::parse(&arch),
                    ) else {
                        return Err(StatusCode::NOT_FOUND);
                    };
                    let id = SetId::new(&v, &schematic, arch);
                    std::fs::read(dir.join(id.rel_dir()).join(kind.file_name()))
                        .map_err(|_| StatusCode::NOT_FOUND)
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(crate::http::serve(listener, router, stop.clone()));
    (url, stop)
}

/// `talboot up` as the operator would type it for this lab.
fn args(lab: &Lab, extra: &[&str]) -> Args {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        up: Args,
    }
    let p = |rel: &str| lab.path(rel).display().to_string();
    let mut argv: Vec<String> = vec![
        "up".into(),
        "-c".into(),
        lab.inventory.display().to_string(),
        "--state-dir".into(),
        p("state"),
        "--images".into(),
        p("images"),
        "--ipxe-dir".into(),
        p("tftp"),
        "--configs".into(),
        p("out"),
        "--addon-manifests".into(),
        p("addons"),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
        "--age-identity".into(),
        lab.identity.display().to_string(),
        "--drift-interval".into(),
        "0".into(),
        "--timeout".into(),
        "300".into(),
        "--quiet".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    if !extra.contains(&"--images-from") {
        argv.extend(["--factory".to_owned(), lab.factory_url.clone()]);
    }
    Cli::try_parse_from(argv).unwrap().up
}

/// A `status --watch` follower: whether on a terminal, and what it wrote.
type Watcher = tokio::task::JoinHandle<(bool, Vec<u8>)>;

/// The simulated rack's cluster side, and the machines once powered on.
#[derive(Clone)]
struct Rack {
    kube: Arc<KubeDouble>,
    cluster: FakeCluster,
    stop: CancellationToken,
    machines: Arc<Mutex<Vec<Arc<SimNode>>>>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    /// talboot's addresses of the last run.
    started: Arc<Mutex<Option<Started>>>,
    /// `status --watch` followers of the admin API (plain, terminal): their output.
    watchers: Arc<Mutex<Vec<Watcher>>>,
}

impl Rack {
    async fn start(lab: &Lab) -> Rack {
        let crate::inventory::EndpointHost::Ip(api_ip) = lab.inv.cluster.endpoint.host.clone()
        else {
            panic!("the relocated lab's endpoint is an address");
        };
        let (kube, cluster) = sim::start_api_double(&lab.inv, api_ip).await.unwrap();
        Rack {
            kube,
            cluster,
            stop: CancellationToken::new(),
            machines: Default::default(),
            tasks: Default::default(),
            started: Default::default(),
            watchers: Default::default(),
        }
    }

    /// Hooks that put talboot's sockets on the lab's loopback advertise address (the ports of
    /// `reuse`, or fresh ones) and, when `power_on`, power the machines on once it serves.
    fn hooks(
        &self,
        lab: &Lab,
        reuse: Option<Started>,
        power_on: bool,
    ) -> (Hooks, CancellationToken) {
        let stop = CancellationToken::new();
        let adjust = move |plan: &mut Plan| {
            let adv = plan.advertise;
            let port = |a: Option<Option<SocketAddr>>| a.flatten().map_or(0, |a| a.port());
            plan.dhcp = Some(DhcpPlan::Loopback(SocketAddrV4::new(
                adv,
                port(reuse.map(|r| r.dhcp)),
            )));
            plan.tftp = Some((
                SocketAddr::new(adv.into(), port(reuse.map(|r| r.tftp))),
                crate::tftp::TftpConfig {
                    max_blksize: 1468,
                    ..Default::default()
                },
            ));
            plan.http = SocketAddr::new(adv.into(), 0);
            plan.ipv6_ra = None;
            // As `demo` runs it: quick polls, and timeouts that fit a simulated rack.
            if let Some(p) = plan.provisioning.as_mut() {
                p.settings.poll_interval = Duration::from_millis(250);
                p.settings.install_timeout = Duration::from_secs(60);
                p.settings.health_timeout = Duration::from_secs(60);
                p.settings.addon_timeouts = crate::addons::Timeouts {
                    crd: Duration::from_secs(30),
                    rollout: Duration::from_secs(60),
                };
            }
        };
        let rack = self.clone();
        let inv = lab.inv.clone();
        let relocation = lab.relocation.clone();
        let started = move |s: Started| {
            *rack.started.lock().unwrap() = Some(s);
            if !power_on {
                return;
            }
            let (Some(SocketAddr::V4(dhcp)), Some(tftp)) = (s.dhcp, s.tftp) else {
                panic!("talboot bound no IPv4 DHCP or TFTP socket: {s:?}");
            };
            // `talboot status --watch` on this run's admin API, plain and on a terminal,
            // following it until serve stops.
            let admin = s.admin.expect("admin API bound");
            for terminal in [false, true] {
                rack.watchers.lock().unwrap().push(tokio::spawn(async move {
                    let mut out = Vec::new();
                    let r = crate::cli::watch::watch(
                        admin,
                        &mut out,
                        terminal,
                        CancellationToken::new(),
                    )
                    .await;
                    r.expect("watch");
                    (terminal, out)
                }));
            }
            let wire = Wire {
                dhcp,
                tftp_port: tftp.port(),
            };
            let (nodes, tasks) = sim::power_on(
                &inv,
                |a| relocation.to_rack(a).unwrap_or(a),
                wire,
                &rack.cluster,
                &rack.kube,
                &rack.stop,
                crate::sim::demo::DEFAULT_POWER_ON_STAGGER,
            );
            rack.machines.lock().unwrap().extend(nodes);
            rack.tasks.lock().unwrap().extend(tasks);
        };
        let hooks = Hooks {
            adjust: Box::new(adjust),
            started: Box::new(started),
            stop: stop.clone(),
            generate: GenerateOptions {
                service_account_key:
                    crate::machineconfig::secrets::ServiceAccountKeyKind::EcdsaP256,
            },
        };
        (hooks, stop)
    }

    async fn shutdown(self) {
        self.stop.cancel();
        let tasks: Vec<_> = self.tasks.lock().unwrap().drain(..).collect();
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// The lab's machines have fixed loopback addresses: one rack at a time.
static ONE_RACK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Follows the admin API at `admin` and cancels `stop` at the first event of `kind` whose
/// detail contains `needle`.
fn stop_at(admin: SocketAddr, kind: &'static str, needle: &'static str, stop: CancellationToken) {
    tokio::spawn(async move {
        use futures_util::StreamExt as _;
        let resp = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://{admin}/api/events"))
            .send()
            .await
            .unwrap();
        let mut stream = resp.bytes_stream();
        let mut parser = crate::admin::events_stream::SseParser::default();
        while let Some(Ok(bytes)) = stream.next().await {
            for (_, data) in parser.feed(&bytes) {
                let Ok(ev) = serde_json::from_str::<crate::admin::events_stream::WireEvent>(&data)
                else {
                    continue;
                };
                if ev.kind == kind && ev.detail.contains(needle) {
                    stop.cancel();
                    return;
                }
            }
        }
    });
}

fn skipped(report: &Report) -> Vec<(Step, bool)> {
    report.lines.iter().map(|l| (l.step, l.skipped)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn up_takes_the_lab_to_hand_off_and_a_second_run_skips_every_step() {
    let _one = ONE_RACK.lock().await;
    let lab = lab().await;
    let rack = Rack::start(&lab).await;

    let (hooks, _stop) = rack.hooks(&lab, None, true);
    let first = up(&args(&lab, &[]), hooks).await.unwrap();
    assert_eq!(first.outcome, Outcome::HandedOff, "{:?}", first.lines);
    // Nothing was there: every step ran, each said what it did.
    assert!(first.lines.iter().all(|l| !l.skipped), "{:?}", first.lines);
    let text: Vec<String> = first.lines.iter().map(ToString::to_string).collect();
    let all = text.join("\n");
    let bundle = lab.inv.cluster.secrets.file.clone();
    assert!(
        all.contains(&format!("secrets    wrote {}", bundle.display())),
        "{all}"
    );
    assert!(
        all.contains(&lab.inv.cluster.secrets.age_recipients[0]),
        "the recipients are named: {all}"
    );
    assert!(
        all.contains("images     pulled Talos v1.13.9 amd64"),
        "{all}"
    );
    assert!(
        all.contains("configs    writing 3 of 3 node configs"),
        "{all}"
    );
    // What the steps left: ciphertext, the pulled set recorded as pulled, the configs.
    let ciphertext = std::fs::read(&bundle).unwrap();
    assert!(ciphertext.starts_with(b"-----BEGIN AGE ENCRYPTED FILE-----"));
    let catalog = Catalog::load(&lab.path("images")).unwrap();
    for id in artifacts::required_sets(&lab.inv) {
        let e = catalog.find(&id).expect("pulled set in the catalog");
        assert_eq!(e.source, lab.factory_url);
    }
    for n in &lab.inv.nodes {
        assert!(lab.path(&format!("out/{}.yaml", n.name.value)).exists());
    }
    assert!(lab.path("out/talosconfig").exists());
    // The cluster really came up on the simulated machines.
    {
        let s = store::open(&lab.path("state")).unwrap();
        for n in &lab.inv.nodes {
            let r = s.node(&n.name.value).unwrap().unwrap();
            assert_eq!(r.phase, NodePhase::Ready, "{}", n.name.value);
        }
    }
    let applies: usize = rack
        .machines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|m| m.talos())
        .map(|t| t.apply_calls())
        .sum();
    assert_eq!(applies, 3, "one config per machine");
    let tc_before = std::fs::read(lab.path("out/talosconfig")).unwrap();

    // `status --watch` followed the run from serve's event stream until serve stopped.
    let watchers: Vec<_> = rack.watchers.lock().unwrap().drain(..).collect();
    assert_eq!(watchers.len(), 2);
    for w in watchers {
        let (terminal, out) = w.await.unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with(if terminal { "\x1b[H\x1b[2J" } else { "NODE " }),
            "{out}"
        );
        assert!(
            out.trim_end()
                .ends_with("the event stream ended (serve stopped)"),
            "{out}"
        );
        if terminal {
            // The last screen drawn: every node ready, the cluster handed off.
            let last = out.rsplit("\x1b[H\x1b[2J").next().unwrap();
            for n in &lab.inv.nodes {
                let row = last
                    .lines()
                    .find(|l| l.starts_with(&format!("{} ", n.name.value)))
                    .unwrap_or_else(|| panic!("{} missing:\n{last}", n.name.value));
                assert!(row.contains(" ready "), "{row}");
            }
            assert!(
                last.contains("cluster: argocd-installed -> handed-off"),
                "{last}"
            );
        } else {
            assert!(!out.contains('\x1b'), "plain text: {out}");
            for n in &lab.inv.nodes {
                assert!(
                    out.lines()
                        .any(|l| l.contains(&format!(" {} ", n.name.value))
                            && l.contains("node.phase")
                            && l.contains("-> ready")),
                    "no ready line for {}:\n{out}",
                    n.name.value
                );
            }
            assert!(
                out.lines()
                    .any(|l| l.contains(" cluster ") && l.contains("-> handed-off")),
                "{out}"
            );
        }
    }

    // Again: every step is already done, and each says so in one line; nothing is served.
    rack.started.lock().unwrap().take();
    let (hooks, _stop) = rack.hooks(&lab, None, false);
    let second = up(&args(&lab, &[]), hooks).await.unwrap();
    assert_eq!(second.outcome, Outcome::AlreadyDone);
    assert_eq!(
        skipped(&second),
        vec![
            (Step::Secrets, true),
            (Step::Images, true),
            (Step::Configs, true),
            (Step::Provision, true)
        ],
        "{:?}",
        second.lines
    );
    assert!(rack.started.lock().unwrap().is_none(), "nothing served");
    assert_eq!(std::fs::read(&bundle).unwrap(), ciphertext, "not rewritten");
    assert_eq!(
        std::fs::read(lab.path("out/talosconfig")).unwrap(),
        tc_before,
        "the talosconfig is kept"
    );
    assert!(
        second.lines[3].text.contains("handed off at"),
        "{}",
        second.lines[3]
    );
    rack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interrupted_up_resumes_where_it_stopped_and_stay_keeps_serving() {
    let _one = ONE_RACK.lock().await;
    let lab = lab().await;
    let rack = Rack::start(&lab).await;

    // Stopped (as by Ctrl-C) as soon as etcd is bootstrapped, before the add-ons.
    let (hooks, stop) = rack.hooks(&lab, None, true);
    let interrupt = {
        let stop = stop.clone();
        move |admin: SocketAddr| stop_at(admin, "cluster.step", "-> bootstrapped", stop)
    };
    let started = hooks.started;
    let hooks = Hooks {
        started: Box::new(move |s: Started| {
            interrupt(s.admin.unwrap());
            started(s);
        }),
        ..hooks
    };
    // The boot images come from a folder with the factory's file names (a USB stick), the
    // initramfs gzip-compressed and named so, as a hand-made one may be.
    let usb = lab.path("usb");
    std::fs::create_dir_all(&usb).unwrap();
    for id in artifacts::required_sets(&lab.inv) {
        let set = lab.path("factory").join(id.rel_dir());
        let a = &id.arch;
        std::fs::copy(set.join("kernel"), usb.join(format!("kernel-{a}"))).unwrap();
        std::fs::copy(set.join("cmdline"), usb.join(format!("cmdline-metal-{a}"))).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b"070701 not a real cpio archive").unwrap();
        std::fs::write(usb.join(format!("initramfs-{a}.gz")), gz.finish().unwrap()).unwrap();
    }
    let usb_arg = usb.display().to_string();
    let first = up(&args(&lab, &["--images-from", &usb_arg]), hooks)
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Interrupted, "{:?}", first.lines);
    assert!(
        first.lines.iter().any(|l| l.step == Step::Images
            && l.text.starts_with("imported Talos v1.13.9 amd64")
            && l.text.contains(&usb_arg)),
        "{:?}",
        first.lines
    );
    let bound = rack.started.lock().unwrap().expect("served");
    // Where it stopped: bootstrapped or a little later (the stop is a signal, not a step),
    // never handed off.
    let stopped_at = {
        let s = store::open(&lab.path("state")).unwrap();
        let r = crate::store::load_step_record(&s).unwrap().unwrap();
        assert_ne!(
            r.step,
            ClusterStep::HandedOff,
            "stopped before the hand-off"
        );
        r.step
    };

    // Again, on the same DHCP and TFTP ports (the machines keep running, as a rack would):
    // the file steps are done, provisioning resumes from the store.
    let (hooks, _stop) = rack.hooks(&lab, Some(bound), false);
    let second = up(&args(&lab, &[]), hooks).await.unwrap();
    assert_eq!(second.outcome, Outcome::HandedOff, "{:?}", second.lines);
    assert_eq!(
        skipped(&second),
        vec![
            (Step::Secrets, true),
            (Step::Images, true),
            (Step::Configs, true),
            (Step::Provision, false)
        ],
        "{:?}",
        second.lines
    );
    assert!(
        second.lines[3]
            .text
            .starts_with(&format!("resuming after cluster step {stopped_at} ")),
        "{}",
        second.lines[3]
    );
    // Resumed, not redone: one config per machine and one bootstrap in all.
    let talos: Vec<_> = rack
        .machines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|m| m.talos())
        .collect();
    assert_eq!(talos.len(), 3);
    assert_eq!(talos.iter().map(|t| t.apply_calls()).sum::<usize>(), 3);
    assert_eq!(talos.iter().map(|t| t.bootstrap_calls()).sum::<usize>(), 1);

    // With --stay a handed-off cluster is served on: the admin API answers after hand-off,
    // and up ends when it is stopped.
    let (hooks, stop) = rack.hooks(&lab, None, false);
    let answered = Arc::new(Mutex::new(None));
    let started = hooks.started;
    let seen = answered.clone();
    let hooks = Hooks {
        started: Box::new(move |s: Started| {
            let admin = s.admin.unwrap();
            started(s);
            tokio::spawn(async move {
                let r = reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .unwrap()
                    .get(format!("http://{admin}/api/nodes"))
                    .send()
                    .await
                    .map(|r| r.status());
                *seen.lock().unwrap() = Some(r.map_err(|e| e.to_string()));
                stop.cancel();
            });
        }),
        ..hooks
    };
    let third = up(&args(&lab, &["--stay"]), hooks).await.unwrap();
    assert_eq!(third.outcome, Outcome::Stayed, "{:?}", third.lines);
    assert!(
        third.lines[3].text.contains("serving (--stay)") && !third.lines[3].skipped,
        "{}",
        third.lines[3]
    );
    let got = answered.lock().unwrap().clone();
    assert_eq!(got, Some(Ok(reqwest::StatusCode::OK)));
    rack.shutdown().await;
}

/// `up --power-on` runs `serve --power-on`'s round: the plan `up` binds carries the round,
/// with the stagger given. (It used to drop it: the flag was accepted and ignored.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn power_on_plans_the_power_on_round_as_serve_does() {
    let _one = ONE_RACK.lock().await;
    let lab = lab().await;
    let rack = Rack::start(&lab).await;
    let (hooks, stop) = rack.hooks(&lab, None, false);
    let planned = Arc::new(Mutex::new(None));
    let adjust = hooks.adjust;
    let hooks = Hooks {
        adjust: Box::new({
            let planned = planned.clone();
            move |plan: &mut Plan| {
                *planned.lock().unwrap() = Some(plan.power_on.as_ref().map(|p| p.stagger));
                adjust(plan);
                // Nothing to provision here: stop as soon as it serves.
                stop.cancel();
            }
        }),
        ..hooks
    };
    let a = args(&lab, &["--power-on", "--power-on-stagger", "1500ms"]);
    let report = up(&a, hooks).await.unwrap();
    assert_eq!(report.outcome, Outcome::Interrupted, "{:?}", report.lines);
    assert_eq!(
        *planned.lock().unwrap(),
        Some(Some(Duration::from_millis(1500))),
        "the power-on round `up` would run (outer None: never planned)"
    );
    rack.shutdown().await;
}

#[test]
fn an_import_folder_without_a_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let v: inventory::Version = "v1.13.9".parse().unwrap();
    let id = SetId::new(&v, inventory::VANILLA_SCHEMATIC, inventory::Arch::Amd64);
    let from = dir.path().join("usb");
    std::fs::create_dir_all(&from).unwrap();
    std::fs::write(from.join("kernel-amd64"), b"k").unwrap();
    let err = import_set(&dir.path().join("images"), &from, &id, 0).unwrap_err();
    assert!(
        err.to_string().contains("has no cmdline-metal-amd64"),
        "{err}"
    );
    std::fs::write(from.join("cmdline-metal-amd64"), b"console=ttyS0").unwrap();
    let err = import_set(&dir.path().join("images"), &from, &id, 0).unwrap_err();
    assert!(err.to_string().contains("has no initramfs-amd64"), "{err}");
    std::fs::write(from.join("initramfs-amd64.xz"), b"x").unwrap();
    std::fs::write(from.join("initramfs-amd64.gz"), b"x").unwrap();
    let err = import_set(&dir.path().join("images"), &from, &id, 0).unwrap_err();
    assert!(err.to_string().contains("several initramfs files"), "{err}");
    assert!(
        !dir.path().join("images").join(id.rel_dir()).exists(),
        "nothing written"
    );
}

#[tokio::test]
async fn a_new_bundle_replaces_an_old_talosconfig_and_an_old_bundle_keeps_it() {
    let lab = lab().await;
    let a = args(&lab, &[]);
    super::super::secrets::init_bundle_with(
        &lab.inv.cluster.secrets.file,
        &lab.inv.cluster.secrets.age_recipients,
        OffsetDateTime::now_utc(),
        &GenerateOptions {
            service_account_key: crate::machineconfig::secrets::ServiceAccountKeyKind::EcdsaP256,
        },
    )
    .unwrap();
    let tc = lab.path("out/talosconfig");
    std::fs::create_dir_all(lab.path("out")).unwrap();
    std::fs::write(&tc, "from another cluster\n").unwrap();
    let mut say = Say { lines: Vec::new() };
    configs(&a, &lab.inv, &mut say, false).unwrap();
    assert_eq!(
        std::fs::read_to_string(&tc).unwrap(),
        "from another cluster\n"
    );
    assert!(
        !say.lines[0].text.contains("talosconfig"),
        "{}",
        say.lines[0]
    );
    configs(&a, &lab.inv, &mut say, true).unwrap();
    let fresh = std::fs::read_to_string(&tc).unwrap();
    assert!(fresh.contains("contexts:"), "{fresh}");
    assert!(
        say.lines[1].text.contains("talosconfig"),
        "{}",
        say.lines[1]
    );
}
