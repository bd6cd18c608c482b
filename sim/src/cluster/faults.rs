//! The faults of one cluster run, drawn from its seed: the mix first (three or five members;
//! how many crashes, whether every member crashes at once, whether a disk is lost and replaced;
//! node isolations, one of them past the tombstone horizon, cuts between members, slow links;
//! how the disks behave and how often their syncs fail; how far the members' clocks are apart;
//! how slow the network is; one-way cuts and held links between members, and a member paused
//! past the visibility timeout), then each fault's place in the safety phase. Nothing here
//! touches the simulation: the harness applies the plan.
//!
//! The faults added after the first mix (one-way cuts, holds, the pause) are drawn from a
//! second random source of the seed, so a seed that draws none of them keeps its old plan.
//!
//! This module must never draw from anything but the seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trireme_replication::skew::SKEW_MAX_MS;

/// The most members a run has (node ids 1..=members, members 3 or 5).
pub const MEMBERS_MAX: u16 = 5;
/// The tombstone horizon of every run (spec/replication.md, *Constants*: at least `SKEW_MAX`,
/// the longest operation timeout and the longest network delay tolerated; here 500 ms, 2 s and
/// 1.5 s, and the widest spread of clocks drawn beyond the bound, 4.3 s: 8 s in all). Short, so that collection drops
/// tombstones, a replacement disk waits out the horizon and a member stays away past it, all
/// inside one run.
pub const HORIZON_MS: u64 = 10_000;
/// The farthest a clock is off in a run beyond the bound, ms.
const FAR_MS_MAX: i64 = 4_000;
/// Collection's period in a run (`cluster::COLLECTION_PERIOD`): a tombstone is confirmed within
/// one period of its delete and dropped within one period of its horizon.
pub const COLLECTION_PERIOD_MS: u64 = 2_000;
/// How long a member is kept away when it is kept away past the horizon: longer than the
/// horizon plus two collection periods by 4-10 s, so that a tombstone written in the first 4-10 s
/// after it left can be confirmed, wait out the horizon and be dropped on the others before it
/// returns. Collection must wait for it (it reads all three replicas); one that did not would
/// drop a tombstone while the member still holds the live copy it missed the delete of, and the
/// member would bring it back.
const LONG_ISOLATION_MS: std::ops::RangeInclusive<u64> =
    HORIZON_MS + 2 * COLLECTION_PERIOD_MS + 4_000..=HORIZON_MS + 2 * COLLECTION_PERIOD_MS + 10_000;
/// How long a paused member is held: past every visibility timeout of the workload
/// (`workload::VISIBILITY_S_MAX`, 6 s), so what it coordinated before the pause has timed out
/// when its held requests and replies arrive.
pub const PAUSE_MS: std::ops::RangeInclusive<u64> = 7_000..=10_000;

/// The longest the plan's holds and pause keep what a link carries before delivering it, ms
/// (0 without either): a request held so may reach its member that long after it was sent,
/// after its client gave up on it (the checker's window of a purge without an answer).
pub fn held_max_ms(actions: &[(u64, Action)]) -> u64 {
    actions
        .iter()
        .filter_map(|(at, action)| {
            let end = actions.iter().find_map(|(later, other)| {
                let ends = match (action, other) {
                    (Action::Hold(a, b), Action::Release(c, d)) => (a, b) == (c, d),
                    (Action::Pause(a), Action::Resume(b)) => a == b,
                    _ => false,
                };
                (ends && later >= at).then_some(*later)
            })?;
            Some(end - at)
        })
        .max()
        .unwrap_or(0)
}

/// How the members' clocks relate (spec/replication.md, *Time* and *Clock monitoring*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockKind {
    /// Every member reads turmoil's one clock; nothing to monitor.
    True,
    /// Each member's clock is off by a fixed amount, every two within `SKEW_MAX`; one member's
    /// clock may be stepped once, within the bound.
    Within,
    /// Some member's clock is off by more than `SKEW_MAX` (up to 4 s), and may be stepped.
    /// Only duplicates may result (early redeliveries); nothing may be lost.
    Beyond,
}

/// The members' clocks of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clocks {
    pub kind: ClockKind,
    /// Each member's offset from true time at the start, ms, by node id - 1.
    pub offsets_ms: Vec<i64>,
    /// Whether the members monitor their clocks (spec/replication.md#clock-monitoring): on in
    /// every run whose clocks differ, except some runs beyond the bound, which show what the
    /// protocol alone promises when nothing stops a wrong clock.
    pub monitor: bool,
}

/// What the seed chose for the whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct Mix {
    /// Members of the cluster: 3, or 5 in about a third of the seeds.
    pub members: u16,
    pub clients: u32,
    /// Single-member crashes, each followed by a restart from the member's disk.
    pub crashes: u32,
    /// Whether every member crashes at once (and all restart together) once.
    pub crash_all: bool,
    /// Whether one member's disk is lost and replaced by a new, empty one (a new disk id).
    pub disk_loss: bool,
    /// One member cut off from every other host (members and clients).
    pub isolations: u32,
    /// Whether one member is isolated for longer than the tombstone horizon.
    pub long_isolation: bool,
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
    /// Probability that a sync of a member's disk fails during the safety phase: its store
    /// then refuses everything until the member restarts, which the harness does.
    pub sync_failure_rate: f64,
    /// Whether turmoil polls hosts in a random order each step.
    pub random_order: bool,
    pub clocks: Clocks,
    /// Links between two members cut in one direction only for a while: the first member's
    /// messages to the second are dropped, the second's reach the first.
    pub one_way_cuts: u32,
    /// Links between two members held for a while and then released: everything sent meanwhile
    /// arrives at once, after what other links carried since (reordering).
    pub holds: u32,
    /// Whether one member is paused (every link of it held) for longer than the visibility
    /// timeout, and then resumes: what it sent and what was sent to it arrives late.
    pub pause: bool,
    /// Five-member seeds: whether the members are split once into two sides, two against
    /// three, each side's members cut from the other side's (the clients reach every member).
    pub split: bool,
    /// Links between two members that lose messages for a while: on each message, a chance
    /// that turmoil drops it and everything then in flight on the link (a TCP stream so hit
    /// stalls until the node's keepalive closes it).
    pub lossy_links: u32,
}

impl Mix {
    /// The largest difference between two members' clocks at any time of the run (the drawn
    /// offsets and the step), ms: how early a message may come back by true time.
    #[must_use]
    pub fn clock_spread_ms(&self, actions: &[(u64, Action)]) -> u64 {
        let steps = actions.iter().filter_map(|(_, action)| match action {
            Action::StepClock(_, offset) => Some(*offset),
            _ => None,
        });
        let all: Vec<i64> = self
            .clocks
            .offsets_ms
            .iter()
            .copied()
            .chain(steps)
            .collect();
        let (low, high) = (
            all.iter().copied().min().unwrap_or(0),
            all.iter().copied().max().unwrap_or(0),
        );
        high.abs_diff(low)
    }
}

/// One step of the plan. Members are named by node id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Cut the member's power and crash it: what it had not synced is gone.
    Crash(u16),
    /// Restore power and start the member again from its disk.
    Restart(u16),
    /// Cut every member's power and crash them all.
    CrashAll,
    /// Start every member again.
    RestartAll,
    /// Crash the member and throw its disk away: it restarts (`Restart`) on a new, empty disk
    /// with a new disk id, and must join as a replacement.
    LoseDisk(u16),
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
    /// Drop what the first member sends to the second (the other direction still carries).
    CutOneWay(u16, u16),
    /// Undo a one-way cut.
    MendOneWay(u16, u16),
    /// Hold everything between two members.
    Hold(u16, u16),
    /// Deliver what the link held, and carry again.
    Release(u16, u16),
    /// Hold everything between the member and every other host: it is paused as a process
    /// stopped by its operating system would be.
    Pause(u16),
    /// Undo a pause: what was held arrives.
    Resume(u16),
    /// Split the members in two: these two on one side, the others on the other; every link
    /// between the sides cut (links to the clients stay).
    Split(u16, u16),
    /// Mend the split of these two from the others.
    Unsplit(u16, u16),
    /// The link between two members loses each message (and what is in flight on it) with
    /// this probability, in millionths.
    Lossy(u16, u16, u32),
    /// The link between two members loses nothing again.
    Lossless(u16, u16),
    /// Set the member's clock to this offset from true time, ms (a step of the wall clock).
    StepClock(u16, i64),
    /// End of the quiet start (`QUIET_MS`): from now on the members' syncs fail at the seed's
    /// rate.
    Chaos,
    /// End of the safety phase: every link healthy, every member running, syncs succeed.
    Heal,
}

/// The mix and the timed actions of a run, sorted by time.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub mix: Mix,
    pub actions: Vec<(u64, Action)>,
}

/// A stretch of the safety phase with members down.
#[derive(Clone, Copy, Debug)]
enum Down {
    One,
    All,
    Disk,
}

fn draw_clocks(rng: &mut ChaCha8Rng, members: u16) -> Clocks {
    let within = i64::try_from(SKEW_MAX_MS / 2).expect("small") - 20;
    let kind = [
        ClockKind::True,
        ClockKind::True,
        ClockKind::Within,
        ClockKind::Within,
        ClockKind::Beyond,
    ][rng.random_range(0..5)];
    let offsets_ms = (0..members)
        .map(|_| match kind {
            ClockKind::True => 0,
            // Every two within SKEW_MAX: each within SKEW_MAX / 2 of true time (less a margin
            // for the monitor's sampling width).
            ClockKind::Within | ClockKind::Beyond => rng.random_range(-within..=within),
        })
        .collect::<Vec<_>>();
    let mut clocks = Clocks {
        kind,
        offsets_ms,
        monitor: kind != ClockKind::True,
    };
    if kind == ClockKind::Beyond {
        // One or two members far off, all ahead or all behind: the spread stays within 4.3 s,
        // inside the horizon's margin (`HORIZON_MS`).
        let sign = if rng.random_bool(0.5) { 1 } else { -1 };
        for _ in 0..rng.random_range(1..=2) {
            let who = usize::from(rng.random_range(0..members));
            clocks.offsets_ms[who] = sign * rng.random_range(1_000..=FAR_MS_MAX);
        }
        clocks.monitor = rng.random_bool(0.5);
    }
    clocks
}

/// How long a split of five members lasts.
pub const SPLIT_MS: std::ops::RangeInclusive<u64> = 1_000..=6_000;
/// How long a link loses messages, and how many in a million it loses (0.2 % to 3 %).
pub const LOSSY_MS: std::ops::RangeInclusive<u64> = 1_000..=8_000;
pub const LOSS_PER_MILLION: std::ops::RangeInclusive<u32> = 2_000..=30_000;

/// The quiet start: no fault before it (spec of the run: quiet, chaos, heal, drain).
pub const QUIET_MS: u64 = 1_000;

/// Draws the plan of `seed` for a safety phase of `safety_ms`.
#[must_use]
pub fn plan(seed: u64, safety_ms: u64) -> Plan {
    assert!(safety_ms >= 25_000, "faults need room in the safety phase");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc105_7e25);
    // The faults added later draw from their own source: the first one's draws stay as they were.
    let mut more = ChaCha8Rng::seed_from_u64(seed ^ 0x0e7a_f17d);
    // And the split and lossy links from a third, added after those.
    let mut later = ChaCha8Rng::seed_from_u64(seed ^ 0x5b11_7105);
    let members = if rng.random_bool(1.0 / 3.0) { 5 } else { 3 };
    let mix = Mix {
        members,
        clients: rng.random_range(2..=4),
        crashes: rng.random_range(0..=3),
        crash_all: rng.random_bool(0.2),
        disk_loss: rng.random_bool(0.2),
        isolations: rng.random_range(0..=2),
        long_isolation: rng.random_bool(0.15),
        peer_cuts: rng.random_range(0..=2),
        slow_links: rng.random_range(0..=2),
        latency_ms_max: [1, 5, 20][rng.random_range(0..3)],
        sync_probability: [0.0, 0.0, 0.05, 0.5][rng.random_range(0..4)],
        torn_writes: rng.random_bool(0.3),
        sync_failure_rate: [0.0, 0.0, 0.0, 0.005, 0.02][rng.random_range(0..5)],
        random_order: rng.random_bool(0.5),
        clocks: draw_clocks(&mut rng, members),
        one_way_cuts: more.random_range(0..=2),
        holds: more.random_range(0..=2),
        pause: more.random_bool(0.2),
        split: members == 5 && later.random_bool(0.5),
        lossy_links: later.random_range(0..=2),
    };
    let member = |rng: &mut ChaCha8Rng| rng.random_range(1..=members);
    let mut actions = Vec::new();
    // Stretches with members down, one after another (each at least 1 s after the previous
    // one ended): single crashes of a member drawn anew, every member at once, a lost disk.
    // A lost disk comes early enough for its replacement to wait out the horizon and rebuild
    // before the drain ends.
    let mut downs: Vec<(u64, Down)> = (0..mix.crashes)
        .map(|_| (rng.random_range(1_000..safety_ms - 2_000), Down::One))
        .collect();
    if mix.crash_all {
        downs.push((rng.random_range(1_000..safety_ms - 2_000), Down::All));
    }
    if mix.disk_loss {
        downs.push((rng.random_range(1_000..safety_ms - 15_000), Down::Disk));
    }
    downs.sort_by_key(|(at, _)| *at);
    let mut back_ms = 0;
    for (at, down) in downs {
        if at < back_ms + 1_000 {
            continue;
        }
        let down_ms = rng.random_range(100..=5_000);
        match down {
            Down::One | Down::Disk => {
                let who = member(&mut rng);
                let crash = match down {
                    Down::Disk => Action::LoseDisk(who),
                    _ => Action::Crash(who),
                };
                actions.push((at, crash));
                actions.push((at + down_ms, Action::Restart(who)));
                if matches!(down, Down::Disk) {
                    // Another member is cut from its peers around the loss, so it misses what the
                    // lost disk and the third member acknowledged, and is back before anti-entropy
                    // could have refilled the new disk: only the wait and the rebuild keep the new
                    // disk from voting beside it with neither holding those writes (planted bug
                    // `EmptyReplacementVotes`).
                    let behind = (who + more.random_range(0..members - 1)) % members + 1;
                    let from = at.saturating_sub(more.random_range(500..=3_000));
                    let to = at + down_ms + more.random_range(300..=2_000);
                    actions.push((from, Action::CutPeers(behind)));
                    actions.push((to, Action::MendPeers(behind)));
                }
            }
            Down::All => {
                actions.push((at, Action::CrashAll));
                actions.push((at + down_ms, Action::RestartAll));
            }
        }
        back_ms = at + down_ms;
    }
    for _ in 0..mix.isolations {
        let who = member(&mut rng);
        let at = rng.random_range(500..safety_ms - 1_000);
        let length_ms = rng.random_range(300..=6_000);
        actions.push((at, Action::Isolate(who)));
        actions.push((at + length_ms, Action::Rejoin(who)));
    }
    if mix.long_isolation {
        let who = member(&mut rng);
        let length_ms = rng.random_range(LONG_ISOLATION_MS);
        let at = rng.random_range(500..safety_ms - length_ms - 500);
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
        let b = a % members + 1;
        let at = rng.random_range(500..safety_ms - 1_000);
        let ms = rng.random_range(100..=1_500);
        let length_ms = rng.random_range(500..=5_000);
        actions.push((at, Action::SlowLink(a, b, ms)));
        actions.push((at + length_ms, Action::NormalLink(a, b)));
    }
    if mix.clocks.kind != ClockKind::True && rng.random_bool(0.5) {
        // One member's wall clock is stepped: within the bound for `Within`, by up to 4 s for
        // `Beyond`, and back to where it was a while later.
        let who = member(&mut rng);
        let was = mix.clocks.offsets_ms[usize::from(who - 1)];
        let to = match mix.clocks.kind {
            ClockKind::Within => {
                let within = i64::try_from(SKEW_MAX_MS / 2).expect("small") - 20;
                rng.random_range(-within..=within)
            }
            // Toward the side the far clocks are on: the spread stays within the margin.
            _ => {
                let far = mix
                    .clocks
                    .offsets_ms
                    .iter()
                    .copied()
                    .max_by_key(|o| o.abs());
                let sign = far.unwrap_or(1).signum();
                sign * rng.random_range(-200..=FAR_MS_MAX)
            }
        };
        let at = rng.random_range(500..safety_ms - 1_000);
        let length_ms = rng.random_range(1_000..=10_000);
        actions.push((at, Action::StepClock(who, to)));
        actions.push((at + length_ms, Action::StepClock(who, was)));
    }
    // Two distinct members: the first drawn, the second another one.
    let pair = |rng: &mut ChaCha8Rng| {
        let a = rng.random_range(1..=members);
        let b = (a + rng.random_range(0..members - 1)) % members + 1;
        (a, b)
    };
    for _ in 0..mix.one_way_cuts {
        let (from, to) = pair(&mut more);
        let at = more.random_range(500..safety_ms - 1_000);
        let length_ms = more.random_range(300..=6_000);
        actions.push((at, Action::CutOneWay(from, to)));
        actions.push((at + length_ms, Action::MendOneWay(from, to)));
    }
    for _ in 0..mix.holds {
        let (a, b) = pair(&mut more);
        let at = more.random_range(500..safety_ms - 1_000);
        let length_ms = more.random_range(200..=3_000);
        actions.push((at, Action::Hold(a, b)));
        actions.push((at + length_ms, Action::Release(a, b)));
    }
    if mix.pause {
        let who = more.random_range(1..=members);
        let length_ms = more.random_range(PAUSE_MS);
        let at = more.random_range(500..safety_ms - length_ms - 500);
        actions.push((at, Action::Pause(who)));
        actions.push((at + length_ms, Action::Resume(who)));
    }
    if mix.split {
        let (a, b) = pair(&mut later);
        let at = later.random_range(500..safety_ms - 1_000);
        let length_ms = later.random_range(SPLIT_MS);
        actions.push((at, Action::Split(a, b)));
        actions.push((at + length_ms, Action::Unsplit(a, b)));
    }
    // Not on a pair a one-way cut ever takes: turmoil repairs a link it broke at random in both
    // directions, which would undo that cut (the harness tells it each link's state only when a
    // fault changes it).
    let one_way: Vec<(u16, u16)> = actions
        .iter()
        .filter_map(|(_, action)| match action {
            Action::CutOneWay(a, b) => Some(((*a).min(*b), (*a).max(*b))),
            _ => None,
        })
        .collect();
    for _ in 0..mix.lossy_links {
        let (a, b) = pair(&mut later);
        let at = later.random_range(500..safety_ms - 1_000);
        let length_ms = later.random_range(LOSSY_MS);
        let rate = later.random_range(LOSS_PER_MILLION);
        if !one_way.contains(&(a.min(b), a.max(b))) {
            actions.push((at, Action::Lossy(a, b, rate)));
            actions.push((at + length_ms, Action::Lossless(a, b)));
        }
    }
    actions.retain(|(at, _)| *at < safety_ms);
    // The quiet start: the members form the cluster and the clients create the queue before
    // anything fails (a seed whose syncs failed from the first commit, or whose first cut came
    // within the first join, could keep the cluster from forming for the whole safety phase and
    // test nothing). What was drawn earlier happens when the quiet start ends.
    for (at, _) in &mut actions {
        *at = (*at).max(QUIET_MS);
    }
    actions.push((QUIET_MS, Action::Chaos));
    actions.push((safety_ms, Action::Heal));
    // Stable: actions at the same time keep their drawing order.
    actions.sort_by_key(|(at, _)| *at);
    Plan { mix, actions }
}

/// A focused swarm profile: a plan that leaves out every fault but the few one rare race needs
/// and places them so that the race happens in nearly every run (sim/README.md, *Planted
/// bugs*). The seed still draws the clients, the member chosen, the places and lengths, the
/// network's latency and the disks' flushes; the run's workload is the random mix's, unless
/// `workload::Shape` bends it toward the race.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Focus {
    /// Collection's race (spec/replication.md#tombstones-and-their-collection): three members on
    /// true clocks, no crash and no failed sync (a crash of a collector while it waits out the
    /// horizon forgets what it confirmed), and one member kept away from every host from
    /// `KEPT_AWAY_FROM_MS` (the workload has sent and received for 4-5 s, so many messages it
    /// holds are in flight or waiting) until shortly before the heal, more than the horizon plus
    /// two collection periods after the deletes of its first 6-9 s away. Those deletes'
    /// tombstones are on the other two only: collection must wait for the member, and one that
    /// confirmed at two replicas drops them while the member still holds the live copies it
    /// brings back when it returns (planted bug `CollectAfterTwo`).
    KeptAway,
    /// A replacement's race (spec/replication.md, *Stragglers and replacement*): three members
    /// on true clocks, no failed sync. A member ("behind") is cut from its peers for 3-5 s, so
    /// what the others acknowledge meanwhile is on them only; then another member's disk is
    /// lost. The third member is cut from its peers, and from "behind" until the end of the
    /// episode, before "behind" is mended, so nothing refills "behind". The new disk starts
    /// 0.5-1.5 s after the loss and asks both peers whether it replaces a disk; the third
    /// answers only in a window of 0.8-1 s from 1 s after that start, between two passes of
    /// the new disk's anti-entropy (every 3 s from its start), which would otherwise refill it
    /// from the third as soon as it could ask it; then the third is cut again for 4-6 s. A
    /// replacement that waits out the horizon answers nothing meanwhile, so no quorum forms;
    /// one that votes at once forms one with "behind" that knows nothing the lost disk
    /// acknowledged during the first cut: deleted messages come back, claimed ones are claimed
    /// again (planted bug `EmptyReplacementVotes`).
    LostDiskBehind,
    /// S4's race (spec/replication.md#delete): three members on true clocks, no crash and no
    /// failed sync; one member ("behind") is cut from its peers for 2-4 s at a time, with 0.5-1.5
    /// s between cuts, from the end of the quiet start to the heal, so it misses the claims the
    /// others make meanwhile until anti-entropy brings them. The clients keep many handles for a
    /// late delete and send those through "behind" (`workload::Shape`): with the quorum read a
    /// superseded handle's delete writes nothing; without it (planted bug
    /// `DeleteWithoutQuorumRead`) "behind" takes the tombstone, which then dominates the new
    /// holder's copy.
    StaleDeletes,
    /// L9b's race (spec/replication.md §9, *Re-poll*): five members on true clocks, no fault
    /// at all, no failed sync. Client 0 only long-polls, through member 1, and the others only
    /// send, each message delayed (`workload::Shape`): a message made ready by time is
    /// announced by no wake-up, and member 1, none of the replicas of two messages in five,
    /// finds those only by its re-poll's quorum of indexes, or when a receive that samples a
    /// peer happens to (planted bug `WaiterReadsOwnReplica`, rule
    /// `checker::check_waiters_served`).
    Waiters,
    /// F3's race (sim/README.md, *Findings*; spec/replication.md#delete, step 4): three
    /// members on true clocks, no fault, four clients. Two hold messages they receive through
    /// member 1 and delete each through member 2 or 3 at the instant its visibility timeout
    /// ends; one long-polls through member 1, which receives for its waiters at the deadlines
    /// it wrote, and leaves what it gets to time out; one sends (`workload::Shape`). A delete
    /// and a new claim of one message then meet at once from two coordinators, each of whose
    /// own replica takes its write first: the delete's tombstone lands on one replica and the
    /// two holding the new claim refuse it. Answered `Stale` (planted bug
    /// `StaleAtTwoRefusals`), the tombstone that spreads removes a message no delete that may
    /// have happened explains.
    DeleteAtDeadline,
    /// The claim without the read's race (spec/replication.md §13, checks (c) and *Own replica
    /// last*): three members on true clocks, no crash and no failed sync; one member
    /// ("behind") is cut from its peers as under [`Focus::StaleDeletes`]. Clients receive
    /// through "behind" with a visibility of 2 s and extend each delivery to 4-6 s through
    /// another member 0.2-1.2 s later; one sends (`workload::Shape`). An extension made while
    /// "behind" is cut is on the two others only, so its own replica shows the receive's
    /// lease, passed after 2 s: its next receives take the claim without the read on it.
    /// The two others must refuse that claim by (c) (planted bug
    /// `ClaimWithoutReadNoDeadlineCheck`), and "behind" must not keep it (planted bug
    /// `FastClaimOwnReplicaFirst`): either way the message is delivered inside the extension.
    StaleLeases,
}

/// When the member of [`Focus::KeptAway`] leaves, at the earliest: the clients have created
/// the queue (in the quiet start) and sent and received for 4 s.
const KEPT_AWAY_FROM_MS: u64 = QUIET_MS + 4_000;
/// How long the member of [`Focus::KeptAway`] is away: the horizon, two collection periods
/// and 6-9 s in which the deletes it misses are dropped before it returns.
const KEPT_AWAY_MS: std::ops::RangeInclusive<u64> =
    HORIZON_MS + 2 * COLLECTION_PERIOD_MS + 6_000..=HORIZON_MS + 2 * COLLECTION_PERIOD_MS + 9_000;

/// How long [`Focus::StaleDeletes`] cuts its member from its peers at a time, and how long it
/// leaves it mended between two cuts.
const STALE_CUT_MS: std::ops::RangeInclusive<u64> = 2_000..=4_000;
const STALE_MENDED_MS: std::ops::RangeInclusive<u64> = 500..=1_500;

/// The member a focused plan works on: the one [`Focus::StaleDeletes`] keeps cutting from its
/// peers (the first member it cuts).
#[must_use]
pub fn focused_member(plan: &Plan) -> Option<u16> {
    plan.actions.iter().find_map(|(_, action)| match action {
        Action::CutPeers(member) => Some(*member),
        _ => None,
    })
}

/// The plan of `seed` under `focus`, for a safety phase of `safety_ms` (at least 30 s).
#[must_use]
pub fn focused_plan(seed: u64, safety_ms: u64, focus: Focus) -> Plan {
    assert!(
        safety_ms >= 30_000,
        "a focused race needs the whole safety phase"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xf0c0_5ed0);
    let members = if focus == Focus::Waiters { 5 } else { 3 };
    let clients = rng.random_range(3..=4);
    let mix = Mix {
        members,
        clients: if focus == Focus::DeleteAtDeadline {
            4
        } else {
            clients
        },
        crashes: 0,
        crash_all: false,
        disk_loss: focus == Focus::LostDiskBehind,
        isolations: 0,
        long_isolation: focus == Focus::KeptAway,
        peer_cuts: 0,
        slow_links: 0,
        latency_ms_max: [1, 5][rng.random_range(0..2)],
        sync_probability: [0.0, 0.05, 0.5][rng.random_range(0..3)],
        torn_writes: false,
        sync_failure_rate: 0.0,
        random_order: rng.random_bool(0.5),
        clocks: Clocks {
            kind: ClockKind::True,
            offsets_ms: vec![0; usize::from(members)],
            monitor: false,
        },
        one_way_cuts: 0,
        holds: 0,
        pause: false,
        split: false,
        lossy_links: 0,
    };
    let who = rng.random_range(1..=members);
    let mut actions = vec![(QUIET_MS, Action::Chaos)];
    match focus {
        Focus::KeptAway => {
            let length_ms = rng.random_range(KEPT_AWAY_MS);
            let latest = safety_ms - length_ms - 500;
            let at = rng.random_range(KEPT_AWAY_FROM_MS.min(latest)..=latest);
            actions.push((at, Action::Isolate(who)));
            actions.push((at + length_ms, Action::Rejoin(who)));
        }
        Focus::LostDiskBehind => {
            // Another member, and the third.
            let behind = (who + rng.random_range(0..members - 1)) % members + 1;
            let third = (1..=members)
                .find(|m| *m != who && *m != behind)
                .expect("three members");
            let at = rng.random_range(8_000..=12_000);
            let restart_at = at + rng.random_range(500..=1_500);
            // The new disk's anti-entropy passes start with it: one at `restart_at`, whose
            // round with the third fails within its connect timeout, the next 3 s later.
            let answer_at = restart_at + 1_000;
            let cut_again_at = answer_at + rng.random_range(800..=1_000);
            let end_at = cut_again_at + rng.random_range(4_000..=6_000);
            actions.extend([
                (
                    at - rng.random_range(3_000..=5_000),
                    Action::CutPeers(behind),
                ),
                (at, Action::LoseDisk(who)),
                (at + 100, Action::CutPeers(third)),
                (at + 100, Action::CutOneWay(behind, third)),
                (at + 100, Action::CutOneWay(third, behind)),
                (at + 200, Action::MendPeers(behind)),
                (restart_at, Action::Restart(who)),
                (answer_at, Action::MendPeers(third)),
                (cut_again_at, Action::CutPeers(third)),
                (end_at, Action::MendPeers(third)),
                (end_at, Action::MendOneWay(behind, third)),
                (end_at, Action::MendOneWay(third, behind)),
            ]);
        }
        Focus::Waiters | Focus::DeleteAtDeadline => {}
        Focus::StaleDeletes | Focus::StaleLeases => {
            let mut at = QUIET_MS + rng.random_range(STALE_MENDED_MS);
            loop {
                let mend_at = at + rng.random_range(STALE_CUT_MS);
                if mend_at >= safety_ms - 500 {
                    break;
                }
                actions.push((at, Action::CutPeers(who)));
                actions.push((mend_at, Action::MendPeers(who)));
                at = mend_at + rng.random_range(STALE_MENDED_MS);
            }
        }
    }
    assert!(actions.iter().all(|(at, _)| *at < safety_ms));
    actions.push((safety_ms, Action::Heal));
    actions.sort_by_key(|(at, _)| *at);
    Plan { mix, actions }
}

/// The plan of a run: the seed's random mix, or a focused profile.
#[must_use]
pub fn plan_for(seed: u64, safety_ms: u64, focus: Option<Focus>) -> Plan {
    match focus {
        None => plan(seed, safety_ms),
        Some(focus) => focused_plan(seed, safety_ms, focus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_hold_is_the_longest_pause_or_hold_of_the_plan() {
        let actions = [
            (1_000, Action::Hold(1, 2)),
            (1_500, Action::Pause(3)),
            (2_000, Action::Release(1, 2)),
            (3_000, Action::Hold(2, 3)),
            (4_000, Action::Release(2, 3)),
            (9_500, Action::Resume(3)),
        ];
        assert_eq!(held_max_ms(&actions), 8_000);
        assert_eq!(held_max_ms(&actions[..3]), 1_000);
        assert_eq!(held_max_ms(&[(5, Action::Heal)]), 0);
    }

    #[test]
    fn a_seed_draws_the_same_plan_and_faults_stay_in_the_safety_phase() {
        let plans: Vec<Plan> = (0..60).map(|seed| plan(seed, 30_000)).collect();
        assert_eq!(
            plans,
            (0..60).map(|seed| plan(seed, 30_000)).collect::<Vec<_>>()
        );
        assert!(plans.iter().any(|p| p.mix.crashes > 0));
        assert!(plans.iter().any(|p| p.mix.isolations > 0));
        assert!(plans.iter().any(|p| p.mix.peer_cuts > 0));
        assert!(plans.iter().any(|p| p.mix.members == 5));
        assert!(plans.iter().any(|p| p.mix.members == 3));
        for kind in [ClockKind::True, ClockKind::Within, ClockKind::Beyond] {
            assert!(plans.iter().any(|p| p.mix.clocks.kind == kind), "{kind:?}");
        }
        let has = |want: fn(&Action) -> bool| {
            plans
                .iter()
                .any(|p| p.actions.iter().any(|(_, action)| want(action)))
        };
        assert!(has(|a| matches!(a, Action::CrashAll)));
        assert!(has(|a| matches!(a, Action::LoseDisk(_))));
        assert!(has(|a| matches!(a, Action::StepClock(..))));
        assert!(has(|a| matches!(a, Action::CutOneWay(..))));
        assert!(has(|a| matches!(a, Action::Hold(..))));
        assert!(has(|a| matches!(a, Action::Pause(_))));
        assert!(has(|a| matches!(a, Action::Split(..))));
        assert!(has(|a| matches!(a, Action::Lossy(..))));
        for p in &plans {
            // A split is of five members, two against three; no link both loses messages and
            // is cut one way at some time.
            let one_way: Vec<(u16, u16)> = p
                .actions
                .iter()
                .filter_map(|(_, a)| match a {
                    Action::CutOneWay(x, y) => Some(((*x).min(*y), (*x).max(*y))),
                    _ => None,
                })
                .collect();
            for (_, action) in &p.actions {
                match action {
                    Action::Split(a, b) => {
                        assert_eq!(p.mix.members, 5);
                        assert!(a != b && (1..=5).contains(a) && (1..=5).contains(b));
                    }
                    Action::Lossy(a, b, rate) => {
                        assert!(a != b && (1..=p.mix.members).contains(a));
                        assert!(!one_way.contains(&((*a).min(*b), (*a).max(*b))));
                        assert!(LOSS_PER_MILLION.contains(rate));
                    }
                    _ => {}
                }
            }
            assert_eq!(p.actions.last(), Some(&(30_000, Action::Heal)));
            assert!(p.actions.windows(2).all(|w| w[0].0 <= w[1].0));
            assert_eq!(p.mix.clocks.offsets_ms.len(), usize::from(p.mix.members));
            match p.mix.clocks.kind {
                ClockKind::True => assert_eq!(p.mix.clock_spread_ms(&p.actions), 0),
                ClockKind::Within => assert!(p.mix.clock_spread_ms(&p.actions) <= SKEW_MAX_MS),
                ClockKind::Beyond => assert!(p.mix.clock_spread_ms(&p.actions) > SKEW_MAX_MS),
            }
            // Members are down one stretch at a time: a crash (or a lost disk) and its
            // restart, or all of them and their restart, never overlapping.
            let mut down = None;
            for (_, action) in &p.actions {
                match action {
                    Action::Crash(m) | Action::LoseDisk(m) => {
                        assert_eq!(down, None);
                        down = Some(*m);
                    }
                    Action::CrashAll => {
                        assert_eq!(down, None);
                        down = Some(0);
                    }
                    Action::Restart(m) => {
                        assert_eq!(down, Some(*m));
                        down = None;
                    }
                    Action::RestartAll => {
                        assert_eq!(down, Some(0));
                        down = None;
                    }
                    Action::Isolate(m)
                    | Action::CutPeers(m)
                    | Action::StepClock(m, _)
                    | Action::Pause(m) => {
                        assert!((1..=p.mix.members).contains(m));
                    }
                    Action::CutOneWay(a, b) | Action::Hold(a, b) => {
                        assert!(a != b && (1..=p.mix.members).contains(a));
                        assert!((1..=p.mix.members).contains(b));
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn a_focused_plan_has_only_its_race_s_faults() {
        for seed in 0..40 {
            let kept = focused_plan(seed, 30_000, Focus::KeptAway);
            assert_eq!(kept, focused_plan(seed, 30_000, Focus::KeptAway));
            assert_eq!(kept.mix.members, 3);
            assert_eq!(kept.mix.clocks.kind, ClockKind::True);
            assert_eq!(kept.mix.sync_failure_rate, 0.0);
            let faults: Vec<&(u64, Action)> = kept
                .actions
                .iter()
                .filter(|(_, action)| !matches!(action, Action::Chaos | Action::Heal))
                .collect();
            let [(away, Action::Isolate(a)), (back, Action::Rejoin(b))] = faults[..] else {
                panic!("seed {seed}: one isolation and nothing else: {faults:?}");
            };
            assert_eq!(a, b);
            assert!(*away >= KEPT_AWAY_FROM_MS);
            // The deletes of its first 6 s away are confirmed, wait out the horizon and are
            // dropped (one collection period each) before it returns, and it returns before
            // the heal.
            assert!(back - away > HORIZON_MS + 2 * COLLECTION_PERIOD_MS + 6_000 - 1);
            assert!(*back < 30_000);

            let lost = focused_plan(seed, 30_000, Focus::LostDiskBehind);
            assert_eq!(lost.mix.members, 3);
            assert_eq!(lost.mix.clocks.kind, ClockKind::True);
            let order: Vec<&Action> = lost.actions.iter().map(|(_, action)| action).collect();
            let [
                Action::Chaos,
                Action::CutPeers(behind),
                Action::LoseDisk(who),
                Action::CutPeers(third),
                Action::CutOneWay(..),
                Action::CutOneWay(..),
                Action::MendPeers(mended),
                Action::Restart(restarted),
                Action::MendPeers(answers),
                Action::CutPeers(cut_again),
                Action::MendPeers(_),
                Action::MendOneWay(..),
                Action::MendOneWay(..),
                Action::Heal,
            ] = order[..]
            else {
                panic!("seed {seed}: the lost disk's race and nothing else: {order:?}");
            };
            assert_eq!((who, behind), (restarted, mended));
            assert_eq!((third, third), (answers, cut_again));
            let mut three = [*who, *behind, *third];
            three.sort_unstable();
            assert_eq!(three, [1, 2, 3]);
        }
    }

    #[test]
    fn a_waiters_plan_has_five_members_on_true_clocks_and_no_fault() {
        for seed in 0..40 {
            let p = focused_plan(seed, 30_000, Focus::Waiters);
            assert_eq!(p, focused_plan(seed, 30_000, Focus::Waiters));
            assert_eq!(p.mix.members, 5);
            assert_eq!(p.mix.clocks.kind, ClockKind::True);
            assert_eq!(p.mix.clocks.offsets_ms, vec![0; 5]);
            assert_eq!(p.mix.sync_failure_rate, 0.0);
            let order: Vec<&Action> = p.actions.iter().map(|(_, action)| action).collect();
            assert_eq!(order, [&Action::Chaos, &Action::Heal], "seed {seed}");
        }
    }

    #[test]
    fn a_delete_at_deadline_plan_has_three_members_four_clients_and_no_fault() {
        for seed in 0..40 {
            let p = focused_plan(seed, 30_000, Focus::DeleteAtDeadline);
            assert_eq!(p, focused_plan(seed, 30_000, Focus::DeleteAtDeadline));
            assert_eq!((p.mix.members, p.mix.clients), (3, 4));
            assert_eq!(p.mix.clocks.kind, ClockKind::True);
            assert_eq!(p.mix.sync_failure_rate, 0.0);
            let order: Vec<&Action> = p.actions.iter().map(|(_, action)| action).collect();
            assert_eq!(order, [&Action::Chaos, &Action::Heal], "seed {seed}");
        }
    }

    #[test]
    fn a_stale_deletes_plan_only_cuts_one_member_from_its_peers_again_and_again() {
        for seed in 0..40 {
            let p = focused_plan(seed, 30_000, Focus::StaleDeletes);
            assert_eq!(p, focused_plan(seed, 30_000, Focus::StaleDeletes));
            assert_eq!(p.mix.members, 3);
            assert_eq!(p.mix.clocks.kind, ClockKind::True);
            assert_eq!(p.mix.sync_failure_rate, 0.0);
            let who = focused_member(&p).expect("it cuts a member");
            let faults: Vec<&(u64, Action)> = p
                .actions
                .iter()
                .filter(|(_, action)| !matches!(action, Action::Chaos | Action::Heal))
                .collect();
            assert!(faults.len() >= 10, "seed {seed}: {faults:?}");
            for pair in faults.chunks(2) {
                let [(cut, Action::CutPeers(a)), (mended, Action::MendPeers(b))] = pair else {
                    panic!("seed {seed}: cuts and mends of one member only: {faults:?}");
                };
                assert_eq!((*a, *b), (who, who));
                assert!(STALE_CUT_MS.contains(&(mended - cut)));
                assert!(*mended < 30_000);
            }
        }
    }
}
