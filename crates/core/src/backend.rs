//! The backend interface: the traits every model implementation follows
//! ([`Backend`] → [`Model`] → [`Instance`]), what a backend is given to load
//! a version, and helpers for reading model parameters. Implementations live
//! in their own crates (`tern-onnx`, `tern-wasm`) or in the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::request::{InferRequest, InferResponse};
use crate::router::ModelRouter;

/// Backend-wide settings from the command line.
#[derive(Debug, Clone)]
pub struct BackendSettings {
    /// Path of `libonnxruntime.so`; `None` = `ORT_DYLIB_PATH` or the default lookup.
    pub onnxruntime_library: Option<PathBuf>,
    /// `--backend-config=default-max-batch-size=N` (Triton's default is 4).
    pub default_max_batch_size: i32,
    /// `--wasm-cache-dir`: where compiled plugins are cached (`None` = no cache).
    pub wasm_cache_dir: Option<PathBuf>,
    /// `--wasm-cache-max-size`: the most bytes the cache folder's entries
    /// may take before the least recently used are removed.
    pub wasm_cache_max_bytes: u64,
    /// `--python-runner`: the prebuilt component that serves `backend:
    /// "python"` models (`None` = look beside the binary).
    pub python_runner: Option<PathBuf>,
}

/// The default `--wasm-cache-max-size`: room for dozens of compiled Python
/// plugins (~35 MB each), a small part of a device's storage.
pub const DEFAULT_WASM_CACHE_MAX_BYTES: u64 = 2 << 30;

impl Default for BackendSettings {
    fn default() -> Self {
        Self {
            onnxruntime_library: None,
            default_max_batch_size: 0,
            wasm_cache_dir: None,
            wasm_cache_max_bytes: DEFAULT_WASM_CACHE_MAX_BYTES,
            python_runner: None,
        }
    }
}

/// Where a model's files are.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// `<repository>/<model>`.
    pub model_dir: PathBuf,
    /// `<repository>/<model>/<version>` of the version used for auto-complete.
    pub version_dir: Option<PathBuf>,
    /// How the model's files are read (through its repository agents).
    pub gate: Arc<dyn FileGate>,
}

/// How a backend reads a model's files: through the repository's agents
/// (signature check, decryption), so that what a backend loads is exactly
/// the bytes they verified. Backends that load a model file from bytes call
/// [`FileGate::read`]; one that can only open files by path refuses a model
/// whose gate is [`sealed`](FileGate::sealed).
pub trait FileGate: Send + Sync + std::fmt::Debug {
    /// The contents of `path` (a file in the model folder) as the model is:
    /// checked against its signed manifest, decrypted.
    fn read(&self, path: &Path) -> Result<Vec<u8>>;
    /// Whether the files on disk are not the model itself (encrypted): a
    /// backend may not open them by path nor write anything made from them
    /// (a compiled plugin) to disk.
    fn sealed(&self) -> bool;
    /// Whether reading goes through an agent at all (`false`: the backend
    /// may open the files by path as it always did).
    fn checked(&self) -> bool;
}

/// The gate of a model without agents: files are read as they are.
#[derive(Debug, Default)]
pub struct PlainFiles;

impl FileGate for PlainFiles {
    fn read(&self, path: &Path) -> Result<Vec<u8>> {
        std::fs::read(path)
            .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))
    }
    fn sealed(&self) -> bool {
        false
    }
    fn checked(&self) -> bool {
        false
    }
}

/// The shared [`PlainFiles`] gate.
pub fn plain_files() -> Arc<dyn FileGate> {
    Arc::new(PlainFiles)
}

/// What a load is doing now, shared by the loader and the model index, which
/// gives it as the reason a loading model is not ready (`loading: compiling
/// the plugin, 12 s`).
#[derive(Debug, Clone)]
pub struct Progress {
    stage: Arc<std::sync::Mutex<String>>,
    since: std::time::Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            stage: Arc::new(std::sync::Mutex::new("starting".into())),
            since: std::time::Instant::now(),
        }
    }
}

impl Progress {
    /// Names what the load does from now on ("compiling the plugin").
    pub fn set(&self, stage: impl Into<String>) {
        *self.stage.lock().unwrap_or_else(|p| p.into_inner()) = stage.into();
    }

    /// `loading: <stage>, <seconds since the load began> s`.
    pub fn describe(&self) -> String {
        let stage = self.stage.lock().unwrap_or_else(|p| p.into_inner());
        format!("loading: {stage}, {} s", self.since.elapsed().as_secs())
    }
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
    pub models: std::sync::Weak<dyn ModelRouter>,
    /// Where to say what the load is doing (the index shows it).
    pub progress: &'a Progress,
    /// How the version's files are read (through the model's agents).
    pub gate: &'a Arc<dyn FileGate>,
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
    /// Whether it can serve a decoupled model: answer each request through its
    /// [`Responder`](crate::Responder) (any number of responses, then the final flag).
    fn supports_decoupled(&self) -> bool {
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

/// One execution instance, served by its own OS thread.
pub trait Instance: Send {
    /// Executes a batch of requests, returning exactly one result per request, in order.
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>>;

    /// Whether `execute` may run on any thread, not only the instance's own:
    /// no thread-bound runtime state (a CUDA context, LibTorch's per-thread
    /// settings, a plugin's blocking calls). The scheduler may then run a
    /// short request inline on the async worker that received it.
    fn runs_on_any_thread(&self) -> bool {
        false
    }

    /// Called before each execution, outside its timing: waits until the
    /// instance may run (the rate limiter's resources) and returns what
    /// gives them back when dropped. `None`: nothing to wait for.
    fn admit(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        None
    }
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

/// Runs a batch without the requests `check` refuses (strings a runtime
/// cannot take, say): each of those fails alone with its error, the others
/// run together through `run`, and the answers come back in batch order.
/// `None` when `check` refuses none (the caller runs the batch as it is).
pub fn without_refused(
    batch: &[InferRequest],
    check: impl Fn(&InferRequest) -> Result<()>,
    run: impl FnOnce(&[InferRequest]) -> Vec<Result<InferResponse>>,
) -> Option<Vec<Result<InferResponse>>> {
    let checks: Vec<Result<()>> = batch.iter().map(check).collect();
    if checks.iter().all(|c| c.is_ok()) {
        return None;
    }
    let good: Vec<InferRequest> = batch
        .iter()
        .zip(&checks)
        .filter(|(_, c)| c.is_ok())
        .map(|(r, _)| r.clone())
        .collect();
    let mut ran = if good.is_empty() {
        Vec::new()
    } else {
        run(&good)
    }
    .into_iter();
    Some(
        checks
            .into_iter()
            .map(|c| match c {
                Err(e) => Err(e),
                Ok(()) => ran
                    .next()
                    .unwrap_or_else(|| Err(Error::internal("a batch returned too few responses"))),
            })
            .collect(),
    )
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
            Error::invalid_arg(format!("parameter '{key}' must be a number, got '{v}'"))
                .for_model(&cfg.name)
        }),
    }
}

/// Reads a boolean model parameter as Triton's backends do (`true`/`on`/`1`,
/// `false`/`off`/`0`, any case), with a clear error for anything else.
pub fn bool_parameter(cfg: &ModelConfig, key: &str) -> Result<Option<bool>> {
    let is = |v: &str, words: [&str; 3]| words.iter().any(|w| v.eq_ignore_ascii_case(w));
    match model_parameter(cfg, key).map(str::trim) {
        None => Ok(None),
        Some(v) if is(v, ["true", "on", "1"]) => Ok(Some(true)),
        Some(v) if is(v, ["false", "off", "0"]) => Ok(Some(false)),
        Some(v) => Err(Error::invalid_arg(format!(
            "parameter '{key}': failed to convert '{v}' to boolean \
             (true/on/1 or false/off/0)"
        ))
        .for_model(&cfg.name)),
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
        return Err(
            Error::not_found(format!("model file '{}' does not exist", path.display()))
                .for_model(&cfg.name),
        );
    }
    // A named pipe or a device would block the load that opens it.
    crate::files::check_regular(&path, &format!("model '{}': model file", cfg.name))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_names_the_stage_and_the_time_since_the_load_began() {
        let p = Progress::default();
        assert_eq!(p.describe(), "loading: starting, 0 s");
        p.clone().set("compiling the plugin");
        assert_eq!(p.describe(), "loading: compiling the plugin, 0 s");
    }

    #[test]
    fn refused_requests_fail_alone_and_the_rest_run_in_order() {
        let req = |id: &str| InferRequest {
            id: id.into(),
            ..Default::default()
        };
        let batch = [req("a"), req("bad"), req("c")];
        let check = |r: &InferRequest| {
            if r.id == "bad" {
                Err(Error::invalid_arg("bad strings"))
            } else {
                Ok(())
            }
        };
        let out = without_refused(&batch, check, |good| {
            assert_eq!(good.len(), 2);
            good.iter()
                .map(|r| {
                    Ok(InferResponse {
                        id: r.id.clone(),
                        ..Default::default()
                    })
                })
                .collect()
        })
        .unwrap();
        let ids: Vec<String> = out
            .iter()
            .map(|r| match r {
                Ok(r) => r.id.clone(),
                Err(e) => e.message.clone(),
            })
            .collect();
        assert_eq!(ids, ["a", "bad strings", "c"]);
        assert!(without_refused(&batch, |_| Ok(()), |_| unreachable!()).is_none());
    }

    #[test]
    fn bool_parameters_parse_or_name_the_problem() {
        let cfg = crate::config::parse_pbtxt(
            r#"name: "m" parameters [
                 { key: "a" value { string_value: "TRUE" } },
                 { key: "b" value { string_value: " 0 " } },
                 { key: "c" value { string_value: "Yes" } },
                 { key: "d" value { string_value: "On" } },
                 { key: "e" value { string_value: "off" } }
               ]"#,
        )
        .unwrap();
        assert_eq!(bool_parameter(&cfg, "a").unwrap(), Some(true));
        assert_eq!(bool_parameter(&cfg, "b").unwrap(), Some(false));
        assert_eq!(bool_parameter(&cfg, "d").unwrap(), Some(true));
        assert_eq!(bool_parameter(&cfg, "e").unwrap(), Some(false));
        assert_eq!(bool_parameter(&cfg, "missing").unwrap(), None);
        let e = bool_parameter(&cfg, "c").unwrap_err();
        assert_eq!(
            e.message,
            "model 'm': parameter 'c': failed to convert 'Yes' to boolean (true/on/1 or false/off/0)"
        );
    }
}
