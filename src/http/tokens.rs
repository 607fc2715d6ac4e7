//! One-time tokens for pull delivery (`talos.config=<url>/config/<token>`).
//!
//! A machine config carries the cluster's CA keys, so a token is bound to one node, its MAC and
//! the address its current lease holds, is valid only while the node's provisioning window is
//! open and until it expires, and releases the config exactly once. The decision is the pure
//! [`judge`]; [`TokenIssuer`] owns the writing of new tokens: a writer task commits every token
//! that has queued up in one transaction (group commit, as the event bus writer does), and a
//! token is handed back only once its commit is durable, so the script that carries it is never
//! sent before the token exists on disk. [`TokenStore`] reads tokens and consumes them with a
//! compare-and-set, so two concurrent fetches cannot both win. The store keeps only each
//! token's SHA-256, and no log line, event or error carries a token.

use std::future::Future;
use std::net::Ipv4Addr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::inventory::Mac;
use crate::store::{CasOutcome, Store, StoreError};

/// How long an issued token stays valid. Talos retries a failing config fetch for three hours,
/// but a token is issued per boot, so a short lifetime is enough.
pub(crate) const TOKEN_TTL_SECS: u64 = 30 * 60;

/// A stored token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Token {
    /// The node it was issued for.
    pub node: String,
    /// The node's boot MAC.
    pub mac: Mac,
    /// The only address that may redeem it.
    pub ip: Ipv4Addr,
    /// Seconds since the epoch.
    pub(crate) issued_at: u64,
    /// Seconds since the epoch.
    pub(crate) expires_at: u64,
    /// Set once the config was released.
    pub used: bool,
}

/// Why a config request was refused. Every refusal is a 403 with no config in the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
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
pub(crate) fn judge(
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
pub(crate) fn well_formed(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The store's table of tokens.
const TOKENS: crate::store::ClusterTable = crate::store::ClusterTable::PullTokens;

/// The store key of a token: its SHA-256, so the store (and any export or backup of it)
/// never holds a usable token.
fn key(token: &str) -> String {
    use sha2::Digest;
    crate::hex::lower(&sha2::Sha256::digest(token.as_bytes()))
}

/// A fresh token for `node` at `ip`: the token itself, its store key and the stored record.
fn mint(node: &str, mac: Mac, ip: Ipv4Addr, now: u64) -> (String, String, Vec<u8>) {
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
    let value = serde_json::to_vec(&rec).expect("token serializes");
    let key = key(&token);
    (token, key, value)
}

/// Why no token was issued (the script then goes out without a config URL).
#[derive(Debug, Clone, thiserror::Error)]
pub enum IssueError {
    /// The group commit that carried the token failed; nothing of it was written.
    #[error("cannot store the config token: {0}")]
    Store(Arc<StoreError>),
    /// The writer has stopped (talboot is shutting down).
    #[error("the config token writer has stopped")]
    Stopped,
}

/// A token waiting for its commit.
struct Pending {
    key: String,
    value: Vec<u8>,
    done: oneshot::Sender<Result<(), IssueError>>,
}

/// Most tokens one commit carries; a larger queue is written in several commits.
const MAX_GROUP: usize = 1024;

/// Issues tokens with one commit per group of concurrent requests instead of one per request.
///
/// Durable before use: [`TokenIssuer::issue`] resolves only after the transaction holding the
/// token has committed (redb `Durability::Immediate`), so a crash can lose only tokens no node
/// has been told about. Cheap to clone; the writer ends when the last clone is dropped.
#[derive(Clone)]
pub struct TokenIssuer {
    queue: mpsc::UnboundedSender<Pending>,
}

/// Where the writer commits a group: the store, or a test's observer of commits.
trait Commit: Send + Sync + 'static {
    fn commit(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StoreError>;
}

impl Commit for Arc<dyn Store> {
    fn commit(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        self.put_rows(TOKENS, entries)
    }
}

impl TokenIssuer {
    /// Starts the writer on the current runtime's blocking pool.
    pub fn start(store: Arc<dyn Store>) -> (Self, tokio::task::JoinHandle<()>) {
        Self::start_on(store)
    }

    fn start_on(store: impl Commit) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, mut rx) = mpsc::unbounded_channel::<Pending>();
        let writer = tokio::task::spawn_blocking(move || {
            // Everything that queued up while the previous commit ran goes into the next one.
            while let Some(first) = rx.blocking_recv() {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(p) => group.push(p),
                        Err(_) => break,
                    }
                }
                let (entries, waiters): (Vec<_>, Vec<_>) = group
                    .into_iter()
                    .map(|p| ((p.key, p.value), p.done))
                    .unzip();
                let outcome = store.commit(&entries).map_err(|e| {
                    tracing::error!(tokens = entries.len(), error = %e, "cannot store config tokens");
                    IssueError::Store(Arc::new(e))
                });
                for done in waiters {
                    // A request that gave up meanwhile does not need its answer.
                    let _ = done.send(outcome.clone());
                }
            }
        });
        (Self { queue }, writer)
    }

    /// Issues a fresh token for `node` at `ip`. The token is queued at once (before the
    /// returned future is first polled), and the future resolves once it is durable.
    pub fn issue(
        &self,
        node: &str,
        mac: Mac,
        ip: Ipv4Addr,
        now: u64,
    ) -> impl Future<Output = Result<String, IssueError>> + Send + 'static {
        let (token, key, value) = mint(node, mac, ip, now);
        let (done, committed) = oneshot::channel();
        let queued = self.queue.send(Pending { key, value, done }).is_ok();
        async move {
            if !queued {
                return Err(IssueError::Stopped);
            }
            committed.await.map_err(|_| IssueError::Stopped)??;
            Ok(token)
        }
    }
}

/// Tokens in the state store.
pub(crate) struct TokenStore<'a> {
    store: &'a dyn Store,
}

impl<'a> TokenStore<'a> {
    /// Wrap a store.
    pub fn new(store: &'a dyn Store) -> Self {
        Self { store }
    }

    /// Look a token up.
    pub fn get(&self, token: &str) -> Result<Option<Token>, StoreError> {
        if !well_formed(token) {
            return Ok(None);
        }
        Ok(self
            .store
            .row(TOKENS, &key(token))?
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
        let Some(raw) = self.store.row(TOKENS, &key(token))? else {
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
            .compare_and_set_row(TOKENS, &key(token), Some(&raw), &new)?
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

    /// A token an older build stored under `cluster_meta`'s `token/<sha256>` is still
    /// found, and redeemed exactly once.
    #[test]
    fn a_token_left_in_cluster_meta_is_still_redeemed_once() {
        let (_dir, store) = store();
        let (token, key, value) = mint("cp-1", mac(), "10.0.0.11".parse().unwrap(), 1000);
        store.put_meta(&TOKENS.legacy_key(&key), &value).unwrap();
        let tokens = TokenStore::new(store.as_ref());
        assert_eq!(tokens.get(&token).unwrap().unwrap().node, "cp-1");
        let ip = "10.0.0.11".parse().unwrap();
        assert!(matches!(
            tokens.redeem(&token, ip, 1001, |_| true),
            Ok(Ok(_))
        ));
        assert!(matches!(
            tokens.redeem(&token, ip, 1002, |_| true),
            Ok(Err((Refusal::Reused, _)))
        ));
    }

    fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(crate::store::open(dir.path()).unwrap());
        (dir, store)
    }

    fn mac() -> Mac {
        "aa:00:00:00:00:01".parse().unwrap()
    }

    #[tokio::test]
    async fn the_store_never_holds_a_token() {
        let (_dir, store) = store();
        let (issuer, _writer) = TokenIssuer::start(store.clone());
        let t = issuer
            .issue("cp-1", mac(), "10.0.0.11".parse().unwrap(), 1000)
            .await
            .unwrap();
        let dump = serde_json::to_string(&store.export_json().unwrap()).unwrap();
        assert!(!dump.contains(&t), "{dump}");
        assert!(TokenStore::new(store.as_ref()).get(&t).unwrap().is_some());
    }

    #[tokio::test]
    async fn tokens_redeem_once() {
        let (_dir, store) = store();
        let (issuer, _writer) = TokenIssuer::start(store.clone());
        let ts = TokenStore::new(store.as_ref());
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let t = issuer.issue("cp-1", mac(), ip, 1000).await.unwrap();
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

    /// Commits to a real store, records each group's size, and holds the first commit until
    /// the test lets it go (so that requests pile up behind it, as under load).
    struct Observed {
        store: Arc<dyn Store>,
        groups: Arc<std::sync::Mutex<Vec<usize>>>,
        entered: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
        release: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
        fail: bool,
    }

    impl Commit for Observed {
        fn commit(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
            if let Some(entered) = self.entered.lock().unwrap().take() {
                entered.send(()).unwrap();
                let release = self.release.lock().unwrap().take().unwrap();
                release.recv().unwrap();
            }
            self.groups.lock().unwrap().push(entries.len());
            if self.fail {
                return Err(StoreError::Corrupt {
                    file: "state.redb".into(),
                    cause: "disk on fire".into(),
                });
            }
            self.store.put_rows(TOKENS, entries)
        }
    }

    /// Starts an issuer on `Observed`; returns it, the group sizes, the signal that the first
    /// commit has begun and the switch that lets it finish.
    #[allow(clippy::type_complexity)]
    fn observed(
        store: Arc<dyn Store>,
        fail: bool,
    ) -> (
        TokenIssuer,
        Arc<std::sync::Mutex<Vec<usize>>>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        let groups = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (issuer, _writer) = TokenIssuer::start_on(Observed {
            store,
            groups: groups.clone(),
            entered: std::sync::Mutex::new(Some(entered_tx)),
            release: std::sync::Mutex::new(Some(release_rx)),
            fail,
        });
        (issuer, groups, entered_rx, release_tx)
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_commit_and_get_durable_tokens() {
        let (_dir, store) = store();
        let (issuer, groups, entered, release) = observed(store.clone(), false);
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let first = tokio::spawn(issuer.issue("cp-1", mac(), ip, 1000));
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        // 49 more requests arrive while the first commit is on its way to disk.
        let rest: Vec<_> = (0..49)
            .map(|_| tokio::spawn(issuer.issue("cp-1", mac(), ip, 1000)))
            .collect();
        // None of them has its token before its commit.
        assert!(!first.is_finished());
        release.send(()).unwrap();
        let mut tokens = vec![first.await.unwrap().unwrap()];
        for r in rest {
            tokens.push(r.await.unwrap().unwrap());
        }
        // Two commits for fifty tokens (one fsync each), not fifty.
        assert_eq!(*groups.lock().unwrap(), [1, 49]);
        let ts = TokenStore::new(store.as_ref());
        for t in &tokens {
            let rec = ts
                .get(t)
                .unwrap()
                .expect("every returned token is in the store");
            assert_eq!((rec.node.as_str(), rec.ip, rec.used), ("cp-1", ip, false));
        }
        let distinct: std::collections::BTreeSet<&String> = tokens.iter().collect();
        assert_eq!(distinct.len(), 50);
    }

    #[tokio::test]
    async fn a_failed_commit_hands_out_no_token() {
        let (_dir, store) = store();
        let (issuer, groups, entered, release) = observed(store.clone(), true);
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let first = tokio::spawn(issuer.issue("cp-1", mac(), ip, 1000));
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        let second = tokio::spawn(issuer.issue("cp-2", mac(), ip, 1000));
        release.send(()).unwrap();
        for r in [first, second] {
            let err = r.await.unwrap().unwrap_err();
            assert!(matches!(err, IssueError::Store(_)), "{err}");
            assert!(err.to_string().contains("disk on fire"), "{err}");
        }
        assert_eq!(*groups.lock().unwrap(), [1, 1]);
        let dump = store.export_json().unwrap();
        assert_eq!(dump["pull_tokens"], serde_json::json!({}), "{dump}");
        assert_eq!(dump["cluster_meta"], serde_json::json!({}), "{dump}");
    }
}
