//! The one way to run a request on a model by name: frontends, ensemble
//! steps and plugins' BLS calls all go through a [`ModelRouter`], which the
//! server's repository implements. Code that calls other models sees only
//! this trait, never the repository behind it.

use std::future::Future;
use std::pin::Pin;

use crate::error::Result;
use crate::request::{InferRequest, InferResponse};

/// The future of one routed request.
pub type InferFuture = Pin<Box<dyn Future<Output = Result<InferResponse>> + Send + 'static>>;

/// Finds the model a request names (`model_name`, `model_version`; `None` =
/// the highest ready version) and runs the request on it.
pub trait ModelRouter: Send + Sync {
    /// Looks up the model `request` names — an unknown or unavailable model
    /// fails here, at once, with the message every protocol shows — and
    /// returns the future of its response (validation, scheduling, execution).
    fn infer(&self, request: InferRequest) -> Result<InferFuture>;
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
}
