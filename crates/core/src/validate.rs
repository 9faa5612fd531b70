//! The one place where inference requests are checked against a model's
//! configuration, for every frontend alike: input names, data types, shapes
//! (variable dims, the batch dimension, `max_batch_size`), data sizes,
//! optional inputs, requested outputs and duplicates; and where a validated
//! request's inputs get their configured `reshape`.

use super::tensor::shape_str;
use super::{DataType, InferRequest, RequestedOutput, Tensor};
use crate::config::pb::{ModelInput, ModelOutput};
use crate::config::ModelConfig;
use crate::dtype::config_name;
use crate::error::{Error, Result};
use crate::messages;

/// Whether `name` appears among `before` (a scan, not a set: tensor lists are
/// short, and this runs on every request without allocating).
fn repeated<T>(before: &[T], name: &str, name_of: impl Fn(&T) -> &String) -> bool {
    before.iter().any(|p| name_of(p) == name)
}

/// Validates a request for `cfg`; returns the request's batch size (1 when the model does not batch).
pub fn validate_request(cfg: &ModelConfig, req: &InferRequest) -> Result<usize> {
    let m = &cfg.name;
    let mut batch_size: Option<i64> = None;
    for (i, t) in req.inputs.iter().enumerate() {
        let spec = input_spec(cfg, &req.id, &req.inputs[..i], t)?;
        check_input_datatype(m, spec, t)?;
        check_input_shape(cfg, spec, t)?;
        if cfg.max_batch_size > 0 {
            batch_size = Some(check_batch_size(cfg, t, batch_size)?);
        }
        check_input_data(m, &req.id, t)?;
    }
    check_required_inputs(cfg, req)?;
    for (i, o) in req.outputs.iter().enumerate() {
        check_requested_output(cfg, &req.id, &req.outputs[..i], o)?;
    }
    Ok(batch_size.unwrap_or(1) as usize)
}

/// The configured input a request input `t` feeds: `t` must not repeat a
/// name among the inputs `before` it (Triton's text, with the request `id`),
/// and must be one of the model's inputs.
fn input_spec<'c>(
    cfg: &'c ModelConfig,
    id: &str,
    before: &[Tensor],
    t: &Tensor,
) -> Result<&'c ModelInput> {
    let m = &cfg.name;
    if repeated(before, &t.name, |p| &p.name) {
        return Err(messages::duplicate_input(id, &t.name));
    }
    cfg.input.iter().find(|i| i.name == t.name).ok_or_else(|| {
        Error::invalid_arg(format!(
            "unexpected inference input '{}' for model '{m}'; the model's inputs are [{}]",
            t.name,
            cfg.input
                .iter()
                .map(|i| format!("'{}'", i.name))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// An input's data type is the configured one.
fn check_input_datatype(m: &str, spec: &ModelInput, t: &Tensor) -> Result<()> {
    if t.dtype.to_config() as i32 != spec.data_type {
        return Err(Error::invalid_arg(format!(
            "unexpected datatype {} for inference input '{}', expecting {} for model '{m}'",
            config_name(t.dtype.to_config() as i32),
            t.name,
            config_name(spec.data_type)
        )));
    }
    Ok(())
}

/// An input's shape matches the configured dims (each `-1` taking any size),
/// after a leading batch dimension of any size when the model batches; no
/// dim is negative.
fn check_input_shape(cfg: &ModelConfig, spec: &ModelInput, t: &Tensor) -> Result<()> {
    let m = &cfg.name;
    let expected: Vec<i64> = if cfg.max_batch_size > 0 {
        std::iter::once(-1)
            .chain(spec.dims.iter().copied())
            .collect()
    } else {
        spec.dims.clone()
    };
    let shape_ok = t.shape.len() == expected.len()
        && t.shape.iter().all(|&d| d >= 0)
        && t.shape
            .iter()
            .zip(&expected)
            .all(|(&got, &want)| want == -1 || got == want);
    if !shape_ok {
        return Err(Error::invalid_arg(format!(
            "unexpected shape for input '{}' for model '{m}'. Expected {}, got {}",
            t.name,
            shape_str(&expected),
            shape_str(&t.shape)
        )));
    }
    Ok(())
}

/// The batch size of an input of a batching model (its shape checked, so
/// with a first dim): between 1 and `max_batch_size`, and the same as
/// `earlier`, the batch size of the inputs before it, if any; returns it.
fn check_batch_size(cfg: &ModelConfig, t: &Tensor, earlier: Option<i64>) -> Result<i64> {
    let m = &cfg.name;
    let b = t.shape[0];
    if b < 1 || b > cfg.max_batch_size as i64 {
        return Err(Error::invalid_arg(format!(
            "inference request batch-size must be <= {} for '{m}', got {b} (input '{}')",
            cfg.max_batch_size, t.name
        )));
    }
    match earlier {
        Some(prev) if prev != b => Err(Error::invalid_arg(format!(
            "input '{}' has batch size {b} but other inputs have batch size {prev} for model '{m}'",
            t.name
        ))),
        _ => Ok(b),
    }
}

/// An input's data is the size its shape needs: for a fixed-size type,
/// Triton's byte size mismatch (with the request `id`); BYTES elements are
/// counted by [`Tensor::check_data_size`].
fn check_input_data(m: &str, id: &str, t: &Tensor) -> Result<()> {
    let Some(size) = t.dtype.size() else {
        return t
            .check_data_size()
            .map_err(|e| e.context(format!("model '{m}'")));
    };
    let expected = match count_elements(&t.shape, false) {
        Count::Elements(n) if n <= i64::MAX / size as i64 => n as usize * size,
        Count::Invalid => return Err(messages::invalid_dimension(&t.name, &t.shape)),
        _ => return Err(messages::byte_size_too_large(&t.name)),
    };
    if t.data.len() != expected {
        return Err(messages::input_byte_size_mismatch(
            id,
            &t.name,
            m,
            expected,
            t.data.len(),
        ));
    }
    Ok(())
}

/// Every input the config does not mark `optional` is in the request.
fn check_required_inputs(cfg: &ModelConfig, req: &InferRequest) -> Result<()> {
    let m = &cfg.name;
    let missing: Vec<String> = cfg
        .input
        .iter()
        .filter(|i| !i.optional && req.input(&i.name).is_none())
        .map(|i| format!("'{}'", i.name))
        .collect();
    if !missing.is_empty() {
        return Err(Error::invalid_arg(format!(
            "expected {} inputs but got {} inputs for model '{m}'. Got input(s) [{}], but missing required input(s) [{}]. \
             Please provide all required input(s).",
            cfg.input.iter().filter(|i| !i.optional).count(),
            req.inputs.len(),
            req.inputs.iter().map(|t| format!("'{}'", t.name)).collect::<Vec<_>>().join(", "),
            missing.join(", ")
        )));
    }
    Ok(())
}

/// A requested output: not requested among the outputs `before` it (current
/// Triton's text, with the request `id`), one of the model's outputs, and
/// classifiable when it asks for classification.
fn check_requested_output(
    cfg: &ModelConfig,
    id: &str,
    before: &[RequestedOutput],
    o: &RequestedOutput,
) -> Result<()> {
    let m = &cfg.name;
    if repeated(before, &o.name, |p| &p.name) {
        return Err(messages::duplicate_output(id, &o.name));
    }
    let Some(spec) = cfg.output.iter().find(|s| s.name == o.name) else {
        return Err(Error::invalid_arg(format!(
            "unexpected inference output '{}' for model '{m}'",
            o.name
        )));
    };
    match o.classification {
        Some(n) => check_classification(m, spec, &o.name, n),
        None => Ok(()),
    }
}

/// Classification (top `n` classes) of output `name`: the output is numeric
/// (not BYTES) and `n` is at least 1.
fn check_classification(m: &str, spec: &ModelOutput, name: &str, n: usize) -> Result<()> {
    let numeric = DataType::from_config(spec.data_type)
        .map(|d| d != DataType::Bytes)
        .unwrap_or(false);
    if !numeric {
        return Err(Error::invalid_arg(format!(
            "classification is not supported for output '{name}' of model '{m}': it is not numeric"
        )));
    }
    if n == 0 {
        return Err(Error::invalid_arg(format!(
            "classification count for output '{name}' must be >= 1"
        )));
    }
    Ok(())
}

/// Applies the config's input `reshape`s to a validated request, as Triton's
/// request normalisation does: the backend (and an ensemble's steps) see the
/// reshaped shape, with each `-1` of the reshape taking, in order, the value
/// the request gave the corresponding `-1` of `dims`; the batch dimension
/// stays in front. The data is not touched.
pub fn apply_reshape(cfg: &ModelConfig, req: &mut InferRequest) {
    if cfg.input.iter().all(|i| i.reshape.is_none()) {
        return;
    }
    let batched = cfg.max_batch_size > 0;
    for t in &mut req.inputs {
        let Some(spec) = cfg.input.iter().find(|i| i.name == t.name) else {
            continue;
        };
        let Some(reshape) = &spec.reshape else {
            continue;
        };
        let item = if batched { &t.shape[1..] } else { &t.shape[..] };
        let mut variable = spec
            .dims
            .iter()
            .zip(item)
            .filter(|(d, _)| **d == -1)
            .map(|(_, got)| *got);
        let mut shape = Vec::with_capacity(reshape.shape.len() + 1);
        if batched {
            shape.push(t.shape[0]);
        }
        for &d in &reshape.shape {
            // Validation made the -1 counts of dims and reshape equal.
            shape.push(if d == -1 {
                variable.next().unwrap_or(1)
            } else {
                d
            });
        }
        t.shape = shape;
    }
}

/// Checks the outputs a plugin (or any backend that builds its own tensors)
/// returned for one request of `batch_size`: known, unique names, the
/// configured data type, a shape matching the configured dims (with the
/// batch dimension when the model batches) and a data size that fits.
pub fn validate_outputs(
    cfg: &ModelConfig,
    batch_size: usize,
    outputs: &[super::Tensor],
) -> Result<()> {
    let m = &cfg.name;
    for (i, t) in outputs.iter().enumerate() {
        if repeated(&outputs[..i], &t.name, |p| &p.name) {
            return Err(Error::internal(format!(
                "model '{m}' returned output '{}' more than once",
                t.name
            )));
        }
        // A sequence model's state outputs are checked like outputs: the
        // batcher keeps them for the sequence's next request.
        let state;
        let (data_type, dims) = match cfg.output.iter().find(|o| o.name == t.name) {
            Some(spec) => (spec.data_type, &spec.dims),
            None => match crate::sequence::extra_outputs(cfg)
                .into_iter()
                .find(|s| s.name == t.name)
            {
                Some(s) => {
                    state = s;
                    (state.data_type, &state.dims)
                }
                None => {
                    return Err(Error::internal(format!(
                        "model '{m}' returned output '{}', which is not in its configuration",
                        t.name
                    )))
                }
            },
        };
        if t.dtype.to_config() as i32 != data_type {
            return Err(Error::internal(format!(
                "model '{m}' output '{}': expected datatype {}, got {}",
                t.name,
                config_name(data_type),
                config_name(t.dtype.to_config() as i32)
            )));
        }
        let expected: Vec<i64> = if cfg.max_batch_size > 0 {
            std::iter::once(batch_size as i64)
                .chain(dims.iter().copied())
                .collect()
        } else {
            dims.to_vec()
        };
        let shape_ok = t.shape.len() == expected.len()
            && t.shape
                .iter()
                .zip(&expected)
                .all(|(&got, &want)| got >= 0 && (want == -1 || got == want));
        if !shape_ok {
            return Err(Error::internal(format!(
                "model '{m}' output '{}': expected shape {}, got {}",
                t.name,
                shape_str(&expected),
                shape_str(&t.shape)
            )));
        }
        t.check_size_as("output")
            .map_err(|e| Error::internal(format!("model '{m}': {}", e.message)))?;
    }
    Ok(())
}

/// Checks an input's wire description (datatype name, non-negative dims, a
/// byte size that fits `i64`), with current Triton core's texts (what gRPC
/// and HTTP binary or shared-memory inputs get); returns the data type.
pub fn input_header(name: &str, datatype: &str, shape: &[i64]) -> Result<DataType> {
    let dt = wire_datatype(name, datatype)?;
    tensor_shape(name, dt, shape)?;
    Ok(dt)
}

/// The data type an input's wire `datatype` names.
pub fn wire_datatype(name: &str, datatype: &str) -> Result<DataType> {
    DataType::from_wire(datatype)
        .ok_or_else(|| Error::invalid_arg(format!("input '{name}': unknown datatype '{datatype}'")))
}

/// An element count as Triton's `GetElementCount` finds it, reading the
/// dims left to right.
#[derive(Debug, PartialEq)]
enum Count {
    /// The count (1 for a scalar shape `[]`).
    Elements(i64),
    /// A negative dim came first. (Triton's core calls `-1` a wildcard and
    /// refuses it earlier, with `All input dimensions should be specified`;
    /// Tern refuses it here as any other negative dim.)
    Invalid,
    /// The count passed `i64::MAX` first.
    Overflow,
}

/// Counts `shape`'s elements; `zero_stops`: the HTTP frontend's variant,
/// which answers 0 at the first 0 dim without reading on.
fn count_elements(shape: &[i64], zero_stops: bool) -> Count {
    let mut count: Option<i64> = None;
    for &d in shape {
        if d < 0 {
            return Count::Invalid;
        }
        if d == 0 && zero_stops {
            return Count::Elements(0);
        }
        count = Some(match count {
            None => d,
            Some(c) if d != 0 && c > i64::MAX / d => return Count::Overflow,
            Some(c) => c * d,
        });
    }
    Count::Elements(count.unwrap_or(1))
}

/// A tensor's shape has no negative dim and a byte size that fits `i64`
/// (every BYTES element takes at least its 4-byte length prefix), with the
/// texts of current Triton core's `GetByteSize`.
pub fn tensor_shape(name: &str, dt: DataType, shape: &[i64]) -> Result<()> {
    let count = count_elements(shape, false);
    let Some(size) = dt.size() else {
        return match count {
            Count::Invalid => Err(messages::invalid_dimension_in_shape(name, shape)),
            Count::Overflow => Err(messages::element_count_too_large(name)),
            Count::Elements(n) if n > i64::MAX / 4 => Err(messages::byte_size_too_large(name)),
            Count::Elements(_) => Ok(()),
        };
    };
    match count {
        Count::Invalid => Err(messages::invalid_dimension(name, shape)),
        Count::Elements(n) if n <= i64::MAX / size as i64 => Ok(()),
        _ => Err(messages::byte_size_too_large(name)),
    }
}

/// The shape of an HTTP input whose data is JSON `data`: current Triton's
/// HTTP frontend checks it first, with texts of its own; then
/// [`tensor_shape`] as for any input.
pub fn json_input_shape(name: &str, dt: DataType, shape: &[i64]) -> Result<()> {
    match count_elements(shape, true) {
        Count::Invalid => return Err(messages::json_shape_invalid_dims(name, shape)),
        Count::Overflow => return Err(messages::json_shape_count_overflow(name, shape)),
        Count::Elements(n) => match dt.size() {
            Some(size) if size > 1 && n > i64::MAX / size as i64 => {
                return Err(messages::json_byte_size_overflow(name, n, size))
            }
            _ => {}
        },
    }
    tensor_shape(name, dt, shape)
}

/// Checks that typed data (`field`: `'data'`, `'contents'`) holds as many elements as the shape.
pub fn element_count_matches(name: &str, shape: &[i64], count: usize, field: &str) -> Result<()> {
    let expected = super::tensor::element_count(shape);
    if count != expected {
        return Err(Error::invalid_arg(format!(
            "input '{name}': shape {} has {expected} element(s) but {field} has {count}",
            shape_str(shape)
        )));
    }
    Ok(())
}

/// Reads a requested output's `classification` parameter (top N classes).
pub fn classification_param(output: &str, params: &super::Parameters) -> Result<Option<usize>> {
    match params.get("classification") {
        None => Ok(None),
        Some(super::Parameter::Int(n)) if *n >= 0 => Ok(Some(*n as usize)),
        Some(_) => Err(Error::invalid_arg(format!(
            "output '{output}': 'classification' must be a non-negative integer"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reshape_resolves_variable_dims_in_order() {
        let cfg = crate::config::parse_pbtxt(
            r#"name: "m" max_batch_size: 4 input [{name: "X" data_type: TYPE_FP32 dims: [2,4,-1,6] reshape { shape: [8,-1,1,6] }},
               {name: "Y" data_type: TYPE_FP32 dims: [8]}]"#,
        )
        .unwrap();
        let mut req = InferRequest {
            inputs: vec![
                crate::Tensor::new(
                    "X",
                    DataType::Fp32,
                    vec![3, 2, 4, 5, 6],
                    vec![0u8; 3 * 240 * 4],
                ),
                crate::Tensor::new("Y", DataType::Fp32, vec![3, 8], vec![0u8; 3 * 8 * 4]),
            ],
            ..Default::default()
        };
        super::apply_reshape(&cfg, &mut req);
        assert_eq!(req.inputs[0].shape, vec![3, 8, 5, 1, 6]);
        assert_eq!(req.inputs[1].shape, vec![3, 8], "no reshape: unchanged");
    }

    use super::*;
    use crate::config::parse_pbtxt;
    use crate::{bytes_tensor, RequestedOutput, Tensor};

    #[test]
    fn wire_shapes_whose_size_overflows_are_refused() {
        let msg = |r: Result<DataType>| r.unwrap_err().message;
        let too_big = "byte size for tensor 'x' exceeds maximum size of 9223372036854775807";
        assert_eq!(msg(input_header("x", "FP32", &[8, 1 << 61])), too_big);
        assert_eq!(msg(input_header("x", "FP32", &[1, 1 << 62])), too_big);
        assert_eq!(msg(input_header("x", "BYTES", &[1 << 62])), too_big);
        assert_eq!(
            msg(input_header("x", "BYTES", &[1 << 62, 4])),
            "element count for tensor 'x' exceeds maximum size of 9223372036854775807"
        );
        assert!(input_header("x", "INT8", &[1 << 31, 1 << 31]).is_ok());
        assert!(input_header("x", "FP32", &[0, 16]).is_ok());
        // Triton's core counts left to right: a 0 after an overflow is too late.
        assert!(input_header("x", "FP32", &[0, 1 << 62, 1 << 62]).is_ok());
        assert_eq!(
            msg(input_header("x", "FP32", &[1 << 62, 1 << 62, 0])),
            too_big
        );
    }

    #[test]
    fn negative_dims_get_current_tritons_core_texts() {
        let msg = |r: Result<DataType>| r.unwrap_err().message;
        assert_eq!(
            msg(input_header("IN", "FP32", &[-2, -2])),
            "tensor 'IN' contains an invalid dimension [-2,-2]"
        );
        assert_eq!(
            msg(input_header("IN", "BYTES", &[1, -1])),
            "tensor 'IN' contains an invalid dimension in shape [1,-1]"
        );
        assert_eq!(
            msg(input_header("IN", "FLOAT", &[1])),
            "input 'IN': unknown datatype 'FLOAT'"
        );
    }

    #[test]
    fn json_data_shapes_get_the_http_frontends_texts() {
        let msg = |shape: &[i64], dt| json_input_shape("IN", dt, shape).unwrap_err().message;
        assert_eq!(
            msg(&[i64::MIN, 1], DataType::Fp32),
            "invalid shape for input 'IN': shape [-9223372036854775808,1] contains one or more invalid dimensions"
        );
        assert_eq!(
            msg(&[i64::MAX, i64::MAX], DataType::Fp32),
            "invalid shape for input 'IN': shape [9223372036854775807,9223372036854775807] causes total element count to exceed maximum size of 9223372036854775807"
        );
        assert_eq!(
            msg(&[8, 1 << 61], DataType::Int8),
            "invalid shape for input 'IN': shape [8,2305843009213693952] causes total element count to exceed maximum size of 9223372036854775807"
        );
        assert_eq!(
            msg(&[1, 1 << 62], DataType::Fp32),
            "byte size overflow for input 'IN': element count (4611686018427387904) * data type size (4) exceeds maximum allowed size (9223372036854775807)"
        );
        // BYTES sizes come from the data: only the core check applies.
        assert_eq!(
            msg(&[1 << 62], DataType::Bytes),
            "byte size for tensor 'IN' exceeds maximum size of 9223372036854775807"
        );
        // The frontend stops at a 0 dim; the core check still sees the negative one.
        assert_eq!(
            msg(&[0, -5], DataType::Fp32),
            "tensor 'IN' contains an invalid dimension [0,-5]"
        );
        assert!(json_input_shape("IN", DataType::Int8, &[1 << 31, 1 << 31]).is_ok());
        assert!(json_input_shape("IN", DataType::Fp32, &[]).is_ok());
    }

    fn simple() -> ModelConfig {
        parse_pbtxt(
            r#"name: "simple" max_batch_size: 8
               input [{name: "INPUT0" data_type: TYPE_INT32 dims: [16]}, {name: "INPUT1" data_type: TYPE_INT32 dims: [16]},
                      {name: "OPT" data_type: TYPE_STRING dims: [-1] optional: true}]
               output [{name: "OUTPUT0" data_type: TYPE_INT32 dims: [16]}, {name: "S" data_type: TYPE_STRING dims: [1]}]"#,
        )
        .unwrap()
    }

    fn int_input(name: &str, shape: Vec<i64>) -> Tensor {
        let n: i64 = shape.iter().product();
        Tensor::new(name, DataType::Int32, shape, vec![0u8; n as usize * 4])
    }

    fn req(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest {
            model_name: "simple".into(),
            inputs,
            ..Default::default()
        }
    }

    fn err(r: InferRequest) -> String {
        validate_request(&simple(), &r).unwrap_err().message
    }

    #[test]
    fn accepts_valid() {
        let r = req(vec![
            int_input("INPUT0", vec![3, 16]),
            int_input("INPUT1", vec![3, 16]),
        ]);
        assert_eq!(validate_request(&simple(), &r).unwrap(), 3);
        let mut r = r;
        r.inputs.push(Tensor::new(
            "OPT",
            DataType::Bytes,
            vec![3, 2],
            bytes_tensor::encode(["a"; 6]),
        ));
        assert_eq!(validate_request(&simple(), &r).unwrap(), 3);
    }

    #[test]
    fn rejects_bad_requests() {
        let ok1 = || int_input("INPUT1", vec![1, 16]);
        assert!(err(req(vec![int_input("INPUT0", vec![1, 15]), ok1()]))
            .contains("Expected [-1,16], got [1,15]"));
        assert!(err(req(vec![int_input("INPUT0", vec![16]), ok1()])).contains("unexpected shape"));
        assert!(err(req(vec![
            int_input("INPUT0", vec![9, 16]),
            int_input("INPUT1", vec![9, 16])
        ]))
        .contains("batch-size must be <= 8"));
        assert!(err(req(vec![int_input("INPUT0", vec![2, 16]), ok1()]))
            .contains("batch size 1 but other inputs have batch size 2"));
        assert!(err(req(vec![ok1()])).contains("missing required input(s) ['INPUT0']"));
        assert!(err(req(vec![
            int_input("INPUT0", vec![1, 16]),
            ok1(),
            int_input("X", vec![1])
        ]))
        .contains("unexpected inference input 'X'"));
        assert_eq!(
            err(req(vec![ok1(), ok1()])),
            "[request id: <id_unknown>] input 'INPUT1' already exists in request"
        );
        let wrong_type = Tensor::new("INPUT0", DataType::Fp32, vec![1, 16], vec![0u8; 64]);
        assert!(err(req(vec![wrong_type, ok1()])).contains(
            "unexpected datatype TYPE_FP32 for inference input 'INPUT0', expecting TYPE_INT32"
        ));
        let short = Tensor::new("INPUT0", DataType::Int32, vec![1, 16], vec![0u8; 60]);
        let mut r = req(vec![short, ok1()]);
        assert_eq!(
            err(r.clone()),
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"
        );
        r.id = "r1".into();
        assert!(err(r).starts_with("[request id: r1] input byte size mismatch"));
        let strings = Tensor::new(
            "OPT",
            DataType::Bytes,
            vec![1, 2],
            bytes_tensor::encode(["a"]),
        );
        let r = req(vec![int_input("INPUT0", vec![1, 16]), ok1(), strings]);
        assert!(err(r).contains("expected 2 string elements for input 'OPT'"));
        let mut r = req(vec![int_input("INPUT0", vec![1, 16]), ok1()]);
        r.outputs.push(RequestedOutput {
            name: "NOPE".into(),
            ..Default::default()
        });
        assert!(err(r).contains("unexpected inference output 'NOPE'"));
        let mut r = req(vec![int_input("INPUT0", vec![1, 16]), ok1()]);
        r.outputs.push(RequestedOutput {
            name: "S".into(),
            classification: Some(2),
            ..Default::default()
        });
        assert!(err(r).contains("not numeric"));
    }

    #[test]
    fn requested_outputs_are_unique_and_classify_at_least_one_class() {
        let out = |name: &str, classification: Option<usize>| RequestedOutput {
            name: name.into(),
            classification,
            ..Default::default()
        };
        let with_outputs = |outputs: Vec<RequestedOutput>| InferRequest {
            outputs,
            ..req(vec![
                int_input("INPUT0", vec![2, 16]),
                int_input("INPUT1", vec![2, 16]),
            ])
        };
        let r = with_outputs(vec![out("OUTPUT0", Some(3)), out("S", None)]);
        assert_eq!(validate_request(&simple(), &r).unwrap(), 2);
        assert_eq!(
            err(with_outputs(vec![out("S", None), out("S", None)])),
            "[request id: <id_unknown>] output 'S' already exists in request"
        );
        let mut r = with_outputs(vec![out("S", None), out("OUTPUT0", None), out("S", None)]);
        r.id = "7".into();
        assert_eq!(
            err(r),
            "[request id: 7] output 'S' already exists in request"
        );
        assert_eq!(
            err(with_outputs(vec![out("OUTPUT0", Some(0))])),
            "classification count for output 'OUTPUT0' must be >= 1"
        );
    }
}
