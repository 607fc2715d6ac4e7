//! IPMI 2.0 over LAN (RMCP+): chassis power and one-time boot device.
//!
//! The session (RMCP presence ping, Get Channel Authentication Capabilities, Open Session,
//! RAKP 1-4, then HMAC-SHA1-96 integrity and AES-CBC-128 confidentiality: cipher suite 3) is
//! the `ipmi-rs` crate's, carried with a patch (`patches/ipmi-rs/TALBOOT-PATCH.md`) so that a
//! BMC that never answers the presence ping (pyghmi, virtualbmc, ASF disabled) still gets a
//! session, as it does from `ipmitool -I lanplus`; it has no chassis commands, so the four used here are encoded and
//! decoded in this module, sans-I/O, from the IPMI v2.0 rev 1.1 specification (Intel, 2013):
//!
//! | command | netfn/cmd | spec | request data |
//! |---|---|---|---|
//! | Set Session Privilege Level | App 06h / 3Bh | 22.18 | `04h` (Administrator) |
//! | Get Chassis Status | Chassis 00h / 01h | 28.2 | none; byte 1 bit 0 = power is on |
//! | Chassis Control | Chassis 00h / 02h | 28.3 | `00h` down, `01h` up, `02h` cycle |
//! | Set System Boot Options, param 5 | Chassis 00h / 08h | 28.12, table 28-14 | `05h`, byte 1 (bit 7 valid, bit 6 persistent, bit 5 EFI boot), byte 2 (bits 5:2 device: `0001b` PXE, `0010b` default disk), bytes 3-5 zero |
//!
//! Boot flags byte 1 bit 5 is the "BIOS boot type": 0 is a PC compatible (legacy) boot, 1
//! an EFI boot. A BMC honours it when it sets the boot up, so a UEFI node sent flags without
//! it is network-booted in legacy mode (or not at all). It is set for a node whose
//! `firmware:` is `uefi` or `http`, for a one-time and a persistent choice alike, with the
//! same bits as ipmitool's `chassis bootdev pxe options=efiboot` (ipmitool
//! `lib/ipmi_chassis.c`, `BF1_BOOT_TYPE_EFI`, tag IPMITOOL_1_8_19): `05 a0 04 00 00 00`
//! once, `05 e0 04 00 00 00` persistent.
//!
//! The session is raised to Administrator after activation because a new RMCP+ session
//! starts at User (spec 22.18, and `ipmitool -I lanplus` does the same), and Chassis Control
//! needs Operator. The blocking `ipmi-rs` socket runs on a blocking thread.

use std::time::Duration;

use ipmi_rs::connection::{IpmiConnection, LogicalUnit, Message, Request, RequestTargetAddress};
use ipmi_rs::rmcp::{ActivationError, Rmcp, V2_0ActivationError};

use crate::inventory::IpmiTarget;

use futures_util::future::BoxFuture;

use super::{BootDevice, BootPersistence, BootSet, PowerAction, PowerError, PowerState};

/// How long one request waits for its answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// NetFn Chassis (request).
const NETFN_CHASSIS: u8 = 0x00;
/// NetFn Application (request).
const NETFN_APP: u8 = 0x06;

/// One IPMI request as netfn, command and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    /// Network function (request value).
    pub netfn: u8,
    /// Command.
    pub cmd: u8,
    /// Request data.
    pub data: Vec<u8>,
}

/// Set Session Privilege Level to Administrator (spec 22.18).
pub(crate) fn set_privilege_admin() -> Raw {
    Raw {
        netfn: NETFN_APP,
        cmd: 0x3b,
        data: vec![0x04],
    }
}

/// Get Chassis Status (spec 28.2).
pub(crate) fn get_chassis_status() -> Raw {
    Raw {
        netfn: NETFN_CHASSIS,
        cmd: 0x01,
        data: Vec::new(),
    }
}

/// Chassis Control (spec 28.3) for `action`.
pub fn chassis_control(action: PowerAction) -> Raw {
    let code = match action {
        PowerAction::Off => 0x00,
        PowerAction::On => 0x01,
        PowerAction::Cycle => 0x02,
    };
    Raw {
        netfn: NETFN_CHASSIS,
        cmd: 0x02,
        data: vec![code],
    }
}

/// Boot flags data byte 1: the flags are valid (spec table 28-14, bit 7).
const BF1_VALID: u8 = 0x80;
/// Boot flags data byte 1: for every future boot, not only the next (bit 6).
const BF1_PERSISTENT: u8 = 0x40;
/// Boot flags data byte 1: an EFI boot, not a PC compatible (legacy) one (bit 5).
const BF1_EFI: u8 = 0x20;

/// Set System Boot Options, boot flags parameter 5 (spec 28.12, table 28-14); `efi` asks for
/// an EFI boot (a UEFI node), otherwise the BMC sets up a legacy one.
pub(crate) fn set_boot_flags(device: BootDevice, persistence: BootPersistence, efi: bool) -> Raw {
    let mut byte1 = BF1_VALID;
    if persistence == BootPersistence::Persistent {
        byte1 |= BF1_PERSISTENT;
    }
    if efi {
        byte1 |= BF1_EFI;
    }
    let selector: u8 = match device {
        BootDevice::Network => 0b0001, // force PXE
        BootDevice::Disk => 0b0010,    // force boot from default hard drive
    };
    Raw {
        netfn: NETFN_CHASSIS,
        cmd: 0x08,
        data: vec![0x05, byte1, selector << 2, 0x00, 0x00, 0x00],
    }
}

/// A Get Chassis Status answer without its first data byte (the current power state).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Get Chassis Status answered without the current power state byte")]
pub(crate) struct NoPowerStateByte;

/// Power state from a Get Chassis Status answer (data after the completion code).
pub(crate) fn decode_chassis_status(data: &[u8]) -> Result<PowerState, NoPowerStateByte> {
    match data.first() {
        Some(b) if b & 0x01 == 1 => Ok(PowerState::On),
        Some(_) => Ok(PowerState::Off),
        None => Err(NoPowerStateByte),
    }
}

/// A completion code's meaning (spec table 5-2), for messages.
pub(crate) fn completion_code(cc: u8) -> String {
    let what = match cc {
        0x00 => "normal",
        0xc0 => "node busy",
        0xc1 => "invalid command",
        0xc3 => "timeout",
        0xc7 => "request data length invalid",
        0xc9 => "parameter out of range",
        0xcc => "invalid data field in request",
        0xd4 => "insufficient privilege level",
        0xd5 => "command not supported in present state",
        0xff => "unspecified error",
        _ => "other error",
    };
    format!("completion code {cc:#04x} ({what})")
}

/// The controller name for messages.
pub fn describe(t: &IpmiTarget) -> String {
    format!("ipmi://{}:{}", t.host, t.port)
}

/// An open RMCP+ session on a blocking socket.
struct Session {
    rmcp: Rmcp,
    target: String,
}

impl Session {
    fn open(t: &IpmiTarget) -> Result<Self, PowerError> {
        let target = describe(t);
        let mut rmcp =
            Rmcp::new((t.host.as_str(), t.port), TIMEOUT).map_err(|e| PowerError::Unreachable {
                target: target.clone(),
                reason: e.to_string(),
            })?;
        rmcp.activate(true, Some(&t.user), Some(t.password.expose().as_bytes()))
            .map_err(|e| activation_error(&target, e))?;
        let mut s = Self { rmcp, target };
        s.call(&set_privilege_admin())?;
        Ok(s)
    }

    /// Sends `raw` and returns the answer's data after a normal completion code.
    fn call(&mut self, raw: &Raw) -> Result<Vec<u8>, PowerError> {
        let mut req = Request::new(
            Message::new_raw(raw.netfn, raw.cmd, raw.data.clone()),
            RequestTargetAddress::Bmc(LogicalUnit::Zero),
        );
        let resp = self
            .rmcp
            .send_recv(&mut req)
            .map_err(|e| PowerError::Unreachable {
                target: self.target.clone(),
                // The crate's error types carry socket errors and protocol states, no keys.
                reason: format!("{e:?}"),
            })?;
        if resp.cc() != 0 {
            return Err(PowerError::Protocol {
                target: self.target.clone(),
                reason: format!(
                    "netfn {:#04x} cmd {:#04x}: {}",
                    raw.netfn,
                    raw.cmd,
                    completion_code(resp.cc())
                ),
            });
        }
        Ok(resp.data().to_vec())
    }
}

fn activation_error(target: &str, e: ActivationError) -> PowerError {
    use V2_0ActivationError as V;
    match e {
        ActivationError::V2_0(
            V::RakpMessage2Parse(_)
            | V::RakpMessage2Validate(_)
            | V::RakpMessage4Parse(_)
            | V::RakpMessage4Validate(_)
            | V::RakpMessage4InvalidIntegrityCheckValue
            | V::ServerAuthenticationFailed,
        ) => PowerError::Unauthorized {
            target: target.to_owned(),
        },
        other => PowerError::Unreachable {
            target: target.to_owned(),
            reason: format!("RMCP+ session not established: {other:?}"),
        },
    }
}

/// Runs `f` on a fresh session on a blocking thread.
async fn with_session<T: Send + 'static>(
    t: &IpmiTarget,
    f: impl FnOnce(&mut Session) -> Result<T, PowerError> + Send + 'static,
) -> Result<T, PowerError> {
    let t = t.clone();
    let target = describe(&t);
    tokio::task::spawn_blocking(move || {
        let mut s = Session::open(&t)?;
        f(&mut s)
    })
    .await
    .map_err(|e| PowerError::Unreachable {
        target,
        reason: format!("IPMI task failed: {e}"),
    })?
}

/// Chassis power `action`.
pub async fn set_power(t: &IpmiTarget, action: PowerAction) -> Result<(), PowerError> {
    with_session(t, move |s| s.call(&chassis_control(action)).map(drop)).await?;
    tracing::info!(bmc = %describe(t), action = action.as_str(), "IPMI chassis control sent");
    Ok(())
}

/// Chassis power state.
pub async fn power_state(t: &IpmiTarget) -> Result<PowerState, PowerError> {
    with_session(t, |s| {
        let data = s.call(&get_chassis_status())?;
        decode_chassis_status(&data).map_err(|e| PowerError::Protocol {
            target: s.target.clone(),
            reason: e.to_string(),
        })
    })
    .await
}

/// Next boot from `device`.
pub async fn set_boot_device(
    t: &IpmiTarget,
    device: BootDevice,
    persistence: BootPersistence,
) -> Result<(), PowerError> {
    let efi = t.efi_boot;
    with_session(t, move |s| {
        s.call(&set_boot_flags(device, persistence, efi)).map(drop)
    })
    .await?;
    tracing::info!(
        bmc = %describe(t),
        device = device.as_str(),
        boot_type = if efi { "efi" } else { "legacy" },
        "IPMI boot flags set"
    );
    Ok(())
}

/// The IPMI driver: a session per request on the blocking pool.
impl super::Driver for IpmiTarget {
    fn set_power(&self, action: PowerAction) -> BoxFuture<'_, Result<(), PowerError>> {
        Box::pin(set_power(self, action))
    }

    fn secure_boot(&self) -> BoxFuture<'_, Result<super::secureboot::SecureBootProbe, PowerError>> {
        // IPMI v2.0 rev. 1.1 has no Secure Boot command or parameter (its boot options,
        // Get System Boot Options parameter 5, choose the device and BIOS/EFI only).
        Box::pin(async {
            Ok(super::secureboot::SecureBootProbe::Unknown(
                "IPMI cannot read UEFI Secure Boot (the IPMI 2.0 specification has no such \
                 command); use the BMC's Redfish or its setup UI"
                    .into(),
            ))
        })
    }

    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, PowerError>> {
        Box::pin(power_state(self))
    }

    fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> BoxFuture<'_, Result<BootSet, PowerError>> {
        Box::pin(async move {
            set_boot_device(self, device, persistence)
                .await
                .map(|()| BootSet::default())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chassis_control_codes_follow_the_spec() {
        assert_eq!(chassis_control(PowerAction::Off).data, [0x00]);
        assert_eq!(chassis_control(PowerAction::On).data, [0x01]);
        assert_eq!(chassis_control(PowerAction::Cycle).data, [0x02]);
        assert_eq!(chassis_control(PowerAction::On).netfn, 0x00);
        assert_eq!(chassis_control(PowerAction::On).cmd, 0x02);
    }

    #[test]
    fn boot_flags_encode_valid_persistence_and_device() {
        let once_pxe = set_boot_flags(BootDevice::Network, BootPersistence::Once, false);
        assert_eq!(once_pxe.cmd, 0x08);
        assert_eq!(once_pxe.data, [0x05, 0x80, 0x04, 0, 0, 0]);
        let disk = set_boot_flags(BootDevice::Disk, BootPersistence::Persistent, false);
        assert_eq!(disk.data, [0x05, 0xc0, 0x08, 0, 0, 0]);
    }

    #[test]
    fn a_uefi_node_gets_the_efi_boot_bit_once_and_persistent() {
        // The bytes `ipmitool chassis bootdev pxe options=efiboot` sends (and with
        // `,persistent`), as recorded by a pyghmi BMC.
        let once = set_boot_flags(BootDevice::Network, BootPersistence::Once, true);
        assert_eq!(once.data, [0x05, 0xa0, 0x04, 0, 0, 0]);
        let persistent = set_boot_flags(BootDevice::Network, BootPersistence::Persistent, true);
        assert_eq!(persistent.data, [0x05, 0xe0, 0x04, 0, 0, 0]);
        let disk = set_boot_flags(BootDevice::Disk, BootPersistence::Persistent, true);
        assert_eq!(disk.data, [0x05, 0xe0, 0x08, 0, 0, 0]);
    }

    #[test]
    fn a_bmc_that_never_answers_the_presence_ping_is_still_asked_for_a_session() {
        // A socket that reads everything and answers nothing: the ping goes unanswered, as
        // it does on pyghmi and virtualbmc. Activation must go on to Get Channel
        // Authentication Capabilities (which then times out here) instead of failing on
        // the pong (ipmi-rs 0.6.0 unpatched: `PongReceive(WouldBlock)`).
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let t = IpmiTarget {
            host: "127.0.0.1".into(),
            port: silent.local_addr().unwrap().port(),
            user: "admin".into(),
            password: crate::inventory::Credential::new("never-sent-in-clear"),
            efi_boot: false,
        };
        let Err(PowerError::Unreachable { reason, .. }) = Session::open(&t).map(drop) else {
            panic!("a silent BMC gave a session")
        };
        assert!(!reason.contains("Pong"), "{reason}");
        assert!(
            reason.contains("GetChannelAuthenticationCapabilities"),
            "{reason}"
        );
        // The request after the ping reached the BMC.
        let mut buf = [0u8; 512];
        silent.set_nonblocking(true).unwrap();
        let mut datagrams = 0;
        while silent.recv(&mut buf).is_ok() {
            datagrams += 1;
        }
        assert!(
            datagrams >= 2,
            "only {datagrams} datagram(s) reached the BMC"
        );
    }

    #[test]
    fn chassis_status_reads_bit_zero() {
        assert_eq!(decode_chassis_status(&[0x01, 0, 0]), Ok(PowerState::On));
        assert_eq!(decode_chassis_status(&[0x60, 0, 0]), Ok(PowerState::Off));
        assert!(decode_chassis_status(&[]).is_err());
    }
}
