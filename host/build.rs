//! Compiles `proto/*.proto` with the pure-Rust `protox` compiler (no system
//! `protoc`) and generates prost types, the tonic gRPC server, and a file
//! descriptor set that `prost-reflect` uses to parse `config.pbtxt` and
//! render JSON.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(
        ["model_config.proto", "grpc_service.proto", "health.proto"],
        ["proto"],
    )?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out.join("model_config.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .bytes(".inference")
        .compile_fds(fds)?;
    Ok(())
}
