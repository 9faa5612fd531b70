//! Per-version inference statistics: the one source of truth for Triton's
//! statistics extension (`GET /v2/models/stats`) and, later, Prometheus.
//! Semantics follow Triton: `inference_count` counts batch elements of
//! successful requests, `execution_count` backend executions; per-request
//! durations (success, fail, queue, compute_*) and per-batch-size compute
//! durations. Failures also count by Triton's metric reasons, and, when
//! `--metrics-config summary_latencies=true`, recent latencies are kept for
//! the Prometheus summaries.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A count and a total duration.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CountNs {
    /// Number of observations.
    pub count: u64,
    /// Sum of their durations in nanoseconds.
    pub ns: u64,
}

impl CountNs {
    fn add(&mut self, d: Duration) {
        self.count += 1;
        self.ns += d.as_nanos() as u64;
    }
}

pub use tern_core::request::ComputeTimes;

/// A statistics snapshot.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Milliseconds since the epoch of the last execution (0 = never).
    pub last_inference: u64,
    /// Batch elements inferred successfully.
    pub inference_count: u64,
    /// Backend executions.
    pub execution_count: u64,
    /// Successful requests, end to end.
    pub success: CountNs,
    /// Failed requests, end to end.
    pub fail: CountNs,
    /// Queue time of successful requests.
    pub queue: CountNs,
    /// Input time of successful requests.
    pub compute_input: CountNs,
    /// Model time of successful requests.
    pub compute_infer: CountNs,
    /// Output time of successful requests.
    pub compute_output: CountNs,
    /// Requests answered from the response cache, with the lookup time.
    pub cache_hit: CountNs,
    /// Cache lookups that missed, with the lookup and insert time.
    pub cache_miss: CountNs,
    /// Per executed batch size: (input, infer, output).
    pub batches: BTreeMap<usize, [CountNs; 3]>,
    /// Failed requests by reason, indexed by [`FailReason`].
    pub fail_reasons: [u64; 4],
    /// Decoupled models: time from a request's arrival to its first response.
    pub first_response: FirstResponse,
}

/// Triton's first-response histogram buckets, in milliseconds.
pub const FIRST_RESPONSE_BUCKETS_MS: [u64; 4] = [100, 500, 2000, 5000];

/// The first-response histogram of a decoupled model: cumulative counts per
/// bucket of [`FIRST_RESPONSE_BUCKETS_MS`], the count and the sum.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FirstResponse {
    /// Observations at or below each bucket's bound.
    pub buckets: [u64; 4],
    /// Observations.
    pub count: u64,
    /// Their sum in microseconds.
    pub sum_us: u64,
}

/// Why a request failed, as `nv_inference_request_failure{reason=...}` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// Refused by the scheduler: queue full, queue timeout, model going away.
    Rejected = 0,
    /// Cancelled by the client.
    Canceled = 1,
    /// The backend failed while executing it (error, trap, panic).
    Backend = 2,
    /// Anything else (invalid request, ensemble step failure).
    Other = 3,
}

impl FailReason {
    /// Every reason, in index order.
    pub const ALL: [FailReason; 4] = [
        FailReason::Rejected,
        FailReason::Canceled,
        FailReason::Backend,
        FailReason::Other,
    ];

    /// Triton's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::Rejected => "REJECTED",
            FailReason::Canceled => "CANCELED",
            FailReason::Backend => "BACKEND",
            FailReason::Other => "OTHER",
        }
    }
}

/// Latency kinds kept for the Prometheus summaries, indexed like [`Summaries::windows`].
pub const SUMMARY_KINDS: [&str; 5] = [
    "request",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
];

/// How long an observation stays in a summary window.
const SUMMARY_MAX_AGE: Duration = Duration::from_secs(60);
/// Most observations a summary window keeps.
const SUMMARY_MAX_SAMPLES: usize = 8192;

/// The window of [`Summaries`] that holds response cache hit durations.
pub const CACHE_HIT_WINDOW: usize = SUMMARY_KINDS.len();
/// The window of [`Summaries`] that holds response cache miss durations.
pub const CACHE_MISS_WINDOW: usize = SUMMARY_KINDS.len() + 1;

/// Recent latencies of successful requests (microseconds) with their totals,
/// for Prometheus summaries: a sliding window of the last minute.
#[derive(Debug, Default, Clone)]
pub struct Summaries {
    /// One window per [`SUMMARY_KINDS`] entry, then the cache's hit and miss
    /// durations ([`CACHE_HIT_WINDOW`], [`CACHE_MISS_WINDOW`]): (when, microseconds).
    pub windows: [VecDeque<(Instant, f64)>; 7],
}

impl Summaries {
    fn observe(&mut self, values: [Duration; 5]) {
        for (k, v) in values.into_iter().enumerate() {
            self.observe_one(k, v);
        }
    }

    fn observe_one(&mut self, window: usize, value: Duration) {
        let now = Instant::now();
        let w = &mut self.windows[window];
        while w.len() >= SUMMARY_MAX_SAMPLES
            || w.front().is_some_and(|(t, _)| now - *t > SUMMARY_MAX_AGE)
        {
            w.pop_front();
        }
        w.push_back((now, value.as_nanos() as f64 / 1000.0));
    }

    /// The `q` quantile (0..=1) of window `kind` over the last minute (`NaN` when empty).
    pub fn quantile(&self, kind: usize, q: f64) -> f64 {
        let now = Instant::now();
        let mut v: Vec<f64> = self.windows[kind]
            .iter()
            .filter(|(t, _)| now - *t <= SUMMARY_MAX_AGE)
            .map(|(_, v)| *v)
            .collect();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        let rank = (q.clamp(0.0, 1.0) * (v.len() - 1) as f64).round() as usize;
        v[rank]
    }
}

/// Milliseconds since the Unix epoch (Triton's `last_inference`).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Statistics of one model version.
pub struct ModelStats {
    inner: Mutex<Snapshot>,
    summaries: Option<Mutex<Summaries>>,
}

impl Default for ModelStats {
    fn default() -> Self {
        ModelStats::new(false)
    }
}

impl ModelStats {
    /// Empty statistics; `summaries` keeps recent latencies for the
    /// Prometheus summaries (`--metrics-config summary_latencies=true`).
    pub fn new(summaries: bool) -> Self {
        ModelStats {
            inner: Mutex::default(),
            summaries: summaries.then(Mutex::default),
        }
    }
}

/// Outcome of one request of an execution: success, its queue time and its end-to-end time.
pub struct RequestOutcome {
    /// Whether it succeeded (a failure here is a backend failure).
    pub ok: bool,
    /// Its batch size.
    pub batch_size: usize,
    /// Time spent queued.
    pub queue: Duration,
    /// Time from arrival to response.
    pub total: Duration,
}

impl ModelStats {
    /// Records one backend execution and the outcome of each of its requests.
    pub fn record_execution(
        &self,
        batch_size: usize,
        times: ComputeTimes,
        outcomes: &[RequestOutcome],
    ) {
        let mut observed = Vec::new();
        let mut s = self
            .inner
            .lock()
            .expect("stats lock poisoned: nothing panics while holding it");
        s.last_inference = now_ms();
        s.execution_count += 1;
        let b = s.batches.entry(batch_size).or_default();
        b[0].add(times.input);
        b[1].add(times.infer);
        b[2].add(times.output);
        for o in outcomes {
            if o.ok {
                s.inference_count += o.batch_size as u64;
                s.success.add(o.total);
                s.queue.add(o.queue);
                s.compute_input.add(times.input);
                s.compute_infer.add(times.infer);
                s.compute_output.add(times.output);
                if self.summaries.is_some() {
                    observed.push([o.total, o.queue, times.input, times.infer, times.output]);
                }
            } else {
                s.fail.add(o.total);
                s.fail_reasons[FailReason::Backend as usize] += 1;
            }
        }
        drop(s);
        if let Some(sum) = &self.summaries {
            let mut sum = sum
                .lock()
                .expect("summaries lock poisoned: nothing panics while holding it");
            for values in observed {
                sum.observe(values);
            }
        }
    }

    /// Records a request answered from the response cache, as Triton does:
    /// a success of `total` with `queue` before the lookup and the lookup's
    /// time as the hit's; no execution, inference or compute time.
    pub fn record_cache_hit(&self, total: Duration, queue: Duration, lookup: Duration) {
        let mut s = self
            .inner
            .lock()
            .expect("stats lock poisoned: nothing panics while holding it");
        s.success.add(total);
        s.queue.add(queue);
        s.cache_hit.add(lookup);
        drop(s);
        self.observe_cache(CACHE_HIT_WINDOW, lookup);
    }

    fn observe_cache(&self, window: usize, took: Duration) {
        if let Some(sum) = &self.summaries {
            sum.lock()
                .expect("summaries lock poisoned: nothing panics while holding it")
                .observe_one(window, took);
        }
    }

    /// Records a cache miss whose lookup and insert took `took` (Triton adds
    /// that time to the request's success time too).
    pub fn record_cache_miss(&self, took: Duration) {
        let mut s = self
            .inner
            .lock()
            .expect("stats lock poisoned: nothing panics while holding it");
        s.cache_miss.add(took);
        s.success.ns += took.as_nanos() as u64;
        drop(s);
        self.observe_cache(CACHE_MISS_WINDOW, took);
    }

    /// Records a successful ensemble request, as Triton does: one execution
    /// of `batch_size`, no queue time of its own, and as compute times the
    /// sum of its composing models' (which count their steps themselves).
    pub fn record_request(&self, batch_size: usize, total: Duration, compute: ComputeTimes) {
        let mut s = self
            .inner
            .lock()
            .expect("stats lock poisoned: nothing panics while holding it");
        s.last_inference = now_ms();
        s.inference_count += batch_size as u64;
        s.execution_count += 1;
        s.success.add(total);
        s.queue.add(Duration::ZERO);
        s.compute_input.add(compute.input);
        s.compute_infer.add(compute.infer);
        s.compute_output.add(compute.output);
        let b = s.batches.entry(batch_size).or_default();
        b[0].add(compute.input);
        b[1].add(compute.infer);
        b[2].add(compute.output);
        drop(s);
        if let Some(sum) = &self.summaries {
            sum.lock()
                .expect("summaries lock poisoned: nothing panics while holding it")
                .observe([
                    total,
                    Duration::ZERO,
                    compute.input,
                    compute.infer,
                    compute.output,
                ]);
        }
    }

    /// Records a request that failed without being executed (invalid, rejected, timed out).
    pub fn record_failure(&self, total: Duration, reason: FailReason) {
        let mut s = self
            .inner
            .lock()
            .expect("stats lock poisoned: nothing panics while holding it");
        s.fail.add(total);
        s.fail_reasons[reason as usize] += 1;
    }

    /// A decoupled request's first response went out `latency` after it arrived.
    pub fn record_first_response(&self, latency: Duration) {
        let mut s = self
            .inner
            .lock()
            .expect("stats lock poisoned: nothing panics while holding it");
        let f = &mut s.first_response;
        let ms = latency.as_secs_f64() * 1000.0;
        for (count, bound) in f.buckets.iter_mut().zip(FIRST_RESPONSE_BUCKETS_MS) {
            if ms <= bound as f64 {
                *count += 1;
            }
        }
        f.count += 1;
        f.sum_us += latency.as_micros() as u64;
    }

    /// A copy of the current values.
    pub fn snapshot(&self) -> Snapshot {
        self.inner
            .lock()
            .expect("stats lock poisoned: nothing panics while holding it")
            .clone()
    }

    /// A copy of the latency summaries (`None` unless summaries are enabled).
    pub fn summaries(&self) -> Option<Summaries> {
        self.summaries.as_ref().map(|s| {
            s.lock()
                .expect("summaries lock poisoned: nothing panics while holding it")
                .clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_triton() {
        let s = ModelStats::default();
        let t = ComputeTimes {
            input: Duration::from_nanos(10),
            infer: Duration::from_nanos(100),
            output: Duration::from_nanos(5),
        };
        let ok = |b| RequestOutcome {
            ok: true,
            batch_size: b,
            queue: Duration::from_nanos(7),
            total: Duration::from_nanos(200),
        };
        s.record_execution(3, t, &[ok(2), ok(1)]);
        s.record_execution(
            1,
            t,
            &[RequestOutcome {
                ok: false,
                batch_size: 1,
                queue: Duration::ZERO,
                total: Duration::from_nanos(50),
            }],
        );
        s.record_failure(Duration::from_nanos(1), FailReason::Rejected);
        let snap = s.snapshot();
        assert_eq!(snap.fail_reasons, [1, 0, 1, 0]);
        assert_eq!(snap.inference_count, 3);
        assert_eq!(snap.execution_count, 2);
        assert_eq!(snap.success, CountNs { count: 2, ns: 400 });
        assert_eq!(snap.fail, CountNs { count: 2, ns: 51 });
        assert_eq!(snap.compute_infer, CountNs { count: 2, ns: 200 });
        assert_eq!(snap.batches[&3][1], CountNs { count: 1, ns: 100 });
    }

    #[test]
    fn ensemble_requests_count_their_composing_compute_time() {
        let s = ModelStats::default();
        let t = ComputeTimes {
            input: Duration::from_nanos(3),
            infer: Duration::from_nanos(30),
            output: Duration::from_nanos(2),
        };
        s.record_request(2, Duration::from_nanos(90), t);
        let snap = s.snapshot();
        assert_eq!(snap.inference_count, 2);
        assert_eq!(snap.execution_count, 1);
        // perf_analyzer finds the version whose queue count grew.
        assert_eq!(snap.queue, CountNs { count: 1, ns: 0 });
        assert_eq!(snap.compute_infer, CountNs { count: 1, ns: 30 });
        assert_eq!(snap.batches[&2][0], CountNs { count: 1, ns: 3 });
    }

    #[test]
    fn summary_window_quantiles() {
        let mut s = Summaries::default();
        assert!(s.quantile(0, 0.5).is_nan());
        for us in 1..=100u64 {
            let d = Duration::from_micros(us);
            s.observe([d, d, d, d, d]);
        }
        assert_eq!(s.quantile(0, 0.0), 1.0);
        assert_eq!(s.quantile(0, 1.0), 100.0);
        assert!((s.quantile(1, 0.5) - 50.5).abs() <= 0.5);
        assert!((s.quantile(4, 0.99) - 99.0).abs() <= 1.0);
    }
}
