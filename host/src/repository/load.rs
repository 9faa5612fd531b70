//! The one path every load takes, whatever triggered it (startup, a
//! repository poll, the load API, or a model the loaded ensembles call
//! changing): read and check every config, add the models the ensembles
//! call that do not serve yet, order the set by its dependency graph, load
//! each wave in parallel beside what serves, swap the new versions in, then
//! re-check the serving ensembles that call a model that changed. Failures
//! are recorded in the index in one place and never stop the other models.
//!
//! Each wave loads with the control lock released and its models claimed, so
//! other models' changes go on meanwhile; a model whose load does not finish
//! within the load timeout is abandoned: its load fails, and if it ever
//! finishes, its result is dropped instead of being swapped in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::entry::Origin;
use super::fingerprint::{content_fingerprint, fingerprint};
use super::graph::DependencyGraph;
use super::{ControlGuard, ModelEntry, Prepared, Repository};
use crate::scheduler::ensemble::Ensemble;
use crate::scheduler::ModelHandle;
use tern_core::backend::{LoadContext, Progress};
use tern_core::error::{Error, Result};

/// Model folders by name, as a scan of the repositories found them.
pub(super) type Found = BTreeMap<String, Result<PathBuf>>;

/// One model to load, and where from.
#[derive(Clone, Debug)]
pub(super) struct LoadJob {
    /// The model name.
    pub name: String,
    /// The model folder, or why it cannot be used.
    pub dir: Result<PathBuf>,
    /// The API load's config override.
    pub config: Option<String>,
    /// The private folder holding files delivered over the API.
    pub temp: Option<Arc<tempfile::TempDir>>,
}

impl LoadJob {
    /// A model loaded from its repository folder as it is.
    pub fn from_folder(name: &str, dir: Result<PathBuf>) -> LoadJob {
        LoadJob {
            name: name.to_string(),
            dir,
            config: None,
            temp: None,
        }
    }
}

/// [`Repository::install`]'s outcome: still loading,
const RUNNING: u8 = 0;
/// its versions swapped in (or its failure recorded),
const COMMITTED: u8 = 1;
/// or given up at the load timeout.
const ABANDONED: u8 = 2;

/// A job whose config is read and checked: ready to install.
struct Staged {
    job: LoadJob,
    dir: PathBuf,
    prepared: Prepared,
}

impl Repository {
    /// Loads (or reloads) a set of models and returns the failures by model
    /// name, with the control lock, which is released while models load.
    pub(super) fn apply<'a>(
        &'a self,
        mut control: ControlGuard<'a>,
        jobs: Vec<LoadJob>,
        found: &Found,
    ) -> (ControlGuard<'a>, BTreeMap<String, Error>) {
        let mut failed = BTreeMap::new();
        let mut staged: BTreeMap<String, Staged> = BTreeMap::new();
        let mut jobs = jobs;
        while !jobs.is_empty() {
            for (job, result) in self.parallel(jobs, |job| {
                let result = job.dir.clone().and_then(|dir| {
                    let p = self.prepare(&job.name, &dir, job.config.as_deref())?;
                    Ok((dir, p))
                });
                (job, result)
            }) {
                match result {
                    Ok((dir, prepared)) => {
                        let name = job.name.clone();
                        staged.insert(name, Staged { job, dir, prepared });
                    }
                    Err(e) => {
                        self.record_failure(&job.name, &e);
                        self.remember_failed(&job);
                        failed.insert(job.name, e);
                    }
                }
            }
            jobs = self.missing_composing(&staged, &failed, found);
        }
        let graph = DependencyGraph::of(
            staged
                .iter()
                .map(|(n, s)| (n.as_str(), &*s.prepared.config)),
        );
        let (waves, cyclic) = graph.waves();
        for name in cyclic {
            let e = Error::invalid_arg(format!(
                "ensemble '{name}': its steps lead into a cycle of ensembles (ensembles whose steps call each other)"
            ));
            self.record_failure(&name, &e);
            if let Some(s) = staged.remove(&name) {
                self.remember_failed(&s.job);
            }
            failed.insert(name, e);
        }
        let mut changed = Vec::new();
        for wave in waves {
            let wave: Vec<Staged> = wave.iter().filter_map(|n| staged.remove(n)).collect();
            let names: Vec<String> = wave.iter().map(|s| s.job.name.clone()).collect();
            let (guard, results) = self.unlocked(control, &names, || {
                self.parallel(wave, |s| {
                    let result = self.install_bounded(&s.job, &s.dir, s.prepared);
                    (s.job, result)
                })
            });
            control = guard;
            for (job, result) in results {
                if result.is_ok() {
                    // Every load, by request or by the API, is a use (idle unloading, LRU eviction).
                    self.touch(&job.name);
                }
                match result {
                    Ok(true) => changed.push(job.name),
                    Ok(false) => {}
                    Err(e) => {
                        self.remember_failed(&job);
                        failed.insert(job.name, e);
                    }
                }
            }
        }
        let done: BTreeSet<&String> = graph.names().chain(failed.keys()).collect();
        let dependents = self.dependents_to_recheck(&changed, &done);
        if !dependents.is_empty() {
            let (guard, errors) = self.apply(control, dependents, found);
            control = guard;
            for (name, e) in errors {
                tracing::error!(model = %name, "reload after a model it calls changed failed: {e}");
            }
        }
        (control, failed)
    }

    /// [`Repository::install`] within the load timeout: past it, the load is
    /// abandoned and fails (the thread doing it cannot be stopped, but its
    /// result is dropped when it finishes).
    fn install_bounded(&self, job: &LoadJob, dir: &Path, prepared: Prepared) -> Result<bool> {
        let outcome = Arc::new(AtomicU8::new(RUNNING));
        let (Some(timeout), Some(repo)) = (self.options.load_timeout, self.me.upgrade()) else {
            return self.install(job, dir, prepared, &outcome);
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (job2, dir2, outcome2) = (job.clone(), dir.to_path_buf(), outcome.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("load-{}", job.name))
            .spawn(move || {
                let _ = tx.send(repo.install(&job2, &dir2, prepared, &outcome2));
            });
        if let Err(e) = spawned {
            return Err(
                Error::internal(format!("cannot start a thread to load it: {e}"))
                    .for_model(&job.name),
            );
        }
        match rx.recv_timeout(timeout) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::internal(
                "the load ended without a result (its thread panicked)",
            )
            .for_model(&job.name)),
            Err(_)
                if outcome
                    .compare_exchange(RUNNING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok() =>
            {
                let e = Error::unavailable(format!(
                    "the load did not finish within {} s (--model-load-timeout-secs) \
                     and was abandoned",
                    timeout.as_secs()
                ))
                .for_model(&job.name);
                self.record_failure(&job.name, &e);
                Err(e)
            }
            // It committed its result just as the time ran out.
            Err(_) => rx.recv().unwrap_or_else(|_| {
                Err(Error::internal("the load thread ended without a result").for_model(&job.name))
            }),
        }
    }

    /// The models the staged ensembles call that neither serve nor are part
    /// of this load, from the repository (explicit mode loads them with the
    /// ensemble).
    fn missing_composing(
        &self,
        staged: &BTreeMap<String, Staged>,
        failed: &BTreeMap<String, Error>,
        found: &Found,
    ) -> Vec<LoadJob> {
        let graph = DependencyGraph::of(
            staged
                .iter()
                .map(|(n, s)| (n.as_str(), &*s.prepared.config)),
        );
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let wanted: BTreeSet<&str> = staged
            .keys()
            .flat_map(|n| graph.calls(n))
            .filter(|m| !staged.contains_key(*m) && !failed.contains_key(*m))
            .filter(|m| models.get(*m).is_none_or(|e| !e.serving()))
            .collect();
        wanted
            .into_iter()
            .filter_map(|m| Some(LoadJob::from_folder(m, found.get(m)?.clone())))
            .collect()
    }

    /// The serving ensembles that call a model in `changed` and were not part
    /// of the load: they reload against the new config, from where they were
    /// loaded (with their config override and API files).
    fn dependents_to_recheck(&self, changed: &[String], done: &BTreeSet<&String>) -> Vec<LoadJob> {
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
        let mut callers = BTreeSet::new();
        for name in changed {
            for caller in graph.callers(name) {
                if !done.contains(&caller) && callers.insert(caller.clone()) {
                    tracing::info!(model = %caller, "reloading: it calls '{name}', which changed");
                }
            }
        }
        callers
            .into_iter()
            .filter_map(|name| {
                let o = models.get(&name)?.origin.as_ref()?;
                Some(LoadJob {
                    dir: Ok(o.dir.clone()),
                    config: o.config.clone(),
                    temp: o.temp.clone(),
                    name,
                })
            })
            .collect()
    }

    /// Runs `f` on every item on up to `--model-load-thread-count` threads.
    fn parallel<T: Send, R: Send>(&self, items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
        let threads = self.options.load_threads.clamp(1, items.len().max(1));
        if threads == 1 {
            return items.into_iter().map(f).collect();
        }
        let queue = Mutex::new(items);
        let out = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let item = queue.lock().expect("load queue").pop();
                    let Some(item) = item else { break };
                    let r = f(item);
                    out.lock().expect("load results").push(r);
                });
            }
        });
        out.into_inner().expect("load results")
    }

    /// Loads every selected version of a prepared model beside what serves
    /// now, then swaps them in. A model that serves keeps serving when any
    /// version of the new load fails; the failure shows in the index.
    /// Returns whether the model changed (false when only its instances were
    /// adjusted in place).
    ///
    /// `outcome` decides between this load and its timeout: the load swaps
    /// its versions in only if it moves it from [`RUNNING`] to [`COMMITTED`]
    /// first; once it is [`ABANDONED`], the new versions are dropped.
    fn install(
        &self,
        job: &LoadJob,
        dir: &Path,
        prepared: Prepared,
        outcome: &AtomicU8,
    ) -> Result<bool> {
        let name = job.name.as_str();
        let origin = Origin {
            dir: dir.to_path_buf(),
            fingerprint: fingerprint(dir),
            content: content_fingerprint(dir),
            config: job.config.clone(),
            temp: job.temp.clone(),
        };
        let origin = match self.resize_in_place(name, &prepared, origin) {
            Ok(()) => return Ok(false),
            Err(origin) => origin,
        };
        let progress = self.mark_loading(name);
        let mut entry = ModelEntry::new(prepared.config.clone(), origin);
        let mut errors = Vec::new();
        for version in prepared.versions.clone() {
            let started = Instant::now();
            match self.load_version_with_retries(name, dir, &prepared, version, &progress) {
                Ok(handle) => {
                    tracing::info!(
                        model = name,
                        version,
                        backend = prepared.backend.as_ref().map_or("ensemble", |b| b.name()),
                        "model loaded in {:?}",
                        started.elapsed()
                    );
                    entry.loaded(handle, started.elapsed().as_secs_f64());
                }
                Err(e) => {
                    tracing::error!(model = name, version, "failed to load version: {e}");
                    entry.load_failed(Some(version), &e.message);
                    errors.push(e);
                }
            }
        }
        if entry.untried() {
            let e = Error::not_found(format!(
                "no version folder matches the version policy in '{}'",
                dir.display()
            ))
            .for_model(name);
            entry.load_failed(None, &e.message);
            errors.push(e);
        }
        let first_error = errors.into_iter().next();
        let committed = outcome
            .compare_exchange(RUNNING, COMMITTED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if !committed {
            tracing::warn!(
                model = name,
                "a load abandoned at its timeout finished; its versions are dropped"
            );
            return Err(Error::unavailable("the load was abandoned").for_model(name));
        }
        let replaced = {
            let mut models = self
                .models
                .write()
                .expect("models lock poisoned: nothing panics while holding it");
            if self.closed.load(Ordering::SeqCst) {
                // The server stopped while this loaded: nothing more serves.
                drop(models);
                drop(entry);
                return Err(Error::unavailable(
                    "the server is shutting down: models are no longer loaded",
                ));
            }
            let current = models.entry(name.to_string()).or_default();
            match &first_error {
                Some(e) if current.serving() => {
                    current.failed_load(&e.message);
                    None
                }
                _ => Some(std::mem::replace(current, entry)),
            }
        };
        if let Some(e) = first_error {
            self.count_load_failure(name);
            return Err(e);
        }
        // The old versions finish their in-flight requests, then stop (the instance pool's Drop).
        drop(replaced);
        Ok(true)
    }

    /// Applies a config that differs from the serving one only in
    /// `instance_group`, with unchanged model files, by adjusting the
    /// instances of every serving version in place (no reload). Gives the
    /// origin back when the change needs a full load.
    fn resize_in_place(
        &self,
        name: &str,
        prepared: &Prepared,
        origin: Origin,
    ) -> std::result::Result<(), Origin> {
        let handles: Vec<Arc<ModelHandle>> = {
            let models = self
                .models
                .read()
                .expect("models lock poisoned: nothing panics while holding it");
            let Some(entry) = models.get(name) else {
                return Err(origin);
            };
            let same_files = entry
                .origin
                .as_ref()
                .is_some_and(|o| o.dir == origin.dir && o.content == origin.content);
            let same_rest = entry.config.as_ref().is_some_and(|old| {
                let (mut a, mut b) = ((**old).clone(), (*prepared.config).clone());
                a.instance_group.clear();
                b.instance_group.clear();
                a == b && old.instance_group != prepared.config.instance_group
            });
            let versions = entry.ready_versions();
            let all_ready = entry.all_ready();
            if !same_files
                || !same_rest
                || !all_ready
                || versions != prepared.versions
                || entry.handles().any(|h| !h.resizable())
            {
                return Err(origin);
            }
            entry.handles().cloned().collect()
        };
        let mut resized = BTreeMap::new();
        for h in &handles {
            match h.resized(prepared.config.clone()) {
                Ok(r) => {
                    resized.insert(h.version, Arc::new(r));
                }
                Err(e) => {
                    // Versions resized so far keep their new instances; the rest keep theirs.
                    tracing::warn!(
                        model = name,
                        version = h.version,
                        "adjusting instances in place failed ({e}); reloading instead"
                    );
                    return Err(origin);
                }
            }
        }
        let mut models = self
            .models
            .write()
            .expect("models lock poisoned: nothing panics while holding it");
        let entry = models
            .get_mut(name)
            .expect("entry exists: changes are serialised");
        entry.resized(resized);
        entry.config = Some(prepared.config.clone());
        entry.origin = Some(origin);
        Ok(())
    }

    /// Builds one version of a prepared model.
    /// [`Self::load_version`], tried again up to `--model-load-retry-count`
    /// more times while it fails (as Triton retries a version's whole
    /// creation, back to back); the last failure is the load's.
    fn load_version_with_retries(
        &self,
        name: &str,
        dir: &Path,
        prepared: &Prepared,
        version: i64,
        progress: &Progress,
    ) -> Result<ModelHandle> {
        let mut attempt = 0;
        loop {
            match self.load_version(name, dir, prepared, version, progress) {
                Err(e) if attempt < self.options.load_retries => {
                    attempt += 1;
                    tracing::error!(
                        model = name,
                        version,
                        "failed to load version (attempt {attempt} of {}): {e}",
                        self.options.load_retries + 1
                    );
                }
                result => return result,
            }
        }
    }

    fn load_version(
        &self,
        name: &str,
        dir: &Path,
        prepared: &Prepared,
        version: i64,
        progress: &Progress,
    ) -> Result<ModelHandle> {
        let version_dir = dir.join(version.to_string());
        if !version_dir.is_dir() {
            return Err(Error::not_found(format!(
                "version {version} is not present in '{}'",
                dir.display()
            ))
            .for_model(name));
        }
        let config = &prepared.config;
        match &prepared.backend {
            Some(backend) => {
                progress.set(format!("version {version}: loading the model files"));
                let ctx = LoadContext {
                    config,
                    version,
                    version_dir: &version_dir,
                    settings: &self.options.backend,
                    models: self.router.clone(),
                    progress,
                    gate: &prepared.gate,
                };
                // A backend that panics while loading fails this load, not the server.
                let model = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    backend.load(&ctx)
                }))
                .map_err(|_| {
                    Error::internal(format!(
                        "model '{name}' version {version}: the '{}' backend panicked while loading it",
                        backend.name()
                    ))
                })??;
                progress.set(format!(
                    "version {version}: starting instances and warming up"
                ));
                ModelHandle::start(
                    config.clone(),
                    version,
                    model,
                    prepared.labels.clone(),
                    self.options.gpu_count,
                    dir,
                    self.options.summary_latencies,
                )
            }
            None => {
                let ensemble = Ensemble::build(
                    config,
                    |m, v| self.get(m, v).map(|h| h.config.clone()),
                    self.router.clone(),
                )?;
                // An output without labels of its own classifies with the labels of
                // the composing model output it comes from, as that model answers.
                let mut labels = prepared.labels.clone();
                for (output, model, v, key) in ensemble.output_producers() {
                    if labels.contains_key(output) {
                        continue;
                    }
                    if let Some(l) = self
                        .get(model, v)
                        .ok()
                        .and_then(|h| h.labels().get(key).cloned())
                    {
                        labels.insert(output.to_string(), l);
                    }
                }
                ModelHandle::ensemble(
                    config.clone(),
                    version,
                    ensemble,
                    labels,
                    self.options.summary_latencies,
                )
            }
        }
    }

    /// Shows a model as LOADING unless it serves already (then it keeps its rows).
    fn mark_loading(&self, name: &str) -> Progress {
        let mut models = self
            .models
            .write()
            .expect("models lock poisoned: nothing panics while holding it");
        models.entry(name.to_string()).or_default().begin_load()
    }

    /// Remembers the fingerprint of a folder whose load failed, so polling
    /// retries only after it changes.
    fn remember_failed(&self, job: &LoadJob) {
        let mut models = self
            .models
            .write()
            .expect("models lock poisoned: nothing panics while holding it");
        if let Some(entry) = models.get_mut(&job.name) {
            let fp = job.dir.as_deref().ok().map(fingerprint);
            match &mut entry.origin {
                Some(o) => {
                    // Still serving the old load: remember the failed folder state beside it.
                    if let Some(fp) = fp {
                        o.fingerprint = fp;
                    }
                }
                None => entry.failed = fp,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RepositoryOptions, State};
    use super::*;
    use crate::repository::control::{ControlMode, LoadOverride};

    const ID: &str = r#"name: "id" backend: "identity" max_batch_size: 4
        input [{name: "X" data_type: TYPE_INT32 dims: [2]}]
        output [{name: "Y" data_type: TYPE_INT32 dims: [2]}]"#;

    /// An ensemble of one step calling `model`.
    fn ensemble(name: &str, model: &str) -> String {
        format!(
            r#"name: "{name}" platform: "ensemble" max_batch_size: 4
            input [{{name: "X" data_type: TYPE_INT32 dims: [2]}}]
            output [{{name: "Y" data_type: TYPE_INT32 dims: [2]}}]
            ensemble_scheduling {{ step [{{model_name: "{model}" model_version: -1
              input_map {{key: "X" value: "X"}} output_map {{key: "Y" value: "Y"}}}}] }}"#
        )
    }

    fn write_model(root: &Path, name: &str, config: &str) {
        std::fs::create_dir_all(root.join(name).join("1")).unwrap();
        std::fs::write(root.join(name).join("config.pbtxt"), config).unwrap();
    }

    fn repository(root: &Path) -> Arc<Repository> {
        write_model(root, "id", ID);
        write_model(root, "ens", &ensemble("ens", "id"));
        write_model(root, "nested", &ensemble("nested", "ens"));
        write_model(root, "cycle_a", &ensemble("cycle_a", "cycle_b"));
        write_model(root, "cycle_b", &ensemble("cycle_b", "cycle_a"));
        Repository::new(
            RepositoryOptions {
                roots: vec![root.to_path_buf()],
                load_threads: 2,
                ..Default::default()
            },
            tern_core::router::unrouted(),
        )
    }

    fn state(repo: &Repository, name: &str) -> (State, String) {
        let rows = repo.index_with_unloaded();
        let row = rows.iter().find(|r| r.name == name).expect("a row");
        (row.state, row.reason.clone())
    }

    #[test]
    fn an_ensemble_loads_after_the_models_it_calls_and_cycles_fail() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(t.path());
        let errors = repo
            .load_startup(ControlMode::Explicit, &["nested".into(), "cycle_a".into()])
            .unwrap();
        for name in ["id", "ens", "nested"] {
            assert!(repo.get(name, None).is_ok(), "{name} serves");
        }
        assert_eq!(errors.len(), 2, "{errors:?}");
        for name in ["cycle_a", "cycle_b"] {
            let (s, reason) = state(&repo, name);
            assert_eq!(s, State::Unavailable);
            assert!(reason.contains("a cycle of ensembles"), "{reason}");
        }
    }

    #[test]
    fn a_changed_model_reloads_its_callers_and_unload_follows_them() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(t.path());
        repo.load_startup(ControlMode::Explicit, &["nested".into()])
            .unwrap();
        let (ens, nested) = (
            repo.get("ens", None).unwrap(),
            repo.get("nested", None).unwrap(),
        );
        let smaller = ID.replace("max_batch_size: 4", "max_batch_size: 2");
        let overrides = LoadOverride {
            config: Some(
                tern_core::config::json::to_json(
                    &tern_core::config::parse_pbtxt(&smaller).unwrap(),
                )
                .to_string(),
            ),
            files: Vec::new(),
        };
        // The ensembles' batch size no longer fits the model they call: they keep serving their old versions.
        repo.load_model("id", overrides).unwrap();
        assert_eq!(repo.get("id", None).unwrap().config.max_batch_size, 2);
        for (name, old) in [("ens", &ens), ("nested", &nested)] {
            assert!(Arc::ptr_eq(&repo.get(name, None).unwrap(), old), "{name}");
        }
        assert!(state(&repo, "ens").1.contains("the latest load failed"));
        // Back to the original config: both ensembles reload against it.
        repo.load_model("id", LoadOverride::default()).unwrap();
        for (name, old) in [("ens", &ens), ("nested", &nested)] {
            assert!(
                !Arc::ptr_eq(&repo.get(name, None).unwrap(), old),
                "{name} reloaded"
            );
            assert_eq!(state(&repo, name), (State::Ready, String::new()));
        }
        drop((ens, nested));
        repo.unload_model("id", true).unwrap();
        for name in ["id", "ens", "nested"] {
            assert!(repo.get(name, None).is_err(), "{name} unloaded");
        }
    }

    #[test]
    fn polling_retries_a_failed_folder_only_after_it_changes() {
        let t = tempfile::tempdir().unwrap();
        write_model(t.path(), "id", "name: \"id\" backend: \"identity\" input [");
        let repo = Repository::new(
            RepositoryOptions {
                roots: vec![t.path().to_path_buf()],
                load_threads: 1,
                ..Default::default()
            },
            tern_core::router::unrouted(),
        );
        assert_eq!(repo.load_all().unwrap().len(), 1);
        assert!(repo.poll().unwrap().is_empty(), "unchanged: not retried");
        std::fs::write(t.path().join("id/config.pbtxt"), ID).unwrap();
        assert!(repo.poll().unwrap().is_empty());
        assert!(repo.get("id", None).is_ok());
    }
}
