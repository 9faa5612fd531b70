//! Request bodies: size limits, decompression, and collecting hyper's frames
//! into one buffer with as few copies and allocations as possible.
//!
//! The limits are current Triton's: `--http-max-input-size` bounds a JSON
//! body (every endpoint), the JSON header of an inference request
//! (`Inference-Header-Content-Length`), a raw binary request (that header
//! `0`) and what a compressed body inflates to, each with Triton's text.
//! Binary tensor data after a JSON header is not bounded by it, as in
//! Triton; [`MAX_BODY`] (2 GiB - 1, Triton's largest `Content-Length` and
//! gRPC's message limit) bounds every body. A body declared too large is
//! refused at once; the whole body must arrive within the read timeout plus
//! one second per KiB (a minimum average rate), so a trickling client cannot
//! hold its connection.
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
use tern_core::messages;
use tern_memory::pool::{pools, Block};

/// Alignment of the binary section in a joined body.
const ALIGN: usize = 64;

/// Triton's `kMaxChunkedChunks`: the most non-empty chunks a body without
/// `Content-Length` (chunked) may arrive in.
const MAX_CHUNKS: usize = 1 << 16;

/// The most bytes any HTTP request body may have, whatever
/// `--http-max-input-size` says: `i32::MAX`, the largest `Content-Length`
/// Triton takes and Tern's (and Triton's) gRPC message limit. Binary tensor
/// data after a JSON header is bounded by this alone.
pub const MAX_BODY: usize = i32::MAX as usize;

/// What an inference body holds, by its `Inference-Header-Content-Length`,
/// and so which of Triton's limits applies to it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    /// All JSON (no such header, and every endpoint but inference).
    Json,
    /// The raw binary form (header `0`): the data of the model's one input.
    Raw,
    /// A JSON header of this many bytes, then binary tensor data.
    Header(usize),
}

/// What reading a body needs from the request headers, so the handler can
/// drop the headers first (they pin hyper's read buffer, which could then not
/// be reused for the body).
pub struct BodyHeaders {
    declared: Option<usize>,
    coding: Result<Option<compression::Coding>>,
    form: Form,
}

impl BodyHeaders {
    /// `Content-Length`, `Content-Encoding` (an unsupported coding is
    /// reported once the body has been read) and
    /// `Inference-Header-Content-Length` (its errors are the caller's).
    pub fn of(headers: &HeaderMap) -> BodyHeaders {
        let number = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        let encoding = headers
            .get(header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap_or("<invalid>"));
        BodyHeaders {
            declared: number(header::CONTENT_LENGTH.as_str()),
            coding: compression::content_coding(encoding),
            form: match number("inference-header-content-length") {
                None => Form::Json,
                Some(0) => Form::Raw,
                Some(n) => Form::Header(n),
            },
        }
    }
}

/// The limits on one body.
#[derive(Debug, Clone, Copy)]
struct Limits {
    form: Form,
    /// `--http-max-input-size`.
    limit: usize,
    /// `Content-Encoding` gzip or deflate.
    compressed: bool,
    /// An inference request (Triton checks its `Content-Length` as an `i32`).
    infer: bool,
}

impl Limits {
    /// The most bytes the body may have as sent. A compressed body gets what
    /// incompressible data can grow by (deflate's stored blocks, the gzip
    /// header): larger, it cannot inflate within the limit.
    fn cap(&self) -> usize {
        let cap = match self.form {
            _ if self.compressed => self.limit.saturating_add(self.limit / 1024 + (64 << 10)),
            Form::Header(_) => MAX_BODY,
            Form::Json | Form::Raw => self.limit,
        };
        cap.min(MAX_BODY)
    }

    /// The error for a body of `len` bytes (`declared` by `Content-Length`,
    /// or at least that many read) over [`Limits::cap`], in Triton's words.
    fn too_big(&self, len: usize, declared: bool) -> Error {
        match self.form {
            _ if self.compressed => messages::decompressed_too_large(self.limit),
            _ if self.infer && declared && len > MAX_BODY => {
                messages::content_length_out_of_range(&len.to_string())
            }
            Form::Json if len > self.limit => messages::json_too_large(len, self.limit),
            Form::Raw if len > self.limit => messages::raw_input_too_large(len, self.limit),
            _ => Error::invalid_arg(format!(
                "request body of {len} bytes exceeds {MAX_BODY} bytes, the most an HTTP request may carry"
            )),
        }
    }

    /// The error for a JSON header longer than the limit, for a body of
    /// `len` bytes; none when the header is longer than the body (the
    /// decoder reports that, as Triton does first).
    fn header_too_big(&self, len: usize) -> Option<Error> {
        match self.form {
            Form::Header(n) if !self.compressed && n > self.limit && n <= len => {
                Some(messages::json_too_large(n, self.limit))
            }
            _ => None,
        }
    }
}

/// Reads a request body that is all JSON, up to `--http-max-input-size`,
/// decompressing it when `Content-Encoding` says so (the limit applies after
/// decompression too).
pub async fn read_body(s: &HttpState, headers: &HeaderMap, body: Body) -> Result<Bytes> {
    let headers = BodyHeaders {
        form: Form::Json,
        ..BodyHeaders::of(headers)
    };
    read_kind(s, headers, body, 0, false).await
}

/// [`read_body`] for an inference request, with the headers already taken
/// apart; `binary_at` is where the binary tensor section starts (0 when none).
pub async fn read(
    s: &HttpState,
    headers: BodyHeaders,
    body: Body,
    binary_at: usize,
) -> Result<Bytes> {
    read_kind(s, headers, body, binary_at, true).await
}

/// Reads a body; `infer`: an inference request (which Triton's chunk-limit
/// error names, and whose `Inference-Header-Content-Length` counts).
async fn read_kind(
    s: &HttpState,
    headers: BodyHeaders,
    body: Body,
    binary_at: usize,
    infer: bool,
) -> Result<Bytes> {
    let limits = Limits {
        form: headers.form,
        limit: s.max_input_size,
        compressed: matches!(headers.coding, Ok(Some(_))),
        infer,
    };
    let kind = if infer { "infer" } else { "HTTP" };
    let raw = gather(
        body,
        headers.declared,
        limits,
        s.read_timeout,
        binary_at,
        kind,
    )
    .await?;
    match headers.coding? {
        None => Ok(raw),
        Some(c) => compression::decompress(c, &raw, limits.limit).map(Bytes::from),
    }
}

/// Collects the (still encoded) body of `declared` length, if known, within
/// `limits` and, without a length, [`MAX_CHUNKS`] non-empty chunks; an
/// oversized body is drained so the client reads the error.
async fn gather(
    mut body: Body,
    declared: Option<usize>,
    limits: Limits,
    timeout: Option<std::time::Duration>,
    binary_at: usize,
    kind: &str,
) -> Result<Bytes> {
    let cap = limits.cap();
    // Answered at once, without waiting for a body that may never come. The
    // body is still read and dropped in the background, within bounds, so a
    // client that writes it all before reading (most do) gets the answer
    // rather than a broken pipe; past the bounds the connection closes.
    if let Some(len) = declared {
        let refused = match len > cap {
            true => Some(limits.too_big(len, true)),
            false => limits.header_too_big(len),
        };
        if let Some(e) = refused {
            let max = len.min(limits.limit.max(DISCARD_MAX));
            tokio::spawn(discard(body, max, timeout));
            return Err(e);
        }
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
        if total > cap {
            let (_, rest) = drain(body, timeout).await;
            return Err(limits.too_big(total + rest, false));
        }
        frames.push(data, declared, binary_at)?;
        if frames.kept() > MAX_CHUNKS {
            let chunks = frames.kept() + drain(body, timeout).await.0;
            return Err(Error::invalid_arg(format!(
                "Chunks in the {kind} request buffer exceed the limit {MAX_CHUNKS}, got {chunks} chunks"
            )));
        }
    }
    if let Some(e) = limits.header_too_big(total) {
        return Err(e);
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
/// non-empty frames and how many bytes it read (for a body past the cap,
/// a lower bound).
async fn drain(mut body: Body, timeout: Option<std::time::Duration>) -> (usize, usize) {
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
    (frames, seen)
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

    fn limits(form: Form, limit: usize) -> Limits {
        Limits {
            form,
            limit,
            compressed: false,
            infer: true,
        }
    }

    async fn collect_chunks(n: usize, size: usize, declared: Option<usize>) -> Result<Bytes> {
        let body = Body::new(Chunks { n, size, sent: 0 });
        gather(
            body,
            declared,
            limits(Form::Json, 1 << 30),
            None,
            0,
            "infer",
        )
        .await
    }

    /// `n` frames of `size` bytes, `declared` or not, read under `l`.
    async fn gather_under(l: Limits, n: usize, size: usize, declared: bool) -> Result<Bytes> {
        let body = Body::new(Chunks { n, size, sent: 0 });
        gather(body, declared.then_some(n * size), l, None, 0, "infer").await
    }

    #[tokio::test]
    async fn limits_follow_the_body_form_in_tritons_words() {
        let tail = "Use --http-max-input-size to increase the limit.";
        for declared in [true, false] {
            // All JSON: the whole body counts.
            let e = gather_under(limits(Form::Json, 100), 3, 40, declared)
                .await
                .unwrap_err();
            assert_eq!(
                e.message,
                format!("request JSON size of 120 bytes exceeds the maximum allowed input size of 100 bytes. {tail}")
            );
            // Raw binary: the same bound, its own text.
            let e = gather_under(limits(Form::Raw, 100), 3, 40, declared)
                .await
                .unwrap_err();
            assert_eq!(
                e.message,
                format!("Raw input has a byte_size (120 bytes) that exceeds the maximum allowed value of 100 bytes. {tail}")
            );
            // A JSON header within the limit: binary data after it is not bounded by it.
            let ok = gather_under(limits(Form::Header(50), 100), 10, 40, declared)
                .await
                .unwrap();
            assert_eq!(ok.len(), 400);
            // A header over the limit is refused by its own length.
            let e = gather_under(limits(Form::Header(101), 100), 10, 40, declared)
                .await
                .unwrap_err();
            assert_eq!(
                e.message,
                format!("request JSON size of 101 bytes exceeds the maximum allowed input size of 100 bytes. {tail}")
            );
            // ... unless it is longer than the body: the decoder says so.
            assert!(
                gather_under(limits(Form::Header(500), 100), 10, 40, declared)
                    .await
                    .is_ok()
            );
            // Compressed: what it inflates to counts; far larger cannot fit.
            let mut zipped = limits(Form::Json, 100);
            zipped.compressed = true;
            assert_eq!(zipped.cap(), 100 + (64 << 10));
            assert!(gather_under(zipped, 3, 40, declared).await.is_ok());
            let e = gather_under(zipped, 100, 1000, declared).await.unwrap_err();
            assert_eq!(
                e.message,
                format!(
                    "Decompressed data size exceeds the maximum allowed value of 100 bytes. {tail}"
                )
            );
        }
        // Past i32::MAX: Triton cannot parse an inference Content-Length;
        // other endpoints' JSON is over the limit.
        let l = limits(Form::Header(10), 100);
        assert_eq!(l.cap(), MAX_BODY);
        assert_eq!(
            l.too_big(MAX_BODY + 1, true).message,
            "Unable to parse Content-Length, value is out of range [ -2147483648, 2147483647 ], got: 2147483648"
        );
        assert_eq!(
            l.too_big(MAX_BODY + 1, false).message,
            "request body of 2147483648 bytes exceeds 2147483647 bytes, the most an HTTP request may carry"
        );
        let json = Limits {
            infer: false,
            ..limits(Form::Json, 100)
        };
        assert!(json
            .too_big(MAX_BODY + 1, true)
            .message
            .starts_with("request JSON size of 2147483648 bytes"));
        // A limit set above the cap: the cap still holds.
        assert_eq!(limits(Form::Json, usize::MAX).cap(), MAX_BODY);
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
