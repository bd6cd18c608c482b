//! The record a replica stores for one message in one queue, and its merge
//! (spec/replication.md#the-record and §12 *The stored record on a replica*).
//!
//! The merge is a join: commutative, associative and idempotent, so replicas that have seen the
//! same writes hold the same record whatever order the writes came in. It is partial in one
//! place only: two writes of one generation whose once-fields differ are a bug in a writer, and
//! the merge reports a [`Divergence`] instead of choosing (§12, *Considerations*). This module
//! owns the order and the merge; it must never look at time, replicas or the network.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use trireme_core::{Incarnation, Millis, QueueName};

use crate::ids::{Generation, NodeId};
use crate::planted::{Bug, planted};

/// The replicated form of a receipt handle: one receive of one generation.
///
/// Ordered by `seq` first, so a later receive supersedes an earlier one; two coordinators that
/// pick the same `seq` at once are told apart by `coordinator`, and one coordinator's two claims
/// of one `seq` by `nonce` (spec/replication.md#the-record). `(generation, seq)` is the claim's
/// version: at most one claim of a version is delivered, so a handle is valid by its version
/// ([`Claim::same_version`]) and the identity only tells claims apart.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Claim {
    /// Receives of this generation, from 1.
    pub seq: u32,
    /// The coordinator that issued the claim.
    pub coordinator: NodeId,
    /// Drawn by the coordinator for every claim it issues.
    pub nonce: u64,
}

impl Claim {
    /// Whether `self` and `other` (of one generation) are claims of one version: the same `seq`.
    /// One of them at most was delivered; the others lost the race for it and nobody holds them
    /// (spec/replication.md#delete, step 4).
    #[must_use]
    pub fn same_version(&self, other: &Claim) -> bool {
        self.seq == other.seq
    }
}

/// The current claim with the visibility it rides with (§12: `received_at_ms`, `deadline_ms`
/// and `change_counter` ride with the claim): the claim's lease.
///
/// Ordered by `(seq, change_counter, deadline)`, then by the claim's `(coordinator, nonce)` and
/// `received_at`, which only make the order total (spec/replication.md#the-record): a later
/// receive wins; within one version, the later change (higher counter); for one version and
/// counter, the later deadline, whichever claim of that `seq` it belongs to. So a claim that lost
/// the race for a version, left on one replica, can make the message later but never outranks the
/// holder's changes nor shortens its deadline (F1). It is a total order, so the greater of two is
/// a join.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Held {
    /// The receive this is.
    pub claim: Claim,
    /// Visibility changes of this claim so far (0 at the receive).
    pub change_counter: u32,
    /// When the message becomes visible again, by the clock of the coordinator that wrote it.
    pub deadline: Millis,
    /// When the receive that made the claim happened: the 12-hour visibility cap counts from it.
    pub received_at: Millis,
}

impl Held {
    /// The lease's place in the merge's order (spec/replication.md#the-record): every field, the
    /// claim's identity after the version, counter and deadline.
    fn order_key(&self) -> (u32, u32, Millis, NodeId, u64, Millis) {
        (
            self.claim.seq,
            self.change_counter,
            self.deadline,
            self.claim.coordinator,
            self.claim.nonce,
            self.received_at,
        )
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Held) -> std::cmp::Ordering {
        self.order_key().cmp(&other.order_key())
    }
}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Held) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A dead-letter copy's source: the queue (and which creation of it) the message left.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourceQueue {
    /// The queue's name.
    pub name: QueueName,
    /// Which creation of the name.
    pub incarnation: Incarnation,
}

/// The fields written once per generation (§12, "once"): every writer of a generation derives
/// them from the same inputs, so every replica holding the generation holds the same value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Birth {
    /// Body and message attributes, encoded by the node; opaque here. Serialized as bytes
    /// ([`payload_bytes`]): the same encoding as a sequence of `u8`, taken in one piece.
    #[serde(with = "payload_bytes")]
    pub payload: Vec<u8>,
    /// The original send (retention counts from it, across moves).
    pub sent_at: Millis,
    /// The delay's end; `Millis(0)` for none.
    pub visible_from: Millis,
    /// For a dead-letter copy, the queue it came from (boxed: most records have none).
    pub source_queue: Option<Box<SourceQueue>>,
    /// The send's deduplication id, if it had one.
    pub dedup_id: Option<String>,
}

/// A payload's serialization as serde bytes instead of serde's default for `Vec<u8>`, a
/// sequence visited one `u8` at a time: in bincode (the node's codec) both are the length and
/// then the bytes, so records stored or sent before read the same, but the bytes are copied in
/// one piece. A format that has no bytes (JSON) gives and takes the same sequence of numbers as
/// before. Profiled on the dev cluster's consume, the byte-by-byte visitor was 7 % of the
/// replica committers' CPU samples, with more in the allocator as the vector grew.
mod payload_bytes {
    use std::fmt;

    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    /// At most this many bytes are reserved ahead of a sequence's elements.
    const RESERVE_MAX: usize = 64 * 1024;

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(Bytes)
    }

    struct Bytes;

    impl<'de> Visitor<'de> for Bytes {
        type Value = Vec<u8>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a payload's bytes")
        }

        fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
            Ok(bytes.to_vec())
        }

        fn visit_byte_buf<E>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(bytes)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(RESERVE_MAX));
            while let Some(byte) = seq.next_element()? {
                bytes.push(byte);
            }
            Ok(bytes)
        }
    }
}

/// Where a copy of generation 0 of a send with a deduplication id stands (spec/replication.md
/// §4, *Records it adds*): written *held* (stored with its body, never receivable), then made
/// *ready* by a coordinator that saw two replicas name the message, or *void* when the id named
/// another message. Merged by the greater, `Held < Void < Ready`: a void never hides a copy some
/// coordinator confirmed, and a late held write never brings a void copy back. Every other copy
/// (no deduplication id, and every later generation: moves and redrives copy only ready
/// messages) is `Ready`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Settle {
    /// Stored, waiting for its deduplication id to be decided: never received, moved or counted.
    Held,
    /// Its deduplication id named another message: never received, moved or counted.
    Void,
    /// In the queue (part 1's live copy).
    #[default]
    Ready,
}

/// A message that is in the queue in this generation, received or not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Live {
    /// What the generation was born with.
    pub birth: Birth,
    /// When this generation entered this queue (send, move or redrive): the latest writer's
    /// stamp (spec/replication.md §2, *What a mover's stamp must be*).
    pub entered_at: Millis,
    /// The purge mark: the greatest purge watermark a replica's sweep found hiding this record
    /// (spec/replication.md §2). The record reads as gone while `entered_at` is at or below it.
    pub hidden_through: Option<Millis>,
    /// The newest receive of this generation, if any.
    pub held: Option<Held>,
    /// Receives of this generation: merged by max, never by last writer.
    pub receive_count: u32,
    /// The first receive of the message, kept across moves.
    pub first_received_at: Option<Millis>,
    /// Held, void or ready (spec/replication.md §4): merged by the greater.
    pub settle: Settle,
}

/// Why a generation ended. The order decides which reason a merge keeps (the first); nothing
/// but operators and metrics reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TombstoneReason {
    /// Deleted with its current receipt handle.
    Deleted,
    /// Moved to another queue (dead-letter move, dead-letter now, redrive).
    Moved,
    /// Past the queue's retention period.
    Expired,
    /// Hidden by a purge.
    Purged,
}

/// The end of a generation. It dominates every live copy of its generation for as long as it
/// exists (spec/replication.md#tombstones-and-their-collection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tombstone {
    /// Why the generation ended.
    pub reason: TombstoneReason,
    /// When, by the earliest writer's clock.
    pub at: Millis,
}

/// What a replica knows about one generation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Body {
    /// The message is in the queue.
    Live(Live),
    /// The generation ended.
    Tombstone(Tombstone),
}

/// The record of one message in one queue on one replica. `Absent` (never written, or
/// collected) is the record not being there: callers hold an `Option<Record>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Record {
    /// The life of the message this record is about.
    pub generation: Generation,
    /// What the replica knows about that life.
    pub body: Body,
}

/// Two writes of one generation disagree on a field that is written once per generation.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("generation {generation} was written twice with different once-fields")]
pub struct Divergence {
    /// The generation whose writers disagree.
    pub generation: u32,
}

impl Record {
    /// A message just sent (generation 0, never received).
    #[must_use]
    pub fn sent(birth: Birth) -> Record {
        let entered_at = birth.sent_at;
        Record {
            generation: Generation(0),
            body: Body::Live(Live {
                birth,
                entered_at,
                hidden_through: None,
                held: None,
                receive_count: 0,
                first_received_at: None,
                settle: Settle::Ready,
            }),
        }
    }

    /// A message just sent with a deduplication id (spec/replication.md §4, *Send* step 1):
    /// generation 0, held until its id is decided.
    #[must_use]
    pub fn sent_held(birth: Birth) -> Record {
        assert!(
            birth.dedup_id.is_some(),
            "only a send with a deduplication id is held"
        );
        let mut record = Record::sent(birth);
        if let Body::Live(live) = &mut record.body {
            live.settle = Settle::Held;
        }
        record
    }

    /// The same copy made void (spec/replication.md §4, *Send* step 4: the loser's copy).
    #[must_use]
    pub fn voided(&self) -> Record {
        let mut record = self.clone();
        if let Body::Live(live) = &mut record.body {
            assert_eq!(live.settle, Settle::Held, "only a held copy is voided");
            live.settle = Settle::Void;
        }
        record
    }

    /// The tombstone of `generation`.
    #[must_use]
    pub fn tombstone(generation: Generation, reason: TombstoneReason, at: Millis) -> Record {
        Record {
            generation,
            body: Body::Tombstone(Tombstone { reason, at }),
        }
    }

    /// The live body, if the message is in the queue.
    #[must_use]
    pub fn live(&self) -> Option<&Live> {
        match &self.body {
            Body::Live(live) => Some(live),
            Body::Tombstone(_) => None,
        }
    }

    /// Whether the record is a tombstone.
    #[must_use]
    pub fn is_tombstone(&self) -> bool {
        matches!(self.body, Body::Tombstone(_))
    }

    /// Whether the record reads as gone: live, but hidden by its purge mark or by the queue's
    /// purge watermark `watermark` as the reader knows it (spec/replication.md §2).
    #[must_use]
    pub fn hidden(&self, watermark: Option<Millis>) -> bool {
        self.live().is_some_and(|live| {
            live.hidden_through
                .max(watermark)
                .is_some_and(|through| live.entered_at <= through)
        })
    }

    /// Whether the record is live and ready: neither held nor void (spec/replication.md §4). A
    /// held or void copy is never received, moved or counted, as if it were not stored.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.live().is_some_and(|live| live.settle == Settle::Ready)
    }

    /// Whether collection may drop the record once all three replicas hold it and the horizon
    /// has passed: a tombstone, or a live record its own purge mark hides
    /// (spec/replication.md#tombstones-and-their-collection and §2, *Sweep*).
    #[must_use]
    pub fn collectable(&self) -> bool {
        self.is_tombstone() || self.hidden(None)
    }

    /// What a replica's sweep writes for this record under the queue's watermark `watermark` as
    /// the node knows it (spec/replication.md §2, *Sweep*): the record with its purge mark
    /// raised to the watermark, if it is live, entered at or below it and not yet marked
    /// through it; `None` when there is nothing to mark. Never a tombstone: a later mover's
    /// copy of the generation, entered above the mark, merges into a record that is live again
    /// (planted bug `PurgeWritesTombstone` of the lifecycle model).
    #[must_use]
    pub fn swept(&self, watermark: Option<Millis>) -> Option<Record> {
        let through = watermark?;
        let live = self.live()?;
        if live.entered_at > through || live.hidden_through >= Some(through) {
            return None;
        }
        let mut marked = self.clone();
        if let Body::Live(live) = &mut marked.body {
            live.hidden_through = Some(through);
        }
        Some(marked)
    }

    /// The current claim, if the record is live and was received in this generation.
    #[must_use]
    pub fn claim(&self) -> Option<Claim> {
        self.live()
            .and_then(|live| live.held)
            .map(|held| held.claim)
    }

    /// The join of `self` (what a replica holds) and `incoming` (what a write or a peer brings).
    ///
    /// A later generation wins whole; within a generation a tombstone wins over a live copy;
    /// two tombstones keep the first reason and the earliest time; two live copies keep the
    /// greater lease (the order of [`Held`]), the greater receive count and purge mark, the
    /// latest entry, the earliest first receive and the greater [`Settle`] (`Held < Void <
    /// Ready`, so for generation 0 of a send with a deduplication id the order is `Absent <
    /// held < void < ready < Tombstone`).
    ///
    /// # Errors
    /// [`Divergence`] when two live copies of one generation carry different once-fields.
    pub fn merge(&self, incoming: &Record) -> Result<Record, Divergence> {
        if self.generation != incoming.generation {
            return Ok(if self.generation > incoming.generation {
                self.clone()
            } else {
                incoming.clone()
            });
        }
        let body = match (&self.body, &incoming.body) {
            (Body::Tombstone(a), Body::Tombstone(b)) => Body::Tombstone(Tombstone {
                reason: a.reason.min(b.reason),
                at: a.at.min(b.at),
            }),
            (Body::Tombstone(_), Body::Live(live)) if planted(Bug::TombstoneNotDominant) => {
                Body::Live(live.clone())
            }
            (Body::Tombstone(t), Body::Live(_)) | (Body::Live(_), Body::Tombstone(t)) => {
                Body::Tombstone(*t)
            }
            (Body::Live(a), Body::Live(b)) => {
                if a.birth != b.birth {
                    return Err(Divergence {
                        generation: self.generation.0,
                    });
                }
                Body::Live(Live {
                    birth: a.birth.clone(),
                    entered_at: a.entered_at.max(b.entered_at),
                    hidden_through: a.hidden_through.max(b.hidden_through),
                    held: if planted(Bug::WholeClaimFirst) {
                        whole_claim_first(a.held, b.held)
                    } else {
                        a.held.max(b.held)
                    },
                    receive_count: a.receive_count.max(b.receive_count),
                    first_received_at: earliest(a.first_received_at, b.first_received_at),
                    settle: a.settle.max(b.settle),
                })
            }
        };
        Ok(Record {
            generation: self.generation,
            body,
        })
    }

    /// Whether `self` already holds everything `other` knows (merging `other` in changes
    /// nothing). A diverged pair covers neither way.
    #[must_use]
    pub fn covers(&self, other: &Record) -> bool {
        self.merge(other).is_ok_and(|joined| joined == *self)
    }
}

/// The join of what two replicas hold, either of which may hold nothing.
///
/// # Errors
/// [`Divergence`] as [`Record::merge`].
pub fn merge_held(
    held: Option<&Record>,
    incoming: Option<&Record>,
) -> Result<Option<Record>, Divergence> {
    match (held, incoming) {
        (None, None) => Ok(None),
        (Some(one), None) | (None, Some(one)) => Ok(Some(one.clone())),
        (Some(a), Some(b)) => a.merge(b).map(Some),
    }
}

/// Whether `held` (possibly nothing) already covers `incoming` (possibly nothing).
#[must_use]
pub fn covers(held: Option<&Record>, incoming: Option<&Record>) -> bool {
    match (held, incoming) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a.covers(b),
    }
}

/// The lease order before F1 (planted bug `WholeClaimFirst` only): the whole claim first.
fn whole_claim_first(a: Option<Held>, b: Option<Held>) -> Option<Held> {
    let key = |h: &Held| (h.claim, h.change_counter, h.deadline, h.received_at);
    match (a, b) {
        (Some(a), Some(b)) => Some(if key(&b) > key(&a) { b } else { a }),
        (one, None) | (None, one) => one,
    }
}

fn earliest(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (one, None) | (None, one) => one,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Once-fields derived from the generation alone, as every correct writer derives them.
    fn birth(generation: u32) -> Birth {
        Birth {
            payload: vec![7, generation as u8],
            sent_at: Millis(1_000),
            visible_from: Millis(if generation == 0 { 1_500 } else { 0 }),
            source_queue: None,
            dedup_id: None,
        }
    }

    fn held() -> impl Strategy<Value = Held> {
        (1u32..4, 0u16..3, 0u64..2, 0u32..3, 0u64..3, 0u64..2).prop_map(
            |(seq, coordinator, nonce, change_counter, deadline, received_at)| Held {
                claim: Claim {
                    seq,
                    coordinator: NodeId(coordinator),
                    nonce,
                },
                change_counter,
                deadline: Millis(deadline),
                received_at: Millis(received_at),
            },
        )
    }

    fn record() -> impl Strategy<Value = Record> {
        let reason = prop_oneof![
            Just(TombstoneReason::Deleted),
            Just(TombstoneReason::Moved),
            Just(TombstoneReason::Expired),
            Just(TombstoneReason::Purged),
        ];
        let tombstone = (reason, 0u64..3).prop_map(|(reason, at)| Tombstone {
            reason,
            at: Millis(at),
        });
        let settle = prop_oneof![Just(Settle::Held), Just(Settle::Void), Just(Settle::Ready)];
        (0u32..3, any::<bool>(), tombstone, live_parts(), settle).prop_map(
            |(generation, ended, tombstone, (entered_at, held, receive_count, first), settle)| {
                let body = if ended {
                    Body::Tombstone(tombstone)
                } else {
                    Body::Live(Live {
                        birth: birth(generation),
                        entered_at: Millis(entered_at),
                        hidden_through: (entered_at % 2 == 1).then_some(Millis(1)),
                        held,
                        receive_count,
                        first_received_at: first.map(Millis),
                        // Only generation 0 of a send with a deduplication id is ever held or
                        // void (spec/replication.md §4).
                        settle: if generation == 0 {
                            settle
                        } else {
                            Settle::Ready
                        },
                    })
                };
                Record {
                    generation: Generation(generation),
                    body,
                }
            },
        )
    }

    fn live_parts() -> impl Strategy<Value = (u64, Option<Held>, u32, Option<u64>)> {
        (
            0u64..3,
            proptest::option::of(held()),
            0u32..4,
            proptest::option::of(0u64..3),
        )
    }

    fn record_or_absent() -> impl Strategy<Value = Option<Record>> {
        proptest::option::of(record())
    }

    fn join(a: &Option<Record>, b: &Option<Record>) -> Option<Record> {
        merge_held(a.as_ref(), b.as_ref()).expect("births derive from the generation alone")
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in record_or_absent(), b in record_or_absent()) {
            prop_assert_eq!(join(&a, &b), join(&b, &a));
        }

        #[test]
        fn merge_is_associative(
            a in record_or_absent(), b in record_or_absent(), c in record_or_absent()
        ) {
            prop_assert_eq!(join(&join(&a, &b), &c), join(&a, &join(&b, &c)));
        }

        #[test]
        fn merge_is_idempotent(a in record_or_absent(), b in record_or_absent()) {
            prop_assert_eq!(join(&a, &a), a.clone());
            let joined = join(&a, &b);
            prop_assert_eq!(join(&joined, &b), joined);
        }

        #[test]
        fn merge_is_an_upper_bound(a in record_or_absent(), b in record_or_absent()) {
            let joined = join(&a, &b);
            prop_assert!(covers(joined.as_ref(), a.as_ref()));
            prop_assert!(covers(joined.as_ref(), b.as_ref()));
        }

        #[test]
        fn tombstone_dominates_its_generation(a in record()) {
            let tombstone = Record::tombstone(a.generation, TombstoneReason::Purged, Millis(9));
            let joined = a.merge(&tombstone).unwrap();
            prop_assert!(joined.is_tombstone());
        }

        #[test]
        fn receive_count_never_goes_down(a in record(), b in record()) {
            let joined = a.merge(&b).unwrap();
            if a.generation == joined.generation && let (Some(before), Some(after)) = (a.live(), joined.live()) {
                prop_assert!(after.receive_count >= before.receive_count);
            }
        }
    }

    proptest! {
        /// spec/replication.md §4: `Absent < held < void < ready < Tombstone` for generation 0.
        #[test]
        fn a_void_never_hides_a_ready_copy_and_never_goes_back_to_held(
            a in record(), b in record()
        ) {
            let joined = a.merge(&b).unwrap();
            if a.generation == joined.generation && let (Some(before), Some(after)) = (a.live(), joined.live()) {
                prop_assert!(after.settle >= before.settle);
            }
            if a.ready() && joined.generation == a.generation {
                prop_assert!(joined.ready() || joined.is_tombstone());
            }
        }
    }

    fn held_copy() -> Record {
        let mut birth = birth(0);
        birth.dedup_id = Some("order-17".to_owned());
        Record::sent_held(birth)
    }

    #[test]
    fn the_settle_order_is_held_void_ready_tombstone() {
        let held = held_copy();
        let void = held.voided();
        let mut ready = held.clone();
        if let Body::Live(live) = &mut ready.body {
            live.settle = Settle::Ready;
        }
        let tombstone = Record::tombstone(Generation(0), TombstoneReason::Deleted, Millis(9));
        let order = [held, void, ready, tombstone];
        for (i, lower) in order.iter().enumerate() {
            for upper in &order[i..] {
                assert_eq!(&lower.merge(upper).unwrap(), upper);
                assert_eq!(&upper.merge(lower).unwrap(), upper);
            }
        }
        assert!(!order[0].ready() && !order[1].ready() && order[2].ready());
    }

    #[test]
    fn a_sweep_marks_what_the_watermark_hides_and_a_later_entry_is_live_again() {
        let mut entered = Record::sent(birth(1));
        entered.generation = Generation(1);
        if let Body::Live(live) = &mut entered.body {
            live.entered_at = Millis(2_000);
        }
        assert_eq!(entered.swept(None), None, "never purged");
        assert_eq!(
            entered.swept(Some(Millis(1_999))),
            None,
            "entered after the purge"
        );
        let marked = entered
            .swept(Some(Millis(2_000)))
            .expect("hidden at the watermark");
        assert_eq!(marked.live().unwrap().hidden_through, Some(Millis(2_000)));
        assert!(marked.hidden(None), "its own mark hides it");
        assert!(marked.collectable(), "collected as a tombstone is");
        assert!(!marked.is_tombstone());
        assert_eq!(marked.swept(Some(Millis(2_000))), None, "marked once");
        let raised = marked
            .swept(Some(Millis(5_000)))
            .expect("a later purge raises the mark");
        assert_eq!(raised.live().unwrap().hidden_through, Some(Millis(5_000)));
        // A second mover's copy of the generation, entered after the purge: live again.
        let mut later = entered.clone();
        if let Body::Live(live) = &mut later.body {
            live.entered_at = Millis(6_000);
        }
        let joined = raised.merge(&later).unwrap();
        assert!(!joined.hidden(None));
        assert!(!joined.collectable());
        let tombstone = Record::tombstone(Generation(1), TombstoneReason::Deleted, Millis(1));
        assert_eq!(tombstone.swept(Some(Millis(9_000))), None);
    }

    #[test]
    fn different_once_fields_diverge_instead_of_choosing() {
        let mut other = birth(0);
        other.payload.push(1);
        let a = Record::sent(birth(0));
        let b = Record::sent(other);
        assert_eq!(a.merge(&b), Err(Divergence { generation: 0 }));
        assert!(!a.covers(&b));
        assert!(!b.covers(&a));
    }

    #[test]
    fn later_generation_outranks_the_tombstone_it_left() {
        let left = Record::tombstone(Generation(0), TombstoneReason::Moved, Millis(5));
        let mut back = Record::sent(birth(2));
        back.generation = Generation(2);
        assert_eq!(left.merge(&back).unwrap(), back);
        assert!(back.covers(&left));
    }

    /// spec/replication.md F1: the holder's lease and a claim of the same `seq` that lost the race.
    #[test]
    fn a_rival_claim_of_one_seq_never_shortens_or_undoes_the_holder() {
        let lease = |coordinator, change_counter, deadline| {
            let mut record = Record::sent(birth(0));
            if let Body::Live(live) = &mut record.body {
                live.held = Some(Held {
                    claim: Claim {
                        seq: 1,
                        coordinator: NodeId(coordinator),
                        nonce: 5,
                    },
                    change_counter,
                    deadline: Millis(deadline),
                    received_at: Millis(10),
                });
                live.receive_count = 1;
            }
            record
        };
        // The rival's identity is greater and its deadline earlier: the holder's deadline stays.
        let (holder, rival) = (lease(1, 0, 300), lease(2, 0, 200));
        assert_eq!(holder.merge(&rival).unwrap(), holder);
        assert_eq!(rival.merge(&holder).unwrap(), holder);
        // A rival with a later deadline keeps the message hidden longer (late, never early) ...
        let late_rival = lease(2, 0, 400);
        assert_eq!(holder.merge(&late_rival).unwrap(), late_rival);
        // ... but the holder's change, even a release to an earlier deadline, outranks it.
        let released = lease(2, 1, 50);
        assert_eq!(late_rival.merge(&released).unwrap(), released);
        assert_eq!(released.merge(&late_rival).unwrap(), released);
    }

    proptest! {
        #[test]
        fn the_lease_kept_is_the_greatest_by_seq_counter_and_deadline(a in held(), b in held()) {
            let kept = a.max(b);
            let key = |h: &Held| (h.claim.seq, h.change_counter, h.deadline);
            prop_assert_eq!(key(&kept), key(&a).max(key(&b)));
        }
    }

    #[test]
    fn equal_counters_take_the_later_deadline() {
        // §5: two changes of one claim with one counter merge to the later deadline on every
        // replica, whichever arrives first.
        let claim = Claim {
            seq: 1,
            coordinator: NodeId(1),
            nonce: 3,
        };
        let with = |deadline| {
            let mut record = Record::sent(birth(0));
            if let Body::Live(live) = &mut record.body {
                live.held = Some(Held {
                    claim,
                    change_counter: 1,
                    deadline: Millis(deadline),
                    received_at: Millis(10),
                });
            }
            record
        };
        let (early, late) = (with(100), with(200));
        assert_eq!(early.merge(&late).unwrap(), late);
        assert_eq!(late.merge(&early).unwrap(), late);
    }
}
