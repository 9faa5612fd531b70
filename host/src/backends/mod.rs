//! The backends built into the server ([`Registry`]) and backend selection
//! from a config (Triton's `backend`/`platform` rules and default file
//! names). The traits are in `tern_core::backend`.

pub mod identity;

use std::path::Path;
use std::sync::Arc;

use tern_core::backend::Backend;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};

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
    plugins: Arc<tern_wasm::PluginTelemetry>,
}

impl Default for Registry {
    fn default() -> Self {
        let plugins = Arc::new(tern_wasm::PluginTelemetry::default());
        Registry {
            backends: vec![
                Arc::new(tern_onnx::OnnxBackend),
                Arc::new(identity::IdentityBackend),
                Arc::new(tern_wasm::backend::WasmBackend::new(plugins.clone())),
            ],
            plugins,
        }
    }
}

impl Registry {
    /// What the `wasm` backend's plugins counted (for the metrics endpoint).
    pub fn plugin_telemetry(&self) -> &Arc<tern_wasm::PluginTelemetry> {
        &self.plugins
    }

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
