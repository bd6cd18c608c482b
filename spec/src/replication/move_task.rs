//! The model of spec/replication.md section 8: a message move task whose record is replicated on
//! three replicas and leased by one runner at a time, checked exhaustively with stateright.
//!
//! One source queue (a dead-letter queue) has one task record. Two coordinators serve the
//! clients' starts and cancels and run the task: a runner takes the lease, renews it before each
//! message move, and writes the final status. Each message move is abstracted as one atomic step
//! (part 1 and section 7 check the move itself under concurrency). Replies reach their
//! coordinator in the step that produced them, as in `protocol`. Ghost fields record what clients
//! and runners were told; the protocol never reads them. Nothing here is used by the node.

use stateright::{Model, Property};

use super::net::{bit, push_sorted};

/// Replicas of the task record.
pub const REPLICAS: usize = 3;
/// Coordinators (each serves clients and may run the task).
pub const COORDINATORS: usize = 2;
/// Acks a write needs, and replies a read needs.
pub const QUORUM: usize = 2;
/// Messages in the source queue when the task starts.
pub const MESSAGES: u8 = 2;
/// Steps the heal schedule may take before it is declared stuck.
pub const HEAL_STEPS_MAX: u32 = 500;

/// Where a task is in its life, in merge order: a later status wins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// No task (the record's `task` is 0).
    #[default]
    None,
    Running,
    /// A cancel was acknowledged; the runner stops before its next move.
    Cancelling,
    /// Every message that was to move has moved.
    Completed,
    Cancelled,
    /// The destination was deleted while the task ran (the reason is stored with it).
    Failed,
}

impl Status {
    /// Running or cancelling: the task still needs a runner, and no new task may start.
    pub fn active(self) -> bool {
        matches!(self, Status::Running | Status::Cancelling)
    }

    /// Completed, cancelled or failed.
    pub fn terminal(self) -> bool {
        self > Status::Cancelling
    }
}

/// A runner's lease: ordered by `epoch` (one more at every takeover), then by holder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease {
    /// 0: never leased.
    pub epoch: u8,
    /// The coordinator that took the lease.
    pub holder: u8,
}

/// The task record of the source queue on one replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskRecord {
    /// How many tasks were started for this source; 0: none yet. The task handle names it.
    pub task: u8,
    /// The coordinator whose start wrote this task (tells two racing starts of one number
    /// apart; the real record carries the start's id and parameters).
    pub starter: u8,
    pub status: Status,
    pub lease: Lease,
    /// Messages moved, per runner (a counter per node, each merged by max; reported as the sum).
    pub moved: [u8; COORDINATORS],
    /// Messages in the source when the task started (written once by the start).
    pub to_move: u8,
}

impl TaskRecord {
    fn key(&self) -> (u8, u8) {
        (self.task, self.starter)
    }

    /// Messages moved so far, as `ListMessageMoveTasks` reports them.
    pub fn moved_total(&self) -> u8 {
        self.moved.iter().sum()
    }

    /// The join of what a replica holds and what arrives: a later task (then the greater
    /// starter) wins whole; within one task the later status, the greater lease, and each
    /// runner's greater count. The planted bugs replace two of these with the incoming value.
    #[must_use]
    pub fn merge(self, incoming: TaskRecord, config: &Config) -> TaskRecord {
        if self.key() != incoming.key() {
            return if self.key() > incoming.key() {
                self
            } else {
                incoming
            };
        }
        let status = if config.has(Bug::StatusLastWriter) {
            incoming.status
        } else {
            self.status.max(incoming.status)
        };
        let mut moved = self.moved;
        for (held, got) in moved.iter_mut().zip(incoming.moved) {
            *held = if config.has(Bug::ProgressLastWriter) {
                got
            } else {
                (*held).max(got)
            };
        }
        TaskRecord {
            status,
            lease: self.lease.max(incoming.lease),
            moved,
            ..self
        }
    }
}

/// A protocol rule switched off on purpose, to show the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// A replica accepts a start whatever task it holds (no compare-and-set on the number).
    StartWithoutCompareAndSet,
    /// A replica accepts a lease of the epoch it already holds from another runner.
    LeaseEpochNotStrict,
    /// A replica accepts a renewal of a lease older than the one it holds.
    RenewalIgnoresEpoch,
    /// A replica accepts a renewal of a task whose cancel it holds.
    RenewalIgnoresCancel,
    /// Progress counters merge by last writer.
    ProgressLastWriter,
    /// The status merges by last writer.
    StatusLastWriter,
    /// A runner that finds the destination deleted stops without writing `Failed`.
    FailureNotRecorded,
}

/// Bounds and switches of one run.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: &'static str,
    /// Where the search starts.
    pub start: Start,
    pub starts_max: u8,
    pub cancels_max: u8,
    /// Lease acquisitions (first runs and takeovers).
    pub acquires_max: u8,
    /// Renewals (one before each message move).
    pub renewals_max: u8,
    /// Dropped or duplicated packets.
    pub faults_max: u8,
    pub anti_entropy_max: u8,
    /// Whether the destination queue may be deleted while the task runs.
    pub destination_delete: bool,
    /// Whether the free phase may end in the heal schedule (liveness).
    pub heal: bool,
    pub bug: Option<Bug>,
}

impl Config {
    /// Everything off. Configurations start from here.
    pub fn quiet(name: &'static str) -> Config {
        Config {
            name,
            start: Start::Empty,
            starts_max: 0,
            cancels_max: 0,
            acquires_max: 0,
            renewals_max: 0,
            faults_max: 0,
            anti_entropy_max: 0,
            destination_delete: false,
            heal: false,
            bug: None,
        }
    }

    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }
}

/// Where a search starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// No task yet.
    Empty,
    /// Coordinator 0's start of task 1 acknowledged by every replica; nobody runs it yet.
    Started,
}

/// Requests on the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    Read,
    /// Merge `record` in; ack if asked (repairs, cancels and final statuses use it).
    Write {
        record: TaskRecord,
        ack: bool,
    },
    /// Conditional start: accepted by a replica holding an older task number.
    Start {
        record: TaskRecord,
    },
    /// Conditional lease: accepted if the task is the same, active, and the held lease's epoch
    /// is lower.
    Lease {
        record: TaskRecord,
    },
    /// Conditional renewal: accepted if the task is the same and running, and the held lease is
    /// not newer; carries the runner's progress.
    Renew {
        record: TaskRecord,
    },
}

/// A request from a coordinator to a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub replica: u8,
    pub coordinator: u8,
    /// 1: the coordinator's current phase; 0: an older one, whose replies nobody awaits.
    pub round: u8,
    pub message: Message,
}

/// What a coordinator is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Idle,
    StartRead {
        replies: [Option<TaskRecord>; REPLICAS],
    },
    StartWrite {
        task: u8,
        acks: u8,
    },
    CancelRead {
        task: u8,
        replies: [Option<TaskRecord>; REPLICAS],
    },
    CancelWrite {
        task: u8,
        acks: u8,
    },
    AcquireRead {
        replies: [Option<TaskRecord>; REPLICAS],
    },
    AcquireWrite {
        record: TaskRecord,
        acks: u8,
    },
    /// Ghost: `superseded_before`, a takeover of this task had been acknowledged when the
    /// renewal was invoked; `cancel_acked_before`, a cancel of it had.
    RenewWrite {
        record: TaskRecord,
        superseded_before: bool,
        cancel_acked_before: bool,
        acks: u8,
    },
    /// Writing a terminal status (or, after a read finding a cancel, `Cancelled`).
    FinalWrite {
        record: TaskRecord,
        acks: u8,
    },
}

impl Op {
    fn replies_mut(&mut self) -> Option<&mut [Option<TaskRecord>; REPLICAS]> {
        match self {
            Op::StartRead { replies }
            | Op::CancelRead { replies, .. }
            | Op::AcquireRead { replies } => Some(replies),
            _ => None,
        }
    }

    fn acks_mut(&mut self) -> Option<&mut u8> {
        match self {
            Op::StartWrite { acks, .. }
            | Op::CancelWrite { acks, .. }
            | Op::AcquireWrite { acks, .. }
            | Op::RenewWrite { acks, .. }
            | Op::FinalWrite { acks, .. } => Some(acks),
            _ => None,
        }
    }
}

/// A node: its operation in progress, the task its client started, and the lease it runs under.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    pub op: Op,
    /// The task handle its client was given (the task number).
    pub handle: Option<u8>,
    /// The task record as this runner last wrote it, while it holds an acknowledged lease.
    pub running: Option<TaskRecord>,
}

/// Broken invariants, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    TwoStartsAcknowledged = 0,
    TwoRunnersOneEpoch = 1,
    SupersededLeaseMoved = 2,
    MovedAfterCancel = 3,
    ProgressWentDown = 4,
    StatusWentBack = 5,
    HealStuck = 6,
}

/// Scenarios the checker must reach, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    StartsRace = 0,
    Takeover = 1,
    /// Two runners moved messages under overlapping leases (a renewal invoked before the
    /// takeover was acknowledged): duplicates at worst.
    OverlappingRunners = 2,
    Completed = 3,
    Cancelled = 4,
    Failed = 5,
    /// An acknowledged start's record lost the merge to a racing start that was not
    /// acknowledged (spec#8 considerations).
    AcknowledgedStartOutranked = 6,
    /// A move already under way when the cancel was acknowledged finished.
    MoveFinishedAfterCancel = 7,
}

/// What only the model knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Per task number (bit index), the starters whose start was acknowledged (bitmask).
    pub starts_acked: [u8; 4],
    /// Task numbers whose cancel was acknowledged (bitmask).
    pub cancels_acked: u8,
    /// Task numbers whose cancel was written to some replica, acknowledged or not (bitmask).
    pub cancels_sent: u8,
    /// Acknowledged leases: `(task, epoch, holder)`, sorted.
    pub leases_acked: Vec<(u8, u8, u8)>,
    /// Runners that moved a message under their current lease (bitmask).
    pub moving: u8,
    pub violations: u8,
    pub scenarios: u8,
}

impl Ghost {
    fn violate(&mut self, violation: Violation) {
        self.violations |= 1 << violation as u8;
    }

    fn reach(&mut self, scenario: Scenario) {
        self.scenarios |= 1 << scenario as u8;
    }

    /// Whether `violation` happened on the way here.
    pub fn violated(&self, violation: Violation) -> bool {
        self.violations & (1 << violation as u8) != 0
    }

    /// Whether `scenario` happened on the way here.
    pub fn reached(&self, scenario: Scenario) -> bool {
        self.scenarios & (1 << scenario as u8) != 0
    }
}

/// Budget spent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Used {
    pub starts: u8,
    pub cancels: u8,
    pub acquires: u8,
    pub renewals: u8,
    pub faults: u8,
    pub anti_entropy: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub replicas: [TaskRecord; REPLICAS],
    pub coordinators: [Coordinator; COORDINATORS],
    /// Sorted multiset.
    pub network: Vec<Packet>,
    /// Messages still in the source queue (each move is atomic here).
    pub messages_left: u8,
    pub destination_exists: bool,
    pub used: Used,
    pub ghost: Ghost,
    pub healed: bool,
}

impl State {
    /// The initial states of `config.start`.
    pub fn initial(config: &Config) -> State {
        let idle = Coordinator {
            op: Op::Idle,
            handle: None,
            running: None,
        };
        let mut state = State {
            replicas: [TaskRecord::default(); REPLICAS],
            coordinators: [idle.clone(), idle],
            network: Vec::new(),
            messages_left: MESSAGES,
            destination_exists: true,
            used: Used::default(),
            ghost: Ghost::default(),
            healed: false,
        };
        if config.start == Start::Started {
            let record = State::new_task(1, 0, MESSAGES);
            state.replicas = [record; REPLICAS];
            state.coordinators[0].handle = Some(1);
            state.ghost.starts_acked[1] = bit(0);
        }
        state
    }

    fn new_task(task: u8, starter: u8, to_move: u8) -> TaskRecord {
        TaskRecord {
            task,
            starter,
            status: Status::Running,
            lease: Lease::default(),
            moved: [0; COORDINATORS],
            to_move,
        }
    }

    /// The join of every replica's record under the correct merge: what the cluster knows.
    pub fn joined(&self) -> TaskRecord {
        let correct = Config::quiet("join");
        self.replicas
            .iter()
            .fold(TaskRecord::default(), |joined, record| {
                joined.merge(*record, &correct)
            })
    }

    fn push(&mut self, packet: Packet) {
        push_sorted(&mut self.network, packet);
    }

    fn broadcast(&mut self, c: usize, message: Message) {
        for replica in 0..REPLICAS {
            self.push(Packet {
                replica: replica as u8,
                coordinator: c as u8,
                round: 1,
                message,
            });
        }
    }

    /// Enters `op` in a new round: packets of the previous round become old.
    fn begin(&mut self, c: usize, op: Op) {
        self.retire_round(c);
        self.coordinators[c].op = op;
    }

    fn finish(&mut self, c: usize) {
        self.retire_round(c);
        self.coordinators[c].op = Op::Idle;
    }

    fn retire_round(&mut self, c: usize) {
        let network = std::mem::take(&mut self.network);
        for mut packet in network {
            if packet.coordinator as usize == c && packet.round == 1 {
                if matches!(packet.message, Message::Read) {
                    continue;
                }
                packet.round = 0;
                packet.coordinator = 0;
            }
            self.push(packet);
        }
    }

    fn store(&mut self, config: &Config, r: usize, incoming: TaskRecord) {
        let held = self.replicas[r];
        let new = held.merge(incoming, config);
        if held.key() == new.key() {
            if new.status < held.status {
                self.ghost.violate(Violation::StatusWentBack);
            }
            if new.moved.iter().zip(held.moved).any(|(n, h)| *n < h) {
                self.ghost.violate(Violation::ProgressWentDown);
            }
        }
        self.replicas[r] = new;
    }

    // ----- clients and runners ----------------------------------------------------------------

    /// A client starts a task through `c` (StartMessageMoveTask).
    pub fn start_task(&mut self, c: usize) {
        self.used.starts += 1;
        self.begin(
            c,
            Op::StartRead {
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(c, Message::Read);
    }

    /// `c`'s client cancels the task it started (CancelMessageMoveTask with its handle).
    pub fn cancel_task(&mut self, c: usize) {
        let task = self.coordinators[c]
            .handle
            .expect("cancel is enabled only with a handle");
        self.used.cancels += 1;
        self.begin(
            c,
            Op::CancelRead {
                task,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(c, Message::Read);
    }

    /// `c` looks for a task that needs a runner (on start, at restart, or when it finds the
    /// lease expired by its clock: time is abstract, so any lease may have expired).
    pub fn acquire(&mut self, c: usize) {
        self.used.acquires += 1;
        self.coordinators[c].running = None;
        self.ghost.moving &= !bit(c);
        self.begin(
            c,
            Op::AcquireRead {
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(c, Message::Read);
    }

    /// The runner renews its lease, carrying its progress, before its next message move.
    pub fn renew(&mut self, c: usize) {
        let record = self.coordinators[c]
            .running
            .expect("renew is enabled only for a runner");
        self.used.renewals += 1;
        let superseded_before = self
            .ghost
            .leases_acked
            .iter()
            .any(|(task, epoch, _)| *task == record.task && *epoch > record.lease.epoch);
        let cancel_acked_before = self.ghost.cancels_acked & bit(record.task as usize) != 0;
        self.begin(
            c,
            Op::RenewWrite {
                record,
                superseded_before,
                cancel_acked_before,
                acks: 0,
            },
        );
        self.broadcast(c, Message::Renew { record });
    }

    /// The coordinator times out (or crashes) in a write phase; a runner loses its lease.
    pub fn abandon(&mut self, c: usize) {
        self.coordinators[c].running = None;
        self.ghost.moving &= !bit(c);
        self.finish(c);
    }

    /// The destination queue is deleted (DeleteQueue on it) while the task runs.
    pub fn delete_destination(&mut self) {
        self.destination_exists = false;
    }

    /// Replicas `a` and `b` exchange their records and both keep the merge.
    pub fn anti_entropy(&mut self, config: &Config, a: usize, b: usize) {
        let (ra, rb) = (self.replicas[a], self.replicas[b]);
        self.store(config, a, rb);
        self.store(config, b, ra);
    }

    /// Drops the packet at `index` (a fault).
    pub fn drop_packet(&mut self, index: usize) {
        self.used.faults += 1;
        self.network.remove(index);
    }

    /// Duplicates the packet at `index` (a fault).
    pub fn duplicate_packet(&mut self, index: usize) {
        self.used.faults += 1;
        let packet = self.network[index];
        self.push(packet);
    }

    // ----- replicas ---------------------------------------------------------------------------

    /// Delivers the packet at `index`; the reply (if any) reaches its coordinator at once.
    pub fn deliver(&mut self, config: &Config, index: usize) {
        let packet = self.network.remove(index);
        let r = packet.replica as usize;
        let held = self.replicas[r];
        let same = |record: &TaskRecord| held.key() == record.key();
        let ack = match packet.message {
            Message::Read => {
                self.on_read(config, &packet, held);
                return;
            }
            Message::Write { record, ack } => {
                self.store(config, r, record);
                ack
            }
            Message::Start { record } => {
                // Strictly older only: a replica that holds this very task, even one it got from
                // a peer, must not ack it again (spec#8, what the checker showed).
                let accept = held.task < record.task || config.has(Bug::StartWithoutCompareAndSet);
                if accept {
                    self.store(config, r, record);
                }
                accept
            }
            Message::Lease { record } => {
                let newer = if config.has(Bug::LeaseEpochNotStrict) {
                    held.lease.epoch <= record.lease.epoch && held.lease != record.lease
                } else {
                    held.lease.epoch < record.lease.epoch
                };
                let accept = same(&record) && held.status.active() && newer;
                if accept {
                    self.store(config, r, record);
                }
                accept
            }
            Message::Renew { record } => {
                let status_ok = if config.has(Bug::RenewalIgnoresCancel) {
                    held.status.active()
                } else {
                    held.status == Status::Running
                };
                let lease_ok = held.lease <= record.lease || config.has(Bug::RenewalIgnoresEpoch);
                let accept = same(&record) && status_ok && lease_ok;
                if accept {
                    self.store(config, r, record);
                }
                accept
            }
        };
        if ack {
            self.on_ack(config, &packet);
        }
    }

    // ----- coordinators -----------------------------------------------------------------------

    fn on_read(&mut self, config: &Config, packet: &Packet, record: TaskRecord) {
        let c = packet.coordinator as usize;
        if packet.round != 1 {
            return;
        }
        let mut op = self.coordinators[c].op;
        let Some(replies) = op.replies_mut() else {
            return;
        };
        replies[packet.replica as usize] = Some(record);
        let have = replies.iter().flatten().count();
        let replies = *replies;
        self.coordinators[c].op = op;
        if have < QUORUM {
            return;
        }
        let mut merged = TaskRecord::default();
        for record in replies.iter().flatten() {
            merged = merged.merge(*record, config);
        }
        for (r, reply) in replies.iter().enumerate() {
            if let Some(record) = reply
                && *record != merged
            {
                self.push(Packet {
                    replica: r as u8,
                    coordinator: 0,
                    round: 0,
                    message: Message::Write {
                        record: merged,
                        ack: false,
                    },
                });
            }
        }
        self.decide(config, c, merged);
    }

    /// A read phase has its quorum; `merged` is the join of the replies.
    fn decide(&mut self, _config: &Config, c: usize, merged: TaskRecord) {
        match self.coordinators[c].op {
            Op::StartRead { .. } => {
                if merged.status.active() {
                    // One active task per source: AWS answers that a task is already running.
                    self.finish(c);
                    return;
                }
                let record = State::new_task(merged.task + 1, c as u8, self.messages_left);
                self.begin(
                    c,
                    Op::StartWrite {
                        task: record.task,
                        acks: 0,
                    },
                );
                self.broadcast(c, Message::Start { record });
            }
            Op::CancelRead { task, .. } => {
                // Only a running task of this handle is cancelled (AWS: only RUNNING).
                if merged.task == task && merged.status == Status::Running {
                    let record = TaskRecord {
                        status: Status::Cancelling,
                        ..merged
                    };
                    self.ghost.cancels_sent |= bit(task as usize);
                    self.begin(c, Op::CancelWrite { task, acks: 0 });
                    self.broadcast(c, Message::Write { record, ack: true });
                } else {
                    self.finish(c);
                }
            }
            Op::AcquireRead { .. } => match merged.status {
                Status::Running => {
                    let record = TaskRecord {
                        lease: Lease {
                            epoch: merged.lease.epoch + 1,
                            holder: c as u8,
                        },
                        ..merged
                    };
                    self.begin(c, Op::AcquireWrite { record, acks: 0 });
                    self.broadcast(c, Message::Lease { record });
                }
                Status::Cancelling => {
                    // The cancel stops the task: whoever finds it ends it.
                    self.final_write(c, merged, Status::Cancelled);
                }
                _ => self.finish(c),
            },
            _ => unreachable!("decide is called only in read phases"),
        }
    }

    fn final_write(&mut self, c: usize, record: TaskRecord, status: Status) {
        let record = TaskRecord { status, ..record };
        self.begin(c, Op::FinalWrite { record, acks: 0 });
        self.broadcast(c, Message::Write { record, ack: true });
    }

    fn on_ack(&mut self, config: &Config, packet: &Packet) {
        let c = packet.coordinator as usize;
        if packet.round != 1 {
            return;
        }
        let mut op = self.coordinators[c].op;
        let Some(acks) = op.acks_mut() else {
            return;
        };
        *acks |= bit(packet.replica as usize);
        let have = acks.count_ones() as usize;
        self.coordinators[c].op = op;
        if have >= QUORUM {
            self.complete(config, c);
        }
    }

    /// A write phase has its quorum.
    fn complete(&mut self, config: &Config, c: usize) {
        match self.coordinators[c].op {
            Op::StartWrite { task, .. } => {
                if self.ghost.starts_acked[task as usize] & !bit(c) != 0 {
                    self.ghost.violate(Violation::TwoStartsAcknowledged);
                }
                self.ghost.starts_acked[task as usize] |= bit(c);
                self.coordinators[c].handle = Some(task);
                self.finish(c);
            }
            Op::CancelWrite { task, .. } => {
                self.ghost.cancels_acked |= bit(task as usize);
                self.finish(c);
            }
            Op::AcquireWrite { record, .. } => {
                let lease = (record.task, record.lease.epoch, record.lease.holder);
                let leases = &self.ghost.leases_acked;
                let twice = leases
                    .iter()
                    .any(|(t, e, h)| (*t, *e) == (lease.0, lease.1) && *h != lease.2);
                let takeover = leases.iter().any(|(t, e, _)| *t == lease.0 && *e < lease.1)
                    && self.coordinators[1 - c].running.is_some();
                if twice {
                    self.ghost.violate(Violation::TwoRunnersOneEpoch);
                }
                if takeover {
                    self.ghost.reach(Scenario::Takeover);
                }
                let leases = &mut self.ghost.leases_acked;
                leases.push(lease);
                leases.sort();
                leases.dedup();
                self.coordinators[c].running = Some(record);
                self.finish(c);
            }
            Op::RenewWrite {
                record,
                superseded_before,
                cancel_acked_before,
                ..
            } => self.move_one(config, c, record, superseded_before, cancel_acked_before),
            Op::FinalWrite { record, .. } => {
                match record.status {
                    Status::Completed => self.ghost.reach(Scenario::Completed),
                    Status::Cancelled => self.ghost.reach(Scenario::Cancelled),
                    Status::Failed => self.ghost.reach(Scenario::Failed),
                    _ => unreachable!("only terminal statuses are final"),
                }
                self.coordinators[c].running = None;
                self.ghost.moving &= !bit(c);
                self.finish(c);
            }
            _ => unreachable!("complete is called only in write phases"),
        }
    }

    /// The renewal was acknowledged: the runner moves one message (atomically here; part 1's
    /// redrive is the move), or ends the task.
    fn move_one(
        &mut self,
        config: &Config,
        c: usize,
        record: TaskRecord,
        superseded_before: bool,
        cancel_acked_before: bool,
    ) {
        if !self.destination_exists {
            // The move's copy is refused (QueueDoesNotExist): the message stays in the source,
            // and the task fails, saying why.
            if config.has(Bug::FailureNotRecorded) {
                self.coordinators[c].running = None;
                self.ghost.moving &= !bit(c);
                self.finish(c);
            } else {
                self.final_write(c, record, Status::Failed);
            }
            return;
        }
        if self.messages_left == 0 {
            self.final_write(c, record, Status::Completed);
            return;
        }
        if superseded_before {
            self.ghost.violate(Violation::SupersededLeaseMoved);
        }
        if cancel_acked_before {
            self.ghost.violate(Violation::MovedAfterCancel);
        } else if self.ghost.cancels_acked & bit(record.task as usize) != 0 {
            self.ghost.reach(Scenario::MoveFinishedAfterCancel);
        }
        self.messages_left -= 1;
        let mut record = record;
        record.moved[c] += 1;
        self.coordinators[c].running = Some(record);
        self.ghost.moving |= bit(c);
        if self.ghost.moving == 0b11 {
            self.ghost.reach(Scenario::OverlappingRunners);
        }
        self.finish(c);
    }

    /// Removes packets that can change nothing (reads of a left round) and sorts the ghost.
    pub fn normalize(&mut self) {
        self.ghost.leases_acked.sort();
        for c in 0..COORDINATORS {
            if matches!(self.coordinators[c].op, Op::Idle) {
                self.retire_round(c);
            }
        }
        // Two racing starts that were both written, one acknowledged, the other winning.
        let outranked = self
            .ghost
            .starts_acked
            .iter()
            .enumerate()
            .any(|(task, acked)| {
                *acked != 0
                    && self
                        .replicas
                        .iter()
                        .any(|r| r.task == task as u8 && *acked & bit(r.starter as usize) == 0)
            });
        if outranked {
            self.ghost.reach(Scenario::AcknowledgedStartOutranked);
        }
        if let (Op::StartWrite { task: a, .. }, Op::StartWrite { task: b, .. }) =
            (self.coordinators[0].op, self.coordinators[1].op)
            && a == b
        {
            self.ghost.reach(Scenario::StartsRace);
        }
    }

    // ----- heal -------------------------------------------------------------------------------

    /// Faults stop: packets in flight are delivered (or all lost), operations left waiting time
    /// out, anti-entropy runs until nothing changes, then coordinator 0 runs the task to its end.
    pub fn heal(&mut self, config: &Config, deliver_pending: bool) {
        let mut steps = 0u32;
        if !deliver_pending {
            self.network.clear();
        }
        self.heal_network(config, &mut steps);
        self.heal_anti_entropy(config, &mut steps);
        // Acquire, then renew and move until the runner lets go (final status or refusal).
        for _ in 0..(MESSAGES + 4) {
            if !self.joined().status.active() {
                break;
            }
            if self.coordinators[0].running.is_none() {
                self.acquire(0);
            } else {
                self.renew(0);
            }
            self.heal_network(config, &mut steps);
            self.heal_anti_entropy(config, &mut steps);
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

    fn heal_anti_entropy(&mut self, config: &Config, steps: &mut u32) {
        loop {
            let mut changed = false;
            for a in 0..REPLICAS {
                for b in a + 1..REPLICAS {
                    let before = (self.replicas[a], self.replicas[b]);
                    self.anti_entropy(config, a, b);
                    if (self.replicas[a], self.replicas[b]) != before {
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

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Deliver(u8),
    Drop(u8),
    Duplicate(u8),
    Abandon(u8),
    Start(u8),
    Cancel(u8),
    Acquire(u8),
    Renew(u8),
    DeleteDestination,
    AntiEntropy { a: u8, b: u8 },
    Heal { deliver_pending: bool },
}

/// The move-task model under one configuration.
#[derive(Clone, Debug)]
pub struct MoveTaskModel {
    pub config: Config,
}

impl Model for MoveTaskModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.config)]
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
            let coordinator = &state.coordinators[c];
            let mut op = coordinator.op;
            if op.acks_mut().is_some() {
                actions.push(Action::Abandon(c as u8));
            }
            if !matches!(op, Op::Idle) {
                continue;
            }
            if used.starts < config.starts_max {
                actions.push(Action::Start(c as u8));
            }
            if used.cancels < config.cancels_max && coordinator.handle.is_some() {
                actions.push(Action::Cancel(c as u8));
            }
            if used.acquires < config.acquires_max {
                actions.push(Action::Acquire(c as u8));
            }
            if used.renewals < config.renewals_max && coordinator.running.is_some() {
                actions.push(Action::Renew(c as u8));
            }
        }
        if config.destination_delete && state.destination_exists {
            actions.push(Action::DeleteDestination);
        }
        if used.anti_entropy < config.anti_entropy_max {
            for a in 0..REPLICAS {
                for b in a + 1..REPLICAS {
                    if state.replicas[a] != state.replicas[b] {
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
            Action::Drop(i) => state.drop_packet(i as usize),
            Action::Duplicate(i) => state.duplicate_packet(i as usize),
            Action::Abandon(c) => state.abandon(c as usize),
            Action::Start(c) => state.start_task(c as usize),
            Action::Cancel(c) => state.cancel_task(c as usize),
            Action::Acquire(c) => state.acquire(c as usize),
            Action::Renew(c) => state.renew(c as usize),
            Action::DeleteDestination => state.delete_destination(),
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
            || (used.starts <= config.starts_max
                && used.cancels <= config.cancels_max
                && used.acquires <= config.acquires_max
                && used.renewals <= config.renewals_max
                && used.faults <= config.faults_max
                && used.anti_entropy <= config.anti_entropy_max)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one start acknowledged per task number",
                |_, s: &State| !s.ghost.violated(Violation::TwoStartsAcknowledged),
            ),
            Property::always(
                "at most one runner acquires each lease epoch",
                |_, s: &State| !s.ghost.violated(Violation::TwoRunnersOneEpoch),
            ),
            Property::always(
                "a superseded lease never moves a message",
                |_, s: &State| !s.ghost.violated(Violation::SupersededLeaseMoved),
            ),
            Property::always(
                "no move starts after an acknowledged cancel",
                |_, s: &State| !s.ghost.violated(Violation::MovedAfterCancel),
            ),
            Property::always("progress never goes down", |_, s: &State| {
                !s.ghost.violated(Violation::ProgressWentDown)
            }),
            Property::always("status never goes back", |_, s: &State| {
                !s.ghost.violated(Violation::StatusWentBack)
            }),
            Property::always("after heal, the task ended and says why", |_, s: &State| {
                !s.healed || ended_with_reason(s)
            }),
            Property::sometimes("two starts race for one task number", |_, s: &State| {
                s.ghost.reached(Scenario::StartsRace)
            }),
            Property::sometimes(
                "an acknowledged start outranked by one that was not",
                |_, s: &State| s.ghost.reached(Scenario::AcknowledgedStartOutranked),
            ),
            Property::sometimes(
                "a runner takes over a live runner's task",
                |_, s: &State| s.ghost.reached(Scenario::Takeover),
            ),
            Property::sometimes(
                "two runners move under overlapping leases",
                |_, s: &State| s.ghost.reached(Scenario::OverlappingRunners),
            ),
            Property::sometimes("task completed", |_, s: &State| {
                s.ghost.reached(Scenario::Completed)
            }),
            Property::sometimes("task cancelled", |_, s: &State| {
                s.ghost.reached(Scenario::Cancelled)
            }),
            Property::sometimes(
                "a move under way when the cancel was acknowledged finished",
                |_, s: &State| s.ghost.reached(Scenario::MoveFinishedAfterCancel),
            ),
            Property::sometimes("task failed: destination deleted", |_, s: &State| {
                s.ghost.reached(Scenario::Failed)
            }),
            Property::sometimes("heal ran to its end", |_, s: &State| s.healed),
        ]
    }
}

/// After the heal: every replica holds one record, and a started task is terminal with the
/// status its history explains: completed only if the source is empty, cancelled only if a cancel
/// was written, failed only if the destination is gone (so a deleted destination with messages
/// left ends the task failed, or cancelled if a cancel came first).
fn ended_with_reason(s: &State) -> bool {
    let joined = s.joined();
    let converged = s.replicas.iter().all(|r| *r == joined)
        && s.network.is_empty()
        && !s.ghost.violated(Violation::HealStuck);
    let explained = match joined.status {
        Status::None => true,
        Status::Running | Status::Cancelling => false,
        Status::Completed => s.messages_left == 0,
        Status::Cancelled => s.ghost.cancels_sent & bit(joined.task as usize) != 0,
        Status::Failed => !s.destination_exists,
    };
    converged && explained
}
