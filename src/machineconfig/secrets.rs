//! The cluster secrets bundle: generate, import and export in the `talosctl gen secrets` layout.
//!
//! The bundle holds every long-lived secret of a cluster: the cluster id/secret (discovery), the
//! kubelet bootstrap token, the etcd-at-rest encryption key, the trustd token, and the four CAs
//! plus the service-account key. Its YAML is the one `talosctl gen secrets` and
//! `talhelper gensecret` write (Talos `secrets.Bundle`, go-yaml with 4-space indentation, every
//! certificate and key stored as base64 of its PEM text), so a bundle can move between those tools
//! and talboot in both directions.
//!
//! Generation follows Talos v1.13: OS CA Ed25519 (O=talos); Kubernetes (O=kubernetes),
//! aggregator (CN=front-proxy) and etcd (O=etcd) CAs ECDSA P-256; all CAs valid 87600 h from
//! the generation time; service-account key RSA-4096 (PKCS#1); keys under Talos's PEM labels.
//!
//! Import validates everything Talos would need later (each PEM parses under a label Talos reads,
//! each CA certificate is a CA and matches its key) and names the offending field in errors.
//! Export writes the decoded values back unchanged, so import followed by export reproduces a
//! `talosctl`-written file byte for byte.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;
use time::OffsetDateTime;

use super::pki::{
    self, CaCertificate, CaSpec, CertificateAuthority, KeyAlgorithm, PemCertAndKey, PkiError,
    PrivateKey,
};

/// Lifetime of every CA Talos generates (`secrets.CAValidityTime`, 87600 h = 10 years).
pub(crate) const CA_VALIDITY: time::Duration = time::Duration::hours(87600);

/// Size in bytes of the random cluster id, cluster secret and secretbox key.
const RANDOM_SECRET_BYTES: usize = 32;

/// Errors from importing, validating or generating a secrets bundle. No message contains a
/// secret value.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The text is not YAML of the expected shape.
    #[error("secrets bundle is not a `talosctl gen secrets` YAML document: {0}")]
    Yaml(String),
    /// A required field is absent or empty.
    #[error("secrets bundle field `{field}` is required but missing or empty")]
    Missing {
        /// Dotted path of the field, e.g. `certs.os.key`.
        field: &'static str,
    },
    /// A field has a value of the wrong form.
    #[error("secrets bundle field `{field}` is invalid: {reason}")]
    Invalid {
        /// Dotted path of the field.
        field: &'static str,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// A certificate or key field does not parse or does not fit its partner.
    #[error("secrets bundle field `{field}` is invalid: {source}")]
    Pki {
        /// Dotted path of the field (`certs.k8s` when crt and key do not belong together).
        field: &'static str,
        /// The underlying problem.
        #[source]
        source: PkiError,
    },
    /// Making new keys or certificates failed.
    #[error("generating the secrets bundle failed at `{field}`: {source}")]
    Generate {
        /// The item being generated.
        field: &'static str,
        /// The underlying problem.
        #[source]
        source: PkiError,
    },
    /// The OS random number generator failed.
    #[error("the operating system's random number generator failed")]
    Random,
}

/// The etcd-at-rest encryption key; exactly one kind is set in a bundle.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum EncryptionSecret {
    /// `secrets.secretboxencryptionsecret` (Talos contracts newer than v1.2): 32 bytes, base64.
    Secretbox(String),
    /// `secrets.aescbcencryptionsecret` (contracts up to v1.2): 16/24/32 bytes, base64.
    AesCbc(String),
}

/// Which service-account key to generate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ServiceAccountKeyKind {
    /// RSA-4096, PKCS#1: what Talos generates for contracts newer than v1.6 (the default).
    #[default]
    Rsa4096,
    /// ECDSA P-256, SEC1: what Talos generated for contracts up to v1.6.
    EcdsaP256,
}

/// Choices for [`SecretsBundle::generate`]. The default matches Talos v1.13.
#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    /// Service-account key type.
    pub(crate) service_account_key: ServiceAccountKeyKind,
}

/// A validated cluster secrets bundle. All certificate and key fields hold PEM text.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretsBundle {
    cluster_id: String,
    cluster_secret: String,
    bootstrap_token: String,
    encryption: EncryptionSecret,
    trustd_token: String,
    etcd: PemCertAndKey,
    k8s: PemCertAndKey,
    k8s_aggregator: PemCertAndKey,
    k8s_service_account_key: String,
    os: PemCertAndKey,
}

impl fmt::Debug for SecretsBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.encryption {
            EncryptionSecret::Secretbox(_) => "secretbox",
            EncryptionSecret::AesCbc(_) => "aescbc",
        };
        f.debug_struct("SecretsBundle")
            .field("cluster", &"<redacted>")
            .field("bootstrap_token", &"<redacted>")
            .field("encryption", &format_args!("{kind} <redacted>"))
            .field("trustd_token", &"<redacted>")
            .field("certs", &"<redacted>")
            .finish()
    }
}

impl SecretsBundle {
    /// Generates a new bundle with Talos v1.13's algorithms and lifetimes. CA validity starts
    /// at `now`. With the default options this takes seconds (RSA-4096 prime search).
    pub fn generate(now: OffsetDateTime, options: &GenerateOptions) -> Result<Self, SecretsError> {
        let rng = SystemRandom::new();
        let ca = |field: &'static str, o: Option<&str>, cn: Option<&str>, alg| {
            pki::generate_ca(&CaSpec {
                organization: o.map(str::to_owned),
                common_name: cn.map(str::to_owned),
                algorithm: alg,
                not_before: now,
                not_after: now + CA_VALIDITY,
            })
            .map_err(|source| SecretsError::Generate { field, source })
        };
        let etcd = ca("certs.etcd", Some("etcd"), None, KeyAlgorithm::EcdsaP256)?;
        let k8s = ca(
            "certs.k8s",
            Some("kubernetes"),
            None,
            KeyAlgorithm::EcdsaP256,
        )?;
        let k8s_aggregator = ca(
            "certs.k8saggregator",
            None,
            Some("front-proxy"),
            KeyAlgorithm::EcdsaP256,
        )?;
        let os = ca("certs.os", Some("talos"), None, KeyAlgorithm::Ed25519)?;

        let sa_field = "certs.k8sserviceaccount.key";
        let k8s_service_account_key = match options.service_account_key {
            ServiceAccountKeyKind::Rsa4096 => {
                tracing::info!("generating the RSA-4096 service-account key (takes a while)");
                pki::generate_rsa_private_key_pem(pki::RSA_SERVICE_ACCOUNT_BITS)
            }
            ServiceAccountKeyKind::EcdsaP256 => {
                PrivateKey::generate(KeyAlgorithm::EcdsaP256).and_then(|k| k.to_talos_pem())
            }
        }
        .map_err(|source| SecretsError::Generate {
            field: sa_field,
            source,
        })?;

        let bundle = Self {
            cluster_id: URL_SAFE.encode(random_bytes(&rng)?),
            cluster_secret: STANDARD.encode(random_bytes(&rng)?),
            bootstrap_token: generate_token(&rng)?,
            encryption: EncryptionSecret::Secretbox(STANDARD.encode(random_bytes(&rng)?)),
            trustd_token: generate_token(&rng)?,
            etcd,
            k8s,
            k8s_aggregator,
            k8s_service_account_key,
            os,
        };
        tracing::info!("generated a new cluster secrets bundle");
        Ok(bundle)
    }

    /// Parses and validates a bundle written by `talosctl gen secrets`, `talhelper gensecret`
    /// or [`SecretsBundle::to_yaml`].
    pub(crate) fn from_yaml(text: &str) -> Result<Self, SecretsError> {
        crate::nesting::check_yaml(text).map_err(|e| SecretsError::Yaml(e.to_string()))?;
        let wire: Wire = yaml_serde::from_str(text).map_err(yaml_error)?;
        let bundle = Self::from_wire(wire)?;
        bundle.validate()?;
        tracing::debug!("imported and validated a cluster secrets bundle");
        Ok(bundle)
    }

    /// Writes the bundle in the exact layout `talosctl gen secrets` uses (go-yaml, 4-space
    /// indentation, Talos's key order, base64 of PEM for certificates and keys).
    pub(crate) fn to_yaml(&self) -> String {
        let mut out = String::new();
        let mut line = |indent: usize, key: &str, value: Option<&str>| {
            out.push_str(&" ".repeat(indent * 4));
            out.push_str(key);
            out.push(':');
            if let Some(v) = value {
                out.push(' ');
                out.push_str(&yaml_scalar(v));
            }
            out.push('\n');
        };
        line(0, "cluster", None);
        line(1, "id", Some(&self.cluster_id));
        line(1, "secret", Some(&self.cluster_secret));
        line(0, "secrets", None);
        line(1, "bootstraptoken", Some(&self.bootstrap_token));
        // Talos's struct order: AESCBC before Secretbox; only the set one is written.
        match &self.encryption {
            EncryptionSecret::AesCbc(v) => line(1, "aescbcencryptionsecret", Some(v)),
            EncryptionSecret::Secretbox(v) => line(1, "secretboxencryptionsecret", Some(v)),
        }
        line(0, "trustdinfo", None);
        line(1, "token", Some(&self.trustd_token));
        line(0, "certs", None);
        for (name, pair) in [
            ("etcd", &self.etcd),
            ("k8s", &self.k8s),
            ("k8saggregator", &self.k8s_aggregator),
        ] {
            line(1, name, None);
            line(2, "crt", Some(&STANDARD.encode(&pair.crt)));
            line(2, "key", Some(&STANDARD.encode(&pair.key)));
        }
        line(1, "k8sserviceaccount", None);
        line(
            2,
            "key",
            Some(&STANDARD.encode(&self.k8s_service_account_key)),
        );
        line(1, "os", None);
        line(2, "crt", Some(&STANDARD.encode(&self.os.crt)));
        line(2, "key", Some(&STANDARD.encode(&self.os.key)));
        out
    }

    /// Checks every field the way import does. Useful after building a bundle by hand.
    pub(crate) fn validate(&self) -> Result<(), SecretsError> {
        require("cluster.id", &self.cluster_id)?;
        require("cluster.secret", &self.cluster_secret)?;
        require("secrets.bootstraptoken", &self.bootstrap_token)?;
        if !is_token(&self.bootstrap_token) {
            return Err(SecretsError::Invalid {
                field: "secrets.bootstraptoken",
                reason: "Kubernetes bootstrap tokens must look like `[a-z0-9]{6}.[a-z0-9]{16}`"
                    .into(),
            });
        }
        match &self.encryption {
            EncryptionSecret::Secretbox(v) => {
                check_key_bytes("secrets.secretboxencryptionsecret", v, &[32])?
            }
            EncryptionSecret::AesCbc(v) => {
                check_key_bytes("secrets.aescbcencryptionsecret", v, &[16, 24, 32])?
            }
        }
        require("trustdinfo.token", &self.trustd_token)?;
        for (field, crt_field, key_field, pair) in [
            ("certs.etcd", "certs.etcd.crt", "certs.etcd.key", &self.etcd),
            ("certs.k8s", "certs.k8s.crt", "certs.k8s.key", &self.k8s),
            (
                "certs.k8saggregator",
                "certs.k8saggregator.crt",
                "certs.k8saggregator.key",
                &self.k8s_aggregator,
            ),
            ("certs.os", "certs.os.crt", "certs.os.key", &self.os),
        ] {
            load_ca(field, crt_field, key_field, pair)?;
        }
        PrivateKey::from_pem(&self.k8s_service_account_key).map_err(|source| {
            SecretsError::Pki {
                field: "certs.k8sserviceaccount.key",
                source,
            }
        })?;
        Ok(())
    }

    fn from_wire(wire: Wire) -> Result<Self, SecretsError> {
        let cluster = wire.cluster.unwrap_or_default();
        let secrets = wire.secrets.unwrap_or_default();
        let trustd = wire.trustdinfo.unwrap_or_default();
        let certs = wire.certs.unwrap_or_default();

        let encryption = match (
            non_empty(secrets.secretboxencryptionsecret),
            non_empty(secrets.aescbcencryptionsecret),
        ) {
            (Some(v), None) => EncryptionSecret::Secretbox(v),
            (None, Some(v)) => EncryptionSecret::AesCbc(v),
            (None, None) => {
                return Err(SecretsError::Missing {
                    field: "secrets.secretboxencryptionsecret",
                });
            }
            (Some(_), Some(_)) => {
                return Err(SecretsError::Invalid {
                    field: "secrets.aescbcencryptionsecret",
                    reason: "only one of secretboxencryptionsecret and aescbcencryptionsecret \
                             may be set; remove aescbcencryptionsecret"
                        .into(),
                });
            }
        };

        Ok(Self {
            cluster_id: required("cluster.id", cluster.id)?,
            cluster_secret: required("cluster.secret", cluster.secret)?,
            bootstrap_token: required("secrets.bootstraptoken", secrets.bootstraptoken)?,
            encryption,
            trustd_token: required("trustdinfo.token", trustd.token)?,
            etcd: wire_pair("certs.etcd.crt", "certs.etcd.key", certs.etcd)?,
            k8s: wire_pair("certs.k8s.crt", "certs.k8s.key", certs.k8s)?,
            k8s_aggregator: wire_pair(
                "certs.k8saggregator.crt",
                "certs.k8saggregator.key",
                certs.k8saggregator,
            )?,
            k8s_service_account_key: decode_pem_field(
                "certs.k8sserviceaccount.key",
                certs.k8sserviceaccount.unwrap_or_default().key,
            )?,
            os: wire_pair("certs.os.crt", "certs.os.key", certs.os)?,
        })
    }

    /// `cluster.id` (discovery cluster id).
    pub(crate) fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// `cluster.secret` (discovery encryption secret).
    pub(crate) fn cluster_secret(&self) -> &str {
        &self.cluster_secret
    }

    /// `secrets.bootstraptoken` (`cluster.token` in the machine config).
    pub(crate) fn bootstrap_token(&self) -> &str {
        &self.bootstrap_token
    }

    /// The etcd-at-rest encryption key.
    pub(crate) fn encryption_secret(&self) -> &EncryptionSecret {
        &self.encryption
    }

    /// `trustdinfo.token` (`machine.token` in the machine config).
    pub(crate) fn trustd_token(&self) -> &str {
        &self.trustd_token
    }

    /// `certs.etcd`: the etcd CA.
    pub(crate) fn etcd_ca(&self) -> &PemCertAndKey {
        &self.etcd
    }

    /// `certs.k8s`: the Kubernetes CA.
    pub fn k8s_ca(&self) -> &PemCertAndKey {
        &self.k8s
    }

    /// `certs.k8saggregator`: the front-proxy CA.
    pub(crate) fn k8s_aggregator_ca(&self) -> &PemCertAndKey {
        &self.k8s_aggregator
    }

    /// `certs.k8sserviceaccount.key`: the service-account signing key (PEM).
    pub(crate) fn k8s_service_account_key(&self) -> &str {
        &self.k8s_service_account_key
    }

    /// `certs.os`: the Talos API CA.
    pub fn os_ca(&self) -> &PemCertAndKey {
        &self.os
    }

    /// The Talos API CA, ready to issue talosconfig client certificates.
    pub(crate) fn os_authority(&self) -> Result<CertificateAuthority, SecretsError> {
        load_ca("certs.os", "certs.os.crt", "certs.os.key", &self.os)
    }

    /// The Kubernetes CA, ready to issue kubeconfig client certificates.
    pub(crate) fn k8s_authority(&self) -> Result<CertificateAuthority, SecretsError> {
        load_ca("certs.k8s", "certs.k8s.crt", "certs.k8s.key", &self.k8s)
    }
}

impl fmt::Debug for EncryptionSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncryptionSecret::Secretbox(_) => f.write_str("Secretbox(<redacted>)"),
            EncryptionSecret::AesCbc(_) => f.write_str("AesCbc(<redacted>)"),
        }
    }
}

fn load_ca(
    field: &'static str,
    crt_field: &'static str,
    key_field: &'static str,
    pair: &PemCertAndKey,
) -> Result<CertificateAuthority, SecretsError> {
    let cert = CaCertificate::from_pem(&pair.crt).map_err(|source| SecretsError::Pki {
        field: crt_field,
        source,
    })?;
    let key = PrivateKey::from_pem(&pair.key).map_err(|source| SecretsError::Pki {
        field: key_field,
        source,
    })?;
    CertificateAuthority::new(cert, key).map_err(|source| SecretsError::Pki { field, source })
}

fn require(field: &'static str, value: &str) -> Result<(), SecretsError> {
    if value.is_empty() {
        Err(SecretsError::Missing { field })
    } else {
        Ok(())
    }
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.is_empty())
}

fn required(field: &'static str, v: Option<String>) -> Result<String, SecretsError> {
    non_empty(v).ok_or(SecretsError::Missing { field })
}

fn check_key_bytes(field: &'static str, value: &str, sizes: &[usize]) -> Result<(), SecretsError> {
    let bytes = STANDARD.decode(value).map_err(|_| SecretsError::Invalid {
        field,
        reason: "not standard base64".into(),
    })?;
    if sizes.contains(&bytes.len()) {
        Ok(())
    } else {
        Err(SecretsError::Invalid {
            field,
            reason: format!(
                "decodes to {} bytes; the key must be {sizes:?} bytes",
                bytes.len()
            ),
        })
    }
}

fn decode_pem_field(field: &'static str, value: Option<String>) -> Result<String, SecretsError> {
    let value = required(field, value)?;
    let bytes = STANDARD
        .decode(value.trim())
        .map_err(|e| SecretsError::Invalid {
            field,
            reason: format!("not standard base64 of a PEM block ({e})"),
        })?;
    String::from_utf8(bytes).map_err(|_| SecretsError::Invalid {
        field,
        reason: "base64 decodes to bytes that are not PEM text".into(),
    })
}

fn wire_pair(
    crt_field: &'static str,
    key_field: &'static str,
    pair: Option<WirePair>,
) -> Result<PemCertAndKey, SecretsError> {
    let pair = pair.unwrap_or_default();
    Ok(PemCertAndKey {
        crt: decode_pem_field(crt_field, pair.crt)?,
        key: decode_pem_field(key_field, pair.key)?,
    })
}

/// Renders a string as a YAML scalar: plain when YAML reads it back as the same string,
/// quoted otherwise (e.g. a token that would read as a number).
fn yaml_scalar(value: &str) -> String {
    match yaml_serde::to_string(value) {
        Ok(s) => s.trim_end_matches('\n').to_owned(),
        // Serializing a plain string cannot fail; single-quote as a safe fallback.
        Err(_) => format!("'{}'", value.replace('\'', "''")),
    }
}

/// yaml_serde messages for type errors quote the offending value, which here may be a secret.
/// Keep messages that only name keys or quote nothing; otherwise keep the key path and location.
fn yaml_error(e: yaml_serde::Error) -> SecretsError {
    let msg = e.to_string();
    // Messages look like `<key path>: <reason> at line L column C`.
    let (path, reason) = match msg.split_once(": ") {
        Some((p, r))
            if !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._[]".contains(c)) =>
        {
            (Some(p), r)
        }
        _ => (None, msg.as_str()),
    };
    let names_only = ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .any(|k| reason.starts_with(k));
    // serde quotes values with `"` (strings) or backticks (numbers, booleans).
    let quotes_nothing = !reason.contains('"') && !reason.contains('`');
    if names_only || quotes_nothing {
        return SecretsError::Yaml(msg);
    }
    let at = e
        .location()
        .map(|l| format!(" at line {} column {}", l.line(), l.column()))
        .unwrap_or_default();
    let what = match path {
        Some(p) => format!("field `{p}` has the wrong kind of value"),
        None => "the document has the wrong structure".to_owned(),
    };
    SecretsError::Yaml(format!(
        "{what}{at} (the value is not shown as it may be secret); expected the \
         `talosctl gen secrets` layout"
    ))
}

fn random_bytes(rng: &SystemRandom) -> Result<[u8; RANDOM_SECRET_BYTES], SecretsError> {
    let mut b = [0u8; RANDOM_SECRET_BYTES];
    rng.fill(&mut b).map_err(|_| SecretsError::Random)?;
    Ok(b)
}

const TOKEN_CHARS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// A kubeadm-style token `[a-z0-9]{6}.[a-z0-9]{16}`, as Talos's `genToken(6, 16)` makes it.
fn generate_token(rng: &SystemRandom) -> Result<String, SecretsError> {
    let part = |len: usize| -> Result<String, SecretsError> {
        let mut out = String::with_capacity(len);
        while out.len() < len {
            let mut buf = [0u8; 32];
            rng.fill(&mut buf).map_err(|_| SecretsError::Random)?;
            // 252 = 7 * 36: discard bytes above it so every character is equally likely.
            for b in buf.iter().filter(|b| **b < 252) {
                if out.len() == len {
                    break;
                }
                out.push(TOKEN_CHARS[usize::from(*b) % TOKEN_CHARS.len()] as char);
            }
        }
        Ok(out)
    };
    Ok(format!("{}.{}", part(6)?, part(16)?))
}

fn is_token(s: &str) -> bool {
    let ok = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    };
    matches!(s.split_once('.'), Some((a, b)) if ok(a, 6) && ok(b, 16))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Wire {
    cluster: Option<WireCluster>,
    secrets: Option<WireSecrets>,
    trustdinfo: Option<WireTrustd>,
    certs: Option<WireCerts>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WireCluster {
    id: Option<String>,
    secret: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WireSecrets {
    bootstraptoken: Option<String>,
    aescbcencryptionsecret: Option<String>,
    secretboxencryptionsecret: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WireTrustd {
    token: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WireCerts {
    etcd: Option<WirePair>,
    k8s: Option<WirePair>,
    k8saggregator: Option<WirePair>,
    k8sserviceaccount: Option<WireKey>,
    os: Option<WirePair>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WirePair {
    crt: Option<String>,
    key: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WireKey {
    key: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machineconfig::testutil::{
        assert_expires_in, cert_text, have_openssl, openssl_bundle_yaml, openssl_ok, shared_bundle,
    };

    fn pem_label(text: &str) -> String {
        pem::parse(text).unwrap().tag().to_owned()
    }

    #[test]
    fn generated_bundle_round_trips_byte_for_byte() {
        let bundle = shared_bundle();
        let yaml = bundle.to_yaml();
        let back = SecretsBundle::from_yaml(&yaml).unwrap();
        assert_eq!(&back, bundle);
        assert_eq!(back.to_yaml(), yaml);
        // The layout is talosctl's: these keys, this order, 4-space indentation.
        let keys: Vec<&str> = yaml.lines().map(|l| l.split(':').next().unwrap()).collect();
        assert_eq!(
            keys,
            [
                "cluster",
                "    id",
                "    secret",
                "secrets",
                "    bootstraptoken",
                "    secretboxencryptionsecret",
                "trustdinfo",
                "    token",
                "certs",
                "    etcd",
                "        crt",
                "        key",
                "    k8s",
                "        crt",
                "        key",
                "    k8saggregator",
                "        crt",
                "        key",
                "    k8sserviceaccount",
                "        key",
                "    os",
                "        crt",
                "        key",
            ]
        );
    }

    #[test]
    fn talosctl_layout_from_another_implementation_round_trips_byte_for_byte() {
        if !have_openssl() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let yaml = openssl_bundle_yaml(dir.path());
        let bundle = SecretsBundle::from_yaml(&yaml).unwrap();
        assert_eq!(bundle.to_yaml(), yaml);
        assert_eq!(pem_label(&bundle.os_ca().key), "ED25519 PRIVATE KEY");
        assert_eq!(pem_label(&bundle.etcd_ca().key), "EC PRIVATE KEY");
        assert_eq!(
            pem_label(bundle.k8s_service_account_key()),
            "RSA PRIVATE KEY"
        );
        assert_eq!(bundle.bootstrap_token(), "q1w2e3.r4t5y6u7i8o9p0as");
        assert_eq!(bundle.trustd_token(), "zx9cv8.bn7m6l5k4j3h2g1f");
    }

    #[test]
    fn generated_values_have_talos_formats() {
        let b = shared_bundle();
        assert!(is_token(b.bootstrap_token()), "{}", b.bootstrap_token());
        assert!(is_token(b.trustd_token()));
        assert_ne!(b.bootstrap_token(), b.trustd_token());
        assert_eq!(URL_SAFE.decode(b.cluster_id()).unwrap().len(), 32);
        assert_eq!(STANDARD.decode(b.cluster_secret()).unwrap().len(), 32);
        let EncryptionSecret::Secretbox(sb) = b.encryption_secret() else {
            panic!("v1.13 bundles use secretbox");
        };
        assert_eq!(STANDARD.decode(sb).unwrap().len(), 32);
        assert_eq!(pem_label(&b.os_ca().key), "ED25519 PRIVATE KEY");
        for ca in [b.etcd_ca(), b.k8s_ca(), b.k8s_aggregator_ca()] {
            assert_eq!(pem_label(&ca.key), "EC PRIVATE KEY");
        }
        assert_eq!(pem_label(b.k8s_service_account_key()), "RSA PRIVATE KEY");
    }

    #[test]
    fn generated_cas_and_sa_key_pass_openssl_checks() {
        if !have_openssl() {
            return;
        }
        let b = shared_bundle();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (name, pair, subject, ed) in [
            ("etcd", b.etcd_ca(), "Subject: O = etcd\n", false),
            ("k8s", b.k8s_ca(), "Subject: O = kubernetes\n", false),
            (
                "agg",
                b.k8s_aggregator_ca(),
                "Subject: CN = front-proxy\n",
                false,
            ),
            ("os", b.os_ca(), "Subject: O = talos\n", true),
        ] {
            let file = format!("{name}.crt");
            let text = cert_text(d, &file, &pair.crt);
            assert!(text.contains(subject), "{name}: {text}");
            if ed {
                assert!(
                    text.contains("Public Key Algorithm: ED25519"),
                    "{name}: {text}"
                );
            } else {
                assert!(
                    text.contains("Public Key Algorithm: id-ecPublicKey")
                        && text.contains("ASN1 OID: prime256v1"),
                    "{name}: {text}"
                );
            }
            assert!(text.contains("CA:TRUE"), "{name}");
            assert!(
                text.contains("Digital Signature, Certificate Sign"),
                "{name}"
            );
            assert!(
                text.contains("TLS Web Server Authentication, TLS Web Client Authentication"),
                "{name}"
            );
            assert_expires_in(d, &file, 87600 * 3600);
            // Self-signed and self-consistent.
            let v = openssl_ok(d, &["verify", "-CAfile", &file, &file]);
            assert!(v.contains(": OK"), "{name}: {v}");
        }
        std::fs::write(d.join("sa.key"), b.k8s_service_account_key()).unwrap();
        let sa = openssl_ok(d, &["rsa", "-in", "sa.key", "-check", "-noout", "-text"]);
        assert!(sa.contains("Private-Key: (4096 bit, 2 primes)"), "{sa}");
        assert!(sa.contains("RSA key ok"), "{sa}");
    }

    #[test]
    fn ecdsa_service_account_option_for_old_contracts() {
        let b = SecretsBundle::generate(
            OffsetDateTime::now_utc(),
            &GenerateOptions {
                service_account_key: ServiceAccountKeyKind::EcdsaP256,
            },
        )
        .unwrap();
        assert_eq!(pem_label(b.k8s_service_account_key()), "EC PRIVATE KEY");
        b.validate().unwrap();
    }

    /// Replaces the value of `field` (a `parent.child[.leaf]` path) in talosctl-layout YAML.
    fn set_field(yaml: &str, path: &str, value: &str) -> String {
        let parts: Vec<&str> = path.split('.').collect();
        let mut depth = 0;
        let mut out = String::new();
        for line in yaml.lines() {
            let indent = (line.len() - line.trim_start().len()) / 4;
            let key = line.trim_start().split(':').next().unwrap();
            let mut line = line.to_owned();
            if indent == depth && depth < parts.len() && key == parts[depth] {
                depth += 1;
                if depth == parts.len() {
                    line = format!("{}{key}: {value}", " ".repeat(indent * 4));
                    depth = usize::MAX / 2;
                }
            }
            out.push_str(&line);
            out.push('\n');
        }
        assert!(depth > parts.len(), "{path} not found");
        out
    }

    fn import_err(yaml: &str) -> SecretsError {
        SecretsBundle::from_yaml(yaml).expect_err("import should fail")
    }

    #[test]
    fn import_errors_name_the_field() {
        let b = shared_bundle();
        let yaml = b.to_yaml();
        let b64 = |s: &str| STANDARD.encode(s);

        // A corrupted key: valid base64 and PEM label, broken DER.
        let broken_key = b64(&b.etcd_ca().key.replacen("MH", "AA", 1));
        let err = import_err(&set_field(&yaml, "certs.etcd.key", &broken_key));
        assert!(err.to_string().contains("`certs.etcd.key`"), "{err}");

        // A corrupted certificate.
        let broken_crt = b64(&b.os_ca().crt.replacen("MII", "AAA", 1));
        let err = import_err(&set_field(&yaml, "certs.os.crt", &broken_crt));
        assert!(err.to_string().contains("`certs.os.crt`"), "{err}");

        // Not base64 at all.
        let err = import_err(&set_field(&yaml, "certs.k8s.crt", "not*base64!"));
        assert!(err.to_string().contains("`certs.k8s.crt`"), "{err}");

        // The wrong key for a certificate.
        let err = import_err(&set_field(&yaml, "certs.k8s.key", &b64(&b.etcd_ca().key)));
        assert!(
            matches!(
                &err,
                SecretsError::Pki {
                    field: "certs.k8s",
                    source: PkiError::KeyMismatch
                }
            ),
            "{err}"
        );

        // A key label Talos does not use.
        let relabeled = b
            .k8s_service_account_key()
            .replace("RSA PRIVATE KEY", "OPENSSH PRIVATE KEY");
        let err = import_err(&set_field(
            &yaml,
            "certs.k8sserviceaccount.key",
            &b64(&relabeled),
        ));
        assert!(
            err.to_string().contains("`certs.k8sserviceaccount.key`"),
            "{err}"
        );
        assert!(err.to_string().contains("OPENSSH PRIVATE KEY"), "{err}");

        // A leaf certificate in a CA slot.
        let leaf = b
            .os_authority()
            .unwrap()
            .issue(&pki::LeafSpec::client(
                None,
                "os:admin",
                OffsetDateTime::now_utc(),
                time::Duration::hours(1),
            ))
            .unwrap();
        let y = set_field(&yaml, "certs.os.crt", &b64(&leaf.crt));
        let y = set_field(&y, "certs.os.key", &b64(&leaf.key));
        let err = import_err(&y);
        assert!(
            matches!(
                &err,
                SecretsError::Pki {
                    field: "certs.os.crt",
                    source: PkiError::NotCa
                }
            ),
            "{err}"
        );

        // Plain fields.
        let err = import_err(&set_field(&yaml, "cluster.id", "''"));
        assert!(
            matches!(
                err,
                SecretsError::Missing {
                    field: "cluster.id"
                }
            ),
            "{err}"
        );
        let err = import_err(&set_field(
            &yaml,
            "secrets.bootstraptoken",
            "ABCDEF.0123456789abcdef",
        ));
        assert!(
            err.to_string().contains("`secrets.bootstraptoken`"),
            "{err}"
        );
        let err = import_err(&set_field(
            &yaml,
            "secrets.secretboxencryptionsecret",
            &STANDARD.encode([1u8; 8]),
        ));
        assert!(
            err.to_string()
                .contains("`secrets.secretboxencryptionsecret`"),
            "{err}"
        );
        let no_trustd = yaml.replace("trustdinfo:\n", "trustdinfo: {}\n");
        let no_trustd: String = no_trustd
            .lines()
            .filter(|l| !l.starts_with("    token:"))
            .map(|l| format!("{l}\n"))
            .collect();
        let err = import_err(&no_trustd);
        assert!(
            matches!(
                err,
                SecretsError::Missing {
                    field: "trustdinfo.token"
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn import_errors_never_echo_secret_values() {
        let b = shared_bundle();
        let yaml = b.to_yaml();
        // A mapping where a string belongs makes the YAML layer fail; its message must not
        // carry the neighbouring secret values.
        let y = set_field(&yaml, "cluster.secret", "{nested: [1]}");
        let err = import_err(&y).to_string();
        assert!(
            err.contains("cluster.secret") && err.contains("line 3"),
            "{err}"
        );
        assert!(!err.contains(b.cluster_id()), "{err}");
        // A secret where a mapping belongs: serde would quote it; we must not.
        let y = yaml.replace(
            "cluster:\n",
            &format!("cluster: {}\nx:\n", b.cluster_secret()),
        );
        let err = import_err(&y).to_string();
        assert!(!err.contains(b.cluster_secret()), "{err}");
        assert!(err.contains("`cluster`") && err.contains("line 1"), "{err}");
        // Numbers are quoted with backticks by serde; also hidden.
        let y = yaml.replace("cluster:\n", "cluster: 987654321\nx:\n");
        let err = import_err(&y).to_string();
        assert!(
            !err.contains("987654321") && err.contains("`cluster`"),
            "{err}"
        );
        // Unknown keys are reported by name (keys are not secret).
        let y = yaml.replace("trustdinfo:\n", "trustdinfo:\n    tokn: abc\n");
        let err = import_err(&y).to_string();
        assert!(err.contains("unknown field `tokn`"), "{err}");
    }

    #[test]
    fn both_encryption_secrets_are_refused_and_aescbc_round_trips() {
        let b = shared_bundle();
        let yaml = b.to_yaml();
        let aes = STANDARD.encode([3u8; 32]);
        let both = yaml.replace(
            "    secretboxencryptionsecret:",
            &format!("    aescbcencryptionsecret: {aes}\n    secretboxencryptionsecret:"),
        );
        let err = import_err(&both);
        assert!(err.to_string().contains("only one of"), "{err}");
        let only_aes: String = both
            .lines()
            .filter(|l| !l.starts_with("    secretboxencryptionsecret:"))
            .map(|l| format!("{l}\n"))
            .collect();
        let back = SecretsBundle::from_yaml(&only_aes).unwrap();
        assert_eq!(back.encryption_secret(), &EncryptionSecret::AesCbc(aes));
        assert_eq!(back.to_yaml(), only_aes);
    }

    #[test]
    fn debug_redacts_every_secret() {
        let b = shared_bundle();
        let dbg = format!("{b:?}");
        let EncryptionSecret::Secretbox(sb) = b.encryption_secret() else {
            unreachable!()
        };
        for secret in [
            b.cluster_id(),
            b.cluster_secret(),
            b.bootstrap_token(),
            b.trustd_token(),
            sb.as_str(),
        ] {
            assert!(!dbg.contains(secret), "{dbg}");
        }
        for key in [&b.os_ca().key, &b.k8s_ca().key, b.k8s_service_account_key()] {
            let body = key.lines().nth(1).unwrap();
            assert!(!dbg.contains(body), "{dbg}");
        }
    }

    #[test]
    fn tokens_are_kubeadm_shaped_and_checked() {
        let rng = SystemRandom::new();
        for _ in 0..50 {
            let t = generate_token(&rng).unwrap();
            assert!(is_token(&t), "{t}");
        }
        for bad in [
            "abcdef0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcdeF",
            "abcdef.0123456789abcdef0",
            "abcdef.0123456789abcde_",
        ] {
            assert!(!is_token(bad), "{bad}");
        }
    }

    #[test]
    fn yaml_scalars_that_would_change_type_are_quoted() {
        // A token of digits only would read back as a number without quotes.
        let s = yaml_scalar("123456.0123456789012345");
        assert_ne!(s, "123456.0123456789012345");
        let v: String = yaml_serde::from_str(&s).unwrap();
        assert_eq!(v, "123456.0123456789012345");
        assert_eq!(
            yaml_scalar("q1w2e3.r4t5y6u7i8o9p0as"),
            "q1w2e3.r4t5y6u7i8o9p0as"
        );
        assert_eq!(yaml_scalar("-abc_DEF="), "-abc_DEF=");
    }
}
