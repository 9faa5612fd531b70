//! Tern's server: the model repository and its lifecycle, the schedulers,
//! the HTTP and gRPC frontends, metrics, logging and the command line.
//! The types every part shares are in `tern-core`; the backends in
//! `tern-onnx` and `tern-wasm`; memory outside the heap in `tern-memory`.
//! See `docs/architecture.md` for how the crates and modules fit together.

pub mod backends;
pub mod cache;
pub mod cli;
pub mod frontend;
pub mod infer;
pub mod logging;
pub mod metrics;
pub mod model_cli;
pub mod plugins;
pub mod proto;
pub mod repository;
pub mod scheduler;
pub mod server;
pub mod trace;
pub mod version;
