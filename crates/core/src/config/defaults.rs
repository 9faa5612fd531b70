//! Triton's defaults, filled into a parsed config before it is validated,
//! so the config a client reads matches tritonserver's field for field.

use super::pb::{
    self, model_instance_group::Kind, model_version_policy::PolicyChoice, ModelConfig,
};

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
    // Triton gives only ensembles a transaction policy by default.
    if ensemble {
        cfg.model_transaction_policy
            .get_or_insert_with(Default::default);
    }
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
