//! The configured node's machine config in the Talos double: ApplyConfiguration on an
//! installed node (every mode, `dry_run`, `try_mode_timeout` rollback), the staged
//! ("persisted") config that takes effect at the next boot, the running config as the COSI
//! resource `MachineConfigs.config.talos.dev`, and the test hooks (refuse the next apply,
//! change the running config behind talboot's back). Owns [`Configs`], the one place the
//! double keeps what the node runs and what it will boot with.
//!
//! Upstream (siderolabs/talos v1.13.9):
//! - `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`, ApplyConfiguration:
//!   the mode switch, the dry-run reply text, the try-mode reply text, which of
//!   `SetPersistedConfig` / `SetConfig` each mode calls, REBOOT running the reboot sequence.
//! - `internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go`: `CanApplyImmediate`
//!   (the fields a no-reboot apply may change, see [`IMMEDIATE_MACHINE`]), its error text,
//!   `RollbackToConfigAfter` / `CancelConfigRollbackTimeout`, the active (`v1alpha1`) and
//!   persisted (`persistent`) config IDs.
//! - `pkg/machinery/resources/config/machine_config.go`: `MachineConfigType =
//!   "MachineConfigs.config.talos.dev"`, `V1Alpha1ID = "v1alpha1"`, namespace `config`, spec
//!   `MachineConfigSpec { bytes yaml_marshalled = 1 }`.
//! - `pkg/machinery/constants/constants.go`: `ConfigTryTimeout = time.Minute`.
//! - `pkg/machinery/resources/config/machine_type.go` and
//!   `internal/app/machined/pkg/controllers/config/machine_type.go`: the `MachineType`
//!   resource (`MachineTypes.config.talos.dev/machine-type`, not sensitive, so a maintenance
//!   client may read it), `unknown` until the active config has a machine section, then that
//!   config's type; spec `MachineTypeSpec { MachineType machine_type = 1 }`
//!   (`api/resource/config/config.proto`: UNKNOWN 0, INIT 1, CONTROL_PLANE 2, WORKER 3).

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tonic::{Response, Status};
use yaml_serde::Value;

use super::loader::LoadRules;
use super::v114::{self, TalosRules};
use super::{Installed, Lifecycle, NodeState, Shared, lock, parse_config, reply_apply};
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::machine::{self, apply_configuration_request::Mode};

use super::BootReason;

/// COSI type, namespace and IDs of the machine config resource.
pub(crate) const MACHINE_CONFIG_TYPE: &str = "MachineConfigs.config.talos.dev";
pub(crate) const MACHINE_CONFIG_NAMESPACE: &str = "config";
pub(crate) const ACTIVE_ID: &str = "v1alpha1";
pub(crate) const PERSISTENT_ID: &str = "persistent";
/// COSI type and ID of the machine type resource (namespace `config` too).
pub(crate) const MACHINE_TYPE_TYPE: &str = "MachineTypes.config.talos.dev";
pub(crate) const MACHINE_TYPE_ID: &str = "machine-type";

/// `constants.ConfigTryTimeout`.
pub(crate) const CONFIG_TRY_TIMEOUT: Duration = Duration::from_secs(60);

/// Top-level keys of the v1alpha1 document `CanApplyImmediate` ignores.
const IMMEDIATE_TOP: &[&str] = &["debug", "cluster"];
/// Keys under `machine` `CanApplyImmediate` ignores (the YAML names of the Go fields it
/// copies from the current config: MachineCA, MachineAcceptedCAs, MachineTime,
/// MachineCertSANs, MachineInstall, MachineNetwork, MachineSysfs, MachineSysctls,
/// MachineLogging, MachineControlPlane, MachineKubelet, MachineKernel, MachineRegistries,
/// MachinePods, MachineSeccompProfiles, MachineNodeAnnotations, MachineNodeLabels,
/// MachineNodeTaints).
const IMMEDIATE_MACHINE: &[&str] = &[
    "ca",
    "acceptedCAs",
    "time",
    "certSANs",
    "install",
    "network",
    "sysfs",
    "sysctls",
    "logging",
    "controlPlane",
    "kubelet",
    "kernel",
    "registries",
    "pods",
    "seccompProfiles",
    "nodeAnnotations",
    "nodeLabels",
    "nodeTaints",
];
/// Keys under `machine.features` it ignores (KubernetesTalosAPIAccessConfig,
/// KubePrismSupport, HostDNSSupport, ImageCacheSupport, FeatureNodeAddressSortAlgorithm).
const IMMEDIATE_FEATURES: &[&str] = &[
    "kubernetesTalosAPIAccess",
    "kubePrism",
    "hostDNS",
    "imageCache",
    "nodeAddressSortAlgorithm",
];

/// One ApplyConfiguration a configured node handled (for tests to assert on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyRecord {
    /// The mode asked for.
    pub requested: Mode,
    /// The mode used (AUTO resolved to NO_REBOOT or REBOOT).
    pub effective: Mode,
    pub dry_run: bool,
    /// Whether the node rebooted for it.
    pub rebooted: bool,
    /// The config sent (for tests asserting what changed, and in which order across nodes).
    pub config: String,
    pub at: std::time::Instant,
}

/// What the node runs and will boot with.
#[derive(Default)]
pub(crate) struct Configs {
    /// The active config (COSI id `v1alpha1`); None in maintenance mode until an apply
    /// of a complete config lands (then Talos's `ConfigCompleteForBoot` is true, while the
    /// maintenance API still answers for a moment).
    running: Option<String>,
    /// The active config's `machine.type`, which the `MachineType` controller publishes.
    running_type: Option<String>,
    /// The config on STATE, loaded at the next boot (COSI id `persistent`).
    persisted: Option<String>,
    /// Bumped on every cancel, so a rollback timer that fires late does nothing.
    rollback_generation: u64,
    /// Error of the next configured-node apply (test hook).
    refuse_next: Option<String>,
    /// Boots of a configured node (each loads the persisted config).
    boots: usize,
    records: Vec<ApplyRecord>,
}

impl Configs {
    /// The maintenance-mode apply of a full config: active and persisted alike.
    pub(crate) fn installed(&mut self, text: String, machine_type: &str) {
        self.persisted = Some(text.clone());
        self.running = Some(text);
        self.running_type = Some(machine_type.to_owned());
    }

    /// Whether the active config is complete for boot (`Runtime.ConfigCompleteForBoot`):
    /// from the moment a maintenance apply's `SetConfig` returns, before apid leaves
    /// maintenance mode.
    pub(crate) fn complete_for_boot(&self) -> bool {
        self.running.is_some()
    }

    /// A boot: machined loads the persisted config; in maintenance mode there is none.
    pub(crate) fn on_boot(&mut self, maintenance: bool) {
        self.rollback_generation += 1;
        if maintenance {
            self.running = None;
            self.persisted = None;
            self.running_type = None;
        } else {
            self.boots += 1;
            self.running = self.persisted.clone();
        }
    }
}

/// Test hooks and observations, on [`super::FakeTalosNode`].
impl super::FakeTalosNode {
    /// The config the node runs now (COSI `MachineConfigs.config.talos.dev/v1alpha1`).
    pub fn running_config(&self) -> Option<String> {
        lock(&self.shared.configs).running.clone()
    }

    /// The config it will boot with (differs from the running one after a staged or try
    /// apply).
    pub fn persisted_config(&self) -> Option<String> {
        lock(&self.shared.configs).persisted.clone()
    }

    /// Every ApplyConfiguration a configured node handled, in order.
    pub fn apply_records(&self) -> Vec<ApplyRecord> {
        lock(&self.shared.configs).records.clone()
    }

    /// Boots since it was first configured (reboots, including those of a REBOOT apply).
    pub fn configured_boots(&self) -> usize {
        lock(&self.shared.configs).boots
    }

    /// The next ApplyConfiguration on the configured node that is not a dry run fails with
    /// `reason` (codes.Unknown, as a failing `SetPersistedConfig` surfaces) and changes nothing.
    pub fn refuse_next_apply(&self, reason: &str) {
        lock(&self.shared.configs).refuse_next = Some(reason.to_owned());
    }

    /// Changes the running and persisted config behind talboot's back (as another
    /// `talosctl apply-config --mode no-reboot` would), for drift tests.
    pub fn set_running_config(&self, text: &str) {
        let mut c = lock(&self.shared.configs);
        c.running = Some(text.to_owned());
        c.persisted = Some(text.to_owned());
    }
}

/// A handle on what one node runs, for the simulated kubelet ([`crate::sim::kubelet`]), which
/// follows the running config as the real kubelet and static pods follow machined's.
#[derive(Clone)]
pub struct RunningConfig(Arc<Shared>);

impl RunningConfig {
    /// The running config now (None in maintenance mode).
    pub fn get(&self) -> Option<String> {
        lock(&self.0.configs).running.clone()
    }
}

impl super::FakeTalosNode {
    /// A handle on the running config that does not borrow the node.
    pub fn running_config_handle(&self) -> RunningConfig {
        RunningConfig(self.shared.clone())
    }
}

/// The v1alpha1 document of a config text (None if there is none or it does not parse).
fn v1alpha1_doc(text: &str) -> Option<Value> {
    for doc in yaml_serde::Deserializer::from_str(text) {
        let Ok(v) = <Value as serde::Deserialize>::deserialize(doc) else {
            return None;
        };
        let legacy = ["machine", "cluster", "debug", "persist"]
            .iter()
            .any(|k| v.get(k).is_some());
        if legacy || v.get("version").and_then(Value::as_str) == Some("v1alpha1") {
            return Some(v);
        }
    }
    None
}

/// The v1alpha1 document with what an immediate apply may change removed.
fn immediate_view(doc: &Value) -> Value {
    let mut doc = doc.clone();
    if let Value::Mapping(top) = &mut doc {
        for k in IMMEDIATE_TOP {
            top.remove(*k);
        }
        if let Some(Value::Mapping(m)) = top.get_mut("machine") {
            for k in IMMEDIATE_MACHINE {
                m.remove(*k);
            }
            if let Some(Value::Mapping(f)) = m.get_mut("features") {
                for k in IMMEDIATE_FEATURES {
                    f.remove(*k);
                }
            }
        }
    }
    doc
}

/// Why `CanApplyImmediate` refuses a config change; the Display text is Talos's, which
/// ApplyConfiguration returns as InvalidArgument (NO_REBOOT, TRY) or appends to an AUTO
/// apply's reply before it reboots.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotImmediate {
    /// The running config has no v1alpha1 document.
    #[error("current config is not v1alpha1")]
    CurrentNotV1alpha1,
    /// The new config has no v1alpha1 document.
    #[error("new config is not v1alpha1")]
    NewNotV1alpha1,
    /// Fields outside the immediate set differ (the diff of what is left).
    #[error("this config change can't be applied in immediate mode\ndiff:\n{0}")]
    NeedsReboot(String),
}

/// `CanApplyImmediate`: Ok when the new config differs from the current one only in fields
/// Talos applies without a reboot; else Talos's error with the diff of what is left.
pub(crate) fn can_apply_immediate(current: &str, new: &str) -> Result<(), NotImmediate> {
    let cur = v1alpha1_doc(current).ok_or(NotImmediate::CurrentNotV1alpha1)?;
    let new = v1alpha1_doc(new).ok_or(NotImmediate::NewNotV1alpha1)?;
    let (cur, new) = (immediate_view(&cur), immediate_view(&new));
    if cur == new {
        return Ok(());
    }
    let to_text = |v: &Value| yaml_serde::to_string(v).unwrap_or_default();
    Err(NotImmediate::NeedsReboot(config_diff(
        &to_text(&cur),
        &to_text(&new),
    )))
}

/// `configdiff.DiffToString`: a unified diff `a` -> `b`, empty when equal. Upstream diffs the
/// re-encoded documents; the double diffs the texts as sent, which talboot renders
/// canonically already.
pub(crate) fn config_diff(old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    format!(
        "--- a\n+++ b\n{}",
        crate::machineconfig::text_diff::line_diff(old, new)
    )
}

/// Go's `time.Duration.String` for the durations a try timeout takes.
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let secs = if rest % 1000 == 0 {
        format!("{}s", rest / 1000)
    } else {
        let s = format!("{}.{:03}", rest / 1000, rest % 1000);
        format!("{}s", s.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// ApplyConfiguration on an installed node, in `v1alpha1_server.go`'s order.
pub(crate) fn apply_configured(
    shared: &Arc<Shared>,
    req: machine::ApplyConfigurationRequest,
) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
    let rules = shared.rules();
    let (requested, parsed, current_inst) = admit(shared, &req, rules)?;
    let text = String::from_utf8_lossy(&req.data).into_owned();
    let current = lock(&shared.configs).running.clone().unwrap_or_default();
    let (mode, mut details, mode_err) = mode_under(rules, requested, &current, &text)?;
    let warnings = parsed.warnings.clone();
    let record = recorder(requested, mode, req.dry_run, &text);

    if req.dry_run {
        lock(&shared.configs).records.push(record(false));
        return Ok(Response::new(dry_run_reply(
            mode, &details, &current, &text,
        )));
    }

    // Where a failing `SetPersistedConfig` would surface: after validation and the dry run.
    if let Some(reason) = lock(&shared.configs).refuse_next.take() {
        return Err(Status::unknown(reason));
    }
    *lock(&shared.stats.last_config) = Some(text.clone());
    match mode {
        Mode::Try => {
            let timeout = try_timeout(&req);
            details += &format!(
                "\nThe config is applied in 'try' mode and will be automatically reverted back \
                 in {}",
                go_duration(timeout)
            );
            let generation = {
                let mut c = lock(&shared.configs);
                c.rollback_generation += 1;
                c.running = Some(text);
                c.records.push(record(false));
                c.rollback_generation
            };
            take_effect(shared, &parsed);
            tokio::spawn(rollback_after(
                shared.clone(),
                current_inst,
                current,
                generation,
                timeout,
            ));
        }
        Mode::NoReboot => {
            let mut c = lock(&shared.configs);
            c.persisted = Some(text.clone());
            c.running = Some(text);
            c.records.push(record(false));
            drop(c);
            take_effect(shared, &parsed);
        }
        Mode::Staged => {
            let mut c = lock(&shared.configs);
            c.persisted = Some(text);
            c.records.push(record(false));
        }
        Mode::Reboot => {
            {
                let mut c = lock(&shared.configs);
                c.persisted = Some(text);
                c.records.push(record(true));
            }
            take_effect(shared, &parsed);
            // The reply goes out first; the reboot sequence runs afterwards.
            shared.go_down(Lifecycle::Reboot(BootReason::Reboot));
        }
        Mode::Auto => unreachable!("AUTO is resolved above"),
    }
    let mut out = reply(mode, details + &mode_err);
    out.messages[0].warnings = warnings;
    Ok(Response::new(out))
}

/// [`effective_mode`] under the node's rules: v1.14 never needs a reboot.
fn mode_under(
    rules: TalosRules,
    requested: Mode,
    current: &str,
    text: &str,
) -> Result<(Mode, String, String), Status> {
    Ok(match rules {
        TalosRules::V113 => effective_mode(requested, current, text)?,
        TalosRules::V114 => {
            let (mode, details) = v114::effective_mode(requested);
            (mode, details, String::new())
        }
    })
}

/// What the test record of this apply says, given whether the node rebooted for it.
fn recorder(
    requested: Mode,
    mode: Mode,
    dry_run: bool,
    text: &str,
) -> impl Fn(bool) -> ApplyRecord + use<> {
    let config = text.to_owned();
    move |rebooted| ApplyRecord {
        requested,
        effective: mode,
        dry_run,
        rebooted,
        config: config.clone(),
        at: std::time::Instant::now(),
    }
}

/// The reply to a dry run: what would have been done, and the diff against the running
/// config ("No changes." when there is none).
fn dry_run_reply(
    mode: Mode,
    details: &str,
    current: &str,
    text: &str,
) -> machine::ApplyConfigurationResponse {
    let diff = config_diff(current, text);
    let diff = if diff.is_empty() {
        "No changes.".to_owned()
    } else {
        diff
    };
    reply(
        mode,
        format!("Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{diff}"),
    )
}

/// How long a TRY apply runs before it is rolled back: the request's `try_mode_timeout`,
/// else `ConfigTryTimeout`.
fn try_timeout(req: &machine::ApplyConfigurationRequest) -> Duration {
    req.try_mode_timeout
        .map(|d| {
            Duration::from_secs(d.seconds.max(0) as u64)
                + Duration::from_nanos(d.nanos.max(0) as u64)
        })
        .unwrap_or(CONFIG_TRY_TIMEOUT)
}

/// The checks before anything is decided: a mode Talos knows (any apply but a try cancels a
/// pending try rollback), a config that loads and validates with a v1alpha1 document (in
/// v1.14's order when the node runs v1.14, see [`admit_v114`]), a configured node, and the
/// same machine type. Returns the mode, the config and the install as it was.
fn admit(
    shared: &Shared,
    req: &machine::ApplyConfigurationRequest,
    rules: TalosRules,
) -> Result<(Mode, super::ParsedConfig, Installed), Status> {
    let load = LoadRules {
        version: rules,
        requires_install: false,
    };
    let cancel_rollback = |requested: Mode| {
        if requested != Mode::Try {
            lock(&shared.configs).rollback_generation += 1;
        }
    };
    let (requested, parsed) = match rules {
        TalosRules::V113 => {
            let requested = Mode::try_from(req.mode).map_err(|_| {
                Status::unknown(format!(
                    "incorrect mode '{}' specified for the apply config call",
                    req.mode
                ))
            })?;
            cancel_rollback(requested);
            let parsed = parse_config(&req.data, load)
                .map_err(|e| Status::invalid_argument(e.to_string()))?
                .ok_or_else(no_v1alpha1)?;
            (requested, parsed)
        }
        TalosRules::V114 => {
            let (requested, parsed) = admit_v114(req, load)?;
            cancel_rollback(requested);
            (requested, parsed)
        }
    };
    let Some(current_inst) = shared.installed() else {
        return Err(Status::failed_precondition("node is not configured"));
    };
    if current_inst.config.machine_type != parsed.machine_type {
        return Err(Status::invalid_argument("machine type can't be changed"));
    }
    Ok((requested, parsed, current_inst))
}

fn no_v1alpha1() -> Status {
    Status::invalid_argument(
        "the applied machine configuration doesn't contain v1alpha1 config, did you mean to \
         patch the machine config instead?",
    )
}

/// v1.14's order (`v1alpha1_server.go`, ApplyConfiguration at v1.14.0-rc.1): the config
/// loads, has a v1alpha1 document, the mode is not REBOOT (Unimplemented), the config
/// validates, and only then an unknown mode is refused (InvalidArgument).
fn admit_v114(
    req: &machine::ApplyConfigurationRequest,
    load: LoadRules,
) -> Result<(Mode, super::ParsedConfig), Status> {
    let validated = match parse_config(&req.data, load) {
        Ok(Some(parsed)) => Ok(parsed),
        Ok(None) => return Err(no_v1alpha1()),
        Err(e) if e.is_validation() => Err(Status::invalid_argument(e.to_string())),
        Err(e) => return Err(Status::invalid_argument(e.to_string())),
    };
    if req.mode == Mode::Reboot as i32 {
        return Err(v114::reboot_refused());
    }
    let parsed = validated?;
    let requested = Mode::try_from(req.mode).map_err(|_| v114::unknown_mode(req.mode))?;
    Ok((requested, parsed))
}

/// The mode the apply runs in and the reply's details: NO_REBOOT and TRY refuse what needs a
/// reboot, AUTO becomes NO_REBOOT or REBOOT (then with `: <why>` for the reply's end).
fn effective_mode(
    requested: Mode,
    current: &str,
    text: &str,
) -> Result<(Mode, String, String), Status> {
    let mut mode = requested;
    let mut details = "Applied configuration with a reboot".to_owned();
    let mut mode_err = String::new();
    match requested {
        Mode::Try | Mode::NoReboot => {
            can_apply_immediate(current, text)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            details = "Applied configuration without a reboot".into();
        }
        Mode::Staged => details = "Staged configuration to be applied after the next reboot".into(),
        Mode::Auto => match can_apply_immediate(current, text) {
            Err(e) => {
                mode = Mode::Reboot;
                mode_err = format!(": {e}");
            }
            Ok(()) => {
                mode = Mode::NoReboot;
                details = "Applied configuration without a reboot".into();
            }
        },
        Mode::Reboot => {}
    }
    Ok((mode, details, mode_err))
}

/// `SetConfig`'s effect on the double: the node now runs `parsed`.
fn take_effect(shared: &Shared, parsed: &super::ParsedConfig) {
    if let NodeState::Installed(inst) = &mut *lock(&shared.state) {
        inst.config = parsed.clone();
    }
}

/// `RollbackToConfigAfter`: unless cancelled (another apply, a reboot), the config that ran
/// before the try comes back when the timer fires.
async fn rollback_after(
    shared: Arc<Shared>,
    before: Installed,
    text: String,
    generation: u64,
    timeout: Duration,
) {
    tokio::time::sleep(timeout).await;
    let mut c = lock(&shared.configs);
    if c.rollback_generation != generation {
        return;
    }
    tracing::debug!(node = %shared.cfg.ip, "rolling back the configuration");
    c.running = Some(text);
    drop(c);
    if let NodeState::Installed(inst) = &mut *lock(&shared.state) {
        inst.config = before.config;
    }
}

fn reply(mode: Mode, details: String) -> machine::ApplyConfigurationResponse {
    let mut r = reply_apply(&details);
    r.messages[0].mode = mode as i32;
    r
}

/// `MachineConfigSpec` (api/resource/definitions/config/config.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MachineConfigSpec {
    #[prost(bytes = "vec", tag = "1")]
    pub yaml_marshalled: Vec<u8>,
}

/// `MachineTypeSpec` (api/resource/config/config.proto), the enum as its number.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MachineTypeSpec {
    #[prost(int32, tag = "1")]
    pub machine_type: i32,
}

/// The `MachineType` enum number of a `machine.type` string (`machine.Type` in
/// pkg/machinery/config/machine/machine.go: unknown, init, controlplane, worker).
fn machine_type_number(t: &str) -> i32 {
    match t {
        "init" => 1,
        "controlplane" => 2,
        "worker" => 3,
        _ => 0,
    }
}

/// The running config and the node's machine type, for what Talos's controllers render from
/// them (the bootstrap manifests); None in maintenance mode.
pub(crate) fn running_and_type(shared: &Shared) -> Option<(String, String)> {
    let c = lock(&shared.configs);
    let text = c.running.clone()?;
    let t = c
        .running_type
        .clone()
        .or_else(|| shared.installed().map(|i| i.config.machine_type))
        .unwrap_or_else(|| "unknown".to_owned());
    Some((text, t))
}

/// COSI Get of the machine config resources; None for any other resource.
pub(crate) fn cosi_get(
    shared: &Shared,
    r: &cosi::GetRequest,
) -> Option<Result<cosi::GetResponse, Status>> {
    if (r.namespace.as_str(), r.r#type.as_str(), r.id.as_str())
        == (MACHINE_CONFIG_NAMESPACE, MACHINE_TYPE_TYPE, MACHINE_TYPE_ID)
    {
        // The controller writes the resource at boot (unknown) and on every config change.
        let t = lock(&shared.configs)
            .running_type
            .clone()
            .or_else(|| shared.installed().map(|i| i.config.machine_type))
            .unwrap_or_else(|| "unknown".to_owned());
        let spec = MachineTypeSpec {
            machine_type: machine_type_number(&t),
        };
        return Some(Ok(cosi::GetResponse {
            resource: Some(super::resource(
                &r.namespace,
                &r.r#type,
                &r.id,
                spec.encode_to_vec(),
                format!("{t}\n"),
            )),
        }));
    }
    if (r.namespace.as_str(), r.r#type.as_str()) != (MACHINE_CONFIG_NAMESPACE, MACHINE_CONFIG_TYPE)
    {
        return None;
    }
    let c = lock(&shared.configs);
    let text = match r.id.as_str() {
        ACTIVE_ID => c.running.clone(),
        PERSISTENT_ID => c.persisted.clone(),
        _ => None,
    };
    Some(match text {
        None => Err(Status::not_found(format!(
            "resource {}({}/{}@undefined) doesn't exist",
            r.r#type, r.namespace, r.id
        ))),
        Some(text) => {
            let spec = MachineConfigSpec {
                yaml_marshalled: text.clone().into_bytes(),
            };
            Ok(cosi::GetResponse {
                resource: Some(super::resource(
                    &r.namespace,
                    &r.r#type,
                    &r.id,
                    spec.encode_to_vec(),
                    text,
                )),
            })
        }
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    const BASE: &str = "version: v1alpha1\nmachine:\n  type: worker\n  token: t\n  \
                        nodeLabels:\n    a: b\n  files: []\ncluster:\n  clusterName: c\n";

    #[test]
    fn labels_and_cluster_apply_immediately_but_files_need_a_reboot() {
        let labels = BASE.replace("a: b", "a: c");
        assert_eq!(can_apply_immediate(BASE, &labels), Ok(()));
        let cluster = BASE.replace("clusterName: c", "clusterName: d");
        assert_eq!(can_apply_immediate(BASE, &cluster), Ok(()));
        let files = BASE.replace("files: []", "files: [{path: /x}]");
        let err = can_apply_immediate(BASE, &files).unwrap_err().to_string();
        assert!(
            err.starts_with("this config change can't be applied in immediate mode\ndiff:\n"),
            "{err}"
        );
        assert!(err.contains("path: /x"), "{err}");
        assert!(!err.contains("clusterName"), "{err}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
    }

    /// `text` with `machine.<key>` set to `value` in its v1alpha1 document.
    pub(crate) fn with_machine(text: &str, key: &str, value: Value) -> String {
        let mut out = Vec::new();
        for doc in yaml_serde::Deserializer::from_str(text) {
            let mut v = <Value as serde::Deserialize>::deserialize(doc).unwrap();
            if v.get("machine").is_some()
                && let Some(Value::Mapping(m)) = v.get_mut("machine")
            {
                m.insert(Value::from(key), value.clone());
            }
            out.push(yaml_serde::to_string(&v).unwrap());
        }
        out.join("---\n")
    }

    fn labels(v: &str) -> Value {
        yaml_serde::from_str(&format!("{{team: {v}}}")).unwrap()
    }

    fn env() -> Value {
        yaml_serde::from_str("{HTTP_PROXY: http://proxy:3128}").unwrap()
    }

    /// An unknown mode number is refused with `ApplyConfiguration`'s default-branch error
    /// text (siderolabs/talos v1.13.9 `v1alpha1_server.go`: "incorrect mode '%s' specified
    /// for the apply config call", a plain error, so codes.Unknown).
    #[tokio::test]
    async fn an_unknown_mode_is_refused_with_talos_text() {
        use crate::sim::talos::tests::{node_cfg, rendered};
        use crate::sim::talos::{FakeCluster, FakeTalosNode, Phase};
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let node = FakeTalosNode::start(node_cfg(42, "rack1-cp-01"), &cluster)
            .await
            .unwrap();
        let base = rendered("rack1-cp-01");
        crate::sim::talos::tests::maintenance(node.addr())
            .apply_configuration(base.as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Secured).await.unwrap();
        let req = machine::ApplyConfigurationRequest {
            data: base.into_bytes(),
            mode: 42,
            dry_run: false,
            try_mode_timeout: None,
        };
        let err = apply_configured(&node.shared, req).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unknown);
        assert_eq!(
            err.message(),
            "incorrect mode '42' specified for the apply config call"
        );
    }

    #[tokio::test]
    async fn every_apply_mode_on_a_configured_node() {
        use crate::sim::talos::tests::{node_cfg, rendered, secured};
        use crate::sim::talos::{FakeCluster, FakeTalosNode, Phase};
        crate::install_crypto_provider();
        let cluster = FakeCluster::new();
        let node = FakeTalosNode::start(node_cfg(41, "rack1-cp-01"), &cluster)
            .await
            .unwrap();
        let base = rendered("rack1-cp-01");
        crate::sim::talos::tests::maintenance(node.addr())
            .apply_configuration(base.as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Secured).await.unwrap();
        let api = secured(node.addr());
        assert_eq!(api.machine_config().await.unwrap(), base);
        let boots = node.configured_boots();

        // Dry run: Talos's summary and diff, nothing changes.
        let labelled = with_machine(&base, "nodeLabels", labels("a"));
        let dry = api
            .apply_configuration_with(labelled.as_bytes(), Mode::Auto, true, None)
            .await
            .unwrap();
        assert_eq!(dry.mode, Some(Mode::NoReboot));
        assert!(
            dry.mode_details.starts_with(
                "Dry run summary:\nApplied configuration without a reboot (skipped in \
                 dry-run).\nConfig diff:\n\n--- a\n+++ b\n"
            ),
            "{}",
            dry.mode_details
        );
        assert!(dry.mode_details.contains("team: a"), "{}", dry.mode_details);
        assert_eq!(node.running_config().as_deref(), Some(base.as_str()));
        let same = api
            .apply_configuration_with(base.as_bytes(), Mode::Auto, true, None)
            .await
            .unwrap();
        assert!(same.mode_details.ends_with("Config diff:\n\nNo changes."));

        // No-reboot: applied at once, no boot.
        let out = api
            .apply_configuration_with(labelled.as_bytes(), Mode::NoReboot, false, None)
            .await
            .unwrap();
        assert_eq!(out.mode_details, "Applied configuration without a reboot");
        assert_eq!(api.machine_config().await.unwrap(), labelled);
        assert_eq!(node.persisted_config().as_deref(), Some(labelled.as_str()));

        // A change that needs a reboot is refused in no-reboot mode with Talos's error...
        let with_env = with_machine(&labelled, "env", env());
        let err = api
            .apply_configuration_with(with_env.as_bytes(), Mode::NoReboot, false, None)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("this config change can't be applied in immediate mode"),
            "{err}"
        );
        assert_eq!(node.running_config().as_deref(), Some(labelled.as_str()));
        // ...and AUTO's dry run says it would reboot.
        let dry = api
            .apply_configuration_with(with_env.as_bytes(), Mode::Auto, true, None)
            .await
            .unwrap();
        assert_eq!(dry.mode, Some(Mode::Reboot));

        // Staged: persisted now, running after the next reboot.
        let out = api
            .apply_configuration_with(with_env.as_bytes(), Mode::Staged, false, None)
            .await
            .unwrap();
        assert_eq!(
            out.mode_details,
            "Staged configuration to be applied after the next reboot"
        );
        assert_eq!(node.running_config().as_deref(), Some(labelled.as_str()));
        assert_eq!(node.persisted_config().as_deref(), Some(with_env.as_str()));
        assert_eq!(node.configured_boots(), boots);
        api.reboot().await.unwrap();
        node.wait_phase(Phase::Booting).await.ok();
        node.wait_phase(Phase::Secured).await.unwrap();
        assert_eq!(node.configured_boots(), boots + 1);
        let api = secured(node.addr());
        assert_eq!(api.machine_config().await.unwrap(), with_env);

        // Try: applied, then rolled back when the timeout passes unconfirmed.
        let tried = with_machine(&with_env, "nodeLabels", labels("b"));
        let out = api
            .apply_configuration_with(
                tried.as_bytes(),
                Mode::Try,
                false,
                Some(Duration::from_millis(200)),
            )
            .await
            .unwrap();
        assert!(
            out.mode_details.ends_with(
                "The config is applied in 'try' mode and will be automatically reverted back \
                 in 200ms"
            ),
            "{}",
            out.mode_details
        );
        assert_eq!(node.running_config().as_deref(), Some(tried.as_str()));
        assert_eq!(node.persisted_config().as_deref(), Some(with_env.as_str()));
        let mut rolled_back = false;
        for _ in 0..200 {
            if node.running_config().as_deref() == Some(with_env.as_str()) {
                rolled_back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(rolled_back, "the try config was never rolled back");

        // A refused apply changes nothing; the next one goes through.
        node.refuse_next_apply("disk full");
        let err = api
            .apply_configuration_with(labelled.as_bytes(), Mode::Auto, false, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(node.running_config().as_deref(), Some(with_env.as_str()));

        // REBOOT: persisted, then the node reboots into it.
        let out = api
            .apply_configuration_with(labelled.as_bytes(), Mode::Reboot, false, None)
            .await
            .unwrap();
        assert_eq!(out.mode_details, "Applied configuration with a reboot");
        node.wait_phase(Phase::Secured).await.unwrap();
        assert_eq!(node.configured_boots(), boots + 2);
        assert_eq!(node.running_config().as_deref(), Some(labelled.as_str()));
        let effective: Vec<_> = node
            .apply_records()
            .iter()
            .filter(|r| !r.dry_run)
            .map(|r| (r.effective, r.rebooted))
            .collect();
        assert_eq!(
            effective,
            vec![
                (Mode::NoReboot, false),
                (Mode::Staged, false),
                (Mode::Try, false),
                (Mode::Reboot, true)
            ]
        );
        node.shutdown().await;
    }

    proptest! {
        #[test]
        fn an_immediate_field_change_never_needs_a_reboot(
            key in proptest::sample::select(IMMEDIATE_MACHINE.to_vec()),
            value in "[a-z]{1,8}",
        ) {
            let base = "version: v1alpha1\nmachine:\n  type: worker\n  files: []\n";
            let new = format!("{base}  {key}: {value}\n");
            prop_assert_eq!(can_apply_immediate(base, &new), Ok(()));
        }
    }
}
