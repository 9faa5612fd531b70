//! Plugin costs per guest language, side by side in one run: run with
//! `make bench-lang` (see docs/PERFORMANCE.md).
//!
//! For `empty_<lang>` (returns empty responses) and `prep_<lang>` (the
//! example job) in Rust, Python, JavaScript and C: component size, load
//! (compile) without the `.cwasm` cache, load from a warm cache, instance
//! creation (instantiate + `initialize`), and the mean `execute` round trip
//! for one request through the backend API (no network, no scheduler).
//!
//! Usage: lang_bench <repository with empty_* and prep_* models> [iterations]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use common::{per_call_us, strings};

use tern::infer::Infer;
use tern::repository::RepositoryOptions;
use tern_core::backend::{Backend, BackendSettings, DeviceKind, ExecTiming, InstanceSpec, Model};
use tern_core::config::parse_pbtxt;
use tern_core::{DataType, InferRequest, Tensor};

fn request(model: &str) -> InferRequest {
    let f32s: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut inputs = vec![
        Tensor::new("INPUT0", DataType::Fp32, vec![1, 4], f32s.clone()),
        Tensor::new("INPUT1", DataType::Fp32, vec![1, 4], f32s),
    ];
    if model.starts_with("prep") {
        inputs.push(Tensor::new(
            "TEXT",
            DataType::Bytes,
            vec![1, 1],
            strings(&["  Hello WORLD from\tthe benchmark "]),
        ));
    }
    InferRequest {
        model_name: model.into(),
        inputs,
        ..Default::default()
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn load(
    wasm: &Arc<dyn Backend>,
    repo: &Arc<Infer>,
    root: &Path,
    model: &str,
    settings: &BackendSettings,
) -> Arc<dyn Model> {
    let text =
        std::fs::read_to_string(root.join(model).join("config.pbtxt")).expect("config.pbtxt");
    let mut cfg = parse_pbtxt(&text).expect("config");
    cfg.name = model.to_string();
    common::load(wasm, repo, root, &cfg, settings)
}

fn main() {
    let (root, n) = common::repo_and_iterations("lang_bench <repository> [iterations]", 2000);
    let root = Path::new(&root);
    let cache = root.join(".cwasm-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let infer = Infer::new(RepositoryOptions {
        roots: Vec::new(),
        ..Default::default()
    });
    let wasm = tern::backends::Registry::default()
        .get("wasm")
        .expect("wasm backend");
    let spec = InstanceSpec {
        name: "bench_0".into(),
        device: DeviceKind::Cpu,
    };
    let cold = BackendSettings {
        wasm_cache_dir: None,
        ..Default::default()
    };
    let cached = BackendSettings {
        wasm_cache_dir: Some(cache.clone()),
        ..Default::default()
    };
    println!(
        "| plugin | size (KB) | load, no cache (ms) | load, warm cache (ms) | new instance (ms) | execute (us) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for kind in ["empty", "prep"] {
        for lang in ["rust", "python", "js", "c"] {
            let model = format!("{kind}_{lang}");
            let size = std::fs::metadata(root.join(&model).join("1/model.wasm"))
                .expect("model.wasm")
                .len();
            let t = Instant::now();
            drop(load(&wasm, &infer, root, &model, &cold));
            let no_cache = ms(t);
            drop(load(&wasm, &infer, root, &model, &cached)); // fills the cache
            let t = Instant::now();
            let loaded = load(&wasm, &infer, root, &model, &cached);
            let warm = ms(t);
            let t = Instant::now();
            for _ in 0..4 {
                drop(loaded.create_instance(&spec).expect("instance"));
            }
            let instance = ms(t) / 4.0;
            let mut inst = loaded.create_instance(&spec).expect("instance");
            let batch = vec![request(&model)];
            let iterations = if lang == "python" || lang == "js" {
                n / 4
            } else {
                n
            };
            let us = per_call_us(iterations, || {
                let r = inst.execute(&batch, &mut ExecTiming::default());
                if let Err(e) = &r[0] {
                    panic!("{model}: {e}");
                }
            });
            println!(
                "| {model} | {:.0} | {no_cache:.0} | {warm:.1} | {instance:.2} | {us:.1} |",
                size as f64 / 1024.0
            );
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
}
