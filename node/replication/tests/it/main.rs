//! Integration tests of trireme-replication: conformance with the stateright models of
//! spec/replication.md (part 1, section 4's deduplication ids, and section 5's change visibility).

mod conformance;
mod conformance_dedup;
mod conformance_visibility;
mod walks;
