//! `sequence_sum`: a stateful plugin served by the sequence batcher that
//! keeps its own per-sequence state. Each request's `INPUT` (INT32, one
//! element) is added to the running sum of its sequence (keyed by the
//! correlation id, number or string); `OUTPUT` is the sum so far. START
//! resets the sum, END forgets the sequence. `CORRID` echoes the correlation
//! id as text and `READY` the READY control input the batcher adds (0 for the
//! filler rows of empty `direct` slots, which change nothing).

use std::collections::HashMap;

use tern_plugin::{
    export_model, CorrelationId, Error, Model, ModelContext, Request, Response, Tensor,
};

/// Request flag bits of the `tern:plugin` contract.
const START: u32 = 1;
const END: u32 = 2;

struct SequenceSum {
    sums: HashMap<String, i32>,
}

fn key(id: &CorrelationId) -> String {
    match id {
        CorrelationId::Number(n) => n.to_string(),
        CorrelationId::Text(s) => s.clone(),
        CorrelationId::None => String::new(),
    }
}

impl SequenceSum {
    fn run(&mut self, r: &Request) -> Result<Response, Error> {
        let value = r.input("INPUT")?.to_vec::<i32>()?;
        let ready = r.input("READY")?.to_vec::<i32>()?;
        let shape = r.input("INPUT")?.shape.clone();
        let id = key(&r.correlation_id);
        let ready = ready.first().copied().unwrap_or(0);
        let sum = if ready == 0 {
            0
        } else {
            if r.flags & START != 0 {
                self.sums.remove(&id);
            }
            let sum = self.sums.entry(id.clone()).or_insert(0);
            *sum += value.iter().sum::<i32>();
            let total = *sum;
            if r.flags & END != 0 {
                self.sums.remove(&id);
            }
            total
        };
        Ok(Response::new(vec![
            Tensor::from_vec("OUTPUT", shape.clone(), vec![sum]),
            Tensor::from_strings("CORRID_OUT", shape.clone(), &[id.as_bytes()]),
            Tensor::from_vec("READY_OUT", shape, vec![ready]),
        ]))
    }
}

impl Model for SequenceSum {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(SequenceSum {
            sums: HashMap::new(),
        })
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests.iter().map(|r| self.run(r)).collect()
    }
}

export_model!(SequenceSum);
