//! Triton's sequence batcher (`sequence_batching`) for stateful models:
//! every request names its sequence (correlation id, START/END flags), all
//! requests of a sequence run in order on the instance whose slot the
//! sequence holds, the model gets the control inputs the config declares,
//! and implicit state travels from one request's state output to the next
//! request's state input. With `iterative_sequence` every request is a
//! sequence of its own (an implicit correlation id when it has none), which
//! ends with it. [`book`] keeps the slots, backlog and strategies,
//! [`control`] builds the control and state tensors; this module runs one
//! OS thread per instance, each forming its own batches.

pub mod book;
pub mod control;

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::instance::{create_all, execute_batch, gone_error, Executed};
use super::policy::BatchPolicy;
use super::reorder::{Reorder, Reply};
use super::stats::{FailReason, ModelStats, RequestOutcome};
use book::{Book, Entry, Next, Queued, Strategy};
use control::{Controls, Position};
use tern_core::backend::{Instance, Model};
use tern_core::config::pb::model_sequence_batching::StrategyChoice;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::messages;
use tern_core::sequence::{batching, CorrelationId};
use tern_core::{InferRequest, InferResponse};

/// A queued request of a sequence.
struct Item {
    request: InferRequest,
    start: bool,
    end: bool,
    enqueued: Instant,
    /// Arrival number, for `oldest { preserve_ordering }`.
    seq: u64,
    /// When its `timeout` parameter ends (honoured while its sequence is in the backlog).
    expires: Option<Instant>,
    reply: Reply,
}

impl Queued for Item {
    fn enqueued(&self) -> Instant {
        self.enqueued
    }
    fn batches_with(&self, other: &Self) -> bool {
        let (a, b) = (&self.request, &other.request);
        a.inputs.len() == b.inputs.len()
            && a.inputs.iter().all(|ta| {
                b.input(&ta.name)
                    .is_some_and(|tb| ta.shape == tb.shape && ta.dtype == tb.dtype)
            })
    }
    fn cancelled(&self) -> bool {
        self.reply.is_closed()
    }
    fn expires(&self) -> Option<Instant> {
        self.expires
    }
}

struct State {
    book: Book<Item>,
    next_seq: u64,
    /// The last implicit correlation id given (`iterative_sequence`).
    implicit: u64,
    closed: bool,
}

struct Shared {
    config: Arc<ModelConfig>,
    version: i64,
    policy: BatchPolicy,
    controls: Controls,
    /// `iterative_sequence`: every request is a sequence of its own, which
    /// the backend may run through `execute` several times (Triton's
    /// request rescheduling); one without a correlation id gets one.
    iterative: bool,
    state: Mutex<State>,
    /// One per instance: its thread waits here for requests of its sequences.
    wake: Vec<Condvar>,
    reorder: Mutex<Reorder>,
    preserve_ordering: bool,
    stats: ModelStats,
}

/// The instances of a sequence model and their sequences.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// Creates and warms up every instance, then starts one thread per instance.
    pub fn start(
        config: Arc<ModelConfig>,
        version: i64,
        model: Arc<dyn Model>,
        gpu_count: usize,
        model_dir: &Path,
        summaries: bool,
    ) -> Result<Pool> {
        let sb = batching(&config)
            .ok_or_else(|| Error::internal("the sequence batcher needs sequence_batching"))?;
        let controls = Controls::new(&config, model_dir)?;
        let policy = BatchPolicy::from_config(&config, false)?;
        let max_batch = config.max_batch_size.max(1) as usize;
        let (strategy, slots, preserve_ordering) = match &sb.strategy_choice {
            Some(StrategyChoice::Oldest(o)) => {
                let mut preferred: Vec<usize> =
                    o.preferred_batch_size.iter().map(|&p| p as usize).collect();
                if preferred.is_empty() {
                    preferred.push(max_batch);
                }
                let candidates = if o.max_candidate_sequences > 0 {
                    o.max_candidate_sequences as usize
                } else {
                    max_batch
                };
                (
                    Strategy::Oldest {
                        max_batch,
                        preferred,
                        max_delay: Duration::from_micros(o.max_queue_delay_microseconds),
                    },
                    candidates,
                    o.preserve_ordering,
                )
            }
            Some(StrategyChoice::Direct(d)) => (
                Strategy::Direct {
                    max_delay: Duration::from_micros(d.max_queue_delay_microseconds),
                    min_utilization: d.minimum_slot_utilization,
                },
                max_batch,
                false,
            ),
            None => (
                Strategy::Direct {
                    max_delay: Duration::ZERO,
                    min_utilization: 0.0,
                },
                max_batch,
                false,
            ),
        };
        let idle = Duration::from_micros(sb.max_sequence_idle_microseconds);
        let instances = create_all(&config, version, &model, gpu_count, model_dir)?;
        let book = Book::new(
            instances.len(),
            slots,
            strategy,
            idle,
            controls.state_count(),
        );
        let shared = Arc::new(Shared {
            wake: instances.iter().map(|_| Condvar::new()).collect(),
            state: Mutex::new(State {
                book,
                next_seq: 0,
                implicit: 0,
                closed: false,
            }),
            reorder: Mutex::new(Reorder::default()),
            preserve_ordering,
            stats: ModelStats::new(summaries),
            controls,
            iterative: sb.iterative_sequence,
            policy,
            config,
            version,
        });
        let pool = Pool {
            shared: shared.clone(),
            threads: Mutex::new(Vec::new()),
        };
        for (index, (name, instance)) in instances.into_iter().enumerate() {
            let s = shared.clone();
            let thread_name = format!("{}:{}", s.config.name, name);
            let spawned = std::thread::Builder::new()
                .name(thread_name)
                .spawn(move || worker(s, index, name, instance));
            match spawned {
                Ok(t) => pool
                    .threads
                    .lock()
                    .expect("threads lock poisoned: nothing panics while holding it")
                    .push(t),
                Err(e) => {
                    pool.shutdown();
                    return Err(
                        Error::internal(format!("cannot start an instance thread: {e}"))
                            .for_model(&shared.config.name),
                    );
                }
            }
        }
        Ok(pool)
    }

    /// Queues a validated request on its sequence and waits for its response.
    pub async fn schedule(
        &self,
        request: InferRequest,
        batch_size: usize,
        arrived: Instant,
    ) -> Result<InferResponse> {
        let s = &self.shared;
        let m = &s.config.name;
        let refused = |e: Error| {
            s.stats.record_failure(arrived.elapsed(), FailReason::Other);
            Err(e)
        };
        if s.config.max_batch_size > 0 && batch_size != 1 {
            return refused(messages::sequence_batch_size_one(m));
        }
        let mut request = request;
        let mut flags = match request.sequence() {
            Ok(f) => f,
            Err(e) => return refused(e),
        };
        if s.iterative && flags.id.is_none() {
            // As Triton's iterative sequencer: a sequence of its own, under
            // the next implicit id, starting here.
            let id = s.implicit_id();
            request
                .parameters
                .insert("sequence_id".into(), tern_core::Parameter::Int(id as i64));
            request
                .parameters
                .insert("sequence_start".into(), tern_core::Parameter::Bool(true));
            request.parameters.remove("sequence_end");
            flags.id = Some(CorrelationId::Number(id));
            flags.start = true;
        }
        // An iterative sequence is its one request: it holds its slot while
        // the backend reschedules it and ends once it is answered (see
        // `worker`), whatever its END flag says.
        let closes = flags.end && !s.iterative;
        let Some(id) = flags.id else {
            return refused(messages::sequence_correlation_id_required(m));
        };
        if let Err(e) = s.controls.check_corrid(m, &id) {
            return refused(e);
        }
        let (reply, rx) = oneshot::channel();
        {
            let mut st = s
                .state
                .lock()
                .expect("sequence lock poisoned: nothing panics while holding it");
            if st.closed {
                drop(st);
                s.stats
                    .record_failure(arrived.elapsed(), FailReason::Rejected);
                return Err(gone_error(m, s.version));
            }
            let expires = match request.parameters.get("timeout") {
                Some(tern_core::Parameter::Int(t)) if *t > 0 => {
                    Some(arrived + Duration::from_micros(*t as u64))
                }
                _ => None,
            };
            let item = Item {
                request,
                start: flags.start,
                end: flags.end,
                enqueued: arrived,
                seq: st.next_seq,
                expires,
                reply,
            };
            match st.book.enqueue(&id, flags.start, closes, item, arrived) {
                Ok(placed) => {
                    st.next_seq += 1;
                    if placed.restarted {
                        tracing::warn!(
                            "sequence {id} for model '{m}' has a conflict. The previous sequence did not end before this sequence start. Previous sequence will be terminated early."
                        );
                    }
                    match placed.instance {
                        Some(i) => s.wake[i].notify_one(),
                        // Any instance's thread sweeps the backlog: one must
                        // wake in time for this request's timeout.
                        // The deadline watcher answers it on time, even while
                        // every instance is busy.
                        None => {
                            if let Some(at) = expires {
                                super::deadlines::watch(
                                    at,
                                    Arc::downgrade(s)
                                        as std::sync::Weak<dyn super::deadlines::Expire>,
                                );
                            }
                        }
                    }
                }
                Err(_) => {
                    drop(st);
                    return refused(messages::sequence_start_required(&id.to_string(), m));
                }
            }
        }
        rx.await.map_err(|_| gone_error(m, s.version))?
    }

    /// The request rules of this model (priorities and timeouts do not apply to sequences).
    pub fn policy(&self) -> &BatchPolicy {
        &self.shared.policy
    }

    /// Statistics of this version.
    pub fn stats(&self) -> &ModelStats {
        &self.shared.stats
    }

    /// Requests waiting (in sequence slots and in the backlog).
    pub fn pending(&self) -> usize {
        self.shared
            .state
            .lock()
            .expect("sequence lock poisoned: nothing panics while holding it")
            .book
            .queued()
    }

    /// Sequences holding a slot or waiting in the backlog.
    pub fn sequences(&self) -> usize {
        self.shared
            .state
            .lock()
            .expect("sequence lock poisoned: nothing panics while holding it")
            .book
            .sequences()
    }

    /// Stops accepting requests, answers the backlog, lets queued requests
    /// finish and joins the instance threads.
    pub fn shutdown(&self) {
        close(&self.shared);
        for t in std::mem::take(
            &mut *self
                .threads
                .lock()
                .expect("threads lock poisoned: nothing panics while holding it"),
        ) {
            let _ = t.join();
        }
    }
}

impl Drop for Pool {
    /// The version is gone (unloaded, replaced): queued requests finish, the
    /// threads exit on their own (joined nowhere, so no caller blocks).
    fn drop(&mut self) {
        close(&self.shared);
    }
}

fn close(s: &Shared) {
    let backlog = {
        let mut st = s
            .state
            .lock()
            .expect("sequence lock poisoned: nothing panics while holding it");
        st.closed = true;
        st.book.drain_backlog()
    };
    for w in &s.wake {
        w.notify_all();
    }
    for item in backlog {
        s.stats
            .record_failure(item.enqueued.elapsed(), FailReason::Rejected);
        deliver(
            s,
            item.seq,
            item.reply,
            Err(gone_error(&s.config.name, s.version)),
        );
    }
}

fn deliver(s: &Shared, seq: u64, reply: Reply, result: Result<InferResponse>) {
    Reorder::deliver(&s.reorder, s.preserve_ordering, seq, reply, result);
}

/// A batch row once its request is built.
struct Row {
    key: book::SeqKey,
    start: bool,
    seq: u64,
    enqueued: Instant,
    reply: Reply,
}

/// Waits for instance `i`'s next batch, releasing idle sequences meanwhile;
/// `None` once the model is closed and this instance's sequences are drained.
fn next_batch(s: &Shared, i: usize) -> Option<(Vec<Option<Row>>, Vec<InferRequest>)> {
    let m = &s.config.name;
    let mut st = s
        .state
        .lock()
        .expect("sequence lock poisoned: nothing panics while holding it");
    let batch = loop {
        let now = Instant::now();
        for id in st.book.reap(i, now) {
            tracing::info!(model = %m, "sequence {id} released after {} µs idle", idle_us(s));
        }
        let swept = st.book.sweep(i, now);
        if !swept.cancelled.is_empty() || !swept.expired.is_empty() {
            drop(st);
            answer_swept(s, Some(i), swept);
            st = s
                .state
                .lock()
                .expect("sequence lock poisoned: nothing panics while holding it");
            continue;
        }
        if st.closed && st.book.drained(i) {
            return None;
        }
        match st.book.next(i, now) {
            Next::Batch(b) => break b,
            Next::Wait(None) => {
                st = s.wake[i]
                    .wait(st)
                    .expect("sequence lock poisoned: nothing panics while holding it")
            }
            Next::Wait(Some(until)) => {
                let wait = until.saturating_duration_since(Instant::now());
                st = s.wake[i]
                    .wait_timeout(st, wait)
                    .expect("sequence lock poisoned: nothing panics while holding it")
                    .0;
            }
        }
    };
    let mut rows = Vec::with_capacity(batch.len());
    let mut requests = Vec::with_capacity(batch.len());
    let mut nulls = Vec::new();
    for (pos, entry) in batch.into_iter().enumerate() {
        match entry {
            Entry::Request { seq: key, item } => {
                let mut request = item.request;
                let at = Position {
                    start: item.start,
                    end: item.end,
                    ready: true,
                };
                let id: Option<CorrelationId> = st.book.id(key).cloned();
                s.controls.add_controls(&mut request, at, id.as_ref());
                s.controls
                    .add_states(&mut request, &st.book.state(key, item.start));
                requests.push(request);
                rows.push(Some(Row {
                    key,
                    start: item.start,
                    seq: item.seq,
                    enqueued: item.enqueued,
                    reply: item.reply,
                }));
            }
            Entry::Null => {
                nulls.push(pos);
                requests.push(InferRequest::default());
                rows.push(None);
            }
        }
    }
    drop(st);
    if !nulls.is_empty() {
        let like = rows
            .iter()
            .position(Option::is_some)
            .map(|p| requests[p].clone())
            .expect("a batch has a request");
        for pos in nulls {
            requests[pos] = s.controls.null_request(&like);
        }
    }
    Some((rows, requests))
}

/// Answers what [`Book::sweep`] took out: every request of a cancelled
/// sequence CANCELLED, every request of a backlog sequence whose timeout
/// passed with Triton's UNAVAILABLE text; wakes the instances that got a
/// backlog sequence.
fn answer_swept(s: &Shared, i: Option<usize>, swept: book::Swept<Item>) {
    let m = &s.config.name;
    for item in swept.cancelled {
        s.stats
            .record_failure(item.enqueued.elapsed(), FailReason::Canceled);
        let e = Error::new(
            tern_core::Code::Cancelled,
            format!(
                "request to model '{m}' was cancelled: a request of its sequence was cancelled"
            ),
        );
        deliver(s, item.seq, item.reply, Err(e));
    }
    for item in swept.expired {
        s.stats
            .record_failure(item.enqueued.elapsed(), FailReason::Rejected);
        let e = Error::unavailable("timeout of the corresponding sequence has been expired");
        deliver(s, item.seq, item.reply, Err(e));
    }
    for other in swept.moved {
        if Some(other) != i {
            s.wake[other].notify_one();
        }
    }
}

impl Shared {
    /// The next implicit correlation id (from 1, as Triton's iterative
    /// sequencer), skipping ids of sequences clients keep open.
    fn implicit_id(&self) -> u64 {
        let mut st = self
            .state
            .lock()
            .expect("sequence lock poisoned: nothing panics while holding it");
        loop {
            st.implicit = st.implicit.wrapping_add(1).max(1);
            let id = st.implicit;
            if !st.book.is_live(&CorrelationId::Number(id)) {
                return id;
            }
        }
    }
}

impl super::deadlines::Expire for Shared {
    fn expire_now(self: Arc<Self>) {
        let swept = self
            .state
            .lock()
            .expect("sequence lock poisoned: nothing panics while holding it")
            .book
            .sweep_backlog(Instant::now());
        answer_swept(&self, None, swept);
    }
}

fn idle_us(s: &Shared) -> u64 {
    batching(&s.config).map_or(0, |sb| sb.max_sequence_idle_microseconds)
}

fn worker(s: Arc<Shared>, i: usize, name: String, mut instance: Box<dyn Instance>) {
    let m = s.config.name.clone();
    while let Some((rows, requests)) = next_batch(&s, i) {
        tracing::debug!(
            "executing model={m} version={} instance={name} batch_size={} requests={}",
            s.version,
            requests.len(),
            rows.iter().flatten().count()
        );
        let Executed {
            results,
            times,
            start,
        } = execute_batch(&m, &name, instance.as_mut(), &requests);
        let mut requests = requests;
        let done = Instant::now();
        let outcomes: Vec<RequestOutcome> = rows
            .iter()
            .zip(&results)
            .filter_map(|(row, r)| {
                row.as_ref().map(|row| RequestOutcome {
                    ok: r.is_ok(),
                    batch_size: 1,
                    queue: start.saturating_duration_since(row.enqueued),
                    total: done - row.enqueued,
                })
            })
            .collect();
        // Filler rows are part of the execution, not requests of anyone's.
        s.stats.record_execution(requests.len(), times, &outcomes);
        let mut answers = Vec::with_capacity(outcomes.len());
        let mut woken = Vec::new();
        {
            let mut st = s
                .state
                .lock()
                .expect("sequence lock poisoned: nothing panics while holding it");
            for (pos, (row, result)) in rows.into_iter().zip(results).enumerate() {
                let Some(row) = row else { continue };
                if matches!(&result, Ok(r) if r.rescheduled) {
                    let request = std::mem::take(&mut requests[pos]);
                    if let Err((seq, reply, e)) = requeue(&s, &mut st, i, row, request, done) {
                        answers.push((seq, reply, Err(e)));
                    }
                    continue;
                }
                let result = result.map(|mut r| {
                    let produced = s.controls.take_states(&mut r);
                    r.compute = times;
                    (r, produced)
                });
                let (result, produced) = match result {
                    Ok((r, produced)) => (Ok(r), produced),
                    Err(e) => (Err(e), Vec::new()),
                };
                st.book.finished(row.key, row.start, produced, done);
                if s.iterative {
                    woken.extend(st.book.end(row.key));
                }
                answers.push((row.seq, row.reply, result));
            }
        }
        for i in woken {
            s.wake[i].notify_one();
        }
        for (seq, reply, result) in answers {
            deliver(&s, seq, reply, result);
        }
    }
}

/// Puts a request the backend released to run again (Triton's request
/// rescheduling, `iterative_sequence`) back at the front of its sequence,
/// which keeps its slot: it runs in the instance's next batch, beside the
/// other slots' requests, without its START flag (instance `i`, the one it
/// ran on, runs it again: see [`Book::requeue`]). Returns the request's
/// answer when it cannot run again (the version is going away).
fn requeue(
    s: &Shared,
    st: &mut State,
    i: usize,
    row: Row,
    mut request: InferRequest,
    now: Instant,
) -> std::result::Result<(), (u64, Reply, Error)> {
    if st.closed {
        // The version is going away: it runs no more requests.
        st.book.finished(row.key, row.start, Vec::new(), now);
        st.book.end(row.key);
        s.stats.record_failure(
            now.saturating_duration_since(row.enqueued),
            FailReason::Rejected,
        );
        return Err((row.seq, row.reply, gone_error(&s.config.name, s.version)));
    }
    request
        .parameters
        .insert("sequence_start".into(), tern_core::Parameter::Bool(false));
    s.controls.strip(&mut request);
    let item = Item {
        request,
        start: false,
        end: false,
        enqueued: now,
        seq: row.seq,
        expires: None,
        reply: row.reply,
    };
    // Queued before the run is recorded, so that a sequence already ended
    // (another request of its correlation id was answered) is not let go of
    // while this request still belongs to it.
    let requeued = st.book.requeue(row.key, i, item, now);
    st.book.finished(row.key, row.start, Vec::new(), now);
    requeued.map_err(|item| {
        let e = Error::internal(format!(
            "model '{}': a rescheduled request lost its sequence",
            s.config.name
        ));
        s.stats.record_failure(
            now.saturating_duration_since(item.enqueued),
            FailReason::Other,
        );
        (item.seq, item.reply, e)
    })
}

#[cfg(test)]
mod tests;
