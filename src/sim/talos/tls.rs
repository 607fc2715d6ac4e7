//! The Talos double's TLS: the server certificate of each boot (throwaway in maintenance, from
//! the OS CA or trustd once configured) and apid's client certificate check.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use super::supervisor::Boot;
use super::{NodeState, Phase, Shared, lock};
use crate::sim::SimError;
use crate::sim::pki::{self, CertKey, PkiError, SimCa};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_identity(
    ck: &CertKey,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), PkiError> {
    let parse = |what: &'static str| {
        move |e: rustls::pki_types::pem::Error| PkiError::Parse {
            what,
            reason: e.to_string(),
        }
    };
    let chain = CertificateDer::pem_slice_iter(ck.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(parse("server certificate"))?;
    let key = PrivateKeyDer::from_pem_slice(ck.key_pem.as_bytes()).map_err(parse("server key"))?;
    Ok((chain, key))
}

/// The TLS setup for the node's current state (`None`: halted, nothing to serve).
/// What the next boot can be.
pub(super) enum NextBoot {
    /// Listen with this TLS setup.
    Up(Box<Boot>),
    /// Halted: no listener until stopped.
    Halted,
    /// A configured worker whose apid certificate must come from trustd on a control plane,
    /// and no control plane of its cluster is configured yet: Talos keeps asking, so the
    /// node stays down and asks again.
    AwaitingTrustd,
}

pub(super) fn boot_tls(shared: &Shared) -> Result<NextBoot, SimError> {
    let ips = shared.cfg.san_ips();
    let host = shared.cfg.hostname.as_str();
    let installed = match &*lock(&shared.state) {
        NodeState::Halted => return Ok(NextBoot::Halted),
        NodeState::Maintenance => None,
        NodeState::Installed(i) => Some((**i).clone()),
    };
    let tls_err = |e: rustls::Error| SimError::Tls {
        what: format!("simulated Talos node {}", shared.cfg.addr()),
        reason: e.to_string(),
    };

    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?;
    let (mut tls, phase) = match installed {
        None => {
            // Maintenance (siderolabs/talos v1.13.9): a self-signed CA made anew on every
            // boot and kept in memory only (`internal/app/machined/pkg/controllers/secrets/
            // maintenance_root.go`), a server certificate from it
            // (`secrets/api.go`, maintenance branch: ExtKeyUsage serverAuth,
            // `SkipVerifyingClientCert`), and apid's server TLS in `tls.ServerOnly` mode: no
            // client certificate is asked for (`internal/app/apid/pkg/provider/provider.go`,
            // `ServerConfig`).
            let ca = SimCa::new_ca("talos-maintenance")?;
            let (chain, key) = server_identity(&ca.server(&ips, &[host])?)?;
            let tls = builder
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .map_err(tls_err)?;
            (tls, Phase::Maintenance)
        }
        Some(inst) => {
            // Secured: control planes sign apid's server certificate from `machine.ca`
            // themselves (`secrets/api.go`, `generateControlPlane`), workers get theirs from
            // trustd (`FakeCluster::trustd_issue`); apid then requires and verifies a client
            // certificate against the OS CA (`provider.go`, `ServerConfig`: `tls.Mutual`) and
            // checks its ExtKeyUsage (`internal/app/apid/service.go`, `verifyExtKeyUsage`).
            let cert = match &inst.os_ca {
                Some(ca) => ca.server(&ips, &[host])?,
                None => match shared.cluster.trustd_issue(
                    &inst.ca_cert_pem,
                    &inst.config.token,
                    &ips,
                    &[host],
                ) {
                    Some(cert) => cert?,
                    None => return Ok(NextBoot::AwaitingTrustd),
                },
            };
            let (chain, key) = server_identity(&cert)?;
            let verifier =
                TalosClientVerifier::new(&inst.ca_cert_pem).map_err(|e| SimError::Tls {
                    what: format!("client verifier of {}", shared.cfg.addr()),
                    reason: e.to_string(),
                })?;
            let tls = builder
                .with_client_cert_verifier(Arc::new(verifier))
                .with_single_cert(chain, key)
                .map_err(tls_err)?;
            (
                tls,
                if inst.on_disk {
                    Phase::Secured
                } else {
                    Phase::Installing
                },
            )
        }
    };
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(NextBoot::Up(Box::new(Boot { phase, tls })))
}

/// apid's client certificate check: chain to the OS CA (webpki, which also wants clientAuth
/// among the EKUs) and then ExtKeyUsage exactly `[ClientAuth]` on every non-CA certificate of
/// the chain (`internal/app/apid/service.go`, `verifyExtKeyUsage`, siderolabs/talos v1.13.9;
/// the double's chains have no intermediates, so that is the leaf).
#[derive(Debug)]
struct TalosClientVerifier {
    pub(super) inner: Arc<dyn ClientCertVerifier>,
}

impl TalosClientVerifier {
    pub(super) fn new(ca_pem: &str) -> Result<Self, VerifierError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert?)?;
        }
        let inner =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?;
        Ok(Self { inner })
    }
}

/// Why the client verifier cannot be built from the machine config's CA.
#[derive(Debug, thiserror::Error)]
enum VerifierError {
    #[error("{0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("{0}")]
    Root(#[from] rustls::Error),
    #[error("{0}")]
    Build(#[from] rustls::server::VerifierBuilderError),
}

impl ClientCertVerifier for TalosClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        pki::check_client_only_eku(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::InvalidPurpose)
        })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
