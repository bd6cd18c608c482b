//! Tombstone collection's driver (spec/replication.md#tombstones-and-their-collection): a
//! bounded background walk over this node's records that collects the tombstones (and the
//! records their own purge mark hides, spec/replication.md §2) of the keys this node is the
//! first replica of, so each record has one collector. For each it reads **all three**
//! replicas (`CollectOp`); only if all three hold the same record it notes its clock, and once
//! the horizon has passed by that clock it sends the conditional drops (`drop_requests`): a
//! replica holding anything else by then keeps it.
//!
//! Each round's walk also ends deduplication windows on this replica (spec/replication.md §4,
//! *WindowEnd*): the held and void copies it walks whose window ended are removed here, with no
//! tombstone and no read of the other replicas, and so are the deduplication records past their
//! window and `OP_TIMEOUT + SKEW_MAX` (at most `rows_per_round_max` a round).
//!
//! Each round also collects the tombstones of the queue names this node is the first replica of
//! (spec/replication.md §1, *Collection*): once the reuse wait has passed since the delete, it
//! writes the name's next epoch's empty record to the three replicas (an ordinary merge: no read
//! of all three, no horizon). Names are few; a round looks at every name record it holds.
//!
//! Work per round is bounded: `rows_per_round_max` rows of the walk (which resumes where the
//! last round stopped), `reads_in_flight_max` collection reads at once, and `waiting_max`
//! confirmed records waiting out the horizon in memory (a full list confirms nothing more until
//! drops empty it; a restart forgets the list and the walk confirms again). Nobody waits for a
//! drop for correctness; a round awaits the answers only to report them, each bounded by the
//! operation timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};
use trireme_core::Millis;
use trireme_replication::coordinator::{CollectAnswer, CollectOp, Outgoing, Reply, drop_requests};
use trireme_replication::dedup::{copy_window_ended, droppable};
use trireme_replication::name::{NameReply, NameRequest, collected};
use trireme_replication::{Generation, RecordKey};

use super::Cluster;
use super::store::{Entry, NameEntry, StoreError};

/// How often and how much collection works.
#[derive(Clone, Copy, Debug)]
pub struct CollectionSettings {
    /// Between the starts of two rounds.
    pub period: Duration,
    /// Rows of the store one round walks at most.
    pub rows_per_round_max: usize,
    /// Collection reads (of all three replicas) in flight at once.
    pub reads_in_flight_max: usize,
    /// Confirmed records waiting out the horizon, at most.
    pub waiting_max: usize,
}

impl Default for CollectionSettings {
    /// A round a minute over at most 4,096 rows, 64 reads at once, 100,000 records waiting.
    fn default() -> CollectionSettings {
        CollectionSettings {
            period: Duration::from_secs(60),
            rows_per_round_max: 4_096,
            reads_in_flight_max: 64,
            waiting_max: 100_000,
        }
    }
}

/// A record all three replicas were seen holding, waiting out the horizon.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    generation: Generation,
    confirmed_at: Millis,
}

/// Collection's state between rounds.
#[derive(Debug, Default)]
pub(super) struct Collector {
    /// Where the walk resumes: the last stored key read (`None`: from the start).
    cursor: Option<Vec<u8>>,
    waiting: BTreeMap<RecordKey, Waiting>,
}

/// What one collection round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectionReport {
    /// Rows of the store walked.
    pub rows: usize,
    /// Collectable records this node is the first replica of, read on all three replicas.
    pub read: usize,
    /// Of them, held alike by all three: now waiting out the horizon.
    pub confirmed: usize,
    /// Records whose horizon passed: conditional drops sent to their three replicas.
    pub dropped: usize,
    /// Drop requests answered (a replica that kept a newer record answers too).
    pub drops_answered: usize,
    /// Records still waiting out the horizon after the round.
    pub waiting: usize,
    /// Whether the walk reached the end of the store (the next round starts from the first).
    pub wrapped: bool,
    /// Name tombstones moved to their name's next epoch (writes sent to the three replicas).
    pub names_collected: usize,
    /// Of those writes, the ones acknowledged.
    pub name_writes_acked: usize,
    /// Whether the round did nothing because this node's clock does not let it coordinate
    /// (spec/replication.md#clock-monitoring: collection's horizon wait is read on that clock).
    pub skipped_for_clock: bool,
    /// Held or void copies of this node whose window ended, removed (spec/replication.md §4,
    /// *WindowEnd*).
    pub copies_expired: usize,
    /// Deduplication records of this node past their window and `OP_TIMEOUT + SKEW_MAX`,
    /// removed.
    pub dedups_expired: usize,
}

/// The background collection of one node. Dropping it stops the task.
pub struct CollectionTask {
    rounds: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl CollectionTask {
    /// Waits until `rounds` rounds have ended since the task started, and returns how many
    /// have.
    pub async fn rounds_at_least(&mut self, rounds: u64) -> u64 {
        let seen = self
            .rounds
            .wait_for(|done| *done >= rounds)
            .await
            .expect("the task lives as long as its handle");
        *seen
    }

    /// Stops the task and waits until it has let go of the cluster (drops already sent stay
    /// sent; the waiting list is forgotten, as at a restart).
    pub async fn stop(mut self) {
        self.task.abort();
        // A cancelled task ends with a `JoinError`, which is the point.
        let _ = (&mut self.task).await;
    }
}

impl Drop for CollectionTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Cluster {
    /// Starts collection in the background: a round at once and then every `settings.period`.
    #[must_use]
    pub fn spawn_collection(&self, settings: CollectionSettings) -> CollectionTask {
        let (ended, rounds) = watch::channel(0);
        let cluster = self.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(settings.period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match cluster.collection_round(&settings).await {
                    Ok(report) => debug!(?report, "collection round"),
                    Err(error) => warn!(%error, "collection round failed"),
                }
                ended.send_modify(|done| *done += 1);
            }
        });
        CollectionTask { rounds, task }
    }

    /// One collection round: drops what waited out the horizon, then walks on and reads the
    /// next collectable records on all three replicas. Nothing while this node's clock does
    /// not let it coordinate (the gate logs why).
    ///
    /// # Errors
    /// The store's error when the walk fails.
    pub async fn collection_round(
        &self,
        settings: &CollectionSettings,
    ) -> Result<CollectionReport, Arc<StoreError>> {
        assert!(settings.rows_per_round_max > 0 && settings.reads_in_flight_max > 0);
        if self.coordinating().await.is_err() {
            return Ok(CollectionReport {
                skipped_for_clock: true,
                ..CollectionReport::default()
            });
        }
        let mut collector = self.inner.collector.lock().await;
        let mut report = CollectionReport::default();
        self.collect_names(&mut report).await?;

        // Step 3: the horizon has passed since all three were seen holding the record.
        let now = self.inner.me.clock.now();
        let horizon_ms = self.inner.horizon_ms;
        let due: Vec<(RecordKey, Generation)> = collector
            .waiting
            .iter()
            .filter(|(_, waiting)| now.0.saturating_sub(waiting.confirmed_at.0) > horizon_ms)
            .map(|(key, waiting)| (key.clone(), waiting.generation))
            .collect();
        let mut drops = JoinSet::new();
        for (key, generation) in due {
            collector.waiting.remove(&key);
            report.dropped += 1;
            for out in drop_requests(key.clone(), self.replicas(&key), generation) {
                let cluster = self.clone();
                drops.spawn(async move { cluster.answer_of(out).await });
            }
        }

        // Step 1 for the next records of the walk.
        let me = self.inner.me.node;
        let after = collector.cursor.clone();
        let rows_max = settings.rows_per_round_max;
        let cluster = self.clone();
        let window_ms = self.inner.dedup_window_ms;
        let store = self.inner.store.clone();
        let (selected, last, rows) = store
            .scan_off(move || {
                let mut rows = 0;
                let scanned =
                    cluster
                        .inner
                        .store
                        .scan(after.as_deref(), rows_max, |key, record| {
                            rows += 1;
                            (record.collectable() && cluster.replicas(key)[0] == me)
                                || copy_window_ended(record, now, window_ms)
                        });
                scanned.map(|walk| (walk.selected, walk.last, rows))
            })
            .await
            .map_err(Arc::new)?;
        report.rows = rows;
        report.wrapped = last.is_none();
        collector.cursor = last;
        // The window's end (spec/replication.md §4, WindowEnd): every replica drops its own held
        // and void copies whose window ended, and its deduplication records once no put of
        // their window can still be accepted; no tombstone, no read of the other replicas.
        let (ended, selected): (Vec<_>, Vec<_>) = selected
            .into_iter()
            .partition(|(_, record)| copy_window_ended(record, now, window_ms));
        let late_ms = self.inner.dedup_late_ms;
        let cluster = self.clone();
        let (dedups, _) = self
            .inner
            .store
            .scan_off(move || {
                cluster
                    .inner
                    .store
                    .dedup_records(None, rows_max, |_, record| droppable(record, now, late_ms))
            })
            .await
            .map_err(Arc::new)?;
        if !ended.is_empty() || !dedups.is_empty() {
            let copies = ended.into_iter().map(|(key, _)| key).collect();
            let dedups = dedups.into_iter().map(|(key, _)| key).collect();
            let (copies, dedups) = self
                .inner
                .store
                .expire(copies, dedups, now, window_ms, late_ms)
                .await?;
            report.copies_expired = copies;
            report.dedups_expired = dedups;
        }
        let room = settings.waiting_max.saturating_sub(collector.waiting.len());
        let candidates: Vec<RecordKey> = selected
            .into_iter()
            .map(|(key, _)| key)
            .filter(|key| !collector.waiting.contains_key(key))
            .take(room)
            .collect();
        for chunk in candidates.chunks(settings.reads_in_flight_max) {
            let mut reads = JoinSet::new();
            for key in chunk {
                let cluster = self.clone();
                let key = key.clone();
                reads.spawn(async move {
                    let (op, effects) = CollectOp::start(
                        key.clone(),
                        cluster.replicas(&key),
                        cluster.inner.me.clock.now(),
                    );
                    (key, cluster.run(op, effects).await)
                });
            }
            report.read += chunk.len();
            while let Some(joined) = reads.join_next().await {
                let (key, answer) = joined.expect("a collection read does not panic");
                if let CollectAnswer::Confirmed {
                    generation,
                    confirmed_at,
                } = answer
                {
                    report.confirmed += 1;
                    collector.waiting.insert(
                        key,
                        Waiting {
                            generation,
                            confirmed_at,
                        },
                    );
                }
            }
        }
        report.waiting = collector.waiting.len();
        self.inner.metrics.set_tombstones_waiting(report.waiting);
        while let Some(joined) = drops.join_next().await {
            if joined.expect("a drop does not panic").is_some() {
                report.drops_answered += 1;
            }
        }
        Ok(report)
    }

    /// Moves every name tombstone this node is the first replica of, and whose reuse wait has
    /// passed, to its name's next epoch: the empty record written to the three replicas.
    async fn collect_names(&self, report: &mut CollectionReport) -> Result<(), Arc<StoreError>> {
        let (me, now) = (self.inner.me.node, self.inner.me.clock.now());
        let reuse_ms = trireme_core::limits::queue_name_reuse_ms;
        let cluster = self.clone();
        let due = self
            .inner
            .store
            .scan_off(move || {
                cluster.inner.store.name_records(None, usize::MAX, |name| {
                    cluster.name_replicas(name)[0] == me
                })
            })
            .await
            .map_err(Arc::new)?
            .0
            .into_iter()
            .filter_map(|(name, record)| {
                collected(&record, now, reuse_ms).map(|next| (name, next))
            });
        let mut writes = JoinSet::new();
        for (name, next) in due {
            report.names_collected += 1;
            for (slot, to) in self.name_replicas(&name).into_iter().enumerate() {
                let (cluster, name, next) = (self.clone(), name.clone(), next.clone());
                writes.spawn(async move {
                    let request = NameRequest::Write(next);
                    let reply = if to == me {
                        let entry = NameEntry {
                            name,
                            slot,
                            request,
                        };
                        cluster
                            .inner
                            .store
                            .apply_names(vec![entry])
                            .await
                            .ok()?
                            .pop()
                    } else {
                        cluster
                            .inner
                            .peers
                            .send_name(to, name, request)
                            .await
                            .ok()?
                            .ok()
                    };
                    reply.filter(|reply| *reply == NameReply::Ack)
                });
            }
        }
        while let Some(joined) = writes.join_next().await {
            if joined.expect("a name write does not panic").is_some() {
                report.name_writes_acked += 1;
            }
        }
        Ok(())
    }

    /// Sends one request and returns its answer, `None` for silence (bounded by the link's
    /// call timeout, or the local store's commit).
    async fn answer_of(&self, out: Outgoing) -> Option<Reply> {
        if out.to == self.inner.me.node {
            let entry = Entry {
                key: out.key,
                request: out.request,
            };
            self.inner.store.apply(vec![entry]).await.ok()?.pop()
        } else {
            match self.inner.peers.send(out.to, out.key, out.request).await {
                Ok(Ok(reply)) => Some(reply),
                _ => None,
            }
        }
    }
}
