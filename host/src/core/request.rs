//! Inference requests and responses as the core sees them, independent of
//! the wire protocol they arrived on.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Tensor;

/// A request or response parameter value (KServe v2 parameters).
#[derive(Debug, Clone, PartialEq)]
pub enum Parameter {
    Bool(bool),
    Int(i64),
    Double(f64),
    String(String),
}

/// Named parameters, ordered for stable rendering.
pub type Parameters = BTreeMap<String, Parameter>;

/// An output the client asked for, with its per-output options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// Classification extension: return the top N classes instead of the tensor.
    pub classification: Option<usize>,
    /// HTTP only: whether this output goes in the binary section (`None` = request default).
    pub binary: Option<bool>,
    /// Shared-memory extension: write the output here instead of returning it.
    pub shm: Option<crate::memory::shm::OutputTarget>,
}

/// One inference request after decoding from the wire.
#[derive(Debug, Clone, Default)]
pub struct InferRequest {
    /// Target model.
    pub model_name: String,
    /// Target version; `None` = the policy's latest.
    pub model_version: Option<i64>,
    /// Client-chosen id, echoed in the response.
    pub id: String,
    /// Input tensors.
    pub inputs: Vec<Tensor>,
    /// Requested outputs; empty = all outputs.
    pub outputs: Vec<RequestedOutput>,
    /// Request parameters.
    pub parameters: Parameters,
    /// Plugin models blocked in a BLS call that waits on this request,
    /// outermost first (empty for client requests); used to refuse cycles.
    pub callers: Vec<String>,
}

impl InferRequest {
    /// Finds an input by name.
    pub fn input(&self, name: &str) -> Option<&Tensor> {
        self.inputs.iter().find(|t| t.name == name)
    }
}

/// The result of one request.
#[derive(Debug, Clone, Default)]
pub struct InferResponse {
    /// Model that produced the response.
    pub model_name: String,
    /// Version that produced the response.
    pub model_version: i64,
    /// Echo of the request id.
    pub id: String,
    /// Output tensors, in the order they are to be returned.
    pub outputs: Vec<Tensor>,
    /// Response parameters.
    pub parameters: Parameters,
    /// Compute time that produced it (statistics only): the execution's for
    /// a model, the composing models' sum for an ensemble.
    pub compute: ComputeTimes,
}

/// Compute durations of one execution, as Triton's statistics split them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ComputeTimes {
    /// Gathering/converting inputs.
    pub input: Duration,
    /// Running the model.
    pub infer: Duration,
    /// Scattering/converting outputs.
    pub output: Duration,
}

impl std::ops::AddAssign for ComputeTimes {
    fn add_assign(&mut self, o: ComputeTimes) {
        self.input += o.input;
        self.infer += o.infer;
        self.output += o.output;
    }
}
