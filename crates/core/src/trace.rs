//! One request's trace (Triton's request tracing): the timestamps and
//! tensors recorded on its way through the server, handed to whoever
//! sampled it (the server's tracer writes it to a trace file or exports it
//! as OpenTelemetry spans) when the last holder drops it.
//!
//! A trace travels with its request ([`crate::InferRequest::trace`]): the
//! frontend that sampled it records the protocol's timestamps, the
//! inference facade `REQUEST_START`/`REQUEST_END`, the scheduler
//! `QUEUE_START` and the `COMPUTE_*` times, and an ensemble or a plugin's
//! BLS call gives each request it makes a [`Trace::child`]. A child keeps
//! its parent alive, so a whole tree reaches the sink at once, children
//! first, as Triton writes it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::tensor::Tensor;

/// What a trace records (Triton's `trace_level`; both may be on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    /// `TIMESTAMPS`: the request's timestamps.
    pub timestamps: bool,
    /// `TENSORS`: its input and output tensors.
    pub tensors: bool,
}

impl Level {
    /// Neither (`OFF`).
    pub fn is_off(self) -> bool {
        !self.timestamps && !self.tensors
    }
}

/// One thing a trace recorded, in the order recorded.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A timestamp (`HTTP_RECV_START`, `REQUEST_START`, `QUEUE_START`, ...).
    Timestamp(&'static str, Instant),
    /// A tensor as `TENSOR_QUEUE_INPUT`, `TENSOR_BACKEND_INPUT` or
    /// `TENSOR_BACKEND_OUTPUT` (its data shares the request's buffer).
    Tensor(&'static str, Tensor),
}

/// The W3C trace context a client sent (`traceparent`): an exported trace
/// continues the client's distributed trace under the client's span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteParent {
    /// The distributed trace's id.
    pub trace_id: [u8; 16],
    /// The client's span.
    pub span_id: [u8; 8],
    /// The client's trace flags (bit 0: sampled).
    pub flags: u8,
}

/// Everything a finished trace holds, as its sink receives it.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The trace's id, unique in this server.
    pub id: u64,
    /// The id of the trace of the request that made this one (an ensemble,
    /// a BLS caller); 0 for a client's request.
    pub parent_id: u64,
    /// The model the request ran on.
    pub model_name: String,
    /// Its version (-1 until it was resolved).
    pub model_version: i64,
    /// The request's id.
    pub request_id: String,
    /// What was recorded.
    pub level: Level,
    /// What was recorded, in order.
    pub entries: Vec<Entry>,
    /// The client's trace context (a client request's trace only).
    pub remote_parent: Option<RemoteParent>,
    /// When the trace was sampled.
    pub started: Option<Instant>,
    /// When its last holder let it go.
    pub ended: Option<Instant>,
}

impl Record {
    /// When timestamp `name` was recorded (the first time).
    pub fn timestamp(&self, name: &str) -> Option<Instant> {
        self.entries.iter().find_map(|e| match e {
            Entry::Timestamp(n, at) if *n == name => Some(*at),
            _ => None,
        })
    }
}

/// Where finished traces go, and where new ids come from.
pub trait Sink: Send + Sync {
    /// A fresh trace id.
    fn next_id(&self) -> u64;
    /// Takes a finished trace tree: every child's record, then the root's.
    fn finish(&self, tree: Vec<Record>);
}

/// A request's trace; see the module doc. Reported to its sink when the
/// last holder drops it (a child: into its parent's tree).
pub struct Trace {
    record: Mutex<Record>,
    /// Finished children's records, waiting for this trace to finish.
    children: Mutex<Vec<Record>>,
    parent: Option<Arc<Trace>>,
    sink: Arc<dyn Sink>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.lock();
        write!(
            f,
            "Trace({} of {}, parent {})",
            r.id, r.model_name, r.parent_id
        )
    }
}

impl Trace {
    /// A new trace of a request to `model_name` (version unknown yet),
    /// continuing the client's distributed trace when it sent one.
    pub fn new(
        sink: Arc<dyn Sink>,
        level: Level,
        model_name: &str,
        remote_parent: Option<RemoteParent>,
    ) -> Arc<Trace> {
        Arc::new(Trace {
            record: Mutex::new(Record {
                id: sink.next_id(),
                parent_id: 0,
                model_name: model_name.to_string(),
                model_version: -1,
                request_id: String::new(),
                level,
                entries: Vec::new(),
                remote_parent,
                started: Some(Instant::now()),
                ended: None,
            }),
            children: Mutex::new(Vec::new()),
            parent: None,
            sink,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        // A panic while an entry was pushed leaves a usable record.
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The trace's id.
    pub fn id(&self) -> u64 {
        self.lock().id
    }

    /// What it records.
    pub fn level(&self) -> Level {
        self.lock().level
    }

    /// Names the model version and request id once they are known.
    pub fn resolved(&self, model_name: &str, model_version: i64, request_id: &str) {
        let mut r = self.lock();
        if r.model_name != model_name {
            r.model_name = model_name.to_string();
        }
        r.model_version = model_version;
        if r.request_id != request_id {
            r.request_id = request_id.to_string();
        }
    }

    /// Records timestamp `name` now (when the level records timestamps).
    pub fn timestamp(&self, name: &'static str) {
        self.timestamp_at(name, Instant::now());
    }

    /// Records timestamp `name` at `at`.
    pub fn timestamp_at(&self, name: &'static str, at: Instant) {
        let mut r = self.lock();
        if r.level.timestamps {
            r.entries.push(Entry::Timestamp(name, at));
        }
    }

    /// Records `tensors` as `activity` (when the level records tensors).
    pub fn tensors<'a>(
        &self,
        activity: &'static str,
        tensors: impl IntoIterator<Item = &'a Tensor>,
    ) {
        let mut r = self.lock();
        if r.level.tensors {
            r.entries.extend(
                tensors
                    .into_iter()
                    .map(|t| Entry::Tensor(activity, t.clone())),
            );
        }
    }

    /// A trace for a request this one's request makes (an ensemble step, a
    /// BLS call) to `model_name`: this trace is its parent, with the same
    /// level, sink and request id.
    pub fn child(self: &Arc<Self>, model_name: &str) -> Arc<Trace> {
        let (level, id, request_id) = {
            let r = self.lock();
            (r.level, r.id, r.request_id.clone())
        };
        Arc::new(Trace {
            record: Mutex::new(Record {
                id: self.sink.next_id(),
                parent_id: id,
                model_name: model_name.to_string(),
                model_version: -1,
                request_id,
                level,
                entries: Vec::new(),
                remote_parent: None,
                started: Some(Instant::now()),
                ended: None,
            }),
            children: Mutex::new(Vec::new()),
            parent: Some(self.clone()),
            sink: self.sink.clone(),
        })
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let mut record = std::mem::take(
            self.record
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        record.ended = Some(Instant::now());
        let mut tree = std::mem::take(
            self.children
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        tree.push(record);
        match &self.parent {
            Some(parent) => parent
                .children
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(tree),
            None => self.sink.finish(tree),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Default)]
    struct Collect {
        ids: AtomicU64,
        trees: Mutex<Vec<Vec<Record>>>,
    }

    impl Sink for Collect {
        fn next_id(&self) -> u64 {
            self.ids.fetch_add(1, Ordering::Relaxed) + 1
        }
        fn finish(&self, tree: Vec<Record>) {
            self.trees.lock().unwrap().push(tree);
        }
    }

    #[test]
    fn a_tree_reaches_the_sink_once_children_first_when_its_root_ends() {
        let sink = Arc::new(Collect::default());
        let level = Level {
            timestamps: true,
            tensors: false,
        };
        let root = Trace::new(sink.clone(), level, "ens", None);
        root.resolved("ens", 1, "r1");
        root.timestamp("REQUEST_START");
        root.tensors(
            "TENSOR_QUEUE_INPUT",
            [&Tensor::new(
                "X",
                crate::DataType::Int32,
                vec![1],
                vec![0; 4],
            )],
        );
        let step = root.child("m");
        step.timestamp("QUEUE_START");
        drop(step);
        assert!(
            sink.trees.lock().unwrap().is_empty(),
            "the root is still running"
        );
        root.timestamp("REQUEST_END");
        drop(root);
        let trees = sink.trees.lock().unwrap();
        assert_eq!(trees.len(), 1);
        let (child, parent) = (&trees[0][0], &trees[0][1]);
        assert_eq!((child.id, child.parent_id, parent.id), (2, 1, 1));
        assert_eq!(
            child.request_id, "r1",
            "a child carries its parent's request id"
        );
        assert!(child.ended.unwrap() <= parent.ended.unwrap());
        assert_eq!(
            parent.entries.len(),
            2,
            "tensors are not recorded at TIMESTAMPS"
        );
        assert!(parent.timestamp("REQUEST_END").is_some());
    }
}
