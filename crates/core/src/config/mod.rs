//! Model configuration. This module owns the schema: the prost types
//! generated from `proto/model_config.proto` and their descriptor. The rest
//! is in one submodule each: `text` (`config.pbtxt` parsing and rendering),
//! `json` (Triton's JSON form), `defaults` (Triton's defaults filled in),
//! `validate` (the rules a config must follow) and `support` (what this
//! build acts on, warns about or refuses).

pub mod defaults;
pub mod json;
pub mod support;
mod text;
pub mod validate;

pub use text::{parse_pbtxt, to_pbtxt};

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, MessageDescriptor};

/// Generated protobuf types of Triton's model configuration (package `inference`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

pub use pb::ModelConfig;

static DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/model_config.bin"));

/// The message descriptor of `inference.ModelConfig`.
pub fn model_config_descriptor() -> MessageDescriptor {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(DESCRIPTOR_SET).expect("embedded descriptor set is valid")
    })
    .get_message_by_name("inference.ModelConfig")
    .expect("ModelConfig is in the descriptor set")
}

/// Whether a config describes an ensemble.
pub fn is_ensemble(cfg: &ModelConfig) -> bool {
    cfg.platform == "ensemble"
        || matches!(
            cfg.scheduling_choice,
            Some(pb::model_config::SchedulingChoice::EnsembleScheduling(_))
        )
}

#[cfg(test)]
mod tests;
