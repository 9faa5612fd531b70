"""Native pre/post-processing for Python plugins: a numpy-like `ndarray`
held by the host and the image/tensor/detection kernels of the
`tern:plugin/ops` interface, run at native speed outside the sandbox.

numpy, PIL and OpenCV do not build into a component; this module covers
what pre/post-processing code uses them for (docs/plugins.md has the
call-by-call mapping):

    import tern_ops as np          # the numpy-like part
    from tern_ops import cv2       # the OpenCV-like part

    img = cv2.imdecode(data, cv2.IMREAD_COLOR)        # BGR, HWC uint8
    img = cv2.resize(img, (640, 640))                  # (width, height)
    x = cv2.dnn.blobFromImage(img, 1 / 255.0, swapRB=True)  # [1, 3, H, W] FP32
    np.set_output(request, "images", x)                # no copy into the plugin

Arrays stay on the host: operations return new host arrays, and only
`tolist()`, `tobytes()`, `item()` and indexing down to a scalar copy
values into the plugin. Every array counts against the plugin's memory
cap. Errors raise `tern_plugin.TritonError`.
"""

import struct

from componentize_py_types import Err
from wit_world.imports import ops as _ops

import tern_plugin as _pb

__all__ = [
    "ndarray",
    "array",
    "frombuffer",
    "zeros",
    "from_input",
    "set_output",
    "concatenate",
    "split",
    "transpose",
    "squeeze",
    "expand_dims",
    "argmax",
    "top_k",
    "softmax",
    "sigmoid",
    "exp",
    "log",
    "sqrt",
    "abs",
    "tanh",
    "round",
    "floor",
    "ceil",
    "clip",
    "maximum",
    "minimum",
    "sum",
    "mean",
    "amax",
    "amin",
    "decode_image",
    "probe_image",
    "resize",
    "pad",
    "crop",
    "letterbox",
    "convert_color",
    "normalize",
    "yolo_decode",
    "iou",
    "nms",
    "Detection",
    "cv2",
]

# Triton's types (not BYTES) from tern_plugin's table: WIT enum and struct code.
_DT = {k: v[0] for k, v in _pb._DTYPES.items() if k != "BYTES"}
_NAMES = {v: k for k, v in _DT.items()}
# numpy-style aliases.
_ALIASES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
    "uint64": "UINT64", "int8": "INT8", "int16": "INT16", "int32": "INT32",
    "int64": "INT64", "float16": "FP16", "float32": "FP32", "float64": "FP64",
    "float": "FP64", "int": "INT64", "bfloat16": "BF16",
}
_STRUCT = {k: v[1] for k, v in _pb._DTYPES.items() if v[1]}

bool_, uint8, int32, int64, float16, float32, float64 = (
    "BOOL", "UINT8", "INT32", "INT64", "FP16", "FP32", "FP64")


def _dtype(d):
    if isinstance(d, str):
        name = _ALIASES.get(d, d.upper())
        if name in _DT:
            return name
    raise _pb.TritonError(f"unknown data type {d!r} (use Triton's names, e.g. 'FP32', or numpy's, e.g. 'float32')")


def _call(f, *args):
    try:
        return f(*args)
    except Err as e:
        raise _pb.TritonError(e.value.message, e.value.code) from None


def _wrap(handle):
    return ndarray(handle)


def _op(name):
    return getattr(_ops.BinaryOp, name)


class ndarray:
    """An n-dimensional array held by the host (row-major, one Triton data
    type). Supports `shape`, `dtype`, `ndim`, `size`, `reshape`,
    `transpose`/`T`, `astype`, basic slicing (`a[0]`, `a[:, 4:]`,
    `a[..., ::2]`), arithmetic with arrays and numbers (numpy
    broadcasting), reductions and `tolist`/`tobytes`/`item`."""

    __slots__ = ("_h", "_shape", "_dtype")

    def __init__(self, handle):
        self._h = handle
        self._shape = None
        self._dtype = None

    # -- metadata ---------------------------------------------------------
    @property
    def shape(self):
        if self._shape is None:
            self._shape = tuple(self._h.shape())
        return self._shape

    @property
    def dtype(self):
        """Triton's name of the element type ('FP32', 'UINT8', ...)."""
        if self._dtype is None:
            self._dtype = _NAMES[self._h.datatype()]
        return self._dtype

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self):
        return f"tern_ops.ndarray(shape={self.shape}, dtype={self.dtype})"

    # -- data out ---------------------------------------------------------
    def tobytes(self):
        """The elements as little-endian bytes (copied into the plugin)."""
        return bytes(self._h.data())

    def tolist(self):
        """The elements as nested Python lists (copied into the plugin)."""
        flat = list(struct.unpack(f"<{self.size}{_STRUCT[self.dtype]}", self.tobytes())) if self.dtype in _STRUCT else None
        if flat is None:
            flat = list(self.astype("FP32").tolist_flat())
        return _nest(flat, self.shape)

    def tolist_flat(self):
        return list(struct.unpack(f"<{self.size}{_STRUCT[self.dtype]}", self.tobytes()))

    def item(self):
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.tolist_flat()[0] if self.dtype in _STRUCT else self.astype("FP32").tolist_flat()[0]

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    # -- shape ------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return _wrap(_call(self._h.reshape, [int(d) for d in shape]))

    def flatten(self):
        return self.reshape(-1)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = axes[0]
        if not axes:
            axes = tuple(reversed(range(self.ndim)))
        return _wrap(_call(self._h.transpose, [a % self.ndim for a in axes]))

    @property
    def T(self):
        return self.transpose()

    def squeeze(self, axis=None):
        return squeeze(self, axis)

    def astype(self, dtype):
        return _wrap(_call(self._h.cast, _DT[_dtype(dtype)]))

    def copy(self):
        return self

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        if len(key) > self.ndim:
            raise IndexError(f"too many indices for an array of {self.ndim} dimensions")
        out, drop = self, []
        for axis, k in enumerate(key):
            if isinstance(k, slice):
                start, stop, step = k.indices(out.shape[axis])
                if (start, stop, step) != (0, out.shape[axis], 1):
                    out = _wrap(_call(out._h.slice, axis, start, stop, step))
            elif isinstance(k, int):
                n = out.shape[axis]
                if not -n <= k < n:
                    raise IndexError(f"index {k} is out of bounds for axis {axis} with size {n}")
                k %= n
                out = _wrap(_call(out._h.slice, axis, k, k + 1, 1))
                drop.append(axis)
            else:
                raise TypeError(f"arrays are indexed with ints and slices, not {type(k).__name__}")
        if drop:
            shape = [d for i, d in enumerate(out.shape) if i not in drop]
            if not shape:
                return out.item()
            out = out.reshape(shape)
        return out

    # -- arithmetic -------------------------------------------------------
    def _bin(self, op, other, reverse=False):
        if isinstance(other, ndarray):
            a, b = (other, self) if reverse else (self, other)
            return _wrap(_call(a._h.binary, _op(op), b._h))
        if isinstance(other, (int, float)):
            if reverse and op in ("SUB", "DIV", "POW", "MAXIMUM", "MINIMUM"):
                return full_like(self, other)._bin(op, self)
            return _wrap(_call(self._h.scalar, _op(op), float(other)))
        return NotImplemented

    def __add__(self, o):
        return self._bin("ADD", o)

    def __radd__(self, o):
        return self._bin("ADD", o, True)

    def __sub__(self, o):
        return self._bin("SUB", o)

    def __rsub__(self, o):
        return self._bin("SUB", o, True)

    def __mul__(self, o):
        return self._bin("MUL", o)

    def __rmul__(self, o):
        return self._bin("MUL", o, True)

    def __truediv__(self, o):
        return self._bin("DIV", o)

    def __rtruediv__(self, o):
        return self._bin("DIV", o, True)

    def __pow__(self, o):
        return self._bin("POW", o)

    def __neg__(self):
        return _unary(self, "NEG")

    def __abs__(self):
        return _unary(self, "ABS")

    # -- reductions -------------------------------------------------------
    def sum(self, axis=None):
        return sum(self, axis)

    def mean(self, axis=None):
        return mean(self, axis)

    def max(self, axis=None):
        return amax(self, axis)

    def min(self, axis=None):
        return amin(self, axis)

    def argmax(self, axis=None):
        return argmax(self, axis)

    def clip(self, low, high):
        return clip(self, low, high)


def _nest(flat, shape):
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _shape_of(values):
    shape = []
    v = values
    while isinstance(v, (list, tuple)):
        shape.append(len(v))
        v = v[0] if v else None
    return shape


def _flatten(values, out):
    for v in values:
        if isinstance(v, (list, tuple)):
            _flatten(v, out)
        else:
            out.append(v)
    return out


def array(values, dtype=None):
    """An array from (nested) Python lists of numbers, or an `ndarray`."""
    if isinstance(values, ndarray):
        return values if dtype is None else values.astype(dtype)
    shape = _shape_of(values)
    flat = _flatten(values, []) if shape else [values]
    if dtype is None:
        dtype = "FP32" if any(isinstance(v, float) for v in flat) else "INT64"
    dtype = _dtype(dtype)
    return frombuffer(struct.pack(f"<{len(flat)}{_STRUCT[dtype]}", *flat), dtype, shape)


def frombuffer(data, dtype="UINT8", shape=None):
    """An array of little-endian elements from `bytes` (one dimension when
    `shape` is None)."""
    dtype = _dtype(dtype)
    if shape is None:
        size = struct.calcsize(_STRUCT.get(dtype, "e"))
        shape = [len(data) // size]
    return _wrap(_call(_ops.Array.from_data, _DT[dtype], [int(d) for d in shape], bytes(data)))


def zeros(shape, dtype="FP32"):
    """An array of zeros."""
    dtype = _dtype(dtype)
    if isinstance(shape, int):
        shape = [shape]
    n = 1
    for d in shape:
        n *= d
    return frombuffer(bytes(n * struct.calcsize(_STRUCT[dtype])), dtype, shape)


def full_like(a, value):
    return (zeros(a.shape, a.dtype if a.dtype.startswith("FP") else "FP32")) + value


def from_input(request, name):
    """Input `name` of a request `execute` received, as a host array (no
    copy through the plugin)."""
    return _wrap(_call(_ops.Array.input, request._index, name))


def set_output(request, name, value):
    """Makes `value` output `name` of `request`'s response without copying
    it through the plugin (it replaces an output of that name in the
    `InferenceResponse` returned for the request)."""
    _call(_ops.set_output, request._index, name, value._h)


def concatenate(arrays, axis=0):
    """Arrays of one type joined along `axis`."""
    arrays = list(arrays)
    axis = axis % arrays[0].ndim if arrays else 0
    return _wrap(_call(_ops.Array.concat, [a._h for a in arrays], axis))


def split(a, indices_or_sections, axis=0):
    """numpy's `split`: equal sections or split points along `axis`."""
    axis %= a.ndim
    n = a.shape[axis]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        sizes = [n // indices_or_sections] * indices_or_sections
    else:
        points = [0] + list(indices_or_sections) + [n]
        sizes = [max(0, points[i + 1] - points[i]) for i in range(len(points) - 1)]
    return [_wrap(h) for h in _call(a._h.split, axis, sizes)]


def transpose(a, axes=None):
    return a.transpose(*(axes or ()))


def squeeze(a, axis=None):
    if axis is None:
        return a.reshape([d for d in a.shape if d != 1])
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = [x % a.ndim for x in axes]
    for x in axes:
        if a.shape[x] != 1:
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    return a.reshape([d for i, d in enumerate(a.shape) if i not in axes])


def expand_dims(a, axis):
    shape = list(a.shape)
    shape.insert(axis % (a.ndim + 1), 1)
    return a.reshape(shape)


def _axis(a, axis):
    if axis is None:
        return a.reshape(-1), 0
    return a, axis % a.ndim


def argmax(a, axis=None):
    """Indices (INT64) of the largest elements along `axis` (flattened when None)."""
    a, axis = _axis(a, axis)
    r = _wrap(_call(a._h.argmax, axis))
    return r.item() if r.ndim == 0 else r


def top_k(a, k, axis=-1):
    """The `k` largest values along `axis`, largest first, and their indices."""
    v, i = _call(a._h.top_k, k, axis % a.ndim)
    return _wrap(v), _wrap(i)


def _reduce(a, op, axis):
    a, axis = _axis(a, axis)
    r = _wrap(_call(a._h.reduce, getattr(_ops.ReduceOp, op), axis))
    return r.item() if r.ndim == 0 else r


def sum(a, axis=None):  # noqa: A001 (numpy's name)
    return _reduce(a, "SUM", axis)


def mean(a, axis=None):
    return _reduce(a, "MEAN", axis)


def amax(a, axis=None):
    return _reduce(a, "MAX", axis)


def amin(a, axis=None):
    return _reduce(a, "MIN", axis)


def softmax(a, axis=-1):
    return _wrap(_call(a._h.softmax, axis % a.ndim))


def _unary(a, op):
    return _wrap(_call(a._h.unary, getattr(_ops.UnaryOp, op)))


def sigmoid(a):
    return _unary(a, "SIGMOID")


def exp(a):
    return _unary(a, "EXP")


def log(a):
    return _unary(a, "LOG")


def sqrt(a):
    return _unary(a, "SQRT")


def abs(a):  # noqa: A001 (numpy's name)
    return _unary(a, "ABS")


def tanh(a):
    return _unary(a, "TANH")


def round(a):  # noqa: A001 (numpy's name)
    return _unary(a, "ROUND")


def floor(a):
    return _unary(a, "FLOOR")


def ceil(a):
    return _unary(a, "CEIL")


def clip(a, low, high):
    return _wrap(_call(a._h.clip, float(low), float(high)))


def maximum(a, b):
    return a._bin("MAXIMUM", b)


def minimum(a, b):
    return a._bin("MINIMUM", b)


# -- images -------------------------------------------------------------------
_COLORS = {"GRAY": _ops.Color.GRAY, "RGB": _ops.Color.RGB, "BGR": _ops.Color.BGR,
           "RGBA": _ops.Color.RGBA, "BGRA": _ops.Color.BGRA}
_FILTERS = {"nearest": _ops.Filter.NEAREST, "bilinear": _ops.Filter.BILINEAR, "area": _ops.Filter.AREA}


def _color(c):
    try:
        return _COLORS[c.upper()]
    except (KeyError, AttributeError):
        raise _pb.TritonError(f"unknown colour layout {c!r} (GRAY, RGB, BGR, RGBA or BGRA)") from None


def _filter(f):
    try:
        return _FILTERS[f]
    except KeyError:
        raise _pb.TritonError(f"unknown filter {f!r} (nearest, bilinear or area)") from None


def probe_image(data):
    """(width, height, channels) from an encoded image's header."""
    info = _call(_ops.probe_image, bytes(data))
    return info.width, info.height, info.channels


def decode_image(data, color="RGB"):
    """Decodes JPEG/PNG/WebP/BMP bytes into an HWC UINT8 array."""
    return _wrap(_call(_ops.decode_image, bytes(data), _color(color)))


def convert_color(img, src, dst):
    return _wrap(_call(_ops.convert_color, img._h, _color(src), _color(dst)))


def resize(img, height, width, filter="bilinear"):  # noqa: A002
    """Resizes an HWC UINT8 image (note: height first, unlike cv2)."""
    return _wrap(_call(_ops.resize, img._h, height, width, _filter(filter)))


def pad(img, top, bottom, left, right, value=0):
    return _wrap(_call(_ops.pad, img._h, top, bottom, left, right, value))


def crop(img, top, left, height, width):
    return _wrap(_call(_ops.crop, img._h, top, left, height, width))


def letterbox(img, height, width, value=114, filter="bilinear"):  # noqa: A002
    """YOLO's letterbox: (image, scale, pad_top, pad_left)."""
    out, info = _call(_ops.letterbox, img._h, height, width, value, _filter(filter))
    return _wrap(out), info.scale, info.pad_top, info.pad_left


def normalize(img, layout="NCHW", dtype="FP32", scale=1.0, mean=(), std=()):
    """(v * scale - mean[c]) / std[c] as a [1, C, H, W] (or [1, H, W, C]) tensor."""
    lay = _ops.Layout.NCHW if layout.upper() == "NCHW" else _ops.Layout.NHWC
    return _wrap(_call(_ops.normalize, img._h, lay, _DT[_dtype(dtype)], float(scale),
                       [float(m) for m in mean], [float(s) for s in std]))


# -- detection ----------------------------------------------------------------
Detection = _ops.Detection


def yolo_decode(output, score_threshold=0.25, layout="v8"):
    """Boxes (`Detection`: x1, y1, x2, y2, score, class_id, anchor) of a YOLO output."""
    lay = _ops.YoloLayout.V8 if layout == "v8" else _ops.YoloLayout.V5
    return _call(_ops.yolo_decode, output._h, lay, float(score_threshold))


def iou(a, b):
    return _ops.iou(a, b)


def nms(boxes, score_threshold, iou_threshold, max_detections=0, class_aware=False):
    """Indices of the boxes kept by greedy non-maximum suppression."""
    return list(_ops.nms(list(boxes), float(score_threshold), float(iou_threshold), max_detections, class_aware))


# -- the OpenCV-like part ------------------------------------------------------
class _Cv2:
    """The subset of OpenCV pre/post-processing code calls, on host arrays
    (images are HWC UINT8 in BGR order, as OpenCV's)."""

    IMREAD_COLOR = 1
    IMREAD_GRAYSCALE = 0
    IMREAD_UNCHANGED = -1
    INTER_NEAREST = 0
    INTER_LINEAR = 1
    INTER_AREA = 3
    BORDER_CONSTANT = 0
    COLOR_BGR2RGB = COLOR_RGB2BGR = 4
    COLOR_BGR2GRAY = 6
    COLOR_RGB2GRAY = 7
    COLOR_GRAY2BGR = COLOR_GRAY2RGB = 8
    COLOR_BGRA2BGR = COLOR_RGBA2RGB = 1
    COLOR_BGRA2RGB = COLOR_RGBA2BGR = 3
    COLOR_BGR2BGRA = COLOR_RGB2RGBA = 0
    _CVT = {4: ("RGB", "BGR"), 6: ("BGR", "GRAY"), 7: ("RGB", "GRAY"), 8: ("GRAY", "BGR"),
            1: ("BGRA", "BGR"), 3: ("RGBA", "BGR"), 0: ("BGR", "BGRA")}
    _INTER = {0: "nearest", 1: "bilinear", 3: "area"}

    def imdecode(self, buf, flags=1):
        """cv2.imdecode: BGR (IMREAD_COLOR), gray, or BGR(A) as stored (IMREAD_UNCHANGED)."""
        data = buf.tobytes() if isinstance(buf, ndarray) else bytes(buf)
        if flags == 0:
            return decode_image(data, "GRAY")
        if flags == -1:
            # The file's own channels, as OpenCV: gray, BGR or BGRA.
            channels = probe_image(data)[2]
            return decode_image(data, {1: "GRAY", 2: "BGRA", 3: "BGR"}.get(channels, "BGRA"))
        return decode_image(data, "BGR")

    def cvtColor(self, img, code):
        src, dst = self._CVT.get(code, (None, None))
        if src is None:
            raise _pb.TritonError(f"cvtColor: colour conversion code {code} is not supported")
        channels = img.shape[2]
        # OpenCV's 3/4-channel codes accept either channel count.
        if len(src) == 4 and channels == 3:
            src = src[:3]
        if len(src) == 3 and channels == 4:
            src = src + "A"
        return convert_color(img, src, dst)

    def resize(self, img, dsize, interpolation=1):
        w, h = dsize
        return resize(img, h, w, self._INTER.get(interpolation, "bilinear"))

    def copyMakeBorder(self, img, top, bottom, left, right, borderType=0, value=0):  # noqa: N803
        if borderType != 0:
            raise _pb.TritonError("copyMakeBorder: only BORDER_CONSTANT is supported")
        v = value[0] if isinstance(value, (tuple, list)) else value
        return pad(img, top, bottom, left, right, int(v))

    class dnn:  # noqa: N801 (OpenCV's name)
        @staticmethod
        def blobFromImage(img, scalefactor=1.0, size=None, mean=(0, 0, 0), swapRB=False, crop=False):  # noqa: N803
            """[1, C, H, W] FP32: resized to `size` (width, height) if given,
            then (v - mean) * scalefactor, channels swapped with swapRB."""
            if crop:
                raise _pb.TritonError("blobFromImage: crop=True is not supported")
            if size is not None and tuple(size) != (img.shape[1], img.shape[0]):
                img = resize(img, size[1], size[0])
            c = img.shape[2]
            if swapRB and c >= 3:
                img = convert_color(img, "RGB" if c == 3 else "RGBA", "BGR" if c == 3 else "BGRA")
            m = [float(x) * scalefactor for x in list(mean)[:c]] if any(mean) else []
            return normalize(img, "NCHW", "FP32", scalefactor, m, [])

        @staticmethod
        def NMSBoxes(bboxes, scores, score_threshold, nms_threshold, top_k=0):  # noqa: N802
            """Kept indices; boxes are [x, y, w, h]."""
            boxes = [Detection(x1=float(b[0]), y1=float(b[1]), x2=float(b[0]) + float(b[2]),
                               y2=float(b[1]) + float(b[3]), score=float(s), class_id=0, anchor=i)
                     for i, (b, s) in enumerate(zip(bboxes, scores))]
            return nms(boxes, score_threshold, nms_threshold, top_k, False)


cv2 = _Cv2()
