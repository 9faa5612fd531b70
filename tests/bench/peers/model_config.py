"""Triton's model-configuration read (`GET /v2/models/NAME/config`, gRPC
`ModelConfig`) for the peer servers of `make bench-peers`.

perf_analyzer (service kind `triton`) reads a model's configuration once,
before it sends any request, to learn max_batch_size and the scheduler.
That read is a Triton extension: neither MLServer nor KServe implements it,
so perf_analyzer stops with "failed to get model config". The launchers
here add that one read-only endpoint to each server, over REST and gRPC,
answering a minimal configuration: the model's name and max_batch_size 0
(so perf_analyzer sends the full shapes given with --shape, batch dim
included). Inference requests go through the servers' own, unchanged v2
handlers.
"""


def config_json(name):
    return {"name": name, "max_batch_size": 0}


def _varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _message_field(number, payload):
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _request_name(data):
    """ModelConfigRequest.name (field 1) from its wire bytes."""
    i = 0
    while i < len(data):
        tag = data[i]
        i += 1
        if tag & 7 != 2:  # only length-delimited fields (name, version) exist
            raise ValueError("unexpected ModelConfigRequest field")
        n = shift = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if tag >> 3 == 1:
            return data[i : i + n].decode()
        i += n
    return ""


def grpc_handler():
    """A generic handler for /inference.GRPCInferenceService/ModelConfig whose
    answer is ModelConfigResponse{config: ModelConfig{name}} (max_batch_size 0 is
    the proto default), encoded by hand so no Triton proto module is needed."""
    import grpc

    async def model_config(name, context):
        return _message_field(1, _message_field(1, name.encode()))

    return grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelConfig": grpc.unary_unary_rpc_method_handler(model_config, request_deserializer=_request_name, response_serializer=bytes)},
    )
