//! Wire frontends. They only translate between their protocol and the core
//! types; validation and execution live in `tern-core` and `scheduler`, and what
//! both frontends answer alike lives in `common`.

pub mod common;
pub mod grpc;
pub mod http;
pub mod listen;
pub mod metrics;
pub mod restrict;
