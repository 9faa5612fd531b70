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
//! [`stats`] keeps each version's statistics, whichever scheduler serves it.

pub mod deadlines;
pub mod ensemble;
pub mod instances;
pub mod policy;
pub mod queue;
pub mod sequence;
pub mod stats;
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

/// One loaded, servable version of a model.
pub struct ModelHandle {
    /// Normalised config the version was loaded with.
    pub config: Arc<ModelConfig>,
    /// Version number.
    pub version: i64,
    labels: HashMap<String, Vec<String>>,
    scheduler: Scheduler,
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
        if tern_core::sequence::batching(&config).is_some() {
            let pool = sequence::Pool::start(
                config.clone(),
                version,
                model,
                gpu_count,
                model_dir,
                summaries,
            )?;
            return Ok(ModelHandle {
                config,
                version,
                labels,
                scheduler: Scheduler::Sequence(pool),
            });
        }
        let pool = instances::Pool::start(
            config.clone(),
            version,
            model,
            gpu_count,
            model_dir,
            summaries,
        )?;
        Ok(ModelHandle {
            config,
            version,
            labels,
            scheduler: Scheduler::Instances(pool),
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
        let scheduler =
            ensemble::EnsembleScheduler::new(config.clone(), version, ensemble, summaries)?;
        Ok(ModelHandle {
            config,
            version,
            labels,
            scheduler: Scheduler::Ensemble(Box::new(scheduler)),
        })
    }

    /// Class labels per output (`label_filename`), for classification.
    pub fn labels(&self) -> &HashMap<String, Vec<String>> {
        &self.labels
    }

    /// Validates and runs one request, returning its response with only the
    /// requested outputs (and classification applied).
    pub async fn infer(&self, mut request: InferRequest) -> Result<InferResponse> {
        let arrived = Instant::now();
        let placed = validate_request(&self.config, &request).and_then(|batch| {
            self.policy()
                .placement(&request)
                .map(|(level, timeout)| (batch, level, timeout))
        });
        let (batch_size, level, timeout) = match placed {
            Ok(p) => p,
            Err(e) => {
                self.model_stats()
                    .record_failure(arrived.elapsed(), FailReason::Other);
                return Err(e);
            }
        };
        apply_reshape(&self.config, &mut request);
        let requested = request.outputs.clone();
        let mut response = match &self.scheduler {
            Scheduler::Instances(pool) => {
                pool.schedule(request, batch_size, level, timeout, arrived)
                    .await?
            }
            Scheduler::Sequence(pool) => pool.schedule(request, batch_size, arrived).await?,
            Scheduler::Ensemble(e) => e.schedule(request, batch_size, arrived).await?,
        };
        if !requested.is_empty() {
            let mut all = std::mem::take(&mut response.outputs);
            for want in &requested {
                let pos = all
                    .iter()
                    .position(|t| t.name == want.name)
                    .ok_or_else(|| {
                        Error::internal(format!(
                            "model '{}' did not produce requested output '{}'",
                            self.config.name, want.name
                        ))
                    })?;
                let tensor = all.swap_remove(pos);
                let tensor = match want.classification {
                    Some(k) => classify(
                        &tensor,
                        k,
                        self.labels.get(&want.name).map(|v| v.as_slice()),
                        self.config.max_batch_size > 0,
                    )?,
                    None => tensor,
                };
                response.outputs.push(tensor);
            }
        }
        Ok(response)
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

    /// Current statistics of this version.
    pub fn stats(&self) -> stats::Snapshot {
        self.model_stats().snapshot()
    }

    /// Recent latencies for the Prometheus summaries (when enabled).
    pub fn summaries(&self) -> Option<stats::Summaries> {
        self.model_stats().summaries()
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
