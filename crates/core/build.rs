//! Compiles `proto/model_config.proto` (Triton's model configuration) with the
//! pure-Rust `protox` compiler (no system `protoc`) into prost types, and
//! writes the descriptor set `prost-reflect` uses to parse `config.pbtxt`.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["model_config.proto"], ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out.join("model_config.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    prost_build::Config::new()
        .bytes([".inference"])
        .compile_fds(fds)?;
    Ok(())
}
