//! The model of spec/replication.md part 2, sections 2 (purge) and 3 (retention expiry): a
//! compact protocol of its own, checked exhaustively with stateright.
//!
//! Two messages of one queue live on three replicas, which also hold the queue's purge
//! watermark; two coordinators send, redrive into the queue, purge, receive and delete over a
//! network that delivers in any order and, within a fault budget, drops and duplicates. Time is
//! a global tick that every node reads through its own clock, one node's clock one tick ahead
//! (`SKEW_TICKS`), so the purge's clock margins and the retention's early expiry are in the
//! search. Claims, deletes and tombstones follow part 1 in a reduced form; what part 1 already
//! proves (receive counts, dead-letter moves, collection, replacement) is left out. With
//! `Config::claim_without_read` a receive claims from its coordinator's own replica's record
//! without the read (spec/replication.md §13), and its quorum read of the watermark runs beside
//! the claim, so that the fast path is checked against the purge. Ghost fields record what
//! clients were told, so that the invariants can be stated; the protocol never reads them.
//! Nothing here is used by the node.

use stateright::{Model, Property};

use super::net::{bit, count, push_sorted};
use super::record::Claim;

/// Replicas of every record (the queue's watermark and both messages share them: three nodes).
pub const REPLICAS: usize = 3;
/// Coordinators; coordinator `c` runs on the node of replica `c`, and reads that node's clock.
pub const COORDINATORS: usize = 2;
/// Acks a write needs before the coordinator answers its client.
pub const WRITE_QUORUM: usize = 2;
/// Replies a read needs before the coordinator decides.
pub const READ_QUORUM: usize = 2;
/// `SKEW_MAX` in ticks: no two clocks differ by more.
pub const SKEW_TICKS: u8 = 1;
/// How far each node's clock runs ahead of the global tick. Node 0 (replica 0, coordinator 0)
/// is fast, the others exact, so every pair of a fast and an exact clock is in the search, in
/// both roles of every operation.
pub const CLOCK_AHEAD: [u8; REPLICAS] = [1, 0, 0];
/// The largest and the smallest clock offset (the fastest and the slowest clock).
const AHEAD_MAX: u8 = 1;
const AHEAD_MIN: u8 = 0;
const _: () = assert!(AHEAD_MAX - AHEAD_MIN <= SKEW_TICKS);
/// The messages: one a client sends, one a redrive brings back from the dead-letter queue.
pub const MESSAGES: usize = 2;
/// The message a client sends (generation 0; sent and entered at the sender's clock).
pub const SENT: usize = 0;
/// The message a redrive brings in (generation 1; sent at tick 0, entered at the redriver's
/// clock). Its life in the dead-letter queue is part 1's and is not modelled.
pub const REDRIVEN: usize = 1;
/// Bitmask with one bit per coordinator.
pub const ALL_COORDINATORS: u8 = 0b11;
/// Purges one run may start (ghost bookkeeping is sized for this many).
pub const PURGES_MAX: usize = 2;
/// Steps the heal schedule may take before it is declared stuck (a liveness failure).
pub const HEAL_STEPS_MAX: u32 = 1_000;

// ----- the record -------------------------------------------------------------------------------

/// When the message was sent and when this generation entered this queue
/// (spec/replication.md#2-purge, #3-retention-expiry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stamps {
    /// `sent_at_ms`: the original send, written once and copied by every move and redrive;
    /// retention counts from it.
    pub sent_at: u8,
    /// `entered_at_ms`: the clock of the writer that brought this generation into this queue
    /// (send, move or redrive). Two movers of one generation may stamp it differently; the
    /// merge keeps the latest. The purge watermark is compared with it.
    pub entered_at: u8,
}

/// A message's record on one replica (`None` in a store: never written, or collected).
///
/// Within a generation every field is a join of its own: `entered_at` and `hidden_through`
/// by max, the claim by max, the tombstone by or. Whether the record is in the queue is
/// derived from them (`is_live`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    pub generation: u8,
    pub stamps: Stamps,
    /// The newest receive (part 1's claim, without receive counts).
    pub claim: Option<Claim>,
    /// The purge mark: the greatest watermark a sweep found hiding this record. It hides the
    /// generation only while `entered_at` is at or below it, so a later mover's copy of the
    /// same generation, entered above it, is live again (spec#2-purge, "purge mark").
    pub hidden_through: Option<u8>,
    /// Deleted or expired: dominates every copy of the generation.
    pub tombstone: bool,
}

impl Record {
    fn live(generation: u8, stamps: Stamps) -> Record {
        Record {
            generation,
            stamps,
            claim: None,
            hidden_through: None,
            tombstone: false,
        }
    }

    /// The tombstone of this record's generation.
    fn tombstone(self) -> Record {
        Record {
            tombstone: true,
            ..self
        }
    }

    /// The copy with `claim` as its newest receive.
    fn claimed(self, claim: Claim) -> Record {
        Record {
            claim: Some(claim),
            ..self
        }
    }

    /// In the queue: not a tombstone, and not hidden by its own purge mark.
    fn is_live(&self) -> bool {
        !self.tombstone && !self.hidden_by(self.hidden_through, false)
    }

    /// Whether a purge watermark hides this record: what entered the queue at or before the
    /// watermark is gone (spec/replication.md#2-purge).
    fn hidden_by(&self, watermark: Option<u8>, compare_sent: bool) -> bool {
        let entered = if compare_sent {
            self.stamps.sent_at
        } else {
            self.stamps.entered_at
        };
        watermark.is_some_and(|w| entered <= w)
    }

    /// Whether the record's retention has ended by a clock that reads `clock`: decided from the
    /// record itself, so every node applies the same deadline (spec/replication.md#3).
    fn expired_at(&self, retention: Option<u8>, clock: u8, from_entry: bool) -> bool {
        let start = if from_entry {
            self.stamps.entered_at
        } else {
            self.stamps.sent_at
        };
        retention.is_some_and(|r| start + r <= clock)
    }
}

/// The join of what a replica holds and what arrives: a later generation wins whole; within a
/// generation each field joins on its own. `entered_earliest` is the planted rule that keeps
/// the earliest `entered_at` instead of the latest.
fn merge(held: Option<Record>, incoming: Record, entered_earliest: bool) -> Record {
    let Some(held) = held else {
        return incoming;
    };
    if held.generation != incoming.generation {
        return if held.generation > incoming.generation {
            held
        } else {
            incoming
        };
    }
    assert_eq!(
        held.stamps.sent_at, incoming.stamps.sent_at,
        "sent_at is written once per message"
    );
    let entered_at = if entered_earliest {
        held.stamps.entered_at.min(incoming.stamps.entered_at)
    } else {
        held.stamps.entered_at.max(incoming.stamps.entered_at)
    };
    Record {
        generation: held.generation,
        stamps: Stamps {
            sent_at: held.stamps.sent_at,
            entered_at,
        },
        claim: held.claim.max(incoming.claim),
        hidden_through: held.hidden_through.max(incoming.hidden_through),
        tombstone: held.tombstone || incoming.tombstone,
    }
}

fn join_all(
    records: impl IntoIterator<Item = Option<Record>>,
    entered_earliest: bool,
) -> Option<Record> {
    records.into_iter().flatten().fold(None, |held, incoming| {
        Some(merge(held, incoming, entered_earliest))
    })
}

// ----- configuration ----------------------------------------------------------------------------

/// A protocol rule switched off on purpose, to show the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// Sweeps and receives compare the watermark with `sent_at` instead of `entered_at`.
    WatermarkComparesSentTime,
    /// `entered_at` merges by the earliest writer's stamp instead of the latest.
    EnteredAtEarliest,
    /// A sweep turns a hidden record into a tombstone of its generation instead of marking it.
    PurgeWritesTombstone,
    /// A replica keeps the watermark it received last instead of the greater one.
    WatermarkLastWriter,
    /// The purge is acknowledged after one replica stored the watermark.
    PurgeAckedAfterOne,
    /// The purge is acknowledged at its write quorum, without waiting out the clock margin.
    PurgeAckedAtOnce,
    /// The watermark is the purger's clock, without the `SKEW_MAX` margin.
    WatermarkWithoutMargin,
    /// A replica's sweep drops whatever is past retention (live copy or tombstone) outright.
    SweepDropsExpired,
    /// The receive trusts the replicas' sweeps and does not check retention itself.
    ReceiveSkipsExpiryCheck,
    /// A replica's sweep expires a record one tick before its clock says so: further ahead than
    /// any clock within `SKEW_MAX` can be.
    SweepExpiresEarly,
    /// Retention counts from `entered_at` (restarting at a redrive) instead of `sent_at`.
    RetentionCountsFromEntry,
    /// Anti-entropy exchanges message records but not the watermark.
    AntiEntropySkipsWatermark,
    /// Sweeps apply retention but never the watermark.
    SweepIgnoresWatermark,
    /// With `claim_without_read`: a claim without the read is delivered at its two acks,
    /// without waiting for the quorum read of the watermark that runs beside it.
    FastClaimDeliveredWithoutWatermark,
}

/// Where a search starts (each is a state the empty start reaches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// Nothing sent, nothing purged.
    Empty,
    /// The client's message sent at tick 0 through coordinator 1 and acknowledged by replicas 0
    /// and 1; the write to replica 2 is in flight, or was lost.
    Sent,
    /// A purge by coordinator 1 at tick 0 (watermark 1) took effect on replicas 0 and 1, its
    /// write to replica 2 still in flight, and timed out before its acknowledgement.
    PurgeLanded,
    /// Sent, received by coordinator 1 (replicas 0 and 1 hold its claim, replica 2 the claimed
    /// copy too) and deleted with that handle: replicas 0 and 1 hold the tombstone, replica 2
    /// still the live copy.
    Deleted,
    /// Sent, and received by coordinator 1 with the claim `(1, c1)`, delivered through replicas
    /// 0 and 2 (the send's write reached replica 2 late); the claim's write to replica 1,
    /// coordinator 1's own, is still in flight, so that replica is behind and a claim without
    /// the read from it is refused.
    Received,
}

/// Bounds and switches of one run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Printed with the run's figures.
    pub name: &'static str,
    /// The last tick the global time may reach.
    pub ticks_max: u8,
    /// The queue's retention period in ticks (`None`: longer than the run).
    pub retention: Option<u8>,
    /// Where the search starts.
    pub start: Start,
    /// Whether a client may send the message `SENT`.
    pub send: bool,
    /// Whether a redrive may bring the message `REDRIVEN` into the queue.
    pub redrive: bool,
    /// Redrives of `REDRIVEN` that may start (each writes generation 1 with its own stamp, as
    /// two movers of one dead-letter copy do).
    pub redrives_max: u8,
    /// Coordinators that may purge (bit per coordinator).
    pub purgers: u8,
    /// Coordinators that may send or redrive (bit per coordinator).
    pub enterers: u8,
    /// Coordinators that may receive and delete (bit per coordinator).
    pub receivers: u8,
    /// Purges started.
    pub purges_max: u8,
    /// The last tick at which a purge may start (time is relative: tick 0 is the first purge).
    pub purge_ticks_max: u8,
    /// Receives started after the starting point.
    pub claims_max: u8,
    /// Deletes started after the starting point.
    pub deletes_max: u8,
    /// Anti-entropy exchanges between two replicas.
    pub anti_entropy_max: u8,
    /// Drops and duplicates, together.
    pub faults_max: u8,
    /// Whether the free phase may end in the heal schedule (liveness).
    pub heal: bool,
    /// Whether a receive claims without its quorum read (spec/replication.md §13, *A claim
    /// without the read*): coordinator `c` reads replica `c`'s record in place and, if it is
    /// claimable by the watermark that replica holds and by `c`'s clock, sends the conditional
    /// claim at once beside a quorum read of the watermark; at a refusal that comes while no
    /// replica has acked the claim the receive takes the read path, and after an ack the claim
    /// is handled as a read-path claim (refusals ignored). Off in the page's section 2 and 3
    /// runs without the switch.
    pub claim_without_read: bool,
    /// The protocol rule switched off, if any (planted-bug tests only).
    pub bug: Option<Bug>,
}

impl Config {
    /// Everything off. Configurations start from here.
    pub fn quiet(name: &'static str) -> Config {
        Config {
            name,
            ticks_max: 0,
            retention: None,
            start: Start::Empty,
            send: false,
            redrive: false,
            redrives_max: 1,
            purgers: ALL_COORDINATORS,
            enterers: ALL_COORDINATORS,
            receivers: ALL_COORDINATORS,
            purges_max: 0,
            purge_ticks_max: 0,
            claims_max: 0,
            deletes_max: 0,
            anti_entropy_max: 0,
            faults_max: 0,
            heal: false,
            claim_without_read: false,
            bug: None,
        }
    }

    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    fn sweep_compares_sent(&self) -> bool {
        self.has(Bug::WatermarkComparesSentTime)
    }

    fn receive_compares_sent(&self) -> bool {
        self.has(Bug::WatermarkComparesSentTime)
    }

    fn entered_earliest(&self) -> bool {
        self.has(Bug::EnteredAtEarliest)
    }

    fn retention_from_entry(&self) -> bool {
        self.has(Bug::RetentionCountsFromEntry)
    }
}

// ----- state ------------------------------------------------------------------------------------

/// One replica's durable state (it fsyncs before it acks; crashes are left to part 1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// The queue's purge watermark (`None`: never purged), merged by max.
    pub watermark: Option<u8>,
    /// The records of the two messages.
    pub store: [Option<Record>; MESSAGES],
}

/// A receipt handle as its client holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    pub message: u8,
    pub generation: u8,
    pub claim: Claim,
}

/// Ghost: what had been acknowledged when a receive was invoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Snapshot {
    /// Purges acknowledged before the receive was invoked (bit per purge).
    pub purges_acked: u8,
    /// Whether the message's delete had been acknowledged.
    pub delete_acked: bool,
    /// The global tick at the invocation.
    pub invoked_at: u8,
}

/// One read reply: the replica's watermark and its record of the message asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reply {
    pub watermark: Option<u8>,
    pub record: Option<Record>,
}

/// What a coordinator is doing. Each phase waits for replies of its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Idle,
    /// Writing a message into the queue (a send or a redrive); `attempt` is ghost.
    Enter {
        message: u8,
        attempt: u8,
        acks: u8,
    },
    PurgeWrite {
        purge: u8,
        watermark: u8,
        acks: u8,
    },
    /// The watermark is on a write quorum; the purge waits until its clock passes the margin.
    PurgeWait {
        purge: u8,
        watermark: u8,
    },
    ClaimRead {
        message: u8,
        snapshot: Snapshot,
        replies: [Option<Reply>; REPLICAS],
    },
    ClaimWrite {
        message: u8,
        record: Record,
        snapshot: Snapshot,
        acks: u8,
    },
    /// A claim without the read (`claim_without_read`, spec/replication.md §13): the
    /// conditional claim of `record`, made from the coordinator's own replica's record, went to
    /// all three at once, beside a quorum read of the queue's watermark (`watermark_from`: the
    /// replicas that answered it; `watermark`: the greatest they hold). Delivered only once two
    /// replicas acked and the watermark is in and does not hide `record`. A refusal while
    /// `acks` is empty sends the receive down the read path; after an ack, refusals are ignored
    /// as for a read-path claim. `refused_after_ack`: ghost, the refusals of the claim by a
    /// replica that had not acked it, after another had and before the claim had two acks
    /// (`REFUSED_BY_COPY`, `REFUSED_BY_RIVAL`).
    FastClaim {
        message: u8,
        record: Record,
        snapshot: Snapshot,
        acks: u8,
        watermark_from: u8,
        watermark: Option<u8>,
        refused_after_ack: u8,
    },
    DeleteRead {
        handle: Handle,
        replies: [Option<Reply>; REPLICAS],
    },
    DeleteWrite {
        handle: Handle,
        acks: u8,
    },
}

impl Op {
    fn replies_mut(&mut self) -> Option<&mut [Option<Reply>; REPLICAS]> {
        match self {
            Op::ClaimRead { replies, .. } | Op::DeleteRead { replies, .. } => Some(replies),
            _ => None,
        }
    }

    fn acks_mut(&mut self) -> Option<&mut u8> {
        match self {
            Op::Enter { acks, .. }
            | Op::PurgeWrite { acks, .. }
            | Op::ClaimWrite { acks, .. }
            | Op::FastClaim { acks, .. }
            | Op::DeleteWrite { acks, .. } => Some(acks),
            _ => None,
        }
    }
}

/// A coordinator: one client operation at a time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    /// Tags requests; an answer for another round is ignored.
    pub round: u8,
    pub op: Op,
    /// The newest receipt handle its client holds.
    pub handle: Option<Handle>,
}

/// Requests on the network (answers reach the coordinator in the step that produced them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Request {
    Read {
        message: u8,
    },
    /// The quorum read of the queue's watermark alone, beside a claim without the read (the
    /// read path's `Read` answers with the watermark already).
    ReadWatermark,
    /// Merge `record` in and ack (sends, redrives, an "already gone" tombstone).
    Write {
        message: u8,
        record: Record,
    },
    /// Merge the watermark in and ack. `purge` is ghost: which purge wrote it.
    Watermark {
        watermark: u8,
        purge: u8,
    },
    /// Conditional claim: applied only over an older claim of the generation (part 1).
    Claim {
        message: u8,
        record: Record,
    },
    /// Conditional tombstone of a delete: applied only if no newer claim is held (part 1).
    Tombstone {
        message: u8,
        record: Record,
        expect: Claim,
    },
}

/// A request in flight to a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub replica: u8,
    pub coordinator: u8,
    pub round: u8,
    pub request: Request,
}

/// Ghost: one purge as its client saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PurgeGhost {
    /// Global tick at the invocation.
    pub invoked_at: u8,
    /// The first tick at which the correct protocol may acknowledge: from then on, every
    /// entry is stamped above the watermark whatever the clocks (spec#2-purge).
    pub safe_from: u8,
    /// Acknowledged to its client.
    pub acked: bool,
    /// Its watermark reached some replica (the purge took effect, acknowledged or not).
    pub landed: bool,
}

/// Ghost: one message's entry into the queue (its send or its redrive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Which redrive of the message this is (0 for a send): the ghost follows the latest.
    pub attempt: u8,
    pub generation: u8,
    pub stamps: Stamps,
    /// Global tick at the invocation of the send or redrive.
    pub invoked_at: u8,
    /// Purges invoked before this entry was invoked (bit per purge).
    pub purges_invoked_before: u8,
    /// Purges acknowledged before this entry was invoked (bit per purge).
    pub purges_acked_before: u8,
    /// The send or redrive was acknowledged.
    pub acked: bool,
}

/// Broken invariants, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A receive invoked after a purge was acknowledged delivered what entered before it.
    PurgedDelivered = 0,
    /// A receive invoked after a delete was acknowledged delivered the message.
    DeletedDelivered = 1,
    /// A receive invoked when every clock was past the message's retention delivered it.
    ExpiredDelivered = 2,
    HealStuck = 3,
}

/// Scenarios the checks require to be reached, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    PurgeAcked = 0,
    /// A sweep marked a record because the watermark hides it.
    HiddenSwept = 1,
    /// A message sent after a purge was acknowledged was delivered.
    SentAfterPurgeDelivered = 2,
    /// A message redriven after a purge was acknowledged was delivered.
    RedrivenAfterPurgeDelivered = 3,
    /// A receive under way when a purge was acknowledged delivered what the purge hides (the
    /// concurrent case the page allows).
    ConcurrentReceiveDeliveredPurged = 4,
    /// A sweep tombstoned a record because its retention ended by the replica's clock.
    ExpiredSwept = 5,
    /// A receive delivered a message that some replica had already expired (a slower clock).
    DeliveredAfterExpiryElsewhere = 6,
    /// A receive skipped a live record because the watermark it read hides it.
    ReceiveSkippedHidden = 7,
    /// A replica's purge-marked record became live again: a later mover's copy of the same
    /// generation entered above the mark.
    Revived = 8,
    /// A claim without the read was delivered.
    FastDelivered = 9,
    /// A claim without the read had its two acks, and the watermark read beside it hid the
    /// record: the receive delivered nothing, and the claim stays on the hidden record (an
    /// orphan).
    FastHidden = 10,
    /// A claim without the read was refused while no replica had acked it, and its receive
    /// took the read path.
    FastFellBack = 11,
    /// A claim without the read was refused by a replica that had not acked it after another
    /// replica had acked it, did not fall back, and was delivered at two acks and the
    /// watermark read.
    FastRefusedAfterAckDelivered = 12,
    /// The same, refused by a replica holding a rival of the claim (another claim of at least
    /// its `seq`, a tombstone or a later life), not the claim itself.
    FastRefusedByRivalAfterAckDelivered = 13,
}

/// Ghost bits of `Op::FastClaim::refused_after_ack`: the refusing replica held the claim itself.
pub const REFUSED_BY_COPY: u8 = 1;
/// The refusing replica held a rival of the claim: another claim of at least its `seq`, a
/// tombstone, or a later life.
pub const REFUSED_BY_RIVAL: u8 = 2;

/// What a receive makes of a record (spec#2-purge, "receive"; spec#3-retention-expiry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Judged {
    /// A tombstone, or hidden by its own purge mark.
    Gone,
    /// Hidden by the watermark the receive knows.
    Hidden,
    /// Past retention by the coordinator's clock.
    Expired,
    /// Claim it.
    Claim,
}

/// Ghost state: what clients were told, and what went wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    pub purges: [PurgeGhost; PURGES_MAX],
    pub entries: [Option<Entry>; MESSAGES],
    /// A delete's tombstone reached a replica (the delete took effect).
    pub deleted: [bool; MESSAGES],
    pub delete_acked: [bool; MESSAGES],
    /// Some receive delivered the message.
    pub delivered: [bool; MESSAGES],
    /// Some replica expired the message by its clock.
    pub expired_somewhere: [bool; MESSAGES],
    pub violations: u8,
    pub scenarios: u16,
}

impl Ghost {
    fn violate(&mut self, violation: Violation) {
        self.violations |= 1 << violation as u8;
    }

    fn reach(&mut self, scenario: Scenario) {
        self.scenarios |= 1 << scenario as u16;
    }

    /// Whether `violation` happened on the way to this state.
    pub fn violated(&self, violation: Violation) -> bool {
        self.violations & (1 << violation as u8) != 0
    }

    /// Whether `scenario` happened on the way to this state.
    pub fn reached(&self, scenario: Scenario) -> bool {
        self.scenarios & (1 << scenario as u16) != 0
    }
}

/// Budget spent so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Used {
    pub purges: u8,
    pub redrives: u8,
    pub claims: u8,
    pub deletes: u8,
    pub anti_entropy: u8,
    pub faults: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The global tick; node `n`'s clock reads `now + CLOCK_AHEAD[n]`.
    pub now: u8,
    pub replicas: [Replica; REPLICAS],
    pub coordinators: [Coordinator; COORDINATORS],
    /// A multiset, kept sorted so that equal states hash equal.
    pub network: Vec<Packet>,
    pub used: Used,
    pub ghost: Ghost,
    /// The heal schedule ran; nothing happens afterwards.
    pub healed: bool,
}

/// The stamps of the client's message sent at `clock`.
fn sent_stamps(clock: u8) -> Stamps {
    Stamps {
        sent_at: clock,
        entered_at: clock,
    }
}

impl State {
    /// The initial states of `config.start`.
    pub fn initial(config: &Config) -> Vec<State> {
        let replica = Replica {
            watermark: None,
            store: [None; MESSAGES],
        };
        let coordinator = Coordinator {
            round: 0,
            op: Op::Idle,
            handle: None,
        };
        let empty = State {
            now: 0,
            replicas: [replica.clone(), replica.clone(), replica],
            coordinators: [coordinator.clone(), coordinator],
            network: Vec::new(),
            used: Used::default(),
            ghost: Ghost::default(),
            healed: false,
        };
        if config.start == Start::Empty {
            return vec![empty];
        }
        if config.start == Start::PurgeLanded {
            let mut landed = empty;
            let watermark = CLOCK_AHEAD[1] + SKEW_TICKS;
            landed.replicas[0].watermark = Some(watermark);
            landed.replicas[1].watermark = Some(watermark);
            landed.network.push(Packet {
                replica: 2,
                coordinator: 0,
                round: 0,
                request: Request::Watermark {
                    watermark,
                    purge: 0,
                },
            });
            landed.used.purges = 1;
            landed.ghost.purges[0] = PurgeGhost {
                invoked_at: 0,
                safe_from: 2 * SKEW_TICKS + 1,
                acked: false,
                landed: true,
            };
            return vec![landed];
        }
        let stamps = sent_stamps(CLOCK_AHEAD[1]);
        let sent = Record::live(0, stamps);
        let mut acked = empty;
        acked.replicas[0].store[SENT] = Some(sent);
        acked.replicas[1].store[SENT] = Some(sent);
        acked.ghost.entries[SENT] = Some(Entry {
            attempt: 0,
            generation: 0,
            stamps,
            invoked_at: 0,
            purges_invoked_before: 0,
            purges_acked_before: 0,
            acked: true,
        });
        if config.start == Start::Sent {
            let mut in_flight = acked.clone();
            in_flight.network.push(Packet {
                replica: 2,
                coordinator: 0,
                round: 0,
                request: Request::Write {
                    message: SENT as u8,
                    record: sent,
                },
            });
            return vec![in_flight, acked];
        }
        let claim = Claim {
            seq: 1,
            coordinator: 1,
        };
        let claimed = sent.claimed(claim);
        if config.start == Start::Received {
            let mut received = acked;
            received.replicas[0].store[SENT] = Some(claimed);
            received.replicas[2].store[SENT] = Some(claimed);
            received.network.push(Packet {
                replica: 1,
                coordinator: 0,
                round: 0,
                request: Request::Claim {
                    message: SENT as u8,
                    record: claimed,
                },
            });
            received.coordinators[1].handle = Some(Handle {
                message: SENT as u8,
                generation: 0,
                claim,
            });
            received.ghost.delivered[SENT] = true;
            return vec![received];
        }
        let mut deleted = acked;
        deleted.replicas[0].store[SENT] = Some(claimed.tombstone());
        deleted.replicas[1].store[SENT] = Some(claimed.tombstone());
        deleted.replicas[2].store[SENT] = Some(claimed);
        deleted.ghost.delivered[SENT] = true;
        deleted.ghost.deleted[SENT] = true;
        deleted.ghost.delete_acked[SENT] = true;
        vec![deleted]
    }

    /// Node `n`'s clock.
    pub fn clock(&self, node: usize) -> u8 {
        self.now + CLOCK_AHEAD[node]
    }

    /// The join of every replica's record of `message`, under this run's merge.
    pub fn joined(&self, config: &Config, message: usize) -> Option<Record> {
        join_all(
            self.replicas.iter().map(|r| r.store[message]),
            config.entered_earliest(),
        )
    }

    /// The greatest watermark any replica holds.
    pub fn joined_watermark(&self) -> Option<u8> {
        self.replicas.iter().filter_map(|r| r.watermark).max()
    }

    fn push(&mut self, packet: Packet) {
        push_sorted(&mut self.network, packet);
    }

    fn broadcast(&mut self, coordinator: usize, request: Request) {
        let round = self.coordinators[coordinator].round;
        for replica in 0..REPLICAS {
            self.push(Packet {
                replica: replica as u8,
                coordinator: coordinator as u8,
                round,
                request,
            });
        }
    }

    fn begin(&mut self, coordinator: usize, op: Op) {
        let c = &mut self.coordinators[coordinator];
        c.round += 1;
        c.op = op;
    }

    fn finish(&mut self, coordinator: usize) {
        self.coordinators[coordinator].op = Op::Idle;
    }

    fn purge_mask(&self, acked_only: bool) -> u8 {
        (0..self.used.purges as usize)
            .filter(|p| !acked_only || self.ghost.purges[*p].acked)
            .fold(0, |mask, p| mask | bit(p))
    }

    // ----- operations ---------------------------------------------------------------------------

    /// A client sends `SENT`, or a redrive brings `REDRIVEN` in, through `coordinator`: the
    /// stamps are the coordinator's clock (spec#2-purge, "entered_at").
    pub fn start_enter(&mut self, coordinator: usize, message: usize) {
        let clock = self.clock(coordinator);
        let (generation, stamps) = if message == SENT {
            (0, sent_stamps(clock))
        } else {
            (
                1,
                Stamps {
                    sent_at: 0,
                    entered_at: clock,
                },
            )
        };
        let attempt = if message == SENT {
            0
        } else {
            self.used.redrives
        };
        self.ghost.entries[message] = Some(Entry {
            attempt,
            generation,
            stamps,
            invoked_at: self.now,
            purges_invoked_before: self.purge_mask(false),
            purges_acked_before: self.purge_mask(true),
            acked: false,
        });
        self.begin(
            coordinator,
            Op::Enter {
                message: message as u8,
                attempt,
                acks: 0,
            },
        );
        self.broadcast(
            coordinator,
            Request::Write {
                message: message as u8,
                record: Record::live(generation, stamps),
            },
        );
    }

    /// A client purges the queue through `coordinator` (spec#2-purge, steps 1–2).
    pub fn start_purge(&mut self, config: &Config, coordinator: usize) {
        let purge = self.used.purges;
        self.used.purges += 1;
        let margin = if config.has(Bug::WatermarkWithoutMargin) {
            0
        } else {
            SKEW_TICKS
        };
        let watermark = self.clock(coordinator) + margin;
        self.ghost.purges[purge as usize] = PurgeGhost {
            invoked_at: self.now,
            safe_from: self.now + 2 * SKEW_TICKS + 1,
            acked: false,
            landed: false,
        };
        self.begin(
            coordinator,
            Op::PurgeWrite {
                purge,
                watermark,
                acks: 0,
            },
        );
        self.broadcast(coordinator, Request::Watermark { watermark, purge });
    }

    /// A client receives `message` through `coordinator`: the quorum read of records and
    /// watermark (spec#2-purge, "receive"), or with `claim_without_read` the claim from the
    /// coordinator's own replica's record when that record is claimable.
    pub fn start_claim(&mut self, config: &Config, coordinator: usize, message: usize) {
        self.used.claims += 1;
        let snapshot = Snapshot {
            purges_acked: self.purge_mask(true),
            delete_acked: self.ghost.delete_acked[message],
            invoked_at: self.now,
        };
        if config.claim_without_read
            && self.claim_from_local(config, coordinator, message, snapshot)
        {
            return;
        }
        self.claim_read(coordinator, message, snapshot);
    }

    /// The quorum read of a receive invoked with the ghost `snapshot` (spec#2-purge,
    /// "receive"; one read answers both the record and the watermark).
    fn claim_read(&mut self, coordinator: usize, message: usize, snapshot: Snapshot) {
        self.begin(
            coordinator,
            Op::ClaimRead {
                message: message as u8,
                snapshot,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(
            coordinator,
            Request::Read {
                message: message as u8,
            },
        );
    }

    /// The claim without the read (spec/replication.md §13, *A claim without the read*): the
    /// coordinator's own replica (replica `coordinator`, on its node, with no crashes in this
    /// model) is read in place, and if its record is claimable as the read path would judge it,
    /// under the watermark that replica holds (the coordinator's local knowledge, a lower bound
    /// of the queue's) and by the coordinator's clock, the conditional claim `(seq + 1, me)` goes
    /// to all three at once, and the quorum read of the watermark beside it, as the node runs
    /// both in parallel. Returns `false`, sending nothing, when the record is not claimable: the
    /// replica may be behind, so the read path decides. There are no deadlines here (part 1,
    /// Time): a claimed record may have expired, so it is claimed again, as after a read.
    fn claim_from_local(
        &mut self,
        config: &Config,
        coordinator: usize,
        message: usize,
        snapshot: Snapshot,
    ) -> bool {
        let local = &self.replicas[coordinator];
        let Some(held) = local.store[message] else {
            return false;
        };
        if self.judge(config, coordinator, held, local.watermark) != Judged::Claim {
            return false;
        }
        let claim = Claim {
            seq: held.claim.map_or(0, |claim| claim.seq) + 1,
            coordinator: coordinator as u8,
        };
        let record = held.claimed(claim);
        self.begin(
            coordinator,
            Op::FastClaim {
                message: message as u8,
                record,
                snapshot,
                acks: 0,
                watermark_from: 0,
                watermark: None,
                refused_after_ack: 0,
            },
        );
        self.broadcast(
            coordinator,
            Request::Claim {
                message: message as u8,
                record,
            },
        );
        self.broadcast(coordinator, Request::ReadWatermark);
        true
    }

    /// What a receive through `c` makes of `record` under `watermark`, the greatest it knows:
    /// the record's own purge mark hides it too, and retention is judged by `c`'s clock,
    /// whatever the replicas' sweeps have done so far.
    fn judge(&self, config: &Config, c: usize, record: Record, watermark: Option<u8>) -> Judged {
        if !record.is_live() {
            return Judged::Gone;
        }
        let hiding = watermark.max(record.hidden_through);
        if record.hidden_by(hiding, config.receive_compares_sent()) {
            return Judged::Hidden;
        }
        let expired = record.expired_at(
            config.retention,
            self.clock(c),
            config.retention_from_entry(),
        );
        if expired && !config.has(Bug::ReceiveSkipsExpiryCheck) {
            return Judged::Expired;
        }
        Judged::Claim
    }

    /// `coordinator`'s client deletes with the newest handle it holds (part 1, Delete).
    pub fn start_delete(&mut self, coordinator: usize) {
        let handle = self.coordinators[coordinator]
            .handle
            .expect("delete is enabled only with a handle");
        self.used.deletes += 1;
        self.begin(
            coordinator,
            Op::DeleteRead {
                handle,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(
            coordinator,
            Request::Read {
                message: handle.message,
            },
        );
    }

    /// The coordinator timed out or crashed: its client learns nothing more.
    pub fn abandon(&mut self, coordinator: usize) {
        self.finish(coordinator);
    }

    /// Whether `coordinator` is in a phase whose timeout leaves an unknown outcome.
    pub fn writing(&self, coordinator: usize) -> bool {
        let mut op = self.coordinators[coordinator].op;
        op.acks_mut().is_some() || matches!(op, Op::PurgeWait { .. })
    }

    /// Whether a later tick could change anything: some clock reading is still to come (an
    /// entry's stamps, a purge's watermark or acknowledgement, a retention not yet over by
    /// every clock). Ticking when none is lets equal situations differ only by the time.
    pub fn time_matters(&self, config: &Config) -> bool {
        let entry_to_come = (config.send && self.ghost.entries[SENT].is_none())
            || (config.redrive && self.used.redrives < config.redrives_max);
        let purge_to_come =
            self.used.purges < config.purges_max && self.now < config.purge_ticks_max;
        let purge_waiting = self
            .coordinators
            .iter()
            .any(|c| matches!(c.op, Op::PurgeWrite { .. } | Op::PurgeWait { .. }));
        let retention_running = config.retention.is_some_and(|retention| {
            entry_to_come
                || self.ghost.entries.iter().flatten().any(|entry| {
                    self.now + AHEAD_MIN
                        < entry.stamps.entered_at.max(entry.stamps.sent_at) + retention
                })
        });
        entry_to_come || purge_to_come || purge_waiting || retention_running
    }

    /// The global tick advances; a purge whose clock margin has now passed is acknowledged.
    pub fn tick(&mut self, config: &Config) {
        self.now += 1;
        for c in 0..COORDINATORS {
            if let Op::PurgeWait { purge, watermark } = self.coordinators[c].op {
                self.try_ack_purge(config, c, purge, watermark);
            }
        }
    }

    /// Acknowledges the purge if its clock is past `watermark + SKEW_MAX` (spec#2-purge, step
    /// 3), else waits in `PurgeWait`.
    fn try_ack_purge(&mut self, config: &Config, c: usize, purge: u8, watermark: u8) {
        let due = config.has(Bug::PurgeAckedAtOnce) || self.clock(c) > watermark + SKEW_TICKS;
        if due {
            self.ghost.purges[purge as usize].acked = true;
            self.ghost.reach(Scenario::PurgeAcked);
            self.finish(c);
        } else {
            self.coordinators[c].op = Op::PurgeWait { purge, watermark };
        }
    }

    // ----- replicas -----------------------------------------------------------------------------

    fn store(&mut self, r: usize, message: usize, record: Option<Record>) {
        self.replicas[r].store[message] = record;
    }

    fn merge_into(&mut self, config: &Config, r: usize, message: usize, incoming: Record) {
        let held = self.replicas[r].store[message];
        let merged = merge(held, incoming, config.entered_earliest());
        let marked =
            held.is_some_and(|h| h.generation == merged.generation && !h.tombstone && !h.is_live());
        if marked && merged.is_live() {
            self.ghost.reach(Scenario::Revived);
        }
        self.store(r, message, Some(merged));
    }

    fn merge_watermark(&mut self, config: &Config, r: usize, incoming: u8) {
        let held = &mut self.replicas[r].watermark;
        *held = if config.has(Bug::WatermarkLastWriter) {
            Some(incoming)
        } else {
            Some(held.map_or(incoming, |w| w.max(incoming)))
        };
    }

    /// What replica `r`'s sweep would make of its record of `message`: a live record hidden
    /// by its watermark gets the purge mark (spec#2-purge, "sweep"); a live record past
    /// retention by its clock becomes the tombstone of its generation (spec#3-retention-expiry).
    /// `None` if nothing changes.
    pub fn sweep_result(&self, config: &Config, r: usize, message: usize) -> Option<Sweep> {
        let record = self.replicas[r].store[message]?;
        let clock = if config.has(Bug::SweepExpiresEarly) {
            self.clock(r) + 1
        } else {
            self.clock(r)
        };
        let expired = record.expired_at(config.retention, clock, config.retention_from_entry());
        if config.has(Bug::SweepDropsExpired) && expired {
            return Some(Sweep::Drop);
        }
        if !record.is_live() {
            return None;
        }
        let hidden = !config.has(Bug::SweepIgnoresWatermark)
            && record.hidden_by(self.replicas[r].watermark, config.sweep_compares_sent());
        if hidden {
            Some(Sweep::Hidden)
        } else if expired {
            Some(Sweep::Expired)
        } else {
            None
        }
    }

    /// Replica `r` sweeps its records.
    pub fn sweep(&mut self, config: &Config, r: usize) {
        for message in 0..MESSAGES {
            self.sweep_one(config, r, message);
        }
    }

    fn sweep_one(&mut self, config: &Config, r: usize, message: usize) {
        let Some(sweep) = self.sweep_result(config, r, message) else {
            return;
        };
        let record = self.replicas[r].store[message].expect("a sweep has a record");
        match sweep {
            Sweep::Drop => self.store(r, message, None),
            Sweep::Hidden => {
                self.ghost.reach(Scenario::HiddenSwept);
                let swept = if config.has(Bug::PurgeWritesTombstone) {
                    record.tombstone()
                } else {
                    Record {
                        hidden_through: record.hidden_through.max(self.replicas[r].watermark),
                        ..record
                    }
                };
                self.store(r, message, Some(swept));
            }
            Sweep::Expired => {
                self.ghost.reach(Scenario::ExpiredSwept);
                self.store(r, message, Some(record.tombstone()));
            }
        }
        if matches!(sweep, Sweep::Drop | Sweep::Expired) {
            self.ghost.expired_somewhere[message] = true;
        }
    }

    /// Replicas `a` and `b` exchange their records and watermarks; both keep the merge.
    pub fn anti_entropy(&mut self, config: &Config, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            for message in 0..MESSAGES {
                if let Some(record) = self.replicas[from].store[message] {
                    self.merge_into(config, to, message, record);
                }
            }
            if !config.has(Bug::AntiEntropySkipsWatermark)
                && let Some(w) = self.replicas[from].watermark
            {
                self.merge_watermark(config, to, w);
            }
        }
    }

    /// Whether an exchange between `a` and `b` would change anything.
    pub fn anti_entropy_useful(&self, config: &Config, a: usize, b: usize) -> bool {
        let mut after = self.clone();
        after.anti_entropy(config, a, b);
        after.replicas[a] != self.replicas[a] || after.replicas[b] != self.replicas[b]
    }

    /// Delivers the packet at `index` to its replica; the answer reaches the coordinator.
    pub fn deliver(&mut self, config: &Config, index: usize) {
        let packet = self.network.remove(index);
        let r = packet.replica as usize;
        match packet.request {
            Request::Read { message } => {
                let reply = Reply {
                    watermark: self.replicas[r].watermark,
                    record: self.replicas[r].store[message as usize],
                };
                self.on_read_reply(config, &packet, reply);
            }
            Request::ReadWatermark => {
                let watermark = self.replicas[r].watermark;
                self.on_watermark_reply(config, &packet, watermark);
            }
            Request::Write { message, record } => {
                self.merge_into(config, r, message as usize, record);
                self.on_ack(config, &packet);
            }
            Request::Watermark { watermark, purge } => {
                self.ghost.purges[purge as usize].landed = true;
                self.merge_watermark(config, r, watermark);
                self.on_ack(config, &packet);
            }
            Request::Claim { message, record } => {
                let held = self.replicas[r].store[message as usize];
                let claim = record.claim.expect("a claim request carries a claim");
                // Compare-and-set on the version (part 1, Receive 5).
                let accept = match held {
                    None => true,
                    Some(held) => match held.generation.cmp(&record.generation) {
                        std::cmp::Ordering::Greater => false,
                        std::cmp::Ordering::Less => true,
                        std::cmp::Ordering::Equal => {
                            !held.tombstone && held.claim.map_or(0, |c| c.seq) < claim.seq
                        }
                    },
                };
                // With `claim_without_read` every claim is checked for (a) and (b) above, and
                // for (c) and (d) of spec/replication.md §13, which accept everything here:
                // time is abstract for visibility (part 1, Time), so every claim may have
                // expired by any clock, and this model has no receive counts.
                if accept {
                    self.merge_into(config, r, message as usize, record);
                    self.on_ack(config, &packet);
                } else if config.claim_without_read {
                    self.on_claim_refused(&packet);
                }
            }
            Request::Tombstone {
                message,
                record,
                expect,
            } => {
                let held = self.replicas[r].store[message as usize];
                // Applied only if no claim of a later version than the handle's is held (part 1,
                // Delete 4: a handle is valid by its version).
                let accept = match held {
                    None => true,
                    Some(held) => match held.generation.cmp(&record.generation) {
                        std::cmp::Ordering::Greater => false,
                        std::cmp::Ordering::Less => true,
                        std::cmp::Ordering::Equal => {
                            held.tombstone || held.claim.map(|c| c.seq) <= Some(expect.seq)
                        }
                    },
                };
                if accept {
                    if held.is_none_or(|h| !h.tombstone || h.generation < record.generation) {
                        self.ghost.deleted[message as usize] = true;
                    }
                    self.merge_into(config, r, message as usize, record);
                    self.on_ack(config, &packet);
                }
            }
        }
    }

    // ----- coordinators -------------------------------------------------------------------------

    fn current(&self, packet: &Packet) -> bool {
        self.coordinators[packet.coordinator as usize].round == packet.round
    }

    fn on_read_reply(&mut self, config: &Config, packet: &Packet, reply: Reply) {
        if !self.current(packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let mut op = self.coordinators[c].op;
        let Some(replies) = op.replies_mut() else {
            return;
        };
        replies[packet.replica as usize] = Some(reply);
        let have = replies.iter().flatten().count();
        self.coordinators[c].op = op;
        if have >= READ_QUORUM {
            self.decide(config, c);
        }
    }

    /// A replica's answer to the watermark read of a claim without the read. The read's
    /// watermark is the greatest of its first two replies; a third adds nothing, as in the node.
    fn on_watermark_reply(&mut self, config: &Config, packet: &Packet, reply: Option<u8>) {
        if !self.current(packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let Op::FastClaim {
            watermark_from,
            watermark,
            ..
        } = &mut self.coordinators[c].op
        else {
            return;
        };
        if count(*watermark_from) >= READ_QUORUM {
            return;
        }
        *watermark_from |= bit(packet.replica as usize);
        *watermark = (*watermark).max(reply);
        self.finish_fast(config, c);
    }

    /// A replica refused a claim (with `claim_without_read`, every refusal is answered). A
    /// claim without the read that no replica has acked gives up and its receive takes the read
    /// path, with the same ghost snapshot: it is the same receive (spec §13, *A claim without
    /// the read*). Once a replica has acked it, the claim is handled as a read-path claim, which
    /// waits for its acks and ignores refusals (it ends by `Abandon` if they never come); this
    /// subsumes "one reply per replica" (a replica that acked and refuses a duplicate) and a
    /// refusal after the claim's two acks, while it waits only for the watermark.
    fn on_claim_refused(&mut self, packet: &Packet) {
        if !self.current(packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let Op::FastClaim {
            message,
            record,
            snapshot,
            acks,
            ..
        } = self.coordinators[c].op
        else {
            return;
        };
        if acks == 0 {
            self.ghost.reach(Scenario::FastFellBack);
            self.claim_read(c, message as usize, snapshot);
        } else if acks & bit(packet.replica as usize) == 0 && count(acks) < WRITE_QUORUM {
            // Ghost only: a replica that had not acked refused after another acked, holding
            // the claim itself (brought by anti-entropy; or, claims having no nonce here, an
            // earlier claim of the same coordinator and `seq`) or a rival.
            let held = self.replicas[packet.replica as usize].store[message as usize];
            let by = if held.is_some_and(|h| {
                h.generation == record.generation && !h.tombstone && h.claim == record.claim
            }) {
                REFUSED_BY_COPY
            } else {
                REFUSED_BY_RIVAL
            };
            if let Op::FastClaim {
                refused_after_ack, ..
            } = &mut self.coordinators[c].op
            {
                *refused_after_ack |= by;
            }
        }
    }

    /// Answers a claim without the read once both of its rounds are in: two acks and the
    /// watermark read (spec §13, *The purge watermark*). A record the watermark hides answers
    /// nothing, and its claim stays on the replicas that took it, an orphan on a hidden record
    /// that, like a losing claim, makes nothing visible.
    fn finish_fast(&mut self, config: &Config, c: usize) {
        let Op::FastClaim {
            message,
            record,
            snapshot,
            acks,
            watermark_from,
            watermark,
            refused_after_ack,
        } = self.coordinators[c].op
        else {
            unreachable!("finish_fast is called only for a claim without the read")
        };
        if count(acks) < WRITE_QUORUM {
            return;
        }
        if !config.has(Bug::FastClaimDeliveredWithoutWatermark) {
            if count(watermark_from) < READ_QUORUM {
                return;
            }
            if record.hidden_by(watermark, config.receive_compares_sent()) {
                self.ghost.reach(Scenario::FastHidden);
                self.finish(c);
                return;
            }
        }
        self.ghost.reach(Scenario::FastDelivered);
        if refused_after_ack != 0 {
            self.ghost.reach(Scenario::FastRefusedAfterAckDelivered);
        }
        if refused_after_ack & REFUSED_BY_RIVAL != 0 {
            self.ghost
                .reach(Scenario::FastRefusedByRivalAfterAckDelivered);
        }
        self.deliver_claim(config, c, message, record, snapshot);
    }

    fn on_ack(&mut self, config: &Config, packet: &Packet) {
        if !self.current(packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let mut op = self.coordinators[c].op;
        let Some(acks) = op.acks_mut() else {
            return;
        };
        *acks |= bit(packet.replica as usize);
        let have = count(*acks);
        self.coordinators[c].op = op;
        let needed = if matches!(op, Op::PurgeWrite { .. }) && config.has(Bug::PurgeAckedAfterOne) {
            1
        } else {
            WRITE_QUORUM
        };
        if have >= needed {
            self.complete_write(config, c);
        }
    }

    /// A read phase has its quorum.
    fn decide(&mut self, config: &Config, c: usize) {
        match self.coordinators[c].op {
            Op::ClaimRead {
                message,
                snapshot,
                replies,
            } => {
                let merged = join_all(
                    replies.iter().flatten().map(|r| r.record),
                    config.entered_earliest(),
                );
                let watermark = replies.iter().flatten().filter_map(|r| r.watermark).max();
                let Some(merged) = merged else {
                    self.finish(c);
                    return;
                };
                // The coordinator applies the watermark it read by quorum and the retention
                // by its own clock, whatever the replicas' sweeps have done so far.
                match self.judge(config, c, merged, watermark) {
                    Judged::Claim => {}
                    judged => {
                        if judged == Judged::Hidden {
                            self.ghost.reach(Scenario::ReceiveSkippedHidden);
                        }
                        self.finish(c);
                        return;
                    }
                }
                // Time is abstract for visibility (part 1, Time): any claim may have expired.
                let claim = Claim {
                    seq: merged.claim.map_or(0, |claim| claim.seq) + 1,
                    coordinator: c as u8,
                };
                let record = merged.claimed(claim);
                self.begin(
                    c,
                    Op::ClaimWrite {
                        message,
                        record,
                        snapshot,
                        acks: 0,
                    },
                );
                self.broadcast(c, Request::Claim { message, record });
            }
            Op::DeleteRead { handle, replies } => {
                let merged = join_all(
                    replies.iter().flatten().map(|r| r.record),
                    config.entered_earliest(),
                );
                let message = handle.message;
                match merged {
                    Some(record) if record.generation == handle.generation && !record.is_live() => {
                        // Already gone (deleted, expired, or marked by a purge): make what
                        // was read durable on a quorum before answering success (part 1,
                        // Delete 2).
                        self.begin(c, Op::DeleteWrite { handle, acks: 0 });
                        self.broadcast(c, Request::Write { message, record });
                    }
                    Some(record)
                        if record.generation == handle.generation
                            && record.claim.map(|c| c.seq) == Some(handle.claim.seq) =>
                    {
                        self.begin(c, Op::DeleteWrite { handle, acks: 0 });
                        self.broadcast(
                            c,
                            Request::Tombstone {
                                message,
                                record: record.tombstone(),
                                expect: handle.claim,
                            },
                        );
                    }
                    _ => self.finish(c),
                }
            }
            _ => unreachable!("decide is called only in read phases"),
        }
    }

    /// A write phase has its quorum of acks.
    fn complete_write(&mut self, config: &Config, c: usize) {
        match self.coordinators[c].op {
            Op::Enter {
                message, attempt, ..
            } => {
                let entry = self.ghost.entries[message as usize]
                    .as_mut()
                    .expect("an entry was recorded when the write began");
                // The ghost follows the latest attempt; an earlier one's ack is not counted.
                if entry.attempt == attempt {
                    entry.acked = true;
                }
                self.finish(c);
            }
            Op::PurgeWrite {
                purge, watermark, ..
            } => self.try_ack_purge(config, c, purge, watermark),
            Op::ClaimWrite {
                message,
                record,
                snapshot,
                ..
            } => self.deliver_claim(config, c, message, record, snapshot),
            Op::FastClaim { .. } => self.finish_fast(config, c),
            Op::DeleteWrite { handle, .. } => {
                self.ghost.delete_acked[handle.message as usize] = true;
                self.finish(c);
            }
            _ => unreachable!("complete_write is called only in write phases"),
        }
    }

    /// The claim of `record` is delivered through `c`: its client holds the handle.
    fn deliver_claim(
        &mut self,
        config: &Config,
        c: usize,
        message: u8,
        record: Record,
        snapshot: Snapshot,
    ) {
        self.on_delivery(config, message as usize, snapshot);
        self.coordinators[c].handle = Some(Handle {
            message,
            generation: record.generation,
            claim: record.claim.expect("a claim write carries a claim"),
        });
        self.finish(c);
    }

    /// The coordinator hands `message` to its client: the ghost checks what had been
    /// acknowledged when that receive was invoked.
    fn on_delivery(&mut self, config: &Config, message: usize, snapshot: Snapshot) {
        let entry = self.ghost.entries[message].expect("a delivered message entered the queue");
        let purged_before = (0..PURGES_MAX).any(|p| {
            snapshot.purges_acked & bit(p) != 0 && entry.purges_invoked_before & bit(p) == 0
        });
        if purged_before {
            self.ghost.violate(Violation::PurgedDelivered);
        }
        let hidden_by_acked_purge = (0..self.used.purges as usize).any(|p| {
            self.ghost.purges[p].acked
                && snapshot.purges_acked & bit(p) == 0
                && entry.purges_invoked_before & bit(p) == 0
        });
        if hidden_by_acked_purge {
            self.ghost.reach(Scenario::ConcurrentReceiveDeliveredPurged);
        }
        if snapshot.delete_acked {
            self.ghost.violate(Violation::DeletedDelivered);
        }
        if let Some(retention) = config.retention
            && snapshot.invoked_at + AHEAD_MIN >= entry.stamps.sent_at + retention
        {
            self.ghost.violate(Violation::ExpiredDelivered);
        }
        if self.ghost.expired_somewhere[message] {
            self.ghost.reach(Scenario::DeliveredAfterExpiryElsewhere);
        }
        if self.protected(&entry).is_some_and(|after_ack| after_ack) {
            self.ghost.reach(if message == SENT {
                Scenario::SentAfterPurgeDelivered
            } else {
                Scenario::RedrivenAfterPurgeDelivered
            });
        }
        self.ghost.delivered[message] = true;
    }

    /// Ghost: whether every purge that took effect must spare `entry` (it was invoked after
    /// that purge was acknowledged, or once the purge's margin had passed), and if so whether
    /// some purge was acknowledged before it. `None`: some purge may legitimately hide it.
    fn protected(&self, entry: &Entry) -> Option<bool> {
        let mut after_ack = false;
        for p in 0..self.used.purges as usize {
            let purge = &self.ghost.purges[p];
            if !purge.landed {
                continue;
            }
            let acked_before = entry.purges_acked_before & bit(p) != 0;
            if !(acked_before || entry.invoked_at >= purge.safe_from) {
                return None;
            }
            after_ack |= acked_before;
        }
        Some(after_ack)
    }

    /// Ghost: whether losing `message` now is allowed: it was never acknowledged, a delete
    /// took effect, its retention may have ended by some clock, or a purge may hide it.
    pub fn loss_allowed(&self, config: &Config, message: usize) -> bool {
        let Some(entry) = self.ghost.entries[message] else {
            return true;
        };
        let expired_somewhere = config
            .retention
            .is_some_and(|r| self.now + AHEAD_MAX >= entry.stamps.sent_at + r);
        !entry.acked
            || self.ghost.deleted[message]
            || expired_somewhere
            || self.protected(&entry).is_none()
    }

    /// Whether the cluster still holds `message` live and unhidden in the generation its
    /// entry wrote.
    pub fn present(&self, config: &Config, message: usize) -> bool {
        let Some(entry) = self.ghost.entries[message] else {
            return false;
        };
        self.joined(config, message).is_some_and(|record| {
            record.generation == entry.generation
                && record.is_live()
                && !record.hidden_by(self.joined_watermark(), false)
        })
    }

    /// Removes packets that can change nothing (reads whose coordinator left that round, or
    /// whose watermark read has its quorum) and forgets rounds nobody answers any more, so that
    /// equal situations are equal states.
    pub fn normalize(&mut self) {
        let coordinators = self.coordinators.clone();
        self.network.retain(|p| {
            let coordinator = &coordinators[p.coordinator as usize];
            let mut op = coordinator.op;
            let current = coordinator.round == p.round;
            match p.request {
                Request::Read { .. } => current && op.replies_mut().is_some(),
                // A watermark read is alive while its claim without the read still waits for
                // its quorum.
                Request::ReadWatermark => {
                    current
                        && matches!(op, Op::FastClaim { watermark_from, .. }
                            if count(watermark_from) < READ_QUORUM)
                }
                _ => true,
            }
        });
        for packet in &mut self.network {
            let coordinator = &coordinators[packet.coordinator as usize];
            let current = !matches!(coordinator.op, Op::Idle) && packet.round == coordinator.round;
            if current {
                packet.round = 1;
            } else {
                packet.round = 0;
                packet.coordinator = 0;
            }
        }
        self.network.sort();
        for coordinator in &mut self.coordinators {
            coordinator.round = u8::from(!matches!(coordinator.op, Op::Idle));
        }
    }

    // ----- heal ---------------------------------------------------------------------------------

    /// Runs the heal schedule to its end: faults stop, packets in flight are delivered (or,
    /// with `deliver_pending = false`, were all lost), operations left waiting time out,
    /// anti-entropy and sweeps run until nothing changes, and a consumer (coordinator 0)
    /// receives and deletes each message. Time does not advance.
    pub fn heal(&mut self, config: &Config, deliver_pending: bool) {
        let mut steps = 0u32;
        if !deliver_pending {
            self.network.clear();
        }
        self.heal_network(config, &mut steps);
        self.heal_background(config, &mut steps);
        for message in 0..MESSAGES {
            if !self.joined(config, message).is_some_and(|r| r.is_live()) {
                continue;
            }
            self.start_claim(config, 0, message);
            self.heal_network(config, &mut steps);
            if let Some(handle) = self.coordinators[0].handle
                && handle.message as usize == message
                && self
                    .joined(config, message)
                    .and_then(|r| r.claim.map(|c| c.seq))
                    == Some(handle.claim.seq)
            {
                self.start_delete(0);
                self.heal_network(config, &mut steps);
            }
            self.heal_background(config, &mut steps);
        }
        if steps > HEAL_STEPS_MAX {
            self.ghost.violate(Violation::HealStuck);
        }
        self.normalize();
        self.healed = true;
    }

    fn heal_network(&mut self, config: &Config, steps: &mut u32) {
        while !self.network.is_empty() && *steps <= HEAL_STEPS_MAX {
            self.deliver(config, 0);
            *steps += 1;
        }
        for c in 0..COORDINATORS {
            if !matches!(self.coordinators[c].op, Op::Idle) {
                self.abandon(c);
            }
        }
    }

    fn heal_background(&mut self, config: &Config, steps: &mut u32) {
        loop {
            let mut changed = false;
            for a in 0..REPLICAS {
                for b in a + 1..REPLICAS {
                    if self.anti_entropy_useful(config, a, b) {
                        self.anti_entropy(config, a, b);
                        changed = true;
                        *steps += 1;
                    }
                }
            }
            for r in 0..REPLICAS {
                if (0..MESSAGES).any(|m| self.sweep_result(config, r, m).is_some()) {
                    self.sweep(config, r);
                    changed = true;
                    *steps += 1;
                }
            }
            if !changed || *steps > HEAL_STEPS_MAX {
                return;
            }
        }
    }
}

/// What a sweep does to one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// Marked: the watermark hides it.
    Hidden,
    /// Tombstoned: its retention ended by the replica's clock.
    Expired,
    /// Planted bug only: removed outright.
    Drop,
}

// ----- the model ----------------------------------------------------------------------------------

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Deliver the packet at this index of the (sorted) network.
    Deliver(u8),
    Drop(u8),
    Duplicate(u8),
    /// The global tick advances by one.
    Tick,
    /// A coordinator times out or crashes.
    Abandon(u8),
    /// A client sends `SENT` through this coordinator.
    Send(u8),
    /// A redrive brings `REDRIVEN` into the queue through this coordinator.
    Redrive(u8),
    Purge(u8),
    Claim {
        coordinator: u8,
        message: u8,
    },
    Delete(u8),
    /// A replica's sweep turns the records it may into tombstones.
    Sweep(u8),
    AntiEntropy {
        a: u8,
        b: u8,
    },
    Heal {
        deliver_pending: bool,
    },
}

/// The purge and retention model under one configuration.
#[derive(Clone, Debug)]
pub struct LifecycleModel {
    /// Bounds and planted bug of this run.
    pub config: Config,
}

impl LifecycleModel {
    /// The model of `config`.
    pub fn new(config: Config) -> LifecycleModel {
        assert!(config.purges_max as usize <= PURGES_MAX);
        LifecycleModel { config }
    }
}

impl Model for LifecycleModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        State::initial(&self.config)
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        let used = &state.used;
        if state.healed {
            return;
        }
        let fault = used.faults < config.faults_max;
        for (i, packet) in state.network.iter().enumerate() {
            if i > 0 && state.network[i - 1] == *packet {
                continue;
            }
            actions.push(Action::Deliver(i as u8));
            if fault {
                actions.push(Action::Drop(i as u8));
                actions.push(Action::Duplicate(i as u8));
            }
        }
        if state.now < config.ticks_max && state.time_matters(config) {
            actions.push(Action::Tick);
        }
        for c in 0..COORDINATORS {
            if !matches!(state.coordinators[c].op, Op::Idle) {
                if state.writing(c) {
                    actions.push(Action::Abandon(c as u8));
                }
                continue;
            }
            let c8 = c as u8;
            let enters = config.enterers & bit(c) != 0;
            let receives = config.receivers & bit(c) != 0;
            if enters && config.send && state.ghost.entries[SENT].is_none() {
                actions.push(Action::Send(c8));
            }
            if enters && config.redrive && used.redrives < config.redrives_max {
                actions.push(Action::Redrive(c8));
            }
            if config.purgers & bit(c) != 0
                && used.purges < config.purges_max
                && state.now <= config.purge_ticks_max
            {
                actions.push(Action::Purge(c8));
            }
            if receives && used.claims < config.claims_max {
                for message in 0..MESSAGES {
                    if state.ghost.entries[message].is_some() {
                        actions.push(Action::Claim {
                            coordinator: c8,
                            message: message as u8,
                        });
                    }
                }
            }
            if receives
                && used.deletes < config.deletes_max
                && state.coordinators[c].handle.is_some()
            {
                actions.push(Action::Delete(c8));
            }
        }
        for r in 0..REPLICAS {
            if (0..MESSAGES).any(|m| state.sweep_result(config, r, m).is_some()) {
                actions.push(Action::Sweep(r as u8));
            }
        }
        if used.anti_entropy < config.anti_entropy_max {
            for a in 0..REPLICAS {
                for b in a + 1..REPLICAS {
                    if state.anti_entropy_useful(config, a, b) {
                        actions.push(Action::AntiEntropy {
                            a: a as u8,
                            b: b as u8,
                        });
                    }
                }
            }
        }
        if config.heal {
            actions.push(Action::Heal {
                deliver_pending: true,
            });
            actions.push(Action::Heal {
                deliver_pending: false,
            });
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let config = &self.config;
        let mut state = last.clone();
        match action {
            Action::Deliver(i) => state.deliver(config, i as usize),
            Action::Drop(i) => {
                state.used.faults += 1;
                state.network.remove(i as usize);
            }
            Action::Duplicate(i) => {
                state.used.faults += 1;
                let packet = state.network[i as usize];
                state.push(packet);
            }
            Action::Tick => state.tick(config),
            Action::Abandon(c) => state.abandon(c as usize),
            Action::Send(c) => state.start_enter(c as usize, SENT),
            Action::Redrive(c) => {
                state.used.redrives += 1;
                state.start_enter(c as usize, REDRIVEN);
            }
            Action::Purge(c) => state.start_purge(config, c as usize),
            Action::Claim {
                coordinator,
                message,
            } => state.start_claim(config, coordinator as usize, message as usize),
            Action::Delete(c) => state.start_delete(c as usize),
            Action::Sweep(r) => state.sweep(config, r as usize),
            Action::AntiEntropy { a, b } => {
                state.used.anti_entropy += 1;
                state.anti_entropy(config, a as usize, b as usize);
            }
            Action::Heal { deliver_pending } => state.heal(config, deliver_pending),
        }
        state.normalize();
        Some(state)
    }

    fn within_boundary(&self, state: &State) -> bool {
        let (config, used) = (&self.config, &state.used);
        state.healed
            || (used.faults <= config.faults_max
                && used.purges <= config.purges_max
                && used.claims <= config.claims_max
                && used.deletes <= config.deletes_max
                && used.anti_entropy <= config.anti_entropy_max
                && used.redrives <= config.redrives_max)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "acknowledged send is never lost unless deleted, purged or expired",
                |model: &LifecycleModel, s: &State| {
                    (0..MESSAGES)
                        .all(|m| s.loss_allowed(&model.config, m) || s.present(&model.config, m))
                },
            ),
            Property::always(
                "receive after an acknowledged purge never delivers what entered before it",
                |_, s: &State| !s.ghost.violated(Violation::PurgedDelivered),
            ),
            Property::always(
                "receive after an acknowledged delete never delivers it",
                |_, s: &State| !s.ghost.violated(Violation::DeletedDelivered),
            ),
            Property::always(
                "receive after every clock passed the retention never delivers it",
                |_, s: &State| !s.ghost.violated(Violation::ExpiredDelivered),
            ),
            Property::always("after heal, replicas converge", |_, s: &State| {
                !s.healed || converged(s)
            }),
            Property::always(
                "after heal, nothing hidden or expired is still live",
                |model: &LifecycleModel, s: &State| !s.healed || swept(&model.config, s),
            ),
            Property::always(
                "after heal, every acknowledged send not deleted, purged or expired was delivered",
                |model: &LifecycleModel, s: &State| {
                    !s.healed
                        || (0..MESSAGES)
                            .all(|m| s.loss_allowed(&model.config, m) || s.ghost.delivered[m])
                },
            ),
            Property::sometimes("purge acknowledged", |_, s: &State| {
                s.ghost.reached(Scenario::PurgeAcked)
            }),
            Property::sometimes("sweep marks what a purge hides", |_, s: &State| {
                s.ghost.reached(Scenario::HiddenSwept)
            }),
            Property::sometimes("receive skips what the watermark hides", |_, s: &State| {
                s.ghost.reached(Scenario::ReceiveSkippedHidden)
            }),
            Property::sometimes(
                "message sent after an acknowledged purge delivered",
                |_, s: &State| s.ghost.reached(Scenario::SentAfterPurgeDelivered),
            ),
            Property::sometimes(
                "message redriven after an acknowledged purge delivered",
                |_, s: &State| s.ghost.reached(Scenario::RedrivenAfterPurgeDelivered),
            ),
            Property::sometimes(
                "receive under way when a purge was acknowledged delivers what it hides",
                |_, s: &State| s.ghost.reached(Scenario::ConcurrentReceiveDeliveredPurged),
            ),
            Property::sometimes(
                "later copy of a purged generation is live again",
                |_, s: &State| s.ghost.reached(Scenario::Revived),
            ),
            Property::sometimes("sweep tombstones an expired record", |_, s: &State| {
                s.ghost.reached(Scenario::ExpiredSwept)
            }),
            Property::sometimes(
                "slower clock delivers what a replica already expired",
                |_, s: &State| s.ghost.reached(Scenario::DeliveredAfterExpiryElsewhere),
            ),
            Property::sometimes("heal ran to its end", |_, s: &State| s.healed),
        ];
        if self.config.claim_without_read {
            properties.push(Property::sometimes(
                "claim without the read delivered",
                |_, s: &State| s.ghost.reached(Scenario::FastDelivered),
            ));
            properties.push(Property::sometimes(
                "claim without the read hidden by the watermark read beside it, its claim orphaned",
                |_, s: &State| s.ghost.reached(Scenario::FastHidden),
            ));
            properties.push(Property::sometimes(
                "claim without the read refused, fell back to the read",
                |_, s: &State| s.ghost.reached(Scenario::FastFellBack),
            ));
            properties.push(Property::sometimes(
                "claim without the read refused by one replica after another acked it, delivered",
                |_, s: &State| s.ghost.reached(Scenario::FastRefusedAfterAckDelivered),
            ));
            properties.push(Property::sometimes(
                "claim without the read refused by a rival after another replica acked it, delivered",
                |_, s: &State| s.ghost.reached(Scenario::FastRefusedByRivalAfterAckDelivered),
            ));
        }
        properties
    }
}

/// Nothing in flight, every replica holds the same records and watermark, and the heal
/// finished within its step cap.
fn converged(s: &State) -> bool {
    let first = &s.replicas[0];
    s.network.is_empty()
        && !s.ghost.violated(Violation::HealStuck)
        && s.replicas.iter().all(|r| r == first)
}

/// No replica holds a live record that its watermark hides or whose retention its clock has
/// passed, by the page's rules (whatever rule a planted bug gave the sweeps).
fn swept(config: &Config, s: &State) -> bool {
    s.replicas.iter().enumerate().all(|(r, replica)| {
        replica.store.iter().flatten().all(|record| {
            !record.is_live()
                || !(record.hidden_by(replica.watermark, false)
                    || record.expired_at(config.retention, s.clock(r), false))
        })
    })
}
