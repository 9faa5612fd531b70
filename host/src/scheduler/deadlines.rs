//! Queue-timeout watcher: one thread for the whole server that wakes at the
//! earliest queue deadline of any model and lets that model reject its
//! expired requests, so a request whose `default_timeout_microseconds`
//! (REJECT) runs out is answered on time even while every instance of its
//! model is busy and no instance thread looks at the queue.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock, Weak};
use std::time::Instant;

/// Something with a queue whose expired requests can be rejected.
pub trait Expire: Send + Sync {
    /// Rejects the requests whose queue deadline has passed (and asks to be
    /// woken again for the next one).
    fn expire_now(self: std::sync::Arc<Self>);
}

struct Entry {
    at: Instant,
    seq: u64,
    target: Weak<dyn Expire>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A request to call `expire_now` at an instant.
type Watch = (Instant, Weak<dyn Expire>);

fn sender() -> Option<Sender<Watch>> {
    static TX: OnceLock<Option<Mutex<Sender<Watch>>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Watch>();
        let spawned = std::thread::Builder::new()
            .name("tern-queue-deadlines".into())
            .spawn(move || {
                let mut heap: BinaryHeap<Reverse<Entry>> = BinaryHeap::new();
                let mut seq = 0u64;
                loop {
                    let next = heap.peek().map(|Reverse(e)| e.at);
                    let received = match next {
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                    };
                    match received {
                        Ok((at, target)) => {
                            seq += 1;
                            heap.push(Reverse(Entry { at, seq, target }));
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    let now = Instant::now();
                    while heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
                        let Reverse(e) = heap.pop().expect("peeked");
                        if let Some(target) = e.target.upgrade() {
                            target.expire_now();
                        }
                    }
                }
            });
        match spawned {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                tracing::warn!("cannot start the queue-deadline thread ({e}); queue timeouts fire when an instance is free");
                None
            }
        }
    })
    .as_ref()
    .map(|tx| tx.lock().expect("deadline sender lock poisoned: nothing panics while holding it").clone())
}

/// Asks the watcher to call `target.expire_now()` at `at` (if it still exists then).
pub fn watch(at: Instant, target: Weak<dyn Expire>) {
    if let Some(tx) = sender() {
        let _ = tx.send((at, target));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    struct Count(AtomicUsize);
    impl Expire for Count {
        fn expire_now(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn fires_at_the_deadline_in_order() {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let start = Instant::now();
        let weak: Weak<dyn Expire> = Arc::downgrade(&c) as Weak<dyn Expire>;
        watch(start + Duration::from_millis(60), weak.clone());
        watch(start + Duration::from_millis(20), weak);
        while c.0.load(Ordering::SeqCst) < 1 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let first = start.elapsed();
        assert!(first >= Duration::from_millis(20), "{first:?}");
        while c.0.load(Ordering::SeqCst) < 2 {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(start.elapsed() >= Duration::from_millis(60));
    }

    #[test]
    fn dropped_targets_are_skipped() {
        // A watched target is not kept alive by the watcher...
        let gone = Arc::new(Count(AtomicUsize::new(0)));
        let weak = Arc::downgrade(&gone) as Weak<dyn Expire>;
        watch(Instant::now() + Duration::from_millis(5), weak.clone());
        drop(gone);
        assert!(
            weak.upgrade().is_none(),
            "the watcher holds only a weak reference"
        );
        // ...and once its deadline passes, the watcher skips it and still
        // serves the targets after it.
        let live = Arc::new(Count(AtomicUsize::new(0)));
        watch(
            Instant::now() + Duration::from_millis(20),
            Arc::downgrade(&live) as Weak<dyn Expire>,
        );
        let start = Instant::now();
        while live.0.load(Ordering::SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the watcher stopped after a dropped target"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(live.0.load(Ordering::SeqCst), 1);
    }
}
