//! Retries for idempotent Talos calls: exponential backoff with jitter.
//!
//! The delay computation ([`RetryPolicy::delay`]) is pure and takes the random fraction as an
//! argument; [`retry_idempotent`] is the thin async adapter that sleeps and draws the
//! randomness. Only calls whose repetition cannot change the outcome (reads, and kubeconfig,
//! which mints a fresh certificate each time) may be wrapped: apply, bootstrap, reset and
//! reboot are never retried here, because a lost reply does not mean the call had no effect.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use super::error::TalosError;

/// How often and how patiently an idempotent call is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, including the first (1 = no retry).
    pub attempts: u32,
    /// Delay before the first retry, before jitter.
    pub base: Duration,
    /// Upper bound of any single delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// Five attempts, 500 ms doubling up to 8 s: rides out an apid restart without hiding a
    /// node that is really down for more than about 15 s.
    fn default() -> Self {
        Self {
            attempts: 5,
            base: Duration::from_millis(500),
            max: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// No retries: the call is made once.
    pub const NONE: Self = Self {
        attempts: 1,
        base: Duration::ZERO,
        max: Duration::ZERO,
    };

    /// The delay before retry number `retry` (0 = the first retry), given a random
    /// `fraction` in [0, 1). "Equal jitter": half the exponential step is fixed, the other
    /// half random, so clients that failed together do not retry together yet still back off.
    pub(crate) fn delay(&self, retry: u32, fraction: f64) -> Duration {
        let factor = 2u32.saturating_pow(retry.min(31));
        let step = self.base.saturating_mul(factor).min(self.max);
        let half = step / 2;
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        half + half.mul_f64(fraction)
    }
}

/// A random fraction in [0, 1) from the standard library's per-process random hasher keys;
/// jitter needs spread, not cryptographic quality, so no extra crate.
fn random_fraction() -> f64 {
    let bits = RandomState::new().hash_one(std::time::Instant::now());
    // 53 random bits map exactly onto the f64 mantissa.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Runs `op` until it succeeds, fails with a non-transient error, or the policy's attempts
/// are used up; sleeps with backoff and jitter between attempts. `what` names the call in logs.
pub(crate) async fn retry_idempotent<T, F, Fut>(
    policy: RetryPolicy,
    what: &str,
    mut op: F,
) -> Result<T, TalosError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, TalosError>>,
{
    let attempts = policy.attempts.max(1);
    let mut retry = 0;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(err) if err.is_transient() && retry + 1 < attempts => {
                let delay = policy.delay(retry, random_fraction());
                tracing::debug!(call = what, attempt = retry + 1, ?delay, error = %err, "retrying");
                tokio::time::sleep(delay).await;
                retry += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::talos::error::{Rpc, Target};
    use std::cell::Cell;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            base: Duration::from_millis(100),
            max: Duration::from_millis(500),
        }
    }

    #[test]
    fn delay_doubles_and_is_capped() {
        let p = policy();
        assert_eq!(p.delay(0, 1.0), Duration::from_millis(100));
        assert_eq!(p.delay(1, 1.0), Duration::from_millis(200));
        assert_eq!(p.delay(2, 1.0), Duration::from_millis(400));
        assert_eq!(p.delay(3, 1.0), Duration::from_millis(500));
        assert_eq!(p.delay(40, 1.0), Duration::from_millis(500));
    }

    #[test]
    fn jitter_spans_the_upper_half_of_the_step() {
        let p = policy();
        assert_eq!(p.delay(1, 0.0), Duration::from_millis(100));
        assert_eq!(p.delay(1, 0.5), Duration::from_millis(150));
        assert_eq!(p.delay(1, f64::NAN), Duration::from_millis(100));
        assert_eq!(p.delay(1, 7.0), Duration::from_millis(200));
    }

    #[test]
    fn random_fraction_is_in_range() {
        for _ in 0..1000 {
            let f = random_fraction();
            assert!((0.0..1.0).contains(&f), "{f}");
        }
    }

    fn target() -> Target {
        Target {
            endpoint: "127.0.0.1:50000".parse().unwrap(),
            node: None,
        }
    }

    fn quick() -> RetryPolicy {
        RetryPolicy {
            attempts: 3,
            base: Duration::ZERO,
            max: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_attempts_run_out() {
        let calls = Cell::new(0);
        let res: Result<(), _> = retry_idempotent(quick(), "Version", || {
            calls.set(calls.get() + 1);
            async {
                Err(TalosError::Unreachable {
                    target: target(),
                    detail: "refused".into(),
                })
            }
        })
        .await;
        assert!(matches!(res, Err(TalosError::Unreachable { .. })));
        assert_eq!(calls.get(), 3);
    }

    #[tokio::test]
    async fn success_after_a_transient_error_stops_retrying() {
        let calls = Cell::new(0);
        let res = retry_idempotent(quick(), "Version", || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n == 1 {
                    Err(TalosError::Timeout {
                        target: target(),
                        rpc: Rpc::Version,
                        after: Duration::from_secs(1),
                    })
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(res.unwrap(), 2);
        assert_eq!(calls.get(), 2);
    }

    #[tokio::test]
    async fn permanent_errors_are_not_retried() {
        let calls = Cell::new(0);
        let res: Result<(), _> = retry_idempotent(quick(), "Version", || {
            calls.set(calls.get() + 1);
            async {
                Err(TalosError::PermissionDenied {
                    target: target(),
                    rpc: Rpc::Version,
                    message: "not authorized".into(),
                })
            }
        })
        .await;
        assert!(matches!(res, Err(TalosError::PermissionDenied { .. })));
        assert_eq!(calls.get(), 1);
    }
}
