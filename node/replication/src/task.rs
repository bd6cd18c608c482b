//! Move tasks that survive restarts and run once across the cluster (spec/replication.md §8):
//! the task record a replica stores for one source queue and its merge, what a replica accepts
//! of the conditional start, lease and renewal, the quorum read and write a coordinator runs
//! against the record's three replicas, and the decisions of the client's actions and of the
//! runner (start, cancel, acquire or take over, renew, move, end) as functions of their inputs.
//!
//! Every merge rule is a max, so the record's merge is a join: read repair and anti-entropy
//! carry task records as they carry messages. A runner's move of one message is section 7's
//! redrive (`coordinator::RedriveOp`); nothing here moves a message. Like the rest of the
//! crate, this module never reads a clock, draws randomness or touches the network: time, the
//! runner's id and nonces come in as values, requests go out as data.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use trireme_core::{Incarnation, Millis, QueueName, QueuePrefixes};

use crate::coordinator::{Effects, READ_QUORUM, WRITE_QUORUM};
use crate::ids::NodeId;
use crate::placement::REPLICAS;

/// How long a lease lasts past its last renewal (`TASK_LEASE`).
pub const TASK_LEASE_MS: u64 = 30_000;
/// The clock skew tolerated between two nodes (`SKEW_MAX`): a takeover waits it past the
/// holder's deadline, and a runner stops moving it before its own.
pub const SKEW_MAX_MS: u64 = 500;
/// Tasks of one source the record keeps, the current one included (`TASK_HISTORY_MAX`: what
/// `ListMessageMoveTasks` can return).
pub const TASK_HISTORY_MAX: usize = 10;
/// Messages a runner moves under one renewal at most (`TASK_RENEW_EVERY`).
pub const TASK_BATCH_MAX: u32 = 10;

const _: () = assert!(SKEW_MAX_MS * 4 < TASK_LEASE_MS);

/// Bytes of an incarnation in a task key: `hlc_ms`, `node`, `nonce`.
const INCARNATION_BYTES: usize = 8 + 2 + 8;

/// Which task record: the one of a source queue's creation (spec §8, *The task record*). It is
/// placed on the three replicas of the source's name record (section 1), so a pair compares it
/// with the names it shares.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskKey {
    /// The source (a dead-letter queue).
    pub queue: QueueName,
    /// Which creation of it: a task never outlives its source.
    pub incarnation: Incarnation,
}

impl TaskKey {
    /// The stored form: name length (u8) and name, then the incarnation's `hlc_ms` (u64 BE),
    /// `node` (u16 BE) and `nonce` (u64 BE): byte order is `(name length, name, incarnation)`
    /// order.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let name = self.queue.as_str().as_bytes();
        let mut bytes = Vec::with_capacity(1 + name.len() + INCARNATION_BYTES);
        bytes.push(u8::try_from(name.len()).expect("queue names are at most 80 bytes"));
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(&self.incarnation.hlc_ms.to_be_bytes());
        bytes.extend_from_slice(&self.incarnation.node.to_be_bytes());
        bytes.extend_from_slice(&self.incarnation.nonce.to_be_bytes());
        bytes
    }

    /// The key of stored bytes, `None` if they are not a task key's encoding.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<TaskKey> {
        let (&len, rest) = bytes.split_first()?;
        let (name, rest) = rest.split_at_checked(usize::from(len))?;
        let (hlc_ms, rest) = rest.split_at_checked(8)?;
        let (node, nonce) = rest.split_at_checked(2)?;
        let key = TaskKey {
            queue: QueueName::try_from(String::from_utf8(name.to_vec()).ok()?).ok()?,
            incarnation: Incarnation {
                hlc_ms: u64::from_be_bytes(hlc_ms.try_into().ok()?),
                node: u16::from_be_bytes(node.try_into().ok()?),
                nonce: u64::from_be_bytes(nonce.try_into().ok()?),
            },
        };
        (key.encode() == bytes).then_some(key)
    }
}

/// The task handle a start answers: the source, its incarnation and the task's number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskHandle {
    /// The record.
    pub key: TaskKey,
    /// The task's number within it.
    pub task: u32,
}

impl TaskHandle {
    /// The handle as clients see it: `task.hlc_ms.node.nonce.queue`, numbers in decimal (the
    /// queue name comes last, so a name holding a dot still parses).
    #[must_use]
    pub fn encode(&self) -> String {
        let incarnation = self.key.incarnation;
        format!(
            "{}.{}.{}.{}.{}",
            self.task, incarnation.hlc_ms, incarnation.node, incarnation.nonce, self.key.queue
        )
    }

    /// The handle `text` encodes, `None` if it is not one (a handle of a node running alone,
    /// or made up).
    #[must_use]
    pub fn decode(text: &str) -> Option<TaskHandle> {
        let mut parts = text.splitn(5, '.');
        let task = parts.next()?.parse().ok()?;
        let hlc_ms = parts.next()?.parse().ok()?;
        let node = parts.next()?.parse().ok()?;
        let nonce = parts.next()?.parse().ok()?;
        let queue = QueueName::try_from(parts.next()?.to_owned()).ok()?;
        let handle = TaskHandle {
            key: TaskKey {
                queue,
                incarnation: Incarnation {
                    hlc_ms,
                    node,
                    nonce,
                },
            },
            task,
        };
        (task > 0 && handle.encode() == text).then_some(handle)
    }
}

/// The start that wrote a task: its coordinator and a nonce it drew. Orders two starts that
/// raced for one number (spec §8, *An acknowledged start can be outranked*).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Starter {
    /// The start's coordinator.
    pub coordinator: NodeId,
    /// Drawn by it for the start.
    pub nonce: u64,
}

/// A named destination: the queue and the creation of it the start found.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Destination {
    /// The queue's name.
    pub name: QueueName,
    /// Which creation of it: a destination deleted (or deleted and created again) fails the
    /// task.
    pub incarnation: Incarnation,
}

/// What the start wrote once: the task's parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskParams {
    /// Where every message goes; `None`: each back to its own source queue.
    pub destination: Option<Destination>,
    /// Messages per second asked for; `None`: as fast as the runner goes.
    pub rate_per_s: Option<u32>,
    /// The start's clock.
    pub started_at: Millis,
    /// The source's approximate count of ready messages at the start
    /// (`ApproximateNumberOfMessagesToMove`).
    pub to_move: u64,
    /// The restriction of the access key that started the task; `None`: unrestricted. A runner
    /// moves a message only into a queue within it (spec §8, *Fail*; spec/queue-core.md, *A
    /// move task moves only into queues its starter may reach*).
    pub allowed: Option<QueuePrefixes>,
}

/// Why a task failed (`FailureReason`); the order decides which of two a merge keeps.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FailureReason {
    /// The named destination's creation is gone.
    DestinationDeleted {
        /// The destination.
        name: QueueName,
    },
    /// The source (the dead-letter queue) itself was deleted.
    SourceDeleted {
        /// The source.
        name: QueueName,
    },
}

/// Where a task is in its life, in merge order: `RUNNING < CANCELLING < COMPLETED < CANCELLED <
/// FAILED` (spec §8, *Terminal order*), the reason riding with `FAILED`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskStatus {
    /// Moving messages.
    Running,
    /// A cancel was acknowledged; whoever finds it writes `Cancelled`.
    Cancelling,
    /// The runner found nothing more of what the task was to move.
    Completed,
    /// Ended by a cancel.
    Cancelled,
    /// Ended by a failure.
    Failed(FailureReason),
}

impl TaskStatus {
    /// Running or cancelling: the task needs a runner, and no new task of its source may start.
    #[must_use]
    pub fn active(&self) -> bool {
        matches!(self, TaskStatus::Running | TaskStatus::Cancelling)
    }
}

/// A runner's lease, ordered by `epoch` (one more at every acquisition), then holder, then the
/// renewal counter (and the deadline, which rides with the counter): a claim and its change
/// counter (section 5) applied to the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lease {
    /// Acquisitions of this task so far, from 1.
    pub epoch: u32,
    /// The runner.
    pub holder: NodeId,
    /// Renewals under this epoch (0 at the acquisition).
    pub counter: u32,
    /// Until when the holder may move, by its own clock.
    pub deadline: Millis,
}

/// One task of a source: what its start wrote, and what its runners and cancels made of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Task {
    /// The start that wrote it.
    pub starter: Starter,
    /// Written once by that start.
    pub params: TaskParams,
    /// The greatest status written.
    pub status: TaskStatus,
    /// The greatest lease written; `None`: never acquired.
    pub lease: Option<Lease>,
    /// Messages moved, per runner, each merged by max (a grow-only counter: two overlapping
    /// runners' moves both count).
    pub moved: BTreeMap<NodeId, u64>,
    /// Messages that could not be moved (their own source queue is missing), per runner, each
    /// merged by max.
    pub failed: BTreeMap<NodeId, u64>,
}

fn max_counts(a: &BTreeMap<NodeId, u64>, b: &BTreeMap<NodeId, u64>) -> BTreeMap<NodeId, u64> {
    let mut joined = a.clone();
    for (node, count) in b {
        let held = joined.entry(*node).or_insert(0);
        *held = (*held).max(*count);
    }
    joined
}

impl Task {
    /// A task just started: running, never leased, nothing moved.
    #[must_use]
    pub fn started(starter: Starter, params: TaskParams) -> Task {
        Task {
            starter,
            params,
            status: TaskStatus::Running,
            lease: None,
            moved: BTreeMap::new(),
            failed: BTreeMap::new(),
        }
    }

    /// Messages moved, as `ApproximateNumberOfMessagesMoved` reports them.
    #[must_use]
    pub fn moved_total(&self) -> u64 {
        self.moved.values().sum()
    }

    /// Messages that could not be moved.
    #[must_use]
    pub fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    /// The join of two copies of one task number: the greater starter wins whole; within one
    /// start, the greater status, the greater lease, each runner's greater counts.
    #[must_use]
    pub fn merge(&self, other: &Task) -> Task {
        match self.starter.cmp(&other.starter) {
            std::cmp::Ordering::Greater => return self.clone(),
            std::cmp::Ordering::Less => return other.clone(),
            std::cmp::Ordering::Equal => {}
        }
        Task {
            starter: self.starter,
            // One start writes its parameters once; the greater keeps the merge a join even
            // if a writer broke that.
            params: self.params.clone().max(other.params.clone()),
            status: self.status.clone().max(other.status.clone()),
            lease: self.lease.max(other.lease),
            moved: max_counts(&self.moved, &other.moved),
            failed: max_counts(&self.failed, &other.failed),
        }
    }
}

/// The task record of one source on one replica: its tasks by number (from 1), the newest
/// [`TASK_HISTORY_MAX`] of them. The newest is the current task; the others are its history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Tasks by number.
    pub tasks: BTreeMap<u32, Task>,
}

impl TaskRecord {
    /// The current task and its number, if any was started.
    #[must_use]
    pub fn current(&self) -> Option<(u32, &Task)> {
        self.tasks.iter().next_back().map(|(n, task)| (*n, task))
    }

    /// How many tasks were started for this source (the current task's number; 0: none).
    #[must_use]
    pub fn number(&self) -> u32 {
        self.current().map_or(0, |(n, _)| n)
    }

    /// The tasks, newest first (what `ListMessageMoveTasks` returns).
    pub fn newest_first(&self) -> impl Iterator<Item = (u32, &Task)> {
        self.tasks.iter().rev().map(|(n, task)| (*n, task))
    }

    /// The join of `self` and `incoming`: every task number either knows, each merged as
    /// [`Task::merge`], the newest [`TASK_HISTORY_MAX`] kept. A task dropped from the newest
    /// is below them in every later merge too, so dropping it keeps the merge a join.
    #[must_use]
    pub fn merge(&self, incoming: &TaskRecord) -> TaskRecord {
        let mut tasks = self.tasks.clone();
        for (n, task) in &incoming.tasks {
            let joined = match tasks.get(n) {
                Some(held) => held.merge(task),
                None => task.clone(),
            };
            tasks.insert(*n, joined);
        }
        while tasks.len() > TASK_HISTORY_MAX {
            tasks.pop_first();
        }
        TaskRecord { tasks }
    }

    /// Whether `self` already holds everything `other` knows.
    #[must_use]
    pub fn covers(&self, other: &TaskRecord) -> bool {
        self.merge(other) == *self
    }

    /// This record with its current task replaced by `task` (the same number).
    fn with_current(&self, task: Task) -> TaskRecord {
        let n = self.number();
        assert!(n > 0, "only a started task is changed");
        let mut record = self.clone();
        record.tasks.insert(n, task);
        record
    }
}

// ----- the replica ----------------------------------------------------------------------------

/// A write a coordinator asks a task record's replica to make (spec §8, *Actions*).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskWrite {
    /// Merge the record in: a cancel, a final status, read repair, anti-entropy.
    Merge(TaskRecord),
    /// Conditional start: accepted only by a replica holding a strictly lower task number
    /// (not by one that holds this very task, even from a peer: spec §8, what the checker
    /// showed).
    Start(TaskRecord),
    /// Conditional lease: accepted only if the replica's current task is the record's (same
    /// number and starter), active, and its lease's epoch strictly lower.
    Lease(TaskRecord),
    /// Conditional renewal, carrying the runner's counts: accepted only if the replica's
    /// current task is the record's, `RUNNING`, and its lease not newer than the runner's.
    Renew(TaskRecord),
}

impl TaskWrite {
    /// Why this write could not have come from a coordinator of this protocol, if it could not:
    /// a conditional start, lease or renewal carries the task it is about. A peer's write is
    /// checked with this where it is decoded (the node's wire), so [`accept_task`] may assert
    /// it.
    #[must_use]
    pub fn malformed(&self) -> Option<&'static str> {
        match self {
            TaskWrite::Merge(_) => None,
            TaskWrite::Start(record) | TaskWrite::Lease(record) | TaskWrite::Renew(record) => {
                record
                    .current()
                    .is_none()
                    .then_some("a conditional task write carries no task")
            }
        }
    }
}

/// What a replica does with one task write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskVerdict {
    /// Accepted: persist this, then ack.
    Store(TaskRecord),
    /// Accepted, and the replica already holds it: ack once what it holds is durable.
    Unchanged,
    /// Refused.
    Refused,
}

impl TaskVerdict {
    /// Whether the coordinator gets an ack.
    #[must_use]
    pub fn acks(&self) -> bool {
        matches!(self, TaskVerdict::Store(_) | TaskVerdict::Unchanged)
    }
}

/// The incoming record's current task, which a conditional write is about.
fn about(record: &TaskRecord) -> (u32, &Task) {
    record
        .current()
        .expect("a conditional task write carries the task it is about")
}

/// Whether `held`'s current task is `(n, task)`'s: same number and same start.
fn same_task<'a>(held: &'a TaskRecord, n: u32, task: &Task) -> Option<&'a Task> {
    held.current()
        .filter(|(held_n, held_task)| *held_n == n && held_task.starter == task.starter)
        .map(|(_, held_task)| held_task)
}

/// Decides `write` against `held`, what the replica holds for the key (`None`: nothing).
#[must_use]
pub fn accept_task(held: Option<&TaskRecord>, write: &TaskWrite) -> TaskVerdict {
    let empty = TaskRecord::default();
    let held_record = held.unwrap_or(&empty);
    let (accepted, record) = match write {
        TaskWrite::Merge(record) => (true, record),
        TaskWrite::Start(record) => {
            let (n, _) = about(record);
            (held_record.number() < n, record)
        }
        TaskWrite::Lease(record) => {
            let (n, task) = about(record);
            let epoch = |task: &Task| task.lease.map_or(0, |lease| lease.epoch);
            let accepted = same_task(held_record, n, task)
                .is_some_and(|held| held.status.active() && epoch(held) < epoch(task));
            (accepted, record)
        }
        TaskWrite::Renew(record) => {
            let (n, task) = about(record);
            let accepted = same_task(held_record, n, task)
                .is_some_and(|held| held.status == TaskStatus::Running && held.lease <= task.lease);
            (accepted, record)
        }
    };
    if !accepted {
        return TaskVerdict::Refused;
    }
    let merged = held_record.merge(record);
    if held == Some(&merged) {
        TaskVerdict::Unchanged
    } else {
        TaskVerdict::Store(merged)
    }
}

// ----- requests and the two quorum operations --------------------------------------------------

/// What a coordinator asks a task record's replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskRequest {
    /// Answer with what you hold.
    Read,
    /// Make this write; `ack: false` for read repair, which nobody waits for.
    Write {
        /// The write.
        write: Box<TaskWrite>,
        /// Whether the coordinator waits for the ack.
        ack: bool,
    },
}

/// What a task record's replica answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskReply {
    /// What it holds (after its fsync), for a read.
    Record(Option<TaskRecord>),
    /// The write is durable.
    Ack,
    /// The write was refused (a condition, not a replica of the record, too old).
    Refused,
}

/// One request to one replica of a task record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskOutgoing {
    /// The replica.
    pub to: NodeId,
    /// The record.
    pub key: TaskKey,
    /// 1 for the operation's requests, 0 for read repairs nobody awaits.
    pub round: u32,
    /// What it is asked.
    pub request: TaskRequest,
}

const ROUND: u32 = 1;

/// The answer of a quorum read of a task record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskReadAnswer {
    /// The join of the first two replies (empty when neither held one).
    Read(TaskRecord),
    /// Fewer than two replies by the deadline.
    Unavailable,
}

/// The quorum read of a task record: all three asked, the first two replies decide, and the
/// replicas that answered with less get the join (read repair, unacknowledged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskReadOp {
    key: TaskKey,
    replicas: [NodeId; REPLICAS],
    replies: BTreeMap<NodeId, Option<TaskRecord>>,
    answered: bool,
}

impl TaskReadOp {
    /// Starts the read of `key` from its `replicas`.
    #[must_use]
    pub fn start(
        key: TaskKey,
        replicas: [NodeId; REPLICAS],
    ) -> (TaskReadOp, Effects<TaskReadAnswer, TaskOutgoing>) {
        let sends = replicas
            .iter()
            .map(|to| TaskOutgoing {
                to: *to,
                key: key.clone(),
                round: ROUND,
                request: TaskRequest::Read,
            })
            .collect();
        let op = TaskReadOp {
            key,
            replicas,
            replies: BTreeMap::new(),
            answered: false,
        };
        (op, Effects::sends(sends))
    }

    /// One replica's reply.
    pub fn on_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &TaskReply,
    ) -> Effects<TaskReadAnswer, TaskOutgoing> {
        let TaskReply::Record(record) = reply else {
            return Effects::none();
        };
        if self.answered || round != ROUND || !self.replicas.contains(&from) {
            return Effects::none();
        }
        self.replies.insert(from, record.clone());
        if self.replies.len() < READ_QUORUM {
            return Effects::none();
        }
        self.answered = true;
        let merged = self
            .replies
            .values()
            .flatten()
            .fold(TaskRecord::default(), |joined, record| joined.merge(record));
        let repairs = self
            .replies
            .iter()
            .filter(|(_, reply)| reply.as_ref() != Some(&merged) && merged.number() > 0)
            .map(|(to, _)| TaskOutgoing {
                to: *to,
                key: self.key.clone(),
                round: 0,
                request: TaskRequest::Write {
                    write: Box::new(TaskWrite::Merge(merged.clone())),
                    ack: false,
                },
            })
            .collect();
        Effects {
            sends: repairs,
            answer: Some(TaskReadAnswer::Read(merged)),
        }
    }

    /// The deadline passed.
    pub fn on_timeout(&mut self) -> Effects<TaskReadAnswer, TaskOutgoing> {
        if self.answered {
            return Effects::none();
        }
        self.answered = true;
        Effects::answer(TaskReadAnswer::Unavailable)
    }
}

/// The answer of a write of a task record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskWriteAnswer {
    /// Two durable acks.
    Written,
    /// Two refusals: the condition fails on a quorum (a newer start, lease or status).
    Refused,
    /// Neither by the deadline. The write may still have taken effect on one replica.
    Unavailable,
}

/// A write of a task record to its three replicas, answered at two acks or two refusals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskWriteOp {
    replicas: [NodeId; REPLICAS],
    acks: BTreeSet<NodeId>,
    refusals: BTreeSet<NodeId>,
    answered: bool,
}

impl TaskWriteOp {
    /// Starts `write` of `key` to its `replicas`.
    #[must_use]
    pub fn start(
        key: TaskKey,
        replicas: [NodeId; REPLICAS],
        write: TaskWrite,
    ) -> (TaskWriteOp, Effects<TaskWriteAnswer, TaskOutgoing>) {
        let sends = replicas
            .iter()
            .map(|to| TaskOutgoing {
                to: *to,
                key: key.clone(),
                round: ROUND,
                request: TaskRequest::Write {
                    write: Box::new(write.clone()),
                    ack: true,
                },
            })
            .collect();
        let op = TaskWriteOp {
            replicas,
            acks: BTreeSet::new(),
            refusals: BTreeSet::new(),
            answered: false,
        };
        (op, Effects::sends(sends))
    }

    /// One replica's reply; a second reply of one replica counts once.
    pub fn on_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &TaskReply,
    ) -> Effects<TaskWriteAnswer, TaskOutgoing> {
        if self.answered
            || round != ROUND
            || !self.replicas.contains(&from)
            || self.acks.contains(&from)
            || self.refusals.contains(&from)
        {
            return Effects::none();
        }
        match reply {
            TaskReply::Ack => {
                self.acks.insert(from);
                if self.acks.len() == WRITE_QUORUM {
                    self.answered = true;
                    return Effects::answer(TaskWriteAnswer::Written);
                }
            }
            TaskReply::Refused => {
                self.refusals.insert(from);
                if self.refusals.len() == REPLICAS - WRITE_QUORUM + 1 {
                    self.answered = true;
                    return Effects::answer(TaskWriteAnswer::Refused);
                }
            }
            TaskReply::Record(_) => {}
        }
        Effects::none()
    }

    /// The deadline passed.
    pub fn on_timeout(&mut self) -> Effects<TaskWriteAnswer, TaskOutgoing> {
        if self.answered {
            return Effects::none();
        }
        self.answered = true;
        Effects::answer(TaskWriteAnswer::Unavailable)
    }
}

/// What both task operations offer their driver: replies in, a timeout, effects out.
pub trait TaskOperation {
    /// What the caller is told.
    type Answer;
    /// One replica's reply to round `round`.
    fn on_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &TaskReply,
    ) -> Effects<Self::Answer, TaskOutgoing>;
    /// The operation's deadline passed.
    fn on_timeout(&mut self) -> Effects<Self::Answer, TaskOutgoing>;
}

impl TaskOperation for TaskReadOp {
    type Answer = TaskReadAnswer;
    fn on_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &TaskReply,
    ) -> Effects<TaskReadAnswer, TaskOutgoing> {
        TaskReadOp::on_reply(self, from, round, reply)
    }
    fn on_timeout(&mut self) -> Effects<TaskReadAnswer, TaskOutgoing> {
        TaskReadOp::on_timeout(self)
    }
}

impl TaskOperation for TaskWriteOp {
    type Answer = TaskWriteAnswer;
    fn on_reply(
        &mut self,
        from: NodeId,
        round: u32,
        reply: &TaskReply,
    ) -> Effects<TaskWriteAnswer, TaskOutgoing> {
        TaskWriteOp::on_reply(self, from, round, reply)
    }
    fn on_timeout(&mut self) -> Effects<TaskWriteAnswer, TaskOutgoing> {
        TaskWriteOp::on_timeout(self)
    }
}

// ----- the clients' actions ---------------------------------------------------------------------

/// The record a start writes (as a conditional start) over the merged read `merged`: task
/// `number + 1`, running, never leased.
///
/// # Errors
/// The number of the task still active (`RUNNING` or `CANCELLING`): one active task per source.
pub fn start(merged: &TaskRecord, starter: Starter, params: TaskParams) -> Result<TaskRecord, u32> {
    if let Some((n, task)) = merged.current()
        && task.status.active()
    {
        return Err(n);
    }
    let number = merged
        .number()
        .checked_add(1)
        .expect("a source cannot start four billion tasks");
    let mut record = merged.clone();
    record.tasks.insert(number, Task::started(starter, params));
    Ok(record.merge(&TaskRecord::default()))
}

/// Why a cancel was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelRefused {
    /// The record knows no task of that number (never started, or dropped from the history).
    NotFound,
    /// The task is not `RUNNING`.
    NotRunning,
}

/// The record a cancel of task `number` writes over the merged read (`CANCELLING`), and the
/// moved count it answers with.
///
/// # Errors
/// `NotFound` or `NotRunning`.
pub fn cancel(merged: &TaskRecord, number: u32) -> Result<(TaskRecord, u64), CancelRefused> {
    let task = merged.tasks.get(&number).ok_or(CancelRefused::NotFound)?;
    if merged.number() != number || task.status != TaskStatus::Running {
        return Err(CancelRefused::NotRunning);
    }
    let cancelling = Task {
        status: TaskStatus::Cancelling,
        ..task.clone()
    };
    Ok((merged.with_current(cancelling), task.moved_total()))
}

// ----- the runner -------------------------------------------------------------------------------

/// What a node that found a task needing a runner writes after its quorum read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// A conditional lease of the next epoch, held by this node.
    Lease(TaskRecord),
    /// The task was cancelled: write `CANCELLED` (a merge) instead.
    Cancelled(TaskRecord),
    /// No active task.
    Nothing,
}

/// The acquisition over the merged read: `me` takes the lease `(epoch + 1, me)` until
/// `now + lease_ms`, or ends a cancelled task.
#[must_use]
pub fn acquire(merged: &TaskRecord, me: NodeId, now: Millis, lease_ms: u64) -> Acquire {
    let Some((_, task)) = merged.current() else {
        return Acquire::Nothing;
    };
    match task.status {
        TaskStatus::Running => {
            let epoch = task.lease.map_or(0, |lease| lease.epoch) + 1;
            let leased = Task {
                lease: Some(Lease {
                    epoch,
                    holder: me,
                    counter: 0,
                    deadline: Millis(now.0.saturating_add(lease_ms)),
                }),
                ..task.clone()
            };
            Acquire::Lease(merged.with_current(leased))
        }
        TaskStatus::Cancelling => Acquire::Cancelled(merged.with_current(Task {
            status: TaskStatus::Cancelled,
            ..task.clone()
        })),
        _ => Acquire::Nothing,
    }
}

/// Whether `me`, the `rank`-th of the record's replicas in ring order (0: first; a node that is
/// none of them passes `REPLICAS`), should try to acquire the current task of `held` at `now`,
/// when it does not run it itself: a cancelled task (whoever finds it ends it, at once), a task
/// never leased (its starter at once; replicas after `SKEW_MAX` and one lease per rank), a
/// lease this node holds by the record but no longer runs (it restarted or let go: at once), or
/// another holder's lease whose `deadline + SKEW_MAX` passed by this node's clock (plus one
/// lease per rank, so three nodes do not race).
#[must_use]
pub fn acquire_due(held: &TaskRecord, me: NodeId, rank: usize, now: Millis, lease_ms: u64) -> bool {
    let Some((_, task)) = held.current() else {
        return false;
    };
    match task.status {
        TaskStatus::Cancelling => return true,
        TaskStatus::Running => {}
        _ => return false,
    }
    let stagger = lease_ms.saturating_mul(rank as u64);
    let due = match task.lease {
        Some(lease) if lease.holder == me => return true,
        None if task.starter.coordinator == me => return true,
        Some(lease) => lease.deadline.0,
        None => task.params.started_at.0,
    };
    now.0 >= due.saturating_add(SKEW_MAX_MS).saturating_add(stagger)
}

/// A runner of one task under an acknowledged lease: the record as it last wrote it, its own
/// counts, and its lease (spec §8, *Renew and move*).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runner {
    me: NodeId,
    record: TaskRecord,
    lease_ms: u64,
}

impl Runner {
    /// The runner of the record its acquisition wrote (and two replicas acknowledged).
    #[must_use]
    pub fn new(me: NodeId, leased: TaskRecord, lease_ms: u64) -> Runner {
        let (_, task) = leased.current().expect("a lease is of a started task");
        assert_eq!(
            task.lease.map(|lease| lease.holder),
            Some(me),
            "a runner runs under its own lease"
        );
        Runner {
            me,
            record: leased,
            lease_ms,
        }
    }

    /// The task it runs.
    #[must_use]
    pub fn task(&self) -> &Task {
        self.record.current().expect("a runner runs a task").1
    }

    /// The task's number.
    #[must_use]
    pub fn number(&self) -> u32 {
        self.record.number()
    }

    fn lease(&self) -> Lease {
        self.task().lease.expect("a runner holds a lease")
    }

    /// The conditional renewal to write before the next batch: the lease's counter plus one, a
    /// deadline of `now` + the lease, and this runner's counts. The runner adopts it; it may move
    /// only once two replicas acknowledged it.
    pub fn renewal(&mut self, now: Millis) -> TaskWrite {
        let lease = self.lease();
        let renewed = Task {
            lease: Some(Lease {
                counter: lease.counter + 1,
                deadline: Millis(now.0.saturating_add(self.lease_ms)),
                ..lease
            }),
            ..self.task().clone()
        };
        self.record = self.record.with_current(renewed);
        TaskWrite::Renew(self.record.clone())
    }

    /// Whether the runner may still start a move at `now` by its clock: its deadline minus
    /// `SKEW_MAX` has not passed.
    #[must_use]
    pub fn may_move(&self, now: Millis) -> bool {
        now.0.saturating_add(SKEW_MAX_MS) < self.lease().deadline.0
    }

    /// Counts `moved` messages moved and `failed` that could not be, in this runner's entries;
    /// the next renewal carries them.
    pub fn count(&mut self, moved: u64, failed: u64) {
        let mut task = self.task().clone();
        *task.moved.entry(self.me).or_insert(0) += moved;
        *task.failed.entry(self.me).or_insert(0) += failed;
        self.record = self.record.with_current(task);
    }

    /// Whether the task has moved as many messages as it was to move. Skipped messages do not
    /// count: a skipped message stays in the dead-letter queue, and every run that takes the task
    /// over meets it again and counts it again in `failed`, so counting skips would end a task
    /// taken over twice while movable messages remain (spec/replication.md §8, *Complete*). A run
    /// ends a task that skips its last messages by finding no candidate it has not passed.
    #[must_use]
    pub fn done(&self) -> bool {
        let task = self.task();
        task.moved_total() >= task.params.to_move
    }

    /// The final write ending the task with `status` (`Completed` or `Failed`), with the
    /// runner's counts.
    #[must_use]
    pub fn end(&self, status: TaskStatus) -> TaskWrite {
        assert!(!status.active(), "a task ends in a terminal status");
        let ended = Task {
            status,
            ..self.task().clone()
        };
        TaskWrite::Merge(self.record.with_current(ended))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn queue(name: &str) -> QueueName {
        QueueName::try_from(name.to_owned()).unwrap()
    }

    fn key() -> TaskKey {
        TaskKey {
            queue: queue("jobs-dlq"),
            incarnation: Incarnation {
                hlc_ms: 7,
                node: 2,
                nonce: 99,
            },
        }
    }

    fn params(to_move: u64) -> TaskParams {
        TaskParams {
            destination: None,
            rate_per_s: None,
            started_at: Millis(1_000),
            to_move,
            allowed: None,
        }
    }

    fn starter(coordinator: u16) -> Starter {
        Starter {
            coordinator: NodeId(coordinator),
            nonce: 5,
        }
    }

    fn started(to_move: u64) -> TaskRecord {
        start(&TaskRecord::default(), starter(1), params(to_move)).unwrap()
    }

    fn leased(record: &TaskRecord, me: u16, now: u64) -> TaskRecord {
        match acquire(record, NodeId(me), Millis(now), TASK_LEASE_MS) {
            Acquire::Lease(record) => record,
            other => panic!("a running task is leased, got {other:?}"),
        }
    }

    fn stored(held: Option<&TaskRecord>, write: &TaskWrite) -> TaskRecord {
        match accept_task(held, write) {
            TaskVerdict::Store(record) => record,
            other => panic!("expected the write stored, got {other:?}"),
        }
    }

    #[test]
    fn keys_and_handles_round_trip_and_refuse_other_text() {
        let key = key();
        assert_eq!(TaskKey::decode(&key.encode()), Some(key.clone()));
        assert_eq!(TaskKey::decode(&key.encode()[1..]), None);
        let handle = TaskHandle { key, task: 3 };
        assert_eq!(TaskHandle::decode(&handle.encode()), Some(handle));
        assert_eq!(TaskHandle::decode("0.7.2.99.jobs-dlq"), None);
        assert_eq!(
            TaskHandle::decode("3f9a21c4-0000-4000-8000-00000000000a"),
            None
        );
        assert_eq!(TaskHandle::decode("1.7.2.99.not a name"), None);
    }

    #[test]
    fn a_replica_accepts_a_start_only_over_a_lower_number() {
        let first = started(2);
        let held = stored(None, &TaskWrite::Start(first.clone()));
        // The same start again (a retry, or the record a peer gave it) is refused.
        assert_eq!(
            accept_task(Some(&held), &TaskWrite::Start(first.clone())),
            TaskVerdict::Refused
        );
        // A racing start of the same number by another coordinator, too.
        let rival = start(&TaskRecord::default(), starter(2), params(2)).unwrap();
        assert_eq!(
            accept_task(Some(&held), &TaskWrite::Start(rival)),
            TaskVerdict::Refused
        );
        // Once the first ended, the next number is accepted and the first becomes history.
        let (_, task) = held.current().unwrap();
        let ended = held.with_current(Task {
            status: TaskStatus::Completed,
            ..task.clone()
        });
        let second = start(&ended, starter(2), params(0)).unwrap();
        let held = stored(Some(&ended), &TaskWrite::Start(second));
        assert_eq!(held.number(), 2);
        assert_eq!(
            held.newest_first().map(|(n, _)| n).collect::<Vec<_>>(),
            [2, 1]
        );
    }

    #[test]
    fn a_start_is_refused_while_a_task_is_active() {
        let record = started(1);
        assert_eq!(start(&record, starter(2), params(1)), Err(1));
        let (cancelling, _) = cancel(&record, 1).unwrap();
        assert_eq!(start(&cancelling, starter(2), params(1)), Err(1));
    }

    #[test]
    fn a_lease_epoch_is_taken_by_one_runner() {
        let record = started(3);
        let held = stored(None, &TaskWrite::Merge(record.clone()));
        let mine = leased(&record, 1, 2_000);
        let theirs = leased(&record, 2, 2_000);
        let held = stored(Some(&held), &TaskWrite::Lease(mine.clone()));
        assert_eq!(
            accept_task(Some(&held), &TaskWrite::Lease(theirs)),
            TaskVerdict::Refused
        );
        // The same lease again is not a new epoch either.
        assert_eq!(
            accept_task(Some(&held), &TaskWrite::Lease(mine)),
            TaskVerdict::Refused
        );
        // A takeover reads the held lease and takes the next epoch.
        let takeover = leased(&held, 2, 40_000);
        let held = stored(Some(&held), &TaskWrite::Lease(takeover));
        assert_eq!(held.current().unwrap().1.lease.unwrap().epoch, 2);
    }

    #[test]
    fn a_lease_is_refused_for_another_task_or_an_ended_one() {
        let record = started(3);
        let lease = leased(&record, 1, 2_000);
        // A replica that holds nothing cannot tell the task is active.
        assert_eq!(
            accept_task(None, &TaskWrite::Lease(lease.clone())),
            TaskVerdict::Refused
        );
        let (_, task) = record.current().unwrap();
        let completed = record.with_current(Task {
            status: TaskStatus::Completed,
            ..task.clone()
        });
        assert_eq!(
            accept_task(Some(&completed), &TaskWrite::Lease(lease)),
            TaskVerdict::Refused
        );
    }

    #[test]
    fn a_superseded_or_cancelled_runner_is_not_renewed() {
        let record = started(3);
        let lease = leased(&record, 1, 2_000);
        let held = stored(Some(&record), &TaskWrite::Lease(lease.clone()));
        let mut runner = Runner::new(NodeId(1), lease, TASK_LEASE_MS);
        let renewal = runner.renewal(Millis(3_000));
        let held_renewed = stored(Some(&held), &renewal);
        // Another node took over: the old runner's next renewal is refused.
        let takeover = leased(&held_renewed, 2, 40_000);
        let taken = stored(Some(&held_renewed), &TaskWrite::Lease(takeover));
        let stale = runner.renewal(Millis(4_000));
        assert_eq!(accept_task(Some(&taken), &stale), TaskVerdict::Refused);
        // A cancel refuses the holder's renewal.
        let (cancelling, _) = cancel(&held_renewed, 1).unwrap();
        let held_cancel = stored(Some(&held_renewed), &TaskWrite::Merge(cancelling));
        assert_eq!(
            accept_task(Some(&held_cancel), &stale),
            TaskVerdict::Refused
        );
        // Without either, the renewal is accepted and carries the runner's counts.
        runner.count(2, 1);
        let renewal = runner.renewal(Millis(5_000));
        let renewed = stored(Some(&held_renewed), &renewal);
        let task = renewed.current().unwrap().1;
        assert_eq!((task.moved_total(), task.failed_total()), (2, 1));
        // A skip is not a move: the task is done only when it moved all three.
        assert!(!runner.done());
        runner.count(1, 0);
        assert!(runner.done());
    }

    #[test]
    fn skips_counted_again_by_a_takeover_do_not_end_the_task() {
        // Runner 1 moves one of four and skips one; node 2 takes over and meets the skipped
        // message again; so does node 3. moved 1 + failed 3 = to_move, but three movable
        // messages are still in the dead-letter queue.
        let mut record = started(4);
        for (me, now, moved) in [(1, 2_000, 1), (2, 40_000, 0), (3, 80_000, 0)] {
            record = leased(&record, me, now);
            let mut runner = Runner::new(NodeId(me), record.clone(), TASK_LEASE_MS);
            runner.count(moved, 1);
            assert!(!runner.done(), "runner {me} is not done after one move");
            let TaskWrite::Renew(renewed) = runner.renewal(Millis(now + 1_000)) else {
                unreachable!("a renewal renews");
            };
            record = renewed;
        }
        let task = record.current().unwrap().1;
        assert_eq!((task.moved_total(), task.failed_total()), (1, 3));
    }

    #[test]
    fn a_runner_stops_moving_skew_max_before_its_deadline() {
        let record = leased(&started(1), 1, 1_000);
        let mut runner = Runner::new(NodeId(1), record, TASK_LEASE_MS);
        let _ = runner.renewal(Millis(10_000));
        let deadline = 10_000 + TASK_LEASE_MS;
        assert!(runner.may_move(Millis(deadline - SKEW_MAX_MS - 1)));
        assert!(!runner.may_move(Millis(deadline - SKEW_MAX_MS)));
    }

    #[test]
    fn takeover_waits_the_deadline_plus_skew_and_one_lease_per_rank() {
        let lease_ms = 1_000;
        let record = started(1);
        let lease = match acquire(&record, NodeId(1), Millis(2_000), lease_ms) {
            Acquire::Lease(record) => record,
            _ => unreachable!(),
        };
        let deadline = 3_000;
        // The holder itself, after a restart: at once.
        assert!(acquire_due(&lease, NodeId(1), 2, Millis(2_001), lease_ms));
        assert!(!acquire_due(
            &lease,
            NodeId(2),
            0,
            Millis(deadline + SKEW_MAX_MS - 1),
            lease_ms
        ));
        assert!(acquire_due(
            &lease,
            NodeId(2),
            0,
            Millis(deadline + SKEW_MAX_MS),
            lease_ms
        ));
        assert!(!acquire_due(
            &lease,
            NodeId(3),
            1,
            Millis(deadline + SKEW_MAX_MS),
            lease_ms
        ));
        assert!(acquire_due(
            &lease,
            NodeId(3),
            1,
            Millis(deadline + SKEW_MAX_MS + lease_ms),
            lease_ms
        ));
        // Never leased: its starter at once, the others counted from the start.
        assert!(acquire_due(&record, NodeId(1), 2, Millis(1_000), lease_ms));
        assert!(!acquire_due(&record, NodeId(2), 0, Millis(1_000), lease_ms));
        assert!(acquire_due(
            &record,
            NodeId(2),
            0,
            Millis(1_000 + SKEW_MAX_MS),
            lease_ms
        ));
        // A cancel is ended by whoever finds it.
        let (cancelling, _) = cancel(&lease, 1).unwrap();
        assert!(acquire_due(
            &cancelling,
            NodeId(3),
            2,
            Millis(2_001),
            lease_ms
        ));
        // An ended task needs nobody.
        let (_, task) = record.current().unwrap();
        let done = record.with_current(Task {
            status: TaskStatus::Completed,
            ..task.clone()
        });
        assert!(!acquire_due(
            &done,
            NodeId(1),
            0,
            Millis(u64::MAX / 2),
            lease_ms
        ));
    }

    #[test]
    fn a_cancelled_task_found_by_an_acquirer_is_ended() {
        let (cancelling, moved) = cancel(&started(4), 1).unwrap();
        assert_eq!(moved, 0);
        match acquire(&cancelling, NodeId(3), Millis(1), TASK_LEASE_MS) {
            Acquire::Cancelled(record) => {
                assert_eq!(record.current().unwrap().1.status, TaskStatus::Cancelled);
            }
            other => panic!("expected the cancel ended, got {other:?}"),
        }
        assert_eq!(cancel(&cancelling, 1), Err(CancelRefused::NotRunning));
        assert_eq!(cancel(&cancelling, 2), Err(CancelRefused::NotFound));
    }

    #[test]
    fn the_history_keeps_the_newest_tasks() {
        let mut record = TaskRecord::default();
        for _ in 0..(TASK_HISTORY_MAX + 3) {
            record = start(&record, starter(1), params(0)).unwrap();
            let (_, task) = record.current().unwrap();
            record = record.with_current(Task {
                status: TaskStatus::Completed,
                ..task.clone()
            });
        }
        assert_eq!(record.tasks.len(), TASK_HISTORY_MAX);
        assert_eq!(record.number(), (TASK_HISTORY_MAX + 3) as u32);
    }

    #[test]
    fn a_read_decides_on_two_replies_and_repairs_the_one_behind() {
        let replicas = [NodeId(1), NodeId(2), NodeId(3)];
        let (mut op, effects) = TaskReadOp::start(key(), replicas);
        assert_eq!(effects.sends.len(), 3);
        assert!(
            op.on_reply(NodeId(1), ROUND, &TaskReply::Record(Some(started(1))))
                .answer
                .is_none()
        );
        // A second reply of one replica counts once.
        assert!(
            op.on_reply(NodeId(1), ROUND, &TaskReply::Record(Some(started(1))))
                .answer
                .is_none()
        );
        let effects = op.on_reply(NodeId(2), ROUND, &TaskReply::Record(None));
        assert_eq!(effects.answer, Some(TaskReadAnswer::Read(started(1))));
        assert_eq!(effects.sends.len(), 1);
        assert_eq!(effects.sends[0].to, NodeId(2));
        assert!(op.on_timeout().answer.is_none());
    }

    #[test]
    fn a_write_answers_at_two_acks_or_two_refusals() {
        let replicas = [NodeId(1), NodeId(2), NodeId(3)];
        let write = TaskWrite::Merge(started(1));
        let (mut op, _) = TaskWriteOp::start(key(), replicas, write.clone());
        assert!(
            op.on_reply(NodeId(1), ROUND, &TaskReply::Ack)
                .answer
                .is_none()
        );
        assert!(
            op.on_reply(NodeId(1), ROUND, &TaskReply::Ack)
                .answer
                .is_none()
        );
        assert!(
            op.on_reply(NodeId(9), ROUND, &TaskReply::Ack)
                .answer
                .is_none()
        );
        assert_eq!(
            op.on_reply(NodeId(3), ROUND, &TaskReply::Ack).answer,
            Some(TaskWriteAnswer::Written)
        );
        let (mut op, _) = TaskWriteOp::start(key(), replicas, write);
        assert!(
            op.on_reply(NodeId(1), ROUND, &TaskReply::Refused)
                .answer
                .is_none()
        );
        assert_eq!(
            op.on_reply(NodeId(2), ROUND, &TaskReply::Refused).answer,
            Some(TaskWriteAnswer::Refused)
        );
        let (mut op, _) = TaskWriteOp::start(key(), replicas, TaskWrite::Merge(started(1)));
        assert_eq!(op.on_timeout().answer, Some(TaskWriteAnswer::Unavailable));
    }

    // ----- properties ------------------------------------------------------------------------

    fn arb_status() -> impl Strategy<Value = TaskStatus> {
        prop_oneof![
            Just(TaskStatus::Running),
            Just(TaskStatus::Cancelling),
            Just(TaskStatus::Completed),
            Just(TaskStatus::Cancelled),
            Just(TaskStatus::Failed(FailureReason::DestinationDeleted {
                name: queue("out")
            })),
            Just(TaskStatus::Failed(FailureReason::SourceDeleted {
                name: queue("jobs-dlq")
            })),
        ]
    }

    fn arb_counts() -> impl Strategy<Value = BTreeMap<NodeId, u64>> {
        prop::collection::btree_map((1u16..4).prop_map(NodeId), 0u64..5, 0..3)
    }

    fn arb_task() -> impl Strategy<Value = Task> {
        (
            (1u16..3, 0u64..2),
            0u64..3,
            arb_status(),
            prop::option::of((1u32..3, 1u16..4, 0u32..3, 0u64..3)),
            arb_counts(),
            arb_counts(),
        )
            .prop_map(
                |((coordinator, nonce), to_move, status, lease, moved, failed)| Task {
                    starter: Starter {
                        coordinator: NodeId(coordinator),
                        nonce,
                    },
                    params: params(to_move),
                    status,
                    lease: lease.map(|(epoch, holder, counter, deadline)| Lease {
                        epoch,
                        holder: NodeId(holder),
                        counter,
                        deadline: Millis(deadline),
                    }),
                    moved,
                    failed,
                },
            )
    }

    fn arb_record() -> impl Strategy<Value = TaskRecord> {
        // Numbers up to 13 with at most 12 tasks, so the history's cap is crossed.
        prop::collection::btree_map(1u32..14, arb_task(), 0..12)
            .prop_map(|tasks| TaskRecord { tasks }.merge(&TaskRecord::default()))
    }

    fn arb_write() -> impl Strategy<Value = TaskWrite> {
        (0u8..4, arb_record()).prop_map(|(kind, record)| match kind {
            0 => TaskWrite::Merge(record),
            1 => TaskWrite::Start(record),
            2 => TaskWrite::Lease(record),
            _ => TaskWrite::Renew(record),
        })
    }

    fn conditional_about_a_task(write: &TaskWrite) -> bool {
        match write {
            TaskWrite::Merge(_) => true,
            TaskWrite::Start(r) | TaskWrite::Lease(r) | TaskWrite::Renew(r) => r.number() > 0,
        }
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in arb_record(), b in arb_record()) {
            prop_assert_eq!(a.merge(&b), b.merge(&a));
        }

        #[test]
        fn merge_is_associative(a in arb_record(), b in arb_record(), c in arb_record()) {
            prop_assert_eq!(a.merge(&b).merge(&c), a.merge(&b.merge(&c)));
        }

        #[test]
        fn merge_is_idempotent(a in arb_record(), b in arb_record()) {
            prop_assert_eq!(a.merge(&a), a.clone());
            let joined = a.merge(&b);
            prop_assert_eq!(joined.merge(&b), joined.clone());
        }

        #[test]
        fn within_one_start_nothing_goes_back(a in arb_record(), b in arb_record()) {
            // T5 and T6 on one replica: for a task number the merge keeps with the same start,
            // the status, the lease and every runner's counts only grow.
            let joined = a.merge(&b);
            for (n, task) in &a.tasks {
                if let Some(kept) = joined.tasks.get(n)
                    && kept.starter == task.starter
                {
                    prop_assert!(kept.status >= task.status);
                    prop_assert!(kept.lease >= task.lease);
                    for (node, count) in &task.moved {
                        prop_assert!(kept.moved.get(node).copied().unwrap_or(0) >= *count);
                    }
                }
            }
        }

        #[test]
        fn an_accepted_write_keeps_what_the_replica_held(
            held in prop::option::of(arb_record()),
            write in arb_write(),
        ) {
            prop_assume!(conditional_about_a_task(&write));
            match accept_task(held.as_ref(), &write) {
                TaskVerdict::Store(record) => {
                    if let Some(held) = &held {
                        prop_assert!(record.covers(held));
                    }
                    prop_assert_ne!(Some(&record), held.as_ref());
                }
                TaskVerdict::Unchanged => prop_assert!(held.is_some()),
                TaskVerdict::Refused => {
                    prop_assert!(!matches!(write, TaskWrite::Merge(_)));
                }
            }
        }

        #[test]
        fn one_replica_acks_at_most_one_start_per_number(
            held in prop::option::of(arb_record()),
            a in arb_record(),
            b in arb_task(),
        ) {
            // T1's replica half: after accepting one start of number n, the replica refuses
            // every other start of n, whichever start it is.
            prop_assume!(a.number() > 0);
            let b = a.with_current(b);
            if let TaskVerdict::Store(after) = accept_task(held.as_ref(), &TaskWrite::Start(a)) {
                prop_assert_eq!(
                    accept_task(Some(&after), &TaskWrite::Start(b)),
                    TaskVerdict::Refused
                );
            }
        }

        #[test]
        fn one_replica_acks_at_most_one_holder_per_epoch(
            held in arb_record(),
            holders in (1u16..4, 1u16..4),
        ) {
            // T2's replica half: two leases of one epoch by different holders are never both
            // accepted by one replica.
            prop_assume!(held.number() > 0 && holders.0 != holders.1);
            let running = Task {
                status: TaskStatus::Running,
                ..held.current().unwrap().1.clone()
            };
            let held = held.with_current(running);
            let first = leased(&held, holders.0, 10);
            let second = leased(&held, holders.1, 20);
            let after = stored(Some(&held), &TaskWrite::Lease(first));
            prop_assert_eq!(
                accept_task(Some(&after), &TaskWrite::Lease(second)),
                TaskVerdict::Refused
            );
        }
    }
}
