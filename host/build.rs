//! Compiles Triton's gRPC service (`proto/grpc_service.proto`) and the gRPC
//! health service with the pure-Rust `protox` compiler (no system `protoc`)
//! into prost types and a tonic server. The model configuration messages come
//! from `tern-core` (`tern_core::config::pb`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
