//! The client half of a rollout through a running `serve` (the server half is
//! [`super::start`] and serve's admin API): hands the request to serve's admin API and
//! follows its progress page by page until it ends, each line to the caller as it arrives.
//! Used by `talboot apply` and `talboot upgrade` when serve holds the store, and by
//! `talboot demo`. Also the HTTP client every `--admin` command talks to serve with; where
//! its admin token comes from (a file, the environment) is the caller's business.

use super::{ProgressPage, RemoteOutcome, RolloutRequest, Started};

/// Why the rollout could not be handed to serve or followed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RemoteError {
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

/// Why the admin HTTP client could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The token has characters an HTTP header cannot carry (the token is not shown).
    #[error("the admin token cannot be sent in an HTTP header")]
    Token,
    /// reqwest could not build the client.
    #[error(transparent)]
    Build(#[from] reqwest::Error),
}

/// The HTTP client of the `--admin` commands: no proxy (the admin API is this host's or the
/// management network's), with `bearer` (the admin token), when there is one, as
/// `Authorization: Bearer` (marked sensitive, so no log of reqwest's shows it).
pub(crate) fn http_client(bearer: Option<&str>) -> Result<reqwest::Client, ClientError> {
    let mut builder = reqwest::Client::builder().no_proxy();
    if let Some(token) = bearer {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| ClientError::Token)?;
        value.set_sensitive(true);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, value);
        builder = builder.default_headers(headers);
    }
    Ok(builder.build()?)
}

/// Starts `request` on the serve whose admin API is at `base` (`http://127.0.0.1:8081`) and
/// follows it to its end with `client` (see [`http_client`]); each progress line goes to
/// `say`.
pub async fn follow(
    client: &reqwest::Client,
    base: &str,
    request: &RolloutRequest,
    mut say: impl FnMut(&str),
) -> Result<RemoteOutcome, RemoteError> {
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
    let bytes = success_body(&url, resp).await?;
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
        let bytes = success_body(&url, resp).await?;
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

/// The body of an answer, or the refusal it carries (any status but 2xx, with serve's text).
async fn success_body(url: &str, resp: reqwest::Response) -> Result<Vec<u8>, RemoteError> {
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| RemoteError::Unreachable {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    if !status.is_success() {
        return Err(RemoteError::Refused {
            status: status.as_u16(),
            message: String::from_utf8_lossy(&bytes).trim_end().to_owned(),
        });
    }
    Ok(bytes.into())
}

fn parse<T: serde::de::DeserializeOwned>(url: &str, bytes: &[u8]) -> Result<T, RemoteError> {
    serde_json::from_slice(bytes).map_err(|e| RemoteError::Protocol {
        url: url.to_owned(),
        reason: e.to_string(),
    })
}

/// serve's admin listen address (`--admin`) as the base URL of its admin API.
pub fn base_url(admin: std::net::SocketAddr) -> String {
    format!("http://{admin}")
}
