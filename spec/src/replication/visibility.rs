//! The model of spec/replication.md#5-change-visibility: a receipt handle's visibility changed
//! over the network, with abstract time, the 12-hour cap and the node's release of an abandoned
//! long poll.
//!
//! One message, already sent to its three replicas; two coordinators, each also the node of one
//! client; the receive of part 1 (quorum read, conditional claim, deliver after two acks) and the
//! change of part 5 (quorum read, conditional lease write, answer after two acks). The clock is
//! one abstract tick counter that `Tick` advances; deadlines are ticks. Ghost fields record what
//! clients were told, so the invariants can be stated; the protocol never reads them. This module
//! owns the lease, its merge and the whole state machine of this section; it must never depend on
//! the part-1 model (`protocol`), whose receive it restates only as far as a lease needs it.

use stateright::{Model, Property};

use super::net::{bit, push_sorted};

/// Replicas of the message.
pub const REPLICAS: usize = 3;
/// Coordinators; coordinator `c` is also the node that client `c` talks to first.
pub const COORDINATORS: usize = 2;
/// Acks a write needs before its coordinator answers.
pub const WRITE_QUORUM: usize = 2;
/// Replies a read needs before its coordinator decides.
pub const READ_QUORUM: usize = 2;
/// The visibility timeout a receive sets, in ticks.
pub const VISIBILITY: u8 = 1;
/// The shorter timeout a receive may ask for instead, in runs with `short_receives` (SQS's
/// per-receive `VisibilityTimeout`), in ticks: 0, visible again at once. With it a claim's
/// deadline can come before that of the lease it supersedes, which one timeout for every
/// receive never allows; the real timeouts differ in seconds, the model's in whole ticks.
pub const VISIBILITY_SHORT: u8 = 0;
/// The timeout a client's change asks for, in ticks (an extension).
pub const CHANGE_TIMEOUT: u8 = 2;
/// `VISIBILITY_TOTAL_MAX`: how far past its receive a claim's deadline may lie (12 h), in ticks.
pub const VISIBILITY_TOTAL_MAX: u8 = 2;
/// Steps the heal schedule may take before it is declared stuck.
pub const HEAL_STEPS_MAX: u32 = 500;

const _: () = assert!(VISIBILITY <= VISIBILITY_TOTAL_MAX);
const _: () = assert!(VISIBILITY_SHORT < VISIBILITY);
const _: () = assert!(CHANGE_TIMEOUT <= VISIBILITY_TOTAL_MAX);

/// A claim: one receive's place in the order of receives (part 1's `(seq, coordinator)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Claim {
    /// Receive sequence number, from 1.
    pub seq: u8,
    /// The coordinator that issued it.
    pub coordinator: u8,
}

/// A receipt handle: the claim and the receive time `received_at_ms` it was issued at.
///
/// The receive time is fixed by the receive that made the claim and anchors the 12-hour cap. It
/// stands where the real handle has its nonce: one coordinator's two claims of one `seq` (a retry
/// after a timeout) are told apart by it. A handle is valid by its version, the claim's `seq`
/// (spec/replication.md#delete); the rest only tells claims apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    pub claim: Claim,
    /// The tick of the receive (`received_at_ms`).
    pub received_at: u8,
}

/// The visibility of one handle as a replica stores it: the claim with its change counter and
/// deadline (`deadline_ms`, `change_counter` of the stored record).
///
/// Ordered by `(seq, change_counter, deadline)`, then by the claim's coordinator and receive time
/// (which make the order total), and that order is the merge: the newer `seq` wins whole; for one
/// `seq` the higher change counter wins; for one `seq` and counter, **the later deadline wins**,
/// whichever claim of that `seq` it belongs to (spec/replication.md#the-record and
/// #5-change-visibility; F1 in part 1's Considerations says why the claim's identity comes last).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Lease {
    pub handle: Handle,
    /// Changes applied to this handle: the receive writes 0, each change the one it read + 1.
    pub change_counter: u8,
    /// The tick at which the message is visible again.
    pub deadline: u8,
}

impl Lease {
    /// The lease's place in the merge's order (spec/replication.md#the-record).
    fn key(&self) -> (u8, u8, u8, u8, u8) {
        let Handle { claim, received_at } = self.handle;
        (
            claim.seq,
            self.change_counter,
            self.deadline,
            claim.coordinator,
            received_at,
        )
    }

    /// The order before F1 was answered (planted bug `LeaseByWholeClaim`): the whole claim first,
    /// then the counter and the deadline.
    fn key_by_whole_claim(&self) -> (Handle, u8, u8) {
        (self.handle, self.change_counter, self.deadline)
    }
}

impl Ord for Lease {
    fn cmp(&self, other: &Lease) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for Lease {
    fn partial_cmp(&self, other: &Lease) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// How replicas merge leases. [`Rules::CORRECT`] is the page's; the others exist so the model can
/// show that each rule is load-bearing (planted bugs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules {
    /// Two leases of one handle and counter take the later deadline; otherwise a replica keeps
    /// what it held (planted bug `MergeByClaimAndCounter`).
    pub by_deadline_too: bool,
    /// The claim's identity comes after `(seq, change_counter, deadline)`; otherwise the whole
    /// claim comes first (planted bug `LeaseByWholeClaim`, the order before F1).
    pub identity_last: bool,
}

impl Rules {
    /// The rules of spec/replication.md#the-record and #5-change-visibility.
    pub const CORRECT: Rules = Rules {
        by_deadline_too: true,
        identity_last: true,
    };
}

/// A replica's record of the message: `None` while never received (ready), else the newest
/// lease. The message is sent before the model starts and never deleted here (part 1 owns
/// tombstones; a tombstone dominates every lease of its generation).
pub type Record = Option<Lease>;

/// The join of two records: the greater lease (the order of [`Lease`]).
///
/// With `by_deadline_too = false` (planted bug `MergeByClaimAndCounter`) two leases of one handle
/// and counter keep whichever the replica held first, so the result depends on arrival order.
/// With `identity_last = false` (planted bug `LeaseByWholeClaim`) the greater claim wins whole,
/// so a claim that lost the race for a version outranks the delivered one with an earlier
/// deadline, or with its changes.
#[must_use]
pub fn merge(held: Record, incoming: Record, rules: Rules) -> Record {
    match (held, incoming) {
        (Some(h), Some(i))
            if !rules.by_deadline_too
                && h.handle == i.handle
                && h.change_counter == i.change_counter =>
        {
            Some(h)
        }
        (Some(h), Some(i)) if !rules.identity_last => {
            if i.key_by_whole_claim() > h.key_by_whole_claim() {
                Some(i)
            } else {
                Some(h)
            }
        }
        _ => held.max(incoming),
    }
}

/// A protocol rule switched off on purpose, to show the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The merge compares `(claim, change counter)` only; on a tie a replica keeps what it held.
    MergeByClaimAndCounter,
    /// A change is answered after its first ack.
    ChangeAckedAtOne,
    /// A change decides on one replica's view (its own) instead of a read quorum.
    ChangeWithoutQuorumRead,
    /// A release (timeout 0) writes the new deadline without raising the change counter.
    ReleaseWithoutCounter,
    /// The 12-hour cap is measured from the change (`timeout ≤ cap`), not from the receive.
    CapFromChange,
    /// Leases merge by the whole claim first, then counter and deadline (the order before
    /// spec/replication.md's F1): a claim that lost the race for a version, left on one replica,
    /// outranks the delivered claim and brings the message back at its own, earlier deadline.
    LeaseByWholeClaim,
    /// With `claim_without_read`, replicas leave out check (c): they take a claim of a newer
    /// `seq` whatever their lease's deadline and the `now` the claim carries
    /// (spec/replication.md §13, *A claim without the read*).
    ClaimWithoutReadNoDeadlineCheck,
    /// With `claim_without_read`, a claim without the read goes to all three replicas at once,
    /// its coordinator's own among them (spec/replication.md §13 before *Own replica last*). An
    /// own replica behind the holder's lease (it missed an extension, or holds the claim that
    /// lost the race for the holder's `seq`) takes the claim of the next `seq` by (b) and (c)
    /// while the two others refuse it by (c); that orphan claim, of a shorter timeout than the
    /// holder's lease has left, supersedes the lease by merge, and once its own deadline has
    /// passed the message is claimed again inside the holder's timeout (V1).
    FastClaimOwnReplicaFirst,
}

/// Where a search starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// Sent, on all three replicas, never received.
    Ready,
    /// Received at tick 0 by client 1 (claim `(1, c1)`, deadline [`VISIBILITY`]) on replicas 0
    /// and 1; replica 2 still holds the unreceived copy, the claim's repair in flight or lost.
    Received,
}

/// Bounds and switches of one run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Printed with the run's figures.
    pub name: &'static str,
    pub start: Start,
    /// Receives started.
    pub claims_max: u8,
    /// Clients' changes started (each asks for [`CHANGE_TIMEOUT`]).
    pub changes_max: u8,
    /// Releases of an abandoned long poll started by a node (a change with timeout 0).
    pub releases_max: u8,
    /// Packet drops and duplicates, together.
    pub faults_max: u8,
    /// Anti-entropy exchanges.
    pub anti_entropy_max: u8,
    /// The last tick the clock reaches.
    pub ticks_max: u8,
    /// Whether the free phase may end in the heal schedule.
    pub heal: bool,
    /// Whether a receive claims without its quorum read (spec/replication.md §13, *A claim
    /// without the read*): coordinator `c` reads replica `c`'s record in place and, if its
    /// deadline has passed by `c`'s clock, sends the claim of the next `seq` at once; replicas
    /// then check (c) on every claim, and a refusal of a fast claim that comes while no replica
    /// has acked it sends the same receive down the read path (after an ack, the fast claim is
    /// handled as a read-path claim). Off in every run of section 5's tables.
    pub claim_without_read: bool,
    /// Whether each receive may also ask for [`VISIBILITY_SHORT`] instead of [`VISIBILITY`]
    /// (the action `ShortClaim`). Off in every run of section 5's tables but the claim without
    /// the read's: only there can a claim's early deadline undercut a holder it should never
    /// have superseded (planted bug `FastClaimOwnReplicaFirst`).
    pub short_receives: bool,
    pub bug: Option<Bug>,
}

impl Config {
    /// Everything off. Configurations start from here.
    pub fn quiet(name: &'static str) -> Config {
        Config {
            name,
            start: Start::Received,
            claims_max: 0,
            changes_max: 0,
            releases_max: 0,
            faults_max: 0,
            anti_entropy_max: 0,
            ticks_max: 0,
            heal: false,
            claim_without_read: false,
            short_receives: false,
            bug: None,
        }
    }

    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    fn merge(&self, held: Record, incoming: Record) -> Record {
        let rules = Rules {
            by_deadline_too: !self.has(Bug::MergeByClaimAndCounter),
            identity_last: !self.has(Bug::LeaseByWholeClaim),
        };
        merge(held, incoming, rules)
    }

    fn join(&self, records: impl IntoIterator<Item = Record>) -> Record {
        records
            .into_iter()
            .fold(None, |held, incoming| self.merge(held, incoming))
    }
}

/// What a coordinator is doing. Each phase waits for replies tagged with its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Idle,
    /// `floor`: ghost, the greatest lease acknowledged to any client when this receive was
    /// invoked (a delivery or a change). `now`: the coordinator's clock when the receive was
    /// invoked, the one reading every decision of the operation uses (*Time*). `visibility`:
    /// the timeout the receive asked for, in ticks.
    ClaimRead {
        floor: Record,
        now: u8,
        visibility: u8,
        replies: [Option<Record>; REPLICAS],
    },
    /// `early`: ghost, the decision came before every deadline this receive had to honour.
    /// `fast`: a claim without the read (`claim_without_read`), which falls back to the read at
    /// a refusal that comes while `acks` is empty, and after an ack is handled as a read-path
    /// claim; `floor` is then its invocation's ghost floor, kept for the fallback and for the
    /// judgement at delivery, and `None` for every other claim (so runs without the switch keep
    /// their states). A fast claim goes to the coordinator's own replica only at the first ack
    /// of another (*Own replica last*): while `acks` is empty, the own replica has not been
    /// sent it. `refused_after_ack`: ghost, the refusals of the fast claim by a replica that
    /// had not acked it, after another had (`REFUSED_BY_COPY`, `REFUSED_BY_RIVAL`).
    ClaimWrite {
        lease: Lease,
        early: bool,
        fast: bool,
        floor: Record,
        acks: u8,
        refused_after_ack: u8,
    },
    /// A change of `client`'s `handle` to `timeout` ticks from now; `release`: the node's own
    /// change 0 for a long poll whose client left. `stale`: ghost, a delivered receive had
    /// superseded the handle when the change was invoked.
    ChangeRead {
        client: u8,
        handle: Handle,
        timeout: u8,
        release: bool,
        stale: bool,
        floor: Record,
        now: u8,
        replies: [Option<Record>; REPLICAS],
    },
    ChangeWrite {
        client: u8,
        lease: Lease,
        release: bool,
        stale: bool,
        floor: Record,
        acks: u8,
    },
}

impl Op {
    fn replies_mut(&mut self) -> Option<&mut [Option<Record>; REPLICAS]> {
        match self {
            Op::ClaimRead { replies, .. } | Op::ChangeRead { replies, .. } => Some(replies),
            _ => None,
        }
    }

    fn acks_mut(&mut self) -> Option<&mut u8> {
        match self {
            Op::ClaimWrite { acks, .. } | Op::ChangeWrite { acks, .. } => Some(acks),
            _ => None,
        }
    }
}

/// A node serving one operation at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    /// Tags requests; a reply of another round is ignored.
    pub round: u8,
    pub op: Op,
}

/// Requests on the network (replies reach their coordinator in the step that made them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    Read,
    /// Read repair: merge `record` in, no ack.
    Repair {
        record: Record,
    },
    /// Conditional claim: applied only if the replica's claim has a lower `seq` (b) and, with
    /// `claim_without_read`, its deadline has passed by the claim's receive time, the `now` the
    /// claim carries (c). A refusal answers the coordinator only with `claim_without_read`.
    Claim {
        lease: Lease,
    },
    /// Conditional change: applied only if the replica's claim is of no later `seq` than the
    /// lease's. `stale` is ghost (see `Op::ChangeRead`).
    Change {
        lease: Lease,
        stale: bool,
    },
}

/// A request in flight from a coordinator to a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub replica: u8,
    pub coordinator: u8,
    pub round: u8,
    pub message: Message,
}

/// Broken invariants, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// V1: a receive decided to claim before every deadline it had to honour.
    RedeliveredEarly = 0,
    /// V2: an acknowledged change is not ordered after what was acknowledged before it began.
    ChangeOutOfOrder = 1,
    /// V3: a replica accepted a change whose handle was superseded before the change began.
    StaleChangeAccepted = 2,
    /// V4: a stored deadline lies more than the cap past its receive.
    CapExceeded = 3,
    /// The heal schedule exceeded its step cap.
    HealStuck = 4,
}

/// Scenarios the checker must reach, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A receive found the message invisible past its first deadline, held by an extension.
    ExtensionHeld = 0,
    /// A replica merged two leases of one handle and counter with different deadlines.
    EqualCounterMerged = 1,
    /// A change was refused because it would pass the cap.
    CapRefused = 2,
    /// A delivery released by its node was received again before its first deadline.
    ReleasedAndReceived = 3,
    /// A change was refused because its handle had been superseded.
    StaleRefused = 4,
    /// A replica merged two claims of one `seq` (two receives raced for one version).
    RivalClaimsMerged = 5,
    /// A claim without the read was delivered.
    FastDelivered = 6,
    /// A claim without the read was refused while no replica had acked it, and its receive
    /// took the read path.
    FastFellBack = 7,
    /// A replica refused a claim of a newer `seq` by check (c) alone: its lease's deadline had
    /// not passed by the `now` the claim carried.
    DeadlineRefused = 8,
    /// A claim without the read, held back from its coordinator's own replica, was sent there
    /// after another replica's ack, and the own replica took it (*Own replica last*).
    OwnReplicaLast = 9,
    /// Another replica refused a claim without the read by (c) while the coordinator's own
    /// replica, held back, was behind that replica and would have taken the claim by (b) and
    /// (c): the orphan that sending it to all three at once would have left there.
    OwnReplicaSpared = 10,
    /// A claim without the read was refused by a replica that had not acked it after another
    /// replica had acked it, did not fall back, and was delivered at two acks.
    FastRefusedAfterAckDelivered = 11,
    /// The same, refused by a replica holding a rival lease (another claim's, or a change's),
    /// not a copy of the claim itself.
    FastRefusedByRivalAfterAckDelivered = 12,
}

/// Ghost bits of `Op::ClaimWrite::refused_after_ack`: the refusing replica held a copy of the
/// claim itself (a repair or anti-entropy brought it there from a replica that acked).
pub const REFUSED_BY_COPY: u8 = 1;
/// The refusing replica held a rival lease: another claim's of at least its `seq`, or one whose
/// deadline had not passed by the claim's `now` (a change's, or a claim's of a lower `seq`).
pub const REFUSED_BY_RIVAL: u8 = 2;

/// What only the model knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The greatest lease acknowledged to a client (a delivery or a change).
    pub acked: Record,
    /// Every lease ever written by a claim or a change, sorted, without repeats.
    pub issued: Vec<Lease>,
    /// The claims in `issued` that were issued early (before every deadline their receive had
    /// to honour, as V1 judges a delivery), and never issued in time: sorted. Such a claim
    /// excuses no later receive (V1): a claim the protocol should never have stored must not
    /// lower the bar it broke.
    pub early_claims: Vec<Lease>,
    /// The newest handle delivered to a client.
    pub newest_delivered: Option<Handle>,
    /// The first deadline of a handle whose release was acknowledged.
    pub released_until: Option<u8>,
    pub violations: u8,
    pub scenarios: u16,
}

impl Ghost {
    fn violate(&mut self, violation: Violation) {
        self.violations |= 1 << violation as u8;
    }

    fn reach(&mut self, scenario: Scenario) {
        self.scenarios |= 1 << scenario as u8;
    }

    /// Whether `violation` happened on the way to this state.
    pub fn violated(&self, violation: Violation) -> bool {
        self.violations & (1 << violation as u8) != 0
    }

    /// Whether `scenario` happened on the way to this state.
    pub fn reached(&self, scenario: Scenario) -> bool {
        self.scenarios & (1 << scenario as u8) != 0
    }

    fn issue(&mut self, lease: Lease) {
        if let Err(at) = self.issued.binary_search(&lease) {
            self.issued.insert(at, lease);
        }
    }

    /// Issues the claim `lease`, `early` or not. A lease issued in time once (the same claim
    /// again: a fast claim's fallback can make it) is not early.
    fn issue_claim(&mut self, lease: Lease, early: bool) {
        let known = self.issued.binary_search(&lease).is_ok();
        match self.early_claims.binary_search(&lease) {
            Ok(at) if !early => {
                self.early_claims.remove(at);
            }
            Err(at) if early && !known => self.early_claims.insert(at, lease),
            _ => {}
        }
        self.issue(lease);
    }

    /// The claim `lease`, issued early, was delivered in time after all (a concurrent change
    /// excused it meanwhile): it excuses later receives like any claim issued in time.
    fn in_time(&mut self, lease: Lease) {
        if let Ok(at) = self.early_claims.binary_search(&lease) {
            self.early_claims.remove(at);
        }
    }

    /// Whether some lease issued in time, ordered at or after `floor`, has a deadline that has
    /// passed by `now`: the exemption of V1.
    fn excused(&self, floor: Lease, now: u8) -> bool {
        self.issued.iter().any(|l| {
            *l >= floor && l.deadline <= now && self.early_claims.binary_search(l).is_err()
        })
    }
}

/// Budget spent so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Used {
    pub claims: u8,
    pub changes: u8,
    pub releases: u8,
    pub faults: u8,
    pub anti_entropy: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub replicas: [Record; REPLICAS],
    pub coordinators: [Coordinator; COORDINATORS],
    /// The handle each client holds (`None`: none, or its long poll left).
    pub clients: [Option<Handle>; COORDINATORS],
    /// A multiset, kept sorted so equal states hash equal.
    pub network: Vec<Packet>,
    /// The clock, in ticks (one clock: see the section's Time paragraph for skew).
    pub now: u8,
    pub used: Used,
    pub ghost: Ghost,
    /// The heal schedule ran; nothing happens afterwards.
    pub healed: bool,
}

impl State {
    /// The initial states of `config.start`.
    pub fn initial(config: &Config) -> Vec<State> {
        let idle = Coordinator {
            round: 0,
            op: Op::Idle,
        };
        let ready = State {
            replicas: [None; REPLICAS],
            coordinators: [idle; COORDINATORS],
            clients: [None; COORDINATORS],
            network: Vec::new(),
            now: 0,
            used: Used::default(),
            ghost: Ghost::default(),
            healed: false,
        };
        match config.start {
            Start::Ready => vec![ready],
            Start::Received => {
                let handle = Handle {
                    claim: Claim {
                        seq: 1,
                        coordinator: 1,
                    },
                    received_at: 0,
                };
                let lease = Lease {
                    handle,
                    change_counter: 0,
                    deadline: VISIBILITY,
                };
                let mut received = ready;
                received.replicas[0] = Some(lease);
                received.replicas[1] = Some(lease);
                received.clients[1] = Some(handle);
                received.ghost.acked = Some(lease);
                received.ghost.issue(lease);
                received.ghost.newest_delivered = Some(handle);
                let mut in_flight = received.clone();
                in_flight.push(Packet {
                    replica: 2,
                    coordinator: 0,
                    round: 0,
                    message: Message::Repair {
                        record: Some(lease),
                    },
                });
                vec![in_flight, received]
            }
        }
    }

    /// The join of every replica's record (what the cluster knows), by the correct merge.
    pub fn joined(&self) -> Record {
        self.replicas.iter().copied().max().flatten()
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

    fn begin(&mut self, coordinator: usize, op: Op) {
        let c = &mut self.coordinators[coordinator];
        c.round += 1;
        c.op = op;
    }

    fn finish(&mut self, coordinator: usize) {
        self.coordinators[coordinator].op = Op::Idle;
    }

    /// Merges `incoming` into replica `r`, keeping the ghost up to date.
    fn merge_into(&mut self, config: &Config, r: usize, incoming: Record) {
        let held = self.replicas[r];
        if let (Some(h), Some(i)) = (held, incoming)
            && h.handle == i.handle
            && h.change_counter == i.change_counter
            && h.deadline != i.deadline
        {
            self.ghost.reach(Scenario::EqualCounterMerged);
        }
        if let (Some(h), Some(i)) = (held, incoming)
            && h.handle.claim.seq == i.handle.claim.seq
            && h.handle != i.handle
        {
            self.ghost.reach(Scenario::RivalClaimsMerged);
        }
        let merged = config.merge(held, incoming);
        if let Some(lease) = merged
            && lease.deadline > lease.handle.received_at + VISIBILITY_TOTAL_MAX
        {
            self.ghost.violate(Violation::CapExceeded);
        }
        self.replicas[r] = merged;
    }

    // ----- operations ---------------------------------------------------------------------------

    /// Client `coordinator` receives through its node, asking for `visibility` ticks: the
    /// quorum read of part 1's receive, or with `claim_without_read` the claim from its own
    /// replica's record when that record's deadline has passed by this coordinator's clock
    /// (spec/replication.md §13, *A claim without the read*: the record is always live here,
    /// and there are no counts).
    pub fn start_claim(&mut self, config: &Config, coordinator: usize, visibility: u8) {
        self.used.claims += 1;
        let floor = self.ghost.acked;
        let now = self.now;
        let local = self.replicas[coordinator];
        if config.claim_without_read && local.is_none_or(|l| l.deadline <= now) {
            self.claim(config, coordinator, local, now, floor, visibility, true);
            return;
        }
        self.claim_read(coordinator, floor, now, visibility);
    }

    /// The read path of a receive invoked at `now` with the ghost `floor`, asking for
    /// `visibility` ticks.
    fn claim_read(&mut self, coordinator: usize, floor: Record, now: u8, visibility: u8) {
        self.begin(
            coordinator,
            Op::ClaimRead {
                floor,
                now,
                visibility,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(coordinator, Message::Read);
    }

    /// Client `client` changes the visibility of the handle it holds through its node.
    /// `release`: the node's change 0 for a long poll whose client left; the handle is
    /// forgotten, since nobody holds it any more.
    pub fn start_change(&mut self, client: usize, release: bool) {
        let via = client;
        let handle = self.clients[client].expect("a change needs a handle");
        let timeout = if release {
            self.used.releases += 1;
            self.clients[client] = None;
            0
        } else {
            self.used.changes += 1;
            CHANGE_TIMEOUT
        };
        let stale = self
            .ghost
            .newest_delivered
            .is_some_and(|newest| newest.claim.seq > handle.claim.seq);
        let floor = self.ghost.acked;
        self.begin(
            via,
            Op::ChangeRead {
                client: client as u8,
                handle,
                timeout,
                release,
                stale,
                floor,
                now: self.now,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(via, Message::Read);
    }

    /// The coordinator timed out or crashed in a write phase: its client learns nothing more,
    /// but what it sent may still land.
    pub fn abandon(&mut self, coordinator: usize) {
        self.finish(coordinator);
    }

    /// Whether `coordinator` is in a write phase.
    pub fn writing(&self, coordinator: usize) -> bool {
        let mut op = self.coordinators[coordinator].op;
        op.acks_mut().is_some()
    }

    /// The clock moves one tick.
    pub fn tick(&mut self) {
        self.now += 1;
    }

    /// Replica `from` pushes its record to replica `to`, which merges it.
    pub fn anti_entropy(&mut self, config: &Config, from: usize, to: usize) {
        let incoming = self.replicas[from];
        self.merge_into(config, to, incoming);
    }

    /// Whether a push from `from` to `to` would change anything.
    pub fn anti_entropy_useful(&self, config: &Config, from: usize, to: usize) -> bool {
        config.merge(self.replicas[to], self.replicas[from]) != self.replicas[to]
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

    /// Delivers the packet at `index` to its replica; the reply reaches the coordinator at once.
    pub fn deliver(&mut self, config: &Config, index: usize) {
        let packet = self.network.remove(index);
        let r = packet.replica as usize;
        let held = self.replicas[r];
        match packet.message {
            Message::Read => self.on_read_reply(config, packet, held),
            Message::Repair { record } => self.merge_into(config, r, record),
            Message::Claim { lease } => {
                // Part 1's compare-and-set on the version: a strictly newer `seq`, (b).
                let newer = held.is_none_or(|h| h.handle.claim.seq < lease.handle.claim.seq);
                // With the claim without the read, (c): the held lease's deadline has passed
                // by the `now` the claim carries, its receive time (spec §13).
                let passed = !config.claim_without_read
                    || config.has(Bug::ClaimWithoutReadNoDeadlineCheck)
                    || held.is_none_or(|h| h.deadline <= lease.handle.received_at);
                let c = packet.coordinator as usize;
                // Ghost: whether this is the current fast claim of its coordinator, and with
                // `acks` empty, one still held back from its own replica (*Own replica last*).
                let fast_acks = match self.coordinators[c].op {
                    Op::ClaimWrite {
                        fast: true, acks, ..
                    } if self.current(&packet) => Some(acks),
                    _ => None,
                };
                if newer && passed {
                    if r == c && fast_acks.is_some() && !config.has(Bug::FastClaimOwnReplicaFirst) {
                        self.ghost.reach(Scenario::OwnReplicaLast);
                    }
                    self.merge_into(config, r, Some(lease));
                    self.on_ack(config, packet);
                } else if config.claim_without_read {
                    if newer {
                        self.ghost.reach(Scenario::DeadlineRefused);
                        let own = self.replicas[c];
                        let own_would_take = own.is_none_or(|o| {
                            o.handle.claim.seq < lease.handle.claim.seq
                                && o.deadline <= lease.handle.received_at
                        });
                        if r != c && fast_acks == Some(0) && own < held && own_would_take {
                            self.ghost.reach(Scenario::OwnReplicaSpared);
                        }
                    }
                    self.on_claim_refused(packet);
                }
            }
            Message::Change { lease, stale } => {
                // The delete's replica condition: this replica knows no later version.
                let accept = held.is_none_or(|h| h.handle.claim.seq <= lease.handle.claim.seq);
                if accept {
                    if stale {
                        self.ghost.violate(Violation::StaleChangeAccepted);
                    }
                    self.merge_into(config, r, Some(lease));
                    self.on_ack(config, packet);
                }
            }
        }
    }

    fn current(&self, packet: &Packet) -> bool {
        self.coordinators[packet.coordinator as usize].round == packet.round
    }

    fn on_read_reply(&mut self, config: &Config, packet: Packet, record: Record) {
        if !self.current(&packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let mut op = self.coordinators[c].op;
        let needed = match op {
            Op::ChangeRead { .. } if config.has(Bug::ChangeWithoutQuorumRead) => 1,
            _ => READ_QUORUM,
        };
        let Some(replies) = op.replies_mut() else {
            return;
        };
        replies[packet.replica as usize] = Some(record);
        let have = replies.iter().flatten().count();
        self.coordinators[c].op = op;
        if have >= needed {
            self.decide(config, c);
        }
    }

    /// A replica refused a claim. A claim without the read that no replica has acked gives up
    /// and its receive takes the read path, with the invocation's clock reading and ghost floor
    /// (the same receive, spec §13, *A claim without the read*). Once a replica has acked it, a
    /// fast claim is a conditional claim of `seq + 1` checked by (a)-(d) at every replica, as a
    /// read-path claim is, and is handled as one: it waits for its acks, and ends by its
    /// deadline (`Abandon`) if they never come. This subsumes "one reply per replica": the
    /// refusal of a duplicate by a replica that acked the claim is ignored too.
    fn on_claim_refused(&mut self, packet: Packet) {
        if !self.current(&packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let Op::ClaimWrite {
            lease,
            fast: true,
            floor,
            acks,
            ..
        } = self.coordinators[c].op
        else {
            return;
        };
        if acks == 0 {
            self.ghost.reach(Scenario::FastFellBack);
            let visibility = lease.deadline - lease.handle.received_at;
            self.claim_read(c, floor, lease.handle.received_at, visibility);
        } else if acks & bit(packet.replica as usize) == 0 {
            // Ghost only: a replica that had not acked refused after another acked, holding a
            // copy of this claim (brought by a repair or anti-entropy) or a rival lease.
            let held = self.replicas[packet.replica as usize];
            let by = if held.is_some_and(|h| h.handle == lease.handle) {
                REFUSED_BY_COPY
            } else {
                REFUSED_BY_RIVAL
            };
            if let Op::ClaimWrite {
                refused_after_ack, ..
            } = &mut self.coordinators[c].op
            {
                *refused_after_ack |= by;
            }
        }
    }

    fn on_ack(&mut self, config: &Config, packet: Packet) {
        if !self.current(&packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let mut op = self.coordinators[c].op;
        let needed = match op {
            Op::ChangeWrite { .. } if config.has(Bug::ChangeAckedAtOne) => 1,
            _ => WRITE_QUORUM,
        };
        let Some(acks) = op.acks_mut() else {
            return;
        };
        let first = *acks == 0;
        *acks |= bit(packet.replica as usize);
        let have = acks.count_ones() as usize;
        self.coordinators[c].op = op;
        // *Own replica last* (spec §13): a fast claim reaches its coordinator's own replica
        // only after another replica took it. That replica holds the holder's lease or a later
        // one (an acknowledged lease is on two replicas, so only one can be behind it), and by
        // (c) its deadline passed by the claim's `now`: the own replica, if behind, is never
        // the only one to take a claim the others refuse. From that ack on, a refusal no
        // longer sends the receive down the read path (`on_claim_refused`).
        if let Op::ClaimWrite {
            lease, fast: true, ..
        } = op
            && first
            && !config.has(Bug::FastClaimOwnReplicaFirst)
        {
            self.push(Packet {
                replica: c as u8,
                coordinator: c as u8,
                round: self.coordinators[c].round,
                message: Message::Claim { lease },
            });
        }
        if have >= needed {
            self.complete_write(c);
        }
    }

    /// A read phase has its quorum: decide what to write.
    fn decide(&mut self, config: &Config, c: usize) {
        match self.coordinators[c].op {
            Op::ClaimRead {
                floor,
                now,
                visibility,
                replies,
            } => {
                let merged = config.join(replies.iter().flatten().copied());
                for (r, reply) in replies.iter().enumerate() {
                    if let Some(record) = reply
                        && *record != merged
                    {
                        self.push(Packet {
                            replica: r as u8,
                            coordinator: 0,
                            round: 0,
                            message: Message::Repair { record: merged },
                        });
                    }
                }
                if let Some(lease) = merged
                    && lease.deadline > now
                {
                    if lease.change_counter > 0 && now >= lease.handle.received_at + VISIBILITY {
                        self.ghost.reach(Scenario::ExtensionHeld);
                    }
                    // Invisible by this coordinator's clock: nothing to receive.
                    self.finish(c);
                    return;
                }
                self.claim(config, c, merged, now, floor, visibility, false);
            }
            Op::ChangeRead {
                client,
                handle,
                timeout,
                release,
                stale,
                floor,
                now,
                replies,
            } => {
                let merged = config.join(replies.iter().flatten().copied());
                // Valid by version: the merged lease may be of a claim that lost the race for
                // the handle's `seq`, which nobody holds (spec/replication.md#delete).
                let Some(current) = merged.filter(|l| l.handle.claim.seq == handle.claim.seq)
                else {
                    // Superseded (or, under a planted bug, not seen): refused, nothing written.
                    self.ghost.reach(Scenario::StaleRefused);
                    self.finish(c);
                    return;
                };
                // The cap counts from the merged lease's receive: the new lease keeps that
                // lease's claim and receive time, so V4 holds lease by lease.
                let within_cap = if config.has(Bug::CapFromChange) {
                    timeout <= VISIBILITY_TOTAL_MAX
                } else {
                    now + timeout <= current.handle.received_at + VISIBILITY_TOTAL_MAX
                };
                if !within_cap {
                    self.ghost.reach(Scenario::CapRefused);
                    self.finish(c);
                    return;
                }
                let change_counter = if release && config.has(Bug::ReleaseWithoutCounter) {
                    current.change_counter
                } else {
                    current.change_counter + 1
                };
                let lease = Lease {
                    handle: current.handle,
                    change_counter,
                    deadline: now + timeout,
                };
                self.ghost.issue(lease);
                self.begin(
                    c,
                    Op::ChangeWrite {
                        client,
                        lease,
                        release,
                        stale,
                        floor,
                        acks: 0,
                    },
                );
                self.broadcast(c, Message::Change { lease, stale });
            }
            _ => unreachable!("decide is called only in read phases"),
        }
    }

    /// Coordinator `c` claims the version after `from` (the merged read, or its own replica's
    /// record for a claim without the read, `fast`) for a receive invoked at `now` with the
    /// ghost `floor`, for `visibility` ticks. A fast claim goes to the two other replicas
    /// first, and to `c`'s own at the first ack of another (`on_ack`, *Own replica last*).
    #[allow(clippy::too_many_arguments)]
    fn claim(
        &mut self,
        config: &Config,
        c: usize,
        from: Record,
        now: u8,
        floor: Record,
        visibility: u8,
        fast: bool,
    ) {
        // Ghost, V1: some lease issued in time, which the merge orders at or after every
        // acknowledged one, must have reached its deadline by the time of the claim (the clock
        // as it is now, never behind the coordinator's reading).
        let early = floor.is_some_and(|floor| !self.ghost.excused(floor, self.now));
        let lease = Lease {
            handle: Handle {
                claim: Claim {
                    seq: from.map_or(0, |l| l.handle.claim.seq) + 1,
                    coordinator: c as u8,
                },
                received_at: now,
            },
            change_counter: 0,
            deadline: now + visibility,
        };
        self.ghost.issue_claim(lease, early);
        self.begin(
            c,
            Op::ClaimWrite {
                lease,
                early,
                fast,
                floor: if fast { floor } else { None },
                acks: 0,
                refused_after_ack: 0,
            },
        );
        if !fast || config.has(Bug::FastClaimOwnReplicaFirst) {
            self.broadcast(c, Message::Claim { lease });
            return;
        }
        let round = self.coordinators[c].round;
        for replica in (0..REPLICAS).filter(|r| *r != c) {
            self.push(Packet {
                replica: replica as u8,
                coordinator: c as u8,
                round,
                message: Message::Claim { lease },
            });
        }
    }

    /// A write phase has its quorum of acks: the client is answered.
    fn complete_write(&mut self, c: usize) {
        match self.coordinators[c].op {
            Op::ClaimWrite {
                lease,
                early,
                fast,
                floor,
                refused_after_ack,
                ..
            } => {
                // A claim without the read is judged again now: it was issued at its invocation,
                // before any read, and what the replicas took it by may be a change issued
                // since, concurrent with the receive, which V1 exempts (a release in the same
                // tick, whose deadline is the claim's `now`). Judged by the claim's `now`, the
                // reading (c) compared with. A read-path claim was judged with what its read
                // found.
                let early = early
                    && !(fast
                        && floor.is_some_and(|floor| {
                            self.ghost.excused(floor, lease.handle.received_at)
                        }));
                if early {
                    self.ghost.violate(Violation::RedeliveredEarly);
                } else if fast {
                    self.ghost.in_time(lease);
                }
                if fast {
                    self.ghost.reach(Scenario::FastDelivered);
                }
                if refused_after_ack != 0 {
                    self.ghost.reach(Scenario::FastRefusedAfterAckDelivered);
                }
                if refused_after_ack & REFUSED_BY_RIVAL != 0 {
                    self.ghost
                        .reach(Scenario::FastRefusedByRivalAfterAckDelivered);
                }
                if let Some(until) = self.ghost.released_until
                    && self.now < until
                {
                    self.ghost.reach(Scenario::ReleasedAndReceived);
                }
                self.clients[c] = Some(lease.handle);
                self.ghost.newest_delivered = self.ghost.newest_delivered.max(Some(lease.handle));
                self.ghost.acked = self.ghost.acked.max(Some(lease));
            }
            Op::ChangeWrite {
                lease,
                release,
                floor,
                ..
            } => {
                // V2: what was acknowledged before this change began is ordered before it.
                if floor.is_some_and(|floor| lease <= floor) {
                    self.ghost.violate(Violation::ChangeOutOfOrder);
                }
                if release {
                    // The handle's first deadline: its receive's lease (the timeout it asked
                    // for, with `short_receives` not always `VISIBILITY`).
                    self.ghost.released_until = self
                        .ghost
                        .issued
                        .iter()
                        .filter(|l| l.handle == lease.handle && l.change_counter == 0)
                        .map(|l| l.deadline)
                        .min();
                }
                self.ghost.acked = self.ghost.acked.max(Some(lease));
            }
            _ => unreachable!("complete_write is called only in write phases"),
        }
        self.finish(c);
    }

    /// Removes packets that can change nothing (reads of rounds nobody awaits) and renumbers
    /// rounds to "current" (1) and "older" (0), so equal situations are equal states.
    pub fn normalize(&mut self) {
        let coordinators = self.coordinators;
        let alive = |p: &Packet| {
            let c = &coordinators[p.coordinator as usize];
            let mut op = c.op;
            p.message != Message::Read || (c.round == p.round && op.replies_mut().is_some())
        };
        let mut network: Vec<Packet> = self.network.iter().copied().filter(alive).collect();
        for packet in &mut network {
            let c = &coordinators[packet.coordinator as usize];
            if c.op != Op::Idle && packet.round == c.round {
                packet.round = 1;
            } else {
                packet.round = 0;
                packet.coordinator = 0;
            }
        }
        network.sort();
        self.network = network;
        for c in &mut self.coordinators {
            c.round = u8::from(c.op != Op::Idle);
        }
    }

    /// The heal schedule: faults stop, every packet in flight is delivered (or, with
    /// `deliver_pending = false`, was lost), unfinished operations time out, and anti-entropy
    /// runs between every pair until nothing changes.
    pub fn heal(&mut self, config: &Config, deliver_pending: bool) {
        let mut steps = 0u32;
        if !deliver_pending {
            self.network.clear();
        }
        while !self.network.is_empty() && steps <= HEAL_STEPS_MAX {
            self.deliver(config, 0);
            steps += 1;
        }
        for c in 0..COORDINATORS {
            self.finish(c);
        }
        self.network.clear();
        loop {
            let mut changed = false;
            for from in 0..REPLICAS {
                for to in 0..REPLICAS {
                    if from != to && self.anti_entropy_useful(config, from, to) {
                        self.anti_entropy(config, from, to);
                        changed = true;
                        steps += 1;
                    }
                }
            }
            if !changed || steps > HEAL_STEPS_MAX {
                break;
            }
        }
        if steps > HEAL_STEPS_MAX {
            self.ghost.violate(Violation::HealStuck);
        }
        self.normalize();
        self.healed = true;
    }
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Deliver(u8),
    Drop(u8),
    Duplicate(u8),
    Abandon(u8),
    /// Client (and node) `c` receives, with the timeout [`VISIBILITY`].
    Claim(u8),
    /// Client (and node) `c` receives with the shorter timeout [`VISIBILITY_SHORT`]
    /// (`short_receives`).
    ShortClaim(u8),
    /// Client `c` changes its handle's visibility through its node (a retry through another
    /// node is the same as one through this node after a timeout).
    Change(u8),
    /// Node `c` releases the delivery its long-poll client left behind.
    Release(u8),
    AntiEntropy {
        a: u8,
        b: u8,
    },
    Tick,
    Heal {
        deliver_pending: bool,
    },
}

/// The change-visibility model under one configuration.
#[derive(Clone, Debug)]
pub struct VisibilityModel {
    pub config: Config,
}

impl VisibilityModel {
    /// The model of `config`.
    pub fn new(config: Config) -> VisibilityModel {
        VisibilityModel { config }
    }
}

fn idle(state: &State, c: usize) -> bool {
    state.coordinators[c].op == Op::Idle
}

impl Model for VisibilityModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        State::initial(&self.config)
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let (config, used) = (&self.config, &state.used);
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
        for c in 0..COORDINATORS {
            if !idle(state, c) {
                if state.writing(c) {
                    actions.push(Action::Abandon(c as u8));
                }
                continue;
            }
            if used.claims < config.claims_max {
                actions.push(Action::Claim(c as u8));
                if config.short_receives {
                    actions.push(Action::ShortClaim(c as u8));
                }
            }
            if state.clients[c].is_some() && used.changes < config.changes_max {
                actions.push(Action::Change(c as u8));
            }
            if state.clients[c].is_some() && used.releases < config.releases_max {
                actions.push(Action::Release(c as u8));
            }
        }
        if used.anti_entropy < config.anti_entropy_max {
            for a in 0..REPLICAS {
                for b in a + 1..REPLICAS {
                    if state.anti_entropy_useful(config, a, b)
                        || state.anti_entropy_useful(config, b, a)
                    {
                        actions.push(Action::AntiEntropy {
                            a: a as u8,
                            b: b as u8,
                        });
                    }
                }
            }
        }
        if state.now < config.ticks_max {
            actions.push(Action::Tick);
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
            Action::Drop(i) => state.drop_packet(i as usize),
            Action::Duplicate(i) => state.duplicate_packet(i as usize),
            Action::Abandon(c) => state.abandon(c as usize),
            Action::Claim(c) => state.start_claim(config, c as usize, VISIBILITY),
            Action::ShortClaim(c) => state.start_claim(config, c as usize, VISIBILITY_SHORT),
            Action::Change(c) => state.start_change(c as usize, false),
            Action::Release(c) => state.start_change(c as usize, true),
            Action::AntiEntropy { a, b } => {
                state.used.anti_entropy += 1;
                state.anti_entropy(config, a as usize, b as usize);
                state.anti_entropy(config, b as usize, a as usize);
            }
            Action::Tick => state.tick(),
            Action::Heal { deliver_pending } => state.heal(config, deliver_pending),
        }
        state.normalize();
        Some(state)
    }

    fn within_boundary(&self, state: &State) -> bool {
        let (config, used) = (&self.config, &state.used);
        state.healed
            || (used.faults <= config.faults_max
                && used.claims <= config.claims_max
                && used.changes <= config.changes_max
                && used.releases <= config.releases_max
                && used.anti_entropy <= config.anti_entropy_max)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "receive after an acknowledged change waits for its deadline",
                |_, s: &State| !s.ghost.violated(Violation::RedeliveredEarly),
            ),
            Property::always(
                "acknowledged change is ordered after what was acknowledged before it",
                |_, s: &State| !s.ghost.violated(Violation::ChangeOutOfOrder),
            ),
            Property::always(
                "superseded handle's change is never accepted",
                |_, s: &State| !s.ghost.violated(Violation::StaleChangeAccepted),
            ),
            Property::always("deadline never passes the cap", |_, s: &State| {
                !s.ghost.violated(Violation::CapExceeded)
            }),
            Property::always("after heal, replicas converge", |_, s: &State| {
                !s.healed
                    || (s.network.is_empty()
                        && !s.ghost.violated(Violation::HealStuck)
                        && s.replicas.iter().all(|r| *r == s.replicas[0]))
            }),
            Property::sometimes(
                "extension keeps the message invisible past its first deadline",
                |_, s: &State| s.ghost.reached(Scenario::ExtensionHeld),
            ),
            Property::sometimes(
                "replica merges two changes of one counter with different deadlines",
                |_, s: &State| s.ghost.reached(Scenario::EqualCounterMerged),
            ),
            Property::sometimes("change refused by the cap", |_, s: &State| {
                s.ghost.reached(Scenario::CapRefused)
            }),
            Property::sometimes(
                "released delivery received again before its first deadline",
                |_, s: &State| s.ghost.reached(Scenario::ReleasedAndReceived),
            ),
            Property::sometimes("superseded handle's change refused", |_, s: &State| {
                s.ghost.reached(Scenario::StaleRefused)
            }),
            Property::sometimes("replica merges two claims of one seq", |_, s: &State| {
                s.ghost.reached(Scenario::RivalClaimsMerged)
            }),
            Property::sometimes("heal ran to its end", |_, s: &State| s.healed),
        ];
        if self.config.claim_without_read {
            properties.push(Property::sometimes(
                "claim without the read delivered",
                |_, s: &State| s.ghost.reached(Scenario::FastDelivered),
            ));
            properties.push(Property::sometimes(
                "claim without the read refused, fell back to the read",
                |_, s: &State| s.ghost.reached(Scenario::FastFellBack),
            ));
            properties.push(Property::sometimes(
                "claim of a newer seq refused by its deadline check (c)",
                |_, s: &State| s.ghost.reached(Scenario::DeadlineRefused),
            ));
            properties.push(Property::sometimes(
                "claim without the read taken by its own replica after another's ack",
                |_, s: &State| s.ghost.reached(Scenario::OwnReplicaLast),
            ));
            properties.push(Property::sometimes(
                "claim without the read refused by (c) while its own replica, behind, was spared",
                |_, s: &State| s.ghost.reached(Scenario::OwnReplicaSpared),
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = Record> {
        proptest::option::of((1u8..3, 0u8..2, 0u8..2, 0u8..3, 0u8..4).prop_map(
            |(seq, coordinator, received_at, change_counter, deadline)| Lease {
                handle: Handle {
                    claim: Claim { seq, coordinator },
                    received_at,
                },
                change_counter,
                deadline,
            },
        ))
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in record(), b in record()) {
            prop_assert_eq!(merge(a, b, CORRECT), merge(b, a, CORRECT));
        }

        #[test]
        fn merge_is_associative(a in record(), b in record(), c in record()) {
            prop_assert_eq!(
                merge(merge(a, b, CORRECT), c, CORRECT),
                merge(a, merge(b, c, CORRECT), CORRECT)
            );
        }

        #[test]
        fn merge_is_idempotent(a in record()) {
            prop_assert_eq!(merge(a, a, CORRECT), a);
        }

        #[test]
        fn a_later_seq_wins_and_a_change_outranks_every_claim_of_its_seq(
            a in record(), b in record()
        ) {
            let (Some(x), Some(y)) = (a, b) else { return Ok(()) };
            let joined = merge(a, b, CORRECT).expect("two leases join to one");
            let (x_key, y_key) = (
                (x.handle.claim.seq, x.change_counter, x.deadline),
                (y.handle.claim.seq, y.change_counter, y.deadline),
            );
            let j_key = (joined.handle.claim.seq, joined.change_counter, joined.deadline);
            prop_assert_eq!(j_key, x_key.max(y_key));
        }
    }

    const CORRECT: Rules = Rules::CORRECT;

    /// Part 1's F1: the holder's claim `(1, c0)` and a claim `(1, c1)` that lost the race for the
    /// same version. The page's order keeps the later deadline and lets the holder's change
    /// (counter 1) outrank the rival whatever its deadline; the old order let the rival win.
    #[test]
    fn a_rival_claim_of_one_seq_never_shortens_or_undoes_the_holder() {
        let claim = |coordinator| Claim {
            seq: 1,
            coordinator,
        };
        let lease = |coordinator, change_counter, deadline| {
            Some(Lease {
                handle: Handle {
                    claim: claim(coordinator),
                    received_at: 0,
                },
                change_counter,
                deadline,
            })
        };
        let (holder, rival) = (lease(0, 0, 2), lease(1, 0, 1));
        assert_eq!(merge(holder, rival, CORRECT), holder);
        assert_eq!(merge(rival, holder, CORRECT), holder);
        let released = lease(0, 1, 0);
        assert_eq!(merge(released, lease(1, 0, 2), CORRECT), released);
        let old = Rules {
            identity_last: false,
            ..CORRECT
        };
        assert_eq!(merge(holder, rival, old), rival);
        assert_eq!(merge(released, rival, old), rival);
    }

    #[test]
    fn merge_by_claim_and_counter_depends_on_arrival_order() {
        let short = Lease {
            handle: Handle::default(),
            change_counter: 1,
            deadline: 1,
        };
        let long = Lease {
            deadline: 3,
            ..short
        };
        let (short, long) = (Some(short), Some(long));
        let tie_kept = Rules {
            by_deadline_too: false,
            ..CORRECT
        };
        assert_ne!(merge(short, long, tie_kept), merge(long, short, tie_kept));
        assert_eq!(merge(short, long, CORRECT), long);
        assert_eq!(merge(long, short, CORRECT), long);
    }
}
