//! The internal service `trireme.replica.v1` as this node serves it to its peers: the replica
//! side of every operation. It refuses anyone who is not a member (and says so in the log), and
//! every request older than the horizon by its sender's clock
//! (spec/replication.md#tombstones-and-their-collection, *Horizon rule*). Anti-entropy's reads
//! (`Digests`, `Records`) answer only with records both the caller and this node replicate.

use std::collections::BTreeSet;

use tonic::{Request, Response, Status};
use tracing::warn;
use trireme_proto::replica::v1 as pb;
use trireme_replication::NodeId;
use trireme_replication::anti_entropy::shared;
use trireme_replication::coordinator::{self, Reply};
use trireme_replication::placement::Ring;
use trireme_replication::replica::within_horizon;

use super::peers::Identity;
use super::store::{Entry, ReplicaStore};
use super::wire;

/// The replica side of this node.
#[derive(Clone)]
pub struct ReplicaService {
    pub(super) store: ReplicaStore,
    pub(super) members: BTreeSet<NodeId>,
    pub(super) me: Identity,
    pub(super) horizon_ms: u64,
    /// Placement: anti-entropy answers only with the records both ends of a pair replicate.
    pub(super) ring: Ring,
}

/// Records one anti-entropy page holds at most, whatever the caller asks.
pub const RECORDS_PER_PAGE_MAX: usize = 1_024;
/// Stored bytes one anti-entropy page holds about at most (one record more at worst, itself at
/// most about a 1 MiB body): well under tonic's 4 MiB message limit.
pub const PAGE_BYTES_MAX: usize = 2 * 1024 * 1024;

#[tonic::async_trait]
impl pb::replica_server::Replica for ReplicaService {
    async fn exchange(
        &self,
        request: Request<pb::Batch>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let remote = request.remote_addr();
        let batch = request.into_inner();
        let sender = self.member(remote, batch.sender.as_ref())?;
        let entries = wire::entries(&batch.entries)
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        let now = self.me.clock.now();
        let replies = if within_horizon(sender.clock, now, self.horizon_ms) {
            let entries = entries
                .into_iter()
                .map(|(key, request)| Entry { key, request })
                .collect();
            self.store
                .apply(entries)
                .await
                .map_err(|error| Status::unavailable(format!("replica store: {error}")))?
        } else {
            warn!(
                node = sender.node.0,
                sent_ms = sender.clock.0,
                now_ms = now.0,
                "refused a batch older than the horizon"
            );
            entries
                .iter()
                .map(|(_, request)| match request {
                    coordinator::Request::Read | coordinator::Request::Write { .. } => {
                        Reply::Refused
                    }
                })
                .collect()
        };
        Ok(Response::new(pb::BatchReply {
            request_id: batch.request_id,
            sender: Some(self.me.now().into()),
            replies: replies.iter().map(wire::reply).collect(),
        }))
    }

    async fn digests(
        &self,
        request: Request<pb::DigestsRequest>,
    ) -> Result<Response<pb::DigestsReply>, Status> {
        let remote = request.remote_addr();
        let request = request.into_inner();
        let sender = self.member(remote, request.sender.as_ref())?;
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
        let digests = tokio::task::spawn_blocking(move || {
            store.digests(first, last, |key| shared(&ring, me, sender.node, key))
        })
        .await
        .expect("a digest scan does not panic")
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
        let remote = request.remote_addr();
        let request = request.into_inner();
        let sender = self.member(remote, request.sender.as_ref())?;
        let partition = u16::try_from(request.partition).map_err(|_| {
            Status::invalid_argument(format!("partition {} is out of range", request.partition))
        })?;
        let limit = usize::try_from(request.limit)
            .unwrap_or(usize::MAX)
            .clamp(1, RECORDS_PER_PAGE_MAX);
        let after = (!request.after_key.is_empty()).then_some(request.after_key);
        let (store, ring, me) = (self.store.clone(), self.ring.clone(), self.me.node);
        let (page, more) = tokio::task::spawn_blocking(move || {
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
        .expect("a page scan does not panic")
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

impl ReplicaService {
    /// The sender of a peer's call, if it is another member; refused (and logged) otherwise.
    fn member(
        &self,
        remote: Option<std::net::SocketAddr>,
        sender: Option<&pb::Sender>,
    ) -> Result<wire::Sender, Status> {
        let sender =
            wire::sender(sender).map_err(|error| Status::invalid_argument(error.to_string()))?;
        if sender.node == self.me.node || !self.members.contains(&sender.node) {
            warn!(peer = ?remote, node = sender.node.0, "refused a replica request from a node that is not a member");
            return Err(Status::permission_denied(format!(
                "node {} is not a member of this cluster",
                sender.node.0
            )));
        }
        Ok(sender)
    }
}
