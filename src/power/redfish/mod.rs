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
//!
//! The client is split by job: [`session`] (login, HTTP Basic or a Redfish session, and its
//! deletion), [`reset`] (power state and `ComputerSystem.Reset`), [`boot`] (the boot-source
//! override and its mode) and [`etag`] (`If-Match` on the boot PATCH); this file holds the
//! settings, the transport and the ComputerSystem read they share, and the driver.

mod boot;
mod etag;
mod reset;
mod secureboot;
#[cfg(test)]
mod secureboot_tests;
mod session;
#[cfg(test)]
mod tests;

pub use boot::{ModePlan, boot_patch, boot_target, mode_plan};
pub use etag::{ETAG_READS, if_match_forms, stale_etag_reason};
pub use reset::{ResetPlan, ResetPlanError, action_info_resets, reset_plan};
pub use secureboot::{
    CertificateView, CertificatesUnreadable, DatabaseStatus, DatabaseView, Enrolled, KeysAction,
    SecureBootError, SecureBootRefusal, SecureBootStatus, SecureBootView, certificate_view,
    database_view, enable_patch, enroll_body, pick_database, post_refusal, reset_keys_body,
    secure_boot_link, secure_boot_view,
};
pub use session::{session_uri, sessions_path};

use std::time::Duration;

use futures_util::future::BoxFuture;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{BootDevice, BootPersistence, BootSet, PowerAction, PowerError, PowerState};
use crate::inventory::{AuthMode, BootMode, Credential, RedfishTarget};
use session::{Auth, sensitive};

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

/// Why the `/redfish/v1/Systems` collection names no one system.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MemberPathError {
    /// No `Members` array at all.
    #[error("the Systems collection has no Members array")]
    NoMembers,
    /// An empty `Members` array.
    #[error("the Systems collection is empty")]
    Empty,
    /// Several systems: the inventory must say which one.
    #[error(
        "the BMC has {} systems ({}); set `system:` in the node's power block to one of them",
        .0.len(),
        .0.join(", ")
    )]
    Several(Vec<String>),
}

/// Pick the system's path from the `/redfish/v1/Systems` collection.
pub(crate) fn member_path(collection: &Value) -> Result<String, MemberPathError> {
    let members = collection
        .get("Members")
        .and_then(Value::as_array)
        .ok_or(MemberPathError::NoMembers)?;
    let ids: Vec<&str> = members
        .iter()
        .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
        .collect();
    match ids.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err(MemberPathError::Empty),
        many => Err(MemberPathError::Several(
            many.iter().map(|id| (*id).to_owned()).collect(),
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
pub(crate) fn system_view(system: &Value, path: &str) -> SystemView {
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

/// The first `@Message.ExtendedInfo` or `error.message` of a Redfish error body, if any, so an
/// operator sees why the BMC refused.
pub(crate) fn error_message(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let err = v.get("error")?;
    let ext = err
        .pointer("/@Message.ExtendedInfo/0/Message")
        .and_then(Value::as_str);
    ext.or_else(|| err.get("message").and_then(Value::as_str))
        .map(|m| m.chars().take(300).collect())
}

/// What one request answered.
struct Answer {
    status: StatusCode,
    url: reqwest::Url,
    text: String,
    etag: Option<String>,
    /// The `Location` header (a created resource's URI, DSP0266 "POST (create)").
    location: Option<String>,
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

impl std::fmt::Debug for Redfish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redfish")
            .field("endpoint", &self.cfg.endpoint)
            .field("system_id", &self.cfg.system_id)
            .finish_non_exhaustive()
    }
}

impl Redfish {
    /// A request for `path` under the service root, with the headers every Redfish call
    /// carries (JSON, OData 4.0); authentication is the caller's.
    fn request(&self, method: &Method, path: &str) -> Result<reqwest::RequestBuilder, PowerError> {
        let url = self.base.join(path).map_err(|e| PowerError::Protocol {
            target: self.target(),
            reason: format!("bad resource path {path:?}: {e}"),
        })?;
        Ok(self
            .client
            .request(method.clone(), url)
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0"))
    }

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
        let mut req = self.request(&method, path)?;
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
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
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
            location,
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
                        member_path(&coll).map_err(|e| PowerError::Protocol {
                            target: self.target(),
                            reason: e.to_string(),
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

/// The Redfish client of a resolved target.
pub(crate) fn redfish(t: &RedfishTarget) -> Result<Redfish, PowerError> {
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
pub(crate) async fn with_redfish<T, E: From<PowerError>>(
    t: &RedfishTarget,
    op: impl AsyncFnOnce(&Redfish) -> Result<T, E>,
) -> Result<T, E> {
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

    fn secure_boot(
        &self,
    ) -> BoxFuture<'_, Result<crate::power::secureboot::SecureBootProbe, PowerError>> {
        Box::pin(with_redfish(self, async |rf| rf.secure_boot_probe().await))
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
