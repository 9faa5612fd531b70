//! The `python` backend: Triton Python-backend models (`backend: "python"`,
//! `<version>/model.py`) served as they are, with no build step, by one
//! prebuilt component, the Python runner (`guest-sdk/python/runner`). The
//! runner imports the model file at `initialize` from the version folder,
//! which the sandbox pre-opens read-only as for every plugin, so a Python
//! model is a plugin whose component is the runner: the same sandbox,
//! limits, metrics and `.cwasm` cache (the runner is compiled once for all
//! Python models). As in Triton there is no execution deadline unless the
//! model sets `execution_timeout_ms`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{loaded, WasmModel};
use crate::tern::plugin::types as wit;
use crate::PluginTelemetry;
use tern_core::backend::{
    model_file, Backend, BackendSettings, LoadContext, Model, ModelFiles, Progress,
};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};

/// The runner's file name, beside the binary or in `../lib/tern` from it.
pub const RUNNER_FILE: &str = "python-runner.wasm";

/// Triton's Python backend has no execution deadline: a year stands for none.
const NO_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest `auto_complete_config` may run (less when the model's
/// `execution_timeout_ms` is less): it runs while the repository reads
/// configs, holding model control, so unlike `initialize` (bounded by
/// `--model-load-timeout-secs`) it must end soon.
const AUTO_COMPLETE_DEADLINE: Duration = Duration::from_secs(30);

/// The `python` backend; its models count into the plugins' telemetry.
pub struct PythonBackend {
    telemetry: Arc<PluginTelemetry>,
    /// `auto_complete_config` failures by model name: every load of the
    /// model's versions fails with it (retries too), as in Triton, where
    /// auto-complete runs while the backend initialises the model, so the
    /// versions show the failure. The model's next config read replaces it.
    auto_complete_failures: Mutex<HashMap<String, Error>>,
    /// The runner the last successful `auto_complete_config` ran in, held
    /// until that model's load has the runner too, so the compiled runner is
    /// shared, not read again. One at most: a newer one replaces it.
    held_runner: Mutex<Option<(String, Box<WasmModel>)>>,
}

impl PythonBackend {
    /// A backend counting into `telemetry`.
    pub fn new(telemetry: Arc<PluginTelemetry>) -> Self {
        PythonBackend {
            telemetry,
            auto_complete_failures: Mutex::default(),
            held_runner: Mutex::default(),
        }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, Error>> {
        self.auto_complete_failures
            .lock()
            .expect("auto-complete failures lock poisoned: nothing panics while holding it")
    }

    fn held_runner(&self) -> std::sync::MutexGuard<'_, Option<(String, Box<WasmModel>)>> {
        self.held_runner
            .lock()
            .expect("held runner lock poisoned: nothing panics while holding it")
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
    // Beside the binary, `../lib/tern` from it (tarball and .deb), and the
    // .deb's and image's fixed place (for when /proc, which names the
    // binary, is not mounted).
    let exe = std::env::current_exe().ok();
    let mut candidates: Vec<PathBuf> = exe
        .as_deref()
        .and_then(Path::parent)
        .map(|dir| {
            vec![
                dir.join(RUNNER_FILE),
                dir.join("../lib/tern").join(RUNNER_FILE),
            ]
        })
        .unwrap_or_default();
    candidates.push(Path::new("/usr/lib/tern").join(RUNNER_FILE));
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            Error::unavailable(format!(
                "backend \"python\" needs the Python runner ({RUNNER_FILE}), which is not installed \
                 (looked in {}): install the tern-python-runner package, unpack the \
                 tern-python-runner tarball into Tern's folder, use the -python image, or build \
                 it with `make python-runner`; --python-runner names another place",
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
        files: &ModelFiles,
        cfg: &mut ModelConfig,
        settings: &BackendSettings,
    ) -> Result<()> {
        self.failures().remove(&cfg.name);
        if let Some(version_dir) = files.version_dir.as_deref() {
            if names_auto_complete(version_dir, &cfg.default_model_filename) {
                // On failure the versions' loads fail with it, the config as it is.
                match self.run_auto_complete(version_dir, cfg, settings) {
                    Ok(runner) => *self.held_runner() = Some((cfg.name.clone(), Box::new(runner))),
                    Err(e) => {
                        self.failures().insert(cfg.name.clone(), e);
                    }
                }
            }
        }
        Ok(())
    }

    fn load(&self, ctx: &LoadContext) -> Result<Arc<dyn Model>> {
        // The model file must be there (Triton's error when it is not).
        model_file(ctx.config, ctx.version_dir, "model.py")?;
        if ctx.gate.sealed() {
            return Err(Error::unsupported(
                "the 'decrypt' repository agent cannot serve a Python model: its runner reads \
                 model.py and the files beside it from the model folder, where they are \
                 encrypted; decrypt serves ONNX models and WebAssembly plugins",
            )
            .for_model(&ctx.config.name));
        }
        if let Some(e) = self.failures().get(&ctx.config.name) {
            return Err(e.clone());
        }
        let _held_runner = {
            let mut held = self.held_runner();
            match held.as_ref() {
                Some((name, _)) if *name == ctx.config.name => held.take(),
                _ => None,
            }
        };
        let runner = runner_path(ctx.settings).map_err(|e| e.for_model(&ctx.config.name))?;
        let bytes = read_runner(&runner)?;
        let model =
            WasmModel::load_component(ctx, &self.telemetry, &runner, &bytes, true, NO_DEADLINE)?;
        Ok(loaded(model))
    }
}

impl PythonBackend {
    /// Runs the model's `auto_complete_config` in a fresh runner instance (as
    /// Triton's auto-complete stub does), takes the config it returns and
    /// returns the runner.
    fn run_auto_complete(
        &self,
        version_dir: &Path,
        cfg: &mut ModelConfig,
        settings: &BackendSettings,
    ) -> Result<WasmModel> {
        let version = version_dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<i64>().ok())
            .unwrap_or(1);
        let runner = runner_path(settings).map_err(|e| e.for_model(&cfg.name))?;
        let progress = Progress::default();
        let ctx = LoadContext {
            config: cfg,
            version,
            version_dir,
            settings,
            models: tern_core::router::unrouted(),
            progress: &progress,
            gate: &tern_core::backend::plain_files(),
        };
        let bytes = read_runner(&runner)?;
        let model = WasmModel::load_component(
            &ctx,
            &self.telemetry,
            &runner,
            &bytes,
            true,
            AUTO_COMPLETE_DEADLINE,
        )?;
        let text = |key: &str, value: String| wit::Parameter {
            key: key.into(),
            value: wit::ParameterValue::String(value),
        };
        let request = wit::Request {
            id: String::new(),
            inputs: Vec::new(),
            requested_outputs: Vec::new(),
            parameters: vec![
                text(
                    AUTO_COMPLETE,
                    tern_core::config::json::to_json(cfg).to_string(),
                ),
                text("tern.model_repository", format!("/models/{}", cfg.name)),
                text("tern.model_version", version.to_string()),
            ],
            correlation_id: wit::CorrelationId::None,
            flags: 0,
        };
        let completed = model.auto_complete_config(request, AUTO_COMPLETE_DEADLINE)?;
        let mut completed = tern_core::config::json::from_json(&completed).map_err(|e| {
            e.context(format!(
                "model '{}': the config auto_complete_config returned",
                cfg.name
            ))
        })?;
        completed.name = cfg.name.clone();
        *cfg = completed;
        Ok(model)
    }
}

/// The runner's request parameter that asks for `auto_complete_config`.
const AUTO_COMPLETE: &str = "tern.auto_complete_config";

/// Whether a Python file of the version folder (the model file, under its
/// configured name too) names `auto_complete_config` (the model class or a
/// base class beside it defines it): only then is an instance started to
/// run it, so other models load as fast as before.
fn names_auto_complete(version_dir: &Path, model_filename: &str) -> bool {
    let mut files = walkdir_py(version_dir, 3);
    if !model_filename.is_empty() {
        files.push(version_dir.join(model_filename));
    }
    files.iter().any(|path| {
        // Regular files only (links followed): never open a FIFO.
        std::fs::metadata(path).is_ok_and(|m| m.is_file())
            && std::fs::read(path)
                .map(|text| text.windows(20).any(|w| w == b"auto_complete_config"))
                .unwrap_or(false)
    })
}

/// The `.py` files under `dir` (links followed), at most `depth` folders
/// deep (a bounded walk: at most 1,000 entries are looked at).
fn walkdir_py(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((folder, level)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 1000 {
                return found;
            }
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.is_dir() && level < depth {
                stack.push((path, level + 1));
            } else if meta.is_file() && path.extension().is_some_and(|e| e == "py") {
                found.push(path);
            }
        }
    }
    found
}

/// The Python runner's component (it is the server's, not the model's: read as it is).
fn read_runner(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))
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

    #[test]
    fn only_models_naming_auto_complete_config_run_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("model.py"),
            "class TritonPythonModel: pass\n",
        )
        .unwrap();
        assert!(!names_auto_complete(dir.path(), ""));
        std::fs::create_dir(dir.path().join("helpers")).unwrap();
        std::fs::write(
            dir.path().join("helpers/base.py"),
            "class Base:\n    @staticmethod\n    def auto_complete_config(c):\n        return c\n",
        )
        .unwrap();
        assert!(names_auto_complete(dir.path(), ""));
        // Not Python: not looked at, unless it is the configured model file.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("notes.txt"), "auto_complete_config").unwrap();
        assert!(!names_auto_complete(other.path(), ""));
        assert!(names_auto_complete(other.path(), "notes.txt"));
        // A linked model file is followed.
        let linked = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("helpers/base.py"),
            linked.path().join("model.py"),
        )
        .unwrap();
        assert!(names_auto_complete(linked.path(), ""));
    }
}
