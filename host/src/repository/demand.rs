//! Models loaded on demand within a memory budget (explicit mode with
//! `--model-load-on-demand`): a request for a model that is in the
//! repository but not loaded starts one load that every concurrent request
//! for it shares; `--model-idle-unload-secs` unloads models nobody used for
//! that long; `--memory-budget` evicts the least recently used unpinned
//! models before a load would take the process past the budget, and refuses
//! a load that cannot fit. This module owns that policy: when each model was
//! last used, what each load cost, which models are pinned, why a model was
//! unloaded, and the counters the metrics show. Unloading itself goes
//! through the repository's one unload path, which lets in-flight requests
//! finish; a model with requests in flight is never chosen.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::graph::DependencyGraph;
use super::Repository;
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

/// How long a load under the budget waits for busy models to become evictable before it is refused.
const BUSY_WAIT: Duration = if cfg!(test) {
    Duration::from_millis(200)
} else {
    Duration::from_secs(10)
};

/// The load whose result concurrent requests for one model wait on.
type Pending = tokio::sync::watch::Receiver<Option<Result<()>>>;

/// The state of loading on demand (see the module doc).
#[derive(Default)]
pub(super) struct Demand {
    /// Loads in progress, by model: every request for the model waits on the same one.
    pending: Mutex<HashMap<String, Pending>>,
    /// When each model was last used, in microseconds since `epoch`.
    used: RwLock<HashMap<String, Arc<AtomicU64>>>,
    epoch: Option<Instant>,
    /// What loading each model last cost, in bytes of process memory.
    cost: Mutex<HashMap<String, u64>>,
    /// Models pinned by `--load-model`.
    pinned: Mutex<BTreeSet<String>>,
    /// Serialises loads under a budget, so each load's cost is measured alone.
    budget_lock: Mutex<()>,
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
        self.now_us()
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
            && self.options.roots.iter().any(|r| r.join(name).is_dir())
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
    /// receiver its result arrives on.
    pub fn load_shared(self: &Arc<Self>, name: &str) -> Pending {
        let mut pending = self.demand.pending.lock().expect("pending lock");
        if let Some(rx) = pending.get(name) {
            return rx.clone();
        }
        let (tx, rx) = tokio::sync::watch::channel(None);
        pending.insert(name.to_string(), rx.clone());
        drop(pending);
        let (repo, model) = (self.clone(), name.to_string());
        let spawned = std::thread::Builder::new()
            .name(format!("load-{name}"))
            .spawn(move || {
                let result = repo.load_demanded(&model);
                repo.demand
                    .pending
                    .lock()
                    .expect("pending lock")
                    .remove(&model);
                let _ = tx.send(Some(result));
            });
        if let Err(e) = spawned {
            self.demand
                .pending
                .lock()
                .expect("pending lock")
                .remove(name);
            let (tx, rx) = tokio::sync::watch::channel(None);
            let _ = tx.send(Some(Err(Error::internal(format!(
                "cannot start a thread to load model '{name}' on demand: {e}"
            )))));
            return rx;
        }
        rx
    }

    /// Loads `name` for a request: makes room under the budget first, then
    /// loads it and records what it cost.
    fn load_demanded(&self, name: &str) -> Result<()> {
        let started = Instant::now();
        let _serial = self
            .options
            .on_demand
            .budget
            .and_then(|_| self.budget_turn(name));
        if self.get(name, None).is_ok() {
            return Ok(());
        }
        if let Some(budget) = self.options.on_demand.budget {
            self.make_room(name, budget)?;
        }
        let before = memory_in_use();
        tracing::info!(model = name, "loading on demand");
        self.demand.loads.fetch_add(1, Ordering::Relaxed);
        self.load_model(name, Default::default()).map_err(|e| {
            Error::new(
                e.code,
                format!("loading model '{name}' on demand failed: {}", e.message),
            )
        })?;
        let after = memory_in_use();
        let cost = after.saturating_sub(before);
        self.demand
            .cost
            .lock()
            .expect("cost lock")
            .insert(name.to_string(), cost);
        self.demand.touch(name);
        tracing::info!(
            model = name,
            "loaded on demand in {:?} (process memory {} -> {})",
            started.elapsed(),
            mib(before),
            mib(after)
        );
        if let Some(budget) = self.options.on_demand.budget.filter(|b| after > *b) {
            // The estimate was short: bring the process back under the budget.
            while memory_in_use() > budget {
                let Some(victim) = self.victim(Some(name)) else {
                    tracing::warn!(
                        model = name,
                        "process memory {} is over --memory-budget {} and nothing more can be evicted",
                        mib(memory_in_use()),
                        mib(budget)
                    );
                    break;
                };
                self.evict(&victim, Eviction::MemoryBudget, name);
            }
        }
        Ok(())
    }

    /// This load's turn under the budget: waits for the load before it, up
    /// to [`BUSY_WAIT`]. Past that it goes on without its turn (measured
    /// alongside the other load), so a load whose warmup calls a model that
    /// is not loaded (a plugin's BLS call) cannot wait for itself forever.
    fn budget_turn(&self, name: &str) -> Option<std::sync::MutexGuard<'_, ()>> {
        let since = Instant::now();
        loop {
            match self.demand.budget_lock.try_lock() {
                Ok(turn) => return Some(turn),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if since.elapsed() < BUSY_WAIT => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    tracing::warn!(
                        model = name,
                        "loading on demand beside another load under --memory-budget \
                         that has run for {} s; their memory is measured together",
                        BUSY_WAIT.as_secs()
                    );
                    return None;
                }
            }
        }
    }

    /// Evicts least recently used models until `name`'s estimated cost fits
    /// under `budget`. While the models that could make room are busy
    /// (requests in flight, a load finishing) it waits for them, up to
    /// [`BUSY_WAIT`]; it refuses the load when nothing loaded can make room.
    fn make_room(&self, name: &str, budget: u64) -> Result<()> {
        let need = self.estimate(name);
        let waiting_since = Instant::now();
        loop {
            let used = memory_in_use();
            if used.saturating_add(need) <= budget {
                return Ok(());
            }
            if let Some(victim) = self.victim(Some(name)) {
                self.evict(&victim, Eviction::MemoryBudget, name);
                continue;
            }
            if self.busy_evictable(name) && waiting_since.elapsed() < BUSY_WAIT {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let loaded = self.resident_summary();
            return Err(Error::unavailable(format!(
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
            )));
        }
    }

    /// Whether a model other than `name` could be evicted once its requests
    /// (or its load) finish.
    fn busy_evictable(&self, name: &str) -> bool {
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
        models.iter().any(|(n, e)| {
            e.serving() && n != name && !self.pinned(n, e) && graph.callers(n).is_empty()
        })
    }

    /// What loading `name` is expected to cost: its last measured load, or
    /// else the size of its folder's files.
    fn estimate(&self, name: &str) -> u64 {
        if let Some(c) = self.demand.cost.lock().expect("cost lock").get(name) {
            return *c;
        }
        self.options
            .roots
            .iter()
            .map(|r| r.join(name))
            .find(|d| d.is_dir())
            .map_or(0, |d| folder_size(&d))
    }

    /// The loaded models with what each cost and why it stays, for a refusal.
    fn resident_summary(&self) -> Vec<String> {
        let models = self
            .models
            .read()
            .expect("models lock poisoned: nothing panics while holding it");
        let cost = self.demand.cost.lock().expect("cost lock");
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
                } else if e.handles().any(|h| Arc::strong_count(h) > 1) {
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

    fn pinned(&self, name: &str, entry: &super::ModelEntry) -> bool {
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

    /// The models that may be unloaded now, least recently used first:
    /// serving, unpinned, without requests in flight, not being loaded, not
    /// called by a serving ensemble, and not `except`.
    fn evictable(&self, except: Option<&str>) -> Vec<(u64, String)> {
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
        let pending = self.demand.pending.lock().expect("pending lock");
        let mut out: Vec<(u64, String)> = models
            .iter()
            .filter(|(n, e)| {
                e.serving()
                    && Some(n.as_str()) != except
                    && !pending.contains_key(*n)
                    && !self.pinned(n, e)
                    && e.handles().all(|h| Arc::strong_count(h) == 1)
                    && graph.callers(n).is_empty()
            })
            .map(|(n, _)| (self.demand.last_used(n), n.clone()))
            .collect();
        out.sort();
        out
    }

    /// The least recently used evictable model.
    fn victim(&self, except: Option<&str>) -> Option<String> {
        self.evictable(except).into_iter().next().map(|(_, n)| n)
    }

    /// Unloads `name` for `why` (on behalf of `for_model` under the budget).
    fn evict(&self, name: &str, why: Eviction, for_model: &str) {
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
        let before = memory_in_use();
        self.unload_because(name, &reason);
        release_freed_memory();
        let after = memory_in_use();
        tracing::info!(
            model = name,
            "{reason} (process memory {} -> {})",
            mib(before),
            mib(after)
        );
        // What the unload gave back is the better estimate of what the model
        // takes: its first load's measurement includes one-time costs (a
        // backend's runtime initialising), and memory the allocator keeps
        // is what the next load reuses.
        let freed = before.saturating_sub(after);
        self.demand
            .cost
            .lock()
            .expect("cost lock")
            .entry(name.to_string())
            .and_modify(|c| *c = (*c).min(freed))
            .or_insert(freed);
        *self
            .demand
            .evictions
            .lock()
            .expect("evictions lock")
            .entry((name.to_string(), why))
            .or_default() += 1;
    }

    /// One sweep of the idle unloader: unloads every evictable model unused
    /// for `--model-idle-unload-secs`. Returns the models it unloaded.
    pub fn unload_idle(&self) -> Vec<String> {
        let Some(idle) = self.options.on_demand.idle_unload else {
            return Vec::new();
        };
        let now = self.demand.now_us();
        let limit = idle.as_micros() as u64;
        let idle: Vec<String> = self
            .evictable(None)
            .into_iter()
            .filter(|(used, _)| now.saturating_sub(*used) >= limit)
            .map(|(_, n)| n)
            .collect();
        for name in &idle {
            self.evict(name, Eviction::Idle, name);
        }
        idle
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

/// The memory the budget measures: the process's resident set. (Not the
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

/// The cgroup's memory limit, when one is set (v2 `memory.max`, v1 `memory.limit_in_bytes`).
fn cgroup_limit() -> Option<u64> {
    read_u64("/sys/fs/cgroup/memory.max")
        .or_else(|| read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .filter(|l| *l < (1 << 60))
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Physical memory in bytes (`MemTotal` of `/proc/meminfo`).
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Parses `--memory-budget`: bytes (with an optional K/M/G/Ki/Mi/Gi
/// suffix) or `N%` of the cgroup's limit, else of physical memory.
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
        let total = cgroup_limit().or_else(physical_memory).ok_or_else(|| {
            Error::invalid_arg(
                "--memory-budget as a percentage needs the cgroup's memory limit or /proc/meminfo, and neither is readable",
            )
        })?;
        return Ok((total as f64 * pct / 100.0) as u64);
    }
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
        let mut rx = repo.load_shared(name);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let result = rt.block_on(async { rx.wait_for(|r| r.is_some()).await.unwrap().clone() });
        result.unwrap()
    }

    fn reason(repo: &Repository, name: &str) -> (State, String) {
        let rows = repo.index_with_unloaded();
        let row = rows.iter().find(|r| r.name == name).unwrap();
        (row.state, row.reason.clone())
    }

    #[test]
    fn idle_models_unload_unless_pinned_or_in_use() {
        let t = tempfile::tempdir().unwrap();
        let repo = repository(
            t.path(),
            OnDemandOptions {
                enabled: true,
                idle_unload: Some(Duration::from_millis(100)),
                budget: None,
            },
        );
        for m in ["a", "b", "p"] {
            load(&repo, m).unwrap();
        }
        assert_eq!(repo.loads_on_demand_total(), 3);
        assert!(repo.unload_idle().is_empty(), "nothing idle yet");
        let in_flight = repo.get("b", None).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(repo.unload_idle(), ["a"]);
        assert_eq!(
            reason(&repo, "a"),
            (
                State::Unavailable,
                "unloaded: idle for 0.1 s (--model-idle-unload-secs)".into()
            )
        );
        for serving in ["b", "p", "s"] {
            assert!(repo.get(serving, None).is_ok(), "{serving} stays");
        }
        drop(in_flight);
        repo.touch("s");
        assert_eq!(repo.unload_idle(), ["b"], "'s' and 'p' are pinned");
        assert_eq!(repo.evictions()[&("a".to_string(), Eviction::Idle)], 1);
        assert!(repo.loads_on_demand("a") && !repo.loads_on_demand("p"));
        assert!(!repo.loads_on_demand("nope") && !repo.loads_on_demand("../a"));
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
        assert_eq!(
            repo.victim(None).as_deref(),
            Some("b"),
            "least recently used"
        );
        let in_flight = repo.get("a", None).unwrap();
        // Nothing fits a budget of one byte: every evictable model goes, then the load is refused.
        assert!(repo.make_room("c", 1).is_err());
        let e = repo.make_room("c", 1).unwrap_err();
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
    }
}
