//! Backends: the traits every model implementation follows, backend
//! selection from a config (Triton's `backend`/`platform` rules and default
//! file names), and the built-in backends.

pub mod identity;
pub mod onnx_device;
pub mod onnx_io;
pub mod onnxruntime;
pub mod wasm;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::ModelConfig;
use crate::core::{InferRequest, InferResponse};
use crate::error::{Error, Result};

/// Backend-wide settings from the command line.
#[derive(Debug, Clone, Default)]
pub struct BackendSettings {
    /// Path of `libonnxruntime.so`; `None` = `ORT_DYLIB_PATH` or the default lookup.
    pub onnxruntime_library: Option<PathBuf>,
    /// `--backend-config=default-max-batch-size=N` (Triton's default is 4).
    pub default_max_batch_size: i32,
    /// `--wasm-cache-dir`: where compiled plugins are cached (`None` = no cache).
    pub wasm_cache_dir: Option<PathBuf>,
}

/// Where a model's files are.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// `<repository>/<model>`.
    pub model_dir: PathBuf,
    /// `<repository>/<model>/<version>` of the version used for auto-complete.
    pub version_dir: Option<PathBuf>,
}

/// What a backend needs to load one version of a model.
pub struct LoadContext<'a> {
    /// Normalised, validated config.
    pub config: &'a ModelConfig,
    /// Version being loaded.
    pub version: i64,
    /// `<repository>/<model>/<version>`.
    pub version_dir: &'a Path,
    /// Backend settings.
    pub settings: &'a BackendSettings,
    /// The server's models, for backends that call other models (BLS).
    pub models: std::sync::Weak<crate::repository::Repository>,
}

/// Device an instance runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// Host CPU.
    Cpu,
    /// A CUDA GPU with the given index.
    Gpu(i32),
}

/// Identity of one model instance.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    /// `<group name>_<index>`.
    pub name: String,
    /// Device placement.
    pub device: DeviceKind,
}

/// A model implementation (one loaded version).
pub trait Model: Send + Sync {
    /// Creates one execution instance; called once per `instance_group` instance.
    fn create_instance(&self, spec: &InstanceSpec) -> Result<Box<dyn Instance>>;
    /// Whether a batch may mix requests whose `allow_ragged_batch` inputs differ in shape.
    fn supports_ragged(&self) -> bool {
        false
    }
}

/// Moments within one execution, set by backends that can tell them apart;
/// they feed the compute_input / compute_infer / compute_output statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExecTiming {
    /// Inputs are gathered and converted.
    pub input_done: Option<std::time::Instant>,
    /// The model has run.
    pub infer_done: Option<std::time::Instant>,
}

/// One execution instance; owned by its own OS thread.
pub trait Instance: Send {
    /// Executes a batch of requests, returning exactly one result per request, in order.
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>>;
}

/// A backend: turns model files and a config into a [`Model`].
pub trait Backend: Send + Sync {
    /// Backend name as written in `config.pbtxt` (`backend: "onnxruntime"`).
    fn name(&self) -> &'static str;
    /// Triton's platform string for this backend, if any.
    fn platform(&self) -> &'static str;
    /// Triton's default model file name (`model.onnx`); `None` when no file is needed.
    fn default_filename(&self) -> Option<&'static str>;
    /// Fills what the config leaves out from the model file.
    fn auto_complete(
        &self,
        files: &ModelFiles,
        cfg: &mut ModelConfig,
        settings: &BackendSettings,
    ) -> Result<()>;
    /// Loads one version.
    fn load(&self, ctx: &LoadContext) -> Result<Arc<dyn Model>>;
}

/// Triton backends and platforms that exist but that Tern does not provide.
const TRITON_ONLY_BACKENDS: &[&str] = &[
    "tensorflow",
    "pytorch",
    "python",
    "tensorrt",
    "openvino",
    "fil",
    "dali",
    "fastertransformer",
    "vllm",
    "tensorrtllm",
];
const TRITON_ONLY_PLATFORMS: &[&str] = &[
    "tensorflow_graphdef",
    "tensorflow_savedmodel",
    "tensorrt_plan",
    "pytorch_libtorch",
];

/// The backends built into this binary.
pub struct Registry {
    backends: Vec<Arc<dyn Backend>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            backends: vec![
                Arc::new(onnxruntime::OnnxBackend),
                Arc::new(identity::IdentityBackend),
                Arc::new(wasm::WasmBackend),
            ],
        }
    }
}

impl Registry {
    /// Finds a backend by name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Backend>> {
        self.backends.iter().find(|b| b.name() == name).cloned()
    }

    /// Picks the backend for a config following Triton's rules: `backend`,
    /// then `platform`, then the default file found in the version folder.
    pub fn resolve(
        &self,
        cfg: &ModelConfig,
        version_dir: Option<&Path>,
    ) -> Result<Arc<dyn Backend>> {
        let m = &cfg.name;
        if !cfg.backend.is_empty() {
            if let Some(b) = self.get(&cfg.backend) {
                if !cfg.platform.is_empty() && cfg.platform != b.platform() {
                    return Err(Error::invalid_arg(format!(
                        "model '{m}': platform '{}' does not match backend '{}'",
                        cfg.platform, cfg.backend
                    )));
                }
                return Ok(b);
            }
            return Err(unknown("backend", &cfg.backend, m, TRITON_ONLY_BACKENDS));
        }
        if !cfg.platform.is_empty() {
            if let Some(b) = self
                .backends
                .iter()
                .find(|b| !b.platform().is_empty() && b.platform() == cfg.platform)
            {
                return Ok(b.clone());
            }
            return Err(unknown("platform", &cfg.platform, m, TRITON_ONLY_PLATFORMS));
        }
        if let Some(dir) = version_dir {
            let file = |name: &str| {
                if cfg.default_model_filename.is_empty() {
                    dir.join(name).exists()
                } else {
                    cfg.default_model_filename == name && dir.join(name).exists()
                }
            };
            for b in &self.backends {
                if b.default_filename().is_some_and(file) {
                    return Ok(b.clone());
                }
            }
        }
        Err(Error::invalid_arg(format!(
            "model '{m}': no 'backend' or 'platform' is set and none can be inferred from the model files \
             (Tern recognises 'model.onnx' and 'model.wasm')"
        )))
    }
}

fn unknown(field: &str, value: &str, model: &str, triton_only: &[&str]) -> Error {
    if triton_only.contains(&value) {
        Error::unsupported(format!(
            "model '{model}': {field} '{value}' is a Triton {field} that Tern does not provide \
             (Tern serves 'onnxruntime', 'wasm' and 'identity'; custom logic runs as WebAssembly plugins, backend: \"wasm\")"
        ))
    } else {
        Error::invalid_arg(format!("model '{model}': unknown {field} '{value}'"))
    }
}

/// Reads a model parameter (`parameters { key: .. value: { string_value: .. } }`).
pub fn model_parameter<'a>(cfg: &'a ModelConfig, key: &str) -> Option<&'a str> {
    cfg.parameters.get(key).map(|p| p.string_value.as_str())
}

/// Reads a numeric model parameter, with a clear error when it does not parse.
pub fn numeric_parameter<T: std::str::FromStr>(cfg: &ModelConfig, key: &str) -> Result<Option<T>> {
    match model_parameter(cfg, key) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            Error::invalid_arg(format!(
                "model '{}': parameter '{key}' must be a number, got '{v}'",
                cfg.name
            ))
        }),
    }
}

/// Reads a boolean model parameter (`true`/`false`, `1`/`0`, any case),
/// with a clear error for anything else.
pub fn bool_parameter(cfg: &ModelConfig, key: &str) -> Result<Option<bool>> {
    match model_parameter(cfg, key).map(str::trim) {
        None => Ok(None),
        Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => Ok(Some(true)),
        Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => Ok(Some(false)),
        Some(v) => Err(Error::invalid_arg(format!(
            "model '{}': parameter '{key}' must be true or false, got '{v}'",
            cfg.name
        ))),
    }
}

/// The model file for a version: `default_model_filename` or the backend's default.
pub fn model_file(cfg: &ModelConfig, version_dir: &Path, default: &str) -> Result<PathBuf> {
    let name = if cfg.default_model_filename.is_empty() {
        default
    } else {
        &cfg.default_model_filename
    };
    let path = version_dir.join(name);
    if !path.exists() {
        return Err(Error::not_found(format!(
            "model '{}': model file '{}' does not exist",
            cfg.name,
            path.display()
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bool_parameters_parse_or_name_the_problem() {
        let cfg = crate::config::parse_pbtxt(
            r#"name: "m" parameters [
                 { key: "a" value { string_value: "TRUE" } },
                 { key: "b" value { string_value: " 0 " } },
                 { key: "c" value { string_value: "Yes" } }
               ]"#,
        )
        .unwrap();
        assert_eq!(bool_parameter(&cfg, "a").unwrap(), Some(true));
        assert_eq!(bool_parameter(&cfg, "b").unwrap(), Some(false));
        assert_eq!(bool_parameter(&cfg, "missing").unwrap(), None);
        let e = bool_parameter(&cfg, "c").unwrap_err();
        assert_eq!(
            e.message,
            "model 'm': parameter 'c' must be true or false, got 'Yes'"
        );
    }
}
