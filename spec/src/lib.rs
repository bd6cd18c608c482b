//! Executable models of Trireme's spec pages (`spec/*.md`), checked exhaustively with stateright.
//!
//! Each module translates one page into a state machine with the page's invariants and liveness
//! claims as properties. The models are the reference the conformance tests compare the real
//! crates against; they must never depend on those crates.

#![forbid(unsafe_code)]

pub mod queue_core;
pub mod replication;
