//! The tonic client for the Talos API (apid, TCP 50000).
//!
//! Two ways in, matching the two lives of a node:
//! * **maintenance** ([`TalosClient::maintenance`]): TLS with ALPN h2, the server certificate
//!   *not* verified (it comes from a throwaway CA made at boot), no client certificate. The
//!   node treats us as `os:reader`: enough to read hardware facts and apply a config.
//! * **secured** ([`TalosClient::secured`]): mutual TLS with the admin certificate, the
//!   server verified against the cluster's OS CA.
//!
//! [`TalosClient::with_node`] sets the single-valued `node` header, so the endpoint dialled
//! relays the call to another node (`talosctl -e <cp> -n <node>`). The one-to-many `nodes`
//! header is never used: its per-node errors hide in OK replies. Replies are still checked for
//! `metadata.error`, in case a proxy put one there.
//!
//! Every call has a deadline (sent as `grpc-timeout` and enforced locally, including while a
//! stream is read). Idempotent calls are retried with backoff ([`super::retry`]); apply,
//! bootstrap, reset and reboot are made exactly once.
//!
//! The client is split by job: [`call`] (deadlines, retries, and checking every reply),
//! [`machine_service`] (the MachineService calls: version, apply, bootstrap, kubeconfig,
//! reset, reboot, services, etcd), [`facts`] (disks and system information), [`resources`]
//! (COSI reads: machine status, configs, runtime events) and [`stream`] (the image pull and
//! the installer's streamed output).

mod call;
mod facts;
mod machine_service;
mod resources;
mod stream;
#[cfg(test)]
mod tests;

pub use facts::{SECURITY_STATE_ID, SECURITY_STATE_TYPE};
pub use stream::installer_containerd;

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::APID_PORT;
use super::api::machine::apply_configuration_request;
use super::api::talos::resource::definitions::block;
use super::error::{TalosError, Target};
use super::retry::RetryPolicy;
use super::tls::{MaintenanceVerifier, check_cert_pem, check_key_pem, normalize_key_pem};

/// The gRPC metadata key apid reads to relay a call to one other node.
pub(crate) const NODE_HEADER: &str = "node";

/// Admin client credentials: the cluster OS CA certificate (to verify nodes) and a client
/// certificate/key pair signed by it (roles in the Organization, e.g. `os:admin`). All PEM;
/// the key may use Talos's `ED25519 PRIVATE KEY` label.
#[derive(Clone)]
pub struct ClientCreds {
    /// PEM of the cluster OS CA certificate.
    pub ca_pem: Vec<u8>,
    /// PEM of the client certificate.
    pub crt_pem: Vec<u8>,
    /// PEM of the client private key. Never printed.
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for ClientCreds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCreds")
            .field("ca_pem", &format_args!("<{} bytes>", self.ca_pem.len()))
            .field("crt_pem", &format_args!("<{} bytes>", self.crt_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Per-call deadlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// TCP connect plus TLS handshake.
    pub connect: Duration,
    /// Any unary call.
    pub call: Duration,
    /// The Kubeconfig stream, read to the end.
    pub kubeconfig: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            call: Duration::from_secs(30),
            kubeconfig: Duration::from_secs(60),
        }
    }
}

/// Which of the two TLS setups a client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// No verification, no client certificate: a node in maintenance mode.
    Maintenance,
    /// mTLS with the admin certificate, server verified against the OS CA.
    Secured,
}

/// What ApplyConfiguration reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// The mode the node actually used; `None` if it named a mode newer than our protos.
    pub mode: Option<apply_configuration_request::Mode>,
    /// Human-readable explanation from the node.
    pub mode_details: String,
    /// Config validation warnings.
    pub warnings: Vec<String>,
}

/// A runtime sequence that failed on the node (from its `Events` stream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SequenceFailure {
    /// The sequence, e.g. `install`, `reset`, `boot`.
    pub sequence: String,
    /// Talos's message, e.g. `sequence failed: ... error pulling image ...`.
    pub message: String,
}

/// A disk as COSI `Disks.block.talos.dev` describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct CosiDisk {
    /// Resource id: the bare kernel device name (`sda`, `nvme0n1`), never a path; the path
    /// is `spec.dev_path` (`/dev/sda`), which is also what `storage.Disks` calls
    /// `device_name` (siderolabs/talos v1.13.9 `internal/app/machined/pkg/controllers/block/disks.go`,
    /// `internal/app/storaged/server.go`).
    pub id: String,
    /// The typed spec.
    pub spec: block::DiskSpec,
}

/// A connection to one Talos apid endpoint (optionally relaying to another node). Cheap to
/// clone; clones share the HTTP/2 connection.
#[derive(Clone)]
pub struct TalosClient {
    channel: Channel,
    endpoint: SocketAddr,
    security: Security,
    node: Option<(String, MetadataValue<tonic::metadata::Ascii>)>,
    deadlines: Deadlines,
    retry: RetryPolicy,
}

impl fmt::Debug for TalosClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosClient")
            .field("endpoint", &self.endpoint)
            .field("security", &self.security)
            .field("node", &self.node.as_ref().map(|(n, _)| n))
            .field("deadlines", &self.deadlines)
            .finish()
    }
}

/// `ip:50000` for a node address.
pub fn apid_addr(ip: std::net::IpAddr) -> SocketAddr {
    SocketAddr::new(ip, APID_PORT)
}

fn endpoint_for(addr: SocketAddr, deadlines: &Deadlines) -> Result<Endpoint, TalosError> {
    // `https://` plus the TLS config below; the IP literal becomes the TLS server name, so a
    // configured node's certificate must carry that IP as a SAN (Talos adds node addresses).
    let uri = format!("https://{addr}");
    Endpoint::from_shared(uri)
        .map(|e| e.connect_timeout(deadlines.connect))
        .map_err(|_| TalosError::InvalidNode {
            node: addr.to_string(),
            reason: "not usable as an https endpoint address",
        })
}

impl TalosClient {
    /// A client for a node in maintenance mode at `addr` (usually `ip:50000`). No connection
    /// is made until the first call.
    pub fn maintenance(addr: SocketAddr) -> Result<Self, TalosError> {
        let deadlines = Deadlines::default();
        let tls = ClientTlsConfig::new().timeout(deadlines.connect);
        let endpoint = endpoint_for(addr, &deadlines)?
            .tls_config_with_verifier(tls, MaintenanceVerifier::new())
            .map_err(|e| TalosError::TlsHandshake {
                target: Target {
                    endpoint: addr,
                    node: None,
                },
                detail: e.to_string(),
            })?;
        Ok(Self::from_channel(
            endpoint.connect_lazy(),
            addr,
            Security::Maintenance,
            deadlines,
        ))
    }

    /// A client for a configured node at `addr`, authenticated with `creds`.
    pub fn secured(addr: SocketAddr, creds: &ClientCreds) -> Result<Self, TalosError> {
        check_cert_pem("CA certificate", &creds.ca_pem)?;
        check_cert_pem("client certificate", &creds.crt_pem)?;
        let key = normalize_key_pem(&creds.key_pem);
        check_key_pem(&key)?;

        let deadlines = Deadlines::default();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&creds.ca_pem))
            .identity(Identity::from_pem(&creds.crt_pem, key))
            .timeout(deadlines.connect);
        let endpoint = endpoint_for(addr, &deadlines)?
            .tls_config(tls)
            .map_err(|e| TalosError::Credentials {
                what: "client certificate",
                reason: format!("rejected by the TLS stack: {e}"),
            })?;
        Ok(Self::from_channel(
            endpoint.connect_lazy(),
            addr,
            Security::Secured,
            deadlines,
        ))
    }

    fn from_channel(
        channel: Channel,
        endpoint: SocketAddr,
        security: Security,
        deadlines: Deadlines,
    ) -> Self {
        Self {
            channel,
            endpoint,
            security,
            node: None,
            deadlines,
            retry: RetryPolicy::default(),
        }
    }

    /// The same connection, with every call relayed by the endpoint to `node` (a bare IP
    /// address or hostname, as apid wants it). Maintenance-mode nodes ignore the header.
    pub fn with_node(&self, node: &str) -> Result<Self, TalosError> {
        let value = validate_node(node)?;
        Ok(Self {
            node: Some((node.to_owned(), value)),
            ..self.clone()
        })
    }

    /// Replaces the deadlines for calls made from now on (the connect deadline applies to
    /// clients built afterwards, as the endpoint is fixed at construction).
    pub(crate) fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// Replaces the retry policy of idempotent calls.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The endpoint dialled.
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// Which TLS setup this client uses.
    pub fn security(&self) -> Security {
        self.security
    }

    /// Where calls go, for messages.
    pub fn target(&self) -> Target {
        Target {
            endpoint: self.endpoint,
            node: self.node.as_ref().map(|(n, _)| n.clone()),
        }
    }
}

/// Checks a `node` header value the way apid will: one bare address or hostname, no port.
fn validate_node(node: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, TalosError> {
    let reject = |reason| TalosError::InvalidNode {
        node: node.to_owned(),
        reason,
    };
    if node.is_empty() {
        return Err(reject("empty"));
    }
    if node.parse::<SocketAddr>().is_ok()
        || (node.contains(':') && node.parse::<std::net::IpAddr>().is_err())
    {
        return Err(reject(
            "apid wants a bare address or hostname, without a port (\"invalid target\")",
        ));
    }
    if node.contains(',') || node.chars().any(|c| c.is_whitespace()) {
        return Err(reject(
            "exactly one node per call (the `node` header is single-valued)",
        ));
    }
    MetadataValue::try_from(node).map_err(|_| reject("not printable ASCII"))
}
