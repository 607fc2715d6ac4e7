//! Shared integration-test support: a test PKI ([`pki`]) and a strict fake Talos node
//! ([`talos_double`]). Each test binary uses a different subset, hence the dead-code allowance.
#![allow(dead_code)]

pub mod netns;
pub mod pki;
pub mod talos_double;
