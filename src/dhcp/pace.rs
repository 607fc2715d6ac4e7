//! Pacing of the replies one group commit releases: when each of them leaves, relative to the
//! moment its commit made it durable (pure; the server's sender sleeps and sends).
//!
//! Why: a group commit makes a whole burst of ACKs durable at once (at 15,000 DISCOVERs a
//! second, one ~17 ms commit carries ~250 ACKs), and sending them back to back overflowed
//! the client's socket receive buffer: 15,916 `UdpRcvbufErrors` in perfdhcp's namespace in
//! one 5 s run while talboot sent every ACK (docs/benchmarks.md). Linux charges a datagram's
//! `truesize` to the receive buffer, 1,280 bytes for a 300-byte DHCP reply (measured on
//! loopback: 10 such datagrams queue 12,800 bytes in `/proc/net/udp` `rx_queue`), so the
//! default `net.core.rmem_default` of 212,992 bytes holds about 166 replies, fewer with the
//! OFFERs the handler sends meanwhile. A relay agent, which receives every reply of its rack
//! on one socket, sees the same bursts. Kea never bursts: it sends each reply as it finishes
//! the request (`Dhcpv4Srv::run_one`, isc-projects/kea `src/bin/dhcp4/dhcp4_srv.cc` at
//! Kea-2.2.0).
//!
//! The schedule: a group of at most [`Pace::burst`] replies leaves at once (so at low load,
//! where a commit carries a few ACKs, pacing adds no latency); a larger group leaves in chunks
//! of `burst`, the first at once and the rest spread evenly over the time until the next
//! commit is expected to release its group (the smoothed commit time, at most
//! [`Pace::max_window`]), at least [`Pace::min_gap`] apart. Order is kept, and nothing is
//! scheduled before its release: the sender only sees a group once its commit returned.

use std::time::Duration;

/// The pacing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pace {
    /// Most replies sent back to back.
    pub(crate) burst: usize,
    /// Least time between two chunks (the timer's resolution).
    pub(crate) min_gap: Duration,
    /// Longest time a group is spread over, however slow commits are.
    pub(crate) max_window: Duration,
}

impl Default for Pace {
    /// 16 replies a chunk: 20 KiB of `truesize`, a tenth of the default receive buffer, so a
    /// receiver that is a few milliseconds late (it shares the CPU) still has room for several
    /// chunks and the OFFERs between them. Measured against 48 (and against no pacing) at
    /// 15,000/s, interleaved: fewer REQUESTs lost with 16 in every pair (docs/benchmarks.md).
    /// 1 ms between chunks at least: tokio's timer resolution; the sender can then still send
    /// 16,000 replies a second even when every chunk waits the minimum (more when the window
    /// allows it, since chunks are spread over it), above what the pipeline completes. At most
    /// 20 ms of spreading: about one commit at the highest measured rate, so a slow disk does
    /// not stretch delivery further.
    fn default() -> Self {
        Self {
            burst: 16,
            min_gap: Duration::from_millis(1),
            max_window: Duration::from_millis(20),
        }
    }
}

impl Pace {
    /// When reply `i` (0-based, in order) of a group of `n` released together leaves, after
    /// the release, when the next group is expected `window` after this one.
    pub(crate) fn offset(&self, i: usize, n: usize, window: Duration) -> Duration {
        let burst = self.burst.max(1);
        let chunks = n.div_ceil(burst);
        if chunks <= 1 {
            return Duration::ZERO;
        }
        let gap = (window.min(self.max_window) / chunks as u32).max(self.min_gap);
        gap * (i.min(n - 1) / burst) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Explicit parameters, so the arithmetic below does not follow the tuned default.
    fn p48() -> Pace {
        Pace {
            burst: 48,
            min_gap: ms(1),
            max_window: ms(20),
        }
    }

    #[test]
    fn a_small_group_leaves_at_once() {
        let p = Pace::default();
        for n in [1, 2, p.burst / 2, p.burst] {
            assert!((0..n).all(|i| p.offset(i, n, ms(50)).is_zero()), "{n}");
        }
    }

    #[test]
    fn a_large_group_is_spread_over_the_next_commit() {
        let p = p48();
        // 250 ACKs of one 16 ms commit: 6 chunks of at most 48, 16/6 ms apart.
        let offsets: Vec<Duration> = (0..250).map(|i| p.offset(i, 250, ms(16))).collect();
        assert_eq!(offsets[0], Duration::ZERO);
        assert_eq!(offsets[47], Duration::ZERO);
        assert_eq!(offsets[48], ms(16) / 6);
        assert_eq!(offsets[249], ms(16) / 6 * 5);
        assert!(offsets[249] < ms(16));
    }

    #[test]
    fn a_slow_disk_does_not_stretch_delivery_past_the_window_cap() {
        let p = p48();
        assert_eq!(p.offset(99, 100, ms(500)), p.max_window / 3 * 2);
    }

    #[test]
    fn chunks_are_at_least_the_timer_resolution_apart() {
        let p = p48();
        assert_eq!(p.offset(48, 1000, ms(2)), ms(1));
        assert_eq!(p.offset(999, 1000, ms(2)), ms(20));
    }

    proptest! {
        #[test]
        fn order_is_kept_bursts_are_bounded_and_the_spread_is_bounded(
            n in 1usize..2_000, window_us in 0u64..100_000, burst in 1usize..100,
        ) {
            let p = Pace { burst, ..Pace::default() };
            let window = Duration::from_micros(window_us);
            let offsets: Vec<Duration> = (0..n).map(|i| p.offset(i, n, window)).collect();
            // In order: never a later reply before an earlier one.
            prop_assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
            // At most `burst` replies leave at the same moment, and distinct moments are at
            // least the minimum gap apart.
            let mut at = offsets.clone();
            at.dedup();
            for t in &at {
                prop_assert!(offsets.iter().filter(|o| *o == t).count() <= burst);
            }
            prop_assert!(at.windows(2).all(|w| w[1] - w[0] >= p.min_gap));
            // Nothing before its release; no latency when the group fits one burst; and all
            // sent within the window (capped) unless the minimum gap forces longer.
            prop_assert_eq!(offsets[0], Duration::ZERO);
            if n <= burst {
                prop_assert!(offsets.iter().all(|o| o.is_zero()));
            }
            let chunks = n.div_ceil(burst) as u32;
            let last = offsets[n - 1];
            prop_assert!(last < window.min(p.max_window).max(p.min_gap * chunks) || n <= burst);
        }
    }
}
