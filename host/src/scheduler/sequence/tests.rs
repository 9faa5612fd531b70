//! The sequence batcher end to end over a test backend that accumulates
//! its input in implicit state: many concurrent sequences, backlog, idle
//! release and Triton's request errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Pool;
use tern_core::backend::{ExecTiming, Instance, InstanceSpec, Model};
use tern_core::config::parse_pbtxt;
use tern_core::error::Result;
use tern_core::{DataType, InferRequest, InferResponse, Parameter, Tensor};

/// OUTPUT = ACC + INPUT (ACC the state), READY echoed; counts rows executed.
struct Accumulator {
    rows: Arc<AtomicUsize>,
}

struct AccInstance {
    rows: Arc<AtomicUsize>,
}

impl Model for Accumulator {
    fn create_instance(&self, _spec: &InstanceSpec) -> Result<Box<dyn Instance>> {
        Ok(Box::new(AccInstance {
            rows: self.rows.clone(),
        }))
    }
}

fn int(t: &Tensor) -> i32 {
    i32::from_le_bytes(t.data[..4].try_into().unwrap())
}

impl Instance for AccInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        self.rows.fetch_add(batch.len(), Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1));
        batch
            .iter()
            .map(|r| {
                let sum = int(r.input("ACC").unwrap()) + int(r.input("INPUT").unwrap());
                let shape = r.input("INPUT").unwrap().shape.clone();
                let t = |n: &str, v: i32| {
                    Tensor::new(n, DataType::Int32, shape.clone(), v.to_le_bytes().to_vec())
                };
                Ok(InferResponse {
                    outputs: vec![
                        t("OUTPUT", sum),
                        t("READY_OUT", int(r.input("READY").unwrap())),
                        t("ACC_OUT", sum),
                    ],
                    ..Default::default()
                })
            })
            .collect()
    }
}

fn pool(strategy: &str, instances: u32, idle_us: u64) -> (Arc<Pool>, Arc<AtomicUsize>) {
    let cfg = parse_pbtxt(&format!(
        r#"name: "acc" max_batch_size: 4
           input [{{name: "INPUT" data_type: TYPE_INT32 dims: [1]}}]
           output [{{name: "OUTPUT" data_type: TYPE_INT32 dims: [1]}},
                   {{name: "READY_OUT" data_type: TYPE_INT32 dims: [1]}}]
           instance_group [{{kind: KIND_CPU count: {instances}}}]
           sequence_batching {{
             max_sequence_idle_microseconds: {idle_us}
             {strategy}
             control_input [{{name: "READY" control [{{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}}]}}]
             state [{{input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1]}}]
           }}"#
    ))
    .unwrap();
    let rows = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(Accumulator { rows: rows.clone() });
    let dir = std::env::temp_dir();
    let pool = Pool::start(Arc::new(cfg), 1, model, 0, &dir, false).unwrap();
    (Arc::new(pool), rows)
}

fn request(id: Parameter, start: bool, end: bool, value: i32) -> InferRequest {
    let mut r = InferRequest {
        model_name: "acc".into(),
        inputs: vec![Tensor::new(
            "INPUT",
            DataType::Int32,
            vec![1, 1],
            value.to_le_bytes().to_vec(),
        )],
        ..Default::default()
    };
    r.parameters.insert("sequence_id".into(), id);
    r.parameters
        .insert("sequence_start".into(), Parameter::Bool(start));
    r.parameters
        .insert("sequence_end".into(), Parameter::Bool(end));
    r
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap()
}

/// Many more sequences than slots, numeric and string ids: every sequence
/// sums exactly its own values, in order, whatever it shared a batch with.
fn concurrent_sequences_keep_their_own_state(strategy: &str) {
    let (pool, rows) = pool(strategy, 2, 5_000_000);
    runtime().block_on(async {
        let tasks: Vec<_> = (0..24u64)
            .map(|s| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let id = if s % 2 == 0 {
                        Parameter::Int(s as i64 + 1)
                    } else {
                        Parameter::String(format!("seq-{s}"))
                    };
                    let mut expected = 0;
                    for step in 0..10 {
                        let value = (s as i32) * 100 + step;
                        expected += value;
                        let r = request(id.clone(), step == 0, step == 9, value);
                        let out = pool.schedule(r, 1, Instant::now()).await.unwrap();
                        assert_eq!(out.outputs.len(), 2, "the state output is not returned");
                        assert_eq!(int(&out.outputs[0]), expected, "sequence {s} step {step}");
                        assert_eq!(int(&out.outputs[1]), 1, "READY is true for real requests");
                    }
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a sequence never finished")
                .unwrap();
        }
    });
    let snap = pool.stats().snapshot();
    assert_eq!(
        snap.inference_count, 240,
        "fillers are not counted as inferences"
    );
    assert!(rows.load(Ordering::SeqCst) >= 240);
    assert_eq!(
        pool.sequences(),
        0,
        "every sequence ended and freed its slot"
    );
}

#[test]
fn direct_sequences_keep_their_own_state() {
    concurrent_sequences_keep_their_own_state("direct {}");
}

#[test]
fn oldest_sequences_keep_their_own_state() {
    concurrent_sequences_keep_their_own_state(
        "oldest { max_candidate_sequences: 6 preferred_batch_size: [4] max_queue_delay_microseconds: 200 }",
    );
}

#[test]
fn requests_outside_a_live_sequence_get_tritons_errors() {
    let (pool, _) = pool("direct {}", 1, 100_000);
    runtime().block_on(async {
        let e = pool
            .schedule(request(Parameter::Int(5), false, false, 1), 1, Instant::now())
            .await
            .unwrap_err();
        assert_eq!(
            e.message,
            "inference request for sequence 5 to model 'acc' must specify the START flag on the first request of the sequence"
        );
        let e = pool
            .schedule(request(Parameter::Int(0), true, false, 1), 1, Instant::now())
            .await
            .unwrap_err();
        assert_eq!(
            e.message,
            "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"
        );
        let e = pool
            .schedule(request(Parameter::Int(6), true, false, 1), 2, Instant::now())
            .await
            .unwrap_err();
        assert!(e.message.contains("must specify batch-size 1"), "{}", e.message);
        // Started, then idle past the timeout: released, and forgotten.
        let s = Parameter::String("vad".into());
        pool.schedule(request(s.clone(), true, false, 1), 1, Instant::now())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let e = pool
            .schedule(request(s.clone(), false, false, 1), 1, Instant::now())
            .await
            .unwrap_err();
        assert!(e.message.contains("sequence vad to model 'acc' must specify the START flag"));
        // A new START starts from the initial state again.
        let out = pool
            .schedule(request(s, true, true, 7), 1, Instant::now())
            .await
            .unwrap();
        assert_eq!(int(&out.outputs[0]), 7);
    });
}

#[test]
fn an_idle_sequence_frees_its_slot_for_the_backlog() {
    // One slot (one instance, max_batch_size 4 but direct on 1 instance has 4 slots:
    // use 5 sequences so one waits), idle after 200 ms.
    let (pool, _) = pool("direct {}", 1, 200_000);
    runtime().block_on(async {
        for s in 1..=4 {
            pool.schedule(
                request(Parameter::Int(s), true, false, 1),
                1,
                Instant::now(),
            )
            .await
            .unwrap();
        }
        let started = Instant::now();
        // All four slots are held by idle sequences: the fifth waits for one to be released.
        let out = pool
            .schedule(request(Parameter::Int(5), true, true, 3), 1, Instant::now())
            .await
            .unwrap();
        assert_eq!(int(&out.outputs[0]), 3);
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "{:?}",
            started.elapsed()
        );
    });
}

/// Four sequences hold the four slots of the one instance (idle release far away).
async fn fill_slots(pool: &Pool) {
    for s in 1..=4 {
        pool.schedule(
            request(Parameter::Int(s), true, false, 1),
            1,
            Instant::now(),
        )
        .await
        .unwrap();
    }
}

#[test]
fn a_backlog_sequence_past_its_timeout_fails_whole_with_tritons_text() {
    let (pool, _) = pool("direct {}", 1, 60_000_000);
    let pool2 = pool.clone();
    runtime().block_on(async move {
        fill_slots(&pool).await;
        let mut start = request(Parameter::Int(9), true, false, 1);
        start
            .parameters
            .insert("timeout".into(), Parameter::Int(200_000));
        let t0 = Instant::now();
        let first = tokio::spawn({
            let pool = pool.clone();
            async move { pool.schedule(start, 1, Instant::now()).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A later request of the sequence, without a timeout, fails with it.
        let second = pool2
            .schedule(
                request(Parameter::Int(9), false, false, 2),
                1,
                Instant::now(),
            )
            .await
            .unwrap_err();
        let first = first.await.unwrap().unwrap_err();
        for e in [&first, &second] {
            assert_eq!(
                (e.code, e.message.as_str()),
                (
                    tern_core::Code::Unavailable,
                    "timeout of the corresponding sequence has been expired"
                )
            );
        }
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(190) && took < Duration::from_secs(2),
            "{took:?}"
        );
        let e = pool
            .schedule(
                request(Parameter::Int(9), false, false, 3),
                1,
                Instant::now(),
            )
            .await
            .unwrap_err();
        assert!(
            e.message.contains("must specify the START flag"),
            "the sequence is forgotten"
        );
        // A request with a slot ignores its timeout.
        let mut slotted = request(Parameter::Int(1), false, false, 1);
        slotted
            .parameters
            .insert("timeout".into(), Parameter::Int(1));
        assert!(pool.schedule(slotted, 1, Instant::now()).await.is_ok());
    });
}

#[test]
fn cancelling_a_request_of_a_backlog_sequence_cancels_the_whole_sequence() {
    let (pool, _) = pool("direct {}", 1, 60_000_000);
    runtime().block_on(async move {
        fill_slots(&pool).await;
        let start = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.schedule(
                    request(Parameter::Int(7), true, false, 1),
                    1,
                    Instant::now(),
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.schedule(
                    request(Parameter::Int(7), false, false, 2),
                    1,
                    Instant::now(),
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        second.abort(); // the client of the second request goes away
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A slot frees: the backlog sequence with a cancelled request is cancelled whole.
        pool.schedule(
            request(Parameter::Int(1), false, true, 1),
            1,
            Instant::now(),
        )
        .await
        .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(5), start)
            .await
            .expect("the START is answered")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.code, tern_core::Code::Cancelled);
        let e = pool
            .schedule(
                request(Parameter::Int(7), false, false, 3),
                1,
                Instant::now(),
            )
            .await
            .unwrap_err();
        assert!(e.message.contains("must specify the START flag"));
        assert_eq!(
            pool.sequences(),
            3,
            "the other three sequences keep their slots"
        );
    });
}

/// `iterative_sequence`: a request without a correlation id is a sequence
/// of its own (an implicit id, START, fresh state), which ends with it, so
/// its slot is free at once; one with an id still needs START.
#[test]
fn iterative_sequences_are_one_request_each() {
    let (pool, _) = pool("iterative_sequence: true direct {}", 1, 10_000_000);
    runtime().block_on(async {
        for v in 1..=12 {
            let mut r = request(Parameter::Int(0), false, false, v);
            r.parameters.clear();
            let out = pool.schedule(r, 1, Instant::now()).await.unwrap();
            assert_eq!(int(&out.outputs[0]), v, "state starts afresh");
            assert_eq!(int(&out.outputs[1]), 1, "READY");
        }
        assert_eq!(pool.sequences(), 0, "every sequence ended with its request");
        let e = pool
            .schedule(
                request(Parameter::Int(9), false, false, 1),
                1,
                Instant::now(),
            )
            .await
            .unwrap_err();
        assert!(
            e.message.contains("must specify the START flag"),
            "{}",
            e.message
        );
        let out = pool
            .schedule(
                request(Parameter::Int(9), true, false, 5),
                1,
                Instant::now(),
            )
            .await
            .unwrap();
        assert_eq!(int(&out.outputs[0]), 5);
        assert_eq!(pool.sequences(), 0);
    });
}

/// Each run's (INPUT, START), in order.
type RunLog = Arc<std::sync::Mutex<Vec<(i32, bool)>>>;

/// Reschedules each request until it has run INPUT times (its runs counted
/// by correlation id); logs every run as (INPUT, START flag).
struct Rerun {
    log: RunLog,
}

struct RerunInstance {
    log: Arc<std::sync::Mutex<Vec<(i32, bool)>>>,
    runs: std::collections::HashMap<i64, i32>,
}

impl Model for Rerun {
    fn create_instance(&self, _spec: &InstanceSpec) -> Result<Box<dyn Instance>> {
        Ok(Box::new(RerunInstance {
            log: self.log.clone(),
            runs: Default::default(),
        }))
    }
}

impl Instance for RerunInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        std::thread::sleep(Duration::from_millis(20));
        batch
            .iter()
            .map(|r| {
                let want = int(r.input("INPUT").unwrap());
                let Some(Parameter::Int(id)) = r.parameters.get("sequence_id") else {
                    return Ok(InferResponse::default()); // a filler row
                };
                let start = r.parameters.get("sequence_start") == Some(&Parameter::Bool(true));
                self.log.lock().unwrap().push((want, start));
                let runs = self.runs.entry(*id).or_insert(0);
                *runs += 1;
                if *runs < want {
                    return Ok(InferResponse {
                        rescheduled: true,
                        ..Default::default()
                    });
                }
                let t = Tensor::new(
                    "OUTPUT",
                    DataType::Int32,
                    vec![1],
                    runs.to_le_bytes().to_vec(),
                );
                Ok(InferResponse {
                    outputs: vec![t],
                    ..Default::default()
                })
            })
            .collect()
    }
}

/// Request rescheduling, as Triton's: a released request stays in its
/// sequence's slot and runs in the instance's next batch, without START;
/// a request arriving meanwhile takes another slot and batches with it
/// (continuous batching); each run is an execution.
#[test]
fn a_rescheduled_request_keeps_its_slot_and_batches_with_new_ones() {
    rescheduled_runs("");
}

/// The same with control inputs: the rescheduled request gets them anew
/// each run, so it still batches with requests that have not run yet.
#[test]
fn a_rescheduled_request_of_a_model_with_controls_batches_with_new_ones() {
    rescheduled_runs(
        r#"control_input [
             {name: "START" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]},
             {name: "READY" control [{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}]}
           ]"#,
    );
}

/// A pool of the [`Rerun`] model (iterative, direct): its config's
/// `max_batch_size`, instance count and extra `sequence_batching` fields,
/// and the log of its runs.
fn rerun_pool(max_batch: u32, instances: u32, extra: &str) -> (Arc<Pool>, RunLog) {
    let cfg = parse_pbtxt(&format!(
        r#"name: "rr" max_batch_size: {max_batch}
           input [{{name: "INPUT" data_type: TYPE_INT32 dims: [1]}}]
           output [{{name: "OUTPUT" data_type: TYPE_INT32 dims: [1]}}]
           instance_group [{{kind: KIND_CPU count: {instances}}}]
           sequence_batching {{ iterative_sequence: true direct {{}} {extra} }}"#
    ))
    .unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let model = Arc::new(Rerun { log: log.clone() });
    let pool = Pool::start(Arc::new(cfg), 1, model, 0, &std::env::temp_dir(), false).unwrap();
    (Arc::new(pool), log)
}

fn rescheduled_runs(controls: &str) {
    let (pool, log) = rerun_pool(2, 1, controls);
    runtime().block_on(async {
        let send = |v: i32| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut r = request(Parameter::Int(0), false, false, v);
                r.parameters.clear();
                pool.schedule(r, 1, Instant::now()).await
            })
        };
        let a = send(4);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let b = send(2);
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        assert_eq!(int(&a.outputs[0]), 4);
        assert_eq!(int(&b.outputs[0]), 2);
    });
    // A alone, then A and B together twice (B's first run without waiting
    // for A to finish), then A alone.
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            (4, true),
            (4, false),
            (2, true),
            (4, false),
            (2, false),
            (4, false)
        ]
    );
    assert_eq!(
        pool.sequences(),
        0,
        "both sequences ended with their answers"
    );
    let stats = pool.stats().snapshot();
    assert_eq!(
        stats.execution_count, 4,
        "every run is an execution, as in Triton"
    );
}

/// Two requests of one explicit correlation id on an iterative model: the
/// first ends the sequence when it is answered; the second, queued behind
/// it, still runs, is rescheduled and is answered.
#[test]
fn a_request_behind_an_ended_iterative_sequence_can_be_rescheduled() {
    let (pool, _) = rerun_pool(2, 1, "");
    runtime().block_on(async {
        let send = |start: bool, v: i32| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let r = request(Parameter::Int(7), start, false, v);
                pool.schedule(r, 1, Instant::now()).await
            })
        };
        // A runs three times (60 ms): B joins its sequence meanwhile.
        let a = send(true, 3);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let b = send(false, 6);
        let b = tokio::time::timeout(Duration::from_secs(10), b);
        let (a, b) = (
            a.await.unwrap().unwrap(),
            b.await.expect("B is answered").unwrap(),
        );
        assert_eq!(int(&a.outputs[0]), 3);
        let b = b.expect("the second request runs to its answer");
        assert_eq!(
            int(&b.outputs[0]),
            6,
            "its runs are counted in its id's sequence"
        );
    });
    assert_eq!(pool.sequences(), 0);
}

/// The same on two instances: the second request of the ended sequence
/// runs again on the instance it ran on (where the plugin keeps what it
/// needs), even when a slot of a lower instance is free by then.
#[test]
fn a_request_behind_an_ended_iterative_sequence_stays_on_its_instance() {
    let (pool, log) = rerun_pool(1, 2, "");
    runtime().block_on(async {
        let send = |id: i64, start: bool, v: i32| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let r = request(Parameter::Int(id), start, false, v);
                pool.schedule(r, 1, Instant::now()).await
            })
        };
        // X takes instance 0's slot and frees it after two runs (40 ms);
        // A runs on instance 1 three times, B joins its sequence meanwhile.
        let x = send(1, true, 2);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let a = send(7, true, 3);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let b = send(7, false, 6);
        let within = |t| tokio::time::timeout(Duration::from_secs(10), t);
        assert_eq!(int(&x.await.unwrap().unwrap().outputs[0]), 2);
        assert_eq!(int(&a.await.unwrap().unwrap().outputs[0]), 3);
        let b = within(b).await.expect("B is answered, not left waiting");
        assert_eq!(int(&b.unwrap().unwrap().outputs[0]), 6);
    });
    let b_runs = log.lock().unwrap().iter().filter(|(v, _)| *v == 6).count();
    assert_eq!(
        b_runs, 3,
        "B ran where its sequence's count was kept (runs 4 to 6)"
    );
}
