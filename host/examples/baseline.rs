//! Benchmark baseline: a minimal hyper server that reads the request body,
//! parses it as JSON exactly as Tern's HTTP frontend does (into the same
//! shape of document), and answers a fixed `simple` response. Tern's
//! throughput is reported as a ratio of this one's (docs/PERFORMANCE.md).
//!
//! Given a model repository it is the bare server *with* the model instead:
//! it decodes both inputs' `data` as INT32, runs `<repository>/simple` through
//! ONNX Runtime on the worker that received the request (one session per
//! worker thread: no lock, queue, hand-off or statistics) and answers the
//! computed outputs: about the most a server running `simple` through ONNX
//! Runtime can serve on the same machine.
//!
//! Usage: `baseline <port> [<model repository>]`

mod common;

use std::convert::Infallible;
use std::fmt::Write;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use common::SimpleOnnx;

const RESPONSE: &str = r#"{"model_name":"simple","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}"#;

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Input<D> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    data: D,
}

#[derive(serde::Deserialize)]
struct Body<D> {
    inputs: Vec<Input<D>>,
}

fn reply(status: u16, body: Bytes) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("response"))
}

/// The `simple` response for the two outputs' raw INT32 data.
fn encode(outputs: &[Bytes; 2]) -> Bytes {
    let mut s = String::with_capacity(256);
    s.push_str(r#"{"model_name":"simple","model_version":"1","outputs":["#);
    for (i, data) in outputs.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            s,
            r#"{sep}{{"name":"OUTPUT{i}","datatype":"INT32","shape":[1,16],"data":["#
        );
        for (j, v) in data.chunks_exact(4).enumerate() {
            let v = i32::from_le_bytes(v.try_into().expect("4 bytes"));
            let _ = write!(s, "{}{v}", if j == 0 { "" } else { "," });
        }
        s.push_str("]}");
    }
    s.push_str("]}");
    Bytes::from(s)
}

/// Decodes both inputs, runs the model and encodes its outputs (400 on any error).
fn infer(model: &SimpleOnnx, body: &[u8]) -> (u16, Bytes) {
    let Ok(parsed) = serde_json::from_slice::<Body<Vec<i32>>>(body) else {
        return (400, Bytes::new());
    };
    let raw = |i: usize| -> Option<Bytes> {
        let input = parsed.inputs.get(i)?;
        Some(input.data.iter().flat_map(|v| v.to_le_bytes()).collect())
    };
    let (Some(a), Some(b)) = (raw(0), raw(1)) else {
        return (400, Bytes::new());
    };
    match model.run(a, b) {
        Ok(outputs) => (200, encode(&outputs)),
        Err(e) => (500, Bytes::from(e)),
    }
}

async fn handle(
    model: Option<Arc<SimpleOnnx>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return reply(400, Bytes::new());
    };
    if let Some(model) = model {
        let (status, body) = infer(&model, &body);
        return reply(status, body);
    }
    match serde_json::from_slice::<Body<Option<serde_json::Value>>>(&body) {
        Ok(parsed) => {
            std::hint::black_box(parsed);
            reply(200, Bytes::from_static(RESPONSE.as_bytes()))
        }
        Err(_) => reply(400, Bytes::new()),
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(8080);
    let model = args
        .next()
        .map(|root| Arc::new(SimpleOnnx::load(std::path::Path::new(&root))));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let model = model.clone();
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(
                    TokioIo::new(stream),
                    service_fn(move |req| handle(model.clone(), req)),
                )
                .await;
        });
    }
}
