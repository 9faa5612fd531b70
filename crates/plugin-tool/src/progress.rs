//! Progress of a long build step (a toolchain run, a precompile) on stderr:
//! on a terminal, one status line rewritten in place with a spinner, the
//! elapsed time and the tool's latest output line; otherwise the tool's
//! lines as they come, and a "still running" line after every 10 s without
//! output, so a log shows the build is alive.

use std::io::Write;
use std::time::{Duration, Instant};

const SPINNER: &[char] = &['|', '/', '-', '\\'];
/// How long a plain log may go without a line from a running step.
const QUIET: Duration = Duration::from_secs(10);

/// The progress display of one step.
pub struct Status<W: Write> {
    what: String,
    out: W,
    /// Rewrite one line in place (a terminal of this many columns).
    columns: Option<usize>,
    latest: String,
    frame: usize,
    last_print: Instant,
}

impl Status<std::io::Stderr> {
    /// A status on stderr, in place when stderr is a terminal.
    pub fn stderr(what: &str) -> Self {
        use std::io::IsTerminal;
        let columns = std::io::stderr().is_terminal().then(|| {
            terminal_size::terminal_size_of(std::io::stderr()).map_or(80, |(w, _)| usize::from(w.0))
        });
        Status::new(what, std::io::stderr(), columns)
    }
}

impl<W: Write> Status<W> {
    /// A status writing to `out`; `columns` = a terminal that wide.
    pub fn new(what: &str, out: W, columns: Option<usize>) -> Self {
        let mut s = Status {
            what: what.to_string(),
            out,
            columns,
            latest: String::new(),
            frame: 0,
            last_print: Instant::now(),
        };
        if s.columns.is_none() {
            s.print(&format!("{what}: started"));
        }
        s
    }

    /// A line of the tool's output.
    pub fn line(&mut self, line: &str, elapsed: Duration) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        match self.columns {
            Some(_) => {
                self.latest = line.to_string();
                self.draw(elapsed);
            }
            None => self.print(&format!("{}: {line}", self.what)),
        }
    }

    /// Time passes without output.
    pub fn tick(&mut self, elapsed: Duration) {
        match self.columns {
            Some(_) => self.draw(elapsed),
            None if self.last_print.elapsed() >= QUIET => {
                self.print(&format!(
                    "{}: still running ({} s)",
                    self.what,
                    elapsed.as_secs()
                ));
            }
            None => {}
        }
    }

    /// The step ended; clears the status line and says how long it took.
    pub fn finish(&mut self, elapsed: Duration, ok: bool) {
        if self.columns.is_some() {
            let _ = write!(self.out, "\r\x1b[2K");
        }
        let how = if ok { "finished" } else { "failed" };
        self.print(&format!(
            "{}: {how} in {:.1} s",
            self.what,
            elapsed.as_secs_f64()
        ));
    }

    fn draw(&mut self, elapsed: Duration) {
        let Some(columns) = self.columns else { return };
        self.frame = (self.frame + 1) % SPINNER.len();
        let text = format!(
            "{} [{:>3} s] {}: {}",
            SPINNER[self.frame],
            elapsed.as_secs(),
            self.what,
            self.latest
        );
        let shown: String = text.chars().take(columns.saturating_sub(1)).collect();
        let _ = write!(self.out, "\r\x1b[2K{shown}");
        let _ = self.out.flush();
    }

    fn print(&mut self, line: &str) {
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
        self.last_print = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_gets_every_line_and_the_outcome() {
        let mut buf = Vec::new();
        let mut s = Status::new("cargo build", &mut buf, None);
        s.line("   Compiling add_sub v0.1.0", Duration::from_secs(1));
        s.line("", Duration::from_secs(1));
        s.tick(Duration::from_secs(2));
        s.finish(Duration::from_millis(2500), true);
        let text = String::from_utf8(buf).unwrap();
        assert_eq!(
            text,
            "cargo build: started\ncargo build: Compiling add_sub v0.1.0\ncargo build: finished in 2.5 s\n"
        );
    }

    #[test]
    fn a_terminal_gets_one_line_rewritten_in_place() {
        let mut buf = Vec::new();
        let mut s = Status::new("componentize-py", &mut buf, Some(30));
        s.line(
            "Collecting modules and a very long line",
            Duration::from_secs(12),
        );
        s.finish(Duration::from_secs(13), false);
        let text = String::from_utf8(buf).unwrap();
        let drawn = text.split("\r\x1b[2K").nth(1).unwrap();
        assert!(
            drawn.starts_with("/ [ 12 s] componentize-py: Co"),
            "{drawn:?}"
        );
        assert_eq!(drawn.chars().count(), 29);
        assert!(
            text.ends_with("\r\x1b[2Kcomponentize-py: failed in 13.0 s\n"),
            "{text:?}"
        );
    }
}
