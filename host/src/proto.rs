//! Types generated from `host/proto/`: Triton's gRPC service (package
//! `inference`) and the standard gRPC health service. The model configuration
//! messages it uses are `tern_core::config::pb`'s.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/inference.rs"));

/// `grpc.health.v1`.
pub mod health {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}
