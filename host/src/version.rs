//! What this build is — version, git commit, target, cargo features — and
//! the libraries it finds at run time (ONNX Runtime, CUDA), for
//! `tern --version` and the first log line.

use tern_core::backend::BackendSettings;

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from (`unknown` outside a checkout).
pub const COMMIT: &str = env!("TERN_GIT_COMMIT");
/// The target triple the binary was built for.
pub const TARGET: &str = env!("TERN_TARGET");

/// The cargo features this binary was built with.
pub fn features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if cfg!(feature = "onnx") {
        f.push("onnx");
    }
    if cfg!(feature = "cuda") {
        f.push("cuda");
    }
    if cfg!(feature = "cross-compile") {
        f.push("cross-compile");
    }
    if cfg!(feature = "torch-cuda") {
        f.push("torch-cuda");
    } else if cfg!(feature = "torch") {
        f.push("torch");
    }
    f
}

/// One line: `tern 0.1.0 (commit 0123abcd, x86_64-unknown-linux-gnu, features: onnx, cuda, cross-compile)`.
pub fn line() -> String {
    let features = features();
    format!(
        "tern {VERSION} (commit {COMMIT}, {TARGET}, features: {})",
        if features.is_empty() {
            "none".to_string()
        } else {
            features.join(", ")
        }
    )
}

/// The `--version` report: the build, then the ONNX Runtime library this
/// binary loads (path and build) or why it loads none, and the CUDA devices.
pub fn report(settings: &BackendSettings) -> String {
    let mut out = line();
    out.push('\n');
    out.push_str(&format!("onnxruntime: {}\n", onnx_status(settings)));
    out.push_str(&format!("libtorch: {}\n", torch_status()));
    let cuda = match tern_memory::cuda::unavailable_reason() {
        Some(why) => format!("none ({why})"),
        None => tern_memory::cuda::devices()
            .iter()
            .map(|g| {
                format!(
                    "GPU {} {} (compute capability {})",
                    g.index,
                    g.name,
                    g.cc_string()
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    };
    out.push_str(&format!("cuda: {cuda}\n"));
    out
}

#[cfg(feature = "onnx")]
fn onnx_status(settings: &BackendSettings) -> String {
    match tern_onnx::library_status(settings) {
        Ok((path, version, info)) => format!("{version} at {} ({info})", path.display()),
        Err(why) => format!("not loaded: {why}"),
    }
}

#[cfg(not(feature = "onnx"))]
fn onnx_status(_: &BackendSettings) -> String {
    "not in this build (built without the 'onnx' feature)".to_string()
}

#[cfg(feature = "torch")]
fn torch_status() -> String {
    tern_torch::status()
}

#[cfg(not(feature = "torch"))]
fn torch_status() -> String {
    "not in this build (built without the 'torch' feature)".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_the_build_and_what_it_found() {
        let r = report(&BackendSettings {
            onnxruntime_library: Some("/nonexistent/libonnxruntime.so".into()),
            ..Default::default()
        });
        assert!(r.starts_with(&format!("tern {VERSION} (commit ")), "{r}");
        assert!(r.contains(TARGET) && !TARGET.is_empty(), "{r}");
        assert!(
            r.contains("\nonnxruntime: ") && r.contains("\ncuda: "),
            "{r}"
        );
    }
}
