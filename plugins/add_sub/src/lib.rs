//! `add_sub`: the twin of Triton's Python `add_sub` example. OUTPUT0 =
//! INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32, [4] per request). The
//! whole request list is computed as one batch with the SDK's gather/split
//! helpers.

use tern_plugin::{
    export_model, gather, per_request, Error, Model, ModelContext, Request, Response,
};

struct AddSub;

impl Model for AddSub {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(AddSub)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        let run = || -> Result<Vec<Response>, Error> {
            let a = gather::<f32>(&requests, "INPUT0")?;
            let b = gather::<f32>(&requests, "INPUT1")?;
            let sum = a.data.iter().zip(&b.data).map(|(x, y)| x + y).collect();
            let diff = a.data.iter().zip(&b.data).map(|(x, y)| x - y).collect();
            let sums = a.split("OUTPUT0", sum, &a.inner)?;
            let diffs = a.split("OUTPUT1", diff, &a.inner)?;
            Ok(sums
                .into_iter()
                .zip(diffs)
                .map(|(s, d)| Response::new(vec![s, d]))
                .collect())
        };
        per_request(requests.len(), run())
    }
}

export_model!(AddSub);
