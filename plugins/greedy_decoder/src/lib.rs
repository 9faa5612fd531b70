//! `greedy_decoder`: autoregressive generation done in-process with BLS —
//! the pattern Triton users write in a Python-backend `model.py` loop (the
//! "GPT chitchat" seeds), here without leaving the server process. For each
//! request, `input_ids` (INT64 `[1, tokens]`) is extended one token at a
//! time: the plugin calls the language model named by the `model`
//! parameter (default `tiny_lm`, which returns `logits` FP32 `[1, vocab]`
//! for the next token), takes the argmax, appends it, and stops at
//! `eos_token_id` or after `max_new_tokens`. Output `output_ids` (INT64
//! `[1, new tokens]`). Every step goes through the language model's own
//! scheduler, so concurrent generations share its dynamic batcher.
//!
//! Served as a decoupled model (`model_transaction_policy { decoupled: true
//! }`, `model_repository/greedy_decoder_stream`), it streams: one response
//! per generated token (`output_ids` `[1, 1]`), then the final flag, and
//! stops early when the client has gone away.

use tern_plugin::{
    export_model, Error, InferRequest, Model, ModelContext, Request, Response, ResponseSender,
    Tensor, RESPONSE_COMPLETE_FINAL,
};

struct Greedy {
    model: String,
    max_new_tokens: usize,
    eos: i64,
    decoupled: bool,
}

fn number<T: std::str::FromStr>(ctx: &ModelContext, key: &str, default: T) -> Result<T, Error> {
    match ctx.parameter(key) {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|_| {
            Error::invalid_arg(format!("parameter '{key}' must be a number, got '{v}'"))
        }),
    }
}

impl Greedy {
    /// Generates for one request; with a sender, each token goes out as it is made.
    fn generate(&self, r: &Request, sender: Option<&ResponseSender>) -> Result<Response, Error> {
        let prompt = r.input("input_ids")?;
        if prompt.shape.len() != 2 || prompt.shape[0] != 1 || prompt.shape[1] < 1 {
            return Err(Error::invalid_arg(format!(
                "input_ids must be [1, tokens] with at least one token, got {:?}",
                prompt.shape
            )));
        }
        let mut ids = prompt.to_vec::<i64>()?;
        let mut generated = Vec::new();
        while generated.len() < self.max_new_tokens {
            let step = InferRequest::new(&self.model)
                .with_input(Tensor::from_vec(
                    "input_ids",
                    vec![1, ids.len() as i64],
                    ids.clone(),
                ))
                .with_output("logits")
                .exec()?;
            let logits = step.output("logits")?.to_vec::<f32>()?;
            let next = logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as i64)
                .ok_or_else(|| {
                    Error::internal(format!("model '{}' returned empty logits", self.model))
                })?;
            generated.push(next);
            let last = next == self.eos || generated.len() == self.max_new_tokens;
            if let Some(sender) = sender {
                if sender.is_cancelled() {
                    return Err(Error::new(tern_plugin::ErrorCode::Cancelled, "cancelled"));
                }
                // The last token carries the final flag: no empty response is needed.
                let token = Tensor::from_vec("output_ids", vec![1, 1], vec![next]);
                let flags = if last { RESPONSE_COMPLETE_FINAL } else { 0 };
                sender.send(Some(&Response::new(vec![token])), flags)?;
            }
            if last {
                break;
            }
            ids.push(next);
        }
        let n = generated.len() as i64;
        Ok(Response::new(vec![Tensor::from_vec(
            "output_ids",
            vec![1, n],
            generated,
        )]))
    }
}

impl Model for Greedy {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        Ok(Greedy {
            model: ctx.parameter("model").unwrap_or_else(|| "tiny_lm".into()),
            max_new_tokens: number(&ctx, "max_new_tokens", 16)?,
            eos: number(&ctx, "eos_token_id", 0)?,
            decoupled: ctx.is_decoupled(),
        })
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        if !self.decoupled {
            return requests.iter().map(|r| self.generate(r, None)).collect();
        }
        for (i, r) in requests.iter().enumerate() {
            let sent = tern_plugin::response_sender(i).and_then(|sender| {
                match self.generate(r, Some(&sender)) {
                    // No token at all (max_new_tokens 0): only the final flag.
                    Ok(_) if self.max_new_tokens == 0 => sender.send(None, RESPONSE_COMPLETE_FINAL),
                    Ok(_) => Ok(()),
                    // Dropping the sender sends the final flag.
                    Err(e) if sender.is_cancelled() => Err(e),
                    Err(e) => sender.send_error(&e),
                }
            });
            if let Err(e) = sent {
                tern_plugin::log(
                    tern_plugin::LogLevel::Verbose,
                    &format!("stream {i} ended early: {}", e.message),
                );
            }
        }
        // Every request was answered through its sender.
        Vec::new()
    }
}

export_model!(Greedy);
