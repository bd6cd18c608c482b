//! The internal service `trireme.replica.v1` as this node serves it to its peers: the replica
//! side of every operation. It refuses anyone who is not a member (and says so in the log), and
//! every request older than the horizon by its sender's clock
//! (spec/replication.md#tombstones-and-their-collection, *Horizon rule*). Anti-entropy's reads
//! (`Digests`, `Records`, `NameDigest`, `NameRecords`, `TaskRecords`, `DedupDigest`,
//! `DedupRecords`) answer only with records
//! both the caller and this node replicate. A request about a queue name's record, or about a
//! move task's record (placed on its source name's replicas, spec/replication.md §8), is
//! answered only by the name's replicas (others refuse it), and one about a deduplication record
//! only by that record's replicas (spec/replication.md §4); a push of a settled name record goes
//! to the name view of any member. `Clock` answers a member's probe with this node's clock
//! (spec/replication.md#clock-monitoring), touching no store. `Exchange`, `WakeUp` and
//! `Candidates` each run in a span with the trace ids their caller's metadata carries
//! (`crate::trace`).

use std::collections::BTreeSet;
use std::sync::Arc;

use tonic::transport::CertificateDer;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span, debug, debug_span, warn};
use trireme_core::{Incarnation, Millis, QueueName};
use trireme_proto::replica::v1 as pb;
use trireme_proto::replica::v1::replica_server::ReplicaServer;
use trireme_replication::NodeId;
use trireme_replication::anti_entropy::{shared, shares_dedup, shares_name};
use trireme_replication::coordinator::{self, Reply};
use trireme_replication::dedup::{DedupKey, DedupReply, DedupRequest};
use trireme_replication::name::{NameReply, NameRequest};
use trireme_replication::placement::Ring;
use trireme_replication::replica::within_horizon;
use trireme_replication::task::{TaskKey, TaskReply, TaskRequest};

use super::join::{Membership, Refusal};
use super::long_poll::LongPolls;
use super::peers::{CURRENT_DISK_KEY, Identity, REFUSAL_KEY, REFUSAL_RETIRED};
use super::store::{
    BatchAnswers, DedupEntry, Entry, NameEntry, ReplicaStore, StoreError, StoreFault, TaskEntry,
};
use super::tls::{certificate_names, member_name};
use super::wire;
use crate::limits;
use crate::trace;
use tonic::metadata::MetadataValue;

/// The replica side of this node.
#[derive(Clone)]
pub struct ReplicaService {
    pub(super) store: ReplicaStore,
    pub(super) members: BTreeSet<NodeId>,
    pub(super) me: Identity,
    pub(super) horizon_ms: u64,
    /// `OP_TIMEOUT + SKEW_MAX` (spec/replication.md §4): a deduplication put older than this by
    /// this node's clock is refused.
    pub(super) dedup_late_ms: u64,
    /// Placement: anti-entropy answers only with the records both ends of a pair replicate.
    pub(super) ring: Ring,
    /// The peers' disks it accepts requests from, and whether this node has joined.
    pub(super) membership: Arc<Membership>,
    /// This node's long polls, which a peer's wake-up wakes (spec/replication.md §9).
    pub(super) long_polls: Arc<LongPolls>,
    /// Whether a request is accepted only over a connection whose TLS certificate names its
    /// sender ([`ReplicaService::requiring_certified_peers`]); off for plaintext peers.
    pub(super) certified_peers: bool,
}

/// Who is at the other end of a request's connection.
struct Caller {
    remote: Option<std::net::SocketAddr>,
    /// The certificate chain the TLS handshake verified against the cluster CA; `None` in
    /// plaintext.
    certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
}

impl Caller {
    fn of<T>(request: &Request<T>) -> Caller {
        Caller {
            remote: request.remote_addr(),
            certificates: request.peer_certs(),
        }
    }
}

/// Records one anti-entropy page holds at most, whatever the caller asks.
pub const RECORDS_PER_PAGE_MAX: usize = 1_024;
/// Stored bytes one anti-entropy page holds about at most (one record more at worst, itself at
/// most about a 1 MiB body): well under the peers' message limit (`limits::peer_request_bytes_max`).
pub const PAGE_BYTES_MAX: usize = 2 * 1024 * 1024;

/// The replica RPCs that serve a client's request, each in a span naming this node and the
/// trace ids of the requests the call serves (`crate::trace`), so that one request is followed
/// from its edge into every replica's log.
impl ReplicaService {
    fn span(&self, rpc: &'static str, metadata: &tonic::metadata::MetadataMap) -> Span {
        let trace_ids = trace::ids_received(metadata);
        debug_span!("replica", node = self.me.node.0, rpc, trace_ids = %trace_ids)
    }

    async fn serve_exchange(
        &self,
        request: Request<pb::Batch>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let caller = Caller::of(&request);
        let batch = request.into_inner();
        let sender = self.member(&caller, batch.sender.as_ref())?;
        let entries = wire::entries(&batch.entries)
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        let names = wire::name_entries(&batch.names)
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        let tasks = wire::task_entries(&batch.tasks)
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        let dedups = wire::dedup_entries(&batch.dedups)
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        debug!(
            from = sender.node.0,
            entries = entries.len(),
            names = names.len(),
            tasks = tasks.len(),
            dedups = dedups.len(),
            "replica batch"
        );
        if self.store.overloaded() {
            // spec/replication.md#durability, *A replica that is overloaded*: answered at once,
            // nothing taken, so the coordinator hears it as a slow replica's silence instead of
            // waiting out its call (and taking this node for down).
            debug!(
                from = sender.node.0,
                "replica batch shed: the store is overloaded"
            );
            return Ok(Response::new(pb::BatchReply {
                request_id: batch.request_id,
                sender: Some(self.me.now().into()),
                overloaded: true,
                ..pb::BatchReply::default()
            }));
        }
        let now = self.me.clock.now();
        let mut fault = None;
        let (replies, name_replies, task_replies, dedup_replies) =
            if within_horizon(sender.clock, now, self.horizon_ms) {
                let entries = entries
                    .into_iter()
                    .map(|(key, request)| Entry { key, request })
                    .collect();
                // A failed store acks nothing and says why (spec/replication.md#durability).
                self.apply(entries, names, tasks, dedups, now)
                    .await
                    .unwrap_or_else(|failed| {
                        fault = Some(wire::store_fault(&failed));
                        Default::default()
                    })
            } else {
                warn!(
                    node = sender.node.0,
                    sent_ms = sender.clock.0,
                    now_ms = now.0,
                    "refused a batch older than the horizon"
                );
                let replies = entries
                    .iter()
                    .map(|(_, request)| match request {
                        coordinator::Request::Read | coordinator::Request::Write { .. } => {
                            Reply::Refused
                        }
                    })
                    .collect();
                (
                    replies,
                    vec![NameReply::Refused; names.len()],
                    vec![TaskReply::Refused; tasks.len()],
                    vec![DedupReply::Refused; dedups.len()],
                )
            };
        Ok(Response::new(pb::BatchReply {
            request_id: batch.request_id,
            sender: Some(self.me.now().into()),
            replies: replies.iter().map(wire::reply).collect(),
            name_replies: name_replies.iter().map(wire::name_reply).collect(),
            task_replies: task_replies.iter().map(wire::task_reply).collect(),
            dedup_replies: dedup_replies.iter().map(wire::dedup_reply).collect(),
            fault,
            overloaded: false,
        }))
    }

    async fn serve_wake_up(
        &self,
        request: Request<pb::WakeUpRequest>,
    ) -> Result<Response<pb::WakeUpReply>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        self.member(&caller, request.sender.as_ref())?;
        let (queue, incarnation) = queue_incarnation(
            request.queue,
            request.incarnation_hlc_ms,
            request.incarnation_node,
            request.incarnation_nonce,
        )?;
        if request.messages.len() > CANDIDATES_PER_REPLY_MAX {
            return Err(Status::invalid_argument(format!(
                "a wake-up names at most {CANDIDATES_PER_REPLY_MAX} messages"
            )));
        }
        let messages = wire::candidates(&request.messages)
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        debug!(queue = %queue, messages = messages.len(), "woken");
        self.long_polls.woken(&queue, incarnation, &messages);
        Ok(Response::new(pb::WakeUpReply {
            sender: Some(self.me.now().into()),
        }))
    }

    async fn serve_candidates(
        &self,
        request: Request<pb::CandidatesRequest>,
    ) -> Result<Response<pb::CandidatesReply>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        self.member(&caller, request.sender.as_ref())?;
        let (queue, incarnation) = queue_incarnation(
            request.queue,
            request.incarnation_hlc_ms,
            request.incarnation_node,
            request.incarnation_nonce,
        )?;
        let limit = usize::try_from(request.limit)
            .unwrap_or(usize::MAX)
            .clamp(1, CANDIDATES_PER_REPLY_MAX);
        let now = self.me.clock.now();
        // What this node's copy of the queue's watermark hides is neither offered nor counted.
        let purged_through = self
            .store
            .names(|names| names.watermark(&queue, incarnation));
        let (messages, ready) = self.store.view_mut(|view| {
            (
                view.candidates(&queue, incarnation, purged_through, now, limit),
                view.counts(&queue, incarnation, purged_through, now).0,
            )
        });
        Ok(Response::new(pb::CandidatesReply {
            sender: Some(self.me.now().into()),
            messages: messages.into_iter().map(wire::candidate).collect(),
            ready,
        }))
    }
}

#[tonic::async_trait]
impl pb::replica_server::Replica for ReplicaService {
    async fn exchange(
        &self,
        request: Request<pb::Batch>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let span = self.span("Exchange", request.metadata());
        self.serve_exchange(request).instrument(span).await
    }

    async fn join(
        &self,
        request: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::JoinReply>, Status> {
        let caller = Caller::of(&request);
        let sender = self.node_of(&caller, request.get_ref().sender.as_ref())?;
        let known = self
            .membership
            .join(&sender, self.me.clock.now())
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        match known {
            Some(known) if known.disk_id != sender.disk_id => warn!(
                node = sender.node.0,
                old_disk = known.disk_id,
                new_disk = sender.disk_id,
                "a peer joins with a new disk: the old one is retired"
            ),
            _ => {}
        }
        Ok(Response::new(pb::JoinReply {
            sender: Some(self.me.now().into()),
            known,
        }))
    }

    async fn wake_up(
        &self,
        request: Request<pb::WakeUpRequest>,
    ) -> Result<Response<pb::WakeUpReply>, Status> {
        let span = self.span("WakeUp", request.metadata());
        self.serve_wake_up(request).instrument(span).await
    }

    async fn candidates(
        &self,
        request: Request<pb::CandidatesRequest>,
    ) -> Result<Response<pb::CandidatesReply>, Status> {
        let span = self.span("Candidates", request.metadata());
        self.serve_candidates(request).instrument(span).await
    }

    async fn dedup_digest(
        &self,
        request: Request<pb::DedupDigestRequest>,
    ) -> Result<Response<pb::DedupDigestReply>, Status> {
        let caller = Caller::of(&request);
        let sender = self.member(&caller, request.get_ref().sender.as_ref())?;
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let now = self.me.clock.now();
        let digest = self
            .store
            .scan_off(move || {
                store.dedup_digest(|key, record| {
                    record.live_at(now) && shares_dedup(&ring, me, sender.node, key)
                })
            })
            .await
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        Ok(Response::new(wire::dedup_digest(self.me.now(), digest)))
    }

    async fn dedup_records(
        &self,
        request: Request<pb::DedupRecordsRequest>,
    ) -> Result<Response<pb::DedupRecordsReply>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let sender = self.member(&caller, request.sender.as_ref())?;
        let limit = usize::try_from(request.limit)
            .unwrap_or(usize::MAX)
            .clamp(1, DEDUPS_PER_PAGE_MAX);
        let after = (!request.after_key.is_empty()).then_some(request.after_key);
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let now = self.me.clock.now();
        let (page, more) = self
            .store
            .scan_off(move || {
                // Only live records: anti-entropy never sends an expired one (spec §4, WindowEnd).
                store.dedup_records(after.as_deref(), limit, |key, record| {
                    record.live_at(now) && shares_dedup(&ring, me, sender.node, key)
                })
            })
            .await
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        Ok(Response::new(pb::DedupRecordsReply {
            sender: Some(self.me.now().into()),
            records: page
                .iter()
                .map(|(key, record)| wire::stored_dedup(key, record))
                .collect(),
            more,
        }))
    }

    async fn task_records(
        &self,
        request: Request<pb::TaskRecordsRequest>,
    ) -> Result<Response<pb::TaskRecordsReply>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let sender = self.member(&caller, request.sender.as_ref())?;
        let after = (!request.after_key.is_empty()).then_some(request.after_key);
        let limit = usize::try_from(request.limit)
            .unwrap_or(usize::MAX)
            .clamp(1, TASKS_PER_PAGE_MAX);
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let (page, more) = self
            .store
            .scan_off(move || {
                store.task_records(after.as_deref(), limit, |key, _| {
                    shares_name(&ring, me, sender.node, &key.queue)
                })
            })
            .await
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        Ok(Response::new(pb::TaskRecordsReply {
            sender: Some(self.me.now().into()),
            records: page
                .iter()
                .map(|(key, record)| wire::stored_task(key, record))
                .collect(),
            more,
        }))
    }

    async fn name_digest(
        &self,
        request: Request<pb::NameDigestRequest>,
    ) -> Result<Response<pb::NameDigestReply>, Status> {
        let caller = Caller::of(&request);
        let sender = self.member(&caller, request.get_ref().sender.as_ref())?;
        let catalog = request.get_ref().catalog;
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let digest = self
            .store
            .scan_off(move || {
                store.name_digest(|name| exchanged(&ring, me, sender.node, name, catalog))
            })
            .await
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        Ok(Response::new(wire::name_digest(self.me.now(), digest)))
    }

    async fn name_records(
        &self,
        request: Request<pb::NameRecordsRequest>,
    ) -> Result<Response<pb::NameRecordsReply>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let sender = self.member(&caller, request.sender.as_ref())?;
        let after =
            if request.after_name.is_empty() {
                None
            } else {
                Some(QueueName::try_from(request.after_name).map_err(|_| {
                    Status::invalid_argument("after_name is not a valid queue name")
                })?)
            };
        let limit = usize::try_from(request.limit)
            .unwrap_or(usize::MAX)
            .clamp(1, NAMES_PER_PAGE_MAX);
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let catalog = request.catalog;
        let (page, more) = self
            .store
            .scan_off(move || {
                store.name_records(after.as_ref(), limit, |name| {
                    exchanged(&ring, me, sender.node, name, catalog)
                })
            })
            .await
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        Ok(Response::new(pb::NameRecordsReply {
            sender: Some(self.me.now().into()),
            records: page
                .iter()
                .map(|(name, record)| wire::stored_name(name, record))
                .collect(),
            more,
        }))
    }

    async fn clock(
        &self,
        request: Request<pb::ClockRequest>,
    ) -> Result<Response<pb::ClockReply>, Status> {
        let caller = Caller::of(&request);
        self.member(&caller, request.get_ref().sender.as_ref())?;
        Ok(Response::new(pb::ClockReply {
            sender: Some(self.me.now().into()),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }))
    }

    async fn digests(
        &self,
        request: Request<pb::DigestsRequest>,
    ) -> Result<Response<pb::DigestsReply>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let sender = self.member(&caller, request.sender.as_ref())?;
        let partition = |value: u32| {
            u16::try_from(value)
                .map_err(|_| Status::invalid_argument(format!("partition {value} is out of range")))
        };
        let (first, last) = (
            partition(request.first_partition)?,
            partition(request.last_partition)?,
        );
        if first > last {
            return Err(Status::invalid_argument(
                "the partition range runs backwards",
            ));
        }
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let digests = self
            .store
            .scan_off(move || store.digests(first, last, |key| shared(&ring, me, sender.node, key)))
            .await
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        Ok(Response::new(pb::DigestsReply {
            sender: Some(self.me.now().into()),
            digests: digests
                .into_iter()
                .map(|(partition, digest)| wire::digest(partition, digest))
                .collect(),
        }))
    }

    async fn records(
        &self,
        request: Request<pb::RecordsRequest>,
    ) -> Result<Response<pb::RecordsReply>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let sender = self.member(&caller, request.sender.as_ref())?;
        let partition = u16::try_from(request.partition).map_err(|_| {
            Status::invalid_argument(format!("partition {} is out of range", request.partition))
        })?;
        let limit = usize::try_from(request.limit)
            .unwrap_or(usize::MAX)
            .clamp(1, RECORDS_PER_PAGE_MAX);
        let after = (!request.after_key.is_empty()).then_some(request.after_key);
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let (page, more) = self
            .store
            .scan_off(move || {
                store.partition_page(
                    partition,
                    after.as_deref(),
                    None,
                    limit,
                    PAGE_BYTES_MAX,
                    |key| shared(&ring, me, sender.node, key),
                )
            })
            .await
            .map_err(|error| Status::unavailable(format!("replica store: {error}")))?;
        Ok(Response::new(pb::RecordsReply {
            sender: Some(self.me.now().into()),
            records: page
                .iter()
                .map(|(key, record)| wire::stored_record(key, record))
                .collect(),
            more,
        }))
    }
}

/// Whether this node (`me`) answers `caller` with its record of `name`: a record both replicate,
/// or for the catalog, one this node replicates and the caller does not.
fn exchanged(ring: &Ring, me: NodeId, caller: NodeId, name: &QueueName, catalog: bool) -> bool {
    if catalog {
        let replicas = ring.name_replicas(name);
        replicas.contains(&me) && !replicas.contains(&caller)
    } else {
        shares_name(ring, me, caller, name)
    }
}

/// Name records one anti-entropy page holds at most: a name record with its attributes, policy
/// (20 KiB at most) and tags (50 of up to 384 characters) is about 100 KiB at the very most, so
/// a page stays under the peers' message limit (`limits::peer_request_bytes_max`).
pub const NAMES_PER_PAGE_MAX: usize = 256;

/// A request's queue and incarnation, from its fields.
fn queue_incarnation(
    queue: String,
    hlc_ms: u64,
    node: u32,
    nonce: u64,
) -> Result<(QueueName, Incarnation), Status> {
    let queue = QueueName::try_from(queue)
        .map_err(|_| Status::invalid_argument("queue is not a valid queue name"))?;
    let node = u16::try_from(node)
        .map_err(|_| Status::invalid_argument("incarnation_node is out of range"))?;
    Ok((
        queue,
        Incarnation {
            hlc_ms,
            node,
            nonce,
        },
    ))
}

/// Message ids one candidates reply holds at most (16 bytes each).
pub const CANDIDATES_PER_REPLY_MAX: usize = 1_024;

/// Task records one anti-entropy page holds at most: a task record with its history is a few
/// KiB at most, so a page stays well under the peers' message limit
/// (`limits::peer_request_bytes_max`).
pub const TASKS_PER_PAGE_MAX: usize = 256;

/// Deduplication records one anti-entropy page holds at most: a record is its key (at most
/// about 230 bytes) and 32 bytes of value, so a page is well under a MiB.
pub const DEDUPS_PER_PAGE_MAX: usize = 1_024;

impl ReplicaService {
    /// Applies a batch within the horizon, arrived at `now` by this node's clock: its message
    /// entries, and the name, task and deduplication entries this node is a replica of, in one
    /// group commit; pushes into the name view; a name, task or deduplication request for a
    /// record this node does not replicate is refused.
    async fn apply(
        &self,
        entries: Vec<Entry>,
        names: Vec<(QueueName, NameRequest)>,
        tasks: Vec<(TaskKey, TaskRequest)>,
        dedups: Vec<(DedupKey, DedupRequest)>,
        now: Millis,
    ) -> Result<BatchAnswers, StoreFault> {
        let unavailable = |error: Arc<StoreError>| error.fault();
        let mut name_replies = vec![NameReply::Refused; names.len()];
        let (mut stored, mut stored_at, mut pushed) = (Vec::new(), Vec::new(), Vec::new());
        for (index, (name, request)) in names.into_iter().enumerate() {
            if let NameRequest::View(record) = request {
                pushed.push((name, record));
                name_replies[index] = NameReply::Ack;
                continue;
            }
            let replicas = self.ring.name_replicas(&name);
            if let Some(slot) = replicas.iter().position(|node| *node == self.me.node) {
                stored.push(NameEntry {
                    name,
                    slot,
                    request,
                });
                stored_at.push(index);
            }
        }
        if !pushed.is_empty() {
            self.store
                .learn(pushed, self.me.clock.now())
                .await
                .map_err(unavailable)?;
        }
        let mut task_replies = vec![TaskReply::Refused; tasks.len()];
        let (mut task_entries, mut task_at) = (Vec::new(), Vec::new());
        for (index, (key, request)) in tasks.into_iter().enumerate() {
            if self.ring.name_replicas(&key.queue).contains(&self.me.node) {
                task_entries.push(TaskEntry { key, request });
                task_at.push(index);
            }
        }
        let mut dedup_replies = vec![DedupReply::Refused; dedups.len()];
        let (mut dedup_entries, mut dedup_at) = (Vec::new(), Vec::new());
        for (index, (key, request)) in dedups.into_iter().enumerate() {
            if key.replicas(&self.ring).contains(&self.me.node) {
                dedup_entries.push(DedupEntry {
                    key,
                    request,
                    now,
                    late_ms: self.dedup_late_ms,
                });
                dedup_at.push(index);
            }
        }
        let (replies, answers, task_answers, dedup_answers) = self
            .store
            .apply_batch(entries, stored, task_entries, dedup_entries)
            .await
            .map_err(unavailable)?;
        for (index, answer) in stored_at.into_iter().zip(answers) {
            name_replies[index] = answer;
        }
        for (index, answer) in task_at.into_iter().zip(task_answers) {
            task_replies[index] = answer;
        }
        for (index, answer) in dedup_at.into_iter().zip(dedup_answers) {
            dedup_replies[index] = answer;
        }
        Ok((replies, name_replies, task_replies, dedup_replies))
    }

    /// The sender of a peer's call, if it is another member; refused (and logged) otherwise.
    /// The sender of a replica request, if it is a member on the disk this node takes for its
    /// own, and this node has joined (spec/replication.md, *Stragglers and replacement*).
    fn member(&self, caller: &Caller, sender: Option<&pb::Sender>) -> Result<wire::Sender, Status> {
        let remote = caller.remote;
        let sender = self.node_of(caller, sender)?;
        match self.membership.accept(&sender, self.me.clock.now()) {
            Ok(()) => Ok(sender),
            Err(Refusal::Joining(reason)) => Err(Status::unavailable(reason)),
            Err(Refusal::Retired { current }) => {
                warn!(peer = ?remote, node = sender.node.0, disk = sender.disk_id, current, "refused a replica request from a replaced disk");
                let mut status = Status::permission_denied(format!(
                    "disk {} of node {} was replaced by disk {current}: a replaced disk never rejoins",
                    sender.disk_id, sender.node.0
                ));
                // Machine-readable, so the refused node knows it is retired.
                let metadata = status.metadata_mut();
                metadata.insert(REFUSAL_KEY, MetadataValue::from_static(REFUSAL_RETIRED));
                if let Ok(value) = MetadataValue::try_from(current.to_string()) {
                    metadata.insert(CURRENT_DISK_KEY, value);
                }
                Err(status)
            }
            Err(Refusal::Store(error)) => {
                Err(Status::unavailable(format!("replica store: {error}")))
            }
        }
    }

    /// The sender, if it is a member of this cluster (and not this node) and, under peer TLS,
    /// the one its connection's certificate names.
    fn node_of(
        &self,
        caller: &Caller,
        sender: Option<&pb::Sender>,
    ) -> Result<wire::Sender, Status> {
        let remote = caller.remote;
        let sender =
            wire::sender(sender).map_err(|error| Status::invalid_argument(error.to_string()))?;
        if sender.node == self.me.node || !self.members.contains(&sender.node) {
            warn!(peer = ?remote, node = sender.node.0, "refused a replica request from a node that is not a member");
            return Err(Status::permission_denied(format!(
                "node {} is not a member of this cluster",
                sender.node.0
            )));
        }
        if self.certified_peers
            && !caller
                .certificates
                .as_deref()
                .is_some_and(|certificates| certificate_names(certificates, sender.node))
        {
            let name = member_name(sender.node);
            warn!(peer = ?remote, node = sender.node.0, certificate_needed = %name, "refused a replica request: the connection's TLS certificate is not the node's it claims to be");
            return Err(Status::permission_denied(format!(
                "this connection's certificate does not name {name}: a member speaks only for \
                 itself (node {})",
                sender.node.0
            )));
        }
        Ok(sender)
    }

    /// This service, accepting a request only if its connection's certificate (peer TLS) names
    /// the member the request claims to come from (spec/replication.md, *Membership*).
    #[must_use]
    pub fn requiring_certified_peers(mut self) -> ReplicaService {
        self.certified_peers = true;
        self
    }

    /// This service as the peer port serves it, with its message limits set at both ends
    /// (`limits::peer_request_bytes_max`, the peers' clients' own: `peers::replica_client`)
    /// instead of tonic's defaults. Every server of the replica service is made here.
    #[must_use]
    pub fn into_server(self) -> ReplicaServer<ReplicaService> {
        ReplicaServer::new(self)
            .max_decoding_message_size(limits::peer_request_bytes_max)
            .max_encoding_message_size(limits::peer_request_bytes_max)
    }
}
