//! Ensembles (`platform: "ensemble"` with `ensemble_scheduling`): the step
//! DAG, checked once at load against the composing models' configs
//! ([`plan`]), and its execution per request ([`run`], one runner for
//! unary and streaming ensembles). A step starts as soon as all of its
//! inputs exist; each step is an ordinary request to the composing model's
//! scheduler, so many requests' preprocessing feeds that model's dynamic
//! batcher. Tensors move between steps by reference (their data are shared
//! `Bytes`). An ensemble with a decoupled step is itself decoupled.

mod plan;
mod run;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::policy::BatchPolicy;
use super::stats::{FailReason, ModelStats};
use plan::{dims_agree, Plan};
use tern_core::config::pb::{self, ModelConfig};
use tern_core::error::{Error, Result};
use tern_core::router::ModelRouter;
use tern_core::{InferRequest, InferResponse};

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

/// A validated ensemble, ready to run requests.
pub struct Ensemble {
    plan: Plan,
    models: Weak<dyn ModelRouter>,
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
    /// Validates the ensemble `cfg` against its composing models' configs
    /// (`lookup`: the config of a ready model version, `None` = latest); its
    /// steps will run through `models`.
    pub fn build(
        cfg: &ModelConfig,
        lookup: impl Fn(&str, Option<i64>) -> Result<Arc<ModelConfig>>,
        models: Weak<dyn ModelRouter>,
    ) -> Result<Ensemble> {
        Ok(Ensemble {
            plan: plan::plan(cfg, lookup)?,
            models,
        })
    }

    /// Whether a step is decoupled, which makes the ensemble decoupled too.
    pub fn decoupled(&self) -> bool {
        self.plan.steps.iter().any(|s| s.decoupled)
    }

    /// Each ensemble output with the step model (and version) and that
    /// model's output producing it, so classification can use the composing
    /// model's labels when the ensemble has none of its own.
    pub fn output_producers(&self) -> Vec<(&str, &str, Option<i64>, &str)> {
        let mut out = Vec::new();
        for name in &self.plan.outputs {
            for step in &self.plan.steps {
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
                .map(|compute| InferResponse {
                    model_name: self.config.name.clone(),
                    compute,
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
    use std::collections::HashMap;
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
        assert_eq!(e.plan.steps.len(), 2);
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
