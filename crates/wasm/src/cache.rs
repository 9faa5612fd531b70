//! The `.cwasm` cache: components compiled once and stored as
//! `<BLAKE3 of the component>-<engine compatibility hash>.cwasm` under
//! `--wasm-cache-dir`, so a restart with a warm cache deserialises instead
//! of recompiling. A different wasmtime build or engine configuration gives
//! a different file name; an unreadable or corrupt entry is recompiled and
//! rewritten. Without a cache directory everything still works, slower.
//!
//! An entry is native code that is loaded without the sandbox's checks, so
//! the server loads only entries it (or `tern plugin compile`) wrote: each
//! entry has a seal, `<entry>.seal`, the keyed BLAKE3 digest of its code
//! under a key kept outside the cache folder (`<cache folder>.key`, created
//! with mode 0600), and the entry, its seal and its folder must belong to
//! this user (or root) and be writable by no one else. An entry that fails
//! either check is refused with a warning and recompiled.
//!
//! The folder is bounded (`--wasm-cache-max-size`): before an entry is
//! written, the least recently used entries (a cache hit refreshes an
//! entry's time) are removed until the folder has room, and temporary files
//! left by writers that died are removed, so a device whose plugins change
//! does not fill its disk with code it no longer runs.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use wasmtime::component::Component;
use wasmtime::Engine;

use crate::Runtime;
use tern_core::error::{Error, Result};

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Already loaded for another model (the Python runner serves every
    /// Python model): the same compiled code, shared.
    Shared,
    /// Deserialised from the cache.
    Cache,
    /// Compiled now (and stored when a cache directory is set).
    Compiled,
}

/// A loaded component, shared by every model whose component has the same
/// bytes while any of them holds it.
pub type SharedComponent = Arc<Component>;

/// One component's place among the loaded ones: locked while it is being
/// loaded, holding it while any model does.
type Slot = Arc<Mutex<Weak<Component>>>;

/// The loaded components by cache key, so models loading the same component
/// in parallel compile it once and share the code.
fn loaded() -> &'static Mutex<HashMap<String, Slot>> {
    static LOADED: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

/// The cache file name for `bytes` compiled by an engine with cache tag
/// `tag` (architecture and memory layout, [`crate::Runtime::cache_tag`]).
/// The tag leaves out the CPU features the engine detected, so that a cache
/// precompiled for a device on another machine is found there; Wasmtime
/// checks when loading that the code needs nothing the CPU lacks.
pub fn key(tag: &str, bytes: &[u8]) -> String {
    // BLAKE3 rather than SHA-256: as collision resistant, and ~10x faster
    // without SHA instructions (a 19 MB componentize-py plugin hashed with
    // SHA-256 was a quarter of the warm start's CPU time).
    // The repairs applied before compiling are part of what the entry holds:
    // a new repair level recompiles components cached without it.
    let digest = blake3::Hasher::new()
        .update(crate::guest_fixes::LEVEL.as_bytes())
        .update(bytes)
        .finalize();
    format!("{}-{tag}.cwasm", digest.to_hex())
}

/// Compiles the component at `path` with `runtime` (which may target another
/// machine) into `cache_dir`, under the name that machine looks it up by.
/// Returns the cache entry and the compiled size.
pub fn precompile(runtime: &Runtime, path: &Path, cache_dir: &Path) -> Result<(PathBuf, usize)> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))?;
    let compiled = compile(&runtime.engine, path, &bytes)?;
    let entry = cache_dir.join(key(&runtime.cache_tag(), &bytes));
    store(&entry, &compiled, &seal_key(cache_dir)?).map_err(|e| {
        Error::internal(format!(
            "cannot write cache entry '{}': {e}",
            entry.display()
        ))
    })?;
    Ok((entry, compiled.len()))
}

fn compile(engine: &Engine, path: &Path, bytes: &[u8]) -> Result<Vec<u8>> {
    let (bytes, repairs) = crate::guest_fixes::repair(bytes);
    if repairs.pop_list_calls > 0 {
        tracing::info!(
            "'{}': repaired componentize-py's leak of the bytes a Python plugin hands to the host ({} call sites)",
            path.display(),
            repairs.pop_list_calls
        );
    }
    engine.precompile_component(&bytes).map_err(|e| {
        Error::invalid_arg(format!(
            "'{}' is not a valid WebAssembly component: {e:#}",
            path.display()
        ))
    })
}

/// Loads the component `bytes` (read from `path`): the one already loaded
/// for another model when its bytes are the same, else from the cache when
/// possible, else compiled; `compiling` is called before a compilation (a
/// cache miss) begins.
pub fn load(
    runtime: &Runtime,
    path: &Path,
    bytes: &[u8],
    cache: Option<Folder<'_>>,
    compiling: impl FnOnce(),
) -> Result<(SharedComponent, Source)> {
    let name = key(&runtime.cache_tag(), bytes);
    let slot = {
        let mut map = loaded()
            .lock()
            .expect("loaded components lock poisoned: nothing panics while holding it");
        // Components no model holds any more (and nobody is loading) leave the map.
        map.retain(|_, s| {
            Arc::strong_count(s) > 1 || s.try_lock().map_or(true, |w| w.strong_count() > 0)
        });
        map.entry(name).or_default().clone()
    };
    // A load that panicked (compiling untrusted bytes) left the slot empty, not unusable.
    let mut slot = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(component) = slot.upgrade() {
        return Ok((component, Source::Shared));
    }
    let (component, source) = load_bytes(runtime, path, bytes, cache, compiling)?;
    let component = Arc::new(component);
    *slot = Arc::downgrade(&component);
    Ok((component, source))
}

/// A cache folder and the most its entries may take.
#[derive(Debug, Clone, Copy)]
pub struct Folder<'a> {
    /// The folder (`--wasm-cache-dir`).
    pub path: &'a Path,
    /// The most bytes its entries and seals may take (`--wasm-cache-max-size`).
    pub max_bytes: u64,
}

fn load_bytes(
    runtime: &Runtime,
    path: &Path,
    bytes: &[u8],
    cache: Option<Folder<'_>>,
    compiling: impl FnOnce(),
) -> Result<(Component, Source)> {
    let cache_dir = cache.map(|c| c.path);
    let engine = &runtime.engine;
    let entry: Option<PathBuf> = cache_dir.map(|d| d.join(key(&runtime.cache_tag(), bytes)));
    let seal = match cache_dir.map(seal_key).transpose() {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!("{e}; plugins are compiled without the cache");
            None
        }
    };
    if let (Some(entry), Some(seal)) = (&entry, &seal) {
        if entry.is_file() {
            match check_sealed(entry, seal) {
                // The code was written by `Engine::precompile_component` of this
                // server (its keyed digest proves it), under a name that binds it
                // to this engine's configuration and the source bytes; the file
                // loaded is the one checked (by descriptor), owned by this user or
                // root and writable by no one else. Mapping the file (not a copy)
                // keeps the code in the page cache, shared.
                Ok(mut file) => match deserialize_open(engine, &mut file) {
                    Ok(c) => {
                        // Recently used: the last to be pruned. (An entry of
                        // root's, read by another user, keeps its time.)
                        let _ = file.set_modified(std::time::SystemTime::now());
                        return Ok((c, Source::Cache));
                    }
                    Err(e) => tracing::warn!(
                        "wasm cache entry '{}' is unusable ({e:#}); recompiling",
                        entry.display()
                    ),
                },
                Err(why) => tracing::warn!(
                    "wasm cache entry '{}' is refused: {why}; recompiling",
                    entry.display()
                ),
            }
        }
    }
    compiling();
    tracing::info!(
        "compiling '{}' ({} KiB; the first load of this build, later loads read the compile cache)",
        path.display(),
        bytes.len() / 1024
    );
    let started = Instant::now();
    let compiled = compile(engine, path, bytes)?;
    tracing::info!("compiled '{}' in {:?}", path.display(), started.elapsed());
    if let (Some(entry), Some(seal), Some(cache)) = (&entry, &seal, cache) {
        // Room first, so that the folder holds the new entry within its
        // bound, and a full disk gets space back before the write.
        prune(cache, entry, compiled.len() as u64 + 32);
        if let Err(e) = store(entry, &compiled, seal) {
            tracing::warn!("cannot write wasm cache entry '{}': {e}", entry.display());
        }
    }
    // SAFETY: `compiled` was produced just now by this engine.
    let component = unsafe { Component::deserialize(engine, &compiled) }
        .map_err(|e| Error::internal(format!("cannot load compiled component: {e:#}")))?;
    Ok((component, Source::Compiled))
}

/// The file holding an entry's keyed digest: `<entry>.seal`.
fn seal_path(entry: &Path) -> PathBuf {
    let mut name = entry.as_os_str().to_os_string();
    name.push(".seal");
    PathBuf::from(name)
}

/// The key the cache folder's entries are sealed with: `<folder>.key` next
/// to (not in) the folder, created (32 random bytes, mode 0600) when missing.
/// A key file others may write is refused: the cache is then not used.
pub fn seal_key(cache_dir: &Path) -> Result<[u8; 32]> {
    let dir_error =
        |e: String| Error::internal(format!("wasm cache folder '{}': {e}", cache_dir.display()));
    create_dir(cache_dir).map_err(|e| dir_error(e.to_string()))?;
    let canonical = cache_dir
        .canonicalize()
        .map_err(|e| dir_error(e.to_string()))?;
    if canonical.parent().is_none() {
        return Err(dir_error(
            "the cache folder needs a parent folder, where its key is kept".into(),
        ));
    }
    let path = key_path(&canonical);
    let fail =
        |what: String| Error::internal(format!("wasm cache key '{}': {what}", path.display()));
    // Models load in parallel: one of them creates the key, the others read it.
    static CREATING: Mutex<()> = Mutex::new(());
    let _creating = CREATING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !path.exists() {
        let key = random_key().map_err(|e| fail(format!("cannot read random bytes: {e}")))?;
        if let Some(parent) = path.parent() {
            create_dir(parent).map_err(|e| fail(e.to_string()))?;
        }
        let tmp = path.with_extension(format!("key.{}.tmp", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &key))
            .map_err(|e| fail(format!("cannot create it: {e}")))?;
        // Another process may have created one meanwhile: the first one stays.
        if std::fs::hard_link(&tmp, &path).is_err() && !path.exists() {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail("cannot create it".into()));
        }
        let _ = std::fs::remove_file(&tmp);
    }
    let mut file = open_trusted(&path)
        .map_err(|e| fail(e.to_string()))?
        .map_err(fail)?;
    let mut key = Vec::new();
    file.read_to_end(&mut key)
        .map_err(|e| fail(e.to_string()))?;
    key.try_into()
        .map_err(|_| fail("it is not 32 bytes long".into()))
}

/// `<cache folder>.key`.
pub fn key_path(cache_dir: &Path) -> PathBuf {
    let mut name = cache_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "wasm-cache".into());
    name.push(".key");
    cache_dir.with_file_name(name)
}

/// Whether a file or folder is one only this user (or root) can change.
fn trusted(meta: &std::fs::Metadata) -> std::result::Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "it belongs to user {}, not to this server's user",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(format!("others may write it (mode {:o})", mode & 0o7777));
    }
    Ok(())
}

/// Opens a file without following a symbolic link, and checks (on the
/// open file, so a swap after the check changes nothing) that it is trusted.
fn open_trusted(path: &Path) -> std::io::Result<std::result::Result<std::fs::File, String>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    Ok(trusted(&file.metadata()?).map(|()| file))
}

/// The open entry, when it may be loaded: its folder, the entry and its
/// seal are trusted, and the seal is the keyed digest of the bytes of the
/// file that is returned (the caller loads that open file, not the path
/// again).
fn check_sealed(entry: &Path, key: &[u8; 32]) -> std::result::Result<std::fs::File, String> {
    let dir = entry.parent().expect("cache entries live in a directory");
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    trusted(&meta).map_err(|why| format!("its folder '{}': {why}", dir.display()))?;
    let mut file = open_trusted(entry).map_err(|e| e.to_string())??;
    let seal = match open_trusted(&seal_path(entry)) {
        Err(_) => return Err("it was not written by this server (it has no seal)".into()),
        Ok(Err(why)) => return Err(format!("its seal: {why}")),
        Ok(Ok(mut f)) => {
            let mut seal = Vec::new();
            f.read_to_end(&mut seal).map_err(|e| e.to_string())?;
            seal
        }
    };
    let mut hasher = blake3::Hasher::new_keyed(key);
    std::io::copy(&mut file, &mut hasher).map_err(|e| e.to_string())?;
    if seal.len() != blake3::OUT_LEN
        || hasher.finalize() != *<&[u8; 32]>::try_from(&seal[..]).expect("32 bytes")
    {
        return Err(
            "it was not written by this server (its seal does not match the cache key)".into(),
        );
    }
    Ok(file)
}

/// Loads a checked entry from its open file: mapped through
/// `/proc/self/fd` (the same file whatever happens to its path since), or
/// read into memory where `/proc` is not mounted.
fn deserialize_open(engine: &Engine, file: &mut std::fs::File) -> wasmtime::Result<Component> {
    use std::os::fd::AsRawFd;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    if by_fd.exists() {
        // SAFETY: see the caller: the open file is the checked, sealed entry.
        return unsafe { Component::deserialize_file(engine, &by_fd) };
    }
    let mut code = Vec::new();
    std::io::Seek::rewind(file)?;
    file.read_to_end(&mut code)?;
    // SAFETY: as above; these are the bytes of the checked file.
    unsafe { Component::deserialize(engine, &code) }
}

/// Creates a folder (and its parents) that only this user may write,
/// whatever the umask.
fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
}

/// Writes the code, then its seal (its keyed digest, in `<entry>.seal`),
/// each atomically (temporary file + rename, mode 0644), so readers never
/// see half a file; a reader between the two renames finds a seal that does
/// not match, and recompiles.
fn store(entry: &Path, compiled: &[u8], key: &[u8; 32]) -> std::io::Result<()> {
    let dir = entry.parent().expect("cache entries live in a directory");
    create_dir(dir)?;
    write_atomically(entry, compiled)?;
    write_atomically(
        &seal_path(entry),
        blake3::keyed_hash(key, compiled).as_bytes(),
    )
    .inspect_err(|_| {
        // An entry without its seal would only ever be refused.
        let _ = std::fs::remove_file(entry);
    })
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into
/// place; on failure (a full disk) the temporary file is removed.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache files live in a directory");
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        std::io::Write::write_all(&mut f, bytes)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// How old a temporary file must be before pruning takes it for the
/// leftover of a writer that died (a live writer renames it in seconds).
const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Makes room for `incoming` bytes before `written` is stored: removes the
/// least recently used entries (with their seals; never `written`) until
/// entries, seals and the newcomer fit in `max_bytes`, and temporary files
/// older than an hour. A server still running an entry's code keeps it
/// mapped, so removing it only means the next load compiles again.
fn prune(cache: Folder<'_>, written: &Path, incoming: u64) {
    let Ok(dir) = std::fs::read_dir(cache.path) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut entries = Vec::new();
    let mut seals = HashMap::new();
    let mut total = 0u64;
    for item in dir.flatten() {
        let name = item.file_name();
        let name = name.to_string_lossy();
        let Ok(meta) = item.metadata() else { continue };
        let age = now
            .duration_since(meta.modified().unwrap_or(now))
            .unwrap_or_default();
        if name.starts_with('.') && name.ends_with(".tmp") {
            if age > STALE_TEMPORARY {
                let _ = std::fs::remove_file(item.path());
            }
        } else if name.ends_with(".cwasm") || name.ends_with(".cwasm.seal") {
            total += meta.len();
            if name.ends_with(".seal") {
                seals.insert(item.path(), meta.len());
            }
            if name.ends_with(".cwasm") && item.path() != written {
                entries.push((meta.modified().unwrap_or(now), item.path(), meta.len()));
            }
        }
    }
    let limit = cache.max_bytes.saturating_sub(incoming);
    if total <= limit {
        return;
    }
    entries.sort();
    for (_, entry, size) in entries {
        if total <= limit {
            break;
        }
        let seal = seal_path(&entry);
        match std::fs::remove_file(&entry) {
            Ok(()) => {
                tracing::info!(
                    "wasm cache: removed '{}' ({} KiB, least recently used) to stay within {} MiB",
                    entry.display(),
                    size / 1024,
                    cache.max_bytes >> 20
                );
                let _ = std::fs::remove_file(&seal);
            }
            // Another writer (a model loading beside this one, another
            // server) removed it since the listing: it is gone all the same,
            // and counting it as still there would remove one more. Its seal
            // is that writer's to remove (by now it may seal a new copy).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => continue,
        }
        total = total.saturating_sub(size + seals.get(&seal).copied().unwrap_or(0));
    }
}

/// The default cache directory: `$XDG_CACHE_HOME/tern/wasm` or `~/.cache/tern/wasm`.
pub fn default_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("tern").join("wasm"))
}

/// 32 bytes from the kernel's random source, through the `getrandom`
/// system call: containers and sandboxes without `/dev/urandom` have it too.
fn random_key() -> std::io::Result<[u8; 32]> {
    let mut key = [0u8; 32];
    let mut filled = 0;
    while filled < key.len() {
        // SAFETY: the pointer and length describe the unfilled rest of `key`.
        let n =
            unsafe { libc::getrandom(key[filled..].as_mut_ptr().cast(), key.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`load`] of the component file `file`.
    fn load_file(
        runtime: &Runtime,
        file: &Path,
        cache: Option<Folder<'_>>,
    ) -> Result<(SharedComponent, Source)> {
        load(runtime, file, &std::fs::read(file).unwrap(), cache, || ())
    }

    #[test]
    fn key_binds_content_architecture_and_layout() {
        let native = Runtime::new(false).unwrap();
        let a = key(&native.cache_tag(), b"one");
        assert_eq!(a, key(&native.cache_tag(), b"one"));
        assert_ne!(a, key(&native.cache_tag(), b"two"));
        assert!(
            a.ends_with(&format!("-{}-on-demand.cwasm", std::env::consts::ARCH)),
            "{a}"
        );
        if cfg!(feature = "cross-compile") {
            let cross = Runtime::for_target("aarch64-unknown-linux-gnu", true).unwrap();
            assert_eq!(cross.cache_tag(), "aarch64-pooling");
        }
        let same = Runtime::for_target(
            &format!("{}-unknown-linux-gnu", std::env::consts::ARCH),
            false,
        )
        .unwrap();
        assert_eq!(
            same.cache_tag(),
            native.cache_tag(),
            "a cache precompiled for this architecture is found by the native engine"
        );
    }

    #[test]
    #[cfg(feature = "cross-compile")]
    fn a_precompiled_entry_for_this_machine_loads_from_the_cache_and_another_targets_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let (file, cache) = smallest(dir.path(), "precompiled");
        let native = Runtime::new(false).unwrap();
        let host = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
        let (entry, size) =
            precompile(&Runtime::for_target(&host, false).unwrap(), &file, &cache).unwrap();
        assert!(entry.is_file() && size > 0);
        assert_eq!(
            load_file(&native, &file, Some(folder(&cache))).unwrap().1,
            Source::Cache
        );
        // An entry written for another engine under this machine's name is recompiled, not trusted.
        let other = if std::env::consts::ARCH == "aarch64" {
            "x86_64"
        } else {
            "aarch64"
        };
        let (foreign, _) = precompile(
            &Runtime::for_target(&format!("{other}-unknown-linux-gnu"), false).unwrap(),
            &file,
            &cache,
        )
        .unwrap();
        std::fs::rename(&foreign, &entry).unwrap();
        assert_eq!(
            load_file(&native, &file, Some(folder(&cache))).unwrap().1,
            Source::Compiled
        );
        assert_eq!(
            load_file(&native, &file, Some(folder(&cache))).unwrap().1,
            Source::Cache
        );
    }

    /// The smallest component (no imports, no exports) with a custom
    /// section naming the test (tests run in parallel and loaded components
    /// are shared by their bytes), in a fresh folder, with its cache folder.
    fn smallest(dir: &Path, test: &str) -> (PathBuf, PathBuf) {
        let file = dir.join("model.wasm");
        let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
        bytes.extend([0, 1 + test.len() as u8, test.len() as u8]);
        bytes.extend(test.as_bytes());
        std::fs::write(&file, bytes).unwrap();
        (file, dir.join("cache"))
    }

    /// The cache folder at `path` with the default bound.
    fn folder(path: &Path) -> Folder<'_> {
        Folder {
            path,
            max_bytes: tern_core::backend::DEFAULT_WASM_CACHE_MAX_BYTES,
        }
    }

    /// Sets a file's modification time to `secs_ago` seconds ago.
    fn age(path: &Path, secs_ago: u64) {
        let t = std::time::SystemTime::now() - std::time::Duration::from_secs(secs_ago);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn the_folder_keeps_within_its_bound_removing_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path();
        let key = [7u8; 32];
        // Three entries of 1000 bytes (+32-byte seals), used 300, 200 and 100 s ago.
        for (name, ago) in [("a", 300), ("b", 200), ("c", 100)] {
            let entry = cache.join(format!("{name}.cwasm"));
            store(&entry, &[0u8; 1000], &key).unwrap();
            age(&entry, ago);
        }
        // A writer's leftover from two hours ago, and one writing now.
        std::fs::write(cache.join(".x.cwasm.1.tmp"), b"old").unwrap();
        age(&cache.join(".x.cwasm.1.tmp"), 7200);
        std::fs::write(cache.join(".y.cwasm.2.tmp"), b"new").unwrap();
        let written = cache.join("d.cwasm");
        store(&written, &[0u8; 1000], &key).unwrap();
        let bound = Folder {
            path: cache,
            max_bytes: 2 * 1032,
        };
        prune(bound, &written, 0);
        let mut left: Vec<String> = std::fs::read_dir(cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".y.cwasm.2.tmp",
                "c.cwasm",
                "c.cwasm.seal",
                "d.cwasm",
                "d.cwasm.seal"
            ],
            "the two least recently used entries and the stale temporary file go; \
             the entry just written and the live writer's file stay"
        );
        // Within the bound, nothing more is removed.
        prune(bound, &written, 0);
        assert_eq!(std::fs::read_dir(cache).unwrap().count(), 5);
        // Room for a newcomer of 1032 bytes: the least recently used goes.
        prune(bound, &cache.join("e.cwasm"), 1032);
        assert!(!cache.join("c.cwasm").exists() && cache.join("d.cwasm").exists());
        assert_eq!(std::fs::read_dir(cache).unwrap().count(), 3);
    }

    #[test]
    fn writers_pruning_at_once_remove_only_what_they_must() {
        // Several models of one server store their entries at the same
        // time: each prunes the same listing. An old entry one of them
        // removes first must count as gone for the others, not make them
        // remove fresh entries in its place.
        let key = [7u8; 32];
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let cache = dir.path();
            let old = cache.join("old.cwasm");
            store(&old, &[0u8; 4000], &key).unwrap();
            age(&old, 7200);
            for i in 0..6 {
                store(&cache.join(format!("e{i}.cwasm")), &[0u8; 1000], &key).unwrap();
            }
            // Room for the six fresh entries (and seals) and a little more.
            let bound = Folder {
                path: cache,
                max_bytes: 6 * 1032 + 500,
            };
            let start = std::sync::Barrier::new(6);
            std::thread::scope(|s| {
                for i in 0..6 {
                    let (start, written) = (&start, cache.join(format!("e{i}.cwasm")));
                    s.spawn(move || {
                        start.wait();
                        prune(bound, &written, 0);
                    });
                }
            });
            assert!(!old.exists(), "round {round}: the old entry goes");
            for i in 0..6 {
                assert!(
                    cache.join(format!("e{i}.cwasm")).exists(),
                    "round {round}: fresh entry e{i} was removed"
                );
            }
        }
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: a non-empty folder stands where the entry would go.
        let entry = dir.path().join("e.cwasm");
        std::fs::create_dir(&entry).unwrap();
        std::fs::write(entry.join("x"), b"x").unwrap();
        assert!(write_atomically(&entry, b"code").is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["e.cwasm"]);
    }

    #[test]
    fn a_cache_hit_refreshes_the_entry_time() {
        let dir = tempfile::tempdir().unwrap();
        let (file, cache) = smallest(dir.path(), "a_cache_hit_refreshes_the_entry_time");
        let native = Runtime::new(false).unwrap();
        let load = |c: Option<Folder<'_>>| {
            load_bytes(&native, &file, &std::fs::read(&file).unwrap(), c, || ())
                .unwrap()
                .1
        };
        assert_eq!(load(Some(folder(&cache))), Source::Compiled);
        let entry = entry_in(&cache);
        age(&entry, 1000);
        assert_eq!(load(Some(folder(&cache))), Source::Cache);
        let since = std::fs::metadata(&entry)
            .unwrap()
            .modified()
            .unwrap()
            .elapsed()
            .unwrap();
        assert!(since.as_secs() < 100, "{since:?}");
    }

    /// The one `.cwasm` entry in a cache folder.
    fn entry_in(cache: &Path) -> PathBuf {
        let entries: Vec<PathBuf> = std::fs::read_dir(cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        entries[0].clone()
    }

    #[test]
    #[cfg(feature = "cross-compile")]
    fn only_entries_this_server_sealed_are_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let (file, cache) = smallest(dir.path(), "sealed");
        let native = Runtime::new(false).unwrap();
        let load = || load_file(&native, &file, Some(folder(&cache))).unwrap().1;
        assert_eq!(load(), Source::Compiled);
        assert_eq!(load(), Source::Cache);
        let entry = entry_in(&cache);
        let sealed = std::fs::read(&entry).unwrap();

        // Other native code (here: for another architecture), planted under the entry's name.
        let other = if std::env::consts::ARCH == "aarch64" {
            "x86_64"
        } else {
            "aarch64"
        };
        let planted = Runtime::for_target(&format!("{other}-unknown-linux-gnu"), false)
            .unwrap()
            .engine
            .precompile_component(&std::fs::read(&file).unwrap())
            .unwrap();
        assert_ne!(planted, sealed);
        std::fs::write(&entry, &planted).unwrap();
        assert_eq!(load(), Source::Compiled, "a planted entry is recompiled");
        assert_eq!(
            std::fs::read(&entry).unwrap(),
            sealed,
            "and rewritten, sealed"
        );
        std::fs::remove_file(seal_path(&entry)).unwrap();
        assert_eq!(
            load(),
            Source::Compiled,
            "an entry without its seal is recompiled"
        );
        assert!(seal_path(&entry).is_file());

        // One byte of code changed, the seal kept.
        let mut tampered = sealed.clone();
        tampered[100] ^= 1;
        std::fs::write(&entry, &tampered).unwrap();
        assert_eq!(load(), Source::Compiled);

        // Sealed with another key (another server's cache copied in).
        std::fs::write(super::key_path(&cache), [7u8; 32]).unwrap();
        assert_eq!(load(), Source::Compiled);
        assert_eq!(load(), Source::Cache);
    }

    #[test]
    fn entries_others_may_write_are_refused_and_the_key_lives_outside_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (file, cache) = smallest(dir.path(), "modes");
        let native = Runtime::new(false).unwrap();
        let load = || load_file(&native, &file, Some(folder(&cache))).unwrap().1;
        assert_eq!(load(), Source::Compiled);
        let key = super::key_path(&cache);
        assert_eq!(key, dir.path().join("cache.key"));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&key), 0o600);
        let entry = entry_in(&cache);
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            load(),
            Source::Compiled,
            "a world-writable entry is not trusted"
        );
        assert_eq!(mode(&entry), 0o644);
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            load(),
            Source::Compiled,
            "nor one in a world-writable folder"
        );
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(load(), Source::Cache);
        // A key others may write disables the cache: every load compiles.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(load(), Source::Compiled);
        assert_eq!(load(), Source::Compiled);
    }

    #[test]
    fn models_loading_in_parallel_share_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| seal_key(&cache).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]));
    }

    #[test]
    fn symbolic_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (file, cache) = smallest(dir.path(), "links");
        let native = Runtime::new(false).unwrap();
        let load = || load_file(&native, &file, Some(folder(&cache))).unwrap().1;
        assert_eq!(load(), Source::Compiled);
        let entry = entry_in(&cache);
        let elsewhere = dir.path().join("elsewhere.cwasm");
        std::fs::rename(&entry, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
        assert_eq!(
            load(),
            Source::Compiled,
            "an entry that is a link is not loaded"
        );
        assert_eq!(load(), Source::Cache, "the rewritten entry is");
        let key = key_path(&cache);
        let real = dir.path().join("real.key");
        std::fs::rename(&key, &real).unwrap();
        std::os::unix::fs::symlink(&real, &key).unwrap();
        assert_eq!(load(), Source::Compiled, "a key that is a link is not used");
        assert_eq!(load(), Source::Compiled);
    }

    #[test]
    fn models_loading_the_same_component_share_one_compilation() {
        let dir = tempfile::tempdir().unwrap();
        let (file, cache) = smallest(dir.path(), "shared");
        let native = Runtime::new(false).unwrap();
        let (first, source) = load_file(&native, &file, Some(folder(&cache))).unwrap();
        assert_eq!(source, Source::Compiled);
        let (second, source) = load_file(&native, &file, None).unwrap();
        assert_eq!(source, Source::Shared, "loaded while the first is held");
        assert!(Arc::ptr_eq(&first, &second));
        drop((first, second));
        assert_eq!(
            load_file(&native, &file, Some(folder(&cache))).unwrap().1,
            Source::Cache
        );
    }

    #[test]
    fn garbage_is_a_clear_error_and_nothing_is_cached() {
        let dir = std::env::temp_dir().join(format!("tern-cache-test-{}", std::process::id()));
        let file = dir.join("model.wasm");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&file, b"\0asm nonsense").unwrap();
        let cache = dir.join("cache");
        let e = load(
            &Runtime::new(false).unwrap(),
            &file,
            b"\0asm nonsense",
            Some(folder(&cache)),
            || (),
        )
        .err()
        .unwrap();
        assert!(
            e.message.contains("is not a valid WebAssembly component"),
            "{e}"
        );
        assert!(!cache.exists() || std::fs::read_dir(&cache).unwrap().next().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
