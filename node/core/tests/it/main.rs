//! Integration tests of trireme-core through its public API: chosen traces for the classic races,
//! fake-clock tests with real durations, dead-letter queues and redrive, queue administration,
//! every refusal, and persistence. Time is a `Millis` value the test sets; nothing sleeps.

mod admin;
mod conformance;
mod dead_letter;
mod persistence;
mod races;
mod random;
mod rejects;
mod support;
mod timing;
mod waiters;
