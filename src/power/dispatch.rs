//! The driver for one node's power controller, chosen by its inventory `power:` kind: one
//! enum, one `match` per operation, no trait objects (the drivers are few and known).
//!
//! The inventory's resolved targets are mapped onto each driver's own config here, so the
//! drivers stay independent of the inventory model. A driver is built per request: building
//! is cheap (one HTTP client), and a BMC whose certificate or address changed is picked up
//! without a restart. [`drivers`] builds every inventory node's, credentials resolved, for the
//! CLI and for serve's provisioner ([`serve_drivers`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::crypto::age::IdentitySources;
use crate::inventory::{
    Credential, Inventory, IpmiTarget, PowerConfig, ProxmoxTarget, RedfishTarget, WolTarget,
};

use super::{
    BootDevice, BootPersistence, BootSet, PowerAction, PowerError, PowerState,
    credentials::Resolver,
    ipmi,
    proxmox::{ProxmoxApi, ProxmoxApiConfig, ProxmoxVm},
    redfish::{Redfish, RedfishConfig},
    wol,
};

/// A node's power driver with its credentials resolved.
#[derive(Debug, Clone)]
pub enum PowerDriver {
    /// Redfish BMC.
    Redfish(RedfishTarget),
    /// IPMI 2.0 LAN BMC.
    Ipmi(IpmiTarget),
    /// Proxmox VE VM.
    Proxmox(ProxmoxTarget),
    /// Wake-on-LAN (send-only).
    Wol(WolTarget),
}

impl From<PowerConfig<Credential>> for PowerDriver {
    fn from(c: PowerConfig<Credential>) -> Self {
        match c {
            PowerConfig::Redfish(t) => Self::Redfish(t),
            PowerConfig::Ipmi(t) => Self::Ipmi(t),
            PowerConfig::Proxmox(t) => Self::Proxmox(t),
            PowerConfig::Wol(t) => Self::Wol(t),
        }
    }
}

/// What `check --probe` learnt from a controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// The controller answered and reported this power state.
    Answered(PowerState),
    /// The protocol has no answer (Wake-on-LAN): nothing was sent.
    SendOnly,
}

impl PowerDriver {
    /// The inventory spelling of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Redfish(_) => "redfish",
            Self::Ipmi(_) => "ipmi",
            Self::Proxmox(_) => "proxmox",
            Self::Wol(_) => "wol",
        }
    }

    /// The controller's address, for messages.
    pub fn target(&self) -> String {
        match self {
            Self::Redfish(t) => t.endpoint.clone(),
            Self::Ipmi(t) => ipmi::describe(t),
            Self::Proxmox(t) => format!("{} vm {}/{}", t.api_url, t.node, t.vmid),
            Self::Wol(t) => wol::describe(t),
        }
    }

    /// Power on, off or cycle.
    pub async fn set_power(&self, action: PowerAction) -> Result<(), PowerError> {
        match self {
            Self::Redfish(t) => with_redfish(t, async |rf| rf.set_power(action).await).await,
            Self::Proxmox(t) => proxmox(t)?.set_power(action).await,
            Self::Ipmi(t) => ipmi::set_power(t, action).await,
            Self::Wol(t) => match action {
                // A machine woken while on ignores the packet; one that is off starts, which
                // is all a cycle can do without a way to turn it off.
                PowerAction::On | PowerAction::Cycle => wol::wake(t).await,
                PowerAction::Off => Err(PowerError::Unsupported {
                    target: wol::describe(t),
                    what: "power off".into(),
                }),
            },
        }
    }

    /// The current power state (`Unknown` for Wake-on-LAN).
    pub async fn power_state(&self) -> Result<PowerState, PowerError> {
        match self {
            Self::Redfish(t) => with_redfish(t, async |rf| rf.power_state().await).await,
            Self::Proxmox(t) => proxmox(t)?.power_state().await,
            Self::Ipmi(t) => ipmi::power_state(t).await,
            Self::Wol(_) => Ok(PowerState::Unknown),
        }
    }

    /// The next boot's device (once or persistently), and what the operator should know
    /// about it ([`BootSet`]: the boot mode, a mode the BMC would not take).
    pub async fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> Result<BootSet, PowerError> {
        match self {
            Self::Redfish(t) => {
                with_redfish(t, async |rf| rf.set_boot_device(device, persistence).await).await
            }
            Self::Proxmox(t) => proxmox(t)?
                .set_boot_device(device, persistence)
                .await
                .map(|()| BootSet::default()),
            Self::Ipmi(t) => ipmi::set_boot_device(t, device, persistence)
                .await
                .map(|()| BootSet::default()),
            Self::Wol(t) => Err(PowerError::Unsupported {
                target: wol::describe(t),
                what: "choosing the boot device".into(),
            }),
        }
    }

    /// Whether the driver can choose the boot device (flows skip that step otherwise).
    pub fn can_set_boot_device(&self) -> bool {
        !matches!(self, Self::Wol(_))
    }

    /// Reach the controller without changing anything: its power state, or `SendOnly`.
    pub async fn probe(&self) -> Result<ProbeAnswer, PowerError> {
        match self {
            Self::Wol(_) => Ok(ProbeAnswer::SendOnly),
            _ => self.power_state().await.map(ProbeAnswer::Answered),
        }
    }
}

/// Reads a controller's CA bundle; the error names the file, never a credential.
fn read_ca(path: Option<&std::path::Path>, target: &str) -> Result<Option<Vec<u8>>, PowerError> {
    path.map(|p| {
        std::fs::read(p).map_err(|e| PowerError::Unreachable {
            target: target.to_string(),
            reason: format!(
                "cannot read the CA bundle {}: {e} (fix `power.ca` in the inventory)",
                p.display()
            ),
        })
    })
    .transpose()
}

fn redfish(t: &RedfishTarget) -> Result<Redfish, PowerError> {
    let mut cfg = RedfishConfig::new(t.endpoint.clone(), t.user.clone(), t.password.clone());
    cfg.system_id = t.system_id.clone();
    cfg.verify_tls = t.verify_tls;
    cfg.ca_pem = read_ca(t.ca.as_deref(), &t.endpoint)?;
    cfg.boot_mode = t.boot_mode;
    cfg.auth = t.auth;
    Redfish::new(cfg)
}

/// One operation on a Redfish BMC, then its session (if one was opened) deleted, whether
/// the operation succeeded or not.
async fn with_redfish<T>(
    t: &RedfishTarget,
    op: impl AsyncFnOnce(&Redfish) -> Result<T, PowerError>,
) -> Result<T, PowerError> {
    let rf = redfish(t)?;
    let out = op(&rf).await;
    rf.close().await;
    out
}

/// The inventory documents the API base with or without Proxmox's `/api2/json` suffix; the
/// client adds it itself.
fn proxmox_base(api_url: &str) -> &str {
    let trimmed = api_url.trim_end_matches('/');
    trimmed.strip_suffix("/api2/json").unwrap_or(trimmed)
}

/// The Proxmox API client of a resolved target (also what `talboot proxmox` uses).
pub fn proxmox_api(t: &ProxmoxTarget) -> Result<std::sync::Arc<ProxmoxApi>, PowerError> {
    let base = proxmox_base(&t.api_url);
    let mut cfg = ProxmoxApiConfig::new(base, t.token_id.clone(), t.token_secret.clone());
    cfg.verify_tls = t.verify_tls;
    cfg.ca_pem = read_ca(t.ca.as_deref(), base)?;
    Ok(std::sync::Arc::new(ProxmoxApi::new(cfg)?))
}

fn proxmox(t: &ProxmoxTarget) -> Result<ProxmoxVm, PowerError> {
    Ok(proxmox_api(t)?.vm(&t.node, t.vmid))
}

/// One operator request, as the CLI, the admin API and the provisioner pass it around.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerRequest {
    /// Power on, off or cycle.
    Set(PowerAction),
    /// Read the power state.
    Status,
    /// Choose the next boot's device.
    Boot(BootDevice, BootPersistence),
}

/// What a [`PowerRequest`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerReply {
    /// The action was accepted by the controller.
    Done(PowerRequest),
    /// The boot choice was accepted, with what the operator should know about it.
    Boot(BootDevice, BootPersistence, BootSet),
    /// The power state read.
    State(PowerState),
}

impl PowerDriver {
    /// Carry out `req`.
    pub async fn run(&self, req: PowerRequest) -> Result<PowerReply, PowerError> {
        match req {
            PowerRequest::Set(a) => self.set_power(a).await.map(|()| PowerReply::Done(req)),
            PowerRequest::Status => self.power_state().await.map(PowerReply::State),
            PowerRequest::Boot(d, p) => self
                .set_boot_device(d, p)
                .await
                .map(|set| PowerReply::Boot(d, p, set)),
        }
    }
}

impl std::fmt::Display for PowerReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Done(PowerRequest::Set(a)) => write!(f, "power {} sent", a.as_str()),
            Self::Done(PowerRequest::Boot(d, p)) => write!(f, "next boot: {}", boot_words(*d, *p)),
            Self::Boot(d, p, set) => write!(f, "next boot: {}{set}", boot_words(*d, *p)),
            Self::Done(PowerRequest::Status) => f.write_str("status read"),
            Self::State(s) => write!(f, "power {}", s.as_str()),
        }
    }
}

/// `network (once)`, `disk (persistent)`.
fn boot_words(d: BootDevice, p: BootPersistence) -> String {
    let p = match p {
        BootPersistence::Persistent => "persistent",
        BootPersistence::Once => "once",
    };
    format!("{} ({p})", d.as_str())
}

impl PowerDriver {
    /// A one-time network boot, then a power cycle: how a node whose OS no longer answers
    /// (a rebuild that cannot reset it over the Talos API) is sent back to talboot's DHCP,
    /// TFTP and HTTP. Wake-on-LAN cannot choose the device; it only wakes the machine.
    /// What the boot choice told ([`BootSet`]) is returned for the event.
    pub async fn reboot_into_network(&self) -> Result<BootSet, PowerError> {
        let set = if self.can_set_boot_device() {
            self.set_boot_device(BootDevice::Network, BootPersistence::Once)
                .await?
        } else {
            BootSet::default()
        };
        self.set_power(PowerAction::Cycle).await?;
        Ok(set)
    }
}

/// Whether something accepts TCP connections at `addr` within `wait` (the Talos API's
/// liveness, before a rebuild falls back to power control).
pub async fn tcp_answers(addr: std::net::SocketAddr, wait: std::time::Duration) -> bool {
    matches!(
        tokio::time::timeout(wait, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Every node's driver (or why it has none usable), credentials resolved.
pub(crate) fn drivers(
    inv: &Inventory,
    sources: IdentitySources,
) -> BTreeMap<String, Result<PowerDriver, String>> {
    let env = |name: &str| std::env::var(name).ok();
    let mut resolver = Resolver::new(&env, sources);
    let mut out = BTreeMap::new();
    for node in &inv.nodes {
        let Some(config) = &node.power else { continue };
        let d = resolver
            .config(node.name.as_str(), config)
            .map(PowerDriver::from)
            .map_err(|e| e.to_string());
        out.insert(node.name.to_string(), d);
    }
    out
}

/// The drivers `serve`'s provisioner gets: the usable ones; a node whose credentials do
/// not resolve is logged (naming the variable or file, never a value) and left out.
pub(crate) fn serve_drivers(
    inv: &Inventory,
    age_identity: Option<PathBuf>,
) -> BTreeMap<String, PowerDriver> {
    drivers(inv, IdentitySources::from_process_env(age_identity))
        .into_iter()
        .filter_map(|(name, d)| match d {
            Ok(d) => Some((name, d)),
            Err(e) => {
                tracing::warn!(node = %name, "power control unavailable: {e}");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod wiring_tests {
    use super::*;

    #[test]
    fn the_proxmox_base_drops_the_api_suffix_either_way() {
        assert_eq!(
            proxmox_base("https://pve:8006/api2/json"),
            "https://pve:8006"
        );
        assert_eq!(
            proxmox_base("https://pve:8006/api2/json/"),
            "https://pve:8006"
        );
        assert_eq!(proxmox_base("https://pve:8006"), "https://pve:8006");
    }

    #[test]
    fn an_unreadable_ca_is_named_and_no_secret_is_shown() {
        let t = RedfishTarget {
            endpoint: "https://10.0.50.11".into(),
            system_id: None,
            verify_tls: true,
            ca: Some("/nonexistent/bmc-ca.pem".into()),
            user: "admin".into(),
            password: Credential::new("s3cret-bmc"),
            auth: Default::default(),
            boot_mode: None,
        };
        let Err(err) = redfish(&t).map(|_| ()) else {
            panic!("a missing CA is an error")
        };
        let err = err.to_string();
        assert!(err.contains("/nonexistent/bmc-ca.pem"), "{err}");
        assert!(!err.contains("s3cret-bmc"), "{err}");
    }
}
