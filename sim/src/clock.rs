//! The node's clock in simulation: turmoil's simulated time since the Unix epoch. The harness
//! fixes the epoch (`Builder::epoch`), so a seed replays the same timestamps.
//!
//! This module must never read the real clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use trireme_core::Millis;
use trireme_node::clock::Clock;

/// Simulated wall-clock time of the host it is read on.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimClock;

impl Clock for SimClock {
    fn now(&self) -> Millis {
        let since_epoch =
            turmoil::since_epoch().expect("the node reads its clock inside the simulation");
        Millis(millis(since_epoch))
    }
}

/// One member's wall clock: the simulated time plus an offset the harness may step, as an
/// operator or NTP steps a real one (spec/replication.md, *Time*).
#[derive(Clone, Debug, Default)]
pub struct MemberClock {
    offset_ms: Arc<AtomicI64>,
}

impl MemberClock {
    /// A clock `offset_ms` off the simulated time.
    #[must_use]
    pub fn new(offset_ms: i64) -> MemberClock {
        MemberClock {
            offset_ms: Arc::new(AtomicI64::new(offset_ms)),
        }
    }

    /// Steps the clock to `offset_ms` off the simulated time (every clone sees it).
    pub fn step(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::SeqCst);
    }
}

impl Clock for MemberClock {
    fn now(&self) -> Millis {
        let Millis(now) = SimClock.now();
        Millis(now.saturating_add_signed(self.offset_ms.load(Ordering::SeqCst)))
    }
}

/// Milliseconds of a simulated duration.
#[must_use]
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).expect("u64 ms lasts 584 million years")
}

/// Simulated milliseconds since the simulation started, read on the current host.
#[must_use]
pub fn sim_now_ms() -> u64 {
    millis(turmoil::sim_elapsed().expect("read inside the simulation"))
}
