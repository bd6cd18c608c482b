//! `StartMessageMoveTask`, `ListMessageMoveTasks` and `CancelMessageMoveTask` served by the
//! cluster (spec/replication.md §8): the single node's checks in its order and its refusals
//! (`RateOutOfRange`, `QueueNotFound` for the source and then the destination,
//! `NotADeadLetterQueue`, `AlreadyRunning`, `TaskNotFound`, `NotRunning`), then the replicated
//! task record through `Cluster`. It must never decide a protocol question.

use trireme_core::{QueueName, QueuePrefixes, Reject};
use trireme_replication::task::{
    CancelRefused, Destination, FailureReason, Task, TaskHandle, TaskKey, TaskParams, TaskStatus,
};

use super::{ClusterEdge, unavailable};
use crate::cluster::move_task::{CancelAnswer, StartAnswer, TaskUnavailable};
use crate::cluster::service::CANDIDATES_PER_REPLY_MAX;
use crate::engine::EngineError;
use crate::limits;
use crate::redrive::{RedriveError, RedriveFailure, RedriveProgress, RedriveStatus};

impl ClusterEdge {
    /// Starts moving the ready messages of the dead-letter queue `from` to `to` (or each to its
    /// source), at most `rate_per_s` per second, only into queues within `allowed` if given;
    /// returns the task's handle. As `RedriveTasks::start` on one node.
    ///
    /// # Errors
    /// `RateOutOfRange`, `QueueNotFound` (for `from` or `to`), `NotADeadLetterQueue`,
    /// `AlreadyRunning`, or `Engine` (`Unavailable`) without a quorum or while this node's clock
    /// does not let it coordinate.
    pub async fn start_move_task(
        &self,
        from: QueueName,
        to: Option<QueueName>,
        rate_per_s: Option<u32>,
        allowed: Option<QueuePrefixes>,
    ) -> Result<String, RedriveError> {
        self.coordinating().await?;
        if let Some(rate) = rate_per_s
            && !(1..=limits::redrive_rate_per_s_max).contains(&rate)
        {
            return Err(RedriveError::RateOutOfRange {
                rate,
                max: limits::redrive_rate_per_s_max,
            });
        }
        let Some(source) = self.queue(&from).await? else {
            return Err(RedriveError::QueueNotFound { name: from });
        };
        let destination = match to {
            Some(to) => {
                let Some(known) = self.lookup(&to).await? else {
                    return Err(RedriveError::QueueNotFound { name: to });
                };
                Some(Destination {
                    name: to,
                    incarnation: known.incarnation,
                })
            }
            None => {
                if self.dead_letter_sources(&from).await?.is_empty() {
                    return Err(RedriveError::NotADeadLetterQueue { name: from });
                }
                None
            }
        };
        let key = TaskKey {
            queue: from.clone(),
            incarnation: source.incarnation,
        };
        // This node's count with three members; beyond them, every member's (spec §8).
        let (_, to_move) = self
            .cluster
            .dead_letters(&key, CANDIDATES_PER_REPLY_MAX)
            .await;
        let params = TaskParams {
            destination,
            rate_per_s,
            started_at: self.clock.now(),
            to_move,
            allowed,
        };
        match self.cluster.start_task(&key, params).await {
            StartAnswer::Started(handle) => Ok(handle.encode()),
            StartAnswer::AlreadyRunning(handle) => Err(RedriveError::AlreadyRunning {
                name: from,
                handle: handle.encode(),
            }),
            StartAnswer::Unavailable => Err(unavailable("starting the move task").into()),
        }
    }

    /// Up to `limit` tasks of the dead-letter queue `from`, newest first (none for a queue that
    /// does not exist, as on one node).
    ///
    /// # Errors
    /// `Unavailable` without a quorum or while this node's clock does not let it coordinate.
    pub async fn list_move_tasks(
        &self,
        from: &QueueName,
        limit: usize,
    ) -> Result<Vec<RedriveProgress>, EngineError> {
        self.coordinating().await?;
        let Some(known) = self.lookup(from).await? else {
            return Ok(Vec::new());
        };
        let key = TaskKey {
            queue: from.clone(),
            incarnation: known.incarnation,
        };
        let record = self
            .cluster
            .read_task(&key)
            .await
            .map_err(|TaskUnavailable| unavailable("reading the move tasks"))?;
        Ok(record
            .newest_first()
            .take(limit)
            .map(|(task, progress)| {
                self::progress(
                    &TaskHandle {
                        key: key.clone(),
                        task,
                    },
                    progress,
                )
            })
            .collect())
    }

    /// The task `handle` names, if its record knows it.
    ///
    /// # Errors
    /// `Unavailable` without a quorum or while this node's clock does not let it coordinate.
    pub async fn move_task(&self, handle: &str) -> Result<Option<RedriveProgress>, EngineError> {
        self.coordinating().await?;
        let Some(handle) = TaskHandle::decode(handle) else {
            return Ok(None);
        };
        let record = self
            .cluster
            .read_task(&handle.key)
            .await
            .map_err(|TaskUnavailable| unavailable("reading the move task"))?;
        Ok(record
            .tasks
            .get(&handle.task)
            .map(|task| progress(&handle, task)))
    }

    /// Cancels the task `handle` names; answers how many it had moved.
    ///
    /// # Errors
    /// `TaskNotFound` for a handle that names no task, `NotRunning` for one that is not
    /// running, `Engine` (`Unavailable`) without a quorum or while this node's clock does not
    /// let it coordinate.
    pub async fn cancel_move_task(&self, handle: &str) -> Result<u64, RedriveError> {
        self.coordinating().await?;
        let not_found = || RedriveError::TaskNotFound {
            handle: handle.to_owned(),
        };
        let decoded = TaskHandle::decode(handle).ok_or_else(not_found)?;
        match self.cluster.cancel_task(&decoded).await {
            CancelAnswer::Cancelling(moved) => Ok(moved),
            CancelAnswer::Refused(CancelRefused::NotFound) => Err(not_found()),
            CancelAnswer::Refused(CancelRefused::NotRunning) => Err(RedriveError::NotRunning {
                handle: handle.to_owned(),
            }),
            CancelAnswer::Unavailable => Err(unavailable("cancelling the move task").into()),
        }
    }
}

/// A replicated task as the edges report a task of one node.
fn progress(handle: &TaskHandle, task: &Task) -> RedriveProgress {
    let status = match &task.status {
        TaskStatus::Running => RedriveStatus::Running,
        TaskStatus::Cancelling => RedriveStatus::Cancelling,
        TaskStatus::Completed => RedriveStatus::Completed,
        TaskStatus::Cancelled => RedriveStatus::Cancelled,
        TaskStatus::Failed(FailureReason::DestinationDeleted { name }) => {
            RedriveStatus::Failed(RedriveFailure::DestinationDeleted { name: name.clone() })
        }
        // What a node running alone reports when its dead-letter queue is deleted under a task:
        // the engine's refusal of the next step.
        TaskStatus::Failed(FailureReason::SourceDeleted { name }) => {
            RedriveStatus::Failed(RedriveFailure::Engine(EngineError::Rejected(
                Reject::QueueNotFound { name: name.clone() },
            )))
        }
    };
    RedriveProgress {
        handle: handle.encode(),
        from: handle.key.queue.clone(),
        to: task.params.destination.as_ref().map(|d| d.name.clone()),
        status,
        rate_per_s: task.params.rate_per_s,
        moved: task.moved_total(),
        failed: task.failed_total(),
        to_move: task.params.to_move,
        started_at: task.params.started_at,
    }
}
