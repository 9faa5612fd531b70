//! `tern plugin compile`: precompiles a repository's plugins, for this
//! machine or a device, with the engine configuration the server runs them
//! with, into the `.cwasm` cache layout the server reads.

use tern_core::error::Result;
use tern_plugin_tool::CompileOptions;

/// Compiles every plugin of `o.repository` into `o.cache_dir`; one line per plugin.
pub fn compile(o: &CompileOptions) -> Result<Vec<String>> {
    let target = o.target.as_deref().unwrap_or(crate::version::TARGET);
    let runtime = tern_wasm::Runtime::for_target(target, !o.on_demand)?;
    let done = tern_wasm::precompile::repository(&runtime, &o.repository, &o.cache_dir)?;
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
        o.cache_dir.display()
    ));
    Ok(lines)
}
