//! Per-MAC flood limiting: a token bucket per client hardware address.
//!
//! A looping PXE ROM or a misbehaving client can send hundreds of DISCOVERs a second; each one
//! costs a lease-book lookup and possibly a store write. Each MAC gets `burst` requests at
//! once and `per_second` afterwards. The table is bounded: when it is full, buckets that have
//! refilled completely (idle clients) are forgotten first, then the least recently seen.
//! Time is passed in, so the limiter is deterministic under test.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::inventory::Mac;

/// Limiter settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloodConfig {
    /// Requests a MAC may send at once.
    pub(crate) burst: u32,
    /// Sustained requests per second per MAC.
    pub(crate) per_second: f64,
    /// Most MACs tracked at once.
    pub(crate) max_clients: usize,
}

impl Default for FloodConfig {
    /// A PXE boot needs about four packets (DISCOVER, REQUEST, then iPXE's pair); 10 at once
    /// and 2 a second leaves room for retries and NIC iteration.
    fn default() -> Self {
        Self {
            burst: 10,
            per_second: 2.0,
            max_clients: 16_384,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Token buckets by MAC.
#[derive(Debug, Clone)]
pub struct FloodLimiter {
    cfg: FloodConfig,
    buckets: HashMap<Mac, Bucket>,
}

impl FloodLimiter {
    /// A limiter with no history.
    pub fn new(cfg: FloodConfig) -> Self {
        Self {
            cfg,
            buckets: HashMap::new(),
        }
    }

    fn refill(&self, b: &Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        (b.tokens + elapsed * self.cfg.per_second).min(f64::from(self.cfg.burst))
    }

    /// True if a request from `mac` at `now` may be processed (and counts it).
    pub fn allow(&mut self, mac: Mac, now: Instant) -> bool {
        if !self.buckets.contains_key(&mac) && self.buckets.len() >= self.cfg.max_clients {
            self.evict(now);
        }
        let full = f64::from(self.cfg.burst);
        let tokens = match self.buckets.get(&mac) {
            Some(b) => self.refill(b, now),
            None => full,
        };
        let allowed = tokens >= 1.0;
        self.buckets.insert(
            mac,
            Bucket {
                tokens: if allowed { tokens - 1.0 } else { tokens },
                last: now,
            },
        );
        allowed
    }

    /// Number of MACs currently tracked.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }

    fn evict(&mut self, now: Instant) {
        let full = f64::from(self.cfg.burst);
        let idle: Vec<Mac> = self
            .buckets
            .iter()
            .filter(|(_, b)| self.refill(b, now) >= full)
            .map(|(m, _)| *m)
            .collect();
        if idle.is_empty() {
            if let Some(oldest) = self
                .buckets
                .iter()
                .min_by_key(|(_, b)| b.last)
                .map(|(m, _)| *m)
            {
                self.buckets.remove(&oldest);
            }
        } else {
            for m in idle {
                self.buckets.remove(&m);
            }
        }
    }

    /// Time until `mac` would be allowed again at `now` (zero if it is allowed now).
    pub fn retry_after(&self, mac: Mac, now: Instant) -> Duration {
        match self.buckets.get(&mac) {
            Some(b) => {
                let t = self.refill(b, now);
                if t >= 1.0 || self.cfg.per_second <= 0.0 {
                    Duration::ZERO
                } else {
                    Duration::from_secs_f64((1.0 - t) / self.cfg.per_second)
                }
            }
            None => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> Mac {
        Mac([2, 0, 0, 0, 0, n])
    }

    #[test]
    fn burst_then_refill() {
        let mut f = FloodLimiter::new(FloodConfig {
            burst: 3,
            per_second: 1.0,
            max_clients: 10,
        });
        let t0 = Instant::now();
        assert!((0..3).all(|_| f.allow(mac(1), t0)));
        assert!(!f.allow(mac(1), t0));
        // Another MAC is unaffected.
        assert!(f.allow(mac(2), t0));
        assert_eq!(f.retry_after(mac(1), t0), Duration::from_secs(1));
        assert!(!f.allow(mac(1), t0 + Duration::from_millis(500)));
        assert!(f.allow(mac(1), t0 + Duration::from_millis(1000)));
        assert!(!f.allow(mac(1), t0 + Duration::from_millis(1000)));
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(3600);
        assert!((0..3).all(|_| f.allow(mac(1), later)));
        assert!(!f.allow(mac(1), later));
    }

    #[test]
    fn table_is_bounded_and_evicts_idle_clients_first() {
        let mut f = FloodLimiter::new(FloodConfig {
            burst: 2,
            per_second: 1.0,
            max_clients: 3,
        });
        let t0 = Instant::now();
        f.allow(mac(1), t0);
        f.allow(mac(2), t0);
        f.allow(mac(3), t0 + Duration::from_secs(5));
        f.allow(mac(3), t0 + Duration::from_secs(5));
        // At t0+5, MACs 1 and 2 have refilled (idle); MAC 3 has not.
        assert!(f.allow(mac(4), t0 + Duration::from_secs(5)));
        assert_eq!(f.tracked(), 2);
        assert!(!f.allow(mac(3), t0 + Duration::from_secs(5)));
        // With nobody idle, the least recently seen goes.
        let mut g = FloodLimiter::new(FloodConfig {
            burst: 1,
            per_second: 0.001,
            max_clients: 2,
        });
        g.allow(mac(1), t0);
        g.allow(mac(2), t0 + Duration::from_secs(1));
        g.allow(mac(3), t0 + Duration::from_secs(2));
        assert_eq!(g.tracked(), 2);
        assert!(!g.allow(mac(2), t0 + Duration::from_secs(2)));
        assert!(
            g.allow(mac(1), t0 + Duration::from_secs(2)),
            "mac 1 was evicted and starts full"
        );
    }
}
