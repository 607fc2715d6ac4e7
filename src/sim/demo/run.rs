//! `talboot demo` from start to summary: hand-off, then what the flags add (a rebuild of
//! one node, a rolling Talos upgrade and a config change through serve), then the summary,
//! or with `--stay` the rack kept serving for the dashboard.

use std::collections::BTreeMap;
use std::time::Duration;

use super::prepare::{argocd_enabled, cilium_enabled};
use super::{Demo, DemoError, DemoOptions, upgrade};
use crate::daytwo::run::Outcome;
use crate::inventory::Inventory;

/// What the hand-off line says was installed.
fn installed_addons(inv: &Inventory) -> &'static str {
    match (cilium_enabled(inv), argocd_enabled(inv)) {
        (true, true) => "Cilium and Argo CD installed",
        (true, false) => "Cilium installed",
        (false, true) => "Argo CD installed (the CNI is the operator's)",
        (false, false) => "no add-ons in the inventory",
    }
}

/// ApplyConfiguration calls per machine that has booted Talos.
fn apply_counts(demo: &Demo) -> BTreeMap<String, usize> {
    demo.nodes
        .iter()
        .filter_map(|n| n.talos().map(|t| (n.machine.name.clone(), t.apply_calls())))
        .collect()
}

/// Runs the demo to the end: hand-off, the optional rebuild, the optional rolling Talos
/// upgrade (a minor-version bump, `upgrade` workers at a time), the summary.
pub async fn run(
    opts: DemoOptions,
    timeout: Duration,
    rebuild: Option<String>,
    upgrade: Option<usize>,
) -> Result<String, DemoError> {
    run_and_hold(opts, timeout, rebuild, upgrade, None).await
}

/// What ends a demo that keeps serving after its summary (`demo --stay`): Ctrl-C, SIGTERM.
pub(crate) type Hold = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// [`run`], and with `hold` print the summary, keep talboot (and the simulated rack) running
/// for the dashboard until `hold` completes, then stop; the summary returned is then empty.
pub(crate) async fn run_and_hold(
    opts: DemoOptions,
    timeout: Duration,
    rebuild: Option<String>,
    upgrade: Option<usize>,
    hold: Option<Hold>,
) -> Result<String, DemoError> {
    let print = opts.print_events;
    let demo = Demo::start(opts).await?;
    if let Some(name) = &rebuild
        && demo.inventory.node(name).is_none()
    {
        let names: Vec<String> = demo.nodes.iter().map(|n| n.machine.name.clone()).collect();
        demo.shutdown().await;
        return Err(DemoError::UnknownNode(name.clone(), names.join(", ")));
    }
    let result = async {
        demo.wait_handed_off(timeout).await?;
        let mut out = format!(
            "\nhanded off after {:.1}s: {} nodes Ready, {}\n",
            demo.elapsed().as_secs_f64(),
            demo.nodes.len(),
            installed_addons(&demo.inventory)
        );
        if let Some(name) = &rebuild {
            out.push_str(&rebuild_node(&demo, name, timeout).await?);
        }
        if let Some(workers) = upgrade {
            out.push_str(&upgrade_and_change(&demo, workers, print).await?);
        }
        out.push_str(&demo.summary());
        Ok(out)
    }
    .await;
    let result = match (result, hold) {
        (Ok(summary), Some(hold)) => {
            println!("{summary}");
            println!(
                "talboot keeps serving the simulated rack; dashboard at {}/ (Ctrl-C to stop)",
                demo.admin_url
            );
            hold.await;
            Ok(String::new())
        }
        (result, _) => result,
    };
    demo.shutdown().await;
    result
}

/// `--rebuild`: asks talboot to rebuild `name` as `talboot node rebuild` does, waits for the
/// reset and for the node to come back Ready, and says which nodes got their config again
/// (only the rebuilt one, if talboot leaves the rest alone).
async fn rebuild_node(demo: &Demo, name: &str, timeout: Duration) -> Result<String, DemoError> {
    let before = apply_counts(demo);
    let resets = |d: &Demo| {
        d.node(name)
            .and_then(|n| n.talos())
            .map_or(0, |t| t.reset_calls())
    };
    let resets_before = resets(demo);
    let t0 = demo.elapsed();
    demo.request_rebuild(name).await?;
    // The provisioner resets the node first; then it has to come back Ready.
    demo.wait_until(timeout, |d| resets(d) > resets_before)
        .await?;
    demo.wait_node_ready(name, timeout).await?;
    let after = apply_counts(demo);
    let touched: Vec<&String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .map(|(k, _)| k)
        .collect();
    Ok(format!(
        "rebuilt {name} in {:.1}s; configs re-applied to: {}\n",
        (demo.elapsed() - t0).as_secs_f64(),
        touched
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// `--upgrade`: the rolling Talos minor-version bump, then the config change without a
/// reboot through serve's admin API; either one stopping, or the change rebooting a node,
/// fails the run with its report.
async fn upgrade_and_change(demo: &Demo, workers: usize, print: bool) -> Result<String, DemoError> {
    let mut out = String::new();
    let to = upgrade::minor_bump(&demo.inventory.cluster.talos_version.value);
    if print {
        println!(
            "\nrolling Talos {} -> {to} across the rack (one control plane at a time, \
             {workers} worker(s) at once)",
            demo.inventory.cluster.talos_version.value
        );
    }
    let report = demo.upgrade_talos(&to, workers, print).await?;
    out.push_str(&format!("{report}\n"));
    if let Outcome::Stopped { .. } = report.outcome {
        return Err(DemoError::Upgrade(report.to_string()));
    }
    // The inventory as the rack now runs it: the operator's next commit moves talosVersion.
    let mut inv = (*demo.inventory).clone();
    inv.cluster.talos_version.value = to.clone();
    let contract = |inv: &Inventory| {
        crate::machineconfig::render::contract(inv).map_err(|e| DemoError::DayTwo(e.to_string()))
    };
    let (from, next) = (contract(&demo.inventory)?, contract(&inv)?);
    if from != next {
        if print {
            println!(
                "\nthe configs keep their {from} contract on Talos {to}; migrating them to \
                 {next} as `talboot plan --contract {next}` and `talboot apply --contract \
                 {next}` do"
            );
        }
        let migration = demo.migrate_contract(&inv, from, workers, print).await?;
        out.push_str(&format!("{migration}\n"));
        if !migration.finished || migration.reboots > 0 || migration.now_at != migration.nodes {
            return Err(DemoError::DayTwo(migration.to_string()));
        }
    }
    if print {
        println!(
            "\napplying a config change without reboot through talboot serve's admin \
             API (as `talboot apply --mode no-reboot` does while serve runs)"
        );
    }
    let change = demo.apply_config_change(&inv, workers, print).await?;
    out.push_str(&format!("{change}\n"));
    if !matches!(
        change.outcome,
        crate::daytwo::remote::RemoteOutcome::Finished { .. }
    ) || change.reboots > 0
    {
        return Err(DemoError::DayTwo(change.to_string()));
    }
    Ok(out)
}
