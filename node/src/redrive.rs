//! Redrive tasks: moving the messages of a dead-letter queue back to their source queues (or to
//! one named queue) in small steps, at a limited rate, cancellable, with progress
//! (spec/queue-core.md#redrived-to-max). Each step is one `Command::Redrive` through the engine,
//! so every move is as durable as any other command. The tasks are a client of the engine: they
//! hold an engine handle, and the engine knows nothing of them (the node's `Backend` holds both).
//! In a cluster move tasks are replicated instead (`cluster::move_task`).
//!
//! Tasks live in memory: a restart forgets them (the messages they moved stay moved, the rest
//! stay in the dead-letter queue, and a new task can be started). This module must never move a
//! message itself; only the core does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};
use trireme_core::{Command, Millis, Outcome, QueueName, QueuePrefixes, limits as core_limits};

use crate::engine::{Engine, EngineError};
use crate::limits;

/// Where a redrive task is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedriveStatus {
    /// Moving messages.
    Running,
    /// Every message that was ready when the task started was moved or failed.
    Completed,
    /// Cancel was asked; the task stops before its next step.
    Cancelling,
    /// Stopped by a cancel.
    Cancelled,
    /// Stopped by a failure.
    Failed(RedriveFailure),
}

/// Why a redrive task stopped before it finished.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RedriveFailure {
    /// The task's destination queue was deleted while it ran: the messages not yet moved stay
    /// in the dead-letter queue.
    #[error("destination queue {name} was deleted")]
    DestinationDeleted { name: QueueName },
    /// The engine refused a step (the dead-letter queue was deleted) or stopped.
    #[error(transparent)]
    Engine(EngineError),
}

/// The state of one redrive task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedriveProgress {
    /// The task's handle, as given to the caller.
    pub handle: String,
    /// The dead-letter queue messages are moved out of.
    pub from: QueueName,
    /// The queue every message goes to; `None`: each goes back to its source.
    pub to: Option<QueueName>,
    /// Where the task is.
    pub status: RedriveStatus,
    /// Messages per second asked for; `None`: as fast as the node allows.
    pub rate_per_s: Option<u32>,
    /// Messages moved so far.
    pub moved: u64,
    /// Messages that could not be moved: their target queue is missing, or outside the
    /// restriction of the key that started the task.
    pub failed: u64,
    /// Ready messages in the dead-letter queue when the task started.
    pub to_move: u64,
    /// When the task started.
    pub started_at: Millis,
}

/// Why a redrive task could not be started, listed or cancelled.
#[derive(Debug, Error)]
pub enum RedriveError {
    /// The dead-letter queue or the named destination does not exist.
    #[error("queue {name} does not exist")]
    QueueNotFound { name: QueueName },
    /// No queue names `name` as its dead-letter queue, and no destination was given.
    #[error("queue {name} is not the dead-letter queue of any queue; name a destination")]
    NotADeadLetterQueue { name: QueueName },
    /// A task is already moving messages out of this queue.
    #[error("redrive task {handle} is already running for queue {name}")]
    AlreadyRunning { name: QueueName, handle: String },
    /// As many tasks run as the node allows.
    #[error("{max} redrive tasks are running, the most the node allows")]
    TooManyRunning { max: usize },
    /// The rate is outside 1–500 messages per second.
    #[error("max_messages_per_second must be 1–{max} (or 0 for the fastest), got {rate}")]
    RateOutOfRange { rate: u32, max: u32 },
    /// No task has this handle (never existed, or forgotten).
    #[error("no redrive task has handle {handle}")]
    TaskNotFound { handle: String },
    /// The task finished already.
    #[error("redrive task {handle} is not running")]
    NotRunning { handle: String },
    /// The engine refused or stopped.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

struct Entry {
    progress: RedriveProgress,
    cancel: watch::Sender<bool>,
}

#[derive(Default)]
struct Registry {
    /// Start order → task. The order makes "newest first" and "forget the oldest" cheap.
    tasks: BTreeMap<u64, Entry>,
    next_order: u64,
}

/// The node's redrive tasks. Cheap to clone.
#[derive(Clone)]
pub struct RedriveTasks {
    engine: Engine,
    registry: Arc<Mutex<Registry>>,
}

impl std::fmt::Debug for RedriveTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedriveTasks { .. }")
    }
}

impl RedriveTasks {
    /// The redrive tasks of the node whose engine is `engine` (none yet).
    #[must_use]
    pub fn new(engine: Engine) -> Self {
        RedriveTasks {
            engine,
            registry: Arc::new(Mutex::new(Registry::default())),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .expect("no code panics while holding the registry")
    }

    /// Starts moving the ready messages of the dead-letter queue `from` to `to` (or to each
    /// message's source), at most `rate_per_s` per second (`None`: as fast as the node allows),
    /// only into queues within `allowed` if given (the others stay, counted as failed).
    /// Returns the task's handle.
    ///
    /// # Errors
    /// `RateOutOfRange`, `QueueNotFound` (for `from` or `to`), `NotADeadLetterQueue` (no
    /// destination and no queue uses `from` as its dead-letter queue), `AlreadyRunning`,
    /// `TooManyRunning`, or `Engine` when the node is shutting down.
    pub async fn start(
        &self,
        from: QueueName,
        to: Option<QueueName>,
        rate_per_s: Option<u32>,
        allowed: Option<QueuePrefixes>,
    ) -> Result<String, RedriveError> {
        if let Some(rate) = rate_per_s
            && !(1..=limits::redrive_rate_per_s_max).contains(&rate)
        {
            return Err(RedriveError::RateOutOfRange {
                rate,
                max: limits::redrive_rate_per_s_max,
            });
        }
        let Some(view) = self.engine.queue(&from).await? else {
            return Err(RedriveError::QueueNotFound { name: from });
        };
        match &to {
            Some(to) => {
                if self.engine.queue(to).await?.is_none() {
                    return Err(RedriveError::QueueNotFound { name: to.clone() });
                }
            }
            None => {
                if self.engine.dead_letter_sources(&from).await?.is_empty() {
                    return Err(RedriveError::NotADeadLetterQueue { name: from });
                }
            }
        }
        // UUID-shaped, as SQS's task ids are.
        let handle = {
            // From the node's random source, as message ids are.
            let random: u128 = self.engine.new_message_id().0;
            let hex = format!("{random:032x}");
            format!(
                "{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            )
        };
        let (cancel, cancelled) = watch::channel(false);
        let progress = RedriveProgress {
            handle: handle.clone(),
            from: from.clone(),
            to: to.clone(),
            status: RedriveStatus::Running,
            rate_per_s,
            moved: 0,
            failed: 0,
            to_move: view.counts.ready,
            started_at: self.engine.now(),
        };
        let order = {
            let mut registry = self.registry();
            let running: Vec<&Entry> = registry
                .tasks
                .values()
                .filter(|entry| is_active(&entry.progress.status))
                .collect();
            if let Some(same) = running.iter().find(|entry| entry.progress.from == from) {
                return Err(RedriveError::AlreadyRunning {
                    name: from,
                    handle: same.progress.handle.clone(),
                });
            }
            if running.len() >= limits::redrive_tasks_running_max {
                return Err(RedriveError::TooManyRunning {
                    max: limits::redrive_tasks_running_max,
                });
            }
            let order = registry.next_order;
            registry.next_order += 1;
            registry.tasks.insert(order, Entry { progress, cancel });
            forget_oldest_finished(&mut registry);
            order
        };
        info!(task = %handle, from = %from, to = ?to.as_ref().map(QueueName::as_str), ?rate_per_s, "redrive started");
        let span = info_span!("redrive", task = %handle, queue = %from);
        tokio::spawn(
            run_task(
                self.clone(),
                order,
                from,
                to,
                rate_per_s,
                allowed,
                cancelled,
            )
            .instrument(span),
        );
        Ok(handle)
    }

    /// Up to `limit` tasks of the dead-letter queue `from`, newest first.
    #[must_use]
    pub fn list(&self, from: &QueueName, limit: usize) -> Vec<RedriveProgress> {
        self.registry()
            .tasks
            .values()
            .rev()
            .filter(|entry| &entry.progress.from == from)
            .take(limit)
            .map(|entry| entry.progress.clone())
            .collect()
    }

    /// The task with `handle`, if the node remembers it.
    #[must_use]
    pub fn get(&self, handle: &str) -> Option<RedriveProgress> {
        self.registry()
            .tasks
            .values()
            .find(|entry| entry.progress.handle == handle)
            .map(|entry| entry.progress.clone())
    }

    /// Asks the task to stop before its next step; returns how many messages it moved so far.
    ///
    /// # Errors
    /// `TaskNotFound` for an unknown handle, `NotRunning` for a finished task.
    pub fn cancel(&self, handle: &str) -> Result<u64, RedriveError> {
        let mut registry = self.registry();
        let entry = registry
            .tasks
            .values_mut()
            .find(|entry| entry.progress.handle == handle)
            .ok_or_else(|| RedriveError::TaskNotFound {
                handle: handle.to_owned(),
            })?;
        if !is_active(&entry.progress.status) {
            return Err(RedriveError::NotRunning {
                handle: handle.to_owned(),
            });
        }
        entry.progress.status = RedriveStatus::Cancelling;
        // The receiver is gone only when the task ended, and then its status is final.
        let _ = entry.cancel.send(true);
        Ok(entry.progress.moved)
    }

    /// Cancels every running task (shutdown).
    pub(crate) fn cancel_all(&self) {
        let mut registry = self.registry();
        for entry in registry.tasks.values_mut() {
            if entry.progress.status == RedriveStatus::Running {
                entry.progress.status = RedriveStatus::Cancelling;
                let _ = entry.cancel.send(true);
            }
        }
    }

    fn update(&self, order: u64, change: impl FnOnce(&mut RedriveProgress)) -> RedriveProgress {
        let mut registry = self.registry();
        let entry = registry
            .tasks
            .get_mut(&order)
            .expect("a running task is never forgotten");
        change(&mut entry.progress);
        entry.progress.clone()
    }
}

fn is_active(status: &RedriveStatus) -> bool {
    matches!(status, RedriveStatus::Running | RedriveStatus::Cancelling)
}

fn forget_oldest_finished(registry: &mut Registry) {
    while registry.tasks.len() > limits::redrive_tasks_kept_max {
        let oldest_finished = registry
            .tasks
            .iter()
            .find(|(_, entry)| !is_active(&entry.progress.status))
            .map(|(order, _)| *order)
            .expect("at most redrive_tasks_running_max tasks are active, fewer than are kept");
        registry.tasks.remove(&oldest_finished);
    }
}

/// Messages per step (at most `step_max`) and the pause between steps for a rate. The cluster's
/// move tasks pace their batches with it too.
pub(crate) fn pacing(rate_per_s: Option<u32>, step_max: u32) -> (u32, Duration) {
    assert!(step_max >= 1);
    match rate_per_s {
        None => (step_max, Duration::ZERO),
        Some(rate) => {
            assert!(rate >= 1);
            // Ten steps a second at most, so a slow rate moves one message at a time and a fast
            // one does not pay a commit per message.
            let step = rate.div_ceil(10).clamp(1, step_max);
            (
                step,
                Duration::from_millis(u64::from(step) * 1_000 / u64::from(rate)),
            )
        }
    }
}

async fn run_task(
    tasks: RedriveTasks,
    order: u64,
    from: QueueName,
    to: Option<QueueName>,
    rate_per_s: Option<u32>,
    allowed: Option<QueuePrefixes>,
    mut cancelled: watch::Receiver<bool>,
) {
    let (step, pause) = pacing(rate_per_s, limits::redrive_step_messages_max);
    let to_move = tasks.update(order, |_| {}).to_move;
    // Messages that failed stay ready at the head of the dead-letter queue and are taken again
    // by the next step, so each step asks for that many more than it means to move.
    let mut failed_total: u64 = 0;
    let mut moved_total: u64 = 0;
    let final_status = loop {
        if *cancelled.borrow() {
            break RedriveStatus::Cancelled;
        }
        if moved_total + failed_total >= to_move {
            break RedriveStatus::Completed;
        }
        let max = u64::from(step)
            .saturating_add(failed_total)
            .min(u64::from(core_limits::redrive_messages_max));
        let max = u32::try_from(max).expect("capped by redrive_messages_max, a u32");
        let command = Command::Redrive {
            from: from.clone(),
            to: to.clone(),
            max,
            allowed: allowed.clone(),
        };
        match tasks.engine.execute(command).await {
            // A task with a destination within its restriction fails only when that queue is
            // missing: it was deleted while the task ran, and the task stops as SQS's does.
            Ok(Outcome::Redriven { failed, .. })
                if failed > 0
                    && to
                        .as_ref()
                        .is_some_and(|to| allowed.as_ref().is_none_or(|a| a.allows(to))) =>
            {
                let name = to.clone().expect("checked just above");
                warn!(destination = %name, "redrive stopped: destination deleted");
                break RedriveStatus::Failed(RedriveFailure::DestinationDeleted { name });
            }
            Ok(Outcome::Redriven { moved, failed }) => {
                moved_total += u64::from(moved);
                failed_total = failed_total.max(u64::from(failed));
                let (moved_now, failed_now) = (moved_total, failed_total);
                tasks.update(order, |progress| {
                    progress.moved = moved_now;
                    progress.failed = failed_now;
                });
                if moved == 0 {
                    break RedriveStatus::Completed;
                }
            }
            Ok(other) => unreachable!("a redrive answers Redriven, got {other:?}"),
            Err(error) => {
                warn!(%error, "redrive stopped");
                break RedriveStatus::Failed(RedriveFailure::Engine(error));
            }
        }
        if !pause.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = cancelled.changed() => {}
            }
        } else {
            tokio::task::yield_now().await;
        }
    };
    let progress = tasks.update(order, |progress| progress.status = final_status);
    info!(
        moved = progress.moved,
        failed = progress.failed,
        status = ?progress.status,
        "redrive ended"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_keeps_the_asked_rate() {
        let max = limits::redrive_step_messages_max;
        assert_eq!(pacing(Some(1), max), (1, Duration::from_millis(1_000)));
        assert_eq!(pacing(Some(10), max), (1, Duration::from_millis(100)));
        assert_eq!(pacing(Some(500), max), (50, Duration::from_millis(100)));
        assert_eq!(pacing(Some(15), max), (2, Duration::from_millis(133)));
        assert_eq!(pacing(None, max), (max, Duration::ZERO));
        // A smaller step keeps the rate with shorter pauses.
        assert_eq!(pacing(Some(500), 10), (10, Duration::from_millis(20)));
    }
}
