//! Compiles `shim/shim.cpp` against the LibTorch that torch-sys found
//! (its include directory is beside the library directory it reports).

use std::path::PathBuf;

fn main() {
    if std::env::var_os("CARGO_FEATURE_LIBTORCH").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed=shim/shim.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let lib = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys reports where LibTorch is"),
    );
    // For the server's build script (DEP_TERN_TORCH_LIBTORCH_LIB): the binary's rpath.
    println!("cargo:libtorch_lib={}", lib.display());
    // This crate's own unit tests find LibTorch where the build did.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    let include = lib.join("../include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!(
            "-D_GLIBCXX_USE_CXX11_ABI={}",
            std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into())
        ))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("shim/shim.cpp");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build.define("TERN_TORCH_CUDA", None);
    }
    build.compile("tern_torch_shim");
}
