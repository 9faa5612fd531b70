//! `tern plugin new`: writes a plugin folder from templates and the guest
//! SDK sources embedded at compile time, so the binary alone is enough.

use std::path::Path;

use super::Lang;
use tern_core::error::{Error, Result};

const WIT: &str = include_str!("../../../wit/plugin.wit");
const CONFIG: &str = include_str!("templates/config.pbtxt");
const README: &str = include_str!("templates/README.md");

/// (path inside the plugin folder, contents) for one language.
fn files(lang: Lang) -> Vec<(&'static str, &'static str)> {
    match lang {
        Lang::Rust => vec![
            ("Cargo.toml", include_str!("templates/rust_Cargo.toml")),
            ("src/lib.rs", include_str!("templates/rust_lib.rs")),
            (
                "sdk/rust/Cargo.toml",
                include_str!("templates/rust_sdk_Cargo.toml"),
            ),
            (
                "sdk/rust/src/lib.rs",
                include_str!("../../../guest-sdk/rust/src/lib.rs"),
            ),
            (
                "sdk/rust/src/tensor.rs",
                include_str!("../../../guest-sdk/rust/src/tensor.rs"),
            ),
            (
                "sdk/rust/src/ops.rs",
                include_str!("../../../guest-sdk/rust/src/ops.rs"),
            ),
        ],
        Lang::Python => vec![
            ("app.py", include_str!("templates/python_app.py")),
            (
                "sdk/tern_plugin.py",
                include_str!("../../../guest-sdk/python/tern_plugin.py"),
            ),
            (
                "sdk/tern_ops.py",
                include_str!("../../../guest-sdk/python/tern_ops.py"),
            ),
        ],
        Lang::Js => vec![
            ("model.js", include_str!("templates/js_model.js")),
            ("sdk/tern.js", include_str!("../../../guest-sdk/js/tern.js")),
        ],
        Lang::C => vec![
            ("model.c", include_str!("templates/c_model.c")),
            (
                "sdk/tern_plugin.h",
                include_str!("../../../guest-sdk/c/tern_plugin.h"),
            ),
            (
                "sdk/tern_plugin.c",
                include_str!("../../../guest-sdk/c/tern_plugin.c"),
            ),
            (
                "sdk/bindings/plugin.h",
                include_str!("../../../guest-sdk/c/bindings/plugin.h"),
            ),
            (
                "sdk/bindings/plugin.c",
                include_str!("../../../guest-sdk/c/bindings/plugin.c"),
            ),
        ],
    }
}

fn recipe(lang: Lang) -> (&'static str, &'static str) {
    match lang {
        Lang::Rust => (
            "src/lib.rs",
            "cargo build --release --target wasm32-wasip2, copied to 1/model.wasm",
        ),
        Lang::Python => (
            "app.py",
            "componentize-py -d wit -w plugin componentize -p sdk app -o 1/model.wasm",
        ),
        Lang::Js => (
            "model.js",
            "jco componentize model.js --wit wit --world-name plugin --backend qjs ... -o 1/model.wasm",
        ),
        Lang::C => (
            "model.c",
            "clang --target=wasm32-wasi -mexec-model=reactor, linked by wasm-component-ld",
        ),
    }
}

/// Checks that `name` is usable as a model name and a package name.
pub(super) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_arg(format!(
            "plugin name '{name}': use a letter followed by letters, digits, '_' or '-'"
        )))
    }
}

/// Creates the plugin folder `dir` for `lang`; returns how many files were
/// written. Refuses a folder that exists and is not empty.
pub fn create(dir: &Path, lang: Lang) -> Result<usize> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::invalid_arg(format!("'{}' has no folder name", dir.display())))?;
    check_name(name)?;
    if dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(Error::already_exists(format!(
            "'{}' exists and is not empty",
            dir.display()
        )));
    }
    let (source, recipe) = recipe(lang);
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{lang}}", lang.label())
            .replace("{{source}}", source)
            .replace("{{recipe}}", recipe)
    };
    let mut all = vec![
        ("config.pbtxt", fill(CONFIG)),
        ("README.md", fill(README)),
        ("wit/plugin.wit", WIT.to_string()),
    ];
    all.extend(files(lang).into_iter().map(|(p, t)| (p, fill(t))));
    for (path, text) in &all {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        std::fs::write(&target, text).map_err(|e| io(&target, e))?;
    }
    Ok(all.len())
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::internal(format!("cannot write '{}': {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_language_and_refuses_to_overwrite() {
        let tmp = tempfile::tempdir().unwrap();
        for lang in [Lang::Rust, Lang::Python, Lang::Js, Lang::C] {
            let dir = tmp.path().join(format!("p_{lang:?}").to_lowercase());
            let n = create(&dir, lang).unwrap();
            assert!(n >= 5, "{lang:?}: {n} files");
            let config = std::fs::read_to_string(dir.join("config.pbtxt")).unwrap();
            assert!(config.contains(&format!("name: \"p_{lang:?}\"").to_lowercase()));
            assert!(!config.contains("{{"));
            assert!(dir.join("wit/plugin.wit").is_file());
            let e = create(&dir, lang).unwrap_err();
            assert!(e.to_string().contains("not empty"), "{e}");
        }
        assert!(create(&tmp.path().join("9bad"), Lang::C).is_err());
        assert!(create(&tmp.path().join("has space"), Lang::C).is_err());
    }
}
