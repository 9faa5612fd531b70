//! `{{name}}`: OUTPUT0 = INPUT0 * 2.

use tern_plugin::{export_model, log, Error, LogLevel, Model, ModelContext, Request, Response, Tensor};

struct Plugin;

impl Model for Plugin {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        log(LogLevel::Info, &format!("{} ready on {}", ctx.model_name, ctx.instance_name));
        Ok(Plugin)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests
            .iter()
            .map(|r| {
                let x = r.input("INPUT0")?;
                let y: Vec<f32> = x.to_vec::<f32>()?.iter().map(|v| v * 2.0).collect();
                Ok(Response::new(vec![Tensor::from_vec("OUTPUT0", x.shape.clone(), y)]))
            })
            .collect()
    }
}

export_model!(Plugin);
