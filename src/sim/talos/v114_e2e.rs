//! A double running Talos v1.14 against talboot's own v1.14 renderings: the apply modes on a
//! configured node, the legacy-field conflicts, and both install paths (the unattended one
//! with its status resource, `.machine.install` as in v1.13). Nodes on 127.0.77.140-149.

use std::time::Duration;

use prost::Message;
use yaml_serde::Value;

use super::machine_config::tests::with_machine;
use super::tests::{maintenance, node_cfg, rack, secured};
use super::unattended::{STATUS_ID, STATUS_NAMESPACE, STATUS_TYPE, UnattendedInstallStatusSpec};
use super::{
    FakeCluster, FakeNodeConfig, FakeTalosNode, InstallFailure, Phase, TALOS_V114_TAG,
    UnattendedPhase,
};
use crate::machineconfig::render::render_node;
use crate::sim::disks::SimDisk;
use crate::talos::TalosError;
use crate::talos::api::machine::apply_configuration_request::Mode;
use crate::talos::api::talos::resource::definitions::runtime::RuntimeMachineStage as Stage;

/// `node`'s config as `talboot gen` renders it for an inventory at Talos v1.14.0.
fn rendered_v114(node: &str) -> String {
    let (inv, secrets) = rack();
    let mut inv = inv.clone();
    inv.cluster.talos_version.value = TALOS_V114_TAG.parse().unwrap();
    let node = inv.node(node).unwrap().clone();
    render_node(&inv, secrets, &node)
        .unwrap()
        .to_yaml()
        .unwrap()
}

/// A v1.14 node with the NVMe disk the rack's control planes install to.
fn v114_cfg(last: u8, name: &str) -> FakeNodeConfig {
    let mut cfg = node_cfg(last, name);
    cfg.talos_version = TALOS_V114_TAG.into();
    cfg.disks = vec![SimDisk::nvme(
        0,
        "Samsung SSD 980 PRO 1TB",
        &format!("S-{name}"),
        1_000_204_886_016,
    )];
    cfg
}

/// The gRPC code and message of a failed call.
fn remote(e: TalosError) -> (tonic::Code, String) {
    match e {
        TalosError::Remote { code, message, .. } => (code, message),
        other => panic!("not a remote error: {other}"),
    }
}

/// The status resource read over COSI (None: NotFound).
async fn status_over_cosi(node: &FakeTalosNode) -> Option<(UnattendedInstallStatusSpec, String)> {
    match secured(node.addr())
        .cosi_get(STATUS_NAMESPACE, STATUS_TYPE, STATUS_ID)
        .await
    {
        Ok(res) => {
            let spec = res.spec.unwrap();
            let proto = UnattendedInstallStatusSpec::decode(spec.proto_spec.as_slice()).unwrap();
            Some((proto, spec.yaml_spec))
        }
        Err(e) => {
            let (code, message) = remote(e);
            assert_eq!(code, tonic::Code::NotFound, "{message}");
            None
        }
    }
}

/// ApplyConfiguration straight into the configured node's handler: the exact status (talboot's
/// client classifies some codes and tidies messages).
fn apply_raw(node: &FakeTalosNode, text: &str, mode: i32) -> Result<Mode, tonic::Status> {
    let req = crate::talos::api::machine::ApplyConfigurationRequest {
        data: text.as_bytes().to_vec(),
        mode,
        dry_run: false,
        try_mode_timeout: None,
    };
    super::machine_config::apply_configured(&node.shared, req)
        .map(|r| Mode::try_from(r.into_inner().messages[0].mode).unwrap())
}

async fn stage(node: &FakeTalosNode) -> Stage {
    secured(node.addr()).machine_status().await.unwrap().stage()
}

/// Bootstraps a control plane once its etcd can run (retrying while it is not yet).
async fn bootstrap(node: &FakeTalosNode) {
    for _ in 0..200 {
        if secured(node.addr()).bootstrap().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("bootstrap never went through");
}

#[tokio::test]
async fn the_unattended_install_reports_its_phases_and_never_the_installing_stage() {
    crate::install_crypto_provider();
    let cluster = FakeCluster::new();
    let mut cfg = v114_cfg(140, "rack1-cp-01");
    cfg.timing.installer_pull = Duration::from_millis(500);
    let node = FakeTalosNode::start(cfg, &cluster).await.unwrap();
    let config = rendered_v114("rack1-cp-01");
    assert!(config.contains("kind: UnattendedInstallConfig"), "{config}");
    let reply = maintenance(node.addr())
        .apply_configuration(config.as_bytes())
        .await
        .unwrap();
    // talboot names the installer image: no warning.
    assert!(reply.warnings.is_empty(), "{:?}", reply.warnings);
    node.wait_phase(Phase::Installing).await.unwrap();

    // Installing: the resource says so over COSI, the machine stage stays booting.
    let (spec, yaml) = status_over_cosi(&node).await.expect("the status exists");
    assert_eq!(spec.phase, UnattendedPhase::Installing as i32, "{yaml}");
    assert!(spec.image.starts_with("factory.talos.dev/metal-installer/"));
    assert!(yaml.contains("phase: installing\n"), "{yaml}");
    assert_eq!(stage(&node).await, Stage::MachineStageBooting);
    let (code, message) = remote(secured(node.addr()).bootstrap().await.unwrap_err());
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert_eq!(message, "bootstrap is not available yet");
    // The unattended path runs no install sequence.
    let failures = secured(node.addr())
        .sequence_failures(Duration::from_millis(50))
        .await
        .unwrap();
    assert!(failures.is_empty(), "{failures:?}");

    // installer image set, reboot unset: it reboots, and on the installed system reports
    // installed (never installing in between).
    let mut phases = node.subscribe_phase();
    let mut stages = Vec::new();
    while *phases.borrow_and_update() == Phase::Installing {
        if let Ok(status) = secured(node.addr()).machine_status().await {
            stages.push(status.stage());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !stages.contains(&Stage::MachineStageInstalling),
        "{stages:?}"
    );
    node.wait_phase(Phase::Secured).await.unwrap();
    let (spec, yaml) = status_over_cosi(&node).await.expect("the status exists");
    assert_eq!(spec.phase, UnattendedPhase::Installed as i32, "{yaml}");
    assert_eq!(node.install_disk(), Some(Ok("/dev/nvme0n1".to_owned())));
    bootstrap(&node).await;
    let mut running = false;
    for _ in 0..100 {
        if stage(&node).await == Stage::MachineStageRunning {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        running,
        "the installed system's boot sequence ends in running"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn no_matching_disk_stays_pending_and_a_failing_installer_is_failed() {
    crate::install_crypto_provider();
    let cluster = FakeCluster::new();
    // The default SATA disk: the selector names /dev/nvme0n1.
    let mut cfg = node_cfg(141, "rack1-cp-01");
    cfg.talos_version = TALOS_V114_TAG.into();
    let pending = FakeTalosNode::start(cfg, &cluster).await.unwrap();
    maintenance(pending.addr())
        .apply_configuration(rendered_v114("rack1-cp-01").as_bytes())
        .await
        .unwrap();
    pending.wait_phase(Phase::Installing).await.unwrap();
    let mut last = None;
    for _ in 0..50 {
        last = pending.unattended_status();
        if last.as_ref().is_some_and(|s| !s.error.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = last.unwrap();
    assert_eq!(last.phase, UnattendedPhase::Pending);
    assert_eq!(last.error, "no disk matched the selector");
    let (_, yaml) = status_over_cosi(&pending).await.unwrap();
    assert!(!yaml.contains("phase:"), "pending is not printed: {yaml}");
    pending.shutdown().await;

    let mut cfg = v114_cfg(142, "rack1-cp-01");
    cfg.install_failure = Some(InstallFailure::Install);
    cfg.timing.fatal_reboot = Duration::from_secs(5);
    let failing = FakeTalosNode::start(cfg, &cluster).await.unwrap();
    maintenance(failing.addr())
        .apply_configuration(rendered_v114("rack1-cp-01").as_bytes())
        .await
        .unwrap();
    let mut failed = None;
    for _ in 0..200 {
        failed = failing
            .unattended_status()
            .filter(|s| s.phase == UnattendedPhase::Failed);
        if failed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failed = failed.expect("the install failed");
    assert_eq!(failed.error, "task \"upgrade\" failed: exit code 1");
    // Nothing reboots; the machine stays on its live system.
    assert_eq!(failing.phase(), Phase::Installing);
    failing.shutdown().await;
}

#[tokio::test]
async fn a_configured_v114_node_refuses_reboot_and_never_reboots_for_auto() {
    crate::install_crypto_provider();
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(v114_cfg(143, "rack1-cp-01"), &cluster)
        .await
        .unwrap();
    let base = rendered_v114("rack1-cp-01");
    maintenance(node.addr())
        .apply_configuration(base.as_bytes())
        .await
        .unwrap();
    node.wait_phase(Phase::Secured).await.unwrap();
    let api = secured(node.addr());
    let boots = node.configured_boots();

    // REBOOT (the zero value) is refused before validation, even of an invalid config.
    let broken = base.replace("type: controlplane", "type: nonsense");
    assert_ne!(broken, base);
    for text in [&base, &broken] {
        let err = apply_raw(&node, text, Mode::Reboot as i32).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        assert_eq!(
            err.message(),
            "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead"
        );
    }
    // Over the API too (talboot's client names the refusal as it names any Unimplemented).
    let err = api
        .apply_configuration_with(base.as_bytes(), Mode::Reboot, false, None)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("the REBOOT mode is not supported"),
        "{err}"
    );

    // AUTO with a change v1.13 would reboot for: applied at once, mode NO_REBOOT.
    let env: Value = yaml_serde::from_str("{HTTP_PROXY: http://proxy:3128}").unwrap();
    let changed = with_machine(&base, "env", env);
    let out = api
        .apply_configuration_with(changed.as_bytes(), Mode::Auto, false, None)
        .await
        .unwrap();
    assert_eq!(out.mode, Some(Mode::NoReboot));
    assert_eq!(out.mode_details, "Applied configuration without a reboot");
    assert_eq!(node.running_config().as_deref(), Some(changed.as_str()));
    assert_eq!(node.configured_boots(), boots);
    assert_eq!(node.phase(), Phase::Secured);

    // An unknown mode is InvalidArgument in v1.14 (Unknown in v1.13).
    let err = apply_raw(&node, &base, 42).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "incorrect mode '42' specified for the apply config call"
    );

    // `.machine.install` beside UnattendedInstallConfig: refused, nothing changes.
    let install: Value = yaml_serde::from_str("{disk: /dev/nvme0n1}").unwrap();
    let mixed = with_machine(&base, "install", install);
    let err = apply_raw(&node, &mixed, Mode::NoReboot as i32).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "1 error occurred:\n\t* UnattendedInstallConfig config is incompatible with v1alpha1 \
         config (.machine.install)\n\n"
    );
    let (code, _) = remote(
        api.apply_configuration_with(mixed.as_bytes(), Mode::NoReboot, false, None)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(node.running_config().as_deref(), Some(changed.as_str()));
    node.shutdown().await;
}

#[tokio::test]
async fn maintenance_refuses_a_mixed_config_and_installs_the_legacy_way_without_the_document() {
    crate::install_crypto_provider();
    let cluster = FakeCluster::new();
    let node = FakeTalosNode::start(v114_cfg(144, "rack1-cp-01"), &cluster)
        .await
        .unwrap();
    let base = rendered_v114("rack1-cp-01");
    let labels: Value = yaml_serde::from_str("{team: a}").unwrap();
    let mixed = with_machine(&base, "nodeLabels", labels);
    let err = maintenance(node.addr())
        .apply_configuration(mixed.as_bytes())
        .await
        .unwrap_err();
    let (code, message) = remote(err);
    assert_eq!(code, tonic::Code::InvalidArgument);
    // talboot's client folds the multierror's layout into one line.
    assert_eq!(
        message,
        "1 error occurred: * .machine.nodeLabels is already set in v1alpha1 config"
    );
    node.shutdown().await;

    // A v1.13-shaped config (`.machine.install`, no document) on a v1.14 node: the install
    // sequence as in v1.13, stage installing, no status resource.
    let mut cfg = v114_cfg(145, "rack1-cp-01");
    cfg.timing.installer_pull = Duration::from_millis(500);
    let legacy = FakeTalosNode::start(cfg, &cluster).await.unwrap();
    maintenance(legacy.addr())
        .apply_configuration(super::tests::rendered("rack1-cp-01").as_bytes())
        .await
        .unwrap();
    legacy.wait_phase(Phase::Installing).await.unwrap();
    let mut saw_installing = false;
    for _ in 0..50 {
        if stage(&legacy).await == Stage::MachineStageInstalling {
            saw_installing = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(saw_installing);
    assert!(status_over_cosi(&legacy).await.is_none());
    legacy.wait_phase(Phase::Secured).await.unwrap();
    assert!(status_over_cosi(&legacy).await.is_none());
    legacy.shutdown().await;
}
