//! The `bert_tokenizer` plugin (WASM) against the same `wordpiece` crate
//! compiled natively, on the same texts in the same run: run with
//! `make bench-tokenizer` (see docs/PERFORMANCE.md).
//!
//! Both sides tokenise a batch of 64 texts and pad them into `input_ids`,
//! `attention_mask` and `token_type_ids`; the WASM side is one `execute`
//! call through the wasm backend (including the copies across the
//! component boundary).
//!
//! Usage: tokenizer_bench <repository with bert_tokenizer> [iterations]

mod common;

use std::path::Path;

use common::{per_call_us, strings};

use tern::backends::Registry;

use tern_core::backend::{BackendSettings, DeviceKind, ExecTiming, InstanceSpec};
use tern_core::{DataType, InferRequest, Tensor};

const TEXTS: &[&str] = &[
    "This is an example sentence",
    "The quick brown fox jumps over the lazy dog.",
    "Tern serves Triton's protocol from a small Rust binary; plugins run as WebAssembly.",
    "Café déjà vu — naïve coöperation, façade and Ångström!",
    "unaffable hyperparameterization of transformers",
    "GPU-accelerated edge devices (Jetson Orin, 2024) run ~40 TOPS @ 15W",
    "Edge inference servers should start fast, stay small and never crash on bad input.",
    "How many tokens does a WordPiece tokenizer produce for this sentence?",
];

fn native(tok: &wordpiece::Tokenizer, texts: &[String], max_len: usize) -> usize {
    let rows: Vec<Vec<i64>> = texts.iter().map(|t| tok.encode(t, max_len)).collect();
    let width = rows.iter().map(Vec::len).max().unwrap_or(2);
    let mut ids = Vec::with_capacity(rows.len() * width);
    let mut mask = Vec::with_capacity(rows.len() * width);
    for row in &rows {
        ids.extend_from_slice(row);
        ids.resize(ids.len() + width - row.len(), tok.pad_id());
        mask.extend(std::iter::repeat_n(1i64, row.len()));
        mask.extend(std::iter::repeat_n(0i64, width - row.len()));
    }
    let types = vec![0i64; ids.len()];
    std::hint::black_box((&ids, &mask, &types));
    ids.len()
}

fn main() {
    let (root, n) = common::repo_and_iterations("tokenizer_bench <repository> [iterations]", 2000);
    let dir = std::path::Path::new(&root).join("bert_tokenizer").join("1");
    let vocab = std::fs::read_to_string(dir.join("vocab.txt")).expect("vocab.txt");
    let tok = wordpiece::Tokenizer::from_vocab(&vocab, true).expect("vocab");
    let texts: Vec<String> = (0..64)
        .map(|i| TEXTS[i % TEXTS.len()].to_string())
        .collect();

    let settings = BackendSettings::default();
    let repo = common::empty_repo(&settings);
    let text =
        std::fs::read_to_string(std::path::Path::new(&root).join("bert_tokenizer/config.pbtxt"))
            .expect("config");
    let mut cfg = tern_core::config::parse_pbtxt(&text).expect("config parses");
    tern_core::config::defaults::normalize(&mut cfg, 0);
    let wasm = Registry::default().get("wasm").expect("wasm backend");
    let model = common::load(&wasm, &repo, Path::new(&root), &cfg, &settings);
    let mut inst = model
        .create_instance(&InstanceSpec {
            name: "bench_0".into(),
            device: DeviceKind::Cpu,
        })
        .expect("instance");
    let data = strings(&texts);
    let batch = vec![InferRequest {
        model_name: "bert_tokenizer".into(),
        inputs: vec![Tensor::new(
            "TEXT",
            DataType::Bytes,
            vec![texts.len() as i64, 1],
            data,
        )],
        ..Default::default()
    }];

    // Same output on both sides.
    let r = inst.execute(&batch, &mut ExecTiming::default());
    let out = r[0].as_ref().expect("wasm execute");
    let ids = out
        .outputs
        .iter()
        .find(|t| t.name == "input_ids")
        .expect("ids");
    assert_eq!(ids.data.len() / 8, native(&tok, &texts, 256));
    let tokens: usize = texts.iter().map(|t| tok.encode(t, 256).len()).sum();

    let mut native_us = Vec::new();
    let mut wasm_us = Vec::new();
    for _ in 0..3 {
        native_us.push(per_call_us(n, || {
            native(&tok, &texts, 256);
        }));
        wasm_us.push(per_call_us(n, || {
            let r = inst.execute(&batch, &mut ExecTiming::default());
            assert!(r[0].is_ok());
        }));
    }
    let best = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
    let (nat, was) = (best(&native_us), best(&wasm_us));
    println!(
        "batch of {} texts ({tokens} tokens), best of 3 x {n} calls:",
        texts.len()
    );
    println!(
        "native wordpiece: {nat:.1} us per batch ({:.2} us per text)",
        nat / 64.0
    );
    println!(
        "wasm bert_tokenizer execute: {was:.1} us per batch ({:.2} us per text)",
        was / 64.0
    );
    println!("wasm / native: {:.2}x", was / nat);
}
