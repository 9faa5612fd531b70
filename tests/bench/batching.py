#!/usr/bin/env python3
"""Dynamic batching benchmark (docs/PERFORMANCE.md).

    make bench-batching     # or: python tests/bench/batching.py --tern target/release/tern

1. identity backend, execute_delay_ms 10, max_batch_size 32, dynamic batching,
   wrk at concurrency 64: achieved inferences/s against the ideal 3200/s, and
   the batching overhead per request from the statistics extension.
2. `simple` (ONNX) with and without dynamic batching at concurrency 1..64.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import free_port, run_wrk, wait_http  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

IDENTITY = '''name: "batch_identity"
backend: "identity"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "execute_delay_ms" value: { string_value: "10" } }
dynamic_batching { }
'''


def lua(body):
    f = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
    f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
    f.write(f"wrk.body = {json.dumps(json.dumps(body))}\n")
    f.close()
    return f.name


def get_stats(port, model):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as r:
        return json.load(r)["model_stats"][0]


def wrk_on(port, model, conc, duration, script):
    import re

    threads = min(2, conc)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conc}", f"-d{duration}s", "--latency", "-s", script, f"http://127.0.0.1:{port}/v2/models/{model}/infer"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError(out)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"\s99%\s+(\S+)", out).group(1)
    return rps, p99


def per_request_us(stats, key):
    s = stats["inference_stats"][key]
    return s["ns"] / max(s["count"], 1) / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--duration", type=int, default=10)
    args = ap.parse_args()

    repo = tempfile.mkdtemp()
    os.makedirs(f"{repo}/batch_identity/1")
    with open(f"{repo}/batch_identity/config.pbtxt", "w") as f:
        f.write(IDENTITY)
    shutil.copytree(f"{ROOT}/model_repository/simple", f"{repo}/simple")
    shutil.copytree(f"{ROOT}/model_repository/simple", f"{repo}/simple_dyn")
    with open(f"{repo}/simple_dyn/config.pbtxt") as f:
        cfg = f.read().replace('name: "simple"', 'name: "simple_dyn"')
    with open(f"{repo}/simple_dyn/config.pbtxt", "w") as f:
        f.write(cfg + "dynamic_batching { }\n")

    port = free_port()
    tern = subprocess.Popen([args.tern, f"--model-repository={repo}", f"--http-port={port}", "--http-address=127.0.0.1", "--metrics-port=0", "--allow-grpc=false", "--log-info=false"])
    try:
        wait_http(port, "/v2/health/ready")
        ident = lua({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}]})
        simple = lua(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                ]
            }
        )
        # 1. Overhead at concurrency 1 (an instance is always free) and throughput at 64.
        wrk_on(port, "batch_identity", 1, 3, ident)
        before = get_stats(port, "batch_identity")
        wrk_on(port, "batch_identity", 1, args.duration, ident)
        after = get_stats(port, "batch_identity")
        q = (after["inference_stats"]["queue"]["ns"] - before["inference_stats"]["queue"]["ns"]) / max(
            after["inference_stats"]["queue"]["count"] - before["inference_stats"]["queue"]["count"], 1
        )
        rps, p99 = wrk_on(port, "batch_identity", 64, args.duration, ident)
        st = get_stats(port, "batch_identity")
        sizes = sorted(((b["batch_size"], b["compute_infer"]["count"]) for b in st["batch_stats"]), key=lambda x: -x[1])[:3]
        print("\n## identity, execute_delay_ms 10, max_batch_size 32, dynamic_batching {}\n")
        print("| concurrency | inferences/s | ideal | achieved/ideal | p99 | most frequent batch sizes (size: executions) |")
        print("|---:|---:|---:|---:|---:|---|")
        print(f"| 64 | {rps:.0f} | 3200 | {rps / 3200:.2f} | {p99} | {', '.join(f'{s}: {n}' for s, n in sizes)} |")
        print(f"\nQueue time per request at concurrency 1 (instance free, delay 0): {q / 1000:.1f} µs")

        # 2. ONNX with and without dynamic batching.
        print("\n## simple (ONNX Runtime) with and without dynamic batching\n")
        print("| concurrency | default scheduler req/s | dynamic batching req/s | ratio | dyn p99 | dyn mean batch | dyn compute_input+output per request µs |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for conc in (1, 4, 16, 64):
            a, _ = wrk_on(port, "simple", conc, args.duration, simple)
            before = get_stats(port, "simple_dyn")
            b, p99 = wrk_on(port, "simple_dyn", conc, args.duration, simple)
            after = get_stats(port, "simple_dyn")
            execs = after["execution_count"] - before["execution_count"]
            infs = after["inference_count"] - before["inference_count"]
            io_ns = sum(after["inference_stats"][k]["ns"] - before["inference_stats"][k]["ns"] for k in ("compute_input", "compute_output"))
            io_n = after["inference_stats"]["compute_input"]["count"] - before["inference_stats"]["compute_input"]["count"]
            print(f"| {conc} | {a:.0f} | {b:.0f} | {b / a:.2f} | {p99} | {infs / max(execs, 1):.1f} | {io_ns / max(io_n, 1) / 1000:.1f} |")
    finally:
        tern.terminate()
        tern.wait()
        shutil.rmtree(repo)


if __name__ == "__main__":
    sys.exit(main())
