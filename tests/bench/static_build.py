#!/usr/bin/env python3
"""Two or more builds of the `tern` binary compared on what a device build
trades: file size (stripped), start to READY with an empty repository and
with plugins (cold `.cwasm` cache: every plugin compiled; warm: loaded), and
the cost of one plugin call as the server measures it (`compute_infer` per
request in the model's statistics, add_sub over HTTP).

    python tests/bench/static_build.py --plugins target/wasm32-wasip2/release \\
        before=/path/to/tern-before after=/path/to/tern-after

Rounds are interleaved (before, after, before, after, ...) so that the
machine's drift falls on both; each figure is the median over --rounds.
Results go in docs/PERFORMANCE.md ("Release artifacts and footprint").
"""

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from footprint import ready_after  # noqa: E402
from http_load import free_port, rss_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = ("add_sub", "simple_identity")


def repository(work, wasm_dir):
    """add_sub and simple_identity with their shipped configs."""
    root = os.path.join(work, "models")
    for name in PLUGINS:
        os.makedirs(os.path.join(root, name, "1"))
        shutil.copy(os.path.join(wasm_dir, f"{name}.wasm"), os.path.join(root, name, "1", "model.wasm"))
        src = os.path.join(ROOT, "model_repository", name)
        shutil.copy(os.path.join(src, "config.pbtxt"), os.path.join(root, name, "config.pbtxt"))
    return root


def compile_secs(binary, work, component):
    """Wall time of `tern plugin compile` of one large component (Cranelift's own speed)."""
    repo = os.path.join(work, "big")
    if not os.path.exists(repo):
        os.makedirs(os.path.join(repo, "big", "1"))
        shutil.copy(component, os.path.join(repo, "big", "1", "model.wasm"))
    cache = os.path.join(work, "big-cache")
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([binary, "plugin", "compile", repo, f"--cache-dir={cache}"], check=True, capture_output=True)
    return time.perf_counter() - t0


def serve(binary, repo, cache):
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [binary, f"--model-repository={repo}", f"--http-port={port}", "--grpc-port=0", "--metrics-port=0",
         f"--wasm-cache-dir={cache}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        secs = ready_after(proc, port, t0, timeout=300)
    except Exception:
        proc.kill()
        raise
    return proc, port, secs


def plugin_call_us(port, n):
    """Mean compute_infer of add_sub over n requests, from the server's statistics, in µs."""
    body = json.dumps({"inputs": [
        {"name": f"INPUT{i}", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]} for i in (0, 1)
    ]})
    c = http.client.HTTPConnection("127.0.0.1", port)

    def stats():
        c.request("GET", "/v2/models/add_sub/stats")
        s = json.loads(c.getresponse().read())["model_stats"][0]["inference_stats"]["compute_infer"]
        return s["count"], s["ns"]

    for _ in range(50):  # warm-up
        c.request("POST", "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"})
        assert c.getresponse().read()
    n0, ns0 = stats()
    for _ in range(n):
        c.request("POST", "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, r.read()
        r.read()
    n1, ns1 = stats()
    c.close()
    return (ns1 - ns0) / (n1 - n0) / 1000


def one_round(binary, work, repo, empty, big):
    cache = os.path.join(work, "cache-" + os.path.basename(binary))
    shutil.rmtree(cache, ignore_errors=True)
    row = {}
    proc, _, row["empty"] = serve(binary, empty, cache)
    proc.terminate(), proc.wait(30)
    proc, _, row["cold"] = serve(binary, repo, cache)
    proc.terminate(), proc.wait(30)
    proc, port, row["warm"] = serve(binary, repo, cache)
    time.sleep(1)
    row["rss"] = rss_kib(proc.pid) / 1024
    row["call"] = plugin_call_us(port, 2000)
    proc.terminate(), proc.wait(30)
    if big:
        row["compile"] = compile_secs(binary, work, big)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", metavar="LABEL=BINARY")
    ap.add_argument("--plugins", required=True, help="folder with the built plugins (add_sub.wasm, ...)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", metavar="WASM", help="a large component to time `tern plugin compile` of "
                    "(the Python runner: target/wasm32-wasip2/release/python-runner.wasm)")
    a = ap.parse_args()
    builds = [b.split("=", 1) for b in a.builds]
    work = tempfile.mkdtemp(prefix="tern-static-build-")
    repo = repository(work, a.plugins)
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    sizes = {}
    for label, binary in builds:
        stripped = os.path.join(work, f"{label}.stripped")
        subprocess.run(["strip", "-o", stripped, binary], check=True)
        sizes[label] = os.path.getsize(stripped) / 1e6
    rows = {label: [] for label, _ in builds}
    for r in range(a.rounds):
        for label, binary in builds:
            rows[label].append(one_round(os.path.join(work, f"{label}.stripped"), work, repo, empty, a.compile))
        print(f"round {r + 1}: " + "; ".join(
            f"{label} " + ", ".join(f"{k} {v:.3f}" for k, v in rows[label][-1].items()) for label, _ in builds),
            file=sys.stderr)
    print(f"{a.rounds} interleaved rounds, medians; plugins: {', '.join(PLUGINS)}"
          + (f"; compiled: {os.path.basename(a.compile)} ({os.path.getsize(a.compile) / 1e6:.1f} MB)" if a.compile else ""))
    print("| build | binary (MB, stripped) | start, empty repository (ms) | start, cold `.cwasm` cache (ms) "
          "| start, warm cache (ms) | idle RSS, warm (MiB) | add_sub call, server's compute_infer (µs) "
          + ("| compile of the large component (s) |" if a.compile else ""))
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if a.compile else ""))
    for label, _ in builds:
        med = lambda k: statistics.median(x[k] for x in rows[label])
        print(f"| {label} | {sizes[label]:.1f} | {med('empty') * 1000:.0f} | {med('cold') * 1000:.0f} "
              f"| {med('warm') * 1000:.0f} | {med('rss'):.1f} | {med('call'):.1f} |"
              + (f" {med('compile'):.2f} |" if a.compile else ""))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
