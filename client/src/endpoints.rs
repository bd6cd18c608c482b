//! Which endpoint an attempt goes to: a client's health table over its endpoints.
//!
//! Each client has a home endpoint, chosen per client so that the clients of a cluster spread
//! over its nodes, and its calls go there while it answers. An attempt that fails on the way to
//! a node (the connection did not open, the node is unavailable, it did not answer in time)
//! marks that endpoint down for a period that grows with each failure in a row; a call then
//! goes to the next endpoint that is up, in order from home. Once the period ends the endpoint
//! counts as up again, so the next call probes it, and a success makes it fully healthy: a
//! client returns to its home when its node comes back. When every endpoint a call has not yet
//! tried is down, the first of them in order from home is tried anyway: the client never
//! refuses a call from its own bookkeeping alone, only after asking.
//!
//! This module decides and records; it never connects, sleeps or reads a clock. Time and
//! randomness are its arguments.

use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::limits;

/// The health of one client's endpoints, shared by all its calls (and its clones).
#[derive(Debug)]
pub(crate) struct Endpoints {
    /// Where calls start: the endpoint this client prefers while it answers.
    home: usize,
    /// How long a failed endpoint is skipped, by failures in a row.
    down: Backoff,
    /// One entry per endpoint, in the order given. Locked only to read or write a few fields,
    /// never across an await.
    health: Mutex<Vec<Health>>,
}

/// What the client knows about one endpoint.
#[derive(Clone, Copy, Debug, Default)]
struct Health {
    /// Failures in a row since the last success: the step of the next down period.
    failures: u32,
    /// Until when the endpoint is skipped; `None` once it has answered.
    down_until: Option<Instant>,
}

impl Health {
    fn is_up(&self, now: Instant) -> bool {
        self.down_until.is_none_or(|until| until <= now)
    }
}

/// The endpoints one call has tried since it last backed off: one bit per endpoint index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tried(u64);

impl Tried {
    fn contains(self, index: usize) -> bool {
        self.0 & (1 << index) != 0
    }

    /// Records an attempt on `index`.
    pub(crate) fn insert(&mut self, index: usize) {
        assert!(
            index < limits::ENDPOINTS_MAX,
            "an endpoint index within the cap"
        );
        self.0 |= 1 << index;
    }

    /// Whether every one of `count` endpoints has been tried.
    pub(crate) fn covers(self, count: usize) -> bool {
        (0..count).all(|index| self.contains(index))
    }
}

impl Endpoints {
    /// A table of `count` endpoints, all up, whose calls start at `home`.
    ///
    /// # Panics
    /// If `count` is 0 or above `limits::ENDPOINTS_MAX`, or `home` is not one of them: the
    /// client's constructor refuses such a configuration before it gets here.
    pub(crate) fn new(count: usize, home: usize, down: Backoff) -> Self {
        assert!(count >= 1, "a client has an endpoint");
        assert!(count <= limits::ENDPOINTS_MAX, "endpoints within the cap");
        assert!(home < count, "the home is one of the endpoints");
        Self {
            home,
            down,
            health: Mutex::new(vec![Health::default(); count]),
        }
    }

    /// The index of the home endpoint.
    pub(crate) fn home(&self) -> usize {
        self.home
    }

    /// The endpoint for the next attempt of a call that has tried `tried` since it last backed
    /// off: the first one in order from home that it has not tried and that is up at `now`, or,
    /// when all of those are down, the first it has not tried.
    ///
    /// # Panics
    /// If `tried` already covers every endpoint: the caller starts a new round first.
    pub(crate) fn pick(&self, now: Instant, tried: Tried) -> usize {
        let health = self.lock();
        let count = health.len();
        assert!(
            !tried.covers(count),
            "a round that tried every endpoint is over"
        );
        let mut untried = (0..count)
            .map(|step| (self.home + step) % count)
            .filter(|index| !tried.contains(*index));
        let first = untried
            .clone()
            .next()
            .expect("an untried endpoint, since the round is not over");
        untried
            .find(|index| health[*index].is_up(now))
            .unwrap_or(first)
    }

    /// Records that `index` answered: it is up, and its next failure starts from the shortest
    /// down period again.
    pub(crate) fn succeeded(&self, index: usize) {
        self.lock()[index] = Health::default();
    }

    /// Records that an attempt on `index` failed on the way to a node at `now`. Returns the
    /// period it is now skipped for, or `None` when it was already down: the calls that were
    /// under way when one outage began fail together, and the period grows once per probe,
    /// not once per call.
    pub(crate) fn failed(
        &self,
        index: usize,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Option<Duration> {
        let mut health = self.lock();
        let entry = &mut health[index];
        if !entry.is_up(now) {
            return None;
        }
        let period = self.down.hold(entry.failures, rng);
        entry.failures = entry.failures.saturating_add(1);
        entry.down_until = Some(now + period);
        Some(period)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Health>> {
        self.health
            .lock()
            .expect("the endpoint table's lock is never held across a panic")
    }
}

/// A home for a new client of `count` endpoints: a random start per process, then the next
/// endpoint for each further client. The clients of one process spread evenly, those of many
/// processes at random.
pub(crate) fn next_home(count: usize) -> usize {
    static START: OnceLock<usize> = OnceLock::new();
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    assert!(count >= 1, "a client has an endpoint");
    let start = *START.get_or_init(|| rand::rng().random_range(0..limits::ENDPOINTS_MAX));
    start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % count
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn table(count: usize, home: usize) -> Endpoints {
        Endpoints::new(
            count,
            home,
            Backoff::new(Duration::from_secs(1), Duration::from_secs(8)),
        )
    }

    fn tried(indexes: &[usize]) -> Tried {
        let mut tried = Tried::default();
        for index in indexes {
            tried.insert(*index);
        }
        tried
    }

    #[test]
    fn calls_start_at_home_and_go_round_in_order() {
        let endpoints = table(3, 1);
        let now = Instant::now();
        assert_eq!(endpoints.pick(now, Tried::default()), 1);
        assert_eq!(endpoints.pick(now, tried(&[1])), 2);
        assert_eq!(endpoints.pick(now, tried(&[1, 2])), 0);
    }

    #[test]
    fn a_failed_endpoint_is_skipped_until_its_period_ends_then_probed() {
        let endpoints = table(3, 0);
        let mut rng = StdRng::seed_from_u64(1);
        let now = Instant::now();
        let period = endpoints.failed(0, now, &mut rng).unwrap();
        assert!(period >= Duration::from_millis(500) && period <= Duration::from_secs(1));
        assert_eq!(endpoints.pick(now, Tried::default()), 1);
        assert_eq!(endpoints.pick(now + period / 2, Tried::default()), 1);
        // Its period over, home is tried first again: the probe.
        assert_eq!(endpoints.pick(now + period, Tried::default()), 0);
    }

    #[test]
    fn the_period_grows_with_failed_probes_and_resets_on_success() {
        let endpoints = table(2, 0);
        let mut rng = StdRng::seed_from_u64(2);
        let mut now = Instant::now();
        let mut ceilings = Vec::new();
        for _ in 0..5 {
            let period = endpoints.failed(0, now, &mut rng).unwrap();
            ceilings.push(period);
            now += period;
        }
        // Ceilings 1, 2, 4, 8, 8 s; each period is in the upper half of its ceiling.
        let secs = [1, 2, 4, 8, 8];
        for (period, ceiling) in ceilings.iter().zip(secs) {
            let ceiling = Duration::from_secs(ceiling);
            assert!(
                *period >= ceiling / 2 && *period <= ceiling,
                "{period:?} of {ceiling:?}"
            );
        }
        endpoints.succeeded(0);
        let period = endpoints.failed(0, now, &mut rng).unwrap();
        assert!(period <= Duration::from_secs(1), "{period:?}");
    }

    #[test]
    fn failures_of_one_outage_do_not_stack_up() {
        let endpoints = table(2, 0);
        let mut rng = StdRng::seed_from_u64(3);
        let now = Instant::now();
        let period = endpoints.failed(0, now, &mut rng).unwrap();
        for _ in 0..100 {
            assert_eq!(endpoints.failed(0, now + period / 2, &mut rng), None);
        }
        // The next probe's failure is the second in a row, not the hundred-and-first.
        let next = endpoints.failed(0, now + period, &mut rng).unwrap();
        assert!(next <= Duration::from_secs(2), "{next:?}");
    }

    #[test]
    fn when_every_untried_endpoint_is_down_the_first_in_order_is_tried() {
        let endpoints = table(3, 2);
        let mut rng = StdRng::seed_from_u64(4);
        let now = Instant::now();
        for index in 0..3 {
            endpoints.failed(index, now, &mut rng).unwrap();
        }
        assert_eq!(endpoints.pick(now, Tried::default()), 2);
        assert_eq!(endpoints.pick(now, tried(&[2])), 0);
        assert_eq!(endpoints.pick(now, tried(&[2, 0])), 1);
        // An endpoint that is up wins over those before it in order.
        endpoints.succeeded(1);
        assert_eq!(endpoints.pick(now, Tried::default()), 1);
    }

    #[test]
    #[should_panic(expected = "tried every endpoint")]
    fn a_finished_round_cannot_pick() {
        table(2, 0).pick(Instant::now(), tried(&[0, 1]));
    }

    #[test]
    fn homes_of_one_process_go_round_the_endpoints() {
        assert_eq!(next_home(1), 0);
        // Other tests of this binary may take homes in between, so only coverage is certain.
        let covered: std::collections::BTreeSet<usize> = (0..30).map(|_| next_home(3)).collect();
        assert_eq!(covered.len(), 3);
    }

    #[test]
    fn tried_covers_exactly_what_was_inserted() {
        let mut round = Tried::default();
        assert!(!round.covers(2));
        round.insert(1);
        assert!(!round.covers(2));
        round.insert(0);
        assert!(round.covers(2));
        round.insert(limits::ENDPOINTS_MAX - 1);
        assert!(round.contains(limits::ENDPOINTS_MAX - 1));
    }
}
