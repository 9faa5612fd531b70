//! What the server counts about its plugins: failures per plugin model, the
//! `.cwasm` cache's hits and misses, and the metric families plugins
//! declare. One [`PluginTelemetry`] belongs to the `wasm` backend of a
//! repository; the metrics renderer reads it from there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::cache::Source;
use crate::metrics::MetricRegistry;

/// Failure counts of one plugin model (all versions and instances).
#[derive(Debug, Default)]
pub struct PluginCounters {
    /// Traps other than the two below (panics, out-of-bounds accesses, ...).
    pub traps: AtomicU64,
    /// Executions stopped at their deadline.
    pub timeouts: AtomicU64,
    /// Executions stopped at the memory cap.
    pub memory_cap_hits: AtomicU64,
    /// Instances re-instantiated after one of the above.
    pub restarts: AtomicU64,
    /// Log lines dropped by the per-instance rate limit.
    pub log_lines_dropped: AtomicU64,
    /// Linear memory of the model's live instances, summed, in bytes (as
    /// of each instance's last execution).
    pub memory_bytes: AtomicU64,
}

impl PluginCounters {
    /// Counts one failed execution.
    pub fn record(&self, memory_cap: bool, timeout: bool) {
        let c = if memory_cap {
            &self.memory_cap_hits
        } else if timeout {
            &self.timeouts
        } else {
            &self.traps
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Plugin failure counters, cache counts and plugin-declared metrics.
#[derive(Debug, Default)]
pub struct PluginTelemetry {
    counters: Mutex<HashMap<String, Arc<PluginCounters>>>,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    /// The metric families plugins declared.
    pub metrics: MetricRegistry,
}

impl PluginTelemetry {
    /// The counters of plugin model `model` (kept across reloads).
    pub fn counters(&self, model: &str) -> Arc<PluginCounters> {
        self.counters
            .lock()
            .expect("plugin counters lock poisoned: nothing panics while holding it")
            .entry(model.to_string())
            .or_default()
            .clone()
    }

    /// The counters of every plugin model loaded since start, by model name.
    pub fn all_counters(&self) -> Vec<(String, Arc<PluginCounters>)> {
        let mut v: Vec<(String, Arc<PluginCounters>)> = self
            .counters
            .lock()
            .expect("plugin counters lock poisoned: nothing panics while holding it")
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Counts a component obtained from the cache or compiled.
    pub fn count_component(&self, source: Source) {
        let c = match source {
            Source::Cache | Source::Shared => &self.cache_hits,
            Source::Compiled => &self.cache_misses,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Components loaded from the cache and components compiled, since start.
    pub fn cache_counts(&self) -> (u64, u64) {
        (
            self.cache_hits.load(Ordering::Relaxed),
            self.cache_misses.load(Ordering::Relaxed),
        )
    }
}

/// The plugin counters per model, the `.cwasm` cache counts and the
/// families plugins declared.
impl tern_core::prometheus::Families for PluginTelemetry {
    fn render(&self, out: &mut String) {
        use tern_core::prometheus::{header, labels, sample};
        let plugins = self.all_counters();
        type Read = fn(&PluginCounters) -> u64;
        let plugin_families: [(&str, &str, Read); 5] = [
            (
                "tern_plugin_traps_total",
                "Plugin executions that trapped (panics, faults), per model",
                |c| c.traps.load(std::sync::atomic::Ordering::Relaxed),
            ),
            (
                "tern_plugin_timeouts_total",
                "Plugin executions stopped at execution_timeout_ms, per model",
                |c| c.timeouts.load(std::sync::atomic::Ordering::Relaxed),
            ),
            (
                "tern_plugin_memory_cap_hits_total",
                "Plugin executions stopped at max_memory_bytes, per model",
                |c| c.memory_cap_hits.load(std::sync::atomic::Ordering::Relaxed),
            ),
            (
                "tern_plugin_restarts_total",
                "Plugin instances re-instantiated after a fault, per model",
                |c| c.restarts.load(std::sync::atomic::Ordering::Relaxed),
            ),
            (
                "tern_plugin_log_lines_dropped_total",
                "Plugin log lines dropped by the per-instance rate limit, per model",
                |c| {
                    c.log_lines_dropped
                        .load(std::sync::atomic::Ordering::Relaxed)
                },
            ),
        ];
        for (name, help, read) in plugin_families {
            header(out, name, "counter", help);
            for (model, c) in &plugins {
                sample(
                    out,
                    name,
                    &labels(&[("model", model.as_str())]),
                    read(c) as f64,
                );
            }
        }
        let name = "tern_plugin_memory_bytes";
        header(
            out,
            name,
            "gauge",
            "Linear memory of the plugin's live instances, summed, per model",
        );
        for (model, c) in &plugins {
            sample(
                out,
                name,
                &labels(&[("model", model.as_str())]),
                c.memory_bytes.load(std::sync::atomic::Ordering::Relaxed) as f64,
            );
        }
        let (hits, misses) = self.cache_counts();
        for (name, help, v) in [
            (
                "tern_wasm_cache_hits_total",
                "Plugin components loaded from the .cwasm cache",
                hits,
            ),
            (
                "tern_wasm_cache_misses_total",
                "Plugin components compiled because the .cwasm cache had no usable entry",
                misses,
            ),
        ] {
            header(out, name, "counter", help);
            sample(out, name, "", v as f64);
        }
        out.push_str(&self.metrics.render());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_per_model_and_shared_across_loads() {
        let t = PluginTelemetry::default();
        t.counters("b").record(false, true);
        t.counters("a").record(true, false);
        t.counters("b").record(false, false);
        let all = t.all_counters();
        assert_eq!(
            all.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(all[1].1.timeouts.load(Ordering::Relaxed), 1);
        assert_eq!(all[1].1.traps.load(Ordering::Relaxed), 1);
        assert_eq!(all[0].1.memory_cap_hits.load(Ordering::Relaxed), 1);
        t.count_component(Source::Cache);
        t.count_component(Source::Compiled);
        t.count_component(Source::Compiled);
        assert_eq!(t.cache_counts(), (1, 2));
    }
}
