//! Helpers shared by the in-process benchmark examples (each uses a subset).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tern::backends::Registry;
use tern::infer::Infer;
use tern::repository::RepositoryOptions;
use tern_core::backend::{
    Backend, BackendSettings, DeviceKind, ExecTiming, Instance, InstanceSpec, LoadContext, Model,
};
use tern_core::config::ModelConfig;
use tern_core::{DataType, InferRequest, Tensor};

/// A facade over a repository with no roots: what a backend looks other models up in.
pub fn empty_repo(settings: &BackendSettings) -> Arc<Infer> {
    Infer::new(RepositoryOptions {
        roots: vec![],
        auto_complete: false,
        backend: settings.clone(),
        gpu_count: 0,
        load_threads: 1,
        ..Default::default()
    })
}

/// Loads version 1 of the model `cfg` describes, from `<root>/<cfg.name>/1`, with `backend`.
pub fn load(
    backend: &Arc<dyn Backend>,
    repo: &Arc<Infer>,
    root: &Path,
    cfg: &ModelConfig,
    settings: &BackendSettings,
) -> Arc<dyn Model> {
    backend
        .load(&LoadContext {
            config: cfg,
            version: 1,
            version_dir: &root.join(&cfg.name).join("1"),
            settings,
            models: Arc::downgrade(repo) as std::sync::Weak<dyn tern_core::ModelRouter>,
            progress: &Default::default(),
            gate: &tern_core::backend::plain_files(),
        })
        .unwrap_or_else(|e| panic!("{}: {e}", cfg.name))
}

/// `<repository> [iterations]` from the command line (`default_n` iterations when absent).
pub fn repo_and_iterations(usage: &str, default_n: usize) -> (String, usize) {
    let mut args = std::env::args().skip(1);
    let root = args.next().unwrap_or_else(|| panic!("usage: {usage}"));
    let n = args
        .next()
        .map(|s| s.parse().expect("iterations"))
        .unwrap_or(default_n);
    (root, n)
}

/// Mean microseconds per call of `f` over `n` calls, after `n / 10` warm-up calls.
pub fn per_call_us(n: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Triton's BYTES encoding: each element as a 4-byte little-endian length + bytes.
pub fn strings<S: AsRef<[u8]>>(items: &[S]) -> Vec<u8> {
    let mut v = Vec::new();
    for s in items {
        v.extend_from_slice(&(s.as_ref().len() as u32).to_le_bytes());
        v.extend_from_slice(s.as_ref());
    }
    v
}

/// One instance of `<root>/simple` (version 1) on `backend` ("onnxruntime", "identity"),
/// loaded as Tern loads it.
pub fn simple_instance(root: &Path, backend: &str) -> Box<dyn Instance> {
    simple_instance_with(root, backend, "")
}

/// [`simple_instance`] with `extra` appended to its `config.pbtxt` (e.g. parameters).
pub fn simple_instance_with(root: &Path, backend: &str, extra: &str) -> Box<dyn Instance> {
    let settings = BackendSettings::default();
    let repo = empty_repo(&settings);
    let mut text =
        std::fs::read_to_string(root.join("simple/config.pbtxt")).expect("simple/config.pbtxt");
    text.push_str(extra);
    let mut cfg = tern_core::config::parse_pbtxt(&text).expect("config parses");
    cfg.backend = backend.into();
    tern_core::config::defaults::normalize(&mut cfg, 0);
    let found = Registry::default().get(backend).expect("backend");
    load(&found, &repo, root, &cfg, &settings)
        .create_instance(&InstanceSpec {
            name: "bench_0".into(),
            device: DeviceKind::Cpu,
        })
        .expect("instance")
}

/// `simple` on ONNX Runtime for the bare baseline servers: one session per
/// thread that runs it (each async worker loads its own on first use), run on
/// the thread that received the request: no lock, no queue, no hand-off, no
/// statistics, and each session stays with its thread's caches. Each session
/// has one intra-op thread (no pool threads of its own to compete with the
/// workers and the client). About the most a server could get out of ONNX
/// Runtime per request on top of its protocol work.
pub struct SimpleOnnx(std::path::PathBuf);

/// One intra-op thread: ONNX Runtime runs on the calling thread.
const ONE_THREAD: &str =
    "\nparameters { key: \"intra_op_thread_count\" value: { string_value: \"1\" } }\n";

thread_local! {
    static SIMPLE_ONNX: std::cell::RefCell<Option<Box<dyn Instance>>> =
        const { std::cell::RefCell::new(None) };
}

impl SimpleOnnx {
    /// Checks that `<root>/simple` loads on the ONNX Runtime backend
    /// (`ORT_DYLIB_PATH` names the library); threads load their own sessions.
    pub fn load(root: &Path) -> SimpleOnnx {
        drop(simple_instance_with(root, "onnxruntime", ONE_THREAD));
        SimpleOnnx(root.to_path_buf())
    }

    /// OUTPUT0 and OUTPUT1 (little-endian INT32 [1,16]) for two such inputs.
    pub fn run(&self, input0: Bytes, input1: Bytes) -> Result<[Bytes; 2], String> {
        let batch = [InferRequest {
            model_name: "simple".into(),
            inputs: vec![
                Tensor::new("INPUT0", DataType::Int32, vec![1, 16], input0),
                Tensor::new("INPUT1", DataType::Int32, vec![1, 16], input1),
            ],
            ..Default::default()
        }];
        let result = SIMPLE_ONNX.with_borrow_mut(|slot| {
            slot.get_or_insert_with(|| simple_instance_with(&self.0, "onnxruntime", ONE_THREAD))
                .execute(&batch, &mut ExecTiming::default())
                .pop()
        });
        let mut outputs = result
            .ok_or("no response")?
            .map_err(|e| e.to_string())?
            .outputs;
        outputs.sort_by(|a, b| a.name.cmp(&b.name));
        match <[Tensor; 2]>::try_from(outputs) {
            Ok([a, b]) => Ok([a.data, b.data]),
            Err(v) => Err(format!("{} outputs, expected 2", v.len())),
        }
    }
}
