//! How a Redfish client authenticates: HTTP Basic, or a Redfish session (DMTF DSP0266,
//! "Session login authentication") opened on first use and deleted when done, as the
//! inventory's `auth:` ([`AuthMode`]) says.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Redfish, error_chain, error_message};
use crate::inventory::{AuthMode, Credential};
use crate::power::PowerError;

/// How this client's requests authenticate.
pub(super) enum Auth {
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

impl Redfish {
    /// How this client authenticates, settled on first use ([`AuthMode`]).
    pub(super) async fn auth(&self) -> Result<&Auth, PowerError> {
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
        let mut req = self.request(&method, path)?;
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
}

/// The session token as a header value marked sensitive (hyper then never shows it).
pub(super) fn sensitive(token: &Credential) -> Result<reqwest::header::HeaderValue, PowerError> {
    let mut v = reqwest::header::HeaderValue::from_str(token.expose()).map_err(|_| {
        PowerError::Protocol {
            target: String::new(),
            reason: "the BMC's X-Auth-Token is not a valid header value".into(),
        }
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// Why a session could not be deleted (logged; the BMC times the session out anyway).
#[derive(Debug, thiserror::Error)]
enum DeleteSessionError {
    /// The session URI does not resolve against the endpoint.
    #[error("{0}")]
    Uri(String),
    /// The token cannot be sent (it is not shown).
    #[error("{0}")]
    Token(PowerError),
    /// The request went unanswered.
    #[error("{}", error_chain(.0))]
    Send(reqwest::Error),
    /// The BMC refused.
    #[error("DELETE answered {0}")]
    Status(StatusCode),
}

/// DELETE a session resource with its own token; the status when it is not a success.
async fn delete_session(
    client: &reqwest::Client,
    base: &reqwest::Url,
    uri: &str,
    token: &Credential,
) -> Result<(), DeleteSessionError> {
    let url = base
        .join(uri)
        .map_err(|e| DeleteSessionError::Uri(e.to_string()))?;
    let resp = client
        .delete(url)
        .header(
            "X-Auth-Token",
            sensitive(token).map_err(DeleteSessionError::Token)?,
        )
        .header("OData-Version", "4.0")
        .send()
        .await
        .map_err(|e| DeleteSessionError::Send(e.without_url()))?;
    if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND {
        Ok(())
    } else {
        Err(DeleteSessionError::Status(resp.status()))
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
