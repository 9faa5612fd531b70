//! What the fuzz targets share: the model configs requests are checked
//! against, a shared-memory registry with a real region, the comparisons
//! behind the round-trip invariants, and reference encoders that turn a
//! decoded request back into the wire forms a client sends (HTTP JSON with
//! binary data, gRPC `ModelInferRequest`). The functions under test are
//! always the server's own; only these encoders (the inverse of the
//! decoders, which the server never needs) live here.

use std::sync::OnceLock;

use serde_json::{Map, Value};
use tern::proto::{model_infer_request, ModelInferRequest};
use tern_core::config::{parse_pbtxt, ModelConfig};
use tern_core::{DataType, InferRequest, Parameter, Parameters, RequestedOutput, Tensor};
use tern_memory::shm::SharedMemory;

/// The name of the one registered shared-memory region.
pub const REGION: &str = "region";
/// Its size in bytes.
pub const REGION_BYTES: usize = 256;

/// The configs requests are decoded and validated against (the test
/// models' shapes: batching and not, variable dims, BYTES, several inputs).
pub const CONFIGS: [&str; 4] = [
    r#"name: "m" max_batch_size: 8 input [{name: "INPUT0" data_type: TYPE_FP32 dims: [-1]}] output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1]}]"#,
    r#"name: "m" max_batch_size: 0 input [{name: "INPUT0" data_type: TYPE_INT32 dims: [16]}, {name: "INPUT1" data_type: TYPE_INT32 dims: [16]}] output [{name: "OUTPUT0" data_type: TYPE_INT32 dims: [16]}, {name: "OUTPUT1" data_type: TYPE_INT32 dims: [16]}]"#,
    r#"name: "m" max_batch_size: 4 input [{name: "text_input" data_type: TYPE_STRING dims: [1]}, {name: "max_tokens" data_type: TYPE_INT64 dims: [1] optional: true}] output [{name: "text_output" data_type: TYPE_STRING dims: [-1]}]"#,
    r#"name: "m" max_batch_size: 0 input [{name: "X" data_type: TYPE_UINT8 dims: [-1, 2, -1]}, {name: "B" data_type: TYPE_BOOL dims: [2] reshape: {shape: [1, 2]}}, {name: "H" data_type: TYPE_FP16 dims: [-1]}, {name: "D" data_type: TYPE_FP64 dims: [-1]}] output [{name: "Y" data_type: TYPE_UINT8 dims: [-1]}]"#,
];

/// [`CONFIGS`], parsed once.
pub fn configs() -> &'static [ModelConfig] {
    static C: OnceLock<Vec<ModelConfig>> = OnceLock::new();
    C.get_or_init(|| {
        CONFIGS
            .iter()
            .map(|t| parse_pbtxt(t).expect("fuzz config"))
            .collect()
    })
}

/// A registry with client shared memory on and one system region,
/// [`REGION`], of [`REGION_BYTES`] bytes (its `/dev/shm` object is removed
/// once mapped).
pub fn shm() -> &'static SharedMemory {
    static S: OnceLock<SharedMemory> = OnceLock::new();
    S.get_or_init(|| {
        let shm = SharedMemory::new(true);
        let key = format!("tern_fuzz_{}", std::process::id());
        let path = std::path::Path::new("/dev/shm").join(&key);
        std::fs::write(&path, [0u8; REGION_BYTES]).expect("/dev/shm object");
        let registered = shm.register_system(REGION, &key, 0, REGION_BYTES as u64);
        let _ = std::fs::remove_file(&path);
        registered.expect("register the fuzz region");
        shm
    })
}

/// Whether two doubles are the same value (every NaN is the same).
pub fn same_f64(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Whether two parameter sets are equal (NaN equal to NaN).
pub fn same_parameters(a: &Parameters, b: &Parameters) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((ka, va), (kb, vb))| {
            ka == kb
                && match (va, vb) {
                    (Parameter::Double(x), Parameter::Double(y)) => same_f64(*x, *y),
                    _ => va == vb,
                }
        })
}

/// Whether two tensors hold the same values: the same bytes, except that
/// any NaN of a float type equals any other NaN.
pub fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    if a.name != b.name || a.dtype != b.dtype || a.shape != b.shape {
        return false;
    }
    if a.data.len() != b.data.len() {
        return false;
    }
    let nan_equal = |n: usize, is_nan: &dyn Fn(&[u8]) -> bool| {
        a.data
            .chunks(n)
            .zip(b.data.chunks(n))
            .all(|(x, y)| x == y || (is_nan(x) && is_nan(y)))
    };
    match a.dtype {
        DataType::Fp32 => nan_equal(4, &|c| {
            c.len() == 4 && f32::from_le_bytes(c.try_into().expect("4")).is_nan()
        }),
        DataType::Fp64 => nan_equal(8, &|c| {
            c.len() == 8 && f64::from_le_bytes(c.try_into().expect("8")).is_nan()
        }),
        // Any non-zero byte is `true` (the JSON form writes it so).
        DataType::Bool => a
            .data
            .iter()
            .zip(&b.data)
            .all(|(x, y)| (*x != 0) == (*y != 0)),
        _ => a.data == b.data,
    }
}

/// Whether two decoded requests are equivalent (what a backend would see).
pub fn same_request(a: &InferRequest, b: &InferRequest) -> bool {
    a.model_name == b.model_name
        && a.model_version == b.model_version
        && a.id == b.id
        && a.inputs.len() == b.inputs.len()
        && a.inputs
            .iter()
            .zip(&b.inputs)
            .all(|(x, y)| same_tensor(x, y))
        && a.outputs == b.outputs
        && same_parameters(&a.parameters, &b.parameters)
}

/// A parameter as request JSON text: non-finite doubles as Triton's bare
/// `NaN`/`Infinity`/`-Infinity` tokens, which the decoder reads.
fn parameter_text(p: &Parameter) -> String {
    match p {
        Parameter::Double(d) if d.is_nan() => "NaN".into(),
        Parameter::Double(d) if d.is_infinite() => {
            if *d > 0.0 { "Infinity" } else { "-Infinity" }.into()
        }
        Parameter::Double(d) => Value::from(*d).to_string(),
        Parameter::Bool(b) => b.to_string(),
        Parameter::Int(i) => i.to_string(),
        Parameter::String(s) => Value::String(s.clone()).to_string(),
    }
}

/// The parameters of a requested output, as a client sends them.
fn output_parameters(o: &RequestedOutput) -> Map<String, Value> {
    let mut p = Map::new();
    if let Some(b) = o.binary {
        p.insert("binary_data".into(), Value::Bool(b));
    }
    if let Some(k) = o.classification {
        p.insert("classification".into(), Value::from(k as u64));
    }
    if let Some(t) = &o.shm {
        p.insert(
            "shared_memory_region".into(),
            Value::String(t.region.name().into()),
        );
        p.insert("shared_memory_offset".into(), Value::from(t.offset as u64));
        p.insert(
            "shared_memory_byte_size".into(),
            Value::from(t.byte_size as u64),
        );
    }
    p
}

/// A decoded request as an HTTP body again: the JSON header (every input's
/// data in the binary section), then the data. Returns the body and the
/// `Inference-Header-Content-Length`.
pub fn http_body(req: &InferRequest, binary_default: bool) -> (Vec<u8>, usize) {
    let mut fields: Vec<String> = Vec::new();
    if !req.id.is_empty() {
        fields.push(format!("\"id\":{}", Value::String(req.id.clone())));
    }
    let mut params: Vec<String> = req
        .parameters
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), parameter_text(v)))
        .collect();
    if binary_default {
        params.push("\"binary_data_output\":true".into());
    }
    if !params.is_empty() {
        fields.push(format!("\"parameters\":{{{}}}", params.join(",")));
    }
    let inputs: Vec<Value> = req
        .inputs
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "shape": t.shape,
                "datatype": t.dtype.wire_name(),
                "parameters": {"binary_data_size": t.data.len()},
            })
        })
        .collect();
    fields.push(format!("\"inputs\":{}", Value::Array(inputs)));
    if !req.outputs.is_empty() {
        let outputs: Vec<Value> = req
            .outputs
            .iter()
            .map(|o| serde_json::json!({"name": o.name, "parameters": output_parameters(o)}))
            .collect();
        fields.push(format!("\"outputs\":{}", Value::Array(outputs)));
    }
    let mut body = format!("{{{}}}", fields.join(",")).into_bytes();
    let header_len = body.len();
    for t in &req.inputs {
        body.extend_from_slice(&t.data);
    }
    (body, header_len)
}

/// A decoded request as a gRPC `ModelInferRequest` again, every input's data
/// in `raw_input_contents`.
pub fn grpc_request(req: &InferRequest) -> ModelInferRequest {
    let wire = |p: &Map<String, Value>| {
        p.iter()
            .map(|(k, v)| {
                let p = match v {
                    Value::Bool(b) => Parameter::Bool(*b),
                    Value::String(s) => Parameter::String(s.clone()),
                    n => Parameter::Int(n.as_i64().expect("an integer")),
                };
                (k.clone(), tern::frontend::grpc::codec::to_wire(&p))
            })
            .collect()
    };
    ModelInferRequest {
        model_name: req.model_name.clone(),
        model_version: req.model_version.map(|v| v.to_string()).unwrap_or_default(),
        id: req.id.clone(),
        parameters: req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), tern::frontend::grpc::codec::to_wire(v)))
            .collect(),
        inputs: req
            .inputs
            .iter()
            .map(|t| model_infer_request::InferInputTensor {
                name: t.name.clone(),
                datatype: t.dtype.wire_name().into(),
                shape: t.shape.clone(),
                parameters: Default::default(),
                contents: None,
            })
            .collect(),
        outputs: req
            .outputs
            .iter()
            .map(|o| model_infer_request::InferRequestedOutputTensor {
                name: o.name.clone(),
                parameters: wire(&output_parameters(o)),
            })
            .collect(),
        raw_input_contents: req.inputs.iter().map(|t| t.data.clone()).collect(),
    }
}

/// Reads a little-endian `u16` from the front of `data` (0 when short) and
/// returns the rest.
pub fn take_u16(data: &[u8]) -> (u16, &[u8]) {
    match data {
        [a, b, rest @ ..] => (u16::from_le_bytes([*a, *b]), rest),
        _ => (0, &[]),
    }
}

/// What the repository does with a parsed config (`repository::prepare`):
/// the folder's name when it gives none, Triton's defaults, the rules, the
/// features this build refuses. Returns the config when it would load.
///
/// Invariants: a config that validates normalises to itself (normalising is
/// idempotent) and validates again; it renders (`to_pbtxt`, and `to_json`
/// as `GET .../config` does) to text that parses back to the same config.
pub fn check_config(mut cfg: ModelConfig, gpu_count: usize) -> Option<ModelConfig> {
    use tern_core::config::{defaults::normalize, support, to_pbtxt, validate::validate};
    if cfg.name.is_empty() {
        cfg.name = "m".into();
    }
    let folder = cfg.name.clone();
    normalize(&mut cfg, gpu_count);
    let _ = support::not_acted_on(&cfg);
    validate(&cfg, &folder).ok()?;
    let mut again = cfg.clone();
    normalize(&mut again, gpu_count);
    let text = to_pbtxt(&cfg);
    assert!(
        same_config(&again, &cfg),
        "normalize is not idempotent\n{text}"
    );
    validate(&again, &folder).expect("a normalised valid config validates again");
    let parsed = parse_pbtxt(&text)
        .unwrap_or_else(|e| panic!("to_pbtxt output does not parse: {e}\n{text}"));
    assert!(same_config(&parsed, &cfg), "pbtxt round trip\n{text}");
    let json = tern_core::config::json::to_json(&cfg).to_string();
    let from_json = tern_core::config::json::from_json(&json)
        .unwrap_or_else(|e| panic!("to_json output does not parse: {e}\n{json}"));
    assert!(
        same_config(&from_json, &cfg),
        "json round trip\n{text}\n{json}"
    );
    support::check_supported(&cfg).ok()?;
    Some(cfg)
}

/// Whether two configs are equal (maps compare without order); a config
/// holding a NaN float never equals itself, so it is compared as text.
fn same_config(a: &ModelConfig, b: &ModelConfig) -> bool {
    use tern_core::config::to_pbtxt;
    a == b || {
        let (ta, tb) = (to_pbtxt(a), to_pbtxt(b));
        ta.contains("nan") && ta.len() == tb.len()
    }
}
