//! Power and boot-device control of inventory machines: the vocabulary every driver speaks
//! (Redfish, IPMI 2.0 LAN, Proxmox VE, Wake-on-LAN) and the errors they return.
//!
//! Drivers live in their own submodules and are chosen per node by the inventory's `power:`
//! block. They are reached only through the provisioner (the one writer of node state), so a
//! power action and the node's lifecycle never race; the CLI and a running `serve` send it
//! commands. Credentials travel as [`Credential`], whose `Debug` never shows the secret, so a
//! driver error or a log line cannot leak them.

use std::fmt;
use std::time::Duration;

/// What the operator (or a flow such as `rack up`) asks a machine's power to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PowerAction {
    /// Power on; a machine already on stays on.
    On,
    /// Hard power off (not a graceful shutdown: a node being rebuilt may not answer one).
    Off,
    /// Off then on (a machine that is off is just powered on).
    Cycle,
}

impl PowerAction {
    /// The CLI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Cycle => "cycle",
        }
    }
}

/// What a driver read back about a machine's power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PowerState {
    On,
    Off,
    /// The driver cannot read power state (Wake-on-LAN can only send), or the BMC said
    /// something that is neither.
    Unknown,
}

impl PowerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Unknown => "unknown",
        }
    }
}

/// Where the machine boots from next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootDevice {
    /// PXE / network boot (so it reaches talboot's DHCP, TFTP and HTTP).
    Network,
    /// The first local disk (the installed Talos).
    Disk,
}

impl BootDevice {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Network => "network",
            Self::Disk => "disk",
        }
    }
}

/// Whether a boot-device choice holds for the next boot only or for every boot after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootPersistence {
    Once,
    Persistent,
}

/// A secret (BMC password, Proxmox API token secret). `Debug` and `Display` print a
/// placeholder so the value cannot reach a log or an error by formatting.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(zeroize::Zeroizing<String>);

impl Credential {
    pub fn new(secret: impl Into<String>) -> Self {
        Self(zeroize::Zeroizing::new(secret.into()))
    }

    /// The secret itself, for the one place that puts it on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

impl fmt::Display for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Why a power request failed. Messages name the machine's controller (endpoint, BMC
/// address, VM id) and what to check; they never carry a credential.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// The controller could not be reached (connect, TLS, timeout).
    #[error("{target}: cannot reach the power controller: {reason}")]
    Unreachable { target: String, reason: String },
    /// The controller refused the credentials.
    #[error(
        "{target}: the power controller refused the credentials (check the user and secret in the secrets bundle or environment)"
    )]
    Unauthorized { target: String },
    /// The controller answered, but not with what the protocol says it should.
    #[error("{target}: unexpected answer from the power controller: {reason}")]
    Protocol { target: String, reason: String },
    /// The controller does not support the request (for example a boot device on WoL).
    #[error("{target}: {what} is not supported by this power driver")]
    Unsupported { target: String, what: String },
    /// The request was accepted but did not take effect in time.
    #[error("{target}: {what} did not take effect within {waited:?}")]
    Timeout {
        target: String,
        what: String,
        waited: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_never_formats_its_secret() {
        let c = Credential::new("hunter2-bmc");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!format!("{c}").contains("hunter2"));
        assert_eq!(c.expose(), "hunter2-bmc");
    }
}
