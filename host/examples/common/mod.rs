//! Helpers shared by the in-process benchmark examples.

use std::time::Instant;

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
