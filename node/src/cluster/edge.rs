//! The public API's commands served by the cluster: what the gRPC and SQS edges ask of a
//! cluster member, translated into the coordinator operations of `Cluster` and their answers
//! translated back into the core's `Outcome`s and `Reject`s, so the edges say the same thing
//! whether a node runs alone or in a cluster (spec/replication.md §1, part 1 *Operations*).
//!
//! A queue's attributes travel in its name record as one register per attribute (the
//! attribute's JSON under its field name), so two concurrent changes of different attributes
//! both survive (§1, *SetQueueAttributes*). A message's body, attributes and system attributes
//! travel as the replicas' opaque payload, in the node's codec.
//!
//! This module must never decide a protocol question: it checks what the core checks on a node
//! running alone, looks the queue up, and calls the coordinator.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use tracing::{error, warn};
use trireme_core::{
    AttributeChanges, AttributeValue, ClaimTag, Command, DedupId, Delivery, HandleProblem,
    Incarnation, MessageCounts, MessageId, Millis, Outcome, QueueAttributes, QueueName, QueueView,
    ReceiptHandle, Reject, SystemAttributes, check_message, check_system_attributes, check_tags,
    limits, receive_parameters,
};
use trireme_replication::coordinator::WRITE_QUORUM;
use trireme_replication::coordinator::{
    DeadLetterNowAnswer, DeleteAnswer, Handle, MoveAnswer, SendAnswer, VisibilityAnswer,
};
use trireme_replication::dedup::DedupSendAnswer;
use trireme_replication::name::{
    CreateAnswer, DeleteQueueAnswer, NameRecord, PurgeAnswer, Register,
};
use trireme_replication::placement::REPLICAS;
use trireme_replication::record::Birth;
use trireme_replication::{Claim, Generation, NodeId, RecordKey};

use super::long_poll::Wait;
use super::names::{ChangeQueueError, QueueState};
use super::{Cluster, DeadLetter, Delivered};
use crate::clock::Clock;
use crate::codec;
use crate::engine::EngineError;
use crate::fault::{FaultKind, StoreFault};
use crate::handle::HandleCodec;

mod move_tasks;

/// What the clock gate's refusal says (spec/replication.md#clock-monitoring): a member whose
/// clock may not coordinate refuses a call before any of it is sent or written, so the call did
/// nothing, and a client may take the answer for a refusal and call another member. Every other
/// `Unavailable` may have taken effect.
pub const NOT_COORDINATING: &str = "coordinates nothing now and did nothing";

/// What a replicated message carries for its consumers, opaque to the replicas.
#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    body: String,
    attributes: BTreeMap<String, AttributeValue>,
    system: SystemAttributes,
}

/// What a send carries besides its queue, id and deduplication id.
struct Message {
    body: String,
    attributes: BTreeMap<String, AttributeValue>,
    system: SystemAttributes,
    delay_s: Option<u32>,
}

/// A queue as a command needs it: its live incarnation and its settings.
#[derive(Clone, Debug)]
struct Known {
    incarnation: Incarnation,
    attributes: QueueAttributes,
}

/// The public API's commands over the cluster. Cheap to clone.
#[derive(Clone)]
pub struct ClusterEdge {
    cluster: Cluster,
    handles: HandleCodec,
    clock: Arc<dyn Clock>,
    /// Message ids.
    ids: Arc<Mutex<ChaCha20Rng>>,
    /// Long polls under way through this edge, in all and per queue.
    long_polls: Arc<LongPollCounts>,
    /// The node's cap on long polls in all (`long_polls_max`).
    long_polls_max: usize,
    /// Queues' attributes as last decoded from their registers.
    decoded: Arc<DecodedAttributes>,
}

/// Queue attributes decoded from their registers, kept per queue with what the registers are
/// made of (the create's attributes and the changes on top): a lookup whose record holds the
/// same takes them without making the registers or decoding their JSON again, and any change
/// decodes anew. At most `decoded_attributes_queues_max` queues.
#[derive(Debug, Default)]
struct DecodedAttributes {
    by_queue: Mutex<BTreeMap<QueueName, Decoded>>,
}

/// What a queue's attribute registers were made of, and the attributes decoded from them.
#[derive(Debug)]
struct Decoded {
    /// The create's attributes (the live proposal's).
    created: BTreeMap<String, String>,
    /// The attribute changes on top of them.
    changes: BTreeMap<String, Register>,
    attributes: QueueAttributes,
}

impl DecodedAttributes {
    /// The attributes of the live queue `record` holds, as [`attributes_from_registers`]
    /// decodes its registers. Called under the name view's lock (`Cluster::queue_with`), so
    /// this lock is only ever taken after that one.
    ///
    /// # Panics
    /// When `record` has no live incarnation: callers read only live records.
    fn of_record(&self, name: &QueueName, record: &NameRecord) -> Result<QueueAttributes, String> {
        let created = &record
            .live()
            .expect("only a live queue's attributes are decoded")
            .attributes;
        let mut by_queue = self
            .by_queue
            .lock()
            .expect("the decoded attributes' lock is never poisoned");
        if let Some(decoded) = by_queue.get(name)
            && decoded.created == *created
            && decoded.changes == record.attributes
        {
            return Ok(decoded.attributes.clone());
        }
        let registers = record
            .current_attributes()
            .expect("a live record has attributes");
        let attributes = attributes_from_registers(&registers)?;
        if by_queue.len() >= crate::limits::decoded_attributes_queues_max
            && !by_queue.contains_key(name)
        {
            by_queue.clear();
        }
        by_queue.insert(
            name.clone(),
            Decoded {
                created: created.clone(),
                changes: record.attributes.clone(),
                attributes: attributes.clone(),
            },
        );
        Ok(attributes)
    }
}

/// Long polls waiting through one edge: in all, and per queue (the single node's
/// `waiters_per_queue_max`, which its core enforces).
#[derive(Debug, Default)]
struct LongPollCounts {
    all: AtomicUsize,
    by_queue: Mutex<BTreeMap<QueueName, usize>>,
}

/// A long poll's place under the caps, given back when the poll ends however it ends.
struct LongPollSlot {
    counts: Arc<LongPollCounts>,
    queue: QueueName,
}

impl Drop for LongPollSlot {
    fn drop(&mut self) {
        self.counts.all.fetch_sub(1, Ordering::AcqRel);
        let mut by_queue = self
            .counts
            .by_queue
            .lock()
            .expect("the long polls' lock is never poisoned");
        if let Some(count) = by_queue.get_mut(&self.queue) {
            *count -= 1;
            if *count == 0 {
                by_queue.remove(&self.queue);
            }
        }
    }
}

impl std::fmt::Debug for ClusterEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterEdge")
            .field("node", &self.cluster.node())
            .finish_non_exhaustive()
    }
}

impl ClusterEdge {
    /// `Unavailable`, saying why, until this node has joined (spec/replication.md, *Stragglers
    /// and replacement*).
    fn serving(&self) -> Result<(), EngineError> {
        match self.cluster.join_state().refusal() {
            None => Ok(()),
            Some(reason) => Err(EngineError::Unavailable { reason }),
        }
    }
}

fn unavailable(what: &str) -> EngineError {
    EngineError::Unavailable {
        reason: format!(
            "{what}: fewer than two replicas answered in time; it may still have taken effect"
        ),
    }
}

fn not_found(name: &QueueName) -> EngineError {
    EngineError::Rejected(Reject::QueueNotFound { name: name.clone() })
}

/// The refusal for a queue whose attribute registers do not decode: a replica holds a value no
/// writer wrote.
fn undecodable(name: &QueueName, reason: &str) -> EngineError {
    error!(queue = %name, %reason, "a queue's attribute registers do not decode");
    EngineError::Storage(StoreFault {
        kind: FaultKind::Corrupt,
        detail: format!("queue {name}: an attribute register does not decode: {reason}"),
    })
}

/// The registers a queue's attributes are stored as: one per attribute, its JSON by field name.
///
/// # Panics
/// Never: the attributes are plain data that always serialise to a JSON object.
#[must_use]
pub fn attribute_registers(attributes: &QueueAttributes) -> BTreeMap<String, String> {
    let serde_json::Value::Object(fields) =
        serde_json::to_value(attributes).expect("queue attributes serialise to JSON")
    else {
        unreachable!("queue attributes are a struct");
    };
    fields
        .into_iter()
        .map(|(name, value)| (name, value.to_string()))
        .collect()
}

/// The attributes the registers hold; an attribute without a register has its default.
///
/// # Errors
/// The register that does not decode, with why: a replica holds a value no writer wrote.
pub fn attributes_from_registers(
    registers: &BTreeMap<String, String>,
) -> Result<QueueAttributes, String> {
    let serde_json::Value::Object(mut fields) = serde_json::to_value(QueueAttributes::default())
        .expect("queue attributes serialise to JSON")
    else {
        unreachable!("queue attributes are a struct");
    };
    for (name, text) in registers {
        let value = serde_json::from_str(text)
            .map_err(|error| format!("attribute register {name}: {error}"))?;
        fields.insert(name.clone(), value);
    }
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|error| format!("attribute registers: {error}"))
}

impl ClusterEdge {
    /// The edge over `cluster`, issuing handles with `handles` (the cluster's shared key).
    #[must_use]
    pub fn new(
        cluster: Cluster,
        handles: HandleCodec,
        clock: Arc<dyn Clock>,
        seed: Option<u64>,
    ) -> ClusterEdge {
        let ids = match seed {
            // A stream apart from the claim nonces', so the two never repeat each other.
            Some(seed) => ChaCha20Rng::seed_from_u64(seed ^ 0x6d65_7373_6167_6569),
            None => ChaCha20Rng::from_os_rng(),
        };
        ClusterEdge {
            cluster,
            handles,
            clock,
            ids: Arc::new(Mutex::new(ids)),
            long_polls: Arc::default(),
            long_polls_max: crate::limits::long_polls_max_default,
            decoded: Arc::default(),
        }
    }

    /// The same edge with at most `max` long polls waiting at once (the node's
    /// `long_polls_max`); a receive that would wait beyond is refused
    /// [`EngineError::LongPollsFull`].
    #[must_use]
    pub fn with_long_polls_max(mut self, max: usize) -> ClusterEdge {
        assert!(max >= 1, "a cap of at least one long poll");
        self.long_polls_max = max;
        self
    }

    /// Long polls waiting through this edge now.
    #[must_use]
    pub fn long_polls(&self) -> usize {
        self.long_polls.all.load(Ordering::Acquire)
    }

    /// A place for one more long poll on `queue`, or the refusal when the queue's waiters are
    /// at `waiters_per_queue_max` (`WaiterLimit`, as the single node's core refuses it) or the
    /// node's long polls at `long_polls_max` (`LongPollsFull`).
    fn long_poll_slot(&self, queue: &QueueName) -> Result<LongPollSlot, EngineError> {
        let mut by_queue = self
            .long_polls
            .by_queue
            .lock()
            .expect("the long polls' lock is never poisoned");
        let waiting = by_queue.get(queue).copied().unwrap_or(0);
        if waiting >= limits::waiters_per_queue_max {
            return Err(EngineError::Rejected(Reject::WaiterLimit {
                name: queue.clone(),
                max: limits::waiters_per_queue_max,
            }));
        }
        let max = self.long_polls_max;
        if self.long_polls.all.fetch_add(1, Ordering::AcqRel) >= max {
            self.long_polls.all.fetch_sub(1, Ordering::AcqRel);
            warn!(max, "long polls at their cap: a receive refused");
            return Err(EngineError::LongPollsFull { max });
        }
        by_queue.insert(queue.clone(), waiting + 1);
        Ok(LongPollSlot {
            counts: Arc::clone(&self.long_polls),
            queue: queue.clone(),
        })
    }

    /// The cluster this edge serves.
    #[must_use]
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The codec of the cluster's receipt handles.
    #[must_use]
    pub fn handles(&self) -> &HandleCodec {
        &self.handles
    }

    /// A fresh message id (random: unique across coordinators without coordination).
    #[must_use]
    pub fn new_message_id(&self) -> MessageId {
        MessageId(
            self.ids
                .lock()
                .expect("the id lock is never poisoned")
                .random(),
        )
    }

    /// The node's clock.
    #[must_use]
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Up to `limit` messages of `queue` as this member's replica holds them, the first entered
    /// first: a read of the local view that asks no peer, claims nothing and changes no receive
    /// count (the console's peek; a member holds only what it replicates).
    ///
    /// # Errors
    /// `Unavailable` when the replica store cannot be read.
    pub async fn peek(
        &self,
        queue: &QueueName,
        limit: usize,
    ) -> Result<Vec<crate::backend::Peeked>, EngineError> {
        use super::store::PeekState;
        use crate::backend::{Peeked, PeekedState};
        let records = self
            .cluster
            .local_records(queue, limit)
            .await
            .map_err(|error| EngineError::Unavailable {
                reason: format!("the replica store cannot be read: {error}"),
            })?;
        Ok(records
            .into_iter()
            .filter_map(|(id, record, state)| {
                let live = record.live()?;
                // A payload that does not decode is shown by its other fields, bodiless.
                let body = codec::decode_framed::<Payload>(&live.birth.payload)
                    .map_or_else(|_| String::new(), |payload| payload.body);
                Some(Peeked {
                    id,
                    state: match state {
                        PeekState::Ready => PeekedState::Ready,
                        PeekState::InFlight => PeekedState::InFlight,
                        PeekState::Delayed => PeekedState::Delayed,
                    },
                    receive_count: live.receive_count,
                    sent_at: live.birth.sent_at,
                    source: live.birth.source_queue.as_ref().map(|s| s.name.clone()),
                    body,
                })
            })
            .collect())
    }

    /// spec/replication.md#clock-monitoring: a node whose clock is not shown within the bound
    /// coordinates nothing, and the refusal names the measured skew and the bound.
    async fn coordinating(&self) -> Result<(), EngineError> {
        self.cluster
            .coordinating()
            .await
            .map_err(|standing| EngineError::Unavailable {
                reason: format!(
                    "node {} {NOT_COORDINATING}: {standing}",
                    self.cluster.node().0
                ),
            })
    }

    /// An answer of unavailability with the store faults replicas reported (spec/replication.md
    /// #durability): a full disk is named as one, not left for the client to guess.
    /// An answer of unavailability while two or more replicas' last answer was *overloaded* is
    /// the throttling refusal instead (spec/replication.md#durability, *A replica that is
    /// overloaded*): the client is told to come back later, not that replicas are down.
    fn explained<T>(&self, result: Result<T, EngineError>) -> Result<T, EngineError> {
        const MARK: &str = "; replica stores failed: ";
        match result {
            Err(EngineError::Unavailable { reason })
                if self.cluster.overloaded_replicas().len() > REPLICAS - WRITE_QUORUM =>
            {
                let named: Vec<String> = self
                    .cluster
                    .overloaded_replicas()
                    .iter()
                    .map(|node| format!("node {}", node.0))
                    .collect();
                Err(EngineError::ReplicasOverloaded {
                    reason: format!(
                        "{reason}; replicas overloaded, their stores' queues full: {}",
                        named.join(", ")
                    ),
                })
            }
            Err(EngineError::Unavailable { reason }) if !reason.contains(MARK) => {
                let faults = self.cluster.replica_faults();
                if faults.is_empty() {
                    return Err(EngineError::Unavailable { reason });
                }
                let named: Vec<String> = faults
                    .iter()
                    .map(|(node, fault)| format!("node {}: {fault}", node.0))
                    .collect();
                Err(EngineError::Unavailable {
                    reason: format!("{reason}{MARK}{}", named.join("; ")),
                })
            }
            other => other,
        }
    }

    /// The live queue `name`'s incarnation and attributes, if it is live: all a message
    /// command needs, read without copying its tags or decoding registers it decoded before.
    async fn lookup(&self, name: &QueueName) -> Result<Option<Known>, EngineError> {
        let seen = self
            .cluster
            .queue_with(name, |record| {
                let live = record.live()?;
                Some((live.incarnation, self.decoded.of_record(name, record)))
            })
            .await
            .map_err(|_| unavailable("reading the queue"))?;
        let Some((incarnation, attributes)) = seen else {
            return Ok(None);
        };
        Ok(Some(Known {
            incarnation,
            attributes: attributes.map_err(|reason| undecodable(name, &reason))?,
        }))
    }

    /// [`ClusterEdge::lookup`], with the rest of the queue's state (tags, stamps, watermark).
    async fn lookup_state(
        &self,
        name: &QueueName,
    ) -> Result<Option<(Known, QueueState)>, EngineError> {
        let seen = self
            .cluster
            .queue_with(name, |record| {
                Some((
                    QueueState::of(record)?,
                    self.decoded.of_record(name, record),
                ))
            })
            .await
            .map_err(|_| unavailable("reading the queue"))?;
        let Some((state, attributes)) = seen else {
            return Ok(None);
        };
        let known = Known {
            incarnation: state.incarnation,
            attributes: attributes.map_err(|reason| undecodable(name, &reason))?,
        };
        Ok(Some((known, state)))
    }

    async fn known(&self, name: &QueueName) -> Result<Known, EngineError> {
        self.lookup(name).await?.ok_or_else(|| not_found(name))
    }

    async fn known_state(&self, name: &QueueName) -> Result<(Known, QueueState), EngineError> {
        self.lookup_state(name)
            .await?
            .ok_or_else(|| not_found(name))
    }

    /// Applies `command` (spec/queue-core.md's actions, as the cluster serves them).
    ///
    /// # Errors
    /// `Rejected` with the core's refusal, `Unavailable` when too few replicas answered or this
    /// node's clock does not let it coordinate, `Unsupported` for an action this version serves
    /// only alone.
    pub async fn execute(&self, command: Command) -> Result<Outcome, EngineError> {
        self.execute_at(command, None).await
    }

    /// [`ClusterEdge::execute`], a send being one of a batch sent at `batch_at` when given.
    async fn execute_at(
        &self,
        command: Command,
        batch_at: Option<Millis>,
    ) -> Result<Outcome, EngineError> {
        self.serving()?;
        self.coordinating().await?;
        let result = self.execute_command(command, batch_at).await;
        self.explained(result)
    }

    /// `command`, a send of a batch sent at `batch_at` when it is one (its `sent_at`).
    async fn execute_command(
        &self,
        command: Command,
        batch_at: Option<Millis>,
    ) -> Result<Outcome, EngineError> {
        match command {
            Command::CreateQueue {
                name,
                attributes,
                tags,
            } => self.create_queue(name, attributes, tags).await,
            Command::SetQueueAttributes { name, changes } => {
                self.set_attributes(&name, &changes).await
            }
            Command::DeleteQueue { name } => match self.cluster.delete_queue(&name).await {
                DeleteQueueAnswer::Deleted(_) => Ok(Outcome::Done),
                DeleteQueueAnswer::DoesNotExist => Err(not_found(&name)),
                DeleteQueueAnswer::Unavailable => Err(unavailable("deleting the queue")),
            },
            Command::TagQueue { name, tags } => {
                let (known, state) = self.known_state(&name).await?;
                let mut after = state.tags.clone();
                after.extend(tags.clone());
                check_tags(&after)?;
                let tags = tags.into_iter().map(|(k, v)| (k, Some(v))).collect();
                self.change(&name, &known, BTreeMap::new(), tags).await
            }
            Command::UntagQueue { name, keys } => {
                let (known, state) = self.known_state(&name).await?;
                let tags = keys
                    .into_iter()
                    .filter(|key| state.tags.contains_key(key))
                    .map(|key| (key, None))
                    .collect();
                self.change(&name, &known, BTreeMap::new(), tags).await
            }
            Command::Send {
                queue,
                id,
                body,
                attributes,
                system,
                delay_s,
                dedup,
            } => {
                let message = Message {
                    body,
                    attributes,
                    system,
                    delay_s,
                };
                self.send(&queue, id, message, dedup, batch_at).await
            }
            Command::Receive {
                queue,
                max,
                visibility_s,
                wait_s,
                ..
            } => self
                .receive(queue, max, visibility_s, wait_s)
                .await
                .map(Outcome::Received),
            // A cluster's long polls are the callers' own futures: nothing to cancel here.
            Command::CancelWaiter { .. } => Ok(Outcome::Done),
            Command::Delete { queue, handle } => self.delete(&queue, &handle).await,
            Command::ChangeVisibility {
                queue,
                handle,
                timeout_s,
            } => self.change_visibility(&queue, &handle, timeout_s).await,
            Command::PurgeQueue { name } => self.purge(&name).await,
            Command::DeadLetterNow { queue, handle } => self.dead_letter_now(&queue, &handle).await,
            Command::Redrive { .. } => Err(EngineError::Unsupported { action: "Redrive" }),
        }
    }

    /// Applies every command, concurrently, answering in order. The sends among them are sent
    /// at one instant, so a batch received whole comes back in entry order (spec/replication.md,
    /// *Order of a receive's answer*; the callers draw a batch's ids in increasing entry order).
    pub async fn execute_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, EngineError>> {
        let batch_at = self.clock.now();
        let mut running = tokio::task::JoinSet::new();
        for (index, command) in commands.into_iter().enumerate() {
            let edge = self.clone();
            // Each command's replica calls carry the request's trace id (`crate::trace`).
            running.spawn(crate::trace::inherit(async move {
                (index, edge.execute_at(command, Some(batch_at)).await)
            }));
        }
        let mut results: Vec<Option<Result<Outcome, EngineError>>> = Vec::new();
        results.resize_with(running.len(), || None);
        while let Some(joined) = running.join_next().await {
            let (index, result) = joined.expect("a command task never panics");
            results[index] = Some(result);
        }
        results
            .into_iter()
            .map(|result| result.expect("every command answered"))
            .collect()
    }

    async fn create_queue(
        &self,
        name: QueueName,
        attributes: QueueAttributes,
        tags: BTreeMap<String, String>,
    ) -> Result<Outcome, EngineError> {
        attributes.validate()?;
        check_tags(&tags)?;
        if let Some(policy) = &attributes.redrive {
            self.check_redrive_target(&name, &policy.dead_letter_queue)
                .await?;
        }
        let registers = attribute_registers(&attributes);
        match self.cluster.create_queue(&name, registers, tags).await {
            CreateAnswer::Created(incarnation) => Ok(Outcome::QueueCreated {
                created: incarnation.node == self.cluster.node().0,
            }),
            CreateAnswer::NameExists(_) => Err(Reject::QueueNameExists { name }.into()),
            CreateAnswer::DeletedRecently => Err(Reject::QueueDeletedRecently { name }.into()),
            CreateAnswer::Unavailable => Err(unavailable("creating the queue")),
        }
    }

    /// A redrive policy of `source` may name `dlq` only if it exists, is another queue, admits
    /// `source` and does not lead back to `source` (the checks of a node running alone, on
    /// what the name records say now).
    async fn check_redrive_target(
        &self,
        source: &QueueName,
        dlq: &QueueName,
    ) -> Result<(), EngineError> {
        let refuse = |reason: String| {
            EngineError::Rejected(Reject::InvalidAttribute {
                attribute: "RedrivePolicy",
                reason,
            })
        };
        if dlq == source {
            return Err(refuse(format!(
                "the dead-letter queue must be another queue than {source}"
            )));
        }
        let Some(target) = self.lookup(dlq).await? else {
            return Err(refuse(format!("dead-letter queue {dlq} does not exist")));
        };
        if !target.attributes.redrive_allow.admits(source) {
            return Err(Reject::RedriveNotAllowed {
                source_queue: source.clone(),
                dead_letter_queue: dlq.clone(),
            }
            .into());
        }
        let mut seen = BTreeSet::new();
        let mut next = target.attributes.redrive.map(|p| p.dead_letter_queue);
        seen.insert(dlq.clone());
        while let Some(current) = next {
            if &current == source {
                return Err(refuse(format!(
                    "dead-letter queue {dlq} leads back to {source}: redrive policies may not form a cycle"
                )));
            }
            if !seen.insert(current.clone()) || seen.len() >= limits::redrive_chain_queues_max {
                return Err(refuse(format!(
                    "the chain of dead-letter queues after {dlq} is longer than {} queues",
                    limits::redrive_chain_queues_max
                )));
            }
            next = match self.lookup(&current).await? {
                Some(queue) => queue.attributes.redrive.map(|p| p.dead_letter_queue),
                None => None,
            };
        }
        Ok(())
    }

    async fn set_attributes(
        &self,
        name: &QueueName,
        changes: &AttributeChanges,
    ) -> Result<Outcome, EngineError> {
        let known = self.known(name).await?;
        let after = known.attributes.with(changes);
        after.validate()?;
        if let Some(policy) = &after.redrive
            && known.attributes.redrive.as_ref() != Some(policy)
        {
            self.check_redrive_target(name, &policy.dead_letter_queue)
                .await?;
        }
        let before = attribute_registers(&known.attributes);
        let registers = attribute_registers(&after)
            .into_iter()
            .filter(|(field, value)| before.get(field) != Some(value))
            .map(|(field, value)| (field, Some(value)))
            .collect();
        self.change(name, &known, registers, BTreeMap::new()).await
    }

    async fn change(
        &self,
        name: &QueueName,
        known: &Known,
        attributes: BTreeMap<String, Option<String>>,
        tags: BTreeMap<String, Option<String>>,
    ) -> Result<Outcome, EngineError> {
        if attributes.is_empty() && tags.is_empty() {
            return Ok(Outcome::Done);
        }
        match self
            .cluster
            .change_queue(name, known.incarnation, attributes, tags)
            .await
        {
            Ok(()) => Ok(Outcome::Done),
            Err(ChangeQueueError::Gone) => Err(not_found(name)),
            Err(ChangeQueueError::TooManyTags) => Err(Reject::InvalidParameter {
                parameter: "Tags",
                reason: format!("at most {} tags per queue", limits::tags_per_queue_max),
            }
            .into()),
            Err(ChangeQueueError::Unavailable) => Err(unavailable("changing the queue")),
        }
    }

    /// spec/replication.md §2, *Purge*: the queue's live incarnation, then the watermark; the
    /// single node's refusals (`QueueNotFound`, `PurgeInProgress` with the time left).
    async fn purge(&self, name: &QueueName) -> Result<Outcome, EngineError> {
        let known = self.known(name).await?;
        match self.cluster.purge_queue(name, known.incarnation).await {
            PurgeAnswer::Purged { .. } => Ok(Outcome::Done),
            PurgeAnswer::InProgress { retry_after_ms } => Err(Reject::PurgeInProgress {
                name: name.clone(),
                retry_after_ms,
            }
            .into()),
            PurgeAnswer::Gone => Err(not_found(name)),
            PurgeAnswer::Unavailable => Err(unavailable("purging the queue")),
        }
    }

    /// A send (spec/replication.md#send), or with a deduplication id the send of §4, which
    /// answers as a node running alone does: the id's first message, `duplicate` when that is
    /// another send's.
    async fn send(
        &self,
        queue: &QueueName,
        id: MessageId,
        message: Message,
        dedup: Option<DedupId>,
        batch_at: Option<Millis>,
    ) -> Result<Outcome, EngineError> {
        let Message {
            body,
            attributes,
            system,
            delay_s,
        } = message;
        let known = self.known(queue).await?;
        let delay_s = delay_s.unwrap_or(known.attributes.delay_s);
        if delay_s > limits::delay_s_max {
            return Err(Reject::InvalidParameter {
                parameter: "DelaySeconds",
                reason: format!("must be in 0..={}, got {delay_s}", limits::delay_s_max),
            }
            .into());
        }
        check_message(&body, &attributes, known.attributes.message_bytes_max)?;
        check_system_attributes(&system)?;
        let now = batch_at.unwrap_or_else(|| self.clock.now());
        let payload = codec::encode_framed(&Payload {
            body,
            attributes,
            system,
        });
        let birth = Birth {
            payload,
            sent_at: now,
            visible_from: if delay_s > 0 {
                now.plus_s(delay_s)
            } else {
                Millis(0)
            },
            source_queue: None,
            dedup_id: dedup.as_ref().map(|dedup| dedup.as_str().to_owned()),
        };
        if let Some(dedup) = dedup {
            return match self
                .cluster
                .send_deduplicated(queue, known.incarnation, id, birth, dedup.clone())
                .await
            {
                DedupSendAnswer::Sent { message, duplicate } => Ok(Outcome::Sent {
                    id: message,
                    duplicate,
                }),
                DedupSendAnswer::Unavailable => Err(unavailable("sending the message")),
                DedupSendAnswer::Undecided => Err(EngineError::Unavailable {
                    reason: format!(
                        "deduplication id {dedup}: concurrent sends named different messages \
                         and none could be decided; retry after its window"
                    ),
                }),
            };
        }
        match self.cluster.send(queue, known.incarnation, id, birth).await {
            SendAnswer::Sent => Ok(Outcome::Sent {
                id,
                duplicate: false,
            }),
            SendAnswer::Unavailable => Err(unavailable("sending the message")),
        }
    }

    /// Receives up to `max` messages of `queue`, waiting up to `wait_s` (`None`: the queue's
    /// default) for the first; empty when none arrived in time.
    ///
    /// # Errors
    /// `Rejected` for a missing queue or an out-of-range parameter, `Unavailable` when the
    /// queue's record cannot be read or this node's clock does not let it coordinate (checked
    /// again before every look of a long poll).
    pub async fn receive(
        &self,
        queue: QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: Option<u32>,
    ) -> Result<Vec<Delivery>, EngineError> {
        let result = self.receive_waiting(queue, max, visibility_s, wait_s).await;
        self.explained(result)
    }

    async fn receive_waiting(
        &self,
        queue: QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: Option<u32>,
    ) -> Result<Vec<Delivery>, EngineError> {
        self.coordinating().await?;
        let known = self.known(&queue).await?;
        let (visibility_s, wait_s) =
            receive_parameters(&known.attributes, max, visibility_s, wait_s)?;
        let dead_letter = match &known.attributes.redrive {
            // A policy whose queue does not exist is inert until it exists again.
            Some(policy) => self
                .lookup(&policy.dead_letter_queue)
                .await?
                .map(|dlq| DeadLetter {
                    queue: policy.dead_letter_queue.clone(),
                    incarnation: dlq.incarnation,
                    max_receive_count: policy.max_receive_count,
                }),
            None => None,
        };
        let until = tokio::time::Instant::now() + Duration::from_secs(u64::from(wait_s));
        // Held for the whole wait; a short poll takes none.
        let _slot = if wait_s == 0 {
            None
        } else {
            Some(self.long_poll_slot(&queue)?)
        };
        let wait = Wait {
            max: max as usize,
            visibility_timeout_ms: u64::from(visibility_s) * 1_000,
            retention_ms: known.attributes.retention_ms(),
            dead_letter,
        };
        // Whether a pass claimed messages it could not deliver: a refusal of the gate after
        // one no longer did nothing.
        let mut claimed = false;
        loop {
            self.coordinating().await.map_err(|refusal| match refusal {
                EngineError::Unavailable { reason } if claimed => EngineError::Unavailable {
                    reason: reason.replace(
                        NOT_COORDINATING,
                        "coordinates nothing now (this receive claimed messages whose bodies \
                         did not decode)",
                    ),
                },
                other => other,
            })?;
            // A long poll waits as one of this node's waiters (spec/replication.md §9).
            let delivered = if wait_s == 0 {
                self.cluster
                    .receive(
                        &queue,
                        known.incarnation,
                        wait.max,
                        wait.visibility_timeout_ms,
                        wait.retention_ms,
                        wait.dead_letter.as_ref(),
                    )
                    .await
            } else {
                self.cluster
                    .long_poll(&queue, known.incarnation, wait.clone(), until)
                    .await
            };
            claimed |= !delivered.is_empty();
            let deliveries: Vec<Delivery> = delivered
                .into_iter()
                .filter_map(|delivered| self.delivery(&queue, delivered))
                .collect();
            // Only a delivery that did not decode leaves a wait with time left and nothing.
            if !deliveries.is_empty() || tokio::time::Instant::now() >= until {
                return Ok(deliveries);
            }
        }
    }

    fn delivery(&self, queue: &QueueName, delivered: Delivered) -> Option<Delivery> {
        let live = delivered.record.live()?;
        let payload: Payload = match codec::decode_framed(&live.birth.payload) {
            Ok(payload) => payload,
            Err(problem) => {
                // Claimed and not delivered: it comes back at its deadline, and says so again.
                error!(message = %delivered.key.message, %problem, "a replicated payload does not decode");
                return None;
            }
        };
        let claim = delivered.handle.claim;
        Some(Delivery {
            queue: queue.clone(),
            message: delivered.key.message,
            handle: ReceiptHandle {
                queue: queue.clone(),
                incarnation: delivered.key.incarnation,
                message: delivered.key.message,
                seq: claim.seq,
                claim: ClaimTag {
                    generation: delivered.handle.generation.0,
                    coordinator: claim.coordinator.0,
                    nonce: claim.nonce,
                },
            },
            body: payload.body,
            attributes: payload.attributes,
            system: payload.system,
            receive_count: live.receive_count,
            sent_at: live.birth.sent_at,
            first_receive_at: live.first_received_at.unwrap_or(live.birth.sent_at),
            source: live.birth.source_queue.as_ref().map(|s| s.name.clone()),
        })
    }

    /// The replicated handle and key of `handle`, once it is known to name `queue`'s live
    /// incarnation (§1: a handle of a deleted or losing incarnation never touches its successor).
    async fn replicated(
        &self,
        queue: &QueueName,
        handle: &ReceiptHandle,
    ) -> Result<(RecordKey, Handle), EngineError> {
        let known = self.known(queue).await?;
        if &handle.queue != queue || handle.incarnation != known.incarnation {
            return Err(Reject::ReceiptHandleInvalid {
                reason: HandleProblem::WrongQueue,
            }
            .into());
        }
        if handle.seq == 0 {
            return Err(Reject::ReceiptHandleInvalid {
                reason: HandleProblem::NeverIssued,
            }
            .into());
        }
        let key = RecordKey {
            queue: queue.clone(),
            incarnation: known.incarnation,
            message: handle.message,
        };
        let replicated = Handle {
            generation: Generation(handle.claim.generation),
            claim: Claim {
                seq: handle.seq,
                coordinator: NodeId(handle.claim.coordinator),
                nonce: handle.claim.nonce,
            },
        };
        Ok((key, replicated))
    }

    async fn delete(
        &self,
        queue: &QueueName,
        handle: &ReceiptHandle,
    ) -> Result<Outcome, EngineError> {
        let (key, replicated) = self.replicated(queue, handle).await?;
        match self.cluster.delete(&key, replicated).await {
            DeleteAnswer::Deleted => Ok(Outcome::Deleted {
                already_gone: false,
            }),
            // The handle's version ended (deleted, moved, expired or purged) or was collected
            // long ago: gone before this delete, as a node running alone answers.
            DeleteAnswer::AlreadyGone | DeleteAnswer::Moved | DeleteAnswer::NotFound => {
                Ok(Outcome::Deleted { already_gone: true })
            }
            DeleteAnswer::Stale => Err(Reject::StaleReceiptHandle {
                message: handle.message,
            }
            .into()),
            DeleteAnswer::Unavailable => Err(unavailable("deleting the message")),
            DeleteAnswer::Diverged(divergence) => Err(self.diverged(&key, &divergence)),
        }
    }

    /// spec/replication.md §10: the single node's refusals in its order (`QueueNotFound`,
    /// `NoRedrivePolicy`, `DeadLetterQueueMissing`, then the handle's), then the replicated move.
    async fn dead_letter_now(
        &self,
        queue: &QueueName,
        handle: &ReceiptHandle,
    ) -> Result<Outcome, EngineError> {
        let known = self.known(queue).await?;
        let Some(policy) = known.attributes.redrive.clone() else {
            return Err(Reject::NoRedrivePolicy {
                name: queue.clone(),
            }
            .into());
        };
        let Some(target) = self.lookup(&policy.dead_letter_queue).await? else {
            return Err(Reject::DeadLetterQueueMissing {
                name: queue.clone(),
                dead_letter_queue: policy.dead_letter_queue,
            }
            .into());
        };
        let (key, replicated) = self.replicated(queue, handle).await?;
        let dead_letter = DeadLetter {
            queue: policy.dead_letter_queue.clone(),
            incarnation: target.incarnation,
            max_receive_count: policy.max_receive_count,
        };
        match self
            .cluster
            .dead_letter_now(&key, replicated, &dead_letter)
            .await
        {
            Ok(MoveAnswer::Moved) => Ok(Outcome::DeadLettered {
                dead_letter_queue: policy.dead_letter_queue,
            }),
            // A receive claimed it again between the read and the source's tombstone: it is in
            // both queues (a duplicate), and this handle is superseded.
            Ok(MoveAnswer::CopiedOnly) | Err(DeadLetterNowAnswer::Stale) => {
                Err(Reject::StaleReceiptHandle {
                    message: handle.message,
                }
                .into())
            }
            Ok(MoveAnswer::Unavailable) | Err(DeadLetterNowAnswer::Unavailable) => {
                Err(unavailable("moving the message to the dead-letter queue"))
            }
            Err(DeadLetterNowAnswer::NotInFlight | DeadLetterNowAnswer::Current(_)) => {
                Err(Reject::MessageNotInFlight {
                    message: handle.message,
                }
                .into())
            }
            Err(DeadLetterNowAnswer::Diverged(divergence)) => Err(self.diverged(&key, &divergence)),
        }
    }

    async fn change_visibility(
        &self,
        queue: &QueueName,
        handle: &ReceiptHandle,
        timeout_s: u32,
    ) -> Result<Outcome, EngineError> {
        if timeout_s > limits::visibility_timeout_s_max {
            return Err(Reject::InvalidParameter {
                parameter: "VisibilityTimeout",
                reason: format!(
                    "must be in 0..={}, got {timeout_s}",
                    limits::visibility_timeout_s_max
                ),
            }
            .into());
        }
        let (key, replicated) = self.replicated(queue, handle).await?;
        let timeout_ms = u64::from(timeout_s) * 1_000;
        match self
            .cluster
            .change_visibility(
                &key,
                replicated,
                timeout_ms,
                limits::visibility_total_ms_max,
            )
            .await
        {
            VisibilityAnswer::Changed => Ok(Outcome::VisibilityChanged),
            VisibilityAnswer::Stale => Err(Reject::StaleReceiptHandle {
                message: handle.message,
            }
            .into()),
            VisibilityAnswer::NotInFlight => Err(Reject::MessageNotInFlight {
                message: handle.message,
            }
            .into()),
            VisibilityAnswer::ExceedsCap => {
                let now = self.clock.now();
                Err(Reject::VisibilityCapExceeded {
                    message: handle.message,
                    requested_until_ms: now.0 + timeout_ms,
                    cap_ms: limits::visibility_total_ms_max,
                }
                .into())
            }
            VisibilityAnswer::Unavailable => Err(unavailable("changing the visibility")),
            VisibilityAnswer::Diverged(divergence) => Err(self.diverged(&key, &divergence)),
        }
    }

    fn diverged(
        &self,
        key: &RecordKey,
        divergence: &trireme_replication::record::Divergence,
    ) -> EngineError {
        error!(queue = %key.queue, message = %key.message, %divergence, "replicas disagree on a field written once");
        EngineError::Unavailable {
            reason: format!(
                "replicas disagree about message {}: {divergence}",
                key.message
            ),
        }
    }

    /// The queue `name` as it is now, or `None` if it does not exist. Counts are this node's
    /// local view (spec/replication.md §11: approximate, as SQS's are).
    ///
    /// # Errors
    /// `Unavailable` when the queue's record cannot be read or this node's clock does not let it
    /// coordinate.
    pub async fn queue(&self, name: &QueueName) -> Result<Option<QueueView>, EngineError> {
        self.serving()?;
        self.coordinating().await?;
        let looked_up = self.lookup_state(name).await;
        let Some((known, state)) = self.explained(looked_up)? else {
            return Ok(None);
        };
        let now = self.clock.now();
        let counts = self.cluster.store().view(|view| {
            // What this node's copy of the watermark hides is gone (spec §11).
            let (ready, in_flight, delayed) =
                view.counts(name, known.incarnation, state.purge_watermark, now);
            MessageCounts {
                ready,
                in_flight,
                delayed,
            }
        });
        Ok(Some(QueueView {
            name: name.clone(),
            attributes: known.attributes,
            incarnation: known.incarnation,
            created_at: state.created_at,
            modified_at: state.modified_at,
            tags: state.tags,
            counts,
            last_purge_at: state.purge_watermark,
        }))
    }

    /// Up to `limit` live queue names starting with `prefix`, in name order, after `after`.
    ///
    /// # Errors
    /// `Unavailable` until this node has joined, or when its clock does not let it
    /// coordinate.
    pub async fn list_queues(
        &self,
        prefix: String,
        after: Option<QueueName>,
        limit: usize,
    ) -> Result<Vec<QueueName>, EngineError> {
        self.serving()?;
        self.coordinating().await?;
        Ok(self
            .cluster
            .queue_names()
            .into_iter()
            .filter(|name| name.as_str().starts_with(&prefix))
            .filter(|name| after.as_ref().is_none_or(|after| name > after))
            .take(limit)
            .collect())
    }

    /// The queues whose redrive policy names `dlq`, in name order.
    ///
    /// # Errors
    /// `Unavailable` when this node's clock does not let it coordinate.
    pub async fn dead_letter_sources(
        &self,
        dlq: &QueueName,
    ) -> Result<Vec<QueueName>, EngineError> {
        self.serving()?;
        self.coordinating().await?;
        let mut sources = Vec::new();
        for name in self.cluster.queue_names() {
            match self.lookup(&name).await {
                Ok(Some(known))
                    if known
                        .attributes
                        .redrive
                        .as_ref()
                        .is_some_and(|p| &p.dead_letter_queue == dlq) =>
                {
                    sources.push(name);
                }
                Ok(_) => {}
                Err(error) => {
                    warn!(queue = %name, %error, "listing dead-letter sources skipped a queue");
                }
            }
        }
        Ok(sources)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_core::RedrivePolicy;
    use trireme_replication::name::Proposal;

    #[test]
    fn attributes_round_trip_through_registers() {
        let mut attributes = QueueAttributes {
            visibility_timeout_s: 7,
            delay_s: 3,
            ..QueueAttributes::default()
        };
        attributes.redrive = Some(RedrivePolicy {
            dead_letter_queue: QueueName::try_from("dlq").unwrap(),
            max_receive_count: 4,
        });
        attributes.kept.policy = Some("{}".to_owned());
        let registers = attribute_registers(&attributes);
        assert_eq!(attributes_from_registers(&registers), Ok(attributes));
    }

    #[test]
    fn a_missing_register_is_the_default_and_a_bad_one_is_refused() {
        let mut registers = attribute_registers(&QueueAttributes::default());
        registers.remove("visibility_timeout_s");
        assert_eq!(
            attributes_from_registers(&registers),
            Ok(QueueAttributes::default())
        );
        registers.insert("delay_s".to_owned(), "\"soon\"".to_owned());
        assert!(attributes_from_registers(&registers).is_err());
    }

    #[test]
    fn one_changed_attribute_is_one_changed_register() {
        let before = attribute_registers(&QueueAttributes::default());
        let after = attribute_registers(&QueueAttributes {
            delay_s: 5,
            ..QueueAttributes::default()
        });
        let changed: Vec<&String> = after
            .iter()
            .filter(|(field, value)| before.get(*field) != Some(value))
            .map(|(field, _)| field)
            .collect();
        assert_eq!(changed, ["delay_s"]);
    }

    /// A record whose live proposal was created with `created` and changed by `changes`.
    fn live_record(
        created: BTreeMap<String, String>,
        changes: BTreeMap<String, Register>,
    ) -> NameRecord {
        let proposal = Proposal {
            attributes: created,
            ..Proposal::default()
        };
        NameRecord {
            votes: [
                Some(Box::new(proposal.clone())),
                Some(Box::new(proposal)),
                None,
            ],
            attributes: changes,
            ..NameRecord::default()
        }
    }

    fn register(hlc_ms: u64, value: Option<&str>) -> Register {
        Register {
            hlc_ms,
            node: NodeId(1),
            value: value.map(str::to_owned),
        }
    }

    #[test]
    fn decoded_attributes_follow_every_change_of_a_register_within_the_bound() {
        let decoded = DecodedAttributes::default();
        let queue = QueueName::try_from("jobs".to_owned()).expect("a valid name");
        let created = attribute_registers(&QueueAttributes::default());
        let plain = live_record(created.clone(), BTreeMap::new());
        assert_eq!(
            decoded.of_record(&queue, &plain),
            Ok(QueueAttributes::default())
        );
        assert_eq!(
            decoded.of_record(&queue, &plain),
            Ok(QueueAttributes::default())
        );
        let seven = QueueAttributes {
            visibility_timeout_s: 7,
            ..QueueAttributes::default()
        };
        let mut changes =
            BTreeMap::from([("visibility_timeout_s".to_owned(), register(5, Some("7")))]);
        assert_eq!(
            decoded.of_record(&queue, &live_record(created.clone(), changes.clone())),
            Ok(seven.clone()),
            "a change on top of the create"
        );
        let created_seven = attribute_registers(&seven);
        assert_eq!(
            decoded.of_record(&queue, &live_record(created_seven, BTreeMap::new())),
            Ok(seven),
            "a create with other attributes"
        );
        changes.insert("visibility_timeout_s".to_owned(), register(6, None));
        assert_eq!(
            decoded.of_record(&queue, &live_record(created.clone(), changes.clone())),
            Ok(QueueAttributes::default()),
            "a change back to the default"
        );
        changes.insert("delay_s".to_owned(), register(7, Some("\"soon\"")));
        let bad = live_record(created.clone(), changes);
        assert!(decoded.of_record(&queue, &bad).is_err());
        assert!(
            decoded.of_record(&queue, &bad).is_err(),
            "a bad register is never kept"
        );
        for n in 0..=crate::limits::decoded_attributes_queues_max {
            let other = QueueName::try_from(format!("q{n}")).expect("a valid name");
            decoded.of_record(&other, &plain).expect("decodes");
            let kept = decoded.by_queue.lock().expect("not poisoned").len();
            assert!(kept <= crate::limits::decoded_attributes_queues_max);
        }
    }
}
