//! Conversion between `inference.ModelInferRequest`/`ModelInferResponse`
//! and the core types: typed `contents` or `raw_input_contents` (never both)
//! in, `raw_output_contents` out, as Triton does.

use std::collections::HashMap;

use crate::proto::{
    infer_parameter::ParameterChoice, model_infer_response, InferParameter, InferTensorContents,
    ModelInferRequest, ModelInferResponse,
};
use tern_core::error::{Error, Result};
use tern_core::tensor::element_count;
use tern_core::validate::{classification_param, element_count_matches, input_header};
use tern_core::{
    bytes_tensor, DataType, InferRequest, InferResponse, Parameter, Parameters, RequestedOutput,
    Tensor,
};
use tern_memory::shm::{self, SharedMemory};

/// Converts wire parameters; `what` names the owner in an error (built only then).
fn parameters(
    map: HashMap<String, InferParameter>,
    what: impl Fn() -> String,
) -> Result<Parameters> {
    let mut out = Parameters::new();
    for (k, v) in map {
        let p = match v.parameter_choice {
            Some(ParameterChoice::BoolParam(b)) => Parameter::Bool(b),
            Some(ParameterChoice::Int64Param(i)) => Parameter::Int(i),
            Some(ParameterChoice::StringParam(s)) => Parameter::String(s),
            Some(ParameterChoice::DoubleParam(d)) => Parameter::Double(d),
            Some(ParameterChoice::Uint64Param(u)) => {
                Parameter::Int(i64::try_from(u).map_err(|_| {
                    Error::invalid_arg(format!("{} parameter '{k}': {u} is too large", what()))
                })?)
            }
            None => {
                return Err(Error::invalid_arg(format!(
                    "{} parameter '{k}' has no value",
                    what()
                )))
            }
        };
        out.insert(k, p);
    }
    Ok(out)
}

/// A request or response parameter in gRPC's wire form.
pub fn to_wire(p: &Parameter) -> InferParameter {
    let choice = match p {
        Parameter::Bool(b) => ParameterChoice::BoolParam(*b),
        Parameter::Int(i) => ParameterChoice::Int64Param(*i),
        Parameter::Double(d) => ParameterChoice::DoubleParam(*d),
        Parameter::String(s) => ParameterChoice::StringParam(s.clone()),
    };
    InferParameter {
        parameter_choice: Some(choice),
    }
}

/// The `InferTensorContents` lists, in field order.
const CONTENT_FIELDS: [&str; 8] = [
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
];

/// Which `CONTENT_FIELDS` entry carries a data type (`None`: FP16/BF16, raw only).
fn content_field(dt: DataType) -> Option<usize> {
    Some(match dt {
        DataType::Bool => 0,
        DataType::Int8 | DataType::Int16 | DataType::Int32 => 1,
        DataType::Int64 => 2,
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => 3,
        DataType::Uint64 => 4,
        DataType::Fp32 => 5,
        DataType::Fp64 => 6,
        DataType::Bytes => 7,
        DataType::Fp16 | DataType::Bf16 => return None,
    })
}

/// Typed contents → tensor bytes; the list used must match the datatype.
fn contents_to_bytes(name: &str, dt: DataType, c: InferTensorContents) -> Result<(Vec<u8>, usize)> {
    let used = [
        !c.bool_contents.is_empty(),
        !c.int_contents.is_empty(),
        !c.int64_contents.is_empty(),
        !c.uint_contents.is_empty(),
        !c.uint64_contents.is_empty(),
        !c.fp32_contents.is_empty(),
        !c.fp64_contents.is_empty(),
        !c.bytes_contents.is_empty(),
    ];
    let allowed = content_field(dt);
    if allowed.is_none()
        || used
            .iter()
            .enumerate()
            .any(|(i, &u)| u && Some(i) != allowed)
    {
        let field = allowed.map_or(
            "raw_input_contents (FP16/BF16 have no typed contents)",
            |i| CONTENT_FIELDS[i],
        );
        return Err(Error::invalid_arg(format!(
            "input '{name}': the contents for datatype {dt} must be in the {field} field"
        )));
    }
    let mut buf = Vec::new();
    // Narrows each value to the element type (range-checked) and appends it little-endian.
    macro_rules! put {
        ($list:expr, $ty:ty) => {{
            for &v in &$list {
                let x = <$ty>::try_from(v).map_err(|_| {
                    Error::invalid_arg(format!("input '{name}': {v} is not a valid {dt} value"))
                })?;
                buf.extend_from_slice(&x.to_le_bytes());
            }
            $list.len()
        }};
    }
    let n = match dt {
        DataType::Bool => {
            buf.extend(c.bool_contents.iter().map(|&b| b as u8));
            c.bool_contents.len()
        }
        DataType::Int8 => put!(c.int_contents, i8),
        DataType::Int16 => put!(c.int_contents, i16),
        DataType::Int32 => put!(c.int_contents, i32),
        DataType::Int64 => put!(c.int64_contents, i64),
        DataType::Uint8 => put!(c.uint_contents, u8),
        DataType::Uint16 => put!(c.uint_contents, u16),
        DataType::Uint32 => put!(c.uint_contents, u32),
        DataType::Uint64 => put!(c.uint64_contents, u64),
        DataType::Fp32 => put!(c.fp32_contents, f32),
        DataType::Fp64 => put!(c.fp64_contents, f64),
        DataType::Bytes => {
            c.bytes_contents
                .iter()
                .for_each(|v| bytes_tensor::push(&mut buf, v));
            c.bytes_contents.len()
        }
        DataType::Fp16 | DataType::Bf16 => unreachable!("rejected above: no typed contents"),
    };
    Ok((buf, n))
}

/// Decodes a gRPC inference request; inputs and outputs in shared memory are
/// resolved against `shm`.
pub fn decode_request(req: ModelInferRequest, shm: &SharedMemory) -> Result<InferRequest> {
    let version = crate::frontend::common::parse_version(&req.model_version)?;
    let mut inputs_params = Vec::with_capacity(req.inputs.len());
    for input in &req.inputs {
        // Most inputs carry no parameters: skip the conversion on the hot path.
        if input.parameters.is_empty() {
            inputs_params.push(None);
            continue;
        }
        let what = format!("input '{}'", input.name);
        inputs_params.push(shm::parameters(
            &parameters(input.parameters.clone(), || what.clone())?,
            &what,
        )?);
    }
    // As tritonclient sends them: one raw entry per input that is not in shared memory.
    let wanted = inputs_params.iter().filter(|p| p.is_none()).count();
    let raw = req.raw_input_contents;
    if !raw.is_empty() && raw.len() != wanted {
        return Err(Error::invalid_arg(format!(
            "raw_input_contents has {} entries but the request has {wanted} inputs outside shared memory; \
             there must be one per such input, in order",
            raw.len(),
        )));
    }
    let mut raw = raw.into_iter();
    let mut inputs = Vec::with_capacity(req.inputs.len());
    for (input, in_shm) in req.inputs.into_iter().zip(inputs_params) {
        let name = input.name;
        let dt = input_header(&name, &input.datatype, &input.shape)?;
        if let Some((region, offset, size)) = in_shm {
            if input.contents.is_some() {
                return Err(Error::invalid_arg(format!(
                    "input '{name}': contents cannot be given for an input in shared memory"
                )));
            }
            let data = shm.input(&name, &region, offset, size)?;
            inputs.push(Tensor::new(name, dt, input.shape, data));
            continue;
        }
        let data = match (raw.next(), input.contents) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid_arg(format!(
                    "input '{name}': contents and raw_input_contents cannot both be specified"
                )))
            }
            (Some(bytes), None) => own_small(bytes),
            (None, Some(c)) => {
                let (buf, n) = contents_to_bytes(&name, dt, c)?;
                element_count_matches(&name, &input.shape, n, "'contents'")?;
                buf.into()
            }
            (None, None) => {
                if element_count(&input.shape) != 0 {
                    return Err(Error::invalid_arg(format!(
                        "input '{name}' has neither contents nor raw_input_contents"
                    )));
                }
                Default::default()
            }
        };
        inputs.push(Tensor::new(name, dt, input.shape, data));
    }
    let mut outputs = Vec::with_capacity(req.outputs.len());
    for out in req.outputs {
        let params = parameters(out.parameters, || format!("output '{}'", out.name))?;
        let classification = classification_param(&out.name, &params)?;
        let target = shm.output_target(&out.name, &params, classification.is_some())?;
        outputs.push(RequestedOutput {
            name: out.name,
            classification,
            binary: None,
            shm: target,
        });
    }
    Ok(InferRequest {
        model_name: req.model_name,
        model_version: version,
        id: req.id,
        inputs,
        outputs,
        parameters: parameters(req.parameters, || "request".into())?,
        callers: Vec::new(),
        responder: None,
        trace: None,
    })
}

/// Raw inputs up to this size are copied out of the gRPC message.
const COPY_INPUT_BELOW: usize = 4096;

/// A small raw input as its own allocation. Decoded `bytes` fields are views
/// of tonic's whole read buffer (8 KiB or more per request): a small tensor
/// would keep that buffer alive while the request waits in a queue, and free
/// it on the instance thread instead of the frontend thread that allocated it.
fn own_small(raw: bytes::Bytes) -> bytes::Bytes {
    if raw.len() <= COPY_INPUT_BELOW {
        bytes::Bytes::copy_from_slice(&raw)
    } else {
        raw
    }
}

/// Encodes a response with `raw_output_contents`, as Triton does. Outputs
/// written to shared memory have an empty raw entry and no parameters.
pub fn encode_response(resp: InferResponse, requested: &[RequestedOutput]) -> ModelInferResponse {
    let mut outputs = Vec::with_capacity(resp.outputs.len());
    let mut raw = Vec::with_capacity(resp.outputs.len());
    for t in resp.outputs {
        // An output written to shared memory has an empty raw entry and no
        // parameters, as in Triton.
        let in_shm = requested
            .iter()
            .any(|r| r.name == t.name && r.shm.is_some());
        let data = if in_shm { Default::default() } else { t.data };
        outputs.push(model_infer_response::InferOutputTensor {
            name: t.name,
            datatype: t.dtype.wire_name().to_string(),
            shape: t.shape,
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(data);
    }
    ModelInferResponse {
        model_name: resp.model_name,
        model_version: resp.model_version.to_string(),
        id: resp.id,
        parameters: resp
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), to_wire(v)))
            .collect(),
        outputs,
        raw_output_contents: raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::model_infer_request::InferInputTensor;

    #[test]
    fn small_raw_inputs_stop_sharing_the_message_buffer() {
        let message = bytes::Bytes::from(vec![7u8; 2 * COPY_INPUT_BELOW]);
        let small = own_small(message.slice(..64));
        assert_eq!(&small[..], &[7u8; 64][..]);
        assert!(!message.as_ptr_range().contains(&small.as_ptr()), "a copy");
        let large = own_small(message.slice(..COPY_INPUT_BELOW + 1));
        assert_eq!(
            large.as_ptr(),
            message.as_ptr(),
            "large inputs stay zero-copy"
        );
    }

    fn input(dt: &str, shape: Vec<i64>, contents: Option<InferTensorContents>) -> InferInputTensor {
        InferInputTensor {
            name: "X".into(),
            datatype: dt.into(),
            shape,
            parameters: HashMap::new(),
            contents,
        }
    }

    #[test]
    fn typed_and_raw_contents() {
        let c = InferTensorContents {
            int_contents: vec![1, -2],
            ..Default::default()
        };
        let req = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("INT16", vec![2], Some(c))],
            ..Default::default()
        };
        let r = decode_request(req, &SharedMemory::new(false)).unwrap();
        assert_eq!(&r.inputs[0].data[..], &[1, 0, 0xfe, 0xff]);
        let req = ModelInferRequest {
            inputs: vec![input("FP16", vec![1], None)],
            raw_input_contents: vec![vec![0, 60].into()],
            ..Default::default()
        };
        assert_eq!(
            decode_request(req, &SharedMemory::new(false))
                .unwrap()
                .inputs[0]
                .data
                .len(),
            2
        );
        let c = InferTensorContents {
            bytes_contents: vec![b"ab".to_vec().into()],
            ..Default::default()
        };
        let req = ModelInferRequest {
            inputs: vec![input("BYTES", vec![1], Some(c))],
            ..Default::default()
        };
        assert_eq!(
            &decode_request(req, &SharedMemory::new(false))
                .unwrap()
                .inputs[0]
                .data[..],
            &[2, 0, 0, 0, b'a', b'b']
        );
    }

    #[test]
    fn errors() {
        let err = |req: ModelInferRequest| {
            decode_request(req, &SharedMemory::new(false))
                .unwrap_err()
                .message
        };
        let c = || {
            Some(InferTensorContents {
                fp32_contents: vec![1.0],
                ..Default::default()
            })
        };
        assert!(err(ModelInferRequest {
            inputs: vec![input("INT32", vec![1], c())],
            ..Default::default()
        })
        .contains("int_contents"));
        assert!(err(ModelInferRequest {
            inputs: vec![input("FP32", vec![2], c())],
            ..Default::default()
        })
        .contains("has 2 element(s) but 'contents' has 1"));
        assert!(err(ModelInferRequest {
            inputs: vec![input("FP32", vec![1], c())],
            raw_input_contents: vec![vec![0; 4].into()],
            ..Default::default()
        })
        .contains("cannot both"));
        assert!(err(ModelInferRequest {
            inputs: vec![input("FP16", vec![1], Some(Default::default()))],
            ..Default::default()
        })
        .contains("raw_input_contents"));
        let big = Some(InferTensorContents {
            int_contents: vec![300],
            ..Default::default()
        });
        assert!(err(ModelInferRequest {
            inputs: vec![input("INT8", vec![1], big)],
            ..Default::default()
        })
        .contains("300 is not a valid INT8"));
    }
}
