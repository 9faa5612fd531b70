//! Ensemble validation (as Triton's `ensemble_utils`): the step DAG checked
//! once, at load, against the composing models' configs, and the [`Plan`]
//! the runner follows. Each check is its own pass: the steps' maps, every
//! edge's data type and shape, the outputs, cycles, and which decoupled step
//! each step follows.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tern_core::config::pb::{self, ModelConfig};
use tern_core::dtype::config_name;
use tern_core::error::{Error, Result};
use tern_core::tensor::shape_str;

use super::{check_config, steps_of};

/// One step after validation.
#[derive(Debug)]
pub(super) struct Step {
    pub(super) model: String,
    pub(super) version: Option<i64>,
    /// The composing model is decoupled (its responses stream).
    pub(super) decoupled: bool,
    /// The decoupled step whose responses this step runs once per (`None`:
    /// it runs once per request).
    pub(super) follows: Option<usize>,
    /// Whether the composing model batches (`max_batch_size > 0`).
    pub(super) batching: bool,
    /// (composing model input, ensemble tensor).
    pub(super) inputs: Vec<(String, String)>,
    /// The composing model's `dims` of each input (same order as `inputs`).
    pub(super) input_dims: Vec<Vec<i64>>,
    /// (composing model output, ensemble tensor).
    pub(super) outputs: Vec<(String, String)>,
}

/// A validated ensemble: what the runner needs to run requests.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) name: String,
    /// Whether the ensemble batches (`max_batch_size > 0`).
    pub(super) batching: bool,
    pub(super) steps: Vec<Step>,
    pub(super) outputs: Vec<String>,
    /// The ensemble's shape of each output (`reshape`, else `dims`).
    pub(super) output_dims: Vec<Vec<i64>>,
    /// The `dims` of each output that has a `reshape` (what clients see).
    pub(super) output_unreshape: Vec<Option<Vec<i64>>>,
    /// The decoupled step whose responses the ensemble's outputs follow: one
    /// ensemble response per response of it.
    pub(super) streams_from: Option<usize>,
}

impl Plan {
    /// Which steps a request asking for `requested` outputs (empty: all of
    /// them) runs, and which of the ensemble's outputs it answers with: as
    /// Triton prunes an ensemble request, a step runs only when a requested
    /// output depends on what it produces. The decoupled step the responses
    /// follow always runs (it paces them).
    pub(super) fn needed(
        &self,
        requested: &[tern_core::RequestedOutput],
    ) -> (Vec<bool>, Vec<bool>) {
        let outputs: Vec<bool> = self
            .outputs
            .iter()
            .map(|o| requested.is_empty() || requested.iter().any(|r| &r.name == o))
            .collect();
        let mut tensors: HashSet<&str> = self
            .outputs
            .iter()
            .zip(&outputs)
            .filter(|(_, n)| **n)
            .map(|(o, _)| o.as_str())
            .collect();
        let mut steps = vec![false; self.steps.len()];
        if let Some(d) = self.streams_from {
            steps[d] = true;
            tensors.extend(self.steps[d].inputs.iter().map(|(_, t)| t.as_str()));
        }
        // A fixed point over the DAG: a step producing a needed tensor needs its inputs.
        let mut changed = true;
        while changed {
            changed = false;
            for (i, step) in self.steps.iter().enumerate() {
                if !steps[i]
                    && step
                        .outputs
                        .iter()
                        .any(|(_, t)| tensors.contains(t.as_str()))
                {
                    steps[i] = true;
                    tensors.extend(step.inputs.iter().map(|(_, t)| t.as_str()));
                    changed = true;
                }
            }
        }
        (steps, outputs)
    }
}

/// Where an ensemble tensor comes from.
#[derive(Clone)]
struct Source {
    /// `None` = an ensemble input.
    step: Option<usize>,
    dtype: i32,
    /// Shape without the batch dimension, as the producer declares it.
    dims: Vec<i64>,
    /// Full shape (with `-1` as the batch dimension when the producer batches).
    shape: Vec<i64>,
    what: String,
}

/// A step's map as (composing model tensor, ensemble tensor) pairs, in name order.
fn sorted_pairs(map: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> =
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    pairs.sort();
    pairs
}

fn full_shape(cfg: &ModelConfig, dims: &[i64]) -> Vec<i64> {
    if cfg.max_batch_size > 0 {
        std::iter::once(-1).chain(dims.iter().copied()).collect()
    } else {
        dims.to_vec()
    }
}

/// Triton's `CompareDimsWithWildcard`: same rank, `-1` matches anything.
pub(super) fn dims_agree(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| *x == -1 || *y == -1 || x == y)
}

/// Triton's shape check along an ensemble edge: the shapes agree without
/// the batch dimension or with it, so a batching and a non-batching model
/// may be connected when the expanded shapes are consistent.
fn shapes_agree(dims_a: &[i64], full_a: &[i64], dims_b: &[i64], full_b: &[i64]) -> bool {
    dims_agree(dims_a, dims_b) || dims_agree(full_a, full_b)
}

/// The dims an ensemble tensor has by config: the `reshape` when there is one.
fn io_dims(dims: &[i64], reshape: Option<&pb::ModelTensorReshape>) -> Vec<i64> {
    reshape.map_or_else(|| dims.to_vec(), |r| r.shape.clone())
}

/// An invalid-ensemble error, prefixed with the ensemble's name.
fn invalid(e: &str, msg: String) -> Error {
    Error::invalid_arg(format!("ensemble '{e}': {msg}"))
}

/// Validates the DAG against the composing models' configs (`lookup`
/// returns the config of a ready model version, `None` = latest): every
/// mapped name exists, each tensor is produced once, every step's inputs
/// can be produced, there are no cycles, and data types and shapes agree
/// along every edge.
pub(super) fn plan(
    cfg: &ModelConfig,
    lookup: impl Fn(&str, Option<i64>) -> Result<Arc<ModelConfig>>,
) -> Result<Plan> {
    check_config(cfg)?;
    let e = &cfg.name;
    let mut sources = input_sources(cfg);
    let mut steps = Vec::new();
    let mut configs = Vec::new();
    for (i, s) in steps_of(cfg).iter().enumerate() {
        let version = (s.model_version >= 0).then_some(s.model_version);
        let mcfg = lookup(&s.model_name, version).map_err(|err| {
            Error::new(
                err.code,
                format!(
                    "ensemble '{e}' step {i}: composing model '{}' is not available: {}",
                    s.model_name, err.message
                ),
            )
        })?;
        steps.push(plan_step(cfg, i, s, &mcfg, &mut sources)?);
        configs.push(mcfg);
    }
    check_edges(e, &steps, &configs, &sources)?;
    check_outputs(cfg, &sources)?;
    check_acyclic(cfg, &steps)?;
    let streams_from = follow(e, cfg, &mut steps)?;
    warn_unused_inputs(cfg, &steps);
    check_unused_tensors(cfg, &steps)?;
    Ok(Plan {
        name: e.clone(),
        batching: cfg.max_batch_size > 0,
        steps,
        outputs: cfg.output.iter().map(|o| o.name.clone()).collect(),
        output_dims: cfg
            .output
            .iter()
            .map(|o| io_dims(&o.dims, o.reshape.as_ref()))
            .collect(),
        output_unreshape: cfg
            .output
            .iter()
            .map(|o| o.reshape.as_ref().map(|_| o.dims.clone()))
            .collect(),
        streams_from,
    })
}

/// The ensemble inputs as tensor sources; the steps see each after its reshape.
fn input_sources(cfg: &ModelConfig) -> HashMap<String, Source> {
    cfg.input
        .iter()
        .map(|input| {
            let dims = io_dims(&input.dims, input.reshape.as_ref());
            let source = Source {
                step: None,
                dtype: input.data_type,
                shape: full_shape(cfg, &dims),
                dims,
                what: format!("ensemble input '{}'", input.name),
            };
            (input.name.clone(), source)
        })
        .collect()
}

/// Checks step `i` against its composing model's config `mcfg` (batch size,
/// input and output maps) and adds the tensors it produces to `sources`.
fn plan_step(
    cfg: &ModelConfig,
    i: usize,
    s: &pb::model_ensembling::Step,
    mcfg: &ModelConfig,
    sources: &mut HashMap<String, Source>,
) -> Result<Step> {
    let e = &cfg.name;
    let bad = |msg: String| invalid(e, msg);
    let version = (s.model_version >= 0).then_some(s.model_version);
    let where_ = format!("step {i} (model '{}')", s.model_name);
    // As Triton: a non-batching step (max_batch_size 0) is not compared.
    if mcfg.max_batch_size != 0 && mcfg.max_batch_size < cfg.max_batch_size {
        return Err(tern_core::messages::ensemble_batch_too_large(
            e,
            cfg.max_batch_size,
            &s.model_name,
            mcfg.max_batch_size,
            i,
        ));
    }
    if s.input_map.is_empty() || s.output_map.is_empty() {
        return Err(bad(format!(
            "{where_}: input_map and output_map must both be set"
        )));
    }
    let inputs = sorted_pairs(&s.input_map);
    for (key, _) in &inputs {
        if !mcfg.input.iter().any(|x| &x.name == key) {
            return Err(bad(format!(
                "{where_}: input_map names input '{key}', which the model does not have"
            )));
        }
    }
    if let Some(missing) = mcfg
        .input
        .iter()
        .find(|x| !x.optional && !s.input_map.contains_key(&x.name))
    {
        return Err(bad(format!(
            "{where_}: required input '{}' is not in input_map",
            missing.name
        )));
    }
    let outputs = sorted_pairs(&s.output_map);
    for (key, tensor) in &outputs {
        let Some(spec) = mcfg.output.iter().find(|x| &x.name == key) else {
            return Err(bad(format!(
                "{where_}: output_map names output '{key}', which the model does not have"
            )));
        };
        if let Some(prev) = sources.get(tensor) {
            return Err(bad(format!(
                "tensor '{tensor}' is produced more than once ({} and {where_} output '{key}')",
                prev.what
            )));
        }
        sources.insert(
            tensor.clone(),
            Source {
                step: Some(i),
                dtype: spec.data_type,
                dims: spec.dims.clone(),
                shape: full_shape(mcfg, &spec.dims),
                what: format!("{where_} output '{key}'"),
            },
        );
    }
    let input_dims = inputs
        .iter()
        .map(|(key, _)| {
            mcfg.input
                .iter()
                .find(|x| &x.name == key)
                .map(|x| x.dims.clone())
                .unwrap_or_default()
        })
        .collect();
    Ok(Step {
        model: s.model_name.clone(),
        version,
        decoupled: mcfg
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled),
        follows: None,
        batching: mcfg.max_batch_size > 0,
        inputs,
        input_dims,
        outputs,
    })
}

/// Every edge: the consumer's declared input matches the tensor's producer.
fn check_edges(
    e: &str,
    steps: &[Step],
    configs: &[Arc<ModelConfig>],
    sources: &HashMap<String, Source>,
) -> Result<()> {
    let bad = |msg: String| invalid(e, msg);
    for (i, (step, mcfg)) in steps.iter().zip(configs).enumerate() {
        for (key, tensor) in &step.inputs {
            let spec = mcfg
                .input
                .iter()
                .find(|x| &x.name == key)
                .expect("checked above");
            let Some(src) = sources.get(tensor) else {
                return Err(bad(format!(
                    "step {i} (model '{}') input '{key}' reads tensor '{tensor}', which is neither an ensemble input nor produced by any step",
                    step.model
                )));
            };
            let want = full_shape(mcfg, &spec.dims);
            if src.dtype != spec.data_type {
                return Err(bad(format!(
                    "step {i} (model '{}') input '{key}' expects {}, but tensor '{tensor}' from {} is {}",
                    step.model,
                    config_name(spec.data_type),
                    src.what,
                    config_name(src.dtype)
                )));
            }
            if !shapes_agree(&src.dims, &src.shape, &spec.dims, &want) {
                return Err(bad(format!(
                    "ensemble tensor {tensor}: inconsistent shape: {} is inferred from {} while {} is inferred from model {} (step {i} input '{key}')",
                    shape_str(&src.shape),
                    src.what,
                    shape_str(&want),
                    step.model,
                )));
            }
        }
    }
    Ok(())
}

/// Every ensemble output is produced by a step, with its declared type and shape.
fn check_outputs(cfg: &ModelConfig, sources: &HashMap<String, Source>) -> Result<()> {
    let bad = |msg: String| invalid(&cfg.name, msg);
    for out in &cfg.output {
        let Some(src) = sources.get(&out.name).filter(|s| s.step.is_some()) else {
            return Err(bad(format!(
                "output '{}' is not produced by any step",
                out.name
            )));
        };
        let dims = io_dims(&out.dims, out.reshape.as_ref());
        let want = full_shape(cfg, &dims);
        if src.dtype != out.data_type || !shapes_agree(&src.dims, &src.shape, &dims, &want) {
            return Err(bad(format!(
                "output '{}' is declared as {} {}, but {} is {} {}",
                out.name,
                config_name(out.data_type),
                shape_str(&want),
                src.what,
                config_name(src.dtype),
                shape_str(&src.shape)
            )));
        }
    }
    Ok(())
}

/// No cycles: every step must become runnable from the ensemble inputs.
fn check_acyclic(cfg: &ModelConfig, steps: &[Step]) -> Result<()> {
    let mut available: HashSet<&str> = cfg.input.iter().map(|x| x.name.as_str()).collect();
    let mut done = vec![false; steps.len()];
    loop {
        let mut progressed = false;
        for (i, step) in steps.iter().enumerate() {
            if !done[i]
                && step
                    .inputs
                    .iter()
                    .all(|(_, t)| available.contains(t.as_str()))
            {
                done[i] = true;
                progressed = true;
                available.extend(step.outputs.iter().map(|(_, t)| t.as_str()));
            }
        }
        if !progressed {
            break;
        }
    }
    if let Some(stuck) = done.iter().position(|d| !d) {
        let stuck: Vec<String> = (stuck..steps.len())
            .filter(|&i| !done[i])
            .map(|i| format!("step {i} (model '{}')", steps[i].model))
            .collect();
        return Err(invalid(
            &cfg.name,
            format!(
                "the steps form a cycle and can never run: {}",
                stuck.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Works out, in DAG order, which decoupled step each step follows, checking
/// Triton's rule; returns the decoupled step the ensemble's outputs follow.
fn follow(e: &str, cfg: &ModelConfig, steps: &mut [Step]) -> Result<Option<usize>> {
    let mut origin: HashMap<String, Option<usize>> =
        cfg.input.iter().map(|i| (i.name.clone(), None)).collect();
    let mut done = vec![false; steps.len()];
    while let Some(i) = (0..steps.len())
        .find(|&i| !done[i] && steps[i].inputs.iter().all(|(_, t)| origin.contains_key(t)))
    {
        done[i] = true;
        let from: BTreeSet<usize> = steps[i]
            .inputs
            .iter()
            .filter_map(|(_, t)| origin[t])
            .collect();
        let m = &steps[i].model;
        if from.len() > 1 {
            return Err(tern_core::messages::ensemble_two_decoupled_origins(e, m));
        }
        let from = from.first().copied();
        if let (true, Some(d)) = (steps[i].decoupled, from) {
            return Err(Error::unsupported(format!(
                "ensemble '{e}': step {i} (model '{m}') is decoupled and follows the decoupled step {d} (model '{}'); \
                 a decoupled step after another is not supported yet",
                steps[d].model
            )));
        }
        steps[i].follows = from;
        let produces = if steps[i].decoupled { Some(i) } else { from };
        for (_, t) in &steps[i].outputs {
            origin.insert(t.clone(), produces);
        }
    }
    let outputs: BTreeSet<usize> = cfg
        .output
        .iter()
        .filter_map(|o| origin.get(&o.name).copied().flatten())
        .collect();
    if outputs.len() > 1 {
        return Err(Error::unsupported(format!(
            "ensemble '{e}': its outputs follow different decoupled steps; that is not supported yet"
        )));
    }
    Ok(outputs.first().copied())
}

/// Warns about ensemble inputs no step reads.
/// A step output that no step reads and that is not an ensemble output
/// fails the load, as Triton's `ensemble tensor 'T' is unused in ensemble 'E'`.
fn check_unused_tensors(cfg: &ModelConfig, steps: &[Step]) -> Result<()> {
    for step in steps {
        for (_, t) in &step.outputs {
            let read = steps.iter().any(|s| s.inputs.iter().any(|(_, i)| i == t));
            if !read && !cfg.output.iter().any(|o| &o.name == t) {
                return Err(Error::invalid_arg(format!(
                    "ensemble tensor '{t}' is unused in ensemble '{}'",
                    cfg.name
                )));
            }
        }
    }
    Ok(())
}

fn warn_unused_inputs(cfg: &ModelConfig, steps: &[Step]) {
    for input in &cfg.input {
        if !steps
            .iter()
            .any(|s| s.inputs.iter().any(|(_, t)| t == &input.name))
        {
            tracing::warn!(ensemble = %cfg.name, "input '{}' is not used by any step", input.name);
        }
    }
}
