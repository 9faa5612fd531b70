"""Write Tern plugins in Python (componentize-py).

A plugin is a model whose implementation is a WebAssembly component of the
`tern:plugin` world (`wit/plugin.wit`). This module is a thin layer over the
bindings componentize-py generates, with the names Triton's Python backend
users know from `triton_python_backend_utils`, so a `model.py` ports with
few changes:

    import tern_plugin as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.config = json.loads(args["model_config"])

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_list()
                out = pb_utils.Tensor("OUTPUT0", [x * 2 for x in a], "FP32")
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses

    Model = pb_utils.export(TritonPythonModel)   # what the component exports

Build: `tern plugin build <dir>` (or `componentize-py -d wit -w plugin
componentize -p <dir with tern_plugin.py> app -o 1/model.wasm`).

There is no numpy inside the sandbox: tensors convert to and from lists,
`array.array` and bytes instead (`as_list`, `as_array`, `as_bytes`,
`as_strings`).
"""

import array
import enum
import json
import struct
import sys
import traceback

from componentize_py_types import Err, Ok
from wit_world.imports import host as _host
from wit_world.imports import responses as _responses
from wit_world.imports import types as _t

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
"""Response flag: the request's last message (decoupled models)."""

TRITONSERVER_REQUEST_RELEASE_ALL = 1
"""Release flag: the request is done (the default after every `execute`)."""

TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
"""Release flag: run the request through `execute` again (models with
`sequence_batching { iterative_sequence: true }`)."""

_RESCHEDULE_REFUSED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, "
                       "while the model is not configured to handle such a flag.")


def _bundle_codecs():
    """Imports every codec of the standard library now, while the component
    is built: componentize-py keeps only the modules imported by then, and
    Python imports a codec on its first use (`b.decode("cp1252")`), which
    at run time would fail with `unknown encoding`."""
    import encodings
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(encodings.__path__):
        try:
            importlib.import_module("encodings." + m.name)
        except Exception:  # noqa: BLE001 (platform codecs such as mbcs do not exist here)
            pass


_bundle_codecs()

__all__ = [
    "Batch",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceTrace",
    "InferenceResponseSender",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "Logger",
    "MetricFamily",
    "Request",
    "Tensor",
    "TritonError",
    "export",
    "gather",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "log",
]

# Wire name -> (WIT enum, struct code, element size, array typecode or None).
_DTYPES = {
    "BOOL": (_t.DataType.BOOL, "?", 1, None),
    "UINT8": (_t.DataType.UINT8, "B", 1, "B"),
    "UINT16": (_t.DataType.UINT16, "H", 2, "H"),
    "UINT32": (_t.DataType.UINT32, "I", 4, "I"),
    "UINT64": (_t.DataType.UINT64, "Q", 8, "Q"),
    "INT8": (_t.DataType.INT8, "b", 1, "b"),
    "INT16": (_t.DataType.INT16, "h", 2, "h"),
    "INT32": (_t.DataType.INT32, "i", 4, "i"),
    "INT64": (_t.DataType.INT64, "q", 8, "q"),
    "FP16": (_t.DataType.FP16, "e", 2, None),
    "FP32": (_t.DataType.FP32, "f", 4, "f"),
    "FP64": (_t.DataType.FP64, "d", 8, "d"),
    "BYTES": (_t.DataType.BYTES, None, 0, None),
    "BF16": (_t.DataType.BF16, None, 2, None),
}
_NAMES = {v[0]: k for k, v in _DTYPES.items()}
_TYPECODES = {v[3]: k for k, v in _DTYPES.items() if v[3]}
_BIG_ENDIAN = sys.byteorder == "big"
# Triton datatypes and the numpy dtype names of the Python runner's numpy.
_TRITON_TO_NUMPY = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "object",
}
_NUMPY_TO_TRITON = {v: k for k, v in _TRITON_TO_NUMPY.items()}


# The Python runner's numpy array type (set by that numpy when it loads).
_NDARRAY = None


def _is_ndarray(v):
    t = type(v)
    return t is _NDARRAY or t.__name__ == "ndarray" and hasattr(v, "dtype") and hasattr(v, "tobytes")


def _dtype(name):
    if name in _DTYPES:
        return name
    raise TritonError(f"unknown datatype '{name}'", TritonError.INVALID_ARG)


def _count(shape):
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


class TritonError(Exception):
    """An error with one of Triton's codes (`TritonError.INVALID_ARG` ...).

    Raise it from `execute` (all requests fail with it) or put it in an
    `InferenceResponse(error=...)` (that request alone fails).
    """

    UNKNOWN = _t.ErrorCode.UNKNOWN
    INTERNAL = _t.ErrorCode.INTERNAL
    NOT_FOUND = _t.ErrorCode.NOT_FOUND
    INVALID_ARG = _t.ErrorCode.INVALID_ARG
    UNAVAILABLE = _t.ErrorCode.UNAVAILABLE
    UNSUPPORTED = _t.ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _t.ErrorCode.ALREADY_EXISTS
    CANCELLED = _t.ErrorCode.CANCELLED

    def __init__(self, message, code=_t.ErrorCode.INTERNAL):
        super().__init__(message)
        self._message = str(message)
        self._code = code

    def message(self):
        """The message."""
        return self._message

    def code(self):
        """The code (a `TritonError.*` constant)."""
        return self._code

    def _wit(self):
        return _t.Error(code=self._code, message=self._message)


def _encode_strings(items):
    parts = []
    for s in items:
        b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def _decode_strings(name, data):
    out, i, n = [], 0, len(data)
    while i < n:
        if i + 4 > n:
            raise TritonError(f"tensor '{name}': truncated BYTES element length", TritonError.INVALID_ARG)
        (size,) = struct.unpack_from("<I", data, i)
        i += 4
        if i + size > n:
            raise TritonError(f"tensor '{name}': BYTES element overruns the data", TritonError.INVALID_ARG)
        out.append(bytes(data[i : i + size]))
        i += size
    return out


class Tensor:
    """A tensor: name, datatype (`"FP32"`, ... `"BYTES"`), shape and data.

    `Tensor(name, values, datatype=None, shape=None)`: `values` is a list or
    tuple of numbers, an `array.array`, or for BYTES a list of `str`/`bytes`.
    Without `datatype` it follows the values (array typecode; `str`/`bytes`
    -> BYTES; `bool` -> BOOL, `int` -> INT64, `float` -> FP64 like numpy).
    Without `shape` the tensor is one-dimensional.
    """

    __slots__ = ("_name", "_dtype", "_shape", "_data", "_np")

    def __init__(self, name, values, datatype=None, shape=None):
        self._np = None
        if _is_ndarray(values):
            # An array of the Python runner's numpy: its dtype, shape and bytes.
            dt = datatype or _NUMPY_TO_TRITON.get(values.dtype.name)
            if dt is None:
                raise TritonError(f"tensor '{name}': numpy dtype {values.dtype.name} has no Triton datatype", TritonError.INVALID_ARG)
            self._name, self._dtype = name, _dtype(dt)
            self._shape = list(values.shape) if shape is None else [int(d) for d in shape]
            if dt == "BYTES" or values.dtype.name == "object":
                self._data = _encode_strings(values.ravel().tolist())
            elif values.dtype.name == _TRITON_TO_NUMPY[dt]:
                self._data = values.tobytes()
            else:
                self._data = values.astype(_TRITON_TO_NUMPY[dt], copy=False).tobytes()
            return
        if isinstance(values, array.array):
            datatype = datatype or _TYPECODES.get(values.typecode)
        elif datatype is None:
            first = values[0] if len(values) else 0.0
            if isinstance(first, (str, bytes, bytearray)):
                datatype = "BYTES"
            elif isinstance(first, bool):
                datatype = "BOOL"
            elif isinstance(first, int):
                datatype = "INT64"
            else:
                datatype = "FP64"
        if datatype is None:
            raise TritonError(f"tensor '{name}': give a datatype", TritonError.INVALID_ARG)
        self._name = name
        self._dtype = _dtype(datatype)
        self._shape = [len(values)] if shape is None else [int(d) for d in shape]
        if _count(self._shape) != len(values):
            raise TritonError(
                f"tensor '{name}': shape {self._shape} holds {_count(self._shape)} element(s), got {len(values)}",
                TritonError.INVALID_ARG,
            )
        self._data = _pack(name, self._dtype, values)

    @classmethod
    def from_bytes(cls, name, datatype, shape, data):
        """A tensor from raw little-endian bytes (Triton's wire layout)."""
        t = cls.__new__(cls)
        t._name, t._dtype, t._shape, t._data = name, _dtype(datatype), [int(d) for d in shape], bytes(data)
        t._np = None
        return t

    @classmethod
    def _from_wit(cls, w):
        # The bindings give a list of ints and bytes: kept as they are.
        t = cls.__new__(cls)
        t._name, t._dtype, t._shape, t._data = w.name, _NAMES[w.datatype], w.shape, w.data
        t._np = None
        return t

    def _wit(self, name=None):
        return _t.Tensor(name=name or self._name, datatype=_DTYPES[self._dtype][0], shape=self._shape, data=self._data)

    def name(self):
        """The tensor's name."""
        return self._name

    def datatype(self):
        """The wire datatype name, e.g. `"FP32"`."""
        return self._dtype

    def type(self):
        """Alias of `datatype()`."""
        return self._dtype

    def shape(self):
        """The shape (a list of ints)."""
        return list(self._shape)

    def as_bytes(self):
        """The raw data: a numeric tensor's little-endian values; a BYTES
        tensor's one element (for several, use `as_list()`; `wire_bytes()`
        is Triton's length-prefixed form of all of them)."""
        if self._dtype != "BYTES":
            return self._data
        items = _decode_strings(self._name, self._data)
        if len(items) != 1:
            raise TritonError(
                f"tensor '{self._name}' holds {len(items)} strings: as_bytes() gives the bytes of one; "
                "use as_list() for all of them, or wire_bytes() for Triton's length-prefixed form",
                TritonError.INVALID_ARG,
            )
        return items[0]

    def wire_bytes(self):
        """The data as Triton sends it (BYTES: each element as a 4-byte
        little-endian length and its bytes)."""
        return self._data

    def as_array(self):
        """The values as an `array.array` (numeric types other than FP16/BF16/BOOL)."""
        code = _DTYPES[self._dtype][3]
        if code is None:
            raise TritonError(f"tensor '{self._name}': {self._dtype} has no array form; use as_list()", TritonError.INVALID_ARG)
        a = array.array(code)
        a.frombytes(self._data)
        if _BIG_ENDIAN:
            a.byteswap()
        return a

    def as_list(self):
        """The values as a flat list (BYTES: a list of `bytes`)."""
        d = self._dtype
        if d == "BYTES":
            return _decode_strings(self._name, self._data)
        if d == "BF16":
            return [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in _unpack("H", 2, self._data)]
        code, size = _DTYPES[d][1], _DTYPES[d][2]
        if _DTYPES[d][3]:
            return self.as_array().tolist()
        return _unpack(code, size, self._data)

    def as_strings(self):
        """A BYTES tensor's elements decoded as UTF-8 strings."""
        if self._dtype != "BYTES":
            raise TritonError(f"tensor '{self._name}' is {self._dtype}, not BYTES", TritonError.INVALID_ARG)
        try:
            return [b.decode("utf-8") for b in self.as_list()]
        except UnicodeDecodeError:
            raise TritonError(f"tensor '{self._name}' holds a string that is not UTF-8", TritonError.INVALID_ARG) from None

    def as_numpy(self):
        """The tensor as an array of the Python runner's `numpy` (BYTES: an
        object array of `bytes`). Plugins built with `tern plugin build`
        have no numpy: there it raises UNSUPPORTED."""
        a = self._np
        if a is not None:
            return a
        np = _runner_numpy()
        if np is None:
            raise TritonError(
                "numpy is not available inside a Tern plugin built with `tern plugin build`; use as_list(), "
                "as_array() or as_strings() (Triton Python models served with backend: \"python\" have it)",
                TritonError.UNSUPPORTED,
            )
        # Decoded once; every call returns that array, as Triton's
        # as_numpy() returns the tensor's one numpy array.
        if self._dtype == "BYTES":
            a = np.array(self.as_list(), dtype=np.object_).reshape(self._shape)
        elif self._dtype == "BF16":
            a = np.array(self.as_list(), dtype=np.float32).reshape(self._shape)
        else:
            a = np._from_wire(self._data, _TRITON_TO_NUMPY[self._dtype], self._shape)
        self._np = a
        return a

    def __repr__(self):
        return f"Tensor({self._name!r}, {self._dtype}, {self._shape})"


_NUMPY = []


def _runner_numpy():
    """The Python runner's `numpy` (None in a plugin built without it)."""
    if not _NUMPY:
        try:
            import numpy as np
        except ImportError:
            np = None
        if np is None or not getattr(np, "__version__", "").endswith("+tern"):
            return None
        _NUMPY.append(np)
    return _NUMPY[0]


def _unpack(code, size, data):
    n = len(data) // size
    return list(struct.unpack(f"<{n}{code}", data[: n * size]))


def _pack(name, dtype, values):
    if dtype == "BYTES":
        return _encode_strings(values)
    if dtype == "BF16":
        return b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in values)
    code, size, tc = _DTYPES[dtype][1], _DTYPES[dtype][2], _DTYPES[dtype][3]
    try:
        if tc:
            a = values if isinstance(values, array.array) and values.typecode == tc else array.array(tc, values)
            if _BIG_ENDIAN:
                a = array.array(tc, a)
                a.byteswap()
            return a.tobytes()
        return struct.pack(f"<{len(values)}{code}", *values)
    except (OverflowError, TypeError, struct.error) as e:
        raise TritonError(f"tensor '{name}': values do not fit {dtype}: {e}", TritonError.INVALID_ARG) from None


def _param_value(v):
    return v.value


class InferenceResponseSender:
    """Where a decoupled model's responses to one request go (Triton's
    `InferenceResponseSender`): `send(response=None, flags=0)` any number of
    times, the last with `flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`, while
    `execute` runs or during a later call into the same instance."""

    __slots__ = ("_s", "_closed")

    def __init__(self, s):
        self._s = s
        self._closed = False

    def send(self, response=None, flags=0):
        """Sends `response` (an `InferenceResponse`; `None` only with the final
        flag; one with an error reaches the client as an error, and ends the
        stream only with the final flag, as in Triton). Raises `TritonError`
        once the sender is closed or the client has gone away
        (`TritonError.CANCELLED`)."""
        if self._closed:
            raise TritonError("Unable to send response. Response sender has been closed.")
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonError("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonError("Inference Response object must be provided when the response flags is set to zero.")
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        try:
            if response is not None and response.has_error():
                # An error response ends the stream only with the final flag, as in Triton.
                self._s.send_error_response(response._wit().value, flags)
            else:
                self._s.send(None if response is None else response._wit().value, flags)
        except Err as e:
            self._closed = True
            raise TritonError(e.value.message, e.value.code) from None

    def is_cancelled(self):
        """Whether the client has gone away."""
        return self._s.is_cancelled()


# Request parameters Triton's HTTP and gRPC frontends take for themselves:
# a Triton model's `request.parameters()` never shows them.
_RESERVED = ("timeout", "priority", "binary_data_output")


class Request:
    """One inference request (what `execute` receives), Triton-style accessors."""

    __slots__ = ("_w", "_inputs", "_index", "_sender", "_release")

    def __init__(self, w, index=0):
        self._w = w
        self._inputs = None
        self._index = index
        self._sender = None
        self._release = TRITONSERVER_REQUEST_RELEASE_ALL

    def set_release_flags(self, flags):
        """How the request is released when `execute` returns (Triton's
        `set_release_flags`): `TRITONSERVER_REQUEST_RELEASE_RESCHEDULE` runs
        it through `execute` again in a later batch (a non-decoupled model
        returns None for it this time), which needs `sequence_batching { iterative_sequence:
        true }` in the config; `TRITONSERVER_REQUEST_RELEASE_ALL` (the
        default) ends it."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonError(f"unknown request release flags {flags!r}: use TRITONSERVER_REQUEST_RELEASE_ALL "
                              "or TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", TritonError.INVALID_ARG)
        self._release = flags

    def get_response_sender(self):
        """This request's `InferenceResponseSender` (decoupled models only;
        take it during `execute`, keep it as long as needed)."""
        if self._sender is None:
            try:
                self._sender = InferenceResponseSender(_responses.sender(self._index))
            except Err as e:
                raise TritonError(e.value.message, e.value.code) from None
        return self._sender

    def is_cancelled(self):
        """Whether the client has gone away (decoupled models: at any time;
        others: requests cancelled before they run never reach `execute`)."""
        if self._sender is not None:
            return self._sender.is_cancelled()
        return _responses.is_cancelled(self._index)

    def inputs(self):
        """All input tensors."""
        if self._inputs is None:
            self._inputs = [Tensor._from_wit(t) for t in self._w.inputs]
        return self._inputs

    def request_id(self):
        """The client's request id ('' when none)."""
        return self._w.id

    def requested_output_names(self):
        """Outputs the client asked for (empty: all)."""
        return list(self._w.requested_outputs)

    def parameters(self):
        """Request parameters as a JSON string (as Triton's `parameters()`:
        without the ones Triton's frontends consume, `timeout`, `priority`
        and `binary_data_output`)."""
        return json.dumps({p.key: _param_value(p.value) for p in self._w.parameters if p.key not in _RESERVED})

    def parameter(self, key, default=None):
        """One request parameter's value."""
        for p in self._w.parameters:
            if p.key == key:
                return _param_value(p.value)
        return default

    def timeout(self):
        """The client's `timeout` for this request in microseconds (0 when it
        set none), as Triton's `InferenceRequest.timeout()`."""
        value = self.parameter("timeout", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def correlation_id(self):
        """The sequence correlation id (0 when none, as Triton)."""
        c = self._w.correlation_id
        return 0 if isinstance(c, _t.CorrelationId_None_) else c.value

    def flags(self):
        """Sequence flags: START = 1, END = 2 (0 when a rescheduled request
        runs again, as in Triton)."""
        return self._w.flags

    def trace(self):
        """This request's trace, to pass to a BLS request (`InferenceTrace`)."""
        return InferenceTrace()


def get_input_tensor_by_name(request, name):
    """The request's input `name`, or None."""
    for t in request.inputs():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config, name):
    """The `input` entry called `name` of a parsed model config (dict), or None."""
    return next((i for i in model_config.get("input", []) if i.get("name") == name), None)


def get_output_config_by_name(model_config, name):
    """The `output` entry called `name` of a parsed model config (dict), or None."""
    return next((o for o in model_config.get("output", []) if o.get("name") == name), None)


def get_output_tensor_by_name(response, name):
    """A (BLS) response's output `name`, or None."""
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


class InferenceResponse:
    """A response: output tensors, or an error for this request alone."""

    def __init__(self, output_tensors=None, error=None, parameters=None):
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = dict(parameters or {})

    def output_tensors(self):
        """The outputs."""
        return self._outputs

    def has_error(self):
        """Whether this response is an error."""
        return self._error is not None

    def error(self):
        """The `TritonError`, or None."""
        return self._error

    def parameters(self):
        """Response parameters as a JSON string."""
        return json.dumps(self._parameters)

    def _wit(self):
        if self._error is not None:
            e = self._error if isinstance(self._error, TritonError) else TritonError(str(self._error))
            return Err(e._wit())
        return Ok(
            _t.Response(
                outputs=[t._wit() for t in self._outputs],
                parameters=[_t.Parameter(key=k, value=_wit_param(v)) for k, v in self._parameters.items()],
            )
        )


def _wit_param(v):
    if isinstance(v, bool):
        return _t.ParameterValue_Bool(v)
    if isinstance(v, int):
        return _t.ParameterValue_Int(v)
    if isinstance(v, float):
        return _t.ParameterValue_Double(v)
    return _t.ParameterValue_String(str(v))


class InferenceTrace:
    """What `Request.trace()` returns and a BLS `InferenceRequest` takes
    (`trace=`), as Triton's `InferenceTrace`. Tern traces a BLS request as
    a request of its own; the context of the caller's trace is not passed
    into the sandbox, so `get_context()` is None."""

    def get_context(self):
        return None


class InferenceRequest:
    """A BLS request to another model of the server, run in-process.

    `InferenceRequest(model_name, inputs, requested_output_names=None,
    model_version=-1, request_id="", parameters=None, correlation_id=0,
    flags=0, timeout=0, preferred_memory=None, trace=None).exec()` returns
    an `InferenceResponse`; check `has_error()` as with Triton. A
    correlation id and flags (`1` start, `2` end) make it a request of a
    sequence; `timeout` is in microseconds, as Triton's; `parameters` is a
    dict or its JSON text. Tensors are in CPU memory whatever
    `preferred_memory` asks for.
    """

    def __init__(self, model_name, inputs, requested_output_names=None, model_version=-1, request_id="",
                 parameters=None, correlation_id=0, flags=0, timeout=0, preferred_memory=None, trace=None):
        # A name read from a BYTES input arrives as bytes (Triton takes those too).
        self.model_name = model_name.decode() if isinstance(model_name, bytes) else str(model_name)
        self.inputs = list(inputs)
        self.requested_output_names = list(requested_output_names or [])
        self.model_version = int(model_version)
        self.request_id = request_id
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self.parameters = dict(parameters or {})
        # Sequences and timeouts travel as the parameters the HTTP frontend
        # reads them from, which is how the server carries them.
        if correlation_id:
            self.parameters["sequence_id"] = correlation_id
        if flags & 1:
            self.parameters["sequence_start"] = True
        if flags & 2:
            self.parameters["sequence_end"] = True
        if timeout:
            self.parameters["timeout"] = int(timeout)
        self.trace = trace

    def exec(self, decoupled=False):
        """Runs the request and waits for its response (errors come back in
        it). With `decoupled=True`, returns an iterator over every response
        the model sends, as it sends them (many for a decoupled model, one
        for any other), as Triton's `exec(decoupled=True)` does."""
        req = self._wit()
        if decoupled:
            return _ResponseIterator(req)
        try:
            resp = _host.infer(req)
        except Err as e:
            return InferenceResponse(error=TritonError(e.value.message, e.value.code))
        return _from_wit_response(resp)

    async def async_exec(self, decoupled=False):
        """`exec` for an `async def execute`, as Triton's `async_exec`. The
        call runs to completion when awaited: requests awaited one after
        another run one after another (the sandbox has no threads)."""
        return self.exec(decoupled)

    def _wit(self):
        return _t.InferRequest(
            model_name=self.model_name,
            model_version=self.model_version,
            id=self.request_id,
            inputs=[t._wit() for t in self.inputs],
            requested_outputs=self.requested_output_names,
            parameters=[_t.Parameter(key=k, value=_wit_param(v)) for k, v in self.parameters.items()],
        )


def _from_wit_response(resp):
    params = {p.key: _param_value(p.value) for p in resp.parameters}
    return InferenceResponse(output_tensors=[Tensor._from_wit(t) for t in resp.outputs], parameters=params)


class _ResponseIterator:
    """The responses of `InferenceRequest.exec(decoupled=True)`; an error is
    an `InferenceResponse` whose `has_error()` is true."""

    def __init__(self, req):
        self._error = None
        self._stream = None
        try:
            self._stream = _responses.infer_stream(req)
        except Err as e:
            self._error = InferenceResponse(error=TritonError(e.value.message, e.value.code))

    def __iter__(self):
        return self

    def __next__(self):
        if self._error is not None:
            error, self._error = self._error, None
            return error
        if self._stream is None:
            raise StopIteration
        r = self._stream.next()
        if r is None:
            self._stream = None
            raise StopIteration
        if isinstance(r, Err):
            return InferenceResponse(error=TritonError(r.value.message, r.value.code))
        return _from_wit_response(r.value if isinstance(r, Ok) else r)


def log(level, message):
    """Writes to the server's log: level is "error", "warn", "info" or "verbose"."""
    _host.log(getattr(_host.LogLevel, level.upper()), str(message))


class Logger:
    """Triton's `pb_utils.Logger`: `log(message, level=Logger.INFO)` and
    the `log_info`/`log_warn`/`log_error`/`log_verbose` shorthands."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO, WARNING, ERROR, VERBOSE = LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE

    @staticmethod
    def log(message, level=LogLevel.INFO):
        log(("info", "warn", "error", "verbose")[Logger.LogLevel(level)], message)

    @staticmethod
    def log_info(message):
        log("info", message)

    @staticmethod
    def log_warn(message):
        log("warn", message)

    @staticmethod
    def log_error(message):
        log("error", message)

    @staticmethod
    def log_verbose(message):
        log("verbose", message)


class MetricFamily:
    """A custom metric family exposed on the server's metrics endpoint
    (Triton's `pb_utils.MetricFamily`): `MetricFamily(name, description,
    kind=MetricFamily.COUNTER, buckets=None).Metric(labels={...})`.
    """

    COUNTER = _host.MetricKind.COUNTER
    GAUGE = _host.MetricKind.GAUGE
    HISTOGRAM = _host.MetricKind.HISTOGRAM

    def __init__(self, name, description, kind, buckets=None):
        try:
            self._id = _host.metric_family(name, description, kind, [float(b) for b in buckets or []])
        except Err as e:
            raise TritonError(e.value.message, e.value.code) from None

    def Metric(self, labels=None):  # noqa: N802 (Triton's name)
        """A metric of this family with fixed labels."""
        return _Metric(self._id, sorted((str(k), str(v)) for k, v in (labels or {}).items()))


class _Metric:
    def __init__(self, family, labels):
        self._family, self._labels = family, labels

    def _call(self, f, value):
        try:
            f(self._family, self._labels, float(value))
        except Err as e:
            raise TritonError(e.value.message, e.value.code) from None

    def increment(self, value=1.0):
        """Counter or gauge: adds `value`."""
        self._call(_host.metric_record, value)

    def observe(self, value):
        """Histogram: records one observation."""
        self._call(_host.metric_record, value)

    def set(self, value):
        """Gauge: sets the value."""
        self._call(_host.metric_set, value)


class Batch:
    """One input gathered across a request list (see `gather`)."""

    def __init__(self, name, datatype, values, sizes, inner_shape):
        self.name = name
        self.datatype = datatype
        #: All values, request after request (array.array or list).
        self.values = values
        #: Each request's batch size (its first dimension).
        self.sizes = sizes
        #: The dimensions after the batch dimension.
        self.inner_shape = inner_shape

    def total(self):
        """Total rows."""
        return sum(self.sizes)

    def split(self, name, values, datatype=None, inner_shape=None):
        """Splits batch-wide output values back into one tensor per request."""
        inner = self.inner_shape if inner_shape is None else list(inner_shape)
        row = _count(inner)
        if len(values) != row * self.total():
            raise TritonError(f"output '{name}': {len(values)} values for a batch of {self.total()} rows of {row}")
        dt = datatype or (None if isinstance(values, array.array) else self.datatype)
        out, at = [], 0
        for n in self.sizes:
            out.append(Tensor(name, values[at : at + n * row], dt, [n] + inner))
            at += n * row
        return out


def gather(requests, name):
    """Concatenates input `name` of every request along the batch dimension
    (models with `max_batch_size > 0`). Numeric values come as an
    `array.array` when the type has one, else a list."""
    parts, sizes, inner, dtype = [], [], None, None
    for r in requests:
        t = get_input_tensor_by_name(r, name)
        if t is None:
            raise TritonError(f"request has no input '{name}'", TritonError.INVALID_ARG)
        shape = t.shape()
        if not shape:
            raise TritonError(f"input '{name}' has no batch dimension", TritonError.INVALID_ARG)
        if inner is None:
            inner, dtype = shape[1:], t.datatype()
        elif shape[1:] != inner:
            raise TritonError(
                f"input '{name}': requests in one batch have different shapes ({shape[1:]} vs {inner})",
                TritonError.INVALID_ARG,
            )
        sizes.append(shape[0])
        parts.append(t)
    if dtype is None:
        return Batch(name, None, [], [], [])
    if _DTYPES[dtype][3]:
        values = array.array(_DTYPES[dtype][3])
        for t in parts:
            values.frombytes(t.as_bytes())
        if _BIG_ENDIAN:
            values.byteswap()
    else:
        values = [v for t in parts for v in t.as_list()]
    return Batch(name, dtype, values, sizes, inner)


def _context_args(ctx):
    kind = {_t.InstanceKind.CPU: "CPU", _t.InstanceKind.GPU: "GPU", _t.InstanceKind.MODEL: "MODEL"}[ctx.instance_kind]
    return {
        "model_config": ctx.config_json,
        "model_instance_kind": kind,
        "model_instance_name": ctx.instance_name,
        "model_instance_device_id": str(ctx.device_id),
        # As in Triton: the model's folder; its version folder is
        # os.path.join(model_repository, model_version) (the host pre-opens
        # it there, read-only; files beside config.pbtxt are not visible).
        "model_repository": f"/models/{ctx.model_name}",
        "model_version": str(ctx.model_version),
        "model_name": ctx.model_name,
    }


# The SDK's own files, and the Python runner's `pb_utils` and numpy: an
# error's place is the innermost frame of the model's code.
_SDK_FILES = ("tern_plugin.py", "tern_ops.py", "triton_python_backend_utils.py", "numpy.py")


def _where(exc):
    """`file:line in function` of the innermost frame of `exc` outside this SDK."""
    try:
        frames = traceback.extract_tb(exc.__traceback__, limit=None)
    except Exception:  # noqa: BLE001 (where is a nicety: never fail on it)
        return None
    for frame in reversed(frames):
        if frame.filename.rsplit("/", 1)[-1] not in _SDK_FILES:
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"
    return None


def _as_error(exc):
    """The error a request gets for an exception: a TritonError as it is;
    anything else as INTERNAL `Type: message (at file:line in function)`,
    with the whole traceback in the server's log."""
    if isinstance(exc, TritonError):
        return exc._wit()
    message = f"{type(exc).__name__}: {exc}"
    where = _where(exc)
    if where:
        message += f" (at {where})"
    try:
        _host.log(_host.LogLevel.ERROR, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
    except Exception:  # noqa: BLE001 (logging must not hide the error)
        pass
    return _t.Error(code=_t.ErrorCode.INTERNAL, message=message)


# Set by the Python runner, which has an event loop for the sandbox: runs
# a coroutine to completion on it.
_event_loop_runner = None


def _run(result):
    """The value of `result`, running it first when it is a coroutine (an
    `async def` initialize, execute or finalize). In the Python runner it runs
    on a real (sandboxed) asyncio event loop; a plugin built with `tern plugin
    build` has none: there a coroutine may await other coroutines
    (`async_exec`) and `asyncio.sleep(0)`, and anything that needs a running
    loop raises."""
    if not (hasattr(result, "send") and hasattr(result, "throw") and hasattr(result, "close")):
        return result
    if _event_loop_runner is not None:
        return _event_loop_runner(result)
    try:
        while True:
            yielded = result.send(None)
            if yielded is not None:
                result.close()
                raise TritonError(
                    "an async execute awaited something that needs an asyncio event loop "
                    f"({type(yielded).__name__}); the sandbox has none: await only coroutines "
                    "such as InferenceRequest.async_exec()", TritonError.UNSUPPORTED)
    except StopIteration as done:
        return done.value


def export(model_class):
    """Wraps a `TritonPythonModel`-style class (`initialize(args)`,
    `execute(requests)`, `finalize()`, all optional but `execute`) as the
    `model` interface the component exports: assign the result to `Model`
    in the app module. One object lives per model instance; an exception
    from `execute` fails every request of the batch with its message
    (`TritonError` keeps its code)."""

    state = {}

    class Model:
        def initialize(self, ctx):
            try:
                m = model_class()
                if hasattr(m, "initialize"):
                    _run(m.initialize(_context_args(ctx)))
            except Exception as e:  # noqa: BLE001 (every failure fails the load)
                raise Err(_as_error(e)) from None
            state["model"] = m
            config = json.loads(ctx.config_json)
            state["decoupled"] = bool(config.get("model_transaction_policy", {}).get("decoupled"))
            state["iterative"] = bool(config.get("sequence_batching", {}).get("iterative_sequence"))

        def execute(self, requests):
            m = state.get("model")
            if m is None:
                return [Err(_t.Error(code=_t.ErrorCode.INTERNAL, message="execute called before initialize"))] * len(requests)
            batch = [Request(r, i) for i, r in enumerate(requests)]
            try:
                return _execute(m, batch, state)
            except Exception as e:  # noqa: BLE001 (reported to every request)
                err = _as_error(e)
                if state.get("decoupled"):
                    # Through each request's sender, before the senders are let
                    # go of (which sends the final flag alone).
                    for r in batch:
                        _fail_stream(r, err)
                    return []
                return [Err(err) for _ in requests]

        def finalize(self):
            m = state.pop("model", None)
            if m is not None and hasattr(m, "finalize"):
                _run(m.finalize())

    return Model


def _execute(m, batch, state):
    """Runs the model's `execute` on `batch` and returns the batch's answers
    (none for a decoupled model that returned None). A request the model
    released with `TRITONSERVER_REQUEST_RELEASE_RESCHEDULE` (Triton's request
    rescheduling, for `iterative_sequence` models) goes back to the host,
    which runs it again in the instance's next batch (its sequence keeps its
    slot), with `flags()` 0, the same inputs and its response sender still
    open."""
    decoupled = state.get("decoupled")
    for r in batch:
        r._release = TRITONSERVER_REQUEST_RELEASE_ALL
    responses = _run(m.execute(batch))
    if decoupled and responses is None:
        pass  # answered through the response senders
    elif responses is None or len(responses) != len(batch):
        n = "None" if responses is None else len(responses)
        raise TritonError(f"execute returned {n} response(s) for {len(batch)} request(s)")
    answers = [None] * len(batch)
    again = []
    for k, r in enumerate(batch):
        if r._release != TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            if responses is not None:
                answers[k] = _response(responses[k])
            continue
        if responses is not None and responses[k] is not None:
            raise TritonError("Expected a None object in the execute function return list for "
                              f"reschduled request, found type '{type(responses[k])}'.")
        again.append((k, r))
    # Released to the host only once every answer is built: if one fails,
    # the whole batch fails and none of it runs again.
    for k, r in again:
        refusal = _reschedule_refusal(r, state)
        if refusal is None:
            try:
                _responses.reschedule(r._index)
            except Err as e:
                refusal = e.value
        if refusal is None:
            if not decoupled:
                # Ignored by the host: the request is not answered this time.
                answers[k] = Err(_t.Error(code=_t.ErrorCode.UNKNOWN, message="rescheduled"))
        elif decoupled:
            _fail_stream(r, refusal)
        else:
            answers[k] = Err(refusal)
    if decoupled and all(a is None for a in answers):
        return []
    return [Err(_t.Error(code=_t.ErrorCode.INTERNAL, message="no response")) if a is None else a for a in answers]


def _fail_stream(r, err):
    """Ends request `r` of a decoupled model with `err`, unless its stream has
    ended already (the final flag sent, or the client gone)."""
    try:
        sender = r.get_response_sender()
        if not sender._closed:
            sender._closed = True
            sender._s.send_error(err)
    except Exception:  # noqa: BLE001 (the stream may be gone already)
        pass


def _reschedule_refusal(r, state):
    """Why a request released with RESCHEDULE cannot run again (an error), or
    None when it can: the model must be an `iterative_sequence` one, the
    request must not end its sequence, and its client must still be there."""
    if not state.get("iterative") or (r._w.flags & 2):
        return _t.Error(code=_t.ErrorCode.INVALID_ARG, message=_RESCHEDULE_REFUSED)
    if r.is_cancelled():
        return _t.Error(code=_t.ErrorCode.CANCELLED, message="the request was cancelled while it was rescheduled")
    return None


def _response(r):
    if isinstance(r, InferenceResponse):
        return r._wit()
    if isinstance(r, TritonError):
        return Err(r._wit())
    raise TritonError(f"execute must return InferenceResponse objects, got {type(r).__name__}")
