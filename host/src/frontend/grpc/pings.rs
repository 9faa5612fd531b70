//! gRPC core's HTTP/2 PING rules, which hyper does not implement: a client
//! that pings too often gets `GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")`
//! and the connection is closed; the server's own keepalive pings respect
//! `--grpc-keepalive-permit-without-calls` and
//! `--grpc-http2-max-pings-without-data`.
//!
//! [`PingGuard`] wraps a connection's plaintext byte stream below hyper and
//! watches the frame headers going each way (it never buffers or copies
//! payloads). Outgoing frames are only ever cut at frame boundaries, so
//! injected frames (the GOAWAY) never split one of hyper's.
//!
//! Rules, as in gRPC core (`ping_abuse_policy.cc`, `ping_rate_policy.cc`):
//! * A client PING arriving sooner than the allowed interval after the
//!   previous one is a strike; the allowed interval is
//!   `--grpc-http2-min-recv-ping-interval-without-data`, or two hours when
//!   no call is open and `--grpc-keepalive-permit-without-calls` is false.
//!   More than `--grpc-http2-max-ping-strikes` strikes (0 = unlimited) close
//!   the connection. Sending HEADERS or DATA resets the strikes.
//! * A server keepalive PING is not sent when no call is open (unless
//!   permitted without calls), nor after `--grpc-http2-max-pings-without-data`
//!   pings with no HEADERS/DATA sent in between (0 = unlimited). hyper's
//!   keepalive timer cannot be paused, so such a ping is withheld from the
//!   wire and answered locally; the connection stays up, as in gRPC core.

use std::collections::HashSet;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const HEAD_LEN: usize = 9;
const PING_LEN: usize = HEAD_LEN + 8;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_STREAM: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;
const GOAWAY_DEBUG: &[u8] = b"too_many_pings";
/// gRPC core's ping interval without calls when they are not permitted.
const IDLE_PING_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);

/// The PING settings (tritonserver flags of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingPolicy {
    /// `--grpc-keepalive-permit-without-calls`.
    pub permit_without_calls: bool,
    /// `--grpc-http2-max-pings-without-data` (0 = unlimited).
    pub max_pings_without_data: u32,
    /// `--grpc-http2-min-recv-ping-interval-without-data`.
    pub min_recv_ping_interval: Duration,
    /// `--grpc-http2-max-ping-strikes` (0 = unlimited).
    pub max_ping_strikes: u32,
}

impl Default for PingPolicy {
    /// tritonserver's defaults.
    fn default() -> Self {
        PingPolicy {
            permit_without_calls: false,
            max_pings_without_data: 2,
            min_recv_ping_interval: Duration::from_millis(300_000),
            max_ping_strikes: 2,
        }
    }
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    kind: u8,
    flags: u8,
    stream: u32,
}

fn parse_head(b: &[u8]) -> (Head, usize) {
    let len = (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize;
    let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
    (
        Head {
            kind: b[3],
            flags: b[4],
            stream,
        },
        len,
    )
}

/// Tracks frame boundaries in one direction of an HTTP/2 byte stream.
#[derive(Debug, Clone, Copy)]
struct Framer {
    /// Connection preface bytes still to pass (client to server only).
    skip: usize,
    head: [u8; HEAD_LEN],
    have: usize,
    payload_left: usize,
}

impl Framer {
    fn new(skip: usize) -> Self {
        Framer {
            skip,
            head: [0; HEAD_LEN],
            have: 0,
            payload_left: 0,
        }
    }

    fn at_boundary(&self) -> bool {
        self.skip == 0 && self.have == 0 && self.payload_left == 0
    }

    /// Bytes that can pass before the next frame boundary (0 at a boundary).
    fn until_boundary(&self) -> usize {
        if self.skip > 0 {
            self.skip
        } else if self.have > 0 {
            HEAD_LEN - self.have
        } else {
            self.payload_left
        }
    }

    /// Consumes `bytes`, calling `on_head` for each completed frame header.
    fn feed(&mut self, mut bytes: &[u8], mut on_head: impl FnMut(Head)) {
        while !bytes.is_empty() {
            if self.skip > 0 || self.payload_left > 0 {
                let left = if self.skip > 0 {
                    &mut self.skip
                } else {
                    &mut self.payload_left
                };
                let n = (*left).min(bytes.len());
                *left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEAD_LEN - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == HEAD_LEN {
                self.have = 0;
                let (head, len) = parse_head(&self.head);
                self.payload_left = len;
                on_head(head);
            }
        }
    }

    /// How many of `buf`'s bytes pass before the first frame boundary past
    /// the start at which `stop` says to stop (the whole buffer if none).
    fn len_before(&self, buf: &[u8], stop: impl Fn(&[u8]) -> bool) -> usize {
        let mut probe = *self;
        let mut pos = 0;
        while pos < buf.len() {
            if pos > 0 && probe.at_boundary() && stop(&buf[pos..]) {
                return pos;
            }
            let step = if probe.at_boundary() {
                HEAD_LEN.min(buf.len() - pos)
            } else {
                probe.until_boundary().min(buf.len() - pos)
            };
            probe.feed(&buf[pos..pos + step], |_| {});
            pos += step;
        }
        buf.len()
    }
}

/// The PING bookkeeping of one connection.
#[derive(Debug)]
struct State {
    policy: PingPolicy,
    open_streams: HashSet<u32>,
    last_client_stream: u32,
    last_ping_recv: Option<Instant>,
    strikes: u32,
    pings_sent_without_data: u32,
}

impl State {
    fn idle(&self) -> bool {
        self.open_streams.is_empty()
    }

    /// A client frame header; true when the connection must be closed.
    fn received(&mut self, h: Head, now: Instant) -> bool {
        match h.kind {
            HEADERS if h.stream % 2 == 1 && h.stream > self.last_client_stream => {
                self.last_client_stream = h.stream;
                self.open_streams.insert(h.stream);
            }
            RST_STREAM => {
                self.open_streams.remove(&h.stream);
            }
            PING if h.flags & FLAG_ACK == 0 => {
                let interval = if self.idle() && !self.policy.permit_without_calls {
                    IDLE_PING_INTERVAL
                } else {
                    self.policy.min_recv_ping_interval
                };
                let too_soon = self
                    .last_ping_recv
                    .is_some_and(|last| now < last + interval);
                self.last_ping_recv = Some(now);
                if too_soon {
                    self.strikes += 1;
                    return self.policy.max_ping_strikes != 0
                        && self.strikes > self.policy.max_ping_strikes;
                }
            }
            _ => {}
        }
        false
    }

    /// A server frame header.
    fn sent(&mut self, h: Head) {
        match h.kind {
            HEADERS | DATA => {
                self.last_ping_recv = None;
                self.strikes = 0;
                self.pings_sent_without_data = 0;
                if h.flags & FLAG_END_STREAM != 0 {
                    self.open_streams.remove(&h.stream);
                }
            }
            RST_STREAM => {
                self.open_streams.remove(&h.stream);
            }
            _ => {}
        }
    }

    /// Whether a server keepalive PING may go on the wire now (counted if so).
    fn may_send_ping(&mut self) -> bool {
        if self.idle() && !self.policy.permit_without_calls {
            return false;
        }
        if self.policy.max_pings_without_data != 0
            && self.pings_sent_without_data >= self.policy.max_pings_without_data
        {
            return false;
        }
        self.pings_sent_without_data += 1;
        true
    }

    fn goaway(&self) -> Vec<u8> {
        let len = 8 + GOAWAY_DEBUG.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            0x7,
            0,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(&self.last_client_stream.to_be_bytes());
        f.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
        f.extend_from_slice(GOAWAY_DEBUG);
        f
    }
}

/// Whether `buf` starts with a whole outgoing PING that is not an ACK.
fn starts_with_ping(buf: &[u8]) -> bool {
    buf.len() >= PING_LEN && {
        let (h, len) = parse_head(buf);
        h.kind == PING && h.flags & FLAG_ACK == 0 && len == 8
    }
}

/// A server-side HTTP/2 connection with gRPC core's PING rules (see the
/// module doc).
pub struct PingGuard<T> {
    inner: T,
    state: State,
    read: Framer,
    write: Framer,
    /// PING ACKs answering withheld keepalive pings, to hand to hyper.
    to_reader: Vec<u8>,
    /// The GOAWAY to send before closing.
    goaway: Option<Vec<u8>>,
    /// GOAWAY sent: reads see end of stream, writes fail.
    closed: bool,
    read_waker: Option<Waker>,
}

impl<T> PingGuard<T> {
    /// Wraps a server-side connection (before any byte was read or written).
    pub fn new(inner: T, policy: PingPolicy) -> Self {
        PingGuard {
            inner,
            state: State {
                policy,
                open_streams: HashSet::new(),
                last_client_stream: 0,
                last_ping_recv: None,
                strikes: 0,
                pings_sent_without_data: 0,
            },
            read: Framer::new(PREFACE_LEN),
            write: Framer::new(0),
            to_reader: Vec::new(),
            goaway: None,
            closed: false,
            read_waker: None,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    fn wake_reader(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
    }
}

impl<T: AsyncWrite + Unpin> PingGuard<T> {
    /// Writes the pending GOAWAY if the outgoing stream is at a frame
    /// boundary; Ready once there is nothing (more) to send now.
    fn poll_goaway(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write.at_boundary() {
            return Poll::Ready(Ok(()));
        }
        while let Some(frame) = &mut self.goaway {
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, frame))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            frame.drain(..n);
            if frame.is_empty() {
                self.goaway = None;
                self.closed = true;
                tracing::warn!(
                    "gRPC client pinged too often: sent GOAWAY ENHANCE_YOUR_CALM (too_many_pings) and closed the connection"
                );
                self.wake_reader();
                let _ = Pin::new(&mut self.inner).poll_flush(cx);
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for PingGuard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.goaway.is_some() {
            std::task::ready!(this.poll_goaway(cx))?;
        }
        if this.closed {
            return Poll::Ready(Ok(()));
        }
        if !this.to_reader.is_empty() && this.read.at_boundary() {
            let n = this.to_reader.len().min(buf.remaining());
            buf.put_slice(&this.to_reader[..n]);
            this.to_reader.drain(..n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let result = if this.to_reader.is_empty() {
            Pin::new(&mut this.inner).poll_read(cx, buf)
        } else {
            // Stop at the next boundary so the ACK can follow.
            let mut part = buf.take(this.read.until_boundary());
            let r = Pin::new(&mut this.inner).poll_read(cx, &mut part);
            let n = part.filled().len();
            // SAFETY: `part` filled (initialised) the first `n` unfilled bytes of `buf`.
            unsafe { buf.assume_init(n) };
            buf.advance(n);
            r
        };
        match result {
            Poll::Pending => {
                this.read_waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Poll::Ready(Ok(())) => {
                let now = Instant::now();
                let (state, read) = (&mut this.state, &mut this.read);
                let mut calm = false;
                read.feed(&buf.filled()[before..], |h| calm |= state.received(h, now));
                if calm && this.goaway.is_none() && !this.closed {
                    this.goaway = Some(this.state.goaway());
                    let _ = this.poll_goaway(cx)?;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PingGuard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.goaway.is_some() {
            std::task::ready!(this.poll_goaway(cx))?;
        }
        if this.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection closed after too many pings",
            )));
        }
        if this.write.at_boundary() && starts_with_ping(buf) && !this.state.may_send_ping() {
            // Withhold hyper's keepalive ping and answer it as the peer would.
            let mut ack = buf[..PING_LEN].to_vec();
            ack[4] = FLAG_ACK;
            this.to_reader.extend_from_slice(&ack);
            this.write.feed(&buf[..PING_LEN], |_| {});
            this.wake_reader();
            return Poll::Ready(Ok(PING_LEN));
        }
        // Pass whole frames up to the next PING (decided on the next call)
        // or, with a GOAWAY pending, up to the next boundary.
        let pending_goaway = this.goaway.is_some();
        let n = this
            .write
            .len_before(buf, |rest| pending_goaway || starts_with_ping(rest));
        let written = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..n]))?;
        let (state, write) = (&mut this.state, &mut this.write);
        write.feed(&buf[..written], |h| state.sent(h));
        if this.goaway.is_some() {
            let _ = this.poll_goaway(cx)?;
        }
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // The common case, no PING among the frames and no GOAWAY pending:
        // hand all slices down in one call (one syscall for header + payload).
        let mut probe = this.write;
        let mut has_ping = false;
        for b in bufs {
            probe.feed(b, |h| has_ping |= h.kind == PING && h.flags & FLAG_ACK == 0);
        }
        if has_ping || this.goaway.is_some() || this.closed {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return Pin::new(this).poll_write(cx, first);
        }
        let written = std::task::ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        let (state, write) = (&mut this.state, &mut this.write);
        let mut left = written;
        for b in bufs {
            let n = left.min(b.len());
            write.feed(&b[..n], |h| state.sent(h));
            left -= n;
            if left == 0 {
                break;
            }
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.goaway.is_some() {
            std::task::ready!(this.poll_goaway(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn policy(strikes: u32, permit: bool) -> PingPolicy {
        PingPolicy {
            permit_without_calls: permit,
            max_pings_without_data: 2,
            min_recv_ping_interval: Duration::from_secs(300),
            max_ping_strikes: strikes,
        }
    }

    #[test]
    fn framer_finds_heads_across_splits() {
        let mut bytes = vec![b'P'; PREFACE_LEN];
        bytes.extend(frame(0x4, 0, 0, &[1, 2, 3, 4, 5, 6]));
        bytes.extend(frame(PING, 0, 0, &[9; 8]));
        bytes.extend(frame(HEADERS, 0x4, 1, &[7; 20]));
        for split in 1..bytes.len() {
            let mut f = Framer::new(PREFACE_LEN);
            let mut heads = Vec::new();
            for chunk in bytes.chunks(split) {
                f.feed(chunk, |h| heads.push(h.kind));
            }
            assert_eq!(heads, vec![0x4, PING, HEADERS], "split {split}");
            assert!(f.at_boundary());
        }
    }

    #[test]
    fn len_before_stops_at_a_later_ping_only() {
        let mut buf = frame(DATA, 0, 1, &[0; 5]);
        let first = buf.len();
        buf.extend(frame(PING, 0, 0, &[1; 8]));
        let f = Framer::new(0);
        assert_eq!(f.len_before(&buf, starts_with_ping), first);
        assert_eq!(f.len_before(&buf[first..], starts_with_ping), PING_LEN);
        assert_eq!(f.len_before(&buf, |_| true), first);
    }

    #[test]
    fn strikes_follow_grpc_core() {
        let t0 = Instant::now();
        let ping = Head {
            kind: PING,
            flags: 0,
            stream: 0,
        };
        let mut s = PingGuard::new((), policy(2, true)).state;
        assert!(!s.received(ping, t0), "first ping is never a strike");
        assert!(!s.received(ping, t0));
        assert!(!s.received(ping, t0));
        assert!(s.received(ping, t0), "third strike closes");
        // Pings at the allowed interval are fine forever.
        let mut s = PingGuard::new((), policy(2, true)).state;
        for i in 0..10 {
            assert!(!s.received(ping, t0 + Duration::from_secs(300 * i)));
        }
        // Sending data resets the strikes.
        let mut s = PingGuard::new((), policy(1, true)).state;
        assert!(!s.received(ping, t0));
        assert!(!s.received(ping, t0));
        s.sent(Head {
            kind: DATA,
            flags: 0,
            stream: 1,
        });
        assert!(!s.received(ping, t0));
        assert!(!s.received(ping, t0));
        assert!(s.received(ping, t0));
        // 0 strikes = unlimited.
        let mut s = PingGuard::new((), policy(0, true)).state;
        assert!((0..100).all(|_| !s.received(ping, t0)));
    }

    #[test]
    fn idle_pings_without_permission_need_two_hours() {
        let t0 = Instant::now();
        let ping = Head {
            kind: PING,
            flags: 0,
            stream: 0,
        };
        let mut s = PingGuard::new((), policy(1, false)).state;
        assert!(!s.received(ping, t0));
        assert!(!s.received(ping, t0 + Duration::from_secs(400)));
        assert!(s.received(ping, t0 + Duration::from_secs(800)));
        // With a call open, the normal interval applies.
        let mut s = PingGuard::new((), policy(1, false)).state;
        s.received(
            Head {
                kind: HEADERS,
                flags: 0x4,
                stream: 1,
            },
            t0,
        );
        for i in 0..5 {
            assert!(!s.received(ping, t0 + Duration::from_secs(300 * i)));
        }
        // The call ends: idle rules again.
        s.sent(Head {
            kind: HEADERS,
            flags: FLAG_END_STREAM | 0x4,
            stream: 1,
        });
        assert!(s.idle());
    }

    #[test]
    fn server_pings_need_calls_and_data() {
        let mut s = PingGuard::new((), policy(2, false)).state;
        assert!(!s.may_send_ping(), "no call open");
        s.open_streams.insert(1);
        assert!(s.may_send_ping());
        assert!(s.may_send_ping());
        assert!(!s.may_send_ping(), "max_pings_without_data = 2");
        s.sent(Head {
            kind: DATA,
            flags: 0,
            stream: 1,
        });
        assert!(s.may_send_ping());
    }

    #[tokio::test]
    async fn ping_flood_gets_goaway_and_eof() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut guard = PingGuard::new(server, policy(2, true));
        let (mut cr, mut cw) = tokio::io::split(client);
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(HEADERS, 0x4, 3, &[0; 4]));
        for _ in 0..4 {
            bytes.extend(frame(PING, 0, 0, &[1; 8]));
        }
        cw.write_all(&bytes).await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            let n = guard.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        assert_eq!(
            seen, bytes,
            "everything up to the last strike reaches hyper"
        );
        let mut goaway = vec![0u8; HEAD_LEN + 8 + GOAWAY_DEBUG.len()];
        cr.read_exact(&mut goaway).await.unwrap();
        assert_eq!(goaway[3], 0x7);
        assert_eq!(&goaway[9..13], &3u32.to_be_bytes(), "last stream id");
        assert_eq!(&goaway[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert_eq!(&goaway[17..], GOAWAY_DEBUG);
        assert!(guard.write(b"x").await.is_err());
    }

    #[tokio::test]
    async fn withheld_keepalive_ping_is_acked_locally() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut guard = PingGuard::new(server, policy(2, false));
        let (mut cr, mut cw) = tokio::io::split(client);
        let settings = frame(0x4, 0, 0, &[]);
        let ping = frame(PING, 0, 0, &[5; 8]);
        let mut out = settings.clone();
        out.extend_from_slice(&ping);
        guard.write_all(&out).await.unwrap();
        guard.flush().await.unwrap();
        // Only SETTINGS went out; the PING (no call open) was answered here.
        let mut got = vec![0u8; settings.len()];
        cr.read_exact(&mut got).await.unwrap();
        assert_eq!(got, settings);
        // Once the client's preface has passed, hyper gets the ACK.
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        cw.write_all(preface).await.unwrap();
        let mut got = [0u8; PREFACE_LEN];
        guard.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, preface);
        let mut ack = [0u8; PING_LEN];
        guard.read_exact(&mut ack).await.unwrap();
        assert_eq!(ack[3], PING);
        assert_eq!(ack[4], FLAG_ACK);
        assert_eq!(&ack[9..], &[5; 8]);
        drop(cw.shutdown().await);
    }
}
