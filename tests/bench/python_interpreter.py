#!/usr/bin/env python3
"""The interpreter's cost alone: the same `model.py` (tests/python_models:
add_sub, strings, preprocess) with the same Python modules around it (the
runner's numpy subset, its triton_python_backend_utils and the guest SDK),
its `execute` called in a loop

* by plain CPython on this machine (the SDK over the bindings componentize-py
  generates for wit/, as tests/test_sdk_python.py runs it), and
* by CPython inside Tern's Python runner (WebAssembly under wasmtime, in the
  sandbox): a wrapper model in the same repository calls the model's
  `execute` in the same loop and returns the time it took.

Neither loop crosses the host boundary or the network, so the ratio is what
running Python in the sandbox costs by itself; the full request path is
`make bench-python` (tests/bench/python_models.py).

    make bench-python-interpreter      # release build + runner
    python_interpreter.py --tern target/release/tern --runner target/release/python-runner.wasm \
        [--iterations 1000] [--rounds 3]
"""

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as real_np
import tritonclient.http as httpclient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "tests", "python_models")
sys.path.insert(0, os.path.join(ROOT, "tests"))

rng = real_np.random.default_rng(3)
# The requests each model is timed on: (name, datatype, array).
INPUTS = {
    "add_sub": [("INPUT0", "FP32", rng.standard_normal(4).astype(real_np.float32)),
                ("INPUT1", "FP32", rng.standard_normal(4).astype(real_np.float32))],
    "strings": [("TEXT", "BYTES", real_np.array([[b"hello", b"Tern", b"", b"\xc3\xa9t\xc3\xa9"]], dtype=real_np.object_))],
    "preprocess": [("IMAGE", "UINT8", rng.integers(0, 256, (1, 32, 32, 3), dtype=real_np.uint8))],
}

# The wrapper model: the model's own file beside it as `target.py`, its
# config with one more output, ELAPSED_NS, the time `iterations` calls took.
WRAPPER = '''
import time

import numpy as np
import tern_plugin
import triton_python_backend_utils as pb_utils
from target import TritonPythonModel as Target


class TritonPythonModel:
    def initialize(self, args):
        self.inner = Target()
        if hasattr(self.inner, "initialize"):
            self.inner.initialize(args)
        self.batched = BATCHED

    def execute(self, requests):
        n = int(requests[0].parameter("iterations", 1))
        wit = requests[0]._w
        started = time.perf_counter_ns()
        for _ in range(n):
            self.inner.execute([tern_plugin.Request(wit, 0)])
        elapsed = time.perf_counter_ns() - started
        value = np.array([[elapsed]] if self.batched else [elapsed], dtype=np.int64)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("ELAPSED_NS", value)])]
'''


def wrapper_repo(root, models):
    for m in models:
        shutil.copytree(os.path.join(MODELS, m), os.path.join(root, m))
        w = os.path.join(root, f"timed_{m}")
        shutil.copytree(os.path.join(MODELS, m, "1"), os.path.join(w, "1"))  # sibling modules too
        os.rename(os.path.join(w, "1", "model.py"), os.path.join(w, "1", "target.py"))
        config = open(os.path.join(MODELS, m, "config.pbtxt")).read()
        batched = "max_batch_size" in config and "max_batch_size: 0" not in config
        config = config.replace(f'name: "{m}"', f'name: "timed_{m}"')
        config += '\noutput [ { name: "ELAPSED_NS" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        with open(os.path.join(w, "config.pbtxt"), "w") as f:
            f.write(config)
        with open(os.path.join(w, "1", "model.py"), "w") as f:
            f.write(WRAPPER.replace("BATCHED", str(batched)))


def in_runner(url, model, iterations):
    c = httpclient.InferenceServerClient(url)
    ins = []
    for name, datatype, value in INPUTS[model]:
        t = httpclient.InferInput(name, list(value.shape), datatype)
        t.set_data_from_numpy(value)
        ins.append(t)
    r = c.infer(f"timed_{model}", ins, outputs=[httpclient.InferRequestedOutput("ELAPSED_NS")],
                parameters={"iterations": iterations})
    return int(r.as_numpy("ELAPSED_NS").reshape(-1)[0]) / iterations / 1000


class Native:
    """The SDK, the runner's modules and the model files in this CPython."""

    def __init__(self, scratch, config_of):
        bindings = os.path.join(scratch, "bindings")
        subprocess.run([os.path.join(ROOT, ".venv", "bin", "componentize-py"), "-d", os.path.join(ROOT, "wit"),
                        "-w", "plugin", "bindings", bindings], check=True, capture_output=True)
        sys.path[:0] = [os.path.join(ROOT, "guest-sdk", "python", "runner"), os.path.join(ROOT, "guest-sdk", "python"),
                        bindings]
        for m in [m for m in sys.modules if m == "numpy" or m.startswith("numpy.")]:
            del sys.modules[m]  # the runner's numpy subset, as in the sandbox
        self.sdk = importlib.import_module("tern_plugin")
        self.types = importlib.import_module("wit_world.imports.types")
        self.config_of = config_of

    def request(self, model):
        t = self.types
        tensors = []
        for name, datatype, value in INPUTS[model]:
            if datatype == "BYTES":
                data = b"".join(len(v).to_bytes(4, "little") + v for v in value.reshape(-1))
            else:
                data = value.tobytes()
            tensors.append(t.Tensor(name=name, datatype=getattr(t.DataType, datatype), shape=list(value.shape),
                                    data=data))
        return t.Request(id="", inputs=tensors, requested_outputs=[], parameters=[],
                         correlation_id=t.CorrelationId_None_(), flags=0)

    def time(self, model, iterations):
        folder = os.path.join(MODELS, model, "1")
        if folder not in sys.path:
            sys.path.insert(0, folder)  # sibling modules, as in the runner
        spec = importlib.util.spec_from_file_location(f"native_{model}", os.path.join(MODELS, model, "1", "model.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        m = module.TritonPythonModel()
        if hasattr(m, "initialize"):
            m.initialize({"model_config": self.config_of(model), "model_name": model, "model_version": "1",
                          "model_repository": os.path.join(MODELS, model), "model_instance_kind": "CPU"})
        wit = self.request(model)
        m.execute([self.sdk.Request(wit, 0)])  # warm-up
        started = time.perf_counter_ns()
        for _ in range(iterations):
            m.execute([self.sdk.Request(wit, 0)])
        return (time.perf_counter_ns() - started) / iterations / 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", required=True)
    ap.add_argument("--runner", required=True)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="add_sub,strings,preprocess")
    a = ap.parse_args()
    models = a.models.split(",")
    from conftest import Tern  # noqa: E402 (tests/ on the path above)

    with tempfile.TemporaryDirectory() as scratch:
        repo = os.path.join(scratch, "models")
        wrapper_repo(repo, models)
        tern = Tern([f"--model-repository={repo}", f"--python-runner={a.runner}",
                     f"--wasm-cache-dir={os.path.join(scratch, 'wasm')}"], binary=a.tern)
        try:
            http = httpclient.InferenceServerClient(tern.url)
            native = Native(scratch, lambda m: json.dumps(http.get_model_config(m)))
            results = {m: {"cpython": [], "runner": []} for m in models}
            for _ in range(a.rounds):  # interleaved rounds
                for m in models:
                    in_runner(tern.url, m, max(1, a.iterations // 10))  # warm-up
                    results[m]["runner"].append(in_runner(tern.url, m, a.iterations))
                    results[m]["cpython"].append(native.time(m, a.iterations))
        finally:
            tern.stop()
    print(f"execute() of the same model.py, {a.iterations} calls x {a.rounds} interleaved rounds; median µs per call")
    print(f"{'model':<12} {'plain CPython':>14} {'Tern runner':>12} {'ratio':>7}")
    for m in models:
        c, r = statistics.median(results[m]["cpython"]), statistics.median(results[m]["runner"])
        print(f"{m:<12} {c:>14.1f} {r:>12.1f} {r / c:>6.2f}x")


if __name__ == "__main__":
    main()
