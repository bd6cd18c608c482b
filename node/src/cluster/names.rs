//! Queues in the cluster (spec/replication.md §1, §11): the driver of the name operations of
//! `trireme_replication::name` and the node's local view of queue names.
//!
//! A create, delete, attribute or tag change, or settled read runs as a `NameOp` against the
//! name's three replicas (`Ring::name_replicas`), through this node's store for its own replica
//! and the peer links for the others, until it answers or the operation timeout passes. Every
//! record an operation settles enters this node's name view; a create, delete or change that
//! took effect is then pushed to every other member's view, unacknowledged. `queue` answers from
//! the view while a settled source confirmed its live incarnation within `VIEW_REFRESH_MS`, and
//! does a settled read otherwise (§11, a local miss never answers from the view).
//!
//! A purge (§2) is a name operation too: its guard's settled read, the watermark to the three
//! replicas, and the wait until this node's clock passes the watermark's margin, which the
//! operation is told by readings of the clock. A receive's quorum read of the watermark is one.
//!
//! A background sweeper drops the message records of deleted incarnations once their tombstone
//! is in the view (§1, *Delete*), and puts the purge mark on the live records the view's
//! watermark hides (§2, *Sweep*). This module decides nothing the crate decides: it runs
//! operations, feeds them replies and clock readings, keeps the view and the hybrid clock.

use std::collections::BTreeMap;

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, warn};
use trireme_core::{Millis, QueueName};
use trireme_replication::coordinator::{Effects, Request};
use trireme_replication::name::{
    Change, ChangeAnswer, CreateAnswer, DeleteQueueAnswer, NameAnswer, NameOp, NameOutgoing,
    NameRecord, NameReply, NameRequest, Proposal, Purge, PurgeAnswer, QueueIncarnation, ReadAnswer,
    WatermarkAnswer,
};
use trireme_replication::placement::REPLICAS;
use trireme_replication::replica::Write;
use trireme_replication::{NodeId, RecordKey};

use super::store::{Entry, NameEntry, NameView, ReplicaStore};
use super::{Cluster, SKEW_MAX_MS};

/// `VIEW_REFRESH` (spec §1): the view answers for a name at most this long after a settled
/// source last confirmed it.
pub const VIEW_REFRESH_MS: u64 = 10_000;
/// Rows of the store one step of the sweeper's walk reads.
const SWEEP_ROWS_PER_STEP: usize = 4_096;

/// A live queue as the cluster knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueState {
    /// The live incarnation (the decided proposal's).
    pub incarnation: QueueIncarnation,
    /// The current attributes: the create's, with every change on top (SQS names and values).
    pub attributes: BTreeMap<String, String>,
    /// The current tags.
    pub tags: BTreeMap<String, String>,
    /// `CreatedTimestamp`: the incarnation's `hlc_ms`.
    pub created_at: Millis,
    /// `LastModifiedTimestamp`: the greatest stamp of the attribute registers, or the creation.
    pub modified_at: Millis,
    /// The purge watermark (spec §2), `None` if never purged.
    pub purge_watermark: Option<Millis>,
}

impl QueueState {
    /// The live queue `record` shows, if any.
    #[must_use]
    pub fn of(record: &NameRecord) -> Option<QueueState> {
        let live = record.live()?;
        let created_at = Millis(live.incarnation.hlc_ms);
        let modified_at = record
            .attributes
            .values()
            .map(|register| Millis(register.hlc_ms))
            .fold(created_at, Millis::max);
        Some(QueueState {
            incarnation: live.incarnation,
            attributes: record
                .current_attributes()
                .expect("a live record has attributes"),
            tags: record.current_tags().expect("a live record has tags"),
            created_at,
            modified_at,
            purge_watermark: record.purge_watermark,
        })
    }
}

/// No settled read of the name by the operation timeout: fewer than two of its replicas
/// answered. The client may retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the queue name's replicas did not answer in time")]
pub struct NameUnavailable;

/// Why an attribute or tag change was not made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeQueueError {
    /// The incarnation is not the live one, or nothing is live (`QueueDoesNotExist`). Nothing
    /// was written.
    #[error("the queue is gone")]
    Gone,
    /// The change would add a tag beyond the 50-tag cap.
    #[error("too many tags")]
    TooManyTags,
    /// No quorum by the operation timeout; the change may still take effect.
    #[error("the queue name's replicas did not answer in time")]
    Unavailable,
}

/// The sweeper of one node; dropping it stops the task.
pub(super) struct Sweeper(JoinHandle<()>);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Sweeper {
    /// Starts the sweeper on `store`: a walk at once if any incarnation is known deleted or any
    /// queue purged (a restart resumes an unfinished drop or marking), and one after every
    /// commit that learned a deletion or raised a watermark.
    pub(super) fn spawn(store: ReplicaStore) -> Sweeper {
        let mut deletions = store.deletions();
        let mut purges = store.purges();
        Sweeper(tokio::spawn(async move {
            if store.names(|view| view.any_deleted() || view.any_purged()) {
                sweep(&store).await;
            }
            loop {
                // The senders live in the store this task holds: `changed` never fails here.
                let changed = tokio::select! {
                    // Either wakes the same walk; no random draw for the simulation.
                    biased;
                    changed = deletions.changed() => changed,
                    changed = purges.changed() => changed,
                };
                if changed.is_err() {
                    return;
                }
                // One walk serves every change seen so far.
                deletions.mark_unchanged();
                purges.mark_unchanged();
                sweep(&store).await;
            }
        }))
    }
}

/// What one walk of the sweeper did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Records of deleted incarnations dropped.
    pub dropped: usize,
    /// Live records given the purge mark of the watermark that hides them.
    pub marked: usize,
}

/// One walk over every message record, in steps of `SWEEP_ROWS_PER_STEP` rows: records of
/// deleted incarnations are dropped, and live records the view's watermark of their
/// incarnation hides get its purge mark (`Record::swept`, a merge through the store like any
/// write, so a record that changed since the walk read it merges with the mark). A failure is
/// logged; the next deletion or purge (or restart) walks again.
async fn sweep(store: &ReplicaStore) -> Swept {
    let mut after: Option<Vec<u8>> = None;
    let mut swept = Swept::default();
    loop {
        let (walker, from) = (store.clone(), after.take());
        let walk = store
            .scan_off(move || {
                walker.scan(from.as_deref(), SWEEP_ROWS_PER_STEP, |key, record| {
                    walker.names(|view| {
                        view.is_deleted(key)
                            || record
                                .swept(view.watermark(&key.queue, key.incarnation))
                                .is_some()
                    })
                })
            })
            .await;
        let walk = match walk {
            Ok(walk) => walk,
            Err(error) => {
                warn!(%error, "the sweep of deleted and purged queues' messages failed");
                return swept;
            }
        };
        let (deleted, marks): (Vec<_>, Vec<_>) = store.names(|view| {
            walk.selected
                .into_iter()
                .partition(|(key, _)| view.is_deleted(key))
        });
        let keys: Vec<RecordKey> = deleted.into_iter().map(|(key, _)| key).collect();
        if !keys.is_empty() {
            match store.drop_deleted(keys).await {
                Ok(count) => swept.dropped += count,
                Err(error) => {
                    warn!(%error, "dropping deleted queues' messages failed");
                    return swept;
                }
            }
        }
        let entries: Vec<Entry> = store.names(|view| {
            marks
                .into_iter()
                .filter_map(|(key, record)| {
                    let marked = record.swept(view.watermark(&key.queue, key.incarnation))?;
                    let write = Box::new(Write::Merge(marked));
                    Some(Entry {
                        key,
                        request: Request::Write { write, ack: true },
                    })
                })
                .collect()
        });
        if !entries.is_empty() {
            let count = entries.len();
            if let Err(error) = store.apply(entries).await {
                warn!(%error, "marking purged queues' messages failed");
                return swept;
            }
            swept.marked += count;
        }
        match walk.last {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    debug!(
        dropped = swept.dropped,
        marked = swept.marked,
        "swept deleted and purged queues' messages"
    );
    swept
}

impl Cluster {
    /// The three replicas of the queue name's own record, in slot order.
    #[must_use]
    pub fn name_replicas(&self, name: &QueueName) -> [NodeId; REPLICAS] {
        self.inner.ring.name_replicas(name)
    }

    /// Creates the queue `name` with `attributes` (SQS attribute names to SQS string values,
    /// opaque here) and `tags` (spec/replication.md §1, *Create*). `Created` also when another
    /// create with the same attributes won; `NameExists` when the live queue's attributes
    /// differ; `DeletedRecently` within 60 s of a delete; `Unavailable` when no decision came
    /// by the operation timeout (the create may still take effect).
    pub async fn create_queue(
        &self,
        name: &QueueName,
        attributes: BTreeMap<String, String>,
        tags: BTreeMap<String, String>,
    ) -> CreateAnswer {
        let now = self.inner.me.clock.now();
        let proposal = Proposal {
            incarnation: QueueIncarnation {
                hlc_ms: self.next_hlc(now),
                node: self.inner.me.node.0,
                nonce: self.nonce(),
            },
            attributes,
            tags,
        };
        let reuse_ms = trireme_core::limits::queue_name_reuse_ms;
        let (op, effects) = NameOp::create(self.name_replicas(name), proposal, now, reuse_ms);
        let (answer, settled) = self.run_name(name, op, effects).await;
        let NameAnswer::Create(answer) = answer else {
            unreachable!("a create answers as a create");
        };
        if let Some(record) = settled {
            // The push goes out first: the other views learn without waiting for this one's
            // commit (a deletion it shows is made durable here with an fsync).
            if matches!(answer, CreateAnswer::Created(_)) {
                self.push_to_views(name, &record);
            }
            self.learn(name, &record).await;
        }
        answer
    }

    /// Deletes the queue `name` (spec §1, *Delete*): `Deleted` once its tombstone is on two
    /// replicas, then pushed to every member's view; `DoesNotExist` when nothing is live.
    pub async fn delete_queue(&self, name: &QueueName) -> DeleteQueueAnswer {
        let now = self.inner.me.clock.now();
        let (op, effects) = NameOp::delete(self.name_replicas(name), now);
        let (answer, settled) = self.run_name(name, op, effects).await;
        let NameAnswer::Delete(answer) = answer else {
            unreachable!("a delete answers as a delete");
        };
        if let Some(record) = settled {
            // The push goes out first: the other views learn without waiting for this one's
            // commit (a deletion it shows is made durable here with an fsync).
            if matches!(answer, DeleteQueueAnswer::Deleted(_)) {
                self.push_to_views(name, &record);
            }
            self.learn(name, &record).await;
        }
        answer
    }

    /// The live queue `name`, if any: from the view while a settled source confirmed it within
    /// `VIEW_REFRESH_MS`, otherwise by a settled read (spec §11: a miss asks a quorum).
    ///
    /// # Errors
    /// [`NameUnavailable`] when the settled read did not complete by the operation timeout.
    pub async fn queue(&self, name: &QueueName) -> Result<Option<QueueState>, NameUnavailable> {
        self.queue_with(name, QueueState::of).await
    }

    /// What `read` takes from the record of the live queue `name`, if any, from the view or by
    /// a settled read as [`Cluster::queue`] finds it (which is `queue_with` of
    /// `QueueState::of`): for a request that needs less than the whole state, without copying
    /// the rest. `read` sees only a record with a live incarnation, and runs under the view's
    /// lock: it must only read and copy.
    ///
    /// # Errors
    /// [`NameUnavailable`] when the settled read did not complete by the operation timeout.
    pub async fn queue_with<T>(
        &self,
        name: &QueueName,
        read: impl Fn(&NameRecord) -> Option<T>,
    ) -> Result<Option<T>, NameUnavailable> {
        let now = self.inner.me.clock.now();
        if let Some(seen) = self.fresh(name, now, &read) {
            return Ok(Some(seen));
        }
        let record = self.record_settled(name).await?;
        if record.live().is_none() {
            return Ok(None);
        }
        Ok(read(&record))
    }

    /// The live queue `name`, if any, by a settled read whatever the view holds (spec §1,
    /// *Settled read*): it sees every change acknowledged before it started.
    ///
    /// # Errors
    /// [`NameUnavailable`] when the settled read did not complete by the operation timeout.
    pub async fn queue_settled(
        &self,
        name: &QueueName,
    ) -> Result<Option<QueueState>, NameUnavailable> {
        Ok(QueueState::of(&self.record_settled(name).await?))
    }

    /// The record of `name` by a settled read, learned into the view.
    async fn record_settled(&self, name: &QueueName) -> Result<NameRecord, NameUnavailable> {
        let now = self.inner.me.clock.now();
        let (op, effects) = NameOp::read(self.name_replicas(name), now);
        match self.run_name(name, op, effects).await.0 {
            NameAnswer::Read(ReadAnswer::Settled(record)) => {
                self.learn(name, &record).await;
                Ok(record)
            }
            NameAnswer::Read(ReadAnswer::Unavailable) => Err(NameUnavailable),
            _ => unreachable!("a read answers as a read"),
        }
    }

    /// Sets (`Some`) or clears (`None`) attributes and tags of the queue's `incarnation` (spec §1,
    /// *SetQueueAttributes, TagQueue, UntagQueue*), from a fresh view or a settled read.
    ///
    /// # Errors
    /// `Gone` when `incarnation` is not the live one; `TooManyTags` past the tag cap;
    /// `Unavailable` without two acks by the operation timeout.
    pub async fn change_queue(
        &self,
        name: &QueueName,
        incarnation: QueueIncarnation,
        attributes: BTreeMap<String, Option<String>>,
        tags: BTreeMap<String, Option<String>>,
    ) -> Result<(), ChangeQueueError> {
        let now = self.inner.me.clock.now();
        let view = self.fresh(name, now, |record| Some(record.clone()));
        let change = Change {
            incarnation,
            attributes,
            tags,
            tags_max: trireme_core::limits::tags_per_queue_max,
        };
        let clock = Millis(self.hlc_now(now));
        let (op, effects) = NameOp::change(
            self.name_replicas(name),
            self.inner.me.node,
            change,
            clock,
            view.as_ref(),
        );
        let (answer, settled) = self.run_name(name, op, effects).await;
        let NameAnswer::Change(answer) = answer else {
            unreachable!("a change answers as a change");
        };
        if let ChangeAnswer::Changed { hlc_ms } = answer {
            self.observe_hlc(hlc_ms);
        }
        if let Some(record) = settled {
            // The push goes out first: the other views learn without waiting for this one's
            // commit (a deletion it shows is made durable here with an fsync).
            if matches!(answer, ChangeAnswer::Changed { .. }) {
                self.push_to_views(name, &record);
            }
            self.learn(name, &record).await;
        }
        match answer {
            ChangeAnswer::Changed { .. } => Ok(()),
            ChangeAnswer::Gone => Err(ChangeQueueError::Gone),
            ChangeAnswer::TooManyTags => Err(ChangeQueueError::TooManyTags),
            ChangeAnswer::Unavailable => Err(ChangeQueueError::Unavailable),
        }
    }

    /// Walks this node's message records once now, drops those of every incarnation its view
    /// knows deleted and marks those its view's watermarks hide (what the background sweeper
    /// does after each deletion or purge it learns); returns how many it dropped.
    pub async fn sweep_deleted(&self) -> usize {
        sweep(&self.inner.store).await.dropped
    }

    /// As [`Cluster::sweep_deleted`], returning what the walk dropped and marked.
    pub async fn sweep(&self) -> Swept {
        sweep(&self.inner.store).await
    }

    /// Purges the queue's `incarnation` (spec/replication.md §2, *Purge*): the guard on a
    /// settled read, the watermark `now + SKEW_MAX` to the name's three replicas, and the answer
    /// only once two acked and this node's clock reads more than `watermark + SKEW_MAX`. The
    /// settled record with the watermark enters this node's view and is pushed to every other
    /// member's, so their sweeps, counts and candidates leave the purged records out.
    pub async fn purge_queue(
        &self,
        name: &QueueName,
        incarnation: QueueIncarnation,
    ) -> PurgeAnswer {
        let now = self.inner.me.clock.now();
        let purge = Purge {
            incarnation,
            skew_ms: SKEW_MAX_MS,
            interval_ms: trireme_core::limits::purge_interval_ms,
        };
        let (op, effects) = NameOp::purge(self.name_replicas(name), purge, now);
        // The margin's wait is part of the purge: it comes on top of the quorum's timeout.
        let deadline = tokio::time::Instant::now()
            + self.inner.operation_timeout
            + Duration::from_millis(2 * SKEW_MAX_MS + 1);
        let (answer, settled) = self.run_name_until(name, op, effects, deadline).await;
        let NameAnswer::Purge(answer) = answer else {
            unreachable!("a purge answers as a purge");
        };
        if let Some(record) = settled {
            if matches!(answer, PurgeAnswer::Purged { .. }) {
                self.push_to_views(name, &record);
            }
            self.learn(name, &record).await;
        }
        answer
    }

    /// The purge watermark of the queue's `incarnation` by a quorum read of its name's replicas
    /// (spec §2, *Receive* step 1): the greatest of two replies, nothing written back.
    pub async fn queue_watermark(
        &self,
        name: &QueueName,
        incarnation: QueueIncarnation,
    ) -> WatermarkAnswer {
        let now = self.inner.me.clock.now();
        let (op, effects) = NameOp::watermark(self.name_replicas(name), incarnation, now);
        match self.run_name(name, op, effects).await.0 {
            NameAnswer::Watermark(answer) => answer,
            _ => unreachable!("a watermark read answers as one"),
        }
    }

    /// This node's copy of the purge watermark of the queue's `incarnation` (its name view): a
    /// lower bound of the replicas' (spec §2: enough for the sweep, not for the receive).
    #[must_use]
    pub fn known_watermark(
        &self,
        name: &QueueName,
        incarnation: QueueIncarnation,
    ) -> Option<Millis> {
        self.inner
            .store
            .names(|view| view.watermark(name, incarnation))
    }

    /// The live names in this node's view, in name order (spec §11, `ListQueues`: a snapshot
    /// of the view, no quorum).
    #[must_use]
    pub fn queue_names(&self) -> Vec<QueueName> {
        self.inner.store.names(NameView::live_names)
    }

    /// `f` of the view's record of `name` if its live incarnation was confirmed within
    /// `VIEW_REFRESH_MS` of `now`.
    fn fresh<T>(
        &self,
        name: &QueueName,
        now: Millis,
        f: impl FnOnce(&NameRecord) -> Option<T>,
    ) -> Option<T> {
        self.inner.store.names(|view| {
            let viewed = view.get(name)?;
            let confirmed_at = viewed.confirmed_at?;
            if viewed.record.live().is_none()
                || now.0.saturating_sub(confirmed_at.0) >= VIEW_REFRESH_MS
            {
                return None;
            }
            f(&viewed.record)
        })
    }

    /// Merges a settled record into this node's view.
    async fn learn(&self, name: &QueueName, record: &NameRecord) {
        if self.inner.store.overloaded() {
            // Learning waits for the committer the store sheds from: the request that read the
            // record would wait behind it. The view stays as it was; the next request reads
            // again (spec/replication.md#durability, *A replica that is overloaded*).
            debug!(queue = %name.as_str(), "the replica store sheds: the name view learns later");
            return;
        }
        let learned = self
            .inner
            .store
            .learn(
                vec![(name.clone(), record.clone())],
                self.inner.me.clock.now(),
            )
            .await;
        if let Err(error) = learned {
            warn!(%error, queue = %name.as_str(), "the name view did not take a settled record");
        }
    }

    /// Pushes a settled record to every other member's view, unacknowledged (spec §11, 1).
    fn push_to_views(&self, name: &QueueName, record: &NameRecord) {
        for peer in self.peer_ids() {
            // Nobody awaits the answer: a lost push costs that view a later settled read.
            drop(
                self.inner
                    .peers
                    .send_name(peer, name.clone(), NameRequest::View(record.clone())),
            );
        }
    }

    /// A hybrid-clock reading strictly above every one this node drew or observed, and at
    /// least the clock's `now`.
    fn next_hlc(&self, now: Millis) -> u64 {
        let mut last = self
            .inner
            .hlc
            .lock()
            .expect("the hlc lock is never poisoned");
        *last = (*last + 1).max(now.0);
        *last
    }

    /// The hybrid clock now: the clock, or the last stamp if that is ahead.
    fn hlc_now(&self, now: Millis) -> u64 {
        let last = self
            .inner
            .hlc
            .lock()
            .expect("the hlc lock is never poisoned");
        now.0.max(*last)
    }

    fn observe_hlc(&self, stamp_ms: u64) {
        let mut last = self
            .inner
            .hlc
            .lock()
            .expect("the hlc lock is never poisoned");
        *last = (*last).max(stamp_ms);
    }

    /// Runs a name operation from its first `effects` to its answer or the operation timeout;
    /// returns the answer and the record the operation last settled.
    async fn run_name(
        &self,
        name: &QueueName,
        op: NameOp,
        effects: Effects<NameAnswer, NameOutgoing>,
    ) -> (NameAnswer, Option<NameRecord>) {
        let deadline = tokio::time::Instant::now() + self.inner.operation_timeout;
        self.run_name_until(name, op, effects, deadline).await
    }

    /// Runs a name operation to its answer or `deadline`. An operation that waits for this
    /// node's clock (a purge's margin) is given a reading each time the clock should have
    /// reached the awaited one, until it has: the clock is the node's [`crate::clock::Clock`],
    /// which need not run with the runtime's timer.
    async fn run_name_until(
        &self,
        name: &QueueName,
        mut op: NameOp,
        mut effects: Effects<NameAnswer, NameOutgoing>,
        deadline: tokio::time::Instant,
    ) -> (NameAnswer, Option<NameRecord>) {
        let (replies, mut incoming) = mpsc::unbounded_channel();
        loop {
            if let Some(answer) = effects.answer.take() {
                return (answer, op.settled().cloned());
            }
            self.dispatch_names(name, std::mem::take(&mut effects.sends), &replies);
            let clock_wait = op
                .waits_for_clock()
                .map(|at| Duration::from_millis(at.since(self.inner.me.clock.now())));
            effects = tokio::select! {
                // As `run`: a reply that arrives with the deadline counts, and no random draw.
                biased;
                reply = incoming.recv() => {
                    let (from, round, reply): (NodeId, u32, NameReply) =
                        reply.expect("the operation holds a sender of its own replies");
                    op.on_reply(from, round, &reply)
                }
                () = tokio::time::sleep(clock_wait.unwrap_or_default()), if clock_wait.is_some() => {
                    op.on_clock(self.inner.me.clock.now())
                }
                () = tokio::time::sleep_until(deadline) => op.on_timeout(),
            };
        }
    }

    /// Sends name requests: to this node's store directly, to peers through their links;
    /// replies go to `replies`, and a failure is silence.
    fn dispatch_names(
        &self,
        name: &QueueName,
        sends: Vec<NameOutgoing>,
        replies: &mpsc::UnboundedSender<(NodeId, u32, NameReply)>,
    ) {
        for out in sends {
            let (from, round, replies) = (out.to, out.round, replies.clone());
            if out.to == self.inner.me.node {
                let slot = self
                    .name_replicas(name)
                    .iter()
                    .position(|node| *node == self.inner.me.node)
                    .expect("an operation sends only to the name's replicas");
                let store = self.inner.store.clone();
                let entry = NameEntry {
                    name: name.clone(),
                    slot,
                    request: out.request,
                };
                let cluster = self.clone();
                tokio::spawn(async move {
                    if let Some(mut answers) =
                        cluster.heard_locally(store.apply_names(vec![entry]).await)
                        && let Some(reply) = answers.pop()
                    {
                        let _ = replies.send((from, round, reply));
                    }
                });
            } else {
                let answered = self
                    .inner
                    .peers
                    .send_name(out.to, name.clone(), out.request);
                let cluster = self.clone();
                tokio::spawn(async move {
                    if let Some(reply) = cluster.heard(from, answered.await) {
                        let _ = replies.send((from, round, reply));
                    }
                });
            }
        }
    }
}
