//! Compiles Triton's gRPC service (`proto/grpc_service.proto`) and the gRPC
//! health service with the pure-Rust `protox` compiler (no system `protoc`)
//! into prost types and a tonic server. The model configuration messages come
//! from `tern-core` (`tern_core::config::pb`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    version_info();
    libtorch_rpath();
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=../crates/core/proto");
    let fds = protox::compile(
        ["grpc_service.proto", "health.proto"],
        ["proto", "../crates/core/proto"],
    )?;
    let mut builder = tonic_prost_build::configure()
        .build_client(false)
        .bytes(".inference");
    // Every type of model_config.proto is tern-core's, not generated again.
    for file in fds.file.iter().filter(|f| f.name() == "model_config.proto") {
        let names = file.message_type.iter().map(|m| m.name());
        for name in names.chain(file.enum_type.iter().map(|e| e.name())) {
            builder = builder.extern_path(
                format!(".inference.{name}"),
                format!("::tern_core::config::pb::{name}"),
            );
        }
    }
    builder.compile_fds(fds)?;
    Ok(())
}

/// With the `torch` feature the binary links LibTorch's shared libraries:
/// it looks for them in `../lib/tern` beside itself (where packages put
/// them), then where the build found them.
fn libtorch_rpath() {
    if let Ok(lib) = std::env::var("DEP_TERN_TORCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,$ORIGIN/../lib/tern:{lib}");
    }
}

/// What `tern --version` reports about the build: the target triple and the
/// git commit (`TERN_GIT_COMMIT` when set, as for builds from a tarball).
fn version_info() {
    println!(
        "cargo:rustc-env=TERN_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!("cargo:rerun-if-env-changed=TERN_GIT_COMMIT");
    let commit = std::env::var("TERN_GIT_COMMIT").ok().or_else(|| {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    println!(
        "cargo:rustc-env=TERN_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    // Follow the commit: HEAD names the branch, the branch's ref file (or packed-refs) its commit.
    let git = std::path::Path::new("../.git");
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        println!("cargo:rerun-if-changed=../.git/HEAD");
        if let Some(r) = head.strip_prefix("ref: ") {
            let r = git.join(r.trim());
            if r.exists() {
                println!("cargo:rerun-if-changed={}", r.display());
            } else {
                println!("cargo:rerun-if-changed=../.git/packed-refs");
            }
        }
    }
}
