//! CPU utilisation and memory of the machine, sampled with `sysinfo` every
//! `--metrics-interval-ms` on a background thread (utilisation is the
//! average over the last interval).

use std::sync::mpsc::{self, RecvTimeoutError};
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
    /// Dropped with the sampler, which ends the thread's wait at once.
    _stop: mpsc::Sender<()>,
}

impl Sampler {
    /// Takes a first sample now and starts sampling every `interval`.
    pub fn start(interval: Duration) -> Sampler {
        let latest = Arc::new(Mutex::new(Sample::default()));
        let (stop, stopped) = mpsc::channel::<()>();
        let mut sys = System::new();
        sys.refresh_cpu_usage();
        sys.refresh_memory();
        *latest
            .lock()
            .expect("sample lock poisoned: nothing panics while holding it") = read(&sys);
        let l = latest.clone();
        // One wake-up per interval; dropping the sampler disconnects the
        // channel and ends the wait at once.
        let spawned = std::thread::Builder::new()
            .name("metrics-sampler".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    sys.refresh_cpu_usage();
                    sys.refresh_memory();
                    *l.lock()
                        .expect("sample lock poisoned: nothing panics while holding it") =
                        read(&sys);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(
                "cannot start the CPU metrics thread ({e}); CPU metrics stay at their first sample"
            );
        }
        Sampler {
            latest,
            _stop: stop,
        }
    }

    /// The latest sample.
    pub fn latest(&self) -> Sample {
        *self
            .latest
            .lock()
            .expect("sample lock poisoned: nothing panics while holding it")
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
