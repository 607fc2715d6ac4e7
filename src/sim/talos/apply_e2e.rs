//! `daytwo::plan` and `daytwo::apply` against configured doubles (one control plane, two
//! workers, one of them reachable only through the control plane's `node` relay): no
//! changes on an unchanged rack; a label patch shows exactly that field on exactly the
//! affected nodes and applies without a reboot; a change needing a reboot is refused in
//! no-reboot mode and staged in staged mode; a refused apply stops the rollout and the
//! next run resumes without applying to finished nodes again; drift shows up in the plan
//! and serve's drift watcher announces it appearing and clearing.

use std::time::Duration;

use yaml_serde::Value;

use super::machine_config::tests::with_machine;
use super::tests::{maintenance, node_cfg, rack_ip, rendered};
use super::{FakeCluster, FakeTalosNode, Phase};
use crate::daytwo::apply::{ApplyOptions, ApplyOutcome, apply};
use crate::daytwo::diff::{DocChange, FieldChange};
use crate::daytwo::plan::{Connector, NodeTarget, exit_code, plan_all};
use crate::daytwo::rollout::Role;
use crate::store::Store;
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::retry::RetryPolicy;

const NODES: [(u8, &str, Role); 3] = [
    (61, "rack1-cp-01", Role::ControlPlane),
    (62, "rack1-st-01", Role::Worker),
    (63, "rack1-st-02", Role::Worker),
];

/// `text` with the node label `team=v` added to the labels it has.
fn label(text: &str, v: &str) -> String {
    let doc = text
        .split("---\n")
        .find_map(|d| {
            yaml_serde::from_str::<Value>(d)
                .ok()
                .filter(|v| v.get("machine").is_some())
        })
        .unwrap();
    let mut labels = doc["machine"]
        .get("nodeLabels")
        .cloned()
        .unwrap_or(Value::Mapping(Default::default()));
    if let Value::Mapping(m) = &mut labels {
        m.insert("team".into(), v.into());
    }
    with_machine(text, "nodeLabels", labels)
}

/// Starts a double per `(last octet, name, role)`, hands each its rendering in maintenance
/// mode and waits until every one is installed and secured.
async fn configured(cluster: &FakeCluster, names: &[(u8, &str, Role)]) -> Vec<FakeTalosNode> {
    let mut nodes = Vec::new();
    for &(last, name, _) in names {
        let node = FakeTalosNode::start(node_cfg(last, name), cluster)
            .await
            .unwrap();
        maintenance(node.addr())
            .apply_configuration(rendered(name).as_bytes())
            .await
            .unwrap();
        nodes.push(node);
    }
    for n in &nodes {
        n.wait_phase(Phase::Secured).await.unwrap();
    }
    nodes
}

/// Bootstraps the control plane at `cp_addr` and waits until a rollout may start: its etcd
/// serves and its boot sequence ended (stage running and `status.ready`, which on a control
/// plane needs etcd healthy), as the day-two gate requires.
async fn bootstrap_and_wait_ready(cp_addr: std::net::SocketAddr) {
    super::tests::secured(cp_addr).bootstrap().await.unwrap();
    for _ in 0..1500 {
        let s = super::tests::secured(cp_addr)
            .machine_status()
            .await
            .unwrap();
        let running = s.stage()
            == crate::talos::api::talos::resource::definitions::runtime::RuntimeMachineStage::MachineStageRunning;
        if running && s.status.is_some_and(|s| s.ready) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the control plane at {cp_addr} did not become ready after Bootstrap");
}

fn opts(mode: Mode) -> ApplyOptions {
    ApplyOptions {
        mode,
        try_timeout: None,
        worker_concurrency: 2,
        gate_timeout: Duration::from_secs(30),
        gate_poll: Duration::from_millis(50),
        control_planes: Vec::new(),
    }
}

#[tokio::test]
async fn plan_and_apply_on_a_configured_rack() {
    crate::install_crypto_provider();
    let cluster = FakeCluster::new();
    let nodes = configured(&cluster, &NODES).await;
    let cp_addr = nodes[0].addr();
    bootstrap_and_wait_ready(cp_addr).await;
    // The second worker only answers its control plane.
    nodes[2].restrict_to(Some(nodes[0].ip()));
    let dir = tempfile::tempdir().unwrap();
    let (store, w) = crate::store::open(dir.path()).unwrap().split();
    let conn = Connector {
        creds: super::tests::admin_creds(),
        relays: vec![cp_addr],
        retry: RetryPolicy::NONE,
    };
    let targets = |f: &dyn Fn(&str, String) -> String| -> Vec<NodeTarget> {
        NODES
            .iter()
            .zip(&nodes)
            .map(|((_, name, role), n)| NodeTarget {
                name: (*name).into(),
                role: *role,
                addr: n.addr(),
                node_ip: rack_ip(name),
                rendered: f(name, rendered(name)),
            })
            .collect()
    };

    // Unchanged: no changes, exit 0, and apply has nothing to do.
    let same = targets(&|_, t| t);
    let plans = plan_all(&conn, &same).await;
    assert_eq!(
        exit_code(&plans),
        0,
        "{}",
        crate::daytwo::plan::render(&plans)
    );
    let out = apply(&w.rollouts, &conn, &same, &opts(Mode::NoReboot), |_| {})
        .await
        .unwrap();
    assert_eq!(out, ApplyOutcome::NoChanges);

    // A label patch on the two workers: exactly that field, there, mode no-reboot.
    let patched = targets(&|name, t| {
        if name == "rack1-cp-01" {
            t
        } else {
            label(&t, "a")
        }
    });
    let plans = plan_all(&conn, &patched).await;
    assert_eq!(exit_code(&plans), 1);
    assert!(!plans[0].changed());
    for p in &plans[1..] {
        let d = p.diff.as_ref().unwrap();
        assert_eq!(
            d.docs,
            vec![DocChange::Changed {
                doc: "v1alpha1".into(),
                fields: vec![FieldChange::Added {
                    path: "machine.nodeLabels.team".into(),
                    value: "a".into()
                }]
            }],
            "{}",
            p.name
        );
        assert_eq!(p.mode, Some(Mode::NoReboot));
    }
    let boots: Vec<usize> = nodes.iter().map(|n| n.configured_boots()).collect();
    let out = apply(&w.rollouts, &conn, &patched, &opts(Mode::NoReboot), |_| {})
        .await
        .unwrap();
    assert!(
        matches!(&out, ApplyOutcome::Finished { nodes: n, .. } if n.len() == 2),
        "{out:?}"
    );
    assert!(nodes[0].apply_records().iter().all(|r| r.dry_run));
    for n in &nodes[1..] {
        let real: Vec<_> = n
            .apply_records()
            .into_iter()
            .filter(|r| !r.dry_run)
            .collect();
        assert_eq!(real.len(), 1);
        assert_eq!(
            (real[0].effective, real[0].rebooted),
            (Mode::NoReboot, false)
        );
    }
    assert_eq!(
        nodes
            .iter()
            .map(|n| n.configured_boots())
            .collect::<Vec<_>>(),
        boots
    );
    // Running it again reads the nodes, finds them in sync: nothing is applied twice.
    let before: usize = nodes.iter().map(|n| n.apply_calls()).sum();
    apply(&w.rollouts, &conn, &patched, &opts(Mode::NoReboot), |_| {})
        .await
        .unwrap();
    assert_eq!(nodes.iter().map(|n| n.apply_calls()).sum::<usize>(), before);

    // A change that needs a reboot: refused in no-reboot mode...
    let env = |t: String| {
        with_machine(
            &label(&t, "a"),
            "env",
            yaml_serde::from_str::<Value>("{HTTP_PROXY: http://p:3128}").unwrap(),
        )
    };
    let rebooting = targets(&|name, t| if name == "rack1-cp-01" { t } else { env(t) });
    let plans = plan_all(&conn, &rebooting).await;
    assert_eq!(plans[1].mode, Some(Mode::Reboot));
    let out = apply(
        &w.rollouts,
        &conn,
        &rebooting,
        &opts(Mode::NoReboot),
        |_| {},
    )
    .await
    .unwrap();
    let ApplyOutcome::Stopped { node, reason, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(node.as_deref(), Some("rack1-st-01"));
    assert!(
        reason.contains("can't be applied in immediate mode"),
        "{reason}"
    );
    // ...and staged in staged mode (running unchanged until the next boot).
    let out = apply(&w.rollouts, &conn, &rebooting, &opts(Mode::Staged), |_| {})
        .await
        .unwrap();
    assert!(matches!(out, ApplyOutcome::Finished { .. }), "{out:?}");
    for (n, t) in nodes[1..].iter().zip(&rebooting[1..]) {
        assert_eq!(n.persisted_config().as_deref(), Some(t.rendered.as_str()));
        assert_ne!(n.running_config().as_deref(), Some(t.rendered.as_str()));
    }

    // A node refusing the apply stops the rollout; the next run resumes without applying
    // to the node that finished.
    let relabelled = targets(&|_, t| label(&t, "b"));
    nodes[2].refuse_next_apply("simulated failure");
    let out = apply(&w.rollouts, &conn, &relabelled, &opts(Mode::Auto), |_| {})
        .await
        .unwrap();
    let ApplyOutcome::Stopped { node, reason, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(node.as_deref(), Some("rack1-st-02"));
    assert!(reason.contains("simulated failure"), "{reason}");
    let applied = |n: &FakeTalosNode| n.apply_records().iter().filter(|r| !r.dry_run).count();
    let done_before = [applied(&nodes[0]), applied(&nodes[1])];
    let out = apply(&w.rollouts, &conn, &relabelled, &opts(Mode::Auto), |_| {})
        .await
        .unwrap();
    assert!(matches!(out, ApplyOutcome::Finished { .. }), "{out:?}");
    assert_eq!([applied(&nodes[0]), applied(&nodes[1])], done_before);
    assert_eq!(
        nodes[2].running_config().as_deref(),
        Some(relabelled[2].rendered.as_str())
    );
    assert!(store.rollout_keys().unwrap().len() >= 3);

    // Drift: the running config changed behind talboot's back shows up in the plan.
    nodes[1].set_running_config(&label(&relabelled[1].rendered, "rogue"));
    let plans = plan_all(&conn, &relabelled).await;
    assert_eq!(exit_code(&plans), 1);
    assert!(plans[1].changed() && !plans[0].changed() && !plans[2].changed());

    // serve's drift watcher announces it, once, and announces when it clears.
    let events_dir = tempfile::tempdir().unwrap();
    let events_store = crate::store::open(events_dir.path()).unwrap().split().1;
    let (bus, _writer) = crate::events::EventBus::start(
        events_store.events,
        std::sync::Arc::new(crate::events::SystemClock),
    );
    let mut rx = bus.subscribe();
    let cancel = tokio_util::sync::CancellationToken::new();
    let board = std::sync::Arc::new(crate::view::drift::DriftBoard::default());
    tokio::spawn(crate::daytwo::drift::watch(
        conn.clone(),
        relabelled.clone(),
        bus.clone(),
        board.clone(),
        Duration::from_millis(50),
        cancel.clone(),
    ));
    let mut next_drift = async || loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("no drift event within 30 s")
            .unwrap();
        if ev.kind == crate::events::EventKind::Drift {
            return ev;
        }
    };
    let appeared = next_drift().await;
    assert_eq!(appeared.node, "rack1-st-01");
    assert!(
        appeared.detail.starts_with("drift: "),
        "{}",
        appeared.detail
    );
    // The board (what `/api/nodes` and `talboot status` show) has it by the time the
    // event is out, and the others in sync.
    let drifted = board.get("rack1-st-01").unwrap();
    assert!(drifted.drifted && drifted.changes >= 1, "{drifted:?}");
    assert_eq!(board.get("rack1-cp-01").map(|d| d.drifted), Some(false));
    nodes[1].set_running_config(&relabelled[1].rendered);
    let cleared = next_drift().await;
    assert_eq!(cleared.node, "rack1-st-01");
    assert!(
        cleared.detail.starts_with("drift cleared"),
        "{}",
        cleared.detail
    );
    assert_eq!(board.get("rack1-st-01").map(|d| d.drifted), Some(false));
    // A config applied through serve becomes the baseline: against it, the node drifts.
    board.set_applied("rack1-st-01", label(&relabelled[1].rendered, "applied"));
    let again = next_drift().await;
    assert_eq!(again.node, "rack1-st-01");
    assert!(again.detail.starts_with("drift: "), "{}", again.detail);
    cancel.cancel();

    for n in nodes {
        n.shutdown().await;
    }
}

/// Issue 24 item 3: a finished apply, then a change made behind talboot's back (an operator's
/// `talosctl apply-config`). The same `apply` again must put the node back to its rendering
/// (read from what the node runs, not from the finished record), and `plan` then shows
/// nothing.
#[tokio::test]
async fn apply_repairs_a_change_made_behind_its_back() {
    crate::install_crypto_provider();
    let cluster = FakeCluster::new();
    let names = [
        (171, "rack1-cp-01", Role::ControlPlane),
        (172, "rack1-st-01", Role::Worker),
    ];
    let nodes = configured(&cluster, &names).await;
    bootstrap_and_wait_ready(nodes[0].addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let (_store, w) = crate::store::open(dir.path()).unwrap().split();
    let conn = Connector {
        creds: super::tests::admin_creds(),
        relays: vec![nodes[0].addr()],
        retry: RetryPolicy::NONE,
    };
    let targets: Vec<NodeTarget> = names
        .iter()
        .zip(&nodes)
        .map(|((_, name, role), n)| NodeTarget {
            name: (*name).into(),
            role: *role,
            addr: n.addr(),
            node_ip: rack_ip(name),
            rendered: label(&rendered(name), "a"),
        })
        .collect();
    let out = apply(&w.rollouts, &conn, &targets, &opts(Mode::NoReboot), |_| {})
        .await
        .unwrap();
    assert!(
        matches!(&out, ApplyOutcome::Finished { nodes: n, .. } if n.len() == 2),
        "{out:?}"
    );
    assert_eq!(exit_code(&plan_all(&conn, &targets).await), 0);

    // Someone changes the worker's config with the admin talosconfig.
    let rogue = label(&targets[1].rendered, "rogue");
    super::tests::secured(nodes[1].addr())
        .apply_configuration_with(rogue.as_bytes(), Mode::NoReboot, false, None)
        .await
        .unwrap();
    let plans = plan_all(&conn, &targets).await;
    assert_eq!(exit_code(&plans), 1);
    assert!(plans[1].changed() && !plans[0].changed());
    let real = |n: &FakeTalosNode| n.apply_records().iter().filter(|r| !r.dry_run).count();
    let before = [real(&nodes[0]), real(&nodes[1])];

    // The same apply converges it: only the drifted node is changed.
    let mut lines = Vec::new();
    let out = apply(&w.rollouts, &conn, &targets, &opts(Mode::NoReboot), |p| {
        lines.push(crate::daytwo::apply::progress_line(p))
    })
    .await
    .unwrap();
    let ApplyOutcome::Finished { nodes: changed, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(changed, &vec!["rack1-st-01".to_string()], "{lines:#?}");
    assert_eq!(
        nodes[1].running_config().as_deref(),
        Some(targets[1].rendered.as_str())
    );
    assert_eq!(
        [real(&nodes[0]), real(&nodes[1])],
        [before[0], before[1] + 1]
    );
    let plans = plan_all(&conn, &targets).await;
    assert_eq!(
        exit_code(&plans),
        0,
        "{}",
        crate::daytwo::plan::render(&plans)
    );
    // And once in sync, nothing more is sent.
    let out = apply(&w.rollouts, &conn, &targets, &opts(Mode::NoReboot), |_| {})
        .await
        .unwrap();
    assert_eq!(out, ApplyOutcome::NoChanges);
    assert_eq!(real(&nodes[1]), before[1] + 1);

    for n in nodes {
        n.shutdown().await;
    }
}
