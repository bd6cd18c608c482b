//! Retention expiry on this node (spec/replication.md §3, *Sweep*): every `EXPIRY_PERIOD`, the
//! live records this replica holds that are past their queue's `MessageRetentionPeriod` since
//! their original send, by this node's clock, become tombstones of their generation (a merge
//! through the store like any write, so a record that changed since is merged, and a newer
//! generation stays). From there on they are ordinary tombstones: collection drops them. A node
//! whose clock does not let it coordinate does not sweep (spec/replication.md#clock-monitoring);
//! the receive checks expiry by the coordinator's clock whether or not the sweeps ran.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{debug, warn};
use trireme_core::QueueName;
use trireme_replication::RecordKey;
use trireme_replication::coordinator::{Reply, Request};
use trireme_replication::record::{Record, TombstoneReason};
use trireme_replication::replica::Write;

use super::edge::attributes_from_registers;
use super::names::QueueState;
use super::store::{Entry, StoreError};
use super::{Cluster, Inner};

/// Between two expiry passes.
const EXPIRY_PERIOD: Duration = Duration::from_secs(1);
/// Records one pass tombstones at most per queue (the next pass takes the rest).
const EXPIRED_PER_QUEUE_MAX: usize = 1_024;

/// Runs the expiry passes while the cluster lives (it holds the cluster only during a pass).
pub(super) fn spawn(cluster: Weak<Inner>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(EXPIRY_PERIOD).await;
            let Some(inner) = cluster.upgrade() else {
                return;
            };
            let cluster = Cluster { inner };
            if cluster.coordinating().await.is_err() {
                continue;
            }
            match cluster.expire().await {
                Ok(0) => {}
                Ok(expired) => debug!(expired, "retention expiry"),
                Err(error) => warn!(%error, "retention expiry failed; the next pass tries again"),
            }
        }
    });
}

impl Cluster {
    /// One expiry pass over every live queue this node knows: returns how many records it
    /// tombstoned.
    ///
    /// # Errors
    /// The store's, when a read or the tombstones' commit failed.
    pub async fn expire(&self) -> Result<usize, Arc<StoreError>> {
        let now = self.inner.me.clock.now();
        let queues: Vec<(QueueName, QueueState)> = self.inner.store.names(|view| {
            view.live_names()
                .into_iter()
                .filter_map(|name| {
                    let state = view
                        .get(&name)
                        .and_then(|seen| QueueState::of(&seen.record))?;
                    Some((name, state))
                })
                .collect()
        });
        let mut expired = 0;
        for (name, state) in queues {
            let Ok(attributes) = attributes_from_registers(&state.attributes) else {
                continue;
            };
            let retention_ms = attributes.retention_ms();
            let ids = self.inner.store.view(|view| {
                view.expired(
                    &name,
                    state.incarnation,
                    retention_ms,
                    now,
                    EXPIRED_PER_QUEUE_MAX,
                )
            });
            if ids.is_empty() {
                continue;
            }
            let keys: Vec<RecordKey> = ids
                .into_iter()
                .map(|message| RecordKey {
                    queue: name.clone(),
                    incarnation: state.incarnation,
                    message,
                })
                .collect();
            let reads = keys
                .iter()
                .map(|key| Entry {
                    key: key.clone(),
                    request: Request::Read,
                })
                .collect();
            let read = self.inner.store.apply(reads).await?;
            let tombstones: Vec<Entry> = keys
                .into_iter()
                .zip(read)
                .filter_map(|(key, reply)| match reply {
                    Reply::Record(Some(record))
                        if record.live().is_some_and(|live| {
                            live.birth.sent_at.plus_ms(retention_ms) <= now
                        }) =>
                    {
                        let tombstone =
                            Record::tombstone(record.generation, TombstoneReason::Expired, now);
                        Some(Entry {
                            key,
                            request: Request::Write {
                                write: Box::new(Write::Merge(tombstone)),
                                ack: true,
                            },
                        })
                    }
                    _ => None,
                })
                .collect();
            expired += tombstones.len();
            if !tombstones.is_empty() {
                self.inner.store.apply(tombstones).await?;
            }
        }
        Ok(expired)
    }
}
