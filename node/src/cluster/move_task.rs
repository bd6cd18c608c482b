//! Move tasks across the cluster (spec/replication.md §8): the start, cancel and read of a
//! source's task record through its three replicas, and the background driver that runs the
//! active tasks of the records this node holds, under a lease, moving each message by section
//! 7's redrive (`RedriveOp`: the copy to the destination first, then the dead-letter copy's
//! conditional tombstone), at the task's rate.
//!
//! Nothing of a task lives only in memory: the record is durable on its replicas, and a node
//! that restarts finds in its own copy the tasks whose lease it held or whose lease expired, and
//! acquires them anew (a new epoch). Which task to run and when, what to write and whether a
//! write may go on are `trireme_replication::task`'s decisions; this module reads the clock,
//! sends, waits and sleeps. It must never move a message but through `RedriveOp`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{Instrument, debug, info, info_span, warn};
use trireme_core::{MessageId, QueueName};
use trireme_replication::RecordKey;
use trireme_replication::coordinator::{Effects, RedriveAnswer, RedriveOp};
use trireme_replication::name::WatermarkAnswer;
use trireme_replication::task::{
    Acquire, CancelRefused, FailureReason, Runner, Starter, TASK_BATCH_MAX, TASK_LEASE_MS,
    TaskHandle, TaskKey, TaskOperation, TaskOutgoing, TaskParams, TaskReadAnswer, TaskReadOp,
    TaskRecord, TaskReply, TaskStatus, TaskWrite, TaskWriteAnswer, TaskWriteOp, acquire,
    acquire_due,
};
use trireme_replication::{NodeId, placement::REPLICAS};

use super::Cluster;
use super::store::TaskEntry;
use crate::limits;
use crate::redrive::pacing;

/// How the driver runs tasks.
#[derive(Clone, Copy, Debug)]
pub struct MoveTaskSettings {
    /// `TASK_LEASE`: how long a lease lasts past its last renewal.
    pub lease_ms: u64,
    /// Between two looks at this node's task records for a task that needs a runner.
    pub scan_period: Duration,
}

impl Default for MoveTaskSettings {
    /// The page's lease, 30 s, and a look every second.
    fn default() -> MoveTaskSettings {
        MoveTaskSettings {
            lease_ms: TASK_LEASE_MS,
            scan_period: Duration::from_secs(1),
        }
    }
}

/// The tasks this node runs now and those a start asked it to run at once. Shared by the
/// cluster handle (a start kicks) and the driver (which runs).
#[derive(Default)]
pub(super) struct MoveTasks {
    running: Mutex<BTreeSet<TaskKey>>,
    kicked: Mutex<BTreeSet<TaskKey>>,
    wake: Notify,
}

/// Fewer than two replicas answered in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fewer than two replicas of the task record answered in time")]
pub struct TaskUnavailable;

/// The answer to a start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartAnswer {
    /// Two replicas acknowledged task `number`.
    Started(TaskHandle),
    /// Task `number` is still running or cancelling (one active task per source).
    AlreadyRunning(TaskHandle),
    /// No quorum by the deadline (the start may have taken effect, as a failed send may).
    Unavailable,
}

/// The answer to a cancel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelAnswer {
    /// `CANCELLING` is on two replicas; the task had moved this many.
    Cancelling(u64),
    /// Refused (the handle names no task, or one that is not running).
    Refused(CancelRefused),
    /// No quorum by the deadline.
    Unavailable,
}

/// The background driver of one node. Dropping it stops the driver and every runner.
pub struct MoveTaskDriver {
    task: JoinHandle<()>,
}

impl MoveTaskDriver {
    /// Stops the driver and its runners, and waits until they let go of the cluster. A batch in
    /// progress ends where it is: each move is a redrive, safe wherever it stops.
    pub async fn stop(mut self) {
        self.task.abort();
        // A cancelled task ends with a `JoinError`, which is the point.
        let _ = (&mut self.task).await;
    }
}

impl Drop for MoveTaskDriver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Cluster {
    /// The replicas of a task record: its source name's (spec §8, *The task record*).
    #[must_use]
    pub fn task_replicas(&self, key: &TaskKey) -> [NodeId; REPLICAS] {
        self.name_replicas(&key.queue)
    }

    /// The quorum read of `key`'s task record, repairing the replica that answered with less.
    ///
    /// # Errors
    /// [`TaskUnavailable`] without two replies by the operation timeout.
    pub async fn read_task(&self, key: &TaskKey) -> Result<TaskRecord, TaskUnavailable> {
        let (op, effects) = TaskReadOp::start(key.clone(), self.task_replicas(key));
        match self.run_task_op(op, effects).await {
            TaskReadAnswer::Read(record) => Ok(record),
            TaskReadAnswer::Unavailable => Err(TaskUnavailable),
        }
    }

    async fn write_task(&self, key: &TaskKey, write: TaskWrite) -> TaskWriteAnswer {
        let (op, effects) = TaskWriteOp::start(key.clone(), self.task_replicas(key), write);
        self.run_task_op(op, effects).await
    }

    /// Starts a task of the source `key` with `params` (spec §8, *Start*): a quorum read, then
    /// the conditional start of the next number; once two replicas acknowledged it, this node
    /// acquires the lease at once (its driver is kicked).
    pub async fn start_task(&self, key: &TaskKey, params: TaskParams) -> StartAnswer {
        let handle = |task| TaskHandle {
            key: key.clone(),
            task,
        };
        let Ok(merged) = self.read_task(key).await else {
            return StartAnswer::Unavailable;
        };
        let starter = Starter {
            coordinator: self.node(),
            nonce: self.nonce(),
        };
        let record = match trireme_replication::task::start(&merged, starter, params) {
            Ok(record) => record,
            Err(running) => return StartAnswer::AlreadyRunning(handle(running)),
        };
        let number = record.number();
        match self.write_task(key, TaskWrite::Start(record)).await {
            TaskWriteAnswer::Written => {
                self.inner.move_tasks.kick(key.clone());
                StartAnswer::Started(handle(number))
            }
            // Another start took the number on two replicas: it is the running task, unless it
            // already ended, which a second read tells.
            TaskWriteAnswer::Refused => match self.read_task(key).await {
                Ok(now) => match now.current() {
                    Some((n, task)) if task.status.active() => {
                        StartAnswer::AlreadyRunning(handle(n))
                    }
                    _ => StartAnswer::Unavailable,
                },
                Err(TaskUnavailable) => StartAnswer::Unavailable,
            },
            TaskWriteAnswer::Unavailable => StartAnswer::Unavailable,
        }
    }

    /// Cancels the task `handle` names (spec §8, *Cancel*): a quorum read, then `CANCELLING`
    /// with two acks. The runner's next renewal is refused, and whoever finds the cancel writes
    /// `CANCELLED`.
    pub async fn cancel_task(&self, handle: &TaskHandle) -> CancelAnswer {
        let Ok(merged) = self.read_task(&handle.key).await else {
            return CancelAnswer::Unavailable;
        };
        let (record, moved) = match trireme_replication::task::cancel(&merged, handle.task) {
            Ok(cancelled) => cancelled,
            Err(refused) => return CancelAnswer::Refused(refused),
        };
        match self.write_task(&handle.key, TaskWrite::Merge(record)).await {
            TaskWriteAnswer::Written => {
                // Ends the task at once if this node runs it; any other finder ends it too.
                self.inner.move_tasks.kick(handle.key.clone());
                CancelAnswer::Cancelling(moved)
            }
            TaskWriteAnswer::Refused | TaskWriteAnswer::Unavailable => CancelAnswer::Unavailable,
        }
    }

    /// Starts the driver: every `settings.scan_period` (or at once when a start or a cancel
    /// kicks it) it looks at this node's task records for an active task it does not run and
    /// whose lease is due by the takeover rule, and at the tasks kicked, and runs each in a
    /// task of its own.
    #[must_use]
    pub fn spawn_move_tasks(&self, settings: MoveTaskSettings) -> MoveTaskDriver {
        let cluster = self.clone();
        let task = tokio::spawn(async move {
            // Runners live in the set: dropping the driver's task drops them with it.
            let mut runners = JoinSet::new();
            loop {
                while runners.try_join_next().is_some() {}
                for key in cluster.due_tasks(settings).await {
                    // Runners are capped as a node's tasks are alone; a task left over waits for
                    // the next scan here, or for another replica's.
                    if runners.len() >= limits::redrive_tasks_running_max {
                        break;
                    }
                    if cluster.inner.move_tasks.claim(&key) {
                        let span = info_span!("move_task", queue = %key.queue);
                        let cluster = cluster.clone();
                        runners.spawn(
                            async move {
                                cluster.run_task(&key, settings).await;
                                cluster.inner.move_tasks.release(&key);
                            }
                            .instrument(span),
                        );
                    }
                }
                tokio::select! {
                    // Either starts the next scan; no random draw for the simulation.
                    biased;
                    () = tokio::time::sleep(settings.scan_period) => {}
                    () = cluster.inner.move_tasks.wake.notified() => {}
                }
            }
        });
        MoveTaskDriver { task }
    }

    /// The tasks to run now: kicked ones, and the active tasks of this node's records whose
    /// lease is due for this node (`acquire_due`), those it runs already left out.
    async fn due_tasks(&self, settings: MoveTaskSettings) -> BTreeSet<TaskKey> {
        let mut due = self.inner.move_tasks.take_kicked();
        let store = self.inner.store.clone();
        let scanned = self
            .inner
            .store
            .scan_off(move || {
                store.task_records(None, usize::MAX, |_, record| {
                    record
                        .current()
                        .is_some_and(|(_, task)| task.status.active())
                })
            })
            .await;
        let records = match scanned {
            Ok((records, _)) => records,
            Err(error) => {
                warn!(%error, "move tasks: the task records could not be read");
                return due;
            }
        };
        let (me, now) = (self.node(), self.inner.me.clock.now());
        for (key, record) in records {
            let rank = self
                .task_replicas(&key)
                .iter()
                .position(|node| *node == me)
                .unwrap_or(REPLICAS);
            if acquire_due(&record, me, rank, now, settings.lease_ms) {
                due.insert(key);
            }
        }
        due.retain(|key| !self.inner.move_tasks.runs(key));
        due
    }

    /// Runs the task of `key` while this node holds its lease (spec §8, *Acquire*, *Renew and
    /// move*, *Complete*, *Fail*): acquire, then renew and move a batch until the task ends, the
    /// lease is lost, or a write gets no quorum (the next scan reads again).
    async fn run_task(&self, key: &TaskKey, settings: MoveTaskSettings) {
        let (me, clock) = (self.node(), Arc::clone(&self.inner.me.clock));
        // spec/replication.md#clock-monitoring: a lease is read on this node's clock.
        if self.coordinating().await.is_err() {
            return;
        }
        let Ok(merged) = self.read_task(key).await else {
            return;
        };
        // The scan decided on this node's copy; the quorum read may know a live lease of
        // another runner (a kick after a refused renewal, or a takeover already done).
        let rank = self
            .task_replicas(key)
            .iter()
            .position(|node| *node == me)
            .unwrap_or(REPLICAS);
        if !acquire_due(&merged, me, rank, clock.now(), settings.lease_ms) {
            return;
        }
        let mut runner = match acquire(&merged, me, clock.now(), settings.lease_ms) {
            Acquire::Lease(record) => {
                match self.write_task(key, TaskWrite::Lease(record.clone())).await {
                    TaskWriteAnswer::Written => Runner::new(me, record, settings.lease_ms),
                    answer => {
                        debug!(?answer, "move task: lease not acquired");
                        return;
                    }
                }
            }
            Acquire::Cancelled(record) => {
                let answer = self.write_task(key, TaskWrite::Merge(record)).await;
                info!(?answer, "move task cancelled");
                return;
            }
            Acquire::Nothing => return,
        };
        info!(
            task = runner.number(),
            "move task: running under a new lease"
        );
        let params = runner.task().params.clone();
        let (step, pause) = pacing(params.rate_per_s, TASK_BATCH_MAX);
        // Messages this run will not take again: skipped (their source queue is missing),
        // claimed by a consumer, or copied whose tombstone lost to a receive.
        let mut passed: BTreeSet<MessageId> = BTreeSet::new();
        loop {
            if self.coordinating().await.is_err() {
                // The lease runs out and another node takes the task over (the gate logged why).
                info!("move task: this node's clock does not let it coordinate, lease let go");
                return;
            }
            let renewal = runner.renewal(clock.now());
            match self.write_task(key, renewal).await {
                TaskWriteAnswer::Written => {}
                answer => {
                    // A cancel or a takeover refused it, or no quorum: let go; whoever reads the
                    // record next ends a cancelled task or runs it under a new lease.
                    info!(?answer, "move task: renewal not acknowledged, lease let go");
                    self.inner.move_tasks.kick(key.clone());
                    return;
                }
            }
            let ended = match self.task_queues_gone(key, &params).await {
                Ok(Some(reason)) => Some(TaskStatus::Failed(reason)),
                Ok(None) if runner.done() => Some(TaskStatus::Completed),
                Ok(None) => None,
                // The names could not be read: try again at the next batch, under the lease.
                Err(TaskUnavailable) => {
                    tokio::time::sleep(pause.max(settings.scan_period)).await;
                    continue;
                }
            };
            if let Some(status) = ended {
                self.end_task(key, &runner, status).await;
                return;
            }
            let (found, _) = self.dead_letters(key, step as usize + passed.len()).await;
            let candidates: Vec<MessageId> = found
                .into_iter()
                .filter(|id| !passed.contains(id))
                .take(step as usize)
                .collect();
            if candidates.is_empty() {
                self.end_task(key, &runner, TaskStatus::Completed).await;
                return;
            }
            let (mut moved, mut failed) = (0, 0);
            for id in candidates {
                if !runner.may_move(clock.now()) {
                    break;
                }
                match self.redrive_one(key, &params, id).await {
                    Redriven::Moved => moved += 1,
                    Redriven::SourceMissing | Redriven::Outside => {
                        failed += 1;
                        passed.insert(id);
                    }
                    Redriven::Passed => {
                        passed.insert(id);
                    }
                    // Tried again in the next batch.
                    Redriven::Unavailable => break,
                }
            }
            runner.count(moved, failed);
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
    }

    /// Up to `max` ready messages of the task's source in this node's view and, beyond three
    /// members, in every live peer's too (spec §8, *Considerations*: a node holds only the
    /// messages it replicates); a hint, each redrive's quorum read decides. Also the source's
    /// ready count: this node's with three members, beyond them section 11's (the answering
    /// members' counts summed and divided by three, rounded up), or the distinct ids seen if
    /// more (a member that did not answer took its counts with it).
    pub async fn dead_letters(&self, key: &TaskKey, max: usize) -> (BTreeSet<MessageId>, u64) {
        let now = self.inner.me.clock.now();
        // What this node's copy of the source's watermark hides is neither offered nor counted.
        let purged_through = self.known_watermark(&key.queue, key.incarnation);
        let (mine, ready) = self.inner.store.view_mut(|view| {
            (
                view.candidates(&key.queue, key.incarnation, purged_through, now, max),
                view.counts(&key.queue, key.incarnation, purged_through, now)
                    .0,
            )
        });
        let mut ids: BTreeSet<MessageId> = mine.into_iter().collect();
        let peers = self.peer_ids();
        if peers.len() < REPLICAS {
            return (ids, ready);
        }
        let mut asked = JoinSet::new();
        for peer in peers {
            let cluster = self.clone();
            let queue = key.queue.clone();
            let incarnation = key.incarnation;
            asked.spawn(async move {
                cluster
                    .peer_candidates(peer, &queue, incarnation, max)
                    .await
            });
        }
        let mut counted = ready;
        while let Some(joined) = asked.join_next().await {
            // A peer that does not answer holds nothing the others do not: every message is on
            // three nodes.
            if let Some((theirs, their_ready)) = joined.expect("a candidates call does not panic") {
                ids.extend(theirs);
                counted += their_ready;
            }
        }
        // The count, when a member is down, misses its share; the distinct ids seen do not.
        let estimate = counted
            .div_ceil(REPLICAS as u64)
            .max(u64::try_from(ids.len()).expect("a bounded set"));
        (ids, estimate)
    }

    /// Whether the task's source or its named destination is gone (deleted, or deleted and
    /// created again): the reason to fail it.
    async fn task_queues_gone(
        &self,
        key: &TaskKey,
        params: &TaskParams,
    ) -> Result<Option<FailureReason>, TaskUnavailable> {
        let live = |state: Option<super::names::QueueState>| state.map(|s| s.incarnation);
        let source = self.queue(&key.queue).await.map_err(|_| TaskUnavailable)?;
        if live(source) != Some(key.incarnation) {
            return Ok(Some(FailureReason::SourceDeleted {
                name: key.queue.clone(),
            }));
        }
        if let Some(destination) = &params.destination {
            let state = self
                .queue(&destination.name)
                .await
                .map_err(|_| TaskUnavailable)?;
            if live(state) != Some(destination.incarnation) {
                return Ok(Some(FailureReason::DestinationDeleted {
                    name: destination.name.clone(),
                }));
            }
        }
        Ok(None)
    }

    async fn end_task(&self, key: &TaskKey, runner: &Runner, status: TaskStatus) {
        let answer = self.write_task(key, runner.end(status.clone())).await;
        info!(
            ?status,
            ?answer,
            moved = runner.task().moved_total(),
            "move task ended"
        );
    }

    /// Redrives the message `id` of the task's source to the named destination or to the
    /// queue its dead-letter copy came from (which the redrive's quorum read tells).
    async fn redrive_one(&self, key: &TaskKey, params: &TaskParams, id: MessageId) -> Redriven {
        // spec §8, *Fail*: a target outside the starter's restriction is skipped before anything
        // is written, as a missing one is.
        let within = |name: &QueueName| params.allowed.as_ref().is_none_or(|a| a.allows(name));
        let source = RecordKey {
            queue: key.queue.clone(),
            incarnation: key.incarnation,
            message: id,
        };
        // The dead-letter queue's watermark by quorum (spec/replication.md §2): a purged copy
        // is gone, and is not sent back.
        let purged_through = match self.queue_watermark(&key.queue, key.incarnation).await {
            WatermarkAnswer::Read(watermark) => watermark,
            // Deleted: the task fails at its next look at its queues.
            WatermarkAnswer::Gone | WatermarkAnswer::Unavailable => return Redriven::Unavailable,
        };
        let now = self.inner.me.clock.now();
        let (target, answer) = match &params.destination {
            Some(destination) => {
                if !within(&destination.name) {
                    return Redriven::Outside;
                }
                let target = RecordKey {
                    queue: destination.name.clone(),
                    incarnation: destination.incarnation,
                    message: id,
                };
                let (op, effects) = RedriveOp::start(
                    (source.clone(), self.replicas(&source)),
                    Some((target.clone(), self.replicas(&target))),
                    now,
                    purged_through,
                );
                (target, self.run(op, effects).await)
            }
            None => {
                let (op, effects) = RedriveOp::start(
                    (source.clone(), self.replicas(&source)),
                    None,
                    now,
                    purged_through,
                );
                let RedriveAnswer::Movable(record) = self.run(op, effects).await else {
                    return Redriven::Passed;
                };
                let Some(origin) = record.live().and_then(|l| l.birth.source_queue.clone()) else {
                    // A message sent to the dead-letter queue itself has no source to go back to.
                    return Redriven::SourceMissing;
                };
                if !within(&origin.name) {
                    debug!(message = %id, source = %origin.name, "move task: source outside the starter's restriction, left in place");
                    return Redriven::Outside;
                }
                // As on one node, the source queue is found by name.
                let target = match self.queue(&origin.name).await {
                    Ok(Some(state)) => RecordKey {
                        queue: origin.name,
                        incarnation: state.incarnation,
                        message: id,
                    },
                    Ok(None) => return Redriven::SourceMissing,
                    Err(_) => return Redriven::Unavailable,
                };
                let (op, effects) = RedriveOp::copy(
                    (source.clone(), self.replicas(&source)),
                    (target.clone(), self.replicas(&target)),
                    &record,
                    self.inner.me.clock.now(),
                );
                (target, self.run(op, effects).await)
            }
        };
        if matches!(answer, RedriveAnswer::Moved | RedriveAnswer::CopiedOnly) {
            // The copy is ready in its queue (§9, *Wake-up*).
            self.wake(&target.queue, target.incarnation, vec![target.message]);
        }
        match answer {
            RedriveAnswer::Moved => Redriven::Moved,
            // In both queues (a duplicate the page allows) or not movable now: not again.
            RedriveAnswer::CopiedOnly | RedriveAnswer::NotMovable => Redriven::Passed,
            RedriveAnswer::Unavailable => Redriven::Unavailable,
            RedriveAnswer::Diverged(divergence) => {
                warn!(message = %id, %divergence, "move task: replicas disagree on a once-field; left in place");
                Redriven::Passed
            }
            RedriveAnswer::Movable(_) => {
                unreachable!("a redrive with a target goes on past its read")
            }
        }
    }

    /// Runs a task record operation from its first `effects` to its answer or the operation
    /// timeout.
    async fn run_task_op<O: TaskOperation>(
        &self,
        mut op: O,
        mut effects: Effects<O::Answer, TaskOutgoing>,
    ) -> O::Answer {
        let (replies, mut incoming) = mpsc::unbounded_channel();
        let deadline = tokio::time::Instant::now() + self.inner.operation_timeout;
        loop {
            if let Some(answer) = effects.answer.take() {
                // Read repairs the answering step still sent go out unawaited.
                self.dispatch_tasks(std::mem::take(&mut effects.sends), None);
                return answer;
            }
            self.dispatch_tasks(std::mem::take(&mut effects.sends), Some(&replies));
            effects = tokio::select! {
                // As `run`: a reply that arrives with the deadline counts, and no random draw.
                biased;
                reply = incoming.recv() => {
                    let (from, round, reply): (NodeId, u32, TaskReply) =
                        reply.expect("the operation holds a sender of its own replies");
                    op.on_reply(from, round, &reply)
                }
                () = tokio::time::sleep_until(deadline) => op.on_timeout(),
            };
        }
    }

    /// Sends task requests: to this node's store directly, to peers through their links;
    /// replies go to `replies` (an operation that still listens), and a failure is silence.
    fn dispatch_tasks(
        &self,
        sends: Vec<TaskOutgoing>,
        replies: Option<&mpsc::UnboundedSender<(NodeId, u32, TaskReply)>>,
    ) {
        for out in sends {
            let (from, round) = (out.to, out.round);
            let replies = replies.filter(|_| round != 0).cloned();
            if out.to == self.node() {
                let store = self.inner.store.clone();
                let entry = TaskEntry {
                    key: out.key,
                    request: out.request,
                };
                tokio::spawn(async move {
                    if let Ok(mut answers) = store.apply_tasks(vec![entry]).await
                        && let (Some(replies), Some(reply)) = (replies, answers.pop())
                    {
                        let _ = replies.send((from, round, reply));
                    }
                });
            } else {
                let answered = self.inner.peers.send_task(out.to, out.key, out.request);
                tokio::spawn(async move {
                    if let Ok(Ok(reply)) = answered.await
                        && let Some(replies) = replies
                    {
                        let _ = replies.send((from, round, reply));
                    }
                });
            }
        }
    }
}

/// What became of one message of a batch.
enum Redriven {
    /// Copied, and its dead-letter copy tombstoned.
    Moved,
    /// Its own source queue is missing: skipped, counted as failed (as on one node).
    SourceMissing,
    /// Its target is outside the restriction of the key that started the task: skipped,
    /// counted as failed (as on one node).
    Outside,
    /// Not moved and not taken again by this run (claimed, gone, or a duplicate now).
    Passed,
    /// No quorum: the batch stops and tries again.
    Unavailable,
}

impl MoveTasks {
    /// Asks the driver to look at `key` at once.
    fn kick(&self, key: TaskKey) {
        self.kicked
            .lock()
            .expect("the move task lock is never poisoned")
            .insert(key);
        self.wake.notify_one();
    }

    fn take_kicked(&self) -> BTreeSet<TaskKey> {
        std::mem::take(
            &mut *self
                .kicked
                .lock()
                .expect("the move task lock is never poisoned"),
        )
    }

    fn runs(&self, key: &TaskKey) -> bool {
        self.running
            .lock()
            .expect("the move task lock is never poisoned")
            .contains(key)
    }

    /// Marks `key` run here; `false` if it already is.
    fn claim(&self, key: &TaskKey) -> bool {
        self.running
            .lock()
            .expect("the move task lock is never poisoned")
            .insert(key.clone())
    }

    fn release(&self, key: &TaskKey) {
        self.running
            .lock()
            .expect("the move task lock is never poisoned")
            .remove(key);
    }
}
