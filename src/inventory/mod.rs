//! The one typed inventory: load, talhelper import, validation.
//!
//! `talboot.yaml` (or a talhelper `talconfig.yaml`) is parsed once into the typed values of
//! [`model`]; every later stage reads those values and never re-parses strings. Loading reports
//! every problem at once, each with file, line, column, field path and a hint ([`diag`]).

pub mod diag;
pub mod load;
pub mod model;
pub mod read;
pub mod schematic;
pub mod talhelper;
pub mod validate;
pub mod yaml;

pub use diag::{Diagnostic, Diagnostics, Loc, Severity};
pub use load::{LoadError, Loaded, load, load_with_env};
pub use model::*;

#[cfg(test)]
mod tests;
