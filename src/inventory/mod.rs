//! The one typed inventory: load, talhelper import, validation.
//!
//! `talboot.yaml` (or a talhelper `talconfig.yaml`) is parsed once into the typed values of
//! [`model`]; every later stage reads those values and never re-parses strings. Loading reports
//! every problem at once, each with file, line, column, field path and a hint ([`diag`]).
//!
//! # Layering
//!
//! Each module imports only the ones above it, so the imports form a DAG:
//!
//! 1. [`diag`] (locations and diagnostics), [`schematic`] (Image Factory schematics) and
//!    [`size`] (Talos's disk-size expressions);
//!    [`storage`] (RAID install and dedicated system volumes) sits beside [`model`];
//! 2. [`yaml`] (the position-marked YAML tree) and [`model`] (the typed values);
//! 3. [`read`] (field readers both formats share) and [`parts`] (what a format reader
//!    produces, the shared defaults and the `${VAR}` environment);
//! 4. [`talhelper`] (a `talconfig.yaml` read into [`parts::Parts`]) and [`validate`] (the
//!    cross-field rules over [`parts::Parts`]);
//! 5. [`load`], the entry: it detects the format, reads `talboot.yaml` itself or hands the
//!    document to [`talhelper`], then runs [`validate`] and assembles the [`Inventory`].

pub(crate) mod diag;
pub mod load;
pub mod model;
pub(crate) mod parts;
pub mod power;
pub mod read;
pub mod schematic;
pub mod size;
pub mod storage;
pub mod talhelper;
pub(crate) mod validate;
pub mod yaml;

pub use diag::{Diagnostic, Diagnostics, Loc, Severity};
pub use load::{LoadError, Loaded, load, load_with_env};
pub use model::*;
pub use power::{
    AuthMode, BootMode, Credential, IpmiTarget, PowerConfig, ProxmoxTarget, RedfishTarget,
    SecretRef, TALOS_MIN_MEMORY_MIB, VmShape, WolTarget,
};
pub use storage::{RaidInstall, Storage, SystemVolume, SystemVolumeName};

#[cfg(test)]
mod tests;
