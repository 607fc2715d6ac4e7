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
//!
//! * this file: the running demo ([`Demo`]) and its errors.
//! * [`prepare`]: the work directory, made before anything runs.
//! * [`launch`]: throwaway secrets, settings and the plan that starts talboot.
//! * [`rack`]: the simulated machines and the Kubernetes API double.
//! * [`run`]: `talboot demo` from start to summary.
//! * [`upgrade`] and [`daytwo`]: the rolling Talos upgrade and the config change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::kube::KubeDouble;
use super::relocate::{RelocateError, Relocation};
use super::talos::{FakeCluster, FakeTalosNode};
use crate::appliance::{ApplianceError, Running};
use crate::events::EventKind;
use crate::inventory::{self, Inventory};
use crate::machineconfig::secrets::SecretsBundle;
use crate::store::{ClusterStep, NodePhase, StepRecord, Store};

pub mod cpu;
mod daytwo;
mod launch;
mod migrate;
mod prepare;
mod rack;
mod run;
mod upgrade;

pub use daytwo::ConfigChangeReport;
use launch::Relaunch;
pub use migrate::MigrationReport;
// `talboot up`'s simulated-rack tests build their rack with these.
#[cfg(test)]
pub(crate) use prepare::{mirror_config, write_addon_manifests};
pub use rack::SimNode;
pub(crate) use rack::{power_on, start_api_double};
pub use run::run;
pub(crate) use run::{Hold, run_and_hold};
pub use upgrade::UpgradeReport;

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
    /// The simulation's own runtime ([`cpu`]) could not start, or its start task failed.
    #[error("the simulation's runtime: {0}")]
    Runtime(String),
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
    /// The pause between two machines' power-on ([`DEFAULT_POWER_ON_STAGGER`]: a rack
    /// switched on over a few hundred milliseconds); zero powers every machine on at once.
    pub power_on_stagger: Duration,
    /// Keep talboot's state in this etcd instead of the work directory's redb file
    /// (`demo --store etcd://...`); an empty `cluster` means the inventory's cluster name.
    pub etcd: Option<crate::store::EtcdConfig>,
}

/// The demo's default pause between two machines' power-on.
pub const DEFAULT_POWER_ON_STAGGER: Duration = Duration::from_millis(40);

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
    /// The simulation's runtime ([`cpu`]): held so its machines run until the demo ends.
    _sim: cpu::SimRuntime,
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

/// The run's opening lines: which rack, on which loopback subnets, where it writes, and a
/// warning when the simulated Nodes turn Ready without talboot's CNI.
fn print_banner(opts: &DemoOptions, p: &prepare::Prepared) {
    let inv = &p.inventory;
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
    if !prepare::cilium_enabled(inv) {
        println!(
            "the inventory does not enable talboot's Cilium: the simulated Nodes turn Ready \
             as if the operator's own CNI were running\n"
        );
    }
}

impl Demo {
    /// Prepares the work directory, starts talboot's servers and the Kubernetes API double,
    /// and powers on every machine.
    pub async fn start(opts: DemoOptions) -> Result<Demo, DemoError> {
        crate::install_crypto_provider();
        let started = Instant::now();
        let p = prepare::prepare(&opts)?;
        let inv = p.inventory.clone();
        if opts.print_events {
            print_banner(&opts, &p);
        }
        let secrets = launch::throwaway_secrets(&inv, &opts.workdir)?;
        // The simulation runs on its own runtime, so the summary can say whose CPU was whose.
        let sim = cpu::runtime().map_err(|e| SimFailure::Runtime(e.to_string()))?;
        let (kube, cluster) = {
            let (inv, api_ip) = (inv.clone(), p.api_ip);
            sim.spawn(async move { start_api_double(&inv, api_ip).await })
                .await
                .map_err(|e| SimFailure::Runtime(e.to_string()))??
        };
        let settings = launch::settings(&p, opts.concurrency);
        let mut relaunch = Relaunch::new(&p, &opts.workdir, &secrets, settings);
        relaunch.etcd = opts.etcd.clone().map(|mut cfg| {
            if cfg.cluster.is_empty() {
                cfg.cluster = inv.cluster.name.value.clone();
            }
            cfg
        });
        if let Some(cfg) = &relaunch.etcd {
            launch::require_empty_prefix(cfg)?;
        }
        let (running, wire) = relaunch.start().await?;
        if opts.print_events {
            println!("dashboard: {}/\n", running.admin_url);
        }
        let printer = opts.print_events.then(|| spawn_printer(&running, started));
        let stop = CancellationToken::new();

        let relocation = &p.relocation;
        // Entered (not across an await): the machines' tasks, and all they spawn, go there.
        let on_sim = sim.enter();
        let (nodes, tasks) = power_on(
            &inv,
            |a| relocation.to_rack(a).unwrap_or(a),
            wire,
            &cluster,
            &kube,
            &stop,
            opts.power_on_stagger,
        );
        drop(on_sim);
        Ok(Demo {
            _sim: sim,
            relocation: p.relocation,
            inventory: inv,
            workdir: opts.workdir,
            nodes,
            kube,
            cluster: cluster.clone(),
            base_url: running.base_url.clone(),
            admin_url: running.admin_url.clone(),
            inventory_path: p.inventory_path,
            age_identity: secrets.age_identity,
            secrets: secrets.bundle,
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

    /// The Secure Boot gate's verdict on each `secureBoot: true` node, from its timeline;
    /// empty when the inventory has none (the default demo's summary is unchanged).
    fn secure_boot_summary(&self) -> String {
        let gated: Vec<&Arc<SimNode>> = self.nodes.iter().filter(|n| n.secure_boot).collect();
        if gated.is_empty() {
            return String::new();
        }
        let mut s = String::from("\nSecure Boot gate (SecurityState read before any config):\n");
        for n in gated {
            let events = self
                .store()
                .events(&n.machine.name, 0, 10_000)
                .unwrap_or_default();
            let verdict = events
                .iter()
                .rev()
                .find(|e| {
                    e.kind == EventKind::EntitlementRefused.as_str()
                        || e.detail.starts_with("SecurityState passed")
                })
                .map(|e| e.detail.clone())
                .unwrap_or_else(|| "not read yet".into());
            s.push_str(&format!("  {}: {verdict}\n", n.machine.name));
        }
        s
    }

    /// The end-of-run summary: nodes, cluster steps and Helm release records (and the
    /// Secure Boot gate's verdicts when the inventory has secure-boot nodes).
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
        s.push_str(&self.secure_boot_summary());
        let talos: Vec<Arc<FakeTalosNode>> = self.nodes.iter().filter_map(|n| n.talos()).collect();
        if let Some(cpu) = cpu::now() {
            s.push_str(&format!(
                "\nCPU so far: talboot {:.1} s, simulation {:.1} s (machines, Talos and Kubernetes API doubles)\n",
                cpu.talboot.as_secs_f64(),
                cpu.sim.as_secs_f64()
            ));
        }
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

/// A node's persisted phase (Unknown before talboot has a record of it).
fn phase_of(records: &[crate::store::NodeRecord], name: &str) -> NodePhase {
    records
        .iter()
        .find(|r| r.name == name)
        .map_or(NodePhase::Unknown, |r| r.phase)
}
