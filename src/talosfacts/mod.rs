//! Facts about the Talos releases talboot targets, kept as data: which machine-config
//! contract a Talos version gets and what each contract switches ([`contract`]), each minor's
//! config schema facts and the v1alpha1 fields Talos deprecated ([`schema`]), the legacy
//! fields the v1.14 contract moves into documents or refuses next to them ([`legacy`]), and
//! v1.14's CEL disk environment with the rules by which Talos picks a disk ([`disk_cel`]).
//!
//! They sit below both of their readers: the inventory warns about and refuses patch fields
//! against them when it loads, and the machine-config renderer renders and validates by them,
//! so both read one table. Everything here is pure and names no other talboot module.

pub mod contract;
pub mod disk_cel;
pub(crate) mod legacy;
pub(crate) mod schema;
