//! Triton's own error texts, where a client sees them: one function each,
//! returning the error with Triton's code, so that a text Triton clients
//! match on (tritonclient, perf_analyzer, users' retry logic) is spelled in
//! one place and tested. Where Tern adds what Triton leaves out (which
//! model, which priority level), it appends it after Triton's words.

#[cfg(test)]
use crate::error::Code;
use crate::error::Error;
use crate::tensor::shape_str;

/// An inference or metadata request for a model (version) the server does
/// not serve (`NOT_FOUND`; Triton's `ModelRepositoryManager::GetModel`).
pub fn unknown_model(name: &str, version: Option<i64>) -> Error {
    let version = version.map(|v| format!(" version {v}")).unwrap_or_default();
    Error::not_found(format!(
        "Request for unknown model: '{name}'{version} is not found"
    ))
}

/// A request for a model none of whose versions is ready (`NOT_FOUND`), or
/// whose version asked for exists but is not ready (`UNAVAILABLE`), as
/// Triton's `model_lifecycle.cc` answers; why it is not (loading, failed,
/// unloading) follows Triton's words.
pub fn not_ready(name: &str, version: Option<i64>, reason: &str) -> Error {
    match version {
        None => Error::not_found(format!(
            "Request for unknown model: '{name}' has no available versions ({reason})"
        )),
        Some(v) => Error::unavailable(format!(
            "Request for unknown model: '{name}' version {v} is not at ready state ({reason})"
        )),
    }
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

/// A request released for rescheduling by a model without
/// `sequence_batching { iterative_sequence: true }` (`INVALID_ARG`;
/// Triton's `InferenceRequest::Release`).
pub fn reschedule_not_iterative() -> Error {
    Error::invalid_arg(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle such a flag.",
    )
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

/// Triton's `LogRequest()` prefix of core request errors:
/// `[request id: <id>] `, `<id_unknown>` when the request has no id.
pub fn log_request(id: &str) -> String {
    let id = if id.is_empty() { "<id_unknown>" } else { id };
    format!("[request id: {id}] ")
}

/// An input name given twice in one request (`INVALID_ARG`; Triton's
/// `InferenceRequest::AddOriginalInput`).
pub fn duplicate_input(request_id: &str, input: &str) -> Error {
    Error::invalid_arg(format!(
        "{}input '{input}' already exists in request",
        log_request(request_id)
    ))
}

/// An output requested twice in one request (`INVALID_ARG`; current Triton's
/// `InferenceRequest::AddOriginalRequestedOutput`; 2.51 answered it once).
pub fn duplicate_output(request_id: &str, output: &str) -> Error {
    Error::invalid_arg(format!(
        "{}output '{output}' already exists in request",
        log_request(request_id)
    ))
}

/// A fixed-size input whose data is not the size its shape needs
/// (`INVALID_ARG`; Triton's `InferenceRequest::Normalize`).
pub fn input_byte_size_mismatch(
    request_id: &str,
    input: &str,
    model: &str,
    expected: usize,
    got: usize,
) -> Error {
    Error::invalid_arg(format!(
        "{}input byte size mismatch for input '{input}' for model '{model}'. Expected {expected}, got {got}",
        log_request(request_id)
    ))
}

/// A tensor shape with a negative dim (`INVALID_ARG`; current Triton core's
/// `GetByteSize`, for fixed-size data types).
pub fn invalid_dimension(tensor: &str, shape: &[i64]) -> Error {
    Error::invalid_arg(format!(
        "tensor '{tensor}' contains an invalid dimension {}",
        shape_str(shape)
    ))
}

/// [`invalid_dimension`] for a BYTES tensor (current Triton core's
/// `GetElementCount`).
pub fn invalid_dimension_in_shape(tensor: &str, shape: &[i64]) -> Error {
    Error::invalid_arg(format!(
        "tensor '{tensor}' contains an invalid dimension in shape {}",
        shape_str(shape)
    ))
}

/// A BYTES tensor whose element count passes `i64::MAX` (`INVALID_ARG`;
/// current Triton core).
pub fn element_count_too_large(tensor: &str) -> Error {
    Error::invalid_arg(format!(
        "element count for tensor '{tensor}' exceeds maximum size of {}",
        i64::MAX
    ))
}

/// A tensor whose byte size passes `i64::MAX` (`INVALID_ARG`; current
/// Triton core's `GetByteSize`).
pub fn byte_size_too_large(tensor: &str) -> Error {
    Error::invalid_arg(format!(
        "byte size for tensor '{tensor}' exceeds maximum size of {}",
        i64::MAX
    ))
}

/// An HTTP JSON `shape` that is not a list of non-negative integers
/// (`INTERNAL`, as Triton's JSON reader fails; `http_server.cc`).
pub fn json_shape_not_unsigned() -> Error {
    Error::internal(
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
    )
}

/// An HTTP JSON `shape` that is not a list (`INTERNAL`; `http_server.cc`).
pub fn json_shape_not_array() -> Error {
    Error::internal("Unable to parse 'shape': attempt to access JSON non-array as array")
}

/// The shape of an HTTP input with JSON `data` has a negative dim (a dim of
/// 2^63 or more, read as unsigned and cast) (`INVALID_ARG`; current
/// Triton's `http_server.cc`).
pub fn json_shape_invalid_dims(input: &str, shape: &[i64]) -> Error {
    Error::invalid_arg(format!(
        "invalid shape for input '{input}': shape {} contains one or more invalid dimensions",
        shape_str(shape)
    ))
}

/// The shape of an HTTP input with JSON `data` has more than `i64::MAX`
/// elements (`INVALID_ARG`; current Triton's `http_server.cc`).
pub fn json_shape_count_overflow(input: &str, shape: &[i64]) -> Error {
    Error::invalid_arg(format!(
        "invalid shape for input '{input}': shape {} causes total element count to exceed maximum size of {}",
        shape_str(shape),
        i64::MAX
    ))
}

/// An HTTP input with JSON `data` whose byte size passes `i64::MAX`
/// (`INVALID_ARG`; current Triton's `http_server.cc`).
pub fn json_byte_size_overflow(input: &str, elements: i64, type_size: usize) -> Error {
    Error::invalid_arg(format!(
        "byte size overflow for input '{input}': element count ({elements}) * data type size ({type_size}) exceeds maximum allowed size ({})",
        i64::MAX
    ))
}

/// Triton's `kTritonSharedMemoryRegionPrefix`: shm keys of this prefix are
/// the Python backend's own, which clients may not register.
pub const RESERVED_SHM_PREFIX: &str = "triton_python_backend_shm_region_";

/// A system shared-memory key that cannot be opened (`INTERNAL`; Triton's
/// `shared_memory_manager.cc`, `shm_open` failing).
pub fn shm_open_failed(key: &str) -> Error {
    Error::internal(format!("Unable to open shared memory region: '{key}'"))
}

/// A system shared-memory object whose size cannot be read (`INTERNAL`;
/// Triton's `shared_memory_manager.cc`, `fstat` failing).
pub fn shm_invalid_region(key: &str) -> Error {
    Error::internal(format!("Invalid shared memory region: '{key}'"))
}

/// A shared-memory key that is empty or only slashes (`INVALID_ARG`; current
/// Triton's `ValidateSharedMemoryKey`).
pub fn shm_invalid_key(name: &str, key: &str) -> Error {
    Error::invalid_arg(format!(
        "cannot register shared memory region '{name}' - invalid shm key '{key}'"
    ))
}

/// A shared-memory key of the Python backend's reserved prefix
/// (`INVALID_ARG`; current Triton's `ValidateSharedMemoryKey`).
pub fn shm_reserved_key(name: &str, key: &str) -> Error {
    Error::invalid_arg(format!(
        "cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved prefix '{RESERVED_SHM_PREFIX}'"
    ))
}

/// A tensor naming a region that is not registered (`NOT_FOUND`; Triton's
/// `SharedMemoryManager::GetMemoryInfo`).
pub fn shm_unknown_region(region: &str) -> Error {
    Error::not_found(format!("Unable to find shared memory region: '{region}'"))
}

/// A tensor offset at or past the end of its region (`INVALID_ARG`;
/// `GetMemoryInfo`).
pub fn shm_invalid_offset(region: &str) -> Error {
    Error::invalid_arg(format!(
        "Invalid offset for shared memory region: '{region}'"
    ))
}

/// A tensor whose offset + byte size overflows (`INVALID_ARG`; current
/// Triton's `GetMemoryInfo`).
pub fn shm_offset_overflow(region: &str, byte_size: usize, offset: usize) -> Error {
    Error::invalid_arg(format!(
        "Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value ({}) for region '{region}'",
        usize::MAX
    ))
}

/// A tensor running past the end of its region (`INVALID_ARG`;
/// `GetMemoryInfo`).
pub fn shm_invalid_offset_size(region: &str) -> Error {
    Error::invalid_arg(format!(
        "Invalid offset + byte size for shared memory region: '{region}'"
    ))
}

/// An output larger than the shared memory the request gave it (`INTERNAL`;
/// Triton's HTTP and gRPC response allocators).
pub fn shm_output_too_small(output: &str, given: usize, needed: usize) -> Error {
    Error::internal(format!(
        "shared memory size specified with the request for output '{output}' ({given} bytes) should be at least {needed} bytes to hold the results"
    ))
}

/// An HTTP request's JSON (the whole body, or its first
/// `Inference-Header-Content-Length` bytes) over `--http-max-input-size`
/// (`INVALID_ARG`; current Triton's `EVBufferToJson`).
pub fn json_too_large(len: usize, limit: usize) -> Error {
    Error::invalid_arg(format!(
        "request JSON size of {len} bytes exceeds the maximum allowed input size of {limit} bytes. Use --http-max-input-size to increase the limit."
    ))
}

/// A raw binary HTTP request (`Inference-Header-Content-Length: 0`) over
/// `--http-max-input-size` (`INVALID_ARG`; current Triton's `EVBufferToRawInput`).
pub fn raw_input_too_large(len: usize, limit: usize) -> Error {
    Error::invalid_arg(format!(
        "Raw input has a byte_size ({len} bytes) that exceeds the maximum allowed value of {limit} bytes. Use --http-max-input-size to increase the limit."
    ))
}

/// A compressed HTTP body that inflates past `--http-max-input-size`
/// (`INVALID_ARG`; current Triton's `DataCompressor`).
pub fn decompressed_too_large(limit: usize) -> Error {
    Error::invalid_arg(format!(
        "Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use --http-max-input-size to increase the limit."
    ))
}

/// A `Content-Length` past `i32::MAX`, the largest HTTP body Triton takes
/// (`INVALID_ARG`; Triton's `GetContentLength`).
pub fn content_length_out_of_range(value: &str) -> Error {
    Error::invalid_arg(format!(
        "Unable to parse Content-Length, value is out of range [ {}, {} ], got: {value}",
        i32::MIN,
        i32::MAX
    ))
}

/// An `Inference-Header-Content-Length` that is not a number (`INVALID_ARG`;
/// current Triton's `GetInferenceHeaderLength`).
pub fn header_length_unparsable(value: &str) -> Error {
    Error::invalid_arg(format!(
        "Unable to parse Inference-Header-Content-Length, got: {value}"
    ))
}

/// An `Inference-Header-Content-Length` that is negative or longer than the
/// body of `body_len` bytes (`INVALID_ARG`; Triton's `GetInferenceHeaderLength`).
pub fn header_length_out_of_range(body_len: usize, value: &str) -> Error {
    Error::invalid_arg(format!(
        "inference header size should be in range (0, {body_len}), got: {value}"
    ))
}

/// A logging update that names `log_file` (`UNSUPPORTED`; Triton's HTTP and
/// gRPC logging handlers).
pub fn log_file_unsupported() -> Error {
    Error::unsupported("log file location can not be updated through network protocol")
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
            (not_ready("m", Some(2), "loading"), Code::Unavailable, "Request for unknown model: 'm' version 2 is not at ready state (loading)"),
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
    }

    /// Texts of Triton's current source (server e1db8a6, core 73aad7c),
    /// which Tern follows where they differ from 2.51's.
    #[test]
    fn texts_are_current_tritons() {
        let big = (1i64 << 62) + 1;
        let cases: [(Error, Code, &str); 29] = [
            (duplicate_input("", "IN"), Code::InvalidArg, "[request id: <id_unknown>] input 'IN' already exists in request"),
            (duplicate_output("r7", "OUT"), Code::InvalidArg, "[request id: r7] output 'OUT' already exists in request"),
            (input_byte_size_mismatch("", "INPUT0", "m", 16, 8), Code::InvalidArg, "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 8"),
            (invalid_dimension("IN", &[-2, -2]), Code::InvalidArg, "tensor 'IN' contains an invalid dimension [-2,-2]"),
            (invalid_dimension_in_shape("IN", &[1, -2]), Code::InvalidArg, "tensor 'IN' contains an invalid dimension in shape [1,-2]"),
            (element_count_too_large("IN"), Code::InvalidArg, "element count for tensor 'IN' exceeds maximum size of 9223372036854775807"),
            (byte_size_too_large("IN"), Code::InvalidArg, "byte size for tensor 'IN' exceeds maximum size of 9223372036854775807"),
            (json_shape_not_unsigned(), Code::Internal, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
            (json_shape_not_array(), Code::Internal, "Unable to parse 'shape': attempt to access JSON non-array as array"),
            (json_shape_invalid_dims("IN", &[i64::MIN, 1]), Code::InvalidArg, "invalid shape for input 'IN': shape [-9223372036854775808,1] contains one or more invalid dimensions"),
            (json_shape_count_overflow("IN", &[i64::MAX, i64::MAX]), Code::InvalidArg, "invalid shape for input 'IN': shape [9223372036854775807,9223372036854775807] causes total element count to exceed maximum size of 9223372036854775807"),
            (json_byte_size_overflow("IN", big, 4), Code::InvalidArg, "byte size overflow for input 'IN': element count (4611686018427387905) * data type size (4) exceeds maximum allowed size (9223372036854775807)"),
            (shm_open_failed("/k"), Code::Internal, "Unable to open shared memory region: '/k'"),
            (shm_invalid_region("/k"), Code::Internal, "Invalid shared memory region: '/k'"),
            (shm_invalid_key("r", "//"), Code::InvalidArg, "cannot register shared memory region 'r' - invalid shm key '//'"),
            (shm_reserved_key("r", "/triton_python_backend_shm_region_1"), Code::InvalidArg, "cannot register shared memory region 'r' with key '/triton_python_backend_shm_region_1' as the key contains the reserved prefix 'triton_python_backend_shm_region_'"),
            (shm_unknown_region("nope"), Code::NotFound, "Unable to find shared memory region: 'nope'"),
            (shm_invalid_offset("r"), Code::InvalidArg, "Invalid offset for shared memory region: 'r'"),
            (shm_offset_overflow("r", 5, usize::MAX), Code::InvalidArg, "Integer overflow detected: byte_size (5) + offset (18446744073709551615) exceeds maximum value (18446744073709551615) for region 'r'"),
            (shm_invalid_offset_size("r"), Code::InvalidArg, "Invalid offset + byte size for shared memory region: 'r'"),
            (shm_output_too_small("OUTPUT0", 8, 16), Code::Internal, "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least 16 bytes to hold the results"),
            (json_too_large(70, 64), Code::InvalidArg, "request JSON size of 70 bytes exceeds the maximum allowed input size of 64 bytes. Use --http-max-input-size to increase the limit."),
            (raw_input_too_large(70, 64), Code::InvalidArg, "Raw input has a byte_size (70 bytes) that exceeds the maximum allowed value of 64 bytes. Use --http-max-input-size to increase the limit."),
            (decompressed_too_large(67108864), Code::InvalidArg, "Decompressed data size exceeds the maximum allowed value of 67108864 bytes. Use --http-max-input-size to increase the limit."),
            (content_length_out_of_range("99999999999"), Code::InvalidArg, "Unable to parse Content-Length, value is out of range [ -2147483648, 2147483647 ], got: 99999999999"),
            (header_length_unparsable("abc"), Code::InvalidArg, "Unable to parse Inference-Header-Content-Length, got: abc"),
            (header_length_out_of_range(232, "233"), Code::InvalidArg, "inference header size should be in range (0, 232), got: 233"),
            (log_file_unsupported(), Code::Unsupported, "log file location can not be updated through network protocol"),
            (shm_unknown_region(""), Code::NotFound, "Unable to find shared memory region: ''"),
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
