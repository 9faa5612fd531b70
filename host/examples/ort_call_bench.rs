//! What one ONNX Runtime execution of `simple` costs through Tern's ONNX
//! backend, on one thread and when consecutive calls alternate between two
//! threads (as when requests reach the model from different async workers
//! or the instance thread), and on one thread with other memory written
//! between calls (the session's data pushed out of the core's caches); the
//! identity backend on the same config is the baseline for the hand-off
//! itself. Run with (see docs/PERFORMANCE.md):
//!
//! `cargo run --release -p tern --example ort_call_bench -- model_repository`
//!
//! and again under `taskset -c 0` to keep both threads on one core.

mod common;

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::per_call_us;

use tern_core::backend::{ExecTiming, Instance};
use tern_core::{DataType, InferRequest, Tensor};

/// This process's user + system CPU time in microseconds.
fn cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields[i].parse::<f64>().expect("clock ticks");
    // Fields 14 and 15 (utime, stime) in clock ticks of 10 ms.
    (ticks(11) + ticks(12)) * 1e4
}

fn run(instance: &Mutex<Box<dyn Instance>>, batch: &[InferRequest]) {
    let r = instance
        .lock()
        .expect("instance lock poisoned: nothing panics while holding it")
        .execute(batch, &mut ExecTiming::default());
    assert!(r[0].is_ok(), "{:?}", r[0].as_ref().err());
}

/// (wall µs, CPU µs) per call with consecutive calls on two threads in turn.
fn alternating(
    instance: &Arc<Mutex<Box<dyn Instance>>>,
    batch: &[InferRequest],
    n: usize,
) -> (f64, f64) {
    let (cpu0, start) = (cpu_us(), Instant::now());
    let (to_other, other_rx) = sync_channel::<()>(0);
    let (to_main, main_rx) = sync_channel::<()>(0);
    let (inst, b) = (instance.clone(), batch.to_vec());
    let other = std::thread::spawn(move || {
        for _ in 0..n / 2 {
            other_rx.recv().expect("turn");
            run(&inst, &b);
            to_main.send(()).expect("turn");
        }
    });
    for _ in 0..n / 2 {
        run(instance, batch);
        to_other.send(()).expect("turn");
        main_rx.recv().expect("turn");
    }
    other.join().expect("other thread");
    let calls = (n / 2 * 2) as f64;
    (
        start.elapsed().as_secs_f64() * 1e6 / calls,
        (cpu_us() - cpu0) / calls,
    )
}

/// Wall µs per call on one thread when `bytes` of other memory are written
/// between calls (the call alone is timed): what the call costs when
/// something else has run on the core since the last one, as between two
/// requests in the server.
fn after_other_work(
    instance: &Mutex<Box<dyn Instance>>,
    batch: &[InferRequest],
    n: usize,
    bytes: usize,
) -> f64 {
    let mut other = vec![0u8; bytes];
    let mut spent = std::time::Duration::ZERO;
    for i in 0..n {
        other.fill(i as u8);
        std::hint::black_box(&mut other);
        let start = Instant::now();
        run(instance, batch);
        spent += start.elapsed();
    }
    spent.as_secs_f64() * 1e6 / n as f64
}

fn main() {
    let (root, n) = common::repo_and_iterations("ort_call_bench <repository> [iterations]", 20000);
    let data: Vec<u8> = (0..16i32).flat_map(|v| v.to_le_bytes()).collect();
    let batch = vec![InferRequest {
        model_name: "simple".into(),
        inputs: vec![
            Tensor::new("INPUT0", DataType::Int32, vec![1, 16], data.clone()),
            Tensor::new("INPUT1", DataType::Int32, vec![1, 16], data),
        ],
        ..Default::default()
    }];
    println!(
        "`simple`, {n} calls per figure, best of 3 (wall µs per call; CPU µs per call in brackets)"
    );
    for backend in ["onnxruntime", "identity"] {
        let inst = Arc::new(Mutex::new(common::simple_instance(
            std::path::Path::new(&root),
            backend,
        )));
        let mut one = Vec::new();
        let mut two = Vec::new();
        for _ in 0..3 {
            let cpu0 = cpu_us();
            let wall = per_call_us(n, || run(&inst, &batch));
            // per_call_us makes n / 10 warm-up calls first.
            one.push((wall, (cpu_us() - cpu0) / (n + n / 10) as f64));
            two.push(alternating(&inst, &batch, n));
        }
        let best = |v: &[(f64, f64)]| {
            v.iter()
                .copied()
                .fold((f64::MAX, f64::MAX), |a, b| if b.0 < a.0 { b } else { a })
        };
        let (one, two) = (best(&one), best(&two));
        println!(
            "{backend:>12}: one thread {:.1} ({:.1}); alternating between two threads {:.1} ({:.1})",
            one.0, one.1, two.0, two.1
        );
        let cold: Vec<String> = [64usize << 10, 512 << 10, 2 << 20]
            .iter()
            .map(|&b| {
                let us = (0..3)
                    .map(|_| after_other_work(&inst, &batch, n / 4, b))
                    .fold(f64::MAX, f64::min);
                format!("{} KiB {us:.1}", b >> 10)
            })
            .collect();
        println!(
            "{backend:>12}: one thread, other memory written between calls: {}",
            cold.join(", ")
        );
    }
}
