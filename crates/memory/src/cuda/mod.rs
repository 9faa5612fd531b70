//! CUDA through the driver API, loaded at run time (`cudarc` dynamic loading):
//! device discovery, per-thread contexts, device and page-locked allocations,
//! and IPC handles for CUDA shared memory. Without `libcuda` every entry point
//! reports "no CUDA" instead of failing the process. A build without the
//! `cuda` feature has no driver code at all: discovery says so and every
//! entry point is unsupported.

use std::sync::OnceLock;

use tern_core::error::{Error, Result};

#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
pub use driver::*;
#[cfg(not(feature = "cuda"))]
mod absent;
#[cfg(not(feature = "cuda"))]
pub use absent::*;

/// One CUDA device as discovery saw it.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    /// CUDA ordinal.
    pub index: usize,
    /// Marketing name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `GPU-xxxxxxxx-...`, as nvidia-smi prints it.
    pub uuid: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub total_memory: usize,
    /// Integrated GPU (Jetson): no CUDA IPC.
    pub integrated: bool,
}

impl GpuInfo {
    /// `"9.0"`: the key `cc_model_filenames` uses.
    pub fn cc_string(&self) -> String {
        format!(
            "{}.{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

static DISCOVERY: OnceLock<std::result::Result<Vec<GpuInfo>, String>> = OnceLock::new();

/// The CUDA devices of this machine (empty without a driver or GPU). Discovery
/// runs once; its result is logged by [`log_devices`].
pub fn devices() -> &'static [GpuInfo] {
    match DISCOVERY.get_or_init(driver_discover) {
        Ok(d) => d,
        Err(_) => &[],
    }
}

/// Why CUDA is unusable, or `None` when at least the driver initialised.
pub fn unavailable_reason() -> Option<String> {
    match DISCOVERY.get_or_init(driver_discover) {
        Ok(d) if d.is_empty() => Some("no CUDA device was found".into()),
        Ok(_) => None,
        Err(e) => Some(e.clone()),
    }
}

/// Logs what discovery found (called once at startup).
pub fn log_devices() {
    match unavailable_reason() {
        Some(why) => tracing::info!(
            "no GPU: {why}; GPU instance groups fail to load, KIND_AUTO uses the CPU"
        ),
        None => {
            for g in devices() {
                tracing::info!(
                    gpu = g.index,
                    name = %g.name,
                    uuid = %g.uuid,
                    compute_capability = %g.cc_string(),
                    memory_mib = g.total_memory >> 20,
                    integrated = g.integrated,
                    "CUDA device"
                );
            }
        }
    }
}

/// Fails with UNSUPPORTED (naming `what`) when CUDA is unusable.
pub fn require(what: &str) -> Result<()> {
    match unavailable_reason() {
        None => Ok(()),
        Some(why) => Err(Error::unsupported(format!("{what} needs CUDA: {why}"))),
    }
}

fn driver_discover() -> std::result::Result<Vec<GpuInfo>, String> {
    if std::env::var_os("TERN_DISABLE_CUDA").is_some() {
        return Err("CUDA disabled by TERN_DISABLE_CUDA".into());
    }
    discover()
}
