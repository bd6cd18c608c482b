//! What the public edges (gRPC, SQS) talk to: the engine of a node running alone, or this
//! node's part of a cluster. Both answer the same commands with the same outcomes and refusals,
//! so the edges never ask which one they have.

use trireme_core::{Command, Delivery, MessageId, Millis, Outcome, QueueName, QueueView};

use crate::cluster::edge::ClusterEdge;
use crate::engine::{Engine, EngineError};
use crate::handle::HandleCodec;
use crate::redrive::{RedriveError, RedriveProgress, RedriveTasks};

/// The queue service behind the edges. Cheap to clone.
#[derive(Clone, Debug)]
pub enum Backend {
    /// A node running alone: its engine, and the move tasks that are its clients.
    Alone {
        /// The node's engine.
        engine: Engine,
        /// The node's move (redrive) tasks, which run their steps through the engine.
        redrives: RedriveTasks,
    },
    /// A cluster member coordinating through its peers.
    Cluster(ClusterEdge),
}

impl Backend {
    /// The backend of a node running alone on `engine`, with no move task yet.
    #[must_use]
    pub fn alone(engine: Engine) -> Backend {
        Backend::Alone {
            redrives: RedriveTasks::new(engine.clone()),
            engine,
        }
    }

    /// Cancels every running move task of a node running alone (the first step of its
    /// shutdown); a cluster's tasks stop with the member's background work and are taken over.
    pub fn cancel_move_tasks(&self) {
        if let Backend::Alone { redrives, .. } = self {
            redrives.cancel_all();
        }
    }

    /// Applies `command`.
    ///
    /// # Errors
    /// As [`Engine::execute`], and in a cluster `Unavailable` or `Unsupported`.
    pub async fn execute(&self, command: Command) -> Result<Outcome, EngineError> {
        match self {
            Backend::Alone { engine, .. } => engine.execute(command).await,
            Backend::Cluster(edge) => edge.execute(command).await,
        }
    }

    /// Applies every command (one group commit alone, concurrently in a cluster), answering in
    /// order.
    pub async fn execute_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, EngineError>> {
        match self {
            Backend::Alone { engine, .. } => engine.execute_all(commands).await,
            Backend::Cluster(edge) => edge.execute_all(commands).await,
        }
    }

    /// Receives up to `max` messages, waiting up to `wait_s` for the first.
    ///
    /// # Errors
    /// As [`Backend::execute`].
    pub async fn receive(
        &self,
        queue: QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: Option<u32>,
    ) -> Result<Vec<Delivery>, EngineError> {
        match self {
            Backend::Alone { engine, .. } => engine.receive(queue, max, visibility_s, wait_s).await,
            Backend::Cluster(edge) => edge.receive(queue, max, visibility_s, wait_s).await,
        }
    }

    /// The queue `name` as it is now, or `None` if it does not exist.
    ///
    /// # Errors
    /// `ShuttingDown` alone; `Unavailable` in a cluster.
    pub async fn queue(&self, name: &QueueName) -> Result<Option<QueueView>, EngineError> {
        match self {
            Backend::Alone { engine, .. } => engine.queue(name).await,
            Backend::Cluster(edge) => edge.queue(name).await,
        }
    }

    /// Up to `limit` queue names starting with `prefix`, in name order, after `after`.
    ///
    /// # Errors
    /// `ShuttingDown` alone.
    pub async fn list_queues(
        &self,
        prefix: String,
        after: Option<QueueName>,
        limit: usize,
    ) -> Result<Vec<QueueName>, EngineError> {
        match self {
            Backend::Alone { engine, .. } => engine.list_queues(prefix, after, limit).await,
            Backend::Cluster(edge) => edge.list_queues(prefix, after, limit).await,
        }
    }

    /// The queues whose redrive policy names `dlq`, in name order.
    ///
    /// # Errors
    /// `ShuttingDown` alone; `Unavailable` in a cluster.
    pub async fn dead_letter_sources(
        &self,
        dlq: &QueueName,
    ) -> Result<Vec<QueueName>, EngineError> {
        match self {
            Backend::Alone { engine, .. } => engine.dead_letter_sources(dlq).await,
            Backend::Cluster(edge) => edge.dead_letter_sources(dlq).await,
        }
    }

    /// A fresh message id.
    #[must_use]
    pub fn new_message_id(&self) -> MessageId {
        match self {
            Backend::Alone { engine, .. } => engine.new_message_id(),
            Backend::Cluster(edge) => edge.new_message_id(),
        }
    }

    /// The node's clock.
    #[must_use]
    pub fn now(&self) -> Millis {
        match self {
            Backend::Alone { engine, .. } => engine.now(),
            Backend::Cluster(edge) => edge.now(),
        }
    }

    /// The codec of the receipt handles (the cluster's shared key in a cluster).
    #[must_use]
    pub fn handles(&self) -> &HandleCodec {
        match self {
            Backend::Alone { engine, .. } => engine.handles(),
            Backend::Cluster(edge) => edge.handles(),
        }
    }

    /// Starts a message move task out of the dead-letter queue `from` (spec/queue-core.md
    /// #redrived-to-max; in a cluster spec/replication.md §8); returns the task's handle.
    ///
    /// # Errors
    /// As `RedriveTasks::start`; in a cluster, `Engine` (`Unavailable`) without a quorum.
    pub async fn start_move_task(
        &self,
        from: QueueName,
        to: Option<QueueName>,
        rate_per_s: Option<u32>,
    ) -> Result<String, RedriveError> {
        match self {
            Backend::Alone { redrives, .. } => redrives.start(from, to, rate_per_s).await,
            Backend::Cluster(edge) => edge.start_move_task(from, to, rate_per_s).await,
        }
    }

    /// Up to `limit` move tasks of `from`, newest first.
    ///
    /// # Errors
    /// None alone; `Unavailable` in a cluster.
    pub async fn list_move_tasks(
        &self,
        from: &QueueName,
        limit: usize,
    ) -> Result<Vec<RedriveProgress>, EngineError> {
        match self {
            Backend::Alone { redrives, .. } => Ok(redrives.list(from, limit)),
            Backend::Cluster(edge) => edge.list_move_tasks(from, limit).await,
        }
    }

    /// The move task with `handle`, if it is known.
    ///
    /// # Errors
    /// None alone; `Unavailable` in a cluster.
    pub async fn move_task(&self, handle: &str) -> Result<Option<RedriveProgress>, EngineError> {
        match self {
            Backend::Alone { redrives, .. } => Ok(redrives.get(handle)),
            Backend::Cluster(edge) => edge.move_task(handle).await,
        }
    }

    /// Cancels the move task with `handle`; returns how many messages it had moved.
    ///
    /// # Errors
    /// `TaskNotFound`, `NotRunning`; in a cluster also `Engine` (`Unavailable`).
    pub async fn cancel_move_task(&self, handle: &str) -> Result<u64, RedriveError> {
        match self {
            Backend::Alone { redrives, .. } => redrives.cancel(handle),
            Backend::Cluster(edge) => edge.cancel_move_task(handle).await,
        }
    }
}
