//! KServe v2 JSON + binary tensor data extension: decoding inference
//! requests into core tensors and encoding responses, for the HTTP frontend.

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::nonfinite;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::messages;
use tern_core::tensor::shape_str;
use tern_core::validate::{
    classification_param, element_count_matches, json_input_shape, tensor_shape, wire_datatype,
};
use tern_core::{
    bytes_tensor, DataType, InferRequest, InferResponse, Parameter, Parameters, RequestedOutput,
    Tensor,
};
use tern_memory::shm::{self, SharedMemory};

/// Triton's `HTTP_MAX_JSON_NESTING_DEPTH`: how deep a tensor's `data` may nest.
const MAX_JSON_NESTING_DEPTH: usize = 100;

/// Triton's error for `data` nested too deeply.
fn nesting_error() -> String {
    format!("JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_NESTING_DEPTH})")
}

#[derive(Deserialize)]
struct JsonRequest<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(borrow)]
    inputs: Vec<JsonInput<'a>>,
    #[serde(default)]
    outputs: Option<Vec<JsonOutput>>,
}

#[derive(Deserialize)]
struct JsonInput<'a> {
    name: String,
    /// Read by [`wire_shape`], with Triton's errors.
    shape: Value,
    #[serde(borrow)]
    datatype: std::borrow::Cow<'a, str>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    /// The text of `data`, decoded once the datatype is known.
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct JsonOutput {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

/// Options of the HTTP response that are not part of the core request.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Request-level `binary_data_output`.
    pub binary_default: bool,
}

/// Reads a `parameters` object; with `special` (the request was
/// [rewritten](nonfinite::rewrite)) a NaN/infinity sentinel is a double.
/// `what` names the owner in an error (built only then).
fn parse_parameters(
    map: Option<Map<String, Value>>,
    what: impl Fn() -> String,
    special: bool,
) -> Result<Parameters> {
    let mut out = Parameters::new();
    for (k, v) in map.into_iter().flatten() {
        let p = match v {
            Value::Bool(b) => Parameter::Bool(b),
            Value::String(s) => match special.then(|| nonfinite::of_str(&s)).flatten() {
                Some(d) => Parameter::Double(d),
                None => Parameter::String(s),
            },
            Value::Number(n) => match n.as_i64() {
                Some(i) => Parameter::Int(i),
                None => Parameter::Double(n.as_f64().unwrap_or(f64::NAN)),
            },
            other => {
                return Err(Error::invalid_arg(format!(
                    "{} parameter '{k}' must be a bool, number or string, got {other}",
                    what()
                )))
            }
        };
        out.insert(k, p);
    }
    Ok(out)
}

/// Collects the leaves of `v`, an array at nesting `depth` (the `data`
/// array itself is at 0), failing as Triton does at depth
/// [`MAX_JSON_NESTING_DEPTH`].
fn flatten<'a>(v: &'a Value, depth: usize, out: &mut Vec<&'a Value>) -> bool {
    match v {
        Value::Array(items) => {
            depth < MAX_JSON_NESTING_DEPTH && items.iter().all(|i| flatten(i, depth + 1, out))
        }
        leaf => {
            out.push(leaf);
            true
        }
    }
}

/// Converts JSON `data` (flat or nested) into tensor bytes for `dtype`; with
/// `special` (the request was [rewritten](nonfinite::rewrite)) FP32 and FP64
/// take NaN/infinity sentinels.
pub(super) fn json_to_bytes(
    name: &str,
    dtype: DataType,
    data: &Value,
    special: bool,
) -> Result<(Vec<u8>, usize)> {
    if matches!(dtype, DataType::Fp16 | DataType::Bf16) {
        return Err(Error::invalid_arg(format!(
            "receiving {dtype} data via JSON is not supported. Please use the binary data format for input {name}"
        )));
    }
    let mut leaves = Vec::new();
    if !flatten(data, 0, &mut leaves) {
        return Err(Error::invalid_arg(format!(
            "{} in 'data' of input '{name}'",
            nesting_error()
        )));
    }
    let bad = |v: &Value| {
        let v = if special {
            nonfinite::show(v)
        } else {
            v.to_string()
        };
        Error::invalid_arg(format!(
            "unable to parse 'data' of input '{name}': {v} is not a valid {dtype} value"
        ))
    };
    let float = |v: &Value| {
        v.as_f64()
            .or_else(|| special.then(|| nonfinite::of_value(v)).flatten())
            .ok_or_else(|| bad(v))
    };
    let mut buf = Vec::with_capacity(leaves.len() * dtype.size().unwrap_or(8));
    macro_rules! ints {
        ($ty:ty) => {
            for v in &leaves {
                let x = if <$ty>::MIN as i128 == 0 {
                    v.as_u64().map(|u| u as i128)
                } else {
                    v.as_i64().map(|i| i as i128)
                };
                let x = x
                    .and_then(|x| <$ty>::try_from(x).ok())
                    .ok_or_else(|| bad(v))?;
                buf.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match dtype {
        DataType::Bool => {
            for v in &leaves {
                buf.push(v.as_bool().ok_or_else(|| bad(v))? as u8);
            }
        }
        DataType::Uint8 => ints!(u8),
        DataType::Uint16 => ints!(u16),
        DataType::Uint32 => ints!(u32),
        DataType::Uint64 => ints!(u64),
        DataType::Int8 => ints!(i8),
        DataType::Int16 => ints!(i16),
        DataType::Int32 => ints!(i32),
        DataType::Int64 => ints!(i64),
        DataType::Fp32 => {
            for v in &leaves {
                buf.extend_from_slice(&(float(v)? as f32).to_le_bytes());
            }
        }
        DataType::Fp64 => {
            for v in &leaves {
                buf.extend_from_slice(&float(v)?.to_le_bytes());
            }
        }
        DataType::Bytes => {
            for v in &leaves {
                let s = v
                    .as_str()
                    .filter(|s| !special || nonfinite::of_str(s).is_none())
                    .ok_or_else(|| bad(v))?;
                bytes_tensor::push(&mut buf, s.as_bytes());
            }
        }
        DataType::Fp16 | DataType::Bf16 => unreachable!("rejected above"),
    }
    Ok((buf, leaves.len()))
}

/// Decodes the text of an input's `data` (flat or nested) into tensor bytes:
/// straight into the buffer when every element fits `dtype`, without building
/// a JSON tree; otherwise through [`json_to_bytes`], which says what is wrong.
/// `expected` (the shape's element count, capped by what the text can hold:
/// at least two bytes per element) sizes the buffer. With `special`
/// (the request was [rewritten](nonfinite::rewrite)) the tree path reads the
/// NaN/infinity sentinels.
fn data_to_bytes(
    name: &str,
    dtype: DataType,
    raw: &RawValue,
    expected: usize,
    special: bool,
) -> Result<(Vec<u8>, usize)> {
    let text = raw.get();
    if !special && !matches!(dtype, DataType::Fp16 | DataType::Bf16) {
        let width = dtype.size().unwrap_or(8);
        let mut buf = Vec::with_capacity(expected.min(text.len() / 2 + 1) * width);
        let mut count = 0;
        let seed = Leaves {
            dtype,
            depth: 0,
            buf: &mut buf,
            count: &mut count,
        };
        if seed
            .deserialize(&mut serde_json::Deserializer::from_str(text))
            .is_ok()
        {
            return Ok((buf, count));
        }
    }
    // `text` is valid JSON (the request parsed), so this fails only on
    // serde_json's own nesting limit.
    let value: Value = serde_json::from_str(text).map_err(|_| {
        Error::invalid_arg(format!("{} in 'data' of input '{name}'", nesting_error()))
    })?;
    json_to_bytes(name, dtype, &value, special)
}

/// Walks `data` at nesting `depth`, appending each element to `buf` as
/// `dtype` and counting it; fails on anything [`json_to_bytes`] would refuse,
/// with an error the caller discards.
struct Leaves<'b> {
    dtype: DataType,
    depth: usize,
    buf: &'b mut Vec<u8>,
    count: &'b mut usize,
}

impl Leaves<'_> {
    fn push<E: de::Error>(self, bytes: Option<&[u8]>) -> std::result::Result<(), E> {
        let bytes = bytes.ok_or_else(|| E::custom("element does not fit the datatype"))?;
        self.buf.extend_from_slice(bytes);
        *self.count += 1;
        Ok(())
    }

    /// An integer element, range-checked for an integer datatype (its
    /// low-order two's-complement bytes) or converted for a float one.
    fn int<E: de::Error>(self, x: i128) -> std::result::Result<(), E> {
        let fits = |lo: i128, hi: i128| (lo..=hi).contains(&x);
        let width = match self.dtype {
            DataType::Uint8 => fits(0, u8::MAX.into()).then_some(1),
            DataType::Uint16 => fits(0, u16::MAX.into()).then_some(2),
            DataType::Uint32 => fits(0, u32::MAX.into()).then_some(4),
            DataType::Uint64 => fits(0, u64::MAX.into()).then_some(8),
            DataType::Int8 => fits(i8::MIN.into(), i8::MAX.into()).then_some(1),
            DataType::Int16 => fits(i16::MIN.into(), i16::MAX.into()).then_some(2),
            DataType::Int32 => fits(i32::MIN.into(), i32::MAX.into()).then_some(4),
            DataType::Int64 => fits(i64::MIN.into(), i64::MAX.into()).then_some(8),
            DataType::Fp32 => return self.push(Some(&(x as f64 as f32).to_le_bytes())),
            DataType::Fp64 => return self.push(Some(&(x as f64).to_le_bytes())),
            _ => None,
        };
        let bytes = (x as u64).to_le_bytes();
        self.push(width.map(|w| &bytes[..w]))
    }
}

impl<'de> DeserializeSeed<'de> for Leaves<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Leaves<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} tensor data", self.dtype)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        if self.depth >= MAX_JSON_NESTING_DEPTH {
            return Err(de::Error::custom(nesting_error()));
        }
        let Leaves {
            dtype,
            depth,
            buf,
            count,
        } = self;
        while seq
            .next_element_seed(Leaves {
                dtype,
                depth: depth + 1,
                buf: &mut *buf,
                count: &mut *count,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> std::result::Result<(), E> {
        let ok = self.dtype == DataType::Bool;
        self.push(ok.then_some(&[b as u8][..]))
    }

    fn visit_i64<E: de::Error>(self, x: i64) -> std::result::Result<(), E> {
        self.int(x.into())
    }

    fn visit_u64<E: de::Error>(self, x: u64) -> std::result::Result<(), E> {
        self.int(x.into())
    }

    fn visit_f64<E: de::Error>(self, x: f64) -> std::result::Result<(), E> {
        match self.dtype {
            DataType::Fp32 => self.push(Some(&(x as f32).to_le_bytes())),
            DataType::Fp64 => self.push(Some(&x.to_le_bytes())),
            _ => self.push(None),
        }
    }

    fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<(), E> {
        if self.dtype != DataType::Bytes {
            return self.push(None);
        }
        bytes_tensor::push(self.buf, s.as_bytes());
        *self.count += 1;
        Ok(())
    }
}

/// Parses the JSON request header. serde_json first; only when that fails,
/// again with bare NaN/infinity tokens [rewritten](nonfinite::rewrite) to
/// sentinels (`true` in the answer, the text kept in `rewritten`), as Triton
/// reads them. A failure reports the first parse's error; serde_json's own
/// nesting limit (128) keeps a deeply nested body from overflowing the stack.
fn parse_json<'a>(
    text: &'a [u8],
    rewritten: &'a mut Option<Vec<u8>>,
) -> Result<(JsonRequest<'a>, bool)> {
    let first = match serde_json::from_slice(text) {
        Ok(json) => return Ok((json, false)),
        Err(e) => e,
    };
    *rewritten = nonfinite::rewrite(text);
    let rewritten: &'a Option<Vec<u8>> = rewritten;
    if let Some(json) = rewritten
        .as_deref()
        .and_then(|t| serde_json::from_slice(t).ok())
    {
        return Ok((json, true));
    }
    let detail = if first.to_string().starts_with("recursion limit exceeded") {
        format!("{}: ", nesting_error())
    } else {
        String::new()
    };
    Err(Error::invalid_arg(format!(
        "failed to parse the request JSON: {detail}{first}"
    )))
}

/// Decodes an HTTP inference request: `header_len` is the
/// `Inference-Header-Content-Length` value (`None` = whole body is JSON).
pub fn decode_request(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    header_len: Option<usize>,
    cfg: &ModelConfig,
    shm: &SharedMemory,
) -> Result<(InferRequest, HttpOptions)> {
    if header_len == Some(0) {
        return decode_raw(model, version, body, cfg);
    }
    let split = header_len.unwrap_or(body.len());
    if split > body.len() {
        return Err(messages::header_length_out_of_range(
            body.len(),
            &split.to_string(),
        ));
    }
    let mut rewritten = None;
    let (json, special) = parse_json(&body[..split], &mut rewritten)?;
    let mut binary = body.slice(split..);
    let id = request_id(json.id, special)?;
    let mut parameters = parse_parameters(json.parameters, || "request".into(), special)?;
    let binary_default = match parameters.remove("binary_data_output") {
        None => false,
        Some(Parameter::Bool(b)) => b,
        Some(_) => {
            return Err(Error::invalid_arg(
                "request parameter 'binary_data_output' must be a bool",
            ))
        }
    };
    let inputs = json
        .inputs
        .into_iter()
        .map(|input| decode_input(input, &mut binary, model, shm, special))
        .collect::<Result<Vec<_>>>()?;
    if !binary.is_empty() {
        return Err(Error::invalid_arg(format!(
            "unexpected additional input data for model '{model}' ({} byte(s) of binary data that no input claims; check binary_data_size)",
            binary.len()
        )));
    }
    let outputs = json
        .outputs
        .into_iter()
        .flatten()
        .map(|out| decode_output(out, shm, special))
        .collect::<Result<Vec<_>>>()?;
    let request = InferRequest {
        model_name: model.into(),
        model_version: version,
        id,
        inputs,
        outputs,
        parameters,
        callers: Vec::new(),
        responder: None,
        trace: None,
    };
    Ok((request, HttpOptions { binary_default }))
}

/// The request's `id`: a string (`special`: non-finite number spellings
/// were rewritten and may not be an id), or none.
fn request_id(id: Option<Value>, special: bool) -> Result<String> {
    match id {
        None => Ok(String::new()),
        Some(Value::String(s)) if !special || nonfinite::of_str(&s).is_none() => Ok(s),
        Some(other) => Err(Error::invalid_arg(format!(
            "request 'id' must be a string, got {}",
            nonfinite::show(&other)
        ))),
    }
}

/// An input's JSON `shape`, read as Triton's HTTP frontend reads it: a list
/// of unsigned integers (anything else is its JSON reader's INTERNAL error),
/// each cast to `i64`, so that a dim of 2^63 or more turns negative and is
/// refused by the shape checks.
fn wire_shape(shape: &Value) -> Result<Vec<i64>> {
    let Value::Array(dims) = shape else {
        return Err(messages::json_shape_not_array());
    };
    dims.iter()
        .map(|d| {
            d.as_u64()
                .map(|d| d as i64)
                .ok_or_else(messages::json_shape_not_unsigned)
        })
        .collect()
}

/// One input: its data from shared memory, from the next `binary_data_size`
/// bytes of `binary` (the body after the JSON), or from its JSON `data`.
fn decode_input(
    input: JsonInput,
    binary: &mut Bytes,
    model: &str,
    shm: &SharedMemory,
    special: bool,
) -> Result<Tensor> {
    let name = tensor_name("input", input.name, special)?;
    let shape = wire_shape(&input.shape)?;
    let dtype = wire_datatype(&name, &input.datatype)?;
    let params = parse_parameters(input.parameters, || format!("input '{name}'"), special)?;
    let binary_size = match params.get("binary_data_size") {
        None => None,
        Some(Parameter::Int(n)) if *n >= 0 => Some(*n as usize),
        Some(_) => {
            return Err(Error::invalid_arg(format!(
                "input '{name}': 'binary_data_size' must be a non-negative integer"
            )))
        }
    };
    let in_shm = match params.keys().any(|k| k.starts_with("shared_memory_")) {
        true => shm::parameters(&params, &format!("input '{name}'"))?,
        false => None,
    };
    // As current Triton: the HTTP frontend checks the shape of JSON data
    // itself, in its words; other inputs' shapes get the core's check.
    if in_shm.is_none() && binary_size.is_none() && input.data.is_some() {
        json_input_shape(&name, dtype, &shape)?;
    } else {
        tensor_shape(&name, dtype, &shape)?;
    }
    if let Some((region, offset, size)) = in_shm {
        if binary_size.is_some() || input.data.is_some() {
            return Err(Error::invalid_arg(format!(
                "input '{name}': 'data' and 'binary_data_size' cannot be given for an input in shared memory"
            )));
        }
        let data = shm.input(&name, &region, offset, size)?;
        return Ok(Tensor::new(name, dtype, shape, data));
    }
    let data: Bytes = match (binary_size, input.data) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid_arg(format!(
                "input '{name}' has both 'data' and 'binary_data_size'"
            )))
        }
        (Some(n), None) => {
            if n > binary.len() {
                return Err(Error::invalid_arg(format!(
                    "unexpected size for input '{name}', expecting {n} additional bytes for model '{model}' (binary_data_size {n}, but only {} byte(s) of binary data are left in the request)",
                    binary.len()
                )));
            }
            binary.split_to(n)
        }
        (None, Some(data)) => {
            let expected = tern_core::tensor::element_count(&shape);
            let (buf, count) = data_to_bytes(&name, dtype, data, expected, special)?;
            element_count_matches(&name, &shape, count, "'data'").map_err(|e| {
                Error::invalid_arg(format!(
                    "Unable to parse 'data': Shape does not match true shape of 'data' field ({})",
                    e.message
                ))
            })?;
            buf.into()
        }
        (None, None) => {
            return Err(Error::invalid_arg(format!(
                "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set (input '{name}')"
            )))
        }
    };
    Ok(Tensor::new(name, dtype, shape, data))
}

/// A tensor's `name`: a string, not a NaN/infinity token the request spelt
/// bare (`"name": NaN` reads, once [rewritten](nonfinite::rewrite), as the
/// sentinel string; found by the `http_infer` fuzz target).
fn tensor_name(what: &str, name: String, special: bool) -> Result<String> {
    if special && nonfinite::of_str(&name).is_some() {
        return Err(Error::invalid_arg(format!(
            "{what} 'name' must be a string, got {}",
            nonfinite::show(&Value::String(name))
        )));
    }
    Ok(name)
}

/// One requested output: binary or JSON, classification, shared memory.
fn decode_output(
    mut out: JsonOutput,
    shm: &SharedMemory,
    special: bool,
) -> Result<RequestedOutput> {
    out.name = tensor_name("output", out.name, special)?;
    let params = parse_parameters(out.parameters, || format!("output '{}'", out.name), special)?;
    let binary = match params.get("binary_data") {
        None => None,
        Some(Parameter::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(Error::invalid_arg(format!(
                "output '{}': 'binary_data' must be a bool",
                out.name
            )))
        }
    };
    let classification = classification_param(&out.name, &params)?;
    let target = shm.output_target(&out.name, &params, classification.is_some())?;
    Ok(RequestedOutput {
        name: out.name,
        classification,
        binary,
        shm: target,
    })
}

/// The raw-binary request form (`Inference-Header-Content-Length: 0`): the
/// whole body is the data of the model's single input, its shape deduced from
/// the configuration as in Triton. For BYTES the input must hold exactly one
/// element and the body is that one string, without a length prefix.
fn decode_raw(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    cfg: &ModelConfig,
) -> Result<(InferRequest, HttpOptions)> {
    if cfg.input.len() != 1 {
        return Err(Error::invalid_arg(format!(
            "Raw request must only have 1 input (found 1) to be deduced but got {} inputs in '{model}' model configuration",
            cfg.input.len()
        )));
    }
    let spec = &cfg.input[0];
    let dtype = DataType::from_config(spec.data_type)?;
    let mut shape: Vec<i64> = spec.dims.clone();
    let variable = shape.iter().filter(|&&d| d < 0).count();
    if variable > 1 {
        return Err(Error::invalid_arg(format!(
            "The shape of the raw input '{}' can not be deduced because there are more than one variable-sized dimension (dims {})",
            spec.name,
            shape_str(&spec.dims)
        )));
    }
    let data = match dtype.size() {
        None => {
            let one = variable == 0
                && shape
                    .iter()
                    .try_fold(1i64, |n, &d| n.checked_mul(d))
                    .is_some_and(|n| n == 1);
            if !one {
                return Err(Error::invalid_arg(format!(
                    "For BYTE datatype raw input '{}', the model must have input shape [1] (its dims are {})",
                    spec.name,
                    shape_str(&spec.dims)
                )));
            }
            if u32::try_from(body.len()).is_err() {
                return Err(Error::invalid_arg(format!(
                    "raw BYTES input '{}' of {} bytes is longer than a BYTES element can be (4 GiB)",
                    spec.name,
                    body.len()
                )));
            }
            // The one element, with the length prefix Tern keeps BYTES tensors in.
            let mut buf = Vec::with_capacity(body.len() + 4);
            bytes_tensor::push(&mut buf, &body);
            Bytes::from(buf)
        }
        Some(size) => {
            if variable == 1 {
                if !body.len().is_multiple_of(size) {
                    return Err(Error::invalid_arg(format!(
                        "raw input of {} bytes is not a multiple of the {dtype} size {size}",
                        body.len()
                    )));
                }
                let elements = body.len() / size;
                let fixed: usize = shape
                    .iter()
                    .filter(|&&d| d >= 0)
                    .map(|&d| d as usize)
                    .product();
                if fixed == 0 || !elements.is_multiple_of(fixed) {
                    return Err(Error::invalid_arg(format!(
                        "cannot infer the shape of input '{}' (dims {}) from {} raw bytes",
                        spec.name,
                        shape_str(&spec.dims),
                        body.len()
                    )));
                }
                for d in shape.iter_mut().filter(|d| **d < 0) {
                    *d = (elements / fixed) as i64;
                }
            }
            body
        }
    };
    if cfg.max_batch_size > 0 {
        shape.insert(0, 1);
    }
    let request = InferRequest {
        model_name: model.into(),
        model_version: version,
        inputs: vec![Tensor::new(spec.name.clone(), dtype, shape, data)],
        ..Default::default()
    };
    Ok((
        request,
        HttpOptions {
            binary_default: true,
        },
    ))
}

/// Writes tensor data as a flat JSON array; `None` when it cannot be JSON
/// (FP16/BF16, or BYTES that are not UTF-8) and must go binary.
pub(super) fn data_to_json(t: &Tensor, out: &mut Vec<u8>) -> Option<()> {
    let d = &t.data[..];
    // Written element by element, as serde_json writes a sequence (no copy).
    macro_rules! nums {
        ($ty:ty, $n:expr) => {{
            out.push(b'[');
            for (i, c) in d.chunks_exact($n).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let x = <$ty>::from_le_bytes(c.try_into().expect("chunk"));
                serde_json::to_writer(&mut *out, &x).ok()?;
            }
            out.push(b']');
            Some(())
        }};
    }
    // As Triton (rapidjson's kWriteNanAndInfFlag): NaN, Infinity, -Infinity.
    macro_rules! floats {
        ($ty:ty, $n:expr) => {{
            let v: Vec<$ty> = d
                .chunks_exact($n)
                .map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunk")))
                .collect();
            nonfinite::write_floats(out, &v).ok()
        }};
    }
    match t.dtype {
        DataType::Bool => {
            serde_json::to_writer(&mut *out, &d.iter().map(|&b| b != 0).collect::<Vec<_>>()).ok()
        }
        DataType::Uint8 => serde_json::to_writer(&mut *out, d).ok(),
        DataType::Int8 => nums!(i8, 1),
        DataType::Uint16 => nums!(u16, 2),
        DataType::Int16 => nums!(i16, 2),
        DataType::Uint32 => nums!(u32, 4),
        DataType::Int32 => nums!(i32, 4),
        DataType::Uint64 => nums!(u64, 8),
        DataType::Int64 => nums!(i64, 8),
        DataType::Fp32 => floats!(f32, 4),
        DataType::Fp64 => floats!(f64, 8),
        DataType::Fp16 | DataType::Bf16 => None,
        DataType::Bytes => {
            let elements = bytes_tensor::decode(d).ok()?;
            let strings = elements
                .into_iter()
                .map(std::str::from_utf8)
                .collect::<std::result::Result<Vec<_>, _>>()
                .ok()?;
            serde_json::to_writer(&mut *out, &strings).ok()
        }
    }
}

pub(super) fn parameter_json(p: &Parameter) -> Value {
    match p {
        Parameter::Bool(b) => Value::Bool(*b),
        Parameter::Int(i) => Value::from(*i),
        Parameter::Double(d) => Value::from(*d),
        Parameter::String(s) => Value::String(s.clone()),
    }
}

/// An encoded HTTP response body: `json_len` is `Some` when binary data follows the JSON header.
pub struct EncodedResponse {
    /// The body in order: the JSON header, then each binary output's data as
    /// the tensor holds it (shared, not copied).
    pub parts: Vec<Bytes>,
    /// Length of the JSON header when the body carries binary outputs.
    pub json_len: Option<usize>,
}

impl EncodedResponse {
    /// The body, sent part by part with an exact `Content-Length`.
    pub fn into_body(self) -> PartsBody {
        let remaining = self.parts.iter().map(|p| p.len() as u64).sum();
        let mut parts = self.parts;
        parts.reverse();
        PartsBody { parts, remaining }
    }
}

/// A response body made of several buffers (written with vectored I/O, never
/// concatenated).
pub struct PartsBody {
    /// Remaining parts, last first.
    parts: Vec<Bytes>,
    remaining: u64,
}

impl http_body::Body for PartsBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Bytes>, Self::Error>>> {
        let next = self.parts.pop();
        if let Some(p) = &next {
            self.remaining -= p.len() as u64;
        }
        std::task::Poll::Ready(next.map(|p| Ok(http_body::Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

/// Encodes a response as JSON, with outputs in binary where requested (or where JSON cannot carry them).
pub fn encode_response(
    resp: &InferResponse,
    requested: &[RequestedOutput],
    opts: &HttpOptions,
) -> EncodedResponse {
    let mut json = Vec::with_capacity(256);
    json.extend_from_slice(b"{\"model_name\":");
    serde_json::to_writer(&mut json, &resp.model_name).expect("string");
    json.extend_from_slice(b",\"model_version\":\"");
    serde_json::to_writer(&mut json, &resp.model_version).expect("number");
    json.push(b'"');
    if !resp.id.is_empty() {
        json.extend_from_slice(b",\"id\":");
        serde_json::to_writer(&mut json, &resp.id).expect("string");
    }
    if !resp.parameters.is_empty() {
        let map: Map<String, Value> = resp
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), parameter_json(v)))
            .collect();
        json.extend_from_slice(b",\"parameters\":");
        serde_json::to_writer(&mut json, &map).expect("map");
    }
    json.extend_from_slice(b",\"outputs\":[");
    let mut parts = vec![Bytes::new()];
    for (i, t) in resp.outputs.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        json.extend_from_slice(b"{\"name\":");
        serde_json::to_writer(&mut json, &t.name).expect("string");
        json.extend_from_slice(b",\"datatype\":\"");
        json.extend_from_slice(t.dtype.wire_name().as_bytes());
        json.extend_from_slice(b"\",\"shape\":");
        serde_json::to_writer(&mut json, &t.shape).expect("shape");
        let asked = requested.iter().find(|r| r.name == t.name);
        if asked.is_some_and(|r| r.shm.is_some()) {
            // Written to shared memory: name, datatype and shape only, as in
            // Triton (its C++ client takes any output `parameters` to mean
            // binary data and fails without `binary_data_size`).
            json.push(b'}');
            continue;
        }
        // As Triton: `binary_data_output` covers the outputs the request does not
        // list; a listed output is JSON unless its own `binary_data` says otherwise.
        let want_binary = match asked {
            Some(r) => r.binary.unwrap_or(false),
            None => opts.binary_default,
        };
        let mark = json.len();
        let as_json = !want_binary && {
            json.extend_from_slice(b",\"data\":");
            data_to_json(t, &mut json).is_some()
        };
        if !as_json {
            json.truncate(mark);
            json.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
            serde_json::to_writer(&mut json, &t.data.len()).expect("number");
            json.push(b'}');
            parts.push(t.data.clone());
        }
        json.push(b'}');
    }
    json.extend_from_slice(b"]}");
    let json_len = (parts.len() > 1).then_some(json.len());
    parts[0] = json.into();
    EncodedResponse { parts, json_len }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    fn cfg() -> ModelConfig {
        parse_pbtxt(
            r#"name: "m" max_batch_size: 4 input [{name: "X" data_type: TYPE_FP32 dims: [-1]}]"#,
        )
        .unwrap()
    }

    /// `decode_request` for model `m` (config `cfg()`), shared memory off.
    fn decode(body: Bytes, header_len: Option<usize>) -> Result<(InferRequest, HttpOptions)> {
        decode_request(
            "m",
            None,
            body,
            header_len,
            &cfg(),
            &SharedMemory::new(false),
        )
    }

    /// Found by the `http_infer` fuzz target: FP64 data written as JSON (the
    /// shortest text that reads back as the same double) was read one ulp
    /// off by serde_json's default float parser.
    #[test]
    fn fp64_json_data_reads_back_exactly() {
        let x = f64::from_bits(0x7e34_e43c_8800_759c);
        let body = format!(
            r#"{{"inputs":[{{"name":"X","shape":[1],"datatype":"FP64","data":[{}]}}]}}"#,
            serde_json::to_string(&x).unwrap()
        );
        let (req, _) = decode(Bytes::from(body), None).unwrap();
        let got = f64::from_le_bytes(req.inputs[0].data[..].try_into().unwrap());
        assert_eq!(got.to_bits(), x.to_bits());
    }

    #[test]
    fn json_nested_and_flat() {
        let body = br#"{"id":"7","inputs":[{"name":"X","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4.5]]}],
                       "outputs":[{"name":"Y","parameters":{"binary_data":true,"classification":2}}]}"#;
        let (req, _) = decode(Bytes::from_static(body), None).unwrap();
        assert_eq!(req.id, "7");
        let vals: Vec<f32> = req.inputs[0]
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, [1.0, 2.0, 3.0, 4.5]);
        assert_eq!(req.outputs[0].binary, Some(true));
        assert_eq!(req.outputs[0].classification, Some(2));
    }

    #[test]
    fn binary_parts_and_errors() {
        let header = br#"{"inputs":[{"name":"X","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&1f32.to_le_bytes());
        body.extend_from_slice(&2f32.to_le_bytes());
        let (req, _) = decode(Bytes::from(body.clone()), Some(header.len())).unwrap();
        assert_eq!(req.inputs[0].data.len(), 8);
        let e = decode(
            Bytes::from(body[..body.len() - 1].to_vec()),
            Some(header.len()),
        )
        .unwrap_err();
        assert!(
            e.message.starts_with(
                "unexpected size for input 'X', expecting 8 additional bytes for model 'm'"
            ),
            "{e}"
        );
        assert!(e.message.contains("only 7 byte(s)"), "{e}");
        let e = decode(Bytes::from(body.clone()), Some(body.len() + 1)).unwrap_err();
        assert_eq!(
            e.message,
            format!(
                "inference header size should be in range (0, {}), got: {}",
                body.len(),
                body.len() + 1
            )
        );
        let e = decode(Bytes::from(body.clone()), Some(header.len() - 3)).unwrap_err();
        assert!(
            e.message.contains("failed to parse the request JSON"),
            "{e}"
        );
        let mut extra = body.clone();
        extra.push(0);
        let e = decode(Bytes::from(extra), Some(header.len())).unwrap_err();
        assert!(
            e.message
                .starts_with("unexpected additional input data for model 'm'"),
            "{e}"
        );
        assert!(e.message.contains("1 byte(s) of binary data"), "{e}");
        let none = br#"{"inputs":[{"name":"X","shape":[1,2],"datatype":"FP32"}]}"#;
        let e = decode(Bytes::from_static(none), None).unwrap_err();
        assert!(
            e.message.starts_with("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set"),
            "{e}"
        );
    }

    #[test]
    fn shapes_get_tritons_http_texts() {
        let err = |body: String, header_len: Option<usize>| {
            let e = decode(Bytes::from(body), header_len).unwrap_err();
            (e.code, e.message)
        };
        let input = |shape: &str, rest: &str| {
            format!(r#"{{"inputs":[{{"name":"X","shape":{shape},"datatype":"FP32",{rest}}}]}}"#)
        };
        let not_unsigned = (
            tern_core::Code::Internal,
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
                .to_string(),
        );
        for shape in ["[1,-2]", "[1.5]", r#"["2"]"#] {
            assert_eq!(err(input(shape, r#""data":[1]"#), None), not_unsigned);
        }
        assert_eq!(
            err(input("7", r#""data":[1]"#), None).1,
            "Unable to parse 'shape': attempt to access JSON non-array as array"
        );
        // JSON data: the HTTP frontend's texts.
        assert_eq!(
            err(input("[9223372036854775808,1]", r#""data":[1]"#), None),
            (
                tern_core::Code::InvalidArg,
                "invalid shape for input 'X': shape [-9223372036854775808,1] contains one or more invalid dimensions".to_string()
            )
        );
        assert_eq!(
            err(input("[8,2305843009213693952]", r#""data":[1]"#), None).1,
            "invalid shape for input 'X': shape [8,2305843009213693952] causes total element count to exceed maximum size of 9223372036854775807"
        );
        assert_eq!(
            err(input("[1,4611686018427387904]", r#""data":[1]"#), None).1,
            "byte size overflow for input 'X': element count (4611686018427387904) * data type size (4) exceeds maximum allowed size (9223372036854775807)"
        );
        // Binary data: the core's.
        let header = input(
            "[18446744073709551614,1]",
            r#""parameters":{"binary_data_size":0}"#,
        );
        let len = header.len();
        assert_eq!(
            err(header, Some(len)).1,
            "tensor 'X' contains an invalid dimension [-2,1]"
        );
        let header = input(
            "[1,4611686018427387904]",
            r#""parameters":{"binary_data_size":0}"#,
        );
        let len = header.len();
        assert_eq!(
            err(header, Some(len)).1,
            "byte size for tensor 'X' exceeds maximum size of 9223372036854775807"
        );
    }

    #[test]
    fn json_type_errors() {
        let body = br#"{"inputs":[{"name":"X","shape":[1,2],"datatype":"INT8","data":[1,300]}]}"#;
        let e = decode(Bytes::from_static(body), None).unwrap_err();
        assert!(e.message.contains("300 is not a valid INT8"), "{e}");
        let body = br#"{"inputs":[{"name":"X","shape":[1,3],"datatype":"FP32","data":[1,2]}]}"#;
        let e = decode(Bytes::from_static(body), None).unwrap_err();
        assert!(
            e.message.starts_with(
                "Unable to parse 'data': Shape does not match true shape of 'data' field"
            ),
            "{e}"
        );
        assert!(
            e.message.contains("has 3 element(s) but 'data' has 2"),
            "{e}"
        );
        for dt in ["FP16", "BF16"] {
            let body = format!(
                r#"{{"inputs":[{{"name":"X","shape":[1],"datatype":"{dt}","data":[1]}}]}}"#
            );
            let e = decode(Bytes::from(body), None).unwrap_err();
            assert_eq!(
                e.message,
                format!("receiving {dt} data via JSON is not supported. Please use the binary data format for input X")
            );
        }
    }

    fn f32s(data: &[u8]) -> Vec<f32> {
        data.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn json_nan_and_infinities() {
        let body = br#"{"id":"NaN","parameters":{"p":NaN,"q":-Infinity,"s":"Inf"},
            "inputs":[{"name":"X","shape":[1,6],"datatype":"FP32","data":[NaN,Inf,-Inf,Infinity,-Infinity,1.5]},
                      {"name":"Y","shape":[2],"datatype":"FP64","data":[-Infinity,NaN]},
                      {"name":"S","shape":[1],"datatype":"BYTES","data":["NaN"]}]}"#;
        let (req, _) = decode(Bytes::from_static(body), None).unwrap();
        assert_eq!(req.id, "NaN");
        assert!(matches!(req.parameters.get("p"), Some(Parameter::Double(d)) if d.is_nan()));
        assert!(
            matches!(req.parameters.get("q"), Some(Parameter::Double(d)) if *d == f64::NEG_INFINITY)
        );
        assert!(matches!(req.parameters.get("s"), Some(Parameter::String(s)) if s == "Inf"));
        let x = f32s(&req.inputs[0].data);
        assert!(x[0].is_nan());
        let inf = f32::INFINITY;
        assert_eq!(x[1..], [inf, -inf, inf, -inf, 1.5]);
        let y: Vec<f64> = req.inputs[1]
            .data
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(y[0] == f64::NEG_INFINITY && y[1].is_nan());
        assert_eq!(&req.inputs[2].data[4..], b"NaN");

        // Every other type refuses them, and so do a string input and the id.
        for (dt, token, shown) in [
            ("INT32", "NaN", "NaN"),
            ("BOOL", "Inf", "Infinity"),
            ("UINT8", "-Infinity", "-Infinity"),
            ("BYTES", "NaN", "NaN"),
        ] {
            let body = format!(
                r#"{{"inputs":[{{"name":"X","shape":[1],"datatype":"{dt}","data":[{token}]}}]}}"#
            );
            let e = decode(Bytes::from(body), None).unwrap_err();
            assert!(
                e.message
                    .contains(&format!("{shown} is not a valid {dt} value")),
                "{e}"
            );
        }
        let e = decode(Bytes::from_static(br#"{"id":NaN,"inputs":[]}"#), None).unwrap_err();
        assert!(e.message.contains("'id' must be a string, got NaN"), "{e}");
        // Nor is a tensor name (found by the http_infer fuzz target: it read as "\0NaN").
        let body = br#"{"inputs":[{"name":NaN,"shape":[1],"datatype":"BYTES","data":["a"]}]}"#;
        let e = decode(Bytes::from_static(body), None).unwrap_err();
        assert!(
            e.message.contains("input 'name' must be a string, got NaN"),
            "{e}"
        );
        let body = br#"{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[NaN]}],
            "outputs":[{"name":-Infinity}]}"#;
        let e = decode(Bytes::from_static(body), None).unwrap_err();
        assert!(
            e.message
                .contains("output 'name' must be a string, got -Infinity"),
            "{e}"
        );
        // A string that could pass for a sentinel stays a string on the fast path...
        let body = br#"{"id":"\u0000NaN","inputs":[{"name":"S","shape":[1],"datatype":"BYTES","data":["\u0000NaN"]}]}"#;
        let (req, _) = decode(Bytes::from_static(body), None).unwrap();
        assert_eq!(req.id, "\0NaN");
        assert_eq!(&req.inputs[0].data[4..], b"\0NaN");
        // ...and with bare tokens too the request is refused, not misread.
        let body =
            br#"{"id":"\u0000NaN","inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[NaN]}]}"#;
        let e = decode(Bytes::from_static(body), None).unwrap_err();
        assert!(
            e.message.contains("failed to parse the request JSON"),
            "{e}"
        );
        // Not a token: still the parse error, as serde_json says it.
        let e = decode(
            Bytes::from_static(
                br#"{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[Nan]}]}"#,
            ),
            None,
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("failed to parse the request JSON: expected value"),
            "{e}"
        );
    }

    #[test]
    fn writes_nan_and_infinities_as_triton() {
        let values = [f32::NAN, 1.5, f32::INFINITY, f32::NEG_INFINITY];
        let resp = InferResponse {
            model_name: "m".into(),
            model_version: 1,
            outputs: vec![
                Tensor::new(
                    "A",
                    DataType::Fp32,
                    vec![4],
                    values
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
                Tensor::new(
                    "B",
                    DataType::Fp64,
                    vec![2],
                    [0.25f64, f64::NAN]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
            ],
            ..Default::default()
        };
        let enc = encode_response(&resp, &[], &HttpOptions::default());
        let body = String::from_utf8(enc.parts.concat()).unwrap();
        assert!(
            body.contains(r#""data":[NaN,1.5,Infinity,-Infinity]"#),
            "{body}"
        );
        assert!(body.contains(r#""data":[0.25,NaN]"#), "{body}");
    }

    #[test]
    fn typed_data_decoding_agrees_with_the_json_tree() {
        let dtypes = [
            DataType::Bool,
            DataType::Uint8,
            DataType::Uint16,
            DataType::Uint32,
            DataType::Uint64,
            DataType::Int8,
            DataType::Int16,
            DataType::Int32,
            DataType::Int64,
            DataType::Fp32,
            DataType::Fp64,
            DataType::Bytes,
            DataType::Fp16,
        ];
        let texts = [
            "[]",
            "[[]]",
            "[true,false]",
            "[0,1,255]",
            "[256]",
            "[-1]",
            "[-128,127]",
            "[-129]",
            "[65535,65536]",
            "[4294967295]",
            "[4294967296]",
            "[-2147483648,2147483647]",
            "[-2147483649]",
            "[9223372036854775807]",
            "[9223372036854775808]",
            "[18446744073709551615]",
            "[18446744073709551616]",
            "[-9223372036854775808]",
            "[-0]",
            "[-0.0]",
            "[1.5,-2.25e10,1e-40,3.4e39]",
            "[1.0]",
            "[[1,2],[3,4]]",
            "[[1,[2]],3]",
            r#"["a","b\u00e9\n",""]"#,
            "[null]",
            "[{}]",
            r#"[{"a":1}]"#,
            "[1,true]",
            r#"[1,"1"]"#,
            "7",
            r#""x""#,
        ];
        for dtype in dtypes {
            for text in texts {
                let raw = RawValue::from_string(text.to_string()).unwrap();
                let tree: Value = serde_json::from_str(text).unwrap();
                let fast = data_to_bytes("X", dtype, &raw, 4, false);
                let slow = json_to_bytes("X", dtype, &tree, false);
                match (fast, slow) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{dtype} {text}"),
                    (Err(a), Err(b)) => assert_eq!(a.message, b.message, "{dtype} {text}"),
                    (a, b) => panic!("{dtype} {text}: {a:?} against {b:?}"),
                }
            }
        }
    }

    #[test]
    fn data_nesting_limit() {
        let nested = |depth: usize| {
            format!(
                r#"{{"inputs":[{{"name":"X","shape":[1],"datatype":"FP32","data":{}1{}}}]}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        // 100 arrays: the `data` array and 99 within it, as Triton allows.
        let (req, _) = decode(Bytes::from(nested(100)), None).unwrap();
        assert_eq!(f32s(&req.inputs[0].data), [1.0]);
        let e = decode(Bytes::from(nested(101)), None).unwrap_err();
        assert!(
            e.message.starts_with(
                "JSON nesting depth exceeds maximum allowed limit (100) in 'data' of input 'X'"
            ),
            "{e}"
        );
        // Deeper than serde_json's own limit: the same, no overflow.
        let e = decode(Bytes::from(nested(1000)), None).unwrap_err();
        assert!(
            e.message.starts_with(
                "JSON nesting depth exceeds maximum allowed limit (100) in 'data' of input 'X'"
            ),
            "{e}"
        );
        // A whole document that deep: a parse error with Triton's words.
        let e = decode(Bytes::from("[".repeat(200_000)), None).unwrap_err();
        assert!(
            e.message.starts_with("failed to parse the request JSON: JSON nesting depth exceeds maximum allowed limit (100): recursion limit exceeded"),
            "{e}"
        );
    }

    #[test]
    fn raw_binary_form() {
        let data: Vec<u8> = [1f32, 2., 3.]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let (req, opts) = decode(Bytes::from(data), Some(0)).unwrap();
        assert_eq!(req.inputs[0].shape, vec![1, 3]);
        assert!(opts.binary_default);
    }

    fn decode_raw_with(config: &str, body: &'static [u8]) -> Result<InferRequest> {
        let cfg = parse_pbtxt(config).unwrap();
        decode_request(
            "m",
            None,
            Bytes::from_static(body),
            Some(0),
            &cfg,
            &SharedMemory::new(false),
        )
        .map(|(r, _)| r)
    }

    #[test]
    fn raw_binary_as_triton() {
        // BYTES: the whole body is the one element, the length prefix added here.
        for (config, shape) in [
            (
                r#"name: "m" max_batch_size: 0 input [{name: "S" data_type: TYPE_STRING dims: [1]}]"#,
                vec![1],
            ),
            (
                r#"name: "m" max_batch_size: 8 input [{name: "S" data_type: TYPE_STRING dims: [1]}]"#,
                vec![1, 1],
            ),
        ] {
            let req = decode_raw_with(config, b"\x00\x01any bytes").unwrap();
            assert_eq!(req.inputs[0].shape, shape);
            assert_eq!(&req.inputs[0].data[..], b"\x0b\0\0\0\x00\x01any bytes");
        }
        let req = decode_raw_with(
            r#"name: "m" input [{name: "S" data_type: TYPE_STRING dims: [1]}]"#,
            b"",
        )
        .unwrap();
        assert_eq!(&req.inputs[0].data[..], &[0u8; 4]);
        for dims in ["-1", "2", "1, -1"] {
            let config =
                format!(r#"name: "m" input [{{name: "S" data_type: TYPE_STRING dims: [{dims}]}}]"#);
            let cfg = parse_pbtxt(&config).unwrap();
            let e = decode_request(
                "m",
                None,
                Bytes::from_static(b"abc"),
                Some(0),
                &cfg,
                &SharedMemory::new(false),
            )
            .unwrap_err();
            assert!(
                e.message.starts_with(
                    "For BYTE datatype raw input 'S', the model must have input shape [1]"
                ),
                "{dims}: {e}"
            );
        }
        let e = decode_raw_with(
            r#"name: "m" input [{name: "A" data_type: TYPE_INT32 dims: [-1, -1]}]"#,
            b"abcd",
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("The shape of the raw input 'A' can not be deduced because there are more than one variable-sized dimension"),
            "{e}"
        );
        let e = decode_raw_with(
            r#"name: "m" input [{name: "A" data_type: TYPE_INT32 dims: [1]}, {name: "B" data_type: TYPE_INT32 dims: [1]}]"#,
            b"abcd",
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration"
        );
        // Fixed dims: the body as it is, its size checked later with the shape.
        let req = decode_raw_with(
            r#"name: "m" input [{name: "A" data_type: TYPE_INT32 dims: [2]}]"#,
            b"abcdefgh",
        )
        .unwrap();
        assert_eq!(req.inputs[0].shape, vec![2]);
        assert_eq!(&req.inputs[0].data[..], b"abcdefgh");
    }

    #[test]
    fn encodes_json_and_binary() {
        let resp = InferResponse {
            model_name: "m".into(),
            model_version: 1,
            id: "x".into(),
            outputs: vec![
                Tensor::new(
                    "A",
                    DataType::Int32,
                    vec![2],
                    [1i32, -2]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
                Tensor::new("B", DataType::Fp16, vec![1], vec![0u8, 60]),
            ],
            ..Default::default()
        };
        let enc = encode_response(&resp, &[], &HttpOptions::default());
        let n = enc.json_len.unwrap();
        let body = enc.parts.concat();
        let v: Value = serde_json::from_slice(&body[..n]).unwrap();
        assert_eq!(v["model_version"], "1");
        assert_eq!(v["outputs"][0]["data"], serde_json::json!([1, -2]));
        assert_eq!(v["outputs"][1]["parameters"]["binary_data_size"], 2);
        assert_eq!(&body[n..], &[0u8, 60]);
        assert_eq!(enc.parts.len(), 2, "the binary output is its own part");
    }

    #[test]
    fn writes_integer_data_as_a_json_array() {
        let cases: [(DataType, Vec<u8>, &str); 6] = [
            (DataType::Int8, vec![0x80, 0x7f, 0xff], "[-128,127,-1]"),
            (DataType::Uint8, vec![0, 255], "[0,255]"),
            (DataType::Uint16, 65535u16.to_le_bytes().to_vec(), "[65535]"),
            (
                DataType::Int64,
                [i64::MIN, 0, i64::MAX]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "[-9223372036854775808,0,9223372036854775807]",
            ),
            (
                DataType::Uint64,
                u64::MAX.to_le_bytes().to_vec(),
                "[18446744073709551615]",
            ),
            (DataType::Int32, vec![], "[]"),
        ];
        for (dtype, data, want) in cases {
            let t = Tensor::new("A", dtype, vec![-1], data);
            let mut out = Vec::new();
            data_to_json(&t, &mut out).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), want, "{dtype}");
        }
    }
}
