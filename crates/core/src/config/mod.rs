//! Model configuration: the prost types generated from `proto/model_config.proto`,
//! `config.pbtxt` parsing (protobuf text format), Triton-style JSON rendering,
//! normalisation and validation.

pub mod json;
pub mod validate;

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

use crate::error::{Error, Result};

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

/// Parses the protobuf text format of a `config.pbtxt`.
///
/// Unknown fields and wrongly typed values are errors, never silently dropped.
pub fn parse_pbtxt(text: &str) -> Result<ModelConfig> {
    let text = add_list_colons(text);
    let msg = DynamicMessage::parse_text_format(model_config_descriptor(), &text)
        .map_err(|e| Error::invalid_arg(format!("failed to parse config.pbtxt: {e}")))?;
    msg.transcode_to::<ModelConfig>()
        .map_err(|e| Error::internal(format!("failed to convert parsed config: {e}")))
}

/// Protobuf's text format lets a list of messages omit the colon
/// (`input [ { ... } ]`), and Triton configs rely on it; the parser we use
/// wants `input: [ ... ]`. Inserts the colon where a field name is directly
/// followed by `[`, leaving strings and comments alone.
fn add_list_colons(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    let mut last_significant: Option<char> = None;
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => {
                out.push(c);
                while let Some(d) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            out.push(e);
                        }
                    } else if d == c || d == '\n' {
                        break;
                    }
                }
                last_significant = Some(c);
            }
            '#' => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '[' => {
                if last_significant.is_some_and(|p| p.is_ascii_alphanumeric() || p == '_') {
                    out.push(':');
                }
                out.push(c);
                last_significant = Some(c);
            }
            c if c.is_whitespace() => out.push(c),
            c => {
                out.push(c);
                last_significant = Some(c);
            }
        }
    }
    out
}

/// Whether a config describes an ensemble.
pub fn is_ensemble(cfg: &ModelConfig) -> bool {
    cfg.platform == "ensemble"
        || matches!(
            cfg.scheduling_choice,
            Some(pb::model_config::SchedulingChoice::EnsembleScheduling(_))
        )
}

/// Renders a config as protobuf text format (used in logs and docs).
pub fn to_pbtxt(config: &ModelConfig) -> String {
    let mut msg = DynamicMessage::new(model_config_descriptor());
    msg.transcode_from(config)
        .expect("prost message transcodes to its own descriptor");
    msg.to_text_format()
}

#[cfg(test)]
mod tests;
