//! GPU gauges in a build without the `cuda` feature: there is no NVML code,
//! so the NVML families are not rendered, and the log says why once (a
//! Jetson's sysfs gauges, in `jetson.rs`, still are).

/// Logs once that this build renders no NVML gauges; no GPU seen.
pub fn probe() -> bool {
    tracing::info!(
        "NVML GPU metrics unavailable: this build has no CUDA support (built without the 'cuda' feature)"
    );
    false
}

/// Renders nothing: this build has no NVML.
pub fn render(_out: &mut String) -> bool {
    false
}
