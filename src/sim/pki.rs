//! PKI of the simulated machines ([`super::talos`], [`super::kube`]) and their tests: an
//! Ed25519 OS CA like the one in a Talos secrets bundle (O=talos), and leaves signed by it
//! (apid server certs, client certs whose Organization carries the Talos roles). Built
//! directly on rcgen; reading certificates back (roles, EKU) uses x509-parser, as apid does
//! with Go's x509.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ED25519,
};
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a certificate could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused or failed (key generation, parameters, signing).
    #[error("simulated PKI: {what}: {source}")]
    Generate {
        /// What was being made.
        what: &'static str,
        /// rcgen's reason.
        source: rcgen::Error,
    },
    /// A PEM or DER certificate or key could not be read.
    #[error("simulated PKI: {what}: {reason}")]
    Parse {
        /// What was being read.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
}

fn generate(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Generate { what, source }
}

/// A certificate and its private key, both PEM. Debug shows the certificate only.
#[derive(Clone)]
pub struct CertKey {
    /// Certificate PEM.
    pub cert_pem: String,
    /// Private key PEM (`PRIVATE KEY`, PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for CertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKey")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A certificate authority that can issue leaves. Debug shows the certificate only.
#[derive(Clone)]
pub struct SimCa {
    /// CA certificate PEM.
    pub cert_pem: String,
    key_pem: String,
    issuer: Arc<Issuer<'static, KeyPair>>,
}

impl std::fmt::Debug for SimCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCa")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl SimCa {
    /// A fresh OS CA as `talosctl gen secrets` makes it: Ed25519, O=talos, CA,
    /// KeyUsage DigitalSignature+CertSign, EKU ServerAuth+ClientAuth.
    pub fn new_os_ca() -> Result<Self, PkiError> {
        Self::new_ca("talos")
    }

    /// A fresh self-signed Ed25519 CA with the given Organization (a maintenance-mode node
    /// makes one at every boot).
    pub fn new_ca(org: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(generate("CA key"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(generate("CA parameters"))?;
        params
            .distinguished_name
            .push(DnType::OrganizationName, org);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(generate("self-signed CA"))?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Arc::new(Issuer::new(params, key)),
        })
    }

    /// Loads a CA from PEM (the key may use Talos's `ED25519 PRIVATE KEY` label).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::Parse {
            what: "CA key",
            reason: e.to_string(),
        })?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| PkiError::Parse {
            what: "CA certificate",
            reason: e.to_string(),
        })?;
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer: Arc::new(issuer),
        })
    }

    /// The CA key PEM under the label Talos writes (`ED25519 PRIVATE KEY`).
    pub fn key_pem_talos_label(&self) -> String {
        talos_label(&self.key_pem)
    }

    /// A client certificate: Ed25519, roles as Organization values, the given EKUs.
    pub fn client(
        &self,
        roles: &[&str],
        ekus: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<CertKey, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(generate("client key"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(generate("client parameters"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "talboot-test");
        for role in roles {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *role);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = ekus;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate("client certificate"))?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// An admin client certificate as Talos issues it: O=os:admin, EKU clientAuth only.
    pub fn admin(&self) -> Result<CertKey, PkiError> {
        self.client(&["os:admin"], vec![ExtendedKeyUsagePurpose::ClientAuth])
    }

    /// An apid server certificate: Ed25519, EKU serverAuth, SANs = the given IPs and names.
    pub fn server(&self, ips: &[IpAddr], names: &[&str]) -> Result<CertKey, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(generate("server key"))?;
        let sans: Vec<String> = ips
            .iter()
            .map(ToString::to_string)
            .chain(names.iter().map(|n| (*n).to_owned()))
            .collect();
        let mut params = CertificateParams::new(sans).map_err(generate("server parameters"))?;
        if let Some(name) = names.first() {
            params.distinguished_name.push(DnType::CommonName, *name);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate("server certificate"))?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A fresh self-signed ECDSA P-256 certificate (the kind of client cert a kubeconfig
/// carries: CN=admin, O=system:masters).
pub(crate) fn kube_admin_cert() -> Result<CertKey, PkiError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(generate("P-256 key"))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(generate("admin parameters"))?;
    params.distinguished_name.push(DnType::CommonName, "admin");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params
        .self_signed(&key)
        .map_err(generate("self-signed admin certificate"))?;
    Ok(CertKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Rewrites a PKCS#8 `PRIVATE KEY` PEM under Talos's `ED25519 PRIVATE KEY` label.
pub fn talos_label(pem: &str) -> String {
    pem.replace("BEGIN PRIVATE KEY", "BEGIN ED25519 PRIVATE KEY")
        .replace("END PRIVATE KEY", "END ED25519 PRIVATE KEY")
}

/// Why a client certificate cannot be read, or is not one apid accepts.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertError {
    /// Not a DER X.509 certificate.
    #[error("{0}")]
    Der(#[from] x509_parser::nom::Err<x509_parser::error::X509Error>),
    /// A field of it cannot be decoded.
    #[error("{0}")]
    Field(#[from] x509_parser::error::X509Error),
    /// No ExtKeyUsage extension.
    #[error("client certificate has no ExtKeyUsage")]
    NoExtKeyUsage,
    /// An ExtKeyUsage other than exactly `[ClientAuth]`.
    #[error("client certificate ExtKeyUsage must be exactly [ClientAuth]")]
    NotClientOnly,
}

/// The Subject Organization values of a DER certificate: the Talos roles it carries.
pub(crate) fn organizations(der: &[u8]) -> Result<Vec<String>, CertError> {
    let (_, cert) = X509Certificate::from_der(der)?;
    cert.subject()
        .iter_organization()
        .map(|o| Ok(o.as_str()?.to_owned()))
        .collect()
}

/// apid's `verifyExtKeyUsage`: a client certificate's ExtKeyUsage must be exactly
/// `[ClientAuth]`. Returns why not, if not.
pub(crate) fn check_client_only_eku(der: &[u8]) -> Result<(), CertError> {
    let (_, cert) = X509Certificate::from_der(der)?;
    let eku = cert
        .extended_key_usage()?
        .ok_or(CertError::NoExtKeyUsage)?
        .value;
    let only_client = eku.client_auth
        && !eku.any
        && !eku.server_auth
        && !eku.code_signing
        && !eku.email_protection
        && !eku.time_stamping
        && !eku.ocsp_signing
        && eku.other.is_empty();
    if only_client {
        Ok(())
    } else {
        Err(CertError::NotClientOnly)
    }
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    use super::*;

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    #[test]
    fn admin_carries_its_role_and_only_client_auth() {
        let ca = SimCa::new_os_ca().unwrap();
        let admin = ca.admin().unwrap();
        assert_eq!(organizations(&der(&admin.cert_pem)).unwrap(), ["os:admin"]);
        check_client_only_eku(&der(&admin.cert_pem)).unwrap();
        let both = ca
            .client(
                &["os:reader"],
                vec![
                    ExtendedKeyUsagePurpose::ClientAuth,
                    ExtendedKeyUsagePurpose::ServerAuth,
                ],
            )
            .unwrap();
        assert!(check_client_only_eku(&der(&both.cert_pem)).is_err());
    }

    #[test]
    fn a_ca_reloads_from_talos_labelled_pem_and_keys_stay_out_of_debug() {
        let ca = SimCa::new_os_ca().unwrap();
        let key = ca.key_pem_talos_label();
        assert!(
            key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"),
            "{key}"
        );
        let again = SimCa::from_pem(&ca.cert_pem, &key).unwrap();
        let leaf = again
            .server(&["10.20.0.11".parse().unwrap()], &["n"])
            .unwrap();
        assert!(!format!("{again:?}{leaf:?}").contains("PRIVATE KEY"));
        assert!(matches!(
            SimCa::from_pem(&ca.cert_pem, "not a key"),
            Err(PkiError::Parse { what: "CA key", .. })
        ));
    }
}
