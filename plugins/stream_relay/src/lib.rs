//! `stream_relay`: streaming BLS in Rust. Calls the model named by the
//! `target` parameter (default `stream_count`) with this request's `COUNT`
//! through `exec_stream` — Triton's `exec(decoupled=True)` — and answers
//! with every `OUT` it streamed back, in order, as `OUTS` (INT32 `[n]`).

use tern_plugin::{
    export_model, Error, InferRequest, Model, ModelContext, Request, Response, Tensor,
};

struct Relay {
    target: String,
}

impl Relay {
    fn relay(&self, r: &Request) -> Result<Response, Error> {
        let count = r.input("COUNT")?.clone();
        let mut outs = Vec::new();
        for response in InferRequest::new(&self.target)
            .with_input(count)
            .exec_stream()?
        {
            outs.extend(response?.output("OUT")?.to_vec::<i32>()?);
        }
        let n = outs.len() as i64;
        Ok(Response::new(vec![Tensor::from_vec("OUTS", vec![n], outs)]))
    }
}

impl Model for Relay {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        Ok(Relay {
            target: ctx
                .parameter("target")
                .unwrap_or_else(|| "stream_count".into()),
        })
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests.iter().map(|r| self.relay(r)).collect()
    }
}

export_model!(Relay);
