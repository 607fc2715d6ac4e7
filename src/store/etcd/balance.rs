//! Which endpoints the etcd client spreads its requests over: every configured member that
//! answers, and none that does not (issue 28; the slow recovery after etcd's leader died).
//!
//! Why: the client balances requests over all endpoints at random (tonic's power-of-two
//! choices over connections whose load is always 0). A member that died stays in that set:
//! a request it draws is refused at connect and sent again ([`super::EtcdStore`]'s `call`),
//! so about a third of all requests pay a refused connect and a pause. Measured in
//! tests/ha_netns with the leader killed under a DHCP storm: the view's read-back after each
//! lease commit, one read per lease, went from 2-3 ms to about 20 ms a lease, a commit of 50
//! leases spent a second re-reading, and the appliance's admission control shed new
//! exchanges (the oldest waiting ACK was past its ceiling) for 35-51 s, until the member
//! came back. Taking the dead member out of the set ends that within one probe.
//!
//! How a member is judged: its own connection (not the balanced one) asks the Maintenance
//! `Status` RPC every [`PROBE_EVERY`], within [`PROBE_TIMEOUT`]. It is up when it answers and
//! knows a leader: etcd's `Status` reports the raft leader's ID, 0 when the member has none
//! (etcd-io/etcd v3.4.23 `etcdserver/api/v3rpc/maintenance.go`, `Status`: `Leader:
//! uint64(ms.rg.Leader())`, `ErrNoLeader` in `Errors` when it is `raft.None`); a member
//! without a leader refuses writes and linearizable reads anyway. The balanced set is every
//! member that is up, or every member when none is (an empty set would hold each request
//! until its timeout instead of trying). The rule ([`Balanced::update`]) is pure; the probe
//! task is the adapter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use metrics::gauge;
use tracing::{info, warn};

/// How often each endpoint is asked.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);

/// How long an endpoint may take to answer before it counts as down: a member that stopped
/// answering without closing its connections (power loss, a partition) is taken out within
/// this plus [`PROBE_EVERY`].
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the balancer is to do with one endpoint (an index into the configured endpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Stop sending it requests.
    Eject(usize),
    /// Send it requests again.
    Restore(usize),
}

/// The balanced set: which configured endpoints requests may go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Balanced {
    inside: Vec<bool>,
}

impl Balanced {
    /// Every one of `n` endpoints (as the client starts).
    pub(crate) fn all(n: usize) -> Self {
        Self {
            inside: vec![true; n],
        }
    }

    /// Which endpoints are in the set.
    pub(crate) fn inside(&self) -> &[bool] {
        &self.inside
    }

    /// The probe found `up[i]` for endpoint `i`: the changes that make the set every endpoint
    /// that is up, or every endpoint when none is; the set is updated to it.
    pub(crate) fn update(&mut self, up: &[bool]) -> Vec<Change> {
        let any = up.iter().any(|u| *u);
        let mut changes = Vec::new();
        for (i, inside) in self.inside.iter_mut().enumerate() {
            let want = !any || up.get(i).copied().unwrap_or(true);
            match (*inside, want) {
                (true, false) => changes.push(Change::Eject(i)),
                (false, true) => changes.push(Change::Restore(i)),
                _ => {}
            }
            *inside = want;
        }
        changes
    }
}

/// The balanced set as the probe task last left it, for whoever wants to see it.
pub(crate) type Shared = Arc<Mutex<Balanced>>;

/// Start probing `urls` (the client's endpoints, as given to it) on `rt`, keeping `client`'s
/// balanced set to the ones that are up; the task ends with the runtime. `opts` are the
/// client's own (TLS, timeouts), for the probe connections.
pub(crate) fn spawn(
    rt: &tokio::runtime::Handle,
    client: Client,
    urls: Vec<String>,
    opts: ConnectOptions,
) -> Shared {
    let shared: Shared = Arc::new(Mutex::new(Balanced::all(urls.len())));
    rt.spawn(run(client, urls, opts, shared.clone()));
    shared
}

async fn run(client: Client, urls: Vec<String>, opts: ConnectOptions, shared: Shared) {
    let mut probes = Vec::with_capacity(urls.len());
    for url in &urls {
        match Client::connect([url.as_str()], Some(opts.clone())).await {
            Ok(c) => probes.push(c),
            Err(e) => {
                warn!(%url, error = %e, "etcd endpoint probe: cannot make its connection; every endpoint stays balanced");
                return;
            }
        }
    }
    for url in &urls {
        gauge!("talboot_etcd_endpoint_balanced", "endpoint" => url.clone()).set(1.0);
    }
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let up = futures_util::future::join_all(probes.iter().map(|c| is_up(c.clone()))).await;
        let changes = shared.lock().unwrap_or_else(|p| p.into_inner()).update(&up);
        for change in changes {
            apply(&client, &urls, change).await;
        }
    }
}

/// Whether the member behind `probe` answers `Status` in time and knows a leader.
async fn is_up(mut probe: Client) -> bool {
    match tokio::time::timeout(PROBE_TIMEOUT, probe.status()).await {
        Ok(Ok(status)) => status.leader() != 0,
        _ => false,
    }
}

async fn apply(client: &Client, urls: &[String], change: Change) {
    let (i, eject) = match change {
        Change::Eject(i) => (i, true),
        Change::Restore(i) => (i, false),
    };
    let Some(url) = urls.get(i) else { return };
    gauge!("talboot_etcd_endpoint_balanced", "endpoint" => url.clone()).set(if eject {
        0.0
    } else {
        1.0
    });
    let done = if eject {
        client.remove_endpoint(url).await
    } else {
        client.add_endpoint(url).await
    };
    match (done, eject) {
        (Ok(()), true) => {
            info!(%url, "etcd endpoint down or without a leader: requests go to the others")
        }
        (Ok(()), false) => info!(%url, "etcd endpoint answers again: requests go to it too"),
        (Err(e), _) => warn!(%url, error = %e, "cannot change the etcd client's endpoints"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::etcd::EtcdStore;
    use crate::store::etcd::testing::EtcdServer;

    /// Wait (bounded) until `store` balances over exactly `want`.
    fn until_balanced(store: &EtcdStore, want: &[bool]) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while store.balanced_endpoints() != want {
            assert!(
                std::time::Instant::now() < deadline,
                "not balanced over {want:?} within 20 s: {:?}",
                store.balanced_endpoints()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A real 3-member cluster with one member killed: the probe takes it out of the
    /// balanced set, after which no request is refused at connect (before, about a third
    /// drew the dead member), and puts it back once it runs again.
    #[test]
    fn a_killed_member_is_taken_out_of_the_balanced_set_and_put_back() {
        let Some(mut etcd) = EtcdServer::start_cluster(3) else {
            return;
        };
        let store = etcd.open("balance");
        until_balanced(&store, &[true, true, true]);
        etcd.kill_member(1);
        until_balanced(&store, &[true, false, true]);
        // The member killed may have led: a read fails until the others elect a new leader.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while let Err(e) = store.leases() {
            assert!(
                std::time::Instant::now() < deadline,
                "no read after 20 s: {e}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let before = store.refused_requests();
        for _ in 0..60 {
            store.leases().expect("a read on the two live members");
        }
        assert_eq!(
            store.refused_requests(),
            before,
            "requests still drew the dead member"
        );
        etcd.restart_member(1);
        until_balanced(&store, &[true, true, true]);
    }

    #[test]
    fn a_member_down_is_ejected_and_restored_when_back() {
        let mut b = Balanced::all(3);
        assert_eq!(b.update(&[true, true, true]), vec![]);
        assert_eq!(b.update(&[true, false, true]), vec![Change::Eject(1)]);
        assert_eq!(b.inside(), &[true, false, true]);
        assert_eq!(b.update(&[true, false, true]), vec![]);
        assert_eq!(b.update(&[true, true, true]), vec![Change::Restore(1)]);
        assert_eq!(b.inside(), &[true, true, true]);
    }

    #[test]
    fn with_none_up_every_endpoint_stays_balanced() {
        let mut b = Balanced::all(3);
        assert_eq!(
            b.update(&[false, false, true]),
            vec![Change::Eject(0), Change::Eject(1)]
        );
        assert_eq!(
            b.update(&[false, false, false]),
            vec![Change::Restore(0), Change::Restore(1)]
        );
        assert_eq!(b.inside(), &[true, true, true]);
        assert_eq!(
            b.update(&[false, true, false]),
            vec![Change::Eject(0), Change::Eject(2)]
        );
    }
}
