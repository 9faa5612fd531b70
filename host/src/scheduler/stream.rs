//! Response streams of decoupled models: the channel one request's
//! responses travel through, from the backend (any instance thread, at any
//! time until the final flag) to the frontend. Every response is shaped on
//! the way (requested outputs, classification); what a slow client leaves
//! unread is capped, so it cannot grow the server's memory or hold an
//! instance; a client that goes away cancels the request.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use tern_core::error::{Code, Error, Result};
use tern_core::{InferResponse, ResponseSink};

/// Unread response bytes one stream may hold before it is failed.
pub const MAX_BUFFERED_BYTES: usize = 64 << 20;

pub use tern_core::StreamItem;

/// Turns a model's response into what the client asked for.
pub type Shape = Box<dyn Fn(InferResponse) -> Result<InferResponse> + Send + Sync>;

/// Told once, when the first response (or error) of a request goes out.
pub type OnFirst = Box<dyn Fn() + Send + Sync>;

/// The sending side, given to the backend as the request's responder.
pub struct Sender {
    tx: mpsc::UnboundedSender<StreamItem>,
    closed: AtomicBool,
    buffered: Arc<AtomicUsize>,
    shape: Shape,
    model: String,
    first: AtomicBool,
    on_first: Option<OnFirst>,
}

/// The receiving side, read by the frontend. It also drives the request's
/// execution (so it needs no task of its own and works from any thread): a
/// failure before the final flag becomes the stream's last message.
pub struct ResponseStream {
    rx: mpsc::UnboundedReceiver<StreamItem>,
    buffered: Arc<AtomicUsize>,
    execution: Option<(tern_core::router::InferFuture, Arc<Sender>)>,
    /// The final flag has been read.
    finished: bool,
}

/// A new stream for a request of `model`; `on_first` is called when its
/// first response goes out (the first-response latency).
pub fn channel(
    model: &str,
    shape: Shape,
    on_first: Option<OnFirst>,
) -> (Arc<Sender>, ResponseStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    let buffered = Arc::new(AtomicUsize::new(0));
    let sender = Sender {
        tx,
        closed: AtomicBool::new(false),
        buffered: buffered.clone(),
        shape,
        model: model.to_string(),
        first: AtomicBool::new(true),
        on_first,
    };
    let stream = ResponseStream {
        rx,
        buffered,
        execution: None,
        finished: false,
    };
    (Arc::new(sender), stream)
}

fn size(item: &StreamItem) -> usize {
    match &item.response {
        Some(Ok(r)) => r.outputs.iter().map(|t| t.data.len()).sum(),
        _ => 0,
    }
}

impl ResponseStream {
    /// The next message; `None` after the final flag. A request the model
    /// let go of without the final flag gets one (with no response), so a
    /// client is never left waiting.
    pub async fn next(&mut self) -> Option<StreamItem> {
        if self.finished {
            return None;
        }
        let item = self.receive().await;
        self.finished = item.as_ref().is_none_or(|i| i.last);
        Some(item.unwrap_or(StreamItem {
            response: None,
            last: true,
        }))
    }

    async fn receive(&mut self) -> Option<StreamItem> {
        loop {
            let item = match self.execution.as_mut() {
                None => self.rx.recv().await,
                Some((execution, sender)) => tokio::select! {
                    item = self.rx.recv() => item,
                    result = execution => {
                        if let Err(e) = result {
                            let _ = sender.send(Some(Err(e)), true);
                        }
                        // The stream now ends when the backend lets go of the request.
                        self.execution = None;
                        continue;
                    }
                },
            }?;
            self.buffered.fetch_sub(size(&item), Ordering::Relaxed);
            return Some(item);
        }
    }

    /// Gives the stream its request's execution (the future that queues and
    /// runs it) and the sender, which carries a failure of the execution.
    pub fn drive(&mut self, execution: tern_core::router::InferFuture, sender: Arc<Sender>) {
        self.execution = Some((execution, sender));
    }
}

impl tern_core::router::ResponseStream for ResponseStream {
    fn next(&mut self) -> tern_core::router::NextFuture<'_> {
        Box::pin(ResponseStream::next(self))
    }
}

/// One response as a stream: what a model that is not decoupled gives a
/// caller that asked for a stream.
pub struct Single(Option<tern_core::router::InferFuture>);

impl Single {
    /// The stream of `future`'s one response.
    pub fn new(future: tern_core::router::InferFuture) -> Single {
        Single(Some(future))
    }
}

impl tern_core::router::ResponseStream for Single {
    fn next(&mut self) -> tern_core::router::NextFuture<'_> {
        Box::pin(async move {
            let future = self.0.take()?;
            Some(StreamItem {
                response: Some(future.await),
                last: true,
            })
        })
    }
}

impl ResponseSink for Sender {
    fn send(&self, response: Option<Result<InferResponse>>, last: bool) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(tern_core::messages::sender_closed());
        }
        if self.tx.is_closed() {
            self.closed.store(true, Ordering::Release);
            return Err(cancelled(&self.model));
        }
        if response.is_some() && self.first.swap(false, Ordering::AcqRel) {
            if let Some(f) = &self.on_first {
                f();
            }
        }
        let response = response.map(|r| r.and_then(|r| (self.shape)(r)));
        let mut item = StreamItem { response, last };
        let held = self.buffered.fetch_add(size(&item), Ordering::Relaxed) + size(&item);
        let overflowed = held > MAX_BUFFERED_BYTES;
        if overflowed {
            self.buffered.fetch_sub(size(&item), Ordering::Relaxed);
            tracing::warn!(model = %self.model, "a response stream holds more than {MAX_BUFFERED_BYTES} unread bytes: failing it");
            item = StreamItem {
                response: Some(Err(Error::unavailable(format!("the client is not reading its response stream ({MAX_BUFFERED_BYTES} bytes unread)")).for_model(&self.model))),
                last: true,
            };
        }
        let last = item.last;
        if last {
            self.closed.store(true, Ordering::Release);
        }
        self.tx.send(item).map_err(|_| cancelled(&self.model))?;
        if overflowed {
            // The overflow error went out in place of this response: tell the model.
            return Err(Error::unavailable(
                "the response stream was closed: its client is not reading",
            )
            .for_model(&self.model));
        }
        Ok(())
    }

    fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

fn cancelled(model: &str) -> Error {
    Error::new(
        Code::Cancelled,
        format!("request for model '{model}' was cancelled: its client has gone away"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::{DataType, Tensor};

    fn response(bytes: usize) -> InferResponse {
        InferResponse {
            outputs: vec![Tensor::new(
                "Y",
                DataType::Uint8,
                vec![bytes as i64],
                vec![0; bytes],
            )],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn responses_then_the_final_flag_then_nothing() {
        let (tx, mut rx) = channel("m", Box::new(Ok), None);
        tx.send(Some(Ok(response(3))), false).unwrap();
        tx.send(None, true).unwrap();
        let e = tx.send(Some(Ok(response(1))), false).unwrap_err();
        assert!(e.message.contains("Response sender has been closed"), "{e}");
        assert!(!rx.next().await.unwrap().last);
        assert!(rx.next().await.unwrap().last);
        drop(tx);
        assert!(rx.next().await.is_none());
        // Let go of without the final flag: the stream still ends with one.
        let (tx, mut rx) = channel("m", Box::new(Ok), None);
        tx.send(Some(Ok(response(1))), false).unwrap();
        drop(tx);
        assert!(!rx.next().await.unwrap().last);
        let end = rx.next().await.unwrap();
        assert!(end.last && end.response.is_none());
        assert!(rx.next().await.is_none());
    }

    #[tokio::test]
    async fn a_client_that_goes_away_cancels_and_a_slow_one_is_cut_off() {
        let (tx, rx) = channel("m", Box::new(Ok), None);
        drop(rx);
        assert!(tx.is_cancelled());
        assert_eq!(tx.send(None, true).unwrap_err().code, Code::Cancelled);
        let (tx, mut rx) = channel("m", Box::new(Ok), None);
        let chunk = MAX_BUFFERED_BYTES / 4;
        for _ in 0..4 {
            tx.send(Some(Ok(response(chunk))), false).unwrap();
        }
        assert!(tx.send(Some(Ok(response(chunk))), false).is_err());
        assert!(tx.is_closed());
        for _ in 0..4 {
            rx.next().await.unwrap();
        }
        let overflow = rx.next().await.unwrap();
        assert!(overflow.last && overflow.response.unwrap().is_err());
    }
}
