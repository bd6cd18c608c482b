//! The replicated record of one message in one queue, and its merge (spec/replication.md#the-record).
//!
//! A record is a join-semilattice: replicas that have seen the same set of writes hold the same
//! record whatever order the writes arrived in. This module owns the order and the merge; it must
//! never look at time, replicas or the network.

use serde::{Deserialize, Serialize};

/// A claim: one receive's receipt handle as the replicas know it.
///
/// Ordered by `seq` first, so a later receive always supersedes an earlier one; two coordinators
/// that pick the same `seq` concurrently are told apart (and totally ordered) by `coordinator`.
/// `seq` is the claim's version within its generation, and a handle is valid by its version
/// (spec/replication.md#delete): `coordinator` only makes the merge's order total. The real lease
/// orders `(seq, change counter, deadline)` before the claim's identity; this model has no
/// deadlines (every claim may have expired), so its order is that one with the deadline left out.
/// The real handle also carries a random nonce after `coordinator`; the model leaves it out
/// (spec/replication.md#model-bounds).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Claim {
    /// Receive sequence number within the message's life in this queue, from 1.
    pub seq: u8,
    /// The coordinator that issued the claim.
    pub coordinator: u8,
}

/// What a replica knows about the message in one life (generation) in this queue.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Body {
    /// Nothing known: never written, or the tombstone was collected.
    #[default]
    Absent,
    /// The message is in the queue. `claim` is the newest receive (`None`: never received in this
    /// life); whether that claim's visibility timeout has passed is decided by a coordinator's
    /// clock, not stored here.
    Live {
        claim: Option<Claim>,
        receive_count: u8,
    },
    /// The message left this life: deleted with its current handle, or moved to another queue.
    Tombstone,
}

/// The record of one message in one queue on one replica.
///
/// `generation` counts the lives of the message across queues: it is 0 when sent, and every
/// dead-letter move or redrive adds one, so a copy that comes back to a queue it left is newer
/// than the tombstone it left behind.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Record {
    /// The life of the message this record is about.
    pub generation: u8,
    /// What the replica knows about that life.
    pub body: Body,
}

/// How replicas merge. The correct rules are [`MergeRules::CORRECT`]; the others exist so the
/// model can show that each rule is load-bearing (planted bugs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MergeRules {
    /// A tombstone wins over every live copy of its generation.
    pub tombstone_dominant: bool,
    /// Receive counts merge by max; otherwise the copy being merged in wins (last writer).
    pub receive_count_by_max: bool,
}

impl MergeRules {
    /// The rules of spec/replication.md#the-record.
    pub const CORRECT: MergeRules = MergeRules {
        tombstone_dominant: true,
        receive_count_by_max: true,
    };
}

impl Record {
    /// A live copy with no claim yet.
    pub fn ready(generation: u8, receive_count: u8) -> Record {
        Record {
            generation,
            body: Body::Live {
                claim: None,
                receive_count,
            },
        }
    }

    /// A live copy held by `claim`.
    pub fn claimed(generation: u8, claim: Claim, receive_count: u8) -> Record {
        Record {
            generation,
            body: Body::Live {
                claim: Some(claim),
                receive_count,
            },
        }
    }

    /// The tombstone of `generation`.
    pub fn tombstone(generation: u8) -> Record {
        Record {
            generation,
            body: Body::Tombstone,
        }
    }

    /// Whether the message is in the queue (claimed or not).
    pub fn is_live(&self) -> bool {
        matches!(self.body, Body::Live { .. })
    }

    /// Whether the record is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.body == Body::Tombstone
    }

    /// The current claim, if the record is live and was received in this life.
    pub fn claim(&self) -> Option<Claim> {
        match self.body {
            Body::Live { claim, .. } => claim,
            _ => None,
        }
    }

    /// The receive count, if the record is live.
    pub fn receive_count(&self) -> Option<u8> {
        match self.body {
            Body::Live { receive_count, .. } => Some(receive_count),
            _ => None,
        }
    }

    /// The join of `self` (what a replica holds) and `incoming` (what a write or a peer brings).
    ///
    /// With [`MergeRules::CORRECT`] this is commutative, associative and idempotent: a later
    /// generation wins whole; within a generation `Absent < Live < Tombstone`, and two live
    /// copies take the greater claim and the greater receive count independently.
    #[must_use]
    pub fn merge(self, incoming: Record, rules: MergeRules) -> Record {
        if self.generation != incoming.generation {
            return if self.generation > incoming.generation {
                self
            } else {
                incoming
            };
        }
        let generation = self.generation;
        let body = match (self.body, incoming.body) {
            (Body::Absent, other) | (other, Body::Absent) => other,
            (Body::Tombstone, Body::Tombstone) => Body::Tombstone,
            (Body::Tombstone, live @ Body::Live { claim, .. })
            | (live @ Body::Live { claim, .. }, Body::Tombstone) => {
                // The planted bug lets a received copy outrank the tombstone.
                if rules.tombstone_dominant || claim.is_none() {
                    Body::Tombstone
                } else {
                    live
                }
            }
            (
                Body::Live {
                    claim: claim_held,
                    receive_count: count_held,
                },
                Body::Live {
                    claim: claim_incoming,
                    receive_count: count_incoming,
                },
            ) => Body::Live {
                claim: claim_held.max(claim_incoming),
                receive_count: if rules.receive_count_by_max {
                    count_held.max(count_incoming)
                } else {
                    count_incoming
                },
            },
        };
        Record { generation, body }
    }

    /// The lattice order under the correct merge: `self ≤ other` when merging `self` into
    /// `other` changes nothing.
    pub fn le(&self, other: &Record) -> bool {
        other.merge(*self, MergeRules::CORRECT) == *other
    }
}

/// The join of a set of records under the correct rules (bottom: [`Record::default`]).
pub fn join_all(records: impl IntoIterator<Item = Record>) -> Record {
    records
        .into_iter()
        .fold(Record::default(), |held, incoming| {
            held.merge(incoming, MergeRules::CORRECT)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim() -> impl Strategy<Value = Claim> {
        (1u8..4, 0u8..2).prop_map(|(seq, coordinator)| Claim { seq, coordinator })
    }

    fn record() -> impl Strategy<Value = Record> {
        let body = prop_oneof![
            Just(Body::Absent),
            Just(Body::Tombstone),
            (proptest::option::of(claim()), 0u8..4).prop_map(|(claim, receive_count)| Body::Live {
                claim,
                receive_count
            }),
        ];
        (0u8..3, body).prop_map(|(generation, body)| Record { generation, body })
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in record(), b in record()) {
            prop_assert_eq!(a.merge(b, MergeRules::CORRECT), b.merge(a, MergeRules::CORRECT));
        }

        #[test]
        fn merge_is_associative(a in record(), b in record(), c in record()) {
            let rules = MergeRules::CORRECT;
            prop_assert_eq!(a.merge(b, rules).merge(c, rules), a.merge(b.merge(c, rules), rules));
        }

        #[test]
        fn merge_is_idempotent(a in record(), b in record()) {
            let rules = MergeRules::CORRECT;
            prop_assert_eq!(a.merge(a, rules), a);
            let joined = a.merge(b, rules);
            prop_assert_eq!(joined.merge(b, rules), joined);
        }

        #[test]
        fn merge_is_an_upper_bound(a in record(), b in record()) {
            let joined = a.merge(b, MergeRules::CORRECT);
            prop_assert!(a.le(&joined));
            prop_assert!(b.le(&joined));
        }

        #[test]
        fn tombstone_dominates_its_generation(a in record()) {
            let tombstone = Record::tombstone(a.generation);
            prop_assert_eq!(a.merge(tombstone, MergeRules::CORRECT), tombstone);
        }
    }

    #[test]
    fn last_writer_receive_count_breaks_commutativity() {
        // The planted rule `receive_count_by_max: false` is not a semilattice: the laws above
        // would catch it, and the model shows what it costs (a receive count going down).
        let rules = MergeRules {
            receive_count_by_max: false,
            ..MergeRules::CORRECT
        };
        let older = Record::ready(0, 1);
        let newer = Record::ready(0, 2);
        assert_ne!(older.merge(newer, rules), newer.merge(older, rules));
        assert_eq!(newer.merge(older, rules).receive_count(), Some(1));
    }

    #[test]
    fn later_generation_outranks_tombstone() {
        let left = Record::tombstone(0);
        let back = Record::ready(2, 0);
        assert_eq!(left.merge(back, MergeRules::CORRECT), back);
        assert!(left.le(&back));
    }
}
