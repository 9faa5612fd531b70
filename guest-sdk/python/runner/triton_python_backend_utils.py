"""`triton_python_backend_utils` as Triton Python models import it, inside
Tern's Python runner: the SDK's classes (`Tensor`, `InferenceRequest`,
`InferenceResponse`, `TritonError`, `Logger`, `MetricFamily`, ...) under
the names of Triton's `src/resources/triton_python_backend_utils.py` and
the `pb_utils` half of its stub, with tensors converting to and from the
runner's `numpy`."""

import json

import numpy as np

import tern_plugin as _sdk
from tern_plugin import (  # noqa: F401 (re-exported)
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
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

# TRITONSERVER_MemoryType, for BLS requests' `preferred_memory` (the sandbox
# has CPU memory only: what is asked for is accepted, tensors stay on the CPU).
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


class PreferredMemory:
    """Where a BLS request would like its outputs (Triton's `PreferredMemory`)."""

    def __init__(self, preferred_memory_type, preferred_device_id=0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


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


class ModelConfig:
    """The model's configuration as `TritonPythonModel.auto_complete_config`
    receives and returns it: `as_dict()` gives the parsed config; the
    setters fill in what `config.pbtxt` leaves out and refuse, with
    Triton's messages, what contradicts it."""

    def __init__(self, model_config):
        self._model_config = json.loads(model_config)
        for key, empty in (("input", []), ("output", []), ("max_batch_size", 0)):
            self._model_config.setdefault(key, empty)

    def _name(self):
        return self._model_config.get("name", "")

    def as_dict(self):
        """The configuration as a dict."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size):
        """Sets max_batch_size; ValueError when the config already has a larger one."""
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but in auto-complete-config "
                             f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        """Makes dynamic batching the scheduler unless the config chose another."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                                 f"function for model '{self._name()}' tries to set scheduling_choice as "
                                 "'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind, tensor, allowed):
        label = f"{kind} '{tensor.get('name')}'" if "name" in tensor else kind
        where = f"in auto-complete-config function for model '{self._name()}'"
        for key in tensor:
            if key not in allowed:
                names = ", ".join(f"'{a}'" for a in allowed[:-1]) + f" and '{allowed[-1]}'"
                raise ValueError(f"{label} {where} contains property other than {names}.")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{label} {where} is missing '{key}' property.")
        for current in self._model_config[kind]:
            if current.get("name") != tensor["name"]:
                continue
            declared = current.get("data_type", "TYPE_INVALID")
            if declared != "TYPE_INVALID" and declared != tensor["data_type"]:
                raise ValueError(f"unable to load model '{self._name()}', configuration expects datatype "
                                 f"{declared} for {kind} '{tensor['name']}', model provides {tensor['data_type']}")
            if current.get("dims") and [int(d) for d in current["dims"]] != [int(d) for d in tensor["dims"]]:
                raise ValueError(f"model '{self._name()}', tensor '{tensor['name']}': the model expects dims "
                                 f"{list(tensor['dims'])} but the model configuration specifies dims "
                                 f"{list(current['dims'])}")
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(f"model '{self._name()}', tensor '{tensor['name']}': the model expects optional "
                                 f"{tensor['optional']} but the model configuration specifies optional "
                                 f"{current['optional']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def add_input(self, input):  # noqa: A002 (Triton's parameter name)
        """Adds an input (`name`, `data_type`, `dims`, optional `optional`), or
        completes the declared one of that name."""
        self._add_tensor("input", input, ["name", "data_type", "dims", "optional"])

    def add_output(self, output):
        """Adds an output (`name`, `data_type`, `dims`), or completes the declared one."""
        self._add_tensor("output", output, ["name", "data_type", "dims"])

    def set_model_transaction_policy(self, transaction_policy_dict):
        """Sets `model_transaction_policy` (only `decoupled`)."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model transaction property in auto-complete-config function for model "
                                 f"'{self._name()}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            if "decoupled" in policy and policy["decoupled"] != transaction_policy_dict["decoupled"]:
                raise ValueError(f"trying to change decoupled property in auto-complete-config for model "
                                 f"'{self._name()}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = transaction_policy_dict["decoupled"]
