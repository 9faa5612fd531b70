//! Where an ONNX Runtime session runs: execution providers from the config's
//! `optimization.execution_accelerators` (TensorRT / CUDA on GPU instances,
//! OpenVINO on CPU ones), `cc_model_filenames`, and the pinned staging of GPU
//! inputs.
//!
//! Every configured provider is registered with "error on failure": an
//! accelerator the loaded ONNX Runtime library lacks (or whose libraries are
//! missing) fails the load with ORT's own reason instead of silently running
//! somewhere else.

use std::path::{Path, PathBuf};

use ort::ep::{
    ArbitrarilyConfigurableExecutionProvider as _, ExecutionProviderDispatch, TensorRT, CUDA,
};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::SessionInputValue;
use ort::value::TensorRefMut;

use super::DeviceKind;
use crate::config::ModelConfig;
use crate::core::{DataType, InferRequest};
use crate::error::{Error, Result};
use crate::memory::pool::{self, Block};

/// The providers for an instance on `device`, in priority order (ORT falls
/// back along the list per node; the CPU provider is always last).
pub fn providers(cfg: &ModelConfig, device: DeviceKind) -> Result<Vec<ExecutionProviderDispatch>> {
    let accel = cfg
        .optimization
        .as_ref()
        .and_then(|o| o.execution_accelerators.as_ref());
    let mut out = Vec::new();
    match device {
        DeviceKind::Gpu(id) => {
            let mut cuda = CUDA::default().with_device_id(id);
            for a in accel
                .map(|a| a.gpu_execution_accelerator.as_slice())
                .unwrap_or(&[])
            {
                match a.name.as_str() {
                    "tensorrt" => out.push(tensorrt(cfg, id, &a.parameters)?),
                    "cuda" => {
                        for (k, v) in &a.parameters {
                            cuda = cuda.with_arbitrary_config(k, v);
                        }
                    }
                    other => {
                        return Err(Error::unsupported(format!(
                            "model '{}': gpu_execution_accelerator '{other}' is not supported \
                             (supported: tensorrt, cuda)",
                            cfg.name
                        )))
                    }
                }
            }
            out.push(cuda.build().error_on_failure());
        }
        DeviceKind::Cpu => {
            for a in accel
                .map(|a| a.cpu_execution_accelerator.as_slice())
                .unwrap_or(&[])
            {
                match a.name.as_str() {
                    "openvino" => {
                        let mut ov = ort::ep::OpenVINO::default();
                        for (k, v) in &a.parameters {
                            ov = ov.with_arbitrary_config(k, v);
                        }
                        out.push(ov.build().error_on_failure());
                    }
                    other => {
                        return Err(Error::unsupported(format!(
                            "model '{}': cpu_execution_accelerator '{other}' is not supported (supported: openvino)",
                            cfg.name
                        )))
                    }
                }
            }
        }
    }
    Ok(out)
}

/// TensorRT with Triton's parameter names mapped to ORT's options.
fn tensorrt(
    cfg: &ModelConfig,
    device: i32,
    params: &std::collections::HashMap<String, String>,
) -> Result<ExecutionProviderDispatch> {
    let mut trt = TensorRT::default().with_device_id(device);
    for (k, v) in params {
        let bad = || {
            Error::invalid_arg(format!(
                "model '{}': tensorrt parameter '{k}' has an invalid value '{v}'",
                cfg.name
            ))
        };
        trt = match k.as_str() {
            "precision_mode" => match v.as_str() {
                "FP32" => trt,
                "FP16" => trt.with_fp16(true),
                "INT8" => trt.with_int8(true),
                _ => return Err(bad()),
            },
            "max_workspace_size_bytes" => {
                trt.with_max_workspace_size(v.parse().map_err(|_| bad())?)
            }
            // Triton's ORT backend names the rest after ORT's `trt_*` options.
            other => {
                let key = if other.starts_with("trt_") {
                    other.to_string()
                } else {
                    format!("trt_{other}")
                };
                trt.with_arbitrary_config(key, v)
            }
        };
    }
    Ok(trt.build().error_on_failure())
}

/// The model file for `device`: `cc_model_filenames` keyed by the GPU's
/// compute capability ("8.7"), else the default file.
pub fn model_path(cfg: &ModelConfig, default: &Path, device: DeviceKind) -> PathBuf {
    if let DeviceKind::Gpu(id) = device {
        if let Some(gpu) = crate::memory::cuda::devices().get(id as usize) {
            if let Some(file) = cfg.cc_model_filenames.get(&gpu.cc_string()) {
                if let Some(dir) = default.parent() {
                    return dir.join(file);
                }
            }
        }
    }
    default.to_path_buf()
}

/// Gathers input `name` of every request of the batch into page-locked memory
/// from the pinned pool (ORT's CUDA provider then copies it to the device by
/// DMA); `None` when there is no pinned pool or the type is BYTES. The block
/// must outlive the returned view: the caller keeps it until the run ends.
pub fn stage(
    batch: &[InferRequest],
    name: &str,
    dtype: DataType,
    shape: &[i64],
) -> Result<Option<(SessionInputValue<'static>, Block)>> {
    let Some(pinned) = pool::pools().pinned.as_ref() else {
        return Ok(None);
    };
    if dtype == DataType::Bytes {
        return Ok(None);
    }
    let total: usize = batch
        .iter()
        .map(|r| r.input(name).map_or(0, |t| t.data.len()))
        .sum();
    let mut block = pinned.take(total)?;
    let buf = block.as_mut_slice();
    let mut at = 0;
    for r in batch {
        let t = r.input(name).ok_or_else(|| {
            Error::internal(format!("input '{name}' missing from a batched request"))
        })?;
        buf[at..at + t.data.len()].copy_from_slice(&t.data);
        at += t.data.len();
    }
    let ptr = block.ptr() as *mut ort::sys::c_void;
    let info = MemoryInfo::new(
        AllocationDevice::CPU,
        0,
        AllocatorType::Device,
        MemoryType::Default,
    )
    .map_err(|e| Error::internal(format!("input '{name}': {e}")))?;
    let shape = ort::value::Shape::new(shape.iter().copied());
    let fail = |e: ort::Error| Error::internal(format!("input '{name}': {e}"));
    macro_rules! raw {
        ($t:ty) => {
            // SAFETY: the block holds exactly the gathered bytes for `shape` (validated sizes) and
            // is kept alive beside the tensor in `Staged`.
            SessionInputValue::from(
                unsafe { TensorRefMut::<'static, $t>::from_raw(info, ptr, shape) }.map_err(fail)?,
            )
        };
    }
    let tensor = match dtype {
        DataType::Bool => raw!(bool),
        DataType::Uint8 => raw!(u8),
        DataType::Uint16 => raw!(u16),
        DataType::Uint32 => raw!(u32),
        DataType::Uint64 => raw!(u64),
        DataType::Int8 => raw!(i8),
        DataType::Int16 => raw!(i16),
        DataType::Int32 => raw!(i32),
        DataType::Int64 => raw!(i64),
        DataType::Fp16 => raw!(half::f16),
        DataType::Bf16 => raw!(half::bf16),
        DataType::Fp32 => raw!(f32),
        DataType::Fp64 => raw!(f64),
        DataType::Bytes => unreachable!("BYTES returned above"),
    };
    Ok(Some((tensor, block)))
}
