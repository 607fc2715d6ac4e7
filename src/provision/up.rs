//! The decisions of the `up` pipeline (secrets, images, configs, then serving until the
//! cluster is handed off): for each step, whether it runs or is already done and the line
//! that says so, from facts the caller read; and, once serving, when the cluster counts as
//! handed off and where it stands otherwise. Below `cli` because anything that drives a
//! first run (the CLI's `up`, a future admin API) makes the same choices from the same facts.
//!
//! Pure apart from the reads of the artifact cache and the state store it is handed;
//! writing, pulling and printing stay with the caller.

use std::path::Path;
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::artifacts::{self, ArtifactError, Catalog, SetId};
use crate::inventory::Inventory;
use crate::store::{self, ClusterStep, NodePhase, StepRecord, Store, StoreError};

/// What one step does: run, or skip because it is already done (the line says why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Do it; what will be done.
    Run(String),
    /// Already done; why it counts as done.
    Skip(String),
}

/// The steps of `up`, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The secrets bundle.
    Secrets,
    /// The boot images.
    Images,
    /// Rendered configs and the admin talosconfig.
    Configs,
    /// Serve and provision to hand-off.
    Provision,
}

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::Secrets => "secrets",
            Step::Images => "images",
            Step::Configs => "configs",
            Step::Provision => "provision",
        }
    }
}

/// One line `up` printed about a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLine {
    /// The step.
    pub step: Step,
    /// Whether it was skipped as already done.
    pub skipped: bool,
    /// What was done or why it was skipped.
    pub text: String,
}

impl std::fmt::Display for StepLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.skipped { "skipped: " } else { "" };
        write!(f, "{:<10} {verb}{}", self.step.name(), self.text)
    }
}

/// The secrets step: `exists` is whether `path` is there.
pub(crate) fn secrets_step(path: &Path, exists: bool, recipients: &[String]) -> Decision {
    if exists {
        Decision::Skip(format!(
            "{} exists (the bundle is never overwritten; every node's identity comes from it)",
            path.display()
        ))
    } else {
        Decision::Run(format!(
            "no bundle at {}: generating one for {}",
            path.display(),
            recipient_list(recipients)
        ))
    }
}

/// The age recipients of a new bundle, as the secrets step's lines name them.
pub(crate) fn recipient_list(recipients: &[String]) -> String {
    match recipients {
        [] => "no recipients".into(),
        [one] => format!("1 recipient ({one})"),
        many => format!("{} recipients ({})", many.len(), many.join(", ")),
    }
}

/// The boot sets the inventory needs, split into those the cache in `dir` holds intact with
/// what their nodes boot (the PXE files, or a `secureBoot` node's signed UKI; catalogued,
/// sizes and digests verified) and those it lacks: the facts of [`images_step`].
pub(crate) fn cached_sets(
    dir: &Path,
    inv: &Inventory,
) -> Result<(Vec<SetId>, Vec<artifacts::Requirement>), ArtifactError> {
    let catalog = Catalog::load(dir)?;
    let (mut present, mut missing) = (Vec::new(), Vec::new());
    for need in artifacts::requirements(inv) {
        let intact = catalog.find(&need.id).is_some()
            && artifacts::verify_for(dir, &catalog, &need.id, need.boots.iter().copied()).is_ok();
        if intact {
            present.push(need.id);
        } else {
            missing.push(need);
        }
    }
    Ok((present, missing))
}

/// The images step: the sets the inventory needs that the cache has (verified) and lacks;
/// `source` is where missing ones come from (a factory URL, or a folder to import from).
pub(crate) fn images_step(
    dir: &Path,
    present: &[SetId],
    missing: &[SetId],
    source: &str,
) -> Decision {
    if missing.is_empty() {
        Decision::Skip(format!(
            "{} in {} (sizes and SHA-256 verified)",
            set_list(present),
            dir.display()
        ))
    } else {
        Decision::Run(format!("fetching {} from {source}", set_list(missing)))
    }
}

fn set_list(sets: &[SetId]) -> String {
    let names: Vec<String> = sets.iter().map(ToString::to_string).collect();
    match names.len() {
        1 => format!("boot set {}", names[0]),
        _ => format!("boot sets {}", names.join(", ")),
    }
}

/// The configs step: the nodes whose rendered config in `dir` is missing or differs, out of
/// `total`, and whether the admin talosconfig `talosconfig` must be written (missing, or
/// the secrets bundle is new).
pub(crate) fn configs_step(
    dir: &Path,
    stale: &[String],
    total: usize,
    talosconfig: &Path,
    talosconfig_missing: bool,
) -> Decision {
    if stale.is_empty() && !talosconfig_missing {
        return Decision::Skip(format!(
            "{} holds the {total} node configs as they render now, and {} is there",
            dir.display(),
            talosconfig.display()
        ));
    }
    let mut parts = Vec::new();
    if !stale.is_empty() {
        parts.push(format!(
            "writing {} of {total} node configs to {} ({})",
            stale.len(),
            dir.display(),
            stale.join(", ")
        ));
    }
    if talosconfig_missing {
        parts.push(format!(
            "writing the admin talosconfig and kubeconfig to {}",
            dir.display()
        ));
    }
    Decision::Run(parts.join("; "))
}

/// The provisioning step from the persisted cluster step and node phases.
pub(crate) fn provision_step(
    record: Option<&StepRecord>,
    ready: usize,
    total: usize,
    stay: bool,
) -> Decision {
    match record {
        Some(r) if r.step == ClusterStep::HandedOff => {
            let when = timestamp(r.since_unix);
            if stay {
                Decision::Run(format!(
                    "the cluster was handed off at {when}; serving (--stay) until stopped"
                ))
            } else {
                Decision::Skip(format!("the cluster was handed off at {when}"))
            }
        }
        Some(r) => Decision::Run(format!(
            "resuming after cluster step {} ({ready} of {total} nodes ready); serving until \
             hand-off",
            r.step
        )),
        None if ready > 0 => Decision::Run(format!(
            "resuming ({ready} of {total} nodes ready, no cluster step yet); serving until \
             hand-off"
        )),
        None => Decision::Run(format!(
            "serving {total} nodes; push provisioning until hand-off"
        )),
    }
}

fn timestamp(unix: u64) -> String {
    OffsetDateTime::from_unix_timestamp(unix as i64)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// The persisted cluster step and how many of the inventory's nodes are Ready: the facts of
/// [`provision_step`].
pub(crate) fn cluster_state(
    inv: &Inventory,
    store: &dyn Store,
) -> Result<(Option<StepRecord>, usize), StoreError> {
    let record = store::load_step_record(store)?;
    let records = store.nodes()?;
    let ready = inv
        .nodes
        .iter()
        .filter(|n| {
            records
                .iter()
                .any(|r| r.name == n.name.value && r.phase == NodePhase::Ready)
        })
        .count();
    Ok((record, ready))
}

/// Whether the cluster is handed off: the step record says so and its timeline event (written
/// after the record) is there, so the printed progress is complete.
pub(crate) fn handed_off(store: &dyn Store) -> bool {
    store::load_step_record(store)
        .ok()
        .flatten()
        .is_some_and(|r| r.step == ClusterStep::HandedOff)
        && store
            .last_event(store::CLUSTER_TIMELINE)
            .ok()
            .flatten()
            .is_some_and(|e| e.detail.contains("-> handed-off"))
}

/// Where provisioning stands, for a timeout or an interruption.
pub(crate) fn where_it_is(inv: &Inventory, store: &dyn Store) -> String {
    let step = match store::load_step_record(store).ok().flatten() {
        Some(r) => format!(
            "last cluster step {}{}",
            r.step,
            r.last_error
                .map(|e| format!(", the next one failing: {e}"))
                .unwrap_or_default()
        ),
        None => "no cluster step completed".into(),
    };
    let records = store.nodes().unwrap_or_default();
    let waiting: Vec<String> = inv
        .nodes
        .iter()
        .filter_map(|n| {
            let phase = records
                .iter()
                .find(|r| r.name == n.name.value)
                .map_or(NodePhase::Unknown, |r| r.phase);
            (phase != NodePhase::Ready).then(|| format!("{} {phase}", n.name.value))
        })
        .collect();
    if waiting.is_empty() {
        step
    } else {
        format!("{step}; nodes not ready: {}", waiting.join(", "))
    }
}

/// How waiting for the hand-off ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOffWait {
    /// The cluster is handed off.
    HandedOff,
    /// `deadline` passed first.
    TimedOut,
    /// `stop` was cancelled first.
    Stopped,
}

/// Polls `store` until the cluster is handed off (see [`handed_off`]), `deadline` passes or
/// `stop` is cancelled: the serving step's end, whoever serves.
pub(crate) async fn wait_for_hand_off(
    store: &dyn Store,
    deadline: Option<Instant>,
    stop: &CancellationToken,
) -> HandOffWait {
    loop {
        if handed_off(store) {
            return HandOffWait::HandedOff;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return HandOffWait::TimedOut;
        }
        tokio::select! {
            _ = stop.cancelled() => return HandOffWait::Stopped,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory;

    /// A `secureBoot` node's set counts as missing until the cache holds its signed UKI, and
    /// what is missing says so, so `up` pulls the UKI and not only the PXE files.
    #[test]
    fn a_secure_boot_nodes_set_needs_its_signed_uki() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/lab.yaml");
        let mut inv = inventory::load_with_env(&path, &std::collections::BTreeMap::new())
            .unwrap()
            .inventory;
        let dir = tempfile::tempdir().unwrap();
        let (_, missing) = cached_sets(dir.path(), &inv).unwrap();
        assert!(
            missing
                .iter()
                .all(|m| !m.boots.contains(&artifacts::Boot::SecureBootUki))
        );
        for n in &mut inv.nodes {
            n.secure_boot = Some(inventory::Spanned::new(true, n.name.loc.clone()));
        }
        let (present, missing) = cached_sets(dir.path(), &inv).unwrap();
        assert!(present.is_empty());
        assert!(
            missing
                .iter()
                .any(|m| m.boots.contains(&artifacts::Boot::SecureBootUki)),
            "{missing:?}"
        );
    }

    #[test]
    fn each_step_skips_exactly_when_its_facts_say_done() {
        let p = Path::new("secrets/c.age");
        let r = vec!["age1abc".to_owned()];
        assert!(
            matches!(secrets_step(p, true, &r), Decision::Skip(t) if t.contains("secrets/c.age exists"))
        );
        assert!(
            matches!(secrets_step(p, false, &r), Decision::Run(t) if t.contains("1 recipient (age1abc)"))
        );

        let v: inventory::Version = "v1.13.9".parse().unwrap();
        let a = SetId::new(&v, inventory::VANILLA_SCHEMATIC, inventory::Arch::Amd64);
        let b = SetId::new(&v, inventory::VANILLA_SCHEMATIC, inventory::Arch::Arm64);
        let d = Path::new("images");
        assert!(matches!(
            images_step(d, &[a.clone(), b.clone()], &[], "f"),
            Decision::Skip(_)
        ));
        assert!(
            matches!(images_step(d, std::slice::from_ref(&a), std::slice::from_ref(&b), "https://f"),
                Decision::Run(t) if t.contains("arm64") && !t.contains("amd64") && t.ends_with("from https://f"))
        );

        let out = Path::new("out");
        let tc = Path::new("out/talosconfig");
        assert!(matches!(
            configs_step(out, &[], 3, tc, false),
            Decision::Skip(_)
        ));
        assert!(matches!(configs_step(out, &["n2".into()], 3, tc, false),
            Decision::Run(t) if t.contains("1 of 3 node configs") && !t.contains("talosconfig")));
        assert!(matches!(configs_step(out, &[], 3, tc, true),
            Decision::Run(t) if t.contains("talosconfig") && !t.contains("node configs")));

        let rec = |step| StepRecord {
            step,
            since_unix: 1_796_133_600,
            reason: String::new(),
            last_error: None,
            attempts: 0,
        };
        let done = rec(ClusterStep::HandedOff);
        assert_eq!(
            provision_step(Some(&done), 3, 3, false),
            Decision::Skip("the cluster was handed off at 2026-12-01T14:00:00Z".into())
        );
        assert!(
            matches!(provision_step(Some(&done), 3, 3, true), Decision::Run(t) if t.contains("--stay"))
        );
        assert!(
            matches!(provision_step(Some(&rec(ClusterStep::Bootstrapped)), 2, 3, false),
            Decision::Run(t) if t.starts_with("resuming after cluster step bootstrapped (2 of 3"))
        );
        assert!(
            matches!(provision_step(None, 1, 3, false), Decision::Run(t) if t.starts_with("resuming"))
        );
        assert!(
            matches!(provision_step(None, 0, 3, false), Decision::Run(t) if t.starts_with("serving 3 nodes"))
        );
    }
}
