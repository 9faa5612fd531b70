//! Prometheus metrics with Triton's names and labels, rendered at scrape
//! time from the same per-version counters the statistics extension reads
//! (so the two always agree), plus CPU and memory gauges, Tern's own
//! `tern_` families (plugin faults, `.cwasm` cache, load failures) and the
//! families plugins declare. GPU gauges come from NVML ([`gpu`]) or, where
//! NVML has no GPU, from a Jetson's sysfs ([`jetson`]).

#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(not(feature = "cuda"))]
#[path = "gpu_absent.rs"]
pub mod gpu;
pub mod jetson;
pub mod system;

use std::sync::Arc;
use std::time::Duration;

use crate::repository::Repository;
use crate::scheduler::stats::{CountNs, FailReason, Snapshot, SUMMARY_KINDS};
use crate::scheduler::ModelHandle;
use tern_core::error::{Error, Result};
use tern_core::prometheus::{self as text, header, labels, sample, Families};

/// `--metrics-*` settings.
#[derive(Debug, Clone)]
pub struct MetricsSettings {
    /// `--allow-cpu-metrics`.
    pub cpu: bool,
    /// `--allow-gpu-metrics`.
    pub gpu: bool,
    /// `--metrics-interval-ms`.
    pub interval: Duration,
    /// `counter_latencies` (default true): the `*_duration_us` counters.
    pub counter_latencies: bool,
    /// `summary_latencies` (default false): the `*_summary_us` summaries.
    pub summary_latencies: bool,
    /// `histogram_latencies` (default false): decoupled models' first-response histogram.
    pub histogram_latencies: bool,
    /// `summary_quantiles`: quantile and its allowed error.
    pub quantiles: Vec<(f64, f64)>,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            cpu: true,
            gpu: true,
            interval: Duration::from_millis(2000),
            counter_latencies: true,
            summary_latencies: false,
            histogram_latencies: false,
            quantiles: vec![(0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001)],
        }
    }
}

impl MetricsSettings {
    /// Applies `--metrics-config <key>=<value>` entries.
    pub fn apply_config(&mut self, entries: &[String]) -> Result<()> {
        for entry in entries {
            let (key, value) = entry.split_once('=').ok_or_else(|| {
                Error::invalid_arg(format!(
                    "--metrics-config '{entry}': expected <setting>=<value>"
                ))
            })?;
            let flag = || -> Result<bool> {
                match value {
                    "true" | "1" => Ok(true),
                    "false" | "0" => Ok(false),
                    _ => Err(Error::invalid_arg(format!(
                        "--metrics-config {key}: '{value}' is not true or false"
                    ))),
                }
            };
            match key {
                "counter_latencies" => self.counter_latencies = flag()?,
                "summary_latencies" => self.summary_latencies = flag()?,
                "summary_quantiles" => {
                    self.quantiles = value
                        .split(',')
                        .map(|q| {
                            let (q, e) = q.split_once(':').unwrap_or((q, "0.01"));
                            match (q.trim().parse::<f64>(), e.trim().parse::<f64>()) {
                                (Ok(q), Ok(e)) if (0.0..=1.0).contains(&q) && e >= 0.0 => {
                                    Ok((q, e))
                                }
                                _ => Err(Error::invalid_arg(format!(
                                    "--metrics-config summary_quantiles: '{value}' is not a list of <quantile>:<error> with quantiles in [0, 1]"
                                ))),
                            }
                        })
                        .collect::<Result<_>>()?
                }
                "histogram_latencies" => self.histogram_latencies = flag()?,
                _ => {
                    return Err(Error::unsupported(format!(
                        "--metrics-config '{entry}': unknown setting (supported: counter_latencies, summary_latencies, summary_quantiles, histogram_latencies)"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// What `GET /metrics` renders.
pub struct Metrics {
    repository: Arc<Repository>,
    settings: MetricsSettings,
    sampler: Option<system::Sampler>,
    /// The memory pools' families (pinned, host, CUDA).
    pools: &'static dyn Families,
    /// Other server-wide owners' families (the response cache).
    others: Vec<Arc<dyn Families>>,
    /// Whether the GPU gauges come from a Jetson's sysfs: decided once at
    /// startup (NVML saw no GPU), so a scrape never probes.
    jetson: bool,
}

/// A per-model counter family: name, help and the value for one version.
type Family = (
    &'static str,
    &'static str,
    fn(&crate::scheduler::stats::Snapshot) -> u64,
);

const COUNTERS: &[Family] = &[
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        |s| s.success.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        |s| s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        |s| s.execution_count,
    ),
];

const LATENCY_COUNTERS: &[Family] = &[
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        |s| s.success.ns / 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        |s| s.queue.ns / 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        |s| s.compute_input.ns / 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        |s| s.compute_infer.ns / 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        |s| s.compute_output.ns / 1000,
    ),
];

const SUMMARY_HELP: [&str; 5] = [
    "Summary of inference request duration in microseconds (includes cached requests)",
    "Summary of inference queuing duration in microseconds (includes cached requests)",
    "Summary of compute input duration in microseconds (does not include cached requests)",
    "Summary of compute inference duration in microseconds (does not include cached requests)",
    "Summary of compute output duration in microseconds (does not include cached requests)",
];

/// One model version's labels, handle and statistics, as the families render them.
type Row<'a> = (
    String,
    &'a Arc<ModelHandle>,
    crate::scheduler::stats::Snapshot,
);

impl Metrics {
    /// Starts the CPU sampler (when enabled). Latency summaries are kept by the
    /// models when `RepositoryOptions::summary_latencies` is set.
    pub fn new(
        repository: Arc<Repository>,
        settings: MetricsSettings,
        pools: &'static dyn Families,
    ) -> Metrics {
        let sampler = settings
            .cpu
            .then(|| system::Sampler::start(settings.interval));
        let jetson = settings.gpu && !gpu::probe();
        if jetson {
            jetson::probe();
        }
        Metrics {
            repository,
            settings,
            sampler,
            pools,
            others: Vec::new(),
            jetson,
        }
    }

    /// Adds a server-wide owner's families (rendered after the models').
    pub fn with_families(mut self, families: Arc<dyn Families>) -> Metrics {
        self.others.push(families);
        self
    }

    /// Every family in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let handles = self.repository.handles(None, None).unwrap_or_default();
        let rows: Vec<Row> = handles
            .iter()
            .map(|h| (model_labels(h), h, h.stats()))
            .collect();
        self.render_model_counters(&mut out, &rows);
        if self.settings.summary_latencies {
            self.render_summaries(&mut out, &rows);
        }
        if self.settings.histogram_latencies {
            render_first_response(&mut out, &rows);
        }
        self.render_load_durations(&mut out);
        self.render_system(&mut out);
        if self.settings.gpu && !gpu::render(&mut out) && self.jetson {
            jetson::render(&mut out);
        }
        for families in &self.others {
            families.render(&mut out);
        }
        self.pools.render(&mut out);
        self.render_tern(&mut out);
        for families in self.repository.backend_families() {
            families.render(&mut out);
        }
        out
    }

    /// Triton's per-model counters (requests, executions, durations), failures by reason, and
    /// pending requests.
    fn render_model_counters(&self, out: &mut String, rows: &[Row]) {
        let latencies: &[Family] = if self.settings.counter_latencies {
            LATENCY_COUNTERS
        } else {
            &[]
        };
        let families = COUNTERS.iter().chain(latencies);
        for (name, help, value) in families {
            header(out, name, "counter", help);
            for (l, _, snap) in rows {
                sample(out, name, l, value(snap) as f64);
            }
        }
        if self.settings.counter_latencies {
            render_cache_counters(out, rows);
        }
        let name = "nv_inference_request_failure";
        header(
            out,
            name,
            "counter",
            "Number of failed inference requests, all batch sizes",
        );
        for (_, h, snap) in rows {
            for reason in FailReason::ALL {
                let l = with_model(h, &[("reason", reason.as_str())]);
                sample(out, name, &l, snap.fail_reasons[reason as usize] as f64);
            }
        }
        let name = "nv_inference_pending_request_count";
        header(
            out,
            name,
            "gauge",
            "Instantaneous number of pending requests awaiting execution per-model.",
        );
        for (l, h, _) in rows {
            sample(out, name, l, h.pending() as f64);
        }
    }

    /// `nv_model_load_duration_secs` per model version.
    fn render_load_durations(&self, out: &mut String) {
        let name = "nv_model_load_duration_secs";
        header(out, name, "gauge", "Model load time in seconds");
        for (model, version, secs) in self.repository.load_durations() {
            let l = labels(&[("model", model.as_str()), ("version", &version.to_string())]);
            sample(out, name, &l, secs);
        }
    }

    /// Triton's CPU gauges, from the sampler when one runs.
    fn render_system(&self, out: &mut String) {
        if let Some(s) = &self.sampler {
            let v = s.latest();
            let gauges = [
                (
                    "nv_cpu_utilization",
                    "CPU utilization rate [0.0 - 1.0]",
                    v.cpu_utilization,
                ),
                (
                    "nv_cpu_memory_total_bytes",
                    "CPU total memory (RAM), in bytes",
                    v.memory_total as f64,
                ),
                (
                    "nv_cpu_memory_used_bytes",
                    "CPU used memory (RAM), in bytes",
                    v.memory_used as f64,
                ),
            ];
            for (name, help, value) in gauges {
                header(out, name, "gauge", help);
                sample(out, name, "", value);
            }
        }
    }

    fn render_summaries(&self, out: &mut String, rows: &[Row]) {
        for (kind, help) in SUMMARY_KINDS.iter().zip(SUMMARY_HELP) {
            let name = format!("nv_inference_{kind}_summary_us");
            header(out, &name, "summary", help);
            for (l, h, snap) in rows {
                let Some(sum) = h.summaries() else { continue };
                let k = SUMMARY_KINDS.iter().position(|x| x == kind).expect("kind");
                let total = [
                    snap.success,
                    snap.queue,
                    snap.compute_input,
                    snap.compute_infer,
                    snap.compute_output,
                ][k];
                self.summary_samples(out, &name, (l, h), &sum, k, total);
            }
        }
        self.render_cache_summaries(out, rows);
    }

    /// Triton's cache summaries, for the models that enable the response cache.
    fn render_cache_summaries(&self, out: &mut String, rows: &[Row]) {
        let cached: Vec<&Row> = rows
            .iter()
            .filter(|(_, h, _)| h.caches_responses())
            .collect();
        if cached.is_empty() {
            return;
        }
        for (name, help, window, total) in [
            (
                "nv_cache_hit_summary_per_model",
                "Summary of cache hit counts/durations per model, in microseconds.",
                crate::scheduler::stats::CACHE_HIT_WINDOW,
                (|s: &Snapshot| s.cache_hit) as fn(&Snapshot) -> CountNs,
            ),
            (
                "nv_cache_miss_summary_per_model",
                "Summary of cache miss counts/durations per model, in microseconds.",
                crate::scheduler::stats::CACHE_MISS_WINDOW,
                |s: &Snapshot| s.cache_miss,
            ),
        ] {
            header(out, name, "summary", help);
            for (l, h, snap) in &cached {
                let Some(sum) = h.summaries() else { continue };
                self.summary_samples(out, name, (l, h), &sum, window, total(snap));
            }
        }
    }

    /// One model's samples of a summary: the configured quantiles of
    /// `window`, then `_sum` (microseconds) and `_count` from `total`.
    fn summary_samples(
        &self,
        out: &mut String,
        name: &str,
        (l, h): (&str, &ModelHandle),
        sum: &crate::scheduler::stats::Summaries,
        window: usize,
        total: CountNs,
    ) {
        for (q, _) in &self.settings.quantiles {
            let ql = with_model(h, &[("quantile", &q.to_string())]);
            sample(out, name, &ql, sum.quantile(window, *q));
        }
        sample(out, &format!("{name}_sum"), l, total.ns as f64 / 1000.0);
        sample(out, &format!("{name}_count"), l, total.count as f64);
    }

    /// Tern's own families.
    fn render_tern(&self, out: &mut String) {
        let name = "tern_log_lines_dropped_total";
        header(
            out,
            name,
            "counter",
            "Server log lines dropped because the queue to the log writer was full",
        );
        sample(out, name, "", crate::logging::dropped_lines() as f64);
        let name = "tern_model_load_failures_total";
        header(
            out,
            name,
            "counter",
            "Failed model loads (startup, poll and API), per model",
        );
        for (model, n) in self.repository.load_failures() {
            sample(out, name, &labels(&[("model", model.as_str())]), n as f64);
        }
        if self.repository.options().on_demand.enabled {
            self.render_on_demand(out);
        }
    }

    /// Which models are loaded, and the loads and evictions of loading on demand.
    fn render_on_demand(&self, out: &mut String) {
        let name = "tern_model_resident";
        header(
            out,
            name,
            "gauge",
            "Whether a model in the repository is loaded (1) or not (0)",
        );
        let mut resident = std::collections::BTreeMap::<String, bool>::new();
        for row in self.repository.index_with_unloaded() {
            *resident.entry(row.name).or_default() |= row.state == crate::repository::State::Ready;
        }
        for (model, r) in resident {
            let v = if r { 1.0 } else { 0.0 };
            sample(out, name, &labels(&[("model", model.as_str())]), v);
        }
        let name = "tern_model_loads_on_demand_total";
        header(
            out,
            name,
            "counter",
            "Model loads started by a request for a model that was not loaded",
        );
        let loads = self.repository.loads_on_demand_total();
        sample(out, name, "", loads as f64);
        let name = "tern_model_evictions_total";
        header(
            out,
            name,
            "counter",
            "Models unloaded by Tern, per model and reason (idle, memory_budget)",
        );
        for ((model, why), n) in self.repository.evictions() {
            let l = labels(&[("model", model.as_str()), ("reason", why.as_str())]);
            sample(out, name, &l, n as f64);
        }
    }
}

/// `{model="m",version="1"}` plus the config's `metric_tags`, all sorted by
/// label name as Triton prints them (see [`text::labels`]).
/// Triton's `nv_inference_first_response_histogram_ms`, for decoupled models only.
/// Triton's per-model response cache counters, for the models whose config
/// enables the cache (labelled without `gpu_uuid`, as Triton's).
fn render_cache_counters(out: &mut String, rows: &[Row]) {
    const CACHE: &[Family] = &[
        (
            "nv_cache_num_hits_per_model",
            "Number of cache hits per model",
            |s| s.cache_hit.count,
        ),
        (
            "nv_cache_hit_duration_per_model",
            "Total cache hit duration per model, in microseconds",
            |s| s.cache_hit.ns / 1000,
        ),
        (
            "nv_cache_num_misses_per_model",
            "Number of cache misses per model",
            |s| s.cache_miss.count,
        ),
        (
            "nv_cache_miss_duration_per_model",
            "Total cache miss (insert+lookup) duration per model, in microseconds",
            |s| s.cache_miss.ns / 1000,
        ),
    ];
    let cached: Vec<&Row> = rows
        .iter()
        .filter(|(_, h, _)| h.caches_responses())
        .collect();
    if cached.is_empty() {
        return;
    }
    for (name, help, value) in CACHE {
        header(out, name, "counter", help);
        for (l, _, snap) in &cached {
            sample(out, name, l, value(snap) as f64);
        }
    }
}

fn render_first_response(out: &mut String, rows: &[Row]) {
    use crate::scheduler::stats::FIRST_RESPONSE_BUCKETS_MS;
    let name = "nv_inference_first_response_histogram_ms";
    header(
        out,
        name,
        "histogram",
        "Duration from request to first response in milliseconds",
    );
    for (l, h, snap) in rows.iter().filter(|(_, h, _)| h.decoupled()) {
        let f = &snap.first_response;
        for (bound, count) in FIRST_RESPONSE_BUCKETS_MS.iter().zip(f.buckets) {
            let bl = with_model(h, &[("le", &bound.to_string())]);
            sample(out, &format!("{name}_bucket"), &bl, count as f64);
        }
        let bl = with_model(h, &[("le", "+Inf")]);
        sample(out, &format!("{name}_bucket"), &bl, f.count as f64);
        sample(out, &format!("{name}_sum"), l, f.sum_us as f64 / 1000.0);
        sample(out, &format!("{name}_count"), l, f.count as f64);
    }
}

fn model_labels(h: &ModelHandle) -> String {
    with_model(h, &[])
}

/// The model labels and `extra` (`reason` sorts in; `quantile` goes last).
fn with_model(h: &ModelHandle, extra: &[(&str, &str)]) -> String {
    let version = h.version.to_string();
    let mut pairs: Vec<(&str, &str)> =
        vec![("model", h.config.name.as_str()), ("version", &version)];
    // Triton labels each of the config's metric_tags `_<key>`
    // (GetMetricLabels in metric_model_reporter.cc), so they never collide
    // with its own labels.
    let mut tags: Vec<(String, &String)> = h
        .config
        .metric_tags
        .iter()
        .map(|(k, v)| (format!("_{k}"), v))
        .filter(|(k, _)| text::valid_name(k) && !k.starts_with("__"))
        .collect();
    tags.sort();
    pairs.extend(tags.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    pairs.extend_from_slice(extra);
    labels(&pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_config() {
        let mut s = MetricsSettings::default();
        s.apply_config(&[
            "summary_latencies=true".into(),
            "counter_latencies=false".into(),
            "summary_quantiles=0.5:0.05,0.99:0.001".into(),
            "histogram_latencies=true".into(),
        ])
        .unwrap();
        assert!(s.summary_latencies && !s.counter_latencies && s.histogram_latencies);
        assert_eq!(s.quantiles, vec![(0.5, 0.05), (0.99, 0.001)]);
        for bad in [
            "summary_latencies=maybe",
            "nope=1",
            "x",
            "summary_quantiles=2:0.1",
            "histogram_latencies=often",
        ] {
            assert!(s.apply_config(&[bad.into()]).is_err(), "{bad}");
        }
    }
}
