//! WASI's blocking calls, bounded by the plugin's execution deadline.
//!
//! The epoch deadline stops a plugin only while it runs WebAssembly: a plugin
//! blocked in a host call (a sleep is `wasi:io/poll`'s `block`; a stream's
//! `blocking-*` methods wait the same way) would otherwise hold its instance
//! for as long as it asks. This module shadows those functions in the linker
//! with versions that give up at [`HostState::deadline`] and trap with
//! [`DeadlineExceeded`], which fails the batch with the deadline error and
//! restarts the instance, as a deadline hit in WebAssembly does.
//!
//! The other host imports do not block: BLS calls wait until the deadline at
//! most (`host.rs`); an `ops` kernel's work is bounded by the memory cap, and
//! when it returns, WebAssembly traps at the passed epoch deadline; files are
//! read only from the model folder, which is checked at load to hold regular
//! files and folders only (a named pipe there would block a read forever).

use std::future::Future;
use std::time::Instant;

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, DynPollable, StreamResult};
use wasmtime_wasi::runtime::in_tokio;
use wasmtime_wasi::WasiView;
use wasmtime_wasi_io::bindings::wasi::io::poll::{Host as _, HostPollable as _};
use wasmtime_wasi_io::bindings::wasi::io::streams::{
    Host as _, HostInputStream as _, HostOutputStream as _, StreamError,
};

use crate::host::HostState;

/// The WASI interfaces whose blocking functions are replaced; the versions
/// are the ones `wasmtime_wasi::p2::add_to_linker_sync` defines.
const POLL: &str = "wasi:io/poll@0.2.12";
const STREAMS: &str = "wasi:io/streams@0.2.12";

/// The trap raised when a blocking host call reaches the plugin's deadline.
#[derive(Debug, thiserror::Error)]
#[error("a blocking WASI call reached the plugin's execution deadline")]
pub struct DeadlineExceeded;

/// Replaces WASI's blocking functions (added by `add_to_linker_sync` before
/// this is called) with versions bounded by the plugin's deadline.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut poll = linker.instance(POLL)?;
    poll.func_wrap(
        "poll",
        |mut s: Ctx<'_>, (list,): (Vec<Resource<DynPollable>>,)| {
            let (deadline, table) = parts(&mut s);
            Ok((bounded(deadline, table.poll(list))??,))
        },
    )?;
    poll.func_wrap(
        "[method]pollable.block",
        |mut s: Ctx<'_>, (p,): (Resource<DynPollable>,)| {
            let (deadline, table) = parts(&mut s);
            bounded(deadline, table.block(p))?
        },
    )?;
    let mut streams = linker.instance(STREAMS)?;
    streams.func_wrap(
        "[method]input-stream.blocking-read",
        |mut s: Ctx<'_>, (stream, len): (Resource<DynInputStream>, u64)| {
            let (deadline, table) = parts(&mut s);
            let r = bounded(deadline, table.blocking_read(stream, len))?;
            Ok((wit_result(table, r)?,))
        },
    )?;
    streams.func_wrap(
        "[method]input-stream.blocking-skip",
        |mut s: Ctx<'_>, (stream, len): (Resource<DynInputStream>, u64)| {
            let (deadline, table) = parts(&mut s);
            let r = bounded(deadline, table.blocking_skip(stream, len))?;
            Ok((wit_result(table, r)?,))
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-write-and-flush",
        |mut s: Ctx<'_>, (stream, bytes): (Resource<DynOutputStream>, Vec<u8>)| {
            let (deadline, table) = parts(&mut s);
            let r = bounded(deadline, table.blocking_write_and_flush(stream, bytes))?;
            Ok((wit_result(table, r)?,))
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-write-zeroes-and-flush",
        |mut s: Ctx<'_>, (stream, len): (Resource<DynOutputStream>, u64)| {
            let (deadline, table) = parts(&mut s);
            let r = bounded(deadline, table.blocking_write_zeroes_and_flush(stream, len))?;
            Ok((wit_result(table, r)?,))
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-flush",
        |mut s: Ctx<'_>, (stream,): (Resource<DynOutputStream>,)| {
            let (deadline, table) = parts(&mut s);
            let r = bounded(deadline, table.blocking_flush(stream))?;
            Ok((wit_result(table, r)?,))
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-splice",
        |mut s: Ctx<'_>,
         (dst, src, len): (Resource<DynOutputStream>, Resource<DynInputStream>, u64)| {
            let (deadline, table) = parts(&mut s);
            let r = bounded(deadline, table.blocking_splice(dst, src, len))?;
            Ok((wit_result(table, r)?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

type Ctx<'a> = StoreContextMut<'a, HostState>;

/// The plugin's deadline and the WASI resource table.
fn parts<'a>(s: &'a mut Ctx<'_>) -> (Option<Instant>, &'a mut ResourceTable) {
    let state = s.data_mut();
    let deadline = state.deadline;
    (deadline, state.ctx().table)
}

/// Runs a WASI host future to completion on this thread, as the synchronous
/// bindings do, but gives up with [`DeadlineExceeded`] at `deadline`.
fn bounded<T>(deadline: Option<Instant>, fut: impl Future<Output = T>) -> wasmtime::Result<T> {
    let Some(deadline) = deadline else {
        return Ok(in_tokio(fut));
    };
    in_tokio(async { tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), fut).await })
        .map_err(|_| DeadlineExceeded.into())
}

/// A stream operation's result as WIT's `result<T, stream-error>`.
fn wit_result<T>(
    table: &mut ResourceTable,
    r: StreamResult<T>,
) -> wasmtime::Result<Result<T, StreamError>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(e) => Ok(Err(table.convert_stream_error(e)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bounded_gives_up_at_the_deadline() {
        let t0 = Instant::now();
        let r = bounded(Some(t0 + Duration::from_millis(50)), async {
            tokio::time::sleep(Duration::from_secs(20)).await
        });
        assert!(r.unwrap_err().is::<DeadlineExceeded>());
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(bounded(None, async { 7 }).unwrap(), 7);
        let past = Some(Instant::now() - Duration::from_millis(1));
        assert!(bounded(past, std::future::pending::<()>()).is_err());
    }
}
