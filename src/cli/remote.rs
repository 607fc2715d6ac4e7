//! The CLI's end of a rollout through a running `serve` (see [`crate::daytwo::remote`]):
//! hands the request to serve's admin API and follows its progress page by page until it
//! ends, each line to the caller as it arrives. Used by `talboot apply` and `talboot
//! upgrade` when serve holds the store, and by `talboot demo`.

use crate::daytwo::remote::{ProgressPage, RemoteOutcome, RolloutRequest, Started};

/// Why the rollout could not be handed to serve or followed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// serve's admin API did not answer.
    #[error(
        "serve's admin API at {url} did not answer: {reason}; pass --admin if serve's \
         --admin-listen is elsewhere"
    )]
    Unreachable { url: String, reason: String },
    /// serve refused the rollout (another one runs, or the request does not fit its
    /// inventory).
    #[error("serve refused the rollout ({status}): {message}")]
    Refused { status: u16, message: String },
    /// serve answered something that is not a rollout answer.
    #[error("serve's answer at {url} is not understood: {reason}")]
    Protocol { url: String, reason: String },
}

/// Starts `request` on the serve whose admin API is at `base` (`http://127.0.0.1:8081`) and
/// follows it to its end; each progress line goes to `say`.
pub async fn follow(
    base: &str,
    request: &RolloutRequest,
    mut say: impl FnMut(&str),
) -> Result<RemoteOutcome, RemoteError> {
    crate::install_crypto_provider();
    let client = super::admin_client::client().map_err(|reason| RemoteError::Unreachable {
        url: base.to_owned(),
        reason,
    })?;
    let url = format!("{base}/api/rollouts");
    let unreachable = |url: &str, e: reqwest::Error| RemoteError::Unreachable {
        url: url.to_owned(),
        reason: e.to_string(),
    };
    let body = serde_json::to_vec(request).expect("a rollout request serializes");
    let resp = client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| unreachable(&url, e))?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| unreachable(&url, e))?;
    if !status.is_success() {
        return Err(RemoteError::Refused {
            status: status.as_u16(),
            message: String::from_utf8_lossy(&bytes).trim_end().to_owned(),
        });
    }
    let started: Started = parse(&url, &bytes)?;
    say(&format!(
        "serve runs {} (rollout {})",
        started.what, started.id
    ));
    let mut after = 0;
    loop {
        let url = format!("{base}/api/rollouts/{}?after={after}", started.id);
        let resp = client
            .get(&url)
            .send()
            .await
            .map_err(|e| unreachable(&url, e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| unreachable(&url, e))?;
        if !status.is_success() {
            return Err(RemoteError::Refused {
                status: status.as_u16(),
                message: String::from_utf8_lossy(&bytes).trim_end().to_owned(),
            });
        }
        let page: ProgressPage = parse(&url, &bytes)?;
        for line in &page.lines {
            say(line);
        }
        after = page.next;
        if let Some(end) = page.end {
            return Ok(end);
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(url: &str, bytes: &[u8]) -> Result<T, RemoteError> {
    serde_json::from_slice(bytes).map_err(|e| RemoteError::Protocol {
        url: url.to_owned(),
        reason: e.to_string(),
    })
}

/// `--admin` as the base URL of serve's admin API.
pub(crate) fn base_url(admin: std::net::SocketAddr) -> String {
    format!("http://{admin}")
}
