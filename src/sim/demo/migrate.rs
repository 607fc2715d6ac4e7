//! `talboot demo --upgrade` across a contract: after the rack is upgraded to a Talos minor
//! whose machine-config contract is newer than the one its configs were written in (v1.13 to
//! v1.14), the configs keep their contract, as on real Talos; the demo then migrates them the
//! way an operator does. It plans every node at the new contract with the code `talboot plan
//! --contract v1.14` runs ([`crate::daytwo::contract::resolve`] and
//! [`crate::daytwo::contract::plan_resolved`] against the nodes' running configs), refuses
//! to go on if a node cannot be planned, rolls the configs out through serve's admin API as
//! `talboot apply --contract v1.14` does while serve holds the store, and reads every node's
//! running config back to count the nodes whose config is now in the new contract.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Demo, DemoError};
use crate::daytwo::contract::{ContractChoice, Resolution, detect, plan_resolved, resolve};
use crate::daytwo::diff::DocChange;
use crate::inventory::Inventory;
use crate::talosfacts::contract::Contract;

/// What the migration did.
#[derive(Debug, Clone)]
pub struct MigrationReport {
    pub from: Contract,
    pub to: Contract,
    /// Nodes the plan moved from `from` to `to`.
    pub planned: usize,
    /// Field changes plus added and removed documents, summed over the planned nodes.
    pub changes: usize,
    /// Documents the plan adds on at least one node (`v1alpha1/UnattendedInstallConfig`).
    pub added: BTreeSet<String>,
    /// Whether serve's rollout finished.
    pub finished: bool,
    pub outcome: String,
    pub wall: Duration,
    pub reboots: usize,
    pub max_control_planes_down: usize,
    /// Nodes whose running config, read back after the rollout, is in `to`'s contract.
    pub now_at: usize,
    pub nodes: usize,
}

impl std::fmt::Display for MigrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (from, to) = (self.from, self.to);
        if !self.finished {
            return write!(
                f,
                "the migration to the {to} contract ended: {}",
                self.outcome
            );
        }
        write!(
            f,
            "migrated {} nodes from the {from} to the {to} contract (`plan --contract {to}`: \
             {} change(s); documents added: {}) through serve's admin API (mode no-reboot) in \
             {:.1}s; {} of {} nodes now run {to}-contract configs (read back from each node); \
             {} reboot(s), at most {} control plane(s) down at once (the doubles' own record)",
            self.planned,
            self.changes,
            self.added.iter().cloned().collect::<Vec<_>>().join(", "),
            self.wall.as_secs_f64(),
            self.now_at,
            self.nodes,
            self.reboots,
            self.max_control_planes_down
        )
    }
}

impl Demo {
    /// Migrates every node to the contract `inv` (the inventory at the version the rack now
    /// runs) renders, printing the plan's summary and the rollout's progress when `print`.
    pub(crate) async fn migrate_contract(
        &self,
        inv: &Inventory,
        from: Contract,
        worker_concurrency: usize,
        print: bool,
    ) -> Result<MigrationReport, DemoError> {
        let fail = |m: String| DemoError::DayTwo(m);
        let to = crate::machineconfig::render::contract(inv).map_err(|e| fail(e.to_string()))?;
        let schema = crate::machineconfig::schema::embedded_for(to);
        let rendered =
            crate::machineconfig::rendered::render_all_at(inv, &self.secrets, &schema, to)
                .map_err(|p| {
                    fail(format!(
                        "the inventory does not render at {to}: {}",
                        p.join("; ")
                    ))
                })?;
        let configs: Vec<crate::daytwo::remote::NodeConfig> = rendered
            .configs
            .iter()
            .map(|(node, rendered)| crate::daytwo::remote::NodeConfig {
                node: node.clone(),
                rendered: rendered.clone(),
            })
            .collect();
        let targets = crate::daytwo::remote::apply_targets(inv, crate::talos::APID_PORT, configs)
            .map_err(|e| fail(e.to_string()))?;
        let conn = crate::daytwo::remote::connector(&self.relaunch.creds, &targets);

        // The plan, as `talboot plan --contract` makes it: against what each node runs.
        let mut renderings = crate::daytwo::contract::Renderings::default();
        renderings.insert(to, Ok(rendered.configs.clone()));
        let resolved = resolve(&conn, &targets, &renderings, ContractChoice::At(to)).await;
        let plans = plan_resolved(&conn, &resolved).await;
        let mut report = MigrationReport {
            from,
            to,
            planned: 0,
            changes: 0,
            added: BTreeSet::new(),
            finished: false,
            outcome: String::new(),
            wall: Duration::ZERO,
            reboots: 0,
            max_control_planes_down: 0,
            now_at: 0,
            nodes: targets.len(),
        };
        for (r, plan) in resolved.iter().zip(&plans) {
            let diff = match (&r.resolution, &plan.diff) {
                (Resolution::At { .. }, Ok(diff)) => diff,
                (_, Err(e)) => return Err(fail(format!("{}: cannot be planned: {e}", plan.name))),
                (_, Ok(_)) => return Err(fail(format!("{}: not resolved", plan.name))),
            };
            if matches!(r.resolution, Resolution::At { contract, running } if contract != running) {
                report.planned += 1;
            }
            report.changes += diff.len();
            for d in &diff.docs {
                if let DocChange::Added { doc } = d {
                    report.added.insert(doc.clone());
                }
            }
        }
        if print {
            println!(
                "  plan --contract {to}: {} node(s) move from {from}, {} change(s); documents \
                 added: {}",
                report.planned,
                report.changes,
                report.added.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }

        let sent = self
            .apply_through_serve(rendered.configs, worker_concurrency, print)
            .await?;
        report.finished = matches!(
            sent.outcome,
            crate::daytwo::remote::RemoteOutcome::Finished { .. }
        );
        report.outcome = format!("{:?}", sent.outcome);
        report.wall = sent.wall;
        report.reboots = sent.reboots;
        report.max_control_planes_down = sent.max_control_planes_down;
        report.now_at = self
            .nodes
            .iter()
            .filter_map(|n| n.talos()?.running_config())
            .filter(|config| detect(config).ok() == Some(to))
            .count();
        Ok(report)
    }
}
