//! What every frontend answers the same way: server readiness and model
//! metadata, computed once here and rendered by each protocol; and how the
//! listeners accept connections.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::infer::Infer;
use crate::repository::control::{ControlMode, LoadOverride};
use crate::repository::Repository;
use tern_core::error::Result;
use tern_core::DataType;
use tern_memory::shm::SharedMemory;

/// Extensions this server implements, reported by server metadata.
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "sequence",
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "logging",
    "model_repository",
    "model_repository(unload_dependents)",
    "trace",
    // Not a KServe/Triton extension: tells Tern apart from tritonserver, whose
    // default `--id` (`triton`) Tern shares.
    "tern",
];

/// Server-wide state shared by the frontends.
pub struct ServerInfo {
    /// The one way inference requests reach a model.
    pub infer: Arc<Infer>,
    /// All models: loading, unloading, the index, metadata (the facade's repository).
    pub repository: Arc<Repository>,
    /// `--id`.
    pub server_id: String,
    /// `--strict-readiness`.
    pub strict_readiness: bool,
    /// Set when shutdown starts: the server stops reporting ready.
    pub shutting_down: AtomicBool,
    /// `--model-control-mode`: whether the load/unload API may change models.
    pub control_mode: ControlMode,
    /// Registered system and CUDA shared-memory regions.
    pub shm: Arc<SharedMemory>,
    /// False when the model repository could not be opened at startup and
    /// `--exit-on-error=false` kept the server up: as tritonserver, it then
    /// answers metadata but is neither live nor ready.
    pub initialized: bool,
}

impl ServerInfo {
    /// Liveness: the server started (tritonserver's `IsLive`).
    pub fn live(&self) -> bool {
        self.initialized
    }

    /// Readiness as `--strict-readiness` defines it.
    pub fn ready(&self) -> bool {
        self.initialized
            && !self.shutting_down.load(Ordering::Relaxed)
            && (!self.strict_readiness || self.repository.all_ready())
    }
}

/// Name, datatype and shape of a model input or output.
pub struct TensorMeta {
    /// Tensor name.
    pub name: String,
    /// Wire datatype (`"FP32"`).
    pub datatype: &'static str,
    /// Shape with the batch dimension as -1 when the model batches.
    pub shape: Vec<i64>,
}

/// Model metadata (KServe v2).
pub struct ModelMetadata {
    /// Model name.
    pub name: String,
    /// Ready versions (or the one asked for).
    pub versions: Vec<String>,
    /// `platform`, or the backend name when the config has no platform.
    pub platform: String,
    /// Inputs.
    pub inputs: Vec<TensorMeta>,
    /// Outputs.
    pub outputs: Vec<TensorMeta>,
}

/// Metadata of a ready model version.
pub fn model_metadata(
    repository: &Repository,
    model: &str,
    version: Option<i64>,
) -> Result<ModelMetadata> {
    let handle = repository.get(model, version)?;
    let cfg = &handle.config;
    let versions = match version {
        Some(v) => vec![v.to_string()],
        None => repository
            .ready_versions(model)
            .iter()
            .map(|v| v.to_string())
            .collect(),
    };
    let batch = cfg.max_batch_size > 0;
    let meta = |name: &str, dt: i32, dims: &[i64]| TensorMeta {
        name: name.to_string(),
        datatype: DataType::from_config(dt)
            .map(|d| d.wire_name())
            .unwrap_or("INVALID"),
        shape: if batch {
            std::iter::once(-1).chain(dims.iter().copied()).collect()
        } else {
            dims.to_vec()
        },
    };
    Ok(ModelMetadata {
        name: cfg.name.clone(),
        versions,
        platform: if cfg.platform.is_empty() {
            cfg.backend.clone()
        } else {
            cfg.platform.clone()
        },
        inputs: cfg
            .input
            .iter()
            .map(|i| meta(&i.name, i.data_type, &i.dims))
            .collect(),
        outputs: cfg
            .output
            .iter()
            .map(|o| meta(&o.name, o.data_type, &o.dims))
            .collect(),
    })
}

/// The trace extension (HTTP `/v2/[models/<model>/]trace/setting`, gRPC
/// `TraceSetting`): the setting of `model` (`None`: the global one) after
/// `update`, if any, as key and string values in Triton's order.
pub fn trace_setting(
    info: &ServerInfo,
    model: Option<&str>,
    update: Option<&crate::trace::Update>,
) -> Result<Vec<(String, Vec<String>)>> {
    trace_model_known(info, model)?;
    let tracer = info.infer.tracer();
    match update {
        Some(u) => tracer.update(model, u),
        None => Ok(tracer.settings(model)),
    }
}

/// Triton's error for a trace setting of a model that is not loaded;
/// checked before the update's values, as Triton checks it.
pub fn trace_model_known(info: &ServerInfo, model: Option<&str>) -> Result<()> {
    match model {
        Some(m) if info.infer.target(m, None).is_err() => Err(tern_core::Error::invalid_arg(
            format!("Request for unknown model : {m}"),
        )),
        _ => Ok(()),
    }
}

/// `--http-header-forward-pattern` / `--grpc-header-forward-pattern`: the
/// request headers (gRPC metadata) whose names match become string request
/// parameters of the same name, as tritonserver forwards them (the pattern
/// matches anywhere in the name, case-insensitively).
#[derive(Debug, Clone)]
pub struct HeaderForward(regex::Regex);

impl HeaderForward {
    /// The pattern of `flag`, or why it is not a regular expression.
    pub fn parse(flag: &str, pattern: &str) -> Result<HeaderForward> {
        regex::Regex::new(&format!("(?i){pattern}"))
            .map(HeaderForward)
            .map_err(|e| {
                tern_core::Error::invalid_arg(format!(
                    "{flag} '{pattern}' is not a valid regular expression: {e}"
                ))
            })
    }

    /// The matching headers, as (name, value); values that are not text are skipped.
    pub fn matching(&self, headers: &axum::http::HeaderMap) -> Vec<(String, String)> {
        headers
            .iter()
            .filter(|(name, _)| self.0.is_match(name.as_str()))
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
            .collect()
    }
}

/// Adds forwarded headers to a request's parameters; a parameter the
/// request itself sets keeps its value.
pub fn forward_headers(request: &mut tern_core::InferRequest, headers: Vec<(String, String)>) {
    for (name, value) in headers {
        request
            .parameters
            .entry(name)
            .or_insert(tern_core::Parameter::String(value));
    }
}

/// Triton's answer to a repository call that names a repository (HTTP
/// `/v2/repository/<name>/models/...`, gRPC `repository_name`).
pub fn repository_name_unsupported() -> tern_core::Error {
    tern_core::Error::unsupported("'repository_name' specification is not supported")
}

/// The W3C `traceparent` header of a request (HTTP headers, gRPC metadata).
pub fn traceparent(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get("traceparent").and_then(|v| v.to_str().ok())
}

/// Parses a version string from a path or message: empty = policy's choice.
pub fn parse_version(v: &str) -> Result<Option<i64>> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<i64>()
        .ok()
        .filter(|&n| n >= 1)
        .map(Some)
        .ok_or_else(|| {
            tern_core::error::Error::invalid_arg(format!("'{v}' is not a valid model version"))
        })
}

/// Loads a model through the API (both frontends): refused unless the model
/// control mode is explicit, as Triton does. Runs on a blocking thread.
pub async fn load_model(info: &ServerInfo, name: String, overrides: LoadOverride) -> Result<()> {
    check_control(info)?;
    let repo = info.repository.clone();
    tokio::task::spawn_blocking(move || repo.load_model(&name, overrides))
        .await
        .map_err(|e| tern_core::error::Error::internal(format!("model load panicked: {e}")))?
}

/// Unloads a model through the API (both frontends); same rules as [`load_model`].
pub async fn unload_model(info: &ServerInfo, name: String, unload_dependents: bool) -> Result<()> {
    check_control(info)?;
    let repo = info.repository.clone();
    tokio::task::spawn_blocking(move || repo.unload_model(&name, unload_dependents))
        .await
        .map_err(|e| tern_core::error::Error::internal(format!("model unload panicked: {e}")))?
}

fn check_control(info: &ServerInfo) -> Result<()> {
    if info.control_mode == ControlMode::Explicit {
        Ok(())
    } else {
        Err(tern_core::messages::control_while_polling())
    }
}

/// The `timeout` request parameter (microseconds) of an HTTP request's JSON
/// (`parameters.timeout`, or generate's top-level `timeout`), read only to
/// bound the wait for a model loading on demand; `None` when absent.
pub fn timeout_parameter(json: &[u8]) -> Option<std::time::Duration> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let t = v
        .get("parameters")
        .and_then(|p| p.get("timeout"))
        .or_else(|| v.get("timeout"))?
        .as_u64()?;
    (t > 0).then(|| std::time::Duration::from_micros(t))
}
