//! Trireme's gRPC services, generated at build time: the public API, package `trireme.v1`, from
//! `proto/trireme/v1/queue.proto`, and the internal node-to-node service `trireme.replica.v1`.
//!
//! These are wire types only: they stop at the edge. The server converts them into core types
//! with `TryFrom` (where input is validated) and never lets them reach `trireme-core`.

/// Version 1 of the API.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("trireme.v1");
}

/// The internal node-to-node service, package `trireme.replica.v1`: never served on the client
/// port.
pub mod replica {
    /// Version 1 of the internal service.
    pub mod v1 {
        #![allow(clippy::all, clippy::pedantic, missing_docs)]
        tonic::include_proto!("trireme.replica.v1");
    }
}
