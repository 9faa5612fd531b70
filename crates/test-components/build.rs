//! Compiles the test plugins of `plugins/` (their own cargo workspace) for
//! `wasm32-wasip2` once, and writes their paths into `components.rs`, so
//! Rust tests can load real components the way the server does.
//!
//! The components go where `make plugins` puts them
//! (`$CARGO_TARGET_DIR/wasm32-wasip2/release`): when make has built them,
//! this is a no-op. A release build of the tests uses a private target
//! folder, because the outer cargo then holds the release lock.

use std::path::PathBuf;
use std::process::Command;

/// The plugins Rust tests use.
const COMPONENTS: &[&str] = &["add_sub", "misbehave", "bls_caller"];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let plugins = manifest.join("../../plugins").canonicalize().unwrap();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let target_dir = match (
        std::env::var("PROFILE").as_deref(),
        std::env::var("CARGO_TARGET_DIR"),
    ) {
        (Ok("release"), _) | (_, Err(_)) => out.join("target"),
        (_, Ok(dir)) => PathBuf::from(dir),
    };
    println!("cargo:rerun-if-changed={}", plugins.display());
    println!("cargo:rerun-if-changed=../../guest-sdk/rust");
    println!("cargo:rerun-if-changed=../../wit");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&plugins)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .arg("--target-dir")
        .arg(&target_dir);
    for c in COMPONENTS {
        cmd.args(["-p", c]);
    }
    // The outer build's flags and wrappers (clippy's, under `cargo clippy`)
    // are for the host crates, not for the plugins.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("cannot run cargo to build the test plugins");
    assert!(
        status.success(),
        "building the test plugins failed (is the wasm32-wasip2 target installed? \
         `rustup target add wasm32-wasip2`, which `make setup` does)"
    );
    let dir = target_dir.join("wasm32-wasip2/release");
    let mut consts = String::new();
    for c in COMPONENTS {
        let path = dir.join(format!("{c}.wasm"));
        assert!(path.exists(), "{} was not built", path.display());
        consts.push_str(&format!(
            "/// `plugins/{c}` compiled to a component.\npub const {}: &str = {:?};\n",
            c.to_uppercase(),
            path.display().to_string()
        ));
    }
    std::fs::write(out.join("components.rs"), consts).unwrap();
}
