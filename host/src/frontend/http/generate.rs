//! Triton's generate extension: `POST /v2/models/<m>[/versions/<v>]/generate`
//! and `generate_stream`. A flat JSON object becomes a request — keys naming
//! model inputs become tensors (a scalar or a 1-D array, shaped by the
//! input's metadata shape), other keys become request parameters, `id` is
//! the request id, `parameters` is a nested object read the same way — and
//! each response becomes a flat JSON object: `id`, `model_name`,
//! `model_version` (a string), the response parameters and every output (one
//! element as a scalar, more as a flat array). `generate` answers with the
//! model's one response; `generate_stream` sends every response as a
//! server-sent event (`data: {...}\n\n`), errors in-band as
//! `data: {"error": "..."}`, and ends after the final flag. A client that
//! disconnects cancels the request.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use serde_json::{Map, Value};

use super::{body, codec, HttpState};
use crate::infer::Answers;
use std::sync::Arc;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::trace::Trace;
use tern_core::StreamItem;
use tern_core::{DataType, InferRequest, InferResponse, Parameter, Tensor};

/// What generate (not streaming) says when a model does not give exactly one response.
const NOT_ONE: &str = "generate expects model to produce exactly 1 response, use generate stream for model that generates various number of responses";

/// The shape an input gets from `count` elements: the metadata shape (batch
/// dimension first when the model batches), the innermost variable dim taking
/// what the fixed dims leave, other variable dims 1.
fn shape_for(name: &str, meta: &[i64], count: usize) -> Result<Vec<i64>> {
    let fixed: i64 = meta.iter().filter(|&&d| d >= 0).product();
    let bad = || tern_core::messages::generate_cannot_convert(name);
    let count = count as i64;
    if fixed == 0 || count % fixed != 0 {
        return Err(bad());
    }
    let innermost = meta.iter().rposition(|&d| d < 0);
    let shape: Vec<i64> = meta
        .iter()
        .enumerate()
        .map(|(i, &d)| match d {
            d if d >= 0 => d,
            _ if Some(i) == innermost => count / fixed,
            _ => 1,
        })
        .collect();
    if innermost.is_none() && fixed != count {
        return Err(bad());
    }
    Ok(shape)
}

fn parameter(key: &str, v: &Value) -> Result<Parameter> {
    match v {
        Value::Bool(b) => Ok(Parameter::Bool(*b)),
        Value::String(s) => Ok(Parameter::String(s.clone())),
        Value::Number(n) => Ok(n
            .as_i64()
            .map(Parameter::Int)
            .unwrap_or_else(|| Parameter::Double(n.as_f64().unwrap_or(f64::NAN)))),
        _ => Err(tern_core::messages::generate_parameter_type(key)),
    }
}

/// Reads one key of the request object (top level or inside `parameters`).
fn take(cfg: &ModelConfig, request: &mut InferRequest, key: &str, v: &Value) -> Result<()> {
    let Some(input) = cfg.input.iter().find(|i| i.name == key) else {
        request
            .parameters
            .insert(key.to_string(), parameter(key, v)?);
        return Ok(());
    };
    if request.input(key).is_some() {
        return Err(Error::invalid_arg(format!(
            "input '{key}' already exists in request"
        )));
    }
    let dtype = DataType::from_config(input.data_type)?;
    let (data, count) = match v {
        Value::Array(items) if items.iter().any(|i| i.is_array() || i.is_object()) => {
            return Err(Error::invalid_arg(format!(
                "The schema can not convert input '{key}' to tensor with proper shape"
            )))
        }
        Value::Array(_) => codec::json_to_bytes(key, dtype, v, false)?,
        scalar => codec::json_to_bytes(key, dtype, &Value::Array(vec![scalar.clone()]), false)?,
    };
    let meta: Vec<i64> = if cfg.max_batch_size > 0 {
        std::iter::once(-1)
            .chain(input.dims.iter().copied())
            .collect()
    } else {
        input.dims.clone()
    };
    let shape = shape_for(key, &meta, count)?;
    request.inputs.push(Tensor::new(key, dtype, shape, data));
    Ok(())
}

/// The inference request a generate body describes (public for the fuzz
/// targets, `fuzz/`).
pub fn decode(
    model: &str,
    version: Option<i64>,
    cfg: &ModelConfig,
    body: &[u8],
) -> Result<InferRequest> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid_arg(format!("failed to parse the request JSON buffer: {e}")))?;
    let Value::Object(fields) = v else {
        return Err(Error::invalid_arg(
            "the generate request must be a JSON object",
        ));
    };
    let mut request = InferRequest {
        model_name: model.to_string(),
        model_version: version,
        ..Default::default()
    };
    if cfg.input.iter().any(|i| i.name == "parameters") && fields.contains_key("parameters") {
        return Err(Error::invalid_arg(
            "Keyword 'parameters' for nested schema also given as input tensor name",
        ));
    }
    for (key, v) in &fields {
        match key.as_str() {
            "parameters" => {
                let Value::Object(nested) = v else {
                    return Err(Error::invalid_arg(
                        "Expected JSON object for keyword: 'parameters'",
                    ));
                };
                for (k, v) in nested {
                    take(cfg, &mut request, k, v).map_err(|e| {
                        Error::new(
                            e.code,
                            format!("Converting keyword: 'parameters': {}", e.message),
                        )
                    })?;
                }
            }
            "id" => {
                let id = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                request.id = id.clone();
                request
                    .parameters
                    .insert("id".into(), Parameter::String(id));
            }
            _ => take(cfg, &mut request, key, v)?,
        }
    }
    Ok(request)
}

/// An output as generate writes it: one element as a scalar, more as a flat array.
fn output_json(t: &Tensor) -> Value {
    let mut out = Vec::new();
    let values = match codec::data_to_json(t, &mut out) {
        Some(()) => serde_json::from_slice(&out).unwrap_or(Value::Null),
        None => match t.dtype {
            DataType::Fp16 | DataType::Bf16 => Value::Array(
                t.data
                    .chunks_exact(2)
                    .map(|c| {
                        let bits = u16::from_le_bytes([c[0], c[1]]);
                        let f = if t.dtype == DataType::Fp16 {
                            half::f16::from_bits(bits).to_f32()
                        } else {
                            half::bf16::from_bits(bits).to_f32()
                        };
                        Value::from(f as f64)
                    })
                    .collect(),
            ),
            // Strings that are not UTF-8, lossily.
            _ => Value::Array(
                tern_core::bytes_tensor::decode(&t.data)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|b| Value::String(String::from_utf8_lossy(b).into_owned()))
                    .collect(),
            ),
        },
    };
    match values {
        Value::Array(mut items) if items.len() == 1 => items.pop().unwrap_or(Value::Null),
        other => other,
    }
}

/// A response as generate writes it (keys sorted; the first of equal keys
/// wins; public for the fuzz targets).
pub fn response_json(r: &InferResponse) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.entry(k.to_string()).or_insert(v);
    };
    if !r.id.is_empty() {
        put("id", Value::String(r.id.clone()));
    }
    put("model_name", Value::String(r.model_name.clone()));
    put("model_version", Value::String(r.model_version.to_string()));
    for (k, p) in &r.parameters {
        put(k, codec::parameter_json(p));
    }
    for t in &r.outputs {
        put(&t.name, output_json(t));
    }
    Value::Object(m)
}

fn error_json(e: &Error) -> Value {
    serde_json::json!({ "error": e.message })
}

/// Runs a generate request: the model's responses as a stream (one item,
/// with the final flag, for a model that is not decoupled).
async fn run(
    s: &HttpState,
    model: &str,
    version: Option<i64>,
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<(Answers, Option<Arc<Trace>>)> {
    let infer = &s.info.infer;
    let trace = infer
        .tracer()
        .sample(model, crate::frontend::common::traceparent(headers));
    if let Some(t) = &trace {
        t.timestamp("HTTP_RECV_START");
    }
    let body = body::read_body(s, headers, body).await?;
    if let Some(t) = &trace {
        t.timestamp("HTTP_RECV_END");
    }
    let target = infer
        .resolve(model, version, || {
            crate::frontend::common::timeout_parameter(&body)
        })
        .await?;
    let mut request = decode(model, version, &target.model().config, &body)?;
    request.trace = trace.clone();
    Ok((infer.stream(&target, request)?, trace))
}

/// `POST .../generate`.
pub async fn generate(
    s: &HttpState,
    model: &str,
    version: Option<i64>,
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<Response> {
    let (mut responses, trace) = run(s, model, version, headers, body).await?;
    let mut got = Vec::new();
    while let Some(StreamItem { response, last }) = responses.next().await {
        if let Some(r) = response {
            got.push(r?);
        }
        if last {
            break;
        }
    }
    if got.len() != 1 {
        return Err(Error::invalid_arg(NOT_ONE));
    }
    let response = got.pop().expect("one response");
    let Some(trace) = trace else {
        return Ok(super::json_response(response_json(&response)));
    };
    trace.timestamp("INFER_RESPONSE_COMPLETE");
    trace.timestamp("HTTP_SEND_START");
    let (parts, body) = super::json_response(response_json(&response)).into_parts();
    let body = Body::new(body::Traced::new(body, trace, "HTTP_SEND_END"));
    Ok(Response::from_parts(parts, body))
}

fn event(v: &Value) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {v}\n\n"))
}

/// `POST .../generate_stream`: server-sent events.
pub async fn generate_stream(
    s: &HttpState,
    model: &str,
    version: Option<i64>,
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<Response> {
    let (responses, _trace) = run(s, model, version, headers, body).await?;
    let events = futures_stream(responses);
    let mut resp = Response::new(Body::from_stream(events));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    Ok(resp)
}

/// The events of a stream, ending after the final flag. Dropping it (the
/// client went away) drops the response stream, which cancels the request.
fn futures_stream(
    mut responses: Answers,
) -> impl tokio_stream::Stream<Item = std::result::Result<bytes::Bytes, std::convert::Infallible>> + Send
{
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                item = responses.next() => item,
                _ = tx.closed() => return,
            };
            let Some(StreamItem { response, last }) = item else {
                return;
            };
            let v = match response {
                Some(Ok(r)) => Some(response_json(&r)),
                Some(Err(e)) => Some(error_json(&e)),
                None => None,
            };
            if let Some(v) = v {
                if tx.send(event(&v)).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_the_metadata_shape() {
        assert_eq!(shape_for("x", &[-1, -1], 5).unwrap(), vec![1, 5]);
        assert_eq!(shape_for("x", &[-1, 2, -1], 6).unwrap(), vec![1, 2, 3]);
        assert_eq!(shape_for("x", &[1], 1).unwrap(), vec![1]);
        assert_eq!(
            shape_for("x", &[3], 2).unwrap_err().message,
            "The schema can not convert input 'x' to tensor with proper shape"
        );
        assert!(shape_for("x", &[-1, 4], 6).is_err());
    }

    #[test]
    fn bodies_map_to_inputs_and_parameters() {
        let cfg = tern_core::config::parse_pbtxt(
            r#"name: "m" max_batch_size: 0
               input [{name: "text_input" data_type: TYPE_STRING dims: [1]},
                      {name: "ids" data_type: TYPE_INT64 dims: [1, -1]}]"#,
        )
        .unwrap();
        let r = decode(
            "m",
            None,
            &cfg,
            br#"{"text_input": "hi", "ids": [1, 2, 3], "stream": true, "parameters": {"max_tokens": 4}, "id": "a"}"#,
        )
        .unwrap();
        assert_eq!(r.input("ids").unwrap().shape, vec![1, 3]);
        assert_eq!(r.input("text_input").unwrap().shape, vec![1]);
        assert_eq!(r.parameters["stream"], Parameter::Bool(true));
        assert_eq!(r.parameters["max_tokens"], Parameter::Int(4));
        assert_eq!(r.id, "a");
        let e = decode("m", None, &cfg, br#"{"text_input": "hi", "x": [1]}"#).unwrap_err();
        assert_eq!(
            e.message,
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."
        );
    }

    #[test]
    fn responses_are_flat_with_scalars_for_single_elements() {
        let r = InferResponse {
            model_name: "m".into(),
            model_version: 1,
            outputs: vec![
                Tensor::new(
                    "one",
                    DataType::Int64,
                    vec![1, 1],
                    7i64.to_le_bytes().to_vec(),
                ),
                Tensor::new("text", DataType::Bytes, vec![1], b"\x02\0\0\0hi".to_vec()),
            ],
            ..Default::default()
        };
        assert_eq!(
            response_json(&r),
            serde_json::json!({"model_name": "m", "model_version": "1", "one": 7, "text": "hi"})
        );
    }
}
