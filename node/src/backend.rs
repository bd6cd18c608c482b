//! What the public edges (gRPC, SQS) talk to: the engine of a node running alone, or this
//! node's part of a cluster. Both answer the same commands with the same outcomes and refusals,
//! so the edges never ask which one they have.

use trireme_core::{
    Command, Delivery, MessageId, MessageState, Millis, Outcome, QueueName, QueuePrefixes,
    QueueView,
};

use crate::cluster::edge::ClusterEdge;
use crate::engine::{Engine, EngineError};
use crate::handle::HandleCodec;
use crate::metrics::{CommandKind, MessageCounters};
use crate::redrive::{RedriveError, RedriveProgress, RedriveTasks};

/// One message as a peek shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peeked {
    /// The message's id.
    pub id: MessageId,
    /// Ready, in flight or delayed.
    pub state: PeekedState,
    /// Receives of it in its current queue so far.
    pub receive_count: u32,
    /// Its original send.
    pub sent_at: Millis,
    /// The queue it was dead-lettered from, for a message of a dead-letter queue.
    pub source: Option<QueueName>,
    /// The body, as sent.
    pub body: String,
}

/// Where a peeked message stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeekedState {
    /// A receive could take it now.
    Ready,
    /// Received and not yet visible again.
    InFlight,
    /// Its delay has not ended.
    Delayed,
}

impl PeekedState {
    /// The state's name as the console shows it.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            PeekedState::Ready => "ready",
            PeekedState::InFlight => "in flight",
            PeekedState::Delayed => "delayed",
        }
    }
}

/// The queue service behind the edges, and the counters of what its messages went through
/// (counted here, once for both edges). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Backend {
    service: Service,
    counters: MessageCounters,
}

/// Which queue service serves.
#[derive(Clone, Debug)]
enum Service {
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
    /// The backend of a node running alone on `engine`, with no move task yet, counting into
    /// `counters`. Clients' commands are shed when the engine's queue is full
    /// ([`Engine::shedding`]); the move tasks' steps wait for room.
    #[must_use]
    pub fn alone(engine: Engine, counters: MessageCounters) -> Backend {
        Backend {
            service: Service::Alone {
                redrives: RedriveTasks::new(engine.clone()),
                engine: engine.shedding(),
            },
            counters,
        }
    }

    /// The backend of a cluster member, coordinating through `edge`, counting into `counters`.
    #[must_use]
    pub fn cluster(edge: ClusterEdge, counters: MessageCounters) -> Backend {
        Backend {
            service: Service::Cluster(edge),
            counters,
        }
    }

    /// What this backend's messages went through.
    #[must_use]
    pub fn counters(&self) -> &MessageCounters {
        &self.counters
    }

    /// Cancels every running move task of a node running alone (the first step of its
    /// shutdown); a cluster's tasks stop with the member's background work and are taken over.
    pub fn cancel_move_tasks(&self) {
        if let Service::Alone { redrives, .. } = &self.service {
            redrives.cancel_all();
        }
    }

    /// Applies `command`.
    ///
    /// # Errors
    /// As [`Engine::execute`], and in a cluster `Unavailable` or `Unsupported`.
    pub async fn execute(&self, command: Command) -> Result<Outcome, EngineError> {
        let kind = CommandKind::of(&command);
        let result = match &self.service {
            Service::Alone { engine, .. } => engine.execute(command).await,
            Service::Cluster(edge) => edge.execute(command).await,
        };
        self.counters.count(&kind, &result);
        result
    }

    /// Applies every command (one group commit alone, concurrently in a cluster), answering in
    /// order.
    pub async fn execute_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, EngineError>> {
        let kinds: Vec<CommandKind> = commands.iter().map(CommandKind::of).collect();
        let results = match &self.service {
            Service::Alone { engine, .. } => engine.execute_all(commands).await,
            Service::Cluster(edge) => edge.execute_all(commands).await,
        };
        for (kind, result) in kinds.iter().zip(&results) {
            self.counters.count(kind, result);
        }
        results
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
        let received = match &self.service {
            Service::Alone { engine, .. } => engine.receive(queue, max, visibility_s, wait_s).await,
            Service::Cluster(edge) => edge.receive(queue, max, visibility_s, wait_s).await,
        };
        if let Ok(deliveries) = &received {
            self.counters.count_received(deliveries);
        }
        received
    }

    /// The queue `name` as it is now, or `None` if it does not exist.
    ///
    /// # Errors
    /// `ShuttingDown` alone; `Unavailable` in a cluster.
    pub async fn queue(&self, name: &QueueName) -> Result<Option<QueueView>, EngineError> {
        match &self.service {
            Service::Alone { engine, .. } => engine.queue(name).await,
            Service::Cluster(edge) => edge.queue(name).await,
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
        match &self.service {
            Service::Alone { engine, .. } => engine.list_queues(prefix, after, limit).await,
            Service::Cluster(edge) => edge.list_queues(prefix, after, limit).await,
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
        match &self.service {
            Service::Alone { engine, .. } => engine.dead_letter_sources(dlq).await,
            Service::Cluster(edge) => edge.dead_letter_sources(dlq).await,
        }
    }

    /// Up to `limit` messages of `queue`, the first sent first, without receiving them: no
    /// receive count changes, nothing becomes invisible. Alone the engine's state; in a cluster
    /// this member's replica view, which asks no peer (see [`ClusterEdge::peek`]).
    ///
    /// # Errors
    /// `ShuttingDown` alone; `Unavailable` in a cluster when the replica store cannot be read.
    pub async fn peek(&self, queue: &QueueName, limit: usize) -> Result<Vec<Peeked>, EngineError> {
        match &self.service {
            Service::Alone { engine, .. } => Ok(engine
                .peek(queue, limit)
                .await?
                .into_iter()
                .map(|view| Peeked {
                    id: view.id,
                    state: match view.state {
                        MessageState::Ready { .. } => PeekedState::Ready,
                        MessageState::InFlight { .. } => PeekedState::InFlight,
                        MessageState::Delayed { .. } => PeekedState::Delayed,
                    },
                    receive_count: view.receive_count,
                    sent_at: view.sent_at,
                    source: view.source,
                    body: view.body,
                })
                .collect()),
            Service::Cluster(edge) => edge.peek(queue, limit).await,
        }
    }

    /// Whether this backend is a cluster member's (a peek then shows its local replica view).
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        matches!(self.service, Service::Cluster(_))
    }

    /// A fresh message id.
    #[must_use]
    pub fn new_message_id(&self) -> MessageId {
        match &self.service {
            Service::Alone { engine, .. } => engine.new_message_id(),
            Service::Cluster(edge) => edge.new_message_id(),
        }
    }

    /// The node's clock.
    #[must_use]
    pub fn now(&self) -> Millis {
        match &self.service {
            Service::Alone { engine, .. } => engine.now(),
            Service::Cluster(edge) => edge.now(),
        }
    }

    /// The codec of the receipt handles (the cluster's shared key in a cluster).
    #[must_use]
    pub fn handles(&self) -> &HandleCodec {
        match &self.service {
            Service::Alone { engine, .. } => engine.handles(),
            Service::Cluster(edge) => edge.handles(),
        }
    }

    /// Starts a message move task out of the dead-letter queue `from` (spec/queue-core.md
    /// #redrived-to-max; in a cluster spec/replication.md §8); returns the task's handle. With
    /// `allowed` (the restriction of the access key that starts it) the task moves a message
    /// only into a queue within it, for its whole life.
    ///
    /// # Errors
    /// As `RedriveTasks::start`; in a cluster, `Engine` (`Unavailable`) without a quorum.
    pub async fn start_move_task(
        &self,
        from: QueueName,
        to: Option<QueueName>,
        rate_per_s: Option<u32>,
        allowed: Option<QueuePrefixes>,
    ) -> Result<String, RedriveError> {
        match &self.service {
            Service::Alone { redrives, .. } => redrives.start(from, to, rate_per_s, allowed).await,
            Service::Cluster(edge) => edge.start_move_task(from, to, rate_per_s, allowed).await,
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
        match &self.service {
            Service::Alone { redrives, .. } => Ok(redrives.list(from, limit)),
            Service::Cluster(edge) => edge.list_move_tasks(from, limit).await,
        }
    }

    /// The move task with `handle`, if it is known.
    ///
    /// # Errors
    /// None alone; `Unavailable` in a cluster.
    pub async fn move_task(&self, handle: &str) -> Result<Option<RedriveProgress>, EngineError> {
        match &self.service {
            Service::Alone { redrives, .. } => Ok(redrives.get(handle)),
            Service::Cluster(edge) => edge.move_task(handle).await,
        }
    }

    /// Cancels the move task with `handle`; returns how many messages it had moved.
    ///
    /// # Errors
    /// `TaskNotFound`, `NotRunning`; in a cluster also `Engine` (`Unavailable`).
    pub async fn cancel_move_task(&self, handle: &str) -> Result<u64, RedriveError> {
        match &self.service {
            Service::Alone { redrives, .. } => redrives.cancel(handle),
            Service::Cluster(edge) => edge.cancel_move_task(handle).await,
        }
    }
}
