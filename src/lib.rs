//! talboot: from power-on to a running Talos Linux cluster.
//!
//! The crate is a library with a thin binary (`src/main.rs`). Modules follow the flow of a
//! machine's life (see `docs/architecture.md`): the typed [`inventory`] is loaded once, the
//! [`store`] persists what happened, and [`cli`] wires the subcommands.

pub mod cli;
pub mod inventory;
pub mod store;
pub mod talos;
