//! The request queue of one model version and the batch-forming rules of
//! Triton's dynamic batcher: priority levels in order (delayed requests after
//! the live ones of their level), the largest preferred batch that the queued
//! requests can form, the full batch, shape compatibility (ragged inputs
//! excepted), `max_queue_delay_microseconds`, per-level timeouts and queue
//! sizes, and the `TRITONSERVER_DELAY_SCHEDULER` test hook.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use tokio::sync::oneshot;

use super::policy::{BatchPolicy, OnTimeout};
use tern_core::error::Result;
use tern_core::{InferRequest, InferResponse};

/// A queued request.
pub struct Pending {
    /// The validated request.
    pub request: InferRequest,
    /// Its batch size (first dim; 1 for models that do not batch).
    pub batch_size: usize,
    /// Priority level, 1-based.
    pub level: u64,
    /// When it entered the queue.
    pub enqueued: Instant,
    /// When its queue timeout expires.
    pub deadline: Option<Instant>,
    /// Arrival number, for `preserve_ordering`.
    pub seq: u64,
    /// Where the response goes.
    pub reply: oneshot::Sender<Result<InferResponse>>,
}

#[derive(Default)]
struct Level {
    live: VecDeque<Pending>,
    delayed: VecDeque<Pending>,
}

impl Level {
    fn is_empty(&self) -> bool {
        self.live.is_empty() && self.delayed.is_empty()
    }
}

/// What the scheduler should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Execute the first `n` requests (in queue order) as one batch.
    Send(usize),
    /// Wait for a new request, or at most until this instant.
    Wait(Option<Instant>),
}

/// Queued requests of one model version.
pub struct Queue {
    /// Levels with queued requests, highest priority (lowest number) first;
    /// a level exists only while it holds requests, so `priority_levels`
    /// may be any `u64`.
    levels: BTreeMap<u64, Level>,
    len: usize,
    hook: Option<usize>,
    /// No new requests; drain what is queued without waiting.
    pub closed: bool,
}

fn compatible(a: &InferRequest, b: &InferRequest, policy: &BatchPolicy) -> bool {
    a.inputs.len() == b.inputs.len()
        && a.inputs.iter().all(|ta| {
            b.input(&ta.name).is_some_and(|tb| {
                policy.ragged.contains(&ta.name) || ta.shape.get(1..) == tb.shape.get(1..)
            })
        })
}

impl Queue {
    /// An empty queue for `policy`.
    pub fn new(policy: &BatchPolicy) -> Queue {
        Queue {
            levels: BTreeMap::new(),
            len: 0,
            hook: policy.delay_hook,
            closed: false,
        }
    }

    /// Number of queued requests.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues a request; gives it back when its level is at `max_queue_size`.
    pub fn push(
        &mut self,
        p: Pending,
        policy: &BatchPolicy,
    ) -> std::result::Result<(), Box<Pending>> {
        let max = policy.level_policy(p.level).max_queue_size;
        let level = self.levels.entry(p.level).or_default();
        if max.is_some_and(|max| level.live.len() + level.delayed.len() >= max) {
            if level.is_empty() {
                self.levels.remove(&p.level);
            }
            return Err(Box::new(p));
        }
        level.live.push_back(p);
        self.len += 1;
        Ok(())
    }

    /// Applies queue timeouts: REJECT-ed requests are removed and returned,
    /// DELAY-ed ones move behind the live requests of their level.
    pub fn expire(&mut self, policy: &BatchPolicy, now: Instant) -> Vec<Pending> {
        let mut rejected = Vec::new();
        for (&i, level) in self.levels.iter_mut() {
            if !level
                .live
                .iter()
                .any(|p| p.deadline.is_some_and(|d| d <= now))
            {
                continue;
            }
            let mut keep = VecDeque::with_capacity(level.live.len());
            for p in level.live.drain(..) {
                if p.deadline.is_some_and(|d| d <= now) {
                    match policy.level_policy(i).on_timeout {
                        OnTimeout::Reject => rejected.push(p),
                        OnTimeout::Delay => level.delayed.push_back(p),
                    }
                } else {
                    keep.push_back(p);
                }
            }
            level.live = keep;
        }
        self.len -= rejected.len();
        self.levels.retain(|_, l| !l.is_empty());
        rejected
    }

    /// Removes and returns the requests whose client has gone (the caller
    /// dropped its response receiver: a cancelled gRPC call or stream, a
    /// closed HTTP connection, an abandoned ensemble), so they never execute.
    pub fn cancelled(&mut self) -> Vec<Pending> {
        let mut gone = Vec::new();
        for level in self.levels.values_mut() {
            for list in [&mut level.live, &mut level.delayed] {
                if list.iter().any(|p| p.reply.is_closed()) {
                    let mut keep = VecDeque::with_capacity(list.len());
                    for p in list.drain(..) {
                        if p.reply.is_closed() {
                            gone.push(p);
                        } else {
                            keep.push_back(p);
                        }
                    }
                    *list = keep;
                }
            }
        }
        self.len -= gone.len();
        self.levels.retain(|_, l| !l.is_empty());
        gone
    }

    fn ordered(&self) -> impl Iterator<Item = &Pending> {
        self.levels
            .values()
            .flat_map(|l| l.live.iter().chain(l.delayed.iter()))
    }

    /// Decides whether a batch should be executed now, following Triton's dynamic batcher.
    pub fn decide(&mut self, policy: &BatchPolicy, now: Instant) -> Decision {
        let next_deadline = self.ordered().filter_map(|p| p.deadline).min();
        let Some(head) = self.ordered().next() else {
            return Decision::Wait(None);
        };
        if !policy.dynamic || self.closed {
            return if policy.dynamic {
                self.scan(policy).send_all()
            } else {
                Decision::Send(1)
            };
        }
        let delay_end = head.enqueued + policy.max_delay;
        if let Some(n) = self.hook {
            if self.len < n && (policy.max_delay.is_zero() || now < delay_end) {
                return Decision::Wait(earliest(
                    next_deadline,
                    (!policy.max_delay.is_zero()).then_some(delay_end),
                ));
            }
            self.hook = None;
        }
        // Triton's GetDynamicBatch: the best preferred batch unless the delay
        // is over; at once when nothing better can come (a request would
        // overflow the largest preferred size or max_batch_size, or the batch
        // is already at the largest preferred size); else wait out the delay.
        let scan = self.scan(policy);
        let delay_over = !policy.max_delay.is_zero() && now >= delay_end;
        if let Some(n) = scan.best_preferred.filter(|_| !delay_over) {
            return Decision::Send(n);
        }
        if scan.blocked
            || scan.total >= policy.max_preferred()
            || delay_over
            || policy.max_delay.is_zero()
        {
            return Decision::Send(scan.count);
        }
        Decision::Wait(earliest(next_deadline, Some(delay_end)))
    }

    fn scan(&self, policy: &BatchPolicy) -> Scan {
        let mut scan = Scan::default();
        let mut first: Option<&InferRequest> = None;
        let max_preferred = policy.max_preferred();
        for p in self.ordered() {
            if let Some(f) = first {
                let total = scan.total + p.batch_size;
                if total > max_preferred && scan.best_preferred.is_none() {
                    // Cut before the request that overflows the largest preferred size.
                    scan.best_preferred = Some(scan.count);
                }
                if total > policy.max_batch_size || !compatible(f, &p.request, policy) {
                    scan.blocked = true;
                    break;
                }
            }
            first.get_or_insert(&p.request);
            scan.total += p.batch_size;
            scan.count += 1;
            if policy.preferred.binary_search(&scan.total).is_ok() {
                scan.best_preferred = Some(scan.count);
            }
        }
        // A single request larger than max_batch_size cannot exist (validation), so count >= 1.
        scan.count = scan.count.max(1);
        scan
    }

    /// The earliest queue deadline that a REJECT policy will answer (for the
    /// deadline watcher, which must wake then even if every instance is busy).
    pub fn next_reject_deadline(&self, policy: &BatchPolicy) -> Option<Instant> {
        self.levels
            .iter()
            .filter(|(&l, _)| policy.level_policy(l).on_timeout == OnTimeout::Reject)
            .flat_map(|(_, l)| l.live.iter().filter_map(|p| p.deadline))
            .min()
    }

    /// Removes the first `n` requests in queue order.
    pub fn take(&mut self, n: usize) -> Vec<Pending> {
        let mut out = Vec::with_capacity(n);
        for level in self.levels.values_mut() {
            while out.len() < n {
                match level.live.pop_front().or_else(|| level.delayed.pop_front()) {
                    Some(p) => out.push(p),
                    None => break,
                }
            }
        }
        self.len -= out.len();
        self.levels.retain(|_, l| !l.is_empty());
        out
    }
}

#[derive(Default)]
struct Scan {
    total: usize,
    count: usize,
    best_preferred: Option<usize>,
    blocked: bool,
}

impl Scan {
    fn send_all(&self) -> Decision {
        Decision::Send(self.count)
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tern_core::config::parse_pbtxt;
    use tern_core::{DataType, Tensor};

    fn policy(db: &str) -> BatchPolicy {
        let cfg = parse_pbtxt(&format!(
            "name: \"m\" max_batch_size: 8 input [{{name: \"X\" data_type: TYPE_FP32 dims: [-1]}}, {{name: \"R\" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true optional: true}}] {db}"
        ))
        .unwrap();
        BatchPolicy::from_config(&cfg, true).unwrap()
    }

    fn pending(batch: usize, width: i64, level: u64, at: Instant) -> Pending {
        let (reply, _rx) = oneshot::channel();
        let x = Tensor::new(
            "X",
            DataType::Fp32,
            vec![batch as i64, width],
            vec![0u8; batch * width as usize * 4],
        );
        Pending {
            request: InferRequest {
                inputs: vec![x],
                ..Default::default()
            },
            batch_size: batch,
            level,
            enqueued: at,
            deadline: None,
            seq: 0,
            reply,
        }
    }

    fn queue_of(p: &BatchPolicy, items: Vec<Pending>) -> Queue {
        let mut q = Queue::new(p);
        for i in items {
            assert!(q.push(i, p).is_ok());
        }
        q
    }

    #[test]
    fn cancelled_requests_leave_the_queue() {
        let p = policy("dynamic_batching { }");
        let now = Instant::now();
        let mut q = Queue::new(&p);
        let mut receivers = Vec::new();
        for seq in 0..4 {
            let (reply, rx) = oneshot::channel();
            let mut item = pending(1, 4, 1, now);
            item.reply = reply;
            item.seq = seq;
            assert!(q.push(item, &p).is_ok());
            receivers.push(rx);
        }
        assert!(q.cancelled().is_empty());
        // The clients of requests 1 and 3 go away.
        drop(receivers.remove(3));
        drop(receivers.remove(1));
        let gone: Vec<u64> = q.cancelled().iter().map(|p| p.seq).collect();
        assert_eq!(gone, vec![1, 3]);
        assert_eq!(q.len(), 2);
        let left: Vec<u64> = q.take(4).iter().map(|p| p.seq).collect();
        assert_eq!(left, vec![0, 2]);
        assert!(q.is_empty());
    }

    #[test]
    fn default_scheduler_sends_one_request() {
        let p = policy("");
        let now = Instant::now();
        let mut q = queue_of(&p, vec![pending(2, 4, 1, now), pending(2, 4, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Send(1));
    }

    #[test]
    fn largest_preferred_size_first() {
        let p = policy("dynamic_batching { preferred_batch_size: [2, 4, 6] max_queue_delay_microseconds: 1000000 }");
        let now = Instant::now();
        let mut q = queue_of(&p, (0..7).map(|_| pending(1, 4, 1, now)).collect());
        assert_eq!(q.decide(&p, now), Decision::Send(6));
        assert_eq!(q.take(6).len(), 6);
        // One left: no preferred size reachable, wait for the delay.
        assert_eq!(
            q.decide(&p, now),
            Decision::Wait(Some(now + Duration::from_secs(1)))
        );
        assert_eq!(
            q.decide(&p, now + Duration::from_secs(1)),
            Decision::Send(1)
        );
    }

    #[test]
    fn full_batch_and_never_over_max() {
        let p = policy("dynamic_batching { max_queue_delay_microseconds: 1000000 }");
        let now = Instant::now();
        let mut q = queue_of(
            &p,
            vec![
                pending(3, 4, 1, now),
                pending(5, 4, 1, now),
                pending(1, 4, 1, now),
            ],
        );
        assert_eq!(q.decide(&p, now), Decision::Send(2)); // 3 + 5 = 8 = max
        q.take(2);
        let mut q = queue_of(
            &p,
            vec![
                pending(3, 4, 1, now),
                pending(4, 4, 1, now),
                pending(2, 4, 1, now),
            ],
        );
        // 3 + 4 = 7, the next (2) does not fit: the batch cannot grow, send it.
        assert_eq!(q.decide(&p, now), Decision::Send(2));
    }

    #[test]
    fn shape_mismatch_ends_the_batch_but_ragged_inputs_join() {
        let p = policy("dynamic_batching { max_queue_delay_microseconds: 1000000 }");
        let now = Instant::now();
        let mut q = queue_of(
            &p,
            vec![
                pending(1, 4, 1, now),
                pending(1, 4, 1, now),
                pending(1, 5, 1, now),
                pending(1, 4, 1, now),
            ],
        );
        assert_eq!(q.decide(&p, now), Decision::Send(2));
        q.take(2);
        assert_eq!(q.decide(&p, now), Decision::Send(1)); // [1,5] alone: the next one mismatches
        let ragged = |w: i64| {
            let mut x = pending(1, 4, 1, now);
            x.request.inputs.push(Tensor::new(
                "R",
                DataType::Fp32,
                vec![1, w],
                vec![0u8; w as usize * 4],
            ));
            x
        };
        let mut q = queue_of(&p, vec![ragged(2), ragged(3), ragged(9)]);
        assert_eq!(
            q.decide(&p, now + Duration::from_secs(2)),
            Decision::Send(3)
        );
    }

    #[test]
    fn sends_at_once_when_waiting_cannot_reach_a_larger_preferred_size() {
        let p = policy("dynamic_batching { preferred_batch_size: [2, 6] max_queue_delay_microseconds: 10000000 }");
        let now = Instant::now();
        // One request larger than every preferred size.
        let mut q = queue_of(&p, vec![pending(7, 4, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Send(1));
        // The next request would overflow the largest preferred size: cut before it.
        let mut q = queue_of(&p, vec![pending(3, 4, 1, now), pending(4, 4, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Send(1));
        // Exactly the largest preferred size.
        let mut q = queue_of(&p, vec![pending(3, 4, 1, now), pending(3, 4, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Send(2));
        // Below it, and no preferred size reached: wait for more.
        let mut q = queue_of(&p, vec![pending(3, 4, 1, now), pending(1, 4, 1, now)]);
        assert_eq!(
            q.decide(&p, now),
            Decision::Wait(Some(now + Duration::from_secs(10)))
        );
    }

    #[test]
    fn huge_level_numbers_are_sparse() {
        let p = policy(
            "dynamic_batching { priority_levels: 18446744073709551615 default_priority_level: 4294967296 }",
        );
        let now = Instant::now();
        let mut q = queue_of(
            &p,
            vec![
                pending(1, 4, u64::MAX, now),
                pending(1, 5, 4_294_967_296, now),
            ],
        );
        assert_eq!(q.levels.len(), 2);
        let first = q.take(1);
        assert_eq!(first[0].request.inputs[0].shape, vec![1, 5]);
        q.take(1);
        assert!(q.levels.is_empty(), "empty levels are dropped");
    }

    #[test]
    fn zero_delay_sends_what_is_there() {
        let p = policy("dynamic_batching { }");
        let now = Instant::now();
        let mut q = queue_of(&p, vec![pending(1, 4, 1, now), pending(2, 4, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Send(2));
    }

    #[test]
    fn priority_levels_come_first() {
        let p = policy("dynamic_batching { priority_levels: 2 default_priority_level: 2 preferred_batch_size: [1] }");
        let now = Instant::now();
        let mut q = queue_of(&p, vec![pending(1, 4, 2, now), pending(1, 5, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Send(1));
        assert_eq!(q.take(1)[0].request.inputs[0].shape, vec![1, 5]);
    }

    #[test]
    fn timeouts_reject_or_delay() {
        let p = policy(
            "dynamic_batching { priority_levels: 2 default_priority_level: 2
               priority_queue_policy { key: 1 value: { timeout_action: DELAY } } }",
        );
        let now = Instant::now();
        let mut late1 = pending(1, 7, 1, now);
        late1.deadline = Some(now);
        let mut late2 = pending(1, 8, 2, now);
        late2.deadline = Some(now);
        let mut q = queue_of(
            &p,
            vec![late1, pending(1, 4, 1, now), late2, pending(1, 4, 2, now)],
        );
        let rejected = q.expire(&p, now);
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].request.inputs[0].shape, vec![1, 8]);
        // The delayed level-1 request now comes after the live level-1 one, before level 2.
        let order: Vec<i64> = q
            .take(3)
            .iter()
            .map(|p| p.request.inputs[0].shape[1])
            .collect();
        assert_eq!(order, vec![4, 7, 4]);
    }

    #[test]
    fn max_queue_size_refuses() {
        let p = policy("dynamic_batching { default_queue_policy { max_queue_size: 1 } }");
        let now = Instant::now();
        let mut q = queue_of(&p, vec![pending(1, 4, 1, now)]);
        assert!(q.push(pending(1, 4, 1, now), &p).is_err());
    }

    #[test]
    fn a_model_without_batching_sends_one_request_at_once() {
        let cfg = parse_pbtxt(
            "name: \"m\" max_batch_size: 0 input [{name: \"X\" data_type: TYPE_FP32 dims: [-1, -1]}]
             dynamic_batching { max_queue_delay_microseconds: 10000000 default_queue_policy { max_queue_size: 2 } }",
        )
        .unwrap();
        let p = BatchPolicy::from_config(&cfg, true).unwrap();
        let now = Instant::now();
        let mut q = queue_of(&p, vec![pending(1, 4, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Send(1));
        q.push(pending(1, 4, 1, now), &p).ok().unwrap();
        assert_eq!(q.decide(&p, now), Decision::Send(1));
        assert!(
            q.push(pending(1, 4, 1, now), &p).is_err(),
            "max_queue_size applies"
        );
    }

    #[test]
    fn delay_hook_holds_until_n_queued() {
        let mut p = policy("dynamic_batching { }");
        p.delay_hook = Some(3);
        let now = Instant::now();
        let mut q = queue_of(&p, vec![pending(1, 4, 1, now), pending(1, 4, 1, now)]);
        assert_eq!(q.decide(&p, now), Decision::Wait(None));
        q.push(pending(1, 4, 1, now), &p).ok().unwrap();
        assert_eq!(q.decide(&p, now), Decision::Send(3));
    }
}
