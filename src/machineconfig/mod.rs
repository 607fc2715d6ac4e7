//! Talos machine configuration: the cluster secrets bundle and its PKI, the admin client configs
//! (talosconfig, kubeconfig), and turning the typed inventory into the multi-document YAML a
//! Talos node receives. [`patch`] is the pure patch engine (Talos strategic merge rules and
//! RFC 6902 JSON patches over a [`patch::ConfigBundle`]).

pub mod clients;
pub(crate) mod contract;
pub(crate) mod legacy;
pub(crate) mod output;
pub mod patch;
pub mod pki;
pub mod render;
pub mod rendered;
pub mod renderer;
pub mod schema;
pub mod secrets;
pub(crate) mod text_diff;

#[cfg(test)]
mod testutil;
