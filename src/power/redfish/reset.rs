//! Power through `ComputerSystem.Reset`: which `ResetType` an action becomes on a system
//! (pure, [`reset_plan`]) and carrying it out, waiting for `Off` where a cycle needs two
//! resets.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::{Redfish, string_list};
use crate::power::{PowerAction, PowerError, PowerState};

/// How a [`PowerAction`] is carried out on one system, given its state and allowed resets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetPlan {
    /// Already in the wanted state.
    Nothing,
    /// One `ComputerSystem.Reset` with this `ResetType`.
    Reset(&'static str),
    /// No single reset type cycles this system: `ForceOff`, wait for `Off`, then this one.
    OffThenOn(&'static str),
}

/// The `ResetType` values an `ActionInfo` resource lists (its `Parameters` entry named
/// `ResetType`, `AllowableValues`); `None` when it lists none.
pub fn action_info_resets(info: &Value) -> Option<Vec<String>> {
    info.get("Parameters")?
        .as_array()?
        .iter()
        .find(|p| p.get("Name").and_then(Value::as_str) == Some("ResetType"))
        .and_then(|p| string_list(p.get("AllowableValues")))
}

/// Why no [`ResetPlan`] carries out an action on a system: what it allows (`None`: it did
/// not say) has no reset type for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetPlanError {
    /// Nothing that powers on.
    #[error("the system allows no power-on reset type (allows {0:?})")]
    NoPowerOn(Option<Vec<String>>),
    /// No `ForceOff`.
    #[error("the system does not allow ForceOff (allows {0:?})")]
    NoForceOff(Option<Vec<String>>),
    /// Nothing that cycles, and no `ForceOff` to cycle with.
    #[error("the system allows neither PowerCycle, ForceRestart nor ForceOff (allows {0:?})")]
    NoCycle(Option<Vec<String>>),
}

/// Decide the reset for `action`. A service that lists no allowable values is taken to take
/// `On`, `ForceOff` and `ForceRestart`, the ones every BMC seen implements.
pub fn reset_plan(
    action: PowerAction,
    state: PowerState,
    allowed: Option<&[String]>,
) -> Result<ResetPlan, ResetPlanError> {
    let listed = || allowed.map(<[String]>::to_vec);
    let takes = |t: &str| match allowed {
        None => matches!(t, "On" | "ForceOff" | "ForceRestart"),
        Some(list) => list.iter().any(|a| a == t),
    };
    let first = |choices: &[&'static str]| choices.iter().copied().find(|t| takes(t));
    let on = || {
        first(&["On", "ForceOn", "PushPowerButton"])
            .ok_or_else(|| ResetPlanError::NoPowerOn(listed()))
    };
    match action {
        PowerAction::On if state == PowerState::On => Ok(ResetPlan::Nothing),
        PowerAction::On => on().map(ResetPlan::Reset),
        PowerAction::Off if state == PowerState::Off => Ok(ResetPlan::Nothing),
        PowerAction::Off => first(&["ForceOff"])
            .map(ResetPlan::Reset)
            .ok_or_else(|| ResetPlanError::NoForceOff(listed())),
        PowerAction::Cycle if state == PowerState::Off => on().map(ResetPlan::Reset),
        PowerAction::Cycle => match first(&["PowerCycle", "ForceRestart"]) {
            Some(t) => Ok(ResetPlan::Reset(t)),
            None if takes("ForceOff") => on().map(ResetPlan::OffThenOn),
            None => Err(ResetPlanError::NoCycle(listed())),
        },
    }
}

impl Redfish {
    pub async fn power_state(&self) -> Result<PowerState, PowerError> {
        Ok(self.system().await?.power_state)
    }

    async fn reset(&self, target: &str, reset_type: &str) -> Result<(), PowerError> {
        tracing::info!(endpoint = %self.cfg.endpoint, reset_type, "redfish reset");
        self.call(
            Method::POST,
            target,
            Some(&json!({"ResetType": reset_type})),
        )
        .await
        .map(|_| ())
    }

    /// Carry out a power action. Returns once the BMC accepted it; [`Self::wait_for`] waits
    /// for the state to follow.
    pub async fn set_power(&self, action: PowerAction) -> Result<(), PowerError> {
        let mut sys = self.system().await?;
        if sys.allowed_resets.is_none()
            && let Some(info) = sys.reset_action_info.clone()
        {
            // iDRAC 9 and newer iLO firmware publish the list only there. A service whose
            // ActionInfo cannot be read is treated like one that says nothing.
            match self.get_json(&info).await {
                Ok((_, v)) => sys.allowed_resets = action_info_resets(&v),
                Err(e) => {
                    tracing::warn!(endpoint = %self.cfg.endpoint, %info, error = %e, "redfish: cannot read the reset action's ActionInfo; assuming On, ForceOff and ForceRestart")
                }
            }
        }
        let plan = reset_plan(action, sys.power_state, sys.allowed_resets.as_deref()).map_err(
            |reason| PowerError::Unsupported {
                target: self.target(),
                what: format!("power {} ({reason})", action.as_str()),
            },
        )?;
        match plan {
            ResetPlan::Nothing => Ok(()),
            ResetPlan::Reset(t) => self.reset(&sys.reset_target, t).await,
            ResetPlan::OffThenOn(on) => {
                self.reset(&sys.reset_target, "ForceOff").await?;
                self.wait_for(PowerState::Off, Duration::from_secs(60))
                    .await?;
                self.reset(&sys.reset_target, on).await
            }
        }
    }

    /// Poll the power state until it reads `want` or `limit` passes.
    pub async fn wait_for(&self, want: PowerState, limit: Duration) -> Result<(), PowerError> {
        let start = tokio::time::Instant::now();
        loop {
            if self.power_state().await? == want {
                return Ok(());
            }
            if start.elapsed() >= limit {
                return Err(PowerError::Timeout {
                    target: self.target(),
                    what: format!("power state {}", want.as_str()),
                    waited: limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
