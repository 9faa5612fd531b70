"""Build flavours: `tern --version` says what a binary holds, and the build
without default features (WebAssembly plugins + identity only, TERN_MINIMAL_BIN,
built by `make flavours`) serves plugins, ensembles and BLS while refusing ONNX
models with a clear reason."""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import Tern, tern_bin
from test_plugins import add_sub_inputs, bls_inputs, plugins_dir

import gen_models


def minimal_bin():
    path = os.environ.get("TERN_MINIMAL_BIN")
    if not path:
        pytest.fail("TERN_MINIMAL_BIN is not set: `make flavours` builds the no-default-features binary")
    if not os.path.exists(path):
        pytest.fail(f"TERN_MINIMAL_BIN={path} does not exist; run `make flavours`")
    return path


def version(binary, env=None):
    full = dict(os.environ)
    full.update(env or {})
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, env=full, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_version_reports_the_build_and_the_onnx_runtime_it_loads():
    text = version(tern_bin())
    first = text.splitlines()[0]
    assert first.startswith("tern ") and "features: onnx, cuda" in first, text
    assert "-linux-" in first, text
    lib = os.environ["ORT_DYLIB_PATH"]
    assert re.search(rf"\nonnxruntime: 1\.\d+\.\d+ at {re.escape(os.path.realpath(lib))} \(ORT Build Info", text), text
    missing = version(tern_bin(), {"ORT_DYLIB_PATH": "/nonexistent/libonnxruntime.so"})
    assert "onnxruntime: not loaded: the ONNX Runtime library could not be loaded" in missing, missing
    assert "\ncuda: " in text


@pytest.fixture(scope="module")
def minimal(tmp_path_factory):
    binary = minimal_bin()
    root = str(tmp_path_factory.mktemp("flavour") / "models")
    gen_models.plugin_repo(root, plugins_dir())
    # A BLS target this build can serve: output i is a copy of input i.
    os.makedirs(f"{root}/pair/1")
    ints = lambda n: ", ".join(f'{{ name: "{n}{i}" data_type: TYPE_INT32 dims: [ 1, 16 ] }}' for i in (0, 1))
    gen_models.write(
        f"{root}/pair/config.pbtxt",
        f'name: "pair" backend: "identity" input [ {ints("INPUT")} ] output [ {ints("OUTPUT")} ]',
    )
    t = Tern([f"--model-repository={root}", "--exit-on-error=false"], binary=binary)
    yield t
    t.stop()


def test_minimal_build_says_what_it_lacks():
    text = version(minimal_bin())
    assert "features: none" in text.splitlines()[0], text
    assert "onnxruntime: not in this build (built without the 'onnx' feature)" in text, text
    assert "cuda: none (this build has no CUDA support" in text, text


def test_minimal_build_serves_plugins_ensembles_and_bls(minimal):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, dtype=np.float32)
    h = httpclient.InferenceServerClient(minimal.url)
    g = grpcclient.InferenceServerClient(minimal.grpc_url)
    for c, mod in ((h, httpclient), (g, grpcclient)):
        r = c.infer("add_sub", add_sub_inputs(a, b, mod))
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        # BLS through a second plugin and through an ensemble whose step is a BLS plugin.
        for route in ("bls_caller2,pair", "bls_ens,pair"):
            inputs, x, y = bls_inputs(route, mod)
            r = c.infer("bls_caller", inputs)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), y)
        with pytest.raises(InferenceServerException, match="simple"):
            c.infer("bls_caller", bls_inputs("simple", mod)[0])


def test_minimal_build_refuses_onnx_models_with_the_reason(minimal):
    h = httpclient.InferenceServerClient(minimal.url)
    index = {m["name"]: m for m in h.get_model_repository_index()}
    reason = index["simple"]["reason"]
    assert index["simple"]["state"] == "UNAVAILABLE"
    assert "this build has no ONNX Runtime (built without the 'onnx' feature)" in reason, reason
    assert index["simple_ens"]["state"] == "UNAVAILABLE"
    assert not h.is_model_ready("simple")
    with pytest.raises(InferenceServerException, match="simple"):
        h.infer("simple", bls_inputs("x")[0][1:])


def test_help_goes_to_stdout_and_exits_0():
    """`tern --help` and `--version` are answers, not errors: stdout, exit 0;
    a bad flag is an error: stderr, exit 2."""
    for flag in ("--help", "-h"):
        r = subprocess.run([tern_bin(), flag], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "--model-repository" in r.stdout and r.stderr == "", (flag, r.returncode, r.stderr[:200])
        # Grouped as tritonserver's help is, each flag under its section.
        headings = [line[:-1] for line in r.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
        assert headings[:1] == ["Options"] and {"Model repository", "Server", "HTTP", "GRPC", "Logging", "Metrics",
                                                 "Memory and devices", "Backends and plugins"} <= set(headings), headings
        http = r.stdout.split("\nHTTP:\n", 1)[1].split("\n\n", 1)[0]
        assert "--http-port" in http and "--grpc-port" not in http, http
    r = subprocess.run([tern_bin(), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("tern ")
    r = subprocess.run([tern_bin(), "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--no-such-flag" in r.stderr and r.stdout == ""


def test_minimal_build_precompiles_for_its_own_architecture_only(tmp_path):
    """The build without default features has no `cross-compile`: Cranelift's
    code generator for this machine only. Precompiling for the other
    architecture is refused by name; for this one it works, as in the full build."""
    root = str(tmp_path / "models")
    os.makedirs(f"{root}/add_sub/1")
    shutil.copy(os.path.join(plugins_dir(), "add_sub.wasm"), f"{root}/add_sub/1/model.wasm")
    shutil.copy(os.path.join(gen_models.ROOT, "model_repository", "add_sub", "config.pbtxt"), f"{root}/add_sub/")
    arch = os.uname().machine
    other = "aarch64" if arch == "x86_64" else "x86_64"
    compile_for = lambda binary, a: subprocess.run(
        [binary, "plugin", "compile", root, f"--cache-dir={tmp_path / a / os.path.basename(binary)}",
         f"--target={a}-unknown-linux-gnu", "--on-demand"],
        capture_output=True, text=True, timeout=600)
    r = compile_for(minimal_bin(), other)
    assert r.returncode != 0, r.stdout
    assert f"this tern generates code for {arch} only (built without the `cross-compile` feature" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / other / "tern") or not os.listdir(tmp_path / other / "tern")
    r = compile_for(minimal_bin(), arch)
    assert r.returncode == 0 and f"compiled for {arch}-unknown-linux-gnu" in r.stderr, r.stderr
    assert "cross-compile" in version(tern_bin()).splitlines()[0]
