"""The host kernels (`tern:plugin/ops`) from every guest SDK: the same
classifier post-processing (softmax + top-3, outputs made with
`set-output`) written in Python with `tern_ops`' numpy-like array, in
JavaScript through `ops` of tern.js and in C through the generated
bindings, checked against numpy over HTTP and gRPC; a kernel's error
reaches the client with its code and message. The Rust SDK's kernels run
in tests/test_detection.py (`yolo_post`)."""

import os
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern

WASM_DIR = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
LANGS = ["python", "js", "c"]
CONFIG = """name: "{name}"
backend: "wasm"
max_batch_size: 8
input [ {{ name: "LOGITS" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "PROBS" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "TOP" data_type: TYPE_INT64 dims: [ 3 ] }}
]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ops")
    for lang in LANGS:
        name = f"topk_{lang}"
        src = os.path.join(WASM_DIR, name + ".wasm")
        if not os.path.exists(src):
            pytest.fail(f"{name}.wasm not found in {WASM_DIR}; run `make lang-plugins`")
        os.makedirs(root / name / "1")
        shutil.copy(src, root / name / "1" / "model.wasm")
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    t = Tern([f"--model-repository={root}"])
    yield t
    t.stop()


def reference(logits):
    e = np.exp(logits - logits.max())
    p = e / e.sum()
    return p, np.argsort(-p, kind="stable")[:3]


@pytest.mark.parametrize("lang", LANGS)
def test_softmax_top_k_from_every_sdk(server, lang):
    rng = np.random.default_rng(3)
    for mod, client in (
        (httpclient, httpclient.InferenceServerClient(server.url)),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ):
        for n in (3, 10, 1000):
            logits = rng.normal(0, 3, size=(1, n)).astype(np.float32)
            inp = mod.InferInput("LOGITS", [1, n], "FP32")
            inp.set_data_from_numpy(logits)
            r = client.infer(f"topk_{lang}", [inp])
            probs, top = reference(logits[0].astype(np.float64))
            np.testing.assert_allclose(r.as_numpy("PROBS")[0], probs, rtol=1e-5, atol=1e-7)
            assert r.as_numpy("TOP").dtype == np.int64
            assert r.as_numpy("TOP")[0].tolist() == top.tolist()


@pytest.mark.parametrize("lang", LANGS)
def test_a_kernel_error_reaches_the_client(server, lang):
    c = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("LOGITS", [1, 2], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 2), np.float32))
    with pytest.raises(InferenceServerException) as e:
        c.infer(f"topk_{lang}", [inp])
    assert "k = 3 is larger than axis 1 (2 elements)" in str(e.value)
    assert "400" in str(e.value) or "Bad Request" in str(e.value) or e.value.status() in ("400", 400)


def numpy_results(x):
    """What `plugins/ops_python` computes, with numpy."""
    y = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    parts = np.split(x[:, :4], 2, axis=1)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return {
        "shape": list(x.shape),
        "dtype": "FP32",
        "T": x.T.tolist(),
        "row1": x[1].tolist(),
        "col_last": x[:, -1].tolist(),
        "every_other": x[..., ::2].tolist(),
        "item": float(x[0, 1]),
        "broadcast": (x[:, :4] * y + 1).tolist(),
        "rsub": (10 - x).tolist(),
        "rdiv": (1 / x.clip(1, 5)).tolist(),
        "pow": (x**2).tolist(),
        "neg_abs": np.abs(-x).tolist(),
        "sum0": x.sum(axis=0).tolist(),
        "mean1": x.mean(axis=1).tolist(),
        "max": float(x.max()),
        "min1": x.min(axis=1).tolist(),
        "argmax1": x.argmax(axis=1).tolist(),
        "argmax": int(x.argmax()),
        "softmax": (e / e.sum(axis=-1, keepdims=True)).tolist(),
        "sigmoid": (1 / (1 + np.exp(-x.astype(np.float64)))).tolist(),
        "exp": np.exp(x.clip(-5, 5)).tolist(),
        "maximum": np.maximum(x, 0.5).tolist(),
        "round": np.round(x * 3).tolist(),
        "uint8": (x * 10).clip(0, 255).astype(np.uint8).tolist(),
        "split": [p.tolist() for p in parts],
        "concat": np.concatenate(parts[::-1], axis=1).tolist(),
        "expand": [1, *x.shape],
        "squeeze": list(x.shape),
        "reshape": x.reshape(-1).tolist(),
        "int_div": (np.array([[3, 4]]) / 2).tolist(),
        "frombuffer": np.array([[1, 2], [3, 250]], np.float32).tolist(),
        "zeros": np.zeros((2, 3), np.int64).tolist(),
    }


@pytest.fixture(scope="module")
def surface_server(tmp_path_factory):
    src = os.path.join(WASM_DIR, "ops_python.wasm")
    if not os.path.exists(src):
        pytest.fail(f"ops_python.wasm not found in {WASM_DIR}; run `make lang-plugins`")
    root = tmp_path_factory.mktemp("ops_surface")
    os.makedirs(root / "ops_python" / "1")
    shutil.copy(src, root / "ops_python" / "1" / "model.wasm")
    (root / "ops_python" / "config.pbtxt").write_text(
        """name: "ops_python"
backend: "wasm"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
    )
    t = Tern([f"--model-repository={root}"])
    yield t
    t.stop()


def test_python_array_surface_matches_numpy(surface_server):
    import json

    rng = np.random.default_rng(11)
    c = httpclient.InferenceServerClient(surface_server.url)
    for shape in ((2, 4), (3, 6)):
        x = rng.normal(1, 2, size=shape).astype(np.float32)
        inp = httpclient.InferInput("X", list(shape), "FP32")
        inp.set_data_from_numpy(x)
        got = json.loads(c.infer("ops_python", [inp]).as_numpy("RESULT")[0])
        want = numpy_results(x)
        assert got.keys() == want.keys()
        for k in want:
            if isinstance(want[k], (str, int)) or k in ("shape", "expand", "squeeze", "argmax1", "uint8", "zeros"):
                assert got[k] == want[k], k
            else:
                np.testing.assert_allclose(np.array(got[k], dtype=np.float64), np.array(want[k], dtype=np.float64), rtol=1e-5, atol=1e-5, err_msg=k)


def test_a_broadcast_past_the_memory_cap_is_refused_before_it_is_computed(surface_server):
    """[n, 1] * [1, n] with n = 100000 would need 80 GB of working values."""
    c = httpclient.InferenceServerClient(surface_server.url)
    for n, ok in ((100_000, False), (100, True)):
        inp = httpclient.InferInput("X", [1, n], "FP32")
        inp.set_data_from_numpy(np.ones((1, n), np.float32))
        if ok:
            import json

            assert json.loads(c.infer("ops_python", [inp]).as_numpy("RESULT")[0]) == {"outer": [n, n]}
        else:
            with pytest.raises(InferenceServerException) as e:
                c.infer("ops_python", [inp])
            assert "broadcast result of shape [100000, 100000] needs 80000000000 bytes" in str(e.value), str(e.value)
            assert "memory cap" in str(e.value)
