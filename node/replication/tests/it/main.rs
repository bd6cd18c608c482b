//! Integration tests of trireme-replication: conformance with the stateright models of
//! spec/replication.md (part 1, and section 5's change visibility).

mod conformance;
mod conformance_visibility;
mod walks;
