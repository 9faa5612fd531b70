"""The device smoke test: the server as a device runs it. Its plugins are
precompiled on the build machine with `tern plugin compile` (for
TERN_SMOKE_TARGET, default this machine) and must all load from that cache;
the server runs in an address space too small for the pooling allocator (as on
Jetson kernels with 39-bit addresses), so the engine falls back to on-demand
allocation. An ONNX model, a Rust plugin, a Python plugin, a Triton Python
model (`backend: "python"`: the Python runner, precompiled for the target
with the plugins), an ensemble and a BLS plugin answer over HTTP and gRPC.

`make e2e` runs it on this machine (address space capped with prlimit);
`make smoke-aarch64` runs the aarch64 binary under qemu-user with a 39-bit
guest address space (TERN_BIN is then a qemu wrapper, TERN_HOST_BIN the
native binary that precompiles)."""

import os
import platform
import re
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, Tern, tern_bin
from test_lang_plugins import TEXTS, check_prep, prep_inputs
from test_plugins import add_sub_inputs, bls_inputs, plugins_dir

import gen_models

# 2^39 bytes: the user address space of a 39-bit-VA kernel.
SMALL_ADDRESS_SPACE = 1 << 39
PLUGINS = ["add_sub", "bls_caller", "bls_caller2", "misbehave", "prep_python", "simple_identity"]


def target():
    return os.environ.get("TERN_SMOKE_TARGET", f"{platform.machine()}-unknown-linux-gnu")


def ort_libraries():
    """The ONNX Runtime libraries the device serves with, one server each:
    TERN_SMOKE_ORT_LIBS (comma-separated; `make smoke-aarch64` gives the
    shipped version and the oldest Tern runs with), else ORT_DYLIB_PATH's."""
    libs = os.environ.get("TERN_SMOKE_ORT_LIBS")
    return libs.split(",") if libs else [os.environ.get("ORT_DYLIB_PATH")]


@pytest.fixture(scope="module")
def precompiled(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("device") / "models")
    gen_models.plugin_repo(root, plugins_dir())
    os.makedirs(f"{root}/prep_python/1")
    shutil.copy(os.path.join(ROOT, "model_repository", "prep_python", "config.pbtxt"), f"{root}/prep_python")
    shutil.copy(os.path.join(plugins_dir(), "prep_python.wasm"), f"{root}/prep_python/1/model.wasm")
    shutil.copytree(os.path.join(ROOT, "tests", "python_models", "add_sub"), f"{root}/py_add_sub")
    with open(f"{root}/py_add_sub/config.pbtxt") as f:
        config = f.read().replace('name: "add_sub"', 'name: "py_add_sub"')
    with open(f"{root}/py_add_sub/config.pbtxt", "w") as f:
        f.write(config)
    cache = str(tmp_path_factory.mktemp("cwasm"))
    host = os.environ.get("TERN_HOST_BIN", tern_bin())
    out = subprocess.run(
        [host, "plugin", "compile", root, f"--cache-dir={cache}", f"--target={target()}", "--on-demand",
         f"--python-runner={python_runner()}"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert f"{len(PLUGINS)} plugin(s) and the Python runner compiled for {target()}" in out.stderr, out.stderr
    return root, cache


def python_runner():
    path = os.path.join(plugins_dir(), "python-runner.wasm")
    if not os.path.isfile(path):
        pytest.fail(f"the Python runner is not at {path}: run `make python-runner` (make e2e does)")
    return path


@pytest.fixture(scope="module", params=ort_libraries(), ids=lambda lib: os.path.basename(os.path.dirname(lib or "")))
def device(precompiled, request):
    root, cache = precompiled
    # Under qemu the wrapper reserves the small guest address space itself.
    wrapper = [] if "TERN_SMOKE_TARGET" in os.environ else ["prlimit", f"--as={SMALL_ADDRESS_SPACE}"]
    t = Tern([f"--model-repository={root}", f"--wasm-cache-dir={cache}", f"--python-runner={python_runner()}"], wrapper=wrapper,
             env={"ORT_DYLIB_PATH": request.param})
    t.ort_library = request.param
    yield t
    t.stop()


def test_the_pool_falls_back_and_every_plugin_comes_from_the_precompiled_cache(device):
    log = device.log()
    assert "pooling allocator unavailable" in log and "pooling=false" in log, log
    for m in PLUGINS + ["py_add_sub"]:
        # From the cache, or sharing the code of a model with the same component that was.
        assert f"(Cache) model={m} " in log or f"(Shared) model={m} " in log, (m, log)
    assert "(Compiled)" not in log and "recompiling" not in log, log
    # The ONNX Runtime asked for, by its own version.
    assert re.search(r"ONNX Runtime 1\.\d+\.\d+ loaded from '" + re.escape(os.path.realpath(device.ort_library)), log), log


@pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_onnx_rust_python_ensemble_and_bls(device, mod):
    c = mod.InferenceServerClient(device.url if mod is httpclient else device.grpc_url)
    inputs, a, b = bls_inputs("simple", mod)
    for model in ("simple", "simple_ens"):
        r = c.infer(model, inputs[1:])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.full((2, 4), 0.5, dtype=np.float32)
    np.testing.assert_array_equal(c.infer("add_sub", add_sub_inputs(x, y, mod)).as_numpy("OUTPUT0"), x + y)
    a, b = np.array([1, 2, 3, 4], dtype=np.float32), np.array([0.5, -1, 8, 2], dtype=np.float32)
    ins = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        ins.append(mod.InferInput(name, [4], "FP32"))
        ins[-1].set_data_from_numpy(value)
    r = c.infer("py_add_sub", ins)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    x = np.random.default_rng(3).normal(size=(len(TEXTS), 4)).astype(np.float32)
    check_prep(c.infer("prep_python", prep_inputs(mod, x, x, TEXTS)), x, x, TEXTS)
    for route in ("simple", "bls_ens,simple_ens"):
        inputs, a, b = bls_inputs(route, mod)
        r = c.infer("bls_caller", inputs)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
