//! Ensembles (`platform: "ensemble"` with `ensemble_scheduling`): the step
//! DAG, checked once at load against the composing models' configs, and its
//! execution per request. A step starts as soon as all of its inputs exist;
//! each step is an ordinary request to the composing model's scheduler, so
//! many requests' preprocessing feeds that model's dynamic batcher. Tensors
//! move between steps by reference (their data are shared `Bytes`). An
//! ensemble with a decoupled step is itself decoupled ([`decoupled`]).

mod decoupled;

use std::collections::{HashMap, HashSet};
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Instant;

use super::policy::BatchPolicy;
use super::stats::{FailReason, ModelStats};
use tern_core::config::pb::{self, ModelConfig};
use tern_core::dtype::config_name;
use tern_core::error::{Error, Result};
use tern_core::request::ComputeTimes;
use tern_core::router::{InferFuture, ModelRouter};
use tern_core::tensor::shape_str;
use tern_core::{InferRequest, InferResponse, Tensor};

/// The models an ensemble's steps call (for load ordering).
pub fn composing_models(cfg: &ModelConfig) -> Vec<String> {
    steps_of(cfg).iter().map(|s| s.model_name.clone()).collect()
}

fn steps_of(cfg: &ModelConfig) -> &[pb::model_ensembling::Step] {
    match &cfg.scheduling_choice {
        Some(pb::model_config::SchedulingChoice::EnsembleScheduling(e)) => &e.step,
        _ => &[],
    }
}

/// Checks the parts of an ensemble config that need no composing model:
/// platform and scheduling agree, no instances, batching or warmup.
pub fn check_config(cfg: &ModelConfig) -> Result<()> {
    let m = &cfg.name;
    let err = |msg: &str| Err(Error::invalid_arg(format!("ensemble '{m}': {msg}")));
    if cfg.platform != "ensemble" {
        return err("ensemble_scheduling requires platform: \"ensemble\"");
    }
    if !matches!(
        cfg.scheduling_choice,
        Some(pb::model_config::SchedulingChoice::EnsembleScheduling(_))
    ) {
        return err("platform \"ensemble\" requires an ensemble_scheduling section (dynamic_batching and sequence_batching do not apply)");
    }
    if steps_of(cfg).is_empty() {
        return err("ensemble_scheduling must have at least one step");
    }
    if !cfg.instance_group.is_empty() {
        return err("instance_group does not apply to ensembles (each composing model has its own instances)");
    }
    if !cfg.model_warmup.is_empty() {
        return err("model_warmup does not apply to ensembles (warm up the composing models)");
    }
    if !cfg.backend.is_empty() {
        return err("an ensemble has no backend");
    }
    Ok(())
}

/// One step after validation.
#[derive(Debug)]
struct Step {
    model: String,
    version: Option<i64>,
    /// The composing model is decoupled (its responses stream).
    decoupled: bool,
    /// The decoupled step whose responses this step runs once per (`None`:
    /// it runs once per request).
    follows: Option<usize>,
    /// Whether the composing model batches (`max_batch_size > 0`).
    batching: bool,
    /// (composing model input, ensemble tensor).
    inputs: Vec<(String, String)>,
    /// The composing model's `dims` of each input (same order as `inputs`).
    input_dims: Vec<Vec<i64>>,
    /// (composing model output, ensemble tensor).
    outputs: Vec<(String, String)>,
}

/// A validated ensemble, ready to run requests.
pub struct Ensemble {
    name: String,
    /// Whether the ensemble batches (`max_batch_size > 0`).
    batching: bool,
    steps: Vec<Step>,
    outputs: Vec<String>,
    /// The ensemble's shape of each output (`reshape`, else `dims`).
    output_dims: Vec<Vec<i64>>,
    /// The `dims` of each output that has a `reshape` (what clients see).
    output_unreshape: Vec<Option<Vec<i64>>>,
    models: Weak<dyn ModelRouter>,
    /// The decoupled step whose responses the ensemble's outputs follow: one
    /// ensemble response per response of it.
    streams_from: Option<usize>,
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
fn dims_agree(a: &[i64], b: &[i64]) -> bool {
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

/// `dims` (after `batch`, when given) with a variable dim resolved from the
/// element count.
fn with_dims(dims: &[i64], batch: Option<i64>, elements: usize) -> Vec<i64> {
    let mut shape: Vec<i64> = batch.into_iter().chain(dims.iter().copied()).collect();
    let fixed = shape
        .iter()
        .filter(|&&d| d >= 0)
        .fold(1i64, |n, &d| n.saturating_mul(d))
        .max(1);
    if let Some(pos) = shape.iter().position(|&d| d < 0) {
        shape[pos] = elements as i64 / fixed;
        for d in shape.iter_mut().skip(pos + 1) {
            if *d < 0 {
                *d = 1;
            }
        }
    }
    shape
}

/// Triton's `ReshapeTensorDims`: converts a tensor between a batching and a
/// non-batching model at an ensemble edge. `batch` is the batch size of the
/// request that produced the tensor (0 when that model does not batch).
/// A tensor from a non-batching producer that matches the consumer's dims
/// gets a batch dimension of 1; a batched tensor of batch size 1 that does
/// not match a non-batching consumer's dims loses its batch dimension;
/// anything else passes as it is.
fn convert_for(config_dims: &[i64], batching: bool, batch: usize, shape: &[i64]) -> Vec<i64> {
    if batching != (batch != 0) {
        if batching {
            if dims_agree(config_dims, shape) {
                return std::iter::once(1).chain(shape.iter().copied()).collect();
            }
        } else if !dims_agree(config_dims, shape) && batch == 1 && !shape.is_empty() {
            return shape[1..].to_vec();
        }
    }
    shape.to_vec()
}

impl Ensemble {
    /// Validates the DAG against the composing models' configs (`lookup`
    /// returns the config of a ready model version, `None` = latest): every
    /// mapped name exists, each tensor is produced once, every step's inputs
    /// can be produced, there are no cycles, and data types and shapes agree
    /// along every edge.
    pub fn build(
        cfg: &ModelConfig,
        lookup: impl Fn(&str, Option<i64>) -> Result<Arc<ModelConfig>>,
        models: Weak<dyn ModelRouter>,
    ) -> Result<Ensemble> {
        check_config(cfg)?;
        let e = &cfg.name;
        let bad = |msg: String| Error::invalid_arg(format!("ensemble '{e}': {msg}"));
        let mut sources: HashMap<String, Source> = HashMap::new();
        for input in &cfg.input {
            // The steps see an ensemble input after its reshape.
            let dims = io_dims(&input.dims, input.reshape.as_ref());
            sources.insert(
                input.name.clone(),
                Source {
                    step: None,
                    dtype: input.data_type,
                    shape: full_shape(cfg, &dims),
                    dims,
                    what: format!("ensemble input '{}'", input.name),
                },
            );
        }
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
            let where_ = format!("step {i} (model '{}')", s.model_name);
            // As Triton: a non-batching step (max_batch_size 0) is not compared.
            if mcfg.max_batch_size != 0 && mcfg.max_batch_size < cfg.max_batch_size {
                return Err(Error::invalid_arg(format!(
                    "ensemble {e} allows maximum batch size {}, but it contains model {} which only allows maximum batch size to be {} (step {i})",
                    cfg.max_batch_size, s.model_name, mcfg.max_batch_size
                )));
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
                        shape: full_shape(&mcfg, &spec.dims),
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
            steps.push(Step {
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
            });
            configs.push(mcfg);
        }
        // Every edge: the consumer's declared input matches the producer.
        for (i, (step, mcfg)) in steps.iter().zip(&configs).enumerate() {
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
        // No cycles: every step must become runnable from the ensemble inputs.
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
            return Err(bad(format!(
                "the steps form a cycle and can never run: {}",
                stuck.join(", ")
            )));
        }
        let streams_from = decoupled::follow(e, cfg, &mut steps)?;
        for input in &cfg.input {
            if !steps
                .iter()
                .any(|s| s.inputs.iter().any(|(_, t)| t == &input.name))
            {
                tracing::warn!(ensemble = %e, "input '{}' is not used by any step", input.name);
            }
        }
        Ok(Ensemble {
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
            models,
            streams_from,
        })
    }

    /// Whether a step is decoupled, which makes the ensemble decoupled too.
    pub fn decoupled(&self) -> bool {
        self.steps.iter().any(|s| s.decoupled)
    }

    /// Each ensemble output with the step model (and version) and that
    /// model's output producing it, so classification can use the composing
    /// model's labels when the ensemble has none of its own.
    pub fn output_producers(&self) -> Vec<(&str, &str, Option<i64>, &str)> {
        let mut out = Vec::new();
        for name in &self.outputs {
            for step in &self.steps {
                if let Some((key, _)) = step.outputs.iter().find(|(_, t)| t == name) {
                    out.push((
                        name.as_str(),
                        step.model.as_str(),
                        step.version,
                        key.as_str(),
                    ));
                }
            }
        }
        out
    }

    /// Runs one (validated) request through the DAG and returns the ensemble's outputs.
    pub async fn run(&self, request: InferRequest) -> Result<InferResponse> {
        let e = &self.name;
        let (router, input_batch) = self.start(&request)?;
        let mut tensors: HashMap<String, (Tensor, usize)> = request
            .inputs
            .into_iter()
            .map(|t| (t.name.clone(), (t, input_batch)))
            .collect();
        let mut callers = request.callers;
        callers.push(e.clone());
        let mut started = vec![false; self.steps.len()];
        let mut running: Vec<(usize, usize, InferFuture)> = Vec::new();
        let mut compute = ComputeTimes::default();
        loop {
            for (i, step) in self.steps.iter().enumerate() {
                if started[i] || !step.inputs.iter().all(|(_, t)| tensors.contains_key(t)) {
                    continue;
                }
                started[i] = true;
                let meta = (request.id.as_str(), &request.parameters);
                let (sub, step_batch) = self.step_request(i, meta, &callers, |t| &tensors[t]);
                let call = router.infer(sub).map_err(|err| self.step_error(i, err))?;
                running.push((i, step_batch, call));
            }
            if running.is_empty() {
                break;
            }
            let (k, result) = poll_fn(|cx| {
                for (k, (_, _, fut)) in running.iter_mut().enumerate() {
                    if let Poll::Ready(r) = fut.as_mut().poll(cx) {
                        return Poll::Ready((k, r));
                    }
                }
                Poll::Pending
            })
            .await;
            let (i, step_batch, _) = running.swap_remove(k);
            let response = result.map_err(|err| self.step_error(i, err))?;
            compute += response.compute;
            let mut outputs = response.outputs;
            for (key, t) in &self.steps[i].outputs {
                let pos = outputs.iter().position(|o| &o.name == key).ok_or_else(|| {
                    self.step_error(
                        i,
                        Error::internal(format!("the model did not return output '{key}'")),
                    )
                })?;
                let mut tensor = outputs.swap_remove(pos);
                tensor.name = t.clone();
                tensors.insert(t.clone(), (tensor, step_batch));
            }
        }
        if let Some(i) = started.iter().position(|s| !s) {
            let missing: Vec<&str> = self.steps[i]
                .inputs
                .iter()
                .filter(|(_, t)| !tensors.contains_key(t))
                .map(|(_, t)| t.as_str())
                .collect();
            return Err(self.step_error(
                i,
                Error::invalid_arg(format!(
                    "the step cannot run: tensor(s) {} were not provided",
                    missing.join(", ")
                )),
            ));
        }
        let outputs = self
            .outputs
            .iter()
            .zip(self.output_dims.iter().zip(&self.output_unreshape))
            .map(|(name, (dims, unreshape))| {
                let (mut tensor, batch) = tensors.remove(name).ok_or_else(|| {
                    Error::internal(format!("ensemble '{e}': output '{name}' was not produced"))
                })?;
                tensor.shape = convert_for(dims, self.batching, batch, &tensor.shape);
                if let Some(config_dims) = unreshape {
                    // A reshaped output is returned with its configured dims.
                    let batch = self
                        .batching
                        .then(|| tensor.shape.first().copied().unwrap_or(1));
                    tensor.shape = with_dims(config_dims, batch, tensor.element_count());
                }
                Ok(tensor)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(InferResponse {
            model_name: e.clone(),
            model_version: 0,
            id: request.id,
            outputs,
            parameters: Default::default(),
            compute,
        })
    }

    /// The router to run the steps through, and the batch size of the
    /// request's inputs: each tensor carries the batch size of the request
    /// that produced it (0 when that model does not batch), for Triton's
    /// batch conversions.
    fn start(&self, request: &InferRequest) -> Result<(Arc<dyn ModelRouter>, usize)> {
        let router = self.models.upgrade().ok_or_else(|| {
            Error::unavailable(format!(
                "ensemble '{}': the server is shutting down",
                self.name
            ))
        })?;
        let input_batch = if self.batching {
            request
                .inputs
                .first()
                .and_then(|t| t.shape.first())
                .map_or(0, |&b| b.max(0) as usize)
        } else {
            0
        };
        Ok((router, input_batch))
    }

    fn step_error(&self, i: usize, err: Error) -> Error {
        Error::new(
            err.code,
            format!(
                "ensemble '{}' step {i} (model '{}'): {}",
                self.name, self.steps[i].model, err.message
            ),
        )
    }
}

/// The ensemble scheduler: no instances or queue of its own; each request
/// runs the step DAG, every step through its composing model's scheduler.
pub struct EnsembleScheduler {
    config: Arc<ModelConfig>,
    version: i64,
    ensemble: Ensemble,
    policy: BatchPolicy,
    stats: ModelStats,
    closed: AtomicBool,
}

impl EnsembleScheduler {
    /// Serves `ensemble` as version `version` of `config`.
    pub fn new(
        config: Arc<ModelConfig>,
        version: i64,
        ensemble: Ensemble,
        summaries: bool,
    ) -> Result<Self> {
        Ok(EnsembleScheduler {
            policy: BatchPolicy::from_config(&config, false)?,
            config,
            version,
            ensemble,
            stats: ModelStats::new(summaries),
            closed: AtomicBool::new(false),
        })
    }

    /// Runs a validated request through the ensemble DAG and records its statistics.
    pub async fn schedule(
        &self,
        mut request: InferRequest,
        batch_size: usize,
        arrived: Instant,
    ) -> Result<InferResponse> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::unavailable(format!(
                "model '{}' version {} is no longer available",
                self.config.name, self.version
            )));
        }
        // A caller that stops waiting (client cancelled, connection closed) drops this future
        // between steps: no further step starts, and the ensemble counts the request as cancelled.
        let mut cancelled = CancelGuard {
            stats: &self.stats,
            arrived,
            armed: true,
        };
        let result = match request.responder.take() {
            Some(sink) if self.ensemble.decoupled() => self
                .ensemble
                .run_decoupled(request, &sink, &self.config, self.version, batch_size)
                .await
                .map(|()| InferResponse {
                    model_name: self.config.name.clone(),
                    ..Default::default()
                }),
            _ => self.ensemble.run(request).await,
        };
        cancelled.armed = false;
        let result = result.and_then(|mut r| {
            tern_core::validate::validate_outputs(&self.config, batch_size, &r.outputs)?;
            r.model_version = self.version;
            Ok(r)
        });
        match &result {
            Ok(r) => self
                .stats
                .record_request(batch_size, arrived.elapsed(), r.compute),
            Err(_) => self
                .stats
                .record_failure(arrived.elapsed(), FailReason::Other),
        }
        result
    }

    /// The request placement rules (priority levels, timeouts) of the ensemble.
    pub fn policy(&self) -> &BatchPolicy {
        &self.policy
    }

    /// Statistics of this version.
    pub fn stats(&self) -> &ModelStats {
        &self.stats
    }

    /// Refuses further requests (running ones finish).
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

/// Counts a request as cancelled if its future is dropped while still armed.
struct CancelGuard<'a> {
    stats: &'a ModelStats,
    arrived: Instant,
    armed: bool,
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.stats
                .record_failure(self.arrived.elapsed(), FailReason::Canceled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    fn cfg(text: &str) -> ModelConfig {
        parse_pbtxt(text).expect("config parses")
    }

    fn models() -> HashMap<String, Arc<ModelConfig>> {
        let mut m = HashMap::new();
        m.insert(
            "pre".into(),
            Arc::new(cfg(r#"name: "pre" max_batch_size: 8
                input [{name: "RAW" data_type: TYPE_STRING dims: [1]}]
                output [{name: "IDS" data_type: TYPE_INT64 dims: [-1]},
                        {name: "MASK" data_type: TYPE_INT64 dims: [-1]}]"#)),
        );
        m.insert(
            "net".into(),
            Arc::new(cfg(r#"name: "net" max_batch_size: 8
                input [{name: "input_ids" data_type: TYPE_INT64 dims: [-1]},
                       {name: "attention_mask" data_type: TYPE_INT64 dims: [-1]}]
                output [{name: "hidden" data_type: TYPE_FP32 dims: [-1, 4]}]"#)),
        );
        for (name, text) in [
            (
                "ident_nobatch",
                r#"name: "ident_nobatch" max_batch_size: 0
                input [{name: "INPUT0" data_type: TYPE_FP32 dims: [-1, -1]}]
                output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1, -1]}]"#,
            ),
            (
                "ident_batch",
                r#"name: "ident_batch" max_batch_size: 8
                input [{name: "INPUT0" data_type: TYPE_FP32 dims: [-1]}]
                output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1]}]"#,
            ),
            (
                "ident_412",
                r#"name: "ident_412" max_batch_size: 8
                input [{name: "INPUT0" data_type: TYPE_FP32 dims: [4, 1, 2]}]
                output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [4, 1, 2]}]"#,
            ),
        ] {
            m.insert(name.into(), Arc::new(cfg(text)));
        }
        m.insert(
            "loop".into(),
            Arc::new(cfg(r#"name: "loop" max_batch_size: 8
                input [{name: "X" data_type: TYPE_INT64 dims: [-1]}]
                output [{name: "Y" data_type: TYPE_INT64 dims: [-1]}]"#)),
        );
        m
    }

    fn build(text: &str) -> Result<Ensemble> {
        let m = models();
        Ensemble::build(
            &cfg(text),
            |name, _| {
                m.get(name)
                    .cloned()
                    .ok_or_else(|| Error::not_found(format!("no model '{name}'")))
            },
            tern_core::router::unrouted(),
        )
    }

    const HEAD: &str = r#"name: "e" platform: "ensemble" max_batch_size: 4
        input [{name: "TEXT" data_type: TYPE_STRING dims: [1]}]
        output [{name: "OUT" data_type: TYPE_FP32 dims: [-1, 4]}]"#;

    fn with_steps(steps: &str) -> String {
        format!("{HEAD} ensemble_scheduling {{ step [ {steps} ] }}")
    }

    const PRE: &str = r#"{model_name: "pre" model_version: -1
        input_map {key: "RAW" value: "TEXT"}
        output_map [{key: "IDS" value: "ids"}, {key: "MASK" value: "mask"}]}"#;
    const NET: &str = r#"{model_name: "net" model_version: -1
        input_map [{key: "input_ids" value: "ids"}, {key: "attention_mask" value: "mask"}]
        output_map {key: "hidden" value: "OUT"}}"#;

    fn message(text: &str) -> String {
        match build(text) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.message,
        }
    }

    fn over(model: &str, head: &str) -> String {
        format!(
            r#"name: "e" platform: "ensemble" {head}
            ensemble_scheduling {{ step [ {{model_name: "{model}" model_version: -1
              input_map {{key: "INPUT0" value: "IN"}} output_map {{key: "OUTPUT0" value: "OUT"}}}} ] }}"#
        )
    }

    #[test]
    fn batching_and_non_batching_steps_mix_as_in_triton() {
        // A batching ensemble over a non-batching step.
        build(&over(
            "ident_nobatch",
            r#"max_batch_size: 8 input [{name: "IN" data_type: TYPE_FP32 dims: [16]}]
               output [{name: "OUT" data_type: TYPE_FP32 dims: [16]}]"#,
        ))
        .unwrap();
        // A non-batching ensemble over a batching step.
        build(&over(
            "ident_batch",
            r#"max_batch_size: 0 input [{name: "IN" data_type: TYPE_FP32 dims: [16]}]
               output [{name: "OUT" data_type: TYPE_FP32 dims: [16]}]"#,
        ))
        .unwrap();
        // The steps see an ensemble input after its reshape.
        build(&over(
            "ident_412",
            r#"max_batch_size: 8 input [{name: "IN" data_type: TYPE_FP32 dims: [8] reshape { shape: [4, 1, 2] }}]
               output [{name: "OUT" data_type: TYPE_FP32 dims: [4, 1, 2]}]"#,
        ))
        .unwrap();
        let m = message(&over(
            "ident_412",
            r#"max_batch_size: 8 input [{name: "IN" data_type: TYPE_FP32 dims: [8]}]
               output [{name: "OUT" data_type: TYPE_FP32 dims: [4, 1, 2]}]"#,
        ));
        assert!(
            m.contains("ensemble tensor IN: inconsistent shape: [-1,8]"),
            "{m}"
        );
    }

    #[test]
    fn batch_conversion_at_edges() {
        // Non-batching producer, batching consumer whose dims match: batch 1 in front.
        assert_eq!(convert_for(&[-1], true, 0, &[16]), vec![1, 16]);
        // Already batched-looking: unchanged.
        assert_eq!(convert_for(&[-1], true, 0, &[2, 16]), vec![2, 16]);
        // Batched producer, non-batching consumer taking the whole tensor.
        assert_eq!(convert_for(&[-1, -1], false, 3, &[3, 16]), vec![3, 16]);
        // Batch size 1 that the non-batching consumer cannot take whole: strip it.
        assert_eq!(convert_for(&[16], false, 1, &[1, 16]), vec![16]);
        // Same batching on both sides: unchanged.
        assert_eq!(convert_for(&[16], true, 2, &[2, 16]), vec![2, 16]);
        // A reshaped output goes back to its dims.
        assert_eq!(with_dims(&[8], Some(3), 24), vec![3, 8]);
        assert_eq!(with_dims(&[-1, 2], None, 8), vec![4, 2]);
    }

    #[test]
    fn valid_dag_in_any_step_order() {
        let e = build(&with_steps(&format!("{PRE}, {NET}"))).expect("valid");
        assert_eq!(e.steps.len(), 2);
        build(&with_steps(&format!("{NET}, {PRE}"))).expect("order does not matter");
    }

    #[test]
    fn dag_errors_name_the_problem() {
        let m = message(&with_steps(NET));
        assert!(
            m.contains("reads tensor 'mask', which is neither an ensemble input"),
            "{m}"
        );
        let m = message(&with_steps(&format!("{PRE}, {PRE}, {NET}")));
        assert!(m.contains("'ids' is produced more than once"), "{m}");
        let m = message(&with_steps(&format!(
            "{PRE}, {}",
            NET.replace("\"net\"", "\"absent\"")
        )));
        assert!(
            m.contains("step 1: composing model 'absent' is not available"),
            "{m}"
        );
        let m = message(&with_steps(&format!(
            "{PRE}, {}",
            NET.replace("input_ids", "x")
        )));
        assert!(m.contains("names input 'x'"), "{m}");
        let m = message(&with_steps(&format!(
            "{PRE}, {}",
            NET.replace(", {key: \"attention_mask\" value: \"mask\"}", "")
        )));
        assert!(m.contains("required input 'attention_mask'"), "{m}");
        let m = message(&with_steps(PRE));
        assert!(m.contains("output 'OUT' is not produced"), "{m}");
        let m = message(&with_steps(&format!(
            "{}, {NET}",
            PRE.replace("\"TEXT\"", "\"hidden_loop\"")
        )));
        assert!(m.contains("neither an ensemble input"), "{m}");
    }

    #[test]
    fn dtype_shape_and_batch_mismatches_are_rejected() {
        let text = with_steps(&format!("{PRE}, {NET}")).replace(
            "name: \"OUT\" data_type: TYPE_FP32",
            "name: \"OUT\" data_type: TYPE_FP16",
        );
        let m = message(&text);
        assert!(m.contains("declared as TYPE_FP16"), "{m}");
        let text = with_steps(&format!("{PRE}, {NET}")).replace("dims: [-1, 4]", "dims: [-1, 5]");
        let m = message(&text);
        assert!(m.contains("output 'OUT'"), "{m}");
        let text =
            with_steps(&format!("{PRE}, {NET}")).replace("max_batch_size: 4", "max_batch_size: 16");
        let m = message(&text);
        assert!(
            m.contains("ensemble e allows maximum batch size 16, but it contains model pre which only allows maximum batch size to be 8"),
            "{m}"
        );
        let text = with_steps(&format!("{PRE}, {NET}")).replace(
            "data_type: TYPE_STRING dims: [1]",
            "data_type: TYPE_INT32 dims: [1]",
        );
        let m = message(&text);
        assert!(m.contains("expects TYPE_STRING, but tensor 'TEXT'"), "{m}");
    }

    #[test]
    fn cycles_are_rejected() {
        // Two steps that each wait for the other's output.
        let a = r#"{model_name: "loop" input_map {key: "X" value: "a"} output_map {key: "Y" value: "b"}}"#;
        let b = r#"{model_name: "loop" input_map {key: "X" value: "b"} output_map {key: "Y" value: "a"}}"#;
        let m = message(&with_steps(&format!("{PRE}, {a}, {b}, {NET}")));
        assert!(
            m.contains("cycle") && m.contains("step 1 (model 'loop'), step 2"),
            "{m}"
        );
    }

    #[test]
    fn ensemble_only_settings() {
        let text = with_steps(&format!("{PRE}, {NET}"));
        let mut c = cfg(&text);
        c.instance_group.push(Default::default());
        assert!(check_config(&c)
            .unwrap_err()
            .message
            .contains("instance_group"));
        let mut c = cfg(&text);
        c.platform.clear();
        assert!(check_config(&c).unwrap_err().message.contains("platform"));
        let c = cfg(HEAD);
        let mut c2 = c.clone();
        c2.platform = "ensemble".into();
        assert!(check_config(&c2)
            .unwrap_err()
            .message
            .contains("ensemble_scheduling"));
    }
}
