//! CPU utilisation and memory of the machine, sampled with `sysinfo` every
//! `--metrics-interval-ms` on a background thread (utilisation is the
//! average over the last interval).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sysinfo::System;

/// The latest sample.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sample {
    /// CPU utilisation over the last interval, 0.0 to 1.0.
    pub cpu_utilization: f64,
    /// Total RAM in bytes.
    pub memory_total: u64,
    /// Used RAM in bytes.
    pub memory_used: u64,
}

/// A sampler running on its own thread until dropped.
pub struct Sampler {
    latest: Arc<Mutex<Sample>>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    /// Takes a first sample now and starts sampling every `interval`.
    pub fn start(interval: Duration) -> Sampler {
        let latest = Arc::new(Mutex::new(Sample::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut sys = System::new();
        sys.refresh_cpu_usage();
        sys.refresh_memory();
        *latest.lock().expect("sample lock") = read(&sys);
        let (l, s) = (latest.clone(), stop.clone());
        let spawned = std::thread::Builder::new()
            .name("metrics-sampler".into())
            .spawn(move || {
                let tick = Duration::from_millis(50).min(interval);
                let mut waited = Duration::ZERO;
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    waited += tick;
                    if waited < interval {
                        continue;
                    }
                    waited = Duration::ZERO;
                    sys.refresh_cpu_usage();
                    sys.refresh_memory();
                    *l.lock().expect("sample lock") = read(&sys);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(
                "cannot start the CPU metrics thread ({e}); CPU metrics stay at their first sample"
            );
        }
        Sampler { latest, stop }
    }

    /// The latest sample.
    pub fn latest(&self) -> Sample {
        *self.latest.lock().expect("sample lock")
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn read(sys: &System) -> Sample {
    Sample {
        cpu_utilization: (f64::from(sys.global_cpu_usage()) / 100.0).clamp(0.0, 1.0),
        memory_total: sys.total_memory(),
        memory_used: sys.used_memory(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_memory() {
        let s = Sampler::start(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(40));
        let v = s.latest();
        assert!(v.memory_total > 0 && v.memory_used > 0 && v.memory_used <= v.memory_total);
        assert!((0.0..=1.0).contains(&v.cpu_utilization));
    }
}
