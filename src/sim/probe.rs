//! Test helpers: what a double's TLS server presents (handshaking like a client that trusts
//! any certificate, as a double's may come from a throwaway CA, and offers a client
//! certificate in case the server asks for one), and the socket options of the connection a
//! double accepted.

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

/// Whether the connection a double in this process accepted from `client` on `server` has
/// TCP_NODELAY set, read from the served socket itself: the doubles run in the test's own
/// process, so the socket is among this process's descriptors, found by its two addresses.
/// Waits (up to 10 s) for the accept; `None` if it never happens.
pub(crate) async fn served_nodelay(server: SocketAddr, client: SocketAddr) -> Option<bool> {
    for _ in 0..200 {
        if let Some(on) = find_served_nodelay(server, client) {
            return Some(on);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    None
}

fn find_served_nodelay(server: SocketAddr, client: SocketAddr) -> Option<bool> {
    use nix::sys::socket::{SockaddrStorage, getpeername, getsockname, getsockopt, sockopt};
    let v4 = |s: SockaddrStorage| {
        s.as_sockaddr_in()
            .map(|a| SocketAddr::V4(std::net::SocketAddrV4::from(*a)))
    };
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let local = getsockname::<SockaddrStorage>(fd).ok().and_then(v4);
        let peer = getpeername::<SockaddrStorage>(fd).ok().and_then(v4);
        if local == Some(server) && peer == Some(client) {
            // SAFETY: only borrowed for one getsockopt. Should another thread close the
            // descriptor meanwhile, the call fails (EBADF) or reads another socket's flag;
            // either way nothing is written and the test only reads a boolean.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            return getsockopt(&fd, sockopt::TcpNoDelay).ok();
        }
    }
    None
}
