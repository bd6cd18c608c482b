//! trireme-replication: the protocol of spec/replication.md as a pure crate, beside
//! `trireme-core` (queue-core). It owns the record a replica stores and its merge (`record`), what
//! a replica accepts and refuses (`replica`), where a message's three copies live (`placement`),
//! one state machine per coordinator operation (`coordinator`), deduplication ids across
//! coordinators (`dedup`), what anti-entropy compares and exchanges (`anti_entropy`), move
//! tasks' replicated record, its replicas' conditions and its runner (`task`), whether this
//! node's clock lets it coordinate (`skew`), and how a node with a new disk joins (`join`):
//! inputs in, effects out.
//!
//! It must never read a clock, draw randomness, block, log, or touch a file or socket. Time,
//! request ids and nonces come in as values; messages to peers, records to persist and answers
//! to clients go out as data, and a thin async driver in the node executes them. Names are the
//! page's: *replica*, *coordinator*, *claim*, *generation*, *tombstone*, *collection*, *horizon*.
#![forbid(unsafe_code)]

pub mod anti_entropy;
pub mod coordinator;
pub mod dedup;
pub mod ids;
pub mod join;
pub mod key;
pub mod name;
pub mod placement;
pub mod planted;
pub mod record;
pub mod replica;
pub mod skew;
pub mod task;

pub use ids::{Generation, NodeId, RequestId};
pub use key::RecordKey;
pub use record::{
    Birth, Body, Claim, Divergence, Held, Live, Record, Settle, Tombstone, TombstoneReason,
};
