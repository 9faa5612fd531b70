//! The HTTP/REST frontend: KServe v2 with Triton's extensions (binary tensor
//! data, classification, model configuration, repository index, generate and
//! generate_stream), request and response compression, and Triton's error
//! body `{"error": "..."}`.

mod body;
pub mod codec;
pub mod compression;
pub mod generate;
mod nonfinite;
mod service;
mod shm;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::common::{self, parse_version, ServerInfo, EXTENSIONS};
use super::restrict::{http_category, Restrictions};
use crate::scheduler::stats::{CountNs, Snapshot};
use body::read_body;
use tern_core::error::{Code, Error, Result};
use tern_core::request::ControlValue;

pub use service::HttpService;

/// Shared state of the HTTP frontend.
pub struct HttpState {
    /// Server-wide state shared with the other frontends.
    pub info: Arc<ServerInfo>,
    /// `--http-max-input-size`.
    pub max_input_size: usize,
    /// `--http-read-timeout-secs`: longest wait for the next piece of a body.
    pub read_timeout: Option<std::time::Duration>,
    /// `--http-restricted-api`.
    pub restrictions: Restrictions,
    /// `--http-header-forward-pattern`.
    pub header_forward: Option<common::HeaderForward>,
}

type AppState = State<Arc<HttpState>>;

/// The HTTP status for an error: Triton's mapping (`HttpCodeFromError`), in
/// this one place. ALREADY_EXISTS has no HTTP counterpart there: 400.
pub fn status_code(e: &Error) -> StatusCode {
    match e.code {
        Code::InvalidArg | Code::AlreadyExists => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unsupported => StatusCode::NOT_IMPLEMENTED,
        Code::Cancelled => StatusCode::from_u16(499).expect("499 is a valid status"),
        Code::Internal | Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The error response: Triton's status mapping and `{"error": message}` body.
pub fn error_response(e: &Error) -> Response {
    let status = status_code(e);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({ "error": e.message }).to_string(),
    )
        .into_response()
}

fn json_response(v: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn respond(r: Result<Response>) -> Response {
    r.unwrap_or_else(|e| error_response(&e))
}

/// Builds the router; the `--http-restricted-api` check is layered on only
/// when restrictions are set (the layer costs an allocation per request).
/// [`HttpService`] serves it, taking inference requests past it.
fn router(state: Arc<HttpState>) -> Router {
    let router = Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(server_live))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(model_ready),
        )
        .route("/v2/models/{model}/config", get(model_config))
        .route(
            "/v2/models/{model}/versions/{version}/config",
            get(model_config),
        )
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer))
        .route("/v2/models/{model}/generate", post(generate))
        .route(
            "/v2/models/{model}/versions/{version}/generate",
            post(generate),
        )
        .route("/v2/models/{model}/generate_stream", post(generate_stream))
        .route(
            "/v2/models/{model}/versions/{version}/generate_stream",
            post(generate_stream),
        )
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{model}/load", post(load_model))
        .route("/v2/repository/models/{model}/unload", post(unload_model))
        // Triton's named-repository routes: the index ignores the name; a load
        // or unload that names a repository is refused, as tritonserver does.
        .route("/v2/repository/{repository}/index", post(repository_index))
        .route(
            "/v2/repository/{repository}/models/{model}/load",
            post(named_repository),
        )
        .route(
            "/v2/repository/{repository}/models/{model}/unload",
            post(named_repository),
        )
        .route("/v2/models/stats", get(all_stats))
        .route("/v2/models/{model}/stats", get(model_stats))
        .route(
            "/v2/models/{model}/versions/{version}/stats",
            get(model_stats),
        )
        .route("/v2/logging", get(get_logging).post(set_logging))
        .route("/v2/trace/setting", get(get_trace).post(set_trace))
        .route(
            "/v2/models/{model}/trace/setting",
            get(get_model_trace).post(set_model_trace),
        )
        .merge(shm::routes())
        .fallback(|| async { error_response(&Error::not_found("no such endpoint")) })
        .method_not_allowed_fallback(|| async {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                [(header::CONTENT_TYPE, "application/json")],
                json!({"error": "method not allowed for this endpoint"}).to_string(),
            )
        });
    let router = if state.restrictions.is_empty() {
        router
    } else {
        router.layer(axum::middleware::from_fn_with_state(
            state.clone(),
            restrict,
        ))
    };
    router.with_state(state)
}

/// The `--http-restricted-api` check, before any handler runs.
async fn restrict(
    State(s): AppState,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(category) = http_category(req.uri().path()) {
        let headers = req.headers();
        if let Err(key) = s
            .restrictions
            .check(category, |k| headers.get(k).and_then(|v| v.to_str().ok()))
        {
            let body = json!({ "error": tern_core::messages::api_restricted(key) });
            return (
                StatusCode::FORBIDDEN,
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// The `{model}` and, on `/versions/{version}` routes, the version of a
/// model route: one handler serves both forms. An empty version is the
/// policy's choice; one that is not a positive integer is refused.
struct ModelAt {
    model: String,
    version: Option<i64>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ModelAt {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> std::result::Result<Self, Response> {
        #[derive(serde::Deserialize)]
        struct Segments {
            model: String,
            version: Option<String>,
        }
        let Path(at) = Path::<Segments>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let version = match at.version.as_deref().map(parse_version).transpose() {
            Ok(v) => v.flatten(),
            Err(e) => return Err(error_response(&e)),
        };
        Ok(ModelAt {
            model: at.model,
            version,
        })
    }
}

async fn server_metadata(State(s): AppState) -> Response {
    json_response(
        json!({ "name": s.info.server_id, "version": env!("CARGO_PKG_VERSION"), "extensions": EXTENSIONS }),
    )
}

async fn server_live(State(s): AppState) -> StatusCode {
    if s.info.live() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

async fn server_ready(State(s): AppState) -> StatusCode {
    if s.info.ready() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

fn metadata(s: &HttpState, model: &str, version: Option<i64>) -> Result<Response> {
    let m = common::model_metadata(&s.info.repository, model, version)?;
    let io = |t: &super::common::TensorMeta| json!({ "name": t.name, "datatype": t.datatype, "shape": t.shape });
    Ok(json_response(json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": m.inputs.iter().map(io).collect::<Vec<_>>(),
        "outputs": m.outputs.iter().map(io).collect::<Vec<_>>(),
    })))
}

async fn model_metadata(State(s): AppState, at: ModelAt) -> Response {
    respond(metadata(&s, &at.model, at.version))
}

fn ready(s: &HttpState, model: &str, version: Option<i64>) -> Response {
    match s.info.repository.get(model, version) {
        Ok(_) => StatusCode::OK.into_response(),
        Err(_) => StatusCode::BAD_REQUEST.into_response(),
    }
}

async fn model_ready(State(s): AppState, at: ModelAt) -> Response {
    ready(&s, &at.model, at.version)
}

fn config(s: &HttpState, model: &str, version: Option<i64>) -> Result<Response> {
    let cfg = s.info.repository.config(model, version)?;
    Ok(json_response(tern_core::config::json::to_json(&cfg)))
}

async fn model_config(State(s): AppState, at: ModelAt) -> Response {
    respond(config(&s, &at.model, at.version))
}

async fn repository_index(State(s): AppState, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            let body = read_body(&s, &headers, body).await?;
            let ready_only = if body.iter().all(u8::is_ascii_whitespace) {
                false
            } else {
                let v: Value = serde_json::from_slice(&body).map_err(|e| {
                    Error::invalid_arg(format!("failed to parse the repository index request: {e}"))
                })?;
                match v.get("ready") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        return Err(Error::invalid_arg(
                            "repository index 'ready' must be a bool",
                        ))
                    }
                }
            };
            let rows: Vec<Value> = s
                .info
                .repository
                .index_with_unloaded()
                .into_iter()
                .filter(|e| !ready_only || e.state == crate::repository::State::Ready)
                .map(|e| {
                    let mut row =
                        json!({ "name": e.name, "state": e.state.as_str(), "reason": e.reason });
                    if let Some(v) = e.version {
                        row["version"] = Value::String(v.to_string());
                    }
                    row
                })
                .collect();
            Ok(json_response(Value::Array(rows)))
        }
        .await,
    )
}

/// The `parameters` object of a repository request body (empty body = no
/// parameters), in protocol-neutral form; `file:` values are base64.
async fn repository_parameters(
    s: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<(String, ControlValue)>> {
    use base64::Engine as _;
    let body = read_body(s, headers, body).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid_arg(format!("failed to parse the repository request: {e}")))?;
    let params = match v.get("parameters") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(Error::invalid_arg(
                "repository request 'parameters' must be an object",
            ))
        }
    };
    Ok(params
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Value::String(t) if k.starts_with("file:") => {
                    base64::engine::general_purpose::STANDARD
                        .decode(t)
                        .map_or(ControlValue::Other, ControlValue::Bytes)
                }
                v => control_value(v),
            };
            (k.clone(), value)
        })
        .collect())
}

async fn named_repository() -> Response {
    error_response(&common::repository_name_unsupported())
}

async fn load_model(
    State(s): AppState,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(
        async {
            let params = repository_parameters(&s, &headers, body).await?;
            let overrides = crate::repository::control::LoadOverride::from_parameters(params)?;
            common::load_model(&s.info, model, overrides).await?;
            Ok(StatusCode::OK.into_response())
        }
        .await,
    )
}

async fn unload_model(
    State(s): AppState,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(
        async {
            let params = repository_parameters(&s, &headers, body).await?;
            let dependents = crate::repository::control::unload_dependents(params)?;
            common::unload_model(&s.info, model, dependents).await?;
            Ok(StatusCode::OK.into_response())
        }
        .await,
    )
}

fn stats(s: &HttpState, model: Option<&str>, version: Option<i64>) -> Result<Response> {
    let rows: Vec<Value> = s
        .info
        .repository
        .handles(model, version)?
        .iter()
        .map(|h| stats_json(&h.stats(), &h.config.name, h.version))
        .collect();
    Ok(json_response(json!({ "model_stats": rows })))
}

async fn all_stats(State(s): AppState) -> Response {
    respond(stats(&s, None, None))
}

async fn model_stats(State(s): AppState, at: ModelAt) -> Response {
    respond(stats(&s, Some(&at.model), at.version))
}

async fn get_logging() -> Response {
    json_response(logging_json(&crate::logging::settings()))
}

async fn set_logging(State(s): AppState, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            let body = read_body(&s, &headers, body).await?;
            let v: Value = serde_json::from_slice(&body).map_err(|e| {
                Error::invalid_arg(format!("failed to parse the logging request: {e}"))
            })?;
            let obj = v
                .as_object()
                .ok_or_else(|| Error::invalid_arg("logging settings must be a JSON object"))?;
            // As Triton: a setting given as null is left as it is.
            let changes: Vec<_> = obj
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), control_value(v)))
                .collect();
            let updated = crate::logging::update(&changes)?;
            Ok(json_response(logging_json(&updated)))
        }
        .await,
    )
}

async fn get_trace(State(s): AppState) -> Response {
    respond(common::trace_setting(&s.info, None, None).map(trace_json))
}

async fn get_model_trace(State(s): AppState, Path(model): Path<String>) -> Response {
    respond(common::trace_setting(&s.info, Some(&model), None).map(trace_json))
}

async fn set_trace(State(s): AppState, headers: HeaderMap, body: Body) -> Response {
    respond(update_trace(&s, None, &headers, body).await)
}

async fn set_model_trace(
    State(s): AppState,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(update_trace(&s, Some(&model), &headers, body).await)
}

/// A trace setting update: a JSON object whose `trace_level` is a list of
/// strings and whose other values are strings, `null` clearing a value
/// (Triton's texts for the wrong types).
async fn update_trace(
    s: &HttpState,
    model: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    common::trace_model_known(&s.info, model)?;
    let body = read_body(s, headers, body).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::internal(format!("failed to parse the request JSON buffer: {e}")))?;
    let mut entries = Vec::new();
    for (key, value) in v.as_object().into_iter().flatten() {
        let values = match (key.as_str(), value) {
            (_, Value::Null) => None,
            ("trace_level", Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|i| i.as_str().map(str::to_string).ok_or_else(non_string))
                    .collect::<Result<Vec<_>>>()?,
            ),
            ("trace_level", _) => {
                return Err(Error::internal("attempt to access JSON non-array as array"))
            }
            ("trace_file" | "trace_rate" | "trace_count" | "log_frequency", Value::String(v)) => {
                Some(vec![v.clone()])
            }
            ("trace_file" | "trace_rate" | "trace_count" | "log_frequency", _) => {
                return Err(non_string())
            }
            _ => continue,
        };
        entries.push((key.as_str(), values));
    }
    let update = crate::trace::Update::parse(entries, "")?;
    common::trace_setting(&s.info, model, Some(&update)).map(trace_json)
}

fn non_string() -> Error {
    Error::internal("attempt to access JSON non-string as string")
}

/// A trace setting as Triton's JSON: keys in order (the OpenTelemetry
/// `resource` key may repeat), `trace_level` a list, every other value a string.
fn trace_json(setting: Vec<(String, Vec<String>)>) -> Response {
    let fields: Vec<String> = setting
        .into_iter()
        .map(|(key, values)| {
            let value = if key == "trace_level" {
                json!(values)
            } else {
                json!(values.into_iter().next().unwrap_or_default())
            };
            format!("{}:{value}", json!(key))
        })
        .collect();
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{{{}}}", fields.join(",")),
    )
        .into_response()
}

/// Triton's JSON for one model version in `model_stats`.
fn stats_json(s: &Snapshot, name: &str, version: i64) -> Value {
    let c = |c: &CountNs| json!({ "count": c.count, "ns": c.ns });
    json!({
        "name": name,
        "version": version.to_string(),
        "last_inference": s.last_inference,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": c(&s.success),
            "fail": c(&s.fail),
            "queue": c(&s.queue),
            "compute_input": c(&s.compute_input),
            "compute_infer": c(&s.compute_infer),
            "compute_output": c(&s.compute_output),
            "cache_hit": c(&s.cache_hit),
            "cache_miss": c(&s.cache_miss),
        },
        "batch_stats": s.batches.iter().map(|(size, [i, n, o])| json!({
            "batch_size": size,
            "compute_input": c(i),
            "compute_infer": c(n),
            "compute_output": c(o),
        })).collect::<Vec<_>>(),
        "memory_usage": [],
    })
}

/// Triton's JSON for `GET /v2/logging`.
fn logging_json(s: &crate::logging::Settings) -> Value {
    json!({
        "log_file": s.log_file,
        "log_info": s.log_info,
        "log_warning": s.log_warning,
        "log_error": s.log_error,
        "log_verbose_level": s.log_verbose_level,
        "log_format": s.log_format,
    })
}

/// A JSON value in protocol-neutral form.
fn control_value(v: &Value) -> ControlValue {
    use ControlValue as V;
    match v {
        Value::Bool(b) => V::Bool(*b),
        Value::String(s) => V::String(s.clone()),
        Value::Number(n) => n.as_u64().map_or(V::Other, V::Uint),
        _ => V::Other,
    }
}

const HEADER_LEN: &str = "inference-header-content-length";

// The request is taken whole (not as a `HeaderMap` extractor, which clones
// every header) because this is the hot path.
async fn infer(State(s): AppState, at: ModelAt, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    respond(run_infer(&s, &at.model, at.version, parts, body).await)
}

/// Answers an inference request for `model` at `version` as the URL spells it
/// (none: the policy's choice), for [`HttpService`]'s fast path.
async fn answer_infer(
    s: &HttpState,
    model: &str,
    version: Option<&str>,
    req: axum::extract::Request,
) -> Response {
    let (parts, body) = req.into_parts();
    respond(match version.map(parse_version).transpose() {
        Ok(v) => run_infer(s, model, v.flatten(), parts, body).await,
        Err(e) => Err(e),
    })
}

async fn generate(State(s): AppState, at: ModelAt, h: HeaderMap, b: Body) -> Response {
    respond(generate::generate(&s, &at.model, at.version, &h, b).await)
}

async fn generate_stream(State(s): AppState, at: ModelAt, h: HeaderMap, b: Body) -> Response {
    respond(generate::generate_stream(&s, &at.model, at.version, &h, b).await)
}

/// The `Inference-Header-Content-Length` of a request, with Triton's texts
/// for one that is not a number or is negative.
fn header_length(headers: &HeaderMap) -> Result<Option<usize>> {
    Ok(match headers.get(HEADER_LEN) {
        None => None,
        Some(v) => {
            let text = String::from_utf8_lossy(v.as_bytes());
            match text.trim().parse::<i64>() {
                Err(_) => return Err(tern_core::messages::header_length_unparsable(&text)),
                Ok(n) if n < 0 => {
                    let body_len = headers
                        .get(header::CONTENT_LENGTH)
                        .and_then(|l| l.to_str().ok()?.parse().ok())
                        .unwrap_or(0);
                    return Err(tern_core::messages::header_length_out_of_range(
                        body_len, &text,
                    ));
                }
                Ok(n) => Some(n as usize),
            }
        }
    })
}

async fn run_infer(
    s: &HttpState,
    model: &str,
    version: Option<i64>,
    parts: axum::http::request::Parts,
    body: Body,
) -> Result<Response> {
    let headers = &parts.headers;
    let trace = s
        .info
        .infer
        .tracer()
        .sample(model, common::traceparent(headers));
    if let Some(t) = &trace {
        t.timestamp("HTTP_RECV_START");
    }
    let forwarded = s.header_forward.as_ref().map(|f| f.matching(headers));
    let header_len = header_length(headers)?;
    let body_headers = body::BodyHeaders::of(headers);
    let coding = compression::accepted_coding(
        headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    // The headers and the URI share hyper's read buffer: dropped before the body is read, so
    // that hyper can read the body into the same buffer instead of a new one.
    drop(parts);
    let body = body::read(s, body_headers, body, header_len.unwrap_or(0)).await?;
    if let Some(t) = &trace {
        t.timestamp("HTTP_RECV_END");
    }
    // The version is resolved before the body is decoded (an unknown model is
    // reported as such, and a raw body is read by its config), and the
    // request runs on that same version.
    let infer = &s.info.infer;
    let target = infer
        .resolve(model, version, || {
            common::timeout_parameter(&body[..header_len.unwrap_or(body.len()).min(body.len())])
        })
        .await?;
    if target.model().decoupled() {
        return Err(tern_core::messages::http_infer_decoupled());
    }
    let (mut request, opts) = codec::decode_request(
        model,
        version,
        body,
        header_len,
        &target.model().config,
        &s.info.shm,
    )?;
    request.trace = trace.clone();
    if let Some(headers) = forwarded {
        common::forward_headers(&mut request, headers);
    }
    let answer = infer.infer(&target, request).await?;
    if let Some(t) = &trace {
        t.timestamp("INFER_RESPONSE_COMPLETE");
        t.timestamp("HTTP_SEND_START");
    }
    let encoded = codec::encode_response(&answer.response, &answer.requested, &opts);
    let json_len = encoded.json_len;
    let (body, encoding) = match coding {
        Some(c) => (
            Body::from(compression::compress(c, &encoded.parts)),
            Some(c),
        ),
        None => (Body::new(encoded.into_body()), None),
    };
    let body = match trace {
        Some(t) => Body::new(body::Traced::new(body, t, "HTTP_SEND_END")),
        None => body,
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    match json_len {
        Some(n) => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(HEADER_LEN, HeaderValue::from(n));
        }
        None => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    if let Some(c) = encoding {
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(c.as_str()),
        );
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_render_as_triton() {
        let mut s = Snapshot::default();
        s.batches.insert(1, Default::default());
        s.batches.insert(
            3,
            [
                CountNs::default(),
                CountNs { count: 1, ns: 100 },
                CountNs::default(),
            ],
        );
        let j = stats_json(&s, "m", 1);
        assert_eq!(j["version"], "1");
        assert_eq!(j["batch_stats"][0]["batch_size"], 1);
        assert_eq!(j["batch_stats"][1]["compute_infer"]["count"], 1);
        assert_eq!(j["inference_stats"]["cache_hit"]["ns"], 0);
    }

    #[test]
    fn status_mapping_follows_triton() {
        let s = |e: Error| status_code(&e).as_u16();
        assert_eq!(s(Error::invalid_arg("x")), 400);
        assert_eq!(s(Error::not_found("x")), 404);
        assert_eq!(s(Error::unavailable("x")), 503);
        assert_eq!(s(Error::unsupported("x")), 501);
        assert_eq!(s(Error::already_exists("x")), 400);
        assert_eq!(s(Error::internal("x")), 500);
    }
}
