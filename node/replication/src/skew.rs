//! Clock monitoring (spec/replication.md#clock-monitoring): from round-trip samples of the peers'
//! clocks, whether this node's clock is close enough to the cluster's for it to coordinate and
//! sweep. A sample brackets the peer's reading between two of this node's, so every offset is an
//! interval and every decision takes its worst end; the cluster's clock is the median of the
//! members' clocks, and a node coordinates only while that median is within `SKEW_MAX / 2` of its
//! own clock, so any two coordinating nodes are within `SKEW_MAX` of each other.
//!
//! It must never read a clock: time comes in as this node's clock readings.

use std::collections::{BTreeMap, VecDeque};

use crate::ids::NodeId;

/// The bound between any two coordinating nodes' clocks (spec/replication.md, *Constants*).
pub const SKEW_MAX_MS: u64 = 500;
/// Samples kept per peer; the tightest fresh one counts.
pub const SAMPLES_PER_PEER: usize = 4;

/// How strict the monitoring is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkewSettings {
    /// `SKEW_MAX`: a node coordinates while the cluster's clock is within half of it.
    pub skew_max_ms: u64,
    /// `RESUME_MARGIN`: a node that stopped for being beyond resumes only at
    /// `skew_max_ms / 2 - resume_margin_ms`.
    pub resume_margin_ms: u64,
    /// `SAMPLE_AGE_MAX`, by this node's clock.
    pub sample_age_max_ms: u64,
}

impl Default for SkewSettings {
    /// The page's values: 500 ms, 50 ms, 3 s.
    fn default() -> SkewSettings {
        SkewSettings {
            skew_max_ms: SKEW_MAX_MS,
            resume_margin_ms: 50,
            sample_age_max_ms: 3_000,
        }
    }
}

/// One round trip to a peer: this node's clock when it sent (`sent_ms`) and when the answer
/// arrived (`received_ms`), and the peer's clock when it answered (`peer_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// This node's clock at the send.
    pub sent_ms: u64,
    /// The peer's clock in its answer.
    pub peer_ms: u64,
    /// This node's clock when the answer arrived.
    pub received_ms: u64,
}

/// Bounds on an offset `other − this node` in ms: the true offset lies in `[low_ms, high_ms]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offset {
    /// The least the offset can be.
    pub low_ms: i64,
    /// The most the offset can be.
    pub high_ms: i64,
}

impl Offset {
    /// How far the other clock may be from this node's: the larger magnitude of the two ends.
    #[must_use]
    pub fn distance_ms(&self) -> u64 {
        self.low_ms.unsigned_abs().max(self.high_ms.unsigned_abs())
    }

    /// The midpoint, the best single estimate.
    #[must_use]
    pub fn estimate_ms(&self) -> i64 {
        self.low_ms + (self.high_ms - self.low_ms) / 2
    }

    /// Half the interval's width: how far the estimate may be off.
    #[must_use]
    pub fn uncertainty_ms(&self) -> u64 {
        (self.high_ms - self.low_ms).unsigned_abs() / 2
    }
}

fn ms(value: u64) -> i64 {
    // Clock readings are ms since 1970: far below i64::MAX for 292 million years.
    i64::try_from(value).expect("a clock reading fits i64 ms")
}

impl Sample {
    /// The offset `peer − this node` the sample shows: the peer read its clock at some moment
    /// between `sent_ms` and `received_ms` of this node's clock. `None` when the answer arrived
    /// before it was sent by this node's clock (the clock went back): such a sample bounds
    /// nothing.
    #[must_use]
    pub fn offset(&self) -> Option<Offset> {
        (self.received_ms >= self.sent_ms).then(|| Offset {
            low_ms: ms(self.peer_ms) - ms(self.received_ms),
            high_ms: ms(self.peer_ms) - ms(self.sent_ms),
        })
    }

    fn width_ms(&self) -> u64 {
        self.received_ms - self.sent_ms
    }
}

/// What the samples say of this node's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// The cluster's clock is within the bound: the node coordinates and sweeps.
    Within {
        /// Where the cluster's clock is, relative to this node's.
        cluster: Offset,
    },
    /// The cluster's clock may be further than the bound: the node does neither.
    Beyond {
        /// Where the cluster's clock is, relative to this node's.
        cluster: Offset,
        /// The distance it had to be within (`SKEW_MAX / 2`, less the resume margin for a
        /// node that was already beyond).
        bound_ms: u64,
    },
    /// Fewer than a majority of members have a fresh sample: the cluster's clock is unknown,
    /// and the node does neither.
    Unmeasured {
        /// Members with a fresh sample, this node included.
        measured: usize,
        /// Members in all, this node included.
        members: usize,
    },
}

impl Standing {
    /// Whether the node may coordinate and sweep.
    #[must_use]
    pub fn coordinates(&self) -> bool {
        matches!(self, Standing::Within { .. })
    }
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Standing::Within { cluster } => write!(
                f,
                "the cluster's clock is {} ms from this node's (± {} ms), within {} ms",
                cluster.estimate_ms(),
                cluster.uncertainty_ms(),
                SKEW_MAX_MS / 2
            ),
            Standing::Beyond { cluster, bound_ms } => {
                let side = if cluster.estimate_ms() < 0 {
                    "ahead of"
                } else {
                    "behind"
                };
                write!(
                    f,
                    "this node's clock is {} ms {side} the cluster's median clock (± {} ms, so up \
                     to {} ms off), beyond the {bound_ms} ms it must be within",
                    cluster.estimate_ms().unsigned_abs(),
                    cluster.uncertainty_ms(),
                    cluster.distance_ms(),
                )?;
                if *bound_ms < SKEW_MAX_MS / 2 {
                    write!(
                        f,
                        " to resume (half of SKEW_MAX {SKEW_MAX_MS} ms, less the resume margin)"
                    )
                } else {
                    write!(f, " (half of SKEW_MAX {SKEW_MAX_MS} ms)")
                }
            }
            Standing::Unmeasured { measured, members } => write!(
                f,
                "this node's clock is unmeasured: {measured} of {members} members (this node \
                 included) answered a clock probe recently, fewer than a majority, so its skew \
                 against SKEW_MAX {SKEW_MAX_MS} ms is unknown"
            ),
        }
    }
}

/// The monitor of one node: its peers' recent samples and its standing.
#[derive(Clone, Debug)]
pub struct SkewMonitor {
    settings: SkewSettings,
    /// Every peer, with its latest samples (newest last).
    samples: BTreeMap<NodeId, VecDeque<Sample>>,
    /// Whether the last measured standing was beyond: the hysteresis latch, kept across
    /// unmeasured spells.
    was_beyond: bool,
}

impl SkewMonitor {
    /// A monitor of the clocks of `peers` (every other member), with nothing measured yet.
    #[must_use]
    pub fn new(peers: impl IntoIterator<Item = NodeId>, settings: SkewSettings) -> SkewMonitor {
        assert!(
            settings.resume_margin_ms < settings.skew_max_ms / 2,
            "a node can resume"
        );
        SkewMonitor {
            settings,
            samples: peers
                .into_iter()
                .map(|peer| (peer, VecDeque::new()))
                .collect(),
            was_beyond: false,
        }
    }

    /// Records a round trip to `peer` (a non-member's, or one that bounds nothing, is ignored).
    pub fn observe(&mut self, peer: NodeId, sample: Sample) {
        if sample.offset().is_none() {
            return;
        }
        if let Some(samples) = self.samples.get_mut(&peer) {
            if samples.len() == SAMPLES_PER_PEER {
                samples.pop_front();
            }
            samples.push_back(sample);
        }
    }

    /// The offset of `peer`'s clock from the tightest of its samples that are fresh at `now_ms`
    /// (no older than the age limit, and not from after `now_ms`: those mean this node's clock
    /// went back since).
    fn peer_offset(&self, samples: &VecDeque<Sample>, now_ms: u64) -> Option<Offset> {
        // Newest first, so that of equally tight samples the newest counts.
        samples
            .iter()
            .rev()
            .filter(|sample| {
                sample.received_ms <= now_ms
                    && now_ms - sample.received_ms <= self.settings.sample_age_max_ms
            })
            .min_by_key(|sample| sample.width_ms())
            .and_then(Sample::offset)
    }

    /// Each peer's offset from the tightest of its samples fresh at `now_ms` (`None`: no fresh
    /// sample, so the peer has not answered a probe within the age limit), in id order.
    #[must_use]
    pub fn peer_offsets(&self, now_ms: u64) -> Vec<(NodeId, Option<Offset>)> {
        self.samples
            .iter()
            .map(|(peer, samples)| (*peer, self.peer_offset(samples, now_ms)))
            .collect()
    }

    /// Where the cluster's clock is at `now_ms`, relative to this node's (`None`: fewer than a
    /// majority measured), and how many members were measured.
    fn cluster(&self, now_ms: u64) -> (Option<Offset>, usize) {
        let offsets: Vec<Option<Offset>> = std::iter::once(Some(Offset {
            low_ms: 0,
            high_ms: 0,
        }))
        .chain(
            self.samples
                .values()
                .map(|samples| self.peer_offset(samples, now_ms)),
        )
        .collect();
        let measured = offsets.iter().flatten().count();
        // The median is monotone in every value, so it lies between the median of the low ends
        // and the median of the high ends, an unmeasured peer being anywhere.
        let mut lows: Vec<Option<i64>> = offsets.iter().map(|o| o.map(|o| o.low_ms)).collect();
        let mut highs: Vec<Option<i64>> = offsets.iter().map(|o| o.map(|o| o.high_ms)).collect();
        // `None` sorts first: as a low end it is −∞, which is what is wanted.
        lows.sort_unstable();
        // As a high end `None` is +∞: sort it last.
        highs.sort_unstable_by_key(|high| (high.is_none(), *high));
        let median = offsets.len() / 2;
        let cluster = match (lows[median], highs[median]) {
            (Some(low_ms), Some(high_ms)) => Some(Offset { low_ms, high_ms }),
            _ => None,
        };
        (cluster, measured)
    }

    /// The standing at `now_ms` (spec/replication.md#clock-monitoring, *Assess*). Updates the
    /// hysteresis latch when the node is measured.
    pub fn assess(&mut self, now_ms: u64) -> Standing {
        let members = self.samples.len() + 1;
        let (cluster, measured) = self.cluster(now_ms);
        let Some(cluster) = cluster else {
            return Standing::Unmeasured { measured, members };
        };
        let half = self.settings.skew_max_ms / 2;
        let bound_ms = if self.was_beyond {
            half - self.settings.resume_margin_ms
        } else {
            half
        };
        self.was_beyond = cluster.distance_ms() > bound_ms;
        if self.was_beyond {
            Standing::Beyond { cluster, bound_ms }
        } else {
            Standing::Within { cluster }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    /// A round trip of `rtt_ms` that ended at `NOW` by this node's clock, to a peer `offset_ms`
    /// off, answering in the middle of it.
    fn trip(offset_ms: i64, rtt_ms: u64) -> Sample {
        let sent_ms = NOW - rtt_ms;
        let peer_ms = u64::try_from(ms(sent_ms) + ms(rtt_ms / 2) + offset_ms).unwrap();
        Sample {
            sent_ms,
            peer_ms,
            received_ms: NOW,
        }
    }

    fn of_peers(peers: u16) -> SkewMonitor {
        SkewMonitor::new((2..2 + peers).map(NodeId), SkewSettings::default())
    }

    #[test]
    fn a_round_trip_brackets_the_offset() {
        let sample = Sample {
            sent_ms: 1_000,
            peer_ms: 5_010,
            received_ms: 1_020,
        };
        let offset = sample.offset().unwrap();
        assert_eq!((offset.low_ms, offset.high_ms), (3_990, 4_010));
        assert_eq!(offset.estimate_ms(), 4_000);
        assert_eq!(offset.uncertainty_ms(), 10);
        assert_eq!(offset.distance_ms(), 4_010);
        let backwards = Sample {
            received_ms: 999,
            ..sample
        };
        assert_eq!(backwards.offset(), None);
    }

    #[test]
    fn nothing_measured_is_unmeasured_and_does_not_coordinate() {
        let mut monitor = of_peers(2);
        let standing = monitor.assess(NOW);
        assert_eq!(
            standing,
            Standing::Unmeasured {
                measured: 1,
                members: 3
            }
        );
        assert!(!standing.coordinates());
    }

    #[test]
    fn three_agreeing_clocks_coordinate() {
        let mut monitor = of_peers(2);
        monitor.observe(NodeId(2), trip(3, 2));
        monitor.observe(NodeId(3), trip(-4, 2));
        assert!(monitor.assess(NOW).coordinates());
    }

    #[test]
    fn a_node_ahead_of_both_peers_is_beyond_and_says_by_how_much() {
        let mut monitor = of_peers(2);
        monitor.observe(NodeId(2), trip(-600, 2));
        monitor.observe(NodeId(3), trip(-610, 2));
        let standing = monitor.assess(NOW);
        let Standing::Beyond { cluster, bound_ms } = standing else {
            panic!("{standing:?}");
        };
        assert_eq!(bound_ms, 250);
        assert_eq!(cluster.estimate_ms(), -600);
        let said = standing.to_string();
        assert!(said.contains("600 ms ahead of"), "{said}");
        assert!(said.contains("SKEW_MAX 500 ms"), "{said}");
    }

    #[test]
    fn one_peer_off_is_that_peers_problem() {
        // The peer 2 s ahead sees both others behind it and stops; this node goes on.
        let mut monitor = of_peers(2);
        monitor.observe(NodeId(2), trip(2_000, 2));
        monitor.observe(NodeId(3), trip(1, 2));
        assert!(monitor.assess(NOW).coordinates());
        let mut wrong = of_peers(2);
        wrong.observe(NodeId(2), trip(-2_000, 2));
        wrong.observe(NodeId(3), trip(-1_999, 2));
        assert!(matches!(wrong.assess(NOW), Standing::Beyond { .. }));
    }

    #[test]
    fn two_nodes_that_disagree_without_the_third_both_stop() {
        // Each sees only the other, 300 ms away: the median of three may be anywhere between.
        let mut one = of_peers(2);
        one.observe(NodeId(2), trip(300, 2));
        let mut other = of_peers(2);
        other.observe(NodeId(2), trip(-300, 2));
        assert!(matches!(one.assess(NOW), Standing::Beyond { .. }));
        assert!(matches!(other.assess(NOW), Standing::Beyond { .. }));
        // Within the bound of each other, one peer is enough.
        let mut close = of_peers(2);
        close.observe(NodeId(2), trip(100, 2));
        assert!(close.assess(NOW).coordinates());
    }

    #[test]
    fn a_slow_round_trip_counts_against_the_node() {
        // The peer's clock is exact, but a 600 ms round trip cannot show it within 250 ms.
        let mut monitor = of_peers(2);
        monitor.observe(NodeId(2), trip(0, 600));
        monitor.observe(NodeId(3), trip(0, 600));
        assert!(matches!(monitor.assess(NOW), Standing::Beyond { .. }));
        // One tight answer among the last few is enough.
        monitor.observe(NodeId(2), trip(0, 2));
        monitor.observe(NodeId(3), trip(0, 2));
        monitor.observe(NodeId(2), trip(0, 600));
        monitor.observe(NodeId(3), trip(0, 600));
        assert!(matches!(monitor.assess(NOW), Standing::Within { .. }));
    }

    #[test]
    fn a_node_that_stopped_resumes_only_well_inside_the_bound() {
        let mut monitor = of_peers(2);
        let mut at = |offset: i64| {
            monitor.observe(NodeId(2), trip(offset, 0));
            monitor.observe(NodeId(3), trip(offset, 0));
            monitor.assess(NOW)
        };
        assert!(at(240).coordinates(), "never beyond: the bound is 250");
        assert!(!at(260).coordinates());
        assert!(!at(240).coordinates(), "beyond: the bound is now 200");
        assert!(!at(201).coordinates());
        assert!(at(200).coordinates());
        assert!(
            at(240).coordinates(),
            "within again: the bound is 250 again"
        );
    }

    #[test]
    fn the_latch_holds_across_an_unmeasured_spell() {
        let mut monitor = of_peers(2);
        monitor.observe(NodeId(2), trip(300, 0));
        monitor.observe(NodeId(3), trip(300, 0));
        assert!(!monitor.assess(NOW).coordinates());
        let later = NOW + 10_000;
        assert!(matches!(monitor.assess(later), Standing::Unmeasured { .. }));
        let fresh = |offset: i64| Sample {
            sent_ms: later,
            peer_ms: u64::try_from(ms(later) + offset).unwrap(),
            received_ms: later,
        };
        monitor.observe(NodeId(2), fresh(230));
        monitor.observe(NodeId(3), fresh(230));
        assert!(!monitor.assess(later).coordinates());
    }

    #[test]
    fn old_samples_and_samples_from_the_future_count_for_nothing() {
        let mut monitor = of_peers(2);
        monitor.observe(NodeId(2), trip(0, 2));
        monitor.observe(NodeId(3), trip(0, 2));
        assert!(monitor.assess(NOW + 3_000).coordinates());
        assert!(matches!(
            monitor.assess(NOW + 3_001),
            Standing::Unmeasured { measured: 1, .. }
        ));
        // This node's clock stepped back: what it measured before is not about the clock it has.
        assert!(matches!(
            monitor.assess(NOW - 1),
            Standing::Unmeasured { measured: 1, .. }
        ));
    }

    #[test]
    fn five_members_need_a_majority_measured() {
        let mut monitor = of_peers(4);
        monitor.observe(NodeId(2), trip(10, 2));
        assert!(matches!(
            monitor.assess(NOW),
            Standing::Unmeasured {
                measured: 2,
                members: 5
            }
        ));
        monitor.observe(NodeId(3), trip(-10, 2));
        assert!(monitor.assess(NOW).coordinates());
        // Two wrong clocks of five do not stop the three right ones.
        monitor.observe(NodeId(4), trip(5_000, 2));
        monitor.observe(NodeId(5), trip(-5_000, 2));
        assert!(monitor.assess(NOW).coordinates());
    }

    #[test]
    fn samples_of_non_members_are_ignored() {
        let mut monitor = of_peers(2);
        monitor.observe(NodeId(9), trip(0, 2));
        assert!(matches!(
            monitor.assess(NOW),
            Standing::Unmeasured { measured: 1, .. }
        ));
    }

    proptest! {
        /// The page's guarantee: whatever the clocks and the round trips, two nodes that both
        /// coordinate have true clocks within SKEW_MAX of each other.
        #[test]
        fn two_coordinating_nodes_are_within_skew_max(
            clocks in prop::collection::vec(-2_000i64..2_000, 3..=5),
            trips in prop::collection::vec((0u64..400, 0u64..=100), 25),
            reachable in prop::collection::vec(any::<bool>(), 25),
        ) {
            let n = clocks.len();
            let mut coordinating = Vec::new();
            for me in 0..n {
                let peers = (0..n).filter(|other| *other != me);
                let mut monitor = SkewMonitor::new(
                    peers.clone().map(|p| NodeId(u16::try_from(p).unwrap())),
                    SkewSettings::default(),
                );
                for other in peers {
                    let slot = me * 5 + other;
                    if !reachable[slot] {
                        continue;
                    }
                    let (rtt, at_percent) = trips[slot];
                    // Real time 0 is NOW - rtt; the peer answers at `at_percent` of the trip.
                    let real_sent = ms(NOW) - ms(rtt);
                    let real_answer = real_sent + ms(rtt * at_percent / 100);
                    let sample = Sample {
                        sent_ms: u64::try_from(real_sent + clocks[me]).unwrap(),
                        peer_ms: u64::try_from(real_answer + clocks[other]).unwrap(),
                        received_ms: u64::try_from(ms(NOW) + clocks[me]).unwrap(),
                    };
                    monitor.observe(NodeId(u16::try_from(other).unwrap()), sample);
                }
                let now = u64::try_from(ms(NOW) + clocks[me]).unwrap();
                if monitor.assess(now).coordinates() {
                    coordinating.push(clocks[me]);
                }
            }
            for a in &coordinating {
                for b in &coordinating {
                    prop_assert!((a - b).unsigned_abs() <= SKEW_MAX_MS, "{clocks:?}");
                }
            }
        }
    }
}
