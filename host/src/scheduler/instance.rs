//! A model instance apart from any scheduler (as Triton keeps
//! `TritonModelInstance` apart from its schedulers): which instances a
//! config asks for, creating one and running its warmup samples, and
//! running one batch on it with exactly one result per request. The
//! instance scheduler (`instances`) and the sequence batcher (`sequence`)
//! both build on these.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::stats::ComputeTimes;
use super::warmup;
use tern_core::backend::{DeviceKind, ExecTiming, Instance, InstanceSpec, Model};
use tern_core::config::pb::model_instance_group::Kind;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::{InferRequest, InferResponse};

/// The instances `config`'s `instance_group`s ask for, named `<group>_<i>`,
/// one per GPU for a `KIND_GPU` group.
pub(super) fn instance_specs(config: &ModelConfig, gpu_count: usize) -> Result<Vec<InstanceSpec>> {
    let mut specs = Vec::new();
    for group in &config.instance_group {
        let devices: Vec<DeviceKind> = if group.kind == Kind::Gpu as i32 {
            if gpu_count == 0 {
                // Triton answers this as an invalid argument too ("instance group ... specifies
                // invalid or unsupported gpu id"), so a load through the API gets a 400.
                return Err(Error::invalid_arg(format!(
                    "instance_group '{}' is KIND_GPU but no GPU is available on this machine \
                     (use KIND_CPU or KIND_AUTO)",
                    group.name
                ))
                .for_model(&config.name));
            }
            let gpus: Vec<i32> = if group.gpus.is_empty() {
                (0..gpu_count as i32).collect()
            } else {
                group.gpus.clone()
            };
            if let Some(g) = gpus.iter().find(|&&g| g < 0 || g as usize >= gpu_count) {
                return Err(Error::invalid_arg(format!(
                    "instance_group '{}' names GPU {g}, but only {gpu_count} GPU(s) exist",
                    group.name
                ))
                .for_model(&config.name));
            }
            gpus.into_iter().map(DeviceKind::Gpu).collect()
        } else {
            vec![DeviceKind::Cpu]
        };
        for device in devices {
            for i in 0..group.count.max(1) {
                specs.push(InstanceSpec {
                    name: format!("{}_{}", group.name, i),
                    device,
                });
            }
        }
    }
    Ok(specs)
}

/// Creates one instance and runs every warmup sample on it.
pub(super) fn create_instance(
    config: &ModelConfig,
    version: i64,
    model: &Arc<dyn Model>,
    spec: &InstanceSpec,
    samples: &[warmup::Sample],
) -> Result<Box<dyn Instance>> {
    let mut instance = model.create_instance(spec)?;
    for sample in samples {
        let started = Instant::now();
        for _ in 0..sample.count {
            let batch = std::slice::from_ref(&sample.request);
            let result = catch_unwind(AssertUnwindSafe(|| {
                instance.execute(batch, &mut ExecTiming::default())
            }));
            let failure = match result {
                Ok(mut r) if r.len() == 1 => r.pop().and_then(|r| r.err()),
                Ok(r) => Some(Error::internal(format!(
                    "backend returned {} responses for 1 request",
                    r.len()
                ))),
                Err(_) => Some(Error::internal("the backend panicked")),
            };
            if let Some(e) = failure {
                return Err(Error::new(
                    e.code,
                    format!(
                        "model '{}': warmup sample '{}' failed on instance '{}': {}",
                        config.name, sample.name, spec.name, e.message
                    ),
                ));
            }
        }
        tracing::info!(model = %config.name, version, instance = %spec.name, "warmup sample '{}' ran {} time(s) in {:?}", sample.name, sample.count, started.elapsed());
    }
    super::rate_limit::limit(config, spec, instance)
}

/// Creates and warms up every instance of every `instance_group`, named.
pub(super) fn create_all(
    config: &ModelConfig,
    version: i64,
    model: &Arc<dyn Model>,
    gpu_count: usize,
    model_dir: &Path,
) -> Result<Vec<(String, Box<dyn Instance>)>> {
    let samples = warmup::samples(config, model_dir)?;
    instance_specs(config, gpu_count)?
        .into_iter()
        .map(|spec| {
            let instance = create_instance(config, version, model, &spec, &samples)?;
            Ok((spec.name, instance))
        })
        .collect()
}

/// What one execution of a batch produced.
pub(super) struct Executed {
    /// One result per request, in order.
    pub results: Vec<Result<InferResponse>>,
    /// The execution's compute times, as the statistics split them.
    pub times: ComputeTimes,
    /// When the execution started.
    pub start: Instant,
}

/// Runs `requests` on `instance` as one batch: exactly one result per
/// request (a backend panic or a wrong count becomes an error for each).
pub(super) fn execute_batch(
    model: &str,
    name: &str,
    instance: &mut dyn Instance,
    requests: &[InferRequest],
) -> Executed {
    // The rate limiter's wait is queue time, not compute time.
    let admitted = instance.admit();
    let start = Instant::now();
    let mut timing = ExecTiming::default();
    let results = catch_unwind(AssertUnwindSafe(|| instance.execute(requests, &mut timing)));
    let end = Instant::now();
    drop(admitted);
    let results: Vec<Result<InferResponse>> = match results {
        Ok(r) if r.len() == requests.len() => r,
        Ok(r) => {
            let e = Error::internal(format!(
                "backend returned {} responses for {} requests",
                r.len(),
                requests.len()
            ))
            .for_model(model);
            requests.iter().map(|_| Err(e.clone())).collect()
        }
        Err(_) => {
            tracing::error!(model = %model, instance = %name, "backend panicked while executing a batch");
            let e =
                Error::internal("the backend failed while executing the request").for_model(model);
            requests.iter().map(|_| Err(e.clone())).collect()
        }
    };
    let input_done = timing.input_done.unwrap_or(start).clamp(start, end);
    let infer_done = timing.infer_done.unwrap_or(end).clamp(input_done, end);
    for (request, result) in requests.iter().zip(&results) {
        if let Some(trace) = &request.trace {
            trace.timestamp_at("COMPUTE_START", start);
            trace.timestamp_at("COMPUTE_INPUT_END", input_done);
            trace.timestamp_at("COMPUTE_OUTPUT_START", infer_done);
            trace.timestamp_at("COMPUTE_END", end);
            if let Ok(response) = result {
                trace.tensors("TENSOR_BACKEND_OUTPUT", &response.outputs);
            }
        }
    }
    Executed {
        results,
        times: ComputeTimes {
            input: input_done - start,
            infer: infer_done - input_done,
            output: end - infer_done,
        },
        start,
    }
}

/// The error of a request a version can no longer serve (unloaded, replaced).
pub(super) fn gone_error(model: &str, version: i64) -> Error {
    Error::unavailable(format!(
        "model '{model}' version {version} is no longer available"
    ))
}
