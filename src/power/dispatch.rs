//! A node's power driver: the inventory's `power:` config with its credentials resolved,
//! each operation handed to the kind's [`Driver`](super::Driver) (registered in
//! [`PowerDriver::driver`]).
//!
//! A driver is built per request: building is cheap (one HTTP client), and a BMC whose
//! certificate or address changed is picked up without a restart. [`drivers`] resolves every
//! inventory node's credentials, for the CLI and for serve's provisioner ([`serve_drivers`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::crypto::age::IdentitySources;
use crate::inventory::{Credential, Inventory, PowerConfig};

use super::{
    BootDevice, BootPersistence, BootSet, PowerAction, PowerError, PowerState,
    credentials::{CredentialError, Resolver},
};

/// A node's power driver with its credentials resolved: the inventory's config itself, so
/// there is one enum of kinds (its `kind()` and `target()` name it in messages).
pub type PowerDriver = PowerConfig<Credential>;

/// What `check --probe` learnt from a controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// The controller answered and reported this power state.
    Answered(PowerState),
    /// The protocol has no answer (Wake-on-LAN): nothing was sent.
    SendOnly,
}

impl PowerDriver {
    /// Power on, off or cycle.
    pub async fn set_power(&self, action: PowerAction) -> Result<(), PowerError> {
        self.driver().set_power(action).await
    }

    /// The current power state (`Unknown` for Wake-on-LAN).
    pub async fn power_state(&self) -> Result<PowerState, PowerError> {
        self.driver().power_state().await
    }

    /// The next boot's device (once or persistently), and what the operator should know
    /// about it ([`BootSet`]: the boot mode, a mode the BMC would not take).
    pub async fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> Result<BootSet, PowerError> {
        self.driver().set_boot_device(device, persistence).await
    }

    /// Reach the controller without changing anything: its power state, or `SendOnly`.
    pub async fn probe(&self) -> Result<ProbeAnswer, PowerError> {
        self.driver().probe().await
    }

    /// What the controller says of the firmware's Secure Boot (nothing is changed).
    pub async fn secure_boot(&self) -> Result<super::secureboot::SecureBootProbe, PowerError> {
        self.driver().secure_boot().await
    }
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
    pub(crate) async fn reboot_into_network(&self) -> Result<BootSet, PowerError> {
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
pub(crate) async fn tcp_answers(addr: std::net::SocketAddr, wait: std::time::Duration) -> bool {
    matches!(
        tokio::time::timeout(wait, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Every node's driver (or why it has none usable), credentials resolved.
pub(crate) fn drivers(
    inv: &Inventory,
    sources: IdentitySources,
) -> BTreeMap<String, Result<PowerDriver, CredentialError>> {
    let env = |name: &str| std::env::var(name).ok();
    let mut resolver = Resolver::new(&env, sources);
    let mut out = BTreeMap::new();
    for node in &inv.nodes {
        let Some(config) = &node.power else { continue };
        let d = resolver.config(node.name.as_str(), config);
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
