//! Write [Tern](https://github.com) plugins in Rust.
//!
//! A plugin is a model whose implementation is a WebAssembly component of
//! the `tern:plugin` world (`wit/plugin.wit`). Implement [`Model`], export it
//! with [`export_model!`], build with `cargo build --release --target
//! wasm32-wasip2`, and copy the `.wasm` to `<repository>/<model>/1/model.wasm`
//! next to a `config.pbtxt` with `backend: "wasm"`.
//!
//! ```ignore
//! use tern_plugin::{export_model, gather, Error, Model, ModelContext, Request, Response};
//!
//! struct AddSub;
//!
//! impl Model for AddSub {
//!     fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
//!         Ok(AddSub)
//!     }
//!
//!     fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
//!         // One batched tensor for the whole request list, split back per request.
//!         let run = || -> Result<Vec<Response>, Error> {
//!             let a = gather::<f32>(&requests, "INPUT0")?;
//!             let b = gather::<f32>(&requests, "INPUT1")?;
//!             let sum: Vec<f32> = a.data.iter().zip(&b.data).map(|(x, y)| x + y).collect();
//!             let outs = a.split("OUTPUT0", sum, &a.inner)?;
//!             Ok(outs.into_iter().map(|t| Response::new(vec![t])).collect())
//!         };
//!         tern_plugin::per_request(requests.len(), run())
//!     }
//! }
//!
//! export_model!(AddSub);
//! ```

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "tern:plugin/plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin",
        default_bindings_module: "tern_plugin::bindings",
    });
}

pub mod ops;
mod tensor;

pub use bindings::tern::plugin::host::{LogLevel, MetricKind};
pub use bindings::tern::plugin::responses::ResponseSender;
pub use bindings::tern::plugin::types::{
    CorrelationId, DataType, Error, ErrorCode, InferRequest, InstanceKind, ModelContext, Parameter,
    ParameterValue, Request, Response, Tensor,
};
pub use tensor::{gather, per_request, Batch, Element};

/// Response flag: the request's last message (Triton's
/// `TRITONSERVER_RESPONSE_COMPLETE_FINAL`).
pub const RESPONSE_COMPLETE_FINAL: u32 = 1;

/// The response sender of request `index` of the batch `execute` is running
/// (decoupled models, `model_transaction_policy { decoupled: true }`): send
/// any number of responses, then [`RESPONSE_COMPLETE_FINAL`], now or during
/// a later call. Dropping it without the final flag sends the flag.
///
/// ```ignore
/// fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
///     for (i, r) in requests.iter().enumerate() {
///         let sender = tern_plugin::response_sender(i).unwrap();
///         for token in self.generate(r) {
///             if sender.is_cancelled() { break; }
///             sender.send(Some(&token_response(token)), 0).ok();
///         }
///         sender.send(None, tern_plugin::RESPONSE_COMPLETE_FINAL).ok();
///     }
///     Vec::new() // a decoupled model answers through its senders
/// }
/// ```
pub fn response_sender(index: usize) -> Result<ResponseSender, Error> {
    bindings::tern::plugin::responses::sender(index as u32)
}

/// Whether the client of request `index` of the running batch has gone away
/// (Triton's `request.is_cancelled()`); for decoupled models, also
/// [`ResponseSender::is_cancelled`].
pub fn is_cancelled(index: usize) -> bool {
    bindings::tern::plugin::responses::is_cancelled(index as u32)
}

/// Panics are reported to the server (message and `file:line:column`), which
/// puts them into the error the failed requests get and into its log; a
/// panic still ends the call (WebAssembly panics abort).
#[doc(hidden)]
pub fn __report_panics() {
    std::panic::set_hook(Box::new(|info| {
        let message = if let Some(s) = info.payload().downcast_ref::<&str>() {
            s.to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "(no message)".to_string()
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_default();
        bindings::tern::plugin::host::log(LogLevel::Error, &format!("panicked{at}: {message}"));
    }));
}

#[doc(hidden)]
pub mod __export {
    pub use crate::bindings::exports::tern::plugin::model::Guest;
}

/// A plugin model. One value lives per model instance, from `initialize`
/// to `finalize`, so state (vocabularies, lookup tables) persists across
/// calls, as with `initialize` in Triton's Python backend.
pub trait Model: Sized + 'static {
    /// Creates the instance. An error fails the model's load with its message.
    fn initialize(ctx: ModelContext) -> Result<Self, Error>;
    /// Runs a batch: exactly one result per request, in order.
    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>>;
    /// Called when the instance is unloaded.
    fn finalize(&mut self) {}
}

/// Exports a [`Model`] implementation as the plugin's `model` interface.
#[macro_export]
macro_rules! export_model {
    ($model:ty) => {
        #[doc(hidden)]
        pub struct __TernPlugin;

        ::std::thread_local! {
            static __TERN_STATE: ::std::cell::RefCell<::std::option::Option<$model>> =
                const { ::std::cell::RefCell::new(::std::option::Option::None) };
        }

        impl $crate::__export::Guest for __TernPlugin {
            fn initialize(ctx: $crate::ModelContext) -> ::std::result::Result<(), $crate::Error> {
                $crate::__report_panics();
                let model = <$model as $crate::Model>::initialize(ctx)?;
                __TERN_STATE.with(|s| *s.borrow_mut() = ::std::option::Option::Some(model));
                ::std::result::Result::Ok(())
            }

            fn execute(
                requests: ::std::vec::Vec<$crate::Request>,
            ) -> ::std::vec::Vec<::std::result::Result<$crate::Response, $crate::Error>> {
                __TERN_STATE.with(|s| match s.borrow_mut().as_mut() {
                    ::std::option::Option::Some(m) => $crate::Model::execute(m, requests),
                    ::std::option::Option::None => requests
                        .iter()
                        .map(|_| ::std::result::Result::Err($crate::Error::internal("execute called before initialize")))
                        .collect(),
                })
            }

            fn finalize() {
                __TERN_STATE.with(|s| {
                    if let ::std::option::Option::Some(mut m) = s.borrow_mut().take() {
                        $crate::Model::finalize(&mut m);
                    }
                })
            }
        }

        $crate::bindings::__export_plugin!(__TernPlugin with_types_in $crate::bindings);
    };
}

impl Error {
    /// An error with `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }
    /// INVALID_ARG: the request is wrong (HTTP 400).
    pub fn invalid_arg(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::InvalidArg, message)
    }
    /// INTERNAL: the plugin failed (HTTP 500).
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Internal, message)
    }
    /// NOT_FOUND.
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::NotFound, message)
    }
    /// UNAVAILABLE: try again later.
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Unavailable, message)
    }
    /// UNSUPPORTED.
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Unsupported, message)
    }
}

impl ModelContext {
    /// Whether the model is decoupled (`model_transaction_policy { decoupled: true }`):
    /// it answers through [`response_sender`].
    pub fn is_decoupled(&self) -> bool {
        serde_json::from_str::<serde_json::Value>(&self.config_json)
            .ok()
            .and_then(|c| c["model_transaction_policy"]["decoupled"].as_bool())
            .unwrap_or(false)
    }

    /// A `parameters { key: .. value: { string_value: .. } }` entry of the
    /// model's `config.pbtxt`.
    ///
    /// ```ignore
    /// let max_len: usize = ctx.parameter("max_length").and_then(|v| v.parse().ok()).unwrap_or(256);
    /// ```
    pub fn parameter(&self, key: &str) -> Option<String> {
        let config: serde_json::Value = serde_json::from_str(&self.config_json).ok()?;
        config
            .get("parameters")?
            .get(key)?
            .get("string_value")?
            .as_str()
            .map(str::to_string)
    }

    /// A file of the model's version folder (read-only), e.g. `vocab.txt`.
    pub fn read_file(&self, name: &str) -> Result<Vec<u8>, Error> {
        let path = format!("{}/{name}", self.repository_path);
        std::fs::read(&path).map_err(|e| Error::not_found(format!("cannot read '{path}': {e}")))
    }
}

impl Request {
    /// The input called `name`, or an INVALID_ARG error naming it.
    pub fn input(&self, name: &str) -> Result<&Tensor, Error> {
        self.inputs
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::invalid_arg(format!("request has no input '{name}'")))
    }

    /// A request parameter.
    pub fn parameter(&self, key: &str) -> Option<&ParameterValue> {
        self.parameters
            .iter()
            .find(|p| p.key == key)
            .map(|p| &p.value)
    }

    /// Whether the client asked for `output` (an empty list means all outputs).
    pub fn wants(&self, output: &str) -> bool {
        self.requested_outputs.is_empty() || self.requested_outputs.iter().any(|o| o == output)
    }
}

impl Response {
    /// A response with these outputs.
    pub fn new(outputs: Vec<Tensor>) -> Response {
        Response {
            outputs,
            parameters: Vec::new(),
        }
    }
}

impl InferRequest {
    /// A BLS request for the latest version of `model`.
    pub fn new(model: impl Into<String>) -> InferRequest {
        InferRequest {
            model_name: model.into(),
            model_version: -1,
            id: String::new(),
            inputs: Vec::new(),
            requested_outputs: Vec::new(),
            parameters: Vec::new(),
        }
    }

    /// Adds an input.
    pub fn with_input(mut self, t: Tensor) -> InferRequest {
        self.inputs.push(t);
        self
    }

    /// Asks for one output (by default all are returned).
    pub fn with_output(mut self, name: impl Into<String>) -> InferRequest {
        self.requested_outputs.push(name.into());
        self
    }

    /// Runs the request on the target model, in-process (BLS), and waits for
    /// its response. Fails with UNAVAILABLE on a call cycle or when the
    /// calling `execute`'s deadline passes.
    pub fn exec(&self) -> Result<Response, Error> {
        bindings::tern::plugin::host::infer(self)
    }

    /// Runs the request and returns its responses as the model sends them
    /// (Triton's `exec(decoupled=True)`): many for a decoupled model, one
    /// for any other. Each `next()` waits within the calling `execute`'s
    /// deadline; dropping the iterator cancels the request.
    pub fn exec_stream(&self) -> Result<Responses, Error> {
        bindings::tern::plugin::responses::infer_stream(self).map(Responses)
    }
}

/// The responses of a streaming BLS request ([`InferRequest::exec_stream`]).
pub struct Responses(bindings::tern::plugin::responses::ResponseStream);

impl Iterator for Responses {
    type Item = Result<Response, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next()
    }
}

impl Response {
    /// The output called `name`, or an error naming it.
    pub fn output(&self, name: &str) -> Result<&Tensor, Error> {
        self.outputs
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::internal(format!("response has no output '{name}'")))
    }
}

/// Writes to the server's log, tagged with this plugin's model name.
pub fn log(level: LogLevel, message: &str) {
    bindings::tern::plugin::host::log(level, message)
}

/// Custom metrics, exposed with the server's metrics.
pub mod metrics {
    use super::bindings::tern::plugin::host;
    use super::Error;
    pub use super::MetricKind;

    /// A declared metric family.
    #[derive(Debug, Clone, Copy)]
    pub struct Family(u32);

    impl Family {
        /// Declares (or finds) a family; `buckets` only matter for histograms.
        pub fn new(
            name: &str,
            help: &str,
            kind: MetricKind,
            buckets: &[f64],
        ) -> Result<Family, Error> {
            host::metric_family(name, help, kind, buckets).map(Family)
        }
        /// Counter: add; gauge: add; histogram: observe.
        pub fn record(&self, labels: &[(&str, &str)], value: f64) -> Result<(), Error> {
            host::metric_record(self.0, &owned(labels), value)
        }
        /// Gauge: set.
        pub fn set(&self, labels: &[(&str, &str)], value: f64) -> Result<(), Error> {
            host::metric_set(self.0, &owned(labels), value)
        }
    }

    fn owned(labels: &[(&str, &str)]) -> Vec<(String, String)> {
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}
