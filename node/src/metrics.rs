//! What an operator sees of a running node: the Prometheus exposition (`GET /metrics`), liveness
//! (`GET /health`) and readiness (`GET /ready`), served on their own listener
//! (`--metrics-listen`).
//!
//! Two kinds of figure. Counters and histograms (requests, messages sent and received, group
//! commits, quorum rounds, anti-entropy) are counted where the event happens, in the metric
//! types of this module that each component owns a clone of ([`MessageCounters`] in the backend,
//! [`StoreMetrics`] in each store, [`RequestMetrics`] at the two edges, [`ReplicationMetrics`] in
//! the cluster). Gauges (queue depths, the age of the oldest message, records and database
//! size, peers up, clock offsets, tombstones waiting) are computed at scrape time from the
//! engine's state or the member's local view, so they can never drift from what
//! `GetQueueAttributes` answers.
//!
//! Label cardinality is bounded: `queue` by the queue limit (`trireme_core::limits::queues_max`;
//! a deleted queue's series are removed with it), `peer` by the member limit
//! (`limits::cluster_members_max`), and `api`, `operation`, `reason` and `store` by fixed tables
//! of this crate (an unknown SQS action or gRPC path is counted as `unknown`, never by its
//! text). This module only observes: it never decides an answer.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use trireme_core::{Command, Delivery, Millis, Outcome, QueueName, QueueStats, Reject};
use trireme_replication::coordinator::ReceivePath;

use crate::cluster::Cluster;
use crate::engine::{Engine, EngineError};

/// The content type of the OpenMetrics text exposition, which Prometheus asks for and reads.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Buckets of request and quorum latencies: 0.5 ms doubling to about 16 s (a long poll waits
/// up to 20 s and lands in `+Inf`).
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_5, 2.0, 16)
}

/// Buckets of a group commit (one fsync): 0.1 ms doubling to about 3 s.
fn commit_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_1, 2.0, 15)
}

fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

fn seconds(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64()
}

/// A series of one queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The queue's name.
    pub queue: String,
}

impl QueueLabels {
    fn of(queue: &QueueName) -> QueueLabels {
        QueueLabels {
            queue: queue.as_str().to_owned(),
        }
    }
}

/// What each queue's messages went through, counted by the backend for both edges: sends
/// stored, messages received (a redelivery is a receive of a message received before), deletes
/// that deleted, and deletes refused because a later receive superseded their receipt handle
/// (the SQS endpoint answers those with success, as SQS does, the gRPC API with
/// `StaleReceiptHandle`; both are counted).
#[derive(Clone, Debug, Default)]
pub struct MessageCounters {
    sent: Family<QueueLabels, Counter>,
    received: Family<QueueLabels, Counter>,
    redelivered: Family<QueueLabels, Counter>,
    deleted: Family<QueueLabels, Counter>,
    superseded_deletes: Family<QueueLabels, Counter>,
}

impl MessageCounters {
    /// Counts what `result` says `command` did.
    pub fn count(&self, command: &CommandKind, result: &Result<Outcome, EngineError>) {
        match (command, result) {
            (
                CommandKind::Send(queue),
                Ok(Outcome::Sent {
                    duplicate: false, ..
                }),
            ) => {
                self.sent.get_or_create(&QueueLabels::of(queue)).inc();
            }
            (
                CommandKind::Delete(queue),
                Ok(Outcome::Deleted {
                    already_gone: false,
                }),
            ) => {
                self.deleted.get_or_create(&QueueLabels::of(queue)).inc();
            }
            (
                CommandKind::Delete(queue),
                Err(EngineError::Rejected(Reject::StaleReceiptHandle { .. })),
            ) => {
                self.superseded_deletes
                    .get_or_create(&QueueLabels::of(queue))
                    .inc();
            }
            (CommandKind::Receive, Ok(Outcome::Received(deliveries))) => {
                self.count_received(deliveries);
            }
            (CommandKind::DeleteQueue(queue), Ok(_)) => self.forget(queue),
            _ => {}
        }
    }

    /// Counts the messages of one receive.
    pub fn count_received(&self, deliveries: &[Delivery]) {
        for delivery in deliveries {
            let labels = QueueLabels::of(&delivery.queue);
            self.received.get_or_create(&labels).inc();
            if delivery.receive_count > 1 {
                self.redelivered.get_or_create(&labels).inc();
            }
        }
    }

    /// Drops a deleted queue's series, which keeps the families bounded by the queue limit.
    fn forget(&self, queue: &QueueName) {
        let labels = QueueLabels::of(queue);
        for family in [
            &self.sent,
            &self.received,
            &self.redelivered,
            &self.deleted,
            &self.superseded_deletes,
        ] {
            family.remove(&labels);
        }
    }

    /// Deletes of `queue` refused (gRPC) or answered with success without deleting (SQS)
    /// because a later receive had superseded their receipt handle.
    #[must_use]
    pub fn superseded_deletes(&self, queue: &QueueName) -> u64 {
        self.superseded_deletes
            .get(&QueueLabels::of(queue))
            .map_or(0, |counter| counter.get())
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "trireme_messages_sent",
            "Messages stored by sends (a duplicate of a deduplication id is not counted), per queue",
            self.sent.clone(),
        );
        registry.register(
            "trireme_messages_received",
            "Messages handed out by receives, per queue (redeliveries included)",
            self.received.clone(),
        );
        registry.register(
            "trireme_messages_redelivered",
            "Messages handed out by a receive after an earlier receive of them, per queue",
            self.redelivered.clone(),
        );
        registry.register(
            "trireme_messages_deleted",
            "Deletes that deleted a message, per queue",
            self.deleted.clone(),
        );
        registry.register(
            "trireme_superseded_deletes",
            "Deletes whose receipt handle a later receive had superseded, so nothing was deleted, per queue",
            self.superseded_deletes.clone(),
        );
    }
}

/// The part of a command the counters need, taken before the command is handed over.
#[derive(Clone, Debug)]
pub enum CommandKind {
    /// A send to the queue.
    Send(QueueName),
    /// A delete of a message of the queue.
    Delete(QueueName),
    /// A receive (its deliveries name their queue).
    Receive,
    /// A queue's deletion.
    DeleteQueue(QueueName),
    /// Anything else: not counted here.
    Other,
}

impl CommandKind {
    /// What the counters need of `command`.
    #[must_use]
    pub fn of(command: &Command) -> CommandKind {
        match command {
            Command::Send { queue, .. } => CommandKind::Send(queue.clone()),
            Command::Delete { queue, .. } => CommandKind::Delete(queue.clone()),
            Command::Receive { .. } => CommandKind::Receive,
            Command::DeleteQueue { name } => CommandKind::DeleteQueue(name.clone()),
            _ => CommandKind::Other,
        }
    }
}

/// One store's group commits. Owned by the store that commits (the engine's queue database,
/// a member's replica database), read by the exposition.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    commits: Counter,
    commit_seconds: Histogram,
    /// The replica store's checkpoints (spec/replication.md §14): each syncs the B-tree while
    /// the committer waits, the tail cost of the group log.
    checkpoints: Counter,
    /// Of them, those made outside this member's turn because the log was overdue (§14,
    /// `CHECKPOINT_OVERDUE`): a member written faster than its turns let it checkpoint, or whose
    /// clock is off; such a checkpoint may overlap a peer's.
    checkpoints_overdue: Counter,
    checkpoint_seconds: Histogram,
    /// Records held after the latest commit.
    records: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Default for StoreMetrics {
    fn default() -> StoreMetrics {
        StoreMetrics {
            commits: Counter::default(),
            commit_seconds: Histogram::new(commit_buckets()),
            checkpoints: Counter::default(),
            checkpoints_overdue: Counter::default(),
            checkpoint_seconds: Histogram::new(commit_buckets()),
            records: Gauge::default(),
        }
    }
}

impl StoreMetrics {
    /// Counts one group commit (one fsync) that took `elapsed`, after which the store holds
    /// `records` records.
    pub fn observe_commit(&self, elapsed: Duration, records: u64) {
        self.commits.inc();
        self.commit_seconds.observe(seconds(elapsed));
        self.set_records(records);
    }

    /// Counts one checkpoint of the replica store that took `elapsed`, made outside this
    /// member's turn when `overdue`.
    pub fn observe_checkpoint(&self, elapsed: Duration, overdue: bool) {
        self.checkpoints.inc();
        if overdue {
            self.checkpoints_overdue.inc();
        }
        self.checkpoint_seconds.observe(seconds(elapsed));
    }

    /// Sets the records held (at open, before any commit).
    pub fn set_records(&self, records: u64) {
        self.records.set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    /// Checkpoints so far (the replica store's).
    #[must_use]
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints.get()
    }

    /// Checkpoints so far made outside this member's turn (the replica store's).
    #[must_use]
    pub fn checkpoints_overdue(&self) -> u64 {
        self.checkpoints_overdue.get()
    }

    /// Group commits so far.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.commits.get()
    }
}

/// A series of one store.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

/// Which public API a request came through.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Api {
    /// `trireme.v1` over gRPC.
    Grpc,
    /// The SQS-compatible endpoint.
    Sqs,
}

impl Api {
    fn label(self) -> &'static str {
        match self {
            Api::Grpc => "grpc",
            Api::Sqs => "sqs",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: &'static str,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    api: &'static str,
    operation: &'static str,
    reason: String,
}

/// Every request's latency and every refusal's reason, per API and operation.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    duration: Family<RequestLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for RequestMetrics {
    fn default() -> RequestMetrics {
        RequestMetrics {
            duration: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
        }
    }
}

impl RequestMetrics {
    /// Records one request of `operation` (one of the API's fixed names, or `unknown`) through
    /// `api` that took `elapsed`, refused with `reason` if it was (a code of a fixed table:
    /// the SQS error code, the gRPC status code or `trireme-reason`).
    pub fn observe(
        &self,
        api: Api,
        operation: &'static str,
        elapsed: Duration,
        reason: Option<&str>,
    ) {
        let labels = RequestLabels {
            api: api.label(),
            operation,
        };
        self.duration
            .get_or_create(&labels)
            .observe(seconds(elapsed));
        if let Some(reason) = reason {
            self.count_error(api, operation, reason);
        }
    }

    fn count_error(&self, api: Api, operation: &'static str, reason: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                api: api.label(),
                operation,
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The series of `operation` through `api`, for an edge that records it on every request.
    /// Making it creates no series: the first request does, as [`RequestMetrics::observe`]
    /// would.
    #[must_use]
    pub fn operation(&self, api: Api, operation: &'static str) -> OperationMetrics {
        OperationMetrics {
            requests: self.clone(),
            api,
            operation,
            duration: OnceLock::new(),
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "trireme_request_duration",
            "Time to answer a request, per API (grpc, sqs) and operation",
            Unit::Seconds,
            self.duration.clone(),
        );
        registry.register(
            "trireme_request_errors",
            "Requests refused or failed, per API, operation and reason (SQS error code or gRPC reason)",
            self.errors.clone(),
        );
    }
}

/// One operation's figures in [`RequestMetrics`], as [`RequestMetrics::observe`] records them,
/// with its latency histogram kept once its series exists: a request then records without
/// hashing its labels into the family's map under the family's lock (BENCHMARKS.md 6r). A
/// refusal's reason is a label of its own, so errors still go through the family.
#[derive(Debug)]
pub struct OperationMetrics {
    requests: RequestMetrics,
    api: Api,
    operation: &'static str,
    /// The family's histogram of (`api`, `operation`), from the first request on. The family
    /// never removes a request series, so the one kept here is the one exposed.
    duration: OnceLock<Histogram>,
}

impl OperationMetrics {
    /// Records one request that took `elapsed`, refused with `reason` if it was: the same
    /// figures as [`RequestMetrics::observe`] with this operation.
    pub fn observe(&self, elapsed: Duration, reason: Option<&str>) {
        self.duration
            .get_or_init(|| {
                self.requests
                    .duration
                    .get_or_create(&RequestLabels {
                        api: self.api.label(),
                        operation: self.operation,
                    })
                    .clone()
            })
            .observe(seconds(elapsed));
        if let Some(reason) = reason {
            self.requests.count_error(self.api, self.operation, reason);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    path: &'static str,
    delivered: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PeerLabels {
    pub(crate) peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExchangeLabels {
    peer: String,
    direction: &'static str,
}

/// A cluster member's replication: quorum rounds, read repairs, anti-entropy, and the
/// dead-letter moves its receives made (a node alone counts those in its core).
#[derive(Clone, Debug)]
pub struct ReplicationMetrics {
    quorum_seconds: Family<OperationLabels, Histogram>,
    read_repairs: Counter,
    /// Peers' indexes asked by receives whose own index offered too few (spec/replication.md,
    /// *Candidates beyond the node's own index*): one `Candidates` call each.
    index_samples: Counter,
    /// Receives' claims of one message each, by path (spec/replication.md §13, *What is
    /// measured*) and whether they delivered.
    receive_claims: Family<ClaimLabels, Counter>,
    anti_entropy_rounds: Family<PeerLabels, Counter>,
    anti_entropy_failures: Family<PeerLabels, Counter>,
    anti_entropy_records: Family<ExchangeLabels, Counter>,
    /// Read at scrape time for the queues the view lists, so a deleted queue's count is no
    /// longer shown; the map itself is bounded by the queue names this member moved from.
    dead_letter_moves: Family<QueueLabels, Counter>,
    /// Set by each collection round.
    tombstones_waiting: Gauge,
}

impl Default for ReplicationMetrics {
    fn default() -> ReplicationMetrics {
        ReplicationMetrics {
            quorum_seconds: Family::new_with_constructor(latency_histogram),
            read_repairs: Counter::default(),
            index_samples: Counter::default(),
            receive_claims: Family::default(),
            anti_entropy_rounds: Family::default(),
            anti_entropy_failures: Family::default(),
            anti_entropy_records: Family::default(),
            dead_letter_moves: Family::default(),
            tombstones_waiting: Gauge::default(),
        }
    }
}

impl ReplicationMetrics {
    /// One coordinated operation (`operation`: the protocol's operation type) answered after
    /// `elapsed`, with `repairs` read-repair writes still sent after its answer.
    pub fn observe_operation(&self, operation: &'static str, elapsed: Duration, repairs: usize) {
        self.quorum_seconds
            .get_or_create(&OperationLabels { operation })
            .observe(seconds(elapsed));
        self.read_repairs.inc_by(repairs as u64);
    }

    /// One peer's index asked by a receive whose own index offered too few.
    pub fn count_index_sample(&self) {
        self.index_samples.inc();
    }

    /// One message's claim by a receive answered: by `path`, and whether it `delivered`.
    pub fn count_receive_claim(&self, path: ReceivePath, delivered: bool) {
        self.receive_claims
            .get_or_create(&ClaimLabels {
                path: claim_path_name(path),
                delivered: if delivered { "true" } else { "false" },
            })
            .inc();
    }

    /// Claims by `path` since this node started, and how many of them delivered.
    #[must_use]
    pub fn receive_claims(&self, path: ReceivePath) -> (u64, u64) {
        let count = |delivered: &'static str| {
            self.receive_claims
                .get(&ClaimLabels {
                    path: claim_path_name(path),
                    delivered,
                })
                .map_or(0, |counter| counter.get())
        };
        let delivered = count("true");
        (delivered + count("false"), delivered)
    }

    /// Peers' indexes asked by receives since this node started.
    #[must_use]
    pub fn index_samples(&self) -> u64 {
        self.index_samples.get()
    }

    /// One anti-entropy round with `peer`: records this node pushed and pulled, or a failure.
    pub fn observe_anti_entropy(&self, peer: u16, exchanged: Option<(usize, usize)>) {
        let labels = PeerLabels {
            peer: peer.to_string(),
        };
        match exchanged {
            Some((pushed, pulled)) => {
                self.anti_entropy_rounds.get_or_create(&labels).inc();
                for (direction, count) in [("pushed", pushed), ("pulled", pulled)] {
                    self.anti_entropy_records
                        .get_or_create(&ExchangeLabels {
                            peer: labels.peer.clone(),
                            direction,
                        })
                        .inc_by(count as u64);
                }
            }
            None => {
                self.anti_entropy_failures.get_or_create(&labels).inc();
            }
        }
    }

    /// Tombstones the latest collection round left waiting out the horizon.
    pub fn set_tombstones_waiting(&self, waiting: usize) {
        self.tombstones_waiting
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// One message moved from `queue` to its dead-letter queue by a receive of this node.
    pub fn count_dead_letter_move(&self, queue: &QueueName) {
        self.dead_letter_moves
            .get_or_create(&QueueLabels::of(queue))
            .inc();
    }

    /// What anti-entropy did with `peer` since this node started (for the console).
    #[must_use]
    pub fn anti_entropy(&self, peer: u16) -> AntiEntropyFigures {
        let labels = PeerLabels {
            peer: peer.to_string(),
        };
        let records = |direction| {
            self.anti_entropy_records
                .get(&ExchangeLabels {
                    peer: labels.peer.clone(),
                    direction,
                })
                .map_or(0, |counter| counter.get())
        };
        AntiEntropyFigures {
            rounds: self
                .anti_entropy_rounds
                .get(&labels)
                .map_or(0, |counter| counter.get()),
            failures: self
                .anti_entropy_failures
                .get(&labels)
                .map_or(0, |counter| counter.get()),
            pushed: records("pushed"),
            pulled: records("pulled"),
        }
    }

    fn dead_letter_moves(&self, queue: &QueueName) -> u64 {
        self.dead_letter_moves
            .get(&QueueLabels::of(queue))
            .map_or(0, |counter| counter.get())
    }

    fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "trireme_quorum_duration",
            "Time a coordinated operation took to reach its quorum's answer, per operation",
            Unit::Seconds,
            self.quorum_seconds.clone(),
        );
        registry.register(
            "trireme_read_repairs",
            "Read-repair writes sent to replicas that answered with less",
            self.read_repairs.clone(),
        );
        registry.register(
            "trireme_index_samples",
            "Peers' indexes asked by receives whose own index offered too few",
            self.index_samples.clone(),
        );
        registry.register(
            "trireme_receive_claims",
            "Messages a receive claimed, by path (fast: without the read; fell_back: without the read, refused before any replica took it, then read; read: read first) and whether the claim delivered",
            self.receive_claims.clone(),
        );
        registry.register(
            "trireme_anti_entropy_rounds",
            "Anti-entropy rounds completed with each peer",
            self.anti_entropy_rounds.clone(),
        );
        registry.register(
            "trireme_anti_entropy_failures",
            "Anti-entropy rounds with each peer that ended early",
            self.anti_entropy_failures.clone(),
        );
        registry.register(
            "trireme_tombstones_waiting",
            "Tombstones held alike by all three replicas and waiting out the horizon before collection (as of the latest collection round)",
            self.tombstones_waiting.clone(),
        );
        registry.register(
            "trireme_anti_entropy_records",
            "Message records exchanged by anti-entropy, per peer and direction (pushed, pulled)",
            self.anti_entropy_records.clone(),
        );
    }
}

/// The metrics' name of a receive's path.
fn claim_path_name(path: ReceivePath) -> &'static str {
    match path {
        ReceivePath::Fast => "fast",
        ReceivePath::FellBack => "fell_back",
        ReceivePath::Read => "read",
    }
}

/// Anti-entropy with one peer since this node started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AntiEntropyFigures {
    /// Rounds completed.
    pub rounds: u64,
    /// Rounds that ended early.
    pub failures: u64,
    /// Records this node pushed to the peer.
    pub pushed: u64,
    /// Records this node pulled from the peer.
    pub pulled: u64,
}

/// What a member reports of one peer at scrape time.
#[derive(Clone, Debug)]
pub struct PeerState {
    /// The peer's node id.
    pub peer: u16,
    /// Whether the peer answered recently (a fresh clock sample, or the link's last call).
    pub up: bool,
    /// The best estimate of `peer's clock − this node's` in ms, from a fresh sample.
    pub offset_ms: Option<i64>,
    /// The peer's version as its latest clock probe reply gave it (for the console).
    pub version: Option<String>,
}

/// Where a member stands, for the exposition and `/ready`.
#[derive(Clone, Debug)]
pub struct MemberState {
    /// Why the member does not serve yet (joining, a replaced disk), if it does not.
    pub not_joined: Option<String>,
    /// Every peer.
    pub peers: Vec<PeerState>,
    /// This member's id.
    pub node: u16,
    /// Every replica set the ring places messages on (three members each).
    pub replica_sets: Vec<[u16; 3]>,
    /// Replicas of a set that make a quorum (two of three).
    pub quorum: usize,
    /// The replica store's failure, if it failed.
    pub store_fault: Option<String>,
}

impl MemberState {
    /// The members this one reaches: itself and the peers it takes for up.
    fn reachable(&self) -> Vec<u16> {
        std::iter::once(self.node)
            .chain(
                self.peers
                    .iter()
                    .filter(|peer| peer.up)
                    .map(|peer| peer.peer),
            )
            .collect()
    }

    /// The replica sets of which fewer than a quorum are reachable: messages placed on one of
    /// them can be neither written nor read through this member.
    #[must_use]
    pub fn sets_without_quorum(&self) -> Vec<[u16; 3]> {
        let reachable = self.reachable();
        self.replica_sets
            .iter()
            .filter(|set| set.iter().filter(|m| reachable.contains(m)).count() < self.quorum)
            .copied()
            .collect()
    }

    /// `Ok` when every replica set has a quorum reachable from here; else why not. On three
    /// members that is two of them; on five or more it is a quorum of every set the ring
    /// places messages on, so two members down together make a member unready whenever some
    /// set holds both, though most messages are still served.
    fn quorum_reason(&self) -> Result<(), String> {
        let short = self.sets_without_quorum();
        let Some(first) = short.first() else {
            return Ok(());
        };
        let reachable = self.reachable();
        Err(format!(
            "{} of {} members reachable (this one included); {} of {} replica sets ({}, ...) have \
             fewer than the {} replicas a quorum needs",
            reachable.len(),
            self.peers.len() + 1,
            short.len(),
            self.replica_sets.len(),
            first.map(|m| m.to_string()).join("-"),
            self.quorum
        ))
    }
}

/// The node's metrics: what is counted, and where scrape-time figures come from. Built by
/// [`crate::Node`], served by [`router`].
pub struct Metrics {
    registry: Registry,
    engine: Engine,
    cluster: Option<Cluster>,
    replication: Option<ReplicationMetrics>,
    data_dir: PathBuf,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("member", &self.cluster.is_some())
            .finish_non_exhaustive()
    }
}

/// The metric types a node's components own clones of.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// The backend's message counters.
    pub messages: MessageCounters,
    /// The two edges' request metrics.
    pub requests: RequestMetrics,
}

impl Metrics {
    /// The metrics of a node: `sources` and the engine's store, and for a member the cluster's
    /// replication and replica store; `data_dir` holds the database files whose size is shown.
    #[must_use]
    pub fn new(
        sources: &Sources,
        engine: Engine,
        cluster: Option<Cluster>,
        data_dir: PathBuf,
    ) -> Metrics {
        let mut registry = Registry::default();
        sources.messages.register(&mut registry);
        sources.requests.register(&mut registry);
        let mut stores = vec![("queues", engine.storage_metrics().clone())];
        let replication = cluster.as_ref().map(|cluster| {
            stores.push(("replica", cluster.store().metrics().clone()));
            cluster.metrics().clone()
        });
        // Each store keeps its own counter and histogram; they are registered under a `store`
        // label, one series per store.
        let sub = registry.sub_registry_with_prefix("trireme_storage");
        for (store, metrics) in &stores {
            let sub = sub.sub_registry_with_label((
                std::borrow::Cow::Borrowed("store"),
                std::borrow::Cow::Borrowed(*store),
            ));
            sub.register(
                "group_commits",
                "Group commits (one write transaction and fsync each)",
                metrics.commits.clone(),
            );
            sub.register_with_unit(
                "commit_duration",
                "Time of one group commit, fsync included",
                Unit::Seconds,
                metrics.commit_seconds.clone(),
            );
            sub.register(
                "records",
                "Records the store's table holds after its latest commit",
                metrics.records.clone(),
            );
            if *store == "replica" {
                sub.register(
                    "checkpoints",
                    "Checkpoints of the replica store: synced commits of its database after which its group log starts again",
                    metrics.checkpoints.clone(),
                );
                sub.register(
                    "checkpoints_overdue",
                    "Checkpoints of the replica store made outside this member's turn because its group log was overdue (they may overlap a peer's)",
                    metrics.checkpoints_overdue.clone(),
                );
                sub.register_with_unit(
                    "checkpoint_duration",
                    "Time of one checkpoint of the replica store, fsync included (the next group waits for it)",
                    Unit::Seconds,
                    metrics.checkpoint_seconds.clone(),
                );
            }
        }
        if let Some(replication) = &replication {
            replication.register(&mut registry);
        }
        Metrics {
            registry,
            engine,
            cluster,
            replication,
            data_dir,
        }
    }

    /// The queues' figures now, in name order: the engine's for a node alone, the local view's
    /// for a member.
    ///
    /// # Errors
    /// `ShuttingDown` when a node alone's engine no longer answers.
    pub async fn queue_stats(&self) -> Result<Vec<QueueStats>, EngineError> {
        match &self.cluster {
            None => self.engine.stats().await,
            Some(cluster) => {
                let replication = self
                    .replication
                    .as_ref()
                    .expect("a member has replication metrics");
                let mut stats = cluster.queue_stats();
                for queue in &mut stats {
                    queue.dead_letter_moves = replication.dead_letter_moves(&queue.name);
                }
                Ok(stats)
            }
        }
    }

    /// The whole exposition now, in the OpenMetrics text format.
    ///
    /// # Errors
    /// `ShuttingDown` when a node alone's engine no longer answers.
    pub async fn exposition(&self) -> Result<String, EngineError> {
        let queues = self.queue_stats().await?;
        let now = self.engine.now();
        let member = self.cluster.as_ref().map(Cluster::member_state);
        let mut text = String::new();
        encode_registry(&mut text, &self.registry).expect("writing to a String cannot fail");
        let scrape = scrape_registry(&queues, now, member.as_ref(), &self.data_dir);
        encode_registry(&mut text, &scrape).expect("writing to a String cannot fail");
        encode_eof(&mut text).expect("writing to a String cannot fail");
        Ok(text)
    }

    /// Whether the node can serve: `Ok` or the reason it cannot (for `/ready`).
    ///
    /// # Errors
    /// The reason, in a short sentence.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(reason) = self.engine.failure() {
            return Err(format!("storage failed: {reason}"));
        }
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let member = cluster.member_state();
        if let Some(fault) = member.store_fault {
            return Err(format!("the replica store failed: {fault}"));
        }
        if let Some(reason) = member.not_joined {
            return Err(format!("not joined: {reason}"));
        }
        member.quorum_reason()
    }
}

/// The gauges of one scrape, in a registry of their own (built anew each time, so a deleted
/// queue's series are gone with it).
fn scrape_registry(
    queues: &[QueueStats],
    now: Millis,
    member: Option<&MemberState>,
    data_dir: &std::path::Path,
) -> Registry {
    type F64Gauge = Gauge<f64, AtomicU64>;
    let mut registry = Registry::default();
    let ready: Family<QueueLabels, Gauge> = Family::default();
    let in_flight: Family<QueueLabels, Gauge> = Family::default();
    let delayed: Family<QueueLabels, Gauge> = Family::default();
    let oldest: Family<QueueLabels, F64Gauge> = Family::default();
    let dead_lettered: Family<QueueLabels, Counter> = Family::default();
    let as_i64 = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    for queue in queues {
        let labels = QueueLabels::of(&queue.name);
        ready.get_or_create(&labels).set(as_i64(queue.counts.ready));
        in_flight
            .get_or_create(&labels)
            .set(as_i64(queue.counts.in_flight));
        delayed
            .get_or_create(&labels)
            .set(as_i64(queue.counts.delayed));
        // An empty queue's oldest message is 0 s old, as SQS reports it.
        let age_ms = queue
            .oldest_sent_at
            .map_or(0, |sent_at| now.0.saturating_sub(sent_at.0));
        oldest.get_or_create(&labels).set(age_ms as f64 / 1_000.0);
        dead_lettered
            .get_or_create(&labels)
            .inc_by(queue.dead_letter_moves);
    }
    registry.register(
        "trireme_queue_messages_ready",
        "Messages that a receive can take now (ApproximateNumberOfMessages), per queue; a dead-letter queue's is its depth",
        ready,
    );
    registry.register(
        "trireme_queue_messages_in_flight",
        "Messages received and not yet deleted or visible again (ApproximateNumberOfMessagesNotVisible), per queue",
        in_flight,
    );
    registry.register(
        "trireme_queue_messages_delayed",
        "Messages whose delay has not ended (ApproximateNumberOfMessagesDelayed), per queue",
        delayed,
    );
    registry.register_with_unit(
        "trireme_queue_oldest_message_age",
        "Time since the original send of the queue's oldest message (0 when empty), per queue",
        Unit::Seconds,
        oldest,
    );
    registry.register(
        "trireme_messages_dead_lettered",
        "Messages moved out of the queue to its dead-letter queue (past maxReceiveCount, or dead-letter now) since this node started, per source queue",
        dead_lettered,
    );
    let size: Family<StoreLabels, Gauge> = Family::default();
    let mut files = vec![("queues", crate::storage::DATABASE_FILE_NAME)];
    if member.is_some() {
        files.push(("replica", crate::cluster::store::REPLICA_DATABASE_FILE_NAME));
        files.push(("replica_log", crate::cluster::store::REPLICA_LOG_FILE_NAME));
    }
    for (store, file) in files {
        // A file that cannot be read is left out of this scrape rather than shown as 0.
        if let Ok(metadata) = std::fs::metadata(data_dir.join(file)) {
            size.get_or_create(&StoreLabels { store })
                .set(as_i64(metadata.len()));
        }
    }
    registry.register_with_unit(
        "trireme_storage_database_size",
        "Size of the store's database file (store=\"replica_log\": the replica's group log)",
        Unit::Bytes,
        size,
    );
    if let Some(member) = member {
        let up: Family<PeerLabels, Gauge> = Family::default();
        let offset: Family<PeerLabels, F64Gauge> = Family::default();
        for peer in &member.peers {
            let labels = PeerLabels {
                peer: peer.peer.to_string(),
            };
            up.get_or_create(&labels).set(i64::from(peer.up));
            if let Some(offset_ms) = peer.offset_ms {
                offset
                    .get_or_create(&labels)
                    .set(offset_ms as f64 / 1_000.0);
            }
        }
        registry.register(
            "trireme_peer_up",
            "1 when the peer answered recently (a clock probe within the sample age, or the link's last call), per peer",
            up,
        );
        registry.register_with_unit(
            "trireme_peer_clock_offset",
            "Estimated offset of the peer's clock from this node's (peer minus this node), per peer with a fresh sample",
            Unit::Seconds,
            offset,
        );
        let joined: Gauge = Gauge::default();
        joined.set(i64::from(member.not_joined.is_none()));
        registry.register(
            "trireme_member_joined",
            "1 once this member has joined the cluster and serves",
            joined,
        );
    }
    registry
}

/// The metrics listener's routes: `/metrics`, `/health`, `/ready`; anything else is 404.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/health", get(serve_health))
        .route("/ready", get(serve_ready))
        .with_state(metrics)
}

async fn serve_metrics(State(metrics): State<Arc<Metrics>>) -> Response {
    match metrics.exposition().await {
        Ok(text) => {
            let mut response = (StatusCode::OK, text).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE),
            );
            response
        }
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response(),
    }
}

/// Alive: the process serves HTTP. Says nothing of storage or peers (that is `/ready`).
async fn serve_health() -> Response {
    (StatusCode::OK, "alive\n").into_response()
}

async fn serve_ready(State(metrics): State<Arc<Metrics>>) -> Response {
    match metrics.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => {
            let mut text = String::with_capacity(reason.len() + 1);
            let _ = writeln!(text, "{reason}");
            (StatusCode::SERVICE_UNAVAILABLE, text).into_response()
        }
    }
}

/// Why [`probe`] got no HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The URL is not `http://HOST:PORT/PATH`.
    #[error("{url:?} is not an http://HOST:PORT/PATH URL")]
    Url { url: String },
    /// The host could not be resolved or reached.
    #[error("cannot reach {address}: {reason}")]
    Connect { address: String, reason: String },
    /// The exchange failed or timed out, or the answer is not HTTP.
    #[error("no HTTP answer from {address}: {reason}")]
    Answer { address: String, reason: String },
}

/// Bytes of an answer [`probe`] reads at most (a health answer is a line; an exposition of
/// many queues is larger, and a probe needs only its status).
const PROBE_ANSWER_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// `GET url` over plain HTTP/1.1 with `timeout` for connecting and for each read and write:
/// the status code and the body. For `trireme-node probe` (a container's health check, with no
/// shell or curl in the image) and tests.
///
/// # Errors
/// `Url` for anything but `http://HOST:PORT/PATH`, `Connect` when no address of the host
/// accepts, `Answer` when the exchange fails or is not HTTP.
pub fn probe(url: &str, timeout: Duration) -> Result<(u16, String), ProbeError> {
    use std::io::{Read, Write};
    use std::net::{TcpStream, ToSocketAddrs};

    let malformed = || ProbeError::Url {
        url: url.to_owned(),
    };
    let rest = url.strip_prefix("http://").ok_or_else(malformed)?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, "/"),
    };
    if authority.is_empty() || !authority.contains(':') {
        return Err(malformed());
    }
    let connect_error = |reason: String| ProbeError::Connect {
        address: authority.to_owned(),
        reason,
    };
    let answer_error = |reason: String| ProbeError::Answer {
        address: authority.to_owned(),
        reason,
    };
    let addresses = authority
        .to_socket_addrs()
        .map_err(|error| connect_error(error.to_string()))?;
    let mut last = String::from("the host has no address");
    let mut connected = None;
    for address in addresses {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(stream) => {
                connected = Some(stream);
                break;
            }
            Err(error) => last = error.to_string(),
        }
    }
    let mut stream = connected.ok_or_else(|| connect_error(last))?;
    let io = |error: std::io::Error| answer_error(error.to_string());
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut raw = Vec::new();
    stream
        .take(PROBE_ANSWER_BYTES_MAX)
        .read_to_end(&mut raw)
        .map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| answer_error("the answer has no header end".to_owned()))?;
    let status = head
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| {
            answer_error(format!(
                "not an HTTP status line: {:?}",
                head.lines().next()
            ))
        })?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::encoding::text::encode_registry;
    use prometheus_client::registry::Registry;
    use trireme_replication::NodeId;
    use trireme_replication::placement::Ring;

    use super::{Api, MemberState, PeerState, RequestMetrics};

    /// The exposition's lines in order: a family's series come in its map's order, which
    /// differs between two families.
    fn exposition(requests: &RequestMetrics) -> String {
        let mut registry = Registry::default();
        requests.register(&mut registry);
        let mut text = String::new();
        encode_registry(&mut text, &registry).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines.join("\n")
    }

    #[test]
    fn an_operations_kept_series_records_what_observe_records() {
        let (kept, observed) = (RequestMetrics::default(), RequestMetrics::default());
        let send = kept.operation(Api::Grpc, "SendMessage");
        let receive = kept.operation(Api::Grpc, "ReceiveMessages");
        let _never = kept.operation(Api::Sqs, "SendMessage");
        // Made, not yet used: no series at all, as before any request.
        assert_eq!(exposition(&kept), exposition(&observed));
        assert!(!exposition(&kept).contains("operation="));
        for (elapsed_ms, reason) in [(3, None), (700, Some("QueueNotFound")), (40_000, None)] {
            let elapsed = Duration::from_millis(elapsed_ms);
            send.observe(elapsed, reason);
            observed.observe(Api::Grpc, "SendMessage", elapsed, reason);
        }
        receive.observe(Duration::from_millis(20_001), Some("Cancelled"));
        observed.observe(
            Api::Grpc,
            "ReceiveMessages",
            Duration::from_millis(20_001),
            Some("Cancelled"),
        );
        // The same series, counts, sums and buckets, and nothing for the operation not used.
        assert_eq!(exposition(&kept), exposition(&observed));
        let text = exposition(&kept);
        assert!(
            text.contains(
                "trireme_request_duration_seconds_count{api=\"grpc\",operation=\"SendMessage\"} 3"
            ),
            "{text}"
        );
        assert!(!text.contains("api=\"sqs\""), "{text}");
        // A series recorded through the family first is the one the operation keeps.
        let later = kept.operation(Api::Grpc, "SendMessage");
        later.observe(Duration::from_millis(1), None);
        assert!(
            exposition(&kept).contains(
                "trireme_request_duration_seconds_count{api=\"grpc\",operation=\"SendMessage\"} 4"
            ),
            "{}",
            exposition(&kept)
        );
    }

    fn member(node: u16, members: u16, down: &[u16]) -> MemberState {
        let ring = Ring::new((1..=members).map(NodeId)).expect("a ring");
        MemberState {
            not_joined: None,
            peers: (1..=members)
                .filter(|peer| *peer != node)
                .map(|peer| PeerState {
                    peer,
                    up: !down.contains(&peer),
                    offset_ms: None,
                    version: None,
                })
                .collect(),
            node,
            replica_sets: ring
                .replica_sets()
                .into_iter()
                .map(|set| set.map(|m| m.0))
                .collect(),
            quorum: 2,
            store_fault: None,
        }
    }

    #[test]
    fn three_members_need_two() {
        assert_eq!(member(1, 3, &[]).quorum_reason(), Ok(()));
        assert_eq!(member(1, 3, &[2]).quorum_reason(), Ok(()));
        let reason = member(1, 3, &[2, 3]).quorum_reason().unwrap_err();
        assert!(
            reason.starts_with("1 of 3 members reachable") && reason.contains("1 of 1 replica"),
            "{reason}"
        );
    }

    #[test]
    fn five_members_need_a_quorum_of_every_replica_set() {
        for down in 1..=5 {
            let node = if down == 1 { 2 } else { 1 };
            assert_eq!(
                member(node, 5, &[down]).quorum_reason(),
                Ok(()),
                "one of five down"
            );
        }
        // Three members reachable of five: two down hold two of some set together whenever the
        // ring puts them in one, which it does for every pair with its virtual nodes.
        let state = member(1, 5, &[2, 3]);
        let short = state.sets_without_quorum();
        assert!(!short.is_empty());
        assert!(short.iter().all(|set| set.contains(&2) && set.contains(&3)));
        let reason = state.quorum_reason().unwrap_err();
        assert!(reason.starts_with("3 of 5 members reachable"), "{reason}");
        // The old test (members reachable against the quorum of one set) said ready here.
        assert!(state.reachable().len() >= state.quorum);
    }
}
