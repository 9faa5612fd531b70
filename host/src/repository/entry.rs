//! One model's place in the repository: the lifecycle state of each of its
//! versions — `Loading`, `Ready`, `Failed`, `Unloading`, `Unloaded` — from
//! which the repository index rows are derived, plus where the model was
//! loaded from. Every change of a model's state goes through the methods
//! here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::{IndexEntry, State};
use crate::scheduler::ModelHandle;
use tern_core::backend::Progress;
use tern_core::config::ModelConfig;

/// The index reason of an unloaded model.
pub(super) const UNLOADED: &str = "unloaded";

/// Where a loaded model came from.
pub(super) struct Origin {
    /// The model folder.
    pub dir: PathBuf,
    /// Fingerprint of the folder when it was loaded (poll mode compares it).
    pub fingerprint: u64,
    /// Fingerprint of everything but the config files (an unchanged one allows in-place instance changes).
    pub content: u64,
    /// The API load's config override, kept for dependent reloads.
    pub config: Option<String>,
    /// The private folder holding files delivered over the API (removed with the model).
    pub temp: Option<Arc<tempfile::TempDir>>,
}

/// The lifecycle state of one version.
pub(super) enum VersionState {
    /// Being loaded; the progress names what the load is doing.
    Loading(Progress),
    /// Serving; `load_secs` is how long the load took.
    Ready {
        handle: Arc<ModelHandle>,
        load_secs: f64,
    },
    /// The load failed, for this reason.
    Failed(String),
    /// Being unloaded: in-flight requests finish.
    Unloading,
    /// Unloaded.
    Unloaded,
}

/// A model known to the repository.
#[derive(Default)]
pub(super) struct ModelEntry {
    /// The config of the current load (kept when no version is ready).
    pub config: Option<Arc<ModelConfig>>,
    /// Where the current load came from.
    pub origin: Option<Origin>,
    /// Fingerprint of the folder whose load failed, when nothing serves
    /// (polling retries after it changes).
    pub failed: Option<u64>,
    /// Per version; `None` is the model as a whole, before it has versions
    /// (loading, or failed before a version was tried).
    versions: BTreeMap<Option<i64>, VersionState>,
    /// Why the latest load failed while the ready versions keep serving.
    stale: Option<String>,
    /// Why the model was unloaded, when not by the unload API (idleness, the memory budget).
    unloaded_because: Option<String>,
}

impl ModelEntry {
    /// A new load's entry, before any version is tried.
    pub fn new(config: Arc<ModelConfig>, origin: Origin) -> ModelEntry {
        ModelEntry {
            config: Some(config),
            origin: Some(origin),
            ..Default::default()
        }
    }

    /// Whether any version serves.
    pub fn serving(&self) -> bool {
        self.handles().next().is_some()
    }

    /// The serving handles, by ascending version.
    pub fn handles(&self) -> impl DoubleEndedIterator<Item = &Arc<ModelHandle>> {
        self.versions.values().filter_map(|s| match s {
            VersionState::Ready { handle, .. } => Some(handle),
            _ => None,
        })
    }

    /// The serving handle of `version` (`None` = the highest ready version).
    pub fn handle(&self, version: Option<i64>) -> Option<&Arc<ModelHandle>> {
        match version {
            Some(v) => match self.versions.get(&Some(v)) {
                Some(VersionState::Ready { handle, .. }) => Some(handle),
                _ => None,
            },
            None => self.handles().next_back(),
        }
    }

    /// The versions that serve, ascending.
    pub fn ready_versions(&self) -> Vec<i64> {
        self.handles().map(|h| h.version).collect()
    }

    /// How long each ready version took to load: (version, seconds).
    pub fn load_secs(&self) -> impl Iterator<Item = (i64, f64)> + '_ {
        self.versions.iter().filter_map(|(v, s)| match (v, s) {
            (Some(v), VersionState::Ready { load_secs, .. }) => Some((*v, *load_secs)),
            _ => None,
        })
    }

    /// Whether every version serves (none loading, failed or unloading).
    pub fn all_ready(&self) -> bool {
        self.versions
            .values()
            .all(|s| matches!(s, VersionState::Ready { .. }))
    }

    /// Whether the model needs nothing more for the server to be ready:
    /// every version serves, or the model was unloaded on purpose.
    pub fn settled(&self) -> bool {
        self.versions
            .values()
            .all(|s| matches!(s, VersionState::Ready { .. } | VersionState::Unloaded))
    }

    /// The index rows of this model.
    pub fn rows(&self, name: &str) -> Vec<IndexEntry> {
        self.versions
            .iter()
            .map(|(version, s)| {
                let (state, reason) = match s {
                    VersionState::Loading(p) => (State::Loading, p.describe()),
                    VersionState::Ready { .. } => (
                        State::Ready,
                        self.stale.as_ref().map_or_else(String::new, |r| {
                            format!(
                                "serving the previously loaded version; the latest load failed: {r}"
                            )
                        }),
                    ),
                    VersionState::Failed(r) => (State::Unavailable, r.clone()),
                    VersionState::Unloading => (State::Unloading, String::new()),
                    VersionState::Unloaded => (
                        State::Unavailable,
                        self.unloaded_because
                            .clone()
                            .unwrap_or_else(|| UNLOADED.to_string()),
                    ),
                };
                IndexEntry {
                    name: name.to_string(),
                    version: *version,
                    state,
                    reason,
                }
            })
            .collect()
    }

    /// Why `version` (`None` = any) does not serve, if the index says.
    pub fn not_ready_reason(&self, name: &str, version: Option<i64>) -> Option<String> {
        self.rows(name)
            .into_iter()
            .find(|r| version.is_none() || r.version == version)
            .filter(|r| r.state != State::Ready)
            .map(|r| r.reason)
    }

    /// A load begins: the model shows as loading, with the returned
    /// progress as its reason, unless it serves already (then it keeps its
    /// rows until the new versions replace them).
    pub fn begin_load(&mut self) -> Progress {
        let progress = Progress::default();
        if !self.serving() {
            self.versions = BTreeMap::from([(None, VersionState::Loading(progress.clone()))]);
        }
        progress
    }

    /// A version of a new load serves.
    pub fn loaded(&mut self, handle: ModelHandle, load_secs: f64) {
        let version = handle.version;
        self.versions.insert(
            Some(version),
            VersionState::Ready {
                handle: Arc::new(handle),
                load_secs,
            },
        );
    }

    /// A version (`None` = the model as a whole) of a new load failed.
    pub fn load_failed(&mut self, version: Option<i64>, reason: &str) {
        self.versions
            .insert(version, VersionState::Failed(reason.to_string()));
    }

    /// Whether no version of a new load was tried.
    pub fn untried(&self) -> bool {
        self.versions.is_empty()
    }

    /// A load failed: a serving model keeps serving (and says why its
    /// latest load failed); otherwise the whole model is failed.
    pub fn failed_load(&mut self, reason: &str) {
        if self.serving() {
            self.stale = Some(reason.to_string());
        } else {
            self.versions = BTreeMap::from([(None, VersionState::Failed(reason.to_string()))]);
        }
    }

    /// The same versions now serve through `handles` (instances adjusted in place).
    pub fn resized(&mut self, handles: BTreeMap<i64, Arc<ModelHandle>>) {
        for (v, handle) in handles {
            if let Some(VersionState::Ready { handle: h, .. }) = self.versions.get_mut(&Some(v)) {
                *h = handle;
            }
        }
        self.stale = None;
    }

    /// An unload begins: every version is unloading; returns the handles
    /// that served, for the caller to drain and stop.
    pub fn begin_unload(&mut self) -> Vec<Arc<ModelHandle>> {
        let mut handles = Vec::new();
        for s in self.versions.values_mut() {
            if let VersionState::Ready { handle, .. } =
                std::mem::replace(s, VersionState::Unloading)
            {
                handles.push(handle);
            }
        }
        self.stale = None;
        handles
    }

    /// The unload is over: every version is unloaded and the model forgets
    /// its config and origin.
    pub fn finish_unload(&mut self, because: Option<&str>) {
        for s in self.versions.values_mut() {
            *s = VersionState::Unloaded;
        }
        self.unloaded_because = because.map(str::to_string);
        self.config = None;
        self.origin = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(e: &ModelEntry) -> Vec<(Option<i64>, State, String)> {
        e.rows("m")
            .into_iter()
            .map(|r| (r.version, r.state, r.reason))
            .collect()
    }

    #[test]
    fn index_rows_follow_the_version_states() {
        let mut e = ModelEntry::default();
        e.begin_load().set("compiling the plugin");
        assert_eq!(
            rows(&e),
            [(
                None,
                State::Loading,
                "loading: compiling the plugin, 0 s".into()
            )]
        );
        assert!(!e.settled() && !e.serving());
        e.failed_load("bad config");
        assert_eq!(rows(&e), [(None, State::Unavailable, "bad config".into())]);
        let mut e = ModelEntry::default();
        e.load_failed(Some(2), "no such file");
        assert!(!e.untried() && !e.all_ready());
        assert_eq!(
            e.not_ready_reason("m", Some(2)).as_deref(),
            Some("no such file")
        );
        assert_eq!(e.not_ready_reason("m", Some(3)), None);
        let _ = e.begin_unload();
        assert_eq!(rows(&e), [(Some(2), State::Unloading, String::new())]);
        e.finish_unload(None);
        assert_eq!(rows(&e), [(Some(2), State::Unavailable, UNLOADED.into())]);
        e.finish_unload(Some("unloaded: idle for 5 s"));
        assert_eq!(
            rows(&e),
            [(Some(2), State::Unavailable, "unloaded: idle for 5 s".into())]
        );
        assert!(e.settled() && e.config.is_none());
    }
}
