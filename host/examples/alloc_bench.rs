//! Heap allocations per request on the CPU hot path, counted by a global
//! allocator wrapper: run with `make bench-alloc` (see docs/PERFORMANCE.md).
//!
//! The server runs in this process (HTTP on a loopback port); the client is
//! a plain blocking socket on its own thread whose allocations are not
//! counted, so the figures are the server's own: the HTTP frontend, the
//! scheduler and the ONNX Runtime backend (ORT's own allocations through its
//! allocator are outside Rust's heap and not counted either).
//!
//! Usage: alloc_bench <repository made by `gen_models.test`> [requests] [tern flags...]
//! (e.g. `--host-memory-pool-byte-size=0` to see the figures without buffer recycling).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LARGE: AtomicU64 = AtomicU64::new(0);
/// Allocations of at least this many bytes count as "tensor-sized".
const LARGE_BYTES: usize = 16 * 1024;

thread_local! {
    static IGNORED: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if !IGNORED.try_with(Cell::get).unwrap_or(true) {
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
            "--allow-grpc=false".into(),
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
            let after = snapshot();
            let per = |i: usize| (after[i] - before[i]) as f64 / n as f64;
            println!(
                "| {label} | {:.1} | {:.0} | {:.2} |",
                per(0),
                per(1),
                per(2)
            );
        }
    });
    client.join().expect("client");
    rt.block_on(server.shutdown());
}
