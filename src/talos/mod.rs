//! The Talos API layer: generated types for our own `.proto` subset ([`api`]), a tonic client
//! for maintenance mode (insecure TLS) and for configured nodes (mTLS with the admin
//! certificate, relayed through an endpoint with the `node` header) in [`client`], the
//! operator-facing error type ([`error`]), the retry policy for idempotent calls ([`retry`]),
//! the TLS pieces ([`tls`]) and the kubeconfig archive reader ([`archive`]).
//!
//! Everything that talks to a node goes through [`client::TalosClient`]; the pure parts
//! (error classification, backoff, PEM normalisation, archive unpacking) have no I/O.

pub mod api;
pub mod archive;
pub mod client;
pub mod error;
pub mod retry;
pub mod talosconfig;
pub mod tls;

pub use client::{ClientCreds, Deadlines, SECURITY_STATE_ID, SECURITY_STATE_TYPE, TalosClient};
pub use error::TalosError;

/// TCP port of apid, where every Talos API call goes, in maintenance mode and after
/// (`constants.ApidPort`).
pub(crate) const APID_PORT: u16 = 50000;

/// Largest gRPC message Talos sends or accepts (`GRPCMaxMessageSize`, 32 MiB); tonic's
/// default decode limit is 4 MiB, which a long disk or service list could exceed.
pub(crate) const MAX_MESSAGE_SIZE: usize = 32 * 1024 * 1024;
