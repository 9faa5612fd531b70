//! JSON rendering and parsing of model configs with Triton's conventions:
//! proto field names (snake_case), enums as strings (`"TYPE_FP32"`), 64-bit
//! integers as JSON numbers, and default values printed.

use prost_reflect::{DeserializeOptions, DynamicMessage, SerializeOptions};

use super::{model_config_descriptor, ModelConfig};
use crate::error::{Error, Result};

/// Renders a config as Triton renders `GET /v2/models/{m}/config`.
pub fn to_json(config: &ModelConfig) -> serde_json::Value {
    let mut msg = DynamicMessage::new(model_config_descriptor());
    msg.transcode_from(config)
        .expect("prost message transcodes to its own descriptor");
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    msg.serialize_with_options(serde_json::value::Serializer, &options)
        .expect("serialising a model config to a JSON value cannot fail")
}

/// Parses a JSON model config (as accepted by Triton's load API), with either
/// proto or camelCase field names.
pub fn from_json(text: &str) -> Result<ModelConfig> {
    let mut de = serde_json::Deserializer::from_str(text);
    let msg = DynamicMessage::deserialize_with_options(
        model_config_descriptor(),
        &mut de,
        &DeserializeOptions::new(),
    )
    .map_err(|e| Error::invalid_arg(format!("failed to parse JSON model config: {e}")))?;
    msg.transcode_to::<ModelConfig>()
        .map_err(|e| Error::internal(format!("failed to convert parsed config: {e}")))
}
