//! The faults of one cluster run, drawn from its seed: the mix first (how many crashes, node
//! isolations, cuts between members, slow links; how the disks behave; how slow the network
//! is), then each fault's place in the safety phase. Nothing here touches the simulation: the
//! harness applies the plan.
//!
//! This module must never draw from anything but the seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Members of every cluster run (node ids 1..=MEMBERS).
pub const MEMBERS: u16 = 3;

/// What the seed chose for the whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct Mix {
    pub clients: u32,
    /// Member crashes, each followed by a restart from the member's disk.
    pub crashes: u32,
    /// One member cut off from every other host (members and clients).
    pub isolations: u32,
    /// One member cut off from the other members only: clients still reach it.
    pub peer_cuts: u32,
    /// Links between two members made slow for a while.
    pub slow_links: u32,
    /// The network's normal worst latency.
    pub latency_ms_max: u64,
    /// Probability that the simulated OS flushes a file's pending writes after a write.
    pub sync_probability: f64,
    /// Whether a crash may tear unsynced writes at 4 KiB blocks.
    pub torn_writes: bool,
    /// Whether turmoil polls hosts in a random order each step.
    pub random_order: bool,
}

/// One step of the plan. Members are named by node id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Cut the member's power and crash it: what it had not synced is gone.
    Crash(u16),
    /// Restore power and start the member again from its disk.
    Restart(u16),
    /// Drop everything between the member and every other host.
    Isolate(u16),
    /// Undo an isolation.
    Rejoin(u16),
    /// Drop everything between the member and the other members.
    CutPeers(u16),
    /// Undo a cut.
    MendPeers(u16),
    /// Make the link between two members slow, up to this many ms per message.
    SlowLink(u16, u16, u64),
    /// Give that link the normal latency again.
    NormalLink(u16, u16),
    /// End of the safety phase: every link healthy, every member running.
    Heal,
}

/// The mix and the timed actions of a run, sorted by time.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub mix: Mix,
    pub actions: Vec<(u64, Action)>,
}

/// Draws the plan of `seed` for a safety phase of `safety_ms`.
#[must_use]
pub fn plan(seed: u64, safety_ms: u64) -> Plan {
    assert!(safety_ms >= 10_000, "faults need room in the safety phase");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc105_7e25);
    let mix = Mix {
        clients: rng.random_range(2..=4),
        crashes: rng.random_range(0..=3),
        isolations: rng.random_range(0..=2),
        peer_cuts: rng.random_range(0..=2),
        slow_links: rng.random_range(0..=2),
        latency_ms_max: [1, 5, 20][rng.random_range(0..3)],
        sync_probability: [0.0, 0.0, 0.05, 0.5][rng.random_range(0..4)],
        torn_writes: rng.random_bool(0.3),
        random_order: rng.random_bool(0.5),
    };
    let member = |rng: &mut ChaCha8Rng| rng.random_range(1..=MEMBERS);
    let mut actions = Vec::new();
    // Crashes one after another (each at least 1 s after the previous restart), each of a
    // member drawn anew.
    let mut crash_times: Vec<u64> = (0..mix.crashes)
        .map(|_| rng.random_range(1_000..safety_ms - 2_000))
        .collect();
    crash_times.sort_unstable();
    let mut back_ms = 0;
    for at in crash_times {
        if at < back_ms + 1_000 {
            continue;
        }
        let who = member(&mut rng);
        let down_ms = rng.random_range(100..=5_000);
        actions.push((at, Action::Crash(who)));
        actions.push((at + down_ms, Action::Restart(who)));
        back_ms = at + down_ms;
    }
    for _ in 0..mix.isolations {
        let who = member(&mut rng);
        let at = rng.random_range(500..safety_ms - 1_000);
        let length_ms = rng.random_range(300..=6_000);
        actions.push((at, Action::Isolate(who)));
        actions.push((at + length_ms, Action::Rejoin(who)));
    }
    for _ in 0..mix.peer_cuts {
        let who = member(&mut rng);
        let at = rng.random_range(500..safety_ms - 1_000);
        let length_ms = rng.random_range(300..=6_000);
        actions.push((at, Action::CutPeers(who)));
        actions.push((at + length_ms, Action::MendPeers(who)));
    }
    for _ in 0..mix.slow_links {
        let a = member(&mut rng);
        let b = a % MEMBERS + 1;
        let at = rng.random_range(500..safety_ms - 1_000);
        let ms = rng.random_range(100..=1_500);
        let length_ms = rng.random_range(500..=5_000);
        actions.push((at, Action::SlowLink(a, b, ms)));
        actions.push((at + length_ms, Action::NormalLink(a, b)));
    }
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
    fn a_seed_draws_the_same_plan_and_faults_stay_in_the_safety_phase() {
        let plans: Vec<Plan> = (0..50).map(|seed| plan(seed, 30_000)).collect();
        assert_eq!(
            plans,
            (0..50).map(|seed| plan(seed, 30_000)).collect::<Vec<_>>()
        );
        assert!(plans.iter().any(|p| p.mix.crashes > 0));
        assert!(plans.iter().any(|p| p.mix.isolations > 0));
        assert!(plans.iter().any(|p| p.mix.peer_cuts > 0));
        for p in &plans {
            assert_eq!(p.actions.last(), Some(&(30_000, Action::Heal)));
            assert!(p.actions.windows(2).all(|w| w[0].0 <= w[1].0));
            // At most one member is down at a time: crashes and restarts alternate.
            let mut down = None;
            for (_, action) in &p.actions {
                match action {
                    Action::Crash(m) => {
                        assert_eq!(down, None);
                        down = Some(*m);
                    }
                    Action::Restart(m) => {
                        assert_eq!(down, Some(*m));
                        down = None;
                    }
                    _ => {}
                }
            }
        }
    }
}
