//! The one door into a model. Every inference request — HTTP, gRPC unary and
//! streaming, generate, ensemble steps and plugins' BLS calls — runs through
//! [`Infer`]: it resolves the version a request names, runs the request on
//! it and delivers the outputs a client asked into shared memory. What
//! applies to every request whatever its protocol (admission, caching,
//! tracing, loading on demand) belongs here, once.
//!
//! A frontend that must read a model's config before it can decode a request
//! (HTTP's raw binary bodies, generate's JSON) resolves the [`Target`] first
//! with [`Infer::target`] and runs the decoded request on that same version;
//! [`Infer::resolve`] does the same but, with `--model-load-on-demand`, loads
//! a model that is not loaded first (one load shared by every request that
//! waits for it, each within its own timeout; see `repository::demand`).

use std::sync::{Arc, Weak};
use std::time::Instant;

use tern_core::error::{Error, Result};
use tern_core::request::{InferRequest, InferResponse, RequestedOutput, StreamItem};
use tern_core::router::{InferFuture, ModelRouter, NextFuture, ResponseStream};
use tern_core::trace::Trace;
use tern_memory::shm;

use crate::cache::{self, ResponseCache};
use crate::repository::{Repository, RepositoryOptions};
use crate::scheduler::{stream::Single, ModelHandle};
use crate::trace::Tracer;

/// The inference facade over a repository (see the module doc).
pub struct Infer {
    me: Weak<Infer>,
    repository: Arc<Repository>,
    cache: Option<Arc<ResponseCache>>,
    tracer: Arc<Tracer>,
}

/// The model version a request runs on, resolved before the request is decoded.
#[derive(Clone)]
pub struct Target(Arc<ModelHandle>);

impl Target {
    /// The version's handle: its config, labels and decoupled flag.
    pub fn model(&self) -> &ModelHandle {
        &self.0
    }
}

/// A response with the outputs its request asked for (the frontends encode
/// the one by the other: binary or JSON data, outputs left in shared memory).
pub struct Answer {
    /// The model's response; outputs bound to shared memory are already written there.
    pub response: InferResponse,
    /// The request's `outputs` (empty: all of them).
    pub requested: Vec<RequestedOutput>,
}

impl Infer {
    /// A repository whose models route their own calls (ensemble steps, BLS)
    /// back through the facade.
    pub fn new(options: RepositoryOptions) -> Arc<Infer> {
        Infer::with(options, None, Tracer::off())
    }

    /// As [`Infer::new`], answering models that enable `response_cache`
    /// from `cache` when there is one, and tracing the requests `tracer` samples.
    pub fn with(
        options: RepositoryOptions,
        cache: Option<Arc<ResponseCache>>,
        tracer: Arc<Tracer>,
    ) -> Arc<Infer> {
        Arc::new_cyclic(|me: &Weak<Infer>| {
            let router: Weak<dyn ModelRouter> = me.clone();
            Infer {
                me: me.clone(),
                repository: Repository::new(options, router),
                cache,
                tracer,
            }
        })
    }

    /// The tracer: frontends sample requests with it (before decoding them,
    /// so that the protocol's timestamps are in the trace), and the trace
    /// extension reads and changes its settings.
    pub fn tracer(&self) -> &Arc<Tracer> {
        &self.tracer
    }

    /// The repository behind the facade (loading, unloading, the index, metadata).
    pub fn repository(&self) -> &Arc<Repository> {
        &self.repository
    }

    /// The version `model`/`version` names (`None`: the highest ready one),
    /// or the error every protocol shows for an unknown or unavailable model.
    pub fn target(&self, model: &str, version: Option<i64>) -> Result<Target> {
        let handle = self.repository.get(model, version)?;
        self.repository.touch(model);
        Ok(Target(handle))
    }

    /// As [`Infer::target`], but with `--model-load-on-demand` a model that is
    /// in the repository and not loaded is loaded first, and the request
    /// waits for it: concurrent requests for the model share one load, and
    /// each waits at most its own `timeout` (the request's `timeout`
    /// parameter, read only when a wait is needed; `None`: until the load
    /// ends; a gRPC deadline ends the whole call around this wait).
    pub async fn resolve(
        &self,
        model: &str,
        version: Option<i64>,
        timeout: impl FnOnce() -> Option<std::time::Duration>,
    ) -> Result<Target> {
        match self.target(model, version) {
            Err(_) if self.repository.loads_on_demand(model) => {}
            // Not found, and not to load: another request's load may have
            // finished between the two looks, so look once more.
            Err(_) => return self.target(model, version),
            found => return found,
        }
        let timeout = timeout();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut pending = self.repository.load_shared(model);
        let done = pending.wait_for(|r| r.is_some());
        let result = match deadline {
            None => done.await.map(|r| r.clone()),
            Some(at) => match tokio::time::timeout_at(at, done).await {
                Ok(r) => r.map(|r| r.clone()),
                Err(_) => return Err(load_wait_expired(model, timeout)),
            },
        };
        // The load answers with the model's handles, taken before it could
        // be evicted: holding them, this request cannot lose its model.
        let handles = match result {
            Ok(Some(Ok(handles))) => handles,
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) | Err(_) => {
                return Err(Error::internal(format!(
                    "loading model '{model}' on demand ended without a result"
                )))
            }
        };
        let handle = match version {
            None => handles.last(),
            Some(v) => handles.iter().find(|h| h.version == v),
        };
        match handle {
            Some(h) => {
                self.repository.touch(model);
                Ok(Target(h.clone()))
            }
            // Loaded, but not the version the request names: its own error.
            None => self.target(model, version),
        }
    }

    /// Runs a request on a model that is not decoupled and writes the
    /// outputs bound to shared memory.
    pub async fn infer(&self, target: &Target, request: InferRequest) -> Result<Answer> {
        let requested = request.outputs.clone();
        let trace = started(&target.0, &request);
        let response = self.run(&target.0, request).await;
        if let Some(t) = trace {
            t.timestamp("REQUEST_END");
        }
        let response = response?;
        shm::write_outputs(&response, &requested)?;
        Ok(Answer {
            response,
            requested,
        })
    }

    /// Runs a request and answers with every response the model sends: a
    /// decoupled model's stream, another model's one response with the final
    /// flag. Outputs bound to shared memory are written as each response comes.
    pub fn stream(&self, target: &Target, request: InferRequest) -> Result<Answers> {
        let requested = request.outputs.clone();
        let trace = started(&target.0, &request);
        let handle = target.0.clone();
        let inner: Box<dyn ResponseStream> = if handle.decoupled() {
            Box::new(handle.infer_stream(request)?)
        } else {
            let this = self.me.upgrade().ok_or_else(shutting_down)?;
            Box::new(Single::new(Box::pin(async move {
                this.run(&handle, request).await
            })))
        };
        Ok(Answers {
            inner,
            requested,
            trace,
            _model: target.0.clone(),
        })
    }

    /// Runs a request on a model that is not decoupled, through the
    /// response cache when the server has one and the model enables it: a
    /// hit answers without the model (with this request's id), a miss runs
    /// it and keeps a successful response.
    async fn run(&self, handle: &ModelHandle, request: InferRequest) -> Result<InferResponse> {
        let Some(cache) = self.cache.as_ref().filter(|_| handle.caches_responses()) else {
            return handle.infer(request).await;
        };
        let arrived = Instant::now();
        let key = cache::key(&handle.config.name, handle.version, &request);
        let queued = arrived.elapsed();
        let (found, lookup) = cache.lookup(&key).await;
        if let Some(outputs) = found {
            handle.record_cache_hit(arrived.elapsed(), queued, lookup);
            return Ok(InferResponse {
                model_name: handle.config.name.clone(),
                model_version: handle.version,
                id: request.id,
                outputs,
                ..Default::default()
            });
        }
        let response = handle.infer(request).await?;
        let insert = cache.insert(&key, &response.outputs).await;
        handle.record_cache_miss(lookup + insert);
        Ok(response)
    }
}

/// Names the trace's model version and request id and records `REQUEST_START`.
fn started(handle: &ModelHandle, request: &InferRequest) -> Option<Arc<Trace>> {
    let trace = request.trace.clone()?;
    trace.resolved(&handle.config.name, handle.version, &request.id);
    trace.timestamp("REQUEST_START");
    Some(trace)
}

/// The responses of one request run by [`Infer::stream`].
pub struct Answers {
    inner: Box<dyn ResponseStream>,
    requested: Vec<RequestedOutput>,
    /// The request's trace, until its last response (`REQUEST_END`).
    trace: Option<Arc<Trace>>,
    /// The version the stream runs on, held while the stream is open: a
    /// model with an open stream is in use, never unloaded by idleness or
    /// the memory budget.
    _model: Arc<ModelHandle>,
}

impl Answers {
    /// The request's `outputs` (empty: all of them).
    pub fn requested(&self) -> &[RequestedOutput] {
        &self.requested
    }

    /// The next message, its outputs written to shared memory where the
    /// request bound them (a failed write answers as that response's error);
    /// `None` once the stream has ended. Dropping the stream cancels the request.
    pub async fn next(&mut self) -> Option<StreamItem> {
        let Some(mut item) = self.inner.next().await else {
            if let Some(t) = self.trace.take() {
                t.timestamp("REQUEST_END");
            }
            return None;
        };
        if item.last {
            if let Some(t) = self.trace.take() {
                t.timestamp("REQUEST_END");
            }
        }
        if let Some(Ok(r)) = &item.response {
            if let Err(e) = shm::write_outputs(r, &self.requested) {
                item.response = Some(Err(e));
            }
        }
        Some(item)
    }
}

impl ResponseStream for Answers {
    fn next(&mut self) -> NextFuture<'_> {
        Box::pin(Answers::next(self))
    }
}

/// Ensemble steps and plugins' BLS calls: the same door as the frontends'
/// (a unary call loads its model on demand, as a frontend request does).
impl ModelRouter for Infer {
    fn infer(&self, request: InferRequest) -> Result<InferFuture> {
        let this = self.me.upgrade().ok_or_else(shutting_down)?;
        let target = match self.target(&request.model_name, request.model_version) {
            Err(_) if self.repository.loads_on_demand(&request.model_name) => None,
            // As in `resolve`: a load may have finished between the two looks.
            Err(_) => Some(self.target(&request.model_name, request.model_version)?),
            found => Some(found?),
        };
        Ok(Box::pin(async move {
            let target = match target {
                Some(t) => t,
                None => {
                    let timeout = || request_timeout(&request);
                    this.resolve(&request.model_name, request.model_version, timeout)
                        .await?
                }
            };
            Ok(this.infer(&target, request).await?.response)
        }))
    }

    /// A streaming call starts synchronously, so it does not wait for a
    /// load on demand: a model that is not loaded answers as it would
    /// without `--model-load-on-demand` (the docs say so).
    fn infer_stream(&self, request: InferRequest) -> Result<Box<dyn ResponseStream>> {
        let target = self.target(&request.model_name, request.model_version)?;
        Ok(Box::new(self.stream(&target, request)?))
    }
}

/// The request's `timeout` parameter (microseconds), which also bounds
/// its wait for a model loading on demand.
pub fn request_timeout(request: &InferRequest) -> Option<std::time::Duration> {
    use tern_core::request::Parameter;
    match request.parameters.get("timeout")? {
        Parameter::Int(t) if *t > 0 => Some(std::time::Duration::from_micros(*t as u64)),
        _ => None,
    }
}

/// A request's wait for its model's load outlasted the request's timeout.
fn load_wait_expired(model: &str, timeout: Option<std::time::Duration>) -> Error {
    Error::unavailable(format!(
        "model '{model}' is loading on demand and was not ready within the request's timeout \
         of {} ms; the load goes on",
        timeout.unwrap_or_default().as_millis()
    ))
}

fn shutting_down() -> Error {
    Error::unavailable("the server is shutting down")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::State;
    use std::path::Path;
    use tern_core::{DataType, Tensor};

    /// A facade over a repository of one identity model, loaded.
    fn identity(dir: &Path) -> Arc<Infer> {
        std::fs::create_dir_all(dir.join("id/1")).unwrap();
        std::fs::write(
            dir.join("id/config.pbtxt"),
            r#"name: "id" backend: "identity" max_batch_size: 4
               input [{name: "X" data_type: TYPE_INT32 dims: [2]}]
               output [{name: "Y" data_type: TYPE_INT32 dims: [2]}]"#,
        )
        .unwrap();
        let infer = Infer::new(RepositoryOptions {
            roots: vec![dir.to_path_buf()],
            load_threads: 1,
            ..Default::default()
        });
        assert!(infer.repository().load_all().unwrap().is_empty());
        infer
    }

    fn request(model: &str) -> InferRequest {
        InferRequest {
            model_name: model.into(),
            inputs: vec![Tensor::new(
                "X",
                DataType::Int32,
                vec![1, 2],
                [7i32, -7]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            )],
            ..Default::default()
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn the_router_runs_requests_by_name_and_follows_the_lifecycle() {
        let t = tempfile::tempdir().unwrap();
        let infer = identity(t.path());
        let repo = infer.repository().clone();
        let rt = runtime();
        let router: Arc<dyn ModelRouter> = infer.clone();
        let r = rt.block_on(router.infer(request("id")).unwrap()).unwrap();
        assert_eq!((r.model_name.as_str(), r.model_version), ("id", 1));
        assert_eq!(r.outputs[0].data, request("id").inputs[0].data);
        let e = router.infer(request("nope")).err().unwrap();
        assert_eq!(e.code, tern_core::Code::NotFound);
        assert_eq!(e.message, "Request for unknown model: 'nope' is not found");
        assert!(repo.all_ready());
        assert_eq!(repo.index()[0].state, State::Ready);

        repo.unload_model("id", false).unwrap();
        let e = router.infer(request("id")).err().unwrap();
        assert!(e.message.contains("'id'"), "{e}");
        let row = &repo.index()[0];
        assert_eq!(
            (row.state, row.reason.as_str()),
            (State::Unavailable, "unloaded")
        );
        assert!(
            repo.all_ready(),
            "an unloaded model does not make the server unready"
        );

        repo.load_model("id", Default::default()).unwrap();
        assert!(rt.block_on(router.infer(request("id")).unwrap()).is_ok());
        repo.shutdown();
        assert!(repo.load_model("id", Default::default()).is_err());
    }

    #[test]
    fn a_stream_of_a_model_that_is_not_decoupled_is_its_one_response_with_the_final_flag() {
        let t = tempfile::tempdir().unwrap();
        let infer = identity(t.path());
        let rt = runtime();
        let target = infer.target("id", None).unwrap();
        let mut answers = infer.stream(&target, request("id")).unwrap();
        let item = rt.block_on(answers.next()).unwrap();
        assert!(item.last);
        let r = item.response.unwrap().unwrap();
        assert_eq!(r.outputs[0].data, request("id").inputs[0].data);
        assert!(
            rt.block_on(answers.next()).is_none(),
            "the stream ends after the final flag"
        );

        let mut bad = request("id");
        bad.inputs[0].shape = vec![1, 3];
        let item = rt
            .block_on(infer.stream(&target, bad).unwrap().next())
            .unwrap();
        assert!(item.last);
        assert_eq!(
            item.response.unwrap().unwrap_err().code,
            tern_core::Code::InvalidArg
        );
    }

    #[test]
    fn requests_for_a_model_not_loaded_share_one_load() {
        let t = tempfile::tempdir().unwrap();
        identity(t.path()).repository().shutdown();
        let infer = Infer::new(RepositoryOptions {
            roots: vec![t.path().to_path_buf()],
            load_threads: 1,
            on_demand: crate::repository::demand::OnDemandOptions {
                enabled: true,
                ..Default::default()
            },
            ..Default::default()
        });
        let repo = infer.repository().clone();
        repo.load_startup(crate::repository::control::ControlMode::Explicit, &[])
            .unwrap();
        assert!(infer.target("id", None).is_err(), "not loaded");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let waits = (0..8).map(|_| infer.resolve("id", None, || None));
        for target in rt.block_on(futures_util::future::join_all(waits)) {
            assert_eq!(target.unwrap().model().config.name, "id");
        }
        assert_eq!(repo.loads_on_demand_total(), 1, "one shared load");
        let router: Arc<dyn ModelRouter> = infer.clone();
        repo.unload_model("id", false).unwrap();
        let r = rt.block_on(router.infer(request("id")).unwrap()).unwrap();
        assert_eq!(r.outputs[0].data, request("id").inputs[0].data);
        let e = rt
            .block_on(infer.resolve("nope", None, || None))
            .err()
            .unwrap();
        assert_eq!(e.message, "Request for unknown model: 'nope' is not found");
        repo.shutdown();
    }

    #[test]
    fn a_unary_answer_keeps_the_outputs_the_request_asked_for() {
        let t = tempfile::tempdir().unwrap();
        let infer = identity(t.path());
        let target = infer.target("id", Some(1)).unwrap();
        assert_eq!(target.model().config.name, "id");
        let mut req = request("id");
        req.outputs = vec![RequestedOutput {
            name: "Y".into(),
            ..Default::default()
        }];
        let answer = runtime().block_on(infer.infer(&target, req)).unwrap();
        assert_eq!(answer.requested.len(), 1);
        assert_eq!(answer.response.outputs.len(), 1);
        assert!(infer.target("id", Some(2)).is_err(), "no version 2");
    }
}
