//! The admin token on the CLI's side. `--admin-token-file` (a global flag, also
//! `TALBOOT_ADMIN_TOKEN_FILE`) is the one file both ends read: `serve` requires it for an
//! admin listener off loopback, and the `--admin` clients (`status`, `node rebuild`, `power`,
//! `rack`, `apply`, `upgrade`) send its token; a client without the flag takes
//! `TALBOOT_ADMIN_TOKEN`. [`client`] is the HTTP client those commands use
//! ([`crate::daytwo::remote::client::http_client`] with that token).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::admin::auth::{AdminToken, TokenError};
use crate::daytwo::remote::client::{ClientError, http_client};

/// The environment variable a client reads the token from when no file is given.
pub(crate) const TOKEN_ENV: &str = "TALBOOT_ADMIN_TOKEN";

/// `--admin-token-file`, set once by [`super::run`] from the parsed command line.
static TOKEN_FILE: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Records `--admin-token-file` (first call wins).
pub(crate) fn set_token_file(path: Option<PathBuf>) {
    let _ = TOKEN_FILE.set(path);
}

/// `--admin-token-file`, if given.
pub(crate) fn token_file() -> Option<&'static Path> {
    TOKEN_FILE.get().and_then(|p| p.as_deref())
}

/// The token a client sends: the file's, else [`TOKEN_ENV`]'s, else none (loopback needs
/// none).
pub(crate) fn client_token(
    file: Option<&Path>,
    env: Option<String>,
) -> Result<Option<AdminToken>, TokenError> {
    match (file, env) {
        (Some(path), _) => AdminToken::load(path).map(Some),
        (None, Some(text)) => AdminToken::parse(&text, TOKEN_ENV).map(Some),
        (None, None) => Ok(None),
    }
}

/// Why the `--admin` commands' HTTP client could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminClientError {
    /// The token file or variable does not hold a usable token.
    #[error("{0}")]
    Token(#[from] TokenError),
    /// The token has characters an HTTP header cannot carry (the token is not shown).
    #[error("the admin token from {TOKEN_ENV} or --admin-token-file cannot be sent")]
    Unsendable,
    /// reqwest could not build the client.
    #[error("{0}")]
    Build(reqwest::Error),
}

/// The HTTP client of the `--admin` commands ([`client::http_client`]), with the admin
/// token if one is configured.
pub(crate) fn client() -> Result<reqwest::Client, AdminClientError> {
    let token = client_token(token_file(), std::env::var(TOKEN_ENV).ok())?;
    http_client(token.as_ref().map(AdminToken::expose)).map_err(|e| match e {
        ClientError::Token => AdminClientError::Unsendable,
        ClientError::Build(e) => AdminClientError::Build(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_wins_over_the_environment() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "filefilefilefilefile\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let env = Some("envenvenvenvenvenvenv".to_owned());
        let t = client_token(Some(&path), env.clone()).unwrap().unwrap();
        assert_eq!(t.expose(), "filefilefilefilefile");
        let t = client_token(None, env).unwrap().unwrap();
        assert_eq!(t.expose(), "envenvenvenvenvenvenv");
        assert!(client_token(None, None).unwrap().is_none());
        assert!(client_token(None, Some("short".into())).is_err());
    }
}
