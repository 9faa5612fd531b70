//! Request bodies: size limit, decompression, and collecting hyper's frames
//! into one buffer with as few copies and allocations as possible.
//!
//! A body declared larger than the limit is refused at once; the whole body
//! must arrive within the read timeout plus one second per KiB (a minimum
//! average rate), so a trickling client cannot hold its connection.
//!
//! A body that arrives in one frame is used as it is. A longer one is copied
//! frame by frame, as the frames arrive, into a recycled host-pool block (so
//! hyper can reuse its read buffer and nothing is allocated per request in
//! steady state), placed so that the binary tensor section starts 64-byte
//! aligned and its tensors can go to the backend in place.
//!
//! A traced response's body records its trace's last timestamp when hyper
//! has written it and let it go ([`Traced`]).

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use http_body_util::BodyExt;

use super::{compression, HttpState};
use tern_core::error::{Error, Result};
use tern_memory::pool::{pools, Block};

/// Alignment of the binary section in a joined body.
const ALIGN: usize = 64;

/// Triton's `kMaxChunkedChunks`: the most non-empty chunks a body without
/// `Content-Length` (chunked) may arrive in.
const MAX_CHUNKS: usize = 1 << 16;

/// What reading a body needs from the request headers, so the handler can
/// drop the headers first (they pin hyper's read buffer, which could then not
/// be reused for the body).
pub struct BodyHeaders {
    declared: Option<usize>,
    coding: Result<Option<compression::Coding>>,
}

impl BodyHeaders {
    /// `Content-Length` and `Content-Encoding` (an unsupported coding is
    /// reported once the body has been read).
    pub fn of(headers: &HeaderMap) -> BodyHeaders {
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let encoding = headers
            .get(header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap_or("<invalid>"));
        BodyHeaders {
            declared,
            coding: compression::content_coding(encoding),
        }
    }
}

/// Reads a request body up to `--http-max-input-size`, decompressing it when
/// `Content-Encoding` says so (the limit applies after decompression too).
pub async fn read_body(s: &HttpState, headers: &HeaderMap, body: Body) -> Result<Bytes> {
    read_kind(s, BodyHeaders::of(headers), body, 0, "HTTP").await
}

/// [`read_body`] for an inference request, with the headers already taken
/// apart; `binary_at` is where the binary tensor section starts (0 when none).
pub async fn read(
    s: &HttpState,
    headers: BodyHeaders,
    body: Body,
    binary_at: usize,
) -> Result<Bytes> {
    read_kind(s, headers, body, binary_at, "infer").await
}

/// Reads a body; `kind` names the request in Triton's chunk-limit error.
async fn read_kind(
    s: &HttpState,
    headers: BodyHeaders,
    body: Body,
    binary_at: usize,
    kind: &str,
) -> Result<Bytes> {
    let limit = s.max_input_size;
    let raw = gather(
        body,
        headers.declared,
        limit,
        s.read_timeout,
        binary_at,
        kind,
    )
    .await?;
    match headers.coding? {
        None => Ok(raw),
        Some(c) => compression::decompress(c, &raw, limit).map(Bytes::from),
    }
}

/// Collects the (still encoded) body of `declared` length, if known, up to
/// `limit` bytes and, without a length, [`MAX_CHUNKS`] non-empty chunks; an
/// oversized body is drained so the client reads the error.
async fn gather(
    mut body: Body,
    declared: Option<usize>,
    limit: usize,
    timeout: Option<std::time::Duration>,
    binary_at: usize,
    kind: &str,
) -> Result<Bytes> {
    let too_big = || {
        Error::invalid_arg(format!(
            "request body exceeds the maximum input size of {limit} bytes (--http-max-input-size)"
        ))
    };
    // Answered at once, without waiting for a body that may never come. The
    // body is still read and dropped in the background, within bounds, so a
    // client that writes it all before reading (most do) gets the answer
    // rather than a broken pipe; past the bounds the connection closes.
    if let Some(len) = declared.filter(|&len| len > limit) {
        tokio::spawn(discard(body, len.min(limit.max(DISCARD_MAX)), timeout));
        return Err(too_big());
    }
    let mut frames = Frames::Empty;
    let mut total = 0;
    let started = tokio::time::Instant::now();
    let mut last = started;
    loop {
        let wait = pace(timeout, started, total)?;
        let frame = match next_frame(&mut body, wait).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            // Nothing for a whole read timeout: stalled. Less: the whole-body
            // allowance ran out first (a trickle).
            Err(_) if timeout.is_some_and(|t| last.elapsed() + SLACK >= t) => {
                return Err(stalled(timeout.unwrap_or_default()))
            }
            Err(_) => return Err(too_slow(timeout, started, total)),
        };
        last = tokio::time::Instant::now();
        let frame = frame
            .map_err(|e| Error::invalid_arg(format!("failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        total += data.len();
        if total > limit {
            drain(body, timeout).await;
            return Err(too_big());
        }
        frames.push(data, declared, binary_at)?;
        if frames.kept() > MAX_CHUNKS {
            let chunks = frames.kept() + drain(body, timeout).await;
            return Err(Error::invalid_arg(format!(
                "Chunks in the {kind} request buffer exceed the limit {MAX_CHUNKS}, got {chunks} chunks"
            )));
        }
    }
    frames.finish(total, binary_at)
}

/// The frames read so far.
enum Frames {
    Empty,
    /// One frame: kept without a copy.
    One(Bytes),
    /// Copied into a block sized by `Content-Length`; `pad` bytes in, `at` bytes filled.
    Joined {
        block: Block,
        pad: usize,
        at: usize,
    },
    /// No `Content-Length` (chunked): kept, joined at the end.
    Kept(Vec<Bytes>),
}

impl Frames {
    /// How many frames are kept (a body without `Content-Length`).
    fn kept(&self) -> usize {
        match self {
            Frames::Kept(v) => v.len(),
            _ => 0,
        }
    }

    fn push(&mut self, data: Bytes, declared: Option<usize>, binary_at: usize) -> Result<()> {
        *self = match std::mem::replace(self, Frames::Empty) {
            // More to come: copy from the first frame on, so that no frame is held while hyper
            // reads the next one (a held frame keeps hyper from reusing its read buffer).
            Frames::Empty => match declared {
                Some(len) if len > data.len() => {
                    let (block, pad) = aligned_block(len, binary_at)?;
                    let mut joined = Frames::Joined { block, pad, at: 0 };
                    joined.push(data, declared, binary_at)?;
                    joined
                }
                Some(len) if data.len() > len => return Err(longer_than_declared()),
                _ => Frames::One(data),
            },
            Frames::One(first) => {
                if declared.is_some() {
                    return Err(longer_than_declared());
                }
                Frames::Kept(vec![first, data])
            }
            Frames::Joined { mut block, pad, at } => {
                let buf = &mut block.as_mut_slice()[pad..];
                let end = at + data.len();
                if end > buf.len() - (ALIGN - pad) {
                    return Err(longer_than_declared());
                }
                buf[at..end].copy_from_slice(&data);
                Frames::Joined {
                    block,
                    pad,
                    at: end,
                }
            }
            Frames::Kept(mut v) => {
                v.push(data);
                Frames::Kept(v)
            }
        };
        Ok(())
    }

    fn finish(self, total: usize, binary_at: usize) -> Result<Bytes> {
        Ok(match self {
            Frames::Empty => Bytes::new(),
            Frames::One(b) => b,
            Frames::Joined { block, pad, at } => block.freeze().slice(pad..pad + at),
            Frames::Kept(v) => {
                let (mut block, pad) = aligned_block(total, binary_at)?;
                let buf = &mut block.as_mut_slice()[pad..];
                let mut at = 0;
                for c in &v {
                    buf[at..at + c.len()].copy_from_slice(c);
                    at += c.len();
                }
                block.freeze().slice(pad..pad + total)
            }
        })
    }
}

fn longer_than_declared() -> Error {
    Error::invalid_arg("request body is longer than its Content-Length".to_string())
}

/// A host-pool block for `len` bytes and the padding that puts offset
/// `binary_at` of the data on an [`ALIGN`] boundary.
fn aligned_block(len: usize, binary_at: usize) -> Result<(Block, usize)> {
    let block = pools().host.take(len + ALIGN)?;
    let pad = (ALIGN - (block.ptr() + binary_at) % ALIGN) % ALIGN;
    Ok((block, pad))
}

/// The next body frame, failing when none arrives within `timeout`.
/// The most of an oversized body read and dropped after its error is sent
/// (or `--http-max-input-size`, when larger).
const DISCARD_MAX: usize = 64 << 20;

/// Reads and drops up to `max` bytes of a refused body, for at most the read
/// timeout between frames (10 s without one), then lets the connection go.
async fn discard(mut body: Body, max: usize, timeout: Option<std::time::Duration>) {
    let wait = Some(timeout.unwrap_or(std::time::Duration::from_secs(10)));
    let mut seen = 0;
    while seen < max {
        match next_frame(&mut body, wait).await {
            Ok(Some(Ok(frame))) => seen += frame.data_ref().map_or(0, |d| d.len()),
            _ => return,
        }
    }
}

async fn next_frame(
    body: &mut Body,
    timeout: Option<std::time::Duration>,
) -> Result<Option<std::result::Result<http_body::Frame<Bytes>, axum::Error>>> {
    match timeout {
        None => Ok(body.frame().await),
        Some(t) => tokio::time::timeout(t, body.frame())
            .await
            .map_err(|_| stalled(t)),
    }
}

fn stalled(t: std::time::Duration) -> Error {
    Error::invalid_arg(format!(
        "the request body stalled: no data for {} s (--http-read-timeout-secs)",
        t.as_secs_f64().round()
    ))
}

/// Timer slack when telling a stall from a trickle.
const SLACK: std::time::Duration = std::time::Duration::from_millis(20);

/// Slowest average a body may arrive at once `--http-read-timeout-secs`
/// has passed: bytes per second.
const MIN_BODY_RATE: u64 = 1024;

/// How long the next read may wait: the per-read timeout, bounded by the
/// whole body's allowance — the read timeout plus one second per
/// [`MIN_BODY_RATE`] bytes received — so a body trickling in just under the
/// read timeout cannot hold its connection forever.
fn pace(
    timeout: Option<std::time::Duration>,
    started: tokio::time::Instant,
    received: usize,
) -> Result<Option<std::time::Duration>> {
    let Some(t) = timeout else {
        return Ok(None);
    };
    let allowance = t + std::time::Duration::from_secs(received as u64 / MIN_BODY_RATE);
    let left = allowance.saturating_sub(started.elapsed());
    if left.is_zero() {
        return Err(too_slow(timeout, started, received));
    }
    Ok(Some(left.min(t)))
}

fn too_slow(
    timeout: Option<std::time::Duration>,
    started: tokio::time::Instant,
    received: usize,
) -> Error {
    Error::invalid_arg(format!(
        "the request body arrived too slowly: {received} bytes in {} s (after the first {} s, at least {MIN_BODY_RATE} bytes/s)",
        started.elapsed().as_secs(),
        timeout.unwrap_or_default().as_secs()
    ))
}

/// Reads and discards what is left of an oversized body (up to a cap) so the
/// client can read the error response instead of seeing a reset connection;
/// stops early when the body stalls for `timeout`. Returns how many
/// non-empty frames it read.
async fn drain(mut body: Body, timeout: Option<std::time::Duration>) -> usize {
    const CAP: usize = 1 << 30;
    let mut seen = 0usize;
    let mut frames = 0;
    while let Ok(Some(Ok(frame))) = next_frame(&mut body, timeout).await {
        let len = frame.data_ref().map(|d| d.len()).unwrap_or(0);
        frames += usize::from(len > 0);
        seen += len;
        if seen > CAP {
            break;
        }
    }
    frames
}

/// A response body that records `timestamp` on its trace when dropped,
/// which hyper does once the body is written (or the client has gone).
pub struct Traced {
    inner: Body,
    trace: std::sync::Arc<tern_core::trace::Trace>,
    timestamp: &'static str,
}

impl Traced {
    /// `inner`, timestamped on `trace` at its end.
    pub fn new(
        inner: Body,
        trace: std::sync::Arc<tern_core::trace::Trace>,
        timestamp: &'static str,
    ) -> Traced {
        Traced {
            inner,
            trace,
            timestamp,
        }
    }
}

impl http_body::Body for Traced {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        self.trace.timestamp(self.timestamp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(frames: &[&[u8]], declared: Option<usize>, binary_at: usize) -> Result<Bytes> {
        let mut f = Frames::Empty;
        let mut total = 0;
        for d in frames {
            total += d.len();
            f.push(Bytes::copy_from_slice(d), declared, binary_at)?;
        }
        f.finish(total, binary_at)
    }

    /// A body of `n` frames of `size` bytes each.
    struct Chunks {
        n: usize,
        size: usize,
        sent: usize,
    }

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Bytes>, Self::Error>>>
        {
            if self.sent == self.n {
                return std::task::Poll::Ready(None);
            }
            self.sent += 1;
            let data = Bytes::from(vec![b' '; self.size]);
            let frame = http_body::Frame::data(data);
            std::task::Poll::Ready(Some(Ok(frame)))
        }
    }

    async fn collect_chunks(n: usize, size: usize, declared: Option<usize>) -> Result<Bytes> {
        let body = Body::new(Chunks { n, size, sent: 0 });
        gather(body, declared, 1 << 30, None, 0, "infer").await
    }

    #[tokio::test]
    async fn chunk_limit_without_a_length() {
        let ok = collect_chunks(MAX_CHUNKS, 1, None).await.unwrap();
        assert_eq!(ok.len(), MAX_CHUNKS);
        let e = collect_chunks(MAX_CHUNKS + 5, 1, None).await.unwrap_err();
        assert_eq!(
            e.message,
            "Chunks in the infer request buffer exceed the limit 65536, got 65541 chunks"
        );
        // Empty frames do not count.
        let ok = collect_chunks(2 * MAX_CHUNKS, 0, None).await.unwrap();
        assert!(ok.is_empty());
        // With a Content-Length the frames are copied as they come: no limit.
        let n = MAX_CHUNKS + 5;
        let ok = collect_chunks(n, 1, Some(n)).await.unwrap();
        assert_eq!(ok.len(), n);
    }

    #[test]
    fn frames_join_aligned_with_or_without_a_length() {
        let one = collect(&[b"abc"], Some(3), 0).unwrap();
        assert_eq!(&one[..], b"abc");
        for declared in [Some(10), None] {
            let joined = collect(&[b"{h}", b"0123", b"456"], declared, 3).unwrap();
            assert_eq!(&joined[..], b"{h}0123456");
            assert_eq!(joined[3..].as_ptr() as usize % ALIGN, 0, "{declared:?}");
        }
        assert!(collect(&[], None, 0).unwrap().is_empty());
        for frames in [&[&b"0123"[..], b"45"][..], &[b"012345"]] {
            let e = collect(frames, Some(5), 0).unwrap_err();
            assert!(e.message.contains("longer than its Content-Length"));
        }
    }
}
