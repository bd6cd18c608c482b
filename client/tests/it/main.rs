//! Integration tests of the client crate: one binary, a module per area.

mod fake;
mod retry;
