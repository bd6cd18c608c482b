//! Channels to the other members (the internal service's clients).
//!
//! One link per peer, connected lazily, with `TCP_NODELAY`, HTTP/2 keepalive, a connect timeout
//! and a per-call timeout. Requests to one peer (about messages' records, queue names' own
//! records, move tasks' records and deduplication records alike) are batched: whatever is waiting when a call
//! can go is sent as one `Exchange`, and several calls may be in flight at once, so a slow call
//! does not hold the next batch. A dead peer costs its requests a failed answer at the call's
//! timeout (or at once when the connection is refused), never a wait of the operation beyond
//! its own deadline: coordinators decide on the first two replicas that answer. Each call's
//! metadata lists the trace ids of the requests its batch serves (`crate::trace`).
//!
//! A batch is cut by count and by bytes (spec/replication.md §13, *Batching*): a write counts
//! its encoded size, a request answered with a record (a read) the largest record, so that the
//! call and its reply both fit the message limit every client here and the peer's server set
//! explicitly (`limits::peer_request_bytes_max`; with tonic's default of 4 MiB, every call
//! whose reply passed it failed whole, so a receive of ten 1 MiB messages delivered none).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};
use tracing::debug;
use trireme_core::QueueName;
use trireme_proto::replica::v1 as pb;
use trireme_proto::replica::v1::replica_client::ReplicaClient;
use trireme_replication::coordinator::{Reply, Request};
use trireme_replication::dedup::{DedupKey, DedupReply, DedupRequest};
use trireme_replication::name::{NameReply, NameRequest};
use trireme_replication::task::{TaskKey, TaskReply, TaskRequest};
use trireme_replication::{NodeId, RecordKey};

use super::store::StoreFault;
use super::wire::{self, Sender};
use crate::clock::Clock;
use crate::limits;
use crate::trace::{self, TraceId};

/// Requests waiting for one peer; a full queue fails the request at once (the operation then
/// counts that replica as silent), it never blocks the coordinator.
const PEER_QUEUE_MAX: usize = 8_192;
/// Calls in flight to one peer at once.
const CALLS_IN_FLIGHT_MAX: usize = 16;

/// Timeouts of the links.
#[derive(Clone, Copy, Debug)]
pub struct LinkSettings {
    /// Connecting to a peer.
    pub connect_timeout: Duration,
    /// One `Exchange` call, end to end.
    pub call_timeout: Duration,
    /// HTTP/2 keepalive ping interval.
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
}

/// Why a peer gave no answer to a request.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer's queue is full.
    #[error("too many requests waiting for {0}")]
    Busy(NodeId),
    /// The call failed or timed out.
    #[error("{peer} did not answer: {reason}")]
    Call { peer: NodeId, reason: String },
    /// The peer's store failed the batch: nothing of it is durable there, nothing was acked
    /// (spec/replication.md#durability).
    #[error("{peer}'s replica store failed: {fault}")]
    Store { peer: NodeId, fault: StoreFault },
    /// The peer's store was overloaded and took nothing of the batch (spec/replication.md
    /// #durability, *A replica that is overloaded*): silence, as a slow peer's, and not a fault.
    #[error("{peer}'s replica store is overloaded and took nothing")]
    Overloaded { peer: NodeId },
}

/// One request waiting for a call, with the trace id of the request that caused it
/// (`crate::trace`), which the call's metadata carries.
struct Traced {
    pending: Pending,
    trace: Option<TraceId>,
}

enum Pending {
    Record {
        key: RecordKey,
        request: Request,
        answer: oneshot::Sender<Result<Reply, PeerError>>,
    },
    Name {
        name: QueueName,
        request: NameRequest,
        answer: oneshot::Sender<Result<NameReply, PeerError>>,
    },
    Task {
        key: TaskKey,
        request: TaskRequest,
        answer: oneshot::Sender<Result<TaskReply, PeerError>>,
    },
    Dedup {
        key: DedupKey,
        request: DedupRequest,
        answer: oneshot::Sender<Result<DedupReply, PeerError>>,
    },
}

impl Pending {
    fn fail(self, error: PeerError) {
        // Whoever sent it may have stopped listening; the failure is silence to it anyway.
        match self {
            Pending::Record { answer, .. } => {
                let _ = answer.send(Err(error));
            }
            Pending::Name { answer, .. } => {
                let _ = answer.send(Err(error));
            }
            Pending::Task { answer, .. } => {
                let _ = answer.send(Err(error));
            }
            Pending::Dedup { answer, .. } => {
                let _ = answer.send(Err(error));
            }
        }
    }
}

/// The links to every peer.
#[derive(Clone)]
pub struct Peers {
    links: Arc<BTreeMap<NodeId, mpsc::Sender<Traced>>>,
    /// Clients for the calls that are not batched (anti-entropy's digests and pages); they
    /// share the links' connections.
    clients: Arc<BTreeMap<NodeId, ReplicaClient<Channel>>>,
    /// Per peer: its last call failed and none has succeeded since. A guess of this node's
    /// alone, used only to order receive candidates (spec/replication.md, the paragraph after
    /// receive step 7); no decision depends on it.
    down: Arc<BTreeMap<NodeId, Arc<AtomicBool>>>,
    /// Set once a peer refuses this node's disk as replaced.
    retired: Arc<tokio::sync::watch::Sender<Option<u64>>>,
}

/// This node as a sender.
#[derive(Clone)]
pub struct Identity {
    /// This member.
    pub node: NodeId,
    /// Its disk.
    pub disk_id: u64,
    /// Its clock.
    pub clock: Arc<dyn Clock>,
}

impl Identity {
    /// This node as the sender of a message sent now.
    pub(super) fn now(&self) -> Sender {
        Sender {
            node: self.node,
            disk_id: self.disk_id,
            clock: self.clock.now(),
        }
    }
}

impl Peers {
    /// Links to `peers` (member id to `host:port` of its peer service) over the system's TCP.
    ///
    /// # Errors
    /// An address that is not a valid URI authority.
    pub fn connect(
        identity: &Identity,
        peers: &BTreeMap<NodeId, String>,
        settings: LinkSettings,
    ) -> Result<Peers, tonic::transport::Error> {
        Peers::connect_with(identity, peers, settings, &|_, endpoint| {
            endpoint.connect_lazy()
        })
    }

    /// Links to `peers` as [`Peers::connect`] makes them, each channel made by `channel` from
    /// the peer's id and the endpoint with the links' settings (e.g. over a simulated network,
    /// or over TLS: `Endpoint::connect_with_connector_lazy`). `channel` must not connect
    /// eagerly.
    ///
    /// # Errors
    /// An address that is not a valid URI authority.
    pub fn connect_with(
        identity: &Identity,
        peers: &BTreeMap<NodeId, String>,
        settings: LinkSettings,
        channel: &dyn Fn(NodeId, &Endpoint) -> Channel,
    ) -> Result<Peers, tonic::transport::Error> {
        let request_ids = Arc::new(AtomicU64::new(1));
        let retired = Arc::new(tokio::sync::watch::Sender::new(None));
        let mut links = BTreeMap::new();
        let mut clients = BTreeMap::new();
        let mut down = BTreeMap::new();
        for (peer, address) in peers {
            let endpoint = Endpoint::from_shared(format!("http://{address}"))?
                .connect_timeout(settings.connect_timeout)
                .timeout(settings.call_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(settings.keepalive_interval)
                .keep_alive_timeout(settings.keepalive_timeout)
                .keep_alive_while_idle(true);
            let channel = channel(*peer, &endpoint);
            clients.insert(*peer, replica_client(channel.clone()));
            let (queue, waiting) = mpsc::channel(PEER_QUEUE_MAX);
            let peer_down = Arc::new(AtomicBool::new(false));
            tokio::spawn(run_link(
                Link {
                    peer: *peer,
                    client: replica_client(channel),
                    identity: identity.clone(),
                    request_ids: Arc::clone(&request_ids),
                    down: Arc::clone(&peer_down),
                    retired: Arc::clone(&retired),
                },
                waiting,
            ));
            links.insert(*peer, queue);
            down.insert(*peer, peer_down);
        }
        Ok(Peers {
            links: Arc::new(links),
            clients: Arc::new(clients),
            down: Arc::new(down),
            retired,
        })
    }

    /// The disk that replaced this node's, once a peer refused this one as replaced
    /// (spec/replication.md, *Stragglers and replacement*: a replaced disk never rejoins).
    #[must_use]
    pub fn retired(&self) -> tokio::sync::watch::Receiver<Option<u64>> {
        self.retired.subscribe()
    }

    /// Notes that `status`, a peer's answer to a call of this node's, refused this node's disk
    /// as replaced (for calls outside the links: probes, anti-entropy).
    pub(super) fn note_refusal(&self, status: &tonic::Status) {
        if let Some(current) = retired_by(status) {
            self.retired.send_replace(Some(current));
        }
    }

    /// Whether this node takes `peer` for down: its last call failed and none has succeeded
    /// since. A hint (candidate order), never a decision.
    #[must_use]
    pub fn down(&self, peer: NodeId) -> bool {
        self.down
            .get(&peer)
            .is_some_and(|down| down.load(Ordering::Relaxed))
    }

    /// A client of `peer`'s internal service for a call that is not batched (`None`: not a
    /// member). Its calls carry the link's connect and call timeouts.
    #[must_use]
    pub fn client(&self, peer: NodeId) -> Option<ReplicaClient<Channel>> {
        self.clients.get(&peer).cloned()
    }

    /// Sends one request to `peer`; the answer arrives on the returned channel.
    pub fn send(
        &self,
        peer: NodeId,
        key: RecordKey,
        request: Request,
    ) -> oneshot::Receiver<Result<Reply, PeerError>> {
        let (answer, answered) = oneshot::channel();
        self.enqueue(
            peer,
            Pending::Record {
                key,
                request,
                answer,
            },
        );
        answered
    }

    /// Sends one request about a queue name's record to `peer`; the answer arrives on the
    /// returned channel.
    pub fn send_name(
        &self,
        peer: NodeId,
        name: QueueName,
        request: NameRequest,
    ) -> oneshot::Receiver<Result<NameReply, PeerError>> {
        let (answer, answered) = oneshot::channel();
        self.enqueue(
            peer,
            Pending::Name {
                name,
                request,
                answer,
            },
        );
        answered
    }

    /// Sends one request about a move task's record to `peer`; the answer arrives on the
    /// returned channel.
    pub fn send_task(
        &self,
        peer: NodeId,
        key: TaskKey,
        request: TaskRequest,
    ) -> oneshot::Receiver<Result<TaskReply, PeerError>> {
        let (answer, answered) = oneshot::channel();
        self.enqueue(
            peer,
            Pending::Task {
                key,
                request,
                answer,
            },
        );
        answered
    }

    /// Sends one request about a deduplication record to `peer`; the answer arrives on the
    /// returned channel.
    pub fn send_dedup(
        &self,
        peer: NodeId,
        key: DedupKey,
        request: DedupRequest,
    ) -> oneshot::Receiver<Result<DedupReply, PeerError>> {
        let (answer, answered) = oneshot::channel();
        self.enqueue(
            peer,
            Pending::Dedup {
                key,
                request,
                answer,
            },
        );
        answered
    }

    fn enqueue(&self, peer: NodeId, pending: Pending) {
        let Some(link) = self.links.get(&peer) else {
            pending.fail(PeerError::Call {
                peer,
                reason: "not a member".to_owned(),
            });
            return;
        };
        let traced = Traced {
            pending,
            trace: trace::current(),
        };
        if let Err(error) = link.try_send(traced) {
            error.into_inner().pending.fail(PeerError::Busy(peer));
        }
    }
}

/// A client of a peer's internal service over `channel`, with its message limits set at both
/// ends (`limits::peer_request_bytes_max`, the peer's server's own:
/// `ReplicaService::into_server`) instead of tonic's defaults. Every client of the peers is
/// made here.
#[must_use]
pub fn replica_client(channel: Channel) -> ReplicaClient<Channel> {
    ReplicaClient::new(channel)
        .max_decoding_message_size(limits::peer_request_bytes_max)
        .max_encoding_message_size(limits::peer_request_bytes_max)
}

/// One request taken for a call, encoded as the call carries it.
struct Taken {
    pending: Pending,
    trace: Option<TraceId>,
    entry: WireEntry,
    /// What it counts toward its call's bytes: its encoded size, and the largest record
    /// (`limits::peer_read_bytes`) if the peer answers it with one.
    bytes: usize,
}

enum WireEntry {
    Record(pb::Entry),
    Name(pb::NameEntry),
    Task(pb::TaskEntry),
    Dedup(pb::DedupEntry),
}

impl Taken {
    fn new(traced: Traced) -> Taken {
        let Traced { pending, trace } = traced;
        let (entry, size_bytes, answered_with_record) = match &pending {
            Pending::Record { key, request, .. } => {
                let entry = wire::entry(key, request);
                let size = entry.key.len() + entry.request.len();
                (
                    WireEntry::Record(entry),
                    size,
                    matches!(request, Request::Read),
                )
            }
            Pending::Name { name, request, .. } => {
                let entry = wire::name_entry(name, request);
                let size = entry.name.len() + entry.request.len();
                let record = matches!(request, NameRequest::Read | NameRequest::Vote { .. });
                (WireEntry::Name(entry), size, record)
            }
            Pending::Task { key, request, .. } => {
                let entry = wire::task_entry(key, request);
                let size = entry.key.len() + entry.request.len();
                (
                    WireEntry::Task(entry),
                    size,
                    matches!(request, TaskRequest::Read),
                )
            }
            Pending::Dedup { key, request, .. } => {
                let entry = wire::dedup_entry(key, request);
                let size = entry.key.len() + entry.request.len();
                let record = matches!(request, DedupRequest::Read | DedupRequest::Put { .. });
                (WireEntry::Dedup(entry), size, record)
            }
        };
        let reply_bytes = if answered_with_record {
            limits::peer_read_bytes
        } else {
            0
        };
        Taken {
            pending,
            trace,
            entry,
            bytes: size_bytes + reply_bytes,
        }
    }
}

/// The next call's batch: `first`, then whatever is waiting, up to
/// `limits::peer_batch_requests_max` requests and `limits::peer_batch_bytes_max` bytes
/// (`first` goes whatever its size). The request that would have passed the bytes is returned
/// apart: it goes first in the next call.
fn next_batch(first: Taken, waiting: &mut mpsc::Receiver<Traced>) -> (Vec<Taken>, Option<Taken>) {
    let mut bytes = first.bytes;
    let mut batch = vec![first];
    while batch.len() < limits::peer_batch_requests_max {
        let Ok(traced) = waiting.try_recv() else {
            break;
        };
        let taken = Taken::new(traced);
        if bytes + taken.bytes > limits::peer_batch_bytes_max {
            return (batch, Some(taken));
        }
        bytes += taken.bytes;
        batch.push(taken);
    }
    (batch, None)
}

/// One peer's link as its task runs it.
struct Link {
    peer: NodeId,
    client: ReplicaClient<Channel>,
    identity: Identity,
    request_ids: Arc<AtomicU64>,
    /// Set when a call fails, cleared when one succeeds ([`Peers::down`]).
    down: Arc<AtomicBool>,
    /// Set when a peer refuses this node's disk as replaced ([`Peers::retired`]).
    retired: Arc<tokio::sync::watch::Sender<Option<u64>>>,
}

/// The metadata key of a refusal that says the caller's disk was replaced, and its value.
pub const REFUSAL_KEY: &str = "trireme-refusal";
/// [`REFUSAL_KEY`]'s value for a replaced disk.
pub const REFUSAL_RETIRED: &str = "retired";
/// The metadata key naming the disk that replaced the caller's.
pub const CURRENT_DISK_KEY: &str = "trireme-current-disk";

/// The disk that replaced this node's, if `status` is a peer's refusal of this node's disk as
/// a replaced one.
pub(super) fn retired_by(status: &tonic::Status) -> Option<u64> {
    let metadata = status.metadata();
    (status.code() == tonic::Code::PermissionDenied
        && metadata.get(REFUSAL_KEY).and_then(|v| v.to_str().ok()) == Some(REFUSAL_RETIRED))
    .then(|| {
        metadata
            .get(CURRENT_DISK_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    })
    .flatten()
}

async fn run_link(link: Link, mut waiting: mpsc::Receiver<Traced>) {
    let Link {
        peer,
        client,
        retired,
        identity,
        request_ids,
        down,
    } = link;
    let calls = Arc::new(Semaphore::new(CALLS_IN_FLIGHT_MAX));
    // A request taken from the queue that did not fit the last call's bytes: it goes first.
    let mut carried: Option<Taken> = None;
    loop {
        let first = match carried.take() {
            Some(taken) => taken,
            None => match waiting.recv().await {
                Some(traced) => Taken::new(traced),
                None => break,
            },
        };
        let (taken, rest) = next_batch(first, &mut waiting);
        carried = rest;
        let traces: Vec<TraceId> = taken
            .iter()
            .filter_map(|taken| taken.trace)
            .collect::<BTreeSet<TraceId>>()
            .into_iter()
            .collect();
        let permit = Arc::clone(&calls)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let mut client = client.clone();
        let (mut entries, mut names, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
        let mut dedups = Vec::new();
        let mut batch = Vec::with_capacity(taken.len());
        for taken in taken {
            match taken.entry {
                WireEntry::Record(entry) => entries.push(entry),
                WireEntry::Name(entry) => names.push(entry),
                WireEntry::Task(entry) => tasks.push(entry),
                WireEntry::Dedup(entry) => dedups.push(entry),
            }
            batch.push(taken.pending);
        }
        let (sent, names_sent, tasks_sent) = (entries.len(), names.len(), tasks.len());
        let dedups_sent = dedups.len();
        let mut request = tonic::Request::new(pb::Batch {
            request_id: request_ids.fetch_add(1, Ordering::Relaxed),
            sender: Some(identity.now().into()),
            entries,
            names,
            tasks,
            dedups,
        });
        if let Some(value) = trace::ids_value(&traces) {
            request.metadata_mut().insert(trace::TRACE_IDS_KEY, value);
        }
        let down = Arc::clone(&down);
        let retired = Arc::clone(&retired);
        tokio::spawn(async move {
            let outcome = client.exchange(request).await;
            drop(permit);
            down.store(outcome.is_err(), Ordering::Relaxed);
            if let Err(status) = &outcome
                && let Some(current) = retired_by(status)
            {
                retired.send_replace(Some(current));
            }
            let replies = match outcome {
                Ok(response) if response.get_ref().overloaded => {
                    debug!(%peer, "peer's replica store is overloaded; it took nothing");
                    for pending in batch {
                        pending.fail(PeerError::Overloaded { peer });
                    }
                    return;
                }
                Ok(response) if response.get_ref().fault.is_some() => {
                    let fault = wire::fault(response.get_ref().fault.as_ref().expect("matched"));
                    debug!(%peer, %fault, "peer's replica store failed the batch");
                    for pending in batch {
                        pending.fail(PeerError::Store {
                            peer,
                            fault: fault.clone(),
                        });
                    }
                    return;
                }
                Ok(response) => {
                    let response = response.into_inner();
                    wire::replies(&response.replies, sent)
                        .and_then(|replies| {
                            let names = wire::name_replies(&response.name_replies, names_sent)?;
                            let tasks = wire::task_replies(&response.task_replies, tasks_sent)?;
                            let dedups = wire::dedup_replies(&response.dedup_replies, dedups_sent)?;
                            Ok((replies, names, tasks, dedups))
                        })
                        .map_err(|error| error.to_string())
                }
                Err(status) => Err(format!("{}: {}", status.code(), status.message())),
            };
            match replies {
                Ok((replies, names, tasks, dedups)) => {
                    let (mut replies, mut names, mut tasks) =
                        (replies.into_iter(), names.into_iter(), tasks.into_iter());
                    let mut dedups = dedups.into_iter();
                    for pending in batch {
                        match pending {
                            Pending::Record { answer, .. } => {
                                let reply = replies.next().expect("one reply per entry, counted");
                                let _ = answer.send(Ok(reply));
                            }
                            Pending::Name { answer, .. } => {
                                let reply = names.next().expect("one reply per name, counted");
                                let _ = answer.send(Ok(reply));
                            }
                            Pending::Task { answer, .. } => {
                                let reply = tasks.next().expect("one reply per task, counted");
                                let _ = answer.send(Ok(reply));
                            }
                            Pending::Dedup { answer, .. } => {
                                let reply =
                                    dedups.next().expect("one reply per deduplication, counted");
                                let _ = answer.send(Ok(reply));
                            }
                        }
                    }
                }
                Err(reason) => {
                    debug!(%peer, %reason, "peer call failed");
                    for pending in batch {
                        pending.fail(PeerError::Call {
                            peer,
                            reason: reason.clone(),
                        });
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use trireme_core::{Incarnation, MessageId, Millis};
    use trireme_replication::record::{Birth, Record};
    use trireme_replication::replica::Write;

    use super::*;

    fn queued(requests: impl IntoIterator<Item = Request>) -> mpsc::Receiver<Traced> {
        let requests: Vec<Request> = requests.into_iter().collect();
        let (queue, waiting) = mpsc::channel(requests.len());
        for (id, request) in requests.into_iter().enumerate() {
            // Nobody waits for the answers: only the cut is looked at.
            let (answer, _) = oneshot::channel();
            let key = RecordKey {
                queue: QueueName::try_from("large".to_owned()).expect("a valid name"),
                incarnation: Incarnation::local(Millis(1)),
                message: MessageId(id as u128),
            };
            let pending = Pending::Record {
                key,
                request,
                answer,
            };
            queue
                .try_send(Traced {
                    pending,
                    trace: None,
                })
                .unwrap_or_else(|_| panic!("room for every request"));
        }
        waiting
    }

    fn write(payload_bytes: usize) -> Request {
        let record = Record::sent(Birth {
            payload: vec![7; payload_bytes],
            sent_at: Millis(1),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: None,
        });
        Request::Write {
            write: Box::new(Write::Merge(record)),
            ack: true,
        }
    }

    /// The sizes of the calls `waiting` is cut into.
    fn cuts(mut waiting: mpsc::Receiver<Traced>) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut carried = None;
        loop {
            let first = match carried.take() {
                Some(taken) => taken,
                None => match waiting.try_recv() {
                    Ok(traced) => Taken::new(traced),
                    Err(_) => return sizes,
                },
            };
            let (batch, rest) = next_batch(first, &mut waiting);
            let bytes: usize = batch.iter().map(|taken| taken.bytes).sum();
            assert!(
                bytes <= limits::peer_batch_bytes_max,
                "{bytes} bytes in one call"
            );
            sizes.push(batch.len());
            carried = rest;
        }
    }

    #[test]
    fn reads_are_cut_so_that_replies_of_the_largest_records_fit_a_call() {
        // A read's reply may hold a whole 1 MiB message: 52 of them fill a call's bytes.
        let per_call = limits::peer_batch_bytes_max / limits::peer_read_bytes;
        assert_eq!(per_call, 52);
        assert_eq!(
            cuts(queued((0..120).map(|_| Request::Read))),
            vec![52, 52, 16]
        );
    }

    #[test]
    fn writes_are_cut_by_their_encoded_size() {
        // Records of 1 MiB payloads (plus their fields): 55 to a call, no more.
        assert_eq!(cuts(queued((0..60).map(|_| write(1_048_576)))), vec![55, 5]);
        // Small writes are not counted as records: only the count cuts them.
        assert_eq!(cuts(queued((0..600).map(|_| write(100)))), vec![512, 88]);
    }
}
