//! The rules a (normalised) model config must follow, with errors naming
//! the model and the field.

use std::collections::HashSet;

use super::pb::{
    self, model_instance_group::Kind, model_version_policy::PolicyChoice, ModelConfig,
};
use crate::dtype::{config_name, DataType};
use crate::error::{Error, Result};
use crate::tensor::shape_str;

/// Validates a (normalised) config. `folder` is the model's directory name.
pub fn validate(cfg: &ModelConfig, folder: &str) -> Result<()> {
    let m = &cfg.name;
    let err = |msg: String| Err(Error::invalid_arg(msg).for_model(m));
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
    validate_response_cache(cfg)?;
    crate::sequence::validate_config(cfg)?;
    Ok(())
}

/// The response cache serves one response per request from a model without
/// sequence state: Triton's refusals for the other two.
fn validate_response_cache(cfg: &ModelConfig) -> Result<()> {
    if !cfg.response_cache.as_ref().is_some_and(|c| c.enable) {
        return Ok(());
    }
    if crate::sequence::batching(cfg).is_some() {
        return Err(crate::messages::response_cache_unsupported(
            &cfg.name,
            "sequence batching scheduler",
        ));
    }
    if cfg
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
    {
        return Err(crate::messages::response_cache_unsupported(
            &cfg.name,
            "'decoupled' transaction policy",
        ));
    }
    Ok(())
}

fn validate_version_policy(cfg: &ModelConfig) -> Result<()> {
    let m = &cfg.name;
    match cfg
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        Some(PolicyChoice::Latest(l)) if l.num_versions == 0 => {
            Err(Error::invalid_arg("version_policy latest: num_versions must be >= 1").for_model(m))
        }
        Some(PolicyChoice::Specific(s)) => {
            if s.versions.is_empty() {
                return Err(Error::invalid_arg(
                    "version_policy specific: versions must not be empty",
                )
                .for_model(m));
            }
            if let Some(v) = s.versions.iter().find(|&&v| v < 1) {
                return Err(Error::invalid_arg(format!(
                    "version_policy specific: version {v} is not a valid version (must be >= 1)"
                ))
                .for_model(m));
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
        return Err(Error::invalid_arg(format!("every {kind} must have a name")).for_model(model));
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
