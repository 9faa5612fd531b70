//! `misbehave`: a test plugin that does what its `MODE` input (STRING) says,
//! so the tests can prove the sandbox contains every kind of misbehaviour:
//! `ok` (echo), `loop` (never returns), `sleep` (sleeps 20 s in WASI), `memory` (allocates until the cap),
//! `panic`, `wrong_count` (two responses for one request), `bad_shape`,
//! `bad_tensor` (data size does not match the shape), `bad_dtype`, `read_model_file`
//! (reads `data.txt` from its own folder: allowed), `read_outside` (tries
//! `/etc/passwd`), `read:<path>` (reads `<path>` relative to its own
//! folder: `..`, links out of it and the like must be denied), `env` (reads
//! environment variables), `error` (a clean
//! INVALID_ARG), `count` (how many times this instance executed),
//! `log_flood` (5,000 log lines of 8 KiB each), `metric_flood` (a gauge
//! set with 5,000 label values, and 100 more families; answers how many
//! of each the server accepted). The config parameter `init_sleep_ms` makes
//! `initialize` sleep that long (a slow load).

use tern_plugin::{
    export_model, log, Error, LogLevel, Model, ModelContext, Request, Response, Tensor,
};

struct Misbehave {
    dir: String,
    calls: u64,
}

fn text(name: &str, s: &str) -> Tensor {
    Tensor::from_strings(name, vec![1], &[s])
}

impl Misbehave {
    fn one(&mut self, r: &Request) -> Result<Response, Error> {
        let mode = r
            .input("MODE")?
            .texts()?
            .first()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let out = match mode.as_str() {
            "ok" => "ok".to_string(),
            "count" => self.calls.to_string(),
            "loop" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(20));
                "slept".to_string()
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("misbehave: asked to panic"),
            "bad_shape" => {
                let mut t = text("OUTPUT0", "x");
                t.shape = vec![3];
                return Ok(Response::new(vec![t]));
            }
            "bad_tensor" => {
                let t = Tensor::from_strings("OUTPUT0", vec![1], &["x", "y"]);
                return Ok(Response::new(vec![t]));
            }
            "bad_dtype" => {
                return Ok(Response::new(vec![Tensor::from_vec(
                    "OUTPUT0",
                    vec![1],
                    vec![1.0f32],
                )]))
            }
            "read_model_file" => std::fs::read_to_string(format!("{}/data.txt", self.dir))
                .map_err(|e| Error::internal(format!("cannot read data.txt: {e}")))?
                .trim()
                .to_string(),
            "read_outside" => match std::fs::read_to_string("/etc/passwd") {
                Ok(s) => format!("read {} bytes", s.len()),
                Err(e) => format!("denied: {e}"),
            },
            path if path.starts_with("read:") => {
                match std::fs::read_to_string(format!("{}/{}", self.dir, &path[5..])) {
                    Ok(s) => format!("read {} bytes", s.len()),
                    Err(e) => format!("denied: {e}"),
                }
            }
            "env" => format!("{} variables", std::env::vars().count()),
            "error" => return Err(Error::invalid_arg("misbehave: asked for an error")),
            "metric_flood" => {
                use tern_plugin::metrics::{Family, MetricKind};
                let g = Family::new("misbehave_series", "Label sets.", MetricKind::Gauge, &[])?;
                let series = (0..5_000)
                    .filter(|i| g.set(&[("i", &i.to_string())], 1.0).is_ok())
                    .count();
                let families = (0..100)
                    .filter(|i| {
                        Family::new(&format!("misbehave_f{i}"), "", MetricKind::Counter, &[])
                            .is_ok()
                    })
                    .count();
                format!("{series} series, {families} families")
            }
            "log_flood" => {
                let line = "x".repeat(8 << 10);
                for _ in 0..5_000 {
                    log(LogLevel::Info, &line);
                }
                "flooded".to_string()
            }
            other => return Err(Error::invalid_arg(format!("unknown MODE '{other}'"))),
        };
        Ok(Response::new(vec![text("OUTPUT0", &out)]))
    }
}

impl Model for Misbehave {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        // A slow load, for the tests of model control: `parameters { key:
        // "init_sleep_ms" value: { string_value: "..." } }`.
        if let Some(ms) = ctx.parameter("init_sleep_ms").and_then(|v| v.parse().ok()) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        Ok(Misbehave {
            dir: ctx.repository_path,
            calls: 0,
        })
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        self.calls += 1;
        let wrong = requests.iter().any(|r| {
            r.input("MODE")
                .ok()
                .and_then(|t| t.texts().ok())
                .is_some_and(|m| m.first() == Some(&"wrong_count"))
        });
        if wrong {
            let ok = || Ok(Response::new(vec![text("OUTPUT0", "extra")]));
            return (0..requests.len() + 1).map(|_| ok()).collect();
        }
        requests.iter().map(|r| self.one(r)).collect()
    }
}

export_model!(Misbehave);
