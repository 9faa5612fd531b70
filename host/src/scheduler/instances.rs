//! The instance scheduler: one queue per model version, served by the
//! version's instances, each on its own OS thread. Free instances take the
//! next batch from the queue — one request at a time for the default
//! scheduler, Triton's dynamic batcher when `dynamic_batching` is
//! configured ([`super::queue`] decides, [`super::policy`] holds the rules).
//! Responses go back in arrival order when `preserve_ordering` is set.
//! Every request gets exactly one response, including on timeouts, full
//! queues, backend panics and shutdown.
//!
//! A request that finds the model idle (nothing queued or executing), on a
//! model without dynamic batching whose instances may run on any thread and
//! whose last execution was short, runs inline on the async worker that
//! received it: two thread wake-ups (to the instance thread and back) cost
//! more than such an execution.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::deadlines;
use super::instance::{
    create_all, create_instance, execute_batch, gone_error, instance_specs, Executed,
};
use super::policy::{self, BatchPolicy};
use super::queue::{Decision, Pending, Queue};
use super::reorder::{Reorder, Reply};
use super::stats::{FailReason, ModelStats, RequestOutcome};
use super::warmup;
use tern_core::backend::{Instance, Model};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::{InferRequest, InferResponse};

/// Inline execution only while the model's last execution took less than
/// this: the async worker is held for about that long.
const INLINE_MAX_EXEC: Duration = Duration::from_micros(200);
/// ... and only for requests whose inputs are at most this many bytes.
const INLINE_MAX_INPUT_BYTES: usize = 64 * 1024;

/// An instance, locked by whoever executes on it: its own thread, or a
/// request run inline.
struct Slot {
    name: String,
    instance: Mutex<Box<dyn Instance>>,
}

impl Slot {
    fn execute(&self, model: &str, requests: &[InferRequest]) -> Executed {
        // A backend panic is caught inside `execute_batch`, so the lock is never poisoned.
        let mut instance = self.instance.lock().unwrap_or_else(|p| p.into_inner());
        execute_batch(model, &self.name, instance.as_mut(), requests)
    }
}

struct Shared {
    config: Arc<ModelConfig>,
    version: i64,
    policy: BatchPolicy,
    queue: Mutex<QueueState>,
    ready: Condvar,
    reorder: Mutex<Reorder>,
    stats: ModelStats,
    /// The instance threads serving this queue.
    workers: Mutex<Vec<Worker>>,
    /// Handles sharing this queue (more than one after in-place instance changes);
    /// the last one dropped closes the queue and stops the instances.
    handles: AtomicUsize,
    /// The earliest queue deadline the deadline watcher will wake this model
    /// for: one watch per model at a time, not one per request.
    armed: Mutex<Option<Instant>>,
    /// The policy lets requests run inline (one at a time, in arrival order).
    inline_policy: bool,
    /// Duration of the last execution in microseconds (`u64::MAX` before the first).
    last_exec_us: AtomicU64,
}

impl Shared {
    fn new(config: Arc<ModelConfig>, version: i64, policy: BatchPolicy, summaries: bool) -> Shared {
        Shared {
            queue: Mutex::new(QueueState {
                queue: Queue::new(&policy),
                next_seq: 0,
                waiting: 0,
                woken: 0,
                busy: 0,
                borrowed: 0,
                slots: Vec::new(),
            }),
            ready: Condvar::new(),
            reorder: Mutex::new(Reorder::default()),
            stats: ModelStats::new(summaries),
            workers: Mutex::new(Vec::new()),
            handles: AtomicUsize::new(1),
            armed: Mutex::new(None),
            inline_policy: !policy.dynamic
                && !policy.preserve_ordering
                && policy.delay_hook.is_none(),
            last_exec_us: AtomicU64::new(u64::MAX),
            config,
            version,
            policy,
        }
    }
}

struct QueueState {
    queue: Queue,
    next_seq: u64,
    /// Instance threads blocked on `ready`: a new request wakes one only when
    /// there is one to wake (std's futex condvar makes a system call per
    /// notify even without waiters, once per request on the hot path).
    waiting: usize,
    /// Notifications sent to waiting threads that have not woken up yet: one
    /// wake-up per idle thread is enough, however many requests arrive
    /// before it runs.
    woken: usize,
    /// Batches executing, on instance threads or inline.
    busy: usize,
    /// Of those, requests running inline on an async worker.
    borrowed: usize,
    /// The instances that may run a request inline.
    slots: Vec<Arc<Slot>>,
}

impl QueueState {
    /// Bookkeeping for an instance thread returning from a wait (notified,
    /// timed out or spurious: a surplus notification is harmless, a missing
    /// one is not, so `woken` only ever errs low).
    fn woke(&mut self) {
        self.waiting -= 1;
        self.woken = self.woken.saturating_sub(1);
    }

    /// An instance to run `request` on inline, if the model is idle and may do so.
    fn inline_slot(&self, s: &Shared, request: &InferRequest) -> Option<Arc<Slot>> {
        if !s.inline_policy || self.busy > 0 || !self.queue.is_empty() {
            return None;
        }
        if s.last_exec_us.load(Ordering::Relaxed) >= INLINE_MAX_EXEC.as_micros() as u64 {
            return None;
        }
        let bytes: usize = request.inputs.iter().map(|t| t.data.len()).sum();
        if bytes > INLINE_MAX_INPUT_BYTES {
            return None;
        }
        self.slots.first().cloned()
    }
}

/// One instance thread, its instance and its retirement flag.
struct Worker {
    name: String,
    slot: Arc<Slot>,
    retire: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// What a handle needs to create more instances later (instance-only config changes).
struct InstanceSource {
    model: Arc<dyn Model>,
    gpu_count: usize,
    model_dir: PathBuf,
}

/// Starts the thread of one instance.
fn spawn_worker(shared: &Arc<Shared>, name: String, instance: Box<dyn Instance>) -> Result<Worker> {
    let retire = Arc::new(AtomicBool::new(false));
    let anywhere = instance.runs_on_any_thread();
    let slot = Arc::new(Slot {
        name: name.clone(),
        instance: Mutex::new(instance),
    });
    let (for_thread, flag, thread_slot) = (shared.clone(), retire.clone(), slot.clone());
    let thread = std::thread::Builder::new()
        .name(format!("{}:{}", shared.config.name, name))
        .spawn(move || worker(for_thread, thread_slot, flag))
        .map_err(|e| {
            Error::internal(format!("cannot start an instance thread: {e}"))
                .for_model(&shared.config.name)
        })?;
    if anywhere {
        let mut q = shared
            .queue
            .lock()
            .expect("queue lock poisoned: nothing panics while holding it");
        q.slots.push(slot.clone());
    }
    Ok(Worker {
        name,
        slot,
        retire,
        thread,
    })
}

/// The instances of one model version and the queue they serve.
pub struct Pool {
    shared: Arc<Shared>,
    source: InstanceSource,
}

impl Pool {
    /// Creates every instance of every `instance_group`, runs the warmup samples on
    /// each, and starts their threads. Fails (and starts nothing) if any instance
    /// cannot be created or warmed up.
    pub fn start(
        config: Arc<ModelConfig>,
        version: i64,
        model: Arc<dyn Model>,
        gpu_count: usize,
        model_dir: &Path,
        summaries: bool,
    ) -> Result<Pool> {
        let policy = BatchPolicy::from_config(&config, model.supports_ragged())?;
        if !model.supports_ragged() && config.input.iter().any(|i| i.allow_ragged_batch) {
            tracing::warn!(model = %config.name, "allow_ragged_batch is ignored: this backend batches only requests whose shapes match");
        }
        let instances = create_all(&config, version, &model, gpu_count, model_dir)?;
        let shared = Arc::new(Shared::new(config.clone(), version, policy, summaries));
        for (name, instance) in instances {
            match spawn_worker(&shared, name, instance) {
                Ok(w) => shared
                    .workers
                    .lock()
                    .expect("workers lock poisoned: nothing panics while holding it")
                    .push(w),
                Err(e) => {
                    stop(&shared);
                    return Err(e);
                }
            }
        }
        Ok(Pool {
            shared,
            source: InstanceSource {
                model,
                gpu_count,
                model_dir: model_dir.to_path_buf(),
            },
        })
    }

    /// The same version serving `config`, which differs from this handle's
    /// only in `instance_group`: instances that the new config still names
    /// keep running, missing ones are created and warmed up first, surplus
    /// ones finish their batch and stop. Both handles share the queue and the
    /// instances, so requests holding either are served; the last of them
    /// dropped stops everything.
    pub fn resized(&self, config: Arc<ModelConfig>) -> Result<Pool> {
        let src = &self.source;
        let version = self.shared.version;
        let specs = instance_specs(&config, src.gpu_count)?;
        let samples = warmup::samples(&config, &src.model_dir)?;
        let mut current = self
            .shared
            .workers
            .lock()
            .expect("workers lock poisoned: nothing panics while holding it");
        let mut added = Vec::new();
        for spec in specs
            .iter()
            .filter(|s| !current.iter().any(|w| w.name == s.name))
        {
            let instance = create_instance(&config, version, &src.model, spec, &samples)?;
            added.push((spec.name.clone(), instance));
        }
        let mut workers = Vec::new();
        for (name, instance) in added {
            workers.push(spawn_worker(&self.shared, name, instance)?);
        }
        let (kept, retired): (Vec<Worker>, Vec<Worker>) = std::mem::take(&mut *current)
            .into_iter()
            .partition(|w| specs.iter().any(|s| s.name == w.name));
        for w in &retired {
            w.retire.store(true, Ordering::Relaxed);
        }
        self.shared
            .queue
            .lock()
            .expect("queue lock poisoned: nothing panics while holding it")
            .slots
            .retain(|slot| !retired.iter().any(|w| Arc::ptr_eq(slot, &w.slot)));
        self.shared.ready.notify_all();
        for w in retired {
            let _ = w.thread.join();
        }
        workers.extend(kept);
        tracing::info!(model = %config.name, version, "instances adjusted in place: {} running", workers.len());
        *current = workers;
        self.shared.handles.fetch_add(1, Ordering::SeqCst);
        Ok(Pool {
            shared: self.shared.clone(),
            source: InstanceSource {
                model: src.model.clone(),
                gpu_count: src.gpu_count,
                model_dir: src.model_dir.clone(),
            },
        })
    }

    /// Queues a validated request for this version's instances and waits for its response.
    pub async fn schedule(
        &self,
        request: InferRequest,
        batch_size: usize,
        level: u64,
        timeout: Option<std::time::Duration>,
        arrived: Instant,
    ) -> Result<InferResponse> {
        let s = &self.shared;
        let (reply, rx) = oneshot::channel();
        let wake = {
            let mut q = s
                .queue
                .lock()
                .expect("queue lock poisoned: nothing panics while holding it");
            if q.queue.closed {
                drop(q);
                s.stats
                    .record_failure(arrived.elapsed(), FailReason::Rejected);
                return Err(gone(s));
            }
            if let Some(slot) = q.inline_slot(s, &request) {
                q.busy += 1;
                q.borrowed += 1;
                drop(q);
                return run_inline(s, &slot, request, batch_size, arrived);
            }
            let deadline = timeout.map(|t| arrived + t);
            let reject_at = deadline
                .filter(|_| s.policy.level_policy(level).on_timeout == policy::OnTimeout::Reject);
            let pending = Pending {
                request,
                batch_size,
                level,
                enqueued: arrived,
                deadline,
                seq: q.next_seq,
                reply,
            };
            if q.queue.push(pending, &s.policy).is_err() {
                drop(q);
                s.stats
                    .record_failure(arrived.elapsed(), FailReason::Rejected);
                return Err(tern_core::messages::queue_full(&s.config.name, level));
            }
            q.next_seq += 1;
            if let Some(at) = reject_at {
                // Instances may all be busy when it passes: the watcher answers it on time.
                arm(s, at);
            }
            // While a request runs inline, its end wakes an instance thread if one is needed.
            let wake = q.waiting > q.woken && q.borrowed == 0;
            if wake {
                q.woken += 1;
            }
            wake
        };
        if wake {
            s.ready.notify_one();
        }
        rx.await.map_err(|_| gone(s))?
    }

    /// The batching rules of this pool.
    pub fn policy(&self) -> &BatchPolicy {
        &self.shared.policy
    }

    /// Statistics of this version.
    pub fn stats(&self) -> &ModelStats {
        &self.shared.stats
    }

    /// Requests waiting in the queue (not yet executing).
    pub fn pending(&self) -> usize {
        self.shared
            .queue
            .lock()
            .expect("queue lock poisoned: nothing panics while holding it")
            .queue
            .len()
    }

    /// Stops accepting requests, lets queued ones finish and joins the instance threads.
    pub fn shutdown(&self) {
        stop(&self.shared);
    }
}

/// The error of a request the version can no longer serve.
fn gone(s: &Shared) -> Error {
    gone_error(&s.config.name, s.version)
}

fn close(shared: &Shared) {
    shared
        .queue
        .lock()
        .expect("queue lock poisoned: nothing panics while holding it")
        .queue
        .closed = true;
    shared.ready.notify_all();
}

impl Drop for Pool {
    /// The last pool of a queue is gone (unloaded or replaced, in-flight
    /// requests done): the instance threads drain and exit; they are joined
    /// off the caller's thread so an async task never blocks on an
    /// instance's teardown.
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        close(&self.shared);
        let workers = std::mem::take(
            &mut *self
                .shared
                .workers
                .lock()
                .expect("workers lock poisoned: nothing panics while holding it"),
        );
        if !workers.is_empty() {
            let name = format!("{}:reaper", self.shared.config.name);
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                for w in workers {
                    let _ = w.thread.join();
                }
            });
            if let Err(e) = spawned {
                tracing::warn!(model = %self.shared.config.name, "cannot start a thread to join the instances: {e}");
            }
        }
    }
}

/// Closes the queue and joins every instance thread (queued requests finish first).
fn stop(shared: &Shared) {
    close(shared);
    let workers = std::mem::take(
        &mut *shared
            .workers
            .lock()
            .expect("workers lock poisoned: nothing panics while holding it"),
    );
    for w in workers {
        let _ = w.thread.join();
    }
}

/// Sends a response, in arrival order when `preserve_ordering` is set.
fn deliver(s: &Shared, seq: u64, reply: Reply, result: Result<InferResponse>) {
    Reorder::deliver(&s.reorder, s.policy.preserve_ordering, seq, reply, result);
}

/// Answers requests whose queue timeout expired (REJECT) with Triton's error.
fn reject_expired(s: &Shared, expired: Vec<Pending>) {
    for p in expired {
        s.stats
            .record_failure(p.enqueued.elapsed(), FailReason::Rejected);
        let e = tern_core::messages::request_timeout(&s.config.name);
        deliver(s, p.seq, p.reply, Err(e));
    }
}

/// Asks the deadline watcher to wake `s` at `at`, unless it will wake it
/// earlier already.
fn arm(s: &Arc<Shared>, at: Instant) {
    let mut armed = s
        .armed
        .lock()
        .expect("armed lock poisoned: nothing panics while holding it");
    if armed.is_none_or(|a| at < a) {
        *armed = Some(at);
        deadlines::watch(at, Arc::downgrade(s) as Weak<dyn deadlines::Expire>);
    }
}

impl deadlines::Expire for Shared {
    fn expire_now(self: Arc<Self>) {
        let now = Instant::now();
        let (expired, next) = {
            let mut q = self
                .queue
                .lock()
                .expect("queue lock poisoned: nothing panics while holding it");
            let expired = q.queue.expire(&self.policy, now);
            (expired, q.queue.next_reject_deadline(&self.policy))
        };
        {
            let mut armed = self
                .armed
                .lock()
                .expect("armed lock poisoned: nothing panics while holding it");
            if armed.is_some_and(|a| a <= now) {
                *armed = None;
            }
        }
        if let Some(next) = next {
            arm(&self, next);
        }
        reject_expired(&self, expired);
    }
}

/// Waits for the next batch; `None` when the model is closed and drained, or
/// this instance retires. `finished`: the caller's previous batch is done.
fn next_batch(s: &Shared, retire: &AtomicBool, finished: bool) -> Option<Vec<Pending>> {
    let mut q = s
        .queue
        .lock()
        .expect("queue lock poisoned: nothing panics while holding it");
    if finished {
        q.busy -= 1;
    }
    loop {
        if retire.load(Ordering::Relaxed) {
            return None;
        }
        let now = Instant::now();
        let expired = q.queue.expire(&s.policy, now);
        if !expired.is_empty() {
            drop(q);
            reject_expired(s, expired);
            q = s
                .queue
                .lock()
                .expect("queue lock poisoned: nothing panics while holding it");
            continue;
        }
        let cancelled = q.queue.cancelled();
        if !cancelled.is_empty() {
            drop(q);
            for p in cancelled {
                tracing::debug!(
                    model = %s.config.name,
                    id = %p.request.id,
                    "request cancelled by its client before it executed"
                );
                s.stats
                    .record_failure(p.enqueued.elapsed(), FailReason::Canceled);
                // Nobody receives this, but `preserve_ordering` must see the sequence number pass.
                let e = Error::new(
                    tern_core::error::Code::Cancelled,
                    format!("request for model '{}' was cancelled", s.config.name),
                );
                deliver(s, p.seq, p.reply, Err(e));
            }
            q = s
                .queue
                .lock()
                .expect("queue lock poisoned: nothing panics while holding it");
            continue;
        }
        if q.queue.is_empty() && q.queue.closed {
            return None;
        }
        match q.queue.decide(&s.policy, now) {
            Decision::Send(n) => {
                q.busy += 1;
                return Some(q.queue.take(n));
            }
            Decision::Wait(None) => {
                q.waiting += 1;
                q = s
                    .ready
                    .wait(q)
                    .expect("queue lock poisoned: nothing panics while holding it");
                q.woke();
            }
            Decision::Wait(Some(until)) => {
                let wait = until.saturating_duration_since(Instant::now());
                q.waiting += 1;
                q = s
                    .ready
                    .wait_timeout(q, wait)
                    .expect("queue lock poisoned: nothing panics while holding it")
                    .0;
                q.woke();
            }
        }
    }
}

/// Records an execution's statistics and gives each response its compute
/// times; `requests` holds (arrival, batch size) per request.
fn finish(
    s: &Shared,
    requests: &[(Instant, usize)],
    executed: Executed,
) -> Vec<Result<InferResponse>> {
    let Executed {
        mut results,
        times,
        start,
    } = executed;
    let done = Instant::now();
    let exec_us = u64::try_from((done - start).as_micros()).unwrap_or(u64::MAX);
    s.last_exec_us.store(exec_us, Ordering::Relaxed);
    let outcomes: Vec<RequestOutcome> = requests
        .iter()
        .zip(&results)
        .map(|((enqueued, b), r)| RequestOutcome {
            ok: r.is_ok(),
            batch_size: *b,
            queue: start.saturating_duration_since(*enqueued),
            total: done - *enqueued,
        })
        .collect();
    let size = requests.iter().map(|(_, b)| b).sum();
    s.stats.record_execution(size, times, &outcomes);
    for r in results.iter_mut().flatten() {
        r.compute = times;
    }
    results
}

/// Logs a batch about to execute (debug level).
fn log_batch<'a>(s: &Shared, instance: &str, size: usize, ids: impl Iterator<Item = &'a str>) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        let ids: Vec<&str> = ids.map(|id| if id.is_empty() { "-" } else { id }).collect();
        tracing::debug!(
            "executing model={} version={} instance={instance} batch_size={size} requests={} ids=[{}]",
            s.config.name,
            s.version,
            ids.len(),
            ids.join(",")
        );
    }
}

/// Runs one request on `slot` on the calling (async) thread; the caller has
/// counted it in `busy` and `borrowed`.
fn run_inline(
    s: &Shared,
    slot: &Slot,
    request: InferRequest,
    batch_size: usize,
    arrived: Instant,
) -> Result<InferResponse> {
    log_batch(
        s,
        &slot.name,
        batch_size,
        std::iter::once(request.id.as_str()),
    );
    let requests = [request];
    let executed = slot.execute(&s.config.name, &requests);
    let wake = {
        let mut q = s
            .queue
            .lock()
            .expect("queue lock poisoned: nothing panics while holding it");
        q.busy -= 1;
        q.borrowed -= 1;
        // Requests that arrived meanwhile were queued without waking anyone.
        let wake = !q.queue.is_empty() && q.waiting > q.woken;
        if wake {
            q.woken += 1;
        }
        wake
    };
    if wake {
        s.ready.notify_one();
    }
    finish(s, &[(arrived, batch_size)], executed)
        .pop()
        .unwrap_or_else(|| Err(Error::internal("an execution returned no result")))
}

fn worker(s: Arc<Shared>, slot: Arc<Slot>, retire: Arc<AtomicBool>) {
    let mut finished = false;
    while let Some(batch) = next_batch(&s, &retire, std::mem::replace(&mut finished, true)) {
        let size: usize = batch.iter().map(|p| p.batch_size).sum();
        log_batch(
            &s,
            &slot.name,
            size,
            batch.iter().map(|p| p.request.id.as_str()),
        );
        let mut metas = Vec::with_capacity(batch.len());
        let mut arrivals = Vec::with_capacity(batch.len());
        let mut requests = Vec::with_capacity(batch.len());
        for p in batch {
            metas.push((p.seq, p.reply));
            arrivals.push((p.enqueued, p.batch_size));
            requests.push(p.request);
        }
        let executed = slot.execute(&s.config.name, &requests);
        let results = finish(&s, &arrivals, executed);
        for ((seq, reply), result) in metas.into_iter().zip(results) {
            deliver(&s, seq, reply, result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::backend::{ExecTiming, InstanceSpec};
    use tern_core::config::parse_pbtxt;

    fn shared(preserve: bool) -> Shared {
        let cfg = parse_pbtxt(&format!(
            "name: \"m\" max_batch_size: 4 input [{{name: \"X\" data_type: TYPE_FP32 dims: [1]}}] dynamic_batching {{ preserve_ordering: {preserve} }}"
        ))
        .unwrap();
        let policy = BatchPolicy::from_config(&cfg, false).unwrap();
        Shared::new(Arc::new(cfg), 1, policy, false)
    }

    fn response(id: &str) -> Result<InferResponse> {
        Ok(InferResponse {
            id: id.into(),
            ..Default::default()
        })
    }

    #[test]
    fn preserve_ordering_releases_in_arrival_order() {
        let s = shared(true);
        let (t0, mut r0) = oneshot::channel();
        let (t1, mut r1) = oneshot::channel();
        let (t2, mut r2) = oneshot::channel();
        deliver(&s, 2, t2, response("c"));
        deliver(&s, 1, t1, Err(Error::unavailable("timed out")));
        assert!(
            r1.try_recv().is_err() && r2.try_recv().is_err(),
            "held until request 0 is done"
        );
        deliver(&s, 0, t0, response("a"));
        assert_eq!(r0.try_recv().unwrap().unwrap().id, "a");
        assert!(r1.try_recv().unwrap().is_err());
        assert_eq!(r2.try_recv().unwrap().unwrap().id, "c");
    }

    fn identity_pool(extra: &str) -> Arc<Pool> {
        use crate::backends::Registry;
        use tern_core::backend::{BackendSettings, LoadContext};
        let cfg = Arc::new(
            parse_pbtxt(&format!(
                "name: \"id\" backend: \"identity\" max_batch_size: 8 \
                 input [{{name: \"X\" data_type: TYPE_INT32 dims: [1]}}] \
                 output [{{name: \"Y\" data_type: TYPE_INT32 dims: [1]}}] \
                 instance_group [{{kind: KIND_CPU count: 2}}] {extra}"
            ))
            .unwrap(),
        );
        let dir = std::env::temp_dir();
        let model = Registry::default()
            .get("identity")
            .unwrap()
            .load(&LoadContext {
                config: &cfg,
                version: 1,
                version_dir: &dir,
                settings: &BackendSettings::default(),
                models: tern_core::router::unrouted(),
                progress: &Default::default(),
                gate: &tern_core::backend::plain_files(),
            })
            .unwrap();
        Arc::new(Pool::start(cfg, 1, model, 0, &dir, false).unwrap())
    }

    /// Many concurrent callers against two instances: every request is
    /// answered (a lost wake-up would leave one waiting until the timeout),
    /// with its own data, and once idle both threads wait with no
    /// notification outstanding and nothing counted as executing. Run with
    /// the dynamic batcher and without it (where idle moments run requests
    /// inline, mixed with the instance threads).
    #[test]
    fn wake_ups_are_never_lost_under_concurrency() {
        use tern_core::{DataType, Tensor};
        for extra in ["dynamic_batching { max_queue_delay_microseconds: 100 }", ""] {
            let handle = identity_pool(extra);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                let tasks: Vec<_> = (0..16i32)
                    .map(|t| {
                        let h = handle.clone();
                        tokio::spawn(async move {
                            for i in 0..300i32 {
                                let v = t * 1000 + i;
                                let request = InferRequest {
                                    model_name: "id".into(),
                                    inputs: vec![Tensor::new(
                                        "X",
                                        DataType::Int32,
                                        vec![1, 1],
                                        v.to_le_bytes().to_vec(),
                                    )],
                                    ..Default::default()
                                };
                                let (level, timeout) = h.policy().placement(&request).unwrap();
                                let r = h
                                    .schedule(request, 1, level, timeout, Instant::now())
                                    .await
                                    .unwrap();
                                assert_eq!(&r.outputs[0].data[..], &v.to_le_bytes()[..]);
                                if i % 50 == 0 {
                                    // Let the instance threads go idle now and then.
                                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                                }
                            }
                        })
                    })
                    .collect();
                let all = async {
                    for t in tasks {
                        t.await.unwrap();
                    }
                };
                tokio::time::timeout(std::time::Duration::from_secs(60), all)
                    .await
                    .expect("a request was never answered");
            });
            let idle = std::time::Instant::now();
            loop {
                let q = handle.shared.queue.lock().unwrap();
                if q.waiting == 2 && q.woken == 0 {
                    assert_eq!((q.busy, q.borrowed), (0, 0), "{extra}");
                    break;
                }
                drop(q);
                assert!(
                    idle.elapsed().as_secs() < 10,
                    "instance threads never went idle ({extra})"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }

    /// A model that answers with the name of the thread that ran it.
    struct ThreadEcho(bool);

    impl Model for ThreadEcho {
        fn create_instance(&self, _: &InstanceSpec) -> Result<Box<dyn Instance>> {
            Ok(Box::new(ThreadEcho(self.0)))
        }
    }

    impl Instance for ThreadEcho {
        fn execute(
            &mut self,
            batch: &[InferRequest],
            _: &mut ExecTiming,
        ) -> Vec<Result<InferResponse>> {
            let name = std::thread::current().name().unwrap_or("-").to_string();
            batch.iter().map(|_| response(&name)).collect()
        }

        fn runs_on_any_thread(&self) -> bool {
            self.0
        }
    }

    /// The threads that ran five requests sent one after another.
    fn threads_of(anywhere: bool, extra: &str) -> Vec<String> {
        let cfg = Arc::new(
            parse_pbtxt(&format!(
                "name: \"echo\" max_batch_size: 4 input [{{name: \"X\" data_type: TYPE_FP32 dims: [1]}}] \
                 instance_group [{{kind: KIND_CPU count: 1}}] {extra}"
            ))
            .unwrap(),
        );
        let dir = std::env::temp_dir();
        let pool = Pool::start(cfg, 1, Arc::new(ThreadEcho(anywhere)), 0, &dir, false).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let threads = rt.block_on(async {
            let mut threads = Vec::new();
            for _ in 0..5 {
                let r = pool
                    .schedule(InferRequest::default(), 1, 1, None, Instant::now())
                    .await
                    .unwrap();
                threads.push(r.id);
                // The instance thread counts itself idle just after it answers.
                while pool.shared.queue.lock().unwrap().busy > 0 {
                    std::thread::yield_now();
                }
            }
            threads
        });
        assert_eq!(pool.stats().snapshot().inference_count, 5);
        threads
    }

    #[test]
    fn an_idle_fast_model_runs_requests_on_the_callers_thread() {
        let me = std::thread::current().name().unwrap().to_string();
        let threads = threads_of(true, "");
        // The first execution's duration is unknown: it goes to the instance thread.
        let on_instance_thread = |t: &String| t.starts_with("echo:");
        assert!(on_instance_thread(&threads[0]), "{threads:?}");
        assert!(threads[1..].iter().all(|t| *t == me), "{threads:?}");
        // Not for instances tied to their thread, nor under the dynamic batcher.
        let tied = threads_of(false, "");
        assert!(tied.iter().all(on_instance_thread), "{tied:?}");
        let batched = threads_of(true, "dynamic_batching {}");
        assert!(batched.iter().all(on_instance_thread), "{batched:?}");
    }

    #[test]
    fn without_preserve_ordering_responses_go_at_once() {
        let s = shared(false);
        let (t1, mut r1) = oneshot::channel();
        deliver(&s, 1, t1, response("b"));
        assert_eq!(r1.try_recv().unwrap().unwrap().id, "b");
    }
}
