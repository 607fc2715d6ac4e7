//! Shared integration-test support: network-namespace labs ([`netns`]), real firmware in
//! QEMU ([`qemu`]) and fake boot artifacts for `serve` ([`images`]). The simulated machines and API servers the tests talk to live in the
//! library, under `talboot::sim`.
#![allow(dead_code)]

pub mod browser;
pub mod etcd;
pub mod images;
pub mod netns;
pub mod qemu;
pub mod redfish_front;
pub mod segment;
pub mod sushy;
