//! Talos machine configuration: rendering the base documents for a machine and patching them.
//!
//! This module owns everything that turns the typed inventory into the multi-document YAML a
//! Talos node receives. [`patch`] is the pure patch engine (Talos strategic merge rules and
//! RFC 6902 JSON patches over a [`patch::ConfigBundle`]).

pub mod patch;
