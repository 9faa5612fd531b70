//! Types generated from `host/proto/`: Triton's model configuration and gRPC
//! service (package `inference`) and the standard gRPC health service.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/inference.rs"));

/// `grpc.health.v1`.
pub mod health {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}
