//! `tern plugin compile`: precompiles a repository's plugins, for this
//! machine or a device, with the engine configuration the server runs them
//! with, into the `.cwasm` cache layout the server reads.

use std::path::Path;

use tern_core::error::{Error, Result};
use tern_plugin_tool::CompileOptions;

/// Compiles every plugin of `o.repository` (or the one `o.file`) into
/// `o.cache_dir`; one line per plugin.
pub fn compile(o: &CompileOptions) -> Result<Vec<String>> {
    if let Some(file) = &o.file {
        return compile_for_this_server(file, o.cache_dir.as_deref());
    }
    let Some(cache_dir) = &o.cache_dir else {
        return Err(Error::invalid_arg("tern plugin compile needs --cache-dir"));
    };
    let target = o.target.as_deref().unwrap_or(crate::version::TARGET);
    let runtime = tern_wasm::Runtime::for_target(target, !o.on_demand)?;
    let done = tern_wasm::precompile::repository(&runtime, &o.repository, cache_dir)?;
    let mut lines: Vec<String> = done
        .iter()
        .map(|c| {
            format!(
                "compiled {} in {:.2?} -> {} ({} KiB)",
                c.source.display(),
                c.took,
                c.entry.display(),
                c.size / 1024
            )
        })
        .collect();
    lines.push(format!(
        "{} plugin(s) compiled for {target} ({}); serve with --wasm-cache-dir={}",
        done.len(),
        runtime.cache_tag(),
        cache_dir.display()
    ));
    Ok(lines)
}

/// Precompiles one component the way a server on this machine would
/// (`tern plugin build`), into `cache_dir` or the server's default cache.
fn compile_for_this_server(file: &Path, cache_dir: Option<&Path>) -> Result<Vec<String>> {
    let Some(cache_dir) = cache_dir
        .map(Path::to_path_buf)
        .or_else(tern_wasm::cache::default_dir)
    else {
        return Ok(vec![
            "not precompiled: no cache folder (set HOME or XDG_CACHE_HOME, or pass --cache-dir)"
                .into(),
        ]);
    };
    let runtime = tern_wasm::Runtime::new(std::env::var_os("TERN_WASM_NO_POOLING").is_none())?;
    let started = std::time::Instant::now();
    let (entry, size) = tern_wasm::cache::precompile(&runtime, file, &cache_dir)?;
    Ok(vec![format!(
        "precompiled in {:.1?} -> {} ({} KiB); a server with --wasm-cache-dir={} (its default) loads it without compiling",
        started.elapsed(),
        entry.display(),
        size / 1024,
        cache_dir.display()
    )])
}
