//! The Redfish power driver: a small DMTF Redfish client on talboot's own HTTP stack
//! (reqwest + rustls), owning system discovery, `ComputerSystem.Reset`, the boot-source
//! override and the power-state read for one BMC.
//!
//! Why not a crate: see docs/architecture.md ("Power: Redfish"). The protocol decisions
//! (which member is the system, which `ResetType` an action becomes, the boot-override body,
//! how a `PowerState` reads) are pure functions below, tested without a BMC; [`Redfish`] is
//! the thin adapter that puts them on the wire.
//!
//! Behaviour relied on, from the DMTF schema (DMTF/Redfish-Publications, csdl/ComputerSystem_v1.xml
//! and csdl/Resource_v1.xml, rows in docs/conformance.md):
//! - a service's systems are the `Members` of `/redfish/v1/Systems`, each an `@odata.id` link;
//! - `Actions/#ComputerSystem.Reset/target` is the URI to POST `{"ResetType": ...}` to, and
//!   `ResetType@Redfish.AllowableValues`, when present, lists the only values the service takes;
//! - `Boot/BootSourceOverrideTarget` (`Pxe`, `Hdd`) with `BootSourceOverrideEnabled` (`Once`,
//!   `Continuous`) is PATCHed on the ComputerSystem; `PowerState` is `On`, `Off`, `PoweringOn`
//!   or `PoweringOff` (`Paused` since v1.13).
//!
//! A BMC that sends an `ETag` with the ComputerSystem gets it back as `If-Match` on the boot
//! PATCH (many refuse a PATCH without it: 428, RFC 6585 section 3), with sushy's fallbacks
//! after a 412 ([`if_match_attempts`]).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{BootDevice, BootPersistence, Credential, PowerAction, PowerError, PowerState};

/// One BMC's Redfish settings (the inventory's `power: {kind: redfish}` block, once resolved
/// with its credentials; the lead maps the inventory type onto this at merge).
#[derive(Debug, Clone)]
pub struct RedfishConfig {
    /// Base URL of the BMC, `https://bmc.example:443` (no path, no user info).
    pub endpoint: String,
    /// The ComputerSystem's id under `/redfish/v1/Systems/`; `None` discovers it (the
    /// service must then have exactly one system).
    pub system_id: Option<String>,
    pub username: String,
    pub password: Credential,
    /// Verify the BMC's TLS certificate (on unless the operator turns it off).
    pub verify_tls: bool,
    /// PEM CA bundle that signed the BMC's certificate; when set, only it is trusted.
    pub ca_pem: Option<Vec<u8>>,
    /// Per-request timeout.
    pub timeout: Duration,
}

impl RedfishConfig {
    pub fn new(
        endpoint: impl Into<String>,
        username: impl Into<String>,
        password: Credential,
    ) -> Self {
        Self {
            endpoint: endpoint.into(),
            system_id: None,
            username: username.into(),
            password,
            verify_tls: true,
            ca_pem: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// What talboot reads from a ComputerSystem resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemView {
    pub power_state: PowerState,
    /// The URI to POST a reset to.
    pub reset_target: String,
    /// `ResetType@Redfish.AllowableValues`; `None` when the service does not say.
    pub allowed_resets: Option<Vec<String>>,
    /// `BootSourceOverrideTarget@Redfish.AllowableValues`; `None` when not said.
    pub allowed_boot_targets: Option<Vec<String>>,
}

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

/// Pick the system's path from the `/redfish/v1/Systems` collection.
pub fn member_path(collection: &Value) -> Result<String, String> {
    let members = collection
        .get("Members")
        .and_then(Value::as_array)
        .ok_or("the Systems collection has no Members array")?;
    let ids: Vec<&str> = members
        .iter()
        .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
        .collect();
    match ids.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err("the Systems collection is empty".into()),
        many => Err(format!(
            "the BMC has {} systems ({}); set `system:` in the node's power block to one of them",
            many.len(),
            many.join(", ")
        )),
    }
}

fn string_list(v: Option<&Value>) -> Option<Vec<String>> {
    v.and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    })
}

/// Read a ComputerSystem resource; `path` is where it was fetched, the fallback reset target
/// when the service omits `target` (the schema requires it; some BMCs still omit it).
pub fn system_view(system: &Value, path: &str) -> SystemView {
    let power_state = match system.get("PowerState").and_then(Value::as_str) {
        Some("On") | Some("PoweringOff") | Some("Paused") => PowerState::On,
        Some("Off") | Some("PoweringOn") => PowerState::Off,
        _ => PowerState::Unknown,
    };
    let reset = system.pointer("/Actions/#ComputerSystem.Reset");
    let reset_target = reset
        .and_then(|r| r.get("target"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "{}/Actions/ComputerSystem.Reset",
                path.trim_end_matches('/')
            )
        });
    SystemView {
        power_state,
        reset_target,
        allowed_resets: string_list(reset.and_then(|r| r.get("ResetType@Redfish.AllowableValues"))),
        allowed_boot_targets: string_list(
            system.pointer("/Boot/BootSourceOverrideTarget@Redfish.AllowableValues"),
        ),
    }
}

/// Decide the reset for `action`. A service that lists no allowable values is taken to take
/// `On`, `ForceOff` and `ForceRestart`, the ones every BMC seen implements.
pub fn reset_plan(
    action: PowerAction,
    state: PowerState,
    allowed: Option<&[String]>,
) -> Result<ResetPlan, String> {
    let takes = |t: &str| match allowed {
        None => matches!(t, "On" | "ForceOff" | "ForceRestart"),
        Some(list) => list.iter().any(|a| a == t),
    };
    let first = |choices: &[&'static str]| choices.iter().copied().find(|t| takes(t));
    let on = || {
        first(&["On", "ForceOn", "PushPowerButton"])
            .ok_or_else(|| format!("the system allows no power-on reset type (allows {allowed:?})"))
    };
    match action {
        PowerAction::On if state == PowerState::On => Ok(ResetPlan::Nothing),
        PowerAction::On => on().map(ResetPlan::Reset),
        PowerAction::Off if state == PowerState::Off => Ok(ResetPlan::Nothing),
        PowerAction::Off => first(&["ForceOff"])
            .map(ResetPlan::Reset)
            .ok_or_else(|| format!("the system does not allow ForceOff (allows {allowed:?})")),
        PowerAction::Cycle if state == PowerState::Off => on().map(ResetPlan::Reset),
        PowerAction::Cycle => match first(&["PowerCycle", "ForceRestart"]) {
            Some(t) => Ok(ResetPlan::Reset(t)),
            None if takes("ForceOff") => on().map(ResetPlan::OffThenOn),
            None => Err(format!(
                "the system allows neither PowerCycle, ForceRestart nor ForceOff (allows {allowed:?})"
            )),
        },
    }
}

/// The `BootSourceOverrideTarget` value for a device.
pub fn boot_target(device: BootDevice) -> &'static str {
    match device {
        BootDevice::Network => "Pxe",
        BootDevice::Disk => "Hdd",
    }
}

/// The PATCH body that sets the boot-source override.
pub fn boot_patch(device: BootDevice, persistence: BootPersistence) -> Value {
    let enabled = match persistence {
        BootPersistence::Once => "Once",
        BootPersistence::Persistent => "Continuous",
    };
    json!({"Boot": {
        "BootSourceOverrideTarget": boot_target(device),
        "BootSourceOverrideEnabled": enabled,
    }})
}

/// The first `@Message.ExtendedInfo` or `error.message` of a Redfish error body, if any, so an
/// operator sees why the BMC refused.
pub fn error_message(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let err = v.get("error")?;
    let ext = err
        .pointer("/@Message.ExtendedInfo/0/Message")
        .and_then(Value::as_str);
    ext.or_else(|| err.get("message").and_then(Value::as_str))
        .map(|m| m.chars().take(300).collect())
}

/// The `If-Match` values a PATCH of a resource is tried with, in order, given the `ETag` its
/// GET answered (the order of openstack/sushy 5.8.0, sushy/connector.py `_etag_handler`,
/// which ironic drives real BMCs with):
/// - no ETag: one attempt without `If-Match` (sushy-tools 2.2.0 and many BMCs send none);
/// - a strong ETag: itself, then (after a 412) without `If-Match`;
/// - a weak ETag `W/"x"`: itself, then its strong form `"x"` (RFC 7232 section 3.1 compares
///   `If-Match` strongly, so a weak tag never matches there; BMCs that hand out weak tags take
///   the strong form), then without `If-Match`.
///
/// A 412 moves to the next attempt; the last answer is the result.
pub fn if_match_attempts(etag: Option<&str>) -> Vec<Option<String>> {
    let Some(tag) = etag.map(str::trim).filter(|t| !t.is_empty()) else {
        return vec![None];
    };
    let mut out = vec![Some(tag.to_owned())];
    if let Some(strong) = tag.strip_prefix("W/")
        && strong.len() >= 2
        && strong.starts_with('"')
        && strong.ends_with('"')
    {
        out.push(Some(strong.to_owned()));
    }
    out.push(None);
    out
}

/// What one request answered.
struct Answer {
    status: StatusCode,
    url: reqwest::Url,
    text: String,
    etag: Option<String>,
}

/// A Redfish BMC, with its system path found on first use.
pub struct Redfish {
    cfg: RedfishConfig,
    base: reqwest::Url,
    client: reqwest::Client,
    system_path: tokio::sync::OnceCell<String>,
}

impl std::fmt::Debug for Redfish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redfish")
            .field("endpoint", &self.cfg.endpoint)
            .field("system_id", &self.cfg.system_id)
            .finish_non_exhaustive()
    }
}

impl Redfish {
    /// Build the client. Fails on an endpoint that is not a plain `http(s)://host[:port]` URL
    /// (user info in it would put a secret in every error message) or an unreadable CA.
    pub fn new(cfg: RedfishConfig) -> Result<Self, PowerError> {
        let bad = |reason: String| PowerError::Protocol {
            target: cfg.endpoint.clone(),
            reason,
        };
        let base = reqwest::Url::parse(&cfg.endpoint).map_err(|e| {
            bad(format!(
                "the endpoint is not a URL ({e}); write https://HOST[:PORT]"
            ))
        })?;
        if !matches!(base.scheme(), "https" | "http") || base.host_str().is_none() {
            return Err(bad("the endpoint must be https://HOST[:PORT]".into()));
        }
        if !base.username().is_empty() || base.password().is_some() {
            // Not echoing the URL: it holds the secret.
            return Err(PowerError::Protocol {
                target: format!("{}://{}", base.scheme(), base.host_str().unwrap_or("")),
                reason: "the endpoint carries user info; put the user in `user:` and the password in the secrets".into(),
            });
        }
        // Same-host redirects only (sushy answers /Systems/<name> with a 307 to the UUID
        // URL); a redirect elsewhere would take the Basic credentials with it.
        let redirect = reqwest::redirect::Policy::custom(|attempt| {
            let same = attempt
                .previous()
                .first()
                .is_some_and(|first| first.origin() == attempt.url().origin());
            if same && attempt.previous().len() < 5 {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let client = super::http_client(
            "Redfish",
            &cfg.endpoint,
            cfg.timeout,
            cfg.ca_pem.as_deref(),
            cfg.verify_tls,
            redirect,
        )
        .map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            cfg,
            base,
            client,
            system_path: tokio::sync::OnceCell::new(),
        })
    }

    fn target(&self) -> String {
        self.cfg.endpoint.clone()
    }

    /// One request; `if_match` becomes the `If-Match` header. Answers the status, final URL,
    /// body and `ETag` header whatever the status, except refused credentials.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, PowerError> {
        let url = self.base.join(path).map_err(|e| PowerError::Protocol {
            target: self.target(),
            reason: format!("bad resource path {path:?}: {e}"),
        })?;
        let mut req = self
            .client
            .request(method.clone(), url)
            .basic_auth(&self.cfg.username, Some(self.cfg.password.expose()))
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        if let Some(tag) = if_match {
            req = req.header(reqwest::header::IF_MATCH, tag);
        }
        let resp = req.send().await.map_err(|e| PowerError::Unreachable {
            target: self.target(),
            // without_url: the URL is ours and harmless, but keep the message short and sure.
            reason: error_chain(&e.without_url()),
        })?;
        let status = resp.status();
        let url = resp.url().clone();
        let etag = resp
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = resp.text().await.unwrap_or_default();
        tracing::debug!(endpoint = %self.cfg.endpoint, %method, path, status = status.as_u16(), if_match, "redfish");
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(PowerError::Unauthorized {
                target: self.target(),
            });
        }
        Ok(Answer {
            status,
            url,
            text,
            etag,
        })
    }

    /// The refusal of a request that did not succeed, with the BMC's own message.
    fn refused(&self, method: &Method, path: &str, a: &Answer) -> PowerError {
        let why = error_message(&a.text).unwrap_or_default();
        PowerError::Protocol {
            target: self.target(),
            reason: format!(
                "{method} {path} answered {}{}{why}",
                a.status,
                if why.is_empty() { "" } else { ": " }
            ),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, PowerError> {
        let a = self.send(method.clone(), path, body, None).await?;
        if !a.status.is_success() {
            return Err(self.refused(&method, path, &a));
        }
        Ok(a)
    }

    async fn get_json(&self, path: &str) -> Result<(reqwest::Url, Value), PowerError> {
        self.get_json_tagged(path).await.map(|(url, v, _)| (url, v))
    }

    /// GET `path` as JSON, with the resource's `ETag` when the service sent one.
    async fn get_json_tagged(
        &self,
        path: &str,
    ) -> Result<(reqwest::Url, Value, Option<String>), PowerError> {
        let a = self.call(Method::GET, path, None).await?;
        let v = serde_json::from_str(&a.text).map_err(|e| PowerError::Protocol {
            target: self.target(),
            reason: format!("GET {path}: not JSON ({e})"),
        })?;
        Ok((a.url, v, a.etag))
    }

    /// The ComputerSystem's path: the configured id (following the service's redirect to its
    /// canonical URL) or the one member of `/redfish/v1/Systems`.
    pub async fn system_path(&self) -> Result<&str, PowerError> {
        self.system_path
            .get_or_try_init(|| async {
                match &self.cfg.system_id {
                    Some(id) if id.starts_with("/redfish/") => Ok(id.clone()),
                    Some(id) => {
                        let (url, _) = self.get_json(&format!("/redfish/v1/Systems/{id}")).await?;
                        Ok(url.path().to_string())
                    }
                    None => {
                        let (_, coll) = self.get_json("/redfish/v1/Systems").await?;
                        member_path(&coll).map_err(|reason| PowerError::Protocol {
                            target: self.target(),
                            reason,
                        })
                    }
                }
            })
            .await
            .map(String::as_str)
    }

    /// Read the ComputerSystem resource.
    pub async fn system(&self) -> Result<SystemView, PowerError> {
        Ok(self.system_tagged().await?.0)
    }

    /// The ComputerSystem resource and its `ETag`, if the service sent one.
    async fn system_tagged(&self) -> Result<(SystemView, Option<String>), PowerError> {
        let path = self.system_path().await?.to_string();
        let (_, v, etag) = self.get_json_tagged(&path).await?;
        Ok((system_view(&v, &path), etag))
    }

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
        let sys = self.system().await?;
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

    /// Set the boot-source override (one-time or persistent).
    pub async fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> Result<(), PowerError> {
        let (sys, etag) = self.system_tagged().await?;
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
        let path = self.system_path().await?.to_string();
        tracing::info!(endpoint = %self.cfg.endpoint, device = device.as_str(), ?persistence, "redfish boot override");
        let body = boot_patch(device, persistence);
        let mut attempts = if_match_attempts(etag.as_deref()).into_iter().peekable();
        while let Some(tag) = attempts.next() {
            let a = self
                .send(Method::PATCH, &path, Some(&body), tag.as_deref())
                .await?;
            if a.status.is_success() {
                return Ok(());
            }
            if a.status == StatusCode::PRECONDITION_FAILED && attempts.peek().is_some() {
                tracing::warn!(endpoint = %self.cfg.endpoint, if_match = tag.as_deref(), "redfish: If-Match refused (412); trying the next form");
                continue;
            }
            let mut e = self.refused(&Method::PATCH, &path, &a);
            if a.status == StatusCode::PRECONDITION_REQUIRED
                && let PowerError::Protocol { reason, .. } = &mut e
            {
                reason.push_str(
                    " (the BMC requires If-Match but sent no ETag with the ComputerSystem)",
                );
            }
            return Err(e);
        }
        unreachable!("if_match_attempts always has an attempt")
    }
}

impl Redfish {
    /// After Talos is installed: boot from disk on every boot from now on, so a later
    /// power cycle never reinstalls the node even with a network-first firmware order (and
    /// a one-time `Pxe` override left by `rack up` is replaced).
    pub async fn boot_from_disk_after_install(&self) -> Result<(), PowerError> {
        self.set_boot_device(BootDevice::Disk, BootPersistence::Persistent)
            .await
    }
}

/// An error and its sources on one line (reqwest's top-level message alone says only
/// "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_member_is_the_system_and_several_need_a_choice() {
        let one = json!({"Members": [{"@odata.id": "/redfish/v1/Systems/abc"}]});
        assert_eq!(member_path(&one).unwrap(), "/redfish/v1/Systems/abc");
        let two = json!({"Members": [{"@odata.id": "/a"}, {"@odata.id": "/b"}]});
        let e = member_path(&two).unwrap_err();
        assert!(e.contains("/a, /b") && e.contains("system:"), "{e}");
        assert!(member_path(&json!({"Members": []})).is_err());
        assert!(member_path(&json!({})).is_err());
    }

    #[test]
    fn system_view_reads_state_target_and_allowables() {
        let sys = json!({
            "PowerState": "PoweringOn",
            "Boot": {"BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Hdd"]},
            "Actions": {"#ComputerSystem.Reset": {
                "target": "/redfish/v1/Systems/x/Actions/ComputerSystem.Reset",
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]
            }}
        });
        let v = system_view(&sys, "/redfish/v1/Systems/x");
        assert_eq!(v.power_state, PowerState::Off);
        assert_eq!(
            v.reset_target,
            "/redfish/v1/Systems/x/Actions/ComputerSystem.Reset"
        );
        assert_eq!(v.allowed_resets, Some(allowed(&["On", "ForceOff"])));
        assert_eq!(v.allowed_boot_targets, Some(allowed(&["Pxe", "Hdd"])));
        let bare = system_view(&json!({"PowerState": "On"}), "/redfish/v1/Systems/y/");
        assert_eq!(bare.power_state, PowerState::On);
        assert_eq!(
            bare.reset_target,
            "/redfish/v1/Systems/y/Actions/ComputerSystem.Reset"
        );
        assert_eq!(bare.allowed_resets, None);
        assert_eq!(
            system_view(&json!({}), "/s").power_state,
            PowerState::Unknown
        );
    }

    #[test]
    fn reset_plans_follow_the_allowable_values() {
        use PowerAction::*;
        use PowerState::{Off as S0, On as S1};
        // Nothing to do when already there.
        assert_eq!(reset_plan(On, S1, None), Ok(ResetPlan::Nothing));
        assert_eq!(reset_plan(Off, S0, None), Ok(ResetPlan::Nothing));
        // Defaults when the service says nothing.
        assert_eq!(reset_plan(On, S0, None), Ok(ResetPlan::Reset("On")));
        assert_eq!(reset_plan(Off, S1, None), Ok(ResetPlan::Reset("ForceOff")));
        assert_eq!(
            reset_plan(Cycle, S1, None),
            Ok(ResetPlan::Reset("ForceRestart"))
        );
        // A cycle of a machine that is off is a power-on.
        assert_eq!(reset_plan(Cycle, S0, None), Ok(ResetPlan::Reset("On")));
        // PowerCycle preferred where offered.
        let all = allowed(&["On", "ForceOff", "ForceRestart", "PowerCycle"]);
        assert_eq!(
            reset_plan(Cycle, S1, Some(&all)),
            Ok(ResetPlan::Reset("PowerCycle"))
        );
        // Only ForceOn / PushPowerButton for power-on.
        let push = allowed(&["PushPowerButton", "ForceOff"]);
        assert_eq!(
            reset_plan(On, S0, Some(&push)),
            Ok(ResetPlan::Reset("PushPowerButton"))
        );
        assert_eq!(
            reset_plan(Cycle, S1, Some(&push)),
            Ok(ResetPlan::OffThenOn("PushPowerButton"))
        );
        // Unknown state is treated as "not in the wanted state".
        assert_eq!(
            reset_plan(On, PowerState::Unknown, None),
            Ok(ResetPlan::Reset("On"))
        );
        // Impossible requests are refused, naming what the system allows.
        let e = reset_plan(Off, S1, Some(&allowed(&["On"]))).unwrap_err();
        assert!(e.contains("ForceOff") && e.contains("\"On\""), "{e}");
        assert!(reset_plan(Cycle, S1, Some(&allowed(&["On"]))).is_err());
        assert!(reset_plan(On, S0, Some(&allowed(&["ForceOff"]))).is_err());
    }

    #[test]
    fn boot_patch_bodies() {
        assert_eq!(
            boot_patch(BootDevice::Network, BootPersistence::Once),
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}})
        );
        assert_eq!(
            boot_patch(BootDevice::Disk, BootPersistence::Persistent),
            json!({"Boot": {"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Continuous"}})
        );
    }

    #[test]
    fn if_match_follows_the_etag_the_bmc_sent() {
        assert_eq!(if_match_attempts(None), [None]);
        assert_eq!(if_match_attempts(Some("")), [None]);
        assert_eq!(
            if_match_attempts(Some("\"abc\"")),
            [Some("\"abc\"".to_owned()), None]
        );
        assert_eq!(
            if_match_attempts(Some("W/\"7\"")),
            [Some("W/\"7\"".to_owned()), Some("\"7\"".to_owned()), None]
        );
    }

    #[test]
    fn error_bodies_give_their_message() {
        let ext = r#"{"error":{"code":"Base.1.0.GeneralError","message":"outer","@Message.ExtendedInfo":[{"Message":"inner"}]}}"#;
        assert_eq!(error_message(ext).as_deref(), Some("inner"));
        assert_eq!(
            error_message(r#"{"error":{"message":"m"}}"#).as_deref(),
            Some("m")
        );
        assert_eq!(error_message("<html>"), None);
    }

    #[test]
    fn an_endpoint_with_user_info_is_refused_without_echoing_it() {
        let cfg = RedfishConfig::new(
            "https://root:s3cret-pw@bmc.example",
            "root",
            Credential::new("x"),
        );
        let e = Redfish::new(cfg).unwrap_err().to_string();
        assert!(!e.contains("s3cret-pw"), "{e}");
        assert!(e.contains("user info"), "{e}");
        let cfg = RedfishConfig::new("bmc.example", "root", Credential::new("x"));
        assert!(Redfish::new(cfg).is_err());
    }

    proptest::proptest! {
        /// Whatever ETag a BMC sends: its own value first, the last attempt without
        /// If-Match, and nothing but the tag, its strong form and none in between.
        #[test]
        fn if_match_attempts_start_with_the_tag_and_end_without(
            weak in proptest::bool::ANY, opaque in "[A-Za-z0-9]{0,12}"
        ) {
            let tag = format!("{}\"{opaque}\"", if weak { "W/" } else { "" });
            let a = if_match_attempts(Some(&tag));
            proptest::prop_assert_eq!(a.first().cloned().flatten(), Some(tag.clone()));
            proptest::prop_assert_eq!(a.last().cloned(), Some(None));
            proptest::prop_assert_eq!(a.len(), if weak { 3 } else { 2 });
            if weak {
                proptest::prop_assert_eq!(a[1].clone(), Some(format!("\"{opaque}\"")));
            }
        }

        /// Whatever a service allows, a plan only ever uses values it allows.
        #[test]
        fn plans_use_only_allowed_values(
            mask in 0u8..64, action in 0u8..3, on in proptest::bool::ANY
        ) {
            const ALL: [&str; 6] = ["On", "ForceOn", "PushPowerButton", "ForceOff", "ForceRestart", "PowerCycle"];
            let list: Vec<String> = ALL.iter().enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0).map(|(_, s)| s.to_string()).collect();
            let action = [PowerAction::On, PowerAction::Off, PowerAction::Cycle][action as usize];
            let state = if on { PowerState::On } else { PowerState::Off };
            match reset_plan(action, state, Some(&list)) {
                Ok(ResetPlan::Reset(t)) => proptest::prop_assert!(list.iter().any(|a| a == t)),
                Ok(ResetPlan::OffThenOn(t)) => proptest::prop_assert!(
                    list.iter().any(|a| a == t) && list.iter().any(|a| a == "ForceOff")),
                Ok(ResetPlan::Nothing) | Err(_) => {}
            }
        }
    }
}
