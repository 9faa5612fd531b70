//! Ensembles (`platform: "ensemble"` with `ensemble_scheduling`): the step
//! DAG, checked once at load against the composing models' configs, and its
//! execution per request. A step starts as soon as all of its inputs exist;
//! each step is an ordinary request to the composing model's scheduler, so
//! many requests' preprocessing feeds that model's dynamic batcher. Tensors
//! move between steps by reference (their data are shared `Bytes`).

use std::collections::{HashMap, HashSet};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::Poll;

use crate::config::pb::{self, ModelConfig};
use crate::core::dtype::config_name;
use crate::core::request::ComputeTimes;
use crate::core::tensor::shape_str;
use crate::core::{InferRequest, InferResponse, RequestedOutput, Tensor};
use crate::error::{Error, Result};
use crate::repository::Repository;

/// Whether a config describes an ensemble.
pub fn is_ensemble(cfg: &ModelConfig) -> bool {
    cfg.platform == "ensemble"
        || matches!(
            cfg.scheduling_choice,
            Some(pb::model_config::SchedulingChoice::EnsembleScheduling(_))
        )
}

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

type StepFuture = Pin<Box<dyn Future<Output = Result<InferResponse>> + Send>>;

/// One step's request to its model, boxed: an ensemble's step may itself be
/// an ensemble, and the explicit type ends the recursion of future types.
fn step_call(handle: Arc<crate::scheduler::ModelHandle>, request: InferRequest) -> StepFuture {
    Box::pin(async move { handle.infer(request).await })
}

/// One step after validation.
#[derive(Debug)]
struct Step {
    model: String,
    version: Option<i64>,
    /// (composing model input, ensemble tensor).
    inputs: Vec<(String, String)>,
    /// (composing model output, ensemble tensor).
    outputs: Vec<(String, String)>,
}

/// A validated ensemble, ready to run requests.
pub struct Ensemble {
    name: String,
    steps: Vec<Step>,
    outputs: Vec<String>,
    models: Weak<Repository>,
}

/// Where an ensemble tensor comes from.
#[derive(Clone)]
struct Source {
    /// `None` = an ensemble input.
    step: Option<usize>,
    dtype: i32,
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

fn shapes_agree(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| *x == -1 || *y == -1 || x == y)
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
        models: Weak<Repository>,
    ) -> Result<Ensemble> {
        check_config(cfg)?;
        let e = &cfg.name;
        let bad = |msg: String| Error::invalid_arg(format!("ensemble '{e}': {msg}"));
        let mut sources: HashMap<String, Source> = HashMap::new();
        for input in &cfg.input {
            sources.insert(
                input.name.clone(),
                Source {
                    step: None,
                    dtype: input.data_type,
                    shape: full_shape(cfg, &input.dims),
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
            if cfg.max_batch_size > 0 && mcfg.max_batch_size < cfg.max_batch_size {
                return Err(bad(format!(
                    "{where_}: max_batch_size {} is smaller than the ensemble's max_batch_size {}",
                    mcfg.max_batch_size, cfg.max_batch_size
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
                        shape: full_shape(&mcfg, &spec.dims),
                        what: format!("{where_} output '{key}'"),
                    },
                );
            }
            steps.push(Step {
                model: s.model_name.clone(),
                version,
                inputs,
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
                if !shapes_agree(&src.shape, &want) {
                    return Err(bad(format!(
                        "step {i} (model '{}') input '{key}' expects shape {}, but tensor '{tensor}' from {} has shape {}",
                        step.model,
                        shape_str(&want),
                        src.what,
                        shape_str(&src.shape)
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
            let want = full_shape(cfg, &out.dims);
            if src.dtype != out.data_type || !shapes_agree(&src.shape, &want) {
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
            steps,
            outputs: cfg.output.iter().map(|o| o.name.clone()).collect(),
            models,
        })
    }

    /// Runs one (validated) request through the DAG and returns the ensemble's outputs.
    pub async fn run(&self, request: InferRequest) -> Result<InferResponse> {
        let e = &self.name;
        let repo = self.models.upgrade().ok_or_else(|| {
            Error::unavailable(format!("ensemble '{e}': the server is shutting down"))
        })?;
        let mut tensors: HashMap<String, Tensor> = request
            .inputs
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        let mut callers = request.callers;
        callers.push(e.clone());
        let mut started = vec![false; self.steps.len()];
        let mut running: Vec<(usize, StepFuture)> = Vec::new();
        let mut compute = ComputeTimes::default();
        loop {
            for (i, step) in self.steps.iter().enumerate() {
                if started[i] || !step.inputs.iter().all(|(_, t)| tensors.contains_key(t)) {
                    continue;
                }
                started[i] = true;
                let handle = repo
                    .get(&step.model, step.version)
                    .map_err(|err| self.step_error(i, err))?;
                let sub = InferRequest {
                    model_name: step.model.clone(),
                    model_version: step.version,
                    id: request.id.clone(),
                    inputs: step
                        .inputs
                        .iter()
                        .map(|(key, t)| {
                            let mut tensor = tensors[t].clone();
                            tensor.name = key.clone();
                            tensor
                        })
                        .collect(),
                    outputs: step
                        .outputs
                        .iter()
                        .map(|(key, _)| RequestedOutput {
                            name: key.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    parameters: request.parameters.clone(),
                    callers: callers.clone(),
                };
                running.push((i, step_call(handle, sub)));
            }
            if running.is_empty() {
                break;
            }
            let (k, result) = poll_fn(|cx| {
                for (k, (_, fut)) in running.iter_mut().enumerate() {
                    if let Poll::Ready(r) = fut.as_mut().poll(cx) {
                        return Poll::Ready((k, r));
                    }
                }
                Poll::Pending
            })
            .await;
            let (i, _) = running.swap_remove(k);
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
                tensors.insert(t.clone(), tensor);
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
            .map(|name| {
                tensors.remove(name).ok_or_else(|| {
                    Error::internal(format!("ensemble '{e}': output '{name}' was not produced"))
                })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_pbtxt;

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
            Weak::new(),
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
            m.contains("smaller than the ensemble's max_batch_size 16"),
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
