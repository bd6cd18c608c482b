//! The node's one source of time. The core never reads a clock (spec/queue-core.md#actions):
//! the engine reads a [`Clock`] and passes the time in. Production uses [`SystemClock`]; the
//! simulation backs a clock by turmoil's simulated time; tests may use [`ManualClock`].
//!
//! This module must never be bypassed: no other module of the node reads `SystemTime`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use trireme_core::Millis;

/// Where the node reads the current time from.
pub trait Clock: Send + Sync + 'static {
    /// The current time in ms since the Unix epoch. May go backwards (a wall clock being
    /// stepped); the core treats a step back as no time passing.
    fn now(&self) -> Millis;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        // A clock before 1970 is a misconfigured machine; time zero keeps the node running and
        // the core's monotonic time keeps deadlines from firing early.
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Millis(u64::try_from(since_epoch.as_millis()).expect("u64 ms lasts 584 million years"))
    }
}

/// A clock that moves only when told to. Cloning shares the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    #[must_use]
    pub fn new(start: Millis) -> Self {
        ManualClock {
            now_ms: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `to`, which may be earlier than the current time.
    pub fn set(&self, to: Millis) {
        self.now_ms.store(to.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        Millis(self.now_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > Millis(1_577_836_800_000));
    }

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let clock = ManualClock::new(Millis(1_000));
        let other = clock.clone();
        assert_eq!(clock.now(), Millis(1_000));
        other.advance_ms(250);
        assert_eq!(clock.now(), Millis(1_250));
        clock.set(Millis(10));
        assert_eq!(other.now(), Millis(10));
    }
}
