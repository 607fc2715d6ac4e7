//! Test helper: what a double's TLS server presents. Handshakes like a client that trusts
//! any certificate (a double's may come from a throwaway CA) and offers a client certificate
//! in case the server asks for one.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The subject alternative names (IPv4 addresses and DNS names, as text) of the certificate
/// the server at `addr` presents, handshaking with the client certificate `chain`/`key` and
/// offering the ALPN protocols `alpn`.
pub(crate) async fn presented_sans(
    addr: SocketAddr,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[&[u8]],
) -> Vec<String> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(crate::talos::tls::MaintenanceVerifier::new())
    .with_client_auth_cert(chain, key)
    .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let der = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    san.general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::IPAddress(b) if b.len() == 4 => {
                Some(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string())
            }
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect()
}
