//! Deduplication ids across coordinators (spec/replication.md §4): the deduplication record a
//! replica stores under `(queue name, incarnation, deduplication id)`, what a replica accepts of
//! it (the conditional put, reads, anti-entropy's copies, the window's end), and the send
//! coordinator's state machine (steps 1–5: the held write with the record's read, the put, the
//! settle, the answer).
//!
//! The record is **written once per window**: a replica that holds a live record of a key never
//! changes it, and there is no merge between two values. A send is decided for a message only
//! when two replicas name it, so by quorum intersection at most one message is ever decided per
//! window, with no clock and no leader. The message's own copy is written *held* and made ready
//! (confirmed) only by a coordinator that saw two replicas name it (`record::Settle`).
//!
//! Like the rest of the crate this module never reads a clock: replicas get their `now`, and the
//! coordinator its send time, as values. Its clock rules (the window's end, the late put's
//! refusals) can only let a duplicate through at the window's edge, never lose a message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trireme_core::{DedupId, Incarnation, MessageId, Millis, QueueName};

use crate::coordinator::{
    Effects, FIRST_ROUND, Outgoing, Progress, Reply, Target, WritePhase, broadcast,
};
use crate::ids::{Generation, NodeId};
use crate::key::RecordKey;
use crate::placement::{Placement, REPLICAS, Ring, dedup_position};
use crate::record::Record;
use crate::replica::Write;

/// The deduplication record's home: its first replica in ring order, which every put reaches
/// alone first (spec/replication.md §4, *Send* step 3).
pub const HOME: usize = 0;

/// Replies naming one message that decide a deduplication id (`W`, as for message records).
pub const DECIDING_REPLIES: usize = 2;
const _: () = assert!(2 * DECIDING_REPLIES > REPLICAS);

/// Bytes of an incarnation in a key: `hlc_ms`, `node`, `nonce`.
const INCARNATION_BYTES: usize = 8 + 2 + 8;

/// Which deduplication record: one id in one creation of one queue. The incarnation keeps a
/// deleted queue's ids out of its successor's (spec/replication.md §4, *Queue delete and
/// recreate*).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DedupKey {
    /// The queue's name.
    pub queue: QueueName,
    /// Which creation of the name.
    pub incarnation: Incarnation,
    /// The send's deduplication id.
    pub id: DedupId,
}

impl DedupKey {
    /// The stored form: partition (u16 BE, the first 16 bits of the key's ring position), name
    /// length (u8) and name, incarnation (`hlc_ms` u64, `node` u16, `nonce` u64, each BE), then
    /// the id's bytes. One partition is one contiguous range, as for message records.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let name = self.queue.as_str().as_bytes();
        let name_len = u8::try_from(name.len()).expect("queue names are at most 80 bytes");
        let id = self.id.as_str().as_bytes();
        let mut bytes = Vec::with_capacity(2 + 1 + name.len() + INCARNATION_BYTES + id.len());
        bytes.extend_from_slice(&self.partition().to_be_bytes());
        bytes.push(name_len);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(&self.incarnation.hlc_ms.to_be_bytes());
        bytes.extend_from_slice(&self.incarnation.node.to_be_bytes());
        bytes.extend_from_slice(&self.incarnation.nonce.to_be_bytes());
        bytes.extend_from_slice(id);
        bytes
    }

    /// The key of stored bytes, `None` if they are not a key's encoding.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<DedupKey> {
        let (_partition, rest) = bytes.split_at_checked(2)?;
        let (&name_len, rest) = rest.split_first()?;
        let (name, rest) = rest.split_at_checked(usize::from(name_len))?;
        let (hlc_ms, rest) = rest.split_at_checked(8)?;
        let (node, rest) = rest.split_at_checked(2)?;
        let (nonce, id) = rest.split_at_checked(8)?;
        let queue = QueueName::try_from(String::from_utf8(name.to_vec()).ok()?).ok()?;
        let id = DedupId::try_from(String::from_utf8(id.to_vec()).ok()?).ok()?;
        let key = DedupKey {
            queue,
            incarnation: Incarnation {
                hlc_ms: u64::from_be_bytes(hlc_ms.try_into().ok()?),
                node: u16::from_be_bytes(node.try_into().ok()?),
                nonce: u64::from_be_bytes(nonce.try_into().ok()?),
            },
            id,
        };
        (key.encode() == bytes).then_some(key)
    }

    /// The partition this key belongs to.
    #[must_use]
    pub fn partition(&self) -> u16 {
        (dedup_position(&self.queue, self.id.as_str()) >> 48) as u16
    }

    /// The three replicas of this key.
    #[must_use]
    pub fn replicas(&self, ring: &Ring) -> [NodeId; REPLICAS] {
        ring.dedup_replicas(&self.queue, self.id.as_str())
    }
}

/// The message a deduplication record names: its id and its `sent_at_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DedupValue {
    /// The message.
    pub message: MessageId,
    /// When its coordinator sent it, by that coordinator's clock.
    pub sent_at: Millis,
}

/// A replica's deduplication record: the message it names and the end of its window
/// (`sent_at_ms + DEDUP_WINDOW` of that message).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DedupRecord {
    /// The message named, for the whole window.
    pub value: DedupValue,
    /// When the record stops counting, by each replica's own clock.
    pub expires_at: Millis,
}

impl DedupRecord {
    /// The record of a window opened by the message `value` with the window `window_ms`.
    #[must_use]
    pub fn opened(value: DedupValue, window_ms: u64) -> DedupRecord {
        DedupRecord {
            value,
            expires_at: value.sent_at.plus_ms(window_ms),
        }
    }

    /// Whether the record still counts at `now` (its window is open by this clock).
    #[must_use]
    pub fn live_at(&self, now: Millis) -> bool {
        now < self.expires_at
    }
}

/// What a coordinator (or anti-entropy) asks a replica about a deduplication record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DedupRequest {
    /// Answer with the live record, if any (an expired record reads as none).
    Read,
    /// The conditional put of step 3: store `record` unless a live record of the key is held;
    /// `at` is the sender's clock when its send began (its step 1), for the late put's refusals.
    Put {
        /// The candidate's record: the sender's own message, or the one it adopted.
        record: DedupRecord,
        /// When the send began, by its coordinator's clock.
        at: Millis,
    },
    /// Anti-entropy: a peer's live record, stored as a put of that value would be.
    Learn(DedupRecord),
}

/// What a replica answers about a deduplication record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DedupReply {
    /// The live record it holds after the request (a read's and a put's answer).
    Record(Option<DedupRecord>),
    /// Anti-entropy's copy is handled (stored or not).
    Ack,
    /// The put is refused: too old, or a late put of a window that ended on this replica.
    Refused,
}

/// What a replica does with its stored record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DedupChange {
    /// Nothing to store.
    Keep,
    /// Store this record, then answer (after the fsync).
    Store(DedupRecord),
}

/// Decides `request` against `held` (what the replica stores for the key, live or expired) at
/// `now` by the replica's clock. `late_ms` is `OP_TIMEOUT + SKEW_MAX`: a put older than that has
/// been given up by its coordinator (spec/replication.md §4, *Send* step 3 and *WindowEnd*).
#[must_use]
pub fn accept(
    held: Option<&DedupRecord>,
    request: &DedupRequest,
    now: Millis,
    late_ms: u64,
) -> (DedupChange, DedupReply) {
    let live = held.filter(|record| record.live_at(now)).copied();
    match request {
        DedupRequest::Read => (DedupChange::Keep, DedupReply::Record(live)),
        DedupRequest::Put { record, at } => {
            if now.0.saturating_sub(at.0) > late_ms || !record.live_at(now) {
                return (DedupChange::Keep, DedupReply::Refused);
            }
            if live.is_some() {
                // Written once per window: the first value accepted stays.
                return (DedupChange::Keep, DedupReply::Record(live));
            }
            if held.is_some_and(|expired| expired.expires_at > *at) {
                // A late put of the window that ended here (`t < expires_at`).
                return (DedupChange::Keep, DedupReply::Refused);
            }
            (
                DedupChange::Store(*record),
                DedupReply::Record(Some(*record)),
            )
        }
        DedupRequest::Learn(record) => {
            let ended_after_it =
                held.is_some_and(|expired| expired.expires_at > record.value.sent_at);
            if !record.live_at(now) || live.is_some() || ended_after_it {
                (DedupChange::Keep, DedupReply::Ack)
            } else {
                (DedupChange::Store(*record), DedupReply::Ack)
            }
        }
    }
}

/// Whether a replica may drop its stored record at `now`: its window ended, and `late_ms` more
/// passed, after which every put of that window is refused for its age alone (spec/replication.md
/// §4, *WindowEnd*).
#[must_use]
pub fn droppable(record: &DedupRecord, now: Millis, late_ms: u64) -> bool {
    record.expires_at.plus_ms(late_ms) <= now
}

/// Whether a replica refuses `write` of a message copy at `now` because the copy's window ended:
/// a held or void copy of generation 0 arriving at or after `sent_at_ms + window_ms` by the
/// replica's clock (spec/replication.md §4, *WindowEnd*). Such a copy is dropped there at its
/// window's end, and a late write must not store it again.
#[must_use]
pub fn late_copy(write: &Write, now: Millis, window_ms: u64) -> bool {
    let Write::Merge(record) = write else {
        return false;
    };
    record.generation == Generation(0)
        && record
            .live()
            .is_some_and(|live| !record.ready() && live.birth.sent_at.plus_ms(window_ms) <= now)
}

/// Whether a stored message record is a held or void copy whose window ended at `now`: the
/// replica drops it (spec/replication.md §4, *WindowEnd*; no tombstone, no collection round).
#[must_use]
pub fn copy_window_ended(record: &Record, now: Millis, window_ms: u64) -> bool {
    record.generation == Generation(0)
        && !record.ready()
        && record
            .live()
            .is_some_and(|live| live.birth.sent_at.plus_ms(window_ms) <= now)
}

// ----- the send coordinator --------------------------------------------------------------------

/// One request to one replica of a deduplication record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupOutgoing {
    /// The replica.
    pub to: NodeId,
    /// The record it is about.
    pub key: DedupKey,
    /// The operation's round, carried back by the reply.
    pub round: u32,
    /// What it is asked.
    pub request: DedupRequest,
}

/// A request of a send with a deduplication id: about a message's record or the id's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOutgoing {
    /// To a replica of a message (the held write, the confirm, the void).
    Record(Outgoing),
    /// To a replica of the deduplication record (the read, the put).
    Dedup(DedupOutgoing),
}

/// The answer to a send with a deduplication id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DedupSendAnswer {
    /// The id is decided for `message`, which is ready on two replicas: answer it, as a
    /// duplicate when it is not this send's own message.
    Sent {
        /// The id's message.
        message: MessageId,
        /// Whether it is another send's message.
        duplicate: bool,
    },
    /// A quorum was missing by the deadline, or refused: an error (the held copy, if stored,
    /// stays unreceivable and goes at its window's end).
    Unavailable,
    /// The put's replies named three different messages, or refusals left no two that can
    /// agree: an error, nothing answered (spec/replication.md §4, *Considerations*, the split).
    Undecided,
}

/// What a send with a deduplication id needs to know.
#[derive(Clone, Debug)]
pub struct DedupSendSettings {
    /// The send time `t` by this coordinator's clock (the held copy's `sent_at`).
    pub now: Millis,
    /// `DEDUP_WINDOW`.
    pub window_ms: u64,
    /// Placement, for the replicas of a winner this send did not write.
    pub ring: Ring,
}

/// The rounds of a send with a deduplication id.
const PUT_ROUND: u32 = FIRST_ROUND + 1;
const CONFIRM_ROUND: u32 = FIRST_ROUND + 2;
const VOID_ROUND: u32 = FIRST_ROUND + 3;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Step 1: the held write and the record's read, at once.
    First {
        write: WritePhase,
        written: bool,
        reads: BTreeMap<NodeId, Option<DedupRecord>>,
    },
    /// Step 3: the conditional put, to the home replica alone until `spread`; each replica's
    /// named message (`None`: refused).
    Put {
        candidate: DedupRecord,
        named: BTreeMap<NodeId, Option<DedupRecord>>,
        spread: bool,
    },
    /// Step 4: the confirm of the winner and, for a loser, the void of its own copy.
    Settle {
        winner: MessageId,
        confirm: WritePhase,
        confirmed: bool,
        void: Option<(WritePhase, bool)>,
    },
    Answered,
}

/// spec/replication.md §4, *Send(q, body, k)*: write the message held and read the id's
/// record; decide, adopt or put; confirm the winner (and void a loser's copy); answer.
#[derive(Clone, Debug)]
pub struct DedupSendOp {
    message: Target,
    held: Record,
    dedup: DedupKey,
    dedup_replicas: [NodeId; REPLICAS],
    settings: DedupSendSettings,
    phase: Phase,
}

impl DedupSendOp {
    /// Starts the send of `held` (generation 0, held, carrying its deduplication id) under
    /// `key`, with the id's record under `dedup`.
    #[must_use]
    pub fn start(
        key: RecordKey,
        held: Record,
        dedup: DedupKey,
        settings: DedupSendSettings,
    ) -> (DedupSendOp, Effects<DedupSendAnswer, SendOutgoing>) {
        assert_eq!(held.generation, Generation(0), "a send writes generation 0");
        let live = held.live().expect("a send writes a live copy");
        assert!(!held.ready(), "a send with a deduplication id writes held");
        assert_eq!(
            live.birth.dedup_id.as_deref(),
            Some(dedup.id.as_str()),
            "the held copy carries its deduplication id"
        );
        assert_eq!(live.birth.sent_at, settings.now, "sent at the send's time");
        assert_eq!(
            (&key.queue, key.incarnation),
            (&dedup.queue, dedup.incarnation)
        );
        let message = Target {
            replicas: settings.ring.replicas(&key.queue, key.message),
            key,
        };
        let dedup_replicas = dedup.replicas(&settings.ring);
        let mut sends: Vec<SendOutgoing> =
            broadcast(&message, FIRST_ROUND, &Write::Merge(held.clone()))
                .into_iter()
                .map(SendOutgoing::Record)
                .collect();
        sends.extend(dedup_replicas.iter().map(|to| {
            SendOutgoing::Dedup(DedupOutgoing {
                to: *to,
                key: dedup.clone(),
                round: FIRST_ROUND,
                request: DedupRequest::Read,
            })
        }));
        let op = DedupSendOp {
            phase: Phase::First {
                write: WritePhase::new(message.replicas),
                written: false,
                reads: BTreeMap::new(),
            },
            message,
            held,
            dedup,
            dedup_replicas,
            settings,
        };
        (op, Effects::sends(sends))
    }

    /// This send's own message.
    #[must_use]
    pub fn message(&self) -> MessageId {
        self.message.key.message
    }

    /// A message replica's reply to round `round`.
    pub fn on_record_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &Reply,
    ) -> Effects<DedupSendAnswer, SendOutgoing> {
        match &mut self.phase {
            Phase::First { write, written, .. } if round == FIRST_ROUND => {
                match write.take(from, reply) {
                    Progress::Quorum => {
                        *written = true;
                        self.decide()
                    }
                    Progress::Refused => self.finish(DedupSendAnswer::Unavailable),
                    Progress::Waiting => Effects::none(),
                }
            }
            Phase::Settle {
                confirm,
                confirmed,
                void,
                ..
            } => {
                let progress = match (round, void) {
                    (CONFIRM_ROUND, _) => {
                        let progress = confirm.take(from, reply);
                        *confirmed |= progress == Progress::Quorum;
                        progress
                    }
                    (VOID_ROUND, Some((void, voided))) => {
                        let progress = void.take(from, reply);
                        *voided |= progress == Progress::Quorum;
                        progress
                    }
                    _ => Progress::Waiting,
                };
                match progress {
                    Progress::Refused => self.finish(DedupSendAnswer::Unavailable),
                    Progress::Quorum => self.settled(),
                    Progress::Waiting => Effects::none(),
                }
            }
            _ => Effects::none(),
        }
    }

    /// A deduplication replica's reply to round `round`.
    pub fn on_dedup_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &DedupReply,
    ) -> Effects<DedupSendAnswer, SendOutgoing> {
        if !self.dedup_replicas.contains(&from) {
            return Effects::none();
        }
        match &mut self.phase {
            Phase::First { reads, .. } if round == FIRST_ROUND => {
                let DedupReply::Record(record) = reply else {
                    return Effects::none();
                };
                if reads.insert(from, *record).is_some() {
                    return Effects::none();
                }
                self.decide()
            }
            Phase::Put {
                candidate,
                named,
                spread,
            } if round == PUT_ROUND => {
                if named.contains_key(&from) {
                    return Effects::none();
                }
                let record = match reply {
                    DedupReply::Record(record) => *record,
                    DedupReply::Ack | DedupReply::Refused => None,
                };
                named.insert(from, record);
                let agreed = decided(named.values().flatten().map(|record| &record.value));
                if let Some(winner) = agreed {
                    return self.settle(winner);
                }
                let refusals = named.values().filter(|value| value.is_none()).count();
                if named.len() == REPLICAS || refusals > REPLICAS - DECIDING_REPLIES {
                    // No two replicas can name one message any more in this window.
                    return self.finish(DedupSendAnswer::Undecided);
                }
                if from == self.dedup_replicas[HOME] && !*spread {
                    // The home's first value is what every sender spreads, so concurrent sends
                    // converge on it; a refusal spreads the candidate instead.
                    let value = record.unwrap_or(*candidate);
                    return self.spread(value);
                }
                Effects::none()
            }
            _ => Effects::none(),
        }
    }

    /// Whether the put waits for the home replica's reply before going to the other two: the
    /// driver then calls [`DedupSendOp::on_home_timeout`] once after its home wait.
    #[must_use]
    pub fn waiting_for_home(&self) -> bool {
        matches!(self.phase, Phase::Put { spread: false, .. })
    }

    /// The home did not answer the put in time: put the candidate to the other two
    /// (spec/replication.md §4, *Send* step 3). Nothing if the put already went to them.
    pub fn on_home_timeout(&mut self) -> Effects<DedupSendAnswer, SendOutgoing> {
        let Phase::Put {
            candidate,
            spread: false,
            ..
        } = self.phase
        else {
            return Effects::none();
        };
        self.spread(candidate)
    }

    /// The deadline passed: an error, and nothing answered after it.
    pub fn on_timeout(&mut self) -> Effects<DedupSendAnswer, SendOutgoing> {
        if self.phase == Phase::Answered {
            return Effects::none();
        }
        self.finish(DedupSendAnswer::Unavailable)
    }

    /// Step 2, once the held copy has two acks and two replicas answered the read.
    fn decide(&mut self) -> Effects<DedupSendAnswer, SendOutgoing> {
        let Phase::First {
            written: true,
            reads,
            ..
        } = &self.phase
        else {
            return Effects::none();
        };
        if reads.len() < DECIDING_REPLIES {
            return Effects::none();
        }
        let values: Vec<DedupRecord> = reads.values().flatten().copied().collect();
        if let Some(winner) = decided(values.iter().map(|record| &record.value)) {
            // Two replicas name `winner`: the id is decided (a duplicate, unless it is ours).
            return self.settle(winner);
        }
        // One replica names a candidate: another send's put is under way; adopt it rather than
        // add a rival (the smallest id, so two adopters of two candidates pick alike).
        let candidate = values
            .iter()
            .min_by_key(|record| record.value.message)
            .copied()
            .unwrap_or_else(|| {
                DedupRecord::opened(
                    DedupValue {
                        message: self.message.key.message,
                        sent_at: self.settings.now,
                    },
                    self.settings.window_ms,
                )
            });
        self.phase = Phase::Put {
            candidate,
            named: BTreeMap::new(),
            spread: false,
        };
        // First to the home alone: it takes the first put that reaches it, and every sender
        // then spreads what it names.
        Effects::sends(vec![self.put(self.dedup_replicas[HOME], candidate)])
    }

    /// The put of `value` to the replicas other than the home, once per put.
    fn spread(&mut self, value: DedupRecord) -> Effects<DedupSendAnswer, SendOutgoing> {
        let Phase::Put { spread, .. } = &mut self.phase else {
            unreachable!("a put spreads in its own phase");
        };
        assert!(!*spread, "a put spreads once");
        *spread = true;
        let others: Vec<NodeId> = self.dedup_replicas[HOME + 1..].to_vec();
        Effects::sends(others.into_iter().map(|to| self.put(to, value)).collect())
    }

    fn put(&self, to: NodeId, record: DedupRecord) -> SendOutgoing {
        SendOutgoing::Dedup(DedupOutgoing {
            to,
            key: self.dedup.clone(),
            round: PUT_ROUND,
            request: DedupRequest::Put {
                record,
                at: self.settings.now,
            },
        })
    }

    /// Step 4: confirm `winner` and, if it is not this send's message, void this send's copy.
    fn settle(&mut self, winner: MessageId) -> Effects<DedupSendAnswer, SendOutgoing> {
        let key = RecordKey {
            message: winner,
            ..self.message.key.clone()
        };
        let target = Target {
            replicas: self.settings.ring.replicas(&key.queue, winner),
            key,
        };
        let mut sends: Vec<SendOutgoing> = broadcast(&target, CONFIRM_ROUND, &Write::Confirm)
            .into_iter()
            .map(SendOutgoing::Record)
            .collect();
        let void = (winner != self.message.key.message).then(|| {
            sends.extend(
                broadcast(&self.message, VOID_ROUND, &Write::Merge(self.held.voided()))
                    .into_iter()
                    .map(SendOutgoing::Record),
            );
            (WritePhase::new(self.message.replicas), false)
        });
        self.phase = Phase::Settle {
            winner,
            confirm: WritePhase::new(target.replicas),
            confirmed: false,
            void,
        };
        Effects::sends(sends)
    }

    /// Step 5, once the confirm (and the void) have two acks each.
    fn settled(&mut self) -> Effects<DedupSendAnswer, SendOutgoing> {
        let Phase::Settle {
            winner,
            confirmed: true,
            ref void,
            ..
        } = self.phase
        else {
            return Effects::none();
        };
        if void.as_ref().is_some_and(|(_, voided)| !voided) {
            return Effects::none();
        }
        let duplicate = winner != self.message.key.message;
        self.finish(DedupSendAnswer::Sent {
            message: winner,
            duplicate,
        })
    }

    fn finish(&mut self, answer: DedupSendAnswer) -> Effects<DedupSendAnswer, SendOutgoing> {
        self.phase = Phase::Answered;
        Effects::answer(answer)
    }
}

/// The message that `DECIDING_REPLIES` of `values` name, if any. Each replica names one message
/// for the whole window, so no other message can ever be named by two.
fn decided<'a>(values: impl Iterator<Item = &'a DedupValue>) -> Option<MessageId> {
    let mut counts: BTreeMap<MessageId, usize> = BTreeMap::new();
    for value in values {
        *counts.entry(value.message).or_default() += 1;
    }
    counts
        .into_iter()
        .find(|(_, count)| *count >= DECIDING_REPLIES)
        .map(|(message, _)| message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::Request;
    use crate::record::{Birth, Settle};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const WINDOW_MS: u64 = 300_000;
    const LATE_MS: u64 = 10_500;

    fn queue() -> QueueName {
        QueueName::try_from("jobs".to_owned()).unwrap()
    }

    fn incarnation() -> Incarnation {
        Incarnation {
            hlc_ms: 5,
            node: 1,
            nonce: 9,
        }
    }

    fn dedup_key() -> DedupKey {
        DedupKey {
            queue: queue(),
            incarnation: incarnation(),
            id: DedupId::try_from("order-17").unwrap(),
        }
    }

    fn value(message: u128, sent_at: u64) -> DedupValue {
        DedupValue {
            message: MessageId(message),
            sent_at: Millis(sent_at),
        }
    }

    fn put(message: u128, at: u64) -> DedupRequest {
        DedupRequest::Put {
            record: DedupRecord::opened(value(message, at), WINDOW_MS),
            at: Millis(at),
        }
    }

    proptest! {
        #[test]
        fn keys_round_trip(name in "[a-zA-Z0-9_-]{1,80}", id in "[!-~]{1,128}", hlc: u64, nonce: u64) {
            let key = DedupKey {
                queue: QueueName::try_from(name).unwrap(),
                incarnation: Incarnation { hlc_ms: hlc, node: 3, nonce },
                id: DedupId::try_from(id).unwrap(),
            };
            prop_assert_eq!(DedupKey::decode(&key.encode()), Some(key));
        }

        /// Written once per window: whatever puts and copies arrive while a record is live, a
        /// replica keeps the first value it accepted.
        #[test]
        fn a_replica_names_one_message_for_the_whole_window(
            requests in proptest::collection::vec((0u128..4, 0u64..1_000, any::<bool>()), 1..12)
        ) {
            let mut held: Option<DedupRecord> = None;
            let mut first: Option<DedupValue> = None;
            for (message, at, learn) in requests {
                let now = Millis(at + 5);
                let record = DedupRecord::opened(value(message, at), WINDOW_MS);
                let request = if learn {
                    DedupRequest::Learn(record)
                } else {
                    DedupRequest::Put { record, at: Millis(at) }
                };
                let (change, reply) = accept(held.as_ref(), &request, now, LATE_MS);
                if let DedupChange::Store(stored) = change {
                    prop_assert!(held.is_none(), "stored over a live record");
                    held = Some(stored);
                    first = Some(stored.value);
                }
                if let DedupReply::Record(Some(named)) = reply {
                    prop_assert_eq!(Some(named.value), first);
                }
            }
        }
    }

    #[test]
    fn garbage_is_not_a_key() {
        assert_eq!(DedupKey::decode(&[0, 1, 200, 1]), None);
        let mut bytes = dedup_key().encode();
        bytes.push(b' ');
        assert_eq!(DedupKey::decode(&bytes), None, "a space is no id character");
    }

    #[test]
    fn a_put_stores_the_first_value_and_every_reply_names_it() {
        let (change, reply) = accept(None, &put(1, 100), Millis(110), LATE_MS);
        let first = DedupRecord::opened(value(1, 100), WINDOW_MS);
        assert_eq!(change, DedupChange::Store(first));
        assert_eq!(reply, DedupReply::Record(Some(first)));
        let (change, reply) = accept(Some(&first), &put(2, 120), Millis(130), LATE_MS);
        assert_eq!(change, DedupChange::Keep);
        assert_eq!(reply, DedupReply::Record(Some(first)));
        let (_, read) = accept(Some(&first), &DedupRequest::Read, Millis(130), LATE_MS);
        assert_eq!(read, DedupReply::Record(Some(first)));
    }

    #[test]
    fn an_expired_record_reads_as_none_and_refuses_late_puts_of_its_window() {
        let first = DedupRecord::opened(value(1, 100), WINDOW_MS);
        let end = first.expires_at;
        let (_, read) = accept(Some(&first), &DedupRequest::Read, end, LATE_MS);
        assert_eq!(read, DedupReply::Record(None));
        // A put sent in the window (t < expires_at), still in flight at its end: refused.
        let late = put(2, end.0 - 1_000);
        assert_eq!(
            accept(Some(&first), &late, end.plus_ms(10), LATE_MS).1,
            DedupReply::Refused
        );
        // A put older than OP_TIMEOUT + SKEW_MAX is refused for its age alone.
        assert_eq!(
            accept(None, &put(2, 100), Millis(100 + LATE_MS + 1), LATE_MS).1,
            DedupReply::Refused
        );
        // A send after the window opens a new one, replacing the expired record.
        let (change, _) = accept(Some(&first), &put(3, end.0), end.plus_ms(5), LATE_MS);
        assert_eq!(
            change,
            DedupChange::Store(DedupRecord::opened(value(3, end.0), WINDOW_MS))
        );
        assert!(!droppable(&first, end.plus_ms(LATE_MS - 1), LATE_MS));
        assert!(droppable(&first, end.plus_ms(LATE_MS), LATE_MS));
    }

    #[test]
    fn anti_entropy_stores_only_a_live_record_where_none_is_live() {
        let peer = DedupRecord::opened(value(1, 100), WINDOW_MS);
        assert_eq!(
            accept(None, &DedupRequest::Learn(peer), Millis(200), LATE_MS).0,
            DedupChange::Store(peer)
        );
        assert_eq!(
            accept(None, &DedupRequest::Learn(peer), peer.expires_at, LATE_MS).0,
            DedupChange::Keep
        );
        let mine = DedupRecord::opened(value(2, 90), WINDOW_MS);
        assert_eq!(
            accept(
                Some(&mine),
                &DedupRequest::Learn(peer),
                Millis(200),
                LATE_MS
            )
            .0,
            DedupChange::Keep
        );
    }

    #[test]
    fn a_held_or_void_copy_is_refused_and_dropped_after_its_window() {
        let held = held_record(7, 100);
        let end = Millis(100 + WINDOW_MS);
        assert!(!late_copy(
            &Write::Merge(held.clone()),
            Millis(end.0 - 1),
            WINDOW_MS
        ));
        assert!(late_copy(&Write::Merge(held.clone()), end, WINDOW_MS));
        assert!(late_copy(&Write::Merge(held.voided()), end, WINDOW_MS));
        assert!(copy_window_ended(&held, end, WINDOW_MS));
        assert!(!copy_window_ended(&held, Millis(end.0 - 1), WINDOW_MS));
        let mut ready = held.clone();
        if let crate::record::Body::Live(live) = &mut ready.body {
            live.settle = Settle::Ready;
        }
        assert!(!late_copy(&Write::Merge(ready.clone()), end, WINDOW_MS));
        assert!(!copy_window_ended(&ready, end, WINDOW_MS));
    }

    // ----- the send's state machine --------------------------------------------------------

    fn ring() -> Ring {
        Ring::new([NodeId(1), NodeId(2), NodeId(3)]).unwrap()
    }

    fn held_record(_message: u128, sent_at: u64) -> Record {
        Record::sent_held(Birth {
            payload: b"body".to_vec(),
            sent_at: Millis(sent_at),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: Some("order-17".to_owned()),
        })
    }

    fn start(message: u128, now: u64) -> (DedupSendOp, Vec<SendOutgoing>) {
        let key = RecordKey {
            queue: queue(),
            incarnation: incarnation(),
            message: MessageId(message),
        };
        let (op, effects) = DedupSendOp::start(
            key,
            held_record(message, now),
            dedup_key(),
            DedupSendSettings {
                now: Millis(now),
                window_ms: WINDOW_MS,
                ring: ring(),
            },
        );
        assert_eq!(effects.answer, None);
        (op, effects.sends)
    }

    /// A three-replica world run in-process: message records and deduplication records of
    /// every node, each request applied as the replica would.
    #[derive(Default)]
    struct World {
        records: BTreeMap<(NodeId, MessageId), Record>,
        dedups: BTreeMap<NodeId, DedupRecord>,
    }

    impl World {
        /// Delivers `sends` (all, or only those to `reach`) and feeds `op` every reply, until
        /// it answers or nothing is left to deliver.
        /// Delivers one request to its replica and feeds `op` the reply.
        fn deliver(
            &mut self,
            op: &mut DedupSendOp,
            send: SendOutgoing,
            now: Millis,
        ) -> Effects<DedupSendAnswer, SendOutgoing> {
            match send {
                SendOutgoing::Record(out) => {
                    let Request::Write { write, .. } = out.request else {
                        panic!("a send with a deduplication id reads no message");
                    };
                    let slot = (out.to, out.key.message);
                    let verdict = crate::replica::accept(self.records.get(&slot), &write);
                    let acks = verdict.acks();
                    if let crate::replica::Verdict::Store(Some(record)) = verdict {
                        self.records.insert(slot, record);
                    }
                    let reply = if acks { Reply::Ack } else { Reply::Refused };
                    op.on_record_reply(out.to, out.round, &reply)
                }
                SendOutgoing::Dedup(out) => {
                    let held = self.dedups.get(&out.to);
                    let (change, reply) = accept(held, &out.request, now, LATE_MS);
                    if let DedupChange::Store(record) = change {
                        self.dedups.insert(out.to, record);
                    }
                    op.on_dedup_reply(out.to, out.round, &reply)
                }
            }
        }

        /// Delivers `sends` (those to `reach` only; the rest are lost) and feeds `op` every
        /// reply, until it answers or nothing is left to deliver.
        fn run(
            &mut self,
            op: &mut DedupSendOp,
            mut sends: Vec<SendOutgoing>,
            reach: &[NodeId],
            now: Millis,
        ) -> Option<DedupSendAnswer> {
            while !sends.is_empty() {
                let mut next = Vec::new();
                for send in sends {
                    let to = match &send {
                        SendOutgoing::Record(out) => out.to,
                        SendOutgoing::Dedup(out) => out.to,
                    };
                    if !reach.contains(&to) {
                        continue;
                    }
                    let effects = self.deliver(op, send, now);
                    if let Some(answer) = effects.answer {
                        return Some(answer);
                    }
                    next.extend(effects.sends);
                }
                sends = next;
            }
            None
        }

        fn ready(&self, message: u128) -> usize {
            self.records
                .iter()
                .filter(|((_, m), record)| *m == MessageId(message) && record.ready())
                .count()
        }

        fn unsettled(&self, message: u128, settle: Settle) -> usize {
            self.records
                .iter()
                .filter(|((_, m), record)| {
                    *m == MessageId(message) && record.live().is_some_and(|l| l.settle == settle)
                })
                .count()
        }
    }

    const ALL: [NodeId; 3] = [NodeId(1), NodeId(2), NodeId(3)];

    #[test]
    fn a_first_send_puts_its_own_message_and_confirms_it() {
        let mut world = World::default();
        let (mut op, sends) = start(10, 1_000);
        let answer = world.run(&mut op, sends, &ALL, Millis(1_000));
        assert_eq!(
            answer,
            Some(DedupSendAnswer::Sent {
                message: MessageId(10),
                duplicate: false
            })
        );
        assert!(world.ready(10) >= 2, "answered only once ready on two");
    }

    #[test]
    fn a_second_send_answers_the_first_message_and_voids_its_copy() {
        let mut world = World::default();
        let (mut first, sends) = start(10, 1_000);
        world.run(&mut first, sends, &ALL, Millis(1_000)).unwrap();
        let (mut second, sends) = start(20, 2_000);
        let answer = world.run(&mut second, sends, &ALL, Millis(2_000));
        assert_eq!(
            answer,
            Some(DedupSendAnswer::Sent {
                message: MessageId(10),
                duplicate: true
            })
        );
        assert_eq!(world.ready(20), 0, "the loser's copy is never ready");
        assert!(
            world.unsettled(20, Settle::Void) >= 2,
            "D4: the loser frees its copy"
        );
    }

    #[test]
    fn a_sender_that_sees_one_replica_naming_a_candidate_adopts_it_and_confirms_it() {
        // The first send's held copy reached all three and its put replica 1 only; then its
        // coordinator stopped.
        let mut world = World::default();
        for node in ALL {
            world
                .records
                .insert((node, MessageId(10)), held_record(10, 1_000));
        }
        world
            .dedups
            .insert(NodeId(1), DedupRecord::opened(value(10, 1_000), WINDOW_MS));
        // The retry, with its own message, reads the candidate on one replica and adopts it.
        let (mut retry, sends) = start(20, 2_000);
        let answer = world.run(&mut retry, sends, &ALL, Millis(2_000));
        assert_eq!(
            answer,
            Some(DedupSendAnswer::Sent {
                message: MessageId(10),
                duplicate: true
            })
        );
        assert!(
            world.ready(10) >= 2,
            "the retry confirmed the stopped winner"
        );
        assert_eq!(world.ready(20), 0);
        assert!(
            world
                .dedups
                .values()
                .filter(|r| r.value.message == MessageId(10))
                .count()
                >= 2
        );
    }

    /// Three senders of one id, every interleaving the schedule picks, with up to two requests
    /// lost: at most one message id is ever answered or ready anywhere (D2), and an answered
    /// message is ready on two replicas when it is answered (D1).
    fn race(schedule: &[(u8, bool)], senders: u128) -> Result<(), TestCaseError> {
        let mut world = World::default();
        let mut ops = Vec::new();
        let mut pending: Vec<(usize, SendOutgoing)> = Vec::new();
        for sender in 0..senders {
            let (op, sends) = start(100 + sender, 1_000 + sender as u64);
            pending.extend(sends.into_iter().map(|send| (ops.len(), send)));
            ops.push(op);
        }
        let mut answered: Vec<MessageId> = Vec::new();
        let mut drops = 0;
        for (step, (pick, drop)) in schedule.iter().copied().cycle().take(400).enumerate() {
            // Now and then a sender waiting for the home gives up on it.
            if pick % 7 == 0 {
                let sender = step % ops.len();
                let effects = ops[sender].on_home_timeout();
                pending.extend(effects.sends.into_iter().map(|send| (sender, send)));
            }
            if pending.is_empty() {
                break;
            }
            let (sender, send) = pending.remove(usize::from(pick) % pending.len());
            if drop && drops < 2 {
                drops += 1;
                continue;
            }
            let now = Millis(1_500);
            let effects = match send {
                SendOutgoing::Record(out) => {
                    let Request::Write { write, .. } = out.request else {
                        unreachable!("no message reads here");
                    };
                    let slot = (out.to, out.key.message);
                    let verdict = crate::replica::accept(world.records.get(&slot), &write);
                    let acks = verdict.acks();
                    if let crate::replica::Verdict::Store(Some(record)) = verdict {
                        world.records.insert(slot, record);
                    }
                    let reply = if acks { Reply::Ack } else { Reply::Refused };
                    ops[sender].on_record_reply(out.to, out.round, &reply)
                }
                SendOutgoing::Dedup(out) => {
                    let (change, reply) =
                        accept(world.dedups.get(&out.to), &out.request, now, LATE_MS);
                    if let DedupChange::Store(record) = change {
                        world.dedups.insert(out.to, record);
                    }
                    ops[sender].on_dedup_reply(out.to, out.round, &reply)
                }
            };
            if let Some(DedupSendAnswer::Sent { message, .. }) = effects.answer {
                prop_assert!(
                    world.ready(message.0) >= 2,
                    "D1: answered while not ready on two"
                );
                answered.push(message);
            }
            pending.extend(effects.sends.into_iter().map(|send| (sender, send)));
        }
        answered.sort();
        answered.dedup();
        prop_assert!(
            answered.len() <= 1,
            "D2: two messages answered: {answered:?}"
        );
        let ready: std::collections::BTreeSet<MessageId> = world
            .records
            .iter()
            .filter(|(_, record)| record.ready())
            .map(|((_, message), _)| *message)
            .collect();
        prop_assert!(ready.len() <= 1, "D2: two messages receivable: {ready:?}");
        if let Some(message) = answered.first() {
            prop_assert!(ready.contains(message));
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn racing_senders_answer_and_ready_at_most_one_message(
            schedule in proptest::collection::vec((any::<u8>(), proptest::bool::weighted(0.05)), 1..64),
            senders in 2u128..4,
        ) {
            race(&schedule, senders)?;
        }
    }

    #[test]
    fn three_different_names_are_undecided_and_answer_nothing() {
        let mut world = World::default();
        for (node, message) in [(1, 1), (2, 2), (3, 3)] {
            world.dedups.insert(
                NodeId(node),
                DedupRecord::opened(value(message, 900), WINDOW_MS),
            );
            // Each candidate's body is on some replica; none is ever decided.
        }
        let (mut op, sends) = start(20, 1_000);
        assert_eq!(
            world.run(&mut op, sends, &ALL, Millis(1_000)),
            Some(DedupSendAnswer::Undecided)
        );
        assert_eq!(world.ready(20), 0);
    }

    #[test]
    fn a_confirm_refused_where_no_copy_is_stored_answers_nothing_but_unavailable() {
        // Two replicas name message 5, whose copy was never stored (the record-before-message
        // order the page forbids): the confirm is refused and no duplicate is answered.
        let mut world = World::default();
        for node in [1, 2] {
            world
                .dedups
                .insert(NodeId(node), DedupRecord::opened(value(5, 900), WINDOW_MS));
        }
        let (mut op, sends) = start(20, 1_000);
        assert_eq!(
            world.run(&mut op, sends, &ALL, Millis(1_000)),
            Some(DedupSendAnswer::Unavailable)
        );
    }

    #[test]
    fn without_two_acks_of_the_held_copy_the_send_fails_and_never_answers_later() {
        let mut world = World::default();
        let (mut op, sends) = start(10, 1_000);
        assert_eq!(world.run(&mut op, sends, &[NodeId(1)], Millis(1_000)), None);
        assert_eq!(op.on_timeout().answer, Some(DedupSendAnswer::Unavailable));
        assert_eq!(
            op.on_record_reply(NodeId(2), FIRST_ROUND, &Reply::Ack)
                .answer,
            None
        );
        assert_eq!(op.on_timeout().answer, None);
        assert_eq!(world.ready(10), 0, "the held copy stays unreceivable");
    }

    #[test]
    fn a_duplicated_or_foreign_reply_counts_once() {
        let (mut op, _) = start(10, 1_000);
        let empty = DedupReply::Record(None);
        assert!(
            op.on_dedup_reply(NodeId(1), FIRST_ROUND, &empty)
                .sends
                .is_empty()
        );
        assert!(
            op.on_dedup_reply(NodeId(1), FIRST_ROUND, &empty)
                .sends
                .is_empty()
        );
        assert!(
            op.on_dedup_reply(NodeId(9), FIRST_ROUND, &empty)
                .sends
                .is_empty()
        );
        assert!(
            op.on_record_reply(NodeId(1), FIRST_ROUND, &Reply::Ack)
                .sends
                .is_empty()
        );
        assert!(
            op.on_record_reply(NodeId(1), FIRST_ROUND, &Reply::Ack)
                .sends
                .is_empty()
        );
        // The second distinct ack completes the write; the read still has one reply: wait.
        assert!(
            op.on_record_reply(NodeId(2), FIRST_ROUND, &Reply::Ack)
                .sends
                .is_empty()
        );
        // The second distinct read reply decides: a put to the home alone.
        let effects = op.on_dedup_reply(NodeId(2), FIRST_ROUND, &empty);
        let home = dedup_key().replicas(&ring())[HOME];
        assert_eq!(puts_to(&effects.sends), vec![(home, MessageId(10))]);
        assert!(op.waiting_for_home());
    }

    fn puts_to(sends: &[SendOutgoing]) -> Vec<(NodeId, MessageId)> {
        sends
            .iter()
            .filter_map(|send| match send {
                SendOutgoing::Dedup(DedupOutgoing {
                    to,
                    request: DedupRequest::Put { record, .. },
                    ..
                }) => Some((*to, record.value.message)),
                _ => None,
            })
            .collect()
    }

    /// Drives `op` through its first phase against empty replicas; returns its put.
    fn through_first_phase(op: &mut DedupSendOp) -> Vec<SendOutgoing> {
        let mut sends = Vec::new();
        for node in ALL {
            sends.extend(op.on_record_reply(node, FIRST_ROUND, &Reply::Ack).sends);
            sends.extend(
                op.on_dedup_reply(node, FIRST_ROUND, &DedupReply::Record(None))
                    .sends,
            );
        }
        sends
    }

    #[test]
    fn the_put_spreads_what_the_home_names_or_after_its_timeout_the_candidate() {
        let home = dedup_key().replicas(&ring())[HOME];
        let others: Vec<NodeId> = ALL.into_iter().filter(|n| *n != home).collect();
        // The home names another message: that message goes to the other two.
        let (mut op, _) = start(10, 1_000);
        assert_eq!(
            puts_to(&through_first_phase(&mut op)),
            vec![(home, MessageId(10))]
        );
        let theirs = DedupRecord::opened(value(5, 900), WINDOW_MS);
        let effects = op.on_dedup_reply(home, PUT_ROUND, &DedupReply::Record(Some(theirs)));
        assert_eq!(
            puts_to(&effects.sends),
            others
                .iter()
                .map(|n| (*n, MessageId(5)))
                .collect::<Vec<_>>()
        );
        assert!(!op.waiting_for_home());
        assert!(op.on_home_timeout().sends.is_empty(), "a put spreads once");
        // The home is silent: after its wait, the candidate goes to the other two.
        let (mut op, _) = start(10, 1_000);
        through_first_phase(&mut op);
        assert_eq!(
            puts_to(&op.on_home_timeout().sends),
            others
                .iter()
                .map(|n| (*n, MessageId(10)))
                .collect::<Vec<_>>()
        );
        // The home refuses: the candidate goes to the other two at once.
        let (mut op, _) = start(10, 1_000);
        through_first_phase(&mut op);
        let effects = op.on_dedup_reply(home, PUT_ROUND, &DedupReply::Refused);
        assert_eq!(
            puts_to(&effects.sends),
            others
                .iter()
                .map(|n| (*n, MessageId(10)))
                .collect::<Vec<_>>()
        );
    }

    /// The split the cluster test found with a put to all three at once: three senders whose
    /// puts each reach a different replica first. Through the home, they converge.
    #[test]
    fn three_senders_that_read_nothing_at_once_converge_on_the_homes_first_value() {
        let mut world = World::default();
        let mut ops = Vec::new();
        let mut puts = Vec::new();
        for sender in 0..3u128 {
            let (mut op, sends) = start(100 + sender, 1_000);
            // Their held copies land everywhere; every read finds nothing.
            for send in sends {
                if let SendOutgoing::Record(out) = send {
                    let Request::Write { write, .. } = out.request else {
                        unreachable!("the first phase writes")
                    };
                    let slot = (out.to, out.key.message);
                    if let crate::replica::Verdict::Store(Some(record)) =
                        crate::replica::accept(world.records.get(&slot), &write)
                    {
                        world.records.insert(slot, record);
                    }
                }
            }
            puts.push(through_first_phase(&mut op));
            ops.push(op);
        }
        // Each put reaches the home before any other replica hears of a put (the order in
        // which a put to all three at once left each replica naming its own coordinator's
        // message); then every spread put arrives, the last sender's first.
        let mut spreads = Vec::new();
        for (sender, put) in puts.into_iter().enumerate() {
            for send in put {
                let effects = world.deliver(&mut ops[sender], send, Millis(1_100));
                assert_eq!(effects.answer, None);
                spreads.push((sender, effects.sends));
            }
        }
        let mut answers = Vec::new();
        for (sender, sends) in spreads.into_iter().rev() {
            answers.push(world.run(&mut ops[sender], sends, &ALL, Millis(1_100)));
        }
        let named: BTreeSet<MessageId> = answers
            .iter()
            .map(|answer| match answer {
                Some(DedupSendAnswer::Sent { message, .. }) => *message,
                other => panic!("every sender is answered: {other:?}"),
            })
            .collect();
        assert_eq!(named.len(), 1, "{answers:?}");
    }
}
