//! Power and boot-device control of inventory machines: the vocabulary every driver speaks
//! (Redfish, IPMI 2.0 LAN, Proxmox VE, Wake-on-LAN) and the errors they return.
//!
//! Drivers live in their own submodules, each implementing [`Driver`] on its resolved
//! inventory target, and are chosen per node by the inventory's `power:` block: the
//! configuration enum [`PowerConfig`] is the driver ([`PowerDriver`] is it with credentials
//! resolved), and [`PowerDriver::driver`] below is the one place a kind is registered. A new
//! driver is its config variant and parser (`inventory/power.rs`), its module here, and its
//! `mod` and registration lines in this file. They are reached only through the provisioner (the one writer of node state), so a
//! power action and the node's lifecycle never race; the CLI and a running `serve` send it
//! commands. Credentials travel as [`Credential`](crate::inventory::Credential) (an inventory
//! type: what the operator's secret becomes), whose `Debug` never shows the secret, so a
//! driver error or a log line cannot leak them.

pub mod credentials;
pub mod dispatch;
pub(crate) mod fleet;
pub(crate) mod round;

// The drivers, each registered in [`PowerDriver::driver`].
pub mod ipmi;
pub mod proxmox;
pub mod redfish;
pub mod secureboot;
pub mod wol;

pub use dispatch::{PowerDriver, ProbeAnswer};

use std::fmt;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::inventory::PowerConfig;

/// What every power driver does, implemented by each driver module on its resolved inventory
/// target. Futures are boxed so the driver can be chosen at run time ([`PowerDriver::driver`]).
pub(crate) trait Driver: Send + Sync {
    /// Power on, off or cycle.
    fn set_power(&self, action: PowerAction) -> BoxFuture<'_, Result<(), PowerError>>;

    /// The current power state.
    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, PowerError>>;

    /// The next boot's device (once or persistently), and what the operator should know
    /// about it.
    fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> BoxFuture<'_, Result<BootSet, PowerError>>;

    /// Reach the controller without changing anything: its power state by default.
    fn probe(&self) -> BoxFuture<'_, Result<ProbeAnswer, PowerError>> {
        Box::pin(async move { self.power_state().await.map(ProbeAnswer::Answered) })
    }

    /// What the controller says of the firmware's Secure Boot (`check --probe`); by
    /// default, that this driver cannot say.
    fn secure_boot(&self) -> BoxFuture<'_, Result<secureboot::SecureBootProbe, PowerError>> {
        Box::pin(async {
            Ok(secureboot::SecureBootProbe::Unknown(
                "this power driver cannot read the firmware's Secure Boot state".into(),
            ))
        })
    }
}

impl PowerDriver {
    /// The implementation of this node's `power:` kind: the one registration of each driver.
    pub(crate) fn driver(&self) -> &dyn Driver {
        match self {
            PowerConfig::Redfish(t) => t,
            PowerConfig::Ipmi(t) => t,
            PowerConfig::Proxmox(t) => t,
            PowerConfig::Wol(t) => t,
        }
    }
}

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

/// What a boot-device choice did beyond the device: the firmware mode the machine will boot
/// in, when the driver knows it, and what the operator should know (a mode the BMC would not
/// take, a change that needed retries). Shown in the `power.action` event and on the CLI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootSet {
    /// The boot mode as the controller will use it (`UEFI`, `Legacy`), when known.
    pub mode: Option<String>,
    /// Warnings and remarks, each a sentence.
    pub notes: Vec<String>,
}

impl fmt::Display for BootSet {
    /// `, UEFI` then `; NOTE` for each note (appended to "next boot: DEVICE (once").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(m) = &self.mode {
            write!(f, " in {m} mode")?;
        }
        for n in &self.notes {
            write!(f, "; {n}")?;
        }
        Ok(())
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
    /// A setting of the controller in the inventory or its secrets is unusable; the reason
    /// names the field and the fix, never a secret's value.
    #[error("{target}: {reason}")]
    Invalid { target: String, reason: String },
    /// The request was accepted but did not take effect in time.
    #[error("{target}: {what} did not take effect within {waited:?}")]
    Timeout {
        target: String,
        what: String,
        waited: Duration,
    },
}

/// Reads a controller's CA bundle; the error names the file, never a credential.
pub(crate) fn read_ca(
    path: Option<&std::path::Path>,
    target: &str,
) -> Result<Option<Vec<u8>>, PowerError> {
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

/// Why [`http_client`] could not build a client. The message is the reason alone; the driver
/// wraps it with its target.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpClientError {
    /// `ca_file` does not parse as PEM certificates.
    #[error("the CA bundle is not PEM certificates: {0}")]
    CaNotPem(reqwest::Error),
    /// `ca_file` parses but holds no certificate.
    #[error("the CA bundle holds no certificate")]
    CaEmpty,
    /// The TLS backend refused the settings.
    #[error("cannot build the HTTP client: {0}")]
    Build(reqwest::Error),
}

/// The HTTP client a power driver talks to its controller with (Redfish BMC, Proxmox API):
/// talboot's user agent, bounded connect and request times, trust limited to `ca_pem` when
/// given, verification off only when the operator said so (warned about).
pub(crate) fn http_client(
    what: &str,
    target: &str,
    timeout: Duration,
    ca_pem: Option<&[u8]>,
    verify_tls: bool,
    redirect: reqwest::redirect::Policy,
) -> Result<reqwest::Client, HttpClientError> {
    crate::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .timeout(timeout)
        .user_agent(concat!("talboot/", env!("CARGO_PKG_VERSION")))
        .redirect(redirect);
    if let Some(pem) = ca_pem {
        let certs =
            reqwest::Certificate::from_pem_bundle(pem).map_err(HttpClientError::CaNotPem)?;
        if certs.is_empty() {
            return Err(HttpClientError::CaEmpty);
        }
        builder = builder.tls_certs_only(certs);
    }
    if !verify_tls {
        tracing::warn!(%target, "{what} TLS verification is off");
        builder = builder.tls_danger_accept_invalid_certs(true);
    }
    builder
        .build()
        .map_err(|e| HttpClientError::Build(e.without_url()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_ca_bundle_is_a_typed_error() {
        let client = |pem: &[u8]| {
            http_client(
                "Redfish",
                "https://bmc",
                Duration::from_secs(5),
                Some(pem),
                true,
                reqwest::redirect::Policy::none(),
            )
        };
        assert!(matches!(
            client(b"no certificate here"),
            Err(HttpClientError::CaEmpty)
        ));
        assert!(matches!(
            client(b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n"),
            Err(HttpClientError::CaNotPem(_) | HttpClientError::CaEmpty)
        ));
        assert!(client(b"").is_err());
    }
}
