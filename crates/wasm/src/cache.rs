//! The `.cwasm` cache: components compiled once and stored as
//! `<BLAKE3 of the component>-<engine compatibility hash>.cwasm` under
//! `--wasm-cache-dir`, so a restart with a warm cache deserialises instead
//! of recompiling. A different wasmtime build or engine configuration gives
//! a different file name; an unreadable or corrupt entry is recompiled and
//! rewritten. Without a cache directory everything still works, slower.

use std::path::{Path, PathBuf};
use std::time::Instant;

use wasmtime::component::Component;
use wasmtime::Engine;

use crate::Runtime;
use tern_core::error::{Error, Result};

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Deserialised from the cache.
    Cache,
    /// Compiled now (and stored when a cache directory is set).
    Compiled,
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
    store(&entry, &compiled).map_err(|e| {
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

/// Loads the component at `path`, from the cache when possible;
/// `compiling` is called before a compilation (a cache miss) begins.
pub fn load(
    runtime: &Runtime,
    path: &Path,
    cache_dir: Option<&Path>,
    compiling: impl FnOnce(),
) -> Result<(Component, Source)> {
    let engine = &runtime.engine;
    let bytes = std::fs::read(path)
        .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))?;
    let entry: Option<PathBuf> = cache_dir.map(|d| d.join(key(&runtime.cache_tag(), &bytes)));
    if let Some(entry) = &entry {
        if entry.is_file() {
            // SAFETY: the file was written by `Engine::precompile_component`
            // into a cache directory the operator controls, under a name that
            // binds it to this engine's configuration and the source bytes.
            match unsafe { Component::deserialize_file(engine, entry) } {
                Ok(c) => {
                    return Ok((c, Source::Cache));
                }
                Err(e) => tracing::warn!(
                    "wasm cache entry '{}' is unusable ({e:#}); recompiling",
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
    let compiled = compile(engine, path, &bytes)?;
    tracing::info!("compiled '{}' in {:?}", path.display(), started.elapsed());
    if let Some(entry) = &entry {
        if let Err(e) = store(entry, &compiled) {
            tracing::warn!("cannot write wasm cache entry '{}': {e}", entry.display());
        }
    }
    // SAFETY: `compiled` was produced just now by this engine.
    let component = unsafe { Component::deserialize(engine, &compiled) }
        .map_err(|e| Error::internal(format!("cannot load compiled component: {e:#}")))?;
    Ok((component, Source::Compiled))
}

/// Writes atomically (temporary file + rename) so readers never see half a file.
fn store(entry: &Path, compiled: &[u8]) -> std::io::Result<()> {
    let dir = entry.parent().expect("cache entries live in a directory");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        entry
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry"),
        std::process::id()
    ));
    std::fs::write(&tmp, compiled)?;
    std::fs::rename(&tmp, entry)
}

/// The default cache directory: `$XDG_CACHE_HOME/tern/wasm` or `~/.cache/tern/wasm`.
pub fn default_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("tern").join("wasm"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let cross = Runtime::for_target("aarch64-unknown-linux-gnu", true).unwrap();
        assert_eq!(cross.cache_tag(), "aarch64-pooling");
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
    fn a_precompiled_entry_for_this_machine_loads_from_the_cache_and_another_targets_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.wasm");
        // The smallest component: no imports, no exports.
        std::fs::write(&file, b"\0asm\x0d\0\x01\0").unwrap();
        let cache = dir.path().join("cache");
        let native = Runtime::new(false).unwrap();
        let host = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
        let (entry, size) =
            precompile(&Runtime::for_target(&host, false).unwrap(), &file, &cache).unwrap();
        assert!(entry.is_file() && size > 0);
        assert_eq!(
            load(&native, &file, Some(&cache), || ()).unwrap().1,
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
            load(&native, &file, Some(&cache), || ()).unwrap().1,
            Source::Compiled
        );
        assert_eq!(
            load(&native, &file, Some(&cache), || ()).unwrap().1,
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
        let e = load(&Runtime::new(false).unwrap(), &file, Some(&cache), || ())
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
