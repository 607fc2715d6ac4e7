//! The appliance's watch on etcd's health (issue 28 item 4), when its state is in etcd: every
//! few seconds [`crate::store::etcd_health::probe`], the result kept for the admin API and
//! `status`, exported as gauges on `/metrics`, and every change of verdict said once in the log
//! (losing quorum is an error an operator must see: no new lease is handed out until it is
//! back, and existing leases keep working on their clients).
//!
//! While quorum holds, each round also counts the live appliances and reads the election's
//! leader for `/metrics` ([`FleetGauges`]): `talboot_appliances_live` and
//! `talboot_fleet_leader{name}` (1 for the leader, 0 for one that led before). Without quorum
//! those reads could only time out, so they are skipped and the gauges keep their last value
//! (`talboot_etcd_quorum` says why).

use std::sync::Arc;
use std::time::Duration;

use metrics::gauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::election::{Election, SESSION_TTL};
use crate::store::etcd_health::{EtcdHealth, Verdict, probe};
use crate::store::{EtcdConfig, EtcdStore};

/// How often etcd is probed: well inside the few seconds a member failure takes to matter.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(5);

/// The latest probe, for the admin API's `/api/ha` (None until the first one).
pub(crate) use crate::admin::ha::HealthView;

/// How loudly a change of verdict is said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loudness {
    /// Back to healthy.
    Info,
    /// Degraded: one more failure may cost quorum.
    Warn,
    /// No quorum, or an alarm: writes refused.
    Error,
}

/// What to say when the verdict goes from `prev` to `now` (nothing when it did not change, or
/// on a healthy first probe).
pub(crate) fn transition(prev: Option<Verdict>, now: Verdict) -> Option<(Loudness, &'static str)> {
    if prev == Some(now) {
        return None;
    }
    Some(match now {
        Verdict::Healthy if prev.is_none() => return None,
        Verdict::Healthy => (Loudness::Info, "etcd is healthy again"),
        Verdict::Degraded => (
            Loudness::Warn,
            "etcd is degraded: quorum holds, but not every endpoint answers; one more member \
             lost stops new leases and provisioning",
        ),
        Verdict::Alarm => (
            Loudness::Error,
            "etcd raised an alarm: writes are refused until the operator clears it \
             (see docs/operations.md, losing etcd); no new lease is handed out meanwhile",
        ),
        Verdict::NoQuorum => (
            Loudness::Error,
            "etcd has no quorum: no new lease is handed out and no provisioning step is \
             recorded until it returns; leases already handed out keep working on the machines",
        ),
    })
}

/// Probe etcd every [`PROBE_EVERY`] until `cancel` (and, with quorum, export the fleet's
/// gauges from `etcd`); returns the view of the latest probe and the task.
pub(crate) fn spawn(
    cfg: EtcdConfig,
    etcd: Arc<EtcdStore>,
    cancel: CancellationToken,
) -> (HealthView, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let mut prev = None;
        let mut fleet = FleetGauges::default();
        loop {
            if let Ok(h) = probe(&cfg).await {
                export(&h);
                if h.quorum {
                    fleet.export(&etcd).await;
                }
                let now = h.verdict();
                if let Some((loud, what)) = transition(prev, now) {
                    let summary = h.summary();
                    match loud {
                        Loudness::Info => tracing::info!(%summary, "{what}"),
                        Loudness::Warn => tracing::warn!(%summary, "{what}"),
                        Loudness::Error => tracing::error!(%summary, "{what}"),
                    }
                }
                prev = Some(now);
                let _ = tx.send(Some(h));
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
        }
    });
    (rx, task)
}

/// The fleet's gauges, remembering the leader last exported so that a former leader's series
/// drops to 0 instead of staying at 1.
#[derive(Default)]
struct FleetGauges {
    leader: Option<String>,
}

impl FleetGauges {
    /// Count the live appliances and name the leader (a read that fails leaves its gauge).
    async fn export(&mut self, etcd: &Arc<EtcdStore>) {
        let store = etcd.clone();
        // The member list is a blocking read through the store's own runtime thread.
        if let Ok(Ok(members)) = tokio::task::spawn_blocking(move || store.members()).await {
            gauge!("talboot_appliances_live").set(members.len() as f64);
        }
        let Ok(leader) = Election::new(etcd, SESSION_TTL).leader().await else {
            return;
        };
        let now = leader.map(|c| c.name);
        for (name, value) in leader_series(self.leader.as_deref(), now.as_deref()) {
            gauge!("talboot_fleet_leader", "name" => name.to_owned()).set(value);
        }
        self.leader = now;
    }
}

/// The `talboot_fleet_leader{name}` values to set when the leader goes from `prev` to `now`:
/// the new one at 1, a former one at 0 (nothing when it did not change).
fn leader_series<'a>(prev: Option<&'a str>, now: Option<&'a str>) -> Vec<(&'a str, f64)> {
    if prev == now {
        return Vec::new();
    }
    prev.map(|p| (p, 0.0))
        .into_iter()
        .chain(now.map(|n| (n, 1.0)))
        .collect()
}

/// The probe as gauges.
fn export(h: &EtcdHealth) {
    gauge!("talboot_etcd_quorum").set(if h.quorum { 1.0 } else { 0.0 });
    gauge!("talboot_etcd_alarms").set(h.alarms.len() as f64);
    for e in &h.endpoints {
        let up = e.status.as_ref().ok();
        gauge!("talboot_etcd_endpoint_up", "endpoint" => e.url.clone()).set(if up.is_some() {
            1.0
        } else {
            0.0
        });
        if let Some(s) = up {
            gauge!("talboot_etcd_endpoint_leader", "endpoint" => e.url.clone())
                .set(if s.is_leader { 1.0 } else { 0.0 });
            gauge!("talboot_etcd_db_size_bytes", "endpoint" => e.url.clone()).set(s.db_size as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_former_leaders_series_drops_to_zero_and_an_unchanged_one_is_left() {
        assert_eq!(leader_series(None, Some("a")), [("a", 1.0)]);
        assert_eq!(leader_series(Some("a"), Some("a")), []);
        assert_eq!(
            leader_series(Some("a"), Some("b")),
            [("a", 0.0), ("b", 1.0)]
        );
        assert_eq!(leader_series(Some("b"), None), [("b", 0.0)]);
    }

    #[test]
    fn each_change_of_verdict_is_said_once_and_the_first_healthy_probe_is_not() {
        assert_eq!(transition(None, Verdict::Healthy), None);
        assert_eq!(transition(Some(Verdict::Healthy), Verdict::Healthy), None);
        let (loud, what) = transition(Some(Verdict::Degraded), Verdict::NoQuorum).unwrap();
        assert_eq!(loud, Loudness::Error);
        assert!(what.contains("no new lease is handed out"), "{what}");
        assert!(what.contains("keep working"), "{what}");
        assert_eq!(transition(Some(Verdict::NoQuorum), Verdict::NoQuorum), None);
        assert_eq!(
            transition(Some(Verdict::NoQuorum), Verdict::Healthy).map(|t| t.0),
            Some(Loudness::Info)
        );
        assert_eq!(
            transition(None, Verdict::Degraded).map(|t| t.0),
            Some(Loudness::Warn)
        );
        assert_eq!(
            transition(Some(Verdict::Healthy), Verdict::Alarm).map(|t| t.0),
            Some(Loudness::Error)
        );
    }
}
