//! Request tracing as Triton does it (`--trace-config`, the trace
//! extension): which requests are sampled, under which setting (the global
//! one or a model's), and where their traces go — Triton's trace files
//! ([`file`]) or OpenTelemetry spans ([`otel`]).
//!
//! Every setting in force is an [`Active`]: its values, its counters (the
//! requests it has seen, the traces left of its `count`) and the traces it
//! has gathered. An update replaces the setting; the one replaced writes
//! what it gathered once its last trace has ended, as Triton's does. The
//! tracer always exists, so tracing can be turned on at run time.

pub mod clock;
pub mod file;
pub mod flags;
pub mod otel;
pub mod setting;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tern_core::error::{Error, Result};
use tern_core::trace::{Record, Sink, Trace};

use clock::Clock;
use file::TraceFile;
pub use setting::{Mode, Overrides, Update, Values};

/// How tracing starts (from `--trace-config` and the deprecated `--trace-*` flags).
#[derive(Debug, Clone, Default)]
pub struct TraceConfig {
    /// Where traces go.
    pub mode: Mode,
    /// The global setting at startup (a cleared value returns to it).
    pub values: Values,
    /// The mode's other `--trace-config <mode>,<key>=<value>` settings, in
    /// command-line order, as the trace extension shows them.
    pub mode_settings: Vec<(String, String)>,
    /// The OpenTelemetry exporter's settings (mode `opentelemetry`).
    pub otel: otel::OtelConfig,
}

/// The server's tracer; see the module doc.
pub struct Tracer {
    mode: Mode,
    startup: Values,
    shown: Vec<(String, String)>,
    /// Whether any setting samples: requests skip the tracer's lock when none does.
    on: AtomicBool,
    state: RwLock<State>,
    shared: Arc<Shared>,
}

/// What every setting shares: ids, clocks, the files and the exporter.
struct Shared {
    ids: AtomicU64,
    clock: Clock,
    files: Mutex<HashMap<String, Arc<TraceFile>>>,
    otel: Option<otel::Exporter>,
}

struct State {
    /// What the trace extension has set globally (cleared: the startup value).
    global_api: Overrides,
    global: Arc<Active>,
    models: HashMap<String, (Overrides, Arc<Active>)>,
}

/// A setting in force: see the module doc. The sink of the traces it samples.
pub struct Active {
    values: Values,
    mode: Mode,
    counters: Mutex<Counters>,
    file: Option<Arc<TraceFile>>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Counters {
    /// Requests seen.
    seen: u64,
    /// Traces left to take (-1: no limit).
    remaining: i32,
    /// Trace trees finished.
    collected: u64,
    /// Trees gathered since the last write, and their rendering.
    gathered: u64,
    stream: String,
}

impl Tracer {
    /// A tracer with `config`; fails when the OpenTelemetry exporter cannot be built.
    pub fn new(config: TraceConfig) -> Result<Arc<Tracer>> {
        let otel = match config.mode {
            Mode::OpenTelemetry => Some(otel::Exporter::new(&config.otel)?),
            Mode::Triton => None,
        };
        let shared = Arc::new(Shared {
            ids: AtomicU64::new(1),
            clock: Clock::new(),
            files: Mutex::new(HashMap::new()),
            otel,
        });
        let mut shown: Vec<(String, String)> = config.mode_settings.clone();
        if config.mode == Mode::OpenTelemetry {
            shown = config.otel.shown(&shown);
        }
        if let Some(reason) = config.values.invalid_reason(config.mode) {
            tracing::warn!(
                "tracing is on but nothing will be traced until the setting is fixed: {}",
                if reason.is_empty() {
                    "its count is 0"
                } else {
                    reason.as_str()
                }
            );
        }
        let global = Active::new(config.values.clone(), config.mode, &shared);
        let tracer = Tracer {
            mode: config.mode,
            startup: config.values,
            shown,
            on: AtomicBool::new(false),
            state: RwLock::new(State {
                global_api: Overrides::default(),
                global,
                models: HashMap::new(),
            }),
            shared,
        };
        tracer.refresh_on(&tracer.state.read().unwrap_or_else(|p| p.into_inner()));
        Ok(Arc::new(tracer))
    }

    /// A tracer with Triton's defaults: nothing sampled until the trace
    /// extension turns tracing on (which, in triton mode, needs a file).
    pub fn off() -> Arc<Tracer> {
        Tracer::new(TraceConfig::default()).expect("the default tracer needs no exporter")
    }

    fn refresh_on(&self, state: &State) {
        // A setting whose level is on may trace a request with a `traceparent` even when its
        // rate or count samples nothing.
        let on = !state.global.values.level.is_off()
            || state.models.values().any(|(_, a)| !a.values.level.is_off());
        self.on.store(on, Ordering::Relaxed);
    }

    /// A trace for a request to `model` when its setting samples this one;
    /// `traceparent` is the W3C header a client sent (OpenTelemetry mode continues it).
    pub fn sample(&self, model: &str, traceparent: Option<&str>) -> Option<Arc<Trace>> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        let active = {
            let state = self.state.read().unwrap_or_else(|p| p.into_inner());
            match state.models.get(model) {
                Some((_, a)) => a.clone(),
                None => state.global.clone(),
            }
        };
        // In OpenTelemetry mode a client's valid `traceparent` is always traced (Triton's
        // forced sample), though it still counts towards the rate and the count.
        let remote = match self.mode {
            Mode::OpenTelemetry => traceparent.and_then(otel::parse_traceparent),
            Mode::Triton => None,
        };
        if !active.take_sample(remote.is_some()) {
            return None;
        }
        let level = active.values.level;
        Some(Trace::new(active, level, model, remote))
    }

    /// The setting of `model` (`None`: the global one) as the trace extension shows it.
    pub fn settings(&self, model: Option<&str>) -> Vec<(String, Vec<String>)> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        let active = model
            .and_then(|m| state.models.get(m).map(|(_, a)| a))
            .unwrap_or(&state.global);
        self.render(active)
    }

    fn render(&self, active: &Active) -> Vec<(String, Vec<String>)> {
        let remaining = active.lock().remaining;
        let mut out = setting::render(&active.values, remaining, self.mode);
        out.extend(self.shown.iter().map(|(k, v)| (k.clone(), vec![v.clone()])));
        out
    }

    /// Applies the trace extension's `update` to `model`'s setting (`None`:
    /// the global one, which the models that do not override a value
    /// follow) and answers the setting as it is now. An update that would
    /// leave an invalid setting changes nothing.
    pub fn update(
        &self,
        model: Option<&str>,
        update: &Update,
    ) -> Result<Vec<(String, Vec<String>)>> {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if *update == Update::default() {
            drop(state);
            return Ok(self.settings(model));
        }
        let invalid = |v: &Values| {
            v.invalid_reason(self.mode).map(|reason| {
                Error::invalid_arg(format!("Attempting to set invalid trace setting :{reason}"))
            })
        };
        match model {
            Some(model) => {
                let (mut overrides, old) = match state.models.get(model) {
                    Some((o, a)) => (o.clone(), Some(a.clone())),
                    None => (Overrides::default(), None),
                };
                update.apply_to_overrides(&mut overrides);
                let mut values = overrides.apply(&state.global.values);
                keep_spent_count(&mut values, &overrides, update, old.as_deref());
                if let Some(e) = invalid(&values) {
                    return Err(e);
                }
                if overrides.is_empty() {
                    state.models.remove(model);
                } else {
                    let active = Active::new(values, self.mode, &self.shared);
                    state.models.insert(model.to_string(), (overrides, active));
                }
            }
            None => {
                let mut global_api = state.global_api.clone();
                update.apply_to_overrides(&mut global_api);
                let mut values = global_api.apply(&self.startup);
                keep_spent_count(&mut values, &global_api, update, Some(&state.global));
                if let Some(e) = invalid(&values) {
                    return Err(e);
                }
                state.global = Active::new(values, self.mode, &self.shared);
                state.global_api = global_api;
                let global = state.global.values.clone();
                for (overrides, active) in state.models.values_mut() {
                    let mut values = overrides.apply(&global);
                    keep_spent_count(&mut values, overrides, &Update::default(), Some(active));
                    *active = Active::new(values, self.mode, &self.shared);
                }
            }
        }
        self.refresh_on(&state);
        let active = model
            .and_then(|m| state.models.get(m).map(|(_, a)| a.clone()))
            .unwrap_or_else(|| state.global.clone());
        drop(state);
        Ok(self.render(&active))
    }

    /// Ends tracing at shutdown: every setting writes what it gathered, the
    /// trace files' arrays are closed and the exporter sends what it holds.
    /// Requests still running afterwards are not traced.
    pub fn shutdown(&self) {
        self.on.store(false, Ordering::Relaxed);
        {
            let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
            let off = Active::new(Values::default(), self.mode, &self.shared);
            state.global = off;
            state.models.clear();
        }
        for f in self
            .shared
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            f.close();
        }
        if let Some(e) = &self.shared.otel {
            e.shutdown();
        }
    }
}

/// A scope whose own `count` ran out stays spent until an update sets a
/// new one (Triton answers the next update of it as an invalid setting).
fn keep_spent_count(values: &mut Values, own: &Overrides, update: &Update, old: Option<&Active>) {
    if let (Some(_), None, Some(old)) = (own.count, update.count, old) {
        values.count = old.lock().remaining;
    }
}

impl Shared {
    fn file(&self, path: &str) -> Arc<TraceFile> {
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(path.to_string())
            .or_insert_with(|| Arc::new(TraceFile::new(path)))
            .clone()
    }
}

impl Active {
    fn new(values: Values, mode: Mode, shared: &Arc<Shared>) -> Arc<Active> {
        let file =
            (mode == Mode::Triton && !values.file.is_empty()).then(|| shared.file(&values.file));
        Arc::new(Active {
            counters: Mutex::new(Counters {
                remaining: values.count,
                ..Default::default()
            }),
            values,
            mode,
            file,
            shared: shared.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request and says whether it is traced: every `rate`-th one
    /// while traces are left of the count, and a `forced` one whenever the
    /// level is on.
    fn take_sample(&self, forced: bool) -> bool {
        let mut c = self.lock();
        if self.values.level.is_off() {
            return false;
        }
        if !self.values.samples(self.mode) || c.remaining == 0 {
            return forced;
        }
        c.seen += 1;
        let hit = c.seen.is_multiple_of(u64::from(self.values.rate));
        if hit && c.remaining > 0 {
            c.remaining -= 1;
        }
        hit || forced
    }
}

impl Sink for Active {
    fn next_id(&self) -> u64 {
        self.shared.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn finish(&self, tree: Vec<Record>) {
        if let Some(exporter) = &self.shared.otel {
            exporter.export(tree, &self.shared.clock);
            return;
        }
        let Some(file) = &self.file else { return };
        let rendered = file::render(&tree, &self.shared.clock);
        let mut c = self.lock();
        c.collected += 1;
        if rendered.is_empty() {
            return;
        }
        if !c.stream.is_empty() {
            c.stream.push(',');
        }
        c.stream.push_str(&rendered);
        c.gathered += 1;
        let lf = u64::from(self.values.log_frequency);
        if (c.remaining == 0 && c.collected == c.seen) || (lf != 0 && c.gathered >= lf) {
            let stream = std::mem::take(&mut c.stream);
            c.gathered = 0;
            drop(c);
            file.save_numbered(&stream);
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let c = self.counters.get_mut().unwrap_or_else(|p| p.into_inner());
        if let (Some(file), false) = (&self.file, c.stream.is_empty()) {
            if self.values.log_frequency != 0 {
                file.save_numbered(&c.stream);
            } else {
                file.append(&c.stream);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::trace::Level;

    const TIMESTAMPS: Level = Level {
        timestamps: true,
        tensors: false,
    };

    fn tracer(dir: &std::path::Path, values: Values) -> Arc<Tracer> {
        Tracer::new(TraceConfig {
            values: Values {
                file: dir.join("t.json").to_string_lossy().into(),
                ..values
            },
            ..Default::default()
        })
        .unwrap()
    }

    fn get<'a>(setting: &'a [(String, Vec<String>)], key: &str) -> &'a str {
        &setting.iter().find(|(k, _)| k == key).unwrap().1[0]
    }

    /// Samples a request to `model` and ends its trace at once.
    fn request(t: &Tracer, model: &str) -> bool {
        t.sample(model, None)
            .map(|trace| {
                trace.resolved(model, 1, "");
                trace.timestamp("REQUEST_START");
            })
            .is_some()
    }

    fn read(path: std::path::PathBuf) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    #[test]
    fn every_rate_th_request_while_the_count_lasts_then_a_numbered_file() {
        let dir = tempfile::tempdir().unwrap();
        let t = tracer(
            dir.path(),
            Values {
                level: TIMESTAMPS,
                rate: 2,
                count: 2,
                ..Default::default()
            },
        );
        let sampled: Vec<bool> = (0..6).map(|_| request(&t, "m")).collect();
        assert_eq!(sampled, [false, true, false, true, false, false]);
        assert_eq!(get(&t.settings(None), "trace_count"), "0");
        // Rate 2: the count ran out but not every request seen was traced, so the traces
        // wait for the setting to end.
        assert!(!dir.path().join("t.json.0").exists());
        t.shutdown();
        let plain = read(dir.path().join("t.json"));
        assert_eq!(
            plain.as_array().unwrap().len(),
            4,
            "two traces of a header and a timestamp"
        );
    }

    #[test]
    fn log_frequency_writes_numbered_files_and_rate_one_counts_flush() {
        let dir = tempfile::tempdir().unwrap();
        let t = tracer(
            dir.path(),
            Values {
                level: TIMESTAMPS,
                rate: 1,
                log_frequency: 2,
                ..Default::default()
            },
        );
        for _ in 0..5 {
            assert!(request(&t, "m"));
        }
        assert_eq!(
            read(dir.path().join("t.json.0")).as_array().unwrap().len(),
            4
        );
        assert_eq!(
            read(dir.path().join("t.json.1")).as_array().unwrap().len(),
            4
        );
        t.shutdown();
        assert_eq!(
            read(dir.path().join("t.json.2")).as_array().unwrap().len(),
            2
        );
        assert!(!dir.path().join("t.json").exists());

        let dir = tempfile::tempdir().unwrap();
        let counted = tracer(
            dir.path(),
            Values {
                level: TIMESTAMPS,
                rate: 1,
                count: 3,
                ..Default::default()
            },
        );
        for _ in 0..4 {
            request(&counted, "m");
        }
        assert_eq!(
            read(dir.path().join("t.json.0")).as_array().unwrap().len(),
            6
        );
    }

    #[test]
    fn model_settings_override_and_follow_the_global_one() {
        let dir = tempfile::tempdir().unwrap();
        let t = tracer(dir.path(), Values::default());
        assert!(!request(&t, "m"), "tracing is off by default");
        let parse = |entries: &[(&str, Option<&[&str]>)], sep| {
            Update::parse(
                entries
                    .iter()
                    .map(|(k, v)| (*k, v.map(|v| v.iter().map(|s| s.to_string()).collect()))),
                sep,
            )
            .unwrap()
        };
        let on = parse(
            &[
                ("trace_level", Some(&["TIMESTAMPS"])),
                ("trace_rate", Some(&["1"])),
            ],
            "",
        );
        let m = t.update(Some("m"), &on).unwrap();
        assert_eq!(m[0].1, ["TIMESTAMPS"]);
        assert!(request(&t, "m"));
        assert!(!request(&t, "other"), "only m is traced");
        assert_eq!(get(&t.settings(None), "trace_level"), "OFF");

        // The model follows a global value it does not override.
        t.update(None, &parse(&[("trace_count", Some(&["100"]))], ""))
            .unwrap();
        assert_eq!(get(&t.settings(Some("m")), "trace_count"), "100");
        assert_eq!(get(&t.settings(Some("m")), "trace_rate"), "1");

        // Clearing every override returns the model to the global setting.
        let clear = parse(&[("trace_level", None), ("trace_rate", None)], "");
        t.update(Some("m"), &clear).unwrap();
        assert!(!request(&t, "m"));
        assert_eq!(get(&t.settings(Some("m")), "trace_level"), "OFF");
    }

    #[test]
    fn an_invalid_update_changes_nothing_and_a_spent_count_stays_spent() {
        let dir = tempfile::tempdir().unwrap();
        let no_file = Tracer::off();
        let on = Update {
            level: Some(Some(TIMESTAMPS)),
            ..Default::default()
        };
        let e = no_file.update(None, &on).unwrap_err();
        assert_eq!(
            e.message,
            "Attempting to set invalid trace setting :trace file name is not given"
        );
        assert_eq!(get(&no_file.settings(None), "trace_level"), "OFF");

        let t = tracer(dir.path(), Values::default());
        let counted = Update {
            level: Some(Some(TIMESTAMPS)),
            rate: Some(Some(1)),
            count: Some(Some(1)),
            ..Default::default()
        };
        t.update(None, &counted).unwrap();
        assert!(request(&t, "m"));
        assert!(!request(&t, "m"));
        let rate = Update {
            rate: Some(Some(2)),
            ..Default::default()
        };
        assert_eq!(
            t.update(None, &rate).unwrap_err().message,
            "Attempting to set invalid trace setting :"
        );
        let recount = Update {
            count: Some(Some(5)),
            ..rate
        };
        assert_eq!(get(&t.update(None, &recount).unwrap(), "trace_count"), "5");
    }

    #[test]
    fn a_traceparent_forces_a_sample_only_in_opentelemetry_mode() {
        let dir = tempfile::tempdir().unwrap();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let t = tracer(
            dir.path(),
            Values {
                level: TIMESTAMPS,
                rate: 1000,
                ..Default::default()
            },
        );
        assert!(
            t.sample("m", Some(parent)).is_none(),
            "triton mode ignores it"
        );
        let otel = Tracer::new(TraceConfig {
            mode: Mode::OpenTelemetry,
            values: Values {
                level: TIMESTAMPS,
                rate: 0,
                ..Default::default()
            },
            otel: otel::OtelConfig {
                url: "http://127.0.0.1:9/v1/traces".into(),
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        assert!(
            otel.sample("m", None).is_none(),
            "rate 0 samples nothing by itself"
        );
        assert!(otel.sample("m", Some(parent)).is_some());
        let keys: Vec<String> = otel.settings(None).into_iter().map(|(k, _)| k).collect();
        assert!(!keys.contains(&"trace_file".to_string()));
        otel.shutdown();
    }
}
