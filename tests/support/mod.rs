//! Shared integration-test support: a test PKI ([`pki`]), a strict fake Talos node
//! ([`talos_double`]), a strict Kubernetes API double ([`kube_double`]) and network-namespace
//! labs ([`netns`]). Each test binary uses a different subset, hence the dead-code allowance.
#![allow(dead_code)]

pub mod kube_double;
pub mod netns;
pub mod pki;
pub mod talos_double;
