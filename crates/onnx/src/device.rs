//! Where an ONNX Runtime session runs: execution providers from the config's
//! `optimization.execution_accelerators` (TensorRT / CUDA on GPU instances,
//! OpenVINO on CPU ones) and `cc_model_filenames`. Pinned staging of GPU
//! inputs is in [`crate::io`].
//!
//! Every configured provider is registered with "error on failure": an
//! accelerator the loaded ONNX Runtime library lacks (or whose libraries are
//! missing) fails the load with ORT's own reason instead of silently running
//! somewhere else.

use std::path::{Path, PathBuf};

use ort::ep::{ArbitrarilyConfigurableExecutionProvider as _, ExecutionProviderDispatch};
#[cfg(feature = "cuda")]
use ort::ep::{TensorRT, CUDA};

use tern_core::backend::DeviceKind;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};

/// The providers for an instance on `device`, in priority order (ORT falls
/// back along the list per node; the CPU provider is always last).
pub fn providers(cfg: &ModelConfig, device: DeviceKind) -> Result<Vec<ExecutionProviderDispatch>> {
    let accel = cfg
        .optimization
        .as_ref()
        .and_then(|o| o.execution_accelerators.as_ref());
    let mut out = Vec::new();
    match device {
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Gpu(_) => {
            return Err(Error::unsupported(
                "GPU instances need CUDA: this build has no CUDA support \
                 (built without the 'cuda' feature)",
            )
            .for_model(&cfg.name))
        }
        #[cfg(feature = "cuda")]
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
                            "gpu_execution_accelerator '{other}' is not supported \
                             (supported: tensorrt, cuda)"
                        ))
                        .for_model(&cfg.name))
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
                        return Err(Error::unsupported(format!("cpu_execution_accelerator '{other}' is not supported (supported: openvino)")).for_model(&cfg.name))
                    }
                }
            }
        }
    }
    Ok(out)
}

/// TensorRT with Triton's parameter names mapped to ORT's options.
#[cfg(feature = "cuda")]
fn tensorrt(
    cfg: &ModelConfig,
    device: i32,
    params: &std::collections::HashMap<String, String>,
) -> Result<ExecutionProviderDispatch> {
    let mut trt = TensorRT::default().with_device_id(device);
    for (k, v) in params {
        let bad = || {
            Error::invalid_arg(format!(
                "tensorrt parameter '{k}' has an invalid value '{v}'"
            ))
            .for_model(&cfg.name)
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
    let gpu = match device {
        DeviceKind::Gpu(id) => tern_memory::cuda::devices().get(id as usize),
        DeviceKind::Cpu => None,
    };
    file_for(cfg, default, gpu.map(|g| g.cc_string()).as_deref())
}

/// `cc_model_filenames[cc]` next to `default` when the instance is on a GPU
/// of compute capability `cc` that the map names, else `default`.
fn file_for(cfg: &ModelConfig, default: &Path, cc: Option<&str>) -> PathBuf {
    match (
        cc.and_then(|cc| cfg.cc_model_filenames.get(cc)),
        default.parent(),
    ) {
        (Some(file), Some(dir)) => dir.join(file),
        _ => default.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    fn config(extra: &str) -> ModelConfig {
        parse_pbtxt(&format!(
            "name: \"m\"\nplatform: \"onnxruntime_onnx\"\n{extra}"
        ))
        .unwrap()
    }

    fn err(r: Result<Vec<ExecutionProviderDispatch>>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn cc_model_filenames_pick_the_file_by_compute_capability() {
        let cfg = config(
            "default_model_filename: \"model.onnx\"\n\
             cc_model_filenames { key: \"8.7\" value: \"orin.onnx\" }\n\
             cc_model_filenames { key: \"9.0\" value: \"hopper.onnx\" }",
        );
        let default = Path::new("/repo/m/1/model.onnx");
        assert_eq!(
            file_for(&cfg, default, Some("8.7")),
            Path::new("/repo/m/1/orin.onnx")
        );
        assert_eq!(
            file_for(&cfg, default, Some("9.0")),
            Path::new("/repo/m/1/hopper.onnx")
        );
        // A GPU the map does not name, and CPU instances, use the default file.
        assert_eq!(file_for(&cfg, default, Some("7.5")), default);
        assert_eq!(file_for(&cfg, default, None), default);
        assert_eq!(model_path(&cfg, default, DeviceKind::Cpu), default);
    }

    #[test]
    fn cpu_instances_without_accelerators_use_ort_defaults() {
        assert!(providers(&config(""), DeviceKind::Cpu).unwrap().is_empty());
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn gpu_instances_get_cuda_and_tensorrt_in_front_when_configured() {
        assert_eq!(providers(&config(""), DeviceKind::Gpu(0)).unwrap().len(), 1);
        let trt = config(
            "optimization { execution_accelerators { gpu_execution_accelerator : [ {\n\
               name : \"tensorrt\"\n\
               parameters { key: \"precision_mode\" value: \"FP16\" }\n\
               parameters { key: \"max_workspace_size_bytes\" value: \"1073741824\" }\n\
               parameters { key: \"trt_engine_cache_enable\" value: \"1\" } } ] } }",
        );
        assert_eq!(providers(&trt, DeviceKind::Gpu(0)).unwrap().len(), 2);
        // GPU accelerators are ignored on CPU instances, as in Triton.
        assert!(providers(&trt, DeviceKind::Cpu).unwrap().is_empty());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn gpu_instances_are_unsupported_without_the_cuda_feature() {
        let e = err(providers(&config(""), DeviceKind::Gpu(0)));
        assert!(e.contains("built without the 'cuda' feature"), "{e}");
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn bad_accelerators_are_refused_by_name() {
        let gpu = |body: &str| {
            let cfg = config(&format!(
                "optimization {{ execution_accelerators {{ gpu_execution_accelerator : [ {{ {body} }} ] }} }}"
            ));
            err(providers(&cfg, DeviceKind::Gpu(0)))
        };
        let e = gpu("name: \"nope\"");
        assert!(
            e.contains("gpu_execution_accelerator 'nope' is not supported"),
            "{e}"
        );
        let e = gpu("name: \"tensorrt\" parameters { key: \"precision_mode\" value: \"FP8\" }");
        assert!(
            e.contains("tensorrt parameter 'precision_mode' has an invalid value 'FP8'"),
            "{e}"
        );
        let e = gpu(
            "name: \"tensorrt\" parameters { key: \"max_workspace_size_bytes\" value: \"lots\" }",
        );
        assert!(
            e.contains("'max_workspace_size_bytes' has an invalid value 'lots'"),
            "{e}"
        );
    }

    #[test]
    fn cpu_accelerators_other_than_openvino_are_refused() {
        let cpu = config(
            "optimization { execution_accelerators { cpu_execution_accelerator : [ { name: \"tensorrt\" } ] } }",
        );
        let e = err(providers(&cpu, DeviceKind::Cpu));
        assert!(
            e.contains("cpu_execution_accelerator 'tensorrt' is not supported"),
            "{e}"
        );
    }
}
