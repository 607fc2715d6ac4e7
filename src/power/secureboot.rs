//! What a node's power controller says about its firmware's UEFI Secure Boot, in one
//! vocabulary for every driver (Redfish reads the `SecureBoot` resource, Proxmox the VM's
//! `efidisk0`, IPMI and Wake-on-LAN cannot say), and the decision `check --probe` makes for a
//! node the inventory marks `secureBoot: true`: will its firmware enforce Secure Boot?
//!
//! Also the operator's certificate file for `node secureboot enroll`: one PEM certificate,
//! no private key, and its SHA-256 fingerprint in the format Talos uses for its own
//! fingerprints (uppercase hex pairs joined by `:`), so what the operator enrols can be
//! compared with what `images list` and `SecurityState` show.

use std::fmt;

use sha2::{Digest, Sha256};

/// What one controller reported of the firmware's Secure Boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecureBootProbe {
    /// A Redfish `SecureBoot` resource (DMTF `SecureBoot.v1_1_x`): each property as the
    /// BMC read it, `None` where it has none.
    Redfish {
        /// `SecureBootEnable`: Secure Boot takes effect on the next boot.
        enable: Option<bool>,
        /// `SecureBootCurrentBoot`: `Enabled` or `Disabled` in the current boot.
        current_boot: Option<String>,
        /// `SecureBootMode`: `SetupMode`, `UserMode`, `AuditMode` or `DeployedMode`.
        mode: Option<String>,
    },
    /// A Proxmox VM: whether it boots OVMF with an `efidisk0`, and whether that disk was
    /// made from the vars template with keys enrolled (`pre-enrolled-keys=1`, with
    /// `efitype=4m` on x86_64).
    Proxmox {
        /// `bios: ovmf` (UEFI firmware).
        ovmf: bool,
        /// `efidisk0` is present.
        efidisk: bool,
        /// The efidisk was made with Microsoft's and the distribution's keys enrolled.
        pre_enrolled_keys: bool,
    },
    /// The controller cannot say; why.
    Unknown(String),
}

impl SecureBootProbe {
    /// Why a node that must boot securely will not, by what its controller reported; `None`
    /// when it will, or when the controller cannot say.
    ///
    /// Redfish (DMTF DSP8010 2025.4, `json-schema/SecureBoot.v1_1_2.json`): `SecureBootEnable`
    /// false means Secure Boot does not take effect on the next boot; `SetupMode` means no
    /// Platform Key is enrolled, and in `AuditMode` images are checked but run whatever the
    /// result (UEFI Specification 2.10, chapter 32 "Secure Boot and Driver Signing", the
    /// Setup/User/Audit/Deployed mode transitions: only User and Deployed Mode enforce).
    /// Proxmox (proxmox/qemu-server 9.2.6, `src/PVE/QemuServer/Drive.pm` `efidisk0`
    /// `pre-enrolled-keys`, `src/PVE/QemuServer/OVMF.pm`): without OVMF there is no UEFI,
    /// without an EFI disk the variables are not kept, so no key stays enrolled.
    pub fn not_enforcing(&self) -> Option<String> {
        match self {
            Self::Redfish { enable, mode, .. } => {
                if *enable == Some(false) {
                    return Some(
                        "the BMC says Secure Boot is disabled (SecureBootEnable: false)".into(),
                    );
                }
                match mode.as_deref() {
                    Some(m @ ("SetupMode" | "AuditMode")) => Some(format!(
                        "the BMC says the firmware is in {m} (no Platform Key enrolled: it verifies nothing)"
                    )),
                    _ => None,
                }
            }
            // `pre-enrolled-keys=0` is not flagged: the vars started in Setup Mode, but keys
            // enrolled since from inside the VM (the Talos ISO's auto-enrolment) are not
            // visible to Proxmox.
            Self::Proxmox { ovmf, efidisk, .. } => {
                if !ovmf {
                    Some("the VM does not boot OVMF (`bios: ovmf`): no UEFI Secure Boot".into())
                } else if !efidisk {
                    Some(
                        "the VM has no efidisk0: its UEFI variables start empty (Setup Mode) on every boot"
                            .into(),
                    )
                } else {
                    None
                }
            }
            Self::Unknown(_) => None,
        }
    }
}

/// `secure boot: enabled, current boot Enabled, DeployedMode`.
impl fmt::Display for SecureBootProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redfish {
                enable,
                current_boot,
                mode,
            } => {
                let enable = match enable {
                    Some(true) => "enabled",
                    Some(false) => "disabled",
                    None => "enable unknown",
                };
                write!(
                    f,
                    "{enable} (SecureBootEnable), current boot {}, mode {}",
                    current_boot.as_deref().unwrap_or("unknown"),
                    mode.as_deref().unwrap_or("unknown")
                )
            }
            Self::Proxmox { ovmf: false, .. } => f.write_str("SeaBIOS (no UEFI Secure Boot)"),
            Self::Proxmox { efidisk: false, .. } => f.write_str("OVMF without efidisk0"),
            Self::Proxmox {
                pre_enrolled_keys: true,
                ..
            } => f.write_str(
                "OVMF, efidisk0 pre-enrolled-keys=1 (Microsoft and distribution keys, enforced; \
                 not Sidero Labs': a factory UKI boots only once its certificate is enrolled too)",
            ),
            Self::Proxmox { .. } => f.write_str(
                "OVMF, efidisk0 without pre-enrolled keys (its variables started in Setup Mode; \
                 keys enrolled since from inside the VM are not visible to Proxmox)",
            ),
            Self::Unknown(why) => write!(f, "unknown: {why}"),
        }
    }
}

/// Why a certificate file cannot be enrolled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateFileError {
    /// Not PEM at all.
    #[error("not PEM ({0})")]
    NotPem(String),
    /// PEM, but no `CERTIFICATE` block.
    #[error("it holds no PEM CERTIFICATE block")]
    NoCertificate,
    /// More than one certificate: the Redfish `PEM` type is "a single certificate".
    #[error(
        "it holds {0} certificates; enrol one at a time (Redfish CertificateType PEM is a single certificate)"
    )]
    Several(usize),
    /// A private key next to the certificate: never sent to a BMC.
    #[error(
        "it holds a private key ({0}); give the certificate alone, the key stays with the signer"
    )]
    PrivateKey(String),
    /// The block is not an X.509 certificate.
    #[error("the CERTIFICATE block is not an X.509 certificate ({0})")]
    NotX509(String),
}

/// The certificate to enrol, read from the operator's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrolCertificate {
    /// The one `CERTIFICATE` block, re-encoded as PEM (what is POSTed as `CertificateString`).
    pub pem: String,
    /// The subject as RFC 4514 text.
    pub subject: String,
    /// SHA-256 over the DER, uppercase hex pairs joined by `:` (Talos's `x509CertFingerprint`).
    pub sha256: String,
}

/// SHA-256 over `der`, formatted as Talos formats certificate fingerprints.
pub fn sha256_fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Read the file's text as the one certificate to enrol.
pub fn enrol_certificate(text: &str) -> Result<EnrolCertificate, CertificateFileError> {
    let blocks = pem::parse_many(text).map_err(|e| CertificateFileError::NotPem(e.to_string()))?;
    if let Some(k) = blocks.iter().find(|b| b.tag().contains("PRIVATE KEY")) {
        return Err(CertificateFileError::PrivateKey(k.tag().to_string()));
    }
    let certs: Vec<&pem::Pem> = blocks.iter().filter(|b| b.tag() == "CERTIFICATE").collect();
    let cert = match certs.as_slice() {
        [] => return Err(CertificateFileError::NoCertificate),
        [one] => *one,
        many => return Err(CertificateFileError::Several(many.len())),
    };
    let subject = certificate_subject(cert.contents())?;
    Ok(EnrolCertificate {
        pem: pem::encode(cert),
        subject,
        sha256: sha256_fingerprint(cert.contents()),
    })
}

/// The RFC 4514 subject of a DER certificate.
pub fn certificate_subject(der: &[u8]) -> Result<String, CertificateFileError> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, c) =
        X509Certificate::from_der(der).map_err(|e| CertificateFileError::NotX509(e.to_string()))?;
    Ok(c.subject().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(cn: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn one_certificate_is_read_with_its_subject_and_talos_style_fingerprint() {
        let (pem_text, _) = self_signed("talboot test db");
        let c = enrol_certificate(&pem_text).unwrap();
        assert_eq!(c.subject, "CN=talboot test db");
        let der = pem::parse(&pem_text).unwrap();
        assert_eq!(c.sha256, sha256_fingerprint(der.contents()));
        assert_eq!(c.sha256.len(), 32 * 3 - 1);
        assert!(
            c.sha256
                .chars()
                .all(|ch| ch == ':' || ch.is_ascii_hexdigit() && !ch.is_ascii_lowercase())
        );
        assert_eq!(pem::parse(&c.pem).unwrap().contents(), der.contents());
    }

    #[test]
    fn keys_bundles_and_junk_are_refused() {
        let (a, key) = self_signed("a");
        let (b, _) = self_signed("b");
        assert!(matches!(
            enrol_certificate(&format!("{a}{key}")),
            Err(CertificateFileError::PrivateKey(_))
        ));
        assert_eq!(
            enrol_certificate(&format!("{a}{b}")),
            Err(CertificateFileError::Several(2))
        );
        assert_eq!(
            enrol_certificate(""),
            Err(CertificateFileError::NoCertificate)
        );
        let bogus = pem::encode(&pem::Pem::new("CERTIFICATE", vec![1, 2, 3]));
        assert!(matches!(
            enrol_certificate(&bogus),
            Err(CertificateFileError::NotX509(_))
        ));
    }

    #[test]
    fn disabled_setup_and_audit_mode_do_not_enforce() {
        let rf = |enable, mode: &str| SecureBootProbe::Redfish {
            enable,
            current_boot: Some("Enabled".into()),
            mode: Some(mode.into()),
        };
        assert_eq!(rf(Some(true), "DeployedMode").not_enforcing(), None);
        assert_eq!(rf(Some(true), "UserMode").not_enforcing(), None);
        assert!(
            rf(Some(false), "UserMode")
                .not_enforcing()
                .unwrap()
                .contains("disabled")
        );
        assert!(
            rf(Some(true), "SetupMode")
                .not_enforcing()
                .unwrap()
                .contains("SetupMode")
        );
        assert!(
            rf(None, "AuditMode")
                .not_enforcing()
                .unwrap()
                .contains("AuditMode")
        );
        let pve = |ovmf, efidisk, pre_enrolled_keys| SecureBootProbe::Proxmox {
            ovmf,
            efidisk,
            pre_enrolled_keys,
        };
        assert_eq!(pve(true, true, true).not_enforcing(), None);
        assert_eq!(pve(true, true, false).not_enforcing(), None);
        assert!(pve(true, true, false).to_string().contains("Setup Mode"));
        assert!(
            pve(false, true, true)
                .not_enforcing()
                .unwrap()
                .contains("OVMF")
        );
        assert!(pve(true, false, true).not_enforcing().is_some());
        assert_eq!(SecureBootProbe::Unknown("x".into()).not_enforcing(), None);
    }
}
