//! Ordered delivery (`preserve_ordering`): responses go back in arrival
//! order whichever instance finishes first. Shared by the instance
//! scheduler and the sequence batcher.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use tern_core::error::Result;
use tern_core::InferResponse;

/// Where one request's response goes.
pub(super) type Reply = oneshot::Sender<Result<InferResponse>>;

/// Holds finished responses until all earlier arrivals are released (`preserve_ordering`).
#[derive(Default)]
pub(super) struct Reorder {
    next: u64,
    held: BTreeMap<u64, (Reply, Result<InferResponse>)>,
}

impl Reorder {
    /// Sends a response at once, or (`preserve`) once every earlier arrival
    /// number has been delivered.
    pub(super) fn deliver(
        this: &Mutex<Reorder>,
        preserve: bool,
        seq: u64,
        reply: Reply,
        result: Result<InferResponse>,
    ) {
        if !preserve {
            let _ = reply.send(result);
            return;
        }
        let mut r = this
            .lock()
            .expect("reorder lock poisoned: nothing panics while holding it");
        r.held.insert(seq, (reply, result));
        while let Some((reply, result)) = {
            let next = r.next;
            r.held.remove(&next)
        } {
            r.next += 1;
            let _ = reply.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_responses_go_once_every_earlier_arrival_has_gone() {
        let r = Mutex::new(Reorder::default());
        let (tx, mut rx): (Vec<Reply>, Vec<_>) = (0..3).map(|_| oneshot::channel()).unzip();
        let mut tx = tx.into_iter();
        let ok = || Ok(InferResponse::default());
        let (t0, t1, t2) = (tx.next().unwrap(), tx.next().unwrap(), tx.next().unwrap());
        Reorder::deliver(&r, true, 2, t2, ok());
        Reorder::deliver(&r, true, 1, t1, ok());
        assert!(
            rx[1].try_recv().is_err() && rx[2].try_recv().is_err(),
            "0 has not gone yet"
        );
        Reorder::deliver(&r, true, 0, t0, ok());
        assert!(rx.iter_mut().all(|rx| rx.try_recv().is_ok()));

        let (t, mut rx) = oneshot::channel();
        Reorder::deliver(&r, false, 9, t, ok());
        assert!(
            rx.try_recv().is_ok(),
            "without preserve_ordering a response goes at once"
        );
    }
}
