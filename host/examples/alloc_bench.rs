//! Heap allocations per request on the CPU hot path, counted by a global
//! allocator wrapper: run with `make bench-alloc` (see docs/PERFORMANCE.md).
//!
//! The server runs in this process (HTTP and gRPC on loopback ports); the
//! clients — a plain blocking socket for HTTP, an `h2` connection on a
//! single-threaded runtime for gRPC — run on their own thread whose
//! allocations are not counted, so the figures are the server's own: the
//! frontends, the scheduler and the ONNX Runtime backend (ORT's own
//! allocations through its allocator are outside Rust's heap and not counted
//! either).
//!
//! Usage: alloc_bench <repository made by `gen_models.test`> [requests] [tern flags...]
//! (e.g. `--host-memory-pool-byte-size=0` to see the figures without buffer recycling).
//! With `ALLOC_SITES=<row label prefix>` (e.g. `ALLOC_SITES='gRPC FP32 [1,16]'`)
//! it also lists where that row's allocations come from: the first frame
//! outside the standard library, counted over 20 more requests (slow; for
//! finding them, not for timing).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LARGE: AtomicU64 = AtomicU64::new(0);
/// Allocations of at least this many bytes count as "tensor-sized".
const LARGE_BYTES: usize = 16 * 1024;

thread_local! {
    static IGNORED: Cell<bool> = const { Cell::new(false) };
    /// Inside `site()`: its own allocations are neither counted nor traced.
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

/// Recording allocation sites (`ALLOC_SITES`).
static TRACE: AtomicBool = AtomicBool::new(false);
static SITES: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// Attributes one allocation to the first frame outside the allocator,
/// `core`, `alloc`, `std`, `bytes` and this file (with its source location
/// when the build has line tables).
fn site() {
    if TRACING.try_with(|t| t.replace(true)).unwrap_or(true) {
        return;
    }
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let lines: Vec<&str> = bt.lines().map(str::trim).collect();
    let at = |i: usize| {
        lines
            .get(i + 1)
            .and_then(|l| l.strip_prefix("at "))
            .and_then(|l| l.rsplit_once("/src/").map(|(_, f)| f))
            .unwrap_or("")
    };
    let frame = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.split_once(": ").map(|(_, f)| (i, f)))
        .find(|(_, f)| {
            ![
                "alloc::",
                "<alloc::",
                "core::",
                "<core::",
                "std::",
                "<std::",
                "alloc_bench",
                "__rust",
                "<alloc_bench",
                "bytes::",
                "<bytes::",
            ]
            .iter()
            .any(|skip| f.starts_with(skip))
        })
        .map_or("?".to_string(), |(i, f)| match at(i) {
            "" => f.to_string(),
            file => format!("{f} ({file})"),
        });
    if let Ok(mut sites) = SITES.lock() {
        *sites
            .get_or_insert_with(HashMap::new)
            .entry(frame)
            .or_default() += 1;
    }
    TRACING.with(|t| t.set(false));
}

fn count(size: usize) {
    if TRACING.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    if !IGNORED.try_with(Cell::get).unwrap_or(true) {
        if TRACE.load(Relaxed) {
            site();
        }
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(size as u64, Relaxed);
        if size >= LARGE_BYTES {
            LARGE.fetch_add(1, Relaxed);
        }
    }
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn snapshot() -> [u64; 3] {
    [
        ALLOCS.load(Relaxed),
        BYTES.load(Relaxed),
        LARGE.load(Relaxed),
    ]
}

/// One HTTP/1.1 infer request with the input as binary data (Triton's binary tensor extension).
fn binary_request(model: &str, elements: usize) -> Vec<u8> {
    let header = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,{elements}],"parameters":{{"binary_data_size":{}}}}}],"outputs":[{{"name":"OUTPUT0","parameters":{{"binary_data":true}}}}]}}"#,
        elements * 4
    );
    let mut body = header.clone().into_bytes();
    for i in 0..elements {
        body.extend_from_slice(&(i as f32).to_le_bytes());
    }
    let mut req = format!(
        "POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: {}\r\nContent-Length: {}\r\n\r\n",
        header.len(),
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    req
}

/// One HTTP/1.1 infer request with the input as JSON.
fn json_request(model: &str, elements: usize) -> Vec<u8> {
    let data: Vec<String> = (0..elements).map(|i| i.to_string()).collect();
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,{elements}],"data":[{}]}}]}}"#,
        data.join(",")
    );
    format!(
        "POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A gRPC `ModelInfer` message (length-prefixed) with one FP32 [1,elements] input as raw contents.
fn grpc_message(model: &str, elements: usize) -> bytes::Bytes {
    use prost::Message;
    use tern::proto::{model_infer_request::InferInputTensor, ModelInferRequest};
    let raw: Vec<u8> = (0..elements)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let req = ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![1, elements as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![raw.into()],
        ..Default::default()
    };
    let payload = req.encode_to_vec();
    let mut msg = vec![0u8];
    msg.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    msg.extend_from_slice(&payload);
    msg.into()
}

/// One unary gRPC call over `client`; panics unless the trailers say `grpc-status: 0`.
async fn grpc_call(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    uri: &str,
    msg: &bytes::Bytes,
) {
    let request = tonic::codegen::http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(request, false).expect("send");
    send.send_data(msg.clone(), true).expect("data");
    let mut body = response.await.expect("response").into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("chunk");
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body
        .trailers()
        .await
        .expect("trailers")
        .expect("no trailers");
    let status = trailers.get("grpc-status").map(|v| v.as_bytes().to_vec());
    assert_eq!(status.as_deref(), Some(&b"0"[..]), "{trailers:?}");
}

/// The gRPC rows: the same model over one HTTP/2 connection.
fn grpc_rows(addr: std::net::SocketAddr, model: &str, n: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.set_nodelay(true).ok();
        let (mut client, conn) = h2::client::handshake(tcp).await.expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let uri = format!("http://{addr}/inference.GRPCInferenceService/ModelInfer");
        for (label, msg) in [
            ("gRPC FP32 [1,16]", grpc_message(model, 16)),
            ("gRPC FP32 [1,262144] (1 MiB)", grpc_message(model, 262_144)),
        ] {
            for _ in 0..n / 10 + 1 {
                grpc_call(&mut client, &uri, &msg).await;
            }
            let before = snapshot();
            for _ in 0..n {
                grpc_call(&mut client, &uri, &msg).await;
            }
            print_row(label, before, n);
            if start_tracing(label) {
                for _ in 0..SITE_REQUESTS {
                    grpc_call(&mut client, &uri, &msg).await;
                }
                print_sites(label);
            }
        }
    });
}

/// Requests whose allocation sites are recorded for a traced row.
const SITE_REQUESTS: u64 = 20;

/// Prints one table row: the counters since `before`, per request.
fn print_row(label: &str, before: [u64; 3], n: u64) {
    let after = snapshot();
    let per = |i: usize| (after[i] - before[i]) as f64 / n as f64;
    println!(
        "| {label} | {:.1} | {:.0} | {:.2} |",
        per(0),
        per(1),
        per(2)
    );
}

/// Starts recording allocation sites if `ALLOC_SITES` names this row.
fn start_tracing(label: &str) -> bool {
    let traced =
        std::env::var("ALLOC_SITES").is_ok_and(|want| !want.is_empty() && label.starts_with(&want));
    TRACE.store(traced, Relaxed);
    traced
}

/// Stops recording and prints the recorded sites, per request.
fn print_sites(label: &str) {
    TRACE.store(false, Relaxed);
    let sites = SITES.lock().expect("sites").take().unwrap_or_default();
    let mut sites: Vec<(String, u64)> = sites.into_iter().collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.1));
    println!("\nallocation sites, {label}, per request:");
    for (frame, count) in sites {
        println!("{:7.2}  {frame}", count as f64 / SITE_REQUESTS as f64);
    }
    println!();
}

/// Sends `req` and reads one response (Content-Length framed); panics on a non-200.
fn round_trip(conn: &mut TcpStream, req: &[u8], buf: &mut Vec<u8>) {
    conn.write_all(req).expect("write");
    buf.clear();
    let mut chunk = [0u8; 65536];
    loop {
        let n = conn.read(&mut chunk).expect("read");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).expect("head");
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .expect("content-length");
            while buf.len() < end + 4 + len {
                let n = conn.read(&mut chunk).expect("read");
                assert!(n > 0, "connection closed");
                buf.extend_from_slice(&chunk[..n]);
            }
            return;
        }
    }
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let root = argv
        .next()
        .expect("usage: alloc_bench <repository> [requests]");
    let n: u64 = argv.next().map_or(2000, |s| s.parse().expect("requests"));
    let model = "onnx_identity_fp32";
    let extra: Vec<String> = argv.collect();
    let args = tern::cli::Args::parse_checked(
        [
            "tern".to_string(),
            format!("--model-repository={root}"),
            "--http-port=0".into(),
            "--grpc-port=0".into(),
            "--grpc-address=127.0.0.1".into(),
            "--allow-metrics=false".into(),
            "--model-control-mode=explicit".into(),
            format!("--load-model={model}"),
            "--log-verbose=0".into(),
        ]
        .into_iter()
        .chain(extra.iter().cloned()),
    )
    .expect("args");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = rt.block_on(tern::server::start(&args)).expect("server");
    let addr = server.http_addr.expect("http");
    let grpc_addr = server.grpc_addr.expect("grpc");

    let client = std::thread::spawn(move || {
        IGNORED.with(|c| c.set(true));
        let mut conn = TcpStream::connect(addr).expect("connect");
        conn.set_nodelay(true).ok();
        let mut buf = Vec::new();
        let flags = if extra.is_empty() {
            "defaults".to_string()
        } else {
            extra.join(" ")
        };
        println!("server flags: {flags}");
        println!("| request | allocations / request | bytes / request | allocations ≥ 16 KiB / request |");
        println!("|---|---:|---:|---:|");
        for (label, req) in [
            ("binary FP32 [1,16]", binary_request(model, 16)),
            ("JSON FP32 [1,16]", json_request(model, 16)),
            (
                "binary FP32 [1,262144] (1 MiB)",
                binary_request(model, 262_144),
            ),
        ] {
            for _ in 0..n / 10 + 1 {
                round_trip(&mut conn, &req, &mut buf);
            }
            let before = snapshot();
            for _ in 0..n {
                round_trip(&mut conn, &req, &mut buf);
            }
            print_row(label, before, n);
            if start_tracing(label) {
                for _ in 0..SITE_REQUESTS {
                    round_trip(&mut conn, &req, &mut buf);
                }
                print_sites(label);
            }
        }
        grpc_rows(grpc_addr, model, n);
    });
    client.join().expect("client");
    rt.block_on(server.shutdown());
}
