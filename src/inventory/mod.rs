//! The one typed inventory: load, talhelper import, validation.
//!
//! `talboot.yaml` (or a talhelper `talconfig.yaml`) is parsed once into the typed values of
//! [`model`]; every later stage reads those values and never re-parses strings.

pub mod diag;
pub mod model;
pub mod yaml;

pub use diag::{Diagnostic, Diagnostics, Loc, Severity};
pub use model::*;
