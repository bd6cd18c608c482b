//! The internal service `trireme.replica.v1` as this node serves it to its peers: the replica
//! side of every operation. It refuses anyone who is not a member (and says so in the log), and
//! every request older than the horizon by its sender's clock
//! (spec/replication.md#tombstones-and-their-collection, *Horizon rule*).

use std::collections::BTreeSet;

use tonic::{Request, Response, Status};
use tracing::warn;
use trireme_proto::replica::v1 as pb;
use trireme_replication::NodeId;
use trireme_replication::coordinator::{self, Reply};
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
}

#[tonic::async_trait]
impl pb::replica_server::Replica for ReplicaService {
    async fn exchange(
        &self,
        request: Request<pb::Batch>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        let remote = request.remote_addr();
        let batch = request.into_inner();
        let sender = wire::sender(batch.sender.as_ref())
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        if sender.node == self.me.node || !self.members.contains(&sender.node) {
            warn!(peer = ?remote, node = sender.node.0, "refused a replica request from a node that is not a member");
            return Err(Status::permission_denied(format!(
                "node {} is not a member of this cluster",
                sender.node.0
            )));
        }
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
            sender: Some(
                wire::Sender {
                    node: self.me.node,
                    disk_id: self.me.disk_id,
                    clock: self.me.clock.now(),
                }
                .into(),
            ),
            replies: replies.iter().map(wire::reply).collect(),
        }))
    }
}
