//! GPU gauges in a build without the `cuda` feature: there is no NVML code,
//! so the families are not rendered, and the log says why once.

/// Logs once that this build renders no GPU gauges.
pub fn probe() {
    tracing::info!(
        "GPU metrics unavailable: this build has no CUDA support (built without the 'cuda' feature)"
    );
}

/// Renders nothing: this build reads no GPU.
pub fn render(_out: &mut String) {}
