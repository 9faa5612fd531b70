//! `simple_identity`: returns its STRING input unchanged (the twin of
//! Triton's Python identity example), one request at a time.

use tern_plugin::{export_model, Error, Model, ModelContext, Request, Response};

struct Identity;

impl Model for Identity {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(Identity)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests
            .into_iter()
            .map(|r| {
                let t = r.input("INPUT0")?.clone().renamed("OUTPUT0");
                Ok(Response::new(vec![t]))
            })
            .collect()
    }
}

export_model!(Identity);
