//! Day two on the simulated rack, the way an operator does it while `serve` runs: serve's
//! drift watcher ([`Demo::watch_drift`]) and a config change applied without a reboot
//! through the running talboot's admin API ([`Demo::apply_config_change`], what `talboot
//! demo --upgrade` shows after the Talos upgrade): the inventory gains a patch (written to
//! the work directory), every node is rendered again as `talboot gen` renders it, and the
//! rollout goes to serve exactly as `talboot apply --mode no-reboot` sends it when serve
//! holds the store.

use std::time::{Duration, Instant};

use super::{Demo, DemoError};
use crate::daytwo::remote::{ApplyRequest, NodeConfig, RemoteOutcome, RolloutKind, RolloutRequest};
use crate::inventory::{Patch, PatchBody, PatchOrigin};
use crate::sim::talos::max_down;

/// The demo's day-two change: one sysctl on every node, which Talos applies without a
/// reboot (`machine.sysctls` is among the fields `CanApplyImmediate` lets change).
const SYSCTL: (&str, &str) = ("fs.inotify.max_user_watches", "1048576");

/// What one rollout sent through serve's admin API did.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub outcome: RemoteOutcome,
    pub wall: Duration,
    /// Reboots of any node while it ran (the doubles' own count).
    pub reboots: usize,
    /// From the doubles' record: the most control planes unavailable at one moment.
    pub max_control_planes_down: usize,
}

/// What the config change did.
#[derive(Debug, Clone)]
pub struct ConfigChangeReport {
    pub outcome: RemoteOutcome,
    /// The contract the change was rendered at (at v1.14 the v1.13-style patch lands in
    /// `SysctlConfig`, translated by the renderer).
    pub contract: crate::talosfacts::contract::Contract,
    pub wall: Duration,
    /// Reboots of any node while it ran (the doubles' own count).
    pub reboots: usize,
    /// From the doubles' record: the most control planes unavailable at one moment.
    pub max_control_planes_down: usize,
}

impl std::fmt::Display for ConfigChangeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (k, v) = SYSCTL;
        match &self.outcome {
            RemoteOutcome::Finished { nodes, .. } => write!(
                f,
                "applied `machine.sysctls.{k}: \"{v}\"` to {} nodes through serve's admin API \
                 (mode no-reboot, rendered at the {} contract)",
                nodes.len(),
                self.contract
            )?,
            other => write!(f, "the config change through serve ended: {other:?}")?,
        }
        write!(
            f,
            " in {:.1}s; {} reboot(s), at most {} control plane(s) down at once (the doubles' \
             own record)",
            self.wall.as_secs_f64(),
            self.reboots,
            self.max_control_planes_down
        )
    }
}

impl Demo {
    /// Writes stand-in boot sets of Talos `version` into the demo's image cache (`DIR/images`)
    /// as `talboot images pull` would leave them, so `talboot upgrade --talos VERSION
    /// --images DIR/images` finds them ready: the simulation has no Image Factory to pull
    /// from.
    pub fn add_boot_sets(&self, version: &crate::inventory::Version) -> Result<(), DemoError> {
        let mut inv = (*self.inventory).clone();
        inv.cluster.talos_version.value = version.clone();
        let now = crate::events::Clock::now_unix(&crate::events::SystemClock);
        crate::sim::assets::write_boot_sets(&self.relaunch.images, &inv, now)
            .map_err(|e| DemoError::DayTwo(e.cause))
    }

    /// Runs serve's drift watcher against the running talboot (its event bus and the admin
    /// API's drift board), every `interval`, as one of talboot's tasks: it stops with talboot.
    pub fn watch_drift(&self, interval: Duration) {
        let Some(running) = self.running.as_ref() else {
            return;
        };
        let (connector, targets) = crate::daytwo::drift::targets(
            &self.inventory,
            self.relaunch.renderer.as_ref(),
            &self.relaunch.creds,
            crate::talos::APID_PORT,
        );
        running.watch_drift(crate::appliance::DriftPlan {
            connector,
            targets,
            interval,
        });
    }

    /// Adds the demo's patch to `inv` (the inventory as the rack now runs it: after an
    /// upgrade, at the new `talosVersion`), renders every node again and applies the change
    /// with mode no-reboot through the running talboot's admin API, printing its progress
    /// when `print`.
    pub(crate) async fn apply_config_change(
        &self,
        inv: &crate::inventory::Inventory,
        worker_concurrency: usize,
        print: bool,
    ) -> Result<ConfigChangeReport, DemoError> {
        let (k, v) = SYSCTL;
        let file = self.workdir.join("config/patches/demo-day-two.yaml");
        let text = format!(
            "# talboot demo --upgrade: a day-two change Talos applies without a reboot.\n\
             machine:\n  sysctls:\n    {k}: \"{v}\"\n"
        );
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| DemoError::DayTwo(e.to_string()))?;
        }
        std::fs::write(&file, &text).map_err(|e| DemoError::DayTwo(e.to_string()))?;
        let doc: yaml_serde::Value =
            yaml_serde::from_str(&text).map_err(|e| DemoError::DayTwo(e.to_string()))?;
        let mut inv = inv.clone();
        inv.cluster.patches.push(Patch {
            origin: PatchOrigin::File(file),
            body: PatchBody::Merge(vec![doc]),
            keys: Default::default(),
        });
        // The schema of the contract the changed inventory renders.
        let contract = crate::machineconfig::render::contract(&inv)
            .map_err(|e| DemoError::DayTwo(e.to_string()))?;
        let schema = crate::machineconfig::schema::embedded_for(contract);
        let rendered = crate::machineconfig::rendered::render_all(&inv, &self.secrets, &schema)
            .map_err(|p| DemoError::DayTwo(p.join("; ")))?;
        let sent = self
            .apply_through_serve(rendered.configs, worker_concurrency, print)
            .await?;
        Ok(ConfigChangeReport {
            outcome: sent.outcome,
            contract,
            wall: sent.wall,
            reboots: sent.reboots,
            max_control_planes_down: sent.max_control_planes_down,
        })
    }

    /// Sends `configs` (`(node, config)`) as one rollout with mode no-reboot to the running
    /// talboot's admin API, as `talboot apply --mode no-reboot` does while serve holds the
    /// store, and follows it to the end.
    pub(super) async fn apply_through_serve(
        &self,
        configs: Vec<(String, String)>,
        worker_concurrency: usize,
        print: bool,
    ) -> Result<Sent, DemoError> {
        let request = RolloutRequest {
            worker_concurrency,
            kind: RolloutKind::Apply(ApplyRequest {
                mode: "no-reboot".into(),
                try_timeout_secs: None,
                gate_timeout_secs: 60,
                gate_poll_ms: 50,
                configs: configs
                    .into_iter()
                    .map(|(node, rendered)| NodeConfig { node, rendered })
                    .collect(),
            }),
        };
        let reboots = |d: &Demo| {
            d.nodes
                .iter()
                .filter_map(|n| n.talos())
                .map(|t| t.reboot_calls())
                .sum::<usize>()
        };
        let before = reboots(self);
        let since = Instant::now();
        crate::install_crypto_provider();
        let client = crate::daytwo::remote::client::http_client(None)
            .map_err(|e| DemoError::DayTwo(e.to_string()))?;
        let outcome =
            crate::daytwo::remote::client::follow(&client, &self.admin_url, &request, |line| {
                if print {
                    println!("  {line}");
                }
            })
            .await
            .map_err(|e| DemoError::DayTwo(e.to_string()))?;
        let wall = since.elapsed();
        let log = self.cluster.availability();
        Ok(Sent {
            outcome,
            wall,
            reboots: reboots(self) - before,
            max_control_planes_down: max_down(&log, since, true),
        })
    }
}
