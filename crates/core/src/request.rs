//! Inference requests and responses as the core sees them, independent of
//! the wire protocol they arrived on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::Tensor;

/// A request or response parameter value (KServe v2 parameters).
#[derive(Debug, Clone, PartialEq)]
pub enum Parameter {
    /// `bool_param` / a JSON boolean.
    Bool(bool),
    /// `int64_param` / a JSON integer.
    Int(i64),
    /// `double_param` / a JSON number with a fraction.
    Double(f64),
    /// `string_param` / a JSON string.
    String(String),
}

/// Named parameters, ordered for stable rendering.
pub type Parameters = BTreeMap<String, Parameter>;

/// A parameter of a control request (logging settings, repository load and
/// unload), as HTTP's JSON or gRPC's typed parameters carry it; each
/// frontend converts its wire form, the consumer checks names and types.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlValue {
    /// A boolean.
    Bool(bool),
    /// A non-negative integer.
    Uint(u64),
    /// A string.
    String(String),
    /// Raw bytes (gRPC `bytes_param`; base64 in HTTP's JSON).
    Bytes(Vec<u8>),
    /// Anything else (a negative or fractional number, a list, ...).
    Other,
}

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
    pub shm: Option<OutputTarget>,
}

/// Memory outside the response that an output can be written to (a
/// client's shared-memory region); implemented by the memory crate.
pub trait OutputRegion: Send + Sync {
    /// Name the client registered the region under.
    fn name(&self) -> &str;
    /// Copies `data` to `offset`, checking bounds (`what` names the tensor in errors).
    fn write(&self, offset: usize, data: &[u8], what: &str) -> Result<()>;
}

/// Where an output is to be written instead of being returned.
#[derive(Clone)]
pub struct OutputTarget {
    /// The region.
    pub region: Arc<dyn OutputRegion>,
    /// Byte offset in the region.
    pub offset: usize,
    /// Bytes reserved for the output.
    pub byte_size: usize,
}

impl std::fmt::Debug for OutputTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}[{}..+{}]",
            self.region.name(),
            self.offset,
            self.byte_size
        )
    }
}

impl PartialEq for OutputTarget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.region, &other.region)
            && self.offset == other.offset
            && self.byte_size == other.byte_size
    }
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
    /// Where a decoupled model sends its responses (set by the scheduler
    /// for requests to decoupled models, `None` otherwise).
    pub responder: Option<Responder>,
    /// The request's trace when it was sampled for tracing.
    pub trace: Option<std::sync::Arc<crate::trace::Trace>>,
}

impl InferRequest {
    /// Finds an input by name.
    pub fn input(&self, name: &str) -> Option<&Tensor> {
        self.inputs.iter().find(|t| t.name == name)
    }
}

/// Where a decoupled model's responses to one request go: any number of
/// responses, then the final flag (Triton's response sender). Implemented by
/// the server's scheduler; backends only send.
pub trait ResponseSink: Send + Sync {
    /// Sends a response or an error (or, with `None`, nothing but the flag);
    /// `last` closes the stream. Fails once the stream is closed or its
    /// client has gone (CANCELLED).
    fn send(&self, response: Option<Result<InferResponse>>, last: bool) -> Result<()>;
    /// Whether the client has gone away (the request is cancelled).
    fn is_cancelled(&self) -> bool;
    /// Whether the final flag has been sent.
    fn is_closed(&self) -> bool;
}

/// One message of a decoupled request's response stream.
#[derive(Debug)]
pub struct StreamItem {
    /// A response or an error; `None` for a bare final flag.
    pub response: Option<Result<InferResponse>>,
    /// The request's last message.
    pub last: bool,
}

/// A shared handle on a request's [`ResponseSink`].
#[derive(Clone)]
pub struct Responder(pub Arc<dyn ResponseSink>);

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Responder(closed: {})", self.0.is_closed())
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
    /// Not a response: the backend released the request to run again
    /// (Triton's request rescheduling, `iterative_sequence` models), and
    /// the sequence batcher queues it again.
    pub rescheduled: bool,
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
