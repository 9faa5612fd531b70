//! The metrics endpoint: `GET /metrics` in Prometheus text format on
//! `--metrics-port` (8002 by default).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::http::error_response;
use crate::metrics::Metrics;
use tern_core::error::Error;

/// The metrics router.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .fallback(|| async {
            error_response(&Error::not_found(
                "no such endpoint: metrics are at /metrics",
            ))
        })
        .with_state(metrics)
}

/// Renders off the async workers: a scrape reads NVML, sysfs (a Jetson's
/// power monitors sit behind I2C) and every model's statistics.
async fn scrape(State(m): State<Arc<Metrics>>) -> Response {
    match tokio::task::spawn_blocking(move || m.render()).await {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8; version=0.0.4",
            )],
            body,
        )
            .into_response(),
        Err(e) => error_response(&Error::internal(format!(
            "rendering the metrics failed: {e}"
        ))),
    }
}
