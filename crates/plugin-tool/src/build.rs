//! `tern plugin build`: tells the language from the folder's files, finds
//! the toolchain (an environment variable, then `PATH`, then the usual
//! places), runs it, and moves the component into place only when the build
//! succeeded, so a server polling the repository never sees half a file.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::Lang;
use crate::progress::Status;
use tern_core::error::{Error, Result};

/// What `tern plugin build` was asked to do.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The plugin folder.
    pub dir: PathBuf,
    /// Output file (default `<dir>/1/model.wasm`).
    pub output: Option<PathBuf>,
    /// WIT folder (default `<dir>/wit`).
    pub wit: Option<PathBuf>,
    /// Guest SDK folder (default `<dir>/sdk`; unused for Rust).
    pub sdk: Option<PathBuf>,
}

/// Which language the folder holds, from its entry file.
pub fn detect(dir: &Path) -> Result<Lang> {
    let found = [
        ("Cargo.toml", Lang::Rust),
        ("app.py", Lang::Python),
        ("model.js", Lang::Js),
        ("model.c", Lang::C),
    ]
    .into_iter()
    .find(|(f, _)| dir.join(f).is_file());
    match found {
        Some((_, lang)) => Ok(lang),
        None if !dir.is_dir() => Err(Error::not_found(format!(
            "plugin folder '{}' does not exist",
            dir.display()
        ))),
        None => Err(Error::invalid_arg(format!(
            "cannot tell the language of '{}': expected Cargo.toml (Rust), app.py (Python), model.js (JavaScript) or model.c (C)",
            dir.display()
        ))),
    }
}

/// Builds the plugin; returns its language, the output path and its size.
pub fn build(opts: &BuildOptions) -> Result<(Lang, PathBuf, u64)> {
    let dir = absolute(&opts.dir)?;
    let lang = detect(&dir)?;
    let wit = absolute(&opts.wit.clone().unwrap_or_else(|| dir.join("wit")))?;
    let sdk = absolute(&opts.sdk.clone().unwrap_or_else(|| dir.join("sdk")))?;
    let out = absolute(
        &opts
            .output
            .clone()
            .unwrap_or_else(|| dir.join("1/model.wasm")),
    )?;
    if !wit.join("plugin.wit").is_file() && lang != Lang::Rust {
        return Err(Error::not_found(format!(
            "no WIT contract at '{}' (give --wit)",
            wit.join("plugin.wit").display()
        )));
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::internal(format!("cannot create '{}': {e}", parent.display())))?;
    }
    let mut tmp = out.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    match lang {
        Lang::Rust => rust(&dir, &tmp)?,
        Lang::Python => python(&dir, &wit, &sdk, &tmp)?,
        Lang::Js => js(&dir, &wit, &sdk, &tmp)?,
        Lang::C => c(&dir, &wit, &sdk, &tmp)?,
    }
    let size = std::fs::metadata(&tmp)
        .map_err(|e| Error::internal(format!("the toolchain wrote no '{}': {e}", tmp.display())))?
        .len();
    std::fs::rename(&tmp, &out).map_err(|e| {
        Error::internal(format!(
            "cannot move the component to '{}': {e}",
            out.display()
        ))
    })?;
    Ok((lang, out, size))
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p)
        .map_err(|e| Error::invalid_arg(format!("bad path '{}': {e}", p.display())))
}

/// Finds a program: `$env` if set, then `PATH`, then `extra` candidates.
fn find_tool(env: &str, name: &str, extra: &[PathBuf], hint: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(Error::unavailable(format!(
            "{env}='{}' does not exist; {hint}",
            p.display()
        )));
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(extra.iter().cloned())
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::unavailable(format!(
                "{name} was not found (set {env} or put it on PATH); {hint}"
            ))
        })
}

/// Runs `cmd`, turning a failure into an error with its output
/// (and `fail_hint` when a failure may mean a missing piece of toolchain).
/// Runs a toolchain step, showing its progress (see [`crate::progress`]);
/// on failure the error holds the tool's output.
fn run(mut cmd: Command, what: &str, hint: &str, fail_hint: Option<&str>) -> Result<()> {
    tracing::debug!("running {cmd:?}");
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::unavailable(format!("cannot run {what}: {e}; {hint}")))?;
    let (tx, rx) = mpsc::channel::<String>();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    for pipe in pipes.into_iter().flatten() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut status = Status::stderr(what);
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(line) => {
                status.line(&line, started.elapsed());
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => status.tick(started.elapsed()),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let exit = child
        .wait()
        .map_err(|e| Error::internal(format!("cannot wait for {what}: {e}")))?;
    status.finish(started.elapsed(), exit.success());
    if exit.success() {
        return Ok(());
    }
    let lines: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let shown = if lines.len() > 40 {
        [&lines[..30], &["..."], &lines[lines.len() - 8..]].concat()
    } else {
        lines
    };
    let mut msg = format!("{what} failed ({exit}):\n{}", shown.join("\n"));
    if let Some(h) = fail_hint {
        msg.push_str(&format!("\n({h})"));
    }
    Err(Error::invalid_arg(msg))
}

fn rust(dir: &Path, out: &Path) -> Result<()> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))
        .map_err(|e| Error::invalid_arg(format!("cannot read Cargo.toml: {e}")))?;
    let name = package_name(&manifest)
        .ok_or_else(|| Error::invalid_arg("Cargo.toml has no [package] name"))?;
    let cargo = find_tool("CARGO", "cargo", &[], "install Rust with rustup")?;
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("target"));
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--target",
        "wasm32-wasip2",
        "--manifest-path",
    ])
    .arg(dir.join("Cargo.toml"))
    .arg("--target-dir")
    .arg(&target_dir);
    let target = "the wasm32-wasip2 target must be installed: rustup target add wasm32-wasip2";
    run(cmd, "cargo build", target, Some(target))?;
    let built = target_dir
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    std::fs::copy(&built, out)
        .map(|_| ())
        .map_err(|e| Error::internal(format!("cannot copy '{}': {e}", built.display())))
}

/// `name = "..."` of the `[package]` table.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(v) = line.strip_prefix("name").map(str::trim_start) {
                if let Some(v) = v.strip_prefix('=') {
                    return Some(v.trim().trim_matches('"').to_string());
                }
            }
        }
    }
    None
}

fn python(dir: &Path, wit: &Path, sdk: &Path, out: &Path) -> Result<()> {
    let hint = "install it with: pip install componentize-py==0.25.1";
    let tool = find_tool("TERN_COMPONENTIZE_PY", "componentize-py", &[], hint)?;
    // Pure-Python dependencies listed in requirements.txt are vendored.
    let site = match dir.join("requirements.txt") {
        r if r.is_file() => Some(vendor(&r, &tool)?),
        _ => None,
    };
    let version = Command::new(&tool)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.trim()
                .strip_prefix("componentize-py ")
                .map(str::to_string)
        });
    let mut cmd = Command::new(tool);
    // componentize-py is Rust inside: a backtrace would bury the Python error.
    cmd.current_dir(dir)
        .env("RUST_BACKTRACE", "0")
        .arg("-d")
        .arg(wit)
        .args(["-w", "plugin", "componentize", "-p"])
        .arg(dir)
        .arg("-p")
        .arg(sdk);
    if let Some(site) = &site {
        cmd.arg("-p").arg(site.path());
    }
    cmd.args(["app", "-o"]).arg(out);
    run(cmd, "componentize-py", hint, Some(PYTHON_MODULES))?;
    // The server repairs what componentize-py up to 0.25.1 leaks
    // (tern_wasm::guest_fixes); the mark tells it which version built this.
    if let Some(version) = version {
        let mut bytes = std::fs::read(out)
            .map_err(|e| Error::internal(format!("cannot read '{}': {e}", out.display())))?;
        tern_wasm::guest_fixes::mark_toolchain(&mut bytes, "componentize-py", &version);
        std::fs::write(out, bytes)
            .map_err(|e| Error::internal(format!("cannot write '{}': {e}", out.display())))?;
    }
    Ok(())
}

/// What to do about a module the Python build cannot find.
const PYTHON_MODULES: &str = "a module the build cannot find must be vendored: list pure-Python \
    packages in requirements.txt beside app.py. numpy, cv2, PIL and other packages with native \
    code cannot run in the sandbox: use the host kernels (tern_ops, docs/plugins.md#native-prepost-processing-kernels-ops), \
    or serve a Triton model.py as it is with backend: \"python\", whose runner has a numpy subset \
    (docs/plugins.md#triton-python-models)";

/// Installs `requirements` into a private folder for componentize-py, with
/// the Python next to `componentize` (`$TERN_PYTHON` overrides), refusing
/// packages with native code, which cannot run in the sandbox.
fn vendor(requirements: &Path, componentize: &Path) -> Result<tempfile::TempDir> {
    let beside = componentize.with_file_name("python3");
    let python = match std::env::var_os("TERN_PYTHON").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None if beside.is_file() => beside,
        None => find_tool("TERN_PYTHON", "python3", &[], "install Python 3 with pip")?,
    };
    let site = tempfile::Builder::new()
        .prefix("tern-plugin-site")
        .tempdir()
        .map_err(|e| {
            Error::internal(format!("cannot create a folder for the requirements: {e}"))
        })?;
    let mut cmd = Command::new(python);
    // Relative paths in requirements.txt are relative to its folder.
    if let Some(folder) = requirements.parent() {
        cmd.current_dir(folder);
    }
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-compile",
        "--target",
    ])
    .arg(site.path())
    .arg("-r")
    .arg(requirements);
    run(cmd, "pip install -r requirements.txt", "install pip", None)?;
    if let Some((package, file)) = native_code(site.path()) {
        return Err(Error::invalid_arg(format!(
            "requirements.txt: '{package}' holds native code ('{file}'), which cannot run inside \
             the WebAssembly sandbox (a Python plugin bundles pure Python only); use the host \
             kernels instead (tern_ops: an ndarray and a cv2 subset, docs/plugins.md\
             #native-prepost-processing-kernels-ops), or do that step in an ONNX model"
        )));
    }
    Ok(site)
}

/// The first package under `site` with a native library in it, and that file.
fn native_code(site: &Path) -> Option<(String, String)> {
    let mut pending = vec![site.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let native = [".so", ".pyd", ".dylib"]
                .iter()
                .any(|x| name.ends_with(x) || name.contains(&format!("{x}.")));
            if native {
                let rel = path.strip_prefix(site).unwrap_or(&path);
                let package = rel
                    .components()
                    .next()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .unwrap_or_default();
                return Some((package, rel.display().to_string()));
            }
        }
    }
    None
}

fn js(dir: &Path, wit: &Path, sdk: &Path, out: &Path) -> Result<()> {
    let hint = "install it with: npm install @bytecodealliance/jco@1.35.0";
    let local = vec![dir.join("node_modules/.bin/jco")];
    let tool = find_tool("TERN_JCO", "jco", &local, hint)?;
    // jco only resolves imports under its module root: the closest folder
    // holding both the plugin and the SDK it imports.
    let root = dir
        .ancestors()
        .find(|a| sdk.starts_with(a))
        .unwrap_or(dir)
        .to_path_buf();
    let mut cmd = Command::new(tool);
    cmd.current_dir(dir)
        .arg("componentize")
        .arg("--cwd")
        .arg(&root)
        .arg(dir.join("model.js"))
        .arg("--wit")
        .arg(wit)
        .args([
            "--world-name",
            "plugin",
            // QuickJS: ~1.7 MB components that compile in ~2 s; WASI calls trap.
            "--backend",
            "qjs",
            "--backend-qjs-stub-wasi",
            "--backend-qjs-disable-async",
            "-o",
        ])
        .arg(out);
    run(cmd, "jco componentize", hint, None)
}

fn c(dir: &Path, wit: &Path, sdk: &Path, out: &Path) -> Result<()> {
    let apt =
        "install the toolchain with: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32";
    let clang = find_tool("TERN_CLANG", "clang", &[], apt)?;
    let linker = find_tool(
        "TERN_WASM_COMPONENT_LD",
        "wasm-component-ld",
        &rustlib_tool("wasm-component-ld"),
        "it ships with Rust (rustup) or: cargo install wasm-component-ld",
    )?;
    for f in ["tern_plugin.c", "tern_plugin.h", "bindings/plugin.c"] {
        if !sdk.join(f).is_file() {
            return Err(Error::not_found(format!(
                "C guest SDK file '{}' is missing (give --sdk)",
                sdk.join(f).display()
            )));
        }
    }
    let mut sources: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::invalid_arg(format!("cannot list '{}': {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    let mut link_type = OsString::from("-Wl,--component-type,");
    link_type.push(wit.join("plugin.wit"));
    let mut fuse = OsString::from("-fuse-ld=");
    fuse.push(&linker);
    let mut include = OsString::from("-I");
    include.push(sdk);
    let mut cmd = Command::new(clang);
    cmd.current_dir(dir)
        .args([
            "--target=wasm32-wasi",
            "-mexec-model=reactor",
            "-O2",
            "-Wall",
        ])
        .arg(include)
        .arg(fuse)
        .arg(link_type)
        .arg("-o")
        .arg(out)
        .args(&sources)
        .arg(sdk.join("tern_plugin.c"))
        .arg(sdk.join("bindings/plugin.c"));
    run(cmd, "clang", apt, Some(apt))
}

/// `<rustc sysroot>/lib/rustlib/<host>/bin/<name>`, where rustup puts
/// `wasm-component-ld`.
fn rustlib_tool(name: &str) -> Vec<PathBuf> {
    let rustc = |arg: &[&str]| {
        Command::new("rustc")
            .args(arg)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (Some(sysroot), Some(vv)) = (rustc(&["--print", "sysroot"]), rustc(&["-vV"])) else {
        return Vec::new();
    };
    let host = vv
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap_or("");
    vec![PathBuf::from(sysroot.trim())
        .join("lib/rustlib")
        .join(host.trim())
        .join("bin")
        .join(name)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_libraries_in_vendored_packages_are_found() {
        let site = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(site.path().join("six_like")).unwrap();
        std::fs::write(site.path().join("six_like/__init__.py"), "").unwrap();
        assert_eq!(native_code(site.path()), None);
        std::fs::create_dir_all(site.path().join("numpy/core")).unwrap();
        let lib = "numpy/core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so";
        std::fs::write(site.path().join(lib), "").unwrap();
        assert_eq!(
            native_code(site.path()),
            Some(("numpy".to_string(), lib.to_string()))
        );
    }

    #[test]
    fn detects_languages_and_reads_package_names() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(detect(&tmp.path().join("missing"))
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
        let e = detect(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("cannot tell the language"), "{e}");
        std::fs::write(tmp.path().join("model.js"), "").unwrap();
        assert_eq!(detect(tmp.path()).unwrap(), Lang::Js);
        assert_eq!(
            package_name("[package]\nname = \"my-plugin\"\n[dependencies]\nname = \"x\"")
                .as_deref(),
            Some("my-plugin")
        );
        assert_eq!(package_name("[workspace]\nname = \"x\""), None);
    }

    #[test]
    fn a_missing_tool_says_how_to_install_it() {
        let e = find_tool(
            "TERN_TEST_NO_SUCH_TOOL",
            "no-such-tool-xyz",
            &[],
            "install it with: magic",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("no-such-tool-xyz was not found") && e.contains("magic"),
            "{e}"
        );
    }
}
