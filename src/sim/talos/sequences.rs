//! The Talos double's machined sequences: install (after the first full config), boot (after
//! every boot) and reset, each run as a task beside the API that reports through [`Shared`].

use std::net::IpAddr;
use std::sync::Arc;

use super::etcd;
use super::upgrade;
use super::v114::TalosRules;
use super::{BootReason, InstallFailure, Installed, Lifecycle, NodeState, Shared, lock};
use crate::talos::api::machine::{self};
use crate::talos::api::talos::resource::definitions::runtime;

/// The install sequence after a config was applied in maintenance mode, as the sequencer
/// runs it (siderolabs/talos v1.13.9 `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go`,
/// `Install`: env, install, meta, saveMeta, volumeFinalize, stopEverything, kexec, reboot).
/// apid restarts with mTLS first (`internal/app/machined/pkg/controllers/secrets/api.go`
/// issues the certificates from `machine.ca`, `controllers/runtime/api_service_config.go`
/// restarts apid), so the configured API answers during the whole install. A failed install
/// is a fatal sequencer error: machined counts down and reboots (`internal/app/machined/main.go`,
/// `handle`), and with no installation on disk the machine network-boots into maintenance
/// mode again, its config gone with the RAM it was held in.
pub(super) async fn install_sequence(shared: Arc<Shared>, installed: Installed) {
    use runtime::RuntimeMachineStage as Stage;
    let t = shared.cfg.timing;
    // `runningMaintenance` task stops: stage booting (machine_status.go, TaskEvent).
    shared.set_stage(Stage::MachineStageBooting);
    if !shared.pause(t.apid_restart).await {
        return;
    }
    *lock(&shared.state) = NodeState::Installed(Box::new(installed));
    // The installer formats the disk: nothing of an earlier etcd survives.
    etcd::wipe(&shared);
    shared.go_down_api();
    shared.sequence_event("install", machine::sequence_event::Action::Start);
    shared.phase_event("env");
    shared.phase_event("install");
    shared.set_stage(Stage::MachineStageInstalling);
    if !shared.pause(t.installer_pull).await {
        return;
    }
    let failure = match &shared.cfg.install_failure {
        Some(InstallFailure::InstallerPull(reason)) => Some(format!(
            "failed to pull image \"{}\": {reason}",
            default_installer(&shared)
        )),
        _ => None,
    };
    let failure = match failure {
        Some(f) => Some(f),
        None => {
            if !shared.pause(t.install).await {
                return;
            }
            // The installer runs as containerd task "upgrade" (internal/pkg/install/install.go).
            (shared.cfg.install_failure == Some(InstallFailure::Install))
                .then(|| "task \"upgrade\" failed: exit code 1".to_owned())
        }
    };
    if let Some(err) = failure {
        shared.sequence_failed("install", &err);
        if !shared.pause(t.fatal_reboot).await {
            return;
        }
        *lock(&shared.state) = NodeState::Maintenance;
        shared.go_down(Lifecycle::Reboot(BootReason::InstallFailed));
        return;
    }
    for phase in [
        "meta",
        "saveMeta",
        "volumeFinalize",
        "stopEverything",
        "kexec",
    ] {
        shared.phase_event(phase);
    }
    // The `kexec` phase of the install sequence: stage rebooting.
    shared.set_stage(Stage::MachineStageRebooting);
    if !shared.pause(t.kexec).await {
        return;
    }
    if let NodeState::Installed(inst) = &mut *lock(&shared.state) {
        inst.on_disk = true;
    }
    shared.go_down(Lifecycle::Reboot(BootReason::Installed));
}

/// The installer the legacy install task falls back to (the double never reads
/// `.machine.install.image`): v1.13.9 `images.DefaultInstallerImage`
/// (`ghcr.io/siderolabs/installer:<version>`); v1.14.0-rc.1 `images.InstallerImage("metal")`,
/// the Image Factory's metal installer of the empty schematic
/// (`v1alpha1_sequencer_tasks.go`, `Install`; `pkg/images/images.go`).
fn default_installer(shared: &Shared) -> String {
    let version = upgrade::running(shared);
    match shared.rules() {
        TalosRules::V113 => format!("ghcr.io/siderolabs/installer:{version}"),
        TalosRules::V114 => format!(
            "factory.talos.dev/metal-installer/\
             376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{version}"
        ),
    }
}

/// The boot sequence of a machine booted from disk: stage booting until it finishes, then
/// running (machine_status.go: SequenceEvent STOP of `boot` without error). On a control
/// plane `startAllServices` starts etcd and waits for it to be up (see [`etcd`]): with an
/// empty data directory and no cluster to join that is only after Bootstrap, so a control
/// plane of a new cluster stays in stage booting until then.
pub(super) async fn boot_sequence(shared: Arc<Shared>) {
    shared.sequence_event("boot", machine::sequence_event::Action::Start);
    let boot = etcd::boot_of(&shared);
    let control_plane = shared
        .on_disk()
        .is_some_and(|i| i.config.is_control_plane());
    if control_plane {
        tokio::spawn(etcd::service(shared.clone(), boot));
    }
    if !shared.pause(shared.cfg.timing.boot).await {
        return;
    }
    if control_plane && !etcd::wait_up(&shared, boot).await {
        return;
    }
    let on_disk = shared.on_disk().is_some();
    let mut stage = lock(&shared.stage);
    // Unless another sequence (a reset started meanwhile) took over, or the machine
    // rebooted meanwhile (that boot runs its own sequence).
    if *stage == runtime::RuntimeMachineStage::MachineStageBooting
        && on_disk
        && etcd::boot_of(&shared) == boot
    {
        *stage = runtime::RuntimeMachineStage::MachineStageRunning;
        drop(stage);
        upgrade::on_running(&shared);
        shared.sequence_event("boot", machine::sequence_event::Action::Stop);
    }
}

/// A graceful reset of the last voting etcd member: the phases up to `leave` run, `leave`
/// fails (etcd refuses to remove the only voter), the error is fatal and machined reboots
/// with STATE untouched.
async fn fail_leaving_last_voter(shared: &Shared) {
    let t = shared.cfg.timing;
    for phase in ["drain", "cleanup", "dbus", "leave"] {
        shared.phase_event(phase);
    }
    if !shared.pause(t.reset / 2).await {
        return;
    }
    let id = match shared.cfg.public_ip() {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6) as u64,
    };
    // LeaveEtcd → LeaveCluster → RemoveMemberByMemberID (internal/pkg/etcd/etcd.go);
    // etcd's strict reconfiguration check refuses removing the last started voter.
    shared.sequence_failed(
        "reset",
        &format!(
            "failed to leave cluster: failed to remove member {id}: etcdserver: \
             re-configuration failed due to not enough started members"
        ),
    );
    if !shared.pause(t.fatal_reboot).await {
        return;
    }
    shared.go_down(Lifecycle::Reboot(BootReason::Reboot));
}

/// The reset sequence started by the Reset RPC after it answered (siderolabs/talos v1.13.9
/// `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`, `Reset`: the sequence
/// runs in a goroutine; `v1alpha1_sequencer.go`, `Reset`: drain, cleanup, dbus, leave (graceful,
/// control planes), preReset, stop everything, wipe, reboot). A graceful reset of the last
/// voting etcd member fails in `leave`: etcd refuses to remove the only voter, the sequence
/// error is fatal and machined reboots with STATE untouched, so the node comes back configured.
pub(super) async fn reset_sequence(
    shared: Arc<Shared>,
    req: machine::ResetRequest,
    wiped_state: bool,
    wiped_ephemeral: bool,
) {
    use runtime::RuntimeMachineStage as Stage;
    shared.sequence_event("reset", machine::sequence_event::Action::Start);
    shared.set_stage(Stage::MachineStageResetting);
    let t = shared.cfg.timing;
    let last_voter = shared
        .installed()
        .is_some_and(|inst| inst.config.is_control_plane())
        && etcd::is_last_voter(&shared);
    if req.graceful && last_voter {
        fail_leaving_last_voter(&shared).await;
        return;
    }
    for phase in [
        "drain",
        "cleanup",
        "dbus",
        "leave",
        "preReset",
        "stopEverything",
        "resetSpec",
    ] {
        shared.phase_event(phase);
    }
    if req.graceful {
        // `leave`: the member is removed from its cluster (`LeaveEtcd`).
        etcd::leave(&shared);
    }
    if !shared.pause(t.reset).await {
        return;
    }
    {
        let mut state = lock(&shared.state);
        if wiped_state {
            // No config any more: next boot is maintenance mode (or nothing, if halted).
            *state = if req.reboot {
                NodeState::Maintenance
            } else {
                NodeState::Halted
            };
        }
    }
    if wiped_ephemeral {
        // `/var/lib/etcd` lives on EPHEMERAL.
        etcd::wipe(&shared);
    }
    shared.go_down(if req.reboot && wiped_state {
        Lifecycle::Reboot(BootReason::Reset)
    } else if req.reboot {
        Lifecycle::Reboot(BootReason::Reboot)
    } else {
        Lifecycle::Halt
    });
}
