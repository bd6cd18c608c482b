//! trireme-sim: deterministic simulation of a Trireme node, and of a cluster, under turmoil.
//!
//! A run ([`harness::run`]) puts the real node (engine, redb storage, gRPC service) on a
//! simulated disk, network and clock, drives it with a few clients ([`workload`]) while the
//! seed's faults ([`faults`]) crash it, cut and slow its links, and then heals everything and
//! lets the clients drain the queue. The [`checker`] reads the [`history`] of calls and lists
//! every promise of spec/queue-core.md the history shows broken. One seed replays one run bit
//! for bit. [`cluster::run`] does the same for three real cluster members
//! (`trireme_node::cluster`) talking through the internal service.
//!
//! This crate must never be a dependency of the node or the client: turmoil turns on tokio's
//! `test-util`, which no release build should carry. And nothing in a run may read real time,
//! real files or an unseeded random source.
#![forbid(unsafe_code)]

pub mod checker;
pub mod clock;
pub mod cluster;
pub mod disk;
pub mod faults;
pub mod harness;
pub mod history;
pub mod net;
pub mod workload;
