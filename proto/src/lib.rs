//! Trireme's public gRPC API, package `trireme.v1`, generated at build time from
//! `proto/trireme/v1/queue.proto`.
//!
//! These are wire types only: they stop at the edge. The server converts them into core types
//! with `TryFrom` (where input is validated) and never lets them reach `trireme-core`.

/// Version 1 of the API.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("trireme.v1");
}
