//! One-time tokens for pull delivery (`talos.config=<url>/config/<token>`).
//!
//! A machine config carries the cluster's CA keys, so a token is bound to one node, its MAC and
//! the address its current lease holds, is valid only while the node's provisioning window is
//! open and until it expires, and releases the config exactly once. The decision is the pure
//! [`judge`]; [`Tokens`] is the one writer of the token table, on a blocking thread: every
//! issue and redemption that has queued up is decided in order and committed in one
//! transaction (group commit, as the event bus writer does). A token is handed back only once
//! its commit is durable, so the script that carries it is never sent before the token exists
//! on disk; a redemption is granted only once the record marking the token used is durable, so
//! the config leaves at most once, and two concurrent fetches cannot both win because the
//! writer decides them one after the other. No store call runs on the async runtime's threads.
//! The store keeps only each token's SHA-256, and no log line, event or error carries a token.

use std::future::Future;
use std::net::Ipv4Addr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::inventory::Mac;
use crate::store::{Store, StoreError, TokenWriter};

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

/// Why no token was issued (the script then goes out without a config URL), or why a
/// redemption could not be decided (the config request then gets a 500, nothing released).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// The group commit that carried the token failed; nothing of it was written.
    #[error("cannot store the config token: {0}")]
    Store(Arc<StoreError>),
    /// The writer has stopped (talboot is shutting down).
    #[error("the config token writer has stopped")]
    Stopped,
}

/// What a redemption decided: the token's record, marked used and durable, or the refusal
/// (with the record when there was one).
pub(crate) type Redemption = Result<Token, (Refusal, Option<Token>)>;

/// Whether a node's provisioning window is open, asked on the writer thread at the moment
/// of redemption (so a window that closes meanwhile is seen).
pub(crate) type WindowCheck = Box<dyn FnOnce(&str) -> bool + Send>;

/// A token waiting for its commit.
struct Pending {
    key: String,
    value: Vec<u8>,
    done: oneshot::Sender<Result<(), TokenError>>,
}

/// A redemption waiting for its decision and, when granted, its commit.
struct Redeem {
    token: String,
    peer: Ipv4Addr,
    now: u64,
    window_open: WindowCheck,
    done: oneshot::Sender<Result<Redemption, TokenError>>,
}

/// One request to the writer.
enum Job {
    Issue(Pending),
    Redeem(Redeem),
}

/// Most requests one commit carries; a larger queue is written in several commits.
const MAX_GROUP: usize = 1024;

/// The one owner of the token table: issues tokens and redeems them, with one commit per
/// group of concurrent requests instead of one per request, on a blocking thread (never on
/// the async runtime's threads).
///
/// Durable before use: [`Tokens::issue`] resolves only after the transaction holding the
/// token has committed (redb `Durability::Immediate`), so a crash can lose only tokens no node
/// has been told about; [`Tokens::redeem`] grants a token only after the transaction marking
/// it used has committed, so a config leaves at most once even across a crash. Exactly once
/// without a compare-and-set: the writer is the table's only writer and decides the requests
/// of a group in order, each seeing the ones before it. Cheap to clone; the writer ends when
/// the last clone is dropped.
#[derive(Clone)]
pub struct Tokens {
    queue: mpsc::UnboundedSender<Job>,
    table: Arc<dyn Table>,
}

/// Where the writer reads and commits tokens: the store, or a test's observer of commits.
trait Table: Send + Sync + 'static {
    fn row(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    fn commit(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StoreError>;
}

/// The store's token table: read through the store, written by its one writer.
struct StoreTable {
    store: Arc<dyn Store>,
    writer: TokenWriter,
}

impl Table for StoreTable {
    fn row(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Store::row(self.store.as_ref(), TOKENS, key)
    }
    fn commit(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        self.writer.put_rows(entries)
    }
}

/// Decide one redemption against the table as the group has left it so far (`staged`), and
/// stage the used record when granted.
fn decide_redeem(
    table: &dyn Table,
    staged: &mut std::collections::HashMap<String, Vec<u8>>,
    window_open: WindowCheck,
    token: &str,
    peer: Ipv4Addr,
    now: u64,
) -> Result<Redemption, StoreError> {
    if !well_formed(token) {
        return Ok(Err((Refusal::Unknown, None)));
    }
    let key = key(token);
    let raw = match staged.get(&key) {
        Some(v) => Some(v.clone()),
        None => table.row(&key)?,
    };
    let Some(rec) = raw.and_then(|b| serde_json::from_slice::<Token>(&b).ok()) else {
        return Ok(Err((Refusal::Unknown, None)));
    };
    if let Err(refusal) = judge(Some(&rec), peer, now, window_open) {
        return Ok(Err((refusal, Some(rec))));
    }
    let used = Token { used: true, ..rec };
    staged.insert(key, serde_json::to_vec(&used).expect("token serializes"));
    Ok(Ok(used))
}

impl Tokens {
    /// Starts the writer on the current runtime's blocking pool; it owns `writer`, the token
    /// table's one writer.
    pub fn start(
        store: Arc<dyn Store>,
        writer: TokenWriter,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        Self::start_on(StoreTable { store, writer })
    }

    fn start_on(table: impl Table) -> (Self, tokio::task::JoinHandle<()>) {
        let table: Arc<dyn Table> = Arc::new(table);
        let (queue, mut rx) = mpsc::unbounded_channel::<Job>();
        let writer_table = table.clone();
        let writer = tokio::task::spawn_blocking(move || {
            let table = writer_table;
            // Everything that queued up while the previous commit ran goes into the next one.
            while let Some(first) = rx.blocking_recv() {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(p) => group.push(p),
                        Err(_) => break,
                    }
                }
                run_group(table.as_ref(), group);
            }
        });
        (Self { queue, table }, writer)
    }

    /// Issues a fresh token for `node` at `ip`. The token is queued at once (before the
    /// returned future is first polled), and the future resolves once it is durable.
    pub fn issue(
        &self,
        node: &str,
        mac: Mac,
        ip: Ipv4Addr,
        now: u64,
    ) -> impl Future<Output = Result<String, TokenError>> + Send + 'static {
        let (token, key, value) = mint(node, mac, ip, now);
        let (done, committed) = oneshot::channel();
        let queued = self
            .queue
            .send(Job::Issue(Pending { key, value, done }))
            .is_ok();
        async move {
            if !queued {
                return Err(TokenError::Stopped);
            }
            committed.await.map_err(|_| TokenError::Stopped)??;
            Ok(token)
        }
    }

    /// Judges `token` for `peer` at `now` and, if allowed, marks it used. A granted
    /// redemption resolves only once the record marking it used is durable; of any number
    /// of concurrent redemptions of one token, at most one is granted.
    pub(crate) fn redeem(
        &self,
        token: &str,
        peer: Ipv4Addr,
        now: u64,
        window_open: impl FnOnce(&str) -> bool + Send + 'static,
    ) -> impl Future<Output = Result<Redemption, TokenError>> + Send + 'static {
        let (done, decided) = oneshot::channel();
        let queued = self
            .queue
            .send(Job::Redeem(Redeem {
                token: token.to_string(),
                peer,
                now,
                window_open: Box::new(window_open),
                done,
            }))
            .is_ok();
        async move {
            if !queued {
                return Err(TokenError::Stopped);
            }
            decided.await.map_err(|_| TokenError::Stopped)?
        }
    }

    /// Looks a token up (a read on the blocking pool, off the async threads).
    pub(crate) async fn get(&self, token: &str) -> Result<Option<Token>, TokenError> {
        if !well_formed(token) {
            return Ok(None);
        }
        let (table, key) = (self.table.clone(), key(token));
        let raw = tokio::task::spawn_blocking(move || table.row(&key))
            .await
            .map_err(|_| TokenError::Stopped)?
            .map_err(|e| TokenError::Store(Arc::new(e)))?;
        Ok(raw.and_then(|b| serde_json::from_slice(&b).ok()))
    }
}

/// Decide and commit one group: issues and granted redemptions go into one transaction, and
/// every answer is sent after it (a refusal does not wait on anything, but answering it with
/// the rest keeps the order simple).
fn run_group(table: &dyn Table, group: Vec<Job>) {
    let mut staged: std::collections::HashMap<String, Vec<u8>> = Default::default();
    let mut entries = Vec::new();
    let mut issued = Vec::new();
    let mut redeemed = Vec::new();
    let mut failed_reads = Vec::new();
    for job in group {
        match job {
            Job::Issue(p) => {
                entries.push((p.key, p.value));
                issued.push(p.done);
            }
            Job::Redeem(r) => {
                match decide_redeem(table, &mut staged, r.window_open, &r.token, r.peer, r.now) {
                    Ok(decision) => redeemed.push((decision, r.done)),
                    Err(e) => failed_reads.push((e, r.done)),
                }
            }
        }
    }
    entries.extend(staged);
    let outcome = if entries.is_empty() {
        Ok(())
    } else {
        table.commit(&entries).map_err(|e| {
            tracing::error!(rows = entries.len(), error = %e, "cannot store config tokens");
            TokenError::Store(Arc::new(e))
        })
    };
    // A request that gave up meanwhile does not need its answer.
    for done in issued {
        let _ = done.send(outcome.clone());
    }
    for (decision, done) in redeemed {
        let answer = match (&decision, &outcome) {
            // Granted but not durable: nothing leaves (the token may be tried again).
            (Ok(_), Err(e)) => Err(e.clone()),
            _ => Ok(decision),
        };
        let _ = done.send(answer);
    }
    for (e, done) in failed_reads {
        tracing::error!(error = %e, "cannot read a config token");
        let _ = done.send(Err(TokenError::Store(Arc::new(e))));
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
    #[tokio::test]
    async fn a_token_left_in_cluster_meta_is_still_redeemed_once() {
        let (_dir, store, w) = store();
        let (token, key, value) = mint("cp-1", mac(), "10.0.0.11".parse().unwrap(), 1000);
        w.meta.put_meta(&TOKENS.legacy_key(&key), &value).unwrap();
        let (tokens, _writer) = Tokens::start(store.clone(), w.tokens);
        assert_eq!(tokens.get(&token).await.unwrap().unwrap().node, "cp-1");
        let ip = "10.0.0.11".parse().unwrap();
        assert!(matches!(
            tokens.redeem(&token, ip, 1001, |_| true).await,
            Ok(Ok(_))
        ));
        assert!(matches!(
            tokens.redeem(&token, ip, 1002, |_| true).await,
            Ok(Err((Refusal::Reused, _)))
        ));
    }

    fn store() -> (tempfile::TempDir, Arc<dyn Store>, crate::store::Writers) {
        let dir = tempfile::tempdir().unwrap();
        let (store, writers) = crate::store::open(dir.path()).unwrap().split();
        (dir, store, writers)
    }

    fn mac() -> Mac {
        "aa:00:00:00:00:01".parse().unwrap()
    }

    #[tokio::test]
    async fn the_store_never_holds_a_token() {
        let (_dir, store, w) = store();
        let (issuer, _writer) = Tokens::start(store.clone(), w.tokens);
        let t = issuer
            .issue("cp-1", mac(), "10.0.0.11".parse().unwrap(), 1000)
            .await
            .unwrap();
        let dump = serde_json::to_string(&store.export_json().unwrap()).unwrap();
        assert!(!dump.contains(&t), "{dump}");
        assert!(issuer.get(&t).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn tokens_redeem_once() {
        let (_dir, store, w) = store();
        let (ts, _writer) = Tokens::start(store.clone(), w.tokens);
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let t = ts.issue("cp-1", mac(), ip, 1000).await.unwrap();
        assert!(well_formed(&t));
        assert!(
            ts.redeem(&t, "10.0.0.12".parse().unwrap(), 1001, |_| true)
                .await
                .unwrap()
                .is_err()
        );
        let ok = ts.redeem(&t, ip, 1001, |_| true).await.unwrap().unwrap();
        assert!(ok.used);
        let again = ts
            .redeem(&t, ip, 1002, |_| true)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(again.0, Refusal::Reused);
        assert_eq!(
            ts.redeem("../etc", ip, 1002, |_| true)
                .await
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
        writer: TokenWriter,
        groups: Arc<std::sync::Mutex<Vec<usize>>>,
        entered: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
        release: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
        fail: bool,
        /// The thread the last commit ran on.
        writer_thread: Arc<std::sync::Mutex<Option<std::thread::ThreadId>>>,
    }

    impl Table for Observed {
        fn row(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
            Store::row(self.store.as_ref(), TOKENS, key)
        }
        fn commit(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
            *self.writer_thread.lock().unwrap() = Some(std::thread::current().id());
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
            self.writer.put_rows(entries)
        }
    }

    /// Starts an issuer on `Observed`; returns it, the group sizes, the signal that the first
    /// commit has begun and the switch that lets it finish.
    #[allow(clippy::type_complexity)]
    fn observed(
        store: Arc<dyn Store>,
        writer: TokenWriter,
        fail: bool,
    ) -> (
        Tokens,
        Arc<std::sync::Mutex<Vec<usize>>>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
        Arc<std::sync::Mutex<Option<std::thread::ThreadId>>>,
    ) {
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        let groups = Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer_thread = Arc::new(std::sync::Mutex::new(None));
        let (issuer, _writer) = Tokens::start_on(Observed {
            store,
            writer,
            groups: groups.clone(),
            entered: std::sync::Mutex::new(Some(entered_tx)),
            release: std::sync::Mutex::new(Some(release_rx)),
            fail,
            writer_thread: writer_thread.clone(),
        });
        (issuer, groups, entered_rx, release_tx, writer_thread)
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_commit_and_get_durable_tokens() {
        let (_dir, store, w) = store();
        let (issuer, groups, entered, release, _) = observed(store.clone(), w.tokens, false);
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
        for t in &tokens {
            let rec = issuer
                .get(t)
                .await
                .unwrap()
                .expect("every returned token is in the store");
            assert_eq!((rec.node.as_str(), rec.ip, rec.used), ("cp-1", ip, false));
        }
        let distinct: std::collections::BTreeSet<&String> = tokens.iter().collect();
        assert_eq!(distinct.len(), 50);
    }

    #[tokio::test]
    async fn a_failed_commit_hands_out_no_token() {
        let (_dir, store, w) = store();
        let (issuer, groups, entered, release, _) = observed(store.clone(), w.tokens, true);
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let first = tokio::spawn(issuer.issue("cp-1", mac(), ip, 1000));
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        let second = tokio::spawn(issuer.issue("cp-2", mac(), ip, 1000));
        release.send(()).unwrap();
        for r in [first, second] {
            let err = r.await.unwrap().unwrap_err();
            assert!(matches!(err, TokenError::Store(_)), "{err}");
            assert!(err.to_string().contains("disk on fire"), "{err}");
        }
        assert_eq!(*groups.lock().unwrap(), [1, 1]);
        let dump = store.export_json().unwrap();
        assert_eq!(dump["pull_tokens"], serde_json::json!({}), "{dump}");
        assert_eq!(dump["cluster_meta"], serde_json::json!({}), "{dump}");
    }

    /// A token written straight to the store (so the observer's first held commit is the
    /// redemption's).
    fn stored_token(writer: &TokenWriter) -> String {
        let (token, key, value) = mint("cp-1", mac(), "10.0.0.11".parse().unwrap(), 1000);
        writer.put_rows(&[(key, value)]).unwrap();
        token
    }

    /// The config handler awaits this on the async runtime: the redemption's store write
    /// must run on the writer's thread (not the runtime's, which the handler used to block
    /// with a synchronous compare-and-set), and the grant must wait for its commit.
    #[tokio::test(flavor = "current_thread")]
    async fn a_redemption_is_granted_only_once_durable_and_never_on_the_runtime_thread() {
        let (_dir, store, w) = store();
        let token = stored_token(&w.tokens);
        let (tokens, groups, entered, release, writer_thread) =
            observed(store.clone(), w.tokens, false);
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let first = tokio::spawn(tokens.redeem(&token, ip, 1001, |_| true));
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        // Its commit is under way and held: the runtime still runs (this test does), and no
        // grant has been given yet.
        assert!(!first.is_finished());
        let rest: Vec<_> = (0..19)
            .map(|_| tokio::spawn(tokens.redeem(&token, ip, 1001, |_| true)))
            .collect();
        release.send(()).unwrap();
        let granted = first.await.unwrap().unwrap().unwrap();
        assert!(granted.used);
        // Exactly once: every other concurrent fetch of the same token is refused.
        for r in rest {
            let refused = r.await.unwrap().unwrap().unwrap_err();
            assert_eq!(refused.0, Refusal::Reused);
        }
        assert_ne!(
            *writer_thread.lock().unwrap(),
            Some(std::thread::current().id())
        );
        // Durable: the record on disk says used (one commit, the grant's).
        assert_eq!(*groups.lock().unwrap(), [1]);
        let on_disk: Token = serde_json::from_slice(
            &Store::row(store.as_ref(), TOKENS, &key(&token))
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        assert!(on_disk.used);
    }

    /// A redemption whose commit fails releases nothing and leaves the token unspent.
    #[tokio::test]
    async fn a_failed_redemption_commit_grants_nothing() {
        let (_dir, store, w) = store();
        let token = stored_token(&w.tokens);
        let (tokens, _groups, entered, release, _) = observed(store.clone(), w.tokens, true);
        let ip: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let pending = tokio::spawn(tokens.redeem(&token, ip, 1001, |_| true));
        tokio::task::spawn_blocking(move || entered.recv().unwrap())
            .await
            .unwrap();
        release.send(()).unwrap();
        let err = pending.await.unwrap().unwrap_err();
        assert!(matches!(err, TokenError::Store(_)), "{err}");
        assert!(!tokens.get(&token).await.unwrap().unwrap().used);
    }
}
