"""The Python runner's numpy subset (guest-sdk/python/runner/numpy.py), run
by this CPython beside real numpy (numpy 2 rules): the element-wise,
broadcasting, transposing, casting and reducing paths give numpy's values,
dtypes and shapes on random arrays. (Inside the sandbox the same module runs
on CPython compiled to WebAssembly; tests/test_python_models.py and
tests/test_vs_triton.py drive it there.)"""

import importlib.util
import itertools
import math
import os

import numpy as np
import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("runner_numpy", os.path.join(ROOT, "guest-sdk", "python", "runner", "numpy.py"))
tnp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tnp)

rng = np.random.default_rng(7)
DTYPES = ["float32", "float64", "int8", "uint8", "int32", "int64", "bool"]


def ours(a):
    return tnp.array(a.tolist(), dtype=str(a.dtype)).reshape(a.shape)


def same(got, want):
    assert str(got.dtype) == str(want.dtype), (got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    np.testing.assert_array_equal(np.array(got.tolist(), dtype=want.dtype), want)


def sample(shape, dtype):
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("float"):
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("shape,perm", [((2, 3), (1, 0)), ((1, 4, 5, 3), (0, 3, 1, 2)), ((2, 3, 4), (2, 0, 1)),
                                        ((3, 1, 2), None), ((0, 3), (1, 0)), ((), None)])
def test_transpose(shape, perm):
    a = sample(shape, "int32")
    same(ours(a).transpose(perm) if perm else ours(a).transpose(), a.transpose(perm))


@pytest.mark.parametrize("left,right", [((2, 3), (3,)), ((1, 3, 4, 4), (3, 1, 1)), ((4, 1), (1, 5)), ((2, 3), ()),
                                        ((5,), (1,)), ((2, 1, 3), (4, 1))])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "lt", "eq", "maximum"])
def test_broadcasting_arithmetic_and_comparison(left, right, op):
    a, b = sample(left, "float32"), sample(right, "float32")
    f = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
         "lt": lambda x, y: x < y, "eq": lambda x, y: x == y}.get(op)
    if f is None:
        same(tnp.maximum(ours(a), ours(b)), np.maximum(a, b))
    else:
        same(f(ours(a), ours(b)), f(a, b))
        same(f(ours(b), ours(a)), f(b, a))


@pytest.mark.parametrize("dtype", DTYPES)
def test_element_wise_with_python_scalars_wraps_and_promotes_as_numpy(dtype):
    a = sample((3, 4), dtype)
    if dtype == "bool":
        same(ours(a) & True, a & True)
        same(ours(a) + 1, a + 1)
        return
    for s in (3, 2.5):
        same(ours(a) * s, a * s)
        same(ours(a) - s, a - s)
        same(s - ours(a), s - a)
    same(ours(a) / 7, a / 7)
    same(ours(a) + np.array(5, dtype=dtype).item(), a + np.array(5, dtype=dtype).item())


def test_division_by_zero_gives_numpy_s_infinities_and_nans():
    a = np.array([1.0, -2.0, 0.0, 3.0], dtype=np.float32)
    b = np.array([0.0, 0.0, 0.0, 2.0], dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        same(ours(a) / ours(b), a / b)
        same(ours(np.array([1, 0, -3])) / 0, np.array([1, 0, -3]) / 0)


@pytest.mark.parametrize("src,dst", list(itertools.product(["float64", "int64", "uint8", "bool"],
                                                           ["float32", "float64", "int8", "uint8", "int32", "int64"])))
def test_astype_converts_wraps_and_truncates(src, dst):
    a = sample((4, 5), src)
    if src == "float64":
        a = a.clip(-100, 100)  # float -> int beyond the target's range is undefined in numpy
    same(ours(a).astype(dst), a.astype(dst))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float32_rounds_each_result_and_overflows_to_inf():
    a = np.array([1e38, 3e38, 1.0000001, -1e-45], dtype=np.float32)
    same(ours(a) * 10, a * np.float32(10))
    same(ours(np.array([1e300])).astype("float32"), np.array([1e300]).astype("float32"))


@pytest.mark.parametrize("axis", [None, 0, 1, 2])
def test_reductions_and_argmax_along_an_axis(axis):
    a = sample((2, 5, 3), "float32")
    for name in ("sum", "max", "min", "argmax", "argmin"):
        got, want = getattr(tnp, name)(ours(a), axis=axis), getattr(np, name)(a, axis=axis)
        if axis is None:
            assert math.isclose(float(got), float(want), rel_tol=1e-6), (name, got, want)
        elif name == "sum":
            np.testing.assert_allclose(np.array(got.tolist()), want, rtol=1e-5)
        else:
            same(got, want)


def test_argmax_points_at_the_first_nan_as_numpy():
    a = np.array([[1.0, np.nan, 3.0, np.nan], [4.0, 2.0, 9.0, 1.0]], dtype=np.float32)
    same(tnp.argmax(ours(a), axis=1), np.argmax(a, axis=1))
    assert int(tnp.argmax(ours(a))) == int(np.argmax(a))


def test_the_preprocessing_idiom_is_bit_exact():
    images = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
    want = ((images.astype(np.float32).transpose(0, 3, 1, 2) / np.float32(255.0) - mean) / std).astype(np.float32)
    t_mean = tnp.array(mean.reshape(-1).tolist(), dtype=tnp.float32).reshape(3, 1, 1)
    t_std = tnp.array(std.reshape(-1).tolist(), dtype=tnp.float32).reshape(3, 1, 1)
    got = ((ours(images).astype(tnp.float32).transpose(0, 3, 1, 2) / tnp.float32(255.0) - t_mean) / t_std).astype(tnp.float32)
    same(got, want)
