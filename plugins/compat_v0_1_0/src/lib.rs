//! `compat_v0_1_0`: a plugin built against the first published contract,
//! `tern:plugin@0.1.0` (frozen in `wit/plugin.wit` next to this crate), with
//! wit-bindgen directly and no SDK. The server must keep loading and running
//! such components as the contract grows (tests/test_decoupled.py).
//! `OUTPUT0` = `INPUT0` (any type), and the host's `log` import is used.

wit_bindgen::generate!({
    path: "wit",
    world: "tern:plugin/plugin",
});

use exports::tern::plugin::model::Guest;
use tern::plugin::host::{log, LogLevel};
use tern::plugin::types::{Error, ModelContext, Request, Response, Tensor};

struct Compat;

impl Guest for Compat {
    fn initialize(ctx: ModelContext) -> Result<(), Error> {
        log(
            LogLevel::Info,
            &format!("compat plugin for '{}' (tern:plugin@0.1.0)", ctx.model_name),
        );
        Ok(())
    }

    fn execute(requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests
            .into_iter()
            .map(|r| {
                let outputs = r
                    .inputs
                    .into_iter()
                    .filter(|t| t.name == "INPUT0")
                    .map(|t| Tensor {
                        name: "OUTPUT0".into(),
                        ..t
                    })
                    .collect();
                Ok(Response {
                    outputs,
                    parameters: Vec::new(),
                })
            })
            .collect()
    }

    fn finalize() {}
}

export!(Compat);
