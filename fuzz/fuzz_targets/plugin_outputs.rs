//! What a plugin hands back: the outputs and parameters of its `response`
//! (and tensors made with `ops.set-output`) through the host's
//! `tern_wasm::host::ResponseShape::response` (conversion from the WIT types
//! and `validate_outputs`), then what the server does with an accepted
//! response: classification with the model's labels (`classify`, as the
//! scheduler applies it) and the HTTP, gRPC and generate encoders.
//!
//! Invariants: every accepted output is one the config declares, once, with
//! data of the size its shape and type say; the encoders carry each
//! output's data unchanged and the HTTP header is JSON.
#![no_main]

use std::collections::HashSet;
use std::sync::Arc;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tern::frontend::http::codec::HttpOptions;
use tern::frontend::{grpc, http};
use tern_core::classification::classify;
use tern_core::{bytes_tensor, RequestedOutput, Tensor};
use tern_wasm::host::{tensor_from_wit, ResponseShape};
use tern_wasm::tern::plugin::types as wit;

#[derive(Arbitrary, Debug)]
struct Out {
    name: u8,
    dtype: u8,
    dims: Vec<u8>,
    /// Make the data fit the shape (else it is taken as given).
    fit: bool,
    data: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Value {
    Bool(bool),
    Int(i64),
    Double(f64),
    String(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: u8,
    batch: u8,
    outputs: Vec<Out>,
    extra: Vec<Out>,
    parameters: Vec<(String, Value)>,
    requested: Vec<(u8, Option<u8>, Option<bool>)>,
    labels: String,
    binary_default: bool,
}

const DTYPES: [wit::DataType; 14] = [
    wit::DataType::Bool,
    wit::DataType::Uint8,
    wit::DataType::Uint16,
    wit::DataType::Uint32,
    wit::DataType::Uint64,
    wit::DataType::Int8,
    wit::DataType::Int16,
    wit::DataType::Int32,
    wit::DataType::Int64,
    wit::DataType::Fp16,
    wit::DataType::Fp32,
    wit::DataType::Fp64,
    wit::DataType::Bytes,
    wit::DataType::Bf16,
];

/// The config's output names, and one it does not have.
fn names(cfg: &tern_core::config::ModelConfig) -> Vec<String> {
    cfg.output
        .iter()
        .map(|o| o.name.clone())
        .chain(["undeclared".to_string()])
        .collect()
}

fn tensor(o: &Out, names: &[String]) -> wit::Tensor {
    let datatype = DTYPES[usize::from(o.dtype) % DTYPES.len()];
    let shape: Vec<i64> = o.dims.iter().take(3).map(|&d| i64::from(d % 9)).collect();
    let count = tern_core::tensor::element_count(&shape);
    let probe = tensor_from_wit(wit::Tensor {
        name: String::new(),
        datatype,
        shape: Vec::new(),
        data: Vec::new(),
    });
    let data = match (o.fit, probe.dtype.size()) {
        (false, _) => o.data.clone(),
        (true, Some(size)) if !o.data.is_empty() || count == 0 => {
            o.data.iter().copied().cycle().take(count * size).collect()
        }
        (true, Some(_)) => o.data.clone(),
        (true, None) => {
            let per = o.data.len().checked_div(count).unwrap_or(0);
            bytes_tensor::encode((0..count).map(|i| &o.data[i * per..(i + 1) * per]))
        }
    };
    wit::Tensor {
        name: names[usize::from(o.name) % names.len()].clone(),
        datatype,
        shape,
        data,
    }
}

fuzz_target!(|input: Input| {
    let cfg = tern_fuzz::configs()[usize::from(input.config) % 4].clone();
    let names = names(&cfg);
    let shape = ResponseShape {
        model: "m".into(),
        version: 1,
        config: Arc::new(cfg.clone()),
    };
    let response = wit::Response {
        outputs: input.outputs.iter().map(|o| tensor(o, &names)).collect(),
        parameters: input
            .parameters
            .iter()
            .map(|(k, v)| wit::Parameter {
                key: k.clone(),
                value: match v {
                    Value::Bool(b) => wit::ParameterValue::Bool(*b),
                    Value::Int(i) => wit::ParameterValue::Int(*i),
                    Value::Double(d) => wit::ParameterValue::Double(*d),
                    Value::String(s) => wit::ParameterValue::String(s.clone()),
                },
            })
            .collect(),
    };
    let extra: Vec<Tensor> = input
        .extra
        .iter()
        .map(|o| tensor_from_wit(tensor(o, &names)))
        .collect();
    let batch = usize::from(input.batch % 9);
    let Ok(mut resp) = shape.response("id", batch, response, extra) else {
        return;
    };
    let mut seen = HashSet::new();
    for t in &resp.outputs {
        assert!(seen.insert(t.name.clone()), "output '{}' twice", t.name);
        assert!(cfg.output.iter().any(|o| o.name == t.name));
        t.check_size_as("output")
            .expect("accepted outputs have consistent sizes");
    }
    // The scheduler's classification, with the output's label file.
    let labels: Vec<String> = input.labels.lines().map(str::to_string).collect();
    let requested: Vec<RequestedOutput> = input
        .requested
        .iter()
        .map(|(n, k, binary)| RequestedOutput {
            name: names[usize::from(*n) % names.len()].clone(),
            classification: k.map(usize::from).filter(|&k| k > 0),
            binary: *binary,
            shm: None,
        })
        .collect();
    for want in &requested {
        let Some(k) = want.classification else {
            continue;
        };
        if let Some(t) = resp.outputs.iter_mut().find(|t| t.name == want.name) {
            if let Ok(c) = classify(t, k, Some(&labels), cfg.max_batch_size > 0) {
                c.check_size_as("output")
                    .expect("classification is consistent");
                *t = c;
            }
        }
    }
    let opts = HttpOptions {
        binary_default: input.binary_default,
    };
    let encoded = http::codec::encode_response(&resp, &requested, &opts);
    let header_len = encoded.json_len.unwrap_or(encoded.parts[0].len());
    assert_eq!(header_len, encoded.parts[0].len());
    let header = std::str::from_utf8(&encoded.parts[0]).expect("utf-8 header");
    let finite = !header.contains("NaN") && !header.contains("Infinity");
    if finite {
        serde_json::from_str::<serde_json::Value>(header)
            .unwrap_or_else(|e| panic!("header is not JSON: {e}\n{header}"));
    }
    let _ = http::generate::response_json(&resp).to_string();
    let outputs = resp.outputs.clone();
    let g = grpc::codec::encode_response(resp, &requested);
    for (t, raw) in outputs.iter().zip(&g.raw_output_contents) {
        assert_eq!(*raw, t.data);
    }
});
