//! `empty_rust`: answers every request with an empty response. The
//! per-call floor of a Rust plugin (`make bench-lang`).

use tern_plugin::{export_model, Error, Model, ModelContext, Request, Response};

struct Empty;

impl Model for Empty {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(Empty)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests
            .iter()
            .map(|_| Ok(Response::new(Vec::new())))
            .collect()
    }
}

export_model!(Empty);
