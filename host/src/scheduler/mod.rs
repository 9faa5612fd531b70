//! Scheduling: a loaded model version ([`ModelHandle`]) validates each
//! request against its config and hands it to its scheduler; the schedulers
//! are peers behind one [`Scheduler`] choice, each in its own module:
//!
//! * [`instances`]: the version's own instances (OS threads) serving one
//!   queue, with the default scheduler or Triton's dynamic batcher
//!   ([`queue`] decides, [`policy`] holds the rules, [`deadlines`] answers
//!   queue timeouts, [`warmup`] runs `model_warmup` on each new instance);
//! * [`sequence`]: Triton's sequence batcher for stateful models: slots,
//!   backlog, control inputs and implicit state, one batch loop per instance;
//! * [`ensemble`]: the step DAG, every step through its composing model's
//!   scheduler.
//!
//! [`stats`] keeps each version's statistics, whichever scheduler serves it;
//! [`stream`] carries a decoupled model's responses to the frontend.

pub mod deadlines;
pub mod ensemble;
pub mod instance;
pub mod instances;
pub mod policy;
pub mod queue;
pub mod rate_limit;
pub mod reorder;
pub mod sequence;
pub mod stats;
pub mod stream;
pub mod warmup;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use policy::BatchPolicy;
use stats::{FailReason, ModelStats};
use tern_core::backend::Model;
use tern_core::classification::classify;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::validate::{apply_reshape, validate_request};
use tern_core::{InferRequest, InferResponse};

/// What serves a version's requests once they are validated.
pub enum Scheduler {
    /// The version's instances, behind its queue.
    Instances(instances::Pool),
    /// The sequence batcher over the version's instances.
    Sequence(sequence::Pool),
    /// The ensemble's step DAG.
    Ensemble(Box<ensemble::EnsembleScheduler>),
}

/// Keeps the outputs the client asked for (all when it named none), in its
/// order, with classification applied.
fn shape_response(
    config: &ModelConfig,
    labels: &HashMap<String, Vec<String>>,
    requested: &[tern_core::RequestedOutput],
    mut response: InferResponse,
) -> Result<InferResponse> {
    if requested.is_empty() {
        return Ok(response);
    }
    let mut all = std::mem::take(&mut response.outputs);
    for want in requested {
        let pos = all
            .iter()
            .position(|t| t.name == want.name)
            .ok_or_else(|| {
                Error::internal(format!(
                    "model '{}' did not produce requested output '{}'",
                    config.name, want.name
                ))
            })?;
        let tensor = all.swap_remove(pos);
        let tensor = match want.classification {
            Some(k) => classify(
                &tensor,
                k,
                labels.get(&want.name).map(|v| v.as_slice()),
                config.max_batch_size > 0,
            )?,
            None => tensor,
        };
        response.outputs.push(tensor);
    }
    Ok(response)
}

/// One loaded, servable version of a model.
pub struct ModelHandle {
    /// Normalised config the version was loaded with.
    pub config: Arc<ModelConfig>,
    /// Version number.
    pub version: i64,
    labels: Arc<HashMap<String, Vec<String>>>,
    scheduler: Scheduler,
    /// `model_transaction_policy { decoupled: true }`: any number of responses per request.
    decoupled: bool,
}

fn is_decoupled(config: &ModelConfig) -> bool {
    config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
}

impl ModelHandle {
    /// Creates every instance of every `instance_group`, runs the warmup samples on
    /// each, and starts their threads (behind the sequence batcher when the
    /// config has `sequence_batching`). Fails (and starts nothing) if any
    /// instance cannot be created or warmed up. `summaries` keeps recent
    /// latencies for the Prometheus summaries.
    pub fn start(
        config: Arc<ModelConfig>,
        version: i64,
        model: Arc<dyn Model>,
        labels: HashMap<String, Vec<String>>,
        gpu_count: usize,
        model_dir: &Path,
        summaries: bool,
    ) -> Result<ModelHandle> {
        let decoupled = is_decoupled(&config);
        if decoupled && !model.supports_decoupled() {
            return Err(Error::unsupported(format!("its backend '{}' cannot serve decoupled models (model_transaction_policy {{ decoupled: true }}); \
                 decoupled models are WebAssembly plugins", config.backend)).for_model(&config.name));
        }
        if decoupled
            && tern_core::sequence::batching(&config).is_some_and(|sb| !sb.state.is_empty())
        {
            return Err(Error::unsupported(
                "implicit state (sequence_batching state) is not supported for decoupled models",
            )
            .for_model(&config.name));
        }
        let labels = Arc::new(labels);
        let scheduler = if tern_core::sequence::batching(&config).is_some() {
            Scheduler::Sequence(sequence::Pool::start(
                config.clone(),
                version,
                model,
                gpu_count,
                model_dir,
                summaries,
            )?)
        } else {
            Scheduler::Instances(instances::Pool::start(
                config.clone(),
                version,
                model,
                gpu_count,
                model_dir,
                summaries,
            )?)
        };
        Ok(ModelHandle {
            config,
            version,
            labels,
            scheduler,
            decoupled,
        })
    }

    /// The same version serving `config`, which differs from this handle's
    /// only in `instance_group`: instances that the new config still names
    /// keep running, missing ones are created and warmed up first, surplus
    /// ones finish their batch and stop. Both handles share the queue and the
    /// instances, so requests holding either are served; the last of them
    /// dropped stops everything.
    pub fn resized(&self, config: Arc<ModelConfig>) -> Result<ModelHandle> {
        let Scheduler::Instances(pool) = &self.scheduler else {
            return Err(Error::internal(format!(
                "model '{}' has no instances to resize",
                self.config.name
            )));
        };
        Ok(ModelHandle {
            scheduler: Scheduler::Instances(pool.resized(config.clone())?),
            config,
            version: self.version,
            labels: self.labels.clone(),
            decoupled: self.decoupled,
        })
    }

    /// Whether this handle can adjust its instances in place (not an ensemble).
    pub fn resizable(&self) -> bool {
        matches!(self.scheduler, Scheduler::Instances(_))
    }

    /// Serves an ensemble: no instances or queue of its own; each request runs
    /// the step DAG through the composing models' schedulers.
    pub fn ensemble(
        config: Arc<ModelConfig>,
        version: i64,
        ensemble: ensemble::Ensemble,
        labels: HashMap<String, Vec<String>>,
        summaries: bool,
    ) -> Result<ModelHandle> {
        // As Triton: an ensemble with a decoupled step is decoupled, whatever its config says.
        let decoupled = ensemble.decoupled();
        let config = if decoupled != is_decoupled(&config) {
            let mut c = (*config).clone();
            c.model_transaction_policy =
                Some(tern_core::config::pb::ModelTransactionPolicy { decoupled });
            Arc::new(c)
        } else {
            config
        };
        let scheduler =
            ensemble::EnsembleScheduler::new(config.clone(), version, ensemble, summaries)?;
        Ok(ModelHandle {
            config,
            version,
            labels: Arc::new(labels),
            scheduler: Scheduler::Ensemble(Box::new(scheduler)),
            decoupled,
        })
    }

    /// Class labels per output (`label_filename`), for classification.
    pub fn labels(&self) -> &HashMap<String, Vec<String>> {
        &self.labels
    }

    /// Whether the version is decoupled (answers through [`ModelHandle::infer_stream`]).
    pub fn decoupled(&self) -> bool {
        self.decoupled
    }

    /// Validates a request and places it: its batch size, priority level and timeout.
    fn admit(
        &self,
        request: &mut InferRequest,
        arrived: Instant,
    ) -> Result<(usize, u64, Option<std::time::Duration>)> {
        let placed = validate_request(&self.config, request).and_then(|batch| {
            self.policy()
                .placement(request)
                .map(|(level, timeout)| (batch, level, timeout))
        });
        match placed {
            Ok(p) => {
                apply_reshape(&self.config, request);
                Ok(p)
            }
            Err(e) => {
                self.model_stats()
                    .record_failure(arrived.elapsed(), FailReason::Other);
                Err(e)
            }
        }
    }

    /// Hands an admitted request to the version's scheduler.
    async fn schedule(
        &self,
        request: InferRequest,
        (batch_size, level, timeout): (usize, u64, Option<std::time::Duration>),
        arrived: Instant,
    ) -> Result<InferResponse> {
        if let Some(trace) = &request.trace {
            trace.timestamp("QUEUE_START");
            trace.tensors("TENSOR_QUEUE_INPUT", &request.inputs);
        }
        match &self.scheduler {
            Scheduler::Instances(pool) => {
                pool.schedule(request, batch_size, level, timeout, arrived)
                    .await
            }
            Scheduler::Sequence(pool) => pool.schedule(request, batch_size, arrived).await,
            Scheduler::Ensemble(e) => e.schedule(request, batch_size, arrived).await,
        }
    }

    /// Validates and runs one request, returning its response with only the
    /// requested outputs (and classification applied). A decoupled model
    /// answers only through [`ModelHandle::infer_stream`].
    pub async fn infer(&self, mut request: InferRequest) -> Result<InferResponse> {
        if self.decoupled {
            return Err(Error::unsupported(format!(
                "model '{}' is decoupled (model_transaction_policy {{ decoupled: true }}): \
                 its responses stream through gRPC ModelStreamInfer or HTTP generate_stream",
                self.config.name
            )));
        }
        let arrived = Instant::now();
        let placed = self.admit(&mut request, arrived)?;
        let requested = request.outputs.clone();
        let response = self.schedule(request, placed, arrived).await?;
        shape_response(&self.config, &self.labels, &requested, response)
    }

    /// Runs one request of a decoupled model: its responses (each shaped as
    /// [`ModelHandle::infer`] shapes one) arrive on the returned stream as
    /// the model sends them, the last with the final flag.
    pub fn infer_stream(
        self: &Arc<Self>,
        mut request: InferRequest,
    ) -> Result<stream::ResponseStream> {
        let arrived = Instant::now();
        let placed = self.admit(&mut request, arrived)?;
        let requested = request.outputs.clone();
        let (config, labels) = (self.config.clone(), self.labels.clone());
        let this = self.clone();
        let on_first: stream::OnFirst =
            Box::new(move || this.model_stats().record_first_response(arrived.elapsed()));
        let (sender, mut responses) = stream::channel(
            &self.config.name,
            Box::new(move |r| shape_response(&config, &labels, &requested, r)),
            Some(on_first),
        );
        request.responder = Some(tern_core::Responder(sender.clone()));
        let this = self.clone();
        // The backend answers through the sender; what the execution itself
        // returns matters only when it failed before the final flag.
        responses.drive(
            Box::pin(async move { this.schedule(request, placed, arrived).await }),
            sender,
        );
        Ok(responses)
    }

    fn policy(&self) -> &BatchPolicy {
        match &self.scheduler {
            Scheduler::Instances(p) => p.policy(),
            Scheduler::Sequence(p) => p.policy(),
            Scheduler::Ensemble(e) => e.policy(),
        }
    }

    fn model_stats(&self) -> &ModelStats {
        match &self.scheduler {
            Scheduler::Instances(p) => p.stats(),
            Scheduler::Sequence(p) => p.stats(),
            Scheduler::Ensemble(e) => e.stats(),
        }
    }

    /// Whether the config enables the response cache (`response_cache { enable: true }`).
    pub fn caches_responses(&self) -> bool {
        self.config
            .response_cache
            .as_ref()
            .is_some_and(|c| c.enable)
    }

    /// Records a request answered from the response cache.
    pub fn record_cache_hit(
        &self,
        total: std::time::Duration,
        queue: std::time::Duration,
        lookup: std::time::Duration,
    ) {
        self.model_stats().record_cache_hit(total, queue, lookup);
    }

    /// Records a response cache miss and the time its lookup and insert took.
    pub fn record_cache_miss(&self, took: std::time::Duration) {
        self.model_stats().record_cache_miss(took);
    }

    /// Current statistics of this version.
    pub fn stats(&self) -> stats::Snapshot {
        self.model_stats().snapshot()
    }

    /// Recent latencies for the Prometheus summaries (when enabled).
    pub fn summaries(&self) -> Option<stats::Summaries> {
        self.model_stats().summaries()
    }

    /// Sequences the sequence batcher holds open (started and not yet ended
    /// or released as idle); 0 for a model without one. Loading on demand
    /// never unloads a model with an open sequence.
    pub fn open_sequences(&self) -> usize {
        match &self.scheduler {
            Scheduler::Sequence(p) => p.sequences(),
            _ => 0,
        }
    }

    /// Requests waiting in the queue (not yet executing).
    pub fn pending(&self) -> usize {
        match &self.scheduler {
            Scheduler::Instances(p) => p.pending(),
            Scheduler::Sequence(p) => p.pending(),
            Scheduler::Ensemble(_) => 0,
        }
    }

    /// Stops accepting requests, lets queued ones finish and joins the instance threads.
    pub fn shutdown(&self) {
        match &self.scheduler {
            Scheduler::Instances(p) => p.shutdown(),
            Scheduler::Sequence(p) => p.shutdown(),
            Scheduler::Ensemble(e) => e.shutdown(),
        }
    }
}
