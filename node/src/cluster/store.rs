//! A replica's durable records (spec/replication.md#durability) and its local view of them.
//!
//! One committer owns the database. Batches of requests from any number of coordinators (this
//! node's and its peers') queue up for it; it takes every batch waiting, applies their requests
//! in order in one write transaction (each checked against the state that includes the requests
//! before it, spec/replication.md §13), commits once, and only then answers any of them: group
//! commit, with fsync before every ack and before every read answer. The fsync is the group log's
//! (spec/replication.md §14): the group's redo — every value it stored, every key it removed — is
//! appended to `replica.log` and synced before the B-tree transaction commits without a sync of
//! its own; a checkpoint every `CHECKPOINT_GROUPS` groups syncs the B-tree and lets the log start
//! again, and a start replays the log's entries after the last checkpoint. A failed commit answers
//! every batch of the group with the error, so nothing unsynced is ever acknowledged, and from
//! then on the store refuses everything, reads and scans included, with that first failure's
//! fault (`StoreFault`: a full disk is not corruption) until the node restarts and opens it again
//! (spec/replication.md#durability, *A store that fails*).
//!
//! The committer is an OS thread in production ([`ReplicaStore::open`]), so a commit's fsync
//! never stalls the runtime. [`ReplicaStore::open_files`] opens the database as
//! [`ReplicaStore::open`] does on any [`Files`] (the simulation's filesystem), and
//! [`ReplicaStore::open_backend`] puts the store on any redb backend; both run the same committer
//! as a task of the caller's runtime, for a runtime that is the whole machine (the simulation,
//! where a thread would run outside simulated time and disk).
//!
//! The local view indexes the live records this replica holds by queue, so a coordinator can
//! pick receive candidates without a network round; it is rebuilt from the records at open.
//!
//! Queue names' records (spec/replication.md §1) live in a table of their own and go through the
//! same committer: a name request of a batch is applied in order with the batch's message
//! requests, in the same transaction, and answered after the same fsync (a vote's reply too).
//! The name view ([`NameView`], §11) holds every name record this node knows: its replica's own
//! (loaded at open, updated after every commit) and the settled records its coordinator and its
//! peers' pushes bring. A record with a tombstone adds its incarnation to a durable list of
//! deleted incarnations in the same commit; a message write under a listed incarnation is
//! acknowledged and not stored, and [`ReplicaStore::drop_deleted`] removes what is left.
//!
//! Move tasks' records (spec/replication.md §8) live in a table of their own too, keyed by the
//! source queue and its incarnation, and go through the same committer and the same fsync; so do
//! deduplication records (spec/replication.md §4), written once per window.
//!
//! This module must never decide protocol questions: `trireme_replication::replica::accept`,
//! `trireme_replication::name::vote`, `trireme_replication::task::accept_task` and
//! `trireme_replication::dedup::accept` do.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageBackend,
    TableDefinition,
};
use thiserror::Error;
use tokio::sync::watch;
use tokio::sync::{mpsc, oneshot};
use trireme_core::{Incarnation, Millis, QueueName};
use trireme_replication::anti_entropy::Digest;
use trireme_replication::coordinator::{Reply, Request};
use trireme_replication::dedup::{
    self, DedupChange, DedupKey, DedupRecord, DedupReply, DedupRequest,
};
use trireme_replication::name::{NameRecord, NameReply, NameRequest, QueueIncarnation, vote};
use trireme_replication::placement::REPLICAS;
use trireme_replication::record::Record;
use trireme_replication::replica::{Verdict, accept};
use trireme_replication::task::{
    TaskKey, TaskRecord, TaskReply, TaskRequest, TaskVerdict, accept_task,
};
use trireme_replication::{NodeId, RecordKey};

use crate::clock::Clock;
use crate::codec::{self, CodecError};
use crate::files::{Files, OpenError, OsFiles, open_database};
use crate::metrics::StoreMetrics;

/// Records by stored key (`RecordKey::encode`), framed and checksummed by the codec.
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("replica_records");
/// Queue names' records by name, framed and checksummed by the codec (spec/replication.md §1).
const NAMES: TableDefinition<&str, &[u8]> = TableDefinition::new("replica_names");
/// Deduplication records by stored key (`DedupKey::encode`), framed and checksummed by the codec
/// (spec/replication.md §4).
const DEDUPS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("replica_dedup");
/// Move tasks' records by stored key (`TaskKey::encode`), framed and checksummed by the codec
/// (spec/replication.md §8).
const TASKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("replica_tasks");
/// Every deleted incarnation this node learned of (`deleted_key`), with its delete's time (u64
/// LE): the messages whose key names one are dropped, and stay dropped.
const DELETED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("replica_deleted_incarnations");
/// The replica's identity.
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("replica_meta");
const META_NODE_ID: &str = "node_id";
const META_DISK_ID: &str = "disk_id";
/// Whether this database has joined (spec/replication.md, *Stragglers and replacement*): `[0]`
/// from its creation until its node votes, `[1]` after. A database from before the key is one
/// that has served, and has joined.
const META_JOINED: &str = "joined";
/// Per peer, `peer_disk/<node>`: the disk its requests are accepted from and its predecessor's
/// last contact (trireme-replication `join::PeerDisk`, without the in-memory contact).
const META_PEER_DISK_PREFIX: &str = "peer_disk/";
/// The last group sequence the B-tree holds as of its last checkpoint (u64 LE; absent: 0):
/// a start replays the group log from the entry after it (spec/replication.md §14).
const META_LOG_SEQUENCE: &str = "log_sequence";

/// File name of the replica database in the data directory.
pub const REPLICA_DATABASE_FILE_NAME: &str = "replica.redb";
/// Where a new replica database is built before it is renamed into place.
const REPLICA_STAGING_FILE_NAME: &str = "replica.redb.new";
/// File name of the replica's group log in the data directory (spec/replication.md §14).
pub const REPLICA_LOG_FILE_NAME: &str = "replica.log";

/// Groups appended since the last checkpoint that make the next one due (spec/replication.md
/// §14, `CHECKPOINT_GROUPS`).
const CHECKPOINT_GROUPS: u64 = 1024;
/// Log bytes appended since the last checkpoint that make the next one due (§14,
/// `CHECKPOINT_BYTES`).
const CHECKPOINT_BYTES: u64 = 16 << 20;
/// Each member's turn to checkpoint, in milliseconds of its clock (§14, `CHECKPOINT_TURN`).
const CHECKPOINT_TURN_MS: u64 = 1_000;
/// How many times due a checkpoint is made outside this member's turn (§14,
/// `CHECKPOINT_OVERDUE`): what bounds the log, and the replay at start, when turns cannot work.
const CHECKPOINT_OVERDUE: u64 = 4;

/// Batches waiting for the committer; a full queue makes callers wait (backpressure), it never
/// drops a batch. Shedding callers ([`ReplicaStore::apply_or_shed`], a peer's batch) are refused
/// earlier, at the store's shedding bound (`limits::replica_batches_queued_max`).
const BATCHES_QUEUED_MAX: usize = 1_024;
const _: () = assert!(crate::limits::replica_batches_queued_max <= BATCHES_QUEUED_MAX);
/// Requests one group commit takes at most, so one commit's latency stays bounded.
const GROUP_REQUESTS_MAX: usize = 4_096;

/// Why the replica store failed. The cause keeps its type: a full disk is not corruption.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The database file could not be opened or created.
    #[error("cannot open the replica database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    /// A new database could not be put in place (staging file, rename, directory sync).
    #[error("cannot initialise the replica database at {path}: {source}")]
    Initialise {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The database belongs to another node id.
    #[error(
        "the replica database belongs to node {stored}, this node is configured as {configured}"
    )]
    WrongNode { stored: u16, configured: u16 },
    /// Storage failed underneath (I/O, including a full disk).
    #[error("replica storage failed: {0}")]
    Storage(#[from] redb::StorageError),
    /// A transaction could not begin.
    #[error("replica transaction failed: {0}")]
    Transaction(#[from] redb::TransactionError),
    /// A table could not be opened.
    #[error("replica table failed: {0}")]
    Table(#[from] redb::TableError),
    /// The commit failed: the group was not answered (it may be on the disk, in the group log or
    /// the database, and a start may bring it back: a write whose ack was lost).
    #[error("replica commit failed: {0}")]
    Commit(#[from] redb::CommitError),
    /// Durability could not be set.
    #[error("replica durability setting failed: {0}")]
    Durability(#[from] redb::SetDurabilityError),
    /// The group log could not be read, written or synced (spec/replication.md §14): a group
    /// whose entry failed is not acknowledged, and the store latches as after a failed commit.
    #[error("replica group log failed: {0}")]
    Log(#[source] std::io::Error),
    /// A stored record does not decode: corruption.
    #[error("replica record {key} is corrupt: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: CodecError,
    },
    /// redb refused the backend's contents (`ReplicaStore::open_backend`).
    #[error("cannot open the replica database on its backend: {0}")]
    Backend(#[source] redb::DatabaseError),
    /// The committer is gone (the store was closed or panicked).
    #[error("the replica store is closed")]
    Closed,
    /// The store failed earlier (the fault is the first failure's) and refuses every request,
    /// reads included, until the node restarts and opens it again (spec/replication.md
    /// #durability, *A store that fails*).
    #[error("the replica store refuses every request since it failed ({0}); restart the node")]
    Failed(StoreFault),
    /// The committer already has `queued_max` batches waiting or committing: a shedding caller's
    /// batch was not taken, and nothing of it applied (spec/replication.md#durability, *A
    /// replica that is overloaded*). Not a fault: the next batch may be taken.
    #[error("the replica store has {queued_max} batches waiting for its disk; it took nothing")]
    Overloaded { queued_max: usize },
}

pub use crate::fault::{FaultKind, StoreFault};
pub use view::{LocalView, PeekState};

#[cfg(test)]
mod crash_disk;
pub mod log;
use log::Log;
use trireme_replication::planted::{Bug, planted};
mod redo;
mod view;
use crate::fault::{disk_full, storage_kind as storage_fault};
use redo::{Redo, Table};

impl StoreError {
    /// The fault this error is, as a replica reports it (spec/replication.md#durability).
    #[must_use]
    pub fn fault(&self) -> StoreFault {
        let kind = match self {
            StoreError::Failed(first) => return first.clone(),
            StoreError::Closed => FaultKind::Closed,
            StoreError::Corrupt { .. } => FaultKind::Corrupt,
            StoreError::Storage(error)
            | StoreError::Commit(redb::CommitError::Storage(error))
            | StoreError::Transaction(redb::TransactionError::Storage(error))
            | StoreError::Table(redb::TableError::Storage(error)) => storage_fault(error),
            StoreError::Initialise { source, .. } | StoreError::Log(source)
                if disk_full(source) =>
            {
                FaultKind::DiskFull
            }
            _ => FaultKind::Io,
        };
        StoreFault {
            kind,
            detail: self.to_string(),
        }
    }
}

/// One request of a batch: the record it is about, and what is asked.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Which record.
    pub key: RecordKey,
    /// What is asked.
    pub request: Request,
}

/// One name request of a batch, to this node as the name's replica in `slot`.
#[derive(Clone, Debug)]
pub struct NameEntry {
    /// Which name.
    pub name: QueueName,
    /// This replica's place among the name's three (the vote slot it owns).
    pub slot: usize,
    /// What is asked: a read, a vote or a write (a push is [`ReplicaStore::learn`]).
    pub request: NameRequest,
}

/// A batch's answers: per message, name, task and deduplication request, in order.
pub type BatchAnswers = (Vec<Reply>, Vec<NameReply>, Vec<TaskReply>, Vec<DedupReply>);

/// One request of a batch about a move task's record (spec/replication.md §8).
#[derive(Clone, Debug)]
pub struct TaskEntry {
    /// Which record.
    pub key: TaskKey,
    /// What is asked.
    pub request: TaskRequest,
}

/// One deduplication request of a batch, with this replica's clock when the batch arrived
/// (spec/replication.md §4: the window's end and the late put's refusals are by the replica's
/// clock).
#[derive(Clone, Debug)]
pub struct DedupEntry {
    /// Which record.
    pub key: DedupKey,
    /// What is asked.
    pub request: DedupRequest,
    /// This replica's clock.
    pub now: Millis,
    /// `OP_TIMEOUT + SKEW_MAX`: a put older than this is refused.
    pub late_ms: u64,
}

enum Work {
    /// Requests of one batch, answered in order.
    Apply {
        entries: Vec<Entry>,
        names: Vec<NameEntry>,
        tasks: Vec<TaskEntry>,
        dedups: Vec<DedupEntry>,
    },
    /// Name records for the view: settled ones learned at `now` by this node's clock, or
    /// (`now: None`) copies of a replica's record that confirm nothing.
    Learn {
        records: Vec<(QueueName, NameRecord)>,
        now: Option<Millis>,
    },
    /// Message records of deleted incarnations to remove.
    Drop { keys: Vec<RecordKey> },
    /// The window's end (spec/replication.md §4, *WindowEnd*): held or void copies whose window
    /// ended at `now`, and deduplication records past their window and `late_ms`, to remove if
    /// they still are.
    Expire {
        copies: Vec<RecordKey>,
        dedups: Vec<DedupKey>,
        now: Millis,
        window_ms: u64,
        late_ms: u64,
    },
}

impl Work {
    fn len(&self) -> usize {
        match self {
            Work::Apply {
                entries,
                names,
                tasks,
                dedups,
            } => entries.len() + names.len() + tasks.len() + dedups.len(),
            Work::Learn { records, .. } => records.len(),
            Work::Drop { keys } => keys.len(),
            Work::Expire { copies, dedups, .. } => copies.len() + dedups.len(),
        }
    }
}

/// What one job is answered with: a reply per message request, per name request, per task
/// request and per deduplication request.
#[derive(Debug, Default)]
struct Answers {
    replies: Vec<Reply>,
    names: Vec<NameReply>,
    tasks: Vec<TaskReply>,
    dedups: Vec<DedupReply>,
}

struct Job {
    work: Work,
    answer: oneshot::Sender<Result<Answers, Arc<StoreError>>>,
    /// Counts the job among the store's queued batches until it is answered (dropped).
    _queued: Queued,
}

/// One batch counted in [`ReplicaStore`]'s `queued` from its submission until its job is
/// dropped, answered or not: the count is the batches waiting for or inside the committer.
struct Queued(Arc<AtomicUsize>);

impl Queued {
    fn count(queued: &Arc<AtomicUsize>) -> Queued {
        queued.fetch_add(1, Ordering::SeqCst);
        Queued(Arc::clone(queued))
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        assert!(before >= 1, "a queued batch is counted once");
    }
}

/// What the name view knows of one name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Viewed {
    /// The join of every copy of the name's record this node has seen.
    pub record: NameRecord,
    /// When (by this node's clock) a settled source last confirmed the record's live
    /// incarnation: a settled read or operation of this node, or a push. `None` when no settled
    /// source has, or a merge from an unsettled one changed the live incarnation since
    /// (spec/replication.md §11: such a record may be listed, never served as a hit).
    pub confirmed_at: Option<Millis>,
}

/// The local view of queue names (spec/replication.md §11), and the incarnations known deleted.
#[derive(Debug, Default)]
pub struct NameView {
    names: BTreeMap<QueueName, Viewed>,
    /// Deleted incarnations, by name.
    deleted: BTreeSet<(QueueName, Incarnation)>,
}

fn live_incarnation(record: &NameRecord) -> Option<QueueIncarnation> {
    record.live().map(|live| live.incarnation)
}

/// The incarnation a record's tombstone ends, if it holds one.
fn tombstoned(record: &NameRecord) -> Option<QueueIncarnation> {
    record.deleted_at?;
    record.decided().map(|decided| decided.incarnation)
}

impl NameView {
    /// What the view knows of `name`.
    #[must_use]
    pub fn get(&self, name: &QueueName) -> Option<&Viewed> {
        self.names.get(name)
    }

    /// The names with a live incarnation in the view, in name order.
    #[must_use]
    pub fn live_names(&self) -> Vec<QueueName> {
        self.names
            .iter()
            .filter(|(_, viewed)| viewed.record.live().is_some())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether the message key names an incarnation known deleted.
    #[must_use]
    pub fn is_deleted(&self, key: &RecordKey) -> bool {
        self.deleted.contains(&(key.queue.clone(), key.incarnation))
    }

    /// Whether any incarnation is known deleted.
    #[must_use]
    pub fn any_deleted(&self) -> bool {
        !self.deleted.is_empty()
    }

    /// This node's copy of the purge watermark of `name`'s `incarnation` (spec/replication.md
    /// §2): what the view's record holds while that incarnation is its epoch's, deleted or not.
    /// It may lag the replicas; it only ever grows.
    #[must_use]
    pub fn watermark(&self, name: &QueueName, incarnation: Incarnation) -> Option<Millis> {
        let record = &self.names.get(name)?.record;
        let decided = record.decided()?.incarnation;
        (decided == incarnation)
            .then_some(record.purge_watermark)
            .flatten()
    }

    /// Whether any name's record holds a purge watermark.
    #[must_use]
    pub fn any_purged(&self) -> bool {
        self.names
            .values()
            .any(|viewed| viewed.record.purge_watermark.is_some())
    }

    /// Merges `record` into the view; `settled_at` when it comes from a settled source. Returns
    /// whether the name's watermark rose (the sweep has records to mark).
    fn merge(&mut self, name: &QueueName, record: &NameRecord, settled_at: Option<Millis>) -> bool {
        if let Some(incarnation) = tombstoned(record) {
            self.deleted.insert((name.clone(), incarnation));
        }
        let viewed = self.names.entry(name.clone()).or_default();
        let before = live_incarnation(&viewed.record);
        let watermark_before = viewed.record.purge_watermark;
        viewed.record = viewed.record.merge(record);
        let purged = viewed.record.purge_watermark > watermark_before;
        let after = live_incarnation(&viewed.record);
        match settled_at {
            Some(now) if after.is_some() && after == live_incarnation(record) => {
                viewed.confirmed_at = Some(now);
            }
            _ if after != before => viewed.confirmed_at = None,
            _ => {}
        }
        purged
    }
}

/// The stored key of a deleted incarnation: name length (u8) and name, then the incarnation's
/// `hlc_ms` (u64 BE), node (u16 BE) and nonce (u64 BE).
fn deleted_key(name: &QueueName, incarnation: QueueIncarnation) -> Vec<u8> {
    let bytes = name.as_str().as_bytes();
    let mut key = Vec::with_capacity(1 + bytes.len() + 18);
    key.push(u8::try_from(bytes.len()).expect("queue names are at most 80 bytes"));
    key.extend_from_slice(bytes);
    key.extend_from_slice(&incarnation.hlc_ms.to_be_bytes());
    key.extend_from_slice(&incarnation.node.to_be_bytes());
    key.extend_from_slice(&incarnation.nonce.to_be_bytes());
    key
}

fn decode_deleted_key(key: &[u8]) -> Option<(QueueName, QueueIncarnation)> {
    let (&len, rest) = key.split_first()?;
    let (name, rest) = rest.split_at_checked(usize::from(len))?;
    let name = QueueName::try_from(String::from_utf8(name.to_vec()).ok()?).ok()?;
    let (hlc, rest) = rest.split_at_checked(8)?;
    let (node, nonce) = rest.split_at_checked(2)?;
    let incarnation = QueueIncarnation {
        hlc_ms: u64::from_be_bytes(hlc.try_into().ok()?),
        node: u16::from_be_bytes(node.try_into().ok()?),
        nonce: u64::from_be_bytes(nonce.try_into().ok()?),
    };
    (deleted_key(&name, incarnation) == key).then_some((name, incarnation))
}

/// One step of a bounded walk over the records.
#[derive(Debug)]
pub struct Walk {
    /// The records of the step that were selected, in key order.
    pub selected: Vec<(RecordKey, Record)>,
    /// The last stored key read (`None`: the walk reached the end).
    pub last: Option<Vec<u8>>,
}

/// The end of a replica store's life: the committer thread, which holds the database until
/// every clone of the store is gone.
pub struct StoreClosed {
    committer: std::thread::JoinHandle<()>,
}

impl StoreClosed {
    /// Blocks until the database is closed (its file can be opened again).
    ///
    /// # Panics
    /// If the committer thread panicked.
    pub fn wait(self) {
        self.committer
            .join()
            .expect("the replica committer does not panic");
    }
}

/// What the committer updates after each commit: the two views, and the count of deletions
/// learned (which wakes [`ReplicaStore::deletions`] watchers).
#[derive(Clone)]
struct Views {
    records: Arc<Mutex<LocalView>>,
    names: Arc<Mutex<NameView>>,
    deletions: watch::Sender<u64>,
    /// Bumped after each commit that raised a name's purge watermark in the view.
    purges: watch::Sender<u64>,
    /// The deduplication window and the clock its end is read from (spec/replication.md §4,
    /// *WindowEnd*), once the cluster has set them: a held or void copy written after its
    /// window's end is refused. Unset (a store nobody coordinates for), nothing is refused.
    dedup_window: Arc<OnceLock<DedupWindow>>,
    /// When this member may checkpoint (spec/replication.md §14, *Checkpoint*), once the cluster
    /// has set it. Unset (a store nobody coordinates for), a due checkpoint is made at once.
    checkpoint_turns: Arc<OnceLock<CheckpointTurns>>,
    /// The first failure, once a group failed: from then on the store refuses everything
    /// (spec/replication.md#durability: after a failed fsync nothing it holds counts as durable).
    failed: Arc<OnceLock<StoreFault>>,
    /// The group commits' count and time (an operator's figures).
    metrics: StoreMetrics,
}

/// What a replica needs to refuse a held or void copy after its window's end.
#[derive(Clone)]
pub struct DedupWindow {
    /// This node's clock.
    pub clock: Arc<dyn Clock>,
    /// `DEDUP_WINDOW`.
    pub window_ms: u64,
}

/// This member's turn to checkpoint among the cluster's members (spec/replication.md §14,
/// `CHECKPOINT_TURN`): checkpoints of different members fall in different turns, so a write,
/// which needs two acks of three, never waits for two checkpoints at once.
#[derive(Clone)]
pub struct CheckpointTurns {
    /// This node's clock.
    pub clock: Arc<dyn Clock>,
    /// This member's place among the members ordered by node id, from 0.
    pub position: u32,
    /// How many members take turns.
    pub members: u32,
}

impl CheckpointTurns {
    /// Whether a checkpoint may begin now: in the first half of this member's turn, so that one
    /// lasting less than half a turn ends within it.
    #[must_use]
    pub fn may_begin(&self) -> bool {
        may_begin_checkpoint(
            self.clock.now().0,
            self.position,
            self.members,
            CHECKPOINT_TURN_MS,
        )
    }
}

/// §14: whether the member at `position` of `members` may begin a checkpoint at `now_ms`, with
/// turns of `turn_ms`.
fn may_begin_checkpoint(now_ms: u64, position: u32, members: u32, turn_ms: u64) -> bool {
    assert!(position < members, "a member's position is below the count");
    let turn = now_ms / turn_ms;
    turn % u64::from(members) == u64::from(position) && now_ms % turn_ms < turn_ms / 2
}

/// Why a checkpoint was made (§14, *Checkpoint*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CheckpointReason {
    /// Due, and in this member's turn (or no cluster set turns).
    Due,
    /// `CHECKPOINT_OVERDUE` times due, whosever turn it is.
    Overdue,
}

/// The replica's store: cheap to clone, every clone feeds the one committer.
#[derive(Clone)]
pub struct ReplicaStore {
    jobs: mpsc::Sender<Job>,
    views: Views,
    disk_id: u64,
    /// Shared with the committer, for read-only scans (redb serialises writers, not readers).
    db: Arc<Database>,
    /// Whether scans run on the calling task rather than tokio's blocking pool: a store on a
    /// backend commits on the current runtime, and so does everything else it does.
    scans_inline: bool,
    /// Batches submitted and not yet answered (waiting for or inside the committer).
    queued: Arc<AtomicUsize>,
    /// From how many queued batches on shedding callers are refused `Overloaded`.
    shed_at: usize,
}

impl ReplicaStore {
    /// Opens (or creates) the replica database in `data_dir` for `node` with a page cache of
    /// `cache_bytes` (the node's `db_cache_mib`; redb's own default, 1 GiB, would make a member
    /// with a backlog hold 1 GiB of pages); a new database gets `new_disk_id` as its disk id.
    /// The second value resolves when the database is closed again (every clone of the store
    /// dropped and the last group committed).
    ///
    /// # Errors
    /// `Open` when the file cannot be opened; `WrongNode` when it belongs to another node;
    /// `Corrupt` when a stored record does not decode; the redb variants for I/O failures.
    pub fn open(
        data_dir: &Path,
        node: NodeId,
        new_disk_id: u64,
        cache_bytes: usize,
    ) -> Result<(ReplicaStore, StoreClosed), StoreError> {
        let mut builder = redb::Builder::new();
        builder.set_cache_size(cache_bytes);
        let db = open_replica_database(&OsFiles, data_dir, &builder, node, new_disk_id)?;
        let log_file = open_log_file(&OsFiles, data_dir)?;
        let (store, queue, log) =
            ReplicaStore::on_database(db, log_file, node, new_disk_id, false)?;
        let views = store.views.clone();
        let db = Arc::clone(&store.db);
        let committer = std::thread::Builder::new()
            .name(format!("replica-store-{}", node.0))
            .spawn(move || {
                let mut queue = queue;
                let mut durable = Durable::new(log);
                while let Some(first) = queue.blocking_recv() {
                    let group = take_group(first, &mut queue);
                    commit_group(&db, &mut durable, group, &views);
                }
                // The queue closes only when every store clone (each holds a sender and a
                // reference to the database) is gone, so this is the last reference: the file
                // closes here.
                drop(db);
            })
            .expect("the replica committer thread starts");
        Ok((store, StoreClosed { committer }))
    }

    /// Opens (or creates) the replica database on `backend` (e.g. a simulated disk) for `node`,
    /// as [`ReplicaStore::open`] does, with a page cache of `cache_bytes`, and its group log
    /// (spec/replication.md §14) on `log_file`. The committer runs as
    /// a task on the current tokio runtime and commits synchronously on it: every commit, with
    /// its fsync, holds that runtime's thread; so do the scans of [`ReplicaStore::scan_off`].
    /// The task ends (and the database closes) when every clone of the store is gone.
    ///
    /// # Errors
    /// `Backend` when redb refuses the backend's contents; otherwise as [`ReplicaStore::open`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn open_backend<B: StorageBackend>(
        backend: impl StorageBackend,
        log_file: B,
        cache_bytes: usize,
        node: NodeId,
        new_disk_id: u64,
    ) -> Result<(ReplicaStore, tokio::task::JoinHandle<()>), StoreError> {
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create_with_backend(backend)
            .map_err(StoreError::Backend)?;
        ReplicaStore::inline_on(db, log_file, node, new_disk_id)
    }

    /// Opens (or creates) the replica database in `data_dir` on `files` (e.g. a simulated
    /// filesystem) as [`ReplicaStore::open`] does on the operating system's — a new database
    /// built under a staging name and renamed into place ([`crate::files::open_database`]) —
    /// with a page cache of `cache_bytes`, and its committer as a task of the current runtime,
    /// as [`ReplicaStore::open_backend`].
    ///
    /// # Errors
    /// As [`ReplicaStore::open`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn open_files<F: Files>(
        files: &F,
        data_dir: &Path,
        cache_bytes: usize,
        node: NodeId,
        new_disk_id: u64,
    ) -> Result<(ReplicaStore, tokio::task::JoinHandle<()>), StoreError> {
        let mut builder = redb::Builder::new();
        builder.set_cache_size(cache_bytes);
        let db = open_replica_database(files, data_dir, &builder, node, new_disk_id)?;
        let log_file = open_log_file(files, data_dir)?;
        ReplicaStore::inline_on(db, log_file, node, new_disk_id)
    }

    /// The store on `db` with its committer as a task of the current runtime.
    fn inline_on<B: StorageBackend>(
        db: Database,
        log_file: B,
        node: NodeId,
        new_disk_id: u64,
    ) -> Result<(ReplicaStore, tokio::task::JoinHandle<()>), StoreError> {
        let (store, mut queue, log) =
            ReplicaStore::on_database(db, log_file, node, new_disk_id, true)?;
        let views = store.views.clone();
        let db = Arc::clone(&store.db);
        let committer = tokio::spawn(async move {
            let mut durable = Durable::new(log);
            while let Some(first) = queue.recv().await {
                let group = take_group(first, &mut queue);
                commit_group(&db, &mut durable, group, &views);
            }
        });
        Ok((store, committer))
    }

    /// The store on an open database, after its group log's replay (spec/replication.md §14,
    /// *Start*), the queue its committer takes jobs from, and the log it appends to.
    fn on_database<B: StorageBackend>(
        db: Database,
        log_file: B,
        node: NodeId,
        new_disk_id: u64,
        scans_inline: bool,
    ) -> Result<(ReplicaStore, mpsc::Receiver<Job>, Log<B>), StoreError> {
        let disk_id = identify(&db, node, new_disk_id)?;
        let log = replay_log(&db, log_file, disk_id)?;
        let views = Views {
            records: Arc::new(Mutex::new(rebuild_view(&db)?)),
            names: Arc::new(Mutex::new(rebuild_name_view(&db)?)),
            deletions: watch::Sender::new(0),
            purges: watch::Sender::new(0),
            dedup_window: Arc::new(OnceLock::new()),
            checkpoint_turns: Arc::new(OnceLock::new()),
            failed: Arc::new(OnceLock::new()),
            metrics: StoreMetrics::default(),
        };
        views
            .metrics
            .set_records(db.begin_read()?.open_table(RECORDS)?.len()?);
        let (jobs, queue) = mpsc::channel(BATCHES_QUEUED_MAX);
        Ok((
            ReplicaStore {
                jobs,
                views,
                disk_id,
                db: Arc::new(db),
                scans_inline,
                queued: Arc::new(AtomicUsize::new(0)),
                shed_at: crate::limits::replica_batches_queued_max,
            },
            queue,
            log,
        ))
    }

    /// This store with shedding callers refused from `batches` queued batches on (at least 1, at
    /// most the queue's own bound) instead of `limits::replica_batches_queued_max`. Set before
    /// the store is cloned: each clone keeps the bound it was made with.
    ///
    /// # Panics
    /// When `batches` is 0 or beyond the queue's bound.
    #[must_use]
    pub fn shedding_at(mut self, batches: usize) -> ReplicaStore {
        assert!(batches >= 1);
        assert!(batches <= BATCHES_QUEUED_MAX);
        self.shed_at = batches;
        self
    }

    /// Whether a shedding caller's batch would be refused now: the committer has as many
    /// batches as the store sheds at (spec/replication.md#durability, *A replica that is
    /// overloaded*).
    #[must_use]
    pub fn overloaded(&self) -> bool {
        self.queued.load(Ordering::SeqCst) >= self.shed_at
    }

    /// Sets the deduplication window this replica refuses late held and void copies by (once;
    /// a second call keeps the first).
    pub fn set_dedup_window(&self, window: DedupWindow) {
        let _ = self.views.dedup_window.set(window);
    }

    /// Sets this member's turn to checkpoint (once; a second call keeps the first). Until it is
    /// set, a due checkpoint is made at once.
    pub fn set_checkpoint_turns(&self, turns: CheckpointTurns) {
        let _ = self.views.checkpoint_turns.set(turns);
    }

    /// Runs `scan` (reads of this store, which block on the disk) off the async tasks: on
    /// tokio's blocking pool for a store on a file, whose committer is a thread of its own; on
    /// the calling task for a store on a backend ([`ReplicaStore::open_backend`]), whose
    /// committer already commits on the current runtime. Under the simulation a thread the
    /// runtime does not schedule would let real time decide when a scan's answer comes (the
    /// same seed gave two traces), and turmoil's filesystem is reachable only from its host's
    /// thread.
    ///
    /// # Panics
    /// When `scan` panics.
    pub async fn scan_off<T: Send + 'static>(
        &self,
        scan: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        if self.scans_inline {
            return scan();
        }
        tokio::task::spawn_blocking(scan)
            .await
            .expect("a store scan does not panic")
    }

    /// A read transaction, refused once the store failed: its page cache could still show what
    /// a failed group wrote (spec/replication.md#durability).
    fn read_txn(&self) -> Result<redb::ReadTransaction, StoreError> {
        if let Some(first) = self.views.failed.get() {
            return Err(StoreError::Failed(first.clone()));
        }
        Ok(self.db.begin_read()?)
    }

    /// The group commits' count and time, and the message records held after the latest.
    #[must_use]
    pub fn metrics(&self) -> &StoreMetrics {
        &self.views.metrics
    }

    /// The first failure of this store, if it failed (it then refuses everything until the
    /// node restarts).
    #[must_use]
    pub fn failure(&self) -> Option<StoreFault> {
        self.views.failed.get().cloned()
    }

    /// This replica's disk id.
    #[must_use]
    pub fn disk_id(&self) -> u64 {
        self.disk_id
    }

    /// Whether this database has joined its cluster (it is not new, or its node has voted).
    ///
    /// # Errors
    /// The redb variants for I/O failures.
    pub fn joined(&self) -> Result<bool, StoreError> {
        let txn = self.read_txn()?;
        let meta = txn.open_table(META)?;
        Ok(meta
            .get(META_JOINED)?
            .is_none_or(|value| value.value() != [0_u8].as_slice()))
    }

    /// Records durably that this database has joined: its node votes from now on.
    ///
    /// # Errors
    /// The redb variants for I/O failures.
    pub fn set_joined(&self) -> Result<(), StoreError> {
        self.write_meta(META_JOINED, &[1])
    }

    /// The peers' disks as persisted: node, disk id, predecessor's last contact.
    ///
    /// # Errors
    /// `Corrupt` for an entry that does not decode; the redb variants for I/O failures.
    pub fn peer_disks(&self) -> Result<Vec<(NodeId, u64, Option<Millis>)>, StoreError> {
        let txn = self.read_txn()?;
        let meta = txn.open_table(META)?;
        let mut disks = Vec::new();
        for entry in meta.range(META_PEER_DISK_PREFIX..)? {
            let (key, value) = entry?;
            let Some(node) = key.value().strip_prefix(META_PEER_DISK_PREFIX) else {
                break;
            };
            let corrupt = |source| StoreError::Corrupt {
                key: key.value().to_owned(),
                source,
            };
            let (disk_id, predecessor): (u64, Option<u64>) =
                codec::decode_framed(value.value()).map_err(corrupt)?;
            let node = node.parse::<u16>().map_err(|_| StoreError::Corrupt {
                key: key.value().to_owned(),
                source: CodecError::Malformed {
                    reason: "the peer's node id is not a number".to_owned(),
                },
            })?;
            disks.push((NodeId(node), disk_id, predecessor.map(Millis)));
        }
        Ok(disks)
    }

    /// Persists what this node knows of `node`'s disk (durably, before it is relied on).
    ///
    /// # Errors
    /// The redb variants for I/O failures.
    pub fn save_peer_disk(
        &self,
        node: NodeId,
        disk_id: u64,
        predecessor_heard: Option<Millis>,
    ) -> Result<(), StoreError> {
        let value = codec::encode_framed(&(disk_id, predecessor_heard.map(|at| at.0)));
        self.write_meta(&format!("{META_PEER_DISK_PREFIX}{}", node.0), &value)
    }

    /// Commits one metadata entry durably. Its commit is a commit of this store like a
    /// group's: a failed one latches the store's fault (spec/replication.md#durability), so
    /// the store refuses everything after it and `failure` names it, and a store that failed
    /// writes nothing more.
    fn write_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        if let Some(first) = self.views.failed.get() {
            return Err(StoreError::Failed(first.clone()));
        }
        let commit = || -> Result<(), StoreError> {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            txn.open_table(META)?.insert(key, value)?;
            txn.commit()?;
            Ok(())
        };
        let committed = commit();
        if let Err(error) = &committed {
            let fault = error.fault();
            tracing::error!(%fault, key, "replica metadata commit failed; the store refuses everything until the node restarts");
            let _ = self.views.failed.set(fault);
        }
        committed
    }

    /// Applies `entries` in order and answers each, after the fsync that makes them durable.
    ///
    /// # Errors
    /// The store's error when the group's commit failed (nothing of it is durable, nothing is
    /// acknowledged), or `Closed`.
    pub async fn apply(&self, entries: Vec<Entry>) -> Result<Vec<Reply>, Arc<StoreError>> {
        let answers = self
            .submit(Work::Apply {
                entries,
                names: Vec::new(),
                tasks: Vec::new(),
                dedups: Vec::new(),
            })
            .await?;
        Ok(answers.replies)
    }

    /// As [`ReplicaStore::apply`], but refused at once, with nothing applied, when the store
    /// is overloaded instead of waiting for room: a coordinator's own replica under its clients'
    /// operations, which the two other replicas can carry (spec/replication.md#durability).
    ///
    /// # Errors
    /// `Overloaded` when the store is; otherwise as [`ReplicaStore::apply`].
    pub async fn apply_or_shed(&self, entries: Vec<Entry>) -> Result<Vec<Reply>, Arc<StoreError>> {
        if self.overloaded() {
            return Err(Arc::new(StoreError::Overloaded {
                queued_max: self.shed_at,
            }));
        }
        self.apply(entries).await
    }

    /// Applies name requests in order and answers each, after the fsync that makes them
    /// durable (spec/replication.md §1: a replica fsyncs its vote before it replies).
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn apply_names(
        &self,
        names: Vec<NameEntry>,
    ) -> Result<Vec<NameReply>, Arc<StoreError>> {
        let answers = self
            .submit(Work::Apply {
                entries: Vec::new(),
                names,
                tasks: Vec::new(),
                dedups: Vec::new(),
            })
            .await?;
        Ok(answers.names)
    }

    /// Applies move tasks' record requests in order and answers each, after the fsync that makes
    /// them durable.
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn apply_tasks(
        &self,
        tasks: Vec<TaskEntry>,
    ) -> Result<Vec<TaskReply>, Arc<StoreError>> {
        let answers = self
            .submit(Work::Apply {
                entries: Vec::new(),
                names: Vec::new(),
                tasks,
                dedups: Vec::new(),
            })
            .await?;
        Ok(answers.tasks)
    }

    /// Applies deduplication requests in order and answers each, after the fsync that makes
    /// them durable (spec/replication.md §4: a put's reply follows its fsync).
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn apply_dedups(
        &self,
        dedups: Vec<DedupEntry>,
    ) -> Result<Vec<DedupReply>, Arc<StoreError>> {
        let answers = self
            .submit(Work::Apply {
                entries: Vec::new(),
                names: Vec::new(),
                tasks: Vec::new(),
                dedups,
            })
            .await?;
        Ok(answers.dedups)
    }

    /// Applies a peer's batch: its message requests, then its name requests, then its task
    /// requests, then its deduplication requests, in one group, and answers each after the
    /// fsync.
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn apply_batch(
        &self,
        entries: Vec<Entry>,
        names: Vec<NameEntry>,
        tasks: Vec<TaskEntry>,
        dedups: Vec<DedupEntry>,
    ) -> Result<BatchAnswers, Arc<StoreError>> {
        let answers = self
            .submit(Work::Apply {
                entries,
                names,
                tasks,
                dedups,
            })
            .await?;
        Ok((
            answers.replies,
            answers.names,
            answers.tasks,
            answers.dedups,
        ))
    }

    /// The deduplication records this replica stores (live or expired), in key order, those
    /// passing `select` only: those after the stored key `after` (`None`: from the first), at
    /// most `limit`; and whether more follow (inspection, anti-entropy, the window's end).
    /// Blocking: call it off the async runtime.
    ///
    /// # Errors
    /// The redb variants when the scan fails; `Corrupt` for a row that does not decode.
    pub fn dedup_records(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        mut select: impl FnMut(&DedupKey, &DedupRecord) -> bool,
    ) -> Result<(Vec<(DedupKey, DedupRecord)>, bool), StoreError> {
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let txn = self.read_txn()?;
        let table = txn.open_table(DEDUPS)?;
        let mut records = Vec::new();
        for row in table.range::<&[u8]>((lower, Bound::Unbounded))? {
            let (key, value) = row?;
            let (key, record) = decode_dedup_row(key.value(), value.value())?;
            if select(&key, &record) {
                if records.len() == limit {
                    return Ok((records, true));
                }
                records.push((key, record));
            }
        }
        Ok((records, false))
    }

    /// The anti-entropy digest of the deduplication records passing `select`. Blocking.
    ///
    /// # Errors
    /// As [`ReplicaStore::dedup_records`].
    pub fn dedup_digest(
        &self,
        mut select: impl FnMut(&DedupKey, &DedupRecord) -> bool,
    ) -> Result<Digest, StoreError> {
        let txn = self.read_txn()?;
        let table = txn.open_table(DEDUPS)?;
        let mut digest = Digest::default();
        for row in table.iter()? {
            let (key, value) = row?;
            let (key, record) = decode_dedup_row(key.value(), value.value())?;
            if select(&key, &record) {
                digest.add_dedup(&key, &record);
            }
        }
        Ok(digest)
    }

    /// Move tasks' records this replica holds, in key order, those passing `select` only: those
    /// after the stored key `after` (`None`: from the first), at most `limit`; and whether more
    /// follow. Blocking: call it off the async runtime.
    ///
    /// # Errors
    /// The redb variants when the scan fails; `Corrupt` for a record that does not decode.
    pub fn task_records(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        mut select: impl FnMut(&TaskKey, &TaskRecord) -> bool,
    ) -> Result<(Vec<(TaskKey, TaskRecord)>, bool), StoreError> {
        let txn = self.read_txn()?;
        let table = txn.open_table(TASKS)?;
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut page = Vec::new();
        for row in table.range::<&[u8]>((lower, Bound::Unbounded))? {
            let (key, value) = row?;
            let (key, record) = decode_task_row(key.value(), value.value())?;
            if select(&key, &record) {
                if page.len() == limit {
                    return Ok((page, true));
                }
                page.push((key, record));
            }
        }
        Ok((page, false))
    }

    /// Merges settled name records into the name view at `now` (this node's clock), making any
    /// deletion they show durable in the deleted list first. Returns once that is committed.
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn learn(
        &self,
        records: Vec<(QueueName, NameRecord)>,
        now: Millis,
    ) -> Result<(), Arc<StoreError>> {
        let now = Some(now);
        self.submit(Work::Learn { records, now }).await?;
        Ok(())
    }

    /// Merges other replicas' name records into the name view (the catalog's anti-entropy,
    /// spec/replication.md §11): they may list a name but confirm nothing. Deletions they show
    /// are made durable as [`ReplicaStore::learn`] does.
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn learn_unsettled(
        &self,
        records: Vec<(QueueName, NameRecord)>,
    ) -> Result<(), Arc<StoreError>> {
        self.submit(Work::Learn { records, now: None }).await?;
        Ok(())
    }

    /// The anti-entropy digest of the name view's records passing `select`.
    #[must_use]
    pub fn view_digest(&self, select: impl Fn(&QueueName) -> bool) -> Digest {
        self.names(|view| {
            let mut digest = Digest::default();
            for (name, viewed) in &view.names {
                if select(name) {
                    digest.add_name(name, &viewed.record);
                }
            }
            digest
        })
    }

    /// Removes the message records of `keys` whose incarnation is known deleted (others are
    /// kept); returns how many were removed.
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn drop_deleted(&self, keys: Vec<RecordKey>) -> Result<usize, Arc<StoreError>> {
        let answers = self.submit(Work::Drop { keys }).await?;
        Ok(answers.replies.len())
    }

    /// Removes, as of `now`, the held or void copies among `copies` whose window ended and the
    /// deduplication records among `dedups` past their window and `late_ms` (spec/replication.md
    /// §4, *WindowEnd*), each only if it still is so; returns how many of each were removed.
    ///
    /// # Errors
    /// As [`ReplicaStore::apply`].
    pub async fn expire(
        &self,
        copies: Vec<RecordKey>,
        dedups: Vec<DedupKey>,
        now: Millis,
        window_ms: u64,
        late_ms: u64,
    ) -> Result<(usize, usize), Arc<StoreError>> {
        let answers = self
            .submit(Work::Expire {
                copies,
                dedups,
                now,
                window_ms,
                late_ms,
            })
            .await?;
        Ok((answers.replies.len(), answers.dedups.len()))
    }

    async fn submit(&self, work: Work) -> Result<Answers, Arc<StoreError>> {
        if let Some(first) = self.views.failed.get() {
            return Err(Arc::new(StoreError::Failed(first.clone())));
        }
        let (answer, answered) = oneshot::channel();
        let queued = Queued::count(&self.queued);
        self.jobs
            .send(Job {
                work,
                answer,
                _queued: queued,
            })
            .await
            .map_err(|_| Arc::new(StoreError::Closed))?;
        answered.await.map_err(|_| Arc::new(StoreError::Closed))?
    }

    /// A counter of the deletions this store learned, bumped after each commit that learned
    /// one: a watcher wakes to drop their messages.
    #[must_use]
    pub fn deletions(&self) -> watch::Receiver<u64> {
        self.views.deletions.subscribe()
    }

    /// A counter of the purge watermarks the name view learned, bumped after each commit that
    /// raised one: a watcher wakes to mark the records it hides (spec/replication.md §2,
    /// *Sweep*).
    #[must_use]
    pub fn purges(&self) -> watch::Receiver<u64> {
        self.views.purges.subscribe()
    }

    /// Every name record this replica holds, in name order (inspection, convergence checks and
    /// anti-entropy's pages), those passing `select` only. Blocking: call it off the async
    /// runtime for more than a handful of names.
    ///
    /// # Errors
    /// The redb variants when the scan fails; `Corrupt` for a record that does not decode.
    pub fn name_records(
        &self,
        after: Option<&QueueName>,
        limit: usize,
        mut select: impl FnMut(&QueueName) -> bool,
    ) -> Result<(Vec<(QueueName, NameRecord)>, bool), StoreError> {
        let txn = self.read_txn()?;
        let table = txn.open_table(NAMES)?;
        let lower = after.map_or(Bound::Unbounded, |after| Bound::Excluded(after.as_str()));
        let mut page = Vec::new();
        for row in table.range::<&str>((lower, Bound::Unbounded))? {
            let (name, value) = row?;
            let (name, record) = decode_name_row(name.value(), value.value())?;
            if select(&name) {
                if page.len() == limit {
                    return Ok((page, true));
                }
                page.push((name, record));
            }
        }
        Ok((page, false))
    }

    /// The anti-entropy digest of every name record passing `shared`. Blocking.
    ///
    /// # Errors
    /// As [`ReplicaStore::name_records`].
    pub fn name_digest(&self, shared: impl Fn(&QueueName) -> bool) -> Result<Digest, StoreError> {
        let txn = self.read_txn()?;
        let table = txn.open_table(NAMES)?;
        let mut digest = Digest::default();
        for row in table.iter()? {
            let (name, value) = row?;
            let (name, record) = decode_name_row(name.value(), value.value())?;
            if shared(&name) {
                digest.add_name(&name, &record);
            }
        }
        Ok(digest)
    }

    /// Runs `f` on the name view.
    pub fn names<T>(&self, f: impl FnOnce(&NameView) -> T) -> T {
        f(&self
            .views
            .names
            .lock()
            .expect("the name view lock is never poisoned: updates do not panic"))
    }

    /// The records of `keys` this replica holds, in the order of `keys` (one without a record
    /// here is left out). Blocking: call it off the async runtime.
    ///
    /// # Errors
    /// The redb variants when the read fails; `Corrupt` for a record that does not decode.
    pub fn read(&self, keys: &[RecordKey]) -> Result<Vec<(RecordKey, Record)>, StoreError> {
        let txn = self.read_txn()?;
        let table = txn.open_table(RECORDS)?;
        let mut records = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(value) = table.get(key.encode().as_slice())? {
                let record =
                    codec::decode_framed(value.value()).map_err(|source| StoreError::Corrupt {
                        key: format!("{key:?}"),
                        source,
                    })?;
                records.push((key.clone(), record));
            }
        }
        Ok(records)
    }

    /// Every record this replica holds, in key order (inspection and convergence checks).
    ///
    /// # Errors
    /// The redb variants when the scan fails; `Corrupt` for a record that does not decode.
    pub fn records(&self) -> Result<Vec<(RecordKey, Record)>, StoreError> {
        let txn = self.read_txn()?;
        let table = txn.open_table(RECORDS)?;
        let mut records = Vec::new();
        for row in table.iter()? {
            let (key, value) = row?;
            let record_key = RecordKey::decode(key.value()).ok_or_else(|| StoreError::Corrupt {
                key: format!("{:?}", key.value()),
                source: CodecError::Malformed {
                    reason: "not a record key".to_owned(),
                },
            })?;
            let record =
                codec::decode_framed(value.value()).map_err(|source| StoreError::Corrupt {
                    key: format!("{record_key:?}"),
                    source,
                })?;
            records.push((record_key, record));
        }
        Ok(records)
    }

    /// The anti-entropy digest of every non-empty partition from `first` to `last` (inclusive),
    /// over the records whose key passes `shared` (spec/replication.md#read-repair-and-anti-entropy:
    /// only what both replicas of a pair hold). Reads only what was committed, so only what
    /// was fsynced. Blocking: call it off the async runtime.
    ///
    /// # Errors
    /// The redb variants when the scan fails; `Corrupt` for a row that does not decode.
    pub fn digests(
        &self,
        first: u16,
        last: u16,
        shared: impl Fn(&RecordKey) -> bool,
    ) -> Result<BTreeMap<u16, Digest>, StoreError> {
        assert!(first <= last, "a partition range runs forwards");
        let start = first.to_be_bytes();
        let end = last.checked_add(1).map(u16::to_be_bytes);
        let txn = self.read_txn()?;
        let table = txn.open_table(RECORDS)?;
        let upper = match &end {
            Some(end) => Bound::Excluded(end.as_slice()),
            None => Bound::Unbounded,
        };
        let mut digests: BTreeMap<u16, Digest> = BTreeMap::new();
        for row in table.range::<&[u8]>((Bound::Included(start.as_slice()), upper))? {
            let (key, value) = row?;
            let (key, record) = decode_row(key.value(), value.value())?;
            if shared(&key) {
                digests
                    .entry(key.partition())
                    .or_default()
                    .add(&key, &record);
            }
        }
        Ok(digests)
    }

    /// One page of `partition`'s records whose key passes `shared`, in key order: those after
    /// the stored key `after` (`None`: from the start) and up to `through` (inclusive; `None`:
    /// to the partition's end), at most `limit` of them and about `bytes_max` of stored bytes
    /// (always at least one). The second value says whether the range holds more. Blocking:
    /// call it off the async runtime.
    ///
    /// # Errors
    /// As [`ReplicaStore::digests`].
    pub fn partition_page(
        &self,
        partition: u16,
        after: Option<&[u8]>,
        through: Option<&[u8]>,
        limit: usize,
        bytes_max: usize,
        shared: impl Fn(&RecordKey) -> bool,
    ) -> Result<(Vec<(RecordKey, Record)>, bool), StoreError> {
        assert!(limit > 0, "a page holds at least one record");
        let start = partition.to_be_bytes();
        let end = partition.checked_add(1).map(u16::to_be_bytes);
        let lower = match after {
            Some(after) => Bound::Excluded(after),
            None => Bound::Included(start.as_slice()),
        };
        let upper = match (through, &end) {
            (Some(through), _) => Bound::Included(through),
            (None, Some(end)) => Bound::Excluded(end.as_slice()),
            (None, None) => Bound::Unbounded,
        };
        let txn = self.read_txn()?;
        let table = txn.open_table(RECORDS)?;
        let mut page = Vec::new();
        let mut bytes = 0;
        for row in table.range::<&[u8]>((lower, upper))? {
            let (key, value) = row?;
            if page.len() == limit || (bytes >= bytes_max && !page.is_empty()) {
                return Ok((page, true));
            }
            let (key, record) = decode_row(key.value(), value.value())?;
            if shared(&key) {
                bytes += value.value().len();
                page.push((key, record));
            }
        }
        Ok((page, false))
    }

    /// Up to `rows_max` rows after the stored key `after` (`None`: from the first), and of
    /// them the records `select` keeps. The collector's bounded walk over the records. Blocking:
    /// call it off the async runtime.
    ///
    /// # Errors
    /// As [`ReplicaStore::digests`].
    pub fn scan(
        &self,
        after: Option<&[u8]>,
        rows_max: usize,
        mut select: impl FnMut(&RecordKey, &Record) -> bool,
    ) -> Result<Walk, StoreError> {
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let txn = self.read_txn()?;
        let table = txn.open_table(RECORDS)?;
        let mut selected = Vec::new();
        let mut last = None;
        for (rows, row) in table.range::<&[u8]>((lower, Bound::Unbounded))?.enumerate() {
            if rows == rows_max {
                return Ok(Walk { selected, last });
            }
            let (key, value) = row?;
            last = Some(key.value().to_vec());
            let (key, record) = decode_row(key.value(), value.value())?;
            if select(&key, &record) {
                selected.push((key, record));
            }
        }
        Ok(Walk {
            selected,
            last: None,
        })
    }

    /// Runs `f` on the local view.
    pub fn view<T>(&self, f: impl FnOnce(&LocalView) -> T) -> T {
        f(&self
            .views
            .records
            .lock()
            .expect("the view lock is never poisoned: updates do not panic"))
    }

    /// Runs `f` on the local view, which it may change: [`LocalView::candidates`] promotes what
    /// became visible since its last call.
    pub fn view_mut<T>(&self, f: impl FnOnce(&mut LocalView) -> T) -> T {
        f(&mut self
            .views
            .records
            .lock()
            .expect("the view lock is never poisoned: updates do not panic"))
    }
}

fn decode_name_row(name: &str, value: &[u8]) -> Result<(QueueName, NameRecord), StoreError> {
    let corrupt = |source| StoreError::Corrupt {
        key: format!("name {name:?}"),
        source,
    };
    let queue = QueueName::try_from(name.to_owned()).map_err(|_| {
        corrupt(CodecError::Malformed {
            reason: "not a queue name".to_owned(),
        })
    })?;
    let record = codec::decode_framed(value).map_err(corrupt)?;
    Ok((queue, record))
}

/// A stored row of a byte-keyed table: its key by `decode` (`None`: not such a key, named
/// `what` in the error) and its framed value; either failing is corruption.
fn decode_keyed<K: std::fmt::Debug, V: serde::de::DeserializeOwned>(
    key: &[u8],
    value: &[u8],
    what: &str,
    decode: impl FnOnce(&[u8]) -> Option<K>,
) -> Result<(K, V), StoreError> {
    let decoded = decode(key).ok_or_else(|| StoreError::Corrupt {
        key: format!("{what} {key:?}"),
        source: CodecError::Malformed {
            reason: format!("not a {what} key"),
        },
    })?;
    let record = codec::decode_framed(value).map_err(|source| StoreError::Corrupt {
        key: format!("{decoded:?}"),
        source,
    })?;
    Ok((decoded, record))
}

fn decode_dedup_row(key: &[u8], value: &[u8]) -> Result<(DedupKey, DedupRecord), StoreError> {
    decode_keyed(key, value, "deduplication", DedupKey::decode)
}

fn decode_task_row(key: &[u8], value: &[u8]) -> Result<(TaskKey, TaskRecord), StoreError> {
    decode_keyed(key, value, "task", TaskKey::decode)
}

fn decode_row(key: &[u8], value: &[u8]) -> Result<(RecordKey, Record), StoreError> {
    decode_keyed(key, value, "record", RecordKey::decode)
}

/// Opens the replica database in `data_dir` on `files`, creating it atomically if missing, as
/// `Storage::open_path` does for the queue database: built and fsynced (with its node and disk
/// id) under a staging name, then renamed into place and the directory synced. redb writes its
/// magic number last, so a crash during the first start would otherwise leave a `replica.redb` no
/// later start can open; now it leaves at most a staging file, which the next start removes.
fn open_replica_database<F: Files>(
    files: &F,
    data_dir: &Path,
    builder: &redb::Builder,
    node: NodeId,
    new_disk_id: u64,
) -> Result<Database, StoreError> {
    open_database(
        files,
        data_dir,
        REPLICA_DATABASE_FILE_NAME,
        REPLICA_STAGING_FILE_NAME,
        builder,
        |db| identify(&db, node, new_disk_id).map(drop),
    )
    .map_err(|error| match error {
        OpenError::Io { path, source } => StoreError::Initialise { path, source },
        OpenError::Database { path, source } => StoreError::Open { path, source },
        OpenError::Initialise(error) => error,
    })
}

fn identify(db: &Database, node: NodeId, new_disk_id: u64) -> Result<u64, StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let disk_id = {
        let mut meta = txn.open_table(META)?;
        let stored_node = meta
            .get(META_NODE_ID)?
            .map(|value| u16::from_le_bytes(value.value().try_into().unwrap_or([0xff, 0xff])));
        match stored_node {
            Some(stored) if stored != node.0 => {
                return Err(StoreError::WrongNode {
                    stored,
                    configured: node.0,
                });
            }
            Some(_) => {}
            None => {
                meta.insert(META_NODE_ID, node.0.to_le_bytes().as_slice())?;
                meta.insert(META_DISK_ID, new_disk_id.to_le_bytes().as_slice())?;
                meta.insert(META_JOINED, [0_u8].as_slice())?;
            }
        }
        let disk = meta
            .get(META_DISK_ID)?
            .map(|value| u64::from_le_bytes(value.value().try_into().unwrap_or([0; 8])));
        disk.unwrap_or(new_disk_id)
    };
    txn.open_table(RECORDS)?;
    txn.open_table(NAMES)?;
    txn.open_table(DELETED)?;
    txn.open_table(TASKS)?;
    txn.open_table(DEDUPS)?;
    txn.commit()?;
    Ok(disk_id)
}

fn rebuild_view(db: &Database) -> Result<LocalView, StoreError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(RECORDS)?;
    let mut view = LocalView::default();
    for row in table.iter()? {
        let (key, value) = row?;
        let Some(record_key) = RecordKey::decode(key.value()) else {
            return Err(StoreError::Corrupt {
                key: format!("{:?}", key.value()),
                source: CodecError::Malformed {
                    reason: "not a record key".to_owned(),
                },
            });
        };
        let record: Record =
            codec::decode_framed(value.value()).map_err(|source| StoreError::Corrupt {
                key: format!("{record_key:?}"),
                source,
            })?;
        view.update(&record_key, Some(&record));
    }
    Ok(view)
}

/// The name view as the stored name records and deleted list make it.
fn rebuild_name_view(db: &Database) -> Result<NameView, StoreError> {
    let txn = db.begin_read()?;
    let mut view = NameView::default();
    let names = txn.open_table(NAMES)?;
    for row in names.iter()? {
        let (name, value) = row?;
        let (name, record) = decode_name_row(name.value(), value.value())?;
        view.merge(&name, &record, None);
    }
    let deleted = txn.open_table(DELETED)?;
    for row in deleted.iter()? {
        let (key, _) = row?;
        let (name, incarnation) =
            decode_deleted_key(key.value()).ok_or_else(|| StoreError::Corrupt {
                key: format!("deleted incarnation {:?}", key.value()),
                source: CodecError::Malformed {
                    reason: "not a deleted incarnation's key".to_owned(),
                },
            })?;
        view.deleted.insert((name, incarnation));
    }
    Ok(view)
}

/// `first` and every job waiting behind it, up to `GROUP_REQUESTS_MAX` requests: one group.
fn take_group(first: Job, queue: &mut mpsc::Receiver<Job>) -> Vec<Job> {
    let mut requests = first.work.len();
    let mut group = vec![first];
    while requests < GROUP_REQUESTS_MAX {
        match queue.try_recv() {
            Ok(job) => {
                requests += job.work.len();
                group.push(job);
            }
            Err(_) => break,
        }
    }
    group
}

/// The committer's group log and when its next checkpoint is due (spec/replication.md §14).
struct Durable<B: StorageBackend> {
    log: Log<B>,
    /// Groups appended since the last checkpoint.
    groups: u64,
    /// Log bytes appended since the last checkpoint.
    bytes: u64,
}

impl<B: StorageBackend> Durable<B> {
    fn new(log: Log<B>) -> Durable<B> {
        Durable {
            log,
            groups: 0,
            bytes: 0,
        }
    }

    /// Appends a group's redo and syncs it (§14, *Group*); the planted bug of acknowledging
    /// before the fsync skips the sync.
    fn append(&mut self, redo: &Redo) -> Result<(), StoreError> {
        let payload = redo.bytes();
        if planted(Bug::AckBeforeFsync) {
            self.log.append_unsynced(payload)
        } else {
            self.log.append(payload)
        }
        .map_err(StoreError::Log)?;
        self.groups += 1;
        self.bytes += (log::HEADER + payload.len()) as u64;
        Ok(())
    }

    /// §14, *Checkpoint*: whether to checkpoint now, after a group, and why.
    fn checkpoint_now(&self, turns: Option<&CheckpointTurns>) -> Option<CheckpointReason> {
        if self.groups >= CHECKPOINT_OVERDUE * CHECKPOINT_GROUPS
            || self.bytes >= CHECKPOINT_OVERDUE * CHECKPOINT_BYTES
        {
            return Some(CheckpointReason::Overdue);
        }
        let due = self.groups >= CHECKPOINT_GROUPS || self.bytes >= CHECKPOINT_BYTES;
        (due && turns.is_none_or(CheckpointTurns::may_begin)).then_some(CheckpointReason::Due)
    }

    /// §14, *Checkpoint*: a synced commit of the last sequence appended, which syncs every
    /// unsynced group commit before it; only then the log starts again at offset 0. The planted
    /// bug of acknowledging before the fsync commits it without a sync.
    fn checkpoint(&mut self, db: &Database) -> Result<(), StoreError> {
        let mut txn = db.begin_write()?;
        self.mark_checkpoint(&mut txn)?;
        txn.commit()?;
        self.restarted();
        Ok(())
    }

    /// Makes `txn` a checkpoint: synced when it commits, and holding the last sequence appended.
    fn mark_checkpoint(&self, txn: &mut redb::WriteTransaction) -> Result<(), StoreError> {
        let last = self.log.next_sequence() - 1;
        txn.set_durability(if planted(Bug::AckBeforeFsync) {
            Durability::None
        } else {
            Durability::Immediate
        })?;
        txn.open_table(META)?
            .insert(META_LOG_SEQUENCE, last.to_le_bytes().as_slice())?;
        Ok(())
    }

    /// After a checkpoint's commit returned: the log starts again at offset 0.
    fn restarted(&mut self) {
        self.log.restart();
        self.groups = 0;
        self.bytes = 0;
    }
}

/// The replica's group log in `data_dir` on `files`, created if missing, with its directory
/// entry synced (a crash must not take the file, and the groups in it, away).
fn open_log_file<F: Files>(files: &F, data_dir: &Path) -> Result<F::Backend, StoreError> {
    let path = data_dir.join(REPLICA_LOG_FILE_NAME);
    let file = files.open(&path).map_err(|source| StoreError::Initialise {
        path: path.clone(),
        source,
    })?;
    // On every start, not only when the file is new: a start that created the file and stopped
    // before the directory's sync would otherwise leave its entry unsynced for good.
    files
        .sync_dir(data_dir)
        .map_err(|source| StoreError::Initialise {
            path: data_dir.to_path_buf(),
            source,
        })?;
    Ok(file)
}

/// §14, *Start*: replays the group log on `log_file` after the B-tree's checkpoint into `db`, as
/// one synced transaction that becomes the new checkpoint, and returns the log's writer.
/// The log's entries carry the database's `disk_id`: a log left beside another database
/// replays nothing into it.
fn replay_log<B: StorageBackend>(
    db: &Database,
    log_file: B,
    disk_id: u64,
) -> Result<Log<B>, StoreError> {
    let checkpoint = {
        let txn = db.begin_read()?;
        let meta = txn.open_table(META)?;
        match meta.get(META_LOG_SEQUENCE)? {
            None => 0,
            Some(value) => {
                u64::from_le_bytes(value.value().try_into().map_err(|_| StoreError::Corrupt {
                    key: META_LOG_SEQUENCE.to_owned(),
                    source: CodecError::Malformed {
                        reason: format!("{} bytes, not 8", value.value().len()),
                    },
                })?)
            }
        }
    };
    let (mut log, replay) = Log::open(log_file, disk_id, checkpoint).map_err(StoreError::Log)?;
    let Some(&(last, _)) = replay.entries.last() else {
        return Ok(log);
    };
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let mut changes = 0;
    {
        let mut tables = Tables::open(&txn)?;
        for (sequence, payload) in &replay.entries {
            let decoded = redo::decode(payload).map_err(|at| StoreError::Corrupt {
                key: format!("group log entry {sequence}, byte {at}"),
                source: CodecError::Malformed {
                    reason: "a change of a group's redo does not decode".to_owned(),
                },
            })?;
            for change in decoded {
                changes += 1;
                match (change.table, change.value) {
                    (Table::Names, value) => {
                        let name =
                            std::str::from_utf8(change.key).map_err(|_| StoreError::Corrupt {
                                key: format!("group log entry {sequence}, a name"),
                                source: CodecError::Malformed {
                                    reason: "a queue name that is not UTF-8".to_owned(),
                                },
                            })?;
                        match value {
                            Some(value) => tables.put_name(name, value)?,
                            None => {
                                tables.names.remove(name)?;
                            }
                        }
                    }
                    (table, Some(value)) => tables.put(table, change.key, value)?,
                    (table, None) => {
                        tables.remove(table, change.key)?;
                    }
                }
            }
        }
    }
    txn.open_table(META)?
        .insert(META_LOG_SEQUENCE, last.to_le_bytes().as_slice())?;
    txn.commit()?;
    log.restart();
    tracing::info!(
        groups = replay.entries.len(),
        changes,
        through = last,
        "replayed the replica's group log after its last checkpoint"
    );
    Ok(log)
}

/// Applies and commits `group`, then answers each of its jobs: after the log's sync, or with the
/// error when the append or the commit failed. The views change only after the commit. A
/// checkpoint that is due follows the answers (spec/replication.md §14).
fn commit_group<B: StorageBackend>(
    db: &Database,
    durable: &mut Durable<B>,
    group: Vec<Job>,
    views: &Views,
) {
    if let Some(first) = views.failed.get() {
        // Queued before the failure: refused like everything after it.
        let error = Arc::new(StoreError::Failed(first.clone()));
        for job in group {
            let _ = job.answer.send(Err(Arc::clone(&error)));
        }
        return;
    }
    // One reading of the clock for the group: its requests are applied at one moment.
    let window = views
        .dedup_window
        .get()
        .map(|window| (window.clock.now(), window.window_ms));
    let started = std::time::Instant::now();
    match apply_group(db, durable, &group, &views.names, window) {
        Ok(applied) => {
            if applied.committed {
                views
                    .metrics
                    .observe_commit(started.elapsed(), applied.records_held);
            }
            {
                let mut view = views
                    .records
                    .lock()
                    .expect("the view lock is never poisoned");
                for (key, record) in &applied.records {
                    view.update(key, record.as_ref());
                }
            }
            {
                let mut names = views
                    .names
                    .lock()
                    .expect("the name view lock is never poisoned");
                let mut purges = 0;
                for (name, record) in &applied.names {
                    purges += u64::from(names.merge(name, record, None));
                }
                for (name, record, now) in &applied.learned {
                    purges += u64::from(names.merge(name, record, *now));
                }
                if purges > 0 {
                    views.purges.send_modify(|count| *count += purges);
                }
            }
            if applied.deletions > 0 {
                views
                    .deletions
                    .send_modify(|count| *count += applied.deletions);
            }
            for (job, answers) in group.into_iter().zip(applied.answers) {
                // A caller that gave up no longer listens; its writes are durable anyway.
                let _ = job.answer.send(Ok(answers));
            }
            if let Some(reason) = durable.checkpoint_now(views.checkpoint_turns.get()) {
                let started = std::time::Instant::now();
                match durable.checkpoint(db) {
                    Ok(()) => views
                        .metrics
                        .observe_checkpoint(started.elapsed(), reason == CheckpointReason::Overdue),
                    Err(error) => {
                        let fault = error.fault();
                        tracing::error!(%fault, "replica checkpoint failed; the store refuses everything until the node restarts");
                        let _ = views.failed.set(fault);
                    }
                }
            }
        }
        Err(error) => {
            let fault = error.fault();
            tracing::error!(%fault, "replica group commit failed; nothing of it is acknowledged, and the store refuses everything until the node restarts");
            let _ = views.failed.set(fault);
            let error = Arc::new(error);
            for job in group {
                let _ = job.answer.send(Err(Arc::clone(&error)));
            }
        }
    }
}

/// What a group changed, for the views once it is committed.
#[derive(Default)]
struct Applied {
    answers: Vec<Answers>,
    records: Vec<(RecordKey, Option<Record>)>,
    names: Vec<(QueueName, NameRecord)>,
    learned: Vec<(QueueName, NameRecord, Option<Millis>)>,
    /// Task records written (they have no view).
    tasks: usize,
    /// Deduplication records written (they have no view).
    dedups: usize,
    deletions: u64,
    /// Whether the group wrote anything (else its transaction was aborted: no fsync).
    committed: bool,
    /// Message records the table holds after the group.
    records_held: u64,
}

/// Whether `key` names an incarnation known deleted (as of the last commit: the view changes
/// only after one).
fn deleted(names: &Mutex<NameView>, key: &RecordKey) -> bool {
    names
        .lock()
        .expect("the name view lock is never poisoned")
        .is_deleted(key)
}

/// Applies `group` in one transaction (spec/replication.md §14, *Group*): its redo is appended
/// to the log and synced before the transaction commits, without a sync of its own, so no reader
/// of the B-tree sees a group the log does not hold.
fn apply_group<B: StorageBackend>(
    db: &Database,
    durable: &mut Durable<B>,
    group: &[Job],
    names_view: &Mutex<NameView>,
    window: Option<(Millis, u64)>,
) -> Result<Applied, StoreError> {
    let mut txn = db.begin_write()?;
    // The log makes it durable; the next checkpoint syncs the B-tree.
    txn.set_durability(Durability::None)?;
    let mut applied = Applied::default();
    let redo = {
        let mut tables = Tables::open(&txn)?;
        for job in group {
            let answers = match &job.work {
                Work::Apply {
                    entries,
                    names,
                    tasks,
                    dedups,
                } => {
                    let mut answers = Answers::default();
                    for entry in entries {
                        let reply =
                            apply_entry(&mut tables, entry, names_view, window, &mut applied)?;
                        answers.replies.push(reply);
                    }
                    for entry in names {
                        let reply = apply_name(&mut tables, entry, &mut applied)?;
                        answers.names.push(reply);
                    }
                    for entry in tasks {
                        let reply = apply_task(&mut tables, entry, &mut applied)?;
                        answers.tasks.push(reply);
                    }
                    for entry in dedups {
                        let reply = apply_dedup(&mut tables, entry, &mut applied)?;
                        answers.dedups.push(reply);
                    }
                    answers
                }
                Work::Learn { records, now } => {
                    for (name, record) in records {
                        note_deletion(&mut tables, name, record, &mut applied)?;
                        applied.learned.push((name.clone(), record.clone(), *now));
                    }
                    Answers::default()
                }
                Work::Expire {
                    copies,
                    dedups,
                    now,
                    window_ms,
                    late_ms,
                } => {
                    // Re-checked against what is stored now: a copy confirmed since the walk
                    // saw it is ready and stays.
                    let mut answers = Answers::default();
                    for key in copies {
                        let stored_key = key.encode();
                        let Some(value) = tables.records.get(stored_key.as_slice())? else {
                            continue;
                        };
                        let record: Record =
                            codec::decode_framed(value.value()).map_err(|source| {
                                StoreError::Corrupt {
                                    key: format!("{key:?}"),
                                    source,
                                }
                            })?;
                        drop(value);
                        if dedup::copy_window_ended(&record, *now, *window_ms) {
                            tables.remove(Table::Records, &stored_key)?;
                            applied.records.push((key.clone(), None));
                            answers.replies.push(Reply::Ack);
                        }
                    }
                    for key in dedups {
                        let stored_key = key.encode();
                        let Some(value) = tables.dedups.get(stored_key.as_slice())? else {
                            continue;
                        };
                        let (_, record) = decode_dedup_row(&stored_key, value.value())?;
                        drop(value);
                        if dedup::droppable(&record, *now, *late_ms) {
                            tables.remove(Table::Dedups, &stored_key)?;
                            applied.dedups += 1;
                            answers.dedups.push(DedupReply::Ack);
                        }
                    }
                    answers
                }
                Work::Drop { keys } => {
                    let mut answers = Answers::default();
                    for key in keys {
                        if !deleted(names_view, key) {
                            continue;
                        }
                        if tables.remove(Table::Records, &key.encode())? {
                            applied.records.push((key.clone(), None));
                            answers.replies.push(Reply::Ack);
                        }
                    }
                    answers
                }
            };
            applied.answers.push(answers);
        }
        applied.records_held = tables.records.len()?;
        tables.redo
    };
    if redo.is_empty() {
        // Nothing new to make durable: what the reads saw and the acks confirm was committed
        // by an earlier group.
        txn.abort()?;
    } else if redo.bytes().len() as u64 >= CHECKPOINT_BYTES {
        // §14, *Group*: a group as large as a checkpoint's worth of log (claims of many large
        // records) is not logged; its own synced commit is the checkpoint.
        durable.mark_checkpoint(&mut txn)?;
        txn.commit()?;
        durable.restarted();
        applied.committed = true;
    } else {
        if let Err(error) = durable.append(&redo) {
            // Nothing of the group is visible or answered; the store latches.
            let _ = txn.abort();
            return Err(error);
        }
        txn.commit()?;
        applied.committed = true;
    }
    Ok(applied)
}

/// A group's open tables, and the redo of every change made through them (spec/replication.md
/// §14): every write of a group goes through [`Tables::put`], [`Tables::put_name`] or
/// [`Tables::remove`], so the log entry holds exactly what the transaction changed.
struct Tables<'txn> {
    records: redb::Table<'txn, &'static [u8], &'static [u8]>,
    names: redb::Table<'txn, &'static str, &'static [u8]>,
    deleted: redb::Table<'txn, &'static [u8], &'static [u8]>,
    tasks: redb::Table<'txn, &'static [u8], &'static [u8]>,
    dedups: redb::Table<'txn, &'static [u8], &'static [u8]>,
    redo: Redo,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn redb::WriteTransaction) -> Result<Tables<'txn>, StoreError> {
        Ok(Tables {
            records: txn.open_table(RECORDS)?,
            names: txn.open_table(NAMES)?,
            deleted: txn.open_table(DELETED)?,
            tasks: txn.open_table(TASKS)?,
            dedups: txn.open_table(DEDUPS)?,
            redo: Redo::default(),
        })
    }

    fn bytes_table(
        &mut self,
        table: Table,
    ) -> &mut redb::Table<'txn, &'static [u8], &'static [u8]> {
        match table {
            Table::Records => &mut self.records,
            Table::Deleted => &mut self.deleted,
            Table::Tasks => &mut self.tasks,
            Table::Dedups => &mut self.dedups,
            Table::Names => unreachable!("names are keyed by str: Tables::put_name"),
        }
    }

    /// Stores `value` at `key` in `table` (not the names'), and records it.
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.bytes_table(table).insert(key, value)?;
        self.redo.put(table, key, value);
        Ok(())
    }

    /// Stores a name's record, and records it.
    fn put_name(&mut self, name: &str, value: &[u8]) -> Result<(), StoreError> {
        self.names.insert(name, value)?;
        self.redo.put(Table::Names, name.as_bytes(), value);
        Ok(())
    }

    /// Removes `key` from `table` (not the names'); records it if it was there. Whether it was.
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<bool, StoreError> {
        let removed = self.bytes_table(table).remove(key)?.is_some();
        if removed {
            self.redo.remove(table, key);
        }
        Ok(removed)
    }
}

/// One deduplication request against the stored record (`trireme_replication::dedup::accept`
/// decides).
fn apply_dedup(
    tables: &mut Tables<'_>,
    entry: &DedupEntry,
    applied: &mut Applied,
) -> Result<DedupReply, StoreError> {
    let stored_key = entry.key.encode();
    let held: Option<DedupRecord> = match tables.dedups.get(stored_key.as_slice())? {
        Some(value) => Some(decode_dedup_row(&stored_key, value.value())?.1),
        None => None,
    };
    let (change, reply) = dedup::accept(held.as_ref(), &entry.request, entry.now, entry.late_ms);
    match change {
        DedupChange::Store(record) => {
            let value = codec::encode_framed(&record);
            tables.put(Table::Dedups, &stored_key, &value)?;
            applied.dedups += 1;
        }
        DedupChange::Keep => {}
    }
    Ok(reply)
}

fn apply_entry(
    tables: &mut Tables<'_>,
    entry: &Entry,
    names_view: &Mutex<NameView>,
    window: Option<(Millis, u64)>,
    applied: &mut Applied,
) -> Result<Reply, StoreError> {
    let stored_key = entry.key.encode();
    let held: Option<Record> = match tables.records.get(stored_key.as_slice())? {
        Some(value) => {
            Some(
                codec::decode_framed(value.value()).map_err(|source| StoreError::Corrupt {
                    key: format!("{:?}", entry.key),
                    source,
                })?,
            )
        }
        None => None,
    };
    let write = match &entry.request {
        Request::Read => return Ok(Reply::Record(held)),
        Request::Write { write, .. } => write,
    };
    let (deleted, watermark) = {
        let view = names_view
            .lock()
            .expect("the name view lock is never poisoned");
        (
            view.is_deleted(&entry.key),
            view.watermark(&entry.key.queue, entry.key.incarnation),
        )
    };
    if deleted {
        // spec/replication.md §1: a late write under a deleted incarnation is dropped again;
        // its message went with its queue.
        return Ok(Reply::Ack);
    }
    if let Some((now, window_ms)) = window
        && dedup::late_copy(write, now, window_ms)
    {
        // spec/replication.md §4, WindowEnd: a held or void copy after its window is refused.
        return Ok(Reply::Refused);
    }
    let verdict = accept(held.as_ref(), write.as_ref());
    let acks = verdict.acks();
    match verdict {
        Verdict::Store(Some(record)) => {
            // spec/replication.md §2, *Sweep*: a record the view's watermark hides is stored with
            // its purge mark, a sweep of this one record as it lands (one more merge), so that a
            // write arriving after the sweeper's walk is marked too.
            let record = record.swept(watermark).unwrap_or(record);
            let value = codec::encode_framed(&record);
            tables.put(Table::Records, &stored_key, &value)?;
            applied.records.push((entry.key.clone(), Some(record)));
        }
        Verdict::Store(None) => {
            tables.remove(Table::Records, &stored_key)?;
            applied.records.push((entry.key.clone(), None));
        }
        Verdict::Diverged(divergence) => {
            tracing::error!(key = ?entry.key, %divergence, "writers of one generation disagree; write refused");
        }
        Verdict::Unchanged | Verdict::Refused => {}
    }
    Ok(if acks { Reply::Ack } else { Reply::Refused })
}

fn apply_name(
    tables: &mut Tables<'_>,
    entry: &NameEntry,
    applied: &mut Applied,
) -> Result<NameReply, StoreError> {
    assert!(entry.slot < REPLICAS, "a name has three replicas");
    let name = entry.name.as_str();
    let held: NameRecord = match tables.names.get(name)? {
        Some(value) => decode_name_row(name, value.value())?.1,
        None => NameRecord::default(),
    };
    let (record, reply) = match &entry.request {
        NameRequest::Read => return Ok(NameReply::Record(held)),
        NameRequest::Vote { epoch, proposal } => {
            let (record, _) = vote(&held, entry.slot, *epoch, proposal);
            (record.clone(), NameReply::Record(record))
        }
        NameRequest::Write(incoming) => (held.merge(incoming), NameReply::Ack),
        NameRequest::View(_) => unreachable!("a push goes to the view (ReplicaStore::learn)"),
    };
    if record != held {
        let value = codec::encode_framed(&record);
        tables.put_name(name, &value)?;
        note_deletion(tables, &entry.name, &record, applied)?;
        applied.names.push((entry.name.clone(), record));
    }
    Ok(reply)
}

fn apply_task(
    tables: &mut Tables<'_>,
    entry: &TaskEntry,
    applied: &mut Applied,
) -> Result<TaskReply, StoreError> {
    let stored_key = entry.key.encode();
    let held: Option<TaskRecord> = match tables.tasks.get(stored_key.as_slice())? {
        Some(value) => Some(decode_task_row(&stored_key, value.value())?.1),
        None => None,
    };
    let write = match &entry.request {
        TaskRequest::Read => return Ok(TaskReply::Record(held)),
        TaskRequest::Write { write, .. } => write,
    };
    let verdict = accept_task(held.as_ref(), write);
    let acks = verdict.acks();
    if let TaskVerdict::Store(record) = verdict {
        let value = codec::encode_framed(&record);
        tables.put(Table::Tasks, &stored_key, &value)?;
        applied.tasks += 1;
    }
    Ok(if acks {
        TaskReply::Ack
    } else {
        TaskReply::Refused
    })
}

/// Makes the deletion `record` shows durable in the deleted list, if it is new.
fn note_deletion(
    tables: &mut Tables<'_>,
    name: &QueueName,
    record: &NameRecord,
    applied: &mut Applied,
) -> Result<(), StoreError> {
    let (Some(incarnation), Some(deleted_at)) = (tombstoned(record), record.deleted_at) else {
        return Ok(());
    };
    let key = deleted_key(name, incarnation);
    if tables.deleted.get(key.as_slice())?.is_none() {
        tables.put(Table::Deleted, &key, &deleted_at.0.to_le_bytes())?;
        applied.deletions += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use redb::backends::InMemoryBackend;

    use super::crash_disk::Disk;
    use crate::clock::ManualClock;
    use trireme_core::{Incarnation, MessageId, Millis, QueueName};
    use trireme_replication::record::Birth;
    use trireme_replication::replica::Write;

    use super::*;

    fn key() -> RecordKey {
        RecordKey {
            queue: QueueName::try_from("q".to_owned()).expect("a valid queue name"),
            incarnation: Incarnation::local(Millis(1)),
            message: MessageId(7),
        }
    }

    #[test]
    fn a_staging_file_left_by_a_crashed_first_start_is_replaced() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        // What a crash between redb's two initial flushes leaves: no magic number.
        std::fs::write(dir.path().join(REPLICA_STAGING_FILE_NAME), vec![0; 8192])
            .expect("the staging file is written");
        let (store, closed) =
            ReplicaStore::open(dir.path(), NodeId(2), 99, 16 << 20).expect("the store opens");
        assert_eq!(store.disk_id(), 99);
        assert!(!dir.path().join(REPLICA_STAGING_FILE_NAME).exists());
        drop(store);
        closed.wait();
        let (store, closed) =
            ReplicaStore::open(dir.path(), NodeId(2), 5, 16 << 20).expect("the store opens again");
        assert_eq!(store.disk_id(), 99, "the disk id is the first start's");
        drop(store);
        closed.wait();
    }

    #[test]
    fn task_records_survive_a_restart_and_a_start_is_acked_once_per_number() {
        use trireme_replication::task::{Starter, TaskParams, TaskWrite, start};
        let dir = tempfile::tempdir().expect("a temporary directory");
        let task_key = TaskKey {
            queue: key().queue,
            incarnation: key().incarnation,
        };
        let params = TaskParams {
            destination: None,
            rate_per_s: None,
            started_at: Millis(3),
            to_move: 2,
            // The restriction of a limited key is part of what a restart must keep.
            allowed: trireme_core::QueuePrefixes::new(vec!["orders-".to_owned()]),
        };
        let record =
            start(&TaskRecord::default(), Starter::default(), params).expect("nothing runs yet");
        let entry = |request| TaskEntry {
            key: task_key.clone(),
            request,
        };
        let start_write = TaskRequest::Write {
            write: Box::new(TaskWrite::Start(record.clone())),
            ack: true,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let (store, closed) =
            ReplicaStore::open(dir.path(), NodeId(1), 1, 16 << 20).expect("the store opens");
        let replies = runtime
            .block_on(store.apply_tasks(vec![
                entry(start_write.clone()),
                entry(start_write.clone()),
                entry(TaskRequest::Read),
            ]))
            .expect("the group commits");
        assert_eq!(
            replies,
            vec![
                TaskReply::Ack,
                TaskReply::Refused,
                TaskReply::Record(Some(record.clone()))
            ]
        );
        drop(store);
        closed.wait();
        let (store, closed) =
            ReplicaStore::open(dir.path(), NodeId(1), 1, 16 << 20).expect("the store opens again");
        let (page, more) = store
            .task_records(None, 10, |_, _| true)
            .expect("the task records read");
        assert_eq!(page, vec![(task_key.clone(), record)]);
        assert!(!more);
        let replies = runtime
            .block_on(store.apply_tasks(vec![entry(start_write)]))
            .expect("the group commits");
        assert_eq!(
            replies,
            vec![TaskReply::Refused],
            "still refused after the restart"
        );
        drop(store);
        closed.wait();
    }

    /// A disk in memory that can fill up (writes and resizes fail with ENOSPC) or fail its
    /// fsyncs (EIO).
    #[derive(Debug)]
    struct FailingDisk {
        inner: InMemoryBackend,
        /// 0: healthy; 1: full; 2: fsyncs fail.
        fault: Arc<std::sync::atomic::AtomicU8>,
    }

    const HEALTHY: u8 = 0;
    const FULL: u8 = 1;
    const SYNC_FAILS: u8 = 2;

    impl FailingDisk {
        fn fails(&self, when: u8, errno: i32) -> std::io::Result<()> {
            if self.fault.load(std::sync::atomic::Ordering::SeqCst) == when {
                return Err(std::io::Error::from_raw_os_error(errno));
            }
            Ok(())
        }
    }

    impl StorageBackend for FailingDisk {
        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.fails(FULL, 28)?;
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.fails(SYNC_FAILS, 5)?;
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.fails(FULL, 28)?;
            self.inner.write(offset, data)
        }
    }

    fn merge(id: u128, body: &str) -> Entry {
        Entry {
            key: RecordKey {
                message: MessageId(id),
                ..key()
            },
            request: Request::Write {
                write: Box::new(Write::Merge(Record::sent(Birth {
                    payload: body.as_bytes().to_vec(),
                    sent_at: Millis(5),
                    visible_from: Millis(0),
                    source_queue: None,
                    dedup_id: None,
                }))),
                ack: true,
            },
        }
    }

    fn read(id: u128) -> Entry {
        Entry {
            key: RecordKey {
                message: MessageId(id),
                ..key()
            },
            request: Request::Read,
        }
    }

    /// spec/replication.md#durability, *A store that fails*: the failed group is acked to no one,
    /// its fault says what failed, and from then on the store answers nothing — not the record
    /// committed before, not the failed group's, not a scan — even once the disk works again.
    async fn a_failed_group_is_never_acked_and_the_store_refuses_everything_after(
        fault: u8,
    ) -> StoreFault {
        let state = Arc::new(std::sync::atomic::AtomicU8::new(HEALTHY));
        let disk = FailingDisk {
            inner: InMemoryBackend::new(),
            fault: Arc::clone(&state),
        };
        let log = FailingDisk {
            inner: InMemoryBackend::new(),
            fault: Arc::clone(&state),
        };
        let (store, committer) = ReplicaStore::open_backend(disk, log, 1024 * 1024, NodeId(1), 42)
            .expect("the store opens on memory");
        let acked = store.apply(vec![merge(1, "kept")]).await;
        assert_eq!(acked.expect("a healthy disk commits"), vec![Reply::Ack]);
        assert_eq!(store.failure(), None);

        state.store(fault, std::sync::atomic::Ordering::SeqCst);
        // A batch big enough that its commit writes pages.
        let batch: Vec<Entry> = (2..200).map(|id| merge(id, &"x".repeat(2_000))).collect();
        let failed = store
            .apply(batch)
            .await
            .expect_err("a failed commit answers with its error, never with acks");
        let reported = failed.fault();
        state.store(HEALTHY, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(store.failure().as_ref(), Some(&reported));

        for later in [vec![read(1)], vec![read(2)], vec![merge(300, "later")]] {
            let refused = store
                .apply(later)
                .await
                .expect_err("a failed store answers nothing");
            assert!(
                matches!(refused.as_ref(), StoreError::Failed(first) if *first == reported),
                "{refused}"
            );
        }
        assert!(matches!(store.records(), Err(StoreError::Failed(_))));
        assert!(matches!(
            store.digests(0, u16::MAX, |_| true),
            Err(StoreError::Failed(_))
        ));
        drop(store);
        committer.await.expect("the committer ends");
        reported
    }

    /// Found by the cluster simulation (sync failures during the first start of five
    /// members): a failed commit of the join's metadata left the store unlatched, so `failure`
    /// reported nothing and the node retried "cannot record that this node joined" forever on
    /// a database that refuses every later I/O, never serving and never restarted.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_metadata_commit_latches_the_store_like_a_failed_group() {
        let state = Arc::new(std::sync::atomic::AtomicU8::new(HEALTHY));
        let disk = FailingDisk {
            inner: InMemoryBackend::new(),
            fault: Arc::clone(&state),
        };
        let log = FailingDisk {
            inner: InMemoryBackend::new(),
            fault: Arc::clone(&state),
        };
        let (store, committer) = ReplicaStore::open_backend(disk, log, 1024 * 1024, NodeId(1), 42)
            .expect("the store opens on memory");
        state.store(SYNC_FAILS, std::sync::atomic::Ordering::SeqCst);
        let failed = store
            .set_joined()
            .expect_err("a failed fsync fails the commit");
        let reported = failed.fault();
        state.store(HEALTHY, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(reported.kind, FaultKind::Io, "{reported}");
        assert_eq!(store.failure().as_ref(), Some(&reported));
        assert!(matches!(store.set_joined(), Err(StoreError::Failed(first)) if first == reported));
        assert!(matches!(
            store.save_peer_disk(NodeId(2), 7, None),
            Err(StoreError::Failed(_))
        ));
        assert!(matches!(store.joined(), Err(StoreError::Failed(_))));
        let refused = store
            .apply(vec![merge(1, "after")])
            .await
            .expect_err("a failed store answers nothing");
        assert!(matches!(refused.as_ref(), StoreError::Failed(first) if *first == reported));
        drop(store);
        committer.await.expect("the committer ends");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_disk_is_reported_as_full_and_acks_nothing() {
        let fault =
            a_failed_group_is_never_acked_and_the_store_refuses_everything_after(FULL).await;
        assert_eq!(fault.kind, FaultKind::DiskFull, "{fault}");
        assert!(fault.to_string().starts_with("the disk is full"), "{fault}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_fsync_is_reported_as_an_io_fault_and_acks_nothing() {
        let fault =
            a_failed_group_is_never_acked_and_the_store_refuses_everything_after(SYNC_FAILS).await;
        assert_eq!(fault.kind, FaultKind::Io, "{fault}");
    }

    /// spec/replication.md §14, `CHECKPOINT_TURN`: at any moment at most one member may begin a
    /// checkpoint, only in the first half of its turn, and every member's turn comes.
    #[test]
    fn checkpoint_turns_are_disjoint_and_each_member_has_one() {
        const TURN_MS: u64 = 1_000;
        for members in 1..=5_u32 {
            let mut began = vec![0_u32; members as usize];
            for now_ms in (0..u64::from(members) * TURN_MS * 2).step_by(50) {
                let may: Vec<u32> = (0..members)
                    .filter(|position| may_begin_checkpoint(now_ms, *position, members, TURN_MS))
                    .collect();
                assert!(may.len() <= 1, "{members} members at {now_ms} ms: {may:?}");
                if let [position] = may[..] {
                    assert!(now_ms % TURN_MS < TURN_MS / 2, "the first half only");
                    assert_eq!(u64::from(position), now_ms / TURN_MS % u64::from(members));
                    began[position as usize] += 1;
                }
            }
            assert!(
                began.iter().all(|n| *n == 20),
                "{members} members: {began:?}"
            );
        }
    }

    /// spec/replication.md §14, *Checkpoint*: a due checkpoint waits for this member's turn; an
    /// overdue one (`CHECKPOINT_OVERDUE` times due) is made whosever turn it is.
    #[tokio::test(flavor = "current_thread")]
    async fn a_due_checkpoint_waits_for_the_members_turn_and_an_overdue_one_does_not() {
        let (store, _committer) = ReplicaStore::open_backend(
            InMemoryBackend::new(),
            InMemoryBackend::new(),
            1 << 20,
            NodeId(1),
            42,
        )
        .expect("the store opens");
        // Member 1 of 3: its turn is [1000, 1500) ms of every 3000.
        let clock = ManualClock::new(Millis(0));
        store.set_checkpoint_turns(CheckpointTurns {
            clock: Arc::new(clock.clone()),
            position: 1,
            members: 3,
        });
        let mut id = 0;
        let mut groups = |count: u64| {
            let store = store.clone();
            let first = id;
            id += u128::from(count);
            async move {
                for id in first..first + u128::from(count) {
                    store.apply(vec![merge(id, "body")]).await.expect("commits");
                }
            }
        };
        groups(CHECKPOINT_GROUPS + 10).await;
        assert_eq!(store.metrics().checkpoints(), 0, "due, but not its turn");
        clock.set(Millis(1_600));
        groups(1).await;
        assert_eq!(store.metrics().checkpoints(), 0, "the turn's second half");
        clock.set(Millis(4_000));
        groups(1).await;
        assert_eq!(store.metrics().checkpoints(), 1, "its turn");
        assert_eq!(store.metrics().checkpoints_overdue(), 0);
        clock.set(Millis(6_000));
        groups(CHECKPOINT_OVERDUE * CHECKPOINT_GROUPS - 1).await;
        assert_eq!(store.metrics().checkpoints(), 1, "due, not yet overdue");
        groups(1).await;
        assert_eq!(store.metrics().checkpoints(), 2, "overdue: made at once");
        assert_eq!(store.metrics().checkpoints_overdue(), 1);
    }

    /// spec/replication.md §14, L1: a crash keeps every group the store answered, through its
    /// log, with or without a checkpoint in between; the B-tree alone does not hold them.
    #[tokio::test(flavor = "current_thread")]
    async fn a_crash_keeps_every_answered_group_through_the_log() {
        for groups in [3, u128::from(CHECKPOINT_GROUPS) + 5] {
            let (db, log) = (Disk::default(), Disk::default());
            let (store, _committer) =
                ReplicaStore::open_backend(db.clone(), log.clone(), 1 << 20, NodeId(1), 42)
                    .expect("the store opens");
            for id in 1..=groups {
                assert_eq!(
                    store.apply(vec![merge(id, "body")]).await.expect("commits"),
                    vec![Reply::Ack]
                );
            }
            let vote = NameRequest::Vote {
                epoch: 0,
                proposal: proposal(),
            };
            store
                .apply_names(vec![name_entry(0, vote)])
                .await
                .expect("the vote commits");
            assert_eq!(
                store.metrics().checkpoints(),
                u64::try_from(groups).unwrap() / CHECKPOINT_GROUPS,
                "one checkpoint per CHECKPOINT_GROUPS groups"
            );
            // The machine stops: of the writes since the last sync, the disks keep none.
            let crashed = || (db.crashed(|_, _| 0), log.crashed(|_, _| 0));
            let (db_after, log_after) = crashed();
            let (db_alone, _) = crashed();
            drop(store);
            let (store, _committer) =
                ReplicaStore::open_backend(db_after, log_after, 1 << 20, NodeId(1), 43)
                    .expect("the store opens after the crash");
            assert_eq!(store.disk_id(), 42);
            assert_eq!(
                store.records().expect("reads").len(),
                usize::try_from(groups).unwrap(),
                "every answered group is back ({groups} groups)"
            );
            assert!(
                store.names(|view| view.get(&name()).is_some()),
                "and the vote"
            );
            let (alone, _committer) =
                ReplicaStore::open_backend(db_alone, Disk::default(), 1 << 20, NodeId(1), 43)
                    .expect("the database opens without its log");
            assert!(
                alone.records().expect("reads").len() < usize::try_from(groups).unwrap(),
                "the log held what the B-tree had not synced"
            );
        }
    }

    /// spec/replication.md §14, *Start*: a checkpoint's sequence that does not decode is
    /// corruption; read as 0 it would skip every entry the log holds.
    #[tokio::test(flavor = "current_thread")]
    async fn a_malformed_checkpoint_sequence_is_corruption() {
        let (db, log) = (Disk::default(), Disk::default());
        let (store, committer) =
            ReplicaStore::open_backend(db.clone(), log.clone(), 1 << 20, NodeId(1), 42)
                .expect("the store opens");
        store.apply(vec![merge(1, "kept")]).await.expect("commits");
        drop(store);
        committer.await.expect("the committer ends");
        {
            let database = redb::Builder::new()
                .create_with_backend(db.clone())
                .expect("the database opens");
            let txn = database.begin_write().expect("a transaction");
            txn.open_table(META)
                .expect("the meta table")
                .insert(META_LOG_SEQUENCE, [1_u8, 2, 3].as_slice())
                .expect("written");
            txn.commit().expect("committed");
        }
        let opened = ReplicaStore::open_backend(db, log, 1 << 20, NodeId(1), 42);
        assert!(
            matches!(&opened, Err(StoreError::Corrupt { key, .. }) if key == META_LOG_SEQUENCE),
            "{:?}",
            opened.map(|_| ())
        );
    }

    /// spec/replication.md §14, *Group*: a group whose redo reaches `CHECKPOINT_BYTES` is not
    /// logged; its own synced commit is the checkpoint, and a crash keeps it without the log.
    #[tokio::test(flavor = "current_thread")]
    async fn a_group_too_large_for_the_log_is_its_own_checkpoint() {
        let (db, log) = (Disk::default(), Disk::default());
        let (store, _committer) =
            ReplicaStore::open_backend(db.clone(), log.clone(), 1 << 20, NodeId(1), 42)
                .expect("the store opens");
        store.apply(vec![merge(1, "small")]).await.expect("commits");
        let body = "x".repeat(1 << 20);
        let large: Vec<Entry> = (2..=18).map(|id| merge(id, &body)).collect();
        let acks = store.apply(large).await.expect("the large group commits");
        assert_eq!(acks.len(), 17);
        assert!(
            log.len().expect("a length") <= log::GROWTH,
            "the large group never went to the log"
        );
        let crashed = db.crashed(|_, _| 0);
        drop(store);
        let (store, _committer) =
            ReplicaStore::open_backend(crashed, Disk::default(), 1 << 20, NodeId(1), 43)
                .expect("the database opens without its log");
        assert_eq!(
            store.records().expect("reads").len(),
            18,
            "the large group's commit was synced, with the small one before it"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]
        /// spec/replication.md §14, L1 against the real store: after any number of answered
        /// groups (across checkpoints), a crash that keeps all or none of the database's unsynced
        /// writes, and a second crash right after the start that replayed them, the store holds
        /// exactly the groups it answered.
        #[test]
        fn after_a_crash_the_store_holds_exactly_the_groups_it_answered(
            groups in 0..u128::from(2 * CHECKPOINT_GROUPS + 100),
            keep_unsynced in proptest::prelude::any::<bool>(),
            crash_again in proptest::prelude::any::<bool>(),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                let (db, log) = (Disk::default(), Disk::default());
                let (store, _committer) =
                    ReplicaStore::open_backend(db.clone(), log.clone(), 1 << 20, NodeId(1), 42)
                        .unwrap();
                for id in 1..=groups {
                    store.apply(vec![merge(id, "body")]).await.unwrap();
                }
                let keep = |_, len| if keep_unsynced { len } else { 0 };
                let (mut db, mut log) = (db.crashed(keep), log.crashed(keep));
                drop(store);
                if crash_again {
                    let (_store, _committer) =
                        ReplicaStore::open_backend(db.clone(), log.clone(), 1 << 20, NodeId(1), 43)
                            .unwrap();
                    (db, log) = (db.crashed(keep), log.crashed(keep));
                }
                let (store, _committer) =
                    ReplicaStore::open_backend(db, log, 1 << 20, NodeId(1), 43).unwrap();
                let mut held: Vec<u128> = store
                    .records()
                    .unwrap()
                    .into_iter()
                    .map(|(key, _)| key.message.0)
                    .collect();
                held.sort_unstable();
                assert_eq!(held, (1..=groups).collect::<Vec<_>>());
            });
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_store_on_a_backend_commits_on_its_runtime_and_answers_after_the_commit() {
        let (store, committer) = ReplicaStore::open_backend(
            InMemoryBackend::new(),
            InMemoryBackend::new(),
            1024 * 1024,
            NodeId(1),
            42,
        )
        .expect("the store opens on memory");
        assert_eq!(store.disk_id(), 42);
        let record = Record::sent(Birth {
            payload: b"body".to_vec(),
            sent_at: Millis(5),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: None,
        });
        let write = Entry {
            key: key(),
            request: Request::Write {
                write: Box::new(Write::Merge(record.clone())),
                ack: true,
            },
        };
        let read = Entry {
            key: key(),
            request: Request::Read,
        };
        let replies = store
            .apply(vec![write, read])
            .await
            .expect("the group commits");
        assert_eq!(replies, vec![Reply::Ack, Reply::Record(Some(record))]);
        assert_eq!(store.records().expect("the records read").len(), 1);
        assert_eq!(
            store.view_mut(|view| view.candidates(
                &key().queue,
                Incarnation::local(Millis(1)),
                None,
                Millis(10),
                5
            )),
            vec![MessageId(7)]
        );
        drop(store);
        committer
            .await
            .expect("the committer task ends when the store is gone");
    }

    fn name() -> QueueName {
        QueueName::try_from("jobs".to_owned()).expect("a valid queue name")
    }

    fn proposal() -> trireme_replication::name::Proposal {
        trireme_replication::name::Proposal {
            incarnation: QueueIncarnation {
                hlc_ms: 1_000,
                node: 1,
                nonce: 9,
            },
            ..trireme_replication::name::Proposal::default()
        }
    }

    fn name_entry(slot: usize, request: NameRequest) -> NameEntry {
        NameEntry {
            name: name(),
            slot,
            request,
        }
    }

    #[test]
    fn name_records_and_deletions_survive_a_restart_and_drop_their_messages() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let (store, closed) =
            ReplicaStore::open(dir.path(), NodeId(1), 5, 16 << 20).expect("opens");
        let incarnation = proposal().incarnation;
        let message = RecordKey {
            queue: name(),
            incarnation,
            message: MessageId(3),
        };
        let send = |body: &[u8]| Entry {
            key: message.clone(),
            request: Request::Write {
                write: Box::new(trireme_replication::replica::Write::Merge(Record::sent(
                    Birth {
                        payload: body.to_vec(),
                        sent_at: Millis(5),
                        visible_from: Millis(0),
                        source_queue: None,
                        dedup_id: None,
                    },
                ))),
                ack: true,
            },
        };
        runtime.block_on(async {
            let vote = NameRequest::Vote {
                epoch: 0,
                proposal: proposal(),
            };
            let replies = store
                .apply_names(vec![name_entry(0, vote)])
                .await
                .expect("the vote commits");
            let NameReply::Record(voted) = &replies[0] else {
                panic!("a vote answers with the record: {replies:?}");
            };
            assert_eq!(voted.votes[0].as_deref(), Some(&proposal()));
            assert!(voted.live().is_none(), "one vote decides nothing");
            assert_eq!(
                store.apply(vec![send(b"a")]).await.unwrap(),
                vec![Reply::Ack]
            );
            assert_eq!(store.records().unwrap().len(), 1);

            // The settled tombstone arrives as a push.
            let mut tombstone = voted.clone();
            tombstone.votes[1] = Some(Box::new(proposal()));
            tombstone.deleted_at = Some(Millis(2_000));
            let deletions = store.deletions();
            store
                .learn(vec![(name(), tombstone.clone())], Millis(2_001))
                .await
                .expect("learned");
            assert!(deletions.has_changed().unwrap(), "the sweeper is woken");
            assert!(store.names(|view| view.is_deleted(&message)));
            assert!(store.names(NameView::live_names).is_empty());
            // A late write under the deleted incarnation is acknowledged and not stored.
            assert_eq!(
                store.apply(vec![send(b"a")]).await.unwrap(),
                vec![Reply::Ack]
            );
        });
        drop(store);
        closed.wait();

        let (store, closed) =
            ReplicaStore::open(dir.path(), NodeId(1), 6, 16 << 20).expect("opens again");
        runtime.block_on(async {
            assert!(
                store.names(|view| view.is_deleted(&message)),
                "the deleted list is durable"
            );
            let viewed = store.names(|view| view.get(&name()).cloned()).unwrap();
            assert_eq!(viewed.record.votes[0].as_deref(), Some(&proposal()));
            assert_eq!(
                viewed.confirmed_at, None,
                "a record loaded at open is unconfirmed"
            );
            assert_eq!(store.drop_deleted(vec![message.clone()]).await.unwrap(), 1);
            assert!(store.records().unwrap().is_empty());
            assert_eq!(
                store.view(|view| view.live(&name(), message.incarnation)),
                0
            );
        });
        drop(store);
        closed.wait();
    }

    #[test]
    fn a_settled_record_confirms_the_view_and_an_unsettled_change_of_incarnation_clears_it() {
        let mut view = NameView::default();
        let decided = |slots: &[usize]| {
            let mut record = NameRecord::default();
            for slot in slots {
                record.votes[*slot] = Some(Box::new(proposal()));
            }
            record
        };
        view.merge(&name(), &decided(&[0, 1]), None);
        assert_eq!(view.get(&name()).unwrap().confirmed_at, None);
        assert_eq!(
            view.live_names(),
            vec![name()],
            "listed, though unconfirmed"
        );
        view.merge(&name(), &decided(&[0, 1]), Some(Millis(10)));
        assert_eq!(view.get(&name()).unwrap().confirmed_at, Some(Millis(10)));
        let mut deleted = decided(&[0, 1]);
        deleted.deleted_at = Some(Millis(11));
        view.merge(&name(), &deleted, None);
        assert_eq!(view.get(&name()).unwrap().confirmed_at, None);
        assert!(view.live_names().is_empty());
    }
}
