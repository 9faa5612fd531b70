//! The clocks a trace's instants are written in: Triton's trace files use
//! the monotonic clock's nanoseconds (`std::chrono::steady_clock`),
//! OpenTelemetry wall-clock time since the Unix epoch.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One instant read on every clock, to convert [`Instant`]s from.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    at: Instant,
    monotonic_ns: u64,
    unix: SystemTime,
}

impl Clock {
    /// The clocks now.
    pub fn new() -> Clock {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        Clock {
            at: Instant::now(),
            monotonic_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            unix: SystemTime::now(),
        }
    }

    fn offset(&self, t: Instant) -> (bool, Duration) {
        match t.checked_duration_since(self.at) {
            Some(d) => (true, d),
            None => (false, self.at - t),
        }
    }

    /// `t` in monotonic-clock nanoseconds.
    pub fn monotonic_ns(&self, t: Instant) -> u64 {
        match self.offset(t) {
            (true, d) => self.monotonic_ns + d.as_nanos() as u64,
            (false, d) => self.monotonic_ns.saturating_sub(d.as_nanos() as u64),
        }
    }

    /// `t` as wall-clock time.
    pub fn system_time(&self, t: Instant) -> SystemTime {
        match self.offset(t) {
            (true, d) => self.unix + d,
            (false, d) => self.unix.checked_sub(d).unwrap_or(UNIX_EPOCH),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_convert_on_both_sides_of_the_reading() {
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let c = Clock::new();
        let later = c.at + Duration::from_millis(5);
        assert_eq!(c.monotonic_ns(later) - c.monotonic_ns(c.at), 5_000_000);
        assert!(c.monotonic_ns(before) < c.monotonic_ns(c.at));
        assert_eq!(
            c.system_time(later)
                .duration_since(c.system_time(c.at))
                .unwrap(),
            Duration::from_millis(5)
        );
    }
}
