//! Integration tests of the client crate: one binary, a module per area. Real nodes run on
//! loopback in the test's runtime (`node.rs`); `fake.rs` scripts failures a real node cannot.

mod auth;
mod bench;
mod calls;
mod cli;
mod failover;
mod fake;
mod node;
mod retry;
mod worker;
