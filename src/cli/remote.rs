//! The CLI's end of a rollout through a running `serve`: the client half of
//! [`crate::daytwo::remote`] ([`crate::daytwo::remote::client`]), with the admin token the
//! command line or the environment gives ([`super::admin_client`]). Used by `talboot apply`
//! and `talboot upgrade` when serve holds the store.

use crate::daytwo::remote::client::{self, RemoteError};
use crate::daytwo::remote::{RemoteOutcome, RolloutRequest};

/// Starts `request` on the serve whose admin API is at `base` (`http://127.0.0.1:8081`) and
/// follows it to its end; each progress line goes to `say`.
pub async fn follow(
    base: &str,
    request: &RolloutRequest,
    say: impl FnMut(&str),
) -> Result<RemoteOutcome, RemoteError> {
    crate::install_crypto_provider();
    let client = super::admin_client::client().map_err(|e| RemoteError::Unreachable {
        url: base.to_owned(),
        reason: e.to_string(),
    })?;
    client::follow(&client, base, request, say).await
}
