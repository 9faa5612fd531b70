//! Changing the set of served models while serving: startup loading, the
//! model control modes (none / poll / explicit), API loads (with config
//! overrides and files delivered over the API), unloads, and repository
//! polling. Every change is load-then-swap: the new versions load and warm
//! up beside the serving ones and replace them in one step only when they
//! are ready; a failed reload keeps the old versions serving. Replaced or
//! unloaded versions finish their in-flight requests before their instances
//! stop.
//!
//! Changes are planned under one lock, but the slow part of each (loading a
//! model's versions, draining an unloaded one) runs with the lock released
//! and the model's name claimed ([`Control`]): a load or unload of one model
//! waits only for changes of the same models, never for a slow load of
//! another, and a load that does not finish within `--model-load-timeout-secs`
//! is abandoned (see `load.rs`).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fingerprint::fingerprint;
use super::graph::DependencyGraph;
use super::load::{Found, LoadJob};
use super::{ControlGuard, Repository};
use crate::scheduler::ModelHandle;
use tern_core::error::{Code, Error, Result};
use tern_core::request::ControlValue;

/// `--model-control-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlMode {
    /// Load everything at startup; no changes afterwards.
    #[default]
    None,
    /// Load everything at startup and follow repository changes.
    Poll,
    /// Load only `--load-model` models; the API loads and unloads.
    Explicit,
}

impl ControlMode {
    /// Parses Triton's spelling (case-insensitive).
    pub fn parse(s: &str) -> Result<ControlMode> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(ControlMode::None),
            "poll" => Ok(ControlMode::Poll),
            "explicit" => Ok(ControlMode::Explicit),
            other => Err(Error::invalid_arg(format!(
                "--model-control-mode must be none, poll or explicit, got '{other}'"
            ))),
        }
    }
}

/// What an API load brings besides the model name.
#[derive(Debug, Default, Clone)]
pub struct LoadOverride {
    /// `parameters.config`: a JSON model config used instead of the file.
    pub config: Option<String>,
    /// `file:<path>` parameters: model files, relative to the model folder.
    pub files: Vec<(String, Vec<u8>)>,
}

impl LoadOverride {
    /// Reads the parameters of a load request: `config` (a string holding
    /// the JSON model config) and `file:<path>` (a model file's contents).
    pub fn from_parameters(
        params: impl IntoIterator<Item = (String, ControlValue)>,
    ) -> Result<LoadOverride> {
        let mut o = LoadOverride::default();
        for (key, value) in params {
            match (key.as_str(), value) {
                ("config", ControlValue::String(text)) => o.config = Some(text),
                ("config", _) => {
                    return Err(Error::invalid_arg(
                        "load parameter 'config' must be a string holding the JSON model config",
                    ))
                }
                (k, ControlValue::Bytes(bytes)) if k.starts_with("file:") => {
                    o.files.push((k["file:".len()..].to_string(), bytes))
                }
                (k, _) if k.starts_with("file:") => {
                    return Err(Error::invalid_arg(format!(
                        "load parameter '{k}' must be the file's contents \
                         (base64 in an HTTP request, a bytes_param in gRPC)"
                    )))
                }
                (k, _) => {
                    return Err(Error::invalid_arg(format!(
                        "unknown load parameter '{k}' (supported: config, file:<path>)"
                    )))
                }
            }
        }
        Ok(o)
    }
}

/// Reads the parameters of an unload request: whether to unload the
/// ensembles that use the model too (`unload_dependents`, a bool).
pub fn unload_dependents(params: impl IntoIterator<Item = (String, ControlValue)>) -> Result<bool> {
    let mut dependents = false;
    for (key, value) in params {
        match (key.as_str(), value) {
            ("unload_dependents", ControlValue::Bool(b)) => dependents = b,
            ("unload_dependents", _) => {
                return Err(Error::invalid_arg(
                    "unload parameter 'unload_dependents' must be a bool",
                ))
            }
            (k, _) => {
                return Err(Error::invalid_arg(format!(
                    "unknown unload parameter '{k}' (supported: unload_dependents)"
                )))
            }
        }
    }
    Ok(dependents)
}

/// How long an unload waits for in-flight requests before stopping the instances anyway.
const UNLOAD_DRAIN: Duration = Duration::from_secs(30);

/// Names claimed by one change; released (and waiters woken) when dropped,
/// also when the change panics.
struct Claim<'a, 'n> {
    repo: &'a Repository,
    names: &'n [String],
}

impl Drop for Claim<'_, '_> {
    fn drop(&mut self) {
        let mut control = self
            .repo
            .control
            .lock()
            .expect("control lock poisoned: nothing panics while holding it");
        for n in self.names {
            control.busy.remove(n);
        }
        self.repo.control_done.notify_all();
    }
}

impl Repository {
    /// Runs `work` on the models `names` with the control lock released:
    /// waits until no other change holds any of them, claims them, releases
    /// the lock for `work`, then takes the lock back.
    pub(super) fn unlocked<'a, R>(
        &'a self,
        mut guard: ControlGuard<'a>,
        names: &[String],
        work: impl FnOnce() -> R,
    ) -> (ControlGuard<'a>, R) {
        while names.iter().any(|n| guard.busy.contains(n)) {
            guard = self
                .control_done
                .wait(guard)
                .expect("control lock poisoned: nothing panics while holding it");
        }
        guard.busy.extend(names.iter().cloned());
        drop(guard);
        let claim = Claim { repo: self, names };
        let result = work();
        drop(claim);
        (
            self.control
                .lock()
                .expect("control lock poisoned: nothing panics while holding it"),
            result,
        )
    }

    /// Scans every root and loads every model; returns the load errors (one per failed model or version).
    pub fn load_all(&self) -> Result<Vec<Error>> {
        self.load_startup(ControlMode::None, &[])
    }

    /// The startup load for a control mode: every model, or in explicit mode
    /// only `load_models` (`*` = every model) and the models their ensembles call.
    pub fn load_startup(&self, mode: ControlMode, load_models: &[String]) -> Result<Vec<Error>> {
        let control = self
            .control
            .lock()
            .expect("control lock poisoned: nothing panics while holding it");
        let found = self.scan()?;
        let wanted: Vec<String> =
            if mode != ControlMode::Explicit || load_models.iter().any(|m| m == "*") {
                found.keys().cloned().collect()
            } else {
                load_models.to_vec()
            };
        let mut jobs = Vec::new();
        let mut errors = Vec::new();
        let mut control = control;
        control.explicit.extend(wanted.iter().cloned());
        if mode == ControlMode::Explicit {
            self.pin(load_models);
        }
        for name in wanted {
            match found.get(&name) {
                Some(dir) => jobs.push(LoadJob::from_folder(&name, dir.clone())),
                None => {
                    let e = not_in_repository(&name);
                    self.record_failure(&name, &e);
                    errors.push(e);
                }
            }
        }
        errors.extend(self.apply(control, jobs, &found).1.into_values());
        Ok(errors)
    }

    /// Model folders in every root: name -> folder, or the reason the name cannot be used.
    pub(super) fn scan(&self) -> Result<Found> {
        let mut found: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for root in &self.options.roots {
            // A remote repository's cache links each model to its snapshot:
            // a load takes the snapshot itself, which a later swap of the
            // link does not change under it.
            let remote = self.options.remotes.iter().any(|r| r.root() == *root);
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
                    let path = if remote {
                        path.canonicalize().unwrap_or(path)
                    } else {
                        path
                    };
                    found.entry(name).or_default().push(path);
                }
            }
        }
        Ok(found
            .into_iter()
            .map(|(name, dirs)| {
                let dir = if dirs.len() > 1 {
                    let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                    Err(Error::invalid_arg(format!(
                        "model '{name}' appears in more than one repository: {}",
                        list.join(", ")
                    )))
                } else {
                    Ok(dirs.into_iter().next().expect("one dir"))
                };
                (name, dir)
            })
            .collect())
    }

    /// `POST /v2/repository/models/{name}/load`: loads or reloads a model
    /// from the repository, or from a config and files given in the request.
    pub fn load_model(&self, name: &str, overrides: LoadOverride) -> Result<()> {
        self.load_model_from(name, overrides)?.map_err(|e| {
            Error::new(
                load_code(&e),
                format!("load failed for model '{name}': {}", e.message),
            )
        })
    }

    /// [`Repository::load_model`], answering the load's own failure (the
    /// inner error, not yet saying which load failed) apart from a refusal
    /// before the load (the outer one, complete).
    pub(super) fn load_model_from(
        &self,
        name: &str,
        overrides: LoadOverride,
    ) -> Result<std::result::Result<(), Error>> {
        check_model_name(name)?;
        // A model of a remote repository is fetched first (outside the
        // lock); when that fails, its cached snapshot loads if there is one.
        let synced = if overrides.files.is_empty() {
            self.sync_for_load(name)
        } else {
            Ok(())
        };
        let control = self.control_for_load()?;
        let found = self.scan()?;
        if let Err(e) = synced {
            // Offline: the cached snapshot loads. A new version that failed
            // its checks fails the load (the loaded version keeps serving).
            if !found.contains_key(name) || e.code != tern_core::error::Code::Unavailable {
                return Err(e);
            }
        }
        let (dir, temp) = if overrides.files.is_empty() {
            match found.get(name) {
                Some(dir) => (dir.clone()?, None),
                None if overrides.config.is_some() => {
                    return Err(Error::invalid_arg(format!(
                        "failed to load '{name}': a config override needs the model folder in the repository, or its files as 'file:' parameters"
                    )))
                }
                None => return Err(not_in_repository(name)),
            }
        } else if overrides.config.is_none() {
            return Err(Error::invalid_arg(format!(
                "failed to load '{name}': model files given as 'file:' parameters need the model config in the 'config' parameter"
            )));
        } else {
            let temp = write_files(name, &overrides.files)?;
            (temp.path().join(name), Some(Arc::new(temp)))
        };
        let job = LoadJob {
            name: name.to_string(),
            dir: Ok(dir),
            config: overrides.config,
            temp,
        };
        let (mut control, mut failed) = self.apply(control, vec![job], &found);
        control.explicit.insert(name.to_string());
        control.parked.remove(name);
        match failed.remove(name) {
            Some(e) => Ok(Err(e)),
            None => {
                self.forget_failure(name);
                self.load_parked(control, &found);
                Ok(Ok(()))
            }
        }
    }

    /// Loads the parked ensembles (unloaded because a model they call was)
    /// whose models all serve again, as Triton brings them back.
    fn load_parked(&self, mut control: ControlGuard<'_>, found: &Found) {
        let ready: Vec<LoadJob> = {
            let models = self
                .models
                .read()
                .expect("models lock poisoned: nothing panics while holding it");
            let serves = |m: &str| models.get(m).is_some_and(|e| e.serving());
            let ready: Vec<String> = control
                .parked
                .iter()
                .filter(|(_, job)| job.calls.iter().all(|c| serves(c)))
                .map(|(n, _)| n.clone())
                .collect();
            ready
                .into_iter()
                .filter_map(|n| control.parked.remove(&n))
                .map(|p| p.job)
                .collect()
        };
        if ready.is_empty() {
            return;
        }
        for job in &ready {
            tracing::info!(model = %job.name, "loading again: the models it calls serve again");
        }
        for (name, e) in self.apply(control, ready, found).1 {
            tracing::error!(model = %name, "loading again after the models it calls came back failed: {e}");
        }
    }

    /// `POST /v2/repository/models/{name}/unload`: stops serving a model, as
    /// Triton does: the ensembles that call it stop too (each loads again
    /// once the model serves again), and with `unload_dependents` so do the
    /// models it calls that were loaded only because it (or another model
    /// going away with it) calls them. In-flight requests finish first; the
    /// instances are stopped when this returns.
    pub fn unload_model(&self, name: &str, unload_dependents: bool) -> Result<()> {
        let mut control = self
            .control
            .lock()
            .expect("control lock poisoned: nothing panics while holding it");
        let names = {
            let models = self
                .models
                .read()
                .expect("models lock poisoned: nothing panics while holding it");
            let graph = DependencyGraph::of(
                models
                    .iter()
                    .filter(|(_, e)| e.serving())
                    .filter_map(|(n, e)| Some((n.as_str(), &**e.config.as_ref()?))),
            );
            let callers = graph.dependents(name);
            for caller in &callers {
                let Some(o) = models.get(caller).and_then(|e| e.origin.as_ref()) else {
                    continue;
                };
                tracing::info!(model = %caller, "unloading: it calls '{name}', which is unloaded");
                let job = LoadJob {
                    name: caller.clone(),
                    dir: Ok(o.dir.clone()),
                    config: o.config.clone(),
                    temp: o.temp.clone(),
                };
                let calls = graph.calls(caller).map(str::to_string).collect();
                control.parked.insert(caller.clone(), Parked { job, calls });
            }
            let mut names = vec![name.to_string()];
            names.extend(callers);
            if unload_dependents {
                add_implicit_composing(&graph, &control.explicit, &mut names);
            }
            names
        };
        control.parked.remove(name);
        control.explicit.remove(name);
        for n in &names {
            control = self.unload_one(control, n, None);
        }
        Ok(())
    }

    /// Unloads one model that no ensemble calls, with `reason` as its index
    /// reason (idleness, the memory budget), but only if `unused` still
    /// holds for it: checked under the models' write lock, in the same
    /// critical section that takes its handles out of service, so no request
    /// can get one between the check and the unload. A model another change
    /// is loading or unloading is left alone (its load may be waiting for the
    /// load this eviction makes room for). Answers whether it unloaded; when
    /// it does, nothing held the model, so nothing in flight is cut short.
    pub(super) fn unload_if_unused(
        &self,
        name: &str,
        reason: &str,
        unused: impl FnOnce(&BTreeMap<String, super::ModelEntry>) -> bool,
    ) -> bool {
        let mut control = self
            .control
            .lock()
            .expect("control lock poisoned: nothing panics while holding it");
        if control.busy.contains(name) {
            return false;
        }
        let handles = {
            let mut models = self
                .models
                .write()
                .expect("models lock poisoned: nothing panics while holding it");
            if !unused(&models) {
                return false;
            }
            match models.get_mut(name) {
                Some(entry) if entry.serving() => entry.begin_unload(),
                _ => return false,
            }
        };
        control.explicit.remove(name);
        let names = [name.to_string()];
        drop(self.unlocked(control, &names, || {
            self.finish_unload(name, handles, Some(reason))
        }));
        true
    }

    /// Unloads one model; its requests drain with the control lock released.
    fn unload_one<'a>(
        &'a self,
        control: ControlGuard<'a>,
        name: &str,
        because: Option<&str>,
    ) -> ControlGuard<'a> {
        let names = [name.to_string()];
        self.unlocked(control, &names, || self.drain_and_unload(name, because))
            .0
    }

    fn drain_and_unload(&self, name: &str, because: Option<&str>) {
        let handles: Vec<Arc<ModelHandle>> = {
            let mut models = self
                .models
                .write()
                .expect("models lock poisoned: nothing panics while holding it");
            let Some(entry) = models.get_mut(name) else {
                return;
            };
            entry.begin_unload()
        };
        self.finish_unload(name, handles, because);
    }

    /// Drains and stops the handles an unload took out of service, then
    /// marks the model unloaded.
    fn finish_unload(&self, name: &str, handles: Vec<Arc<ModelHandle>>, because: Option<&str>) {
        let deadline = Instant::now() + UNLOAD_DRAIN;
        for h in &handles {
            while Arc::strong_count(h) > 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            h.shutdown();
        }
        drop(handles);
        let mut models = self
            .models
            .write()
            .expect("models lock poisoned: nothing panics while holding it");
        if let Some(entry) = models.get_mut(name) {
            entry.finish_unload(because);
        }
        tracing::info!(model = name, "model unloaded");
    }

    /// One poll of the repositories: loads new models, reloads changed ones
    /// (a failed load is retried only once its folder changes again) and
    /// unloads models whose folder is gone. Returns the load errors.
    pub fn poll(&self) -> Result<Vec<Error>> {
        // Remote repositories first, outside the lock (downloads take time);
        // a failed sync leaves their caches as they were (logged).
        let _ = self.sync_remotes(None);
        let mut control = self.control_for_load()?;
        let found = self.scan()?;
        let (changed, gone) = {
            let models = self
                .models
                .read()
                .expect("models lock poisoned: nothing panics while holding it");
            let changed: Vec<LoadJob> = found
                .iter()
                .filter(|(name, dir)| {
                    let Some(entry) = models.get(*name) else {
                        return true;
                    };
                    match (&entry.origin, dir) {
                        (Some(o), Ok(d)) => o.dir != *d || o.fingerprint != fingerprint(d),
                        (None, _) => entry.failed != dir.as_ref().ok().map(|d| fingerprint(d)),
                        (Some(_), Err(_)) => true,
                    }
                })
                .map(|(n, d)| LoadJob::from_folder(n, d.clone()))
                .collect();
            let gone: Vec<String> = models
                .iter()
                .filter(|(n, e)| e.origin.is_some() && !found.contains_key(*n))
                .map(|(n, _)| n.clone())
                .collect();
            (changed, gone)
        };
        for name in gone {
            tracing::info!(model = %name, "model folder removed from the repository: unloading");
            control = self.unload_one(control, &name, None);
        }
        for job in &changed {
            tracing::info!(model = %job.name, "model folder changed: loading");
        }
        Ok(self
            .apply(control, changed, &found)
            .1
            .into_values()
            .collect())
    }

    /// Starts polling every `interval` on a background thread until `stop` is set.
    pub fn spawn_poller(
        self: &Arc<Self>,
        interval: Duration,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<std::thread::JoinHandle<()>> {
        let repo = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("repository-poll".into())
            .spawn(move || {
                let tick = Duration::from_millis(50);
                let mut next = Instant::now() + interval;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    if Instant::now() < next || stop.load(std::sync::atomic::Ordering::Relaxed) {
                        continue;
                    }
                    let Some(repo) = repo.upgrade() else { break };
                    if let Err(e) = repo.poll() {
                        tracing::error!("repository poll failed: {e}");
                    }
                    next = Instant::now() + interval;
                }
            })
            .map_err(|e| Error::internal(format!("cannot start the repository poll thread: {e}")))
    }
}

/// The code an API load failure answers with: request problems stay
/// INVALID_ARG, everything else is Triton's INTERNAL.
/// An ensemble unloaded because a model it calls was: where it loads from,
/// and the models it calls.
#[derive(Debug)]
pub struct Parked {
    pub(super) job: LoadJob,
    pub(super) calls: Vec<String>,
}

/// Triton's answer to a load of a model the repository does not have.
fn not_in_repository(name: &str) -> Error {
    Error::internal(format!(
        "failed to load '{name}', failed to poll from model repository"
    ))
}

/// Adds to `names` (the models being unloaded) the models they call that
/// were not loaded by name and that nothing staying loaded calls, and so on
/// down the calls (Triton's `unload_dependents`).
fn add_implicit_composing(
    graph: &DependencyGraph,
    explicit: &std::collections::BTreeSet<String>,
    names: &mut Vec<String>,
) {
    let mut queue = names.clone();
    while let Some(n) = queue.pop() {
        for called in graph.calls(&n) {
            if names.iter().any(|m| m == called) || explicit.contains(called) {
                continue;
            }
            if graph.callers(called).iter().any(|c| !names.contains(c)) {
                continue;
            }
            names.push(called.to_string());
            queue.push(called.to_string());
        }
    }
}

pub(super) fn load_code(e: &Error) -> Code {
    match e.code {
        Code::InvalidArg | Code::NotFound | Code::Unsupported => Code::InvalidArg,
        _ => Code::Internal,
    }
}

/// A model name as a repository holds it: one folder name, so it can never
/// point outside the folder it is joined to (`..`, `/x`, `a/b`, NUL).
pub(super) fn check_model_name(name: &str) -> Result<()> {
    let mut parts = Path::new(name).components();
    let single = matches!(parts.next(), Some(Component::Normal(_))) && parts.next().is_none();
    if !single || name.contains(['/', '\0']) {
        return Err(Error::invalid_arg(format!(
            "failed to load '{}': a model name must be a single folder name",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// Writes files delivered over the API into a private folder `<tmp>/<name>/`.
fn write_files(name: &str, files: &[(String, Vec<u8>)]) -> Result<tempfile::TempDir> {
    let temp = tempfile::Builder::new()
        .prefix("tern-model-")
        .tempdir()
        .map_err(|e| Error::internal(format!("cannot create a folder for model '{name}': {e}")))?;
    let model_dir = temp.path().join(name);
    for (rel, bytes) in files {
        let rel_path = Path::new(rel);
        let safe = !rel.is_empty()
            && !rel.contains('\0')
            && rel_path
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
        if !safe {
            return Err(Error::invalid_arg(format!(
                "failed to load '{name}': file parameter 'file:{rel}' must be a relative path inside the model folder"
            )));
        }
        let path = model_dir.join(rel_path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::internal(format!("cannot write '{}': {e}", path.display())))?;
        }
        std::fs::write(&path, bytes)
            .map_err(|e| Error::internal(format!("cannot write '{}': {e}", path.display())))?;
    }
    std::fs::create_dir_all(&model_dir)
        .map_err(|e| Error::internal(format!("cannot write '{}': {e}", model_dir.display())))?;
    Ok(temp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_and_unload_parameters_are_read_once_for_both_protocols() {
        let p = |k: &str, v: ControlValue| vec![(k.to_string(), v)];
        let o = LoadOverride::from_parameters([
            ("config".to_string(), ControlValue::String("{}".into())),
            (
                "file:1/model.wasm".to_string(),
                ControlValue::Bytes(vec![1, 2]),
            ),
        ])
        .unwrap();
        assert_eq!(o.config.as_deref(), Some("{}"));
        assert_eq!(o.files, vec![("1/model.wasm".to_string(), vec![1, 2])]);
        let e = LoadOverride::from_parameters(p("config", ControlValue::Bool(true))).unwrap_err();
        assert!(e.message.contains("must be a string"), "{e}");
        let e = LoadOverride::from_parameters(p("file:x", ControlValue::Other)).unwrap_err();
        assert!(e.message.contains("file's contents"), "{e}");
        let e = LoadOverride::from_parameters(p("bogus", ControlValue::Bool(true))).unwrap_err();
        assert!(
            e.message.starts_with("unknown load parameter 'bogus'"),
            "{e}"
        );
        assert!(unload_dependents(p("unload_dependents", ControlValue::Bool(true))).unwrap());
        assert!(!unload_dependents(Vec::new()).unwrap());
        assert!(unload_dependents(p("unload_dependents", ControlValue::Uint(1))).is_err());
        assert!(unload_dependents(p("x", ControlValue::Bool(true))).is_err());
    }

    #[test]
    fn control_modes_parse() {
        assert_eq!(
            ControlMode::parse("EXPLICIT").unwrap(),
            ControlMode::Explicit
        );
        assert_eq!(ControlMode::parse("poll").unwrap(), ControlMode::Poll);
        assert!(ControlMode::parse("sometimes").is_err());
    }

    #[test]
    fn model_names_are_single_folder_names() {
        for good in ["m", "my.model", "a-b_c", "é"] {
            assert!(check_model_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "../x", "/tmp/x", "a/b", "a/", "./a", "a\0b"] {
            let e = check_model_name(bad).unwrap_err();
            assert!(
                e.message.contains("must be a single folder name"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn api_files_stay_inside_the_model_folder() {
        let t = write_files("m", &[("1/model.bin".into(), b"x".to_vec())]).unwrap();
        assert_eq!(std::fs::read(t.path().join("m/1/model.bin")).unwrap(), b"x");
        for bad in ["../evil", "/etc/passwd", "1/../../x", ""] {
            let e = write_files("m", &[(bad.into(), vec![])]).unwrap_err();
            assert!(e.message.contains("relative path"), "{bad}: {e}");
        }
    }
}
