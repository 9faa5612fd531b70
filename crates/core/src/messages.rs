//! Triton's own error texts, where a client sees them: one function each,
//! returning the error with Triton's code, so that a text Triton clients
//! match on (tritonclient, perf_analyzer, users' retry logic) is spelled in
//! one place and tested. Where Tern adds what Triton leaves out (which
//! model, which priority level), it appends it after Triton's words.

#[cfg(test)]
use crate::error::Code;
use crate::error::Error;

/// An inference or metadata request for a model (version) the server does
/// not serve (`NOT_FOUND`; Triton's `ModelRepositoryManager::GetModel`).
pub fn unknown_model(name: &str, version: Option<i64>) -> Error {
    let version = version.map(|v| format!(" version {v}")).unwrap_or_default();
    Error::not_found(format!(
        "Request for unknown model: '{name}'{version} is not found"
    ))
}

/// A request for a model none of whose versions (or not the version asked
/// for) is ready (`NOT_FOUND`; Triton's `model_lifecycle.cc`), with why it
/// is not (loading, failed, unloading) after Triton's words.
pub fn not_ready(name: &str, version: Option<i64>, reason: &str) -> Error {
    let what = match version {
        None => "has no available versions".to_string(),
        Some(v) => format!("version {v} is not at ready state"),
    };
    Error::not_found(format!(
        "Request for unknown model: '{name}' {what} ({reason})"
    ))
}

/// gRPC ModelInfer on a decoupled model (`UNSUPPORTED`; Triton's
/// `grpc/infer_handler.cc`).
pub fn grpc_infer_decoupled() -> Error {
    Error::unsupported("ModelInfer RPC doesn't support models with decoupled transaction policy")
}

/// HTTP infer on a decoupled model (`UNSUPPORTED`; Triton's `http_server.cc`).
pub fn http_infer_decoupled() -> Error {
    Error::unsupported("HTTP end point doesn't support models with decoupled transaction policy")
}

/// A `triton_enable_empty_final_response` parameter that is not a bool
/// (`INVALID_ARG`; Triton's `grpc/stream_infer_handler.cc`).
pub fn empty_final_response_type() -> Error {
    Error::invalid_arg(
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param.",
    )
}

/// The body of the 403 an `--http-restricted-api` endpoint answers without
/// its header (Triton's `http_server.cc`).
pub fn api_restricted(header: &str) -> String {
    format!("This API is restricted, expecting header '{header}'")
}

/// A generate request's input that cannot take the model input's shape
/// (`INVALID_ARG`; Triton's `http_server.cc` generate schema).
pub fn generate_cannot_convert(input: &str) -> Error {
    Error::invalid_arg(format!(
        "The schema can not convert input '{input}' to tensor with proper shape"
    ))
}

/// A generate request parameter of a JSON type Triton does not take
/// (`INVALID_ARG`).
pub fn generate_parameter_type(key: &str) -> Error {
    Error::invalid_arg(format!(
        "parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
    ))
}

/// A load or unload through the API while the repository is polled
/// (`UNAVAILABLE`; Triton's `model_repository_manager.cc`).
pub fn control_while_polling() -> Error {
    Error::unavailable("explicit model load / unload is not allowed if polling is enabled")
}

/// A request refused because its priority level's queue is full
/// (`UNAVAILABLE`; Triton's `scheduler_utils.cc`), naming the model and level.
pub fn queue_full(model: &str, level: u64) -> Error {
    Error::unavailable(format!(
        "Exceeds maximum queue size: model '{model}' priority level {level} is full"
    ))
}

/// A queued request whose timeout passed under `timeout_action: REJECT`
/// (`UNAVAILABLE`; Triton's `scheduler_utils.cc`), naming the model.
pub fn request_timeout(model: &str) -> Error {
    Error::unavailable(format!("Request timeout expired for model '{model}'"))
}

/// A decoupled model sending after its final flag (`INVALID_ARG`; Triton's
/// python_backend `response_sender.cc`).
pub fn sender_closed() -> Error {
    Error::invalid_arg("Unable to send response. Response sender has been closed.")
}

/// An ensemble whose `max_batch_size` exceeds a composing model's
/// (`INVALID_ARG`; Triton's `ensemble_utils.cc`), naming the step.
pub fn ensemble_batch_too_large(
    ensemble: &str,
    max: i32,
    model: &str,
    model_max: i32,
    step: usize,
) -> Error {
    Error::invalid_arg(format!(
        "ensemble {ensemble} allows maximum batch size {max}, but it contains model {model} which only allows maximum batch size to be {model_max} (step {step})"
    ))
}

/// An ensemble step fed by two different decoupled steps (`INVALID_ARG`;
/// Triton's `ensemble_scheduler.cc`).
pub fn ensemble_two_decoupled_origins(ensemble: &str, model: &str) -> Error {
    Error::invalid_arg(format!(
        "in ensemble {ensemble}, step of model '{model}' receives inputs originated from different decoupled models"
    ))
}

/// A sequence request with a batch size other than 1 (`INVALID_ARG`;
/// Triton's `sequence_batch_scheduler.cc`).
pub fn sequence_batch_size_one(model: &str) -> Error {
    Error::invalid_arg(format!(
        "inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
    ))
}

/// A request to a sequence model without a correlation ID (`INVALID_ARG`).
pub fn sequence_correlation_id_required(model: &str) -> Error {
    Error::invalid_arg(format!(
        "inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
    ))
}

/// The first request of a sequence without the START flag (`INVALID_ARG`).
pub fn sequence_start_required(id: &str, model: &str) -> Error {
    Error::invalid_arg(format!(
        "inference request for sequence {id} to model '{model}' must specify the START flag on the first request of the sequence"
    ))
}

/// A model that enables the response cache with a scheduler or transaction
/// policy the cache cannot serve (`INVALID_ARG` at load; Triton's
/// `model_config_utils.cc`): `what` is `sequence batching scheduler` or
/// `'decoupled' transaction policy`.
pub fn response_cache_unsupported(model: &str, what: &str) -> Error {
    Error::invalid_arg(format!(
        "Response Cache does not currently support model {model} with {what}. Please disable the response cache."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each text as tritonserver 2.51 sends it (the parts Tern appends are
    /// marked in the function docs).
    #[test]
    fn texts_are_tritons() {
        let cases: [(Error, Code, &str); 20] = [
            (not_ready("m", None, "failed"), Code::NotFound, "Request for unknown model: 'm' has no available versions (failed)"),
            (not_ready("m", Some(2), "loading"), Code::NotFound, "Request for unknown model: 'm' version 2 is not at ready state (loading)"),
            (unknown_model("m", None), Code::NotFound, "Request for unknown model: 'm' is not found"),
            (unknown_model("m", Some(3)), Code::NotFound, "Request for unknown model: 'm' version 3 is not found"),
            (grpc_infer_decoupled(), Code::Unsupported, "ModelInfer RPC doesn't support models with decoupled transaction policy"),
            (http_infer_decoupled(), Code::Unsupported, "HTTP end point doesn't support models with decoupled transaction policy"),
            (empty_final_response_type(), Code::InvalidArg, "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
            (generate_cannot_convert("x"), Code::InvalidArg, "The schema can not convert input 'x' to tensor with proper shape"),
            (generate_parameter_type("k"), Code::InvalidArg, "parameter 'k' has invalid type. It should be either 'int', 'bool', or 'string'."),
            (control_while_polling(), Code::Unavailable, "explicit model load / unload is not allowed if polling is enabled"),
            (queue_full("m", 2), Code::Unavailable, "Exceeds maximum queue size: model 'm' priority level 2 is full"),
            (request_timeout("m"), Code::Unavailable, "Request timeout expired for model 'm'"),
            (sender_closed(), Code::InvalidArg, "Unable to send response. Response sender has been closed."),
            (ensemble_batch_too_large("e", 8, "m", 4, 1), Code::InvalidArg, "ensemble e allows maximum batch size 8, but it contains model m which only allows maximum batch size to be 4 (step 1)"),
            (ensemble_two_decoupled_origins("e", "m"), Code::InvalidArg, "in ensemble e, step of model 'm' receives inputs originated from different decoupled models"),
            (sequence_batch_size_one("m"), Code::InvalidArg, "inference request to model 'm' must specify batch-size 1 due to requirements of sequence batcher"),
            (sequence_correlation_id_required("m"), Code::InvalidArg, "inference request to model 'm' must specify a non-zero or non-empty correlation ID"),
            (response_cache_unsupported("m", "sequence batching scheduler"), Code::InvalidArg, "Response Cache does not currently support model m with sequence batching scheduler. Please disable the response cache."),
            (response_cache_unsupported("m", "'decoupled' transaction policy"), Code::InvalidArg, "Response Cache does not currently support model m with 'decoupled' transaction policy. Please disable the response cache."),
            (sequence_start_required("7", "m"), Code::InvalidArg, "inference request for sequence 7 to model 'm' must specify the START flag on the first request of the sequence"),
        ];
        for (e, code, text) in cases {
            assert_eq!((e.code, e.message.as_str()), (code, text));
        }
        assert_eq!(
            api_restricted("k"),
            "This API is restricted, expecting header 'k'"
        );
    }
}
