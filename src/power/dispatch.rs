//! The driver for one node's power controller, chosen by its inventory `power:` kind: one
//! enum, one `match` per operation, no trait objects (the drivers are few and known).
//!
//! The Redfish and Proxmox VE drivers are the redfish helper's (`power::redfish`,
//! `power::proxmox`); until they are merged their variants answer
//! [`PowerError::Unsupported`], so every caller (CLI, provisioner, `rack up`) is already
//! written against the final shape.

use crate::inventory::{IpmiTarget, PowerConfig, ProxmoxTarget, RedfishTarget, WolTarget};

use super::{
    BootDevice, BootPersistence, Credential, PowerAction, PowerError, PowerState, ipmi, wol,
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

    fn not_yet(&self, what: &str) -> PowerError {
        PowerError::Unsupported {
            target: self.target(),
            what: format!("{what} ({} driver not built in yet)", self.kind()),
        }
    }

    /// Power on, off or cycle.
    pub async fn set_power(&self, action: PowerAction) -> Result<(), PowerError> {
        match self {
            // The redfish helper's driver plugs in here at merge.
            Self::Redfish(_) | Self::Proxmox(_) => Err(self.not_yet("power control")),
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
            // The redfish helper's driver plugs in here at merge.
            Self::Redfish(_) | Self::Proxmox(_) => Err(self.not_yet("power state")),
            Self::Ipmi(t) => ipmi::power_state(t).await,
            Self::Wol(_) => Ok(PowerState::Unknown),
        }
    }

    /// The next boot's device (once or persistently).
    pub async fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> Result<(), PowerError> {
        match self {
            // The redfish helper's driver plugs in here at merge.
            Self::Redfish(_) | Self::Proxmox(_) => Err(self.not_yet("boot device")),
            Self::Ipmi(t) => ipmi::set_boot_device(t, device, persistence).await,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerReply {
    /// The action or boot choice was accepted by the controller.
    Done(PowerRequest),
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
                .map(|()| PowerReply::Done(req)),
        }
    }
}

impl std::fmt::Display for PowerReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Done(PowerRequest::Set(a)) => write!(f, "power {} sent", a.as_str()),
            Self::Done(PowerRequest::Boot(d, p)) => write!(
                f,
                "next boot: {}{}",
                d.as_str(),
                if *p == BootPersistence::Persistent {
                    " (persistent)"
                } else {
                    " (once)"
                }
            ),
            Self::Done(PowerRequest::Status) => f.write_str("status read"),
            Self::State(s) => write!(f, "power {}", s.as_str()),
        }
    }
}

impl PowerDriver {
    /// A one-time network boot, then a power cycle: how a node whose OS no longer answers
    /// (a rebuild that cannot reset it over the Talos API) is sent back to talboot's DHCP,
    /// TFTP and HTTP. Wake-on-LAN cannot choose the device; it only wakes the machine.
    pub async fn reboot_into_network(&self) -> Result<(), PowerError> {
        if self.can_set_boot_device() {
            self.set_boot_device(BootDevice::Network, BootPersistence::Once)
                .await?;
        }
        self.set_power(PowerAction::Cycle).await
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
