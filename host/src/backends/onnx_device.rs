//! Where an ONNX Runtime session runs: execution providers from the config's
//! `optimization.execution_accelerators` (TensorRT / CUDA on GPU instances,
//! OpenVINO on CPU ones) and `cc_model_filenames`. Pinned staging of GPU
//! inputs is in `onnx_io`.
//!
//! Every configured provider is registered with "error on failure": an
//! accelerator the loaded ONNX Runtime library lacks (or whose libraries are
//! missing) fails the load with ORT's own reason instead of silently running
//! somewhere else.

use std::path::{Path, PathBuf};

use ort::ep::{
    ArbitrarilyConfigurableExecutionProvider as _, ExecutionProviderDispatch, TensorRT, CUDA,
};

use super::DeviceKind;
use crate::config::ModelConfig;
use crate::error::{Error, Result};

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
