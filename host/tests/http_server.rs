//! Integration tests: boot a real server on port 0 in-process and talk
//! HTTP/1.1 to it over a plain TCP socket.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use tern::cli::Args;
use tern::server::{start, RunningServer};

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A repository with identity models only (no ONNX Runtime needed).
fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("ident/config.pbtxt"),
        r#"name: "ident"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
instance_group [ { count: 2 kind: KIND_AUTO } ]
"#,
    );
    std::fs::create_dir_all(dir.path().join("ident/1")).unwrap();
    write(
        &dir.path().join("bad/config.pbtxt"),
        "name: \"bad\"\nbackend: \"no_such_backend\"\n",
    );
    std::fs::create_dir_all(dir.path().join("bad/1")).unwrap();
    dir
}

async fn boot(repo: &Path, extra: &[&str]) -> RunningServer {
    let mut argv = vec![
        "tern".to_string(),
        format!("--model-repository={}", repo.display()),
        "--http-port=0".into(),
        "--http-address=127.0.0.1".into(),
        "--grpc-port=0".into(),
        "--grpc-address=127.0.0.1".into(),
        "--metrics-port=0".into(),
        "--metrics-address=127.0.0.1".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let args = Args::parse_checked(argv).unwrap();
    start(&args).await.unwrap()
}

/// Sends one request and returns (status, body).
fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

async fn call(
    addr: SocketAddr,
    method: &'static str,
    path: &'static str,
    body: &'static str,
) -> (u16, String) {
    tokio::task::spawn_blocking(move || request(addr, method, path, body))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_infer_metadata_and_errors() {
    let dir = repo();
    let server = boot(dir.path(), &["--exit-on-error=false"]).await;
    let addr = server.http_addr.unwrap();

    assert_eq!(call(addr, "GET", "/v2/health/live", "").await.0, 200);
    // The broken model keeps the server from being ready under strict readiness.
    assert_eq!(call(addr, "GET", "/v2/health/ready", "").await.0, 400);
    assert_eq!(call(addr, "GET", "/v2/models/ident/ready", "").await.0, 200);

    let (status, body) = call(
        addr,
        "POST",
        "/v2/models/ident/infer",
        r#"{"id":"a","inputs":[{"name":"INPUT0","shape":[2,2],"datatype":"INT32","data":[[1,2],[3,4]]}]}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], "a");
    assert_eq!(v["outputs"][0]["name"], "OUTPUT0");
    assert_eq!(v["outputs"][0]["data"], serde_json::json!([1, 2, 3, 4]));

    let (status, body) = call(
        addr,
        "POST",
        "/v2/models/ident/infer",
        r#"{"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"INT32","data":[1,2,3]}]}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert!(body.contains("Expected [-1,2], got [1,3]"), "{body}");

    // As Triton: a model with no ready version is unknown (404), the load error after its words.
    let (status, body) = call(addr, "GET", "/v2/models/bad/config", "").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("Request for unknown model: 'bad' has no available versions")
            && body.contains("unknown backend 'no_such_backend'"),
        "{body}"
    );

    let (status, body) = call(addr, "GET", "/v2/models/ident/config", "").await;
    assert_eq!(status, 200);
    let cfg: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(cfg["instance_group"][0]["kind"], "KIND_CPU");
    assert_eq!(cfg["instance_group"][0]["count"], 2);

    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_on_error_fails_startup() {
    let dir = repo();
    let argv = vec![
        "tern".to_string(),
        format!("--model-repository={}", dir.path().display()),
        "--http-port=0".into(),
        "--grpc-port=0".into(),
        "--metrics-port=0".into(),
    ];
    let err = start(&Args::parse_checked(argv).unwrap())
        .await
        .err()
        .expect("startup must fail");
    assert!(err.message.contains("unknown backend"), "{err}");
}
