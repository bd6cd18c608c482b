//! The model of spec/replication.md: a message's record replicated on three replicas without a
//! leader, checked exhaustively with stateright over a bounded space.
//!
//! `record` is the merge (a join-semilattice, with property tests for its laws); `protocol` is
//! the state machine of replicas, coordinators and a lossy network; `model` wires it to the
//! checker with the invariants, liveness checks and scenarios the page names. `lifecycle` is
//! the compact model of part 2's purge and retention expiry (sections 2 and 3), with its own
//! record, protocol and properties; `move_task` is the separate model of section 8, the
//! replicated and leased message move task. Nothing here is used by the node: the code is
//! written against the page, and the page against these models.

pub mod lifecycle;
pub mod long_poll;
pub mod model;
pub mod move_task;
pub mod protocol;
pub mod record;
pub mod visibility;

pub use model::{Action, ReplicationModel};
pub use protocol::{Bug, Config, Start, State};
