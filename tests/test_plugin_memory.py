"""Plugins in Python, JavaScript and C keep their memory flat under load.

Each language's plugin, made with `tern plugin new` and built with
`tern plugin build` as a user would, answers 20,000 requests whose output is
64 KiB (FP32 [1, 16384]). The Python one also hands that many bytes to a host
kernel (`tern_ops.frombuffer`) on every request: both are paths on which
componentize-py's runtime leaked every byte it passed to the host until the
server repaired it (tern_wasm::guest_fixes). After a warm-up, the plugin's
linear memory (`tern_plugin_memory_bytes`) and the server's RSS must stay flat:
a leak of 64 KiB per request would add about 1.1 GiB per plugin here.
"""

import concurrent.futures
import re
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

from conftest import Tern
from test_lang_plugins import plugin_cmd

REQUESTS = 20_000
WARMUP = 1_000
ELEMENTS = 16_384  # 64 KiB of FP32

PYTHON_APP = '''"""`{name}`: OUTPUT0 = INPUT0, through the paths that hand bytes to the host."""

import tern_ops
import tern_plugin as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            data = x.as_bytes()
            # bytes passed to a host kernel (an import argument)...
            a = tern_ops.frombuffer(data, "FP32", x.shape())
            assert list(a.shape) == x.shape()
            # ...and returned as an output (an export result).
            y = pb_utils.Tensor.from_bytes("OUTPUT0", "FP32", x.shape(), data)
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses


Model = pb_utils.export(TritonPythonModel)
'''


def memory_bytes(t, model):
    text = urllib.request.urlopen(f"http://{t.metrics_url}/metrics").read().decode()
    m = re.search(rf'^tern_plugin_memory_bytes{{model="{model}"}} (\S+)$', text, re.M)
    assert m, f"no tern_plugin_memory_bytes for {model}:\n{text}"
    return float(m.group(1))


def rss(t):
    with open(f"/proc/{t.proc.pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def load(t, model, count):
    x = np.arange(ELEMENTS, dtype=np.float32).reshape(1, ELEMENTS)
    expect = x * 2 if model != "soak_python" else x

    def worker(n):
        c = grpcclient.InferenceServerClient(t.grpc_url)
        i = grpcclient.InferInput("INPUT0", [1, ELEMENTS], "FP32")
        i.set_data_from_numpy(x)
        for k in range(n):
            out = c.infer(model, [i]).as_numpy("OUTPUT0")
            if k % 500 == 0:
                np.testing.assert_array_equal(out, expect)
        c.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(worker, count // 4) for _ in range(4)]:
            f.result()


def test_plugins_returning_64_kib_keep_memory_flat(tmp_path):
    repo = tmp_path / "repo"
    for lang in ("python", "js", "c"):
        name = f"soak_{lang}"
        r = plugin_cmd("new", str(repo / name), "--lang", lang)
        assert r.returncode == 0, r.stderr
        if lang == "python":
            (repo / name / "app.py").write_text(PYTHON_APP.replace("{name}", name))
        r = plugin_cmd("build", str(repo / name), "--cache-dir", str(tmp_path / "cache"))
        assert r.returncode == 0, r.stderr
    t = Tern([f"--model-repository={repo}", f"--wasm-cache-dir={tmp_path / 'cache'}"])
    try:
        report = []
        for lang in ("python", "js", "c"):
            model = f"soak_{lang}"
            load(t, model, WARMUP)
            linear0, rss0 = memory_bytes(t, model), rss(t)
            load(t, model, REQUESTS)
            linear1, rss1 = memory_bytes(t, model), rss(t)
            report.append(f"{model}: linear {linear0 / 2**20:.1f} -> {linear1 / 2**20:.1f} MiB, RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB")
            # A leak of the output alone would add 20,000 x 64 KiB = 1.25 GiB.
            assert linear1 - linear0 <= 2 * 2**20, report
            assert rss1 - rss0 <= 16 * 2**20, report
        print("\n".join(report))
        assert "memory cap" not in t.log(), t.log()
    finally:
        t.stop()
