//! Plugins' stdout and stderr (Python's `print`, `println!`, `console.log`,
//! `printf`): written to the server's log a line at a time, tagged with the
//! plugin's model name, cut at [`MAX_LOG_LINE`] bytes and within a
//! per-instance rate limit. Writes never fail: what the limit drops is
//! counted in `tern_plugin_log_lines_dropped_total`.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use crate::host::{cut_line, LogLimit, MAX_LOG_LINE};
use crate::PluginCounters;

/// One of a plugin instance's output streams.
#[derive(Clone)]
pub struct LogStream {
    model: Arc<str>,
    name: &'static str,
    limit: Arc<Mutex<LogLimit>>,
    counters: Arc<PluginCounters>,
}

impl LogStream {
    /// The stream `name` ("stdout", "stderr") of an instance of `model`;
    /// both streams of an instance share `limit`.
    pub fn new(
        model: &str,
        name: &'static str,
        limit: Arc<Mutex<LogLimit>>,
        counters: Arc<PluginCounters>,
    ) -> LogStream {
        LogStream {
            model: model.into(),
            name,
            limit,
            counters,
        }
    }

    fn emit(&self, line: &[u8]) {
        let allowed = self.limit.lock().map(|mut l| l.take()).unwrap_or(false);
        if !allowed {
            self.counters
                .log_lines_dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let text = cut_line(String::from_utf8_lossy(line).into_owned());
        tracing::info!(plugin = %self.model, "{}: {}", self.name, text.trim_end_matches('\r'));
    }
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(Lines {
            stream: self.clone(),
            partial: Vec::new(),
        })
    }
}

/// Splits what a plugin writes into lines.
struct Lines {
    stream: LogStream,
    partial: Vec<u8>,
}

impl tokio::io::AsyncWrite for Lines {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        for chunk in data.split_inclusive(|&b| b == b'\n') {
            if let Some(line) = chunk.strip_suffix(b"\n") {
                this.partial.extend_from_slice(line);
                this.stream.emit(&this.partial);
                this.partial.clear();
            } else {
                this.partial.extend_from_slice(chunk);
                // A line that never ends is written (cut) once it is long.
                if this.partial.len() > MAX_LOG_LINE {
                    this.stream.emit(&this.partial);
                    this.partial.clear();
                }
            }
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.partial.is_empty() {
            this.stream.emit(&this.partial);
            this.partial.clear();
        }
        Poll::Ready(Ok(()))
    }
}
