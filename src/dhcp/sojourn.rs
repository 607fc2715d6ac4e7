//! Admission of new DHCP exchanges from how long REQUESTs take to be answered: a PIE
//! controller (RFC 8033) whose "queue delay" is the REQUEST sojourn -- from the moment a
//! REQUEST is read off the socket to the moment its ACK leaves -- and whose early drops are
//! DISCOVERs (pure; the server feeds it sojourns, commit times and the clock).
//!
//! Why a second rule next to [`super::admission`]: that one watches ACKs waiting for the
//! disk and sheds while their backlog *grows*, which holds the wait near wherever lateness
//! began. With the CPU, not the fsync, setting the commit time (talboot and perfdhcp on one
//! core at 15,000/s offered), it began late: the average REQUEST-ACK delay settled at 247 ms,
//! the 250 ms ceiling (docs/benchmarks.md, session 7, pinned run). perfdhcp counts every
//! REQUEST still unanswered when its run ends as dropped (`ExchangeStats::getDroppedPacketsNum`
//! is sent minus received; isc-projects/kea `src/bin/perfdhcp/stats_mgr.h` at Kea-2.2.0), so a
//! standing delay `d` at rate `r` costs about `r x d` REQUESTs -- 2,900 at 11,700/s and 250 ms
//! -- and a real client's exchange is as slow. Kea keeps its delay low without a rule: it
//! answers one datagram before reading the next (`Dhcpv4Srv::run_one`,
//! `src/bin/dhcp4/dhcp4_srv.cc` at Kea-2.2.0), so overload waits in the kernel's socket buffer
//! and is dropped there. What talboot needs is a rule that drives the delay *down to a
//! target*, not one that stops it growing: an integral controller on the delay itself.
//!
//! PIE is that controller, specified for exactly this (a drop probability from the queueing
//! delay, updated on a timer; RFC 8033, as in Linux `net/sched/sch_pie.c`): every
//! [`Params::update`] the probability `p` moves by
//! `alpha x (delay - target) + beta x (delay - previous delay)` (§4.2); the step is capped at
//! 2 % once `p` is 10 % or more (one of the RFC's optional elements, §5); `p` decays by 2 % an
//! update while the delay is zero (§4.2); nothing is dropped during a burst allowance after a
//! calm spell (§4.4) -- which is what lets one slow fsync pass without shedding. Departures
//! from the RFC, each for the traffic here:
//! - **The delay is the shortest sojourn over the last ~100 ms** ([`Params::periods`]
//!   updates), CoDel's estimator of a standing queue (RFC 8289 §4.2), not the latest one.
//!   Group commit makes sojourns saw-toothed (a REQUEST that arrives as a commit starts waits
//!   for it and its own), and a disk with 1 slow commit in 16 raised the average above any
//!   sensible target at 1,000/s (the model test below), though shedding could not help: the
//!   next commit clears what piled up. Only when *every* REQUEST waits is the queue standing.
//! - **No auto-tuning of alpha and beta at small `p`** (§4.2's division by up to 2,048), and
//!   gains four times the RFC's: the tuning exists because one TCP drop halves a sender's
//!   window. A DISCOVER's client does not slow down when it is not answered (it retransmits on
//!   its own timer, RFC 2131 §4.1), so the probability needed is simply the excess share of
//!   the load (a third at 15,000/s against 10,000/s of capacity) and has to be reached within a
//!   fraction of a second.
//! - **Deterministic drops**: `p` accumulates per DISCOVER and one is shed each time the sum
//!   passes 1 -- the RFC's optional de-randomisation (§5) taken to its end. Arrivals are not
//!   correlated with a DISCOVER's position in that sequence, and a test can state exactly what
//!   is shed.
//! - **The safeguard uses the whole target** (the RFC's `drop_early`, §4.1: nothing while the
//!   previous delay is under *half* the target and `p` under 20 %): nothing is shed while the
//!   delay is within the target and `p` is under 20 %, nor, whatever `p`, under half the
//!   target. An idle disk sits near half the target (see below), where a small `p` left by a
//!   rise would shed exchanges for nothing; and under half the target more is being shed than
//!   the excess. Above 20 % shedding goes on *at* the target: a hard gate there turned the
//!   controller on and off, and each "off" let a whole window of the overload in (a 200 ms
//!   spike in the model test). `p` also decays by a tenth an update while the delay stays
//!   under half the target (the RFC: only at zero delay).
//! - **The target follows the disk**: `max(floor, 2 x the fastest durable commit of the last
//!   5-10 s)`. The shortest sojourn of an idle server is one commit (a REQUEST that arrives as
//!   the committer takes its batch), so twice that is a queue; a fixed 15 ms (the RFC's) would
//!   shed for ever at low load on a disk whose fsync takes 10 ms. The fastest commit, not the
//!   average: under overload the average grows with the batch (the CPU's work), and a target
//!   that followed it would call the overload normal.
//!
//! REQUESTs (and RELEASEs, DECLINEs, INFORMs) are never shed here: they finish exchanges
//! already paid for.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The controller's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Params {
    /// How often `p` is updated (RFC 8033 §4.2's `T_UPDATE`, 15 ms; here 16, tokio's timer
    /// rounds to milliseconds and nothing depends on the exact value).
    pub(crate) update: Duration,
    /// The lowest delay target: below it, delays are scheduling noise on a shared 2-core
    /// machine (a blocking-pool wake-up, a paced chunk; docs/benchmarks.md).
    pub(crate) floor: Duration,
    /// Gain on the delay's distance from the target, per second of delay (RFC 8033: 0.125).
    pub(crate) alpha: f64,
    /// Gain on the delay's change since the last update, per second (RFC 8033: 1.25).
    pub(crate) beta: f64,
    /// How long after a calm spell nothing is shed (RFC 8033 §4.4's `MAX_BURST`, 150 ms).
    pub(crate) burst: Duration,
    /// The fastest commit is remembered over one to two of these.
    pub(crate) disk_window: Duration,
    /// The delay is the shortest sojourn over this many update periods (about 100 ms,
    /// CoDel's interval: RFC 8289 §4.2).
    pub(crate) periods: usize,
}

impl Default for Params {
    /// RFC 8033's values, except:
    /// - alpha and beta four times the RFC's, since nothing upstream of the drop reacts to it
    ///   (see the module docs). In the CPU-bound model of `admission`'s tests at 15,000/s
    ///   (100-190 us a row, 0.5-2 ms fixed), the RFC's gains let the largest commit reach
    ///   36-71 ms at the onset and left the last second's mean sojourn at 6.7-10.6 ms; these
    ///   24-68 ms and 7.4-7.8 ms (measured with a 5 ms floor; higher gains, 4/20 and 8/40,
    ///   oscillated there, up to a 438 ms mean at 8/40);
    /// - a floor of 2 ms. The shortest sojourn of an idle server is one commit, under 1 ms
    ///   on this machine (the average REQUEST-ACK delay at 1,000/s is 1.02 ms:
    ///   docs/benchmarks.md), so 2 ms is a queue. Kea's own average REQUEST-ACK delay at
    ///   10,000-15,000/s was 5-9 ms, and talboot's average is 3-4 times its shortest when the
    ///   committer never idles (a REQUEST waits for the commit in progress, its own, its
    ///   chunk's turn): with a 5 ms floor the average on one core at 15,000/s was 17-20 ms
    ///   in three runs, with 2 ms 15-18 ms in two.
    fn default() -> Self {
        Self {
            update: Duration::from_millis(16),
            floor: Duration::from_millis(2),
            alpha: 0.5,
            beta: 5.0,
            burst: Duration::from_millis(150),
            disk_window: Duration::from_secs(5),
            periods: 6,
        }
    }
}

/// The PIE state; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Sojourn {
    params: Params,
    /// The drop probability.
    p: f64,
    /// The delay measured at the previous update.
    old: Duration,
    /// Time left during which nothing is shed.
    burst_left: Duration,
    /// When the next update is due (`None` before the first decision).
    next_update: Option<Instant>,
    /// Probability accumulated since the last shed DISCOVER.
    credit: f64,
    /// The shortest sojourn of an ACK sent since the last update.
    period_min: Option<Duration>,
    /// The delays of the last [`Params::periods`] updates, newest last.
    recent: VecDeque<Duration>,
    /// The fastest durable commit in the current window and in the one before, and when the
    /// current window began.
    fastest: Option<Duration>,
    fastest_before: Option<Duration>,
    window_start: Option<Instant>,
}

/// More missed updates than this (an idle spell) are not replayed one by one: nothing was
/// congested, so the state is reset as after a calm spell.
const MAX_CATCH_UP: u32 = 64;

impl Sojourn {
    /// Nothing measured: `p` is 0 and the burst allowance is full.
    pub(crate) fn new(params: Params) -> Self {
        Self {
            params,
            p: 0.0,
            old: Duration::ZERO,
            burst_left: params.burst,
            next_update: None,
            credit: 0.0,
            period_min: None,
            recent: VecDeque::with_capacity(params.periods),
            fastest: None,
            fastest_before: None,
            window_start: None,
        }
    }

    /// An ACK left `sojourn` after its REQUEST was received.
    pub(crate) fn sent(&mut self, sojourn: Duration) {
        self.period_min = Some(self.period_min.map_or(sojourn, |m| m.min(sojourn)));
    }

    /// A durable commit finished at `now` after `took`.
    pub(crate) fn committed(&mut self, took: Duration, now: Instant) {
        let start = *self.window_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= self.params.disk_window {
            self.fastest_before = self.fastest.take();
            self.window_start = Some(now);
        }
        self.fastest = Some(self.fastest.map_or(took, |f| f.min(took)));
    }

    /// The delay `p` steers to: see the module docs.
    pub(crate) fn target(&self) -> Duration {
        let fastest = match (self.fastest, self.fastest_before) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or_default(),
        };
        self.params.floor.max(fastest.saturating_mul(2))
    }

    /// The drop probability now (for the metrics and tests).
    pub(crate) fn probability(&self) -> f64 {
        self.p
    }

    /// Run the updates due by `now`; `waiting` is how long the oldest ACK not sent yet has
    /// waited, the delay to assume for a period in which no ACK left.
    pub(crate) fn tick(&mut self, now: Instant, waiting: Option<Duration>) {
        let due = *self.next_update.get_or_insert(now + self.params.update);
        if now < due {
            return;
        }
        let mut next = due;
        let mut n = 0;
        while now >= next {
            if n == MAX_CATCH_UP {
                self.calm();
                next = now + self.params.update;
                break;
            }
            let this = self
                .period_min
                .take()
                .unwrap_or_else(|| waiting.unwrap_or_default());
            if self.recent.len() == self.params.periods.max(1) {
                self.recent.pop_front();
            }
            self.recent.push_back(this);
            let delay = self.recent.iter().min().copied().unwrap_or_default();
            self.update(delay);
            next += self.params.update;
            n += 1;
        }
        self.next_update = Some(next);
    }

    /// RFC 8033 §4.2 and §4.4, once, with the delay measured over the last period.
    fn update(&mut self, delay: Duration) {
        let target = self.target();
        let (q, old, t) = (
            delay.as_secs_f64(),
            self.old.as_secs_f64(),
            target.as_secs_f64(),
        );
        let mut step = self.params.alpha * (q - t) + self.params.beta * (q - old);
        if self.p >= 0.1 && step > 0.02 {
            step = 0.02;
        }
        self.p += step;
        if delay.is_zero() && self.old.is_zero() {
            self.p *= 0.98;
        } else if delay < target / 2 && self.old < target / 2 {
            self.p *= 0.9;
        }
        self.p = self.p.clamp(0.0, 1.0);
        self.burst_left = self.burst_left.saturating_sub(self.params.update);
        if self.p == 0.0 && delay < target / 2 && self.old < target / 2 {
            self.burst_left = self.params.burst;
        }
        if self.p == 0.0 {
            self.credit = 0.0;
        }
        self.old = delay;
    }

    /// Nothing happened for a long spell: as if the server had just started, keeping what it
    /// learnt of the disk.
    fn calm(&mut self) {
        self.p = 0.0;
        self.old = Duration::ZERO;
        self.credit = 0.0;
        self.burst_left = self.params.burst;
        self.period_min = None;
        self.recent.clear();
    }

    /// Whether the DISCOVER arriving now is shed (call [`Self::tick`] first). RFC 8033 §4.4's
    /// burst allowance, then its safeguard with the whole target instead of half: nothing
    /// while the last measured delay is within the target and `p` is under 20 %, nor
    /// whatever `p` once it is under half the target. Then the accumulated probability.
    pub(crate) fn shed(&mut self) -> bool {
        let target = self.target();
        if !self.burst_left.is_zero()
            || self.old < target / 2
            || (self.old <= target && self.p < 0.2)
        {
            return false;
        }
        self.credit += self.p;
        if self.credit >= 1.0 {
            self.credit -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feed `periods` update periods in which every ACK took `delay`, `acks` ACKs a period, and
    /// `discovers` DISCOVERs arrive; how many of those were shed.
    fn run(s: &mut Sojourn, t: &mut Instant, periods: u32, delay: Duration, discovers: u32) -> u32 {
        let mut shed = 0;
        for _ in 0..periods {
            for _ in 0..8 {
                s.sent(delay);
            }
            let step = s.params.update / discovers.max(1);
            for _ in 0..discovers {
                *t += step;
                s.tick(*t, None);
                shed += u32::from(s.shed());
            }
        }
        shed
    }

    #[test]
    fn delays_under_the_target_never_shed() {
        let mut s = Sojourn::new(Params::default());
        let mut t = Instant::now();
        assert_eq!(
            run(&mut s, &mut t, 500, Duration::from_micros(1_900), 16),
            0
        );
        assert_eq!(s.probability(), 0.0);
    }

    #[test]
    fn a_standing_delay_sheds_and_a_drained_one_stops() {
        let mut s = Sojourn::new(Params::default());
        let mut t = Instant::now();
        // 100 ms standing delay for a second: p climbs and DISCOVERs are shed.
        let shed = run(&mut s, &mut t, 62, ms(100), 16);
        assert!(shed > 100, "shed {shed}");
        assert!(s.probability() > 0.5, "p {}", s.probability());
        // The delay falls under half the target: shedding stops at once, and p decays
        // within a second.
        assert_eq!(run(&mut s, &mut t, 62, Duration::from_micros(500), 16), 0);
        assert!(s.probability() < 0.01, "p {}", s.probability());
    }

    #[test]
    fn one_stall_passes_without_shedding() {
        let mut s = Sojourn::new(Params::default());
        let mut t = Instant::now();
        run(&mut s, &mut t, 30, ms(1), 16);
        // One fsync of 120 ms: the ACKs behind it wait up to that, for a few periods.
        let mut shed = run(&mut s, &mut t, 4, ms(120), 16);
        shed += run(&mut s, &mut t, 60, ms(1), 16);
        assert_eq!(shed, 0);
    }

    #[test]
    fn the_target_follows_the_fastest_recent_commit() {
        let p = Params::default();
        let mut s = Sojourn::new(p);
        let t0 = Instant::now();
        assert_eq!(s.target(), p.floor);
        s.committed(ms(8), t0);
        s.committed(ms(5), t0 + ms(100));
        s.committed(ms(30), t0 + ms(200));
        assert_eq!(s.target(), ms(10));
        // Two windows later the 5 ms commit is forgotten.
        s.committed(ms(12), t0 + p.disk_window);
        assert_eq!(s.target(), ms(10));
        s.committed(ms(12), t0 + p.disk_window * 2);
        assert_eq!(s.target(), ms(24));
        // A faster disk is learnt at once (and a fast disk's target is the floor).
        s.committed(ms(1), t0 + p.disk_window * 3);
        assert_eq!(s.target(), p.floor);
    }

    #[test]
    fn an_idle_spell_resets_the_probability() {
        let mut s = Sojourn::new(Params::default());
        let mut t = Instant::now();
        run(&mut s, &mut t, 62, ms(200), 16);
        assert!(s.probability() > 0.5);
        t += Duration::from_secs(10);
        s.tick(t, None);
        assert_eq!(s.probability(), 0.0);
        assert!(!s.shed());
    }

    #[test]
    fn with_no_ack_sent_the_oldest_waiting_one_is_the_delay() {
        let mut s = Sojourn::new(Params::default());
        let t0 = Instant::now();
        s.tick(t0, None);
        let mut t = t0;
        for _ in 0..40 {
            t += ms(16);
            s.tick(t, Some(ms(300)));
        }
        assert!(s.probability() > 0.5, "p {}", s.probability());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Whatever the delays, p stays a probability, and the share shed never exceeds it by
        /// more than one DISCOVER (the accumulator sheds one per unit of p).
        #[test]
        fn the_probability_is_bounded_and_sheds_follow_it(
            delays in proptest::collection::vec(0u64..2_000, 1..200),
            per in 1u32..40,
        ) {
            let mut s = Sojourn::new(Params::default());
            let mut t = Instant::now();
            let (mut offered, mut shed, mut p_sum) = (0u32, 0u32, 0.0f64);
            for d in delays {
                for _ in 0..3 {
                    s.sent(Duration::from_millis(d));
                }
                for _ in 0..per {
                    t += s.params.update / per;
                    s.tick(t, None);
                    prop_assert!((0.0..=1.0).contains(&s.probability()));
                    let p = s.probability();
                    let was = s.shed();
                    offered += 1;
                    shed += u32::from(was);
                    p_sum += p;
                }
            }
            prop_assert!(shed <= offered);
            prop_assert!(f64::from(shed) <= p_sum + 1.0, "shed {shed}, p summed {p_sum}");
        }
    }
}
