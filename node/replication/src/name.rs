//! The replicated record of a queue name, and the create and delete of a queue
//! (spec/replication.md §1 *Queues in a cluster*).
//!
//! A name's record lives on the three replicas of the name on the ring. Unlike a message's
//! record it needs agreement: two creates of one name must end with one incarnation, because
//! every message key and receipt handle names the incarnation it belongs to. Each replica casts
//! at most one vote per epoch, in its own slot; a proposal with two votes is the epoch's
//! incarnation; merges only collect slots, so what two replicas chose stays chosen. Every action
//! acts on a *settled* read: the merge of two replies, once two replicas hold it.
//!
//! Like the rest of this crate, this module never reads a clock, draws randomness or does I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trireme_core::Millis;

use crate::coordinator::Effects;
use crate::ids::NodeId;
use crate::placement::REPLICAS;

/// Votes that decide an epoch.
pub const VOTE_QUORUM: usize = 2;
/// Replies of a settled read.
const READ_QUORUM: usize = 2;
/// Acks of a write.
const WRITE_QUORUM: usize = 2;
/// Epochs one create tries (each split moves it to the next) before it gives up.
const CREATE_EPOCHS_MAX: u32 = 4;

/// Which creation of a name: the creating coordinator's hybrid logical clock, its node id and a
/// random nonce, unique by construction (spec §1, *The name record*). It is the core's
/// incarnation, which every message key and receipt handle carries.
pub type QueueIncarnation = trireme_core::Incarnation;

/// What a create proposes: an incarnation, with the attributes and tags the client asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Proposal {
    /// The incarnation this create would make.
    pub incarnation: QueueIncarnation,
    /// The attributes as the request gave them.
    pub attributes: BTreeMap<String, String>,
    /// The tags as the request gave them.
    pub tags: BTreeMap<String, String>,
}

/// One attribute's or tag's value after the create, last writer wins by `(hlc_ms, node)`.
/// `value: None` is a removed tag (or an attribute back to its default).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Register {
    /// The writer's hybrid logical clock: above its own clock and every stamp its read saw.
    pub hlc_ms: u64,
    /// The writer, breaking ties.
    pub node: NodeId,
    /// The value written.
    pub value: Option<String>,
}

/// One replica's record of a queue name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NameRecord {
    /// Creations of the name so far (0 for the first), ordering records, never naming one.
    pub epoch: u32,
    /// Slot `r` holds the vote of the name's `r`-th replica in this epoch (boxed: a proposal
    /// carries the create's attributes, and most slots of most records are read, not moved).
    pub votes: [Option<Box<Proposal>>; REPLICAS],
    /// The tombstone of the epoch, with the deleting coordinator's clock (for the 60 s before
    /// the name can be created again).
    pub deleted_at: Option<Millis>,
    /// Attribute changes of the live incarnation, by attribute name.
    pub attributes: BTreeMap<String, Register>,
    /// Tag changes of the live incarnation, by tag key.
    pub tags: BTreeMap<String, Register>,
    /// The purge watermark of the live incarnation (spec §2), merged by max.
    pub purge_watermark: Option<Millis>,
}

impl NameRecord {
    /// The epoch's incarnation: the proposal holding two votes.
    #[must_use]
    pub fn decided(&self) -> Option<&Proposal> {
        self.votes
            .iter()
            .flatten()
            .map(AsRef::as_ref)
            .find(|proposal| {
                self.votes
                    .iter()
                    .flatten()
                    .filter(|vote| vote.incarnation == proposal.incarnation)
                    .count()
                    >= VOTE_QUORUM
            })
    }

    /// The live incarnation: decided and not deleted.
    #[must_use]
    pub fn live(&self) -> Option<&Proposal> {
        if self.deleted_at.is_some() {
            None
        } else {
            self.decided()
        }
    }

    /// Every replica voted and no proposal holds two votes: nobody can win this epoch.
    #[must_use]
    pub fn split(&self) -> bool {
        self.votes.iter().all(Option::is_some) && self.decided().is_none()
    }

    /// The live incarnation's attributes now: the create's, then every change on top.
    #[must_use]
    pub fn current_attributes(&self) -> Option<BTreeMap<String, String>> {
        let live = self.live()?;
        Some(overlay(&live.attributes, &self.attributes))
    }

    /// The live incarnation's tags now: the create's, then every change on top.
    #[must_use]
    pub fn current_tags(&self) -> Option<BTreeMap<String, String>> {
        let live = self.live()?;
        Some(overlay(&live.tags, &self.tags))
    }

    /// The join of two replicas' records: a later epoch wins whole (its attributes belong to
    /// its incarnation); within an epoch, slot by slot the vote that is there, the tombstone,
    /// each register's greater stamp, the greater watermark.
    #[must_use]
    pub fn merge(&self, incoming: &NameRecord) -> NameRecord {
        if self.epoch != incoming.epoch {
            return if self.epoch > incoming.epoch {
                self.clone()
            } else {
                incoming.clone()
            };
        }
        let mut votes = self.votes.clone();
        for (slot, vote) in votes.iter_mut().zip(&incoming.votes) {
            // A slot is written once per epoch, by its own replica, so two copies that both
            // hold a vote hold the same one; the greater keeps the merge total.
            if vote.as_ref() > slot.as_ref() {
                slot.clone_from(vote);
            }
        }
        NameRecord {
            epoch: self.epoch,
            votes,
            deleted_at: self.deleted_at.max(incoming.deleted_at),
            attributes: join_registers(&self.attributes, &incoming.attributes),
            tags: join_registers(&self.tags, &incoming.tags),
            purge_watermark: self.purge_watermark.max(incoming.purge_watermark),
        }
    }
}

fn overlay(
    created: &BTreeMap<String, String>,
    changes: &BTreeMap<String, Register>,
) -> BTreeMap<String, String> {
    let mut current = created.clone();
    for (name, register) in changes {
        match &register.value {
            Some(value) => current.insert(name.clone(), value.clone()),
            None => current.remove(name),
        };
    }
    current
}

fn join_registers(
    a: &BTreeMap<String, Register>,
    b: &BTreeMap<String, Register>,
) -> BTreeMap<String, Register> {
    let mut joined = a.clone();
    for (name, register) in b {
        match joined.get(name) {
            Some(held) if held >= register => {}
            _ => {
                joined.insert(name.clone(), register.clone());
            }
        }
    }
    joined
}

fn join(records: impl IntoIterator<Item = NameRecord>) -> NameRecord {
    records
        .into_iter()
        .fold(NameRecord::default(), |held, incoming| {
            held.merge(&incoming)
        })
}

/// A replica's answer to a vote request for `epoch` (spec §1, Create step 4): it votes for
/// `proposal` in its own `slot` if it is behind (a lower epoch: it starts `epoch` with no votes)
/// or if in `epoch` it holds no tombstone and has not voted. Either way it answers with the
/// record it then holds, which shows whom it voted for. Returns that record and whether it
/// changed (and must be fsynced before the answer).
#[must_use]
pub fn vote(held: &NameRecord, slot: usize, epoch: u32, proposal: &Proposal) -> (NameRecord, bool) {
    assert!(slot < REPLICAS, "a name has three replicas");
    let mut record = held.clone();
    if record.epoch < epoch {
        record = NameRecord {
            epoch,
            ..NameRecord::default()
        };
    }
    if record.epoch == epoch && record.deleted_at.is_none() && record.votes[slot].is_none() {
        record.votes[slot] = Some(Box::new(proposal.clone()));
    }
    let changed = record != *held;
    (record, changed)
}

/// What a coordinator asks a replica of a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameRequest {
    /// Answer with the record.
    Read,
    /// Vote in `epoch` for `proposal`, if this replica may; answer with the record.
    Vote {
        /// The epoch.
        epoch: u32,
        /// The proposal.
        proposal: Proposal,
    },
    /// Merge the record in; ack.
    Write(NameRecord),
    /// A settled record for the receiver's local view (spec §11, the push after a create,
    /// delete or change settles), sent to every node, replica of the name or not. It never
    /// touches a replica's record and is answered `Ack` without being awaited.
    View(NameRecord),
}

/// What a replica of a name answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameReply {
    /// The record it holds (after its fsync).
    Record(NameRecord),
    /// The write is durable.
    Ack,
    /// The request was refused: the receiver is not a replica of the name, or the request is
    /// older than the horizon by its sender's clock. An operation treats it as silence.
    Refused,
}

/// One request to one replica of the name (its slot is its place in the name's replicas).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameOutgoing {
    /// The replica.
    pub to: NodeId,
    /// The operation's round; a reply of another round is ignored.
    pub round: u32,
    /// What it is asked.
    pub request: NameRequest,
}

/// The answer to a create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateAnswer {
    /// The name has this live incarnation, with the attributes the create asked for (whether
    /// this create's proposal won or an agreeing one did).
    Created(QueueIncarnation),
    /// The name is live with other attributes (`QueueNameExists`).
    NameExists(QueueIncarnation),
    /// The name was deleted less than the reuse wait ago (`QueueDeletedRecently`).
    DeletedRecently,
    /// No decision by the deadline, or the name moved on under the create (a delete or a later
    /// epoch): the client retries. The create may still take effect.
    Unavailable,
}

/// The answer to a delete of a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteQueueAnswer {
    /// The tombstone of the incarnation's epoch is durable on two replicas.
    Deleted(QueueIncarnation),
    /// Nothing live under the name (`QueueDoesNotExist`).
    DoesNotExist,
    /// No quorum by the deadline; the delete may still take effect.
    Unavailable,
}

/// The answer to a settled read of a name (spec §11, a local miss or a stale view).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadAnswer {
    /// The merge of two replies, now held by two replicas.
    Settled(NameRecord),
    /// No settled read by the deadline.
    Unavailable,
}

/// An attribute and tag change of one incarnation (spec §1, *SetQueueAttributes, TagQueue,
/// UntagQueue*): blind writes of named registers, `None` removing the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The incarnation the caller resolved; another live one (or none) answers `Gone`.
    pub incarnation: QueueIncarnation,
    /// Attributes to set (`Some`) or to put back to their default (`None`).
    pub attributes: BTreeMap<String, Option<String>>,
    /// Tags to set (`Some`) or to remove (`None`).
    pub tags: BTreeMap<String, Option<String>>,
    /// The tag cap, checked against the read (spec §1: concurrent changes may pass it).
    pub tags_max: usize,
}

/// The answer to an attribute or tag change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeAnswer {
    /// The changed registers are durable on two replicas, stamped `hlc_ms`.
    Changed {
        /// The stamp of every register the change wrote.
        hlc_ms: u64,
    },
    /// The named incarnation is not the live one (`QueueDoesNotExist`); nothing was written.
    Gone,
    /// The change adds a tag beyond the cap (spec §1: checked against the read).
    TooManyTags,
    /// No quorum by the deadline; the change may still take effect.
    Unavailable,
}

/// A purge of one incarnation (spec §2, *Purge*): the coordinator's margins and rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Purge {
    /// The incarnation the caller resolved; another live one (or none) answers `Gone`.
    pub incarnation: QueueIncarnation,
    /// `SKEW_MAX`: the bound on any two nodes' clocks, the margin on both sides of `w`.
    pub skew_ms: u64,
    /// `PURGE_INTERVAL`: the shortest time between two purges of one queue.
    pub interval_ms: u64,
}

/// The answer to a purge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PurgeAnswer {
    /// The watermark `w` is durable on two replicas and the coordinator's clock read more than
    /// `w + SKEW_MAX`: everything that entered before the purge was invoked is hidden, nothing
    /// that enters from now on is.
    Purged {
        /// The watermark written.
        watermark: Millis,
    },
    /// The settled read shows a purge within `PURGE_INTERVAL` (`PurgeQueueInProgress`, best
    /// effort: two purges through two nodes may both pass, which the max merge makes harmless).
    /// Nothing was written.
    InProgress {
        /// How long until the interval since the last purge has passed, by this coordinator.
        retry_after_ms: u64,
    },
    /// The named incarnation is not the live one (`QueueDoesNotExist`); nothing was written.
    Gone,
    /// No quorum, or the margin not yet passed, by the deadline: an error to the client; the
    /// watermark may still have taken effect, like a failed delete.
    Unavailable,
}

/// The answer to a quorum read of a queue's watermark (spec §2, *Receive* step 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatermarkAnswer {
    /// The incarnation's watermark: the greatest of the two replies (`None`: never purged).
    Read(Option<Millis>),
    /// The replies show another incarnation, or none, decided in the name's latest epoch: the
    /// asked-for incarnation was deleted (and its name collected or created again).
    Gone,
    /// Fewer than two replies by the deadline.
    Unavailable,
}

/// The first reading of the purging coordinator's clock at which the purge of watermark
/// `watermark` may be acknowledged: strictly more than `watermark + skew_ms` (spec §2, Purge
/// step 3; acknowledging at exactly `w + SKEW_MAX` lets a later send by a slow clock be
/// purged).
#[must_use]
pub fn purge_answerable_at(watermark: Millis, skew_ms: u64) -> Millis {
    watermark.plus_ms(skew_ms).plus_ms(1)
}

/// What an operation on a name does once its read is settled.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Purpose {
    Create {
        proposal: Proposal,
        reuse_ms: u64,
        epochs_tried: u32,
    },
    Delete,
    Read,
    Change {
        change: Change,
        me: NodeId,
    },
    Purge(Purge),
    /// A quorum read of the incarnation's watermark: no settle, no write.
    Watermark(QueueIncarnation),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Read {
        replies: BTreeMap<NodeId, NameRecord>,
    },
    /// Writing `record` back until two replicas hold it.
    Settle {
        record: NameRecord,
        holders: Vec<NodeId>,
    },
    Vote {
        epoch: u32,
        replies: BTreeMap<NodeId, NameRecord>,
    },
    Tombstone {
        incarnation: QueueIncarnation,
        record: NameRecord,
        acks: Vec<NodeId>,
    },
    /// Writing `record`, whose changed registers are stamped `hlc_ms`.
    Registers {
        hlc_ms: u64,
        record: NameRecord,
        acks: Vec<NodeId>,
    },
    /// Writing `record`, whose watermark is `watermark`.
    Watermark {
        watermark: Millis,
        record: NameRecord,
        acks: Vec<NodeId>,
    },
    /// The watermark is on two replicas: waiting for the coordinator's clock to pass its margin.
    Margin {
        watermark: Millis,
    },
    Answered,
}

/// An operation on a queue name (spec §1, *Actions*): a create, a delete, an attribute or tag
/// change, or a settled read alone, from its settled read to its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameOp {
    replicas: [NodeId; REPLICAS],
    now: Millis,
    purpose: Purpose,
    round: u32,
    phase: Phase,
    /// The last record this operation knows two replicas hold: what it acted on, or what its
    /// tombstone or register write made durable on two.
    settled: Option<NameRecord>,
}

/// The answer of a [`NameOp`], by its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameAnswer {
    /// A create's answer.
    Create(CreateAnswer),
    /// A delete's answer.
    Delete(DeleteQueueAnswer),
    /// A settled read's answer.
    Read(ReadAnswer),
    /// An attribute or tag change's answer.
    Change(ChangeAnswer),
    /// A purge's answer.
    Purge(PurgeAnswer),
    /// A watermark read's answer.
    Watermark(WatermarkAnswer),
}

/// Collection of a name's tombstone (spec §1, *Collection*): once the reuse wait has passed
/// since its delete by the collector's clock `now`, the record to write to the name's three
/// replicas in place of the tombstone of epoch `e`: the empty record of epoch `e + 1`, an
/// ordinary merge that dominates every copy of epoch `e`, so the epoch never starts again.
/// `None` for a record without a tombstone, or before the wait is over.
#[must_use]
pub fn collected(record: &NameRecord, now: Millis, reuse_ms: u64) -> Option<NameRecord> {
    let deleted_at = record.deleted_at?;
    if deleted_at.plus_ms(reuse_ms) > now {
        return None;
    }
    Some(NameRecord {
        epoch: record
            .epoch
            .checked_add(1)
            .expect("a name is not created four billion times"),
        ..NameRecord::default()
    })
}

/// What the join of a watermark read's two replies says of `incarnation` (spec §2, *Receive*
/// step 1). Its watermark is the greatest of the replies: a purge acknowledged before the read
/// began is on two replicas, and one of them is among these two. A name with no record on
/// either replica has had no purge acknowledged, for the same reason: no watermark. Another
/// incarnation decided, or nothing decided in a later epoch or under a tombstone's collection,
/// means the incarnation was deleted: `Gone`.
fn watermark_of(merged: &NameRecord, incarnation: QueueIncarnation) -> WatermarkAnswer {
    match merged.decided() {
        Some(decided) if decided.incarnation == incarnation => {
            WatermarkAnswer::Read(merged.purge_watermark)
        }
        None if *merged == NameRecord::default() => WatermarkAnswer::Read(None),
        _ => WatermarkAnswer::Gone,
    }
}

/// The greatest hybrid-clock stamp a record holds: its incarnations' and its registers'.
fn stamps_max(record: &NameRecord) -> u64 {
    let votes = record
        .votes
        .iter()
        .flatten()
        .map(|vote| vote.incarnation.hlc_ms);
    let registers = record
        .attributes
        .values()
        .chain(record.tags.values())
        .map(|register| register.hlc_ms);
    votes.chain(registers).max().unwrap_or(0)
}

impl NameOp {
    /// Starts a create of the name whose replicas are `replicas` (in ring order: slot `r` is
    /// `replicas[r]`), proposing `proposal`, at `now` by this coordinator's clock; a deleted
    /// name may be created again `reuse_ms` after its delete.
    #[must_use]
    pub fn create(
        replicas: [NodeId; REPLICAS],
        proposal: Proposal,
        now: Millis,
        reuse_ms: u64,
    ) -> (NameOp, Effects<NameAnswer, NameOutgoing>) {
        NameOp::start(
            replicas,
            now,
            Purpose::Create {
                proposal,
                reuse_ms,
                epochs_tried: 0,
            },
        )
    }

    /// Starts a delete of the queue under the name whose replicas are `replicas`.
    #[must_use]
    pub fn delete(
        replicas: [NodeId; REPLICAS],
        now: Millis,
    ) -> (NameOp, Effects<NameAnswer, NameOutgoing>) {
        NameOp::start(replicas, now, Purpose::Delete)
    }

    /// Starts a settled read of the name whose replicas are `replicas` (spec §1, *Settled
    /// read*): it answers with the merge once two replicas hold it.
    #[must_use]
    pub fn read(
        replicas: [NodeId; REPLICAS],
        now: Millis,
    ) -> (NameOp, Effects<NameAnswer, NameOutgoing>) {
        NameOp::start(replicas, now, Purpose::Read)
    }

    /// Starts an attribute and tag change by coordinator `me`, whose clock reads `now`. With
    /// `view`, a fresh settled record from the local view, the read is skipped if the view's
    /// live incarnation is the change's; otherwise the change starts with a settled read.
    #[must_use]
    pub fn change(
        replicas: [NodeId; REPLICAS],
        me: NodeId,
        change: Change,
        now: Millis,
        view: Option<&NameRecord>,
    ) -> (NameOp, Effects<NameAnswer, NameOutgoing>) {
        let incarnation = change.incarnation;
        let purpose = Purpose::Change { change, me };
        match view {
            Some(record) if record.live().map(|live| live.incarnation) == Some(incarnation) => {
                let mut op = NameOp {
                    replicas,
                    now,
                    purpose,
                    round: 0,
                    phase: Phase::Answered,
                    settled: Some(record.clone()),
                };
                let effects = op.act(record);
                (op, effects)
            }
            _ => NameOp::start(replicas, now, purpose),
        }
    }

    /// Starts a purge (spec §2, *Purge*) through the coordinator whose clock reads `now`: a
    /// settled read, the guard, then the watermark `now + SKEW_MAX` to the three replicas; it
    /// answers `Purged` once two replicas acked and [`NameOp::on_clock`] was given a reading
    /// past [`purge_answerable_at`].
    #[must_use]
    pub fn purge(
        replicas: [NodeId; REPLICAS],
        purge: Purge,
        now: Millis,
    ) -> (NameOp, Effects<NameAnswer, NameOutgoing>) {
        NameOp::start(replicas, now, Purpose::Purge(purge))
    }

    /// Starts a quorum read of `incarnation`'s purge watermark (spec §2, *Receive* step 1): the
    /// greatest of two replies, nothing written back (a receive reads it on every call).
    #[must_use]
    pub fn watermark(
        replicas: [NodeId; REPLICAS],
        incarnation: QueueIncarnation,
        now: Millis,
    ) -> (NameOp, Effects<NameAnswer, NameOutgoing>) {
        NameOp::start(replicas, now, Purpose::Watermark(incarnation))
    }

    /// The reading of this coordinator's clock the operation waits for, if it waits for one (a
    /// purge whose watermark is on two replicas): the driver calls [`NameOp::on_clock`] once
    /// its clock reads at least this.
    #[must_use]
    pub fn waits_for_clock(&self) -> Option<Millis> {
        match (&self.phase, &self.purpose) {
            (Phase::Margin { watermark }, Purpose::Purge(purge)) => {
                Some(purge_answerable_at(*watermark, purge.skew_ms))
            }
            _ => None,
        }
    }

    /// The coordinator's clock reads `now`: a purge waiting for its margin answers once `now`
    /// is past it; anything else ignores the reading.
    pub fn on_clock(&mut self, now: Millis) -> Effects<NameAnswer, NameOutgoing> {
        match self.waits_for_clock() {
            Some(at) if now >= at => {
                let Phase::Margin { watermark } = self.phase else {
                    unreachable!("only a purge's margin waits for the clock");
                };
                self.finish(NameAnswer::Purge(PurgeAnswer::Purged { watermark }))
            }
            _ => Effects::none(),
        }
    }

    /// The last record this operation knows two replicas hold (the settled read it acted on,
    /// or the tombstone or registers it wrote to two), for the local view and the push.
    #[must_use]
    pub fn settled(&self) -> Option<&NameRecord> {
        self.settled.as_ref()
    }

    fn start(
        replicas: [NodeId; REPLICAS],
        now: Millis,
        purpose: Purpose,
    ) -> (NameOp, Effects<NameAnswer, NameOutgoing>) {
        let op = NameOp {
            replicas,
            now,
            purpose,
            round: 1,
            phase: Phase::Read {
                replies: BTreeMap::new(),
            },
            settled: None,
        };
        let sends = op.to_all(&NameRequest::Read);
        (op, Effects::sends(sends))
    }

    fn to_all(&self, request: &NameRequest) -> Vec<NameOutgoing> {
        self.replicas
            .iter()
            .map(|to| NameOutgoing {
                to: *to,
                round: self.round,
                request: request.clone(),
            })
            .collect()
    }

    /// One replica's reply to round `round`.
    pub fn on_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &NameReply,
    ) -> Effects<NameAnswer, NameOutgoing> {
        if round != self.round || !self.replicas.contains(&from) {
            return Effects::none();
        }
        match (&mut self.phase, reply) {
            (Phase::Read { replies }, NameReply::Record(record)) => {
                let first = replies.insert(from, record.clone()).is_none();
                if !first || replies.len() != READ_QUORUM {
                    return Effects::none();
                }
                let merged = join(replies.values().cloned());
                if let Purpose::Watermark(incarnation) = self.purpose {
                    let answer = watermark_of(&merged, incarnation);
                    return self.finish(NameAnswer::Watermark(answer));
                }
                let holders: Vec<NodeId> = replies
                    .iter()
                    .filter(|(_, reply)| **reply == merged)
                    .map(|(node, _)| *node)
                    .collect();
                self.settle(merged, holders)
            }
            (Phase::Settle { record, holders }, NameReply::Ack) => {
                if !holders.contains(&from) {
                    holders.push(from);
                }
                if holders.len() >= WRITE_QUORUM {
                    let record = record.clone();
                    self.act(&record)
                } else {
                    Effects::none()
                }
            }
            (Phase::Vote { epoch, replies }, NameReply::Record(record)) => {
                let epoch = *epoch;
                replies.insert(from, record.clone());
                let merged = join(replies.values().cloned());
                if merged.epoch > epoch || merged.deleted_at.is_some() {
                    // The name moved on under this create: a later epoch or a delete.
                    return self.finish(NameAnswer::Create(CreateAnswer::Unavailable));
                }
                if merged.decided().is_some() {
                    // Settle the decision (the votes are on different replicas) before acting.
                    let holders = replies
                        .iter()
                        .filter(|(_, reply)| **reply == merged)
                        .map(|(node, _)| *node)
                        .collect();
                    return self.settle(merged, holders);
                }
                if merged.split() {
                    return self.propose(epoch + 1);
                }
                Effects::none()
            }
            (
                Phase::Tombstone {
                    incarnation,
                    record,
                    acks,
                },
                NameReply::Ack,
            ) => {
                if !acks.contains(&from) {
                    acks.push(from);
                }
                if acks.len() >= WRITE_QUORUM {
                    let incarnation = *incarnation;
                    self.settled = Some(record.clone());
                    self.finish(NameAnswer::Delete(DeleteQueueAnswer::Deleted(incarnation)))
                } else {
                    Effects::none()
                }
            }
            (
                Phase::Registers {
                    hlc_ms,
                    record,
                    acks,
                },
                NameReply::Ack,
            ) => {
                if !acks.contains(&from) {
                    acks.push(from);
                }
                if acks.len() >= WRITE_QUORUM {
                    let hlc_ms = *hlc_ms;
                    self.settled = Some(record.clone());
                    self.finish(NameAnswer::Change(ChangeAnswer::Changed { hlc_ms }))
                } else {
                    Effects::none()
                }
            }
            (
                Phase::Watermark {
                    watermark,
                    record,
                    acks,
                },
                NameReply::Ack,
            ) => {
                if !acks.contains(&from) {
                    acks.push(from);
                }
                if acks.len() >= WRITE_QUORUM {
                    // Two durable acks; the answer waits for the clock (`on_clock`).
                    let watermark = *watermark;
                    self.settled = Some(record.clone());
                    self.phase = Phase::Margin { watermark };
                }
                Effects::none()
            }
            _ => Effects::none(),
        }
    }

    /// The deadline passed.
    pub fn on_timeout(&mut self) -> Effects<NameAnswer, NameOutgoing> {
        if self.phase == Phase::Answered {
            return Effects::none();
        }
        let answer = match self.purpose {
            Purpose::Create { .. } => NameAnswer::Create(CreateAnswer::Unavailable),
            Purpose::Delete => NameAnswer::Delete(DeleteQueueAnswer::Unavailable),
            Purpose::Read => NameAnswer::Read(ReadAnswer::Unavailable),
            Purpose::Change { .. } => NameAnswer::Change(ChangeAnswer::Unavailable),
            Purpose::Purge(_) => NameAnswer::Purge(PurgeAnswer::Unavailable),
            Purpose::Watermark(_) => NameAnswer::Watermark(WatermarkAnswer::Unavailable),
        };
        self.finish(answer)
    }

    /// The settle rule: act on `merged` only once two replicas hold it; write it to the others
    /// first if fewer do.
    fn settle(
        &mut self,
        merged: NameRecord,
        holders: Vec<NodeId>,
    ) -> Effects<NameAnswer, NameOutgoing> {
        if holders.len() >= WRITE_QUORUM {
            return self.act(&merged);
        }
        self.round += 1;
        let sends = self
            .replicas
            .iter()
            .filter(|node| !holders.contains(node))
            .map(|to| NameOutgoing {
                to: *to,
                round: self.round,
                request: NameRequest::Write(merged.clone()),
            })
            .collect();
        self.phase = Phase::Settle {
            record: merged,
            holders,
        };
        Effects::sends(sends)
    }

    fn act(&mut self, record: &NameRecord) -> Effects<NameAnswer, NameOutgoing> {
        self.settled = Some(record.clone());
        match &self.purpose {
            Purpose::Create {
                proposal, reuse_ms, ..
            } => {
                if let Some(winner) = record.live() {
                    let answer =
                        if record.current_attributes().as_ref() == Some(&proposal.attributes) {
                            CreateAnswer::Created(winner.incarnation)
                        } else {
                            CreateAnswer::NameExists(winner.incarnation)
                        };
                    return self.finish(NameAnswer::Create(answer));
                }
                if let Some(deleted_at) = record.deleted_at {
                    if deleted_at.plus_ms(*reuse_ms) > self.now {
                        return self.finish(NameAnswer::Create(CreateAnswer::DeletedRecently));
                    }
                    return self.propose(record.epoch + 1);
                }
                if record.split() {
                    return self.propose(record.epoch + 1);
                }
                self.propose(record.epoch)
            }
            Purpose::Delete => {
                let Some(live) = record.live() else {
                    return self.finish(NameAnswer::Delete(DeleteQueueAnswer::DoesNotExist));
                };
                let incarnation = live.incarnation;
                let mut tombstone = record.clone();
                tombstone.deleted_at = Some(self.now);
                self.round += 1;
                let sends = self.to_all(&NameRequest::Write(tombstone.clone()));
                self.phase = Phase::Tombstone {
                    incarnation,
                    record: tombstone,
                    acks: Vec::new(),
                };
                Effects::sends(sends)
            }
            Purpose::Read => self.finish(NameAnswer::Read(ReadAnswer::Settled(record.clone()))),
            Purpose::Change { change, me } => {
                let (change, me) = (change.clone(), *me);
                self.write_registers(record, &change, me)
            }
            Purpose::Purge(purge) => {
                let purge = *purge;
                self.write_watermark(record, purge)
            }
            Purpose::Watermark(_) => unreachable!("a watermark read answers without settling"),
        }
    }

    /// The purge's guard and write (spec §2, Purge steps 1 and 2): the incarnation is live; no
    /// purge within `PURGE_INTERVAL` by the settled watermark (`w_prev` was written as
    /// `t_prev + SKEW_MAX`, so `t − t_prev < PURGE_INTERVAL` is `w_prev > t − PURGE_INTERVAL +
    /// SKEW_MAX`); then the settled record with the watermark `t + SKEW_MAX`, to all three.
    fn write_watermark(
        &mut self,
        record: &NameRecord,
        purge: Purge,
    ) -> Effects<NameAnswer, NameOutgoing> {
        if record.live().map(|live| live.incarnation) != Some(purge.incarnation) {
            return self.finish(NameAnswer::Purge(PurgeAnswer::Gone));
        }
        if let Some(previous) = record.purge_watermark {
            let next_allowed = previous.plus_ms(purge.interval_ms);
            let now_with_skew = self.now.plus_ms(purge.skew_ms);
            if next_allowed > now_with_skew {
                return self.finish(NameAnswer::Purge(PurgeAnswer::InProgress {
                    retry_after_ms: next_allowed.since(now_with_skew),
                }));
            }
        }
        let watermark = self.now.plus_ms(purge.skew_ms);
        let mut written = record.clone();
        written.purge_watermark = written.purge_watermark.max(Some(watermark));
        self.round += 1;
        let sends = self.to_all(&NameRequest::Write(written.clone()));
        self.phase = Phase::Watermark {
            watermark,
            record: written,
            acks: Vec::new(),
        };
        Effects::sends(sends)
    }

    /// The change's write (spec §1): the settled record with every changed register stamped
    /// above this coordinator's clock and above every stamp the record holds, to all three.
    fn write_registers(
        &mut self,
        record: &NameRecord,
        change: &Change,
        me: NodeId,
    ) -> Effects<NameAnswer, NameOutgoing> {
        if record.live().map(|live| live.incarnation) != Some(change.incarnation) {
            return self.finish(NameAnswer::Change(ChangeAnswer::Gone));
        }
        let tags_now = record.current_tags().expect("a live record has tags");
        let adds_tag = change
            .tags
            .iter()
            .any(|(key, value)| value.is_some() && !tags_now.contains_key(key));
        let mut tags_after = tags_now;
        for (key, value) in &change.tags {
            match value {
                Some(value) => tags_after.insert(key.clone(), value.clone()),
                None => tags_after.remove(key),
            };
        }
        if adds_tag && tags_after.len() > change.tags_max {
            return self.finish(NameAnswer::Change(ChangeAnswer::TooManyTags));
        }
        let hlc_ms = self.now.0.max(stamps_max(record)) + 1;
        let register = |value: &Option<String>| Register {
            hlc_ms,
            node: me,
            value: value.clone(),
        };
        let mut written = record.clone();
        for (name, value) in &change.attributes {
            written.attributes.insert(name.clone(), register(value));
        }
        for (key, value) in &change.tags {
            written.tags.insert(key.clone(), register(value));
        }
        self.round += 1;
        let sends = self.to_all(&NameRequest::Write(written.clone()));
        self.phase = Phase::Registers {
            hlc_ms,
            record: written,
            acks: Vec::new(),
        };
        Effects::sends(sends)
    }

    fn propose(&mut self, epoch: u32) -> Effects<NameAnswer, NameOutgoing> {
        let Purpose::Create {
            proposal,
            epochs_tried,
            ..
        } = &mut self.purpose
        else {
            unreachable!("only a create proposes");
        };
        if *epochs_tried == CREATE_EPOCHS_MAX {
            return self.finish(NameAnswer::Create(CreateAnswer::Unavailable));
        }
        if *epochs_tried > 0 {
            // A fresh incarnation for every proposal: the nonce of the next is the next number.
            proposal.incarnation.nonce = proposal.incarnation.nonce.wrapping_add(1);
        }
        *epochs_tried += 1;
        let request = NameRequest::Vote {
            epoch,
            proposal: proposal.clone(),
        };
        self.round += 1;
        self.phase = Phase::Vote {
            epoch,
            replies: BTreeMap::new(),
        };
        Effects::sends(self.to_all(&request))
    }

    fn finish(&mut self, answer: NameAnswer) -> Effects<NameAnswer, NameOutgoing> {
        self.phase = Phase::Answered;
        Effects::answer(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const R: [NodeId; REPLICAS] = [NodeId(1), NodeId(2), NodeId(3)];
    const REUSE_MS: u64 = 60_000;

    fn proposal(node: u16, nonce: u64, visibility: &str) -> Proposal {
        Proposal {
            incarnation: QueueIncarnation {
                hlc_ms: 1_000,
                node,
                nonce,
            },
            attributes: BTreeMap::from([("VisibilityTimeout".to_owned(), visibility.to_owned())]),
            tags: BTreeMap::new(),
        }
    }

    /// Three replicas of one name, answering as spec §1 says.
    #[derive(Default)]
    struct Replicas {
        held: [NameRecord; REPLICAS],
    }

    impl Replicas {
        fn answer(&mut self, out: &NameOutgoing) -> NameReply {
            let slot = R
                .iter()
                .position(|node| *node == out.to)
                .expect("a replica");
            match &out.request {
                NameRequest::Read => NameReply::Record(self.held[slot].clone()),
                NameRequest::Vote { epoch, proposal } => {
                    let (record, _) = vote(&self.held[slot], slot, *epoch, proposal);
                    self.held[slot] = record.clone();
                    NameReply::Record(record)
                }
                NameRequest::Write(record) => {
                    self.held[slot] = self.held[slot].merge(record);
                    NameReply::Ack
                }
                NameRequest::View(_) => NameReply::Refused,
            }
        }

        /// Runs `op` to its answer, delivering every request in order.
        fn run(
            &mut self,
            (mut op, effects): (NameOp, Effects<NameAnswer, NameOutgoing>),
        ) -> NameAnswer {
            let mut queue: Vec<NameOutgoing> = effects.sends;
            while !queue.is_empty() {
                let out = queue.remove(0);
                let reply = self.answer(&out);
                let effects = op.on_reply(out.to, out.round, &reply);
                if let Some(answer) = effects.answer {
                    return answer;
                }
                queue.extend(effects.sends);
            }
            op.on_timeout().answer.expect("a timeout answers")
        }
    }

    #[test]
    fn an_uncontested_create_decides_its_proposal_and_a_repeat_agrees() {
        let mut replicas = Replicas::default();
        let a = proposal(1, 7, "30");
        let answer = replicas.run(NameOp::create(R, a.clone(), Millis(5), REUSE_MS));
        assert_eq!(
            answer,
            NameAnswer::Create(CreateAnswer::Created(a.incarnation))
        );
        let again = replicas.run(NameOp::create(R, proposal(2, 9, "30"), Millis(6), REUSE_MS));
        assert_eq!(
            again,
            NameAnswer::Create(CreateAnswer::Created(a.incarnation))
        );
        let other = replicas.run(NameOp::create(R, proposal(2, 9, "45"), Millis(6), REUSE_MS));
        assert_eq!(
            other,
            NameAnswer::Create(CreateAnswer::NameExists(a.incarnation))
        );
    }

    /// Two creates read at once, then their votes interleave: replica 1 votes for `a`,
    /// replica 2 for `b`, replica 3 for `a`.
    fn race(b_attributes: &str) -> (QueueIncarnation, NameAnswer, NameAnswer) {
        let mut replicas = Replicas::default();
        let (a, b) = (proposal(1, 1, "30"), proposal(2, 2, b_attributes));
        let (mut op_a, effects_a) = NameOp::create(R, a.clone(), Millis(5), REUSE_MS);
        let (mut op_b, effects_b) = NameOp::create(R, b, Millis(5), REUSE_MS);
        let step = |op: &mut NameOp, out: &NameOutgoing, replicas: &mut Replicas| {
            let reply = replicas.answer(out);
            op.on_reply(out.to, out.round, &reply)
        };
        // Both reads see nothing; each then proposes in epoch 0.
        let mut votes_a = Vec::new();
        for out in &effects_a.sends[..2] {
            votes_a.extend(step(&mut op_a, out, &mut replicas).sends);
        }
        let mut votes_b = Vec::new();
        for out in &effects_b.sends[..2] {
            votes_b.extend(step(&mut op_b, out, &mut replicas).sends);
        }
        let by = |votes: &[NameOutgoing], node: u16| {
            votes
                .iter()
                .find(|out| out.to == NodeId(node))
                .unwrap()
                .clone()
        };
        let mut pending_a = vec![by(&votes_a, 1), by(&votes_a, 3)];
        let mut pending_b = vec![by(&votes_b, 2), by(&votes_b, 1), by(&votes_b, 3)];
        pending_a.extend(step(&mut op_a, &pending_a[0].clone(), &mut replicas).sends);
        pending_b.extend(step(&mut op_b, &pending_b[0].clone(), &mut replicas).sends);
        let mut answers = [None, None];
        for (i, (op, pending)) in [(&mut op_a, &mut pending_a), (&mut op_b, &mut pending_b)]
            .into_iter()
            .enumerate()
        {
            let mut next = 1;
            while answers[i].is_none() && next < pending.len() {
                let out = pending[next].clone();
                next += 1;
                let effects = step(op, &out, &mut replicas);
                answers[i] = effects.answer;
                pending.extend(effects.sends);
            }
        }
        let [Some(answer_a), Some(answer_b)] = answers else {
            panic!("both creates answer: {answers:?}");
        };
        (a.incarnation, answer_a, answer_b)
    }

    #[test]
    fn of_two_racing_creates_one_incarnation_wins_and_the_loser_compares_attributes() {
        let (a, answer_a, answer_b) = race("45");
        assert_eq!(answer_a, NameAnswer::Create(CreateAnswer::Created(a)));
        assert_eq!(answer_b, NameAnswer::Create(CreateAnswer::NameExists(a)));
        let (a, answer_a, answer_b) = race("30");
        assert_eq!(answer_a, NameAnswer::Create(CreateAnswer::Created(a)));
        assert_eq!(
            answer_b,
            NameAnswer::Create(CreateAnswer::Created(a)),
            "agreeing loser"
        );
    }

    #[test]
    fn a_split_epoch_moves_the_next_proposal_to_the_next_epoch() {
        let mut replicas = Replicas::default();
        for (slot, node) in [1u16, 2, 3].into_iter().enumerate() {
            let (record, _) = vote(&replicas.held[slot], slot, 0, &proposal(node, 0, "30"));
            replicas.held[slot] = record;
        }
        for slot in 0..REPLICAS {
            let others = replicas.held.clone();
            for other in &others {
                replicas.held[slot] = replicas.held[slot].merge(other);
            }
        }
        assert!(replicas.held[0].split());
        let c = proposal(1, 5, "30");
        let answer = replicas.run(NameOp::create(R, c.clone(), Millis(5), REUSE_MS));
        assert_eq!(
            answer,
            NameAnswer::Create(CreateAnswer::Created(c.incarnation))
        );
        assert_eq!(replicas.held[0].epoch, 1);
    }

    #[test]
    fn a_deleted_name_waits_its_reuse_time_then_gets_a_new_incarnation() {
        let mut replicas = Replicas::default();
        let a = proposal(1, 1, "30");
        replicas.run(NameOp::create(R, a.clone(), Millis(5), REUSE_MS));
        assert_eq!(
            replicas.run(NameOp::delete(R, Millis(100))),
            NameAnswer::Delete(DeleteQueueAnswer::Deleted(a.incarnation))
        );
        assert_eq!(
            replicas.run(NameOp::delete(R, Millis(101))),
            NameAnswer::Delete(DeleteQueueAnswer::DoesNotExist)
        );
        let b = proposal(2, 3, "30");
        assert_eq!(
            replicas.run(NameOp::create(R, b.clone(), Millis(60_099), REUSE_MS)),
            NameAnswer::Create(CreateAnswer::DeletedRecently)
        );
        assert_eq!(
            replicas.run(NameOp::create(R, b.clone(), Millis(60_100), REUSE_MS)),
            NameAnswer::Create(CreateAnswer::Created(b.incarnation))
        );
        assert_ne!(a.incarnation, b.incarnation);
        assert!(replicas.held.iter().all(|held| held.epoch == 1));
    }

    #[test]
    fn a_replica_votes_once_per_epoch_and_never_over_a_tombstone() {
        let (a, b) = (proposal(1, 1, "30"), proposal(2, 2, "30"));
        let (voted, changed) = vote(&NameRecord::default(), 0, 0, &a);
        assert!(changed);
        let (again, changed) = vote(&voted, 0, 0, &b);
        assert!(!changed);
        assert_eq!(again.votes[0].as_deref(), Some(&a));
        let mut deleted = voted.clone();
        deleted.deleted_at = Some(Millis(3));
        assert!(!vote(&deleted, 1, 0, &b).1);
        let (behind, changed) = vote(&deleted, 1, 1, &b);
        assert!(changed, "a later epoch starts fresh");
        assert_eq!(behind.votes[1].as_deref(), Some(&b));
    }

    #[test]
    fn attribute_changes_merge_by_their_stamps() {
        let mut a = NameRecord::default();
        let (voted, _) = vote(&a, 0, 0, &proposal(1, 1, "30"));
        a = voted.merge(&vote(&voted, 1, 0, &proposal(1, 1, "30")).0);
        let change = |hlc_ms, node, value: &str| {
            let mut record = a.clone();
            record.attributes.insert(
                "VisibilityTimeout".to_owned(),
                Register {
                    hlc_ms,
                    node: NodeId(node),
                    value: Some(value.to_owned()),
                },
            );
            record
        };
        let (early, late) = (change(2_000, 2, "10"), change(3_000, 1, "20"));
        let joined = early.merge(&late);
        assert_eq!(joined, late.merge(&early));
        assert_eq!(
            joined.current_attributes().unwrap()["VisibilityTimeout"],
            "20"
        );
    }

    fn change(incarnation: QueueIncarnation) -> Change {
        Change {
            incarnation,
            attributes: BTreeMap::new(),
            tags: BTreeMap::new(),
            tags_max: 2,
        }
    }

    fn set(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned)))
            .collect()
    }

    fn created() -> (Replicas, Proposal) {
        let mut replicas = Replicas::default();
        let a = proposal(1, 1, "30");
        replicas.run(NameOp::create(R, a.clone(), Millis(5), REUSE_MS));
        (replicas, a)
    }

    #[test]
    fn a_change_writes_registers_stamped_above_the_clock_and_the_read_on_two_replicas() {
        let (mut replicas, a) = created();
        let mut first = change(a.incarnation);
        first.attributes = set(&[("VisibilityTimeout", Some("45"))]);
        first.tags = set(&[("team", Some("blue"))]);
        // The coordinator's clock (10) is behind the incarnation's stamp (1,000).
        let (op, effects) = NameOp::change(R, NodeId(2), first, Millis(10), None);
        assert!(
            effects
                .sends
                .iter()
                .all(|out| out.request == NameRequest::Read)
        );
        let answer = replicas.run((op, effects));
        assert_eq!(
            answer,
            NameAnswer::Change(ChangeAnswer::Changed { hlc_ms: 1_001 })
        );
        let held: Vec<&NameRecord> = replicas
            .held
            .iter()
            .filter(|held| {
                held.current_attributes()
                    .and_then(|current| current.get("VisibilityTimeout").cloned())
                    .as_deref()
                    == Some("45")
            })
            .collect();
        assert!(held.len() >= 2, "the change is on two replicas");
        assert_eq!(held[0].current_tags().unwrap()["team"], "blue");
        assert_eq!(held[0].attributes["VisibilityTimeout"].node, NodeId(2));

        // A later change through a node whose clock is further behind still wins: its read
        // saw the first change's stamp.
        let mut second = change(a.incarnation);
        second.attributes = set(&[("VisibilityTimeout", None)]);
        let answer = replicas.run(NameOp::change(R, NodeId(1), second, Millis(3), None));
        assert_eq!(
            answer,
            NameAnswer::Change(ChangeAnswer::Changed { hlc_ms: 1_002 })
        );
        let merged = join(replicas.held.iter().cloned());
        assert!(
            !merged
                .current_attributes()
                .unwrap()
                .contains_key("VisibilityTimeout"),
            "the register holds the removal"
        );
    }

    #[test]
    fn a_change_of_another_or_no_incarnation_writes_nothing() {
        let (mut replicas, a) = created();
        let mut other = a.incarnation;
        other.nonce += 100;
        let before = replicas.held.clone();
        let mut gone = change(other);
        gone.attributes = set(&[("DelaySeconds", Some("5"))]);
        assert_eq!(
            replicas.run(NameOp::change(R, NodeId(1), gone, Millis(50), None)),
            NameAnswer::Change(ChangeAnswer::Gone)
        );
        assert_eq!(replicas.held, before);
        replicas.run(NameOp::delete(R, Millis(60)));
        let mut late = change(a.incarnation);
        late.attributes = set(&[("DelaySeconds", Some("5"))]);
        assert_eq!(
            replicas.run(NameOp::change(R, NodeId(1), late, Millis(70), None)),
            NameAnswer::Change(ChangeAnswer::Gone)
        );
    }

    #[test]
    fn a_fresh_view_skips_the_read_and_a_view_of_another_incarnation_does_not() {
        let (mut replicas, a) = created();
        let view = join(replicas.held.iter().cloned());
        let (_, effects) =
            NameOp::change(R, NodeId(1), change(a.incarnation), Millis(50), Some(&view));
        assert!(
            effects
                .sends
                .iter()
                .all(|out| matches!(out.request, NameRequest::Write(_))),
            "straight to the write"
        );
        let stale = NameRecord::default();
        let (_, effects) = NameOp::change(
            R,
            NodeId(1),
            change(a.incarnation),
            Millis(50),
            Some(&stale),
        );
        assert!(
            effects
                .sends
                .iter()
                .all(|out| out.request == NameRequest::Read)
        );
        let answer = replicas.run(NameOp::change(
            R,
            NodeId(1),
            change(a.incarnation),
            Millis(50),
            Some(&view),
        ));
        assert!(matches!(
            answer,
            NameAnswer::Change(ChangeAnswer::Changed { .. })
        ));
    }

    #[test]
    fn a_tag_beyond_the_cap_is_refused_but_changing_a_held_tag_is_not() {
        let (mut replicas, a) = created();
        let mut two = change(a.incarnation);
        two.tags = set(&[("a", Some("1")), ("b", Some("2"))]);
        assert!(matches!(
            replicas.run(NameOp::change(R, NodeId(1), two, Millis(50), None)),
            NameAnswer::Change(ChangeAnswer::Changed { .. })
        ));
        let mut third = change(a.incarnation);
        third.tags = set(&[("c", Some("3"))]);
        assert_eq!(
            replicas.run(NameOp::change(R, NodeId(1), third, Millis(51), None)),
            NameAnswer::Change(ChangeAnswer::TooManyTags)
        );
        let mut swap = change(a.incarnation);
        swap.tags = set(&[("a", None), ("c", Some("3"))]);
        assert!(matches!(
            replicas.run(NameOp::change(R, NodeId(1), swap, Millis(52), None)),
            NameAnswer::Change(ChangeAnswer::Changed { .. })
        ));
        let mut retag = change(a.incarnation);
        retag.tags_max = 1;
        retag.tags = set(&[("b", Some("22"))]);
        assert!(
            matches!(
                replicas.run(NameOp::change(R, NodeId(1), retag, Millis(53), None)),
                NameAnswer::Change(ChangeAnswer::Changed { .. })
            ),
            "over the cap, a held tag still changes"
        );
    }

    #[test]
    fn a_settled_read_writes_a_decision_back_until_two_replicas_hold_it() {
        let mut replicas = Replicas::default();
        let a = proposal(1, 1, "30");
        // Replicas 1 and 2 voted for `a`, each holding only its own vote.
        for slot in 0..2 {
            replicas.held[slot] = vote(&replicas.held[slot], slot, 0, &a).0;
        }
        let (mut op, effects) = NameOp::read(R, Millis(5));
        let mut writes = Vec::new();
        for out in &effects.sends[..2] {
            let reply = replicas.answer(out);
            let step = op.on_reply(out.to, out.round, &reply);
            assert_eq!(step.answer, None, "two single votes are not yet settled");
            writes.extend(step.sends);
        }
        assert_eq!(writes.len(), REPLICAS, "the merge goes to all three");
        let mut answer = None;
        for out in &writes {
            let reply = replicas.answer(out);
            answer = answer.or(op.on_reply(out.to, out.round, &reply).answer);
        }
        let Some(NameAnswer::Read(ReadAnswer::Settled(record))) = answer else {
            panic!("a settled read answers: {answer:?}");
        };
        assert_eq!(record.live().map(|p| p.incarnation), Some(a.incarnation));
        assert_eq!(op.settled(), Some(&record));
    }

    #[test]
    fn a_collected_tombstone_moves_the_name_to_the_next_epoch_and_outranks_a_straggler() {
        let (mut replicas, a) = created();
        assert_eq!(collected(&replicas.held[0], Millis(10), REUSE_MS), None);
        replicas.run(NameOp::delete(R, Millis(100)));
        let tombstone = join(replicas.held.iter().cloned());
        assert_eq!(collected(&tombstone, Millis(60_099), REUSE_MS), None);
        let empty = collected(&tombstone, Millis(60_100), REUSE_MS).expect("due");
        assert_eq!(empty.epoch, tombstone.epoch + 1);
        assert_eq!(empty.live(), None);
        // Two replicas take the collection; the third keeps the tombstone (a straggler).
        for held in &mut replicas.held[..2] {
            *held = held.merge(&empty);
        }
        let b = proposal(2, 5, "45");
        let answer = replicas.run(NameOp::create(R, b.clone(), Millis(60_200), REUSE_MS));
        assert_eq!(
            answer,
            NameAnswer::Create(CreateAnswer::Created(b.incarnation))
        );
        // The straggler's old tombstone reaches every replica (anti-entropy, a late write).
        for held in &mut replicas.held {
            *held = held.merge(&tombstone);
        }
        for x in 0..REPLICAS {
            for y in x + 1..REPLICAS {
                let seen = replicas.held[x].merge(&replicas.held[y]);
                assert_eq!(
                    seen.live().map(|live| live.incarnation),
                    Some(b.incarnation),
                    "every read quorum still sees the new queue, not {a:?}'s tombstone"
                );
            }
        }
    }

    fn record() -> impl Strategy<Value = NameRecord> {
        let vote = proptest::option::of(
            (1u16..3, 0u64..2).prop_map(|(n, i)| Box::new(proposal(n, i, "30"))),
        );
        (
            0u32..2,
            [vote.clone(), vote.clone(), vote],
            proptest::option::of(0u64..3),
            proptest::option::of((0u64..3, 1u16..3)),
            proptest::option::of(0u64..3),
        )
            .prop_map(|(epoch, votes, deleted, register, watermark)| NameRecord {
                epoch,
                votes,
                deleted_at: deleted.map(Millis),
                attributes: register
                    .map(|(hlc_ms, node)| {
                        BTreeMap::from([(
                            "DelaySeconds".to_owned(),
                            Register {
                                hlc_ms,
                                node: NodeId(node),
                                value: Some(hlc_ms.to_string()),
                            },
                        )])
                    })
                    .unwrap_or_default(),
                tags: BTreeMap::new(),
                purge_watermark: watermark.map(Millis),
            })
    }

    const SKEW_MS: u64 = 500;
    const INTERVAL_MS: u64 = 60_000;

    fn purge_of(incarnation: QueueIncarnation) -> Purge {
        Purge {
            incarnation,
            skew_ms: SKEW_MS,
            interval_ms: INTERVAL_MS,
        }
    }

    /// Runs a purge started at `now` until it waits for the clock or answers: every request
    /// delivered in order, as `Replicas::run` does.
    fn purge_until_margin(
        replicas: &mut Replicas,
        purge: Purge,
        now: u64,
    ) -> (NameOp, Option<NameAnswer>) {
        let (mut op, effects) = NameOp::purge(R, purge, Millis(now));
        let mut queue = effects.sends;
        while !queue.is_empty() {
            let out = queue.remove(0);
            let reply = replicas.answer(&out);
            let effects = op.on_reply(out.to, out.round, &reply);
            if effects.answer.is_some() {
                return (op, effects.answer);
            }
            queue.extend(effects.sends);
        }
        (op, None)
    }

    #[test]
    fn a_purge_writes_now_plus_skew_to_two_replicas_and_answers_only_past_the_margin() {
        let (mut replicas, a) = created();
        let (mut op, answer) = purge_until_margin(&mut replicas, purge_of(a.incarnation), 10_000);
        assert_eq!(answer, None, "two acks are not yet the answer");
        let holding = replicas
            .held
            .iter()
            .filter(|held| held.purge_watermark == Some(Millis(10_500)))
            .count();
        assert!(holding >= 2, "w = t + SKEW_MAX on two replicas");
        assert_eq!(op.waits_for_clock(), Some(Millis(11_001)));
        assert_eq!(op.on_clock(Millis(10_999)).answer, None);
        assert_eq!(
            op.on_clock(Millis(11_000)).answer,
            None,
            "at exactly w + SKEW_MAX a later send by a slow clock would still be purged"
        );
        assert_eq!(
            op.on_clock(Millis(11_001)).answer,
            Some(NameAnswer::Purge(PurgeAnswer::Purged {
                watermark: Millis(10_500)
            }))
        );
        assert_eq!(op.on_clock(Millis(11_002)).answer, None, "answers once");
        assert_eq!(
            op.settled().and_then(|record| record.purge_watermark),
            Some(Millis(10_500))
        );
    }

    #[test]
    fn a_purge_times_out_before_its_margin_as_unavailable() {
        let (mut replicas, a) = created();
        let (mut op, _) = purge_until_margin(&mut replicas, purge_of(a.incarnation), 10_000);
        assert_eq!(
            op.on_timeout().answer,
            Some(NameAnswer::Purge(PurgeAnswer::Unavailable))
        );
        assert_eq!(
            op.on_clock(Millis(20_000)).answer,
            None,
            "never after the timeout"
        );
    }

    #[test]
    fn a_second_purge_within_the_interval_is_refused_with_the_time_left() {
        let (mut replicas, a) = created();
        let (mut op, _) = purge_until_margin(&mut replicas, purge_of(a.incarnation), 10_000);
        assert!(op.on_clock(Millis(11_001)).answer.is_some());
        let before = replicas.held.clone();
        let (_, answer) = purge_until_margin(&mut replicas, purge_of(a.incarnation), 30_000);
        assert_eq!(
            answer,
            Some(NameAnswer::Purge(PurgeAnswer::InProgress {
                retry_after_ms: 40_000
            }))
        );
        assert_eq!(replicas.held, before, "a refused purge writes nothing");
        let (_, answer) = purge_until_margin(&mut replicas, purge_of(a.incarnation), 69_999);
        assert_eq!(
            answer,
            Some(NameAnswer::Purge(PurgeAnswer::InProgress {
                retry_after_ms: 1
            }))
        );
        // As on one node: 60 s after the last purge's invocation it may purge again.
        let (op, answer) = purge_until_margin(&mut replicas, purge_of(a.incarnation), 70_000);
        assert_eq!(answer, None);
        assert_eq!(op.waits_for_clock(), Some(Millis(71_001)));
    }

    #[test]
    fn a_purge_of_another_or_a_deleted_incarnation_writes_nothing() {
        let (mut replicas, a) = created();
        let mut other = a.incarnation;
        other.nonce += 1;
        let before = replicas.held.clone();
        let (_, answer) = purge_until_margin(&mut replicas, purge_of(other), 10_000);
        assert_eq!(answer, Some(NameAnswer::Purge(PurgeAnswer::Gone)));
        assert_eq!(replicas.held, before);
        replicas.run(NameOp::delete(R, Millis(20_000)));
        let (_, answer) = purge_until_margin(&mut replicas, purge_of(a.incarnation), 30_000);
        assert_eq!(answer, Some(NameAnswer::Purge(PurgeAnswer::Gone)));
    }

    #[test]
    fn a_watermark_read_takes_the_greatest_of_two_replies_and_writes_nothing() {
        let (mut replicas, a) = created();
        for (slot, watermark) in [(0, None), (1, Some(7)), (2, Some(9))] {
            replicas.held[slot].purge_watermark = watermark.map(Millis);
        }
        let read = |held: &[NameRecord; REPLICAS], first: usize, second: usize, incarnation| {
            let (mut op, effects) = NameOp::watermark(R, incarnation, Millis(50));
            assert!(
                effects
                    .sends
                    .iter()
                    .all(|out| out.request == NameRequest::Read)
            );
            let mut replicas = Replicas { held: held.clone() };
            let mut answer = None;
            for slot in [first, second] {
                let reply = replicas.answer(&effects.sends[slot]);
                let step = op.on_reply(R[slot], 1, &reply);
                assert!(step.sends.is_empty(), "nothing written back");
                answer = answer.or(step.answer);
            }
            assert_eq!(op.settled(), None, "an unsettled read confirms nothing");
            answer
        };
        let watermark = |w| Some(NameAnswer::Watermark(WatermarkAnswer::Read(w)));
        let held = &replicas.held;
        assert_eq!(read(held, 0, 1, a.incarnation), watermark(Some(Millis(7))));
        assert_eq!(read(held, 0, 2, a.incarnation), watermark(Some(Millis(9))));
        assert_eq!(read(held, 1, 2, a.incarnation), watermark(Some(Millis(9))));
        let mut other = a.incarnation;
        other.nonce += 1;
        assert_eq!(
            read(held, 0, 1, other),
            Some(NameAnswer::Watermark(WatermarkAnswer::Gone))
        );
        // No record of the name on either replica: no purge was acknowledged.
        let nothing = [
            NameRecord::default(),
            NameRecord::default(),
            NameRecord::default(),
        ];
        assert_eq!(read(&nothing, 0, 1, a.incarnation), watermark(None));
        // Collected (the next epoch's empty record): the incarnation is gone.
        let mut collected_next = nothing.clone();
        collected_next[0].epoch = 1;
        assert_eq!(
            read(&collected_next, 0, 1, a.incarnation),
            Some(NameAnswer::Watermark(WatermarkAnswer::Gone))
        );
        // Deleted, the incarnation's watermark still holds for what is left of its messages.
        replicas.run(NameOp::delete(R, Millis(100)));
        assert!(matches!(
            read(&replicas.held, 0, 1, a.incarnation),
            Some(NameAnswer::Watermark(WatermarkAnswer::Read(Some(_))))
        ));
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in record(), b in record()) {
            prop_assert_eq!(a.merge(&b), b.merge(&a));
        }

        #[test]
        fn merge_is_associative(a in record(), b in record(), c in record()) {
            prop_assert_eq!(a.merge(&b).merge(&c), a.merge(&b.merge(&c)));
        }

        #[test]
        fn merge_is_idempotent(a in record(), b in record()) {
            prop_assert_eq!(a.merge(&a), a.clone());
            let joined = a.merge(&b);
            prop_assert_eq!(joined.merge(&b), joined.clone());
        }

        #[test]
        fn a_decision_survives_every_merge_of_its_epoch(a in record(), b in record()) {
            if let Some(decided) = a.decided().cloned() && b.epoch == a.epoch {
                // Slots are written once per epoch: b's votes agree with a's where both vote.
                let consistent = a.votes.iter().zip(&b.votes).all(|(x, y)| {
                    x.is_none() || y.is_none() || x == y
                });
                if consistent {
                    let joined = a.merge(&b);
                    prop_assert_eq!(joined.decided(), Some(&decided));
                }
            }
        }
    }
}
