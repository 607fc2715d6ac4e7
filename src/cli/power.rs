//! Power commands: `talboot node power NAME on|off|cycle|status`, `talboot node boot NAME
//! network|disk [--persistent]` and `talboot rack up`, plus the per-node driver set the
//! other commands (`check --probe`, `node rebuild`, `serve`) build from the inventory.
//!
//! Standalone, a command talks to the node's controller itself. When `talboot serve` holds
//! the state store, the command goes to serve's admin API instead, whose provisioner (the one
//! writer of node state) runs it and records the event. Credentials are resolved here, from
//! the environment or the encrypted credentials file, and never printed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::crypto::age::IdentitySources;
use crate::inventory::{self, Inventory};
use crate::power::credentials::{CredentialError, Resolver};
use crate::power::dispatch::{PowerRequest, drivers};
use crate::power::fleet;
use crate::power::{BootDevice, BootPersistence, PowerAction, PowerDriver};
use crate::store::{self, NodePhase, Store};

use super::admin_client::AdminClientError;
use super::{EXIT_INVALID, EXIT_USAGE};

/// Where a power command finds the inventory, the state store and a running serve.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Common {
    #[command(flatten)]
    pub inventory: super::args::InventoryFile,
    #[command(flatten)]
    pub store: super::args::StoreAccess,
    #[command(flatten)]
    pub power_identity: super::args::PowerIdentity,
}

/// `on`, `off`, `cycle` or `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PowerOp {
    /// Power on.
    On,
    /// Hard power off.
    Off,
    /// Off, then on.
    Cycle,
    /// Read the power state.
    Status,
}

impl PowerOp {
    fn request(self) -> PowerRequest {
        match self {
            Self::On => PowerRequest::Set(PowerAction::On),
            Self::Off => PowerRequest::Set(PowerAction::Off),
            Self::Cycle => PowerRequest::Set(PowerAction::Cycle),
            Self::Status => PowerRequest::Status,
        }
    }
}

/// Arguments of `talboot node power`.
#[derive(Debug, clap::Args)]
pub(crate) struct PowerArgs {
    /// Node name from the inventory.
    pub name: String,
    /// What to do.
    #[arg(value_enum)]
    pub op: PowerOp,
    #[command(flatten)]
    pub common: Common,
}

/// `network` or `disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DeviceArg {
    /// PXE / network boot.
    Network,
    /// The first local disk.
    Disk,
}

/// Arguments of `talboot node boot`.
#[derive(Debug, clap::Args)]
pub(crate) struct BootArgs {
    /// Node name from the inventory.
    pub name: String,
    /// Where the next boot goes.
    #[arg(value_enum)]
    pub device: DeviceArg,
    /// Every later boot too, not only the next one.
    #[arg(long)]
    pub persistent: bool,
    #[command(flatten)]
    pub common: Common,
}

/// Arguments of `talboot rack`.
#[derive(Debug, clap::Args)]
pub struct RackArgs {
    /// What to do with the rack.
    #[command(subcommand)]
    pub(crate) command: RackCommand,
}

/// `talboot rack` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum RackCommand {
    /// Power on every inventory node that is not provisioned yet, each with a one-time
    /// network boot first, one after another with a pause between them (to limit inrush).
    Up(RackUpArgs),
}

/// Arguments of `talboot rack up`.
#[derive(Debug, clap::Args)]
pub(crate) struct RackUpArgs {
    /// Pause between two nodes' power-on (`2s`, `500ms`, `0`).
    #[arg(long, default_value = "2s", value_parser = parse_pause)]
    pub stagger: Duration,
    #[command(flatten)]
    pub common: Common,
}

/// Why a pause (`--stagger`, `--power-on-stagger`) does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PauseError {
    /// A number without a unit.
    #[error("`{0}` needs a unit: ms, s or m (e.g. 2s)")]
    NoUnit(String),
    /// No number in front of the unit.
    #[error("`{0}` is not a pause such as 2s or 500ms")]
    NotANumber(String),
    /// A unit other than ms, s or m.
    #[error("`{0}`: unit must be ms, s or m")]
    Unit(String),
}

/// `2s`, `500ms`, `1m` or `0`.
pub(crate) fn parse_pause(s: &str) -> Result<Duration, PauseError> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .ok_or_else(|| PauseError::NoUnit(s.to_owned()))?;
    let n: u64 = num
        .parse()
        .map_err(|_| PauseError::NotANumber(s.to_owned()))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(PauseError::Unit(s.to_owned())),
    }
}

/// How long a rebuild waits for the Talos API before it uses power control instead.
const API_WAIT: Duration = Duration::from_secs(3);

/// Whether `node rebuild NAME` should use power control (see
/// [`crate::power::fleet::rebuild_needs_power`]); asked before the rebuild.
pub(crate) fn rebuild_needs_power(inv: &Inventory, name: &str, apid_port: u16) -> bool {
    let Ok(rt) = runtime() else { return false };
    rt.block_on(fleet::rebuild_needs_power(inv, name, apid_port, API_WAIT))
}

pub(crate) fn load(config: &std::path::Path) -> Result<Inventory, ExitCode> {
    inventory::load(config).map(|l| l.inventory).map_err(|e| {
        if let inventory::LoadError::Invalid { diagnostics, .. } = &e {
            for d in diagnostics.sorted() {
                eprintln!("{d}");
            }
        }
        eprintln!("talboot: {e}");
        ExitCode::from(EXIT_INVALID)
    })
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("talboot: cannot start the async runtime: {e}");
            ExitCode::from(EXIT_USAGE)
        })
}

/// The store and the timelines' writer, which a standalone command owns while it runs.
type Local = (std::sync::Arc<dyn Store>, store::EventWriter);

/// Whether serve holds the store (then commands go through its admin API); if not, the
/// store and the timelines' writer.
fn serve_holds_store(
    access: &super::args::StoreAccess,
    inv: &Inventory,
    command: &str,
) -> Result<Option<Local>, ExitCode> {
    let cluster = inv.cluster.name.as_str();
    match super::store_flags::open_to_write(access, cluster, command)? {
        super::store_flags::Reach::Local(opened) => Ok(Some((opened.store, opened.writers.events))),
        super::store_flags::Reach::Serve => Ok(None),
    }
}

/// The one driver of node `name`, or the message saying why there is none.
pub(crate) fn driver_of(
    inv: &Inventory,
    name: &str,
    inventory: &super::args::InventoryFile,
    identity: &super::args::PowerIdentity,
) -> Result<PowerDriver, ExitCode> {
    let Some(node) = inv.node(name) else {
        eprintln!(
            "talboot: node {name:?} is not in {}; `talboot check` lists the node names",
            inventory.config.display()
        );
        return Err(ExitCode::from(EXIT_INVALID));
    };
    let Some(config) = &node.power else {
        eprintln!(
            "talboot: node {name} has no power controller; add a `power:` block (kind redfish, ipmi, proxmox or wol) to it or its role"
        );
        return Err(ExitCode::from(EXIT_INVALID));
    };
    let env = |v: &str| std::env::var(v).ok();
    let mut r = Resolver::new(
        &env,
        IdentitySources::from_process_env(identity.age_identity.clone()),
    );
    r.config(name, config).map_err(|e| {
        eprintln!("talboot: {e}");
        ExitCode::from(EXIT_INVALID)
    })
}

/// The admin API path of `req` for node `name`.
fn api_path(name: &str, req: PowerRequest) -> String {
    match req {
        PowerRequest::Set(a) => format!("/api/nodes/{name}/power/{}", a.as_str()),
        PowerRequest::Status => format!("/api/nodes/{name}/power/status"),
        PowerRequest::Boot(d, BootPersistence::Once) => {
            format!("/api/nodes/{name}/boot/{}", d.as_str())
        }
        PowerRequest::Boot(d, BootPersistence::Persistent) => {
            format!("/api/nodes/{name}/boot/{}?persistent=true", d.as_str())
        }
    }
}

/// Why a power command sent through serve's admin API failed.
#[derive(Debug, thiserror::Error)]
enum ThroughServeError {
    /// No HTTP client for the admin API.
    #[error(transparent)]
    Client(#[from] AdminClientError),
    /// Serve's admin API did not answer the power request.
    #[error(
        "the state store is in use (is `talboot serve` running?) and {url} did not answer: \
         {source}; pass --admin if serve's --admin-listen is elsewhere"
    )]
    Unreachable {
        /// What was asked.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// Serve answered the power request with an error.
    #[error("talboot serve refused it ({status}): {body}")]
    Refused {
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// Serve's reason.
        body: String,
    },
    /// Serve's admin API did not answer the node list.
    #[error("the state store is in use and {url} did not answer: {source}")]
    PhasesUnreachable {
        /// What was asked.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The node list's body could not be read.
    #[error("{url}: {source}")]
    PhasesBody {
        /// What was asked.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The node list is not JSON.
    #[error("{url}: {source}")]
    PhasesJson {
        /// What was asked.
        url: String,
        /// Why.
        source: serde_json::Error,
    },
}

/// Why one power request for one node failed, standalone or through serve.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// Through serve.
    #[error(transparent)]
    Serve(#[from] ThroughServeError),
    /// Standalone: the controller.
    #[error(transparent)]
    Power(#[from] crate::power::PowerError),
}

/// Sends `req` for `name` to serve's admin API; its answer text, or why not.
async fn through_serve(
    admin: std::net::SocketAddr,
    name: &str,
    req: PowerRequest,
) -> Result<String, ThroughServeError> {
    let url = format!("http://{admin}{}", api_path(name, req));
    let resp = match super::admin_client::client()?.post(&url).send().await {
        Ok(r) => r,
        Err(source) => return Err(ThroughServeError::Unreachable { url, source }),
    };
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if status.is_success() {
        Ok(body.trim_end().to_owned())
    } else {
        Err(ThroughServeError::Refused {
            status,
            body: body.trim().to_owned(),
        })
    }
}

/// Runs `req` on `driver` here (serve is not running), its answer a `power.action` event on
/// the node's timeline as serve's provisioner would record it.
fn standalone(
    rt: &tokio::runtime::Runtime,
    events: &store::EventWriter,
    name: &str,
    driver: &PowerDriver,
    req: PowerRequest,
) -> Result<String, RequestError> {
    let reply = rt.block_on(driver.run(req))?;
    let _ = events.append_event(
        name,
        crate::events::EventKind::Power.as_str(),
        &reply.to_string(),
        now_ms(),
    );
    Ok(reply.to_string())
}

/// One request for one node: standalone, or through serve when it holds the store.
fn one(name: &str, req: PowerRequest, common: &Common) -> ExitCode {
    let inv = match load(&common.inventory.config) {
        Ok(i) => i,
        Err(c) => return c,
    };
    let local = match serve_holds_store(&common.store, &inv, "node power") {
        Ok(s) => s,
        Err(c) => return c,
    };
    crate::install_crypto_provider();
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let result = match local {
        None => rt
            .block_on(through_serve(common.store.admin, name, req))
            .map_err(RequestError::from),
        Some((_, events)) => {
            let driver = match driver_of(&inv, name, &common.inventory, &common.power_identity) {
                Ok(d) => d,
                Err(c) => return c,
            };
            standalone(&rt, &events, name, &driver, req)
        }
    };
    match result {
        Ok(text) => {
            println!("{name}: {text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("talboot: {name}: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `talboot node power`.
pub(crate) fn run_power(a: &PowerArgs) -> ExitCode {
    one(&a.name, a.op.request(), &a.common)
}

/// `talboot node boot`.
pub(crate) fn run_boot(a: &BootArgs) -> ExitCode {
    let device = match a.device {
        DeviceArg::Network => BootDevice::Network,
        DeviceArg::Disk => BootDevice::Disk,
    };
    let persistence = if a.persistent {
        BootPersistence::Persistent
    } else {
        BootPersistence::Once
    };
    one(&a.name, PowerRequest::Boot(device, persistence), &a.common)
}

/// Run `talboot rack`.
pub(crate) fn run_rack(args: &RackArgs) -> ExitCode {
    match &args.command {
        RackCommand::Up(a) => rack_up(a),
    }
}

fn rack_up(a: &RackUpArgs) -> ExitCode {
    let inv = match load(&a.common.inventory.config) {
        Ok(i) => i,
        Err(c) => return c,
    };
    let local = match serve_holds_store(&a.common.store, &inv, "rack up") {
        Ok(s) => s,
        Err(c) => return c,
    };
    crate::install_crypto_provider();
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let phases = match rack_phases(a, local.as_ref().map(|(store, _)| store.as_ref()), &rt) {
        Ok(p) => p,
        Err(c) => return c,
    };
    let drivers = rack_drivers(a, &inv, local.is_some());
    let mut failed = 0usize;
    let mut first = true;
    for node in &inv.nodes {
        let name = node.name.as_str();
        let phase = phases.get(name).copied();
        if !crate::power::round::needs_power_on(phase) {
            println!(
                "{name}: skipped ({})",
                phase.map(|p| p.as_str()).unwrap_or("unknown")
            );
            continue;
        }
        let Some(config) = &node.power else {
            println!("{name}: skipped (no power controller in the inventory)");
            continue;
        };
        let driver = match (&local, drivers.get(name)) {
            (Some(_), Some(Err(e))) => {
                println!("{name}: failed: {e}");
                failed += 1;
                continue;
            }
            (Some(_), Some(Ok(d))) => Some(d),
            _ => None,
        };
        if !first && !a.stagger.is_zero() {
            std::thread::sleep(a.stagger);
        }
        first = false;
        let can_boot = config.can_set_boot_device();
        for step in crate::power::round::rack_up_steps(can_boot) {
            let r = match (&local, driver) {
                (Some((_, events)), Some(driver)) => standalone(&rt, events, name, driver, step),
                _ => rt
                    .block_on(through_serve(a.common.store.admin, name, step))
                    .map_err(RequestError::from),
            };
            match r {
                Ok(text) => println!("{name}: {text}"),
                Err(e) => {
                    println!("{name}: failed: {e}");
                    failed += 1;
                    break;
                }
            }
        }
    }
    rack_up_exit(failed)
}

/// The exit of `rack up`: failure if any node failed.
fn rack_up_exit(failed: usize) -> ExitCode {
    if failed > 0 {
        eprintln!("talboot: rack up: {failed} node(s) failed; see above");
        ExitCode::from(EXIT_INVALID)
    } else {
        ExitCode::SUCCESS
    }
}

/// Every node's phase, from the store or, while serve holds it, from serve.
fn rack_phases(
    a: &RackUpArgs,
    local: Option<&dyn Store>,
    rt: &tokio::runtime::Runtime,
) -> Result<BTreeMap<String, NodePhase>, ExitCode> {
    match local {
        Some(store) => match store.nodes() {
            Ok(recs) => Ok(recs
                .into_iter()
                .map(|r| (r.name.clone(), r.phase))
                .collect()),
            Err(e) => {
                eprintln!("talboot: {e}");
                Err(ExitCode::from(EXIT_USAGE))
            }
        },
        None => match rt.block_on(serve_phases(a.common.store.admin)) {
            Ok(p) => Ok(p),
            Err(e) => {
                eprintln!("talboot: {e}");
                Err(ExitCode::from(EXIT_USAGE))
            }
        },
    }
}

/// Standalone the drivers are built here; through serve, serve's provisioner holds them
/// (and the credentials), so only the inventory is consulted.
fn rack_drivers(
    a: &RackUpArgs,
    inv: &Inventory,
    local: bool,
) -> BTreeMap<String, Result<PowerDriver, CredentialError>> {
    if local {
        drivers(
            inv,
            IdentitySources::from_process_env(a.common.power_identity.age_identity.clone()),
        )
    } else {
        BTreeMap::new()
    }
}

const ALL_PHASES: [NodePhase; 8] = [
    NodePhase::Unknown,
    NodePhase::Booting,
    NodePhase::Maintenance,
    NodePhase::Configuring,
    NodePhase::Installing,
    NodePhase::Ready,
    NodePhase::Rebuilding,
    NodePhase::Failed,
];

/// Node phases from a running serve's `/api/nodes`.
async fn serve_phases(
    admin: std::net::SocketAddr,
) -> Result<BTreeMap<String, NodePhase>, ThroughServeError> {
    let url = format!("http://{admin}/api/nodes");
    let resp = match super::admin_client::client()?.get(&url).send().await {
        Ok(r) => r,
        Err(source) => return Err(ThroughServeError::PhasesUnreachable { url, source }),
    };
    let text = match resp.text().await {
        Ok(t) => t,
        Err(source) => return Err(ThroughServeError::PhasesBody { url, source }),
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(source) => return Err(ThroughServeError::PhasesJson { url, source }),
    };
    let mut out = BTreeMap::new();
    for n in v.as_array().into_iter().flatten() {
        if let (Some(name), Some(phase)) = (n["name"].as_str(), n["phase"].as_str())
            && let Some(p) = ALL_PHASES.iter().copied().find(|p| p.as_str() == phase)
        {
            out.insert(name.to_owned(), p);
        }
    }
    Ok(out)
}

/// What `check --probe` found wrong: controllers that did not answer, and `secureBoot: true`
/// nodes whose controller says the firmware will not enforce Secure Boot.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbeFailures {
    pub unreachable: usize,
    pub not_enforcing: usize,
}

/// `check --probe`: reach every configured controller and say what answered, with each
/// node's Secure Boot state as its controller reads it.
pub(crate) fn probe_all(inv: &Inventory, age_identity: Option<PathBuf>) -> ProbeFailures {
    crate::install_crypto_provider();
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(_) => {
            return ProbeFailures {
                unreachable: 1,
                not_enforcing: 0,
            };
        }
    };
    let probes = rt.block_on(fleet::probe_all(
        inv,
        IdentitySources::from_process_env(age_identity),
    ));
    if probes.is_empty() {
        println!("probe: no node has a power controller");
        return ProbeFailures::default();
    }
    for p in &probes {
        println!("{p}");
        if let Some(line) = p.secure_boot_line() {
            println!("{line}");
        }
    }
    ProbeFailures {
        unreachable: probes.iter().filter(|p| p.failed()).count(),
        not_enforcing: probes
            .iter()
            .filter(|p| p.secure_boot_problem().is_some())
            .count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_parse() {
        assert_eq!(parse_pause("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_pause("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_pause("0"), Ok(Duration::ZERO));
        assert!(parse_pause("2").is_err());
        assert!(parse_pause("2h").is_err());
    }

    #[test]
    fn api_paths() {
        assert_eq!(
            api_path("n1", PowerRequest::Set(PowerAction::Cycle)),
            "/api/nodes/n1/power/cycle"
        );
        assert_eq!(
            api_path(
                "n1",
                PowerRequest::Boot(BootDevice::Disk, BootPersistence::Persistent)
            ),
            "/api/nodes/n1/boot/disk?persistent=true"
        );
    }
}
