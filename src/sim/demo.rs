//! `talboot demo`: the whole flow on a simulated rack, unprivileged, on one machine.
//!
//! What is real: talboot itself. The inventory is the operator's file (relocated onto
//! loopback by [`super::relocate`]), the DHCP, TFTP and HTTP servers, the store, the event
//! bus and the provisioner are the ones `serve` runs ([`crate::appliance::Plan`]), the
//! machine configs are rendered from a freshly generated secrets bundle by the real
//! renderer, and the add-ons go through the real server-side apply and Helm release code.
//!
//! What is simulated: each machine's firmware and iPXE ([`super::machine`], real packets on
//! loopback), Talos on each machine ([`super::talos`], the strict apid double on the
//! machine's own 127.0.x.y) and the Kubernetes API server ([`super::kube`], on the cluster
//! endpoint's loopback address). A machine that has booted Talos registers as a Node, which
//! turns Ready once the Cilium DaemonSet has rolled out, as on a real cluster.
//!
//! The progress printed is talboot's own event stream; the demo adds nothing to it but
//! timestamps.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::kube::{DoubleOptions, KubeDouble};
use super::machine::{Booted, Machine, Wire};
use super::relocate::{RelocateError, Relocation};
use super::talos::{BootHook, BootReason, FakeCluster, FakeNodeConfig, FakeTalosNode, Phase};
use crate::appliance::{ApplianceError, DhcpPlan, Plan, ProvisioningPlan, Running};
use crate::events::EventKind;
use crate::inventory::{self, EndpointHost, Inventory};
use crate::machineconfig::secrets::{GenerateOptions, SecretsBundle, ServiceAccountKeyKind};
use crate::provision::Settings;
use crate::store::{ClusterStep, NodePhase, StepRecord, Store};

/// The Cilium manifest set of the demo (an abridged rendering; see the file's header).
const CILIUM_MANIFEST: &str = include_str!("manifests/cilium/cilium.yaml");
/// The Argo CD manifest set of the demo.
const ARGOCD_MANIFEST: &str = include_str!("manifests/argocd/argo-cd.yaml");

/// The Kubernetes API port on the cluster endpoint.
const KUBE_API_PORT: u16 = 6443;

/// Why the demo could not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The rolling upgrade after hand-off could not run (see [`upgrade`]).
    #[error("upgrade: {0}")]
    Upgrade(String),
    /// The config change through serve could not run (see [`daytwo`]).
    #[error("config change: {0}")]
    DayTwo(String),
    /// The inventory is invalid.
    #[error("{0}; run `talboot check -c {1}` for every problem")]
    Inventory(inventory::LoadError, PathBuf),
    /// The rack cannot be put on loopback.
    #[error("cannot simulate this rack: {0}")]
    Relocate(#[from] RelocateError),
    /// The inventory asks for something the simulation cannot do.
    #[error("cannot simulate this rack: {0}")]
    Unsupported(String),
    /// `--rebuild` names a node the inventory does not have.
    #[error("--rebuild {0}: no such node; the inventory has {1}")]
    UnknownNode(String, String),
    /// A file of the simulation could not be written.
    #[error("cannot prepare {}: {cause}", path.display())]
    Prepare {
        /// What.
        path: PathBuf,
        /// Why.
        cause: String,
    },
    /// talboot's servers could not start.
    #[error("talboot could not start: {0}")]
    Start(#[from] ApplianceError),
    /// A simulated machine or API server could not start.
    #[error("simulation: {0}")]
    Sim(#[from] SimFailure),
    /// The flow did not finish in time.
    #[error("not handed off within {after:?}: {state}")]
    Timeout {
        /// The limit.
        after: Duration,
        /// Where it was stuck.
        state: String,
    },
}

/// What of the simulation failed (see [`DemoError::Sim`]).
#[derive(Debug, thiserror::Error)]
pub enum SimFailure {
    /// The stand-in boot files' catalog cannot be read back.
    #[error("{0}")]
    Catalog(#[from] crate::artifacts::ArtifactError),
    /// The throwaway cluster secrets.
    #[error("cannot generate cluster secrets: {0}")]
    Secrets(#[from] crate::machineconfig::secrets::SecretsError),
    /// The admin talosconfig.
    #[error("cannot make the admin talosconfig: {0}")]
    Talosconfig(#[from] crate::machineconfig::clients::ClientConfigError),
    /// The admin credentials from that talosconfig.
    #[error("admin talosconfig: {0}")]
    Creds(#[from] crate::talos::TalosError),
    /// The Kubernetes API double.
    #[error("Kubernetes API double: {0}")]
    Kube(#[from] super::SimError),
    /// talboot bound sockets without IPv4 addresses.
    #[error("talboot's sockets have no IPv4 addresses")]
    NoIpv4,
    /// The HTTP client for the admin API cannot be built.
    #[error("{0}")]
    Client(reqwest::Error),
    /// The rebuild request could not be made.
    #[error("POST {url}: {source}")]
    Request {
        /// The admin API URL.
        url: String,
        /// What the HTTP client said.
        source: reqwest::Error,
    },
    /// The rebuild request was refused.
    #[error("POST {url}: HTTP {status}")]
    Refused {
        /// The admin API URL.
        url: String,
        /// The answer.
        status: reqwest::StatusCode,
    },
}

fn prep(path: &Path) -> impl Fn(String) -> DemoError + '_ {
    move |cause| DemoError::Prepare {
        path: path.to_owned(),
        cause,
    }
}

/// Knobs of a demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The operator's inventory.
    pub config: PathBuf,
    /// A fresh (missing or empty) directory for everything the run writes.
    pub workdir: PathBuf,
    /// Print talboot's events as they happen.
    pub print_events: bool,
    /// How many nodes the provisioner drives at once ([`Settings::concurrency`]).
    pub concurrency: usize,
}

/// One simulated machine as the demo tracks it.
pub struct SimNode {
    /// The machine.
    pub machine: Machine,
    /// Its inventory address on the rack network.
    pub(crate) rack_address: Ipv4Addr,
    /// Its role.
    pub role: String,
    talos: Mutex<Option<Arc<FakeTalosNode>>>,
}

impl SimNode {
    /// Its Talos double, once the machine has booted Talos.
    pub fn talos(&self) -> Option<Arc<FakeTalosNode>> {
        self.talos.lock().expect("sim node lock").clone()
    }
}

/// A running demo: talboot's servers, the machines, the Kubernetes API double.
pub struct Demo {
    /// The rack-to-loopback map.
    pub relocation: Relocation,
    /// The relocated inventory talboot serves.
    pub inventory: Arc<Inventory>,
    /// Where everything is written.
    pub workdir: PathBuf,
    /// The simulated machines, in inventory order.
    pub nodes: Vec<Arc<SimNode>>,
    /// The Kubernetes API double.
    pub kube: Arc<KubeDouble>,
    /// The Talos doubles' registry (their availability record).
    pub(crate) cluster: FakeCluster,
    /// talboot's HTTP base URL (provisioning side).
    pub base_url: String,
    /// talboot's admin API URL (the rebuild API, rollouts through serve; `--admin` of the
    /// CLI is its address).
    pub admin_url: String,
    /// The relocated inventory file (what the CLI's `-c` points at).
    pub inventory_path: PathBuf,
    /// The throwaway age identity that decrypts the work directory's secrets bundle
    /// (the CLI's `--age-identity`).
    pub age_identity: PathBuf,
    /// The cluster secrets (the same the bundle file holds), for renderings of a changed
    /// inventory.
    secrets: SecretsBundle,
    started: Instant,
    relaunch: Relaunch,
    running: Option<Running>,
    printer: Option<JoinHandle<()>>,
    print_events: bool,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// What it takes to start talboot again on the same state and the same addresses, as an
/// operator restarting `serve` would.
struct Relaunch {
    inventory: Arc<Inventory>,
    images: PathBuf,
    tftp_root: PathBuf,
    configs: PathBuf,
    state_dir: PathBuf,
    advertise: Ipv4Addr,
    http: SocketAddr,
    admin: SocketAddr,
    tftp: SocketAddr,
    dhcp: SocketAddrV4,
    renderer: Arc<dyn crate::machineconfig::renderer::ConfigRenderer>,
    creds: crate::talos::ClientCreds,
    settings: Settings,
}

impl Relaunch {
    fn plan(&self) -> Result<Plan, DemoError> {
        Ok(Plan {
            inventory: self.inventory.clone(),
            catalog: crate::artifacts::Catalog::load(&self.images).map_err(SimFailure::from)?,
            images_dir: self.images.clone(),
            ipxe_dir: self.tftp_root.clone(),
            configs: self.configs.clone(),
            state_dir: self.state_dir.clone(),
            advertise: self.advertise,
            http: self.http,
            admin: self.admin,
            admin_token: None,
            admin_hosts: Default::default(),
            http_limits: Default::default(),
            tftp: Some((
                self.tftp,
                crate::tftp::TftpConfig {
                    max_blksize: 1468,
                    ..crate::tftp::TftpConfig::default()
                },
            )),
            dhcp: Some(DhcpPlan::Loopback(self.dhcp)),
            ipv6_ra: None,
            // Drift is watched once the cluster is up ([`Demo::watch_drift`]); the simulated
            // machines are powered on by the demo itself.
            drift: None,
            power_on: None,
            provisioning: Some(ProvisioningPlan {
                renderer: self.renderer.clone(),
                creds: self.creds.clone(),
                settings: self.settings.clone(),
            }),
        })
    }
}

/// Prints the events of `running` until it stops.
fn spawn_printer(running: &Running, started: Instant) -> JoinHandle<()> {
    let mut rx = running.events.subscribe();
    let stop = running.cancel.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                ev = rx.recv() => match ev {
                    Ok(ev) => crate::events::print_event(started, &ev),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => break,
                }
            }
        }
    })
}

/// Everything prepared on disk before anything runs.
struct Prepared {
    /// The relocated inventory file.
    inventory_path: PathBuf,
    relocation: Relocation,
    /// The cluster endpoint's (loopback) address, where the API double listens.
    api_ip: Ipv4Addr,
    inventory: Arc<Inventory>,
    images: PathBuf,
    tftp_root: PathBuf,
    state_dir: PathBuf,
    addons: PathBuf,
}

/// Copies the YAML files of the inventory's folder (patches, talenv.yaml, ...) into
/// `dest`, every rack address relocated. Returns the relocated inventory's path.
pub(crate) fn mirror_config(
    config: &Path,
    relocation: &Relocation,
    dest: &Path,
) -> Result<PathBuf, DemoError> {
    let src_dir = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut stack = vec![(src_dir.to_owned(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| prep(&dir)(e.to_string()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() && depth < 3 {
                stack.push((path, depth + 1));
            } else if ft.is_file() && (name.ends_with(".yaml") || name.ends_with(".yml")) {
                let rel = path.strip_prefix(src_dir).unwrap_or(&path);
                let out = dest.join(rel);
                let text =
                    std::fs::read_to_string(&path).map_err(|e| prep(&path)(e.to_string()))?;
                if let Some(parent) = out.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| prep(parent)(e.to_string()))?;
                }
                std::fs::write(&out, relocation.rewrite(&text))
                    .map_err(|e| prep(&out)(e.to_string()))?;
            }
        }
    }
    let file = config
        .file_name()
        .ok_or_else(|| prep(config)("not a file".into()))?;
    Ok(dest.join(file))
}

/// Writes `bundle` age-encrypted to `file` and the identity that decrypts it to `identity`,
/// when `file` is inside `workdir` and does not exist yet: an inventory naming its bundle by
/// an absolute path points at the operator's real bundle, which the demo never touches.
/// Returns whether it wrote.
fn write_bundle(
    workdir: &Path,
    file: &Path,
    identity: &Path,
    bundle: &SecretsBundle,
) -> Result<bool, DemoError> {
    if !file.starts_with(workdir) || file.exists() {
        return Ok(false);
    }
    use age::secrecy::ExposeSecret;
    let id = age::x25519::Identity::generate();
    let text = format!("{}\n", id.to_string().expose_secret());
    crate::fsutil::write_atomic(identity, text.as_bytes(), 0o600)
        .map_err(|e| prep(identity)(e.to_string()))?;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| prep(dir)(e.to_string()))?;
    }
    let plain = zeroize::Zeroizing::new(bundle.to_yaml());
    crate::crypto::age::write_encrypted(file, plain.as_bytes(), &[id.to_public().to_string()])
        .map_err(|e| prep(file)(e.to_string()))?;
    Ok(true)
}

fn prepare(opts: &DemoOptions) -> Result<Prepared, DemoError> {
    let original = inventory::load(&opts.config)
        .map_err(|e| DemoError::Inventory(e, opts.config.clone()))?
        .inventory;
    let relocation = Relocation::for_inventory(&original)?;
    let workdir = &opts.workdir;
    if workdir.exists()
        && std::fs::read_dir(workdir)
            .map_err(|e| prep(workdir)(e.to_string()))?
            .next()
            .is_some()
    {
        return Err(prep(workdir)(
            "the directory is not empty; the demo starts from a fresh one (omit --workdir for a temporary one)".into(),
        ));
    }
    let config_dir = workdir.join("config");
    let inv_path = mirror_config(&opts.config, &relocation, &config_dir)?;
    let inventory = inventory::load(&inv_path)
        .map_err(|e| DemoError::Inventory(e, inv_path.clone()))?
        .inventory;
    if inventory.network.mode == inventory::NetworkMode::Proxy {
        return Err(DemoError::Unsupported(
            "network.mode is proxy: the machines' addresses would come from the site's own DHCP \
             server, which the simulation does not have; simulate the rack with mode \
             authoritative"
                .into(),
        ));
    }
    if inventory.boot.delivery != inventory::Delivery::Push {
        return Err(DemoError::Unsupported(
            "boot.delivery is pull: the demo shows push provisioning and the cluster steps, \
             which talboot runs in push mode only; simulate the rack with delivery push"
                .into(),
        ));
    }
    let api_ip = match &inventory.cluster.endpoint.host {
        EndpointHost::Ip(ip) if ip.is_loopback() => *ip,
        other => {
            return Err(DemoError::Unsupported(format!(
                "the cluster endpoint host {other:?} is not an address in the rack's subnets; \
                 the simulated API server listens on the endpoint's loopback image"
            )));
        }
    };
    if inventory.cluster.endpoint.port != KUBE_API_PORT {
        return Err(DemoError::Unsupported(format!(
            "the cluster endpoint port is {}; the simulated API server listens on {KUBE_API_PORT}",
            inventory.cluster.endpoint.port
        )));
    }
    let images = workdir.join("images");
    let tftp_root = workdir.join("tftp");
    let state_dir = workdir.join("state");
    let addons = workdir.join("addons");
    let now = crate::events::Clock::now_unix(&crate::events::SystemClock);
    super::assets::write_boot_sets(&images, &inventory, now).map_err(|e| prep(&images)(e.cause))?;
    super::assets::write_ipxe_binaries(&tftp_root).map_err(|e| prep(&tftp_root)(e.cause))?;
    write_addon_manifests(&addons)?;
    std::fs::create_dir_all(&state_dir).map_err(|e| prep(&state_dir)(e.to_string()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        // The store holds node records and the kubeconfig: private, as `serve` wants it.
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| prep(&state_dir)(e.to_string()))?;
    }
    Ok(Prepared {
        inventory_path: inv_path,
        relocation,
        api_ip,
        inventory: Arc::new(inventory),
        images,
        tftp_root,
        state_dir,
        addons,
    })
}

fn cilium_enabled(inv: &Inventory) -> bool {
    inv.addons.cilium.as_ref().is_some_and(|c| c.enabled)
}

fn argocd_enabled(inv: &Inventory) -> bool {
    inv.addons.argocd.as_ref().is_some_and(|a| a.enabled)
}

/// What the hand-off line says was installed.
fn installed_addons(inv: &Inventory) -> &'static str {
    match (cilium_enabled(inv), argocd_enabled(inv)) {
        (true, true) => "Cilium and Argo CD installed",
        (true, false) => "Cilium installed",
        (false, true) => "Argo CD installed (the CNI is the operator's)",
        (false, false) => "no add-ons in the inventory",
    }
}

impl Demo {
    /// Prepares the work directory, starts talboot's servers and the Kubernetes API double,
    /// and powers on every machine.
    pub async fn start(opts: DemoOptions) -> Result<Demo, DemoError> {
        crate::install_crypto_provider();
        let started = Instant::now();
        let p = prepare(&opts)?;
        let inv = p.inventory.clone();
        if opts.print_events {
            let nets: Vec<String> = p
                .relocation
                .loopback_subnets()
                .map(|(rack, lo)| format!("{rack} -> {lo}"))
                .collect();
            println!(
                "talboot demo: cluster {} with {} simulated machines from {}\n\
                 rack network on loopback: {}; work directory {}\n",
                inv.cluster.name.as_str(),
                inv.nodes.len(),
                opts.config.display(),
                nets.join(", "),
                opts.workdir.display()
            );
            if !cilium_enabled(&inv) {
                println!(
                    "the inventory does not enable talboot's Cilium: the simulated Nodes turn Ready \
                     as if the operator's own CNI were running\n"
                );
            }
        }

        // Throwaway cluster secrets: on disk only in the work directory (the admin
        // talosconfig and kubeconfig, and the bundle encrypted to a throwaway identity). ECDSA for the
        // service-account key so the bundle takes milliseconds, not an RSA-4096 search.
        let now = time::OffsetDateTime::now_utc();
        let bundle = SecretsBundle::generate(
            now,
            &GenerateOptions {
                service_account_key: ServiceAccountKeyKind::EcdsaP256,
            },
        )
        .map_err(SimFailure::from)?;
        let endpoints: Vec<String> = inv
            .control_planes()
            .map(|n| n.address.value.addr().to_string())
            .collect();
        let talosconfig = crate::machineconfig::clients::talosconfig(
            inv.cluster.name.as_str(),
            &endpoints,
            &[],
            &bundle,
            time::Duration::days(1),
            now,
        )
        .map_err(SimFailure::from)?;
        // The bundle is also written age-encrypted where the relocated inventory names it,
        // to a throwaway identity kept beside it (0600), so that `talboot plan`/`apply` run
        // against the simulated rack render exactly what the demo's talboot renders.
        let age_identity = opts.workdir.join("age-identity.txt");
        write_bundle(
            &opts.workdir,
            &inv.cluster.secrets.file,
            &age_identity,
            &bundle,
        )?;
        let tc_path = opts.workdir.join("talosconfig");
        crate::fsutil::write_atomic(&tc_path, talosconfig.as_bytes(), 0o600)
            .map_err(|e| prep(&tc_path)(e.to_string()))?;
        let creds = crate::talos::ClientCreds::from_talosconfig(
            &talosconfig,
            Some(inv.cluster.name.as_str()),
        )
        .map_err(SimFailure::from)?;

        let (kube, cluster) = start_api_double(&inv, p.api_ip).await?;

        let advertise = inv
            .network
            .advertise
            .as_ref()
            .map(|a| a.value)
            .filter(|a| a.is_loopback())
            .unwrap_or(Ipv4Addr::LOCALHOST);
        let mut settings = Settings::new(p.state_dir.clone());
        settings.concurrency = opts.concurrency;
        // An inventory with KSOPS gets a throwaway age identity for the `sops-age` Secret, as
        // an operator would pass one with `serve --ksops-age-identity`.
        if inv.addons.argocd.as_ref().is_some_and(|a| a.ksops) {
            use age::secrecy::ExposeSecret;
            let id = age::x25519::Identity::generate();
            let text = format!("{}\n", id.to_string().expose_secret());
            settings.ksops_age_identity =
                Some(Arc::new(crate::crypto::age::Secret::new(text.into_bytes())));
        }
        // Power controllers from the inventory's `power:` blocks, as `serve` builds them (the
        // example rack has none; an inventory with one gets the dashboard's power actions).
        settings.power = Arc::new(crate::power::dispatch::serve_drivers(&inv, None));
        settings.poll_interval = Duration::from_millis(250);
        settings.install_timeout = Duration::from_secs(60);
        settings.health_timeout = Duration::from_secs(60);
        settings.addon_manifests = Some(p.addons.clone());
        settings.addon_timeouts = crate::addons::Timeouts {
            crd: Duration::from_secs(30),
            rollout: Duration::from_secs(60),
        };
        let mut relaunch = Relaunch {
            inventory: inv.clone(),
            images: p.images.clone(),
            tftp_root: p.tftp_root.clone(),
            configs: opts.workdir.join("configs"),
            state_dir: p.state_dir.clone(),
            advertise,
            http: SocketAddr::new(IpAddr::V4(advertise), 0),
            admin: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            tftp: SocketAddr::new(IpAddr::V4(advertise), 0),
            dhcp: SocketAddrV4::new(advertise, 0),
            renderer: Arc::new(crate::provision::BundleRenderer::new(
                inv.clone(),
                bundle.clone(),
            )),
            creds,
            settings,
        };
        let bound = relaunch.plan()?.bind().await?;
        let (Some(http), Some(SocketAddr::V4(dhcp)), Some(tftp), Some(admin)) = (
            bound.http_addr(),
            bound.dhcp_addr(),
            bound.tftp_addr(),
            bound.admin_addr(),
        ) else {
            return Err(SimFailure::NoIpv4.into());
        };
        // A restart binds the same ports, as a restarted `serve` would.
        relaunch.http = http;
        relaunch.admin = admin;
        relaunch.tftp = tftp;
        relaunch.dhcp = dhcp;
        let wire = Wire {
            dhcp,
            tftp_port: tftp.port(),
        };
        let running = bound.start()?;
        if opts.print_events {
            println!("dashboard: {}/\n", running.admin_url);
        }
        let printer = opts.print_events.then(|| spawn_printer(&running, started));
        let stop = CancellationToken::new();

        let relocation = &p.relocation;
        let (nodes, tasks) = power_on(
            &inv,
            |a| relocation.to_rack(a).unwrap_or(a),
            wire,
            &cluster,
            &kube,
            &stop,
        );
        Ok(Demo {
            relocation: p.relocation,
            inventory: inv,
            workdir: opts.workdir,
            nodes,
            kube,
            cluster: cluster.clone(),
            base_url: running.base_url.clone(),
            admin_url: running.admin_url.clone(),
            inventory_path: p.inventory_path,
            age_identity,
            secrets: bundle,
            started,
            relaunch,
            running: Some(running),
            printer,
            print_events: opts.print_events,
            stop,
            tasks,
        })
    }

    /// talboot's store (while talboot runs).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self
            .running
            .as_ref()
            .expect("talboot runs between start, restart and shutdown")
            .store
    }

    /// talboot's writer of rollout records (while talboot runs): the demo's day two runs
    /// in-process, as serve's admin API runs it.
    pub(crate) fn rollouts(&self) -> &crate::store::RolloutWriter {
        &self
            .running
            .as_ref()
            .expect("talboot runs between start, restart and shutdown")
            .rollouts
    }

    /// Kills talboot (every server and the provisioner, mid-step if need be) and starts it
    /// again on the same state directory and addresses while the machines keep running.
    pub async fn restart_talboot(&mut self) -> Result<(), DemoError> {
        if let Some(running) = self.running.take() {
            running.cancel.cancel();
            let _ = running.wait().await;
        }
        if let Some(p) = self.printer.take() {
            let _ = p.await;
        }
        let running = self.relaunch.plan()?.bind().await?.start()?;
        if self.print_events {
            self.printer = Some(spawn_printer(&running, self.started));
        }
        self.base_url = running.base_url.clone();
        self.admin_url = running.admin_url.clone();
        self.running = Some(running);
        Ok(())
    }

    /// The node `name`.
    pub fn node(&self, name: &str) -> Option<&Arc<SimNode>> {
        self.nodes.iter().find(|n| n.machine.name == name)
    }

    /// The persisted cluster step record.
    pub fn step_record(&self) -> Option<StepRecord> {
        crate::store::load_step_record(self.store().as_ref())
            .ok()
            .flatten()
    }

    /// Time since [`Demo::start`].
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits until the cluster is handed off, or says where it is stuck.
    pub async fn wait_handed_off(&self, timeout: Duration) -> Result<(), DemoError> {
        // The timeline event is written after the step record, so once it is there the
        // summary (read from the store) is complete.
        self.wait_until(timeout, |d| {
            d.step_record()
                .is_some_and(|r| r.step == ClusterStep::HandedOff)
                && d.store()
                    .last_event(crate::store::CLUSTER_TIMELINE)
                    .ok()
                    .flatten()
                    .is_some_and(|e| e.detail.contains("-> handed-off"))
        })
        .await
    }

    /// Waits until `name` is Ready with its provisioning window closed.
    pub async fn wait_node_ready(&self, name: &str, timeout: Duration) -> Result<(), DemoError> {
        self.wait_until(timeout, |d| {
            matches!(d.store().node(name), Ok(Some(r))
                if r.phase == NodePhase::Ready && !r.provisioning_window_open)
        })
        .await
    }

    /// Polls `done` until it holds; on timeout, says where the flow is stuck.
    async fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&Self) -> bool,
    ) -> Result<(), DemoError> {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            if Instant::now() >= deadline {
                return Err(DemoError::Timeout {
                    after: timeout,
                    state: self.stuck_state(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Asks the running talboot to rebuild `name`, exactly as `talboot node rebuild` does.
    pub async fn request_rebuild(&self, name: &str) -> Result<(), DemoError> {
        let url = format!("{}/api/nodes/{name}/rebuild", self.admin_url);
        let resp = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(SimFailure::Client)?
            .post(&url)
            .send()
            .await
            .map_err(|source| SimFailure::Request {
                url: url.clone(),
                source,
            })?;
        if !resp.status().is_success() {
            return Err(SimFailure::Refused {
                url,
                status: resp.status(),
            }
            .into());
        }
        Ok(())
    }

    fn stuck_state(&self) -> String {
        let step = match self.step_record() {
            Some(r) => format!(
                "last cluster step {} ({}){}",
                r.step,
                r.reason,
                r.last_error
                    .map(|e| format!(", next step failing: {e}"))
                    .unwrap_or_default()
            ),
            None => "no cluster step completed".into(),
        };
        let records = self.store().nodes().unwrap_or_default();
        let waiting: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|n| {
                let phase = phase_of(&records, &n.machine.name);
                (phase != NodePhase::Ready).then(|| format!("{} {phase}", n.machine.name))
            })
            .collect();
        if waiting.is_empty() {
            step
        } else {
            format!("{step}; nodes not ready: {}", waiting.join(", "))
        }
    }

    /// The end-of-run summary: nodes, cluster steps and Helm release records.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let records = self.store().nodes().unwrap_or_default();
        s.push_str(&format!(
            "\n{:<14} {:<13} {:<13} {:<11} {:<8} {}\n",
            "NODE", "ROLE", "RACK ADDRESS", "SIMULATED", "PHASE", "INSTALL DISK"
        ));
        for n in &self.nodes {
            let phase = phase_of(&records, &n.machine.name);
            let node = self.inventory.node(&n.machine.name);
            let disk = node.map(|n| n.install.to_string()).unwrap_or_default();
            let sim = node
                .map(|n| n.address.value.addr().to_string())
                .unwrap_or_default();
            s.push_str(&format!(
                "{:<14} {:<13} {:<13} {:<11} {:<8} {}\n",
                n.machine.name,
                n.role,
                n.rack_address,
                sim,
                phase.as_str(),
                disk
            ));
        }
        let events = self
            .store()
            .events(crate::store::CLUSTER_TIMELINE, 0, 1000)
            .unwrap_or_default();
        s.push_str("\ncluster steps:\n");
        for e in events
            .iter()
            .filter(|e| e.kind == EventKind::Cluster.as_str())
        {
            s.push_str(&format!("  {}\n", e.detail));
        }
        s.push_str(
            "\nHelm release records (adoptable by `helm upgrade` or an Argo CD Application):\n",
        );
        let mut records = 0;
        for (ns, name) in [("kube-system", "cilium"), ("argocd", "argocd")] {
            let secret = format!("sh.helm.release.v1.{name}.v1");
            if self.kube.object("v1", "Secret", ns, &secret).is_some() {
                s.push_str(&format!("  {ns}/{secret}\n"));
                records += 1;
            }
        }
        if records == 0 {
            s.push_str("  none (no add-on installed)\n");
        }
        let talos: Vec<Arc<FakeTalosNode>> = self.nodes.iter().filter_map(|n| n.talos()).collect();
        s.push_str(&format!(
            "\nTalos API calls: {} ApplyConfiguration, {} Bootstrap, {} Kubeconfig; {} objects applied \
             server-side\n",
            talos.iter().map(|t| t.apply_calls()).sum::<usize>(),
            talos.iter().map(|t| t.bootstrap_calls()).sum::<usize>(),
            talos.iter().map(|t| t.kubeconfig_calls()).sum::<usize>(),
            self.kube.applies().iter().filter(|a| a.changed).count(),
        ));
        s
    }

    /// Stops the machines, talboot and the API double.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        for n in &self.nodes {
            n.talos.lock().expect("sim node lock").take();
        }
        if let Some(running) = self.running.take() {
            running.cancel.cancel();
            let _ = running.wait().await;
        }
        if let Some(p) = self.printer.take() {
            let _ = p.await;
        }
    }
}

/// Starts the Kubernetes API double on the (loopback) cluster endpoint `api_ip` and the Talos
/// doubles' registry that hands out its kubeconfig: the rack's cluster side, as `demo` and
/// `talboot up`'s simulated-rack tests run it.
pub(crate) async fn start_api_double(
    inv: &Inventory,
    api_ip: Ipv4Addr,
) -> Result<(Arc<KubeDouble>, FakeCluster), DemoError> {
    let kube = KubeDouble::start(DoubleOptions {
        bind: SocketAddr::new(IpAddr::V4(api_ip), KUBE_API_PORT),
        // Without talboot's Cilium the operator brings the CNI; the simulation then
        // lets Nodes turn Ready as soon as they register.
        cni_daemonset: cilium_enabled(inv).then(|| ("kube-system".into(), "cilium".into())),
        nodes: Vec::new(),
        crd_delay: Duration::from_millis(200),
        rollout_delay: Duration::from_millis(400),
    })
    .await
    .map_err(SimFailure::from)?;
    let kube = Arc::new(kube);
    let cluster = FakeCluster::new();
    cluster.set_kubeconfig(Some(kube.kubeconfig().to_owned()));
    Ok((kube, cluster))
}

/// Powers on every machine of the (loopback) inventory `inv` against talboot's sockets
/// `wire`, one every 40 ms, until `stop`; `to_rack` names each machine's address on the
/// real rack.
pub(crate) fn power_on(
    inv: &Inventory,
    to_rack: impl Fn(Ipv4Addr) -> Ipv4Addr,
    wire: Wire,
    cluster: &FakeCluster,
    kube: &Arc<KubeDouble>,
    stop: &CancellationToken,
) -> (Vec<Arc<SimNode>>, Vec<JoinHandle<()>>) {
    let mut nodes = Vec::new();
    let mut tasks = Vec::new();
    for (i, n) in inv.nodes.iter().enumerate() {
        let address = n.address.value.addr();
        let relay = inv
            .network
            .relays
            .iter()
            .find(|r| r.subnet.value.contains(&address))
            .map(|r| {
                r.gateway
                    .as_ref()
                    .map(|g| g.value)
                    .unwrap_or_else(|| r.subnet.value.hosts().next().unwrap_or(address))
            });
        let node = Arc::new(SimNode {
            machine: Machine::from_inventory(inv, n, relay),
            rack_address: to_rack(address),
            role: n.role.value.clone(),
            talos: Mutex::new(None),
        });
        nodes.push(node.clone());
        let (cluster, kube, stop) = (cluster.clone(), kube.clone(), stop.clone());
        // A rack powers on over a few hundred milliseconds, not in one instant.
        let delay = Duration::from_millis(40 * i as u64);
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = async {
                    tokio::time::sleep(delay).await;
                    run_machine(node, wire, cluster, kube).await;
                } => {}
            }
        }));
    }
    (nodes, tasks)
}

/// Writes the demo's Cilium and Argo CD manifest sets as `<dir>/cilium/` and `<dir>/argocd/`
/// (the layout `serve --addon-manifests` reads).
pub(crate) fn write_addon_manifests(dir: &Path) -> Result<(), DemoError> {
    for (sub, text) in [("cilium", CILIUM_MANIFEST), ("argocd", ARGOCD_MANIFEST)] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(|e| prep(&d)(e.to_string()))?;
        let f = d.join(format!("{sub}.yaml"));
        std::fs::write(&f, text).map_err(|e| prep(&f)(e.to_string()))?;
    }
    Ok(())
}

/// The stand-in boot hook: on every reboot the machine goes through its firmware's network
/// boot again before Talos comes back (to disk after an install, to maintenance after a
/// reset), as a machine whose boot order starts with the network does.
fn boot_hook(node: Arc<SimNode>, wire: Wire) -> BootHook {
    Arc::new(move |reason: BootReason| {
        let node = node.clone();
        Box::pin(async move {
            for attempt in 1..=5 {
                match node.machine.network_boot(wire).await {
                    Ok(booted) => {
                        tracing::debug!(machine = %node.machine.name, ?reason, ?booted, "rebooted");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(machine = %node.machine.name, attempt, error = %e, "network boot failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        })
    })
}

/// Powers on one machine: network boot until a kernel runs, then Talos in maintenance mode
/// on the leased address; registers its Node once Talos runs configured.
async fn run_machine(node: Arc<SimNode>, wire: Wire, cluster: FakeCluster, kube: Arc<KubeDouble>) {
    let name = node.machine.name.clone();
    let address = loop {
        match node.machine.network_boot(wire).await {
            Ok(Booted::Kernel { address, .. }) => break address,
            Ok(Booted::LocalDisk { .. }) => {
                tracing::warn!(machine = %name, "told to boot an empty disk; retrying the network");
            }
            Err(e) => tracing::warn!(machine = %name, error = %e, "network boot failed; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut cfg = FakeNodeConfig::new(IpAddr::V4(address), &name);
    cfg.disks = node.machine.disks.clone();
    cfg.system_uuid = node.machine.uuid.clone();
    cfg.aliases = vec![IpAddr::V4(node.rack_address)];
    cfg.boot_hook = Some(boot_hook(node.clone(), wire));
    let talos = match FakeTalosNode::start(cfg, &cluster).await {
        Ok(t) => Arc::new(t),
        Err(e) => {
            eprintln!("simulated Talos on {name} ({address}) could not start: {e}");
            return;
        }
    };
    let mut phases = talos.subscribe_phase();
    *node.talos.lock().expect("sim node lock") = Some(talos);
    let mut registered = false;
    loop {
        if !registered && *phases.borrow_and_update() == Phase::Secured {
            // The kubelet of a configured node registers it with the API server.
            kube.register_node(&name);
            registered = true;
        }
        if phases.changed().await.is_err() {
            return;
        }
    }
}

/// A node's persisted phase (Unknown before talboot has a record of it).
fn phase_of(records: &[crate::store::NodeRecord], name: &str) -> NodePhase {
    records
        .iter()
        .find(|r| r.name == name)
        .map_or(NodePhase::Unknown, |r| r.phase)
}

/// ApplyConfiguration calls per machine that has booted Talos.
fn apply_counts(demo: &Demo) -> BTreeMap<String, usize> {
    demo.nodes
        .iter()
        .filter_map(|n| n.talos().map(|t| (n.machine.name.clone(), t.apply_calls())))
        .collect()
}

/// Runs the demo to the end: hand-off, the optional rebuild, the optional rolling Talos
/// upgrade (a minor-version bump, `upgrade` workers at a time), the summary.
pub async fn run(
    opts: DemoOptions,
    timeout: Duration,
    rebuild: Option<String>,
    upgrade: Option<usize>,
) -> Result<String, DemoError> {
    run_and_hold(opts, timeout, rebuild, upgrade, None).await
}

/// What ends a demo that keeps serving after its summary (`demo --stay`): Ctrl-C, SIGTERM.
pub(crate) type Hold = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// [`run`], and with `hold` print the summary, keep talboot (and the simulated rack) running
/// for the dashboard until `hold` completes, then stop; the summary returned is then empty.
pub(crate) async fn run_and_hold(
    opts: DemoOptions,
    timeout: Duration,
    rebuild: Option<String>,
    upgrade: Option<usize>,
    hold: Option<Hold>,
) -> Result<String, DemoError> {
    let print = opts.print_events;
    let demo = Demo::start(opts).await?;
    if let Some(name) = &rebuild
        && demo.inventory.node(name).is_none()
    {
        let names: Vec<String> = demo.nodes.iter().map(|n| n.machine.name.clone()).collect();
        demo.shutdown().await;
        return Err(DemoError::UnknownNode(name.clone(), names.join(", ")));
    }
    let result = async {
        demo.wait_handed_off(timeout).await?;
        let mut out = format!(
            "\nhanded off after {:.1}s: {} nodes Ready, {}\n",
            demo.elapsed().as_secs_f64(),
            demo.nodes.len(),
            installed_addons(&demo.inventory)
        );
        if let Some(name) = &rebuild {
            let before = apply_counts(&demo);
            let resets = |d: &Demo| {
                d.node(name)
                    .and_then(|n| n.talos())
                    .map_or(0, |t| t.reset_calls())
            };
            let resets_before = resets(&demo);
            let t0 = demo.elapsed();
            demo.request_rebuild(name).await?;
            // The provisioner resets the node first; then it has to come back Ready.
            demo.wait_until(timeout, |d| resets(d) > resets_before)
                .await?;
            demo.wait_node_ready(name, timeout).await?;
            let after = apply_counts(&demo);
            let touched: Vec<&String> = after
                .iter()
                .filter(|(k, v)| before.get(*k) != Some(v))
                .map(|(k, _)| k)
                .collect();
            out.push_str(&format!(
                "rebuilt {name} in {:.1}s; configs re-applied to: {}\n",
                (demo.elapsed() - t0).as_secs_f64(),
                touched
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(workers) = upgrade {
            let to = upgrade::minor_bump(&demo.inventory.cluster.talos_version.value);
            if print {
                println!(
                    "\nrolling Talos {} -> {to} across the rack (one control plane at a time, \
                     {workers} worker(s) at once)",
                    demo.inventory.cluster.talos_version.value
                );
            }
            let report = demo.upgrade_talos(&to, workers, print).await?;
            out.push_str(&format!("{report}\n"));
            if let Outcome::Stopped { .. } = report.outcome {
                return Err(DemoError::Upgrade(report.to_string()));
            }
            if print {
                println!(
                    "\napplying a config change without reboot through talboot serve's admin \
                     API (as `talboot apply --mode no-reboot` does while serve runs)"
                );
            }
            let change = demo.apply_config_change(workers, print).await?;
            out.push_str(&format!("{change}\n"));
            if !matches!(
                change.outcome,
                crate::daytwo::remote::RemoteOutcome::Finished { .. }
            ) || change.reboots > 0
            {
                return Err(DemoError::DayTwo(change.to_string()));
            }
        }
        out.push_str(&demo.summary());
        Ok(out)
    }
    .await;
    let result = match (result, hold) {
        (Ok(summary), Some(hold)) => {
            println!("{summary}");
            println!(
                "talboot keeps serving the simulated rack; dashboard at {}/ (Ctrl-C to stop)",
                demo.admin_url
            );
            hold.await;
            Ok(String::new())
        }
        (result, _) => result,
    };
    demo.shutdown().await;
    result
}

mod daytwo;
mod upgrade;
use crate::daytwo::run::Outcome;
pub use daytwo::ConfigChangeReport;
pub use upgrade::UpgradeReport;

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
    }

    fn opts(config: PathBuf, workdir: &Path) -> DemoOptions {
        DemoOptions {
            config,
            workdir: workdir.join("run"),
            print_events: false,
            concurrency: crate::provision::DEFAULT_CONCURRENCY,
        }
    }

    #[test]
    fn the_demo_writes_its_bundle_only_inside_its_work_directory() {
        let work = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let bundle = SecretsBundle::generate(
            time::OffsetDateTime::now_utc(),
            &GenerateOptions {
                service_account_key: ServiceAccountKeyKind::EcdsaP256,
            },
        )
        .unwrap();
        let id = work.path().join("age-identity.txt");
        // The operator's own bundle, named by an absolute path: untouched.
        let theirs = elsewhere.path().join("rack1.age");
        assert!(!write_bundle(work.path(), &theirs, &id, &bundle).unwrap());
        assert!(!theirs.exists() && !id.exists());
        // In the work directory: written, and the identity decrypts it to the same bundle.
        let ours = work.path().join("config/secrets/rack1.age");
        assert!(write_bundle(work.path(), &ours, &id, &bundle).unwrap());
        let sources = crate::crypto::age::IdentitySources {
            explicit: Some(id.clone()),
            ..Default::default()
        };
        let ids = crate::crypto::age::Identities::load(&sources).unwrap();
        let plain = crate::crypto::age::decrypt(&std::fs::read(&ours).unwrap(), &ids).unwrap();
        assert_eq!(
            SecretsBundle::from_yaml(std::str::from_utf8(plain.expose()).unwrap()).unwrap(),
            bundle
        );
        // Never over an existing file.
        assert!(!write_bundle(work.path(), &ours, &id, &bundle).unwrap());
    }

    #[test]
    fn the_rack_and_its_patches_move_onto_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let p = prepare(&opts(repo("config/rack.yaml"), dir.path())).unwrap();
        let inv = &p.inventory;
        assert_eq!(
            inv.node("rack1-mon-01").unwrap().address.value.to_string(),
            "127.0.1.41/24"
        );
        assert_eq!(
            inv.cluster.vip.as_ref().unwrap().value.to_string(),
            "127.0.0.10"
        );
        // NTP (rendered as TimeSyncConfig) moved too; the patches were copied beside it.
        assert_eq!(inv.network.ntp, vec!["127.0.0.1".to_string()]);
        let patch = std::fs::read_to_string(dir.path().join("run/config/patches/rack-common.yaml"))
            .unwrap();
        assert!(!patch.contains("10.20.0."), "{patch}");
        // The operator's files are untouched, and the state directory is private.
        let original = std::fs::read_to_string(repo("config/rack.yaml")).unwrap();
        assert!(original.contains("ntp: [10.20.0.1]"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p.state_dir)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // A second run needs a fresh directory.
        let again = prepare(&opts(repo("config/rack.yaml"), dir.path()));
        assert!(matches!(again, Err(DemoError::Prepare { .. })));
    }

    #[test]
    fn proxy_and_pull_inventories_are_refused_with_the_reason() {
        for (from, to, want) in [
            (
                "mode: authoritative",
                "mode: proxy",
                "network.mode is proxy",
            ),
            ("delivery: push", "delivery: pull", "boot.delivery is pull"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let src = dir.path().join("src");
            std::fs::create_dir_all(src.join("patches")).unwrap();
            for f in ["rack-common.yaml", "controlplane.yaml", "storage.yaml"] {
                std::fs::copy(repo("config/patches").join(f), src.join("patches").join(f)).unwrap();
            }
            let text = std::fs::read_to_string(repo("config/rack.yaml"))
                .unwrap()
                .replace(from, to);
            std::fs::write(src.join("rack.yaml"), text).unwrap();
            let err = prepare(&opts(src.join("rack.yaml"), dir.path()))
                .err()
                .unwrap_or_else(|| panic!("{to} accepted"));
            assert!(matches!(err, DemoError::Unsupported(_)), "{err}");
            assert!(err.to_string().contains(want), "{err}");
        }
    }
}
