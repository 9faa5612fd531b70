//! The host side of the `tern:plugin` world: the per-instance store state
//! (WASI context with nothing granted but the model folder, memory limits,
//! the BLS call chain), the `host` imports (`log`, `infer`, metrics), the
//! `responses` imports (decoupled models' response senders, cancellation)
//! and the conversions between the core's types and the WIT types.

use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Wake};
use std::time::Instant;

use bytes::Bytes;
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::metrics;
use super::tern::plugin::host::{Host, LogLevel, MetricKind};
use super::tern::plugin::responses;
use super::tern::plugin::types as wit;
use super::PluginTelemetry;
use tern_core::error::{Code, Error, Result};
use tern_core::messages;
use tern_core::router::ModelRouter;
use tern_core::{
    DataType, InferRequest, InferResponse, Parameter, Parameters, RequestedOutput, Tensor,
};

/// What a plugin's responses are checked against and labelled with.
pub struct ResponseShape {
    /// Model name.
    pub model: String,
    /// Model version.
    pub version: i64,
    /// The model's config (outputs are checked against it).
    pub config: Arc<tern_core::config::ModelConfig>,
}

impl ResponseShape {
    /// A plugin's response to request `id` (batch size `batch_size`), checked
    /// against the config.
    /// `extra` are outputs the plugin made with `ops.set-output`; they
    /// replace outputs of the same name.
    pub fn response(
        &self,
        id: &str,
        batch_size: usize,
        r: wit::Response,
        extra: Vec<Tensor>,
    ) -> Result<InferResponse> {
        let mut outputs: Vec<_> = r
            .outputs
            .into_iter()
            .filter(|t| !extra.iter().any(|e| e.name == t.name))
            .map(tensor_from_wit)
            .collect();
        outputs.extend(extra);
        tern_core::validate::validate_outputs(&self.config, batch_size, &outputs)?;
        Ok(InferResponse {
            model_name: self.model.clone(),
            model_version: self.version,
            id: id.to_string(),
            outputs,
            parameters: params_from_wit(r.parameters),
            ..Default::default()
        })
    }
}

/// A request of the batch `execute` is running, as the `responses`
/// interface sees it.
pub struct Running {
    /// The client's request id.
    pub id: String,
    /// Its batch size.
    pub batch_size: usize,
    /// Its response sink (decoupled models only).
    pub responder: Option<tern_core::Responder>,
    /// Its inputs (for `ops` arrays made from them without a copy).
    pub inputs: Vec<Tensor>,
    /// Outputs made with `ops.set-output`.
    pub outputs: Vec<Tensor>,
    /// Released with `responses.reschedule`: it runs again, unanswered.
    pub rescheduled: bool,
    /// A sender of it was dropped during the call without the final flag:
    /// the flag goes out after the call, unless the request was rescheduled.
    pub close_after: bool,
}

/// The host side of a `response-sender` resource: the sink of one request.
pub struct SenderHandle {
    responder: tern_core::Responder,
    shape: Arc<ResponseShape>,
    id: String,
    batch_size: usize,
    /// Whether dropping it sends the final flag (not while its request is
    /// running: see [`Running::close_after`]).
    final_on_drop: bool,
    /// Why its instance was torn down, once it is (see [`HostState::ending`]).
    ending: Arc<OnceLock<Error>>,
}

impl Drop for SenderHandle {
    /// A sender the plugin let go of without the final flag closes its
    /// stream; one still held when its instance is torn down after a
    /// failure ends its stream with that failure.
    fn drop(&mut self) {
        if self.final_on_drop && !self.responder.0.is_closed() {
            let last = self.ending.get().map(|e| Err(e.clone()));
            let _ = self.responder.0.send(last, true);
        }
    }
}

/// The host side of a `response-stream` resource: a streaming BLS request.
pub struct StreamHandle {
    stream: Box<dyn tern_core::router::ResponseStream>,
    target: String,
    ended: bool,
}

/// Most response senders one instance may hold at once.
const MAX_SENDERS: usize = 65_536;

/// How deep BLS calls may nest (plugin → plugin → ...).
pub const MAX_BLS_DEPTH: usize = 16;

/// Memory and table limits of one store; remembers whether a limit was hit
/// so a resulting trap can be reported as what it is. Linear memory and
/// the `ops` arrays the host holds for the plugin share `max_memory`.
#[derive(Debug)]
pub struct Limits {
    /// Largest linear memory plus host arrays, in bytes.
    pub max_memory: usize,
    /// Set when the plugin tried to grow past `max_memory`.
    pub hit: bool,
    /// Size of the instance's linear memories now, all of them together (a
    /// component may have several; the cap holds for their sum).
    pub linear: usize,
    /// Bytes of `ops` arrays held for the plugin.
    pub host: usize,
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // `current` is this memory's size: the others keep theirs.
        let total = self.linear.saturating_sub(current).saturating_add(desired);
        if total.saturating_add(self.host) > self.max_memory {
            self.hit = true;
            return Ok(false);
        }
        self.linear = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// The data of one plugin instance's store.
pub struct HostState {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    /// Memory limits.
    pub limits: Limits,
    /// The plugin's model name (log lines and errors say which plugin).
    pub model: String,
    /// Where BLS calls go; weak so that models do not keep the repository alive.
    pub models: Weak<dyn ModelRouter>,
    /// Plugin models waiting on the batch now executing, this one last.
    pub chain: Vec<String>,
    /// The trace of the running batch's first traced request: BLS calls
    /// made during the call are traced as its children.
    pub trace: Option<Arc<tern_core::trace::Trace>>,
    /// When the executing call must be over; bounds BLS waits.
    pub deadline: Option<Instant>,
    /// Where the plugin's metric families live.
    telemetry: Arc<PluginTelemetry>,
    /// This model's failure and drop counters (looked up once: a plugin
    /// flooding the log bumps them per line).
    counters: Arc<crate::telemetry::PluginCounters>,
    /// The batch `execute` is running (empty between calls).
    pub running: Vec<Running>,
    /// How responses are checked (set once the model is known).
    pub shape: Option<Arc<ResponseShape>>,
    senders: usize,
    log_limit: LogLimit,
    /// How many metric families and series the plugin may create.
    pub metric_caps: metrics::Caps,
    /// The last panic the plugin reported (`panicked at file:line:col: message`),
    /// for the error of the trap that follows.
    pub panic: Option<String>,
    /// Why the instance is being torn down (a trap, the memory cap), set
    /// before its store goes: the streams of response senders it still
    /// holds end with this error instead of a bare final flag.
    pub ending: Arc<OnceLock<Error>>,
}

impl HostState {
    /// State for a new instance of `model`.
    pub fn new(
        wasi: WasiCtx,
        model: &str,
        max_memory: usize,
        models: Weak<dyn ModelRouter>,
        telemetry: Arc<PluginTelemetry>,
    ) -> Self {
        HostState {
            wasi,
            table: ResourceTable::new(),
            limits: Limits {
                max_memory,
                hit: false,
                linear: 0,
                host: 0,
            },
            model: model.to_string(),
            models,
            chain: Vec::new(),
            trace: None,
            deadline: None,
            counters: telemetry.counters(model),
            telemetry,
            running: Vec::new(),
            shape: None,
            senders: 0,
            log_limit: LogLimit::default(),
            metric_caps: metrics::Caps::default(),
            panic: None,
            ending: Arc::default(),
        }
    }

    /// Checks a BLS request (call cycles, depth) and makes it a request of
    /// the server's, with the router to send it through.
    fn bls_request(
        &mut self,
        req: wit::InferRequest,
    ) -> Result<(Arc<dyn ModelRouter>, InferRequest)> {
        let target = req.model_name.clone();
        if self.chain.contains(&target) {
            return Err(Error::unavailable(format!(
                "BLS call to '{target}' would wait on itself (call chain: {} -> {target}); \
                 a plugin cannot call itself or a model that is calling it",
                self.chain.join(" -> ")
            ))
            .for_model(&self.model));
        }
        if self.chain.len() >= MAX_BLS_DEPTH {
            return Err(Error::unavailable(format!(
                "BLS calls nested deeper than {MAX_BLS_DEPTH} (call chain: {})",
                self.chain.join(" -> ")
            ))
            .for_model(&self.model));
        }
        let router = self
            .models
            .upgrade()
            .ok_or_else(|| Error::unavailable("the server is shutting down"))?;
        let version = (req.model_version >= 0).then_some(req.model_version);
        let request = InferRequest {
            model_name: target.clone(),
            model_version: version,
            id: req.id,
            inputs: req.inputs.into_iter().map(tensor_from_wit).collect(),
            outputs: req
                .requested_outputs
                .into_iter()
                .map(|name| RequestedOutput {
                    name,
                    ..Default::default()
                })
                .collect(),
            parameters: params_from_wit(req.parameters),
            callers: self.chain.clone(),
            responder: None,
            trace: self.trace.as_ref().map(|t| t.child(&target)),
        };
        Ok((router, request))
    }

    fn bls(&mut self, req: wit::InferRequest) -> Result<InferResponse> {
        let target = req.model_name.clone();
        let (router, request) = self.bls_request(req)?;
        block_on(router.infer(request)?, self.deadline).unwrap_or_else(|| {
            Err(Error::unavailable(format!(
                "BLS call to '{target}' did not finish before the plugin's execution deadline"
            ))
            .for_model(&self.model))
        })
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl wit::Host for HostState {}

fn resource_error(e: wasmtime::component::ResourceTableError) -> wit::Error {
    error_to_wit(&Error::internal(format!("response sender: {e}")))
}

impl responses::HostResponseSender for HostState {
    fn send(
        &mut self,
        sender: Resource<SenderHandle>,
        response: Option<wit::Response>,
        flags: u32,
    ) -> std::result::Result<(), wit::Error> {
        let h = self.table.get(&sender).map_err(resource_error)?;
        let last = flags & 1 != 0;
        let response = match response.map(|r| h.shape.response(&h.id, h.batch_size, r, Vec::new()))
        {
            // A response the config refuses reaches the client as the error it is.
            Some(Err(e)) => {
                let _ = h.responder.0.send(Some(Err(e.clone())), true);
                return Err(error_to_wit(&e));
            }
            other => other,
        };
        h.responder
            .0
            .send(response, last)
            .map_err(|e| error_to_wit(&e))
    }

    fn send_error(
        &mut self,
        sender: Resource<SenderHandle>,
        error: wit::Error,
    ) -> std::result::Result<(), wit::Error> {
        let h = self.table.get(&sender).map_err(resource_error)?;
        h.responder
            .0
            .send(Some(Err(error_from_wit(error))), true)
            .map_err(|e| error_to_wit(&e))
    }

    fn send_error_response(
        &mut self,
        sender: Resource<SenderHandle>,
        error: wit::Error,
        flags: u32,
    ) -> std::result::Result<(), wit::Error> {
        let h = self.table.get(&sender).map_err(resource_error)?;
        h.responder
            .0
            .send(Some(Err(error_from_wit(error))), flags & 1 != 0)
            .map_err(|e| error_to_wit(&e))
    }

    fn is_cancelled(&mut self, sender: Resource<SenderHandle>) -> bool {
        self.table
            .get(&sender)
            .is_ok_and(|h| h.responder.0.is_cancelled())
    }

    fn drop(&mut self, sender: Resource<SenderHandle>) -> wasmtime::Result<()> {
        let mut h = self.table.delete(sender)?;
        self.senders = self.senders.saturating_sub(1);
        // During the call that runs its request, the final flag waits for
        // the call's end: the plugin may still reschedule the request.
        if let Some(r) = self.running.iter_mut().find(|r| {
            r.responder
                .as_ref()
                .is_some_and(|x| Arc::ptr_eq(&x.0, &h.responder.0))
        }) {
            r.close_after = true;
            h.final_on_drop = false;
        }
        Ok(())
    }
}

impl responses::HostResponseStream for HostState {
    fn next(
        &mut self,
        stream: Resource<StreamHandle>,
    ) -> Option<std::result::Result<wit::Response, wit::Error>> {
        let (deadline, model) = (self.deadline, self.model.clone());
        let h = match self.table.get_mut(&stream) {
            Ok(h) => h,
            Err(e) => return Some(Err(resource_error(e))),
        };
        if h.ended {
            return None;
        }
        let Some(item) = block_on(h.stream.next(), deadline) else {
            return Some(Err(error_to_wit(&Error::unavailable(format!("streaming BLS call to '{}' sent nothing more before the plugin's execution deadline", h.target)).for_model(&model))));
        };
        let Some(item) = item else {
            h.ended = true;
            return None;
        };
        h.ended = item.last;
        match item.response? {
            Ok(r) => Some(Ok(wit::Response {
                outputs: r.outputs.iter().map(tensor_to_wit).collect(),
                parameters: params_to_wit(&r.parameters),
            })),
            Err(e) => Some(Err(error_to_wit(&e))),
        }
    }

    fn drop(&mut self, stream: Resource<StreamHandle>) -> wasmtime::Result<()> {
        self.table.delete(stream)?;
        Ok(())
    }
}

impl responses::Host for HostState {
    fn infer_stream(
        &mut self,
        request: wit::InferRequest,
    ) -> std::result::Result<Resource<StreamHandle>, wit::Error> {
        let target = request.model_name.clone();
        let stream = self
            .bls_request(request)
            .and_then(|(router, request)| router.infer_stream(request))
            .map_err(|e| error_to_wit(&e))?;
        self.table
            .push(StreamHandle {
                stream,
                target,
                ended: false,
            })
            .map_err(resource_error)
    }

    fn sender(&mut self, index: u32) -> std::result::Result<Resource<SenderHandle>, wit::Error> {
        let model = self.model.clone();
        let fail = |msg: String| Err(error_to_wit(&Error::invalid_arg(msg)));
        let Some(running) = self.running.get(index as usize) else {
            return fail(format!(
                "model '{model}': no request {index} in the batch now executing (senders are taken during execute)"
            ));
        };
        let Some(responder) = running.responder.clone() else {
            return fail(format!(
                "model '{model}' is not decoupled: its requests are answered by execute's return value \
                 (set model_transaction_policy {{ decoupled: true }} to send responses)"
            ));
        };
        if self.senders >= MAX_SENDERS {
            return fail(format!(
                "model '{model}': more than {MAX_SENDERS} response senders are held; drop finished ones"
            ));
        }
        let Some(shape) = self.shape.clone() else {
            return fail(format!("model '{model}': responses cannot be checked yet"));
        };
        let handle = SenderHandle {
            responder,
            shape,
            id: running.id.clone(),
            batch_size: running.batch_size,
            final_on_drop: true,
            ending: self.ending.clone(),
        };
        let r = self.table.push(handle).map_err(resource_error)?;
        self.senders += 1;
        Ok(r)
    }

    fn is_cancelled(&mut self, index: u32) -> bool {
        self.running
            .get(index as usize)
            .and_then(|r| r.responder.as_ref())
            .is_some_and(|r| r.0.is_cancelled())
    }

    fn reschedule(&mut self, index: u32) -> std::result::Result<(), wit::Error> {
        let iterative = self.shape.as_ref().is_some_and(|s| {
            tern_core::sequence::batching(&s.config).is_some_and(|b| b.iterative_sequence)
        });
        if !iterative {
            return Err(error_to_wit(&messages::reschedule_not_iterative()));
        }
        let model = self.model.clone();
        let Some(running) = self.running.get_mut(index as usize) else {
            return Err(error_to_wit(&Error::invalid_arg(format!(
                "model '{model}': no request {index} in the batch now executing (requests are rescheduled during execute)"
            ))));
        };
        running.rescheduled = true;
        Ok(())
    }
}

/// Longest log line a plugin may write, in bytes (longer ones are cut).
pub const MAX_LOG_LINE: usize = 4096;
/// Log lines per second one plugin instance may write, sustained.
pub const LOG_LINES_PER_SEC: f64 = 100.0;
/// Log lines one plugin instance may write in a burst.
pub const LOG_BURST: f64 = 1000.0;
/// How often dropped log lines are reported (one line with their count).
const LOG_REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// One plugin instance's log allowance: a token bucket, and what it dropped.
pub struct LogLimit {
    tokens: f64,
    refilled: Instant,
    dropped: u64,
    reported: Instant,
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit {
            tokens: LOG_BURST,
            refilled: Instant::now(),
            dropped: 0,
            reported: Instant::now(),
        }
    }
}

impl LogLimit {
    /// Whether a line may be written now.
    pub fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.refilled).as_secs_f64() * LOG_LINES_PER_SEC;
        self.tokens = (self.tokens + refill).min(LOG_BURST);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            false
        }
    }

    /// Lines dropped since the last report, when a report is due.
    fn due(&mut self) -> Option<u64> {
        if self.dropped == 0 || self.reported.elapsed() < LOG_REPORT_EVERY {
            return None;
        }
        self.reported = Instant::now();
        Some(std::mem::take(&mut self.dropped))
    }
}

/// A log line cut to [`MAX_LOG_LINE`] bytes (on a character boundary).
pub fn cut_line(message: String) -> String {
    cut(message)
}

fn cut(mut message: String) -> String {
    if message.len() <= MAX_LOG_LINE {
        return message;
    }
    let total = message.len();
    let mut end = MAX_LOG_LINE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(&format!(" ... [{} of {total} bytes cut]", total - end));
    message
}

impl Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) {
        // The SDKs report a panic as an error line starting with "panicked":
        // kept (cut) for the trap's error, whatever the rate limit.
        if matches!(level, LogLevel::Error) && message.starts_with("panicked") {
            self.panic = Some(cut(message.clone()));
        }
        if !self.log_limit.take() {
            self.counters
                .log_lines_dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        if let Some(dropped) = self.log_limit.due() {
            tracing::warn!(plugin = %self.model, "{dropped} log line(s) from this plugin dropped in the last {} s (more than {LOG_LINES_PER_SEC} lines/s)", LOG_REPORT_EVERY.as_secs());
        }
        let message = cut(message);
        let plugin = self.model.as_str();
        match level {
            LogLevel::Error => tracing::error!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Verbose => tracing::debug!(plugin, "{message}"),
        }
    }

    fn infer(
        &mut self,
        request: wit::InferRequest,
    ) -> std::result::Result<wit::Response, wit::Error> {
        self.bls(request)
            .map(|r| wit::Response {
                outputs: r.outputs.iter().map(tensor_to_wit).collect(),
                parameters: params_to_wit(&r.parameters),
            })
            .map_err(|e| error_to_wit(&e))
    }

    fn metric_family(
        &mut self,
        name: String,
        description: String,
        kind: MetricKind,
        buckets: Vec<f64>,
    ) -> std::result::Result<u32, wit::Error> {
        let kind = match kind {
            MetricKind::Counter => metrics::Kind::Counter,
            MetricKind::Gauge => metrics::Kind::Gauge,
            MetricKind::Histogram => metrics::Kind::Histogram,
        };
        self.telemetry
            .metrics
            .family(
                &self.model,
                self.metric_caps,
                &name,
                &description,
                kind,
                &buckets,
            )
            .map_err(|e| error_to_wit(&e))
    }

    fn metric_record(
        &mut self,
        family: u32,
        labels: Vec<(String, String)>,
        value: f64,
    ) -> std::result::Result<(), wit::Error> {
        self.telemetry
            .metrics
            .record(family, labels, value, self.metric_caps.series)
            .map_err(|e| error_to_wit(&e))
    }

    fn metric_set(
        &mut self,
        family: u32,
        labels: Vec<(String, String)>,
        value: f64,
    ) -> std::result::Result<(), wit::Error> {
        self.telemetry
            .metrics
            .set(family, labels, value, self.metric_caps.series)
            .map_err(|e| error_to_wit(&e))
    }
}

/// Runs a future on this (non-async) thread until it finishes or `deadline` passes.
fn block_on<F: Future>(fut: F, deadline: Option<Instant>) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return None;
                }
                std::thread::park_timeout(d - now);
            }
            None => std::thread::park(),
        }
    }
}

const DTYPES: &[(DataType, wit::DataType)] = &[
    (DataType::Bool, wit::DataType::Bool),
    (DataType::Uint8, wit::DataType::Uint8),
    (DataType::Uint16, wit::DataType::Uint16),
    (DataType::Uint32, wit::DataType::Uint32),
    (DataType::Uint64, wit::DataType::Uint64),
    (DataType::Int8, wit::DataType::Int8),
    (DataType::Int16, wit::DataType::Int16),
    (DataType::Int32, wit::DataType::Int32),
    (DataType::Int64, wit::DataType::Int64),
    (DataType::Fp16, wit::DataType::Fp16),
    (DataType::Fp32, wit::DataType::Fp32),
    (DataType::Fp64, wit::DataType::Fp64),
    (DataType::Bf16, wit::DataType::Bf16),
    (DataType::Bytes, wit::DataType::Bytes),
];

pub(crate) fn dtype_to_wit(d: DataType) -> wit::DataType {
    DTYPES
        .iter()
        .find(|(c, _)| *c == d)
        .expect("every dtype is in the table")
        .1
}

pub(crate) fn dtype_from_wit(d: wit::DataType) -> DataType {
    DTYPES
        .iter()
        .find(|(_, w)| *w == d)
        .expect("every dtype is in the table")
        .0
}

/// A core tensor as the plugin sees it.
pub fn tensor_to_wit(t: &Tensor) -> wit::Tensor {
    wit::Tensor {
        name: t.name.clone(),
        datatype: dtype_to_wit(t.dtype),
        shape: t.shape.clone(),
        data: t.data.to_vec(),
    }
}

/// A plugin's tensor (no copy of the data). Shapes and sizes are checked
/// where the tensor is used: `validate_request` for BLS inputs,
/// `validate_outputs` for responses.
pub fn tensor_from_wit(t: wit::Tensor) -> Tensor {
    Tensor {
        name: t.name,
        dtype: dtype_from_wit(t.datatype),
        shape: t.shape,
        data: Bytes::from(t.data),
    }
}

/// Parameters as the plugin sees them.
pub fn params_to_wit(p: &Parameters) -> Vec<wit::Parameter> {
    p.iter()
        .map(|(k, v)| wit::Parameter {
            key: k.clone(),
            value: match v {
                Parameter::Bool(b) => wit::ParameterValue::Bool(*b),
                Parameter::Int(i) => wit::ParameterValue::Int(*i),
                Parameter::Double(d) => wit::ParameterValue::Double(*d),
                Parameter::String(s) => wit::ParameterValue::String(s.clone()),
            },
        })
        .collect()
}

/// A plugin's parameters.
pub fn params_from_wit(p: Vec<wit::Parameter>) -> Parameters {
    p.into_iter()
        .map(|p| {
            let v = match p.value {
                wit::ParameterValue::Bool(b) => Parameter::Bool(b),
                wit::ParameterValue::Int(i) => Parameter::Int(i),
                wit::ParameterValue::Double(d) => Parameter::Double(d),
                wit::ParameterValue::String(s) => Parameter::String(s),
            };
            (p.key, v)
        })
        .collect()
}

/// A request as the plugin's `execute` receives it.
pub fn request_to_wit(r: &InferRequest) -> wit::Request {
    // Requests reach a plugin validated; a malformed sequence parameter reads as "no sequence".
    let seq = r.sequence().unwrap_or(tern_core::sequence::SequenceFlags {
        id: None,
        start: false,
        end: false,
    });
    let correlation_id = match seq.id {
        Some(tern_core::sequence::CorrelationId::Number(n)) => wit::CorrelationId::Number(n),
        Some(tern_core::sequence::CorrelationId::Text(s)) => wit::CorrelationId::Text(s),
        None => wit::CorrelationId::None,
    };
    wit::Request {
        id: r.id.clone(),
        inputs: r.inputs.iter().map(tensor_to_wit).collect(),
        requested_outputs: r.outputs.iter().map(|o| o.name.clone()).collect(),
        parameters: params_to_wit(&r.parameters),
        correlation_id,
        flags: u32::from(seq.start) | (u32::from(seq.end) << 1),
    }
}

const CODES: &[(Code, wit::ErrorCode)] = &[
    (Code::Unknown, wit::ErrorCode::Unknown),
    (Code::Internal, wit::ErrorCode::Internal),
    (Code::NotFound, wit::ErrorCode::NotFound),
    (Code::InvalidArg, wit::ErrorCode::InvalidArg),
    (Code::Unavailable, wit::ErrorCode::Unavailable),
    (Code::Unsupported, wit::ErrorCode::Unsupported),
    (Code::AlreadyExists, wit::ErrorCode::AlreadyExists),
    (Code::Cancelled, wit::ErrorCode::Cancelled),
];

/// An error as the plugin sees it.
pub fn error_to_wit(e: &Error) -> wit::Error {
    wit::Error {
        code: CODES
            .iter()
            .find(|(c, _)| *c == e.code)
            .expect("every code")
            .1,
        message: e.message.clone(),
    }
}

/// A plugin's error.
pub fn error_from_wit(e: wit::Error) -> Error {
    Error::new(
        CODES
            .iter()
            .find(|(_, w)| *w == e.code)
            .expect("every code")
            .0,
        e.message,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_and_params_round_trip() {
        let t = Tensor {
            name: "x".into(),
            dtype: DataType::Fp32,
            shape: vec![1, 2],
            data: Bytes::from(vec![0u8; 8]),
        };
        let back = tensor_from_wit(tensor_to_wit(&t));
        assert_eq!(
            (&back.name, back.dtype, &back.shape),
            (&t.name, t.dtype, &t.shape)
        );
        let mut p = Parameters::new();
        p.insert("a".into(), Parameter::Int(3));
        p.insert("b".into(), Parameter::String("s".into()));
        assert_eq!(params_from_wit(params_to_wit(&p)), p);
        for d in DataType::all() {
            assert_eq!(dtype_from_wit(dtype_to_wit(d)), d);
        }
    }

    #[test]
    fn plugin_logs_are_cut_and_rate_limited() {
        let long = "é".repeat(MAX_LOG_LINE);
        let line = cut(long);
        assert!(
            line.len() < MAX_LOG_LINE + 64 && line.ends_with("bytes cut]"),
            "{line}"
        );
        let mut l = LogLimit::default();
        let allowed = (0..5000).filter(|_| l.take()).count();
        assert!((1000..1100).contains(&allowed), "{allowed}");
        assert!(l.dropped >= 3900);
    }

    #[test]
    fn sequence_parameters_become_correlation_and_flags() {
        let mut r = InferRequest::default();
        r.parameters
            .insert("sequence_id".into(), Parameter::Int(42));
        r.parameters
            .insert("sequence_start".into(), Parameter::Bool(true));
        let w = request_to_wit(&r);
        assert!(matches!(w.correlation_id, wit::CorrelationId::Number(42)));
        assert_eq!(w.flags, 1);
    }

    #[test]
    fn block_on_honours_the_deadline() {
        let never = std::future::pending::<()>();
        let d = Instant::now() + std::time::Duration::from_millis(20);
        assert!(block_on(never, Some(d)).is_none());
        assert_eq!(block_on(async { 7 }, None), Some(7));
    }
}
