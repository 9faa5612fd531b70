//! Normalisation (Triton's defaults filled in) and validation of model
//! configs, with errors naming the model and the field.

use std::collections::HashSet;

use super::pb::{
    self, model_instance_group::Kind, model_version_policy::PolicyChoice, ModelConfig,
};
use crate::dtype::{config_name, DataType};
use crate::error::{Error, Result};
use crate::tensor::shape_str;

/// Fills in Triton's defaults: version policy `latest { num_versions: 1 }`,
/// one instance group when none is given, group names, counts and kinds
/// (`KIND_AUTO` resolves to CPU when `gpu_count` is 0). Ensembles get no
/// instance group: their steps run on the composing models' instances.
/// Like Triton's `NormalizeModelConfig`, `dynamic_batching` without
/// preferred sizes prefers `max_batch_size`, `sequence_batching` gets the one-second
/// idle timeout when it gives none, models other than ensembles get
/// pinned input/output buffers enabled in `optimization`, and every model has
/// a `model_transaction_policy` (`decoupled: false` unless configured), so
/// the config a client reads matches tritonserver's field for field.
pub fn normalize(cfg: &mut ModelConfig, gpu_count: usize) {
    let ensemble = crate::config::is_ensemble(cfg);
    if let Some(pb::model_config::SchedulingChoice::DynamicBatching(db)) =
        &mut cfg.scheduling_choice
    {
        if db.preferred_batch_size.is_empty() && cfg.max_batch_size > 0 {
            db.preferred_batch_size.push(cfg.max_batch_size);
        }
    }
    if !ensemble {
        let opt = cfg.optimization.get_or_insert_with(Default::default);
        let enabled = || Some(pb::model_optimization_policy::PinnedMemoryBuffer { enable: true });
        if opt.input_pinned_memory.is_none() {
            opt.input_pinned_memory = enabled();
        }
        if opt.output_pinned_memory.is_none() {
            opt.output_pinned_memory = enabled();
        }
    }
    if let Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) =
        &mut cfg.scheduling_choice
    {
        if sb.max_sequence_idle_microseconds == 0 {
            sb.max_sequence_idle_microseconds = crate::sequence::DEFAULT_IDLE_MICROSECONDS;
        }
    }
    cfg.model_transaction_policy
        .get_or_insert_with(Default::default);
    if cfg
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
        .is_none()
    {
        cfg.version_policy = Some(pb::ModelVersionPolicy {
            policy_choice: Some(PolicyChoice::Latest(pb::model_version_policy::Latest {
                num_versions: 1,
            })),
        });
    }
    if cfg.instance_group.is_empty() && !ensemble {
        // Triton names the group it adds after the model itself.
        cfg.instance_group.push(pb::ModelInstanceGroup {
            name: cfg.name.clone(),
            ..Default::default()
        });
    }
    let name = cfg.name.clone();
    for (i, group) in cfg.instance_group.iter_mut().enumerate() {
        if group.name.is_empty() {
            group.name = format!("{name}_{i}");
        }
        if group.count < 1 {
            group.count = 1;
        }
        if group.kind == Kind::Auto as i32 {
            group.kind = if gpu_count > 0 {
                Kind::Gpu as i32
            } else {
                Kind::Cpu as i32
            };
        }
    }
}

/// Validates a (normalised) config. `folder` is the model's directory name.
pub fn validate(cfg: &ModelConfig, folder: &str) -> Result<()> {
    let m = &cfg.name;
    let err = |msg: String| Err(Error::invalid_arg(format!("model '{m}': {msg}")));
    if cfg.name != folder {
        return err(format!(
            "config name '{}' does not match the model directory name '{folder}'",
            cfg.name
        ));
    }
    if cfg.max_batch_size < 0 {
        return err(format!(
            "max_batch_size must be >= 0, got {}",
            cfg.max_batch_size
        ));
    }
    // File names are joined to the model's folders: they must stay inside them
    // (a config given through the load API must not read the server's other files).
    let files = std::iter::once(("default_model_filename", &cfg.default_model_filename))
        .chain(
            cfg.cc_model_filenames
                .values()
                .map(|f| ("cc_model_filenames", f)),
        )
        .chain(
            cfg.output
                .iter()
                .map(|o| ("label_filename", &o.label_filename)),
        );
    for (field, file) in files {
        let inside = std::path::Path::new(file)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !inside {
            return err(format!(
                "{field} '{file}' must be a relative path inside the model's folder"
            ));
        }
    }
    let mut seen = HashSet::new();
    for input in &cfg.input {
        check_io(
            "input",
            &input.name,
            input.data_type,
            &input.dims,
            input.reshape.as_ref(),
            m,
        )?;
        if !seen.insert(input.name.as_str()) {
            return err(format!("input '{}' is declared more than once", input.name));
        }
    }
    let mut seen = HashSet::new();
    for output in &cfg.output {
        check_io(
            "output",
            &output.name,
            output.data_type,
            &output.dims,
            output.reshape.as_ref(),
            m,
        )?;
        if !seen.insert(output.name.as_str()) {
            return err(format!(
                "output '{}' is declared more than once",
                output.name
            ));
        }
    }
    validate_version_policy(cfg)?;
    for group in &cfg.instance_group {
        if group.count < 1 {
            return err(format!(
                "instance_group '{}': count must be >= 1, got {}",
                group.name, group.count
            ));
        }
        if group.kind != Kind::Gpu as i32 && !group.gpus.is_empty() {
            return err(format!(
                "instance_group '{}': 'gpus' may only be set for KIND_GPU or KIND_AUTO",
                group.name
            ));
        }
    }
    if let Some(pb::model_config::SchedulingChoice::DynamicBatching(db)) = &cfg.scheduling_choice {
        for &p in &db.preferred_batch_size {
            if p < 1 || (cfg.max_batch_size > 0 && p > cfg.max_batch_size) {
                return err(format!(
                    "dynamic_batching preferred_batch_size {p} must be between 1 and max_batch_size {}",
                    cfg.max_batch_size
                ));
            }
        }
    }
    crate::sequence::validate_config(cfg)?;
    Ok(())
}

fn validate_version_policy(cfg: &ModelConfig) -> Result<()> {
    let m = &cfg.name;
    match cfg
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        Some(PolicyChoice::Latest(l)) if l.num_versions == 0 => Err(Error::invalid_arg(format!(
            "model '{m}': version_policy latest: num_versions must be >= 1"
        ))),
        Some(PolicyChoice::Specific(s)) => {
            if s.versions.is_empty() {
                return Err(Error::invalid_arg(format!(
                    "model '{m}': version_policy specific: versions must not be empty"
                )));
            }
            if let Some(v) = s.versions.iter().find(|&&v| v < 1) {
                return Err(Error::invalid_arg(format!(
                    "model '{m}': version_policy specific: version {v} is not a valid version (must be >= 1)"
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_io(
    kind: &str,
    name: &str,
    data_type: i32,
    dims: &[i64],
    reshape: Option<&pb::ModelTensorReshape>,
    model: &str,
) -> Result<()> {
    let err = |msg: String| {
        Err(Error::invalid_arg(format!(
            "model '{model}' {kind} '{name}': {msg}"
        )))
    };
    if name.is_empty() {
        return Err(Error::invalid_arg(format!(
            "model '{model}': every {kind} must have a name"
        )));
    }
    if DataType::from_config(data_type).is_err() {
        return err(format!("data_type {} is not valid", config_name(data_type)));
    }
    if dims.is_empty() {
        return err("dims must not be empty (use [1] for a scalar per batch item, or reshape: { shape: [] })".into());
    }
    if let Some(d) = dims.iter().find(|&&d| d < 1 && d != -1) {
        return err(format!(
            "dims {} contains {d}; each dim must be >= 1 or -1 (variable)",
            shape_str(dims)
        ));
    }
    if let Some(r) = reshape {
        if let Some(d) = r.shape.iter().find(|&&d| d < 1 && d != -1) {
            return err(format!(
                "reshape {} contains {d}; each dim must be >= 1 or -1",
                shape_str(&r.shape)
            ));
        }
        let variable = |s: &[i64]| s.iter().filter(|&&d| d == -1).count();
        // Checked: huge dims must be an error, not an overflow.
        let fixed = |s: &[i64]| {
            s.iter()
                .filter(|&&d| d != -1)
                .try_fold(1i64, |n, &d| n.checked_mul(d))
        };
        if variable(dims) != variable(&r.shape)
            || fixed(dims).is_none()
            || fixed(dims) != fixed(&r.shape)
        {
            return err(format!(
                "reshape {} has a different element count than dims {}",
                shape_str(&r.shape),
                shape_str(dims)
            ));
        }
    }
    Ok(())
}

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
    note(
        cfg.model_repository_agents.is_some(),
        "model_repository_agents",
    );
    note(
        cfg.response_cache.as_ref().is_some_and(|c| c.enable),
        "response_cache",
    );
    note(cfg.model_metrics.is_some(), "model_metrics");
    note(!cfg.runtime.is_empty(), "runtime");
    note(
        cfg.instance_group.iter().any(|g| g.rate_limiter.is_some()),
        "instance_group.rate_limiter",
    );
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
        Err(Error::unsupported(format!(
            "model '{m}': {what} is not supported by this version of Tern"
        )))
    };
    if cfg.instance_group.iter().any(|g| g.passive) {
        return unsupported("instance_group.passive");
    }
    if crate::sequence::batching(cfg).is_some_and(|sb| sb.iterative_sequence) {
        return unsupported("sequence_batching.iterative_sequence");
    }
    Ok(())
}
