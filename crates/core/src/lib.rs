//! Tern's core: what every other part of the server agrees on, with no
//! network, WebAssembly or ONNX Runtime dependency.
//!
//! * [`error`]: the one error type, with Triton's codes.
//! * [`config`]: Triton's model configuration (`config.pbtxt`) — parsing,
//!   JSON rendering, normalisation and validation.
//! * Protocol-neutral inference types: [`dtype`], [`tensor`],
//!   [`bytes_tensor`], [`request`], plus request validation ([`validate`])
//!   and the classification extension ([`classification`]).
//! * [`sequence`]: sequence (stateful) requests and the sequence batcher's
//!   control inputs and implicit state.
//! * [`files`]: reading the files a config names, only from inside the
//!   model's folder.
//! * [`backend`]: the traits a backend implements; [`router`]: the trait
//!   through which frontends, ensembles and plugins run requests by model name.
//! * [`prometheus`]: the text exposition format every metric is written in.
//! * [`trace`]: one request's trace (timestamps and tensors) on its way through.

#![warn(missing_docs)]

pub mod backend;
pub mod bytes_tensor;
pub mod classification;
pub mod config;
pub mod dtype;
pub mod error;
pub mod files;
pub mod messages;
pub mod prometheus;
pub mod request;
pub mod router;
pub mod sequence;
pub mod tensor;
pub mod trace;
pub mod validate;

pub use dtype::DataType;
pub use error::{Code, Error, Result};
pub use request::{
    InferRequest, InferResponse, Parameter, Parameters, RequestedOutput, Responder, ResponseSink,
    StreamItem,
};
pub use router::ModelRouter;
pub use tensor::Tensor;
