//! The Secure Boot gate, pure: what a `secureBoot: true` node reported about its own boot
//! (COSI `runtime/SecurityStates.talos.dev/securitystate`, read in maintenance mode) against
//! what the inventory and the boot set expect, decided before any config is applied. A node
//! that fails it gets nothing; the refusal names everything it reported.
//!
//! What Talos reports, and how (siderolabs/talos v1.13.9 and v1.14.0-rc.1, identical,
//! `internal/app/machined/pkg/controllers/runtime/security_state.go`):
//! * `secureBoot`: the EFI `SecureBoot` variable is 1 **and** `SetupMode` is 0 (firmware in
//!   setup mode enforces nothing, so it reports off).
//! * `bootedWithUKI`: systemd-boot's `LoaderEntryDefault` starts with `Talos-`, or, when that
//!   is empty, the base name of systemd-stub's `StubImageIdentifier` does.
//! * `pcrSigningKeyFingerprint`: SHA-256 over the DER of the PEM block systemd-stub extracted
//!   from the UKI's `.pcrpkey` section (`/.extra/tpm2-pcr-public-key.pem`), as uppercase hex
//!   pairs joined by `:` (`x509CertFingerprint`); empty when the file is absent.
//! * `ukiSigningKeyFingerprint` is declared but never filled at either tag, so it is reported
//!   and never judged.
//!
//! This is a policy gate against misconfigured firmware and wrong images, not attestation:
//! the node's answer is not signed by anything talboot can verify (docs/security.md).

use std::fmt;

use crate::talos::api::talos::resource::definitions::runtime::{
    RuntimeFipsState, RuntimeSeLinuxState, SecurityStateSpec,
};

/// What the node said about its boot, every field of `SecurityStateSpec`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    /// Secure Boot enforced (on, not in setup mode).
    pub secure_boot: bool,
    /// Booted from a Talos UKI.
    pub booted_with_uki: bool,
    /// The UKI's `.pcrpkey` fingerprint, Talos's format; empty when absent.
    pub pcr_signing_key_fingerprint: String,
    /// Declared by Talos, never filled at v1.13.9/v1.14.0-rc.1.
    pub uki_signing_key_fingerprint: String,
    /// `disabled`, `enabled, permissive` or `enabled, enforcing` (Talos's names).
    pub selinux_state: String,
    /// `disabled`, `enabled` or `enabled, strict`.
    pub fips_state: String,
    /// `module.sig_enforce=1` on the kernel command line.
    pub module_signature_enforced: bool,
}

impl From<&SecurityStateSpec> for Reported {
    fn from(s: &SecurityStateSpec) -> Self {
        // The names `talosctl get securitystate` prints (the enumer line comments of
        // pkg/machinery/resources/runtime/security_status.go).
        let selinux = match s.se_linux_state() {
            RuntimeSeLinuxState::SeLinuxStateDisabled => "disabled",
            RuntimeSeLinuxState::SeLinuxStatePermissive => "enabled, permissive",
            RuntimeSeLinuxState::SeLinuxStateEnforcing => "enabled, enforcing",
        };
        let fips = match s.fips_state() {
            RuntimeFipsState::FipsStateDisabled => "disabled",
            RuntimeFipsState::FipsStateEnabled => "enabled",
            RuntimeFipsState::FipsStateStrict => "enabled, strict",
        };
        Self {
            secure_boot: s.secure_boot,
            booted_with_uki: s.booted_with_uki,
            pcr_signing_key_fingerprint: s.pcr_signing_key_fingerprint.clone(),
            uki_signing_key_fingerprint: s.uki_signing_key_fingerprint.clone(),
            selinux_state: selinux.to_owned(),
            fips_state: fips.to_owned(),
            module_signature_enforced: s.module_signature_enforced,
        }
    }
}

impl fmt::Display for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or_none = |s: &str| {
            if s.is_empty() {
                "(none)".to_owned()
            } else {
                s.to_owned()
            }
        };
        write!(
            f,
            "secureBoot={} bootedWithUKI={} pcrSigningKeyFingerprint={} \
             ukiSigningKeyFingerprint={} selinuxState={:?} fipsState={:?} \
             moduleSignatureEnforced={}",
            self.secure_boot,
            self.booted_with_uki,
            or_none(&self.pcr_signing_key_fingerprint),
            or_none(&self.uki_signing_key_fingerprint),
            self.selinux_state,
            self.fips_state,
            self.module_signature_enforced,
        )
    }
}

/// What reading the resource gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// The resource, decoded.
    Found(Reported),
    /// COSI answered NotFound (the controller has not filled it, or the node does not have
    /// the resource type).
    NotFound,
    /// The read failed; the error's text (no secrets: a maintenance read carries none).
    Failed(String),
}

/// What the boot set expects of a node that booted it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    /// The `.pcrpkey` fingerprint of the boot set's UKI, Talos's format; `None` when the
    /// catalog records none (then no node can be matched to it, and none is configured).
    pub pcr_signing_key_fingerprint: Option<String>,
}

/// One reason the gate refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Secure Boot not enforced (off, or firmware in setup mode).
    SecureBootOff,
    /// Not booted from a Talos UKI.
    NotBootedWithUki,
    /// The boot set records no `.pcrpkey` fingerprint to compare with.
    NoExpectedKey,
    /// The UKI's PCR key is not the boot set's.
    OtherKey {
        /// What the boot set's UKI carries.
        expected: String,
    },
    /// COSI NotFound.
    NotFound,
    /// The read failed.
    Unreadable(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SecureBootOff => f.write_str(
                "Secure Boot is not enforced (off, or the firmware is in setup mode: enrol the \
                 keys and turn it on)",
            ),
            Self::NotBootedWithUki => f.write_str("it did not boot from a Talos UKI"),
            Self::NoExpectedKey => f.write_str(
                "the boot set records no UKI .pcrpkey fingerprint to compare with (pull the \
                 Secure Boot boot set again)",
            ),
            Self::OtherKey { expected } => write!(
                f,
                "its UKI's PCR signing key is not the boot set's (expected {expected})"
            ),
            Self::NotFound => f.write_str(
                "its SecurityState resource does not exist (runtime/SecurityStates.talos.dev/\
                 securitystate NotFound)",
            ),
            Self::Unreadable(e) => write!(f, "its SecurityState could not be read: {e}"),
        }
    }
}

/// Why a node gets no config: every reason, and what it reported (absent when unreadable).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    /// Every check that failed, in a fixed order.
    pub reasons: Vec<Reason>,
    /// What the node reported, when it could be read (boxed: errors stay small).
    pub reported: Option<Box<Reported>>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("secureBoot node refused, no config sent: ")?;
        for (i, r) in self.reasons.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{r}")?;
        }
        match &self.reported {
            Some(rep) => write!(f, "; the node reported {rep}"),
            None => Ok(()),
        }
    }
}

/// Two fingerprints name the same key: Talos writes uppercase hex pairs joined by `:`;
/// case and separators are not what a key is.
pub fn same_fingerprint(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_hexdigit())
            .map(|c| c.to_ascii_uppercase())
            .collect()
    };
    let (a, b) = (norm(a), norm(b));
    // A SHA-256 is 64 hex digits; anything shorter (empty, truncated) never matches.
    a.len() == 64 && a == b
}

/// The gate: `Ok` only when the node reported Secure Boot enforced and the boot set's PCR
/// signing key (`bootedWithUKI: false` alone is not refused when that key matches; see the
/// body). Every failing check is listed, not only the first.
pub fn judge(read: &Read, expected: &Expected) -> Result<Reported, Refusal> {
    let rep = match read {
        Read::Found(r) => r,
        Read::NotFound => {
            return Err(Refusal {
                reasons: vec![Reason::NotFound],
                reported: None,
            });
        }
        Read::Failed(e) => {
            return Err(Refusal {
                reasons: vec![Reason::Unreadable(e.clone())],
                reported: None,
            });
        }
    };
    let mut reasons = Vec::new();
    if !rep.secure_boot {
        reasons.push(Reason::SecureBootOff);
    }
    // `bootedWithUKI` comes from a file name (systemd-stub's `StubImageIdentifier`, the
    // loaded image's device path as text): a UKI the firmware loaded over PXE/TFTP has no file
    // path node, so Talos reports false for it although the UKI ran. The PCR key file exists
    // only when systemd-stub unpacked it from a UKI's `.pcrpkey`, so the boot set's key is the
    // stronger evidence; without it, a missing UKI is a reason of its own.
    let key_matches = expected
        .pcr_signing_key_fingerprint
        .as_deref()
        .is_some_and(|want| same_fingerprint(want, &rep.pcr_signing_key_fingerprint));
    if !rep.booted_with_uki && !key_matches {
        reasons.push(Reason::NotBootedWithUki);
    }
    match &expected.pcr_signing_key_fingerprint {
        None => reasons.push(Reason::NoExpectedKey),
        Some(want) if !same_fingerprint(want, &rep.pcr_signing_key_fingerprint) => {
            reasons.push(Reason::OtherKey {
                expected: want.clone(),
            })
        }
        Some(_) => {}
    }
    if reasons.is_empty() {
        Ok(rep.clone())
    } else {
        Err(Refusal {
            reasons,
            reported: Some(Box::new(rep.clone())),
        })
    }
}

/// A SHA-256 digest in Talos's fingerprint format (`x509CertFingerprint`: uppercase hex
/// pairs joined by `:`), e.g. of the DER a `.pcrpkey` PEM holds.
pub fn talos_fingerprint(digest: &[u8; 32]) -> String {
    let hex = crate::hex::lower(digest).to_ascii_uppercase();
    hex.as_bytes()
        .chunks(2)
        .map(|p| std::str::from_utf8(p).expect("hex is ASCII"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Per `secureBoot: true` node, the `.pcrpkey` fingerprint of the UKI in the boot set it
/// boots (the inventory's Talos version and schematic, the node's architecture), for
/// [`super::Settings::secure_boot_keys`]. A node whose set is not in the catalog, or records
/// no fingerprint, is left out, and the gate then refuses it ([`Reason::NoExpectedKey`]).
pub fn expected_pcr_fingerprints(
    inv: &crate::inventory::Inventory,
    catalog: &crate::artifacts::Catalog,
) -> std::collections::BTreeMap<String, String> {
    let talos = &inv.cluster.talos_version.value;
    let schematic = inv.cluster.installer.schematic_id();
    inv.nodes
        .iter()
        .filter(|n| n.secure_boot())
        .filter_map(|n| {
            let id = crate::artifacts::SetId::new(talos, schematic, inv.arch_of(n));
            let fp = uki_pcr_fingerprint(catalog.find(&id)?)?;
            Some((n.name.to_string(), fp))
        })
        .collect()
}

/// The `.pcrpkey` fingerprint, in Talos's format, that the catalog recorded for the entry's
/// Secure Boot UKI when it was pulled or imported (`artifacts::uki`); `None` (and so a
/// refusal, [`Reason::NoExpectedKey`]) when the set has no signed UKI or the UKI no
/// `.pcrpkey`.
fn uki_pcr_fingerprint(entry: &crate::artifacts::Entry) -> Option<String> {
    entry
        .uki_facts(crate::artifacts::Kind::SecureBootUki)?
        .pcr_key_fingerprint
        .clone()
}

#[cfg(test)]
mod tests;
