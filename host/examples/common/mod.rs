//! Helpers shared by the in-process benchmark examples (each uses a subset).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tern::repository::{Repository, RepositoryOptions};
use tern_core::backend::{Backend, BackendSettings, LoadContext, Model};
use tern_core::config::ModelConfig;

/// A repository with no roots: what a backend looks other models up in.
pub fn empty_repo(settings: &BackendSettings) -> Arc<Repository> {
    Repository::new(RepositoryOptions {
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
    repo: &Arc<Repository>,
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
