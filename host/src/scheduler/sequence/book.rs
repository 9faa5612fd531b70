//! The sequence batcher's bookkeeping, as Triton keeps it: which sequence
//! holds which slot of which instance, the backlog of sequences waiting for
//! a slot, each sequence's queued requests and kept state, idle release,
//! and — per strategy — which requests form an instance's next batch.
//! Plain data, no threads or clocks of its own: the scheduler drives it.
//!
//! * A START takes the free slot with the lowest slot number (instances fill
//!   evenly: slot 0 of every instance before any slot 1) or, with none free,
//!   joins the backlog, served first come first served as slots free up.
//! * A START for a sequence that is still live ends it early: the new
//!   request joins its queue and resets its state when it runs.
//! * An END removes the correlation id at once (a later request needs a new
//!   START); the slot frees when the END request is taken into a batch, so
//!   the next batch of that instance can hold a new sequence in that row.
//! * `direct`: slot *j* is batch row *j*; empty rows below the highest ready
//!   slot are filler (null) requests. `oldest`: the oldest front requests of
//!   the instance's candidate sequences, as the dynamic batcher forms them.
//!   Either way a batch holds at most one request per sequence.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tern_core::sequence::CorrelationId;
use tern_core::Tensor;

/// What the book needs to know of a queued request.
pub trait Queued {
    /// When it arrived.
    fn enqueued(&self) -> Instant;
    /// Whether it can share a batch with `other` (same input shapes).
    fn batches_with(&self, other: &Self) -> bool;
    /// Whether its client has gone away.
    fn cancelled(&self) -> bool {
        false
    }
    /// When its `timeout` ends, if it has one (honoured in the backlog only).
    fn expires(&self) -> Option<Instant> {
        None
    }
}

/// Requests [`Book::sweep`] took out of the book, to be answered.
pub struct Swept<T> {
    /// Sequences cancelled by a client: every request of theirs.
    pub cancelled: Vec<T>,
    /// Backlog sequences whose timeout passed: every request of theirs.
    pub expired: Vec<T>,
    /// Instances a backlog sequence moved to (a cancelled sequence freed its slot).
    pub moved: Vec<usize>,
}

/// How an instance's next batch is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    /// One slot per batch row.
    Direct {
        /// How long to wait for more slots to be ready.
        max_delay: Duration,
        /// The share of slots that, ready, sends the batch without waiting.
        min_utilization: f32,
    },
    /// The oldest requests of the candidate sequences.
    Oldest {
        /// Largest batch.
        max_batch: usize,
        /// Batch sizes sent as soon as they can be formed.
        preferred: Vec<usize>,
        /// How long the oldest request waits for a larger batch.
        max_delay: Duration,
    },
}

/// A sequence's key in the book (a correlation id can be reused after END).
pub type SeqKey = u64;

struct Seq<T> {
    id: CorrelationId,
    /// (instance, slot); `None` while in the backlog.
    slot: Option<(usize, usize)>,
    queue: VecDeque<T>,
    /// Arrival of its last request or completion of its last execution.
    last: Instant,
    /// The state outputs its last request produced (`None`: initial state).
    state: Vec<Option<Tensor>>,
    /// Its END request is queued: nothing joins it any more.
    ended: bool,
}

/// One row of a batch.
pub enum Entry<T> {
    /// A sequence's request.
    Request {
        /// Its sequence.
        seq: SeqKey,
        /// The request.
        item: T,
    },
    /// A filler for an empty `direct` slot.
    Null,
}

/// What an instance does next.
pub enum Next<T> {
    /// Run this batch.
    Batch(Vec<Entry<T>>),
    /// Nothing to run: wait for a request, or at most until this instant.
    Wait(Option<Instant>),
}

/// Where a queued request went.
#[derive(Debug, PartialEq, Eq)]
pub struct Placed {
    /// The instance serving its sequence; `None` while the sequence is in the backlog.
    pub instance: Option<usize>,
    /// A START found its sequence still live (Triton's "conflict"): the old
    /// one ends early.
    pub restarted: bool,
}

/// The sequences of one model version.
pub struct Book<T> {
    slots: Vec<Vec<Option<SeqKey>>>,
    live: HashMap<CorrelationId, SeqKey>,
    seqs: HashMap<SeqKey, Seq<T>>,
    backlog: VecDeque<SeqKey>,
    next_key: SeqKey,
    strategy: Strategy,
    idle: Duration,
    states: usize,
    queued: usize,
}

impl<T: Queued> Book<T> {
    /// An empty book: `slots` per instance, idle sequences released after
    /// `idle`, `states` implicit states per sequence.
    pub fn new(
        instances: usize,
        slots: usize,
        strategy: Strategy,
        idle: Duration,
        states: usize,
    ) -> Book<T> {
        Book {
            slots: vec![vec![None; slots.max(1)]; instances],
            live: HashMap::new(),
            seqs: HashMap::new(),
            backlog: VecDeque::new(),
            next_key: 0,
            strategy,
            idle,
            states,
            queued: 0,
        }
    }

    /// Queues a request of sequence `id`. Gives it back when it is not a
    /// START and the sequence is not live (never started, ended or released).
    pub fn enqueue(
        &mut self,
        id: &CorrelationId,
        start: bool,
        end: bool,
        item: T,
        now: Instant,
    ) -> std::result::Result<Placed, T> {
        let mut restarted = false;
        let key = match self.live.get(id) {
            Some(&key) => {
                restarted = start;
                key
            }
            None if start => self.begin(id.clone(), now),
            None => return Err(item),
        };
        let seq = self.seqs.get_mut(&key).expect("live sequence");
        seq.queue.push_back(item);
        seq.last = now;
        self.queued += 1;
        if end {
            seq.ended = true;
            self.live.remove(id);
        }
        Ok(Placed {
            instance: seq.slot.map(|(i, _)| i),
            restarted,
        })
    }

    /// Whether sequence `id` has started and not ended.
    pub fn is_live(&self, id: &CorrelationId) -> bool {
        self.live.contains_key(id)
    }

    /// Starts a sequence: a free slot, or the backlog.
    fn begin(&mut self, id: CorrelationId, now: Instant) -> SeqKey {
        let key = self.next_key;
        self.next_key += 1;
        let slot = self.free_slot();
        if let Some((i, j)) = slot {
            self.slots[i][j] = Some(key);
        } else {
            self.backlog.push_back(key);
        }
        self.live.insert(id.clone(), key);
        self.seqs.insert(
            key,
            Seq {
                id,
                slot,
                queue: VecDeque::new(),
                last: now,
                state: vec![None; self.states],
                ended: false,
            },
        );
        key
    }

    /// The free slot with the lowest number, on the lowest instance.
    fn free_slot(&self) -> Option<(usize, usize)> {
        let per = self.slots.first().map_or(0, Vec::len);
        (0..per).find_map(|j| {
            (0..self.slots.len())
                .find(|&i| self.slots[i][j].is_none())
                .map(|i| (i, j))
        })
    }

    /// Frees a sequence's slot for the oldest backlog sequence; returns the
    /// instance that sequence now runs on.
    fn release(&mut self, key: SeqKey) -> Option<usize> {
        let seq = self.seqs.remove(&key)?;
        if self.live.get(&seq.id) == Some(&key) {
            self.live.remove(&seq.id);
        }
        let (i, j) = seq.slot?;
        self.slots[i][j] = None;
        let next = self.backlog.pop_front()?;
        self.slots[i][j] = Some(next);
        if let Some(s) = self.seqs.get_mut(&next) {
            s.slot = Some((i, j));
        }
        Some(i)
    }

    /// The state to feed a sequence's next request (`start`: the initial state).
    pub fn state(&self, key: SeqKey, start: bool) -> Vec<Option<Tensor>> {
        match self.seqs.get(&key) {
            Some(s) if !start => s.state.clone(),
            _ => vec![None; self.states],
        }
    }

    /// The correlation id of a sequence.
    pub fn id(&self, key: SeqKey) -> Option<&CorrelationId> {
        self.seqs.get(&key).map(|s| &s.id)
    }

    /// Records that a request of sequence `key` ran: `produced` are the
    /// state outputs it returned (`None` keeps the state, or resets it after
    /// a START). Forgets the sequence once its END request has run (its slot
    /// was freed when the END was taken, see [`Book::pop`]).
    pub fn finished(
        &mut self,
        key: SeqKey,
        start: bool,
        produced: Vec<Option<Tensor>>,
        now: Instant,
    ) {
        let Some(seq) = self.seqs.get_mut(&key) else {
            return;
        };
        seq.last = now;
        if start {
            seq.state = vec![None; self.states];
        }
        for (kept, new) in seq.state.iter_mut().zip(produced) {
            if new.is_some() {
                *kept = new;
            }
        }
        if seq.ended && seq.queue.is_empty() {
            debug_assert!(seq.slot.is_none(), "taking the END freed the slot");
            self.release(key);
        }
    }

    /// Puts a request that ran back at the front of its sequence's queue
    /// (request rescheduling): the sequence keeps its slot, so the request
    /// runs in its instance's next batch, beside the other slots' requests.
    /// A sequence that had ended (its slot freed when this, its last
    /// request, was taken) goes on until the request is answered: it takes
    /// a free slot of `instance`, the one it ran on (whatever the plugin
    /// keeps for it is there), or the backlog's front. Gives the request
    /// back when the sequence is gone.
    pub fn requeue(
        &mut self,
        key: SeqKey,
        instance: usize,
        item: T,
        now: Instant,
    ) -> std::result::Result<(), T> {
        let free = self
            .slots
            .get(instance)
            .and_then(|slots| slots.iter().position(Option::is_none))
            .map(|j| (instance, j));
        let Some(seq) = self.seqs.get_mut(&key) else {
            return Err(item);
        };
        seq.queue.push_front(item);
        seq.last = now;
        seq.ended = false;
        self.queued += 1;
        if seq.slot.is_some() || self.backlog.contains(&key) {
            return Ok(());
        }
        match free {
            Some((i, j)) => {
                seq.slot = Some((i, j));
                self.slots[i][j] = Some(key);
            }
            None => self.backlog.push_front(key),
        }
        Ok(())
    }

    /// Ends sequence `key` now (an `iterative_sequence` request that was
    /// not rescheduled): its slot goes to the oldest backlog sequence, whose
    /// instance is returned.
    pub fn end(&mut self, key: SeqKey) -> Option<usize> {
        let seq = self.seqs.get_mut(&key)?;
        seq.ended = true;
        if self.live.get(&seq.id) == Some(&key) {
            self.live.remove(&seq.id);
        }
        if seq.queue.is_empty() {
            self.release(key)
        } else {
            None
        }
    }

    /// Releases the sequences of instance `i` that have had no request for
    /// the idle time; returns their ids.
    pub fn reap(&mut self, i: usize, now: Instant) -> Vec<CorrelationId> {
        let idle: Vec<SeqKey> = self.slots[i]
            .iter()
            .flatten()
            .filter(|k| {
                self.seqs
                    .get(k)
                    .is_some_and(|s| s.queue.is_empty() && now >= s.last + self.idle)
            })
            .copied()
            .collect();
        idle.into_iter()
            .filter_map(|k| {
                let id = self.seqs.get(&k).map(|s| s.id.clone());
                self.release(k);
                id
            })
            .collect()
    }

    /// When instance `i` next has a sequence to release.
    fn next_idle(&self, i: usize) -> Option<Instant> {
        self.slots[i]
            .iter()
            .flatten()
            .filter_map(|k| self.seqs.get(k))
            .filter(|s| s.queue.is_empty())
            .map(|s| s.last + self.idle)
            .min()
    }

    /// Takes out, as Triton's sequence batcher does, the sequences that can
    /// no longer run: one of instance `i`'s whose next request was cancelled
    /// (that request and every later one of the sequence; its slot frees and
    /// its correlation id is forgotten), a backlog sequence with any request
    /// cancelled, and a backlog sequence whose earliest request timeout has
    /// passed (a sequence with a slot ignores timeouts).
    pub fn sweep(&mut self, i: usize, now: Instant) -> Swept<T> {
        let mut out = self.sweep_backlog(now);
        let in_slots: Vec<SeqKey> = self.slots[i]
            .iter()
            .flatten()
            .copied()
            .filter(|k| {
                self.seqs
                    .get(k)
                    .and_then(|s| s.queue.front())
                    .is_some_and(Queued::cancelled)
            })
            .collect();
        for key in in_slots {
            out.cancelled.extend(self.take_queue(key));
            if let Some(moved) = self.release(key) {
                out.moved.push(moved);
            }
        }
        out
    }

    /// The backlog part of [`Book::sweep`]: backlog sequences with a request
    /// cancelled or past its timeout (no thread of an instance needed).
    pub fn sweep_backlog(&mut self, now: Instant) -> Swept<T> {
        let mut out = Swept {
            cancelled: Vec::new(),
            expired: Vec::new(),
            moved: Vec::new(),
        };
        let backlog: Vec<SeqKey> = self.backlog.iter().copied().collect();
        for key in backlog {
            let Some(seq) = self.seqs.get(&key) else {
                continue;
            };
            let cancelled = seq.queue.iter().any(Queued::cancelled);
            let expired = seq
                .queue
                .iter()
                .filter_map(Queued::expires)
                .min()
                .is_some_and(|t| t <= now);
            if !(cancelled || expired) {
                continue;
            }
            let queue = self.take_queue(key);
            self.backlog.retain(|k| *k != key);
            if let Some(seq) = self.seqs.remove(&key) {
                if self.live.get(&seq.id) == Some(&key) {
                    self.live.remove(&seq.id);
                }
            }
            if cancelled {
                out.cancelled.extend(queue);
            } else {
                out.expired.extend(queue);
            }
        }
        out
    }

    /// Empties a sequence's queue.
    fn take_queue(&mut self, key: SeqKey) -> Vec<T> {
        let queue: Vec<T> = self
            .seqs
            .get_mut(&key)
            .map(|s| s.queue.drain(..).collect())
            .unwrap_or_default();
        self.queued -= queue.len();
        queue
    }

    /// When the earliest backlog timeout ends.
    fn next_expiry(&self) -> Option<Instant> {
        self.backlog
            .iter()
            .filter_map(|k| self.seqs.get(k))
            .flat_map(|s| s.queue.iter().filter_map(Queued::expires))
            .min()
    }

    /// Requests queued (in slots and in the backlog).
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Sequences holding a slot or waiting for one.
    pub fn sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Whether instance `i` has nothing queued.
    pub fn drained(&self, i: usize) -> bool {
        self.slots[i]
            .iter()
            .flatten()
            .all(|k| self.seqs.get(k).is_none_or(|s| s.queue.is_empty()))
    }

    /// Takes every request of the backlog (the model is going away).
    pub fn drain_backlog(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        for key in std::mem::take(&mut self.backlog) {
            if let Some(seq) = self.seqs.remove(&key) {
                self.live.retain(|_, k| *k != key);
                out.extend(seq.queue);
            }
        }
        self.queued -= out.len();
        out
    }

    /// Takes a sequence's next request into a batch. Taking its END request
    /// frees its slot at once, as Triton's batcher does: the oldest backlog
    /// sequence (or the next START) takes the slot for the next batch of the
    /// same instance, while the record (state, id) stays until the END has run.
    fn pop(&mut self, key: SeqKey) -> Entry<T> {
        let seq = self
            .seqs
            .get_mut(&key)
            .expect("a ready sequence is recorded");
        let item = seq
            .queue
            .pop_front()
            .expect("a ready sequence has a request");
        self.queued -= 1;
        if seq.ended && seq.queue.is_empty() {
            if let Some((i, j)) = seq.slot.take() {
                self.slots[i][j] = self.backlog.pop_front();
                if let Some(next) = self.slots[i][j] {
                    if let Some(s) = self.seqs.get_mut(&next) {
                        s.slot = Some((i, j));
                    }
                }
            }
        }
        Entry::Request { seq: key, item }
    }

    fn front(&self, key: SeqKey) -> &T {
        self.seqs[&key].queue.front().expect("ready")
    }

    /// The next batch of instance `i` under the strategy, or how long to wait.
    pub fn next(&mut self, i: usize, now: Instant) -> Next<T> {
        let ready: Vec<(usize, SeqKey)> = self.slots[i]
            .iter()
            .enumerate()
            .filter_map(|(j, k)| k.map(|k| (j, k)))
            .filter(|(_, k)| self.seqs.get(k).is_some_and(|s| !s.queue.is_empty()))
            .collect();
        let idle = match (self.next_idle(i), self.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if ready.is_empty() {
            return Next::Wait(idle);
        }
        let oldest = ready
            .iter()
            .map(|&(_, k)| self.front(k).enqueued())
            .min()
            .expect("ready is not empty");
        let wait = |delay: Duration| {
            let until = oldest + delay;
            Next::Wait(Some(idle.map_or(until, |t| t.min(until))))
        };
        match self.strategy.clone() {
            Strategy::Direct {
                max_delay,
                min_utilization,
            } => {
                let utilization = ready.len() as f32 / self.slots[i].len() as f32;
                let go = max_delay.is_zero()
                    || min_utilization <= 0.0
                    || now >= oldest + max_delay
                    || utilization >= min_utilization;
                if !go {
                    return wait(max_delay);
                }
                // The lowest ready slot decides the shapes; a slot whose next
                // request differs waits for a later batch, a filler in its row.
                let rep = ready[0].1;
                let fitting: Vec<(usize, SeqKey)> = ready
                    .iter()
                    .filter(|&&(_, k)| k == rep || self.front(k).batches_with(self.front(rep)))
                    .copied()
                    .collect();
                let last = fitting.last().expect("the first ready slot fits").0;
                let mut batch = Vec::with_capacity(last + 1);
                for j in 0..=last {
                    batch.push(match fitting.iter().find(|(s, _)| *s == j) {
                        Some(&(_, k)) => self.pop(k),
                        None => Entry::Null,
                    });
                }
                Next::Batch(batch)
            }
            Strategy::Oldest {
                max_batch,
                preferred,
                max_delay,
            } => {
                let mut keys: Vec<SeqKey> = ready.iter().map(|&(_, k)| k).collect();
                keys.sort_by_key(|&k| self.front(k).enqueued());
                let rep = keys[0];
                let fitting: Vec<SeqKey> = keys
                    .into_iter()
                    .filter(|&k| k == rep || self.front(k).batches_with(self.front(rep)))
                    .collect();
                let n = fitting.len().min(max_batch.max(1));
                let size = if n >= max_batch {
                    n
                } else if let Some(&p) = preferred.iter().filter(|&&p| p <= n).max() {
                    p
                } else if now >= oldest + max_delay {
                    n
                } else {
                    return wait(max_delay);
                };
                let batch = fitting[..size].iter().map(|&k| self.pop(k)).collect();
                Next::Batch(batch)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct R {
        at: Instant,
        tag: &'static str,
        width: i64,
    }

    impl Queued for R {
        fn enqueued(&self) -> Instant {
            self.at
        }
        fn batches_with(&self, other: &Self) -> bool {
            self.width == other.width
        }
    }

    fn direct() -> Strategy {
        Strategy::Direct {
            max_delay: Duration::ZERO,
            min_utilization: 0.0,
        }
    }

    fn n(i: u64) -> CorrelationId {
        CorrelationId::Number(i)
    }

    fn r(at: Instant, tag: &'static str) -> R {
        R { at, tag, width: 1 }
    }

    fn tags(next: Next<R>) -> Vec<&'static str> {
        match next {
            Next::Batch(b) => b
                .into_iter()
                .map(|e| match e {
                    Entry::Request { item, .. } => item.tag,
                    Entry::Null => "null",
                })
                .collect(),
            Next::Wait(_) => vec![],
        }
    }

    #[test]
    fn starts_fill_slot_zero_of_every_instance_first_then_the_backlog() {
        let t = Instant::now();
        let mut b: Book<R> = Book::new(2, 2, direct(), Duration::from_secs(1), 0);
        let placed: Vec<_> = (1..=5)
            .map(|i| {
                b.enqueue(&n(i), true, false, r(t, "s"), t)
                    .unwrap()
                    .instance
            })
            .collect();
        assert_eq!(placed, vec![Some(0), Some(1), Some(0), Some(1), None]);
        assert_eq!(
            b.slots,
            vec![vec![Some(0), Some(2)], vec![Some(1), Some(3)]]
        );
        // A request of a sequence that never started is refused.
        assert!(b.enqueue(&n(9), false, false, r(t, "x"), t).is_err());
        // Sequence 5 waits in the backlog; its later requests queue behind its START.
        assert_eq!(
            b.enqueue(&n(5), false, true, r(t, "e"), t)
                .unwrap()
                .instance,
            None
        );
    }

    #[test]
    fn direct_batches_keep_slot_rows_and_fill_gaps_with_nulls() {
        let t = Instant::now();
        let mut b: Book<R> = Book::new(1, 4, direct(), Duration::from_secs(1), 0);
        for (i, tag) in [(1, "a"), (2, "b"), (3, "c")] {
            b.enqueue(&n(i), true, false, r(t, tag), t).unwrap();
        }
        assert_eq!(tags(b.next(0, t)), vec!["a", "b", "c"]);
        // Only sequence 3 (slot 2) has a request: rows 0 and 1 are fillers.
        b.enqueue(&n(3), false, false, r(t, "c2"), t).unwrap();
        assert_eq!(tags(b.next(0, t)), vec!["null", "null", "c2"]);
        // A request of another shape waits for a batch of its own.
        b.enqueue(&n(1), false, false, r(t, "a2"), t).unwrap();
        b.enqueue(
            &n(2),
            false,
            false,
            R {
                at: t,
                tag: "b2",
                width: 3,
            },
            t,
        )
        .unwrap();
        assert_eq!(tags(b.next(0, t)), vec!["a2"]);
        assert_eq!(tags(b.next(0, t)), vec!["null", "b2"]);
    }

    #[test]
    fn direct_waits_for_utilization_or_the_delay() {
        let t = Instant::now();
        let strategy = Strategy::Direct {
            max_delay: Duration::from_millis(10),
            min_utilization: 0.5,
        };
        let mut b: Book<R> = Book::new(1, 4, strategy, Duration::from_secs(1), 0);
        b.enqueue(&n(1), true, false, r(t, "a"), t).unwrap();
        assert!(matches!(b.next(0, t), Next::Wait(Some(w)) if w == t + Duration::from_millis(10)));
        b.enqueue(&n(2), true, false, r(t, "b"), t).unwrap();
        assert_eq!(tags(b.next(0, t)), vec!["a", "b"], "2 of 4 slots ready");
        b.enqueue(&n(1), false, false, r(t, "a2"), t).unwrap();
        assert_eq!(tags(b.next(0, t + Duration::from_millis(10))), vec!["a2"]);
    }

    #[test]
    fn end_frees_the_slot_for_the_backlog_when_it_is_taken() {
        let t = Instant::now();
        let mut b: Book<R> = Book::new(1, 1, direct(), Duration::from_secs(1), 1);
        b.enqueue(&n(1), true, true, r(t, "only"), t).unwrap();
        assert_eq!(
            b.enqueue(&n(2), true, false, r(t, "next"), t)
                .unwrap()
                .instance,
            None
        );
        // The END removed id 1 at once: a later non-START request for it is refused.
        assert!(b.enqueue(&n(1), false, false, r(t, "late"), t).is_err());
        let Next::Batch(batch) = b.next(0, t) else {
            panic!("a batch")
        };
        let Entry::Request { seq, .. } = &batch[0] else {
            panic!("a request")
        };
        // Taking the END gave its slot to the backlog sequence: it runs next.
        b.finished(*seq, true, vec![None], t);
        assert_eq!(tags(b.next(0, t)), vec!["next"]);
    }

    #[test]
    fn a_start_while_an_end_runs_takes_its_slot() {
        let t = Instant::now();
        let mut b: Book<R> = Book::new(1, 2, direct(), Duration::from_secs(1), 1);
        b.enqueue(&n(1), true, true, r(t, "a"), t).unwrap();
        b.enqueue(&n(2), true, false, r(t, "b"), t).unwrap();
        let Next::Batch(batch) = b.next(0, t) else {
            panic!("a batch")
        };
        assert_eq!(batch.len(), 2);
        // Sequence 1's END is running: slot 0 is free again, lowest first.
        let placed = b.enqueue(&n(3), true, false, r(t, "c"), t).unwrap();
        assert_eq!(placed.instance, Some(0));
        b.enqueue(&n(2), false, true, r(t, "b2"), t).unwrap();
        assert_eq!(tags(b.next(0, t)), vec!["c", "b2"]);
    }

    #[test]
    fn idle_sequences_are_released_and_forgotten() {
        let t = Instant::now();
        let idle = Duration::from_millis(100);
        let mut b: Book<R> = Book::new(1, 1, direct(), idle, 0);
        b.enqueue(&n(1), true, false, r(t, "a"), t).unwrap();
        b.enqueue(&n(2), true, false, r(t, "b"), t).unwrap();
        let Next::Batch(batch) = b.next(0, t) else {
            panic!("a batch")
        };
        let Entry::Request { seq, .. } = &batch[0] else {
            panic!()
        };
        b.finished(*seq, true, vec![], t);
        assert!(b.reap(0, t + idle / 2).is_empty());
        assert!(matches!(b.next(0, t), Next::Wait(Some(w)) if w == t + idle));
        assert_eq!(b.reap(0, t + idle), vec![n(1)]);
        assert!(b.enqueue(&n(1), false, false, r(t, "x"), t).is_err());
        assert_eq!(
            tags(b.next(0, t + idle)),
            vec!["b"],
            "the backlog got the slot"
        );
    }

    #[test]
    fn state_follows_the_outputs_and_resets_on_start() {
        let t = Instant::now();
        let mut b: Book<R> = Book::new(1, 1, direct(), Duration::from_secs(1), 1);
        b.enqueue(&n(1), true, false, r(t, "a"), t).unwrap();
        let state = Tensor::new("S", tern_core::DataType::Int32, vec![1], vec![1, 0, 0, 0]);
        b.finished(0, true, vec![Some(state.clone())], t);
        assert_eq!(b.state(0, false), vec![Some(state.clone())]);
        assert_eq!(b.state(0, true), vec![None]);
        // A restart (START while live) keeps the slot and queues behind.
        let placed = b.enqueue(&n(1), true, false, r(t, "again"), t).unwrap();
        assert!(placed.restarted);
        b.finished(0, true, vec![None], t);
        assert_eq!(b.state(0, false), vec![None]);
    }

    #[test]
    fn oldest_sends_preferred_sizes_at_once_and_the_rest_after_the_delay() {
        let t = Instant::now();
        let strategy = Strategy::Oldest {
            max_batch: 4,
            preferred: vec![2],
            max_delay: Duration::from_millis(5),
        };
        let mut b: Book<R> = Book::new(1, 4, strategy, Duration::from_secs(1), 0);
        let later = t + Duration::from_millis(1);
        b.enqueue(&n(1), true, false, r(later, "young"), later)
            .unwrap();
        b.enqueue(&n(2), true, false, r(t, "old"), t).unwrap();
        b.enqueue(&n(3), true, false, r(later, "third"), later)
            .unwrap();
        // Preferred size 2, oldest first, one request per sequence.
        assert_eq!(tags(b.next(0, later)), vec!["old", "young"]);
        assert!(matches!(b.next(0, later), Next::Wait(Some(_))));
        assert_eq!(
            tags(b.next(0, later + Duration::from_millis(5))),
            vec!["third"]
        );
    }
}
