//! The `.cwasm` cache: components compiled once and stored as
//! `<BLAKE3 of the component>-<engine compatibility hash>.cwasm` under
//! `--wasm-cache-dir`, so a restart with a warm cache deserialises instead
//! of recompiling. A different wasmtime build or engine configuration gives
//! a different file name; an unreadable or corrupt entry is recompiled and
//! rewritten. Without a cache directory everything still works, slower.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Instant;

use wasmtime::component::Component;
use wasmtime::Engine;

use tern_core::error::{Error, Result};

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Deserialised from the cache.
    Cache,
    /// Compiled now (and stored when a cache directory is set).
    Compiled,
}

/// The cache file name for `bytes` on `engine`.
pub fn key(engine: &Engine, bytes: &[u8]) -> String {
    // BLAKE3 rather than SHA-256: as collision resistant, and ~10x faster
    // without SHA instructions (a 19 MB componentize-py plugin hashed with
    // SHA-256 was a quarter of the warm start's CPU time).
    let digest = blake3::hash(bytes);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{}-{:016x}.cwasm", digest.to_hex(), h.finish())
}

/// Loads the component at `path`, from the cache when possible.
pub fn load(engine: &Engine, path: &Path, cache_dir: Option<&Path>) -> Result<(Component, Source)> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))?;
    let entry: Option<PathBuf> = cache_dir.map(|d| d.join(key(engine, &bytes)));
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
    let started = Instant::now();
    let compiled = engine.precompile_component(&bytes).map_err(|e| {
        Error::invalid_arg(format!(
            "'{}' is not a valid WebAssembly component: {e:#}",
            path.display()
        ))
    })?;
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
    fn key_binds_content_and_engine() {
        let engine = Engine::default();
        let a = key(&engine, b"one");
        assert_eq!(a, key(&engine, b"one"));
        assert_ne!(a, key(&engine, b"two"));
        assert!(a.ends_with(".cwasm") && a.len() == 64 + 1 + 16 + 6, "{a}");
        let mut c = wasmtime::Config::new();
        c.epoch_interruption(true);
        let other = Engine::new(&c).unwrap();
        assert_ne!(
            a,
            key(&other, b"one"),
            "a different engine configuration gets its own entry"
        );
    }

    #[test]
    fn garbage_is_a_clear_error_and_nothing_is_cached() {
        let dir = std::env::temp_dir().join(format!("tern-cache-test-{}", std::process::id()));
        let file = dir.join("model.wasm");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&file, b"\0asm nonsense").unwrap();
        let cache = dir.join("cache");
        let e = load(&Engine::default(), &file, Some(&cache)).err().unwrap();
        assert!(
            e.message.contains("is not a valid WebAssembly component"),
            "{e}"
        );
        assert!(!cache.exists() || std::fs::read_dir(&cache).unwrap().next().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
