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
