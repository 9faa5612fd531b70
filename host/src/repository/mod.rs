//! Model repositories: scanning `--model-repository` folders, reading and
//! auto-completing configs, selecting versions by `version_policy`, loading
//! every model (in parallel) and tracking per-version state for the
//! repository index. A model that fails to load is reported and never stops
//! the others.

mod versions;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

pub use versions::{list_versions, select_versions};

use crate::backends::{BackendSettings, LoadContext, ModelFiles, Registry};
use crate::config::validate::{check_supported, normalize, not_acted_on, validate};
use crate::config::{parse_pbtxt, ModelConfig};
use crate::error::{Error, Result};
use crate::scheduler::ensemble::{self, is_ensemble, Ensemble};
use crate::scheduler::ModelHandle;

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
    backend: Option<Arc<dyn crate::backends::Backend>>,
    versions: Vec<i64>,
    labels: HashMap<String, Vec<String>>,
}

#[derive(Default)]
struct ModelEntry {
    config: Option<Arc<ModelConfig>>,
    ready: BTreeMap<i64, Arc<ModelHandle>>,
    index: Vec<IndexEntry>,
}

/// All models known to the server.
pub struct Repository {
    me: std::sync::Weak<Repository>,
    models: RwLock<BTreeMap<String, ModelEntry>>,
    registry: Registry,
    options: RepositoryOptions,
}

impl Repository {
    /// Creates an empty repository.
    pub fn new(options: RepositoryOptions) -> Arc<Self> {
        Arc::new_cyclic(|me| Repository {
            me: me.clone(),
            models: RwLock::new(BTreeMap::new()),
            registry: Registry::default(),
            options,
        })
    }

    /// Scans every root and loads every model; returns the load errors (one per failed model or version).
    pub fn load_all(&self) -> Result<Vec<Error>> {
        let mut found: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for root in &self.options.roots {
            let entries = std::fs::read_dir(root).map_err(|e| {
                Error::invalid_arg(format!(
                    "failed to open model repository '{}': {e}",
                    root.display()
                ))
            })?;
            for entry in entries.flatten() {
                let path = entry.path();
                let Some(name) = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .map(str::to_string)
                else {
                    continue;
                };
                if path.is_dir() && !name.starts_with('.') {
                    found.entry(name).or_default().push(path);
                }
            }
        }
        let mut jobs: Vec<(String, Result<PathBuf>)> = Vec::new();
        for (name, dirs) in found {
            if dirs.len() > 1 {
                let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                jobs.push((
                    name.clone(),
                    Err(Error::invalid_arg(format!(
                        "model '{name}' appears in more than one repository: {}",
                        list.join(", ")
                    ))),
                ));
            } else {
                jobs.push((name, Ok(dirs.into_iter().next().expect("one dir"))));
            }
        }
        let threads = self.options.load_threads.max(1);
        let errors = Mutex::new(Vec::new());
        let queue = Mutex::new(jobs);
        let ensembles = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let Some((name, dir)) = queue.lock().expect("queue").pop() else {
                        break;
                    };
                    let prepared = dir.and_then(|dir| Ok((self.prepare(&name, &dir)?, dir)));
                    let errs = match prepared {
                        Ok((p, dir)) if p.backend.is_none() => {
                            ensembles.lock().expect("ensembles").push((name, dir, p));
                            continue;
                        }
                        Ok((p, dir)) => self.load_versions(&name, &dir, p),
                        Err(e) => {
                            self.record_failure(&name, &e);
                            vec![e]
                        }
                    };
                    errors.lock().expect("errors").extend(errs);
                });
            }
        });
        let mut errors = errors.into_inner().expect("errors");
        errors.extend(self.load_ensembles(ensembles.into_inner().expect("ensembles")));
        Ok(errors)
    }

    /// Loads ensembles after the models they call, ensembles of ensembles in
    /// dependency order; ensembles that call each other in a cycle fail.
    fn load_ensembles(&self, mut waiting: Vec<(String, PathBuf, Prepared)>) -> Vec<Error> {
        let mut errors = Vec::new();
        loop {
            let names: HashSet<String> = waiting.iter().map(|(n, _, _)| n.clone()).collect();
            let (ready, blocked): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(_, _, p)| {
                !crate::scheduler::ensemble::composing_models(&p.config)
                    .iter()
                    .any(|m| names.contains(m))
            });
            waiting = blocked;
            if ready.is_empty() {
                break;
            }
            for (name, dir, p) in ready {
                errors.extend(self.load_versions(&name, &dir, p));
            }
        }
        for (name, _, _) in waiting {
            let e = Error::invalid_arg(format!(
                "ensemble '{name}': its steps call ensembles that call it back (a cycle of ensembles)"
            ));
            self.record_failure(&name, &e);
            errors.push(e);
        }
        errors
    }

    fn record_failure(&self, name: &str, e: &Error) {
        tracing::error!(model = name, "failed to load: {e}");
        let mut models = self.models.write().expect("models lock");
        let entry = models.entry(name.to_string()).or_default();
        entry.index = vec![IndexEntry {
            name: name.to_string(),
            version: None,
            state: State::Unavailable,
            reason: e.message.clone(),
        }];
    }

    /// Loads every selected version of one prepared model; returns its errors.
    fn load_versions(&self, name: &str, dir: &Path, prepared: Prepared) -> Vec<Error> {
        let Prepared {
            config,
            backend,
            versions,
            labels,
        } = prepared;
        let mut errors = Vec::new();
        let mut entry = ModelEntry {
            config: Some(config.clone()),
            ..Default::default()
        };
        for version in versions {
            let version_dir = dir.join(version.to_string());
            let result = if !version_dir.is_dir() {
                Err(Error::not_found(format!(
                    "model '{name}': version {version} is not present in '{}'",
                    dir.display()
                )))
            } else if let Some(backend) = &backend {
                let ctx = LoadContext {
                    config: &config,
                    version,
                    version_dir: &version_dir,
                    settings: &self.options.backend,
                    models: self.me.clone(),
                };
                backend.load(&ctx).and_then(|model| {
                    ModelHandle::start(
                        config.clone(),
                        version,
                        model,
                        labels.clone(),
                        self.options.gpu_count,
                        dir,
                    )
                })
            } else {
                Ensemble::build(
                    &config,
                    |m, v| self.get(m, v).map(|h| h.config.clone()),
                    self.me.clone(),
                )
                .and_then(|e| ModelHandle::ensemble(config.clone(), version, e, labels.clone()))
            };
            match result {
                Ok(handle) => {
                    tracing::info!(
                        model = name,
                        version,
                        backend = backend.as_ref().map_or("ensemble", |b| b.name()),
                        "model loaded"
                    );
                    entry.ready.insert(version, Arc::new(handle));
                    entry.index.push(IndexEntry {
                        name: name.into(),
                        version: Some(version),
                        state: State::Ready,
                        reason: String::new(),
                    });
                }
                Err(e) => {
                    tracing::error!(model = name, version, "failed to load version: {e}");
                    entry.index.push(IndexEntry {
                        name: name.into(),
                        version: Some(version),
                        state: State::Unavailable,
                        reason: e.message.clone(),
                    });
                    errors.push(e);
                }
            }
        }
        if entry.index.is_empty() {
            let e = Error::not_found(format!(
                "model '{name}': no version folder matches the version policy in '{}'",
                dir.display()
            ));
            tracing::error!(model = name, "{e}");
            entry.index.push(IndexEntry {
                name: name.into(),
                version: None,
                state: State::Unavailable,
                reason: e.message.clone(),
            });
            errors.push(e);
        }
        self.models
            .write()
            .expect("models lock")
            .insert(name.to_string(), entry);
        errors
    }

    /// Reads, completes, normalises and validates a model's config; picks its backend, versions and labels.
    fn prepare(&self, name: &str, dir: &Path) -> Result<Prepared> {
        let config_path = dir.join("config.pbtxt");
        let mut cfg = if config_path.exists() {
            let text = std::fs::read_to_string(&config_path).map_err(|e| {
                Error::invalid_arg(format!(
                    "model '{name}': cannot read '{}': {e}",
                    config_path.display()
                ))
            })?;
            parse_pbtxt(&text)
                .map_err(|e| e.context(format!("model '{name}' ({})", config_path.display())))?
        } else if self.options.auto_complete {
            ModelConfig::default()
        } else {
            return Err(Error::invalid_arg(format!(
                "model '{name}': '{}' does not exist and auto-complete is disabled",
                config_path.display()
            )));
        };
        if cfg.name.is_empty() {
            cfg.name = name.to_string();
        }
        let available = list_versions(dir);
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
            };
            backend.auto_complete(&files, &mut cfg, &self.options.backend)?;
            normalize(&mut cfg, self.options.gpu_count);
        } else if let Some(backend) = backend
            .as_ref()
            .filter(|_| cfg.backend.is_empty() && cfg.platform.is_empty())
        {
            cfg.backend = backend.name().to_string();
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
            let path = dir.join(&output.label_filename);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                Error::invalid_arg(format!(
                    "model '{name}' output '{}': cannot read label file '{}': {e}",
                    output.name,
                    path.display()
                ))
            })?;
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
        })
    }

    /// The handle serving `name` at `version` (`None` = highest ready version).
    pub fn get(&self, name: &str, version: Option<i64>) -> Result<Arc<ModelHandle>> {
        let models = self.models.read().expect("models lock");
        let entry = models.get(name).ok_or_else(|| unknown(name, version))?;
        let handle = match version {
            Some(v) => entry.ready.get(&v).cloned(),
            None => entry.ready.values().next_back().cloned(),
        };
        handle.ok_or_else(|| {
            let reason = entry
                .index
                .iter()
                .find(|i| version.is_none() || i.version == version)
                .filter(|i| i.state != State::Ready)
                .map(|i| i.reason.clone());
            match reason {
                Some(r) => Error::unavailable(format!(
                    "model '{name}'{} is not ready: {r}",
                    version_suffix(version)
                )),
                None => unknown(name, version),
            }
        })
    }

    /// Config of a model (of any state that got far enough to have one).
    pub fn config(&self, name: &str, version: Option<i64>) -> Result<Arc<ModelConfig>> {
        if version.is_some() {
            return self.get(name, version).map(|h| h.config.clone());
        }
        let models = self.models.read().expect("models lock");
        let entry = models.get(name).ok_or_else(|| unknown(name, version))?;
        if let Some(h) = entry.ready.values().next_back() {
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
        let models = self.models.read().expect("models lock");
        match name {
            None => Ok(models
                .values()
                .flat_map(|e| e.ready.values().cloned())
                .collect()),
            Some(n) => {
                let entry = models.get(n).ok_or_else(|| unknown(n, version))?;
                match version {
                    None => Ok(entry.ready.values().cloned().collect()),
                    Some(v) => entry
                        .ready
                        .get(&v)
                        .cloned()
                        .map(|h| vec![h])
                        .ok_or_else(|| unknown(n, version)),
                }
            }
        }
    }

    /// Ready versions of a model, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<i64> {
        let models = self.models.read().expect("models lock");
        models
            .get(name)
            .map(|e| e.ready.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The repository index (every model, every version, with state and reason).
    pub fn index(&self) -> Vec<IndexEntry> {
        let models = self.models.read().expect("models lock");
        models
            .values()
            .flat_map(|e| e.index.iter().cloned())
            .collect()
    }

    /// Whether every model in the repository has all its versions ready.
    pub fn all_ready(&self) -> bool {
        self.index().iter().all(|e| e.state == State::Ready)
    }

    /// Stops every model: queued requests finish, instance threads are joined.
    pub fn shutdown(&self) {
        let models = std::mem::take(&mut *self.models.write().expect("models lock"));
        for entry in models.values() {
            for handle in entry.ready.values() {
                handle.shutdown();
            }
        }
    }
}

use std::sync::Mutex;

fn version_suffix(version: Option<i64>) -> String {
    version.map(|v| format!(" version {v}")).unwrap_or_default()
}

fn unknown(name: &str, version: Option<i64>) -> Error {
    Error::not_found(format!(
        "Request for unknown model: '{name}'{} is not found",
        version_suffix(version)
    ))
}
