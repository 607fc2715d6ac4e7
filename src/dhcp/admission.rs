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
//! The rule, for a DISCOVER (a REQUEST, RELEASE, DECLINE or INFORM is never refused here:
//! it finishes an exchange already paid for):
//! - the *target* is how long an ACK normally waits: twice the smoothed durable-commit time
//!   (an ACK waits for the commit in progress when it was decided, then for its own) plus
//!   four deviations -- the retransmission timeout estimator of RFC 6298 §2, applied to
//!   commits instead of round trips -- bounded by [`Limits::floor`] and [`Limits::ceiling`];
//! - a commit is *late* when its oldest ACK waited longer than the target predicted before
//!   the commit finished;
//! - a DISCOVER is shed while the oldest waiting ACK is older than the target **and** the
//!   last commit was late **and** more ACKs wait behind the commit in progress than it
//!   carries (a real backlog: the next commit has more to clear than this one), or whenever
//!   the oldest waiting ACK is older than the ceiling (a client's patience), or when more ACKs
//!   wait than the memory bound allows.
//!
//! Why not the age alone: group commit takes every waiting ACK into the next transaction, so
//! one slow `fdatasync` (measured up to ~50 ms on a quiet machine, 180 ms on a loaded one;
//! docs/benchmarks.md) is cleared by the next commit whatever piled up behind it: the disk is
//! not the bottleneck, and shedding on the stall (a 10 ms floor on the age alone turned away
//! 284 DISCOVERs at 1,000/s, where Kea turned away none) only costs exchanges. During a first
//! stall no finished commit was late; after it, the estimator's deviation has jumped (RFC
//! 6298's RTTVAR takes a quarter of the miss), and the commit carrying what piled up has more
//! in it than waits behind it. Saturation looks different: when each commit's time grows
//! with its batch (the CPU, not the fsync, sets it), the target chases the commit time but
//! every batch is larger than the one before, so the commits stay late and the waiting ACKs
//! outnumber the batch in progress: DISCOVERs are shed until the next batch is no larger than
//! the current one, which holds the wait near where lateness began.
//!
//! This rule stops a backlog *growing*; it does not bring a standing delay down (with the CPU
//! setting commit times, the wait settled at the ceiling: docs/benchmarks.md, session 7's
//! pinned run). [`super::sojourn`] does that, on the REQUEST's whole delay; a DISCOVER is
//! shed when either rule says so.
//!
//! [`Backlog`] is the thin shared wrapper: the handler asks it, the committer tells it when
//! ACKs were queued and when each durable commit finished, and the sender how long each
//! reply took from its request's arrival.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::queue::Lane;
use super::sojourn::{self, Sojourn};

/// How many consecutive late commits, with a growing backlog, shed DISCOVERs (see the module
/// docs): the growth condition already tells a stall (one slow commit, then one that clears
/// the pile) from saturation, so one late commit is enough and shedding starts early.
pub(crate) const SUSTAINED: u32 = 1;

/// Bounds of the admission target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// The target is never below this: waits that short are scheduling noise.
    pub(crate) floor: Duration,
    /// Always shed once the oldest ACK has waited this long, however slow commits have been
    /// and whether or not the lateness has lasted.
    pub(crate) ceiling: Duration,
}

impl Default for Limits {
    /// A floor of 10 ms: waits that short are the blocking pool's or the scheduler's on a
    /// shared 2-core machine (measured up to several ms; docs/benchmarks.md). A ceiling of
    /// 250 ms: a quarter of perfdhcp's default drop time (1 s, `-d`) and far inside an RFC 2131
    /// §4.1 client's first 4 s retransmission.
    fn default() -> Self {
        Self {
            floor: Duration::from_millis(10),
            ceiling: Duration::from_millis(250),
        }
    }
}

/// Why a DISCOVER was not answered (the `reason` label of `dhcp_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shed {
    /// More ACKs wait than the memory bound allows.
    Backlog,
    /// The oldest ACK is older than the target and the last commits were all late.
    Late,
    /// The oldest ACK is older than the ceiling.
    Ceiling,
    /// REQUESTs have been answered later than the delay target ([`sojourn`]).
    Delay,
}

impl Shed {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Backlog => "ack_backlog",
            Self::Late => "ack_late",
            Self::Ceiling => "ack_ceiling",
            Self::Delay => "request_delay",
        }
    }
}

/// Smoothed durable-commit time and its deviation, the run of late commits, and the
/// admission decision.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    limits: Limits,
    /// RFC 6298 SRTT and RTTVAR, in seconds, of durable commits; `None` before the first.
    smoothed: Option<(f64, f64)>,
    /// Consecutive finished durable commits whose oldest ACK waited longer than the target.
    late: u32,
}

impl Admission {
    /// No commit measured yet: the target is the floor, and nothing has been late.
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            smoothed: None,
            late: 0,
        }
    }

    /// Record how long one durable commit took (from the committer taking its batch to the
    /// synced transaction returning), without judging its lateness.
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

    /// A durable commit finished: it took `took`, and the oldest ACK it releases had waited
    /// `oldest` (`None`: it carried no reply, and says nothing about lateness).
    #[cfg(test)]
    pub(crate) fn committed(&mut self, took: Duration, oldest: Option<Duration>) {
        self.committed_while(took, oldest, false);
    }

    /// [`Self::committed`], where `shedding` says whether DISCOVERs were shed while it ran.
    /// Such a commit is judged but not learnt from: its time is the overload's (a batch the
    /// CPU cannot keep up with), not the disk's, and a target that followed it would call the
    /// overload normal once it stopped growing, stop shedding, and let it grow again.
    pub(crate) fn committed_while(
        &mut self,
        took: Duration,
        oldest: Option<Duration>,
        shedding: bool,
    ) {
        if let Some(w) = oldest {
            // Judged against the target predicted before this commit's own time is known.
            if w > self.target() {
                self.late = self.late.saturating_add(1);
            } else {
                self.late = 0;
            }
        }
        if !shedding {
            self.observe(took);
        }
    }

    /// How long the oldest ACK normally waits; older than this, with lateness that lasted,
    /// new exchanges are refused.
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

    /// Whether a datagram in `lane` may be handled with `waiting` ACKs waiting for the disk,
    /// of at most `max_waiting`. `None` admits; REQUESTs (the `Finish` lane) are always
    /// admitted.
    pub(crate) fn decide(&self, lane: Lane, waiting: &Waiting, max_waiting: usize) -> Option<Shed> {
        if lane == Lane::Finish {
            return None;
        }
        if waiting.count >= max_waiting {
            return Some(Shed::Backlog);
        }
        let w = waiting.oldest?;
        if w > self.limits.ceiling {
            Some(Shed::Ceiling)
        } else if self.late >= SUSTAINED && waiting.behind > waiting.batch && w > self.target() {
            Some(Shed::Late)
        } else {
            None
        }
    }

    /// Whether a new exchange may start (a DISCOVER with no count bound; see [`Self::decide`]).
    #[cfg(test)]
    pub(crate) fn admit(&self, oldest: Option<Duration>) -> bool {
        self.decide(Lane::Start, &Waiting::growing(oldest), usize::MAX)
            .is_none()
    }
}

/// The ACKs waiting for the disk, as the admission rule sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Waiting {
    /// How long the oldest has waited (`None`: none waits).
    pub(crate) oldest: Option<Duration>,
    /// How many wait, in the commit in progress or behind it.
    pub(crate) count: usize,
    /// How many wait behind the commit in progress (they make the next batch).
    pub(crate) behind: usize,
    /// How many replies the latest commit taken carries (in progress, or the last finished).
    pub(crate) batch: usize,
}

impl Waiting {
    /// One or more ACKs waiting, the oldest for `oldest`, more of them behind the commit in
    /// progress than in it (a tests' shorthand for "the backlog is growing").
    #[cfg(test)]
    pub(crate) fn growing(oldest: Option<Duration>) -> Self {
        Self {
            oldest,
            count: 2,
            behind: 2,
            batch: 0,
        }
    }
}

/// The replies waiting for a commit (their enqueue times, oldest first), how many of them the
/// commit in progress carries, and the [`Admission`] fed by the committer; shared by the
/// handler and the committer.
#[derive(Debug)]
pub(crate) struct Backlog {
    inner: Mutex<Shared>,
}

#[derive(Debug)]
struct Shared {
    queued: VecDeque<Instant>,
    /// Replies in the commit in progress (0 when none is).
    in_commit: usize,
    /// Replies in the latest commit taken.
    batch: usize,
    /// Whether a DISCOVER was shed since the last commit finished.
    shed: bool,
    admission: Admission,
    /// The REQUEST-delay controller, fed by the sender and the committer.
    sojourn: Sojourn,
}

impl Backlog {
    /// Nothing waiting, no commit measured.
    #[cfg(test)]
    pub(crate) fn new(limits: Limits) -> Self {
        Self::with_delay(limits, sojourn::Params::default())
    }

    /// [`Self::new`] with the REQUEST-delay controller's constants.
    pub(crate) fn with_delay(limits: Limits, params: sojourn::Params) -> Self {
        Self {
            inner: Mutex::new(Shared {
                queued: VecDeque::new(),
                in_commit: 0,
                batch: 0,
                shed: false,
                admission: Admission::new(limits),
                sojourn: Sojourn::new(params),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reply was queued behind a commit at `at`.
    pub(crate) fn queued(&self, at: Instant) {
        self.lock().queued.push_back(at);
    }

    /// One queued reply no longer waits (given up before its commit). The committer finishes
    /// replies in the order they were queued, so the oldest entry is the one that left.
    pub(crate) fn left(&self) {
        self.lock().queued.pop_front();
    }

    /// The committer took a batch carrying the `replies` oldest queued replies.
    pub(crate) fn taken(&self, replies: usize) {
        let mut inner = self.lock();
        inner.in_commit = replies;
        inner.batch = replies;
    }

    /// The commit in progress, releasing the `replies` oldest queued replies, finished at
    /// `now`; when `durable`, it took `took` and is judged for lateness (see
    /// [`Admission::committed`]).
    pub(crate) fn committed(&self, replies: usize, durable: Option<Duration>, now: Instant) {
        let mut inner = self.lock();
        let oldest = (replies > 0)
            .then(|| {
                inner
                    .queued
                    .front()
                    .map(|t| now.saturating_duration_since(*t))
            })
            .flatten();
        for _ in 0..replies {
            inner.queued.pop_front();
        }
        inner.in_commit = 0;
        let shedding = std::mem::take(&mut inner.shed);
        if let Some(took) = durable {
            inner.admission.committed_while(took, oldest, shedding);
            inner.sojourn.committed(took, now);
        }
    }

    /// A reply that waited for a commit left, `sojourn` after its request was received.
    pub(crate) fn sent(&self, sojourn: Duration) {
        self.lock().sojourn.sent(sojourn);
    }

    /// The REQUEST-delay controller's drop probability (for the metrics).
    pub(crate) fn delay_probability(&self) -> f64 {
        self.lock().sojourn.probability()
    }

    /// The smoothed durable-commit time (zero before the first): about when the next commit
    /// will release its replies.
    pub(crate) fn commit_time(&self) -> Duration {
        self.lock()
            .admission
            .smoothed
            .and_then(|(srtt, _)| Duration::try_from_secs_f64(srtt).ok())
            .unwrap_or_default()
    }

    /// Replies waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().queued.len()
    }

    /// Whether a datagram in `lane` may be handled at `now` with at most `max_waiting` ACKs
    /// waiting (see [`Admission::decide`]).
    pub(crate) fn decide(&self, lane: Lane, now: Instant, max_waiting: usize) -> Option<Shed> {
        let mut inner = self.lock();
        let count = inner.queued.len();
        let waiting = Waiting {
            oldest: inner
                .queued
                .front()
                .map(|t| now.saturating_duration_since(*t)),
            count,
            behind: count.saturating_sub(inner.in_commit),
            batch: inner.batch,
        };
        inner.sojourn.tick(now, waiting.oldest);
        let shed = inner
            .admission
            .decide(lane, &waiting, max_waiting)
            .or_else(|| (lane == Lane::Start && inner.sojourn.shed()).then_some(Shed::Delay));
        inner.shed |= shed.is_some();
        shed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `n` commits of a steady disk, each releasing an ACK that waited two commits.
    fn steady(a: &mut Admission, took: Duration, n: usize) {
        for _ in 0..n {
            a.committed(took, Some(took * 2));
        }
    }

    /// The oldest of `count` waiting ACKs waited `oldest`; `behind` of them are behind a
    /// commit in progress carrying `batch`.
    fn w(oldest: Duration, count: usize, behind: usize, batch: usize) -> Waiting {
        Waiting {
            oldest: Some(oldest),
            count,
            behind,
            batch,
        }
    }

    #[test]
    fn nothing_waiting_always_admits() {
        let mut a = Admission::new(Limits::default());
        assert!(a.admit(None));
        for _ in 0..20 {
            a.committed(ms(400), Some(ms(800)));
        }
        assert!(a.admit(None));
    }

    #[test]
    fn one_slow_commit_is_a_stall_not_a_backlog() {
        let mut a = Admission::new(Limits::default());
        steady(&mut a, ms(2), 50);
        // A 50 ms fsync in progress with 2 ACKs, 45 more behind it: the oldest ACK waits far
        // past the target, but no finished commit has been late, so exchanges go on.
        assert_eq!(a.decide(Lane::Start, &w(ms(45), 47, 45, 2), 512), None);
        a.committed(ms(50), Some(ms(51)));
        // The commit carrying what piled up (50 ACKs, 2 behind it): not a growing backlog.
        assert_eq!(a.decide(Lane::Start, &w(ms(51), 52, 2, 50), 512), None);
        // ... and not late against the target the stall widened.
        assert!(a.target() > ms(52), "{:?}", a.target());
        a.committed(ms(2), Some(ms(52)));
        assert_eq!(a.decide(Lane::Start, &w(ms(40), 5, 3, 2), 512), None);
    }

    #[test]
    fn a_late_commit_with_a_growing_backlog_sheds_new_exchanges() {
        let mut a = Admission::new(Limits::default());
        steady(&mut a, ms(3), 50);
        // Steady 3 ms commits: a wait of two commits is normal, not overload.
        assert_eq!(a.decide(Lane::Start, &w(ms(6), 20, 12, 8), 512), None);
        // A commit later than the target, and more waiting behind the next than it carries.
        a.committed(ms(15), Some(ms(30)));
        let late = a.target() + ms(1);
        assert_eq!(
            a.decide(Lane::Start, &w(late, 300, 200, 100), 512),
            Some(Shed::Late)
        );
        // Not while the oldest waiting ACK is within the target, nor when the next batch is
        // no larger than the one in progress.
        assert_eq!(
            a.decide(Lane::Start, &w(a.target(), 300, 200, 100), 512),
            None
        );
        assert_eq!(a.decide(Lane::Start, &w(late, 200, 100, 100), 512), None);
        // One commit on time ends it.
        a.committed(ms(3), Some(ms(4)));
        assert_eq!(a.decide(Lane::Start, &w(late, 300, 200, 100), 512), None);
    }

    #[test]
    fn the_target_follows_a_slower_disk() {
        // The same 40 ms wait is normal where every commit takes 30 ms.
        let mut a = Admission::new(Limits::default());
        steady(&mut a, ms(30), 50);
        assert!(a.target() > ms(40));
        let mut b = Admission::new(Limits::default());
        steady(&mut b, ms(3), 50);
        assert!(b.target() < ms(40));
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
    fn the_ceiling_sheds_whatever_came_before() {
        let mut a = Admission::new(Limits::default());
        // Before any commit finished (the first one is stuck) ...
        assert!(a.admit(Some(ms(200))));
        assert_eq!(
            a.decide(Lane::Start, &w(ms(300), 1, 0, 1), 512),
            Some(Shed::Ceiling)
        );
        // ... and however slow the disk has been.
        steady(&mut a, Duration::from_secs(2), 50);
        assert_eq!(a.target(), Limits::default().ceiling);
        assert!(!a.admit(Some(ms(300))));
    }

    #[test]
    fn the_count_bound_sheds_discovers_only() {
        let a = Admission::new(Limits::default());
        let many = |n| w(ms(1), n, 0, n);
        assert_eq!(a.decide(Lane::Start, &many(512), 512), Some(Shed::Backlog));
        assert_eq!(a.decide(Lane::Start, &many(511), 512), None);
        assert_eq!(a.decide(Lane::Finish, &many(10_000), 512), None);
    }

    #[test]
    fn the_backlog_measures_the_oldest_waiting_reply() {
        let b = Backlog::new(Limits::default());
        let t0 = Instant::now();
        assert_eq!(b.decide(Lane::Start, t0 + ms(500), 512), None);
        b.queued(t0);
        b.queued(t0 + ms(30));
        assert_eq!(b.len(), 2);
        assert_eq!(b.decide(Lane::Start, t0 + ms(5), 2), Some(Shed::Backlog));
        assert_eq!(
            b.decide(Lane::Start, t0 + ms(300), 512),
            Some(Shed::Ceiling)
        );
        // The oldest left with its commit: the other has waited 270 ms.
        b.taken(1);
        b.committed(1, Some(ms(5)), t0 + ms(5));
        assert_eq!(b.len(), 1);
        assert_eq!(
            b.decide(Lane::Start, t0 + ms(300), 512),
            Some(Shed::Ceiling)
        );
        assert_eq!(b.decide(Lane::Start, t0 + ms(200), 512), None);
        b.left();
        assert_eq!(b.len(), 0);
        assert_eq!(b.decide(Lane::Start, t0 + ms(5_000), 512), None);
    }

    #[test]
    fn a_commit_during_which_discovers_were_shed_is_judged_but_not_learnt() {
        let b = Backlog::new(Limits::default());
        let t0 = Instant::now();
        b.queued(t0);
        b.taken(1);
        b.committed(1, Some(ms(5)), t0 + ms(6));
        assert_eq!(b.commit_time(), ms(5));
        b.queued(t0 + ms(10));
        b.taken(1);
        assert_eq!(
            b.decide(Lane::Start, t0 + ms(300), 512),
            Some(Shed::Ceiling)
        );
        b.committed(1, Some(ms(400)), t0 + ms(410));
        assert_eq!(
            b.commit_time(),
            ms(5),
            "the overload's commit is not the disk's"
        );
        b.queued(t0 + ms(500));
        b.taken(1);
        b.committed(1, Some(ms(13)), t0 + ms(513));
        assert_eq!(b.commit_time(), ms(6));
    }

    #[test]
    fn a_commit_judges_the_oldest_reply_it_releases_and_the_batch_behind_it() {
        let b = Backlog::new(Limits::default());
        let t0 = Instant::now();
        // Fast commits whose replies waited 4 ms: the target stays at the 10 ms floor.
        for i in 0..20 {
            b.queued(t0 + ms(10 * i));
            b.taken(1);
            b.committed(1, Some(ms(2)), t0 + ms(10 * i + 4));
        }
        let t = t0 + ms(1_000);
        b.queued(t);
        b.taken(1);
        // Its commit releases it 40 ms after it was queued: late.
        b.committed(1, Some(ms(2)), t + ms(40));
        b.queued(t + ms(41));
        b.taken(1);
        b.queued(t + ms(42));
        // One in the commit, one behind it: not growing.
        assert_eq!(b.decide(Lane::Start, t + ms(60), 512), None);
        b.queued(t + ms(43));
        assert_eq!(b.decide(Lane::Start, t + ms(50), 512), None);
        assert_eq!(b.decide(Lane::Start, t + ms(60), 512), Some(Shed::Late));
        // A REQUEST is handled all the same.
        assert_eq!(b.decide(Lane::Finish, t + ms(60), 512), None);
    }

    /// What happens in the simulated pipeline, in microseconds of virtual time.
    enum Step<'a> {
        /// A DISCOVER arrives (the model answers whether it is admitted); `pipe` is the ACKs
        /// waiting as the handler would see them.
        Discover { pipe: Pipe<'a> },
        /// An admitted exchange's REQUEST arrives and queues its ACK.
        Request,
        /// The committer takes a batch of this many ACKs.
        Taken(usize),
        /// A commit lasting `took` ends, releasing ACKs queued at these times.
        Committed { took: Duration, batch: &'a [u64] },
    }

    /// The ACKs queued (their times) in the commit in progress and behind it, and the size
    /// of the latest batch taken.
    struct Pipe<'a> {
        in_commit: &'a [u64],
        behind: &'a VecDeque<u64>,
        batch: usize,
    }

    /// The pipeline in virtual time: DISCOVERs arrive every `1/rate` s for `secs`; an admitted
    /// one's REQUEST arrives 200 us later and queues an ACK; the committer takes every waiting
    /// ACK into one commit lasting `took(batch size, commit number)`, then releases them.
    /// `model` sees every step at its time and says, for a DISCOVER, whether it is admitted.
    fn pipeline(
        rate: u64,
        secs: u64,
        mut took: impl FnMut(usize, usize) -> Duration,
        mut model: impl FnMut(u64, Step<'_>) -> bool,
    ) {
        let (interval, rtt, end) = (1_000_000 / rate, 200, secs * 1_000_000);
        let (mut requests, mut waiting) = (VecDeque::<u64>::new(), VecDeque::<u64>::new());
        // The commit in progress: when it ends, how long it took, what it carries.
        let mut commit: Option<(u64, Duration, Vec<u64>)> = None;
        let (mut next_discover, mut commits, mut batch_len) = (0u64, 0usize, 0usize);
        loop {
            let t_commit = commit.as_ref().map(|c| c.0).unwrap_or(u64::MAX);
            let t_request = requests.front().copied().unwrap_or(u64::MAX);
            let t_discover = if next_discover < end {
                next_discover
            } else {
                u64::MAX
            };
            let now = t_commit.min(t_request).min(t_discover);
            if now == u64::MAX {
                break;
            }
            if now == t_commit {
                let (_, took, batch) = commit.take().unwrap();
                model(
                    now,
                    Step::Committed {
                        took,
                        batch: &batch,
                    },
                );
            } else if now == t_request {
                model(now, Step::Request);
                waiting.push_back(requests.pop_front().unwrap());
            } else {
                let pipe = Pipe {
                    in_commit: commit.as_ref().map(|c| &c.2[..]).unwrap_or(&[]),
                    behind: &waiting,
                    batch: batch_len,
                };
                if model(now, Step::Discover { pipe }) {
                    requests.push_back(now + rtt);
                }
                next_discover += interval;
            }
            if commit.is_none() && !waiting.is_empty() {
                let batch: Vec<u64> = waiting.drain(..).collect();
                batch_len = batch.len();
                model(now, Step::Taken(batch_len));
                let d = took(batch.len(), commits);
                commits += 1;
                commit = Some((now + d.as_micros() as u64, d, batch));
            }
        }
    }

    /// What [`simulate`] saw.
    struct Sim {
        shed: Vec<Shed>,
        admitted: usize,
        acked: usize,
        max_wait: Duration,
    }

    /// [`pipeline`] through the [`Admission`] rule alone, fed as [`Backlog`] would feed it.
    fn simulate(
        limits: Limits,
        rate: u64,
        secs: u64,
        took: impl FnMut(usize, usize) -> Duration,
    ) -> Sim {
        let us = Duration::from_micros;
        let mut a = Admission::new(limits);
        let mut sim = Sim {
            shed: Vec::new(),
            admitted: 0,
            acked: 0,
            max_wait: Duration::ZERO,
        };
        let mut shedding = false;
        pipeline(rate, secs, took, |now, step| {
            match step {
                Step::Committed { took, batch } => {
                    let oldest = us(now - batch[0]);
                    sim.max_wait = sim.max_wait.max(oldest);
                    sim.acked += batch.len();
                    a.committed_while(took, Some(oldest), std::mem::take(&mut shedding));
                }
                Step::Discover { pipe } => {
                    let state = Waiting {
                        oldest: pipe
                            .in_commit
                            .first()
                            .or(pipe.behind.front())
                            .map(|t| us(now - t)),
                        count: pipe.in_commit.len() + pipe.behind.len(),
                        behind: pipe.behind.len(),
                        batch: pipe.batch,
                    };
                    match a.decide(Lane::Start, &state, usize::MAX) {
                        None => {
                            sim.admitted += 1;
                            return true;
                        }
                        Some(why) => {
                            sim.shed.push(why);
                            shedding = true;
                        }
                    }
                }
                Step::Request | Step::Taken(_) => {}
            }
            false
        });
        sim
    }

    /// Commit times of a healthy disk: mostly 0.5-3 ms, and isolated stalls of 10-60 ms (an
    /// fsync waiting behind other writers): at most one in any 8 commits. Denser stalls
    /// (CI's proptest found 33, 36 and 42 ms within five commits, repeated every 16) hold the
    /// REQUEST delay above its target for good: that is sustained lateness, which the delay
    /// rule exists to shed (`cpu_bound_commits_are_held_near_the_delay_target`), not jitter.
    fn jittery() -> impl Strategy<Value = Vec<Duration>> {
        proptest::collection::vec(
            (
                500u64..3_000,
                proptest::option::weighted(0.1, 10_000u64..60_000),
                500u64..3_000,
            ),
            8..64,
        )
        .prop_map(|pairs| {
            pairs
                .into_iter()
                .enumerate()
                // Each pair is two commits: a stall only on every fourth pair.
                .flat_map(|(i, (a, stall, b))| [stall.filter(|_| i % 4 == 0).unwrap_or(a), b])
                .map(Duration::from_micros)
                .collect()
        })
    }

    /// What a simulated run of the whole [`Backlog`] (both rules) did.
    struct Run {
        shed: Vec<Shed>,
        acked: usize,
        admitted: usize,
        /// Sojourns (REQUEST received to ACK sent) of the ACKs in the run's last second.
        late_sojourns: Vec<Duration>,
    }

    /// [`pipeline`] through [`Backlog`] as the server drives it: each ACK is sent (and its
    /// sojourn reported) when its commit ends.
    fn run_backlog(
        limits: Limits,
        delay: sojourn::Params,
        rate: u64,
        secs: u64,
        took: impl FnMut(usize, usize) -> Duration,
    ) -> Run {
        let us = Duration::from_micros;
        let t0 = Instant::now();
        let at = |t: u64| t0 + us(t);
        let b = Backlog::with_delay(limits, delay);
        let end = secs * 1_000_000;
        let mut run = Run {
            shed: Vec::new(),
            acked: 0,
            admitted: 0,
            late_sojourns: Vec::new(),
        };
        pipeline(rate, secs, took, |now, step| {
            match step {
                Step::Committed { took, batch } => {
                    b.committed(batch.len(), Some(took), at(now));
                    for r in batch {
                        let s = us(now - r);
                        b.sent(s);
                        if now + 1_000_000 >= end {
                            run.late_sojourns.push(s);
                        }
                    }
                    run.acked += batch.len();
                }
                Step::Request => {
                    assert_eq!(b.decide(Lane::Finish, at(now), usize::MAX), None);
                    b.queued(at(now));
                }
                Step::Taken(n) => b.taken(n),
                Step::Discover { .. } => match b.decide(Lane::Start, at(now), usize::MAX) {
                    None => {
                        run.admitted += 1;
                        return true;
                    }
                    Some(why) => run.shed.push(why),
                },
            }
            false
        });
        run
    }

    fn mean(v: &[Duration]) -> Duration {
        v.iter().sum::<Duration>() / (v.len().max(1) as u32)
    }

    /// The dense stalls CI's proptest once drew for the jittery-disk tests (33, 36 and 42 ms
    /// within five commits, every 16 commits): the REQUEST delay stays above target, and the
    /// delay rule sheds, as it is meant to; `jittery()` keeps stalls isolated instead.
    #[test]
    fn dense_stalls_are_sustained_lateness_and_are_shed() {
        let times: Vec<Duration> = [
            33_113u64, 1_708, 36_055, 2_214, 42_198, 1_458, 1_119, 2_939, 2_661, 706, 1_812, 1_098,
            1_319, 616, 1_252, 2_822,
        ]
        .into_iter()
        .map(Duration::from_micros)
        .collect();
        let run = run_backlog(
            Limits::default(),
            sojourn::Params::default(),
            1_000,
            3,
            |_, i| times[i % times.len()],
        );
        assert!(
            run.shed.contains(&Shed::Delay),
            "{:?}",
            &run.shed[..run.shed.len().min(5)]
        );
        assert_eq!(run.acked, run.admitted);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn the_whole_backlog_on_a_jittery_disk_at_1000_a_second_sheds_nothing(
            times in jittery(),
        ) {
            let run = run_backlog(Limits::default(), sojourn::Params::default(), 1_000, 3,
                |_, i| times[i % times.len()]);
            prop_assert!(run.shed.is_empty(), "shed {} ({:?})", run.shed.len(),
                &run.shed[..run.shed.len().min(5)]);
            prop_assert_eq!(run.acked, 3_000);
        }

        /// The case the growth rule alone left at the ceiling (talboot on one core at
        /// 15,000/s): CPU-bound commits. Both rules together bring the REQUEST delay down
        /// to near the target instead of holding it where it was when lateness began.
        #[test]
        fn cpu_bound_commits_are_held_near_the_delay_target(
            per_ack_us in 90u64..200, fixed_us in 500u64..3_000,
        ) {
            let limits = Limits { ceiling: Duration::from_secs(30), ..Limits::default() };
            let took = |n: usize, _| Duration::from_micros(fixed_us + per_ack_us * n as u64);
            let p = sojourn::Params::default();
            let run = run_backlog(limits, p, 15_000, 4, took);
            prop_assert!(run.shed.contains(&Shed::Delay));
            prop_assert_eq!(run.acked, run.admitted);
            let m = mean(&run.late_sojourns);
            // The shortest sojourn is steered to the target (twice the fastest commit, at
            // least the floor); the mean is about 1.5 times that, since a REQUEST also waits
            // for part of the commit in progress.
            let target = Duration::from_micros(2 * (fixed_us + per_ack_us)).max(p.floor);
            prop_assert!(m < target * 2 + ms(10), "mean {m:?}, target {target:?}");
            // The growth rule alone (a target no sojourn reaches) holds it far higher.
            let off = sojourn::Params { floor: Duration::from_secs(3600), ..p };
            let alone = mean(&run_backlog(limits, off, 15_000, 4, took).late_sojourns);
            prop_assert!(alone > m * 2, "alone {alone:?}, with the delay rule {m:?}");
        }

        #[test]
        fn a_jittery_disk_at_1000_a_second_sheds_nothing(times in jittery()) {
            let sim = simulate(Limits::default(), 1_000, 3, |_, i| times[i % times.len()]);
            prop_assert!(
                sim.shed.is_empty(),
                "shed {} ({:?})",
                sim.shed.len(),
                &sim.shed[..sim.shed.len().min(5)]
            );
            prop_assert_eq!(sim.acked, 3_000);
        }

        #[test]
        fn a_backlog_that_outgrows_each_commit_is_shed_before_the_ceiling(
            per_ack_us in 90u64..200, fixed_us in 500u64..3_000,
        ) {
            // CPU-bound commits (time grows with the batch) at 15,000/s, able to clear at most
            // ~11,000/s: without shedding every batch is larger than the last, for ever. The
            // ceiling is set far away to show it is the lateness rule that holds the wait.
            let limits = Limits { ceiling: Duration::from_secs(30), ..Limits::default() };
            let sim = simulate(limits, 15_000, 3, |n, _| {
                Duration::from_micros(fixed_us + per_ack_us * n as u64)
            });
            prop_assert!(!sim.shed.is_empty());
            prop_assert!(sim.shed.iter().all(|s| *s == Shed::Late));
            prop_assert!(sim.max_wait < Duration::from_millis(250), "{:?}", sim.max_wait);
            prop_assert_eq!(sim.acked, sim.admitted);
        }

        #[test]
        fn target_stays_within_limits_admission_is_monotone_and_requests_always_pass(
            commits in proptest::collection::vec((0u64..5_000_000, 0u64..10_000_000), 0..40),
            wait in 0u64..2_000_000,
            more in 0u64..2_000_000,
            (count, behind, batch) in (0usize..1_000, 0usize..1_000, 0usize..1_000),
        ) {
            let limits = Limits::default();
            let mut a = Admission::new(limits);
            for (c, w) in commits {
                a.committed(Duration::from_micros(c), Some(Duration::from_micros(w)));
            }
            let t = a.target();
            prop_assert!(t >= limits.floor && t <= limits.ceiling);
            let (w1, w2) = (Duration::from_micros(wait), Duration::from_micros(wait + more));
            let at = |d| w(d, count, behind, batch);
            // Refused at some wait implies refused at every longer wait.
            if a.decide(Lane::Start, &at(w1), 512).is_some() {
                prop_assert!(a.decide(Lane::Start, &at(w2), 512).is_some());
            }
            // Never shed below the target, never kept past the ceiling.
            if w1 <= t && count < 512 {
                prop_assert_eq!(a.decide(Lane::Start, &at(w1), 512), None);
            }
            if w1 > limits.ceiling {
                prop_assert!(a.decide(Lane::Start, &at(w1), 512).is_some());
            }
            // A REQUEST is never shed, whatever would shed a DISCOVER.
            prop_assert_eq!(a.decide(Lane::Finish, &at(w2), 512), None);
        }
    }
}
