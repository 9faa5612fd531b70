//! Tern: a Triton-compatible inference server (KServe v2 over HTTP and gRPC) that reads
//! Triton model repositories unchanged. See `docs/` for the user guide and
//! `../shared/DESIGN.md` for the architecture.

pub mod backends;
pub mod cli;
pub mod config;
pub mod core;
pub mod error;
pub mod frontend;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod plugin_tool;
pub mod proto;
pub mod repository;
pub mod scheduler;
pub mod server;
pub mod wasm;

pub use error::{Code, Error, Result};
