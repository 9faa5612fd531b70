"""The `numpy` that Triton Python models import inside Tern's Python runner.

Real numpy is a native extension and cannot run in the WebAssembly sandbox.
This module is a pure-Python subset with numpy's semantics where models
rely on them: dtype objects and scalar types, numpy's defaults (float64)
and its type promotion for arrays and Python scalars, object arrays of
`bytes` for BYTES tensors, broadcasting arithmetic and comparisons,
reductions, reshaping, slicing, boolean and integer-array indexing,
`concatenate`/`stack`/`split`, `where`, `argsort`, seeded `random`, and
`tobytes`/`frombuffer`. A function outside the subset raises
`NotImplementedError` naming it and the model file and line that called it.
docs/plugins.md ("Triton Python models") lists the subset and where it
differs from numpy. Values are held as Python lists (fine for
pre/post-processing glue, slow for heavy numeric loops) — except, inside
the runner, a request's larger numeric tensors and what they become
through the operations the host's kernels compute exactly as numpy does
(float arithmetic, casts to float, transposes, reshapes, integer argmax):
those stay in the host as `ops.array`s, and Python values are made only
when code reads them (see "arrays held by the host" below).
"""

import array as _array
import builtins as _b
import itertools as _it
import math as _math
import operator as _op
import random as _random
import struct as _struct
import sys as _sys

__version__ = "2.1.0+tern"

# --- dtypes -----------------------------------------------------------------


class dtype:
    """A data type: `name`, `kind` ('b', 'i', 'u', 'f', 'O'), `itemsize`."""

    __slots__ = ("name", "kind", "itemsize", "char", "type")

    def __new__(cls, spec=None):
        if isinstance(spec, dtype):
            return spec
        found = _lookup(spec)
        if found is None:
            raise TypeError(f"data type {spec!r} not understood")
        return found

    @classmethod
    def _make(cls, name, kind, itemsize, char):
        d = object.__new__(cls)
        d.name, d.kind, d.itemsize, d.char, d.type = name, kind, itemsize, char, None
        return d

    def __eq__(self, other):
        if isinstance(other, dtype):
            return self is other
        found = _lookup(other)
        return found is self

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return f"dtype('{self.name}')"

    __str__ = lambda self: self.name  # noqa: E731


_DTYPES = {}


def _register(name, kind, itemsize, char, base, aliases=()):
    d = dtype._make(name, kind, itemsize, char)
    if base is object:
        scalar = type(name, (), {"dtype": d})
    else:
        scalar = type(name, (base,), {
            "dtype": d,
            "__slots__": (),
            "__new__": lambda cls, v=0, _base=base, _d=d: _base.__new__(cls, _caster(_d)(v)),
            "item": lambda self, _base=base: _base(self),
            "tolist": lambda self, _base=base: _base(self),
            "astype": lambda self, t: dtype(t).type(_caster(dtype(t))(self)),
            "shape": (),
            "ndim": 0,
        })
    d.type = scalar
    for key in (name, scalar, char, *aliases):
        _DTYPES[key] = d
    return d, scalar


bool_d, bool_ = _register("bool", "b", 1, "?", int, ("bool_", _b.bool))
int8_d, int8 = _register("int8", "i", 1, "b", int, ("i1", "byte"))
int16_d, int16 = _register("int16", "i", 2, "h", int, ("i2", "short"))
int32_d, int32 = _register("int32", "i", 4, "i", int, ("i4", "intc"))
int64_d, int64 = _register("int64", "i", 8, "q", int, ("i8", "int_", "intp", "long", "longlong", _b.int))
uint8_d, uint8 = _register("uint8", "u", 1, "B", int, ("u1", "ubyte"))
uint16_d, uint16 = _register("uint16", "u", 2, "H", int, ("u2", "ushort"))
uint32_d, uint32 = _register("uint32", "u", 4, "I", int, ("u4", "uintc"))
uint64_d, uint64 = _register("uint64", "u", 8, "Q", int, ("u8", "uint", "uintp", "ulong", "ulonglong"))
float16_d, float16 = _register("float16", "f", 2, "e", float, ("f2", "half"))
float32_d, float32 = _register("float32", "f", 4, "f", float, ("f4", "single"))
float64_d, float64 = _register("float64", "f", 8, "d", float, ("f8", "double", "float_", _b.float))
object_d, object_ = _register("object", "O", 8, "O", object, ("O", "object_", _b.object, _b.str, _b.bytes))
bytes_ = object_
str_ = object_
intc, intp, int_, half, single, double = int32, int64, int64, float16, float32, float64
# C type names (64-bit Linux sizes).
byte, ubyte, short, ushort, uintc = int8, uint8, int16, uint16, uint32
longlong, ulonglong, uint, uintp, ulong = int64, uint64, uint64, uint64, uint64
float_ = float64
# `np.bool` (numpy 2) and `np.object` style names.
bool = bool_  # noqa: A001
object = object_  # noqa: A001


def _dt(spec):
    """`dtype(spec)`, without the class call for the specs code passes most
    (a dtype, a scalar type such as `np.float32`, a name)."""
    if type(spec) is dtype:
        return spec
    try:
        found = _DTYPES.get(spec)
    except TypeError:  # unhashable: dtype() explains
        found = None
    return found if found is not None else dtype(spec)


def _lookup(spec):
    if spec is None:
        return float64_d
    if isinstance(spec, dtype):
        return spec
    try:
        return _DTYPES.get(spec) or (spec.dtype if hasattr(spec, "dtype") and isinstance(spec.dtype, dtype) else None)
    except TypeError:
        return None


_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "O": 3}
_INTS = [int8_d, int16_d, int32_d, int64_d]
_UINTS = [uint8_d, uint16_d, uint32_d, uint64_d]


def result_type(*args):
    """numpy's promotion: arrays and dtypes decide; Python scalars only
    raise the kind (int -> float), as numpy 2 does."""
    def is_typed(a):
        return isinstance(a, (ndarray, dtype, type)) or isinstance(getattr(a, "dtype", None), dtype)

    typed = [a.dtype if isinstance(a, ndarray) or not isinstance(a, (dtype, type)) else dtype(a) for a in args if is_typed(a)]
    scalars = [a for a in args if not is_typed(a)]
    if not typed:
        typed = [_scalar_dtype(s) for s in scalars]
        scalars = []
    r = typed[0]
    for t in typed[1:]:
        r = _promote(r, t)
    for s in scalars:
        if isinstance(s, _b.float) and r.kind in "biu":
            r = float64_d
        elif isinstance(s, _b.int) and not isinstance(s, _b.bool) and r.kind == "b":
            r = int64_d
        elif isinstance(s, (_b.str, _b.bytes)):
            r = object_d
    return r


def _promote(a, b):
    if a is b:
        return a
    if "O" in (a.kind, b.kind):
        return object_d
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a.kind == "f" or b.kind == "f":
        if a.kind == "f" and b.kind == "f":
            return a if a.itemsize >= b.itemsize else b
        f, other = (a, b) if a.kind == "f" else (b, a)
        # An integer of n bytes needs a float wider than n bytes.
        need = {1: 2, 2: 4}.get(other.itemsize, 8)
        return {2: float16_d, 4: float32_d, 8: float64_d}[_b.max(f.itemsize, need)]
    if a.kind == b.kind:
        return a if a.itemsize >= b.itemsize else b
    s, u = (a, b) if a.kind == "i" else (b, a)
    if s.itemsize > u.itemsize:
        return s
    return {1: int16_d, 2: int32_d, 4: int64_d}.get(u.itemsize, float64_d)


def _scalar_dtype(v):
    if isinstance(v, ndarray):
        return v.dtype
    if hasattr(v, "dtype") and isinstance(v.dtype, dtype):
        return v.dtype
    if isinstance(v, _b.bool):
        return bool_d
    if isinstance(v, _b.int):
        return int64_d
    if isinstance(v, _b.float):
        return float64_d
    return object_d


_CASTERS = {}


def _caster(d):
    """The function converting a Python value to dtype `d`'s values (made
    once per dtype: the float ones hold a compiled `struct.Struct`)."""
    c = _CASTERS.get(d.name)
    if c is None:
        c = _CASTERS[d.name] = _make_caster(d)
    return c


def _make_caster(d):
    if d.kind == "f":
        if d.itemsize == 8:
            return _b.float
        code = "e" if d.itemsize == 2 else "f"
        limit = 65504.0 if d.itemsize == 2 else 3.4028234663852886e38

        def to_float(v, _p=_struct.Struct("<" + code)):
            v = _b.float(v)
            if v != v or _b.abs(v) == _math.inf:
                return v
            try:
                return _p.unpack(_p.pack(v))[0]
            except OverflowError:
                return _math.copysign(_math.inf, v) if _b.abs(v) > limit else v

        return to_float
    if d.kind == "b":
        return _b.bool
    if d.kind in "iu":
        bits = 8 * d.itemsize
        mod, half = 1 << bits, 1 << (bits - 1)
        signed = d.kind == "i"

        def to_int(v):
            if isinstance(v, _b.float):
                if v != v or v in (_math.inf, -_math.inf):
                    return -half if signed else 0
                v = _b.int(v)
            v = _b.int(v) % mod
            return v - mod if signed and v >= half else v

        return to_int
    return lambda v: v


def _cast_all(values, d):
    code = _ARRAY_CODE.get((d.kind, d.itemsize))
    if code is not None:
        # In range (and, for integers, integral): the array module converts
        # at C speed; anything else (overflow, wrapping, truncation) the slow way.
        try:
            return _array.array(code, values).tolist()
        except (OverflowError, TypeError):
            pass
    if d.kind == "f" and d.itemsize == 8:
        return list(map(_b.float, values))
    c = _caster(d)
    return [c(v) for v in values]


# (kind, itemsize) -> the array module's typecode holding exactly that type.
_ARRAY_CODE = {("f", 4): "f", ("i", 1): "b", ("u", 1): "B", ("i", 2): "h", ("u", 2): "H",
               ("i", 4): "i", ("u", 4): "I", ("i", 8): "q", ("u", 8): "Q"}


# --- the array ----------------------------------------------------------------


def _count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _strides(shape):
    out, n = [], 1
    for s in reversed(shape):
        out.append(n)
        n *= s
    return tuple(reversed(out))


def _offsets(shape, strides):
    """The flat source offset of every index of `shape`, in C order, for an
    array read with `strides` (0 for a broadcast axis)."""
    offs = [0]
    for n, st in zip(shape, strides):
        if n == 1:
            continue
        # Each offset so far, n times over (C-level iterators: these lists
        # are as long as the array)...
        each = _it.chain.from_iterable(map(_it.repeat, offs, _it.repeat(n)))
        # ... plus, for an axis that is not broadcast, its steps in turn.
        offs = list(map(_op.add, each, _it.cycle(range(0, n * st, st)))) if st else list(each)
    return offs if _count(shape) else []


def _strided(data, shape, strides):
    """The elements of `data` read with `strides` over `shape`, in C order
    (a transpose): axes that are contiguous in `data` merged, then one
    extended slice per row of the innermost axis, at C speed."""
    dims = [(n, st) for n, st in zip(shape, strides) if n != 1]
    if not dims:
        return list(data[:1]) if _count(shape) else []
    merged = [dims[0]]
    for n, st in dims[1:]:
        pn, pst = merged[-1]
        if pst == n * st:
            merged[-1] = (pn * n, st)
        else:
            merged.append((n, st))
    n, st = merged[-1]
    if not n or not st:
        return _gather(data, _offsets(shape, strides))
    rows = _offsets([m for m, _ in merged[:-1]], [t for _, t in merged[:-1]])
    span = n * st
    return list(_it.chain.from_iterable(data[o : o + span : st] for o in rows))


def _gather(data, offs):
    """`[data[o] for o in offs]`, at C speed."""
    return list(map(data.__getitem__, offs))


class flatiter:
    """`ndarray.flat`: the elements in C order, iterable, indexable and assignable."""

    __slots__ = ("base",)

    def __init__(self, a):
        self.base = a

    def __iter__(self):
        return iter(self.base.reshape(-1))

    def __len__(self):
        return self.base.size

    def __getitem__(self, key):
        return self.base.reshape(-1)[key]

    def __setitem__(self, key, value):
        self.base.reshape(-1)[key] = value


class _Store:
    """An array's elements in C order: a Python list, or an `ops.array` the
    host holds (`held`, of shape `held_shape`) until Python code reads them.
    Arrays that are views of one another (`reshape`) share their store."""

    __slots__ = ("values", "held", "held_shape", "mirror")

    def __init__(self, values, held=None, held_shape=None):
        self.values, self.held, self.held_shape = values, held, held_shape
        # A host copy of a small list (a constant such as a per-channel
        # mean, used again each request): (the bytes it was made from,
        # shape, dtype, host array), used while the list still gives those
        # bytes.
        self.mirror = None


class ndarray:
    """An n-dimensional array: its elements (a `_Store`), a shape and a dtype."""

    __slots__ = ("_store", "_shape", "_dtype")
    __array_priority__ = 0

    def __init__(self, shape, dtype=float64_d, buffer=None):  # noqa: A002 (numpy's name)
        d = globals()["dtype"](dtype)
        shape = (shape,) if isinstance(shape, _b.int) else tuple(_b.int(s) for s in shape)
        self._shape, self._dtype = shape, d
        self._store = _Store(list(buffer) if buffer is not None else [_zero(d)] * _count(shape))

    @classmethod
    def _of(cls, data, shape, d):
        a = object.__new__(cls)
        a._store, a._shape, a._dtype = _Store(data), shape if type(shape) is tuple else tuple(shape), d
        return a

    @classmethod
    def _sharing(cls, store, shape, d):
        a = object.__new__(cls)
        a._store, a._shape, a._dtype = store, tuple(shape), d
        return a

    @property
    def _data(self):
        """The elements as a flat list (fetched from the host, once, if it holds them)."""
        s = self._store
        if s.values is None:
            s.values = _fetch(s.held, self._dtype)
            s.held = s.held_shape = None
        return s.values

    @_data.setter
    def _data(self, values):
        self._store = _Store(values)

    # properties
    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: _count(self._shape))
    itemsize = property(lambda self: self._dtype.itemsize)
    nbytes = property(lambda self: self._dtype.itemsize * _count(self._shape))
    T = property(lambda self: self.transpose())
    flat = property(lambda self: flatiter(self))

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of unsized object")
        return self._shape[0]

    def __iter__(self):
        if len(self._shape) == 1:
            # What self[i] gives, without working out the index each time.
            d = self._dtype
            for i in range(self._shape[0]):
                yield _scalar(self._data[i], d)
            return
        for i in range(len(self)):
            yield self[i]

    def __repr__(self):
        return f"array({self.tolist()!r}, dtype={self._dtype.name})"

    __str__ = __repr__

    def __bool__(self):
        if len(self._data) != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()")
        return _b.bool(self._data[0])

    def __float__(self):
        return _b.float(self.item())

    def __int__(self):
        return _b.int(self.item())

    def __index__(self):
        if self._dtype.kind not in "biu":
            raise TypeError("only integer arrays can be used as an index")
        return _b.int(self.item())

    # conversion
    def item(self, *index):
        if index:
            return self[index].item() if isinstance(self[index], ndarray) else self[index]
        if len(self._data) != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self._data[0]

    def tolist(self):
        return _nest(self._data, self._shape)

    def tobytes(self):
        s = self._store
        if s.held is not None:
            return _b.bytes(s.held.data())
        return _to_bytes(self._data, self._dtype)

    def astype(self, dtype, copy=True):  # noqa: A002
        d = _dt(dtype)
        if d is self._dtype:
            return self.copy() if copy else self
        if self._store.held is not None and _host_casts(self._dtype, d):
            r = _host_call(lambda: _held_handle(self).cast(_HOST_DT[d.name]), self._shape, d)
            if r is not None:
                return r
        return ndarray._of(_cast_all(self._data, d), self._shape, d)

    def copy(self):
        s = self._store
        if s.held is not None:  # host arrays never change: the copy holds the same one
            return ndarray._sharing(_Store(None, s.held, s.held_shape), self._shape, self._dtype)
        return ndarray._of(list(self._data), self._shape, self._dtype)

    def view(self):
        return self

    # shape
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and not isinstance(shape[0], _b.int):
            shape = tuple(shape[0])
        if shape == self._shape:  # a.reshape(b.shape) where it is already that shape
            return ndarray._sharing(self._store, self._shape, self._dtype)
        shape = [_b.int(s) for s in shape]
        if shape.count(-1) > 1:
            raise ValueError("can only specify one unknown dimension")
        if -1 in shape:
            known = _count([s for s in shape if s != -1])
            shape[shape.index(-1)] = self.size // known if known else 0
        if _count(shape) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} into shape {tuple(shape)}")
        return ndarray._sharing(self._store, shape, self._dtype)

    def flatten(self):
        return self.copy().reshape(-1)

    def repeat(self, repeats, axis=None):
        return repeat(self, repeats, axis)

    ravel = flatten

    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], _b.int):
            axes = tuple(axes[0])
        n = len(self._shape)
        axes = tuple(reversed(range(n))) if not axes else tuple(a % n for a in axes)
        shape = tuple(self._shape[a] for a in axes)
        if self._store.held is not None:
            r = _host_call(lambda: _held_handle(self).transpose(list(axes)), shape, self._dtype)
            if r is not None:
                return r
        src = _strides(self._shape)
        return ndarray._of(_strided(self._data, shape, [src[a] for a in axes]), shape, self._dtype)

    def squeeze(self, axis=None):
        return squeeze(self, axis)

    def fill(self, value):
        self._data[:] = [_caster(self._dtype)(value)] * len(self._data)

    # indexing
    def __getitem__(self, key):
        data, shape = _select(self, key)
        if shape is None:
            return data
        return ndarray._of(data, shape, self._dtype)

    def __setitem__(self, key, value):
        positions, shape = _positions(self, key)
        shape = () if shape is None else shape
        v = asarray(value)
        if v._dtype.kind == "O" and self._dtype.kind != "O" and v.size == 1:
            v = asarray(v.item())
        vals = _broadcast_to(v, shape)._data if shape != v._shape else v._data
        c = _caster(self._dtype)
        for p, x in zip(positions, vals):
            self._data[p] = c(x)

    # arithmetic
    def _bin(self, other, f, out_dtype=None, reverse=False):
        return _binary(other, self, f, out_dtype) if reverse else _binary(self, other, f, out_dtype)

    def __add__(self, o):
        return self._bin(o, _op.add)

    def __radd__(self, o):
        return self._bin(o, _op.add, reverse=True)

    def __sub__(self, o):
        return self._bin(o, _op.sub)

    def __rsub__(self, o):
        return self._bin(o, _op.sub, reverse=True)

    def __mul__(self, o):
        return self._bin(o, _op.mul)

    def __rmul__(self, o):
        return self._bin(o, _op.mul, reverse=True)

    def __truediv__(self, o):
        return self._bin(o, _div, "true")

    def __rtruediv__(self, o):
        return self._bin(o, _div, "true", reverse=True)

    def __floordiv__(self, o):
        return self._bin(o, _floordiv)

    def __rfloordiv__(self, o):
        return self._bin(o, _floordiv, reverse=True)

    def __mod__(self, o):
        return self._bin(o, _mod)

    def __pow__(self, o):
        if self._dtype.kind in "iu" and result_type(self, o).kind in "iu" and _b.any(v < 0 for v in asarray(o)._data):
            raise ValueError("Integers to negative integer powers are not allowed.")
        return self._bin(o, _op.pow)

    def __rmod__(self, o):
        return self._bin(o, _mod, reverse=True)

    def __lshift__(self, o):
        return self._bin(o, _op.lshift)

    def __rshift__(self, o):
        return self._bin(o, _op.rshift)

    def _inplace(self, result):
        """`a op= b`: the result written into `a`, in `a`'s dtype (numpy's same-kind casting)."""
        r = _broadcast_to(result, self._shape)
        self._data[:] = _cast_all(r._data, self._dtype) if self._dtype.kind != "O" else r._data
        return self

    def __iadd__(self, o):
        return self._inplace(self + o)

    def __isub__(self, o):
        return self._inplace(self - o)

    def __imul__(self, o):
        return self._inplace(self * o)

    def __itruediv__(self, o):
        if self._dtype.kind != "f":
            raise TypeError("Cannot cast ufunc 'divide' output from dtype('float64') to an integer dtype in place")
        return self._inplace(self / o)

    def __ifloordiv__(self, o):
        return self._inplace(self // o)

    def __rpow__(self, o):
        return self._bin(o, _op.pow, reverse=True)

    def __and__(self, o):
        return self._bin(o, _op.and_)

    def __or__(self, o):
        return self._bin(o, _op.or_)

    def __xor__(self, o):
        return self._bin(o, _op.xor)

    def __neg__(self):
        return ndarray._of(_cast_all([-v for v in self._data], self._dtype), self._shape, self._dtype)

    def __pos__(self):
        return self.copy()

    def __abs__(self):
        return ndarray._of(_cast_all([_b.abs(v) for v in self._data], self._dtype), self._shape, self._dtype)

    def __invert__(self):
        if self._dtype.kind == "b":
            return ndarray._of([not v for v in self._data], self._shape, self._dtype)
        return ndarray._of(_cast_all([~v for v in self._data], self._dtype), self._shape, self._dtype)

    def __eq__(self, o):  # noqa: D105
        return self._bin(o, _op.eq, bool_d)

    def __ne__(self, o):
        return self._bin(o, _op.ne, bool_d)

    def __lt__(self, o):
        return self._bin(o, _op.lt, bool_d)

    def __le__(self, o):
        return self._bin(o, _op.le, bool_d)

    def __gt__(self, o):
        return self._bin(o, _op.gt, bool_d)

    def __ge__(self, o):
        return self._bin(o, _op.ge, bool_d)

    __hash__ = None

    # reductions
    def sum(self, axis=None, dtype=None, keepdims=False):  # noqa: A002
        return sum(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return amax(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        return amin(self, axis=axis, keepdims=keepdims)

    def prod(self, axis=None, keepdims=False):
        return prod(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis=None):
        return argmax(self, axis)

    def argmin(self, axis=None):
        return argmin(self, axis)

    def argsort(self, axis=-1):
        return argsort(self, axis)

    def all(self, axis=None):
        return all(self, axis)

    def any(self, axis=None):
        return any(self, axis)

    def clip(self, a_min=None, a_max=None, min=None, max=None):  # noqa: A002
        return clip(self, a_min, a_max, min, max)

    def round(self, decimals=0):
        return round(self, decimals)

    def std(self, axis=None):
        return std(self, axis)

    def var(self, axis=None):
        return var(self, axis)


def _zero(d):
    return b"" if d.kind == "O" else (False if d.kind == "b" else (0.0 if d.kind == "f" else 0))


def _div(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        return _math.nan if a == 0 or a != a else _math.copysign(_math.inf, a) * (1 if str(b)[0] != "-" else -1)


def _floordiv(a, b):
    try:
        return a // b
    except ZeroDivisionError:
        return 0 if isinstance(a, _b.int) else _div(a, b)


def _mod(a, b):
    try:
        return a % b
    except ZeroDivisionError:
        return 0 if isinstance(a, _b.int) else _math.nan


def _nest(flat, shape):
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = _count(shape[1:])
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def _indices(shape):
    if not shape:
        yield ()
        return
    idx = [0] * len(shape)
    total = _count(shape)
    for _ in range(total):
        yield tuple(idx)
        for k in range(len(shape) - 1, -1, -1):
            idx[k] += 1
            if idx[k] < shape[k]:
                break
            idx[k] = 0


_CODES = {"b": "b", "B": "B", "h": "h", "H": "H", "i": "i", "I": "I", "q": "q", "Q": "Q", "f": "f", "d": "d"}
_BIG = _sys.byteorder == "big"


def _to_bytes(data, d):
    if d.kind == "O":
        return b"".join(_struct.pack("<I", len(x)) + x for x in (v.encode() if isinstance(v, _b.str) else _b.bytes(v) for v in data))
    if d.kind == "b":
        return _b.bytes(1 if v else 0 for v in data)
    if d.char == "e":
        return _struct.pack(f"<{len(data)}e", *data)
    a = _array.array(_CODES[d.char], data)
    if _sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def _shape_of(obj):
    shape = []
    while isinstance(obj, (list, tuple)):
        shape.append(len(obj))
        if not obj:
            break
        obj = obj[0]
    return tuple(shape)


def _flatten(obj, out):
    if isinstance(obj, (list, tuple)):
        if not _b.any(isinstance(x, (list, tuple, ndarray)) for x in obj):
            out.extend(obj)  # a flat list of scalars (the common case)
            return out
        for x in obj:
            _flatten(x, out)
    elif isinstance(obj, ndarray):
        out.extend(obj._data)
    else:
        out.append(obj)
    return out


def array(obj, dtype=None, copy=True, ndmin=0):  # noqa: A002
    """An array from nested lists, tuples, scalars or another array."""
    if isinstance(obj, ndarray):
        a = obj.astype(dtype) if dtype is not None else (obj.copy() if copy else obj)
    else:
        if isinstance(obj, (list, tuple)) and not _b.any(isinstance(x, (list, tuple, ndarray)) for x in obj):
            flat, shape = list(obj), (len(obj),)  # a flat list of scalars (the common case)
        else:
            if isinstance(obj, (list, tuple)) and obj and _b.all(isinstance(x, ndarray) for x in obj):
                return stack(obj).astype(dtype) if dtype is not None else stack(obj)
            shape = _shape_of(obj)
            flat = _flatten(obj, [])
            if len(flat) != _count(shape):
                raise ValueError("setting an array element with a sequence: the nested lists are not rectangular")
        if dtype is None:
            d = bool_d if flat and _b.all(isinstance(v, _b.bool) for v in flat) else None
            if d is None:
                kinds = {_scalar_dtype(v) for v in flat}
                d = object_d if object_d in kinds else (float64_d if float64_d in kinds else (int64_d if kinds else float64_d))
                for k in kinds:
                    if k not in (bool_d, int64_d, float64_d, object_d):
                        d = k if len(kinds) == 1 else _promote(d, k)
        else:
            d = _dt(dtype)
        a = ndarray._of(_cast_all(flat, d) if d.kind != "O" else flat, shape, d)
    while a.ndim < ndmin:
        a = a.reshape((1,) + a.shape)
    return a


def asarray(obj, dtype=None):  # noqa: A002
    if isinstance(obj, ndarray) and (dtype is None or globals()["dtype"](dtype) is obj.dtype):
        return obj
    return array(obj, dtype)


ascontiguousarray = asarray


def _filled(shape, value, d):
    shape = (shape,) if isinstance(shape, _b.int) else tuple(shape)
    return ndarray._of([_caster(d)(value) if d.kind != "O" else value] * _count(shape), shape, d)


def zeros(shape, dtype=float64_d):  # noqa: A002
    return _filled(shape, 0, dtype_of(dtype))


def ones(shape, dtype=float64_d):  # noqa: A002
    return _filled(shape, 1, dtype_of(dtype))


def empty(shape, dtype=float64_d):  # noqa: A002
    d = dtype_of(dtype)
    return _filled(shape, _zero(d), d)


def full(shape, fill_value, dtype=None):  # noqa: A002
    return _filled(shape, fill_value, dtype_of(dtype) if dtype is not None else result_type(fill_value))


def dtype_of(d):
    return dtype(d)


def zeros_like(a, dtype=None):  # noqa: A002
    a = asarray(a)
    return zeros(a.shape, dtype or a.dtype)


def ones_like(a, dtype=None):  # noqa: A002
    a = asarray(a)
    return ones(a.shape, dtype or a.dtype)


def empty_like(a, dtype=None):  # noqa: A002
    a = asarray(a)
    return empty(a.shape, dtype or a.dtype)


def full_like(a, fill_value, dtype=None):  # noqa: A002
    a = asarray(a)
    return full(a.shape, fill_value, dtype or a.dtype)


def arange(start, stop=None, step=1, dtype=None):  # noqa: A002
    if stop is None:
        start, stop = 0, start
    n = _b.max(0, _math.ceil((stop - start) / step))
    values = [start + i * step for i in range(n)]
    d = dtype_of(dtype) if dtype is not None else result_type(start, stop, step)
    return ndarray._of(_cast_all(values, d), (n,), d)


def linspace(start, stop, num=50, endpoint=True, dtype=None):  # noqa: A002
    div = (num - 1) if endpoint else num
    step = (stop - start) / div if div else 0.0
    values = [start + i * step for i in range(num)]
    if endpoint and num > 1:
        values[-1] = _b.float(stop)
    d = dtype_of(dtype) if dtype is not None else float64_d
    return ndarray._of(_cast_all(values, d), (num,), d)


def frombuffer(buffer, dtype=float64_d, count=-1, offset=0):  # noqa: A002
    d = dtype_of(dtype)
    raw = _b.bytes(buffer)[offset:]
    if d.kind == "O":
        raise ValueError("frombuffer cannot make an object array")
    n = len(raw) // d.itemsize if count < 0 else count
    raw = raw[: n * d.itemsize]
    if len(raw) != n * d.itemsize:
        raise ValueError("buffer size must be a multiple of element size")
    if d.kind == "b":
        values = [v != 0 for v in raw]
    elif d.char == "e":
        values = list(_struct.unpack(f"<{n}e", raw))
    else:
        a = _array.array(_CODES[d.char])
        a.frombytes(raw)
        if _sys.byteorder == "big":
            a.byteswap()
        values = a.tolist()
    return ndarray._of(values, (n,), d)


def _from_wire(raw, dtype, shape):  # noqa: A002
    """A tensor's little-endian bytes as an array of `shape`: `frombuffer`
    and `reshape` in one step (how `pb_utils.Tensor.as_numpy()` reads).
    Inside the runner a numeric tensor of `_HOST_MIN` elements or more
    goes to the host as it is."""
    shape = tuple(map(_b.int, shape))
    d = _dt(dtype)
    n = _count(shape)
    if _OPS is not None and n >= _HOST_MIN and d.name in _HOST_DT and len(raw) == n * d.itemsize:
        a = _host_call(lambda: _OPS.Array.from_data(_HOST_DT[d.name], list(shape), _b.bytes(raw)), shape, d)
        if a is not None:
            return a
    code = _CODES.get(d.char)
    if code is not None and not _BIG and len(raw) == n * d.itemsize:
        # The common case (numbers, sizes agreeing): straight from the bytes.
        values = _array.array(code, raw).tolist()
        return ndarray._of(values, shape, d)
    a = frombuffer(raw, dtype)
    if n != len(a._data):
        raise ValueError(f"cannot reshape array of size {len(a._data)} into shape {shape}")
    a._shape = shape
    return a


# --- broadcasting -------------------------------------------------------------


def _broadcast_shape(*shapes):
    n = _b.max(len(s) for s in shapes)
    out = []
    for i in range(n):
        dims = {s[i - n + len(s)] for s in shapes if i - n + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError("operands could not be broadcast together with shapes " + " ".join(str(tuple(s)) for s in shapes))
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _broadcast_to(a, shape):
    a = asarray(a)
    if a._shape == tuple(shape):
        return a
    if len(a._data) == 1:
        return ndarray._of(a._data * _count(shape), shape, a._dtype)
    pad = (1,) * (len(shape) - len(a._shape)) + a._shape
    st = _strides(pad)
    st = [0 if p == 1 else s for p, s in zip(pad, st)]
    return ndarray._of(_gather(a._data, _offsets(shape, st)), shape, a._dtype)


broadcast_to = _broadcast_to


def _binary(a, b, f, out_dtype=None):
    if _OPS is not None and (type(a) is ndarray and a._store.held is not None or type(b) is ndarray and b._store.held is not None) \
            and f in _HOST_BINARY and out_dtype in (None, "true"):
        r = _host_binary(a, b, f)
        if r is not None:
            return r
    if type(a) is ndarray and type(b) is ndarray and a._dtype is b._dtype and a._shape == b._shape:
        # Same dtype and shape (the common case): no promotion or broadcasting to work out.
        d = a._dtype
        if out_dtype == "true":
            out_dtype = d if d.kind == "f" else float64_d
        values = _apply(f, a._data, b._data, ints=d.kind != "f")
        od = out_dtype or d
        return ndarray._of(values if od.kind == "O" else _cast_all(values, od), a._shape, od)
    x, y = isinstance(a, ndarray), isinstance(b, ndarray)
    if not x and isinstance(a, (list, tuple)):
        a, x = asarray(a), True
    if not y and isinstance(b, (list, tuple)):
        b, y = asarray(b), True
    d = result_type(a, b)
    if out_dtype == "true":
        out_dtype = d if d.kind == "f" else float64_d
    xa = a if x else ndarray._of([a], (), d)
    yb = b if y else ndarray._of([b], (), d)
    shape = _broadcast_shape(xa._shape, yb._shape)
    n = _count(shape)
    values = _apply(f, _broadcast_iter(xa, shape, n), _broadcast_iter(yb, shape, n),
                    ints=xa._dtype.kind != "f" and yb._dtype.kind != "f")
    od = out_dtype or d
    return ndarray._of(values if od.kind == "O" else _cast_all(values, od), shape, od)


def _broadcast_iter(a, shape, n):
    """The elements of `a` broadcast to `shape` (of `n` elements), without
    building a list where the pattern allows: one element repeated; a run
    of axes matching `shape` (a per-channel constant, a row vector), each
    element repeated for the axes after it and the whole cycled for those
    before; anything else gathered."""
    data = a._data
    if a._shape == shape:
        return data
    if len(data) == 1:
        return _it.repeat(data[0], n)
    pad = (1,) * (len(shape) - len(a._shape)) + tuple(a._shape)
    kept = [i for i, p in enumerate(pad) if p != 1]
    lo, hi = kept[0], kept[-1] + 1
    if _b.all(pad[i] == shape[i] for i in range(lo, hi)):
        inner, outer = _count(shape[hi:]), _count(shape[:lo])
        seq = data if inner == 1 else list(_it.chain.from_iterable(map(_it.repeat, data, _it.repeat(inner))))
        return seq if outer == 1 else _it.chain.from_iterable(_it.repeat(seq, outer))
    return _broadcast_to(a, shape)._data


def _apply(f, da, db, ints=True):
    """`[f(p, q) for p, q in zip(da, db)]`, at C speed where `f` allows.
    `ints`: both operands may hold integers (not float arrays)."""
    if f is _div:
        # numpy divides integers as float64 (Python's int / int is exact,
        # which can differ in the last bit; int / float already converts).
        # Division by zero is rare: divide at C speed, redo the slow way if
        # it happens.
        da, db = (list(map(_b.float, da)) if ints else list(da)), list(db)
        try:
            return list(map(_op.truediv, da, db))
        except ZeroDivisionError:
            pass
    return list(map(f, da, db))


# --- indexing -----------------------------------------------------------------


def _normalise_key(a, key):
    if not isinstance(key, tuple):
        key = (key,)
    if _b.any(k is Ellipsis for k in key):
        i = [k is Ellipsis for k in key].index(True)
        fill = a.ndim - (len([k for k in key if k is not None]) - 1)
        key = key[:i] + (slice(None),) * fill + key[i + 1 :]
    return key


def _positions(a, key):
    """Flat positions a key selects, and the shape of the selection (`None`: a scalar)."""
    if isinstance(key, list) and key and _b.all(isinstance(k, _b.bool) for k in key):
        key = array(key, dtype=bool_d)
    if isinstance(key, ndarray) and key.dtype.kind == "b":
        if key.shape != a.shape[: key.ndim]:
            raise IndexError("boolean index did not match indexed array")
        inner = _count(a.shape[key.ndim :])
        pos = [i * inner + j for i, v in enumerate(key._data) if v for j in range(inner)]
        return pos, (len(pos) // inner if inner else 0,) + a.shape[key.ndim :]
    if isinstance(key, (list, ndarray)) and not (isinstance(key, list) and key and isinstance(key[0], (list, slice))):
        idx = [_b.int(i) for i in asarray(key)._data]
        inner = _count(a.shape[1:])
        pos = []
        for i in idx:
            i = i + a.shape[0] if i < 0 else i
            if not 0 <= i < a.shape[0]:
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {a.shape[0]}")
            pos.extend(range(i * inner, (i + 1) * inner))
        return pos, (len(idx),) + a.shape[1:]
    key = _normalise_key(a, key)
    st = _strides(a.shape)
    axes = []  # per output axis: list of offsets
    offset = 0
    dim = 0
    out_shape = []
    for k in key:
        if k is None:
            axes.append([0])
            out_shape.append(1)
            continue
        if dim >= a.ndim:
            raise IndexError(f"too many indices for array: array is {a.ndim}-dimensional")
        if isinstance(k, (list, ndarray)):
            raise NotImplementedError(
                f"numpy indexing with an array inside a tuple (called from {_caller()}) is not in the numpy subset "
                "of Tern's Python runner: index one axis at a time")
        n = a.shape[dim]
        if isinstance(k, slice):
            r = range(*k.indices(n))
            axes.append([i * st[dim] for i in r])
            out_shape.append(len(r))
        else:
            i = _b.int(k)
            i = i + n if i < 0 else i
            if not 0 <= i < n:
                raise IndexError(f"index {k} is out of bounds for axis {dim} with size {n}")
            offset += i * st[dim]
        dim += 1
    for rest in range(dim, a.ndim):
        axes.append([i * st[rest] for i in range(a.shape[rest])])
        out_shape.append(a.shape[rest])
    pos = [offset]
    for offs in axes:
        pos = [p + o for p in pos for o in offs]
    scalar = not out_shape and len(key) == a.ndim and _b.all(k is not None and not isinstance(k, slice) for k in key)
    return pos, (None if scalar else tuple(out_shape))


def _select(a, key):
    pos, shape = _positions(a, key)
    if shape is None:
        return _scalar(a._data[pos[0]], a._dtype), None
    return [a._data[p] for p in pos], shape


# --- functions ----------------------------------------------------------------


def _axis_groups(a, axis):
    """For a reduction over `axis`: the output shape and, per output element, the values."""
    axis = axis % a.ndim
    outer = _count(a.shape[:axis])
    n = a.shape[axis]
    inner = _count(a.shape[axis + 1 :])
    data, span = a._data, n * inner
    groups = [data[o * span + i : o * span + i + span : inner] for o in range(outer) for i in range(inner)]
    return a.shape[:axis] + a.shape[axis + 1 :], groups


def _reduce(a, f, axis, out_dtype=None, keepdims=False):
    a = asarray(a)
    if axis is None:
        v = f(a._data)
        d = out_dtype or a.dtype
        r = ndarray._of([v], (), d)
        return r.reshape((1,) * a.ndim) if keepdims else _scalar(v, d)
    if isinstance(axis, tuple):
        r = a
        for ax in sorted((x % a.ndim for x in axis), reverse=True):
            r = _reduce(r, f, ax, out_dtype, keepdims)
        return r
    shape, groups = _axis_groups(a, axis)
    d = out_dtype or a.dtype
    values = [f(g) for g in groups]
    r = ndarray._of(values if d.kind in "bO" else _cast_all(values, d), shape, d)
    if keepdims:
        ax = axis % a.ndim
        r = r.reshape(a.shape[:ax] + (1,) + a.shape[ax + 1 :])
    return r


def _scalar(v, d):
    if d.kind == "O":
        return v
    try:
        return d.type(v)  # rounds (float32) or wraps (integers) as numpy's scalars hold them
    except (TypeError, ValueError, OverflowError):
        return v


def _sum_dtype(a):
    return int64_d if a.dtype.kind in "bi" else (uint64_d if a.dtype.kind == "u" else a.dtype)


def sum(a, axis=None, dtype=None, keepdims=False):  # noqa: A001,A002
    a = asarray(a)
    return _reduce(a, lambda g: _math.fsum(g) if a.dtype.kind == "f" else _b.sum(g), axis, dtype_of(dtype) if dtype else _sum_dtype(a), keepdims)


def prod(a, axis=None, keepdims=False):
    a = asarray(a)
    return _reduce(a, _math.prod, axis, _sum_dtype(a), keepdims)


def mean(a, axis=None, keepdims=False):
    a = asarray(a)
    d = a.dtype if a.dtype.kind == "f" else float64_d
    return _reduce(a, lambda g: (_math.fsum(g) / len(g)) if g else _math.nan, axis, d, keepdims)


def var(a, axis=None):
    a = asarray(a)

    def v(g):
        m = _math.fsum(g) / len(g)
        return _math.fsum((x - m) ** 2 for x in g) / len(g)

    return _reduce(a, v, axis, a.dtype if a.dtype.kind == "f" else float64_d)


def std(a, axis=None):
    return sqrt(var(a, axis))


def _nan_or(f):
    """numpy's max/min: a NaN anywhere is the answer."""
    def g(values):
        for v in values:
            if v != v:
                return v
        return f(values)
    return g


def amax(a, axis=None, keepdims=False):
    return _reduce(a, _nan_or(_b.max), axis, None, keepdims)


def amin(a, axis=None, keepdims=False):
    return _reduce(a, _nan_or(_b.min), axis, None, keepdims)


max = amax  # noqa: A001
min = amin  # noqa: A001


def _first_nan_or(f):
    def g(values):
        try:
            nan = _b.any(map(_math.isnan, values))
        except (TypeError, OverflowError):  # not floats
            nan = _b.any(v != v for v in values)
        if nan:
            return next(i for i, v in enumerate(values) if v != v)
        return values.index(f(values))
    return g


def argmax(a, axis=None):
    a = asarray(a)
    if axis is not None and a._store.held is not None and a.dtype.kind in "biu" and a.dtype.itemsize <= 4:
        # Integers are exact as the kernel's f64 and hold no NaN; ties give the first, as numpy.
        ax = axis % a.ndim
        r = _host_call(lambda: _held_handle(a).argmax(ax), a.shape[:ax] + a.shape[ax + 1 :], int64_d)
        if r is not None:
            return r
    return _reduce(a.flatten() if axis is None else a, _first_nan_or(_b.max), None if axis is None else axis, int64_d)


def argmin(a, axis=None):
    a = asarray(a)
    return _reduce(a.flatten() if axis is None else a, _first_nan_or(_b.min), None if axis is None else axis, int64_d)


def all(a, axis=None):  # noqa: A001
    return _reduce(asarray(a), lambda g: _b.all(g), axis, bool_d)


def any(a, axis=None):  # noqa: A001
    return _reduce(asarray(a), lambda g: _b.any(g), axis, bool_d)


def _along(a, axis, f, out_dtype=None):
    """Applies `f` (list -> list of the same length) along `axis`."""
    a = asarray(a)
    axis = axis % a.ndim
    n = a.shape[axis]
    inner = _count(a.shape[axis + 1 :])
    outer = _count(a.shape[:axis])
    out = list(a._data)
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            vals = f([a._data[base + k * inner] for k in range(n)])
            for k, v in enumerate(vals):
                out[base + k * inner] = v
    return ndarray._of(out, a.shape, out_dtype or a.dtype)


def argsort(a, axis=-1, kind=None):
    return _along(a, axis, lambda g: sorted(range(len(g)), key=g.__getitem__), int64_d)


def sort(a, axis=-1):
    return _along(a, axis, sorted)


def cumsum(a, axis=None):
    a = asarray(a)
    if axis is None:
        a = a.flatten()
        axis = 0

    def run(g):
        out, t = [], 0
        for v in g:
            t += v
            out.append(t)
        return out

    return _along(a, axis, run, _sum_dtype(a))


def _unary(f, out_float=True):
    def apply(x):
        a = asarray(x)
        d = (a.dtype if a.dtype.kind == "f" else float64_d) if out_float else a.dtype
        r = ndarray._of(_cast_all([f(v) for v in a._data], d), a.shape, d)
        return r if isinstance(x, ndarray) else r.item()

    return apply


def _safe(f):
    def g(v):
        try:
            return f(v)
        except (ValueError, OverflowError):
            return _math.nan if v != _math.inf else _math.inf

    return g


def _exp(v):
    try:
        return _math.exp(v)
    except OverflowError:
        return _math.inf


exp = _unary(_exp)
log = _unary(lambda v: -_math.inf if v == 0 else (_math.log(v) if v > 0 else _math.nan))
sqrt = _unary(lambda v: _math.sqrt(v) if v >= 0 else _math.nan)
tanh = _unary(_math.tanh)
sin = _unary(_math.sin)
cos = _unary(_math.cos)
floor = _unary(lambda v: _math.floor(v) if _math.isfinite(v) else v)
ceil = _unary(lambda v: _math.ceil(v) if _math.isfinite(v) else v)
abs = _unary(_b.abs, out_float=False)  # noqa: A001
absolute = abs


def round(a, decimals=0):  # noqa: A001
    a = asarray(a)
    return ndarray._of(_cast_all([_b.round(v, decimals) for v in a._data], a.dtype), a.shape, a.dtype)


around = round


def clip(a, a_min=None, a_max=None, min=None, max=None):  # noqa: A002 (numpy's names)
    a = asarray(a)
    lo = a_min if a_min is not None else min
    hi = a_max if a_max is not None else max
    if lo is not None:
        a = _binary(a, lo, lambda x, y: x if x > y or x != x else y)
    if hi is not None:
        a = _binary(a, hi, lambda x, y: x if x < y or x != x else y)
    return a


def maximum(a, b):
    return _binary(asarray(a), b, lambda x, y: x if x >= y or x != x else y)


def minimum(a, b):
    return _binary(asarray(a), b, lambda x, y: x if x <= y or x != x else y)


def add(a, b):
    return _binary(asarray(a), b, lambda x, y: x + y)


def subtract(a, b):
    return _binary(asarray(a), b, lambda x, y: x - y)


def multiply(a, b):
    return _binary(asarray(a), b, lambda x, y: x * y)


def divide(a, b):
    return _binary(asarray(a), b, _div, "true")


true_divide = divide


def equal(a, b):
    return _binary(asarray(a), b, lambda x, y: x == y, bool_d)


def not_equal(a, b):
    return _binary(asarray(a), b, lambda x, y: x != y, bool_d)


def greater(a, b):
    return _binary(asarray(a), b, lambda x, y: x > y, bool_d)


def less(a, b):
    return _binary(asarray(a), b, lambda x, y: x < y, bool_d)


def logical_and(a, b):
    return _binary(asarray(a), b, lambda x, y: _b.bool(x) and _b.bool(y), bool_d)


def logical_or(a, b):
    return _binary(asarray(a), b, lambda x, y: _b.bool(x) or _b.bool(y), bool_d)


def logical_not(a):
    a = asarray(a)
    return ndarray._of([not v for v in a._data], a.shape, bool_d)


def where(condition, x=None, y=None):
    c = asarray(condition)
    if x is None and y is None:
        return nonzero(c)
    d = result_type(x, y)
    x, y = asarray(x), asarray(y)
    shape = _broadcast_shape(c.shape, x.shape, y.shape)
    cd, xd, yd = (_broadcast_to(v, shape)._data for v in (c, x, y))
    return ndarray._of(_cast_all([p if k else q for k, p, q in zip(cd, xd, yd)], d), shape, d)


def nonzero(a):
    a = asarray(a)
    hits = [idx for idx, v in zip(_indices(a.shape), a._data) if v]
    return tuple(ndarray._of([h[k] for h in hits], (len(hits),), int64_d) for k in range(a.ndim))


def array_equal(a, b):
    a, b = asarray(a), asarray(b)
    return a.shape == b.shape and a._data == b._data


def allclose(a, b, rtol=1e-05, atol=1e-08):
    a, b = asarray(a), asarray(b)
    shape = _broadcast_shape(a.shape, b.shape)
    return _b.all(_b.abs(x - y) <= atol + rtol * _b.abs(y) for x, y in zip(_broadcast_to(a, shape)._data, _broadcast_to(b, shape)._data))


def isclose(a, b, rtol=1e-05, atol=1e-08):
    return _binary(asarray(a), b, lambda x, y: _b.abs(x - y) <= atol + rtol * _b.abs(y), bool_d)


def isnan(a):
    return _unary(lambda v: v != v, out_float=False)(a) if not isinstance(a, ndarray) else ndarray._of([v != v for v in a._data], a.shape, bool_d)


def reshape(a, shape):
    return asarray(a).reshape(shape)


def transpose(a, axes=None):
    return asarray(a).transpose(*(axes or ()))


def squeeze(a, axis=None):
    a = asarray(a)
    if axis is None:
        shape = tuple(s for s in a.shape if s != 1)
    else:
        axes = {x % a.ndim for x in (axis if isinstance(axis, tuple) else (axis,))}
        for x in axes:
            if a.shape[x] != 1:
                raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
        shape = tuple(s for i, s in enumerate(a.shape) if i not in axes)
    return ndarray._sharing(a._store, shape, a.dtype)


def expand_dims(a, axis):
    a = asarray(a)
    axis = axis % (a.ndim + 1)
    return ndarray._sharing(a._store, a.shape[:axis] + (1,) + a.shape[axis:], a.dtype)


def concatenate(arrays, axis=0):
    arrays = [asarray(x) for x in arrays]
    if axis is None:
        arrays, axis = [x.flatten() for x in arrays], 0
    first = arrays[0]
    axis = axis % first.ndim
    d = first.dtype
    for x in arrays[1:]:
        d = _promote(d, x.dtype)
        if x.ndim != first.ndim or x.shape[:axis] + x.shape[axis + 1 :] != first.shape[:axis] + first.shape[axis + 1 :]:
            raise ValueError("all the input array dimensions except for the concatenation axis must match exactly")
    outer = _count(first.shape[:axis])
    data = []
    for o in range(outer):
        for x in arrays:
            chunk = _count(x.shape[axis:])
            data.extend(x._data[o * chunk : (o + 1) * chunk])
    shape = first.shape[:axis] + (_b.sum(x.shape[axis] for x in arrays),) + first.shape[axis + 1 :]
    return ndarray._of(_cast_all(data, d) if d.kind not in "O" else data, shape, d)


def repeat(a, repeats, axis=None):
    """Each element (each slice along `axis`; of the flattened array when
    None) `repeats` times, or `repeats[i]` times for element i."""
    a = asarray(a)
    if axis is None:
        a, axis = a.reshape(-1), 0
    axis = axis % a.ndim
    n = a.shape[axis]
    reps = [_b.int(repeats)] * n if isinstance(repeats, _b.int) else [_b.int(r) for r in asarray(repeats).tolist()]
    if len(reps) == 1 and n != 1:
        reps = reps * n
    if len(reps) != n:
        raise ValueError(f"operands could not be broadcast together with shape ({n},) ({len(reps)},)")
    if _b.any(r < 0 for r in reps):
        raise ValueError("repeats may not contain negative values.")
    inner = _count(a.shape[axis + 1 :])
    data = []
    for o in range(_count(a.shape[:axis])):
        base = o * n * inner
        for i, r in enumerate(reps):
            data.extend(a._data[base + i * inner : base + (i + 1) * inner] * r)
    return ndarray._of(data, a.shape[:axis] + (_b.sum(reps),) + a.shape[axis + 1 :], a.dtype)


def stack(arrays, axis=0):
    arrays = [asarray(x) for x in arrays]
    return concatenate([expand_dims(x, axis) for x in arrays], axis)


vstack = lambda arrays: concatenate([x if asarray(x).ndim > 1 else asarray(x).reshape(1, -1) for x in arrays], 0)  # noqa: E731
hstack = lambda arrays: concatenate(arrays, 0 if asarray(arrays[0]).ndim == 1 else 1)  # noqa: E731


def split(a, indices_or_sections, axis=0):
    a = asarray(a)
    n = a.shape[axis]
    if isinstance(indices_or_sections, _b.int):
        if n % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        step = n // indices_or_sections
        cuts = [i * step for i in range(1, indices_or_sections)]
    else:
        cuts = list(indices_or_sections)
    bounds = [0] + cuts + [n]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        key = tuple([slice(None)] * (axis % a.ndim) + [slice(lo, hi)])
        out.append(a[key])
    return out


def dot(a, b):
    a, b = asarray(a), asarray(b)
    if a.ndim == 1 and b.ndim == 1:
        return _b.sum(x * y for x, y in zip(a._data, b._data))
    return matmul(a, b)


def matmul(a, b):
    a, b = asarray(a), asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise NotImplementedError("numpy.matmul in Tern's Python runner takes two 2-D arrays with matching inner dimensions")
    n, k, m = a.shape[0], a.shape[1], b.shape[1]
    d = _promote(a.dtype, b.dtype)
    out = [_b.sum(a._data[i * k + t] * b._data[t * m + j] for t in range(k)) for i in range(n) for j in range(m)]
    return ndarray._of(_cast_all(out, d), (n, m), d)


def unique(a):
    a = asarray(a)
    values = sorted(set(a._data))
    return ndarray._of(values, (len(values),), a.dtype)


def count_nonzero(a):
    return _b.sum(1 for v in asarray(a)._data if v)


def prod_shape(shape):
    return _count(shape)


def can_cast(from_, to):
    return _promote(dtype(from_), dtype(to)) is dtype(to)


def issubdtype(a, b):
    a = dtype(a)
    groups = {"floating": "f", "integer": "iu", "signedinteger": "i", "unsignedinteger": "u", "bool_": "b", "number": "iuf"}
    if isinstance(b, _b.str) and b in groups:
        return a.kind in groups[b]
    if b in (floating, integer, signedinteger, unsignedinteger, number):
        return a.kind in b._kinds
    return a is dtype(b)


class _Group:
    def __init__(self, kinds):
        self._kinds = kinds


floating, integer, signedinteger, unsignedinteger, number = (_Group(k) for k in ("f", "iu", "i", "u", "iuf"))
generic = _Group("biufO")

nan = _math.nan
inf = _math.inf
pi = _math.pi
e = _math.e
newaxis = None


class finfo:
    def __init__(self, d):
        d = dtype(d)
        self.dtype = d
        self.bits = 8 * d.itemsize
        self.eps = {2: 0.0009765625, 4: 1.1920929e-07, 8: 2.220446049250313e-16}[d.itemsize]
        self.max = {2: 65504.0, 4: 3.4028234663852886e38, 8: _sys.float_info.max}[d.itemsize]
        self.min = -self.max
        self.tiny = {2: 6.104e-05, 4: 1.1754944e-38, 8: _sys.float_info.min}[d.itemsize]


class iinfo:
    def __init__(self, d):
        d = dtype(d)
        self.dtype = d
        self.bits = 8 * d.itemsize
        self.min = -(1 << (self.bits - 1)) if d.kind == "i" else 0
        self.max = (1 << (self.bits - 1)) - 1 if d.kind == "i" else (1 << self.bits) - 1


# --- random -------------------------------------------------------------------


class RandomState:
    """numpy's legacy seeded generator interface over Python's Mersenne Twister
    (the same seed gives the same sequence on every run; not numpy's numbers)."""

    def __init__(self, seed=None):
        self._r = _random.Random(seed)

    def seed(self, seed=None):
        self._r.seed(seed)

    def _shaped(self, size, f, d):
        if size is None:
            return f()
        shape = (size,) if isinstance(size, _b.int) else tuple(size)
        return ndarray._of(_cast_all([f() for _ in range(_count(shape))], d), shape, d)

    def rand(self, *shape):
        return self._shaped(shape or None, self._r.random, float64_d)

    def random(self, size=None):
        return self._shaped(size, self._r.random, float64_d)

    random_sample = random

    def randn(self, *shape):
        return self._shaped(shape or None, lambda: self._r.gauss(0.0, 1.0), float64_d)

    def standard_normal(self, size=None):
        return self._shaped(size, lambda: self._r.gauss(0.0, 1.0), float64_d)

    def normal(self, loc=0.0, scale=1.0, size=None):
        return self._shaped(size, lambda: self._r.gauss(loc, scale), float64_d)

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._shaped(size, lambda: self._r.uniform(low, high), float64_d)

    def randint(self, low, high=None, size=None, dtype=int64):  # noqa: A002
        if high is None:
            low, high = 0, low
        return self._shaped(size, lambda: self._r.randrange(low, high), globals()["dtype"](dtype))

    def choice(self, a, size=None, replace=True):
        pool = list(range(a)) if isinstance(a, _b.int) else list(asarray(a)._data)
        if size is None:
            return self._r.choice(pool)
        n = size if isinstance(size, _b.int) else _count(size)
        vals = [self._r.choice(pool) for _ in range(n)] if replace else self._r.sample(pool, n)
        return array(vals).reshape(size if not isinstance(size, _b.int) else (size,))

    def shuffle(self, x):
        if isinstance(x, ndarray):
            rows = [x[i].copy() if x.ndim > 1 else x[i] for i in range(len(x))]
            self._r.shuffle(rows)
            for i, r in enumerate(rows):
                x[i] = r
        else:
            self._r.shuffle(x)

    def permutation(self, x):
        a = arange(x) if isinstance(x, _b.int) else asarray(x).copy()
        self.shuffle(a)
        return a


class _RandomModule:
    RandomState = RandomState

    def __init__(self):
        self._state = RandomState()

    def default_rng(self, seed=None):
        g = RandomState(seed)
        g.integers = lambda low, high=None, size=None, dtype=int64: g.randint(low, high, size, dtype)  # noqa: A002
        return g

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._state, name)


random = _RandomModule()


# --- outside the subset ---------------------------------------------------------


def _caller():
    f = _sys._getframe(2)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    return f"{f.f_code.co_filename}, line {f.f_lineno}" if f is not None else "unknown location"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(
        f"numpy.{name} is not in the numpy subset of Tern's Python runner (called from {_caller()}); "
        "docs/plugins.md lists the subset (\"Triton Python models\")"
    )


# --- arrays held by the host ----------------------------------------------------
#
# Inside the runner (`_host_arrays()` is called by its app), numeric tensors
# of `_HOST_MIN` elements or more reach `as_numpy()` as `ops.array`s held by
# the host, and the operations the host's kernels compute exactly as numpy
# does keep them there: float arithmetic (+ - * / between float32/float64
# operands, numpy's broadcasting; the kernels compute in float64 and round
# once, which gives the correctly rounded float32 result as numpy's float32
# loops do), casts from bool/integers of up to 32 bits and floats to
# float32/float64, transposes, reshapes, and argmax along an axis of
# integers of up to 32 bits. Everything else reads the values into a Python
# list first (once per array) and goes on as below. The host counts its
# arrays against the model's memory cap; if it refuses one, the list path
# runs instead.

_OPS = None
_ERR = ()
_HOST_DT = {}
_HOST_MIN = 256
_HOST_BINARY = {}


def _host_arrays(enabled=True):
    """Turns host-held arrays on (the runner does, at start) or off."""
    global _OPS, _ERR, _HOST_DT, _HOST_BINARY
    if not enabled:
        _OPS = None
        return
    import tern_plugin
    from componentize_py_types import Err
    from wit_world.imports import ops

    tern_plugin._NDARRAY = ndarray  # pb_utils.Tensor(name, array) knows the type at once

    # The SDK's tables: numpy name -> Triton name -> WIT data type (not BYTES or FP16).
    _HOST_DT = {n: tern_plugin._DTYPES[t][0] for n, t in tern_plugin._NUMPY_TO_TRITON.items() if t not in ("BYTES", "FP16")}
    _HOST_BINARY = {_op.add: ops.BinaryOp.ADD, _op.sub: ops.BinaryOp.SUB, _op.mul: ops.BinaryOp.MUL, _div: ops.BinaryOp.DIV}
    _ERR, _OPS = Err, ops


def _fetch(held, d):
    return frombuffer(_b.bytes(held.data()), d)._data


def _host_call(make, shape, d):
    """An array over the host array `make()` returns, or None if the host refused it."""
    try:
        h = make()
    except _ERR:
        return None
    return ndarray._sharing(_Store(None, h, tuple(shape)), shape, d)


def _held_handle(a):
    """The host array holding `a`, of `a`'s shape."""
    s = a._store
    return s.held if s.held_shape == a._shape else s.held.reshape(list(a._shape))


_MIRROR_MAX = 512  # bytes


def _host_handle(a, d):
    """`a` (an array or a scalar of dtype `d`'s kind) as a host array."""
    if isinstance(a, ndarray):
        s = a._store
        if s.held is not None:
            return _held_handle(a)
        raw = a.tobytes()
        m = s.mirror
        if m is not None and m[0] == raw and m[1] == a._shape and m[2] is a._dtype:
            return m[3]
        h = _OPS.Array.from_data(_HOST_DT[a._dtype.name], list(a._shape), raw)
        if len(raw) <= _MIRROR_MAX:
            s.mirror = (raw, a._shape, a._dtype, h)
        return h
    return _OPS.Array.from_data(_HOST_DT[d.name], [], _to_bytes([_caster(d)(a)], d))


def _host_casts(src, dst):
    return dst.kind == "f" and dst.itemsize >= 4 and (src.kind == "f" and src.itemsize >= 4 or src.kind in "biu" and src.itemsize <= 4)


def _host_binary(a, b, f):
    """`f(a, b)` by the host's kernel (one side is held there) when numpy
    would compute in float32 or float64 from float operands; else None."""
    x, y = isinstance(a, ndarray), isinstance(b, ndarray)
    ka = a._dtype if x else getattr(a, "dtype", None)
    kb = b._dtype if y else getattr(b, "dtype", None)
    for v, k in ((a, ka), (b, kb)):
        if k is None:
            if not isinstance(v, (_b.int, _b.float)):
                return None
        elif not isinstance(k, dtype) or k.kind != "f" or k.itemsize < 4:
            return None
    # result_type() for these operands: two float types promote; a Python
    # number takes the other side's type (numpy 2's weak scalars).
    d = (ka if ka is kb else _promote(ka, kb)) if ka is not None and kb is not None else (ka or kb)
    op = _HOST_BINARY[f]
    if x and not y and a._dtype is d:
        # array op scalar: the host's scalar kernel, no array for the scalar
        # (the same arithmetic: the scalar is first rounded to `d`).
        v = _b.float(_caster(d)(b))
        return _host_call(lambda: _host_handle(a, d).scalar(op, v), a._shape, d)
    if y and not x and b._dtype is d and f in (_op.add, _op.mul):
        v = _b.float(_caster(d)(a))
        return _host_call(lambda: _host_handle(b, d).scalar(op, v), b._shape, d)
    shape = _broadcast_shape(a._shape if x else (), b._shape if y else ())
    return _host_call(lambda: _host_handle(a, d).binary(op, _host_handle(b, d)), shape, d)
