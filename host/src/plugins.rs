//! `tern plugin compile`: precompiles a repository's plugins (and the Python
//! runner, for its `backend: "python"` models), for this machine or a
//! device, with the engine configuration the server runs them with, into
//! the `.cwasm` cache layout the server reads.

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
    let mut done = tern_wasm::precompile::repository(&runtime, &o.repository, cache_dir)?;
    let plugins = done.len();
    let mut notes = Vec::new();
    let python = python_models(&o.repository);
    if !python.is_empty() {
        let settings = tern_core::backend::BackendSettings {
            python_runner: o.python_runner.clone(),
            ..Default::default()
        };
        match tern_wasm::python::runner_path(&settings) {
            Ok(runner) => done.push(tern_wasm::precompile::one(&runtime, &runner, cache_dir)?),
            Err(e) => notes.push(format!(
                "the Python runner was not precompiled for the Python model(s) {}: {}",
                python.join(", "),
                e.message
            )),
        }
    }
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
    lines.extend(notes);
    lines.push(format!(
        "{plugins} plugin(s){} compiled for {target} ({}); serve with --wasm-cache-dir={}",
        if done.len() > plugins {
            " and the Python runner"
        } else {
            ""
        },
        runtime.cache_tag(),
        cache_dir.display()
    ));
    Ok(lines)
}

/// The models of `repository` whose `config.pbtxt` says `backend: "python"`,
/// sorted (configs that do not parse are the server's to report).
fn python_models(repository: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(repository) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("config.pbtxt"))
                .ok()
                .and_then(|text| tern_core::config::parse_pbtxt(&text).ok())
                .is_some_and(|c| c.backend == "python")
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_models_are_those_whose_config_names_the_python_backend() {
        let repo = tempfile::tempdir().unwrap();
        for (name, config) in [
            ("b_py", "name: \"b_py\" backend: \"python\""),
            ("a_py", "backend: \"python\" max_batch_size: 4"),
            ("plugin", "backend: \"wasm\""),
            ("broken", "backend: \"python\" no_such_field: 1"),
        ] {
            std::fs::create_dir_all(repo.path().join(name)).unwrap();
            std::fs::write(repo.path().join(name).join("config.pbtxt"), config).unwrap();
        }
        std::fs::create_dir_all(repo.path().join("no_config/1")).unwrap();
        assert_eq!(python_models(repo.path()), ["a_py", "b_py"]);
        assert!(python_models(&repo.path().join("missing")).is_empty());
    }
}
