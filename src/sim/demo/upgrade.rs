//! `talboot demo --upgrade`: after hand-off, a Talos minor-version bump rolled across the
//! simulated rack with talboot's real upgrade path ([`crate::daytwo::upgrade`] over the
//! Talos API of the doubles, the rollout record in talboot's store), and what the doubles'
//! own availability record says about it (the most control planes and workers down at
//! once). Also what the `upgrade` benchmark runs.
//!
//! The demo's boot sets are stand-ins, so the pull-and-verify step of `talboot upgrade` is
//! not run here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Demo, DemoError};
use crate::daytwo::run::Outcome;
use crate::daytwo::upgrade::{TalosOps, TalosUpgrade};
use crate::inventory::Version;
use crate::sim::talos::max_down;

/// What a rolling upgrade of the simulated rack did.
#[derive(Debug, Clone)]
pub struct UpgradeReport {
    pub version: Version,
    pub outcome: Outcome,
    pub wall: Duration,
    pub nodes: usize,
    /// From the doubles' record: the most control planes unavailable at one moment.
    pub max_control_planes_down: usize,
    pub max_workers_down: usize,
}

impl std::fmt::Display for UpgradeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Outcome::Finished => {
                write!(f, "upgraded {} nodes to Talos {}", self.nodes, self.version)?
            }
            Outcome::Stopped { node, reason } => write!(
                f,
                "upgrade to Talos {} stopped at {}: {reason}",
                self.version,
                node.as_deref().unwrap_or("the pre-flight check")
            )?,
        }
        write!(
            f,
            " in {:.1}s; at most {} control plane(s) and {} worker(s) down at once (the \
             doubles' own record)",
            self.wall.as_secs_f64(),
            self.max_control_planes_down,
            self.max_workers_down
        )
    }
}

/// The next minor version: v1.13.9 -> v1.14.0.
pub(crate) fn minor_bump(v: &Version) -> Version {
    format!("v{}.{}.0", v.0.major, v.0.minor + 1)
        .parse()
        .expect("a bumped version parses")
}

impl Demo {
    /// Rolls Talos `version` across every node, `worker_concurrency` workers at a time,
    /// printing progress per node when `print`.
    pub(crate) async fn upgrade_talos(
        &self,
        version: &Version,
        worker_concurrency: usize,
        print: bool,
    ) -> Result<UpgradeReport, DemoError> {
        let plan = TalosUpgrade::plan(&self.inventory, version, false, crate::talos::APID_PORT);
        let output: crate::daytwo::upgrade::InstallerOutput = if print {
            Arc::new(|node, line| println!("  {node}: {line}"))
        } else {
            Arc::new(|_, _| {})
        };
        let mut ops = TalosOps::new(plan.clone(), self.relaunch.creds.clone(), output);
        ops.wait = Duration::from_secs(120);
        ops.poll = Duration::from_millis(50);
        let since = Instant::now();
        let outcome = crate::daytwo::upgrade_run::upgrade(
            &plan,
            Arc::new(ops),
            self.rollouts(),
            worker_concurrency,
            &move |line| {
                if print {
                    println!("{line}")
                }
            },
        )
        .await
        .map_err(|e| DemoError::Upgrade(e.to_string()))?;
        let wall = since.elapsed();
        let log = self.cluster.availability();
        Ok(UpgradeReport {
            version: version.clone(),
            outcome,
            wall,
            nodes: plan.nodes.len(),
            max_control_planes_down: max_down(&log, since, true),
            max_workers_down: max_down(&log, since, false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_bump_goes_to_the_next_minor() {
        assert_eq!(
            minor_bump(&"v1.13.9".parse().unwrap()).to_string(),
            "v1.14.0"
        );
    }
}
