//! TLS pieces of the Talos client: the "accept any server certificate" verifier for
//! maintenance mode, and reading the admin credentials (PEM) the way Talos writes them.
//!
//! A node in maintenance mode serves TLS with a certificate from a throwaway CA generated at
//! boot, so there is nothing to verify it against; `talosctl --insecure` skips verification
//! and sends no client certificate, and so do we. Handshake signatures are still checked
//! (with the ring provider), so the session is at least bound to the key the server showed.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::error::TalosError;

/// Server certificate verifier for maintenance mode: any certificate is accepted, the
/// handshake signature is verified.
#[derive(Debug)]
pub struct MaintenanceVerifier {
    algorithms: WebPkiSupportedAlgorithms,
}

impl MaintenanceVerifier {
    /// A verifier using the ring provider's signature algorithms.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            algorithms: ring_provider().signature_verification_algorithms,
        })
    }
}

/// The crypto provider talboot uses everywhere (ring; never aws-lc).
pub fn ring_provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

impl ServerCertVerifier for MaintenanceVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Talos writes Ed25519 keys as PKCS#8 under the non-standard PEM label
/// `ED25519 PRIVATE KEY` (siderolabs/crypto); rustls only reads `PRIVATE KEY`,
/// `EC PRIVATE KEY` and `RSA PRIVATE KEY`. The body is plain PKCS#8, so relabelling is all
/// it takes. Other labels pass through unchanged.
pub(crate) fn normalize_key_pem(pem: &[u8]) -> Vec<u8> {
    const TALOS_BEGIN: &[u8] = b"-----BEGIN ED25519 PRIVATE KEY-----";
    const TALOS_END: &[u8] = b"-----END ED25519 PRIVATE KEY-----";
    let replaced = replace_all(pem, TALOS_BEGIN, b"-----BEGIN PRIVATE KEY-----");
    replace_all(&replaced, TALOS_END, b"-----END PRIVATE KEY-----")
}

fn replace_all(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(pos) = rest.windows(from.len()).position(|w| w == from) {
        out.extend_from_slice(&rest[..pos]);
        out.extend_from_slice(to);
        rest = &rest[pos + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Checks that `pem` holds at least one certificate; `what` names it in the error.
pub(crate) fn check_cert_pem(what: &'static str, pem: &[u8]) -> Result<(), TalosError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TalosError::Credentials {
            what,
            reason: format!("not valid PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TalosError::Credentials {
            what,
            reason: "no `BEGIN CERTIFICATE` block found".into(),
        });
    }
    Ok(())
}

/// Checks that `pem` (already normalised) holds a private key rustls can use. The error
/// names the problem, never the key.
pub(crate) fn check_key_pem(pem: &[u8]) -> Result<(), TalosError> {
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|_| TalosError::Credentials {
        what: "client key",
        reason: "no PKCS#8, SEC1 (EC) or PKCS#1 (RSA) private key in PEM form found".into(),
    })?;
    // The PEM layer only base64-decodes; loading the key through the provider is what proves
    // the DER is a usable Ed25519/ECDSA/RSA key.
    ring_provider()
        .key_provider
        .load_private_key(key)
        .map(|_| ())
        .map_err(|_| TalosError::Credentials {
            what: "client key",
            reason: "the PEM block is not a valid Ed25519, ECDSA or RSA private key".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    // A throwaway Ed25519 PKCS#8 key (`openssl genpkey -algorithm ed25519`; protects nothing).
    const PKCS8_BODY: &str = "MC4CAQAwBQYDK2VwBCIEIK9dx2V+n3ZbZ/tWaSD19UOACQOZYGMA0Q5BYj+gYECw";

    #[test]
    fn talos_ed25519_label_is_rewritten_to_pkcs8() {
        let talos = format!(
            "-----BEGIN ED25519 PRIVATE KEY-----\n{PKCS8_BODY}\n-----END ED25519 PRIVATE KEY-----\n"
        );
        let norm = normalize_key_pem(talos.as_bytes());
        assert_eq!(
            String::from_utf8(norm.clone()).unwrap(),
            format!("-----BEGIN PRIVATE KEY-----\n{PKCS8_BODY}\n-----END PRIVATE KEY-----\n")
        );
        check_key_pem(&norm).unwrap();
        // Without the rewrite rustls finds no key: the normalisation is what makes it work.
        assert!(check_key_pem(talos.as_bytes()).is_err());
    }

    #[test]
    fn other_labels_pass_through() {
        let std = format!("-----BEGIN PRIVATE KEY-----\n{PKCS8_BODY}\n-----END PRIVATE KEY-----\n");
        assert_eq!(normalize_key_pem(std.as_bytes()), std.as_bytes());
    }

    #[test]
    fn credential_errors_never_echo_the_key() {
        let junk =
            b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0LXNlY3JldA==\n-----END PRIVATE KEY-----\n";
        let err = check_key_pem(junk).unwrap_err().to_string();
        assert!(!err.contains("c2VjcmV0"), "{err}");
        assert!(err.contains("client key"), "{err}");
    }

    #[test]
    fn missing_certificate_is_reported_by_name() {
        let err = check_cert_pem("CA certificate", b"hello").unwrap_err();
        assert!(err.to_string().contains("CA certificate"), "{err}");
    }
}
