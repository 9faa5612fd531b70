//! tritonserver's tracing command line: `--trace-config [<mode>,]<setting>=<value>`
//! (repeatable) and the deprecated `--trace-file`, `--trace-level`,
//! `--trace-rate`, `--trace-count` and `--trace-log-frequency`, read as
//! tritonserver reads them (its texts, its leniency with unknown settings).

use tern_core::error::{Error, Result};
use tern_core::trace::Level;

use super::otel::OtelConfig;
use super::setting::{cli_int, cli_level, Mode};
use super::{TraceConfig, Values};

/// The deprecated `--trace-*` flags.
#[derive(Debug, Clone, Default)]
pub struct Deprecated {
    /// `--trace-file`.
    pub file: Option<String>,
    /// `--trace-level` (repeatable).
    pub level: Vec<String>,
    /// `--trace-rate`.
    pub rate: Option<String>,
    /// `--trace-count`.
    pub count: Option<String>,
    /// `--trace-log-frequency`.
    pub log_frequency: Option<String>,
}

fn bad(option: &str, why: impl std::fmt::Display) -> Error {
    Error::invalid_arg(format!("Bad option: \"{option}\". {why}"))
}

/// `--trace-config` pairs: the global ones, the triton mode's and the opentelemetry mode's.
type Split = [Vec<(String, String)>; 3];

/// Splits the `--trace-config` values by mode, checking their form.
fn split(config: &[String]) -> Result<Split> {
    let mut global: Vec<(String, String)> = Vec::new();
    let mut triton: Vec<(String, String)> = Vec::new();
    let mut otel: Vec<(String, String)> = Vec::new();
    for arg in config {
        let (mode, setting) = match arg.split_once(',') {
            Some((m, s)) if m.contains('=') => (None, m.to_string() + "," + s),
            Some((m, s)) => (Some(m), s.to_string()),
            None => (None, arg.clone()),
        };
        if mode == Some("") {
            return Err(bad(
                "--trace-config",
                format!("No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> or <setting>=<value>. Got {arg}"),
            ));
        }
        let (key, value) = setting
            .split_once('=')
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .ok_or_else(|| {
                bad(
                    "--trace-config",
                    format!("--trace-config option format is '<trace mode>,<setting>=<value>'. Got {arg}"),
                )
            })?;
        let pair = (key.to_string(), value.to_string());
        match mode.map(Mode::parse) {
            None => global.push(pair),
            Some(Ok(Mode::Triton)) => triton.push(pair),
            Some(Ok(Mode::OpenTelemetry)) => otel.push(pair),
            Some(Err(why)) => return Err(bad("--trace-config", why)),
        }
    }
    Ok([global, triton, otel])
}

/// The tracing settings of a command line.
pub fn parse(config: &[String], old: &Deprecated) -> Result<TraceConfig> {
    let [global, triton, otel] = split(config)?;
    let mut out = TraceConfig::default();
    let v = &mut out.values;
    deprecated(old, v)?;
    let given = |list: &[(String, String)], key: &str| list.iter().any(|(k, _)| k == key);
    let warn_override = |old_flag: &str, what: &str| {
        tracing::warn!("Overriding deprecated '{old_flag}' in favor of provided {what} value in --trace-config!");
    };
    if given(&global, "level") {
        if !old.level.is_empty() {
            warn_override("--trace-level", "level");
        }
        let levels: Vec<&str> = global
            .iter()
            .filter(|(k, _)| k == "level")
            .map(|(_, v)| v.as_str())
            .collect();
        v.level = levels_of(&levels).map_err(|why| bad("--trace-config level", why))?;
    }
    for (key, value) in &global {
        match key.as_str() {
            "rate" => {
                if old.rate.is_some() {
                    warn_override("--trace-rate", "rate");
                }
                v.rate =
                    cli_int(value).map_err(|why| bad("--trace-config rate", why))? as i32 as u32;
            }
            "count" => {
                if old.count.is_some() {
                    warn_override("--trace-count", "count");
                }
                v.count = cli_int(value).map_err(|why| bad("--trace-config count", why))? as i32;
            }
            "mode" => {
                out.mode = Mode::parse(value).map_err(|why| bad("--trace-config mode", why))?
            }
            _ => {}
        }
    }
    for (key, value) in &triton {
        match key.as_str() {
            "file" => {
                if old.file.is_some() {
                    warn_override("--trace-file", "file");
                }
                v.file = value.clone();
            }
            "log-frequency" => {
                if old.log_frequency.is_some() {
                    warn_override("--trace-log-frequency", "log-frequency");
                }
                v.log_frequency = cli_int(value)
                    .map_err(|why| bad("--trace-config triton,log-frequency", why))?
                    as i32 as u32;
            }
            _ => {}
        }
    }
    let mine = match out.mode {
        Mode::Triton => &triton,
        Mode::OpenTelemetry => &otel,
    };
    out.mode_settings = mine
        .iter()
        .filter(|(k, _)| k != "file" && k != "log-frequency")
        .cloned()
        .collect();
    if out.mode == Mode::OpenTelemetry {
        out.otel = OtelConfig::from_pairs(&otel)?;
    }
    Ok(out)
}

/// The deprecated flags, each with tritonserver's warning.
fn deprecated(old: &Deprecated, v: &mut Values) -> Result<()> {
    let warn = |flag: &str, instead: &str| {
        tracing::warn!("'{flag}' has been deprecated and will be removed in future releases. Please use '--trace-config {instead} instead.");
    };
    if let Some(f) = &old.file {
        warn("--trace-file", "triton,file=<filepath>");
        v.file = f.clone();
    }
    if !old.level.is_empty() {
        warn("--trace-level", "level=<OFF|TIMESTAMPS|TENSORS>");
        let levels: Vec<&str> = old.level.iter().map(String::as_str).collect();
        v.level = levels_of(&levels).map_err(|why| bad("--trace-level", why))?;
    }
    if let Some(r) = &old.rate {
        warn("--trace-rate", "rate=<rate value>");
        v.rate = cli_int(r).map_err(|why| bad("--trace-rate", why))? as i32 as u32;
    }
    if let Some(c) = &old.count {
        warn("--trace-count", "count=<count value>");
        v.count = cli_int(c).map_err(|why| bad("--trace-count", why))? as i32;
    }
    if let Some(f) = &old.log_frequency {
        warn("--trace-log-frequency", "triton,log-frequency=<value>");
        v.log_frequency =
            cli_int(f).map_err(|why| bad("--trace-log-frequency", why))? as i32 as u32;
    }
    Ok(())
}

/// Several `level` values together; any `OFF` turns tracing off.
fn levels_of(values: &[&str]) -> std::result::Result<Level, String> {
    let mut level = Level::default();
    let mut off = false;
    for v in values {
        match cli_level(v)? {
            None => off = true,
            Some(l) => {
                level.timestamps |= l.timestamps;
                level.tensors |= l.tensors;
            }
        }
    }
    Ok(if off { Level::default() } else { level })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_args(args: &[&str]) -> Result<TraceConfig> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(&args, &Deprecated::default())
    }

    #[test]
    fn global_and_mode_settings() {
        let c = parse_args(&[
            "triton,file=/tmp/t.json",
            "level=TIMESTAMPS",
            "level=tensors",
            "rate=1",
            "count=5",
            "triton,log-frequency=2",
            "triton,foo=bar",
            "unknown=ignored",
        ])
        .unwrap();
        assert_eq!(c.mode, Mode::Triton);
        assert_eq!(
            c.values,
            Values {
                level: Level {
                    timestamps: true,
                    tensors: true
                },
                rate: 1,
                count: 5,
                log_frequency: 2,
                file: "/tmp/t.json".into(),
            }
        );
        assert_eq!(c.mode_settings, [("foo".to_string(), "bar".to_string())]);
        let off = parse_args(&["level=TIMESTAMPS", "level=OFF"]).unwrap();
        assert!(off.values.level.is_off(), "any OFF turns tracing off");
    }

    #[test]
    fn tritonservers_texts_for_bad_values() {
        let e = |args: &[&str]| parse_args(args).unwrap_err().message;
        assert_eq!(
            e(&["level=BAD"]),
            "Bad option: \"--trace-config level\". invalid value for trace level option: bad"
        );
        assert_eq!(
            e(&["rate=abc"]),
            "Bad option: \"--trace-config rate\". Invalid option value. Got abc"
        );
        assert_eq!(
            e(&["mode=bad"]),
            "Bad option: \"--trace-config mode\". invalid value for trace mode option: bad. Available options are \"triton\" and \"opentelemetry\""
        );
        assert!(e(&["bad,file=/x"]).starts_with(
            "Bad option: \"--trace-config\". invalid value for trace mode option: bad."
        ));
        assert!(e(&[",file=x"]).contains("No trace mode specified."));
        assert_eq!(
            e(&["level"]),
            "Bad option: \"--trace-config\". --trace-config option format is '<trace mode>,<setting>=<value>'. Got level"
        );
        assert!(e(&["triton,log-frequency=x"])
            .starts_with("Bad option: \"--trace-config triton,log-frequency\"."));
        assert!(
            parse_args(&["rate=0", "rate=1.5"]).is_ok(),
            "tritonserver accepts these"
        );
        assert!(
            parse_args(&["opentelemetry,bsp_max_queue_size=abc"]).is_ok(),
            "read only in opentelemetry mode"
        );
    }

    #[test]
    fn deprecated_flags_apply_and_trace_config_wins() {
        let old = Deprecated {
            file: Some("/old.json".into()),
            level: vec!["TIMESTAMPS".into()],
            rate: Some("7".into()),
            ..Default::default()
        };
        let c = parse(&["rate=3".to_string()], &old).unwrap();
        assert_eq!((c.values.rate, c.values.file.as_str()), (3, "/old.json"));
        assert!(c.values.level.timestamps);
        let bad = Deprecated {
            rate: Some("abc".into()),
            ..Default::default()
        };
        assert_eq!(
            parse(&[], &bad).unwrap_err().message,
            "Bad option: \"--trace-rate\". Invalid option value. Got abc"
        );
    }
}
