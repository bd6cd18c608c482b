//! Anti-entropy's driver (spec/replication.md#read-repair-and-anti-entropy): every
//! `ANTI_ENTROPY_PERIOD` this node compares, with each peer, the per-partition digests of the
//! records both of them replicate (tombstones included), fetches the records of the partitions
//! that differ, and both keep the merge: what the peer lacks goes back as ordinary
//! `Write::Merge` requests through `Exchange`, what this node lacks is merged into its own store.
//! A replica that was away catches up through this and read repair alone.
//!
//! A round starts with the queue names' own records (spec/replication.md §1, §13): one digest
//! of every name record the pair replicates, and when the two differ, every such record in pages
//! in name order, both keeping the merge (names are few, and a whole record is compared, votes
//! included), and the catalog: the records of the names the peer replicates and this node does
//! not, pulled into this node's view when their digest differs from the view's (§11). Then the
//! move tasks' records the pair replicates (§8), every one of them in pages in key order, both
//! keeping the merge (one per source that ever had a task: few). Then the live deduplication
//! records the pair replicates (§4): one digest of them (by each end's clock), and when the two
//! differ, those records in pages in key order; a key live on one side only is stored on the
//! other as a put of that value would be, and one live on both is left alone (written once per
//! window). Then the messages' records as above.
//!
//! Every node runs a round with every peer, so each pair is compared twice per period (once from
//! each end); either end alone converges the pair. A round's work is bounded: it stops after
//! `partitions_per_round_max` differing partitions or `records_per_round_max` records compared,
//! and the next round starts over (what the last one repaired no longer differs); a background
//! pass runs rounds back to back, up to `rounds_per_pass_max`, while they stop at a cap. What to
//! compare and what to send is `trireme_replication::anti_entropy`; this module only scans,
//! calls and applies.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};
use trireme_core::QueueName;
use trireme_proto::replica::v1 as pb;
use trireme_replication::anti_entropy::{
    differing, reconcile, reconcile_dedups, reconcile_joins, reconcile_names, shared, shares_dedup,
    shares_name,
};
use trireme_replication::coordinator::{Reply, Request};
use trireme_replication::dedup::{DedupKey, DedupRecord, DedupReply, DedupRequest};
use trireme_replication::name::{NameRecord, NameReply, NameRequest};
use trireme_replication::record::Record;
use trireme_replication::replica::Write;
use trireme_replication::task::{TaskKey, TaskRecord, TaskReply, TaskRequest, TaskWrite};
use trireme_replication::{NodeId, RecordKey};

use super::Cluster;
use super::service::{DEDUPS_PER_PAGE_MAX, NAMES_PER_PAGE_MAX, TASKS_PER_PAGE_MAX};
use super::store::{DedupEntry, Entry, NameEntry, TaskEntry};
use super::wire;

/// Partitions in the key space (a partition is the first 16 bits of a ring position).
const PARTITIONS: u32 = 1 << 16;

/// How often and how much anti-entropy works.
#[derive(Clone, Copy, Debug)]
pub struct AntiEntropySettings {
    /// Between the starts of two rounds with every peer (`ANTI_ENTROPY_PERIOD`).
    pub period: Duration,
    /// Partitions one digest call covers (a full comparison is `65536 / this` calls).
    pub partitions_per_call: u16,
    /// Differing partitions one round exchanges at most.
    pub partitions_per_round_max: usize,
    /// Records (both sides' together) one round compares at most.
    pub records_per_round_max: usize,
    /// Records one page of a partition holds at most.
    pub records_per_page: u32,
    /// Rounds with one peer a pass runs back to back while the last one stopped at a cap, so
    /// a node that missed much catches up within one period rather than one cap a period.
    pub rounds_per_pass_max: u32,
}

impl Default for AntiEntropySettings {
    /// The page's period, 10 minutes; 16 digest calls per comparison; at most 1,024 partitions
    /// and 16,384 records per round and peer, and 64 rounds per pass and peer (64 · 1,024 is
    /// every partition).
    fn default() -> AntiEntropySettings {
        AntiEntropySettings {
            period: Duration::from_secs(600),
            partitions_per_call: 4_096,
            partitions_per_round_max: 1_024,
            records_per_round_max: 16_384,
            records_per_page: 256,
            rounds_per_pass_max: 64,
        }
    }
}

/// What one round with one peer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Whether the name digests differed, so the pair's name records were exchanged.
    pub names_exchanged: bool,
    /// Name records compared, both sides together (0 when the digests agreed).
    pub names_compared: usize,
    /// Name records the peer lacked something of, pushed and acknowledged.
    pub names_pushed: usize,
    /// Name records this node lacked something of, merged here.
    pub names_pulled: usize,
    /// Name records of names the peer replicates and this node does not, merged into this
    /// node's view (the catalog's anti-entropy, spec/replication.md §11); 0 when the view's
    /// digest of them already agreed.
    pub catalog_pulled: usize,
    /// Move tasks' records compared, both sides together.
    pub tasks_compared: usize,
    /// Task records the peer lacked something of, pushed and acknowledged.
    pub tasks_pushed: usize,
    /// Task records this node lacked something of, merged here.
    pub tasks_pulled: usize,
    /// Whether the digests of live deduplication records differed, so they were exchanged.
    pub dedups_exchanged: bool,
    /// Live deduplication records compared, both sides together (0 when the digests agreed).
    pub dedups_compared: usize,
    /// Deduplication records the peer had no live record of, sent (it stores them if it
    /// still has none).
    pub dedups_pushed: usize,
    /// Deduplication records this node had no live record of, offered to its store.
    pub dedups_pulled: usize,
    /// Non-empty partitions compared (either side's).
    pub partitions_compared: usize,
    /// Partitions whose digests differed and whose records were exchanged.
    pub partitions_exchanged: usize,
    /// Records of those partitions compared, both sides together.
    pub records_compared: usize,
    /// Records the peer lacked something of, pushed and acknowledged.
    pub pushed: usize,
    /// Pushed records the peer refused or did not acknowledge.
    pub push_failures: usize,
    /// Records this node lacked something of, merged here.
    pub pulled: usize,
    /// Keys whose two records diverge (a writer's bug): shown, never spread.
    pub diverged: usize,
    /// Whether the round compared every partition (it stops early at its caps).
    pub complete: bool,
}

/// Why a round with a peer ended early.
#[derive(Debug, thiserror::Error)]
pub enum AntiEntropyError {
    /// The peer is not a member.
    #[error("{0} is not a member")]
    NotAMember(NodeId),
    /// A call to the peer failed or timed out.
    #[error("{peer} did not answer: {status}")]
    Call {
        peer: NodeId,
        #[source]
        status: tonic::Status,
    },
    /// The peer's answer is malformed.
    #[error("{peer} answered with a malformed message: {source}")]
    Wire {
        peer: NodeId,
        #[source]
        source: wire::WireError,
    },
    /// This node's store failed.
    #[error("replica store: {0}")]
    Store(#[from] std::sync::Arc<super::store::StoreError>),
}

/// The background anti-entropy of one node. Dropping it stops the task.
pub struct AntiEntropyTask {
    passes: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl AntiEntropyTask {
    /// Waits until `passes` passes (a round with every peer) have ended since the task started,
    /// and returns how many have.
    pub async fn passes_at_least(&mut self, passes: u64) -> u64 {
        let seen = self
            .passes
            .wait_for(|done| *done >= passes)
            .await
            .expect("the task lives as long as its handle");
        *seen
    }

    /// Passes ended so far.
    #[must_use]
    pub fn passes(&self) -> u64 {
        *self.passes.borrow()
    }

    /// Stops the task and waits until it has let go of the cluster (a round in progress ends
    /// where it is: what it exchanged stays exchanged).
    pub async fn stop(mut self) {
        self.task.abort();
        // A cancelled task ends with a `JoinError`, which is the point.
        let _ = (&mut self.task).await;
    }
}

impl Drop for AntiEntropyTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Cluster {
    /// Starts anti-entropy in the background: a pass (rounds with every peer, one peer after
    /// the other, until a round compares everything or `rounds_per_pass_max` ran) at once and
    /// then every `settings.period`. A failed round is logged and the pass goes on with the next
    /// peer.
    #[must_use]
    pub fn spawn_anti_entropy(&self, settings: AntiEntropySettings) -> AntiEntropyTask {
        let (passed, passes) = watch::channel(0);
        let cluster = self.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(settings.period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                for peer in cluster.peer_ids() {
                    for _ in 0..settings.rounds_per_pass_max {
                        match cluster.anti_entropy_round(peer, &settings).await {
                            Ok(report) => {
                                debug!(%peer, ?report, "anti-entropy round");
                                cluster.metrics().observe_anti_entropy(
                                    peer.0,
                                    Some((report.pushed, report.pulled)),
                                );
                                if report.complete {
                                    break;
                                }
                            }
                            Err(error) => {
                                warn!(%peer, %error, "anti-entropy round failed");
                                cluster.metrics().observe_anti_entropy(peer.0, None);
                                break;
                            }
                        }
                    }
                }
                passed.send_modify(|done| *done += 1);
            }
        });
        AntiEntropyTask { passes, task }
    }

    /// The other members, in id order.
    pub(super) fn peer_ids(&self) -> Vec<NodeId> {
        self.inner
            .ring
            .members()
            .into_iter()
            .filter(|member| *member != self.inner.me.node)
            .collect()
    }

    /// One anti-entropy round with `peer`: compares every partition's digest (in calls of
    /// `partitions_per_call`), and exchanges the records of those that differ until a cap of
    /// `settings` is reached.
    ///
    /// # Errors
    /// The first failed call or store operation; what was exchanged before it stays exchanged.
    pub async fn anti_entropy_round(
        &self,
        peer: NodeId,
        settings: &AntiEntropySettings,
    ) -> Result<RoundReport, AntiEntropyError> {
        assert!(
            settings.partitions_per_call > 0,
            "a digest call covers a partition"
        );
        let mut client = self
            .inner
            .peers
            .client(peer)
            .ok_or(AntiEntropyError::NotAMember(peer))?;
        let mut report = RoundReport::default();
        self.exchange_names(&mut client, peer, &mut report).await?;
        self.pull_catalog(&mut client, peer, &mut report).await?;
        self.exchange_tasks(&mut client, peer, &mut report).await?;
        self.exchange_dedups(&mut client, peer, settings, &mut report)
            .await?;
        let step = u32::from(settings.partitions_per_call);
        for first in (0..PARTITIONS).step_by(step as usize) {
            let last = (first + step - 1).min(PARTITIONS - 1);
            let (first, last) = (
                u16::try_from(first).expect("below 65536"),
                u16::try_from(last).expect("below 65536"),
            );
            let theirs = client
                .digests(pb::DigestsRequest {
                    sender: Some(self.inner.me.now().into()),
                    first_partition: u32::from(first),
                    last_partition: u32::from(last),
                })
                .await
                .map_err(|status| AntiEntropyError::Call { peer, status })?
                .into_inner();
            let theirs = wire::digests(&theirs.digests)
                .map_err(|source| AntiEntropyError::Wire { peer, source })?;
            let mine = self
                .blocking(move |cluster| {
                    let (ring, me) = (&cluster.inner.ring, cluster.inner.me.node);
                    cluster
                        .inner
                        .store
                        .digests(first, last, |key| shared(ring, me, peer, key))
                })
                .await
                .map_err(std::sync::Arc::new)?;
            report.partitions_compared += mine
                .keys()
                .chain(theirs.keys())
                .collect::<BTreeSet<_>>()
                .len();
            for partition in differing(&mine, &theirs) {
                if report.partitions_exchanged == settings.partitions_per_round_max
                    || report.records_compared >= settings.records_per_round_max
                {
                    return Ok(report);
                }
                report.partitions_exchanged += 1;
                self.exchange_partition(&mut client, peer, partition, settings, &mut report)
                    .await?;
            }
        }
        report.complete = true;
        Ok(report)
    }

    /// Compares the name digests with `peer` and, when they differ, exchanges every name record
    /// the pair replicates, page by page.
    async fn exchange_names(
        &self,
        client: &mut pb::replica_client::ReplicaClient<tonic::transport::Channel>,
        peer: NodeId,
        report: &mut RoundReport,
    ) -> Result<(), AntiEntropyError> {
        let theirs = client
            .name_digest(pb::NameDigestRequest {
                sender: Some(self.inner.me.now().into()),
                catalog: false,
            })
            .await
            .map_err(|status| AntiEntropyError::Call { peer, status })?
            .into_inner();
        let mine = self
            .blocking(move |cluster| {
                let (ring, me) = (&cluster.inner.ring, cluster.inner.me.node);
                cluster
                    .inner
                    .store
                    .name_digest(|name| shares_name(ring, me, peer, name))
            })
            .await
            .map_err(std::sync::Arc::new)?;
        if mine == wire::name_digest_of(&theirs) {
            return Ok(());
        }
        report.names_exchanged = true;
        let mut after: Option<QueueName> = None;
        // Bounded: every page moves `after` forward through a finite, ordered set of names.
        loop {
            let (theirs, more) = self.name_page(client, peer, after.as_ref(), false).await?;
            let theirs: BTreeMap<QueueName, NameRecord> = theirs.into_iter().collect();
            // This node's names of the same range: after the page's start, through its last
            // name when the peer has more, to the end otherwise.
            let through = if more {
                theirs.keys().next_back().cloned()
            } else {
                None
            };
            let range = (after.clone(), through.clone());
            let mine: BTreeMap<QueueName, NameRecord> = self
                .blocking(move |cluster| {
                    let (ring, me) = (&cluster.inner.ring, cluster.inner.me.node);
                    cluster
                        .inner
                        .store
                        .name_records(range.0.as_ref(), usize::MAX, |name| {
                            range.1.as_ref().is_none_or(|last| name <= last)
                                && shares_name(ring, me, peer, name)
                        })
                        .map(|(records, _)| records)
                })
                .await
                .map_err(std::sync::Arc::new)?
                .into_iter()
                .collect();
            report.names_compared += mine.len() + theirs.len();
            let reconciled = reconcile_names(&mine, &theirs);
            report.names_pulled += self.merge_names_here(reconciled.to_me).await?;
            report.names_pushed += self.push_names(peer, reconciled.to_peer).await;
            match through {
                Some(last) => after = Some(last),
                None => return Ok(()),
            }
        }
    }

    /// The catalog's anti-entropy (spec/replication.md §11, item 3): the records of the names
    /// `peer` replicates and this node does not, compared by digest with this node's view and,
    /// when they differ, pulled page by page into the view. Views never push to replicas.
    async fn pull_catalog(
        &self,
        client: &mut pb::replica_client::ReplicaClient<tonic::transport::Channel>,
        peer: NodeId,
        report: &mut RoundReport,
    ) -> Result<(), AntiEntropyError> {
        let theirs = client
            .name_digest(pb::NameDigestRequest {
                sender: Some(self.inner.me.now().into()),
                catalog: true,
            })
            .await
            .map_err(|status| AntiEntropyError::Call { peer, status })?
            .into_inner();
        let me = self.inner.me.node;
        let mine = self.inner.store.view_digest(|name| {
            let replicas = self.name_replicas(name);
            replicas.contains(&peer) && !replicas.contains(&me)
        });
        if mine == wire::name_digest_of(&theirs) {
            return Ok(());
        }
        let mut after: Option<QueueName> = None;
        // Bounded: every page moves `after` forward through a finite, ordered set of names.
        loop {
            let (records, more) = self.name_page(client, peer, after.as_ref(), true).await?;
            let last = records.last().map(|(name, _)| name.clone());
            report.catalog_pulled += records.len();
            if !records.is_empty() {
                self.inner.store.learn_unsettled(records).await?;
            }
            match (more, last) {
                (true, Some(last)) => after = Some(last),
                _ => return Ok(()),
            }
        }
    }

    /// One page of `peer`'s name records after `after`: those both replicate, or with
    /// `catalog` those only the peer replicates; and whether it has more.
    async fn name_page(
        &self,
        client: &mut pb::replica_client::ReplicaClient<tonic::transport::Channel>,
        peer: NodeId,
        after: Option<&QueueName>,
        catalog: bool,
    ) -> Result<(Vec<(QueueName, NameRecord)>, bool), AntiEntropyError> {
        let page = client
            .name_records(pb::NameRecordsRequest {
                sender: Some(self.inner.me.now().into()),
                after_name: after
                    .map(|name| name.as_str().to_owned())
                    .unwrap_or_default(),
                limit: u32::try_from(NAMES_PER_PAGE_MAX).expect("a small page"),
                catalog,
            })
            .await
            .map_err(|status| AntiEntropyError::Call { peer, status })?
            .into_inner();
        let records = wire::stored_names(&page.records)
            .map_err(|source| AntiEntropyError::Wire { peer, source })?;
        Ok((records, page.more))
    }

    /// Merges name records into this node's replica records; returns how many it accepted.
    async fn merge_names_here(
        &self,
        records: Vec<(QueueName, NameRecord)>,
    ) -> Result<usize, AntiEntropyError> {
        let me = self.inner.me.node;
        let entries: Vec<NameEntry> = records
            .into_iter()
            .map(|(name, record)| NameEntry {
                slot: self
                    .name_replicas(&name)
                    .iter()
                    .position(|node| *node == me)
                    .expect("a pair exchanges only names both replicate"),
                name,
                request: NameRequest::Write(record),
            })
            .collect();
        if entries.is_empty() {
            return Ok(0);
        }
        let replies = self.inner.store.apply_names(entries).await?;
        Ok(replies
            .iter()
            .filter(|reply| **reply == NameReply::Ack)
            .count())
    }

    /// Pushes name records to `peer` as ordinary merges; returns how many it acknowledged.
    async fn push_names(&self, peer: NodeId, records: Vec<(QueueName, NameRecord)>) -> usize {
        let answers: Vec<_> = records
            .into_iter()
            .map(|(name, record)| {
                self.inner
                    .peers
                    .send_name(peer, name, NameRequest::Write(record))
            })
            .collect();
        let mut acked = 0;
        for answer in answers {
            if matches!(answer.await, Ok(Ok(NameReply::Ack))) {
                acked += 1;
            }
        }
        acked
    }

    /// Exchanges every move task's record the pair replicates with `peer`, page by page: the
    /// peer's page, this node's records of the same key range, and both sides' merges.
    async fn exchange_tasks(
        &self,
        client: &mut pb::replica_client::ReplicaClient<tonic::transport::Channel>,
        peer: NodeId,
        report: &mut RoundReport,
    ) -> Result<(), AntiEntropyError> {
        let mut after: Option<Vec<u8>> = None;
        // Bounded: every page moves `after` forward through a finite, ordered set of keys.
        loop {
            let page = client
                .task_records(pb::TaskRecordsRequest {
                    sender: Some(self.inner.me.now().into()),
                    after_key: after.clone().unwrap_or_default(),
                    limit: u32::try_from(TASKS_PER_PAGE_MAX).expect("a small page"),
                })
                .await
                .map_err(|status| AntiEntropyError::Call { peer, status })?
                .into_inner();
            let theirs: BTreeMap<TaskKey, TaskRecord> = wire::stored_tasks(&page.records)
                .map_err(|source| AntiEntropyError::Wire { peer, source })?
                .into_iter()
                .collect();
            let through = if page.more {
                page.records.last().map(|stored| stored.key.clone())
            } else {
                None
            };
            let range = (after.clone(), through.clone());
            let mine: BTreeMap<TaskKey, TaskRecord> = self
                .blocking(move |cluster| {
                    let (ring, me) = (&cluster.inner.ring, cluster.inner.me.node);
                    cluster
                        .inner
                        .store
                        .task_records(range.0.as_deref(), usize::MAX, |key, _| {
                            range
                                .1
                                .as_deref()
                                .is_none_or(|last| key.encode().as_slice() <= last)
                                && shares_name(ring, me, peer, &key.queue)
                        })
                        .map(|(records, _)| records)
                })
                .await
                .map_err(std::sync::Arc::new)?
                .into_iter()
                .collect();
            report.tasks_compared += mine.len() + theirs.len();
            let reconciled = reconcile_joins(&mine, &theirs, TaskRecord::merge);
            report.tasks_pulled += self.merge_tasks_here(reconciled.to_me).await?;
            report.tasks_pushed += self.push_tasks(peer, reconciled.to_peer).await;
            match through {
                Some(last) => after = Some(last),
                None => return Ok(()),
            }
        }
    }

    /// Exchanges the live deduplication records the pair replicates with `peer` when their
    /// digests differ (spec/replication.md §4, *Anti-entropy*), page by page, until
    /// `records_per_round_max` are compared: a key live on one side only goes to the other.
    async fn exchange_dedups(
        &self,
        client: &mut pb::replica_client::ReplicaClient<tonic::transport::Channel>,
        peer: NodeId,
        settings: &AntiEntropySettings,
        report: &mut RoundReport,
    ) -> Result<(), AntiEntropyError> {
        let theirs = client
            .dedup_digest(pb::DedupDigestRequest {
                sender: Some(self.inner.me.now().into()),
            })
            .await
            .map_err(|status| AntiEntropyError::Call { peer, status })?
            .into_inner();
        let now = self.inner.me.clock.now();
        let mine = self
            .blocking(move |cluster| {
                let (ring, me) = (&cluster.inner.ring, cluster.inner.me.node);
                cluster.inner.store.dedup_digest(|key, record| {
                    record.live_at(now) && shares_dedup(ring, me, peer, key)
                })
            })
            .await
            .map_err(std::sync::Arc::new)?;
        if mine == wire::dedup_digest_of(&theirs) {
            return Ok(());
        }
        report.dedups_exchanged = true;
        let mut after: Option<Vec<u8>> = None;
        // Bounded: every page moves `after` forward through a finite, ordered set of keys, and
        // the round stops at its cap of records compared.
        while report.dedups_compared < settings.records_per_round_max {
            let page = client
                .dedup_records(pb::DedupRecordsRequest {
                    sender: Some(self.inner.me.now().into()),
                    after_key: after.clone().unwrap_or_default(),
                    limit: u32::try_from(DEDUPS_PER_PAGE_MAX).expect("a small page"),
                })
                .await
                .map_err(|status| AntiEntropyError::Call { peer, status })?
                .into_inner();
            let theirs: BTreeMap<DedupKey, DedupRecord> = wire::stored_dedups(&page.records)
                .map_err(|source| AntiEntropyError::Wire { peer, source })?
                .into_iter()
                .collect();
            let through = if page.more {
                page.records.last().map(|stored| stored.key.clone())
            } else {
                None
            };
            let range = (after.clone(), through.clone());
            let now = self.inner.me.clock.now();
            let mine: BTreeMap<DedupKey, DedupRecord> = self
                .blocking(move |cluster| {
                    let (ring, me) = (&cluster.inner.ring, cluster.inner.me.node);
                    cluster
                        .inner
                        .store
                        .dedup_records(range.0.as_deref(), usize::MAX, |key, record| {
                            range
                                .1
                                .as_deref()
                                .is_none_or(|last| key.encode().as_slice() <= last)
                                && record.live_at(now)
                                && shares_dedup(ring, me, peer, key)
                        })
                        .map(|(records, _)| records)
                })
                .await
                .map_err(std::sync::Arc::new)?
                .into_iter()
                .collect();
            report.dedups_compared += mine.len() + theirs.len();
            let reconciled = reconcile_dedups(&mine, &theirs);
            report.dedups_pulled += reconciled.to_me.len();
            if !reconciled.to_me.is_empty() {
                let entries = reconciled
                    .to_me
                    .into_iter()
                    .map(|(key, record)| DedupEntry {
                        key,
                        request: DedupRequest::Learn(record),
                        now,
                        late_ms: self.inner.dedup_late_ms,
                    })
                    .collect();
                self.inner.store.apply_dedups(entries).await?;
            }
            report.dedups_pushed += self.push_dedups(peer, reconciled.to_peer).await;
            match through {
                Some(last) => after = Some(last),
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// Offers deduplication records to `peer`, which stores each it has no live record of;
    /// returns how many it answered.
    async fn push_dedups(&self, peer: NodeId, records: Vec<(DedupKey, DedupRecord)>) -> usize {
        let answers: Vec<_> = records
            .into_iter()
            .map(|(key, record)| {
                self.inner
                    .peers
                    .send_dedup(peer, key, DedupRequest::Learn(record))
            })
            .collect();
        let mut answered = 0;
        for answer in answers {
            if matches!(answer.await, Ok(Ok(DedupReply::Ack))) {
                answered += 1;
            }
        }
        answered
    }

    /// Merges task records into this node's store; returns how many it accepted.
    async fn merge_tasks_here(
        &self,
        records: Vec<(TaskKey, TaskRecord)>,
    ) -> Result<usize, AntiEntropyError> {
        if records.is_empty() {
            return Ok(0);
        }
        let entries = records
            .into_iter()
            .map(|(key, record)| TaskEntry {
                key,
                request: merge_task(record),
            })
            .collect();
        let replies = self.inner.store.apply_tasks(entries).await?;
        Ok(replies
            .iter()
            .filter(|reply| **reply == TaskReply::Ack)
            .count())
    }

    /// Pushes task records to `peer` as ordinary merges; returns how many it acknowledged.
    async fn push_tasks(&self, peer: NodeId, records: Vec<(TaskKey, TaskRecord)>) -> usize {
        let answers: Vec<_> = records
            .into_iter()
            .map(|(key, record)| self.inner.peers.send_task(peer, key, merge_task(record)))
            .collect();
        let mut acked = 0;
        for answer in answers {
            if matches!(answer.await, Ok(Ok(TaskReply::Ack))) {
                acked += 1;
            }
        }
        acked
    }

    /// Exchanges one partition with `peer`, page by page: the peer's page, this node's records
    /// of the same key range, and both sides' merges.
    async fn exchange_partition(
        &self,
        client: &mut pb::replica_client::ReplicaClient<tonic::transport::Channel>,
        peer: NodeId,
        partition: u16,
        settings: &AntiEntropySettings,
        report: &mut RoundReport,
    ) -> Result<(), AntiEntropyError> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = client
                .records(pb::RecordsRequest {
                    sender: Some(self.inner.me.now().into()),
                    partition: u32::from(partition),
                    after_key: after.clone().unwrap_or_default(),
                    limit: settings.records_per_page,
                })
                .await
                .map_err(|status| AntiEntropyError::Call { peer, status })?
                .into_inner();
            let more = page.more;
            let theirs: BTreeMap<RecordKey, Record> = wire::stored_records(&page.records)
                .map_err(|source| AntiEntropyError::Wire { peer, source })?
                .into_iter()
                .collect();
            // The peer's page ends at its last key when it has more; this node reads the same
            // range, so a key missing on one side is seen as missing, not as on the next page.
            let through = if more {
                page.records.last().map(|stored| stored.key.clone())
            } else {
                None
            };
            let range = (after.clone(), through.clone());
            let mine: BTreeMap<RecordKey, Record> = self
                .blocking(move |cluster| {
                    let (ring, me) = (&cluster.inner.ring, cluster.inner.me.node);
                    cluster
                        .inner
                        .store
                        .partition_page(
                            partition,
                            range.0.as_deref(),
                            range.1.as_deref(),
                            usize::MAX,
                            usize::MAX,
                            |key| shared(ring, me, peer, key),
                        )
                        .map(|(records, _)| records)
                })
                .await
                .map_err(std::sync::Arc::new)?
                .into_iter()
                .collect();
            report.records_compared += mine.len() + theirs.len();
            let reconciled = reconcile(&mine, &theirs);
            for key in &reconciled.diverged {
                tracing::error!(%peer, ?key, "anti-entropy found two records of one generation with different once-fields");
            }
            report.diverged += reconciled.diverged.len();
            report.pulled += self.merge_here(reconciled.to_me).await?;
            let (pushed, failed) = self.push(peer, reconciled.to_peer).await;
            report.pushed += pushed;
            report.push_failures += failed;
            match (more, through) {
                (true, Some(last)) => after = Some(last),
                _ => return Ok(()),
            }
        }
    }

    /// Merges `records` into this node's store; returns how many it accepted.
    async fn merge_here(
        &self,
        records: Vec<(RecordKey, Record)>,
    ) -> Result<usize, AntiEntropyError> {
        if records.is_empty() {
            return Ok(0);
        }
        let entries = records
            .into_iter()
            .map(|(key, record)| Entry {
                key,
                request: merge(record),
            })
            .collect();
        let replies = self.inner.store.apply(entries).await?;
        Ok(replies.iter().filter(|reply| **reply == Reply::Ack).count())
    }

    /// Pushes `records` to `peer` as ordinary merges and waits for their acks (each bounded by
    /// the link's call timeout); returns `(acknowledged, not acknowledged)`.
    async fn push(&self, peer: NodeId, records: Vec<(RecordKey, Record)>) -> (usize, usize) {
        let answers: Vec<_> = records
            .into_iter()
            .map(|(key, record)| self.inner.peers.send(peer, key, merge(record)))
            .collect();
        let mut acked = 0;
        let total = answers.len();
        for answer in answers {
            if matches!(answer.await, Ok(Ok(Reply::Ack))) {
                acked += 1;
            }
        }
        (acked, total - acked)
    }

    /// Runs a blocking store scan off the async runtime.
    async fn blocking<T: Send + 'static>(
        &self,
        scan: impl FnOnce(&Cluster) -> T + Send + 'static,
    ) -> T {
        let cluster = self.clone();
        self.inner.store.scan_off(move || scan(&cluster)).await
    }
}

fn merge(record: Record) -> Request {
    Request::Write {
        write: Box::new(Write::Merge(record)),
        ack: true,
    }
}

fn merge_task(record: TaskRecord) -> TaskRequest {
    TaskRequest::Write {
        write: Box::new(TaskWrite::Merge(record)),
        ack: true,
    }
}
