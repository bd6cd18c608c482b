//! One state machine per coordinator operation (spec/replication.md#operations): a coordinator
//! is whichever node a client reached; it talks to the message's three replicas and answers the
//! client. Each operation is `start` (the requests of its first round), `on_reply` (one reply
//! from one replica) and `on_timeout` (its deadline passed): each returns [`Effects`], the
//! requests to send and, once, the answer. Time, the coordinator's id and nonces come in as
//! values; nothing here sends, sleeps or reads a clock.
//!
//! Two rules hold for every operation. A reply from a node that is not one of the three
//! replicas, a second ack from one replica, and any reply after the answer are ignored, so a
//! duplicated or late ack is never counted twice (a duplicated read's later reply replaces the
//! earlier one and still counts once). And once an operation has answered (including
//! by timing out) it never answers again: **a coordinator that timed out never delivers**, even
//! if the acks it was waiting for arrive later.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use trireme_core::Millis;

use crate::ids::{Generation, NodeId};
use crate::key::RecordKey;
use crate::placement::REPLICAS;
use crate::planted::{Bug, planted};
use crate::record::{
    Body, Claim, Divergence, Held, Live, Record, Settle, SourceQueue, Tombstone, TombstoneReason,
    merge_held,
};
use crate::replica::Write;

/// Durable acks a write needs before the coordinator answers (`W`).
pub const WRITE_QUORUM: usize = 2;
/// Replies a read needs before the coordinator decides (`R`).
pub const READ_QUORUM: usize = 2;
/// How long a split claim (one ack, one refusal) waits for its third replica before it is
/// given up, in milliseconds (`SPLIT_WAIT`, spec/replication.md, receive step 7).
pub const SPLIT_WAIT_MS: u64 = 50;
const _: () = assert!(WRITE_QUORUM + READ_QUORUM > REPLICAS);
const _: () = assert!(2 * WRITE_QUORUM > REPLICAS);

/// What a coordinator asks a replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Answer with what you hold for the key.
    Read,
    /// Make this write; `ack: false` for read repair, which nobody waits for.
    Write {
        /// The write (boxed: a record is large next to a read).
        write: Box<Write>,
        /// Whether the coordinator waits for the ack.
        ack: bool,
    },
}

/// What a replica answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The record it holds (after its fsync), for a read.
    Record(Option<Record>),
    /// The write is durable.
    Ack,
    /// The write was refused (a newer claim, a tombstone, a divergence, too old for the horizon).
    Refused,
}

/// One request to one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The replica.
    pub to: NodeId,
    /// The record it is about.
    pub key: RecordKey,
    /// The operation's round: its reply must carry it back, and a reply of another round is
    /// ignored (a late ack of a move's copy is not an ack of its tombstone).
    pub round: u32,
    /// What it is asked.
    pub request: Request,
}

/// What one step of an operation asks its driver to do: requests of type `O` (a message's
/// [`Outgoing`] by default; a queue name's are `name::NameOutgoing`) and at most one answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effects<A, O = Outgoing> {
    /// Requests to send now.
    pub sends: Vec<O>,
    /// The answer to the client, at most once per operation.
    pub answer: Option<A>,
}

impl<A, O> Effects<A, O> {
    pub(crate) fn none() -> Effects<A, O> {
        Effects {
            sends: Vec::new(),
            answer: None,
        }
    }

    pub(crate) fn answer(answer: A) -> Effects<A, O> {
        Effects {
            sends: Vec::new(),
            answer: Some(answer),
        }
    }

    pub(crate) fn sends(sends: Vec<O>) -> Effects<A, O> {
        Effects {
            sends,
            answer: None,
        }
    }
}

/// The replicas of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) key: RecordKey,
    pub(crate) replicas: [NodeId; REPLICAS],
}

pub(crate) fn broadcast(target: &Target, round: u32, write: &Write) -> Vec<Outgoing> {
    send_to(target, round, write, |_| true)
}

/// `write` to those of the target's replicas that `to` picks, each its own copy (a claim
/// carries the whole record, body included: no copy is made for a replica left out).
fn send_to(
    target: &Target,
    round: u32,
    write: &Write,
    to: impl Fn(NodeId) -> bool,
) -> Vec<Outgoing> {
    target
        .replicas
        .iter()
        .filter(|replica| to(**replica))
        .map(|to| Outgoing {
            to: *to,
            key: target.key.clone(),
            round,
            request: Request::Write {
                write: Box::new(write.clone()),
                ack: true,
            },
        })
        .collect()
}

fn reads(target: &Target, round: u32) -> Vec<Outgoing> {
    target
        .replicas
        .iter()
        .map(|to| Outgoing {
            to: *to,
            key: target.key.clone(),
            round,
            request: Request::Read,
        })
        .collect()
}

/// Replies a read waits for: `READ_QUORUM`, unless the simulation planted a smaller one.
fn read_quorum() -> usize {
    if planted(Bug::ReadQuorumOfOne) {
        1
    } else {
        READ_QUORUM
    }
}

/// Gathers read replies until `needed` distinct replicas answered.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ReadPhase {
    replicas: [NodeId; REPLICAS],
    needed: usize,
    replies: BTreeMap<NodeId, Option<Record>>,
}

impl ReadPhase {
    fn new(replicas: [NodeId; REPLICAS], needed: usize) -> ReadPhase {
        ReadPhase {
            replicas,
            needed,
            replies: BTreeMap::new(),
        }
    }

    /// Records a reply; `true` once the quorum is complete (exactly once). A second reply from
    /// one replica (a duplicated read) replaces its first: a replica's record only grows by
    /// merge, so the later reply knows at least as much, and it still counts once.
    fn take(&mut self, from: NodeId, reply: &Reply) -> bool {
        let Reply::Record(record) = reply else {
            return false;
        };
        if !self.replicas.contains(&from) {
            return false;
        }
        let first = self.replies.insert(from, record.clone()).is_none();
        first && self.replies.len() == self.needed
    }

    fn merged(&self) -> Result<Option<Record>, Divergence> {
        self.replies
            .values()
            .try_fold(None, |joined: Option<Record>, reply| {
                merge_held(joined.as_ref(), reply.as_ref())
            })
    }

    /// Read repair (spec/replication.md#receive-claim, step 2): the merged record, unacknowledged,
    /// to every replica that replied with something else.
    fn repairs(&self, key: &RecordKey, merged: Option<&Record>) -> Vec<Outgoing> {
        let Some(merged) = merged else {
            return Vec::new();
        };
        self.replies
            .iter()
            .filter(|(_, reply)| reply.as_ref() != Some(merged))
            .map(|(to, _)| Outgoing {
                to: *to,
                key: key.clone(),
                // Nobody waits for a repair's ack: it belongs to no round.
                round: 0,
                request: Request::Write {
                    write: Box::new(Write::Merge(merged.clone())),
                    ack: false,
                },
            })
            .collect()
    }
}

/// Counts acks and refusals of one write round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WritePhase {
    replicas: [NodeId; REPLICAS],
    acks: BTreeSet<NodeId>,
    refusals: BTreeSet<NodeId>,
}

/// Where a write round stands after a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    Waiting,
    /// `W` durable acks: the write counts.
    Quorum,
    /// Refusals make `W` acks impossible.
    Refused,
}

impl WritePhase {
    /// Replicas that acked the write so far.
    pub(crate) fn acked(&self) -> usize {
        self.acks.len()
    }

    /// Replicas that refused the write so far.
    pub(crate) fn refused(&self) -> usize {
        self.refusals.len()
    }

    pub(crate) fn new(replicas: [NodeId; REPLICAS]) -> WritePhase {
        WritePhase {
            replicas,
            acks: BTreeSet::new(),
            refusals: BTreeSet::new(),
        }
    }

    pub(crate) fn take(&mut self, from: NodeId, reply: &Reply) -> Progress {
        if !self.replicas.contains(&from)
            || self.acks.contains(&from)
            || self.refusals.contains(&from)
        {
            return Progress::Waiting;
        }
        match reply {
            Reply::Ack => {
                self.acks.insert(from);
                if self.acks.len() == WRITE_QUORUM {
                    return Progress::Quorum;
                }
            }
            Reply::Refused => {
                self.refusals.insert(from);
                if self.refusals.len() == REPLICAS - WRITE_QUORUM + 1 {
                    return Progress::Refused;
                }
            }
            Reply::Record(_) => {}
        }
        Progress::Waiting
    }
}

// ----- send ---------------------------------------------------------------------------------

/// The answer to a send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendAnswer {
    /// Two replicas hold the message durably.
    Sent,
    /// Fewer than two acks by the deadline. The message may still exist (a failed call that
    /// took effect: the client's retry is a duplicate unless it carries a deduplication id).
    Unavailable,
}

/// spec/replication.md#send: write to the three replicas, answer at two durable acks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendOp {
    write: WritePhase,
    answered: bool,
}

/// The round of an operation's first phase; each later phase is the next number.
pub(crate) const FIRST_ROUND: u32 = 1;

impl SendOp {
    /// Starts the send of `record` (generation 0, never received) under `key`.
    #[must_use]
    pub fn start(
        key: RecordKey,
        replicas: [NodeId; REPLICAS],
        record: Record,
    ) -> (SendOp, Effects<SendAnswer>) {
        assert_eq!(
            record.generation,
            Generation(0),
            "a send writes generation 0"
        );
        assert!(record.claim().is_none(), "a sent message has no claim");
        let target = Target { key, replicas };
        let sends = broadcast(&target, FIRST_ROUND, &Write::Merge(record));
        (
            SendOp {
                write: WritePhase::new(replicas),
                answered: false,
            },
            Effects::sends(sends),
        )
    }

    /// One replica's reply to round `round`.
    pub fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<SendAnswer> {
        if self.answered || round != FIRST_ROUND {
            return Effects::none();
        }
        match self.write.take(from, reply) {
            Progress::Quorum => self.finish(SendAnswer::Sent),
            Progress::Refused => self.finish(SendAnswer::Unavailable),
            Progress::Waiting => Effects::none(),
        }
    }

    /// The deadline passed.
    pub fn on_timeout(&mut self) -> Effects<SendAnswer> {
        if self.answered {
            return Effects::none();
        }
        self.finish(SendAnswer::Unavailable)
    }

    fn finish(&mut self, answer: SendAnswer) -> Effects<SendAnswer> {
        self.answered = true;
        Effects::answer(answer)
    }
}

// ----- receive ------------------------------------------------------------------------------

/// What one receive of one message needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveSettings {
    /// This coordinator.
    pub me: NodeId,
    /// Now, by this coordinator's clock.
    pub now: Millis,
    /// The visibility timeout of this receive.
    pub visibility_timeout_ms: u64,
    /// The redrive policy's `maxReceiveCount`, if the queue has a dead-letter queue.
    pub max_receive_count: Option<u32>,
    /// Drawn fresh by the driver for this claim.
    pub nonce: u64,
    /// The queue's purge watermark as this node knows it (spec/replication.md §2): a record
    /// that entered at or before it reads as gone. A receive started with
    /// [`ReceiveOp::start_reading_watermark`] raises it to the quorum read's before deciding.
    pub purged_through: Option<Millis>,
    /// The queue's `MessageRetentionPeriod` as this node knows it (spec/replication.md §3): a
    /// record whose original send is at least this long before `now` reads as gone.
    pub retention_ms: u64,
}

/// Why a receive found nothing to deliver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NothingBecause {
    /// No live copy: deleted, moved, or never there.
    Gone,
    /// Claimed, and the claim's deadline has not passed by this coordinator's clock.
    Invisible,
    /// Still delayed.
    Delayed,
    /// Held or void: a copy of a send with a deduplication id that no coordinator confirmed
    /// (spec/replication.md §4), received as if it were not stored.
    Unsettled,
}

/// The answer to a receive of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiveAnswer {
    /// The claim is durable on two replicas: deliver this record (it holds the new claim).
    Delivered(Record),
    /// Nothing to deliver.
    Nothing(NothingBecause),
    /// The receive count reached `maxReceiveCount`: the driver runs a [`MoveOp`] with this
    /// merged record instead of delivering.
    DeadLetter(Record),
    /// Replicas refused the claim (another receive took this version): nothing delivered.
    LostRace,
    /// The claim split (one ack, one refusal) and its third replica did not answer within
    /// `SPLIT_WAIT` (spec/replication.md, receive step 7): given up, nothing delivered, ever,
    /// by this operation.
    GaveUpSplit,
    /// No quorum by the deadline: nothing delivered.
    Unavailable,
    /// The replies disagree on a once-field (a bug elsewhere): nothing delivered.
    Diverged(Divergence),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ReceivePhase {
    Read(ReadPhase),
    /// The record's read quorum is in; the decision waits for the queue's watermark.
    AwaitWatermark(ReadPhase),
    Claim {
        write: WritePhase,
        record: Box<Record>,
    },
    /// A claim without the read has its two acks; its delivery waits for the queue's watermark
    /// (spec/replication.md §13, *The purge watermark*).
    AwaitWatermarkToDeliver(Box<Record>),
    Answered,
}

/// How a receive went (spec/replication.md §13, *What is measured*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceivePath {
    /// The quorum read, then the claim.
    Read,
    /// The claim without the read, from the coordinator's own replica's record, and no replica
    /// refused it.
    Fast,
    /// The claim without the read was refused and the receive took the read path.
    FellBack,
}

/// spec/replication.md#receive-claim: quorum read, then a conditional claim, delivered only
/// after two acks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiveOp {
    target: Target,
    settings: ReceiveSettings,
    /// Whether the queue's watermark read (spec §2, Receive step 1) is still to come.
    watermark_pending: bool,
    round: u32,
    phase: ReceivePhase,
    path: ReceivePath,
    /// A claim without the read not yet sent to this coordinator's own replica: it goes there
    /// at the first ack of another replica (spec §13, *Own replica last*).
    own_held_back: bool,
    /// The claim without the read was sent to the own replica (in this round) and it has not
    /// answered yet: [`ReceiveOp::own_pending`].
    own_unanswered: bool,
}

impl ReceiveOp {
    /// Starts a receive of the message under `key`: the read of all three.
    #[must_use]
    pub fn start(
        key: RecordKey,
        replicas: [NodeId; REPLICAS],
        settings: ReceiveSettings,
    ) -> (ReceiveOp, Effects<ReceiveAnswer>) {
        let target = Target { key, replicas };
        let sends = reads(&target, FIRST_ROUND);
        (
            ReceiveOp {
                target,
                settings,
                watermark_pending: false,
                round: FIRST_ROUND,
                phase: ReceivePhase::Read(ReadPhase::new(replicas, read_quorum())),
                path: ReceivePath::Read,
                own_held_back: false,
                own_unanswered: false,
            },
            Effects::sends(sends),
        )
    }

    /// Starts a receive with the claim without the read (spec/replication.md §13, *A claim
    /// without the read*) if `local`, this coordinator's own replica's record read in place,
    /// passes the fast path's guard: this coordinator is a replica of the message, and the
    /// record is live, in retention, settled, not hidden by the known watermark, visible by
    /// this coordinator's clock (no unexpired claim, no delay) and below the queue's
    /// `maxReceiveCount`. The conditional claim of `seq + 1` goes to the two other replicas at
    /// once, and to this coordinator's own only after one of them acked it (*Own replica
    /// last*: the own replica may be the one behind, and must not keep a claim that the two
    /// others refuse by (c)); it is delivered after two acks and the queue's watermark (read by
    /// quorum in parallel, [`ReceiveOp::on_watermark`]); at a refusal that comes while no
    /// replica has acked it the receive takes the read path, and after an ack it is a claim
    /// like the read path's (*A refusal after an ack*). `None` when the guard fails: the caller starts the read path
    /// ([`ReceiveOp::start_reading_watermark`]), which alone decides what a local record that is
    /// not claimable means (the replica may be behind). The driver's own part of the guard (its
    /// replica joined, its store neither failed nor overloaded) is the caller's.
    #[must_use]
    pub fn start_fast(
        key: RecordKey,
        replicas: [NodeId; REPLICAS],
        settings: ReceiveSettings,
        local: &Record,
    ) -> Option<(ReceiveOp, Effects<ReceiveAnswer>)> {
        let live = match judge(local, &settings) {
            Judged::Claim(live) => live,
            Judged::DeadLetter(live) if planted(Bug::ClaimWithoutReadNoLocalCountCheck) => live,
            Judged::Nothing(_) | Judged::DeadLetter(_) => return None,
        };
        if !replicas.contains(&settings.me) {
            return None;
        }
        let claimed = claimed(local, live, &settings);
        let target = Target { key, replicas };
        let own_last = !planted(Bug::FastClaimOwnReplicaFirst);
        let sends = send_to(
            &target,
            FIRST_ROUND,
            &claim_write(&claimed, &settings),
            |to| !own_last || to != settings.me,
        );
        Some((
            ReceiveOp {
                target,
                settings,
                watermark_pending: true,
                round: FIRST_ROUND,
                phase: ReceivePhase::Claim {
                    write: WritePhase::new(replicas),
                    record: Box::new(claimed),
                },
                path: ReceivePath::Fast,
                own_held_back: own_last,
                own_unanswered: !own_last,
            },
            Effects::sends(sends),
        ))
    }

    /// The path this receive has taken so far.
    #[must_use]
    pub fn path(&self) -> ReceivePath {
        self.path
    }

    /// Replicas that have acked this receive's current claim so far (0 while it reads): a
    /// claim without the read falls back only at a refusal while this is 0 (spec §13).
    #[must_use]
    pub fn claim_acked(&self) -> usize {
        match &self.phase {
            ReceivePhase::Claim { write, .. } => write.acked(),
            _ => 0,
        }
    }

    /// Whether a delivered claim without the read is still on its way to this coordinator's
    /// own replica (it went there at the first ack of another, *Own replica last*). Until it
    /// lands, this node's view still shows the message visible, and its next receive would try
    /// it again and fall back on the refusal: a driver keeps the message from its other
    /// receives until then ([`Operation::lingers`]). Nothing depends on it for safety.
    #[must_use]
    pub fn own_pending(&self) -> bool {
        self.own_unanswered && matches!(self.phase, ReceivePhase::Answered)
    }

    /// Starts a receive whose queue watermark is read by quorum in parallel with the record
    /// (spec/replication.md §2, Receive step 1): the read of all three goes out now, and the
    /// decision waits until [`ReceiveOp::on_watermark`] brought the watermark, so a record the
    /// purge hides is never claimed.
    #[must_use]
    pub fn start_reading_watermark(
        key: RecordKey,
        replicas: [NodeId; REPLICAS],
        settings: ReceiveSettings,
    ) -> (ReceiveOp, Effects<ReceiveAnswer>) {
        let (mut op, effects) = ReceiveOp::start(key, replicas, settings);
        op.watermark_pending = true;
        (op, effects)
    }

    /// Whether the operation still waits for read replies (a driver may cancel the third read).
    #[must_use]
    pub fn reading(&self) -> bool {
        matches!(self.phase, ReceivePhase::Read(_))
    }

    /// The queue's watermark read by quorum: `watermark` is the greatest of its replies. The
    /// receive hides what it hides (and what the settings' watermark hid already), and decides
    /// now if its record read is in. A driver whose watermark read failed times the receive out
    /// instead: without the watermark nothing may be delivered.
    pub fn on_watermark(&mut self, watermark: Option<Millis>) -> Effects<ReceiveAnswer> {
        if !self.watermark_pending {
            return Effects::none();
        }
        self.watermark_pending = false;
        self.settings.purged_through = self.settings.purged_through.max(watermark);
        match &self.phase {
            ReceivePhase::AwaitWatermark(read) => {
                let read = read.clone();
                self.decide(&read)
            }
            ReceivePhase::AwaitWatermarkToDeliver(record) => {
                let record = (**record).clone();
                self.deliver(record)
            }
            _ => Effects::none(),
        }
    }

    /// One replica's reply to round `round`.
    pub fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<ReceiveAnswer> {
        if round != self.round {
            return Effects::none();
        }
        if from == self.settings.me {
            self.own_unanswered = false;
        }
        match &mut self.phase {
            ReceivePhase::Read(read) => {
                if !read.take(from, reply) {
                    Effects::none()
                } else if self.watermark_pending {
                    self.phase = ReceivePhase::AwaitWatermark(read.clone());
                    Effects::none()
                } else {
                    let read = read.clone();
                    self.decide(&read)
                }
            }
            // The third read's reply adds nothing the decision needs.
            ReceivePhase::AwaitWatermark(_) => Effects::none(),
            ReceivePhase::Claim { write, record } => match write.take(from, reply) {
                Progress::Quorum => {
                    let record = (**record).clone();
                    self.deliver(record)
                }
                Progress::Waiting
                    if planted(Bug::ClaimAtFirstAck)
                        && write.acks.len() == 1
                        && write.acks.contains(&from) =>
                {
                    let record = (**record).clone();
                    self.finish(ReceiveAnswer::Delivered(record))
                }
                // spec §13: a claim without the read falls back to the read path at a refusal
                // that comes while no replica has acked it; any later ack counts for nothing.
                // Once one has acked, it is a claim like the read path's: two acks deliver it,
                // a split waits for the third, two refusals lose the race.
                _ if self.path == ReceivePath::Fast
                    && write.refused() > 0
                    && write.acked() == 0 =>
                {
                    self.fall_back()
                }
                // Another replica took the claim, so the holder's lease has passed by this
                // coordinator's `now` on a replica that is not behind it: the own replica may
                // take it too (spec §13, *Own replica last*).
                Progress::Waiting if self.own_held_back && write.acked() > 0 => {
                    self.own_held_back = false;
                    self.own_unanswered = true;
                    let me = self.settings.me;
                    Effects::sends(send_to(
                        &self.target,
                        self.round,
                        &claim_write(record, &self.settings),
                        |to| to == me,
                    ))
                }
                Progress::Refused => self.finish(ReceiveAnswer::LostRace),
                Progress::Waiting => Effects::none(),
            },
            ReceivePhase::AwaitWatermarkToDeliver(_) | ReceivePhase::Answered => Effects::none(),
        }
    }

    /// The deadline passed: nothing is delivered, ever, by this operation.
    pub fn on_timeout(&mut self) -> Effects<ReceiveAnswer> {
        if self.phase == ReceivePhase::Answered {
            return Effects::none();
        }
        self.finish(ReceiveAnswer::Unavailable)
    }

    /// Whether the claim split: one replica acked it, one refused it, and it can count only
    /// through the third (spec/replication.md, receive step 7). The driver then waits for the
    /// third at most `SPLIT_WAIT` before [`ReceiveOp::on_split_wait`].
    #[must_use]
    pub fn split(&self) -> bool {
        matches!(
            &self.phase,
            ReceivePhase::Claim { write, .. } if write.acks.len() == 1 && write.refusals.len() == 1
        )
    }

    /// `SPLIT_WAIT` passed since the split: a claim still split is given up (nothing is
    /// delivered, ever, by this operation); any other state is left as it is.
    pub fn on_split_wait(&mut self) -> Effects<ReceiveAnswer> {
        if self.split() {
            self.finish(ReceiveAnswer::GaveUpSplit)
        } else {
            Effects::none()
        }
    }

    fn decide(&mut self, read: &ReadPhase) -> Effects<ReceiveAnswer> {
        let merged = match read.merged() {
            Ok(merged) => merged,
            Err(divergence) => return self.finish(ReceiveAnswer::Diverged(divergence)),
        };
        let mut sends = read.repairs(&self.target.key, merged.as_ref());
        let settings = self.settings;
        let Some(record) = merged.as_ref() else {
            return self.finish_with(sends, ReceiveAnswer::Nothing(NothingBecause::Gone));
        };
        let live = match judge(record, &settings) {
            Judged::Claim(live) => live,
            Judged::Nothing(because) => {
                return self.finish_with(sends, ReceiveAnswer::Nothing(because));
            }
            Judged::DeadLetter(_) => {
                return self.finish_with(sends, ReceiveAnswer::DeadLetter(record.clone()));
            }
        };
        let claimed = claimed(record, live, &settings);
        self.round += 1;
        sends.extend(broadcast(
            &self.target,
            self.round,
            &claim_write(&claimed, &settings),
        ));
        self.phase = ReceivePhase::Claim {
            write: WritePhase::new(self.target.replicas),
            record: Box::new(claimed),
        };
        Effects::sends(sends)
    }

    /// The claim has its two acks: delivered once the watermark is in and does not hide the
    /// record (a claim without the read is sent before the watermark is known; spec §13, *The
    /// purge watermark*: its claim then stays on the hidden record, an orphan).
    fn deliver(&mut self, record: Record) -> Effects<ReceiveAnswer> {
        if self.watermark_pending {
            self.phase = ReceivePhase::AwaitWatermarkToDeliver(Box::new(record));
            return Effects::none();
        }
        if record.hidden(self.settings.purged_through) {
            return self.finish(ReceiveAnswer::Nothing(NothingBecause::Gone));
        }
        self.finish(ReceiveAnswer::Delivered(record))
    }

    /// A claim without the read was refused: the same receive takes the read path (spec §13),
    /// in a new round, so the fast claim's late acks are ignored.
    fn fall_back(&mut self) -> Effects<ReceiveAnswer> {
        self.path = ReceivePath::FellBack;
        // The own replica never gets a claim that another replica refused.
        self.own_held_back = false;
        self.own_unanswered = false;
        self.round += 1;
        self.phase = ReceivePhase::Read(ReadPhase::new(self.target.replicas, read_quorum()));
        Effects::sends(reads(&self.target, self.round))
    }

    fn finish(&mut self, answer: ReceiveAnswer) -> Effects<ReceiveAnswer> {
        self.finish_with(Vec::new(), answer)
    }

    fn finish_with(
        &mut self,
        sends: Vec<Outgoing>,
        answer: ReceiveAnswer,
    ) -> Effects<ReceiveAnswer> {
        self.phase = ReceivePhase::Answered;
        Effects {
            sends,
            answer: Some(answer),
        }
    }
}

/// What a receive makes of a record it may claim (spec/replication.md#receive-claim, steps
/// 3 and 4, with §2's watermark, §3's retention and §4's settling).
enum Judged<'a> {
    /// Claim it.
    Claim(&'a Live),
    /// Deliver nothing.
    Nothing(NothingBecause),
    /// Its receive count reached `maxReceiveCount`: move it.
    DeadLetter(&'a Live),
}

fn judge<'a>(record: &'a Record, settings: &ReceiveSettings) -> Judged<'a> {
    let Some(live) = record.live() else {
        return Judged::Nothing(NothingBecause::Gone);
    };
    if record.hidden(settings.purged_through) {
        return Judged::Nothing(NothingBecause::Gone);
    }
    // §3, receive step 3: expired by this coordinator's clock, whatever the sweeps did.
    if live.birth.sent_at.plus_ms(settings.retention_ms) <= settings.now {
        return Judged::Nothing(NothingBecause::Gone);
    }
    if !record.ready() {
        return Judged::Nothing(NothingBecause::Unsettled);
    }
    if live.held.is_some_and(|held| held.deadline > settings.now) {
        return Judged::Nothing(NothingBecause::Invisible);
    }
    if live.birth.visible_from > settings.now {
        return Judged::Nothing(NothingBecause::Delayed);
    }
    if settings
        .max_receive_count
        .is_some_and(|max| live.receive_count >= max)
    {
        return Judged::DeadLetter(live);
    }
    Judged::Claim(live)
}

/// `record` (whose live body is `live`) with this receive's claim: `seq + 1`, the count plus
/// one, the deadline `now + visibility timeout` (spec/replication.md#receive-claim, step 5).
fn claimed(record: &Record, live: &Live, settings: &ReceiveSettings) -> Record {
    Record {
        generation: record.generation,
        body: Body::Live(Live {
            held: Some(Held {
                claim: Claim {
                    seq: live.held.map_or(0, |held| held.claim.seq) + 1,
                    coordinator: settings.me,
                    nonce: settings.nonce,
                },
                change_counter: 0,
                deadline: settings.now.plus_ms(settings.visibility_timeout_ms),
                received_at: settings.now,
            }),
            receive_count: live.receive_count + 1,
            first_received_at: live.first_received_at.or(Some(settings.now)),
            ..live.clone()
        }),
    }
}

/// The conditional claim of `claimed`, carrying what the replicas check it by (spec §13:
/// the coordinator's clock reading for (c), `maxReceiveCount` for (d)).
fn claim_write(claimed: &Record, settings: &ReceiveSettings) -> Write {
    Write::Claim {
        record: claimed.clone(),
        now: settings.now,
        max_receive_count: settings.max_receive_count,
    }
}

// ----- delete and change visibility ----------------------------------------------------------

/// A receipt handle as the replicas know it, after the edge authenticated and decoded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Handle {
    /// The generation the handle was issued in.
    pub generation: Generation,
    /// The claim it is.
    pub claim: Claim,
}

/// The answer to a delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteAnswer {
    /// The conditional tombstone is durable on two replicas.
    Deleted,
    /// The generation had already ended; its tombstone is now durable on two replicas.
    AlreadyGone,
    /// The message moved on to a later generation: that handle's life is over; nothing written.
    Moved,
    /// The handle is superseded by a receive of a later version: nothing written.
    Stale,
    /// No replica of the quorum knows the message (never there, or collected long ago).
    NotFound,
    /// No quorum by the deadline. The tombstone may have reached a replica.
    Unavailable,
    /// The replies disagree on a once-field.
    Diverged(Divergence),
}

/// The answer to a visibility change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VisibilityAnswer {
    /// The new deadline is durable on two replicas.
    Changed,
    /// The handle is superseded, or the message left this generation: nothing written.
    Stale,
    /// The generation ended (deleted or moved), or no replica knows the message.
    NotInFlight,
    /// The new deadline would pass the cap counted from the receive.
    ExceedsCap,
    /// No quorum by the deadline.
    Unavailable,
    /// The replies disagree on a once-field.
    Diverged(Divergence),
}

/// What a handle operation writes once its read agrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleAction {
    /// Delete (spec/replication.md#delete).
    Delete,
    /// Change visibility to `now + timeout_ms`, within `cap_ms` of the receive.
    ChangeVisibility {
        /// The new visibility timeout from now (0: visible at once).
        timeout_ms: u64,
        /// The longest visibility counted from the receive (SQS: 12 hours).
        cap_ms: u64,
    },
    /// Dead-letter now's steps 1 and 2 (spec/replication.md §7, *Dead-letter now,
    /// replicated*): the read and the handle's classification, as for a visibility change,
    /// answering the merged record when the handle is current; its move is a [`MoveOp`].
    DeadLetterNow {
        /// The source queue's purge watermark, read by quorum (spec §2, *Every other operation
        /// that takes a message out of a queue*): a record it hides is not in flight.
        purged_through: Option<Millis>,
    },
}

/// The answer to a dead-letter now's read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadLetterNowAnswer {
    /// The handle is current: the merged record (its claim of the handle's version), for the
    /// move. Nothing written yet.
    Current(Record),
    /// The handle is superseded, or the message left this generation: nothing written.
    Stale,
    /// The generation ended (deleted, expired, purged or moved), or no replica knows it.
    NotInFlight,
    /// No quorum by the deadline.
    Unavailable,
    /// The replies disagree on a once-field.
    Diverged(Divergence),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HandlePhase {
    Read(ReadPhase),
    Write {
        write: WritePhase,
        already_gone: bool,
    },
    Answered,
}

/// spec/replication.md#delete and #change-visibility: a quorum read, and a conditional write
/// only if the merged current claim is of the caller's handle's version (the same `seq`; a
/// claim that lost the race for it has no holder, F1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandleOp {
    target: Target,
    handle: Handle,
    action: HandleAction,
    now: Millis,
    round: u32,
    phase: HandlePhase,
}

/// The answer of a [`HandleOp`], by action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandleAnswer {
    /// A delete's answer.
    Delete(DeleteAnswer),
    /// A visibility change's answer.
    Visibility(VisibilityAnswer),
    /// A dead-letter now's read.
    DeadLetterNow(DeadLetterNowAnswer),
}

impl HandleOp {
    /// Starts `action` with `handle` on the message under `key` at `now` (this coordinator's
    /// clock): the read of all three.
    #[must_use]
    pub fn start(
        key: RecordKey,
        replicas: [NodeId; REPLICAS],
        handle: Handle,
        action: HandleAction,
        now: Millis,
    ) -> (HandleOp, Effects<HandleAnswer>) {
        let target = Target { key, replicas };
        if action == HandleAction::Delete && planted(Bug::DeleteWithoutQuorumRead) {
            let write = Write::Tombstone {
                generation: handle.generation,
                expect: Some(handle.claim),
                tombstone: Tombstone {
                    reason: TombstoneReason::Deleted,
                    at: now,
                },
            };
            let sends = broadcast(&target, FIRST_ROUND, &write);
            return (
                HandleOp {
                    target,
                    handle,
                    action,
                    now,
                    round: FIRST_ROUND,
                    phase: HandlePhase::Write {
                        write: WritePhase::new(replicas),
                        already_gone: false,
                    },
                },
                Effects::sends(sends),
            );
        }
        let sends = reads(&target, FIRST_ROUND);
        (
            HandleOp {
                target,
                handle,
                action,
                now,
                round: FIRST_ROUND,
                phase: HandlePhase::Read(ReadPhase::new(replicas, read_quorum())),
            },
            Effects::sends(sends),
        )
    }

    /// Whether the operation still waits for read replies (a driver may cancel the third read).
    #[must_use]
    pub fn reading(&self) -> bool {
        matches!(self.phase, HandlePhase::Read(_))
    }

    /// One replica's reply to round `round`.
    pub fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<HandleAnswer> {
        if round != self.round {
            return Effects::none();
        }
        match &mut self.phase {
            HandlePhase::Read(read) => {
                if read.take(from, reply) {
                    let read = read.clone();
                    self.decide(&read)
                } else {
                    Effects::none()
                }
            }
            HandlePhase::Write {
                write,
                already_gone,
            } => {
                let already_gone = *already_gone;
                let progress = write.take(from, reply);
                if self.action == HandleAction::Delete
                    && progress != Progress::Quorum
                    && !planted(Bug::StaleAtTwoRefusals)
                {
                    // A refused tombstone is not a refused delete (spec/replication.md#delete,
                    // step 4, and *Considerations*, F3): a replica that took it holds a
                    // tombstone that dominates every live copy of the generation, so the
                    // delete took effect, and a refusal can only say "nothing written" once
                    // all three refused. Otherwise it answers as its deadline does.
                    return match (write.acked(), write.refused()) {
                        (0, REPLICAS) => {
                            let answer = self.stale();
                            self.finish(answer)
                        }
                        (1.., refused) if refused > REPLICAS - WRITE_QUORUM => {
                            self.finish(HandleAnswer::Delete(DeleteAnswer::Unavailable))
                        }
                        _ => Effects::none(),
                    };
                }
                match progress {
                    Progress::Quorum => {
                        let answer = match self.action {
                            HandleAction::Delete if already_gone => {
                                HandleAnswer::Delete(DeleteAnswer::AlreadyGone)
                            }
                            HandleAction::Delete => HandleAnswer::Delete(DeleteAnswer::Deleted),
                            HandleAction::ChangeVisibility { .. } => {
                                HandleAnswer::Visibility(VisibilityAnswer::Changed)
                            }
                            HandleAction::DeadLetterNow { .. } => {
                                unreachable!("a dead-letter now's read writes nothing")
                            }
                        };
                        self.finish(answer)
                    }
                    Progress::Refused => {
                        let answer = self.stale();
                        self.finish(answer)
                    }
                    Progress::Waiting => Effects::none(),
                }
            }
            HandlePhase::Answered => Effects::none(),
        }
    }

    /// The deadline passed.
    pub fn on_timeout(&mut self) -> Effects<HandleAnswer> {
        if self.phase == HandlePhase::Answered {
            return Effects::none();
        }
        let answer = match self.action {
            HandleAction::Delete => HandleAnswer::Delete(DeleteAnswer::Unavailable),
            HandleAction::ChangeVisibility { .. } => {
                HandleAnswer::Visibility(VisibilityAnswer::Unavailable)
            }
            HandleAction::DeadLetterNow { .. } => {
                HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Unavailable)
            }
        };
        self.finish(answer)
    }

    fn stale(&self) -> HandleAnswer {
        match self.action {
            HandleAction::Delete => HandleAnswer::Delete(DeleteAnswer::Stale),
            HandleAction::ChangeVisibility { .. } => {
                HandleAnswer::Visibility(VisibilityAnswer::Stale)
            }
            HandleAction::DeadLetterNow { .. } => {
                HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Stale)
            }
        }
    }

    /// The answer by action; a dead-letter now classifies the handle as a visibility change
    /// does (spec/replication.md §10).
    fn by_action(&self, delete: DeleteAnswer, visibility: VisibilityAnswer) -> HandleAnswer {
        match self.action {
            HandleAction::Delete => HandleAnswer::Delete(delete),
            HandleAction::ChangeVisibility { .. } => HandleAnswer::Visibility(visibility),
            HandleAction::DeadLetterNow { .. } => HandleAnswer::DeadLetterNow(match visibility {
                VisibilityAnswer::Stale => DeadLetterNowAnswer::Stale,
                VisibilityAnswer::Diverged(divergence) => DeadLetterNowAnswer::Diverged(divergence),
                VisibilityAnswer::Unavailable => DeadLetterNowAnswer::Unavailable,
                VisibilityAnswer::NotInFlight
                | VisibilityAnswer::ExceedsCap
                | VisibilityAnswer::Changed => DeadLetterNowAnswer::NotInFlight,
            }),
        }
    }

    fn decide(&mut self, read: &ReadPhase) -> Effects<HandleAnswer> {
        let merged = match read.merged() {
            Ok(merged) => merged,
            Err(divergence) => {
                let answer = self.by_action(
                    DeleteAnswer::Diverged(divergence.clone()),
                    VisibilityAnswer::Diverged(divergence),
                );
                return self.finish(answer);
            }
        };
        let handle = self.handle;
        let Some(merged) = merged else {
            let answer = self.by_action(DeleteAnswer::NotFound, VisibilityAnswer::NotInFlight);
            return self.finish(answer);
        };
        if merged.generation > handle.generation {
            // The message moved and came back: that handle's life is over (spec#delete, 3).
            let answer = self.by_action(DeleteAnswer::Moved, VisibilityAnswer::Stale);
            return self.finish(answer);
        }
        if merged.generation == handle.generation && merged.is_tombstone() {
            return match self.action {
                // Already gone: make that tombstone durable on two replicas before saying so
                // (spec#considerations, "already gone needs a quorum too").
                HandleAction::Delete => {
                    self.round += 1;
                    self.phase = HandlePhase::Write {
                        write: WritePhase::new(self.target.replicas),
                        already_gone: true,
                    };
                    Effects::sends(broadcast(&self.target, self.round, &Write::Merge(merged)))
                }
                HandleAction::ChangeVisibility { .. } => {
                    self.finish(HandleAnswer::Visibility(VisibilityAnswer::NotInFlight))
                }
                HandleAction::DeadLetterNow { .. } => self.finish(HandleAnswer::DeadLetterNow(
                    DeadLetterNowAnswer::NotInFlight,
                )),
            };
        }
        if let HandleAction::DeadLetterNow { purged_through } = self.action
            && merged.generation == handle.generation
            && merged.hidden(purged_through)
        {
            // Purged: gone as a tombstone is, so its copy never leaves as a live one (spec §2).
            return self.finish(HandleAnswer::DeadLetterNow(
                DeadLetterNowAnswer::NotInFlight,
            ));
        }
        let current = (merged.generation == handle.generation)
            .then(|| merged.live().and_then(|live| live.held))
            .flatten();
        // Valid by version (spec/replication.md#delete, step 4): the merged lease may be of a
        // claim that lost the race for the handle's `seq`; nobody holds that one.
        let valid = |held: &Held| {
            if planted(Bug::WholeClaimFirst) {
                held.claim == handle.claim
            } else {
                held.claim.same_version(&handle.claim)
            }
        };
        let Some(held) = current.filter(valid) else {
            let answer = self.stale();
            return self.finish(answer);
        };
        let write = match self.action {
            HandleAction::Delete => Write::Tombstone {
                generation: handle.generation,
                expect: Some(handle.claim),
                tombstone: Tombstone {
                    reason: TombstoneReason::Deleted,
                    at: self.now,
                },
            },
            HandleAction::ChangeVisibility { timeout_ms, cap_ms } => {
                let deadline = self.now.plus_ms(timeout_ms);
                if deadline > held.received_at.plus_ms(cap_ms) {
                    return self.finish(HandleAnswer::Visibility(VisibilityAnswer::ExceedsCap));
                }
                // The new lease keeps the merged lease's claim and receive time (the cap above
                // counted from it) and raises its counter (spec/replication.md#change-visibility).
                let mut changed = merged.clone();
                if let Body::Live(live) = &mut changed.body {
                    live.held = Some(Held {
                        change_counter: held.change_counter + 1,
                        deadline,
                        ..held
                    });
                }
                Write::Visibility(changed)
            }
            HandleAction::DeadLetterNow { .. } => {
                return self.finish(HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Current(
                    merged.clone(),
                )));
            }
        };
        self.round += 1;
        self.phase = HandlePhase::Write {
            write: WritePhase::new(self.target.replicas),
            already_gone: false,
        };
        Effects::sends(broadcast(&self.target, self.round, &write))
    }

    fn finish(&mut self, answer: HandleAnswer) -> Effects<HandleAnswer> {
        self.phase = HandlePhase::Answered;
        Effects::answer(answer)
    }
}

// ----- dead-letter move -----------------------------------------------------------------------

/// The answer to a dead-letter move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveAnswer {
    /// The dead-letter copy is durable on two replicas and the source generation is
    /// tombstoned on two.
    Moved,
    /// The copy is durable but the source's tombstone was refused or timed out (a concurrent
    /// receive claimed it again): the message is in both queues until the next receive
    /// repeats the move.
    CopiedOnly,
    /// No quorum for the copy by the deadline; it may or may not be durable (a duplicate at
    /// worst), and the source was not touched.
    Unavailable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum MovePhase {
    Copy(WritePhase),
    Source(WritePhase),
    Answered,
}

/// spec/replication.md#dead-letter-move: the dead-letter copy first, with two durable acks, and
/// only then the conditional tombstone of the source generation, conditioned on the claim the
/// move read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveOp {
    source: Target,
    generation: Generation,
    expect: Option<Claim>,
    now: Millis,
    round: u32,
    phase: MovePhase,
}

impl MoveOp {
    /// Starts the move of `record` (the merged live record a receive read under `source_key`)
    /// out of `source_queue` into `target_key`, the key of its dead-letter copy.
    #[must_use]
    pub fn start(
        (source_key, source_replicas): (RecordKey, [NodeId; REPLICAS]),
        (target_key, target_replicas): (RecordKey, [NodeId; REPLICAS]),
        record: &Record,
        source_queue: SourceQueue,
        now: Millis,
    ) -> (MoveOp, Effects<MoveAnswer>) {
        let copy = dead_letter_copy(record, source_queue, now);
        let target = Target {
            key: target_key,
            replicas: target_replicas,
        };
        let op = MoveOp {
            source: Target {
                key: source_key,
                replicas: source_replicas,
            },
            generation: record.generation,
            expect: record.claim(),
            now,
            round: FIRST_ROUND,
            phase: MovePhase::Copy(WritePhase::new(target_replicas)),
        };
        let sends = broadcast(&target, FIRST_ROUND, &Write::Merge(copy));
        (op, Effects::sends(sends))
    }

    /// One replica's reply to round `round` (of either queue).
    pub fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<MoveAnswer> {
        if round != self.round {
            return Effects::none();
        }
        match &mut self.phase {
            MovePhase::Copy(write) => match write.take(from, reply) {
                Progress::Quorum => {
                    self.round += 1;
                    self.phase = MovePhase::Source(WritePhase::new(self.source.replicas));
                    Effects::sends(broadcast(
                        &self.source,
                        self.round,
                        &Write::Tombstone {
                            generation: self.generation,
                            expect: self.expect,
                            tombstone: Tombstone {
                                reason: TombstoneReason::Moved,
                                at: self.now,
                            },
                        },
                    ))
                }
                Progress::Refused => self.finish(MoveAnswer::Unavailable),
                Progress::Waiting => Effects::none(),
            },
            MovePhase::Source(write) => match write.take(from, reply) {
                Progress::Quorum => self.finish(MoveAnswer::Moved),
                Progress::Refused => self.finish(MoveAnswer::CopiedOnly),
                Progress::Waiting => Effects::none(),
            },
            MovePhase::Answered => Effects::none(),
        }
    }

    /// The deadline passed.
    pub fn on_timeout(&mut self) -> Effects<MoveAnswer> {
        match self.phase {
            MovePhase::Answered => Effects::none(),
            MovePhase::Copy(_) => self.finish(MoveAnswer::Unavailable),
            MovePhase::Source(_) => self.finish(MoveAnswer::CopiedOnly),
        }
    }

    fn finish(&mut self, answer: MoveAnswer) -> Effects<MoveAnswer> {
        self.phase = MovePhase::Answered;
        Effects::answer(answer)
    }
}

/// The dead-letter copy of `source` (spec/replication.md §12, "two dead-letter movers write one
/// record"): every field but `entered_at` derives from the source generation alone.
#[must_use]
pub fn dead_letter_copy(source: &Record, source_queue: SourceQueue, now: Millis) -> Record {
    let live = source
        .live()
        .expect("only a live copy is moved to the dead-letter queue");
    assert!(
        source.ready(),
        "only a ready copy is moved (spec/replication.md §4)"
    );
    let mut birth = live.birth.clone();
    birth.source_queue = Some(Box::new(source_queue));
    birth.visible_from = Millis(0);
    Record {
        generation: source.generation.next(),
        body: Body::Live(Live {
            birth,
            entered_at: now,
            // A purge mark belongs to the queue whose watermark made it (spec §2): carried into
            // the dead-letter queue it would hide the copy whenever the mover's clock reads
            // less than the source's mark, a purge of `D` that never happened.
            hidden_through: None,
            held: None,
            receive_count: live.receive_count,
            first_received_at: live.first_received_at,
            settle: Settle::Ready,
        }),
    }
}

// ----- redrive --------------------------------------------------------------------------------

/// The answer to the redrive of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedriveAnswer {
    /// The copy is durable on two of the target's replicas and the dead-letter generation is
    /// tombstoned on two.
    Moved,
    /// The copy is durable but the dead-letter copy's tombstone was refused or timed out (a
    /// receive in the dead-letter queue claimed it between the read and the tombstone): the
    /// message is in both queues, a duplicate (spec/replication.md#redrive).
    CopiedOnly,
    /// The read found nothing to redrive: gone, hidden by its purge mark, delayed, or claimed
    /// with a visibility deadline not yet passed by this coordinator's clock. Nothing written.
    NotMovable,
    /// No read quorum or no quorum for the copy by the deadline: the dead-letter copy was not
    /// touched (the copy may exist: a duplicate at worst).
    Unavailable,
    /// The replicas disagree on a once-field.
    Diverged(Divergence),
    /// Started without a target: the read found this copy movable. Nothing written; the caller
    /// finds the queue it goes to (the one its `source_queue` names) and goes on with
    /// [`RedriveOp::copy`].
    Movable(Box<Record>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum RedrivePhase {
    Read(ReadPhase),
    Copy(WritePhase),
    Source(WritePhase),
    Answered,
}

/// spec/replication.md#redrive (as section 7 states it): read the dead-letter copy by quorum; a
/// live copy never received, or whose claim's deadline passed by this coordinator's clock, is
/// written to the target queue as `(g + 1, Live { claim: None, receive_count: 0 })` with two
/// durable acks; only then the dead-letter generation `g` gets a conditional tombstone
/// conditioned on the claim the read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedriveOp {
    source: Target,
    /// `None` until the caller names it (a task without a destination: each message goes back
    /// to the queue it came from, which only the read tells).
    target: Option<Target>,
    now: Millis,
    /// The dead-letter queue's purge watermark (§2); a copy it hides is not movable.
    purged_through: Option<Millis>,
    generation: Generation,
    expect: Option<Claim>,
    round: u32,
    phase: RedrivePhase,
}

impl RedriveOp {
    /// Starts the redrive of the dead-letter copy under `source_key` at `now`: to `target` (the
    /// same message id in the queue it goes to), or with `None` only as far as the read, which
    /// answers [`RedriveAnswer::Movable`] for a movable copy. `purged_through` is the
    /// dead-letter queue's purge watermark as read by quorum (spec/replication.md §2): a copy
    /// it hides is gone, never sent back.
    #[must_use]
    pub fn start(
        (source_key, source_replicas): (RecordKey, [NodeId; REPLICAS]),
        target: Option<(RecordKey, [NodeId; REPLICAS])>,
        now: Millis,
        purged_through: Option<Millis>,
    ) -> (RedriveOp, Effects<RedriveAnswer>) {
        let target = target.map(|(key, replicas)| {
            assert_eq!(
                source_key.message, key.message,
                "a redrive keeps the message id"
            );
            Target { key, replicas }
        });
        let source = Target {
            key: source_key,
            replicas: source_replicas,
        };
        let sends = reads(&source, FIRST_ROUND);
        let op = RedriveOp {
            source,
            target,
            now,
            purged_through,
            generation: Generation(0),
            expect: None,
            round: FIRST_ROUND,
            phase: RedrivePhase::Read(ReadPhase::new(source_replicas, read_quorum())),
        };
        (op, Effects::sends(sends))
    }

    /// Whether the operation is still in its quorum read.
    #[must_use]
    pub fn reading(&self) -> bool {
        matches!(self.phase, RedrivePhase::Read(_))
    }

    /// One replica's reply to round `round` (of either queue).
    pub fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<RedriveAnswer> {
        if round != self.round {
            return Effects::none();
        }
        match &mut self.phase {
            RedrivePhase::Read(read) => {
                if !read.take(from, reply) {
                    return Effects::none();
                }
                let read = read.clone();
                self.decide(&read)
            }
            RedrivePhase::Copy(write) => match write.take(from, reply) {
                Progress::Quorum => {
                    self.round += 1;
                    self.phase = RedrivePhase::Source(WritePhase::new(self.source.replicas));
                    Effects::sends(broadcast(
                        &self.source,
                        self.round,
                        &Write::Tombstone {
                            generation: self.generation,
                            expect: self.expect,
                            tombstone: Tombstone {
                                reason: TombstoneReason::Moved,
                                at: self.now,
                            },
                        },
                    ))
                }
                Progress::Refused => self.finish(Vec::new(), RedriveAnswer::Unavailable),
                Progress::Waiting => Effects::none(),
            },
            RedrivePhase::Source(write) => match write.take(from, reply) {
                Progress::Quorum => self.finish(Vec::new(), RedriveAnswer::Moved),
                Progress::Refused => self.finish(Vec::new(), RedriveAnswer::CopiedOnly),
                Progress::Waiting => Effects::none(),
            },
            RedrivePhase::Answered => Effects::none(),
        }
    }

    /// The deadline passed.
    pub fn on_timeout(&mut self) -> Effects<RedriveAnswer> {
        match self.phase {
            RedrivePhase::Answered => Effects::none(),
            RedrivePhase::Read(_) | RedrivePhase::Copy(_) => {
                self.finish(Vec::new(), RedriveAnswer::Unavailable)
            }
            RedrivePhase::Source(_) => self.finish(Vec::new(), RedriveAnswer::CopiedOnly),
        }
    }

    /// Goes on with the redrive of `record` (what [`RedriveAnswer::Movable`] answered) to
    /// `target`: the copy, then the tombstone conditioned on the claim that read found.
    #[must_use]
    pub fn copy(
        (source_key, source_replicas): (RecordKey, [NodeId; REPLICAS]),
        (target_key, target_replicas): (RecordKey, [NodeId; REPLICAS]),
        record: &Record,
        now: Millis,
    ) -> (RedriveOp, Effects<RedriveAnswer>) {
        assert_eq!(
            source_key.message, target_key.message,
            "a redrive keeps the message id"
        );
        let mut op = RedriveOp {
            source: Target {
                key: source_key,
                replicas: source_replicas,
            },
            target: Some(Target {
                key: target_key,
                replicas: target_replicas,
            }),
            now,
            // The read that found `record` movable already applied it.
            purged_through: None,
            generation: record.generation,
            expect: record.claim(),
            round: FIRST_ROUND,
            phase: RedrivePhase::Answered,
        };
        let sends = op.copy_phase(record);
        (op, Effects::sends(sends))
    }

    fn copy_phase(&mut self, record: &Record) -> Vec<Outgoing> {
        let target = self.target.as_ref().expect("a copy has its target");
        self.generation = record.generation;
        self.expect = record.claim();
        self.phase = RedrivePhase::Copy(WritePhase::new(target.replicas));
        broadcast(
            target,
            self.round,
            &Write::Merge(redrive_copy(record, self.now)),
        )
    }

    fn decide(&mut self, read: &ReadPhase) -> Effects<RedriveAnswer> {
        let merged = match read.merged() {
            Ok(merged) => merged,
            Err(divergence) => return self.finish(Vec::new(), RedriveAnswer::Diverged(divergence)),
        };
        // No read repair: only a receive repairs what it read (spec/replication.md, *Redrive*);
        // anti-entropy converges the rest.
        let movable = merged.as_ref().filter(|record| {
            record.live().is_some_and(|live| {
                !record.hidden(self.purged_through)
                    && live.birth.visible_from <= self.now
                    && live.held.is_none_or(|held| held.deadline <= self.now)
            })
        });
        let Some(record) = movable.cloned() else {
            return self.finish(Vec::new(), RedriveAnswer::NotMovable);
        };
        if self.target.is_none() {
            return self.finish(Vec::new(), RedriveAnswer::Movable(Box::new(record)));
        }
        self.round += 1;
        Effects::sends(self.copy_phase(&record))
    }

    fn finish(&mut self, sends: Vec<Outgoing>, answer: RedriveAnswer) -> Effects<RedriveAnswer> {
        self.phase = RedrivePhase::Answered;
        Effects {
            sends,
            answer: Some(answer),
        }
    }
}

/// The redriven copy of the dead-letter copy `source` (spec/replication.md §12, *Redrives of
/// one dead-letter copy by two task runners*): generation `g + 1`, the payload and `sent_at`
/// copied, no source queue, no delay, no claim, receive count 0, no first receive, entering at
/// the writer's clock (the one field two redrivers may write differently, merged by the latest).
#[must_use]
pub fn redrive_copy(source: &Record, now: Millis) -> Record {
    let live = source.live().expect("only a live copy is redriven");
    let mut birth = live.birth.clone();
    birth.source_queue = None;
    birth.visible_from = Millis(0);
    Record {
        generation: source.generation.next(),
        body: Body::Live(Live {
            birth,
            entered_at: now,
            hidden_through: None,
            held: None,
            receive_count: 0,
            first_received_at: None,
            settle: Settle::Ready,
        }),
    }
}

// ----- collection -----------------------------------------------------------------------------

/// The answer to the read of a collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectAnswer {
    /// All three replicas hold the same tombstone of `generation` (or the same record of it
    /// that its purge mark hides, spec/replication.md §2): drop it once the horizon has passed
    /// since `confirmed_at` (this coordinator's clock), with [`drop_requests`].
    Confirmed {
        /// The tombstone's (or marked record's) generation.
        generation: Generation,
        /// When the three replicas were seen holding it.
        confirmed_at: Millis,
    },
    /// Not all three hold the same collectable record (or one did not answer): nothing to do
    /// now.
    NotYet,
}

/// spec/replication.md#tombstones-and-their-collection, step 1: read **all three**.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectOp {
    read: ReadPhase,
    now: Millis,
    answered: bool,
}

impl CollectOp {
    /// Starts the read of all three replicas of `key` at `now`.
    #[must_use]
    pub fn start(
        key: RecordKey,
        replicas: [NodeId; REPLICAS],
        now: Millis,
    ) -> (CollectOp, Effects<CollectAnswer>) {
        let target = Target { key, replicas };
        (
            CollectOp {
                // The planted bug confirms at the first two replies: a replica that missed the
                // delete is never asked to agree.
                read: ReadPhase::new(
                    replicas,
                    if planted(Bug::CollectAfterTwo) {
                        REPLICAS - 1
                    } else {
                        REPLICAS
                    },
                ),
                now,
                answered: false,
            },
            Effects::sends(reads(&target, FIRST_ROUND)),
        )
    }

    /// One replica's reply to round `round`.
    pub fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<CollectAnswer> {
        if self.answered || round != FIRST_ROUND || !self.read.take(from, reply) {
            return Effects::none();
        }
        self.answered = true;
        let mut replies = self.read.replies.values();
        let first = replies.next().cloned().flatten();
        let answer = match first {
            Some(tombstone)
                if tombstone.collectable()
                    && replies.all(|reply| reply.as_ref() == Some(&tombstone)) =>
            {
                CollectAnswer::Confirmed {
                    generation: tombstone.generation,
                    confirmed_at: self.now,
                }
            }
            _ => CollectAnswer::NotYet,
        };
        Effects::answer(answer)
    }

    /// The deadline passed before all three answered.
    pub fn on_timeout(&mut self) -> Effects<CollectAnswer> {
        if self.answered {
            return Effects::none();
        }
        self.answered = true;
        Effects::answer(CollectAnswer::NotYet)
    }
}

/// Step 3 of collection: the conditional drop of `key`'s tombstone of `generation`, to all
/// three, once the horizon has passed since the confirmation. Nobody waits for the acks: a lost
/// drop leaves the tombstone, which a later collection drops again (spec/replication.md §13).
#[must_use]
pub fn drop_requests(
    key: RecordKey,
    replicas: [NodeId; REPLICAS],
    generation: Generation,
) -> Vec<Outgoing> {
    replicas
        .iter()
        .map(|to| Outgoing {
            to: *to,
            key: key.clone(),
            round: FIRST_ROUND,
            request: Request::Write {
                write: Box::new(Write::Drop { generation }),
                ack: false,
            },
        })
        .collect()
}

// ----- one interface for drivers -------------------------------------------------------------

/// What every operation offers its driver: replies in, a timeout, effects out.
pub trait Operation {
    /// What the client is told.
    type Answer;
    /// One replica's reply to round `round`.
    fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<Self::Answer>;
    /// The operation's deadline passed.
    fn on_timeout(&mut self) -> Effects<Self::Answer>;
    /// Whether a write round can now count only through its last replica (one ack, one
    /// refusal) and gives up after `SPLIT_WAIT` (spec/replication.md, receive step 7). Only a
    /// receive's claim does; other operations wait for their deadline.
    fn split(&self) -> bool {
        false
    }
    /// `SPLIT_WAIT` passed since [`Operation::split`] first held.
    fn on_split_wait(&mut self) -> Effects<Self::Answer> {
        Effects::none()
    }
    /// Whether the answered operation still waits for a reply its driver should hear before
    /// it lets go of what it holds (a receive's delivery on its way to the own replica,
    /// [`ReceiveOp::own_pending`]). Replies then change no answer.
    fn lingers(&self) -> bool {
        false
    }
}

macro_rules! operation {
    ($op:ty, $answer:ty) => {
        impl Operation for $op {
            type Answer = $answer;
            fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<$answer> {
                <$op>::on_reply(self, from, round, reply)
            }
            fn on_timeout(&mut self) -> Effects<$answer> {
                <$op>::on_timeout(self)
            }
        }
    };
}

operation!(SendOp, SendAnswer);
operation!(HandleOp, HandleAnswer);
operation!(MoveOp, MoveAnswer);
operation!(RedriveOp, RedriveAnswer);
operation!(CollectOp, CollectAnswer);

impl Operation for ReceiveOp {
    type Answer = ReceiveAnswer;
    fn on_reply(&mut self, from: NodeId, round: u32, reply: &Reply) -> Effects<ReceiveAnswer> {
        ReceiveOp::on_reply(self, from, round, reply)
    }
    fn on_timeout(&mut self) -> Effects<ReceiveAnswer> {
        ReceiveOp::on_timeout(self)
    }
    fn split(&self) -> bool {
        ReceiveOp::split(self)
    }
    fn on_split_wait(&mut self) -> Effects<ReceiveAnswer> {
        ReceiveOp::on_split_wait(self)
    }
    fn lingers(&self) -> bool {
        self.own_pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Birth;
    use trireme_core::{Incarnation, MessageId, QueueName};

    fn key() -> RecordKey {
        RecordKey {
            queue: QueueName::try_from("jobs".to_string()).unwrap(),
            incarnation: Incarnation::local(Millis(1)),
            message: MessageId(42),
        }
    }

    const R: [NodeId; REPLICAS] = [NodeId(1), NodeId(2), NodeId(3)];
    const HOUR_MS: u64 = 3_600_000;

    fn sent() -> Record {
        Record::sent(Birth {
            payload: b"job".to_vec(),
            sent_at: Millis(1_000),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: None,
        })
    }

    fn settings(now: u64, max_receive_count: Option<u32>) -> ReceiveSettings {
        ReceiveSettings {
            me: NodeId(1),
            now: Millis(now),
            visibility_timeout_ms: 30_000,
            max_receive_count,
            nonce: 77,
            purged_through: None,
            retention_ms: 4 * 24 * HOUR_MS,
        }
    }

    /// Runs a receive against replicas that all hold `held`, acking or refusing the claim.
    fn receive(held: &Record, now: u64, acks: bool) -> (ReceiveOp, Vec<ReceiveAnswer>) {
        let (mut op, _) = ReceiveOp::start(key(), R, settings(now, Some(3)));
        let mut answers = Vec::new();
        for from in &R[..2] {
            answers.extend(
                op.on_reply(*from, 1, &Reply::Record(Some(held.clone())))
                    .answer,
            );
        }
        let reply = if acks { Reply::Ack } else { Reply::Refused };
        for from in &R[..2] {
            answers.extend(op.on_reply(*from, 2, &reply).answer);
        }
        (op, answers)
    }

    #[test]
    fn a_send_answers_once_at_two_acks_and_never_twice() {
        let (mut op, effects) = SendOp::start(key(), R, sent());
        assert_eq!(effects.sends.len(), 3);
        assert_eq!(op.on_reply(R[0], 1, &Reply::Ack).answer, None);
        assert_eq!(
            op.on_reply(R[0], 1, &Reply::Ack).answer,
            None,
            "a duplicated ack counts once"
        );
        assert_eq!(
            op.on_reply(NodeId(9), 1, &Reply::Ack).answer,
            None,
            "not a replica"
        );
        assert_eq!(
            op.on_reply(R[1], 1, &Reply::Ack).answer,
            Some(SendAnswer::Sent)
        );
        assert_eq!(op.on_reply(R[2], 1, &Reply::Ack).answer, None);
        assert_eq!(op.on_timeout().answer, None);
    }

    #[test]
    fn a_receive_delivers_only_after_two_acks() {
        let (_, answers) = receive(&sent(), 5_000, true);
        let [ReceiveAnswer::Delivered(record)] = answers.as_slice() else {
            panic!("one delivery, got {answers:?}");
        };
        let live = record.live().unwrap();
        let held = live.held.unwrap();
        assert_eq!(held.claim.seq, 1);
        assert_eq!(held.claim.nonce, 77);
        assert_eq!(held.deadline, Millis(35_000));
        assert_eq!(held.received_at, Millis(5_000));
        assert_eq!(live.receive_count, 1);
        assert_eq!(live.first_received_at, Some(Millis(5_000)));
    }

    /// The claims `effects` sends, each with the clock and maximum it carries.
    fn claims_sent(effects: &Effects<ReceiveAnswer>) -> Vec<(Record, Millis, Option<u32>)> {
        effects
            .sends
            .iter()
            .filter_map(|out| match &out.request {
                Request::Write { write, ack: true } => match write.as_ref() {
                    Write::Claim {
                        record,
                        now,
                        max_receive_count,
                    } => Some((record.clone(), *now, *max_receive_count)),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_claim_without_the_read_reaches_the_own_replica_last_and_delivers_after_two_acks_and_the_watermark()
     {
        // The coordinator is replica R[0] (`settings`' `me`).
        let (mut op, effects) =
            ReceiveOp::start_fast(key(), R, settings(5_000, Some(3)), &sent()).expect("claimable");
        let claims = claims_sent(&effects);
        assert_eq!(
            claims.len(),
            2,
            "one round, no read, the own replica held back"
        );
        assert!(effects.sends.iter().all(|out| out.to != R[0]));
        let (claimed, now, max) = &claims[0];
        assert_eq!((*now, *max), (Millis(5_000), Some(3)));
        assert_eq!(claimed.claim().map(|c| c.seq), Some(1));
        assert_eq!(op.path(), ReceivePath::Fast);
        let effects = op.on_reply(R[1], 1, &Reply::Ack);
        assert_eq!(effects.answer, None);
        assert_eq!(
            effects.sends.iter().map(|out| out.to).collect::<Vec<_>>(),
            vec![R[0]],
            "another replica took it: now the own one"
        );
        assert_eq!(claims_sent(&effects).len(), 1);
        assert!(
            op.on_reply(R[2], 1, &Reply::Ack).sends.is_empty(),
            "sent to the own replica once"
        );
        let answer = op.on_watermark(None).answer;
        assert_eq!(answer, Some(ReceiveAnswer::Delivered(claimed.clone())));
        assert_eq!(op.path(), ReceivePath::Fast);
        assert!(
            op.own_pending(),
            "delivered by the two others, the own one still writing"
        );
        assert_eq!(op.on_reply(R[0], 1, &Reply::Ack), Effects::none());
        assert!(!op.own_pending());
    }

    #[test]
    fn a_claim_without_the_read_on_a_record_the_watermark_hides_delivers_nothing() {
        let (mut op, _) =
            ReceiveOp::start_fast(key(), R, settings(5_000, None), &sent()).expect("claimable");
        // The watermark first this time: the acks then decide at once.
        assert_eq!(op.on_watermark(Some(Millis(4_000))).answer, None);
        op.on_reply(R[1], 1, &Reply::Ack);
        assert_eq!(
            op.on_reply(R[2], 1, &Reply::Ack).answer,
            Some(ReceiveAnswer::Nothing(NothingBecause::Gone)),
            "entered before the purge: gone, its claim an orphan"
        );
    }

    /// `sent()` received once through node 2 at 4,000, hidden until `deadline`.
    fn claimed_by_another(deadline: u64) -> Record {
        let mut record = sent();
        if let Body::Live(live) = &mut record.body {
            live.receive_count = 1;
            live.held = Some(Held {
                claim: Claim {
                    seq: 1,
                    coordinator: NodeId(2),
                    nonce: 5,
                },
                change_counter: 0,
                deadline: Millis(deadline),
                received_at: Millis(4_000),
            });
        }
        record
    }

    #[test]
    fn a_refused_claim_without_the_read_takes_the_read_path_for_the_same_receive() {
        let (mut op, _) =
            ReceiveOp::start_fast(key(), R, settings(5_000, None), &sent()).expect("claimable");
        let effects = op.on_reply(R[1], 1, &Reply::Refused);
        assert_eq!(effects.answer, None);
        assert_eq!(op.path(), ReceivePath::FellBack);
        assert_eq!(effects.sends.len(), 3);
        assert!(
            effects
                .sends
                .iter()
                .all(|out| out.request == Request::Read && out.round == 2)
        );
        assert_eq!(
            op.on_reply(R[2], 1, &Reply::Ack),
            Effects::none(),
            "the fast claim's late ack counts for nothing, and the own replica never gets it"
        );
        // The read finds the claim another coordinator won: seq 1, unexpired.
        let won = claimed_by_another(9_000);
        op.on_reply(R[0], 2, &Reply::Record(Some(won.clone())));
        op.on_reply(R[1], 2, &Reply::Record(Some(won)));
        assert_eq!(
            op.on_watermark(None).answer,
            Some(ReceiveAnswer::Nothing(NothingBecause::Invisible))
        );
    }

    #[test]
    fn a_claim_without_the_read_refused_after_an_ack_goes_on_like_a_read_path_claim() {
        // Acked by R[1], refused by R[2]: the own replica still decides, and delivers.
        let (mut op, _) =
            ReceiveOp::start_fast(key(), R, settings(5_000, None), &sent()).expect("claimable");
        let effects = op.on_reply(R[1], 1, &Reply::Ack);
        assert_eq!(
            effects.sends.iter().map(|out| out.to).collect::<Vec<_>>(),
            vec![R[0]]
        );
        let effects = op.on_reply(R[2], 1, &Reply::Refused);
        assert_eq!(effects, Effects::none(), "no fallback once a replica acked");
        assert_eq!(op.path(), ReceivePath::Fast);
        assert!(op.split(), "one ack, one refusal: the third decides");
        assert_eq!(op.on_watermark(None).answer, None);
        let Some(ReceiveAnswer::Delivered(record)) = op.on_reply(R[0], 1, &Reply::Ack).answer
        else {
            panic!("the own replica's ack is the second");
        };
        assert_eq!(record.claim().map(|c| c.seq), Some(1));

        // Refused by the own replica too: the race is lost, nothing delivered, no read.
        let (mut op, _) =
            ReceiveOp::start_fast(key(), R, settings(5_000, None), &sent()).expect("claimable");
        op.on_reply(R[2], 1, &Reply::Ack);
        assert_eq!(op.on_reply(R[1], 1, &Reply::Refused), Effects::none());
        let effects = op.on_reply(R[0], 1, &Reply::Refused);
        assert_eq!(effects.answer, Some(ReceiveAnswer::LostRace));
        assert!(effects.sends.is_empty());
        assert_eq!(op.path(), ReceivePath::Fast);

        // Split and the own replica silent: given up after the split wait, as on the read path.
        let (mut op, _) =
            ReceiveOp::start_fast(key(), R, settings(5_000, None), &sent()).expect("claimable");
        op.on_reply(R[1], 1, &Reply::Ack);
        op.on_reply(R[2], 1, &Reply::Refused);
        assert_eq!(op.on_split_wait().answer, Some(ReceiveAnswer::GaveUpSplit));
    }

    #[test]
    fn only_a_claimable_local_record_takes_the_fast_path() {
        let at_max = {
            let mut record = sent();
            if let Body::Live(live) = &mut record.body {
                live.receive_count = 3;
            }
            record
        };
        let unexpired = claimed_by_another(5_001);
        let deleted = Record::tombstone(
            Generation(0),
            crate::record::TombstoneReason::Deleted,
            Millis(2_000),
        );
        for local in [at_max, unexpired, deleted] {
            assert!(
                ReceiveOp::start_fast(key(), R, settings(5_000, Some(3)), &local).is_none(),
                "{local:?}"
            );
        }
    }

    #[test]
    fn a_receive_that_timed_out_never_delivers() {
        let (mut op, _) = ReceiveOp::start(key(), R, settings(5_000, None));
        op.on_reply(R[0], 1, &Reply::Record(Some(sent())));
        op.on_reply(R[1], 1, &Reply::Record(Some(sent())));
        op.on_reply(R[0], 2, &Reply::Ack);
        assert_eq!(op.on_timeout().answer, Some(ReceiveAnswer::Unavailable));
        assert_eq!(
            op.on_reply(R[1], 2, &Reply::Ack).answer,
            None,
            "a late ack delivers nothing"
        );
    }

    #[test]
    fn a_split_claim_is_given_up_after_the_split_wait_and_never_delivers() {
        let (mut op, _) = ReceiveOp::start(key(), R, settings(5_000, None));
        op.on_reply(R[0], 1, &Reply::Record(Some(sent())));
        op.on_reply(R[1], 1, &Reply::Record(Some(sent())));
        assert!(!op.split(), "reading is not split");
        assert_eq!(op.on_reply(R[0], 2, &Reply::Ack).answer, None);
        assert!(!op.split(), "one ack alone is not split");
        assert_eq!(
            op.on_split_wait().answer,
            None,
            "a claim that is not split waits on"
        );
        assert_eq!(op.on_reply(R[1], 2, &Reply::Refused).answer, None);
        assert!(op.split(), "one ack and one refusal");
        assert_eq!(op.on_split_wait().answer, Some(ReceiveAnswer::GaveUpSplit));
        assert_eq!(
            op.on_reply(R[2], 2, &Reply::Ack).answer,
            None,
            "the third replica's late ack delivers nothing"
        );
        assert_eq!(op.on_timeout().answer, None, "answered once");
    }

    #[test]
    fn a_split_claim_whose_third_replica_acks_in_time_is_delivered() {
        let (mut op, _) = ReceiveOp::start(key(), R, settings(5_000, None));
        op.on_reply(R[0], 1, &Reply::Record(Some(sent())));
        op.on_reply(R[1], 1, &Reply::Record(Some(sent())));
        op.on_reply(R[1], 2, &Reply::Refused);
        op.on_reply(R[0], 2, &Reply::Ack);
        assert!(op.split());
        let answer = op.on_reply(R[2], 2, &Reply::Ack).answer;
        assert!(
            matches!(answer, Some(ReceiveAnswer::Delivered(_))),
            "{answer:?}"
        );
        assert!(!op.split());
        assert_eq!(op.on_split_wait().answer, None, "already answered");
    }

    #[test]
    fn a_message_past_its_retention_by_the_coordinator_s_clock_is_nothing_to_receive() {
        let retention_ms = 4 * 24 * HOUR_MS;
        // `sent()` was sent at 1,000 ms: it lives until 1,000 + retention, exclusive.
        let last_ms = 1_000 + retention_ms - 1;
        let (_, answers) = receive(&sent(), last_ms, true);
        assert!(
            matches!(answers.as_slice(), [ReceiveAnswer::Delivered(_)]),
            "{answers:?}"
        );
        let (_, answers) = receive(&sent(), last_ms + 1, true);
        assert_eq!(answers, vec![ReceiveAnswer::Nothing(NothingBecause::Gone)]);
    }

    #[test]
    fn a_refused_claim_loses_the_race_and_delivers_nothing() {
        let (_, answers) = receive(&sent(), 5_000, false);
        assert_eq!(answers, vec![ReceiveAnswer::LostRace]);
    }

    #[test]
    fn an_unexpired_claim_or_a_delay_hides_the_message() {
        let (_, answers) = receive(&sent(), 5_000, true);
        let ReceiveAnswer::Delivered(claimed) = &answers[0] else {
            panic!("delivered first");
        };
        let (_, again) = receive(claimed, 6_000, true);
        assert_eq!(
            again,
            vec![ReceiveAnswer::Nothing(NothingBecause::Invisible)]
        );
        let (_, later) = receive(claimed, 35_000, true);
        assert!(
            matches!(later[0], ReceiveAnswer::Delivered(_)),
            "visible at its deadline"
        );
        let mut delayed = sent();
        if let Body::Live(live) = &mut delayed.body {
            live.birth.visible_from = Millis(10_000);
        }
        let (_, early) = receive(&delayed, 9_999, true);
        assert_eq!(early, vec![ReceiveAnswer::Nothing(NothingBecause::Delayed)]);
    }

    #[test]
    fn a_receive_at_the_maximum_moves_instead_of_claiming() {
        let mut record = sent();
        if let Body::Live(live) = &mut record.body {
            live.receive_count = 3;
        }
        let (mut op, _) = ReceiveOp::start(key(), R, settings(5_000, Some(3)));
        op.on_reply(R[0], 1, &Reply::Record(Some(record.clone())));
        let effects = op.on_reply(R[1], 1, &Reply::Record(Some(record.clone())));
        assert_eq!(effects.answer, Some(ReceiveAnswer::DeadLetter(record)));
        assert!(
            effects.sends.is_empty(),
            "nothing claimed, nothing repaired"
        );
    }

    #[test]
    fn a_receive_repairs_the_replica_that_replied_with_less() {
        let (mut op, _) = ReceiveOp::start(key(), R, settings(5_000, None));
        op.on_reply(R[0], 1, &Reply::Record(None));
        let effects = op.on_reply(R[1], 1, &Reply::Record(Some(sent())));
        let repairs: Vec<_> = effects
            .sends
            .iter()
            .filter(|out| matches!(out.request, Request::Write { ack: false, .. }))
            .collect();
        assert_eq!(repairs.len(), 1);
        assert_eq!(repairs[0].to, R[0]);
    }

    fn delivered() -> (Record, Handle) {
        let (_, answers) = receive(&sent(), 5_000, true);
        let ReceiveAnswer::Delivered(record) = answers[0].clone() else {
            panic!("delivered");
        };
        let handle = Handle {
            generation: record.generation,
            claim: record.claim().unwrap(),
        };
        (record, handle)
    }

    fn handle_op(
        held: &Record,
        handle: Handle,
        action: HandleAction,
    ) -> (HandleOp, Effects<HandleAnswer>) {
        let (mut op, _) = HandleOp::start(key(), R, handle, action, Millis(10_000));
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        let effects = op.on_reply(R[1], 1, &Reply::Record(Some(held.clone())));
        (op, effects)
    }

    #[test]
    fn a_delete_with_the_current_handle_writes_a_conditional_tombstone() {
        let (record, handle) = delivered();
        let (mut op, effects) = handle_op(&record, handle, HandleAction::Delete);
        assert!(effects.sends.iter().all(|out| matches!(
            &out.request,
            Request::Write { write, ack: true }
                if matches!(write.as_ref(), Write::Tombstone { expect, .. } if *expect == Some(handle.claim))
        )));
        op.on_reply(R[0], 2, &Reply::Ack);
        assert_eq!(
            op.on_reply(R[2], 2, &Reply::Ack).answer,
            Some(HandleAnswer::Delete(DeleteAnswer::Deleted))
        );
    }

    /// F3 (spec/replication.md, *Considerations*): a delete's tombstone that one replica took
    /// and two refused (a receive claimed the message between the delete's read and its write)
    /// took effect, since the tombstone dominates there; it is answered as at the deadline,
    /// never as superseded. Only three refusals wrote nothing.
    #[test]
    fn a_delete_whose_tombstone_a_replica_took_is_never_answered_superseded() {
        let (record, handle) = delivered();
        let unavailable = Some(HandleAnswer::Delete(DeleteAnswer::Unavailable));
        let (mut op, _) = handle_op(&record, handle, HandleAction::Delete);
        assert_eq!(op.on_reply(R[0], 2, &Reply::Ack).answer, None);
        assert_eq!(op.on_reply(R[1], 2, &Reply::Refused).answer, None);
        assert_eq!(op.on_reply(R[2], 2, &Reply::Refused).answer, unavailable);
        // Two refusals first: the third replica decides.
        let (mut op, _) = handle_op(&record, handle, HandleAction::Delete);
        assert_eq!(op.on_reply(R[0], 2, &Reply::Refused).answer, None);
        assert_eq!(op.on_reply(R[1], 2, &Reply::Refused).answer, None);
        assert_eq!(op.on_reply(R[2], 2, &Reply::Ack).answer, unavailable);
        let (mut op, _) = handle_op(&record, handle, HandleAction::Delete);
        op.on_reply(R[0], 2, &Reply::Refused);
        op.on_reply(R[1], 2, &Reply::Refused);
        assert_eq!(
            op.on_reply(R[2], 2, &Reply::Refused).answer,
            Some(HandleAnswer::Delete(DeleteAnswer::Stale)),
            "three refusals: nothing written"
        );
        let (mut op, _) = handle_op(&record, handle, HandleAction::Delete);
        op.on_reply(R[0], 2, &Reply::Refused);
        op.on_reply(R[1], 2, &Reply::Refused);
        assert_eq!(
            op.on_timeout().answer,
            unavailable,
            "the third never answered"
        );
    }

    #[test]
    fn a_delete_with_a_superseded_handle_writes_nothing() {
        let (record, handle) = delivered();
        let (_, again) = receive(&record, 40_000, true);
        let ReceiveAnswer::Delivered(newer) = &again[0] else {
            panic!("received again");
        };
        let (_, effects) = handle_op(newer, handle, HandleAction::Delete);
        assert!(effects.sends.is_empty());
        assert_eq!(
            effects.answer,
            Some(HandleAnswer::Delete(DeleteAnswer::Stale))
        );
    }

    #[test]
    fn a_dead_letter_now_reads_writes_nothing_and_classifies_the_handle() {
        let (record, handle) = delivered();
        let (_, effects) = handle_op(
            &record,
            handle,
            HandleAction::DeadLetterNow {
                purged_through: None,
            },
        );
        assert!(
            effects
                .sends
                .iter()
                .all(|out| !matches!(out.request, Request::Write { ack: true, .. }))
        );
        assert_eq!(
            effects.answer,
            Some(HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Current(
                record.clone()
            )))
        );
        let (_, again) = receive(&record, 40_000, true);
        let ReceiveAnswer::Delivered(newer) = &again[0] else {
            panic!("received again");
        };
        let (_, stale) = handle_op(
            newer,
            handle,
            HandleAction::DeadLetterNow {
                purged_through: None,
            },
        );
        assert_eq!(
            stale.answer,
            Some(HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Stale))
        );
        let tombstone = Record::tombstone(handle.generation, TombstoneReason::Deleted, Millis(9));
        let (_, gone) = handle_op(
            &tombstone,
            handle,
            HandleAction::DeadLetterNow {
                purged_through: None,
            },
        );
        assert!(gone.sends.is_empty());
        assert_eq!(
            gone.answer,
            Some(HandleAnswer::DeadLetterNow(
                DeadLetterNowAnswer::NotInFlight
            ))
        );
    }

    #[test]
    fn a_dead_letter_now_of_a_purged_record_is_not_in_flight() {
        let (record, handle) = delivered();
        let entered_at = record.live().unwrap().entered_at;
        let action = |w: u64| HandleAction::DeadLetterNow {
            purged_through: Some(Millis(w)),
        };
        let (_, hidden) = handle_op(&record, handle, action(entered_at.0));
        assert!(
            hidden
                .sends
                .iter()
                .all(|out| !matches!(out.request, Request::Write { ack: true, .. }))
        );
        assert_eq!(
            hidden.answer,
            Some(HandleAnswer::DeadLetterNow(
                DeadLetterNowAnswer::NotInFlight
            ))
        );
        let (_, earlier) = handle_op(&record, handle, action(entered_at.0 - 1));
        assert!(matches!(
            earlier.answer,
            Some(HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Current(_)))
        ));
    }

    /// Reads of two replicas holding `held`, for a receive that reads the watermark too.
    fn receive_awaiting(held: &Record) -> (ReceiveOp, Vec<Outgoing>) {
        let (mut op, _) = ReceiveOp::start_reading_watermark(key(), R, settings(40_000, None));
        let mut sends = Vec::new();
        for from in &R[..2] {
            let effects = op.on_reply(*from, 1, &Reply::Record(Some(held.clone())));
            assert_eq!(effects.answer, None, "no decision before the watermark");
            sends.extend(effects.sends);
        }
        (op, sends)
    }

    fn claims(sends: &[Outgoing]) -> usize {
        sends
            .iter()
            .filter(|out| matches!(&out.request, Request::Write { write, .. } if matches!(write.as_ref(), Write::Claim { .. })))
            .count()
    }

    #[test]
    fn a_receive_waits_for_the_watermark_and_never_claims_what_it_hides() {
        let held = sent();
        let entered_at = held.live().unwrap().entered_at;
        let (mut op, sends) = receive_awaiting(&held);
        assert_eq!(claims(&sends), 0, "no claim before the watermark");
        assert_eq!(
            op.on_reply(R[2], 1, &Reply::Record(Some(held.clone())))
                .answer,
            None
        );
        let hidden = op.on_watermark(Some(entered_at));
        assert_eq!(claims(&hidden.sends), 0);
        assert_eq!(
            hidden.answer,
            Some(ReceiveAnswer::Nothing(NothingBecause::Gone))
        );
        assert_eq!(op.on_watermark(None).answer, None, "answered once");

        // A watermark below the entry: claimed as usual.
        let (mut op, _) = receive_awaiting(&held);
        let claimed = op.on_watermark(Some(Millis(entered_at.0 - 1)));
        assert_eq!(claims(&claimed.sends), 3);
        op.on_reply(R[0], 2, &Reply::Ack);
        assert!(matches!(
            op.on_reply(R[1], 2, &Reply::Ack).answer,
            Some(ReceiveAnswer::Delivered(_))
        ));

        // The watermark first, the record after: decided at the read quorum.
        let (mut op, _) = ReceiveOp::start_reading_watermark(key(), R, settings(40_000, None));
        assert_eq!(op.on_watermark(Some(entered_at)).answer, None);
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        assert_eq!(
            op.on_reply(R[1], 1, &Reply::Record(Some(held.clone())))
                .answer,
            Some(ReceiveAnswer::Nothing(NothingBecause::Gone))
        );

        // No watermark by the deadline: nothing delivered, ever.
        let (mut op, _) = receive_awaiting(&held);
        assert_eq!(op.on_timeout().answer, Some(ReceiveAnswer::Unavailable));
        assert_eq!(op.on_watermark(None).answer, None);
    }

    #[test]
    fn the_settings_watermark_still_hides_when_the_quorum_read_shows_less() {
        let held = sent();
        let entered_at = held.live().unwrap().entered_at;
        let mut with_view = settings(40_000, None);
        with_view.purged_through = Some(entered_at);
        let (mut op, _) = ReceiveOp::start_reading_watermark(key(), R, with_view);
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        op.on_reply(R[1], 1, &Reply::Record(Some(held.clone())));
        assert_eq!(
            op.on_watermark(None).answer,
            Some(ReceiveAnswer::Nothing(NothingBecause::Gone))
        );
    }

    #[test]
    fn already_gone_is_answered_only_after_the_tombstone_is_on_two_replicas() {
        let (_, handle) = delivered();
        let tombstone = Record::tombstone(handle.generation, TombstoneReason::Deleted, Millis(9));
        let (mut op, effects) = handle_op(&tombstone, handle, HandleAction::Delete);
        assert_eq!(effects.answer, None);
        assert_eq!(effects.sends.len(), 3);
        op.on_reply(R[0], 2, &Reply::Ack);
        assert_eq!(
            op.on_reply(R[1], 2, &Reply::Ack).answer,
            Some(HandleAnswer::Delete(DeleteAnswer::AlreadyGone))
        );
    }

    #[test]
    fn a_visibility_change_counts_up_and_respects_the_cap() {
        let (record, handle) = delivered();
        let change = HandleAction::ChangeVisibility {
            timeout_ms: 60_000,
            cap_ms: 12 * HOUR_MS,
        };
        let (_, effects) = handle_op(&record, handle, change);
        let Request::Write { write, .. } = &effects.sends[0].request else {
            panic!("a conditional visibility write");
        };
        let Write::Visibility(changed) = write.as_ref() else {
            panic!("a conditional visibility write");
        };
        let held = changed.live().unwrap().held.unwrap();
        assert_eq!(held.change_counter, 1);
        assert_eq!(held.deadline, Millis(70_000));
        assert_eq!(
            held.received_at,
            Millis(5_000),
            "the cap counts from the receive"
        );
        let too_long = HandleAction::ChangeVisibility {
            timeout_ms: 12 * HOUR_MS,
            cap_ms: 12 * HOUR_MS,
        };
        let (_, refused) = handle_op(&record, handle, too_long);
        assert_eq!(
            refused.answer,
            Some(HandleAnswer::Visibility(VisibilityAnswer::ExceedsCap))
        );
    }

    fn dead_letter_key() -> RecordKey {
        RecordKey {
            queue: QueueName::try_from("jobs-dlq".to_string()).unwrap(),
            ..key()
        }
    }

    /// A dead-letter copy (generation 1) received once, its claim's deadline at `deadline`.
    fn received_copy(deadline: u64) -> Record {
        let source = SourceQueue {
            name: key().queue,
            incarnation: key().incarnation,
        };
        let mut copy = dead_letter_copy(&sent(), source, Millis(2_000));
        if let Body::Live(live) = &mut copy.body {
            live.held = Some(Held {
                claim: Claim {
                    seq: 1,
                    coordinator: NodeId(2),
                    nonce: 9,
                },
                change_counter: 0,
                deadline: Millis(deadline),
                received_at: Millis(2_500),
            });
            live.receive_count = 4;
            live.first_received_at = Some(Millis(2_500));
        }
        copy
    }

    #[test]
    fn a_redrive_copies_first_and_conditions_the_tombstone_on_the_claim_read() {
        let held = received_copy(3_000);
        let (mut op, effects) = RedriveOp::start(
            (dead_letter_key(), R),
            Some((key(), R)),
            Millis(5_000),
            None,
        );
        assert!(effects.sends.iter().all(|out| out.request == Request::Read));
        assert_eq!(
            op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())))
                .answer,
            None
        );
        let copy = op.on_reply(R[1], 1, &Reply::Record(Some(held.clone())));
        let Request::Write { write, ack: true } = &copy.sends[0].request else {
            panic!("the copy is an awaited write, got {:?}", copy.sends);
        };
        let Write::Merge(copied) = write.as_ref() else {
            panic!("the copy is a merge");
        };
        assert_eq!(copy.sends[0].key, key());
        assert_eq!(copied.generation, Generation(2));
        let live = copied.live().unwrap();
        assert_eq!(
            (live.receive_count, live.held, live.first_received_at),
            (0, None, None)
        );
        assert_eq!(live.birth.source_queue, None);
        assert_eq!(live.entered_at, Millis(5_000));
        assert_eq!(live.birth.payload, b"job");
        // Nothing touches the dead-letter copy before the copy has two acks.
        assert_eq!(op.on_reply(R[0], 2, &Reply::Ack).answer, None);
        let tombstone = op.on_reply(R[1], 2, &Reply::Ack);
        assert_eq!(tombstone.sends.len(), 3);
        assert_eq!(tombstone.sends[0].key, dead_letter_key());
        let Request::Write { write, .. } = &tombstone.sends[0].request else {
            panic!("a tombstone write");
        };
        assert_eq!(
            write.as_ref(),
            &Write::Tombstone {
                generation: Generation(1),
                expect: held.claim(),
                tombstone: Tombstone {
                    reason: TombstoneReason::Moved,
                    at: Millis(5_000),
                },
            }
        );
        assert_eq!(op.on_reply(R[0], 3, &Reply::Ack).answer, None);
        assert_eq!(
            op.on_reply(R[2], 3, &Reply::Ack).answer,
            Some(RedriveAnswer::Moved)
        );
    }

    #[test]
    fn a_copy_the_dead_letter_queues_watermark_hides_is_not_sent_back() {
        let held = received_copy(3_000);
        let entered = held.live().unwrap().entered_at;
        let (mut op, _) = RedriveOp::start(
            (dead_letter_key(), R),
            Some((key(), R)),
            Millis(5_000),
            Some(entered),
        );
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        let effects = op.on_reply(R[1], 1, &Reply::Record(Some(held.clone())));
        assert_eq!(effects.answer, Some(RedriveAnswer::NotMovable));
        assert!(effects.sends.is_empty(), "nothing copied");
        // Entered after the watermark: movable.
        let (mut op, _) = RedriveOp::start(
            (dead_letter_key(), R),
            None,
            Millis(5_000),
            Some(Millis(entered.0 - 1)),
        );
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        let read = op.on_reply(R[1], 1, &Reply::Record(Some(held)));
        assert!(matches!(read.answer, Some(RedriveAnswer::Movable(_))));
    }

    #[test]
    fn a_redrive_without_a_target_answers_the_read_and_goes_on_from_it() {
        let held = received_copy(3_000);
        let (mut op, _) = RedriveOp::start((dead_letter_key(), R), None, Millis(5_000), None);
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        let read = op.on_reply(R[1], 1, &Reply::Record(Some(held.clone())));
        assert!(
            read.sends.is_empty(),
            "nothing written before a target is named"
        );
        let Some(RedriveAnswer::Movable(record)) = read.answer else {
            panic!("the read answers the movable copy, got {:?}", read.answer);
        };
        assert_eq!(
            record
                .live()
                .unwrap()
                .birth
                .source_queue
                .as_ref()
                .unwrap()
                .name,
            key().queue
        );
        let (mut op, effects) =
            RedriveOp::copy((dead_letter_key(), R), (key(), R), &record, Millis(5_000));
        assert_eq!(effects.sends.len(), 3);
        assert_eq!(effects.sends[0].key, key());
        op.on_reply(R[0], 1, &Reply::Ack);
        let tombstone = op.on_reply(R[1], 1, &Reply::Ack);
        let Request::Write { write, .. } = &tombstone.sends[0].request else {
            panic!("a tombstone write");
        };
        assert!(matches!(
            write.as_ref(),
            Write::Tombstone { generation: Generation(1), expect, .. } if *expect == held.claim()
        ));
        op.on_reply(R[1], 2, &Reply::Ack);
        assert_eq!(
            op.on_reply(R[2], 2, &Reply::Ack).answer,
            Some(RedriveAnswer::Moved)
        );
    }

    #[test]
    fn a_redrive_leaves_a_copy_whose_claim_is_current_and_reports_a_lost_tombstone() {
        let (mut op, _) = RedriveOp::start(
            (dead_letter_key(), R),
            Some((key(), R)),
            Millis(5_000),
            None,
        );
        let held = received_copy(9_000);
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        let effects = op.on_reply(R[1], 1, &Reply::Record(Some(held)));
        assert_eq!(effects.answer, Some(RedriveAnswer::NotMovable));
        assert!(effects.sends.is_empty(), "nothing written");
        // A copy claimed again between the read and the tombstone: in both queues.
        let (mut op, _) = RedriveOp::start(
            (dead_letter_key(), R),
            Some((key(), R)),
            Millis(5_000),
            None,
        );
        let held = received_copy(3_000);
        op.on_reply(R[0], 1, &Reply::Record(Some(held.clone())));
        op.on_reply(R[1], 1, &Reply::Record(Some(held)));
        op.on_reply(R[0], 2, &Reply::Ack);
        op.on_reply(R[1], 2, &Reply::Ack);
        op.on_reply(R[0], 3, &Reply::Refused);
        assert_eq!(
            op.on_reply(R[1], 3, &Reply::Refused).answer,
            Some(RedriveAnswer::CopiedOnly)
        );
        // No read quorum: nothing written, unavailable.
        let (mut op, _) = RedriveOp::start(
            (dead_letter_key(), R),
            Some((key(), R)),
            Millis(5_000),
            None,
        );
        assert_eq!(op.on_timeout().answer, Some(RedriveAnswer::Unavailable));
    }

    #[test]
    fn a_move_tombstones_the_source_only_after_the_copy_is_durable() {
        let mut record = sent();
        if let Body::Live(live) = &mut record.body {
            live.receive_count = 3;
        }
        let target = [NodeId(4), NodeId(5), NodeId(6)];
        let source_queue = SourceQueue {
            name: trireme_core::QueueName::try_from("jobs".to_string()).unwrap(),
            incarnation: trireme_core::Incarnation::local(trireme_core::Millis(1)),
        };
        let (mut op, effects) = MoveOp::start(
            (key(), R),
            (
                RecordKey {
                    queue: QueueName::try_from("jobs-dlq".to_string()).unwrap(),
                    ..key()
                },
                target,
            ),
            &record,
            source_queue.clone(),
            Millis(50),
        );
        assert!(effects.sends.iter().all(|out| target.contains(&out.to)));
        let Request::Write { write, .. } = &effects.sends[0].request else {
            panic!("the copy first");
        };
        let Write::Merge(copy) = write.as_ref() else {
            panic!("the copy first");
        };
        assert_eq!(copy.generation, Generation(1));
        let live = copy.live().unwrap();
        assert_eq!(live.receive_count, 3);
        assert_eq!(live.birth.source_queue, Some(Box::new(source_queue)));
        assert_eq!(
            live.birth.sent_at,
            Millis(1_000),
            "retention keeps the original send"
        );
        assert!(
            op.on_reply(R[0], 1, &Reply::Ack).sends.is_empty(),
            "a source ack means nothing yet"
        );
        op.on_reply(target[0], 1, &Reply::Ack);
        let tombstones = op.on_reply(target[1], 1, &Reply::Ack).sends;
        assert!(tombstones.iter().all(|out| R.contains(&out.to)));
        op.on_reply(R[0], 2, &Reply::Ack);
        assert_eq!(
            op.on_reply(R[1], 2, &Reply::Ack).answer,
            Some(MoveAnswer::Moved)
        );
    }

    #[test]
    fn two_movers_write_copies_that_merge_into_one() {
        let mut record = sent();
        if let Body::Live(live) = &mut record.body {
            live.receive_count = 3;
        }
        let source_queue = SourceQueue {
            name: trireme_core::QueueName::try_from("jobs".to_string()).unwrap(),
            incarnation: trireme_core::Incarnation::local(trireme_core::Millis(1)),
        };
        let first = dead_letter_copy(&record, source_queue.clone(), Millis(50));
        let second = dead_letter_copy(&record, source_queue, Millis(40));
        // The latest stamp wins (spec/replication.md §2: the earliest loses a redrive across
        // a purge).
        let joined = first
            .merge(&second)
            .expect("the copies agree on every once-field");
        assert_eq!(joined, second.merge(&first).unwrap());
        assert_eq!(joined.live().unwrap().entered_at, Millis(50));
    }

    #[test]
    fn collection_needs_the_same_tombstone_on_all_three() {
        let tombstone = Record::tombstone(Generation(0), TombstoneReason::Deleted, Millis(9));
        let (mut op, _) = CollectOp::start(key(), R, Millis(100));
        op.on_reply(R[0], 1, &Reply::Record(Some(tombstone.clone())));
        assert_eq!(
            op.on_reply(R[1], 1, &Reply::Record(Some(tombstone.clone())))
                .answer,
            None
        );
        assert_eq!(
            op.on_reply(R[2], 1, &Reply::Record(Some(tombstone))).answer,
            Some(CollectAnswer::Confirmed {
                generation: Generation(0),
                confirmed_at: Millis(100)
            })
        );
        let (mut partial, _) = CollectOp::start(key(), R, Millis(100));
        partial.on_reply(R[0], 1, &Reply::Record(None));
        partial.on_reply(R[1], 1, &Reply::Record(None));
        assert_eq!(
            partial
                .on_reply(R[2], 1, &Reply::Record(Some(sent())))
                .answer,
            Some(CollectAnswer::NotYet)
        );
    }

    #[test]
    fn a_dead_letter_copy_leaves_the_source_queues_purge_mark_behind() {
        // Live again in the source: a later mover's copy entered above the sweep's mark, and a
        // mover whose clock reads less than that mark moves it on.
        let mut source = sent();
        if let Body::Live(live) = &mut source.body {
            live.entered_at = Millis(5_000);
            live.hidden_through = Some(Millis(4_000));
        }
        assert!(!source.hidden(None));
        let copy = dead_letter_copy(
            &source,
            SourceQueue {
                name: QueueName::try_from("jobs".to_string()).unwrap(),
                incarnation: Incarnation::local(Millis(1)),
            },
            Millis(3_900),
        );
        assert_eq!(copy.live().unwrap().hidden_through, None);
        assert!(!copy.hidden(None), "the dead-letter queue was never purged");
    }

    #[test]
    fn collection_takes_a_marked_record_on_all_three_and_not_a_live_one() {
        let mut marked = sent();
        if let Body::Live(live) = &mut marked.body {
            live.hidden_through = Some(live.entered_at);
        }
        let (mut op, _) = CollectOp::start(key(), R, Millis(100));
        for replica in &R[..2] {
            op.on_reply(*replica, 1, &Reply::Record(Some(marked.clone())));
        }
        assert_eq!(
            op.on_reply(R[2], 1, &Reply::Record(Some(marked))).answer,
            Some(CollectAnswer::Confirmed {
                generation: Generation(0),
                confirmed_at: Millis(100)
            })
        );
        let (mut live, _) = CollectOp::start(key(), R, Millis(100));
        for replica in R {
            let answer = live
                .on_reply(replica, 1, &Reply::Record(Some(sent())))
                .answer;
            assert!(answer.is_none() || answer == Some(CollectAnswer::NotYet));
        }
    }

    #[test]
    fn a_late_ack_of_the_copy_is_not_an_ack_of_the_tombstone() {
        let mut record = sent();
        if let Body::Live(live) = &mut record.body {
            live.receive_count = 3;
        }
        let source_queue = SourceQueue {
            name: QueueName::try_from("jobs".to_string()).unwrap(),
            incarnation: Incarnation::local(Millis(1)),
        };
        // Three nodes: the dead-letter copy lives on the same replicas as the source.
        let (mut op, _) = MoveOp::start((key(), R), (key(), R), &record, source_queue, Millis(5));
        op.on_reply(R[0], 1, &Reply::Ack);
        assert!(
            !op.on_reply(R[1], 1, &Reply::Ack).sends.is_empty(),
            "tombstones go out"
        );
        op.on_reply(R[0], 2, &Reply::Ack);
        assert_eq!(
            op.on_reply(R[2], 1, &Reply::Ack).answer,
            None,
            "a copy ack, late"
        );
        assert_eq!(
            op.on_reply(R[1], 2, &Reply::Ack).answer,
            Some(MoveAnswer::Moved)
        );
    }
}
