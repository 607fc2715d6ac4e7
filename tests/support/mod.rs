//! Shared integration-test support: network-namespace labs ([`netns`]) and real firmware in
//! QEMU ([`qemu`]). The simulated machines and API servers the tests talk to live in the
//! library, under `talboot::sim`.
#![allow(dead_code)]

pub mod netns;
pub mod qemu;
