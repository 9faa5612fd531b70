//! Trace settings as Triton spells them: the values (`level`, `rate`,
//! `count`, `log_frequency`, `file`), a model's overrides of the global
//! ones, and the checks and texts of the command line and of the trace
//! extension (`/v2/trace/setting`, gRPC `TraceSetting`).

use tern_core::error::{Error, Result};
use tern_core::trace::Level;

/// Where sampled traces go (`--trace-config mode=...`), fixed at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Triton's trace files (JSON).
    #[default]
    Triton,
    /// OpenTelemetry spans exported over OTLP/HTTP.
    OpenTelemetry,
}

impl Mode {
    /// The name the trace extension shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Triton => "triton",
            Mode::OpenTelemetry => "opentelemetry",
        }
    }

    /// A mode by name (case-insensitive), or Triton's error text.
    pub fn parse(s: &str) -> std::result::Result<Mode, String> {
        match s.to_ascii_lowercase().as_str() {
            "triton" => Ok(Mode::Triton),
            "opentelemetry" => Ok(Mode::OpenTelemetry),
            other => Err(format!(
                "invalid value for trace mode option: {other}. Available options are \"triton\" and \"opentelemetry\""
            )),
        }
    }
}

/// One scope's values: the global setting, or a model's with its
/// overrides applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Values {
    /// What is recorded; `OFF` samples nothing.
    pub level: Level,
    /// Every `rate`-th request is traced.
    pub rate: u32,
    /// Traces left to take (-1: no limit).
    pub count: i32,
    /// Traces per numbered file (0: one file, written when the setting ends).
    pub log_frequency: u32,
    /// The trace file (triton mode).
    pub file: String,
}

impl Default for Values {
    /// tritonserver's defaults.
    fn default() -> Self {
        Values {
            level: Level::default(),
            rate: 1000,
            count: -1,
            log_frequency: 0,
            file: String::new(),
        }
    }
}

impl Values {
    /// Why these values cannot trace (Triton's `TraceSetting::Valid`): `None`
    /// when they can. An `OFF` level is always a valid setting (it samples nothing).
    pub fn invalid_reason(&self, mode: Mode) -> Option<String> {
        if self.level.is_off() {
            return None;
        }
        let reason = if self.rate == 0 {
            "sample rate must be non-zero"
        } else if mode == Mode::Triton && self.file.is_empty() {
            "trace file name is not given"
        } else if self.count == 0 {
            ""
        } else {
            return None;
        };
        Some(reason.to_string())
    }

    /// Whether requests are sampled at all.
    pub fn samples(&self, mode: Mode) -> bool {
        !self.level.is_off() && self.invalid_reason(mode).is_none()
    }
}

/// What a model's own setting changes (`None`: the global value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `trace_level`.
    pub level: Option<Level>,
    /// `trace_rate`.
    pub rate: Option<u32>,
    /// `trace_count`.
    pub count: Option<i32>,
    /// `log_frequency`.
    pub log_frequency: Option<u32>,
}

impl Overrides {
    /// The global values with these applied.
    pub fn apply(&self, global: &Values) -> Values {
        Values {
            level: self.level.unwrap_or(global.level),
            rate: self.rate.unwrap_or(global.rate),
            count: self.count.unwrap_or(global.count),
            log_frequency: self.log_frequency.unwrap_or(global.log_frequency),
            file: global.file.clone(),
        }
    }

    /// Whether nothing is overridden.
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }
}

/// One change the trace extension asks for: a value, or `None` to clear it
/// (a model's back to the global value, the global one back to the
/// command line's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Update {
    /// `trace_level`: `Some(None)` clears.
    pub level: Option<Option<Level>>,
    /// `trace_rate`.
    pub rate: Option<Option<u32>>,
    /// `trace_count`.
    pub count: Option<Option<i32>>,
    /// `log_frequency`.
    pub log_frequency: Option<Option<u32>>,
}

impl Update {
    /// An update from the extension's keys and string values in the order
    /// given (`None`: the key was `null` or an empty list). Triton's texts;
    /// unknown keys are ignored as Triton ignores them. `got_sep` is what
    /// follows "got:" in the count's range error (HTTP has no space, gRPC one).
    pub fn parse<'a>(
        entries: impl IntoIterator<Item = (&'a str, Option<Vec<String>>)>,
        got_sep: &str,
    ) -> Result<Update> {
        let mut u = Update::default();
        let mut entries: Vec<(&str, Option<Vec<String>>)> = entries.into_iter().collect();
        // Triton checks the keys in this order, whatever order the client sent.
        let order = [
            "trace_file",
            "trace_level",
            "trace_rate",
            "trace_count",
            "log_frequency",
        ];
        entries.sort_by_key(|(k, _)| order.iter().position(|o| o == k).unwrap_or(order.len()));
        for (key, values) in entries {
            let one = || values.as_ref().and_then(|v| v.first()).cloned();
            match key {
                "trace_file" => {
                    return Err(Error::unsupported(
                        "trace file location can not be updated through network protocol",
                    ))
                }
                "trace_level" => {
                    u.level = Some(match &values {
                        None => None,
                        Some(v) if v.is_empty() => continue,
                        Some(v) => match api_level(v)? {
                            Some(level) => Some(level),
                            None => continue,
                        },
                    })
                }
                "trace_rate" => {
                    u.rate = Some(one().map(|v| parse_u32("trace_rate", &v)).transpose()?)
                }
                "trace_count" => {
                    u.count = Some(one().map(|v| parse_count(&v, got_sep)).transpose()?)
                }
                "log_frequency" => {
                    u.log_frequency =
                        Some(one().map(|v| parse_u32("log_frequency", &v)).transpose()?)
                }
                _ => {}
            }
        }
        Ok(u)
    }

    /// Applies the update to a model's overrides.
    pub fn apply_to_overrides(&self, o: &mut Overrides) {
        if let Some(v) = self.level {
            o.level = v;
        }
        if let Some(v) = self.rate {
            o.rate = v;
        }
        if let Some(v) = self.count {
            o.count = v;
        }
        if let Some(v) = self.log_frequency {
            o.log_frequency = v;
        }
    }

    /// Applies the update to the global values; a cleared value comes from `startup`.
    pub fn apply_to_values(&self, v: &mut Values, startup: &Values) {
        if let Some(x) = self.level {
            v.level = x.unwrap_or(startup.level);
        }
        if let Some(x) = self.rate {
            v.rate = x.unwrap_or(startup.rate);
        }
        if let Some(x) = self.count {
            v.count = x.unwrap_or(startup.count);
        }
        if let Some(x) = self.log_frequency {
            v.log_frequency = x.unwrap_or(startup.log_frequency);
        }
    }
}

/// The level a trace extension list names: unknown names are ignored as
/// Triton ignores them (`None` when no name is known); `OFF` only alone.
fn api_level(names: &[String]) -> Result<Option<Level>> {
    let mut level = Level::default();
    let mut known = false;
    for name in names {
        match name.as_str() {
            "OFF" => {
                if names.len() > 1 {
                    return Err(Error::invalid_arg(
                        "Expect only one trace level 'OFF' is specified",
                    ));
                }
                return Ok(Some(Level::default()));
            }
            "TIMESTAMPS" => level.timestamps = true,
            "TENSORS" => level.tensors = true,
            _ => continue,
        }
        known = true;
    }
    Ok(known.then_some(level))
}

/// A leading integer as C's `stoi` reads one (leading blanks, a sign, the
/// digits up to the first other character); `None` when there are no digits.
fn stoi(s: &str) -> Option<i64> {
    let t = s.trim_start();
    let (neg, rest) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
    if digits.is_empty() {
        return None;
    }
    // Past i64 is past every range checked below.
    let v = digits.parse::<i64>().unwrap_or(i64::MAX);
    Some(if neg { -v } else { v })
}

fn parse_u32(key: &str, s: &str) -> Result<u32> {
    let v =
        stoi(s).ok_or_else(|| Error::invalid_arg(format!("Unable to parse '{key}', got: {s}")))?;
    if v < i32::MIN as i64 || v > i32::MAX as i64 {
        return Err(Error::invalid_arg(format!(
            "Unable to parse '{key}', value is out of range [ 0, 4294967295 ], got: {s}"
        )));
    }
    // Triton stores stoi's int in a uint32: -1 is 4294967295.
    Ok(v as i32 as u32)
}

fn parse_count(s: &str, got_sep: &str) -> Result<i32> {
    let v = stoi(s)
        .ok_or_else(|| Error::invalid_arg(format!("Unable to parse 'trace_count', got: {s}")))?;
    if v < i32::MIN as i64 || v > i32::MAX as i64 {
        return Err(Error::invalid_arg(format!(
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: {s}"
        )));
    }
    if v < -1 {
        return Err(Error::invalid_arg(format!(
            "Unable to parse 'trace_count'. Expecting value >= -1, got:{got_sep}{s}"
        )));
    }
    Ok(v as i32)
}

/// A `level` value of the command line (`--trace-config level=...`,
/// `--trace-level`): `None` for `OFF` (which turns tracing off whatever
/// else is given), or Triton's error text.
pub fn cli_level(s: &str) -> std::result::Result<Option<Level>, String> {
    match s.to_ascii_lowercase().as_str() {
        "false" | "off" => Ok(None),
        "true" | "on" | "min" | "max" | "timestamps" => Ok(Some(Level {
            timestamps: true,
            tensors: false,
        })),
        "tensors" => Ok(Some(Level {
            timestamps: false,
            tensors: true,
        })),
        other => Err(format!("invalid value for trace level option: {other}")),
    }
}

/// An integer value of the command line as tritonserver's `stoi` reads it, or its error text.
pub fn cli_int(s: &str) -> std::result::Result<i64, String> {
    let v = stoi(s).ok_or_else(|| format!("Invalid option value. Got {s}"))?;
    if v < i32::MIN as i64 || v > i32::MAX as i64 {
        return Err(format!("Provided option value is out of bound. Got {s}"));
    }
    Ok(v)
}

/// The extension's view of a scope's values, in Triton's key order (all
/// values strings): `trace_level`, `trace_rate`, `trace_count` (what is left
/// of it), then in triton mode `log_frequency` and `trace_file`, then
/// `trace_mode`; the caller appends the mode's own settings.
pub fn render(values: &Values, remaining: i32, mode: Mode) -> Vec<(String, Vec<String>)> {
    let mut level = Vec::new();
    if values.level.timestamps {
        level.push("TIMESTAMPS".to_string());
    }
    if values.level.tensors {
        level.push("TENSORS".to_string());
    }
    if level.is_empty() {
        level.push("OFF".to_string());
    }
    let mut out = vec![
        ("trace_level".to_string(), level),
        ("trace_rate".to_string(), vec![values.rate.to_string()]),
        ("trace_count".to_string(), vec![remaining.to_string()]),
    ];
    if mode == Mode::Triton {
        out.push((
            "log_frequency".into(),
            vec![values.log_frequency.to_string()],
        ));
        out.push(("trace_file".into(), vec![values.file.clone()]));
    }
    out.push(("trace_mode".into(), vec![mode.as_str().to_string()]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(entries: &[(&str, Option<&[&str]>)]) -> Result<Update> {
        Update::parse(
            entries
                .iter()
                .map(|(k, v)| (*k, v.map(|v| v.iter().map(|s| s.to_string()).collect()))),
            "",
        )
    }

    #[test]
    fn extension_values_parse_as_tritons_stoi_and_fail_with_its_texts() {
        let u = update(&[
            ("trace_rate", Some(&["12abc"])),
            ("trace_count", Some(&["7"])),
        ])
        .unwrap();
        assert_eq!((u.rate, u.count), (Some(Some(12)), Some(Some(7))));
        assert_eq!(
            update(&[("trace_rate", Some(&["-1"]))]).unwrap().rate,
            Some(Some(u32::MAX))
        );
        let e = |entries: &[(&str, Option<&[&str]>)]| update(entries).unwrap_err().message;
        assert_eq!(
            e(&[("trace_rate", Some(&["abc"]))]),
            "Unable to parse 'trace_rate', got: abc"
        );
        assert_eq!(
            e(&[("trace_rate", Some(&["3000000000"]))]),
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 3000000000"
        );
        assert_eq!(
            e(&[("trace_count", Some(&["-2"]))]),
            "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"
        );
        assert_eq!(
            e(&[("log_frequency", Some(&["x"]))]),
            "Unable to parse 'log_frequency', got: x"
        );
        assert_eq!(
            e(&[("trace_level", Some(&["TIMESTAMPS", "OFF"]))]),
            "Expect only one trace level 'OFF' is specified"
        );
        let file = update(&[("trace_rate", Some(&["abc"])), ("trace_file", None)]).unwrap_err();
        assert_eq!(
            file.code,
            tern_core::Code::Unsupported,
            "trace_file is checked first"
        );
    }

    #[test]
    fn levels_unknown_names_are_ignored_and_null_clears() {
        assert_eq!(
            update(&[("trace_level", Some(&["BAD"]))]).unwrap().level,
            None
        );
        assert_eq!(update(&[("trace_level", Some(&[]))]).unwrap().level, None);
        assert_eq!(update(&[("trace_level", None)]).unwrap().level, Some(None));
        let both = update(&[("trace_level", Some(&["TENSORS", "TIMESTAMPS", "X"]))]).unwrap();
        assert_eq!(
            both.level,
            Some(Some(Level {
                timestamps: true,
                tensors: true
            }))
        );
        assert_eq!(
            update(&[("trace_mode", Some(&["x"]))]).unwrap(),
            Update::default()
        );
    }

    #[test]
    fn a_setting_is_valid_as_tritons() {
        let on = Values {
            level: cli_level("timestamps").unwrap().unwrap(),
            ..Default::default()
        };
        assert_eq!(
            on.invalid_reason(Mode::Triton).as_deref(),
            Some("trace file name is not given")
        );
        assert_eq!(on.invalid_reason(Mode::OpenTelemetry), None);
        let zero = Values {
            rate: 0,
            ..on.clone()
        };
        assert_eq!(
            zero.invalid_reason(Mode::OpenTelemetry).as_deref(),
            Some("sample rate must be non-zero")
        );
        let counted = Values {
            count: 0,
            file: "f".into(),
            ..on
        };
        assert_eq!(counted.invalid_reason(Mode::Triton).as_deref(), Some(""));
        assert_eq!(
            Values::default().invalid_reason(Mode::Triton),
            None,
            "OFF is valid"
        );
    }

    #[test]
    fn the_command_line_reads_levels_and_integers_as_tritonserver() {
        assert_eq!(cli_level("OFF"), Ok(None));
        assert!(cli_level("Max").unwrap().unwrap().timestamps);
        assert_eq!(
            cli_level("BAD").unwrap_err(),
            "invalid value for trace level option: bad"
        );
        assert_eq!(cli_int("1.5"), Ok(1));
        assert_eq!(cli_int("abc").unwrap_err(), "Invalid option value. Got abc");
        assert_eq!(
            cli_int("99999999999").unwrap_err(),
            "Provided option value is out of bound. Got 99999999999"
        );
        assert!(Mode::parse("bad")
            .unwrap_err()
            .starts_with("invalid value for trace mode option: bad."));
    }

    #[test]
    fn renders_in_tritons_key_order() {
        let v = Values {
            file: "/t.json".into(),
            ..Default::default()
        };
        let keys: Vec<String> = render(&v, -1, Mode::Triton)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            [
                "trace_level",
                "trace_rate",
                "trace_count",
                "log_frequency",
                "trace_file",
                "trace_mode"
            ]
        );
        let otel = render(&v, 3, Mode::OpenTelemetry);
        assert_eq!(otel.len(), 4);
        assert_eq!(otel[0].1, ["OFF"]);
        assert_eq!(otel[2].1, ["3"]);
    }
}
