//! `Worker`: the consumer loop every queue user writes, written once.
//!
//! A worker long-polls a queue in batches, runs a handler per message under a concurrency
//! limit, keeps each message invisible while its handler runs (visibility heartbeats, within the
//! 12 h cap), and settles the outcome: success deletes, a retryable error makes the message
//! visible again after a capped, fully jittered backoff, a terminal error moves it to the queue's
//! dead-letter queue at once (the node's dead-letter-now: the same message, its id and receive
//! count kept). On shutdown it stops receiving, lets running handlers finish within
//! a grace period, and releases (makes visible at once) whatever is still running after it.
//!
//! The worker never deletes a message whose handler did not succeed, and a dead-lettered message
//! moves in one step on the node, so a crash at any point leaves each message either handled or
//! still in a queue (spec/queue-core.md I6: at least once, never lost). Handlers must therefore be idempotent; [`Job::idempotency_key`] helps.
//!
//! # An idempotent handler
//!
//! A handler records the key of each job it completed in the same transaction as the job's
//! effect, so a redelivered job (the worker crashed before the delete, or a heartbeat lost the
//! message to another worker) is recognized and only acknowledged:
//!
//! ```no_run
//! use std::collections::BTreeSet;
//! use std::sync::{Arc, Mutex};
//!
//! use trireme_client::{Client, HandlerError, Job, QueueName, Worker};
//!
//! /// Stands in for a database table with a unique index on the key.
//! #[derive(Default)]
//! struct Ledger {
//!     applied: Mutex<BTreeSet<String>>,
//! }
//!
//! async fn charge(ledger: Arc<Ledger>, job: Job) -> Result<(), HandlerError> {
//!     let amount: u64 = job.message.body.parse().map_err(HandlerError::terminal)?;
//!     let mut applied = ledger.applied.lock().expect("ledger lock");
//!     // "INSERT ... ON CONFLICT (key) DO NOTHING": a second delivery changes nothing.
//!     if applied.insert(job.idempotency_key().to_owned()) {
//!         println!("charged {amount} for {}", job.message.message_id);
//!     }
//!     Ok(())
//! }
//!
//! # async fn demo() -> Result<(), trireme_client::Error> {
//! let client = Client::connect(["http://127.0.0.1:7100"])?;
//! let ledger = Arc::new(Ledger::default());
//! let worker = Worker::new(client, QueueName::new("payments")?, move |job| {
//!     charge(ledger.clone(), job)
//! });
//! worker.run(async { tokio::signal::ctrl_c().await.expect("a signal handler") }).await
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::client::Client;
use crate::error::Error;
use crate::limits;
use crate::types::{
    AttributeValue, Message, MessageAttribute, QueueName, ReceiveOptions, VisibilityChange,
};

/// The message attribute that carries a job's idempotency key when the producer set one; without
/// it the key is the message id (which a dead-letter move keeps).
pub const IDEMPOTENCY_KEY_ATTRIBUTE: &str = "trireme-idempotency-key";

/// Why a handler did not succeed, and what should happen to the message.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Try again later: the message becomes visible again after a backoff. The queue's
    /// `maxReceiveCount` still bounds the attempts.
    #[error("retryable: {reason}")]
    Retryable {
        /// What went wrong.
        reason: String,
    },
    /// Never succeeds: the message goes to the queue's dead-letter queue at once, moved by the
    /// node (`Client::dead_letter_message`): the same message id, receive count and send time,
    /// with this queue as its dead-letter source. A queue without a dead-letter queue has nowhere
    /// to put it: the message is retried instead.
    #[error("terminal: {reason}")]
    Terminal {
        /// What went wrong.
        reason: String,
    },
}

impl HandlerError {
    /// A retryable failure caused by `cause`.
    pub fn retryable(cause: impl std::fmt::Display) -> Self {
        Self::Retryable {
            reason: cause.to_string(),
        }
    }

    /// A terminal failure caused by `cause`.
    pub fn terminal(cause: impl std::fmt::Display) -> Self {
        Self::Terminal {
            reason: cause.to_string(),
        }
    }
}

/// One message handed to a handler.
#[derive(Clone, Debug)]
pub struct Job {
    /// The queue it was received from.
    pub queue: QueueName,
    /// The message: id, body, attributes, receive count.
    pub message: Message,
}

impl Job {
    /// A key that is the same for every delivery of this message, also after a move to the
    /// dead-letter queue (a move keeps the message id): the `trireme-idempotency-key` attribute
    /// when set (producers may set their own), else the message id. Record it with the job's
    /// effect to make the handler idempotent.
    pub fn idempotency_key(&self) -> &str {
        match self.message.attributes.get(IDEMPOTENCY_KEY_ATTRIBUTE) {
            Some(MessageAttribute {
                value: AttributeValue::String(key),
                ..
            }) if !key.is_empty() => key,
            _ => self.message.message_id.as_str(),
        }
    }
}

/// How a handler run ended, for [`WorkerMetrics::handler_latency`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerOutcome {
    /// It returned `Ok`.
    Succeeded,
    /// It returned a retryable error, or panicked.
    Retryable,
    /// It returned a terminal error.
    Terminal,
}

/// Hooks the worker calls as it settles messages. Every method defaults to doing nothing;
/// implement the ones you export. Called from the worker's tasks: keep them quick.
pub trait WorkerMetrics: Send + Sync {
    /// The handler succeeded and the message was deleted.
    fn processed(&self, _message: &Message) {}
    /// The handler asked for a retry; the message becomes visible after `delay`.
    fn retried(&self, _message: &Message, _delay: Duration) {}
    /// The message was moved to the dead-letter queue after a terminal error.
    fn dead_lettered(&self, _message: &Message) {}
    /// A heartbeat extended the message's visibility.
    fn extended(&self, _message: &Message) {}
    /// Shutdown released the message unfinished (visible again at once).
    fn released(&self, _message: &Message) {}
    /// A handler run ended after `latency`.
    fn handler_latency(&self, _message: &Message, _latency: Duration, _outcome: HandlerOutcome) {}
}

/// Counts of a worker's settlements: a [`WorkerMetrics`] that keeps totals.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    processed: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    extended: AtomicU64,
    released: AtomicU64,
    handler_runs: AtomicU64,
    handler_latency_us_total: AtomicU64,
}

/// A snapshot of [`WorkerCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WorkerCounts {
    /// Messages handled and deleted.
    pub processed: u64,
    /// Retries scheduled.
    pub retried: u64,
    /// Messages moved to the dead-letter queue.
    pub dead_lettered: u64,
    /// Visibility extensions.
    pub extended: u64,
    /// Messages released unfinished at shutdown.
    pub released: u64,
    /// Handler runs that ended (any outcome).
    pub handler_runs: u64,
    /// Their total time, in microseconds.
    pub handler_latency_us_total: u64,
}

impl WorkerCounters {
    /// The counts so far.
    pub fn snapshot(&self) -> WorkerCounts {
        WorkerCounts {
            processed: self.processed.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            extended: self.extended.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            handler_runs: self.handler_runs.load(Ordering::Relaxed),
            handler_latency_us_total: self.handler_latency_us_total.load(Ordering::Relaxed),
        }
    }
}

impl WorkerMetrics for WorkerCounters {
    fn processed(&self, _: &Message) {
        self.processed.fetch_add(1, Ordering::Relaxed);
    }
    fn retried(&self, _: &Message, _: Duration) {
        self.retried.fetch_add(1, Ordering::Relaxed);
    }
    fn dead_lettered(&self, _: &Message) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }
    fn extended(&self, _: &Message) {
        self.extended.fetch_add(1, Ordering::Relaxed);
    }
    fn released(&self, _: &Message) {
        self.released.fetch_add(1, Ordering::Relaxed);
    }
    fn handler_latency(&self, _: &Message, latency: Duration, _: HandlerOutcome) {
        self.handler_runs.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.handler_latency_us_total
            .fetch_add(us, Ordering::Relaxed);
    }
}

/// A worker's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Handlers running at once (1 to `limits::WORKER_CONCURRENCY_MAX`).
    pub concurrency: usize,
    /// Messages asked for per receive (1-10); fewer when fewer handler slots are free.
    pub receive_batch: u32,
    /// Long-poll wait of each receive (0-20 s).
    pub wait_seconds: u32,
    /// Visibility timeout of each receive and of each heartbeat's extension (1-43,200 s).
    /// Heartbeats run every half of it.
    pub visibility_timeout_seconds: u32,
    /// The delay before a retryable failure is visible again; the receive count picks the step.
    pub retry_backoff: Backoff,
    /// How long running handlers may go on after shutdown begins before their messages are
    /// released.
    pub shutdown_grace: Duration,
    /// The wait after a receive failed for a reason that may pass (a node down).
    pub receive_error_backoff: Backoff,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: limits::WORKER_CONCURRENCY_DEFAULT,
            receive_batch: limits::RECEIVE_MESSAGES_MAX,
            wait_seconds: limits::WAIT_SECONDS_MAX,
            visibility_timeout_seconds: limits::WORKER_VISIBILITY_SECONDS_DEFAULT,
            retry_backoff: Backoff::new(
                limits::WORKER_RETRY_BACKOFF_BASE_DEFAULT,
                limits::WORKER_RETRY_BACKOFF_CAP_DEFAULT,
            ),
            shutdown_grace: limits::WORKER_SHUTDOWN_GRACE_DEFAULT,
            receive_error_backoff: Backoff::new(
                limits::RETRY_BACKOFF_BASE_DEFAULT,
                limits::RETRY_BACKOFF_CAP_DEFAULT,
            ),
        }
    }
}

impl WorkerConfig {
    fn check(&self) -> Result<(), Error> {
        let bad = |field: &str, message: String| {
            Err(Error::InvalidArgument {
                field: Some(field.to_owned()),
                message,
            })
        };
        if !(1..=limits::WORKER_CONCURRENCY_MAX).contains(&self.concurrency) {
            return bad(
                "concurrency",
                format!("must be 1-{}", limits::WORKER_CONCURRENCY_MAX),
            );
        }
        if !(1..=limits::RECEIVE_MESSAGES_MAX).contains(&self.receive_batch) {
            return bad(
                "receive_batch",
                format!("must be 1-{}", limits::RECEIVE_MESSAGES_MAX),
            );
        }
        if self.wait_seconds > limits::WAIT_SECONDS_MAX {
            return bad(
                "wait_seconds",
                format!("must be 0-{}", limits::WAIT_SECONDS_MAX),
            );
        }
        if !(1..=limits::VISIBILITY_SECONDS_MAX).contains(&self.visibility_timeout_seconds) {
            return bad(
                "visibility_timeout_seconds",
                format!("must be 1-{}", limits::VISIBILITY_SECONDS_MAX),
            );
        }
        Ok(())
    }
}

/// A consumer of one queue. See the module docs.
pub struct Worker<H> {
    client: Client,
    queue: QueueName,
    config: WorkerConfig,
    handler: Arc<H>,
    metrics: Arc<dyn WorkerMetrics>,
}

/// What every per-message task shares.
struct Shared<H> {
    client: Client,
    queue: QueueName,
    config: WorkerConfig,
    handler: Arc<H>,
    metrics: Arc<dyn WorkerMetrics>,
}

/// Aborts the task when dropped, so a worker that is itself dropped (crashes) leaves no handler
/// running.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<H, Fut> Worker<H>
where
    H: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    /// A worker of `queue` running `handler` per message, with default settings; its metrics
    /// are counted but not exported until [`Worker::with_metrics`] names a sink.
    pub fn new(client: Client, queue: QueueName, handler: H) -> Self {
        Self {
            client,
            queue,
            config: WorkerConfig::default(),
            handler: Arc::new(handler),
            metrics: Arc::new(WorkerCounters::default()),
        }
    }

    /// Replaces the settings.
    #[must_use]
    pub fn with_config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Sends settlement events to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<dyn WorkerMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Runs until `shutdown` resolves, then shuts down gracefully: stops receiving, waits up to
    /// `shutdown_grace` for running handlers, releases the messages of those still running, and
    /// returns once every message it received is settled or released. Dropping the future
    /// instead stops everything at once, like a crash: its messages come back after their
    /// visibility timeout.
    ///
    /// A receive open when shutdown begins is finished, not cancelled (a cancelled poll's answer
    /// could be lost on the way, hiding its messages for a visibility timeout), so shutdown may
    /// take up to `wait_seconds` longer; the messages it brings are released at once.
    ///
    /// Terminal failures go to the dead-letter queue the node's redrive policy names when they
    /// happen; the worker only warns at start if the queue has none.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for settings out of range, the errors of
    /// [`Client::get_queue`] at start, and any receive error that retrying cannot cure (the
    /// queue was deleted, an argument refused); running handlers are settled first.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        self.config.check()?;
        let queue_info = self.client.get_queue(&self.queue).await?;
        if queue_info.settings.redrive_policy.is_none() {
            warn!(queue = %self.queue, "queue has no redrive policy: terminal failures will be retried");
        }
        let shared = Arc::new(Shared {
            client: self.client,
            queue: self.queue,
            config: self.config,
            handler: self.handler,
            metrics: self.metrics,
        });
        info!(queue = %shared.queue, concurrency = shared.config.concurrency, "worker started");
        let slots = Arc::new(Semaphore::new(shared.config.concurrency));
        let (release_tx, release_rx) = watch::channel(false);
        // Dropping the set (a crash) aborts every per-message task.
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut receive_failures: u32 = 0;
        let mut shutdown = std::pin::pin!(shutdown);
        let result = loop {
            while tasks.try_join_next().is_some() {}
            let first = tokio::select! {
                permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                () = &mut shutdown => break Ok(()),
            };
            let mut permits = vec![first];
            while permits.len() < shared.config.receive_batch as usize {
                match slots.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }
            let options = ReceiveOptions {
                max_messages: u32::try_from(permits.len()).expect("at most 10 permits"),
                visibility_timeout_seconds: Some(shared.config.visibility_timeout_seconds),
                wait_seconds: Some(shared.config.wait_seconds),
            };
            // The node's receive time is no earlier than this, so the 12 h cap computed from it
            // is never later than the node's.
            let received_at = Instant::now();
            let receive = shared.client.receive_messages(&shared.queue, &options);
            let mut receive = std::pin::pin!(receive);
            let received = tokio::select! {
                received = &mut receive => received,
                () = &mut shutdown => {
                    // Cancelling the poll could lose its answer on the way back, leaving those
                    // messages invisible for a whole visibility timeout; finishing it costs at
                    // most one long-poll wait, and what it brings is released at once.
                    if let Ok(messages) = receive.await {
                        release_all(&shared, &messages).await;
                    }
                    break Ok(());
                }
            };
            match received {
                Ok(messages) => {
                    receive_failures = 0;
                    debug!(queue = %shared.queue, count = messages.len(), "received");
                    for (message, permit) in messages.into_iter().zip(permits) {
                        let task = supervise(
                            shared.clone(),
                            message,
                            received_at,
                            release_rx.clone(),
                            permit,
                        );
                        tasks.spawn(task);
                    }
                }
                Err(error) if recoverable(&error) => {
                    let delay = shared
                        .config
                        .receive_error_backoff
                        .delay(receive_failures, &mut rand::rng());
                    receive_failures = receive_failures.saturating_add(1);
                    warn!(queue = %shared.queue, error = %error, retry_in_ms = delay.as_millis() as u64, "receive failed");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = &mut shutdown => break Ok(()),
                    }
                }
                Err(error) => {
                    error!(queue = %shared.queue, error = %error, "receive refused; worker stops");
                    break Err(error);
                }
            }
        };
        info!(queue = %shared.queue, running = tasks.len(), "worker stopping: no more receives");
        let drained = tokio::time::timeout(shared.config.shutdown_grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(queue = %shared.queue, running = tasks.len(), "grace period over: releasing unfinished messages");
            release_tx.send_replace(true);
            while tasks.join_next().await.is_some() {}
        }
        info!(queue = %shared.queue, "worker stopped");
        result
    }
}

/// Makes messages received during shutdown visible again at once, in batches.
async fn release_all<H>(shared: &Shared<H>, messages: &[Message]) {
    for chunk in messages.chunks(limits::BATCH_ENTRIES_MAX) {
        let entries: Vec<VisibilityChange> = chunk
            .iter()
            .enumerate()
            .map(|(i, m)| VisibilityChange {
                id: i.to_string(),
                receipt_handle: m.receipt_handle.clone(),
                visibility_timeout_seconds: 0,
            })
            .collect();
        match shared
            .client
            .change_visibility_batch(&shared.queue, &entries)
            .await
        {
            Ok(outcome) => {
                for id in &outcome.successful {
                    match id.parse::<usize>().ok().and_then(|i| chunk.get(i)) {
                        Some(message) => shared.metrics.released(message),
                        None => warn!(entry = %id, "the node answered an entry id it was not sent"),
                    }
                }
                for failed in &outcome.failed {
                    warn!(entry = %failed.id, code = %failed.code, "release failed: the message returns after its visibility timeout");
                }
            }
            Err(error) => {
                warn!(error = %error, "release failed: the messages return after their visibility timeout");
            }
        }
    }
}

/// Whether a receive error may pass by itself, so the worker keeps polling.
fn recoverable(error: &Error) -> bool {
    matches!(
        error,
        Error::Unavailable { .. }
            | Error::NoEndpointAvailable { .. }
            | Error::Timeout { .. }
            | Error::ResourceExhausted { .. }
            | Error::Server { .. }
    )
}

/// Whether a visibility change or delete failed because the message is no longer ours: another
/// receive superseded the handle, or the message is gone.
fn lost(error: &Error) -> bool {
    matches!(
        error,
        Error::StaleReceiptHandle { .. }
            | Error::MessageNotInFlight { .. }
            | Error::ReceiptHandleInvalid { .. }
            | Error::QueueNotFound { .. }
    )
}

/// Whole seconds covering `duration`.
fn ceil_seconds(duration: Duration) -> u32 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    u32::try_from(seconds).unwrap_or(u32::MAX)
}

/// Seconds left before the 12 h visibility cap of a message received at `received_at`, one
/// second kept in reserve for the clocks of client and node.
fn seconds_to_cap(received_at: Instant, now: Instant) -> u32 {
    let elapsed = ceil_seconds(now.saturating_duration_since(received_at));
    limits::VISIBILITY_SECONDS_MAX
        .saturating_sub(elapsed)
        .saturating_sub(1)
}

/// Owns one message from receive to settlement: runs the handler in its own task, extends the
/// visibility while it runs, then deletes, delays or dead-letters the message, or releases it if
/// shutdown's grace period ends first. Holds its concurrency slot (`_slot`) throughout.
async fn supervise<H, Fut>(
    shared: Arc<Shared<H>>,
    message: Message,
    received_at: Instant,
    mut release: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) where
    H: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let job = Job {
        queue: shared.queue.clone(),
        message: message.clone(),
    };
    let started = Instant::now();
    let mut handler = AbortOnDrop(tokio::spawn((shared.handler)(job)));
    let visibility = Duration::from_secs(u64::from(shared.config.visibility_timeout_seconds));
    let beat_every = visibility / 2;
    let mut next_beat = started + beat_every;
    let mut extending = true;
    let outcome = loop {
        tokio::select! {
            joined = &mut handler.0 => break match joined {
                Ok(outcome) => outcome,
                Err(join_error) => {
                    error!(message_id = %message.message_id, error = %join_error, "handler panicked");
                    Err(HandlerError::retryable("the handler panicked"))
                }
            },
            () = tokio::time::sleep_until(next_beat), if extending => {
                extending = extend(&shared, &message, received_at).await;
                next_beat = Instant::now() + beat_every;
            }
            () = released(&mut release) => {
                drop(handler);
                settle_release(&shared, &message).await;
                return;
            }
        }
    };
    let kind = match &outcome {
        Ok(()) => HandlerOutcome::Succeeded,
        Err(HandlerError::Retryable { .. }) => HandlerOutcome::Retryable,
        Err(HandlerError::Terminal { .. }) => HandlerOutcome::Terminal,
    };
    shared
        .metrics
        .handler_latency(&message, started.elapsed(), kind);
    match outcome {
        Ok(()) => settle_success(&shared, &message).await,
        Err(HandlerError::Retryable { reason }) => {
            settle_retry(&shared, &message, received_at, &reason).await
        }
        Err(HandlerError::Terminal { reason }) => {
            settle_dead_letter(&shared, &message, received_at, &reason).await
        }
    }
}

/// Resolves once shutdown's grace period ends; never if the worker is gone.
async fn released(release: &mut watch::Receiver<bool>) {
    if release.wait_for(|released| *released).await.is_err() {
        // The sender, owned by `run`, is gone: the worker was dropped (a crash), and this task
        // is being aborted with it. A crash releases nothing; the timeout brings messages back.
        std::future::pending::<()>().await;
    }
}

/// One heartbeat. Returns whether heartbeats should go on.
async fn extend<H>(shared: &Shared<H>, message: &Message, received_at: Instant) -> bool {
    let timeout = shared
        .config
        .visibility_timeout_seconds
        .min(seconds_to_cap(received_at, Instant::now()));
    if timeout == 0 {
        warn!(message_id = %message.message_id, "12 h visibility cap reached: the message will be redelivered");
        return false;
    }
    match shared
        .client
        .change_visibility(&shared.queue, &message.receipt_handle, timeout)
        .await
    {
        Ok(()) => {
            shared.metrics.extended(message);
            true
        }
        Err(error) if lost(&error) => {
            warn!(message_id = %message.message_id, error = %error, "message lost while its handler runs: it may be processed twice");
            false
        }
        Err(error) => {
            warn!(message_id = %message.message_id, error = %error, "heartbeat failed; trying again");
            true
        }
    }
}

async fn settle_success<H>(shared: &Shared<H>, message: &Message) {
    match shared
        .client
        .delete_message(&shared.queue, &message.receipt_handle)
        .await
    {
        Ok(()) => shared.metrics.processed(message),
        Err(error) => {
            warn!(message_id = %message.message_id, error = %error, "delete after success failed: the message will be redelivered");
        }
    }
}

async fn settle_retry<H>(
    shared: &Shared<H>,
    message: &Message,
    received_at: Instant,
    reason: &str,
) {
    let step = message.receive_count.saturating_sub(1);
    let wanted = ceil_seconds(shared.config.retry_backoff.delay(step, &mut rand::rng()));
    let delay_s = wanted.min(seconds_to_cap(received_at, Instant::now()));
    let delay = Duration::from_secs(u64::from(delay_s));
    match shared
        .client
        .change_visibility(&shared.queue, &message.receipt_handle, delay_s)
        .await
    {
        Ok(()) => {
            debug!(message_id = %message.message_id, reason, delay_s, "retry scheduled");
            shared.metrics.retried(message, delay);
        }
        Err(error) => {
            // The message still comes back when its current visibility ends.
            warn!(message_id = %message.message_id, error = %error, "scheduling the retry failed");
        }
    }
}

/// Moves the message to the dead-letter queue with the node's dead-letter-now
/// (spec/queue-core.md, DeadLetterNow): the same message, with its id, receive count and send
/// time, arrives there with this queue as its source, in one step on the node. Without a
/// dead-letter queue (the policy was removed, or names a deleted queue) the message is retried.
async fn settle_dead_letter<H>(
    shared: &Shared<H>,
    message: &Message,
    received_at: Instant,
    reason: &str,
) {
    match shared
        .client
        .dead_letter_message(&shared.queue, &message.receipt_handle)
        .await
    {
        Ok(dead_letter_queue) => {
            debug!(message_id = %message.message_id, %dead_letter_queue, reason, "dead-lettered");
            shared.metrics.dead_lettered(message);
        }
        Err(error @ Error::NoDeadLetterQueue { .. }) => {
            warn!(message_id = %message.message_id, error = %error, reason, "terminal failure without a dead-letter queue; retrying");
            settle_retry(shared, message, received_at, reason).await;
        }
        Err(error) if lost(&error) => {
            // Superseded, or no longer in the queue (also when a retried call's first attempt
            // moved it): nothing is left to settle here.
            warn!(message_id = %message.message_id, error = %error, "message no longer held when dead-lettering it");
        }
        Err(error) => {
            warn!(message_id = %message.message_id, error = %error, "dead-letter now failed; retrying later");
            settle_retry(shared, message, received_at, reason).await;
        }
    }
}

async fn settle_release<H>(shared: &Shared<H>, message: &Message) {
    match shared
        .client
        .change_visibility(&shared.queue, &message.receipt_handle, 0)
        .await
    {
        Ok(()) => shared.metrics.released(message),
        Err(error) => {
            warn!(message_id = %message.message_id, error = %error, "release failed: the message returns after its visibility timeout");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::types::{MessageId, ReceiptHandle};

    fn message(attributes: BTreeMap<String, MessageAttribute>) -> Message {
        Message {
            message_id: MessageId::new("m-1"),
            receipt_handle: ReceiptHandle::new("h"),
            body: "b".to_owned(),
            attributes,
            receive_count: 1,
            sent_at_ms: 0,
            first_receive_at_ms: 0,
            dead_letter_source: None,
            md5_of_body: String::new(),
        }
    }

    fn job(attributes: BTreeMap<String, MessageAttribute>) -> Job {
        Job {
            queue: QueueName::new("q").unwrap(),
            message: message(attributes),
        }
    }

    #[test]
    fn idempotency_key_is_the_message_id_unless_an_attribute_sets_it() {
        assert_eq!(job(BTreeMap::new()).idempotency_key(), "m-1");
        let keyed = BTreeMap::from([(
            IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            MessageAttribute::string("order-7"),
        )]);
        assert_eq!(job(keyed).idempotency_key(), "order-7");
        let binary = BTreeMap::from([(
            IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(),
            MessageAttribute::binary(vec![1]),
        )]);
        assert_eq!(job(binary).idempotency_key(), "m-1");
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_seconds(Duration::ZERO), 0);
        assert_eq!(ceil_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ceil_seconds(Duration::from_secs(3)), 3);
        assert_eq!(ceil_seconds(Duration::from_millis(3_001)), 4);
    }

    #[test]
    fn the_cap_leaves_a_second_in_reserve_and_reaches_zero() {
        let received = Instant::now();
        assert_eq!(
            seconds_to_cap(received, received),
            limits::VISIBILITY_SECONDS_MAX - 1
        );
        let late = received + Duration::from_secs(u64::from(limits::VISIBILITY_SECONDS_MAX) - 10);
        assert_eq!(seconds_to_cap(received, late), 9);
        let past = received + Duration::from_secs(u64::from(limits::VISIBILITY_SECONDS_MAX) + 10);
        assert_eq!(seconds_to_cap(received, past), 0);
    }

    #[test]
    fn config_out_of_range_names_the_field() {
        let field = |config: WorkerConfig| match config.check() {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let base = WorkerConfig::default();
        assert!(base.check().is_ok());
        assert_eq!(
            field(WorkerConfig {
                concurrency: 0,
                ..base
            })
            .as_deref(),
            Some("concurrency")
        );
        assert_eq!(
            field(WorkerConfig {
                receive_batch: 11,
                ..base
            })
            .as_deref(),
            Some("receive_batch")
        );
        assert_eq!(
            field(WorkerConfig {
                wait_seconds: 21,
                ..base
            })
            .as_deref(),
            Some("wait_seconds")
        );
        assert_eq!(
            field(WorkerConfig {
                visibility_timeout_seconds: 0,
                ..base
            })
            .as_deref(),
            Some("visibility_timeout_seconds")
        );
    }

    #[test]
    fn counters_add_up() {
        let counters = WorkerCounters::default();
        let m = message(BTreeMap::new());
        counters.processed(&m);
        counters.retried(&m, Duration::from_secs(1));
        counters.retried(&m, Duration::from_secs(1));
        counters.handler_latency(&m, Duration::from_millis(2), HandlerOutcome::Succeeded);
        let snapshot = counters.snapshot();
        assert_eq!(
            (snapshot.processed, snapshot.retried, snapshot.handler_runs),
            (1, 2, 1)
        );
        assert_eq!(snapshot.handler_latency_us_total, 2_000);
    }

    #[test]
    fn only_passing_receive_errors_keep_the_worker_polling() {
        assert!(recoverable(&Error::Unavailable {
            address: "a".into(),
            message: "x".into()
        }));
        assert!(recoverable(&Error::NoEndpointAvailable {
            failures: Vec::new()
        }));
        assert!(!recoverable(&Error::QueueNotFound {
            queue: None,
            message: "x".into()
        }));
        assert!(!recoverable(&Error::InvalidArgument {
            field: None,
            message: "x".into()
        }));
    }
}
