#!/usr/bin/env python3
"""TorchScript through Tern's pytorch backend against Python's own
`torch.jit.load` on the same model, same machine, same run.

    make bench-torch     # or:
    python tests/bench/torch_models.py --tern target/torch-release/tern

The models are scripts/gen_torch_models.py's BENCH_MODELS: BenchCnn (3x128x128
images, a small VGG-style CNN, ~2 ms per image) and ResNet-18 (3x224x224,
~25 ms per image). Tern is driven by perf_analyzer over gRPC (batch 1, one
fixed normal-random input from a JSON file; at concurrency 1 also with the
tensors in system shared memory); Python calls the loaded module
directly in-process (no server, no client: the baseline gets the whole
machine, Tern shares it with perf_analyzer), under torch.inference_mode as
Tern runs it, each thread warming up on its own (a module warmed up on one
thread and run on another runs ~2x slower under the JIT's profiling
executor).

* concurrency 1: `<model>` (Triton's defaults) against one Python thread;
* concurrency 16: `<model>_dyn` (dynamic batching) and `<model>` against 16
  Python threads each running batch 1 (what a Python server without a
  batcher does).

Each Tern measurement runs a server holding only that model: several
TorchScript instances in one process each get their own OpenMP team, and
with more OpenMP threads than cores libgomp stops spinning between parallel
regions (see docs/PERFORMANCE.md).

Rounds are interleaved (Tern, Python, Tern, Python, ...) and the median is
reported, so drift on a noisy machine hits both sides.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpc_load import PERF_ANALYZER, wait_grpc  # noqa: E402
from http_load import ROOT, free_port  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_torch_models  # noqa: E402


def python_rate(module, x, threads, duration):
    """(runs/s, p50 ms, p99 ms) of `threads` threads calling module(x) for `duration` seconds."""
    lat = [[] for _ in range(threads)]
    stop = time.perf_counter() + duration + 0.5

    def worker(i):
        with torch.inference_mode():
            for _ in range(5):
                module(x)
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                module(x)
                lat[i].append(time.perf_counter() - t0)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    all_lat = sorted(v for part in lat for v in part)
    n = len(all_lat)
    return n / (time.perf_counter() - start), all_lat[n // 2] * 1000, all_lat[int(n * 0.99)] * 1000


def tern_rate(port, model, concurrency, duration_ms, data, extra=()):
    """(infer/s, p50 ms, p99 ms) from perf_analyzer over gRPC."""
    out = subprocess.run(
        [PERF_ANALYZER, "-m", model, "-i", "grpc", "-u", f"127.0.0.1:{port}", f"--concurrency-range={concurrency}",
         "-p", str(duration_ms), "--percentile=99", f"--input-data={data}", "-s", "50", "-r", "20", *extra],
        capture_output=True, text=True,
    ).stdout
    m = re.search(rf"Concurrency: {concurrency}, throughput: ([\d.]+) infer/sec, latency (\d+) usec", out)
    p50 = re.search(r"p50 latency: (\d+) usec", out)
    if not m:
        raise RuntimeError(f"perf_analyzer gave no figure:\n{out}")
    return float(m.group(1)), (int(p50.group(1)) / 1000 if p50 else float("nan")), int(m.group(2)) / 1000


# Per model: (concurrency, repository, Tern model suffix, perf_analyzer transport).
CASES = [(1, "plain", "", "grpc"), (1, "plain", "", "shm"), (16, "dyn", "_dyn", "grpc"), (16, "plain", "", "grpc")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--models", default=",".join(gen_torch_models.BENCH_MODELS),
                    help="comma-separated names from scripts/gen_torch_models.py's BENCH_MODELS")
    args = ap.parse_args()
    repo = tempfile.mkdtemp(prefix="tern-bench-torch-")
    gen_torch_models.write_bench(repo)

    def serve(repo_dir, model):
        port = free_port()
        proc = subprocess.Popen(
            [args.tern, f"--model-repository={repo_dir}", "--http-port=0", f"--grpc-port={port}",
             "--metrics-port=0", "--grpc-address=127.0.0.1", "--allow-client-shm"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_grpc(f"127.0.0.1:{port}")
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.time() + 60
        while not client.is_model_ready(model):
            if time.time() > deadline:
                raise RuntimeError(f"{model} did not load")
            time.sleep(0.2)
        return proc, port

    def tern(c, repo_dir, model, data, transport):
        # perf_analyzer puts inputs and outputs in system shared memory once; requests carry only
        # region references (the server reads and writes the client's memory directly).
        extra = ["--shared-memory=system", "--output-shared-memory-size=65536"] if transport == "shm" else []
        proc, port = serve(os.path.join(repo, repo_dir), model)
        try:
            tern_rate(port, model, c, 1000, data, extra)  # warm up
            return tern_rate(port, model, c, int(args.duration * 1000), data, extra)
        finally:
            proc.terminate()
            proc.wait(30)

    rows = []
    for name in args.models.split(","):
        _, dims, _, _, _ = gen_torch_models.BENCH_MODELS[name]
        module = torch.jit.load(os.path.join(repo, "plain", name, "1", "model.pt")).eval()
        x = torch.randn(1, *dims, generator=torch.Generator().manual_seed(0))
        data = os.path.join(repo, f"{name}.json")
        with open(data, "w") as f:
            json.dump({"data": [{"INPUT__0": {"content": x.flatten().tolist(), "shape": dims}}]}, f)
        results = {case: ([], []) for case in CASES}
        for _ in range(args.rounds):
            for c in (1, 16):
                for case in CASES:
                    cc, repo_dir, suffix, transport = case
                    if cc == c:
                        results[case][0].append(tern(c, repo_dir, name + suffix, data, transport))
                base = python_rate(module, x, c, args.duration)
                for case in CASES:
                    if case[0] == c:
                        results[case][1].append(base)
        rows.append((name, dims, results))

    def med(runs, i):
        return statistics.median(r[i] for r in runs)

    print(f"\n{os.cpu_count()} cores; torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; "
          f"batch 1 per request; median of {args.rounds} interleaved rounds of {args.duration:.0f} s\n")
    print("| model | concurrency | Tern (perf_analyzer) | infer/s | p50 / p99 ms | Python torch.jit.load runs/s | "
          "p50 / p99 ms | Tern / Python | per round |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    for name, dims, results in rows:
        for (c, _, suffix, transport), (t_runs, p_runs) in results.items():
            ratios = ", ".join(f"{t[0] / p[0]:.2f}" for t, p in zip(t_runs, p_runs))
            how = "gRPC" if transport == "grpc" else "gRPC, system shared memory"
            how += ", dynamic batching" if suffix else ""
            print(f"| {name} ({'x'.join(map(str, dims))}) | {c} | `{name + suffix}`, {how} | {med(t_runs, 0):.1f} | "
                  f"{med(t_runs, 1):.2f} / {med(t_runs, 2):.2f} | {med(p_runs, 0):.1f} | "
                  f"{med(p_runs, 1):.2f} / {med(p_runs, 2):.2f} | {med(t_runs, 0) / med(p_runs, 0):.2f} | {ratios} |")


if __name__ == "__main__":
    main()
