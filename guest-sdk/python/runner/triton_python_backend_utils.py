"""`triton_python_backend_utils` as Triton Python models import it, inside
Tern's Python runner: the SDK's classes (`Tensor`, `InferenceRequest`,
`InferenceResponse`, `TritonError`, `Logger`, `MetricFamily`, ...) under
the names of Triton's `src/resources/triton_python_backend_utils.py` and
the `pb_utils` half of its stub, with tensors converting to and from the
runner's `numpy`."""

import numpy as np

import tern_plugin as _sdk
from tern_plugin import (  # noqa: F401 (re-exported)
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    Logger,
    MetricFamily,
    Tensor,
    TritonError,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
)

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class TritonModelException(Exception):
    """Raised by Triton's stub for a failed BLS call; kept for models that catch it."""


def using_decoupled_model_transaction_policy(model_config):
    """Whether the (parsed) model config is decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# TRITONSERVER_DataType numbers, as Triton's helpers use them.
_TRITON_TO_NUMPY = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64,
    6: np.int8, 7: np.int16, 8: np.int32, 9: np.int64,
    10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}


def triton_to_numpy_type(data_type):
    """The numpy type of a TRITONSERVER_DataType number (None if it has none)."""
    return _TRITON_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type):
    """The TRITONSERVER_DataType number of a numpy type (None if it has none)."""
    d = np.dtype(data_type)
    for k, v in _TRITON_TO_NUMPY.items():
        if np.dtype(v) is d:
            return k
    return None


_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string):
    """The numpy type of a config data type (`"TYPE_FP32"` -> `np.float32`)."""
    return _STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor):
    """A numpy array of bytes/str as Triton's length-prefixed wire form (a uint8 array)."""
    a = np.asarray(input_tensor)
    if a.size == 0:
        return np.empty([0], dtype=np.object_)
    return np.frombuffer(a.astype(np.object_).tobytes(), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor):
    """Triton's length-prefixed wire form as a 1-D object array of bytes."""
    raw = bytes(np.asarray(encoded_tensor).tobytes()) if not isinstance(encoded_tensor, (bytes, bytearray)) else bytes(encoded_tensor)
    items = _sdk._decode_strings("BYTES", raw)
    return np.array(items, dtype=np.object_)


def get_model_dir():
    """Not available: the model folder is `args["model_repository"]` in initialize."""
    raise NotImplementedError("pb_utils.get_model_dir is not available; use args['model_repository'] in initialize")
