//! trireme-node integration tests: one binary, a module per area.

mod sqs;
