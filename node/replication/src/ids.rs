//! Identifiers that cross modules: nodes, generations and request ids. Widths are explicit
//! because every one of them is stored and sent on the wire.

use serde::{Deserialize, Serialize};

/// A member of the cluster, as configured by `--node-id`. Stable for the life of a disk.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct NodeId(pub u16);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// A life of a message in one queue (spec/replication.md#the-record): 0 when sent, plus one for
/// every dead-letter move, dead-letter now and redrive.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Generation(pub u32);

impl Generation {
    /// The generation a move or redrive writes into its target queue.
    #[must_use]
    pub fn next(self) -> Generation {
        Generation(
            self.0
                .checked_add(1)
                .expect("a message cannot move four billion times"),
        )
    }
}

/// Tags one coordinator round: a reply carrying another request id is ignored
/// (spec/replication.md#operations). Drawn by the coordinator's driver, unique per node.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct RequestId(pub u64);
