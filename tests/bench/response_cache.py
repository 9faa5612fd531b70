#!/usr/bin/env python3
"""The response cache (docs/configuration.md, "Response cache"): what it
buys on a repeated-input workload and what a miss costs, local and redis,
against the same server without a cache, measured in one run.

* Repeated input: `expensive`, an identity model that takes 20 ms per
  execution (one instance), driven by perf_analyzer over gRPC at
  concurrency 4 with the same zero-filled INPUT0 [1024] each time: without
  a cache every request runs the model; with one, the first does.
* Miss cost: `cheap`, an identity model with no delay, fed 2,000 requests
  that never repeat (gRPC, concurrency 1): client-side mean latency with and
  without a cache, and the server's own `cache_miss` time per miss
  (lookup + insert, from the statistics extension).

    make bench-cache   (or: python tests/bench/response_cache.py --tern target/release/tern)
"""

import argparse
import csv
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL = '''name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1024 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1024 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay}" }} }}
response_cache {{ enable: true }}
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tern, repo, cache_args, log):
        self.http, self.grpc = free_port(), free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [tern, f"--model-repository={repo}", f"--http-port={self.http}", f"--grpc-port={self.grpc}",
             "--allow-metrics=false", *cache_args], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"tern did not become ready; see {log}")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


def perf_grpc(perf_analyzer, url, model, concurrency, duration, extra=()):
    """perf_analyzer over gRPC (3 windows of `duration` s): (infer/s, p99 ms)."""
    with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as f:
        report = f.name
    cmd = [perf_analyzer, "-m", model, "-i", "grpc", "-u", url, f"--concurrency-range={concurrency}",
           "-p", str(int(duration * 1000)), "-s", "1000", "-r", "3", "--percentile=99", "-f", report, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    with open(report) as f:
        rows = list(csv.DictReader(f))
    os.unlink(report)
    if p.returncode != 0 or not rows:
        raise RuntimeError((p.stdout + p.stderr)[-800:])
    return float(rows[0]["Inferences/Second"]), float(rows[0]["p99 latency"]) / 1000


def perf(a, server):
    return perf_grpc(a.perf_analyzer, f"127.0.0.1:{server.grpc}", "expensive", 4, a.duration,
                     ["--input-data=zero", "--sync"])


def misses(server, n):
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    data = np.zeros((1024,), dtype=np.int32)
    i = grpcclient.InferInput("INPUT0", [1024], "INT32")
    for k in range(50):  # warm up (these repeat: hits where there is a cache)
        i.set_data_from_numpy(data)
        c.infer("cheap", [i])
    start = time.perf_counter()
    for k in range(n):
        data[0] = k + 1000
        i.set_data_from_numpy(data)
        c.infer("cheap", [i])
    mean_us = (time.perf_counter() - start) / n * 1e6
    s = c.get_inference_statistics("cheap", as_json=True)["model_stats"][0]["inference_stats"]
    miss = s.get("cache_miss", {})
    per_miss = int(miss.get("ns", 0)) / max(1, int(miss.get("count", 0))) / 1000
    return mean_us, per_miss, int(miss.get("count", 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", default=os.path.join(ROOT, "target", "release", "tern"))
    ap.add_argument("--perf-analyzer", default=os.path.join(ROOT, ".cache", "perf_analyzer", "perf_analyzer"))
    ap.add_argument("--duration", type=float, default=3.0, help="perf_analyzer window, seconds")
    ap.add_argument("--misses", type=int, default=2000)
    a = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="tern-bench-cache-")
    repo = os.path.join(scratch, "models")
    for name, delay in (("expensive", 20), ("cheap", 0)):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(MODEL.format(name=name, delay=delay))
    redis_port = free_port()
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind",
                              "127.0.0.1", "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    setups = [
        ("no cache", []),
        ("local", ["--cache-config=local,size=67108864"]),
        ("redis", ["--cache-config=redis,host=127.0.0.1", f"--cache-config=redis,port={redis_port}"]),
    ]
    rows = []
    try:
        for label, args in setups:
            server = Server(a.tern, repo, args, os.path.join(scratch, f"{label.replace(' ', '_')}.log"))
            try:
                throughput, p99 = perf(a, server)
                mean_us, per_miss, count = misses(server, a.misses)
            finally:
                server.stop()
            rows.append((label, throughput, p99, mean_us, per_miss, count))
    finally:
        redis.kill()
    print(f"tern: {a.tern}")
    print("| cache | repeated input: infer/s | p99 ms | unique input: mean latency µs | server time per miss µs |")
    print("|---|---|---|---|---|")
    for label, throughput, p99, mean_us, per_miss, count in rows:
        miss = f"{per_miss:.1f} ({count} misses)" if count else "—"
        print(f"| {label} | {throughput:.0f} | {p99:.1f} | {mean_us:.0f} | {miss} |")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
