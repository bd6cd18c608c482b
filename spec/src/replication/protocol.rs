//! The replication protocol as a state machine over a lossy network (spec/replication.md).
//!
//! Three replicas hold one message's record in the source queue and in its dead-letter queue;
//! two coordinators run the operations of spec/replication.md#operations; the network is a
//! multiset that delivers in any order, drops and duplicates. Every step is a pure function of
//! the state. Ghost fields (`Ghost`) record what clients were told, so the invariants can be
//! stated; the protocol never reads them.

use super::net::{bit, count, push_sorted};
use super::record::{Body, Claim, MergeRules, Record, join_all};

/// Replicas of the message (the replication factor).
pub const REPLICAS: usize = 3;
/// Coordinators (each also plays the client that called it).
pub const COORDINATORS: usize = 2;
/// Acks a write needs before the coordinator answers its client.
pub const WRITE_QUORUM: usize = 2;
/// Replies a read needs before the coordinator decides.
pub const READ_QUORUM: usize = 2;
/// Bitmask with one bit per replica.
pub const ALL_REPLICAS: u8 = 0b111;
/// The coordinator whose ring position the model's one message starts at (the planted bug
/// `PreferHomeWithoutFallback` only).
pub const HOME_COORDINATOR: usize = 1;
/// Steps the heal schedule may take before it is declared stuck (a liveness failure).
pub const HEAL_STEPS_MAX: u32 = 2_000;

/// The queues of the model: the source queue and its dead-letter queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Queue {
    Source,
    DeadLetter,
}

impl Queue {
    /// Position of this queue's record in a replica's store.
    pub fn index(self) -> usize {
        match self {
            Queue::Source => 0,
            Queue::DeadLetter => 1,
        }
    }
}

/// A protocol rule switched off on purpose, to show the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// A received live copy outranks the tombstone of its generation in the merge.
    TombstoneNotDominant,
    /// Collection drops a tombstone after two replicas hold it instead of three.
    CollectAfterTwo,
    /// Collection drops whatever the replica holds, not only the confirmed tombstone.
    UnconditionalDrop,
    /// Delete sends its conditional tombstone without first reading a quorum.
    DeleteWithoutQuorumCheck,
    /// A claim is delivered at its first ack.
    DeliverBeforeQuorum,
    /// Reads decide on one reply.
    ReadQuorumOne,
    /// Receive counts merge by last writer instead of max.
    ReceiveCountLastWriter,
    /// A dead-letter move tombstones the source before the dead-letter copy is acknowledged.
    SourceTombstonedFirst,
    /// A coordinator may store a hint for a replica that did not ack and count it toward W.
    HintCountsTowardQuorum,
    /// A replacement replica serves reads and writes before merging from both peers.
    RebuildingReplicaServes,
    /// The disk of a replaced replica comes back with its old data.
    ReplacedDiskReturns,
    /// A replica that is down is replaced at once, before it has been away past the horizon.
    ReplaceBeforeHorizon,
    /// Packets older than the horizon are still accepted.
    NoPacketHorizon,
    /// Anti-entropy leaves tombstones out of what it exchanges.
    AntiEntropySkipsTombstones,
    /// A claim counts the receive about to happen toward `maxReceiveCount`, so the message moves
    /// one receive early (at the first receive when `maxReceiveCount` is 1).
    MoveOneReceiveEarly,
    /// A claimed copy never becomes visible again: receives skip it as if its visibility
    /// timeout had not expired, so a message whose consumer died is never received again.
    ClaimNeverExpires,
    /// Coordinators prefer the messages whose ring position starts at them (section 13) and
    /// have no fallback: only the message's home coordinator (`c1` in the model) ever claims
    /// it, so with its home away nobody receives it.
    PreferHomeWithoutFallback,
    /// Redrive takes only a dead-letter copy that was never received (part 1's first rule), so
    /// a copy received in the dead-letter queue whose claim expired is never redriven.
    RedriveOnlyUnclaimed,
    /// Redrive takes a received copy but conditions its tombstone on no claim, as for a copy
    /// never received: every replica holding the claim refuses it.
    RedriveExpectsUnclaimed,
    /// A replica applies a conditional tombstone to whatever generation it holds, not only to
    /// the generation named, so a late tombstone of an earlier life kills a later one.
    TombstoneIgnoresGeneration,
    /// Dead-letter-now moves whatever live copy its read finds, without checking that the
    /// merged current claim is the caller's handle.
    DeadLetterNowWithoutHandleCheck,
    /// A redrive tombstones the dead-letter copy before the source copy is acknowledged.
    DeadLetterTombstonedFirst,
    /// A handle is valid only if the merged claim is the handle's claim whole, coordinator
    /// included, and the replicas' conditional tombstones compare whole claims (the rule before
    /// spec/replication.md's F1): a claim that lost the race for the holder's version refuses the
    /// holder.
    HandleByWholeClaim,
    /// A delete answers `StaleReceiptHandle` ("nothing written") at the second replica that
    /// refuses its conditional tombstone, as the driver did before spec/replication.md's F3,
    /// although the third replica may take (or have taken) the tombstone.
    StaleAtTwoRefusals,
    /// With `claim_without_read` (spec/replication.md §13, *A claim without the read*): the
    /// replicas leave out their receive-count check (d) and accept a claim whatever count they
    /// hold. The coordinator still checks the count on its local record.
    ClaimWithoutReadNoCountCheck,
    /// With `claim_without_read`: the coordinator sends its claim whatever count its local
    /// record shows (no local check that the count is below `maxReceiveCount`); only the
    /// replicas check the count, each against its own record (d).
    ClaimWithoutReadNoLocalCountCheck,
    /// With `claim_without_read`: the claim without the read goes to all three replicas at
    /// once, the coordinator's own among them (spec/replication.md §13 before *Own replica
    /// last*). What it breaks needs deadlines (section 5's model, V1); here every claim may
    /// have expired, so it only changes when the own replica's copy arrives.
    FastClaimOwnReplicaFirst,
}

/// Bounds and switches of one model run (spec/replication.md#model-bounds).
#[derive(Clone, Debug)]
pub struct Config {
    /// Printed with the run's figures.
    pub name: &'static str,
    /// Whether the dead-letter queue, moves and redrive are in play.
    pub dead_letter: bool,
    /// Whether receives and deletes also serve the dead-letter queue (spec#7).
    pub dead_letter_claims: bool,
    /// Whether the heal schedule also redrives the dead-letter queue before it drains the
    /// source (liveness of redrive, spec#7).
    pub heal_redrives: bool,
    /// A claim that finds this many receives moves the message instead (with `dead_letter`).
    pub max_receive_count: u8,
    /// Where the search starts.
    pub start: Start,
    /// Drops, duplicates and replica crashes, together.
    pub faults_max: u8,
    /// Receives (claims) started after the starting point.
    pub claims_max: u8,
    /// Deletes started after the starting point.
    pub deletes_max: u8,
    /// Tombstone collections started.
    pub collects_max: u8,
    /// Redrives started.
    pub redrives_max: u8,
    /// Dead-letter-now requests started (spec#dead-letter-now-replicated).
    pub dead_letter_nows_max: u8,
    /// Times the clock may jump past the tombstone horizon.
    pub horizons_max: u8,
    /// Anti-entropy pushes (each merges one replica's records into another's).
    pub anti_entropy_max: u8,
    /// Replicas replaced by an empty one after being away past the horizon.
    pub replacements_max: u8,
    /// Whether the free phase may end in the heal schedule (liveness).
    pub heal: bool,
    /// Whether a receive claims without its quorum read (spec/replication.md §13, *A claim
    /// without the read*): the coordinator takes the record from its local replica (replica `c`
    /// for coordinator `c`), sends the conditional claim at once, and falls back to the read at
    /// a refusal that comes while no replica has acked the claim; after an ack it is a claim
    /// like a read-path claim, which ignores refusals. Off in every run of part 1's table.
    pub claim_without_read: bool,
    /// The protocol rule switched off, if any (planted-bug tests only).
    pub bug: Option<Bug>,
}

impl Config {
    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// The merge replicas use in this run.
    pub fn merge_rules(&self) -> MergeRules {
        MergeRules {
            tombstone_dominant: !self.has(Bug::TombstoneNotDominant),
            receive_count_by_max: !self.has(Bug::ReceiveCountLastWriter),
        }
    }

    fn read_quorum(&self) -> usize {
        if self.has(Bug::ReadQuorumOne) {
            1
        } else {
            READ_QUORUM
        }
    }

    fn deliver_quorum(&self) -> usize {
        if self.has(Bug::DeliverBeforeQuorum) {
            1
        } else {
            WRITE_QUORUM
        }
    }

    /// Whether a handle of `handle` is valid where the merged current claim is `current`
    /// (spec/replication.md#delete, step 4): same version, or under the planted bug the same
    /// claim whole. The generation is compared by the caller.
    fn holds(&self, current: Option<Claim>, handle: Claim) -> bool {
        if self.has(Bug::HandleByWholeClaim) {
            current == Some(handle)
        } else {
            version(current) == Some(handle.seq)
        }
    }

    /// A replica's condition for a conditional tombstone (spec/replication.md#delete, step 4):
    /// the claim it holds is no newer than `expect`, by version (or whole, under the planted bug).
    fn no_newer(&self, held: Option<Claim>, expect: Option<Claim>) -> bool {
        if self.has(Bug::HandleByWholeClaim) {
            held <= expect
        } else {
            version(held) <= version(expect)
        }
    }

    fn collect_quorum(&self) -> usize {
        if self.has(Bug::CollectAfterTwo) {
            2
        } else {
            REPLICAS
        }
    }
}

/// The version a claim names within its generation: its `seq` (spec/replication.md#the-record).
/// `None` (never received) is below every claim.
pub fn version(claim: Option<Claim>) -> Option<u8> {
    claim.map(|c| c.seq)
}

/// Where a search starts. Later starting points skip the steps before them, so a bound can be
/// spent on what follows; each is a state the earlier ones reach. The operations a starting
/// point has already done are not counted against the budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// Nothing sent.
    Empty,
    /// The send acknowledged by replicas 0 and 1; the write to replica 2 is in flight or lost.
    Sent,
    /// Sent, then received once by coordinator 1, whose claim replicas 0 and 1 acked (replica
    /// 2 holds the unclaimed copy, or the claim is still in flight to it).
    Received,
    /// Received by coordinator 1 and deleted with its handle: replicas 0 and 1 acked the
    /// tombstone; replica 2 still holds the claimed copy.
    Deleted,
    /// Received once and moved to the dead-letter queue (with `max_receive_count` 1): every
    /// replica holds the source's tombstone of generation 0 and the dead-letter copy of
    /// generation 1.
    Moved,
    /// Moved, then received in the dead-letter queue by coordinator 1, whose claim replicas 0
    /// and 1 acked; replica 2 holds the unclaimed dead-letter copy.
    DeadLetterReceived,
}

/// A receipt handle as the client holds it: the queue it was issued in, the generation (the
/// message's life there) and the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    pub queue: Queue,
    pub generation: u8,
    pub claim: Claim,
}

/// One replica's durable state. A replica fsyncs before it acks, so a crash loses nothing it
/// acknowledged; a write lost in the crash is indistinguishable from a dropped packet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Reachable: not crashed, not cut off.
    pub up: bool,
    /// Down while the clock passed the tombstone horizon: may be replaced.
    pub away_past_horizon: bool,
    /// Peers this replacement must still merge from; until then it answers nothing
    /// (spec/replication.md#stragglers-and-replacement).
    pub rebuilding: u8,
    /// Records by queue index.
    pub store: [Record; 2],
    /// The old disk of a replaced replica (kept only for the planted bug that lets it return).
    pub retired: Option<[Record; 2]>,
}

/// What a coordinator is doing. Each phase waits for replies tagged with its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Idle,
    Send {
        acks: u8,
    },
    /// `deletes_acked_before`: ghost, the generations whose delete had been acknowledged when
    /// this receive was invoked.
    ClaimRead {
        queue: Queue,
        deletes_acked_before: u8,
        replies: [Option<Record>; REPLICAS],
    },
    /// `fast`: sent without the read, from the local replica's record (`claim_without_read`);
    /// a refusal while no replica has acked it falls back to the read, and after an ack it is
    /// handled as a read-path claim (spec §13, *A claim without the read*).
    /// `refused_after_ack`: ghost, the refusals of a fast claim by a replica that had not acked
    /// it, after another replica had (`REFUSED_BY_COPY`, `REFUSED_BY_RIVAL`).
    ClaimWrite {
        queue: Queue,
        generation: u8,
        claim: Claim,
        receive_count: u8,
        deletes_acked_before: u8,
        acks: u8,
        fast: bool,
        refused_after_ack: u8,
    },
    DeleteRead {
        handle: Handle,
        stale_at_invocation: bool,
        replies: [Option<Record>; REPLICAS],
    },
    /// `conditional`: writing the tombstone under the handle; otherwise making an existing
    /// tombstone durable on a quorum before answering "already gone". `refused`: the replicas
    /// that refused the conditional tombstone (spec#delete, step 4).
    DeleteWrite {
        handle: Handle,
        stale_at_invocation: bool,
        conditional: bool,
        acks: u8,
        refused: u8,
    },
    /// The quorum read of a dead-letter-now with the caller's handle.
    NowRead {
        handle: Handle,
        stale_at_invocation: bool,
        replies: [Option<Record>; REPLICAS],
    },
    /// Writing the dead-letter copy (or, with the planted bug, after the source tombstone).
    MoveTarget {
        generation: u8,
        expect: Option<Claim>,
        receive_count: u8,
        cause: MoveCause,
        acks: u8,
    },
    /// Tombstoning the source copy.
    MoveSource {
        generation: u8,
        expect: Option<Claim>,
        receive_count: u8,
        cause: MoveCause,
        acks: u8,
    },
    RedriveRead {
        replies: [Option<Record>; REPLICAS],
    },
    /// Writing the redriven copy; `expect` is the dead-letter claim the read found.
    RedriveTarget {
        generation: u8,
        expect: Option<Claim>,
        acks: u8,
    },
    /// Tombstoning the dead-letter copy, conditioned on `expect`.
    RedriveSource {
        generation: u8,
        expect: Option<Claim>,
        acks: u8,
    },
    CollectRead {
        queue: Queue,
        replies: [Option<Record>; REPLICAS],
    },
    /// All replicas hold the tombstone; waiting for the horizon to pass before dropping.
    CollectWait {
        queue: Queue,
        generation: u8,
        confirmed_era: u8,
    },
}

impl Op {
    /// The replies gathered so far, in a read phase.
    fn replies_mut(&mut self) -> Option<&mut [Option<Record>; REPLICAS]> {
        match self {
            Op::ClaimRead { replies, .. }
            | Op::DeleteRead { replies, .. }
            | Op::NowRead { replies, .. }
            | Op::RedriveRead { replies }
            | Op::CollectRead { replies, .. } => Some(replies),
            _ => None,
        }
    }

    /// The replicas that acked so far, in a write phase.
    fn acks_mut(&mut self) -> Option<&mut u8> {
        match self {
            Op::Send { acks }
            | Op::ClaimWrite { acks, .. }
            | Op::DeleteWrite { acks, .. }
            | Op::MoveTarget { acks, .. }
            | Op::MoveSource { acks, .. }
            | Op::RedriveTarget { acks, .. }
            | Op::RedriveSource { acks, .. } => Some(acks),
            _ => None,
        }
    }
}

/// Why a message moves from the source to the dead-letter queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoveCause {
    /// A receive found the receive count at `maxReceiveCount` (spec#dead-letter-move).
    PastMax,
    /// The holder of the current handle asked for it (spec#dead-letter-now-replicated). Ghost:
    /// whether a receive acknowledged before the request superseded the handle.
    Now { stale_at_invocation: bool },
}

/// A node serving one client operation at a time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    /// Tags requests and replies; a reply of another round is ignored.
    pub round: u8,
    /// The operation in progress.
    pub op: Op,
    /// The newest receipt handle this coordinator's client holds.
    pub handle: Option<Handle>,
    /// Whether the current write phase already counted a hint (planted bug only).
    pub hinted: bool,
}

/// Messages on the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    Read {
        queue: Queue,
    },
    /// Merge `record` in; ack if asked (repairs are not acknowledged).
    Write {
        queue: Queue,
        record: Record,
        ack: bool,
    },
    /// Conditional claim of `queue`'s copy: applied only if the replica's claim is older.
    Claim {
        queue: Queue,
        generation: u8,
        claim: Claim,
        receive_count: u8,
    },
    /// Conditional tombstone: applied only if the replica's claim is no newer than `expect`.
    Tombstone {
        queue: Queue,
        generation: u8,
        expect: Option<Claim>,
        reason: Reason,
    },
    /// Conditional drop of a confirmed tombstone.
    Drop {
        queue: Queue,
        generation: u8,
    },
    ReadReply {
        record: Record,
    },
    Ack,
    /// A replica refused a conditional tombstone (it holds a newer claim, or a later life).
    Refused,
}

impl Message {
    fn is_request(self) -> bool {
        !matches!(
            self,
            Message::ReadReply { .. } | Message::Ack | Message::Refused
        )
    }
}

/// Why a tombstone is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// A client's delete. Ghost: whether its handle was superseded before it was invoked, and
    /// whether the delete was already answered `StaleReceiptHandle` (set on the packets still
    /// in flight when it was).
    Delete {
        stale_at_invocation: bool,
        answered_stale: bool,
    },
    /// The message moved to the other queue (dead-letter move or redrive).
    Move,
    /// Dead-letter-now. Ghost: whether its handle was superseded before it was invoked.
    Now { stale_at_invocation: bool },
}

/// A request in flight from a coordinator to a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub replica: u8,
    pub coordinator: u8,
    pub round: u8,
    /// What is asked.
    pub message: Message,
}

/// A delivery of a copy to a client (the generation names the life, and so the queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Delivery {
    pub generation: u8,
    pub claim: Claim,
    pub receive_count: u8,
}

/// Broken invariants, one bit each; `model.rs` checks each as an `always` property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A receive invoked after a delete of that generation was acknowledged delivered it.
    Resurrection = 0,
    StaleHandleTookEffect = 1,
    TwoDeliveriesOfOneVersion = 2,
    DeliveredWithoutQuorum = 3,
    ReceiveCountWentDown = 4,
    DroppedBeforeAllHeld = 5,
    MovedBeforeMax = 6,
    HealStuck = 7,
    /// S9: a delivered claim's holder was refused (its delete or dead-letter now answered
    /// superseded, or its conditional tombstone refused by a replica) where no claim of a
    /// greater `seq` of that generation was stored.
    HolderRefused = 8,
    /// A delete answered `StaleReceiptHandle` ("nothing written") whose conditional tombstone a
    /// replica took, before the answer or after it (spec#delete, step 4, F3).
    StaleDeleteWrote = 9,
    /// A receive of the source delivered a claim whose receive count is above
    /// `maxReceiveCount`: it should have moved the message instead (spec#receive-claim, step 4).
    DeliveredPastMax = 10,
}

/// Scenarios the issue requires the checker to reach, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    OrphanClaim = 0,
    RepairAfterAckedDelete = 1,
    AntiEntropyAfterAckedDelete = 2,
    RejoinWithOldCopies = 3,
    CollectedWhileAway = 4,
    Moved = 5,
    Redriven = 6,
    Replaced = 7,
    /// A receive already under way when a delete was acknowledged delivered afterwards (the
    /// concurrent case spec#considerations allows).
    DeliveredAfterConcurrentDelete = 8,
    /// A delete in the dead-letter queue was acknowledged.
    DeletedInDeadLetter = 9,
    /// A redrive finished with a copy that had been received in the dead-letter queue.
    RedrivenAfterReceive = 10,
    /// A replica refused a redrive's tombstone because it held a newer claim (a receive in the
    /// dead-letter queue raced the redrive).
    RedriveRefusedByNewerClaim = 11,
    /// A redrive finished although a claim newer than the one it read had been delivered (the
    /// allowed case of spec#7's considerations).
    RedriveOverNewerClaim = 12,
    /// A move's or redrive's tombstone reached a replica that already held a later life of the
    /// message in that queue (a move racing a redrive).
    LateTombstoneOfEarlierLife = 13,
    /// Dead-letter-now moved the message.
    MovedNow = 14,
    /// Dead-letter-now was refused because its handle had been superseded.
    NowRefused = 15,
    /// A delete was answered `StaleReceiptHandle` because all three replicas refused its
    /// conditional tombstone (spec#delete, step 4).
    DeleteStaleAtThreeRefusals = 16,
    /// A claim sent without the read (`claim_without_read`) was delivered.
    ClaimWithoutReadDelivered = 17,
    /// A claim sent without the read was refused by a replica while no replica had acked it,
    /// and the receive fell back to the quorum read.
    ClaimWithoutReadFellBack = 18,
    /// A claim sent without the read, held back from its coordinator's own replica, was sent
    /// there after another replica's ack, and the own replica took it (*Own replica last*).
    ClaimWithoutReadOwnLast = 19,
    /// A claim sent without the read was refused by a replica that had not acked it after
    /// another replica had acked it, did not fall back, and was delivered at two acks.
    ClaimWithoutReadRefusedAfterAckDelivered = 20,
    /// The same, refused by a replica holding a rival of the claim (another claim of at least
    /// its `seq`, a tombstone or a later life), not a copy of the claim itself.
    ClaimWithoutReadRefusedByRivalAfterAckDelivered = 21,
}

/// Ghost bits of `Op::ClaimWrite::refused_after_ack`: the refusing replica held a copy of the
/// claim itself (anti-entropy or read repair brought it there from a replica that acked).
pub const REFUSED_BY_COPY: u8 = 1;
/// The refusing replica held a rival of the claim: another claim of at least its `seq`, a
/// tombstone, or a later life.
pub const REFUSED_BY_RIVAL: u8 = 2;

/// What only the model knows: what clients were told, and what went wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The send was acknowledged to its client.
    pub sent_acked: bool,
    /// A delete's tombstone reached some replica (the delete took effect, acked or not).
    pub deleted: bool,
    /// Source generations whose delete was acknowledged (bitmask).
    pub deletes_acked: u8,
    /// Deliveries of the source copy, in order.
    pub deliveries: Vec<Delivery>,
    /// Per queue: the generation of the newest tombstone and the replicas that stored it.
    pub tombstone_holders: [(u8, u8); 2],
    /// Replicas that were down while a tombstone was dropped elsewhere.
    pub missed_collection: u8,
    /// Broken invariants (`Violation` bits).
    pub violations: u16,
    /// Scenarios reached (`Scenario` bits).
    pub scenarios: u32,
}

impl Ghost {
    fn violate(&mut self, violation: Violation) {
        self.violations |= 1 << violation as u16;
    }

    fn reach(&mut self, scenario: Scenario) {
        self.scenarios |= 1 << scenario as u32;
    }

    /// Whether `violation` happened on the way to this state.
    pub fn violated(&self, violation: Violation) -> bool {
        self.violations & (1 << violation as u16) != 0
    }

    /// Whether `scenario` happened on the way to this state.
    pub fn reached(&self, scenario: Scenario) -> bool {
        self.scenarios & (1 << scenario as u32) != 0
    }
}

/// Budget spent so far (the boundary compares it with `Config`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Used {
    pub faults: u8,
    pub sends: u8,
    pub claims: u8,
    pub deletes: u8,
    pub collects: u8,
    pub redrives: u8,
    pub dead_letter_nows: u8,
    pub horizons: u8,
    pub anti_entropy: u8,
    pub replacements: u8,
}

/// The whole system: replicas, coordinators, network, and the ghost.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub replicas: [Replica; REPLICAS],
    pub coordinators: [Coordinator; COORDINATORS],
    /// A multiset, kept sorted so equal states hash equal.
    pub network: Vec<Packet>,
    /// How many times the clock jumped past the tombstone horizon.
    pub era: u8,
    /// Budget spent (checked by the boundary).
    pub used: Used,
    /// What clients were told (never read by the protocol).
    pub ghost: Ghost,
    /// The heal schedule ran; nothing happens afterwards.
    pub healed: bool,
}

/// Why a replica's record changed (for the scenario flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    Request,
    Repair,
    AntiEntropy,
}

impl State {
    /// The initial states of `config.start`.
    pub fn initial(config: &Config) -> Vec<State> {
        let replica = Replica {
            up: true,
            away_past_horizon: false,
            rebuilding: 0,
            store: [Record::default(); 2],
            retired: None,
        };
        let coordinator = Coordinator {
            round: 0,
            op: Op::Idle,
            handle: None,
            hinted: false,
        };
        let empty = State {
            replicas: [replica.clone(), replica.clone(), replica],
            coordinators: [coordinator.clone(), coordinator],
            network: Vec::new(),
            era: 0,
            used: Used::default(),
            ghost: Ghost::default(),
            healed: false,
        };
        if config.start == Start::Empty {
            return vec![empty];
        }
        let sent = Record::ready(0, 0);
        let mut acked = empty;
        acked.replicas[0].store[Queue::Source.index()] = sent;
        acked.replicas[1].store[Queue::Source.index()] = sent;
        acked.used.sends = 1;
        acked.ghost.sent_acked = true;
        let repair_to_2 = |record| Packet {
            replica: 2,
            coordinator: 0,
            round: 0,
            message: Message::Write {
                queue: Queue::Source,
                record,
                ack: false,
            },
        };
        if config.start == Start::Sent {
            let mut in_flight = acked.clone();
            in_flight.push(repair_to_2(sent));
            return vec![in_flight, acked];
        }
        let claim = Claim {
            seq: 1,
            coordinator: 1,
        };
        let claimed = Record::claimed(0, claim, 1);
        let mut received = acked;
        received.replicas[0].store[Queue::Source.index()] = claimed;
        received.replicas[1].store[Queue::Source.index()] = claimed;
        received.replicas[2].store[Queue::Source.index()] = sent;
        received.coordinators[1].handle = Some(Handle {
            queue: Queue::Source,
            generation: 0,
            claim,
        });
        received.ghost.deliveries.push(Delivery {
            generation: 0,
            claim,
            receive_count: 1,
        });
        if config.start == Start::Received {
            let mut in_flight = received.clone();
            in_flight.push(repair_to_2(claimed));
            return vec![in_flight, received];
        }
        if matches!(config.start, Start::Moved | Start::DeadLetterReceived) {
            let mut moved = received;
            for r in 0..REPLICAS {
                moved.store(r, Queue::Source, Record::tombstone(0), Cause::Request);
                moved.replicas[r].store[Queue::DeadLetter.index()] = Record::ready(1, 1);
            }
            moved.ghost.reach(Scenario::Moved);
            if config.start == Start::Moved {
                return vec![moved];
            }
            let claim = Claim {
                seq: 1,
                coordinator: 1,
            };
            let claimed = Record::claimed(1, claim, 2);
            moved.replicas[0].store[Queue::DeadLetter.index()] = claimed;
            moved.replicas[1].store[Queue::DeadLetter.index()] = claimed;
            moved.coordinators[1].handle = Some(Handle {
                queue: Queue::DeadLetter,
                generation: 1,
                claim,
            });
            moved.ghost.deliveries.push(Delivery {
                generation: 1,
                claim,
                receive_count: 2,
            });
            return vec![moved];
        }
        let mut deleted = received;
        deleted.replicas[2].store[Queue::Source.index()] = claimed;
        for r in [0, 1] {
            deleted.store(r, Queue::Source, Record::tombstone(0), Cause::Request);
        }
        deleted.ghost.deleted = true;
        deleted.ghost.deletes_acked = 1;
        vec![deleted]
    }

    /// The join of every replica's record of `queue`: what the cluster knows.
    pub fn joined(&self, queue: Queue) -> Record {
        join_all(self.replicas.iter().map(|r| r.store[queue.index()]))
    }

    fn push(&mut self, packet: Packet) {
        push_sorted(&mut self.network, packet);
    }

    fn broadcast(&mut self, coordinator: usize, message: Message) {
        let round = self.coordinators[coordinator].round;
        for replica in 0..REPLICAS {
            self.push(Packet {
                replica: replica as u8,
                coordinator: coordinator as u8,
                round,
                message,
            });
        }
    }

    /// Starts a new request round for `coordinator` and enters `op`.
    fn begin(&mut self, coordinator: usize, op: Op) {
        let c = &mut self.coordinators[coordinator];
        c.round += 1;
        c.op = op;
        c.hinted = false;
    }

    fn finish(&mut self, coordinator: usize) {
        self.coordinators[coordinator].op = Op::Idle;
        self.coordinators[coordinator].hinted = false;
    }

    /// Stores `new` as replica `r`'s record of `queue`, keeping the ghost up to date.
    fn store(&mut self, r: usize, queue: Queue, new: Record, cause: Cause) {
        let old = self.replicas[r].store[queue.index()];
        if old == new {
            return;
        }
        if old.generation == new.generation
            && let (Some(before), Some(after)) = (old.receive_count(), new.receive_count())
            && after < before
        {
            self.ghost.violate(Violation::ReceiveCountWentDown);
        }
        if new.is_tombstone() {
            let holders = &mut self.ghost.tombstone_holders[queue.index()];
            if holders.0 != new.generation {
                *holders = (new.generation, 0);
            }
            holders.1 |= bit(r);
            if old.is_live()
                && old.generation == new.generation
                && self.ghost.deletes_acked & bit(new.generation as usize) != 0
            {
                match cause {
                    Cause::Repair => self.ghost.reach(Scenario::RepairAfterAckedDelete),
                    Cause::AntiEntropy => self.ghost.reach(Scenario::AntiEntropyAfterAckedDelete),
                    Cause::Request => {}
                }
            }
        }
        self.replicas[r].store[queue.index()] = new;
    }

    fn merge_into(
        &mut self,
        config: &Config,
        r: usize,
        queue: Queue,
        incoming: Record,
        cause: Cause,
    ) {
        let held = self.replicas[r].store[queue.index()];
        let merged = held.merge(incoming, config.merge_rules());
        self.store(r, queue, merged, cause);
    }

    // ----- operations started by coordinators -------------------------------------------------

    /// A client sends the message through `coordinator` (spec#send).
    pub fn start_send(&mut self, coordinator: usize) {
        self.used.sends += 1;
        self.begin(coordinator, Op::Send { acks: 0 });
        self.broadcast(
            coordinator,
            Message::Write {
                queue: Queue::Source,
                record: Record::ready(0, 0),
                ack: true,
            },
        );
    }

    /// A client receives from `queue` through `coordinator`: the quorum read of
    /// spec#receive-claim, or with `claim_without_read` the claim from the local record.
    pub fn start_claim(&mut self, config: &Config, coordinator: usize, queue: Queue) {
        self.used.claims += 1;
        let deletes_acked_before = self.ghost.deletes_acked;
        if config.claim_without_read
            && self.claim_from_local(config, coordinator, queue, deletes_acked_before)
        {
            return;
        }
        self.claim_read(coordinator, queue, deletes_acked_before);
    }

    /// The quorum read of a receive (spec#receive-claim, step 1).
    fn claim_read(&mut self, coordinator: usize, queue: Queue, deletes_acked_before: u8) {
        self.begin(
            coordinator,
            Op::ClaimRead {
                queue,
                deletes_acked_before,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(coordinator, Message::Read { queue });
    }

    /// The claim without the read (spec/replication.md §13, *A claim without the read*): the
    /// coordinator's own replica (replica `coordinator`) is read in place, without the network.
    /// If it is reachable, serving, live, and its receive count is below `maxReceiveCount`, the
    /// conditional claim `(seq + 1, me)` is sent to the two other replicas at once (the own
    /// one gets it at the first ack of another, *Own replica last*) and `true` is returned.
    /// Otherwise nothing is sent and the caller takes the read path. Time is abstract
    /// (spec#time): the local claim may have expired by this coordinator's clock, so a claimed
    /// record is claimed again, as after a read.
    fn claim_from_local(
        &mut self,
        config: &Config,
        coordinator: usize,
        queue: Queue,
        deletes_acked_before: u8,
    ) -> bool {
        let local = &self.replicas[coordinator];
        if !local.up || local.rebuilding != 0 {
            return false;
        }
        let held = local.store[queue.index()];
        let Body::Live {
            claim,
            receive_count,
        } = held.body
        else {
            // Nothing live here: this replica may be behind, so the read decides.
            return false;
        };
        // spec#receive-claim step 4 on the local record: a count at the maximum means a move,
        // which only the read path makes.
        if queue == Queue::Source
            && config.dead_letter
            && receive_count >= config.max_receive_count
            && !config.has(Bug::ClaimWithoutReadNoLocalCountCheck)
        {
            return false;
        }
        let claim = Claim {
            seq: claim.map_or(0, |c| c.seq) + 1,
            coordinator: coordinator as u8,
        };
        self.send_claim(
            config,
            coordinator,
            queue,
            held.generation,
            claim,
            receive_count + 1,
            deletes_acked_before,
            true,
        );
        true
    }

    /// Sends the conditional claim to all three (spec#receive-claim, step 5); a claim without
    /// the read (`fast`) to the two replicas other than the coordinator's own, which gets it
    /// at the first ack of another (`on_reply`, spec §13, *Own replica last*).
    #[allow(clippy::too_many_arguments)]
    fn send_claim(
        &mut self,
        config: &Config,
        coordinator: usize,
        queue: Queue,
        generation: u8,
        claim: Claim,
        receive_count: u8,
        deletes_acked_before: u8,
        fast: bool,
    ) {
        self.begin(
            coordinator,
            Op::ClaimWrite {
                queue,
                generation,
                claim,
                receive_count,
                deletes_acked_before,
                acks: 0,
                fast,
                refused_after_ack: 0,
            },
        );
        let message = Message::Claim {
            queue,
            generation,
            claim,
            receive_count,
        };
        if !fast || config.has(Bug::FastClaimOwnReplicaFirst) {
            self.broadcast(coordinator, message);
            return;
        }
        let round = self.coordinators[coordinator].round;
        for replica in (0..REPLICAS).filter(|r| *r != coordinator) {
            self.push(Packet {
                replica: replica as u8,
                coordinator: coordinator as u8,
                round,
                message,
            });
        }
    }

    /// Ghost: whether a receive acknowledged before now superseded `handle` (a delivery of a
    /// later version of its generation).
    fn superseded(&self, handle: Handle) -> bool {
        self.ghost
            .deliveries
            .iter()
            .any(|d| d.generation == handle.generation && d.claim.seq > handle.claim.seq)
    }

    /// Ghost, S9: a holder's `handle` is refused where `current` is what decided it (the merged
    /// read, or the replica's record). Refusal is justified only by a claim of a greater `seq`
    /// in the handle's generation, or by the generation having ended or moved on.
    fn refused_holder(&mut self, handle_generation: u8, handle: Claim, current: Record) {
        if current.generation == handle_generation
            && current.is_live()
            && version(current.claim()) <= Some(handle.seq)
        {
            self.ghost.violate(Violation::HolderRefused);
        }
    }

    /// `coordinator`'s client deletes with the newest handle it holds (spec#delete).
    pub fn start_delete(&mut self, config: &Config, coordinator: usize) {
        let handle = self.coordinators[coordinator]
            .handle
            .expect("delete is enabled only with a handle");
        self.used.deletes += 1;
        let stale_at_invocation = self.superseded(handle);
        if config.has(Bug::DeleteWithoutQuorumCheck) {
            self.send_delete_tombstone(coordinator, handle, stale_at_invocation);
            return;
        }
        self.begin(
            coordinator,
            Op::DeleteRead {
                handle,
                stale_at_invocation,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(
            coordinator,
            Message::Read {
                queue: handle.queue,
            },
        );
    }

    /// `coordinator`'s client, holding the newest handle of the source copy, moves the message
    /// to the dead-letter queue at once: the quorum read of spec#dead-letter-now-replicated.
    pub fn start_dead_letter_now(&mut self, coordinator: usize) {
        let handle = self.coordinators[coordinator]
            .handle
            .expect("dead-letter-now is enabled only with a handle");
        assert_eq!(handle.queue, Queue::Source);
        self.used.dead_letter_nows += 1;
        let stale_at_invocation = self.superseded(handle);
        self.begin(
            coordinator,
            Op::NowRead {
                handle,
                stale_at_invocation,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(
            coordinator,
            Message::Read {
                queue: Queue::Source,
            },
        );
    }

    fn send_delete_tombstone(&mut self, coordinator: usize, handle: Handle, stale: bool) {
        self.begin(
            coordinator,
            Op::DeleteWrite {
                handle,
                stale_at_invocation: stale,
                conditional: true,
                acks: 0,
                refused: 0,
            },
        );
        self.broadcast(
            coordinator,
            Message::Tombstone {
                queue: handle.queue,
                generation: handle.generation,
                expect: Some(handle.claim),
                reason: Reason::Delete {
                    stale_at_invocation: stale,
                    answered_stale: false,
                },
            },
        );
    }

    /// A redrive of the dead-letter copy back to the source (spec#redrive).
    pub fn start_redrive(&mut self, coordinator: usize) {
        self.used.redrives += 1;
        self.begin(
            coordinator,
            Op::RedriveRead {
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(
            coordinator,
            Message::Read {
                queue: Queue::DeadLetter,
            },
        );
    }

    /// Collection of `queue`'s tombstone: the read of all three replicas.
    pub fn start_collect(&mut self, coordinator: usize, queue: Queue) {
        self.used.collects += 1;
        self.begin(
            coordinator,
            Op::CollectRead {
                queue,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(coordinator, Message::Read { queue });
    }

    /// Sends the conditional drops of a confirmed tombstone (the horizon has passed).
    pub fn collect_drop(&mut self, coordinator: usize) {
        let Op::CollectWait {
            queue, generation, ..
        } = self.coordinators[coordinator].op
        else {
            panic!("collect_drop is enabled only while waiting");
        };
        self.begin(coordinator, Op::Idle);
        self.broadcast(coordinator, Message::Drop { queue, generation });
        self.finish(coordinator);
    }

    /// The coordinator timed out or crashed: its client learns nothing more.
    pub fn abandon(&mut self, coordinator: usize) {
        if let Op::ClaimWrite {
            queue,
            generation,
            claim,
            ..
        } = self.coordinators[coordinator].op
        {
            let holding = self
                .replicas
                .iter()
                .filter(|r| {
                    let record = r.store[queue.index()];
                    record.generation == generation && record.claim() == Some(claim)
                })
                .count();
            if holding == 1 {
                self.ghost.reach(Scenario::OrphanClaim);
            }
        }
        self.finish(coordinator);
    }

    /// Planted bug: count a hint stored for a silent replica as its ack. The write packet to
    /// that replica stays in the network: it is the hint, replayed later (or lost).
    pub fn store_hint(&mut self, config: &Config, coordinator: usize) {
        let c = &mut self.coordinators[coordinator];
        let acks =
            c.op.acks_mut()
                .expect("hints are enabled only in write phases");
        let missing = (0..REPLICAS)
            .find(|r| *acks & bit(*r) == 0)
            .expect("a write phase short of its quorum has a silent replica");
        *acks |= bit(missing);
        let have = count(*acks);
        c.hinted = true;
        if have >= WRITE_QUORUM {
            self.complete_write(config, coordinator);
        }
    }

    /// Whether `coordinator` is in a write phase: a timeout there leaves an unknown outcome. (A
    /// timeout in a read phase changes nothing a never-started operation would not.)
    pub fn writing(&self, coordinator: usize) -> bool {
        let mut op = self.coordinators[coordinator].op;
        op.acks_mut().is_some()
    }

    /// Whether `coordinator` is in a write phase that a hint could complete.
    pub fn can_hint(&self, coordinator: usize) -> bool {
        let c = &self.coordinators[coordinator];
        let mut op = c.op;
        match op.acks_mut() {
            Some(acks) => !c.hinted && count(*acks) == WRITE_QUORUM - 1,
            None => false,
        }
    }

    // ----- faults and background work ---------------------------------------------------------

    /// Replica `r` crashes or is cut off; requests to it wait (a fault).
    pub fn crash(&mut self, r: usize) {
        self.used.faults += 1;
        self.replicas[r].up = false;
    }

    /// The replica comes back with its durable records (spec#stragglers-and-replacement).
    pub fn restart(&mut self, r: usize) {
        let replica = &mut self.replicas[r];
        replica.up = true;
        replica.away_past_horizon = false;
        let replica = &self.replicas[r];
        let behind = [Queue::Source, Queue::DeadLetter].iter().any(|queue| {
            let held = replica.store[queue.index()];
            let others = join_all(
                (0..REPLICAS)
                    .filter(|o| *o != r)
                    .map(|o| self.replicas[o].store[queue.index()]),
            );
            held != Record::default() && held.le(&others) && held != others
        });
        if behind {
            self.ghost.reach(Scenario::RejoinWithOldCopies);
        }
        if self.ghost.missed_collection & bit(r) != 0 {
            self.ghost.missed_collection &= !bit(r);
            self.ghost.reach(Scenario::CollectedWhileAway);
        }
    }

    /// A replica away past the horizon is replaced by an empty one, which must merge from both
    /// peers before it answers anything (spec#stragglers-and-replacement).
    pub fn replace(&mut self, r: usize) {
        self.used.replacements += 1;
        let replica = &mut self.replicas[r];
        replica.retired = Some(replica.store);
        replica.store = [Record::default(); 2];
        replica.rebuilding = ALL_REPLICAS & !bit(r);
        replica.up = true;
        replica.away_past_horizon = false;
        // Ghost: the slot keeps its predecessor's place among the tombstone's holders. The new
        // disk is empty, so it holds no older copy that a collection could uncover
        // (spec#considerations, "a replacement during collection").
        self.ghost.reach(Scenario::Replaced);
    }

    /// Planted bug: the replaced replica's old disk comes back and is used as is.
    pub fn old_disk_returns(&mut self, r: usize) {
        let replica = &mut self.replicas[r];
        replica.store = replica
            .retired
            .take()
            .expect("only a replaced replica has an old disk");
        replica.rebuilding = 0;
    }

    /// Replica `from` pushes its records to replica `to`, which merges them.
    pub fn anti_entropy(&mut self, config: &Config, from: usize, to: usize) {
        for queue in [Queue::Source, Queue::DeadLetter] {
            let incoming = self.replicas[from].store[queue.index()];
            if incoming.is_tombstone() && config.has(Bug::AntiEntropySkipsTombstones) {
                continue;
            }
            self.merge_into(config, to, queue, incoming, Cause::AntiEntropy);
        }
        if self.replicas[from].rebuilding == 0 {
            self.replicas[to].rebuilding &= !bit(from);
        }
    }

    /// Whether an anti-entropy push from `from` to `to` would change anything.
    pub fn anti_entropy_useful(&self, config: &Config, from: usize, to: usize) -> bool {
        let (f, t) = (&self.replicas[from], &self.replicas[to]);
        if !f.up || !t.up {
            return false;
        }
        let clears = t.rebuilding & bit(from) != 0 && f.rebuilding == 0;
        let skipped =
            |record: &Record| record.is_tombstone() && config.has(Bug::AntiEntropySkipsTombstones);
        clears
            || [0, 1].iter().any(|q| {
                !skipped(&f.store[*q])
                    && t.store[*q].merge(f.store[*q], config.merge_rules()) != t.store[*q]
            })
    }

    /// The clock passes the tombstone horizon: every packet in flight is now too old to be
    /// accepted, every operation in progress has timed out, and down replicas are stragglers.
    pub fn pass_horizon(&mut self, config: &Config) {
        self.used.horizons += 1;
        self.era += 1;
        if !config.has(Bug::NoPacketHorizon) {
            self.network.clear();
        }
        for replica in &mut self.replicas {
            if !replica.up {
                replica.away_past_horizon = true;
            }
        }
        for c in 0..COORDINATORS {
            if !matches!(self.coordinators[c].op, Op::CollectWait { .. }) {
                self.finish(c);
            }
        }
    }

    /// The network loses the packet at `index` (a fault).
    pub fn drop_packet(&mut self, index: usize) {
        self.used.faults += 1;
        self.network.remove(index);
    }

    /// The network duplicates the packet at `index` (a fault).
    pub fn duplicate_packet(&mut self, index: usize) {
        self.used.faults += 1;
        let packet = self.network[index];
        self.push(packet);
    }

    /// Whether the packet at `index` can be delivered now (its replica is up).
    pub fn deliverable(&self, index: usize) -> bool {
        let packet = &self.network[index];
        !packet.message.is_request() || self.replicas[packet.replica as usize].up
    }

    /// Delivers the packet at `index` to its replica, whose reply reaches the coordinator.
    pub fn deliver(&mut self, config: &Config, index: usize) {
        let packet = self.network.remove(index);
        if packet.message.is_request() {
            self.on_request(config, packet);
        } else {
            self.on_reply(config, packet);
        }
    }

    // ----- replicas ---------------------------------------------------------------------------

    /// Replies reach their coordinator in the step that produced them (spec#model-bounds): a
    /// lost reply is the coordinator timing out, a slow one is its next requests being slow.
    fn reply(&mut self, config: &Config, request: &Packet, message: Message) {
        self.on_reply(
            config,
            Packet {
                message,
                ..*request
            },
        );
    }

    fn on_request(&mut self, config: &Config, packet: Packet) {
        let r = packet.replica as usize;
        if self.replicas[r].rebuilding != 0 && !config.has(Bug::RebuildingReplicaServes) {
            // Lost its memory of claims and tombstones: it must not vote (spec#stragglers).
            return;
        }
        match packet.message {
            Message::Read { queue } => {
                let record = self.replicas[r].store[queue.index()];
                self.reply(config, &packet, Message::ReadReply { record });
            }
            Message::Write { queue, record, ack } => {
                let cause = if ack { Cause::Request } else { Cause::Repair };
                self.merge_into(config, r, queue, record, cause);
                if ack {
                    self.reply(config, &packet, Message::Ack);
                }
            }
            Message::Claim {
                queue,
                generation,
                claim,
                receive_count,
            } => {
                let held = self.replicas[r].store[queue.index()];
                // Compare-and-set on the version: the claim must be strictly newer than the
                // replica's current claim of this generation (spec#claim).
                let accept = match held.generation.cmp(&generation) {
                    std::cmp::Ordering::Greater => false,
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Equal => match held.body {
                        Body::Tombstone => false,
                        Body::Absent => true,
                        Body::Live {
                            claim: current,
                            receive_count: held_count,
                        } => {
                            current.map_or(0, |c| c.seq) < claim.seq
                                && self.count_allows(config, queue, held_count)
                        }
                    },
                };
                // With `claim_without_read` the replica also checks (c), that its current
                // claim's visibility deadline has passed by the clock the coordinator sent.
                // Time is abstract (spec#time): every claim may have expired by any clock, so
                // (c) accepts every claim here; section 5's model is the one with deadlines.
                if accept {
                    let c = packet.coordinator as usize;
                    if r == c
                        && self.coordinators[c].round == packet.round
                        && matches!(self.coordinators[c].op, Op::ClaimWrite { fast: true, .. })
                        && !config.has(Bug::FastClaimOwnReplicaFirst)
                    {
                        self.ghost.reach(Scenario::ClaimWithoutReadOwnLast);
                    }
                    let record = Record::claimed(generation, claim, receive_count);
                    self.merge_into(config, r, queue, record, Cause::Request);
                    self.reply(config, &packet, Message::Ack);
                } else {
                    // Ignored by the coordinator of a read-path claim, and of a claim without
                    // the read that a replica has acked; a claim without the read that no
                    // replica has acked falls back to the read on it.
                    self.reply(config, &packet, Message::Refused);
                }
            }
            Message::Tombstone {
                queue,
                generation,
                expect,
                reason,
            } => {
                let held = self.replicas[r].store[queue.index()];
                let moving = !matches!(reason, Reason::Delete { .. });
                if moving && held.generation > generation {
                    // A move's tombstone arriving after a later life of the message came back
                    // to this queue (spec#7, a move racing a redrive): refused below.
                    self.ghost.reach(Scenario::LateTombstoneOfEarlierLife);
                }
                let generation = if config.has(Bug::TombstoneIgnoresGeneration) {
                    held.generation.max(generation)
                } else {
                    generation
                };
                // Applied only if the replica knows no claim newer than the caller's handle
                // (spec#delete); an existing tombstone of the generation is acked again.
                let accept = match held.generation.cmp(&generation) {
                    std::cmp::Ordering::Greater => false,
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Equal => match held.body {
                        Body::Tombstone | Body::Absent => true,
                        Body::Live { claim, .. } => config.no_newer(claim, expect),
                    },
                };
                if !accept
                    && queue == Queue::DeadLetter
                    && reason == Reason::Move
                    && held.generation == generation
                    && version(held.claim()) > version(expect)
                {
                    self.ghost.reach(Scenario::RedriveRefusedByNewerClaim);
                }
                // A delete or a dead-letter now carries its caller's handle, a delivered claim.
                if !accept
                    && reason != Reason::Move
                    && let Some(handle) = expect
                {
                    self.refused_holder(generation, handle, held);
                }
                if !accept {
                    // The refusal is answered (spec#delete, step 4): a delete's answer depends
                    // on it; the other writers of conditional tombstones ignore it.
                    self.reply(config, &packet, Message::Refused);
                }
                if accept {
                    let first = held != Record::tombstone(generation);
                    match reason {
                        Reason::Delete {
                            stale_at_invocation,
                            answered_stale,
                        } if first => {
                            self.ghost.deleted = true;
                            if stale_at_invocation {
                                self.ghost.violate(Violation::StaleHandleTookEffect);
                            }
                            if answered_stale {
                                self.ghost.violate(Violation::StaleDeleteWrote);
                            }
                        }
                        Reason::Now {
                            stale_at_invocation: true,
                        } if first => self.ghost.violate(Violation::StaleHandleTookEffect),
                        _ => {}
                    }
                    self.merge_into(
                        config,
                        r,
                        queue,
                        Record::tombstone(generation),
                        Cause::Request,
                    );
                    self.reply(config, &packet, Message::Ack);
                }
            }
            Message::Drop { queue, generation } => {
                let held = self.replicas[r].store[queue.index()];
                if held == Record::tombstone(generation) || config.has(Bug::UnconditionalDrop) {
                    let (holders_generation, holders) = self.ghost.tombstone_holders[queue.index()];
                    if held.is_tombstone()
                        && (holders_generation != generation || holders != ALL_REPLICAS)
                    {
                        self.ghost.violate(Violation::DroppedBeforeAllHeld);
                    }
                    self.store(r, queue, Record::default(), Cause::Request);
                    for (other, replica) in self.replicas.iter().enumerate() {
                        if !replica.up {
                            self.ghost.missed_collection |= bit(other);
                        }
                    }
                }
            }
            Message::ReadReply { .. } | Message::Ack | Message::Refused => {
                unreachable!("replies go to coordinators")
            }
        }
    }

    /// Check (d) of a claim without the read (spec/replication.md §13): with
    /// `claim_without_read`, a replica takes a claim of the source only while the receive count
    /// it holds for that generation is below `maxReceiveCount`, so the claim cannot bypass the
    /// dead-letter move.
    fn count_allows(&self, config: &Config, queue: Queue, held_count: u8) -> bool {
        !config.claim_without_read
            || config.has(Bug::ClaimWithoutReadNoCountCheck)
            || queue != Queue::Source
            || !config.dead_letter
            || held_count < config.max_receive_count
    }

    // ----- coordinators -----------------------------------------------------------------------

    fn on_reply(&mut self, config: &Config, packet: Packet) {
        let c = packet.coordinator as usize;
        if self.coordinators[c].round != packet.round {
            return;
        }
        let r = packet.replica as usize;
        let mut op = self.coordinators[c].op;
        match packet.message {
            Message::ReadReply { record } => {
                // A reply for a phase already decided (late or duplicated) is ignored.
                let Some(replies) = op.replies_mut() else {
                    return;
                };
                replies[r] = Some(record);
                let have = replies.iter().flatten().count();
                self.coordinators[c].op = op;
                let needed = if matches!(op, Op::CollectRead { .. }) {
                    config.collect_quorum()
                } else {
                    config.read_quorum()
                };
                if have >= needed {
                    self.decide(config, c);
                }
            }
            Message::Ack => {
                let Some(acks) = op.acks_mut() else {
                    return;
                };
                let first = *acks == 0;
                *acks |= bit(r);
                let have = count(*acks);
                self.coordinators[c].op = op;
                // spec §13, *Own replica last*: a claim without the read reaches its
                // coordinator's own replica only after another replica took it (in section 5's
                // model, with deadlines, that ack shows the holder's lease has expired on a
                // replica that is not behind it; here every claim may have expired).
                if let Op::ClaimWrite {
                    queue,
                    generation,
                    claim,
                    receive_count,
                    fast: true,
                    ..
                } = op
                    && first
                    && !config.has(Bug::FastClaimOwnReplicaFirst)
                {
                    self.push(Packet {
                        replica: c as u8,
                        coordinator: c as u8,
                        round: packet.round,
                        message: Message::Claim {
                            queue,
                            generation,
                            claim,
                            receive_count,
                        },
                    });
                }
                let needed = if matches!(op, Op::ClaimWrite { .. }) {
                    config.deliver_quorum()
                } else {
                    WRITE_QUORUM
                };
                if have >= needed {
                    self.complete_write(config, c);
                } else {
                    self.delete_refusals(config, c);
                }
            }
            Message::Refused => {
                if let Op::ClaimWrite {
                    queue,
                    generation,
                    claim,
                    deletes_acked_before,
                    acks,
                    fast: true,
                    refused_after_ack,
                    ..
                } = &mut op
                {
                    // spec#13, *A claim without the read*: a refusal while no replica has acked
                    // the claim gives it up (as a split claim gives up) and the receive takes
                    // the read path. The same receive, so its ghost invocation time is kept.
                    if *acks == 0 {
                        self.ghost.reach(Scenario::ClaimWithoutReadFellBack);
                        self.claim_read(c, *queue, *deletes_acked_before);
                        return;
                    }
                    // Once a replica acked it, the claim is a conditional claim of `seq + 1`
                    // checked at every replica as a read-path claim is, and a refusal is
                    // handled as for one: ignored; the claim is delivered at two acks or ends
                    // by its deadline (`Abandon`). This subsumes "one reply per replica": a
                    // replica that acked and refuses a duplicate is ignored too. Ghost: a
                    // refusal by a replica that has not acked, holding this very claim (brought
                    // by anti-entropy or read repair) or something else (a rival).
                    if *acks & bit(r) == 0 {
                        let held = self.replicas[r].store[queue.index()];
                        *refused_after_ack |=
                            if held.generation == *generation && held.claim() == Some(*claim) {
                                REFUSED_BY_COPY
                            } else {
                                REFUSED_BY_RIVAL
                            };
                        self.coordinators[c].op = op;
                    }
                    return;
                }
                if let Op::DeleteWrite {
                    conditional: true,
                    refused,
                    ..
                } = &mut op
                {
                    *refused |= bit(r);
                    self.coordinators[c].op = op;
                    self.delete_refusals(config, c);
                }
            }
            _ => unreachable!("requests go to replicas"),
        }
    }

    /// A delete short of its quorum, after a reply, answers from its refusals (spec#delete,
    /// step 4, F3): `StaleReceiptHandle` ("nothing written") only when all three replicas
    /// refused its conditional tombstone; unavailable ("it may have taken effect") when a
    /// replica took it and two refused. Otherwise it waits, and its deadline is `Abandon`.
    fn delete_refusals(&mut self, config: &Config, c: usize) {
        let Op::DeleteWrite {
            conditional: true,
            acks,
            refused,
            ..
        } = self.coordinators[c].op
        else {
            return;
        };
        let refusals = count(refused);
        if config.has(Bug::StaleAtTwoRefusals) {
            if refusals > REPLICAS - WRITE_QUORUM {
                self.answer_stale(c);
            }
        } else if refusals == REPLICAS && acks == 0 {
            self.answer_stale(c);
        } else if refusals > REPLICAS - WRITE_QUORUM && acks != 0 {
            // Unavailable: the client learns nothing definite, as at the deadline.
            self.finish(c);
        }
    }

    /// The delete of coordinator `c` answers `StaleReceiptHandle` after its write phase. Ghost:
    /// a replica that took its tombstone breaks "a delete answered stale wrote nothing", and
    /// the tombstones still in flight are marked, so a replica taking one later breaks it too.
    fn answer_stale(&mut self, c: usize) {
        let Op::DeleteWrite { acks, refused, .. } = self.coordinators[c].op else {
            unreachable!("only a delete's write phase answers stale here");
        };
        if acks != 0 {
            self.ghost.violate(Violation::StaleDeleteWrote);
        }
        if count(refused) == REPLICAS {
            self.ghost.reach(Scenario::DeleteStaleAtThreeRefusals);
        }
        let round = self.coordinators[c].round;
        for packet in &mut self.network {
            if packet.coordinator as usize == c
                && packet.round == round
                && let Message::Tombstone {
                    reason: Reason::Delete { answered_stale, .. },
                    ..
                } = &mut packet.message
            {
                *answered_stale = true;
            }
        }
        self.network.sort();
        self.finish(c);
    }

    /// Sends read repairs: the merged record to every replica that replied with less.
    fn read_repair(&mut self, queue: Queue, replies: &[Option<Record>; REPLICAS], merged: Record) {
        for (r, reply) in replies.iter().enumerate() {
            if let Some(record) = reply
                && *record != merged
            {
                self.push(Packet {
                    replica: r as u8,
                    coordinator: 0,
                    round: 0,
                    message: Message::Write {
                        queue,
                        record: merged,
                        ack: false,
                    },
                });
            }
        }
    }

    /// A read phase has its quorum: decide what to write.
    fn decide(&mut self, config: &Config, c: usize) {
        match self.coordinators[c].op {
            Op::ClaimRead {
                queue,
                replies,
                deletes_acked_before,
            } => {
                let merged = join_all(replies.iter().flatten().copied());
                self.read_repair(queue, &replies, merged);
                let Body::Live {
                    claim,
                    receive_count,
                } = merged.body
                else {
                    // Nothing to receive: an empty reply.
                    self.finish(c);
                    return;
                };
                // Time is abstract (spec#time): any claim may have expired by the coordinator's
                // clock, so the message may be claimed again.
                if claim.is_some() && config.has(Bug::ClaimNeverExpires) {
                    self.finish(c);
                    return;
                }
                // spec#13: a preference for the messages that start at this coordinator must
                // fall back to taking any visible message; the planted bug has no fallback.
                if config.has(Bug::PreferHomeWithoutFallback) && c != HOME_COORDINATOR {
                    self.finish(c);
                    return;
                }
                let counted = if config.has(Bug::MoveOneReceiveEarly) {
                    receive_count + 1
                } else {
                    receive_count
                };
                // Only the source has a redrive policy; the dead-letter queue has none
                // (spec#7), so a receive there never moves.
                if queue == Queue::Source
                    && config.dead_letter
                    && counted >= config.max_receive_count
                {
                    self.start_move(
                        config,
                        c,
                        merged.generation,
                        claim,
                        receive_count,
                        MoveCause::PastMax,
                    );
                    return;
                }
                let claim = Claim {
                    seq: claim.map_or(0, |c| c.seq) + 1,
                    coordinator: c as u8,
                };
                self.send_claim(
                    config,
                    c,
                    queue,
                    merged.generation,
                    claim,
                    receive_count + 1,
                    deletes_acked_before,
                    false,
                );
            }
            Op::DeleteRead {
                handle,
                stale_at_invocation,
                replies,
            } => {
                let merged = join_all(replies.iter().flatten().copied());
                if merged.generation == handle.generation && merged.is_tombstone() {
                    // Already gone: make the tombstone durable on a quorum before saying so.
                    self.begin(
                        c,
                        Op::DeleteWrite {
                            handle,
                            stale_at_invocation,
                            conditional: false,
                            acks: 0,
                            refused: 0,
                        },
                    );
                    self.broadcast(
                        c,
                        Message::Write {
                            queue: handle.queue,
                            record: merged,
                            ack: true,
                        },
                    );
                } else if merged.generation == handle.generation
                    && config.holds(merged.claim(), handle.claim)
                {
                    self.send_delete_tombstone(c, handle, stale_at_invocation);
                } else {
                    // Superseded handle, or a later life of the message: refused, nothing written.
                    self.refused_holder(handle.generation, handle.claim, merged);
                    self.finish(c);
                }
            }
            Op::NowRead {
                handle,
                stale_at_invocation,
                replies,
            } => {
                let merged = join_all(replies.iter().flatten().copied());
                let holds = merged.generation == handle.generation
                    && if config.has(Bug::DeadLetterNowWithoutHandleCheck) {
                        merged.is_live()
                    } else {
                        config.holds(merged.claim(), handle.claim)
                    };
                let Some(receive_count) = merged.receive_count().filter(|_| holds) else {
                    // Superseded handle, or the message already left this life: refused,
                    // nothing written (spec#dead-letter-now-replicated).
                    if stale_at_invocation {
                        self.ghost.reach(Scenario::NowRefused);
                    }
                    self.refused_holder(handle.generation, handle.claim, merged);
                    self.finish(c);
                    return;
                };
                // The tombstone is conditioned on the claim the read found: the caller's
                // handle, or with the planted bug whatever claim is current.
                self.start_move(
                    config,
                    c,
                    merged.generation,
                    merged.claim(),
                    receive_count,
                    MoveCause::Now {
                        stale_at_invocation,
                    },
                );
            }
            Op::RedriveRead { replies } => {
                let merged = join_all(replies.iter().flatten().copied());
                // Any claim may have expired by this coordinator's clock (spec#time): a copy
                // received in the dead-letter queue is redriven like one never received
                // (spec#7), and its tombstone is conditioned on the claim read here.
                let takes = merged.is_live()
                    && (merged.claim().is_none() || !config.has(Bug::RedriveOnlyUnclaimed));
                if takes {
                    let generation = merged.generation;
                    let expect = if config.has(Bug::RedriveExpectsUnclaimed) {
                        None
                    } else {
                        merged.claim()
                    };
                    if config.has(Bug::DeadLetterTombstonedFirst) {
                        self.redrive_tombstone(c, generation, expect);
                    } else {
                        self.redrive_copy(c, generation, expect);
                    }
                } else {
                    self.finish(c);
                }
            }
            Op::CollectRead { queue, replies } => {
                let replied: Vec<Record> = replies.iter().flatten().copied().collect();
                let first = replied[0];
                if first.is_tombstone() && replied.iter().all(|r| *r == first) {
                    let confirmed_era = self.era;
                    self.coordinators[c].op = Op::CollectWait {
                        queue,
                        generation: first.generation,
                        confirmed_era,
                    };
                } else {
                    self.finish(c);
                }
            }
            _ => unreachable!("decide is called only in read phases"),
        }
    }

    /// Starts the move of generation `generation` to the dead-letter queue: the copy first,
    /// then the source's tombstone conditioned on `expect` (spec#dead-letter-move), or the
    /// other way round with the planted bug.
    fn start_move(
        &mut self,
        config: &Config,
        c: usize,
        generation: u8,
        expect: Option<Claim>,
        receive_count: u8,
        cause: MoveCause,
    ) {
        // S4 for dead-letter now's first write: a superseded handle moves nothing, so its copy
        // is never sent (spec#dead-letter-now-replicated, step 2), let alone its tombstone.
        if cause
            == (MoveCause::Now {
                stale_at_invocation: true,
            })
        {
            self.ghost.violate(Violation::StaleHandleTookEffect);
        }
        if config.has(Bug::SourceTombstonedFirst) {
            self.begin(
                c,
                Op::MoveSource {
                    generation,
                    expect,
                    receive_count,
                    cause,
                    acks: 0,
                },
            );
            self.send_move_tombstone(c, generation, expect, cause);
        } else {
            self.begin(
                c,
                Op::MoveTarget {
                    generation,
                    expect,
                    receive_count,
                    cause,
                    acks: 0,
                },
            );
            self.send_move_copy(c, generation, receive_count);
        }
    }

    fn send_move_copy(&mut self, c: usize, generation: u8, receive_count: u8) {
        self.broadcast(
            c,
            Message::Write {
                queue: Queue::DeadLetter,
                record: Record::ready(generation + 1, receive_count),
                ack: true,
            },
        );
    }

    fn send_move_tombstone(
        &mut self,
        c: usize,
        generation: u8,
        expect: Option<Claim>,
        cause: MoveCause,
    ) {
        let reason = match cause {
            MoveCause::PastMax => Reason::Move,
            MoveCause::Now {
                stale_at_invocation,
            } => Reason::Now {
                stale_at_invocation,
            },
        };
        self.broadcast(
            c,
            Message::Tombstone {
                queue: Queue::Source,
                generation,
                expect,
                reason,
            },
        );
    }

    /// The redrive's first write: the copy of generation `generation + 1` in the source.
    fn redrive_copy(&mut self, c: usize, generation: u8, expect: Option<Claim>) {
        self.begin(
            c,
            Op::RedriveTarget {
                generation,
                expect,
                acks: 0,
            },
        );
        self.broadcast(
            c,
            Message::Write {
                queue: Queue::Source,
                record: Record::ready(generation + 1, 0),
                ack: true,
            },
        );
    }

    /// The redrive's second write: the dead-letter copy's tombstone, conditioned on the claim
    /// the redrive read.
    fn redrive_tombstone(&mut self, c: usize, generation: u8, expect: Option<Claim>) {
        self.begin(
            c,
            Op::RedriveSource {
                generation,
                expect,
                acks: 0,
            },
        );
        self.broadcast(
            c,
            Message::Tombstone {
                queue: Queue::DeadLetter,
                generation,
                expect,
                reason: Reason::Move,
            },
        );
    }

    /// The move of `cause` finished: both writes have their quorum.
    fn moved(&mut self, c: usize, cause: MoveCause) {
        match cause {
            MoveCause::PastMax => self.ghost.reach(Scenario::Moved),
            MoveCause::Now { .. } => self.ghost.reach(Scenario::MovedNow),
        }
        self.finish(c);
    }

    /// A write phase has its quorum of acks.
    fn complete_write(&mut self, config: &Config, c: usize) {
        match self.coordinators[c].op {
            Op::Send { .. } => {
                self.ghost.sent_acked = true;
                self.finish(c);
            }
            Op::ClaimWrite {
                queue,
                generation,
                claim,
                receive_count,
                deletes_acked_before,
                fast,
                refused_after_ack,
                ..
            } => {
                if fast {
                    self.ghost.reach(Scenario::ClaimWithoutReadDelivered);
                }
                if refused_after_ack != 0 {
                    self.ghost
                        .reach(Scenario::ClaimWithoutReadRefusedAfterAckDelivered);
                }
                if refused_after_ack & REFUSED_BY_RIVAL != 0 {
                    self.ghost
                        .reach(Scenario::ClaimWithoutReadRefusedByRivalAfterAckDelivered);
                }
                if deletes_acked_before & bit(generation as usize) != 0 {
                    self.ghost.violate(Violation::Resurrection);
                } else if self.ghost.deletes_acked & bit(generation as usize) != 0 {
                    self.ghost.reach(Scenario::DeliveredAfterConcurrentDelete);
                }
                self.deliver_claim(config, queue, generation, claim, receive_count);
                self.coordinators[c].handle = Some(Handle {
                    queue,
                    generation,
                    claim,
                });
                self.finish(c);
            }
            Op::DeleteWrite { handle, .. } => {
                self.ghost.deletes_acked |= bit(handle.generation as usize);
                if handle.queue == Queue::DeadLetter {
                    self.ghost.reach(Scenario::DeletedInDeadLetter);
                }
                self.finish(c);
            }
            Op::MoveTarget {
                generation,
                expect,
                receive_count,
                cause,
                ..
            } => {
                // Dead-letter-now moves at any count; only a receive's move waits for the max.
                if cause == MoveCause::PastMax && receive_count < config.max_receive_count {
                    self.ghost.violate(Violation::MovedBeforeMax);
                }
                if config.has(Bug::SourceTombstonedFirst) {
                    self.moved(c, cause);
                } else {
                    self.begin(
                        c,
                        Op::MoveSource {
                            generation,
                            expect,
                            receive_count,
                            cause,
                            acks: 0,
                        },
                    );
                    self.send_move_tombstone(c, generation, expect, cause);
                }
            }
            Op::MoveSource {
                generation,
                expect,
                receive_count,
                cause,
                ..
            } => {
                if config.has(Bug::SourceTombstonedFirst) {
                    self.begin(
                        c,
                        Op::MoveTarget {
                            generation,
                            expect,
                            receive_count,
                            cause,
                            acks: 0,
                        },
                    );
                    self.send_move_copy(c, generation, receive_count);
                } else {
                    self.moved(c, cause);
                }
            }
            Op::RedriveTarget {
                generation, expect, ..
            } if !config.has(Bug::DeadLetterTombstonedFirst) => {
                self.redrive_tombstone(c, generation, expect);
            }
            Op::RedriveSource {
                generation, expect, ..
            } if config.has(Bug::DeadLetterTombstonedFirst) => {
                self.redrive_copy(c, generation, expect);
            }
            Op::RedriveTarget {
                generation, expect, ..
            }
            | Op::RedriveSource {
                generation, expect, ..
            } => {
                self.ghost.reach(Scenario::Redriven);
                if expect.is_some() {
                    self.ghost.reach(Scenario::RedrivenAfterReceive);
                }
                let overtaken = self
                    .ghost
                    .deliveries
                    .iter()
                    .any(|d| d.generation == generation && Some(d.claim.seq) > version(expect));
                if overtaken {
                    self.ghost.reach(Scenario::RedriveOverNewerClaim);
                }
                self.finish(c);
            }
            _ => unreachable!("complete_write is called only in write phases"),
        }
    }

    /// The coordinator hands `queue`'s copy to its client.
    fn deliver_claim(
        &mut self,
        config: &Config,
        queue: Queue,
        generation: u8,
        claim: Claim,
        receive_count: u8,
    ) {
        // Only the source has a redrive policy (spec#7).
        if queue == Queue::Source && config.dead_letter && receive_count > config.max_receive_count
        {
            self.ghost.violate(Violation::DeliveredPastMax);
        }
        let same_version = self
            .ghost
            .deliveries
            .iter()
            .any(|d| d.generation == generation && d.claim.seq == claim.seq);
        if same_version {
            self.ghost.violate(Violation::TwoDeliveriesOfOneVersion);
        }
        let stored = Record::claimed(generation, claim, receive_count);
        let holding = self
            .replicas
            .iter()
            .filter(|r| stored.le(&r.store[queue.index()]))
            .count();
        if holding < WRITE_QUORUM {
            self.ghost.violate(Violation::DeliveredWithoutQuorum);
        }
        self.ghost.deliveries.push(Delivery {
            generation,
            claim,
            receive_count,
        });
    }

    /// Whether delivering `packet` could still change anything. A reply (or a read, whose only
    /// effect is a reply) that its coordinator would ignore is dead.
    fn alive(&self, packet: &Packet) -> bool {
        let reads = matches!(
            packet.message,
            Message::Read { .. } | Message::ReadReply { .. }
        );
        if !reads && packet.message.is_request() {
            return true;
        }
        let coordinator = &self.coordinators[packet.coordinator as usize];
        let mut op = coordinator.op;
        coordinator.round == packet.round
            && if reads {
                op.replies_mut().is_some()
            } else {
                op.acks_mut().is_some()
            }
    }

    /// Removes dead packets (delivering them is a no-op, so this changes no behaviour) and
    /// forgets request rounds nobody can answer any more, so equal situations are equal states.
    pub fn normalize(&mut self) {
        let network = std::mem::take(&mut self.network);
        let mut network: Vec<Packet> = network.into_iter().filter(|p| self.alive(p)).collect();
        // Rounds only need to tell the current round from older ones: the current round of a
        // busy coordinator becomes 1, everything older becomes 0 (whose replies nobody awaits).
        for packet in &mut network {
            let coordinator = &self.coordinators[packet.coordinator as usize];
            let current = !matches!(coordinator.op, Op::Idle) && packet.round == coordinator.round;
            if current {
                packet.round = 1;
            } else {
                packet.round = 0;
                packet.coordinator = 0;
            }
        }
        network.sort();
        self.network = network;
        for coordinator in &mut self.coordinators {
            coordinator.round = u8::from(!matches!(coordinator.op, Op::Idle));
        }
        self.ghost.deliveries.sort();
    }

    // ----- heal: the fair schedule that liveness is checked on --------------------------------

    /// Runs the heal schedule of spec/replication.md#liveness to its end.
    ///
    /// Faults stop: every replica comes back, packets in flight are delivered (or, with
    /// `deliver_pending = false`, were all lost), operations that cannot finish time out,
    /// anti-entropy runs between every pair until nothing changes, with `heal_redrives` one
    /// redrive takes the dead-letter copy back, and a fair consumer (coordinator 0) receives
    /// and deletes until the source queue is empty.
    pub fn heal(&mut self, config: &Config, deliver_pending: bool) {
        let mut steps = 0u32;
        for r in 0..REPLICAS {
            if !self.replicas[r].up {
                self.restart(r);
            }
        }
        if !deliver_pending {
            self.network.clear();
        }
        self.heal_network(config, &mut steps);
        self.heal_anti_entropy(config, &mut steps);
        // With `heal_redrives`, a receive of the drain may move the message to the dead-letter
        // queue again (its count was already at the max): then the redrive runs again. Each
        // redrive resets the count, so the second round drains.
        for _ in 0..2 {
            if config.heal_redrives && self.joined(Queue::DeadLetter).is_live() {
                // Every claim in the dead-letter queue has expired by now: one redrive takes
                // the copy back to the source (spec#7, liveness).
                self.start_redrive(0);
                self.heal_network(config, &mut steps);
                self.heal_anti_entropy(config, &mut steps);
            }
            self.heal_drain(config, &mut steps);
            if !config.heal_redrives || !self.joined(Queue::DeadLetter).is_live() {
                break;
            }
        }
        if steps > HEAL_STEPS_MAX {
            self.ghost.violate(Violation::HealStuck);
        }
        self.normalize();
        self.healed = true;
    }

    /// A fair consumer (coordinator 0) receives from the source and deletes what it was
    /// given, until the source is empty (at most four receives).
    fn heal_drain(&mut self, config: &Config, steps: &mut u32) {
        for _ in 0..4 {
            if !self.joined(Queue::Source).is_live() {
                break;
            }
            self.start_claim(config, 0, Queue::Source);
            self.heal_network(config, steps);
            let delivered = self.coordinators[0].handle;
            if let Some(handle) = delivered
                && handle.queue == Queue::Source
                && version(self.joined(Queue::Source).claim()) == Some(handle.claim.seq)
            {
                self.start_delete(config, 0);
                self.heal_network(config, steps);
            }
            self.heal_anti_entropy(config, steps);
        }
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

    fn heal_anti_entropy(&mut self, config: &Config, steps: &mut u32) {
        loop {
            let mut changed = false;
            for from in 0..REPLICAS {
                for to in 0..REPLICAS {
                    if from != to && self.anti_entropy_useful(config, from, to) {
                        self.anti_entropy(config, from, to);
                        changed = true;
                        *steps += 1;
                    }
                }
            }
            if !changed || *steps > HEAL_STEPS_MAX {
                return;
            }
        }
    }
}
