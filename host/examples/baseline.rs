//! Benchmark baseline: a minimal hyper server that reads the request body,
//! parses it as JSON exactly as Tern's HTTP frontend does (into the same
//! shape of document), and answers a fixed `simple` response. Tern's
//! throughput is reported as a ratio of this one's (docs/PERFORMANCE.md).
//!
//! Usage: `baseline <port>`

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

const RESPONSE: &str = r#"{"model_name":"simple","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}"#;

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Input {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    data: Option<serde_json::Value>,
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Body {
    inputs: Vec<Input>,
}

async fn handle(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(Response::builder()
                .status(400)
                .body(Full::new(Bytes::new()))
                .expect("response"))
        }
    };
    let status = match serde_json::from_slice::<Body>(&body) {
        Ok(parsed) => {
            std::hint::black_box(parsed);
            200
        }
        Err(_) => 400,
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(RESPONSE.as_bytes())))
        .expect("response"))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(8080);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(handle))
                .await;
        });
    }
}
