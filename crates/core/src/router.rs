//! How a model calls another model by name: ensemble steps and plugins'
//! BLS calls go through a [`ModelRouter`], which the server's inference
//! facade implements (the same door its HTTP and gRPC frontends use). Code
//! that calls other models sees only this trait, never the repository
//! behind it.

use std::future::Future;
use std::pin::Pin;

use crate::error::Result;
use crate::request::{InferRequest, InferResponse, StreamItem};

/// The future of one routed request.
pub type InferFuture = Pin<Box<dyn Future<Output = Result<InferResponse>> + Send + 'static>>;

/// The future of a stream's next message.
pub type NextFuture<'a> = Pin<Box<dyn Future<Output = Option<StreamItem>> + Send + 'a>>;

/// A routed request's responses as they come: a decoupled model's stream,
/// or another model's one response with the final flag.
pub trait ResponseStream: Send {
    /// The next message; `None` once the stream has ended.
    fn next(&mut self) -> NextFuture<'_>;
}

/// Finds the model a request names (`model_name`, `model_version`; `None` =
/// the highest ready version) and runs the request on it.
pub trait ModelRouter: Send + Sync {
    /// Looks up the model `request` names — an unknown or unavailable model
    /// fails here, at once, with the message every protocol shows — and
    /// returns the future of its response (validation, scheduling, execution).
    fn infer(&self, request: InferRequest) -> Result<InferFuture>;

    /// Like [`ModelRouter::infer`], answering with every response the model
    /// sends (Triton's BLS `exec(decoupled=True)`): a decoupled model's
    /// stream, or another model's one response.
    fn infer_stream(&self, request: InferRequest) -> Result<Box<dyn ResponseStream>>;
}

/// A router reference that never resolves, for models loaded outside a
/// server (tests, benchmarks): their BLS calls and ensemble steps fail with
/// "the server is shutting down".
pub fn unrouted() -> std::sync::Weak<dyn ModelRouter> {
    std::sync::Weak::<Unrouted>::new()
}

struct Unrouted;

impl ModelRouter for Unrouted {
    fn infer(&self, request: InferRequest) -> Result<InferFuture> {
        Err(crate::Error::unavailable(format!(
            "no models to route '{}' to",
            request.model_name
        )))
    }

    fn infer_stream(&self, request: InferRequest) -> Result<Box<dyn ResponseStream>> {
        Err(crate::Error::unavailable(format!(
            "no models to route '{}' to",
            request.model_name
        )))
    }
}
