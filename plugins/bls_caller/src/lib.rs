//! `bls_caller`: business logic scripting. `ROUTE` (STRING) is a
//! comma-separated list of models; the plugin calls the first one with
//! INPUT0/INPUT1 (INT32 [16]) in-process — passing the rest of the route
//! along when the callee is another `bls_caller` — and returns the callee's
//! OUTPUT0/OUTPUT1. Errors of the callee (including the server's refusal of
//! call cycles) come back as this request's error.

use tern_plugin::{
    export_model, log, Error, InferRequest, LogLevel, Model, ModelContext, Request, Response,
    Tensor,
};

struct BlsCaller;

fn call(r: &Request) -> Result<Response, Error> {
    let route = r
        .input("ROUTE")?
        .texts()?
        .first()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let (target, rest) = route.split_once(',').unwrap_or((route.as_str(), ""));
    if target.is_empty() {
        return Err(Error::invalid_arg("ROUTE is empty"));
    }
    let mut req = InferRequest::new(target)
        .with_input(r.input("INPUT0")?.clone())
        .with_input(r.input("INPUT1")?.clone())
        .with_output("OUTPUT0")
        .with_output("OUTPUT1");
    if target.starts_with("bls") {
        req = req.with_input(Tensor::from_strings("ROUTE", vec![1], &[rest]));
    }
    log(LogLevel::Verbose, &format!("calling '{target}'"));
    let resp = req.exec()?;
    Ok(Response::new(vec![
        resp.output("OUTPUT0")?.clone(),
        resp.output("OUTPUT1")?.clone(),
    ]))
}

impl Model for BlsCaller {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(BlsCaller)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests.iter().map(call).collect()
    }
}

export_model!(BlsCaller);
