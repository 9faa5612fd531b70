//! Precompiling a repository's plugins, possibly for another machine
//! (`tern plugin compile`): every `.wasm` file in a version folder is
//! compiled into a `.cwasm` cache folder under the name the target machine
//! looks it up by, so a device never compiles plugins at first boot.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{cache, Runtime};
use tern_core::error::{Error, Result};

/// One compiled plugin.
#[derive(Debug)]
pub struct Compiled {
    /// The component.
    pub source: PathBuf,
    /// Its cache entry.
    pub entry: PathBuf,
    /// Size of the compiled code in bytes.
    pub size: usize,
    /// How long compiling took.
    pub took: Duration,
}

/// Compiles every plugin of `repository` (`<model>/<version>/*.wasm`) with
/// `runtime` into `cache_dir`. A file that is not a valid component fails
/// the whole run, naming it.
pub fn repository(runtime: &Runtime, repository: &Path, cache_dir: &Path) -> Result<Vec<Compiled>> {
    let mut out = Vec::new();
    for file in plugin_files(repository)? {
        out.push(one(runtime, &file, cache_dir)?);
    }
    Ok(out)
}

/// Compiles one component (a plugin, the Python runner) into `cache_dir`.
pub fn one(runtime: &Runtime, file: &Path, cache_dir: &Path) -> Result<Compiled> {
    let started = Instant::now();
    let (entry, size) = cache::precompile(runtime, file, cache_dir)?;
    Ok(Compiled {
        source: file.to_path_buf(),
        entry,
        size,
        took: started.elapsed(),
    })
}

/// The `.wasm` files in the numeric version folders of every model, sorted.
fn plugin_files(repository: &Path) -> Result<Vec<PathBuf>> {
    let read = |dir: &Path| {
        std::fs::read_dir(dir)
            .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", dir.display())))
    };
    let mut files = Vec::new();
    for model in read(repository)?.flatten().filter(|e| e.path().is_dir()) {
        for version in read(&model.path())?.flatten() {
            let numeric = version
                .file_name()
                .to_str()
                .is_some_and(|n| n.parse::<i64>().is_ok());
            if !numeric || !version.path().is_dir() {
                continue;
            }
            for f in read(&version.path())?.flatten() {
                if f.path().extension().is_some_and(|x| x == "wasm") {
                    files.push(f.path());
                }
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_architecture_needs_the_cross_compile_feature() {
        let other = if std::env::consts::ARCH == "aarch64" {
            "x86_64"
        } else {
            "aarch64"
        };
        let r = Runtime::for_target(&format!("{other}-unknown-linux-gnu"), false);
        if cfg!(feature = "cross-compile") {
            assert_eq!(r.unwrap().cache_tag(), format!("{other}-on-demand"));
        } else {
            let e = r.err().expect("refused without the feature");
            assert_eq!(e.code, tern_core::error::Code::Unsupported, "{e}");
            assert!(e.to_string().contains("`cross-compile` feature"), "{e}");
        }
        let own = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
        assert!(Runtime::for_target(&own, false).is_ok());
    }

    #[test]
    #[cfg(feature = "cross-compile")]
    fn every_plugin_of_a_repository_is_compiled_for_the_target() {
        let repo = tempfile::tempdir().unwrap();
        let component = b"\0asm\x0d\0\x01\0";
        for (model, version) in [("a", "1"), ("a", "2"), ("b", "1")] {
            let dir = repo.path().join(model).join(version);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("model.wasm"), component).unwrap();
        }
        std::fs::create_dir_all(repo.path().join("a/configs")).unwrap();
        std::fs::write(
            repo.path().join("a/configs/x.wasm"),
            b"not a version folder",
        )
        .unwrap();
        let cache = repo.path().join("cache");
        let rt = Runtime::for_target("aarch64-unknown-linux-gnu", false).unwrap();
        let done = repository(&rt, repo.path(), &cache).unwrap();
        assert_eq!(done.len(), 3);
        // The same bytes make one entry (with its seal).
        let mut names: Vec<String> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(
            names[1].ends_with(".cwasm.seal") && names[1].starts_with(&names[0]),
            "{names:?}"
        );
        assert!(done[0]
            .entry
            .to_str()
            .unwrap()
            .ends_with("-aarch64-on-demand.cwasm"));
        std::fs::write(repo.path().join("b/1/model.wasm"), b"garbage").unwrap();
        let e = repository(&rt, repo.path(), &cache).unwrap_err();
        assert!(e.message.contains("b/1/model.wasm"), "{e}");
    }
}
