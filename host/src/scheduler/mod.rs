//! Scheduling: a loaded model version ([`ModelHandle`]) owns its instances,
//! each on its own OS thread, and the default scheduler hands every request
//! to whichever instance is free. Every request gets exactly one response,
//! including when a backend panics or the model goes away.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::backends::{DeviceKind, Instance, InstanceSpec, Model};
use crate::config::pb::model_instance_group::Kind;
use crate::config::ModelConfig;
use crate::core::classification::classify;
use crate::core::validate::validate_request;
use crate::core::{InferRequest, InferResponse};
use crate::error::{Error, Result};

struct Job {
    request: InferRequest,
    reply: oneshot::Sender<Result<InferResponse>>,
}

/// One loaded, servable version of a model.
pub struct ModelHandle {
    /// Normalised config the version was loaded with.
    pub config: Arc<ModelConfig>,
    /// Version number.
    pub version: i64,
    labels: HashMap<String, Vec<String>>,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl ModelHandle {
    /// Creates every instance of every `instance_group` and starts their threads.
    /// Fails (and starts nothing) if any instance cannot be created.
    pub fn start(
        config: Arc<ModelConfig>,
        version: i64,
        model: Arc<dyn Model>,
        labels: HashMap<String, Vec<String>>,
        gpu_count: usize,
    ) -> Result<ModelHandle> {
        let mut instances: Vec<(String, Box<dyn Instance>)> = Vec::new();
        for group in &config.instance_group {
            let devices: Vec<DeviceKind> = if group.kind == Kind::Gpu as i32 {
                if gpu_count == 0 {
                    return Err(Error::unavailable(format!(
                        "model '{}': instance_group '{}' is KIND_GPU but no GPU is available on this machine \
                         (use KIND_CPU or KIND_AUTO)",
                        config.name, group.name
                    )));
                }
                let gpus: Vec<i32> = if group.gpus.is_empty() {
                    (0..gpu_count as i32).collect()
                } else {
                    group.gpus.clone()
                };
                if let Some(g) = gpus.iter().find(|&&g| g < 0 || g as usize >= gpu_count) {
                    return Err(Error::invalid_arg(format!(
                        "model '{}': instance_group '{}' names GPU {g}, but only {gpu_count} GPU(s) exist",
                        config.name, group.name
                    )));
                }
                gpus.into_iter().map(DeviceKind::Gpu).collect()
            } else {
                vec![DeviceKind::Cpu]
            };
            for device in devices {
                for i in 0..group.count.max(1) {
                    let spec = InstanceSpec {
                        name: format!("{}_{}", group.name, i),
                        device,
                    };
                    let instance = model.create_instance(&spec)?;
                    instances.push((spec.name, instance));
                }
            }
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::new();
        for (name, instance) in instances {
            let rx = rx.clone();
            let thread_name = format!("{}:{}", config.name, name);
            let model_name = config.name.clone();
            let handle = std::thread::Builder::new()
                .name(thread_name)
                .spawn(move || worker(model_name, instance, rx))
                .map_err(|e| {
                    Error::internal(format!(
                        "model '{}': cannot start an instance thread: {e}",
                        config.name
                    ))
                })?;
            workers.push(handle);
        }
        Ok(ModelHandle {
            config,
            version,
            labels,
            queue: Mutex::new(Some(tx)),
            workers: Mutex::new(workers),
        })
    }

    /// Validates and runs one request, returning its response with only the
    /// requested outputs (and classification applied).
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        validate_request(&self.config, &request)?;
        let requested = request.outputs.clone();
        let (reply, rx) = oneshot::channel();
        {
            let queue = self.queue.lock().expect("queue lock");
            let sender = queue.as_ref().ok_or_else(|| self.gone())?;
            sender
                .send(Job { request, reply })
                .map_err(|_| self.gone())?;
        }
        let mut response = rx.await.map_err(|_| self.gone())??;
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

    fn gone(&self) -> Error {
        Error::unavailable(format!(
            "model '{}' version {} is no longer available",
            self.config.name, self.version
        ))
    }

    /// Stops accepting requests, lets queued ones finish and joins the instance threads.
    pub fn shutdown(&self) {
        self.queue.lock().expect("queue lock").take();
        let workers = std::mem::take(&mut *self.workers.lock().expect("workers lock"));
        for w in workers {
            let _ = w.join();
        }
    }
}

impl Drop for ModelHandle {
    fn drop(&mut self) {
        self.queue.lock().map(|mut q| q.take()).ok();
    }
}

fn worker(model: String, mut instance: Box<dyn Instance>, rx: Arc<Mutex<mpsc::Receiver<Job>>>) {
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let batch = [job.request];
        let result = catch_unwind(AssertUnwindSafe(|| instance.execute(&batch)));
        let reply = match result {
            Ok(mut results) if results.len() == 1 => results.pop().expect("one result"),
            Ok(results) => Err(Error::internal(format!(
                "model '{model}': backend returned {} responses for 1 request",
                results.len()
            ))),
            Err(_) => {
                tracing::error!(model = %model, "backend panicked while executing a request");
                Err(Error::internal(format!(
                    "model '{model}': the backend failed while executing the request"
                )))
            }
        };
        let _ = job.reply.send(reply);
    }
}
