//! The `wasm` backend: models implemented by WebAssembly components of the
//! `tern:plugin` world (`1/model.wasm`). One component instance and store
//! per model instance (state persists across calls), a deadline per call
//! (`execution_timeout_ms`, default 10000) and a memory cap
//! (`max_memory_bytes`, default 256 MiB) from the model's `parameters`.
//! WASI grants nothing but the version folder, read-only, at `/model`: no
//! network, no environment, no other files. A trap, deadline or memory-cap
//! hit fails that batch's requests with a message naming the model and
//! what happened, counts in the backend's [`PluginTelemetry`], and the instance is
//! re-instantiated; a plugin's malformed answer fails its requests only.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use wasmtime::Store;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::host::{error_from_wit, request_to_wit, HostState, ResponseShape, Running};
use crate::stdio::LogStream;
use crate::tern::plugin::types as wit;
use crate::{cache, ticks, Plugin, PluginCounters, PluginPre, PluginTelemetry, Runtime, Ticking};
use tern_core::backend::{
    model_file, numeric_parameter, Backend, BackendSettings, DeviceKind, ExecTiming, Instance,
    InstanceSpec, LoadContext, Model, ModelFiles,
};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::router::ModelRouter;
use tern_core::{InferRequest, InferResponse, Tensor};

/// Where the version folder appears inside the sandbox.
pub const GUEST_MODEL_DIR: &str = "/model";
/// A plugin's deadline per call unless `execution_timeout_ms` sets one.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_MAX_MEMORY: usize = 256 << 20;

/// The `wasm` backend; its plugins count into its telemetry.
#[derive(Default)]
pub struct WasmBackend {
    telemetry: Arc<PluginTelemetry>,
}

impl WasmBackend {
    /// A backend counting into `telemetry`.
    pub fn new(telemetry: Arc<PluginTelemetry>) -> Self {
        WasmBackend { telemetry }
    }

    /// What the plugins of this backend counted.
    pub fn telemetry(&self) -> &Arc<PluginTelemetry> {
        &self.telemetry
    }
}

impl Backend for WasmBackend {
    fn name(&self) -> &'static str {
        "wasm"
    }

    fn platform(&self) -> &'static str {
        ""
    }

    fn default_filename(&self) -> Option<&'static str> {
        Some("model.wasm")
    }

    fn auto_complete(
        &self,
        _: &ModelFiles,
        cfg: &mut ModelConfig,
        _: &BackendSettings,
    ) -> Result<()> {
        if cfg.input.is_empty() || cfg.output.is_empty() {
            return Err(Error::invalid_arg(format!(
                "model '{}': a wasm plugin's config.pbtxt must declare its inputs and outputs",
                cfg.name
            )));
        }
        Ok(())
    }

    fn load(&self, ctx: &LoadContext) -> Result<Arc<dyn Model>> {
        Ok(loaded(WasmModel::load(ctx, &self.telemetry)?))
    }
}

/// Sandbox settings of one model.
#[derive(Debug, Clone, Copy)]
struct Sandbox {
    timeout: Duration,
    max_memory: usize,
    metric_caps: crate::metrics::Caps,
}

impl Sandbox {
    fn from_config(cfg: &ModelConfig, default_timeout: Duration) -> Result<Sandbox> {
        let timeout = numeric_parameter::<u64>(cfg, "execution_timeout_ms")?
            .unwrap_or(default_timeout.as_millis() as u64);
        let max_memory =
            numeric_parameter::<usize>(cfg, "max_memory_bytes")?.unwrap_or(DEFAULT_MAX_MEMORY);
        if timeout == 0 || max_memory < (1 << 16) {
            return Err(Error::invalid_arg(format!(
                "model '{}': execution_timeout_ms must be > 0 and max_memory_bytes >= 65536",
                cfg.name
            )));
        }
        let defaults = crate::metrics::Caps::default();
        let metric_caps = crate::metrics::Caps {
            families: numeric_parameter::<usize>(cfg, "max_metric_families")?
                .unwrap_or(defaults.families),
            series: numeric_parameter::<usize>(cfg, "max_metric_series")?
                .unwrap_or(defaults.series),
        };
        Ok(Sandbox {
            timeout: Duration::from_millis(timeout),
            max_memory,
            metric_caps,
        })
    }
}

/// One loaded version of a plugin model.
pub struct WasmModel {
    runtime: Arc<Runtime>,
    /// Held so that models loading the same component share it (see `cache::load`).
    _component: cache::SharedComponent,
    pre: PluginPre<HostState>,
    name: String,
    version: i64,
    config: Arc<ModelConfig>,
    config_json: String,
    version_dir: PathBuf,
    sandbox: Sandbox,
    models: Weak<dyn ModelRouter>,
    counters: Arc<PluginCounters>,
    telemetry: Arc<PluginTelemetry>,
    shape: Arc<ResponseShape>,
    decoupled: bool,
}

impl WasmModel {
    fn load(ctx: &LoadContext, telemetry: &Arc<PluginTelemetry>) -> Result<WasmModel> {
        let path = model_file(ctx.config, ctx.version_dir, "model.wasm")?;
        // Through the model's agents (verified, decrypted); the compiled
        // code of an encrypted plugin is never written to the cache.
        let bytes = ctx
            .gate
            .read(&path)
            .map_err(|e| e.for_model(&ctx.config.name))?;
        let cacheable = !ctx.gate.sealed();
        Self::load_component(ctx, telemetry, &path, &bytes, cacheable, DEFAULT_TIMEOUT)
    }

    /// Loads the model with the component `bytes` read from `path` (its own
    /// `model.wasm`, or the Python runner), with `default_timeout` unless the
    /// config sets `execution_timeout_ms`; `cacheable`: whether its compiled
    /// code may be written to the compile cache.
    pub(crate) fn load_component(
        ctx: &LoadContext,
        telemetry: &Arc<PluginTelemetry>,
        path: &std::path::Path,
        bytes: &[u8],
        cacheable: bool,
        default_timeout: Duration,
    ) -> Result<WasmModel> {
        let cfg = ctx.config;
        let sandbox = Sandbox::from_config(cfg, default_timeout)?;
        let runtime = crate::runtime()?;
        let path = path.to_path_buf();
        // The folder is the plugin's WASI file system: no named pipes in it.
        tern_core::files::check_tree(ctx.version_dir, &format!("model '{}'", cfg.name))?;
        let started = Instant::now();
        let (component, source) = cache::load(
            &runtime,
            &path,
            bytes,
            ctx.settings
                .wasm_cache_dir
                .as_deref()
                .filter(|_| cacheable)
                .map(|path| cache::Folder {
                    path,
                    max_bytes: ctx.settings.wasm_cache_max_bytes,
                }),
            || {
                ctx.progress.set(format!(
                    "version {}: compiling the plugin (cached after the first load)",
                    ctx.version
                ))
            },
        )
        .map_err(|e| e.context(format!("model '{}'", cfg.name)))?;
        telemetry.count_component(source);
        tracing::info!(model = %cfg.name, version = ctx.version, "component ready in {:?} ({:?})", started.elapsed(), source);
        let mut linker = wasmtime::component::Linker::<HostState>::new(&runtime.engine);
        let link = |e: wasmtime::Error| {
            Error::internal(format!(
                "model '{}': cannot link the plugin: {e:#}",
                cfg.name
            ))
        };
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(link)?;
        crate::blocking::add_to_linker(&mut linker).map_err(link)?;
        Plugin::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s)
            .map_err(link)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(PluginPre::new)
            .map_err(|e| {
                Error::invalid_arg(format!(
                    "model '{}': '{}' is not a tern:plugin component this server can run: {e:#}",
                    cfg.name,
                    path.display()
                ))
            })?;
        Ok(WasmModel {
            runtime,
            _component: component,
            pre,
            name: cfg.name.clone(),
            version: ctx.version,
            config: Arc::new(cfg.clone()),
            config_json: tern_core::config::json::to_json(cfg).to_string(),
            version_dir: ctx.version_dir.to_path_buf(),
            sandbox,
            models: ctx.models.clone(),
            counters: telemetry.counters(&cfg.name),
            telemetry: telemetry.clone(),
            shape: Arc::new(ResponseShape {
                model: cfg.name.clone(),
                version: ctx.version,
                config: Arc::new(cfg.clone()),
            }),
            decoupled: cfg
                .model_transaction_policy
                .as_ref()
                .is_some_and(|p| p.decoupled),
        })
    }

    /// A fresh store and component instance, initialised.
    fn instantiate(&self, spec: &InstanceSpec) -> Result<(Store<HostState>, Plugin)> {
        let (mut store, plugin) = self.fresh_instance(spec)?;
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::internal(format!(
                "model '{}' instance '{}': {what}: {e}",
                self.name, spec.name
            ))
        };
        let (kind, device) = match spec.device {
            DeviceKind::Cpu => (wit::InstanceKind::Cpu, 0),
            DeviceKind::Gpu(i) => (wit::InstanceKind::Gpu, i),
        };
        let ctx = wit::ModelContext {
            model_name: self.name.clone(),
            model_version: self.version,
            config_json: self.config_json.clone(),
            instance_name: spec.name.clone(),
            instance_kind: kind,
            device_id: device,
            repository_path: GUEST_MODEL_DIR.into(),
        };
        store.data_mut().deadline = Some(Instant::now() + self.sandbox.timeout);
        store.set_epoch_deadline(ticks(self.sandbox.timeout));
        let _ticking = Ticking::start();
        match plugin.tern_plugin_model().call_initialize(&mut store, &ctx) {
            Ok(Ok(())) => Ok((store, plugin)),
            Ok(Err(e)) => Err(Error::new(
                error_from_wit(e.clone()).code,
                format!(
                    "model '{}' instance '{}': initialize failed: {}",
                    self.name, spec.name, e.message
                ),
            )),
            Err(e) => Err(fail(
                "initialize trapped",
                &describe(&store, &e, self.sandbox),
            )),
        }
    }

    /// Runs the Python runner's `auto_complete_config` request on a fresh
    /// instance (never initialised), within the model's deadline but at most
    /// `longest`, and returns the completed config's JSON.
    pub(crate) fn auto_complete_config(
        &self,
        request: wit::Request,
        longest: Duration,
    ) -> Result<String> {
        let spec = InstanceSpec {
            name: format!("{}_auto_complete", self.name),
            device: DeviceKind::Cpu,
        };
        let (mut store, plugin) = self.fresh_instance(&spec)?;
        let fail = |e: String| {
            Error::internal(format!(
                "model '{}': auto_complete_config failed: {e}",
                self.name
            ))
        };
        let sandbox = Sandbox {
            timeout: self.sandbox.timeout.min(longest),
            ..self.sandbox
        };
        store.data_mut().deadline = Some(Instant::now() + sandbox.timeout);
        store.set_epoch_deadline(ticks(sandbox.timeout));
        let ticking = Ticking::start();
        let answer = plugin
            .tern_plugin_model()
            .call_execute(&mut store, std::slice::from_ref(&request));
        drop(ticking);
        let answer = answer.map_err(|e| fail(describe(&store, &e, sandbox)))?;
        match answer.into_iter().next() {
            Some(Ok(response)) => response
                .parameters
                .into_iter()
                .find_map(|p| match (p.key.as_str(), p.value) {
                    ("config", wit::ParameterValue::String(json)) => Some(json),
                    _ => None,
                })
                .ok_or_else(|| fail("the runner returned no config".into())),
            Some(Err(e)) => Err(Error::new(
                error_from_wit(e.clone()).code,
                format!(
                    "model '{}': auto_complete_config failed: {}",
                    self.name, e.message
                ),
            )),
            None => Err(fail("the runner returned no answer".into())),
        }
    }

    /// A fresh store and component instance, not initialised.
    fn fresh_instance(&self, spec: &InstanceSpec) -> Result<(Store<HostState>, Plugin)> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::internal(format!(
                "model '{}' instance '{}': {what}: {e}",
                self.name, spec.name
            ))
        };
        let mut wasi = WasiCtxBuilder::new();
        // stdout and stderr go to the server's log, tagged with the model.
        let limit = Arc::new(std::sync::Mutex::new(crate::host::LogLimit::default()));
        wasi.stdout(LogStream::new(
            &self.name,
            "stdout",
            limit.clone(),
            self.counters.clone(),
        ))
        .stderr(LogStream::new(
            &self.name,
            "stderr",
            limit,
            self.counters.clone(),
        ));
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .preopened_dir(&self.version_dir, GUEST_MODEL_DIR, FsPerms::ReadOnly)
            .map_err(|e| fail("cannot open the model folder", &e))?
            // Also where Triton's `args["model_repository"]` and `model_version` lead.
            .preopened_dir(
                &self.version_dir,
                format!("/models/{}/{}", self.name, self.version),
                FsPerms::ReadOnly,
            )
            .map_err(|e| fail("cannot open the model folder", &e))?;
        let state = HostState::new(
            wasi.build(),
            &self.name,
            self.sandbox.max_memory,
            self.models.clone(),
            self.telemetry.clone(),
        );
        let mut state = state;
        state.shape = Some(self.shape.clone());
        state.metric_caps = self.sandbox.metric_caps;
        state.deadline = Some(Instant::now() + self.sandbox.timeout);
        let mut store = Store::new(&self.runtime.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(ticks(self.sandbox.timeout));
        store.epoch_deadline_trap();
        let _ticking = Ticking::start();
        let plugin = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| fail("instantiation failed", &describe(&store, &e, self.sandbox)))?;
        Ok((store, plugin))
    }
}

/// Whether the plugin was stopped by its execution deadline: in WebAssembly
/// (the epoch interrupt) or in a blocking WASI call.
fn timed_out(e: &wasmtime::Error) -> bool {
    e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt)
        || e.is::<crate::blocking::DeadlineExceeded>()
}

/// Names what stopped a plugin: the memory cap, the deadline, or the trap itself.
fn describe(store: &Store<HostState>, e: &wasmtime::Error, sandbox: Sandbox) -> String {
    if store.data().limits.hit {
        format!(
            "hit its memory cap of {} bytes (max_memory_bytes)",
            sandbox.max_memory
        )
    } else if timed_out(e) {
        format!(
            "exceeded its execution deadline of {} ms (execution_timeout_ms)",
            sandbox.timeout.as_millis()
        )
    } else {
        match &store.data().panic {
            Some(panic) => format!("trapped: the plugin {panic}"),
            None => format!("trapped: {}", e.root_cause()),
        }
    }
}

/// The [`Model`] the scheduler holds; instances share the [`WasmModel`].
struct Loaded(Arc<WasmModel>);

/// A loaded version as the backend traits hand it out.
pub(crate) fn loaded(model: WasmModel) -> Arc<dyn Model> {
    Arc::new(Loaded(Arc::new(model)))
}

impl Model for Loaded {
    fn supports_decoupled(&self) -> bool {
        true
    }

    fn create_instance(&self, spec: &InstanceSpec) -> Result<Box<dyn Instance>> {
        let (store, plugin) = self.0.instantiate(spec)?;
        let mut instance = WasmInstance {
            model: self.0.clone(),
            spec: spec.clone(),
            live: Some((store, plugin)),
            reported_memory: 0,
        };
        instance.report_memory();
        Ok(Box::new(instance))
    }
}

/// One plugin instance; `live` is `None` after a failed re-instantiation
/// (retried on the next batch).
struct WasmInstance {
    model: Arc<WasmModel>,
    spec: InstanceSpec,
    live: Option<(Store<HostState>, Plugin)>,
    /// This instance's share of the model's `memory_bytes` gauge.
    reported_memory: u64,
}

impl WasmInstance {
    /// Brings the model's linear-memory gauge up to date with this instance.
    fn report_memory(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = self
            .live
            .as_ref()
            .map_or(0, |(store, _)| store.data().limits.linear as u64);
        let gauge = &self.model.counters.memory_bytes;
        if now >= self.reported_memory {
            gauge.fetch_add(now - self.reported_memory, Relaxed);
        } else {
            gauge.fetch_sub(self.reported_memory - now, Relaxed);
        }
        self.reported_memory = now;
    }

    /// Replaces the instance with a fresh one; `why` (a failure) ends the
    /// streams of response senders the old one still holds.
    fn restart(&mut self, why: Option<Error>) {
        if let (Some(e), Some((store, _))) = (why, self.live.as_ref()) {
            let _ = store.data().ending.set(e);
        }
        self.live = None;
        match self.model.instantiate(&self.spec) {
            Ok(live) => {
                self.model
                    .counters
                    .restarts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.live = Some(live);
            }
            Err(e) => {
                tracing::error!(model = %self.model.name, instance = %self.spec.name, "cannot restart the plugin instance: {e}")
            }
        }
    }

    fn fail_all(&self, n: usize, e: Error) -> Vec<Result<InferResponse>> {
        vec![Err(e); n]
    }
}

impl Instance for WasmInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let out = self.run(batch, timing);
        self.report_memory();
        out
    }
}

/// What a plugin's `execute` returns: a result per request.
type Answers = Vec<std::result::Result<wit::Response, wit::Error>>;

impl WasmInstance {
    /// One `execute` call into the plugin, with its failures handled.
    fn run(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let m = self.model.clone();
        if self.live.is_none() {
            self.restart(None);
        }
        let Some((store, plugin)) = self.live.as_mut() else {
            return self.fail_all(
                batch.len(),
                Error::unavailable(format!(
                    "model '{}' instance '{}' could not be restarted after a failure (see the server log)",
                    m.name, self.spec.name
                )),
            );
        };
        let result = call_execute(&m, store, plugin, batch, timing);
        // Whether the call returned an answer list the batch can take
        // (else every request fails, below).
        let returned =
            matches!(&result, Ok(r) if r.len() == batch.len() || (m.decoupled && r.is_empty()));
        let hit = store.data().limits.hit;
        let open = |r: &Running| r.responder.as_ref().is_none_or(|s| !s.0.is_closed());
        // Requests the plugin released to run again: none after a failure or
        // at the memory cap (the instance restarts), nor one whose stream
        // has ended (its final flag sent, its client gone).
        let again: Vec<bool> = store
            .data()
            .running
            .iter()
            .map(|r| returned && !hit && r.rescheduled && open(r))
            .collect();
        // Released at the memory cap: they fail with it, below.
        let dropped: Vec<bool> = store
            .data()
            .running
            .iter()
            .map(|r| returned && hit && r.rescheduled && open(r))
            .collect();
        // Senders dropped during the call: their requests' streams end now,
        // unless the request runs again or fails (after a failure of the
        // call, the request's error ends its stream).
        for (i, r) in store.data().running.iter().enumerate() {
            if returned && r.close_after && !again[i] && !dropped[i] && open(r) {
                if let Some(sink) = r.responder.as_ref() {
                    let _ = sink.0.send(None, true);
                }
            }
        }
        let mut extra = take_set_outputs(store);
        let mut out = self.answers(&m, batch, result, &mut extra, &again);
        for (i, _) in again.iter().enumerate().filter(|(_, &a)| a) {
            // No answer now, whatever `execute` returned for it: the
            // scheduler queues it again.
            out[i] = Ok(InferResponse {
                rescheduled: true,
                ..placeholder(&m, &batch[i])
            });
        }
        for (i, _) in dropped.iter().enumerate().filter(|(_, &d)| d) {
            out[i] = Err(self.memory_cap_error(&m));
        }
        out
    }

    /// What a request gets when the instance hit its memory cap.
    fn memory_cap_error(&self, m: &WasmModel) -> Error {
        Error::internal(format!(
            "model '{}' instance '{}' hit its memory cap of {} bytes (max_memory_bytes); the instance was restarted",
            m.name, self.spec.name, m.sandbox.max_memory
        ))
    }

    /// The batch's answers from what `execute` returned (or how it failed);
    /// `again` marks requests released to run again (a decoupled model's are
    /// not ended).
    fn answers(
        &mut self,
        m: &WasmModel,
        batch: &[InferRequest],
        result: wasmtime::Result<Answers>,
        extra: &mut dyn FnMut(usize) -> Vec<Tensor>,
        again: &[bool],
    ) -> Vec<Result<InferResponse>> {
        let Some((store, _)) = self.live.as_mut() else {
            return self.fail_all(batch.len(), Error::internal("the plugin instance is gone"));
        };
        if m.decoupled {
            if let Ok(results) = &result {
                if results.is_empty() || results.len() == batch.len() {
                    let hit = store.data().limits.hit;
                    let out = decoupled_results(m, batch, result.unwrap_or_default(), extra, again);
                    if hit {
                        // Its answers stand; its memory is at the cap for good.
                        m.counters.record(true, false);
                        tracing::error!(model = %m.name, instance = %self.spec.name, "plugin hit its memory cap; restarting the instance");
                        self.restart(Some(self.memory_cap_error(m)));
                    }
                    return out;
                }
            }
        }
        match result {
            Ok(results) if results.len() == batch.len() && store.data().limits.hit => {
                self.answered_at_memory_cap(m, batch, results, extra)
            }
            Ok(_) if store.data().limits.hit => {
                // Whatever it returned, its memory is at the cap for good.
                let e = self.memory_cap_error(m);
                m.counters.record(true, false);
                tracing::error!(model = %m.name, instance = %self.spec.name, "plugin hit its memory cap; restarting the instance");
                self.restart(Some(e.clone()));
                self.fail_all(batch.len(), e)
            }
            Ok(results) if results.len() == batch.len() => responses(m, batch, results, extra),
            Ok(results) => self.fail_all(
                batch.len(),
                Error::internal(format!(
                    "model '{}': the plugin returned {} responses for {} requests",
                    m.name,
                    results.len(),
                    batch.len()
                )),
            ),
            Err(e) => {
                let what = describe(store, &e, m.sandbox);
                m.counters.record(store.data().limits.hit, timed_out(&e));
                self.restart_after_trap(m, batch.len(), &what, &e)
            }
        }
    }

    /// The plugin survived a refused memory.grow (Python's MemoryError, a
    /// NULL from malloc): its answers stand, failures say why, and the
    /// instance restarts because its memory is now at the cap for good.
    fn answered_at_memory_cap(
        &mut self,
        m: &WasmModel,
        batch: &[InferRequest],
        results: Answers,
        extra: &mut dyn FnMut(usize) -> Vec<Tensor>,
    ) -> Vec<Result<InferResponse>> {
        let cap = self.memory_cap_error(m);
        let why = &cap.message;
        let results = results
            .into_iter()
            .map(|r| {
                r.map_err(|mut e| {
                    e.message = format!("{why}: {}", e.message);
                    e
                })
            })
            .collect();
        let out = responses(m, batch, results, extra);
        m.counters.record(true, false);
        tracing::error!(model = %m.name, instance = %self.spec.name, "plugin hit its memory cap; restarting the instance");
        self.restart(Some(cap));
        out
    }

    /// The plugin trapped, ran out of time or hit its memory cap (`what`
    /// says which): the instance restarts and the whole batch fails.
    fn restart_after_trap(
        &mut self,
        m: &WasmModel,
        n: usize,
        what: &str,
        e: &wasmtime::Error,
    ) -> Vec<Result<InferResponse>> {
        tracing::error!(model = %m.name, instance = %self.spec.name, "plugin {what}; restarting the instance");
        tracing::debug!(model = %m.name, "plugin failure details: {e:?}");
        let e = Error::internal(format!(
            "model '{}' instance '{}' {what}; the instance was restarted",
            m.name, self.spec.name
        ));
        self.restart(Some(e.clone()));
        self.fail_all(n, e)
    }
}

/// The models a batch's requests passed through to get here (ensembles,
/// BLS callers), each once, in order of first appearance, then this model:
/// what the plugin's own BLS calls are checked against (cycles, depth).
fn call_chain(batch: &[InferRequest], model: &str) -> Vec<String> {
    let mut chain: Vec<String> = Vec::new();
    for r in batch {
        for c in &r.callers {
            if !chain.contains(c) {
                chain.push(c.clone());
            }
        }
    }
    chain.push(model.to_string());
    chain
}

/// Readies a store for one `execute` call: the batch's requests as the
/// running ones, the call chain, no panic or memory-cap hit recorded, and a
/// fresh deadline.
fn begin_call(m: &WasmModel, store: &mut Store<HostState>, batch: &[InferRequest]) {
    let state = store.data_mut();
    state.running = batch
        .iter()
        .map(|r| Running {
            id: r.id.clone(),
            batch_size: request_batch_size(m, r),
            responder: r.responder.clone(),
            inputs: r.inputs.clone(),
            outputs: Vec::new(),
            rescheduled: false,
            close_after: false,
        })
        .collect();
    state.chain = call_chain(batch, &m.name);
    state.trace = batch.iter().find_map(|r| r.trace.clone());
    state.panic = None;
    state.deadline = Some(Instant::now() + m.sandbox.timeout);
    state.limits.hit = false;
    store.set_epoch_deadline(ticks(m.sandbox.timeout));
}

/// Calls the plugin's `execute` on `batch`, with the store readied, the
/// epoch ticking, and `timing` marked on either side of the call.
fn call_execute(
    m: &WasmModel,
    store: &mut Store<HostState>,
    plugin: &Plugin,
    batch: &[InferRequest],
    timing: &mut ExecTiming,
) -> wasmtime::Result<Answers> {
    let requests: Vec<wit::Request> = batch.iter().map(request_to_wit).collect();
    begin_call(m, store, batch);
    timing.input_done = Some(Instant::now());
    let ticking = Ticking::start();
    let result = plugin
        .tern_plugin_model()
        .call_execute(&mut *store, &requests);
    drop(ticking);
    timing.infer_done = Some(Instant::now());
    // The batch's trace ends with its request, not with the next call.
    store.data_mut().trace = None;
    result
}

/// Takes the outputs the plugin made with `ops.set-output` during the call;
/// the returned function hands out request `i`'s (once; empty after).
fn take_set_outputs(store: &mut Store<HostState>) -> impl FnMut(usize) -> Vec<Tensor> {
    let mut extra: Vec<Vec<Tensor>> = std::mem::take(&mut store.data_mut().running)
        .into_iter()
        .map(|r| r.outputs)
        .collect();
    move |i: usize| extra.get_mut(i).map(std::mem::take).unwrap_or_default()
}

/// The responses to a batch the plugin answered request for request.
fn responses(
    m: &WasmModel,
    batch: &[InferRequest],
    results: Answers,
    extra: &mut dyn FnMut(usize) -> Vec<Tensor>,
) -> Vec<Result<InferResponse>> {
    results
        .into_iter()
        .zip(batch)
        .enumerate()
        .map(|(i, (r, req))| response(m, req, r, extra(i)))
        .collect()
}

/// A request's batch size: its first input's first dim when the model
/// batches, else 1.
fn request_batch_size(m: &WasmModel, req: &InferRequest) -> usize {
    match req.inputs.first().and_then(|t| t.shape.first()) {
        Some(&b) if m.config.max_batch_size > 0 => b as usize,
        _ => 1,
    }
}

fn response(
    m: &WasmModel,
    req: &InferRequest,
    r: std::result::Result<wit::Response, wit::Error>,
    extra: Vec<Tensor>,
) -> Result<InferResponse> {
    let r = r.map_err(error_from_wit)?;
    m.shape
        .response(&req.id, request_batch_size(m, req), r, extra)
}

/// What a decoupled plugin's `execute` returned: a result it gave for a
/// request whose stream is still open is sent as that request's last
/// message; the scheduler gets a placeholder per request (or the error, for
/// the statistics), since the responses travel through the senders.
fn decoupled_results(
    m: &WasmModel,
    batch: &[InferRequest],
    results: Answers,
    extra: &mut dyn FnMut(usize) -> Vec<Tensor>,
    again: &[bool],
) -> Vec<Result<InferResponse>> {
    let mut results = results.into_iter();
    batch
        .iter()
        .enumerate()
        .map(|(i, req)| {
            let given = results.next().map(|r| response(m, req, r, extra(i)));
            if again.get(i).copied().unwrap_or(false) {
                // Released to run again: its stream stays open.
                return Ok(placeholder(m, req));
            }
            let open = req.responder.as_ref().filter(|r| !r.0.is_closed());
            match (given, open) {
                (Some(r), Some(sink)) => {
                    let failed = r.as_ref().err().cloned();
                    let _ = sink.0.send(Some(r), true);
                    match failed {
                        Some(e) => Err(e),
                        None => Ok(placeholder(m, req)),
                    }
                }
                (Some(Err(e)), None) => Err(e),
                _ => Ok(placeholder(m, req)),
            }
        })
        .collect()
}

fn placeholder(m: &WasmModel, req: &InferRequest) -> InferResponse {
    InferResponse {
        model_name: m.name.clone(),
        model_version: m.version,
        id: req.id.clone(),
        ..Default::default()
    }
}

impl Drop for WasmInstance {
    fn drop(&mut self) {
        if let Some((store, plugin)) = self.live.as_mut() {
            store.data_mut().deadline = Some(Instant::now() + self.model.sandbox.timeout);
            store.set_epoch_deadline(ticks(self.model.sandbox.timeout));
            let _ticking = Ticking::start();
            if let Err(e) = plugin.tern_plugin_model().call_finalize(&mut *store) {
                tracing::warn!(model = %self.model.name, "plugin finalize failed: {}", e.root_cause());
            }
        }
        self.live = None;
        self.report_memory();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::pb::ModelParameter;

    fn cfg(params: &[(&str, &str)]) -> ModelConfig {
        let mut c = ModelConfig {
            name: "p".into(),
            ..Default::default()
        };
        for (k, v) in params {
            c.parameters.insert(
                k.to_string(),
                ModelParameter {
                    string_value: v.to_string(),
                },
            );
        }
        c
    }

    #[test]
    fn sandbox_defaults_and_overrides() {
        let s = Sandbox::from_config(&cfg(&[]), DEFAULT_TIMEOUT).unwrap();
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.max_memory, DEFAULT_MAX_MEMORY);
        let s = Sandbox::from_config(
            &cfg(&[
                ("execution_timeout_ms", "250"),
                ("max_memory_bytes", "1048576"),
            ]),
            DEFAULT_TIMEOUT,
        )
        .unwrap();
        assert_eq!(
            (s.timeout, s.max_memory),
            (Duration::from_millis(250), 1 << 20)
        );
        for bad in [
            ("execution_timeout_ms", "0"),
            ("execution_timeout_ms", "soon"),
            ("max_memory_bytes", "10"),
        ] {
            let e = Sandbox::from_config(&cfg(&[bad]), DEFAULT_TIMEOUT).unwrap_err();
            assert!(e.message.contains("model 'p'"), "{e}");
        }
    }

    #[test]
    fn plugins_must_declare_their_io() {
        let e = WasmBackend::default()
            .auto_complete(
                &ModelFiles {
                    model_dir: "/m".into(),
                    version_dir: None,
                    gate: tern_core::backend::plain_files(),
                },
                &mut cfg(&[]),
                &BackendSettings::default(),
            )
            .unwrap_err();
        assert!(e.message.contains("must declare its inputs and outputs"));
    }

    #[test]
    fn call_chain_lists_each_caller_once_then_the_model() {
        let from = |callers: &[&str]| InferRequest {
            callers: callers.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        };
        let batch = [from(&["ens", "bls"]), from(&[]), from(&["bls", "other"])];
        assert_eq!(call_chain(&batch, "p"), ["ens", "bls", "other", "p"]);
        assert_eq!(call_chain(&[], "p"), ["p"]);
    }
}
