//! Admission of new DHCP exchanges from the measured durable-commit latency: whether a
//! DISCOVER may be answered while ACKs wait for the disk (pure; the server feeds it the
//! commit timings and the age of the oldest waiting ACK).
//!
//! Why: Kea 2.2.0 answers one datagram at a time (`Dhcpv4Srv::run_one` calls
//! `processPacketAndSendResponse` before the next `receivePacket` when multi-threading is
//! off; isc-projects/kea `src/bin/dhcp4/dhcp4_srv.cc` at Kea-2.2.0), so it never has more
//! exchanges open than it can finish: its OFFER rate is whatever is left after its REQUESTs.
//! talboot sends an OFFER at once and makes each ACK wait for a synced commit, so without a
//! brake it opens exchanges faster than the disk can close them, and every REQUEST still
//! waiting when the client gives up is lost (perfdhcp counts a REQUEST unanswered when its
//! run ends as dropped: `ExchangeStats::getDroppedPacketsNum` is sent minus received, and
//! `TestControl::waitToExit` does not wait without `-W`; `src/bin/perfdhcp/stats_mgr.h`,
//! `test_control.cc` at Kea-2.2.0). A fixed count of waiting ACKs (512 before) is the wrong
//! brake: on a fast disk it never binds, on a slow one 512 ACKs are a second of waiting.
//!
//! The rule: a DISCOVER is not answered while the oldest ACK waiting for its commit has
//! waited longer than a commit cycle normally takes: twice the smoothed durable-commit time
//! (an ACK waits for the commit in progress when it was decided, then for its own) plus four
//! deviations -- the retransmission timeout estimator of RFC 6298 §2, applied to commits
//! instead of round trips -- bounded below by [`Limits::floor`] (scheduling noise is not
//! overload) and above by [`Limits::ceiling`] (a client's patience). ACKs already owed are
//! never refused here: only the start of new exchanges is.
//!
//! [`Backlog`] is the thin shared wrapper: the handler asks it, the committer tells it when
//! ACKs were queued, when they left and how long each durable commit took.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bounds of the admission target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Never shed while the oldest ACK has waited less than this.
    pub(crate) floor: Duration,
    /// Always shed once the oldest ACK has waited this long, however slow commits have been.
    pub(crate) ceiling: Duration,
}

impl Default for Limits {
    /// A floor of 10 ms: waits that short are the blocking pool's or the scheduler's on a
    /// shared 2-core machine (measured up to several ms; docs/benchmarks.md), and shedding on
    /// them would cost exchanges at rates the disk keeps up with. A ceiling of 250 ms: a
    /// quarter of perfdhcp's default drop time (1 s, `-d`) and far inside an RFC 2131 §4.1
    /// client's first 4 s retransmission.
    fn default() -> Self {
        Self {
            floor: Duration::from_millis(10),
            ceiling: Duration::from_millis(250),
        }
    }
}

/// Smoothed durable-commit time and its deviation, and the admission decision.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    limits: Limits,
    /// RFC 6298 SRTT and RTTVAR, in seconds, of durable commits; `None` before the first.
    smoothed: Option<(f64, f64)>,
}

impl Admission {
    /// No commit measured yet: the target is the floor.
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            smoothed: None,
        }
    }

    /// Record how long one durable commit took (from the committer taking its batch to the
    /// synced transaction returning).
    pub(crate) fn observe(&mut self, took: Duration) {
        let r = took.as_secs_f64();
        // RFC 6298 §2.2 and §2.3, alpha = 1/8, beta = 1/4.
        self.smoothed = Some(match self.smoothed {
            None => (r, r / 2.0),
            Some((srtt, var)) => (
                srtt + (r - srtt) / 8.0,
                var + ((srtt - r).abs() - var) / 4.0,
            ),
        });
    }

    /// How long the oldest ACK may wait before new exchanges are refused.
    pub(crate) fn target(&self) -> Duration {
        let t = match self.smoothed {
            None => self.limits.floor,
            Some((srtt, var)) => {
                Duration::try_from_secs_f64(2.0 * srtt + 4.0 * var).unwrap_or(self.limits.ceiling)
            }
        };
        t.clamp(
            self.limits.floor,
            self.limits.ceiling.max(self.limits.floor),
        )
    }

    /// Whether a new exchange may be started while the oldest ACK waiting for its commit has
    /// waited `oldest` (`None`: nothing waits).
    pub(crate) fn admit(&self, oldest: Option<Duration>) -> bool {
        oldest.is_none_or(|w| w <= self.target())
    }
}

/// The ACKs waiting for a durable commit (their enqueue times, oldest first) and the
/// [`Admission`] fed by the committer; shared by the handler and the committer.
#[derive(Debug)]
pub(crate) struct Backlog {
    inner: Mutex<(VecDeque<Instant>, Admission)>,
}

impl Backlog {
    /// Nothing waiting, no commit measured.
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            inner: Mutex::new((VecDeque::new(), Admission::new(limits))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (VecDeque<Instant>, Admission)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reply was queued behind a commit at `at`.
    pub(crate) fn queued(&self, at: Instant) {
        self.lock().0.push_back(at);
    }

    /// One queued reply no longer waits (sent or given up). The committer finishes replies in
    /// the order they were queued, so the oldest entry is the one that left.
    pub(crate) fn left(&self) {
        self.lock().0.pop_front();
    }

    /// A durable commit took `took`.
    pub(crate) fn observe(&self, took: Duration) {
        self.lock().1.observe(took);
    }

    /// Replies waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().0.len()
    }

    /// Whether a new exchange may start at `now` (see [`Admission::admit`]).
    pub(crate) fn admit(&self, now: Instant) -> bool {
        let inner = self.lock();
        let oldest = inner.0.front().map(|t| now.saturating_duration_since(*t));
        inner.1.admit(oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_waiting_always_admits() {
        let mut a = Admission::new(Limits::default());
        assert!(a.admit(None));
        for _ in 0..20 {
            a.observe(ms(400));
        }
        assert!(a.admit(None));
    }

    #[test]
    fn before_any_commit_the_floor_decides() {
        let a = Admission::new(Limits::default());
        assert!(a.admit(Some(ms(9))));
        assert!(!a.admit(Some(ms(11))));
    }

    #[test]
    fn an_ack_waiting_far_longer_than_commits_take_sheds_new_exchanges() {
        let mut a = Admission::new(Limits::default());
        for _ in 0..50 {
            a.observe(ms(3));
        }
        // Steady 3 ms commits: a wait of two commits is normal, not overload.
        assert!(a.admit(Some(ms(6))));
        // One commit stuck for 40 ms (a slow fsync): its ACKs are behind.
        assert!(!a.admit(Some(ms(40))));
    }

    #[test]
    fn the_target_follows_a_slower_disk() {
        // The same 40 ms wait is normal where every commit takes 30 ms.
        let mut a = Admission::new(Limits::default());
        for _ in 0..50 {
            a.observe(ms(30));
        }
        assert!(a.admit(Some(ms(40))));
        assert!(!a.admit(Some(ms(150))));
    }

    #[test]
    fn jittery_commits_widen_the_target() {
        let (mut steady, mut jittery) = (
            Admission::new(Limits::default()),
            Admission::new(Limits::default()),
        );
        for i in 0..50 {
            steady.observe(ms(20));
            jittery.observe(ms(if i % 2 == 0 { 4 } else { 36 }));
        }
        assert!(jittery.target() > steady.target());
    }

    #[test]
    fn the_ceiling_bounds_the_wait_however_slow_the_disk() {
        let mut a = Admission::new(Limits::default());
        for _ in 0..50 {
            a.observe(Duration::from_secs(2));
        }
        assert_eq!(a.target(), Limits::default().ceiling);
        assert!(!a.admit(Some(ms(300))));
    }

    #[test]
    fn the_backlog_measures_the_oldest_waiting_reply() {
        let b = Backlog::new(Limits::default());
        let t0 = Instant::now();
        assert!(b.admit(t0 + ms(500)));
        b.queued(t0);
        b.queued(t0 + ms(30));
        assert_eq!(b.len(), 2);
        assert!(b.admit(t0 + ms(5)));
        assert!(!b.admit(t0 + ms(35)));
        // The oldest left: the other has waited 5 ms.
        b.left();
        assert!(b.admit(t0 + ms(35)));
        b.left();
        assert_eq!(b.len(), 0);
        assert!(b.admit(t0 + ms(5_000)));
    }

    proptest! {
        #[test]
        fn target_stays_within_limits_and_admission_is_monotone_in_the_wait(
            commits in proptest::collection::vec(0u64..5_000_000, 0..40),
            wait in 0u64..2_000_000,
            more in 0u64..2_000_000,
        ) {
            let limits = Limits::default();
            let mut a = Admission::new(limits);
            for c in commits {
                a.observe(Duration::from_micros(c));
            }
            let t = a.target();
            prop_assert!(t >= limits.floor && t <= limits.ceiling);
            let (w1, w2) = (Duration::from_micros(wait), Duration::from_micros(wait + more));
            // Refused at some wait implies refused at every longer wait.
            if !a.admit(Some(w1)) {
                prop_assert!(!a.admit(Some(w2)));
            }
        }
    }
}
