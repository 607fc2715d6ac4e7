//! The boot-source override: the `BootSourceOverrideTarget` and `Enabled` PATCH, with the
//! node's `BootSourceOverrideMode` where the BMC takes it ([`mode_plan`]), and `If-Match`
//! retries when the ComputerSystem's ETag goes stale ([`super::etag`]).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::etag::{ETAG_READS, if_match_forms, stale_etag_reason};
use super::{Redfish, SystemView, error_message};
use crate::inventory::BootMode;
use crate::power::{BootDevice, BootPersistence, BootSet, PowerError};

/// The `BootSourceOverrideTarget` value for a device.
pub fn boot_target(device: BootDevice) -> &'static str {
    match device {
        BootDevice::Network => "Pxe",
        BootDevice::Disk => "Hdd",
    }
}

/// What happens to `BootSourceOverrideMode` with a boot override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModePlan {
    /// Nothing to send: the BMC already reads the node's mode, or the node's mode is unknown
    /// and the BMC's is not `Legacy`.
    Keep,
    /// Send this `BootSourceOverrideMode` in the same PATCH as the target (as
    /// openstack/sushy's `set_system_boot_options` does).
    Set(&'static str),
    /// The override goes ahead without the mode; the operator is told this.
    Warn(String),
}

impl ModePlan {
    /// The mode to send, if any.
    pub fn mode(&self) -> Option<&'static str> {
        match self {
            Self::Set(m) => Some(m),
            Self::Keep | Self::Warn(_) => None,
        }
    }
}

/// Decide the `BootSourceOverrideMode` for a node whose firmware boots in `want` (`None`: the
/// inventory does not say), given what the BMC reads. The DMTF ComputerSystem schema
/// (DSP0268, `ComputerSystem.v1_x.json`, `Boot.BootSourceOverrideMode`, read-write since
/// v1_1_0) makes the mode apply to the override target; a BMC whose override mode reads
/// `Legacy` PXE-boots a UEFI machine in legacy mode. The mode is sent only where it differs
/// (a mode change may need a BIOS job on some BMCs) and where the BMC can take it: listed in
/// `BootSourceOverrideMode@Redfish.AllowableValues`, or the property present with no list.
pub fn mode_plan(want: Option<BootMode>, view: &SystemView) -> ModePlan {
    let current = view.override_mode.as_deref();
    let Some(want) = want else {
        return match current {
            Some("Legacy") => ModePlan::Warn(
                "the BMC's boot override mode is Legacy and the node has no `firmware:`: a UEFI \
                 machine will boot in Legacy mode (set `firmware: uefi` or `bios` on the node and \
                 talboot sets the mode)"
                    .into(),
            ),
            _ => ModePlan::Keep,
        };
    };
    let m = want.as_redfish();
    if current == Some(m) {
        return ModePlan::Keep;
    }
    match (&view.allowed_override_modes, current) {
        (Some(list), _) if !list.iter().any(|a| a == m) => ModePlan::Warn(format!(
            "the BMC does not allow boot override mode {m} (allows {list:?}); the machine boots \
             in {} mode: change it in the machine's firmware setup",
            current.unwrap_or("its firmware's")
        )),
        (None, None) => ModePlan::Warn(format!(
            "the BMC has no BootSourceOverrideMode, so talboot cannot choose {m}: the machine \
             boots in the mode its firmware setup is set to"
        )),
        _ => ModePlan::Set(m),
    }
}

/// The PATCH body that sets the boot-source override, with the mode when one is to be set.
pub fn boot_patch(device: BootDevice, persistence: BootPersistence, mode: Option<&str>) -> Value {
    let enabled = match persistence {
        BootPersistence::Once => "Once",
        BootPersistence::Persistent => "Continuous",
    };
    let mut boot = json!({
        "BootSourceOverrideTarget": boot_target(device),
        "BootSourceOverrideEnabled": enabled,
    });
    if let Some(m) = mode {
        boot["BootSourceOverrideMode"] = json!(m);
    }
    json!({ "Boot": boot })
}

/// How one read's boot PATCH ended, short of an error.
enum Patched {
    /// The BMC took it.
    Done,
    /// The BMC refused the mode (400): what to tell the operator; the override is sent again
    /// without the mode.
    ModeRefused(String),
    /// Every `If-Match` form of the ETag was refused with 412: it went stale.
    Stale,
}

impl Redfish {
    /// Set the boot-source override (one-time or persistent), with the node's boot mode
    /// where the BMC takes it ([`mode_plan`]). Each PATCH carries the ETag just read as
    /// `If-Match` ([`if_match_forms`]); when every form of it is refused with 412 the ETag
    /// went stale, so the system is read again and the PATCH tried again, up to
    /// [`ETAG_READS`] reads. What the operator should know (a mode that could not be set, a
    /// stale ETag) is in the answer's notes.
    pub async fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> Result<BootSet, PowerError> {
        let path = self.system_path().await?.to_string();
        tracing::info!(endpoint = %self.cfg.endpoint, device = device.as_str(), ?persistence, "redfish boot override");
        let mut reads = 0u32;
        // The BMC's refusal of a PATCH that carried the mode (then sent without it).
        let mut mode_refused: Option<String> = None;
        loop {
            reads += 1;
            let (sys, etag) = self.system_tagged().await?;
            self.check_boot_target(&sys, device)?;
            let plan = match &mode_refused {
                Some(why) => ModePlan::Warn(why.clone()),
                None => mode_plan(self.cfg.boot_mode, &sys),
            };
            let body = boot_patch(device, persistence, plan.mode());
            match self
                .patch_if_match(&path, &body, etag.as_deref(), &plan, &sys)
                .await?
            {
                Patched::Done => return Ok(self.boot_set(&sys, &plan, reads)),
                Patched::ModeRefused(why) => {
                    mode_refused = Some(why);
                    reads -= 1;
                    continue;
                }
                Patched::Stale => {}
            }
            // Every form of the tag was refused with 412: it went stale.
            let last = etag.unwrap_or_default();
            if reads < ETAG_READS {
                tracing::warn!(endpoint = %self.cfg.endpoint, etag = %last, stale = reads, "redfish: the ComputerSystem's ETag went stale (412); re-reading it and trying again");
                continue;
            }
            return self
                .patch_without_if_match(&path, &body, (&sys, &plan), reads, &last)
                .await;
        }
    }

    /// The device is one the BMC lists as a boot target (when it lists them).
    fn check_boot_target(&self, sys: &SystemView, device: BootDevice) -> Result<(), PowerError> {
        if let Some(allowed) = &sys.allowed_boot_targets
            && !allowed.iter().any(|t| t == boot_target(device))
        {
            return Err(PowerError::Unsupported {
                target: self.target(),
                what: format!(
                    "boot from {} (the BMC allows boot targets {allowed:?})",
                    device.as_str()
                ),
            });
        }
        Ok(())
    }

    /// One read's PATCH, tried with each `If-Match` form of its ETag ([`if_match_forms`]), or
    /// once without when the BMC sent none.
    async fn patch_if_match(
        &self,
        path: &str,
        body: &Value,
        etag: Option<&str>,
        plan: &ModePlan,
        sys: &SystemView,
    ) -> Result<Patched, PowerError> {
        let forms: Vec<Option<String>> = match etag.map(str::trim) {
            Some(t) if !t.is_empty() => if_match_forms(t).into_iter().map(Some).collect(),
            _ => vec![None],
        };
        for tag in &forms {
            let a = self
                .send(Method::PATCH, path, Some(body), tag.as_deref())
                .await?;
            if a.status.is_success() {
                return Ok(Patched::Done);
            }
            if a.status == StatusCode::PRECONDITION_FAILED && tag.is_some() {
                tracing::debug!(endpoint = %self.cfg.endpoint, if_match = tag.as_deref(), "redfish: If-Match refused (412); trying the next form");
                continue;
            }
            if let ModePlan::Set(m) = plan
                && a.status == StatusCode::BAD_REQUEST
            {
                // Some BMCs list the property but refuse to change it: the override
                // itself still matters more than the mode.
                let why = error_message(&a.text).unwrap_or_else(|| a.status.to_string());
                tracing::warn!(endpoint = %self.cfg.endpoint, mode = m, "redfish: the BMC refused BootSourceOverrideMode ({why}); sending the override without it");
                return Ok(Patched::ModeRefused(format!(
                    "the BMC refused boot override mode {m} ({why}); the machine boots in {} mode: change it in the machine's firmware setup",
                    sys.override_mode.as_deref().unwrap_or("its firmware's")
                )));
            }
            let mut e = self.refused(&Method::PATCH, path, &a);
            if a.status == StatusCode::PRECONDITION_REQUIRED
                && tag.is_none()
                && let PowerError::Protocol { reason, .. } = &mut e
            {
                reason.push_str(
                    " (the BMC requires If-Match but sent no ETag with the ComputerSystem)",
                );
            }
            return Err(e);
        }
        Ok(Patched::Stale)
    }

    /// sushy's last resort once the ETag went stale on [`ETAG_READS`] reads: the PATCH
    /// without If-Match.
    async fn patch_without_if_match(
        &self,
        path: &str,
        body: &Value,
        (sys, plan): (&SystemView, &ModePlan),
        reads: u32,
        last: &str,
    ) -> Result<BootSet, PowerError> {
        let a = self.send(Method::PATCH, path, Some(body), None).await?;
        if a.status.is_success() {
            let mut set = self.boot_set(sys, plan, reads);
            set.notes.push(format!(
                "the ETag went stale {reads} times; the BMC took the change without If-Match"
            ));
            return Ok(set);
        }
        Err(PowerError::Protocol {
            target: self.target(),
            reason: format!("PATCH {path}: {}", stale_etag_reason(reads, last, a.status)),
        })
    }

    /// What a successful boot override tells the operator.
    fn boot_set(&self, sys: &SystemView, plan: &ModePlan, reads: u32) -> BootSet {
        let mut notes = Vec::new();
        let mode = match plan {
            ModePlan::Set(m) => Some((*m).to_string()),
            ModePlan::Keep => sys.override_mode.clone(),
            ModePlan::Warn(w) => {
                notes.push(w.clone());
                sys.override_mode.clone()
            }
        };
        if reads > 1 {
            let times = reads - 1;
            notes.push(format!(
                "the BMC's ETag went stale {times} time{} (412); talboot re-read it and tried again",
                if times == 1 { "" } else { "s" }
            ));
        }
        BootSet { mode, notes }
    }
}

impl Redfish {
    /// After Talos is installed: boot from disk on every boot from now on, so a later
    /// power cycle never reinstalls the node even with a network-first firmware order (and
    /// a one-time `Pxe` override left by `rack up` is replaced).
    pub async fn boot_from_disk_after_install(&self) -> Result<BootSet, PowerError> {
        self.set_boot_device(BootDevice::Disk, BootPersistence::Persistent)
            .await
    }
}
