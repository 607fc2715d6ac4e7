//! Day two: changes to a running cluster (`talboot plan`, `apply`, `upgrade`) and drift.
//!
//! Every rack-wide change goes through one rolling engine, [`rollout`], which decides which
//! node changes next and when a health gate must pass; the per-operation modules say what a
//! change of one node is (apply a config, upgrade Talos, upgrade a Kubernetes component).
//! [`run`] drives the engine for all of them and keeps its record in the store, the same for
//! the CLI, serve's rollout jobs and the demo.
//! `apply` and `upgrade --talos` share one etcd health gate, [`gate`].

pub mod apply;
pub(crate) mod contract;
pub mod diff;
pub mod drift;
pub mod gate;
pub mod installer_pull;
pub(crate) mod k8s_version;
pub(crate) mod manifest_sync;
pub mod manifests;
pub mod plan;
pub(crate) mod remote;
pub mod rollout;
pub mod run;
pub mod upgrade;
pub mod upgrade_k8s;
pub(crate) mod upgrade_run;
