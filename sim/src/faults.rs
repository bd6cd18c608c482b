//! The faults of one run, drawn from its seed. Each seed draws its own mix first (how many
//! crashes, partitions, holds and latency spikes; how the disk behaves; how slow the network
//! is), then places each fault in the safety phase. Nothing here touches the simulation: the
//! harness applies the plan.
//!
//! This module must never draw from anything but the seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What the seed chose for the whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct Mix {
    pub clients: u32,
    pub crashes: u32,
    pub partitions: u32,
    pub holds: u32,
    pub latency_spikes: u32,
    /// The network's normal worst latency.
    pub latency_ms_max: u64,
    /// Probability that the simulated OS flushes a file's pending writes after a write (so a
    /// crash keeps a prefix of unsynced writes instead of none).
    pub sync_probability: f64,
    /// Whether a crash may tear unsynced writes at 4 KiB blocks.
    pub torn_writes: bool,
    /// Probability that one sync of the node's disk fails (in the safety phase). The engine
    /// then stops, the node exits, and the harness restarts it.
    pub sync_failure_rate: f64,
    /// Whether turmoil polls hosts in a random order each step.
    pub random_order: bool,
}

/// One step of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Cut the node's power and crash it.
    CrashNode,
    /// Restore power and start the node again from its disk.
    RestartNode,
    /// Drop everything between client `n` and the node.
    Partition(u32),
    /// Undo a partition of client `n`.
    Repair(u32),
    /// Hold everything between client `n` and the node (delivered late on release).
    Hold(u32),
    /// Deliver what was held for client `n`.
    Release(u32),
    /// Make client `n`'s link slow, up to this many ms per message.
    SlowLink(u32, u64),
    /// Give client `n`'s link the normal latency again.
    NormalLink(u32),
    /// End of the safety phase: every link healthy, the node running.
    Heal,
}

/// The mix and the timed actions of a run, sorted by time.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub mix: Mix,
    pub actions: Vec<(u64, Action)>,
}

/// Draws the plan of `seed` for a safety phase of `safety_ms`. `force_crash` guarantees at
/// least one crash (for the planted-bug test).
#[must_use]
pub fn plan(seed: u64, safety_ms: u64, force_crash: bool) -> Plan {
    assert!(safety_ms >= 10_000, "faults need room in the safety phase");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfa17_5eed);
    let mix = Mix {
        clients: rng.random_range(2..=4),
        crashes: rng.random_range(u32::from(force_crash)..=3),
        partitions: rng.random_range(0..=4),
        holds: rng.random_range(0..=3),
        latency_spikes: rng.random_range(0..=2),
        latency_ms_max: [1, 5, 20, 50][rng.random_range(0..4)],
        sync_probability: [0.0, 0.0, 0.05, 0.5][rng.random_range(0..4)],
        torn_writes: rng.random_bool(0.3),
        random_order: rng.random_bool(0.5),
        sync_failure_rate: [0.0, 0.0, 0.005, 0.02][rng.random_range(0..4)],
    };
    let mut actions = Vec::new();
    // Crashes one after another: each starts at least 1 s after the previous restart.
    let mut crash_times: Vec<u64> = (0..mix.crashes)
        .map(|_| rng.random_range(1_000..safety_ms - 2_000))
        .collect();
    crash_times.sort_unstable();
    let mut node_back_ms = 0;
    for at in crash_times {
        if at < node_back_ms + 1_000 {
            continue;
        }
        let down_ms = rng.random_range(100..=4_000);
        actions.push((at, Action::CrashNode));
        actions.push((at + down_ms, Action::RestartNode));
        node_back_ms = at + down_ms;
    }
    let mut timed =
        |count: u32,
         rng: &mut ChaCha8Rng,
         make: &dyn Fn(u32, &mut ChaCha8Rng) -> (Action, Action, u64)| {
            for _ in 0..count {
                let client = rng.random_range(0..mix.clients);
                let at = rng.random_range(500..safety_ms - 1_000);
                let (start, end, length_ms) = make(client, rng);
                actions.push((at, start));
                actions.push((at + length_ms, end));
            }
        };
    timed(mix.partitions, &mut rng, &|client, rng| {
        (
            Action::Partition(client),
            Action::Repair(client),
            rng.random_range(300..=6_000),
        )
    });
    timed(mix.holds, &mut rng, &|client, rng| {
        (
            Action::Hold(client),
            Action::Release(client),
            rng.random_range(100..=3_000),
        )
    });
    timed(mix.latency_spikes, &mut rng, &|client, rng| {
        (
            Action::SlowLink(client, rng.random_range(100..=1_500)),
            Action::NormalLink(client),
            rng.random_range(500..=5_000),
        )
    });
    actions.retain(|(at, _)| *at < safety_ms);
    actions.push((safety_ms, Action::Heal));
    // Stable: actions at the same time keep their drawing order.
    actions.sort_by_key(|(at, _)| *at);
    Plan { mix, actions }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_plan_every_time() {
        for seed in 0..20 {
            assert_eq!(plan(seed, 30_000, false), plan(seed, 30_000, false));
        }
    }

    #[test]
    fn seeds_draw_different_mixes_and_faults_stay_in_the_safety_phase() {
        let plans: Vec<Plan> = (0..50).map(|seed| plan(seed, 30_000, false)).collect();
        assert!(plans.iter().any(|p| p.mix.crashes == 0));
        assert!(plans.iter().any(|p| p.mix.crashes > 0));
        assert!(plans.iter().any(|p| p.mix.partitions > 0));
        for p in &plans {
            assert_eq!(p.actions.last(), Some(&(30_000, Action::Heal)));
            assert!(p.actions.windows(2).all(|w| w[0].0 <= w[1].0));
            // Crashes and restarts alternate, starting with a crash.
            let node: Vec<&Action> = p
                .actions
                .iter()
                .map(|(_, a)| a)
                .filter(|a| matches!(a, Action::CrashNode | Action::RestartNode))
                .collect();
            for (i, action) in node.iter().enumerate() {
                let expected = if i % 2 == 0 {
                    Action::CrashNode
                } else {
                    Action::RestartNode
                };
                assert_eq!(**action, expected);
            }
        }
    }

    #[test]
    fn force_crash_always_crashes() {
        for seed in 0..50 {
            let p = plan(seed, 30_000, true);
            assert!(p.actions.iter().any(|(_, a)| *a == Action::CrashNode));
        }
    }
}
