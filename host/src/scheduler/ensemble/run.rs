//! Running a request through an ensemble's step DAG: one runner for every
//! ensemble. A unary ensemble is the one-iteration case of a streaming one.
//!
//! An ensemble with a decoupled step runs as Triton runs it: the ensemble
//! is decoupled too; every response of the decoupled step is one
//! *iteration* of its outputs; a step downstream of it runs once per
//! iteration, as soon as that iteration's inputs exist (inputs that do not
//! descend from the decoupled step are shared by every iteration); the
//! ensemble sends one response per iteration once all its outputs exist for
//! it — in iteration order, so tokens stay in order — and the final flag
//! when no step is running. Without a decoupled step every step runs once
//! and the ensemble answers once, with the final flag.

use std::collections::{HashMap, HashSet};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use super::{convert_for, with_dims, Ensemble};
use tern_core::config::pb::ModelConfig;
use tern_core::error::{Code, Error, Result};
use tern_core::request::ComputeTimes;
use tern_core::router::{ModelRouter, ResponseStream};
use tern_core::{
    InferRequest, InferResponse, Parameters, RequestedOutput, Responder, StreamItem, Tensor,
};

/// What finished among a request's running steps.
enum Done {
    /// A step's one response (`iteration`: which response of the decoupled
    /// step it follows it ran for).
    Call {
        step: usize,
        iteration: Option<usize>,
        batch: usize,
        result: Result<InferResponse>,
    },
    /// The next message of a decoupled step's stream (`None`: it ended).
    Next {
        step: usize,
        batch: usize,
        stream: Box<dyn ResponseStream>,
        item: Option<StreamItem>,
    },
}

type Running = Pin<Box<dyn Future<Output = Done> + Send>>;

fn next_of(step: usize, batch: usize, mut stream: Box<dyn ResponseStream>) -> Running {
    Box::pin(async move {
        let item = stream.next().await;
        Done::Next {
            step,
            batch,
            stream,
            item,
        }
    })
}

/// The tensors of one request, each with the batch size of the request
/// that produced it: shared by every iteration, or of one.
#[derive(Default)]
struct Tensors {
    shared: HashMap<String, (Tensor, usize)>,
    iterations: HashMap<(String, usize), (Tensor, usize)>,
}

impl Tensors {
    fn get(&self, name: &str, iteration: Option<usize>) -> Option<&(Tensor, usize)> {
        self.shared
            .get(name)
            .or_else(|| iteration.and_then(|k| self.iterations.get(&(name.to_string(), k))))
    }
}

/// What every step request of one ensemble request carries.
struct Origin {
    id: String,
    parameters: Parameters,
    /// The models above this step's call, this ensemble last (BLS and
    /// ensemble recursion checks).
    callers: Vec<String>,
    /// The ensemble request's trace: each step's request is traced as its child.
    trace: Option<std::sync::Arc<tern_core::trace::Trace>>,
}

/// The parameters every ensemble response carries, as Triton's do: the
/// request's `sequence_id` (an integer or a string; 0 without one),
/// `sequence_start` and `sequence_end` (false without them).
fn sequence_parameters(request: &Parameters) -> Parameters {
    use tern_core::Parameter;
    let id = match request.get("sequence_id") {
        Some(p @ (Parameter::Int(_) | Parameter::String(_))) => p.clone(),
        _ => Parameter::Int(0),
    };
    let flag =
        |name: &str| Parameter::Bool(matches!(request.get(name), Some(Parameter::Bool(true))));
    Parameters::from([
        ("sequence_id".to_string(), id),
        ("sequence_start".to_string(), flag("sequence_start")),
        ("sequence_end".to_string(), flag("sequence_end")),
    ])
}

/// Where a run's responses go: `Some(outputs)` for a response, `last` on
/// the final one (a bare final flag has no outputs).
type Emit<'a> = dyn FnMut(Option<Vec<Tensor>>, bool) -> Result<()> + Send + 'a;

/// Which step runs a request still owes: per step, whether its one run has
/// started, and the iterations of the decoupled step it follows it ran for.
struct Progress {
    /// Responses received from each decoupled step so far.
    iterations: Vec<usize>,
    started_once: Vec<bool>,
    started: HashSet<(usize, usize)>,
    /// Ensemble responses sent (streaming ensembles).
    sent: usize,
    /// The steps this request runs (the others produce nothing it asked for).
    needed: Vec<bool>,
    /// The ensemble outputs it answers with.
    outputs: Vec<bool>,
}

impl Ensemble {
    /// Runs one (validated) request of an ensemble that is not decoupled and
    /// returns the ensemble's outputs.
    pub async fn run(&self, request: InferRequest) -> Result<InferResponse> {
        if self.decoupled() {
            return Err(Error::unsupported(format!(
                "ensemble '{}' is decoupled (a step streams its responses): it answers through gRPC \
                 ModelStreamInfer, HTTP generate_stream or a BLS exec(decoupled=True)",
                self.plan.name
            )));
        }
        let id = request.id.clone();
        let parameters = sequence_parameters(&request.parameters);
        let mut answer = None;
        let mut emit = |outputs: Option<Vec<Tensor>>, _last: bool| {
            if let Some(outputs) = outputs {
                if answer.replace(outputs).is_some() {
                    return Err(Error::unsupported(format!(
                        "ensemble '{}' is decoupled: it answers through gRPC ModelStreamInfer or HTTP generate_stream",
                        self.plan.name
                    )));
                }
            }
            Ok(())
        };
        let compute = self.execute(request, &mut emit, &|| false).await?;
        let outputs = answer.ok_or_else(|| {
            Error::internal(format!(
                "ensemble '{}' produced no response",
                self.plan.name
            ))
        })?;
        Ok(InferResponse {
            model_name: self.plan.name.clone(),
            model_version: 0,
            id,
            outputs,
            parameters,
            compute,
            ..Default::default()
        })
    }

    /// Runs a request of a decoupled ensemble, sending each ensemble response
    /// (checked against `config`) and then the final flag through `sink`;
    /// returns the steps' compute times.
    pub(super) async fn run_decoupled(
        &self,
        request: InferRequest,
        sink: &Responder,
        config: &ModelConfig,
        version: i64,
        batch_size: usize,
    ) -> Result<ComputeTimes> {
        let id = request.id.clone();
        let parameters = sequence_parameters(&request.parameters);
        let mut emit = |outputs: Option<Vec<Tensor>>, last: bool| match outputs {
            Some(outputs) => {
                tern_core::validate::validate_outputs(config, batch_size, &outputs)?;
                let response = InferResponse {
                    model_name: self.plan.name.clone(),
                    model_version: version,
                    id: id.clone(),
                    outputs,
                    parameters: parameters.clone(),
                    ..Default::default()
                };
                sink.0.send(Some(Ok(response)), last)
            }
            None => sink.0.send(None, last),
        };
        let cancelled = || sink.0.is_cancelled();
        self.execute(request, &mut emit, &cancelled).await
    }

    /// The step loop: starts every step whose inputs exist (once per
    /// iteration of the decoupled step it follows), keeps what each returns,
    /// emits the ensemble's responses as their outputs complete, and ends
    /// when no step is running. Returns the steps' compute times summed.
    async fn execute(
        &self,
        request: InferRequest,
        emit: &mut Emit<'_>,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<ComputeTimes> {
        let p = &self.plan;
        let (router, input_batch) = self.start(&request)?;
        let (needed, outputs) = p.needed(&request.outputs);
        let InferRequest {
            id,
            inputs,
            parameters,
            mut callers,
            trace,
            ..
        } = request;
        callers.push(p.name.clone());
        let origin = Origin {
            id,
            parameters,
            callers,
            trace,
        };
        let mut tensors = Tensors::default();
        for t in inputs {
            tensors.shared.insert(t.name.clone(), (t, input_batch));
        }
        let mut progress = Progress {
            iterations: vec![0; p.steps.len()],
            started_once: vec![false; p.steps.len()],
            started: HashSet::new(),
            sent: 0,
            needed,
            outputs,
        };
        let mut running: Vec<Running> = Vec::new();
        let mut compute = ComputeTimes::default();
        loop {
            if cancelled() {
                return Err(Error::new(
                    Code::Cancelled,
                    format!(
                        "request for ensemble '{}' was cancelled: its client has gone away",
                        p.name
                    ),
                ));
            }
            self.start_ready_steps(&router, &origin, &tensors, &mut progress, &mut running)?;
            // Responses go out in the order of the decoupled step's responses
            // (tokens stay in order even when later iterations finish first).
            if let Some(d) = p.streams_from {
                while progress.sent < progress.iterations[d] {
                    let Some(outputs) =
                        self.outputs_at(&tensors, Some(progress.sent), &progress.outputs)
                    else {
                        break;
                    };
                    emit(Some(outputs), false)?;
                    progress.sent += 1;
                }
            }
            if running.is_empty() {
                break;
            }
            let (k, done) = poll_fn(|cx| {
                for (k, fut) in running.iter_mut().enumerate() {
                    if let Poll::Ready(done) = fut.as_mut().poll(cx) {
                        return Poll::Ready((k, done));
                    }
                }
                Poll::Pending
            })
            .await;
            drop(running.swap_remove(k));
            compute += self.receive(done, &mut tensors, &mut progress, &mut running)?;
        }
        self.check_all_ran(&tensors, &progress)?;
        match p.streams_from {
            None => {
                let outputs = self
                    .outputs_at(&tensors, None, &progress.outputs)
                    .ok_or_else(|| {
                        let missing: Vec<&str> = p
                            .outputs
                            .iter()
                            .zip(&progress.outputs)
                            .filter(|(o, wanted)| **wanted && tensors.get(o, None).is_none())
                            .map(|(o, _)| o)
                            .map(String::as_str)
                            .collect();
                        Error::internal(format!(
                            "ensemble '{}': output(s) {} were not produced",
                            p.name,
                            missing.join(", ")
                        ))
                    })?;
                emit(Some(outputs), true)?;
            }
            Some(_) => emit(None, true)?,
        }
        Ok(compute)
    }

    /// Keeps what a finished step returned (a decoupled step's next
    /// response is its next iteration, and its stream goes on running);
    /// returns the response's compute times.
    fn receive(
        &self,
        done: Done,
        tensors: &mut Tensors,
        progress: &mut Progress,
        running: &mut Vec<Running>,
    ) -> Result<ComputeTimes> {
        match done {
            Done::Call {
                step,
                iteration,
                batch,
                result,
            } => {
                let response = result.map_err(|err| self.step_error(step, err))?;
                let compute = response.compute;
                self.store(step, iteration, batch, response, tensors)?;
                Ok(compute)
            }
            Done::Next {
                step,
                batch,
                stream,
                item,
            } => {
                let Some(StreamItem { response, last }) = item else {
                    return Ok(ComputeTimes::default());
                };
                if !last {
                    running.push(next_of(step, batch, stream));
                }
                let Some(response) = response else {
                    return Ok(ComputeTimes::default());
                };
                let response = response.map_err(|err| self.step_error(step, err))?;
                let compute = response.compute;
                let k = progress.iterations[step];
                progress.iterations[step] += 1;
                self.store(step, Some(k), batch, response, tensors)?;
                Ok(compute)
            }
        }
    }

    /// Starts every step (and iteration) whose inputs all exist now.
    fn start_ready_steps(
        &self,
        router: &Arc<dyn ModelRouter>,
        origin: &Origin,
        tensors: &Tensors,
        progress: &mut Progress,
        running: &mut Vec<Running>,
    ) -> Result<()> {
        for (i, step) in self.plan.steps.iter().enumerate() {
            if !progress.needed[i] {
                continue;
            }
            let runs: Vec<Option<usize>> = match step.follows {
                None if progress.started_once[i] => vec![],
                None => vec![None],
                Some(d) => (0..progress.iterations[d])
                    .filter(|k| !progress.started.contains(&(i, *k)))
                    .map(Some)
                    .collect(),
            };
            for iteration in runs {
                if !step
                    .inputs
                    .iter()
                    .all(|(_, t)| tensors.get(t, iteration).is_some())
                {
                    continue;
                }
                match iteration {
                    None => progress.started_once[i] = true,
                    Some(k) => {
                        progress.started.insert((i, k));
                    }
                }
                let (sub, batch) = self.step_request(i, origin, |t| {
                    tensors.get(t, iteration).expect("checked above")
                });
                if step.decoupled {
                    let stream = router
                        .infer_stream(sub)
                        .map_err(|err| self.step_error(i, err))?;
                    running.push(next_of(i, batch, stream));
                } else {
                    let call = router.infer(sub).map_err(|err| self.step_error(i, err))?;
                    running.push(Box::pin(async move {
                        Done::Call {
                            step: i,
                            iteration,
                            batch,
                            result: call.await,
                        }
                    }));
                }
            }
        }
        Ok(())
    }

    /// Fails a request in which a step that runs once never could: an
    /// optional ensemble input it reads was not sent.
    fn check_all_ran(&self, tensors: &Tensors, progress: &Progress) -> Result<()> {
        let steps = &self.plan.steps;
        let Some(i) = (0..steps.len()).find(|&i| {
            progress.needed[i] && steps[i].follows.is_none() && !progress.started_once[i]
        }) else {
            return Ok(());
        };
        let missing: Vec<&str> = steps[i]
            .inputs
            .iter()
            .filter(|(_, t)| tensors.get(t, None).is_none())
            .map(|(_, t)| t.as_str())
            .collect();
        Err(self.step_error(
            i,
            Error::invalid_arg(format!(
                "the step cannot run: tensor(s) {} were not provided",
                missing.join(", ")
            )),
        ))
    }

    /// The router to run the steps through, and the batch size of the
    /// request's inputs: each tensor carries the batch size of the request
    /// that produced it (0 when that model does not batch), for Triton's
    /// batch conversions.
    fn start(&self, request: &InferRequest) -> Result<(Arc<dyn ModelRouter>, usize)> {
        let router = self.models.upgrade().ok_or_else(|| {
            Error::unavailable(format!(
                "ensemble '{}': the server is shutting down",
                self.plan.name
            ))
        })?;
        let input_batch = if self.plan.batching {
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

    pub(super) fn step_error(&self, i: usize, err: Error) -> Error {
        err.in_step(&self.plan.name, i, &self.plan.steps[i].model)
    }

    /// Keeps a step's outputs, as of `iteration` when it has one.
    fn store(
        &self,
        step: usize,
        iteration: Option<usize>,
        batch: usize,
        response: InferResponse,
        tensors: &mut Tensors,
    ) -> Result<()> {
        let mut outputs = response.outputs;
        for (key, t) in &self.plan.steps[step].outputs {
            let pos = outputs.iter().position(|o| &o.name == key).ok_or_else(|| {
                self.step_error(
                    step,
                    Error::internal(format!("the model did not return output '{key}'")),
                )
            })?;
            let mut tensor = outputs.swap_remove(pos);
            tensor.name = t.clone();
            match iteration {
                Some(k) => tensors.iterations.insert((t.clone(), k), (tensor, batch)),
                None => tensors.shared.insert(t.clone(), (tensor, batch)),
            };
        }
        Ok(())
    }

    /// The ensemble's `wanted` outputs for an iteration, once they all exist.
    fn outputs_at(
        &self,
        tensors: &Tensors,
        iteration: Option<usize>,
        wanted: &[bool],
    ) -> Option<Vec<Tensor>> {
        let p = &self.plan;
        p.outputs
            .iter()
            .zip(p.output_dims.iter().zip(&p.output_unreshape))
            .zip(wanted)
            .filter(|(_, wanted)| **wanted)
            .map(|((name, (dims, unreshape)), _)| {
                let (tensor, batch) = tensors.get(name, iteration)?;
                let mut tensor = tensor.clone();
                tensor.shape = convert_for(dims, p.batching, *batch, &tensor.shape);
                if let Some(config_dims) = unreshape {
                    // A reshaped output is returned with its configured dims.
                    let batch = p
                        .batching
                        .then(|| tensor.shape.first().copied().unwrap_or(1));
                    tensor.shape = with_dims(config_dims, batch, tensor.element_count());
                }
                Some(tensor)
            })
            .collect()
    }

    /// The request step `i` sends, its inputs looked up by ensemble tensor
    /// name; with the batch size it carries (0 when the model does not batch).
    fn step_request<'a>(
        &self,
        i: usize,
        origin: &Origin,
        tensor: impl Fn(&str) -> &'a (Tensor, usize),
    ) -> (InferRequest, usize) {
        let step = &self.plan.steps[i];
        let inputs: Vec<Tensor> = step
            .inputs
            .iter()
            .zip(&step.input_dims)
            .map(|((key, t), dims)| {
                let (tensor, batch) = tensor(t);
                let mut tensor = tensor.clone();
                tensor.name = key.clone();
                tensor.shape = convert_for(dims, step.batching, *batch, &tensor.shape);
                tensor
            })
            .collect();
        let batch = if step.batching {
            inputs
                .first()
                .and_then(|t| t.shape.first())
                .map_or(0, |&b| b.max(0) as usize)
        } else {
            0
        };
        let sub = InferRequest {
            model_name: step.model.clone(),
            model_version: step.version,
            id: origin.id.clone(),
            inputs,
            outputs: step
                .outputs
                .iter()
                .map(|(key, _)| RequestedOutput {
                    name: key.clone(),
                    ..Default::default()
                })
                .collect(),
            parameters: origin.parameters.clone(),
            callers: origin.callers.clone(),
            responder: None,
            trace: origin.trace.as_ref().map(|t| t.child(&step.model)),
        };
        (sub, batch)
    }
}
