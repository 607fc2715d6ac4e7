//! The double's etcd against talboot's own configs, and the day-two gate against it (issue
//! 24 items 0 and 2): a control plane of a new cluster waits in stage booting until
//! Bootstrap and the others join by themselves; after a reboot apid answers before etcd
//! serves while etcd keeps listing the member; a reboot-mode `apply` over three control
//! planes never has two etcd members down at once. Nodes on 127.0.77.71-76.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use yaml_serde::Value;

use super::machine_config::tests::with_machine;
use super::tests::{admin_creds, maintenance, node_cfg, rack_ip, rendered, secured};
use super::{FakeCluster, FakeTalosNode, Phase, max_etcd_down};
use crate::daytwo::apply::{ApplyOptions, ApplyOutcome, apply};
use crate::daytwo::gate;
use crate::daytwo::plan::{Connector, NodeTarget};
use crate::daytwo::rollout::Role;
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::api::talos::resource::definitions::runtime::RuntimeMachineStage as Stage;
use crate::talos::retry::RetryPolicy;

const CPS: [&str; 3] = ["rack1-cp-01", "rack1-cp-02", "rack1-cp-03"];

/// The etcd service's state as `ServiceList` reports it.
async fn etcd_state(addr: SocketAddr) -> Option<(String, bool)> {
    secured(addr)
        .service_list()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.id == "etcd")
        .map(|s| (s.state, s.health.is_some_and(|h| h.healthy)))
}

async fn stage(addr: SocketAddr) -> Stage {
    secured(addr).machine_status().await.unwrap().stage()
}

/// Polls `f` every 20 ms until it holds, for at most 30 s.
async fn until<F: AsyncFnMut() -> bool>(what: &str, mut f: F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three control planes from talboot's rendered configs, booted from disk, each with
/// `etcd_start` between apid answering and etcd serving; not bootstrapped.
async fn three(first: u8, etcd_start: Duration) -> (FakeCluster, Vec<FakeTalosNode>) {
    crate::install_crypto_provider();
    let cluster = FakeCluster::new();
    let mut nodes = Vec::new();
    for (i, name) in CPS.iter().enumerate() {
        let mut cfg = node_cfg(first + i as u8, name);
        cfg.timing.etcd_start = etcd_start;
        let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
        maintenance(node.addr())
            .apply_configuration(rendered(name).as_bytes())
            .await
            .unwrap();
        nodes.push(node);
    }
    for n in &nodes {
        n.wait_phase(Phase::Secured).await.unwrap();
    }
    (cluster, nodes)
}

/// Every control plane's etcd healthy, read as the day-two gate reads it.
async fn etcd_healthy(nodes: &[FakeTalosNode]) -> bool {
    let cps: Vec<_> = nodes
        .iter()
        .map(|n| (n.hostname().to_owned(), Ok(secured(n.addr()))))
        .collect();
    gate::check(None, &cps).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_planes_wait_for_bootstrap_then_join_and_one_cluster_forms() {
    let (_cluster, nodes) = three(71, Duration::from_millis(200)).await;
    // Booted from disk, secured API up: etcd waits to join, the boot sequence waits for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in &nodes {
        assert_eq!(stage(n.addr()).await, Stage::MachineStageBooting);
        assert_eq!(
            etcd_state(n.addr()).await,
            Some(("Preparing".to_owned(), false))
        );
        let status = secured(n.addr()).machine_status().await.unwrap();
        assert!(!status.status.unwrap().ready);
        assert!(!n.etcd_member());
    }
    let err = secured(nodes[1].addr())
        .etcd_member_list()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no controlplane endpoints discovered yet"),
        "{err}"
    );

    secured(nodes[0].addr()).bootstrap().await.unwrap();
    // Every control plane reaches stage running, the others by joining.
    for n in &nodes {
        until("stage running", async || {
            stage(n.addr()).await == Stage::MachineStageRunning
        })
        .await;
        assert!(n.etcd_member(), "{}", n.hostname());
    }
    until("etcd healthy everywhere", async || {
        etcd_healthy(&nodes).await
    })
    .await;
    let members = secured(nodes[2].addr()).etcd_member_list().await.unwrap();
    let mut names: Vec<_> = members.iter().map(|m| m.hostname.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, CPS);
    assert!(members.iter().all(|m| !m.is_learner));
    // A joined member refuses Bootstrap: its data directory is not empty.
    let again = secured(nodes[1].addr()).bootstrap().await.unwrap_err();
    assert!(
        again
            .to_string()
            .contains("etcd data directory is not empty"),
        "{again}"
    );
    assert_eq!(nodes[0].etcd_clusters(), 1);
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_apid_answers_before_etcd_and_the_member_stays_listed() {
    let (cluster, nodes) = three(74, Duration::from_millis(1500)).await;
    secured(nodes[0].addr()).bootstrap().await.unwrap();
    until("etcd healthy everywhere", async || {
        etcd_healthy(&nodes).await
    })
    .await;

    let since = Instant::now();
    secured(nodes[0].addr()).reboot().await.unwrap();
    // While it is down, the others still list it (membership), and still have a leader.
    let members = secured(nodes[1].addr()).etcd_member_list().await.unwrap();
    assert_eq!(members.len(), 3);
    nodes[0].wait_phase(Phase::Secured).await.unwrap();
    // apid answers; etcd does not serve yet: not Running-healthy, not ready, still booting,
    // and still listed everywhere.
    let (state, healthy) = etcd_state(nodes[0].addr()).await.unwrap();
    assert!(state != "Running" || !healthy, "{state} {healthy}");
    assert_eq!(stage(nodes[0].addr()).await, Stage::MachineStageBooting);
    let status = secured(nodes[0].addr()).machine_status().await.unwrap();
    assert!(!status.status.unwrap().ready);
    assert_eq!(
        secured(nodes[0].addr())
            .etcd_member_list()
            .await
            .unwrap()
            .len(),
        3
    );
    assert!(!etcd_healthy(&nodes).await);
    // Then etcd serves, and only then does the boot sequence end.
    until("stage running", async || {
        stage(nodes[0].addr()).await == Stage::MachineStageRunning
    })
    .await;
    assert_eq!(
        etcd_state(nodes[0].addr()).await,
        Some(("Running".to_owned(), true))
    );
    assert!(etcd_healthy(&nodes).await);
    let log = cluster.etcd_availability();
    assert_eq!(max_etcd_down(&log, since), 1, "{log:#?}");
    let served_again = log
        .iter()
        .find(|a| a.at >= since && !a.down)
        .expect("cp-01 serves again");
    assert_eq!(served_again.hostname, "rack1-cp-01");

    // Two members down: no quorum, the third one is unhealthy and has no leader.
    secured(nodes[0].addr()).reboot().await.unwrap();
    secured(nodes[1].addr()).reboot().await.unwrap();
    let (state, healthy) = etcd_state(nodes[2].addr()).await.unwrap();
    assert_eq!((state.as_str(), healthy), ("Running", false));
    let err = secured(nodes[2].addr())
        .etcd_member_list()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no leader"), "{err}");
    // Both come back and etcd recovers.
    until("etcd healthy again", async || etcd_healthy(&nodes).await).await;
    for n in nodes {
        n.shutdown().await;
    }
}

/// The three control planes as apply targets, each rendering with one extra machine env
/// variable: a change every node takes.
fn env_targets(nodes: &[FakeTalosNode]) -> Vec<NodeTarget> {
    CPS.iter()
        .zip(nodes)
        .map(|(name, n)| NodeTarget {
            name: (*name).into(),
            role: Role::ControlPlane,
            addr: n.addr(),
            node_ip: rack_ip(name),
            rendered: with_machine(
                &rendered(name),
                "env",
                yaml_serde::from_str::<Value>("{HTTP_PROXY: http://p:3128}").unwrap(),
            ),
        })
        .collect()
}

fn connector(nodes: &[FakeTalosNode]) -> Connector {
    Connector {
        creds: admin_creds(),
        relays: nodes.iter().map(|n| n.addr()).collect(),
        retry: RetryPolicy::NONE,
    }
}

/// A reboot-mode apply, one control plane at a time, gated over `control_planes`.
fn reboot_opts(control_planes: Vec<NodeTarget>) -> ApplyOptions {
    ApplyOptions {
        mode: Mode::Reboot,
        try_timeout: None,
        worker_concurrency: 1,
        gate_timeout: Duration::from_secs(60),
        gate_poll: Duration::from_millis(20),
        control_planes,
    }
}

/// Issue 24 item 2: a reboot-mode apply over three control planes. The old gate passed as
/// soon as the changed node answered with the new config and etcd listed three members,
/// i.e. while that node's etcd was still starting, and took the next control plane down:
/// two of three members down at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_apply_never_takes_a_second_etcd_member_down() {
    let (cluster, nodes) = three(77, Duration::from_millis(1500)).await;
    secured(nodes[0].addr()).bootstrap().await.unwrap();
    until("etcd healthy everywhere", async || {
        etcd_healthy(&nodes).await
    })
    .await;

    let targets = env_targets(&nodes);
    let conn = connector(&nodes);
    let opts = reboot_opts(Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let (_store, w) = crate::store::open(dir.path()).unwrap().split();
    let since = Instant::now();
    let out = apply(&w.rollouts, &conn, &targets, &opts, |_| {})
        .await
        .unwrap();
    assert!(
        matches!(&out, ApplyOutcome::Finished { nodes, .. } if nodes.len() == 3),
        "{out:?}"
    );
    for (n, t) in nodes.iter().zip(&targets) {
        assert_eq!(n.running_config().as_deref(), Some(t.rendered.as_str()));
        assert!(
            n.apply_records().iter().any(|r| r.rebooted),
            "{}",
            n.hostname()
        );
    }
    let log = cluster.etcd_availability();
    let downs = log.iter().filter(|a| a.at >= since && a.down).count();
    assert_eq!(downs, 3, "each member went down once: {log:#?}");
    assert_eq!(
        max_etcd_down(&log, since),
        1,
        "a second etcd member was taken down before the first served again: {log:#?}"
    );
    for n in nodes {
        n.shutdown().await;
    }
}

/// An apply that names one control plane (serve's admin API takes any subset) is gated on
/// every member: the gate reads all of the cluster's control planes. Read only from the
/// targets, the two members it does not target looked like strangers and the apply could
/// never start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_of_one_control_plane_is_gated_on_every_member() {
    let (_cluster, nodes) = three(80, Duration::from_millis(200)).await;
    secured(nodes[0].addr()).bootstrap().await.unwrap();
    until("etcd healthy everywhere", async || {
        etcd_healthy(&nodes).await
    })
    .await;
    let all = env_targets(&nodes);
    let targets = vec![all[1].clone()];
    let conn = connector(&nodes);
    let opts = reboot_opts;
    let dir = tempfile::tempdir().unwrap();
    let (_store, w) = crate::store::open(dir.path()).unwrap().split();
    // The gate over the targets alone refuses to start, naming a member it was not given.
    let out = apply(&w.rollouts, &conn, &targets, &opts(Vec::new()), |_| {})
        .await
        .unwrap();
    assert!(
        matches!(&out, ApplyOutcome::Stopped { reason, .. }
            if reason.contains("is not one of the inventory's control planes")),
        "{out:?}"
    );
    assert_eq!(
        nodes[1].running_config().as_deref(),
        Some(rendered(CPS[1]).as_str())
    );
    // Given every control plane, it applies cp-02 and waits for all three members.
    let out = apply(&w.rollouts, &conn, &targets, &opts(all.clone()), |_| {})
        .await
        .unwrap();
    assert!(
        matches!(&out, ApplyOutcome::Finished { nodes, .. } if nodes == &[CPS[1].to_owned()]),
        "{out:?}"
    );
    assert_eq!(
        nodes[1].running_config().as_deref(),
        Some(all[1].rendered.as_str())
    );
    assert_eq!(
        nodes[0].running_config().as_deref(),
        Some(rendered(CPS[0]).as_str())
    );
    assert!(etcd_healthy(&nodes).await);
    for n in nodes {
        n.shutdown().await;
    }
}
