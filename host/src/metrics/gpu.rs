//! GPU gauges through NVML (`libnvidia-ml`, opened at run time): utilisation,
//! memory, power and energy per GPU, labelled with `gpu_uuid` as Triton does.
//! Where NVML is absent (machines without the NVIDIA driver, Jetson) the
//! families are not rendered here, and that is logged once.

use std::sync::OnceLock;

use nvml_wrapper::Nvml;

use tern_core::prometheus::{header, labels, sample};

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| {
        let opened = Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| Nvml::init());
        match opened {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::info!("NVML GPU metrics unavailable: NVML could not be opened ({e})");
                None
            }
        }
    })
    .as_ref()
}

/// Opens NVML (once) so that its absence is logged at startup, not at the
/// first scrape; whether it sees a GPU.
pub fn probe() -> bool {
    nvml().is_some_and(|n| n.device_count().is_ok_and(|c| c > 0))
}

/// One GPU's readings; a reading NVML refuses (e.g. power on some boards) is left out.
struct Reading {
    uuid: String,
    utilization: Option<f64>,
    memory: Option<(u64, u64)>,
    power_w: Option<f64>,
    limit_w: Option<f64>,
    energy_j: Option<f64>,
}

fn read_all(n: &Nvml) -> Vec<Reading> {
    let count = n.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|i| n.device_by_index(i).ok())
        .map(|d| Reading {
            uuid: d.uuid().unwrap_or_default(),
            utilization: d.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
            memory: d.memory_info().ok().map(|m| (m.total, m.used)),
            power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            limit_w: d
                .enforced_power_limit()
                .ok()
                .map(|mw| f64::from(mw) / 1000.0),
            energy_j: d
                .total_energy_consumption()
                .ok()
                .map(|mj| mj as f64 / 1000.0),
        })
        .collect()
}

/// Renders Triton's GPU families (nothing without NVML or GPUs); whether it
/// rendered any.
pub fn render(out: &mut String) -> bool {
    let Some(n) = nvml() else { return false };
    let rows = read_all(n);
    if rows.is_empty() {
        return false;
    }
    type Pick = fn(&Reading) -> Option<f64>;
    let families: [(&str, &str, Pick); 6] = [
        (
            "nv_gpu_utilization",
            "GPU utilization rate [0.0 - 1.0)",
            |r| r.utilization,
        ),
        (
            "nv_gpu_memory_total_bytes",
            "GPU total memory, in bytes",
            |r| r.memory.map(|m| m.0 as f64),
        ),
        (
            "nv_gpu_memory_used_bytes",
            "GPU used memory, in bytes",
            |r| r.memory.map(|m| m.1 as f64),
        ),
        ("nv_gpu_power_usage", "GPU power usage in watts", |r| {
            r.power_w
        }),
        (
            "nv_gpu_power_limit",
            "GPU power management limit in watts",
            |r| r.limit_w,
        ),
        (
            "nv_energy_consumption",
            "GPU energy consumption in joules since the Triton Server started",
            |r| r.energy_j,
        ),
    ];
    for (name, help, pick) in families {
        header(out, name, "gauge", help);
        for r in &rows {
            if let Some(v) = pick(r) {
                sample(out, name, &labels(&[("gpu_uuid", r.uuid.as_str())]), v);
            }
        }
    }
    true
}
