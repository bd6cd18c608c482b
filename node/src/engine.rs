//! The engine: the single task that owns the queue state (`trireme_core::Queues`) and the
//! storage, and [`Engine`], the cheap-to-clone handle every edge (gRPC, SQS) talks to.
//!
//! Group commit: the task takes every command waiting for it (up to
//! `commit_batch_commands_max`), applies them in arrival order, writes all the records they
//! changed in one write transaction (one fsync), and only then answers the callers and the long
//! polls those commands woke. A reply therefore never reports anything that is not durable.
//!
//! Long polls are event-driven: a receive that finds nothing parks its reply channel, and the
//! command (or timer) that makes a message ready answers it in the same batch
//! (spec/queue-core.md#serveq). Idle waiters cost a map entry each, no polling. Timers: the task
//! sleeps until `Queues::next_deadline` with `tokio::time`, so it runs under turmoil too.
//!
//! This module must never read the wall clock directly (time comes from the [`Clock`]), and must
//! never answer a caller before the changes of its command are committed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};
use trireme_core::{
    Command, Delivery, MessageId, MessageView, Millis, Outcome, QueueName, QueueStats, QueueView,
    Queues, Reject, WaiterId, Wakeup,
};

use crate::clock::Clock;
use crate::fault::StoreFault;
use crate::handle::HandleCodec;
use crate::limits;
use crate::metrics::StoreMetrics;
use crate::storage::{Storage, StorageError};

/// Why the engine did not apply a command.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EngineError {
    /// The core refused the command; nothing changed.
    #[error(transparent)]
    Rejected(#[from] Reject),
    /// The node is shutting down (or stopped after a storage failure) and takes no more commands.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// Storage failed; the command's effect is not durable and the engine has stopped. The
    /// fault's kind tells a full disk from a failed write or fsync and from corruption.
    #[error("storage failed: {0}")]
    Storage(StoreFault),
    /// In a cluster: the replicas this command needs did not answer in time (or answered with a
    /// disagreement that needs an operator), and the command may still have taken effect on
    /// some replica (a retry is safe where the command is idempotent); or this node's clock does
    /// not let it coordinate (spec/replication.md#clock-monitoring), and it did nothing. The
    /// reason says which.
    #[error("unavailable: {reason}")]
    Unavailable { reason: String },
    /// In a cluster: an action this version serves only on a node running alone.
    #[error("{action} is not yet served by a cluster")]
    Unsupported { action: &'static str },
    /// The engine's queue of commands is full (`engine_queue_commands_max` are waiting): the
    /// command was shed before the engine saw it, so nothing changed and a retry is safe.
    #[error("the node is overloaded: {queued_max} commands are waiting for its engine")]
    Overloaded { queued_max: usize },
    /// In a cluster: the operation could not make its quorum because replicas answered that
    /// they are overloaded (their stores' queues full, spec/replication.md#durability, *A
    /// replica that is overloaded*); it answered at once. As with `Unavailable`, the command may
    /// have taken effect on one replica; a retry later is the answer. The reason names them.
    #[error("overloaded: {reason}")]
    ReplicasOverloaded { reason: String },
    /// A receive that would wait found the node's long polls at their cap (`long_polls_max`):
    /// refused at once, nothing received and nothing changed, so a retry later is safe. Not an
    /// empty answer: a client told "nothing" polls again at once, and a throttling refusal makes
    /// it back off.
    #[error("the node is overloaded: {max} long polls are waiting already")]
    LongPollsFull { max: usize },
}

/// What a command does when the engine's queue of commands is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// Waits for room (backpressure): the node's own work (move tasks), which must not be lost.
    Wait,
    /// Is refused at once with [`EngineError::Overloaded`]: clients' commands, so that a flood
    /// gets a throttling answer instead of piling up waiting requests.
    Shed,
}

/// The engine's settings, taken from the node configuration.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// Commands applied per group commit.
    pub commit_batch_commands_max: usize,
    /// Commands waiting for the engine before callers wait.
    pub engine_queue_commands_max: usize,
    /// Open long polls per node; beyond it a long poll is answered empty at once.
    pub long_polls_max: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            commit_batch_commands_max: limits::commit_batch_commands_max_default,
            engine_queue_commands_max: limits::engine_queue_commands_max_default,
            long_polls_max: limits::long_polls_max_default,
        }
    }
}

type Reply = oneshot::Sender<Result<Outcome, EngineError>>;

/// A read of the state. Answered after the batch it arrived in is committed, so a query never
/// shows a change that could still be lost.
enum Query {
    Queue {
        name: QueueName,
        reply: oneshot::Sender<Option<QueueView>>,
    },
    ListQueues {
        prefix: String,
        after: Option<QueueName>,
        limit: usize,
        reply: oneshot::Sender<Vec<QueueName>>,
    },
    DeadLetterSources {
        dlq: QueueName,
        reply: oneshot::Sender<Vec<QueueName>>,
    },
    Message {
        queue: QueueName,
        id: MessageId,
        reply: oneshot::Sender<Option<MessageView>>,
    },
    Waiters {
        queue: QueueName,
        reply: oneshot::Sender<Vec<WaiterId>>,
    },
    Stats {
        reply: oneshot::Sender<Vec<QueueStats>>,
    },
    Peek {
        queue: QueueName,
        limit: usize,
        reply: oneshot::Sender<Vec<MessageView>>,
    },
}

enum Request {
    Execute {
        command: Command,
        reply: Reply,
    },
    Query(Query),
    /// Answer every open long poll empty and every later one at once.
    StopWaiting {
        done: oneshot::Sender<()>,
    },
    /// Stop the task and close the storage.
    Close {
        done: oneshot::Sender<()>,
    },
}

/// The part of the engine handle that talks to the task.
pub(crate) struct EngineLink {
    requests: mpsc::Sender<Request>,
    /// Long polls whose caller went away. Bounded by `long_polls_max`; when full the cancel is
    /// dropped: the waiter then ends at its deadline, and anything it is served in between is
    /// made visible again at once (see `Task::abandon`).
    cancels: mpsc::Sender<WaiterId>,
    clock: Arc<dyn Clock>,
    rng: Mutex<ChaCha20Rng>,
    next_waiter: AtomicU64,
    /// The queue database's group commits, counted by the task.
    storage_metrics: StoreMetrics,
}

impl std::fmt::Debug for EngineLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineLink { .. }")
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Request::Execute { .. } => "Execute",
            Request::Query(_) => "Query",
            Request::StopWaiting { .. } => "StopWaiting",
            Request::Close { .. } => "Close",
        })
    }
}

/// Cancels a long poll when the future waiting for it is dropped before its answer.
struct WaiterGuard<'a> {
    waiter: WaiterId,
    cancels: &'a mpsc::Sender<WaiterId>,
    armed: bool,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Full or closed: see `EngineLink::cancels`.
            let _ = self.cancels.try_send(self.waiter);
        }
    }
}

impl EngineLink {
    /// Hands `request` to the engine task, as `admission` says when its queue is full.
    async fn submit(&self, request: Request, admission: Admission) -> Result<(), EngineError> {
        match admission {
            Admission::Wait => self
                .requests
                .send(request)
                .await
                .map_err(|_| EngineError::ShuttingDown),
            Admission::Shed => self
                .requests
                .try_send(request)
                .map_err(|error| match error {
                    mpsc::error::TrySendError::Full(_) => EngineError::Overloaded {
                        queued_max: self.requests.max_capacity(),
                    },
                    mpsc::error::TrySendError::Closed(_) => EngineError::ShuttingDown,
                }),
        }
    }

    async fn execute(
        &self,
        command: Command,
        admission: Admission,
    ) -> Result<Outcome, EngineError> {
        let (reply, answer) = oneshot::channel();
        let mut guard = match &command {
            Command::Receive { waiter, .. } => Some(WaiterGuard {
                waiter: *waiter,
                cancels: &self.cancels,
                armed: true,
            }),
            _ => None,
        };
        if let Err(error) = self
            .submit(Request::Execute { command, reply }, admission)
            .await
        {
            // A waiter the engine never saw has nothing to cancel.
            if let Some(guard) = &mut guard {
                guard.armed = false;
            }
            return Err(error);
        }
        let result = answer.await.map_err(|_| EngineError::ShuttingDown)?;
        if let Some(guard) = &mut guard {
            guard.armed = false;
        }
        result
    }

    async fn query<T>(
        &self,
        build: impl FnOnce(oneshot::Sender<T>) -> Query,
        admission: Admission,
    ) -> Result<T, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request::Query(build(reply)), admission).await?;
        answer.await.map_err(|_| EngineError::ShuttingDown)
    }

    pub(crate) fn next_waiter(&self) -> WaiterId {
        WaiterId(self.next_waiter.fetch_add(1, Ordering::Relaxed))
    }

    async fn queue(
        &self,
        name: &QueueName,
        admission: Admission,
    ) -> Result<Option<QueueView>, EngineError> {
        let name = name.clone();
        self.query(|reply| Query::Queue { name, reply }, admission)
            .await
    }

    async fn dead_letter_sources(
        &self,
        dlq: &QueueName,
        admission: Admission,
    ) -> Result<Vec<QueueName>, EngineError> {
        let dlq = dlq.clone();
        self.query(|reply| Query::DeadLetterSources { dlq, reply }, admission)
            .await
    }

    pub(crate) fn rng(&self) -> std::sync::MutexGuard<'_, ChaCha20Rng> {
        self.rng
            .lock()
            .expect("no code panics while holding the rng")
    }

    pub(crate) fn now(&self) -> Millis {
        self.clock.now()
    }
}

/// A cheap-to-clone handle to the engine task.
#[derive(Clone, Debug)]
pub struct Engine {
    link: Arc<EngineLink>,
    /// What this handle's commands do when the engine's queue is full.
    admission: Admission,
    handles: HandleCodec,
    /// Set by the task when storage failed and it stopped: the node must stop too.
    failure: watch::Receiver<Option<StoreFault>>,
}

impl Engine {
    /// Loads every record from `storage`, rebuilds the queues (`Queues::restore`) and starts the
    /// engine task on the current tokio runtime. `seed` seeds the node's random source (message
    /// ids); `None` seeds it from the operating system.
    ///
    /// # Errors
    /// `EngineError::Storage` when the records cannot be read (a corrupt record included: the
    /// node refuses to start rather than drop a message).
    pub fn start(
        storage: Storage,
        clock: Arc<dyn Clock>,
        handles: HandleCodec,
        settings: EngineSettings,
        seed: Option<u64>,
    ) -> Result<Engine, EngineError> {
        assert!(settings.commit_batch_commands_max >= 1);
        assert!(settings.long_polls_max >= 1);
        let records = storage.load().map_err(storage_error)?;
        let record_count = records.len();
        let queues = Queues::restore(records, clock.now());
        info!(
            records = record_count,
            revision = storage.revision(),
            "restored queues from storage"
        );
        let (requests, requests_rx) = mpsc::channel(settings.engine_queue_commands_max);
        let (cancels, cancels_rx) = mpsc::channel(settings.long_polls_max);
        let rng = match seed {
            // A configured seed alone would draw the same message ids after every restart, and a
            // new message could take the id of one deleted before it (an old receipt handle could
            // then act on it). Every id of an acknowledged send is in a commit, so the revision
            // of the latest commit differs between any two boots that both stored messages: mixed
            // in, it keeps the streams of such boots apart (found by the simulation).
            Some(seed) => ChaCha20Rng::seed_from_u64(seed ^ storage.revision().rotate_left(32)),
            None => ChaCha20Rng::from_os_rng(),
        };
        let storage_metrics = StoreMetrics::default();
        storage_metrics.set_records(storage.records());
        let link = Arc::new(EngineLink {
            requests,
            cancels,
            clock: clock.clone(),
            rng: Mutex::new(rng),
            next_waiter: AtomicU64::new(1),
            storage_metrics: storage_metrics.clone(),
        });
        let (failure_tx, failure) = watch::channel(None);
        let task = Task {
            metrics: storage_metrics.clone(),
            failure: failure_tx,
            queues,
            storage: Some(storage),
            clock,
            settings,
            requests: requests_rx,
            cancels: cancels_rx,
            parked: BTreeMap::new(),
            abandoned: Vec::new(),
            pending_wakeups: Vec::new(),
            stop_waiting: false,
        };
        tokio::spawn(task.run());
        Ok(Engine {
            link,
            admission: Admission::Wait,
            handles,
            failure,
        })
    }

    /// This engine, with commands (`execute`, `execute_all`, `receive`) that are refused with
    /// [`EngineError::Overloaded`] when the engine's queue of commands is full instead of
    /// waiting for room: the handle the public edges use.
    #[must_use]
    pub fn shedding(&self) -> Engine {
        Engine {
            admission: Admission::Shed,
            ..self.clone()
        }
    }

    /// Resolves with the reason when the engine stopped because storage failed; never resolves
    /// while the engine works (or after a graceful close).
    pub async fn failed(&self) -> StoreFault {
        let mut failure = self.failure.clone();
        match failure.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().expect("waited for Some"),
            // The task ended without a failure (closed): nothing will ever fail.
            Err(_) => std::future::pending().await,
        }
    }

    /// How storage failed, if it did (the engine then takes no more commands).
    #[must_use]
    pub fn failure(&self) -> Option<StoreFault> {
        self.failure.borrow().clone()
    }

    /// The queue database's group commits and records.
    #[must_use]
    pub fn storage_metrics(&self) -> &StoreMetrics {
        &self.link.storage_metrics
    }

    /// Every queue's counts, oldest message and dead-letter moves now, in name order (for the
    /// node's metrics).
    ///
    /// # Errors
    /// `ShuttingDown` once the engine stopped; `Overloaded` from a [`Engine::shedding`] handle.
    pub async fn stats(&self) -> Result<Vec<QueueStats>, EngineError> {
        self.link
            .query(|reply| Query::Stats { reply }, self.admission)
            .await
    }

    /// Applies one command durably: the reply comes after its changes are fsynced. A `Receive`
    /// that waits resolves when it is served or when its wait ends (`Outcome::Received`,
    /// possibly empty), never with `Outcome::Waiting`. Dropping the future cancels the waiter.
    ///
    /// # Errors
    /// `Rejected` when the core refuses the command; `ShuttingDown` after shutdown began;
    /// `Storage` when the commit failed (the engine has stopped).
    pub async fn execute(&self, command: Command) -> Result<Outcome, EngineError> {
        self.link.execute(command, self.admission).await
    }

    /// Applies several commands, all handed to the engine before any answer is awaited so
    /// they share one group commit; answers in the order of `commands`. For batch calls. A
    /// receive here must not wait (dropping this future would not cancel its waiter).
    pub async fn execute_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, EngineError>> {
        let mut answers = Vec::with_capacity(commands.len());
        for command in commands {
            assert!(
                !matches!(command, Command::Receive { .. }),
                "long polls go through `execute`, which cancels them when dropped"
            );
            let (reply, answer) = oneshot::channel();
            let sent = self
                .link
                .submit(Request::Execute { command, reply }, self.admission)
                .await;
            answers.push(sent.map(|()| answer));
        }
        let mut results = Vec::with_capacity(answers.len());
        for answer in answers {
            let result = match answer {
                Ok(answer) => answer.await.unwrap_or(Err(EngineError::ShuttingDown)),
                Err(error) => Err(error),
            };
            results.push(result);
        }
        results
    }

    /// Receives up to `max` messages of `queue` as a new waiter, waiting up to `wait_s` (`None`:
    /// the queue's default) for the first; empty when none arrived in time.
    ///
    /// # Errors
    /// As [`Engine::execute`].
    pub async fn receive(
        &self,
        queue: QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: Option<u32>,
    ) -> Result<Vec<Delivery>, EngineError> {
        let outcome = self
            .execute(Command::Receive {
                queue,
                max,
                visibility_s,
                wait_s,
                waiter: self.new_waiter_id(),
            })
            .await?;
        let Outcome::Received(deliveries) = outcome else {
            unreachable!("Receive answers Received, got {outcome:?}");
        };
        Ok(deliveries)
    }

    /// A fresh waiter id, unique on this node, for a `Command::Receive`.
    #[must_use]
    pub fn new_waiter_id(&self) -> WaiterId {
        self.link.next_waiter()
    }

    /// The queue `name` as it is now, or `None` if it does not exist.
    ///
    /// # Errors
    /// `ShuttingDown` once the engine stopped; `Overloaded` from a [`Engine::shedding`] handle.
    pub async fn queue(&self, name: &QueueName) -> Result<Option<QueueView>, EngineError> {
        self.link.queue(name, self.admission).await
    }

    /// Up to `limit` queue names starting with `prefix`, in name order, after `after`.
    ///
    /// # Errors
    /// `ShuttingDown` once the engine stopped; `Overloaded` from a [`Engine::shedding`] handle.
    pub async fn list_queues(
        &self,
        prefix: String,
        after: Option<QueueName>,
        limit: usize,
    ) -> Result<Vec<QueueName>, EngineError> {
        self.link
            .query(
                |reply| Query::ListQueues {
                    prefix,
                    after,
                    limit,
                    reply,
                },
                self.admission,
            )
            .await
    }

    /// The queues whose redrive policy names `dlq`, in name order.
    ///
    /// # Errors
    /// `ShuttingDown` once the engine stopped; `Overloaded` from a [`Engine::shedding`] handle.
    pub async fn dead_letter_sources(
        &self,
        dlq: &QueueName,
    ) -> Result<Vec<QueueName>, EngineError> {
        self.link.dead_letter_sources(dlq, self.admission).await
    }

    /// The full state of one stored message (for inspection and tests).
    ///
    /// # Errors
    /// `ShuttingDown` once the engine stopped; `Overloaded` from a [`Engine::shedding`] handle.
    pub async fn message(
        &self,
        queue: &QueueName,
        id: MessageId,
    ) -> Result<Option<MessageView>, EngineError> {
        let queue = queue.clone();
        self.link
            .query(|reply| Query::Message { queue, id, reply }, self.admission)
            .await
    }

    /// Up to `limit` messages stored in `queue`, the first sent first, as they are: a read
    /// that receives nothing and changes no receive count (the console's peek).
    ///
    /// # Errors
    /// `ShuttingDown` once the engine stopped.
    pub async fn peek(
        &self,
        queue: &QueueName,
        limit: usize,
    ) -> Result<Vec<MessageView>, EngineError> {
        let queue = queue.clone();
        self.link
            .query(
                |reply| Query::Peek {
                    queue,
                    limit,
                    reply,
                },
                self.admission,
            )
            .await
    }

    /// The open long polls of `queue`, oldest first (for inspection and tests).
    ///
    /// # Errors
    /// `ShuttingDown` once the engine stopped; `Overloaded` from a [`Engine::shedding`] handle.
    pub async fn waiters(&self, queue: &QueueName) -> Result<Vec<WaiterId>, EngineError> {
        let queue = queue.clone();
        self.link
            .query(|reply| Query::Waiters { queue, reply }, self.admission)
            .await
    }

    /// A fresh message id from the node's random source.
    #[must_use]
    pub fn new_message_id(&self) -> MessageId {
        MessageId(self.link.rng().random())
    }

    /// The current time of the node's clock.
    #[must_use]
    pub fn now(&self) -> Millis {
        self.link.now()
    }

    /// The codec of this node's receipt handles.
    #[must_use]
    pub fn handles(&self) -> &HandleCodec {
        &self.handles
    }

    /// Answers every open long poll empty, and every later one at once. The first step of a
    /// graceful shutdown; commands are still applied.
    pub async fn stop_waiting(&self) {
        let (done, finished) = oneshot::channel();
        if self
            .link
            .requests
            .send(Request::StopWaiting { done })
            .await
            .is_ok()
        {
            // An error means the task already stopped, which also ended every long poll.
            let _ = finished.await;
        }
    }

    /// Stops the engine task after the commands queued before this call, and closes the storage.
    /// Later calls on any clone answer `ShuttingDown`.
    pub async fn close(&self) {
        let (done, finished) = oneshot::channel();
        if self
            .link
            .requests
            .send(Request::Close { done })
            .await
            .is_ok()
        {
            let _ = finished.await;
        }
    }
}

fn storage_error(error: StorageError) -> EngineError {
    EngineError::Storage(error.fault())
}

/// What the task answers once the batch is durable.
enum Answer {
    Command(Reply, Result<Outcome, EngineError>),
    Queue(oneshot::Sender<Option<QueueView>>, Option<QueueView>),
    Names(oneshot::Sender<Vec<QueueName>>, Vec<QueueName>),
    Message(oneshot::Sender<Option<MessageView>>, Option<MessageView>),
    Waiters(oneshot::Sender<Vec<WaiterId>>, Vec<WaiterId>),
    Stats(oneshot::Sender<Vec<QueueStats>>, Vec<QueueStats>),
    Messages(oneshot::Sender<Vec<MessageView>>, Vec<MessageView>),
    Done(oneshot::Sender<()>),
}

impl Answer {
    fn send(self) {
        // A caller that went away no longer needs its answer; a long poll's deliveries are
        // handled separately (`Task::deliver`).
        match self {
            Answer::Command(reply, result) => {
                let _ = reply.send(result);
            }
            Answer::Queue(reply, view) => {
                let _ = reply.send(view);
            }
            Answer::Names(reply, names) => {
                let _ = reply.send(names);
            }
            Answer::Message(reply, view) => {
                let _ = reply.send(view);
            }
            Answer::Waiters(reply, waiters) => {
                let _ = reply.send(waiters);
            }
            Answer::Messages(reply, messages) => {
                let _ = reply.send(messages);
            }
            Answer::Stats(reply, stats) => {
                let _ = reply.send(stats);
            }
            Answer::Done(done) => {
                let _ = done.send(());
            }
        }
    }
}

struct Task {
    /// The group commits' count, time and the records held after each.
    metrics: StoreMetrics,
    /// Where a storage failure is announced to the node.
    failure: watch::Sender<Option<StoreFault>>,
    queues: Queues,
    /// `None` once closed or after a storage failure.
    storage: Option<Storage>,
    clock: Arc<dyn Clock>,
    settings: EngineSettings,
    requests: mpsc::Receiver<Request>,
    cancels: mpsc::Receiver<WaiterId>,
    /// Open long polls and where their answer goes.
    parked: BTreeMap<WaiterId, Reply>,
    /// Messages served to a long poll whose caller had gone: made visible again in the next
    /// batch so they are not hidden for a whole visibility timeout. Bounded: at most one
    /// receive's worth (10) per long poll answered in one batch, and emptied every batch.
    abandoned: Vec<Delivery>,
    /// Wakeups produced outside a batch's commands (by a cancel's time advance), answered
    /// after the next commit like every other wakeup.
    pending_wakeups: Vec<Wakeup>,
    /// Set by `StopWaiting`: long polls are answered empty at once.
    stop_waiting: bool,
}

impl Task {
    async fn run(mut self) {
        let mut batch: Vec<Request> = Vec::with_capacity(self.settings.commit_batch_commands_max);
        let mut closing: Option<oneshot::Sender<()>> = None;
        loop {
            let sleep_for = self.sleep_until_deadline();
            tokio::select! {
                biased;
                Some(waiter) = self.cancels.recv() => self.cancel(waiter),
                request = self.requests.recv() => match request {
                    Some(request) => batch.push(request),
                    // Every handle is gone: nobody can ask anything any more.
                    None => break,
                },
                () = sleep(sleep_for) => {}
            }
            while let Ok(waiter) = self.cancels.try_recv() {
                self.cancel(waiter);
            }
            while batch.len() < self.settings.commit_batch_commands_max {
                match self.requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            let mut answers = Vec::with_capacity(batch.len());
            let mut wakeups = Vec::new();
            let now = self.clock.now();
            wakeups.extend(self.queues.advance(now));
            self.make_abandoned_visible(now, &mut wakeups);
            for request in batch.drain(..) {
                match request {
                    Request::Execute { command, reply } => {
                        self.apply(now, command, reply, &mut answers, &mut wakeups);
                    }
                    Request::Query(query) => answers.push(self.answer_query(query)),
                    Request::StopWaiting { done } => {
                        self.stop_waiting = true;
                        self.cancel_all_waiters(&mut answers);
                        answers.push(Answer::Done(done));
                    }
                    Request::Close { done } => {
                        self.stop_waiting = true;
                        self.cancel_all_waiters(&mut answers);
                        closing = Some(done);
                    }
                }
            }
            wakeups.append(&mut self.pending_wakeups);
            if let Err(error) = self.commit() {
                error!(%error, "storage failed; the node stops taking commands");
                self.fail_all(answers, wakeups, &error);
                self.failure.send_replace(Some(error.fault()));
                break;
            }
            for answer in answers {
                answer.send();
            }
            for wakeup in wakeups {
                self.deliver(wakeup);
            }
            if let Some(done) = closing.take() {
                self.close();
                let _ = done.send(());
                return;
            }
        }
        self.close();
    }

    /// How long to sleep before the next timer must fire; `None` when no timer is set.
    fn sleep_until_deadline(&self) -> Option<Duration> {
        if !self.abandoned.is_empty() {
            // Served messages nobody took: make them visible without waiting for a request.
            return Some(Duration::ZERO);
        }
        let deadline = self.queues.next_deadline()?;
        let now = self.clock.now();
        // A deadline at or before `now` fires right away, but at least 1 ms later than the last
        // advance so a deadline the core keeps at `now` cannot spin the task.
        let wait_ms = if deadline > self.queues.now() {
            deadline.since(now)
        } else {
            1
        };
        Some(Duration::from_millis(wait_ms))
    }

    fn apply(
        &mut self,
        now: Millis,
        command: Command,
        reply: Reply,
        answers: &mut Vec<Answer>,
        wakeups: &mut Vec<Wakeup>,
    ) {
        let step = self.queues.apply(now, command);
        wakeups.extend(step.wakeups);
        match step.result {
            Ok(Outcome::Waiting { waiter }) => {
                if self.stop_waiting || reply.is_closed() {
                    self.cancel_in_core(now, waiter);
                    answers.push(Answer::Command(reply, Ok(Outcome::Received(Vec::new()))));
                } else if self.parked.len() >= self.settings.long_polls_max {
                    let max = self.settings.long_polls_max;
                    warn!(
                        open = max,
                        max, "long polls at their cap: a receive refused"
                    );
                    self.cancel_in_core(now, waiter);
                    answers.push(Answer::Command(
                        reply,
                        Err(EngineError::LongPollsFull { max }),
                    ));
                } else {
                    let previous = self.parked.insert(waiter, reply);
                    assert!(
                        previous.is_none(),
                        "the core refuses a waiter id that is open"
                    );
                    debug!(%waiter, open = self.parked.len(), "long poll waiting");
                }
            }
            result => answers.push(Answer::Command(reply, result.map_err(EngineError::from))),
        }
    }

    fn cancel_in_core(&mut self, now: Millis, waiter: WaiterId) {
        let step = self.queues.apply(now, Command::CancelWaiter { waiter });
        assert!(
            step.wakeups.is_empty() || step.wakeups.iter().all(|w| w.waiter() != waiter),
            "a cancelled waiter is never answered"
        );
        // The time advance before the cancel may have answered other waiters: they are
        // answered with the next batch, after its commit.
        self.pending_wakeups.extend(step.wakeups);
    }

    fn cancel(&mut self, waiter: WaiterId) {
        if self.parked.remove(&waiter).is_some() {
            let now = self.clock.now();
            self.cancel_in_core(now, waiter);
            debug!(%waiter, "long poll cancelled by its caller");
        }
    }

    fn cancel_all_waiters(&mut self, answers: &mut Vec<Answer>) {
        let now = self.queues.now();
        let waiters: Vec<WaiterId> = self.parked.keys().copied().collect();
        for waiter in waiters {
            let reply = self.parked.remove(&waiter).expect("listed just now");
            self.cancel_in_core(now, waiter);
            answers.push(Answer::Command(reply, Ok(Outcome::Received(Vec::new()))));
        }
    }

    fn make_abandoned_visible(&mut self, now: Millis, wakeups: &mut Vec<Wakeup>) {
        for delivery in std::mem::take(&mut self.abandoned) {
            let step = self.queues.apply(
                now,
                Command::ChangeVisibility {
                    queue: delivery.queue.clone(),
                    handle: delivery.handle.clone(),
                    timeout_s: 0,
                },
            );
            wakeups.extend(step.wakeups);
            // A refusal means the message moved on meanwhile (deleted, purged, expired): then
            // there is nothing to make visible.
            if let Err(reject) = step.result {
                debug!(message_id = %delivery.message, %reject, "abandoned delivery not made visible");
            }
        }
    }

    fn answer_query(&self, query: Query) -> Answer {
        match query {
            Query::Queue { name, reply } => Answer::Queue(reply, self.queues.queue(&name)),
            Query::ListQueues {
                prefix,
                after,
                limit,
                reply,
            } => Answer::Names(
                reply,
                self.queues.list_queues(&prefix, after.as_ref(), limit),
            ),
            Query::DeadLetterSources { dlq, reply } => {
                Answer::Names(reply, self.queues.dead_letter_sources(&dlq))
            }
            Query::Message { queue, id, reply } => {
                Answer::Message(reply, self.queues.message(&queue, id))
            }
            Query::Waiters { queue, reply } => Answer::Waiters(reply, self.queues.waiters(&queue)),
            Query::Stats { reply } => Answer::Stats(reply, self.queues.stats()),
            Query::Peek {
                queue,
                limit,
                reply,
            } => Answer::Messages(reply, self.queues.messages(&queue).take(limit).collect()),
        }
    }

    fn commit(&mut self) -> Result<(), StorageError> {
        let changes = self.queues.take_changes();
        if changes.is_empty() {
            return Ok(());
        }
        let storage = self
            .storage
            .as_mut()
            .expect("storage is open while the task runs");
        let count = changes.len();
        // tokio's clock, so that under turmoil the figure is simulated time like every other.
        let started = tokio::time::Instant::now();
        // redb's commit blocks on fsync. On a multi-thread runtime, `block_in_place` lets the
        // other tasks move to another worker meanwhile; on a current-thread runtime (the
        // simulation) the commit simply runs inline.
        let result = if tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread
        {
            tokio::task::block_in_place(|| storage.commit(changes))
        } else {
            storage.commit(changes)
        };
        if result.is_ok() {
            self.metrics
                .observe_commit(started.elapsed(), storage.records());
            tracing::trace!(
                records = count,
                revision = storage.revision(),
                "group commit"
            );
        }
        result
    }

    fn deliver(&mut self, wakeup: Wakeup) {
        match wakeup {
            Wakeup::Served { waiter, deliveries } => {
                let Some(reply) = self.parked.remove(&waiter) else {
                    // Cancelled meanwhile: its messages must not stay hidden.
                    self.abandoned.extend(deliveries);
                    return;
                };
                if let Err(Ok(Outcome::Received(deliveries))) =
                    reply.send(Ok(Outcome::Received(deliveries)))
                {
                    self.abandoned.extend(deliveries);
                }
            }
            Wakeup::Empty { waiter } => {
                if let Some(reply) = self.parked.remove(&waiter) {
                    let _ = reply.send(Ok(Outcome::Received(Vec::new())));
                }
            }
        }
    }

    fn fail_all(&mut self, answers: Vec<Answer>, _wakeups: Vec<Wakeup>, error: &StorageError) {
        let failure = || EngineError::Storage(error.fault());
        for answer in answers {
            match answer {
                Answer::Command(reply, _) => {
                    let _ = reply.send(Err(failure()));
                }
                // Queries and shutdown steps carry nothing that could be lost.
                other => other.send(),
            }
        }
        for (_, reply) in std::mem::take(&mut self.parked) {
            let _ = reply.send(Err(failure()));
        }
        self.storage = None;
    }

    fn close(&mut self) {
        self.requests.close();
        for (_, reply) in std::mem::take(&mut self.parked) {
            let _ = reply.send(Err(EngineError::ShuttingDown));
        }
        if self.storage.take().is_some() {
            info!("storage closed");
        }
    }
}

async fn sleep(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use std::collections::BTreeMap;
    use trireme_core::QueueAttributes;

    fn start(dir: &std::path::Path) -> Engine {
        let storage = Storage::open_path(dir, 8 * 1024 * 1024).unwrap();
        let handles = HandleCodec::new(b"engine-test-key-0123456789").unwrap();
        Engine::start(
            storage,
            Arc::new(SystemClock),
            handles,
            EngineSettings::default(),
            Some(7),
        )
        .unwrap()
    }

    fn name() -> QueueName {
        QueueName::try_from("grouped").unwrap()
    }

    /// Creates the queue `name()` with default attributes.
    async fn create_queue(engine: &Engine) {
        engine
            .execute(Command::CreateQueue {
                name: name(),
                attributes: QueueAttributes::default(),
                tags: BTreeMap::new(),
            })
            .await
            .unwrap();
    }

    fn send(engine: &Engine, body: &str) -> Command {
        Command::Send {
            queue: name(),
            id: engine.new_message_id(),
            body: body.to_owned(),
            attributes: BTreeMap::new(),
            system: Default::default(),
            delay_s: None,
            dedup: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_sends_share_group_commits() {
        let dir = tempfile::tempdir().unwrap();
        let engine = start(dir.path());
        create_queue(&engine).await;
        let commands: Vec<Command> = (0..200).map(|i| send(&engine, &format!("m{i}"))).collect();
        let results = engine.execute_all(commands).await;
        assert!(results.iter().all(Result::is_ok));
        engine.close().await;
        let storage = Storage::open_path(dir.path(), 8 * 1024 * 1024).unwrap();
        // One commit for the create, and far fewer than one per send for the 200 sends.
        assert!(storage.revision() >= 2);
        assert!(
            storage.revision() <= 20,
            "200 queued sends took {} commits",
            storage.revision()
        );
        let messages = storage
            .load()
            .unwrap()
            .into_iter()
            .filter(|record| matches!(record, trireme_core::Record::Message(_)))
            .count();
        assert_eq!(messages, 200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_idle_long_polls_are_each_served_once_by_sends() {
        let dir = tempfile::tempdir().unwrap();
        let engine = start(dir.path());
        create_queue(&engine).await;
        let mut polls = Vec::new();
        for _ in 0..1_000 {
            let receive = Command::Receive {
                queue: name(),
                max: 10,
                visibility_s: Some(600),
                wait_s: Some(20),
                waiter: engine.new_waiter_id(),
            };
            let polling = engine.clone();
            polls.push(tokio::spawn(async move { polling.execute(receive).await }));
        }
        let mut parked = 0;
        for _ in 0..1_000 {
            parked = engine.waiters(&name()).await.unwrap().len();
            if parked == 1_000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(parked, 1_000);
        let results = engine
            .execute_all(
                (0..1_000)
                    .map(|i| send(&engine, &format!("m{i}")))
                    .collect(),
            )
            .await;
        assert!(results.iter().all(Result::is_ok));
        let mut delivered = std::collections::BTreeSet::new();
        for poll in polls {
            let outcome = tokio::time::timeout(Duration::from_secs(30), poll)
                .await
                .expect("a waiter was never answered")
                .unwrap()
                .unwrap();
            let Outcome::Received(deliveries) = outcome else {
                panic!("{outcome:?}")
            };
            assert_eq!(deliveries.len(), 1, "each send serves the oldest waiter");
            assert!(delivered.insert(deliveries[0].message));
        }
        assert_eq!(delivered.len(), 1_000);
        assert!(engine.waiters(&name()).await.unwrap().is_empty());
    }

    /// An in-memory disk whose syncs fail once `broken` is set, and whose writes fail as a
    /// full device's once `full` is set.
    #[derive(Debug)]
    struct BreakableDisk {
        inner: redb::backends::InMemoryBackend,
        broken: Arc<std::sync::atomic::AtomicBool>,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    impl redb::StorageBackend for BreakableDisk {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            if self.broken.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("disk failed"));
            }
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            if self.full.load(Ordering::SeqCst) {
                const ENOSPC: i32 = 28;
                return Err(std::io::Error::from_raw_os_error(ENOSPC));
            }
            self.inner.write(offset, data)
        }
    }

    /// The switches of a [`BreakableDisk`].
    struct Switches {
        broken: Arc<std::sync::atomic::AtomicBool>,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    /// An engine on a healthy [`BreakableDisk`] with the test queue, and the disk's switches.
    async fn on_breakable_disk() -> (Engine, Switches) {
        let switches = Switches {
            broken: Arc::default(),
            full: Arc::default(),
        };
        let disk = BreakableDisk {
            inner: redb::backends::InMemoryBackend::new(),
            broken: switches.broken.clone(),
            full: switches.full.clone(),
        };
        let storage = Storage::open_backend(disk, 1 << 20).unwrap();
        let handles = HandleCodec::new(b"engine-test-key-0123456789").unwrap();
        let engine = Engine::start(
            storage,
            Arc::new(SystemClock),
            handles,
            EngineSettings::default(),
            Some(3),
        )
        .unwrap();
        create_queue(&engine).await;
        (engine, switches)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_is_refused_as_one_not_as_corruption() {
        let (engine, disk) = on_breakable_disk().await;
        let full = disk.full;
        full.store(true, Ordering::SeqCst);
        let refused = engine.execute(send(&engine, "no room")).await;
        let Err(EngineError::Storage(fault)) = refused else {
            panic!("a full disk refuses the send: {refused:?}");
        };
        assert_eq!(fault.kind, crate::fault::FaultKind::DiskFull, "{fault}");
        let status = crate::status::engine_status(&EngineError::Storage(fault));
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("the disk is full"), "{status:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_sync_refuses_the_batch_and_stops_the_engine() {
        let (engine, disk) = on_breakable_disk().await;
        let broken = disk.broken;
        broken.store(true, Ordering::SeqCst);
        let refused = engine.execute(send(&engine, "lost")).await;
        assert!(
            matches!(refused, Err(EngineError::Storage { .. })),
            "{refused:?}"
        );
        let fault = tokio::time::timeout(Duration::from_secs(10), engine.failed())
            .await
            .expect("the failure was not announced");
        assert!(fault.detail.contains("disk failed"), "{fault}");
        assert_eq!(
            fault.kind,
            crate::fault::FaultKind::Io,
            "a failed sync is not a full disk"
        );
        assert!(matches!(
            engine.execute(send(&engine, "later")).await,
            Err(EngineError::ShuttingDown)
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_with_the_same_seed_draws_new_message_ids() {
        let dir = tempfile::tempdir().unwrap();
        let engine = start(dir.path());
        create_queue(&engine).await;
        let first = engine.execute(send(&engine, "before")).await.unwrap();
        engine.close().await;
        let engine = start(dir.path());
        let second = engine.execute(send(&engine, "after")).await.unwrap();
        engine.close().await;
        let (Outcome::Sent { id: first, .. }, Outcome::Sent { id: second, .. }) = (first, second)
        else {
            panic!("both sends are stored");
        };
        assert_ne!(first, second, "a restarted node reused a message id");
    }

    /// The simulation runs each node on a current-thread runtime, where the commit runs inline.
    #[tokio::test(flavor = "current_thread")]
    async fn engine_commits_on_a_current_thread_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let engine = start(dir.path());
        create_queue(&engine).await;
        let results = engine
            .execute_all((0..10).map(|i| send(&engine, &format!("m{i}"))).collect())
            .await;
        assert!(results.iter().all(Result::is_ok));
        engine.close().await;
        let storage = Storage::open_path(dir.path(), 8 * 1024 * 1024).unwrap();
        // The queue, and each message's state and body records.
        assert_eq!(storage.load().unwrap().len(), 21);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_engine_refuses_commands_and_restart_restores_them() {
        let dir = tempfile::tempdir().unwrap();
        let engine = start(dir.path());
        create_queue(&engine).await;
        let sent = engine.execute(send(&engine, "kept")).await.unwrap();
        engine.close().await;
        assert!(matches!(
            engine.execute(send(&engine, "late")).await,
            Err(EngineError::ShuttingDown)
        ));
        let Outcome::Sent { id, .. } = sent else {
            panic!("{sent:?}")
        };
        let engine = start(dir.path());
        let view = engine.message(&name(), id).await.unwrap().unwrap();
        assert_eq!(view.body, "kept");
        assert_eq!(
            engine.queue(&name()).await.unwrap().unwrap().counts.ready,
            1
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_long_poll_is_cancelled_in_the_core() {
        let dir = tempfile::tempdir().unwrap();
        let engine = start(dir.path());
        create_queue(&engine).await;
        let receive = Command::Receive {
            queue: name(),
            max: 1,
            visibility_s: None,
            wait_s: Some(20),
            waiter: engine.new_waiter_id(),
        };
        let polling = engine.clone();
        let poll = tokio::spawn(async move { polling.execute(receive).await });
        for _ in 0..500 {
            if engine.waiters(&name()).await.unwrap().len() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(engine.waiters(&name()).await.unwrap().len(), 1);
        poll.abort();
        let mut cancelled = false;
        for _ in 0..500 {
            if engine.waiters(&name()).await.unwrap().is_empty() {
                cancelled = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(cancelled, "the dropped long poll stayed open");
    }
}
