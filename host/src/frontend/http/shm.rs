//! HTTP routes of the shared-memory extensions (`/v2/systemsharedmemory/...`,
//! `/v2/cudasharedmemory/...`); the registries live in `tern_memory::shm`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{json_response, read_body, respond, AppState, HttpState};
use tern_core::error::{Error, Result};
use tern_memory::shm::{Kind, RegionStatus};

/// The shared-memory routes.
pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/v2/systemsharedmemory/status", get(system_status_all))
        .route(
            "/v2/systemsharedmemory/region/{name}/status",
            get(system_status),
        )
        .route(
            "/v2/systemsharedmemory/region/{name}/register",
            post(system_register),
        )
        .route(
            "/v2/systemsharedmemory/region/{name}/unregister",
            post(system_unregister),
        )
        .route(
            "/v2/systemsharedmemory/unregister",
            post(system_unregister_all),
        )
        .route("/v2/cudasharedmemory/status", get(cuda_status_all))
        .route(
            "/v2/cudasharedmemory/region/{name}/status",
            get(cuda_status),
        )
        .route(
            "/v2/cudasharedmemory/region/{name}/register",
            post(cuda_register),
        )
        .route(
            "/v2/cudasharedmemory/region/{name}/unregister",
            post(cuda_unregister),
        )
        .route("/v2/cudasharedmemory/unregister", post(cuda_unregister_all))
}

fn render(kind: Kind, regions: Vec<RegionStatus>) -> Response {
    let list: Vec<Value> = regions
        .into_iter()
        .map(|r| match kind {
            Kind::System => json!({
                "name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size
            }),
            Kind::Cuda => {
                json!({"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size})
            }
        })
        .collect();
    json_response(Value::Array(list))
}

fn status(s: &HttpState, kind: Kind, name: Option<&str>) -> Response {
    respond(s.info.shm.status(kind, name).map(|r| render(kind, r)))
}

async fn system_status_all(State(s): AppState) -> Response {
    status(&s, Kind::System, None)
}
async fn system_status(State(s): AppState, Path(name): Path<String>) -> Response {
    status(&s, Kind::System, Some(&name))
}
async fn cuda_status_all(State(s): AppState) -> Response {
    status(&s, Kind::Cuda, None)
}
async fn cuda_status(State(s): AppState, Path(name): Path<String>) -> Response {
    status(&s, Kind::Cuda, Some(&name))
}

fn unregister(s: &HttpState, kind: Kind, name: Option<&str>) -> Response {
    respond(
        s.info
            .shm
            .unregister(kind, name)
            .map(|()| axum::http::StatusCode::OK.into_response()),
    )
}

async fn system_unregister(State(s): AppState, Path(name): Path<String>) -> Response {
    unregister(&s, Kind::System, Some(&name))
}
async fn system_unregister_all(State(s): AppState) -> Response {
    unregister(&s, Kind::System, None)
}
async fn cuda_unregister(State(s): AppState, Path(name): Path<String>) -> Response {
    unregister(&s, Kind::Cuda, Some(&name))
}
async fn cuda_unregister_all(State(s): AppState) -> Response {
    unregister(&s, Kind::Cuda, None)
}

async fn body_json<T: for<'de> Deserialize<'de>>(
    s: &HttpState,
    headers: &HeaderMap,
    body: Body,
    what: &str,
) -> Result<T> {
    let body = read_body(s, headers, body).await?;
    serde_json::from_slice(&body).map_err(|e| {
        Error::invalid_arg(format!("failed to parse the {what} register request: {e}"))
    })
}

#[derive(Deserialize)]
struct SystemRegister {
    key: String,
    #[serde(default)]
    offset: u64,
    byte_size: u64,
}

async fn system_register(
    State(s): AppState,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(
        async {
            s.info.shm.check_allowed()?;
            let r: SystemRegister = body_json(&s, &headers, body, "system shared memory").await?;
            s.info
                .shm
                .register_system(&name, &r.key, r.offset, r.byte_size)?;
            Ok(axum::http::StatusCode::OK.into_response())
        }
        .await,
    )
}

#[derive(Deserialize)]
struct RawHandle {
    b64: String,
}

#[derive(Deserialize)]
struct CudaRegister {
    raw_handle: RawHandle,
    device_id: i64,
    byte_size: u64,
}

async fn cuda_register(
    State(s): AppState,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    use base64::Engine as _;
    respond(
        async {
            s.info.shm.check_allowed()?;
            let r: CudaRegister = body_json(&s, &headers, body, "CUDA shared memory").await?;
            let handle = base64::engine::general_purpose::STANDARD
                .decode(r.raw_handle.b64.trim())
                .map_err(|e| {
                    Error::invalid_arg(format!("raw_handle.b64 is not valid base64: {e}"))
                })?;
            let shm = s.info.shm.clone();
            tokio::task::spawn_blocking(move || {
                shm.register_cuda(&name, &handle, r.device_id, r.byte_size)
            })
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
            Ok(axum::http::StatusCode::OK.into_response())
        }
        .await,
    )
}
