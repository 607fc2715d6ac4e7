//! Machine configuration: cluster secrets, PKI, client configs (and, from sibling modules, the
//! rendering and patching of Talos machine configs).

pub mod clients;
pub mod pki;
pub mod secrets;

#[cfg(test)]
mod testutil;
