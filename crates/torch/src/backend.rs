//! The backend, its models and instances (LibTorch linked).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Once};

use tch::{CModule, Device, IValue};
use tern_core::backend::{
    model_file, without_refused, Backend, BackendSettings, DeviceKind, ExecTiming, Instance,
    InstanceSpec, LoadContext, Model, ModelFiles,
};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::{DataType, InferRequest, InferResponse, Tensor};

use crate::convert::{flatten, gather, kind_of, output};
use crate::naming::{bind_inputs, bind_outputs, InputBinding};
use crate::params::TorchParams;
use crate::shim;

/// The PyTorch (LibTorch) backend.
pub struct TorchBackend;

const DEFAULT_FILE: &str = "model.pt";

/// The LibTorch version tch binds (it checks it at build time).
pub const LIBTORCH_VERSION: &str = "2.13.0";

/// What `tern --version` says about LibTorch: its version and CUDA.
pub fn status() -> String {
    if shim::cuda_linked() {
        format!(
            "{LIBTORCH_VERSION} (CUDA linked; {} device(s) visible)",
            tch::Cuda::device_count()
        )
    } else {
        format!("{LIBTORCH_VERSION} (CPU only)")
    }
}

/// LibTorch's message without the C++ backtrace it appends.
fn torch_message(e: impl std::fmt::Display) -> String {
    let s = e.to_string();
    let cut = s.find("\nException raised from").unwrap_or(s.len());
    s[..cut].trim_end().to_string()
}

/// The device an instance runs on, or why this build or machine cannot give it.
fn device_for(model: &str, device: DeviceKind) -> Result<Device> {
    match device {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Gpu(id) => {
            if !shim::cuda_linked() {
                return Err(Error::unavailable("KIND_GPU instances need LibTorch's CUDA library, and this build's pytorch \
                     backend has CPU LibTorch only (build with the 'torch-cuda' feature: make torch-cuda)").for_model(model));
            }
            let count = tch::Cuda::device_count();
            if id < 0 || i64::from(id) >= count {
                return Err(Error::unavailable(format!(
                    "LibTorch sees {count} CUDA device(s), so it cannot use GPU {id}"
                ))
                .for_model(model));
            }
            Ok(Device::Cuda(id as usize))
        }
    }
}

/// Checks that every config tensor has a type LibTorch takes (BYTES only as a 1-D `List[str]`).
fn check_types(cfg: &ModelConfig) -> Result<()> {
    let batching = cfg.max_batch_size > 0;
    let tensors = cfg
        .input
        .iter()
        .map(|i| ("input", &i.name, i.data_type, &i.dims, i.reshape.as_ref()))
        .chain(
            cfg.output
                .iter()
                .map(|o| ("output", &o.name, o.data_type, &o.dims, o.reshape.as_ref())),
        );
    for (role, name, data_type, dims, reshape) in tensors {
        let dt = DataType::from_config(data_type)?;
        if dt == DataType::Bytes {
            let rank = reshape.map_or(dims.len(), |r| r.shape.len()) + usize::from(batching);
            if rank > 1 {
                return Err(Error::internal(format!(
                    "Triton only supports 1 dimensional List of String as {role} for '{name}' for model '{}'",
                    cfg.name
                )));
            }
        } else if kind_of(dt).is_none() {
            return Err(Error::internal(format!(
                "unsupported datatype {} for {role} '{name}' for model '{}'",
                tern_core::dtype::config_name(data_type),
                cfg.name
            )));
        }
    }
    Ok(())
}

/// Applies the process-wide thread counts once (the first model that sets them wins, as in Triton).
fn apply_threads(cfg: &ModelConfig, params: &TorchParams) {
    static THREADS: Once = Once::new();
    if params.intra_op_threads.is_none() && params.inter_op_threads.is_none() {
        return;
    }
    let mut applied = false;
    THREADS.call_once(|| {
        applied = true;
        if let Some(n) = params.intra_op_threads {
            tch::set_num_threads(n);
        }
        if let Some(n) = params.inter_op_threads {
            // LibTorch refuses once inter-op work has started (tch panics on that); Triton
            // swallows the error too, Tern logs it.
            let set = std::panic::catch_unwind(|| tch::set_num_interop_threads(n));
            if set.is_err() {
                tracing::warn!(
                    "model '{}': INTER_OP_THREAD_COUNT could not be applied: LibTorch's inter-op pool has already started",
                    cfg.name
                );
            }
        }
    });
    if !applied {
        tracing::warn!(
            "model '{}': INTRA_OP_THREAD_COUNT / INTER_OP_THREAD_COUNT are process-wide in LibTorch and were \
             already set by an earlier model; this model's values are ignored",
            cfg.name
        );
    }
}

impl Backend for TorchBackend {
    fn name(&self) -> &'static str {
        "pytorch"
    }
    fn platform(&self) -> &'static str {
        "pytorch_libtorch"
    }
    fn default_filename(&self) -> Option<&'static str> {
        Some(DEFAULT_FILE)
    }

    fn auto_complete(
        &self,
        _files: &ModelFiles,
        cfg: &mut ModelConfig,
        _settings: &BackendSettings,
    ) -> Result<()> {
        if cfg.backend.is_empty() {
            cfg.backend = self.name().into();
        }
        if cfg.platform.is_empty() {
            cfg.platform = self.platform().into();
        }
        // TorchScript does not record shapes or types: like Triton, Tern cannot fill
        // inputs and outputs in, and the config must name them.
        if cfg.input.is_empty() || cfg.output.is_empty() {
            tracing::warn!(
                "skipping model configuration auto-complete for '{}': not supported for pytorch backend",
                cfg.name
            );
        }
        Ok(())
    }

    fn load(&self, ctx: &LoadContext) -> Result<Arc<dyn Model>> {
        let cfg = ctx.config;
        if ctx.gate.sealed() {
            return Err(Error::unsupported(
                "the 'decrypt' repository agent cannot serve a TorchScript model: LibTorch \
                 opens the model file by path; decrypt serves ONNX models and WebAssembly plugins",
            )
            .for_model(&cfg.name));
        }
        let params = TorchParams::parse(cfg)?;
        check_types(cfg)?;
        let path = model_file(cfg, ctx.version_dir, DEFAULT_FILE)?;
        ctx.progress.set(format!(
            "version {}: loading the TorchScript module",
            ctx.version
        ));
        let sig = shim::forward_signature(&path).map_err(|e| {
            Error::internal(format!(
                "failed to load model '{}': {}",
                cfg.name,
                torch_message(e)
            ))
        })?;
        let inputs: Vec<String> = cfg
            .input
            .iter()
            .map(|i| i.name.clone())
            .chain(
                tern_core::sequence::extra_inputs(cfg)
                    .into_iter()
                    .map(|i| i.name),
            )
            .collect();
        let binding = bind_inputs(&cfg.name, &inputs, &sig)?;
        let outputs: Vec<(String, DataType)> = cfg
            .output
            .iter()
            .map(|o| Ok((o.name.clone(), DataType::from_config(o.data_type)?)))
            .chain(
                tern_core::sequence::extra_outputs(cfg)
                    .into_iter()
                    .map(|o| Ok((o.name, DataType::from_config(o.data_type)?))),
            )
            .collect::<Result<_>>()?;
        let names: Vec<String> = outputs.iter().map(|(n, _)| n.clone()).collect();
        // A dictionary result is taken by output name; anything else by Triton's rules.
        let indices = if sig.returns.starts_with("Dict[") {
            (0..names.len()).collect()
        } else {
            bind_outputs(&cfg.name, &names)?
        };
        apply_threads(cfg, &params);
        if params.nvfuser.is_some() {
            tracing::warn!(
                "model '{}': ENABLE_NVFUSER has no effect: LibTorch 2.x has no nvFuser for TorchScript \
                 (Triton ignores it too); ENABLE_TENSOR_FUSER controls the fuser",
                cfg.name
            );
        }
        let model = TorchModel {
            config: Arc::new(cfg.clone()),
            version: ctx.version,
            path,
            params: params.clone(),
            binding: Arc::new(binding),
            outputs: Arc::new(outputs.into_iter().zip(indices).collect()),
            modules: Mutex::new(HashMap::new()),
        };
        // Load once now, on the first instance's device where it can be had, so a broken file
        // fails the load; the module goes to the first instance on that device.
        let device = match cfg.instance_group.first() {
            Some(g) if g.kind == tern_core::config::pb::model_instance_group::Kind::Gpu as i32 => {
                device_for(
                    &cfg.name,
                    DeviceKind::Gpu(g.gpus.first().copied().unwrap_or(0)),
                )
                .unwrap_or(Device::Cpu)
            }
            _ => Device::Cpu,
        };
        let module = model.open(device)?;
        model
            .modules
            .lock()
            .map_err(|_| Error::internal("module cache poisoned"))?
            .insert(device, (module, true));
        Ok(Arc::new(model))
    }
}

struct TorchModel {
    config: Arc<ModelConfig>,
    version: i64,
    path: PathBuf,
    params: TorchParams,
    binding: Arc<InputBinding>,
    /// Config outputs (then the sequence batcher's state outputs): name, data type, result index.
    outputs: Arc<Vec<((String, DataType), usize)>>,
    /// Modules by device: the one opened at load (flag true until an instance takes it), and with
    /// ENABLE_WEIGHT_SHARING the one every instance on that device shares.
    modules: Mutex<HashMap<Device, (Arc<CModule>, bool)>>,
}

impl TorchModel {
    fn open(&self, device: Device) -> Result<Arc<CModule>> {
        let _mode = self.params.inference_mode.then(shim::InferenceMode::enter);
        let mut module = CModule::load_on_device(&self.path, device).map_err(|e| {
            Error::internal(format!(
                "failed to load model '{}': {}",
                self.config.name,
                torch_message(e)
            ))
        })?;
        module.f_set_eval().map_err(|e| {
            Error::internal(format!(
                "failed to load model '{}': {}",
                self.config.name,
                torch_message(e)
            ))
        })?;
        Ok(Arc::new(module))
    }
}

impl Model for TorchModel {
    fn create_instance(&self, spec: &InstanceSpec) -> Result<Box<dyn Instance>> {
        let device = device_for(&self.config.name, spec.device)?;
        let module = {
            let mut modules = self
                .modules
                .lock()
                .map_err(|_| Error::internal("module cache poisoned"))?;
            match modules.get_mut(&device) {
                Some((m, fresh)) if *fresh || self.params.weight_sharing => {
                    *fresh = false;
                    Some(m.clone())
                }
                _ => None,
            }
        };
        let module = match module {
            Some(m) => m,
            None => {
                let m = self.open(device)?;
                if self.params.weight_sharing {
                    if let Ok(mut modules) = self.modules.lock() {
                        modules.insert(device, (m.clone(), false));
                    }
                }
                m
            }
        };
        Ok(Box::new(TorchInstance {
            config: self.config.clone(),
            version: self.version,
            params: self.params.clone(),
            binding: self.binding.clone(),
            outputs: self.outputs.clone(),
            module,
            device,
        }))
    }
}

struct TorchInstance {
    config: Arc<ModelConfig>,
    version: i64,
    params: TorchParams,
    binding: Arc<InputBinding>,
    outputs: Arc<Vec<((String, DataType), usize)>>,
    module: Arc<CModule>,
    device: Device,
}

impl TorchInstance {
    /// The JIT settings Triton applies before every execution (LibTorch keeps some per thread).
    fn apply_settings(&self) {
        let p = &self.params;
        tch::jit::set_graph_executor_optimize(!p.disable_optimized_execution);
        if let Some(v) = p.jit_profiling {
            tch::jit::set_profiling_mode(v);
        }
        if let Some(v) = p.jit_executor {
            shim::set_executor_mode(v);
        }
        if let Some(v) = p.tensor_fuser {
            tch::jit::set_tensor_expr_fuser_enabled(v);
        }
        if p.disable_cudnn {
            shim::set_cudnn(false);
        }
    }

    /// Runs a batch as one forward call.
    fn run_batch(
        &self,
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
                        .unwrap_or(1)
                        .max(0) as usize
                } else {
                    1
                }
            })
            .collect();
        self.apply_settings();
        // Declared first so it is dropped last: the input tensors view its blocks.
        let mut staging = Vec::new();
        let _no_grad = tch::no_grad_guard();
        let _mode = self.params.inference_mode.then(shim::InferenceMode::enter);
        let args: Vec<IValue> = match &*self.binding {
            InputBinding::Positional(order) => order
                .iter()
                .map(|name| gather(batch, name, batched, self.device, &mut staging))
                .collect::<Result<_>>()?,
            InputBinding::Dict => {
                let mut entries = Vec::with_capacity(batch[0].inputs.len());
                for t in &batch[0].inputs {
                    let value = gather(batch, &t.name, batched, self.device, &mut staging)?;
                    entries.push((IValue::String(t.name.clone()), value));
                }
                vec![IValue::GenericDict(entries)]
            }
        };
        timing.input_done = Some(std::time::Instant::now());
        let result = self.module.forward_is(&args).map_err(|e| {
            Error::internal(format!("PyTorch execute failure: {}", torch_message(e)))
        })?;
        timing.infer_done = Some(std::time::Instant::now());
        drop(args);
        let mut results = flatten(result)
            .map_err(|e| Error::internal(format!("PyTorch execute failure: {}", e.message)))?;
        let mut per_request: Vec<Vec<Tensor>> = batch
            .iter()
            .map(|_| Vec::with_capacity(self.outputs.len()))
            .collect();
        for ((name, dt), index) in self.outputs.iter() {
            let value = results.take(name, *index)?;
            let mut t = output(name, value, *dt)?;
            if let Some(o) = cfg.output.iter().find(|o| &o.name == name) {
                if o.reshape.is_some() {
                    let rows = batched.then(|| t.shape.first().copied().unwrap_or(1));
                    t.shape = tern_core::tensor::unreshape(&o.dims, rows, t.element_count());
                }
            }
            let parts = if batched {
                tern_core::tensor::scatter(t, &rows)?
            } else {
                vec![t]
            };
            for (list, part) in per_request.iter_mut().zip(parts) {
                list.push(part);
            }
        }
        if self.params.cache_cleaning && self.device != Device::Cpu {
            shim::empty_cuda_cache();
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

/// Whether a request's string inputs are UTF-8 (TorchScript's `str`).
fn check_strings(req: &InferRequest) -> Result<()> {
    for t in req.inputs.iter().filter(|t| t.dtype == DataType::Bytes) {
        for (i, s) in tern_core::bytes_tensor::decode(&t.data)?.iter().enumerate() {
            if std::str::from_utf8(s).is_err() {
                return Err(Error::invalid_arg(format!(
                    "input '{}': element {i} is not valid UTF-8 (TorchScript strings are UTF-8)",
                    t.name
                )));
            }
        }
    }
    Ok(())
}

impl Instance for TorchInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        // A request whose strings TorchScript cannot take fails alone, not its whole batch.
        if batch.len() > 1 && batch[0].inputs.iter().any(|t| t.dtype == DataType::Bytes) {
            if let Some(out) =
                without_refused(batch, check_strings, |good| self.execute(good, timing))
            {
                return out;
            }
        }
        match self.run_batch(batch, timing) {
            Ok(responses) => responses.into_iter().map(Ok).collect(),
            Err(e) => {
                let e = e.context(format!("model '{}'", self.config.name));
                batch.iter().map(|_| Err(e.clone())).collect()
            }
        }
    }
}
