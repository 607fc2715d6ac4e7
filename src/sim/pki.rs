//! Test PKI for the Talos double and its tests: an Ed25519 OS CA like the one in a Talos
//! secrets bundle (O=talos), and leaves signed by it (apid server certs, client certs whose
//! Organization carries the Talos roles). Built directly on rcgen; reading certificates back
//! (roles, EKU) uses x509-parser, as apid does with Go's x509.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ED25519,
};
use x509_parser::prelude::{FromDer, X509Certificate};

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertKey {
    /// Certificate PEM.
    pub cert_pem: String,
    /// Private key PEM (`PRIVATE KEY`, PKCS#8).
    pub key_pem: String,
}

/// A certificate authority that can issue leaves.
#[derive(Clone)]
pub struct TestCa {
    /// CA certificate PEM.
    pub cert_pem: String,
    key_pem: String,
    issuer: Arc<Issuer<'static, KeyPair>>,
}

impl TestCa {
    /// A fresh OS CA as `talosctl gen secrets` makes it: Ed25519, O=talos, CA,
    /// KeyUsage DigitalSignature+CertSign, EKU ServerAuth+ClientAuth.
    pub fn new_os_ca() -> Self {
        Self::new_ca("talos")
    }

    /// A fresh self-signed Ed25519 CA with the given Organization (a maintenance-mode node
    /// makes one at every boot).
    pub fn new_ca(org: &str) -> Self {
        let key = KeyPair::generate_for(&PKCS_ED25519).expect("generate CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
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
        let cert = params.self_signed(&key).expect("self-sign CA");
        let key_pem = key.serialize_pem();
        Self {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Arc::new(Issuer::new(params, key)),
        }
    }

    /// Loads a CA from PEM (the key may use Talos's `ED25519 PRIVATE KEY` label).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, String> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("CA key: {e}"))?;
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| format!("CA certificate: {e}"))?;
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
    pub fn client(&self, roles: &[&str], ekus: Vec<ExtendedKeyUsagePurpose>) -> CertKey {
        let key = KeyPair::generate_for(&PKCS_ED25519).expect("generate client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
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
        let cert = params.signed_by(&key, &self.issuer).expect("sign client");
        CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// An admin client certificate as Talos issues it: O=os:admin, EKU clientAuth only.
    pub fn admin(&self) -> CertKey {
        self.client(&["os:admin"], vec![ExtendedKeyUsagePurpose::ClientAuth])
    }

    /// An apid server certificate: Ed25519, EKU serverAuth, SANs = the given IPs and names.
    pub fn server(&self, ips: &[IpAddr], names: &[&str]) -> CertKey {
        let key = KeyPair::generate_for(&PKCS_ED25519).expect("generate server key");
        let sans: Vec<String> = ips
            .iter()
            .map(ToString::to_string)
            .chain(names.iter().map(|n| (*n).to_owned()))
            .collect();
        let mut params = CertificateParams::new(sans).expect("server params");
        if let Some(name) = names.first() {
            params.distinguished_name.push(DnType::CommonName, *name);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("sign server");
        CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A fresh self-signed ECDSA P-256 certificate (the kind of client cert a kubeconfig
/// carries: CN=admin, O=system:masters).
pub fn kube_admin_cert() -> CertKey {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("generate P-256 key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, "admin");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.self_signed(&key).expect("self-sign");
    CertKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// Rewrites a PKCS#8 `PRIVATE KEY` PEM under Talos's `ED25519 PRIVATE KEY` label.
pub fn talos_label(pem: &str) -> String {
    pem.replace("BEGIN PRIVATE KEY", "BEGIN ED25519 PRIVATE KEY")
        .replace("END PRIVATE KEY", "END ED25519 PRIVATE KEY")
}

/// The Subject Organization values of a DER certificate: the Talos roles it carries.
pub fn organizations(der: &[u8]) -> Result<Vec<String>, String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| e.to_string())?;
    cert.subject()
        .iter_organization()
        .map(|o| o.as_str().map(str::to_owned).map_err(|e| e.to_string()))
        .collect()
}

/// apid's `verifyExtKeyUsage`: a client certificate's ExtKeyUsage must be exactly
/// `[ClientAuth]`. Returns why not, if not.
pub fn check_client_only_eku(der: &[u8]) -> Result<(), String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| e.to_string())?;
    let eku = cert
        .extended_key_usage()
        .map_err(|e| e.to_string())?
        .ok_or("client certificate has no ExtKeyUsage")?
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
        Err("client certificate ExtKeyUsage must be exactly [ClientAuth]".into())
    }
}
