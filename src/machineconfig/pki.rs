//! PKI primitives: private keys in the formats Talos writes, CA loading, and leaf issuance.
//!
//! This module owns the byte-level details that make our keys and certificates interchangeable
//! with the ones `talosctl` makes (siderolabs/crypto):
//! - Ed25519 keys are PKCS#8 v1 DER under the non-standard PEM label `ED25519 PRIVATE KEY`.
//! - ECDSA P-256 keys are SEC1 `ECPrivateKey` DER under `EC PRIVATE KEY`.
//! - RSA keys are PKCS#1 DER under `RSA PRIVATE KEY`.
//! - Generic PKCS#8 `PRIVATE KEY` is accepted on input (Talos accepts it too).
//!
//! Signing goes through rcgen with the ring backend, which only loads PKCS#8, so every key is
//! converted to PKCS#8 for rcgen and back to the Talos label when written out. CA certificates are
//! made the way Talos makes them (random 128-bit serial, KeyUsage CertSign+DigitalSignature,
//! EKU ServerAuth+ClientAuth, CA:TRUE, names as PrintableString like Go's encoder).
//!
//! Everything here is pure apart from drawing randomness from the OS (ring's `SystemRandom`);
//! the current time is always passed in.

use std::fmt;
use std::net::IpAddr;

use p256::pkcs8::der::{Decode, Encode};
use p256::pkcs8::{DecodePrivateKey, EncodePrivateKey, ObjectIdentifier, PrivateKeyInfoRef};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

/// PEM label of X.509 certificates.
pub(crate) const PEM_CERTIFICATE: &str = "CERTIFICATE";
/// PEM label Talos uses for Ed25519 private keys (PKCS#8 DER inside).
pub(crate) const PEM_ED25519_PRIVATE_KEY: &str = "ED25519 PRIVATE KEY";
/// PEM label Talos uses for ECDSA private keys (SEC1 DER inside).
pub(crate) const PEM_EC_PRIVATE_KEY: &str = "EC PRIVATE KEY";
/// PEM label Talos uses for RSA private keys (PKCS#1 DER inside).
pub(crate) const PEM_RSA_PRIVATE_KEY: &str = "RSA PRIVATE KEY";
/// Generic PKCS#8 private key label; accepted on input.
pub(crate) const PEM_PRIVATE_KEY: &str = "PRIVATE KEY";

/// How far back a leaf certificate's `notBefore` is set, so that a node whose clock is a little
/// behind ours still accepts a certificate we have just issued.
pub(crate) const LEAF_BACKDATE: time::Duration = time::Duration::minutes(5);

/// Size of the RSA service-account key Talos generates for contracts newer than v1.6.
pub(crate) const RSA_SERVICE_ACCOUNT_BITS: usize = 4096;

const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// Errors from parsing or producing keys and certificates. Messages never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The text is not a PEM block.
    #[error("not valid PEM text: {0}")]
    Pem(String),
    /// A key PEM block carries a label Talos does not use for private keys.
    #[error(
        "PEM label `{0}` is not a private key label Talos reads; expected one of \
         `ED25519 PRIVATE KEY`, `EC PRIVATE KEY`, `RSA PRIVATE KEY`, `PRIVATE KEY`"
    )]
    UnsupportedKeyLabel(String),
    /// A certificate PEM block carries another label.
    #[error("PEM label `{0}` is not `CERTIFICATE`")]
    NotCertificateLabel(String),
    /// The DER inside a PEM block does not parse as what its label says.
    #[error("{what} does not parse: {reason}")]
    Malformed {
        /// What was being parsed (e.g. "SEC1 EC private key").
        what: &'static str,
        /// The parser's reason (structural, never secret bytes).
        reason: String,
    },
    /// The key uses an algorithm or curve the appliance cannot sign with.
    #[error("unsupported key algorithm: {0} (supported: Ed25519, ECDSA P-256, RSA)")]
    UnsupportedAlgorithm(String),
    /// The certificate is not marked as a CA.
    #[error("certificate is not a CA: basicConstraints CA:TRUE is missing")]
    NotCa,
    /// The private key does not belong to the certificate.
    #[error("the private key does not match the certificate's public key")]
    KeyMismatch,
    /// A self-signed CA certificate's signature does not verify with its own key.
    #[error("the CA certificate's self-signature does not verify")]
    BadSelfSignature,
    /// A subject or SAN value cannot be encoded.
    #[error("invalid {what} `{value}`: {reason}")]
    InvalidName {
        /// Which name (e.g. "DNS SAN").
        what: &'static str,
        /// The offending value (names are not secret).
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The validity window is empty or inverted.
    #[error("invalid validity: notAfter {not_after} is not after notBefore {not_before}")]
    InvalidValidity {
        /// Requested start.
        not_before: OffsetDateTime,
        /// Requested end.
        not_after: OffsetDateTime,
    },
    /// Key generation or signing failed inside the crypto library.
    #[error("crypto operation failed: {0}")]
    Crypto(String),
}

/// Private key algorithms the appliance can load and sign with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyAlgorithm {
    /// Ed25519 (Talos OS CA and talosconfig client certificates).
    Ed25519,
    /// ECDSA on P-256 with SHA-256 (Kubernetes, aggregator and etcd CAs; kubeconfig clients).
    EcdsaP256,
    /// RSA with PKCS#1 v1.5 SHA-256 signatures (service-account key; imported RSA CAs).
    Rsa,
}

impl KeyAlgorithm {
    fn signature_algorithm(self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            KeyAlgorithm::Ed25519 => &rcgen::PKCS_ED25519,
            KeyAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyAlgorithm::Rsa => &rcgen::PKCS_RSA_SHA256,
        }
    }
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyAlgorithm::Ed25519 => "Ed25519",
            KeyAlgorithm::EcdsaP256 => "ECDSA P-256",
            KeyAlgorithm::Rsa => "RSA",
        })
    }
}

/// A certificate and its private key as PEM text (the unit Talos stores as `{crt, key}`).
#[derive(Clone, PartialEq, Eq)]
pub struct PemCertAndKey {
    /// PEM `CERTIFICATE` block.
    pub crt: String,
    /// PEM private key block under a Talos label.
    pub key: String,
}

impl fmt::Debug for PemCertAndKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemCertAndKey")
            .field("crt", &format_args!("<{} bytes of PEM>", self.crt.len()))
            .field("key", &format_args!("<redacted>"))
            .finish()
    }
}

/// A loaded private key: its algorithm and a signer usable by rcgen.
pub(crate) struct PrivateKey {
    algorithm: KeyAlgorithm,
    key_pair: KeyPair,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("algorithm", &self.algorithm)
            .field("key", &format_args!("<redacted>"))
            .finish()
    }
}

impl PrivateKey {
    /// Parses a private key PEM in any of the labels Talos reads (`ED25519 PRIVATE KEY`,
    /// `EC PRIVATE KEY`, `RSA PRIVATE KEY`, `PRIVATE KEY`).
    pub fn from_pem(text: &str) -> Result<Self, PkiError> {
        let block = pem::parse(text).map_err(|e| PkiError::Pem(e.to_string()))?;
        let der = block.contents();
        let (algorithm, pkcs8) = match block.tag() {
            PEM_ED25519_PRIVATE_KEY => {
                let info = parse_pkcs8_info(der)?;
                if info.algorithm.oid != OID_ED25519 {
                    return Err(PkiError::UnsupportedAlgorithm(format!(
                        "`{PEM_ED25519_PRIVATE_KEY}` block holds a key with algorithm OID {}",
                        info.algorithm.oid
                    )));
                }
                (KeyAlgorithm::Ed25519, der.to_vec())
            }
            PEM_EC_PRIVATE_KEY => (KeyAlgorithm::EcdsaP256, sec1_to_pkcs8(der)?),
            PEM_RSA_PRIVATE_KEY => (KeyAlgorithm::Rsa, pkcs1_to_pkcs8(der)?),
            PEM_PRIVATE_KEY => {
                let info = parse_pkcs8_info(der)?;
                if info.algorithm.oid == OID_ED25519 {
                    (KeyAlgorithm::Ed25519, der.to_vec())
                } else if info.algorithm.oid == OID_EC_PUBLIC_KEY {
                    // Re-encode through p256: this rejects other curves and guarantees the
                    // embedded public key that ring insists on.
                    let secret = p256::SecretKey::from_pkcs8_der(der)
                        .map_err(|e| malformed("PKCS#8 EC private key (P-256 only)", e))?;
                    let doc = secret
                        .to_pkcs8_der()
                        .map_err(|e| PkiError::Crypto(e.to_string()))?;
                    (KeyAlgorithm::EcdsaP256, doc.as_bytes().to_vec())
                } else if info.algorithm.oid == OID_RSA_ENCRYPTION {
                    (KeyAlgorithm::Rsa, der.to_vec())
                } else {
                    return Err(PkiError::UnsupportedAlgorithm(format!(
                        "PKCS#8 algorithm OID {}",
                        info.algorithm.oid
                    )));
                }
            }
            other => return Err(PkiError::UnsupportedKeyLabel(other.to_owned())),
        };
        Self::from_pkcs8(algorithm, pkcs8)
    }

    /// Generates a fresh Ed25519 or ECDSA P-256 key (ring cannot generate RSA; see
    /// [`generate_rsa_private_key_pem`]).
    pub fn generate(algorithm: KeyAlgorithm) -> Result<Self, PkiError> {
        if algorithm == KeyAlgorithm::Rsa {
            return Err(PkiError::Crypto(
                "RSA signing keys are not generated here; use ECDSA P-256 or Ed25519".into(),
            ));
        }
        let key_pair = KeyPair::generate_for(algorithm.signature_algorithm())
            .map_err(|e| PkiError::Crypto(e.to_string()))?;
        Ok(Self {
            algorithm,
            key_pair,
        })
    }

    fn from_pkcs8(algorithm: KeyAlgorithm, pkcs8: Vec<u8>) -> Result<Self, PkiError> {
        let key_pair = KeyPair::try_from(pkcs8).map_err(|e| malformed("private key", e))?;
        if key_pair.algorithm() != algorithm.signature_algorithm() {
            return Err(PkiError::UnsupportedAlgorithm(format!(
                "key loads as {:?}, expected {algorithm}",
                key_pair.algorithm()
            )));
        }
        Ok(Self {
            algorithm,
            key_pair,
        })
    }

    #[cfg(test)]
    /// The key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The raw public key (what a certificate's subjectPublicKey BIT STRING holds).
    pub(crate) fn public_key_raw(&self) -> &[u8] {
        self.key_pair.public_key_raw()
    }

    /// Serializes the key as Talos does: Ed25519 as PKCS#8 v1 under `ED25519 PRIVATE KEY`,
    /// ECDSA as SEC1 under `EC PRIVATE KEY`, RSA as PKCS#1 under `RSA PRIVATE KEY`.
    pub(crate) fn to_talos_pem(&self) -> Result<String, PkiError> {
        let pkcs8 = self.key_pair.serialized_der();
        let (label, der) = match self.algorithm {
            KeyAlgorithm::Ed25519 => (PEM_ED25519_PRIVATE_KEY, ed25519_pkcs8_v1(pkcs8)?),
            KeyAlgorithm::EcdsaP256 => {
                let secret = p256::SecretKey::from_pkcs8_der(pkcs8)
                    .map_err(|e| malformed("PKCS#8 EC private key", e))?;
                let sec1 = secret
                    .to_sec1_der()
                    .map_err(|e| PkiError::Crypto(e.to_string()))?;
                (PEM_EC_PRIVATE_KEY, sec1.to_vec())
            }
            KeyAlgorithm::Rsa => {
                let key = <rsa::PrivateKey as DecodePrivateKey>::from_pkcs8_der(pkcs8)
                    .map_err(|e| malformed("PKCS#8 RSA private key", e))?;
                let doc = key
                    .to_pkcs1_der()
                    .map_err(|e| PkiError::Crypto(e.to_string()))?;
                (PEM_RSA_PRIVATE_KEY, doc.as_bytes().to_vec())
            }
        };
        Ok(encode_pem(label, der))
    }
}

/// Generates an RSA private key of `bits` bits and returns it as Talos writes it
/// (PKCS#1 under `RSA PRIVATE KEY`). Used for the Kubernetes service-account key; this is slow
/// (seconds for 4096 bits) because it searches for two large primes.
pub(crate) fn generate_rsa_private_key_pem(bits: usize) -> Result<String, PkiError> {
    let rng = SystemRandom::new();
    let key = rsa::PrivateKey::new(&mut RingRng(&rng), bits)
        .map_err(|e| PkiError::Crypto(format!("RSA key generation: {e}")))?;
    let doc = key
        .to_pkcs1_der()
        .map_err(|e| PkiError::Crypto(e.to_string()))?;
    Ok(encode_pem(PEM_RSA_PRIVATE_KEY, doc.as_bytes().to_vec()))
}

/// Adapts ring's OS random source to the `rand_core` traits the `rsa` crate asks for, so the
/// whole crate draws randomness from one place.
struct RingRng<'a>(&'a SystemRandom);

impl RingRng<'_> {
    fn fill(&self, dst: &mut [u8]) -> Result<(), RngError> {
        self.0.fill(dst).map_err(|_| RngError)
    }
}

/// The OS random source failed.
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random number generator failed")]
struct RngError;

impl rsa::rand_core::TryRng for RingRng<'_> {
    type Error = RngError;

    fn try_next_u32(&mut self) -> Result<u32, RngError> {
        let mut b = [0u8; 4];
        self.fill(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, RngError> {
        let mut b = [0u8; 8];
        self.fill(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), RngError> {
        self.fill(dst)
    }
}

impl rsa::rand_core::TryCryptoRng for RingRng<'_> {}

/// Encodes DER as PEM the way Go's `pem.EncodeToMemory` does: 64-column lines, LF endings.
pub(crate) fn encode_pem(label: &str, der: Vec<u8>) -> String {
    pem::encode_config(
        &pem::Pem::new(label, der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

fn malformed(what: &'static str, e: impl fmt::Display) -> PkiError {
    PkiError::Malformed {
        what,
        reason: e.to_string(),
    }
}

fn parse_pkcs8_info(der: &[u8]) -> Result<PrivateKeyInfoRef<'_>, PkiError> {
    PrivateKeyInfoRef::from_der(der).map_err(|e| malformed("PKCS#8 private key", e))
}

/// SEC1 `ECPrivateKey` (P-256 only) to PKCS#8, which is what ring loads.
fn sec1_to_pkcs8(der: &[u8]) -> Result<Vec<u8>, PkiError> {
    let secret = p256::SecretKey::from_sec1_der(der)
        .map_err(|e| malformed("SEC1 EC private key (P-256 only)", e))?;
    let doc = secret
        .to_pkcs8_der()
        .map_err(|e| PkiError::Crypto(e.to_string()))?;
    Ok(doc.as_bytes().to_vec())
}

/// PKCS#1 `RSAPrivateKey` to PKCS#8.
fn pkcs1_to_pkcs8(der: &[u8]) -> Result<Vec<u8>, PkiError> {
    let key = rsa::PrivateKey::from_pkcs1_der(der).map_err(|e| malformed("PKCS#1 RSA key", e))?;
    let doc = key
        .to_pkcs8_der()
        .map_err(|e| PkiError::Crypto(e.to_string()))?;
    Ok(doc.as_bytes().to_vec())
}

/// ring writes Ed25519 keys as PKCS#8 v2 (with the public key); Go writes v1 (seed only).
/// Re-encode as v1 so our files are byte-for-byte the shape Talos writes.
fn ed25519_pkcs8_v1(pkcs8: &[u8]) -> Result<Vec<u8>, PkiError> {
    let info = parse_pkcs8_info(pkcs8)?;
    let v1 = PrivateKeyInfoRef::new(info.algorithm, info.private_key);
    v1.to_der().map_err(|e| PkiError::Crypto(e.to_string()))
}

/// Builds a distinguished name the way Go's `pkix.Name` encodes one: PrintableString where the
/// value allows it, UTF8String otherwise. Go's verifier matches issuer and subject names byte
/// for byte, so the string type matters.
fn distinguished_name(
    common_name: Option<&str>,
    organizations: &[String],
) -> Result<DistinguishedName, PkiError> {
    fn value(v: &str) -> DnValue {
        match rcgen::string::PrintableString::try_from(v) {
            Ok(p) => DnValue::PrintableString(p),
            Err(_) => DnValue::Utf8String(v.to_owned()),
        }
    }
    let mut dn = DistinguishedName::new();
    // Go writes O before CN; rcgen keeps insertion order.
    match organizations {
        [] => {}
        [one] => dn.push(DnType::OrganizationName, value(one)),
        _ => {
            // rcgen keeps one value per attribute type, and Talos roles are several O values in
            // one certificate; refuse rather than silently drop roles.
            return Err(PkiError::InvalidName {
                what: "subject organization",
                value: organizations.join(","),
                reason: "only one O= value per certificate is supported".into(),
            });
        }
    }
    if let Some(cn) = common_name {
        dn.push(DnType::CommonName, value(cn));
    }
    Ok(dn)
}

fn random_serial() -> Result<SerialNumber, PkiError> {
    // 128 random bits like Go's siderolabs/crypto NewSerialNumber; top bit cleared so the
    // INTEGER stays positive.
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PkiError::Crypto(RngError.to_string()))?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}

/// Certificate timestamps have one-second resolution; drop the fraction so what we asked for
/// is exactly what the certificate says.
fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    t.replace_nanosecond(0).unwrap_or(t)
}

/// What a new self-signed CA looks like.
#[derive(Debug, Clone)]
pub(crate) struct CaSpec {
    /// Subject O= (Talos: `etcd`, `kubernetes`, `talos`).
    pub(crate) organization: Option<String>,
    /// Subject CN= (Talos: `front-proxy` for the aggregator CA).
    pub(crate) common_name: Option<String>,
    /// Key algorithm.
    pub(crate) algorithm: KeyAlgorithm,
    /// Start of validity (Talos: the generation time, not backdated).
    pub(crate) not_before: OffsetDateTime,
    /// End of validity (Talos: `not_before` + 87600 h).
    pub(crate) not_after: OffsetDateTime,
}

/// Generates a self-signed CA certificate and key as Talos makes them; the key is returned in
/// Talos's PEM label for its algorithm.
pub(crate) fn generate_ca(spec: &CaSpec) -> Result<PemCertAndKey, PkiError> {
    let not_before = whole_seconds(spec.not_before);
    let not_after = whole_seconds(spec.not_after);
    if not_after <= not_before {
        return Err(PkiError::InvalidValidity {
            not_before,
            not_after,
        });
    }
    let key = PrivateKey::generate(spec.algorithm)?;
    let organizations: Vec<String> = spec.organization.iter().cloned().collect();
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(spec.common_name.as_deref(), &organizations)?;
    params.serial_number = Some(random_serial()?);
    params.not_before = not_before;
    params.not_after = not_after;
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
        .self_signed(&key.key_pair)
        .map_err(|e| PkiError::Crypto(e.to_string()))?;
    Ok(PemCertAndKey {
        crt: cert.pem(),
        key: key.to_talos_pem()?,
    })
}

/// Extended key usages a leaf certificate may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtKeyUsage {
    /// TLS server (`id-kp-serverAuth`).
    ServerAuth,
    /// TLS client (`id-kp-clientAuth`).
    ClientAuth,
}

/// What a leaf certificate should say.
#[derive(Debug, Clone)]
pub(crate) struct LeafSpec {
    /// Subject CN=, if any.
    pub(crate) common_name: Option<String>,
    /// Subject O= (Talos and Kubernetes read roles/groups from it). At most one value.
    pub(crate) organizations: Vec<String>,
    /// DNS subjectAltNames.
    pub(crate) dns_names: Vec<String>,
    /// IP subjectAltNames.
    pub(crate) ip_addresses: Vec<IpAddr>,
    /// Extended key usages; Talos requires exactly `[ClientAuth]` on API client certificates.
    pub(crate) usages: Vec<ExtKeyUsage>,
    /// Key algorithm of the new key; `None` means the CA's family, as siderolabs/crypto picks it
    /// (an RSA CA gets ECDSA P-256 leaves, since ring cannot generate RSA keys).
    pub(crate) key_algorithm: Option<KeyAlgorithm>,
    /// Start of validity.
    pub(crate) not_before: OffsetDateTime,
    /// End of validity.
    pub(crate) not_after: OffsetDateTime,
}

impl LeafSpec {
    /// A client certificate valid from `now - LEAF_BACKDATE` to `now + ttl`, EKU clientAuth only.
    pub fn client(
        common_name: Option<&str>,
        organization: &str,
        now: OffsetDateTime,
        ttl: time::Duration,
    ) -> Self {
        Self {
            common_name: common_name.map(str::to_owned),
            organizations: vec![organization.to_owned()],
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            usages: vec![ExtKeyUsage::ClientAuth],
            key_algorithm: None,
            not_before: now - LEAF_BACKDATE,
            not_after: now + ttl,
        }
    }
}

/// A CA certificate parsed from PEM, with the facts import validation needs.
pub(crate) struct CaCertificate {
    pem: String,
    der: Vec<u8>,
    public_key_raw: Vec<u8>,
    not_after: OffsetDateTime,
}

impl fmt::Debug for CaCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaCertificate")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CaCertificate {
    /// Parses a PEM `CERTIFICATE` block and checks that it is a CA (basicConstraints CA:TRUE).
    pub fn from_pem(text: &str) -> Result<Self, PkiError> {
        let block = pem::parse(text).map_err(|e| PkiError::Pem(e.to_string()))?;
        if block.tag() != PEM_CERTIFICATE {
            return Err(PkiError::NotCertificateLabel(block.tag().to_owned()));
        }
        let der = block.into_contents();
        let (public_key_raw, not_after) = {
            let (_, cert) =
                X509Certificate::from_der(&der).map_err(|e| malformed("X.509 certificate", e))?;
            let ca = cert
                .basic_constraints()
                .map_err(|e| malformed("basicConstraints extension", e))?
                .is_some_and(|bc| bc.value.ca);
            if !ca {
                return Err(PkiError::NotCa);
            }
            (
                cert.public_key().subject_public_key.data.to_vec(),
                cert.validity().not_after.to_datetime(),
            )
        };
        Ok(Self {
            pem: text.to_owned(),
            der,
            public_key_raw,
            not_after,
        })
    }

    /// The PEM text as given.
    pub(crate) fn pem(&self) -> &str {
        &self.pem
    }
}

/// A CA that can issue leaf certificates: its certificate plus the matching private key.
pub(crate) struct CertificateAuthority {
    cert: CaCertificate,
    algorithm: KeyAlgorithm,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("algorithm", &self.algorithm)
            .field("not_after", &self.cert.not_after)
            .field("key", &format_args!("<redacted>"))
            .finish()
    }
}

impl CertificateAuthority {
    /// Pairs a CA certificate with its key, checking that the key is the certificate's key and,
    /// for a self-signed CA, that the self-signature verifies.
    pub fn new(cert: CaCertificate, key: PrivateKey) -> Result<Self, PkiError> {
        if cert.public_key_raw != key.public_key_raw() {
            return Err(PkiError::KeyMismatch);
        }
        {
            let (_, parsed) = X509Certificate::from_der(&cert.der)
                .map_err(|e| malformed("X.509 certificate", e))?;
            if parsed.subject().as_raw() == parsed.issuer().as_raw() {
                parsed
                    .verify_signature(None)
                    .map_err(|_| PkiError::BadSelfSignature)?;
            }
        }
        let algorithm = key.algorithm;
        // Issuer::from_ca_cert_der keeps the subject's string types and the SKI, so leaves name
        // their issuer byte-for-byte like the CA names itself and carry a matching AKI.
        let issuer = Issuer::from_ca_cert_der(&cert.der.as_slice().into(), key.key_pair)
            .map_err(|e| malformed("CA certificate for signing", e))?;
        Ok(Self {
            cert,
            algorithm,
            issuer,
        })
    }

    #[cfg(test)]
    /// Loads a CA from PEM certificate and key text (any Talos key label).
    pub fn from_pem(crt: &str, key: &str) -> Result<Self, PkiError> {
        Self::new(CaCertificate::from_pem(crt)?, PrivateKey::from_pem(key)?)
    }

    /// The CA certificate PEM.
    pub fn cert_pem(&self) -> &str {
        self.cert.pem()
    }

    #[cfg(test)]
    /// The CA key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// Issues a leaf certificate with a fresh key. The key is returned under its Talos label.
    pub fn issue(&self, spec: &LeafSpec) -> Result<PemCertAndKey, PkiError> {
        let not_before = whole_seconds(spec.not_before);
        let not_after = whole_seconds(spec.not_after);
        if not_after <= not_before {
            return Err(PkiError::InvalidValidity {
                not_before,
                not_after,
            });
        }
        let algorithm = spec.key_algorithm.unwrap_or(match self.algorithm {
            KeyAlgorithm::Rsa => KeyAlgorithm::EcdsaP256,
            other => other,
        });
        let key = PrivateKey::generate(algorithm)?;

        let mut params = CertificateParams::default();
        params.distinguished_name =
            distinguished_name(spec.common_name.as_deref(), &spec.organizations)?;
        params.serial_number = Some(random_serial()?);
        params.not_before = not_before;
        params.not_after = not_after;
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = spec
            .usages
            .iter()
            .map(|u| match u {
                ExtKeyUsage::ServerAuth => ExtendedKeyUsagePurpose::ServerAuth,
                ExtKeyUsage::ClientAuth => ExtendedKeyUsagePurpose::ClientAuth,
            })
            .collect();
        params.use_authority_key_identifier_extension = true;
        for name in &spec.dns_names {
            let ia5 =
                name.as_str()
                    .try_into()
                    .map_err(|e: rcgen::Error| PkiError::InvalidName {
                        what: "DNS subjectAltName",
                        value: name.clone(),
                        reason: e.to_string(),
                    })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params
            .subject_alt_names
            .extend(spec.ip_addresses.iter().map(|ip| SanType::IpAddress(*ip)));

        let cert = params
            .signed_by(&key.key_pair, &self.issuer)
            .map_err(|e| PkiError::Crypto(e.to_string()))?;
        Ok(PemCertAndKey {
            crt: cert.pem(),
            key: key.to_talos_pem()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::machineconfig::testutil::{
        assert_expires_in, cert_text, have_openssl, openssl_ca, openssl_ok,
    };

    fn der_of(pem_text: &str) -> (String, Vec<u8>) {
        let p = pem::parse(pem_text).unwrap();
        (p.tag().to_owned(), p.into_contents())
    }

    #[test]
    fn ed25519_key_is_written_like_talos_as_pkcs8_v1() {
        let key = PrivateKey::generate(KeyAlgorithm::Ed25519).unwrap();
        let text = key.to_talos_pem().unwrap();
        let (label, der) = der_of(&text);
        assert_eq!(label, "ED25519 PRIVATE KEY");
        // Go's MarshalPKCS8PrivateKey for Ed25519: 16-byte v1 header + 32-byte seed.
        assert_eq!(der.len(), 48);
        assert_eq!(
            der[..16],
            [
                0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
                0x04, 0x20
            ]
        );
        assert!(text.ends_with("-----END ED25519 PRIVATE KEY-----\n"));
        let back = PrivateKey::from_pem(&text).unwrap();
        assert_eq!(back.algorithm(), KeyAlgorithm::Ed25519);
        assert_eq!(back.public_key_raw(), key.public_key_raw());
        assert_eq!(back.to_talos_pem().unwrap(), text);
    }

    #[test]
    fn ecdsa_key_is_written_as_sec1_that_openssl_reads() {
        let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
        let text = key.to_talos_pem().unwrap();
        assert_eq!(der_of(&text).0, "EC PRIVATE KEY");
        let back = PrivateKey::from_pem(&text).unwrap();
        assert_eq!(back.public_key_raw(), key.public_key_raw());
        assert_eq!(back.to_talos_pem().unwrap(), text);
        if !have_openssl() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k.pem"), &text).unwrap();
        let out = openssl_ok(
            dir.path(),
            &["ec", "-in", "k.pem", "-check", "-noout", "-text"],
        );
        assert!(out.contains("ASN1 OID: prime256v1"), "{out}");
        assert!(out.contains("EC Key valid"), "{out}");
    }

    #[test]
    fn keys_made_by_openssl_load_under_every_talos_label() {
        if !have_openssl() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        openssl_ok(
            d,
            &[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                "ec.pem",
            ],
        );
        openssl_ok(d, &["genpkey", "-algorithm", "ed25519", "-out", "ed.pem"]);
        openssl_ok(
            d,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                "ec8.pem",
            ],
        );
        openssl_ok(d, &["genrsa", "-traditional", "-out", "rsa1.pem", "2048"]);
        openssl_ok(
            d,
            &[
                "pkcs8", "-topk8", "-nocrypt", "-in", "rsa1.pem", "-out", "rsa8.pem",
            ],
        );
        let ed = std::fs::read_to_string(d.join("ed.pem")).unwrap();
        let ed_talos = ed.replace("PRIVATE KEY", "ED25519 PRIVATE KEY");
        std::fs::write(d.join("ed_talos.pem"), &ed_talos).unwrap();
        for (file, label, alg) in [
            ("ec.pem", "EC PRIVATE KEY", KeyAlgorithm::EcdsaP256),
            ("ec8.pem", "PRIVATE KEY", KeyAlgorithm::EcdsaP256),
            ("ed.pem", "PRIVATE KEY", KeyAlgorithm::Ed25519),
            ("ed_talos.pem", "ED25519 PRIVATE KEY", KeyAlgorithm::Ed25519),
            ("rsa1.pem", "RSA PRIVATE KEY", KeyAlgorithm::Rsa),
            ("rsa8.pem", "PRIVATE KEY", KeyAlgorithm::Rsa),
        ] {
            let text = std::fs::read_to_string(d.join(file)).unwrap();
            assert_eq!(der_of(&text).0, label, "{file}");
            let key = PrivateKey::from_pem(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(key.algorithm(), alg, "{file}");
            // openssl's view of the public key must end with the raw key we derived.
            let spki = Command::new("openssl")
                .args(["pkey", "-pubout", "-outform", "DER", "-in"])
                .arg(if file == "ed_talos.pem" {
                    "ed.pem"
                } else {
                    file
                })
                .current_dir(d)
                .output()
                .unwrap();
            assert!(spki.status.success(), "{file}");
            assert!(
                spki.stdout.ends_with(key.public_key_raw()),
                "{file}: public key differs"
            );
            // Re-export uses Talos's label for the algorithm.
            let talos = key.to_talos_pem().unwrap();
            let want = match alg {
                KeyAlgorithm::Ed25519 => "ED25519 PRIVATE KEY",
                KeyAlgorithm::EcdsaP256 => "EC PRIVATE KEY",
                KeyAlgorithm::Rsa => "RSA PRIVATE KEY",
            };
            assert_eq!(der_of(&talos).0, want, "{file}");
        }
        // Go and openssl write the same SEC1 and PKCS#8 v1 shapes, so converting back yields
        // the very bytes openssl wrote.
        let ec = std::fs::read_to_string(d.join("ec.pem")).unwrap();
        assert_eq!(
            PrivateKey::from_pem(&ec).unwrap().to_talos_pem().unwrap(),
            ec
        );
        assert_eq!(
            PrivateKey::from_pem(&ed_talos)
                .unwrap()
                .to_talos_pem()
                .unwrap(),
            ed_talos
        );
    }

    #[test]
    fn bad_keys_are_rejected_with_reasons() {
        let cert_label = encode_pem("CERTIFICATE", vec![1, 2, 3]);
        assert!(matches!(
            PrivateKey::from_pem(&cert_label),
            Err(PkiError::UnsupportedKeyLabel(l)) if l == "CERTIFICATE"
        ));
        let garbage = encode_pem(PEM_EC_PRIVATE_KEY, vec![0x30, 0x03, 0x02, 0x01, 0x01]);
        let err = PrivateKey::from_pem(&garbage).unwrap_err();
        assert!(matches!(err, PkiError::Malformed { .. }), "{err}");
        assert!(matches!(
            PrivateKey::from_pem("not pem"),
            Err(PkiError::Pem(_))
        ));
        // An Ed25519 key under the EC label is not SEC1.
        let ed = PrivateKey::generate(KeyAlgorithm::Ed25519)
            .unwrap()
            .to_talos_pem()
            .unwrap();
        let relabeled = ed.replace("ED25519 PRIVATE KEY", "EC PRIVATE KEY");
        assert!(PrivateKey::from_pem(&relabeled).is_err());
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[test]
    fn generated_ca_and_server_leaf_pass_openssl_checks() {
        let start = now();
        let ca = generate_ca(&CaSpec {
            organization: Some("kubernetes".into()),
            common_name: None,
            algorithm: KeyAlgorithm::EcdsaP256,
            not_before: start,
            not_after: start + time::Duration::hours(87600),
        })
        .unwrap();
        let authority = CertificateAuthority::from_pem(&ca.crt, &ca.key).unwrap();
        assert_eq!(authority.algorithm(), KeyAlgorithm::EcdsaP256);
        let leaf = authority
            .issue(&LeafSpec {
                common_name: Some("node-1".into()),
                organizations: vec![],
                dns_names: vec!["node-1.example.test".into()],
                ip_addresses: vec!["10.5.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
                usages: vec![ExtKeyUsage::ServerAuth],
                key_algorithm: None,
                not_before: start - LEAF_BACKDATE,
                not_after: start + time::Duration::hours(24),
            })
            .unwrap();
        // Go verifies chains by comparing issuer and subject bytes; check that directly.
        let (_, ca_der) = der_of(&ca.crt);
        let (_, leaf_der) = der_of(&leaf.crt);
        let (_, ca_x) = X509Certificate::from_der(&ca_der).unwrap();
        let (_, leaf_x) = X509Certificate::from_der(&leaf_der).unwrap();
        assert_eq!(leaf_x.issuer().as_raw(), ca_x.subject().as_raw());
        assert_eq!(
            leaf_x.validity().not_before.to_datetime(),
            whole_seconds(start - LEAF_BACKDATE)
        );

        if !have_openssl() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca_text = cert_text(d, "ca.crt", &ca.crt);
        assert!(ca_text.contains("Subject: O = kubernetes"), "{ca_text}");
        assert!(ca_text.contains("id-ecPublicKey") && ca_text.contains("prime256v1"));
        assert!(ca_text.contains("Signature Algorithm: ecdsa-with-SHA256"));
        assert!(ca_text.contains("CA:TRUE"));
        assert!(ca_text.contains("Digital Signature, Certificate Sign"));
        assert!(ca_text.contains("TLS Web Server Authentication, TLS Web Client Authentication"));
        assert_expires_in(d, "ca.crt", 87600 * 3600);

        let text = cert_text(d, "leaf.crt", &leaf.crt);
        assert!(text.contains("Subject: CN = node-1"), "{text}");
        assert!(text.contains("DNS:node-1.example.test"), "{text}");
        assert!(text.contains("IP Address:10.5.0.2"), "{text}");
        assert!(text.contains("IP Address:FD00:0:0:0:0:0:0:2"), "{text}");
        assert!(text.contains("TLS Web Server Authentication"));
        assert!(!text.contains("TLS Web Client Authentication"));
        assert!(!text.contains("CA:TRUE"));
        assert_expires_in(d, "leaf.crt", 24 * 3600);
        let v = openssl_ok(
            d,
            &[
                "verify",
                "-CAfile",
                "ca.crt",
                "-purpose",
                "sslserver",
                "leaf.crt",
            ],
        );
        assert!(v.contains("leaf.crt: OK"), "{v}");
    }

    #[test]
    fn cas_made_by_openssl_issue_leaves_that_chain() {
        if !have_openssl() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // openssl names subjects with UTF8String and sets an SKI; an RSA CA tests the path where
        // the leaf key falls back to ECDSA P-256.
        openssl_ca(d, "ed", &["genpkey", "-algorithm", "ed25519"], "O = talos");
        openssl_ca(
            d,
            "ec",
            &["ecparam", "-name", "prime256v1", "-genkey", "-noout"],
            "O = kubernetes",
        );
        openssl_ca(
            d,
            "rsa",
            &["genrsa", "-traditional", "2048"],
            "CN = legacy-ca",
        );
        for (name, leaf_alg) in [
            ("ed", KeyAlgorithm::Ed25519),
            ("ec", KeyAlgorithm::EcdsaP256),
            ("rsa", KeyAlgorithm::EcdsaP256),
        ] {
            let crt = std::fs::read_to_string(d.join(format!("{name}.crt"))).unwrap();
            let key = std::fs::read_to_string(d.join(format!("{name}.key"))).unwrap();
            let ca = CertificateAuthority::from_pem(&crt, &key)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let leaf = ca
                .issue(&LeafSpec::client(
                    Some("admin"),
                    "os:admin",
                    now(),
                    time::Duration::hours(1),
                ))
                .unwrap();
            assert_eq!(
                PrivateKey::from_pem(&leaf.key).unwrap().algorithm(),
                leaf_alg,
                "{name}"
            );
            let leaf_file = format!("{name}-leaf.crt");
            std::fs::write(d.join(&leaf_file), &leaf.crt).unwrap();
            let ca_file = format!("{name}.crt");
            let v = openssl_ok(
                d,
                &[
                    "verify",
                    "-CAfile",
                    &ca_file,
                    "-purpose",
                    "sslclient",
                    &leaf_file,
                ],
            );
            assert!(v.contains(": OK"), "{name}: {v}");
        }
    }

    #[test]
    fn ca_import_rejects_mismatched_and_non_ca_inputs() {
        let t = now();
        let spec = |alg| CaSpec {
            organization: Some("etcd".into()),
            common_name: None,
            algorithm: alg,
            not_before: t,
            not_after: t + time::Duration::days(1),
        };
        let a = generate_ca(&spec(KeyAlgorithm::EcdsaP256)).unwrap();
        let b = generate_ca(&spec(KeyAlgorithm::EcdsaP256)).unwrap();
        assert!(matches!(
            CertificateAuthority::from_pem(&a.crt, &b.key),
            Err(PkiError::KeyMismatch)
        ));
        let ca = CertificateAuthority::from_pem(&a.crt, &a.key).unwrap();
        let leaf = ca
            .issue(&LeafSpec::client(None, "x", t, time::Duration::hours(1)))
            .unwrap();
        assert!(matches!(
            CaCertificate::from_pem(&leaf.crt),
            Err(PkiError::NotCa)
        ));
        assert!(matches!(
            CaCertificate::from_pem(&a.key),
            Err(PkiError::NotCertificateLabel(_))
        ));
        // An inverted validity window is refused instead of producing a useless certificate.
        assert!(matches!(
            ca.issue(&LeafSpec::client(None, "x", t, time::Duration::hours(-1))),
            Err(PkiError::InvalidValidity { .. })
        ));
    }

    #[test]
    fn debug_output_redacts_keys() {
        let ca = generate_ca(&CaSpec {
            organization: Some("talos".into()),
            common_name: None,
            algorithm: KeyAlgorithm::Ed25519,
            not_before: now(),
            not_after: now() + time::Duration::days(1),
        })
        .unwrap();
        let body: String = ca.key.lines().filter(|l| !l.starts_with("-----")).collect();
        let dbg = format!("{ca:?}");
        assert!(!dbg.contains(&body) && dbg.contains("redacted"), "{dbg}");
        let authority = CertificateAuthority::from_pem(&ca.crt, &ca.key).unwrap();
        assert!(!format!("{authority:?}").contains(&body));
        let key = PrivateKey::from_pem(&ca.key).unwrap();
        assert!(!format!("{key:?}").contains(&body));
    }
}
