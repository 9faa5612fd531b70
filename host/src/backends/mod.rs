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
];

/// The backends built into this binary.
pub struct Registry {
    backends: Vec<Arc<dyn Backend>>,
    plugins: Arc<tern_wasm::PluginTelemetry>,
}

/// Backends a build can leave out (cargo features): backend name,
/// platform, default file name, feature, what the build lacks and what to do.
const OPTIONAL_BACKENDS: &[(&str, &str, &str, &str, &str, &str)] = &[
    (
        "onnxruntime",
        "onnxruntime_onnx",
        "model.onnx",
        "onnx",
        "ONNX Runtime",
        "install a Tern build that includes it",
    ),
    (
        "pytorch",
        "pytorch_libtorch",
        "model.pt",
        "torch",
        "LibTorch",
        "build one with `make torch` (docs/configuration.md, \"PyTorch models\"), or export the model to ONNX \
         (torch.onnx.export) and serve it with backend: \"onnxruntime\"",
    ),
];

impl Default for Registry {
    fn default() -> Self {
        let plugins = Arc::new(tern_wasm::PluginTelemetry::default());
        let backends: Vec<Arc<dyn Backend>> = vec![
            #[cfg(feature = "onnx")]
            Arc::new(tern_onnx::OnnxBackend),
            #[cfg(feature = "torch")]
            Arc::new(tern_torch::TorchBackend),
            Arc::new(identity::IdentityBackend),
            Arc::new(tern_wasm::backend::WasmBackend::new(plugins.clone())),
            Arc::new(tern_wasm::python::PythonBackend::new(plugins.clone())),
        ];
        Registry { backends, plugins }
    }
}

impl Registry {
    /// The metric families the backends keep themselves (the `wasm`
    /// backend's plugin counters, cache counts and plugin-declared families).
    pub fn families(&self) -> Vec<Arc<dyn tern_core::prometheus::Families>> {
        vec![self.plugins.clone()]
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
                        "platform '{}' does not match backend '{}'",
                        cfg.platform, cfg.backend
                    ))
                    .for_model(m));
                }
                return Ok(b);
            }
            return Err(self.unknown("backend", &cfg.backend, m, TRITON_ONLY_BACKENDS));
        }
        if !cfg.platform.is_empty() {
            if let Some(b) = self
                .backends
                .iter()
                .find(|b| !b.platform().is_empty() && b.platform() == cfg.platform)
            {
                return Ok(b.clone());
            }
            return Err(self.unknown("platform", &cfg.platform, m, TRITON_ONLY_PLATFORMS));
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
            if let Some(missing) = self.left_out(|_, _, f| file(f)) {
                return Err(missing.for_model(m));
            }
        }
        let files: Vec<String> = self
            .backends
            .iter()
            .filter_map(|b| Some(format!("'{}'", b.default_filename()?)))
            .collect();
        Err(Error::invalid_arg(format!(
            "no 'backend' or 'platform' is set and none can be inferred from the model files \
             (Tern recognises {})",
            files.join(" and ")
        ))
        .for_model(m))
    }

    /// The error for a backend or platform this build does not serve.
    fn unknown(&self, field: &str, value: &str, model: &str, triton_only: &[&str]) -> Error {
        if let Some(missing) =
            self.left_out(|b, p, _| value == if field == "backend" { b } else { p })
        {
            return missing.for_model(model);
        }
        if triton_only.contains(&value) {
            let names: Vec<String> = self
                .backends
                .iter()
                .map(|b| format!("'{}'", b.name()))
                .collect();
            let what_to_do = match guidance(value) {
                Some(g) => g.to_string(),
                None => "custom logic runs as WebAssembly plugins, backend: \"wasm\"".to_string(),
            };
            Error::unsupported(format!(
                "{field} '{value}' is a Triton {field} that Tern does not provide \
                 (this build serves {}); {what_to_do}",
                names.join(", ")
            ))
            .for_model(model)
        } else {
            Error::invalid_arg(format!("unknown {field} '{value}'")).for_model(model)
        }
    }

    /// An optional backend this build was compiled without that matches
    /// (backend name, platform, default file name).
    fn left_out(&self, matches: impl Fn(&str, &str, &str) -> bool) -> Option<LeftOut> {
        OPTIONAL_BACKENDS
            .iter()
            .find(|(b, p, f, _, _, _)| self.get(b).is_none() && matches(b, p, f))
            .map(|(b, _, _, feature, what, how)| LeftOut {
                backend: b,
                feature,
                what,
                how,
            })
    }
}

/// What to do with a model of a Triton backend or platform Tern does not run.
fn guidance(value: &str) -> Option<&'static str> {
    Some(match value {
        "tensorflow" | "tensorflow_graphdef" | "tensorflow_savedmodel" => {
            "convert it to ONNX (tf2onnx) and serve it with backend: \"onnxruntime\""
        }
        "tensorrt" | "tensorrt_plan" => {
            "serve the ONNX model the engine was built from with backend: \"onnxruntime\" and the \
             TensorRT execution accelerator (optimization { execution_accelerators { \
             gpu_execution_accelerator: [ { name: \"tensorrt\" } ] } }), which builds and caches the engine"
        }
        "openvino" => "serve its ONNX model with backend: \"onnxruntime\"",
        _ => return None,
    })
}

/// A backend this build leaves out.
struct LeftOut {
    backend: &'static str,
    feature: &'static str,
    what: &'static str,
    how: &'static str,
}

impl LeftOut {
    fn for_model(&self, model: &str) -> Error {
        Error::unsupported(format!(
            "this build has no {what} (built without the '{feature}' feature), \
             so it cannot serve '{backend}' models; {how}",
            what = self.what,
            how = self.how,
            feature = self.feature,
            backend = self.backend
        ))
        .for_model(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    fn resolve(config: &str, files: &[&str]) -> Result<&'static str> {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        let cfg = parse_pbtxt(&format!("name: \"m\" {config}")).unwrap();
        Registry::default()
            .resolve(&cfg, Some(dir.path()))
            .map(|b| b.name())
    }

    #[test]
    fn backends_are_picked_by_name_platform_or_file() {
        assert_eq!(resolve("backend: \"wasm\"", &[]).unwrap(), "wasm");
        assert_eq!(resolve("", &["model.wasm"]).unwrap(), "wasm");
        assert_eq!(resolve("backend: \"identity\"", &[]).unwrap(), "identity");
        // Triton Python models run on the Python runner: by name, or by their model.py.
        assert_eq!(resolve("backend: \"python\"", &[]).unwrap(), "python");
        assert_eq!(resolve("", &["model.py"]).unwrap(), "python");
        let e = resolve("backend: \"tensorflow\"", &[]).unwrap_err();
        assert_eq!(e.code, tern_core::Code::Unsupported);
        assert!(
            e.message
                .contains("is a Triton backend that Tern does not provide")
                && e.message.contains("tf2onnx"),
            "{e}"
        );
        #[cfg(not(feature = "torch"))]
        {
            let e = resolve("platform: \"pytorch_libtorch\"", &[]).unwrap_err();
            assert_eq!(e.code, tern_core::Code::Unsupported);
            assert!(
                e.message
                    .contains("this build has no LibTorch (built without the 'torch' feature)")
                    && e.message.contains("make torch")
                    && e.message.contains("torch.onnx.export"),
                "{e}"
            );
            let e = resolve("", &["model.pt"]).unwrap_err();
            assert!(e.message.contains("no LibTorch"), "{e}");
        }
        let e = resolve("platform: \"tensorrt_plan\"", &[]).unwrap_err();
        assert!(e.message.contains("TensorRT execution accelerator"), "{e}");
        let e = resolve("platform: \"nope\"", &[]).unwrap_err();
        assert_eq!(e.message, "model 'm': unknown platform 'nope'");
        let e = resolve("", &["weights.bin"]).unwrap_err();
        assert!(e.message.contains("'model.wasm'"), "{e}");
    }

    #[cfg(feature = "onnx")]
    #[test]
    fn onnx_models_resolve_to_onnx_runtime() {
        assert_eq!(
            resolve("platform: \"onnxruntime_onnx\"", &[]).unwrap(),
            "onnxruntime"
        );
        assert_eq!(resolve("", &["model.onnx"]).unwrap(), "onnxruntime");
    }

    #[cfg(not(feature = "onnx"))]
    #[test]
    fn a_build_without_onnx_runtime_says_so_for_onnx_models() {
        for (config, files) in [
            ("backend: \"onnxruntime\"", &[][..]),
            ("platform: \"onnxruntime_onnx\"", &[][..]),
            ("", &["model.onnx"][..]),
        ] {
            let e = resolve(config, files).unwrap_err();
            assert_eq!(e.code, tern_core::Code::Unsupported, "{e}");
            assert!(
                e.message
                    .contains("this build has no ONNX Runtime (built without the 'onnx' feature)"),
                "{e}"
            );
        }
    }
}
