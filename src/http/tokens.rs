//! One-time tokens for pull delivery (`talos.config=<url>/config/<token>`).
//!
//! A machine config carries the cluster's CA keys, so a token is bound to one node, its MAC and
//! the address its current lease holds, is valid only while the node's provisioning window is
//! open and until it expires, and releases the config exactly once. The decision is the pure
//! [`judge`]; [`TokenStore`] persists tokens in the state store and consumes them with a
//! compare-and-set, so two concurrent fetches cannot both win. The store keeps only each
//! token's SHA-256, and no log line, event or error carries a token.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::inventory::Mac;
use crate::store::{CasOutcome, Store, StoreError};

/// How long an issued token stays valid. Talos retries a failing config fetch for three hours,
/// but a token is issued per boot, so a short lifetime is enough.
pub const TOKEN_TTL_SECS: u64 = 30 * 60;

/// A stored token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// The node it was issued for.
    pub node: String,
    /// The node's boot MAC.
    pub mac: Mac,
    /// The only address that may redeem it.
    pub ip: Ipv4Addr,
    /// Seconds since the epoch.
    pub issued_at: u64,
    /// Seconds since the epoch.
    pub expires_at: u64,
    /// Set once the config was released.
    pub used: bool,
}

/// Why a config request was refused. Every refusal is a 403 with no config in the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No such token.
    #[error("unknown token")]
    Unknown,
    /// Already redeemed.
    #[error("token already used")]
    Reused,
    /// Past its expiry.
    #[error("token expired")]
    Expired,
    /// Redeemed from an address other than the one it was bound to.
    #[error("request from {got}, token bound to {bound}")]
    WrongAddress {
        /// The requester.
        got: Ipv4Addr,
        /// The bound address.
        bound: Ipv4Addr,
    },
    /// The node is not in a provisioning window (installed, not marked for rebuild).
    #[error("provisioning window of {0} is closed")]
    WindowClosed(String),
}

/// Decide whether `token` may be redeemed by `peer` at `now`.
pub fn judge(
    token: Option<&Token>,
    peer: Ipv4Addr,
    now: u64,
    window_open: impl FnOnce(&str) -> bool,
) -> Result<(), Refusal> {
    let t = token.ok_or(Refusal::Unknown)?;
    if t.used {
        return Err(Refusal::Reused);
    }
    if now >= t.expires_at {
        return Err(Refusal::Expired);
    }
    if peer != t.ip {
        return Err(Refusal::WrongAddress {
            got: peer,
            bound: t.ip,
        });
    }
    if !window_open(&t.node) {
        return Err(Refusal::WindowClosed(t.node.clone()));
    }
    Ok(())
}

/// True when `s` has the shape of a token (64 lowercase hex digits); anything else is refused
/// before touching the store.
pub fn well_formed(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The store key of a token: its SHA-256, so the store (and any export or backup of it)
/// never holds a usable token.
fn key(token: &str) -> String {
    use sha2::Digest;
    format!(
        "token/{}",
        crate::hex::lower(&sha2::Sha256::digest(token.as_bytes()))
    )
}

/// Tokens in the state store.
pub struct TokenStore<'a> {
    store: &'a dyn Store,
}

impl<'a> TokenStore<'a> {
    /// Wrap a store.
    pub fn new(store: &'a dyn Store) -> Self {
        Self { store }
    }

    /// Issue a fresh token for `node` at `ip`.
    pub fn issue(
        &self,
        node: &str,
        mac: Mac,
        ip: Ipv4Addr,
        now: u64,
    ) -> Result<String, StoreError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).expect("the OS random source is available");
        let token = crate::hex::lower(&raw);
        let rec = Token {
            node: node.to_string(),
            mac,
            ip,
            issued_at: now,
            expires_at: now + TOKEN_TTL_SECS,
            used: false,
        };
        self.store.put_meta(
            &key(&token),
            &serde_json::to_vec(&rec).expect("token serializes"),
        )?;
        Ok(token)
    }

    /// Look a token up.
    pub fn get(&self, token: &str) -> Result<Option<Token>, StoreError> {
        if !well_formed(token) {
            return Ok(None);
        }
        Ok(self
            .store
            .get_meta(&key(token))?
            .and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// Judge and, if allowed, mark the token used, atomically. Returns the token's record.
    pub fn redeem(
        &self,
        token: &str,
        peer: Ipv4Addr,
        now: u64,
        window_open: impl FnOnce(&str) -> bool,
    ) -> Result<Result<Token, (Refusal, Option<Token>)>, StoreError> {
        if !well_formed(token) {
            return Ok(Err((Refusal::Unknown, None)));
        }
        let Some(raw) = self.store.get_meta(&key(token))? else {
            return Ok(Err((Refusal::Unknown, None)));
        };
        let Ok(rec) = serde_json::from_slice::<Token>(&raw) else {
            return Ok(Err((Refusal::Unknown, None)));
        };
        if let Err(r) = judge(Some(&rec), peer, now, window_open) {
            return Ok(Err((r, Some(rec))));
        }
        let used = Token {
            used: true,
            ..rec.clone()
        };
        let new = serde_json::to_vec(&used).expect("token serializes");
        match self
            .store
            .compare_and_set_meta(&key(token), Some(&raw), &new)?
        {
            CasOutcome::Swapped => Ok(Ok(used)),
            // Someone redeemed it between our read and our write.
            CasOutcome::Mismatch { .. } => Ok(Err((Refusal::Reused, Some(rec)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> Token {
        Token {
            node: "cp-1".into(),
            mac: "aa:00:00:00:00:01".parse().unwrap(),
            ip: "10.0.0.11".parse().unwrap(),
            issued_at: 100,
            expires_at: 200,
            used: false,
        }
    }

    #[test]
    fn judge_table() {
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let other: Ipv4Addr = "10.0.0.99".parse().unwrap();
        assert_eq!(judge(Some(&tok()), ip, 150, |_| true), Ok(()));
        assert_eq!(judge(None, ip, 150, |_| true), Err(Refusal::Unknown));
        assert_eq!(
            judge(
                Some(&Token {
                    used: true,
                    ..tok()
                }),
                ip,
                150,
                |_| true
            ),
            Err(Refusal::Reused)
        );
        assert_eq!(
            judge(Some(&tok()), ip, 200, |_| true),
            Err(Refusal::Expired)
        );
        assert_eq!(
            judge(Some(&tok()), other, 150, |_| true),
            Err(Refusal::WrongAddress {
                got: other,
                bound: ip
            })
        );
        assert_eq!(
            judge(Some(&tok()), ip, 150, |_| false),
            Err(Refusal::WindowClosed("cp-1".into()))
        );
    }

    #[test]
    fn the_store_never_holds_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(dir.path()).unwrap();
        let t = TokenStore::new(&store)
            .issue(
                "cp-1",
                "aa:00:00:00:00:01".parse().unwrap(),
                "10.0.0.11".parse().unwrap(),
                1000,
            )
            .unwrap();
        let dump = serde_json::to_string(&store.export_json().unwrap()).unwrap();
        assert!(!dump.contains(&t), "{dump}");
        assert!(TokenStore::new(&store).get(&t).unwrap().is_some());
    }

    #[test]
    fn tokens_redeem_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(dir.path()).unwrap();
        let ts = TokenStore::new(&store);
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let t = ts
            .issue("cp-1", "aa:00:00:00:00:01".parse().unwrap(), ip, 1000)
            .unwrap();
        assert!(well_formed(&t));
        assert!(
            ts.redeem(&t, "10.0.0.12".parse().unwrap(), 1001, |_| true)
                .unwrap()
                .is_err()
        );
        let ok = ts.redeem(&t, ip, 1001, |_| true).unwrap().unwrap();
        assert!(ok.used);
        let again = ts.redeem(&t, ip, 1002, |_| true).unwrap().unwrap_err();
        assert_eq!(again.0, Refusal::Reused);
        assert_eq!(
            ts.redeem("../etc", ip, 1002, |_| true)
                .unwrap()
                .unwrap_err()
                .0,
            Refusal::Unknown
        );
    }
}
