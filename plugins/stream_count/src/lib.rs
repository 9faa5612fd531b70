//! `stream_count`: a decoupled test plugin. For each request, `COUNT` (INT32
//! `[1]`) responses `OUT` = 0, 1, ... (INT32 `[1]`), then the final flag on
//! its own; a negative `COUNT` is answered with an error (`-3`: with an
//! error response that leaves the stream open, then `OUT` = 7, then the
//! final flag). Request
//! parameters: `delay_ms` sleeps before each response; `later` (bool) keeps
//! the response sender and answers during the instance's next `execute`
//! call — a decoupled model may answer after `execute` returned; `ignore`
//! (bool) never takes the request's sender at all. A request
//! whose client goes away stops early and logs how far it got.

use std::time::Duration;

use tern_plugin::{
    export_model, log, Error, LogLevel, Model, ModelContext, ParameterValue, Request, Response,
    ResponseSender, Tensor, RESPONSE_COMPLETE_FINAL,
};

struct Job {
    sender: ResponseSender,
    count: i32,
    delay: Duration,
}

struct StreamCount {
    held: Vec<Job>,
}

/// What a request asks for: its count and delay.
fn read(r: &Request) -> Result<(i32, Duration), Error> {
    let count = r.input("COUNT")?.to_vec::<i32>()?;
    let delay = match r.parameter("delay_ms") {
        Some(ParameterValue::Int(ms)) => Duration::from_millis((*ms).clamp(0, 10_000) as u64),
        _ => Duration::ZERO,
    };
    Ok((count.first().copied().unwrap_or(0), delay))
}

fn run(job: Job) -> Result<(), Error> {
    let Job {
        sender,
        count,
        delay,
    } = job;
    if count == -3 {
        sender.send_error_response(
            &Error::invalid_arg("COUNT -3: an error response, the stream stays open"),
            0,
        )?;
        let out = Tensor::from_vec("OUT", vec![1], vec![7]);
        sender.send(Some(&Response::new(vec![out])), 0)?;
        return sender.send(None, RESPONSE_COMPLETE_FINAL);
    }
    if count < 0 {
        return sender.send_error(&Error::invalid_arg(format!(
            "COUNT must be >= 0, got {count}"
        )));
    }
    for i in 0..count {
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if sender.is_cancelled() {
            log(
                LogLevel::Info,
                &format!("request cancelled after {i} of {count} responses"),
            );
            return sender.send(None, RESPONSE_COMPLETE_FINAL);
        }
        let out = Tensor::from_vec("OUT", vec![1], vec![i]);
        sender.send(Some(&Response::new(vec![out])), 0)?;
    }
    sender.send(None, RESPONSE_COMPLETE_FINAL)
}

impl Model for StreamCount {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(StreamCount { held: Vec::new() })
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        // Requests held back by an earlier call are answered first.
        for job in std::mem::take(&mut self.held) {
            let _ = run(job);
        }
        for (i, r) in requests.iter().enumerate() {
            // `ignore`: never take the sender (the server must still end the stream).
            if matches!(r.parameter("ignore"), Some(ParameterValue::Bool(true))) {
                continue;
            }
            let sender = match tern_plugin::response_sender(i) {
                Ok(s) => s,
                Err(e) => {
                    log(LogLevel::Error, &format!("request {i}: {}", e.message));
                    continue;
                }
            };
            let later = matches!(r.parameter("later"), Some(ParameterValue::Bool(true)));
            let (count, delay) = match read(r) {
                Ok(x) => x,
                Err(e) => {
                    let _ = sender.send_error(&e);
                    continue;
                }
            };
            let job = Job {
                sender,
                count,
                delay,
            };
            if later {
                self.held.push(job);
            } else if let Err(e) = run(job) {
                log(LogLevel::Verbose, &format!("stream ended: {}", e.message));
            }
        }
        Vec::new()
    }
}

export_model!(StreamCount);
