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
//! - `Boot/BootSourceOverrideMode` (`UEFI`, `Legacy`) is set in the same PATCH from the node's
//!   firmware where the BMC takes it ([`mode_plan`]).
//!
//! A BMC that sends an `ETag` with the ComputerSystem gets it back as `If-Match` on the boot
//! PATCH (many refuse a PATCH without it: 428, RFC 6585 section 3), with sushy's strong-form
//! fallback after a 412 ([`if_match_forms`]); an ETag refused in every form went stale, and
//! the system is read again ([`ETAG_READS`]). Authentication is a Redfish session or HTTP
//! Basic ([`AuthMode`]).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{BootDevice, BootPersistence, BootSet, PowerAction, PowerError, PowerState};
use futures_util::future::BoxFuture;

use crate::inventory::{AuthMode, BootMode, Credential, RedfishTarget};

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
    /// The firmware mode the machine network-boots in (the node's `firmware:`), set as
    /// `BootSourceOverrideMode` with the boot override; `None` leaves the BMC's mode alone.
    pub boot_mode: Option<BootMode>,
    /// How talboot authenticates ([`AuthMode`]; `auto` unless the inventory says).
    pub auth: AuthMode,
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
            boot_mode: None,
            auth: AuthMode::Auto,
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
    /// The reset action's `@Redfish.ActionInfo` URI, where a service that lists no
    /// allowable values inline says which `ResetType`s it takes (DMTF DSP0266 1.15
    /// "Allowable values", the `ActionInfo` schema's `Parameters[].AllowableValues`).
    pub reset_action_info: Option<String>,
    /// `BootSourceOverrideTarget@Redfish.AllowableValues`; `None` when not said.
    pub allowed_boot_targets: Option<Vec<String>>,
    /// `Boot.BootSourceOverrideMode` as the BMC reads it; `None` when it has no such property.
    pub override_mode: Option<String>,
    /// `BootSourceOverrideMode@Redfish.AllowableValues`; `None` when not said.
    pub allowed_override_modes: Option<Vec<String>>,
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
        reset_action_info: reset
            .and_then(|r| r.get("@Redfish.ActionInfo"))
            .and_then(Value::as_str)
            .map(str::to_string),
        allowed_boot_targets: string_list(
            system.pointer("/Boot/BootSourceOverrideTarget@Redfish.AllowableValues"),
        ),
        override_mode: system
            .pointer("/Boot/BootSourceOverrideMode")
            .and_then(Value::as_str)
            .map(str::to_string),
        allowed_override_modes: string_list(
            system.pointer("/Boot/BootSourceOverrideMode@Redfish.AllowableValues"),
        ),
    }
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

/// The `If-Match` values a PATCH is tried with for one `ETag` its GET answered (the order of
/// openstack/sushy 5.8.0, sushy/connector.py `_etag_handler`, which ironic drives real BMCs
/// with): the tag itself, then for a weak `W/"x"` its strong form `"x"` (RFC 7232 section
/// 3.1 compares `If-Match` strongly, so a weak tag never matches there; BMCs that hand out
/// weak tags take the strong form). A 412 moves to the next form.
pub fn if_match_forms(etag: &str) -> Vec<String> {
    let tag = etag.trim();
    let mut out = vec![tag.to_owned()];
    if let Some(strong) = tag.strip_prefix("W/")
        && strong.len() >= 2
        && strong.starts_with('"')
        && strong.ends_with('"')
    {
        out.push(strong.to_owned());
    }
    out
}

/// How many times the ComputerSystem is read for one boot override whose ETag keeps going
/// stale (412 on every form of it) before talboot tries once without `If-Match` (sushy's last
/// resort) and then gives up.
pub const ETAG_READS: u32 = 4;

/// Why a boot override failed after its ETag went stale on every read: what happened, with
/// the count, and what the unconditional last try answered.
pub fn stale_etag_reason(reads: u32, last_tag: &str, unconditional: StatusCode) -> String {
    let after = if unconditional == StatusCode::PRECONDITION_REQUIRED {
        "without If-Match the BMC answered 428 Precondition Required (it takes no \
         unconditional change)"
            .to_string()
    } else {
        format!("without If-Match it answered {unconditional}")
    };
    format!(
        "the BMC answered 412 Precondition Failed to every If-Match: the ComputerSystem's ETag \
         went stale {reads} times in a row between talboot's read and its PATCH (talboot \
         re-read it and tried again each time; the last ETag was {last_tag}), and {after}; \
         something else keeps changing the system (another client, or the BMC itself): try \
         again"
    )
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
    /// How requests authenticate, settled by the first request ([`Self::login`]).
    auth: tokio::sync::OnceCell<Auth>,
    /// Set once the session was deleted ([`Self::close`]), so `Drop` does not delete it again.
    closed: std::sync::atomic::AtomicBool,
}

/// How this client's requests authenticate.
enum Auth {
    /// HTTP Basic with the configured user and password.
    Basic,
    /// A Redfish session (DMTF DSP0266, "Session login authentication"): its token goes in
    /// `X-Auth-Token`, and the session resource is DELETEd when done.
    Session {
        token: Credential,
        /// The session resource's path (its `Location`, else the body's `@odata.id`).
        uri: Option<String>,
    },
}

/// Where a service's sessions are created, from its service root: `Links.Sessions` (DSP0266
/// requires it of a service that has a SessionService), else `SessionService.Sessions` under
/// the conventional path when the root names a SessionService.
pub fn sessions_path(root: &Value) -> Option<String> {
    let link = |p: &str| root.pointer(p).and_then(Value::as_str).map(str::to_string);
    link("/Links/Sessions/@odata.id").or_else(|| {
        root.get("SessionService")
            .map(|_| "/redfish/v1/SessionService/Sessions".to_string())
    })
}

/// The path of a created session: its `Location` header (absolute or not), else the body's
/// `@odata.id`.
pub fn session_uri(location: Option<&str>, body: &Value) -> Option<String> {
    location
        .map(|l| match reqwest::Url::parse(l) {
            Ok(u) => u.path().to_string(),
            Err(_) => l.to_string(),
        })
        .filter(|p| p.starts_with('/'))
        .or_else(|| {
            body.get("@odata.id")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
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
            auth: tokio::sync::OnceCell::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
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
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        req = match self.auth().await? {
            Auth::Basic => req.basic_auth(&self.cfg.username, Some(self.cfg.password.expose())),
            Auth::Session { token, .. } => req.header("X-Auth-Token", sensitive(token)?),
        };
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

    /// How this client authenticates, settled on first use ([`AuthMode`]).
    async fn auth(&self) -> Result<&Auth, PowerError> {
        self.auth.get_or_try_init(|| self.login()).await
    }

    /// Open a Redfish session where [`AuthMode`] says so: POST `UserName`/`Password` to the
    /// service's sessions collection, keep the `X-Auth-Token` it answers (DMTF DSP0266,
    /// "Session login authentication"). In `auto`, a service without sessions, or a login
    /// that fails for any reason but an unreachable BMC, falls back to HTTP Basic (sushy's
    /// `SessionOrBasicAuth`). Neither the password nor the token is ever logged.
    async fn login(&self) -> Result<Auth, PowerError> {
        let mode = self.cfg.auth;
        if mode == AuthMode::Basic {
            return Ok(Auth::Basic);
        }
        let fallback = |why: String| -> Result<Auth, PowerError> {
            match mode {
                AuthMode::Session => Err(PowerError::Protocol {
                    target: self.target(),
                    reason: format!(
                        "Redfish session login failed: {why} (the inventory's `auth: session` allows no HTTP Basic; use `auth: auto` or `basic`)"
                    ),
                }),
                _ => {
                    tracing::info!(endpoint = %self.cfg.endpoint, "redfish: {why}; using HTTP Basic");
                    Ok(Auth::Basic)
                }
            }
        };
        // The service root answers without authentication (DSP0266, "Service root").
        let root = self
            .unauthenticated(Method::GET, "/redfish/v1/", None)
            .await?;
        let root: Value = serde_json::from_str(&root.2).unwrap_or(Value::Null);
        let path = match (sessions_path(&root), mode) {
            (Some(p), _) => p,
            (None, AuthMode::Session) => "/redfish/v1/SessionService/Sessions".to_string(),
            (None, _) => return fallback("the service root advertises no SessionService".into()),
        };
        let body = json!({"UserName": self.cfg.username, "Password": self.cfg.password.expose()});
        let (status, headers, text) = self
            .unauthenticated(Method::POST, &path, Some(&body))
            .await?;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            if mode == AuthMode::Session {
                return Err(PowerError::Unauthorized {
                    target: self.target(),
                });
            }
            return fallback(format!("session login to {path} refused ({status})"));
        }
        if !status.is_success() {
            let why = error_message(&text)
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            return fallback(format!("session login to {path} answered {status}{why}"));
        }
        let Some(token) = headers
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .filter(|t| !t.is_empty())
        else {
            return fallback(format!("session login to {path} answered no X-Auth-Token"));
        };
        let created: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let location = headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok());
        let uri = session_uri(location, &created);
        tracing::info!(endpoint = %self.cfg.endpoint, session = uri.as_deref(), "redfish session opened");
        Ok(Auth::Session {
            token: Credential::new(token),
            uri,
        })
    }

    /// A request without credentials (the service root and the session login).
    async fn unauthenticated(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, reqwest::header::HeaderMap, String), PowerError> {
        let url = self.base.join(path).map_err(|e| PowerError::Protocol {
            target: self.target(),
            reason: format!("bad resource path {path:?}: {e}"),
        })?;
        let mut req = self
            .client
            .request(method.clone(), url)
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        let resp = req.send().await.map_err(|e| PowerError::Unreachable {
            target: self.target(),
            reason: error_chain(&e.without_url()),
        })?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        tracing::debug!(endpoint = %self.cfg.endpoint, %method, path, status = status.as_u16(), "redfish (no credentials)");
        Ok((status, headers, text))
    }

    /// End the Redfish session, if one was opened: DELETE its resource with its own token
    /// (DSP0266, "Session termination"), so a BMC with few session slots is not left full.
    /// A failure is logged, not returned: the operation itself is done. With HTTP Basic,
    /// nothing to do.
    pub async fn close(&self) {
        let Some(Auth::Session { token, uri }) = self.auth.get() else {
            return;
        };
        if self.closed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let Some(uri) = uri else {
            tracing::warn!(endpoint = %self.cfg.endpoint, "redfish: the session has no URI to delete; it ends when the BMC times it out");
            return;
        };
        if let Err(e) = delete_session(&self.client, &self.base, uri, token).await {
            tracing::warn!(endpoint = %self.cfg.endpoint, session = %uri, "redfish: deleting the session failed: {e}");
        } else {
            tracing::info!(endpoint = %self.cfg.endpoint, session = %uri, "redfish session closed");
        }
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
        let v: Value = serde_json::from_str(&a.text).map_err(|e| PowerError::Protocol {
            target: self.target(),
            reason: format!("GET {path}: not JSON ({e})"),
        })?;
        // The header first; else the resource's own `@odata.etag` (DMTF DSP0266 1.15
        // "ETags": a service may carry the ETag in the body, as vendor trees and
        // Redfish-Mockup-Server without its headers files do).
        let etag = a.etag.or_else(|| {
            v.get("@odata.etag")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        Ok((a.url, v, etag))
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
        'read: loop {
            reads += 1;
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
            let plan = match &mode_refused {
                Some(why) => ModePlan::Warn(why.clone()),
                None => mode_plan(self.cfg.boot_mode, &sys),
            };
            let body = boot_patch(device, persistence, plan.mode());
            let forms: Vec<Option<String>> = match etag.as_deref().map(str::trim) {
                Some(t) if !t.is_empty() => if_match_forms(t).into_iter().map(Some).collect(),
                _ => vec![None],
            };
            for tag in &forms {
                let a = self
                    .send(Method::PATCH, &path, Some(&body), tag.as_deref())
                    .await?;
                if a.status.is_success() {
                    return Ok(self.boot_set(&sys, &plan, reads));
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
                    mode_refused = Some(format!(
                        "the BMC refused boot override mode {m} ({why}); the machine boots in {} mode: change it in the machine's firmware setup",
                        sys.override_mode.as_deref().unwrap_or("its firmware's")
                    ));
                    reads -= 1;
                    continue 'read;
                }
                let mut e = self.refused(&Method::PATCH, &path, &a);
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
            // Every form of the tag was refused with 412: it went stale.
            let last = etag.unwrap_or_default();
            if reads < ETAG_READS {
                tracing::warn!(endpoint = %self.cfg.endpoint, etag = %last, stale = reads, "redfish: the ComputerSystem's ETag went stale (412); re-reading it and trying again");
                continue;
            }
            // sushy's last resort: the PATCH without If-Match.
            let a = self.send(Method::PATCH, &path, Some(&body), None).await?;
            if a.status.is_success() {
                let mut set = self.boot_set(&sys, &plan, reads);
                set.notes.push(format!(
                    "the ETag went stale {reads} times; the BMC took the change without If-Match"
                ));
                return Ok(set);
            }
            return Err(PowerError::Protocol {
                target: self.target(),
                reason: format!(
                    "PATCH {path}: {}",
                    stale_etag_reason(reads, &last, a.status)
                ),
            });
        }
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

/// The session token as a header value marked sensitive (hyper then never shows it).
fn sensitive(token: &Credential) -> Result<reqwest::header::HeaderValue, PowerError> {
    let mut v = reqwest::header::HeaderValue::from_str(token.expose()).map_err(|_| {
        PowerError::Protocol {
            target: String::new(),
            reason: "the BMC's X-Auth-Token is not a valid header value".into(),
        }
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// DELETE a session resource with its own token; the status when it is not a success.
async fn delete_session(
    client: &reqwest::Client,
    base: &reqwest::Url,
    uri: &str,
    token: &Credential,
) -> Result<(), String> {
    let url = base.join(uri).map_err(|e| e.to_string())?;
    let resp = client
        .delete(url)
        .header("X-Auth-Token", sensitive(token).map_err(|e| e.to_string())?)
        .header("OData-Version", "4.0")
        .send()
        .await
        .map_err(|e| error_chain(&e.without_url()))?;
    if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND {
        Ok(())
    } else {
        Err(format!("DELETE answered {}", resp.status()))
    }
}

impl Drop for Redfish {
    /// A session left open (an early return, a panic) is deleted in the background when a
    /// runtime is there to do it; [`Redfish::close`] is the normal way.
    fn drop(&mut self) {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let Some(Auth::Session {
            token,
            uri: Some(uri),
        }) = self.auth.take()
        else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (client, base) = (self.client.clone(), self.base.clone());
            rt.spawn(async move {
                let _ = delete_session(&client, &base, &uri, &token).await;
            });
        }
    }
}

/// The Redfish client of a resolved target.
fn redfish(t: &RedfishTarget) -> Result<Redfish, PowerError> {
    let mut cfg = RedfishConfig::new(t.endpoint.clone(), t.user.clone(), t.password.clone());
    cfg.system_id = t.system_id.clone();
    cfg.verify_tls = t.verify_tls;
    cfg.ca_pem = super::read_ca(t.ca.as_deref(), &t.endpoint)?;
    cfg.boot_mode = t.boot_mode;
    cfg.auth = t.auth;
    Redfish::new(cfg)
}

/// One operation on a Redfish BMC, then its session (if one was opened) deleted, whether
/// the operation succeeded or not.
async fn with_redfish<T>(
    t: &RedfishTarget,
    op: impl AsyncFnOnce(&Redfish) -> Result<T, PowerError>,
) -> Result<T, PowerError> {
    let rf = redfish(t)?;
    let out = op(&rf).await;
    rf.close().await;
    out
}

/// The Redfish driver: a client (and session) per request.
impl super::Driver for RedfishTarget {
    fn set_power(&self, action: PowerAction) -> BoxFuture<'_, Result<(), PowerError>> {
        Box::pin(with_redfish(self, async move |rf| {
            rf.set_power(action).await
        }))
    }

    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, PowerError>> {
        Box::pin(with_redfish(self, async |rf| rf.power_state().await))
    }

    fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> BoxFuture<'_, Result<BootSet, PowerError>> {
        Box::pin(with_redfish(self, async move |rf| {
            rf.set_boot_device(device, persistence).await
        }))
    }
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
    fn reset_types_are_read_from_the_action_info_where_not_inline() {
        let sys = json!({
            "PowerState": "On",
            "Actions": {"#ComputerSystem.Reset": {
                "target": "/redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset",
                "@Redfish.ActionInfo": "/redfish/v1/Systems/System.Embedded.1/ResetActionInfo"
            }}
        });
        let v = system_view(&sys, "/redfish/v1/Systems/System.Embedded.1");
        assert_eq!(v.allowed_resets, None);
        assert_eq!(
            v.reset_action_info.as_deref(),
            Some("/redfish/v1/Systems/System.Embedded.1/ResetActionInfo")
        );
        let info = json!({
            "@odata.type": "#ActionInfo.v1_1_2.ActionInfo",
            "Parameters": [{
                "Name": "ResetType", "Required": true, "DataType": "String",
                "AllowableValues": ["On", "ForceOff", "GracefulRestart", "PushPowerButton", "Nmi"]
            }]
        });
        let resets = action_info_resets(&info).unwrap();
        assert_eq!(
            resets,
            allowed(&[
                "On",
                "ForceOff",
                "GracefulRestart",
                "PushPowerButton",
                "Nmi"
            ])
        );
        // No PowerCycle and no ForceRestart: a cycle is ForceOff, then On.
        assert_eq!(
            reset_plan(PowerAction::Cycle, PowerState::On, Some(&resets)),
            Ok(ResetPlan::OffThenOn("On"))
        );
        assert_eq!(action_info_resets(&json!({"Parameters": []})), None);
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
            boot_patch(BootDevice::Network, BootPersistence::Once, None),
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}})
        );
        assert_eq!(
            boot_patch(BootDevice::Disk, BootPersistence::Persistent, None),
            json!({"Boot": {"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Continuous"}})
        );
        assert_eq!(
            boot_patch(BootDevice::Network, BootPersistence::Once, Some("UEFI")),
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once",
                            "BootSourceOverrideMode": "UEFI"}})
        );
    }

    #[test]
    fn if_match_forms_follow_the_etag_the_bmc_sent() {
        assert_eq!(if_match_forms("\"abc\""), ["\"abc\""]);
        assert_eq!(if_match_forms(" W/\"7\" "), ["W/\"7\"", "\"7\""]);
        // Not a well-formed weak tag: sent as it came.
        assert_eq!(if_match_forms("W/7"), ["W/7"]);
    }

    fn view(mode: Option<&str>, allowed: Option<&[&str]>) -> SystemView {
        let mut boot = json!({});
        if let Some(m) = mode {
            boot["BootSourceOverrideMode"] = json!(m);
        }
        if let Some(a) = allowed {
            boot["BootSourceOverrideMode@Redfish.AllowableValues"] = json!(a);
        }
        system_view(
            &json!({"PowerState": "Off", "Boot": boot}),
            "/redfish/v1/Systems/1",
        )
    }

    #[test]
    fn the_override_mode_follows_the_node_where_the_bmc_allows_it() {
        use BootMode::{Legacy, Uefi};
        let both: &[&str] = &["Legacy", "UEFI"];
        // The issue's case: a Legacy default, a UEFI node: UEFI is sent.
        assert_eq!(
            mode_plan(Some(Uefi), &view(Some("Legacy"), Some(both))),
            ModePlan::Set("UEFI")
        );
        // The property present without a list is taken as writable (read-write in the schema).
        assert_eq!(
            mode_plan(Some(Uefi), &view(Some("Legacy"), None)),
            ModePlan::Set("UEFI")
        );
        assert_eq!(
            mode_plan(Some(Legacy), &view(Some("UEFI"), Some(both))),
            ModePlan::Set("Legacy")
        );
        // Already there: nothing sent.
        assert_eq!(
            mode_plan(Some(Uefi), &view(Some("UEFI"), Some(both))),
            ModePlan::Keep
        );
        // Not allowed, or no such property: said, not sent.
        let ModePlan::Warn(w) = mode_plan(Some(Uefi), &view(Some("Legacy"), Some(&["Legacy"])))
        else {
            panic!("a mode outside the list is not sent")
        };
        assert!(
            w.contains("does not allow boot override mode UEFI") && w.contains("Legacy mode"),
            "{w}"
        );
        let ModePlan::Warn(w) = mode_plan(Some(Legacy), &view(None, None)) else {
            panic!("no property, nothing to send")
        };
        assert!(w.contains("no BootSourceOverrideMode"), "{w}");
        // A node without `firmware:`: the BMC's mode stays; a Legacy one is pointed out.
        assert_eq!(mode_plan(None, &view(Some("UEFI"), None)), ModePlan::Keep);
        assert_eq!(mode_plan(None, &view(None, None)), ModePlan::Keep);
        assert!(
            matches!(mode_plan(None, &view(Some("Legacy"), None)), ModePlan::Warn(w) if w.contains("firmware: uefi"))
        );
    }

    #[test]
    fn sessions_are_found_from_the_service_root() {
        let dmtf = json!({"Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
                          "SessionService": {"@odata.id": "/redfish/v1/SessionService"}});
        assert_eq!(
            sessions_path(&dmtf).as_deref(),
            Some("/redfish/v1/SessionService/Sessions")
        );
        let idrac = json!({"Links": {"Sessions": {"@odata.id": "/redfish/v1/Sessions"}}});
        assert_eq!(
            sessions_path(&idrac).as_deref(),
            Some("/redfish/v1/Sessions")
        );
        let no_link = json!({"SessionService": {"@odata.id": "/redfish/v1/SessionService"}});
        assert_eq!(
            sessions_path(&no_link).as_deref(),
            Some("/redfish/v1/SessionService/Sessions")
        );
        assert_eq!(sessions_path(&json!({"Systems": {}})), None);
        assert_eq!(sessions_path(&Value::Null), None);
        // The session's URI: Location (absolute or a path), else the body's @odata.id.
        let body = json!({"@odata.id": "/redfish/v1/SessionService/Sessions/b"});
        assert_eq!(
            session_uri(
                Some("https://10.0.0.1/redfish/v1/SessionService/Sessions/a"),
                &body
            )
            .as_deref(),
            Some("/redfish/v1/SessionService/Sessions/a")
        );
        assert_eq!(
            session_uri(Some("/redfish/v1/Sessions/7"), &body).as_deref(),
            Some("/redfish/v1/Sessions/7")
        );
        assert_eq!(
            session_uri(None, &body).as_deref(),
            Some("/redfish/v1/SessionService/Sessions/b")
        );
        assert_eq!(session_uri(None, &json!({})), None);
    }

    #[test]
    fn a_stale_etag_is_called_stale_with_the_count() {
        let r = stale_etag_reason(4, "W/\"9\"", StatusCode::PRECONDITION_REQUIRED);
        assert!(
            r.contains("went stale 4 times") && r.contains("re-read") && r.contains("W/\"9\""),
            "{r}"
        );
        assert!(r.contains("428") && !r.contains("sent no ETag"), "{r}");
        let r = stale_etag_reason(4, "\"9\"", StatusCode::CONFLICT);
        assert!(r.contains("409"), "{r}");
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
        /// Whatever ETag a BMC sends: its own value first, then for a weak tag its strong
        /// form, and nothing else.
        #[test]
        fn if_match_forms_start_with_the_tag(
            weak in proptest::bool::ANY, opaque in "[A-Za-z0-9]{0,12}"
        ) {
            let tag = format!("{}\"{opaque}\"", if weak { "W/" } else { "" });
            let a = if_match_forms(&tag);
            proptest::prop_assert_eq!(a.first().cloned(), Some(tag.clone()));
            proptest::prop_assert_eq!(a.len(), if weak { 2 } else { 1 });
            if weak {
                proptest::prop_assert_eq!(a[1].clone(), format!("\"{opaque}\""));
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

    #[test]
    fn an_unreadable_ca_is_named_and_no_secret_is_shown() {
        let t = RedfishTarget {
            endpoint: "https://10.0.50.11".into(),
            system_id: None,
            verify_tls: true,
            ca: Some("/nonexistent/bmc-ca.pem".into()),
            user: "admin".into(),
            password: Credential::new("s3cret-bmc"),
            auth: Default::default(),
            boot_mode: None,
        };
        let Err(err) = redfish(&t).map(|_| ()) else {
            panic!("a missing CA is an error")
        };
        let err = err.to_string();
        assert!(err.contains("/nonexistent/bmc-ca.pem"), "{err}");
        assert!(!err.contains("s3cret-bmc"), "{err}");
    }
}
