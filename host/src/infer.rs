//! The one door into a model. Every inference request — HTTP, gRPC unary and
//! streaming, generate, ensemble steps and plugins' BLS calls — runs through
//! [`Infer`]: it resolves the version a request names, runs the request on
//! it and delivers the outputs a client asked into shared memory. What
//! applies to every request whatever its protocol (admission, caching,
//! tracing, loading on demand) belongs here, once.
//!
//! A frontend that must read a model's config before it can decode a request
//! (HTTP's raw binary bodies, generate's JSON) resolves the [`Target`] first
//! with [`Infer::target`] and runs the decoded request on that same version.

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
        self.repository.get(model, version).map(Target)
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

/// Ensemble steps and plugins' BLS calls: the same door as the frontends'.
impl ModelRouter for Infer {
    fn infer(&self, request: InferRequest) -> Result<InferFuture> {
        let target = self.target(&request.model_name, request.model_version)?;
        let this = self.me.upgrade().ok_or_else(shutting_down)?;
        Ok(Box::pin(async move {
            Ok(this.infer(&target, request).await?.response)
        }))
    }

    fn infer_stream(&self, request: InferRequest) -> Result<Box<dyn ResponseStream>> {
        let target = self.target(&request.model_name, request.model_version)?;
        Ok(Box::new(self.stream(&target, request)?))
    }
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
