//! Plugin call costs, measured in-process (no network): run with
//! `make bench-plugins` (see docs/PERFORMANCE.md).
//!
//! 1. `execute` round trip host → plugin → host through the backend API on
//!    one instance (`simple_identity`, one 4-byte string; `add_sub`, 4 FP32).
//! 2. A request through a model's scheduler: `simple` (ONNX) directly, and
//!    `bls_caller` calling `simple` over BLS — the difference is the BLS cost.
//!
//! Usage: plugin_bench <repository made by `gen_models.plugin_repo`> [iterations]

mod common;

use common::{per_call_us, strings};

use tern::backends::Registry;
use tern::infer::Infer;
use tern::repository::RepositoryOptions;
use tern_core::backend::{BackendSettings, DeviceKind, ExecTiming, InstanceSpec};
use tern_core::{DataType, InferRequest, Tensor};

fn req(model: &str, inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        model_name: model.into(),
        inputs,
        ..Default::default()
    }
}

fn block<F: std::future::Future>(rt: &tokio::runtime::Runtime, f: F) -> F::Output {
    rt.block_on(f)
}

fn main() {
    let (root, n) = common::repo_and_iterations("plugin_bench <repository> [iterations]", 20000);
    let settings = BackendSettings {
        wasm_cache_dir: None,
        ..Default::default()
    };
    let infer = Infer::new(RepositoryOptions {
        roots: vec![root.clone().into()],
        auto_complete: true,
        backend: settings.clone(),
        gpu_count: 0,
        load_threads: 2,
        ..Default::default()
    });
    let repo = infer.repository().clone();
    let errors = repo.load_all().expect("repository");
    assert!(errors.is_empty(), "load errors: {errors:?}");

    let registry = Registry::default();
    let wasm = registry.get("wasm").expect("wasm backend");
    let spec = InstanceSpec {
        name: "bench_0".into(),
        device: DeviceKind::Cpu,
    };
    for (model, batch) in [
        (
            "simple_identity",
            vec![req(
                "simple_identity",
                vec![Tensor::new(
                    "INPUT0",
                    DataType::Bytes,
                    vec![1, 1],
                    strings(&["abcd"]),
                )],
            )],
        ),
        (
            "add_sub",
            vec![req(
                "add_sub",
                vec![
                    Tensor::new("INPUT0", DataType::Fp32, vec![1, 4], vec![0u8; 16]),
                    Tensor::new("INPUT1", DataType::Fp32, vec![1, 4], vec![0u8; 16]),
                ],
            )],
        ),
    ] {
        let cfg = repo.config(model, None).expect("config");
        let loaded = common::load(&wasm, &infer, std::path::Path::new(&root), &cfg, &settings);
        let mut inst = loaded.create_instance(&spec).expect("instance");
        let us = per_call_us(n, || {
            let r = inst.execute(&batch, &mut ExecTiming::default());
            assert!(r[0].is_ok());
        });
        println!("execute round trip, {model}: {us:.2} us");
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let a: Vec<u8> = (0..16i32).flat_map(|v| v.to_le_bytes()).collect();
    let ab = || {
        vec![
            Tensor::new("INPUT0", DataType::Int32, vec![1, 16], a.clone()),
            Tensor::new("INPUT1", DataType::Int32, vec![1, 16], a.clone()),
        ]
    };
    let simple = repo.get("simple", None).expect("simple");
    let direct = per_call_us(n / 4, || {
        block(&rt, simple.infer(req("simple", ab()))).expect("simple");
    });
    let caller = repo.get("bls_caller", None).expect("bls_caller");
    let via_bls = per_call_us(n / 4, || {
        let mut inputs = ab();
        inputs.push(Tensor::new(
            "ROUTE",
            DataType::Bytes,
            vec![1],
            strings(&["simple"]),
        ));
        block(&rt, caller.infer(req("bls_caller", inputs))).expect("bls");
    });
    println!("simple through its scheduler: {direct:.2} us");
    println!(
        "bls_caller -> simple: {via_bls:.2} us (BLS adds {:.2} us)",
        via_bls - direct
    );
    repo.shutdown();
}
