//! talboot's HTTP side: iPXE scripts per machine, boot artifacts, machine configs for pull
//! delivery, the JSON API and metrics, on one axum router.

pub mod assets;
pub mod script;
