//! Model folder fingerprints: what tells the repository poller that a
//! model changed (a new file, a new size or modification time) and a reload
//! whether only the config did. A plugin's sources beside its config are not
//! part of the model.

use std::hash::{Hash, Hasher};
use std::path::Path;

/// A fingerprint of everything that makes up a model under its folder:
/// paths, sizes and modification times. A plugin's sources beside its
/// config do not count (see [`is_plugin_source`]).
pub fn fingerprint(dir: &Path) -> u64 {
    fingerprint_where(dir, |_| true)
}

/// The fingerprint of a model folder without its config files (`config.pbtxt`, `configs/`).
pub fn content_fingerprint(dir: &Path) -> u64 {
    let (config, configs) = (dir.join("config.pbtxt"), dir.join("configs"));
    fingerprint_where(dir, |p| p != config && !p.starts_with(&configs))
}

/// Whether `name`, at the top of a plugin's model folder (one holding the
/// sources `tern plugin build` reads: `Cargo.toml`, `app.py`, `model.js` or
/// `model.c`), is a source, build or editor file rather than part of the
/// model: saving a source is not a new model, rebuilding `1/model.wasm` is.
fn is_plugin_source(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "src",
        "sdk",
        "target",
        "node_modules",
        "__pycache__",
        "wit",
        "bindings",
        "tests",
        "Makefile",
        "requirements.txt",
    ];
    const EXTENSIONS: &[&str] = &[
        "py", "pyi", "pyc", "js", "mjs", "cjs", "ts", "c", "h", "cc", "cpp", "hpp", "rs", "toml",
        "lock", "md", "swp", "swx", "bak", "orig",
    ];
    let ext = name.rsplit_once('.').map(|(_, e)| e);
    name.starts_with('.')
        || name.ends_with('~')
        || name.starts_with("package") && name.ends_with(".json")
        || NAMES.contains(&name)
        || ext.is_some_and(|e| EXTENSIONS.contains(&e))
}

fn fingerprint_where(dir: &Path, keep: impl Fn(&Path) -> bool) -> u64 {
    let plugin = tern_plugin_tool::build::detect(dir).is_ok();
    let keep = |p: &Path| {
        let source = plugin
            && p.parent() == Some(dir)
            && p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_plugin_source);
        !source && keep(p)
    };
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if !keep(&path) {
                continue;
            }
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            files.push((path, meta.len(), modified));
        }
    }
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_follows_changes() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("1")).unwrap();
        std::fs::write(t.path().join("config.pbtxt"), "a").unwrap();
        let a = fingerprint(t.path());
        assert_eq!(a, fingerprint(t.path()));
        std::fs::write(t.path().join("1/model.onnx"), "m").unwrap();
        let b = fingerprint(t.path());
        assert_ne!(a, b);
        let content = content_fingerprint(t.path());
        std::fs::write(t.path().join("config.pbtxt"), "ab").unwrap();
        assert_ne!(b, fingerprint(t.path()));
        assert_eq!(
            content,
            content_fingerprint(t.path()),
            "config edits leave the content alone"
        );
    }

    #[test]
    fn plugin_sources_are_not_part_of_the_model() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(dir.join("config.pbtxt"), "a").unwrap();
        std::fs::write(dir.join("labels.txt"), "a").unwrap();
        std::fs::write(dir.join("1/model.wasm"), "w").unwrap();
        std::fs::write(dir.join("app.py"), "x = 1").unwrap();
        let before = fingerprint(dir);
        std::fs::write(dir.join("app.py"), "x = 2  # edited").unwrap();
        std::fs::write(dir.join(".app.py.swp"), "vim").unwrap();
        std::fs::write(dir.join("helpers.py"), "").unwrap();
        std::fs::create_dir_all(dir.join("__pycache__")).unwrap();
        std::fs::write(dir.join("__pycache__/app.pyc"), "").unwrap();
        std::fs::write(dir.join("requirements.txt"), "six").unwrap();
        assert_eq!(
            before,
            fingerprint(dir),
            "sources changed, the model did not"
        );
        std::fs::write(dir.join("labels.txt"), "a\nb").unwrap();
        let labels = fingerprint(dir);
        assert_ne!(before, labels, "a label file is part of the model");
        std::fs::write(dir.join("1/model.wasm"), "rebuilt").unwrap();
        assert_ne!(
            labels,
            fingerprint(dir),
            "a rebuilt component is a new model"
        );
        // Without plugin sources, every file counts (as in Triton).
        std::fs::remove_file(dir.join("app.py")).unwrap();
        let plain = fingerprint(dir);
        std::fs::write(dir.join("notes.md"), "n").unwrap();
        assert_ne!(plain, fingerprint(dir));
    }
}
