//! Integration tests of trireme-replication: conformance with the stateright model of
//! spec/replication.md.

mod conformance;
