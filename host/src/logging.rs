//! Logging: tritonserver's flags (`--log-verbose`, `--log-info`,
//! `--log-warning`, `--log-error`, `--log-format`, `--log-file`), Triton's
//! line formats, and the logging extension's run-time changes
//! (`GET/POST /v2/logging`).
//!
//! Line formats, tritonserver's (stable; users and Triton's log parsers grep them):
//! * `default`: `I1122 04:50:06.896056 4242 server.rs:71] "message key=value"`
//! * `ISO8601`: `2026-11-22T04:50:06Z I 4242 server.rs:71] "message key=value"`
//!
//! The first letter is the level: `E`rror, `W`arning, `I`nfo (verbose lines
//! are `I` too, as Triton's); then the process id and the source file and
//! line. The message is a JSON string, as Triton writes it since 2.47: text a
//! client sent (a model name, a request id) cannot forge a log line with a
//! newline or a quote. `TRITON_SERVER_ESCAPE_LOG_MESSAGES=0` (Triton's
//! variable) writes messages as they are.
//! The enabled levels are a threshold: the least severe enabled level and
//! everything more severe. Verbose output is Tern's own (dependencies stay at
//! info) so `--log-verbose=1` shows e.g. the `executing model=...` lines.
//!
//! Lines are written by a thread of their own through a bounded queue of
//! [`QUEUE_LINES`]: a slow reader of the log (a full pipe, a slow disk)
//! never stalls the thread that logs (an instance running a plugin that
//! prints); when the queue is full, lines are dropped and counted
//! ([`dropped_lines`], `tern_log_lines_dropped_total`).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

use tern_core::error::{Error, Result};
use tern_core::request::ControlValue;

/// The logging settings that can be read and changed at run time.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `--log-file` (read-only at run time; empty = stderr).
    pub log_file: String,
    /// Info messages on.
    pub log_info: bool,
    /// Warnings on.
    pub log_warning: bool,
    /// Errors on.
    pub log_error: bool,
    /// Verbose level (0 = off).
    pub log_verbose_level: u32,
    /// `default` or `ISO8601`.
    pub log_format: String,
}

impl Settings {
    /// The filter directive for these settings.
    pub fn directive(&self) -> String {
        let base = if self.log_info {
            "info"
        } else if self.log_warning {
            "warn"
        } else if self.log_error {
            "error"
        } else {
            "off"
        };
        match self.log_verbose_level {
            0 => base.to_string(),
            1 => format!("{base},tern=debug"),
            _ => format!("{base},tern=trace"),
        }
    }
}

/// Checks a `--log-format` value.
pub fn check_format(format: &str) -> Result<()> {
    match format {
        "default" | "ISO8601" => Ok(()),
        other => Err(Error::invalid_arg(format!(
            "invalid argument for --log-format: '{other}' (options are \"default\" and \"ISO8601\")"
        ))),
    }
}

static ISO: AtomicBool = AtomicBool::new(false);

/// Applies a new filter directive to the installed subscriber.
type Reloader = Box<dyn Fn(&str) -> Result<()> + Send + Sync>;

struct State {
    settings: Settings,
    reload: Option<Reloader>,
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| {
        Mutex::new(State {
            settings: Settings {
                log_file: String::new(),
                log_info: true,
                log_warning: true,
                log_error: true,
                log_verbose_level: 0,
                log_format: "default".into(),
            },
            reload: None,
        })
    })
}

/// The current settings.
pub fn settings() -> Settings {
    state()
        .lock()
        .expect("logging lock poisoned: nothing panics while holding it")
        .settings
        .clone()
}

/// Applies changes to the run-time settings (the logging extension); unknown
/// names and wrong types are errors and change nothing. A `log_file` entry,
/// whatever its value (even the current one), is refused first, as Triton
/// does: UNSUPPORTED `log file location can not be updated through network
/// protocol` (over gRPC, the key's presence is what Triton refuses; over
/// HTTP, any value but JSON `null`, which Triton skips for every setting: a
/// frontend that can tell a `null` leaves it out of `changes`).
pub fn update(changes: &[(String, ControlValue)]) -> Result<Settings> {
    if changes.iter().any(|(key, _)| key == "log_file") {
        return Err(tern_core::messages::log_file_unsupported());
    }
    let mut st = state()
        .lock()
        .expect("logging lock poisoned: nothing panics while holding it");
    let mut new = st.settings.clone();
    for (key, value) in changes {
        let bool_value = || match value {
            ControlValue::Bool(b) => Ok(*b),
            _ => Err(Error::invalid_arg(format!(
                "logging setting '{key}' must be a bool"
            ))),
        };
        match key.as_str() {
            "log_info" => new.log_info = bool_value()?,
            "log_warning" => new.log_warning = bool_value()?,
            "log_error" => new.log_error = bool_value()?,
            "log_verbose_level" => {
                new.log_verbose_level = match value {
                    ControlValue::Uint(v) => u32::try_from(*v).ok(),
                    _ => None,
                }
                .ok_or_else(|| {
                    Error::invalid_arg(
                        "logging setting 'log_verbose_level' must be a non-negative integer",
                    )
                })?
            }
            "log_format" => {
                let ControlValue::String(f) = value else {
                    return Err(Error::invalid_arg(
                        "logging setting 'log_format' must be a string",
                    ));
                };
                check_format(f)?;
                new.log_format = f.clone();
            }
            other => {
                return Err(Error::invalid_arg(format!(
                    "unknown logging setting '{other}'"
                )))
            }
        }
    }
    if let Some(reload) = &st.reload {
        reload(&new.directive())?;
    }
    ISO.store(new.log_format == "ISO8601", Ordering::Relaxed);
    st.settings = new.clone();
    Ok(new)
}

/// Triton-style line format.
struct TritonFormat;

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

impl<S, N> FormatEvent<S, N> for TritonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let secs = now.as_secs() as i64;
        let (y, mo, d) = civil(secs.div_euclid(86_400));
        let sod = secs.rem_euclid(86_400);
        let (h, mi, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
        let meta = event.metadata();
        let letter = match *meta.level() {
            Level::ERROR => 'E',
            Level::WARN => 'W',
            _ => 'I',
        };
        let pid = std::process::id();
        let file = meta
            .file()
            .map(|f| f.rsplit('/').next().unwrap_or(f))
            .unwrap_or("tern");
        let line = meta.line().unwrap_or(0);
        if ISO.load(Ordering::Relaxed) {
            write!(
                writer,
                "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z {letter} {pid} {file}:{line}] "
            )?;
        } else {
            write!(
                writer,
                "{letter}{mo:02}{d:02} {h:02}:{mi:02}:{s:02}.{:06} {pid} {file}:{line}] ",
                now.subsec_micros()
            )?;
        }
        // The message is escaped by the log thread (`Escaping`), not here: this runs on the
        // thread that logs, which may be a plugin's instance thread within its deadline.
        if escape_messages() {
            writer.write_char(MESSAGE_START)?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Marks where a formatted line's message starts, for [`Escaping`].
const MESSAGE_START: char = '\u{1e}';

/// The log thread's writer: writes each line (one `write` per event, as the
/// queue hands them over) with its message, from [`MESSAGE_START`] to the
/// end of the line, as a JSON string.
struct Escaping<W>(W);

impl<W: std::io::Write> std::io::Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(at) = buf.iter().position(|&b| b == MESSAGE_START as u8) else {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        };
        let message = &buf[at + 1..];
        let message = message.strip_suffix(b"\n").unwrap_or(message);
        let mut line = String::with_capacity(buf.len() + 16);
        line.push_str(&String::from_utf8_lossy(&buf[..at]));
        // Writing into a String cannot fail.
        let _ = write_json_string(&mut line, &String::from_utf8_lossy(message));
        line.push('\n');
        self.0.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Whether messages are written as JSON strings (Triton's default; its
/// `TRITON_SERVER_ESCAPE_LOG_MESSAGES=0` turns it off).
fn escape_messages() -> bool {
    static ESCAPE: OnceLock<bool> = OnceLock::new();
    *ESCAPE.get_or_init(|| {
        std::env::var("TRITON_SERVER_ESCAPE_LOG_MESSAGES").map_or(true, |v| v != "0")
    })
}

/// Writes `s` as a JSON string as Triton writes log messages (rapidjson):
/// quotes, backslashes and control characters escaped (`\u00XX` upper
/// case), everything else, UTF-8 included, as it is; unescaped runs are
/// written whole.
fn write_json_string(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    out.write_char('"')?;
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            b if b < 0x20 => "",
            _ => continue,
        };
        out.write_str(&s[start..i])?;
        if escaped.is_empty() {
            write!(out, "\\u{b:04X}")?;
        } else {
            out.write_str(escaped)?;
        }
        start = i + 1;
    }
    out.write_str(&s[start..])?;
    out.write_char('"')
}

/// [`write_json_string`] into a new string.
#[cfg(test)]
fn json_string(s: &str) -> String {
    let mut out = String::new();
    write_json_string(&mut out, s).expect("writing to a String");
    out
}

/// Lines the log queue holds before it drops new ones.
pub const QUEUE_LINES: usize = 16_384;

static DROPPED: OnceLock<tracing_appender::non_blocking::ErrorCounter> = OnceLock::new();

/// Log lines dropped because the queue to the log writer was full.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// Keeps the log writer thread running; dropping it writes out what is
/// queued. Hold it until the process ends.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(#[allow(dead_code)] tracing_appender::non_blocking::WorkerGuard);

fn queued(
    target: impl std::io::Write + Send + 'static,
) -> (tracing_appender::non_blocking::NonBlocking, LogGuard) {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(QUEUE_LINES)
        .lossy(true)
        .thread_name("tern-log")
        .finish(Escaping(target));
    let _ = DROPPED.set(writer.error_counter());
    (writer, LogGuard(guard))
}

/// Installs the global subscriber: stderr, or `file` (`--log-file`).
pub fn init(settings: Settings, file: Option<&std::path::Path>) -> Result<LogGuard> {
    check_format(&settings.log_format)?;
    let filter = EnvFilter::try_new(settings.directive())
        .map_err(|e| Error::internal(format!("log filter: {e}")))?;
    let (filter, handle) = reload::Layer::<EnvFilter, Registry>::new(filter);
    let layer = tracing_subscriber::fmt::layer().event_format(TritonFormat);
    let guard = match file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    Error::invalid_arg(format!("cannot open --log-file '{}': {e}", path.display()))
                })?;
            let (writer, guard) = queued(file);
            tracing_subscriber::registry()
                .with(filter)
                .with(layer.with_ansi(false).with_writer(writer))
                .init();
            guard
        }
        None => {
            let (writer, guard) = queued(std::io::stderr());
            tracing_subscriber::registry()
                .with(filter)
                .with(
                    layer
                        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                        .with_writer(writer),
                )
                .init();
            guard
        }
    };
    ISO.store(settings.log_format == "ISO8601", Ordering::Relaxed);
    let mut st = state()
        .lock()
        .expect("logging lock poisoned: nothing panics while holding it");
    st.settings = settings;
    st.reload = Some(Box::new(move |directive: &str| {
        let f = EnvFilter::try_new(directive)
            .map_err(|e| Error::internal(format!("log filter: {e}")))?;
        handle
            .reload(f)
            .map_err(|e| Error::internal(format!("cannot change log levels: {e}")))
    }));
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_thread_escapes_each_lines_message() {
        let mut out = Escaping(Vec::new());
        std::io::Write::write_all(&mut out, "I1 2 a.rs:1] \u{1e}one\ttwo \"q\"\n".as_bytes())
            .unwrap();
        std::io::Write::write_all(&mut out, b"raw line\n").unwrap();
        assert_eq!(
            String::from_utf8(out.0).unwrap(),
            "I1 2 a.rs:1] \"one\\ttwo \\\"q\\\"\"\nraw line\n"
        );
    }

    #[test]
    fn messages_are_json_strings_as_tritons() {
        assert_eq!(json_string("plain"), r#""plain""#);
        assert_eq!(
            json_string("line1\nline2 \"quoted\" tab\there \u{1} ctl é \\ /"),
            r#""line1\nline2 \"quoted\" tab\there \u0001 ctl é \\ /""#
        );
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(20_414), (2025, 11, 22));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }

    #[test]
    fn directives_and_updates() {
        let mut s = settings();
        s.log_verbose_level = 1;
        assert_eq!(s.directive(), "info,tern=debug");
        s.log_info = false;
        s.log_verbose_level = 0;
        assert_eq!(s.directive(), "warn");
        let set = |k: &str, v: ControlValue| vec![(k.to_string(), v)];
        let text = |v: &str| ControlValue::String(v.into());
        assert!(update(&set("log_format", text("XML"))).is_err());
        // Any log_file is refused, the current value ("") too, and before
        // the other settings (which stay as they were).
        for value in [text("/x"), text(""), ControlValue::Uint(1)] {
            let mut changes = set("log_error", ControlValue::Uint(5));
            changes.extend(set("log_file", value));
            let e = update(&changes).unwrap_err();
            assert_eq!(
                (e.code, e.message.as_str()),
                (
                    tern_core::error::Code::Unsupported,
                    "log file location can not be updated through network protocol"
                )
            );
        }
        assert!(update(&set("bogus", ControlValue::Uint(1))).is_err());
        assert!(update(&set("log_info", ControlValue::Uint(1))).is_err());
        assert!(update(&set("log_verbose_level", ControlValue::Other)).is_err());
        let mut both = set("log_verbose_level", ControlValue::Uint(2));
        both.extend(set("log_format", text("ISO8601")));
        let s = update(&both).unwrap();
        assert_eq!(s.log_verbose_level, 2);
        assert_eq!(settings().log_format, "ISO8601");
        let mut back = set("log_verbose_level", ControlValue::Uint(0));
        back.extend(set("log_format", text("default")));
        update(&back).unwrap();
    }
}
