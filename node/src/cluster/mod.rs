//! The cluster: this node as a replica of its peers' records and as a coordinator of any
//! client request (spec/replication.md). The protocol itself is the pure crate
//! `trireme-replication`; this module is its thin driver: it executes the effects the
//! operations return (requests to the local store and to peers), feeds them the replies, and
//! enforces each operation's deadline. It must never decide a protocol question itself.
//!
//! - `store`: the replica's durable records (group commit, fsync before every ack) and the
//!   local view that receive candidates come from;
//! - `service`: the internal service `trireme.replica.v1` as served to peers;
//! - `anti_entropy`: every pair's periodic comparison of partition digests and exchange of the
//!   records that differ;
//! - `collection`: the background collection of tombstones after the horizon;
//! - `names`: queues in the cluster: create, delete, attribute and tag changes, the name view,
//!   and the sweep of deleted queues' messages;
//! - `long_poll`: long polls across nodes: waiters, wake-ups and re-polls (spec/replication.md
//!   §9);
//! - `move_task`: move tasks' start, cancel and reads, and the driver that runs them under a
//!   lease (spec/replication.md §8);
//! - `peers`: batched, lazily connected links to the peers;
//! - `skew`: clock monitoring, the probes of the peers' clocks and the gate every coordinator
//!   passes first (spec/replication.md#clock-monitoring);
//! - `wire`: the internal service's messages as protocol values.

pub mod anti_entropy;
pub mod collection;
pub mod edge;
pub mod expiry;
pub mod join;
pub mod long_poll;
pub mod move_task;
pub mod names;
pub mod peers;
mod reserve;
pub mod service;
pub mod signal;
pub mod skew;
pub mod store;
pub mod tls;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};
use trireme_core::{DedupId, Incarnation, MessageId, QueueName};
use trireme_proto::replica::v1 as pb;
use trireme_replication::coordinator::{
    DeadLetterNowAnswer, DeleteAnswer, Effects, Handle, HandleAction, HandleAnswer, HandleOp,
    MoveAnswer, MoveOp, Operation, Outgoing, ReceiveAnswer, ReceiveOp, ReceiveSettings, Reply,
    Request, SPLIT_WAIT_MS, SendAnswer, SendOp, VisibilityAnswer,
};
use trireme_replication::dedup::{
    DedupKey, DedupOutgoing, DedupReply, DedupSendAnswer, DedupSendOp, DedupSendSettings,
    SendOutgoing,
};
use trireme_replication::name::WatermarkAnswer;
use trireme_replication::placement::{Placement, REPLICAS, Ring, TooFewMembers};
use trireme_replication::record::{Birth, Record, SourceQueue};
use trireme_replication::skew::Standing;
use trireme_replication::{NodeId, RecordKey};

use self::peers::PeerError;
use self::peers::{Identity, LinkSettings, Peers};
use self::service::ReplicaService;
use self::skew::{ClockWatch, Probes};
use self::store::{
    CheckpointTurns, DedupEntry, DedupWindow, Entry, ReplicaStore, StoreError, StoreFault,
};
use crate::clock::Clock;
use crate::metrics::{MemberState, PeerState, ReplicationMetrics};

/// How this node takes part in the cluster.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// This member.
    pub node: NodeId,
    /// Every other member and the `host:port` of its peer service.
    pub peers: BTreeMap<NodeId, String>,
    /// How long a coordinator waits for an operation's quorum before answering unavailable.
    pub operation_timeout: Duration,
    /// The peer links' timeouts.
    pub link: LinkSettings,
    /// The tombstone horizon: replicas refuse requests older than this by their sender's clock.
    pub horizon_ms: u64,
    /// `DEDUP_WINDOW` (spec/replication.md §4): how long a deduplication id names its message,
    /// from that message's send.
    pub dedup_window_ms: u64,
    /// Whether this node monitors its clock against its peers' and coordinates only while it is
    /// within the bound (spec/replication.md#clock-monitoring). Off only where every member
    /// reads one clock by construction (the simulation's seeds whose members share turmoil's
    /// time: the monitor could only ever measure no skew there), or to show what the protocol
    /// alone promises with clocks beyond the bound (some simulated seeds).
    pub monitor_clock: bool,
}

/// `SKEW_MAX` (spec/replication.md, *Constants*): the bound on two members' clocks' difference,
/// which clock monitoring keeps (spec/replication.md#clock-monitoring).
pub use trireme_replication::skew::SKEW_MAX_MS;
/// `SAMPLE_WAIT` (spec/replication.md, *Candidates beyond the node's own index*): how long a
/// receive waits for the one peer's index it samples; a slow or dead peer delays no receive.
pub const SAMPLE_WAIT: Duration = Duration::from_millis(100);
/// A deduplication put waits `operation_timeout / HOME_WAIT_DIVISOR` for the record's home
/// replica before it goes to the other two (spec/replication.md §4, *Send* step 3).
const HOME_WAIT_DIVISOR: u32 = 4;

/// Sleeps until `at`; never called without one (the select's guard).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    tokio::time::sleep_until(at.expect("guarded by is_some")).await;
}

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Fewer than three members.
    #[error(transparent)]
    Members(#[from] TooFewMembers),
    /// A peer address is not usable.
    #[error("peer address: {0}")]
    Address(#[from] tonic::transport::Error),
    /// This node is listed among its own peers.
    #[error("node {0} is listed among its own peers")]
    SelfAsPeer(u16),
    /// What the replica store holds about joining could not be read.
    #[error(transparent)]
    Store(#[from] store::StoreError),
}

/// The metrics' name of an operation type: its type's own name (`SendOp`, `ReceiveOp`, …),
/// one of the replication crate's fixed set.
fn operation_name<O>() -> &'static str {
    let full = std::any::type_name::<O>();
    // Generic parameters, if a type ever had them, would follow a `<`: keep the path before.
    let path = full.split('<').next().unwrap_or(full);
    path.rsplit("::").next().unwrap_or(path)
}

/// The replica that owns a message for receive candidate order: the first of `replicas` (in
/// ring order) that this node does not take for down (`None` if it takes all for down).
fn owner(replicas: &[NodeId; REPLICAS], down: impl Fn(NodeId) -> bool) -> Option<NodeId> {
    replicas.iter().copied().find(|replica| !down(*replica))
}

/// A message delivered by a receive: its key, its record (holding the new claim), and the
/// handle that deletes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// Which message.
    pub key: RecordKey,
    /// Its record as the claim made it.
    pub record: Record,
    /// The receipt handle, as the replicas know it.
    pub handle: Handle,
}

/// What a replica's answer to one request of an operation was, as its driver hears it: a
/// reply, or its store's fault (spec/replication.md#durability: a failed store acks nothing
/// until its node restarts). Any other failure is silence.
enum Heard {
    Reply(Reply),
    Fault(RecordKey),
    /// The replica was overloaded and took nothing (spec/replication.md#durability, *A replica
    /// that is overloaded*): silence, which counts toward the early answer as a fault does.
    Overloaded(RecordKey),
}

/// The replicas whose stores reported a fault to one operation, by record. Two of a record's
/// three can never make its quorum again before their nodes restart: the operation answers as
/// at its deadline at once, rather than wait for it (the page's time-out, which may come at
/// any moment, only sooner).
#[derive(Default)]
struct Faults(BTreeMap<RecordKey, BTreeSet<NodeId>>);

impl Faults {
    /// Notes `from`'s fault on `key`; whether `key` can no longer reach a quorum.
    fn no_quorum(&mut self, key: &RecordKey, from: NodeId) -> bool {
        let faulted = self.0.entry(key.clone()).or_default();
        faulted.insert(from);
        REPLICAS - faulted.len() < REPLICAS.div_ceil(2)
    }
}

/// Where a queue's dead letters go.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The dead-letter queue.
    pub queue: QueueName,
    /// Which creation of it.
    pub incarnation: Incarnation,
    /// Receives after which a message moves.
    pub max_receive_count: u32,
}

/// The cluster as this node takes part in it. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    me: Identity,
    store: ReplicaStore,
    peers: Peers,
    ring: Ring,
    operation_timeout: Duration,
    /// The tombstone horizon (spec/replication.md, *Horizon rule*): collection waits it.
    horizon_ms: u64,
    /// `DEDUP_WINDOW` (spec/replication.md §4).
    dedup_window_ms: u64,
    /// `OP_TIMEOUT + SKEW_MAX`: this replica refuses a deduplication put older than this.
    dedup_late_ms: u64,
    /// Collection's state across rounds: its walk and the tombstones waiting out the horizon.
    /// One round at a time holds it.
    collector: tokio::sync::Mutex<collection::Collector>,
    /// Claim and proposal nonces.
    nonces: Mutex<ChaCha20Rng>,
    /// The hybrid logical clock's last stamp (spec/replication.md §1): queue incarnations and
    /// attribute registers this node stamps.
    hlc: Mutex<u64>,
    /// The move tasks this node runs, and those a start or a cancel asked it to look at now.
    move_tasks: move_task::MoveTasks,
    /// Drops deleted incarnations' message records; stops with the cluster.
    _sweeper: names::Sweeper,
    /// The store fault each replica last reported (spec/replication.md#durability): an answer
    /// of unavailability names them. A replica's next answer clears its fault.
    faults: Mutex<BTreeMap<NodeId, StoreFault>>,
    /// The replicas whose last answer to this coordinator was *overloaded* (spec/replication.md
    /// #durability, *A replica that is overloaded*): an answer of unavailability while two of
    /// them are is the throttling refusal instead. A replica's next reply clears it.
    overloaded: Mutex<BTreeSet<NodeId>>,
    /// This node's clock against its peers' (spec/replication.md#clock-monitoring), and the
    /// probes that feed it, which stop with the cluster (`None`: the clock is trusted).
    clock_watch: Option<(Arc<ClockWatch>, Probes)>,
    /// The peers' disks, and whether this node has joined (spec/replication.md, *Stragglers
    /// and replacement*).
    membership: Arc<join::Membership>,
    /// Every replica set the ring places messages on: a re-poll reads two indexes of each
    /// (spec/replication.md §9).
    replica_sets: Vec<[NodeId; REPLICAS]>,
    /// This node's long polls (spec/replication.md §9).
    long_polls: Arc<long_poll::LongPolls>,
    /// The wake-ups this node's writes send its peers.
    wake_ups: long_poll::WakeUps,
    /// Which peer the next short poll samples, counting up.
    sampled: std::sync::atomic::AtomicUsize,
    /// The candidates this node's receives are claiming now, which its other receives skip
    /// (spec/replication.md, Considerations, *Candidate order*).
    claiming: reserve::Claiming,
    /// Quorum rounds, read repairs, anti-entropy and dead-letter moves, for the node's metrics.
    metrics: ReplicationMetrics,
}

impl Cluster {
    /// Joins the cluster on `store`, reading time from `clock`. Returns the coordinator handle
    /// and the replica service to serve on the peer port.
    ///
    /// # Errors
    /// `SelfAsPeer`, `Members` (fewer than three), `Address`.
    pub fn start(
        settings: &ClusterSettings,
        store: ReplicaStore,
        clock: Arc<dyn Clock>,
        seed: Option<u64>,
    ) -> Result<(Cluster, ReplicaService), ClusterError> {
        Cluster::start_with(settings, store, clock, seed, &|_, endpoint| {
            endpoint.connect_lazy()
        })
    }

    /// Joins the cluster as [`Cluster::start`] does, with peer channels made by `channel` from
    /// each peer's id and endpoint (see [`Peers::connect_with`]): another network under the
    /// same links, e.g. the simulation's, or TLS (`tls::PeerTls::channel`).
    ///
    /// # Errors
    /// As [`Cluster::start`].
    pub fn start_with(
        settings: &ClusterSettings,
        store: ReplicaStore,
        clock: Arc<dyn Clock>,
        seed: Option<u64>,
        channel: &dyn Fn(NodeId, &Endpoint) -> Channel,
    ) -> Result<(Cluster, ReplicaService), ClusterError> {
        if settings.peers.contains_key(&settings.node) {
            return Err(ClusterError::SelfAsPeer(settings.node.0));
        }
        let members: BTreeSet<NodeId> = settings
            .peers
            .keys()
            .copied()
            .chain([settings.node])
            .collect();
        let ring = Ring::new(members.iter().copied())?;
        let me = Identity {
            node: settings.node,
            disk_id: store.disk_id(),
            clock,
        };
        let peers = Peers::connect_with(&me, &settings.peers, settings.link, channel)?;
        let nonces = match seed {
            Some(seed) => ChaCha20Rng::seed_from_u64(seed ^ 0x6e6f_6e63_655f_7365),
            None => ChaCha20Rng::from_os_rng(),
        };
        let clock_watch = settings.monitor_clock.then(|| {
            let watch = ClockWatch::new(me.clone(), settings.peers.keys().copied());
            let probes = watch.spawn(
                settings
                    .peers
                    .keys()
                    .filter_map(|peer| Some((*peer, peers.client(*peer)?)))
                    .collect(),
                &peers,
            );
            (watch, probes)
        });
        store.set_dedup_window(DedupWindow {
            clock: Arc::clone(&me.clock),
            window_ms: settings.dedup_window_ms,
        });
        store.set_checkpoint_turns(CheckpointTurns {
            clock: Arc::clone(&me.clock),
            position: u32::try_from(
                members
                    .iter()
                    .position(|member| *member == settings.node)
                    .expect("this node is one of the members"),
            )
            .expect("members fit in u32"),
            members: u32::try_from(members.len()).expect("members fit in u32"),
        });
        let sweeper_store = store.clone();
        let dedup_late_ms = u64::try_from(settings.operation_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(SKEW_MAX_MS);
        let membership = Arc::new(join::Membership::open(store.clone())?);
        let long_polls = Arc::new(long_poll::LongPolls::default());
        let replica_sets = ring.replica_sets();
        let wake_ups = long_poll::spawn_wake_ups(
            me.clone(),
            settings
                .peers
                .keys()
                .filter_map(|peer| Some((*peer, peers.client(*peer)?)))
                .collect(),
        );
        let service = ReplicaService {
            long_polls: Arc::clone(&long_polls),
            membership: Arc::clone(&membership),
            store: store.clone(),
            members,
            me: me.clone(),
            horizon_ms: settings.horizon_ms,
            dedup_late_ms,
            ring: ring.clone(),
            certified_peers: false,
        };
        let cluster = Cluster {
            inner: Arc::new(Inner {
                me,
                store,
                peers,
                ring,
                operation_timeout: settings.operation_timeout,
                horizon_ms: settings.horizon_ms,
                dedup_window_ms: settings.dedup_window_ms,
                dedup_late_ms,
                collector: tokio::sync::Mutex::new(collection::Collector::default()),
                nonces: Mutex::new(nonces),
                hlc: Mutex::new(0),
                move_tasks: move_task::MoveTasks::default(),
                _sweeper: names::Sweeper::spawn(sweeper_store),
                clock_watch,
                membership,
                faults: Mutex::new(BTreeMap::new()),
                overloaded: Mutex::new(BTreeSet::new()),
                replica_sets,
                long_polls,
                wake_ups,
                sampled: std::sync::atomic::AtomicUsize::new(0),
                claiming: reserve::Claiming::default(),
                metrics: ReplicationMetrics::default(),
            }),
        };
        tokio::spawn(
            cluster
                .clone()
                .join(anti_entropy::AntiEntropySettings::default()),
        );
        expiry::spawn(Arc::downgrade(&cluster.inner));
        // A peer that refuses this node's disk as replaced retires it (spec/replication.md,
        // *Stragglers and replacement*: a replaced disk never rejoins).
        let mut retired = cluster.inner.peers.retired();
        let membership = Arc::downgrade(&cluster.inner.membership);
        tokio::spawn(async move {
            while retired.changed().await.is_ok() {
                let by = *retired.borrow_and_update();
                match (by, membership.upgrade()) {
                    (Some(by), Some(membership)) => membership.retire(by),
                    (_, None) => return,
                    (None, Some(_)) => {}
                }
            }
        });
        Ok((cluster, service))
    }

    /// This node.
    #[must_use]
    pub fn node(&self) -> NodeId {
        self.inner.me.node
    }

    /// Whether this node may coordinate now (spec/replication.md#clock-monitoring): its clock
    /// is within `SKEW_MAX / 2` of the cluster's median clock. An unmeasured node probes its
    /// peers at once and waits for them up to the operation timeout.
    ///
    /// # Errors
    /// The standing that does not coordinate (beyond the bound, or unmeasured), which says why.
    pub async fn coordinating(&self) -> Result<(), Standing> {
        match &self.inner.clock_watch {
            Some((watch, _)) => watch.gate(self.inner.operation_timeout).await,
            None => Ok(()),
        }
    }

    /// The replicas whose last answer to this coordinator was *overloaded*, in node order
    /// (spec/replication.md#durability, *A replica that is overloaded*).
    #[must_use]
    pub fn overloaded_replicas(&self) -> Vec<NodeId> {
        self.inner
            .overloaded
            .lock()
            .expect("the overload lock is never poisoned")
            .iter()
            .copied()
            .collect()
    }

    /// The store fault each replica last reported, of those that have not answered since
    /// (spec/replication.md#durability), in node order: what an answer of unavailability names.
    /// A failed store refuses everything until its node restarts, so the fault stands until
    /// that node answers again.
    #[must_use]
    pub fn replica_faults(&self) -> Vec<(NodeId, StoreFault)> {
        self.inner
            .faults
            .lock()
            .expect("the fault lock is never poisoned")
            .iter()
            .map(|(node, fault)| (*node, fault.clone()))
            .collect()
    }

    /// A peer's answer: its reply, or nothing (a failure is silence to the operation). A store
    /// fault is noted for the answers of unavailability; a reply clears the peer's fault.
    fn heard<T>(
        &self,
        from: NodeId,
        answered: Result<Result<T, PeerError>, tokio::sync::oneshot::error::RecvError>,
    ) -> Option<T> {
        match answered {
            Ok(Ok(reply)) => {
                self.clear_fault(from);
                Some(reply)
            }
            Ok(Err(PeerError::Store { fault, .. })) => {
                self.note_fault(from, fault);
                None
            }
            Ok(Err(PeerError::Overloaded { .. })) => {
                self.note_overloaded(from, true);
                None
            }
            Ok(Err(_)) | Err(_) => None,
        }
    }

    /// The local store's answer, as [`Cluster::heard`] takes a peer's.
    fn heard_locally<T>(&self, answered: Result<T, Arc<StoreError>>) -> Option<T> {
        let me = self.inner.me.node;
        match answered {
            Ok(answers) => {
                self.clear_fault(me);
                Some(answers)
            }
            Err(error) if matches!(*error, StoreError::Overloaded { .. }) => {
                self.note_overloaded(me, true);
                None
            }
            Err(error) => {
                self.note_fault(me, error.fault());
                None
            }
        }
    }

    fn note_fault(&self, node: NodeId, fault: StoreFault) {
        let mut faults = self
            .inner
            .faults
            .lock()
            .expect("the fault lock is never poisoned");
        if !faults.contains_key(&node) {
            warn!(node = node.0, %fault, "a replica's store failed: it acks nothing until it restarts");
        }
        faults.insert(node, fault);
    }

    /// Notes whether `node`'s replica answered *overloaded* (`true`) or replied (`false`).
    fn note_overloaded(&self, node: NodeId, overloaded: bool) {
        let mut marked = self
            .inner
            .overloaded
            .lock()
            .expect("the overload lock is never poisoned");
        if overloaded {
            if marked.insert(node) {
                debug!(
                    node = node.0,
                    "a replica is overloaded: its writes are shed"
                );
            }
        } else {
            marked.remove(&node);
        }
    }

    fn clear_fault(&self, node: NodeId) {
        self.note_overloaded(node, false);
        let mut faults = self
            .inner
            .faults
            .lock()
            .expect("the fault lock is never poisoned");
        if faults.remove(&node).is_some() {
            info!(
                node = node.0,
                "a replica whose store had failed answers again"
            );
        }
    }

    /// This member's replication figures (for the node's metrics).
    #[must_use]
    pub fn metrics(&self) -> &ReplicationMetrics {
        &self.inner.metrics
    }

    /// Where this member stands now, for the node's metrics and `/ready`: joined or not, each
    /// peer up or not (a fresh clock sample where the clock is monitored, else the link's last
    /// call) with its clock offset, the quorum, and the replica store's failure.
    #[must_use]
    pub fn member_state(&self) -> MemberState {
        let peers = match &self.inner.clock_watch {
            Some((watch, _)) => {
                let versions = watch.peer_versions();
                watch
                    .peer_offsets()
                    .into_iter()
                    .map(|(peer, offset)| PeerState {
                        peer: peer.0,
                        up: offset.is_some(),
                        offset_ms: offset.map(|offset| offset.estimate_ms()),
                        version: versions.get(&peer).cloned(),
                    })
                    .collect()
            }
            None => self
                .peer_ids()
                .into_iter()
                .map(|peer| PeerState {
                    peer: peer.0,
                    up: !self.inner.peers.down(peer),
                    offset_ms: None,
                    version: None,
                })
                .collect(),
        };
        MemberState {
            not_joined: self.join_state().refusal(),
            peers,
            node: self.inner.me.node.0,
            replica_sets: self
                .inner
                .replica_sets
                .iter()
                .map(|set| set.map(|member| member.0))
                .collect(),
            // Two of a message's three replicas (spec/replication.md: W = R = 2).
            quorum: REPLICAS / 2 + 1,
            store_fault: self.inner.store.failure().map(|fault| fault.to_string()),
        }
    }

    /// Every live queue's figures by this member's local view, in name order: counts as
    /// `GetQueueAttributes` answers them here (spec/replication.md §11), the oldest message,
    /// no quorum read. Dead-letter moves are left at 0 for the caller to fill.
    #[must_use]
    pub fn queue_stats(&self) -> Vec<trireme_core::QueueStats> {
        let now = self.inner.me.clock.now();
        let live: Vec<(QueueName, Incarnation, Option<trireme_core::Millis>)> =
            self.inner.store.names(|names| {
                names
                    .live_names()
                    .into_iter()
                    .filter_map(|name| {
                        let incarnation = names.get(&name)?.record.live()?.incarnation;
                        let watermark = names.watermark(&name, incarnation);
                        Some((name, incarnation, watermark))
                    })
                    .collect()
            });
        self.inner.store.view(|view| {
            live.into_iter()
                .map(|(name, incarnation, watermark)| {
                    let (ready, in_flight, delayed) =
                        view.counts(&name, incarnation, watermark, now);
                    trireme_core::QueueStats {
                        counts: trireme_core::MessageCounts {
                            ready,
                            in_flight,
                            delayed,
                        },
                        oldest_sent_at: view.oldest_sent_at(&name, incarnation, watermark),
                        dead_letter_moves: 0,
                        name,
                    }
                })
                .collect()
        })
    }

    /// Up to `limit` live records of `queue`'s live incarnation in this member's replica
    /// store, the first entered first, with their state now: a read of the local replica view
    /// that asks no peer and changes nothing (the console's peek). A member holds only the
    /// records it replicates (all of them in a cluster of three).
    ///
    /// # Errors
    /// The store's, when its records cannot be read.
    pub async fn local_records(
        &self,
        queue: &QueueName,
        limit: usize,
    ) -> Result<Vec<(MessageId, Record, store::PeekState)>, StoreError> {
        let now = self.inner.me.clock.now();
        let live = self.inner.store.names(|names| {
            let incarnation = names.get(queue)?.record.live()?.incarnation;
            Some((incarnation, names.watermark(queue, incarnation)))
        });
        let Some((incarnation, watermark)) = live else {
            return Ok(Vec::new());
        };
        let peeked = self
            .inner
            .store
            .view(|view| view.peek(queue, incarnation, watermark, now, limit));
        let keys: Vec<RecordKey> = peeked
            .iter()
            .map(|(message, _)| RecordKey {
                queue: queue.clone(),
                incarnation,
                message: *message,
            })
            .collect();
        let store = self.inner.store.clone();
        let records = tokio::task::spawn_blocking(move || store.read(&keys))
            .await
            .expect("a store read never panics")?;
        let states: BTreeMap<MessageId, store::PeekState> = peeked.into_iter().collect();
        Ok(records
            .into_iter()
            .filter_map(|(key, record)| Some((key.message, record, *states.get(&key.message)?)))
            .collect())
    }

    /// The replicas of `key`.
    #[must_use]
    pub fn replicas(&self, key: &RecordKey) -> [NodeId; REPLICAS] {
        self.inner.ring.replicas(&key.queue, key.message)
    }

    /// How many of the queue's messages this node's receives are claiming now (reserved from
    /// its other receives, spec/replication.md, *Candidate order*): none once every receive has
    /// answered or been cancelled.
    #[must_use]
    pub fn claiming(&self, queue: &QueueName, incarnation: Incarnation) -> usize {
        self.inner.claiming.count(queue, incarnation)
    }

    /// The local replica store (for its view and for inspection).
    #[must_use]
    pub fn store(&self) -> &ReplicaStore {
        &self.inner.store
    }

    /// Sends the message `id` with `birth` into the queue (spec/replication.md#send).
    pub async fn send(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        id: MessageId,
        birth: Birth,
    ) -> SendAnswer {
        let key = RecordKey {
            queue: queue.clone(),
            incarnation,
            message: id,
        };
        let ready = birth.visible_from <= birth.sent_at;
        let (op, effects) = SendOp::start(key.clone(), self.replicas(&key), Record::sent(birth));
        let answer = self.run(op, effects).await;
        if answer == SendAnswer::Sent && ready {
            self.wake(queue, incarnation, vec![id]);
        }
        answer
    }

    /// Sends the message `id` with `birth`, which carries the deduplication id `dedup`
    /// (spec/replication.md §4, *Send*): written held while the id's record is read, then the
    /// conditional put, then the settle. The answer names the id's message: this one, or the
    /// message an earlier send of the id stored (a duplicate).
    pub async fn send_deduplicated(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        id: MessageId,
        birth: Birth,
        dedup: DedupId,
    ) -> DedupSendAnswer {
        assert_eq!(
            birth.dedup_id.as_deref(),
            Some(dedup.as_str()),
            "the message carries its deduplication id"
        );
        let key = RecordKey {
            queue: queue.clone(),
            incarnation,
            message: id,
        };
        let dedup = DedupKey {
            queue: queue.clone(),
            incarnation,
            id: dedup,
        };
        let settings = DedupSendSettings {
            now: birth.sent_at,
            window_ms: self.inner.dedup_window_ms,
            ring: self.inner.ring.clone(),
        };
        let ready = birth.visible_from <= birth.sent_at;
        let (op, effects) = DedupSendOp::start(key, Record::sent_held(birth), dedup, settings);
        let answer = self.run_deduplicated(op, effects).await;
        if let DedupSendAnswer::Sent {
            message,
            duplicate: false,
        } = answer
            && ready
        {
            self.wake(queue, incarnation, vec![message]);
        }
        answer
    }

    /// Receives up to `max` messages of the queue (spec/replication.md#receive-claim):
    /// candidates from the local view (and one peer's index when it offers too few,
    /// *Candidates beyond the node's own index*), each claimed through the quorum; messages at
    /// their `maxReceiveCount` are moved to the dead-letter queue instead. The queue's purge
    /// watermark is read by quorum once per call, in parallel with the candidates' record
    /// reads, and no claim is decided without it (§2): a call whose watermark read fails
    /// delivers nothing. A message past `retention_ms` since its original send by this node's
    /// clock is nothing to receive (§3).
    pub async fn receive(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        max: usize,
        visibility_timeout_ms: u64,
        retention_ms: u64,
        dead_letter: Option<&DeadLetter>,
    ) -> Vec<Delivered> {
        let candidates = self.sampled_candidates(queue, incarnation, max).await;
        let wait = long_poll::Wait {
            max,
            visibility_timeout_ms,
            retention_ms,
            dead_letter: dead_letter.cloned(),
        };
        self.claim(queue, incarnation, candidates, &wait).await
    }

    /// The local view's oldest `max × N` ready messages of the queue, those this node owns
    /// first (their first replica on the ring that it does not take for down is itself), so
    /// coordinators serving one queue at once mostly claim different messages instead of
    /// racing for the same oldest ones, also while a peer is down (spec/replication.md, the
    /// paragraph after receive step 7, and Considerations, *Candidate order* and *Split claims
    /// (F2)*), leaving out those its other receives are claiming now. A hint, never a safety
    /// question: the quorum decides.
    fn own_candidates(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        max: usize,
    ) -> Vec<MessageId> {
        let now = self.inner.me.clock.now();
        let known_watermark = self.known_watermark(queue, incarnation);
        // Read past what this node's other receives are claiming, which are left out.
        let reserved = self.inner.claiming.count(queue, incarnation);
        let candidates = self.inner.store.view_mut(|view| {
            view.candidates(
                queue,
                incarnation,
                known_watermark,
                now,
                max.saturating_mul(REPLICAS).saturating_add(reserved),
            )
        });
        let mut candidates = self
            .inner
            .claiming
            .unreserved(queue, incarnation, candidates);
        candidates.truncate(max.saturating_mul(REPLICAS));
        let me = self.inner.me.node;
        candidates.sort_by_key(|id| {
            let replicas = self.inner.ring.replicas(queue, *id);
            owner(&replicas, |peer| peer != me && self.inner.peers.down(peer)) != Some(me)
        });
        candidates
    }

    /// A short poll's candidates (spec/replication.md, *Candidates beyond the node's own
    /// index*): this node's own, and when they are fewer than `max`, one peer's after them,
    /// the peers taken in turn and those taken for down skipped.
    pub(super) async fn sampled_candidates(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        max: usize,
    ) -> Vec<MessageId> {
        let mut candidates = self.own_candidates(queue, incarnation, max);
        if candidates.len() < max
            && let Some(peer) = self.next_sampled_peer()
        {
            self.inner.metrics.count_index_sample();
            if let Ok(Some((theirs, _))) = tokio::time::timeout(
                SAMPLE_WAIT,
                self.peer_candidates(peer, queue, incarnation, max.saturating_mul(REPLICAS)),
            )
            .await
            {
                for id in theirs {
                    if !candidates.contains(&id) {
                        candidates.push(id);
                    }
                }
            }
        }
        candidates
    }

    /// The next peer a short poll samples: the members after this node in turn, skipping
    /// those taken for down (`None`: all are).
    fn next_sampled_peer(&self) -> Option<NodeId> {
        let peers = self.peer_ids();
        if peers.is_empty() {
            return None;
        }
        let start = self
            .inner
            .sampled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (0..peers.len())
            .map(|offset| peers[(start + offset) % peers.len()])
            .find(|peer| !self.inner.peers.down(*peer))
    }

    /// Up to `limit` ready messages of the queue in `peer`'s index, oldest first, and how many
    /// it counts ready; `None` if it did not answer (or answered something malformed, which
    /// is logged). A hint: nothing is decided on it.
    pub(super) async fn peer_candidates(
        &self,
        peer: NodeId,
        queue: &QueueName,
        incarnation: Incarnation,
        limit: usize,
    ) -> Option<(Vec<MessageId>, u64)> {
        let mut client = self.inner.peers.client(peer)?;
        let request = pb::CandidatesRequest {
            sender: Some(self.inner.me.now().into()),
            queue: queue.as_str().to_owned(),
            incarnation_hlc_ms: incarnation.hlc_ms,
            incarnation_node: u32::from(incarnation.node),
            incarnation_nonce: incarnation.nonce,
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        };
        let mut request = tonic::Request::new(request);
        crate::trace::attach(&mut request);
        let reply = match client.candidates(request).await {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                debug!(peer = peer.0, %status, "a peer gave no candidates");
                return None;
            }
        };
        match wire::candidates(&reply.messages) {
            Ok(theirs) => Some((theirs, reply.ready)),
            Err(error) => {
                warn!(peer = peer.0, %error, "a peer's candidates are malformed");
                None
            }
        }
    }

    /// Claims the first `wait.max` of `candidates` through the quorum (receive steps 1–7),
    /// moving those at their `maxReceiveCount` to the dead-letter queue.
    pub(super) async fn claim(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        candidates: Vec<MessageId>,
        wait: &long_poll::Wait,
    ) -> Vec<Delivered> {
        let long_poll::Wait {
            max,
            visibility_timeout_ms,
            retention_ms,
            ref dead_letter,
        } = *wait;
        let dead_letter = dead_letter.as_ref();
        if candidates.is_empty() {
            // Nothing to decide: no record read, and so no watermark read either.
            return Vec::new();
        }
        // Those another receive of this node is claiming are left out, and the first `max` of
        // the rest are this receive's until its claims have answered (*Candidate order*).
        let (candidates, _reservation) =
            self.inner
                .claiming
                .reserve(queue, incarnation, candidates, max);
        if candidates.is_empty() {
            return Vec::new();
        }
        let now = self.inner.me.clock.now();
        let known_watermark = self.known_watermark(queue, incarnation);
        let mut local = self
            .local_records_to_claim(queue, incarnation, &candidates)
            .await;
        // Every claim below waits for the watermark: a `Signal` resumes them in a fixed order.
        let watermark = Arc::new(signal::Signal::new(None));
        let watermark_read = Arc::clone(&watermark);
        let reader = self.clone();
        let name = queue.clone();
        // The receive's tasks carry its trace id to the replicas they ask (`crate::trace`).
        let watermark_task = tokio::spawn(crate::trace::inherit(async move {
            let answer = reader.queue_watermark(&name, incarnation).await;
            // Every claim may have ended already (each has its own deadline): nobody listens.
            watermark_read.set(Some(answer));
        }));
        let mut claims = JoinSet::new();
        for id in candidates {
            let key = RecordKey {
                queue: queue.clone(),
                incarnation,
                message: id,
            };
            let settings = ReceiveSettings {
                me: self.inner.me.node,
                now,
                visibility_timeout_ms,
                max_receive_count: dead_letter.map(|d| d.max_receive_count),
                nonce: self.nonce(),
                // A lower bound; the quorum read's watermark raises it (`on_watermark`).
                purged_through: known_watermark,
                retention_ms,
            };
            let cluster = self.clone();
            let dead_letter = dead_letter.cloned();
            let watermark = Arc::clone(&watermark);
            let local = local.remove(&id);
            claims.spawn(crate::trace::inherit(async move {
                let replicas = cluster.replicas(&key);
                // spec/replication.md §13: the claim without the read when this node's own
                // record of the message is claimable; the read path otherwise.
                let fast = local.and_then(|record| {
                    ReceiveOp::start_fast(key.clone(), replicas, settings, &record)
                });
                let (op, effects) = fast.unwrap_or_else(|| {
                    ReceiveOp::start_reading_watermark(key.clone(), replicas, settings)
                });
                let read = async move { watermark.wait_for(Option::is_some).await };
                let with_watermark = |op: &mut ReceiveOp, answer: Option<WatermarkAnswer>| {
                    match answer {
                        Some(WatermarkAnswer::Read(watermark)) => op.on_watermark(watermark),
                        // Gone (the incarnation was deleted) or unavailable: without the
                        // watermark nothing may be delivered.
                        Some(WatermarkAnswer::Gone | WatermarkAnswer::Unavailable) | None => {
                            op.on_timeout()
                        }
                    }
                };
                let (answer, op) = cluster.run_with(op, effects, read, with_watermark).await;
                cluster
                    .inner
                    .metrics
                    .count_receive_claim(op.path(), matches!(answer, ReceiveAnswer::Delivered(_)));
                match answer {
                    ReceiveAnswer::Delivered(record) => {
                        let claim = record.claim().expect("a delivery holds its claim");
                        Some(Delivered {
                            handle: Handle {
                                generation: record.generation,
                                claim,
                            },
                            key,
                            record,
                        })
                    }
                    ReceiveAnswer::DeadLetter(record) => {
                        if let Some(dead_letter) = dead_letter {
                            cluster
                                .move_to_dead_letter(&key, &record, &dead_letter)
                                .await;
                        }
                        None
                    }
                    ReceiveAnswer::Nothing(_)
                    | ReceiveAnswer::LostRace
                    | ReceiveAnswer::GaveUpSplit
                    | ReceiveAnswer::Unavailable
                    | ReceiveAnswer::Diverged(_) => None,
                }
            }));
        }
        let mut delivered = Vec::new();
        while let Some(joined) = claims.join_next().await {
            if let Some(message) = joined.expect("a claim task never panics") {
                delivered.push(message);
            }
        }
        // Every claim has answered; the read, if still waiting for its quorum, is not needed.
        watermark_task.abort();
        delivered.sort_by_key(|d| (d.record.live().map(|l| l.entered_at), d.key.message));
        delivered
    }

    /// The records of `candidates` this node's own replica holds, read in place (a read
    /// transaction, no group commit: spec/replication.md §13, *The local read*), for the claim
    /// without the read. None when the replica may not serve one (*The local read*: not joined,
    /// its store failed or overloaded) or the read fails: every claim then takes the read path,
    /// which does not depend on this replica.
    async fn local_records_to_claim(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        candidates: &[MessageId],
    ) -> BTreeMap<MessageId, Record> {
        let store = &self.inner.store;
        if self.join_state() != join::JoinState::Joined
            || store.failure().is_some()
            || store.overloaded()
        {
            return BTreeMap::new();
        }
        let me = self.inner.me.node;
        let keys: Vec<RecordKey> = candidates
            .iter()
            .map(|id| RecordKey {
                queue: queue.clone(),
                incarnation,
                message: *id,
            })
            .filter(|key| self.replicas(key).contains(&me))
            .collect();
        if keys.is_empty() {
            return BTreeMap::new();
        }
        let reader = store.clone();
        match store.scan_off(move || reader.read(&keys)).await {
            Ok(records) => records
                .into_iter()
                .map(|(key, record)| (key.message, record))
                .collect(),
            Err(error) => {
                debug!(%error, "the local read for claims without the read failed");
                BTreeMap::new()
            }
        }
    }

    async fn move_to_dead_letter(
        &self,
        key: &RecordKey,
        record: &Record,
        dead_letter: &DeadLetter,
    ) -> MoveAnswer {
        let target = RecordKey {
            queue: dead_letter.queue.clone(),
            incarnation: dead_letter.incarnation,
            message: key.message,
        };
        let source = SourceQueue {
            name: key.queue.clone(),
            incarnation: key.incarnation,
        };
        let (op, effects) = MoveOp::start(
            (key.clone(), self.replicas(key)),
            (target.clone(), self.replicas(&target)),
            record,
            source,
            self.inner.me.clock.now(),
        );
        let answer = self.run(op, effects).await;
        if matches!(answer, MoveAnswer::Moved | MoveAnswer::CopiedOnly) {
            // The copy is ready in the dead-letter queue (§9, *Wake-up*).
            self.wake(&target.queue, target.incarnation, vec![target.message]);
        }
        // A copy without the source's tombstone is moved again by a later receive: counted
        // then, once.
        if answer == MoveAnswer::Moved {
            self.inner.metrics.count_dead_letter_move(&key.queue);
        }
        answer
    }

    /// Deletes with `handle` (spec/replication.md#delete).
    pub async fn delete(&self, key: &RecordKey, handle: Handle) -> DeleteAnswer {
        let now = self.inner.me.clock.now();
        let (op, effects) = HandleOp::start(
            key.clone(),
            self.replicas(key),
            handle,
            HandleAction::Delete,
            now,
        );
        match self.run(op, effects).await {
            HandleAnswer::Delete(answer) => answer,
            HandleAnswer::Visibility(_) | HandleAnswer::DeadLetterNow(_) => {
                unreachable!("a delete answers as a delete")
            }
        }
    }

    /// Moves the message `handle` holds to `dead_letter` at once (spec/replication.md §7,
    /// *Dead-letter now, replicated*): the source queue's purge watermark by quorum (§2: a
    /// record it hides is not in flight), the read and the handle's classification, then the
    /// move of the record read, whose tombstone is conditioned on the claim it holds.
    pub async fn dead_letter_now(
        &self,
        key: &RecordKey,
        handle: Handle,
        dead_letter: &DeadLetter,
    ) -> Result<MoveAnswer, DeadLetterNowAnswer> {
        let purged_through = match self.queue_watermark(&key.queue, key.incarnation).await {
            WatermarkAnswer::Read(watermark) => watermark,
            // Its queue's incarnation is gone, and the message with it.
            WatermarkAnswer::Gone => return Err(DeadLetterNowAnswer::NotInFlight),
            WatermarkAnswer::Unavailable => return Err(DeadLetterNowAnswer::Unavailable),
        };
        let now = self.inner.me.clock.now();
        let (op, effects) = HandleOp::start(
            key.clone(),
            self.replicas(key),
            handle,
            HandleAction::DeadLetterNow { purged_through },
            now,
        );
        match self.run(op, effects).await {
            HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Current(record)) => {
                Ok(self.move_to_dead_letter(key, &record, dead_letter).await)
            }
            HandleAnswer::DeadLetterNow(refused) => Err(refused),
            HandleAnswer::Delete(_) | HandleAnswer::Visibility(_) => {
                unreachable!("a dead-letter now answers as one")
            }
        }
    }

    /// Changes the visibility of the message `handle` holds (spec/replication.md
    /// #change-visibility).
    pub async fn change_visibility(
        &self,
        key: &RecordKey,
        handle: Handle,
        timeout_ms: u64,
        cap_ms: u64,
    ) -> VisibilityAnswer {
        let now = self.inner.me.clock.now();
        let action = HandleAction::ChangeVisibility { timeout_ms, cap_ms };
        let (op, effects) = HandleOp::start(key.clone(), self.replicas(key), handle, action, now);
        match self.run(op, effects).await {
            HandleAnswer::Visibility(answer) => {
                if answer == VisibilityAnswer::Changed && timeout_ms == 0 {
                    // Ready again at once (§9, *Wake-up*: a change of visibility to 0).
                    self.wake(&key.queue, key.incarnation, vec![key.message]);
                }
                answer
            }
            HandleAnswer::Delete(_) | HandleAnswer::DeadLetterNow(_) => {
                unreachable!("a visibility change answers as one")
            }
        }
    }

    fn nonce(&self) -> u64 {
        self.inner
            .nonces
            .lock()
            .expect("the nonce lock is never poisoned")
            .random()
    }

    /// Runs `op` from its first `effects` to its answer, or to its deadline.
    async fn run<O: Operation>(&self, op: O, effects: Effects<O::Answer>) -> O::Answer {
        let never = std::future::pending::<()>();
        self.run_with(op, effects, never, |_, ()| {
            unreachable!("a pending future never resolves")
        })
        .await
        .0
    }

    /// Runs `op` as [`Cluster::run`] does, also feeding it, once, the value `input` resolves
    /// to through `on_input` (a receive's watermark read); answers with the operation as it
    /// ended, for what it can tell of its path.
    async fn run_with<O: Operation, T>(
        &self,
        mut op: O,
        mut effects: Effects<O::Answer>,
        input: impl std::future::Future<Output = T>,
        on_input: impl FnOnce(&mut O, T) -> Effects<O::Answer>,
    ) -> (O::Answer, O) {
        let (replies, mut incoming) = mpsc::unbounded_channel();
        let started = tokio::time::Instant::now();
        let deadline = started + self.inner.operation_timeout;
        // Set when the operation's write round splits (spec/replication.md, receive step 7):
        // its third replica gets `SPLIT_WAIT` from then, within the operation's deadline.
        let mut split_deadline: Option<tokio::time::Instant> = None;
        let mut input = std::pin::pin!(input);
        let mut on_input = Some(on_input);
        let mut faults = Faults::default();
        loop {
            if let Some(answer) = effects.answer.take() {
                // Requests the answering step still sent (read repairs) go out unawaited.
                self.inner.metrics.observe_operation(
                    operation_name::<O>(),
                    started.elapsed(),
                    effects.sends.len(),
                );
                self.dispatch(std::mem::take(&mut effects.sends), None);
                // A delivery still on its way to this node's own replica: heard out (bounded by
                // the deadline), so the receive holds its reservation until its own view shows
                // the claim (spec/replication.md §13, *Own replica last*).
                while op.lingers() {
                    tokio::select! {
                        biased;
                        reply = incoming.recv() => match reply {
                            Some((from, round, Heard::Reply(reply))) => {
                                let _ = op.on_reply(from, round, &reply);
                            }
                            Some(_) | None => break,
                        },
                        () = tokio::time::sleep_until(deadline) => break,
                    }
                }
                return (answer, op);
            }
            self.dispatch(std::mem::take(&mut effects.sends), Some(&replies));
            if split_deadline.is_none() && op.split() {
                split_deadline = Some(
                    (tokio::time::Instant::now() + Duration::from_millis(SPLIT_WAIT_MS))
                        .min(deadline),
                );
            }
            let split_at = split_deadline.unwrap_or(deadline);
            effects = tokio::select! {
                // A reply that arrives with the deadline counts: and an unbiased select would
                // draw from tokio's random source, which a simulation cannot seed.
                biased;
                reply = incoming.recv() => {
                    let (from, round, heard): (NodeId, u32, Heard) =
                        reply.expect("the operation holds a sender of its own replies");
                    match heard {
                        Heard::Reply(reply) => op.on_reply(from, round, &reply),
                        Heard::Fault(key) | Heard::Overloaded(key)
                            if faults.no_quorum(&key, from) =>
                        {
                            op.on_timeout()
                        }
                        Heard::Fault(_) | Heard::Overloaded(_) => {
                            Effects { sends: Vec::new(), answer: None }
                        }
                    }
                }
                () = tokio::time::sleep_until(split_at), if split_deadline.is_some() => {
                    let effects = op.on_split_wait();
                    if effects.answer.is_none() && effects.sends.is_empty() {
                        // No longer split (a later round): wait for the deadline again.
                        split_deadline = None;
                    }
                    effects
                }
                value = &mut input, if on_input.is_some() => {
                    let on_input = on_input.take().expect("guarded by is_some");
                    on_input(&mut op, value)
                }
                () = tokio::time::sleep_until(deadline) => op.on_timeout(),
            };
        }
    }

    /// Runs a send with a deduplication id from its first `effects` to its answer, or to its
    /// deadline: as [`Cluster::run`], with replies of two kinds.
    async fn run_deduplicated(
        &self,
        mut op: DedupSendOp,
        mut effects: Effects<DedupSendAnswer, SendOutgoing>,
    ) -> DedupSendAnswer {
        let (record_replies, mut records) = mpsc::unbounded_channel();
        let (dedup_replies, mut dedups) = mpsc::unbounded_channel();
        let deadline = tokio::time::Instant::now() + self.inner.operation_timeout;
        // How long the put waits for the record's home replica before it goes to the other two
        // (spec/replication.md §4, *Send* step 3): long enough for a loaded peer's fsync, short
        // enough that a down home leaves most of the operation's time.
        let home_wait = self.inner.operation_timeout / HOME_WAIT_DIVISOR;
        let mut home_deadline = None;
        let mut faults = Faults::default();
        loop {
            let answer = effects.answer.take();
            let (mut to_records, mut to_dedups) = (Vec::new(), Vec::new());
            for send in std::mem::take(&mut effects.sends) {
                match send {
                    SendOutgoing::Record(out) => to_records.push(out),
                    SendOutgoing::Dedup(out) => to_dedups.push(out),
                }
            }
            let listening = answer.is_none();
            self.dispatch(to_records, listening.then_some(&record_replies));
            self.dispatch_dedup(to_dedups, listening.then_some(&dedup_replies));
            if let Some(answer) = answer {
                return answer;
            }
            if op.waiting_for_home() {
                home_deadline.get_or_insert_with(|| tokio::time::Instant::now() + home_wait);
            } else {
                home_deadline = None;
            }
            effects = tokio::select! {
                // As in `run`: a reply that arrives with the deadline counts.
                biased;
                reply = records.recv() => {
                    let (from, round, heard): (NodeId, u32, Heard) =
                        reply.expect("the operation holds a sender of its own replies");
                    match heard {
                        Heard::Reply(reply) => op.on_record_reply(from, round, &reply),
                        Heard::Fault(key) | Heard::Overloaded(key)
                            if faults.no_quorum(&key, from) =>
                        {
                            op.on_timeout()
                        }
                        Heard::Fault(_) | Heard::Overloaded(_) => {
                            Effects { sends: Vec::new(), answer: None }
                        }
                    }
                }
                reply = dedups.recv() => {
                    let (from, round, reply): (NodeId, u32, DedupReply) =
                        reply.expect("the operation holds a sender of its own replies");
                    op.on_dedup_reply(from, round, &reply)
                }
                () = sleep_until_some(home_deadline), if home_deadline.is_some() => {
                    op.on_home_timeout()
                }
                () = tokio::time::sleep_until(deadline) => op.on_timeout(),
            };
        }
    }

    /// Sends requests about deduplication records as [`Cluster::dispatch`] sends message
    /// requests; the local replica takes them with this node's clock now.
    fn dispatch_dedup(
        &self,
        sends: Vec<DedupOutgoing>,
        replies: Option<&mpsc::UnboundedSender<(NodeId, u32, DedupReply)>>,
    ) {
        for out in sends {
            let replies = replies.cloned();
            let (from, round) = (out.to, out.round);
            if out.to == self.inner.me.node {
                let store = self.inner.store.clone();
                let entry = DedupEntry {
                    key: out.key,
                    request: out.request,
                    now: self.inner.me.clock.now(),
                    late_ms: self.inner.dedup_late_ms,
                };
                let cluster = self.clone();
                tokio::spawn(async move {
                    if let Some(mut answers) =
                        cluster.heard_locally(store.apply_dedups(vec![entry]).await)
                        && let (Some(replies), Some(reply)) = (replies, answers.pop())
                    {
                        let _ = replies.send((from, round, reply));
                    }
                });
            } else {
                let answered = self.inner.peers.send_dedup(out.to, out.key, out.request);
                let cluster = self.clone();
                tokio::spawn(async move {
                    if let Some(reply) = cluster.heard(from, answered.await)
                        && let Some(replies) = replies
                    {
                        let _ = replies.send((from, round, reply));
                    }
                });
            }
        }
    }

    /// Sends `sends`: to the local store directly, to peers through their links. Replies go to
    /// `replies` (an operation that still listens), tagged with their sender and round; a
    /// failure is silence, which the operation's quorum and deadline already account for.
    fn dispatch(
        &self,
        sends: Vec<Outgoing>,
        replies: Option<&mpsc::UnboundedSender<(NodeId, u32, Heard)>>,
    ) {
        for out in sends {
            let awaited = matches!(
                out.request,
                Request::Read | Request::Write { ack: true, .. }
            );
            let replies = replies.filter(|_| awaited).cloned();
            let (from, round) = (out.to, out.round);
            if out.to == self.inner.me.node {
                if self.join_state() != join::JoinState::Joined {
                    // Until it joins, this node's replica answers nothing (silence).
                    continue;
                }
                let store = self.inner.store.clone();
                let key = out.key.clone();
                let entry = Entry {
                    key: out.key,
                    request: out.request,
                };
                let cluster = self.clone();
                tokio::spawn(async move {
                    // Shed rather than queued when the store is overloaded: the two other
                    // replicas carry the operation (spec/replication.md#durability).
                    let answered = store.apply_or_shed(vec![entry]).await;
                    let overloaded = matches!(&answered, Err(error) if matches!(**error, StoreError::Overloaded { .. }));
                    let heard = match cluster.heard_locally(answered) {
                        Some(mut answers) => answers.pop().map(Heard::Reply),
                        None if overloaded => Some(Heard::Overloaded(key)),
                        None => Some(Heard::Fault(key)),
                    };
                    if let (Some(replies), Some(heard)) = (replies, heard) {
                        let _ = replies.send((from, round, heard));
                    }
                });
            } else {
                let key = out.key.clone();
                let answered = self.inner.peers.send(out.to, out.key, out.request);
                let cluster = self.clone();
                tokio::spawn(async move {
                    let answered = answered.await;
                    let faulted = matches!(answered, Ok(Err(PeerError::Store { .. })));
                    let overloaded = matches!(answered, Ok(Err(PeerError::Overloaded { .. })));
                    let heard = match cluster.heard(from, answered) {
                        Some(reply) => Some(Heard::Reply(reply)),
                        None if faulted => Some(Heard::Fault(key)),
                        None if overloaded => Some(Heard::Overloaded(key)),
                        None => None,
                    };
                    if let (Some(replies), Some(heard)) = (replies, heard) {
                        let _ = replies.send((from, round, heard));
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_owned_by_its_first_replica_that_is_not_taken_for_down() {
        let replicas = [NodeId(3), NodeId(1), NodeId(2)];
        assert_eq!(owner(&replicas, |_| false), Some(NodeId(3)));
        assert_eq!(owner(&replicas, |peer| peer == NodeId(3)), Some(NodeId(1)));
        assert_eq!(
            owner(&replicas, |peer| peer != NodeId(2)),
            Some(NodeId(2)),
            "the last replica up owns it"
        );
        assert_eq!(owner(&replicas, |_| true), None);
    }
}
