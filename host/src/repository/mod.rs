//! Model repositories: scanning `--model-repository` folders, reading and
//! auto-completing configs, selecting versions by `version_policy`, loading
//! every model (in parallel) and tracking per-version state for the
//! repository index. A model that fails to load is reported and never stops
//! the others.

mod agents;
pub mod control;
pub mod decrypt;
pub mod demand;
mod entry;
mod fingerprint;
mod graph;
mod load;
pub mod manifest;
pub mod remote;
mod versions;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

pub use versions::{list_versions, select_versions};

use crate::backends::Registry;
use crate::scheduler::ensemble;
use crate::scheduler::ModelHandle;
use entry::ModelEntry;
use tern_core::backend::{BackendSettings, ModelFiles};
use tern_core::config::defaults::normalize;
use tern_core::config::is_ensemble;
use tern_core::config::support::{check_supported, not_acted_on};
use tern_core::config::validate::validate;
use tern_core::config::{parse_pbtxt, ModelConfig};
use tern_core::error::{Error, Result};
use tern_core::router::ModelRouter;

/// What the model-control lock guards: the models some change is loading or
/// unloading right now, with the lock released.
#[derive(Debug, Default)]
pub struct Control {
    busy: std::collections::BTreeSet<String>,
    /// Models loaded by name (startup or the load API), as opposed to those
    /// loaded because an ensemble calls them: `unload_dependents` unloads only
    /// the latter, as Triton does.
    explicit: std::collections::BTreeSet<String>,
    /// Ensembles unloaded because a model they call was: each loads again,
    /// from where it was loaded, once everything it calls serves again.
    parked: BTreeMap<String, control::Parked>,
}

/// The model-control lock, held.
pub type ControlGuard<'a> = std::sync::MutexGuard<'a, Control>;

/// How models are found and loaded.
#[derive(Debug, Clone, Default)]
pub struct RepositoryOptions {
    /// Repository roots, in the order given.
    pub roots: Vec<PathBuf>,
    /// Fill missing config fields from the model files.
    pub auto_complete: bool,
    /// Backend settings.
    pub backend: BackendSettings,
    /// Number of usable GPUs.
    pub gpu_count: usize,
    /// How many models load at once.
    pub load_threads: usize,
    /// How long one model's load may take before it is abandoned (`None`: no limit).
    pub load_timeout: Option<std::time::Duration>,
    /// `--model-config-name`: read `<model>/configs/<name>.pbtxt` when it exists.
    pub config_name: Option<String>,
    /// Keep recent latencies of every model for the Prometheus summaries.
    pub summary_latencies: bool,
    /// `--model-load-retry-count`: further attempts at a version that fails to load.
    pub load_retries: u32,
    /// Loading on demand, idle unloading and the memory budget (explicit mode).
    pub on_demand: demand::OnDemandOptions,
    /// `--model-trust-key`: when any, only models whose signed manifest
    /// verifies with one of them load.
    pub trust_keys: Vec<ed25519_dalek::VerifyingKey>,
    /// The remote repositories among the roots (each root's cache folder is in `roots`).
    pub remotes: Vec<Arc<remote::Remote>>,
}

/// Lifecycle state of a model version, as the repository index reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Loading.
    Loading,
    /// Serving.
    Ready,
    /// Failed to load (see the reason).
    Unavailable,
    /// Being unloaded.
    Unloading,
}

impl State {
    /// Triton's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Loading => "LOADING",
            State::Ready => "READY",
            State::Unavailable => "UNAVAILABLE",
            State::Unloading => "UNLOADING",
        }
    }
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexEntry {
    /// Model name.
    pub name: String,
    /// Version, when the row is about one version.
    pub version: Option<i64>,
    /// State.
    pub state: State,
    /// Why the model is not ready (empty when ready).
    pub reason: String,
}

/// A model's config, backend (`None` for ensembles), versions and labels, ready to load.
struct Prepared {
    config: Arc<ModelConfig>,
    backend: Option<Arc<dyn tern_core::backend::Backend>>,
    versions: Vec<i64>,
    labels: HashMap<String, Vec<String>>,
    /// How the backend reads the model's files (through its agents).
    gate: Arc<dyn tern_core::backend::FileGate>,
}

/// All models known to the server.
pub struct Repository {
    me: std::sync::Weak<Repository>,
    /// Where the models' own calls (ensemble steps, BLS) go: the server's
    /// inference facade, in the module above this one.
    router: std::sync::Weak<dyn ModelRouter>,
    models: RwLock<BTreeMap<String, ModelEntry>>,
    registry: Registry,
    options: RepositoryOptions,
    /// Serialises the planning of changes to the model set (load, unload,
    /// poll) and names the models being changed; the slow part of a change
    /// (loading, draining) runs with the lock released, so changes of other
    /// models go on meanwhile (see `control.rs`).
    control: Mutex<Control>,
    /// Signalled when models stop being changed.
    control_done: std::sync::Condvar,
    /// Failed loads per model since start (`tern_model_load_failures_total`).
    load_failures: Mutex<BTreeMap<String, u64>>,
    /// Set by [`Repository::shutdown`]: nothing loads after it.
    closed: std::sync::atomic::AtomicBool,
    /// Loading on demand: last uses, load costs, pins, pending loads.
    demand: demand::Demand,
}

impl Repository {
    /// Creates an empty repository whose models call other models through
    /// `router` (`tern_core::router::unrouted()` for none).
    pub fn new(options: RepositoryOptions, router: std::sync::Weak<dyn ModelRouter>) -> Arc<Self> {
        Arc::new_cyclic(|me| Repository {
            me: me.clone(),
            router,
            models: RwLock::new(BTreeMap::new()),
            registry: Registry::default(),
            options,
            control: Mutex::new(Control::default()),
            control_done: std::sync::Condvar::new(),
            load_failures: Mutex::new(BTreeMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
            demand: demand::Demand::new(),
        })
    }

    /// The metric families the backends keep themselves (plugin failures,
    /// the `.cwasm` cache, plugin-declared metrics).
    pub fn backend_families(&self) -> Vec<Arc<dyn tern_core::prometheus::Families>> {
        let mut families = self.registry.families();
        if !self.options.remotes.is_empty() {
            families.push(Arc::new(remote::RemoteFamilies(
                self.options.remotes.clone(),
            )));
        }
        families
    }

    /// Syncs what a load of `name` needs from the remote repositories: the
    /// model and, for an ensemble, the models its steps call (and theirs).
    /// Nothing when a local repository folder has the model.
    pub fn sync_for_load(&self, name: &str) -> Result<()> {
        let remote_root = |r: &PathBuf| self.options.remotes.iter().any(|m| m.root() == *r);
        let local = self.options.roots.iter().filter(|r| !remote_root(r));
        if self.options.remotes.is_empty() || local.into_iter().any(|r| r.join(name).is_dir()) {
            return Ok(());
        }
        let (mut pending, mut seen, mut result) = (vec![name.to_string()], Vec::new(), Ok(()));
        while let Some(model) = pending.pop() {
            if seen.contains(&model) || seen.len() >= 256 {
                continue;
            }
            let synced = self.sync_remotes(Some(&model));
            if seen.is_empty() {
                result = synced;
            }
            for remote in &self.options.remotes {
                let config = remote.root().join(&model).join("config.pbtxt");
                let Some(cfg) = std::fs::read_to_string(&config)
                    .ok()
                    .and_then(|t| parse_pbtxt(&t).ok())
                else {
                    continue;
                };
                pending.extend(crate::scheduler::ensemble::composing_models(&cfg));
            }
            seen.push(model);
        }
        result
    }

    /// Stops the remote repositories' syncs (shutdown): a download stops at
    /// its next chunk.
    pub fn cancel_syncs(&self) {
        for remote in &self.options.remotes {
            remote.cancel();
        }
    }

    /// Brings the caches of the remote repositories up to date (every
    /// model, or `only` one); blocks. A failure is logged and returned; the
    /// caches keep the snapshots they had, which the repository serves.
    pub fn sync_remotes(&self, only: Option<&str>) -> Result<()> {
        if self.options.remotes.is_empty() {
            return Ok(());
        }
        // Snapshots loaded versions were read from are never collected.
        let in_use: std::collections::HashSet<PathBuf> = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it")
            .values()
            .filter_map(|e| e.origin.as_ref().map(|o| o.dir.clone()))
            .collect();
        let mut first = None;
        for remote in &self.options.remotes {
            if let Err(e) = remote.sync(only, &in_use) {
                tracing::warn!("{e}; the repository's cached models (if any) stay as they are");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The options the repository was created with.
    pub fn options(&self) -> &RepositoryOptions {
        &self.options
    }

    /// Records a failed load: a serving model keeps serving, any other
    /// shows the failure in the index.
    fn record_failure(&self, name: &str, e: &Error) {
        self.count_load_failure(name);
        let mut models = self
            .models
            .write()
            .expect("models lock poisoned: nothing panics while holding it");
        let entry = models.entry(name.to_string()).or_default();
        if entry.serving() {
            tracing::error!(
                model = name,
                "reload failed, the loaded versions keep serving: {e}"
            );
        } else {
            tracing::error!(model = name, "failed to load: {e}");
        }
        entry.failed_load(&e.message);
    }

    fn count_load_failure(&self, name: &str) {
        *self
            .load_failures
            .lock()
            .expect("load failures lock poisoned: nothing panics while holding it")
            .entry(name.to_string())
            .or_default() += 1;
    }

    /// Failed loads per model since the server started.
    pub fn load_failures(&self) -> BTreeMap<String, u64> {
        self.load_failures
            .lock()
            .expect("load failures lock poisoned: nothing panics while holding it")
            .clone()
    }

    /// Load durations in seconds of every ready version: (model, version, seconds).
    pub fn load_durations(&self) -> Vec<(String, i64, f64)> {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        models
            .iter()
            .flat_map(|(n, e)| e.load_secs().map(move |(v, s)| (n.clone(), v, s)))
            .collect()
    }

    /// With `--model-trust-key`: the model folder's verified manifest (a
    /// load that replaces the config is refused). `None` without trust keys.
    fn check_signed(
        &self,
        name: &str,
        dir: &Path,
        config_replaced: bool,
    ) -> Result<Option<manifest::Manifest>> {
        if self.options.trust_keys.is_empty() {
            return Ok(None);
        }
        if config_replaced {
            return Err(Error::invalid_arg(
                "this server loads only signed models (--model-trust-key): a load request may \
                 not replace the signed config with a 'config' parameter",
            )
            .for_model(name));
        }
        manifest::verify(dir, name, &self.options.trust_keys)
            .map(Some)
            .map_err(|e| e.for_model(name))
    }

    /// The model's config: the load request's `config` parameter, else
    /// `config.pbtxt` (or `--model-config-name`'s), read once and `check`ed,
    /// else an empty one for auto-complete.
    fn read_config(
        &self,
        name: &str,
        dir: &Path,
        config_json: Option<&str>,
        check: &dyn Fn(&Path, &[u8]) -> Result<()>,
    ) -> Result<ModelConfig> {
        let config_path = self
            .options
            .config_name
            .as_ref()
            .map(|n| dir.join("configs").join(format!("{n}.pbtxt")))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| dir.join("config.pbtxt"));
        let cfg = if let Some(json) = config_json {
            let cfg = tern_core::config::json::from_json(json)
                .map_err(|e| e.context(format!("model '{name}': the 'config' parameter")))?;
            if !cfg.name.is_empty() && cfg.name != name {
                return Err(Error::invalid_arg(format!(
                    "the 'config' parameter names model '{}'",
                    cfg.name
                ))
                .for_model(name));
            }
            cfg
        } else if config_path.exists() {
            let raw = std::fs::read(&config_path).map_err(|e| {
                Error::invalid_arg(format!("cannot read '{}': {e}", config_path.display()))
                    .for_model(name)
            })?;
            check(&config_path, &raw)?;
            let text = String::from_utf8(raw).map_err(|_| {
                Error::invalid_arg(format!("'{}' is not UTF-8 text", config_path.display()))
                    .for_model(name)
            })?;
            parse_pbtxt(&text)
                .map_err(|e| e.context(format!("model '{name}' ({})", config_path.display())))?
        } else if self.options.auto_complete {
            ModelConfig::default()
        } else {
            return Err(Error::invalid_arg(format!(
                "'{}' does not exist and auto-complete is disabled",
                config_path.display()
            ))
            .for_model(name));
        };
        Ok(cfg)
    }

    /// Reads, completes, normalises and validates a model's config; picks its backend, versions and labels.
    fn prepare(&self, name: &str, dir: &Path, config_json: Option<&str>) -> Result<Prepared> {
        // A signed model is checked whole before any of its files is read.
        let signed = self.check_signed(name, dir, config_json.is_some())?;
        // What is read below is checked again as it is read (it may have
        // changed since): the config, the labels, the version folders.
        let signed_files = signed.as_ref().map(|m| m.files.clone());
        let check = |path: &Path, bytes: &[u8]| {
            manifest::check_read(signed_files.as_ref(), dir, path, bytes)
                .map_err(|e| e.for_model(name))
        };
        let mut cfg = self.read_config(name, dir, config_json, &check)?;
        if cfg.name.is_empty() {
            cfg.name = name.to_string();
        }
        // Before any backend reads a model file (auto-complete does).
        let gate = agents::run(&cfg, dir, signed)?;
        let mut available = list_versions(dir);
        if let Some(files) = &signed_files {
            // A version folder added since the check is not one.
            available.retain(|v| files.keys().any(|f| f.starts_with(&format!("{v}/"))));
        }
        normalize(&mut cfg, self.options.gpu_count);
        let versions = select_versions(&cfg, &available);
        let latest_dir = available.last().map(|v| dir.join(v.to_string()));
        let backend = if is_ensemble(&cfg) {
            ensemble::check_config(&cfg)?;
            None
        } else {
            Some(self.registry.resolve(&cfg, latest_dir.as_deref())?)
        };
        if let Some(backend) = backend.as_ref().filter(|_| self.options.auto_complete) {
            let files = ModelFiles {
                model_dir: dir.to_path_buf(),
                version_dir: versions.last().map(|v| dir.join(v.to_string())),
                gate: gate.clone(),
            };
            backend.auto_complete(&files, &mut cfg, &self.options.backend)?;
            normalize(&mut cfg, self.options.gpu_count);
        } else if let Some(backend) = backend
            .as_ref()
            .filter(|_| cfg.backend.is_empty() && cfg.platform.is_empty())
        {
            cfg.backend = backend.name().to_string();
        }
        // As Triton shows it: the file the backend loads when the config names none.
        if let Some(file) = backend.as_ref().and_then(|b| b.default_filename()) {
            if cfg.default_model_filename.is_empty() {
                cfg.default_model_filename = file.to_string();
            }
        }
        validate(&cfg, name)?;
        check_supported(&cfg)?;
        let ignored = not_acted_on(&cfg);
        if !ignored.is_empty() {
            tracing::warn!(
                model = name,
                "config fields accepted but not acted on by this version of Tern: {}",
                ignored.join(", ")
            );
        }
        let mut labels = HashMap::new();
        for output in cfg.output.iter().filter(|o| !o.label_filename.is_empty()) {
            let what = format!(
                "model '{name}' output '{}': label_filename '{}'",
                output.name, output.label_filename
            );
            let raw = tern_core::files::read_inside(dir, dir, &output.label_filename, &what)?;
            check(&dir.join(&output.label_filename), &raw)?;
            let text = String::from_utf8(raw)
                .map_err(|_| Error::invalid_arg(format!("{what}: the file is not UTF-8 text")))?;
            labels.insert(
                output.name.clone(),
                text.lines().map(str::to_string).collect(),
            );
        }
        Ok(Prepared {
            config: Arc::new(cfg),
            backend,
            versions,
            labels,
            gate,
        })
    }

    /// The handle serving `name` at `version` (`None` = highest ready version).
    pub fn get(&self, name: &str, version: Option<i64>) -> Result<Arc<ModelHandle>> {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let entry = models.get(name).ok_or_else(|| unknown(name, None))?;
        entry
            .handle(version)
            .cloned()
            .ok_or_else(|| match entry.not_ready_reason(name, version) {
                Some(r) => tern_core::messages::not_ready(name, version, &r),
                None => unknown(name, version),
            })
    }

    /// Config of a model (of any state that got far enough to have one).
    pub fn config(&self, name: &str, version: Option<i64>) -> Result<Arc<ModelConfig>> {
        if version.is_some() {
            return self.get(name, version).map(|h| h.config.clone());
        }
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let entry = models.get(name).ok_or_else(|| unknown(name, None))?;
        if let Some(h) = entry.handle(None) {
            return Ok(h.config.clone());
        }
        entry.config.clone().ok_or_else(|| {
            self.get(name, version)
                .err()
                .unwrap_or_else(|| unknown(name, version))
        })
    }

    /// Ready handles: every model (`name` = None), one model, or one version.
    pub fn handles(
        &self,
        name: Option<&str>,
        version: Option<i64>,
    ) -> Result<Vec<Arc<ModelHandle>>> {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        match name {
            None => Ok(models.values().flat_map(|e| e.handles().cloned()).collect()),
            Some(n) => {
                let entry = models.get(n).ok_or_else(|| unknown(n, version))?;
                match version {
                    None => Ok(entry.handles().cloned().collect()),
                    Some(v) => entry
                        .handle(Some(v))
                        .cloned()
                        .map(|h| vec![h])
                        .ok_or_else(|| unknown(n, version)),
                }
            }
        }
    }

    /// Ready versions of a model, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<i64> {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        models
            .get(name)
            .map(|e| e.ready_versions())
            .unwrap_or_default()
    }

    /// The repository index (every model, every version, with state and reason).
    pub fn index(&self) -> Vec<IndexEntry> {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let mut rows: Vec<IndexEntry> = models.iter().flat_map(|(name, e)| e.rows(name)).collect();
        // A remote repository's download in progress, or its failed update.
        for remote in &self.options.remotes {
            for row in &mut rows {
                if let Some(status) = remote.status(&row.name) {
                    row.reason = if row.reason.is_empty() {
                        status
                    } else {
                        format!("{}; {status}", row.reason)
                    };
                }
            }
        }
        rows
    }

    /// The index the repository API answers with: [`Repository::index`] plus
    /// the models in the repository folders that are not loaded (explicit
    /// mode), as `UNAVAILABLE` / `not loaded`, so clients can see what they may load.
    pub fn index_with_unloaded(&self) -> Vec<IndexEntry> {
        let mut rows = self.index();
        let known: std::collections::HashSet<String> =
            rows.iter().map(|r| r.name.clone()).collect();
        match self.scan() {
            Err(e) => tracing::warn!("repository index: cannot list the model folders: {e}"),
            Ok(found) => {
                for name in found.into_keys().filter(|n| !known.contains(n)) {
                    rows.push(IndexEntry {
                        name,
                        version: None,
                        state: State::Unavailable,
                        reason: "not loaded".into(),
                    });
                }
            }
        }
        // Models a remote repository is downloading for the first time.
        for remote in &self.options.remotes {
            for name in remote.downloading() {
                if !rows.iter().any(|r| r.name == name) {
                    let reason = remote.status(&name).unwrap_or_default();
                    rows.push(IndexEntry {
                        name,
                        version: None,
                        state: State::Unavailable,
                        reason,
                    });
                }
            }
        }
        // Models a remote repository has and the cache does not yet (explicit mode).
        for remote in &self.options.remotes {
            for name in remote.listed() {
                if !rows.iter().any(|r| r.name == name) {
                    rows.push(IndexEntry {
                        name,
                        version: None,
                        state: State::Unavailable,
                        reason: "not loaded".into(),
                    });
                }
            }
        }
        rows.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
        rows
    }

    /// Whether every model the server knows (loaded or failed, not unloaded) has all its versions ready.
    pub fn all_ready(&self) -> bool {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        models.values().all(entry::ModelEntry::settled)
    }

    /// Stops every model: queued requests finish, instance threads are joined.
    pub fn shutdown(&self) {
        let _control = self
            .control
            .lock()
            .expect("control lock poisoned: nothing panics while holding it");
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let models = std::mem::take(
            &mut *self
                .models
                .write()
                .expect("models lock poisoned: nothing panics while holding it"),
        );
        for entry in models.values() {
            for handle in entry.handles() {
                handle.shutdown();
            }
        }
    }
}

impl Repository {
    /// Takes the model-control lock for a change that loads models; refused
    /// once shutdown has begun, so no model loads while the server stops.
    fn control_for_load(&self) -> Result<ControlGuard<'_>> {
        let guard = self
            .control
            .lock()
            .expect("control lock poisoned: nothing panics while holding it");
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::unavailable(
                "the server is shutting down: models are no longer loaded",
            ));
        }
        Ok(guard)
    }
}

fn unknown(name: &str, version: Option<i64>) -> Error {
    tern_core::messages::unknown_model(name, version)
}
