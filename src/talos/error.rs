//! What can go wrong when talking to a Talos node, in words an operator can act on.
//!
//! The client hands every failed call to `classify`: a gRPC status, the transport or TLS
//! error hidden in its source chain, and what the client knows about the call (which node,
//! which RPC, maintenance or secured) become one [`TalosError`] variant. Per-node errors that
//! Talos hides inside an OK reply (`metadata.error`) go through the same mapping, so a denied
//! call looks the same whether it failed directly or behind a relay.

use std::error::Error as StdError;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use rustls::AlertDescription;
use tonic::{Code, Status};

/// The node a call was aimed at: the apid endpoint dialled, and the `node` header when the
/// call is relayed through that endpoint to another node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The address dialled (`ip:50000`).
    pub endpoint: SocketAddr,
    /// The value of the `node` metadata header, if any.
    pub node: Option<String>,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => write!(f, "node {node} (via {})", self.endpoint),
            None => write!(f, "{}", self.endpoint),
        }
    }
}

/// The Talos RPCs talboot makes. Knowing the call lets the error mapping say more than the
/// status code does (a `PermissionDenied` on Bootstrap in maintenance mode means "apply a
/// config first", an `AlreadyExists` on Bootstrap means "already done").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    /// `/machine.MachineService/ApplyConfiguration`
    ApplyConfiguration,
    /// `/machine.MachineService/Bootstrap`
    Bootstrap,
    /// `/machine.MachineService/EtcdMemberList`
    EtcdMemberList,
    /// `/machine.MachineService/Events`
    Events,
    /// `/machine.MachineService/Kubeconfig`
    Kubeconfig,
    /// `/machine.MachineService/Reboot`
    Reboot,
    /// `/machine.MachineService/Reset`
    Reset,
    /// `/machine.MachineService/ServiceList`
    ServiceList,
    /// `/machine.MachineService/Version`
    Version,
    /// `/machine.LifecycleService/Upgrade`
    Upgrade,
    /// `/machine.ImageService/Pull`
    ImagePull,
    /// `/storage.StorageService/Disks`
    Disks,
    /// `/cosi.resource.State/Get`
    CosiGet,
    /// `/cosi.resource.State/List`
    CosiList,
}

impl Rpc {
    /// The full gRPC path of the call.
    pub fn path(self) -> &'static str {
        match self {
            Self::ApplyConfiguration => "/machine.MachineService/ApplyConfiguration",
            Self::Bootstrap => "/machine.MachineService/Bootstrap",
            Self::EtcdMemberList => "/machine.MachineService/EtcdMemberList",
            Self::Events => "/machine.MachineService/Events",
            Self::Kubeconfig => "/machine.MachineService/Kubeconfig",
            Self::Reboot => "/machine.MachineService/Reboot",
            Self::Reset => "/machine.MachineService/Reset",
            Self::ServiceList => "/machine.MachineService/ServiceList",
            Self::Version => "/machine.MachineService/Version",
            Self::Upgrade => "/machine.LifecycleService/Upgrade",
            Self::ImagePull => "/machine.ImageService/Pull",
            Self::Disks => "/storage.StorageService/Disks",
            Self::CosiGet => "/cosi.resource.State/Get",
            Self::CosiList => "/cosi.resource.State/List",
        }
    }

    /// Whether the call needs more than `os:reader`, i.e. is refused in maintenance mode
    /// (v1.13: PermissionDenied; v1.11/v1.12: Unimplemented).
    pub(crate) fn needs_more_than_reader(self) -> bool {
        matches!(
            self,
            Self::Bootstrap
                | Self::Kubeconfig
                | Self::Reboot
                | Self::Reset
                | Self::Upgrade
                | Self::ImagePull
        )
    }

    /// Whether repeating the call cannot change the outcome of the first one. Only these are
    /// retried automatically; apply, bootstrap, reset and reboot never are.
    pub(crate) fn idempotent(self) -> bool {
        matches!(
            self,
            Self::EtcdMemberList
                | Self::Events
                | Self::Kubeconfig
                | Self::ServiceList
                | Self::Version
                | Self::Disks
                | Self::CosiGet
                | Self::CosiList
        )
    }
}

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

/// A failed Talos API call, classified so the operator (or the orchestrator) knows what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TalosError {
    /// No TCP/TLS connection could be made, or the relay could not reach the node.
    #[error(
        "cannot reach the Talos API of {target}: {detail}. Check that the node is powered on, \
         holds the address its DHCP lease says, and that TCP port 50000 is reachable from here \
         (or from the endpoint, for a relayed call)"
    )]
    Unreachable {
        /// Where the call went.
        target: Target,
        /// The underlying transport error.
        detail: String,
    },
    /// The server certificate did not verify against the cluster OS CA we hold.
    #[error(
        "the Talos API at {target} presented a certificate that does not verify against the \
         cluster's OS CA ({detail}). Either the node is still in maintenance mode (its \
         certificate comes from a throwaway CA: probe it with the maintenance client and apply \
         its machine config), or the CA in the admin talosconfig belongs to another cluster's \
         secrets"
    )]
    WrongCa {
        /// Where the call went.
        target: Target,
        /// The TLS verification error.
        detail: String,
    },
    /// A maintenance-mode (no client certificate) call reached a configured node.
    #[error(
        "the Talos API at {target} asks for a client certificate: the node is configured, not \
         in maintenance mode. Talk to it with the cluster's admin talosconfig; to reprovision \
         it, reset it (wiping STATE and EPHEMERAL) first"
    )]
    NotInMaintenance {
        /// Where the call went.
        target: Target,
    },
    /// The node refused our client certificate during the TLS handshake.
    #[error(
        "the Talos API at {target} rejected our client certificate ({detail}). It must be \
         signed by this cluster's OS CA and carry ExtKeyUsage clientAuth only; regenerate the \
         admin talosconfig from the cluster secrets"
    )]
    ClientCertRejected {
        /// Where the call went.
        target: Target,
        /// The TLS alert or error.
        detail: String,
    },
    /// Any other TLS handshake failure.
    #[error(
        "TLS handshake with the Talos API at {target} failed: {detail}. Talos speaks TLS 1.2+ \
         with ALPN h2 on port 50000; check that nothing else listens there"
    )]
    TlsHandshake {
        /// Where the call went.
        target: Target,
        /// The TLS error.
        detail: String,
    },
    /// A call that needs os:operator or os:admin was made to a node in maintenance mode.
    #[error(
        "{rpc} refused by {target}: the node is in maintenance mode, where every caller is \
         os:reader. Apply its machine config first, wait for it to install and reboot, then \
         call it with the admin client certificate"
    )]
    Maintenance {
        /// Where the call went.
        target: Target,
        /// The refused call.
        rpc: Rpc,
    },
    /// ApplyConfiguration over the maintenance API refused with PermissionDenied: Talos
    /// lets a maintenance (os:reader) caller apply only while no complete config is active
    /// (`v1alpha1_server.go`, ApplyConfiguration: `inMaintenance :=
    /// !ConfigCompleteForBoot()`), so an earlier apply has landed and the node is leaving
    /// maintenance mode.
    #[error(
        "{rpc} refused by {target}: the node already holds a complete machine config (an \
         earlier apply landed) and is leaving maintenance mode"
    )]
    ConfigAlreadyApplied {
        /// Where the call went.
        target: Target,
        /// The refused call.
        rpc: Rpc,
    },
    /// The endpoint was asked to relay (`node` header) but its apid cannot forward: only a
    /// control plane's apid holds the client certificate to dial other nodes with, so a
    /// worker answers PermissionDenied "no request forwarding" (Talos v1.13.9
    /// `internal/app/apid/pkg/director/director.go`, `singleDirector`).
    #[error(
        "{rpc} refused by {target}: that endpoint cannot relay to other nodes ({message}). \
         Only a control plane's apid forwards `node` requests; dial the node itself or go \
         through a control plane"
    )]
    NoForwarding {
        /// Where the call went.
        target: Target,
        /// The refused call.
        rpc: Rpc,
        /// The server's message.
        message: String,
    },
    /// The caller's roles (client certificate Organization) do not allow the call.
    #[error(
        "{rpc} refused by {target}: permission denied ({message}). The client certificate's \
         Organization must carry the role the call needs (os:admin for bootstrap, kubeconfig, \
         reset and apply; os:operator for reboot); use the admin talosconfig"
    )]
    PermissionDenied {
        /// Where the call went.
        target: Target,
        /// The refused call.
        rpc: Rpc,
        /// The server's message.
        message: String,
    },
    /// Bootstrap answered AlreadyExists: etcd on that node already has data.
    #[error(
        "{target} is already bootstrapped ({message}); the etcd cluster exists, so treat \
         bootstrap as done and never bootstrap another control plane"
    )]
    AlreadyBootstrapped {
        /// Where the call went.
        target: Target,
        /// The server's message.
        message: String,
    },
    /// The node does not implement the call (wrong machine type or Talos version).
    #[error(
        "{rpc} is not available on {target} ({message}). Bootstrap and kubeconfig exist on \
         control-plane nodes only; an older Talos may lack the call"
    )]
    Unimplemented {
        /// Where the call went.
        target: Target,
        /// The call.
        rpc: Rpc,
        /// The server's message.
        message: String,
    },
    /// The call did not finish before its deadline.
    #[error(
        "{rpc} to {target} did not finish within {after:?}; the node may be rebooting, \
         installing or overloaded; try again later or raise the deadline"
    )]
    Timeout {
        /// Where the call went.
        target: Target,
        /// The call.
        rpc: Rpc,
        /// The deadline that expired.
        after: Duration,
    },
    /// The node answered with an error status not covered above.
    #[error("{rpc} to {target} failed with {code:?}: {message}")]
    Remote {
        /// Where the call went.
        target: Target,
        /// The call.
        rpc: Rpc,
        /// The gRPC status code.
        code: Code,
        /// The server's message.
        message: String,
    },
    /// The reply did not have the shape Talos promises (no entry, unreadable archive, ...).
    #[error("{rpc} reply from {target} is malformed: {detail}")]
    Malformed {
        /// Where the call went.
        target: Target,
        /// The call.
        rpc: Rpc,
        /// What was wrong.
        detail: String,
    },
    /// A `node` header value apid would refuse.
    #[error("invalid node target {node:?}: {reason}")]
    InvalidNode {
        /// The rejected value.
        node: String,
        /// Why.
        reason: &'static str,
    },
    /// The client credentials could not be used (the message names which part; key material
    /// is never included).
    #[error("invalid Talos client credentials: {what}: {reason}")]
    Credentials {
        /// Which part: "CA certificate", "client certificate", "client key".
        what: &'static str,
        /// Why it is unusable.
        reason: String,
    },
}

impl TalosError {
    /// Whether waiting and trying again may succeed (the node is rebooting, busy or briefly
    /// unreachable). Used only for idempotent calls.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Timeout { .. } => true,
            Self::Remote { code, .. } => matches!(
                code,
                Code::Unavailable | Code::ResourceExhausted | Code::Aborted
            ),
            _ => false,
        }
    }
}

/// What the client knew about a call when it failed.
#[derive(Clone, Debug)]
pub(crate) struct CallContext {
    pub target: Target,
    pub rpc: Rpc,
    /// True for the maintenance-mode client (no client certificate, server not verified).
    pub maintenance: bool,
    pub deadline: Duration,
}

/// Turns a failed call's status into a [`TalosError`]. TLS and transport causes in the
/// status's source chain win over the status code, because tonic reports them all as
/// `Unavailable`/`Unknown` and only the cause tells "wrong CA" from "node down".
pub(crate) fn classify(status: &Status, ctx: &CallContext) -> TalosError {
    if let Some(err) = transport_cause(status, ctx) {
        return err;
    }
    classify_code(status.code(), status.message(), ctx)
}

/// Maps a status code and message (from a real status or from a reply entry's
/// `metadata.status`) to a [`TalosError`].
pub(crate) fn classify_code(code: Code, message: &str, ctx: &CallContext) -> TalosError {
    let target = ctx.target.clone();
    let message = one_line(message);
    match code {
        Code::PermissionDenied if message == "no request forwarding" => TalosError::NoForwarding {
            target,
            rpc: ctx.rpc,
            message,
        },
        Code::PermissionDenied if ctx.maintenance && ctx.rpc == Rpc::ApplyConfiguration => {
            TalosError::ConfigAlreadyApplied {
                target,
                rpc: ctx.rpc,
            }
        }
        Code::PermissionDenied if ctx.maintenance => TalosError::Maintenance {
            target,
            rpc: ctx.rpc,
        },
        Code::PermissionDenied => TalosError::PermissionDenied {
            target,
            rpc: ctx.rpc,
            message,
        },
        // Talos v1.11/v1.12 maintenance servers answer Unimplemented for admin calls.
        Code::Unimplemented if ctx.maintenance && ctx.rpc.needs_more_than_reader() => {
            TalosError::Maintenance {
                target,
                rpc: ctx.rpc,
            }
        }
        Code::Unimplemented => TalosError::Unimplemented {
            target,
            rpc: ctx.rpc,
            message,
        },
        Code::AlreadyExists if ctx.rpc == Rpc::Bootstrap => {
            TalosError::AlreadyBootstrapped { target, message }
        }
        Code::DeadlineExceeded => TalosError::Timeout {
            target,
            rpc: ctx.rpc,
            after: ctx.deadline,
        },
        // apid answers Unavailable when it cannot reach the node named in `node`; tonic uses
        // it for connection failures without a more specific cause.
        Code::Unavailable => TalosError::Unreachable {
            target,
            detail: message,
        },
        code => TalosError::Remote {
            target,
            rpc: ctx.rpc,
            code,
            message,
        },
    }
}

/// Talos returns validation failures in go-multierror's layout ("1 error occurred:\n\t*
/// ...\n\n", nested once per layer, `pkg/machinery/config/container/container.go`); events,
/// `status` and logs want one line, so runs of whitespace become one space.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Looks through the error chain under a status for a TLS, timeout or socket error.
fn transport_cause(status: &Status, ctx: &CallContext) -> Option<TalosError> {
    let target = ctx.target.clone();
    let mut causes = Vec::new();
    collect_chain(status.source(), &mut causes);

    for cause in &causes {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return Some(classify_tls(
                TlsSignal::from_rustls(tls),
                tls.to_string(),
                ctx,
            ));
        }
    }
    // h2 keeps only the kind and text of an I/O error that kills a connection, so a TLS
    // alert that arrives after the handshake (TLS 1.3 servers reject a client certificate
    // then) reaches us as text. rustls's Display wording is the only thing left to go on.
    for cause in &causes {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
        {
            let text = io.to_string();
            if let Some(signal) = TlsSignal::from_text(&text) {
                return Some(classify_tls(signal, text, ctx));
            }
        }
    }
    for cause in &causes {
        if cause.downcast_ref::<tonic::TimeoutExpired>().is_some() {
            return Some(TalosError::Timeout {
                target,
                rpc: ctx.rpc,
                after: ctx.deadline,
            });
        }
    }
    for cause in &causes {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::TimedOut
                    | K::AddrNotAvailable
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::UnexpectedEof
            ) {
                return Some(TalosError::Unreachable {
                    target,
                    detail: io.to_string(),
                });
            }
        }
    }
    for cause in &causes {
        if cause.downcast_ref::<tonic::ConnectError>().is_some() {
            return Some(TalosError::Unreachable {
                target,
                detail: cause.to_string(),
            });
        }
    }
    None
}

/// Flattens an error chain. `io::Error::source` skips the error it wraps (it returns the
/// wrapped error's *source*), which would hide the `rustls::Error` tokio-rustls puts inside
/// an `io::Error`, so wrapped errors are added explicitly.
fn collect_chain<'a>(
    mut next: Option<&'a (dyn StdError + 'static)>,
    out: &mut Vec<&'a (dyn StdError + 'static)>,
) {
    // Bounded: a cyclic chain would be a bug elsewhere, but must not hang the client.
    while let Some(err) = next {
        if out.len() > 32 {
            break;
        }
        out.push(err);
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            let inner: &(dyn StdError + 'static) = inner;
            out.push(inner);
        }
        next = err.source();
    }
}

/// The part of a TLS failure that decides the error variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsSignal {
    /// Our verifier refused the server certificate.
    ServerCertInvalid,
    /// The server sent this alert.
    Alert(AlertDescription),
    /// Anything else.
    Other,
}

impl TlsSignal {
    fn from_rustls(err: &rustls::Error) -> Self {
        match err {
            rustls::Error::InvalidCertificate(_) => Self::ServerCertInvalid,
            rustls::Error::AlertReceived(alert) => Self::Alert(*alert),
            _ => Self::Other,
        }
    }

    /// Recognises rustls's `Display` text for the two cases that matter (`invalid peer
    /// certificate: ...`, `received fatal alert: <Name>`).
    fn from_text(text: &str) -> Option<Self> {
        if text.starts_with("invalid peer certificate") {
            return Some(Self::ServerCertInvalid);
        }
        let name = text.strip_prefix("received fatal alert: ")?.trim();
        let alert = [
            AlertDescription::CertificateRequired,
            AlertDescription::BadCertificate,
            AlertDescription::UnsupportedCertificate,
            AlertDescription::CertificateRevoked,
            AlertDescription::CertificateExpired,
            AlertDescription::CertificateUnknown,
            AlertDescription::UnknownCA,
            AlertDescription::AccessDenied,
            AlertDescription::HandshakeFailure,
            AlertDescription::DecryptError,
        ]
        .into_iter()
        .find(|a| format!("{a:?}") == name);
        Some(alert.map_or(Self::Other, Self::Alert))
    }
}

fn classify_tls(signal: TlsSignal, detail: String, ctx: &CallContext) -> TalosError {
    let target = ctx.target.clone();
    match signal {
        // Our verifier refused the server: only the secured client verifies, and a node still
        // in maintenance mode presents a throwaway-CA certificate.
        TlsSignal::ServerCertInvalid => TalosError::WrongCa { target, detail },
        TlsSignal::Alert(alert) => match alert {
            AlertDescription::CertificateRequired => TalosError::NotInMaintenance { target },
            // rustls servers answer a client certificate whose signature does not check out
            // against a same-named CA with decrypt_error. Only meaningful if we sent one.
            AlertDescription::DecryptError if !ctx.maintenance => {
                TalosError::ClientCertRejected { target, detail }
            }
            AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied => {
                if ctx.maintenance {
                    // We sent no certificate at all: the server wants one.
                    TalosError::NotInMaintenance { target }
                } else {
                    TalosError::ClientCertRejected { target, detail }
                }
            }
            _ => TalosError::TlsHandshake { target, detail },
        },
        TlsSignal::Other => TalosError::TlsHandshake { target, detail },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn ctx(rpc: Rpc, maintenance: bool) -> CallContext {
        CallContext {
            target: Target {
                endpoint: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)), 50000),
                node: None,
            },
            rpc,
            maintenance,
            deadline: Duration::from_secs(30),
        }
    }

    #[test]
    fn permission_denied_in_maintenance_means_apply_first() {
        let err = classify(
            &Status::permission_denied("not authorized"),
            &ctx(Rpc::Bootstrap, true),
        );
        assert!(matches!(
            err,
            TalosError::Maintenance {
                rpc: Rpc::Bootstrap,
                ..
            }
        ));
        assert!(err.to_string().contains("maintenance mode"), "{err}");
    }

    #[test]
    fn permission_denied_when_secured_names_the_role() {
        let err = classify(
            &Status::permission_denied("not authorized"),
            &ctx(Rpc::Bootstrap, false),
        );
        assert!(matches!(err, TalosError::PermissionDenied { .. }));
        assert!(err.to_string().contains("os:admin"), "{err}");
    }

    #[test]
    fn a_worker_endpoint_that_cannot_relay_is_not_a_role_problem() {
        // What a worker's apid answers to a `node` header naming another node.
        let mut relayed = ctx(Rpc::Version, false);
        relayed.target.node = Some("10.0.0.6".into());
        let err = classify(
            &Status::permission_denied("no request forwarding"),
            &relayed,
        );
        assert!(matches!(err, TalosError::NoForwarding { .. }), "{err:?}");
        assert!(err.to_string().contains("control plane"), "{err}");
        assert!(!err.to_string().contains("Organization"), "{err}");
    }

    #[test]
    fn multierror_messages_become_one_line() {
        // Talos's validation error layout, nested by container.Validate.
        let st = Status::invalid_argument(
            "1 error occurred:\n\t* v1alpha1.Config: 1 error occurred:\n\t* either install \
             disk or diskSelector should be defined\n\n\n\n",
        );
        let err = classify(&st, &ctx(Rpc::ApplyConfiguration, true));
        let text = err.to_string();
        assert!(!text.contains('\n') && !text.contains('\t'), "{text:?}");
        assert!(
            text.ends_with(
                "1 error occurred: * v1alpha1.Config: 1 error occurred: * either install disk \
                 or diskSelector should be defined"
            ),
            "{text:?}"
        );
    }

    #[test]
    fn old_maintenance_unimplemented_is_maintenance_only_for_admin_calls() {
        let old = Status::unimplemented("method Bootstrap not implemented");
        assert!(matches!(
            classify(&old, &ctx(Rpc::Bootstrap, true)),
            TalosError::Maintenance { .. }
        ));
        assert!(matches!(
            classify(&old, &ctx(Rpc::Bootstrap, false)),
            TalosError::Unimplemented { .. }
        ));
        assert!(matches!(
            classify(&Status::unimplemented("x"), &ctx(Rpc::Version, true)),
            TalosError::Unimplemented { .. }
        ));
    }

    #[test]
    fn already_exists_is_already_bootstrapped_only_for_bootstrap() {
        let st = Status::already_exists("etcd data directory is not empty");
        assert!(matches!(
            classify(&st, &ctx(Rpc::Bootstrap, false)),
            TalosError::AlreadyBootstrapped { .. }
        ));
        assert!(matches!(
            classify(&st, &ctx(Rpc::Reset, false)),
            TalosError::Remote {
                code: Code::AlreadyExists,
                ..
            }
        ));
    }

    #[test]
    fn deadline_and_unavailable_are_transient_but_invalid_argument_is_not() {
        let timeout = classify(&Status::deadline_exceeded("x"), &ctx(Rpc::Version, false));
        assert!(matches!(timeout, TalosError::Timeout { .. }));
        assert!(timeout.is_transient());
        let down = classify(&Status::unavailable("no route"), &ctx(Rpc::Version, false));
        assert!(matches!(down, TalosError::Unreachable { .. }));
        assert!(down.is_transient());
        let bad = classify(&Status::invalid_argument("bad"), &ctx(Rpc::Version, false));
        assert!(!bad.is_transient());
    }

    #[test]
    fn tls_causes_are_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let st = Status::from_error(Box::new(io));
        assert!(matches!(
            classify(&st, &ctx(Rpc::Version, false)),
            TalosError::WrongCa { .. }
        ));

        let alert = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
        let st = Status::from_error(Box::new(io));
        assert!(matches!(
            classify(&st, &ctx(Rpc::Version, true)),
            TalosError::NotInMaintenance { .. }
        ));

        let alert = rustls::Error::AlertReceived(AlertDescription::BadCertificate);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
        let st = Status::from_error(Box::new(io));
        assert!(matches!(
            classify(&st, &ctx(Rpc::Version, false)),
            TalosError::ClientCertRejected { .. }
        ));
    }

    #[test]
    fn tls_alerts_flattened_to_text_by_h2_are_still_recognised() {
        // What h2 leaves of an alert that ends an established connection.
        let flat = |text: &str| {
            Status::from_error(Box::new(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                text.to_owned(),
            )))
        };
        assert!(matches!(
            classify(
                &flat("received fatal alert: CertificateRequired"),
                &ctx(Rpc::Version, true)
            ),
            TalosError::NotInMaintenance { .. }
        ));
        assert!(matches!(
            classify(
                &flat("received fatal alert: UnknownCA"),
                &ctx(Rpc::Version, false)
            ),
            TalosError::ClientCertRejected { .. }
        ));
        let decrypt = flat("received fatal alert: DecryptError");
        assert!(matches!(
            classify(&decrypt, &ctx(Rpc::Version, false)),
            TalosError::ClientCertRejected { .. }
        ));
        assert!(matches!(
            classify(&decrypt, &ctx(Rpc::Version, true)),
            TalosError::TlsHandshake { .. }
        ));
        assert!(matches!(
            classify(
                &flat("received fatal alert: DecodeError"),
                &ctx(Rpc::Version, false)
            ),
            TalosError::TlsHandshake { .. }
        ));
        assert!(matches!(
            classify(
                &flat("invalid peer certificate: UnknownIssuer"),
                &ctx(Rpc::Version, false)
            ),
            TalosError::WrongCa { .. }
        ));
        // Other InvalidData text is not mistaken for TLS.
        assert!(matches!(
            classify(&flat("frame too large"), &ctx(Rpc::Version, false)),
            TalosError::Remote { .. }
        ));
    }

    #[test]
    fn refused_connection_is_unreachable() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let st = Status::from_error(Box::new(tonic::ConnectError(Box::new(io))));
        let err = classify(&st, &ctx(Rpc::Version, true));
        assert!(matches!(err, TalosError::Unreachable { .. }), "{err:?}");
    }

    #[test]
    fn relayed_target_names_both_hops() {
        let t = Target {
            endpoint: "10.0.0.5:50000".parse().unwrap(),
            node: Some("10.0.0.7".into()),
        };
        assert_eq!(t.to_string(), "node 10.0.0.7 (via 10.0.0.5:50000)");
    }

    #[test]
    fn only_read_calls_are_idempotent() {
        for rpc in [
            Rpc::ApplyConfiguration,
            Rpc::Bootstrap,
            Rpc::Reset,
            Rpc::Reboot,
            Rpc::Upgrade,
            Rpc::ImagePull,
        ] {
            assert!(!rpc.idempotent(), "{rpc}");
        }
        for rpc in [Rpc::Version, Rpc::Disks, Rpc::Kubeconfig, Rpc::ServiceList] {
            assert!(rpc.idempotent(), "{rpc}");
        }
    }
}
