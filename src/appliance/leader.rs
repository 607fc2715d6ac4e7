//! One provisioner at a time (issue 28 item 3): on a shared etcd, the provisioner, the
//! power-on round and the drift watcher run only while this appliance leads the fleet's
//! election ([`crate::store::election`]); until then it is a follower, serving DHCP, TFTP and
//! HTTP from a read view it keeps fresh from etcd's watches ([`follow_view`]).
//!
//! Losing leadership **fail-stops** the appliance: the supervisor task returns
//! [`ServerFailure::LeadershipLost`], which stops every task, and `serve` exits non-zero for
//! the service manager to restart it as a follower. Stopping only the workers would have to
//! prove that none of them is still between a Talos call and the write recording it; the
//! fence already refuses such a write ([`crate::store::fence`]), and a fresh process starts
//! from the store alone, as every restart does. On a clean shutdown the workers are stopped
//! first, then leadership is resigned, so a follower takes over without waiting out the
//! session TTL. On redb nothing of this runs: the one appliance always leads, unfenced.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::spawn::{Workers, spawn_workers};
use super::{ServerFailure, Shared, Tasks};
use crate::events::EventKind;
use crate::provision::CommandSender;
use crate::store::EtcdStore;
use crate::store::election::{Candidate, Election, LeaderBoard, Leadership, SESSION_TTL};
use crate::store::fence::FenceState;

/// Pause between two failed campaigns (etcd unreachable).
const CAMPAIGN_RETRY: Duration = Duration::from_secs(1);

/// The tables a follower's view reads from the store, as the leader writes them.
const FOLLOWED: &[&str] = &["nodes", "node_lifecycle"];

/// Whether the workers are gated: on etcd, by this appliance's place in the fleet's
/// election; on redb not at all.
pub(super) struct Gate(Option<(Arc<EtcdStore>, Arc<LeaderBoard>, CommandSender)>);

impl Gate {
    /// The gate for a store that is `etcd` (shared) or not, for this appliance (its name
    /// and admin API URL); `commands` reach the provisioner (boots seen by other appliances
    /// go there).
    pub(super) fn new(
        etcd: Option<Arc<EtcdStore>>,
        (name, admin_url): (&str, &str),
        commands: &CommandSender,
    ) -> Self {
        Self(etcd.map(|etcd| {
            let me = Candidate {
                name: name.to_owned(),
                admin_url: admin_url.to_owned(),
            };
            let board = Arc::new(LeaderBoard::new(me, Election::new(&etcd, SESSION_TTL)));
            (etcd, board, commands.clone())
        }))
    }

    /// The election board, for the admin API (`None` on redb).
    pub(super) fn board(&self) -> Option<Arc<LeaderBoard>> {
        self.0.as_ref().map(|(_, b, _)| b.clone())
    }

    /// Spawns `workers`: at once on redb; on etcd, a supervisor that runs them while this
    /// appliance leads.
    pub(super) fn spawn(self, tasks: &mut Tasks, s: &Shared, workers: Workers) {
        let Some((etcd, board, commands)) = self.0 else {
            return spawn_workers(tasks, s, workers);
        };
        // Fenced writes are refused from now until the election is won.
        etcd.set_fence(FenceState::NotLeader);
        let s = s.clone();
        tasks.spawn(async move { lead(s, (etcd, board, commands), workers).await });
    }
}

/// Follow until elected, then run the workers until leadership is lost (an error: fail-stop)
/// or the appliance stops (resign).
async fn lead(
    s: Shared,
    (etcd, board, commands): (Arc<EtcdStore>, Arc<LeaderBoard>, CommandSender),
    workers: Workers,
) -> Result<(), ServerFailure> {
    let won = tokio::select! {
        won = campaign(&board, &s) => won,
        () = follow_view(&etcd, &s) => None,
    };
    let Some(leadership) = won else {
        return Ok(());
    };
    etcd.set_fence(FenceState::Held(leadership.fence()));
    board.set_leading(true);
    tracing::info!(
        name = %board.me.name,
        fence_revision = leadership.fence().revision,
        "this appliance leads: provisioning here"
    );
    let workers = leader_workers(&s, workers).await?;
    let mut running = JoinSet::new();
    spawn_workers(&mut running, &s, workers);
    running.spawn(relay_boots(etcd.clone(), commands));
    let result = supervise(&s, &leadership, &mut running).await;
    running.abort_all();
    while running.join_next().await.is_some() {}
    etcd.set_fence(FenceState::NotLeader);
    board.set_leading(false);
    if result.is_ok() {
        leadership.resign().await;
        tracing::info!("leadership resigned");
    }
    result
}

/// Campaign until elected (`None` when the appliance stops first).
async fn campaign(board: &LeaderBoard, s: &Shared) -> Option<Leadership> {
    loop {
        let outcome = tokio::select! {
            r = board.election().campaign(&board.me) => r,
            () = s.cancel.cancelled() => return None,
        };
        match outcome {
            Ok(l) => return Some(l),
            Err(e) => tracing::warn!(error = %e, "campaign failed; campaigning again"),
        }
        tokio::select! {
            () = tokio::time::sleep(CAMPAIGN_RETRY) => {}
            () = s.cancel.cancelled() => return None,
        }
    }
}

/// Keep the view's node records as the leader writes them; never returns.
async fn follow_view(etcd: &Arc<EtcdStore>, s: &Shared) {
    let mut changes = etcd.watch_tables(FOLLOWED);
    while changes.recv().await.is_some() {
        let (store, view) = (s.store.clone(), s.view.clone());
        let reloaded = tokio::task::spawn_blocking(move || view.reload_nodes(store.as_ref()));
        if let Ok(Err(e)) = reloaded.await {
            // The next change reloads again; a view that lags fails closed (see `view`).
            tracing::warn!(error = %e, "follower: cannot reload node records");
        }
    }
    std::future::pending::<()>().await;
}

/// The workers as the new leader runs them: the view reloaded (it may lag the old leader's
/// last writes), the power-on round planned from the store as it is now.
async fn leader_workers(s: &Shared, mut workers: Workers) -> Result<Workers, ServerFailure> {
    let (store, view, inv) = (s.store.clone(), s.view.clone(), s.inv.clone());
    let power = workers.power_on.take().map(|(_, p)| p);
    let planned = tokio::task::spawn_blocking(move || {
        view.reload_nodes(store.as_ref())?;
        power
            .map(|p| super::plan_power_on(&inv, store.as_ref(), p))
            .transpose()
    })
    .await
    .map_err(ServerFailure::Panicked)?;
    workers.power_on = planned.map_err(|e| ServerFailure::Leading(Box::new(e)))?;
    Ok(workers)
}

/// Boots served by another appliance of the fleet (its HTTP server published the script or
/// kernel fetch on its own bus, and so in the shared store only) reach this provisioner as
/// if its bus had carried them: without it, a node that booted from a follower would wait
/// for the leader's next restart.
async fn relay_boots(etcd: Arc<EtcdStore>, commands: CommandSender) -> Result<(), ServerFailure> {
    let mut puts = etcd.watch_puts("events");
    while let Some(value) = puts.recv().await {
        let Ok(ev) = serde_json::from_slice::<crate::store::Event>(&value) else {
            continue;
        };
        if TALOS_BOOTS.iter().any(|k| k.as_str() == ev.kind)
            && !commands.talos_boot_elsewhere(&ev.node).await
        {
            break;
        }
    }
    Ok(())
}

/// The events of a Talos network boot from talboot (what makes a node worth probing).
const TALOS_BOOTS: &[EventKind] = &[
    EventKind::Script,
    EventKind::Kernel,
    EventKind::Initramfs,
    EventKind::Uki,
];

/// Wait for the end of leadership, of the appliance, or a worker's failure.
async fn supervise(
    s: &Shared,
    leadership: &Leadership,
    running: &mut JoinSet<Result<(), ServerFailure>>,
) -> Result<(), ServerFailure> {
    loop {
        tokio::select! {
            cause = leadership.lost() => {
                tracing::error!(
                    cause = %cause,
                    "leadership lost: stopping this appliance so that it restarts as a follower"
                );
                return Err(ServerFailure::LeadershipLost(cause));
            }
            () = s.cancel.cancelled() => return Ok(()),
            Some(res) = running.join_next() => match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) if e.is_cancelled() => {}
                Err(e) => return Err(ServerFailure::Panicked(e)),
            },
        }
    }
}
