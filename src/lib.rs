//! talboot: from power-on to a running Talos Linux cluster.
//!
//! The crate is a library with a thin binary (`src/main.rs`). Modules follow the flow of a
//! machine's life (see `docs/architecture.md`): the typed [`inventory`] is loaded once, the
//! [`store`] persists what happened, and [`cli`] wires the subcommands.

pub mod addons;
pub mod admin;
pub(crate) mod appliance;
pub mod artifacts;
pub mod cli;
pub mod crypto;
pub mod daytwo;
pub mod dhcp;
pub mod entitlement;
pub mod events;
pub(crate) mod firststage;
pub(crate) mod fsutil;
pub mod hex;
pub mod http;
pub mod inventory;
pub mod machineconfig;
pub mod ndp;
pub(crate) mod nesting;
pub mod power;
pub mod provision;
#[cfg(feature = "sim")]
pub mod sim;
pub mod store;
pub mod talos;
pub mod talosfacts;
pub mod tftp;
pub mod view;

/// Make ring rustls' process-wide crypto provider (talboot uses ring everywhere and never
/// aws-lc). Idempotent: a second call, or a provider already installed, is fine.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
