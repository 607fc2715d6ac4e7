//! Leader election among the appliances of one fleet (issue 28 item 3): which one provisions,
//! bootstraps and runs rollouts. It is etcd's own, as its `concurrency` package does it
//! (etcd-io/etcd v3.4.23 `clientv3/concurrency/session.go`, `election.go`), through the
//! v3election service (`etcdserver/api/v3election/election.go`, which runs that same code on
//! the member):
//! - a **session** is a lease of [`SESSION_TTL`] kept alive by this process; the etcd default
//!   of 60 s (`defaultSessionTTL`) would leave a dead leader in place for a minute;
//! - **campaign** puts `/talboot/<cluster>/election/<lease id in hex>` bound to the lease if
//!   absent and waits until every key of the election created before it is deleted: the
//!   oldest key leads (`Election.Campaign`, `waitDeletes`);
//! - the leader key and its create revision are the **fence** ([`super::fence`]);
//! - leadership is **lost** when the keep-alive has gone unanswered for a TTL counted from
//!   the last answered request's sending (the lease may have expired on etcd by then:
//!   `clientv3/lease.go` closes its keep-alive channel on the same deadline), when etcd
//!   answers a keep-alive with TTL 0 (expired), or when the leader key is deleted or
//!   created again (seen on a watch);
//! - a clean shutdown **resigns** by revoking the lease, which deletes the key at once
//!   (`Session.Close`), so a follower takes over without waiting out the TTL.
//!
//! Everything runs on the store's runtime thread ([`EtcdStore::runtime`]); the handles are
//! awaited from any runtime.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchOptions};
use tokio_util::sync::CancellationToken;

use super::EtcdStore;
use super::fence::Fence;

/// The session lease's TTL: how long a leader that stopped answering keeps its place.
/// etcd grants no less than 1.5 election timeouts (2 s with the defaults: `minTTL` in
/// `etcdserver/server.go`, applied in `lease/lessor.go` `Grant`, at v3.4.23); a few seconds
/// ride out a GC pause or an etcd leader change (which refreshes every lease,
/// `lessor.Promote`).
pub const SESSION_TTL: Duration = Duration::from_secs(5);

/// Who campaigns: the value of its election key, what followers show and refer to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    /// The appliance's name (`serve --name`).
    pub name: String,
    /// Its admin API, `http://host:port`.
    pub admin_url: String,
}

/// Why an election call failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// etcd refused or did not answer.
    #[error("etcd at {endpoints}: election {op} failed: {source}")]
    Etcd {
        /// The endpoints.
        endpoints: String,
        /// What was being done.
        op: &'static str,
        /// The client's error.
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// The session ended while campaigning.
    #[error("the election session ended while campaigning: {0}")]
    Ended(Lost),
    /// A leader key that is not a [`Candidate`].
    #[error("the election's leader key holds {0:?}, not a talboot appliance")]
    Foreign(String),
    /// The etcd client's runtime thread is gone (the store was dropped).
    #[error("the etcd client's runtime is gone")]
    RuntimeGone,
}

/// How leadership (or a campaigning session) ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Lost {
    /// No keep-alive answered within the TTL, or etcd said the lease expired.
    #[error("the session lease {lease:x} expired or could not be kept alive for {ttl:?}")]
    SessionExpired {
        /// The lease.
        lease: i64,
        /// Its TTL.
        ttl: Duration,
    },
    /// The leader key was deleted, or created again (another leadership).
    #[error("the leader key {key} was deleted")]
    KeyGone {
        /// The key.
        key: String,
    },
}

/// One fleet's election.
#[derive(Clone)]
pub struct Election {
    client: Client,
    rt: tokio::runtime::Handle,
    name: Vec<u8>,
    ttl: Duration,
    endpoints: String,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &String::from_utf8_lossy(&self.name))
            .finish_non_exhaustive()
    }
}

/// The state a session's tasks share: cancelled with its cause once it ends.
#[derive(Clone, Default)]
struct Ending {
    token: CancellationToken,
    cause: Arc<Mutex<Option<Lost>>>,
}

impl Ending {
    fn end(&self, cause: Lost) {
        let mut c = self.cause.lock().unwrap_or_else(|p| p.into_inner());
        if c.is_none() {
            *c = Some(cause);
        }
        self.token.cancel();
    }

    async fn ended(&self) -> Lost {
        self.token.cancelled().await;
        let c = self.cause.lock().unwrap_or_else(|p| p.into_inner());
        c.clone().unwrap_or(Lost::KeyGone { key: String::new() })
    }
}

/// Won leadership: its fence, and a way to learn that it ended.
pub struct Leadership {
    fence: Fence,
    lease: i64,
    ending: Ending,
    /// Stops the keep-alive and the key watch (resign, or drop).
    stop: CancellationToken,
    election: Election,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Election {
    /// The election `/talboot/<cluster>/election` of `store`'s fleet, with sessions of `ttl`.
    pub fn new(store: &EtcdStore, ttl: Duration) -> Self {
        let mut name = store.root();
        name.extend_from_slice(b"election");
        Self {
            client: store.client(),
            rt: store.runtime(),
            name,
            ttl,
            endpoints: store.endpoints_named().to_owned(),
        }
    }

    fn err(&self, op: &'static str) -> impl Fn(etcd_client::Error) -> ElectionError + '_ {
        move |e| ElectionError::Etcd {
            endpoints: self.endpoints.clone(),
            op,
            source: Box::new(e),
        }
    }

    /// Run `fut` on the client's runtime thread.
    async fn on_rt<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, ElectionError> {
        self.rt
            .spawn(fut)
            .await
            .map_err(|_| ElectionError::RuntimeGone)
    }

    /// Start a session, campaign as `me` and wait until this appliance leads (which may be
    /// never: drop the future to stop campaigning, which revokes the session).
    pub async fn campaign(&self, me: &Candidate) -> Result<Leadership, ElectionError> {
        let ttl_s = i64::try_from(self.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut c = self.client.clone();
        let grant = self.on_rt(async move { c.lease_grant(ttl_s, None).await });
        let lease = grant.await?.map_err(self.err("lease grant"))?.id();
        let stop = CancellationToken::new();
        // Revokes the lease if this future is dropped before it returns leadership.
        let guard = RevokeOnDrop(Some((self.clone(), lease)));
        let ending = Ending::default();
        let mut c = self.client.clone();
        let (keeper, stream) = self
            .on_rt(async move { c.lease_keep_alive(lease).await })
            .await?
            .map_err(self.err("lease keep-alive"))?;
        let kept = keep_alive(
            self.client.clone(),
            (keeper, stream),
            self.ttl,
            ending.clone(),
            stop.clone(),
        );
        self.rt.spawn(kept);
        let value = serde_json::to_vec(me).unwrap_or_default();
        let (mut ec, name) = (self.client.election_client(), self.name.clone());
        let campaign = self.on_rt(async move { ec.campaign(name, value, lease).await });
        let resp = tokio::select! {
            r = campaign => r?.map_err(self.err("campaign"))?,
            cause = ending.ended() => {
                stop.cancel();
                return Err(ElectionError::Ended(cause));
            }
        };
        let leader = resp.leader().cloned().ok_or_else(|| {
            ElectionError::Foreign("a campaign answer without a leader key".into())
        })?;
        let fence = Fence {
            key: leader.key().to_vec(),
            revision: leader.rev(),
        };
        self.rt.spawn(watch_key(
            self.client.clone(),
            fence.clone(),
            ending.clone(),
            stop.clone(),
        ));
        std::mem::forget(guard);
        Ok(Leadership {
            fence,
            lease,
            ending,
            stop,
            election: self.clone(),
        })
    }

    /// The current leader, if any (the oldest key of the election, `Election.Leader`).
    pub async fn leader(&self) -> Result<Option<Candidate>, ElectionError> {
        let (mut ec, name) = (self.client.election_client(), self.name.clone());
        let resp = self.on_rt(async move { ec.leader(name).await }).await?;
        let resp = match resp {
            Ok(r) => r,
            // `ErrElectionNoLeader` (`clientv3/concurrency/election.go`), as a gRPC status.
            Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("no leader") => {
                return Ok(None);
            }
            Err(e) => return Err(self.err("leader")(e)),
        };
        let Some(kv) = resp.kv() else {
            return Ok(None);
        };
        serde_json::from_slice(kv.value())
            .map(Some)
            .map_err(|_| ElectionError::Foreign(String::from_utf8_lossy(kv.value()).into()))
    }

    /// Revoke `lease` (deleting its keys at once), bounded by the TTL as `Session.Close` is.
    async fn revoke(&self, lease: i64) {
        let mut c = self.client.clone();
        let ttl = self.ttl;
        let _ = self
            .on_rt(async move { tokio::time::timeout(ttl, c.lease_revoke(lease)).await })
            .await;
    }
}

/// Revokes a campaigning session's lease when the campaign is dropped or fails.
struct RevokeOnDrop(Option<(Election, i64)>);

impl Drop for RevokeOnDrop {
    fn drop(&mut self) {
        if let Some((e, lease)) = self.0.take() {
            let rt = e.rt.clone();
            rt.spawn(async move { e.revoke(lease).await });
        }
    }
}

impl Leadership {
    /// The fence the leader's writes carry.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// The session's lease id.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Resolves when leadership is lost, saying why.
    pub async fn lost(&self) -> Lost {
        self.ending.ended().await
    }

    /// Whether leadership was lost already.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn is_lost(&self) -> bool {
        self.ending.token.is_cancelled()
    }

    /// Give leadership up on a clean shutdown: stop the keep-alive and revoke the lease,
    /// deleting the leader key, so the next campaigner leads at once.
    pub async fn resign(self) {
        self.stop.cancel();
        self.election.revoke(self.lease).await;
    }
}

/// Keep `lease` alive every third of `ttl` until `stop`; end `ending` when it cannot be.
async fn keep_alive(
    mut client: Client,
    (mut keeper, mut stream): (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream),
    ttl: Duration,
    ending: Ending,
    stop: CancellationToken,
) {
    let lease = keeper.id();
    let period = ttl / 3;
    // The lease is alive on etcd until a TTL after the last keep-alive it received: counted
    // from the sending of the last answered one, to be safe.
    let mut alive_since = Instant::now();
    loop {
        let sent = Instant::now();
        let answered = match keeper.keep_alive().await {
            Ok(()) => tokio::select! {
                m = tokio::time::timeout(period, stream.message()) => m,
                () = stop.cancelled() => return,
            },
            Err(_) => Ok(Ok(None)),
        };
        match answered {
            Ok(Ok(Some(r))) if r.ttl() > 0 => alive_since = sent,
            Ok(Ok(Some(_))) => {
                // TTL 0: etcd says the lease is gone (`ErrLeaseNotFound` answered as TTL 0,
                // `etcdserver/api/v3rpc/lease.go` `leaseKeepAlive`).
                return ending.end(Lost::SessionExpired { lease, ttl });
            }
            // The stream broke: open another (the lease lives on until its TTL).
            Ok(Ok(None) | Err(_)) => {
                if let Ok(Ok(pair)) =
                    tokio::time::timeout(period, client.lease_keep_alive(lease)).await
                {
                    (keeper, stream) = pair;
                }
            }
            Err(_) => {}
        }
        if alive_since.elapsed() >= ttl {
            return ending.end(Lost::SessionExpired { lease, ttl });
        }
        let next = sent + period;
        tokio::select! {
            () = tokio::time::sleep_until(next.into()) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Watch the leader key until `stop`; end `ending` when it is deleted or created again.
async fn watch_key(mut client: Client, fence: Fence, ending: Ending, stop: CancellationToken) {
    let key = String::from_utf8_lossy(&fence.key).into_owned();
    let gone = || Lost::KeyGone { key: key.clone() };
    // From the key's creation on: no event in between can be missed.
    let mut from = fence.revision;
    loop {
        let opts = WatchOptions::new().with_start_revision(from);
        let watched = tokio::select! {
            w = client.watch(fence.key.clone(), Some(opts)) => w,
            () = stop.cancelled() => return,
        };
        if let Ok(mut stream) = watched {
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    () = stop.cancelled() => return,
                };
                let Ok(Some(resp)) = msg else { break };
                for ev in resp.events() {
                    let created = ev.kv().map(|kv| kv.create_revision());
                    if ev.event_type() == EventType::Delete || created != Some(fence.revision) {
                        return ending.end(gone());
                    }
                    from = ev.kv().map_or(from, |kv| kv.mod_revision() + 1);
                }
                // Cancelled (compaction below `from`): re-check below, then watch again.
                if resp.canceled() {
                    break;
                }
            }
        }
        // The watch ended: ask for the key itself before watching again from now.
        // etcd unreachable: the keep-alive ends the session within its TTL.
        if let Ok(r) = client.get(fence.key.clone(), None).await {
            let now = r.kvs().first().map(|kv| kv.create_revision());
            if now != Some(fence.revision) {
                return ending.end(gone());
            }
            from = r.header().map_or(from, |h| h.revision() + 1);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// What the admin API and status know of the election: whether this appliance leads, and
/// who does.
#[derive(Debug)]
pub struct LeaderBoard {
    /// This appliance.
    pub me: Candidate,
    leading: AtomicBool,
    election: Election,
}

impl LeaderBoard {
    /// A board for `me` in `election`, not leading yet.
    pub fn new(me: Candidate, election: Election) -> Self {
        Self {
            me,
            leading: AtomicBool::new(false),
            election,
        }
    }

    /// Whether this appliance leads now.
    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// Record that this appliance leads (or no longer does).
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
    }

    /// The current leader as etcd has it (`None`: none, or etcd cannot say).
    pub async fn leader(&self) -> Option<Candidate> {
        self.election.leader().await.ok().flatten()
    }

    /// The election itself.
    pub fn election(&self) -> &Election {
        &self.election
    }
}
