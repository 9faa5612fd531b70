#!/usr/bin/env python3
"""Reload under load: `simple` (ONNX) served at 64 concurrent connections
while it is reloaded through the API every half second, against the same
load with no reloads, measured in the same run.

    make bench-reload     # or:
    python tests/bench/reload.py --tern target/release/tern

Every reload is a full load-then-swap (a new ONNX Runtime session is created
and warmed beside the serving one). wrk fails the run on any non-2xx
response or socket error. Results go in docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from http_load import BODY, free_port, rss_kib, to_ms, wait_http

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wrk(port, conc, duration, script):
    cmd = ["wrk", "-t2", f"-c{conc}", f"-d{duration}s", "--latency", "-s", script, f"http://127.0.0.1:{port}/v2/models/simple/infer"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for bad in (r"Non-2xx or 3xx responses: (\d+)", r"Socket errors: (.*)"):
        m = re.search(bad, out)
        if m:
            raise RuntimeError(f"failed requests ({m.group(0)}):\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    pct = {p: to_ms(re.search(rf"\s{p}%\s+(\S+)", out).group(1)) for p in (50, 90, 99)}
    return rps, total, pct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between reloads")
    args = ap.parse_args()

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
        f.write(f"wrk.body = {json.dumps(BODY)}\n")
        script = f.name
    port = free_port()
    repo = os.path.join(ROOT, "model_repository")
    tern = subprocess.Popen(
        [args.tern, f"--model-repository={repo}", f"--http-port={port}", "--http-address=127.0.0.1", "--metrics-port=0",
         "--allow-grpc=false", "--log-info=false", "--model-control-mode=explicit", "--load-model=simple"]
    )
    reloads, reload_ms = 0, []
    try:
        wait_http(port, "/v2/health/ready")
        wrk(port, args.concurrency, 2, script)  # warm-up
        steady = wrk(port, args.concurrency, args.duration, script)
        stop = threading.Event()

        def reloader():
            nonlocal reloads
            while not stop.wait(args.interval):
                started = time.perf_counter()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/repository/models/simple/load", data=b"{}", method="POST")
                with urllib.request.urlopen(req, timeout=60) as r:
                    assert r.status == 200
                reload_ms.append((time.perf_counter() - started) * 1000)
                reloads += 1

        th = threading.Thread(target=reloader)
        th.start()
        try:
            swapping = wrk(port, args.concurrency, args.duration, script)
        finally:
            stop.set()
            th.join()
        rss = rss_kib(tern.pid)
    finally:
        tern.terminate()
        tern.wait()
        os.unlink(script)

    print(f"\nwrk -c{args.concurrency}, {args.duration}s per run, `simple` (ONNX, JSON body); reload = POST /v2/repository/models/simple/load every {args.interval}s; {os.cpu_count()} cores shared by client and server\n")
    print("| run | requests | failed | req/s | p50 ms | p90 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (rps, total, pct) in (("steady", steady), (f"{reloads} reloads", swapping)):
        print(f"| {name} | {total} | 0 | {rps:.0f} | {pct[50]:.2f} | {pct[90]:.2f} | {pct[99]:.2f} |")
    ratio = swapping[2][99] / steady[2][99]
    print(f"\np99 during reloads / steady p99: {ratio:.2f} (target <= 2); mean reload call {sum(reload_ms) / max(1, len(reload_ms)):.1f} ms; RSS after {rss / 1024:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
