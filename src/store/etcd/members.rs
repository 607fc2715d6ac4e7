//! Appliance membership (issue 28 item 2): each appliance keeps `members/<name>` (JSON
//! [`Member`]) under an etcd lease of its own, and every appliance follows `members/` for
//! the live set, from which the DHCP split is computed (`dhcp::split`).
//!
//! etcd semantics relied on (etcd-io/etcd at v3.4.23):
//! - a key put with a lease is deleted when the lease is revoked or expires, and each
//!   deletion is an event in the history (`lease/lessor.go`: `Revoke` deletes every
//!   attached key in one transaction; `revokeExpiredLeases` revokes the expired ones), so
//!   watchers of `members/` see a crashed appliance leave about one TTL after its last
//!   keep-alive;
//! - the smallest TTL granted is 1.5 x the election timeout, rounded up to whole seconds
//!   (`etcdserver/server.go`: `minTTL := (3*ElectionTicks)/2 * heartbeat`, 2 s with the
//!   defaults; `lease/lessor.go` raises a smaller TTL to it): [`DEFAULT_TTL`] is 3 s;
//! - a leader change extends every lease (`lease/lessor.go` `Promote` refreshes them), so an
//!   etcd failover alone does not make appliances look dead;
//! - a keep-alive answered with TTL 0 means the lease is gone (`LeaseKeepAlive` in
//!   `etcdserver/api/v3rpc/lease.go` answers `TTL: 0` for an unknown lease): the appliance
//!   registers again under a new lease.
//!
//! The registration and the follower are tasks on the store's runtime thread; dropping the
//! [`Membership`] stops them and revokes the lease, so peers take over at once on a clean
//! shutdown instead of after the TTL.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, PutOptions, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::EtcdStore;
use super::keys::prefix_end;

/// The lease TTL of a registration: above etcd's minimum (2 s with default timeouts), and
/// short enough that a dead appliance's clients are taken over within a few seconds.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3);

/// One appliance, as `members/<name>` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The appliance's name (`serve --name`), unique in the fleet.
    pub name: String,
    /// Where its admin API listens.
    pub admin_url: String,
    /// Where its boot HTTP server listens.
    pub http_url: String,
    /// talboot's version.
    pub version: String,
    /// When it started serving (Unix milliseconds).
    pub started_unix_ms: u64,
}

/// This appliance's registration and the live set; dropping it leaves the fleet.
pub struct Membership {
    live: watch::Receiver<Vec<Member>>,
    cancel: CancellationToken,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("live", &*self.live.borrow())
            .finish()
    }
}

impl Membership {
    /// The live members (sorted by name), updated as they come and go.
    pub fn live(&self) -> watch::Receiver<Vec<Member>> {
        self.live.clone()
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl EtcdStore {
    /// The key of member `name` (a `/` in the name is escaped).
    fn member_key(&self, name: &str) -> Vec<u8> {
        let mut key = self.members_prefix();
        key.extend(name.replace('%', "%25").replace('/', "%2F").into_bytes());
        key
    }

    fn members_prefix(&self) -> Vec<u8> {
        format!("{}members/", self.keys.root()).into_bytes()
    }

    /// Register `me` under a lease of `ttl` (kept alive, registered again if lost) and
    /// follow the live set, until the returned [`Membership`] is dropped.
    pub fn join(&self, me: Member, ttl: Duration) -> Membership {
        let cancel = CancellationToken::new();
        let (tx, live) = watch::channel(Vec::new());
        let value = serde_json::to_vec(&me).unwrap_or_default();
        let register = Register {
            client: self.client.clone(),
            key: self.member_key(&me.name),
            value,
            ttl: i64::try_from(ttl.as_secs().max(2)).unwrap_or(3),
            cancel: cancel.clone(),
        };
        let follow = Follow {
            client: self.client.clone(),
            prefix: self.members_prefix(),
            tx,
            cancel: cancel.clone(),
        };
        self.bridge.handle.spawn(register.run());
        self.bridge.handle.spawn(follow.run());
        Membership { live, cancel }
    }

    /// The members registered now (for status), sorted by name; records that do not
    /// decode are skipped.
    pub fn members(&self) -> crate::store::Result<Vec<Member>> {
        let kvs = self.get_prefix("read members", self.members_prefix())?;
        Ok(kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect())
    }
}

/// Keeps `key` alive under a lease.
struct Register {
    client: Client,
    key: Vec<u8>,
    value: Vec<u8>,
    ttl: i64,
    cancel: CancellationToken,
}

impl Register {
    async fn run(mut self) {
        let mut lease = None;
        while !self.cancel.is_cancelled() {
            match self.register().await {
                Ok(id) => {
                    lease = Some(id);
                    self.keep_alive(id).await;
                }
                Err(e) => warn!(error = %e, "cannot register this appliance in etcd; retrying"),
            }
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        // Leave at once: peers take this appliance's clients over now, not after the TTL.
        if let Some(id) = lease {
            let revoke = self.client.lease_revoke(id);
            let _ = tokio::time::timeout(Duration::from_secs(1), revoke).await;
        }
    }

    async fn register(&mut self) -> Result<i64, etcd_client::Error> {
        let id = self.client.lease_grant(self.ttl, None).await?.id();
        let opts = PutOptions::new().with_lease(id);
        self.client
            .put(self.key.clone(), self.value.clone(), Some(opts))
            .await?;
        info!(key = %String::from_utf8_lossy(&self.key), lease = id, ttl = self.ttl, "registered in etcd");
        Ok(id)
    }

    /// Refresh lease `id` every third of its TTL until it is lost, the stream breaks, or
    /// the membership is dropped.
    async fn keep_alive(&mut self, id: i64) {
        let Ok((mut keeper, mut stream)) = self.client.lease_keep_alive(id).await else {
            return;
        };
        let period = Duration::from_millis(u64::try_from(self.ttl).unwrap_or(3) * 1000 / 3);
        loop {
            if keeper.keep_alive().await.is_err() {
                return;
            }
            let answer = tokio::select! {
                _ = self.cancel.cancelled() => return,
                a = tokio::time::timeout(period, stream.message()) => a,
            };
            match answer {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {}
                Ok(Ok(Some(_))) => {
                    warn!("this appliance's etcd lease expired; registering again");
                    return;
                }
                _ => return,
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
        }
    }
}

/// Follows `members/` into the live set.
struct Follow {
    client: Client,
    prefix: Vec<u8>,
    tx: watch::Sender<Vec<Member>>,
    cancel: CancellationToken,
}

impl Follow {
    async fn run(mut self) {
        while !self.cancel.is_cancelled() {
            // List, then watch from the revision after the listing: a compacted or broken
            // watch comes back here and lists again (see `watch.rs` for the semantics).
            match self.list().await {
                Ok((members, rev)) => self.watch(members, rev).await,
                Err(e) => warn!(error = %e, "cannot list the appliances in etcd; retrying"),
            }
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    async fn list(&mut self) -> Result<(BTreeMap<Vec<u8>, Member>, i64), etcd_client::Error> {
        let opts = GetOptions::new().with_range(prefix_end(&self.prefix));
        let resp = self.client.get(self.prefix.clone(), Some(opts)).await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let members = resp
            .kvs()
            .iter()
            .filter_map(|kv| Some((kv.key().to_vec(), serde_json::from_slice(kv.value()).ok()?)))
            .collect();
        Ok((members, rev))
    }

    fn publish(&self, members: &BTreeMap<Vec<u8>, Member>) {
        let mut live: Vec<Member> = members.values().cloned().collect();
        live.sort_by(|a, b| a.name.cmp(&b.name));
        self.tx.send_if_modified(|old| {
            let changed = *old != live;
            if changed {
                info!(members = ?live.iter().map(|m| &m.name).collect::<Vec<_>>(), "appliances live");
                *old = live;
            }
            changed
        });
    }

    async fn watch(&mut self, mut members: BTreeMap<Vec<u8>, Member>, rev: i64) {
        self.publish(&members);
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        let Ok(mut stream) = self.client.watch(self.prefix.clone(), Some(opts)).await else {
            return;
        };
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => return,
                m = stream.message() => m,
            };
            let Ok(Some(resp)) = msg else { return };
            if resp.canceled() {
                return;
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                match ev.event_type() {
                    EventType::Put => {
                        if let Ok(m) = serde_json::from_slice(kv.value()) {
                            members.insert(kv.key().to_vec(), m);
                        }
                    }
                    EventType::Delete => {
                        members.remove(kv.key());
                    }
                }
            }
            self.publish(&members);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::store::etcd::testing::EtcdServer;

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            admin_url: format!("https://{name}:8443"),
            http_url: format!("http://{name}:8080"),
            version: "test".into(),
            started_unix_ms: 1,
        }
    }

    /// Waits (bounded) until `rx` holds exactly `names`.
    fn wait_for(rx: &mut watch::Receiver<Vec<Member>>, names: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now: Vec<String> = rx.borrow().iter().map(|m| m.name.clone()).collect();
            if now == names {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "members {now:?}, waiting for {names:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn members_come_go_on_drop_and_expire_when_their_keep_alive_stops() {
        let Some(server) = EtcdServer::start() else {
            return;
        };
        let a = server.open("members");
        let b = server.open("members");
        let ma = a.join(member("a"), Duration::from_secs(2));
        let mut live = ma.live();
        wait_for(&mut live, &["a"]);
        let mb = b.join(member("b"), Duration::from_secs(2));
        wait_for(&mut live, &["a", "b"]);
        assert_eq!(a.members().unwrap(), vec![member("a"), member("b")]);
        // A clean leave revokes the lease: gone at once.
        drop(mb);
        wait_for(&mut live, &["a"]);
        // An appliance whose process stops keeping its lease alive (the store's runtime
        // thread gone with it, as after kill -9) is gone once the TTL runs out.
        let mc = b.join(member("c"), Duration::from_secs(2));
        wait_for(&mut live, &["a", "c"]);
        std::mem::forget(mc);
        drop(b);
        wait_for(&mut live, &["a"]);
    }
}
