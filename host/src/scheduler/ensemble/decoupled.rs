//! Ensembles with a decoupled step, as Triton runs them: the ensemble is
//! decoupled too; every response of the decoupled step is one *iteration*
//! of its outputs; a step downstream of it runs once per iteration, as soon
//! as that iteration's inputs exist (inputs that do not descend from the
//! decoupled step are shared by every iteration); the ensemble sends one
//! response per iteration once all its outputs exist for it — in iteration
//! order, so tokens stay in order — and the final flag when no step is
//! running. A step may not take inputs from two
//! different decoupled steps (Triton's rule); a decoupled step downstream of
//! another one, and outputs following two different decoupled steps, are
//! refused as not supported yet.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

use super::{convert_for, with_dims, Ensemble, Step};
use tern_core::config::pb::ModelConfig;
use tern_core::error::{Code, Error, Result};
use tern_core::router::ResponseStream;
use tern_core::{InferRequest, InferResponse, RequestedOutput, Responder, StreamItem, Tensor};

/// Works out, in DAG order, which decoupled step each step follows, checking
/// Triton's rule; returns the decoupled step the ensemble's outputs follow.
pub(super) fn follow(e: &str, cfg: &ModelConfig, steps: &mut [Step]) -> Result<Option<usize>> {
    let mut origin: HashMap<String, Option<usize>> =
        cfg.input.iter().map(|i| (i.name.clone(), None)).collect();
    let mut done = vec![false; steps.len()];
    while let Some(i) = (0..steps.len())
        .find(|&i| !done[i] && steps[i].inputs.iter().all(|(_, t)| origin.contains_key(t)))
    {
        done[i] = true;
        let from: BTreeSet<usize> = steps[i]
            .inputs
            .iter()
            .filter_map(|(_, t)| origin[t])
            .collect();
        let m = &steps[i].model;
        if from.len() > 1 {
            return Err(Error::invalid_arg(format!(
                "in ensemble {e}, step of model '{m}' receives inputs originated from different decoupled models"
            )));
        }
        let from = from.first().copied();
        if let (true, Some(d)) = (steps[i].decoupled, from) {
            return Err(Error::unsupported(format!(
                "ensemble '{e}': step {i} (model '{m}') is decoupled and follows the decoupled step {d} (model '{}'); \
                 a decoupled step after another is not supported yet",
                steps[d].model
            )));
        }
        steps[i].follows = from;
        let produces = if steps[i].decoupled { Some(i) } else { from };
        for (_, t) in &steps[i].outputs {
            origin.insert(t.clone(), produces);
        }
    }
    let outputs: BTreeSet<usize> = cfg
        .output
        .iter()
        .filter_map(|o| origin.get(&o.name).copied().flatten())
        .collect();
    if outputs.len() > 1 {
        return Err(Error::unsupported(format!(
            "ensemble '{e}': its outputs follow different decoupled steps; that is not supported yet"
        )));
    }
    Ok(outputs.first().copied())
}

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

/// The tensors of one request: shared by every iteration, or of one.
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

impl Ensemble {
    /// Runs a request of a decoupled ensemble, sending each ensemble response
    /// (checked against `config`) and then the final flag through `sink`.
    pub(super) async fn run_decoupled(
        &self,
        request: InferRequest,
        sink: &Responder,
        config: &ModelConfig,
        version: i64,
        batch_size: usize,
    ) -> Result<()> {
        let e = &self.name;
        let (router, input_batch) = self.start(&request)?;
        let mut tensors = Tensors::default();
        for t in &request.inputs {
            tensors
                .shared
                .insert(t.name.clone(), (t.clone(), input_batch));
        }
        let mut callers = request.callers.clone();
        callers.push(e.clone());
        // Responses received from each decoupled step so far.
        let mut iterations = vec![0usize; self.steps.len()];
        let mut started_once = vec![false; self.steps.len()];
        let mut started: HashSet<(usize, usize)> = HashSet::new();
        let mut sent = 0usize;
        let mut running: Vec<Running> = Vec::new();
        loop {
            if sink.0.is_cancelled() {
                return Err(Error::new(
                    Code::Cancelled,
                    format!("request for ensemble '{e}' was cancelled: its client has gone away"),
                ));
            }
            for (i, step) in self.steps.iter().enumerate() {
                let runs: Vec<Option<usize>> = match step.follows {
                    None if started_once[i] => vec![],
                    None => vec![None],
                    Some(d) => (0..iterations[d])
                        .filter(|k| !started.contains(&(i, *k)))
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
                        None => started_once[i] = true,
                        Some(k) => {
                            started.insert((i, k));
                        }
                    }
                    let meta = (request.id.as_str(), &request.parameters);
                    let (sub, batch) = self.step_request(i, meta, &callers, |t| {
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
            // Responses go out in the order of the decoupled step's responses
            // (tokens stay in order even when later iterations finish first).
            if let Some(d) = self.streams_from {
                while sent < iterations[d] {
                    let Some(outputs) = self.outputs_at(&tensors, Some(sent)) else {
                        break;
                    };
                    let response = self.response(&request, outputs, config, version, batch_size)?;
                    sink.0.send(Some(Ok(response)), false)?;
                    sent += 1;
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
            match done {
                Done::Call {
                    step,
                    iteration,
                    batch,
                    result,
                } => {
                    let response = result.map_err(|err| self.step_error(step, err))?;
                    self.store(step, iteration, batch, response, &mut tensors)?;
                }
                Done::Next {
                    step,
                    batch,
                    stream,
                    item,
                } => {
                    let Some(StreamItem { response, last }) = item else {
                        continue;
                    };
                    if let Some(response) = response {
                        let response = response.map_err(|err| self.step_error(step, err))?;
                        let k = iterations[step];
                        iterations[step] += 1;
                        self.store(step, Some(k), batch, response, &mut tensors)?;
                    }
                    if !last {
                        running.push(next_of(step, batch, stream));
                    }
                }
            }
        }
        if let Some(i) =
            (0..self.steps.len()).find(|&i| self.steps[i].follows.is_none() && !started_once[i])
        {
            return Err(self.step_error(
                i,
                Error::invalid_arg("the step cannot run: its input tensors were not provided"),
            ));
        }
        if self.streams_from.is_none() {
            let outputs = self.outputs_at(&tensors, None).ok_or_else(|| {
                Error::internal(format!("ensemble '{e}': an output was not produced"))
            })?;
            let response = self.response(&request, outputs, config, version, batch_size)?;
            return sink.0.send(Some(Ok(response)), true);
        }
        sink.0.send(None, true)
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
        for (key, t) in &self.steps[step].outputs {
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

    /// The ensemble's outputs for an iteration, once they all exist.
    fn outputs_at(&self, tensors: &Tensors, iteration: Option<usize>) -> Option<Vec<Tensor>> {
        self.outputs
            .iter()
            .zip(self.output_dims.iter().zip(&self.output_unreshape))
            .map(|(name, (dims, unreshape))| {
                let (tensor, batch) = tensors.get(name, iteration)?;
                let mut tensor = tensor.clone();
                tensor.shape = convert_for(dims, self.batching, *batch, &tensor.shape);
                if let Some(config_dims) = unreshape {
                    let batch = self
                        .batching
                        .then(|| tensor.shape.first().copied().unwrap_or(1));
                    tensor.shape = with_dims(config_dims, batch, tensor.element_count());
                }
                Some(tensor)
            })
            .collect()
    }

    fn response(
        &self,
        request: &InferRequest,
        outputs: Vec<Tensor>,
        config: &ModelConfig,
        version: i64,
        batch_size: usize,
    ) -> Result<InferResponse> {
        tern_core::validate::validate_outputs(config, batch_size, &outputs)?;
        Ok(InferResponse {
            model_name: self.name.clone(),
            model_version: version,
            id: request.id.clone(),
            outputs,
            ..Default::default()
        })
    }

    /// The request step `i` sends, its inputs looked up by ensemble tensor
    /// name; with the batch size it carries (0 when the model does not batch).
    pub(super) fn step_request<'a>(
        &self,
        i: usize,
        (id, parameters): (&str, &tern_core::Parameters),
        callers: &[String],
        tensor: impl Fn(&str) -> &'a (Tensor, usize),
    ) -> (InferRequest, usize) {
        let step = &self.steps[i];
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
            id: id.to_string(),
            inputs,
            outputs: step
                .outputs
                .iter()
                .map(|(key, _)| RequestedOutput {
                    name: key.clone(),
                    ..Default::default()
                })
                .collect(),
            parameters: parameters.clone(),
            callers: callers.to_vec(),
            responder: None,
        };
        (sub, batch)
    }
}
