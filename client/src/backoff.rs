//! Capped exponential backoff with full jitter: the wait before retry `n` is drawn uniformly from
//! `[0, min(cap, base * 2^n)]`.
//!
//! Full jitter spreads the retries of many clients that failed together over the whole window,
//! so a node coming back is not hit by all of them at once. A period that must last (how long a
//! failed endpoint is skipped) is drawn from the upper half of the window instead, so it is never
//! close to zero. The randomness is passed in by the caller; this module never reads a clock or a
//! global random source.

use std::time::Duration;

use rand::Rng;

/// A capped exponential backoff. Used between attempts of a call and by the worker to delay a
/// message whose handler asked for a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first wait (retry 0).
    pub base: Duration,
    /// No wait is ever longer than this.
    pub cap: Duration,
}

impl Backoff {
    /// A backoff whose ceiling starts at `base` and doubles up to `cap`.
    ///
    /// # Panics
    /// If `base` is zero or larger than `cap`: such a backoff would never wait or never grow.
    pub fn new(base: Duration, cap: Duration) -> Self {
        assert!(!base.is_zero(), "a backoff base of zero never waits");
        assert!(base <= cap, "a backoff base above its cap");
        Self { base, cap }
    }

    /// The ceiling of the wait before retry `retry` (0 for the first retry): `min(cap, base *
    /// 2^retry)`, computed without overflow for any `retry`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        // 2^31 times any base above a nanosecond is already beyond every sensible cap, and
        // checked arithmetic keeps larger exponents from wrapping.
        let factor = 1u32
            .checked_shl(retry.min(31))
            .expect("a shift below 32 fits a u32");
        self.base
            .checked_mul(factor)
            .map_or(self.cap, |ceiling| ceiling.min(self.cap))
    }

    /// The wait before retry `retry`, drawn uniformly from `[0, ceiling(retry)]`.
    pub fn delay(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let ceiling_ns = u64::try_from(self.ceiling(retry).as_nanos())
            .expect("a backoff cap fits 584 years of nanoseconds");
        Duration::from_nanos(rng.random_range(0..=ceiling_ns))
    }

    /// A period after failure `retry` (0 for the first) that lasts at least half its ceiling:
    /// drawn uniformly from `[ceiling(retry) / 2, ceiling(retry)]`. Still jittered, so clients
    /// that saw one endpoint fail together do not all come back to it at the same moment.
    pub fn hold(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let ceiling_ns = u64::try_from(self.ceiling(retry).as_nanos())
            .expect("a backoff cap fits 584 years of nanoseconds");
        Duration::from_nanos(rng.random_range(ceiling_ns / 2..=ceiling_ns))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn backoff() -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
    }

    #[test]
    fn ceiling_doubles_from_base_until_cap() {
        let b = backoff();
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(200));
        assert_eq!(b.ceiling(2), Duration::from_millis(400));
        assert_eq!(b.ceiling(5), Duration::from_millis(3_200));
        assert_eq!(b.ceiling(6), Duration::from_secs(5));
        assert_eq!(b.ceiling(7), Duration::from_secs(5));
    }

    #[test]
    fn ceiling_does_not_overflow_for_huge_retry_counts() {
        let b = backoff();
        assert_eq!(b.ceiling(31), Duration::from_secs(5));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(5));
        let wide = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        assert_eq!(wide.ceiling(40), Duration::MAX);
    }

    #[test]
    fn delay_stays_within_its_ceiling() {
        let b = backoff();
        let mut rng = StdRng::seed_from_u64(7);
        for retry in 0..12 {
            for _ in 0..200 {
                assert!(b.delay(retry, &mut rng) <= b.ceiling(retry));
            }
        }
    }

    #[test]
    fn delay_is_jittered_over_the_whole_window() {
        // Full jitter: both halves of the window are used, not just values near the ceiling.
        let b = backoff();
        let mut rng = StdRng::seed_from_u64(11);
        let ceiling = b.ceiling(6);
        let draws: Vec<Duration> = (0..400).map(|_| b.delay(6, &mut rng)).collect();
        assert!(draws.iter().any(|d| *d < ceiling / 4));
        assert!(draws.iter().any(|d| *d > ceiling * 3 / 4));
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 300);
    }

    #[test]
    fn hold_lasts_at_least_half_its_ceiling_and_is_jittered() {
        let b = backoff();
        let mut rng = StdRng::seed_from_u64(13);
        for retry in 0..12 {
            let ceiling = b.ceiling(retry);
            let draws: Vec<Duration> = (0..200).map(|_| b.hold(retry, &mut rng)).collect();
            assert!(draws.iter().all(|d| *d >= ceiling / 2 && *d <= ceiling));
            let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
            assert!(
                distinct.len() > 150,
                "retry {retry}: {} distinct",
                distinct.len()
            );
        }
    }

    #[test]
    #[should_panic(expected = "above its cap")]
    fn base_above_cap_is_refused() {
        Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
    }
}
