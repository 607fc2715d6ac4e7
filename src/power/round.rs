//! The power-on round (`serve --power-on`, the same choice `talboot rack up` makes): which
//! inventory nodes get powered on, with which requests, and carrying that out once. Planning
//! is pure; the round itself runs as one of the appliance's tasks.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::inventory::Inventory;
use crate::store::NodePhase;

use super::dispatch::PowerRequest;
use super::{BootDevice, BootPersistence, PowerAction, PowerDriver};

/// Whether `rack up` powers a node in `phase` on: never seen, or failed (an operator retry);
/// a node booting, being configured, installed or rebuilt is already on its way.
pub(crate) fn needs_power_on(phase: Option<NodePhase>) -> bool {
    matches!(phase, None | Some(NodePhase::Unknown | NodePhase::Failed))
}

/// The steps `rack up` takes for one node, in order.
pub(crate) fn rack_up_steps(driver_can_boot: bool) -> Vec<PowerRequest> {
    let mut steps = Vec::new();
    if driver_can_boot {
        steps.push(PowerRequest::Boot(
            BootDevice::Network,
            BootPersistence::Once,
        ));
    }
    steps.push(PowerRequest::Set(PowerAction::On));
    steps
}

/// One node's part of a power-on round (`serve --power-on`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PowerOnStep {
    /// Left alone, and why.
    Skip { node: String, why: String },
    /// Powered on with these requests, in order.
    PowerOn {
        node: String,
        steps: Vec<PowerRequest>,
    },
}

/// The power-on round for the inventory in order: the nodes `rack up` would take (not
/// provisioned yet, see [`needs_power_on`]) that have a usable driver (`kinds`: node name to
/// driver kind, for the nodes whose credentials resolved), each with a one-time network
/// boot first where the driver can choose the boot device.
pub(crate) fn power_on_plan(
    inv: &Inventory,
    phases: &BTreeMap<String, NodePhase>,
    kinds: &BTreeMap<String, &'static str>,
) -> Vec<PowerOnStep> {
    inv.nodes
        .iter()
        .map(|node| {
            let name = node.name.as_str().to_owned();
            let phase = phases.get(&name).copied();
            if !needs_power_on(phase) {
                let why = phase.map(|p| p.as_str()).unwrap_or("unknown").to_owned();
                return PowerOnStep::Skip { node: name, why };
            }
            let Some(config) = &node.power else {
                let why = "no power controller in the inventory".to_owned();
                return PowerOnStep::Skip { node: name, why };
            };
            match kinds.get(&name) {
                None => PowerOnStep::Skip {
                    node: name,
                    why: "its power credentials did not resolve (see the warning above)".into(),
                },
                Some(_) => PowerOnStep::PowerOn {
                    node: name,
                    steps: rack_up_steps(config.can_set_boot_device()),
                },
            }
        })
        .collect()
}

/// `serve --power-on`: carry out `plan` once, `stagger` between two nodes' power-on (to
/// limit inrush), each answer (or failure) a `power.action` event on the node's timeline;
/// a node whose step fails gets no further step. Stops early when serve shuts down.
pub(crate) async fn power_on_round(
    plan: Vec<PowerOnStep>,
    drivers: std::sync::Arc<BTreeMap<String, PowerDriver>>,
    stagger: Duration,
    bus: crate::events::EventBus,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut first = true;
    for step in plan {
        let (node, steps) = match step {
            PowerOnStep::Skip { node, why } => {
                tracing::info!(%node, "power-on: skipped ({why})");
                continue;
            }
            PowerOnStep::PowerOn { node, steps } => (node, steps),
        };
        let Some(driver) = drivers.get(&node) else {
            continue;
        };
        if !first && !stagger.is_zero() {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(stagger) => {}
            }
        }
        first = false;
        for req in steps {
            let r = tokio::select! {
                () = cancel.cancelled() => return,
                r = driver.run(req) => r,
            };
            let detail = match &r {
                Ok(reply) => reply.to_string(),
                Err(e) => format!("failed: {e}"),
            };
            bus.publish(&node, crate::events::EventKind::Power, detail);
            if r.is_err() {
                break;
            }
        }
    }
    tracing::info!("power-on: round done");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory;

    #[test]
    fn rack_up_takes_only_nodes_not_provisioned() {
        assert!(needs_power_on(None));
        assert!(needs_power_on(Some(NodePhase::Unknown)));
        assert!(needs_power_on(Some(NodePhase::Failed)));
        for p in [
            NodePhase::Booting,
            NodePhase::Maintenance,
            NodePhase::Configuring,
            NodePhase::Installing,
            NodePhase::Ready,
            NodePhase::Rebuilding,
        ] {
            assert!(!needs_power_on(Some(p)), "{p:?}");
        }
    }

    #[test]
    fn rack_up_sets_a_one_time_network_boot_before_power_on() {
        assert_eq!(
            rack_up_steps(true),
            [
                PowerRequest::Boot(BootDevice::Network, BootPersistence::Once),
                PowerRequest::Set(PowerAction::On)
            ]
        );
        assert_eq!(rack_up_steps(false), [PowerRequest::Set(PowerAction::On)]);
    }

    const INV: &str = "cluster:
  name: t
  talosVersion: v1.13.9
  kubernetesVersion: 1.36.3
  endpoint: https://10.0.40.11:6443
network:
  interfaces: [br0]
  subnet: 10.0.40.0/24
nodes:
  - name: cp-1
    mac: bc:24:11:00:00:01
    role: controlplane
    address: 10.0.40.11/24
    installDisk: /dev/sda
  - name: wk-bmc
    mac: bc:24:11:00:00:02
    role: worker
    address: 10.0.40.21/24
    installDisk: /dev/sda
    power: {kind: ipmi, host: 10.0.0.2, user: admin, passwordEnv: X}
  - name: wk-wol
    mac: bc:24:11:00:00:03
    role: worker
    address: 10.0.40.22/24
    installDisk: /dev/sda
    power: {kind: wol}
  - name: wk-done
    mac: bc:24:11:00:00:04
    role: worker
    address: 10.0.40.23/24
    installDisk: /dev/sda
    power: {kind: ipmi, host: 10.0.0.4, user: admin, passwordEnv: X}
  - name: wk-nocreds
    mac: bc:24:11:00:00:05
    role: worker
    address: 10.0.40.24/24
    installDisk: /dev/sda
    power: {kind: ipmi, host: 10.0.0.5, user: admin, passwordEnv: Y}
";

    #[test]
    fn power_on_round_takes_unprovisioned_nodes_with_a_usable_driver_in_inventory_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("talboot.yaml");
        std::fs::write(&p, INV).unwrap();
        let inv = inventory::load_with_env(&p, &BTreeMap::new())
            .unwrap()
            .inventory;
        let phases = BTreeMap::from([
            ("wk-done".to_owned(), NodePhase::Ready),
            ("wk-bmc".to_owned(), NodePhase::Failed),
        ]);
        let kinds = BTreeMap::from([
            ("wk-bmc".to_owned(), "ipmi"),
            ("wk-wol".to_owned(), "wol"),
            ("wk-done".to_owned(), "ipmi"),
        ]);
        let plan = power_on_plan(&inv, &phases, &kinds);
        let once = PowerRequest::Boot(BootDevice::Network, BootPersistence::Once);
        let on = PowerRequest::Set(PowerAction::On);
        let skip = |node: &str, why: &str| PowerOnStep::Skip {
            node: node.into(),
            why: why.into(),
        };
        assert_eq!(
            plan,
            [
                skip("cp-1", "no power controller in the inventory"),
                PowerOnStep::PowerOn {
                    node: "wk-bmc".into(),
                    steps: vec![once, on]
                },
                PowerOnStep::PowerOn {
                    node: "wk-wol".into(),
                    steps: vec![on]
                },
                skip("wk-done", "ready"),
                skip(
                    "wk-nocreds",
                    "its power credentials did not resolve (see the warning above)"
                ),
            ]
        );
    }
}
