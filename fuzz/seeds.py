"""Writes the seed corpora of the fuzz targets into fuzz/seeds/<target>/
from the tests' requests and configs (fuzz/README.md). Run once with the
test venv (it has tritonclient, numpy and Pillow):

    .venv/bin/python fuzz/seeds.py

`make fuzz-long` then grows fuzz/corpus/<target> from them, and
`-merge=1` keeps the corpus small. Seeds go through the same framing as
the targets read (a mode byte, a length prefix: see each target's doc).
"""

import glob
import hashlib
import io
import json
import os
import re
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "seeds")


def put(target, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


# The configs of tern_fuzz::CONFIGS, by the input names a request uses.
def config_for(names):
    if "INPUT1" in names:
        return 1
    if "text_input" in names or "max_tokens" in names:
        return 2
    if names & {"X", "B", "H", "D"}:
        return 3
    return 0


def rust_literals(paths, must):
    """Raw-string literals (r#"..."#, br#"..."#) of the Rust tests holding `must`."""
    for p in paths:
        text = open(p, encoding="utf-8").read()
        for m in re.finditer(r'b?r#"(.*?)"#', text, re.S):
            if must in m.group(1):
                yield m.group(1)


def http_seeds():
    # The Rust codec tests' bodies.
    for body in rust_literals(glob.glob(f"{ROOT}/host/src/frontend/http/*.rs") + glob.glob(f"{ROOT}/host/tests/*.rs"), '"inputs"'):
        names = set(re.findall(r'"name"\s*:\s*"([^"]*)"', body))
        put("http_infer", bytes([config_for(names)]) + body.encode())
    # tritonclient's bodies for the end-to-end tests' requests.
    import tritonclient.http as httpclient

    def add(inputs, outputs=None, **kw):
        body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kw)
        names = {i.name() for i in inputs}
        if json_size is None:
            put("http_infer", bytes([config_for(names)]) + body)
        else:
            put("http_infer", bytes([config_for(names) | 8]) + struct.pack("<H", json_size) + body)

    def inp(name, arr, dt, binary=True):
        i = httpclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr, binary_data=binary)
        return i

    i32 = np.arange(16, dtype=np.int32)
    for binary in (True, False):
        add([inp("INPUT0", i32, "INT32", binary), inp("INPUT1", i32, "INT32", binary)],
            [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary), httpclient.InferRequestedOutput("OUTPUT1", class_count=3)],
            request_id="7", sequence_id=3, sequence_start=True, priority=1, timeout=100, parameters={"custom": "x", "ratio": 0.5})
        add([inp("INPUT0", np.array([[1.5, -2.0, float("nan"), float("inf")]], dtype=np.float32), "FP32", binary)])
        add([inp("text_input", np.array([["héllo"]], dtype=np.object_), "BYTES", binary), inp("max_tokens", np.array([[4]], dtype=np.int64), "INT64", binary)])
        add([inp("X", np.zeros((1, 2, 3), dtype=np.uint8), "UINT8", binary), inp("B", np.array([True, False]), "BOOL", binary), inp("D", np.array([1e300, -0.0]), "FP64", binary)])
    add([inp("H", np.array([1, 2], dtype=np.float16), "FP16")])
    # Shared memory (the fuzz region is "region", 256 bytes).
    i = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_shared_memory("region", 16, 0)
    o = httpclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("region", 16, 32)
    add([i], [o])
    # The raw-binary form (header length 0) of a one-input model.
    put("http_infer", bytes([0 | 4]) + np.arange(4, dtype=np.float32).tobytes())
    put("http_infer", bytes([2 | 4]) + b"raw text")


def generate_seeds():
    bodies = [
        (0, {"INPUT0": [1.0, 2.5], "id": "g1", "parameters": {"temperature": 0.7}}),
        (0, {"INPUT0": 3}),
        (2, {"text_input": "What is Triton?", "max_tokens": 16, "parameters": {"stream": False, "seed": 1}}),
        (2, {"text_input": ["a", "b"], "bad": [1, 2]}),
        (1, {"INPUT0": list(range(16)), "INPUT1": list(range(16))}),
        (3, {"X": [1, 2, 3, 4], "B": [True, False], "D": [0.5]}),
        (0, {"input_ids": [1]}),
        (0, {"COUNT": 3}),
    ]
    for cfg, body in bodies:
        put("http_generate", bytes([cfg]) + json.dumps(body).encode())


def grpc_seeds():
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import _utils

    def add(inputs, outputs=None, **kw):
        req = _utils._get_inference_request(
            model_name="m", inputs=inputs, model_version=kw.pop("model_version", ""), request_id=kw.pop("request_id", ""),
            outputs=outputs, sequence_id=kw.pop("sequence_id", 0), sequence_start=False, sequence_end=False,
            priority=0, timeout=None, parameters=kw.pop("parameters", None))
        names = {i.name() for i in inputs}
        put("grpc_infer", bytes([config_for(names)]) + req.SerializeToString())

    def inp(name, arr, dt):
        i = grpcclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        return i

    i32 = np.arange(16, dtype=np.int32)
    add([inp("INPUT0", i32, "INT32"), inp("INPUT1", i32, "INT32")],
        [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1", class_count=2)],
        request_id="1", model_version="1", sequence_id=5, parameters={"custom": "x", "n": 2, "f": 0.5, "b": True})
    add([inp("INPUT0", np.array([[1.0, float("nan")]], dtype=np.float32), "FP32")])
    add([inp("text_input", np.array([[b"\xff\x00bytes"]], dtype=np.object_), "BYTES")])
    i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_shared_memory("region", 16, 0)
    o = grpcclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("region", 16, 32)
    add([i], [o])
    # Typed contents instead of raw_input_contents.
    from tritonclient.grpc import service_pb2
    req = service_pb2.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    t.contents.fp32_contents.extend([1.0, 2.0])
    put("grpc_infer", bytes([0]) + req.SerializeToString())
    req = service_pb2.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    t.contents.bytes_contents.append(b"abc")
    put("grpc_infer", bytes([2]) + req.SerializeToString())


def config_files():
    paths = set()
    for pattern in ("model_repository/*/config.pbtxt", "tests/**/config.pbtxt", "crates/**/*.pbtxt", "host/**/*.pbtxt", "plugins/**/config.pbtxt"):
        paths.update(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    texts = [open(p, encoding="utf-8").read() for p in sorted(paths)]
    # Configs written inside the Rust tests (pbtxt literals).
    rust = glob.glob(f"{ROOT}/crates/core/src/**/*.rs", recursive=True) + glob.glob(f"{ROOT}/host/src/**/*.rs", recursive=True)
    texts += [t for t in rust_literals(rust, "max_batch_size") if "{" in t and '"inputs"' not in t]
    return texts


WARM = '''model_warmup [
  { name: "zeros" batch_size: 2 inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } } },
  { name: "random" batch_size: 1 count: 2 inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] random_data: true } } },
  { name: "file" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] input_data_file: "in.bin" } } }
]'''
IDENTITY = 'name: "m" backend: "identity" max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ] output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'


def config_seeds():
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    texts = config_files() + [IDENTITY + WARM]
    for t in texts:
        put("config_pbtxt", t.encode())
        try:
            msg = text_format.Parse(t, model_config_pb2.ModelConfig())
        except Exception:
            continue
        put("config_json", json_format.MessageToJson(msg, preserving_proto_field_name=True).encode())
        if "model_warmup" in t:
            put("warmup", struct.pack("<H", len(t.encode())) + t.encode() + np.arange(4, dtype=np.int32).tobytes())
    for w in (WARM, WARM.replace("in.bin", "short.bin"), 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "WRONG" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } } } ]',
              'model_warmup [ { name: "s" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin" } } } ]'):
        t = (IDENTITY + w).encode()
        data = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0) if "s.bin" in w else np.arange(4, dtype=np.int32).tobytes()
        put("warmup", struct.pack("<H", len(t)) + t + data)


def image_seeds():
    from PIL import Image

    rng = np.random.default_rng(0)
    for mode, fmt in [("L", "PNG"), ("RGB", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("I;16", "PNG"), ("LA", "PNG"),
                      ("RGB", "JPEG"), ("L", "JPEG"), ("RGB", "WEBP"), ("RGBA", "WEBP"), ("RGB", "BMP"), ("L", "BMP"), ("RGBA", "BMP")]:
        for size in ((1, 1), (7, 5)):
            arr = rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
            img = Image.fromarray(arr, "RGB").convert(mode)
            buf = io.BytesIO()
            kw = {"progressive": True} if fmt == "JPEG" and size == (7, 5) else {}
            if fmt == "WEBP" and size == (7, 5):
                kw = {"lossless": True}
            img.save(buf, fmt, **kw)
            put("image", bytes([len(mode) % 5 | (16 if fmt == "JPEG" else 0)]) + buf.getvalue())


def main():
    http_seeds()
    generate_seeds()
    grpc_seeds()
    config_seeds()
    image_seeds()
    for t in sorted(os.listdir(OUT)):
        print(t, len(os.listdir(os.path.join(OUT, t))), file=sys.stderr)


if __name__ == "__main__":
    main()
