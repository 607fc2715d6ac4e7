//! Talos v1.14's install paths in the double after a maintenance-mode apply: the unattended
//! install (`UnattendedInstallConfig` present) with its `UnattendedInstallStatus` resource over
//! COSI, and a config with no install at all. (A config with `.machine.install` goes the v1.13
//! way, [`super::sequences::install_sequence`].)
//!
//! Upstream (siderolabs/talos v1.14.0-rc.1):
//! - `internal/app/machined/pkg/controllers/runtime/unattended_install.go`
//!   (`UnattendedInstallController.reconcile`): a node already installed reports `installed`;
//!   else the CEL selector is matched against the disks (`blockhelpers.MatchDisks`, first
//!   match in ID order); none → `pending` with error "no disk matched the selector", retried
//!   on every Disk event; then `installing`, the installer runs; a failure is `failed` with the
//!   installer's error and the controller returns the error, so the controller runtime runs it
//!   again (the double retries after [`super::LifecycleTiming::fatal_reboot`]; the upstream
//!   backoff is not modelled); success with a reboot due (`reboot: true`, or unset and
//!   `installer.image` set: `shouldReboot`) creates a `RebootRequest` and reports
//!   `waiting-for-reboot`, else `installed`.
//! - `internal/app/machined/pkg/controllers/runtime/reboot.go`: the `RebootRequest` runs the
//!   normal reboot sequence (stage `rebooting`).
//! - `pkg/machinery/resources/runtime/unattended_install_status.go`: type
//!   `UnattendedInstallStatuses.runtime.talos.dev`, namespace `runtime`, ID
//!   `unattended-install`, in memory (made again at every boot), only while the active config
//!   has the document (NotFound otherwise); not sensitive. Spec
//!   `UnattendedInstallStatusSpec { image = 1; phase = 2; error = 3 }`
//!   (`api/resource/definitions/runtime/runtime.proto`), phases
//!   `RuntimeUnattendedInstallPhase` pending 0, installing 1, installed 2,
//!   waiting-for-reboot 3, failed 4 (`api/resource/definitions/enums/enums.proto`); the YAML
//!   fields are `omitempty`, so `phase: pending` is not printed.
//! - `internal/app/machined/pkg/controllers/runtime/machine_status.go`: stage `installing` is
//!   set only by the legacy install sequence's `install` phase, so this path goes maintenance
//!   → booting → rebooting → booting → running.
//! - `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go`, `Install`: with
//!   neither the document nor `.machine.install` the install sequence has no phases; the node
//!   boots on from its live media.
//!
//! The double's own wording: the installer's failure texts are those of the legacy path.

use std::sync::Arc;

use prost::Message;
use tonic::Status;

use super::sequences::boot_sequence;
use super::v114::UnattendedSpec;
use super::{BootReason, InstallFailure, Installed, Lifecycle, NodeState, Shared, etcd, lock};
use crate::sim::disks::{SimDisk, talos_order};
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::talos::resource::definitions::runtime;
use crate::talosfacts::disk_cel::{self, CelDisk};

/// COSI namespace, type and ID of the status resource.
pub(crate) const STATUS_NAMESPACE: &str = "runtime";
pub(crate) const STATUS_TYPE: &str = "UnattendedInstallStatuses.runtime.talos.dev";
pub(crate) const STATUS_ID: &str = "unattended-install";

/// `RuntimeUnattendedInstallPhase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnattendedPhase {
    Pending = 0,
    Installing = 1,
    Installed = 2,
    WaitingForReboot = 3,
    Failed = 4,
}

impl UnattendedPhase {
    /// The name `talosctl get unattendedinstallstatuses` prints.
    fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Installing => "installing",
            Self::Installed => "installed",
            Self::WaitingForReboot => "waiting-for-reboot",
            Self::Failed => "failed",
        }
    }
}

/// The status resource's spec, as the double keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnattendedStatus {
    /// The configured `installer.image` (empty when Talos derives it).
    pub image: String,
    pub phase: UnattendedPhase,
    pub error: String,
}

/// `UnattendedInstallStatusSpec`, the phase as its number.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct UnattendedInstallStatusSpec {
    #[prost(string, tag = "1")]
    pub image: String,
    #[prost(int32, tag = "2")]
    pub phase: i32,
    #[prost(string, tag = "3")]
    pub error: String,
}

fn set(shared: &Shared, spec: &UnattendedSpec, phase: UnattendedPhase, error: &str) {
    *lock(&shared.unattended) = Some(UnattendedStatus {
        image: spec.image.clone(),
        phase,
        error: error.to_owned(),
    });
}

/// The `disk` variable of a simulated disk.
fn cel_disk(d: &SimDisk) -> CelDisk {
    let s = &d.spec;
    CelDisk {
        size: s.size,
        io_size: s.io_size,
        sector_size: s.sector_size,
        readonly: s.readonly,
        model: s.model.clone(),
        serial: s.serial.clone(),
        modalias: s.modalias.clone(),
        wwid: s.wwid.clone(),
        bus_path: s.bus_path.clone(),
        sub_system: s.sub_system.clone(),
        transport: s.transport.clone(),
        rotational: s.rotational,
        cdrom: s.cdrom,
        dev_path: s.dev_path.clone(),
        pretty_size: s.pretty_size.clone(),
        secondary_disks: s.secondary_disks.clone(),
        uuid: s.uuid.clone(),
        symlinks: s.symlinks.clone(),
        firmware_version: s.firmware_version.clone(),
    }
}

/// The disk the controller installs to: the first (resource-ID order) the selector matches;
/// None when none does (or the selector does not evaluate).
pub(crate) fn matched_disk(selector: &str, disks: &[SimDisk]) -> Option<String> {
    let expr = disk_cel::compile(selector).ok()?;
    talos_order(disks)
        .into_iter()
        .find(|d| disk_cel::eval(&expr, &cel_disk(d), None).unwrap_or(false))
        .map(|d| d.spec.dev_path)
}

/// Why an injected installer run failed: the error the status then carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum InstallerError {
    #[error("failed to pull image {image:?}: {reason}")]
    Pull { image: String, reason: String },
    #[error("task \"upgrade\" failed: exit code 1")]
    Exit,
}

/// One run of the installer. None: the node was stopped meanwhile.
async fn run_installer(
    shared: &Shared,
    spec: &UnattendedSpec,
) -> Option<Result<(), InstallerError>> {
    let t = shared.cfg.timing;
    if !shared.pause(t.installer_pull).await {
        return None;
    }
    if let Some(InstallFailure::InstallerPull(reason)) = &shared.cfg.install_failure {
        return Some(Err(InstallerError::Pull {
            image: spec.image.clone(),
            reason: reason.clone(),
        }));
    }
    if !shared.pause(t.install).await {
        return None;
    }
    if shared.cfg.install_failure == Some(InstallFailure::Install) {
        return Some(Err(InstallerError::Exit));
    }
    Some(Ok(()))
}

/// The node leaves maintenance mode with `installed` as its config: apid restarts with mTLS
/// and the boot sequence runs on the live system. Returns false if stopped meanwhile.
async fn leave_maintenance(shared: &Shared, installed: Installed) -> bool {
    // `runningMaintenance` task stops: stage booting (machine_status.go, TaskEvent).
    shared.set_stage(runtime::RuntimeMachineStage::MachineStageBooting);
    if !shared.pause(shared.cfg.timing.apid_restart).await {
        return false;
    }
    *lock(&shared.state) = NodeState::Installed(Box::new(installed));
    true
}

/// The system runs on from the media it booted (no install, or an install with its reboot
/// off): its services start as on an installed system and the boot sequence ends in running.
fn run_live(shared: &Arc<Shared>) {
    if let NodeState::Installed(inst) = &mut *lock(&shared.state) {
        inst.on_disk = true;
    }
    shared.go_down_api();
    tokio::spawn(boot_sequence(shared.clone()));
}

/// A maintenance-mode apply of a config with neither `UnattendedInstallConfig` nor
/// `.machine.install` (v1.14 accepts it): nothing is installed, the node runs on.
pub(super) async fn boot_without_install(shared: Arc<Shared>, installed: Installed) {
    if leave_maintenance(&shared, installed).await {
        run_live(&shared);
    }
}

/// `UnattendedInstallController` after a maintenance-mode apply of a config with the document.
pub(super) async fn install(shared: Arc<Shared>, installed: Installed, spec: UnattendedSpec) {
    set(&shared, &spec, UnattendedPhase::Pending, "");
    if !leave_maintenance(&shared, installed).await {
        return;
    }
    // The installer formats the disk: nothing of an earlier etcd survives.
    etcd::wipe(&shared);
    shared.go_down_api();
    if matched_disk(&spec.selector, &shared.cfg.disks).is_none() {
        // Retried on every Disk event; the double's disks never change.
        set(
            &shared,
            &spec,
            UnattendedPhase::Pending,
            "no disk matched the selector",
        );
        return;
    }
    loop {
        set(&shared, &spec, UnattendedPhase::Installing, "");
        match run_installer(&shared, &spec).await {
            None => return,
            Some(Ok(())) => break,
            Some(Err(e)) => {
                set(&shared, &spec, UnattendedPhase::Failed, &e.to_string());
                if !shared.pause(shared.cfg.timing.fatal_reboot).await {
                    return;
                }
            }
        }
    }
    if !spec.reboots() {
        set(&shared, &spec, UnattendedPhase::Installed, "");
        run_live(&shared);
        return;
    }
    set(&shared, &spec, UnattendedPhase::WaitingForReboot, "");
    shared.set_stage(runtime::RuntimeMachineStage::MachineStageRebooting);
    if !shared.pause(shared.cfg.timing.kexec).await {
        return;
    }
    if let NodeState::Installed(inst) = &mut *lock(&shared.state) {
        inst.on_disk = true;
    }
    shared.go_down(Lifecycle::Reboot(BootReason::Installed));
}

/// At every boot the in-memory resource is gone; the controller makes it again, `installed`,
/// when an installed system's config has the document.
pub(super) fn on_boot(shared: &Shared) {
    let status = shared.on_disk().and_then(|i| {
        i.config.unattended.map(|spec| UnattendedStatus {
            image: spec.image,
            phase: UnattendedPhase::Installed,
            error: String::new(),
        })
    });
    *lock(&shared.unattended) = status;
}

/// COSI Get of the status resource; None for any other resource.
pub(super) fn cosi_get(
    shared: &Shared,
    r: &cosi::GetRequest,
) -> Option<Result<cosi::GetResponse, Status>> {
    if (r.namespace.as_str(), r.r#type.as_str()) != (STATUS_NAMESPACE, STATUS_TYPE) {
        return None;
    }
    let status = lock(&shared.unattended)
        .clone()
        .filter(|_| r.id == STATUS_ID);
    let Some(s) = status else {
        return Some(Err(Status::not_found(format!(
            "resource {}({}/{}@undefined) doesn't exist",
            r.r#type, r.namespace, r.id
        ))));
    };
    let mut yaml = String::new();
    if !s.image.is_empty() {
        yaml += &format!("image: {}\n", s.image);
    }
    if s.phase != UnattendedPhase::Pending {
        yaml += &format!("phase: {}\n", s.phase.name());
    }
    if !s.error.is_empty() {
        yaml += &format!("error: {}\n", s.error);
    }
    let spec = UnattendedInstallStatusSpec {
        image: s.image,
        phase: s.phase as i32,
        error: s.error,
    };
    Some(Ok(cosi::GetResponse {
        resource: Some(super::resource(
            &r.namespace,
            &r.r#type,
            &r.id,
            spec.encode_to_vec(),
            yaml,
        )),
    }))
}

impl super::FakeTalosNode {
    /// The `UnattendedInstallStatus` resource now (None: NotFound).
    pub fn unattended_status(&self) -> Option<UnattendedStatus> {
        lock(&self.shared.unattended).clone()
    }
}
