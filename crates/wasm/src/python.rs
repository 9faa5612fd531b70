//! The `python` backend: Triton Python-backend models (`backend: "python"`,
//! `<version>/model.py`) served as they are, with no build step, by one
//! prebuilt component, the Python runner (`guest-sdk/python/runner`). The
//! runner imports the model file at `initialize` from the version folder,
//! which the sandbox pre-opens read-only as for every plugin, so a Python
//! model is a plugin whose component is the runner: the same sandbox,
//! limits, metrics and `.cwasm` cache (the runner is compiled once for all
//! Python models). As in Triton there is no execution deadline unless the
//! model sets `execution_timeout_ms`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{loaded, WasmModel};
use crate::PluginTelemetry;
use tern_core::backend::{model_file, Backend, BackendSettings, LoadContext, Model, ModelFiles};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};

/// The runner's file name, beside the binary or in `../lib/tern` from it.
pub const RUNNER_FILE: &str = "python-runner.wasm";

/// Triton's Python backend has no execution deadline: a year stands for none.
const NO_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The `python` backend; its models count into the plugins' telemetry.
pub struct PythonBackend {
    telemetry: Arc<PluginTelemetry>,
}

impl PythonBackend {
    /// A backend counting into `telemetry`.
    pub fn new(telemetry: Arc<PluginTelemetry>) -> Self {
        PythonBackend { telemetry }
    }
}

/// Where the runner is: `--python-runner`, else beside the binary, else in
/// `../lib/tern` from it (the tarball and .deb layout).
pub fn runner_path(settings: &BackendSettings) -> Result<PathBuf> {
    if let Some(p) = &settings.python_runner {
        if p.is_file() {
            return Ok(p.clone());
        }
        return Err(Error::unavailable(format!(
            "the Python runner '{}' (--python-runner) does not exist",
            p.display()
        )));
    }
    let exe = std::env::current_exe().ok();
    let candidates = exe
        .as_deref()
        .and_then(Path::parent)
        .map(|dir| {
            vec![
                dir.join(RUNNER_FILE),
                dir.join("../lib/tern").join(RUNNER_FILE),
            ]
        })
        .unwrap_or_default();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            Error::unavailable(format!(
            "backend \"python\" needs the Python runner ({RUNNER_FILE}), which is not installed \
             (looked in {}); build it with `make python-runner` or give --python-runner",
            looked.join(", ")
        ))
        })
}

impl Backend for PythonBackend {
    fn name(&self) -> &'static str {
        "python"
    }

    fn platform(&self) -> &'static str {
        ""
    }

    fn default_filename(&self) -> Option<&'static str> {
        Some("model.py")
    }

    fn auto_complete(
        &self,
        _: &ModelFiles,
        cfg: &mut ModelConfig,
        _: &BackendSettings,
    ) -> Result<()> {
        if cfg.input.is_empty() || cfg.output.is_empty() {
            return Err(Error::unsupported(
                "a Python model's config.pbtxt must declare its inputs and outputs: \
                 auto_complete_config in model.py is not run by this version of Tern",
            )
            .for_model(&cfg.name));
        }
        Ok(())
    }

    fn load(&self, ctx: &LoadContext) -> Result<Arc<dyn Model>> {
        // The model file must be there (Triton's error when it is not).
        model_file(ctx.config, ctx.version_dir, "model.py")?;
        let runner = runner_path(ctx.settings).map_err(|e| e.for_model(&ctx.config.name))?;
        let model = WasmModel::load_component(ctx, &self.telemetry, &runner, NO_DEADLINE)?;
        Ok(loaded(model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_runner_is_a_clear_error() {
        let settings = BackendSettings {
            python_runner: Some(PathBuf::from("/nonexistent/python-runner.wasm")),
            ..Default::default()
        };
        let e = runner_path(&settings).unwrap_err();
        assert!(e.message.contains("--python-runner"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(RUNNER_FILE);
        std::fs::write(&file, b"x").unwrap();
        let settings = BackendSettings {
            python_runner: Some(file.clone()),
            ..Default::default()
        };
        assert_eq!(runner_path(&settings).unwrap(), file);
    }
}
