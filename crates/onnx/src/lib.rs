//! ONNX Runtime backend (`backend: "onnxruntime"`, `platform:
//! "onnxruntime_onnx"`, default file `model.onnx`) through the `ort` crate
//! with the library loaded at run time: the binary runs, and reports a clear
//! load error, on machines without `libonnxruntime`.
//!
//! One ORT session per instance. Model parameters: `intra_op_thread_count`,
//! `inter_op_thread_count` (as in Triton), `allow_spinning` (default: ONNX
//! Runtime's, on, as in Triton); `optimization { graph { level } }` as in Triton.

pub mod device;
mod external;
pub mod io;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ort::session::builder::GraphOptimizationLevel;
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::ValueType;

use crate::io::from_ort_type;
use tern_core::backend::{
    bool_parameter, model_file, model_parameter, numeric_parameter, without_refused, Backend,
    BackendSettings, DeviceKind, ExecTiming, FileGate, Instance, InstanceSpec, LoadContext, Model,
    ModelFiles,
};
use tern_core::config::pb;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::{DataType, InferRequest, InferResponse, Tensor};

/// The ONNX Runtime backend.
pub struct OnnxBackend;

const DEFAULT_FILE: &str = "model.onnx";

/// Candidate library paths: the configured one, `ORT_DYLIB_PATH`, next to
/// the executable, where the packages install it (`<prefix>/lib/tern/` for
/// `<prefix>/bin/tern`, `lib/` beside `bin/` in a tarball), then the system
/// loader.
fn library_candidates(settings: &BackendSettings) -> Vec<PathBuf> {
    if let Some(p) = &settings.onnxruntime_library {
        return vec![p.clone()];
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return vec![PathBuf::from(p)];
    }
    let mut out = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|p| p.to_path_buf()))
    {
        out.push(dir.join(LIBRARY));
        out.push(dir.join("../lib/tern").join(LIBRARY));
        out.push(dir.join("../lib").join(LIBRARY));
    }
    out.push(PathBuf::from(LIBRARY));
    out
}

const LIBRARY: &str = "libonnxruntime.so";

/// The oldest ONNX Runtime Tern runs with: the API level its `ort` build
/// asks for (`api-17`), low enough for the versions JetPack 5's CUDA 11.4
/// gets GPU builds of (Jetson Zoo's are 1.17 and 1.18). Tern uses nothing a
/// later version added, so every version from this one on serves the same
/// features (docs/PERFORMANCE.md, "ONNX Runtime API level 17", for what the
/// level costs per call).
pub const OLDEST_VERSION: (u32, u32) = (1, 17);

/// The loaded ONNX Runtime: its environment and the library it came from.
struct Loaded {
    env: ort::environment::Environment,
    path: PathBuf,
    version: String,
}

/// The version of the ONNX Runtime library at `path`
/// (`OrtGetApiBase()->GetVersionString()`), refused when older than
/// [`OLDEST_VERSION`], with the library kept open: `ort` opening the same
/// path while it is gets the same handle, not a second load.
fn library_version(path: &Path) -> std::result::Result<(String, libloading::Library), String> {
    // SAFETY: loading ONNX Runtime runs its initialisers, as `ort` would.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    let version = {
        // SAFETY: `OrtGetApiBase` has this signature in every ONNX Runtime release.
        let get_base = unsafe {
            lib.get::<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase>(b"OrtGetApiBase")
        }
        .map_err(|_| "it does not export OrtGetApiBase: not an ONNX Runtime library".to_string())?;
        // SAFETY: the function takes nothing and returns a static table (or null).
        let base = unsafe { get_base() };
        if base.is_null() {
            return Err("OrtGetApiBase returned nothing".into());
        }
        // SAFETY: `base` points to ONNX Runtime's static API base; the string it returns is static.
        unsafe { std::ffi::CStr::from_ptr(((*base).GetVersionString)()) }
            .to_string_lossy()
            .into_owned()
    };
    check_version(&version).map(|()| (version, lib))
}

/// Whether Tern runs with ONNX Runtime `version` (`1.17.3`).
fn check_version(version: &str) -> std::result::Result<(), String> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) else {
        return Err(format!("it reports an unreadable version '{version}'"));
    };
    if major != OLDEST_VERSION.0 {
        return Err(format!(
            "ONNX Runtime {version} is not a {}.x release, which Tern's C API level needs",
            OLDEST_VERSION.0
        ));
    }
    if minor < OLDEST_VERSION.1 {
        return Err(format!(
            "ONNX Runtime {version} is older than {}.{}, the oldest Tern runs with \
             (docs/deployment.md, \"ONNX Runtime versions\")",
            OLDEST_VERSION.0, OLDEST_VERSION.1
        ));
    }
    Ok(())
}

/// The process-wide ORT environment, created on first use. A missing or
/// broken library is remembered as an error and reported at every model load.
fn loaded(settings: &BackendSettings) -> std::result::Result<&'static Loaded, &'static str> {
    static LOADED: OnceLock<std::result::Result<Loaded, String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let mut errors = Vec::new();
        for path in library_candidates(settings) {
            // ort resolves a relative path against the executable's folder and
            // panics where that is unknown (no /proc, as in a bare chroot): give
            // it absolute paths, and the bare name only where the lookup works.
            let path = if path.components().count() > 1 {
                std::path::absolute(&path).unwrap_or(path)
            } else {
                path
            };
            if path.is_absolute() && !path.exists() {
                errors.push(format!("{}: no such file", path.display()));
                continue;
            }
            if !path.is_absolute() && std::env::current_exe().is_err() {
                errors.push(format!(
                    "{}: the system loader lookup needs /proc/self/exe, which is unavailable",
                    path.display()
                ));
                continue;
            }
            let (version, _open) = match library_version(&path) {
                Ok(v) => v,
                Err(why) => {
                    errors.push(format!("{}: {why}", path.display()));
                    continue;
                }
            };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ort::init_from(&path))) {
                Ok(Ok(builder)) => {
                    let env = builder
                        .with_name("tern")
                        .build()
                        .map_err(|e| format!("creating the ONNX Runtime environment: {e}"))?;
                    let path = path.canonicalize().unwrap_or(path);
                    tracing::info!("ONNX Runtime {version} loaded from '{}'", path.display());
                    return Ok(Loaded { env, path, version });
                }
                Ok(Err(e)) => errors.push(format!("{}: {e}", path.display())),
                Err(_) => errors.push(format!("{}: loading it panicked", path.display())),
            }
        }
        Err(format!(
            "the ONNX Runtime library could not be loaded ({}). Install it with `make setup` (it comes from the \
             `onnxruntime` PyPI wheel), or point ORT_DYLIB_PATH / --onnxruntime-library at libonnxruntime.so",
            errors.join("; ")
        ))
    });
    loaded.as_ref().map_err(String::as_str)
}

fn environment(settings: &BackendSettings) -> Result<&'static ort::environment::Environment> {
    loaded(settings).map(|l| &l.env).map_err(Error::unavailable)
}

/// The ONNX Runtime library this process uses (loading it if needed), its
/// version and ORT's build information, or why none could be loaded.
pub fn library_status(
    settings: &BackendSettings,
) -> std::result::Result<(PathBuf, String, String), String> {
    let l = loaded(settings).map_err(str::to_string)?;
    Ok((l.path.clone(), l.version.clone(), ort::info().to_string()))
}

/// (name, data type, shape with -1 for dynamic dims) of a session input or output.
fn describe(outlet: &ort::value::Outlet, model: &str) -> Result<(String, DataType, Vec<i64>)> {
    match outlet.dtype() {
        ValueType::Tensor { ty, shape, .. } => {
            let dt = from_ort_type(*ty).ok_or_else(|| {
                Error::unsupported(format!(
                    "tensor '{}' has ONNX type {ty:?}, which Tern does not support",
                    outlet.name()
                ))
                .for_model(model)
            })?;
            Ok((
                outlet.name().to_string(),
                dt,
                shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect(),
            ))
        }
        other => Err(Error::unsupported(format!(
            "'{}' is a {other:?}; only tensor inputs and outputs are supported",
            outlet.name()
        ))
        .for_model(model)),
    }
}

/// Turns ONNX Runtime's CPU memory arena on or off (Triton's `enable_mem_arena`); the
/// `ort` crate has no builder method for it.
fn set_cpu_mem_arena(
    mut builder: ort::session::builder::SessionBuilder,
    enable: bool,
) -> std::result::Result<ort::session::builder::SessionBuilder, ort::Error> {
    use ort::AsPointer as _;
    let api = ort::api();
    let ptr = builder.ptr_mut();
    // SAFETY: `ptr` is the builder's live `OrtSessionOptions`; the call only sets a flag on it.
    let status = unsafe {
        if enable {
            (api.EnableCpuMemArena)(ptr)
        } else {
            (api.DisableCpuMemArena)(ptr)
        }
    };
    // SAFETY: `status` was just returned by ONNX Runtime and is consumed once here.
    unsafe { ort::Error::result_from_status(status) }.map(|()| builder)
}

/// Triton's `memory.enable_memory_arena_shrinkage` parameter, checked against
/// the instance's device and arena.
const ARENA_SHRINKAGE: &str = "memory.enable_memory_arena_shrinkage";

/// The run options of an instance on `device`: with `memory.enable_memory_arena_shrinkage`
/// (`cpu:0`, `gpu:<id>`, `;`-separated) ONNX Runtime gives the named arenas' free blocks
/// back after every run, as in Triton. A value ONNX Runtime would refuse at every run (a
/// device the instance does not use, the CPU arena turned off) fails the load instead.
fn run_options(cfg: &ModelConfig, device: DeviceKind) -> Result<Option<RunOptions>> {
    let Some(value) = model_parameter(cfg, ARENA_SHRINKAGE) else {
        return Ok(None);
    };
    let bad = |why: String| {
        Error::invalid_arg(format!(
            "parameter '{ARENA_SHRINKAGE}' {why}, got '{value}'"
        ))
        .for_model(&cfg.name)
    };
    let arena_off = bool_parameter(cfg, "enable_mem_arena")? == Some(false);
    for entry in value.split(';').map(str::trim) {
        let (kind, id) = entry.split_once(':').unwrap_or((entry, ""));
        let id: i64 = id
            .parse()
            .map_err(|_| bad("must list cpu:0 or gpu:<id> entries separated by ';'".into()))?;
        match (kind, device) {
            ("cpu", _) if id != 0 => {
                return Err(bad(format!("names cpu:{id}; the CPU arena is cpu:0")))
            }
            ("cpu", _) if arena_off => {
                return Err(bad(
                    "names the CPU arena, which enable_mem_arena turns off".into()
                ))
            }
            ("cpu", _) => {}
            ("gpu", DeviceKind::Gpu(g)) if i64::from(g) == id => {}
            ("gpu", _) => {
                return Err(bad(format!(
                    "names gpu:{id}, which this model's {} instances do not run on",
                    match device {
                        DeviceKind::Gpu(g) => format!("GPU {g}"),
                        DeviceKind::Cpu => "CPU".into(),
                    }
                )))
            }
            _ => {
                return Err(bad(
                    "must list cpu:0 or gpu:<id> entries separated by ';'".into()
                ))
            }
        }
    }
    let mut options = RunOptions::new()
        .map_err(|e| Error::internal(format!("run options: {e}")).for_model(&cfg.name))?;
    options
        .set(ARENA_SHRINKAGE, value.trim())
        .map_err(|e| Error::internal(format!("{ARENA_SHRINKAGE}: {e}")).for_model(&cfg.name))?;
    Ok(Some(options))
}

fn open_session(
    cfg: &ModelConfig,
    path: &std::path::Path,
    settings: &BackendSettings,
    device: DeviceKind,
    gate: &Arc<dyn FileGate>,
) -> Result<Session> {
    let env = environment(settings).map_err(|e| e.context(format!("model '{}'", cfg.name)))?;
    let fail =
        |what: &str, e: ort::Error| Error::internal(format!("{what}: {e}")).for_model(&cfg.name);
    let mut builder = Session::builder(env).map_err(|e| fail("creating a session", e))?;
    if let Some(n) = numeric_parameter::<usize>(cfg, "intra_op_thread_count")? {
        builder = builder
            .with_intra_threads(n)
            .map_err(|e| fail("intra_op_thread_count", e.into()))?;
    }
    if let Some(n) = numeric_parameter::<usize>(cfg, "inter_op_thread_count")? {
        builder = builder
            .with_inter_threads(n)
            .map_err(|e| fail("inter_op_thread_count", e.into()))?;
    }
    // ORT's pool threads spin for a moment after each parallel section
    // (then sleep), which is ~25% of a compute-bound model's time on a small
    // CPU (docs/PERFORMANCE.md); Triton keeps ORT's default, and so does Tern.
    // `allow_spinning: "false"` gives the cores back between requests.
    if let Some(spin) = bool_parameter(cfg, "allow_spinning")? {
        builder = builder
            .with_intra_op_spinning(spin)
            .map_err(|e| fail("allow_spinning", e.into()))?
            .with_inter_op_spinning(spin)
            .map_err(|e| fail("allow_spinning", e.into()))?;
    }
    // Triton's `execution_mode`: 0 runs the graph's nodes one after another, 1 runs
    // independent branches in parallel on the inter-op pool.
    if let Some(mode) = numeric_parameter::<i64>(cfg, "execution_mode")? {
        let parallel = match mode {
            0 => false,
            1 => true,
            other => {
                return Err(Error::invalid_arg(format!(
                    "invalid configuration value provided; expected values for \
                     execution_mode are 0 or 1 but got {other}"
                ))
                .for_model(&cfg.name))
            }
        };
        builder = builder
            .with_parallel_execution(parallel)
            .map_err(|e| fail("execution_mode", e.into()))?;
    }
    if let Some(arena) = bool_parameter(cfg, "enable_mem_arena")? {
        builder = set_cpu_mem_arena(builder, arena).map_err(|e| fail("enable_mem_arena", e))?;
    }
    if let Some(pattern) = bool_parameter(cfg, "enable_mem_pattern")? {
        builder = builder
            .with_memory_pattern(pattern)
            .map_err(|e| fail("enable_mem_pattern", e.into()))?;
    }
    let level = cfg
        .optimization
        .as_ref()
        .and_then(|o| o.graph.as_ref())
        .map(|g| g.level)
        .unwrap_or(0);
    let level = match level {
        l if l < 0 => GraphOptimizationLevel::Level1,
        0 => GraphOptimizationLevel::All,
        1 => GraphOptimizationLevel::Level2,
        _ => GraphOptimizationLevel::All,
    };
    builder = builder
        .with_optimization_level(level)
        .map_err(|e| fail("graph optimization level", e.into()))?;
    let providers = device::providers(cfg, device)?;
    if !providers.is_empty() {
        builder = builder.with_execution_providers(providers).map_err(|e| {
            Error::unavailable(format!(
                "execution provider for {}: {e}",
                match device {
                    DeviceKind::Gpu(id) => format!("GPU {id}"),
                    DeviceKind::Cpu => "CPU".into(),
                }
            ))
            .for_model(&cfg.name)
        })?;
    }
    let path = device::model_path(cfg, path, device);
    let path = path.as_path();
    let failed = |e: ort::Error| {
        Error::invalid_arg(format!("failed to load '{}': {e}", path.display())).for_model(&cfg.name)
    };
    if gate.checked() {
        // The bytes the model's agents verified (and decrypted), never the
        // file again: ONNX Runtime copies them, the plaintext stays in memory.
        // External data files are read through the gate too (external.rs).
        let bytes = gate.read(path).map_err(|e| e.for_model(&cfg.name))?;
        builder = external::add_initializers(builder, &bytes, path, gate)
            .map_err(|e| e.for_model(&cfg.name))?;
        builder.commit_from_memory(&bytes).map_err(failed)
    } else {
        builder.commit_from_file(path).map_err(failed)
    }
}

impl Backend for OnnxBackend {
    fn name(&self) -> &'static str {
        "onnxruntime"
    }
    fn platform(&self) -> &'static str {
        "onnxruntime_onnx"
    }
    fn default_filename(&self) -> Option<&'static str> {
        Some(DEFAULT_FILE)
    }

    fn auto_complete(
        &self,
        files: &ModelFiles,
        cfg: &mut ModelConfig,
        settings: &BackendSettings,
    ) -> Result<()> {
        if cfg.backend.is_empty() {
            cfg.backend = self.name().into();
        }
        if cfg.platform.is_empty() {
            cfg.platform = self.platform().into();
        }
        if !cfg.input.is_empty() && !cfg.output.is_empty() {
            return Ok(());
        }
        let Some(dir) = &files.version_dir else {
            return Ok(());
        };
        let session = open_session(
            cfg,
            &model_file(cfg, dir, DEFAULT_FILE)?,
            settings,
            DeviceKind::Cpu,
            &files.gate,
        )?;
        let inputs = session
            .inputs()
            .iter()
            .map(|o| describe(o, &cfg.name))
            .collect::<Result<Vec<_>>>()?;
        let outputs = session
            .outputs()
            .iter()
            .map(|o| describe(o, &cfg.name))
            .collect::<Result<Vec<_>>>()?;
        let batchable = inputs
            .iter()
            .chain(&outputs)
            .all(|(_, _, s)| s.first() == Some(&-1));
        // As Triton's onnxruntime backend (AutoCompleteMaxBatch): a model that can batch
        // gets the default max_batch_size, one that cannot must not ask for batching, and a
        // batching model without a scheduler gets the dynamic batcher.
        if batchable && cfg.max_batch_size == 0 {
            cfg.max_batch_size = settings.default_max_batch_size;
        } else if !batchable && cfg.max_batch_size != 0 {
            return Err(Error::invalid_arg(format!(
                "autofill failed for model '{}': model does not support batching while non-zero max_batch_size is specified",
                cfg.name
            )));
        }
        if cfg.max_batch_size > 1 && cfg.scheduling_choice.is_none() {
            cfg.scheduling_choice = Some(pb::model_config::SchedulingChoice::DynamicBatching(
                Default::default(),
            ));
        }
        let strip = cfg.max_batch_size > 0;
        let to_dims = |shape: &[i64]| -> (Vec<i64>, Option<pb::ModelTensorReshape>) {
            let dims = if strip {
                shape.get(1..).unwrap_or(&[]).to_vec()
            } else {
                shape.to_vec()
            };
            if dims.is_empty() {
                (vec![1], Some(pb::ModelTensorReshape { shape: vec![] }))
            } else {
                (dims, None)
            }
        };
        if cfg.input.is_empty() {
            for (name, dt, shape) in &inputs {
                let (dims, reshape) = to_dims(shape);
                cfg.input.push(pb::ModelInput {
                    name: name.clone(),
                    data_type: dt.to_config() as i32,
                    dims,
                    reshape,
                    ..Default::default()
                });
            }
        }
        if cfg.output.is_empty() {
            for (name, dt, shape) in &outputs {
                let (dims, reshape) = to_dims(shape);
                cfg.output.push(pb::ModelOutput {
                    name: name.clone(),
                    data_type: dt.to_config() as i32,
                    dims,
                    reshape,
                    ..Default::default()
                });
            }
        }
        Ok(())
    }

    fn load(&self, ctx: &LoadContext) -> Result<Arc<dyn Model>> {
        let cfg = ctx.config;
        let path = model_file(cfg, ctx.version_dir, DEFAULT_FILE)?;
        // Open one session now, on the first instance's device, so that a broken file, a missing
        // library or an unusable execution provider fails the load, and check the config against
        // what the model declares.
        let first_device = first_device(cfg);
        ctx.progress.set(format!(
            "version {}: creating an ONNX Runtime session",
            ctx.version
        ));
        run_options(cfg, first_device)?;
        let session = open_session(cfg, &path, ctx.settings, first_device, ctx.gate)?;
        for input in &cfg.input {
            let found = session.inputs().iter().find(|o| o.name() == input.name);
            let Some(outlet) = found else {
                return Err(Error::invalid_arg(format!(
                    "input '{}' is in the config but not in the ONNX model (model inputs: {})",
                    input.name,
                    input_names(&session)
                ))
                .for_model(&cfg.name));
            };
            let (_, dt, shape) = describe(outlet, &cfg.name)?;
            if dt.to_config() as i32 != input.data_type {
                return Err(Error::invalid_arg(format!(
                    "input '{}' has data type {} in the config but {} in the ONNX model",
                    input.name,
                    tern_core::dtype::config_name(input.data_type),
                    tern_core::dtype::config_name(dt.to_config() as i32)
                ))
                .for_model(&cfg.name));
            }
            compare_dims(
                cfg,
                &input.name,
                &shape,
                &input.dims,
                input.reshape.as_ref(),
            )?;
        }
        // The sequence batcher's control and state inputs and state outputs.
        for extra in tern_core::sequence::extra_inputs(cfg) {
            let found = session.inputs().iter().find(|o| o.name() == extra.name);
            let Some(outlet) = found else {
                return Err(Error::invalid_arg(format!(
                    "sequence batching input '{}' is not in the ONNX model (model inputs: {})",
                    extra.name,
                    input_names(&session)
                ))
                .for_model(&cfg.name));
            };
            let (_, dt, _) = describe(outlet, &cfg.name)?;
            if dt.to_config() as i32 != extra.data_type {
                return Err(Error::invalid_arg(format!("sequence batching input '{}' has data type {} in the config but {} in the ONNX model", extra.name, tern_core::dtype::config_name(extra.data_type), tern_core::dtype::config_name(dt.to_config() as i32))).for_model(&cfg.name));
            }
        }
        for extra in tern_core::sequence::extra_outputs(cfg) {
            if !session.outputs().iter().any(|o| o.name() == extra.name) {
                return Err(Error::invalid_arg(format!(
                    "state output '{}' is not in the ONNX model",
                    extra.name
                ))
                .for_model(&cfg.name));
            }
        }
        for output in &cfg.output {
            let Some(outlet) = session.outputs().iter().find(|o| o.name() == output.name) else {
                return Err(Error::invalid_arg(format!(
                    "output '{}' is in the config but not in the ONNX model",
                    output.name
                ))
                .for_model(&cfg.name));
            };
            let (_, _, shape) = describe(outlet, &cfg.name)?;
            compare_dims(
                cfg,
                &output.name,
                &shape,
                &output.dims,
                output.reshape.as_ref(),
            )?;
        }
        let states = tern_core::sequence::extra_outputs(cfg)
            .into_iter()
            .map(|o| (o.name, o.data_type))
            .collect();
        Ok(Arc::new(OnnxModel {
            states: Arc::new(states),
            config: Arc::new(cfg.clone()),
            version: ctx.version,
            path,
            settings: ctx.settings.clone(),
            gate: ctx.gate.clone(),
            first_session: std::sync::Mutex::new(Some((first_device, session))),
        }))
    }
}

/// Triton's load-time check of config dims against the model's shape
/// (backend_common's `CompareDimsSupported`): same rank, and every dim the
/// model fixes equal to the config's (`reshape` when given); with batching the
/// model's first dim must be dynamic.
fn compare_dims(
    cfg: &ModelConfig,
    tensor: &str,
    model_shape: &[i64],
    dims: &[i64],
    reshape: Option<&pb::ModelTensorReshape>,
) -> Result<()> {
    let dims = reshape.map_or(dims, |r| r.shape.as_slice());
    let shape = tern_core::tensor::shape_str;
    let batching = cfg.max_batch_size > 0;
    if batching && model_shape.first() != Some(&-1) {
        return Err(Error::invalid_arg(format!(
            "model '{}', tensor '{tensor}': for the model to support batching the shape should have at least 1 \
             dimension and the first dimension must be -1; but shape expected by the model is {}",
            cfg.name,
            shape(model_shape)
        )));
    }
    let full: Vec<i64> = if batching {
        std::iter::once(-1).chain(dims.iter().copied()).collect()
    } else {
        dims.to_vec()
    };
    let same = model_shape.len() == full.len()
        && model_shape
            .iter()
            .zip(&full)
            .all(|(&m, &c)| m == -1 || m == c);
    if !same {
        let specifies = if batching {
            format!(
                "{} dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit \
                 tensor shape, making complete shape {})",
                full.len(),
                shape(&full)
            )
        } else {
            format!("{} dimensions (shape {})", full.len(), shape(&full))
        };
        return Err(Error::invalid_arg(format!(
            "model '{}', tensor '{tensor}': the model expects {} dimensions (shape {}) but the model \
             configuration specifies {specifies}",
            cfg.name,
            model_shape.len(),
            shape(model_shape)
        )));
    }
    Ok(())
}

struct OnnxModel {
    config: Arc<ModelConfig>,
    /// The sequence batcher's state outputs (name, data type), fetched beside the config's outputs.
    states: Arc<Vec<(String, i32)>>,
    version: i64,
    path: PathBuf,
    settings: BackendSettings,
    /// How instances read the model file (through its agents).
    gate: Arc<dyn FileGate>,
    /// The session opened during load, handed to the first instance on its device.
    first_session: std::sync::Mutex<Option<(DeviceKind, Session)>>,
}

/// The session's input names, for errors (`a, b`).
fn input_names(session: &Session) -> String {
    let names: Vec<&str> = session.inputs().iter().map(|o| o.name()).collect();
    names.join(", ")
}

/// The device of a model's first instance (where the load-time session opens).
fn first_device(cfg: &ModelConfig) -> DeviceKind {
    match cfg.instance_group.first() {
        // A GPU that does not exist is left to the scheduler, which names it in its error.
        Some(g) if g.kind == pb::model_instance_group::Kind::Gpu as i32 => {
            let gpu = g.gpus.first().copied().unwrap_or(0);
            if gpu >= 0 && (gpu as usize) < tern_memory::cuda::devices().len() {
                DeviceKind::Gpu(gpu)
            } else {
                DeviceKind::Cpu
            }
        }
        _ => DeviceKind::Cpu,
    }
}

impl Model for OnnxModel {
    fn create_instance(&self, spec: &InstanceSpec) -> Result<Box<dyn Instance>> {
        let reused = self
            .first_session
            .lock()
            .map(|mut s| {
                if s.as_ref().is_some_and(|(d, _)| *d == spec.device) {
                    s.take().map(|(_, session)| session)
                } else {
                    None
                }
            })
            .unwrap_or(None);
        let run_options = run_options(&self.config, spec.device)?;
        let session = match reused {
            Some(s) => s,
            None => open_session(
                &self.config,
                &self.path,
                &self.settings,
                spec.device,
                &self.gate,
            )?,
        };
        if let DeviceKind::Gpu(id) = spec.device {
            // The staging copies run on this thread: make the device's context current.
            tern_memory::cuda::bind_thread(id as usize)?;
        }
        Ok(Box::new(OnnxInstance {
            config: self.config.clone(),
            states: self.states.clone(),
            version: self.version,
            session,
            run_options,
            device: spec.device,
        }))
    }
}

struct OnnxInstance {
    config: Arc<ModelConfig>,
    states: Arc<Vec<(String, i32)>>,
    version: i64,
    session: Session,
    /// Set when the model asks for arena shrinkage after each run.
    run_options: Option<RunOptions>,
    device: DeviceKind,
}

/// The ORT shape of a batched input: `rows` in front when the model batches
/// (the config's `reshape` was applied when the request was validated).
fn batched_shape(first: &Tensor, batched: bool, rows: i64) -> Vec<i64> {
    if batched {
        std::iter::once(rows)
            .chain(first.shape.iter().skip(1).copied())
            .collect()
    } else {
        first.shape.clone()
    }
}

impl OnnxInstance {
    /// Runs a batch as one ONNX Runtime call: inputs gathered along the batch
    /// dimension, outputs scattered back per request.
    fn run_batch(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Result<Vec<InferResponse>> {
        let cfg = &self.config;
        let batched = cfg.max_batch_size > 0;
        let rows: Vec<usize> = batch
            .iter()
            .map(|r| {
                if batched {
                    r.inputs
                        .first()
                        .and_then(|t| t.shape.first())
                        .copied()
                        .unwrap_or(1) as usize
                } else {
                    1
                }
            })
            .collect();
        // GPU inputs are gathered in page-locked memory when there is a pinned pool and copied
        // by DMA into the GPU's device pool (unless it is sized 0); CPU inputs go in place when
        // they can.
        let pools = tern_memory::pool::pools();
        let place = match self.device {
            DeviceKind::Gpu(id) => io::Placement {
                host: pools.pinned.as_ref().unwrap_or(&pools.host),
                // Without pinned staging a single request's bytes are copied from where they are.
                in_place: pools.pinned.is_none(),
                device: usize::try_from(id)
                    .ok()
                    .and_then(|i| pools.device.get(i))
                    .filter(|p| p.capacity() > 0),
            },
            DeviceKind::Cpu => io::Placement {
                host: &pools.host,
                in_place: true,
                device: None,
            },
        };
        let rows_total: i64 = rows.iter().map(|&r| r as i64).sum();
        // Blocks the inputs were gathered in: declared first so they outlive `inputs`.
        let mut staging = Vec::new();
        let mut inputs: Vec<(&str, SessionInputValue<'static>)> =
            Vec::with_capacity(batch[0].inputs.len());
        for first in &batch[0].inputs {
            let shape = batched_shape(first, batched, rows_total);
            // SAFETY: `batch` outlives the run, and `staging` is dropped after `inputs`.
            let value = unsafe { io::input(batch, &first.name, &shape, &place, &mut staging) }?;
            inputs.push((first.name.as_str(), value));
        }
        timing.input_done = Some(std::time::Instant::now());
        let outputs = match &self.run_options {
            Some(options) => self.session.run_with_options(inputs, options),
            None => self.session.run(inputs),
        };
        let mut outputs = outputs.map_err(|e| {
            Error::internal(format!("onnx runtime error: {e}")).for_model(&cfg.name)
        })?;
        timing.infer_done = Some(std::time::Instant::now());
        drop(staging);
        let mut per_request: Vec<Vec<Tensor>> = batch
            .iter()
            .map(|_| Vec::with_capacity(cfg.output.len() + self.states.len()))
            .collect();
        let wanted = cfg
            .output
            .iter()
            .map(|o| (&o.name, o.data_type, Some(o)))
            .chain(self.states.iter().map(|(n, dt)| (n, *dt, None)));
        for (name, data_type, output) in wanted {
            let value = outputs.remove(name.as_str()).ok_or_else(|| {
                Error::internal(format!("the model did not produce output '{name}'"))
                    .for_model(&cfg.name)
            })?;
            let mut t = io::output(name, value)?;
            if data_type != t.dtype.to_config() as i32 {
                return Err(Error::internal(format!(
                    "output '{name}' has type {} but the config declares {}",
                    t.dtype,
                    tern_core::dtype::config_name(data_type)
                ))
                .for_model(&cfg.name));
            }
            if let Some(output) = output.filter(|o| o.reshape.is_some()) {
                t.shape = tern_core::tensor::unreshape(
                    &output.dims,
                    batched.then(|| t.shape.first().copied().unwrap_or(1)),
                    t.element_count(),
                );
            }
            let parts =
                io::scatter(t, &rows).map_err(|e| e.context(format!("model '{}'", cfg.name)))?;
            for (list, part) in per_request.iter_mut().zip(parts) {
                list.push(part);
            }
        }
        Ok(batch
            .iter()
            .zip(per_request)
            .map(|(req, outputs)| InferResponse {
                model_name: cfg.name.clone(),
                model_version: self.version,
                id: req.id.clone(),
                outputs,
                ..Default::default()
            })
            .collect())
    }
}

impl Instance for OnnxInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let e = match self.run_batch(batch, timing) {
            Ok(responses) => return responses.into_iter().map(Ok).collect(),
            Err(e) => e,
        };
        // A request whose strings ORT cannot take (found while gathering, before ORT ran)
        // fails alone, not its whole batch: the others run without it.
        if batch.len() > 1 && batch[0].inputs.iter().any(|t| t.dtype == DataType::Bytes) {
            if let Some(out) =
                without_refused(batch, io::check_strings, |good| self.execute(good, timing))
            {
                return out;
            }
        }
        batch.iter().map(|_| Err(e.clone())).collect()
    }

    /// ONNX Runtime's CPU sessions may run from any thread; GPU instances
    /// stage inputs under the CUDA context bound to their own thread.
    fn runs_on_any_thread(&self) -> bool {
        self.device == DeviceKind::Cpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_1_17_on_are_accepted_and_older_ones_refused() {
        for ok in ["1.17.0", "1.17.3", "1.18.0", "1.31.1"] {
            assert_eq!(check_version(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            check_version("1.16.3").unwrap_err(),
            "ONNX Runtime 1.16.3 is older than 1.17, the oldest Tern runs with \
             (docs/deployment.md, \"ONNX Runtime versions\")"
        );
        assert!(check_version("banana")
            .unwrap_err()
            .contains("unreadable version 'banana'"));
    }

    #[test]
    fn the_loaded_library_reports_its_version_and_others_are_not_onnx_runtime() {
        let lib = std::env::var("ORT_DYLIB_PATH").expect("make sets ORT_DYLIB_PATH");
        let (v, _open) = library_version(Path::new(&lib)).unwrap();
        assert!(check_version(&v).is_ok() && v.starts_with("1."), "{v}");
        let e = library_version(Path::new("libc.so.6")).unwrap_err();
        assert!(e.contains("not an ONNX Runtime library"), "{e}");
        assert!(library_version(Path::new("/nonexistent/libonnxruntime.so")).is_err());
    }

    fn cfg(max_batch_size: i32) -> ModelConfig {
        ModelConfig {
            name: "m".into(),
            max_batch_size,
            ..Default::default()
        }
    }

    #[test]
    fn config_dims_are_checked_against_the_model_as_triton_does() {
        assert!(compare_dims(&cfg(8), "x", &[-1, 16], &[16], None).is_ok());
        assert!(compare_dims(&cfg(8), "x", &[-1, -1], &[16], None).is_ok());
        assert!(compare_dims(&cfg(0), "x", &[-1, 16], &[3, 16], None).is_ok());
        // A config looser than the model is refused too, as in Triton.
        assert!(compare_dims(&cfg(0), "x", &[1, 16], &[-1, 16], None).is_err());
        let reshape = pb::ModelTensorReshape { shape: vec![] };
        assert!(compare_dims(&cfg(8), "x", &[-1], &[1], Some(&reshape)).is_ok());
        let e = compare_dims(&cfg(0), "fc6_1", &[1, 1000, 1, 1], &[1001], None).unwrap_err();
        assert_eq!(
            e.message,
            "model 'm', tensor 'fc6_1': the model expects 4 dimensions (shape [1,1000,1,1]) but the model \
             configuration specifies 1 dimensions (shape [1001])"
        );
        let e = compare_dims(&cfg(4), "x", &[-1, 16], &[15], None).unwrap_err();
        assert!(
            e.message.contains("making complete shape [-1,15]"),
            "{}",
            e.message
        );
        let e = compare_dims(&cfg(4), "x", &[3, 16], &[16], None).unwrap_err();
        assert!(
            e.message.contains("the first dimension must be -1"),
            "{}",
            e.message
        );
    }
}
