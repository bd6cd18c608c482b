//! The model of spec/replication.md: a message's record replicated on three replicas without a
//! leader, checked exhaustively with stateright over a bounded space.
//!
//! `record` is the merge (a join-semilattice, with property tests for its laws); `protocol` is
//! the state machine of replicas, coordinators and a lossy network; `model` wires it to the
//! checker with the invariants, liveness checks and scenarios the page names. Part 2's sections
//! that need a state space of their own have their own module, with its own record, protocol
//! and properties: `queues` (section 1, a queue name's record, its racing creates, its delete
//! and its recreation), `lifecycle` (sections 2 and 3, purge and retention expiry), `dedup`
//! (section 4, deduplication ids across coordinators), `visibility` (section 5, change
//! visibility), `move_task` (section 8, the replicated and leased message move task),
//! `long_poll` (section 9, long polling across nodes) and `group_log` (section 14, one replica's
//! group log, its checkpoints and a start's replay); `net` holds the replica bitmasks and
//! the sorted packet multiset they all share. Nothing here is used by the node: the
//! code is written against the page, and the page against these models.

pub mod dedup;
pub mod group_log;
pub mod lifecycle;
pub mod long_poll;
pub mod model;
pub mod move_task;
pub mod net;
pub mod protocol;
pub mod queues;
pub mod record;
pub mod visibility;

pub use model::{Action, ReplicationModel};
pub use protocol::{Bug, Config, Start, State};
