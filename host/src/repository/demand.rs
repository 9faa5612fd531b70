//! Models loaded on demand within a memory budget (explicit mode with
//! `--model-load-on-demand`): a request for a model that is in the
//! repository but not loaded starts one load that every concurrent request
//! for it shares; `--model-idle-unload-secs` unloads models nobody used for
//! that long; `--memory-budget` evicts the least recently used unpinned
//! models before a load would take the process past the budget, and refuses
//! a load that cannot fit. This module owns that policy: when each model was
//! last used, what each load cost, which models are pinned, which loads are
//! in progress (and the memory they reserve), which loads failed, why a
//! model was unloaded, and the counters the metrics show.
//!
//! No in-flight request is ever dropped by an eviction: a model is unloaded
//! only by a conditional unload that checks, under the models' write lock
//! and in the same critical section that takes its handles out of service,
//! that nothing holds it (no request, stream or waiter of its load), that
//! it has no open sequence, is not being loaded and was not used since it
//! was chosen; otherwise the eviction is abandoned.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::fingerprint::fingerprint;
use super::graph::DependencyGraph;
use super::{ModelEntry, Repository};
use crate::scheduler::ModelHandle;
use tern_core::error::{Error, Result};

/// The config parameter that pins a model (`string_value: "true"`).
pub const PINNED_PARAMETER: &str = "tern_pinned";

/// `--model-load-on-demand`, `--model-idle-unload-secs` and `--memory-budget`.
#[derive(Debug, Clone, Default)]
pub struct OnDemandOptions {
    /// Load a model that is not loaded when a request names it.
    pub enabled: bool,
    /// Unload unpinned models unused for this long.
    pub idle_unload: Option<Duration>,
    /// The most memory the process may use, in bytes, before loads evict.
    pub budget: Option<u64>,
}

/// Why a model was unloaded by this module (the metrics' `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Eviction {
    /// Unused for `--model-idle-unload-secs`.
    Idle,
    /// Evicted to make room under `--memory-budget`.
    MemoryBudget,
}

impl Eviction {
    /// The metrics label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::Idle => "idle",
            Eviction::MemoryBudget => "memory_budget",
        }
    }
}

/// How long a load under the budget waits for busy models (or other loads
/// in progress) to become evictable before it is refused.
const BUSY_WAIT: Duration = if cfg!(test) {
    Duration::from_millis(200)
} else {
    Duration::from_secs(10)
};

/// How long a failed load on demand answers the requests after it without
/// loading again, while the model's folder stays unchanged.
pub const FAILURE_BACKOFF: Duration = Duration::from_secs(10);

/// What a load on demand answers the requests that wait for it: the model's
/// serving handles, taken before the load stopped counting as in progress
/// (so that the model cannot be evicted before the waiters run on it), or
/// why the load failed.
pub type Loaded = Result<Vec<Arc<ModelHandle>>>;

/// The load whose result concurrent requests for one model wait on.
type Pending = tokio::sync::watch::Receiver<Option<Loaded>>;

/// A failed load on demand, answered again without loading (see [`FAILURE_BACKOFF`]).
struct Failure {
    /// The model folder's fingerprint when the load began.
    fingerprint: Option<u64>,
    at: Instant,
    error: Error,
}

/// The state of loading on demand (see the module doc).
#[derive(Default)]
pub(super) struct Demand {
    /// Loads in progress, by model: every request for the model waits on the same one.
    pending: Mutex<HashMap<String, Pending>>,
    /// When each model was last used, in microseconds since `epoch`.
    used: RwLock<HashMap<String, Arc<AtomicU64>>>,
    epoch: Option<Instant>,
    /// The latest measure of what each model takes, in bytes of process
    /// memory: the growth of the process's memory over its latest load, or
    /// what its latest eviction gave back, whichever came last.
    cost: Mutex<HashMap<String, u64>>,
    /// Models pinned by `--load-model`.
    pinned: Mutex<BTreeSet<String>>,
    /// The expected costs of the loads under the budget in progress: memory
    /// they will take that the process's memory does not show yet.
    reserved: Mutex<Reserved>,
    /// Failed loads on demand, answered again without loading.
    failures: Mutex<HashMap<String, Failure>>,
    /// Evictions under way: memory the process is about to give back.
    evicting: AtomicU64,
    /// How many evictions were ever begun.
    evictions_begun: AtomicU64,
    loads: AtomicU64,
    evictions: Mutex<BTreeMap<(String, Eviction), u64>>,
}

impl Demand {
    pub(super) fn new() -> Demand {
        Demand {
            epoch: Some(Instant::now()),
            ..Default::default()
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.map_or(0, |e| e.elapsed().as_micros() as u64)
    }

    /// Records a use of `model` now.
    fn touch(&self, model: &str) {
        let now = self.now_us();
        if let Some(t) = self.used.read().expect("usage lock").get(model) {
            t.store(now, Ordering::Relaxed);
            return;
        }
        self.used
            .write()
            .expect("usage lock")
            .entry(model.to_string())
            .or_default()
            .store(now, Ordering::Relaxed);
    }

    /// When `model` was last used (µs since the epoch); a model never seen counts as used now.
    fn last_used(&self, model: &str) -> u64 {
        if let Some(t) = self.used.read().expect("usage lock").get(model) {
            return t.load(Ordering::Relaxed);
        }
        self.touch(model);
        self.last_used(model)
    }

    #[cfg(test)]
    fn is_pending(&self, model: &str) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(model)
    }
}

/// The reservations of the loads under the budget in progress.
#[derive(Default)]
struct Reserved {
    /// What they reserved, together.
    bytes: u64,
    /// How many reservations were ever made.
    made: u64,
}

/// Memory reserved for a load under the budget until it is dropped.
struct Reservation<'a> {
    demand: &'a Demand,
    bytes: u64,
    /// `Reserved::made` once this one was made.
    made: u64,
    /// Whether no other load held a reservation, and no eviction was under
    /// way, when this one was made.
    first: bool,
    /// `Demand::evictions_begun` when this one was made.
    evictions: u64,
}

impl Reservation<'_> {
    /// Whether the load ran alone, as far as loads on demand go: no other
    /// one in progress when it began, and none begun since. Only then is
    /// the growth of the process's memory its own.
    fn alone(&self) -> bool {
        self.first
            && self.demand.reserved.lock().expect("reserved lock").made == self.made
            && self.demand.evictions_begun.load(Ordering::SeqCst) == self.evictions
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut reserved = self
            .demand
            .reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        reserved.bytes = reserved.bytes.saturating_sub(self.bytes);
    }
}

/// One load on demand in progress: answers its waiters exactly once, and
/// stops counting as in progress then, also when the load panics.
struct PendingLoad {
    repo: Arc<Repository>,
    name: String,
    tx: Option<tokio::sync::watch::Sender<Option<Loaded>>>,
}

impl PendingLoad {
    /// Loads the model and answers the waiters with its handles, taken
    /// while the load still counts as in progress (so still protected from
    /// eviction); holding them protects it after.
    fn run(mut self) {
        let loaded = self
            .repo
            .load_demanded(&self.name)
            .and_then(|()| self.repo.handles(Some(&self.name), None))
            .and_then(|h| {
                if h.is_empty() {
                    Err(Error::unavailable(format!(
                        "model '{}' was loaded on demand but no version serves",
                        self.name
                    )))
                } else {
                    Ok(h)
                }
            });
        self.answer(loaded);
    }

    fn answer(&mut self, loaded: Loaded) {
        let Some(tx) = self.tx.take() else { return };
        self.repo
            .demand
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
        let _ = tx.send(Some(loaded));
    }
}

impl Drop for PendingLoad {
    fn drop(&mut self) {
        if self.tx.is_none() {
            return;
        }
        let e = Error::internal(format!(
            "loading model '{}' on demand stopped without a result (its thread panicked or could not start)",
            self.name
        ));
        self.answer(Err(e));
    }
}

impl Repository {
    /// Whether a failed lookup of `name` should load it on demand: the mode
    /// is on, the model does not serve, and its folder is in the repository.
    pub fn loads_on_demand(&self, name: &str) -> bool {
        self.options.on_demand.enabled
            && !self
                .models
                .read()
                .expect("models lock poisoned: nothing panics while holding it")
                .get(name)
                .is_some_and(|e| e.serving())
            && super::control::check_model_name(name).is_ok()
            && self.model_dir(name).is_some()
    }

    /// The folder of model `name` in the repository, if there is one.
    fn model_dir(&self, name: &str) -> Option<PathBuf> {
        self.options
            .roots
            .iter()
            .map(|r| r.join(name))
            .find(|d| d.is_dir())
    }

    /// Records a request for `name` (for idle unloading and LRU eviction).
    pub fn touch(&self, name: &str) {
        let o = &self.options.on_demand;
        if o.enabled && (o.idle_unload.is_some() || o.budget.is_some()) {
            self.demand.touch(name);
        }
    }

    /// Pins the models `--load-model` names: never unloaded by idleness or the budget.
    pub(super) fn pin(&self, names: &[String]) {
        if self.options.on_demand.enabled {
            let mut pinned = self.demand.pinned.lock().expect("pinned lock");
            pinned.extend(names.iter().filter(|n| *n != "*").cloned());
        }
    }

    /// The one load of `name` that concurrent requests share: starts it on
    /// a thread of its own unless one is under way, and answers with the
    /// receiver its result arrives on. A load that failed recently, of a
    /// folder that has not changed since, answers its failure again.
    pub fn load_shared(self: &Arc<Self>, name: &str) -> Pending {
        if let Some(e) = self.remembered_failure(name) {
            return tokio::sync::watch::channel(Some(Err(e))).1;
        }
        let mut pending = self.demand.pending.lock().expect("pending lock");
        if let Some(rx) = pending.get(name) {
            return rx.clone();
        }
        let (tx, rx) = tokio::sync::watch::channel(None);
        pending.insert(name.to_string(), rx.clone());
        drop(pending);
        let load = PendingLoad {
            repo: self.clone(),
            name: name.to_string(),
            tx: Some(tx),
        };
        // A thread that cannot start drops `load`, which answers the waiters.
        if let Err(e) = std::thread::Builder::new()
            .name(format!("load-{name}"))
            .spawn(move || load.run())
        {
            tracing::error!(model = name, "cannot start a thread to load on demand: {e}");
        }
        rx
    }

    /// The failure of the latest load on demand of `name`, while it stands:
    /// less than [`FAILURE_BACKOFF`] ago, and the folder unchanged since.
    fn remembered_failure(&self, name: &str) -> Option<Error> {
        let (print, at, error) = {
            let failures = self.demand.failures.lock().expect("failures lock");
            let f = failures.get(name)?;
            (f.fingerprint, f.at, f.error.clone())
        };
        if at.elapsed() >= FAILURE_BACKOFF || self.model_dir(name).map(|d| fingerprint(&d)) != print
        {
            return None;
        }
        Some(Error::new(
            error.code,
            format!(
                "{} (failed {:.1} s ago; loaded again once its folder changes, or {} s after the failure)",
                error.message,
                at.elapsed().as_secs_f64(),
                FAILURE_BACKOFF.as_secs()
            ),
        ))
    }

    /// Forgets a failed load on demand of `name` (a load of it succeeded).
    pub(super) fn forget_failure(&self, name: &str) {
        self.demand
            .failures
            .lock()
            .expect("failures lock")
            .remove(name);
    }

    /// Loads `name` for a request: makes room under the budget first
    /// (reserving what the load is expected to take until it is done), then
    /// loads it and records what it cost.
    fn load_demanded(&self, name: &str) -> Result<()> {
        let started = Instant::now();
        if self.get(name, None).is_ok() {
            return Ok(());
        }
        let print = self.model_dir(name).map(|d| fingerprint(&d));
        let reservation = match self.options.on_demand.budget {
            Some(budget) => Some(self.make_room(name, budget)?),
            None => None,
        };
        let before = memory_in_use();
        tracing::info!(model = name, "loading on demand");
        self.demand.loads.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.load_model_from(name, Default::default())? {
            let e = Error::new(
                super::control::load_code(&e),
                format!("loading model '{name}' on demand failed: {}", e.message),
            );
            self.demand.failures.lock().expect("failures lock").insert(
                name.to_string(),
                Failure {
                    fingerprint: print,
                    at: Instant::now(),
                    error: e.clone(),
                },
            );
            return Err(e);
        }
        let after = memory_in_use();
        // Measured beside another load, the growth is partly the other's: kept out.
        if reservation.as_ref().is_none_or(Reservation::alone) {
            self.demand
                .cost
                .lock()
                .expect("cost lock")
                .insert(name.to_string(), after.saturating_sub(before));
        }
        drop(reservation);
        tracing::info!(
            model = name,
            "loaded on demand in {:?} (process memory {} -> {})",
            started.elapsed(),
            mib(before),
            mib(after)
        );
        if let Some(budget) = self.options.on_demand.budget.filter(|b| after > *b) {
            self.back_under_budget(name, budget);
        }
        Ok(())
    }

    /// After a load that took more than expected: evicts least recently
    /// used models until the process is back under the budget.
    fn back_under_budget(&self, name: &str, budget: u64) {
        let mut skipped = BTreeSet::from([name.to_string()]);
        while memory_in_use() > budget {
            let Some((last, victim)) = self.evictable(&skipped).into_iter().next() else {
                tracing::warn!(
                    model = name,
                    "process memory {} is over --memory-budget {} and nothing more can be evicted",
                    mib(memory_in_use()),
                    mib(budget)
                );
                return;
            };
            if !self.evict(&victim, last, Eviction::MemoryBudget, name) {
                skipped.insert(victim);
            }
        }
    }

    /// Evicts least recently used models until `name`'s estimated cost fits
    /// under `budget` beside the process's memory and what the other loads
    /// in progress reserved, then reserves it. While the models that could
    /// make room are busy (requests in flight, a change of theirs under way)
    /// or other loads or evictions are in progress, it waits for them, up to
    /// [`BUSY_WAIT`]; it refuses the load when nothing loaded can make room.
    fn make_room(&self, name: &str, budget: u64) -> Result<Reservation<'_>> {
        let need = self.estimate(name);
        let waiting_since = Instant::now();
        let mut skipped = BTreeSet::from([name.to_string()]);
        loop {
            let (used, others) = {
                let mut reserved = self.demand.reserved.lock().expect("reserved lock");
                let used = memory_in_use();
                if used.saturating_add(reserved.bytes).saturating_add(need) <= budget {
                    let first =
                        reserved.bytes == 0 && self.demand.evicting.load(Ordering::SeqCst) == 0;
                    reserved.bytes += need;
                    reserved.made += 1;
                    return Ok(Reservation {
                        demand: &self.demand,
                        bytes: need,
                        made: reserved.made,
                        first,
                        evictions: self.demand.evictions_begun.load(Ordering::SeqCst),
                    });
                }
                (used, reserved.bytes)
            };
            if let Some((last, victim)) = self.evictable(&skipped).into_iter().next() {
                if !self.evict(&victim, last, Eviction::MemoryBudget, name) {
                    // Used, held or changed since it was chosen: another one.
                    skipped.insert(victim);
                }
                continue;
            }
            let in_flux = others > 0 || self.demand.evicting.load(Ordering::SeqCst) > 0;
            if (in_flux || self.busy_evictable(name)) && waiting_since.elapsed() < BUSY_WAIT {
                skipped = BTreeSet::from([name.to_string()]);
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            return Err(self.refusal(name, need, used + others, budget));
        }
    }

    /// The refusal of a load on demand that cannot fit under the budget.
    fn refusal(&self, name: &str, need: u64, used: u64, budget: u64) -> Error {
        let loaded = self.resident_summary();
        Error::unavailable(format!(
            "cannot load model '{name}' on demand: it needs about {}, the process \
             uses {} of --memory-budget {} and nothing more can be evicted; \
             loaded: {}",
            mib(need),
            mib(used),
            mib(budget),
            if loaded.is_empty() {
                "none".into()
            } else {
                loaded.join(", ")
            }
        ))
    }

    /// Whether a model other than `name` could be evicted once its requests
    /// (or its load) finish.
    fn busy_evictable(&self, name: &str) -> bool {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let graph = serving_graph(&models);
        models.iter().any(|(n, e)| {
            e.serving() && n != name && !self.pinned(n, e) && graph.callers(n).is_empty()
        })
    }

    /// What loading `name` is expected to take: its latest measure (what
    /// its latest load grew the process by, or what its latest eviction gave
    /// back, whichever came last), never less than the size of its folder's
    /// files. Each measure replaces the one before (none is a minimum over
    /// the history), and the floor keeps the estimate from drifting to
    /// nothing; a first load's one-time costs (a backend's runtime
    /// initialising) leave the estimate at the model's next eviction.
    fn estimate(&self, name: &str) -> u64 {
        let measured = self
            .demand
            .cost
            .lock()
            .expect("cost lock")
            .get(name)
            .copied()
            .unwrap_or(0);
        let files = self.model_dir(name).map_or(0, |d| folder_size(&d));
        files.max(measured)
    }

    /// The loaded models with what each cost and why it stays, for a refusal.
    fn resident_summary(&self) -> Vec<String> {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let cost = self.demand.cost.lock().expect("cost lock").clone();
        models
            .iter()
            .filter(|(_, e)| e.serving())
            .map(|(n, e)| {
                let mut notes = Vec::new();
                if let Some(c) = cost.get(n) {
                    notes.push(mib(*c));
                }
                if self.pinned(n, e) {
                    notes.push("pinned".into());
                } else if in_use(e) {
                    notes.push("in use".into());
                }
                if notes.is_empty() {
                    format!("'{n}'")
                } else {
                    format!("'{n}' ({})", notes.join(", "))
                }
            })
            .collect()
    }

    fn pinned(&self, name: &str, entry: &ModelEntry) -> bool {
        self.demand
            .pinned
            .lock()
            .expect("pinned lock")
            .contains(name)
            || entry.config.as_ref().is_some_and(|c| {
                c.parameters
                    .get(PINNED_PARAMETER)
                    .is_some_and(|p| p.string_value.eq_ignore_ascii_case("true"))
            })
    }

    /// Whether `name` may be unloaded now: it serves, is not pinned, nothing
    /// holds it (no request, stream or waiter of its load) and it has no
    /// open sequence, it is not being loaded on demand, and no serving
    /// ensemble calls it.
    fn may_unload(
        &self,
        name: &str,
        entry: &ModelEntry,
        graph: &DependencyGraph,
        pending: &HashMap<String, Pending>,
    ) -> bool {
        entry.serving()
            && !pending.contains_key(name)
            && !self.pinned(name, entry)
            && !in_use(entry)
            && graph.callers(name).is_empty()
    }

    /// The models that may be unloaded now, least recently used first (see
    /// [`Repository::may_unload`]), leaving out those another change is
    /// loading or unloading and those in `except`.
    fn evictable(&self, except: &BTreeSet<String>) -> Vec<(u64, String)> {
        let busy = self
            .control
            .lock()
            .expect("control lock poisoned: nothing panics while holding it")
            .busy
            .clone();
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let graph = serving_graph(&models);
        let pending = self.demand.pending.lock().expect("pending lock");
        let mut out: Vec<(u64, String)> = models
            .iter()
            .filter(|(n, e)| {
                !except.contains(*n)
                    && !busy.contains(*n)
                    && self.may_unload(n, e, &graph, &pending)
            })
            .map(|(n, _)| (self.demand.last_used(n), n.clone()))
            .collect();
        out.sort();
        out
    }

    /// The least recently used evictable model.
    #[cfg(test)]
    fn victim(&self) -> Option<String> {
        self.evictable(&BTreeSet::new())
            .into_iter()
            .next()
            .map(|(_, n)| n)
    }

    /// Unloads `name` for `why` (on behalf of `for_model` under the budget)
    /// if it still may be unloaded and was not used since `last_used`, the
    /// use it was chosen by; answers whether it was.
    fn evict(&self, name: &str, last_used: u64, why: Eviction, for_model: &str) -> bool {
        let reason = match why {
            Eviction::Idle => format!(
                "unloaded: idle for {} s (--model-idle-unload-secs)",
                self.options
                    .on_demand
                    .idle_unload
                    .unwrap_or_default()
                    .as_secs_f64()
            ),
            Eviction::MemoryBudget => {
                format!("evicted to fit '{for_model}' under --memory-budget")
            }
        };
        let begun = self.demand.evictions_begun.fetch_add(1, Ordering::SeqCst) + 1;
        let first = self.demand.evicting.fetch_add(1, Ordering::SeqCst) == 0;
        let loads = self.loads_reserved();
        let before = memory_in_use();
        let unloaded = self.unload_if_unused(name, &reason, |models| {
            let graph = serving_graph(models);
            let pending = self.demand.pending.lock().expect("pending lock");
            models
                .get(name)
                .is_some_and(|e| self.may_unload(name, e, &graph, &pending))
                && self.demand.last_used(name) == last_used
        });
        if unloaded {
            release_freed_memory();
        }
        let after = memory_in_use();
        self.demand.evicting.fetch_sub(1, Ordering::SeqCst);
        if !unloaded {
            tracing::debug!(
                model = name,
                "not unloaded: used, held or changed since it was chosen"
            );
            return false;
        }
        tracing::info!(
            model = name,
            "{reason} (process memory {} -> {})",
            mib(before),
            mib(after)
        );
        // Beside other evictions or loads the change is not this model's alone: kept out.
        let alone = first
            && loads.0 == 0
            && self.loads_reserved() == loads
            && self.demand.evictions_begun.load(Ordering::SeqCst) == begun;
        if alone {
            self.demand
                .cost
                .lock()
                .expect("cost lock")
                .insert(name.to_string(), before.saturating_sub(after));
        }
        *self
            .demand
            .evictions
            .lock()
            .expect("evictions lock")
            .entry((name.to_string(), why))
            .or_default() += 1;
        true
    }

    /// What the loads in progress reserved, and how many reservations were ever made.
    fn loads_reserved(&self) -> (u64, u64) {
        let r = self.demand.reserved.lock().expect("reserved lock");
        (r.bytes, r.made)
    }

    /// One sweep of the idle unloader: unloads every evictable model unused
    /// for `--model-idle-unload-secs`. Returns the models it unloaded.
    pub fn unload_idle(&self) -> Vec<String> {
        self.unload_idle_at(self.demand.now_us())
    }

    /// [`Repository::unload_idle`] as if it were `now` (µs since the epoch).
    fn unload_idle_at(&self, now: u64) -> Vec<String> {
        let Some(idle) = self.options.on_demand.idle_unload else {
            return Vec::new();
        };
        let limit = idle.as_micros() as u64;
        self.evictable(&BTreeSet::new())
            .into_iter()
            .filter(|(used, _)| now.saturating_sub(*used) >= limit)
            .filter(|(used, name)| self.evict(name, *used, Eviction::Idle, name))
            .map(|(_, n)| n)
            .collect()
    }

    /// Starts the idle unloader on a background thread until `stop` is set.
    pub fn spawn_idle_unloader(
        self: &Arc<Self>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Option<std::thread::JoinHandle<()>>> {
        let Some(idle) = self.options.on_demand.idle_unload else {
            return Ok(None);
        };
        let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let repo = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("idle-unload".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    let Some(repo) = repo.upgrade() else { break };
                    repo.unload_idle();
                }
            })
            .map(Some)
            .map_err(|e| Error::internal(format!("cannot start the idle-unload thread: {e}")))
    }

    /// Loads started on demand since the server started (failed ones too).
    pub fn loads_on_demand_total(&self) -> u64 {
        self.demand.loads.load(Ordering::Relaxed)
    }

    /// Unloads by idleness or the budget: (model, reason) -> count.
    pub fn evictions(&self) -> BTreeMap<(String, Eviction), u64> {
        self.demand
            .evictions
            .lock()
            .expect("evictions lock")
            .clone()
    }
}

/// Whether something holds one of the model's serving versions (a request,
/// a stream, the waiters of its load on demand) or it has an open sequence.
fn in_use(entry: &ModelEntry) -> bool {
    entry
        .handles()
        .any(|h| Arc::strong_count(h) > 1 || h.open_sequences() > 0)
}

/// Which serving model calls which (ensemble steps).
fn serving_graph(models: &BTreeMap<String, ModelEntry>) -> DependencyGraph {
    DependencyGraph::of(
        models
            .iter()
            .filter(|(_, e)| e.serving())
            .filter_map(|(n, e)| Some((n.as_str(), &**e.config.as_ref()?))),
    )
}

/// The memory the budget measures: the process's resident set, in host
/// memory (memory a model takes on a GPU is not counted). (Not the
/// cgroup's usage: that counts the page cache and any other process in the
/// container, which would evict models for memory they do not use.)
pub fn memory_in_use() -> u64 {
    resident_set()
}

/// The process's resident set in bytes (`/proc/self/statm`).
pub fn resident_set() -> u64 {
    // SAFETY: sysconf only reads a system setting.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

/// The memory a percentage budget is of, under the file system root `root`
/// (`/`; a fake tree in tests): the smallest memory limit of the process's
/// cgroup and its ancestors, and physical memory (`MemTotal`).
fn total_memory(root: &Path) -> Option<u64> {
    [cgroup_limit(root), physical_memory(root)]
        .into_iter()
        .flatten()
        .min()
}

/// The smallest memory limit set on the process's cgroup or an ancestor
/// of it: the cgroup is read from `/proc/self/cgroup` (v2: the `0::<path>`
/// line, under `/sys/fs/cgroup`, file `memory.max`; v1: the line of the
/// `memory` controller, under `/sys/fs/cgroup/memory`, file
/// `memory.limit_in_bytes`), then that folder and each one above it up to
/// the mount are read (under systemd the limit is on the service's cgroup
/// or a slice above it, not at the mount's root).
fn cgroup_limit(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    let mut limits = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (mount, file) = if id == "0" && controllers.is_empty() {
            (root.join("sys/fs/cgroup"), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("sys/fs/cgroup/memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = mount.join(path.trim_start_matches('/'));
        loop {
            limits.extend(read_u64(&dir.join(file)));
            if dir == mount || !dir.pop() || !dir.starts_with(&mount) {
                break;
            }
        }
    }
    // "max" (v2) does not parse; v1 writes "no limit" as a huge number.
    limits.into_iter().filter(|l| *l < (1 << 60)).min()
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Physical memory in bytes (`MemTotal` of `/proc/meminfo`).
fn physical_memory(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/meminfo")).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Parses `--memory-budget`: bytes (with an optional K/M/G/Ki/Mi/Gi
/// suffix) or `N%` of the cgroup's memory limit (the smallest on the
/// process's cgroup and its ancestors), at most of physical memory.
pub fn parse_budget(text: &str) -> Result<u64> {
    let t = text.trim();
    let bad = || {
        Error::invalid_arg(format!(
            "--memory-budget must be bytes (e.g. 8000000000, 8G, 512Mi) or a percentage (e.g. 80%), got '{text}'"
        ))
    };
    if let Some(pct) = t.strip_suffix('%') {
        let pct: f64 = pct.trim().parse().map_err(|_| bad())?;
        if !(pct > 0.0 && pct <= 100.0) {
            return Err(bad());
        }
        let total = total_memory(Path::new("/")).ok_or_else(|| {
            Error::invalid_arg(
                "--memory-budget as a percentage needs the cgroup's memory limit or /proc/meminfo, and neither is readable",
            )
        })?;
        return Ok((total as f64 * pct / 100.0) as u64);
    }
    parse_bytes("--memory-budget", t).map_err(|_| bad())
}

/// Parses a size flag: bytes with an optional K/M/G (powers of 1000) or
/// Ki/Mi/Gi (powers of 1024) suffix, more than zero.
pub fn parse_bytes(flag: &str, text: &str) -> Result<u64> {
    let t = text.trim();
    let bad = || {
        Error::invalid_arg(format!(
            "{flag} must be bytes (e.g. 8000000000, 8G, 512Mi), got '{text}'"
        ))
    };
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "k" | "KB" => 1000,
        "M" | "MB" => 1000 * 1000,
        "G" | "GB" => 1000 * 1000 * 1000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).filter(|b| *b > 0).ok_or_else(bad)
}

fn folder_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => folder_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Hands memory freed by an unload back to the system, so the next
/// measurement sees it gone (glibc keeps freed heap otherwise).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RepositoryOptions, State};
    use super::*;
    use crate::repository::control::ControlMode;

    fn identity(root: &Path, name: &str, pinned: bool) {
        std::fs::create_dir_all(root.join(name).join("1")).unwrap();
        let pin = if pinned {
            r#"parameters { key: "tern_pinned" value { string_value: "true" } }"#
        } else {
            ""
        };
        std::fs::write(
            root.join(name).join("config.pbtxt"),
            format!(
                r#"name: "{name}" backend: "identity" max_batch_size: 4
                input [{{name: "X" data_type: TYPE_INT32 dims: [2]}}]
                output [{{name: "Y" data_type: TYPE_INT32 dims: [2]}}] {pin}"#
            ),
        )
        .unwrap();
    }

    fn repository(root: &Path, on_demand: OnDemandOptions) -> Arc<Repository> {
        for (name, pinned) in [
            ("a", false),
            ("b", false),
            ("c", false),
            ("p", true),
            ("s", false),
        ] {
            identity(root, name, pinned);
        }
        let repo = Repository::new(
            RepositoryOptions {
                roots: vec![root.to_path_buf()],
                load_threads: 1,
                on_demand,
                ..Default::default()
            },
            tern_core::router::unrouted(),
        );
        assert!(repo
            .load_startup(ControlMode::Explicit, &["s".into()])
            .unwrap()
            .is_empty());
        repo
    }

    /// Loads `name` on demand and waits for the shared load's result.
    fn load(repo: &Arc<Repository>, name: &str) -> Result<()> {
        loaded(repo, name).map(drop)
    }

    /// As [`load`], answering the handles the load hands its waiters.
    fn loaded(repo: &Arc<Repository>, name: &str) -> Loaded {
        let mut rx = repo.load_shared(name);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let result = rt.block_on(async { rx.wait_for(|r| r.is_some()).await.unwrap().clone() });
        // The load's thread lets go of the channel (and the handles in it) just after.
        while rx.has_changed().is_ok() {
            std::thread::sleep(Duration::from_millis(1));
        }
        result.unwrap()
    }

    fn reason(repo: &Repository, name: &str) -> (State, String) {
        let rows = repo.index_with_unloaded();
        let row = rows.iter().find(|r| r.name == name).unwrap();
        (row.state, row.reason.clone())
    }

    fn idle_after(limit: Duration) -> OnDemandOptions {
        OnDemandOptions {
            enabled: true,
            idle_unload: Some(limit),
            budget: None,
        }
    }

    #[test]
    fn idle_models_unload_unless_pinned_or_in_use() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(t.path(), idle_after(Duration::from_secs(60)));
        for m in ["a", "b", "p"] {
            load(&repo, m).unwrap();
        }
        assert_eq!(repo.loads_on_demand_total(), 3);
        assert!(repo.unload_idle().is_empty(), "nothing idle yet");
        let in_flight = repo.get("b", None).unwrap();
        // A sweep 61 s from now.
        let later = repo.demand.now_us() + 61_000_000;
        assert_eq!(repo.unload_idle_at(later), ["a"]);
        assert_eq!(
            reason(&repo, "a"),
            (
                State::Unavailable,
                "unloaded: idle for 60 s (--model-idle-unload-secs)".into()
            )
        );
        for serving in ["b", "p", "s"] {
            assert!(repo.get(serving, None).is_ok(), "{serving} stays");
        }
        drop(in_flight);
        repo.touch("s");
        assert_eq!(repo.unload_idle_at(later), ["b"], "'s' and 'p' are pinned");
        assert_eq!(repo.evictions()[&("a".to_string(), Eviction::Idle)], 1);
        assert!(repo.loads_on_demand("a") && !repo.loads_on_demand("p"));
        assert!(!repo.loads_on_demand("nope") && !repo.loads_on_demand("../a"));
        // A load through the API is a use too.
        let before = repo.demand.now_us();
        assert!(repo.demand.last_used("a") < before);
        repo.load_model("a", Default::default()).unwrap();
        assert!(repo.demand.last_used("a") >= before, "'a' was just loaded");
    }

    #[test]
    fn an_eviction_is_abandoned_when_the_model_was_taken_after_it_was_chosen() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(t.path(), idle_after(Duration::from_secs(60)));
        load(&repo, "a").unwrap();
        let chosen = repo.evictable(&BTreeSet::new());
        let (last, victim) = chosen.first().cloned().unwrap();
        assert_eq!(victim, "a");
        // A request resolves the model between the choice and the unload.
        let request = repo.get("a", None).unwrap();
        assert!(!repo.evict("a", last, Eviction::Idle, "a"));
        assert!(repo.get("a", None).is_ok() && request.config.name == "a");
        drop(request);
        // A request that came and went: the use is newer than the choice.
        std::thread::sleep(Duration::from_millis(2));
        repo.touch("a");
        assert!(!repo.evict("a", last, Eviction::Idle, "a"));
        // Another change (an API reload) holds the model: left alone.
        repo.control.lock().unwrap().busy.insert("a".into());
        assert!(repo.evictable(&BTreeSet::new()).is_empty());
        let last = repo.demand.last_used("a");
        assert!(!repo.evict("a", last, Eviction::Idle, "a"));
        repo.control.lock().unwrap().busy.remove("a");
        assert!(repo.evict("a", last, Eviction::Idle, "a"));
        assert!(repo.get("a", None).is_err());
        assert_eq!(repo.evictions().len(), 1);
    }

    #[test]
    fn the_waiters_of_a_load_hold_the_model_until_they_run() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(t.path(), idle_after(Duration::from_secs(60)));
        let handles = loaded(&repo, "a").unwrap();
        assert_eq!(handles[0].config.name, "a");
        let later = repo.demand.now_us() + 61_000_000;
        assert!(repo.unload_idle_at(later).is_empty(), "held by its waiters");
        drop(handles);
        assert_eq!(repo.unload_idle_at(later), ["a"]);
    }

    #[test]
    fn a_failed_load_is_answered_again_until_its_folder_changes() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(t.path(), idle_after(Duration::from_secs(60)));
        let config = t.path().join("bad/config.pbtxt");
        std::fs::create_dir_all(t.path().join("bad/1")).unwrap();
        std::fs::write(&config, r#"name: "bad" backend: "nope""#).unwrap();
        let e = load(&repo, "bad").unwrap_err();
        assert!(
            e.message
                .starts_with("loading model 'bad' on demand failed: "),
            "{e}"
        );
        assert!(
            !e.message.contains("load failed for model"),
            "said once: {e}"
        );
        let again = load(&repo, "bad").unwrap_err();
        assert!(again.message.starts_with(&e.message), "{again}");
        assert!(again.message.contains("s ago"), "{again}");
        assert_eq!(repo.loads_on_demand_total(), 1, "not loaded again");
        std::fs::write(&config, r#"name: "bad"  backend: "nope2""#).unwrap();
        assert!(load(&repo, "bad").is_err());
        assert_eq!(repo.loads_on_demand_total(), 2, "the folder changed");
        std::fs::write(&config, r#"name: "bad" backend: "identity" max_batch_size: 4 input [{name: "X" data_type: TYPE_INT32 dims: [2]}] output [{name: "Y" data_type: TYPE_INT32 dims: [2]}]"#).unwrap();
        load(&repo, "bad").unwrap();
        assert!(repo.demand.failures.lock().unwrap().is_empty());
    }

    #[test]
    fn a_load_that_ends_without_a_result_still_answers_and_is_no_longer_pending() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(t.path(), OnDemandOptions::default());
        let (tx, mut rx) = tokio::sync::watch::channel(None);
        repo.demand
            .pending
            .lock()
            .unwrap()
            .insert("a".into(), rx.clone());
        drop(PendingLoad {
            repo: repo.clone(),
            name: "a".into(),
            tx: Some(tx),
        });
        assert!(!repo.demand.is_pending("a"));
        let e = rx.borrow_and_update().clone().unwrap().err().unwrap();
        assert!(e.message.contains("stopped without a result"), "{e}");
    }

    #[test]
    fn a_load_over_the_budget_evicts_the_least_recently_used_then_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(
            t.path(),
            OnDemandOptions {
                enabled: true,
                idle_unload: None,
                budget: Some(u64::MAX / 2),
            },
        );
        for m in ["a", "b", "p"] {
            load(&repo, m).unwrap();
        }
        repo.touch("b");
        std::thread::sleep(Duration::from_millis(2));
        repo.touch("a");
        assert_eq!(repo.victim().as_deref(), Some("b"), "least recently used");
        let in_flight = repo.get("a", None).unwrap();
        // Nothing fits a budget of one byte: every evictable model goes, then the load is refused.
        assert!(repo.make_room("c", 1).is_err());
        let e = repo.make_room("c", 1).err().unwrap();
        assert!(
            e.message
                .starts_with("cannot load model 'c' on demand: it needs about"),
            "{e}"
        );
        assert!(
            e.message.contains("'a' (") && e.message.contains("in use"),
            "{e}"
        );
        assert!(e.message.contains("pinned"), "{e}");
        assert_eq!(
            reason(&repo, "b"),
            (
                State::Unavailable,
                "evicted to fit 'c' under --memory-budget".into()
            )
        );
        assert!(repo.get("a", None).is_ok(), "a request in flight keeps it");
        drop(in_flight);
        assert_eq!(
            repo.evictions().keys().collect::<Vec<_>>(),
            [&("b".to_string(), Eviction::MemoryBudget)]
        );
        // A reservation holds its room until the load is done.
        let budget = memory_in_use() + (64 << 20);
        let first = repo.make_room("c", budget).unwrap();
        assert_eq!(repo.demand.reserved.lock().unwrap().bytes, first.bytes);
        assert!(first.alone());
        let second = repo.make_room("b", budget).unwrap();
        assert!(!first.alone() && !second.alone(), "measured together");
        drop((first, second));
        assert_eq!(repo.demand.reserved.lock().unwrap().bytes, 0);
        // An eviction's measure never takes the estimate below the folder's size.
        repo.demand.cost.lock().unwrap().insert("a".into(), 0);
        assert!(repo.estimate("a") >= folder_size(&t.path().join("a")));
        assert!(repo.estimate("a") > 0);
    }

    #[test]
    fn a_request_waits_for_a_load_on_demand_only_within_its_timeout() {
        let t = tempfile::tempdir().unwrap();
        repository(t.path(), OnDemandOptions::default()).shutdown();
        let infer = crate::infer::Infer::new(RepositoryOptions {
            roots: vec![t.path().to_path_buf()],
            load_threads: 1,
            on_demand: OnDemandOptions {
                enabled: true,
                ..Default::default()
            },
            ..Default::default()
        });
        let repo = infer.repository().clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        // Another change holds the control lock: the load cannot finish yet.
        let control = repo.control.lock().unwrap();
        let wait = || Some(Duration::from_millis(30));
        let e = rt.block_on(infer.resolve("a", None, wait)).err().unwrap();
        assert_eq!(
            e.message,
            "model 'a' is loading on demand and was not ready within the request's \
             timeout of 30 ms; the load goes on"
        );
        drop(control);
        let target = rt.block_on(infer.resolve("a", None, || None)).unwrap();
        assert_eq!(target.model().config.name, "a");
        assert_eq!(repo.loads_on_demand_total(), 1, "the first request's load");
        repo.shutdown();
    }

    #[test]
    fn budgets_parse_as_bytes_or_a_percentage() {
        assert_eq!(parse_budget("1000").unwrap(), 1000);
        assert_eq!(parse_budget("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse_budget("512Mi").unwrap(), 512 << 20);
        let half = parse_budget("50%").unwrap();
        assert!(half > 0 && half < parse_budget("100%").unwrap());
        for bad in ["", "0", "x", "10Q", "0%", "101%", "-5"] {
            let e = parse_budget(bad).unwrap_err();
            assert!(e.message.contains("--memory-budget"), "{bad}: {e}");
        }
        assert!(resident_set() > 0 && memory_in_use() > 0);
        assert_eq!(
            parse_bytes("--wasm-cache-max-size", "2Gi").unwrap(),
            2 << 30
        );
        let e = parse_bytes("--wasm-cache-max-size", "50%").unwrap_err();
        assert_eq!(
            e.message,
            "--wasm-cache-max-size must be bytes (e.g. 8000000000, 8G, 512Mi), got '50%'"
        );
    }

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn the_cgroup_limit_is_the_smallest_on_the_process_cgroup_and_above() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        write(
            root,
            "proc/meminfo",
            "MemTotal:       16384000 kB\nMemFree: 1 kB\n",
        );
        assert_eq!(total_memory(root), Some(16384000 * 1024), "no cgroup file");
        // cgroup v2 under systemd: the limit is on the service, not the mount's root.
        write(root, "proc/self/cgroup", "0::/system.slice/tern.service\n");
        write(
            root,
            "sys/fs/cgroup/system.slice/tern.service/memory.max",
            "max\n",
        );
        assert_eq!(cgroup_limit(root), None, "no limit set");
        write(
            root,
            "sys/fs/cgroup/system.slice/memory.max",
            "4000000000\n",
        );
        assert_eq!(cgroup_limit(root), Some(4_000_000_000), "a slice above");
        write(
            root,
            "sys/fs/cgroup/system.slice/tern.service/memory.max",
            "2000000000\n",
        );
        assert_eq!(total_memory(root), Some(2_000_000_000), "the smallest");
        // Larger than physical memory: physical memory.
        write(
            root,
            "sys/fs/cgroup/system.slice/tern.service/memory.max",
            "99999999999999\n",
        );
        write(root, "sys/fs/cgroup/system.slice/memory.max", "max\n");
        assert_eq!(total_memory(root), Some(16384000 * 1024));
        // A container's namespace: its cgroup is the mount's root.
        write(root, "proc/self/cgroup", "0::/\n");
        write(root, "sys/fs/cgroup/memory.max", "1000000000\n");
        assert_eq!(cgroup_limit(root), Some(1_000_000_000));
        // cgroup v1: the memory controller's line, its no-limit value ignored.
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        write(
            root,
            "proc/self/cgroup",
            "12:cpu,cpuacct:/user.slice\n4:memory:/user.slice/app\n1:name=systemd:/x\n",
        );
        let v1 = "sys/fs/cgroup/memory";
        write(
            root,
            &format!("{v1}/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        assert_eq!(cgroup_limit(root), None);
        write(
            root,
            &format!("{v1}/user.slice/memory.limit_in_bytes"),
            "3000000000\n",
        );
        write(
            root,
            &format!("{v1}/user.slice/app/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        assert_eq!(cgroup_limit(root), Some(3_000_000_000));
        assert_eq!(total_memory(root), Some(3_000_000_000), "no meminfo");
    }
}
