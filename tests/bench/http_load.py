#!/usr/bin/env python3
"""HTTP load benchmark: Tern vs. a minimal hyper baseline, measured in the same run.

    make bench            # or:
    python tests/bench/http_load.py --tern target/release/tern --baseline target/release/examples/baseline

Drives `simple` (INT32 [1,16] x2, JSON body) with wrk at several concurrencies and
prints a markdown table (throughput, p50/p99 latency, ratio to the baseline) plus
Tern's idle RSS with the example repository loaded. A third server, Tern with `simple`
on the identity backend (tests/bench/identity_repo.py), shows what Tern's own request
path costs without ONNX Runtime's per-call cost. Results go in docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import identity_repo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port, path, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not come up")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def to_ms(value):
    m = re.match(r"([\d.]+)(us|ms|s)", value)
    n, unit = float(m.group(1)), m.group(2)
    return n / 1000 if unit == "us" else n * 1000 if unit == "s" else n


def run_wrk(port, conc, duration, script, model="simple"):
    threads = min(2, conc)
    cmd = ["wrk", f"-t{threads}", f"-c{conc}", f"-d{duration}s", "--latency", "-s", script, f"http://127.0.0.1:{port}/v2/models/{model}/infer"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = to_ms(re.search(r"\s50%\s+(\S+)", out).group(1))
    p99 = to_ms(re.search(r"\s99%\s+(\S+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad:
        raise RuntimeError(f"{bad.group(1)} failed responses on port {port}:\n{out}")
    return rps, p50, p99


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--repo", default=os.path.join(ROOT, "model_repository"))
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--concurrency", default="1,16,64")
    args = ap.parse_args()

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
        f.write(f"wrk.body = {json.dumps(BODY)}\n")
        script = f.name

    work = tempfile.mkdtemp(prefix="tern-bench-http-")
    tern_port, base_port, ident_port = free_port(), free_port(), free_port()
    serve = ["--http-address=127.0.0.1", "--allow-metrics=false", "--allow-grpc=false", "--log-info=false"]
    tern = subprocess.Popen([args.tern, f"--model-repository={args.repo}", f"--http-port={tern_port}", *serve])
    ident = subprocess.Popen([args.tern, f"--model-repository={identity_repo.make(work)}", f"--http-port={ident_port}", *serve])
    base = subprocess.Popen([args.baseline, str(base_port)])
    try:
        wait_http(tern_port, "/v2/health/ready")
        wait_http(ident_port, "/v2/health/ready")
        wait_http(base_port, "/")
        time.sleep(1)
        idle_rss = rss_kib(tern.pid)
        rows = []
        for conc in [int(c) for c in args.concurrency.split(",")]:
            for port in (base_port, tern_port, ident_port):
                run_wrk(port, conc, 2, script)  # warm-up
            b = run_wrk(base_port, conc, args.duration, script)
            t = run_wrk(tern_port, conc, args.duration, script)
            i = run_wrk(ident_port, conc, args.duration, script)
            rows.append((conc, t, b, i))
        loaded_rss = rss_kib(tern.pid)
    finally:
        for proc in (tern, ident, base):
            proc.terminate()
            proc.wait()
        os.unlink(script)
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nwrk, {args.duration}s per point, JSON body for `simple` (2 x INT32[1,16]), {os.cpu_count()} cores shared by client and server\n")
    print("| concurrency | Tern req/s | baseline req/s | Tern/baseline | Tern p50 ms | Tern p99 ms | baseline p50 ms | baseline p99 ms | identity backend req/s | identity/baseline |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for conc, t, b, i in rows:
        print(f"| {conc} | {t[0]:.0f} | {b[0]:.0f} | {t[0] / b[0]:.2f} | {t[1]:.3f} | {t[2]:.3f} | {b[1]:.3f} | {b[2]:.3f} | {i[0]:.0f} | {i[0] / b[0]:.2f} |")
    print(f"\nTern RSS: idle with model_repository loaded {idle_rss / 1024:.1f} MiB; after the load {loaded_rss / 1024:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
