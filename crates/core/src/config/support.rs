//! What this build does with each config feature: acted on, warned about
//! at load (parsed but not acted on), or refused (a model using it fails to
//! load with UNSUPPORTED rather than be served wrongly).

use super::pb::ModelConfig;
use crate::error::{Error, Result};

/// Config fields that parse but that this version of Tern does not act on.
/// They are reported in the log at load so nothing is silently ignored.
pub fn not_acted_on(cfg: &ModelConfig) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut note = |cond: bool, name: &'static str| {
        if cond {
            out.push(name)
        }
    };
    // Acted on: graph.level and execution_accelerators (ONNX Runtime).
    note(
        cfg.optimization.as_ref().is_some_and(|o| {
            o.priority != 0
                || o.cuda.is_some()
                || o.input_pinned_memory.as_ref().is_some_and(|p| !p.enable)
                || o.output_pinned_memory.as_ref().is_some_and(|p| !p.enable)
                || o.gather_kernel_buffer_threshold != 0
                || o.eager_batching
        }),
        "optimization (other than graph.level and execution_accelerators)",
    );
    note(!cfg.batch_input.is_empty(), "batch_input");
    note(!cfg.batch_output.is_empty(), "batch_output");
    note(cfg.model_operations.is_some(), "model_operations");
    note(cfg.model_metrics.is_some(), "model_metrics");
    note(!cfg.runtime.is_empty(), "runtime");
    note(
        cfg.instance_group
            .iter()
            .any(|g| !g.secondary_devices.is_empty()),
        "instance_group.secondary_devices",
    );
    note(
        cfg.instance_group.iter().any(|g| !g.profile.is_empty()),
        "instance_group.profile",
    );
    note(
        cfg.instance_group.iter().any(|g| !g.host_policy.is_empty()),
        "instance_group.host_policy",
    );
    note(cfg.input.iter().any(|i| i.format != 0), "input.format");
    out
}

/// Config features that change request semantics and that this version of
/// Tern cannot honour: a model using them fails to load with UNSUPPORTED
/// instead of being served wrongly.
pub fn check_supported(cfg: &ModelConfig) -> Result<()> {
    let m = &cfg.name;
    let unsupported = |what: &str| {
        Err(
            Error::unsupported(format!("{what} is not supported by this version of Tern"))
                .for_model(m),
        )
    };
    if cfg.instance_group.iter().any(|g| g.passive) {
        return unsupported("instance_group.passive");
    }
    Ok(())
}
