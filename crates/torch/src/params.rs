//! The model `parameters` Triton's PyTorch backend reads, parsed as it
//! parses them (booleans: `true`/`on`/`1`, `false`/`off`/`0`, any case).

use tern_core::backend::{bool_parameter, model_parameter};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};

/// The PyTorch backend's model parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchParams {
    /// `INFERENCE_MODE` (default true): run under `c10::InferenceMode`.
    pub inference_mode: bool,
    /// `DISABLE_OPTIMIZED_EXECUTION` (default false): the graph executor's optimisations off.
    pub disable_optimized_execution: bool,
    /// `ENABLE_JIT_PROFILING`: the profiling executor mode, when set.
    pub jit_profiling: Option<bool>,
    /// `ENABLE_JIT_EXECUTOR`: the profiling (true) or legacy executor, when set.
    pub jit_executor: Option<bool>,
    /// `ENABLE_TENSOR_FUSER`: the tensor-expression fuser, when set.
    pub tensor_fuser: Option<bool>,
    /// `ENABLE_NVFUSER`: accepted; LibTorch 2.x has no nvFuser for TorchScript.
    pub nvfuser: Option<bool>,
    /// `ENABLE_WEIGHT_SHARING` (default false): one module per device shared by its instances.
    pub weight_sharing: bool,
    /// `ENABLE_CACHE_CLEANING` (default false): empty the CUDA cache after each execution.
    pub cache_cleaning: bool,
    /// `DISABLE_CUDNN` (default false).
    pub disable_cudnn: bool,
    /// `INTRA_OP_THREAD_COUNT` (> 0: LibTorch's intra-op threads, process-wide).
    pub intra_op_threads: Option<i32>,
    /// `INTER_OP_THREAD_COUNT` (> 0: LibTorch's inter-op threads, process-wide).
    pub inter_op_threads: Option<i32>,
}

/// A thread count: a whole number; 0 or less leaves LibTorch's default.
fn parse_threads(cfg: &ModelConfig, key: &str) -> Result<Option<i32>> {
    let Some(v) = model_parameter(cfg, key) else {
        return Ok(None);
    };
    // Triton's std::stoi accepts "4x" and overflows silently; Tern wants the whole value.
    let n: i64 = v.trim().parse().map_err(|_| {
        Error::invalid_arg(format!(
            "parameter '{key}': failed to convert '{v}' to integral number"
        ))
        .for_model(&cfg.name)
    })?;
    if n > 1024 {
        return Err(
            Error::invalid_arg(format!("parameter '{key}' is {n}; at most 1024 threads"))
                .for_model(&cfg.name),
        );
    }
    Ok((n > 0).then_some(n as i32))
}

impl TorchParams {
    /// Reads the parameters of `cfg`, failing on a value Triton would refuse.
    pub fn parse(cfg: &ModelConfig) -> Result<TorchParams> {
        Ok(TorchParams {
            inference_mode: bool_parameter(cfg, "INFERENCE_MODE")?.unwrap_or(true),
            disable_optimized_execution: bool_parameter(cfg, "DISABLE_OPTIMIZED_EXECUTION")?
                .unwrap_or(false),
            jit_profiling: bool_parameter(cfg, "ENABLE_JIT_PROFILING")?,
            jit_executor: bool_parameter(cfg, "ENABLE_JIT_EXECUTOR")?,
            tensor_fuser: bool_parameter(cfg, "ENABLE_TENSOR_FUSER")?,
            nvfuser: bool_parameter(cfg, "ENABLE_NVFUSER")?,
            weight_sharing: bool_parameter(cfg, "ENABLE_WEIGHT_SHARING")?.unwrap_or(false),
            cache_cleaning: bool_parameter(cfg, "ENABLE_CACHE_CLEANING")?.unwrap_or(false),
            disable_cudnn: bool_parameter(cfg, "DISABLE_CUDNN")?.unwrap_or(false),
            intra_op_threads: parse_threads(cfg, "INTRA_OP_THREAD_COUNT")?,
            inter_op_threads: parse_threads(cfg, "INTER_OP_THREAD_COUNT")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(params: &str) -> ModelConfig {
        tern_core::config::parse_pbtxt(&format!("name: \"m\" parameters [{params}]")).unwrap()
    }

    #[test]
    fn defaults_match_triton() {
        let p = TorchParams::parse(&cfg("")).unwrap();
        assert!(p.inference_mode);
        assert!(!p.disable_optimized_execution && !p.weight_sharing && !p.cache_cleaning);
        assert_eq!(p.jit_profiling, None);
        assert_eq!(p.intra_op_threads, None);
    }

    #[test]
    fn values_parse_as_triton_parses_them() {
        let p = TorchParams::parse(&cfg(
            r#"{ key: "INFERENCE_MODE" value { string_value: "off" } },
               { key: "ENABLE_JIT_PROFILING" value { string_value: "ON" } },
               { key: "INTRA_OP_THREAD_COUNT" value { string_value: "2" } },
               { key: "INTER_OP_THREAD_COUNT" value { string_value: "0" } }"#,
        ))
        .unwrap();
        assert!(!p.inference_mode);
        assert_eq!(p.jit_profiling, Some(true));
        assert_eq!(p.intra_op_threads, Some(2));
        assert_eq!(p.inter_op_threads, None);
        let e = TorchParams::parse(&cfg(
            r#"{ key: "ENABLE_WEIGHT_SHARING" value { string_value: "yes" } }"#,
        ))
        .unwrap_err();
        assert_eq!(
            e.message,
            "model 'm': parameter 'ENABLE_WEIGHT_SHARING': failed to convert 'yes' to boolean \
             (true/on/1 or false/off/0)"
        );
        assert!(TorchParams::parse(&cfg(
            r#"{ key: "INTRA_OP_THREAD_COUNT" value { string_value: "4x" } }"#
        ))
        .is_err());
    }
}
