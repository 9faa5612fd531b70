//! The `:authority` of gRPC calls that arrive on a Unix-domain socket.
//!
//! gRPC's C core (so `tritonclient.grpc` through grpcio ≥ 1.57) and
//! grpc-java send the socket's path, percent-encoded, as the `:authority` of
//! every call on a `unix:` channel. That is not a valid authority, and the
//! HTTP/2 layer under tonic (h2) resets such a stream with PROTOCOL_ERROR
//! (hyperium/h2#487), so those clients could not call over a socket at all.
//! For connections on a Unix socket this module reads the client's frames,
//! decodes each header block (HPACK, with the client's dynamic table) and
//! hands the server the same headers with an invalid `:authority` replaced
//! by `localhost`, re-encoded as literals that leave the server's HPACK
//! table untouched. Every other frame passes through unchanged, and the
//! server's frames go straight to the client.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf, WriteHalf,
};

/// The HTTP/2 client connection preface.
const PREFACE_LEN: usize = 24;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE as the gRPC server announces it (h2's default,
/// which tonic keeps): a larger frame from the client is a protocol error
/// and ends the connection before anything is allocated for it; re-encoded
/// blocks are cut into frames no larger.
const MAX_FRAME: usize = 16_384;
/// SETTINGS_HEADER_TABLE_SIZE as the server announces it (h2's default): the
/// client's HPACK encoder may not use a larger dynamic table.
const HEADER_TABLE_SIZE: usize = 4_096;
/// The largest header block (compressed) and header list (decoded, counted
/// as HTTP/2 counts it: name + value + 32 per field) passed on; the server
/// itself accepts 16 KiB of header list. Larger ones end the connection, so
/// a client cannot make the rewrite buffer or copy without bound.
const MAX_BLOCK: usize = 64 << 10;

/// A connection whose client frames are read through [`fix_authority`]'s
/// rewriting; writes go to the connection unchanged.
pub struct Rewritten<S> {
    from_client: DuplexStream,
    to_client: WriteHalf<S>,
    /// The task reading the client: stopped when the server drops the
    /// connection, so a silent client cannot keep the socket open.
    pump: tokio::task::AbortHandle,
}

impl<S> Drop for Rewritten<S> {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

/// Wraps a Unix-socket connection so that its calls reach the server with a
/// valid `:authority` (see the module documentation).
pub fn fix_authority<S>(io: S) -> Rewritten<S>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (rewritten, server_side) = tokio::io::duplex(64 * 1024);
    let pump = tokio::spawn(async move {
        // Frame headers are read 9 bytes at a time: buffered, so that a
        // socket read brings many frames, as the server's own reads would.
        let read = tokio::io::BufReader::with_capacity(64 * 1024, read);
        if let Err(e) = pump(read, rewritten).await {
            tracing::debug!("gRPC connection on a Unix socket: {e}");
        }
    })
    .abort_handle();
    Rewritten {
        from_client: server_side,
        to_client: write,
        pump,
    }
}

impl<S: AsyncRead + AsyncWrite> AsyncRead for Rewritten<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().from_client).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite> AsyncWrite for Rewritten<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().to_client).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().to_client).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.to_client.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().to_client).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().to_client).poll_shutdown(cx)
    }
}

fn bad(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// Copies the client's bytes to the server side, header blocks rewritten.
/// Ends at the client's EOF, or when the server side is gone.
async fn pump<R: AsyncRead + Unpin>(mut from: R, mut to: DuplexStream) -> io::Result<()> {
    let mut preface = [0u8; PREFACE_LEN];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    let mut blocks = BlockRewriter::new();
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if len > MAX_FRAME {
            return Err(bad(format!(
                "a frame of {len} bytes, larger than SETTINGS_MAX_FRAME_SIZE"
            )));
        }
        if blocks.open.is_some() && kind != CONTINUATION {
            return Err(bad("a frame other than CONTINUATION inside a header block"));
        }
        if kind == HEADERS || kind == CONTINUATION {
            let mut payload = vec![0u8; len];
            from.read_exact(&mut payload).await?;
            if let Some(frames) = blocks.frame(kind, flags, stream, payload)? {
                to.write_all(&frames).await?;
            }
        } else {
            to.write_all(&head).await?;
            let copied = tokio::io::copy(&mut (&mut from).take(len as u64), &mut to).await?;
            if copied < len as u64 {
                return Ok(());
            }
        }
    }
}

/// Gathers one header block (HEADERS + CONTINUATION frames) at a time and
/// re-emits it with a valid `:authority`.
struct BlockRewriter {
    decoder: loona_hpack::Decoder<'static>,
    /// The block being gathered: stream id, HEADERS flags, priority fields.
    open: Option<(u32, u8, Option<[u8; 5]>)>,
    block: Vec<u8>,
}

impl BlockRewriter {
    fn new() -> BlockRewriter {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        BlockRewriter {
            decoder,
            open: None,
            block: Vec::new(),
        }
    }

    /// Takes one HEADERS or CONTINUATION frame; returns the rewritten frames
    /// once the block is complete.
    fn frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        mut payload: Vec<u8>,
    ) -> io::Result<Option<Vec<u8>>> {
        if kind == HEADERS {
            if self.open.is_some() {
                return Err(bad("HEADERS frame inside an unfinished header block"));
            }
            if flags & PADDED != 0 {
                let pad = *payload.first().ok_or_else(|| bad("empty padded HEADERS"))? as usize;
                if pad + 1 > payload.len() {
                    return Err(bad("HEADERS padding longer than the frame"));
                }
                payload.truncate(payload.len() - pad);
                payload.remove(0);
            }
            let priority = if flags & PRIORITY != 0 {
                if payload.len() < 5 {
                    return Err(bad("HEADERS priority fields cut short"));
                }
                let mut p = [0u8; 5];
                p.copy_from_slice(&payload[..5]);
                payload.drain(..5);
                Some(p)
            } else {
                None
            };
            self.open = Some((stream, flags, priority));
            self.block = payload;
        } else {
            match self.open {
                Some((s, _, _)) if s == stream => self.block.extend_from_slice(&payload),
                _ => return Err(bad("CONTINUATION frame without its HEADERS")),
            }
        }
        if self.block.len() > MAX_BLOCK {
            return Err(bad("header block too large"));
        }
        if flags & END_HEADERS == 0 {
            return Ok(None);
        }
        let Some((stream, first_flags, priority)) = self.open.take() else {
            return Ok(None);
        };
        let block = std::mem::take(&mut self.block);
        let mut encoded = Vec::with_capacity(block.len() + 16);
        let mut listed = 0usize;
        self.decoder
            .decode_with_cb(&block, |name, value| {
                listed += name.len() + value.len() + 32;
                if listed > MAX_BLOCK {
                    return;
                }
                let value: &[u8] = if name.as_ref() == b":authority"
                    && hyper::http::uri::Authority::try_from(value.as_ref()).is_err()
                {
                    b"localhost"
                } else {
                    &value
                };
                literal(&mut encoded, &name, value);
            })
            .map_err(|e| bad(format!("header block: {e:?}")))?;
        if listed > MAX_BLOCK {
            return Err(bad(format!(
                "a header list of {listed} bytes, larger than {MAX_BLOCK}"
            )));
        }
        Ok(Some(frames(
            stream,
            first_flags & END_STREAM,
            priority,
            &encoded,
        )))
    }
}

/// Appends a "literal header field without indexing, new name" (RFC 7541
/// §6.2.2), strings without Huffman coding: the server's table never changes.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    for s in [name, value] {
        // Writing into a Vec cannot fail.
        let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// A header block as a HEADERS frame and as many CONTINUATION frames as it
/// needs, END_HEADERS on the last.
fn frames(stream: u32, end_stream: u8, priority: Option<[u8; 5]>, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + 32);
    let prio_len = priority.map_or(0, |_| 5);
    let first_len = block.len().min(MAX_FRAME - prio_len);
    let (first, mut rest) = block.split_at(first_len);
    let mut flags = end_stream | if priority.is_some() { PRIORITY } else { 0 };
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    head(&mut out, prio_len + first.len(), HEADERS, flags, stream);
    if let Some(p) = priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        head(&mut out, chunk.len(), CONTINUATION, flags, stream);
        out.extend_from_slice(chunk);
    }
    out
}

fn head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
            let stream = u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap());
            out.push((
                bytes[at + 3],
                bytes[at + 4],
                stream,
                bytes[at + 9..at + 9 + len].to_vec(),
            ));
            at += 9 + len;
        }
        out
    }

    fn client_block(headers: &[(&[u8], &[u8])]) -> Vec<u8> {
        // As a client encodes them: with its own dynamic table and Huffman.
        loona_hpack::Encoder::new().encode(headers.iter().copied())
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/inference.GRPCInferenceService/ServerLive"),
            (b":authority", b"%2Ftmp%2Ftern%2Fgrpc.sock"),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
        ];
        let block = client_block(&headers);
        let mut r = BlockRewriter::new();
        let out = r
            .frame(HEADERS, END_HEADERS | END_STREAM, 1, block)
            .unwrap()
            .unwrap();
        let frames = decode_frames(&out);
        assert_eq!(frames.len(), 1);
        let (kind, flags, stream, payload) = &frames[0];
        assert_eq!(
            (*kind, *flags, *stream),
            (HEADERS, END_HEADERS | END_STREAM, 1)
        );
        let got = loona_hpack::Decoder::new().decode(payload).unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| {
                let v: &[u8] = if *n == b":authority" { b"localhost" } else { v };
                (n.to_vec(), v.to_vec())
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn valid_authorities_continuations_padding_and_priority() {
        let big = vec![b'x'; 40_000];
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":authority", b"localhost:8001"),
            (b"x-big", &big),
        ];
        let block = client_block(&headers);
        // A padded HEADERS frame with priority, then two CONTINUATIONs.
        let (a, rest) = block.split_at(100);
        let (b, c) = rest.split_at(rest.len() / 2);
        let mut first = vec![3u8];
        first.extend_from_slice(&[0, 0, 0, 0, 16]);
        first.extend_from_slice(a);
        first.extend_from_slice(&[0, 0, 0]);
        let mut r = BlockRewriter::new();
        assert!(r
            .frame(HEADERS, PADDED | PRIORITY, 3, first)
            .unwrap()
            .is_none());
        assert!(r.frame(CONTINUATION, 0, 3, b.to_vec()).unwrap().is_none());
        let out = r
            .frame(CONTINUATION, END_HEADERS, 3, c.to_vec())
            .unwrap()
            .unwrap();
        let frames = decode_frames(&out);
        assert!(frames.len() >= 3, "cut at 16 KiB");
        assert!(frames.iter().all(|f| f.3.len() <= MAX_FRAME));
        assert_eq!(frames[0].0, HEADERS);
        assert_eq!(frames[0].1, PRIORITY);
        assert_eq!(&frames[0].3[..5], &[0, 0, 0, 0, 16]);
        assert_eq!(frames.last().unwrap().1, END_HEADERS);
        let mut joined = frames[0].3[5..].to_vec();
        for f in &frames[1..] {
            assert_eq!((f.0, f.2), (CONTINUATION, 3));
            joined.extend_from_slice(&f.3);
        }
        let got = loona_hpack::Decoder::new().decode(&joined).unwrap();
        assert_eq!(got[1], (b":authority".to_vec(), b"localhost:8001".to_vec()));
        assert_eq!(got[2].1.len(), 40_000);
    }

    #[test]
    fn oversized_lists_and_tables_end_the_connection() {
        // 40 KiB of one header, referenced again and again by index: the
        // decoded list grows far past the block's size, and is refused.
        let mut block = client_block(&[(b"x-a", &[b'a'; 3000][..])]);
        block.extend(std::iter::repeat_n(0xbe, 100)); // index 62: that entry
        let mut r = BlockRewriter::new();
        let e = r.frame(HEADERS, END_HEADERS, 1, block).unwrap_err();
        assert!(e.to_string().contains("header list"), "{e}");
        // A dynamic table size update above the server's 4 KiB.
        let mut update = Vec::new();
        let _ = loona_hpack::encoder::encode_integer_into(1 << 20, 5, 0x20, &mut update);
        let mut r = BlockRewriter::new();
        assert!(r.frame(HEADERS, END_HEADERS, 1, update).is_err());
        // A compressed block over the limit, gathered from CONTINUATIONs.
        let mut r = BlockRewriter::new();
        assert!(r
            .frame(HEADERS, 0, 1, vec![0x82; 16_000])
            .unwrap()
            .is_none());
        let mut refused = false;
        for _ in 0..5 {
            match r.frame(CONTINUATION, 0, 1, vec![0x82; 16_000]) {
                Ok(_) => {}
                Err(_) => {
                    refused = true;
                    break;
                }
            }
        }
        assert!(refused);
    }

    #[tokio::test]
    async fn oversized_and_interleaved_frames_end_the_pump() {
        for frames in [
            // A 1 MiB frame: refused from its header, nothing allocated.
            {
                let mut f = Vec::new();
                head(&mut f, 1 << 20, 0x0, 0, 1);
                f
            },
            // A PING between a HEADERS and its CONTINUATION.
            {
                let mut f = Vec::new();
                head(&mut f, 1, HEADERS, 0, 1);
                f.push(0x82);
                head(&mut f, 8, 0x6, 0, 0);
                f.extend_from_slice(&[0; 8]);
                f
            },
        ] {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let (to_server, _server_reads) = tokio::io::duplex(1 << 20);
            let task = tokio::spawn(pump(server, to_server));
            client
                .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await
                .unwrap();
            client.write_all(&frames).await.unwrap();
            let e = task.await.unwrap().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        }
    }

    #[tokio::test]
    async fn the_pump_stops_when_the_server_drops_the_connection() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let conn = fix_authority(server);
        let pump = conn.pump.clone();
        assert!(!pump.is_finished());
        drop(conn);
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while !pump.is_finished() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the pump ends with the connection");
        drop(client);
    }

    #[test]
    fn broken_blocks_end_the_connection() {
        let mut r = BlockRewriter::new();
        assert!(r.frame(CONTINUATION, END_HEADERS, 1, vec![0]).is_err());
        let mut r = BlockRewriter::new();
        assert!(r
            .frame(HEADERS, PADDED | END_HEADERS, 1, vec![9, 1])
            .is_err());
        let mut r = BlockRewriter::new();
        assert!(r
            .frame(HEADERS, END_HEADERS, 1, vec![0xff, 0xff, 0xff])
            .is_err());
    }

    #[tokio::test]
    async fn the_pump_passes_other_frames_through() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (to_server, mut server_reads) = tokio::io::duplex(1 << 20);
        let task = tokio::spawn(pump(server, to_server));
        let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS (empty) and a DATA frame of 5 bytes on stream 1.
        head(&mut sent, 0, 0x4, 0, 0);
        head(&mut sent, 5, 0x0, END_STREAM, 1);
        sent.extend_from_slice(b"hello");
        client.write_all(&sent).await.unwrap();
        drop(client);
        task.await.unwrap().unwrap();
        let mut got = Vec::new();
        server_reads.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, sent);
    }
}
